//! Crash consistency on a raid6 array of six fault-injecting members
//! (`lamina_layout`): the crash tests' seeded random operations and shadow
//! model (`common/shadow.rs`) on a pool whose batches end mid-row and on row
//! boundaries, a power cut that hits every member at once but tears and
//! loses each member's unflushed writes independently (as independent drives
//! do), then assembly from the members in whatever state they are and
//! recovery. Each seed draws its faults: none; one member vanishing
//! mid-workload and then a second one later in the same or the next cycle;
//! or bursts of bit flips on one member's striped region (while it runs and
//! while the power is off), with at most one other member vanishing, so that
//! no row ever has more bad columns than raid6's two parity columns cover.
//! Vanished members are left out at the next assembly or offered again, when
//! the array must leave them out if its labels say they missed writes.
//! Every block must hold what the shadow allows, and a final scrub must find
//! nothing it cannot repair. `LAMINA_CRASH_RUNS` sets the number of seeds
//! (default 1000), `LAMINA_CRASH_FIRST_SEED` the first one.

#![allow(clippy::cast_possible_truncation)]

use std::collections::BTreeSet;
use std::sync::Arc;

use lamina_device::{BlockDevice, FaultyDevice, MemoryDevice, PowerCutStyle};
use lamina_engine::log::geometry::DATA_START_BLOCK;
use lamina_engine::{Pool, PoolLimits, PoolOptions};
use lamina_layout::{
    ArrayIdentity, LABEL_AREA_BLOCKS, MemberDevice, Redundancy, RedundantArray, TierRole, assemble,
    create,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod common;

use common::shadow::{
    BLOCK, ShadowVolume, approach_the_cut, check_recovered, crash_runs, create_volumes, first_seed,
    limits, run_operations, verify,
};

const MEMBER_COUNT: usize = 6;
/// Raid6 over six members: four data columns and two parity columns a row.
const DATA_COLUMNS: u64 = 4;
/// 16 blocks: four rows of four, so that batches end mid-row and on rows.
const SEGMENT_BYTES: u64 = 64 << 10;
/// The pool's data region, as on the single device of `crash_consistency.rs`.
const SEGMENT_COUNT: u64 = 128;
/// Where a member's striped region starts: after its label area and the
/// mirrored prefix (the engine's superblock, flush markers and checkpoints).
const STRIPED_START_BYTES: u64 = (LABEL_AREA_BLOCKS + DATA_START_BLOCK) * BLOCK as u64;
const MEMBER_BYTES: u64 = STRIPED_START_BYTES + SEGMENT_COUNT * SEGMENT_BYTES / DATA_COLUMNS;
/// Members that vanish in a run with no bit flips: the parity columns.
const VANISHED_MEMBERS_MAX: usize = 2;
/// Bits flipped in one burst, at most.
const FLIPS_PER_BURST_MAX: usize = 24;
/// Bursts of bit flips while a pool runs, at most, per cycle.
const FLIP_BURSTS_PER_CYCLE_MAX: usize = 3;

/// What a seed does to its members besides the power cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Faults {
    None,
    /// One member vanishes, then a second one.
    Vanishing,
    /// Bit flips on one member, and perhaps one other member vanishing.
    BitFlips {
        member: usize,
    },
}

/// Something done to the members between two operations of a cycle.
#[derive(Clone, Copy, Debug)]
enum Event {
    Vanish,
    FlipBurst,
}

/// The six members: memory that outlives power cuts, and the fault-injecting
/// wrappers of the current power-on.
struct Members {
    memories: Vec<Arc<MemoryDevice>>,
    faulty: Vec<Arc<FaultyDevice<MemoryDevice>>>,
}

impl Members {
    fn new(seed: u64) -> Self {
        let memories: Vec<Arc<MemoryDevice>> = (0..MEMBER_COUNT)
            .map(|_| Arc::new(MemoryDevice::new(MEMBER_BYTES)))
            .collect();
        let mut members = Self {
            memories,
            faulty: Vec::new(),
        };
        members.power_on(seed);
        members
    }

    /// New wrappers over the same memory, as after a reboot.
    fn power_on(&mut self, seed: u64) {
        self.faulty = self
            .memories
            .iter()
            .enumerate()
            .map(|(index, memory)| {
                Arc::new(FaultyDevice::new(
                    memory.clone(),
                    seed * MEMBER_COUNT as u64 + index as u64,
                ))
            })
            .collect();
    }

    fn device(&self, index: usize) -> MemberDevice {
        MemberDevice {
            path: format!("member{index}"),
            device: self.faulty[index].clone() as Arc<dyn BlockDevice>,
        }
    }

    /// The member stops answering: every read, write and flush fails.
    async fn vanish(&self, index: usize) {
        self.faulty[index].fail_at_rate(1.0, 1.0).await;
        self.faulty[index].fail_flushes(true).await;
    }

    /// Cuts the power of every member at the same instant: no task runs
    /// between two members' cuts (`unconstrained` keeps tokio from
    /// preempting the loop), or the array would see the first members die
    /// and fault them before the rest lose power.
    async fn power_cut(&self) {
        tokio::task::unconstrained(async {
            for member in &self.faulty {
                member
                    .power_cut(PowerCutStyle::Random)
                    .await
                    .expect("power cut");
            }
        })
        .await;
    }

    /// Flips random bits anywhere in `member`'s striped region (data and
    /// parity, live or not), as silent media corruption would.
    async fn flip_burst(&self, member: usize, rng: &mut SmallRng) {
        for _ in 0..rng.random_range(1..=FLIPS_PER_BURST_MAX) {
            let offset = rng.random_range(STRIPED_START_BYTES..MEMBER_BYTES);
            self.faulty[member]
                .flip_bit(offset, rng.random_range(0..8))
                .await
                .expect("flip a bit");
        }
    }
}

/// The pool's limits: the crash tests', with no cache (reads reach the
/// members, flips included) and background work (scrub) at full speed.
fn array_limits(seed: u64) -> PoolLimits {
    PoolLimits {
        memory_cache_bytes: 0,
        background_bytes_per_second_max: Some(1 << 40),
        ..limits(seed)
    }
}

/// What one seed did, summed over the seeds for the final sanity checks.
#[derive(Default)]
struct RunCounts {
    vanished: u64,
    excluded_at_assembly: u64,
    repaired: u64,
}

/// One seed's state between operations.
struct ArrayRun {
    seed: u64,
    rng: SmallRng,
    faults: Faults,
    members: Members,
    pool: Pool,
    array: Arc<RedundantArray>,
    shadows: Vec<ShadowVolume>,
    names_used: usize,
    /// Members that vanished in this run (their contents may be stale).
    vanished: BTreeSet<usize>,
    /// Vanish events still to come, in this cycle and the next.
    vanishes_left: usize,
    counts: RunCounts,
}

impl ArrayRun {
    async fn new(seed: u64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let faults = match rng.random_range(0..3) {
            0 => Faults::None,
            1 => Faults::Vanishing,
            _ => Faults::BitFlips {
                member: rng.random_range(0..MEMBER_COUNT),
            },
        };
        let vanishes_left = match faults {
            Faults::None => 0,
            Faults::Vanishing => VANISHED_MEMBERS_MAX,
            Faults::BitFlips { .. } => usize::from(rng.random_bool(0.5)),
        };
        let members = Members::new(seed);
        let identity = ArrayIdentity {
            array_identifier: u128::from(seed) + 1,
            tier: TierRole::Flash,
        };
        let devices = (0..MEMBER_COUNT)
            .map(|index| members.device(index))
            .collect();
        let array = Arc::new(
            create(identity, Redundancy::Raid6, DATA_START_BLOCK, devices)
                .await
                .expect("create the array"),
        );
        let options = PoolOptions {
            segment_size_bytes: SEGMENT_BYTES,
            flash_row_blocks: array.row_data_blocks(),
            ..PoolOptions::default()
        };
        let pool = Pool::create(array.clone(), options, array_limits(seed))
            .await
            .expect("create the pool");
        let shadows = create_volumes(&pool, &mut rng).await;
        Self {
            seed,
            rng,
            faults,
            members,
            pool,
            array,
            shadows,
            names_used: 0,
            vanished: BTreeSet::new(),
            vanishes_left,
            counts: RunCounts::default(),
        }
    }

    /// The events of one cycle of `count` operations, by the operation they
    /// come before (`count`: after the last one, just before the cut).
    fn plan_cycle(&mut self, cycle: u64, count: usize) -> Vec<(usize, Event)> {
        let mut events = Vec::new();
        // A vanish in the first cycle leaves the second for the next vanish
        // half of the time; the last cycle takes whatever is left.
        let vanishes = if cycle == 0 {
            (0..self.vanishes_left)
                .take_while(|_| self.rng.random_bool(0.5))
                .count()
        } else {
            self.vanishes_left
        };
        self.vanishes_left -= vanishes;
        for _ in 0..vanishes {
            events.push((self.rng.random_range(0..=count), Event::Vanish));
        }
        if matches!(self.faults, Faults::BitFlips { .. }) {
            for _ in 0..self.rng.random_range(1..=FLIP_BURSTS_PER_CYCLE_MAX) {
                events.push((self.rng.random_range(0..=count), Event::FlipBurst));
            }
        }
        events.sort_by_key(|(position, _)| *position);
        events
    }

    async fn apply(&mut self, event: Event) {
        match event {
            Event::Vanish => {
                let flipped = match self.faults {
                    Faults::BitFlips { member } => Some(member),
                    _ => None,
                };
                let candidates: Vec<usize> = (0..MEMBER_COUNT)
                    .filter(|index| !self.vanished.contains(index) && Some(*index) != flipped)
                    .collect();
                let victim = candidates[self.rng.random_range(0..candidates.len())];
                self.members.vanish(victim).await;
                self.vanished.insert(victim);
                self.counts.vanished += 1;
            }
            Event::FlipBurst => {
                if let Faults::BitFlips { member } = self.faults {
                    self.members.flip_burst(member, &mut self.rng).await;
                }
            }
        }
    }

    /// Operations with the cycle's events among them, then the cut.
    async fn cycle(&mut self, cycle: u64) {
        let count = self.rng.random_range(5..120);
        let events = self.plan_cycle(cycle, count);
        let mut done = 0;
        for (position, event) in events {
            self.operations(position - done).await;
            done = position;
            self.apply(event).await;
        }
        self.operations(count - done).await;
        let pending =
            approach_the_cut(&self.pool, &self.shadows, &mut self.rng, cycle, self.seed).await;
        self.members.power_cut().await;
        let interrupted = match pending {
            Some(pending) => Some(pending.interrupted().await),
            None => None,
        };
        self.counts.repaired += self.pool.status().integrity.checksum_errors_repaired;
        self.pool.abandon();
        self.reassemble(cycle).await;
        check_recovered(&self.pool, &mut self.shadows, interrupted, self.seed).await;
    }

    async fn operations(&mut self, count: usize) {
        run_operations(
            &self.pool,
            &mut self.shadows,
            &mut self.rng,
            count,
            &mut self.names_used,
        )
        .await;
    }

    /// Powers the members on again (with flips at rest, in a bit-flip run),
    /// assembles the array from the members offered and opens the pool.
    /// Vanished members are left out or offered again: the array must leave
    /// out any its labels list as having left, and never a healthy one.
    async fn reassemble(&mut self, cycle: u64) {
        let seed = self.seed;
        self.members.power_on(seed + 1000 * (cycle + 1));
        if let Faults::BitFlips { member } = self.faults
            && self.rng.random_bool(0.5)
        {
            self.members.flip_burst(member, &mut self.rng).await;
        }
        let offer_vanished = self.rng.random_bool(0.5);
        let offered: Vec<MemberDevice> = (0..MEMBER_COUNT)
            .filter(|index| offer_vanished || !self.vanished.contains(index))
            .map(|index| self.members.device(index))
            .collect();
        let assembled = assemble(TierRole::Flash, offered)
            .await
            .unwrap_or_else(|error| panic!("seed {seed}: the array does not assemble: {error}"));
        for excluded in &assembled.excluded {
            let index: usize = excluded.path["member".len()..].parse().unwrap();
            assert!(
                self.vanished.contains(&index),
                "seed {seed}: healthy {} left out: {}",
                excluded.path,
                excluded.reason
            );
            self.counts.excluded_at_assembly += 1;
        }
        self.array = Arc::new(assembled.array);
        assert!(
            self.array.lost_member_count() <= VANISHED_MEMBERS_MAX,
            "seed {seed}: {} members lost",
            self.array.lost_member_count()
        );
        self.pool = Pool::open(self.array.clone(), array_limits(seed))
            .await
            .unwrap_or_else(|error| panic!("seed {seed}: recovery failed: {error}"));
    }

    /// After a scrub that found nothing beyond repair, every row must
    /// survive the loss of as many more members as the parity covers
    /// (issue 42: the scrub checks parity, not only the data reads use):
    /// members are failed at random until two are lost, and every block is
    /// checked again, read through the reconstruction.
    async fn lose_what_the_parity_still_covers(&mut self) {
        let seed = self.seed;
        while self.array.lost_member_count() < VANISHED_MEMBERS_MAX {
            let usable: Vec<usize> = self
                .array
                .member_status()
                .iter()
                .filter(|member| member.state.is_usable())
                .map(|member| member.index)
                .collect();
            let index = usable[self.rng.random_range(0..usable.len())];
            self.array.fail_member(index);
        }
        verify(
            &self.pool,
            &self.shadows,
            seed,
            "after the scrub and two more lost members",
        )
        .await;
    }

    /// Scrubs (nothing may be beyond repair: no row ever had more bad
    /// columns than the parity), checks every block again and closes.
    async fn finish(mut self) -> RunCounts {
        let seed = self.seed;
        let scrub = self.pool.scrub().await.expect("scrub");
        assert_eq!(
            scrub.blocks_unrepairable, 0,
            "seed {seed} ({:?}, members {:?} vanished): {scrub:?}",
            self.faults, self.vanished
        );
        assert_eq!(scrub.blocks_scrubbed, scrub.blocks_total, "seed {seed}");
        verify(&self.pool, &self.shadows, seed, "after the scrub").await;
        self.lose_what_the_parity_still_covers().await;
        self.counts.repaired += self.pool.status().integrity.checksum_errors_repaired;
        self.pool.close().await.expect("close");
        self.counts
    }
}

async fn crash_run(seed: u64) -> RunCounts {
    let mut run = ArrayRun::new(seed).await;
    for cycle in 0..2 {
        run.cycle(cycle).await;
    }
    run.finish().await
}

#[tokio::test(flavor = "current_thread")]
async fn seeded_power_cuts_and_member_faults_on_raid6_never_lose_flushed_data() {
    let (first, runs) = (first_seed(), crash_runs());
    let mut totals = RunCounts::default();
    for seed in first..first + runs {
        let counts = crash_run(seed).await;
        totals.vanished += counts.vanished;
        totals.excluded_at_assembly += counts.excluded_at_assembly;
        totals.repaired += counts.repaired;
    }
    eprintln!(
        "{runs} raid6 runs: {} members vanished, {} stale members left out at assembly, {} blocks repaired",
        totals.vanished, totals.excluded_at_assembly, totals.repaired
    );
    // The runs must have met each fault, or they prove nothing.
    assert!(
        runs < 20
            || (totals.vanished > 0 && totals.excluded_at_assembly > 0 && totals.repaired > 0),
        "too few faults met in {runs} runs"
    );
}
