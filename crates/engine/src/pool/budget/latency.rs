//! Client latency as the background budget measures it: every client read
//! and write adds its duration to a histogram of atomic counters (one
//! relaxed add, no lock: it is on every request), and the budget takes the
//! histogram's counts once per window to read a percentile from them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::convert::{saturating_u64, to_usize};

/// Buckets per doubling of latency: a percentile is read to within a
/// quarter of an octave (about 19%), fine against a target.
const BUCKETS_PER_OCTAVE_BITS: u32 = 2;

/// Octaves of microseconds the histogram covers: up to 2^32 µs (71
/// minutes); anything longer counts in the last bucket.
const OCTAVE_COUNT: usize = 32;

const BUCKET_COUNT: usize = OCTAVE_COUNT << BUCKETS_PER_OCTAVE_BITS;

/// A client request the engine times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientOperation {
    Read,
    Write,
}

/// See the module documentation.
pub(super) struct ClientLatency {
    buckets: Box<[AtomicU64]>,
}

impl ClientLatency {
    pub(super) fn new() -> Self {
        Self {
            buckets: (0..BUCKET_COUNT).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Counts one request that took `duration`.
    pub(super) fn record(&self, duration: Duration) {
        let microseconds = u64::try_from(duration.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_of(microseconds)].fetch_add(1, Ordering::Relaxed);
    }

    /// The requests counted since the last call, which starts the next
    /// window (a request counted meanwhile goes to one window or the other).
    pub(super) fn take_window(&self) -> LatencyWindow {
        LatencyWindow {
            counts: self
                .buckets
                .iter()
                .map(|bucket| bucket.swap(0, Ordering::Relaxed))
                .collect(),
        }
    }
}

/// One window's requests by latency bucket (or several windows' together).
pub(super) struct LatencyWindow {
    counts: Vec<u64>,
}

impl LatencyWindow {
    /// A window with no request.
    pub(super) fn empty() -> Self {
        Self {
            counts: vec![0; BUCKET_COUNT],
        }
    }

    /// Requests counted.
    pub(super) fn request_count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds `other`'s requests to this window's.
    pub(super) fn add(&mut self, other: &LatencyWindow) {
        for (count, more) in self.counts.iter_mut().zip(&other.counts) {
            *count += more;
        }
    }

    /// The latency `percent` of the window's requests took at most, in
    /// microseconds (the upper edge of its bucket: rounded up, so that a
    /// target is never met by rounding); none without requests.
    pub(super) fn percentile_us(&self, percent: f64) -> Option<u64> {
        let total: u64 = self.counts.iter().sum();
        if total == 0 {
            return None;
        }
        // The rank of the request at `percent`, at least the first.
        let rank = saturating_u64((total as f64 * percent / 100.0).ceil()).clamp(1, total);
        let mut seen = 0;
        for (bucket, count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return Some(bucket_upper_edge_us(bucket));
            }
        }
        unreachable!("the rank is at most the total")
    }
}

/// The bucket of a latency: one per microsecond under 4 µs, then
/// `2^BUCKETS_PER_OCTAVE_BITS` per octave.
fn bucket_of(microseconds: u64) -> usize {
    let sub_buckets = 1u64 << BUCKETS_PER_OCTAVE_BITS;
    if microseconds < sub_buckets {
        return to_usize(microseconds);
    }
    let octave = 63 - microseconds.leading_zeros();
    let within = (microseconds >> (octave - BUCKETS_PER_OCTAVE_BITS)) & (sub_buckets - 1);
    let bucket =
        ((octave - BUCKETS_PER_OCTAVE_BITS + 1) << BUCKETS_PER_OCTAVE_BITS) as u64 + within;
    to_usize(bucket).min(BUCKET_COUNT - 1)
}

/// The longest latency bucket `bucket` holds, in microseconds.
fn bucket_upper_edge_us(bucket: usize) -> u64 {
    let sub_buckets = 1usize << BUCKETS_PER_OCTAVE_BITS;
    if bucket < sub_buckets {
        return bucket as u64;
    }
    let octave = u32::try_from(bucket >> BUCKETS_PER_OCTAVE_BITS).expect("BUCKET_COUNT is small")
        - 1
        + BUCKETS_PER_OCTAVE_BITS;
    let within = (bucket & (sub_buckets - 1)) as u64;
    let width = 1u64 << (octave - BUCKETS_PER_OCTAVE_BITS);
    (1u64 << octave) + (within + 1) * width - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_latency_falls_in_a_bucket_whose_edge_is_at_most_a_quarter_octave_above() {
        for microseconds in [0, 1, 3, 4, 5, 7, 8, 100, 999, 1000, 10_000, 123_456_789] {
            let edge = bucket_upper_edge_us(bucket_of(microseconds));
            assert!(edge >= microseconds, "{microseconds} µs: edge {edge}");
            assert!(
                edge as f64 <= microseconds as f64 * 1.25 + 1.0,
                "{microseconds} µs: edge {edge}"
            );
        }
        assert_eq!(bucket_of(u64::MAX), BUCKET_COUNT - 1);
        // Consecutive buckets: each edge is the one before the next bucket's start.
        for bucket in 0..BUCKET_COUNT - 1 {
            assert_eq!(bucket_of(bucket_upper_edge_us(bucket) + 1), bucket + 1);
        }
    }

    #[test]
    fn the_percentile_of_a_window_and_the_next_window_starts_empty() {
        let latency = ClientLatency::new();
        for _ in 0..98 {
            latency.record(Duration::from_micros(100));
        }
        latency.record(Duration::from_millis(20));
        latency.record(Duration::from_millis(50));
        let window = latency.take_window();
        let p50 = window.percentile_us(50.0).expect("requests");
        assert!((100..=125).contains(&p50), "{p50}");
        let p99 = window.percentile_us(99.0).expect("requests");
        assert!((20_000..=25_000).contains(&p99), "{p99}");
        assert_eq!(latency.take_window().percentile_us(99.0), None);
    }
}
