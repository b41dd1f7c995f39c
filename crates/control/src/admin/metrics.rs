//! The daemon's `/metrics` page: pool and volume figures, tiers, scrub, the
//! background budget, the NBD server and the admin socket, and (from their
//! own modules) per-volume I/O, devices, the object tier and the rebuild, in
//! the Prometheus text format through the typed [`Exposition`] writer. A
//! value that only grows is a counter named `..._total`; one that goes up
//! and down is a gauge; units end the name (`_bytes`, `_seconds`).

use lamina_engine::{CleanerState, Pool};
use lamina_nbd::NbdServer;

use super::audit::AdminAudit;
use super::operations::AdminContext;
use crate::exposition::{Exposition, SampleValue, label};

/// Microseconds in a second, for the latencies the engine keeps in µs.
const MICROSECONDS_PER_SECOND: f64 = 1e6;
/// Milliseconds in a second.
const MILLISECONDS_PER_SECOND: f64 = 1e3;

/// The whole `/metrics` text of the daemon serving `context`.
pub(crate) fn metrics_text(context: &AdminContext, audit: &AdminAudit) -> String {
    let pool = &context.pool;
    let status = pool.status();
    let mut exposition = Exposition::new();
    pool_space_metrics(&status, &mut exposition);
    pool_health_metrics(&status, &mut exposition);
    integrity_metrics(&status, &mut exposition);
    // One listing serves every per-volume series: its space accounting walks the maps.
    let volumes = pool.list_volumes();
    volume_metrics(&volumes, &mut exposition);
    tier_metrics(&status, &mut exposition);
    volume_tier_metrics(pool, &status, &volumes, &mut exposition);
    scrub_metrics(
        &status.scrub,
        status.integrity.checksum_errors_repaired,
        &mut exposition,
    );
    background_metrics(&status.background, &mut exposition);
    if let Some(statistics) = &context.volume_statistics {
        let names: Vec<(u32, String)> = volumes
            .iter()
            .map(|volume| (volume.volume_id, volume.name.clone()))
            .collect();
        crate::volume_statistics::metrics(statistics, &names, &mut exposition);
    }
    context.layout.metrics(&mut exposition);
    crate::devices::rebuild_metrics(pool, &context.layout, &mut exposition);
    if let Some(server) = &context.nbd_server {
        nbd_metrics(server, &mut exposition);
    }
    admin_metrics(audit, &mut exposition);
    exposition.into_text()
}

/// The pool's space, its usage warnings and the writes that waited for space.
fn pool_space_metrics(status: &lamina_engine::PoolStatus, exposition: &mut Exposition) {
    for (name, help, value) in [
        (
            "lamina_pool_capacity_bytes",
            "Capacity of the pool's segments.",
            status.capacity_bytes,
        ),
        (
            "lamina_pool_used_bytes",
            "Bytes in segments that are not free.",
            status.used_bytes,
        ),
        (
            "lamina_pool_free_bytes",
            "Bytes clients can still allocate.",
            status.free_bytes,
        ),
        (
            "lamina_pool_reserved_bytes",
            "Bytes kept for the cleaner and checkpoints.",
            status.reserved_bytes,
        ),
        (
            "lamina_pool_logical_bytes",
            "Bytes clients would read back from the live data, each block once however many snapshots and clones share it.",
            status.logical_bytes,
        ),
        (
            "lamina_pool_stored_bytes",
            "Device bytes the live data takes after compression.",
            status.stored_bytes,
        ),
    ] {
        exposition.gauge(name, help).sample(&[], value);
    }
    exposition
        .gauge(
            "lamina_pool_compress_ratio",
            "Logical over stored bytes of the live data (1 when nothing is stored).",
        )
        .sample(&[], status.compress_ratio);
    exposition
        .gauge(
            "lamina_pool_used_percent",
            "Used share of the space clients can fill (100 when writes fail with ENOSPC).",
        )
        .sample(&[], status.used_percent);
    exposition
        .gauge(
            "lamina_pool_usage_warning_percent",
            "The highest usage warning threshold the used share has reached (0 for none).",
        )
        .sample(&[], u64::from(status.usage_warning_percent));
    exposition
        .counter(
            "lamina_client_space_waits_total",
            "Writes that found no free segment and waited for a reclaim (cleaning in the write path).",
        )
        .sample(&[], status.space_waits.count);
    exposition
        .counter(
            "lamina_client_space_wait_seconds_total",
            "Time writes waited for a reclaim, in all.",
        )
        .sample(
            &[],
            status.space_waits.milliseconds as f64 / MILLISECONDS_PER_SECOND,
        );
    flush_stage_metrics(
        &crate::api::flush_stages_of(status.flush_stages),
        exposition,
    );
}

/// The flash tier's flushes and the time they spent in each stage
/// (issue 46): a stage's seconds over the device flushes is its mean share
/// of a flush's latency.
fn flush_stage_metrics(flushes: &lamina_api::FlushStages, exposition: &mut Exposition) {
    exposition
        .counter(
            "lamina_device_flushes_total",
            "Flushes of the flash tier that issued a device flush.",
        )
        .sample(&[], flushes.device_flushes);
    exposition
        .counter(
            "lamina_covered_flushes_total",
            "Flushes whose batches another flush made durable.",
        )
        .sample(&[], flushes.covered_flushes);
    exposition
        .counter(
            "lamina_batches_sealed_at_write_total",
            "Open batches sealed and written right after a write, for writers that flush after each write.",
        )
        .sample(&[], flushes.batches_sealed_at_write);
    let mut family = exposition.counter(
        "lamina_flush_stage_seconds_total",
        "Time flushes spent in each stage, in the order a flush waits: the batch writes it covers, another flush, the capacity tier's flush, the previous flush marker's write, the device flush.",
    );
    for (stage, microseconds) in flushes.stages() {
        family.sample(
            &[label("stage", stage)],
            microseconds as f64 / MICROSECONDS_PER_SECOND,
        );
    }
}

/// The cleaner, write amplification, and whether the pool still takes writes.
fn pool_health_metrics(status: &lamina_engine::PoolStatus, exposition: &mut Exposition) {
    exposition
        .gauge(
            "lamina_cleaner_pressure",
            "Free-space pressure on the cleaner, 0 (idle) to 1 (nothing free beyond the reserves).",
        )
        .sample(&[], status.cleaner_pressure);
    if let Some(amplification) = status.write_amplification {
        exposition
            .gauge(
                "lamina_pool_write_amplification",
                "Device bytes written per client byte over the pool's life.",
            )
            .sample(&[], amplification);
    }
    exposition
        .counter(
            "lamina_cleaner_relocated_blocks_total",
            "Blocks the cleaner has moved out of victim segments over the pool's life.",
        )
        .sample(&[], status.cleaner_relocated_blocks);
    exposition
        .gauge(
            "lamina_pool_failed",
            "1 when the pool refuses writes after an I/O error.",
        )
        .sample(&[], status.failed.is_some());
    exposition
        .gauge(
            "lamina_pool_device_full",
            "1 while the device under the pool is out of space (ENOSPC, EDQUOT): writes wait for space, flushes fail with ENOSPC.",
        )
        .sample(&[], status.device_full.is_some());
    exposition
        .counter(
            "lamina_pool_device_full_retries_total",
            "Batch writes retried after finding the device under the pool full, since the pool opened.",
        )
        .sample(&[], status.device_full_retries);
    let mut cleaner = exposition.gauge(
        "lamina_cleaner_state",
        "1 for what the paced cleaner is doing: off, idle, paced or short.",
    );
    for state in [
        CleanerState::Off,
        CleanerState::Idle,
        CleanerState::Paced,
        CleanerState::Short,
    ] {
        let name = serde_name(state);
        cleaner.sample(&[label("state", &name)], state == status.cleaner_state);
    }
}

/// Damage found and repaired: at recovery, by reads and by the cleaner.
fn integrity_metrics(status: &lamina_engine::PoolStatus, exposition: &mut Exposition) {
    let integrity = &status.integrity;
    exposition
        .gauge(
            "lamina_segments_set_aside",
            "Segments the cleaner set aside because their summaries do not describe every block.",
        )
        .sample(&[], integrity.segments_set_aside);
    exposition
        .counter(
            "lamina_lost_block_reads_total",
            "Reads of blocks lost with a flash device the pool was restored without.",
        )
        .sample(&[], integrity.lost_block_reads);
    for (name, help, value) in [
        (
            "lamina_read_checksum_errors_total",
            "Blocks that failed their checksum when read (each an I/O error, never data).",
            integrity.read_checksum_errors,
        ),
        (
            "lamina_summaries_repaired_total",
            "Damaged batch summaries read from their copies (recovery and cleaning).",
            integrity.summaries_repaired,
        ),
        (
            "lamina_lost_batches_total",
            "Flushed batches whose summary and copy were both unreadable at recovery (data loss).",
            integrity.lost_batches,
        ),
        (
            "lamina_torn_blocks_dropped_total",
            "Unflushed blocks torn by a crash and dropped at recovery.",
            integrity.torn_blocks_dropped,
        ),
        (
            "lamina_damaged_flushed_blocks_total",
            "Flushed blocks found damaged at recovery (reads of them fail).",
            integrity.damaged_flushed_blocks,
        ),
    ] {
        exposition.counter(name, help).sample(&[], value);
    }
}

/// Each volume's space and snapshots.
fn volume_metrics(volumes: &[lamina_engine::VolumeInfo], exposition: &mut Exposition) {
    type Field = fn(&lamina_engine::VolumeInfo) -> SampleValue;
    let series: [(&str, &str, Field); 5] = [
        (
            "lamina_volume_allocated_bytes",
            "Logical bytes of a volume's mapped blocks (4096 each).",
            |volume| volume.allocated_bytes.into(),
        ),
        (
            "lamina_volume_stored_bytes",
            "Device bytes a volume's mapped blocks take after compression (shared or not).",
            |volume| volume.stored_bytes.into(),
        ),
        (
            "lamina_volume_compress_ratio",
            "Logical over stored bytes of a volume's mapped blocks (1 when nothing is stored).",
            |volume| volume.compress_ratio.into(),
        ),
        (
            "lamina_volume_used_bytes",
            "Device space deleting a volume and its snapshots would free.",
            |volume| volume.used_bytes.into(),
        ),
        (
            "lamina_volume_snapshots",
            "Snapshots a volume has.",
            |volume| volume.snapshot_count.into(),
        ),
    ];
    for (name, help, field) in series {
        let mut family = exposition.gauge(name, help);
        for volume in volumes {
            family.sample(&[label("volume", &volume.name)], field(volume));
        }
    }
}

/// Tier space, promotions and demotions. Capacity series appear only for a
/// pool with a capacity tier.
fn tier_metrics(status: &lamina_engine::PoolStatus, exposition: &mut Exposition) {
    let tiers: Vec<(&str, lamina_engine::TierSpace)> = std::iter::once(("flash", status.flash))
        .chain(status.capacity.map(|capacity| ("capacity", capacity)))
        .collect();
    type Field = fn(&lamina_engine::TierSpace) -> u64;
    let series: [(&str, &str, Field); 3] = [
        (
            "lamina_tier_size_bytes",
            "Bytes of a tier's data segments.",
            |space| space.size_bytes,
        ),
        (
            "lamina_tier_used_bytes",
            "Bytes of a tier's segments in use.",
            |space| space.used_bytes,
        ),
        (
            "lamina_tier_free_bytes",
            "Bytes of a tier's free segments.",
            |space| space.free_bytes,
        ),
    ];
    for (name, help, field) in series {
        let mut family = exposition.gauge(name, help);
        for (tier, space) in &tiers {
            family.sample(&[label("tier", tier)], field(space));
        }
    }
    if let Some(flash_only_bytes) = status.flash_only_bytes {
        exposition
            .gauge(
                "lamina_flash_only_bytes",
                "Live bytes whose only copy is on the flash tier (lost with the flash device).",
            )
            .sample(&[], flash_only_bytes);
    }
    exposition
        .counter(
            "lamina_tier_promoted_blocks_total",
            "Blocks moved from capacity to flash on access since the pool opened.",
        )
        .sample(&[], status.promoted_blocks);
    exposition
        .counter(
            "lamina_tier_demoted_blocks_total",
            "Blocks moved from flash to capacity by the cleaner since the pool opened.",
        )
        .sample(&[], status.demoted_blocks);
}

/// Per volume its bytes per tier, its block reads by the tier that served
/// them, and its promotions and demotions.
fn volume_tier_metrics(
    pool: &Pool,
    status: &lamina_engine::PoolStatus,
    volumes: &[lamina_engine::VolumeInfo],
    exposition: &mut Exposition,
) {
    // One tier walk per volume; a volume deleted since the listing is skipped.
    let stats: Vec<lamina_engine::VolumeTierStats> = volumes
        .iter()
        .filter_map(|volume| pool.volume_tier_stats(&volume.name).ok())
        .collect();
    let has_capacity = status.capacity.is_some();
    let mut bytes = exposition.gauge(
        "lamina_volume_tier_bytes",
        "Bytes of a volume's live contents on a tier.",
    );
    for volume in &stats {
        let tiers = [
            ("flash", volume.flash_bytes),
            ("capacity", volume.capacity_bytes),
        ];
        for (tier, value) in &tiers[..if has_capacity { 2 } else { 1 }] {
            bytes.sample(
                &[label("volume", &volume.volume), label("tier", tier)],
                *value,
            );
        }
    }
    let mut reads = exposition.counter(
        "lamina_volume_read_blocks_total",
        "Blocks of a volume read, by the tier that served them (memory cache, flash, capacity), since the pool opened.",
    );
    for volume in &stats {
        let counters = &volume.counters;
        let tiers = [
            ("memory", counters.memory_read_blocks),
            ("flash", counters.flash_read_blocks),
            ("capacity", counters.capacity_read_blocks),
        ];
        for (tier, blocks) in &tiers[..if has_capacity { 3 } else { 2 }] {
            reads.sample(
                &[label("volume", &volume.volume), label("tier", tier)],
                *blocks,
            );
        }
    }
    type Field = fn(&lamina_engine::VolumeTierCounters) -> u64;
    let moves: [(&str, &str, Field); 2] = [
        (
            "lamina_volume_promoted_blocks_total",
            "Blocks of a volume promoted to flash since the pool opened.",
            |counters| counters.promoted_blocks,
        ),
        (
            "lamina_volume_demoted_blocks_total",
            "Blocks of a volume demoted to capacity since the pool opened.",
            |counters| counters.demoted_blocks,
        ),
    ];
    for (name, help, field) in moves {
        let mut family = exposition.counter(name, help);
        for volume in &stats {
            family.sample(&[label("volume", &volume.volume)], field(&volume.counters));
        }
    }
}

/// Scrub's progress (of the latest scrub: gauges, reset when one starts)
/// and the blocks repaired from redundancy.
fn scrub_metrics(scrub: &lamina_engine::ScrubStatus, repaired: u64, exposition: &mut Exposition) {
    for (name, help, value) in [
        (
            "lamina_scrub_live_blocks",
            "Live blocks the latest scrub checks.",
            scrub.blocks_total,
        ),
        (
            "lamina_scrub_blocks_scrubbed",
            "Live blocks the latest scrub has checked.",
            scrub.blocks_scrubbed,
        ),
        (
            "lamina_scrub_blocks_repaired",
            "Blocks the latest scrub rebuilt from redundancy.",
            scrub.blocks_repaired,
        ),
        (
            "lamina_scrub_blocks_unrepairable",
            "Blocks the latest scrub found damaged beyond repair.",
            scrub.blocks_unrepairable,
        ),
        (
            "lamina_scrub_parity_repaired",
            "Parity columns and metadata copies the latest scrub found disagreeing with their row and rewrote.",
            scrub.parity_repaired,
        ),
        (
            "lamina_scrub_rows_checked",
            "Rows (and metadata copies) whose every column the latest scrub checked.",
            scrub.rows_checked,
        ),
    ] {
        exposition.gauge(name, help).sample(&[], value);
    }
    exposition
        .counter(
            "lamina_checksum_errors_repaired_total",
            "Blocks that failed their checksum and were rebuilt from redundancy since the pool opened.",
        )
        .sample(&[], repaired);
}

/// The background budget: the rate it allows, the client latency it
/// follows (no sample while no client request came in the latest window),
/// and the bytes it granted each kind of work.
fn background_metrics(budget: &lamina_engine::BackgroundBudgetStatus, exposition: &mut Exposition) {
    for (name, help, value) in [
        (
            "lamina_background_bytes_per_second",
            "Bytes per second background work (rebuild, cleaner, demoter, scrub) may issue now.",
            budget.bytes_per_second,
        ),
        (
            "lamina_background_bytes_per_second_min",
            "The background budget's floor (background_bytes_per_second_min).",
            budget.bytes_per_second_min,
        ),
        (
            "lamina_background_bytes_per_second_max",
            "The background budget's ceiling (background_bytes_per_second_max).",
            budget.bytes_per_second_max,
        ),
    ] {
        exposition.gauge(name, help).sample(&[], value);
    }
    client_latency_metrics(budget, exposition);
    let mut granted = exposition.counter(
        "lamina_background_granted_bytes_total",
        "Bytes the background budget granted, by kind of work, since the pool opened.",
    );
    for work in lamina_engine::BackgroundWork::ALL {
        let name = serde_name(work);
        granted.sample(&[label("work", &name)], budget.granted_bytes.of(work));
    }
    exposition
        .counter(
            "lamina_background_urgent_bytes_total",
            "Of those, bytes the cleaner issued without waiting because free space was short.",
        )
        .sample(&[], budget.urgent_bytes);
}

/// The client latency the background budget follows, in seconds (the
/// budget keeps microseconds).
fn client_latency_metrics(
    budget: &lamina_engine::BackgroundBudgetStatus,
    exposition: &mut Exposition,
) {
    for (name, help, microseconds) in [
        (
            "lamina_client_latency_target_seconds",
            "Client latency above which background work backs off now (client_latency_target_ratio times the baseline, or client_latency_target_us if lower).",
            budget.client_latency_target_us,
        ),
        (
            "lamina_client_latency_baseline_seconds",
            "Client latency learned while background work was idle or at its floor.",
            budget.client_latency_baseline_us,
        ),
        (
            "lamina_client_latency_seconds",
            "The 99th percentile of client reads and writes over the latest window.",
            budget.client_latency_us,
        ),
    ] {
        let mut family = exposition.gauge(name, help);
        if let Some(microseconds) = microseconds {
            family.sample(&[], microseconds as f64 / MICROSECONDS_PER_SECOND);
        }
    }
}

/// The NBD server's connections, handshakes in progress, and the connections
/// and handshakes its limits refused or closed.
fn nbd_metrics(server: &NbdServer, exposition: &mut Exposition) {
    let counters = server.counters();
    exposition
        .gauge(
            "lamina_nbd_connections",
            "NBD connections in the transmission phase.",
        )
        .sample(&[], counters.connections);
    exposition
        .gauge(
            "lamina_nbd_handshakes_in_progress",
            "NBD connections still in the handshake.",
        )
        .sample(&[], counters.handshakes_in_progress);
    exposition
        .counter(
            "lamina_nbd_connections_refused_total",
            "NBD connections closed because connections_max were being served.",
        )
        .sample(&[], counters.refused_connections);
    let mut closed = exposition.counter(
        "lamina_nbd_handshakes_closed_total",
        "Unfinished NBD handshakes closed, by reason: peer_limit (handshakes_per_peer_max), total_limit (handshakes_in_progress_max), timeout (handshake_timeout_ms), tls_failed (the TLS handshake failed), tls_required (NBD_OPT_EXPORT_NAME before STARTTLS where TLS is required).",
    );
    for (reason, count) in [
        ("peer_limit", counters.handshakes_closed_for_peer_limit),
        ("total_limit", counters.handshakes_closed_for_total_limit),
        ("timeout", counters.handshakes_timed_out),
        ("tls_failed", counters.tls_handshakes_failed),
        ("tls_required", counters.tls_required_closed),
    ] {
        closed.sample(&[label("reason", reason)], count);
    }
    let Some(threads) = server.connection_threads() else {
        return;
    };
    let mut per_thread = exposition.gauge(
        "lamina_nbd_thread_connections",
        "NBD connections (in the handshake or the transmission phase) each connection thread serves.",
    );
    for (thread, count) in threads.connection_counts().into_iter().enumerate() {
        per_thread.sample(&[label("thread", &thread.to_string())], count);
    }
}

/// The admin socket's refusals and its changing operations.
fn admin_metrics(audit: &AdminAudit, exposition: &mut Exposition) {
    exposition
        .counter(
            "lamina_admin_connections_refused_total",
            "Admin socket connections closed because the peer is not the owner, root or in admin_group.",
        )
        .sample(&[], audit.refused_connection_count());
    let mut operations = exposition.counter(
        "lamina_admin_operations_total",
        "Changing admin operations (each also an audit log line), by operation and outcome.",
    );
    for counted in audit.operation_counts() {
        let outcome = if counted.outcome.succeeded {
            "ok"
        } else {
            "error"
        };
        let labels = [
            label("operation", &counted.outcome.operation),
            label("outcome", outcome),
        ];
        operations.sample(&labels, counted.count);
    }
}

/// A value's serde name (`"paced"`), for a label.
fn serde_name(value: impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}
