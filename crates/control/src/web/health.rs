//! The web page's health badge: one state for the pool and the reasons behind
//! it, decided here from the same `pool status` document the CLI prints, so
//! that the badge warns about what `pool status` warns about (usage over a
//! warning threshold, a failed pool, a degraded or faulted array, a rebuild,
//! a full device, suspended capacity writes, damage found) and a test can
//! read it from `GET /v1/web/overview` without a browser. The page only
//! shows it.

use lamina_api::{IntegrityStatus, PoolStatus, RebuildState};
use serde::{Deserialize, Serialize};

/// How bad the pool's worst finding is; the badge's colour. Ordered from
/// best to worst, so that the pool's state is the largest of its reasons'.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthState {
    /// Nothing `pool status` warns about.
    Healthy,
    /// Serving everything, but something needs the operator's attention.
    Warning,
    /// Devices lost within what the redundancy covers.
    Degraded,
    /// More devices lost than the redundancy covers: I/O fails.
    Faulted,
    /// The pool refuses writes after an I/O error.
    Failed,
}

/// One thing `pool status` warns about.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReason {
    pub state: HealthState,
    /// What it is, in the terms `pool status` prints.
    pub text: String,
}

/// The badge: the worst state among the reasons (healthy without any).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolHealth {
    pub state: HealthState,
    pub reasons: Vec<HealthReason>,
}

impl PoolHealth {
    fn add(&mut self, state: HealthState, text: String) {
        self.state = self.state.max(state);
        self.reasons.push(HealthReason { state, text });
    }
}

/// The pool's health as `status` tells it.
pub fn pool_health(status: &PoolStatus) -> PoolHealth {
    let mut health = PoolHealth {
        state: HealthState::Healthy,
        reasons: Vec::new(),
    };
    if let Some(reason) = &status.failed {
        health.add(HealthState::Failed, format!("failed: {reason}"));
    }
    add_layout(&mut health, status);
    add_space(&mut health, status);
    add_rebuild(&mut health, status);
    add_damage(&mut health, status);
    health
}

/// A degraded or faulted array, with the devices that are not online.
fn add_layout(health: &mut PoolHealth, status: &PoolStatus) {
    let Some(layout) = &status.layout else {
        return;
    };
    let state = match layout.state.as_str() {
        "online" => return,
        "degraded" => HealthState::Degraded,
        "faulted" => HealthState::Faulted,
        _ => HealthState::Warning,
    };
    let devices: Vec<String> = layout
        .tiers
        .iter()
        .flat_map(|tier| &tier.devices)
        .filter(|device| device.state != "online")
        .map(|device| format!("{} {}", device.path, device.state))
        .collect();
    let text = if devices.is_empty() {
        format!("array {}", layout.state)
    } else {
        format!("array {}: {}", layout.state, devices.join(", "))
    };
    health.add(state, text);
}

/// Usage over a warning threshold, a full device, suspended capacity writes.
fn add_space(health: &mut PoolHealth, status: &PoolStatus) {
    if status.usage_warning_percent > 0 {
        health.add(
            HealthState::Warning,
            format!(
                "{:.1}% used, above the {}% warning: trim, delete or add capacity",
                status.used_percent, status.usage_warning_percent
            ),
        );
    }
    if let Some(device_full) = &status.device_full {
        health.add(
            HealthState::Warning,
            format!(
                "device full: {} batches wait for space: {}",
                device_full.waiting_batch_count, device_full.reason
            ),
        );
    }
    let suspension = status
        .capacity_writes
        .as_ref()
        .and_then(|writes| writes.suspended.as_ref());
    if let Some(suspension) = suspension {
        health.add(
            HealthState::Warning,
            format!(
                "capacity writes suspended: {} (writes land on flash)",
                suspension.last_error
            ),
        );
    }
    let fenced = status
        .object_tier
        .as_ref()
        .and_then(|tier| tier.fenced_by_epoch);
    if let Some(epoch) = fenced {
        health.add(
            HealthState::Warning,
            format!("another process opened the object tier (epoch {epoch}): nothing more is stored there"),
        );
    }
}

/// A rebuild running or failed.
fn add_rebuild(health: &mut PoolHealth, status: &PoolStatus) {
    let rebuild = &status.rebuild;
    match rebuild.state {
        RebuildState::Rebuilding => {
            let percent = (rebuild.bytes_done * 100)
                .checked_div(rebuild.bytes_total)
                .unwrap_or(0);
            health.add(
                HealthState::Warning,
                format!("rebuilding {}: {percent}% done", rebuild.kind.name()),
            );
        }
        RebuildState::Failed => health.add(
            HealthState::Warning,
            format!(
                "rebuild failed: {}",
                rebuild.error.as_deref().unwrap_or("no reason given")
            ),
        ),
        RebuildState::None | RebuildState::Finished => {}
    }
    if rebuild.blocks_unrepairable > 0 {
        health.add(
            HealthState::Warning,
            format!(
                "rebuild found {} blocks it could not repair",
                rebuild.blocks_unrepairable
            ),
        );
    }
}

/// Damage that failed reads or lost data (what was repaired is not a
/// warning: the pool holds the data again).
fn add_damage(health: &mut PoolHealth, status: &PoolStatus) {
    let IntegrityStatus {
        read_checksum_errors,
        lost_batches,
        damaged_flushed_blocks,
        segments_set_aside,
        blocks_marked_lost,
        lost_block_reads,
        ..
    } = status.integrity;
    let findings = [
        (read_checksum_errors, "checksum errors on read"),
        (damaged_flushed_blocks, "flushed blocks found damaged"),
        (lost_batches, "flushed batches lost: data loss"),
        (
            segments_set_aside,
            "segments set aside (unreadable summaries)",
        ),
        (blocks_marked_lost, "blocks lost with the flash device"),
        (lost_block_reads, "reads of lost blocks"),
        (
            status.scrub.blocks_unrepairable,
            "blocks scrub could not repair",
        ),
    ];
    for (count, what) in findings {
        if count > 0 {
            health.add(HealthState::Warning, format!("{count} {what}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A healthy one-tier pool's status document, as the daemon serialises it.
    fn healthy_status() -> PoolStatus {
        let mut document = serde_json::json!({
            "device": "pool.img", "capacity_bytes": 100, "used_bytes": 10, "free_bytes": 90,
            "reserved_bytes": 10, "used_percent": 11.1, "usage_warning_percent": 0,
            "segment_size_bytes": 1, "segment_count": 1, "free_segment_count": 1,
            "volume_count": 1, "client_bytes_written": 0, "device_bytes_written": 0,
            "write_amplification": null, "cleaner_relocated_blocks": 0,
            "dead_segment_count": 0, "cleaner_state": "idle", "cleaner_pressure": 0.0,
            "durable_batch_sequence": 0, "checkpoint_sequence": 0, "failed": null,
            "device_full": null, "device_full_retries": 0,
            "memory_cache": {"capacity_bytes": 0, "cached_bytes": 0, "hits": 0, "misses": 0, "decoded_bytes": 0, "decoded_hits": 0},
            "flash": {"size_bytes": 100, "used_bytes": 10, "free_bytes": 90},
            "capacity": null, "promoted_blocks": 0, "demoted_blocks": 0,
            "integrity": {"read_checksum_errors": 0, "checksum_errors_repaired": 0,
                "summaries_repaired": 0, "lost_batches": 0, "torn_blocks_dropped": 0,
                "damaged_flushed_blocks": 0, "segments_set_aside": 0},
            "scrub": {"state": "none", "blocks_total": 0, "blocks_scrubbed": 0,
                "blocks_repaired": 0, "blocks_unrepairable": 0, "elapsed_ms": 0}
        });
        // Apart: one literal this deep passes the json! macro's recursion limit.
        document["background"] = serde_json::json!({
            "impact": "medium", "bytes_per_second": 0,
            "bytes_per_second_min": 0, "bytes_per_second_max": 0,
            "client_latency_target_us": null, "client_latency_target_ratio": 2.0,
            "client_latency_baseline_us": null, "client_latency_us": null,
            "granted_bytes": {"rebuild": 0, "cleaner": 0, "demoter": 0, "scrub": 0},
            "urgent_bytes": 0
        });
        serde_json::from_value(document).expect("a pool status document")
    }

    #[test]
    fn a_pool_with_nothing_to_warn_about_is_healthy() {
        let health = pool_health(&healthy_status());
        assert_eq!(health.state, HealthState::Healthy);
        assert!(health.reasons.is_empty(), "{health:?}");
    }

    #[test]
    fn usage_over_the_warning_threshold_is_a_warning() {
        let mut status = healthy_status();
        status.used_percent = 94.6;
        status.usage_warning_percent = 90;
        let health = pool_health(&status);
        assert_eq!(health.state, HealthState::Warning);
        assert_eq!(
            health.reasons[0].text,
            "94.6% used, above the 90% warning: trim, delete or add capacity"
        );
    }

    #[test]
    fn the_worst_reason_decides_the_state() {
        let mut status = healthy_status();
        status.usage_warning_percent = 80;
        status.failed = Some("I/O error".to_string());
        status.integrity.lost_batches = 2;
        let health = pool_health(&status);
        assert_eq!(health.state, HealthState::Failed);
        assert_eq!(health.reasons.len(), 3, "{health:?}");
    }
}
