//! The cleaner and placement limits the cleaner benchmarks vary (the engine's
//! `cleaner_latency` example and lamina-model's `engine_write_amplification`, which
//! includes this file by path: the two crates cannot share a module otherwise).

use clap::{Args, ValueEnum};
use lamina_engine::PoolLimits;
use serde::Serialize;

/// An on/off command-line switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Switch {
    On,
    Off,
}

/// The cleaner and placement limits the cleaner benchmarks vary; unset ones keep
/// the engine's defaults.
#[derive(Debug, Clone, Args)]
pub struct CleanerOptions {
    /// Pace relocation by client writes (off: the cleaner relocates without limit).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub paced_cleaner: Switch,
    /// Relocated blocks allowed per client block while pacing.
    #[arg(long)]
    pub relocation_ratio: Option<f64>,
    /// Free segments below which the cleaner runs.
    #[arg(long)]
    pub cleaner_headroom: Option<usize>,
    /// Separate client writes by expected lifespan.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub separate_client_writes: Switch,
    /// Segment count from which relocations are separated by data age.
    #[arg(long)]
    pub relocation_streams_by_age_from: Option<u64>,
}

impl CleanerOptions {
    /// `limits` with these options applied.
    pub fn apply(&self, mut limits: PoolLimits) -> PoolLimits {
        if let Some(ratio) = self.relocation_ratio {
            limits.cleaner_relocation_blocks_per_client_block_max = ratio;
        }
        if self.paced_cleaner == Switch::Off {
            limits.cleaner_relocation_blocks_per_client_block_max = 0.0;
        }
        if let Some(headroom) = self.cleaner_headroom {
            limits.cleaner_headroom_segment_count = headroom;
        }
        limits.separate_client_writes_by_lifespan = self.separate_client_writes == Switch::On;
        if let Some(segment_count) = self.relocation_streams_by_age_from {
            limits.relocation_streams_by_age_segment_count_min = segment_count;
        }
        limits
    }
}
