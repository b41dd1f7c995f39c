//! The workload trace every parser produces: one sample per interval with the
//! front-end load summed over all hosts and disks, plus what the parser had to skip.

use serde::Serialize;

/// The load seen in one sampling interval, summed over every disk in the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sample {
    /// Seconds since the first sample of the trace.
    pub time_seconds: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    /// Absent when the trace does not carry byte rates.
    pub read_bytes_per_second: Option<f64>,
    pub write_bytes_per_second: Option<f64>,
    /// Mean service latency of the interval, weighted by operations.
    pub latency_ms: Option<f64>,
    /// Outstanding operations summed over the disks.
    pub queue_depth: Option<f64>,
}

impl Sample {
    /// Reads plus writes per second.
    pub fn total_iops(&self) -> f64 {
        self.read_iops + self.write_iops
    }

    /// Read plus write bytes per second, when the trace has both.
    pub fn total_bytes_per_second(&self) -> Option<f64> {
        Some(self.read_bytes_per_second? + self.write_bytes_per_second?)
    }
}

/// Which parser produced a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// Windows performance monitor, PDH-CSV 4.0.
    Perfmon,
    /// Linux `iostat -x` output captured over time.
    Iostat,
    /// `timestamp,read_iops,write_iops,read_bytes_per_sec,write_bytes_per_sec[,latency_ms,queue_depth]`.
    Csv,
}

impl TraceFormat {
    pub fn name(self) -> &'static str {
        match self {
            TraceFormat::Perfmon => "perfmon",
            TraceFormat::Iostat => "iostat",
            TraceFormat::Csv => "csv",
        }
    }
}

/// A parsed trace: samples in time order and an account of what was skipped.
#[derive(Debug, Clone, Serialize)]
pub struct Trace {
    pub format: TraceFormat,
    /// Wall-clock time of the first sample as written in the trace, when it had one.
    pub start_label: Option<String>,
    pub samples: Vec<Sample>,
    /// The typical spacing of samples (median of the gaps).
    pub interval_seconds: f64,
    /// How many disks were summed into each sample, when the trace says so.
    pub disk_count: Option<usize>,
    /// Rows that could not be used (bad timestamp, blank or non-numeric counters).
    pub skipped_row_count: usize,
    /// Columns that were not used, by name.
    pub skipped_columns: Vec<String>,
    /// Human-readable warnings about the input, in the order they arose.
    pub warnings: Vec<String>,
}

impl Trace {
    /// Sorts samples by time, rebases time to the first sample and computes the
    /// interval. Parsers call this last. Returns `None` when there are no samples.
    pub(crate) fn finish(
        format: TraceFormat,
        start_label: Option<String>,
        mut samples: Vec<Sample>,
        disk_count: Option<usize>,
        skipped_row_count: usize,
        skipped_columns: Vec<String>,
        mut warnings: Vec<String>,
    ) -> Option<Trace> {
        if samples.is_empty() {
            return None;
        }
        if samples
            .windows(2)
            .any(|pair| pair[1].time_seconds < pair[0].time_seconds)
        {
            warnings.push("samples were not in time order; sorted them".to_string());
            samples.sort_by(|a, b| a.time_seconds.total_cmp(&b.time_seconds));
        }
        let first_seconds = samples[0].time_seconds;
        for sample in &mut samples {
            sample.time_seconds -= first_seconds;
        }
        let mut gaps: Vec<f64> = samples
            .windows(2)
            .map(|pair| pair[1].time_seconds - pair[0].time_seconds)
            .filter(|gap| *gap > 0.0)
            .collect();
        gaps.sort_by(f64::total_cmp);
        // A single-sample trace has no gap; one second keeps every later division finite.
        let interval_seconds = gaps.get(gaps.len() / 2).copied().unwrap_or(1.0);
        if skipped_row_count > 0 {
            warnings.push(format!(
                "skipped {skipped_row_count} unusable row(s) (bad timestamp, blank or non-numeric counters)"
            ));
        }
        if !skipped_columns.is_empty() {
            const SHOWN_COLUMN_COUNT: usize = 5;
            let shown: Vec<&str> = skipped_columns
                .iter()
                .take(SHOWN_COLUMN_COUNT)
                .map(String::as_str)
                .collect();
            let more = skipped_columns.len().saturating_sub(SHOWN_COLUMN_COUNT);
            warnings.push(format!(
                "ignored {} column(s) not used for sizing: {}{}",
                skipped_columns.len(),
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more")
                } else {
                    String::new()
                }
            ));
        }
        Some(Trace {
            format,
            start_label,
            samples,
            interval_seconds,
            disk_count,
            skipped_row_count,
            skipped_columns,
            warnings,
        })
    }

    /// Seconds from the first to the last sample, plus one interval.
    pub fn duration_seconds(&self) -> f64 {
        self.samples.last().map_or(0.0, |last| last.time_seconds) + self.interval_seconds
    }
}
