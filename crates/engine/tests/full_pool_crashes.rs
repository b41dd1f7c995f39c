//! Power cuts in a nearly full pool (issue 16): a volume filled to 84% of what
//! clients can fill, four concurrent writers of random 4 KiB overwrites (so
//! that the cleaner works all the time, near its reserve), a power cut at a
//! random point (unflushed writes kept, dropped or torn), recovery, and then a
//! full pass of overwrites, which must all be accepted: a crash may lose
//! unflushed work, never the pool's ability to reclaim space. Every block
//! flushed before the cut reads back (or a newer write of it), and every block
//! of the pass reads back after it. `LAMINA_CRASH_RUNS` sets the number of
//! seeds (a third of it is run: 333 by default, 100 at 300).

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;
use common::blocks::versioned_contents;

use std::sync::{Arc, Mutex};

use lamina_device::{BlockDevice, FaultyDevice, MemoryDevice, PowerCutStyle};
use lamina_engine::{Pool, PoolLimits, PoolOptions};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
/// 48 segments of 1 MiB: a victim's live blocks span several batches, so
/// that a cut can land between them (with smaller segments the wedge of
/// issue 16 was reached about half as often).
const SEGMENT_BYTES: u64 = 1 << 20;
const SEGMENT_COUNT: u64 = 48;
const DEVICE_BYTES: u64 = (4 << 20) + SEGMENT_COUNT * SEGMENT_BYTES;
/// Share of what clients can fill that the volume takes, as in the issue.
const FILL_PERCENT: u64 = 84;
const WRITER_COUNT: u64 = 4;
/// Writes a writer makes between two flushes of its own, at most: rare
/// flushes, as from a host that seldom syncs, so that much is unflushed.
const WRITES_PER_FLUSH_MAX: u64 = 2000;
/// Yields of the test task between the moment the cleaner works at the
/// bottom of its reserve and the cut, at most.
const YIELDS_BEFORE_THE_CUT_MAX: u32 = 16;
/// Seeds from which the runs must have reached the state that wedged the
/// pool (about one seed in fifty does, nearly all of them unpaced: see
/// [`limits`]).
const SEEDS_THAT_MUST_REACH_THE_WEDGE: u64 = 300;

/// What a block may hold: any generation from the last one a flush covered
/// to the last one a write was attempted with.
#[derive(Clone, Copy, Default)]
struct Shadow {
    durable: u32,
    attempted: u32,
}

/// Whether a seed's pool runs the paced cleaner (even seeds; see [`limits`]).
fn is_paced(seed: u64) -> bool {
    seed.is_multiple_of(2)
}

/// Limits of one seed's pool. Odd seeds turn the paced cleaner off, as
/// `cleaner_relocation_blocks_per_client_block_max = 0` does in a daemon: the
/// background task then cleans in passes when free space is low and writers
/// clean for themselves at the reserve, the regime issue 16 was found in. The
/// paced cleaner (even seeds, the default) keeps free space above its
/// headroom, so a cut finds it at the bottom of its reserve far less often:
/// about 1 run in 200 against 7 in 200 unpaced (release build, 2026-11-29).
/// With paced runs alone, 333 runs reached the state of issue 16 in none of
/// them in one CI run, and the coverage assertion below failed.
fn limits(seed: u64) -> PoolLimits {
    let defaults = PoolLimits::default();
    PoolLimits {
        // Flushes and checkpoints come from the writers and the cleaner, as in
        // a daemon under load, and the background ones at the daemon's pace.
        flush_interval_ms: 1000,
        cleaner_relocation_blocks_per_client_block_max: if is_paced(seed) {
            defaults.cleaner_relocation_blocks_per_client_block_max
        } else {
            0.0
        },
        ..defaults
    }
}

/// One writer: random overwrites of the blocks `block % WRITER_COUNT ==
/// writer`, a flush every few writes, until the device fails under it.
async fn overwrite_until_the_cut(
    pool: Pool,
    volume: u32,
    writer: u64,
    block_count: u64,
    shadows: Arc<Mutex<Vec<Shadow>>>,
    seed: u64,
) {
    let mut rng = SmallRng::seed_from_u64(seed * 16 + writer);
    let mut since_flush: Vec<(u64, u32)> = Vec::new();
    let mut flush_after = rng.random_range(1..=WRITES_PER_FLUSH_MAX);
    loop {
        let block = rng.random_range(0..block_count / WRITER_COUNT) * WRITER_COUNT + writer;
        let generation = {
            let mut shadows = shadows.lock().unwrap();
            shadows[block as usize].attempted += 1;
            shadows[block as usize].attempted
        };
        let result = pool
            .write(
                volume,
                block * BLOCK as u64,
                &versioned_contents(block, generation),
                false,
            )
            .await;
        if let Err(error) = result {
            assert!(
                !matches!(
                    error,
                    lamina_engine::EngineError::Io(lamina_engine::IoError::NoSpace)
                ),
                "seed {seed}: the pool filled up before the cut"
            );
            return;
        }
        since_flush.push((block, generation));
        if since_flush.len() as u64 >= flush_after {
            if pool.flush().await.is_err() {
                return;
            }
            let mut shadows = shadows.lock().unwrap();
            for (block, generation) in since_flush.drain(..) {
                let shadow = &mut shadows[block as usize];
                shadow.durable = shadow.durable.max(generation);
            }
            flush_after = rng.random_range(1..=WRITES_PER_FLUSH_MAX);
        }
    }
}

async fn verify(pool: &Pool, volume: u32, shadows: &[Shadow], seed: u64, phase: &str) {
    let mut data = vec![0u8; BLOCK];
    for (block, shadow) in shadows.iter().enumerate() {
        let block = block as u64;
        pool.read(volume, block * BLOCK as u64, &mut data)
            .await
            .unwrap_or_else(|error| panic!("seed {seed} {phase}: block {block}: {error}"));
        let generation = u32::from_le_bytes(data[8..12].try_into().unwrap());
        assert!(
            generation >= shadow.durable
                && generation <= shadow.attempted
                && data == versioned_contents(block, generation),
            "seed {seed} {phase}: block {block} holds generation {generation}, expected {} to {}",
            shadow.durable,
            shadow.attempted
        );
    }
}

/// One seed; returns whether recovery left the state that wedged the pool.
async fn crash_run(seed: u64) -> bool {
    let mut rng = SmallRng::seed_from_u64(seed);
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let faulty = Arc::new(FaultyDevice::new(memory.clone(), seed));
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        force: false,
        flash_region_bytes: None,
        ..PoolOptions::default()
    };
    let pool = Pool::create(faulty.clone(), options, limits(seed))
        .await
        .expect("create");
    let fillable_blocks = pool.status().free_bytes / BLOCK as u64;
    let block_count = (fillable_blocks * FILL_PERCENT / 100) / WRITER_COUNT * WRITER_COUNT;
    pool.create_volume("v", block_count * BLOCK as u64)
        .await
        .expect("create volume");
    let volume = pool.volume_id("v").unwrap();
    for block in 0..block_count {
        pool.write(
            volume,
            block * BLOCK as u64,
            &versioned_contents(block, 1),
            false,
        )
        .await
        .unwrap_or_else(|error| panic!("seed {seed}: fill: {error}"));
    }
    pool.flush().await.expect("flush");
    let shadows = Arc::new(Mutex::new(vec![
        Shadow {
            durable: 1,
            attempted: 1
        };
        block_count as usize
    ]));
    let writers: Vec<_> = (0..WRITER_COUNT)
        .map(|writer| {
            tokio::spawn(overwrite_until_the_cut(
                pool.clone(),
                volume,
                writer,
                block_count,
                shadows.clone(),
                seed,
            ))
        })
        .collect();
    // Cut once the writers have overwritten between half the volume and
    // twice it and the cleaner works at the bottom of its reserve (free
    // segments down to what it leaves), a few steps later.
    let cut_after_blocks = rng.random_range(block_count / 2..block_count * 2);
    let start_relocated = pool.status().cleaner_relocated_blocks;
    let mut yields_left: Option<u32> = None;
    loop {
        tokio::task::yield_now().await;
        if let Some(left) = &mut yields_left {
            if *left == 0 {
                break;
            }
            *left -= 1;
            continue;
        }
        if writers.iter().any(|writer| writer.is_finished()) {
            break;
        }
        let written: u64 = shadows
            .lock()
            .unwrap()
            .iter()
            .map(|shadow| u64::from(shadow.attempted - 1))
            .sum();
        let table = pool.segment_table();
        if written >= cut_after_blocks
            && table.free_segments.len() <= table.cleaner_reserve_floor_segment_count
        {
            yields_left = Some(rng.random_range(0..YIELDS_BEFORE_THE_CUT_MAX));
        }
        if written >= 4 * block_count {
            break;
        }
    }
    faulty
        .power_cut(PowerCutStyle::Random)
        .await
        .expect("power cut");
    for writer in writers {
        writer.await.expect("writer");
    }
    assert!(
        pool.status().cleaner_relocated_blocks > start_relocated,
        "seed {seed}: the cleaner never ran before the cut"
    );
    pool.abandon();
    drop(pool);

    let faulty = Arc::new(FaultyDevice::new(memory.clone(), seed + 1000));
    let pool = Pool::open(faulty as Arc<dyn BlockDevice>, limits(seed))
        .await
        .unwrap_or_else(|error| panic!("seed {seed}: recovery failed: {error}"));
    let mut shadows = shadows.lock().unwrap().clone();
    // The state the pool was left in: no more free segments than
    // the cleaner leaves, and recovery opened no head for it.
    let table = pool.segment_table();
    let wedge_reached = table.free_segments.len() <= table.cleaner_reserve_floor_segment_count;
    verify(&pool, volume, &shadows, seed, "after recovery").await;
    // A full pass of overwrites, in random order: every one must be taken.
    let mut order: Vec<u64> = (0..block_count).collect();
    order.shuffle(&mut rng);
    for block in order {
        let shadow = &mut shadows[block as usize];
        shadow.attempted += 1;
        shadow.durable = shadow.attempted;
        pool.write(
            volume,
            block * BLOCK as u64,
            &versioned_contents(block, shadow.attempted),
            false,
        )
        .await
        .unwrap_or_else(|error| {
            let status = pool.status();
            panic!("seed {seed}: overwrite of block {block} after recovery: {error}; {status:?}")
        });
    }
    pool.flush().await.expect("flush");
    verify(&pool, volume, &shadows, seed, "after the pass").await;
    pool.close().await.expect("close");
    wedge_reached
}

/// Seeds: a third of `LAMINA_CRASH_RUNS` (1000 by default), at least 10.
fn crash_runs() -> u64 {
    let runs: u64 = std::env::var("LAMINA_CRASH_RUNS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(1000);
    (runs / 3).max(10)
}

fn first_seed() -> u64 {
    std::env::var("LAMINA_CRASH_FIRST_SEED")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "current_thread")]
async fn power_cuts_while_cleaning_a_nearly_full_pool_never_wedge_it() {
    let (first, runs) = (first_seed(), crash_runs());
    // Runs that recovered to the state of issue 16, by regime: [paced, unpaced].
    let mut wedges_reached = [0u64; 2];
    for seed in first..first + runs {
        if crash_run(seed).await {
            wedges_reached[usize::from(!is_paced(seed))] += 1;
        }
    }
    // The state is reached in a few runs in a hundred, by chance: when
    // none did, more unpaced seeds are run (as many again at most) rather
    // than let a run that proves nothing pass or fail by luck.
    let must_reach = runs >= SEEDS_THAT_MUST_REACH_THE_WEDGE;
    let mut extra_seed = (first + runs) | 1;
    assert!(!is_paced(extra_seed), "extra seeds are unpaced");
    let mut extra_runs = 0;
    while must_reach && wedges_reached == [0, 0] && extra_runs < runs {
        if crash_run(extra_seed).await {
            wedges_reached[1] += 1;
        }
        extra_seed += 2;
        extra_runs += 1;
    }
    let [paced, unpaced] = wedges_reached;
    eprintln!(
        "{runs} runs and {extra_runs} more unpaced, {} recovered to the state of issue 16 \
         ({paced} paced, {unpaced} unpaced)",
        paced + unpaced
    );
    let wedges_reached = paced + unpaced;
    // Otherwise the runs prove nothing.
    assert!(
        !must_reach || wedges_reached > 0,
        "no run recovered with the cleaner at the bottom of its reserve"
    );
}
