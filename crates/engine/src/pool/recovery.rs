//! Creating and opening pools. Opening is recovery: validate the superblock,
//! load the newest checkpoint whose slot and body both verify (falling back to
//! the other slot), then replay every batch appended after it, in sequence order.
//! Batches beyond what any surviving summary says was flushed are the unflushed
//! tail: their data blocks are read and checked, and blocks that fail (torn by a
//! power cut) are dropped, so that they can never be returned as data.
//! Nothing is written to the device until the pool has been validated.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use lamina_device::BlockDevice;
use tokio::sync::Notify;

use super::flush_marker::FlushMarker;
use super::integrity::RecoveryFindings;
use super::state::{DurableCheckpoint, SegmentInfo, SegmentState, State};
use super::{Inner, Pool, PoolLimits, PoolOptions, RMW_LOCK_COUNT};
use crate::BLOCK_SIZE_BYTES;
use crate::error::EngineError;
use crate::log::batch::{Summary, block_checksum};
use crate::log::chain;
use crate::log::checkpoint::{Body, Slot};
use crate::log::frame::FrameError;
use crate::log::geometry::{
    CHECKPOINT_SLOT_BLOCKS, CHECKPOINT_SLOT_SIZE_BLOCKS, FLUSH_MARKER_BLOCKS, Geometry,
    SUPERBLOCK_BLOCK, SUPERBLOCK_COPY_BLOCK, Tier,
};
use crate::log::marker::FlushMarkerRecord;
use crate::log::superblock::Superblock;
use crate::log::{FORMAT_VERSION, FORMAT_VERSION_READ_MIN};
use crate::tier::heat::Heat;
use crate::volume::VolumeTable;

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
/// without `--force`.
const EMPTY_CHECK_BYTES: u64 = 1 << 20;

/// Flash segments the cleaner keeps for relocating a victim's live blocks
/// (sized against the checkpoint body, see the cleaner). In a two-tier pool
/// the cleaner demotes most of what it moves, and checkpoints live on
/// capacity, so it keeps only room for one flash victim's hot blocks and a
/// little more: 2% of flash, at least 2 segments.
fn cleaner_reserve_segment_count(geometry: &Geometry) -> usize {
    if geometry.has_capacity_tier() {
        return (geometry.flash_segment_count as usize / 50).max(2);
    }
    super::cleaner::cleaner_reserve_segment_count(geometry)
}

/// Segments kept for checkpoint bodies: on flash in a one-tier pool, on
/// capacity in a two-tier pool (bodies are written and read sequentially, and
/// their size follows both tiers' mappings, which flash should not pay for).
fn checkpoint_reserve_segment_count(geometry: &Geometry) -> usize {
    // Three checkpoint bodies can exist at once (two durable, one being written);
    // a body needs at most about 16 bytes per distinct mapping (entry index,
    // physical block and checksum as varints; shared chunks are stored once and
    // snapshots' chunks as differences) plus the segment table.
    let capacity_blocks = geometry.data_capacity_bytes() / BLOCK_SIZE_BYTES;
    let body_bytes_max = capacity_blocks * 16 + geometry.segment_count * 10 + (64 << 10);
    let per_body = body_bytes_max.div_ceil(geometry.segment_size_bytes());
    (3 * per_body + 1) as usize
}

fn new_inner(
    device: Arc<dyn BlockDevice>,
    geometry: Geometry,
    limits: PoolLimits,
    mut state: State,
    flush_marker: FlushMarker,
) -> Arc<Inner> {
    let cache = Arc::new(crate::tier::memory_cache::MemoryCache::new(
        limits.memory_cache_bytes,
    ));
    state.cache = Some(cache.clone());
    Arc::new(Inner {
        cache,
        device,
        geometry,
        limits,
        state: Mutex::new(state),
        progress: Notify::new(),
        flush_lock: tokio::sync::Mutex::new(()),
        checkpoint_lock: tokio::sync::Mutex::new(()),
        cleaner_lock: tokio::sync::Mutex::new(()),
        reclaim_lock: tokio::sync::Mutex::new(()),
        rmw_locks: (0..RMW_LOCK_COUNT)
            .map(|_| tokio::sync::Mutex::new(()))
            .collect(),
        device_full: Default::default(),
        shutdown: std::sync::atomic::AtomicBool::new(false),
        integrity: Default::default(),
        flush_marker,
    })
}

fn empty_state(geometry: Geometry, limits: &PoolLimits) -> State {
    State {
        geometry,
        volumes: VolumeTable::new(),
        segments: vec![
            SegmentInfo {
                state: SegmentState::Free,
                live_blocks: 0,
                last_batch_sequence: 0,
                needed_by_replay: true,
                set_aside: false,
            };
            geometry.segment_count as usize
        ],
        free_segments: (0..geometry.flash_segment_count as u32).collect(),
        free_capacity_segments: (geometry.flash_segment_count as u32
            ..geometry.segment_count as u32)
            .collect(),
        cleaning_tier: Tier::Flash,
        checkpoint_reserve_segment_count: if geometry.has_capacity_tier() {
            0
        } else {
            checkpoint_reserve_segment_count(&geometry)
        },
        capacity_checkpoint_reserve_segment_count: if geometry.has_capacity_tier() {
            checkpoint_reserve_segment_count(&geometry)
        } else {
            0
        },
        cleaner_reserve_segment_count: cleaner_reserve_segment_count(&geometry),
        heads: [None; super::state::STREAM_COUNT],
        placement: super::cleaner::placement::Placement::new(
            limits.separate_client_writes_by_lifespan
                && !geometry.has_capacity_tier()
                && geometry.segment_count >= limits.relocation_streams_by_age_segment_count_min,
        ),
        open_batches: Default::default(),
        pending_deaths: Vec::new(),
        separate_client_writes: limits.separate_client_writes_by_lifespan
            && !geometry.has_capacity_tier(),
        in_flight: BTreeMap::new(),
        in_flight_sequences: Default::default(),
        next_batch_sequence: 1,
        next_segment_sequence: 1,
        sealed_through: 0,
        durable_through: 0,
        failed: None,
        durable_checkpoints: Vec::new(),
        next_checkpoint_sequence: 1,
        sealed_bytes_total: 0,
        flushed_bytes_total: 0,
        bytes_at_last_checkpoint: 0,
        client_bytes_written: 0,
        checkpoint_bytes_written: 0,
        marker_bytes_written: 0,
        relocated_blocks: 0,
        counters_before_open: Default::default(),
        cache: None,
        heat: geometry.has_capacity_tier().then(|| {
            Heat::new(
                geometry.flash_data_block_count(),
                limits.tier_ghost_entries_max,
            )
        }),
        tier_counters: HashMap::new(),
    }
}

impl Pool {
    /// Creates a pool on `device`. Refuses a device whose first MiB holds any
    /// non-zero byte unless `options.force` is set.
    pub async fn create(
        device: Arc<dyn BlockDevice>,
        options: PoolOptions,
        limits: PoolLimits,
    ) -> Result<Pool, EngineError> {
        let size_bytes = device.size_bytes();
        let geometry = match options.flash_region_bytes {
            None => {
                Geometry::for_device(size_bytes, options.segment_size_bytes).ok_or_else(|| {
                    EngineError::DeviceTooSmall {
                        device: device.name().to_string(),
                        size_bytes,
                        minimum_bytes: Geometry::minimum_device_bytes(options.segment_size_bytes),
                    }
                })?
            }
            Some(flash_bytes) => {
                assert!(
                    flash_bytes.is_multiple_of(BLOCK_SIZE_BYTES) && flash_bytes <= size_bytes,
                    "the flash region must be whole blocks of the device"
                );
                if Geometry::for_device(flash_bytes, options.segment_size_bytes).is_none() {
                    return Err(EngineError::DeviceTooSmall {
                        device: format!("{} (flash tier)", device.name()),
                        size_bytes: flash_bytes,
                        minimum_bytes: Geometry::minimum_device_bytes(options.segment_size_bytes),
                    });
                }
                Geometry::for_tiers(
                    flash_bytes,
                    size_bytes - flash_bytes,
                    options.segment_size_bytes,
                )
                .ok_or_else(|| EngineError::DeviceTooSmall {
                    device: format!("{} (capacity tier)", device.name()),
                    size_bytes: size_bytes - flash_bytes,
                    minimum_bytes: Geometry::minimum_capacity_bytes(options.segment_size_bytes),
                })?
            }
        };
        if geometry.has_capacity_tier() {
            // Flash keeps the records' and the cleaner's reserves and needs
            // room beyond them to work; capacity keeps the checkpoint bodies'
            // reserve (sized by both tiers' mappings, about 1.2% of them) and
            // the reserve for cleaning its own segments.
            let flash_needed = super::state::RECORD_RESERVE_SEGMENT_COUNT
                + cleaner_reserve_segment_count(&geometry)
                + FLASH_WORKING_SEGMENT_COUNT_MIN;
            if (geometry.flash_segment_count as usize) < flash_needed {
                return Err(EngineError::DeviceTooSmall {
                    device: format!("{} (flash tier)", device.name()),
                    size_bytes: geometry.flash_region_bytes(),
                    minimum_bytes: crate::log::geometry::DATA_START_BLOCK * BLOCK_SIZE_BYTES
                        + flash_needed as u64 * geometry.segment_size_bytes(),
                });
            }
            let capacity_needed = checkpoint_reserve_segment_count(&geometry)
                + super::state::CAPACITY_RESERVE_SEGMENT_COUNT
                + CAPACITY_WORKING_SEGMENT_COUNT_MIN;
            if (geometry.capacity_segment_count() as usize) < capacity_needed {
                return Err(EngineError::DeviceTooSmall {
                    device: format!(
                        "{} (capacity tier, which holds the checkpoints of both tiers)",
                        device.name()
                    ),
                    size_bytes: geometry.tier_data_bytes(Tier::Capacity),
                    minimum_bytes: crate::log::geometry::CAPACITY_DATA_START_BLOCKS
                        * BLOCK_SIZE_BYTES
                        + capacity_needed as u64 * geometry.segment_size_bytes(),
                });
            }
        }
        // The start of each tier's device must be empty (it is where a pool's
        // superblock or label would be).
        let mut device_starts = vec![0];
        if geometry.has_capacity_tier() {
            device_starts.push(geometry.capacity_start_block * BLOCK_SIZE_BYTES);
        }
        for start in device_starts.iter().copied().filter(|_| !options.force) {
            let length = EMPTY_CHECK_BYTES.min(size_bytes - start);
            let head = device.read(start, length as usize).await?;
            if let Some(position) = head.iter().position(|byte| *byte != 0) {
                return Err(EngineError::DeviceNotEmpty {
                    device: device.name().to_string(),
                    offset: start + position as u64,
                });
            }
        }
        let superblock = Superblock {
            pool_identifier: rand::random(),
            geometry,
            created_unix_seconds: super::now_unix_seconds(),
        };
        // The superblock and its copy on the flash device; the capacity
        // device's label and its copy at the same places of that device.
        for start in device_starts {
            for block in [SUPERBLOCK_BLOCK, SUPERBLOCK_COPY_BLOCK] {
                device
                    .write(
                        start + block * BLOCK_SIZE_BYTES,
                        super::aligned(&superblock.encode()),
                    )
                    .await?;
            }
        }
        // The flush markers' blocks are written now, so that a pool file on a
        // file system that later runs full never needs space for them.
        device
            .write(
                FLUSH_MARKER_BLOCKS[0] * BLOCK_SIZE_BYTES,
                super::aligned(&vec![
                    0u8;
                    FLUSH_MARKER_BLOCKS.len() * BLOCK_SIZE_BYTES as usize
                ]),
            )
            .await?;
        // Invalidate both slots, so that a forced re-create never finds an old pool's checkpoint.
        for slot_block in CHECKPOINT_SLOT_BLOCKS {
            device
                .write(
                    slot_block * BLOCK_SIZE_BYTES,
                    super::aligned(&[0u8; BLOCK_SIZE_BYTES as usize]),
                )
                .await?;
        }
        device.flush().await?;
        let state = empty_state(geometry, &limits);
        let flush_marker = FlushMarker::new(superblock.pool_identifier, None);
        let pool = Pool::from_inner(new_inner(device, geometry, limits, state, flush_marker));
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

    /// Opens (recovers) the pool on `device`.
    pub async fn open(
        device: Arc<dyn BlockDevice>,
        limits: PoolLimits,
    ) -> Result<Pool, EngineError> {
        let name = device.name().to_string();
        let found = read_superblock(&*device, &name).await?;
        let superblock = found.superblock.clone();
        let geometry = superblock.geometry;
        if let Err(reason) = validate_geometry(&geometry) {
            return Err(EngineError::corrupt(&name, "superblock", 0, reason));
        }
        if device.size_bytes() < geometry.device_size_bytes {
            return Err(EngineError::Truncated {
                device: name,
                expected_bytes: geometry.device_size_bytes,
                actual_bytes: device.size_bytes(),
            });
        }
        let label = if geometry.has_capacity_tier() {
            Some(check_capacity_label(&*device, &superblock, &name).await?)
        } else {
            None
        };
        let started = std::time::Instant::now();
        let marker_bytes = device
            .read(
                FLUSH_MARKER_BLOCKS[0] * BLOCK_SIZE_BYTES,
                FLUSH_MARKER_BLOCKS.len() * BLOCK_SIZE_BYTES as usize,
            )
            .await?;
        let marker = FlushMarkerRecord::newest(
            marker_bytes.chunks(BLOCK_SIZE_BYTES as usize),
            superblock.pool_identifier,
        );

        // Both slots; the newest whose body verifies wins.
        let mut slots: Vec<(usize, Slot)> = Vec::new();
        for (slot_index, slot_block) in CHECKPOINT_SLOT_BLOCKS.iter().enumerate() {
            let bytes = device
                .read(
                    slot_block * BLOCK_SIZE_BYTES,
                    (CHECKPOINT_SLOT_SIZE_BLOCKS * BLOCK_SIZE_BYTES) as usize,
                )
                .await?;
            match Slot::decode(&bytes) {
                Ok(slot) if slot_segments_valid(&slot, &geometry) => slots.push((slot_index, slot)),
                Ok(_) => {
                    tracing::warn!(device = %name, slot_index, "checkpoint slot names segments beyond the device")
                }
                Err(error) => {
                    tracing::warn!(device = %name, slot_index, %error, "checkpoint slot is not valid")
                }
            }
        }
        slots.sort_by_key(|(_, slot)| std::cmp::Reverse(slot.checkpoint_sequence));
        let mut chosen: Option<(usize, Slot, Body, VolumeTable)> = None;
        for (slot_index, slot) in &slots {
            match read_body(&*device, &geometry, slot).await {
                Ok((body, volumes)) => {
                    chosen = Some((*slot_index, slot.clone(), body, volumes));
                    break;
                }
                Err(error) => tracing::error!(
                    device = %name, slot_index, checkpoint = slot.checkpoint_sequence, %error,
                    "checkpoint body is corrupt; falling back to the previous checkpoint"
                ),
            }
        }
        let Some((chosen_slot_index, chosen_slot, body, volumes)) = chosen else {
            return Err(EngineError::corrupt(
                &name,
                "checkpoint",
                CHECKPOINT_SLOT_BLOCKS[0] * BLOCK_SIZE_BYTES,
                "neither checkpoint slot holds a valid checkpoint",
            ));
        };
        // The older checkpoint counts (its segments are kept, and fallback to it
        // stays possible) only if its body verifies too: a slot can be intact
        // while its body segments were reused, or name segments that hold data.
        let mut older_valid = None;
        for (slot_index, slot) in &slots {
            if slot.checkpoint_sequence >= chosen_slot.checkpoint_sequence {
                continue;
            }
            match read_body(&*device, &geometry, slot).await {
                Ok(_) => older_valid = Some((*slot_index, slot.clone())),
                Err(error) => tracing::warn!(
                    device = %name, slot_index, checkpoint = slot.checkpoint_sequence, %error,
                    "the older checkpoint is not usable; it will be replaced"
                ),
            }
            break;
        }
        if older_valid.as_ref().is_some_and(|(_, older)| {
            older
                .body_segments
                .iter()
                .any(|segment| chosen_slot.body_segments.contains(segment))
        }) {
            tracing::warn!(device = %name, "both checkpoints claim the same segments; keeping only the newer");
            older_valid = None;
        }

        let mut state = empty_state(geometry, &limits);
        let covered = body.covered_batch_sequence;
        state.volumes = volumes;
        state.counters_before_open = body.counters;
        let segment_count = state.segments.len();
        state.placement.restore(&body.placement, segment_count);
        if body.segment_last_batch_sequences.len() == state.segments.len() {
            for (segment, last) in state
                .segments
                .iter_mut()
                .zip(&body.segment_last_batch_sequences)
            {
                segment.last_batch_sequence = *last;
            }
        }
        let mut held: HashSet<u32> = chosen_slot.body_segments.iter().copied().collect();
        if let Some((_, older)) = &older_valid {
            held.extend(older.body_segments.iter().copied());
        }

        // Find every batch appended after the checkpoint, and how far
        // completed flushes reached: what the log's summaries say, or the
        // flush marker written after the last flush, whichever is further.
        let scanned = scan_log(&*device, &geometry, &held, &body).await?;
        let log_flushed_through = scanned
            .batches
            .iter()
            .map(|batch| batch.summary.flushed_through_sequence)
            .fold(covered, u64::max);
        let flushed_through = marker
            .map_or(0, |marker| marker.flushed_through_sequence)
            .max(log_flushed_through);
        let replay = replay_batches(
            &*device,
            &geometry,
            &mut state,
            &scanned,
            ReplayBounds {
                covered,
                log_flushed_through,
                flushed_through,
            },
        )
        .await?;
        let findings = report_findings(&name, &scanned, &replay, flushed_through);
        let highest_sequence = replay.highest_sequence;
        let highest_segment_sequence = replay
            .highest_segment_sequence
            .max(body.next_segment_sequence.saturating_sub(1));
        let replayed = replay.replayed;

        // Segment usage from the recovered maps, counting each physical block
        // once however many snapshots and clones share it.
        let mut live_counts = vec![0u32; state.segments.len()];
        let mut counted =
            vec![0u64; (geometry.device_size_bytes / BLOCK_SIZE_BYTES).div_ceil(64) as usize];
        state.volumes.for_each_distinct_physical(&mut |block| {
            let (word, bit) = ((block / 64) as usize, block % 64);
            if counted[word] & (1 << bit) == 0 {
                counted[word] |= 1 << bit;
                live_counts[geometry.segment_of(block) as usize] += 1;
            }
        });
        for segment in &held {
            if live_counts[*segment as usize] > 0 {
                return Err(EngineError::corrupt(
                    &name,
                    "checkpoint",
                    geometry.segment_first_block(*segment) * BLOCK_SIZE_BYTES,
                    format!("segment {segment} holds both a checkpoint body and mapped data"),
                ));
            }
        }
        let fallback_covered = older_valid.as_ref().map_or(covered, |(_, older)| {
            older.covered_batch_sequence.min(covered)
        });
        state.free_segments = VecDeque::new();
        state.free_capacity_segments = VecDeque::new();
        for (index, segment) in state.segments.iter_mut().enumerate() {
            segment.live_blocks = live_counts[index];
            segment.state = if held.contains(&(index as u32)) {
                SegmentState::Checkpoint {
                    checkpoint_sequence: 0,
                }
            } else if segment.live_blocks > 0 {
                SegmentState::Sealed
            } else if segment.last_batch_sequence <= fallback_covered {
                SegmentState::Free
            } else {
                SegmentState::Dead {
                    died_at: highest_sequence,
                }
            };
            if segment.state == SegmentState::Free {
                match geometry.tier_of_segment(index as u32) {
                    Tier::Flash => state.free_segments.push_back(index as u32),
                    Tier::Capacity => state.free_capacity_segments.push_back(index as u32),
                }
            }
        }
        let next_checkpoint_sequence = slots
            .iter()
            .map(|(_, slot)| slot.checkpoint_sequence)
            .max()
            .unwrap_or(0)
            + 1;
        state.next_checkpoint_sequence = next_checkpoint_sequence;
        if let Some((older_index, older)) = &older_valid {
            state.durable_checkpoints.push(DurableCheckpoint {
                slot_index: *older_index,
                checkpoint_sequence: older.checkpoint_sequence,
                covered_batch_sequence: older.covered_batch_sequence,
                body_segments: older.body_segments.clone(),
            });
        }
        state.durable_checkpoints.push(DurableCheckpoint {
            slot_index: chosen_slot_index,
            checkpoint_sequence: chosen_slot.checkpoint_sequence,
            covered_batch_sequence: covered,
            body_segments: chosen_slot.body_segments.clone(),
        });
        state.next_batch_sequence = highest_sequence + 1 + RECOVERY_BATCH_SEQUENCE_GAP;
        state.next_segment_sequence = highest_segment_sequence + 1 + RECOVERY_SEGMENT_SEQUENCE_GAP;
        // The skipped sequences count as sealed and durable, so that the log stays
        // dense from the next checkpoint's point of view.
        state.sealed_through = state.next_batch_sequence - 1;
        // Every check passed: the superblock's copies may be written now.
        found.repair(&*device, &name).await?;
        if let Some(label) = label {
            label.repair(&*device, &superblock, &name).await?;
        }
        // What was replayed may sit in a volatile cache after a process crash:
        // make it durable before anything new is acknowledged on top of it.
        device.flush().await?;
        state.durable_through = state.sealed_through;

        let flush_marker = FlushMarker::new(superblock.pool_identifier, marker);
        let pool = Pool::from_inner(new_inner(device, geometry, limits, state, flush_marker));
        pool.inner.integrity.recovery_found(&findings);
        tracing::info!(
            device = %name,
            checkpoint = chosen_slot.checkpoint_sequence,
            replayed_batches = replayed,
            torn_blocks_dropped = findings.torn_blocks_dropped,
            damaged_flushed_blocks = findings.damaged_flushed_blocks,
            summaries_repaired = findings.summaries_repaired,
            lost_batches = findings.lost_batches,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "pool recovered"
        );
        let both_slots_valid = slots.len() == 2 && older_valid.is_some();
        if replayed > 0 || !both_slots_valid {
            // Two checkpoints, so that both slots cover the replayed batches. The
            // unflushed tail among them may hold torn blocks that this recovery
            // dropped; later batches claim everything before them as flushed, so
            // no future recovery may replay that tail again, even from the older slot.
            // The same two checkpoints repair a slot found corrupt.
            pool.checkpoint().await?;
            pool.checkpoint().await?;
        }
        Ok(pool)
    }
}

/// The superblock as found: from block 0 or, when that fails its checksum,
/// from its copy; and which of the two must be (re)written once the pool has
/// been validated.
struct FoundSuperblock {
    superblock: Superblock,
    primary_damaged: bool,
    copy_stale: bool,
}

impl FoundSuperblock {
    /// Rewrites a damaged superblock from its copy, and writes the copy of a
    /// pool that has none (made before format version 5) or a damaged one.
    async fn repair(&self, device: &dyn BlockDevice, name: &str) -> Result<(), EngineError> {
        let encoded = super::aligned(&self.superblock.encode());
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
        let encoded = super::aligned(&superblock.encode());
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
    let block = BLOCK_SIZE_BYTES as usize;
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
    Err(EngineError::WrongCapacityDevice {
        device: name.to_string(),
        offset: label_offset,
    })
}

/// Reads the superblock, falling back to its copy when block 0 holds a
/// lamina superblock that fails its checksum. A block 0 without the magic is
/// not a pool, whatever block 128 holds: the device may have been reused
/// (a file system written over it), and its copy must not bring it back.
async fn read_superblock(
    device: &dyn BlockDevice,
    name: &str,
) -> Result<FoundSuperblock, EngineError> {
    let block = BLOCK_SIZE_BYTES as usize;
    let primary_bytes = device
        .read(SUPERBLOCK_BLOCK * BLOCK_SIZE_BYTES, block)
        .await?;
    let copy_bytes = device
        .read(SUPERBLOCK_COPY_BLOCK * BLOCK_SIZE_BYTES, block)
        .await?;
    let copy = Superblock::decode(&copy_bytes).ok();
    let primary_error = match Superblock::decode(&primary_bytes) {
        Ok((version, _)) if version < FORMAT_VERSION_READ_MIN => {
            return Err(EngineError::OlderFormat {
                device: name.to_string(),
                found: version,
                supported: FORMAT_VERSION_READ_MIN,
            });
        }
        Ok((_, superblock)) => {
            let copy_stale = copy.is_none_or(|(_, copy)| copy != superblock);
            return Ok(FoundSuperblock {
                superblock,
                primary_damaged: false,
                copy_stale,
            });
        }
        Err(FrameError::WrongMagic) => {
            return Err(EngineError::NotAPool {
                device: name.to_string(),
            });
        }
        Err(FrameError::NewerVersion(found)) => {
            return Err(EngineError::NewerFormat {
                device: name.to_string(),
                found,
                supported: FORMAT_VERSION,
            });
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
}

/// What replay did.
struct ReplayOutcome {
    replayed: usize,
    highest_sequence: u64,
    highest_segment_sequence: u64,
    torn_blocks_dropped: u64,
    damaged_flushed_blocks: u64,
}

/// Replays the scanned batches newer than the checkpoint, in sequence order.
async fn replay_batches(
    device: &dyn BlockDevice,
    geometry: &Geometry,
    state: &mut State,
    scanned: &ScannedLog,
    bounds: ReplayBounds,
) -> Result<ReplayOutcome, EngineError> {
    let mut outcome = ReplayOutcome {
        replayed: 0,
        highest_sequence: bounds.covered,
        highest_segment_sequence: 0,
        torn_blocks_dropped: 0,
        damaged_flushed_blocks: 0,
    };
    for ScannedBatch {
        summary,
        summary_block,
    } in &scanned.batches
    {
        if summary.batch_sequence <= bounds.covered {
            continue;
        }
        // Flushed batches may be missing: a dead segment whose records
        // were all replaced by later durable ones is rewritten without
        // waiting for checkpoints to cover it (`State::dead_segment_reusable`).
        // Beyond what the log vouches for, the data may be torn: check it.
        let data_count = summary.data_block_count();
        let verified: Option<lamina_device::AlignedBuffer> =
            if summary.batch_sequence > bounds.log_flushed_through && data_count > 0 {
                let offset = (summary_block + 1) * BLOCK_SIZE_BYTES;
                Some(
                    device
                        .read(offset, data_count * BLOCK_SIZE_BYTES as usize)
                        .await?,
                )
            } else {
                None
            };
        let flushed = summary.batch_sequence <= bounds.flushed_through;
        let mut data_index = 0u64;
        for record in &summary.records {
            let Some(checksum) = record.data_checksum() else {
                state.volumes.apply(record, None, &mut |_| {});
                continue;
            };
            let physical_block = summary_block + 1 + data_index;
            let intact = verified.as_ref().is_none_or(|data| {
                let start = (data_index * BLOCK_SIZE_BYTES) as usize;
                block_checksum(&data[start..start + BLOCK_SIZE_BYTES as usize]) == checksum
            });
            data_index += 1;
            if !intact && !flushed {
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
                .volumes
                .apply(record, Some(physical_block), &mut |_| {});
        }
        let segment_index = geometry.segment_of(*summary_block) as usize;
        // Written after the checkpoint: its hints there are of an earlier use.
        let now_blocks = state.client_blocks_written();
        state
            .placement
            .forget_segment(segment_index as u32, now_blocks);
        state.segments[segment_index].last_batch_sequence = state.segments[segment_index]
            .last_batch_sequence
            .max(summary.batch_sequence);
        outcome.highest_sequence = outcome.highest_sequence.max(summary.batch_sequence);
        outcome.highest_segment_sequence = outcome
            .highest_segment_sequence
            .max(summary.segment_sequence);
        outcome.replayed += 1;
    }
    Ok(outcome)
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
    };
    if scanned.summaries_repaired > 0 {
        tracing::warn!(
            device,
            summaries = scanned.summaries_repaired,
            "damaged batch summaries were read from their copies"
        );
    }
    for damage in &scanned.damaged {
        let flushed =
            damage.next_batch_sequence > 0 && damage.next_batch_sequence <= flushed_through;
        if flushed {
            findings.lost_batches += 1;
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
    }
    findings
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
        && tiers_valid;
    if valid {
        Ok(())
    } else {
        Err(format!("impossible geometry {geometry:?}"))
    }
}

fn slot_segments_valid(slot: &Slot, geometry: &Geometry) -> bool {
    slot.body_segments
        .iter()
        .all(|segment| u64::from(*segment) < geometry.segment_count)
}

async fn read_body(
    device: &dyn BlockDevice,
    geometry: &Geometry,
    slot: &Slot,
) -> Result<(Body, VolumeTable), String> {
    let segment_bytes = geometry.segment_size_bytes();
    if slot.body_segments.is_empty()
        || slot.body_segments.len() as u64 != slot.body_bytes.div_ceil(segment_bytes)
        || slot
            .body_segments
            .iter()
            .any(|segment| u64::from(*segment) >= geometry.segment_count)
    {
        return Err("slot names an impossible set of segments".to_string());
    }
    let mut bytes = Vec::with_capacity(slot.body_bytes as usize);
    for segment_index in &slot.body_segments {
        let remaining = slot.body_bytes - bytes.len() as u64;
        let piece = remaining.min(segment_bytes);
        let data = device
            .read(
                geometry.segment_first_block(*segment_index) * BLOCK_SIZE_BYTES,
                piece.next_multiple_of(BLOCK_SIZE_BYTES) as usize,
            )
            .await
            .map_err(|error| error.to_string())?;
        bytes.extend_from_slice(&data[..piece as usize]);
    }
    if crc32c::crc32c(&bytes) != slot.body_checksum {
        return Err("body checksum does not match the slot".to_string());
    }
    let body = Body::decode(&bytes).map_err(|error| error.to_string())?;
    if body.checkpoint_sequence != slot.checkpoint_sequence
        || body.covered_batch_sequence != slot.covered_batch_sequence
    {
        return Err("body belongs to another checkpoint".to_string());
    }
    let volumes =
        VolumeTable::from_checkpoint(&body, geometry).map_err(|error| error.to_string())?;
    Ok((body, volumes))
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
            .read(offset, block_count as usize * BLOCK_SIZE_BYTES as usize)
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

/// What the scan found: batches sorted by sequence, damaged ranges, and how
/// many summaries were read from their copies.
struct ScannedLog {
    batches: Vec<ScannedBatch>,
    damaged: Vec<ScannedDamage>,
    summaries_repaired: u64,
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
    geometry: &Geometry,
    held: &HashSet<u32>,
    body: &Body,
) -> Result<ScannedLog, EngineError> {
    // A segment whose first batch is of an incarnation newer than the
    // checkpoint is walked from block 0; otherwise, a head the checkpoint
    // recorded is walked from where the checkpoint left it. (A recorded head may
    // have been freed and reused since, when recovery falls back to an older
    // checkpoint: its new incarnation wins.)
    let segment_size_blocks = geometry.segment_size_blocks as u32;
    let mut starts: Vec<WalkStart> = Vec::new();
    let candidates: Vec<u32> = (0..geometry.segment_count as u32)
        .filter(|index| !held.contains(index))
        .collect();
    for group in candidates.chunks(SCAN_CONCURRENCY_MAX) {
        let probes = group.iter().map(|index| async move {
            let mut source = DeviceSegment {
                device,
                first_block: geometry.segment_first_block(*index),
            };
            chain::first_incarnation(&mut source, segment_size_blocks).await
        });
        for (index, result) in group.iter().zip(futures::future::join_all(probes).await) {
            match result? {
                Some(segment_sequence) if segment_sequence >= body.next_segment_sequence => {
                    starts.push(WalkStart {
                        segment_index: *index,
                        first_block: 0,
                        segment_sequence,
                    });
                }
                _ => {
                    if let Some(head) = body.heads.iter().find(|head| head.segment_index == *index)
                    {
                        starts.push(WalkStart {
                            segment_index: head.segment_index,
                            first_block: head.next_block_in_segment,
                            segment_sequence: head.segment_sequence,
                        });
                    }
                }
            }
        }
    }
    let walks = starts.iter().map(|start| async move {
        let mut source = DeviceSegment {
            device,
            first_block: geometry.segment_first_block(start.segment_index),
        };
        let chain = chain::walk(
            &mut source,
            segment_size_blocks,
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
    };
    for (segment_index, first_block, result) in futures::future::join_all(walks).await {
        let chain = result?;
        for damaged in &chain.damaged {
            let next_batch_sequence = chain
                .batches
                .iter()
                .find(|batch| batch.block_in_segment > damaged.first_block_in_segment)
                .map_or(0, |batch| batch.summary.batch_sequence);
            scanned.damaged.push(ScannedDamage {
                segment_index,
                range: *damaged,
                next_batch_sequence,
            });
        }
        for batch in chain.batches {
            scanned.summaries_repaired += u64::from(batch.from_copy);
            scanned.batches.push(ScannedBatch {
                summary_block: first_block + u64::from(batch.block_in_segment),
                summary: batch.summary,
            });
        }
    }
    scanned
        .batches
        .sort_by_key(|batch| batch.summary.batch_sequence);
    scanned
        .batches
        .dedup_by_key(|batch| batch.summary.batch_sequence);
    Ok(scanned)
}
