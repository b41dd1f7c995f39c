//! The pool's devices when a tier is an array (`lamina_layout`): the arrays
//! the pool runs on, kept beside the pool so that `pool status`, `/metrics`
//! and the device commands can show and act on each device. A pool on one
//! device per tier has no layout.

use std::sync::Arc;

use lamina_api as api;
use lamina_layout::{ArrayState, RedundantArray, TierRole};

use crate::exposition::{Exposition, Label, label};

/// One tier's array.
#[derive(Clone, Debug)]
pub struct TierArray {
    pub tier: TierRole,
    pub array: Arc<RedundantArray>,
}

/// The arrays of a pool, flash first (empty for a pool on plain devices).
#[derive(Clone, Debug, Default)]
pub struct PoolLayout {
    tiers: Vec<TierArray>,
    /// The capacity tier on object storage, when the pool has one.
    object_tier: Option<crate::object_tier::ObjectTier>,
}

impl PoolLayout {
    pub fn new(tiers: Vec<TierArray>) -> Self {
        Self {
            tiers,
            object_tier: None,
        }
    }

    /// A pool on plain devices whose capacity tier is on object storage.
    pub fn with_object_tier(object_tier: crate::object_tier::ObjectTier) -> Self {
        Self {
            tiers: Vec::new(),
            object_tier: Some(object_tier),
        }
    }

    pub fn object_tier(&self) -> Option<&crate::object_tier::ObjectTier> {
        self.object_tier.as_ref()
    }

    pub fn tiers(&self) -> &[TierArray] {
        &self.tiers
    }

    /// The worst of the tiers' states.
    pub fn state(&self) -> Option<ArrayState> {
        let rank = |state: ArrayState| match state {
            ArrayState::Online => 0,
            ArrayState::Degraded => 1,
            ArrayState::Faulted => 2,
        };
        self.tiers
            .iter()
            .map(|tier| tier.array.state())
            .max_by_key(|state| rank(*state))
    }

    /// `pool status`'s layout section.
    pub fn status(&self) -> Option<api::LayoutStatus> {
        let state = self.state()?;
        let tiers = self.tiers.iter().map(tier_status).collect();
        Some(api::LayoutStatus {
            state: state.name().to_string(),
            tiers,
        })
    }

    /// Per-device series in the Prometheus text format, after the object
    /// tier's.
    pub fn metrics(&self, exposition: &mut Exposition) {
        if let Some(object_tier) = &self.object_tier {
            object_tier.metrics(exposition);
        }
        let Some(status) = self.status() else {
            return;
        };
        let devices: Vec<&api::DeviceStatus> = status
            .tiers
            .iter()
            .flat_map(|tier| tier.devices.iter())
            .collect();
        type Field = fn(&api::DeviceStatus) -> u64;
        let counters: [(&str, &str, Field); 5] = [
            (
                "lamina_device_read_bytes_total",
                "Bytes read from the device since the pool opened.",
                |device| device.bytes_read,
            ),
            (
                "lamina_device_written_bytes_total",
                "Bytes written to the device since the pool opened.",
                |device| device.bytes_written,
            ),
            (
                "lamina_device_io_errors_total",
                "I/O errors of the device since the pool opened (the first faults it).",
                |device| device.io_errors,
            ),
            (
                "lamina_device_checksum_errors_repaired_total",
                "Blocks of the device that failed their checksum and were rewritten from redundancy.",
                |device| device.checksum_errors_repaired,
            ),
            (
                "lamina_device_parity_repaired_total",
                "Parity columns and metadata copies of the device that a scrub found disagreeing with their row and rewrote.",
                |device| device.parity_repaired,
            ),
        ];
        for (name, help, field) in counters {
            let mut family = exposition.counter(name, help);
            for device in &devices {
                let index = device.index.to_string();
                family.sample(&device_labels(device, &index), field(device));
            }
        }
        let mut online = exposition.gauge(
            "lamina_device_online",
            "1 while the device is in use (online or degraded), 0 when faulted or missing.",
        );
        for device in &devices {
            let index = device.index.to_string();
            let in_use = matches!(device.state.as_str(), "online" | "degraded");
            online.sample(&device_labels(device, &index), in_use);
        }
        let degraded = match status.state.as_str() {
            "online" => 0u64,
            "degraded" => 1,
            _ => 2,
        };
        exposition
            .gauge(
                "lamina_pool_degraded",
                "0 online, 1 degraded (devices lost within the redundancy), 2 faulted.",
            )
            .sample(&[], degraded);
    }
}

/// A device's labels: its tier, index (`index`, as text), path and state.
fn device_labels<'a>(device: &'a api::DeviceStatus, index: &'a str) -> [Label<'a>; 4] {
    [
        label("tier", &device.tier),
        label("index", index),
        label("path", &device.path),
        label("state", &device.state),
    ]
}

fn tier_status(tier: &TierArray) -> api::TierLayoutStatus {
    let geometry = tier.array.geometry();
    let devices = tier
        .array
        .member_status()
        .into_iter()
        .map(|member| api::DeviceStatus {
            path: member.path,
            tier: tier.tier.name().to_string(),
            index: member.index,
            state: member.state.name().to_string(),
            bytes_read: member.bytes_read,
            bytes_written: member.bytes_written,
            io_errors: member.io_errors,
            checksum_errors_repaired: member.checksum_errors_repaired,
            parity_repaired: member.parity_repaired,
            replacement: member.replacement.map(|replacement| replacement.path),
            unfit: member.unfit,
        })
        .collect();
    api::TierLayoutStatus {
        tier: tier.tier.name().to_string(),
        redundancy: geometry.redundancy.name().to_string(),
        state: tier.array.state().name().to_string(),
        parity_devices: geometry.parity_columns(),
        devices,
    }
}
