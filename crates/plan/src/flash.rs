//! Flash sizing: the working set (measured from an address trace, stated by the
//! user, or assumed from the byte rate), the flash that reaches a target read hit
//! ratio, and how many drives remain needed with that flash in front.
//!
//! With addresses, hit ratios come from exact LRU stack distances over 4 KiB blocks
//! (Mattson's method), so the curve is what an LRU cache of each size would have
//! achieved on this trace. Without addresses, a skew model stands in: the hottest
//! `hot_data_fraction` of the working set receives `hot_access_fraction` of the
//! accesses (80/20 by default), which gives hit(f) = f^θ with θ = ln(0.8)/ln(0.2).

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::analysis::Analysis;
use crate::backend::{BackendSizing, Redundancy, size_backend};
use crate::convert::{saturating_u64, saturating_usize};
use crate::parse::addresses::AddressTrace;

/// Cache granularity: lamina caches 4 KiB blocks.
pub const BLOCK_SIZE_BYTES: u64 = 4096;

#[derive(Debug, Clone, Serialize)]
pub struct FlashOptions {
    pub target_hit_ratio: f64,
    /// Working set stated by the user, bytes per hour.
    pub working_set_bytes: Option<f64>,
    /// Without addresses: share of an hour's bytes that land on distinct blocks.
    pub unique_fraction: f64,
    pub hot_data_fraction: f64,
    pub hot_access_fraction: f64,
}

impl Default for FlashOptions {
    fn default() -> Self {
        FlashOptions {
            target_hit_ratio: 0.9,
            working_set_bytes: None,
            unique_fraction: 0.25,
            hot_data_fraction: 0.2,
            hot_access_fraction: 0.8,
        }
    }
}

/// Where the working-set figure came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "source", rename_all = "kebab-case")]
pub enum WorkingSet {
    /// Distinct 4 KiB blocks in the busiest clock hour of an address trace.
    Measured {
        hour_count: usize,
        access_count: usize,
    },
    /// Given with `--working-set-gib`.
    Stated,
    /// Steady-state bytes per hour times the unique fraction.
    Assumed {
        bytes_per_hour: f64,
        unique_fraction: f64,
    },
}

/// One point of the flash-versus-drives table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FlashPoint {
    pub read_hit_ratio: f64,
    pub flash_bytes: f64,
    pub working_drives: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct FlashSizing {
    pub working_set_bytes: f64,
    pub working_set: WorkingSet,
    pub model: String,
    pub target_hit_ratio: f64,
    /// Hit ratio the planned flash reaches (below target when the trace cannot reach it).
    pub read_hit_ratio: f64,
    pub flash_bytes: f64,
    pub with_flash: BackendSizing,
    pub table: Vec<FlashPoint>,
    pub warnings: Vec<String>,
}

/// A hit-ratio curve: flash bytes needed for a hit ratio, and the best reachable.
trait HitCurve {
    fn flash_for(&self, hit_ratio: f64) -> Option<f64>;
    fn best_hit_ratio(&self) -> (f64, f64);
}

/// The skew model over a working set.
struct SkewCurve {
    working_set_bytes: f64,
    exponent: f64,
}

impl HitCurve for SkewCurve {
    fn flash_for(&self, hit_ratio: f64) -> Option<f64> {
        Some(self.working_set_bytes * hit_ratio.powf(1.0 / self.exponent))
    }
    fn best_hit_ratio(&self) -> (f64, f64) {
        (1.0, self.working_set_bytes)
    }
}

/// LRU stack distances of read accesses, in blocks; cold reads are left out of
/// `distances` but count in `read_count`.
#[derive(Debug, Clone, Default)]
pub struct StackDistances {
    pub distances: Vec<u64>,
    pub read_count: u64,
    pub distinct_block_count: u64,
}

impl HitCurve for StackDistances {
    fn flash_for(&self, hit_ratio: f64) -> Option<f64> {
        if self.read_count == 0 {
            return None;
        }
        // The tolerance keeps 1/6 of 6 reads at one read despite rounding.
        let needed = saturating_usize((hit_ratio * self.read_count as f64 - 1e-9).ceil());
        if needed == 0 {
            return Some(0.0);
        }
        // A cache of C blocks hits exactly the reads whose distance is below C.
        let distance = *self.distances.get(needed - 1)?;
        Some((distance + 1) as f64 * BLOCK_SIZE_BYTES as f64)
    }
    fn best_hit_ratio(&self) -> (f64, f64) {
        if self.read_count == 0 {
            return (0.0, 0.0);
        }
        (
            self.distances.len() as f64 / self.read_count as f64,
            self.distinct_block_count as f64 * BLOCK_SIZE_BYTES as f64,
        )
    }
}

/// Exact LRU stack distances: for each access, the number of distinct blocks
/// touched since the previous access to the same block, counted with a Fenwick
/// tree over access positions. Reads are counted as hits or misses; writes only
/// refresh recency (the flash takes every write anyway). When the trace does not
/// say, every access counts as a read.
pub fn stack_distances(trace: &AddressTrace) -> StackDistances {
    let mut blocks: Vec<(u64, bool)> = Vec::new();
    let mut accesses = trace.accesses.clone();
    accesses.sort_by(|a, b| a.time_seconds.total_cmp(&b.time_seconds));
    for access in &accesses {
        if access.length_bytes == 0 {
            continue;
        }
        let first = access.offset_bytes / BLOCK_SIZE_BYTES;
        let last = access.offset_bytes.saturating_add(access.length_bytes - 1) / BLOCK_SIZE_BYTES;
        for block in first..=last {
            blocks.push((block, access.is_read.unwrap_or(true)));
        }
    }
    let mut tree = vec![0i64; blocks.len() + 1];
    let add = |tree: &mut Vec<i64>, position: usize, delta: i64| {
        let mut index = position + 1;
        while index < tree.len() {
            tree[index] += delta;
            index += index & index.wrapping_neg();
        }
    };
    let prefix = |tree: &Vec<i64>, position: usize| -> i64 {
        let mut index = position + 1;
        let mut sum = 0;
        while index > 0 {
            sum += tree[index];
            index -= index & index.wrapping_neg();
        }
        sum
    };
    let mut last_position: HashMap<u64, usize> = HashMap::new();
    let mut result = StackDistances::default();
    for (position, (block, is_read)) in blocks.iter().copied().enumerate() {
        let previous = last_position.insert(block, position);
        if is_read {
            result.read_count += 1;
        }
        if let Some(previous) = previous {
            // Distinct blocks whose latest access lies strictly between the two.
            let between = prefix(&tree, position - 1) - prefix(&tree, previous);
            if is_read {
                result.distances.push(
                    u64::try_from(between).expect("a count of distinct blocks is not negative"),
                );
            }
            add(&mut tree, previous, -1);
        }
        add(&mut tree, position, 1);
    }
    result.distinct_block_count = last_position.len() as u64;
    result.distances.sort_unstable();
    result
}

/// Distinct 4 KiB blocks in the busiest clock hour (hours counted from the first access).
pub fn busiest_hour_blocks(trace: &AddressTrace) -> (u64, usize) {
    const HOUR_SECONDS: f64 = 3600.0;
    let start = trace
        .accesses
        .iter()
        .map(|access| access.time_seconds)
        .fold(f64::INFINITY, f64::min);
    let mut hours: HashMap<u64, HashSet<u64>> = HashMap::new();
    for access in &trace.accesses {
        if access.length_bytes == 0 {
            continue;
        }
        let hour = saturating_u64(((access.time_seconds - start) / HOUR_SECONDS).floor());
        let first = access.offset_bytes / BLOCK_SIZE_BYTES;
        let last = access.offset_bytes.saturating_add(access.length_bytes - 1) / BLOCK_SIZE_BYTES;
        hours.entry(hour).or_default().extend(first..=last);
    }
    let busiest = hours
        .values()
        .map(|blocks| blocks.len() as u64)
        .max()
        .unwrap_or(0);
    (busiest, hours.len())
}

/// Read hit ratios shown in the flash table besides the target.
const TABLE_HIT_RATIOS: [f64; 4] = [0.5, 0.8, 0.9, 0.95];

pub fn size_flash(
    analysis: &Analysis,
    addresses: Option<&AddressTrace>,
    options: &FlashOptions,
    redundancy: Redundancy,
    drive_iops: f64,
    spare_drives: u64,
) -> FlashSizing {
    assert!((0.0..=1.0).contains(&options.target_hit_ratio));
    let mut warnings = Vec::new();
    let steady_bytes_per_hour = analysis.steady_state_iops * analysis.io_size_bytes_used * 3600.0;
    let distances = addresses.map(stack_distances);
    let (working_set_bytes, working_set) = match (addresses, options.working_set_bytes) {
        (_, Some(bytes)) => (bytes, WorkingSet::Stated),
        (Some(trace), None) => {
            let (blocks, hour_count) = busiest_hour_blocks(trace);
            (
                blocks as f64 * BLOCK_SIZE_BYTES as f64,
                WorkingSet::Measured {
                    hour_count,
                    access_count: trace.accesses.len(),
                },
            )
        }
        (None, None) => (
            steady_bytes_per_hour * options.unique_fraction,
            WorkingSet::Assumed {
                bytes_per_hour: steady_bytes_per_hour,
                unique_fraction: options.unique_fraction,
            },
        ),
    };
    let exponent = options.hot_access_fraction.ln() / options.hot_data_fraction.ln();
    let skew = SkewCurve {
        working_set_bytes,
        exponent,
    };
    let (curve, model): (&dyn HitCurve, String) = match &distances {
        Some(distances) if distances.read_count > 0 && options.working_set_bytes.is_none() => (
            distances,
            format!(
                "LRU stack distances over {} KiB blocks of the address trace",
                BLOCK_SIZE_BYTES / 1024
            ),
        ),
        _ => (
            &skew,
            format!(
                "skew model: the hottest {:.0}% of the working set receives {:.0}% of reads",
                options.hot_data_fraction * 100.0,
                options.hot_access_fraction * 100.0
            ),
        ),
    };
    let (best_ratio, best_bytes) = curve.best_hit_ratio();
    let resolve = |ratio: f64| -> (f64, f64) {
        match curve.flash_for(ratio) {
            Some(bytes) if ratio <= best_ratio => (ratio, bytes),
            _ => (best_ratio, best_bytes),
        }
    };
    let (read_hit_ratio, flash_bytes) = resolve(options.target_hit_ratio);
    if read_hit_ratio < options.target_hit_ratio {
        warnings.push(format!(
            "the address trace reaches at most a {:.0}% read hit ratio (the rest are first touches); sized flash for that",
            best_ratio * 100.0
        ));
    }
    let sizing_at = |ratio: f64| {
        size_backend(
            analysis.steady_read_iops,
            analysis.steady_write_iops,
            ratio,
            redundancy,
            drive_iops,
            spare_drives,
        )
    };
    let mut ratios: Vec<f64> = TABLE_HIT_RATIOS.to_vec();
    ratios.push(options.target_hit_ratio);
    ratios.sort_by(f64::total_cmp);
    ratios.dedup_by(|a, b| (*a - *b).abs() < 1e-9);
    let table = ratios
        .into_iter()
        .map(|ratio| {
            let (ratio, bytes) = resolve(ratio);
            FlashPoint {
                read_hit_ratio: ratio,
                flash_bytes: bytes,
                working_drives: sizing_at(ratio).working_drives,
            }
        })
        .collect::<Vec<_>>();
    let mut table = table;
    table.dedup_by(|a, b| (a.read_hit_ratio - b.read_hit_ratio).abs() < 1e-9);
    FlashSizing {
        working_set_bytes,
        working_set,
        model,
        target_hit_ratio: options.target_hit_ratio,
        read_hit_ratio,
        flash_bytes,
        with_flash: sizing_at(read_hit_ratio),
        table,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::addresses::Access;

    fn read(time_seconds: f64, block: u64) -> Access {
        Access {
            time_seconds,
            offset_bytes: block * BLOCK_SIZE_BYTES,
            length_bytes: BLOCK_SIZE_BYTES,
            is_read: Some(true),
        }
    }

    #[test]
    fn stack_distances_count_distinct_blocks_in_between() {
        // a b c a b b: a is re-read after {b, c} (2), b after {c, a} (2), b again (0).
        let blocks = [1, 2, 3, 1, 2, 2];
        let trace = AddressTrace {
            accesses: blocks
                .iter()
                .enumerate()
                .map(|(time, block)| read(time as f64, *block))
                .collect(),
            skipped_row_count: 0,
        };
        let distances = stack_distances(&trace);
        assert_eq!(distances.distances, vec![0, 2, 2]);
        assert_eq!(distances.read_count, 6);
        assert_eq!(distances.distinct_block_count, 3);
        // Half the reads hit (3 of 6) once the cache holds 3 blocks; 1 block gets 1 of 6.
        assert_eq!(
            distances.flash_for(0.5),
            Some(3.0 * BLOCK_SIZE_BYTES as f64)
        );
        assert_eq!(
            distances.flash_for(1.0 / 6.0),
            Some(BLOCK_SIZE_BYTES as f64)
        );
        assert_eq!(distances.flash_for(0.9), None);
    }

    #[test]
    fn busiest_hour_counts_distinct_blocks_per_clock_hour() {
        let mut accesses = vec![read(0.0, 1), read(10.0, 1), read(20.0, 2)];
        accesses.push(Access {
            time_seconds: 4000.0,
            offset_bytes: 0,
            length_bytes: 5 * BLOCK_SIZE_BYTES,
            is_read: Some(false),
        });
        let trace = AddressTrace {
            accesses,
            skipped_row_count: 0,
        };
        assert_eq!(busiest_hour_blocks(&trace), (5, 2));
    }

    #[test]
    fn skew_model_gives_twenty_percent_for_eighty_percent_hits() {
        let exponent = 0.8f64.ln() / 0.2f64.ln();
        let curve = SkewCurve {
            working_set_bytes: 100.0,
            exponent,
        };
        assert!((curve.flash_for(0.8).unwrap() - 20.0).abs() < 1e-9);
        assert!((curve.flash_for(1.0).unwrap() - 100.0).abs() < 1e-9);
    }
}
