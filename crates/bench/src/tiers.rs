//! `lamina bench tiers`: what the flash tier buys in front of a capacity disk, in
//! one run, as latency-versus-load curves and a reaction time (issue 7).
//!
//! Three lamina pools are measured one after the other, each by its own daemon on
//! files in a private directory: **all-flash** (one tier on a plain file), **flash +
//! disk** (a small flash file in front of a capacity file behind the 7,200 rpm disk
//! model) and **disk** (one tier on the modelled disk alone). Each holds the same
//! volume of random data, larger than the two-tier pool's flash, and is measured for
//! a working set smaller than that flash and one larger: open-loop Poisson random
//! 4 KiB reads at a ladder of offered loads common to all three (so the curves can
//! be compared load by load), stopping at the first step that does not keep up. The
//! two-tier pool is warmed up first (sequential passes, which the ghost admission
//! promotes from the second read on, then a random probe) until its working set is
//! served from flash or stops improving, and every step records where its reads
//! came from (`lamina volume stats`).
//!
//! Reaction: a second volume, written first and left idle while the first is
//! measured, is fully demoted in the two-tier pool; it is then read at a fixed rate
//! with fio's per-I/O latency log, and the reaction time is when the p99 of sliding
//! 1 s windows comes (and stays) within 2 × the p99 of the same load on the same
//! volume of the all-flash pool measured in the same run.

use std::path::Path;
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;

use crate::convert::saturating_u64;
use crate::fio::{Measurement, Pattern, StepSpec, sequential_pass};
use crate::harness::arguments::{CommonArgs, Draw};
use crate::harness::statistics::median_if_any;
use crate::harness::table::Table;
use crate::lamina_cli::{LaminaCli, ServedPool};
pub use crate::latency_log::Window;
use crate::latency_log::{LatencyLog, percentile_us, sliding_windows};
use crate::process::check_interrupted;
use crate::report::{RunNotes, format_number, ratio};
use crate::runner::{RoundPlan, each_round};
use crate::servers::{prefill_over_nbd, write_random_data};
use crate::workload::{Headline, Mix, Point, RateSweepControl, headline};
use lamina_api::size::parse_size;
use lamina_api::{PoolStatus, VolumeTierCounters, VolumeTierStats};

/// The reaction goal of issue 7, in seconds.
pub const REACTION_GOAL_SECONDS: f64 = 10.0;

/// A reaction window is "within" when its p99 is at most this multiple of the
/// all-flash p99.
pub const REACTION_BOUND_FACTOR: f64 = 2.0;

/// Length and stride of the sliding windows of the reaction.
pub const REACTION_WINDOW_MS: u64 = 1_000;
pub const REACTION_WINDOW_STRIDE_MS: u64 = 100;

/// The all-flash reference run of the reaction lasts at most this long.
const REFERENCE_SECONDS_MAX: u64 = 20;

/// Offered loads of the curves, common to every pool: multiples of 4 (so that four
/// Poisson streams share them evenly), dense where a modelled disk saturates (about
/// 100–250 random reads per second), then doubling up to what flash sustains here.
pub const DEFAULT_RATE_TARGETS: [u64; 14] = [
    20, 40, 80, 120, 160, 240, 320, 640, 1_280, 2_560, 5_120, 10_240, 20_480, 40_960,
];

/// The offered loads of `--quick`.
const QUICK_RATE_TARGETS: [u64; 2] = [40, 80];

/// A step is saturated when fio's queue was full more than this share of the time.
const SATURATION_FULL_QUEUE_PERCENT: f64 = 5.0;

/// A step is saturated when it completed fewer I/Os than this share of the offered
/// ones, or fewer than three standard deviations of a Poisson count below the
/// offered count, whichever is lower: at 20 I/Os per second for 10 s a Poisson
/// stream falls below 95 % of its mean one time in five by chance alone.
const SATURATION_ACHIEVED_SHARE: f64 = 0.95;
const SATURATION_POISSON_DEVIATIONS: f64 = 3.0;

/// The warm-up's sequential passes: large reads, so that the disk streams.
const WARMUP_PASS_IODEPTH: u32 = 4;
/// The warm-up's random probe (closed loop) after each pass.
const WARMUP_PROBE_IODEPTH: u32 = 16;
/// The warm-up ends when the probe reads less than this share from capacity...
const WARMUP_TARGET_CAPACITY_SHARE: f64 = 0.01;
/// ...or when the share improved by less than this fraction since the last round.
const WARMUP_IMPROVEMENT_MIN: f64 = 0.1;
/// Rounds that always run: the first pass only records blocks in the ghost queue.
const WARMUP_ROUNDS_MIN: u32 = 2;

/// How often and how long the reaction volume's demotion is waited for.
const DEMOTION_POLL_INTERVAL_MS: u64 = 250;
const DEMOTION_TIMEOUT_MS: u64 = 60_000;
/// The reaction volume counts as demoted when at most this share of it is on flash.
const DEMOTED_FLASH_SHARE_MAX: f64 = 0.01;

/// The volume the curves read and the one the reaction reads.
pub const BENCH_VOLUME: &str = "bench";
pub const REACTION_VOLUME: &str = "react";

/// The device model of the modelled disk (`lamina pool create --*-model`).
pub const DISK_MODEL: &str = "hdd-7200";

/// The three pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TierConfig {
    /// One tier on a plain file.
    AllFlash,
    /// A flash file in front of a capacity file on the 7,200 rpm disk model.
    FlashDisk,
    /// One tier on the 7,200 rpm disk model.
    Disk,
}

impl TierConfig {
    /// The name of tables and plots.
    pub fn name(self) -> &'static str {
        match self {
            TierConfig::AllFlash => "all-flash",
            TierConfig::FlashDisk => "flash+disk",
            TierConfig::Disk => "disk",
        }
    }

    /// Every pool, the reference first.
    pub fn all() -> Vec<TierConfig> {
        vec![
            TierConfig::AllFlash,
            TierConfig::FlashDisk,
            TierConfig::Disk,
        ]
    }
}

/// Which working set a curve reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkingSet {
    /// Smaller than the two-tier pool's flash.
    Small,
    /// Larger than the two-tier pool's flash.
    Large,
}

impl WorkingSet {
    pub fn name(self) -> &'static str {
        match self {
            WorkingSet::Small => "ws<flash",
            WorkingSet::Large => "ws>flash",
        }
    }
}

/// Cache priority of the measured volumes in the two-tier pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Priority {
    High,
    Normal,
    Low,
    /// Never promoted.
    #[value(name = "none")]
    #[serde(rename = "none")]
    NoCache,
}

impl Priority {
    fn name(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
            Priority::NoCache => "none",
        }
    }
}

/// Arguments of `lamina bench tiers`.
#[derive(Debug, Clone, Args)]
pub struct TiersArgs {
    #[command(flatten)]
    pub settings: TiersSettings,
    /// Offered loads in IOPS, comma-separated (default: 20, 40, 80 … 40,960).
    #[arg(long, value_delimiter = ',')]
    pub rate_targets: Option<Vec<u64>>,
    /// The reaction volume's size, all of it the working set.
    #[arg(long, value_parser = parse_size, default_value = "16M")]
    pub reaction_working_set: u64,
    /// Skip the reaction measurement.
    #[arg(long)]
    pub no_reaction: bool,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// The settings a run used (after `--quick`), as recorded in the report: the
/// options that say what is measured, under the JSON document's field names.
#[derive(Debug, Clone, PartialEq, Serialize, Args)]
pub struct TiersSettings {
    /// Pools to measure, in order (all-flash is the reference of every ratio).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = TierConfig::all())]
    pub configs: Vec<TierConfig>,
    /// Flash of the two-tier pool (the file's size, metadata included).
    #[arg(long = "flash-size", value_name = "FLASH_SIZE", value_parser = parse_size, default_value = "256M")]
    pub flash_size_bytes: u64,
    /// The working set smaller than flash (read from offset 0 of the volume).
    #[arg(long = "small-working-set", value_name = "SMALL_WORKING_SET", value_parser = parse_size, default_value = "64M")]
    pub small_working_set_bytes: u64,
    /// The working set larger than flash.
    #[arg(long = "large-working-set", value_name = "LARGE_WORKING_SET", value_parser = parse_size, default_value = "512M")]
    pub large_working_set_bytes: u64,
    /// The measured volume, fully written with random data (larger than flash, so
    /// that the two-tier pool must demote).
    #[arg(long = "volume-size", value_name = "VOLUME_SIZE", value_parser = parse_size, default_value = "768M")]
    pub volume_size_bytes: u64,
    /// The all-flash file, the two-tier pool's capacity file and the modelled disk.
    #[arg(long = "device-size", value_name = "DEVICE_SIZE", value_parser = parse_size, default_value = "2G")]
    pub device_size_bytes: u64,
    /// Segment size of every pool (default: lamina's).
    #[arg(long = "segment-size", value_name = "SEGMENT_SIZE", value_parser = parse_size)]
    pub segment_size_bytes: Option<u64>,
    /// lamina's memory block cache (`[limits] memory_cache_bytes`); 0 so that reads
    /// reach the tiers measured.
    #[arg(long = "memory-cache", value_name = "MEMORY_CACHE", value_parser = parse_size, default_value = "0")]
    pub memory_cache_bytes: u64,
    /// The 4 KiB mix of the curves and the reaction.
    #[arg(long, value_enum, default_value_t = Mix::Randread4k)]
    pub mix: Mix,
    /// `--rate-targets`, else the default ladder (`--quick`: its own).
    #[arg(skip)]
    pub rate_targets: Vec<u64>,
    /// Poisson streams (fio jobs, one NBD connection each).
    #[arg(long, default_value_t = 4)]
    pub rate_jobs: u32,
    /// Queue depth per stream: deep, so arrivals rarely wait for a slot.
    #[arg(long, default_value_t = 64)]
    pub rate_iodepth: u32,
    /// Seconds measured per step.
    #[arg(long = "runtime", value_name = "RUNTIME", default_value_t = 10)]
    pub runtime_seconds: u64,
    /// Seconds run before measuring, per step.
    #[arg(long = "ramp", value_name = "RAMP", default_value_t = 1)]
    pub ramp_seconds: u64,
    /// The p99 objective of the headline figure, in microseconds.
    #[arg(long, default_value_t = 1000.0)]
    pub slo_us: f64,
    /// Cache priority of both volumes in the two-tier pool.
    #[arg(long, value_enum, default_value_t = Priority::Normal)]
    pub priority: Priority,
    #[arg(skip = DISK_MODEL.to_owned())]
    pub disk_model: String,
    /// `--reaction-working-set`; None when the reaction is skipped.
    #[arg(skip)]
    pub reaction_working_set_bytes: Option<u64>,
    /// Offered load of the reaction, in IOPS.
    #[arg(
        long = "reaction-rate",
        value_name = "REACTION_RATE",
        default_value_t = 500
    )]
    pub reaction_rate_iops: u64,
    /// Length of the reaction run, in seconds.
    #[arg(long, default_value_t = 60)]
    pub reaction_seconds: u64,
    /// Longest warm-up of the two-tier pool per working set, in seconds.
    #[arg(long, default_value_t = 180)]
    pub warmup_max_seconds: u64,
    /// Seconds of the random probe after each warm-up pass.
    #[arg(long, default_value_t = 3)]
    pub warmup_probe_seconds: u64,
    /// Tiny sizes and 1-second steps: checks that everything works, measures nothing.
    #[arg(long)]
    pub quick: bool,
}

impl TiersSettings {
    /// The settings of `arguments`, with `--quick`'s sizes and times.
    pub fn from_arguments(arguments: &TiersArgs) -> Self {
        let mut settings = Self {
            rate_targets: arguments
                .rate_targets
                .clone()
                .unwrap_or_else(|| DEFAULT_RATE_TARGETS.to_vec()),
            reaction_working_set_bytes: (!arguments.no_reaction)
                .then_some(arguments.reaction_working_set),
            ..arguments.settings.clone()
        };
        if settings.quick {
            // 4 MiB of the flash file are metadata: 8 MiB hold data.
            settings.flash_size_bytes = 12 << 20;
            settings.small_working_set_bytes = 2 << 20;
            settings.large_working_set_bytes = 16 << 20;
            settings.volume_size_bytes = 16 << 20;
            settings.device_size_bytes = 64 << 20;
            settings.segment_size_bytes = Some(256 << 10);
            if arguments.rate_targets.is_none() {
                settings.rate_targets = QUICK_RATE_TARGETS.to_vec();
            }
            settings.rate_jobs = settings.rate_jobs.min(2);
            settings.rate_iodepth = settings.rate_iodepth.min(16);
            settings.runtime_seconds = 1;
            settings.ramp_seconds = 0;
            settings.reaction_working_set_bytes =
                settings.reaction_working_set_bytes.map(|_| 1 << 20);
            settings.reaction_rate_iops = 80;
            settings.reaction_seconds = 2;
            settings.warmup_max_seconds = 2;
            settings.warmup_probe_seconds = 1;
        }
        settings
    }

    fn working_set_bytes(&self, working_set: WorkingSet) -> u64 {
        match working_set {
            WorkingSet::Small => self.small_working_set_bytes,
            WorkingSet::Large => self.large_working_set_bytes,
        }
    }

    /// Sizes that would make the comparison meaningless are refused up front.
    fn check(&self) -> anyhow::Result<()> {
        let block = 4096;
        for (name, value) in [
            ("--flash-size", self.flash_size_bytes),
            ("--small-working-set", self.small_working_set_bytes),
            ("--large-working-set", self.large_working_set_bytes),
            ("--volume-size", self.volume_size_bytes),
            ("--device-size", self.device_size_bytes),
        ] {
            if value == 0 || value % block != 0 {
                anyhow::bail!("{name} must be a positive multiple of 4 KiB");
            }
        }
        if self.small_working_set_bytes >= self.flash_size_bytes {
            anyhow::bail!("the small working set must be smaller than --flash-size");
        }
        if self.large_working_set_bytes <= self.flash_size_bytes {
            anyhow::bail!("the large working set must be larger than --flash-size");
        }
        if self.volume_size_bytes < self.large_working_set_bytes {
            anyhow::bail!("--volume-size must hold the large working set");
        }
        if self.device_size_bytes < self.volume_size_bytes * 2 {
            anyhow::bail!("--device-size must be at least twice --volume-size (log free space)");
        }
        if self.rate_targets.is_empty() || self.rate_jobs == 0 || self.rate_iodepth == 0 {
            anyhow::bail!("rate targets, --rate-jobs and --rate-iodepth must be positive");
        }
        if self.runtime_seconds == 0 || self.reaction_seconds == 0 {
            anyhow::bail!("--runtime and --reaction-seconds must be positive");
        }
        Ok(())
    }

    /// The offered load fio really runs: a whole number of I/Os per second per job.
    fn effective_rate(&self, target_iops: u64) -> u64 {
        let jobs = u64::from(self.rate_jobs);
        (target_iops / jobs).max(1) * jobs
    }

    fn rate_step(&self, region_bytes: u64, target_iops: u64, runtime_seconds: u64) -> StepSpec {
        StepSpec {
            pattern: self.mix.pattern(),
            block_size_bytes: 4096,
            iodepth: self.rate_iodepth,
            jobs: self.rate_jobs,
            target_iops: Some(self.effective_rate(target_iops)),
            runtime_seconds,
            ramp_seconds: self.ramp_seconds,
            region_bytes,
        }
    }
}

/// Where a volume's block reads were served from, and what moved, over a span of
/// time (deltas of `lamina volume stats`; counted in two-tier pools only).
pub type ReadSources = VolumeTierCounters;

/// The deltas and shares of [`ReadSources`].
pub trait ReadShares {
    /// The counts since `earlier`.
    fn since(self, earlier: Self) -> Self;
    /// Share of block reads served by the capacity tier; None when nothing was counted.
    fn capacity_share(&self) -> Option<f64>;
}

impl ReadShares for ReadSources {
    fn since(self, earlier: ReadSources) -> ReadSources {
        let delta = |later: u64, earlier: u64| later.saturating_sub(earlier);
        ReadSources {
            memory_read_blocks: delta(self.memory_read_blocks, earlier.memory_read_blocks),
            flash_read_blocks: delta(self.flash_read_blocks, earlier.flash_read_blocks),
            capacity_read_blocks: delta(self.capacity_read_blocks, earlier.capacity_read_blocks),
            promoted_blocks: delta(self.promoted_blocks, earlier.promoted_blocks),
            demoted_blocks: delta(self.demoted_blocks, earlier.demoted_blocks),
        }
    }

    fn capacity_share(&self) -> Option<f64> {
        let total = self.memory_read_blocks + self.flash_read_blocks + self.capacity_read_blocks;
        (total > 0).then(|| self.capacity_read_blocks as f64 / total as f64)
    }
}

/// What `lamina volume stats NAME --json` says about where a volume lives.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Placement {
    pub flash_bytes: u64,
    pub capacity_bytes: u64,
    pub reads: ReadSources,
}

impl Placement {
    fn from_stats(stats: &VolumeTierStats) -> Self {
        Self {
            flash_bytes: stats.flash_bytes,
            capacity_bytes: stats.capacity_bytes,
            reads: stats.counters,
        }
    }
}

/// One step of a curve, with where its reads came from (ramp included).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierPoint {
    #[serde(flatten)]
    pub point: Point,
    pub reads: Option<ReadSources>,
}

/// One round of the two-tier warm-up: a sequential pass, then a random probe.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarmupRound {
    pub round: u32,
    pub pass_seconds: f64,
    pub promoted_blocks: u64,
    pub demoted_blocks: u64,
    pub probe_iops: f64,
    /// Share of the probe's reads served by capacity.
    pub probe_capacity_share: Option<f64>,
}

/// How a working set was brought onto flash before its curve.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Warmup {
    pub seconds: f64,
    pub rounds: Vec<WarmupRound>,
    /// Why it stopped.
    pub outcome: String,
}

/// One latency-versus-load curve.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Curve {
    pub config: TierConfig,
    pub working_set: WorkingSet,
    pub working_set_bytes: u64,
    pub warmup: Option<Warmup>,
    pub points: Vec<TierPoint>,
    pub headline: Headline,
    /// Highest achieved IOPS of an unsaturated step.
    pub peak_unsaturated_iops: Option<f64>,
}

impl Curve {
    /// A curve of `points`, with its headline and its highest unsaturated IOPS.
    fn new(
        config: TierConfig,
        working_set: WorkingSet,
        working_set_bytes: u64,
        warmup: Option<Warmup>,
        points: Vec<TierPoint>,
        slo_us: f64,
    ) -> Self {
        let plain: Vec<Point> = points.iter().map(|point| point.point.clone()).collect();
        Self {
            config,
            working_set,
            working_set_bytes,
            warmup,
            headline: headline(&plain, slo_us),
            peak_unsaturated_iops: plain
                .iter()
                .filter(|point| !point.saturated)
                .map(|point| point.measurement.total_iops)
                .reduce(f64::max),
            points,
        }
    }

    fn point_at(&self, target_iops: u64) -> Option<&TierPoint> {
        self.points
            .iter()
            .find(|point| point.point.target_iops == Some(target_iops) && !point.point.saturated)
    }
}

/// A pool's curves against all-flash's, at the loads both sustained.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TierComparison {
    pub config: TierConfig,
    pub working_set: WorkingSet,
    /// Offered loads at which both this pool and all-flash kept up.
    pub common_loads_iops: Vec<u64>,
    /// p99 of this pool / p99 of all-flash, load by load.
    pub p99_ratios: Vec<f64>,
    pub median_p99_ratio: Option<f64>,
    /// Highest unsaturated IOPS of this pool / of all-flash.
    pub peak_iops_ratio: Option<f64>,
}

/// The reaction of the two-tier pool to a demoted volume's working set.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Reaction {
    pub working_set_bytes: u64,
    pub rate_iops: u64,
    pub seconds: u64,
    pub priority: Priority,
    /// p99 of the whole all-flash run of the same load on the same volume.
    pub reference_p99_us: f64,
    pub reference_measurement: Measurement,
    pub reference_seconds: u64,
    /// REACTION_BOUND_FACTOR × the reference p99.
    pub bound_p99_us: f64,
    /// Where the volume was before and after the run.
    pub before: Placement,
    pub after: Placement,
    /// fio's summary of the whole two-tier run.
    pub measurement: Measurement,
    pub windows: Vec<Window>,
    /// End of the first window within the bound.
    pub first_within_seconds: Option<f64>,
    /// End of the first window from which every later window is within the bound.
    pub settled_seconds: Option<f64>,
    pub goal_seconds: f64,
    /// Whether `settled_seconds` is at most the goal.
    pub goal_met: bool,
}

/// Everything `lamina bench tiers` measured.
#[derive(Debug, Clone, Serialize)]
pub struct TiersReport {
    pub settings: TiersSettings,
    pub fio_version: String,
    pub curves: Vec<Curve>,
    pub comparisons: Vec<TierComparison>,
    pub reaction: Option<Reaction>,
    /// Why the reaction was not measured, when it was asked for.
    pub reaction_missing: Option<String>,
    /// How each server was run, the servers skipped, the machine's load.
    #[serde(flatten)]
    pub run: RunNotes,
}

/// Whether a step at `target_iops` for `runtime_seconds` failed to keep up.
pub fn is_saturated(target_iops: u64, runtime_seconds: u64, measurement: &Measurement) -> bool {
    let offered = (target_iops * runtime_seconds) as f64;
    let completed = measurement.total_iops * runtime_seconds as f64;
    let threshold = (SATURATION_ACHIEVED_SHARE * offered)
        .min(offered - SATURATION_POISSON_DEVIATIONS * offered.sqrt());
    completed < threshold || measurement.full_queue_percent > SATURATION_FULL_QUEUE_PERCENT
}

/// (first window within `bound_us`, first window from which all are within).
pub fn reaction_times(windows: &[Window], bound_us: f64) -> (Option<f64>, Option<f64>) {
    let within = |window: &Window| window.p99_us.is_some_and(|p99| p99 <= bound_us);
    let first = windows
        .iter()
        .find(|window| within(window))
        .map(|window| window.end_seconds);
    let settled = match windows.iter().rposition(|window| !within(window)) {
        None => windows.first().map(|window| window.end_seconds),
        Some(index) => windows.get(index + 1).map(|window| window.end_seconds),
    };
    (first, settled)
}

/// Each pool's curves against all-flash's, working set by working set.
pub fn comparisons(curves: &[Curve]) -> Vec<TierComparison> {
    let mut out = Vec::new();
    for working_set in [WorkingSet::Small, WorkingSet::Large] {
        let find = |config: TierConfig| {
            curves
                .iter()
                .find(|curve| curve.config == config && curve.working_set == working_set)
        };
        let Some(reference) = find(TierConfig::AllFlash) else {
            continue;
        };
        for config in [TierConfig::FlashDisk, TierConfig::Disk] {
            let Some(curve) = find(config) else {
                continue;
            };
            let mut common_loads_iops = Vec::new();
            let mut p99_ratios = Vec::new();
            for point in &curve.points {
                let Some(target) = point.point.target_iops else {
                    continue;
                };
                if point.point.saturated {
                    continue;
                }
                if let Some(reference_point) = reference.point_at(target)
                    && let Some(value) = ratio(
                        Some(point.point.measurement.p99_us),
                        Some(reference_point.point.measurement.p99_us),
                    )
                {
                    common_loads_iops.push(target);
                    p99_ratios.push(value);
                }
            }
            out.push(TierComparison {
                config,
                working_set,
                median_p99_ratio: median_if_any(&p99_ratios),
                common_loads_iops,
                p99_ratios,
                peak_iops_ratio: ratio(
                    curve.peak_unsaturated_iops,
                    reference.peak_unsaturated_iops,
                ),
            });
        }
    }
    out
}

fn mebibytes(bytes: u64) -> String {
    format!(
        "{} MiB",
        format_number(bytes as f64 / f64::from(1u32 << 20))
    )
}

/// A count with thousands separators and no decimals.
fn format_count(count: u64) -> String {
    if count < 100 {
        count.to_string()
    } else {
        format_number(count as f64)
    }
}

fn optional(value: Option<f64>, format: impl Fn(f64) -> String) -> String {
    value.map_or_else(|| "-".to_owned(), format)
}

/// One row per measured point of every curve.
fn curve_points_table<'a>() -> Table<'a, (&'a Curve, &'a TierPoint)> {
    Table::new()
        .column("pool", |(curve, _): &(&Curve, &TierPoint)| {
            curve.config.name().to_owned()
        })
        .column("working set", |(curve, _)| {
            curve.working_set.name().to_owned()
        })
        .column("offered/s", |(_, point)| {
            point
                .point
                .target_iops
                .map_or("-".to_owned(), |target| format_number(target as f64))
        })
        .column("achieved/s", |(_, point)| {
            format_number(point.point.measurement.total_iops)
        })
        .column("p50 us", |(_, point)| {
            format_number(point.point.measurement.p50_us)
        })
        .column("p99 us", |(_, point)| {
            format_number(point.point.measurement.p99_us)
        })
        .column("p99.9 us", |(_, point)| {
            format_number(point.point.measurement.p999_us)
        })
        .column("from capacity", |(_, point)| {
            optional(
                point.reads.and_then(|reads| reads.capacity_share()),
                |share| format!("{:.1}%", share * 100.0),
            )
        })
        .column("promoted", |(_, point)| {
            point
                .reads
                .map_or("-".to_owned(), |reads| format_count(reads.promoted_blocks))
        })
        .column("", |(_, point)| {
            if point.point.saturated {
                "saturated".to_owned()
            } else {
                String::new()
            }
        })
}

/// One row per curve: its headline figures and warm-up.
fn curve_summary_table<'a>() -> Table<'a, Curve> {
    Table::new()
        .column("pool", |curve: &Curve| curve.config.name().to_owned())
        .column("working set", |curve| curve.working_set.name().to_owned())
        .column("peak unsaturated IOPS", |curve| {
            optional(curve.peak_unsaturated_iops, format_number)
        })
        .column("IOPS within p99 objective", |curve| {
            optional(curve.headline.iops_within_slo, format_number)
        })
        .column("knee IOPS", |curve| {
            optional(curve.headline.knee_iops, format_number)
        })
        .column("warm-up", |curve| {
            curve.warmup.as_ref().map_or(String::new(), |warmup| {
                format!(
                    "{:.0} s, {} rounds, {}",
                    warmup.seconds,
                    warmup.rounds.len(),
                    warmup.outcome
                )
            })
        })
}

/// One row per pool and working set: its curve against all-flash's.
fn comparison_table<'a>() -> Table<'a, TierComparison> {
    Table::new()
        .column("ratio to all-flash", |comparison: &TierComparison| {
            comparison.config.name().to_owned()
        })
        .column("working set", |comparison| {
            comparison.working_set.name().to_owned()
        })
        .column("median p99 ratio", |comparison| {
            optional(comparison.median_p99_ratio, |value| format!("{value:.2}"))
        })
        .column("at loads", |comparison| {
            let loads: Vec<String> = comparison
                .common_loads_iops
                .iter()
                .map(|load| format_number(*load as f64))
                .collect();
            loads.join(" ")
        })
        .column("peak IOPS ratio", |comparison| {
            optional(comparison.peak_iops_ratio, |value| format!("{value:.3}"))
        })
}

impl Reaction {
    /// The reaction's lines of the table: the run, the bound, when it settled, what
    /// moved, the p99 at whole seconds.
    fn lines(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "\nreaction: {} volume ({} on flash, {} on capacity before), read at {}/s for {} s, priority {}\n",
            mebibytes(self.working_set_bytes),
            mebibytes(self.before.flash_bytes),
            mebibytes(self.before.capacity_bytes),
            format_number(self.rate_iops as f64),
            self.seconds,
            self.priority.name(),
        ));
        out.push_str(&format!(
            "  all-flash p99 {} us ({} s run); bound {} x = {} us\n",
            format_number(self.reference_p99_us),
            self.reference_seconds,
            REACTION_BOUND_FACTOR,
            format_number(self.bound_p99_us),
        ));
        out.push_str(&format!(
            "  first 1 s window within the bound ends at {}; every window within from {}; goal <= {} s: {}\n",
            optional(self.first_within_seconds, |value| format!("{value:.1} s")),
            optional(self.settled_seconds, |value| format!("{value:.1} s")),
            self.goal_seconds,
            if self.goal_met { "met" } else { "NOT met" },
        ));
        let reads = self.after.reads.since(self.before.reads);
        out.push_str(&format!(
            "  during the run: {} blocks promoted, {} demoted, {} of reads from capacity; after it {} on flash\n",
            format_count(reads.promoted_blocks),
            format_count(reads.demoted_blocks),
            optional(reads.capacity_share(), |share| format!("{:.1}%", share * 100.0)),
            mebibytes(self.after.flash_bytes),
        ));
        let mut timeline = Vec::new();
        for window in self
            .windows
            .iter()
            .filter(|window| saturating_u64((window.end_seconds * 10.0).round()).is_multiple_of(10))
        {
            timeline.push(format!(
                "{:.0}s:{}",
                window.end_seconds,
                optional(window.p99_us, |p99| format_number(p99 / 1_000.0) + "ms")
            ));
        }
        out.push_str(&format!(
            "  p99 per 1 s window (at whole seconds): {}\n",
            timeline.join(" ")
        ));
        out
    }
}

impl TiersReport {
    /// The human-readable tables.
    pub fn table(&self) -> String {
        let settings = &self.settings;
        let mut out = format!(
            "tiers: volume {}, working sets {} and {}, two-tier flash {}, disk model {}, {} random 4 KiB, {} Poisson streams x QD{}, {} s (+{} s ramp) per step, memory cache {}\n",
            mebibytes(settings.volume_size_bytes),
            mebibytes(settings.small_working_set_bytes),
            mebibytes(settings.large_working_set_bytes),
            mebibytes(settings.flash_size_bytes),
            settings.disk_model,
            match settings.mix {
                Mix::Randread4k => "reads",
                Mix::Randwrite4k => "writes",
                Mix::Oltp => "70/30 reads/writes",
            },
            settings.rate_jobs,
            settings.rate_iodepth,
            settings.runtime_seconds,
            settings.ramp_seconds,
            mebibytes(settings.memory_cache_bytes),
        );
        let points: Vec<(&Curve, &TierPoint)> = self
            .curves
            .iter()
            .flat_map(|curve| curve.points.iter().map(move |point| (curve, point)))
            .collect();
        out.push_str(&curve_points_table().render(&points));
        out.push('\n');
        out.push_str(&curve_summary_table().render(&self.curves));
        out.push('\n');
        out.push_str(&comparison_table().render(&self.comparisons));
        if let Some(reaction) = &self.reaction {
            out.push_str(&reaction.lines());
        }
        if let Some(reason) = &self.reaction_missing {
            out.push_str(&format!("\nreaction not measured: {reason}\n"));
        }
        out.push_str(&self.run.footer());
        out
    }
}

/// Where `volume` lives in `pool` and where its reads came from (`lamina volume stats`).
fn placement(pool: &ServedPool, volume: &str) -> anyhow::Result<Placement> {
    let stats: VolumeTierStats = pool.cli.json(&["volume", "stats", volume, "--json"])?;
    Ok(Placement::from_stats(&stats))
}

/// Creates `config`'s pool under `directory`, its volumes, starts the daemon and
/// writes the data (the reaction volume first, so that it is the oldest).
fn prepare_pool(
    settings: &TiersSettings,
    config: TierConfig,
    program: &Path,
    directory: &Path,
    bench_data: &Path,
    reaction_data: Option<&Path>,
) -> anyhow::Result<ServedPool> {
    std::fs::create_dir_all(directory)?;
    let data = directory.join("data");
    let cli = LaminaCli::new(program, &data);
    let file = |name: &str, size: u64| format!("{}:{size}", directory.join(name).display());
    let mut create: Vec<String> = vec!["pool".into(), "create".into(), "--flash".into()];
    match config {
        TierConfig::AllFlash => create.push(file("flash.img", settings.device_size_bytes)),
        TierConfig::FlashDisk => create.extend([
            file("flash.img", settings.flash_size_bytes),
            "--capacity".into(),
            file("capacity.img", settings.device_size_bytes),
            "--capacity-model".into(),
            settings.disk_model.clone(),
        ]),
        TierConfig::Disk => create.extend([
            file("disk.img", settings.device_size_bytes),
            "--flash-model".into(),
            settings.disk_model.clone(),
        ]),
    }
    if let Some(segment) = settings.segment_size_bytes {
        create.extend(["--segment-size".into(), segment.to_string()]);
    }
    let create: Vec<&str> = create.iter().map(String::as_str).collect();
    cli.run(&create)?;
    let mut volumes = Vec::new();
    if let (Some(bytes), Some(file)) = (settings.reaction_working_set_bytes, reaction_data)
        && config != TierConfig::Disk
    {
        volumes.push((REACTION_VOLUME, bytes, file));
    }
    volumes.push((BENCH_VOLUME, settings.volume_size_bytes, bench_data));
    for (name, bytes, _) in &volumes {
        let size = bytes.to_string();
        let mut arguments = vec!["volume", "create", name, "--size", &size];
        if config == TierConfig::FlashDisk {
            arguments.extend(["--priority", settings.priority.name(), "--pin", "auto"]);
        }
        cli.run(&arguments)?;
    }
    let extra_config = format!(
        "[limits]\nmemory_cache_bytes = {}\n",
        settings.memory_cache_bytes
    );
    let pool = ServedPool::serve(program, directory, &data, &extra_config, BENCH_VOLUME)?;
    for (name, bytes, file) in &volumes {
        check_interrupted()?;
        eprintln!("{}: writing {} to {name}", config.name(), mebibytes(*bytes));
        prefill_over_nbd(&pool.cli.uri(name), file)?;
    }
    Ok(pool)
}

/// Brings a two-tier pool's working set onto flash: rounds of one sequential pass
/// over it (large reads stream from the disk; from the second read on the ghost
/// queue admits each block) and a short random probe, until the probe reads (almost)
/// nothing from capacity, stops improving, or time runs out.
fn warm_up(
    settings: &TiersSettings,
    pool: &ServedPool,
    fio: &str,
    working_set_bytes: u64,
    label: &str,
) -> anyhow::Result<Warmup> {
    let started = Instant::now();
    let deadline = Duration::from_secs(settings.warmup_max_seconds);
    let mut rounds: Vec<WarmupRound> = Vec::new();
    let mut round = 0;
    let outcome = loop {
        check_interrupted()?;
        round += 1;
        let measured = warm_up_round(settings, pool, fio, working_set_bytes, round)?;
        eprintln!(
            "{label}: warm-up round {round}: pass {:.1} s, {} promoted, {} demoted, probe {} IOPS, {} from capacity",
            measured.pass_seconds,
            measured.promoted_blocks,
            measured.demoted_blocks,
            format_number(measured.probe_iops),
            optional(measured.probe_capacity_share, |share| format!(
                "{:.1}%",
                share * 100.0
            )),
        );
        let previous_share = rounds
            .last()
            .map(|previous| previous.probe_capacity_share.unwrap_or(1.0));
        let share = measured.probe_capacity_share.unwrap_or(1.0);
        rounds.push(measured);
        if round >= WARMUP_ROUNDS_MIN {
            if share <= WARMUP_TARGET_CAPACITY_SHARE {
                break "working set on flash".to_owned();
            }
            if previous_share
                .is_some_and(|previous| share > previous * (1.0 - WARMUP_IMPROVEMENT_MIN))
            {
                break format!("stopped improving at {:.1}% from capacity", share * 100.0);
            }
        }
        if started.elapsed() >= deadline {
            break format!("time limit, {:.1}% from capacity", share * 100.0);
        }
    };
    Ok(Warmup {
        seconds: started.elapsed().as_secs_f64(),
        rounds,
        outcome,
    })
}

/// One warm-up round: a sequential pass over the working set, then a random probe,
/// with what moved and where the probe's reads came from.
fn warm_up_round(
    settings: &TiersSettings,
    pool: &ServedPool,
    fio: &str,
    working_set_bytes: u64,
    round: u32,
) -> anyhow::Result<WarmupRound> {
    let uri = pool.cli.uri(BENCH_VOLUME);
    let before = placement(pool, BENCH_VOLUME)?;
    let pass_started = Instant::now();
    let pattern = Pattern::SequentialRead;
    sequential_pass(
        fio,
        &uri,
        pattern,
        working_set_bytes,
        WARMUP_PASS_IODEPTH,
        &[],
    )?;
    let pass_seconds = pass_started.elapsed().as_secs_f64();
    let middle = placement(pool, BENCH_VOLUME)?;
    let probe = StepSpec {
        pattern: Pattern::RandomRead,
        block_size_bytes: 4096,
        iodepth: WARMUP_PROBE_IODEPTH,
        jobs: 1,
        target_iops: None,
        runtime_seconds: settings.warmup_probe_seconds.max(1),
        ramp_seconds: 0,
        region_bytes: working_set_bytes,
    };
    let measurement = crate::fio::run_step(fio, &uri, &probe)?;
    let after = placement(pool, BENCH_VOLUME)?;
    let moved = after.reads.since(before.reads);
    Ok(WarmupRound {
        round,
        pass_seconds,
        promoted_blocks: moved.promoted_blocks,
        demoted_blocks: moved.demoted_blocks,
        probe_iops: measurement.total_iops,
        probe_capacity_share: after.reads.since(middle.reads).capacity_share(),
    })
}

/// One latency-versus-load curve on the bench volume's first `working_set` bytes.
fn measure_curve(
    settings: &TiersSettings,
    pool: &ServedPool,
    fio: &str,
    config: TierConfig,
    working_set: WorkingSet,
) -> anyhow::Result<Curve> {
    let working_set_bytes = settings.working_set_bytes(working_set);
    let label = format!("{} {}", config.name(), working_set.name());
    let warmup = if config == TierConfig::FlashDisk {
        Some(warm_up(settings, pool, fio, working_set_bytes, &label)?)
    } else {
        None
    };
    let mut control = RateSweepControl::from_targets(settings.rate_targets.clone());
    let mut points = Vec::new();
    while let Some(target) = control.next_target() {
        check_interrupted()?;
        // Only two-tier pools count where reads come from.
        let two_tier = config == TierConfig::FlashDisk;
        let point = rate_point(settings, pool, fio, working_set_bytes, target, two_tier)?;
        control.record(point.point.saturated);
        let measurement = &point.point.measurement;
        eprintln!(
            "{label}: offered {}/s: achieved {}/s, p99 {} us{}{}",
            point.point.target_iops.unwrap_or(target),
            format_number(measurement.total_iops),
            format_number(measurement.p99_us),
            point.reads.and_then(|reads| reads.capacity_share()).map_or(
                String::new(),
                |share| format!(", {:.1}% from capacity", share * 100.0)
            ),
            if point.point.saturated {
                ", saturated"
            } else {
                ""
            }
        );
        points.push(point);
    }
    Ok(Curve::new(
        config,
        working_set,
        working_set_bytes,
        warmup,
        points,
        settings.slo_us,
    ))
}

/// One step of a curve: `target` IOPS offered to the working set, and (in a two-tier
/// pool) where its reads came from.
fn rate_point(
    settings: &TiersSettings,
    pool: &ServedPool,
    fio: &str,
    working_set_bytes: u64,
    target: u64,
    two_tier: bool,
) -> anyhow::Result<TierPoint> {
    let step = settings.rate_step(working_set_bytes, target, settings.runtime_seconds);
    let offered = step.target_iops.expect("a rate step has a target");
    let uri = pool.cli.uri(BENCH_VOLUME);
    let before = two_tier
        .then(|| placement(pool, BENCH_VOLUME))
        .transpose()?;
    let measurement = crate::fio::run_step(fio, &uri, &step)?;
    let reads = match before {
        Some(before) => Some(placement(pool, BENCH_VOLUME)?.reads.since(before.reads)),
        None => None,
    };
    let saturated = is_saturated(offered, settings.runtime_seconds, &measurement);
    Ok(TierPoint {
        point: Point {
            label: format!("rate{offered}"),
            iodepth: step.iodepth,
            jobs: step.jobs,
            block_size_bytes: step.block_size_bytes,
            target_iops: Some(offered),
            saturated,
            measurement,
            server_cpu_us_per_op: None,
        },
        reads,
    })
}

/// Runs the reaction load on the reaction volume with per-I/O latency logs.
fn reaction_run(
    settings: &TiersSettings,
    pool: &ServedPool,
    fio: &str,
    log_directory: &Path,
    name: &str,
    seconds: u64,
) -> anyhow::Result<LatencyRun> {
    let bytes = settings
        .reaction_working_set_bytes
        .expect("the reaction runs only when asked for");
    let mut step = settings.rate_step(bytes, settings.reaction_rate_iops, seconds);
    // Reaction time counts from the first I/O: nothing is thrown away.
    step.ramp_seconds = 0;
    std::fs::create_dir_all(log_directory)?;
    let log = LatencyLog::new(&log_directory.join(name), step.jobs);
    let uri = pool.cli.uri(REACTION_VOLUME);
    let measurement = crate::fio::run_step_with(fio, &uri, &step, &log.fio_arguments())?;
    let samples = log.read()?;
    Ok(LatencyRun {
        measurement,
        samples,
        seconds,
    })
}

/// Waits until the reaction volume is (almost) all on capacity.
fn wait_demoted(pool: &ServedPool, volume_bytes: u64) -> anyhow::Result<(bool, Placement)> {
    let deadline = Instant::now() + Duration::from_millis(DEMOTION_TIMEOUT_MS);
    loop {
        check_interrupted()?;
        let current = placement(pool, REACTION_VOLUME)?;
        if current.flash_bytes as f64 <= DEMOTED_FLASH_SHARE_MAX * volume_bytes as f64 {
            return Ok((true, current));
        }
        if Instant::now() >= deadline {
            return Ok((false, current));
        }
        std::thread::sleep(Duration::from_millis(DEMOTION_POLL_INTERVAL_MS));
    }
}

/// A fio run with its per-I/O latencies (completion ms, ns).
struct LatencyRun {
    measurement: Measurement,
    samples: Vec<(u64, u64)>,
    seconds: u64,
}

/// The reaction run of the two-tier pool, with the volume's placement around it.
struct ReactionRun {
    run: LatencyRun,
    before: Placement,
    after: Placement,
}

/// What one pool contributed.
#[derive(Default)]
struct PoolOutcome {
    curves: Vec<Curve>,
    /// all-flash: the reference run of the reaction load.
    reference: Option<LatencyRun>,
    /// flash+disk: the reaction run.
    reaction: Option<ReactionRun>,
    notes: Vec<String>,
}

fn measure_pool(
    settings: &TiersSettings,
    config: TierConfig,
    program: &Path,
    work: &Path,
    fio: &str,
    bench_data: &Path,
    reaction_data: Option<&Path>,
) -> anyhow::Result<PoolOutcome> {
    let directory = work.join(config.name().replace('+', "-"));
    eprintln!("{}: creating the pool", config.name());
    let pool = prepare_pool(
        settings,
        config,
        program,
        &directory,
        bench_data,
        reaction_data,
    )?;
    let mut outcome = PoolOutcome::default();
    if config == TierConfig::FlashDisk {
        let status: PoolStatus = pool.cli.json(&["pool", "status", "--json"])?;
        outcome.notes.push(format!(
            "flash+disk after writing: {} blocks demoted, flash {} used of {}",
            status.demoted_blocks,
            mebibytes(status.flash.used_bytes),
            mebibytes(status.flash.size_bytes),
        ));
    }
    for working_set in [WorkingSet::Small, WorkingSet::Large] {
        outcome
            .curves
            .push(measure_curve(settings, &pool, fio, config, working_set)?);
    }
    let logs = directory.join("logs");
    match (settings.reaction_working_set_bytes, config) {
        (Some(_), TierConfig::AllFlash) => {
            let seconds = settings.reaction_seconds.min(REFERENCE_SECONDS_MAX);
            eprintln!(
                "all-flash: reaction reference, {}/s for {seconds} s",
                settings.reaction_rate_iops
            );
            let reference = reaction_run(settings, &pool, fio, &logs, "reference", seconds)?;
            outcome.reference = Some(reference);
        }
        (Some(bytes), TierConfig::FlashDisk) => {
            let before = demote_reaction_volume(&pool, bytes, bench_data, &mut outcome.notes)?;
            eprintln!(
                "flash+disk: reaction, {}/s for {} s ({} on flash)",
                settings.reaction_rate_iops,
                settings.reaction_seconds,
                mebibytes(before.flash_bytes)
            );
            let seconds = settings.reaction_seconds;
            let run = reaction_run(settings, &pool, fio, &logs, "reaction", seconds)?;
            let after = placement(&pool, REACTION_VOLUME)?;
            outcome.reaction = Some(ReactionRun { run, before, after });
        }
        _ => {}
    }
    outcome.notes.push(end_note(config, &pool)?);
    pool.server.stop();
    Ok(outcome)
}

/// The pool's state after its measurements, as a note.
fn end_note(config: TierConfig, pool: &ServedPool) -> anyhow::Result<String> {
    let status: PoolStatus = pool.cli.json(&["pool", "status", "--json"])?;
    Ok(format!(
        "{} at the end: used {:.1}%, {} promoted, {} demoted, write amplification {}",
        config.name(),
        status.used_percent,
        status.promoted_blocks,
        status.demoted_blocks,
        status
            .write_amplification
            .map_or("-".to_owned(), |value| format!("{value:.2}")),
    ))
}

/// Waits until the reaction volume is demoted in the two-tier pool, and pushes it
/// out of flash when idling was not enough; where it is then.
fn demote_reaction_volume(
    pool: &ServedPool,
    bytes: u64,
    bench_data: &Path,
    notes: &mut Vec<String>,
) -> anyhow::Result<Placement> {
    eprintln!("flash+disk: waiting until {REACTION_VOLUME} is demoted");
    let (demoted, before) = wait_demoted(pool, bytes)?;
    if demoted {
        return Ok(before);
    }
    // Pinning to capacity makes the next cleaning of its segments demote every
    // block; overwriting the bench volume's head pushes flash's FIFO through them.
    notes.push(format!(
        "{REACTION_VOLUME} still had {} on flash after {} s idle: pinned to capacity and flash cycled",
        mebibytes(before.flash_bytes),
        DEMOTION_TIMEOUT_MS / 1_000
    ));
    let pin = |to: &str| {
        pool.cli
            .run(&["volume", "set", REACTION_VOLUME, "--pin", to])
    };
    pin("capacity")?;
    prefill_over_nbd(&pool.cli.uri(BENCH_VOLUME), bench_data)?;
    let (demoted, placement) = wait_demoted(pool, bytes)?;
    pin("auto")?;
    if !demoted {
        notes.push(format!(
            "{REACTION_VOLUME} kept {} on flash: the reaction starts partly warm",
            mebibytes(placement.flash_bytes)
        ));
    }
    Ok(placement)
}

/// The reaction from the all-flash reference run and the two-tier run; why it is
/// missing when one of them is.
fn reaction(
    settings: &TiersSettings,
    reference: Option<LatencyRun>,
    reaction_run: Option<ReactionRun>,
) -> Result<Option<Reaction>, String> {
    let (bytes, reference, ReactionRun { run, before, after }) =
        match (settings.reaction_working_set_bytes, reference, reaction_run) {
            (None, _, _) => return Ok(None),
            (Some(bytes), Some(reference), Some(run)) => (bytes, reference, run),
            (Some(_), None, _) => return Err("the all-flash reference was not measured".into()),
            (Some(_), Some(_), None) => return Err("the flash+disk pool was not measured".into()),
        };
    let mut latencies: Vec<u64> = reference.samples.iter().map(|(_, ns)| *ns).collect();
    latencies.sort_unstable();
    let reference_p99_us = percentile_us(&latencies, 99.0).unwrap_or(f64::NAN);
    let bound_p99_us = REACTION_BOUND_FACTOR * reference_p99_us;
    let windows = sliding_windows(&run.samples, REACTION_WINDOW_MS, REACTION_WINDOW_STRIDE_MS);
    let (first_within_seconds, settled_seconds) = reaction_times(&windows, bound_p99_us);
    Ok(Some(Reaction {
        working_set_bytes: bytes,
        rate_iops: settings.effective_rate(settings.reaction_rate_iops),
        seconds: settings.reaction_seconds,
        priority: settings.priority,
        reference_p99_us,
        reference_measurement: reference.measurement,
        reference_seconds: reference.seconds,
        bound_p99_us,
        before,
        after,
        measurement: run.measurement,
        windows,
        first_within_seconds,
        settled_seconds,
        goal_seconds: REACTION_GOAL_SECONDS,
        goal_met: settled_seconds.is_some_and(|seconds| seconds <= REACTION_GOAL_SECONDS),
    }))
}

/// Measures every pool and returns the report.
pub fn measure(arguments: &TiersArgs) -> anyhow::Result<TiersReport> {
    crate::process::install_interrupt_handler();
    crate::process::become_subreaper();
    let settings = TiersSettings::from_arguments(arguments);
    settings.check()?;
    let fio_version = crate::fio::version(&arguments.common.fio)?;
    let program = arguments.common.lamina_program();
    if !program.is_file() {
        anyhow::bail!("lamina binary {} not found", program.display());
    }
    let work = arguments.common.work_directory()?;
    let bench_data = work.path().join("bench.raw");
    eprintln!(
        "preparing {} of random data",
        mebibytes(settings.volume_size_bytes)
    );
    write_random_data(&bench_data, settings.volume_size_bytes)?;
    let reaction_data = match settings.reaction_working_set_bytes {
        Some(bytes) => {
            let path = work.path().join("react.raw");
            write_random_data(&path, bytes)?;
            Some(path)
        }
        None => None,
    };
    let mut configs = settings.configs.clone();
    configs.dedup();
    let labels: Vec<String> = configs
        .iter()
        .map(|config| config.name().to_owned())
        .collect();
    let mut outcome = each_round(&labels, RoundPlan::once(), |row, _| {
        measure_pool(
            &settings,
            configs[row],
            &program,
            work.path(),
            &arguments.common.fio,
            &bench_data,
            reaction_data.as_deref(),
        )
    })?;
    let pools = outcome.samples();
    let mut run = outcome.run;
    let (mut curves, mut reference, mut reaction_run) = (Vec::new(), None, None);
    for outcome in pools {
        curves.extend(outcome.curves);
        run.notes.extend(outcome.notes);
        reference = outcome.reference.or(reference);
        reaction_run = outcome.reaction.or(reaction_run);
    }
    let (reaction, reaction_missing) = match reaction(&settings, reference, reaction_run) {
        Ok(reaction) => (reaction, None),
        Err(missing) => (None, Some(missing)),
    };
    let comparisons = comparisons(&curves);
    Ok(TiersReport {
        settings,
        fio_version,
        curves,
        comparisons,
        reaction,
        reaction_missing,
        run,
    })
}

/// Runs `lamina bench tiers` and prints (and saves, and plots) the report.
pub fn run_tiers(arguments: &TiersArgs) -> anyhow::Result<()> {
    let report = measure(arguments)?;
    let draw: Draw<'_> = Box::new(|path| crate::plot::render(&report, path));
    arguments
        .common
        .output
        .publish(&report, &report.table(), Some(draw))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::workload::tests::measurement;

    fn point(target: u64, p99_us: f64, saturated: bool, capacity: u64) -> TierPoint {
        TierPoint {
            point: Point {
                label: format!("rate{target}"),
                iodepth: 64,
                jobs: 4,
                block_size_bytes: 4096,
                target_iops: Some(target),
                saturated,
                measurement: measurement(target as f64, p99_us),
                server_cpu_us_per_op: None,
            },
            reads: Some(ReadSources {
                flash_read_blocks: 100 - capacity,
                capacity_read_blocks: capacity,
                ..ReadSources::default()
            }),
        }
    }

    fn curve(config: TierConfig, working_set: WorkingSet, points: Vec<TierPoint>) -> Curve {
        Curve::new(config, working_set, 1 << 20, None, points, 1000.0)
    }

    pub(crate) fn sample_report() -> TiersReport {
        let curves = vec![
            curve(
                TierConfig::AllFlash,
                WorkingSet::Small,
                vec![
                    point(20, 100.0, false, 0),
                    point(40, 110.0, false, 0),
                    point(80, 120.0, false, 0),
                ],
            ),
            curve(
                TierConfig::FlashDisk,
                WorkingSet::Small,
                vec![
                    point(20, 150.0, false, 1),
                    point(40, 220.0, false, 2),
                    point(80, 600.0, true, 3),
                ],
            ),
            curve(
                TierConfig::Disk,
                WorkingSet::Small,
                vec![point(20, 20_000.0, false, 0), point(40, 90_000.0, true, 0)],
            ),
            curve(
                TierConfig::AllFlash,
                WorkingSet::Large,
                vec![point(20, 100.0, false, 0), point(40, 100.0, false, 0)],
            ),
        ];
        let windows = sliding_windows(
            &[
                (100, 50_000_000),
                (900, 40_000_000),
                (1500, 200_000),
                (2500, 150_000),
            ],
            REACTION_WINDOW_MS,
            REACTION_WINDOW_STRIDE_MS,
        );
        let (first_within_seconds, settled_seconds) = reaction_times(&windows, 400.0);
        let placement = Placement {
            flash_bytes: 0,
            capacity_bytes: 1 << 20,
            reads: ReadSources::default(),
        };
        TiersReport {
            settings: TiersSettings::from_arguments(&arguments(&["--quick"])),
            fio_version: "fio-3.33".into(),
            comparisons: comparisons(&curves),
            curves,
            reaction: Some(Reaction {
                working_set_bytes: 1 << 20,
                rate_iops: 80,
                seconds: 3,
                priority: Priority::Normal,
                reference_p99_us: 200.0,
                reference_measurement: measurement(80.0, 200.0),
                reference_seconds: 3,
                bound_p99_us: 400.0,
                before: placement,
                after: Placement {
                    flash_bytes: 1 << 20,
                    capacity_bytes: 0,
                    reads: ReadSources {
                        capacity_read_blocks: 300,
                        flash_read_blocks: 100,
                        promoted_blocks: 256,
                        ..ReadSources::default()
                    },
                },
                measurement: measurement(80.0, 30_000.0),
                windows,
                first_within_seconds,
                settled_seconds,
                goal_seconds: REACTION_GOAL_SECONDS,
                goal_met: settled_seconds.is_some_and(|seconds| seconds <= REACTION_GOAL_SECONDS),
            }),
            reaction_missing: None,
            run: RunNotes {
                notes: vec!["a note".into()],
                skipped: vec![],
                load_average_start: Some("1.00 1.00 1.00".into()),
                load_average_end: None,
            },
        }
    }

    fn arguments(extra: &[&str]) -> TiersArgs {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            tiers: TiersArgs,
        }
        let mut all = vec!["tiers"];
        all.extend_from_slice(extra);
        Cli::try_parse_from(all).expect("parses").tiers
    }

    #[test]
    fn defaults_are_consistent_and_quick_shrinks_everything() {
        let settings = TiersSettings::from_arguments(&arguments(&[]));
        settings.check().expect("defaults are valid");
        assert_eq!(settings.configs, TierConfig::all());
        assert_eq!(settings.rate_targets, DEFAULT_RATE_TARGETS.to_vec());
        assert!(settings.small_working_set_bytes < settings.flash_size_bytes);
        assert!(settings.large_working_set_bytes > settings.flash_size_bytes);
        let quick = TiersSettings::from_arguments(&arguments(&["--quick"]));
        quick.check().expect("quick is valid");
        assert!(quick.volume_size_bytes < settings.volume_size_bytes);
        assert_eq!(quick.runtime_seconds, 1);
        let custom = TiersSettings::from_arguments(&arguments(&[
            "--configs",
            "all-flash,flash-disk",
            "--rate-targets",
            "100,200",
            "--priority",
            "none",
            "--no-reaction",
        ]));
        assert_eq!(
            custom.configs,
            vec![TierConfig::AllFlash, TierConfig::FlashDisk]
        );
        assert_eq!(custom.rate_targets, vec![100, 200]);
        assert_eq!(custom.priority, Priority::NoCache);
        assert_eq!(custom.reaction_working_set_bytes, None);
        let bad = TiersSettings::from_arguments(&arguments(&["--small-working-set", "512M"]));
        assert!(bad.check().is_err());
    }

    #[test]
    fn offered_loads_are_whole_rates_per_stream() {
        let settings = TiersSettings::from_arguments(&arguments(&[]));
        assert_eq!(settings.effective_rate(20), 20);
        assert_eq!(settings.effective_rate(22), 20);
        assert_eq!(settings.effective_rate(1), 4);
        assert!(
            DEFAULT_RATE_TARGETS
                .iter()
                .all(|target| settings.effective_rate(*target) == *target)
        );
    }

    #[test]
    fn low_rates_tolerate_poisson_noise_but_not_a_slow_server() {
        // 20/s for 10 s: 200 expected; 180 is within three deviations (42).
        assert!(!is_saturated(20, 10, &measurement(18.0, 100.0)));
        assert!(is_saturated(20, 10, &measurement(15.0, 100.0)));
        // At high rates 95 % is the stricter rule.
        assert!(!is_saturated(10_000, 10, &measurement(9_600.0, 100.0)));
        assert!(is_saturated(10_000, 10, &measurement(9_400.0, 100.0)));
        let mut full = measurement(20.0, 100.0);
        full.full_queue_percent = 50.0;
        assert!(is_saturated(20, 10, &full));
    }

    #[test]
    fn windows_slide_and_reaction_times_need_every_later_window_within() {
        // Slow for the first second, fast after it, one slow outlier at 3.5 s.
        let mut samples: Vec<(u64, u64)> = (0..1000).map(|ms| (ms, 50_000_000)).collect();
        samples.extend((1000..5000).map(|ms| (ms, 100_000)));
        samples.push((3500, 90_000_000));
        let windows = sliding_windows(&samples, 1000, 100);
        assert_eq!(windows.first().map(|window| window.end_seconds), Some(1.0));
        assert_eq!(windows.last().map(|window| window.end_seconds), Some(5.0));
        assert_eq!(windows.len(), 41);
        assert_eq!(windows[0].completed_ios, 1000);
        // Window (1.0, 2.0] holds only fast reads.
        assert_eq!(windows[10].p99_us, Some(100.0));
        let (first, settled) = reaction_times(&windows, 200.0);
        // Every window that holds a slow read of the first second is out: the first
        // within ends at 2.0 s.
        assert_eq!(first, Some(2.0));
        // The outlier at 3.5 s alone is 0.1 % of a window: p99 stays fast.
        assert_eq!(settled, Some(2.0));
        // Many slow reads around 3.5 s break the run of good windows.
        samples.extend((3400..3450).map(|ms| (ms, 90_000_000)));
        let windows = sliding_windows(&samples, 1000, 100);
        let (first, settled) = reaction_times(&windows, 200.0);
        assert_eq!(first, Some(2.0));
        assert_eq!(settled, Some(4.5));
        // Never within.
        let (first, settled) = reaction_times(&windows, 1.0);
        assert_eq!((first, settled), (None, None));
        assert!(sliding_windows(&[], 1000, 100).is_empty());
    }

    #[test]
    fn read_sources_give_deltas_and_shares() {
        let earlier = ReadSources {
            flash_read_blocks: 10,
            capacity_read_blocks: 10,
            promoted_blocks: 5,
            ..ReadSources::default()
        };
        let later = ReadSources {
            flash_read_blocks: 40,
            capacity_read_blocks: 20,
            promoted_blocks: 9,
            ..ReadSources::default()
        };
        let delta = later.since(earlier);
        assert_eq!(delta.flash_read_blocks, 30);
        assert_eq!(delta.promoted_blocks, 4);
        assert_eq!(delta.capacity_share(), Some(0.25));
        assert_eq!(ReadSources::default().capacity_share(), None);
        let mut stats = serde_json::json!({
            "volume": "bench",
            "policy": {"priority": "normal", "pin": "auto"},
            "flash_bytes": 4096,
            "capacity_bytes": 8192,
            "counters": {"memory_read_blocks": 1, "flash_read_blocks": 2,
                         "capacity_read_blocks": 3, "promoted_blocks": 4, "demoted_blocks": 5},
            "memory_hit_ratio": 0.1, "flash_hit_ratio": 0.2, "capacity_read_ratio": 0.7
        });
        let placement =
            Placement::from_stats(&serde_json::from_value(stats.clone()).expect("reads"));
        assert_eq!(placement.flash_bytes, 4096);
        assert_eq!(placement.capacity_bytes, 8192);
        assert_eq!(placement.reads.demoted_blocks, 5);
        assert_eq!(placement.reads.memory_read_blocks, 1);
        // A counter the daemon renamed is an error, not a zero.
        stats["counters"]["demoted_blocks_renamed"] = stats["counters"]["demoted_blocks"].take();
        stats["counters"]
            .as_object_mut()
            .expect("object")
            .remove("demoted_blocks");
        let error = serde_json::from_value::<VolumeTierStats>(stats).expect_err("renamed");
        assert!(error.to_string().contains("demoted_blocks"), "{error}");
    }

    #[test]
    fn comparisons_use_loads_both_pools_sustained() {
        let report = sample_report();
        let find = |config: TierConfig, working_set: WorkingSet| {
            report
                .comparisons
                .iter()
                .find(|comparison| {
                    comparison.config == config && comparison.working_set == working_set
                })
                .expect("compared")
        };
        let two_tier = find(TierConfig::FlashDisk, WorkingSet::Small);
        assert_eq!(two_tier.common_loads_iops, vec![20, 40]);
        assert_eq!(two_tier.p99_ratios, vec![1.5, 2.0]);
        assert_eq!(two_tier.median_p99_ratio, Some(1.75));
        assert_eq!(two_tier.peak_iops_ratio, Some(0.5));
        let disk = find(TierConfig::Disk, WorkingSet::Small);
        assert_eq!(disk.common_loads_iops, vec![20]);
        assert_eq!(disk.median_p99_ratio, Some(200.0));
        // No flash+disk or disk curve for the large working set: nothing to compare.
        assert_eq!(report.comparisons.len(), 2);
    }

    #[test]
    fn table_and_json_carry_curves_ratios_and_reaction() {
        let report = sample_report();
        let table = report.table();
        for text in [
            "all-flash",
            "flash+disk",
            "ws<flash",
            "saturated",
            "1.75",
            "reaction:",
            "goal <= 10 s: met",
            "note: a note",
            "from capacity",
        ] {
            assert!(table.contains(text), "{text:?} missing from\n{table}");
        }
        let json = serde_json::to_value(&report).expect("serialises");
        assert_eq!(json["curves"][0]["config"], "all-flash");
        assert_eq!(json["curves"][1]["config"], "flash-disk");
        assert_eq!(json["curves"][0]["working_set"], "small");
        assert_eq!(json["curves"][0]["points"][0]["target_iops"], 20);
        assert!(json["curves"][0]["points"][0]["measurement"]["p99_us"].is_number());
        assert_eq!(json["reaction"]["settled_seconds"], 2.0);
        assert_eq!(json["settings"]["priority"], "normal");
    }

    #[test]
    fn the_plot_has_both_panels_and_the_reaction() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("tiers.svg");
        crate::plot::render(&sample_report(), &path).expect("draws");
        let svg = std::fs::read_to_string(&path).expect("reads");
        assert!(svg.starts_with("<svg"));
        for text in ["all-flash", "flash+disk", "disk", "reaction", "ws"] {
            assert!(svg.contains(text), "{text:?} missing from the plot");
        }
        let png = directory.path().join("tiers.png");
        crate::plot::render(&sample_report(), &png).expect("draws a png");
        assert!(std::fs::metadata(&png).expect("exists").len() > 0);
    }
}
