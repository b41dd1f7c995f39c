//! Per-volume I/O statistics kept by the daemon: each volume's
//! [`ExportStatistics`] (shared by every NBD connection to it, filled by the
//! NBD server), a sampler that once a second turns them into a small ring of
//! per-second samples (IOPS, bytes per second, p50 and p99 latency) for the
//! web page's charts, their Prometheus text, and the JSON the CLI's
//! `volume stats` and `top` read. All of it is fixed memory per volume.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lamina_engine::Pool;
use lamina_nbd::ExportStatistics;
use lamina_nbd::statistics::{LATENCY_BUCKETS, OperationSnapshot, bucket_index, quantile_ns};
use serde::{Deserialize, Serialize};

use crate::exposition::{Bucket, Exposition, HistogramSeries, label};

/// How often the sampler takes a sample.
pub const SAMPLE_INTERVAL_MS: u64 = 1000;
/// Samples kept per volume: five minutes at one a second.
pub const SAMPLES_KEPT_MAX: usize = 300;
/// The Prometheus histogram's bucket bounds: powers of two nanoseconds from
/// 2^LE_EXPONENT_FIRST (about 1 µs) to 2^LE_EXPONENT_LAST (about 34 s).
const LE_EXPONENT_FIRST: u32 = 10;
const LE_EXPONENT_LAST: u32 = 35;

/// One second of one volume's I/O.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// When the second ended, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_second: f64,
    pub write_bytes_per_second: f64,
    /// Latency percentiles over the second, in microseconds; none without
    /// requests (or without histograms).
    pub read_p50_us: Option<f64>,
    pub read_p99_us: Option<f64>,
    pub write_p50_us: Option<f64>,
    pub write_p99_us: Option<f64>,
}

/// Cumulative figures of one kind of request since the daemon started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OperationTotals {
    pub requests: u64,
    pub bytes: u64,
    pub latency_sum_ns: u64,
    /// Request counts per latency bucket (see `lamina_nbd::statistics`).
    pub latency_buckets: Vec<u64>,
}

impl OperationTotals {
    fn from_snapshot(snapshot: &OperationSnapshot) -> Self {
        Self {
            requests: snapshot.requests,
            bytes: snapshot.bytes,
            latency_sum_ns: snapshot.latency_sum_ns,
            latency_buckets: snapshot.buckets.clone(),
        }
    }

    /// Back to a snapshot, for differences and percentiles.
    pub fn snapshot(&self) -> OperationSnapshot {
        OperationSnapshot {
            requests: self.requests,
            bytes: self.bytes,
            latency_sum_ns: self.latency_sum_ns,
            buckets: self.latency_buckets.clone(),
        }
    }
}

/// One volume's cumulative I/O, as `volume_io` answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeIo {
    pub volume: String,
    pub latency_histograms: bool,
    pub reads: OperationTotals,
    pub writes: OperationTotals,
}

/// What the sampler keeps of one volume.
struct Tracked {
    statistics: Arc<ExportStatistics>,
    previous: Option<[OperationSnapshot; 2]>,
    samples: VecDeque<Sample>,
}

/// Every opened volume's statistics and samples, by volume identifier
/// (identifiers are never reused, and survive renames).
pub struct VolumeStatistics {
    latency_histograms: bool,
    volumes: Mutex<BTreeMap<u32, Tracked>>,
}

impl VolumeStatistics {
    pub fn new(latency_histograms: bool) -> Self {
        Self {
            latency_histograms,
            volumes: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn latency_histograms(&self) -> bool {
        self.latency_histograms
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, Tracked>> {
        self.volumes
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The statistics a new connection to `volume_id` records into (at the
    /// handshake, never per request).
    pub fn for_volume(&self, volume_id: u32) -> Arc<ExportStatistics> {
        let mut volumes = self.lock();
        let tracked = volumes.entry(volume_id).or_insert_with(|| Tracked {
            statistics: Arc::new(ExportStatistics::new(self.latency_histograms)),
            previous: None,
            samples: VecDeque::with_capacity(SAMPLES_KEPT_MAX),
        });
        Arc::clone(&tracked.statistics)
    }

    /// Takes one sample of every tracked volume; forgets deleted volumes.
    pub fn sample(&self, pool: &Pool, interval_seconds: f64) {
        let unix_ms = u64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis(),
        )
        .unwrap_or(u64::MAX);
        let mut volumes = self.lock();
        volumes.retain(|volume_id, _| pool.volume_size_bytes(*volume_id).is_some());
        for tracked in volumes.values_mut() {
            let now = [
                tracked.statistics.reads.snapshot(),
                tracked.statistics.writes.snapshot(),
            ];
            if let Some(previous) = &tracked.previous {
                let reads = now[0].since(&previous[0]);
                let writes = now[1].since(&previous[1]);
                if tracked.samples.len() == SAMPLES_KEPT_MAX {
                    tracked.samples.pop_front();
                }
                tracked
                    .samples
                    .push_back(sample_of(unix_ms, &reads, &writes, interval_seconds));
            }
            tracked.previous = Some(now);
        }
    }

    /// The samples of the volume `volume_id` (oldest first).
    pub fn samples(&self, volume_id: u32) -> Vec<Sample> {
        self.lock()
            .get(&volume_id)
            .map(|tracked| tracked.samples.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The cumulative figures of `volume_id` (zeros when never opened).
    pub fn totals(&self, volume_id: u32, name: &str) -> VolumeIo {
        let (reads, writes) = match self.lock().get(&volume_id) {
            Some(tracked) => (
                tracked.statistics.reads.snapshot(),
                tracked.statistics.writes.snapshot(),
            ),
            None => {
                let empty = OperationSnapshot {
                    requests: 0,
                    bytes: 0,
                    latency_sum_ns: 0,
                    buckets: vec![0; LATENCY_BUCKETS],
                };
                (empty.clone(), empty)
            }
        };
        VolumeIo {
            volume: name.to_string(),
            latency_histograms: self.latency_histograms,
            reads: OperationTotals::from_snapshot(&reads),
            writes: OperationTotals::from_snapshot(&writes),
        }
    }

    /// Takes a sample every [`SAMPLE_INTERVAL_MS`] until `shutdown`.
    pub async fn run_sampler(self: Arc<Self>, pool: Pool, shutdown: lamina_nbd::CancellationToken) {
        let mut ticks = tokio::time::interval(Duration::from_millis(SAMPLE_INTERVAL_MS));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                now = ticks.tick() => {
                    let seconds = now.duration_since(last).as_secs_f64().max(1e-3);
                    last = now;
                    self.sample(&pool, seconds);
                }
            }
        }
    }
}

/// Percentile `quantile` of `snapshot` in microseconds.
pub fn percentile_us(snapshot: &OperationSnapshot, quantile: f64) -> Option<f64> {
    quantile_ns(&snapshot.buckets, quantile).map(|nanoseconds| nanoseconds as f64 / 1e3)
}

fn sample_of(
    unix_ms: u64,
    reads: &OperationSnapshot,
    writes: &OperationSnapshot,
    seconds: f64,
) -> Sample {
    Sample {
        unix_ms,
        read_iops: reads.requests as f64 / seconds,
        write_iops: writes.requests as f64 / seconds,
        read_bytes_per_second: reads.bytes as f64 / seconds,
        write_bytes_per_second: writes.bytes as f64 / seconds,
        read_p50_us: percentile_us(reads, 0.5),
        read_p99_us: percentile_us(reads, 0.99),
        write_p50_us: percentile_us(writes, 0.5),
        write_p99_us: percentile_us(writes, 0.99),
    }
}

/// `lamina_volume_requests_total`, `lamina_volume_bytes_total` and the
/// histogram `lamina_volume_request_seconds` (when histograms are on), by
/// volume and operation, for the volumes in `names` (identifier, name).
pub fn metrics(
    statistics: &VolumeStatistics,
    names: &[(u32, String)],
    exposition: &mut Exposition,
) {
    let totals: Vec<VolumeIo> = names
        .iter()
        .map(|(volume_id, name)| statistics.totals(*volume_id, name))
        .collect();
    let operations = |volume: &VolumeIo| {
        [
            ("read", volume.reads.clone()),
            ("write", volume.writes.clone()),
        ]
    };
    type Field = fn(&OperationTotals) -> u64;
    let counters: [(&str, &str, Field); 2] = [
        (
            "lamina_volume_requests_total",
            "NBD read and write requests answered, by volume and operation, since the daemon started.",
            |figures| figures.requests,
        ),
        (
            "lamina_volume_bytes_total",
            "Bytes read and written by NBD requests, by volume and operation, since the daemon started.",
            |figures| figures.bytes,
        ),
    ];
    for (name, help, field) in counters {
        let mut family = exposition.counter(name, help);
        for volume in &totals {
            for (operation, figures) in operations(volume) {
                let labels = [label("volume", &volume.volume), label("op", operation)];
                family.sample(&labels, field(&figures));
            }
        }
    }
    if !statistics.latency_histograms() {
        return;
    }
    let mut histogram = exposition.histogram(
        "lamina_volume_request_seconds",
        "Time from an NBD request's arrival to its reply, by volume and operation.",
    );
    for volume in &totals {
        for (operation, figures) in operations(volume) {
            let labels = [label("volume", &volume.volume), label("op", operation)];
            histogram.series(&labels, &histogram_series(&figures));
        }
    }
}

/// One volume's and operation's latency buckets as a histogram in seconds,
/// with bounds at powers of two nanoseconds.
fn histogram_series(figures: &OperationTotals) -> HistogramSeries {
    let mut cumulative = 0u64;
    let mut next_bucket = 0usize;
    let mut buckets = Vec::new();
    for exponent in LE_EXPONENT_FIRST..=LE_EXPONENT_LAST {
        let bound_ns = 1u64 << exponent;
        // Every internal bucket below the bound lies wholly under it: the
        // bounds are powers of two, which are bucket boundaries.
        let end = bucket_index(bound_ns);
        cumulative += figures.latency_buckets[next_bucket..end]
            .iter()
            .sum::<u64>();
        next_bucket = end;
        buckets.push(Bucket {
            upper_bound: bound_ns as f64 / 1e9,
            cumulative_count: cumulative,
        });
    }
    HistogramSeries {
        buckets,
        sum: figures.latency_sum_ns as f64 / 1e9,
        count: figures.latency_buckets.iter().sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_nbd::statistics::Operation;

    #[test]
    fn histogram_lines_are_cumulative_and_end_at_the_count() {
        let statistics = VolumeStatistics::new(true);
        let volume = statistics.for_volume(7);
        volume.record(Operation::Read, 4096, Some(1_500)); // 1.5 µs
        volume.record(Operation::Read, 4096, Some(3_000_000)); // 3 ms
        volume.record(Operation::Write, 8192, Some(100_000_000_000)); // 100 s
        let mut exposition = Exposition::new();
        metrics(&statistics, &[(7, "db".to_string())], &mut exposition);
        let text = exposition.into_text();
        let line = |prefix: &str| {
            text.lines()
                .find(|line| line.starts_with(prefix))
                .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
                .rsplit(' ')
                .next()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            line(
                "lamina_volume_request_seconds_bucket{volume=\"db\",op=\"read\",le=\"0.000001024\"}"
            ),
            "0"
        );
        assert_eq!(
            line(
                "lamina_volume_request_seconds_bucket{volume=\"db\",op=\"read\",le=\"0.000002048\"}"
            ),
            "1"
        );
        assert_eq!(
            line(
                "lamina_volume_request_seconds_bucket{volume=\"db\",op=\"read\",le=\"0.004194304\"}"
            ),
            "2"
        );
        assert_eq!(
            line(
                "lamina_volume_request_seconds_bucket{volume=\"db\",op=\"write\",le=\"34.359738368\"}"
            ),
            "0"
        );
        assert_eq!(
            line("lamina_volume_request_seconds_bucket{volume=\"db\",op=\"write\",le=\"+Inf\"}"),
            "1"
        );
        assert_eq!(
            line("lamina_volume_request_seconds_count{volume=\"db\",op=\"read\"}"),
            "2"
        );
        assert_eq!(
            line("lamina_volume_request_seconds_sum{volume=\"db\",op=\"read\"}"),
            "0.0030015"
        );
        assert_eq!(
            line("lamina_volume_bytes_total{volume=\"db\",op=\"write\"}"),
            "8192"
        );
        let off = VolumeStatistics::new(false);
        let mut exposition = Exposition::new();
        metrics(&off, &[(1, "x".to_string())], &mut exposition);
        let text = exposition.into_text();
        assert!(!text.contains("lamina_volume_request_seconds"), "{text}");
        assert!(text.contains("lamina_volume_requests_total{volume=\"x\",op=\"read\"} 0"));
    }
}
