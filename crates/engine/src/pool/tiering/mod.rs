//! The two tiers of a two-tier pool: the demoter that keeps a share of
//! flash free ([`demoter`]), flushing the tiers apart ([`flush`]), and whether
//! the capacity tier takes writes at all ([`capacity_writes`]).

pub mod capacity_writes;
pub(super) mod demoter;
pub(super) mod flush;
