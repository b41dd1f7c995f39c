//! Crash consistency: seeded random mixes of writes (aligned and not), flushes,
//! FUA writes, trims, write-zeroes, resizes, checkpoints, cleaning, snapshots
//! (create, delete, rollback) and clones (create, write, delete) on the fault-injecting
//! device, a power cut at a random point (unflushed writes kept, dropped or torn
//! at 512-byte boundaries), recovery, and a block-by-block comparison with a
//! shadow model that knows, for every block, which contents it may hold: the last
//! durable one or any written since. Some cuts land after a checkpoint and
//! writes that opened segments since it, and some runs rot the segment
//! openings record before recovery (format version 8). In two-tier runs, half
//! the cuts also lose the flash device: a copy restored from the capacity region
//! alone must open and read every block back as written or as lost (format
//! version 9). Each run crashes twice, so recovery of a
//! recovered pool is covered too. Odd seeds make freed segments the next ones
//! taken, so that a segment freed too early is rewritten before the cut.
//! `LAMINA_CRASH_RUNS` sets the number of seeds (default 1000). The shadow
//! model and the operations are in `common/shadow.rs`, shared with
//! `array_crashes.rs`.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::sync::Arc;

use lamina_device::{BlockDevice, FaultyDevice, MemoryDevice, PowerCutStyle};
use lamina_engine::{EngineError, FlashRestore, IoError, Pool, PoolLimits, PoolOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod common;

use common::shadow::{
    approach_the_cut, check_recovered, crash_runs, create_volumes, first_seed, limits,
    run_operations,
};
use common::{
    corrupt_newest_checkpoint_body, corrupt_newest_checkpoint_slot,
    corrupt_segment_openings_record, newest_slot,
};
use lamina_engine::log::checkpoint::CHECKPOINT_INCREMENTS_MAX;

const SEGMENT_BYTES: u64 = 64 << 10;
const DEVICE_BYTES: u64 = (4 << 20) + 128 * SEGMENT_BYTES;
/// The two-tier layout: a flash region of 24 segments, so that the cleaner
/// demotes constantly, then a capacity device (1 MiB label, 104 segments).
const TWO_TIER_FLASH_BYTES: u64 = (4 << 20) + 24 * SEGMENT_BYTES;
const TWO_TIER_DEVICE_BYTES: u64 = TWO_TIER_FLASH_BYTES + (1 << 20) + 104 * SEGMENT_BYTES;

/// What the runs' power cuts interrupted and what they corrupted, so that
/// the test can check that incremental checkpoints were in the mix.
#[derive(Default, Debug)]
struct CutTally {
    /// Cuts during a checkpoint that extends a chain with room (an increment,
    /// unless it grew past half its base), and during one that must start a
    /// new chain (a compaction into a new base).
    during_chain_with_room: u64,
    during_compaction: u64,
    /// Corrupted newest bodies that were increments, and bases.
    corrupted_increments: u64,
    corrupted_bases: u64,
    /// Cuts after a checkpoint and writes that opened segments since it
    /// (recovery finds them through the segment openings record), and
    /// corrupted records (recovery then scans every segment).
    cuts_after_new_segments: u64,
    corrupted_openings_records: u64,
    /// Blocks stored as fragments (compressing volumes, decision 0070) that
    /// recovery brought back, summed over the cuts.
    fragments_recovered: u64,
    /// Of those, the ones recovered on the capacity tier (two-tier runs:
    /// demoted as fragments, decision 0074).
    capacity_fragments_recovered: u64,
    /// Two-tier runs: cuts after which the flash device was also lost and
    /// the pool restored from the capacity device alone.
    flash_restores: u64,
}

/// The shared limits; in two-tier runs a third of the seeds compress cold
/// data harder as the cleaner demotes it (decision 0074), so that recovery
/// replays blocks moved in a new form.
fn run_limits(seed: u64, two_tiers: bool) -> PoolLimits {
    let cold = if two_tiers && seed % 3 == 2 {
        "zstd:3"
    } else {
        "off"
    };
    PoolLimits {
        cold_compression: cold.parse().unwrap(),
        ..limits(seed)
    }
}

async fn crash_run(seed: u64, two_tiers: bool, tally: &mut CutTally) -> (u64, u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (device_bytes, flash_region_bytes) = if two_tiers {
        (TWO_TIER_DEVICE_BYTES, Some(TWO_TIER_FLASH_BYTES))
    } else {
        (DEVICE_BYTES, None)
    };
    let memory = Arc::new(MemoryDevice::new(device_bytes));
    let mut faulty = Arc::new(FaultyDevice::new(memory.clone(), seed));
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        force: false,
        flash_region_bytes,
        ..PoolOptions::default()
    };
    let pool = Pool::create(faulty.clone(), options, run_limits(seed, two_tiers))
        .await
        .expect("create");
    let mut shadows = create_volumes(&pool, &mut rng).await;
    let mut pool = pool;
    let mut names_used = 0;
    // Blocks promoted and demoted over the run (counted per pool incarnation).
    let mut moved = (0u64, 0u64);
    for cycle in 0..2 {
        let count = rng.random_range(5..120);
        run_operations(&pool, &mut shadows, &mut rng, count, &mut names_used).await;
        if rng.random_bool(0.3) {
            // A checkpoint, then writes that open new segments (of 16
            // blocks) since it, the cut landing among them: recovery must
            // find those segments without reading every segment.
            pool.checkpoint().await.expect("checkpoint");
            let count = rng.random_range(1..40);
            run_operations(&pool, &mut shadows, &mut rng, count, &mut names_used).await;
            tally.cuts_after_new_segments += 1;
        }
        let pending = approach_the_cut(&pool, &shadows, &mut rng, cycle, seed).await;
        // Half the cuts land around a checkpoint in flight: an increment, or
        // a compaction when the chain is full.
        let chain_links = newest_slot(&memory).1.chain().len();
        let checkpoint = rng.random_bool(0.5).then(|| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.checkpoint().await })
        });
        for _ in 0..rng.random_range(0..16) {
            tokio::task::yield_now().await;
        }
        faulty
            .power_cut(PowerCutStyle::Random)
            .await
            .expect("power cut");
        if let Some(checkpoint) = checkpoint {
            if !checkpoint.is_finished() {
                if chain_links > CHECKPOINT_INCREMENTS_MAX {
                    tally.during_compaction += 1;
                } else {
                    tally.during_chain_with_room += 1;
                }
            }
            // Interrupted by the cut or done before it: either is fine.
            let _ = checkpoint.await.expect("checkpoint task");
        }
        let interrupted = match pending {
            Some(pending) => Some(pending.interrupted().await),
            None => None,
        };
        let status = pool.status();
        moved = (
            moved.0 + status.promoted_blocks,
            moved.1 + status.demoted_blocks,
        );
        pool.abandon();
        drop(pool);
        if two_tiers && rng.random_bool(0.5) {
            check_flash_restore(&memory, seed).await;
            tally.flash_restores += 1;
        }
        if rng.random_bool(0.1) {
            // A rotted segment openings record (the newest or the older):
            // recovery cannot tell it from a torn one and scans every segment.
            if corrupt_segment_openings_record(&memory, rng.random_bool(0.5)) {
                tally.corrupted_openings_records += 1;
            }
        }
        if rng.random_bool(0.3) {
            corrupt_newest_checkpoint_slot(&memory);
        } else if rng.random_bool(0.2) {
            // A corrupt body (an increment or a base): recovery falls back to
            // the older slot, one checkpoint earlier, and its log.
            if corrupt_newest_checkpoint_body(&memory) {
                tally.corrupted_increments += 1;
            } else {
                tally.corrupted_bases += 1;
            }
        }
        faulty = Arc::new(FaultyDevice::new(memory.clone(), seed + 1000 * (cycle + 1)));
        pool = Pool::open(
            faulty.clone() as Arc<dyn BlockDevice>,
            run_limits(seed, two_tiers),
        )
        .await
        .unwrap_or_else(|error| panic!("seed {seed}: recovery failed: {error}"));
        check_recovered(&pool, &mut shadows, interrupted, seed).await;
        tally.fragments_recovered += fragment_count(&pool, 0);
        if two_tiers {
            tally.capacity_fragments_recovered +=
                fragment_count(&pool, TWO_TIER_FLASH_BYTES / 4096);
        }
    }
    let status = pool.status();
    pool.close().await.expect("close");
    (
        moved.0 + status.promoted_blocks,
        moved.1 + status.demoted_blocks,
    )
}

/// Blocks of the pool's live volumes stored as fragments from device block
/// `first_block` on.
fn fragment_count(pool: &Pool, first_block: u64) -> u64 {
    let mut count = 0;
    for volume in pool.list_volumes() {
        let blocks = volume.size_bytes / 4096;
        count += (0..blocks)
            .filter(|block| {
                pool.location_of(volume.volume_id, *block)
                    .is_some_and(|location| {
                        location.is_fragment() && location.block() >= first_block
                    })
            })
            .count() as u64;
    }
    count
}

/// The flash device lost at the cut as well: a copy of the device with its
/// flash region zeroed is restored from the capacity region alone (format
/// version 9), and every block of every volume and snapshot reads back as
/// content it was written with (its checksum in the restored map holds) or
/// as lost, never as a checksum mismatch: that would mean the slot copy
/// named a body or data the pool had already reused.
async fn check_flash_restore(memory: &MemoryDevice, seed: u64) {
    let mut bytes = memory.snapshot();
    bytes[..TWO_TIER_FLASH_BYTES as usize].fill(0);
    let device = Arc::new(MemoryDevice::from_bytes(bytes));
    Pool::restore_flash(FlashRestore {
        device: &*device,
        flash_region_bytes: TWO_TIER_FLASH_BYTES,
        force: false,
    })
    .await
    .unwrap_or_else(|error| panic!("seed {seed}: flash restore refused: {error}"));
    let pool = Pool::open_restored(device, run_limits(seed, true))
        .await
        .unwrap_or_else(|error| panic!("seed {seed}: open after the flash restore: {error}"));
    let mut views = Vec::new();
    for volume in pool.list_volumes() {
        views.push((volume.name.clone(), volume.size_bytes));
        for snapshot in pool.list_snapshots(Some(&volume.name)).unwrap() {
            views.push((snapshot.full_name, snapshot.size_bytes));
        }
    }
    let mut contents = vec![0u8; 4096];
    for (name, size_bytes) in views {
        let view = pool.resolve_view(&name).unwrap();
        for offset in (0..size_bytes).step_by(4096) {
            match pool.read_view(view, offset, &mut contents).await {
                Ok(()) | Err(EngineError::Io(IoError::BlockLost { .. })) => {}
                Err(error) => {
                    panic!("seed {seed}: {name} at {offset} after the flash restore: {error}")
                }
            }
        }
    }
    rewrite_after_restore(&pool, seed).await;
    pool.close()
        .await
        .unwrap_or_else(|error| panic!("seed {seed}: close after the flash restore: {error}"));
}

/// The restored pool's space must be accounted right: every volume is
/// overwritten (lost blocks and all) and cleaned, and must then read back
/// exactly, also after a reopen; a block referenced twice would have its
/// segment freed under live data.
async fn rewrite_after_restore(pool: &Pool, seed: u64) {
    let stamp = |name: &str, offset: u64| {
        let mut contents = vec![(seed as u8) ^ 0x5A; 4096];
        contents[..8].copy_from_slice(&offset.to_le_bytes());
        contents[8..8 + name.len().min(64)].copy_from_slice(&name.as_bytes()[..name.len().min(64)]);
        contents
    };
    let volumes = pool.list_volumes();
    for volume in &volumes {
        let volume_id = pool.volume_id(&volume.name).unwrap();
        for offset in (0..volume.size_bytes).step_by(4096) {
            pool.write(volume_id, offset, &stamp(&volume.name, offset), false)
                .await
                .unwrap_or_else(|error| {
                    panic!("seed {seed}: write after the flash restore: {error}")
                });
        }
    }
    pool.flush().await.unwrap();
    for _ in 0..4 {
        let _ = pool.clean(4).await;
        let _ = pool.checkpoint().await;
    }
    let mut contents = vec![0u8; 4096];
    for volume in &volumes {
        let volume_id = pool.volume_id(&volume.name).unwrap();
        for offset in (0..volume.size_bytes).step_by(4096) {
            pool.read(volume_id, offset, &mut contents)
                .await
                .unwrap_or_else(|error| panic!("seed {seed}: read after the rewrite: {error}"));
            assert!(
                contents == stamp(&volume.name, offset),
                "seed {seed}: {} at {offset} changed after the rewrite",
                volume.name
            );
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn seeded_power_cuts_never_lose_flushed_data() {
    let (first, runs) = (first_seed(), crash_runs());
    let mut tally = CutTally::default();
    for seed in first..first + runs {
        crash_run(seed, false, &mut tally).await;
    }
    eprintln!("{runs} runs: {tally:?}");
    // Incremental checkpoints must have been in the mix, or the runs prove
    // nothing about them.
    assert!(
        runs < 100
            || (tally.during_chain_with_room > 0
                && tally.during_compaction > 0
                && tally.corrupted_increments > 0
                && tally.cuts_after_new_segments > 0
                && tally.corrupted_openings_records > 0
                && tally.fragments_recovered > 0),
        "{tally:?}"
    );
}

/// The same with a flash tier small enough that the cleaner demotes blocks to
/// capacity all the time and the verifying reads promote them back, with
/// random tier policies: moves between tiers never lose or change durable data.
#[tokio::test(flavor = "current_thread")]
async fn seeded_power_cuts_with_two_tiers_never_lose_flushed_data() {
    let (first, runs) = (first_seed(), crash_runs() / 2);
    let mut moved = (0, 0);
    let mut tally = CutTally::default();
    for seed in first..first + runs {
        let (promoted, demoted) = crash_run(seed, true, &mut tally).await;
        moved = (moved.0 + promoted, moved.1 + demoted);
    }
    eprintln!(
        "{runs} two-tier runs: promoted {} and demoted {} blocks; {tally:?}",
        moved.0, moved.1
    );
    // The runs must have exercised both directions, or they prove nothing.
    assert!(
        runs < 20
            || (moved.0 > 0
                && moved.1 > 0
                && tally.flash_restores > 0
                && tally.capacity_fragments_recovered > 0),
        "promoted {} and demoted {} blocks in {runs} runs; {tally:?}",
        moved.0,
        moved.1
    );
}
