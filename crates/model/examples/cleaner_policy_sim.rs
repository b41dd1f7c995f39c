//! Runs the model of the log, cleaner and placement (`lamina_model::cleaner`)
//! once and prints its table: fixed segments of `--segment-blocks` blocks, one
//! open head per stream, victims chosen by the engine's own scoring, and
//! cleaning whenever fewer than `--headroom` segments are free. It has no
//! summaries, checkpoints or reserves, so the engine relocates somewhat more
//! at the same placement (docs/decisions/0010-relocations-by-data-age.md).
//!
//!     cargo run --release -p lamina-model --example cleaner_policy_sim -- \
//!         [--policy before|ages|engine|estimate|oracle] [--segments 2000] \
//!         [--segment-blocks 255] [--live 0.85] [--workload zipf|uniform] \
//!         [--zipf 0.99] [--client-classes 3] [--relocation-classes 4] \
//!         [--factor 8] [--headroom 4] [--passes 2] [--shared-streams off|on] \
//!         [--victim cost-benefit|greedy|declining-cost] [--age-exponent 0.5] \
//!         [--victim-age last-written|data-written] [--victims-at-once 1] \
//!         [--relocation-by victim-age|block-estimate]
//!
//! Policies:
//! - `before`: decision 0008. Client writes split in two by the age of the
//!   segment of the block they replace; relocations one stream colder per
//!   cleaning survived (two streams).
//! - `ages`: decision 0010. As `before`, but a victim's blocks go to one of
//!   `--relocation-classes` streams by the age of their data, kept per segment.
//! - `engine`: decision 0011. As `ages`, but client writes go to one of
//!   `--client-classes` streams by a smoothed (geometric mean) estimate of the
//!   interval between the block's writes, sampled as the age of the replaced
//!   block's segment's data and kept as a level of 1/8 doubling.
//! - `estimate`: per block, the smoothed estimate from exact intervals; client
//!   writes by it as in `engine`, and relocations to one of
//!   `--relocation-classes` by it or the block's age, whichever is longer.
//! - `oracle`: as `estimate`, with the true interval (1 / write probability).
//!
//! With `--shared-streams on` (`engine`, `estimate`, `oracle`), a relocated
//! block joins the client stream of its class instead of a relocation stream,
//! so that each class has one stream (`--client-classes` of them).
//!
//! Victims: `cost-benefit` is `(1 - u) · ageᵏ / (1 + u)` with `k` =
//! `--age-exponent` (the engine's `VictimPolicy::CostBenefit` at 0.5, the
//! default); `greedy` is the engine's `VictimPolicy::Greedy`; `declining-cost` cleans the segment whose relocation
//! cost `u / (1 - u)` falls slowest if left alone, `rate / (1 - u)²`, the rate
//! being the sum of its live blocks' write probabilities as the policy knows
//! them (true ones for `oracle`, else interval estimates or ages).
//!
//! `--victim-age data-written` weighs the age of a segment's data instead of
//! the time since its last block was appended; `--victims-at-once N` ranks
//! once and cleans the best N in turn (the engine's reclaim takes up to 16);
//! `--relocation-by block-estimate` (`engine`) sends a relocated block to the
//! class of the longer of its victim's data age and its own interval
//! estimate (docs/decisions/0065-cleaner-victims-and-placement-measured.md).
//!
//! Class `i` takes intervals under ℓ · factorⁱ (the engine's
//! `interval_class`), ℓ being the mean lifespan of the latest 16 victims of
//! the first client stream. Time is client blocks written, as in the engine. Zipf ranks map to blocks
//! one to one. It prints blocks relocated per client block in the measured
//! passes and the victims per stream.

use lamina_model::cleaner::{
    CleanerModelSettings, PlacementPolicy, VictimAge, VictimRule, Workload, simulate_cleaner,
};

#[path = "common/mod.rs"]
mod common;
use common::argument;

fn number<T: std::str::FromStr>(name: &str, default: &str) -> T {
    argument(name, default)
        .parse()
        .unwrap_or_else(|_| panic!("{name}: expected a number"))
}

fn settings_from_arguments() -> CleanerModelSettings {
    let defaults = CleanerModelSettings::default();
    let placement_name = argument("--policy", "engine");
    let placement = PlacementPolicy::from_name(&placement_name).unwrap_or_else(|| {
        panic!("--policy {placement_name}: expected before, ages, engine, estimate or oracle")
    });
    let victim_rule = match argument("--victim", "cost-benefit").as_str() {
        "cost-benefit" => VictimRule::CostBenefit {
            age_exponent: number("--age-exponent", "0.5"),
        },
        "greedy" => VictimRule::Greedy,
        "declining-cost" => VictimRule::DecliningCost,
        other => panic!("--victim {other}: expected cost-benefit, greedy or declining-cost"),
    };
    let workload = match argument("--workload", "zipf").as_str() {
        "zipf" => Workload::Zipf {
            theta: number("--zipf", "0.99"),
        },
        "uniform" => Workload::Uniform,
        other => panic!("--workload {other}: expected zipf or uniform"),
    };
    CleanerModelSettings {
        placement,
        shared_streams: match argument("--shared-streams", "off").as_str() {
            "on" => true,
            "off" => false,
            other => panic!("--shared-streams {other}: expected on or off"),
        },
        victim_rule,
        segment_count: number("--segments", "2000"),
        segment_block_count: number("--segment-blocks", "255"),
        live_fraction: number("--live", "0.85"),
        workload,
        client_class_count: number("--client-classes", "3"),
        relocation_class_count: number("--relocation-classes", "4"),
        class_bound_factor: number("--factor", &defaults.class_bound_factor.to_string()),
        headroom_segment_count: number("--headroom", "4"),
        victim_age: match argument("--victim-age", "last-written").as_str() {
            "last-written" => VictimAge::LastWritten,
            "data-written" => VictimAge::DataWritten,
            other => panic!("--victim-age {other}: expected last-written or data-written"),
        },
        victims_at_once: number("--victims-at-once", "1"),
        relocation_by_block_estimate: match argument("--relocation-by", "victim-age").as_str() {
            "victim-age" => false,
            "block-estimate" => true,
            other => panic!("--relocation-by {other}: expected victim-age or block-estimate"),
        },
        measured_pass_count: number("--passes", "2"),
    }
}

fn main() {
    let settings = settings_from_arguments();
    let report = simulate_cleaner(&settings);
    let workload = match settings.workload {
        Workload::Zipf { .. } => "zipf",
        Workload::Uniform => "uniform",
    };
    println!(
        "{} segments of {} blocks, {workload}, live {}: relocated/blk {:.3}",
        settings.segment_count,
        settings.segment_block_count,
        settings.live_fraction,
        report.relocated_per_client_block
    );
    for (stream, victims) in report.victims_per_stream.iter().enumerate() {
        if victims.victim_count > 0 {
            println!(
                "  stream {stream}: {} victims at {:.3} live",
                victims.victim_count, victims.live_fraction
            );
        }
    }
}
