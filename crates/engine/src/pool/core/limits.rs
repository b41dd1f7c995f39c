//! What a pool is created with ([`PoolOptions`]) and the runtime limits it
//! runs under ([`PoolLimits`]): every queue, buffer, interval and amount of
//! unflushed data, with the unit last in its name. The limits are checked once,
//! by [`PoolLimits::validate`] (when a pool is created or opened, and when the
//! daemon loads its configuration), so that the code using them need not
//! clamp them.

use serde::Serialize;

use crate::BLOCK_SIZE_BYTES;
use crate::log::geometry::DEFAULT_SEGMENT_SIZE_BYTES;

/// Options fixed when a pool is created.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    pub segment_size_bytes: u64,
    /// Overwrite a device that already holds data.
    pub force: bool,
    /// A two-tier pool: the device's first this many bytes are the flash tier
    /// and the rest is the capacity tier (see `lamina_device::ConcatenatedDevice`).
    pub flash_region_bytes: Option<u64>,
    /// Blocks per row of the flash tier's device (an array's data blocks per
    /// row, `lamina_layout`; 1 for a single device): every batch starts at a
    /// multiple of it, so the array writes whole rows only. The segment size
    /// must be a multiple of it.
    pub flash_row_blocks: u64,
    /// The same for the capacity tier.
    pub capacity_row_blocks: u64,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            segment_size_bytes: DEFAULT_SEGMENT_SIZE_BYTES,
            force: false,
            flash_region_bytes: None,
            flash_row_blocks: 1,
            capacity_row_blocks: 1,
        }
    }
}

/// Runtime limits; each bounds a queue, a buffer or an amount of unflushed data.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolLimits {
    /// Sealed-but-unflushed bytes that trigger a background flush.
    pub dirty_bytes_max: u64,
    /// Oldest unflushed write's age that triggers a background flush.
    pub flush_interval_ms: u64,
    /// Batches (each at most 520 KiB: 128 data blocks, a summary and its copy)
    /// written to the device concurrently.
    pub in_flight_batches_max: usize,
    /// Log bytes appended between background checkpoints (bounds replay time).
    pub checkpoint_interval_bytes: u64,
    /// Time between background checkpoints when anything changed.
    pub checkpoint_interval_ms: u64,
    /// Blocks read from the device in one request at most.
    pub read_run_blocks_max: u64,
    /// Bytes of memory caching device blocks (0 disables the cache).
    pub memory_cache_bytes: u64,
    /// Warm the memory cache after a restart: the daemon records which
    /// blocks it holds (volume and logical block, hottest first) at clean
    /// shutdown and every `memory_cache_record_interval_ms`, and the pool
    /// reloads them in the background after it opens (see
    /// `pool::cache_warmup`).
    pub memory_cache_warm_restart: bool,
    /// Time between two records of the memory cache's contents while the
    /// daemon runs (what a crash leaves for the next start to warm).
    pub memory_cache_record_interval_ms: u64,
    /// Device reads the warm-up has in flight at once at most: it yields to
    /// clients by never queueing more than this ahead of them.
    pub memory_cache_warm_reads_in_flight_max: usize,
    /// Used-space percentages at which a warning is logged once per crossing
    /// (thin pools may be over-committed, so users need a warning before ENOSPC).
    pub usage_warning_percents: Vec<u8>,
    /// Blocks the paced background cleaner may relocate per block clients
    /// write, at full free-space pressure; the budget grows from 0 as free space
    /// falls through the headroom (0 turns the paced cleaner off: the
    /// background task then cleans in passes when free space is low, and a
    /// writer that finds no free segment still cleans for itself).
    pub cleaner_relocation_blocks_per_client_block_max: f64,
    /// Free segments beyond the clients' reserve under which the paced cleaner
    /// starts (at most 2% of the pool's segments, at least 2). It is the
    /// cleaner's slack: clients keep writing while it takes a checkpoint or
    /// relocates a victim, and a write that finds the reserve reached cleans
    /// for itself. 4 was too few under load (decision 0042).
    pub cleaner_headroom_segment_count: usize,
    /// How often the paced cleaner looks at free space and its budget.
    pub cleaner_interval_ms: u64,
    /// Bytes of a victim segment the cleaner reads in one device request at
    /// most: a client read queued behind a cleaner read waits for all of it
    /// (a whole 4 MiB segment took 5–8 ms on the benchmark's disk).
    pub cleaner_read_bytes_max: u64,
    /// Cleaner reads of one victim in flight at once at most.
    pub cleaner_in_flight_reads_max: usize,
    /// Relocation batches the cleaner has at the device at once at most; the
    /// others it has sealed wait in the engine, not in the device queue ahead
    /// of client reads.
    pub cleaner_in_flight_batches_max: usize,
    /// Recently read capacity blocks remembered for promotion decisions (the
    /// ghost, 4 bytes each, allocated in full; two-tier pools only; at most one
    /// per flash block is used).
    pub tier_ghost_entries_max: usize,
    /// Share of flash the demoter keeps free in a two-tier pool, in percent
    /// (0 turns the demoter off; cleaning then demotes only under pressure).
    pub tier_flash_free_percent: u8,
    /// How often the demoter looks at free flash.
    pub tier_demotion_interval_ms: u64,
    /// Longest wait between retries of a batch write that found the device
    /// under the pool out of space (ENOSPC, EDQUOT); retries start at 10 ms
    /// and double up to this.
    pub device_full_retry_interval_ms: u64,
    /// Longest a flush waits for batch writes held up by a full device, and a
    /// write for an in-flight slot, before it fails with ENOSPC (written data
    /// stays queued; a later flush can still succeed).
    pub device_full_wait_ms_max: u64,
    /// Restore redundancy by itself when a device beneath the pool is lost
    /// and the others can hold its data: the data of every segment with a
    /// column on it is moved into segments laid out over the devices left
    /// (an array one column narrower), paced by the background budget. Off:
    /// only `lamina device replace` (or `device rebuild`) restores it.
    pub rebuild_automatic: bool,
    /// Split client writes between three log heads by how often their blocks
    /// are rewritten (one-tier pools; see `cleaner::placement`).
    pub separate_client_writes_by_lifespan: bool,
    /// Pools with at least this many segments split relocations between four
    /// streams by the age of their data, when client writes are split too;
    /// smaller pools send them one stream colder per cleaning survived, since
    /// two more partly filled heads cost them more space than the split saves
    /// (see `cleaner::placement`).
    pub relocation_streams_by_age_segment_count_min: u64,
    /// How much background work (rebuild, cleaning, demotion, scrub) may
    /// take from clients: `low`, `medium` or `high`, as NetApp's
    /// reconstruction impact setting. Each gives the three figures below
    /// that are not set (see [`BackgroundImpact::budget`]).
    pub background_impact: BackgroundImpact,
    /// Bytes per second the background budget allows at least, however slow
    /// clients are: the floor that keeps rebuild and the cleaner moving (none:
    /// `background_impact`'s).
    pub background_bytes_per_second_min: Option<u64>,
    /// Bytes per second the background budget allows at most, reached while
    /// clients stay under their latency target or are idle (none:
    /// `background_impact`'s).
    pub background_bytes_per_second_max: Option<u64>,
    /// How many times the clients' baseline latency (the 99th percentile of
    /// reads and writes per window, learned while background work is idle or
    /// at its floor) client latency may reach before background work backs
    /// off (none: `background_impact`'s, 1.3, 1.5 or 2.0).
    pub client_latency_target_ratio: Option<f64>,
    /// An absolute client latency (the 99th percentile of reads and writes
    /// over a window) above which background work backs off as well, whatever
    /// the baseline (none: no absolute target; the profiles set none).
    pub client_latency_target_us: Option<u64>,
    /// The window over which client latency is measured; the background rate
    /// is adjusted once per window.
    pub client_latency_window_ms: u64,
    /// The codec the cleaner encodes blocks with again as it moves them to
    /// the capacity tier of a two-tier pool (`off`: they move as they are;
    /// decision 0074). Set from the daemon's `[tiering] cold_compression`.
    #[serde(skip)]
    pub cold_compression: lamina_reduction::Codec,
    /// Hooks for tests, never read from a configuration file.
    #[serde(skip)]
    pub test_hooks: TestHooks,
}

/// Behaviour that tests turn on to reach rare states sooner; off in production.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestHooks {
    /// A freed segment goes to the front of the free list instead of the
    /// back, so that it is the next one taken. Crash tests use it to rewrite
    /// a segment as soon as the reuse rule allows (with the back, a segment
    /// freed too early is seldom reached before the checkpoints that would
    /// have made its reuse safe anyway).
    pub reuse_freed_segments_first: bool,
    /// The periodic flush-and-checkpoint task does not start: no flushes
    /// after `flush_interval_ms`, no checkpoints after `checkpoint_interval_ms`
    /// or `checkpoint_interval_bytes`, and none of the usage warnings and
    /// cleaning passes it runs. For tests that place every flush and
    /// checkpoint themselves (a write past `dirty_bytes_max` still starts a
    /// flush; the paced cleaner and the demoter keep their own limits).
    pub periodic_flush_and_checkpoint_off: bool,
    /// Checkpoints are increments until the chain holds
    /// `CHECKPOINT_INCREMENTS_MAX`, however large they are against their
    /// base. Crash tests use it on small pools, where the segment table that
    /// every increment carries whole would otherwise make most increments
    /// pass half their base and become bases.
    pub checkpoint_increments_whatever_their_bytes: bool,
}

impl TestHooks {
    /// Hooks with the periodic flush-and-checkpoint task off, for tests that
    /// flush and checkpoint themselves.
    pub fn without_periodic_flush_and_checkpoint() -> Self {
        Self {
            periodic_flush_and_checkpoint_off: true,
            ..Self::default()
        }
    }
}

/// A limit outside the range the engine works in.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum LimitsError {
    /// An interval, a count of things in flight or a read size that must not
    /// be 0 (or a fraction of a block).
    #[error("{field} must be at least {minimum} (got {value})")]
    TooSmall {
        field: &'static str,
        value: u64,
        minimum: u64,
    },
    #[error("{field} must be at most {maximum} (got {value})")]
    TooLarge {
        field: &'static str,
        value: u64,
        maximum: u64,
    },
    #[error("{field}: {value} is not a percentage from 1 to 100")]
    NotAPercentage { field: &'static str, value: u8 },
    #[error("{field} must be a finite number of at least 0 (got {value})")]
    NotANonNegativeNumber { field: &'static str, value: f64 },
    #[error("{field} must be a finite number of at least {minimum} (got {value})")]
    RatioTooSmall {
        field: &'static str,
        value: f64,
        minimum: f64,
    },
}

/// How much background work may take from clients, as a profile of the
/// background budget's floor, ceiling and latency target ratio.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackgroundImpact {
    /// Clients first: background work backs off when client latency
    /// reaches 1.3 × its baseline, and may fall to 4 MiB/s.
    Low,
    /// The default: backs off at 1.5 × the baseline, between 16 MiB/s and
    /// 512 MiB/s.
    #[default]
    Medium,
    /// Background work first (a rebuild to finish soon): backs off only at
    /// 2 × the baseline, and keeps at least 64 MiB/s.
    High,
}

impl BackgroundImpact {
    /// The profile's floor, ceiling and latency target ratio (no absolute
    /// target: what fits a disk is far too loose for flash, and what fits
    /// flash holds a disk at its floor for good).
    pub fn budget(self) -> BackgroundBudgetLimits {
        let (floor_mib, ceiling_mib, ratio) = match self {
            BackgroundImpact::Low => (4, 128, 1.3),
            BackgroundImpact::Medium => (16, 512, 1.5),
            BackgroundImpact::High => (64, 2048, 2.0),
        };
        BackgroundBudgetLimits {
            bytes_per_second_min: floor_mib << 20,
            bytes_per_second_max: ceiling_mib << 20,
            client_latency_target_ratio: ratio,
            client_latency_target_us: None,
            client_latency_window_ms: CLIENT_LATENCY_WINDOW_MS_DEFAULT,
        }
    }
}

/// The default of `client_latency_window_ms`: ten adjustments a second, each
/// over enough client requests for a 99th percentile under load.
pub const CLIENT_LATENCY_WINDOW_MS_DEFAULT: u64 = 100;

/// The background budget's limits, the impact profile's unless set one by one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackgroundBudgetLimits {
    pub bytes_per_second_min: u64,
    pub bytes_per_second_max: u64,
    /// Client latency may reach this many times its baseline.
    pub client_latency_target_ratio: f64,
    /// And never more than this, if set.
    pub client_latency_target_us: Option<u64>,
    pub client_latency_window_ms: u64,
}

/// The smallest `client_latency_target_ratio`: under 1, background work
/// would back off from the very latency it learned as the baseline.
pub const CLIENT_LATENCY_TARGET_RATIO_MIN: f64 = 1.0;

/// Share of flash the demoter may keep free at most, in percent: the rest is
/// what the pool's data can use on flash.
pub const TIER_FLASH_FREE_PERCENT_MAX: u8 = 90;

/// `value` is at least `minimum`, or the error naming `field`.
fn at_least(field: &'static str, value: u64, minimum: u64) -> Result<(), LimitsError> {
    if value < minimum {
        return Err(LimitsError::TooSmall {
            field,
            value,
            minimum,
        });
    }
    Ok(())
}

impl PoolLimits {
    /// The background budget's limits: those set here, the rest from
    /// `background_impact`.
    pub fn background_budget(&self) -> BackgroundBudgetLimits {
        let profile = self.background_impact.budget();
        BackgroundBudgetLimits {
            bytes_per_second_min: self
                .background_bytes_per_second_min
                .unwrap_or(profile.bytes_per_second_min),
            bytes_per_second_max: self
                .background_bytes_per_second_max
                .unwrap_or(profile.bytes_per_second_max),
            client_latency_target_ratio: self
                .client_latency_target_ratio
                .unwrap_or(profile.client_latency_target_ratio),
            client_latency_target_us: self
                .client_latency_target_us
                .or(profile.client_latency_target_us),
            client_latency_window_ms: self.client_latency_window_ms,
        }
    }

    /// Checks the background budget: a floor of at least a block a second
    /// (0 would stop a rebuild under load for good), a ceiling at least the
    /// floor, a latency target ratio of at least 1, an absolute target (if
    /// set) and a window of at least 1.
    fn validate_background_budget(&self) -> Result<(), LimitsError> {
        let budget = self.background_budget();
        at_least(
            "background_bytes_per_second_min",
            budget.bytes_per_second_min,
            BLOCK_SIZE_BYTES,
        )?;
        at_least(
            "background_bytes_per_second_max",
            budget.bytes_per_second_max,
            budget.bytes_per_second_min,
        )?;
        let ratio = budget.client_latency_target_ratio;
        if !ratio.is_finite() || ratio < CLIENT_LATENCY_TARGET_RATIO_MIN {
            return Err(LimitsError::RatioTooSmall {
                field: "client_latency_target_ratio",
                value: ratio,
                minimum: CLIENT_LATENCY_TARGET_RATIO_MIN,
            });
        }
        if let Some(target_us) = budget.client_latency_target_us {
            at_least("client_latency_target_us", target_us, 1)?;
        }
        at_least(
            "client_latency_window_ms",
            budget.client_latency_window_ms,
            1,
        )
    }

    /// Checks every limit against the range the engine works in; the first
    /// one outside it is the error. Intervals must be at least 1 ms (a timer
    /// of 0 would spin), counts of things in flight at least 1 (0 would stall
    /// every writer or the cleaner), a cleaner read at least one block.
    pub fn validate(&self) -> Result<(), LimitsError> {
        at_least("flush_interval_ms", self.flush_interval_ms, 1)?;
        at_least("cleaner_interval_ms", self.cleaner_interval_ms, 1)?;
        at_least(
            "memory_cache_record_interval_ms",
            self.memory_cache_record_interval_ms,
            1,
        )?;
        at_least(
            "memory_cache_warm_reads_in_flight_max",
            self.memory_cache_warm_reads_in_flight_max as u64,
            1,
        )?;
        at_least(
            "tier_demotion_interval_ms",
            self.tier_demotion_interval_ms,
            1,
        )?;
        at_least(
            "device_full_retry_interval_ms",
            self.device_full_retry_interval_ms,
            1,
        )?;
        at_least(
            "in_flight_batches_max",
            self.in_flight_batches_max as u64,
            1,
        )?;
        at_least("read_run_blocks_max", self.read_run_blocks_max, 1)?;
        at_least(
            "cleaner_read_bytes_max",
            self.cleaner_read_bytes_max,
            BLOCK_SIZE_BYTES,
        )?;
        at_least(
            "cleaner_in_flight_reads_max",
            self.cleaner_in_flight_reads_max as u64,
            1,
        )?;
        at_least(
            "cleaner_in_flight_batches_max",
            self.cleaner_in_flight_batches_max as u64,
            1,
        )?;
        let relocation = self.cleaner_relocation_blocks_per_client_block_max;
        if !relocation.is_finite() || relocation < 0.0 {
            return Err(LimitsError::NotANonNegativeNumber {
                field: "cleaner_relocation_blocks_per_client_block_max",
                value: relocation,
            });
        }
        if self.tier_flash_free_percent > TIER_FLASH_FREE_PERCENT_MAX {
            return Err(LimitsError::TooLarge {
                field: "tier_flash_free_percent",
                value: u64::from(self.tier_flash_free_percent),
                maximum: u64::from(TIER_FLASH_FREE_PERCENT_MAX),
            });
        }
        self.validate_background_budget()?;
        if let Some(percent) = self
            .usage_warning_percents
            .iter()
            .find(|percent| !(1..=100).contains(*percent))
        {
            return Err(LimitsError::NotAPercentage {
                field: "usage_warning_percents",
                value: *percent,
            });
        }
        Ok(())
    }
}

impl Default for PoolLimits {
    fn default() -> Self {
        Self {
            dirty_bytes_max: 64 << 20,
            flush_interval_ms: 1000,
            in_flight_batches_max: 32,
            checkpoint_interval_bytes: 1 << 30,
            checkpoint_interval_ms: 30_000,
            read_run_blocks_max: 64,
            usage_warning_percents: vec![80, 90],
            memory_cache_bytes: 1 << 30,
            memory_cache_warm_restart: true,
            memory_cache_record_interval_ms: 60_000,
            memory_cache_warm_reads_in_flight_max: 4,
            cleaner_relocation_blocks_per_client_block_max: 32.0,
            cleaner_headroom_segment_count: 32,
            cleaner_interval_ms: 5,
            cleaner_read_bytes_max: 256 << 10,
            cleaner_in_flight_reads_max: 2,
            cleaner_in_flight_batches_max: 2,
            tier_ghost_entries_max: 1 << 24,
            tier_flash_free_percent: 10,
            tier_demotion_interval_ms: 20,
            device_full_retry_interval_ms: 1000,
            device_full_wait_ms_max: 10_000,
            rebuild_automatic: true,
            separate_client_writes_by_lifespan: true,
            relocation_streams_by_age_segment_count_min: 512,
            background_impact: BackgroundImpact::Medium,
            background_bytes_per_second_min: None,
            background_bytes_per_second_max: None,
            client_latency_target_ratio: None,
            client_latency_target_us: None,
            client_latency_window_ms: CLIENT_LATENCY_WINDOW_MS_DEFAULT,
            cold_compression: lamina_reduction::Codec::Off,
            test_hooks: TestHooks::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid() {
        assert_eq!(PoolLimits::default().validate(), Ok(()));
    }

    #[test]
    fn each_limit_out_of_range_is_named_with_its_value_and_range() {
        let refused = |limits: PoolLimits| limits.validate().unwrap_err().to_string();
        let zero_flush_interval = PoolLimits {
            flush_interval_ms: 0,
            ..PoolLimits::default()
        };
        assert_eq!(
            refused(zero_flush_interval),
            "flush_interval_ms must be at least 1 (got 0)"
        );
        let small_reads = PoolLimits {
            cleaner_read_bytes_max: 512,
            ..PoolLimits::default()
        };
        assert_eq!(
            refused(small_reads),
            "cleaner_read_bytes_max must be at least 4096 (got 512)"
        );
        let no_batches = PoolLimits {
            cleaner_in_flight_batches_max: 0,
            ..PoolLimits::default()
        };
        assert_eq!(
            refused(no_batches),
            "cleaner_in_flight_batches_max must be at least 1 (got 0)"
        );
        let negative = PoolLimits {
            cleaner_relocation_blocks_per_client_block_max: -1.0,
            ..PoolLimits::default()
        };
        assert!(refused(negative).starts_with("cleaner_relocation_blocks_per_client_block_max"));
        let not_a_number = PoolLimits {
            cleaner_relocation_blocks_per_client_block_max: f64::NAN,
            ..PoolLimits::default()
        };
        assert!(not_a_number.validate().is_err());
        let too_much_free = PoolLimits {
            tier_flash_free_percent: 95,
            ..PoolLimits::default()
        };
        assert_eq!(
            refused(too_much_free),
            "tier_flash_free_percent must be at most 90 (got 95)"
        );
        let warning = PoolLimits {
            usage_warning_percents: vec![80, 0],
            ..PoolLimits::default()
        };
        assert_eq!(
            refused(warning),
            "usage_warning_percents: 0 is not a percentage from 1 to 100"
        );
        let ceiling_under_floor = PoolLimits {
            background_impact: BackgroundImpact::High,
            background_bytes_per_second_max: Some(1 << 20),
            ..PoolLimits::default()
        };
        assert_eq!(
            refused(ceiling_under_floor),
            "background_bytes_per_second_max must be at least 67108864 (got 1048576)"
        );
        let no_floor = PoolLimits {
            background_bytes_per_second_min: Some(0),
            ..PoolLimits::default()
        };
        assert_eq!(
            refused(no_floor),
            "background_bytes_per_second_min must be at least 4096 (got 0)"
        );
    }

    #[test]
    fn the_impact_profile_gives_what_is_not_set_one_by_one() {
        let low = PoolLimits {
            background_impact: BackgroundImpact::Low,
            client_latency_target_us: Some(500),
            ..PoolLimits::default()
        };
        let budget = low.background_budget();
        assert_eq!(budget.bytes_per_second_min, 4 << 20);
        assert_eq!(budget.bytes_per_second_max, 128 << 20);
        assert_eq!(budget.client_latency_target_us, Some(500));
        assert_eq!(budget.client_latency_target_ratio, 1.3);
        let medium = PoolLimits::default().background_budget();
        let high = BackgroundImpact::High.budget();
        assert!(medium.bytes_per_second_min < high.bytes_per_second_min);
        assert!(medium.client_latency_target_ratio < high.client_latency_target_ratio);
        assert_eq!(medium.client_latency_target_us, None);
        let under_one = PoolLimits {
            client_latency_target_ratio: Some(0.9),
            ..PoolLimits::default()
        };
        assert_eq!(
            under_one.validate().unwrap_err().to_string(),
            "client_latency_target_ratio must be a finite number of at least 1 (got 0.9)"
        );
    }
}
