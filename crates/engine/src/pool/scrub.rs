//! Scrub: reads every live block of every tier, checks it against its
//! checksum, and rebuilds what fails from the device's redundancy (an
//! array's parity or copies; the device rewrites the bad copy). It owns its
//! progress counters, takes the state lock only to list the live blocks and,
//! on a mismatch, to check that the block is still live (`live_list.rs`: a
//! block the cleaner moved away since the list was made is no damage), and asks the
//! background budget (`budget`) for each run it reads, so that clients keep
//! the device: scrub has the smallest share of it.

use std::sync::atomic::Ordering;

use crate::error::{EngineError, IoError};
use crate::volume::map::Mapping;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

use super::budget::BackgroundWork;
use super::inner::Pool;
use super::live_list::LiveList;
use super::scrub_progress::ScrubStatus;

/// Blocks scrub reads in one device request at most.
pub const SCRUB_RUN_BLOCKS_MAX: usize = 64;

impl Pool {
    /// Scrubs the whole pool and returns what it found; refused while a
    /// scrub is running. Flushes first, so that every live block is on the
    /// device.
    pub async fn scrub(&self) -> Result<ScrubStatus, EngineError> {
        if !self.inner.scrub.start() {
            return Err(EngineError::Io(IoError::ScrubRunning));
        }
        let result = self.scrub_all().await;
        self.inner.scrub.finish();
        result.map(|()| self.inner.scrub.status())
    }

    /// Scrub's progress (also in `pool status`).
    pub fn scrub_status(&self) -> ScrubStatus {
        self.inner.scrub.status()
    }

    async fn scrub_all(&self) -> Result<(), EngineError> {
        self.flush().await?;
        let list = self.live_list();
        let scrubber = &self.inner.scrub;
        scrubber
            .blocks_total
            .store(list.mappings().len() as u64, Ordering::Relaxed);
        for run in physical_runs(list.mappings()) {
            let run_bytes = run.len() as u64 * BLOCK_SIZE_BYTES;
            self.inner
                .budget
                .acquire(BackgroundWork::Scrub, run_bytes)
                .await;
            self.scrub_run(&list, run).await;
            scrubber
                .blocks_scrubbed
                .fetch_add(run.len() as u64, Ordering::Relaxed);
            // A budget with credit and a device that answers at once would
            // not let other tasks run between runs otherwise.
            tokio::task::yield_now().await;
        }
        Ok(())
    }

    async fn scrub_run(&self, list: &LiveList, run: &[Mapping]) {
        let offset = run[0].physical_block * BLOCK_SIZE_BYTES;
        let read = self
            .inner
            .device
            .read(offset, run.len() * BLOCK_BYTES)
            .await;
        let scrubber = &self.inner.scrub;
        let data = match read {
            Ok(data) => data,
            Err(error) => {
                tracing::error!(%error, "scrub could not read live blocks");
                scrubber
                    .blocks_unrepairable
                    .fetch_add(run.len() as u64, Ordering::Relaxed);
                return;
            }
        };
        for (mapping, contents) in run.iter().zip(data.chunks_exact(BLOCK_BYTES)) {
            if self.listed_block_passes(list, mapping, contents) {
                continue;
            }
            if self
                .recover_block(mapping.physical_block, 0, mapping.checksum)
                .await
                .is_some()
            {
                scrubber.blocks_repaired.fetch_add(1, Ordering::Relaxed);
            } else {
                tracing::error!(
                    physical_block = mapping.physical_block,
                    "scrub found a block that fails its checksum and cannot be rebuilt"
                );
                self.inner.integrity.read_checksum_error();
                scrubber.blocks_unrepairable.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Runs of physically consecutive blocks, each at most
/// [`SCRUB_RUN_BLOCKS_MAX`] long.
fn physical_runs(mappings: &[Mapping]) -> Vec<&[Mapping]> {
    let mut runs = Vec::new();
    let mut start = 0;
    for index in 1..=mappings.len() {
        let breaks = index == mappings.len()
            || mappings[index].physical_block != mappings[index - 1].physical_block + 1
            || index - start == SCRUB_RUN_BLOCKS_MAX;
        if breaks {
            runs.push(&mappings[start..index]);
            start = index;
        }
    }
    assert_eq!(
        runs.iter().map(|run| run.len()).sum::<usize>(),
        mappings.len(),
        "runs cover every block once"
    );
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(physical_block: u64) -> Mapping {
        Mapping {
            physical_block,
            checksum: 0,
        }
    }

    #[test]
    fn runs_break_at_gaps_and_at_their_length() {
        let mut mappings: Vec<Mapping> = (10..80).map(mapping).collect();
        mappings.push(mapping(100));
        let runs = physical_runs(&mappings);
        let lengths: Vec<usize> = runs.iter().map(|run| run.len()).collect();
        assert_eq!(lengths, vec![64, 6, 1]);
        assert!(physical_runs(&[]).is_empty());
    }
}
