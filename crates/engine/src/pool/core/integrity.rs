//! What the pool found damaged, and what it did about it: the counters behind
//! `pool status` and `/metrics` that make damage visible instead of silent.
//!
//! It owns its state (atomic counters) and takes no lock, so any component may
//! report to it while holding the state lock. (Which segments the cleaner set
//! aside is a property of each segment, kept with the segment's state.)

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// A snapshot of the counters, since the pool opened (recovery's counts are of
/// the recovery that opened it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IntegrityStatus {
    /// Blocks whose contents failed their checksum when read (each answered
    /// with an I/O error, never with data).
    pub read_checksum_errors: u64,
    /// Blocks that failed their checksum when read or scrubbed and were
    /// rebuilt from the device's redundancy (an array's parity or copies),
    /// served right and rewritten: damage the pool healed.
    pub checksum_errors_repaired: u64,
    /// Batch summaries that failed their checksum and were read from their
    /// copy (recovery and cleaning).
    pub summaries_repaired: u64,
    /// Batches that a completed flush covered but whose summary and copy were
    /// both unreadable at recovery: their records are lost, and the blocks
    /// they wrote may read as an older version. Any non-zero value is data loss.
    pub lost_batches: u64,
    /// Blocks of the unflushed tail dropped at recovery because they failed
    /// their checksum (torn by the crash; no completed flush covered them).
    pub torn_blocks_dropped: u64,
    /// Blocks a completed flush covered that failed their checksum at
    /// recovery: mapped anyway, so that reading them is an I/O error rather
    /// than an older version.
    pub damaged_flushed_blocks: u64,
    /// Segments the cleaner set aside because their summaries do not describe
    /// every block (their live blocks are still served; they are not cleaned).
    pub segments_set_aside: u64,
    /// Map entries marked lost by the open that restored the pool without
    /// its flash device (their data was on it only; a block shared by
    /// snapshots counts once per map). Any non-zero value is data loss.
    pub blocks_marked_lost: u64,
    /// Reads of blocks marked lost (each answered with an I/O error).
    pub lost_block_reads: u64,
}

/// The point of its history a pool restored without its flash device is as
/// of (decision 0056): every volume and snapshot as the checkpoint
/// `checkpoint_sequence` had it, which covered the log through batch
/// `covered_batch_sequence`; nothing written after it is restored, and the
/// blocks whose copy at that point was on flash only read as lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct RestorePoint {
    pub checkpoint_sequence: u64,
    pub covered_batch_sequence: u64,
}

/// The counters; see [`IntegrityStatus`] for what each means.
#[derive(Debug, Default)]
pub struct Integrity {
    read_checksum_errors: AtomicU64,
    checksum_errors_repaired: AtomicU64,
    summaries_repaired: AtomicU64,
    lost_batches: AtomicU64,
    torn_blocks_dropped: AtomicU64,
    damaged_flushed_blocks: AtomicU64,
    blocks_marked_lost: AtomicU64,
    lost_block_reads: AtomicU64,
    restored_as_of: std::sync::OnceLock<RestorePoint>,
}

impl Integrity {
    pub fn read_checksum_error(&self) {
        self.read_checksum_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn lost_block_read(&self) {
        self.lost_block_reads.fetch_add(1, Ordering::Relaxed);
    }

    pub fn checksum_error_repaired(&self) {
        self.checksum_errors_repaired
            .fetch_add(1, Ordering::Relaxed);
    }

    pub fn summaries_repaired(&self, count: u64) {
        self.summaries_repaired.fetch_add(count, Ordering::Relaxed);
    }

    pub fn recovery_found(&self, findings: &RecoveryFindings) {
        self.lost_batches
            .fetch_add(findings.lost_batches, Ordering::Relaxed);
        self.torn_blocks_dropped
            .fetch_add(findings.torn_blocks_dropped, Ordering::Relaxed);
        self.damaged_flushed_blocks
            .fetch_add(findings.damaged_flushed_blocks, Ordering::Relaxed);
        self.blocks_marked_lost
            .fetch_add(findings.blocks_marked_lost, Ordering::Relaxed);
        self.summaries_repaired(findings.summaries_repaired);
        if let Some(point) = findings.restored_as_of {
            self.restored_as_of
                .set(point)
                .expect("a pool is opened, and so restored, once");
        }
    }

    /// The point a pool restored without its flash device is as of; `None`
    /// when the open was no restore.
    pub fn restored_as_of(&self) -> Option<RestorePoint> {
        self.restored_as_of.get().copied()
    }

    /// The counters, with the number of segments set aside now (kept by the
    /// segments' state).
    pub fn status(&self, segments_set_aside: u64) -> IntegrityStatus {
        IntegrityStatus {
            read_checksum_errors: self.read_checksum_errors.load(Ordering::Relaxed),
            checksum_errors_repaired: self.checksum_errors_repaired.load(Ordering::Relaxed),
            summaries_repaired: self.summaries_repaired.load(Ordering::Relaxed),
            lost_batches: self.lost_batches.load(Ordering::Relaxed),
            torn_blocks_dropped: self.torn_blocks_dropped.load(Ordering::Relaxed),
            damaged_flushed_blocks: self.damaged_flushed_blocks.load(Ordering::Relaxed),
            segments_set_aside,
            blocks_marked_lost: self.blocks_marked_lost.load(Ordering::Relaxed),
            lost_block_reads: self.lost_block_reads.load(Ordering::Relaxed),
        }
    }
}

/// What one recovery found (see [`IntegrityStatus`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct RecoveryFindings {
    pub summaries_repaired: u64,
    pub lost_batches: u64,
    pub torn_blocks_dropped: u64,
    pub damaged_flushed_blocks: u64,
    pub blocks_marked_lost: u64,
    /// Set by the open that restored the pool without its flash device.
    pub restored_as_of: Option<RestorePoint>,
}
