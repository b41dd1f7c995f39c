//! `lamina bench`: latency-versus-load benchmarks of NBD servers, lamina and its peers
//! side by side, with fio as the load generator and plots of the curves.
//!
//! Three commands: `run` measures one URI with a profile; `compare` prepares the same
//! data for every selected server, starts each in turn, runs the identical workload and
//! prints one table of figures with ratios to lamina (plus a plot with one curve per
//! server); `fs` builds a filesystem on each server's export and runs postmark;
//! `snapshots` measures what snapshots and clones cost against qcow2 under qemu-nbd;
//! `tiers` measures all-flash, flash + modelled disk and the modelled disk alone;
//! `write-amplification` measures the cleaner's write amplification through fio;
//! `rebuild` measures client latency through a device failure and its rebuild;
//! `open-loop` sweeps offered rates with lamina's own NBD load generator, timing each
//! request from its intended arrival ([`open_loop`]).
//! The in-process micro-benchmarks, which drive the engine or the device layer from
//! their own process without NBD, are examples of the crates they measure (decision
//! 0060): `flush_latency`, `snapshot_create`, `cleaner_latency`, `array_write_cost`
//! and `iops_recovery_memory` (formerly `engine`) in lamina-engine, `device_iops` in
//! lamina-device, `parity` in lamina-layout, `engine_write_amplification` in
//! lamina-model.
//! See docs/bench.md for the method and its limits.

pub mod ab;
mod charts;
mod convert;
pub mod cpu;
pub mod fio;
pub mod fs;
pub mod harness;
pub mod lamina_cli;
pub mod latency_log;
pub mod nbd_client;
pub mod open_loop;
pub mod plot;
pub mod process;
pub mod rebuild;
pub mod report;
pub mod runner;
pub mod servers;
pub mod snapshots;
pub mod tiers;
pub mod workload;
pub mod write_amplification;

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use crate::harness::arguments::{CommonArgs, Draw};
use crate::harness::table::Table;
use crate::process::{find_program, install_interrupt_handler};
use crate::report::{Report, ServerResult, Skipped, compute_figures, format_number};
use crate::servers::{ServerKind, ServerOptions};
use crate::workload::{Mix, Profile, Settings};
use lamina_api::size::parse_size;

/// Command-line arguments of `lamina bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// The `lamina bench` subcommands.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Measure one NBD URI with a profile.
    Run(RunArgs),
    /// Measure lamina and peer servers on the same data, side by side.
    Compare(CompareArgs),
    /// Open-loop rate sweep timed from each request's intended arrival (own generator).
    OpenLoop(open_loop::OpenLoopArgs),
    /// Build a filesystem on each server's export and run postmark on it (needs root).
    Fs(FsArgs),
    /// What snapshots and clones cost: lamina and qemu-nbd on qcow2, side by side.
    Snapshots(snapshots::SnapshotsArgs),
    /// All-flash, flash + modelled disk and modelled disk alone: curves and reaction.
    Tiers(tiers::TiersArgs),
    /// Client IOPS and p99 through a device failure and its rebuild; idle rebuild times.
    Rebuild(rebuild::RebuildArgs),
    /// lamina builds and peers side by side in rounds: medians, ratios, server CPU per op.
    Ab(ab::AbArgs),
    /// Cleaner write amplification of 4 KiB random overwrites, through fio over NBD.
    WriteAmplification(write_amplification::WriteAmplificationArgs),
}

/// How each fio step runs (shared by `run` and `compare`).
#[derive(Debug, Clone, Args)]
pub struct StepOptions {
    /// The workload profile.
    #[arg(long, value_enum)]
    pub profile: Profile,
    /// Seconds measured per step.
    #[arg(long, default_value_t = 10)]
    pub runtime: u64,
    /// Seconds run before measuring, per step.
    #[arg(long, default_value_t = 1)]
    pub ramp: u64,
    /// Queue depth per job of the closed-loop profiles.
    #[arg(long, default_value_t = 32)]
    pub iodepth: u32,
    /// Jobs (NBD connections) of the closed-loop profiles.
    #[arg(long, default_value_t = 1)]
    pub jobs: u32,
    /// Largest job count of qd-sweep.
    #[arg(long, default_value_t = 4)]
    pub max_jobs: u32,
    /// The 4 KiB mix of qd-sweep and rate-sweep.
    #[arg(long, value_enum, default_value_t = Mix::Oltp)]
    pub mix: Mix,
    /// Poisson streams (jobs, one connection each) of rate-sweep.
    #[arg(long, default_value_t = 4)]
    pub rate_jobs: u32,
    /// Queue depth per stream of rate-sweep: deep, so arrivals rarely wait for a slot.
    #[arg(long, default_value_t = 64)]
    pub rate_iodepth: u32,
    /// Explicit rate-sweep targets in IOPS (comma-separated) instead of fractions of
    /// the calibrated closed-loop peak.
    #[arg(long, value_delimiter = ',')]
    pub rate_targets: Option<Vec<u64>>,
    /// The p99 latency objective of the headline figure, in microseconds.
    #[arg(long, default_value_t = 1000.0)]
    pub slo_us: f64,
}

impl StepOptions {
    fn settings(&self, region_bytes: u64) -> Settings {
        Settings {
            runtime_seconds: self.runtime,
            ramp_seconds: self.ramp,
            region_bytes,
            iodepth: self.iodepth,
            jobs: self.jobs,
            max_jobs: self.max_jobs,
            mix: self.mix,
            rate_jobs: self.rate_jobs,
            rate_iodepth: self.rate_iodepth,
            rate_targets: self.rate_targets.clone(),
            slo_us: self.slo_us,
        }
    }
}

/// Arguments of `lamina bench run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The NBD URI, e.g. nbd+unix:///default?socket=/var/lib/lamina/nbd.sock; repeat
    /// it as NAME=URI to measure several exports in turn, one curve each, in one
    /// report and plot.
    #[arg(long, required = true)]
    pub uri: Vec<String>,
    /// Bytes of each export the I/O covers (default: the smallest export, from
    /// nbdinfo).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// The server's PID: each step then reports the CPU time of its process tree per
    /// operation.
    #[arg(long)]
    pub server_pid: Option<u32>,
    #[command(flatten)]
    pub step: StepOptions,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Arguments of `lamina bench compare`.
#[derive(Debug, Args)]
pub struct CompareArgs {
    /// Servers to measure, in order; missing ones are skipped with a note.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = ServerKind::all())]
    pub servers: Vec<ServerKind>,
    /// Size of the data every server gets (e.g. 1G, 64M).
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    pub size: u64,
    /// Every server without its cache: lamina with `memory_cache_bytes = 0`, nbdkit's
    /// file plugin with `cache=none`, qemu-nbd with `--cache=none` (as always);
    /// implies `--device-row`.
    #[arg(long)]
    pub cache_miss: bool,
    /// Restart each server after the prefill and measure the restarted server (the
    /// host page cache is not dropped).
    #[arg(long)]
    pub restart: bool,
    /// Add a `device` row: fio with io_uring and O_DIRECT straight on a file holding
    /// the same data, the ceiling of any server on that file.
    #[arg(long)]
    pub device_row: bool,
    #[command(flatten)]
    pub step: StepOptions,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Arguments of `lamina bench fs`.
#[derive(Debug, Args)]
pub struct FsArgs {
    /// The filesystem to build.
    #[arg(long = "fs", value_enum, default_value_t = fs::Filesystem::Ext4)]
    pub filesystem: fs::Filesystem,
    /// The workload.
    #[arg(long, value_enum, default_value_t = fs::FsWorkload::Postmark)]
    pub workload: fs::FsWorkload,
    /// Servers to measure, in order; missing ones are skipped with a note.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = ServerKind::all())]
    pub servers: Vec<ServerKind>,
    /// Size of the export (e.g. 1G).
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    pub size: u64,
    /// postmark: number of files.
    #[arg(long, default_value_t = 5_000)]
    pub files: u32,
    /// postmark: number of transactions.
    #[arg(long, default_value_t = 50_000)]
    pub transactions: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Runs `lamina bench`.
pub fn run(arguments: BenchArgs) -> anyhow::Result<()> {
    install_interrupt_handler();
    match arguments.command {
        BenchCommand::Run(arguments) => run_uri(&arguments),
        BenchCommand::Compare(arguments) => {
            let report = compare(&arguments)?;
            emit(&report, &arguments.common)
        }
        BenchCommand::OpenLoop(arguments) => open_loop::run_open_loop(&arguments),
        BenchCommand::Fs(arguments) => run_fs(&arguments),
        BenchCommand::Snapshots(arguments) => snapshots::run_snapshots(&arguments),
        BenchCommand::Tiers(arguments) => tiers::run_tiers(&arguments),
        BenchCommand::Rebuild(arguments) => rebuild::run_rebuild(&arguments),
        BenchCommand::Ab(arguments) => ab::run_ab(&arguments),
        BenchCommand::WriteAmplification(arguments) => {
            write_amplification::run_write_amplification(&arguments)
        }
    }
}

fn emit(report: &Report, common: &CommonArgs) -> anyhow::Result<()> {
    let draw: Draw<'_> = Box::new(|path| plot::render(report, path));
    common.output.publish(report, &report.table(), Some(draw))
}

fn progress_bar(total_steps: u64) -> ProgressBar {
    let bar = ProgressBar::new(total_steps);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} steps {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// One export `bench run` measures: its name in the report and its URI.
struct NamedTarget {
    name: String,
    uri: String,
}

/// `NAME=URI`, or a bare URI named `target`. A name is what comes before the
/// first `=` when that holds no `:` or `/` (a URI's own `=` come after its
/// scheme).
fn named_target(argument: &str) -> NamedTarget {
    match argument.split_once('=') {
        Some((name, uri)) if !name.is_empty() && !name.contains([':', '/']) => NamedTarget {
            name: name.to_string(),
            uri: uri.to_string(),
        },
        _ => NamedTarget {
            name: "target".to_string(),
            uri: argument.to_string(),
        },
    }
}

fn run_uri(arguments: &RunArgs) -> anyhow::Result<()> {
    let version = fio::version(&arguments.common.fio)?;
    let targets: Vec<NamedTarget> = arguments.uri.iter().map(|uri| named_target(uri)).collect();
    let region_bytes = match arguments.size {
        Some(size) => size,
        None => targets
            .iter()
            .map(|target| export_size(&target.uri))
            .collect::<anyhow::Result<Vec<u64>>>()?
            .into_iter()
            .min()
            .expect("at least one --uri"),
    };
    let settings = arguments.step.settings(region_bytes);
    let profile = arguments.step.profile;
    let labels: Vec<String> = targets.iter().map(|target| target.name.clone()).collect();
    let plan = runner::RoundPlan {
        on_failure: runner::OnFailure::Stop,
        ..runner::RoundPlan::once()
    };
    let mut outcome = runner::each_round(&labels, plan, |row, _| {
        let target = &targets[row];
        let bar = progress_bar(workload::planned_step_count(profile, &settings));
        let points = workload::execute(
            &arguments.common.fio,
            profile,
            &settings,
            fio::FioTarget::Nbd { uri: &target.uri },
            arguments.server_pid,
            &mut |label| {
                bar.set_message(format!("{}: {label}", target.name));
                bar.inc(1);
            },
        );
        bar.finish_and_clear();
        let (name, uri) = (target.name.clone(), target.uri.clone());
        Ok(ServerResult::measured(
            name,
            uri,
            vec![],
            points?,
            profile,
            settings.slo_us,
        ))
    })?;
    let mut servers = outcome.samples();
    let reference = compute_figures(profile, &mut servers);
    let report = Report {
        profile,
        settings,
        fio_version: version,
        reference,
        servers,
        skipped: vec![],
    };
    emit(&report, &arguments.common)
}

fn export_size(uri: &str) -> anyhow::Result<u64> {
    let mut command = std::process::Command::new("nbdinfo");
    command.arg("--size").arg(uri);
    let output = process::run_helper(command)
        .map_err(|error| anyhow::anyhow!("cannot read the export size (give --size): {error}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("nbdinfo printed {text:?}, not a size"))
}

/// Runs `compare` and returns the report (the CLI prints it; tests inspect it).
pub fn compare(arguments: &CompareArgs) -> anyhow::Result<Report> {
    install_interrupt_handler();
    process::become_subreaper();
    let step = &arguments.step;
    let fio = &arguments.common.fio;
    let version = fio::version(fio)?;
    let settings = step.settings(arguments.size);
    let lamina = arguments.common.lamina_program();
    let work = arguments.common.work_directory()?;
    let (candidates, mut skipped) = installed(&arguments.servers, &lamina);
    let device_row = arguments.device_row || arguments.cache_miss;
    let data_file = work.path().join("data.raw");
    if !candidates.is_empty() || device_row {
        servers::write_random_data(&data_file, arguments.size)?;
    }
    let options = ServerOptions {
        lamina_program: lamina,
        data_file: data_file.clone(),
        data_size_bytes: arguments.size,
        max_connections: settings.max_connections(),
        cache_miss: arguments.cache_miss,
    };
    let per_server = workload::planned_step_count(step.profile, &settings);
    let rows = candidates.len() as u64 + u64::from(device_row);
    let bar = progress_bar(per_server * rows);
    let mut labels: Vec<String> = candidates
        .iter()
        .map(|kind| kind.name().to_owned())
        .collect();
    if device_row {
        // Last, because write profiles overwrite the file every server was copied from.
        labels.push("device".to_owned());
    }
    let mut outcome = runner::each_round(&labels, runner::RoundPlan::once(), |row, _| {
        let Some(kind) = candidates.get(row) else {
            return measure_device(&data_file, fio, step, &settings, &bar)
                .map_err(|error| anyhow::anyhow!("fio on the file failed: {error:#}"));
        };
        bar.set_message(format!("{}: starting", kind.name()));
        measure_server(*kind, &options, arguments, &settings, work.path(), &bar)
            .map_err(anyhow::Error::msg)
    })?;
    let mut results = outcome.samples();
    skipped.extend(outcome.run.skipped);
    bar.finish_and_clear();
    let reference = compute_figures(step.profile, &mut results);
    Ok(Report {
        profile: step.profile,
        settings,
        fio_version: version,
        reference,
        servers: results,
        skipped,
    })
}

/// The servers of `kinds` that are installed, once each in order, and the others
/// with why they are skipped.
fn installed(kinds: &[ServerKind], lamina: &Path) -> (Vec<ServerKind>, Vec<Skipped>) {
    let mut candidates = Vec::new();
    let mut skipped = Vec::new();
    for kind in kinds {
        if candidates.contains(kind) {
            continue;
        }
        match kind.missing_reason(lamina) {
            Some(reason) => skipped.push(Skipped {
                server: kind.name().into(),
                reason,
            }),
            None => candidates.push(*kind),
        }
    }
    (candidates, skipped)
}

/// Starts one server (restarting it after the prefill with `--restart`), runs the
/// profile against it with its CPU watched, and stops it; `Err` is why it was skipped.
fn measure_server(
    kind: ServerKind,
    options: &ServerOptions,
    arguments: &CompareArgs,
    settings: &Settings,
    work: &Path,
    bar: &ProgressBar,
) -> Result<ServerResult, String> {
    let step = &arguments.step;
    let per_server = workload::planned_step_count(step.profile, settings);
    let mut server = match servers::start(kind, options, work) {
        Ok(server) => server,
        Err(error) => {
            bar.inc(per_server);
            return Err(format!("did not come up: {error:#}"));
        }
    };
    if arguments.restart {
        bar.set_message(format!("{}: restarting", kind.name()));
        let started = std::time::Instant::now();
        if let Err(error) = server.restart() {
            bar.inc(per_server);
            return Err(format!("did not come back after a restart: {error:#}"));
        }
        server.notes.push(format!(
            "restarted after the prefill (stopped and serving again in {} ms; page cache kept)",
            started.elapsed().as_millis()
        ));
    }
    let mut completed = 0;
    let points = workload::execute(
        &arguments.common.fio,
        step.profile,
        settings,
        fio::FioTarget::Nbd { uri: &server.uri },
        server.pid(),
        &mut |label| {
            bar.set_message(format!("{}: {label}", kind.name()));
            bar.inc(1);
            completed += 1;
        },
    );
    bar.inc(per_server.saturating_sub(completed));
    let uri = server.uri.clone();
    let notes = server.notes.clone();
    server.stop();
    let points = points.map_err(|error| format!("benchmark failed: {error:#}"))?;
    let name = kind.name().to_owned();
    Ok(ServerResult::measured(
        name,
        uri,
        notes,
        points,
        step.profile,
        settings.slo_us,
    ))
}

/// The device row: the same profile with fio's io_uring engine and O_DIRECT on the file
/// of the data.
fn measure_device(
    data_file: &Path,
    fio_program: &str,
    step: &StepOptions,
    settings: &Settings,
    bar: &ProgressBar,
) -> anyhow::Result<ServerResult> {
    let points = workload::execute(
        fio_program,
        step.profile,
        settings,
        fio::FioTarget::File { path: data_file },
        None,
        &mut |label| {
            bar.set_message(format!("device: {label}"));
            bar.inc(1);
        },
    )?;
    let notes = vec!["fio --ioengine=io_uring --direct=1 on a file of the same data".into()];
    let uri = data_file.display().to_string();
    let result = ServerResult::measured(
        "device".into(),
        uri,
        notes,
        points,
        step.profile,
        settings.slo_us,
    );
    Ok(result)
}

/// One server's postmark figures in `fs`.
#[derive(Debug, Serialize)]
struct FsServerResult {
    server: String,
    result: fs::PostmarkResult,
}

/// The report of `fs`.
#[derive(Debug, Serialize)]
struct FsReport {
    filesystem: fs::Filesystem,
    workload: fs::FsWorkload,
    files: u32,
    transactions: u32,
    servers: Vec<FsServerResult>,
    skipped: Vec<Skipped>,
}

fn run_fs(arguments: &FsArgs) -> anyhow::Result<()> {
    fs::check_preconditions(arguments.filesystem)?;
    process::become_subreaper();
    let lamina = arguments.common.lamina_program();
    let work = arguments.common.work_directory()?;
    let data_file = work.path().join("data.raw");
    servers::write_random_data(&data_file, arguments.size)?;
    let options = ServerOptions {
        lamina_program: lamina.clone(),
        data_file,
        data_size_bytes: arguments.size,
        max_connections: 4,
        cache_miss: false,
    };
    let bar = progress_bar(arguments.servers.len() as u64);
    let labels: Vec<String> = arguments
        .servers
        .iter()
        .map(|kind| kind.name().to_owned())
        .collect();
    let mut outcome = runner::each_round(&labels, runner::RoundPlan::once(), |row, _| {
        let kind = arguments.servers[row];
        bar.set_message(kind.name());
        bar.inc(1);
        if let Some(reason) = kind.missing_reason(&lamina) {
            anyhow::bail!(reason);
        }
        let server = servers::start(kind, &options, work.path())
            .map_err(|error| anyhow::anyhow!("did not come up: {error:#}"))?;
        let directory = work.path().join(format!("fs-{}", kind.name()));
        let result = fs::run_postmark_on(
            &server.uri,
            arguments.filesystem,
            &directory,
            arguments.files,
            arguments.transactions,
        );
        server.stop();
        let result = result.map_err(|error| anyhow::anyhow!("postmark failed: {error:#}"))?;
        Ok(FsServerResult {
            server: kind.name().into(),
            result,
        })
    })?;
    let report = FsReport {
        filesystem: arguments.filesystem,
        workload: arguments.workload,
        files: arguments.files,
        transactions: arguments.transactions,
        servers: outcome.samples(),
        skipped: outcome.run.skipped,
    };
    bar.finish_and_clear();
    arguments
        .common
        .output
        .publish(&report, &fs_table(&report), None)
}

fn fs_table(report: &FsReport) -> String {
    let reference = report
        .servers
        .iter()
        .find(|server| server.server == "lamina")
        .or(report.servers.first());
    let figures = |result: &fs::PostmarkResult| {
        [
            result.transactions_per_second,
            result.created_per_second,
            result.read_per_second,
            result.appended_per_second,
            result.deleted_per_second,
            result.read_megabytes_per_second,
            result.write_megabytes_per_second,
        ]
    };
    let reference_values = reference.map(|reference| figures(&reference.result));
    let mut table = Table::new().column("server", |server: &FsServerResult| server.server.clone());
    let headers = [
        "tx/s",
        "created/s",
        "read/s",
        "appended/s",
        "deleted/s",
        "read MB/s",
        "write MB/s",
    ];
    for (index, header) in headers.into_iter().enumerate() {
        table = table.column(header, move |server| {
            let value = figures(&server.result)[index];
            let reference = reference_values.map(|reference| reference[index]);
            match report::ratio(Some(value), reference) {
                Some(ratio) => format!("{} ({ratio:.2}x)", format_number(value)),
                None => format_number(value),
            }
        });
    }
    let mut out = format!(
        "fs {:?} postmark ({} files, {} transactions); ratios are server / {}\n",
        report.filesystem,
        report.files,
        report.transactions,
        reference.map_or("-", |reference| reference.server.as_str())
    );
    out.push_str(&table.render(&report.servers));
    out.push_str(&report::footer(&[], None, None, &report.skipped));
    out
}

/// Whether the programs `compare` needs at minimum (fio and one peer) are installed.
pub fn peers_available() -> bool {
    find_program("fio").is_some() && find_program("nbdkit").is_some()
}

/// The lamina binary next to a workspace target directory, if built.
pub fn built_lamina(workspace_root: &Path) -> Option<PathBuf> {
    ["target/debug/lamina", "target/release/lamina"]
        .iter()
        .map(|relative| workspace_root.join(relative))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_parses_compare_with_a_server_list() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchArgs,
        }
        let cli = Cli::try_parse_from([
            "lamina",
            "compare",
            "--profile",
            "rate-sweep",
            "--servers",
            "lamina,nbdkit,qemu-nbd-qcow2",
            "--rate-targets",
            "100,200",
            "--plot",
            "out.svg",
        ])
        .expect("parses");
        let BenchCommand::Compare(compare) = cli.bench.command else {
            panic!("not compare");
        };
        assert_eq!(
            compare.servers,
            vec![
                ServerKind::Lamina,
                ServerKind::Nbdkit,
                ServerKind::QemuNbdQcow2
            ]
        );
        assert_eq!(compare.step.profile, Profile::RateSweep);
        assert_eq!(compare.step.rate_targets, Some(vec![100, 200]));
        assert_eq!(compare.size, 1 << 30);
    }

    #[test]
    fn run_targets_are_named_or_bare() {
        let named = named_target("flash=nbd+unix:///onflash?socket=/tmp/a b/nbd.sock");
        assert_eq!(
            (named.name.as_str(), named.uri.as_str()),
            ("flash", "nbd+unix:///onflash?socket=/tmp/a b/nbd.sock")
        );
        let bare = named_target("nbd+unix:///default?socket=/tmp/nbd.sock");
        assert_eq!(
            (bare.name.as_str(), bare.uri.as_str()),
            ("target", "nbd+unix:///default?socket=/tmp/nbd.sock")
        );
        let tcp = named_target("nbd://127.0.0.1:10809/default");
        assert_eq!(tcp.name, "target");
    }
}
