//! What the trace says about the workload: peak, mean and steady state, the busy
//! periods the steady state is taken from, spikes and whether a cache absorbs them,
//! the read/write mix and I/O size, and signs that the traced system was saturated.
//!
//! The steady state is a high percentile of the samples inside busy periods. Busy
//! periods are found on a rolling median of the load, so a spike shorter than half
//! the window cannot make a busy period by itself, and a sample is busy when that
//! median is at least a fraction of its own maximum, so idle nights drop out
//! without anyone choosing an absolute threshold.

use serde::Serialize;

use crate::convert::saturating_usize;
use crate::trace::Trace;

/// Knobs of the analysis; `Default` gives the documented defaults.
#[derive(Debug, Clone, Serialize)]
pub struct AnalysisOptions {
    /// Percentile of busy samples taken as the steady state.
    pub steady_percentile: f64,
    /// Width of the rolling median that finds busy periods.
    pub busy_window_seconds: f64,
    /// A sample is busy when the rolling median is at least this fraction of its maximum.
    pub busy_fraction: f64,
    /// A spike is load above this multiple of the steady state.
    pub spike_factor: f64,
    /// Write-back cache that should absorb spikes: its size ...
    pub cache_size_bytes: f64,
    /// ... and the rate it can serve on top of the drives.
    pub cache_iops: f64,
    /// Latency the planned pool must meet; traced latency above it means saturation.
    pub latency_target_ms: f64,
    /// Average queue length per disk above which a disk counts as saturated.
    pub saturated_queue_per_disk: f64,
    /// Drives (spindles) behind the traced load, to judge queue lengths per drive.
    pub current_drive_count: Option<usize>,
    /// I/O size assumed when the trace has no byte rates.
    pub assumed_io_size_bytes: f64,
}

impl Default for AnalysisOptions {
    fn default() -> Self {
        AnalysisOptions {
            steady_percentile: 90.0,
            busy_window_seconds: 15.0 * 60.0,
            busy_fraction: 0.2,
            spike_factor: 1.5,
            cache_size_bytes: 8.0 * GIB,
            cache_iops: 50_000.0,
            latency_target_ms: 20.0,
            saturated_queue_per_disk: 2.0,
            current_drive_count: None,
            assumed_io_size_bytes: 8192.0,
        }
    }
}

/// Bytes in a gibibyte.
pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// A stretch of time, in seconds since the first sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Period {
    pub start_seconds: f64,
    pub duration_seconds: f64,
}

/// Load above the spike threshold for a contiguous run of samples.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spike {
    pub start_seconds: f64,
    pub duration_seconds: f64,
    pub peak_iops: f64,
    /// Peak as a multiple of the steady state.
    pub magnitude: f64,
    /// Operations above the steady state during the spike, which the cache must take.
    pub excess_operations: f64,
    /// Write bytes above the steady state, which a write-back cache must hold until
    /// the drives catch up (reads in a spike are served by the cache only if they hit).
    pub excess_write_bytes: f64,
    /// Whether the configured cache holds the excess writes and serves the rate above steady.
    pub absorbed_by_cache: bool,
}

/// Evidence that the traced system could not keep up.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Saturation {
    /// 90th percentile of latency in busy periods, when the trace has latency.
    pub busy_latency_p90_ms: Option<f64>,
    /// 90th percentile of queue length per drive in busy periods, with `--current-drives`.
    pub busy_queue_per_disk_p90: Option<f64>,
    /// 90th percentile of the total queue length in busy periods.
    pub busy_queue_p90: Option<f64>,
    pub saturated: bool,
    pub warnings: Vec<String>,
}

/// Everything the sizing steps need from the trace.
#[derive(Debug, Clone, Serialize)]
pub struct Analysis {
    pub sample_count: usize,
    pub interval_seconds: f64,
    pub duration_seconds: f64,
    pub peak_iops: f64,
    pub peak_time_seconds: f64,
    pub mean_iops: f64,
    pub steady_state_iops: f64,
    pub steady_percentile: f64,
    /// Read and write rates at the steady state, split by the busy-period mix.
    pub steady_read_iops: f64,
    pub steady_write_iops: f64,
    pub busy_threshold_iops: f64,
    pub busy_sample_count: usize,
    pub busy_periods: Vec<Period>,
    /// Writes as a fraction of all operations in busy periods.
    pub write_fraction: f64,
    /// Mean bytes per operation in busy periods; `None` without byte rates.
    pub mean_io_size_bytes: Option<f64>,
    pub mean_read_size_bytes: Option<f64>,
    pub mean_write_size_bytes: Option<f64>,
    /// The I/O size used for byte estimates: measured, or the stated assumption.
    pub io_size_bytes_used: f64,
    pub spike_threshold_iops: f64,
    pub spikes: Vec<Spike>,
    pub saturation: Saturation,
    pub warnings: Vec<String>,
}

/// The `percentile`th percentile (0 to 100) by linear interpolation between ranks.
pub fn percentile(values: &[f64], percentile: f64) -> f64 {
    assert!(
        (0.0..=100.0).contains(&percentile),
        "percentile {percentile}"
    );
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = percentile / 100.0 * (sorted.len() - 1) as f64;
    let below = saturating_usize(rank.floor());
    let above = saturating_usize(rank.ceil());
    sorted[below] + (sorted[above] - sorted[below]) * (rank - below as f64)
}

/// Median of a centred window of `window_count` samples around each sample,
/// kept as a sorted window so long traces stay fast.
pub fn rolling_median(values: &[f64], window_count: usize) -> Vec<f64> {
    assert!(window_count >= 1);
    let half = window_count / 2;
    let mut window: Vec<f64> = Vec::with_capacity(window_count + 1);
    let mut result = Vec::with_capacity(values.len());
    let mut added = 0;
    let mut removed = 0;
    for index in 0..values.len() {
        let last = (index + half).min(values.len() - 1);
        while added <= last {
            let value = values[added];
            let position = window.partition_point(|existing| *existing < value);
            window.insert(position, value);
            added += 1;
        }
        let first = index.saturating_sub(half);
        while removed < first {
            let value = values[removed];
            let position = window.partition_point(|existing| *existing < value);
            window.remove(position);
            removed += 1;
        }
        let middle = window.len() / 2;
        result.push(if window.len() % 2 == 1 {
            window[middle]
        } else {
            (window[middle - 1] + window[middle]) / 2.0
        });
    }
    result
}

pub fn analyse(trace: &Trace, options: &AnalysisOptions) -> Analysis {
    assert!(
        !trace.samples.is_empty(),
        "parsers never return empty traces"
    );
    let samples = &trace.samples;
    let interval = trace.interval_seconds;
    let totals: Vec<f64> = samples.iter().map(|sample| sample.total_iops()).collect();
    let mut warnings = Vec::new();

    // The first sample at the peak, so the report points at where it began.
    let (peak_index, peak_iops) =
        totals
            .iter()
            .copied()
            .enumerate()
            .fold((0, f64::NEG_INFINITY), |best, (index, total)| {
                if total > best.1 { (index, total) } else { best }
            });
    let mean_iops = totals.iter().sum::<f64>() / totals.len() as f64;

    // Clamped to the trace so that odd intervals (near zero) cannot overflow the count.
    let window_count =
        saturating_usize((options.busy_window_seconds / interval).round()).clamp(1, samples.len());
    if window_count * 2 > samples.len() {
        warnings.push(format!(
            "the trace ({} samples) is short for a {:.0}-minute busy window; busy periods are rough",
            samples.len(),
            options.busy_window_seconds / 60.0
        ));
    }
    let smoothed = rolling_median(&totals, window_count);
    let smoothed_maximum = smoothed.iter().copied().fold(0.0, f64::max);
    let busy_threshold_iops = options.busy_fraction * smoothed_maximum;
    let busy: Vec<bool> = smoothed
        .iter()
        .map(|value| smoothed_maximum > 0.0 && *value >= busy_threshold_iops)
        .collect();
    let busy_indices: Vec<usize> = (0..samples.len()).filter(|index| busy[*index]).collect();
    if busy_indices.is_empty() {
        warnings.push("the trace shows no load at all".to_string());
    }
    let busy_totals: Vec<f64> = busy_indices.iter().map(|index| totals[*index]).collect();
    let steady_state_iops = percentile(&busy_totals, options.steady_percentile);

    let busy_reads: f64 = busy_indices
        .iter()
        .map(|index| samples[*index].read_iops)
        .sum();
    let busy_writes: f64 = busy_indices
        .iter()
        .map(|index| samples[*index].write_iops)
        .sum();
    let write_fraction = if busy_reads + busy_writes > 0.0 {
        busy_writes / (busy_reads + busy_writes)
    } else {
        0.0
    };

    // Sizes from busy samples that carry byte rates, weighted by operations.
    let sized: Vec<usize> = busy_indices
        .iter()
        .copied()
        .filter(|index| samples[*index].total_bytes_per_second().is_some())
        .collect();
    let size_of = |bytes: fn(&crate::trace::Sample) -> f64,
                   operations: fn(&crate::trace::Sample) -> f64| {
        let total_bytes: f64 = sized.iter().map(|index| bytes(&samples[*index])).sum();
        let total_operations: f64 = sized.iter().map(|index| operations(&samples[*index])).sum();
        (total_operations > 0.0).then(|| total_bytes / total_operations)
    };
    let mean_read_size_bytes = size_of(
        |sample| sample.read_bytes_per_second.unwrap_or(0.0),
        |sample| sample.read_iops,
    );
    let mean_write_size_bytes = size_of(
        |sample| sample.write_bytes_per_second.unwrap_or(0.0),
        |sample| sample.write_iops,
    );
    let mean_io_size_bytes = size_of(
        |sample| sample.total_bytes_per_second().unwrap_or(0.0),
        |sample| sample.total_iops(),
    );
    let io_size_bytes_used = mean_io_size_bytes.unwrap_or_else(|| {
        warnings.push(format!(
            "the trace has no byte rates; assumed {:.0} KiB per operation",
            options.assumed_io_size_bytes / 1024.0
        ));
        options.assumed_io_size_bytes
    });

    let spike_threshold_iops = options.spike_factor * steady_state_iops;
    let times: Vec<f64> = samples.iter().map(|sample| sample.time_seconds).collect();
    let spikes = find_spikes(
        &totals,
        &times,
        interval,
        steady_state_iops,
        spike_threshold_iops,
        write_fraction * mean_write_size_bytes.unwrap_or(io_size_bytes_used),
        options,
    );

    let saturation = check_saturation(trace, &busy_indices, options);
    Analysis {
        sample_count: samples.len(),
        interval_seconds: interval,
        duration_seconds: trace.duration_seconds(),
        peak_iops,
        peak_time_seconds: samples[peak_index].time_seconds,
        mean_iops,
        steady_state_iops,
        steady_percentile: options.steady_percentile,
        steady_read_iops: steady_state_iops * (1.0 - write_fraction),
        steady_write_iops: steady_state_iops * write_fraction,
        busy_threshold_iops,
        busy_sample_count: busy_indices.len(),
        busy_periods: periods_of(
            &busy,
            samples.iter().map(|sample| sample.time_seconds),
            interval,
        ),
        write_fraction,
        mean_io_size_bytes,
        mean_read_size_bytes,
        mean_write_size_bytes,
        io_size_bytes_used,
        spike_threshold_iops,
        spikes,
        saturation,
        warnings,
    }
}

/// Contiguous runs of `true` as periods.
fn periods_of(flags: &[bool], times: impl Iterator<Item = f64>, interval: f64) -> Vec<Period> {
    let mut periods: Vec<Period> = Vec::new();
    let mut previous = false;
    for (flag, time) in flags.iter().zip(times) {
        if *flag {
            match periods.last_mut() {
                Some(period) if previous => {
                    period.duration_seconds = time - period.start_seconds + interval;
                }
                _ => periods.push(Period {
                    start_seconds: time,
                    duration_seconds: interval,
                }),
            }
        }
        previous = *flag;
    }
    periods
}

fn find_spikes(
    totals: &[f64],
    times: &[f64],
    interval: f64,
    steady: f64,
    threshold: f64,
    write_bytes_per_operation: f64,
    options: &AnalysisOptions,
) -> Vec<Spike> {
    let mut spikes: Vec<Spike> = Vec::new();
    if steady <= 0.0 {
        return spikes;
    }
    let mut in_spike = false;
    for (index, total) in totals.iter().copied().enumerate() {
        if total > threshold {
            let excess = (total - steady) * interval;
            match spikes.last_mut() {
                Some(spike) if in_spike => {
                    spike.duration_seconds += interval;
                    spike.peak_iops = spike.peak_iops.max(total);
                    spike.excess_operations += excess;
                }
                _ => spikes.push(Spike {
                    start_seconds: times[index],
                    duration_seconds: interval,
                    peak_iops: total,
                    magnitude: 0.0,
                    excess_operations: excess,
                    excess_write_bytes: 0.0,
                    absorbed_by_cache: false,
                }),
            }
            in_spike = true;
        } else {
            in_spike = false;
        }
    }
    for spike in &mut spikes {
        spike.magnitude = spike.peak_iops / steady;
        spike.excess_write_bytes = spike.excess_operations * write_bytes_per_operation;
        spike.absorbed_by_cache = spike.excess_write_bytes <= options.cache_size_bytes
            && spike.peak_iops - steady <= options.cache_iops;
    }
    spikes
}

fn check_saturation(
    trace: &Trace,
    busy_indices: &[usize],
    options: &AnalysisOptions,
) -> Saturation {
    let samples = &trace.samples;
    let busy_values = |field: fn(&crate::trace::Sample) -> Option<f64>| -> Option<Vec<f64>> {
        let values: Vec<f64> = busy_indices
            .iter()
            .filter_map(|index| field(&samples[*index]))
            .collect();
        (!values.is_empty()).then_some(values)
    };
    let mut warnings = Vec::new();
    let mut saturated = false;
    let busy_latency_p90_ms =
        busy_values(|sample| sample.latency_ms).map(|values| percentile(&values, 90.0));
    if let Some(latency) = busy_latency_p90_ms
        && latency > options.latency_target_ms
    {
        saturated = true;
        warnings.push(format!(
            "the traced system was saturated: 90% of busy-period latency reached {latency:.1} ms, above the {:.0} ms target; the observed load understates what users asked for",
            options.latency_target_ms
        ));
    }
    let busy_queue_p90 =
        busy_values(|sample| sample.queue_depth).map(|values| percentile(&values, 90.0));
    // Only the user knows how many spindles served the traced disks: a Windows LUN or
    // a Linux disk may be a whole array, where a queue of 10 is healthy.
    let drive_count = options.current_drive_count;
    let busy_queue_per_disk_p90 = match (busy_queue_p90, drive_count) {
        (Some(queue), Some(count)) if count > 0 => Some(queue / count as f64),
        _ => None,
    };
    if let Some(queue) = busy_queue_per_disk_p90
        && queue > options.saturated_queue_per_disk
    {
        saturated = true;
        warnings.push(format!(
            "the traced system was saturated: the disk queue reached {queue:.1} outstanding operations per disk in busy periods (over {:.0}); the observed load understates the need",
            options.saturated_queue_per_disk
        ));
    }
    if busy_queue_p90.is_some()
        && busy_queue_per_disk_p90.is_none()
        && busy_latency_p90_ms.is_none()
    {
        warnings.push(
            "the trace has queue lengths but not how many drives served them; pass --current-drives to judge the queue".to_string(),
        );
    }
    Saturation {
        busy_latency_p90_ms,
        busy_queue_per_disk_p90,
        busy_queue_p90,
        saturated,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_between_ranks() {
        let values = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(percentile(&values, 0.0), 1.0);
        assert_eq!(percentile(&values, 50.0), 3.0);
        assert_eq!(percentile(&values, 90.0), 4.6);
        assert_eq!(percentile(&values, 100.0), 5.0);
    }

    #[test]
    fn rolling_median_ignores_a_spike_shorter_than_half_the_window() {
        let values = [10.0, 10.0, 10.0, 1000.0, 10.0, 10.0, 10.0];
        assert_eq!(rolling_median(&values, 5), vec![10.0; 7]);
        assert_eq!(rolling_median(&[3.0, 1.0, 2.0], 1), vec![3.0, 1.0, 2.0]);
    }

    #[test]
    fn periods_join_consecutive_flags() {
        let flags = [false, true, true, false, true];
        let periods = periods_of(&flags, (0..5).map(|index| index as f64 * 60.0), 60.0);
        assert_eq!(
            periods,
            vec![
                Period {
                    start_seconds: 60.0,
                    duration_seconds: 120.0
                },
                Period {
                    start_seconds: 240.0,
                    duration_seconds: 60.0
                },
            ]
        );
    }
}
