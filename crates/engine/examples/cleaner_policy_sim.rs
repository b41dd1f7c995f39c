//! A model of the log, cleaner and placement, without I/O, to compare
//! placement policies quickly and to see what any policy could reach: fixed
//! segments of `--segment-blocks` blocks, one open head per stream, victims
//! chosen by the engine's √age cost-benefit, and cleaning whenever fewer than
//! `--headroom` segments are free. It has no summaries, checkpoints or
//! reserves, so the engine relocates somewhat more at the same placement
//! (docs/decisions/0010-relocations-by-data-age.md).
//!
//!     cargo run --release -p lamina-engine --example cleaner_policy_sim -- \
//!         [--policy before|ages|engine|estimate|oracle] [--segments 2000] \
//!         [--segment-blocks 255] [--live 0.85] [--workload zipf|uniform] \
//!         [--zipf 0.99] [--client-classes 3] [--relocation-classes 4] \
//!         [--factor 8] [--headroom 4] [--passes 2] [--shared-streams off|on] \
//!         [--victim cost-benefit|declining-cost] [--age-exponent 0.5]
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
//! Victims: `cost-benefit` is the engine's `(1 - u) · ageᵏ / (1 + u)` with
//! `k` = `--age-exponent`; `declining-cost` cleans the segment whose relocation
//! cost `u / (1 - u)` falls slowest if left alone, `rate / (1 - u)²`, the rate
//! being the sum of its live blocks' write probabilities as the policy knows
//! them (true ones for `oracle`, else interval estimates or ages).
//!
//! Class `i` takes intervals under ℓ · factorⁱ, ℓ being the mean lifespan of
//! the latest 16 victims of the first client stream. Zipf ranks map to blocks
//! one to one. It prints blocks relocated per client block in the measured
//! passes and the victims per stream.

use std::collections::VecDeque;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[path = "common/mod.rs"]
mod common;
use common::{Zipf, argument};

/// Latest client-stream victims whose lifespans ℓ averages (as the engine).
const LIFESPAN_SAMPLE_COUNT_MAX: usize = 16;
/// Live fraction above which a segment is never a victim (as the engine).
const VICTIM_UTILIZATION_MAX: f64 = 0.97;
/// A segment or location that does not exist.
const NONE: u32 = u32::MAX;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Policy {
    Before,
    Ages,
    Engine,
    Estimate,
    Oracle,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SegmentState {
    Free,
    /// A head, or the victim being cleaned.
    Busy,
    Sealed,
}

struct Segment {
    state: SegmentState,
    stream: usize,
    live_blocks: u32,
    /// Blocks appended, in order (stale ones included).
    blocks: Vec<u32>,
    /// `writes` when the last block was appended (the cost-benefit age).
    last_written_at: u64,
    /// Client writes when the segment was opened.
    opened_at_client_writes: u64,
    /// When clients wrote its data, in client writes (mean over relocated
    /// blocks for a relocation segment).
    data_written_at: f64,
    /// Sum over its live blocks of their write rates (per client write).
    write_rate: f64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum VictimRule {
    CostBenefit,
    DecliningCost,
}

struct Simulation {
    policy: Policy,
    shared_streams: bool,
    victim_rule: VictimRule,
    age_exponent: f64,
    segment_block_count: usize,
    client_class_count: usize,
    relocation_class_count: usize,
    factor: f64,
    headroom_segment_count: usize,
    segments: Vec<Segment>,
    free: VecDeque<u32>,
    heads: Vec<u32>,
    /// Per block: its segment and position there.
    locations: Vec<(u32, u32)>,
    /// Per block: client writes when it was last written by a client.
    last_client_write: Vec<u64>,
    /// Per block: smoothed interval between its client writes (0: unknown).
    interval_estimates: Vec<f64>,
    /// Per block: 1 / its write probability (oracle only).
    true_intervals: Vec<f64>,
    /// Per block: the write rate it added to its segment's `write_rate`.
    block_write_rates: Vec<f64>,
    lifespans: VecDeque<u64>,
    current_victim: usize,
    /// Blocks appended by clients and the cleaner.
    writes: u64,
    client_writes: u64,
    relocated_blocks: u64,
    victims_per_stream: Vec<u64>,
    victim_live_blocks_per_stream: Vec<u64>,
}

impl Simulation {
    fn stream_count(&self) -> usize {
        match self.policy {
            Policy::Before => 4,
            Policy::Ages => 2 + self.relocation_class_count,
            Policy::Estimate | Policy::Oracle | Policy::Engine => {
                self.client_class_count + self.relocation_class_count
            }
        }
    }

    /// ℓ, or unbounded before any client victim.
    fn threshold(&self) -> f64 {
        if self.lifespans.is_empty() {
            return f64::MAX;
        }
        self.lifespans.iter().sum::<u64>() as f64 / self.lifespans.len() as f64
    }

    /// The class, out of `class_count`, of an interval or age.
    fn class_of(&self, interval: f64, class_count: usize) -> usize {
        let mut class = 0;
        let mut bound = self.threshold();
        while class + 1 < class_count && interval >= bound {
            class += 1;
            bound *= self.factor;
        }
        class
    }

    fn client_stream(&mut self, block: usize) -> usize {
        let (old_segment, _) = self.locations[block];
        match self.policy {
            Policy::Before | Policy::Ages => {
                // Streams 0 and 1 are the client streams.
                if old_segment == NONE {
                    return 1;
                }
                let old = &self.segments[old_segment as usize];
                if old.stream >= 2 {
                    return 1;
                }
                let lifespan = (self.client_writes - old.opened_at_client_writes) as f64;
                if lifespan < self.threshold() { 0 } else { 1 }
            }
            Policy::Oracle => self.class_of(self.true_intervals[block], self.client_class_count),
            Policy::Estimate | Policy::Engine => {
                let last = self.last_client_write[block];
                if last == u64::MAX {
                    return self.client_class_count - 1;
                }
                let interval = if self.policy == Policy::Engine {
                    (self.client_writes as f64
                        - self.segments[old_segment as usize].data_written_at)
                        .max(1.0)
                } else {
                    (self.client_writes - last) as f64
                };
                let previous = self.interval_estimates[block];
                let estimate = if previous == 0.0 {
                    interval
                } else {
                    (previous.ln() * 0.5 + interval.max(1.0).ln() * 0.5).exp()
                };
                let estimate = if self.policy == Policy::Engine {
                    let level = (estimate.max(1.0).log2() * 8.0).round().min(254.0);
                    (level / 8.0).exp2()
                } else {
                    estimate
                };
                self.interval_estimates[block] = estimate;
                self.class_of(estimate, self.client_class_count)
            }
        }
    }

    fn relocation_stream(&self, victim_stream: usize, block: usize) -> usize {
        if self.shared_streams && self.policy != Policy::Before && self.policy != Policy::Ages {
            return self.class_of(self.known_interval(block), self.client_class_count);
        }
        match self.policy {
            Policy::Before => {
                if victim_stream < 2 {
                    2
                } else {
                    3
                }
            }
            Policy::Ages => {
                let victim = &self.segments[self.current_victim];
                let age = (self.client_writes as f64 - victim.data_written_at).max(0.0);
                2 + self.class_of(age, self.relocation_class_count)
            }
            Policy::Engine => {
                let victim = &self.segments[self.current_victim];
                let age = (self.client_writes as f64 - victim.data_written_at).max(0.0);
                self.client_class_count + self.class_of(age, self.relocation_class_count)
            }
            Policy::Oracle => {
                self.client_class_count
                    + self.class_of(self.true_intervals[block], self.relocation_class_count)
            }
            Policy::Estimate => {
                let last = self.last_client_write[block];
                let age = if last == u64::MAX {
                    f64::MAX
                } else {
                    (self.client_writes - last) as f64
                };
                let estimate = self.interval_estimates[block].max(age);
                self.client_class_count + self.class_of(estimate, self.relocation_class_count)
            }
        }
    }

    /// The interval between a block's writes as the policy knows it: the true
    /// one for `oracle`; else its estimate or, when longer or when there is
    /// none, the time since its last client write (for `engine`, which keeps
    /// no per-block time, since its segment's data was written; a block never
    /// written counts as written at the start).
    fn known_interval(&self, block: usize) -> f64 {
        if self.policy == Policy::Oracle {
            return self.true_intervals[block];
        }
        let since = if self.policy == Policy::Engine {
            let (segment, _) = self.locations[block];
            if segment == NONE {
                self.client_writes as f64
            } else {
                self.client_writes as f64 - self.segments[segment as usize].data_written_at
            }
        } else {
            match self.last_client_write[block] {
                u64::MAX => self.client_writes as f64,
                last => (self.client_writes - last) as f64,
            }
        };
        self.interval_estimates[block].max(since).max(1.0)
    }

    fn open_head(&mut self, stream: usize, by_cleaner: bool) {
        if !by_cleaner {
            while self.free.len() < self.headroom_segment_count {
                self.clean();
            }
            // With shared streams, the cleaning may have opened this stream's
            // head already.
            if self.heads[stream] != NONE {
                return;
            }
        }
        let index = self.free.pop_front().expect("out of space");
        let segment = &mut self.segments[index as usize];
        segment.state = SegmentState::Busy;
        segment.stream = stream;
        segment.live_blocks = 0;
        segment.blocks.clear();
        segment.opened_at_client_writes = self.client_writes;
        segment.data_written_at = self.client_writes as f64;
        segment.write_rate = 0.0;
        self.heads[stream] = index;
    }

    fn append(&mut self, stream: usize, block: usize, by_cleaner: bool) {
        // Opening a client head may clean, and the cleaning may fill the
        // head it opens for this stream: look again until there is room.
        loop {
            let head = self.heads[stream];
            if head != NONE && self.segments[head as usize].blocks.len() < self.segment_block_count
            {
                break;
            }
            if head != NONE {
                self.segments[head as usize].state = SegmentState::Sealed;
                self.heads[stream] = NONE;
            }
            self.open_head(stream, by_cleaner);
        }
        let head = self.heads[stream] as usize;
        if by_cleaner && (self.policy == Policy::Ages || self.policy == Policy::Engine) {
            let count = self.segments[head].blocks.len() as f64;
            let source = self.segments[self.current_victim].data_written_at;
            let segment = &mut self.segments[head];
            segment.data_written_at = if count == 0.0 {
                source
            } else {
                (segment.data_written_at * count + source) / (count + 1.0)
            };
        }
        let (old_segment, _) = self.locations[block];
        let write_rate = 1.0 / self.known_interval(block);
        if old_segment != NONE {
            let old = &mut self.segments[old_segment as usize];
            old.live_blocks -= 1;
            old.write_rate -= self.block_write_rates[block];
        }
        self.block_write_rates[block] = write_rate;
        let segment = &mut self.segments[head];
        segment.write_rate += write_rate;
        segment.blocks.push(block as u32);
        segment.live_blocks += 1;
        segment.last_written_at = self.writes;
        self.locations[block] = (head as u32, (segment.blocks.len() - 1) as u32);
        self.writes += 1;
    }

    fn clean(&mut self) {
        let mut best = (f64::MIN, NONE);
        for (index, segment) in self.segments.iter().enumerate() {
            if segment.state != SegmentState::Sealed {
                continue;
            }
            let utilization = f64::from(segment.live_blocks) / self.segment_block_count as f64;
            if utilization > VICTIM_UTILIZATION_MAX {
                continue;
            }
            let score = match self.victim_rule {
                VictimRule::CostBenefit => {
                    let age = (self.writes - segment.last_written_at) as f64 + 1.0;
                    (1.0 - utilization) * age.powf(self.age_exponent) / (1.0 + utilization)
                }
                // The slowest decline scores highest.
                VictimRule::DecliningCost => {
                    -segment.write_rate.max(0.0) / (1.0 - utilization).powi(2)
                }
            };
            if score > best.0 {
                best = (score, index as u32);
            }
        }
        assert!(best.1 != NONE, "no segment can be cleaned");
        let victim = best.1 as usize;
        let victim_stream = self.segments[victim].stream;
        self.victims_per_stream[victim_stream] += 1;
        self.victim_live_blocks_per_stream[victim_stream] +=
            u64::from(self.segments[victim].live_blocks);
        if victim_stream == 0 {
            let lifespan = self.client_writes - self.segments[victim].opened_at_client_writes;
            if self.lifespans.len() == LIFESPAN_SAMPLE_COUNT_MAX {
                self.lifespans.pop_front();
            }
            self.lifespans.push_back(lifespan);
        }
        self.current_victim = victim;
        self.segments[victim].state = SegmentState::Busy;
        let blocks = std::mem::take(&mut self.segments[victim].blocks);
        for (position, block) in blocks.iter().enumerate() {
            let block = *block as usize;
            if self.locations[block] == (victim as u32, position as u32) {
                let stream = self.relocation_stream(victim_stream, block);
                self.append(stream, block, true);
                self.relocated_blocks += 1;
            }
        }
        assert_eq!(self.segments[victim].live_blocks, 0);
        self.segments[victim].blocks = blocks;
        self.segments[victim].state = SegmentState::Free;
        self.free.push_back(victim as u32);
    }

    fn client_write(&mut self, block: usize) {
        let stream = self.client_stream(block);
        self.append(stream, block, false);
        self.last_client_write[block] = self.client_writes;
        self.client_writes += 1;
    }
}

fn main() {
    let policy = match argument("--policy", "engine").as_str() {
        "before" => Policy::Before,
        "ages" => Policy::Ages,
        "engine" => Policy::Engine,
        "estimate" => Policy::Estimate,
        "oracle" => Policy::Oracle,
        other => panic!("--policy {other}: expected before, ages, engine, estimate or oracle"),
    };
    let segment_count: usize = argument("--segments", "2000").parse().expect("--segments");
    let segment_block_count: usize = argument("--segment-blocks", "255")
        .parse()
        .expect("--segment-blocks");
    let live: f64 = argument("--live", "0.85").parse().expect("--live");
    let theta: f64 = argument("--zipf", "0.99").parse().expect("--zipf");
    let workload = argument("--workload", "zipf");
    let passes: usize = argument("--passes", "2").parse().expect("--passes");
    let block_count = (segment_count as f64 * segment_block_count as f64 * live) as usize;
    let zipf = Zipf::new(block_count, theta);
    let mut simulation = Simulation {
        policy,
        shared_streams: match argument("--shared-streams", "off").as_str() {
            "on" => true,
            "off" => false,
            other => panic!("--shared-streams {other}: expected on or off"),
        },
        victim_rule: match argument("--victim", "cost-benefit").as_str() {
            "cost-benefit" => VictimRule::CostBenefit,
            "declining-cost" => VictimRule::DecliningCost,
            other => panic!("--victim {other}: expected cost-benefit or declining-cost"),
        },
        age_exponent: argument("--age-exponent", "0.5")
            .parse()
            .expect("--age-exponent"),
        segment_block_count,
        client_class_count: argument("--client-classes", "3")
            .parse()
            .expect("--client-classes"),
        relocation_class_count: argument("--relocation-classes", "4")
            .parse()
            .expect("--relocation-classes"),
        factor: argument("--factor", "8").parse().expect("--factor"),
        headroom_segment_count: argument("--headroom", "4").parse().expect("--headroom"),
        segments: (0..segment_count)
            .map(|_| Segment {
                state: SegmentState::Free,
                stream: 0,
                live_blocks: 0,
                blocks: Vec::with_capacity(segment_block_count),
                last_written_at: 0,
                opened_at_client_writes: 0,
                data_written_at: 0.0,
                write_rate: 0.0,
            })
            .collect(),
        free: (0..segment_count as u32).collect(),
        heads: Vec::new(),
        locations: vec![(NONE, 0); block_count],
        last_client_write: vec![u64::MAX; block_count],
        interval_estimates: vec![0.0; block_count],
        true_intervals: (0..block_count)
            .map(|rank| 1.0 / zipf.probability(rank))
            .collect(),
        block_write_rates: vec![0.0; block_count],
        lifespans: VecDeque::new(),
        current_victim: 0,
        writes: 0,
        client_writes: 0,
        relocated_blocks: 0,
        victims_per_stream: Vec::new(),
        victim_live_blocks_per_stream: Vec::new(),
    };
    let stream_count = simulation.stream_count();
    simulation.heads = vec![NONE; stream_count];
    simulation.victims_per_stream = vec![0; stream_count];
    simulation.victim_live_blocks_per_stream = vec![0; stream_count];
    let mut rng = SmallRng::seed_from_u64(42);
    let draw = |rng: &mut SmallRng| match workload.as_str() {
        "zipf" => zipf.sample(rng),
        "uniform" => rng.random_range(0..block_count),
        other => panic!("--workload {other}: expected zipf or uniform"),
    };
    for block in 0..block_count {
        simulation.client_write(block);
    }
    for _ in 0..block_count * 2 {
        let block = draw(&mut rng);
        simulation.client_write(block);
    }
    simulation.relocated_blocks = 0;
    simulation.victims_per_stream.fill(0);
    simulation.victim_live_blocks_per_stream.fill(0);
    let measured_from = simulation.client_writes;
    for _ in 0..block_count * passes {
        let block = draw(&mut rng);
        simulation.client_write(block);
    }
    let live_blocks: u64 = simulation
        .segments
        .iter()
        .map(|segment| u64::from(segment.live_blocks))
        .sum();
    assert_eq!(live_blocks, block_count as u64, "the model lost blocks");
    let relocated_per_client_block =
        simulation.relocated_blocks as f64 / (simulation.client_writes - measured_from) as f64;
    println!(
        "{segment_count} segments of {segment_block_count} blocks, {workload}, live {live}: \
         relocated/blk {relocated_per_client_block:.3}"
    );
    for stream in 0..stream_count {
        let victims = simulation.victims_per_stream[stream];
        if victims > 0 {
            println!(
                "  stream {stream}: {victims} victims at {:.3} live",
                simulation.victim_live_blocks_per_stream[stream] as f64
                    / victims as f64
                    / segment_block_count as f64
            );
        }
    }
}
