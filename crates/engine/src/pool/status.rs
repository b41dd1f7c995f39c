//! What the pool reports about itself: [`PoolStatus`] (`pool status`, read
//! by the daemon and the tests as JSON, so its field names and meanings are
//! an interface) and [`VolumeTierStats`] (`volume stats`). Each is assembled
//! from figures computed apart: space, lifetime write counters, tiering,
//! the background budget.

use serde::Serialize;

use super::budget::BackgroundBudgetStatus;
use super::cache_warmup::CacheWarmupStatus;
use super::cleaner::{self, CleanerState};
use super::space::Allocation;
use crate::BLOCK_SIZE_BYTES;
use crate::error::EngineError;
use crate::log::geometry::{Geometry, Tier};
use crate::pool::core::Core;
use crate::pool::core::integrity::IntegrityStatus;
use crate::pool::core::limits::PoolLimits;
use crate::pool::core::state::State;
use crate::pool::io::device_full::DeviceFullStatus;
use crate::pool::io::flush_stages::FlushStagesStatus;
use crate::pool::io::space_waits::SpaceWaitsStatus;
use crate::pool::repair::rebuild::progress::RebuildStatus;
use crate::pool::repair::scrub::progress::ScrubStatus;
use crate::tier::heat::VolumeTierCounters;
use crate::tier::memory_cache::CacheStatistics;
use crate::volume::map::BlockMap;
use crate::volume::{TierPolicy, UNIT_SIZE_BYTES, compress_ratio, stored_bytes_of};

/// What `pool status` shows.
#[derive(Clone, Debug, Serialize)]
pub struct PoolStatus {
    pub device: String,
    /// Every segment counted at the bytes it holds when opened now (on an
    /// array, at the width of the devices in use), as are the figures
    /// below.
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub reserved_bytes: u64,
    /// Bytes clients would read back from the live data: 4096 for every
    /// distinct location (whole block or compressed fragment) a map holds,
    /// once however many snapshots and clones share it.
    pub logical_bytes: u64,
    /// Bytes of the devices those locations take (16-byte units, each
    /// location once): what compression left of `logical_bytes`.
    pub stored_bytes: u64,
    /// `logical_bytes / stored_bytes`, as ZFS's `compressratio` (1.0 when
    /// nothing is stored).
    pub compress_ratio: f64,
    /// Used share of the space clients can fill (used plus free, which
    /// leaves out the reserves), in percent: 100 when writes fail with ENOSPC.
    pub used_percent: f64,
    /// The highest of `usage_warning_percents` that `used_percent` has
    /// reached, 0 for none: the warning in force (also logged when crossed).
    pub usage_warning_percent: u8,
    pub segment_size_bytes: u64,
    pub segment_count: u64,
    pub free_segment_count: u64,
    pub volume_count: usize,
    /// Bytes clients have written over the pool's life. This and the two
    /// counters below are kept in checkpoints, so a crash loses what was
    /// written after the newest one from them.
    pub client_bytes_written: u64,
    /// Log and checkpoint bytes written to the devices over the pool's life.
    pub device_bytes_written: u64,
    /// `device_bytes_written / client_bytes_written`; none before clients write.
    pub write_amplification: Option<f64>,
    /// Blocks the cleaner has moved out of victim segments over the pool's life.
    pub cleaner_relocated_blocks: u64,
    /// Segments with no live blocks, waiting for checkpoints to be freed.
    pub dead_segment_count: u64,
    /// What the paced background cleaner is doing.
    pub cleaner_state: CleanerState,
    /// Free-space pressure on the cleaner: 0 with the cleaner's headroom (or
    /// more) free beyond the reserves, 1 with nothing free beyond them; the
    /// paced cleaner relocates this times
    /// `cleaner_relocation_blocks_per_client_block_max` per client block.
    pub cleaner_pressure: f64,
    /// Writes that found no free segment and waited for a reclaim (cleaning
    /// in the write path), and how long, since the pool opened.
    pub space_waits: SpaceWaitsStatus,
    /// The flash tier's flushes since the pool opened, and where their time
    /// went, stage by stage.
    pub flush_stages: FlushStagesStatus,
    pub durable_batch_sequence: u64,
    pub checkpoint_sequence: u64,
    pub failed: Option<String>,
    /// Set while the device under the pool is out of space and batch writes
    /// wait for it (see `device_full_retry_interval_ms`).
    pub device_full: Option<DeviceFullStatus>,
    /// Batch writes retried after finding the device full, since the pool opened.
    pub device_full_retries: u64,
    pub memory_cache: CacheStatistics,
    /// The memory cache's warm-up after a restart.
    pub cache_warmup: CacheWarmupStatus,
    /// Space of the flash tier (all of a one-tier pool).
    pub flash: TierSpace,
    /// Space of the capacity tier, in a two-tier pool.
    pub capacity: Option<TierSpace>,
    /// In a two-tier pool, bytes of live data whose only copy is on the
    /// flash tier (not yet demoted): what losing the flash device would lose
    /// beyond the writes after the newest checkpoint (decision 0038).
    pub flash_only_bytes: Option<u64>,
    /// Blocks moved from capacity to flash on access, and from flash to
    /// capacity by the cleaner, since the pool opened.
    pub promoted_blocks: u64,
    pub demoted_blocks: u64,
    /// Whether the capacity tier takes writes, in a two-tier pool: while
    /// `suspended`, demotion and checkpoints wait for it (decision 0032).
    pub capacity_writes: Option<crate::pool::tiering::capacity_writes::CapacityWritesStatus>,
    /// Damage found (checksum errors, repaired summaries, lost batches,
    /// segments set aside) since the pool opened.
    pub integrity: IntegrityStatus,
    /// The latest scrub's progress and findings.
    pub scrub: ScrubStatus,
    /// The latest rebuild's progress (a replacement device being rebuilt).
    pub rebuild: RebuildStatus,
    /// The rate background work may issue, the client latency it follows,
    /// and the bytes granted to each kind of work since the pool opened.
    pub background: BackgroundBudgetStatus,
}

/// One tier's space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TierSpace {
    pub size_bytes: u64,
    /// Bytes of segments in use (live data, dead data waiting to be cleaned,
    /// checkpoints and open log heads).
    pub used_bytes: u64,
    /// Bytes of free segments (including the reserves).
    pub free_bytes: u64,
}

/// What `volume stats` shows: where a volume's blocks live and where its
/// reads were served from since the pool opened.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VolumeTierStats {
    pub volume: String,
    pub policy: TierPolicy,
    /// The codec of its new writes.
    pub compression: lamina_reduction::Codec,
    /// Bytes of the volume's live contents on each tier.
    pub flash_bytes: u64,
    pub capacity_bytes: u64,
    /// Bytes of the volume's live contents (mapped blocks × 4096) and of
    /// the devices they take (a fragment its units × 16), shared or not.
    pub logical_bytes: u64,
    pub stored_bytes: u64,
    /// `logical_bytes / stored_bytes` (1.0 when nothing is stored).
    pub compress_ratio: f64,
    pub counters: VolumeTierCounters,
    /// Shares of block reads served from memory, flash and capacity (0 when
    /// nothing was read; unwritten blocks are not counted).
    pub memory_hit_ratio: f64,
    pub flash_hit_ratio: f64,
    pub capacity_read_ratio: f64,
}

/// The pool's space in segments, as `pool status` shows it.
struct SpaceFigures {
    used_segment_count: u64,
    /// Free segments of both tiers, the reserves included.
    free_segment_count: u64,
    /// The clients' reserve: free segments only the cleaner and records use.
    reserved_segment_count: u64,
    /// See [`PoolStatus::used_percent`].
    used_percent: f64,
    dead_segment_count: u64,
}

impl SpaceFigures {
    fn of(state: &State) -> Self {
        let space = state.space();
        let free_segment_count =
            (space.free_flash_segment_count() + space.free_capacity_segment_count()) as u64;
        let reserved_segment_count = space.reserve_for(Allocation::Client) as u64;
        let used_segment_count = space.used_segment_count() as u64;
        let fillable_segment_count =
            used_segment_count + free_segment_count.saturating_sub(reserved_segment_count);
        let used_percent = if fillable_segment_count == 0 {
            0.0
        } else {
            100.0 * used_segment_count as f64 / fillable_segment_count as f64
        };
        Self {
            used_segment_count,
            free_segment_count,
            reserved_segment_count,
            used_percent,
            dead_segment_count: space.all_dead_segment_count() as u64,
        }
    }

    /// Free segments clients can fill: the free ones beyond the reserve.
    fn fillable_free_segment_count(&self) -> u64 {
        self.free_segment_count
            .saturating_sub(self.reserved_segment_count)
    }

    /// The highest warning threshold `used_percent` has reached, 0 for none.
    fn usage_warning_percent(&self, limits: &PoolLimits) -> u8 {
        limits
            .usage_warning_percents
            .iter()
            .copied()
            .filter(|threshold| self.used_percent >= f64::from(*threshold))
            .max()
            .unwrap_or(0)
    }
}

/// Bytes a segment of each tier holds when opened now: its whole range on
/// a single device; on an array, its rows at the width of the devices in
/// use (less than the range while the array has empty slots to grow into,
/// or after a loss). Space figures count segments at this size.
#[derive(Clone, Copy)]
struct SegmentBytes {
    flash: u64,
    capacity: u64,
}

impl SegmentBytes {
    fn of(geometry: &Geometry, shapes: &crate::pool::space::segment_shapes::SegmentShapes) -> Self {
        let flash = shapes.new_size_bytes(0);
        let capacity = match geometry.has_capacity_tier() {
            true => shapes.new_size_bytes(
                u32::try_from(geometry.flash_segment_count).expect("segment indexes fit in u32"),
            ),
            false => 0,
        };
        Self { flash, capacity }
    }

    fn of_tier(self, tier: Tier) -> u64 {
        match tier {
            Tier::Flash => self.flash,
            Tier::Capacity => self.capacity,
        }
    }

    /// The pool's bytes, every segment at this size.
    fn pool_bytes(self, geometry: &Geometry) -> u64 {
        geometry.flash_segment_count * self.flash
            + geometry.capacity_segment_count() * self.capacity
    }

    /// The mean bytes of a segment of either tier, for figures counted
    /// over both (used, free beyond the reserve).
    fn mean_bytes(self, geometry: &Geometry) -> u64 {
        self.pool_bytes(geometry) / geometry.segment_count.max(1)
    }
}

/// The space of `tier`, of which `free_segment_count` segments are free.
fn tier_space(
    geometry: &Geometry,
    tier: Tier,
    free_segment_count: usize,
    segment_bytes: SegmentBytes,
) -> TierSpace {
    let segment_count = match tier {
        Tier::Flash => geometry.flash_segment_count,
        Tier::Capacity => geometry.capacity_segment_count(),
    };
    let size_bytes = segment_count * segment_bytes.of_tier(tier);
    let free_bytes = free_segment_count as u64 * segment_bytes.of_tier(tier);
    TierSpace {
        size_bytes,
        used_bytes: size_bytes - free_bytes,
        free_bytes,
    }
}

/// Blocks moved between the tiers since the pool opened, over all volumes.
#[derive(Default)]
struct TierMoves {
    promoted_blocks: u64,
    demoted_blocks: u64,
}

impl TierMoves {
    fn of(state: &State) -> Self {
        state
            .all_tier_counters()
            .fold(Self::default(), |total, counters| Self {
                promoted_blocks: total.promoted_blocks + counters.promoted_blocks,
                demoted_blocks: total.demoted_blocks + counters.demoted_blocks,
            })
    }
}

/// Segments set aside as damaged.
fn set_aside_segment_count(state: &State) -> u64 {
    state
        .space()
        .segments()
        .iter()
        .filter(|segment| segment.set_aside)
        .count() as u64
}

/// The pool's live data before and after compression, from the space
/// allocator's running counts (no map walk).
struct StoredFigures {
    logical_bytes: u64,
    stored_bytes: u64,
}

impl StoredFigures {
    fn of(state: &State) -> Self {
        let space = state.space();
        Self {
            logical_bytes: space.live_location_count() * BLOCK_SIZE_BYTES,
            stored_bytes: space.live_unit_count() * UNIT_SIZE_BYTES,
        }
    }
}

/// The share `part` is of `reads` (0 when nothing was read).
fn ratio(part: u64, reads: u64) -> f64 {
    if reads == 0 {
        0.0
    } else {
        part as f64 / reads as f64
    }
}

/// What `volume stats` takes of a volume under the state lock.
struct CopiedVolume {
    name: String,
    policy: TierPolicy,
    compression: lamina_reduction::Codec,
    /// Shares its chunks with the volume's map: cheap to copy.
    map: BlockMap,
    counters: VolumeTierCounters,
}

/// Bytes of live data in flash segments (each physical block once, however
/// many maps share it).
fn flash_live_bytes(state: &State) -> u64 {
    state
        .space()
        .segments_of(Tier::Flash)
        .map(|(_, segment)| u64::from(segment.live_blocks()))
        .sum::<u64>()
        * BLOCK_SIZE_BYTES
}

/// What one walk of a volume's map finds: blocks on capacity and the
/// device bytes of every mapped location.
struct MapPlacement {
    capacity_blocks: u64,
    stored_bytes: u64,
}

impl MapPlacement {
    fn of(geometry: &Geometry, map: &BlockMap) -> Self {
        let mut placement = Self {
            capacity_blocks: 0,
            stored_bytes: 0,
        };
        map.for_each_location(&mut |location| {
            if geometry.tier_of_block(location.block()) == Tier::Capacity {
                placement.capacity_blocks += 1;
            }
            placement.stored_bytes += stored_bytes_of(location);
        });
        placement
    }
}

impl Core {
    pub(in crate::pool) fn status(&self) -> PoolStatus {
        let background = self.budget().status();
        let state = self.lock();
        let geometry = &self.geometry();
        let sizes = SegmentBytes::of(geometry, self.shapes());
        let capacity_bytes = sizes.pool_bytes(geometry);
        let segment_bytes = sizes.mean_bytes(geometry);
        let space = SpaceFigures::of(&state);
        let stored = StoredFigures::of(&state);
        let moves = TierMoves::of(&state);
        let counters = state.counters().lifetime();
        let (cleaner_state, cleaner_pressure) = cleaner::cleaner_state(&state, self.limits());
        PoolStatus {
            device: self.device().name().to_string(),
            capacity_bytes,
            used_bytes: space.used_segment_count * segment_bytes,
            free_bytes: space.fillable_free_segment_count() * segment_bytes,
            reserved_bytes: space.reserved_segment_count * segment_bytes,
            logical_bytes: stored.logical_bytes,
            stored_bytes: stored.stored_bytes,
            compress_ratio: compress_ratio(stored.logical_bytes, stored.stored_bytes),
            used_percent: space.used_percent,
            usage_warning_percent: space.usage_warning_percent(self.limits()),
            segment_size_bytes: geometry.segment_size_bytes(),
            segment_count: geometry.segment_count,
            free_segment_count: space.free_segment_count,
            volume_count: state.volumes().iter().count(),
            client_bytes_written: counters.client_bytes_written,
            device_bytes_written: counters.device_bytes_written,
            write_amplification: (counters.client_bytes_written > 0).then(|| {
                counters.device_bytes_written as f64 / counters.client_bytes_written as f64
            }),
            cleaner_relocated_blocks: counters.cleaner_relocated_blocks,
            dead_segment_count: space.dead_segment_count,
            cleaner_state,
            cleaner_pressure,
            space_waits: self.space_waits().status(),
            flush_stages: FlushStagesStatus {
                batches_sealed_at_write: self.write_behind().sealed_at_write(),
                ..self.flush_stages().status()
            },
            durable_batch_sequence: state.writer().durable_through(),
            checkpoint_sequence: state.checkpoint_schedule().next_sequence() - 1,
            failed: state.writer().failed().map(str::to_string),
            device_full: self.device_full().status(),
            device_full_retries: self.device_full().retries_total(),
            memory_cache: self.cache().statistics(),
            cache_warmup: self.cache_warmup().status(),
            flash: tier_space(
                geometry,
                Tier::Flash,
                state.space().free_flash_segment_count(),
                sizes,
            ),
            capacity: geometry.has_capacity_tier().then(|| {
                let free_segment_count = state.space().free_capacity_segment_count();
                tier_space(geometry, Tier::Capacity, free_segment_count, sizes)
            }),
            flash_only_bytes: geometry
                .has_capacity_tier()
                .then(|| flash_live_bytes(&state)),
            promoted_blocks: moves.promoted_blocks,
            demoted_blocks: moves.demoted_blocks,
            capacity_writes: geometry
                .has_capacity_tier()
                .then(|| state.capacity_writes().status()),
            integrity: self.integrity().status(set_aside_segment_count(&state)),
            scrub: self.scrub().status(),
            rebuild: self.rebuild().status(),
            background,
        }
    }

    /// Where a volume's blocks live and where its reads came from. The tier
    /// split walks a copy of the volume's map outside the state lock.
    pub(in crate::pool) fn volume_tier_stats(
        &self,
        name: &str,
    ) -> Result<VolumeTierStats, EngineError> {
        let copied = {
            let state = self.lock();
            let volume_id = state.volumes().id_of(name)?;
            let volume = state.volumes().get(volume_id).expect("id from name");
            CopiedVolume {
                name: volume.name.clone(),
                policy: volume.policy,
                compression: volume.compression,
                map: volume.map.clone(),
                counters: state.tier_counters(volume_id),
            }
        };
        let CopiedVolume {
            name: volume,
            policy,
            compression,
            map,
            counters,
        } = copied;
        let MapPlacement {
            capacity_blocks,
            stored_bytes,
        } = MapPlacement::of(&self.geometry(), &map);
        let flash_blocks = map.mapped_count() - capacity_blocks;
        let logical_bytes = map.mapped_count() * BLOCK_SIZE_BYTES;
        let reads = counters.memory_read_blocks
            + counters.flash_read_blocks
            + counters.capacity_read_blocks;
        Ok(VolumeTierStats {
            volume,
            policy,
            compression,
            flash_bytes: flash_blocks * BLOCK_SIZE_BYTES,
            capacity_bytes: capacity_blocks * BLOCK_SIZE_BYTES,
            logical_bytes,
            stored_bytes,
            compress_ratio: compress_ratio(logical_bytes, stored_bytes),
            memory_hit_ratio: ratio(counters.memory_read_blocks, reads),
            flash_hit_ratio: ratio(counters.flash_read_blocks, reads),
            capacity_read_ratio: ratio(counters.capacity_read_blocks, reads),
            counters,
        })
    }
}
