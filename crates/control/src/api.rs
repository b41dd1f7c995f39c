//! The engine's answers as the admin API's typed documents ([`lamina_api`]): the
//! daemon and the offline CLI serialize only these, so what users and `lamina
//! bench` read is defined in one crate that does not depend on the engine.
//!
//! Each top-level engine type is taken apart field by field without `..`, so a
//! field the engine adds fails to compile here until the API decides on it; the
//! tests below check that the documents are the very JSON the engine's own
//! types serialize to (names, order, values).

use lamina_api as api;
use lamina_engine as engine;

/// `pool status`.
pub fn pool_status(status: engine::PoolStatus) -> api::PoolStatus {
    let engine::PoolStatus {
        device,
        capacity_bytes,
        used_bytes,
        free_bytes,
        reserved_bytes,
        logical_bytes,
        stored_bytes,
        compress_ratio,
        used_percent,
        usage_warning_percent,
        segment_size_bytes,
        segment_count,
        free_segment_count,
        volume_count,
        client_bytes_written,
        device_bytes_written,
        write_amplification,
        cleaner_relocated_blocks,
        dead_segment_count,
        cleaner_state,
        cleaner_pressure,
        space_waits,
        flush_stages,
        durable_batch_sequence,
        checkpoint_sequence,
        failed,
        device_full,
        device_full_retries,
        memory_cache,
        cache_warmup,
        flash,
        capacity,
        flash_only_bytes,
        promoted_blocks,
        demoted_blocks,
        capacity_writes,
        integrity,
        scrub,
        rebuild,
        background,
    } = status;
    api::PoolStatus {
        device,
        capacity_bytes,
        used_bytes,
        free_bytes,
        reserved_bytes,
        logical_bytes,
        stored_bytes,
        compress_ratio,
        used_percent,
        usage_warning_percent,
        segment_size_bytes,
        segment_count,
        free_segment_count,
        volume_count,
        client_bytes_written,
        device_bytes_written,
        write_amplification,
        cleaner_relocated_blocks,
        dead_segment_count,
        cleaner_state: cleaner_state_of(cleaner_state),
        cleaner_pressure,
        space_waits: api::SpaceWaits {
            count: space_waits.count,
            milliseconds: space_waits.milliseconds,
        },
        flush_stages: flush_stages_of(flush_stages),
        durable_batch_sequence,
        checkpoint_sequence,
        failed,
        device_full: device_full.map(device_full_of),
        device_full_retries,
        // The nested statistics are read field by field (their engine types
        // are internal paths); the tests catch a field added to them.
        memory_cache: api::CacheStatistics {
            capacity_bytes: memory_cache.capacity_bytes,
            cached_bytes: memory_cache.cached_bytes,
            hits: memory_cache.hits,
            misses: memory_cache.misses,
            decoded_bytes: memory_cache.decoded_bytes,
            decoded_hits: memory_cache.decoded_hits,
        },
        cache_warmup: cache_warmup_of(cache_warmup),
        flash: tier_space_of(flash),
        capacity: capacity.map(tier_space_of),
        flash_only_bytes,
        promoted_blocks,
        demoted_blocks,
        capacity_writes: capacity_writes.map(capacity_writes_of),
        integrity: api::IntegrityStatus {
            read_checksum_errors: integrity.read_checksum_errors,
            checksum_errors_repaired: integrity.checksum_errors_repaired,
            summaries_repaired: integrity.summaries_repaired,
            lost_batches: integrity.lost_batches,
            torn_blocks_dropped: integrity.torn_blocks_dropped,
            damaged_flushed_blocks: integrity.damaged_flushed_blocks,
            segments_set_aside: integrity.segments_set_aside,
            blocks_marked_lost: integrity.blocks_marked_lost,
            lost_block_reads: integrity.lost_block_reads,
        },
        scrub: scrub_status(scrub),
        rebuild: rebuild_status(rebuild),
        background: background_of(background),
        layout: None,
        object_tier: None,
    }
}

/// `pool status`'s capacity tier's writes (decision 0032).
fn capacity_writes_of(status: engine::CapacityWritesStatus) -> api::CapacityWritesStatus {
    let engine::CapacityWritesStatus {
        suspended,
        suspensions,
        resumptions,
    } = status;
    api::CapacityWritesStatus {
        suspended: suspended.map(|suspension| {
            let engine::CapacitySuspension {
                last_error,
                since_unix_seconds,
                failed_retries,
            } = suspension;
            api::CapacitySuspension {
                last_error,
                since_unix_seconds,
                failed_retries,
            }
        }),
        suspensions,
        resumptions,
    }
}

/// `pool status`'s cache warm-up section.
/// The flash tier's flushes and their stages, as the API and `/metrics`
/// show them.
pub fn flush_stages_of(status: engine::FlushStagesStatus) -> api::FlushStages {
    api::FlushStages {
        device_flushes: status.device_flushes,
        covered_flushes: status.covered_flushes,
        batch_writes_microseconds: status.batch_writes_microseconds,
        flush_lock_microseconds: status.flush_lock_microseconds,
        capacity_flush_microseconds: status.capacity_flush_microseconds,
        marker_write_microseconds: status.marker_write_microseconds,
        device_flush_microseconds: status.device_flush_microseconds,
        batches_sealed_at_write: status.batches_sealed_at_write,
    }
}

fn cache_warmup_of(status: engine::CacheWarmupStatus) -> api::CacheWarmupStatus {
    api::CacheWarmupStatus {
        state: match status.state {
            engine::CacheWarmupState::None => api::CacheWarmupState::None,
            engine::CacheWarmupState::Loading => api::CacheWarmupState::Loading,
            engine::CacheWarmupState::Finished => api::CacheWarmupState::Finished,
        },
        blocks_listed: status.blocks_listed,
        blocks_to_load: status.blocks_to_load,
        blocks_loaded: status.blocks_loaded,
        blocks_skipped: status.blocks_skipped,
        elapsed_ms: status.elapsed_ms,
    }
}

/// `pool status`'s rebuild section, and the answer to `device replace --wait`.
pub fn rebuild_status(status: engine::RebuildStatus) -> api::RebuildStatus {
    api::RebuildStatus {
        state: match status.state {
            engine::RebuildState::None => api::RebuildState::None,
            engine::RebuildState::Rebuilding => api::RebuildState::Rebuilding,
            engine::RebuildState::Finished => api::RebuildState::Finished,
            engine::RebuildState::Failed => api::RebuildState::Failed,
        },
        kind: match status.kind {
            engine::RebuildKind::Replacement => api::RebuildKind::Replacement,
            engine::RebuildKind::DistributedSpare => api::RebuildKind::DistributedSpare,
            engine::RebuildKind::Rebalance => api::RebuildKind::Rebalance,
        },
        bytes_total: status.bytes_total,
        bytes_done: status.bytes_done,
        bytes_skipped: status.bytes_skipped,
        bytes_per_second: status.bytes_per_second,
        seconds_left: status.seconds_left,
        rows_verified: status.rows_verified,
        blocks_unrepairable: status.blocks_unrepairable,
        elapsed_ms: status.elapsed_ms,
        error: status.error,
        blocked: None,
    }
}

/// `pool status`'s scrub section, and the answer to `pool scrub`.
pub fn scrub_status(status: engine::ScrubStatus) -> api::ScrubStatus {
    let engine::ScrubStatus {
        state,
        blocks_total,
        blocks_scrubbed,
        blocks_repaired,
        blocks_unrepairable,
        parity_repaired,
        rows_checked,
        devices_faulted,
        elapsed_ms,
    } = status;
    api::ScrubStatus {
        state: match state {
            engine::ScrubState::None => api::ScrubState::None,
            engine::ScrubState::Scrubbing => api::ScrubState::Scrubbing,
            engine::ScrubState::Finished => api::ScrubState::Finished,
        },
        blocks_total,
        blocks_scrubbed,
        blocks_repaired,
        blocks_unrepairable,
        parity_repaired,
        rows_checked,
        devices_faulted,
        elapsed_ms,
    }
}

/// `pool status`'s background section.
fn background_of(status: engine::BackgroundBudgetStatus) -> api::BackgroundBudgetStatus {
    let engine::BackgroundBudgetStatus {
        impact,
        bytes_per_second,
        bytes_per_second_min,
        bytes_per_second_max,
        client_latency_target_us,
        client_latency_target_ratio,
        client_latency_baseline_us,
        client_latency_us,
        granted_bytes,
        urgent_bytes,
    } = status;
    let engine::GrantedBytes {
        rebuild,
        cleaner,
        demoter,
        scrub,
    } = granted_bytes;
    api::BackgroundBudgetStatus {
        impact: match impact {
            engine::BackgroundImpact::Low => api::BackgroundImpact::Low,
            engine::BackgroundImpact::Medium => api::BackgroundImpact::Medium,
            engine::BackgroundImpact::High => api::BackgroundImpact::High,
        },
        bytes_per_second,
        bytes_per_second_min,
        bytes_per_second_max,
        client_latency_target_us,
        client_latency_target_ratio,
        client_latency_baseline_us,
        client_latency_us,
        granted_bytes: api::GrantedBytes {
            rebuild,
            cleaner,
            demoter,
            scrub,
        },
        urgent_bytes,
    }
}

fn cleaner_state_of(state: engine::CleanerState) -> api::CleanerState {
    match state {
        engine::CleanerState::Off => api::CleanerState::Off,
        engine::CleanerState::Idle => api::CleanerState::Idle,
        engine::CleanerState::Paced => api::CleanerState::Paced,
        engine::CleanerState::Short => api::CleanerState::Short,
    }
}

fn device_full_of(status: engine::DeviceFullStatus) -> api::DeviceFullStatus {
    let engine::DeviceFullStatus {
        reason,
        since_unix_seconds,
        waiting_batch_count,
    } = status;
    api::DeviceFullStatus {
        reason,
        since_unix_seconds,
        waiting_batch_count,
    }
}

fn tier_space_of(space: engine::TierSpace) -> api::TierSpace {
    let engine::TierSpace {
        size_bytes,
        used_bytes,
        free_bytes,
    } = space;
    api::TierSpace {
        size_bytes,
        used_bytes,
        free_bytes,
    }
}

/// One volume of `volume list` (and the answer to create, resize, rename,
/// set-policy, rollback and clone).
pub fn volume_info(info: engine::VolumeInfo) -> api::VolumeInfo {
    let engine::VolumeInfo {
        volume_id,
        name,
        size_bytes,
        allocated_bytes,
        stored_bytes,
        compress_ratio,
        unique_bytes,
        unique_stored_bytes,
        used_bytes,
        snapshot_count,
        origin,
        created_unix_seconds,
        policy,
        compression,
    } = info;
    api::VolumeInfo {
        volume_id,
        name,
        size_bytes,
        allocated_bytes,
        stored_bytes,
        compress_ratio,
        unique_bytes,
        unique_stored_bytes,
        used_bytes,
        snapshot_count,
        origin,
        created_unix_seconds,
        policy: tier_policy_of(policy),
        compression: compression.to_string(),
    }
}

fn tier_policy_of(policy: engine::TierPolicy) -> api::TierPolicy {
    let engine::TierPolicy { priority, pin } = policy;
    api::TierPolicy {
        priority: match priority {
            engine::CachePriority::High => api::CachePriority::High,
            engine::CachePriority::Normal => api::CachePriority::Normal,
            engine::CachePriority::Low => api::CachePriority::Low,
            engine::CachePriority::None => api::CachePriority::None,
        },
        pin: match pin {
            engine::Pin::Auto => api::Pin::Auto,
            engine::Pin::Flash => api::Pin::Flash,
            engine::Pin::Capacity => api::Pin::Capacity,
        },
    }
}

/// One snapshot of `snapshot list` (and the answer to `snapshot create`).
pub fn snapshot_info(info: engine::SnapshotInfo) -> api::SnapshotInfo {
    let engine::SnapshotInfo {
        full_name,
        volume,
        name,
        snapshot_id,
        size_bytes,
        referenced_bytes,
        unique_bytes,
        clones,
        created_unix_seconds,
    } = info;
    api::SnapshotInfo {
        full_name,
        volume,
        name,
        snapshot_id,
        size_bytes,
        referenced_bytes,
        unique_bytes,
        clones,
        created_unix_seconds,
    }
}

/// `volume stats`.
pub fn volume_tier_stats(stats: engine::VolumeTierStats) -> api::VolumeTierStats {
    let engine::VolumeTierStats {
        volume,
        policy,
        compression,
        flash_bytes,
        capacity_bytes,
        logical_bytes,
        stored_bytes,
        compress_ratio,
        counters,
        memory_hit_ratio,
        flash_hit_ratio,
        capacity_read_ratio,
    } = stats;
    let engine::VolumeTierCounters {
        memory_read_blocks,
        flash_read_blocks,
        capacity_read_blocks,
        promoted_blocks,
        demoted_blocks,
    } = counters;
    api::VolumeTierStats {
        volume,
        policy: tier_policy_of(policy),
        compression: compression.to_string(),
        flash_bytes,
        capacity_bytes,
        logical_bytes,
        stored_bytes,
        compress_ratio,
        counters: api::VolumeTierCounters {
            memory_read_blocks,
            flash_read_blocks,
            capacity_read_blocks,
            promoted_blocks,
            demoted_blocks,
        },
        memory_hit_ratio,
        flash_hit_ratio,
        capacity_read_ratio,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{TierDevice, create_tiered_pool};

    /// Both serialize to the same JSON, names and order included.
    fn assert_same_json(engine_value: &impl serde::Serialize, api_value: &impl serde::Serialize) {
        let engine_text = serde_json::to_string(engine_value).expect("serializes");
        let api_text = serde_json::to_string(api_value).expect("serializes");
        assert_eq!(api_text, engine_text);
    }

    #[tokio::test]
    async fn every_document_is_the_json_the_engine_types_serialize_to() {
        let directory = tempfile::tempdir().expect("tempdir");
        let device = |name: &str, size_bytes: u64| TierDevice {
            path: directory.path().join(name),
            create_size_bytes: Some(size_bytes),
            model: None,
        };
        let options = engine::PoolOptions {
            segment_size_bytes: 1 << 20,
            ..Default::default()
        };
        let data_dir = directory.path().join("data");
        std::fs::create_dir(&data_dir).expect("data directory");
        let pool = create_tiered_pool(
            &data_dir,
            &device("flash", 64 << 20),
            Some(&device("capacity", 128 << 20)),
            options,
            Default::default(),
        )
        .await
        .expect("creates a two-tier pool");
        let created = pool.create_volume("origin", 8 << 20).await.expect("volume");
        pool.write(created.volume_id, 0, &[7u8; 8192], true)
            .await
            .expect("writes");
        pool.create_snapshot("origin", "s1")
            .await
            .expect("snapshot");
        pool.clone_snapshot("origin", "s1", "copy")
            .await
            .expect("clone");

        let status = pool.status();
        assert!(status.capacity.is_some() && status.write_amplification.is_some());
        assert_same_json(&status, &pool_status(status.clone()));
        let volumes = pool.list_volumes();
        assert!(volumes.iter().any(|volume| volume.origin.is_some()));
        for volume in volumes {
            assert_same_json(&volume, &volume_info(volume.clone()));
        }
        let snapshots = pool.list_snapshots(None).expect("lists");
        assert!(!snapshots.is_empty() && !snapshots[0].clones.is_empty());
        for snapshot in snapshots {
            assert_same_json(&snapshot, &snapshot_info(snapshot.clone()));
        }
        let stats = pool.volume_tier_stats("origin").expect("stats");
        assert_same_json(&stats, &volume_tier_stats(stats.clone()));
        pool.close().await.expect("closes");
    }

    #[test]
    fn device_full_cleaner_state_and_policies_keep_their_names() {
        let status = engine::DeviceFullStatus {
            reason: "No space left on device".into(),
            since_unix_seconds: 17,
            waiting_batch_count: 3,
        };
        assert_same_json(&status, &device_full_of(status.clone()));
        let writes = engine::CapacityWritesStatus {
            suspended: Some(engine::CapacitySuspension {
                last_error: "PUT failed".into(),
                since_unix_seconds: 19,
                failed_retries: 4,
            }),
            suspensions: 2,
            resumptions: 1,
        };
        assert_same_json(&writes, &capacity_writes_of(writes.clone()));
        for state in [
            engine::CleanerState::Off,
            engine::CleanerState::Idle,
            engine::CleanerState::Paced,
            engine::CleanerState::Short,
        ] {
            assert_same_json(&state, &cleaner_state_of(state));
        }
        for priority in [
            engine::CachePriority::High,
            engine::CachePriority::Normal,
            engine::CachePriority::Low,
            engine::CachePriority::None,
        ] {
            for pin in [engine::Pin::Auto, engine::Pin::Flash, engine::Pin::Capacity] {
                let policy = engine::TierPolicy { priority, pin };
                assert_same_json(&policy, &tier_policy_of(policy));
            }
        }
    }
}
