//! The two tiers of a two-tier pool: the demoter that keeps a share of
//! flash free ([`demoter`]), flushing the tiers apart ([`flush`]), whether
//! the capacity tier takes writes at all ([`capacity_writes`]), and cold
//! data compressed harder as the cleaner moves it there
//! ([`cold_compression`]).

pub mod capacity_writes;
pub(super) mod cold_compression;
pub(super) mod demoter;
pub(super) mod flush;
