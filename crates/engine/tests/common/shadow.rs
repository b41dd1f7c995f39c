//! The shadow model of the crash tests (`crash_consistency.rs` on one
//! device, `array_crashes.rs` on a raid6 array): for every block of every
//! volume, the contents it may hold after a power cut (the last durable one or
//! any written since), snapshots with their fixed contents, the seeded random
//! mix of operations that drives a pool and its shadow together, snapshot
//! operations left running at the cut, and the block-by-block comparison.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::sync::Arc;

use lamina_engine::{CachePriority, Pin, Pool, PoolLimits, TierPolicy};
use rand::Rng;
use rand::rngs::SmallRng;

pub const BLOCK: usize = 4096;
const VOLUME_BLOCKS_MAX: usize = 48;
/// Snapshots per volume and volumes in all (clones included), at most, so that
/// what snapshots keep alive always fits in the small device.
const SNAPSHOTS_PER_VOLUME_MAX: usize = 3;
const VOLUMES_MAX: usize = 5;

/// A snapshot's contents are fixed (snapshot creation flushes everything).
struct ShadowSnapshot {
    name: String,
    blocks: Vec<Arc<Vec<u8>>>,
}

/// The contents each block of a volume may hold after a crash.
pub struct ShadowVolume {
    name: String,
    /// Per block: index 0 is the newest content; all entries are possible
    /// after a crash (the last is the one a completed flush made durable).
    blocks: Vec<Vec<Arc<Vec<u8>>>>,
    snapshots: Vec<ShadowSnapshot>,
    /// (volume, snapshot) this volume was cloned from.
    origin: Option<(String, String)>,
}

impl ShadowVolume {
    fn latest(&self, block: usize) -> &Arc<Vec<u8>> {
        &self.blocks[block][0]
    }

    fn write(&mut self, block: usize, contents: Vec<u8>) {
        self.blocks[block].insert(0, Arc::new(contents));
    }

    fn flushed(&mut self) {
        for candidates in &mut self.blocks {
            candidates.truncate(1);
        }
    }

    fn current(&self) -> Vec<Arc<Vec<u8>>> {
        self.blocks
            .iter()
            .map(|candidates| candidates[0].clone())
            .collect()
    }
}

fn has_clones(shadows: &[ShadowVolume], volume: &str, snapshot: Option<&str>) -> bool {
    shadows.iter().any(|shadow| {
        shadow
            .origin
            .as_ref()
            .is_some_and(|(origin_volume, origin_snapshot)| {
                origin_volume == volume && snapshot.is_none_or(|name| name == origin_snapshot)
            })
    })
}

fn zero_block() -> Arc<Vec<u8>> {
    Arc::new(vec![0u8; BLOCK])
}

/// Words the compressible writes are made of: a compressing volume then
/// stores fragments of many sizes (a few units to most of a block), which
/// straddle blocks and fill the holes whole blocks leave (decision 0070).
const WORDS: [&[u8]; 8] = [
    b"lamina ",
    b"segment ",
    b"fragment ",
    b"checkpoint ",
    b"replay ",
    b"cleaner ",
    b"parity ",
    b"flush ",
];

/// A write's bytes: runs of 512 equal bytes (compress to a few units),
/// words in a random order (compress to a fraction of a block), or random
/// bytes (do not compress: stored whole). Never all zeros.
fn write_data(rng: &mut SmallRng, length: usize) -> Vec<u8> {
    match rng.random_range(0..3) {
        0 => {
            let fill: u8 = rng.random();
            (0..length)
                .map(|index| fill.wrapping_add((index / 512) as u8) | 1)
                .collect()
        }
        1 => {
            let mut data = Vec::with_capacity(length + 16);
            while data.len() < length {
                data.extend_from_slice(WORDS[rng.random_range(0..WORDS.len())]);
                if rng.random_bool(0.2) {
                    data.push(rng.random::<u8>() | 1);
                }
            }
            data.truncate(length);
            data
        }
        _ => (0..length).map(|_| rng.random::<u8>() | 1).collect(),
    }
}

/// Limits for run `seed`. Every other pair of seeds splits relocations by
/// the age of their data, which the test pools are too small for by default
/// (docs/decisions/0010), so that both placements meet power cuts.
pub fn limits(seed: u64) -> PoolLimits {
    PoolLimits {
        // Every other run rewrites freed segments first, to meet reuse sooner.
        test_hooks: lamina_engine::TestHooks {
            reuse_freed_segments_first: seed % 2 == 1,
            // Background flushes and checkpoints are driven by the test itself.
            periodic_flush_and_checkpoint_off: true,
            // Two runs in three keep chains growing on these small pools
            // (the bytes rule would make most increments bases), so that
            // cuts and corruption meet increments and compactions.
            checkpoint_increments_whatever_their_bytes: !seed.is_multiple_of(3),
        },
        dirty_bytes_max: u64::MAX / 2,
        relocation_streams_by_age_segment_count_min: if (seed / 2).is_multiple_of(2) {
            0
        } else {
            u64::MAX
        },
        ..PoolLimits::default()
    }
}

pub async fn verify(pool: &Pool, shadows: &[ShadowVolume], seed: u64, phase: &str) {
    for shadow in shadows {
        let info = pool.volume_info(&shadow.name).expect("volume survives");
        assert_eq!(
            info.size_bytes,
            (shadow.blocks.len() * BLOCK) as u64,
            "seed {seed} {phase}: size"
        );
        let volume_id = pool.volume_id(&shadow.name).unwrap();
        let mut contents = vec![0u8; shadow.blocks.len() * BLOCK];
        pool.read(volume_id, 0, &mut contents)
            .await
            .unwrap_or_else(|error| panic!("seed {seed} {phase}: read failed: {error}"));
        for (block, candidates) in shadow.blocks.iter().enumerate() {
            let actual = &contents[block * BLOCK..(block + 1) * BLOCK];
            assert!(
                candidates
                    .iter()
                    .any(|candidate| candidate.as_slice() == actual),
                "seed {seed} {phase}: volume {} block {block} holds content that was never durable or written since",
                shadow.name
            );
        }
        for snapshot in &shadow.snapshots {
            let full_name = format!("{}@{}", shadow.name, snapshot.name);
            let view = pool
                .resolve_view(&full_name)
                .unwrap_or_else(|error| panic!("seed {seed} {phase}: {full_name}: {error}"));
            let mut contents = vec![0u8; snapshot.blocks.len() * BLOCK];
            pool.read_view(view, 0, &mut contents)
                .await
                .unwrap_or_else(|error| panic!("seed {seed} {phase}: read {full_name}: {error}"));
            for (block, expected) in snapshot.blocks.iter().enumerate() {
                assert!(
                    contents[block * BLOCK..(block + 1) * BLOCK] == expected[..],
                    "seed {seed} {phase}: snapshot {full_name} block {block} changed"
                );
            }
        }
        let snapshot_names: Vec<String> = pool
            .list_snapshots(Some(&shadow.name))
            .unwrap()
            .into_iter()
            .map(|info| info.name)
            .collect();
        let expected: Vec<String> = shadow
            .snapshots
            .iter()
            .map(|snapshot| snapshot.name.clone())
            .collect();
        assert_eq!(
            snapshot_names, expected,
            "seed {seed} {phase}: snapshots of {}",
            shadow.name
        );
    }
    let mut names: Vec<String> = pool
        .list_volumes()
        .into_iter()
        .map(|info| info.name)
        .collect();
    let mut expected: Vec<String> = shadows.iter().map(|shadow| shadow.name.clone()).collect();
    names.sort();
    expected.sort();
    assert_eq!(names, expected, "seed {seed} {phase}: volumes");
}

/// After recovery every block holds exactly one content: collapse to it.
async fn settle(pool: &Pool, shadows: &mut [ShadowVolume]) {
    for shadow in shadows.iter_mut() {
        let volume_id = pool.volume_id(&shadow.name).unwrap();
        for block in 0..shadow.blocks.len() {
            let mut contents = vec![0u8; BLOCK];
            pool.read(volume_id, (block * BLOCK) as u64, &mut contents)
                .await
                .unwrap();
            shadow.blocks[block] = vec![Arc::new(contents)];
        }
    }
}

pub async fn run_operations(
    pool: &Pool,
    shadows: &mut Vec<ShadowVolume>,
    rng: &mut SmallRng,
    count: usize,
    names_used: &mut usize,
) {
    for _ in 0..count {
        if rng.random_bool(0.08) {
            snapshot_operation(pool, shadows, rng, names_used).await;
            continue;
        }
        let shadow_index = rng.random_range(0..shadows.len());
        let shadow = &mut shadows[shadow_index];
        let volume_id = pool.volume_id(&shadow.name).unwrap();
        let block_count = shadow.blocks.len();
        match rng.random_range(0..100) {
            0..=44 => {
                // Aligned or unaligned write of up to 6 blocks.
                let aligned = rng.random_bool(0.6);
                let offset = if aligned {
                    rng.random_range(0..block_count) * BLOCK
                } else {
                    rng.random_range(0..block_count * BLOCK - 1)
                };
                let length_max = (block_count * BLOCK - offset).min(6 * BLOCK);
                let length = if aligned {
                    (rng.random_range(1..=6) * BLOCK).min(length_max)
                } else {
                    rng.random_range(1..=length_max)
                };
                if rng.random_bool(0.03) {
                    // Changes of codec while writing (issue 44).
                    let codec = ["off", "lz4", "zstd:1"][rng.random_range(0..3)];
                    pool.set_volume_compression(&shadow.name, codec.parse().unwrap())
                        .await
                        .expect("every pool takes a codec");
                }
                let data = write_data(rng, length);
                let fua = rng.random_bool(0.1);
                pool.write(volume_id, offset as u64, &data, fua)
                    .await
                    .expect("write");
                let first = offset / BLOCK;
                let last = (offset + length - 1) / BLOCK;
                for block in first..=last {
                    let mut contents = shadow.latest(block).as_ref().clone();
                    let block_start = block * BLOCK;
                    let start = offset.max(block_start);
                    let end = (offset + length).min(block_start + BLOCK);
                    contents[start - block_start..end - block_start]
                        .copy_from_slice(&data[start - offset..end - offset]);
                    shadow.write(block, contents);
                }
                if fua {
                    shadows.iter_mut().for_each(ShadowVolume::flushed);
                }
            }
            45..=59 => {
                pool.flush().await.expect("flush");
                shadows.iter_mut().for_each(ShadowVolume::flushed);
            }
            60..=71 => {
                let offset = rng.random_range(0..block_count * BLOCK - 1);
                let length = rng.random_range(1..=(block_count * BLOCK - offset).min(10 * BLOCK));
                let punch = rng.random_bool(0.7);
                if rng.random_bool(0.5) {
                    pool.trim(volume_id, offset as u64, length as u64, false)
                        .await
                        .expect("trim");
                } else {
                    pool.write_zeroes(volume_id, offset as u64, length as u64, false, punch)
                        .await
                        .expect("write zeroes");
                }
                for block in offset / BLOCK..=(offset + length - 1) / BLOCK {
                    let mut contents = shadow.latest(block).as_ref().clone();
                    let block_start = block * BLOCK;
                    let start = offset.max(block_start);
                    let end = (offset + length).min(block_start + BLOCK);
                    contents[start - block_start..end - block_start].fill(0);
                    shadow.write(block, contents);
                }
            }
            72..=79 => {
                // Resize (a control operation: durable, and flushes everything before it).
                let new_blocks = rng.random_range(8..=VOLUME_BLOCKS_MAX);
                let force = true;
                pool.resize_volume(&shadow.name, (new_blocks * BLOCK) as u64, force)
                    .await
                    .expect("resize");
                shadows.iter_mut().for_each(ShadowVolume::flushed);
                let shadow = &mut shadows[shadow_index];
                shadow.blocks.truncate(new_blocks);
                shadow.blocks.resize_with(new_blocks, || vec![zero_block()]);
            }
            80..=87 => {
                pool.checkpoint().await.expect("checkpoint");
                shadows.iter_mut().for_each(ShadowVolume::flushed);
            }
            88..=91 => {
                // The cleaner relocates live blocks (and in a two-tier pool
                // demotes them); contents must not change.
                pool.clean(4).await.expect("clean");
            }
            92..=93 => {
                // A tier policy change: durable, and decides what the cleaner
                // demotes and what reads promote from then on.
                let priorities = [
                    CachePriority::High,
                    CachePriority::Normal,
                    CachePriority::Low,
                    CachePriority::None,
                ];
                let pins = [Pin::Auto, Pin::Auto, Pin::Flash, Pin::Capacity];
                let policy = TierPolicy {
                    priority: priorities[rng.random_range(0..priorities.len())],
                    pin: pins[rng.random_range(0..pins.len())],
                };
                pool.set_volume_policy(&shadow.name, policy)
                    .await
                    .expect("set policy");
                shadows.iter_mut().for_each(ShadowVolume::flushed);
            }
            _ => {
                // Let background batch writes make progress before the next step.
                for _ in 0..rng.random_range(1..8) {
                    tokio::task::yield_now().await;
                }
            }
        }
    }
}

/// One snapshot or clone operation; each is a durable control operation, so
/// everything before it becomes durable too.
async fn snapshot_operation(
    pool: &Pool,
    shadows: &mut Vec<ShadowVolume>,
    rng: &mut SmallRng,
    names_used: &mut usize,
) {
    let index = rng.random_range(0..shadows.len());
    *names_used += 1;
    let fresh = format!("n{names_used}");
    match rng.random_range(0..5) {
        0 | 1 => {
            if shadows[index].snapshots.len() >= SNAPSHOTS_PER_VOLUME_MAX {
                return;
            }
            let name = shadows[index].name.clone();
            pool.create_snapshot(&name, &fresh)
                .await
                .expect("create snapshot");
            let blocks = shadows[index].current();
            shadows[index].snapshots.push(ShadowSnapshot {
                name: fresh,
                blocks,
            });
        }
        2 => {
            let shadow = &shadows[index];
            if shadow.snapshots.is_empty() {
                return;
            }
            let position = rng.random_range(0..shadow.snapshots.len());
            let snapshot = shadow.snapshots[position].name.clone();
            let volume = shadow.name.clone();
            let result = pool.delete_snapshot(&volume, &snapshot).await;
            if has_clones(shadows, &volume, Some(&snapshot)) {
                assert!(result.is_err(), "a snapshot with clones was deleted");
                return;
            }
            result.expect("delete snapshot");
            shadows[index].snapshots.remove(position);
        }
        3 => {
            let Some(newest) = shadows[index].snapshots.last() else {
                return;
            };
            let (volume, snapshot) = (shadows[index].name.clone(), newest.name.clone());
            let blocks = newest.blocks.clone();
            pool.rollback_snapshot(&volume, &snapshot)
                .await
                .expect("rollback");
            shadows[index].blocks = blocks.into_iter().map(|block| vec![block]).collect();
        }
        _ => {
            let shadow = &shadows[index];
            if shadows.len() >= VOLUMES_MAX || shadow.snapshots.is_empty() {
                // Delete a volume nothing depends on instead (never the last two).
                if shadows.len() > 2 && !has_clones(shadows, &shadow.name, None) {
                    let name = shadow.name.clone();
                    pool.delete_volume(&name).await.expect("delete volume");
                    shadows.remove(index);
                }
                return;
            }
            let position = rng.random_range(0..shadow.snapshots.len());
            let snapshot = &shadow.snapshots[position];
            let origin = (shadow.name.clone(), snapshot.name.clone());
            let blocks = snapshot
                .blocks
                .iter()
                .map(|block| vec![block.clone()])
                .collect();
            pool.clone_snapshot(&origin.0, &origin.1, &fresh)
                .await
                .expect("clone");
            shadows.push(ShadowVolume {
                name: fresh,
                blocks,
                snapshots: Vec::new(),
                origin: Some(origin),
            });
        }
    }
    shadows.iter_mut().for_each(ShadowVolume::flushed);
}

/// A snapshot creation (with the contents each block may have at that moment)
/// or deletion (no candidates) running when the power is cut.
pub struct PendingSnapshotOperation {
    volume_index: usize,
    snapshot: String,
    candidates: Option<Vec<Vec<Arc<Vec<u8>>>>>,
    task: tokio::task::JoinHandle<Result<(), lamina_engine::EngineError>>,
}

fn start_pending_snapshot_operation(
    pool: &Pool,
    shadows: &[ShadowVolume],
    rng: &mut SmallRng,
    cycle: u64,
) -> Option<PendingSnapshotOperation> {
    if !rng.random_bool(0.4) {
        return None;
    }
    let volume_index = rng.random_range(0..shadows.len());
    let shadow = &shadows[volume_index];
    let pool = pool.clone();
    let volume = shadow.name.clone();
    let fresh = format!("cut{cycle}");
    if rng.random_bool(0.6)
        && shadow.snapshots.len() < SNAPSHOTS_PER_VOLUME_MAX
        && !shadow
            .snapshots
            .iter()
            .any(|snapshot| snapshot.name == fresh)
    {
        let snapshot = fresh;
        let name = snapshot.clone();
        let task =
            tokio::spawn(async move { pool.create_snapshot(&volume, &name).await.map(|_| ()) });
        return Some(PendingSnapshotOperation {
            volume_index,
            snapshot,
            candidates: Some(shadow.blocks.clone()),
            task,
        });
    }
    let deletable: Vec<&ShadowSnapshot> = shadow
        .snapshots
        .iter()
        .filter(|snapshot| !has_clones(shadows, &shadow.name, Some(&snapshot.name)))
        .collect();
    if deletable.is_empty() {
        return None;
    }
    let snapshot = deletable[rng.random_range(0..deletable.len())].name.clone();
    let name = snapshot.clone();
    let task = tokio::spawn(async move { pool.delete_snapshot(&volume, &name).await });
    Some(PendingSnapshotOperation {
        volume_index,
        snapshot,
        candidates: None,
        task,
    })
}

/// A snapshot operation the power cut interrupted, and whether it had
/// returned success before the cut.
pub struct InterruptedSnapshotOperation {
    volume_index: usize,
    snapshot: String,
    candidates: Option<Vec<Vec<Arc<Vec<u8>>>>>,
    succeeded: bool,
}

impl PendingSnapshotOperation {
    /// What the operation had done when the power was cut.
    pub async fn interrupted(self) -> InterruptedSnapshotOperation {
        let finished = self.task.is_finished();
        let succeeded = finished && self.task.await.unwrap().is_ok();
        InterruptedSnapshotOperation {
            volume_index: self.volume_index,
            snapshot: self.snapshot,
            candidates: self.candidates,
            succeeded,
        }
    }
}

/// After recovery, an interrupted snapshot operation is either done or not done.
async fn settle_pending_snapshot(
    pool: &Pool,
    shadows: &mut [ShadowVolume],
    interrupted: InterruptedSnapshotOperation,
    seed: u64,
) {
    let InterruptedSnapshotOperation {
        volume_index,
        snapshot,
        candidates,
        succeeded,
    } = interrupted;
    let snapshot = snapshot.as_str();
    let shadow = &mut shadows[volume_index];
    let full_name = format!("{}@{snapshot}", shadow.name);
    let exists = pool.resolve_view(&full_name).is_ok();
    match candidates {
        Some(candidates) => {
            assert!(
                exists || !succeeded,
                "seed {seed}: {full_name} was created but is gone"
            );
            if !exists {
                return;
            }
            let view = pool.resolve_view(&full_name).unwrap();
            let mut blocks = Vec::new();
            for (block, possible) in candidates.iter().enumerate() {
                let mut contents = vec![0u8; BLOCK];
                pool.read_view(view, (block * BLOCK) as u64, &mut contents)
                    .await
                    .unwrap();
                assert!(
                    possible
                        .iter()
                        .any(|candidate| candidate.as_slice() == contents),
                    "seed {seed}: interrupted snapshot {full_name} block {block} holds content the volume never had"
                );
                blocks.push(Arc::new(contents));
            }
            shadow.snapshots.push(ShadowSnapshot {
                name: snapshot.to_string(),
                blocks,
            });
        }
        None => {
            assert!(
                !exists || !succeeded,
                "seed {seed}: {full_name} was deleted but is back"
            );
            if !exists {
                shadow
                    .snapshots
                    .retain(|candidate| candidate.name != snapshot);
            }
        }
    }
}

/// Creates the two volumes every run starts with, of random sizes, and their
/// shadows (all zeroes).
pub async fn create_volumes(pool: &Pool, rng: &mut SmallRng) -> Vec<ShadowVolume> {
    let mut shadows = Vec::new();
    for name in ["alpha", "beta"] {
        let blocks = rng.random_range(8..=VOLUME_BLOCKS_MAX);
        pool.create_volume(name, (blocks * BLOCK) as u64)
            .await
            .expect("create volume");
        // A codec per volume (issue 44): every pool takes one, on one
        // device, on arrays (decision 0072) and on two tiers (0074).
        let codec = ["off", "lz4", "zstd:1", "zstd:3"][rng.random_range(0..4)];
        pool.set_volume_compression(name, codec.parse().unwrap())
            .await
            .unwrap_or_else(|error| panic!("setting {codec} on {name}: {error}"));
        shadows.push(ShadowVolume {
            name: name.to_string(),
            blocks: vec![vec![zero_block()]; blocks],
            snapshots: Vec::new(),
            origin: None,
        });
    }
    shadows
}

/// The moments before a power cut: the pool must match its shadow; then
/// sometimes a snapshot is being created or deleted when the cut lands
/// (afterwards it must be complete or absent, and complete if it returned),
/// and background work runs a little.
pub async fn approach_the_cut(
    pool: &Pool,
    shadows: &[ShadowVolume],
    rng: &mut SmallRng,
    cycle: u64,
    seed: u64,
) -> Option<PendingSnapshotOperation> {
    verify(pool, shadows, seed, "before the cut").await;
    let pending = start_pending_snapshot_operation(pool, shadows, rng, cycle);
    for _ in 0..rng.random_range(0..12) {
        tokio::task::yield_now().await;
    }
    pending
}

/// After recovery: settles the interrupted snapshot operation, checks every
/// block against its candidates, and collapses each block to what it holds.
pub async fn check_recovered(
    pool: &Pool,
    shadows: &mut [ShadowVolume],
    interrupted: Option<InterruptedSnapshotOperation>,
    seed: u64,
) {
    if let Some(interrupted) = interrupted {
        settle_pending_snapshot(pool, shadows, interrupted, seed).await;
    }
    verify(pool, shadows, seed, "after recovery").await;
    settle(pool, shadows).await;
}

/// Seeds per run: `LAMINA_CRASH_RUNS`, 1000 by default.
pub fn crash_runs() -> u64 {
    environment_number("LAMINA_CRASH_RUNS", 1000)
}

/// The first seed: `LAMINA_CRASH_FIRST_SEED`, 0 by default.
pub fn first_seed() -> u64 {
    environment_number("LAMINA_CRASH_FIRST_SEED", 0)
}

fn environment_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}
