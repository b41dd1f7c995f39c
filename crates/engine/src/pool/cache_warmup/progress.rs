//! The cache warm-up's progress and counters (`pool status`), owned here so
//! that the pool's shared core needs nothing of the warm-up itself
//! (`cache_warmup/mod.rs` does the work).

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

/// What the warm-up is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheWarmupState {
    /// No record was handed over since the pool opened.
    #[default]
    None,
    Loading,
    Finished,
}

/// The warm-up's progress (`pool status`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheWarmupStatus {
    pub state: CacheWarmupState,
    /// Entries in the record handed over.
    pub blocks_listed: u64,
    /// Distinct blocks those entries resolved to through the maps (at most
    /// the cache's capacity, hottest first).
    pub blocks_to_load: u64,
    pub blocks_loaded: u64,
    /// Blocks to load that were not: moved or overwritten meanwhile, failing
    /// their checksum, unreadable, or without room left in the cache.
    pub blocks_skipped: u64,
    pub elapsed_ms: u64,
}

/// The warm-up's counters, owned here so that the pool's shared core needs
/// nothing of the warm-up itself.
#[derive(Debug, Default)]
pub(crate) struct CacheWarmer {
    pub(in crate::pool) started: AtomicBool,
    pub(in crate::pool) running: AtomicBool,
    pub(in crate::pool) blocks_listed: AtomicU64,
    pub(in crate::pool) blocks_to_load: AtomicU64,
    pub(in crate::pool) blocks_loaded: AtomicU64,
    pub(in crate::pool) blocks_skipped: AtomicU64,
    timing: Mutex<WarmupTiming>,
}

#[derive(Debug, Default)]
struct WarmupTiming {
    started: Option<Instant>,
    elapsed: Duration,
}

impl CacheWarmer {
    pub(in crate::pool) fn start(&self, blocks_listed: u64) -> bool {
        if self.started.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.running.store(true, Ordering::SeqCst);
        self.blocks_listed.store(blocks_listed, Ordering::Relaxed);
        self.timing.lock().expect("warm-up timing lock").started = Some(Instant::now());
        true
    }

    pub(in crate::pool) fn finish(&self) {
        let mut timing = self.timing.lock().expect("warm-up timing lock");
        timing.elapsed = timing
            .started
            .take()
            .map(|started| started.elapsed())
            .unwrap_or_default();
        self.running.store(false, Ordering::SeqCst);
    }

    pub(crate) fn status(&self) -> CacheWarmupStatus {
        let state = match (
            self.running.load(Ordering::SeqCst),
            self.started.load(Ordering::SeqCst),
        ) {
            (true, _) => CacheWarmupState::Loading,
            (false, true) => CacheWarmupState::Finished,
            (false, false) => CacheWarmupState::None,
        };
        let timing = self.timing.lock().expect("warm-up timing lock");
        let elapsed = timing
            .started
            .map_or(timing.elapsed, |started| started.elapsed());
        CacheWarmupStatus {
            state,
            blocks_listed: self.blocks_listed.load(Ordering::Relaxed),
            blocks_to_load: self.blocks_to_load.load(Ordering::Relaxed),
            blocks_loaded: self.blocks_loaded.load(Ordering::Relaxed),
            blocks_skipped: self.blocks_skipped.load(Ordering::Relaxed),
            elapsed_ms: u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX),
        }
    }
}
