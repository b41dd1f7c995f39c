//! The statistics of a scenario's samples, in one place: medians of repeated runs
//! and nearest-rank percentiles of sorted latencies. Latencies counted by the
//! million (the open-loop generator, the cleaner benchmark) go to `hdrhistogram`
//! instead, whose percentiles these match.

use crate::convert::saturating_usize;

/// The median (mean of the middle two for an even count), NaN values left out;
/// NaN when nothing is left.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        f64::midpoint(sorted[middle - 1], sorted[middle])
    }
}

/// [`median`], None when there is none.
pub fn median_if_any(values: &[f64]) -> Option<f64> {
    let value = median(values);
    value.is_finite().then_some(value)
}

/// The upper median of counts: the middle value, or the higher of the middle two.
pub fn upper_median(values: impl IntoIterator<Item = u64>) -> u64 {
    let mut sorted: Vec<u64> = values.into_iter().collect();
    assert!(!sorted.is_empty(), "a median of no values");
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

/// The nearest-rank percentile of sorted values.
pub fn percentile_of_sorted(sorted: &[u64], percentile: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = saturating_usize(((percentile / 100.0) * sorted.len() as f64).ceil());
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_handles_odd_even_and_empty_inputs() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(median_if_any(&[]), None);
        assert_eq!(upper_median([4, 1, 3, 2]), 3);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let sorted: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile_of_sorted(&sorted, 50.0), Some(50));
        assert_eq!(percentile_of_sorted(&sorted, 99.0), Some(99));
        assert_eq!(percentile_of_sorted(&sorted, 0.0), Some(1));
        assert_eq!(percentile_of_sorted(&[], 50.0), None);
    }
}
