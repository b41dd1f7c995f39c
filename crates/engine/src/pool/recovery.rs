//! Creating and opening pools. Opening is recovery: validate the superblock,
//! load the newest checkpoint whose slot and body both verify (falling back to
//! the other slot), then replay every batch appended after it, in sequence order.
//! Those batches are in the heads the checkpoint recorded and in the segments
//! opened since, which the segment openings record lists (format version 8,
//! `pool::segment_openings`); without a record that covers the checkpoint,
//! every segment is scanned.
//! Batches beyond what any surviving summary says was flushed are the unflushed
//! tail: their data blocks are read and checked, and blocks that fail (torn by a
//! power cut) are dropped, so that they can never be returned as data.
//! Nothing is written to the device until the pool has been validated.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use lamina_device::{AlignedBuffer, BlockDevice};
use tokio::sync::Notify;

use super::budget::BackgroundBudget;
use super::checkpoint_increment::CheckpointChain;
use super::counters::{CheckpointSchedule, WriteCounters};
use super::flush_marker::FlushMarker;
use super::inner::{Inner, Pool, RMW_LOCK_COUNT, aligned};
use super::integrity::{RecoveryFindings, RestorePoint};
use super::limits::{PoolLimits, PoolOptions};
use super::segment_openings::{OpeningsList, OpeningsRecorder, write_record};
use super::segment_shapes::{BodyPiece, SegmentShapes};
use super::space::{self, CheckpointBody, DurableCheckpoint, RecoveredSegments};
use super::state::State;
use crate::convert::{segment_index, to_usize};
use crate::error::{CreateError, EngineError, OpenError};
use crate::log::batch::{Summary, block_checksum};
use crate::log::chain;
use crate::log::checkpoint::{AnyBody, Body, Slot, SlotLink};
use crate::log::frame::FrameError;
use crate::log::geometry::{
    CHECKPOINT_SLOT_BLOCKS, CHECKPOINT_SLOT_SIZE_BLOCKS, FLUSH_MARKER_BLOCKS, Geometry,
    SEGMENT_OPENINGS_AREA_BLOCKS, SEGMENT_OPENINGS_AREA_SIZE_BLOCKS, SUPERBLOCK_BLOCK,
    SUPERBLOCK_COPY_BLOCK, Tier,
};
use crate::log::marker::FlushMarkerRecord;
use crate::log::openings::{OPENINGS_MAGIC, Opening, SegmentOpeningsRecord};
use crate::log::superblock::Superblock;
use crate::log::{FORMAT_VERSION, FORMAT_VERSION_READ_MIN};
use crate::volume::VolumeTable;
use crate::volume::map::POOL_SIZE_BYTES_MAX;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// Sequence numbers skipped after a recovery, so that new batches and segments
/// can never share a sequence with a stale, unreachable one left by the crash.
/// Far more than the batches or segments that can be unflushed at once.
const RECOVERY_BATCH_SEQUENCE_GAP: u64 = 1 << 24;
const RECOVERY_SEGMENT_SEQUENCE_GAP: u64 = 1 << 16;

/// Flash segments of a two-tier pool beyond its reserves, at least: room for
/// the log heads, promotions and the demoter's free target.
const FLASH_WORKING_SEGMENT_COUNT_MIN: usize = 8;

/// Capacity segments of a two-tier pool beyond its reserves, at least.
const CAPACITY_WORKING_SEGMENT_COUNT_MIN: usize = 4;

/// Segments whose first blocks are read concurrently while scanning.
const SCAN_CONCURRENCY_MAX: usize = 64;

/// Bytes of the device's start that must be zero before a pool is created on it
/// without `PoolOptions::force`.
const EMPTY_CHECK_BYTES: u64 = 1 << 20;

fn new_inner(
    device: Arc<dyn BlockDevice>,
    limits: PoolLimits,
    state: State,
    flush_marker: FlushMarker,
    openings: OpeningsRecorder,
) -> Arc<Inner> {
    let budget = BackgroundBudget::new(limits.background_impact, limits.background_budget());
    Arc::new(Inner {
        cache: state.cache().clone(),
        shapes: state.shapes().clone(),
        device,
        geometry: *state.geometry(),
        limits,
        state: Mutex::new(state),
        progress: Notify::new(),
        flush_lock: tokio::sync::Mutex::new(()),
        checkpoint_lock: tokio::sync::Mutex::new(CheckpointChain::default()),
        cleaner_lock: tokio::sync::Mutex::new(()),
        reclaim_lock: tokio::sync::Mutex::new(()),
        rmw_locks: (0..RMW_LOCK_COUNT)
            .map(|_| tokio::sync::Mutex::new(()))
            .collect(),
        device_full: Default::default(),
        shutdown: std::sync::atomic::AtomicBool::new(false),
        integrity: Default::default(),
        scrub: Default::default(),
        rebuild: Default::default(),
        cache_warmup: Default::default(),
        budget,
        space_waits: super::space_waits::SpaceWaits::default(),
        flush_marker,
        openings,
    })
}

impl Pool {
    /// Creates a pool on `device`. Refuses a device whose first MiB holds any
    /// non-zero byte unless `options.force` is set.
    pub async fn create(
        device: Arc<dyn BlockDevice>,
        options: PoolOptions,
        limits: PoolLimits,
    ) -> Result<Pool, EngineError> {
        limits.validate()?;
        let geometry = geometry_for_device(&*device, &options)?;
        if geometry.device_size_bytes > POOL_SIZE_BYTES_MAX {
            return Err(EngineError::Create(CreateError::DeviceTooLarge {
                device: device.name().to_string(),
                size_bytes: geometry.device_size_bytes,
                maximum_bytes: POOL_SIZE_BYTES_MAX,
            }));
        }
        if geometry.has_capacity_tier() {
            check_tier_sizes(device.name(), &geometry)?;
        }
        // The start of each tier's device must be empty (it is where a pool's
        // superblock or label would be).
        let device_starts = tier_device_starts(&geometry);
        if !options.force {
            check_device_starts_empty(&*device, &device_starts).await?;
        }
        let superblock = Superblock {
            pool_identifier: rand::random(),
            geometry,
            created_unix_seconds: crate::clock::now_unix_seconds(),
        };
        write_new_pool(&*device, &superblock, &device_starts).await?;
        let state = State::new(
            geometry,
            SegmentShapes::of_device(geometry, device.clone()),
            &limits,
        );
        let flush_marker = FlushMarker::new(superblock.pool_identifier, None);
        // `write_new_pool` wrote record 1, empty: no segment is open yet.
        let openings = OpeningsRecorder::new(superblock.pool_identifier, 2, 0);
        let pool = Pool::from_inner(new_inner(device, limits, state, flush_marker, openings));
        // Both slots hold a checkpoint from the start, so that one can always fall back.
        pool.checkpoint().await?;
        pool.checkpoint().await?;
        tracing::info!(
            device = pool.device_name(),
            segments = geometry.segment_count,
            "pool created"
        );
        Ok(pool)
    }

    /// Opens (recovers) the pool on `device`: checks the superblock, loads
    /// the newest checkpoint that verifies, replays the log after it, rebuilds
    /// the segment table, and makes what it replayed durable.
    pub async fn open(
        device: Arc<dyn BlockDevice>,
        limits: PoolLimits,
    ) -> Result<Pool, EngineError> {
        Self::open_as(device, limits, OpenMode::Normal).await
    }

    /// Opens a pool whose flash device `Pool::restore_flash` has just
    /// rebuilt: as `open`, except that replay applies only the capacity
    /// tier's moves of contents the checkpoint holds, so that every volume
    /// is as of that checkpoint (`Pool::restored_as_of`), and after replay
    /// every entry the maps still place on flash is marked lost (its data
    /// went with the lost device; the new flash holds none of it), so that
    /// reading it is an I/O error and it holds no flash space; two
    /// checkpoints then make the marks durable.
    pub async fn open_restored(
        device: Arc<dyn BlockDevice>,
        limits: PoolLimits,
    ) -> Result<Pool, EngineError> {
        Self::open_as(device, limits, OpenMode::FlashRestored).await
    }

    async fn open_as(
        device: Arc<dyn BlockDevice>,
        limits: PoolLimits,
        mode: OpenMode,
    ) -> Result<Pool, EngineError> {
        limits.validate()?;
        let name = device.name().to_string();
        let started = std::time::Instant::now();
        let checked = check_device(&*device, &name).await?;
        let geometry = checked.superblock.geometry;
        if geometry.device_size_bytes > POOL_SIZE_BYTES_MAX {
            return Err(EngineError::Open(OpenError::DeviceTooLarge {
                device: name.clone(),
                size_bytes: geometry.device_size_bytes,
                maximum_bytes: POOL_SIZE_BYTES_MAX,
            }));
        }
        let marker = read_flush_marker(&*device, &checked.superblock).await?;
        let shapes = SegmentShapes::of_device(geometry, device.clone());
        let mut kept = load_checkpoints(&*device, &shapes, &name).await?;
        let openings_found =
            read_openings_record(&*device, checked.superblock.pool_identifier).await;
        let mut state = State::new(geometry, shapes.clone(), &limits);
        restore_from_checkpoint(&mut state, &mut kept.newest);
        let held = kept.held_segments();
        let covered = kept.newest.slot.covered_batch_sequence;

        // Find every batch appended after the checkpoint, and how far
        // completed flushes reached: what the log's summaries say, or the
        // flush marker written after the last flush, whichever is further.
        let scope = ScanScope::choose(&geometry, &kept.newest.body, &openings_found, &name);
        let scanned = scan_log(&*device, &shapes, &held, &kept.newest.body, &scope).await?;
        let bounds = replay_bounds(&scanned, covered, marker);
        let replay =
            replay_batches(&*device, &geometry, &mut state, &scanned, bounds, mode).await?;
        let mut findings = report_findings(&name, &scanned, &replay, bounds.flushed_through);
        if let OpenMode::FlashRestored = mode {
            mark_restored_losses(&mut state, &scanned, &kept, &replay, &name, &mut findings);
        }
        let lost_block_count = findings.blocks_marked_lost;
        rebuild_segment_table(&mut state, &held, &kept, replay.highest_sequence, &name)?;
        refuse_lost_segments(&state, &name)?;
        let recorded_through_segment_sequence =
            continue_after_replay(&mut state, &kept, &scope, &scanned, &replay);
        // Every check passed: the superblock's copies may be written now.
        checked.repair(&*device, &name).await?;
        if checked.found.older_format() {
            // Areas an older version never wrote: allocated now, so that a
            // record never needs space on a full file system.
            write_empty_openings_areas(&*device).await?;
        }
        // What was replayed may sit in a volatile cache after a process crash:
        // make it durable before anything new is acknowledged on top of it.
        device.flush().await?;

        let pool_identifier = checked.superblock.pool_identifier;
        let flush_marker = FlushMarker::new(pool_identifier, marker);
        let openings = OpeningsRecorder::new(
            pool_identifier,
            openings_found.next_record_sequence,
            recorded_through_segment_sequence,
        );
        let pool = Pool::from_inner(new_inner(device, limits, state, flush_marker, openings));
        pool.inner.integrity.recovery_found(&findings);
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        tracing::info!(
            device = %name,
            checkpoint = kept.newest.slot.checkpoint_sequence,
            segments_scanned = scanned.probed_segment_count,
            segment_count = geometry.segment_count,
            whole_scan = scope.is_whole(),
            replayed_batches = replay.replayed,
            torn_blocks_dropped = findings.torn_blocks_dropped,
            damaged_flushed_blocks = findings.damaged_flushed_blocks,
            summaries_repaired = findings.summaries_repaired,
            lost_batches = findings.lost_batches,
            elapsed_ms,
            "pool recovered"
        );
        let checkpoints_needed = replay.replayed > 0
            || !kept.both_slots_valid
            || checked.found.older_format()
            || lost_block_count > 0;
        if checkpoints_needed {
            // Two checkpoints, so that both slots cover the replayed batches. The
            // unflushed tail among them may hold torn blocks that this recovery
            // dropped; later batches claim everything before them as flushed, so
            // no future recovery may replay that tail again, even from the older slot.
            // The same two checkpoints repair a slot found corrupt, and
            // write an older version's pool in this one (the first is a base).
            pool.checkpoint().await?;
            pool.checkpoint().await?;
        }
        // The newest record is this run's from now on, listing what the
        // checkpoints just written (if any) still need.
        pool.inner.record_now_durably().await?;
        Ok(pool)
    }
}

/// How `Pool::open_as` treats the flash tier.
#[derive(Clone, Copy)]
enum OpenMode {
    Normal,
    /// The flash device is new (`Pool::restore_flash`): replay applies only
    /// moves of contents the checkpoint holds, and what the maps place on
    /// flash is lost.
    FlashRestored,
}

/// After a restore without the flash device, records the point the pool is
/// as of (the checkpoint) and marks lost every map entry whose data is
/// gone, counted in `findings` and logged:
/// - every entry on the flash tier: its data was on the lost device only;
/// - every entry the replay left as the checkpoint had it that points into
///   a capacity segment opened again since the checkpoint. The block died
///   after the checkpoint (overwritten, or moved, by a batch on the lost
///   flash that the replay cannot see) and the segment was reused, so the
///   block holds other data now; left mapped, it would read as a checksum
///   error at best and, sharing its block with the new data, corrupt the
///   segment's usage.
fn mark_restored_losses(
    state: &mut State,
    scanned: &ScannedLog,
    kept: &KeptCheckpoints,
    replay: &ReplayOutcome,
    name: &str,
    findings: &mut RecoveryFindings,
) {
    let point = RestorePoint {
        checkpoint_sequence: kept.newest.slot.checkpoint_sequence,
        covered_batch_sequence: kept.newest.slot.covered_batch_sequence,
    };
    let body = &kept.newest.body;
    let geometry = *state.geometry();
    let reopened: HashSet<u32> = scanned
        .probed
        .iter()
        .filter(|opening| opening.segment_sequence >= body.next_segment_sequence)
        .map(|opening| opening.segment_index)
        .collect();
    let lost = state.volumes_mut().mark_lost(&|physical_block, changed| {
        geometry.tier_of_block(physical_block) == Tier::Flash
            || (!changed && reopened.contains(&geometry.segment_of(physical_block)))
    });
    tracing::warn!(
        device = name,
        checkpoint_sequence = point.checkpoint_sequence,
        covered_batch_sequence = point.covered_batch_sequence,
        lost_block_entries = lost,
        later_versions_skipped = replay.later_versions_skipped,
        "flash device restored: every volume is as of the checkpoint (nothing written after it is restored); map entries whose data was on the lost flash only are marked lost and read as errors"
    );
    findings.restored_as_of = Some(point);
    findings.blocks_marked_lost = lost;
}

/// Sets up what the pool goes on with after replay: the kept checkpoints,
/// the openings its segment openings records go on listing, the checkpoint
/// numbering and the log's next sequences. Returns the highest segment
/// sequence given before this run, which no record of this run is written
/// for (the ones it needs are in the openings list).
fn continue_after_replay(
    state: &mut State,
    kept: &KeptCheckpoints,
    scope: &ScanScope,
    scanned: &ScannedLog,
    replay: &ReplayOutcome,
) -> u64 {
    let highest_segment_sequence = replay
        .highest_segment_sequence
        .max(kept.newest.body.next_segment_sequence.saturating_sub(1));
    state
        .space_mut()
        .restore_durable_checkpoints(kept.durable_checkpoints(scope.older_floor()));
    *state.openings_mut() = scope.openings_to_keep(
        &scanned.probed,
        state.space().openings_floor_segment_sequence(),
    );
    *state.checkpoint_schedule_mut() =
        CheckpointSchedule::starting_at(kept.next_checkpoint_sequence);
    // The skipped sequences count as sealed and durable, so that the log
    // stays dense from the next checkpoint's point of view. Durable once
    // the device flush after this returns.
    state.writer_mut().resume(
        replay.highest_sequence + 1 + RECOVERY_BATCH_SEQUENCE_GAP,
        highest_segment_sequence + 1 + RECOVERY_SEGMENT_SEQUENCE_GAP,
    );
    state.writer().next_segment_sequence() - 1
}

/// The geometry `options` ask for on a device of `device`'s size: one tier
/// on the whole device, or a flash tier on its first
/// `options.flash_region_bytes` and a capacity tier on the rest.
fn geometry_for_device(
    device: &dyn BlockDevice,
    options: &PoolOptions,
) -> Result<Geometry, EngineError> {
    let geometry = tiers_for_device(device, options)?;
    geometry
        .with_rows(options.flash_row_blocks, options.capacity_row_blocks)
        .ok_or(EngineError::Create(CreateError::SegmentNotWholeRows {
            segment_size_blocks: geometry.segment_size_blocks,
            flash_row_blocks: options.flash_row_blocks,
            capacity_row_blocks: options.capacity_row_blocks,
        }))
}

/// [`geometry_for_device`] before row alignment.
fn tiers_for_device(
    device: &dyn BlockDevice,
    options: &PoolOptions,
) -> Result<Geometry, EngineError> {
    let size_bytes = device.size_bytes();
    let segment_size_bytes = options.segment_size_bytes;
    let Some(flash_bytes) = options.flash_region_bytes else {
        return Geometry::for_device(size_bytes, segment_size_bytes).ok_or_else(|| {
            EngineError::Create(CreateError::DeviceTooSmall {
                device: device.name().to_string(),
                size_bytes,
                minimum_bytes: Geometry::minimum_device_bytes(segment_size_bytes),
            })
        });
    };
    assert!(
        flash_bytes.is_multiple_of(BLOCK_SIZE_BYTES) && flash_bytes <= size_bytes,
        "the flash region must be whole blocks of the device"
    );
    if Geometry::for_device(flash_bytes, segment_size_bytes).is_none() {
        return Err(EngineError::Create(CreateError::DeviceTooSmall {
            device: format!("{} (flash tier)", device.name()),
            size_bytes: flash_bytes,
            minimum_bytes: Geometry::minimum_device_bytes(segment_size_bytes),
        }));
    }
    let capacity_bytes = size_bytes - flash_bytes;
    Geometry::for_tiers(flash_bytes, capacity_bytes, segment_size_bytes).ok_or_else(|| {
        EngineError::Create(CreateError::DeviceTooSmall {
            device: format!("{} (capacity tier)", device.name()),
            size_bytes: capacity_bytes,
            minimum_bytes: Geometry::minimum_capacity_bytes(segment_size_bytes),
        })
    })
}

/// Checks that each tier of a two-tier geometry has room beyond its
/// reserves. Flash keeps the records' and the cleaner's reserves and needs
/// room beyond them to work; capacity keeps the checkpoint bodies' reserve
/// (sized by both tiers' mappings, about 1.2% of them) and the reserve for
/// cleaning its own segments.
fn check_tier_sizes(device_name: &str, geometry: &Geometry) -> Result<(), EngineError> {
    assert!(geometry.has_capacity_tier());
    let flash_needed = space::RECORD_RESERVE_SEGMENT_COUNT
        + space::cleaner_reserve_segment_count(geometry)
        + FLASH_WORKING_SEGMENT_COUNT_MIN;
    if to_usize(geometry.flash_segment_count) < flash_needed {
        return Err(EngineError::Create(CreateError::DeviceTooSmall {
            device: format!("{device_name} (flash tier)"),
            size_bytes: geometry.flash_region_bytes(),
            minimum_bytes: crate::log::geometry::DATA_START_BLOCK * BLOCK_SIZE_BYTES
                + flash_needed as u64 * geometry.segment_size_bytes(),
        }));
    }
    let capacity_needed = space::checkpoint_reserve_segment_count(geometry)
        + space::CAPACITY_RESERVE_SEGMENT_COUNT
        + CAPACITY_WORKING_SEGMENT_COUNT_MIN;
    if to_usize(geometry.capacity_segment_count()) < capacity_needed {
        return Err(EngineError::Create(CreateError::DeviceTooSmall {
            device: format!(
                "{device_name} (capacity tier, which holds the checkpoints of both tiers)"
            ),
            size_bytes: geometry.tier_data_bytes(Tier::Capacity),
            minimum_bytes: crate::log::geometry::CAPACITY_DATA_START_BLOCKS * BLOCK_SIZE_BYTES
                + capacity_needed as u64 * geometry.segment_size_bytes(),
        }));
    }
    Ok(())
}

/// Byte offsets where each tier's device starts: the flash device's holds
/// the superblock, the capacity device's its label.
fn tier_device_starts(geometry: &Geometry) -> Vec<u64> {
    let mut device_starts = vec![0];
    if geometry.has_capacity_tier() {
        device_starts.push(geometry.capacity_start_block * BLOCK_SIZE_BYTES);
    }
    device_starts
}

/// Refuses a device whose tiers' first [`EMPTY_CHECK_BYTES`] hold any
/// non-zero byte: it may hold a pool or other data.
pub(super) async fn check_device_starts_empty(
    device: &dyn BlockDevice,
    device_starts: &[u64],
) -> Result<(), EngineError> {
    let size_bytes = device.size_bytes();
    for start in device_starts.iter().copied() {
        let length = EMPTY_CHECK_BYTES.min(size_bytes - start);
        let head = device.read(start, to_usize(length)).await?;
        if let Some(position) = head.iter().position(|byte| *byte != 0) {
            return Err(EngineError::Create(CreateError::DeviceNotEmpty {
                device: device.name().to_string(),
                offset: start + position as u64,
            }));
        }
    }
    Ok(())
}

/// Writes what a new pool starts with, then flushes: the superblock and its
/// copy on the flash device (the capacity device's label and its copy at the
/// same places of that device), zeroed flush markers and zeroed slots.
async fn write_new_pool(
    device: &dyn BlockDevice,
    superblock: &Superblock,
    device_starts: &[u64],
) -> Result<(), EngineError> {
    for start in device_starts {
        write_superblock_and_copy(device, *start, superblock).await?;
    }
    write_zeroed_flush_markers(device).await?;
    // Invalidate both slots, so that a forced re-create never finds an old pool's checkpoint.
    for slot_block in CHECKPOINT_SLOT_BLOCKS {
        device
            .write(slot_block * BLOCK_SIZE_BYTES, aligned(&[0u8; BLOCK_BYTES]))
            .await?;
    }
    write_empty_openings_areas(device).await?;
    // Record 1: nothing opened yet.
    let first_record = SegmentOpeningsRecord {
        pool_identifier: superblock.pool_identifier,
        record_sequence: 1,
        floor_segment_sequence: 0,
        overflowed: false,
        openings: Vec::new(),
    };
    write_record(device, &first_record).await?;
    device.flush().await?;
    Ok(())
}

/// Writes `superblock` at blocks 0 and 128 from `start` (the flash device's
/// superblock and its copy, or the capacity device's label and its copy).
pub(super) async fn write_superblock_and_copy(
    device: &dyn BlockDevice,
    start: u64,
    superblock: &Superblock,
) -> Result<(), EngineError> {
    for block in [SUPERBLOCK_BLOCK, SUPERBLOCK_COPY_BLOCK] {
        device
            .write(
                start + block * BLOCK_SIZE_BYTES,
                aligned(&superblock.encode()),
            )
            .await?;
    }
    Ok(())
}

/// Zeros over both flush markers. Written when a flash device is set up, so
/// that a pool file on a file system that later runs full never needs space
/// for them.
pub(super) async fn write_zeroed_flush_markers(
    device: &dyn BlockDevice,
) -> Result<(), EngineError> {
    let markers_bytes = FLUSH_MARKER_BLOCKS.len() * BLOCK_BYTES;
    device
        .write(
            FLUSH_MARKER_BLOCKS[0] * BLOCK_SIZE_BYTES,
            aligned(&vec![0u8; markers_bytes]),
        )
        .await?;
    Ok(())
}

/// Zeros over both areas of the segment openings record (the blocks are
/// then allocated in a pool file).
pub(super) async fn write_empty_openings_areas(
    device: &dyn BlockDevice,
) -> Result<(), EngineError> {
    let area_bytes = to_usize(SEGMENT_OPENINGS_AREA_SIZE_BLOCKS * BLOCK_SIZE_BYTES);
    for area in SEGMENT_OPENINGS_AREA_BLOCKS {
        device
            .write(area * BLOCK_SIZE_BYTES, aligned(&vec![0u8; area_bytes]))
            .await?;
    }
    Ok(())
}

/// The device's superblock and, in a two-tier pool, its capacity label,
/// checked against the device.
struct CheckedDevice {
    superblock: Superblock,
    found: FoundSuperblock,
    label: Option<FoundLabel>,
}

impl CheckedDevice {
    /// Rewrites whichever superblock or label copy was found damaged or stale.
    async fn repair(&self, device: &dyn BlockDevice, name: &str) -> Result<(), EngineError> {
        self.found.repair(device, name).await?;
        if let Some(label) = &self.label {
            label.repair(device, &self.superblock, name).await?;
        }
        Ok(())
    }
}

/// Reads and validates the superblock (and the capacity label): the
/// geometry must be sound and the device large enough.
async fn check_device(device: &dyn BlockDevice, name: &str) -> Result<CheckedDevice, EngineError> {
    let found = read_superblock(device, name).await?;
    let superblock = found.superblock.clone();
    let geometry = superblock.geometry;
    if let Err(reason) = validate_geometry(&geometry) {
        return Err(EngineError::corrupt(name, "superblock", 0, reason));
    }
    if device.size_bytes() < geometry.device_size_bytes {
        return Err(EngineError::Open(OpenError::Truncated {
            device: name.to_string(),
            expected_bytes: geometry.device_size_bytes,
            actual_bytes: device.size_bytes(),
        }));
    }
    let label = if geometry.has_capacity_tier() {
        Some(check_capacity_label(device, &superblock, name).await?)
    } else {
        None
    };
    Ok(CheckedDevice {
        superblock,
        found,
        label,
    })
}

/// The newest flush marker of this pool, if any.
async fn read_flush_marker(
    device: &dyn BlockDevice,
    superblock: &Superblock,
) -> Result<Option<FlushMarkerRecord>, EngineError> {
    let marker_bytes = device
        .read(
            FLUSH_MARKER_BLOCKS[0] * BLOCK_SIZE_BYTES,
            FLUSH_MARKER_BLOCKS.len() * BLOCK_BYTES,
        )
        .await?;
    Ok(FlushMarkerRecord::newest(
        marker_bytes.chunks(BLOCK_BYTES),
        superblock.pool_identifier,
    ))
}

/// A checkpoint slot that verified, with its index.
#[derive(Clone)]
struct FoundSlot {
    slot_index: usize,
    slot: Slot,
}

/// The checkpoint recovery starts from: its slot, body and volumes.
struct NewestCheckpoint {
    slot_index: usize,
    slot: Slot,
    body: Body,
    volumes: VolumeTable,
}

/// The checkpoints recovery keeps.
struct KeptCheckpoints {
    newest: NewestCheckpoint,
    /// The older checkpoint, if its body verifies too (fallback stays possible).
    older: Option<FoundSlot>,
    /// Whether both slots hold a checkpoint that verifies.
    both_slots_valid: bool,
    next_checkpoint_sequence: u64,
}

impl KeptCheckpoints {
    /// Segments holding a body of a kept checkpoint's chain.
    fn held_segments(&self) -> HashSet<u32> {
        let slots =
            std::iter::once(&self.newest.slot).chain(self.older.iter().map(|older| &older.slot));
        slots
            .flat_map(Slot::chain)
            .flat_map(|link| link.body_segments)
            .collect()
    }

    /// The batch both kept checkpoints cover.
    fn fallback_covered(&self) -> u64 {
        let covered = self.newest.slot.covered_batch_sequence;
        self.older.as_ref().map_or(covered, |older| {
            older.slot.covered_batch_sequence.min(covered)
        })
    }

    /// The kept checkpoints as the space allocator holds them, oldest first.
    /// The older one's `next_segment_sequence` is not known (its body is
    /// not read on its own): `older_floor`, at most that.
    fn durable_checkpoints(&self, older_floor: u64) -> Vec<DurableCheckpoint> {
        let older = self
            .older
            .iter()
            .map(|older| durable_checkpoint(older.slot_index, &older.slot, older_floor));
        let newest = durable_checkpoint(
            self.newest.slot_index,
            &self.newest.slot,
            self.newest.body.next_segment_sequence,
        );
        older.chain(std::iter::once(newest)).collect()
    }
}

/// A slot's checkpoint as the space allocator holds it: its body and its chain's.
fn durable_checkpoint(
    slot_index: usize,
    slot: &Slot,
    next_segment_sequence: u64,
) -> DurableCheckpoint {
    DurableCheckpoint {
        slot_index,
        checkpoint_sequence: slot.checkpoint_sequence,
        covered_batch_sequence: slot.covered_batch_sequence,
        next_segment_sequence,
        body_segments: slot.body_segments.clone(),
        earlier_links: slot
            .earlier_links
            .iter()
            .map(|link| CheckpointBody {
                checkpoint_sequence: link.checkpoint_sequence,
                body_segments: link.body_segments.clone(),
            })
            .collect(),
    }
}

/// Reads both checkpoint slots and keeps those that verify, newest first.
async fn read_slots(
    device: &dyn BlockDevice,
    geometry: &Geometry,
    name: &str,
) -> Result<Vec<FoundSlot>, EngineError> {
    let mut slots = Vec::new();
    for (slot_index, slot_block) in CHECKPOINT_SLOT_BLOCKS.iter().enumerate() {
        let decodes = |bytes: &[u8]| Slot::decode(bytes).is_ok();
        let bytes = read_metadata(
            device,
            slot_block * BLOCK_SIZE_BYTES,
            to_usize(CHECKPOINT_SLOT_SIZE_BLOCKS * BLOCK_SIZE_BYTES),
            &decodes,
        )
        .await?;
        match Slot::decode(&bytes) {
            Ok(slot) if slot_segments_valid(&slot, geometry) => {
                slots.push(FoundSlot { slot_index, slot });
            }
            Ok(_) => {
                tracing::warn!(device = %name, slot_index, "checkpoint slot names segments beyond the device")
            }
            Err(error) => {
                tracing::warn!(device = %name, slot_index, %error, "checkpoint slot is not valid")
            }
        }
    }
    slots.sort_by_key(|found| std::cmp::Reverse(found.slot.checkpoint_sequence));
    Ok(slots)
}

/// The newest checkpoint whose body verifies (falling back to the other
/// slot), and the older one if its body verifies too.
async fn load_checkpoints(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    name: &str,
) -> Result<KeptCheckpoints, EngineError> {
    let slots = read_slots(device, shapes.geometry(), name).await?;
    let mut newest = None;
    let mut failures = Vec::new();
    for found in &slots {
        match read_chain(device, shapes, &found.slot).await {
            Ok((body, volumes)) => {
                newest = Some(NewestCheckpoint {
                    slot_index: found.slot_index,
                    slot: found.slot.clone(),
                    body,
                    volumes,
                });
                break;
            }
            Err(error) => {
                tracing::error!(
                    device = %name, slot_index = found.slot_index,
                    checkpoint = found.slot.checkpoint_sequence, %error,
                    "checkpoint body is corrupt; falling back to the previous checkpoint"
                );
                failures.push(format!(
                    "checkpoint {}: {error}",
                    found.slot.checkpoint_sequence
                ));
            }
        }
    }
    let Some(newest) = newest else {
        // Falling back further than the older slot would need the log since
        // an older checkpoint, which may have been reused: refused rather
        // than recovered to older data.
        return Err(EngineError::corrupt(
            name,
            "checkpoint",
            CHECKPOINT_SLOT_BLOCKS[0] * BLOCK_SIZE_BYTES,
            format!(
                "neither checkpoint slot holds a valid checkpoint ({}); the log before them may have been reused, so no older state can be recovered",
                if failures.is_empty() {
                    "no slot verifies".to_string()
                } else {
                    failures.join("; ")
                }
            ),
        ));
    };
    let older = usable_older_checkpoint(device, shapes, name, &slots, &newest).await;
    let next_checkpoint_sequence = slots
        .iter()
        .map(|found| found.slot.checkpoint_sequence)
        .max()
        .unwrap_or(0)
        + 1;
    Ok(KeptCheckpoints {
        both_slots_valid: slots.len() == 2 && older.is_some(),
        newest,
        older,
        next_checkpoint_sequence,
    })
}

/// The checkpoint older than `newest`, if it counts: its segments are kept
/// and fallback to it stays possible only if its body verifies too (a slot
/// can be intact while its body segments were reused, or name segments that
/// hold data) and it shares no segment with `newest`.
async fn usable_older_checkpoint(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    name: &str,
    slots: &[FoundSlot],
    newest: &NewestCheckpoint,
) -> Option<FoundSlot> {
    let older = slots
        .iter()
        .find(|found| found.slot.checkpoint_sequence < newest.slot.checkpoint_sequence)?;
    let newest_chain = newest.slot.chain();
    // Usually the older slot's chain is a prefix of the newest's, already
    // verified; otherwise it is read and checked whole.
    let verified = older
        .slot
        .chain()
        .iter()
        .all(|link| newest_chain.contains(link));
    let checked = if verified {
        Ok(())
    } else {
        read_chain(device, shapes, &older.slot).await.map(|_| ())
    };
    if let Err(error) = checked {
        tracing::warn!(
            device = %name, slot_index = older.slot_index,
            checkpoint = older.slot.checkpoint_sequence, %error,
            "the older checkpoint is not usable; it will be replaced"
        );
        return None;
    }
    // Links both chains hold share their segments; no other segment may be
    // claimed by both.
    let newest_segments: std::collections::HashMap<u32, u64> = newest_chain
        .iter()
        .flat_map(|link| {
            link.body_segments
                .iter()
                .map(|segment| (*segment, link.checkpoint_sequence))
        })
        .collect();
    let shared = older.slot.chain().iter().any(|link| {
        !newest_chain.contains(link)
            && link
                .body_segments
                .iter()
                .any(|segment| newest_segments.contains_key(segment))
    });
    if shared {
        tracing::warn!(device = %name, "both checkpoints claim the same segments; keeping only the newer");
        return None;
    }
    Some(older.clone())
}

/// Loads what the checkpoint holds into an empty state: volumes, write
/// counters, placement hints and each segment's newest batch.
fn restore_from_checkpoint(state: &mut State, newest: &mut NewestCheckpoint) {
    *state.volumes_mut() = std::mem::replace(&mut newest.volumes, VolumeTable::new());
    let body = &newest.body;
    *state.counters_mut() = WriteCounters::continuing(body.counters);
    let segment_count = state.space().segments().len();
    state
        .placement_mut()
        .restore(&body.placement, segment_count);
    state
        .space_mut()
        .restore_last_batch_sequences(&body.segment_last_batch_sequences);
}

/// How replay treats each batch: covered by the checkpoint, vouched for as
/// flushed by the log or by the flush marker, or the unflushed tail.
fn replay_bounds(
    scanned: &ScannedLog,
    covered: u64,
    marker: Option<FlushMarkerRecord>,
) -> ReplayBounds {
    let log_flushed_through = scanned
        .batches
        .iter()
        .map(|batch| batch.summary.flushed_through_sequence)
        .fold(covered, u64::max);
    let flushed_through = marker
        .map_or(0, |marker| marker.flushed_through_sequence)
        .max(log_flushed_through);
    let flash_flushed_through = marker
        .map_or(0, |marker| marker.flash_flushed_through_sequence)
        .max(flushed_through);
    ReplayBounds {
        covered,
        log_flushed_through,
        flushed_through,
        flash_flushed_through,
    }
}

/// Segment usage from the recovered maps, counting each physical block once
/// however many snapshots and clones share it; then every segment's state.
fn rebuild_segment_table(
    state: &mut State,
    held: &HashSet<u32>,
    kept: &KeptCheckpoints,
    highest_sequence: u64,
    name: &str,
) -> Result<(), EngineError> {
    let geometry = *state.geometry();
    let mut live_counts = vec![0u32; state.space().segments().len()];
    let block_count = geometry.device_size_bytes / BLOCK_SIZE_BYTES;
    let mut counted = vec![0u64; usize::try_from(block_count.div_ceil(64)).expect("fits memory")];
    state.volumes().for_each_distinct_physical(&mut |block| {
        let word = usize::try_from(block / 64).expect("a device block");
        let bit = block % 64;
        if counted[word] & (1 << bit) == 0 {
            counted[word] |= 1 << bit;
            live_counts[geometry.segment_of(block) as usize] += 1;
        }
    });
    if let Some(segment) = held
        .iter()
        .find(|segment| live_counts[**segment as usize] > 0)
    {
        return Err(EngineError::corrupt(
            name,
            "checkpoint",
            geometry.segment_first_block(*segment) * BLOCK_SIZE_BYTES,
            format!("segment {segment} holds both a checkpoint body and mapped data"),
        ));
    }
    state.space_mut().rebuild_after_recovery(RecoveredSegments {
        live_counts: &live_counts,
        held,
        fallback_covered: kept.fallback_covered(),
        highest_sequence,
    });
    Ok(())
}

/// The superblock as found: from block 0 or, when that fails its checksum,
/// from its copy; and which of the two must be (re)written once the pool has
/// been validated.
struct FoundSuperblock {
    superblock: Superblock,
    primary_damaged: bool,
    copy_stale: bool,
    /// The format version it was written with.
    version: u32,
}

impl FoundSuperblock {
    /// Whether an older format version wrote the pool: it is upgraded at open.
    fn older_format(&self) -> bool {
        self.version < FORMAT_VERSION
    }

    /// Rewrites a damaged superblock from its copy, and writes the copy of a
    /// pool that has none (made before format version 5) or a damaged one.
    /// An older version's superblock and copy are rewritten in this version,
    /// so that builds older than this one refuse the pool (`NewerFormat`)
    /// once its checkpoints are in this version.
    async fn repair(&self, device: &dyn BlockDevice, name: &str) -> Result<(), EngineError> {
        let encoded = aligned(&self.superblock.encode());
        if self.older_format() {
            device
                .write(SUPERBLOCK_BLOCK * BLOCK_SIZE_BYTES, encoded.clone())
                .await?;
            device
                .write(SUPERBLOCK_COPY_BLOCK * BLOCK_SIZE_BYTES, encoded)
                .await?;
            tracing::info!(
                device = name,
                from = self.version,
                to = FORMAT_VERSION,
                "pool format upgraded"
            );
            return Ok(());
        }
        if self.primary_damaged {
            device
                .write(SUPERBLOCK_BLOCK * BLOCK_SIZE_BYTES, encoded.clone())
                .await?;
            tracing::warn!(device = name, "superblock rewritten from its copy");
        }
        if self.copy_stale {
            device
                .write(SUPERBLOCK_COPY_BLOCK * BLOCK_SIZE_BYTES, encoded)
                .await?;
        }
        Ok(())
    }
}

/// The capacity device's label (a copy of the superblock at its block 0) as
/// found, and which of it and its copy (its block 128) must be rewritten.
struct FoundLabel {
    start_block: u64,
    label_damaged: bool,
    copy_stale: bool,
}

impl FoundLabel {
    async fn repair(
        &self,
        device: &dyn BlockDevice,
        superblock: &Superblock,
        name: &str,
    ) -> Result<(), EngineError> {
        let encoded = aligned(&superblock.encode());
        let rewrite = [
            (self.label_damaged, SUPERBLOCK_BLOCK),
            (self.copy_stale, SUPERBLOCK_COPY_BLOCK),
        ];
        for (needed, block) in rewrite {
            if needed {
                let offset = (self.start_block + block) * BLOCK_SIZE_BYTES;
                device.write(offset, encoded.clone()).await?;
            }
        }
        if self.label_damaged {
            tracing::warn!(device = name, "capacity label rewritten from its copy");
        }
        Ok(())
    }
}

/// Checks that the capacity device is this pool's: its label, or when the
/// label holds a lamina superblock that fails its checksum, the label's copy,
/// is this pool's superblock.
async fn check_capacity_label(
    device: &dyn BlockDevice,
    superblock: &Superblock,
    name: &str,
) -> Result<FoundLabel, EngineError> {
    let start_block = superblock.geometry.capacity_start_block;
    let block = BLOCK_BYTES;
    let label_offset = start_block * BLOCK_SIZE_BYTES;
    let label = device.read(label_offset, block).await?;
    let copy_offset = (start_block + SUPERBLOCK_COPY_BLOCK) * BLOCK_SIZE_BYTES;
    let copy = device.read(copy_offset, block).await?;
    let is_this_pool =
        |bytes: &[u8]| Superblock::decode(bytes).is_ok_and(|(_, found)| found == *superblock);
    let copy_matches = is_this_pool(&copy);
    if is_this_pool(&label) {
        return Ok(FoundLabel {
            start_block,
            label_damaged: false,
            copy_stale: !copy_matches,
        });
    }
    let damaged = !matches!(
        Superblock::decode(&label),
        Ok(_) | Err(FrameError::WrongMagic)
    );
    if damaged && copy_matches {
        tracing::warn!(
            device = name,
            "the capacity label is damaged; using its copy"
        );
        return Ok(FoundLabel {
            start_block,
            label_damaged: true,
            copy_stale: false,
        });
    }
    Err(EngineError::Open(OpenError::WrongCapacityDevice {
        device: name.to_string(),
        offset: label_offset,
    }))
}

/// Reads metadata at `offset`; when it fails `is_valid` (its frame's
/// checks), the device's redundancy is asked for a copy that passes (another
/// member of an array: the metadata blocks are mirrored on every member),
/// which also rewrites the bad copy. Without one, the bytes as read.
async fn read_metadata(
    device: &dyn BlockDevice,
    offset: u64,
    length: usize,
    is_valid: lamina_device::BlockCheck<'_>,
) -> Result<AlignedBuffer, EngineError> {
    let bytes = device.read(offset, length).await?;
    if is_valid(&bytes) {
        return Ok(bytes);
    }
    match device.recover_range(offset, length, is_valid).await? {
        Some(good) => {
            tracing::warn!(
                offset,
                length,
                "damaged metadata read from another device's copy"
            );
            Ok(good)
        }
        None => Ok(bytes),
    }
}

/// Reads the superblock, falling back to its copy when block 0 holds a
/// lamina superblock that fails its checksum. A block 0 without the magic is
/// not a pool, whatever block 128 holds: the device may have been reused
/// (a file system written over it), and its copy must not bring it back.
async fn read_superblock(
    device: &dyn BlockDevice,
    name: &str,
) -> Result<FoundSuperblock, EngineError> {
    let block = BLOCK_BYTES;
    let decodes = |bytes: &[u8]| Superblock::decode(bytes).is_ok();
    let primary_bytes =
        read_metadata(device, SUPERBLOCK_BLOCK * BLOCK_SIZE_BYTES, block, &decodes).await?;
    let copy_bytes = read_metadata(
        device,
        SUPERBLOCK_COPY_BLOCK * BLOCK_SIZE_BYTES,
        block,
        &decodes,
    )
    .await?;
    let copy = Superblock::decode(&copy_bytes).ok();
    let primary_error = match Superblock::decode(&primary_bytes) {
        Ok((version, _)) if version < FORMAT_VERSION_READ_MIN => {
            return Err(EngineError::Open(OpenError::OlderFormat {
                device: name.to_string(),
                found: version,
                supported: FORMAT_VERSION_READ_MIN,
            }));
        }
        Ok((version, superblock)) => {
            let copy_stale = copy.is_none_or(|(_, copy)| copy != superblock);
            return Ok(FoundSuperblock {
                superblock,
                primary_damaged: false,
                copy_stale,
                version,
            });
        }
        Err(FrameError::WrongMagic) => {
            return Err(EngineError::Open(OpenError::NotAPool {
                device: name.to_string(),
            }));
        }
        Err(FrameError::NewerVersion(found)) => {
            return Err(EngineError::Open(OpenError::NewerFormat {
                device: name.to_string(),
                found,
                supported: FORMAT_VERSION,
            }));
        }
        Err(error) => error,
    };
    match copy {
        Some((version, superblock)) if version >= FORMAT_VERSION_READ_MIN => {
            tracing::warn!(
                device = name,
                error = %primary_error,
                "the superblock is damaged; using its copy"
            );
            Ok(FoundSuperblock {
                superblock,
                primary_damaged: true,
                copy_stale: false,
                version,
            })
        }
        _ => Err(EngineError::corrupt(
            name,
            "superblock",
            0,
            primary_error.to_string(),
        )),
    }
}

/// Sequences that decide how replay treats a batch.
#[derive(Clone, Copy, Debug)]
struct ReplayBounds {
    /// The checkpoint covers every batch up to here: they are not replayed.
    covered: u64,
    /// The furthest flush the log's own summaries vouch for: batches above it
    /// were the unflushed tail as far as the log alone can tell, so their
    /// data is checked.
    log_flushed_through: u64,
    /// The furthest flush the log or the flush marker vouches for: a block up
    /// to here that fails its checksum rotted after it was durable (mapped, so
    /// that reading it is an error); above, it was torn by the crash (dropped).
    flushed_through: u64,
    /// The same for batches on the flash tier, which a client's flush may
    /// have made durable while a capacity batch below them waited for its
    /// upload (decision 0032): the flush marker's flash claim, at least
    /// `flushed_through`.
    flash_flushed_through: u64,
}

impl ReplayBounds {
    /// Whether `batch` was durable before the crash, as far as the log and
    /// the marker tell.
    fn flushed(&self, geometry: &Geometry, batch: &ScannedBatch) -> bool {
        let sequence = batch.summary.batch_sequence;
        if sequence <= self.flushed_through {
            return true;
        }
        let on_flash = geometry.tier_of_block(batch.summary_block) == Tier::Flash;
        on_flash && sequence <= self.flash_flushed_through
    }
}

/// What replay did.
struct ReplayOutcome {
    replayed: usize,
    highest_sequence: u64,
    highest_segment_sequence: u64,
    torn_blocks_dropped: u64,
    damaged_flushed_blocks: u64,
    /// Records a restore without the flash device did not apply: they
    /// changed, or moved, a version written after the checkpoint.
    later_versions_skipped: u64,
}

/// Replays the scanned batches newer than the checkpoint, in sequence order.
/// After a restore without the flash device (`OpenMode::FlashRestored`)
/// only the moves of contents the maps hold are applied (see
/// [`replay_records`]).
async fn replay_batches(
    device: &dyn BlockDevice,
    geometry: &Geometry,
    state: &mut State,
    scanned: &ScannedLog,
    bounds: ReplayBounds,
    mode: OpenMode,
) -> Result<ReplayOutcome, EngineError> {
    let mut outcome = ReplayOutcome {
        replayed: 0,
        highest_sequence: bounds.covered,
        highest_segment_sequence: 0,
        torn_blocks_dropped: 0,
        damaged_flushed_blocks: 0,
        later_versions_skipped: 0,
    };
    let mut previous_sequence: Option<u64> = None;
    for batch in &scanned.batches {
        let sequence = batch.summary.batch_sequence;
        // Sorted and deduplicated by the scan: replay applies records in
        // the order they were written.
        assert!(
            previous_sequence.is_none_or(|previous| sequence > previous),
            "replay out of order: batch {sequence} after {previous_sequence:?}"
        );
        previous_sequence = Some(sequence);
        if sequence <= bounds.covered {
            continue;
        }
        // Flushed batches may be missing: a dead segment whose records
        // were all replaced by later durable ones is rewritten without
        // waiting for checkpoints to cover it (`State::dead_segment_reusable`).
        let replayed = BatchToReplay {
            batch,
            checked_data: read_unflushed_data(device, batch, bounds).await?,
            flushed: bounds.flushed(geometry, batch),
            only_held_contents: matches!(mode, OpenMode::FlashRestored),
        };
        replay_records(state, &replayed, &mut outcome);
        batch_replayed(geometry, state, batch, &mut outcome);
        if sequence > bounds.log_flushed_through {
            let row_blocks = state
                .shapes()
                .shape(geometry.segment_of(batch.summary_block))
                .row_blocks;
            rewrite_unflushed_rows(device, row_blocks, batch, replayed.checked_data.as_ref())
                .await?;
        }
    }
    Ok(outcome)
}

/// On a striped tier (rows of several blocks, `lamina_layout`), the crash
/// may have torn an unflushed batch's rows across the members: some members
/// hold the new blocks, some the old, so that the parity no longer matches
/// the data replay just accepted (the write hole). The batch is written back
/// (summary, data and copy: whole rows from the row boundary it starts at),
/// which gives its rows parity that matches, before anything depends on it:
/// a member lost later is rebuilt from that parity. The data written is
/// `checked_data`, as replay checked and rebuilt it, not a second read: with
/// a member lost, that would rebuild its blocks from the torn parity. On a
/// single device (rows of one block) there is no parity to mend.
async fn rewrite_unflushed_rows(
    device: &dyn BlockDevice,
    row_blocks: u32,
    batch: &ScannedBatch,
    checked_data: Option<&AlignedBuffer>,
) -> Result<(), EngineError> {
    if row_blocks <= 1 {
        return Ok(());
    }
    // The summary, the data blocks and the summary's copy (format version 5 on).
    let block_count = batch.summary.data_block_count() + 2;
    let offset = batch.summary_block * BLOCK_SIZE_BYTES;
    let mut contents = device.read(offset, block_count * BLOCK_BYTES).await?;
    if let Some(data) = checked_data {
        contents[BLOCK_BYTES..BLOCK_BYTES + data.len()].copy_from_slice(data);
    }
    device.write(offset, Arc::new(contents)).await?;
    Ok(())
}

/// A batch being replayed.
struct BatchToReplay<'a> {
    batch: &'a ScannedBatch,
    /// Its data blocks, read back when they may be torn (see
    /// [`read_unflushed_data`]); `None` when they need no check.
    checked_data: Option<AlignedBuffer>,
    /// Whether the log or the flush marker vouches for it: a block that
    /// fails its checksum rotted after it was durable, rather than torn.
    flushed: bool,
    /// Apply only records that move contents the maps hold (a restore
    /// without the flash device, see [`replay_records`]).
    only_held_contents: bool,
}

/// The data blocks of a batch beyond what the log vouches for, which may be
/// torn and so are checked; `None` for a batch the log vouches for, or one
/// without data.
async fn read_unflushed_data(
    device: &dyn BlockDevice,
    batch: &ScannedBatch,
    bounds: ReplayBounds,
) -> Result<Option<AlignedBuffer>, EngineError> {
    let data_count = batch.summary.data_block_count();
    if batch.summary.batch_sequence <= bounds.log_flushed_through {
        return Ok(None);
    }
    if data_count == 0 {
        return Ok(None);
    }
    let offset = (batch.summary_block + 1) * BLOCK_SIZE_BYTES;
    let mut data = device.read(offset, data_count * BLOCK_BYTES).await?;
    rebuild_failing_blocks(device, batch, &mut data).await;
    Ok(Some(data))
}

/// A block beyond what the log vouches for that fails its checksum was torn
/// by the crash, or damaged after a flush the log does not record (one that
/// completed just before the crash): a device with redundancy rebuilds it
/// when it can (and repairs its copy), so that only a block it cannot
/// rebuild is dropped as torn. On a single device nothing changes.
async fn rebuild_failing_blocks(
    device: &dyn BlockDevice,
    batch: &ScannedBatch,
    data: &mut AlignedBuffer,
) {
    let checksums = batch
        .summary
        .records
        .iter()
        .filter_map(crate::log::batch::Record::data_checksum);
    for (index, checksum) in checksums.enumerate() {
        let block = &mut data[index * BLOCK_BYTES..(index + 1) * BLOCK_BYTES];
        if block_checksum(block) == checksum {
            continue;
        }
        let is_valid = move |contents: &[u8]| block_checksum(contents) == checksum;
        let physical_block = batch.summary_block + 1 + index as u64;
        match device
            .recover_block(physical_block * BLOCK_SIZE_BYTES, &is_valid)
            .await
        {
            Ok(Some(good)) => block.copy_from_slice(&good),
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, physical_block, "rebuilding a block of the log's tail failed");
            }
        }
    }
}

/// Applies a batch's records to the volumes: a torn block (failing its
/// checksum, never flushed) is dropped, a damaged flushed block is mapped.
///
/// After a restore without the flash device, the maps are the copied
/// checkpoint's and every batch after it that was on flash is gone, so a
/// capacity batch's record is applied only if it moves contents the maps
/// hold (a demotion or capacity cleaning of a version the checkpoint has):
/// one that moves a version written after the checkpoint would make that
/// block newer than blocks whose later writes were on flash only, and the
/// volume a mix of two points in time (decision 0056). Skipped, the block
/// keeps the checkpoint's version, or is lost when that was on flash.
fn replay_records(state: &mut State, replayed: &BatchToReplay, outcome: &mut ReplayOutcome) {
    let summary_block = replayed.batch.summary_block;
    let mut data_index = 0u64;
    for record in &replayed.batch.summary.records {
        let skipped = replayed.only_held_contents && !state.volumes().moves_held_contents(record);
        let Some(checksum) = record.data_checksum() else {
            if skipped {
                outcome.later_versions_skipped += 1;
            } else {
                state.volumes_mut().apply(record, None, &mut |_| {});
            }
            continue;
        };
        let physical_block = summary_block + 1 + data_index;
        let intact = replayed.checked_data.as_ref().is_none_or(|data| {
            let start = to_usize(data_index * BLOCK_SIZE_BYTES);
            block_checksum(&data[start..start + BLOCK_BYTES]) == checksum
        });
        data_index += 1;
        if skipped {
            outcome.later_versions_skipped += 1;
            continue;
        }
        if !intact && !replayed.flushed {
            outcome.torn_blocks_dropped += 1;
            continue;
        }
        if !intact {
            // Durable, then damaged: mapped with its checksum, so that a
            // read reports the damage rather than the older version.
            outcome.damaged_flushed_blocks += 1;
            tracing::warn!(
                physical_block,
                target = ?record.data_target(),
                "a flushed block fails its checksum; reads of it will fail"
            );
        }
        state
            .volumes_mut()
            .apply(record, Some(physical_block), &mut |_| {});
    }
}

/// Accounts for a replayed batch: its segment's placement hints and
/// last batch, and the highest sequences seen.
fn batch_replayed(
    geometry: &Geometry,
    state: &mut State,
    batch: &ScannedBatch,
    outcome: &mut ReplayOutcome,
) {
    let summary = &batch.summary;
    let segment_index = geometry.segment_of(batch.summary_block);
    // Written after the checkpoint: its hints there are of an earlier use.
    let now_blocks = state.client_blocks_written();
    state
        .placement_mut()
        .forget_segment(segment_index, now_blocks);
    state
        .space_mut()
        .batch_replayed(segment_index, summary.batch_sequence);
    outcome.highest_sequence = outcome.highest_sequence.max(summary.batch_sequence);
    outcome.highest_segment_sequence = outcome
        .highest_segment_sequence
        .max(summary.segment_sequence);
    outcome.replayed += 1;
}

/// Logs what recovery found damaged and sums it up for `pool status`. A batch
/// whose summary and copy were both unreadable is lost if a completed flush
/// covered it (the batch after it in its segment is itself covered); before
/// that point it may have been torn by the crash, which loses nothing flushed.
fn report_findings(
    device: &str,
    scanned: &ScannedLog,
    replay: &ReplayOutcome,
    flushed_through: u64,
) -> RecoveryFindings {
    let mut findings = RecoveryFindings {
        summaries_repaired: scanned.summaries_repaired,
        lost_batches: 0,
        torn_blocks_dropped: replay.torn_blocks_dropped,
        damaged_flushed_blocks: replay.damaged_flushed_blocks,
        blocks_marked_lost: 0,
        restored_as_of: None,
    };
    if scanned.summaries_repaired > 0 {
        tracing::warn!(
            device,
            summaries = scanned.summaries_repaired,
            "damaged batch summaries were read from their copies"
        );
    }
    for damage in &scanned.damaged {
        if report_damage(device, damage, flushed_through) {
            findings.lost_batches += 1;
        }
    }
    findings
}

/// Logs one batch whose summary and copy were both unreadable. Returns
/// whether it was flushed, and so is lost.
fn report_damage(device: &str, damage: &ScannedDamage, flushed_through: u64) -> bool {
    let flushed = damage.next_batch_sequence > 0 && damage.next_batch_sequence <= flushed_through;
    if flushed {
        tracing::error!(
            device,
            segment_index = damage.segment_index,
            first_block_in_segment = damage.range.first_block_in_segment,
            block_count = damage.range.block_count,
            "a flushed batch is lost: both copies of its summary are damaged, so the \
             blocks it wrote may read as an older version"
        );
    } else {
        tracing::warn!(
            device,
            segment_index = damage.segment_index,
            first_block_in_segment = damage.range.first_block_in_segment,
            block_count = damage.range.block_count,
            "an unreadable batch in the unflushed tail was skipped (torn by the crash)"
        );
    }
    flushed
}

/// Checks what checksums cannot: that a superblock written by a buggy or hostile
/// program describes a geometry the engine can work with.
fn validate_geometry(geometry: &Geometry) -> Result<(), String> {
    let flash_end_block = geometry
        .flash_segment_count
        .checked_mul(geometry.segment_size_blocks)
        .and_then(|blocks| blocks.checked_add(crate::log::geometry::DATA_START_BLOCK));
    let capacity_end_block = geometry
        .capacity_segment_count()
        .checked_mul(geometry.segment_size_blocks)
        .and_then(|blocks| blocks.checked_add(geometry.capacity_start_block))
        .and_then(|blocks| blocks.checked_add(crate::log::geometry::CAPACITY_DATA_START_BLOCKS));
    let tiers_valid = if geometry.has_capacity_tier() {
        geometry.capacity_segment_count() >= crate::log::geometry::CAPACITY_SEGMENT_COUNT_MIN
            && flash_end_block.is_some_and(|end| end <= geometry.capacity_start_block)
            && capacity_end_block
                .and_then(|blocks| blocks.checked_mul(BLOCK_SIZE_BYTES))
                .is_some_and(|end| end <= geometry.device_size_bytes)
    } else {
        geometry.capacity_start_block == 0
            && flash_end_block
                .and_then(|blocks| blocks.checked_mul(BLOCK_SIZE_BYTES))
                .is_some_and(|end| end <= geometry.device_size_bytes)
    };
    let valid = geometry.segment_size_blocks >= 16
        && geometry.segment_size_blocks <= (1 << 20)
        && geometry.flash_segment_count >= 8
        && geometry.flash_segment_count <= geometry.segment_count
        && geometry.segment_count <= u64::from(u32::MAX)
        && geometry.with_rows(geometry.flash_row_blocks, geometry.capacity_row_blocks)
            == Some(*geometry)
        && tiers_valid;
    if valid {
        Ok(())
    } else {
        Err(format!("impossible geometry {geometry:?}"))
    }
}

fn slot_segments_valid(slot: &Slot, geometry: &Geometry) -> bool {
    slot.chain().iter().all(|link| {
        link.body_segments
            .iter()
            .all(|segment| u64::from(*segment) < geometry.segment_count)
    })
}

/// Reads every body of the slot's chain, checks each against its link and
/// the link before it, applies the increments to the base's image and
/// rebuilds the volumes from the result.
async fn read_chain(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    slot: &Slot,
) -> Result<(Body, VolumeTable), String> {
    let mut image: Option<Body> = None;
    for link in slot.chain() {
        let failed = |error: String| {
            format!(
                "checkpoint {} of the chain: {error}",
                link.checkpoint_sequence
            )
        };
        let bytes = read_link(device, shapes, &link).await.map_err(failed)?;
        let body = AnyBody::decode(&bytes).map_err(|error| failed(error.to_string()))?;
        if body.checkpoint_sequence() != link.checkpoint_sequence
            || body.covered_batch_sequence() != link.covered_batch_sequence
        {
            return Err(failed("body belongs to another checkpoint".to_string()));
        }
        match (&mut image, body) {
            (None, AnyBody::Base(base)) => image = Some(base),
            (Some(image), AnyBody::Increment(increment)) => {
                image.apply(increment).map_err(failed)?
            }
            (None, AnyBody::Increment(_)) => {
                return Err(failed("the chain starts with an increment".to_string()));
            }
            (Some(_), AnyBody::Base(_)) => {
                return Err(failed("a base in the middle of a chain".to_string()));
            }
        }
    }
    let body = image.expect("a chain has at least its own link");
    let volumes = VolumeTable::from_checkpoint(&body, shapes.geometry())
        .map_err(|error| error.to_string())?;
    Ok((body, volumes))
}

/// One body of a chain, read and checked against its link's checksum.
async fn read_link(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    link: &SlotLink,
) -> Result<Vec<u8>, String> {
    let geometry = shapes.geometry();
    let pieces = shapes
        .body_pieces(&link.body_segments, link.body_bytes)
        .ok_or_else(|| "link names an impossible set of segments".to_string())?;
    // The slot is read from the device: a length past the address space is
    // corrupt, not a reason to panic.
    let body_bytes = usize::try_from(link.body_bytes)
        .map_err(|_| format!("body of {} bytes does not fit in memory", link.body_bytes))?;
    let mut bytes = Vec::with_capacity(body_bytes);
    for piece in &pieces {
        let data = device
            .read(
                geometry.segment_first_block(piece.segment_index) * BLOCK_SIZE_BYTES,
                to_usize(piece.length_bytes.next_multiple_of(BLOCK_SIZE_BYTES)),
            )
            .await
            .map_err(|error| error.to_string())?;
        bytes.extend_from_slice(&data[..to_usize(piece.length_bytes)]);
    }
    if crc32c::crc32c(&bytes) != link.body_checksum
        && !repair_body(device, geometry, &pieces, &mut bytes, link.body_checksum).await
    {
        return Err("body checksum does not match the link".to_string());
    }
    Ok(bytes)
}

/// Where one block of a body lies: its range in the body and its device offset.
struct BodyBlock {
    body_start: usize,
    body_end: usize,
    device_offset: u64,
}

/// A body that fails its checksum, on a device with redundancy (an array):
/// each block in turn is rebuilt from the redundancy, and the first
/// candidate that makes the whole body match its checksum replaces it (the
/// device rewrites the damaged copy). A base is needed by both slots' chains,
/// so unlike a body of the old format it has no other slot to fall back on
/// when a member flips a bit in it. Without redundancy, or with more than
/// one damaged block, it fails.
async fn repair_body(
    device: &dyn BlockDevice,
    geometry: &Geometry,
    pieces: &[BodyPiece],
    bytes: &mut [u8],
    expected_checksum: u32,
) -> bool {
    let block_bytes = BLOCK_BYTES;
    let blocks: Vec<BodyBlock> = pieces
        .iter()
        .flat_map(|piece| {
            let start = to_usize(piece.body_offset);
            let end = start + to_usize(piece.length_bytes);
            let first = geometry.segment_first_block(piece.segment_index) * BLOCK_SIZE_BYTES;
            (start..end)
                .step_by(block_bytes)
                .map(move |body_start| BodyBlock {
                    body_start,
                    body_end: (body_start + block_bytes).min(end),
                    device_offset: first + (body_start - start) as u64,
                })
        })
        .collect();
    // The checksum of everything after each block, so that a candidate is
    // checked in O(block) rather than O(body).
    let mut suffixes = vec![0u32; blocks.len()];
    let mut suffix = 0u32;
    for (index, block) in blocks.iter().enumerate().rev() {
        suffixes[index] = suffix;
        let length = bytes.len() - block.body_end;
        suffix = crc32c::crc32c_combine(
            crc32c::crc32c(&bytes[block.body_start..block.body_end]),
            suffix,
            length,
        );
    }
    let mut prefix = 0u32;
    for (index, block) in blocks.iter().enumerate() {
        let length = block.body_end - block.body_start;
        let suffix = suffixes[index];
        let suffix_length = bytes.len() - block.body_end;
        let check = move |candidate: &[u8]| {
            let with_block = crc32c::crc32c_append(prefix, &candidate[..length]);
            crc32c::crc32c_combine(with_block, suffix, suffix_length) == expected_checksum
        };
        if let Ok(Some(candidate)) = device.recover_block(block.device_offset, &check).await {
            bytes[block.body_start..block.body_end].copy_from_slice(&candidate[..length]);
            tracing::warn!(
                device = device.name(),
                offset = block.device_offset,
                "checkpoint body block rebuilt from the device's redundancy"
            );
            return true;
        }
        prefix = crc32c::crc32c_append(prefix, &bytes[block.body_start..block.body_end]);
    }
    false
}

/// Refuses to open when segments holding data (live blocks or a kept
/// checkpoint's body) cannot be read: their devices are lost beyond their
/// redundancy. Their blocks would be read errors; the devices may still
/// come back, so nothing is changed.
fn refuse_lost_segments(state: &State, name: &str) -> Result<(), EngineError> {
    let mut lost = (0_usize, 0_u64);
    for (index, segment) in state.space().segments().iter().enumerate() {
        let index = segment_index(index as u64);
        let holds_data = segment.live_blocks > 0
            || matches!(segment.state, space::SegmentState::Checkpoint { .. });
        if holds_data && !state.shapes().layout(index).readable {
            lost.0 += 1;
            lost.1 += u64::from(segment.live_blocks) * BLOCK_SIZE_BYTES;
        }
    }
    if lost.0 == 0 {
        return Ok(());
    }
    Err(EngineError::Open(OpenError::SegmentsLost {
        device: name.to_string(),
        segment_count: lost.0,
        live_bytes: lost.1,
    }))
}

/// A segment on the device, as a chain walk reads it.
struct DeviceSegment<'a> {
    device: &'a dyn BlockDevice,
    first_block: u64,
}

impl chain::SegmentBlocks for DeviceSegment<'_> {
    type Error = lamina_device::DeviceError;

    async fn read_blocks(
        &mut self,
        first_block_in_segment: u32,
        block_count: u32,
    ) -> Result<Vec<u8>, Self::Error> {
        let offset = (self.first_block + u64::from(first_block_in_segment)) * BLOCK_SIZE_BYTES;
        let bytes = self
            .device
            .read(offset, block_count as usize * BLOCK_BYTES)
            .await?;
        Ok(bytes.to_vec())
    }
}

/// A batch found by the scan, with the device block of its summary.
struct ScannedBatch {
    summary: Summary,
    summary_block: u64,
}

/// Blocks of a segment written after the checkpoint whose batch lost both
/// copies of its summary, with the sequence of the batch that follows them in
/// the segment (the lost batch's is lower).
struct ScannedDamage {
    segment_index: u32,
    range: chain::DamagedRange,
    next_batch_sequence: u64,
}

/// What the scan found: batches sorted by sequence, damaged ranges, how
/// many summaries were read from their copies, and the incarnation each
/// probed segment starts with.
struct ScannedLog {
    batches: Vec<ScannedBatch>,
    damaged: Vec<ScannedDamage>,
    summaries_repaired: u64,
    probed: Vec<Opening>,
    probed_segment_count: usize,
}

/// The segment openings record found at open, whether an area was found
/// damaged, and the number the next record takes.
struct OpeningsFound {
    newest: Option<SegmentOpeningsRecord>,
    damaged: bool,
    next_record_sequence: u64,
}

/// The newest segment openings record of this pool (format version 8), if
/// an area holds one that verifies (a damaged area is read from another
/// copy on a device with redundancy). An area that holds neither a record
/// of this pool nor zeros (never written) is damaged: torn by the crash, or
/// rotted, and then it may have been the newest record, so the other one
/// cannot be trusted to list every segment.
async fn read_openings_record(device: &dyn BlockDevice, pool_identifier: u128) -> OpeningsFound {
    let mut records = Vec::new();
    let mut damaged = false;
    for area in SEGMENT_OPENINGS_AREA_BLOCKS {
        match read_openings_area(device, area).await {
            Ok(bytes) => match SegmentOpeningsRecord::decode(&bytes) {
                Ok(record) if record.pool_identifier == pool_identifier => records.push(record),
                _ => damaged |= bytes[..BLOCK_BYTES].iter().any(|byte| *byte != 0),
            },
            Err(error) => {
                tracing::warn!(area, %error, "reading the segment openings record failed");
                damaged = true;
            }
        }
    }
    let newest = records
        .into_iter()
        .max_by_key(|record| record.record_sequence);
    let next_record_sequence = newest
        .as_ref()
        .map_or(1, |record| record.record_sequence + 1);
    OpeningsFound {
        newest,
        damaged,
        next_record_sequence,
    }
}

/// One area of the segment openings record: its first block, and the rest
/// of the frame when its header says it is longer.
async fn read_openings_area(
    device: &dyn BlockDevice,
    area_block: u64,
) -> Result<AlignedBuffer, EngineError> {
    let offset = area_block * BLOCK_SIZE_BYTES;
    let area_bytes = to_usize(SEGMENT_OPENINGS_AREA_SIZE_BLOCKS * BLOCK_SIZE_BYTES);
    let first = device.read(offset, BLOCK_BYTES).await?;
    let decodes = |bytes: &[u8]| SegmentOpeningsRecord::decode(bytes).is_ok();
    let length = match crate::log::frame::peek_header(OPENINGS_MAGIC, &first) {
        Ok((_, payload_bytes)) => (crate::log::frame::FRAME_HEADER_BYTES + payload_bytes)
            .next_multiple_of(BLOCK_BYTES)
            .min(area_bytes),
        Err(_) => BLOCK_BYTES,
    };
    if length == BLOCK_BYTES && decodes(&first) {
        return Ok(first);
    }
    read_metadata(device, offset, length, &decodes).await
}

/// Which segments the scan probes (block 0 of each, then a walk of those
/// holding batches newer than the checkpoint).
enum ScanScope {
    /// The heads the checkpoint recorded and the segments the openings
    /// record lists: it lists every segment opened since the checkpoint.
    Listed { record: SegmentOpeningsRecord },
    /// Every segment not holding a kept body: no record that covers the
    /// checkpoint (a version 7 pool, both areas damaged, an overflowed list).
    Whole,
}

impl ScanScope {
    fn choose(geometry: &Geometry, body: &Body, found: &OpeningsFound, name: &str) -> Self {
        if found.damaged {
            tracing::warn!(
                device = %name,
                "an area of the segment openings record is damaged (torn by the crash, or rotted): every segment is scanned"
            );
            return Self::Whole;
        }
        let Some(record) = &found.newest else {
            tracing::info!(device = %name, "no segment openings record: every segment is scanned");
            return Self::Whole;
        };
        let within_pool = record
            .openings
            .iter()
            .all(|opening| u64::from(opening.segment_index) < geometry.segment_count);
        if within_pool && record.covers(body.next_segment_sequence) {
            return Self::Listed {
                record: record.clone(),
            };
        }
        tracing::warn!(
            device = %name,
            overflowed = record.overflowed,
            floor = record.floor_segment_sequence,
            checkpoint_next_segment_sequence = body.next_segment_sequence,
            within_pool,
            "the segment openings record does not cover the checkpoint: every segment is scanned"
        );
        Self::Whole
    }

    fn is_whole(&self) -> bool {
        matches!(self, Self::Whole)
    }

    /// The segments to probe, in index order.
    fn candidates(&self, geometry: &Geometry, held: &HashSet<u32>, body: &Body) -> Vec<u32> {
        let mut candidates: Vec<u32> = match self {
            Self::Whole => (0..segment_index(geometry.segment_count)).collect(),
            Self::Listed { record } => body
                .heads
                .iter()
                .map(|head| head.segment_index)
                .chain(record.openings.iter().map(|opening| opening.segment_index))
                .filter(|index| u64::from(*index) < geometry.segment_count)
                .collect(),
        };
        candidates.sort_unstable();
        candidates.dedup();
        candidates.retain(|index| !held.contains(index));
        candidates
    }

    /// At most the older kept checkpoint's `next_segment_sequence`: the
    /// record's floor (it was built while that checkpoint was durable),
    /// else 0.
    fn older_floor(&self) -> u64 {
        match self {
            Self::Listed { record } => record.floor_segment_sequence,
            Self::Whole => 0,
        }
    }

    /// The openings this run's records go on listing: those the record
    /// listed and the incarnations the probes met, from `floor` on.
    fn openings_to_keep(&self, probed: &[Opening], floor: u64) -> OpeningsList {
        let listed = match self {
            Self::Listed { record } => &record.openings[..],
            Self::Whole => &[],
        };
        let openings = probed
            .iter()
            .chain(listed)
            .filter(|opening| opening.segment_sequence >= floor)
            .copied()
            .collect();
        OpeningsList::starting_with(openings)
    }
}

/// Where the scan walks a segment from.
struct WalkStart {
    segment_index: u32,
    first_block: u32,
    segment_sequence: u64,
}

/// Every valid batch that may be newer than the checkpoint.
async fn scan_log(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    held: &HashSet<u32>,
    body: &Body,
    scope: &ScanScope,
) -> Result<ScannedLog, EngineError> {
    let candidates = scope.candidates(shapes.geometry(), held, body);
    let probes = walk_starts(device, shapes, &candidates, body).await?;
    let mut scanned = walk_segments(device, shapes, &probes.starts).await?;
    scanned.probed = probes.probed;
    scanned.probed_segment_count = candidates.len();
    scanned
        .batches
        .sort_by_key(|batch| batch.summary.batch_sequence);
    scanned
        .batches
        .dedup_by_key(|batch| batch.summary.batch_sequence);
    Ok(scanned)
}

/// What probing the candidates found: where to walk, and each probed
/// segment's first incarnation.
struct Probes {
    starts: Vec<WalkStart>,
    probed: Vec<Opening>,
}

/// Where to walk each candidate segment from, probing the first blocks of
/// [`SCAN_CONCURRENCY_MAX`] segments at a time.
async fn walk_starts(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    candidates: &[u32],
    body: &Body,
) -> Result<Probes, EngineError> {
    let geometry = shapes.geometry();
    let mut starts: Vec<WalkStart> = Vec::new();
    let mut probed = Vec::new();
    for group in candidates.chunks(SCAN_CONCURRENCY_MAX) {
        let probes = group.iter().map(|index| async move {
            let mut source = DeviceSegment {
                device,
                first_block: geometry.segment_first_block(*index),
            };
            chain::first_incarnation(&mut source, shapes.shape(*index)).await
        });
        for (index, result) in group.iter().zip(futures::future::join_all(probes).await) {
            let first_incarnation = result?;
            if let Some(segment_sequence) = first_incarnation {
                probed.push(Opening {
                    segment_index: *index,
                    segment_sequence,
                });
            }
            starts.extend(walk_start(*index, first_incarnation, body));
        }
    }
    Ok(Probes { starts, probed })
}

/// Where to walk segment `segment_index` from, given the segment sequence of
/// its first batch (if it has one). A segment whose first batch is of an
/// incarnation newer than the checkpoint is walked from block 0; otherwise, a
/// head the checkpoint recorded is walked from where the checkpoint left it.
/// (A recorded head may have been freed and reused since, when recovery falls
/// back to an older checkpoint: its new incarnation wins.) Other segments
/// hold nothing newer than the checkpoint.
fn walk_start(
    segment_index: u32,
    first_incarnation: Option<u64>,
    body: &Body,
) -> Option<WalkStart> {
    match first_incarnation {
        Some(segment_sequence) if segment_sequence >= body.next_segment_sequence => {
            Some(WalkStart {
                segment_index,
                first_block: 0,
                segment_sequence,
            })
        }
        _ => body
            .heads
            .iter()
            .find(|head| head.segment_index == segment_index)
            .map(|head| WalkStart {
                segment_index: head.segment_index,
                first_block: head.next_block_in_segment,
                segment_sequence: head.segment_sequence,
            }),
    }
}

/// Walks every segment from its start, all at once, and gathers what the
/// walks found (batches in no particular order).
async fn walk_segments(
    device: &dyn BlockDevice,
    shapes: &SegmentShapes,
    starts: &[WalkStart],
) -> Result<ScannedLog, EngineError> {
    let geometry = shapes.geometry();
    let walks = starts.iter().map(|start| async move {
        let mut source = DeviceSegment {
            device,
            first_block: geometry.segment_first_block(start.segment_index),
        };
        let chain = chain::walk(
            &mut source,
            shapes.shape(start.segment_index),
            start.first_block,
            Some(start.segment_sequence),
        )
        .await;
        (start.segment_index, source.first_block, chain)
    });
    let mut scanned = ScannedLog {
        batches: Vec::new(),
        damaged: Vec::new(),
        summaries_repaired: 0,
        probed: Vec::new(),
        probed_segment_count: 0,
    };
    for (segment_index, first_block, result) in futures::future::join_all(walks).await {
        scanned.add_walk(segment_index, first_block, result?);
    }
    Ok(scanned)
}

impl ScannedLog {
    /// Adds what a walk of segment `segment_index` (starting at device block
    /// `first_block`) found.
    fn add_walk(&mut self, segment_index: u32, first_block: u64, chain: chain::Chain) {
        for damaged in &chain.damaged {
            let next_batch_sequence = chain
                .batches
                .iter()
                .find(|batch| batch.block_in_segment > damaged.first_block_in_segment)
                .map_or(0, |batch| batch.summary.batch_sequence);
            self.damaged.push(ScannedDamage {
                segment_index,
                range: *damaged,
                next_batch_sequence,
            });
        }
        for batch in chain.batches {
            self.summaries_repaired += u64::from(batch.from_copy);
            self.batches.push(ScannedBatch {
                summary_block: first_block + u64::from(batch.block_in_segment),
                summary: batch.summary,
            });
        }
    }
}
