//! Rebuild: when a device beneath the pool is being replaced (an array
//! member, `device replace`), writes to the replacement what the pool keeps
//! and nothing else: each tier's metadata area and every segment in use, in
//! ascending order. Rebuild time is proportional to the data stored, not to
//! the device's size. Every reconstructed row is checked against the
//! checksums of the live blocks it holds (a block moved away since the list
//! was made is no damage). It runs in the background, paced by the shared
//! background budget (`budget/`) at the rebuild's weight, and resumes after
//! a restart from the replacement's label (the device keeps its progress):
//! the ranges below the resume point pass at once, unpaced, as the device
//! writes nothing for them; see
//! `docs/decisions/0023-rebuild-onto-a-replacement.md` and
//! `docs/decisions/0053-a-resumed-rebuild-redoes-seconds.md`.

pub mod progress;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use lamina_device::RebuildReport;

use crate::BLOCK_SIZE_BYTES;
use crate::error::EngineError;
use crate::log::geometry::DATA_START_BLOCK;

use super::evacuation::{Evacuation, EvacuationGoal, EvacuationNeed};
use super::live_list::LiveList;
use crate::pool::budget::BackgroundWork;
use crate::pool::core::Core;
use crate::pool::repair::rebuild::progress::{RebuildKind, RebuildState, RebuildStatus};
use crate::pool::space::SegmentState;

/// Bytes the rebuild asks the device for in one step (it then yields).
pub const REBUILD_STEP_BYTES_MAX: u64 = 1 << 20;

/// What [`Pool::start_rebuild`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RebuildStart {
    Started,
    /// A rebuild runs already.
    Running,
    /// Nothing to rebuild (or `rebuild_automatic` is off).
    Nothing,
    /// A device is lost and the others lack the free space for its data.
    LacksSpace(EvacuationNeed),
}

/// A byte range of the pool's device to rebuild.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RebuildRange {
    offset: u64,
    length: u64,
}

/// A rebuild of the pool's device onto a replacement, built with the pool
/// it restores: the core whose device, segments and live blocks it reads,
/// which a rebuild started in the background holds (and on which it builds
/// an evacuation when no replacement is pending).
pub(in crate::pool) struct Rebuild<'a> {
    core: &'a Arc<Core>,
}

impl<'a> Rebuild<'a> {
    pub(in crate::pool) fn new(core: &'a Arc<Core>) -> Self {
        Self { core }
    }

    /// Whether a device beneath the pool is being rebuilt.
    pub(in crate::pool) fn pending(&self) -> bool {
        self.core.device().rebuild_pending()
    }

    /// The rebuild's progress (also in `pool status`).
    pub(in crate::pool) fn status(&self) -> RebuildStatus {
        self.core.rebuild().status()
    }

    /// Starts a rebuild in the background if none runs: onto a replacement
    /// when one is pending; otherwise, with `rebuild_automatic`, by moving
    /// the data of degraded segments onto the devices left, when they can
    /// hold it (`repair/evacuation.rs`).
    pub(in crate::pool) fn start(&self) -> RebuildStart {
        let status = self.status();
        let running = status.state == RebuildState::Rebuilding;
        if running && (status.kind == RebuildKind::Replacement || !self.pending()) {
            return RebuildStart::Running;
        }
        // A replacement takes over from a rebuild onto spare space, which
        // stops at its next step (`Pool::rebuild` waits for that).
        if self.pending() {
            let core = self.core.clone();
            self.core.supervisor().spawn("rebuild", async move {
                if let Err(error) = Rebuild::new(&core).run().await {
                    tracing::debug!(%error, "rebuild did not run");
                }
            });
            return RebuildStart::Started;
        }
        if !self.core.limits().rebuild_automatic {
            return RebuildStart::Nothing;
        }
        let need = Evacuation::new(self.core).need();
        if need.is_empty() {
            return RebuildStart::Nothing;
        }
        if need.live_bytes > need.free_bytes {
            return RebuildStart::LacksSpace(need);
        }
        let core = self.core.clone();
        self.core.supervisor().spawn("evacuation", async move {
            if let Err(error) = Evacuation::new(&core).run(EvacuationGoal::Redundancy).await {
                tracing::debug!(%error, "rebuild did not run");
            }
        });
        RebuildStart::Started
    }

    /// Rebuilds every range the pool keeps onto the replacement, then lets
    /// it take its member's place. Refused while a rebuild runs; nothing to
    /// do when none is pending.
    pub(in crate::pool) async fn run(&self) -> Result<RebuildStatus, EngineError> {
        if !self.pending() {
            return Ok(self.status());
        }
        while !self.core.rebuild().start(RebuildKind::Replacement) {
            if self.status().kind == RebuildKind::Replacement {
                return Err(EngineError::Io(crate::error::IoError::RebuildRunning));
            }
            // A rebuild onto spare space: it stops at its next step now
            // that a replacement is pending.
            tokio::time::sleep(std::time::Duration::from_millis(
                super::evacuation::EVACUATION_YIELD_POLL_MS,
            ))
            .await;
        }
        tracing::warn!("rebuild started");
        let result = self.rebuild_all().await;
        self.core.rebuild().end(result)
    }

    async fn rebuild_all(&self) -> Result<(), EngineError> {
        let ranges = self.rebuild_ranges();
        let rebuilder = self.core.rebuild();
        let total: u64 = ranges.iter().map(|range| range.length).sum();
        rebuilder.bytes_total.store(total, Ordering::Relaxed);
        let live = LiveList::take(self.core);
        let is_valid = |block: u64, contents: &[u8]| self.block_passes(&live, block, contents);
        for range in ranges {
            let mut offset = range.offset;
            let end = range.offset + range.length;
            while offset < end {
                if self.core.background_stopped() {
                    return Err(EngineError::Io(crate::error::IoError::RebuildInterrupted));
                }
                let length = (end - offset).min(REBUILD_STEP_BYTES_MAX);
                let report = self
                    .core
                    .device()
                    .rebuild_range(offset, length, &is_valid)
                    .await
                    .map_err(EngineError::Device)?;
                // Paced with the cleaner, the demoter and scrub, behind
                // client latency, never below the budget's floor: each step
                // pays for its work before the next one starts. A step that
                // wrote nothing (rows the replacement already held: a
                // rebuild resumed after a restart) pays nothing; paid for
                // ahead, as before, a resumed rebuild took as long to pass
                // its resume point as its first run took to reach it, and
                // restarts that came as often never got further (issue 42).
                if report.blocks_rebuilt > 0 {
                    self.core
                        .budget()
                        .acquire(BackgroundWork::Rebuild, length)
                        .await;
                }
                self.count_rebuilt(length, report);
                offset += length;
            }
        }
        self.core
            .device()
            .finish_rebuild()
            .await
            .map_err(EngineError::Device)
    }

    fn count_rebuilt(&self, length: u64, report: RebuildReport) {
        let rebuilder = self.core.rebuild();
        rebuilder.bytes_done.fetch_add(length, Ordering::Relaxed);
        if report.blocks_rebuilt == 0 {
            rebuilder.bytes_skipped.fetch_add(length, Ordering::Relaxed);
        }
        rebuilder
            .rows_verified
            .fetch_add(report.rows_verified, Ordering::Relaxed);
        rebuilder
            .blocks_unrepairable
            .fetch_add(report.blocks_unrepairable, Ordering::Relaxed);
    }

    /// Each tier's metadata area and every segment not free, ascending.
    fn rebuild_ranges(&self) -> Vec<RebuildRange> {
        let geometry = self.core.geometry();
        let mut ranges = vec![RebuildRange {
            offset: 0,
            length: DATA_START_BLOCK * BLOCK_SIZE_BYTES,
        }];
        let segment_bytes = geometry.segment_size_blocks * BLOCK_SIZE_BYTES;
        let state = self.core.lock();
        for (index, segment) in state.space().segments().iter().enumerate() {
            let index = u32::try_from(index).expect("segment indexes fit in u32");
            if index as u64 == geometry.flash_segment_count && geometry.has_capacity_tier() {
                let start = geometry.capacity_start_block;
                ranges.push(RebuildRange {
                    offset: start * BLOCK_SIZE_BYTES,
                    length: (geometry.capacity_data_start_block() - start) * BLOCK_SIZE_BYTES,
                });
            }
            if segment.state == SegmentState::Free {
                continue;
            }
            let offset = geometry.segment_first_block(index) * BLOCK_SIZE_BYTES;
            match ranges.last_mut() {
                Some(last) if last.offset + last.length == offset => last.length += segment_bytes,
                _ => ranges.push(RebuildRange {
                    offset,
                    length: segment_bytes,
                }),
            }
        }
        ranges
    }

    /// The rebuild's check: a live block must match its checksum and a
    /// block of fragments hold the fragments that lie wholly in it, unless
    /// it is no longer live (moved away and its place reused since the list
    /// was made); anything else passes.
    fn block_passes(&self, live: &LiveList, block: u64, contents: &[u8]) -> bool {
        live.contents_pass(self.core, block, contents)
    }
}
