//! From front-end load to drives: the device operations each redundancy scheme
//! costs per client operation, what one drive delivers at the latency target, and
//! the drive count with its rounding, layout minimum and spares.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::convert::saturating_u64;

/// How the pool protects data, which sets the device operations per client write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "scheme", rename_all = "kebab-case")]
pub enum Redundancy {
    Raid10,
    Raid5,
    Raid6,
    /// lamina's log-structured RAID-6: every write is part of a full stripe of
    /// `data_device_count` data blocks and two parity blocks.
    LaminaRaid6 {
        data_device_count: u32,
    },
}

impl Redundancy {
    /// Device writes per client write. Classic RAID pays read-modify-write on small
    /// writes: RAID10 writes both mirrors (2); RAID5 reads data and parity and writes
    /// both (4); RAID6 does that for two parities (6). A full-stripe write over K data
    /// devices writes K+2 blocks for K client blocks and reads nothing.
    pub fn write_penalty(self) -> f64 {
        match self {
            Redundancy::Raid10 => 2.0,
            Redundancy::Raid5 => 4.0,
            Redundancy::Raid6 => 6.0,
            Redundancy::LaminaRaid6 { data_device_count } => {
                f64::from(data_device_count + 2) / f64::from(data_device_count)
            }
        }
    }

    /// Fewest drives the layout can be built from.
    pub fn minimum_drive_count(self) -> u64 {
        match self {
            Redundancy::Raid10 => 2,
            Redundancy::Raid5 => 3,
            Redundancy::Raid6 => 4,
            Redundancy::LaminaRaid6 { data_device_count } => u64::from(data_device_count) + 2,
        }
    }

    /// Rounds a drive count up to one the layout can use: mirrors come in pairs.
    pub fn layout_drive_count(self, drive_count: u64) -> u64 {
        let count = drive_count.max(self.minimum_drive_count());
        match self {
            Redundancy::Raid10 => count.div_ceil(2).saturating_mul(2),
            _ => count,
        }
    }
}

impl fmt::Display for Redundancy {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Redundancy::Raid10 => write!(formatter, "RAID10"),
            Redundancy::Raid5 => write!(formatter, "RAID5"),
            Redundancy::Raid6 => write!(formatter, "RAID6"),
            Redundancy::LaminaRaid6 { data_device_count } => {
                write!(
                    formatter,
                    "lamina RAID-6 ({data_device_count}+2 full stripes)"
                )
            }
        }
    }
}

impl FromStr for Redundancy {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_lowercase().as_str() {
            "raid10" => Ok(Redundancy::Raid10),
            "raid5" => Ok(Redundancy::Raid5),
            "raid6" => Ok(Redundancy::Raid6),
            other => {
                let count = other.strip_prefix("lamina-raid6:").ok_or_else(|| {
                    format!(
                        "unknown redundancy {text:?}; use raid10, raid5, raid6 or lamina-raid6:K"
                    )
                })?;
                match count.parse::<u32>() {
                    Ok(data_device_count) if (1..=64).contains(&data_device_count) => {
                        Ok(Redundancy::LaminaRaid6 { data_device_count })
                    }
                    _ => Err(format!(
                        "lamina-raid6:K needs K data devices between 1 and 64, got {count:?}"
                    )),
                }
            }
        }
    }
}

/// What one drive delivers: `rated_iops` small random operations per second with
/// a mean response time of `rated_latency_ms`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DriveModel {
    pub name: String,
    pub rated_iops: f64,
    pub rated_latency_ms: f64,
}

/// Presets: name, IOPS, latency in ms. docs/plan.md gives the reasoning for each.
pub const DRIVE_PRESETS: [(&str, f64, f64); 4] = [
    ("hdd-15k", 220.0, 20.0),
    ("hdd-10k", 165.0, 20.0),
    ("hdd-7k", 95.0, 20.0),
    ("ssd", 20_000.0, 1.0),
];

impl DriveModel {
    /// Effective service time of a single-queue (M/M/1) model calibrated so that it
    /// passes through the rated point: R = S / (1 - X·S) gives S = 1 / (X + 1/R).
    pub fn service_time_ms(&self) -> f64 {
        1.0 / (self.rated_iops / 1000.0 + 1.0 / self.rated_latency_ms)
    }

    /// Operations per second the drive sustains with mean response time `target_ms`
    /// (the rated figure exactly when the target equals the rated latency; zero when
    /// even an idle drive is slower than the target).
    pub fn iops_at_latency(&self, target_ms: f64) -> f64 {
        if (target_ms - self.rated_latency_ms).abs() < 1e-9 {
            return self.rated_iops;
        }
        let service_ms = self.service_time_ms();
        ((1.0 / service_ms - 1.0 / target_ms) * 1000.0).max(0.0)
    }

    /// Mean response time at `iops` per drive, or `None` past saturation.
    pub fn latency_at_iops(&self, iops: f64) -> Option<f64> {
        let service_ms = self.service_time_ms();
        let utilisation = iops * service_ms / 1000.0;
        (utilisation < 1.0).then(|| service_ms / (1.0 - utilisation))
    }

    /// The most a drive does at any latency in this model.
    pub fn saturation_iops(&self) -> f64 {
        1000.0 / self.service_time_ms()
    }
}

impl FromStr for DriveModel {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let lower = text.to_ascii_lowercase();
        if let Some((name, iops, latency)) = DRIVE_PRESETS.iter().find(|preset| preset.0 == lower) {
            return Ok(DriveModel {
                name: name.to_string(),
                rated_iops: *iops,
                rated_latency_ms: *latency,
            });
        }
        let usage = || {
            format!(
                "unknown drive {text:?}; use hdd-15k, hdd-10k, hdd-7k, ssd or custom:IOPS@LATENCY_MS"
            )
        };
        let custom = lower.strip_prefix("custom:").ok_or_else(usage)?;
        let (iops, latency) = custom.split_once('@').ok_or_else(usage)?;
        let iops: f64 = iops.trim().parse().map_err(|_| usage())?;
        let latency: f64 = latency
            .trim()
            .trim_end_matches("ms")
            .parse()
            .map_err(|_| usage())?;
        if !(iops.is_finite() && iops > 0.0 && latency.is_finite() && latency > 0.0) {
            return Err(format!(
                "custom drive needs positive IOPS and latency, got {text:?}"
            ));
        }
        Ok(DriveModel {
            name: format!("custom {iops}@{latency}ms"),
            rated_iops: iops,
            rated_latency_ms: latency,
        })
    }
}

/// Rounds up, forgiving the last bits of floating-point error (13.0000000001 is 13).
pub fn ceil_count(value: f64) -> u64 {
    const TOLERANCE: f64 = 1e-9;
    saturating_u64((value - TOLERANCE).ceil())
}

/// The back-end load and drive count for one front-end load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BackendSizing {
    pub front_end_read_iops: f64,
    pub front_end_write_iops: f64,
    pub front_end_iops: f64,
    /// Fraction of reads served by flash (0 without flash).
    pub read_hit_ratio: f64,
    /// Reads that reach the drives.
    pub backend_read_iops: f64,
    pub write_penalty: f64,
    pub backend_write_iops: f64,
    pub backend_iops: f64,
    /// Back-end load over front-end load, minus one, in percent.
    pub backend_increase_percent: f64,
    pub drive_iops: f64,
    /// Front-end load over one drive, unrounded and rounded up.
    pub drives_before_redundancy_exact: f64,
    pub drives_before_redundancy: u64,
    /// Back-end load over one drive, unrounded and rounded up.
    pub drives_after_redundancy_exact: f64,
    pub drives_after_redundancy: u64,
    /// After the layout's minimum and pairing rules.
    pub working_drives: u64,
    pub spare_drives: u64,
    pub total_drives: u64,
}

/// Sizes the drives for a front-end load under a redundancy scheme.
pub fn size_backend(
    read_iops: f64,
    write_iops: f64,
    read_hit_ratio: f64,
    redundancy: Redundancy,
    drive_iops: f64,
    spare_drives: u64,
) -> BackendSizing {
    assert!(drive_iops > 0.0, "drive IOPS must be positive");
    assert!((0.0..=1.0).contains(&read_hit_ratio));
    let front_end_iops = read_iops + write_iops;
    let backend_read_iops = read_iops * (1.0 - read_hit_ratio);
    let write_penalty = redundancy.write_penalty();
    let backend_write_iops = write_iops * write_penalty;
    let backend_iops = backend_read_iops + backend_write_iops;
    let drives_before_redundancy_exact = front_end_iops / drive_iops;
    let drives_after_redundancy_exact = backend_iops / drive_iops;
    let drives_after_redundancy = ceil_count(drives_after_redundancy_exact);
    let working_drives = redundancy.layout_drive_count(drives_after_redundancy);
    BackendSizing {
        front_end_read_iops: read_iops,
        front_end_write_iops: write_iops,
        front_end_iops,
        read_hit_ratio,
        backend_read_iops,
        write_penalty,
        backend_write_iops,
        backend_iops,
        backend_increase_percent: if front_end_iops > 0.0 {
            (backend_iops / front_end_iops - 1.0) * 100.0
        } else {
            0.0
        },
        drive_iops,
        drives_before_redundancy_exact,
        drives_before_redundancy: ceil_count(drives_before_redundancy_exact),
        drives_after_redundancy_exact,
        drives_after_redundancy,
        working_drives,
        spare_drives,
        total_drives: working_drives.saturating_add(spare_drives),
    }
}

/// How a proposed number of working drives compares with the sizing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProposalCheck {
    pub proposed_working_drives: u64,
    pub needed_working_drives: u64,
    pub under_sized: bool,
    /// Back-end operations each proposed drive would carry at the steady state.
    pub iops_per_drive: f64,
    /// Mean response time the model predicts for that load, `None` past saturation.
    pub predicted_latency_ms: Option<f64>,
    /// Steady front-end load the proposal carries within the latency target.
    pub supported_front_end_iops: f64,
    /// Whether the proposal is enough once the planned flash is in front.
    pub enough_with_flash: Option<bool>,
}

pub fn check_proposal(
    proposed_working_drives: u64,
    sizing: &BackendSizing,
    with_flash: Option<&BackendSizing>,
    drive: &DriveModel,
) -> ProposalCheck {
    let iops_per_drive = if proposed_working_drives > 0 {
        sizing.backend_iops / proposed_working_drives as f64
    } else {
        f64::INFINITY
    };
    let backend_per_front_end = if sizing.front_end_iops > 0.0 {
        sizing.backend_iops / sizing.front_end_iops
    } else {
        1.0
    };
    ProposalCheck {
        proposed_working_drives,
        needed_working_drives: sizing.working_drives,
        under_sized: proposed_working_drives < sizing.working_drives,
        iops_per_drive,
        predicted_latency_ms: drive.latency_at_iops(iops_per_drive),
        supported_front_end_iops: proposed_working_drives as f64 * sizing.drive_iops
            / backend_per_front_end,
        enough_with_flash: with_flash.map(|flash| proposed_working_drives >= flash.working_drives),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_penalties_follow_the_schemes() {
        assert_eq!(Redundancy::Raid10.write_penalty(), 2.0);
        assert_eq!(Redundancy::Raid5.write_penalty(), 4.0);
        assert_eq!(Redundancy::Raid6.write_penalty(), 6.0);
        let lamina: Redundancy = "lamina-raid6:8".parse().unwrap();
        assert_eq!(lamina.write_penalty(), 10.0 / 8.0);
        assert!("lamina-raid6:0".parse::<Redundancy>().is_err());
        assert!("raid7".parse::<Redundancy>().is_err());
    }

    #[test]
    fn layouts_round_to_usable_drive_counts() {
        assert_eq!(Redundancy::Raid10.layout_drive_count(21), 22);
        assert_eq!(Redundancy::Raid5.layout_drive_count(2), 3);
        assert_eq!(Redundancy::Raid5.layout_drive_count(21), 21);
        let lamina: Redundancy = "lamina-raid6:8".parse().unwrap();
        assert_eq!(lamina.layout_drive_count(4), 10);
    }

    #[test]
    fn drive_model_passes_through_its_rated_point() {
        let drive: DriveModel = "hdd-15k".parse().unwrap();
        assert_eq!(drive.iops_at_latency(20.0), 220.0);
        assert!((drive.latency_at_iops(220.0).unwrap() - 20.0).abs() < 1e-9);
        // A tighter target leaves fewer operations, a looser one more, never past saturation.
        assert!(drive.iops_at_latency(10.0) < 220.0);
        assert!(drive.iops_at_latency(50.0) > 220.0);
        assert!(drive.iops_at_latency(50.0) < drive.saturation_iops());
        assert_eq!(drive.iops_at_latency(drive.service_time_ms() / 2.0), 0.0);
        let custom: DriveModel = "custom:300@15".parse().unwrap();
        assert_eq!(custom.iops_at_latency(15.0), 300.0);
        assert!("custom:300".parse::<DriveModel>().is_err());
        assert!("custom:-3@5".parse::<DriveModel>().is_err());
    }

    #[test]
    fn counts_round_up_without_floating_point_surprises() {
        assert_eq!(ceil_count(13.636), 14);
        assert_eq!(ceil_count(13.0 + 1e-12), 13);
        assert_eq!(ceil_count(0.0), 0);
    }
}
