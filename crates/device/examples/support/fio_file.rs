//! fio's io_uring engine with O_DIRECT on a local file: the peer the in-process
//! benchmarks (lamina-device's `device_iops`, lamina-engine's
//! `iops_recovery_memory`) report their ratio to, so that a figure measured on a
//! shared machine is read against what the same file gives fio in the same run.
//! Only 4 KiB random reads or random writes; the figures are fio's IOPS and its
//! completion-latency percentiles (the in-process figures start when a request is
//! issued, as fio's completion latency does).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use serde::{Deserialize, Serialize};

/// Errors from running fio on a file or reading its output.
#[derive(Debug, thiserror::Error)]
pub enum FioFileError {
    #[error("cannot run fio (`{program}`): {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("fio failed ({status}) on {path}: {stderr}")]
    Failed {
        status: std::process::ExitStatus,
        path: String,
        stderr: String,
    },
    #[error("fio output has no JSON document (stdout began with {prefix:?})")]
    NoJson { prefix: String },
    #[error("fio JSON cannot be parsed: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("fio JSON has no job")]
    NoJob,
    #[error("fio job `{job}` reported error {code}")]
    JobError { job: String, code: i64 },
}

/// 4 KiB random reads or random writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RandomPattern {
    RandomRead,
    RandomWrite,
}

impl RandomPattern {
    /// fio's `--rw` value, also the label of the figures.
    pub fn fio_name(self) -> &'static str {
        match self {
            RandomPattern::RandomRead => "randread",
            RandomPattern::RandomWrite => "randwrite",
        }
    }
}

/// What fio measured on a local file: IOPS and completion-latency percentiles.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct FileMeasurement {
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// One run of fio on a local file: what [`file_arguments`] and [`run_on_file`] take.
#[derive(Debug, Clone)]
pub struct FileRun<'a> {
    pub path: &'a Path,
    pub size_bytes: u64,
    pub pattern: RandomPattern,
    pub iodepth: usize,
    pub seconds: u64,
}

/// fio's arguments for 4 KiB random I/O with io_uring and O_DIRECT on a file.
pub fn file_arguments(run: &FileRun) -> Vec<String> {
    vec![
        "--name=peer".to_owned(),
        "--ioengine=io_uring".to_owned(),
        "--direct=1".to_owned(),
        "--bs=4k".to_owned(),
        format!("--iodepth={}", run.iodepth),
        format!("--rw={}", run.pattern.fio_name()),
        format!("--filename={}", run.path.display()),
        format!("--size={}", run.size_bytes),
        format!("--runtime={}", run.seconds),
        "--time_based".to_owned(),
        "--randrepeat=0".to_owned(),
        "--output-format=json".to_owned(),
    ]
}

/// Runs fio's io_uring engine on a local file and returns its figures.
pub fn run_on_file(fio_program: &str, run: &FileRun) -> Result<FileMeasurement, FioFileError> {
    let output = Command::new(fio_program)
        .args(file_arguments(run))
        .stdin(Stdio::null())
        .output()
        .map_err(|source| FioFileError::Spawn {
            program: fio_program.to_owned(),
            source,
        })?;
    if !output.status.success() {
        return Err(FioFileError::Failed {
            status: output.status,
            path: run.path.display().to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    measurement(&String::from_utf8_lossy(&output.stdout), run.pattern)
}

/// The figures of `pattern`'s direction in fio's JSON output. The document starts
/// at the first line that is exactly `{` (fio may print notices before it).
fn measurement(stdout: &str, pattern: RandomPattern) -> Result<FileMeasurement, FioFileError> {
    let start = if stdout.starts_with('{') {
        Some(0)
    } else {
        stdout.find("\n{").map(|index| index + 1)
    };
    let Some(start) = start else {
        return Err(FioFileError::NoJson {
            prefix: stdout.chars().take(200).collect(),
        });
    };
    let document: FioDocument = serde_json::from_str(&stdout[start..])?;
    let job = document.jobs.first().ok_or(FioFileError::NoJob)?;
    if job.error != 0 {
        return Err(FioFileError::JobError {
            job: job.jobname.clone(),
            code: job.error,
        });
    }
    let side = match pattern {
        RandomPattern::RandomRead => &job.read,
        RandomPattern::RandomWrite => &job.write,
    };
    let percentile = |value: f64| {
        side.clat_ns
            .as_ref()
            .and_then(|latency| latency.percentile_us(value))
            .unwrap_or(f64::NAN)
    };
    Ok(FileMeasurement {
        iops: side.iops,
        p50_us: percentile(50.0),
        p99_us: percentile(99.0),
    })
}

/// fio's JSON document (only the fields read here).
#[derive(Debug, Deserialize)]
struct FioDocument {
    jobs: Vec<FioJob>,
}

/// One job of fio's document.
#[derive(Debug, Deserialize)]
struct FioJob {
    jobname: String,
    error: i64,
    read: DirectionFigures,
    write: DirectionFigures,
}

/// The figures of one direction.
#[derive(Debug, Deserialize)]
struct DirectionFigures {
    iops: f64,
    /// Completion latency (submission to completion).
    #[serde(default)]
    clat_ns: Option<LatencyPercentiles>,
}

/// A latency distribution's percentiles in nanoseconds, keyed by fio's percentile
/// strings ("99.000000").
#[derive(Debug, Deserialize)]
struct LatencyPercentiles {
    #[serde(default)]
    percentile: BTreeMap<String, u64>,
}

impl LatencyPercentiles {
    /// The latency at `percentile` (e.g. 99.0) in microseconds, if fio reported it.
    fn percentile_us(&self, percentile: f64) -> Option<f64> {
        self.percentile.iter().find_map(|(key, value)| {
            let key: f64 = key.parse().ok()?;
            ((key - percentile).abs() < 1e-6).then(|| *value as f64 / 1_000.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parts of `fio --output-format=json` read here, after a notice line.
    const OUTPUT: &str = r#"note: both iodepth >= 1 and synchronous I/O engine
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "peer",
      "error" : 0,
      "read" : {
        "iops" : 41000.5,
        "clat_ns" : { "percentile" : { "50.000000" : 700000, "99.000000" : 2100000 } }
      },
      "write" : { "iops" : 0.0, "clat_ns" : { "percentile" : {} } }
    }
  ]
}
"#;

    #[test]
    fn reads_the_pattern_direction_and_completion_percentiles() {
        let figures = measurement(OUTPUT, RandomPattern::RandomRead).expect("parses");
        assert_eq!(
            figures,
            FileMeasurement {
                iops: 41000.5,
                p50_us: 700.0,
                p99_us: 2100.0
            }
        );
        let writes = measurement(OUTPUT, RandomPattern::RandomWrite).expect("parses");
        assert!(writes.p99_us.is_nan());
    }

    #[test]
    fn missing_document_and_failed_job_are_errors() {
        let no_document = measurement(
            "fio: engine io_uring not loadable",
            RandomPattern::RandomRead,
        );
        assert!(matches!(no_document, Err(FioFileError::NoJson { .. })));
        let failed = OUTPUT.replace("\"error\" : 0", "\"error\" : 5");
        let error = measurement(&failed, RandomPattern::RandomRead).unwrap_err();
        assert!(
            matches!(error, FioFileError::JobError { code: 5, .. }),
            "{error}"
        );
    }

    #[test]
    fn arguments_name_the_file_pattern_and_depth() {
        let run = FileRun {
            path: Path::new("/tmp/peer.img"),
            size_bytes: 1 << 20,
            pattern: RandomPattern::RandomWrite,
            iodepth: 32,
            seconds: 2,
        };
        let arguments = file_arguments(&run);
        for expected in [
            "--rw=randwrite",
            "--iodepth=32",
            "--filename=/tmp/peer.img",
            "--direct=1",
        ] {
            assert!(
                arguments.iter().any(|argument| argument == expected),
                "{arguments:?}"
            );
        }
    }
}
