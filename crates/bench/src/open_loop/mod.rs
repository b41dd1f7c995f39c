//! `lamina bench open-loop`: a rate sweep with lamina's own load generator
//! ([`generator`]), which times every request from its intended arrival, so that the
//! p99 of a step includes all queueing. For each offered rate: the achieved rate and
//! p50/p99/p99.9 from intended arrival (plus, apart, the latency from sending and the
//! generator's lateness); the headline is the highest offered rate whose p99 stays
//! within the objective (1 ms by default).
//!
//! It measures one URI (`--uri`, optionally `--server-pid` for CPU per operation) or
//! starts the servers of `compare` on the same data (`--servers`, `--size`,
//! `--cache-miss`), one after the other.

pub mod generator;

use std::time::Duration;

use clap::Args;
use serde::Serialize;

use crate::harness::arguments::CommonArgs;
use crate::harness::table::Table;
use crate::nbd_client::{self, Endpoint};
use crate::process::{check_interrupted, install_interrupt_handler};
use crate::report::{Skipped, footer, format_number};
use crate::servers::{ServerKind, ServerOptions};
use crate::workload::Mix;
use generator::{DataMode, LoadResult, LoadSpec, Schedule, run_load};
use lamina_api::size::parse_size;

/// Achieved rate below this share of the offered rate means the server did not keep up.
pub const SATURATION_ACHIEVED_SHARE: f64 = 0.95;

/// Block size of every request.
const BLOCK_BYTES: u32 = 4096;

/// Seed of the request stream (offsets, mix, Poisson gaps): runs are repeatable.
const STREAM_SEED: u64 = 0x6f70_656e_6c6f_6f70;

/// Arguments of `lamina bench open-loop`.
#[derive(Debug, Clone, Args)]
pub struct OpenLoopArgs {
    /// Measure this NBD URI instead of starting servers.
    #[arg(long)]
    pub uri: Option<String>,
    /// With --uri: the server's PID, for its CPU time per operation.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Servers to start and measure in turn (without --uri).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [ServerKind::Lamina, ServerKind::QemuNbd])]
    pub servers: Vec<ServerKind>,
    /// Size of the data every started server gets; with --uri, the region covered
    /// (default: the whole export).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Started servers without their caches (as `compare --cache-miss`).
    #[arg(long)]
    pub cache_miss: bool,
    /// The 4 KiB mix.
    #[arg(long, value_enum, default_value_t = Mix::Randread4k)]
    pub mix: Mix,
    /// NBD connections, each with its own share of the rate.
    #[arg(long, default_value_t = 1)]
    pub connections: u32,
    /// Arrival process.
    #[arg(long, value_enum, default_value_t = Schedule::Poisson)]
    pub schedule: Schedule,
    /// Seconds measured per offered rate.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Seconds served before measuring, per offered rate.
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    /// Offered rates in requests per second (comma-separated), all run, instead of the
    /// geometric sweep.
    #[arg(long, value_delimiter = ',')]
    pub rates: Option<Vec<u64>>,
    /// First rate of the geometric sweep, requests per second.
    #[arg(long, default_value_t = 2_000)]
    pub rate_start: u64,
    /// Factor between rates of the geometric sweep.
    #[arg(long, default_value_t = 1.25)]
    pub rate_factor: f64,
    /// Most rates of the geometric sweep (it stops earlier at the first step past the
    /// objective or saturated).
    #[arg(long, default_value_t = 24)]
    pub rate_steps_max: u32,
    /// Requests in flight per connection at most (arrivals beyond wait, counted).
    #[arg(long, default_value_t = 1024)]
    pub in_flight_max: usize,
    /// The p99 latency objective of the headline, in microseconds.
    #[arg(long, default_value_t = 1000.0)]
    pub slo_us: f64,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One offered rate's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RateStep {
    #[serde(flatten)]
    pub result: LoadResult,
    /// Achieved below [`SATURATION_ACHIEVED_SHARE`] of offered, or arrivals never sent.
    pub saturated: bool,
}

/// One server's sweep.
#[derive(Debug, Clone, Serialize)]
pub struct OpenLoopServer {
    pub server: String,
    pub uri: String,
    pub notes: Vec<String>,
    pub steps: Vec<RateStep>,
    /// The highest offered rate, unsaturated, whose p99 from intended arrival was
    /// within the objective.
    pub headline_offered_per_second: Option<f64>,
}

/// The report of `open-loop`.
#[derive(Debug, Clone, Serialize)]
pub struct OpenLoopReport {
    pub mix: Mix,
    pub connections: u32,
    pub schedule: Schedule,
    pub seconds: u64,
    pub warmup_seconds: u64,
    pub region_bytes: u64,
    pub slo_p99_us: f64,
    pub cache_miss: bool,
    pub servers: Vec<OpenLoopServer>,
    pub skipped: Vec<Skipped>,
}

fn read_percent(mix: Mix) -> u8 {
    match mix {
        Mix::Randread4k => 100,
        Mix::Randwrite4k => 0,
        Mix::Oltp => 70,
    }
}

/// Whether a step did not keep up with its schedule.
pub fn is_saturated(result: &LoadResult) -> bool {
    result.achieved_per_second < SATURATION_ACHIEVED_SHARE * result.offered_per_second
        || result.unissued > 0
}

/// The highest unsaturated offered rate with p99 within `slo_us`.
pub fn headline(steps: &[RateStep], slo_us: f64) -> Option<f64> {
    steps
        .iter()
        .filter(|step| !step.saturated && step.result.latency.p99_us <= slo_us)
        .map(|step| step.result.offered_per_second)
        .fold(None, |best: Option<f64>, rate| {
            Some(best.map_or(rate, |best| best.max(rate)))
        })
}

/// The rates to offer: the explicit list, or a geometric sweep.
fn planned_rates(arguments: &OpenLoopArgs) -> Vec<f64> {
    if let Some(rates) = &arguments.rates {
        let mut rates: Vec<f64> = rates.iter().map(|rate| *rate as f64).collect();
        rates.sort_by(f64::total_cmp);
        rates.dedup();
        return rates;
    }
    assert!(arguments.rate_factor > 1.0, "the sweep's rates increase");
    let mut rate = arguments.rate_start.max(1) as f64;
    let mut rates = Vec::new();
    for _ in 0..arguments.rate_steps_max {
        rates.push(rate.round());
        rate *= arguments.rate_factor;
    }
    rates
}

/// Sweeps the rates against one endpoint; a geometric sweep stops at the first step
/// past the objective or saturated (the headline is then known).
pub fn sweep(
    endpoint: &Endpoint,
    arguments: &OpenLoopArgs,
    region_bytes: u64,
    server_pid: Option<u32>,
    progress: &mut dyn FnMut(&RateStep),
) -> anyhow::Result<Vec<RateStep>> {
    let mut steps = Vec::new();
    for rate in planned_rates(arguments) {
        check_interrupted()?;
        let spec = LoadSpec {
            offered_per_second: rate,
            connections: arguments.connections,
            warmup: Duration::from_secs(arguments.warmup),
            measured: Duration::from_secs(arguments.seconds),
            schedule: arguments.schedule,
            read_percent: read_percent(arguments.mix),
            block_bytes: BLOCK_BYTES,
            region_bytes,
            in_flight_per_connection_max: arguments.in_flight_max,
            drain_timeout: Duration::from_secs(arguments.seconds),
            data: DataMode::Unchecked,
            seed: STREAM_SEED,
        };
        let result = run_load(endpoint, &spec, server_pid)?;
        let step = RateStep {
            saturated: is_saturated(&result),
            result,
        };
        progress(&step);
        let past = step.saturated || step.result.latency.p99_us > arguments.slo_us;
        steps.push(step);
        if past && arguments.rates.is_none() {
            break;
        }
    }
    Ok(steps)
}

fn progress_line(server: &str) -> impl FnMut(&RateStep) + '_ {
    move |step| {
        eprintln!(
            "{server}: offered {}/s: achieved {}/s, p99 {} us{}",
            format_number(step.result.offered_per_second),
            format_number(step.result.achieved_per_second),
            format_number(step.result.latency.p99_us),
            if step.saturated { ", saturated" } else { "" }
        );
    }
}

/// Runs `open-loop` and returns its report.
pub fn open_loop(arguments: &OpenLoopArgs) -> anyhow::Result<OpenLoopReport> {
    install_interrupt_handler();
    crate::process::become_subreaper();
    let mut report = OpenLoopReport {
        mix: arguments.mix,
        connections: arguments.connections,
        schedule: arguments.schedule,
        seconds: arguments.seconds,
        warmup_seconds: arguments.warmup,
        region_bytes: 0,
        slo_p99_us: arguments.slo_us,
        cache_miss: arguments.cache_miss,
        servers: vec![],
        skipped: vec![],
    };
    if let Some(uri) = &arguments.uri {
        let endpoint = Endpoint::parse(uri)?;
        let region_bytes = match arguments.size {
            Some(size) => size,
            None => nbd_client::connect(&endpoint)?.export_size_bytes,
        };
        report.region_bytes = region_bytes;
        let steps = sweep(
            &endpoint,
            arguments,
            region_bytes,
            arguments.server_pid,
            &mut progress_line("target"),
        )?;
        report.servers.push(OpenLoopServer {
            server: "target".into(),
            uri: uri.clone(),
            notes: vec![],
            headline_offered_per_second: headline(&steps, arguments.slo_us),
            steps,
        });
        return Ok(report);
    }
    let size = arguments.size.unwrap_or(1 << 30);
    report.region_bytes = size;
    start_and_sweep(arguments, size, &mut report)?;
    Ok(report)
}

/// Prepares the data, then starts, sweeps and stops each server in turn.
fn start_and_sweep(
    arguments: &OpenLoopArgs,
    size: u64,
    report: &mut OpenLoopReport,
) -> anyhow::Result<()> {
    let lamina = arguments.common.lamina_program();
    let work = arguments.common.work_directory()?;
    let data_file = work.path().join("data.raw");
    crate::servers::write_random_data(&data_file, size)?;
    let options = ServerOptions {
        lamina_program: lamina.clone(),
        data_file,
        data_size_bytes: size,
        max_connections: arguments.connections,
        cache_miss: arguments.cache_miss,
    };
    for kind in &arguments.servers {
        check_interrupted()?;
        let skip = |reason: String| Skipped {
            server: kind.name().into(),
            reason,
        };
        if let Some(reason) = kind.missing_reason(&lamina) {
            report.skipped.push(skip(reason));
            continue;
        }
        let server = match crate::servers::start(*kind, &options, work.path()) {
            Ok(server) => server,
            Err(error) => {
                check_interrupted()?;
                report
                    .skipped
                    .push(skip(format!("did not come up: {error:#}")));
                continue;
            }
        };
        let steps = Endpoint::parse(&server.uri)
            .map_err(anyhow::Error::from)
            .and_then(|endpoint| {
                sweep(
                    &endpoint,
                    arguments,
                    size,
                    server.pid(),
                    &mut progress_line(kind.name()),
                )
            });
        let (uri, notes) = (server.uri.clone(), server.notes.clone());
        server.stop();
        match steps {
            Ok(steps) => report.servers.push(OpenLoopServer {
                server: kind.name().into(),
                uri,
                notes,
                headline_offered_per_second: headline(&steps, arguments.slo_us),
                steps,
            }),
            Err(error) => {
                check_interrupted()?;
                report
                    .skipped
                    .push(skip(format!("sweep failed: {error:#}")));
            }
        }
    }
    Ok(())
}

impl OpenLoopReport {
    /// The human tables: the headline per server, then each server's steps.
    pub fn table(&self) -> String {
        let mut out = format!(
            "open loop {:?}, {} connection(s), {:?} arrivals, {} s per rate; latency from intended arrival; headline: highest offered rate with p99 <= {} us\n",
            self.mix,
            self.connections,
            self.schedule,
            self.seconds,
            format_number(self.slo_p99_us)
        );
        let headlines = Table::new()
            .column("server", |server: &OpenLoopServer| server.server.clone())
            .column("headline (offered/s)", |server| {
                server
                    .headline_offered_per_second
                    .map_or("-".into(), format_number)
            });
        out.push_str(&headlines.render(&self.servers));
        for server in &self.servers {
            out.push_str(&format!("\n{} steps:\n", server.server));
            out.push_str(&steps_table(&server.steps));
            if !server.notes.is_empty() {
                out.push_str(&format!("note: {}\n", server.notes.join("; ")));
            }
        }
        out.push_str(&footer(&[], None, None, &self.skipped));
        out
    }
}

fn steps_table(steps: &[RateStep]) -> String {
    let number = |value: f64| format_number(value);
    Table::new()
        .column("offered/s", |step: &RateStep| {
            number(step.result.offered_per_second)
        })
        .column("achieved/s", |step| number(step.result.achieved_per_second))
        .column("p50 us", |step| number(step.result.latency.p50_us))
        .column("p99 us", |step| number(step.result.latency.p99_us))
        .column("p99.9 us", |step| number(step.result.latency.p999_us))
        .column("sent->done p99 us", |step| {
            number(step.result.service.p99_us)
        })
        .column("late p99 us", |step| {
            number(step.result.issue_lateness.p99_us)
        })
        .column("CPU us/op", |step| {
            step.result
                .server_cpu_us_per_op
                .map_or("-".into(), format_number)
        })
        .column("saturated", |step| {
            if step.saturated { "yes" } else { "" }.to_owned()
        })
        .render(steps)
}

/// Runs `lamina bench open-loop` and prints its report.
pub fn run_open_loop(arguments: &OpenLoopArgs) -> anyhow::Result<()> {
    let report = open_loop(arguments)?;
    arguments
        .common
        .output
        .publish(&report, &report.table(), None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use generator::LatencySummary;

    fn step(offered: f64, achieved: f64, p99_us: f64) -> RateStep {
        let latency = LatencySummary {
            p50_us: p99_us / 2.0,
            p90_us: p99_us / 1.5,
            p99_us,
            p999_us: p99_us * 2.0,
            max_us: p99_us * 3.0,
            mean_us: p99_us / 2.0,
        };
        let result = LoadResult {
            offered_per_second: offered,
            achieved_per_second: achieved,
            completed: 1000,
            latency,
            service: latency,
            issue_lateness: latency,
            errors: 0,
            mismatches: 0,
            unissued: 0,
            server_cpu_us_per_op: None,
        };
        RateStep {
            saturated: is_saturated(&result),
            result,
        }
    }

    #[test]
    fn headline_is_the_highest_offered_rate_within_the_objective() {
        let steps = vec![
            step(1000.0, 1000.0, 200.0),
            step(2000.0, 1990.0, 900.0),
            step(3000.0, 2990.0, 1500.0),
            step(4000.0, 3000.0, 800.0),
        ];
        assert!(steps[3].saturated);
        assert_eq!(headline(&steps, 1000.0), Some(2000.0));
        assert_eq!(headline(&steps[2..3], 1000.0), None);
    }

    #[test]
    fn geometric_rates_grow_by_the_factor_and_explicit_ones_are_sorted() {
        use clap::Parser;
        #[derive(Debug, Parser)]
        struct Cli {
            #[command(flatten)]
            arguments: OpenLoopArgs,
        }
        let cli = Cli::try_parse_from([
            "x",
            "--rate-start",
            "1000",
            "--rate-factor",
            "2",
            "--rate-steps-max",
            "4",
        ])
        .expect("parses");
        assert_eq!(
            planned_rates(&cli.arguments),
            vec![1000.0, 2000.0, 4000.0, 8000.0]
        );
        assert_eq!(
            cli.arguments.servers,
            vec![ServerKind::Lamina, ServerKind::QemuNbd]
        );
        let cli = Cli::try_parse_from(["x", "--rates", "300,100,200"]).expect("parses");
        assert_eq!(planned_rates(&cli.arguments), vec![100.0, 200.0, 300.0]);
    }
}
