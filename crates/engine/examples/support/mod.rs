//! What the engine's in-process benchmark examples share (they were `lamina bench`
//! subcommands until decision 0060): pools on real files (FileDevice: io_uring,
//! O_DIRECT) and the fills that put data in a volume before a measurement
//! ([`pool_files`]), the cleaner options ([`cleaner`]), a counting device
//! ([`counting_device`]), and the percentiles of their samples; their tokio
//! runtime, the median and how a report is printed are the device examples'
//! (`measurement.rs`, included by path).

#![allow(dead_code)] // Each example uses part of it.

pub mod cleaner;
pub mod counting_device;
pub mod pool_files;

#[allow(unused_imports)] // Each example uses part of it.
pub use pool_files::{core_count, create_pool, fill_sequentially, open_file_device, write_blocks};

#[path = "../../../device/examples/support/measurement.rs"]
mod measurement;

#[allow(unused_imports)] // Each example uses part of it.
pub use measurement::{median, print_report, runtime};

/// `values` with two decimals, space-separated, for the tables.
pub fn format_list(values: &[f64]) -> String {
    values
        .iter()
        .map(|value| format!("{value:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The upper median of counts: the middle value, or the higher of the middle two.
pub fn upper_median(values: impl IntoIterator<Item = u64>) -> u64 {
    let mut sorted: Vec<u64> = values.into_iter().collect();
    assert!(!sorted.is_empty(), "a median of no values");
    sorted.sort_unstable();
    sorted[sorted.len() / 2]
}

/// A float already rounded by the caller as a `u64`, saturating (as `as` does).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn saturating_u64(rounded: f64) -> u64 {
    rounded as u64
}

/// The report as JSON, with `fields` present at its top level (for the tests).
pub fn json_with(report: &impl serde::Serialize, fields: &[&str]) -> serde_json::Value {
    let document = serde_json::to_value(report).expect("serialises");
    for field in fields {
        assert!(
            document.get(field).is_some(),
            "JSON lacks `{field}`: {document}"
        );
    }
    document
}

/// The nearest-rank percentile of sorted values.
pub fn percentile_of_sorted(sorted: &[u64], percentile: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((percentile / 100.0) * sorted.len() as f64).ceil();
    // A rank is at most the sample count, far below usize::MAX.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = rank as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}
