//! Scrub's progress and findings: counters the scrub (`scrub/mod.rs`) updates
//! and `pool status` reads, owned here so that the pool's shared state needs
//! nothing of the scrub itself.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// What scrub is doing, named as zpool names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrubState {
    /// Never ran since the pool opened.
    #[default]
    None,
    Scrubbing,
    Finished,
}

/// Scrub's progress and findings (the latest scrub since the pool opened).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ScrubStatus {
    pub state: ScrubState,
    /// Live blocks to check.
    pub blocks_total: u64,
    pub blocks_scrubbed: u64,
    /// Blocks that failed their checksum and were rebuilt and rewritten.
    pub blocks_repaired: u64,
    /// Blocks that failed their checksum (or could not be read) and could
    /// not be rebuilt: reading them is an I/O error.
    pub blocks_unrepairable: u64,
    /// Parity columns, metadata copies and columns no live block holds that
    /// disagreed with their row and were rewritten (an array only).
    pub parity_repaired: u64,
    /// Rows (or metadata copies) whose every column was checked.
    pub rows_checked: u64,
    /// Devices faulted because nearly all their columns were bad (rebuilt
    /// rather than repaired block by block).
    pub devices_faulted: u64,
    pub elapsed_ms: u64,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub struct Scrubber {
    running: AtomicBool,
    ran: AtomicBool,
    pub(in crate::pool) blocks_total: AtomicU64,
    pub(in crate::pool) blocks_scrubbed: AtomicU64,
    pub(in crate::pool) blocks_repaired: AtomicU64,
    pub(in crate::pool) blocks_unrepairable: AtomicU64,
    pub(in crate::pool) parity_repaired: AtomicU64,
    pub(in crate::pool) rows_checked: AtomicU64,
    pub(in crate::pool) devices_faulted: AtomicU64,
    timing: Mutex<ScrubTiming>,
}

#[derive(Debug, Default)]
struct ScrubTiming {
    started: Option<Instant>,
    elapsed: Duration,
}

impl Scrubber {
    /// Starts a scrub; false if one is running.
    pub(in crate::pool) fn start(&self) -> bool {
        if self.running.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.ran.store(true, Ordering::SeqCst);
        for counter in [
            &self.blocks_total,
            &self.blocks_scrubbed,
            &self.blocks_repaired,
            &self.blocks_unrepairable,
            &self.parity_repaired,
            &self.rows_checked,
            &self.devices_faulted,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
        *self.timing.lock().expect("scrub timing lock") = ScrubTiming {
            started: Some(Instant::now()),
            elapsed: Duration::ZERO,
        };
        true
    }

    pub(in crate::pool) fn finish(&self) {
        let mut timing = self.timing.lock().expect("scrub timing lock");
        timing.elapsed = timing
            .started
            .map(|started| started.elapsed())
            .unwrap_or_default();
        timing.started = None;
        self.running.store(false, Ordering::SeqCst);
    }

    pub fn status(&self) -> ScrubStatus {
        let running = self.running.load(Ordering::SeqCst);
        let state = match (running, self.ran.load(Ordering::SeqCst)) {
            (true, _) => ScrubState::Scrubbing,
            (false, true) => ScrubState::Finished,
            (false, false) => ScrubState::None,
        };
        let timing = self.timing.lock().expect("scrub timing lock");
        let elapsed = timing
            .started
            .map_or(timing.elapsed, |started| started.elapsed());
        ScrubStatus {
            state,
            blocks_total: self.blocks_total.load(Ordering::Relaxed),
            blocks_scrubbed: self.blocks_scrubbed.load(Ordering::Relaxed),
            blocks_repaired: self.blocks_repaired.load(Ordering::Relaxed),
            blocks_unrepairable: self.blocks_unrepairable.load(Ordering::Relaxed),
            parity_repaired: self.parity_repaired.load(Ordering::Relaxed),
            rows_checked: self.rows_checked.load(Ordering::Relaxed),
            devices_faulted: self.devices_faulted.load(Ordering::Relaxed),
            elapsed_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        }
    }
}
