//! The least relocation that any placement could reach under Zipf overwrites,
//! from a model rather than a simulation, to judge how far a goal is from what
//! the design can do (BENCHMARKS.md, write amplification).
//!
//! Model: the blocks are split by Zipf rank into `--groups` groups whose rank
//! bounds grow by equal ratios (`blocks^(k / groups)`). Each group is written
//! uniformly within, lives in segments of its own and is cleaned alone as
//! large segments under greedy: at live fraction `α` its victims are `u` live,
//! `u = e^(-(1 - u) / α)`, and each client write costs `u / (1 - u)`
//! relocations. The space is shared among the groups optimally (a Lagrange
//! multiplier on space, found by bisection, picks each group's `α`). This is
//! perfect knowledge of every block's write rate and no heads, reserves,
//! summaries or checkpoints: a floor for placement, not a target for the
//! engine. Large-segment greedy slightly overstates finite segments.
//!
//!     cargo run --release -p lamina-engine --example zipf_cleaning_bound -- \
//!         [--segments 982] [--segment-blocks 255] [--live 0.85] [--zipf 0.99] \
//!         [--groups 1,4,8,16,300] [--verbose]

#[path = "common/mod.rs"]
mod common;
use common::{Zipf, argument, greedy_victim_live_fraction};

/// Iterations of each golden-section search for a group's live fraction.
const GOLDEN_ITERATION_COUNT: usize = 60;
/// Iterations of the bisection for the price of space.
const PRICE_ITERATION_COUNT: usize = 80;

/// A group of blocks: how many, and their share of the writes.
struct Group {
    block_count: f64,
    write_share: f64,
}

/// Relocations per client write for a group cleaned alone at live fraction
/// `live`, weighted by its share of the writes.
fn group_cost(group: &Group, live: f64) -> f64 {
    let victim_live = greedy_victim_live_fraction(live);
    group.write_share * victim_live / (1.0 - victim_live)
}

/// The live fraction minimizing the group's relocations plus `price` per block
/// of space it takes (convex, so a golden-section search finds it).
fn best_live_fraction(group: &Group, price: f64) -> f64 {
    let objective = |live: f64| group_cost(group, live) + price * group.block_count / live;
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

/// Space taken and relocations per client write at a price of space.
fn allocate(groups: &[Group], price: f64) -> (f64, f64, Vec<f64>) {
    let lives: Vec<f64> = groups
        .iter()
        .map(|group| best_live_fraction(group, price))
        .collect();
    let space = groups
        .iter()
        .zip(&lives)
        .map(|(group, live)| group.block_count / live)
        .sum();
    let cost = groups
        .iter()
        .zip(&lives)
        .map(|(group, live)| group_cost(group, *live))
        .sum();
    (space, cost, lives)
}

fn main() {
    let segment_count: f64 = argument("--segments", "982").parse().expect("--segments");
    let segment_block_count: f64 = argument("--segment-blocks", "255")
        .parse()
        .expect("--segment-blocks");
    let live: f64 = argument("--live", "0.85").parse().expect("--live");
    let theta: f64 = argument("--zipf", "0.99").parse().expect("--zipf");
    let verbose = std::env::args().any(|argument| argument == "--verbose");
    let block_count = (segment_count * segment_block_count * live) as usize;
    let space_total = block_count as f64 / live;
    let zipf = Zipf::new(block_count, theta);
    println!(
        "{block_count} blocks (live {live}) in {segment_count} segments of \
         {segment_block_count}, zipf {theta}"
    );
    for group_count in argument("--groups", "1,4,8,16,300").split(',') {
        let group_count: u32 = group_count.parse().expect("--groups");
        let mut bounds: Vec<usize> = (0..=group_count)
            .map(|index| {
                (block_count as f64)
                    .powf(f64::from(index) / f64::from(group_count))
                    .round() as usize
            })
            .collect();
        bounds[0] = 0;
        bounds.dedup();
        let groups: Vec<Group> = bounds
            .windows(2)
            .map(|pair| Group {
                block_count: (pair[1] - pair[0]) as f64,
                write_share: (pair[0]..pair[1]).map(|rank| zipf.probability(rank)).sum(),
            })
            .collect();
        // A higher price of space packs every group tighter.
        let (mut low, mut high) = (1e-12f64, 1.0f64);
        for _ in 0..PRICE_ITERATION_COUNT {
            let price = (low * high).sqrt();
            if allocate(&groups, price).0 > space_total {
                low = price;
            } else {
                high = price;
            }
        }
        let (_, cost, lives) = allocate(&groups, high);
        println!(
            "  {} groups: relocated/blk {cost:.3} (write amplification {:.2} without overheads)",
            groups.len(),
            1.0 + cost
        );
        if verbose {
            for (group, live) in groups.iter().zip(&lives) {
                println!(
                    "    {:>8} blocks, {:.4} of writes: live {live:.3}, {:.1} segments, \
                     relocated/blk {:.4}",
                    group.block_count,
                    group.write_share,
                    group.block_count / live / segment_block_count,
                    group_cost(group, *live)
                );
            }
        }
    }
}
