//! The lamina storage engine: thin volumes stored in a log-structured,
//! write-anywhere layout on one device.
//!
//! Layers, each a module with one job:
//! - [`log`]: the on-disk format: superblock, segments made of batches (a summary
//!   block followed by data blocks), checkpoints in two alternating slots, and
//!   recovery (last valid checkpoint plus replay of newer batches).
//! - [`volume`]: thin volumes and their maps from logical 4 KiB blocks to physical
//!   device blocks.
//! - [`tier`]: where blocks are served from: the memory cache today.
//! - [`pool`]: the engine's front door. It owns the device, the in-memory state,
//!   the write path (batching, flush, durability bookkeeping), background flushes
//!   and checkpoints, and the volume operations that clients and the control plane
//!   call.

pub mod clock;
mod convert;
pub mod error;
pub mod log;
pub mod pool;
pub mod tier;
pub mod volume;

pub use error::{CreateError, EngineError, IoError, OpenError, VolumeError};
/// A volume's codec (`VolumeInfo::compression`, `Pool::set_volume_compression`).
pub use lamina_reduction::{Codec, CodecParseError};
pub use log::geometry::Tier;
pub use log::location::Location;
pub use pool::budget::{BackgroundBudgetStatus, BackgroundWork, ClientOperation, GrantedBytes};
pub use pool::cache_warmup::{
    CacheContents, CacheContentsError, CacheWarmupState, CacheWarmupStatus, CachedBlock,
};
pub use pool::cleaner::CleanerState;
pub use pool::io::flush_stages::FlushStagesStatus;
pub use pool::io::space_waits::SpaceWaitsStatus;
pub use pool::repair::evacuation::{EvacuationGoal, EvacuationNeed};
pub use pool::repair::rebuild::RebuildStart;
pub use pool::repair::rebuild::progress::{RebuildKind, RebuildState, RebuildStatus};
pub use pool::repair::scrub::progress::{ScrubState, ScrubStatus};
pub use pool::tiering::capacity_writes::{CapacitySuspension, CapacityWritesStatus};
pub use pool::{
    BackgroundImpact, DeviceFullStatus, Extent, FlashRestore, LimitsError, Pool, PoolLimits,
    PoolOptions, PoolStatus, ReadExtents, RestorePoint, RestoredFlash, TestHooks, TierSpace,
    VolumeTierStats,
};
pub use tier::heat::VolumeTierCounters;
pub use volume::{
    CachePriority, Pin, SnapshotInfo, TierPolicy, View, VolumeInfo, split_snapshot_name,
    validate_volume_name,
};

/// The engine's pure decision functions, exported so that models of the
/// engine (the `lamina-model` crate: cleaner and cache simulations) call them
/// instead of keeping copies: victim scoring and the placement of client writes
/// and relocations.
pub mod model_api {
    pub use crate::pool::cleaner::placement::{
        CLASS_BOUND_FACTOR, LIFESPAN_SAMPLE_COUNT_MAX, interval_class, interval_level,
        interval_of_level, lifespan_threshold_blocks, relocated_data_written_at_blocks,
        rewrite_interval_level,
    };
    pub use crate::pool::cleaner::victims::{VICTIM_UTILIZATION_MAX, VictimPolicy};
}

/// Size in bytes of a logical and of a physical block: the unit of mapping,
/// checksumming and allocation.
pub const BLOCK_SIZE_BYTES: u64 = BLOCK_BYTES as u64;

/// [`BLOCK_SIZE_BYTES`] as a `usize`: the length of one block's buffer and the
/// stride for slicing blocks out of a larger buffer.
pub const BLOCK_BYTES: usize = 4096;
