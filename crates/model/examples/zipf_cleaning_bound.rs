//! Prints the least relocation that any placement could reach under Zipf
//! overwrites (`lamina_model::bounds::zipf_cleaning_bound`), from a model
//! rather than a simulation, to judge how far a goal is from what the design
//! can do (BENCHMARKS.md, write amplification).
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
//!     cargo run --release -p lamina-model --example zipf_cleaning_bound -- \
//!         [--segments 982] [--segment-blocks 255] [--live 0.85] [--zipf 0.99] \
//!         [--groups 1,4,8,16,300] [--verbose]

use lamina_model::bounds::zipf_cleaning_bound;
use lamina_model::zipf::Zipf;

#[path = "common/mod.rs"]
mod common;
use common::argument;

fn main() {
    let segment_count: f64 = argument("--segments", "982").parse().expect("--segments");
    let segment_block_count: f64 = argument("--segment-blocks", "255")
        .parse()
        .expect("--segment-blocks");
    let live: f64 = argument("--live", "0.85").parse().expect("--live");
    let theta: f64 = argument("--zipf", "0.99").parse().expect("--zipf");
    let verbose = std::env::args().any(|argument| argument == "--verbose");
    // The space's live blocks, rounded down; `as` saturates out of range.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let block_count = (segment_count * segment_block_count * live).floor() as usize;
    let zipf = Zipf::new(block_count, theta);
    println!(
        "{block_count} blocks (live {live}) in {segment_count} segments of \
         {segment_block_count}, zipf {theta}"
    );
    for group_count in argument("--groups", "1,4,8,16,300").split(',') {
        let group_count: u32 = group_count.parse().expect("--groups");
        let bound = zipf_cleaning_bound(&zipf, block_count, live, group_count);
        let cost = bound.relocated_per_client_block;
        println!(
            "  {} groups: relocated/blk {cost:.3} (write amplification {:.2} without overheads)",
            bound.groups.len(),
            1.0 + cost
        );
        if verbose {
            for (group, live) in bound.groups.iter().zip(&bound.live_fractions) {
                println!(
                    "    {:>8} blocks, {:.4} of writes: live {live:.3}, {:.1} segments, \
                     relocated/blk {:.4}",
                    group.block_count,
                    group.write_share,
                    group.block_count / live / segment_block_count,
                    group.relocations_at(*live)
                );
            }
        }
    }
}
