//! `lamina bench snapshots`: what snapshots and clones cost, lamina side by side with
//! qemu-nbd on qcow2, in one run (issue 4).
//!
//! Two workloads, each on both servers, every repetition running every case in turn
//! (the order reverses on odd repetitions so that drift on a shared machine does not
//! favour one case), medians reported with their ratios:
//!
//! - 4 KiB random writes at QD32 on a fully written volume with 0, 1 and N snapshots
//!   (lamina: `lamina snapshot create`; qemu: qcow2 internal snapshots made with
//!   `qemu-img snapshot -c`). Before every repetition after the first, the oldest
//!   snapshot of the 1- and N-snapshot volumes is deleted and a new one taken (no I/O
//!   running), so every measured run starts right after a snapshot and its writes are
//!   first writes to blocks the snapshot shares.
//! - 4 KiB random reads at QD32 on the origin and on the last clone of a chain of clones
//!   of clones (lamina: snapshot, `lamina clone`, a little written to the clone, again;
//!   qemu: a qcow2 backing-file chain made with `qemu-img create -b`, the same writes).
//!
//! lamina runs as one daemon for the whole benchmark; qemu-nbd serves one image at a
//! time (images are modified offline between runs, and qcow2 image locks forbid serving
//! a backing file while an overlay on it is open), started before and stopped after
//! each run. The wall time of every snapshot, clone and delete command is recorded too
//! (process start included: the CLI is timed end to end).

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clap::Args;
use serde::Serialize;

use crate::fio::{Measurement, Pattern, StepSpec};
use crate::harness::arguments::{CommonArgs, Draw};
use crate::harness::statistics::median;
use crate::harness::table::Table;
use crate::lamina_cli::LaminaCli;
use crate::process::{check_interrupted, find_program, run_helper};
use crate::report::{RunNotes, Skipped, format_number, load_average, ratio};
use crate::runner::{OnFailure, Order, RoundPlan, each_round};
use crate::servers::{RunningServer, prefill_over_nbd, serve_qemu_nbd, start_lamina_daemon};
use lamina_api::size::parse_size;
use lamina_api::{PoolStatus, SnapshotInfo};

/// Largest fraction a snapshot or clone case may lose against its baseline (issue 4's goal).
pub const GOAL_MIN_RATIO: f64 = 0.95;

/// Queue depth of the random writes that make each clone of the chain differ.
const CLONE_WRITE_IODEPTH: u32 = 8;

/// Samples of a plain admin round trip (`lamina volume list`), the CLI's fixed cost.
const BASELINE_SAMPLES: usize = 10;

/// Arguments of `lamina bench snapshots`.
#[derive(Debug, Clone, Args)]
pub struct SnapshotsArgs {
    #[command(flatten)]
    pub settings: SnapshotsSettings,
    /// Servers to measure: `lamina`, `qemu-nbd` or both.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [SnapshotServer::Lamina, SnapshotServer::QemuNbd])]
    pub servers: Vec<SnapshotServer>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// The settings of a run: the options that say what is measured, as the report
/// records them (its field names are the JSON document's).
#[derive(Debug, Clone, PartialEq, Serialize, Args)]
pub struct SnapshotsSettings {
    /// Size of every volume and image (fully written with random data first).
    #[arg(long = "size", value_name = "SIZE", value_parser = parse_size, default_value = "1G")]
    pub size_bytes: u64,
    /// Seconds measured per fio run.
    #[arg(long = "runtime", value_name = "RUNTIME", default_value_t = 10)]
    pub runtime_seconds: u64,
    /// Seconds run before measuring, per fio run.
    #[arg(long = "ramp", value_name = "RAMP", default_value_t = 1)]
    pub ramp_seconds: u64,
    /// Queue depth of the measured runs (one job, one connection).
    #[arg(long, default_value_t = 32)]
    pub iodepth: u32,
    /// Times every case is measured; medians are reported.
    #[arg(long, default_value_t = 3)]
    pub repetitions: u32,
    /// Snapshots on the many-snapshot volume (the other cases have 0 and 1).
    #[arg(long, default_value_t = 100)]
    pub snapshots: u32,
    /// Depth of the chain of clones of clones whose last clone is read.
    #[arg(long, default_value_t = 20)]
    pub chain_depth: u32,
    /// Bytes written (4 KiB random writes) to each clone of the chain before it is
    /// snapshotted and cloned again.
    #[arg(long = "clone-write-size", value_name = "CLONE_WRITE_SIZE", value_parser = parse_size, default_value = "1M")]
    pub clone_write_bytes: u64,
    /// Size of lamina's pool file (sparse; the volumes, their snapshots and the log's
    /// free space for the cleaner must fit).
    #[arg(long = "pool-size", value_name = "POOL_SIZE", value_parser = parse_size, default_value = "32G")]
    pub pool_size_bytes: u64,
    /// lamina's memory block cache (`[limits] memory_cache_bytes`); default: lamina's default.
    #[arg(long = "memory-cache", value_name = "MEMORY_CACHE", value_parser = parse_size)]
    pub memory_cache_bytes: Option<u64>,
}

/// The servers `lamina bench snapshots` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotServer {
    Lamina,
    /// qemu-nbd on qcow2: internal snapshots and a backing-file chain.
    QemuNbd,
}

/// What one case measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum CaseKind {
    /// 4 KiB random writes on a volume with this many snapshots.
    Write { snapshots: u32 },
    /// 4 KiB random reads on the origin of the clone chain.
    ReadOrigin,
    /// 4 KiB random reads on the clone at this depth of the chain.
    ReadClone { depth: u32 },
}

impl CaseKind {
    /// The row label of tables and plots.
    pub fn label(self) -> String {
        match self {
            CaseKind::Write { snapshots: 1 } => "randwrite, 1 snapshot".to_owned(),
            CaseKind::Write { snapshots } => format!("randwrite, {snapshots} snapshots"),
            CaseKind::ReadOrigin => "randread, origin".to_owned(),
            CaseKind::ReadClone { depth } => format!("randread, clone depth {depth}"),
        }
    }

    fn pattern(self) -> Pattern {
        match self {
            CaseKind::Write { .. } => Pattern::RandomWrite,
            CaseKind::ReadOrigin | CaseKind::ReadClone { .. } => Pattern::RandomRead,
        }
    }
}

/// One server's figures for one case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseResult {
    pub server: String,
    pub case: CaseKind,
    /// What was measured: the lamina export or the qcow2 image.
    pub target: String,
    /// Every repetition, in the order run.
    pub runs: Vec<Measurement>,
    pub median_iops: f64,
    pub median_p50_us: f64,
    pub median_p99_us: f64,
}

impl CaseResult {
    /// A result with its medians computed from `runs`.
    pub fn new(server: &str, case: CaseKind, target: String, runs: Vec<Measurement>) -> Self {
        let iops: Vec<f64> = runs.iter().map(|run| run.total_iops).collect();
        let p50: Vec<f64> = runs.iter().map(|run| run.p50_us).collect();
        let p99: Vec<f64> = runs.iter().map(|run| run.p99_us).collect();
        Self {
            server: server.to_owned(),
            case,
            target,
            runs,
            median_iops: median(&iops),
            median_p50_us: median(&p50),
            median_p99_us: median(&p99),
        }
    }
}

/// Wall times of one kind of administrative command.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timing {
    pub server: String,
    /// The command, as a user would type it (without paths).
    pub operation: String,
    pub samples_ms: Vec<f64>,
    pub median_ms: f64,
    pub max_ms: f64,
}

impl Timing {
    fn new(server: &str, operation: &str, samples_ms: Vec<f64>) -> Self {
        Self {
            server: server.to_owned(),
            operation: operation.to_owned(),
            median_ms: median(&samples_ms),
            max_ms: samples_ms.iter().copied().fold(f64::NAN, f64::max),
            samples_ms,
        }
    }
}

/// A ratio between two medians, with issue 4's goal where it sets one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub description: String,
    pub ratio: Option<f64>,
    /// The smallest ratio that meets the goal.
    pub goal_min: Option<f64>,
    pub met: Option<bool>,
}

impl SnapshotsSettings {
    /// Settings that would leave a case without meaning are a programmer's error.
    fn check(&self) {
        assert!(self.repetitions > 0, "at least one repetition");
        assert!(
            self.snapshots > 1,
            "the many-snapshot case needs more than one"
        );
        assert!(self.chain_depth > 0, "the chain needs at least one clone");
    }
}

/// Everything `lamina bench snapshots` measured.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotsReport {
    pub settings: SnapshotsSettings,
    pub fio_version: String,
    pub qemu_version: Option<String>,
    pub cases: Vec<CaseResult>,
    pub timings: Vec<Timing>,
    pub comparisons: Vec<Comparison>,
    /// How each server was run, the servers skipped, the machine's load.
    #[serde(flatten)]
    pub run: RunNotes,
}

fn find_case<'a>(cases: &'a [CaseResult], server: &str, case: CaseKind) -> Option<&'a CaseResult> {
    cases
        .iter()
        .find(|result| result.server == server && result.case == case)
}

/// The ratios the benchmark exists for: each snapshot or clone case against its
/// baseline on the same server (issue 4's goals for lamina), then lamina against
/// qemu-nbd case by case.
pub fn comparisons(cases: &[CaseResult], snapshots: u32, chain_depth: u32) -> Vec<Comparison> {
    let iops = |server: &str, case: CaseKind| find_case(cases, server, case).map(|r| r.median_iops);
    let mut out = Vec::new();
    let pairs = [
        (
            CaseKind::Write { snapshots: 1 },
            CaseKind::Write { snapshots: 0 },
        ),
        (
            CaseKind::Write { snapshots },
            CaseKind::Write { snapshots: 0 },
        ),
        (
            CaseKind::ReadClone { depth: chain_depth },
            CaseKind::ReadOrigin,
        ),
    ];
    for server in [LAMINA, QEMU] {
        for (case, baseline) in pairs {
            if find_case(cases, server, case).is_none() {
                continue;
            }
            let value = ratio(iops(server, case), iops(server, baseline));
            let goal_min = (server == LAMINA).then_some(GOAL_MIN_RATIO);
            out.push(Comparison {
                description: format!("{server}: IOPS {} / {}", case.label(), baseline.label()),
                ratio: value,
                goal_min,
                met: goal_min.and_then(|goal| value.map(|value| value >= goal)),
            });
        }
    }
    let mut kinds: Vec<CaseKind> = Vec::new();
    for result in cases {
        if !kinds.contains(&result.case) {
            kinds.push(result.case);
        }
    }
    for case in kinds {
        if find_case(cases, LAMINA, case).is_some() && find_case(cases, QEMU, case).is_some() {
            out.push(Comparison {
                description: format!("IOPS lamina / qemu-nbd, {}", case.label()),
                ratio: ratio(iops(LAMINA, case), iops(QEMU, case)),
                goal_min: None,
                met: None,
            });
        }
    }
    out
}

/// The server name of lamina in results.
pub const LAMINA: &str = "lamina";
/// The server name of qemu-nbd on qcow2 in results.
pub const QEMU: &str = "qemu-nbd";

/// One row per case and server: its median IOPS and latencies, and every run.
fn case_table<'a>() -> Table<'a, CaseResult> {
    Table::new()
        .column("case", |result: &CaseResult| result.case.label())
        .column("server", |result| result.server.clone())
        .column("median IOPS", |result| format_number(result.median_iops))
        .column("runs", |result| {
            let runs: Vec<String> = result
                .runs
                .iter()
                .map(|run| format_number(run.total_iops))
                .collect();
            runs.join(" / ")
        })
        .column("p50 us", |result| format_number(result.median_p50_us))
        .column("p99 us", |result| format_number(result.median_p99_us))
}

/// One row per ratio the goals judge.
fn comparison_table<'a>() -> Table<'a, Comparison> {
    Table::new()
        .column("ratio", |comparison: &Comparison| {
            comparison.description.clone()
        })
        .column("value", |comparison| {
            comparison
                .ratio
                .map_or("-".to_owned(), |value| format!("{value:.2}"))
        })
        .column("goal", |comparison| {
            match (comparison.goal_min, comparison.met) {
                (Some(goal), Some(true)) => format!(">= {goal:.2} met"),
                (Some(goal), Some(false)) => format!(">= {goal:.2} NOT met"),
                (Some(goal), None) => format!(">= {goal:.2}"),
                (None, _) => String::new(),
            }
        })
}

/// One row per timed command and server.
fn timing_table<'a>() -> Table<'a, Timing> {
    Table::new()
        .column(
            "command (wall time, process start included)",
            |timing: &Timing| timing.operation.clone(),
        )
        .column("server", |timing| timing.server.clone())
        .column("samples", |timing| timing.samples_ms.len().to_string())
        .column("median ms", |timing| format!("{:.1}", timing.median_ms))
        .column("max ms", |timing| format!("{:.1}", timing.max_ms))
}

impl SnapshotsReport {
    /// The human-readable table.
    pub fn table(&self) -> String {
        let settings = &self.settings;
        let mut out = format!(
            "snapshots and clones: {} volumes, fio 4 KiB QD{} x 1 job, {} s (+{} s ramp) per run, median of {}\n",
            format_number(settings.size_bytes as f64 / f64::from(1u32 << 20)) + " MiB",
            settings.iodepth,
            settings.runtime_seconds,
            settings.ramp_seconds,
            settings.repetitions,
        );
        out.push_str(&case_table().render(&self.cases));
        out.push('\n');
        out.push_str(&comparison_table().render(&self.comparisons));
        out.push('\n');
        out.push_str(&timing_table().render(&self.timings));
        out.push_str(&self.run.footer());
        out
    }
}

/// Runs `lamina bench snapshots` and prints (and saves, and plots) the report.
pub fn run_snapshots(arguments: &SnapshotsArgs) -> anyhow::Result<()> {
    let report = measure(arguments)?;
    let draw: Draw<'_> = Box::new(|path| crate::plot::render(&report, path));
    arguments
        .common
        .output
        .publish(&report, &report.table(), Some(draw))
}

/// Times one helper command; fails with its stderr when it fails.
fn timed(command: Command) -> anyhow::Result<f64> {
    let started = Instant::now();
    run_helper(command)?;
    Ok(started.elapsed().as_secs_f64() * 1_000.0)
}

/// The lamina daemon and the CLI that administers it.
struct Lamina {
    cli: LaminaCli,
    server: RunningServer,
}

impl Lamina {
    /// Times `lamina ARGUMENTS` (process start included).
    fn timed(&self, arguments: &[&str]) -> anyhow::Result<f64> {
        timed(self.cli.command(arguments))
    }

    /// Times `lamina snapshot list VOLUME --json` and checks that it lists `expected`.
    fn list_snapshots(&self, volume: &str, expected: u32) -> anyhow::Result<f64> {
        let started = Instant::now();
        let listed: Vec<SnapshotInfo> = self.cli.json(&["snapshot", "list", volume, "--json"])?;
        let milliseconds = started.elapsed().as_secs_f64() * 1_000.0;
        let count = listed.len();
        if count != expected as usize {
            anyhow::bail!(
                "`lamina snapshot list {volume}` shows {count} snapshots, not {expected}"
            );
        }
        Ok(milliseconds)
    }

    /// Times `lamina snapshot list` of every snapshotted volume once more (after the
    /// measured writes every snapshot differs from its neighbours, which is what the
    /// per-snapshot space accounting of `list` has to compare) and stops the daemon;
    /// the pool's state at the end, as a note.
    fn finish(self, cases: &[Case], timings: &mut Timings) -> anyhow::Result<String> {
        for case in cases {
            if let (CaseKind::Write { snapshots }, Target::Lamina { export, .. }) =
                (case.kind, &case.target)
                && snapshots > 0
            {
                let milliseconds = self.list_snapshots(export, snapshots)?;
                let operation =
                    format!("lamina snapshot list ({snapshots} snapshots, after the writes)");
                timings.record(LAMINA, &operation, milliseconds);
            }
        }
        let status: PoolStatus = self.cli.json(&["pool", "status", "--json"])?;
        self.server.stop();
        Ok(format!(
            "lamina pool at the end: used {:.1}%, write amplification {}, cleaner relocated {} blocks, device {} GiB written",
            status.used_percent,
            status
                .write_amplification
                .map_or("-".to_owned(), |value| format!("{value:.2}")),
            status.cleaner_relocated_blocks,
            status.device_bytes_written >> 30,
        ))
    }
}

/// Whether qemu-nbd and qemu-img are installed; when not, qemu-nbd is skipped.
fn qemu_installed(skipped: &mut Vec<Skipped>) -> bool {
    let missing = ["qemu-nbd", "qemu-img"]
        .into_iter()
        .find(|program| find_program(program).is_none());
    if let Some(program) = missing {
        skipped.push(Skipped {
            server: QEMU.into(),
            reason: format!("`{program}` is not installed"),
        });
    }
    missing.is_none()
}

/// The snapshots of one volume (or qcow2 image), oldest first, and the next name.
#[derive(Debug, Default)]
struct SnapshotSet {
    names: VecDeque<String>,
    next_number: u32,
}

impl SnapshotSet {
    fn next_name(&mut self) -> String {
        self.next_number += 1;
        format!("s{}", self.next_number)
    }
}

/// Where a case runs.
#[derive(Debug)]
enum Target {
    /// A lamina export; `snapshots` names the volume's snapshot set when it has one.
    Lamina {
        export: String,
        snapshots: Option<usize>,
    },
    /// A qcow2 image served by qemu-nbd for the run.
    Qemu {
        image: PathBuf,
        snapshots: Option<usize>,
    },
}

impl Target {
    /// The index of the target's snapshot set, when it has one.
    fn snapshots(&self) -> Option<usize> {
        match self {
            Target::Lamina { snapshots, .. } | Target::Qemu { snapshots, .. } => *snapshots,
        }
    }
}

/// Replaces the oldest snapshot of `target`'s `set` by a new one (no I/O running), so
/// that the measured writes are first writes to blocks the newest snapshot shares.
fn refresh_snapshot(
    target: &Target,
    set: &mut SnapshotSet,
    lamina: Option<&Lamina>,
    timings: &mut Timings,
) -> anyhow::Result<()> {
    let oldest = set
        .names
        .pop_front()
        .expect("a snapshot set is never empty");
    let name = set.next_name();
    match target {
        Target::Lamina { export, .. } => {
            let lamina = lamina.expect("lamina cases exist only when lamina runs");
            let milliseconds =
                lamina.timed(&["snapshot", "delete", &format!("{export}@{oldest}")])?;
            timings.record(LAMINA, "lamina snapshot delete", milliseconds);
            let milliseconds =
                lamina.timed(&["snapshot", "create", &format!("{export}@{name}")])?;
            let operation = "lamina snapshot create (volume written since its last snapshot)";
            timings.record(LAMINA, operation, milliseconds);
        }
        Target::Qemu { image, .. } => {
            let milliseconds = timed(qemu_img(&["snapshot", "-d", &oldest], image))?;
            timings.record(QEMU, "qemu-img snapshot -d (offline)", milliseconds);
            let milliseconds = timed(qemu_img(&["snapshot", "-c", &name], image))?;
            let operation = "qemu-img snapshot -c (offline, image written since its last snapshot)";
            timings.record(QEMU, operation, milliseconds);
        }
    }
    set.names.push_back(name);
    Ok(())
}

struct Case {
    server: &'static str,
    kind: CaseKind,
    target: Target,
    runs: Vec<Measurement>,
}

impl Case {
    /// The case's figures, named by its export or image.
    fn result(self) -> CaseResult {
        let target = match &self.target {
            Target::Lamina { export, .. } => export.clone(),
            Target::Qemu { image, .. } => image
                .file_name()
                .map_or_else(String::new, |name| name.to_string_lossy().into_owned()),
        };
        CaseResult::new(self.server, self.kind, target, self.runs)
    }
}

/// Collected wall times by (server, operation).
#[derive(Default)]
struct Timings(Vec<(String, String, Vec<f64>)>);

impl Timings {
    fn record(&mut self, server: &str, operation: &str, milliseconds: f64) {
        match self
            .0
            .iter_mut()
            .find(|(known_server, known, _)| known_server == server && known == operation)
        {
            Some((_, _, samples)) => samples.push(milliseconds),
            None => self
                .0
                .push((server.to_owned(), operation.to_owned(), vec![milliseconds])),
        }
    }

    fn into_timings(self) -> Vec<Timing> {
        self.0
            .into_iter()
            .map(|(server, operation, samples)| Timing::new(&server, &operation, samples))
            .collect()
    }
}

/// `--clone-write-size` of 4 KiB random writes over the volume, seeded with `seed`.
fn fio_random_writes(
    fio: &str,
    uri: &str,
    settings: &SnapshotsSettings,
    seed: u32,
) -> anyhow::Result<()> {
    let arguments = [
        "--name=clone-write".to_owned(),
        "--rw=randwrite".to_owned(),
        "--bs=4096".to_owned(),
        format!("--iodepth={CLONE_WRITE_IODEPTH}"),
        format!("--size={}", settings.size_bytes),
        format!("--io_size={}", settings.clone_write_bytes),
        // The same seed on both servers: the chains differ in the same blocks.
        format!("--randseed={seed}"),
    ];
    crate::fio::run(fio, uri, &arguments)?.job()?;
    Ok(())
}

fn qemu_img(arguments: &[&str], image: &Path) -> Command {
    let mut command = Command::new("qemu-img");
    command.args(arguments).arg(image);
    command
}

fn qemu_version() -> Option<String> {
    let mut command = Command::new("qemu-nbd");
    command.arg("--version");
    let output = run_helper(command).ok()?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .next()
        .map(str::to_owned)
}

/// Starts lamina's daemon on a fresh embedded pool of `--pool-size`.
fn start_lamina(arguments: &SnapshotsArgs, program: &Path, work: &Path) -> anyhow::Result<Lamina> {
    let mut extra_config = format!(
        "[pool]\nembedded_size_bytes = {}\ndefault_volume_bytes = {}\n",
        arguments.settings.pool_size_bytes, arguments.settings.size_bytes
    );
    if let Some(bytes) = arguments.settings.memory_cache_bytes {
        extra_config.push_str(&format!("[limits]\nmemory_cache_bytes = {bytes}\n"));
    }
    eprintln!("starting lamina");
    let server = start_lamina_daemon(program, &work.join("lamina"), &extra_config)?;
    Ok(Lamina {
        cli: LaminaCli::new(program, &work.join("lamina").join("data")),
        server,
    })
}

/// Starts lamina, writes its volumes, takes the snapshots and builds the clone chain;
/// adds lamina's cases to `plan`. One daemon serves everything; its `default` volume
/// is the 0-snapshot volume.
fn prepare_lamina(
    arguments: &SnapshotsArgs,
    program: &Path,
    work: &Path,
    data_file: &Path,
    plan: &mut Plan,
) -> anyhow::Result<Lamina> {
    let lamina = start_lamina(arguments, program, work)?;
    plan.notes.push(format!(
        "lamina: one daemon, pool on a {} GiB sparse file{}, data written over NBD with nbdcopy",
        arguments.settings.pool_size_bytes >> 30,
        arguments.settings.memory_cache_bytes.map_or(
            ", default limits (memory cache on)".to_owned(),
            |bytes| format!(", memory cache {} MiB", bytes >> 20)
        )
    ));
    let size = arguments.settings.size_bytes.to_string();
    for volume in ["snap1", "snapmany", "origin"] {
        lamina
            .cli
            .run(&["volume", "create", volume, "--size", &size])?;
    }
    for volume in ["default", "snap1", "snapmany", "origin"] {
        check_interrupted()?;
        eprintln!("lamina: writing {volume}");
        prefill_over_nbd(&lamina.cli.uri(volume), data_file)?;
    }
    for _ in 0..BASELINE_SAMPLES {
        let milliseconds = lamina.timed(&["volume", "list"])?;
        let operation = "lamina volume list (admin round trip)";
        plan.timings.record(LAMINA, operation, milliseconds);
    }
    for (count, volume) in [
        (0, "default"),
        (1, "snap1"),
        (arguments.settings.snapshots, "snapmany"),
    ] {
        let operation = "lamina snapshot create";
        let set = plan.snapshot_set(LAMINA, count, operation, |name| {
            lamina.timed(&["snapshot", "create", &format!("{volume}@{name}")])
        })?;
        if count > 0 {
            let milliseconds = lamina.list_snapshots(volume, count)?;
            let operation =
                format!("lamina snapshot list ({count} snapshots, all sharing every block)");
            plan.timings.record(LAMINA, &operation, milliseconds);
        }
        let export = volume.to_owned();
        let target = Target::Lamina {
            export,
            snapshots: set,
        };
        plan.add(LAMINA, CaseKind::Write { snapshots: count }, target);
    }
    let depth = arguments.settings.chain_depth;
    let previous = lamina_chain(&lamina, arguments, plan)?;
    let target = |export: String| Target::Lamina {
        export,
        snapshots: None,
    };
    plan.add_reads(LAMINA, target("origin".to_owned()), target(previous), depth);
    Ok(lamina)
}

/// The chain of `--chain-depth` clones of clones of `origin`, each written to a
/// little; the last clone's name.
fn lamina_chain(
    lamina: &Lamina,
    arguments: &SnapshotsArgs,
    plan: &mut Plan,
) -> anyhow::Result<String> {
    let depth = arguments.settings.chain_depth;
    eprintln!("lamina: chain of {depth} clones");
    let mut previous = "origin".to_owned();
    for level in 1..=depth {
        check_interrupted()?;
        let snapshot = format!("{previous}@chain{level}");
        let milliseconds = lamina.timed(&["snapshot", "create", &snapshot])?;
        plan.timings
            .record(LAMINA, "lamina snapshot create", milliseconds);
        let clone = format!("clone{level}");
        let milliseconds = lamina.timed(&["clone", &snapshot, &clone])?;
        plan.timings.record(LAMINA, "lamina clone", milliseconds);
        let uri = lamina.cli.uri(&clone);
        fio_random_writes(&arguments.common.fio, &uri, &arguments.settings, level)?;
        previous = clone;
    }
    Ok(previous)
}

/// Converts the data to qcow2 images, takes the internal snapshots and builds the
/// backing-file chain (writing to each overlay through qemu-nbd); adds qemu-nbd's cases
/// to `plan`.
fn prepare_qemu(
    arguments: &SnapshotsArgs,
    images: &Path,
    serve_directory: &Path,
    data_file: &Path,
    plan: &mut Plan,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(images)?;
    let convert = |name: &str| -> anyhow::Result<PathBuf> {
        let image = images.join(name);
        eprintln!("qemu: converting {name}");
        let mut command = Command::new("qemu-img");
        command
            .args(["convert", "-f", "raw", "-O", "qcow2"])
            .arg(data_file)
            .arg(&image);
        run_helper(command)?;
        Ok(image)
    };
    let mut write_images = Vec::new();
    for count in [0, 1, arguments.settings.snapshots] {
        write_images.push((count, convert(&format!("snapshots{count}.qcow2"))?));
    }
    let base = convert("base.qcow2")?;
    for (count, image) in write_images {
        let operation = "qemu-img snapshot -c (offline)";
        let set = plan.snapshot_set(QEMU, count, operation, |name| {
            timed(qemu_img(&["snapshot", "-c", name], &image))
        })?;
        let target = Target::Qemu {
            image,
            snapshots: set,
        };
        plan.add(QEMU, CaseKind::Write { snapshots: count }, target);
    }
    let depth = arguments.settings.chain_depth;
    eprintln!("qemu: backing chain of {depth} overlays");
    let mut previous = base.clone();
    for level in 1..=depth {
        check_interrupted()?;
        let overlay = images.join(format!("overlay{level}.qcow2"));
        let mut command = Command::new("qemu-img");
        command
            .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
            .arg(&previous)
            .arg(&overlay);
        let milliseconds = timed(command)?;
        plan.timings
            .record(QEMU, "qemu-img create -b (overlay)", milliseconds);
        let server = serve_qemu_nbd(&overlay, "qcow2", serve_directory, 1, false)?;
        let written = fio_random_writes(
            &arguments.common.fio,
            &server.uri,
            &arguments.settings,
            level,
        );
        server.stop();
        written?;
        previous = overlay;
    }
    let target = |image: PathBuf| Target::Qemu {
        image,
        snapshots: None,
    };
    plan.add_reads(QEMU, target(base), target(previous), depth);
    Ok(())
}

/// What the preparation of the servers leaves for the measurement.
#[derive(Default)]
struct Plan {
    timings: Timings,
    /// Snapshot sets of the snapshot cases, indexed by their targets.
    sets: Vec<SnapshotSet>,
    cases: Vec<Case>,
    notes: Vec<String>,
}

impl Plan {
    /// Takes `count` snapshots with `take` (each timed as `operation`) as a new set;
    /// its index, none for no snapshots.
    fn snapshot_set(
        &mut self,
        server: &str,
        count: u32,
        operation: &str,
        mut take: impl FnMut(&str) -> anyhow::Result<f64>,
    ) -> anyhow::Result<Option<usize>> {
        if count == 0 {
            return Ok(None);
        }
        eprintln!("{server}: {count} snapshots");
        let mut set = SnapshotSet::default();
        for _ in 0..count {
            check_interrupted()?;
            let name = set.next_name();
            let milliseconds = take(&name)?;
            self.timings.record(server, operation, milliseconds);
            set.names.push_back(name);
        }
        self.sets.push(set);
        Ok(Some(self.sets.len() - 1))
    }

    fn add(&mut self, server: &'static str, kind: CaseKind, target: Target) {
        self.cases.push(Case {
            server,
            kind,
            target,
            runs: Vec::new(),
        });
    }

    /// The read cases: the chain's origin and its last clone, at `depth`.
    fn add_reads(&mut self, server: &'static str, origin: Target, clone: Target, depth: u32) {
        self.add(server, CaseKind::ReadOrigin, origin);
        self.add(server, CaseKind::ReadClone { depth }, clone);
    }
}

/// Runs every case `--repetitions` times, rounds alternating in order, each after
/// a fresh snapshot where its target has a set; a case that fails is added to
/// `skipped`. Returns how qemu-nbd ran.
fn run_cases(
    arguments: &SnapshotsArgs,
    plan: &mut Plan,
    lamina: Option<&Lamina>,
    serve_directory: &Path,
    skipped: &mut Vec<Skipped>,
) -> anyhow::Result<Vec<String>> {
    let mut qemu_notes = Vec::new();
    let labels: Vec<String> = plan
        .cases
        .iter()
        .map(|case| format!("{} {}", case.server, case.kind.label()))
        .collect();
    let step = |kind: CaseKind| StepSpec {
        pattern: kind.pattern(),
        block_size_bytes: 4096,
        iodepth: arguments.settings.iodepth,
        jobs: 1,
        target_iops: None,
        runtime_seconds: arguments.settings.runtime_seconds,
        ramp_seconds: arguments.settings.ramp_seconds,
        region_bytes: arguments.settings.size_bytes,
    };
    let rounds = RoundPlan {
        rounds: arguments.settings.repetitions,
        order: Order::Alternating,
        on_failure: OnFailure::Skip,
    };
    let (cases, sets, timings) = (&plan.cases, &mut plan.sets, &mut plan.timings);
    let outcome = each_round(&labels, rounds, |row, round| {
        let case = &cases[row];
        eprintln!(
            "repetition {round}/{}: {}",
            arguments.settings.repetitions, labels[row]
        );
        if let Some(set) = case.target.snapshots().filter(|_| round > 1) {
            // A fresh snapshot right before the run; the count stays the same.
            refresh_snapshot(&case.target, &mut sets[set], lamina, timings)?;
        }
        let fio = &arguments.common.fio;
        match &case.target {
            Target::Lamina { export, .. } => {
                let lamina = lamina.expect("lamina cases exist only when lamina runs");
                crate::fio::run_step(fio, &lamina.cli.uri(export), &step(case.kind))
            }
            Target::Qemu { image, .. } => {
                let server = serve_qemu_nbd(image, "qcow2", serve_directory, 1, false)?;
                if qemu_notes.is_empty() {
                    qemu_notes.clone_from(&server.notes);
                }
                let measurement = crate::fio::run_step(fio, &server.uri, &step(case.kind));
                server.stop();
                measurement
            }
        }
    })?;
    for measured in outcome.measured {
        plan.cases[measured.row].runs.push(measured.sample);
    }
    skipped.extend(outcome.run.skipped);
    Ok(qemu_notes)
}

/// Prepares both servers, runs every case `repetitions` times and returns the report.
pub fn measure(arguments: &SnapshotsArgs) -> anyhow::Result<SnapshotsReport> {
    crate::process::install_interrupt_handler();
    crate::process::become_subreaper();
    arguments.settings.check();
    let fio_version = crate::fio::version(&arguments.common.fio)?;
    let load_average_start = load_average();
    let program = arguments.common.lamina_program();
    let with_lamina = arguments.servers.contains(&SnapshotServer::Lamina);
    if with_lamina && !program.is_file() {
        anyhow::bail!("lamina binary {} not found", program.display());
    }
    let mut skipped = Vec::new();
    let with_qemu =
        arguments.servers.contains(&SnapshotServer::QemuNbd) && qemu_installed(&mut skipped);
    let work = arguments.common.work_directory()?;
    let data_file = work.path().join("data.raw");
    let size = arguments.settings.size_bytes;
    eprintln!("preparing {} MiB of random data", size >> 20);
    crate::servers::write_random_data(&data_file, size)?;
    let mut plan = Plan::default();
    let lamina = with_lamina
        .then(|| prepare_lamina(arguments, &program, work.path(), &data_file, &mut plan))
        .transpose()?;
    let serve_directory = work.path().join("qemu-serve");
    let qemu_version = with_qemu.then(qemu_version).flatten();
    if with_qemu {
        let images = work.path().join("images");
        prepare_qemu(arguments, &images, &serve_directory, &data_file, &mut plan)?;
    }
    let qemu_notes = run_cases(
        arguments,
        &mut plan,
        lamina.as_ref(),
        &serve_directory,
        &mut skipped,
    )?;
    let Plan {
        mut timings,
        cases,
        mut notes,
        ..
    } = plan;
    if let Some(lamina) = lamina {
        notes.push(lamina.finish(&cases, &mut timings)?);
    }
    if with_qemu {
        notes.push(format!(
            "qemu-nbd: qcow2 (qemu-img convert defaults: 64 KiB clusters), {}, one server per run, started and stopped around it; snapshots and overlays made offline with qemu-img",
            qemu_notes.join(" ")
        ));
    }
    let cases: Vec<CaseResult> = cases.into_iter().map(Case::result).collect();
    let (snapshots, chain_depth) = (arguments.settings.snapshots, arguments.settings.chain_depth);
    Ok(SnapshotsReport {
        comparisons: comparisons(&cases, snapshots, chain_depth),
        settings: arguments.settings.clone(),
        fio_version,
        qemu_version,
        cases,
        timings: timings.into_timings(),
        run: RunNotes {
            notes,
            skipped,
            load_average_start,
            load_average_end: load_average(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::tests::measurement;

    fn result(server: &str, case: CaseKind, iops: &[f64]) -> CaseResult {
        let runs = iops
            .iter()
            .map(|value| measurement(*value, 500.0))
            .collect();
        CaseResult::new(server, case, "target".into(), runs)
    }

    #[test]
    fn goals_are_judged_on_lamina_medians_and_servers_are_compared_case_by_case() {
        let cases = vec![
            result(
                LAMINA,
                CaseKind::Write { snapshots: 0 },
                &[100.0, 90.0, 110.0],
            ),
            result(
                LAMINA,
                CaseKind::Write { snapshots: 1 },
                &[96.0, 50.0, 99.0],
            ),
            result(
                LAMINA,
                CaseKind::Write { snapshots: 100 },
                &[80.0, 94.0, 90.0],
            ),
            result(LAMINA, CaseKind::ReadOrigin, &[200.0]),
            result(LAMINA, CaseKind::ReadClone { depth: 20 }, &[190.0]),
            result(QEMU, CaseKind::Write { snapshots: 0 }, &[50.0]),
            result(QEMU, CaseKind::Write { snapshots: 1 }, &[25.0]),
            result(QEMU, CaseKind::Write { snapshots: 100 }, &[20.0]),
            result(QEMU, CaseKind::ReadOrigin, &[40.0]),
            result(QEMU, CaseKind::ReadClone { depth: 20 }, &[10.0]),
        ];
        let comparisons = comparisons(&cases, 100, 20);
        let find = |text: &str| {
            comparisons
                .iter()
                .find(|comparison| comparison.description == text)
                .unwrap_or_else(|| panic!("no comparison {text:?} in {comparisons:#?}"))
        };
        let one = find("lamina: IOPS randwrite, 1 snapshot / randwrite, 0 snapshots");
        assert_eq!(one.ratio, Some(0.96));
        assert_eq!(one.met, Some(true));
        let many = find("lamina: IOPS randwrite, 100 snapshots / randwrite, 0 snapshots");
        assert_eq!(many.ratio, Some(0.9));
        assert_eq!(many.met, Some(false));
        let clone = find("lamina: IOPS randread, clone depth 20 / randread, origin");
        assert_eq!(clone.ratio, Some(0.95));
        assert_eq!(clone.met, Some(true));
        let qemu = find("qemu-nbd: IOPS randwrite, 1 snapshot / randwrite, 0 snapshots");
        assert_eq!(qemu.ratio, Some(0.5));
        assert_eq!(qemu.goal_min, None);
        let versus = find("IOPS lamina / qemu-nbd, randread, clone depth 20");
        assert_eq!(versus.ratio, Some(19.0));
        assert_eq!(comparisons.len(), 6 + 5);
    }

    #[test]
    fn a_lamina_only_run_has_no_cross_server_ratios_and_the_table_shows_every_run() {
        let cases = vec![
            result(LAMINA, CaseKind::Write { snapshots: 0 }, &[1000.0, 1200.0]),
            result(LAMINA, CaseKind::Write { snapshots: 1 }, &[1100.0, 1150.0]),
        ];
        let comparisons = comparisons(&cases, 100, 20);
        assert_eq!(comparisons.len(), 1);
        let report = SnapshotsReport {
            settings: SnapshotsSettings {
                size_bytes: 1 << 30,
                runtime_seconds: 10,
                ramp_seconds: 1,
                iodepth: 32,
                repetitions: 2,
                snapshots: 100,
                chain_depth: 20,
                clone_write_bytes: 1 << 20,
                pool_size_bytes: 16 << 30,
                memory_cache_bytes: None,
            },
            fio_version: "fio-3.33".into(),
            qemu_version: None,
            cases,
            timings: vec![Timing::new(
                LAMINA,
                "lamina snapshot create",
                vec![5.0, 7.0, 6.0],
            )],
            comparisons,
            run: RunNotes {
                notes: vec![],
                skipped: vec![Skipped {
                    server: QEMU.into(),
                    reason: "not installed".into(),
                }],
                load_average_start: Some("1.00 2.00 3.00".into()),
                load_average_end: None,
            },
        };
        let table = report.table();
        assert!(table.contains("1,000 / 1,200"), "{table}");
        assert!(table.contains("1,100"), "{table}");
        assert!(table.contains("1,125"), "{table}");
        assert!(table.contains("1.02"), "{table}");
        assert!(table.contains(">= 0.95 met"), "{table}");
        assert!(table.contains("6.0"), "{table}");
        assert!(
            table.contains("skipped: qemu-nbd: not installed"),
            "{table}"
        );
    }
}
