//! Keeping the pool's redundancy and checking its data: scrub ([`scrub`],
//! reads every live row back and repairs what disagrees), rebuild onto a
//! replacement device ([`rebuild`]), evacuation when no replacement comes
//! ([`evacuation`]: rebuilding by cleaning), and the list of live blocks the
//! long passes walk ([`live_list`]).

pub mod evacuation;
pub(super) mod live_list;
pub mod rebuild;
pub mod scrub;
