//! fio's per-I/O latency logs, for the scenarios that need latency over time
//! rather than a run's summary: `tiers`' reaction and `rebuild`'s loaded run. Where
//! fio writes them (its options), reading them back as (completion ms, latency ns)
//! samples, and the sliding windows both scenarios cut them into.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::harness::statistics::percentile_of_sorted;

/// The log fio wrote had no sample: the run did no I/O, or fio's options changed.
#[derive(Debug, thiserror::Error)]
#[error("fio's latency log {prefix}_lat.*.log is empty")]
pub struct EmptyLatencyLog {
    pub prefix: String,
}

/// The per-I/O latency logs of one fio run: `PREFIX_lat.N.log`, one per job.
#[derive(Debug, Clone)]
pub struct LatencyLog {
    prefix: PathBuf,
    jobs: u32,
}

impl LatencyLog {
    /// The logs of a run of `jobs` jobs, written under `prefix`.
    pub fn new(prefix: &Path, jobs: u32) -> Self {
        Self {
            prefix: prefix.to_owned(),
            jobs,
        }
    }

    /// fio's options that write every I/O's latency to the logs.
    pub fn fio_arguments(&self) -> Vec<String> {
        vec![
            format!("--write_lat_log={}", self.prefix.display()),
            "--log_avg_msec=0".to_owned(),
        ]
    }

    /// Every job's samples as (completion ms, latency ns); an error when there are none.
    pub fn read(&self) -> anyhow::Result<Vec<(u64, u64)>> {
        let mut samples = Vec::new();
        for job in 1..=self.jobs {
            let path = PathBuf::from(format!("{}_lat.{job}.log", self.prefix.display()));
            let text = std::fs::read_to_string(&path)
                .map_err(|error| anyhow::anyhow!("cannot read {}: {error}", path.display()))?;
            samples.extend(parse_latency_log(&text));
        }
        if samples.is_empty() {
            return Err(EmptyLatencyLog {
                prefix: self.prefix.display().to_string(),
            }
            .into());
        }
        Ok(samples)
    }
}

/// Parses one fio latency log ("time ms, latency ns, direction, size, ...").
pub fn parse_latency_log(text: &str) -> Vec<(u64, u64)> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(',').map(str::trim);
            let time = fields.next()?.parse().ok()?;
            let latency = fields.next()?.parse().ok()?;
            Some((time, latency))
        })
        .collect()
}

/// The nearest-rank percentile of sorted latencies in nanoseconds, in microseconds.
pub fn percentile_us(sorted_ns: &[u64], percentile: f64) -> Option<f64> {
    percentile_of_sorted(sorted_ns, percentile).map(|ns| ns as f64 / 1_000.0)
}

/// A sliding window of a run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Window {
    /// End of the window, seconds from the start of the run (completion times).
    pub end_seconds: f64,
    pub completed_ios: usize,
    /// None for a window in which nothing completed.
    pub p99_us: Option<f64>,
}

/// Sliding windows of `window_ms`, every `stride_ms`, over (completion ms, latency
/// ns) samples: each holds the samples in [end − window, end); the first window
/// ends at `window_ms`, the last is the first to end after the last sample.
pub fn sliding_windows(samples: &[(u64, u64)], window_ms: u64, stride_ms: u64) -> Vec<Window> {
    assert!(
        window_ms > 0 && stride_ms > 0,
        "windows need a length and a stride"
    );
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let Some(last) = sorted.last().map(|(time, _)| *time) else {
        return Vec::new();
    };
    let mut windows = Vec::new();
    let mut end = window_ms;
    loop {
        let start = end - window_ms;
        let first = sorted.partition_point(|(time, _)| *time < start);
        let past = sorted.partition_point(|(time, _)| *time < end);
        let mut latencies: Vec<u64> = sorted[first..past].iter().map(|(_, ns)| *ns).collect();
        latencies.sort_unstable();
        windows.push(Window {
            end_seconds: end as f64 / 1_000.0,
            completed_ios: latencies.len(),
            p99_us: percentile_us(&latencies, 99.0),
        });
        if end > last {
            break;
        }
        end += stride_ms;
    }
    windows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_logs_parse_fio_lines() {
        let text = "0, 213075, 0, 4096, 0\n47, 139787, 0, 4096, 0\n\nbad line\n";
        assert_eq!(parse_latency_log(text), vec![(0, 213_075), (47, 139_787)]);
        assert_eq!(percentile_us(&[1_500], 99.0), Some(1.5));
    }
}
