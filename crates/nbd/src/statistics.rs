//! Live statistics of one export: requests, bytes and a latency histogram for
//! reads and for writes, measured from the arrival of a request's header to
//! the moment its reply is handed to the socket. Fixed memory: each histogram
//! is an array of log-bucketed atomic counters (four buckets per power of two
//! of nanoseconds, so any percentile read from it is within 19 % of the true
//! value). The request path only adds to atomics: no lock, no allocation.

use std::sync::atomic::{AtomicU64, Ordering};

/// Latencies at or above 2^LATENCY_EXPONENT_MAX ns (about 68 s) share the last bucket.
const LATENCY_EXPONENT_MAX: u32 = 36;
/// Buckets per power of two (2 bits of mantissa).
const SUB_BUCKETS_PER_POWER: usize = 4;
/// Buckets of one histogram: 0..4 ns one each, then four per power of two up
/// to 2^LATENCY_EXPONENT_MAX ns, then one for everything above.
pub const LATENCY_BUCKETS: usize = SUB_BUCKETS_PER_POWER * (LATENCY_EXPONENT_MAX as usize - 1) + 1;

/// The bucket a latency of `nanoseconds` falls in.
pub fn bucket_index(nanoseconds: u64) -> usize {
    if nanoseconds < 4 {
        return usize::try_from(nanoseconds).expect("below 4");
    }
    let exponent = 63 - nanoseconds.leading_zeros();
    if exponent >= LATENCY_EXPONENT_MAX {
        return LATENCY_BUCKETS - 1;
    }
    let mantissa = usize::try_from((nanoseconds >> (exponent - 2)) & 3).expect("two bits");
    let power = usize::try_from(exponent - 2).expect("small exponent");
    SUB_BUCKETS_PER_POWER + power * SUB_BUCKETS_PER_POWER + mantissa
}

/// The smallest latency (ns) of bucket `index`; the bucket holds values up to
/// the next bucket's lower bound.
pub fn bucket_lower_bound_ns(index: usize) -> u64 {
    assert!(index < LATENCY_BUCKETS, "bucket {index} out of range");
    if index < SUB_BUCKETS_PER_POWER {
        return u64::try_from(index).expect("small index");
    }
    let power = u32::try_from((index - SUB_BUCKETS_PER_POWER) / SUB_BUCKETS_PER_POWER)
        .expect("small power");
    let mantissa = u64::try_from(index % SUB_BUCKETS_PER_POWER).expect("small mantissa");
    (4 + mantissa) << power
}

/// The first latency (ns) past bucket `index` (`u64::MAX` for the last).
pub fn bucket_upper_bound_ns(index: usize) -> u64 {
    if index + 1 >= LATENCY_BUCKETS {
        u64::MAX
    } else {
        bucket_lower_bound_ns(index + 1)
    }
}

/// The latency (ns) below which `quantile` (0 to 1) of the counted requests
/// fell, from bucket counts, taking the middle of the bucket it lands in;
/// `None` when nothing was counted.
pub fn quantile_ns(buckets: &[u64], quantile: f64) -> Option<u64> {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return None;
    }
    // The first bucket by which `quantile` of the requests have been seen
    // (at least one request).
    let wanted = (quantile.clamp(0.0, 1.0) * total as f64).max(1.0);
    let mut seen = 0u64;
    for (index, count) in buckets.iter().enumerate() {
        seen += count;
        if seen as f64 >= wanted {
            let lower = bucket_lower_bound_ns(index);
            let upper = bucket_upper_bound_ns(index);
            if upper == u64::MAX {
                return Some(lower);
            }
            return Some(lower + (upper - lower) / 2);
        }
    }
    // Rounding left `wanted` a hair above the total: the last bucket used.
    let last = buckets.iter().rposition(|count| *count > 0)?;
    Some(bucket_lower_bound_ns(last))
}

/// The kind of request a statistic counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Read,
    Write,
}

/// Requests of one kind: how many, their bytes, their total latency and the
/// latency histogram.
#[derive(Debug)]
pub struct OperationStatistics {
    requests: AtomicU64,
    bytes: AtomicU64,
    latency_sum_ns: AtomicU64,
    buckets: [AtomicU64; LATENCY_BUCKETS],
}

impl Default for OperationStatistics {
    fn default() -> Self {
        Self {
            requests: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            latency_sum_ns: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// A copy of [`OperationStatistics`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationSnapshot {
    pub requests: u64,
    pub bytes: u64,
    /// Zero when histograms are off.
    pub latency_sum_ns: u64,
    /// [`LATENCY_BUCKETS`] counts; all zero when histograms are off.
    pub buckets: Vec<u64>,
}

impl OperationSnapshot {
    /// What happened between `earlier` and this snapshot.
    pub fn since(&self, earlier: &OperationSnapshot) -> OperationSnapshot {
        OperationSnapshot {
            requests: self.requests.saturating_sub(earlier.requests),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            latency_sum_ns: self.latency_sum_ns.saturating_sub(earlier.latency_sum_ns),
            buckets: self
                .buckets
                .iter()
                .zip(earlier.buckets.iter().chain(std::iter::repeat(&0)))
                .map(|(now, before)| now.saturating_sub(*before))
                .collect(),
        }
    }
}

impl OperationStatistics {
    fn record(&self, bytes: u64, latency_ns: Option<u64>) {
        // Relaxed: each counter is independent; readers tolerate a request
        // counted in one and not yet in another.
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        if let Some(latency_ns) = latency_ns {
            self.latency_sum_ns.fetch_add(latency_ns, Ordering::Relaxed);
            self.buckets[bucket_index(latency_ns)].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn snapshot(&self) -> OperationSnapshot {
        OperationSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            latency_sum_ns: self.latency_sum_ns.load(Ordering::Relaxed),
            buckets: self
                .buckets
                .iter()
                .map(|bucket| bucket.load(Ordering::Relaxed))
                .collect(),
        }
    }
}

/// The statistics of one export (shared by every connection to it).
#[derive(Debug, Default)]
pub struct ExportStatistics {
    /// Whether latencies are measured (a clock read per request) and kept.
    latency_histograms: bool,
    pub reads: OperationStatistics,
    pub writes: OperationStatistics,
}

impl ExportStatistics {
    pub fn new(latency_histograms: bool) -> Self {
        Self {
            latency_histograms,
            ..Self::default()
        }
    }

    /// Whether the server should read the clock when a request arrives.
    pub fn measures_latency(&self) -> bool {
        self.latency_histograms
    }

    /// Counts one request of `bytes`, answered `latency_ns` after it arrived
    /// (`None` when latency is not measured).
    pub fn record(&self, operation: Operation, bytes: u64, latency_ns: Option<u64>) {
        let latency_ns = latency_ns.filter(|_| self.latency_histograms);
        match operation {
            Operation::Read => self.reads.record(bytes, latency_ns),
            Operation::Write => self.writes.record(bytes, latency_ns),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_ordered_and_contain_their_values() {
        let mut previous = 0;
        for index in 1..LATENCY_BUCKETS {
            let lower = bucket_lower_bound_ns(index);
            assert!(lower > previous, "bucket {index}");
            assert_eq!(bucket_index(lower), index);
            assert_eq!(
                bucket_index(bucket_upper_bound_ns(index - 1) - 1),
                index - 1
            );
            previous = lower;
        }
        assert_eq!(bucket_index(u64::MAX), LATENCY_BUCKETS - 1);
        for value in [5u64, 1000, 123_456, 9_999_999] {
            let index = bucket_index(value);
            assert!(bucket_lower_bound_ns(index) <= value && value < bucket_upper_bound_ns(index));
        }
    }

    #[test]
    fn quantiles_come_within_a_bucket_of_the_truth() {
        let statistics = ExportStatistics::new(true);
        for microseconds in 1..=1000u64 {
            statistics.record(Operation::Read, 4096, Some(microseconds * 1000));
        }
        let snapshot = statistics.reads.snapshot();
        assert_eq!(snapshot.requests, 1000);
        assert_eq!(snapshot.bytes, 4096 * 1000);
        for (quantile, truth) in [(0.5, 500_000.0), (0.99, 990_000.0), (0.999, 999_000.0)] {
            let estimate = quantile_ns(&snapshot.buckets, quantile).unwrap() as f64;
            assert!(
                (estimate - truth).abs() / truth < 0.2,
                "p{quantile}: {estimate} against {truth}"
            );
        }
        assert_eq!(quantile_ns(&[0; LATENCY_BUCKETS], 0.5), None);
        let off = ExportStatistics::new(false);
        off.record(Operation::Write, 10, Some(5));
        let writes = off.writes.snapshot();
        assert_eq!((writes.requests, writes.latency_sum_ns), (1, 0));
        assert!(writes.buckets.iter().all(|count| *count == 0));
    }

    /// The request path's cost in isolation: two clock reads and a record,
    /// against a record of counts alone.
    #[test]
    #[ignore = "a measurement: cargo test --release -p lamina-nbd --lib record_cost -- --ignored --nocapture"]
    fn record_cost() {
        const RECORDS: u32 = 20_000_000;
        for histograms in [true, false] {
            let statistics = ExportStatistics::new(histograms);
            let started = std::time::Instant::now();
            for _ in 0..RECORDS {
                let arrived = statistics.measures_latency().then(std::time::Instant::now);
                let latency_ns = arrived
                    .map(|arrived| u64::try_from(arrived.elapsed().as_nanos()).unwrap_or(u64::MAX));
                statistics.record(Operation::Read, 4096, std::hint::black_box(latency_ns));
            }
            let per_record_ns = started.elapsed().as_nanos() as f64 / f64::from(RECORDS);
            println!("histograms {histograms}: {per_record_ns:.1} ns per request");
        }
    }
}
