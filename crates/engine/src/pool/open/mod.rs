//! Creating and opening pools. Opening is recovery: validate the superblock,
//! load the newest checkpoint whose slot and body both verify (falling back to
//! the other slot), then replay every batch appended after it, in sequence order.
//! Those batches are in the heads the checkpoint recorded and in the segments
//! opened since, which the segment openings record lists (format version 8,
//! `pool::openings`); without a record that covers the checkpoint,
//! every segment is scanned.
//! Batches beyond what any surviving summary says was flushed are the unflushed
//! tail: their data blocks are read and checked, and blocks that fail (torn by a
//! power cut) are dropped, so that they can never be returned as data.
//! Nothing is written to the device until the pool has been validated.

mod checkpoints;
pub(super) mod create;
pub(super) mod flash_restore;
mod new_forms;
mod replay;
mod resume;
mod scan;
mod superblock;

use std::sync::Arc;

use lamina_device::BlockDevice;

use crate::error::{CreateError, EngineError, OpenError};
use crate::log::marker::FlushMarkerRecord;
use crate::log::superblock::Superblock;
use crate::pool::background;
use crate::pool::checkpoint::Checkpointer;
use crate::pool::core::integrity::RecoveryFindings;
use crate::pool::core::limits::{PoolLimits, PoolOptions};
use crate::pool::core::state::State;
use crate::pool::core::{Core, CoreParts, Pool};
use crate::pool::io::flush_marker::FlushMarker;
use crate::pool::openings::OpeningsRecorder;
use crate::pool::space::segment_shapes::SegmentShapes;
use crate::volume::map::POOL_SIZE_BYTES_MAX;
use checkpoints::{load_checkpoints, restore_from_checkpoint};
use create::{
    check_device_starts_empty, check_tier_sizes, geometry_for_device, tier_device_starts,
    write_empty_openings_areas, write_new_pool,
};
use replay::{OpenMode, replay_batches, replay_bounds, report_findings};
use resume::{
    continue_after_replay, mark_restored_losses, rebuild_segment_table, refuse_lost_segments,
};
use scan::{ScanScope, read_openings_record, scan_log};
use superblock::{CheckedDevice, check_device, read_flush_marker};

/// Creates a pool on `device` (`Pool::create`). Refuses a device whose first MiB holds any
/// non-zero byte unless `options.force` is set.
pub(in crate::pool) async fn create(
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
    let core = Core::new(CoreParts {
        device,
        limits,
        state,
        flush_marker,
        openings,
    });
    background::start(&core);
    // Both slots hold a checkpoint from the start, so that one can always fall back.
    let checkpointer = Checkpointer::new(&core);
    checkpointer.checkpoint().await?;
    checkpointer.checkpoint().await?;
    tracing::info!(
        device = core.device().name(),
        segments = geometry.segment_count,
        "pool created"
    );
    Ok(Pool::from_core(core))
}

/// Opens (recovers) the pool on `device` (`Pool::open`): checks the superblock, loads
/// the newest checkpoint that verifies, replays the log after it, rebuilds
/// the segment table, and makes what it replayed durable.
pub(in crate::pool) async fn open(
    device: Arc<dyn BlockDevice>,
    limits: PoolLimits,
) -> Result<Pool, EngineError> {
    open_as(device, limits, OpenMode::Normal).await
}

/// Opens a pool whose flash device `Pool::restore_flash` has just
/// rebuilt: as `open`, except that replay applies only the capacity
/// tier's moves of contents the checkpoint holds, so that every volume
/// is as of that checkpoint (`Pool::restored_as_of`), and after replay
/// every entry the maps still place on flash is marked lost (its data
/// went with the lost device; the new flash holds none of it), so that
/// reading it is an I/O error and it holds no flash space; two
/// checkpoints then make the marks durable.
pub(in crate::pool) async fn open_restored(
    device: Arc<dyn BlockDevice>,
    limits: PoolLimits,
) -> Result<Pool, EngineError> {
    open_as(device, limits, OpenMode::FlashRestored).await
}

async fn open_as(
    device: Arc<dyn BlockDevice>,
    limits: PoolLimits,
    mode: OpenMode,
) -> Result<Pool, EngineError> {
    limits.validate()?;
    let name = device.name().to_string();
    let started = std::time::Instant::now();
    let recovered = recover(&device, &limits, mode, &name).await?;
    let checked = &recovered.checked;
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
    let flush_marker = FlushMarker::new(pool_identifier, recovered.marker);
    let openings = OpeningsRecorder::new(
        pool_identifier,
        recovered.next_record_sequence,
        recovered.recorded_through_segment_sequence,
    );
    let checkpoints_needed = recovered.checkpoints_needed();
    let findings = recovered.findings;
    let core = Core::new(CoreParts {
        device,
        limits,
        state: recovered.state,
        flush_marker,
        openings,
    });
    background::start(&core);
    core.integrity().recovery_found(&findings);
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    recovered.summary.log(&name, &findings, elapsed_ms);
    if checkpoints_needed {
        // Two checkpoints, so that both slots cover the replayed batches. The
        // unflushed tail among them may hold torn blocks that this recovery
        // dropped; later batches claim everything before them as flushed, so
        // no future recovery may replay that tail again, even from the older slot.
        // The same two checkpoints repair a slot found corrupt, and
        // write an older version's pool in this one (the first is a base).
        let checkpointer = Checkpointer::new(&core);
        checkpointer.checkpoint().await?;
        checkpointer.checkpoint().await?;
    }
    // The newest record is this run's from now on, listing what the
    // checkpoints just written (if any) still need.
    core.record_now_durably().await?;
    Ok(Pool::from_core(core))
}

/// What recovery made of the device, before anything was written to it.
struct Recovered {
    checked: CheckedDevice,
    marker: Option<FlushMarkerRecord>,
    state: State,
    findings: RecoveryFindings,
    /// The number the next segment openings record takes.
    next_record_sequence: u64,
    /// The highest segment sequence given before this run.
    recorded_through_segment_sequence: u64,
    /// Whether both checkpoint slots hold a checkpoint that verifies.
    both_slots_valid: bool,
    summary: RecoverySummary,
}

impl Recovered {
    /// Whether two checkpoints must follow the open: batches were replayed,
    /// a slot was found corrupt, the pool is in an older format, or blocks
    /// were marked lost.
    fn checkpoints_needed(&self) -> bool {
        self.summary.replayed_batches > 0
            || !self.both_slots_valid
            || self.checked.found.older_format()
            || self.findings.blocks_marked_lost > 0
    }
}

/// The figures of the `pool recovered` log line.
struct RecoverySummary {
    checkpoint_sequence: u64,
    segments_scanned: usize,
    segment_count: u64,
    whole_scan: bool,
    replayed_batches: usize,
}

impl RecoverySummary {
    fn log(&self, name: &str, findings: &RecoveryFindings, elapsed_ms: u64) {
        tracing::info!(
            device = %name,
            checkpoint = self.checkpoint_sequence,
            segments_scanned = self.segments_scanned,
            segment_count = self.segment_count,
            whole_scan = self.whole_scan,
            replayed_batches = self.replayed_batches,
            torn_blocks_dropped = findings.torn_blocks_dropped,
            damaged_flushed_blocks = findings.damaged_flushed_blocks,
            summaries_repaired = findings.summaries_repaired,
            lost_batches = findings.lost_batches,
            elapsed_ms,
            "pool recovered"
        );
    }
}

/// Recovery proper: checks the superblock, loads the newest checkpoint that
/// verifies, scans for and replays the batches after it, and rebuilds the
/// segment table. Reads only: nothing is written to the device.
async fn recover(
    device: &Arc<dyn BlockDevice>,
    limits: &PoolLimits,
    mode: OpenMode,
    name: &str,
) -> Result<Recovered, EngineError> {
    let checked = check_device(&**device, name).await?;
    let geometry = checked.superblock.geometry;
    if geometry.device_size_bytes > POOL_SIZE_BYTES_MAX {
        return Err(EngineError::Open(OpenError::DeviceTooLarge {
            device: name.to_string(),
            size_bytes: geometry.device_size_bytes,
            maximum_bytes: POOL_SIZE_BYTES_MAX,
        }));
    }
    let marker = read_flush_marker(&**device, &checked.superblock).await?;
    let shapes = SegmentShapes::of_device(geometry, device.clone());
    let mut kept = load_checkpoints(&**device, &shapes, name).await?;
    let openings_found = read_openings_record(&**device, checked.superblock.pool_identifier).await;
    let mut state = State::new(geometry, shapes.clone(), limits);
    restore_from_checkpoint(&mut state, &mut kept.newest);
    let held = kept.held_segments();
    let covered = kept.newest.slot.covered_batch_sequence;

    // Find every batch appended after the checkpoint, and how far
    // completed flushes reached: what the log's summaries say, or the
    // flush marker written after the last flush, whichever is further.
    let scope = ScanScope::choose(&geometry, &kept.newest.body, &openings_found, name);
    let scanned = scan_log(&**device, &shapes, &held, &kept.newest.body, &scope).await?;
    let bounds = replay_bounds(&scanned, covered, marker);
    let replay = replay_batches(&**device, &geometry, &mut state, &scanned, bounds, mode).await?;
    let mut findings = report_findings(name, &scanned, &replay, bounds.flushed_through);
    if let OpenMode::FlashRestored = mode {
        mark_restored_losses(&mut state, &scanned, &kept, &replay, name, &mut findings);
    }
    rebuild_segment_table(&mut state, &held, &kept, replay.highest_sequence, name)?;
    refuse_lost_segments(&state, name)?;
    let recorded_through_segment_sequence =
        continue_after_replay(&mut state, &kept, &scope, &scanned, &replay);
    let summary = RecoverySummary {
        checkpoint_sequence: kept.newest.slot.checkpoint_sequence,
        segments_scanned: scanned.probed_segment_count,
        segment_count: geometry.segment_count,
        whole_scan: scope.is_whole(),
        replayed_batches: replay.replayed,
    };
    Ok(Recovered {
        checked,
        marker,
        state,
        findings,
        next_record_sequence: openings_found.next_record_sequence,
        recorded_through_segment_sequence,
        both_slots_valid: kept.both_slots_valid,
        summary,
    })
}
