//! `lamina bench rebuild`: losing a device and rebuilding what it held, onto a
//! replacement or onto the survivors' free space (`--kind`), measured through
//! real clients (issue 19's "Measure").
//!
//! Each run creates a raid6 pool on six file devices (optionally behind a disk
//! model such as `hdd-7200`), fills a volume to a share of the usable space with
//! sequential writes over NBD and serves it with `lamina serve`. Under load (the
//! default), the healthy closed-loop peak of a 70/30 random 4 KiB mix is measured
//! first; then the same mix runs open-loop at a share of that peak with a per-I/O
//! latency log while the bench takes a device out (`device fail`), starts the
//! rebuild (`device replace` onto a new file, or `device rebuild` onto
//! distributed spare space), waits for it and lets the load run on. Per-second
//! IOPS and p99 come from fio's log, the rebuild's progress from `pool status
//! --json` each second; the phases' p99 are of all their I/Os.
//! With `--idle-fills` no client runs: the rebuild's duration at each fill, and
//! the survivors' bytes read per second against their aggregate sequential read
//! bandwidth (fio, O_DIRECT, one stream per survivor, on files of the same disk).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::convert::saturating_u64;
use crate::fio::{self, Measurement, Pattern, StepSpec};
use crate::harness::arguments::{CommonArgs, Draw, work_directory_in};
use crate::harness::statistics::median;
use crate::harness::table::{Table, optional};
use crate::lamina_cli::{LaminaCli, ServedPool};
use crate::latency_log::{LatencyLog, percentile_us, sliding_windows};
use crate::process::{ManagedChild, check_interrupted, run_helper};
use crate::runner::{OnFailure, Order, RoundPlan, each_round};
use lamina_api::size::parse_size;
use lamina_api::{
    CleanerState, DeviceStatus, PoolStatus, RebuildKind, RebuildState, RebuildStatus,
};

/// Devices of the pool: raid6 over six, as the daemon test.
const DEVICE_COUNT: usize = 6;
/// The device taken out (and, with `--kind replacement`, replaced).
const FAILED_DEVICE_INDEX: usize = 0;
/// Client block size of the load, in bytes.
const BLOCK_SIZE_BYTES: u64 = 4096;
/// Reads in the load's mix, in percent.
const READ_PERCENT: u8 = 70;
/// Volume sizes are rounded down to a multiple of this, in bytes.
const VOLUME_ALIGNMENT_BYTES: u64 = 1 << 20;
/// Depth of the sequential fill.
const FILL_IODEPTH: u32 = 4;
/// Seconds of the peak measurement not counted (the pool warms up).
const PEAK_RAMP_SECONDS: u64 = 2;
/// Seconds at the start of the loaded run left out of the healthy phase.
const LOAD_WARM_UP_SECONDS: f64 = 2.0;
/// The loaded fio runs this long at most; the bench stops it earlier.
const LOAD_RUNTIME_SECONDS_MAX: u64 = 7200;
/// How long the bench waits for a rebuild to end, at most.
const REBUILD_WAIT_SECONDS_MAX: u64 = 3600;
/// In-flight writes of the preconditioning pass.
const PRECONDITION_IODEPTH: u32 = 16;
/// How often `pool status` is read during a loaded run, in milliseconds.
const STATUS_INTERVAL_MS: u64 = 1000;
/// How often it is read while a rebuild runs, in milliseconds (the rebuild's
/// end, and so the phases' boundary, is known to this much).
const REBUILD_STATUS_INTERVAL_MS: u64 = 200;
/// Width of the windows of the timeline, in milliseconds.
const WINDOW_MS: u64 = 1000;
/// The goal: client p99 during the rebuild at most this times healthy.
pub const P99_GOAL_FACTOR: f64 = 1.5;
/// The goal: the 25% pool rebuilds in at most this share of the 90% one's time.
pub const PROPORTIONALITY_GOAL: f64 = 0.35;
/// Block size, depth and file size of the survivors' bandwidth measurement.
const BANDWIDTH_BLOCK_SIZE_BYTES: u64 = 1 << 20;
const BANDWIDTH_IODEPTH: u32 = 4;
/// The measured volume (and its NBD export).
const VOLUME_NAME: &str = "load";

/// How much background work may take from clients (the daemon's `background_impact`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Impact {
    Low,
    Medium,
    High,
}

impl Impact {
    /// The name in the daemon's configuration.
    pub fn name(self) -> &'static str {
        match self {
            Impact::Low => "low",
            Impact::Medium => "medium",
            Impact::High => "high",
        }
    }
}

/// Which rebuild the bench starts after the failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `device replace` onto a new file.
    Replacement,
    /// `device rebuild`: the lost device's live data striped over the survivors.
    DistributedSpare,
}

impl Kind {
    /// The kind `pool status` reports for this rebuild.
    pub fn reported(self) -> RebuildKind {
        match self {
            Kind::Replacement => RebuildKind::Replacement,
            Kind::DistributedSpare => RebuildKind::DistributedSpare,
        }
    }

    /// The command that starts it, as the plot marks it.
    pub fn start_label(self) -> &'static str {
        match self {
            Kind::Replacement => "device replace",
            Kind::DistributedSpare => "device rebuild",
        }
    }
}

/// Arguments of `lamina bench rebuild`.
#[derive(Debug, Clone, Args)]
pub struct RebuildArgs {
    #[command(flatten)]
    pub settings: Settings,
    /// The daemon's `background_impact`, one loaded run each (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![Impact::Medium])]
    pub impact: Vec<Impact>,
    /// Seconds of the closed-loop peak measurement.
    #[arg(long, default_value_t = 10)]
    pub peak_seconds: u64,
    /// No client load: rebuild durations at these fills instead (comma-separated),
    /// under the first --impact (whose ceiling bounds the rebuild's rate).
    #[arg(long, value_delimiter = ',')]
    pub idle_fills: Option<Vec<f64>>,
    /// Runs per idle fill (the table gives medians).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub runs: u32,
    /// Size of each file of the survivors' bandwidth measurement (idle runs, no model).
    #[arg(long, value_parser = parse_size, default_value = "512M")]
    pub bandwidth_file_size: u64,
    /// Where the pools go (default: a temporary directory, removed).
    #[arg(long)]
    pub directory: Option<PathBuf>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Errors that make a rebuild figure impossible.
#[derive(Debug, thiserror::Error)]
pub enum RebuildBenchError {
    #[error("lamina binary {} not found (set --lamina-bin or LAMINA_BIN)", .path.display())]
    LaminaMissing { path: PathBuf },
    #[error("--{name} {value} is not a fraction strictly between 0 and 1")]
    FractionOutOfRange { name: &'static str, value: f64 },
    #[error("the rebuild did not end within {seconds_max} s: {status}")]
    RebuildTooLong { seconds_max: u64, status: String },
    #[error("the rebuild failed: {reason}")]
    RebuildFailed { reason: String },
    #[error("pool status reports a rebuild {reported:?}, the bench started one {expected:?}")]
    KindMismatch {
        expected: RebuildKind,
        reported: RebuildKind,
    },
    #[error("the pool failed during the run: {reason}")]
    PoolFailed { reason: String },
}

/// One second of the loaded run.
#[derive(Debug, Clone, Serialize)]
pub struct Second {
    /// End of the window, seconds since the load started.
    pub seconds: f64,
    pub iops: f64,
    pub p99_us: Option<f64>,
}

/// One reading of `pool status` during a run.
#[derive(Debug, Clone, Serialize)]
pub struct StatusSample {
    pub seconds: f64,
    pub rebuild_state: RebuildState,
    pub rebuild_kind: RebuildKind,
    pub rebuild_bytes_done: u64,
    pub rebuild_bytes_total: u64,
    pub background_bytes_per_second: u64,
    pub client_latency_us: Option<u64>,
    /// The budget's target then, and the baseline it is a ratio over.
    pub client_latency_target_us: Option<u64>,
    pub client_latency_baseline_us: Option<u64>,
    /// Free space and the cleaner, to tell pacing from cleaning stalls.
    pub free_bytes: u64,
    pub cleaner_state: CleanerState,
    pub cleaner_granted_bytes: u64,
    pub urgent_bytes: u64,
    /// Writes that waited for space (a reclaim in the write path) since
    /// the daemon opened the pool, and their time in all.
    pub space_waits: u64,
    pub space_wait_ms: u64,
}

/// The random writes that aged the pool before its peak was measured.
#[derive(Debug, Clone, Serialize)]
pub struct Preconditioning {
    pub seconds: f64,
    /// The cleaner ran before the time ran out (the pool reached the state
    /// in which it cleans as clients write).
    pub cleaner_started: bool,
    /// The cleaner's state and free space when the writes stopped.
    pub cleaner_state: CleanerState,
    pub free_bytes: u64,
}

/// When things happened, in seconds since the load started.
#[derive(Debug, Clone, Serialize)]
pub struct Events {
    pub fail_seconds: f64,
    /// `device replace` or `device rebuild` ran.
    pub rebuild_start_seconds: f64,
    pub rebuild_end_seconds: f64,
    pub end_seconds: f64,
}

/// Client figures of one phase of the loaded run.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    pub name: &'static str,
    pub from_seconds: f64,
    pub to_seconds: f64,
    pub completed_ios: usize,
    pub iops: f64,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
}

/// What one rebuild did.
#[derive(Debug, Clone, Serialize)]
pub struct RebuildFigures {
    /// Bytes rebuilt: onto a replacement, the pool's address space in use
    /// (metadata and the segments in use, dead blocks included); onto
    /// distributed spare, the live data of the segments the lost device held.
    pub bytes_total: u64,
    /// The pool's used bytes when the rebuild began.
    pub pool_used_bytes: u64,
    /// The engine's own count from start to end.
    pub seconds: f64,
    pub bytes_per_second: f64,
    /// Bytes read from and written to the five survivors between the
    /// rebuild's start and its end (under load, clients' included).
    pub survivors_bytes_read: u64,
    pub survivors_bytes_read_per_second: f64,
    pub survivors_bytes_written: u64,
    pub survivors_bytes_written_per_second: f64,
    pub rows_verified: u64,
    pub blocks_unrepairable: u64,
}

/// One run under load.
#[derive(Debug, Clone, Serialize)]
pub struct LoadRun {
    pub kind: Kind,
    pub impact: Impact,
    pub volume_bytes: u64,
    pub preconditioning: Option<Preconditioning>,
    pub peak: Measurement,
    pub target_iops: u64,
    pub phases: Vec<Phase>,
    /// p99 during the rebuild ÷ healthy p99.
    pub p99_ratio: Option<f64>,
    /// The lowest IOPS of a 1 s window inside the rebuild ÷ IOPS offered
    /// (the whole phase's when it is shorter than two windows): under 1 when
    /// fio's queue was full, and the p99 then leaves out the time requests
    /// waited to be issued (fio catches up afterwards).
    pub rebuild_iops_share: f64,
    pub goal_met: Option<bool>,
    /// The engine's error when the rebuild failed: the rebuilding phase then
    /// ends at the failure, and `after` runs on the pool still degraded.
    pub rebuild_error: Option<String>,
    pub rebuild: RebuildFigures,
    pub events: Events,
    pub seconds: Vec<Second>,
    pub status: Vec<StatusSample>,
}

/// One idle rebuild.
#[derive(Debug, Clone, Serialize)]
pub struct IdleRun {
    pub fill: f64,
    /// The budget's profile: with no client its ceiling is the rebuild's limit.
    pub impact: Impact,
    pub volume_bytes: u64,
    pub rebuild: RebuildFigures,
}

/// The idle rebuilds of one fill.
#[derive(Debug, Clone, Serialize)]
pub struct IdleFill {
    pub fill: f64,
    pub runs: Vec<IdleRun>,
    pub median_seconds: f64,
    pub median_bytes_per_second: f64,
    pub median_survivors_bytes_read_per_second: f64,
    pub median_survivors_bytes_written_per_second: f64,
}

/// The survivors' aggregate sequential read bandwidth.
#[derive(Debug, Clone, Serialize)]
pub struct Bandwidth {
    /// How it was obtained.
    pub method: String,
    pub streams: usize,
    pub bytes_per_second: f64,
}

/// The settings every run shared: the options that say what is measured, as the
/// report records them (its field names are the JSON document's).
#[derive(Debug, Clone, Serialize, Args)]
pub struct Settings {
    /// The rebuild measured: onto a replacement device, or onto the survivors'
    /// free space (distributed spare).
    #[arg(long, value_enum, default_value_t = Kind::Replacement)]
    pub kind: Kind,
    #[arg(skip = DEVICE_COUNT)]
    pub device_count: usize,
    /// Size of each of the six device files (e.g. 512M, 2G).
    #[arg(long = "device-size", value_name = "DEVICE_SIZE", value_parser = parse_size, default_value = "512M")]
    pub device_size_bytes: u64,
    /// Segment size of the pool.
    #[arg(long = "segment-size", value_name = "SEGMENT_SIZE", value_parser = parse_size, default_value = "1M")]
    pub segment_size_bytes: u64,
    /// The devices' model (`pool create --flash-model`), e.g. hdd-7200; none: the files as they are.
    #[arg(long)]
    pub model: Option<String>,
    /// Share of the usable space the volume fills, under load.
    #[arg(long, default_value_t = 0.5)]
    pub fill: f64,
    /// In-flight requests of the load.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub iodepth: u32,
    /// Share of the healthy peak offered during the loaded run.
    #[arg(long, default_value_t = 0.5)]
    pub load_share: f64,
    #[arg(skip = READ_PERCENT)]
    pub read_percent: u8,
    /// Seconds of load before `device fail`.
    #[arg(long, default_value_t = 20)]
    pub healthy_seconds: u64,
    /// Before the peak and the load, random writes over the volume until the
    /// cleaner runs, for at most this long (0: none). Without it the healthy
    /// phase measures a fresh pool that has not needed cleaning yet, while a
    /// long rebuild runs with the cleaner working.
    #[arg(long, default_value_t = 600)]
    pub precondition_seconds_max: u64,
    /// More `[limits]` lines for the daemon, as `key = value` in TOML
    /// (repeatable), e.g. `--limit 'cleaner_headroom_segment_count = 16'`.
    #[arg(long = "limit", value_name = "LIMIT")]
    pub limits: Vec<String>,
    /// Seconds between `device fail` and the rebuild's start.
    #[arg(long, default_value_t = 10)]
    pub degraded_seconds: u64,
    /// Seconds of load after the rebuild ends.
    #[arg(long, default_value_t = 20)]
    pub after_seconds: u64,
    /// The daemon's `client_latency_target_us`, overriding the impact's (the
    /// client p99 above which background work backs off).
    #[arg(long)]
    pub client_latency_target_us: Option<u64>,
}

/// What `lamina bench rebuild --json` prints.
#[derive(Debug, Clone, Serialize)]
pub struct RebuildReport {
    pub fio_version: String,
    pub settings: Settings,
    pub load: Vec<LoadRun>,
    pub idle: Vec<IdleFill>,
    pub bandwidth: Option<Bandwidth>,
    /// Median rebuild time at the smallest idle fill ÷ at the largest.
    pub proportionality: Option<f64>,
}

impl RebuildArgs {
    /// A private directory for a pool: in `--directory`, else in `--work-dir`.
    fn work_directory(&self) -> anyhow::Result<tempfile::TempDir> {
        work_directory_in(
            self.directory
                .as_deref()
                .or(self.common.work_dir.as_deref()),
        )
    }

    fn check(&self) -> Result<(), RebuildBenchError> {
        let fills = self
            .idle_fills
            .iter()
            .flatten()
            .map(|fill| ("idle-fills", *fill));
        for (name, value) in [
            ("fill", self.settings.fill),
            ("load-share", self.settings.load_share),
        ]
        .into_iter()
        .chain(fills)
        {
            if !(value > 0.0 && value < 1.0) {
                return Err(RebuildBenchError::FractionOutOfRange { name, value });
            }
        }
        Ok(())
    }
}

/// The volume: `fill` of the usable space, rounded down to whole MiB.
pub fn volume_size_bytes(fill: f64, status: &PoolStatus) -> u64 {
    let usable_bytes = status.capacity_bytes.saturating_sub(status.reserved_bytes);
    (saturating_u64((fill * usable_bytes as f64).floor()) / VOLUME_ALIGNMENT_BYTES
        * VOLUME_ALIGNMENT_BYTES)
        .max(VOLUME_ALIGNMENT_BYTES)
}

/// A pool on six device files, served, its volume filled.
struct FilledPool {
    served: ServedPool,
    directory: PathBuf,
    volume_bytes: u64,
}

impl FilledPool {
    fn device(&self, index: usize) -> String {
        self.directory
            .join(format!("d{index}.img"))
            .display()
            .to_string()
    }

    /// Runs `lamina ARGUMENTS` on the pool.
    fn lamina(&self, arguments: &[&str]) -> anyhow::Result<()> {
        self.served.cli.run(arguments).map(drop)
    }

    fn status(&self) -> anyhow::Result<PoolStatus> {
        let status: PoolStatus = self.served.cli.json(&["pool", "status", "--json"])?;
        if let Some(reason) = &status.failed {
            return Err(RebuildBenchError::PoolFailed {
                reason: reason.clone(),
            }
            .into());
        }
        Ok(status)
    }
}

/// A counter summed over every device but the failed one.
fn survivors_bytes(status: &PoolStatus, counter: fn(&DeviceStatus) -> u64) -> u64 {
    status
        .layout
        .iter()
        .flat_map(|layout| layout.tiers.iter())
        .flat_map(|tier| tier.devices.iter())
        .filter(|device| device.index != FAILED_DEVICE_INDEX)
        .map(counter)
        .sum()
}

/// Whether the rebuild is over: not rebuilding, no device being replaced.
fn rebuild_over(status: &PoolStatus) -> bool {
    let replacing = status
        .layout
        .iter()
        .flat_map(|layout| layout.tiers.iter())
        .flat_map(|tier| tier.devices.iter())
        .any(|device| device.replacement.is_some());
    status.rebuild.state != RebuildState::Rebuilding && !replacing
}

/// The engine's error when the rebuild failed.
fn rebuild_error(rebuild: &RebuildStatus) -> Option<String> {
    (rebuild.state == RebuildState::Failed).then(|| {
        rebuild
            .error
            .clone()
            .unwrap_or_else(|| "no reason given".to_owned())
    })
}

/// The ended rebuild must be the kind the bench started: a status that
/// reports the other would make every figure of the run wrong.
fn check_kind(rebuild: &RebuildStatus, kind: Kind) -> Result<(), RebuildBenchError> {
    let reported = rebuild.kind;
    if reported == kind.reported() {
        Ok(())
    } else {
        Err(RebuildBenchError::KindMismatch {
            expected: kind.reported(),
            reported,
        })
    }
}

struct Bench<'a> {
    arguments: &'a RebuildArgs,
    program: PathBuf,
}

impl Bench<'_> {
    /// The daemon's configuration under `impact`. No memory cache: client reads reach
    /// the devices, as the rebuild's do. No automatic rebuild onto the devices left
    /// after `device fail`: the bench starts the rebuild it measures (either kind)
    /// itself, after --degraded-seconds, so both kinds have the same degraded phase.
    fn daemon_config(&self, impact: Impact) -> String {
        let mut config = format!(
            "[limits]\nmemory_cache_bytes = 0\nrebuild_automatic = false\nbackground_impact = \"{}\"\n",
            impact.name()
        );
        if let Some(target) = self.arguments.settings.client_latency_target_us {
            config.push_str(&format!("client_latency_target_us = {target}\n"));
        }
        for limit in &self.arguments.settings.limits {
            config.push_str(limit);
            config.push('\n');
        }
        config
    }

    /// Creates the pool in `directory`, serves it and fills `fill` of it.
    fn filled_pool(
        &self,
        directory: &Path,
        fill: f64,
        impact: Impact,
    ) -> anyhow::Result<FilledPool> {
        let arguments = self.arguments;
        let server_directory = directory.join("server");
        let data = server_directory.join("data");
        std::fs::create_dir_all(&data)?;
        let devices = (0..DEVICE_COUNT)
            .map(|index| {
                format!(
                    "{}:{}",
                    directory.join(format!("d{index}.img")).display(),
                    arguments.settings.device_size_bytes
                )
            })
            .collect::<Vec<_>>()
            .join(",");
        let segment = arguments.settings.segment_size_bytes.to_string();
        let mut create = vec![
            "pool",
            "create",
            "--flash",
            &devices,
            "--redundancy",
            "raid6",
            "--segment-size",
            &segment,
            "--json",
        ];
        if let Some(model) = &arguments.settings.model {
            create.extend(["--flash-model", model.as_str()]);
        }
        let cli = LaminaCli::new(&self.program, &data);
        let created: PoolStatus = cli.json(&create)?;
        let volume_bytes = volume_size_bytes(fill, &created);
        cli.run(&["volume", "create", VOLUME_NAME, &volume_bytes.to_string()])?;
        let config = self.daemon_config(impact);
        let served = ServedPool::serve(
            &self.program,
            &server_directory,
            &data,
            &config,
            VOLUME_NAME,
        )?;
        eprintln!(
            "filling {} MiB ({fill} of the usable space)",
            volume_bytes >> 20
        );
        let pattern = Pattern::SequentialWrite;
        let (fio, fsync) = (&arguments.common.fio, &["--end_fsync=1"]);
        let uri = &served.server.uri;
        fio::sequential_pass(fio, uri, pattern, volume_bytes, FILL_IODEPTH, fsync)?;
        Ok(FilledPool {
            served,
            directory: directory.to_owned(),
            volume_bytes,
        })
    }

    fn step(&self, volume_bytes: u64, target_iops: Option<u64>, runtime_seconds: u64) -> StepSpec {
        StepSpec {
            pattern: Pattern::RandomMix {
                read_percent: READ_PERCENT,
            },
            block_size_bytes: BLOCK_SIZE_BYTES,
            iodepth: self.arguments.settings.iodepth,
            jobs: 1,
            target_iops,
            runtime_seconds,
            ramp_seconds: 0,
            region_bytes: volume_bytes,
        }
    }

    /// Starts the rebuild of the failed device: `device replace` onto a new
    /// file, or `device rebuild` onto the survivors (both return at once).
    fn start_rebuild(&self, pool: &FilledPool) -> anyhow::Result<()> {
        match self.arguments.settings.kind {
            Kind::Replacement => {
                let old = pool.device(FAILED_DEVICE_INDEX);
                let new = format!(
                    "{}:{}",
                    pool.directory.join("new.img").display(),
                    self.arguments.settings.device_size_bytes
                );
                pool.lamina(&["device", "replace", &old, &new])
            }
            Kind::DistributedSpare => pool.lamina(&["device", "rebuild"]),
        }
    }

    /// Reads `pool status` every `interval` until the rebuild is over,
    /// finished or failed (the caller decides what a failure means); the last status.
    fn wait_for_rebuild(
        &self,
        pool: &FilledPool,
        start: Instant,
        interval: Duration,
        samples: &mut Vec<StatusSample>,
    ) -> anyhow::Result<PoolStatus> {
        loop {
            check_interrupted()?;
            let status = pool.status()?;
            samples.push(sample(&status, start));
            if rebuild_over(&status) {
                check_kind(&status.rebuild, self.arguments.settings.kind)?;
                return Ok(status);
            }
            if start.elapsed() > Duration::from_secs(REBUILD_WAIT_SECONDS_MAX) {
                return Err(RebuildBenchError::RebuildTooLong {
                    seconds_max: REBUILD_WAIT_SECONDS_MAX,
                    status: format!("{:?}", status.rebuild),
                }
                .into());
            }
            std::thread::sleep(interval);
        }
    }
}

fn sample(status: &PoolStatus, start: Instant) -> StatusSample {
    StatusSample {
        seconds: start.elapsed().as_secs_f64(),
        rebuild_state: status.rebuild.state,
        rebuild_kind: status.rebuild.kind,
        rebuild_bytes_done: status.rebuild.bytes_done,
        rebuild_bytes_total: status.rebuild.bytes_total,
        background_bytes_per_second: status.background.bytes_per_second,
        client_latency_us: status.background.client_latency_us,
        client_latency_target_us: status.background.client_latency_target_us,
        client_latency_baseline_us: status.background.client_latency_baseline_us,
        free_bytes: status.free_bytes,
        cleaner_state: status.cleaner_state,
        cleaner_granted_bytes: status.background.granted_bytes.cleaner,
        urgent_bytes: status.background.urgent_bytes,
        space_waits: status.space_waits.count,
        space_wait_ms: status.space_waits.milliseconds,
    }
}

fn rebuild_figures(before: &PoolStatus, after: &PoolStatus) -> RebuildFigures {
    let seconds = after.rebuild.elapsed_ms as f64 / 1_000.0;
    let grown = |counter: fn(&DeviceStatus) -> u64| {
        survivors_bytes(after, counter).saturating_sub(survivors_bytes(before, counter))
    };
    let read = grown(|device| device.bytes_read);
    let written = grown(|device| device.bytes_written);
    let per_second = |bytes: u64| {
        if seconds > 0.0 {
            bytes as f64 / seconds
        } else {
            f64::NAN
        }
    };
    RebuildFigures {
        bytes_total: after.rebuild.bytes_total,
        pool_used_bytes: before.used_bytes,
        seconds,
        bytes_per_second: per_second(after.rebuild.bytes_total),
        survivors_bytes_read: read,
        survivors_bytes_read_per_second: per_second(read),
        survivors_bytes_written: written,
        survivors_bytes_written_per_second: per_second(written),
        rows_verified: after.rebuild.rows_verified,
        blocks_unrepairable: after.rebuild.blocks_unrepairable,
    }
}

/// Sleeps until `seconds` after `start`, reading `pool status` every interval.
fn poll_until(
    pool: &FilledPool,
    start: Instant,
    seconds: f64,
    samples: &mut Vec<StatusSample>,
) -> anyhow::Result<()> {
    while start.elapsed().as_secs_f64() < seconds {
        check_interrupted()?;
        samples.push(sample(&pool.status()?, start));
        let left = seconds - start.elapsed().as_secs_f64();
        std::thread::sleep(
            Duration::from_millis(STATUS_INTERVAL_MS).min(Duration::from_secs_f64(left.max(0.0))),
        );
    }
    Ok(())
}

/// The figures of the I/Os completed in [from, to) seconds.
fn phase(name: &'static str, samples: &[(u64, u64)], from: f64, to: f64) -> Phase {
    let from_ms = saturating_u64((from * 1_000.0).round());
    let to_ms = saturating_u64((to * 1_000.0).round());
    let mut latencies: Vec<u64> = samples
        .iter()
        .filter(|(time, _)| (from_ms..to_ms).contains(time))
        .map(|(_, ns)| *ns)
        .collect();
    latencies.sort_unstable();
    Phase {
        name,
        from_seconds: from,
        to_seconds: to,
        completed_ios: latencies.len(),
        iops: if to > from {
            latencies.len() as f64 / (to - from)
        } else {
            f64::NAN
        },
        p50_us: percentile_us(&latencies, 50.0),
        p99_us: percentile_us(&latencies, 99.0),
    }
}

/// The four phases of a loaded run from its latency samples and events.
pub fn phases(samples: &[(u64, u64)], events: &Events) -> Vec<Phase> {
    vec![
        phase(
            "healthy",
            samples,
            LOAD_WARM_UP_SECONDS,
            events.fail_seconds,
        ),
        phase(
            "degraded",
            samples,
            events.fail_seconds,
            events.rebuild_start_seconds,
        ),
        phase(
            "rebuilding",
            samples,
            events.rebuild_start_seconds,
            events.rebuild_end_seconds,
        ),
        phase(
            "after",
            samples,
            events.rebuild_end_seconds,
            events.end_seconds,
        ),
    ]
}

/// The lowest IOPS of the 1 s windows wholly inside the rebuild; none when
/// there are fewer than two.
fn lowest_iops(seconds: &[Second], events: &Events) -> Option<f64> {
    let window_seconds = WINDOW_MS as f64 / 1_000.0;
    let inside: Vec<f64> = seconds
        .iter()
        .filter(|second| {
            second.seconds - window_seconds >= events.rebuild_start_seconds
                && second.seconds <= events.rebuild_end_seconds
        })
        .map(|second| second.iops)
        .collect();
    (inside.len() >= 2).then(|| inside.iter().copied().fold(f64::INFINITY, f64::min))
}

/// Stops fio as Ctrl-C would (it then writes its logs) and waits for it.
fn finish_load(mut load: ManagedChild) -> anyhow::Result<()> {
    if let Some(status) = load.try_wait()? {
        let output = load.wait()?;
        anyhow::bail!(
            "fio's load stopped before the run ended ({status}): {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let output = load.interrupt()?;
    // fio exits non-zero when stopped by a signal; what matters is its log
    // (checked by the caller) and that it did not stop by itself earlier.
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() && !stdout.contains("\"fio version\"") {
        anyhow::bail!(
            "fio's load failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// What the timeline of a loaded run produced.
struct Timeline {
    events: Events,
    status: Vec<StatusSample>,
    before: PoolStatus,
    after: PoolStatus,
}

/// Drives the loaded run's timeline: healthy, `device fail`, degraded, the
/// rebuild's start and the rebuild, after; `pool status` read all along.
fn drive_timeline(bench: &Bench, pool: &FilledPool, start: Instant) -> anyhow::Result<Timeline> {
    let arguments = bench.arguments;
    let mut status = Vec::new();
    poll_until(
        pool,
        start,
        arguments.settings.healthy_seconds as f64,
        &mut status,
    )?;
    let fail_seconds = start.elapsed().as_secs_f64();
    pool.lamina(&["device", "fail", &pool.device(FAILED_DEVICE_INDEX)])?;
    eprintln!("device failed at {fail_seconds:.1} s");
    let until = fail_seconds + arguments.settings.degraded_seconds as f64;
    poll_until(pool, start, until, &mut status)?;
    let before = pool.status()?;
    let rebuild_start_seconds = start.elapsed().as_secs_f64();
    bench.start_rebuild(pool)?;
    eprintln!(
        "{} at {rebuild_start_seconds:.1} s",
        arguments.settings.kind.start_label()
    );
    let interval = Duration::from_millis(REBUILD_STATUS_INTERVAL_MS);
    let after = bench.wait_for_rebuild(pool, start, interval, &mut status)?;
    let rebuild_end_seconds = start.elapsed().as_secs_f64();
    match rebuild_error(&after.rebuild) {
        Some(error) => eprintln!("rebuild failed at {rebuild_end_seconds:.1} s: {error}"),
        None => eprintln!("rebuild over at {rebuild_end_seconds:.1} s"),
    }
    let until = rebuild_end_seconds + arguments.settings.after_seconds as f64;
    poll_until(pool, start, until, &mut status)?;
    Ok(Timeline {
        events: Events {
            fail_seconds,
            rebuild_start_seconds,
            rebuild_end_seconds,
            end_seconds: start.elapsed().as_secs_f64(),
        },
        status,
        before,
        after,
    })
}

/// Whether the cleaner is reclaiming space as clients write.
fn cleaner_running(state: CleanerState) -> bool {
    matches!(state, CleanerState::Paced | CleanerState::Short)
}

/// Random writes over the volume, closed loop, until the cleaner runs or
/// `precondition_seconds_max` passes; none when that is 0.
fn precondition(bench: &Bench, pool: &FilledPool) -> anyhow::Result<Option<Preconditioning>> {
    let seconds_max = bench.arguments.settings.precondition_seconds_max;
    if seconds_max == 0 {
        return Ok(None);
    }
    let step = StepSpec {
        pattern: Pattern::RandomWrite,
        iodepth: PRECONDITION_IODEPTH,
        ..bench.step(pool.volume_bytes, None, LOAD_RUNTIME_SECONDS_MAX)
    };
    let writes = fio::spawn(
        &bench.arguments.common.fio,
        &pool.served.server.uri,
        &step.fio_arguments(),
    )?;
    let start = Instant::now();
    let watched = watch_cleaner(pool, start, seconds_max);
    let finished = finish_load(writes);
    let last = watched?;
    finished?;
    let preconditioning = Preconditioning {
        seconds: start.elapsed().as_secs_f64(),
        cleaner_started: cleaner_running(last.cleaner_state),
        cleaner_state: last.cleaner_state,
        free_bytes: last.free_bytes,
    };
    eprintln!(
        "preconditioned for {:.0} s: cleaner {:?}, {} MiB free",
        preconditioning.seconds,
        preconditioning.cleaner_state,
        preconditioning.free_bytes >> 20
    );
    Ok(Some(preconditioning))
}

/// Reads `pool status` each second until the cleaner runs or `seconds_max`
/// passes; the last reading.
fn watch_cleaner(
    pool: &FilledPool,
    start: Instant,
    seconds_max: u64,
) -> anyhow::Result<PoolStatus> {
    loop {
        check_interrupted()?;
        let status = pool.status()?;
        if cleaner_running(status.cleaner_state) || start.elapsed().as_secs() >= seconds_max {
            return Ok(status);
        }
        std::thread::sleep(Duration::from_millis(STATUS_INTERVAL_MS));
    }
}

/// The closed-loop peak of the mix on the healthy pool.
fn healthy_peak(bench: &Bench, pool: &FilledPool) -> anyhow::Result<Measurement> {
    let step = bench.step(pool.volume_bytes, None, bench.arguments.peak_seconds);
    fio::run_step_with(
        &bench.arguments.common.fio,
        &pool.served.server.uri,
        &StepSpec {
            ramp_seconds: PEAK_RAMP_SECONDS,
            ..step
        },
        &[],
    )
}

fn load_run(bench: &Bench, directory: &Path, impact: Impact) -> anyhow::Result<LoadRun> {
    let arguments = bench.arguments;
    let pool = bench.filled_pool(directory, arguments.settings.fill, impact)?;
    let preconditioning = precondition(bench, &pool)?;
    let peak = healthy_peak(bench, &pool)?;
    let target_iops =
        saturating_u64((peak.total_iops * arguments.settings.load_share).round()).max(1);
    eprintln!(
        "impact {}: healthy peak {:.0} IOPS (p99 {:.0} µs); load at {target_iops} IOPS",
        impact.name(),
        peak.total_iops,
        peak.p99_us
    );
    let step = bench.step(
        pool.volume_bytes,
        Some(target_iops),
        LOAD_RUNTIME_SECONDS_MAX,
    );
    let log = LatencyLog::new(&directory.join("load"), step.jobs);
    let arguments_with_log = [step.fio_arguments(), log.fio_arguments()].concat();
    let load = fio::spawn(
        &arguments.common.fio,
        &pool.served.server.uri,
        &arguments_with_log,
    )?;
    let timeline = drive_timeline(bench, &pool, Instant::now());
    // fio is stopped (and its log written) whether or not the timeline ran through.
    let finished = finish_load(load);
    let timeline = timeline?;
    finished?;
    let volume_bytes = pool.volume_bytes;
    pool.served.server.stop();
    let samples = log.read()?;
    let phases = phases(&samples, &timeline.events);
    let p99_ratio = match (phases[0].p99_us, phases[2].p99_us) {
        (Some(healthy), Some(rebuilding)) if healthy > 0.0 => Some(rebuilding / healthy),
        _ => None,
    };
    let seconds: Vec<Second> = sliding_windows(&samples, WINDOW_MS, WINDOW_MS)
        .into_iter()
        .map(|window| Second {
            seconds: window.end_seconds,
            iops: window.completed_ios as f64 * 1_000.0 / WINDOW_MS as f64,
            p99_us: window.p99_us,
        })
        .collect();
    let rebuild_iops_share =
        lowest_iops(&seconds, &timeline.events).unwrap_or(phases[2].iops) / target_iops as f64;
    Ok(LoadRun {
        kind: arguments.settings.kind,
        impact,
        volume_bytes,
        preconditioning,
        rebuild_iops_share,
        peak,
        target_iops,
        phases,
        p99_ratio,
        goal_met: p99_ratio.map(|ratio| ratio <= P99_GOAL_FACTOR),
        rebuild_error: rebuild_error(&timeline.after.rebuild),
        rebuild: rebuild_figures(&timeline.before, &timeline.after),
        events: timeline.events,
        seconds,
        status: timeline.status,
    })
}

fn idle_run(bench: &Bench, directory: &Path, fill: f64, impact: Impact) -> anyhow::Result<IdleRun> {
    let pool = bench.filled_pool(directory, fill, impact)?;
    pool.lamina(&["device", "fail", &pool.device(FAILED_DEVICE_INDEX)])?;
    let before = pool.status()?;
    let start = Instant::now();
    bench.start_rebuild(&pool)?;
    let mut samples = Vec::new();
    let interval = Duration::from_millis(REBUILD_STATUS_INTERVAL_MS);
    let after = bench.wait_for_rebuild(&pool, start, interval, &mut samples)?;
    if let Some(reason) = rebuild_error(&after.rebuild) {
        return Err(RebuildBenchError::RebuildFailed { reason }.into());
    }
    let rebuild = rebuild_figures(&before, &after);
    eprintln!(
        "fill {fill}: {:.0} MiB rebuilt in {:.2} s ({:.0} MiB/s; survivors read {:.0} MiB/s)",
        rebuild.bytes_total as f64 / f64::from(1 << 20),
        rebuild.seconds,
        rebuild.bytes_per_second / f64::from(1 << 20),
        rebuild.survivors_bytes_read_per_second / f64::from(1 << 20),
    );
    let volume_bytes = pool.volume_bytes;
    pool.served.server.stop();
    Ok(IdleRun {
        fill,
        impact,
        volume_bytes,
        rebuild,
    })
}

/// The survivors' aggregate sequential read bandwidth: one O_DIRECT stream per
/// survivor, each on its own dense file in `directory` (the files fio lays out).
fn measure_bandwidth(bench: &Bench, directory: &Path) -> anyhow::Result<Bandwidth> {
    let streams = DEVICE_COUNT - 1;
    let mut command = Command::new(&bench.arguments.common.fio);
    command.args([
        "--output-format=json".to_owned(),
        "--name=survivors".to_owned(),
        format!("--directory={}", directory.display()),
        "--ioengine=libaio".to_owned(),
        "--direct=1".to_owned(),
        "--rw=read".to_owned(),
        format!("--bs={BANDWIDTH_BLOCK_SIZE_BYTES}"),
        format!("--iodepth={BANDWIDTH_IODEPTH}"),
        format!("--size={}", bench.arguments.bandwidth_file_size),
        format!("--numjobs={streams}"),
        "--group_reporting".to_owned(),
    ]);
    let output = run_helper(command)?;
    let report = fio::parse_output(&String::from_utf8_lossy(&output.stdout))?;
    Ok(Bandwidth {
        method: format!(
            "fio: {streams} concurrent sequential readers, {} MiB each, 1 MiB blocks, QD{BANDWIDTH_IODEPTH}, O_DIRECT, libaio, files on the pool's filesystem",
            bench.arguments.bandwidth_file_size >> 20
        ),
        streams,
        bytes_per_second: report.job()?.read.bw_bytes as f64,
    })
}

/// Idle rebuilds at every fill level, `--runs` rounds of them interleaved; a failed
/// rebuild ends the benchmark (it is the finding, not a row to skip).
fn idle_fills(bench: &Bench, fills: &[f64], impact: Impact) -> anyhow::Result<Vec<IdleFill>> {
    let labels: Vec<String> = fills.iter().map(|fill| format!("fill {fill}")).collect();
    let plan = RoundPlan {
        rounds: bench.arguments.runs,
        order: Order::Same,
        on_failure: OnFailure::Stop,
    };
    let outcome = each_round(&labels, plan, |row, _| {
        let directory = bench.arguments.work_directory()?;
        idle_run(bench, directory.path(), fills[row], impact)
    })?;
    let mut runs_of: Vec<Vec<IdleRun>> = fills.iter().map(|_| Vec::new()).collect();
    for measured in outcome.measured {
        runs_of[measured.row].push(measured.sample);
    }
    let idle = fills.iter().zip(runs_of).map(|(&fill, runs)| {
        let of = |figure: fn(&IdleRun) -> f64| median(&runs.iter().map(figure).collect::<Vec<_>>());
        IdleFill {
            fill,
            median_seconds: of(|run| run.rebuild.seconds),
            median_bytes_per_second: of(|run| run.rebuild.bytes_per_second),
            median_survivors_bytes_read_per_second: of(|run| {
                run.rebuild.survivors_bytes_read_per_second
            }),
            median_survivors_bytes_written_per_second: of(|run| {
                run.rebuild.survivors_bytes_written_per_second
            }),
            runs,
        }
    });
    Ok(idle.collect())
}

/// Runs the benchmark and returns the report (the CLI prints it).
pub fn measure(arguments: &RebuildArgs) -> anyhow::Result<RebuildReport> {
    arguments.check()?;
    fio::check_nbd_engine(&arguments.common.fio)?;
    let fio_version = fio::version(&arguments.common.fio)?;
    let program = arguments.common.lamina_program();
    if !program.is_file() {
        return Err(RebuildBenchError::LaminaMissing { path: program }.into());
    }
    if let Some(directory) = &arguments.directory {
        std::fs::create_dir_all(directory)?;
    }
    let bench = Bench { arguments, program };
    let mut report = RebuildReport {
        fio_version,
        settings: arguments.settings.clone(),
        load: vec![],
        idle: vec![],
        bandwidth: None,
        proportionality: None,
    };
    if let Some(fills) = &arguments.idle_fills {
        // The first impact given (medium by default): its ceiling bounds an idle rebuild.
        let impact = arguments.impact.first().copied().unwrap_or(Impact::Medium);
        report.idle = idle_fills(&bench, fills, impact)?;
        if arguments.settings.model.is_none() {
            let directory = arguments.work_directory()?;
            report.bandwidth = Some(measure_bandwidth(&bench, directory.path())?);
        }
        let smallest = report.idle.iter().min_by(|a, b| a.fill.total_cmp(&b.fill));
        let largest = report.idle.iter().max_by(|a, b| a.fill.total_cmp(&b.fill));
        if let (Some(smallest), Some(largest)) = (smallest, largest)
            && largest.fill > smallest.fill
        {
            report.proportionality = Some(smallest.median_seconds / largest.median_seconds);
        }
        return Ok(report);
    }
    report.load = load_runs(&bench, &arguments.impact)?;
    Ok(report)
}

/// A loaded run per impact given (each once, in order); a failed run ends the
/// benchmark.
fn load_runs(bench: &Bench, given: &[Impact]) -> anyhow::Result<Vec<LoadRun>> {
    let mut impacts: Vec<Impact> = Vec::new();
    for impact in given {
        if !impacts.contains(impact) {
            impacts.push(*impact);
        }
    }
    let labels: Vec<String> = impacts.iter().map(|impact| format!("{impact:?}")).collect();
    let plan = RoundPlan {
        on_failure: OnFailure::Stop,
        ..RoundPlan::once()
    };
    let mut outcome = each_round(&labels, plan, |row, _| {
        let directory = bench.arguments.work_directory()?;
        load_run(bench, directory.path(), impacts[row])
    })?;
    Ok(outcome.samples())
}

/// "(min–max)" of the runs' rebuild seconds.
fn range_seconds(runs: &[IdleRun]) -> String {
    let seconds = runs.iter().map(|run| run.rebuild.seconds);
    let low = seconds.clone().fold(f64::INFINITY, f64::min);
    let high = seconds.fold(0.0, f64::max);
    if low.is_finite() {
        format!("({low:.2}–{high:.2})")
    } else {
        String::new()
    }
}

/// The goal column: met, missed, or the rebuild never ended.
fn goal_label(run: &LoadRun) -> &'static str {
    match (&run.rebuild_error, run.goal_met) {
        (Some(_), _) => "rebuild failed",
        (None, Some(true)) => "met",
        (None, Some(false)) => "missed",
        (None, None) => "-",
    }
}

fn mebibytes(bytes: f64) -> String {
    format!("{:.0}", bytes / f64::from(1 << 20))
}

impl RebuildReport {
    /// The human-readable tables (markdown).
    pub fn table(&self) -> String {
        let settings = &self.settings;
        let mut out = format!(
            "rebuild {}: raid6 over {} files of {} MiB{}, {} KiB segments, {}\n\n",
            settings.kind.reported().name(),
            settings.device_count,
            settings.device_size_bytes >> 20,
            settings
                .model
                .as_ref()
                .map_or(String::new(), |model| format!(" behind {model}")),
            settings.segment_size_bytes >> 10,
            self.fio_version
        );
        if !self.load.is_empty() {
            out.push_str(&self.load_table());
        }
        if !self.idle.is_empty() {
            out.push_str(&self.idle_table());
        }
        out
    }

    fn load_table(&self) -> String {
        let settings = &self.settings;
        let mut out = format!(
            "70/30 random 4 KiB at QD{}, {} of the healthy peak, volume {} of the usable space{}",
            settings.iodepth,
            settings.load_share,
            settings.fill,
            settings
                .client_latency_target_us
                .map_or(String::new(), |target| format!(
                    ", client_latency_target_us {target}"
                )),
        );
        if !settings.limits.is_empty() {
            out.push_str(&format!(", limits: {}", settings.limits.join("; ")));
        }
        let p99 = |phase: usize| move |run: &LoadRun| optional(run.phases[phase].p99_us, 0);
        let table = Table::new()
            .column("impact", |run: &LoadRun| run.impact.name().to_owned())
            .column("peak IOPS", |run| format!("{:.0}", run.peak.total_iops))
            .column("load IOPS", |run| run.target_iops.to_string())
            .column("healthy p99 µs", p99(0))
            .column("degraded p99 µs", p99(1))
            .column("rebuilding p99 µs", p99(2))
            .column("after p99 µs", p99(3))
            .column("ratio", |run| optional(run.p99_ratio, 2))
            .column(format!("goal ≤ {P99_GOAL_FACTOR}"), |run| {
                goal_label(run).to_owned()
            })
            .column("lowest 1 s IOPS in rebuild ÷ offered", |run| {
                format!("{:.2}", run.rebuild_iops_share)
            })
            .column("used MiB", |run| {
                mebibytes(run.rebuild.pool_used_bytes as f64)
            })
            .column("rebuilt MiB", |run| {
                mebibytes(run.rebuild.bytes_total as f64)
            })
            .column("seconds", |run| format!("{:.1}", run.rebuild.seconds))
            .column("MiB/s", |run| mebibytes(run.rebuild.bytes_per_second));
        out.push_str("\n\n");
        out.push_str(&table.markdown(&self.load));
        out.push('\n');
        for run in &self.load {
            if let Some(error) = &run.rebuild_error {
                out.push_str(&format!(
                    "impact {}: the rebuild failed after {:.1} s: {error}\n",
                    run.impact.name(),
                    run.rebuild.seconds
                ));
            }
        }
        out
    }

    fn idle_table(&self) -> String {
        let mut out = format!(
            "no client load, background_impact {}, medians of {} run(s) per fill\n\n",
            self.idle
                .first()
                .and_then(|fill| fill.runs.first())
                .map_or("-", |run| run.impact.name()),
            self.idle.first().map_or(0, |fill| fill.runs.len())
        );
        let first = |figure: fn(&IdleRun) -> u64| {
            move |fill: &IdleFill| {
                fill.runs
                    .first()
                    .map_or("-".to_owned(), |run| mebibytes(figure(run) as f64))
            }
        };
        let bandwidth = self
            .bandwidth
            .as_ref()
            .map(|bandwidth| bandwidth.bytes_per_second);
        let table = Table::new()
            .column("fill", |fill: &IdleFill| fill.fill.to_string())
            .column("volume MiB", first(|run| run.volume_bytes))
            .column("used MiB", first(|run| run.rebuild.pool_used_bytes))
            .column("rebuilt MiB", first(|run| run.rebuild.bytes_total))
            .column("seconds, median (range)", |fill| {
                format!("{:.2} {}", fill.median_seconds, range_seconds(&fill.runs))
            })
            .column("MiB/s", |fill| mebibytes(fill.median_bytes_per_second))
            .column("survivors read MiB/s", |fill| {
                mebibytes(fill.median_survivors_bytes_read_per_second)
            })
            .column("survivors written MiB/s", |fill| {
                mebibytes(fill.median_survivors_bytes_written_per_second)
            })
            .column("share of survivors' bandwidth (read)", move |fill| {
                let share =
                    bandwidth.map(|bytes| fill.median_survivors_bytes_read_per_second / bytes);
                optional(share, 2)
            });
        out.push_str(&table.markdown(&self.idle));
        if let Some(bandwidth) = &self.bandwidth {
            out.push_str(&format!(
                "\nsurvivors' aggregate sequential read bandwidth: {} MiB/s ({})\n",
                mebibytes(bandwidth.bytes_per_second),
                bandwidth.method
            ));
        }
        if let Some(ratio) = self.proportionality {
            out.push_str(&format!(
                "smallest fill's time ÷ largest's: {ratio:.2} (goal ≤ {PROPORTIONALITY_GOAL} for 25% against 90%)\n"
            ));
        }
        out
    }
}

/// Runs `lamina bench rebuild` and prints the tables or the JSON.
pub fn run_rebuild(arguments: &RebuildArgs) -> anyhow::Result<()> {
    crate::process::become_subreaper();
    let report = measure(arguments)?;
    let output = &arguments.common.output;
    if output.json {
        // The tables go to stderr, so that one run gives both.
        eprint!("{}", report.table());
    }
    // Idle runs alone have nothing over time to draw.
    let draw: Option<Draw<'_>> = (!report.load.is_empty())
        .then(|| -> Draw<'_> { Box::new(|path| crate::plot::render(&report, path)) });
    output.publish(&report, &report.table(), draw)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_split_the_samples_at_the_events() {
        // One I/O every 10 ms for 60 s: 100 µs, then 300 µs from 30 s to 40 s.
        let samples: Vec<(u64, u64)> = (0..6_000)
            .map(|index| {
                let time = index * 10;
                let latency = if (30_000..40_000).contains(&time) {
                    300_000
                } else {
                    100_000
                };
                (time, latency)
            })
            .collect();
        let events = Events {
            fail_seconds: 20.0,
            rebuild_start_seconds: 30.0,
            rebuild_end_seconds: 40.0,
            end_seconds: 60.0,
        };
        let phases = phases(&samples, &events);
        assert_eq!(
            phases.iter().map(|phase| phase.name).collect::<Vec<_>>(),
            ["healthy", "degraded", "rebuilding", "after"]
        );
        assert_eq!(phases[0].completed_ios, 1_800);
        assert!((phases[0].iops - 100.0).abs() < 1e-9);
        assert_eq!(phases[0].p99_us, Some(100.0));
        assert_eq!(phases[2].p99_us, Some(300.0));
        assert_eq!(phases[3].p99_us, Some(100.0));
    }

    #[test]
    fn fractions_outside_zero_to_one_are_refused() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            arguments: RebuildArgs,
        }
        let cli = Cli::try_parse_from(["rebuild", "--idle-fills", "0.25,0.5,0.9"]).unwrap();
        assert!(cli.arguments.check().is_ok());
        assert_eq!(cli.arguments.impact, vec![Impact::Medium]);
        assert_eq!(cli.arguments.settings.kind, Kind::Replacement);
        let cli = Cli::try_parse_from(["rebuild", "--idle-fills", "0.25,1.5"]).unwrap();
        assert!(matches!(
            cli.arguments.check(),
            Err(RebuildBenchError::FractionOutOfRange { value, .. }) if value == 1.5
        ));
    }

    fn sample_report() -> RebuildReport {
        let events = Events {
            fail_seconds: 20.0,
            rebuild_start_seconds: 30.0,
            rebuild_end_seconds: 40.0,
            end_seconds: 60.0,
        };
        let samples: Vec<(u64, u64)> = (0..6_000).map(|index| (index * 10, 200_000)).collect();
        let peak = Measurement {
            read_iops: 140.0,
            write_iops: 60.0,
            total_iops: 200.0,
            read_megabytes_per_second: 0.5,
            write_megabytes_per_second: 0.2,
            p50_us: 100.0,
            p90_us: 150.0,
            p99_us: 200.0,
            p999_us: 300.0,
            mean_us: 110.0,
            max_us: 400.0,
            full_queue_percent: 0.0,
            completed_ios: 2_000,
        };
        let rebuild = RebuildFigures {
            bytes_total: 64 << 20,
            pool_used_bytes: 60 << 20,
            seconds: 10.0,
            bytes_per_second: f64::from(64 << 20) / 10.0,
            survivors_bytes_read: 80 << 20,
            survivors_bytes_read_per_second: f64::from(80 << 20) / 10.0,
            survivors_bytes_written: 0,
            survivors_bytes_written_per_second: 0.0,
            rows_verified: 4_096,
            blocks_unrepairable: 0,
        };
        RebuildReport {
            fio_version: "fio-3.33".into(),
            settings: Settings {
                kind: Kind::Replacement,
                device_count: DEVICE_COUNT,
                device_size_bytes: 64 << 20,
                segment_size_bytes: 1 << 20,
                model: Some("hdd-7200".into()),
                fill: 0.5,
                iodepth: 16,
                load_share: 0.5,
                read_percent: READ_PERCENT,
                healthy_seconds: 20,
                precondition_seconds_max: 600,
                limits: vec![],
                degraded_seconds: 10,
                after_seconds: 20,
                client_latency_target_us: None,
            },
            load: vec![LoadRun {
                kind: Kind::Replacement,
                impact: Impact::Medium,
                volume_bytes: 32 << 20,
                preconditioning: None,
                peak,
                target_iops: 100,
                phases: phases(&samples, &events),
                p99_ratio: Some(1.0),
                rebuild_iops_share: 1.0,
                goal_met: Some(true),
                rebuild_error: None,
                rebuild,
                events,
                seconds: (1..=60)
                    .map(|second| Second {
                        seconds: f64::from(second),
                        iops: 100.0,
                        p99_us: Some(200.0),
                    })
                    .collect(),
                status: vec![],
            }],
            idle: vec![],
            bandwidth: None,
            proportionality: None,
        }
    }

    #[test]
    fn the_table_and_the_plot_show_the_phases_and_the_events() {
        let report = sample_report();
        let table = report.table();
        assert!(
            table.contains("| medium | 200 | 100 | 200 | 200 | 200 | 200 | 1.00 | met |"),
            "{table}"
        );
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("rebuild.svg");
        crate::plot::render(&report, &path).expect("draws");
        let svg = std::fs::read_to_string(&path).expect("reads");
        for text in [
            "device fail",
            "device replace",
            "rebuild over",
            "goal: 1.5 x healthy",
            "hdd-7200",
        ] {
            assert!(svg.contains(text), "{text:?} missing from the plot");
        }
    }

    #[test]
    fn the_kind_is_chosen_by_name_and_checked_against_the_status() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            arguments: RebuildArgs,
        }
        let cli = Cli::try_parse_from(["rebuild", "--kind", "distributed-spare"]).unwrap();
        assert_eq!(cli.arguments.settings.kind, Kind::DistributedSpare);
        assert!(Cli::try_parse_from(["rebuild", "--kind", "spare"]).is_err());
        let spare = RebuildStatus {
            state: RebuildState::Finished,
            kind: RebuildKind::DistributedSpare,
            ..RebuildStatus::default()
        };
        assert!(check_kind(&spare, Kind::DistributedSpare).is_ok());
        assert!(matches!(
            check_kind(&spare, Kind::Replacement),
            Err(RebuildBenchError::KindMismatch {
                expected: RebuildKind::Replacement,
                reported: RebuildKind::DistributedSpare,
            })
        ));
        let json = serde_json::to_value(Kind::DistributedSpare).expect("serialises");
        assert_eq!(json, "distributed-spare");
    }

    #[test]
    fn a_distributed_spare_run_is_named_in_the_table_and_the_plot() {
        let mut report = sample_report();
        report.settings.kind = Kind::DistributedSpare;
        report.load[0].kind = Kind::DistributedSpare;
        report.load[0].rebuild_error = Some("8 passes".to_owned());
        let table = report.table();
        assert!(
            table.starts_with("rebuild onto distributed spare space: raid6"),
            "{table}"
        );
        assert!(table.contains("| 1.00 | rebuild failed |"), "{table}");
        assert!(
            table.contains("impact medium: the rebuild failed after 10.0 s: 8 passes"),
            "{table}"
        );
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("rebuild.svg");
        crate::plot::render(&report, &path).expect("draws");
        let svg = std::fs::read_to_string(&path).expect("reads");
        assert!(svg.contains("device rebuild"), "the start is not marked");
        assert!(svg.contains("rebuild failed"), "the failure is not marked");
        assert!(!svg.contains("device replace"), "no device was replaced");
    }
}
