//! The kinds of background work the budget paces, and their weights.

use serde::Serialize;

/// A kind of background work, with its share of the budget when several wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackgroundWork {
    /// Restores redundancy after a device is lost.
    Rebuild,
    /// Frees the space of overwritten and deleted blocks.
    Cleaner,
    /// Keeps a share of flash free in a two-tier pool.
    Demoter,
    /// Reads every live block to find damage before it is needed.
    Scrub,
}

impl BackgroundWork {
    /// Every kind, highest weight first.
    pub const ALL: [BackgroundWork; 4] = [
        BackgroundWork::Rebuild,
        BackgroundWork::Cleaner,
        BackgroundWork::Demoter,
        BackgroundWork::Scrub,
    ];

    /// Its share of the rate when several kinds wait: redundancy lost first,
    /// then space clients need, then flash kept free, then damage not yet
    /// found.
    pub fn weight(self) -> u32 {
        match self {
            BackgroundWork::Rebuild => 8,
            BackgroundWork::Cleaner => 4,
            BackgroundWork::Demoter => 2,
            BackgroundWork::Scrub => 1,
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}
