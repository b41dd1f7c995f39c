//! fio as the load generator, and the one place lamina bench runs it: checking
//! that it is installed with its nbd engine, its version, building the command
//! line of a measurement step, running it against an NBD URI ([`run`]), and
//! parsing its JSON output into typed figures. (fio's io_uring engine on a local
//! file, the peer of the in-process micro-benchmarks, is in lamina-device's
//! examples since decision 0060.)
//!
//! fio (with `--ioengine=nbd`) is the load generator so that lamina never grades its own
//! homework with a client it wrote. Latency is fio's `lat_ns` (total latency, from the
//! creation of the I/O unit to its completion, so submission time is included) with
//! `--lat_percentiles=1`; mixed workloads use `--unified_rw_reporting=both` so that the
//! combined percentiles are exact rather than merged from the two directions.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::process::{ManagedChild, check_interrupted, find_program, run_helper};

/// Percentiles requested from fio, as fio spells them in `--percentile_list`.
pub const PERCENTILE_LIST: &str = "50:90:99:99.9";

/// Errors from running fio or reading its output.
#[derive(Debug, thiserror::Error)]
pub enum FioError {
    #[error("fio output has no JSON document (stdout began with {prefix:?})")]
    NoJson { prefix: String },
    #[error("fio JSON cannot be parsed: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("fio JSON has no job")]
    NoJob,
    #[error("fio job `{job}` reported error {code}")]
    JobError { job: String, code: i64 },
    #[error("fio failed ({status}) for {uri}: {stderr}")]
    Failed {
        status: std::process::ExitStatus,
        uri: String,
        stderr: String,
    },
    #[error("fio (`{program}`) is not installed; it is the NBD client of this benchmark")]
    Missing { program: String },
    #[error("`{program}` has no nbd I/O engine (`fio --enghelp=nbd` failed: {detail})")]
    NoNbdEngine { program: String, detail: String },
}

/// fio's version (`fio-3.33`), for the report; fails when fio cannot run.
pub fn version(fio_program: &str) -> anyhow::Result<String> {
    let mut command = Command::new(fio_program);
    command.arg("--version");
    let output = run_helper(command)
        .map_err(|error| anyhow::anyhow!("fio is needed as the load generator: {error}"))?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Fails with a clear reason when fio or its nbd engine is missing.
pub fn check_nbd_engine(fio_program: &str) -> Result<(), FioError> {
    if find_program(fio_program).is_none() {
        return Err(FioError::Missing {
            program: fio_program.to_owned(),
        });
    }
    let mut command = Command::new(fio_program);
    command.arg("--enghelp=nbd");
    // The engine's help lists its one option, the NBD URI.
    match run_helper(command) {
        Ok(output) if String::from_utf8_lossy(&output.stdout).contains("uri") => Ok(()),
        Ok(output) => Err(FioError::NoNbdEngine {
            program: fio_program.to_owned(),
            detail: format!(
                "it printed no `uri` option: {:?}",
                String::from_utf8_lossy(&output.stdout).trim()
            ),
        }),
        Err(error) => Err(FioError::NoNbdEngine {
            program: fio_program.to_owned(),
            detail: format!("{error:#}"),
        }),
    }
}

/// The access pattern of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    RandomRead,
    RandomWrite,
    /// Random reads and writes, with the read share in percent.
    RandomMix {
        read_percent: u8,
    },
    SequentialRead,
    SequentialWrite,
}

impl Pattern {
    fn fio_rw(self) -> &'static str {
        match self {
            Pattern::RandomRead => "randread",
            Pattern::RandomWrite => "randwrite",
            Pattern::RandomMix { .. } => "randrw",
            Pattern::SequentialRead => "read",
            Pattern::SequentialWrite => "write",
        }
    }
}

/// One fio run: what to do, how hard, for how long.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepSpec {
    pub pattern: Pattern,
    pub block_size_bytes: u64,
    /// In-flight I/O per job (per NBD connection).
    pub iodepth: u32,
    /// Number of fio jobs, each with its own NBD connection.
    pub jobs: u32,
    /// Open-loop target: total IOPS offered, spread evenly over the jobs, Poisson arrivals.
    pub target_iops: Option<u64>,
    pub runtime_seconds: u64,
    /// Seconds run before measuring (not counted).
    pub ramp_seconds: u64,
    /// Bytes of the export the I/O covers (from offset 0).
    pub region_bytes: u64,
}

impl StepSpec {
    /// The fio arguments of this step (besides the engine, URI and output
    /// format, which [`run`] adds).
    pub fn fio_arguments(&self) -> Vec<String> {
        assert!(
            self.iodepth > 0 && self.jobs > 0,
            "iodepth and jobs must be positive"
        );
        assert!(self.runtime_seconds > 0, "runtime must be positive");
        let mut arguments = vec![
            "--name=lamina-bench".to_owned(),
            format!("--rw={}", self.pattern.fio_rw()),
            format!("--bs={}", self.block_size_bytes),
            format!("--iodepth={}", self.iodepth),
            format!("--numjobs={}", self.jobs),
            format!("--size={}", self.region_bytes),
            "--time_based".to_owned(),
            format!("--runtime={}", self.runtime_seconds),
            format!("--ramp_time={}", self.ramp_seconds),
            "--group_reporting".to_owned(),
            "--unified_rw_reporting=both".to_owned(),
            "--lat_percentiles=1".to_owned(),
            format!("--percentile_list={PERCENTILE_LIST}"),
            // Random offsets cover the region uniformly without the cost of a map.
            "--norandommap".to_owned(),
            "--randrepeat=0".to_owned(),
        ];
        if let Pattern::RandomMix { read_percent } = self.pattern {
            assert!(read_percent <= 100, "read share is a percentage");
            arguments.push(format!("--rwmixread={read_percent}"));
        }
        if let Some(target_iops) = self.target_iops {
            // fio's rate is per job; a mix is split over directions by fio itself when the
            // rate is given per direction, so give each direction its share.
            let per_job = (target_iops / u64::from(self.jobs)).max(1);
            let rate = match self.pattern {
                Pattern::RandomMix { read_percent } => {
                    let reads = (per_job * u64::from(read_percent) / 100).max(1);
                    let writes = (per_job - reads.min(per_job)).max(1);
                    format!("--rate_iops={reads},{writes}")
                }
                Pattern::RandomWrite | Pattern::SequentialWrite => {
                    format!("--rate_iops=,{per_job}")
                }
                Pattern::RandomRead | Pattern::SequentialRead => {
                    format!("--rate_iops={per_job}")
                }
            };
            arguments.push(rate);
            arguments.push("--rate_process=poisson".to_owned());
        }
        arguments
    }
}

/// Runs fio for one step and returns its summarised figures.
pub fn run_step(fio_program: &str, uri: &str, step: &StepSpec) -> anyhow::Result<Measurement> {
    run_step_with(fio_program, uri, step, &[])
}

/// What a step's I/O goes to: an NBD export, or a local file (the device row: fio's
/// io_uring engine with O_DIRECT, the ceiling any server on that file could reach).
#[derive(Debug, Clone, Copy)]
pub enum FioTarget<'a> {
    Nbd { uri: &'a str },
    File { path: &'a std::path::Path },
}

/// Runs fio for one step on `target` and returns its summarised figures.
pub fn run_step_on(
    fio_program: &str,
    target: FioTarget,
    step: &StepSpec,
) -> anyhow::Result<Measurement> {
    match target {
        FioTarget::Nbd { uri } => run_step(fio_program, uri, step),
        FioTarget::File { path } => {
            let mut command = Command::new(fio_program);
            command
                .arg("--ioengine=io_uring")
                .arg("--direct=1")
                .arg(format!("--filename={}", path.display()))
                .arg("--output-format=json")
                .args(step.fio_arguments());
            let report = run_command(command, &path.display().to_string())?;
            Ok(Measurement::from_report(&report, step.iodepth)?)
        }
    }
}

/// Runs fio for one step with `extra_arguments` appended (latency logs, a random
/// distribution) and returns its summarised figures.
pub fn run_step_with(
    fio_program: &str,
    uri: &str,
    step: &StepSpec,
    extra_arguments: &[String],
) -> anyhow::Result<Measurement> {
    let arguments = [step.fio_arguments(), extra_arguments.to_vec()].concat();
    let report = run(fio_program, uri, &arguments)?;
    Ok(Measurement::from_report(&report, step.iodepth)?)
}

/// Block size of a sequential pass, so that a disk streams.
pub const SEQUENTIAL_PASS_BLOCK_BYTES: u64 = 1 << 20;

/// One sequential pass (`pattern`: a sequential read or write) over the first
/// `bytes` of `uri`, `iodepth` deep, with `extra_arguments`: a fill or a warm-up
/// read, not a measured step (no time limit, no ramp).
pub fn sequential_pass(
    fio_program: &str,
    uri: &str,
    pattern: Pattern,
    bytes: u64,
    iodepth: u32,
    extra_arguments: &[&str],
) -> anyhow::Result<Measurement> {
    let mut arguments = vec![
        "--name=pass".to_owned(),
        format!("--rw={}", pattern.fio_rw()),
        format!("--bs={SEQUENTIAL_PASS_BLOCK_BYTES}"),
        format!("--iodepth={iodepth}"),
        format!("--size={bytes}"),
    ];
    arguments.extend(
        extra_arguments
            .iter()
            .map(|argument| (*argument).to_owned()),
    );
    let report = run(fio_program, uri, &arguments)?;
    Ok(Measurement::from_report(&report, iodepth)?)
}

/// Runs fio with its nbd engine against the export at `uri` with `arguments`
/// (the jobs: `--name=...` and their options) and parses its JSON report.
pub fn run(fio_program: &str, uri: &str, arguments: &[String]) -> anyhow::Result<FioReport> {
    run_command(nbd_command(fio_program, uri, arguments), uri)
}

/// Starts fio with its nbd engine against `uri` with `arguments` in the background
/// (its JSON report on its stdout), for runs that end when the caller stops them.
pub fn spawn(fio_program: &str, uri: &str, arguments: &[String]) -> anyhow::Result<ManagedChild> {
    let mut command = nbd_command(fio_program, uri, arguments);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    Ok(ManagedChild::spawn(command)?)
}

/// fio with its nbd engine on `uri`, a JSON report, and `arguments`.
fn nbd_command(fio_program: &str, uri: &str, arguments: &[String]) -> Command {
    let mut command = Command::new(fio_program);
    command
        .arg("--ioengine=nbd")
        .arg(format!("--uri={uri}"))
        .arg("--output-format=json")
        .args(arguments);
    command
}

/// Runs a prepared fio command as a managed child (so that Ctrl-C stops it) and
/// parses its JSON report; `target` (the URI or file) names the run in errors.
fn run_command(mut command: Command, target: &str) -> anyhow::Result<FioReport> {
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let output = ManagedChild::spawn(command)?.wait()?;
    check_interrupted()?;
    if !output.status.success() {
        return Err(FioError::Failed {
            status: output.status,
            uri: target.to_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        }
        .into());
    }
    Ok(parse_output(&String::from_utf8_lossy(&output.stdout))?)
}

/// fio's whole JSON document (only the fields lamina uses).
#[derive(Debug, Clone, Deserialize)]
pub struct FioReport {
    #[serde(rename = "fio version")]
    pub fio_version: String,
    pub jobs: Vec<FioJob>,
}

impl FioReport {
    /// The first job (with `--group_reporting`, the whole group), when it ran
    /// without error.
    pub fn job(&self) -> Result<&FioJob, FioError> {
        let job = self.jobs.first().ok_or(FioError::NoJob)?;
        if job.error != 0 {
            return Err(FioError::JobError {
                job: job.jobname.clone(),
                code: job.error,
            });
        }
        Ok(job)
    }
}

/// One job (or, with `--group_reporting`, the whole group).
#[derive(Debug, Clone, Deserialize)]
pub struct FioJob {
    pub jobname: String,
    pub error: i64,
    pub read: DirectionStats,
    pub write: DirectionStats,
    /// Present with `--unified_rw_reporting=both|mixed`: reads and writes together.
    pub mixed: Option<DirectionStats>,
    /// Share of time (percent) spent at each queue depth bucket ("1", "2", ... ">=64").
    #[serde(default)]
    pub iodepth_level: BTreeMap<String, f64>,
}

/// Figures of one direction.
#[derive(Debug, Clone, Deserialize)]
pub struct DirectionStats {
    pub io_bytes: u64,
    pub bw_bytes: u64,
    pub iops: f64,
    /// Milliseconds.
    pub runtime: u64,
    pub total_ios: u64,
    pub lat_ns: LatencyStats,
}

/// A latency distribution in nanoseconds.
#[derive(Debug, Clone, Deserialize)]
pub struct LatencyStats {
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    #[serde(rename = "N", default)]
    pub count: u64,
    /// Keyed by fio's percentile strings ("99.000000").
    #[serde(default)]
    pub percentile: BTreeMap<String, u64>,
}

impl LatencyStats {
    /// The latency at `percentile` (e.g. 99.9) in microseconds, if fio reported it.
    pub fn percentile_us(&self, percentile: f64) -> Option<f64> {
        self.percentile.iter().find_map(|(key, value)| {
            let key: f64 = key.parse().ok()?;
            ((key - percentile).abs() < 1e-6).then(|| *value as f64 / 1_000.0)
        })
    }
}

/// Extracts and parses the JSON document from fio's stdout. The nbd engine prints
/// "fio: connected to NBD server" lines on stdout before the document, so the
/// document starts at the first line that is exactly `{`.
pub fn parse_output(stdout: &str) -> Result<FioReport, FioError> {
    let start = if stdout.starts_with('{') {
        Some(0)
    } else {
        stdout.find("\n{").map(|index| index + 1)
    };
    let Some(start) = start else {
        return Err(FioError::NoJson {
            prefix: stdout.chars().take(200).collect(),
        });
    };
    Ok(serde_json::from_str(&stdout[start..])?)
}

/// The figures of one step, in the units lamina reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    pub read_iops: f64,
    pub write_iops: f64,
    pub total_iops: f64,
    pub read_megabytes_per_second: f64,
    pub write_megabytes_per_second: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub mean_us: f64,
    pub max_us: f64,
    /// Percent of time fio's queue was in the bucket holding the configured depth
    /// (">=64" for 64 and more): time the generator could not issue more I/O.
    pub full_queue_percent: f64,
    pub completed_ios: u64,
}

impl Measurement {
    /// Summarises a report of a single group (as produced with `--group_reporting`)
    /// of jobs run at `iodepth`.
    pub fn from_report(report: &FioReport, iodepth: u32) -> Result<Self, FioError> {
        let job = report.job()?;
        // A single-direction job has its figures in that direction; `mixed` equals it.
        let combined = job.mixed.as_ref().unwrap_or(if job.read.total_ios > 0 {
            &job.read
        } else {
            &job.write
        });
        let latency = &combined.lat_ns;
        let percentile = |value: f64| latency.percentile_us(value).unwrap_or(f64::NAN);
        let full_queue_percent = job
            .iodepth_level
            .iter()
            .filter(|(bucket, _)| bucket_depth(bucket) <= iodepth)
            .max_by_key(|(bucket, _)| bucket_depth(bucket))
            .map_or(0.0, |(_, share)| *share);
        Ok(Self {
            read_iops: job.read.iops,
            write_iops: job.write.iops,
            total_iops: job.read.iops + job.write.iops,
            read_megabytes_per_second: job.read.bw_bytes as f64 / 1e6,
            write_megabytes_per_second: job.write.bw_bytes as f64 / 1e6,
            p50_us: percentile(50.0),
            p90_us: percentile(90.0),
            p99_us: percentile(99.0),
            p999_us: percentile(99.9),
            mean_us: latency.mean / 1_000.0,
            max_us: latency.max as f64 / 1_000.0,
            full_queue_percent,
            completed_ios: job.read.total_ios + job.write.total_ios,
        })
    }
}

fn bucket_depth(bucket: &str) -> u32 {
    bucket.trim_start_matches(">=").parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RANDREAD: &str = include_str!("../tests/data/fio-randread4k.json");
    const OLTP: &str = include_str!("../tests/data/fio-oltp.json");
    const RATE: &str = include_str!("../tests/data/fio-oltp-rate.json");

    #[test]
    fn parses_randread_with_engine_noise_before_the_document() {
        assert!(RANDREAD.starts_with("fio: connected"));
        let report = parse_output(RANDREAD).expect("parses");
        assert_eq!(report.jobs.len(), 1);
        let measurement = Measurement::from_report(&report, 32).expect("summarises");
        assert!(measurement.read_iops > 0.0);
        assert_eq!(measurement.write_iops, 0.0);
        assert!(measurement.p50_us <= measurement.p90_us);
        assert!(measurement.p90_us <= measurement.p99_us);
        assert!(measurement.p99_us <= measurement.p999_us);
        assert!(measurement.p999_us <= measurement.max_us);
        assert!(measurement.completed_ios > 0);
    }

    #[test]
    fn oltp_mix_uses_combined_percentiles_and_both_directions() {
        let report = parse_output(OLTP).expect("parses");
        let job = &report.jobs[0];
        let mixed = job.mixed.as_ref().expect("mixed section");
        let measurement = Measurement::from_report(&report, 32).expect("summarises");
        assert!(measurement.read_iops > measurement.write_iops);
        assert!(measurement.write_iops > 0.0);
        let expected = mixed.lat_ns.percentile_us(99.0).expect("p99");
        assert_eq!(measurement.p99_us, expected);
        // 70/30 within a loose band: the mix is random per I/O.
        let read_share = measurement.read_iops / measurement.total_iops;
        assert!((0.6..0.8).contains(&read_share), "read share {read_share}");
    }

    #[test]
    fn rate_limited_run_is_near_its_target() {
        // Fixture made with --rate_iops=700,300 (1000 IOPS offered) against nbdkit.
        let report = parse_output(RATE).expect("parses");
        let measurement = Measurement::from_report(&report, 32).expect("summarises");
        assert!((900.0..1100.0).contains(&measurement.total_iops));
    }

    #[test]
    fn missing_document_and_job_errors_are_reported() {
        assert!(matches!(
            parse_output("fio: connected to NBD server\n"),
            Err(FioError::NoJson { .. })
        ));
        let report = FioReport {
            fio_version: "x".into(),
            jobs: Vec::new(),
        };
        assert!(matches!(
            Measurement::from_report(&report, 32),
            Err(FioError::NoJob)
        ));
        let mut failing = parse_output(RANDREAD).expect("parses");
        failing.jobs[0].error = 5;
        assert!(matches!(
            Measurement::from_report(&failing, 32),
            Err(FioError::JobError { code: 5, .. })
        ));
    }

    #[test]
    fn arguments_split_the_rate_over_jobs_and_directions() {
        let step = StepSpec {
            pattern: Pattern::RandomMix { read_percent: 70 },
            block_size_bytes: 4096,
            iodepth: 64,
            jobs: 2,
            target_iops: Some(10_000),
            runtime_seconds: 5,
            ramp_seconds: 1,
            region_bytes: 1 << 30,
        };
        let arguments = step.fio_arguments();
        assert!(arguments.contains(&"--rate_iops=3500,1500".to_owned()));
        assert!(arguments.contains(&"--rate_process=poisson".to_owned()));
        assert!(arguments.contains(&"--rwmixread=70".to_owned()));
        assert!(arguments.contains(&"--numjobs=2".to_owned()));
        let closed = StepSpec {
            target_iops: None,
            pattern: Pattern::RandomRead,
            ..step
        };
        let arguments = closed.fio_arguments();
        assert!(
            !arguments
                .iter()
                .any(|argument| argument.starts_with("--rate"))
        );
        assert!(arguments.contains(&"--rw=randread".to_owned()));
    }

    #[test]
    fn full_queue_share_comes_from_the_configured_depth_bucket() {
        assert_eq!(bucket_depth(">=64"), 64);
        assert_eq!(bucket_depth("16"), 16);
        let mut report = parse_output(RANDREAD).expect("parses");
        report.jobs[0].iodepth_level = [("1", 0.1), ("16", 2.0), ("32", 97.9), (">=64", 0.0)]
            .into_iter()
            .map(|(bucket, share)| (bucket.to_owned(), share))
            .collect();
        let measurement = Measurement::from_report(&report, 32).expect("summarises");
        assert_eq!(measurement.full_queue_percent, 97.9);
        let measurement = Measurement::from_report(&report, 16).expect("summarises");
        assert_eq!(measurement.full_queue_percent, 2.0);
    }
}
