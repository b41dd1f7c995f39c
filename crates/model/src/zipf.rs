//! Zipf's law over ranks, the skew the simulations are run on: [`Zipf`], the
//! distribution (exact, by inverting a table of its cumulative distribution),
//! [`ZipfKeys`], an endless seeded trace drawn from it, and
//! [`ScanPollutedZipfKeys`], the same trace with one-pass sequential scans
//! between its requests.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::convert::to_usize;

/// Ranks `0..count` with probability proportional to `1 / (rank + 1)^theta`:
/// rank 0 is the most popular. The table costs 8 bytes per rank.
#[derive(Clone, Debug)]
pub struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    pub fn new(count: usize, theta: f64) -> Self {
        assert!(count > 0, "a Zipf distribution needs at least one rank");
        assert!(theta >= 0.0, "theta must not be negative");
        let mut cumulative = Vec::with_capacity(count);
        let mut total = 0.0;
        for rank in 1..=count {
            total += (rank as f64).powf(-theta);
            cumulative.push(total);
        }
        for value in &mut cumulative {
            *value /= total;
        }
        Self { cumulative }
    }

    /// How many ranks there are.
    pub fn count(&self) -> usize {
        self.cumulative.len()
    }

    /// The rank at which the cumulative distribution passes `uniform` (in
    /// 0..1): a draw, given a uniform one.
    pub fn rank_at(&self, uniform: f64) -> usize {
        self.cumulative
            .partition_point(|value| *value <= uniform)
            .min(self.cumulative.len() - 1)
    }

    /// Draws a rank.
    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        self.rank_at(rng.random())
    }

    /// The probability that a draw is `rank`.
    pub fn probability(&self, rank: usize) -> f64 {
        let below = if rank == 0 {
            0.0
        } else {
            self.cumulative[rank - 1]
        };
        self.cumulative[rank] - below
    }
}

/// An endless trace of keys `0..key_count` drawn from [`Zipf`]: key `k` has
/// rank `k`, so key 0 is the hottest. The seed fixes the trace.
pub struct ZipfKeys {
    zipf: Zipf,
    rng: SmallRng,
}

impl ZipfKeys {
    pub fn new(key_count: u64, theta: f64, seed: u64) -> Self {
        assert!(key_count > 0, "a Zipf trace needs at least one key");
        Self {
            zipf: Zipf::new(to_usize(key_count), theta),
            rng: SmallRng::seed_from_u64(seed),
        }
    }

    pub fn key_count(&self) -> u64 {
        self.zipf.count() as u64
    }
}

impl Iterator for ZipfKeys {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        // A uniform range draw rather than `Zipf::sample`'s, so that the
        // recorded cache-policy figures repeat exactly.
        let uniform: f64 = self.rng.random_range(0.0..1.0);
        Some(self.zipf.rank_at(uniform) as u64)
    }
}

/// A Zipf trace polluted by sequential scans: after every `requests_between_scans`
/// Zipf requests comes a scan of `scan_length_keys` consecutive keys that are
/// never requested again (they count up from the Zipf key count), as a backup or
/// a large file copy would read blocks once.
pub struct ScanPollutedZipfKeys {
    zipf: ZipfKeys,
    requests_between_scans: u64,
    scan_length_keys: u64,
    next_scan_key: u64,
    zipf_requests_since_scan: u64,
    scan_keys_left: u64,
}

impl ScanPollutedZipfKeys {
    pub fn new(zipf: ZipfKeys, requests_between_scans: u64, scan_length_keys: u64) -> Self {
        assert!(
            requests_between_scans > 0,
            "scans need Zipf requests between them"
        );
        let next_scan_key = zipf.key_count();
        Self {
            zipf,
            requests_between_scans,
            scan_length_keys,
            next_scan_key,
            zipf_requests_since_scan: 0,
            scan_keys_left: 0,
        }
    }

    /// Whether `key` belongs to a scan rather than to the Zipf part.
    pub fn is_scan_key(&self, key: u64) -> bool {
        key >= self.zipf.key_count()
    }
}

impl Iterator for ScanPollutedZipfKeys {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.scan_keys_left == 0 && self.zipf_requests_since_scan == self.requests_between_scans
        {
            self.scan_keys_left = self.scan_length_keys;
            self.zipf_requests_since_scan = 0;
        }
        if self.scan_keys_left > 0 {
            self.scan_keys_left -= 1;
            self.next_scan_key += 1;
            return Some(self.next_scan_key - 1);
        }
        self.zipf_requests_since_scan += 1;
        self.zipf.next()
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // small test sizes
mod tests {
    use super::*;

    #[test]
    fn zipf_keys_follow_the_distribution() {
        let key_count = 1000u64;
        let draws = 200_000;
        let mut histogram = vec![0u64; key_count as usize];
        for key in ZipfKeys::new(key_count, 0.99, 5).take(draws) {
            histogram[key as usize] += 1;
        }
        let normaliser: f64 = (1..=key_count).map(|rank| (rank as f64).powf(-0.99)).sum();
        for key in [0usize, 1, 9, 99] {
            let expected = draws as f64 * ((key + 1) as f64).powf(-0.99) / normaliser;
            let observed = histogram[key] as f64;
            assert!(
                (observed - expected).abs() < 5.0 * expected.sqrt() + 5.0,
                "key {key}: observed {observed}, expected {expected:.0}"
            );
        }
        // Uniform when theta is 0.
        let uniform: Vec<u64> = ZipfKeys::new(4, 0.0, 1).take(40_000).collect();
        for key in 0..4 {
            let count = uniform.iter().filter(|drawn| **drawn == key).count();
            assert!((9_000..11_000).contains(&count), "key {key}: {count}");
        }
    }

    #[test]
    fn scan_polluted_traces_interleave_fresh_scans() {
        let zipf = ZipfKeys::new(100, 0.99, 2);
        let trace = ScanPollutedZipfKeys::new(zipf, 10, 5);
        let keys: Vec<u64> = trace.take(45).collect();
        assert!(keys[..10].iter().all(|key| *key < 100));
        assert_eq!(&keys[10..15], &[100, 101, 102, 103, 104]);
        assert!(keys[15..25].iter().all(|key| *key < 100));
        assert_eq!(&keys[25..30], &[105, 106, 107, 108, 109]);
    }

    #[test]
    fn zipf_probabilities_sum_to_one_and_fall_with_rank() {
        let zipf = Zipf::new(1000, 0.99);
        let total: f64 = (0..1000).map(|rank| zipf.probability(rank)).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!(zipf.probability(0) > zipf.probability(1));
        assert!((zipf.probability(0) / zipf.probability(9) - 10f64.powf(0.99)).abs() < 1e-6);
        let mut rng = SmallRng::seed_from_u64(3);
        let draws = 100_000;
        let zeros = (0..draws).filter(|_| zipf.sample(&mut rng) == 0).count() as f64;
        let expected = draws as f64 * zipf.probability(0);
        assert!(
            (zeros - expected).abs() < 5.0 * expected.sqrt(),
            "{zeros} against {expected}"
        );
    }
}
