//! Analytic bounds on cleaning: what a greedy cleaner relocates under uniform
//! overwrites, and the least relocation any placement could reach under Zipf
//! overwrites. They are the yardsticks the engine's measured write
//! amplification is read against (BENCHMARKS.md, write amplification).

use crate::convert::saturating_usize;
use crate::zipf::Zipf;

/// Iterations of the bisection for greedy's victim live fraction.
const VICTIM_LIVE_ITERATION_COUNT: usize = 100;
/// Iterations of each golden-section search for a group's live fraction.
const GOLDEN_ITERATION_COUNT: usize = 60;
/// Iterations of the bisection for the price of space.
const PRICE_ITERATION_COUNT: usize = 80;

/// The live fraction of greedy cleaning's victims under uniform overwrites at
/// live fraction `live`, in the large-segment limit: `x` solving
/// `(x - 1) / ln x = live` (equivalently `x = e^(-(1 - x) / live)`).
pub fn greedy_victim_live_fraction(live: f64) -> f64 {
    assert!(live > 0.0 && live < 1.0, "live {live} is not a fraction");
    let mut low = 1e-12f64;
    let mut high = 1.0f64 - 1e-12;
    for _ in 0..VICTIM_LIVE_ITERATION_COUNT {
        let middle = (low + high) / 2.0;
        if (middle - 1.0) / middle.ln() > live {
            high = middle;
        } else {
            low = middle;
        }
    }
    (low + high) / 2.0
}

/// Write amplification (device blocks per client block, relocations
/// included, nothing else) of a greedy cleaner under uniform random
/// overwrites at live fraction `live`: `1 / (1 - x)`, `x` being its victims'
/// live fraction ([`greedy_victim_live_fraction`]).
pub fn greedy_write_amplification(live: f64) -> f64 {
    1.0 / (1.0 - greedy_victim_live_fraction(live))
}

/// A group of blocks of [`zipf_cleaning_bound`]: how many, and their share of
/// the writes.
#[derive(Clone, Debug, PartialEq)]
pub struct RankGroup {
    pub block_count: f64,
    pub write_share: f64,
}

impl RankGroup {
    /// Relocations per client write of this group cleaned alone at live
    /// fraction `live`, weighted by its share of the writes.
    pub fn relocations_at(&self, live: f64) -> f64 {
        let victim_live = greedy_victim_live_fraction(live);
        self.write_share * victim_live / (1.0 - victim_live)
    }

    /// The live fraction minimizing the group's relocations plus `price` per
    /// block of space it takes (convex, so a golden-section search finds it).
    fn best_live_fraction(&self, price: f64) -> f64 {
        let objective = |live: f64| self.relocations_at(live) + price * self.block_count / live;
        let ratio = (5f64.sqrt() - 1.0) / 2.0;
        let (mut low, mut high) = (1e-3, 1.0 - 1e-6);
        for _ in 0..GOLDEN_ITERATION_COUNT {
            let left = high - ratio * (high - low);
            let right = low + ratio * (high - low);
            if objective(left) < objective(right) {
                high = right;
            } else {
                low = left;
            }
        }
        (low + high) / 2.0
    }
}

/// The floor of [`zipf_cleaning_bound`]: the groups, the live fraction each
/// is given, and the relocations per client write they cost together.
#[derive(Clone, Debug)]
pub struct ZipfCleaningBound {
    pub groups: Vec<RankGroup>,
    /// Per group, the live fraction it is kept at.
    pub live_fractions: Vec<f64>,
    pub relocated_per_client_block: f64,
}

/// Space taken and relocations per client write of `groups` at a price of
/// space, with each group's live fraction.
struct Allocation {
    space_blocks: f64,
    relocations: f64,
    live_fractions: Vec<f64>,
}

fn allocate(groups: &[RankGroup], price: f64) -> Allocation {
    let live_fractions: Vec<f64> = groups
        .iter()
        .map(|group| group.best_live_fraction(price))
        .collect();
    let pairs = || groups.iter().zip(&live_fractions);
    Allocation {
        space_blocks: pairs().map(|(group, live)| group.block_count / live).sum(),
        relocations: pairs()
            .map(|(group, live)| group.relocations_at(*live))
            .sum(),
        live_fractions: live_fractions.clone(),
    }
}

/// The blocks `0..block_count`, Zipf ranks of `zipf`, split into at most
/// `group_count` groups whose rank bounds grow by equal ratios
/// (`blocks^(k / groups)`).
pub fn rank_groups(zipf: &Zipf, block_count: usize, group_count: u32) -> Vec<RankGroup> {
    assert!(group_count > 0, "at least one group");
    assert!(block_count <= zipf.count(), "a block per rank");
    let mut bounds: Vec<usize> = (0..=group_count)
        .map(|index| {
            saturating_usize(
                (block_count as f64)
                    .powf(f64::from(index) / f64::from(group_count))
                    .round(),
            )
        })
        .collect();
    bounds[0] = 0;
    bounds.dedup();
    bounds
        .windows(2)
        .map(|pair| RankGroup {
            block_count: (pair[1] - pair[0]) as f64,
            write_share: (pair[0]..pair[1]).map(|rank| zipf.probability(rank)).sum(),
        })
        .collect()
}

/// The least relocation that any placement could reach under Zipf
/// overwrites of `block_count` blocks at live fraction `live`, from a model
/// rather than a simulation. The blocks are split by rank into `group_count`
/// groups ([`rank_groups`]); each is written uniformly within, lives in
/// segments of its own and is cleaned alone as large segments under greedy
/// (at live fraction `α` its victims are `u` live, `u = e^(-(1 - u) / α)`,
/// and each client write costs `u / (1 - u)` relocations). The space is
/// shared among the groups optimally (a Lagrange multiplier on space, found
/// by bisection, picks each group's `α`). This is perfect knowledge of every
/// block's write rate and no heads, reserves, summaries or checkpoints: a
/// floor for placement, not a target for the engine. Large-segment greedy
/// slightly overstates finite segments.
pub fn zipf_cleaning_bound(
    zipf: &Zipf,
    block_count: usize,
    live: f64,
    group_count: u32,
) -> ZipfCleaningBound {
    let groups = rank_groups(zipf, block_count, group_count);
    let space_total_blocks = block_count as f64 / live;
    // A higher price of space packs every group tighter.
    let (mut low, mut high) = (1e-12f64, 1.0f64);
    for _ in 0..PRICE_ITERATION_COUNT {
        let price = (low * high).sqrt();
        if allocate(&groups, price).space_blocks > space_total_blocks {
            low = price;
        } else {
            high = price;
        }
    }
    let allocation = allocate(&groups, high);
    ZipfCleaningBound {
        groups,
        live_fractions: allocation.live_fractions,
        relocated_per_client_block: allocation.relocations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_write_amplification_matches_the_known_values() {
        assert!((greedy_write_amplification(0.85) - 3.52).abs() < 0.01);
        assert!((greedy_write_amplification(0.5) - 1.26).abs() < 0.01);
        assert!(greedy_write_amplification(0.5) < greedy_write_amplification(0.7));
        let victim = greedy_victim_live_fraction(0.8);
        assert!((victim - (-(1.0 - victim) / 0.8).exp()).abs() < 1e-9);
    }

    /// One group is uniform overwrites of everything: greedy's relocations.
    #[test]
    fn one_group_is_the_greedy_bound_and_more_groups_do_better() {
        let block_count = 10_000;
        let zipf = Zipf::new(block_count, 0.99);
        let one = zipf_cleaning_bound(&zipf, block_count, 0.85, 1);
        assert_eq!(one.groups.len(), 1);
        let greedy = greedy_write_amplification(0.85) - 1.0;
        assert!((one.relocated_per_client_block - greedy).abs() < 1e-3);
        assert!((one.live_fractions[0] - 0.85).abs() < 1e-3);
        let eight = zipf_cleaning_bound(&zipf, block_count, 0.85, 8);
        assert_eq!(eight.groups.len(), 8);
        assert!(eight.relocated_per_client_block < 0.5 * greedy);
        let space: f64 = eight
            .groups
            .iter()
            .zip(&eight.live_fractions)
            .map(|(group, live)| group.block_count / live)
            .sum();
        assert!((space - block_count as f64 / 0.85).abs() < 1.0, "{space}");
    }

    #[test]
    fn rank_groups_cover_every_block_once_by_growing_ratios() {
        let zipf = Zipf::new(1000, 0.99);
        let groups = rank_groups(&zipf, 1000, 3);
        let sizes: Vec<f64> = groups.iter().map(|group| group.block_count).collect();
        assert_eq!(sizes, vec![10.0, 90.0, 900.0]);
        let share: f64 = groups.iter().map(|group| group.write_share).sum();
        assert!((share - 1.0).abs() < 1e-9);
    }
}
