//! Space accounting of compressed volumes (issue 44): per volume, logical
//! (`allocated_bytes`) and stored bytes and their ratio; per pool, the
//! logical bytes of every distinct live location (kept as a running count,
//! not a map walk) and the stored bytes of the segment table. The figures
//! must be exact after writes, overwrites, trims, snapshots, clones,
//! cleaning, a crash (replay) and a clean restart: the pool's logical bytes
//! are checked against a model of which write each map holds, and the
//! stored bytes against identities between the volumes' figures. The data
//! is this machine's files (it compresses) and random bytes (it stays whole).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use lamina_device::{BlockDevice, ConcatenatedDevice, MemoryDevice};
use lamina_engine::{Codec, Pool, PoolLimits, TestHooks, VolumeInfo};
use rand::{Rng, SeedableRng, rngs::SmallRng};

mod common;
use common::pools::options;

const BLOCK: usize = 4096;
const SEGMENT_BYTES: u64 = 256 << 10;
const DEVICE_BYTES: u64 = (4 << 20) + 128 * SEGMENT_BYTES;
const VOLUME_BLOCKS: usize = 512;
/// Bytes of one unit the segment table counts in.
const UNIT_BYTES: u64 = 16;

fn limits() -> PoolLimits {
    PoolLimits {
        memory_cache_bytes: 0,
        test_hooks: TestHooks {
            reuse_freed_segments_first: true,
            periodic_flush_and_checkpoint_off: true,
            checkpoint_increments_whatever_their_bytes: false,
        },
        dirty_bytes_max: u64::MAX / 2,
        ..PoolLimits::default()
    }
}

/// The bytes of this machine's Perl modules, in directory order, from
/// block `skip_blocks` on: text that compresses.
fn real_blocks(count: usize, skip_blocks: usize) -> Vec<Vec<u8>> {
    let mut paths = walk(std::path::Path::new("/usr/share/perl5"));
    paths.extend(walk(std::path::Path::new("/usr/share/perl")));
    paths.sort();
    let mut bytes = Vec::new();
    for path in paths {
        if bytes.len() >= (skip_blocks + count) * BLOCK {
            break;
        }
        if let Ok(contents) = std::fs::read(&path) {
            bytes.extend_from_slice(&contents);
        }
    }
    let blocks: Vec<Vec<u8>> = bytes
        .chunks_exact(BLOCK)
        .skip(skip_blocks)
        .take(count)
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(blocks.len(), count, "not enough files on this machine");
    blocks
}

fn random_blocks(count: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..count)
        .map(|_| {
            let mut block = vec![0u8; BLOCK];
            rng.fill(&mut block[..]);
            block
        })
        .collect()
}

fn walk(directory: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(directory) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => found.extend(walk(&path)),
            Ok(kind) if kind.is_file() => found.push(path),
            _ => {}
        }
    }
    found
}

/// Which write each map holds at each block: a write is one location, so
/// the distinct writes all maps hold are the pool's live locations.
#[derive(Default)]
struct Model {
    maps: BTreeMap<String, Vec<Option<u64>>>,
    next_write: u64,
}

impl Model {
    fn create(&mut self, name: &str) {
        self.maps
            .insert(name.to_string(), vec![None; VOLUME_BLOCKS]);
    }

    fn copy(&mut self, from: &str, to: &str) {
        let map = self.maps[from].clone();
        self.maps.insert(to.to_string(), map);
    }

    fn remove(&mut self, name: &str) {
        self.maps.remove(name).expect("a map of the model");
    }

    fn write(&mut self, name: &str, block: usize) {
        let write = self.next_write;
        self.next_write += 1;
        self.maps.get_mut(name).expect("a map of the model")[block] = Some(write);
    }

    fn trim(&mut self, name: &str, blocks: std::ops::Range<usize>) {
        for entry in &mut self.maps.get_mut(name).expect("a map of the model")[blocks] {
            *entry = None;
        }
    }

    fn logical_bytes(&self) -> u64 {
        let distinct: HashSet<u64> = self.maps.values().flatten().flatten().copied().collect();
        distinct.len() as u64 * BLOCK as u64
    }
}

/// The pool, its model and the device under it.
struct Harness {
    device: Arc<dyn BlockDevice>,
    pool: Pool,
    model: Model,
}

impl Harness {
    async fn write(&mut self, volume: &str, first_block: usize, blocks: &[Vec<u8>]) {
        let volume_id = self.volume(volume).volume_id;
        for (index, block) in blocks.iter().enumerate() {
            let at = first_block + index;
            self.pool
                .write(volume_id, (at * BLOCK) as u64, block, false)
                .await
                .unwrap();
            self.model.write(volume, at);
        }
    }

    async fn trim(&mut self, volume: &str, blocks: std::ops::Range<usize>) {
        let volume_id = self.volume(volume).volume_id;
        let offset = (blocks.start * BLOCK) as u64;
        let length = (blocks.len() * BLOCK) as u64;
        self.pool
            .trim(volume_id, offset, length, false)
            .await
            .unwrap();
        self.model.trim(volume, blocks);
    }

    fn volume(&self, name: &str) -> VolumeInfo {
        self.pool.volume_info(name).unwrap()
    }

    /// The segment table's live units, in bytes.
    fn live_unit_bytes(&self) -> u64 {
        self.pool
            .segment_table()
            .segments
            .iter()
            .map(|segment| u64::from(segment.live_units))
            .sum::<u64>()
            * UNIT_BYTES
    }

    /// The pool's figures agree with the model and the segment table, and
    /// every volume's with its own definition.
    fn check(&self, when: &str) {
        let status = self.pool.status();
        assert_eq!(
            status.logical_bytes,
            self.model.logical_bytes(),
            "{when}: the pool's logical bytes"
        );
        assert_eq!(
            status.stored_bytes,
            self.live_unit_bytes(),
            "{when}: the pool's stored bytes"
        );
        let expected_ratio = match status.stored_bytes {
            0 => 1.0,
            stored => status.logical_bytes as f64 / stored as f64,
        };
        assert_eq!(status.compress_ratio, expected_ratio, "{when}: pool ratio");
        for volume in self.pool.list_volumes() {
            let mapped = self.model.maps[&volume.name].iter().flatten().count();
            assert_eq!(
                volume.allocated_bytes,
                (mapped * BLOCK) as u64,
                "{when}: {} allocated",
                volume.name
            );
            assert!(
                volume.unique_stored_bytes <= volume.stored_bytes
                    && volume.stored_bytes <= volume.allocated_bytes,
                "{when}: {volume:?}"
            );
            let stats = self.pool.volume_tier_stats(&volume.name).unwrap();
            assert_eq!(
                (stats.logical_bytes, stats.stored_bytes),
                (volume.allocated_bytes, volume.stored_bytes),
                "{when}: volume stats of {}",
                volume.name
            );
            assert_eq!(stats.compress_ratio, volume.compress_ratio);
        }
    }

    /// A crash after a flush: everything replays, the counts come back.
    async fn crash(&mut self) {
        self.pool.flush().await.unwrap();
        self.pool.abandon();
        self.pool = Pool::open(self.device.clone(), limits()).await.unwrap();
    }

    async fn restart(&mut self) {
        self.pool.checkpoint().await.unwrap();
        self.pool.close().await.unwrap();
        self.pool = Pool::open(self.device.clone(), limits()).await.unwrap();
    }
}

async fn new_harness() -> Harness {
    let device: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = Pool::create(device.clone(), options(SEGMENT_BYTES, None), limits())
        .await
        .unwrap();
    let size_bytes = (VOLUME_BLOCKS * BLOCK) as u64;
    let mut model = Model::default();
    for (name, codec) in [("data", "lz4"), ("random", "lz4"), ("plain", "off")] {
        let codec: Codec = codec.parse().unwrap();
        pool.create_volume_with_compression(name, size_bytes, codec)
            .await
            .unwrap();
        model.create(name);
    }
    Harness {
        device,
        pool,
        model,
    }
}

#[tokio::test]
async fn logical_and_stored_bytes_stay_exact_through_every_operation() {
    let mut harness = new_harness().await;
    let text = real_blocks(VOLUME_BLOCKS, 0);
    harness.write("data", 0, &text).await;
    harness.write("random", 0, &random_blocks(64, 1)).await;
    harness.write("plain", 0, &text[..64]).await;
    // The same blocks again before a flush: the open batch's copies die.
    harness.write("data", 0, &text[..32]).await;
    harness.check("after the writes");
    let data = harness.volume("data");
    assert!(data.compress_ratio > 1.2, "{data:?}");
    assert_eq!(data.unique_stored_bytes, data.stored_bytes);
    for name in ["random", "plain"] {
        let volume = harness.volume(name);
        assert_eq!(volume.stored_bytes, 64 * BLOCK as u64, "{volume:?}");
        assert_eq!(volume.compress_ratio, 1.0, "{volume:?}");
    }
    let stored_sum = |harness: &Harness| -> u64 {
        ["data", "random", "plain"]
            .iter()
            .map(|name| harness.volume(name).stored_bytes)
            .sum()
    };
    assert_eq!(harness.pool.status().stored_bytes, stored_sum(&harness));

    // A snapshot, then half of the volume overwritten and a quarter trimmed:
    // the snapshot keeps what the volume dropped.
    let at_snapshot = harness.volume("data").stored_bytes;
    harness.pool.create_snapshot("data", "s1").await.unwrap();
    harness.model.copy("data", "data@s1");
    let other = real_blocks(VOLUME_BLOCKS / 2, VOLUME_BLOCKS);
    harness.write("data", 0, &other).await;
    harness
        .trim("data", VOLUME_BLOCKS * 3 / 4..VOLUME_BLOCKS)
        .await;
    harness.check("after a snapshot, overwrites and a trim");
    let snapshot_only = |harness: &Harness| {
        let data = harness.volume("data");
        at_snapshot - (data.stored_bytes - data.unique_stored_bytes)
    };
    assert_eq!(
        harness.pool.status().stored_bytes,
        stored_sum(&harness) + snapshot_only(&harness),
        "the pool stores the volumes' blocks and what only the snapshot holds"
    );

    // A clone shares the snapshot's blocks: the pool's figures do not move.
    let before_clone = harness.pool.status();
    harness
        .pool
        .clone_snapshot("data", "s1", "copy")
        .await
        .unwrap();
    harness.model.copy("data@s1", "copy");
    harness.check("after a clone");
    assert_eq!(harness.volume("copy").stored_bytes, at_snapshot);
    assert_eq!(
        (before_clone.logical_bytes, before_clone.stored_bytes),
        (
            harness.pool.status().logical_bytes,
            harness.pool.status().stored_bytes
        )
    );
    harness.write("copy", 8, &random_blocks(8, 2)).await;
    harness.check("after writes to the clone");

    // The cleaner moves live locations: nothing changes.
    harness.pool.flush().await.unwrap();
    let before_cleaning = harness.pool.status();
    let moved = harness.pool.clean(64).await.unwrap();
    assert!(moved > 0, "the cleaner took no victim");
    harness.pool.flush().await.unwrap();
    harness.check("after cleaning");
    assert_eq!(
        harness.pool.status().logical_bytes,
        before_cleaning.logical_bytes
    );

    // A crash and a clean restart rebuild the count from the maps.
    let before_crash = harness.pool.status();
    harness.crash().await;
    harness.check("after replay");
    assert_eq!(
        (before_crash.logical_bytes, before_crash.stored_bytes),
        (
            harness.pool.status().logical_bytes,
            harness.pool.status().stored_bytes
        )
    );
    harness.write("data", 100, &text[200..240]).await;
    harness.restart().await;
    harness.check("after a clean restart");

    // A rollback drops what the volume wrote since the snapshot, then
    // new writes diverge again.
    let rolled_back = harness.pool.rollback_snapshot("data", "s1").await.unwrap();
    harness.model.copy("data@s1", "data");
    assert_eq!(rolled_back.stored_bytes, at_snapshot);
    assert_eq!(rolled_back.unique_stored_bytes, 0);
    harness.check("after a rollback");
    harness.write("data", 300, &text[..16]).await;
    harness.check("after writes since the rollback");

    // Deleting the clone and the snapshot, then trimming everything.
    harness.pool.delete_volume("copy").await.unwrap();
    harness.model.remove("copy");
    harness.pool.delete_snapshot("data", "s1").await.unwrap();
    harness.model.remove("data@s1");
    harness.check("after deleting the clone and the snapshot");
    assert_eq!(harness.pool.status().stored_bytes, stored_sum(&harness));
    for name in ["data", "random", "plain"] {
        harness.trim(name, 0..VOLUME_BLOCKS).await;
    }
    harness.check("after trimming everything");
    let status = harness.pool.status();
    assert_eq!(
        (
            status.logical_bytes,
            status.stored_bytes,
            status.compress_ratio
        ),
        (0, 0, 1.0)
    );
    harness.crash().await;
    harness.check("empty, after replay");
    harness.pool.close().await.unwrap();
}

/// 4 MiB of metadata, then 48 segments (12 MiB) of flash, and 48 MiB of
/// capacity behind it: a two-tier pool (which stores every block whole).
const FLASH_BYTES: u64 = (4 << 20) + 48 * SEGMENT_BYTES;
const CAPACITY_BYTES: u64 = (1 << 20) + 192 * SEGMENT_BYTES;

#[tokio::test]
async fn the_pool_count_stays_exact_when_blocks_move_between_tiers() {
    let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let capacity = Arc::new(MemoryDevice::new(CAPACITY_BYTES));
    let device: Arc<dyn BlockDevice> = Arc::new(ConcatenatedDevice::new(flash, capacity));
    let pool = Pool::create(
        device.clone(),
        options(SEGMENT_BYTES, Some(FLASH_BYTES)),
        limits(),
    )
    .await
    .unwrap();
    pool.create_volume("data", (VOLUME_BLOCKS * BLOCK) as u64)
        .await
        .unwrap();
    let mut harness = Harness {
        device,
        pool,
        model: Model::default(),
    };
    harness.model.create("data");
    // Twice the flash tier in all: the cleaner demotes to make room.
    for round in 0..5 {
        harness
            .write("data", 0, &random_blocks(VOLUME_BLOCKS, 10 + round))
            .await;
        if round == 1 {
            harness.pool.create_snapshot("data", "s1").await.unwrap();
            harness.model.copy("data", "data@s1");
        }
        harness.pool.flush().await.unwrap();
        harness.pool.clean(48).await.unwrap();
        harness.check("while demoting");
    }
    let status = harness.pool.status();
    assert!(status.demoted_blocks > 0, "{status:?}");
    assert_eq!(status.logical_bytes, status.stored_bytes);
    harness.crash().await;
    harness.check("two tiers, after replay");
    harness.restart().await;
    harness.check("two tiers, after a restart");
    harness.pool.close().await.unwrap();
}
