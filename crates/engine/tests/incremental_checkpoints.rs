//! Incremental checkpoints (format version 7, docs/decisions/0026): an
//! increment holds only the changed chunks; a pool reopened from a chain of
//! increments (with snapshots, clones, rollbacks and deletions between them)
//! reads back what was written; a corrupt newest increment falls back to the
//! older slot and the log; a corrupt base that both slots need refuses the
//! open; power cuts right after segments were opened since an increment
//! lose nothing flushed; and a pool written by the version 6 binary opens,
//! is upgraded and is used.

// Test code keeps `as` for small sizes and byte patterns.
#![allow(clippy::cast_possible_truncation)]

use std::io::Read;
use std::sync::Arc;

use lamina_device::{BlockDevice, FaultyDevice, MemoryDevice, PowerCutStyle};
use lamina_engine::log::FORMAT_VERSION;
use lamina_engine::log::checkpoint::{CHECKPOINT_INCREMENTS_MAX, Slot};
use lamina_engine::log::superblock::Superblock;
use lamina_engine::{Pool, PoolOptions};

mod common;
use common::blocks::block_contents;
use common::pools::manual_checkpoint_limits;

use common::{corrupt_checkpoint_body, corrupt_newest_checkpoint_body, newest_slot};

const BLOCK: usize = 4096;
const SEGMENT_BYTES: u64 = 256 << 10;
const DEVICE_BYTES: u64 = (4 << 20) + 256 * SEGMENT_BYTES;

async fn new_pool(memory: &Arc<MemoryDevice>) -> Pool {
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        force: false,
        flash_region_bytes: None,
        ..PoolOptions::default()
    };
    Pool::create(memory.clone(), options, manual_checkpoint_limits(true))
        .await
        .unwrap()
}

async fn open(memory: &Arc<MemoryDevice>) -> Pool {
    Pool::open(
        memory.clone() as Arc<dyn BlockDevice>,
        manual_checkpoint_limits(true),
    )
    .await
    .unwrap()
}

async fn write_blocks(pool: &Pool, volume: u32, blocks: impl Iterator<Item = u64>, generation: u8) {
    for block in blocks {
        pool.write(
            volume,
            block * BLOCK as u64,
            &block_contents(block, generation),
            false,
        )
        .await
        .unwrap();
    }
}

/// Checks that `view` holds `expected[block]` (a generation; 0: never written).
async fn check_view(pool: &Pool, view: &str, expected: &[u8]) {
    let view = pool.resolve_view(view).unwrap();
    let mut buffer = vec![0u8; BLOCK];
    for (block, generation) in expected.iter().enumerate() {
        pool.read_view(view, (block * BLOCK) as u64, &mut buffer)
            .await
            .unwrap();
        let wanted = if *generation == 0 {
            vec![0u8; BLOCK]
        } else {
            block_contents(block as u64, *generation)
        };
        assert!(
            buffer == wanted,
            "{view:?} block {block}: expected generation {generation}"
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_increment_holds_the_changed_chunks_and_a_chain_reopens_exactly() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = new_pool(&memory).await;
    let volume = pool.create_volume("v", 64 << 20).await.unwrap().volume_id;
    // 8192 blocks: 16 chunks of 512.
    let mut expected = vec![0u8; 8192];
    write_blocks(&pool, volume, 0..8192, 1).await;
    expected.fill(1);
    pool.checkpoint().await.unwrap();
    let (_, first) = newest_slot(&memory);
    // One changed block: one chunk.
    write_blocks(&pool, volume, 700..701, 2).await;
    expected[700] = 2;
    pool.checkpoint().await.unwrap();
    let (_, increment) = newest_slot(&memory);
    let base = increment.chain()[0].clone();
    assert_eq!(increment.earlier_links.len(), first.earlier_links.len() + 1);
    assert!(
        increment.body_bytes * 4 < base.body_bytes,
        "increment {} bytes, base {} bytes",
        increment.body_bytes,
        base.body_bytes
    );
    // Snapshot, write, clone, rollback, delete between increments.
    pool.create_snapshot("v", "s1").await.unwrap();
    let snapshot_expected = expected.clone();
    write_blocks(&pool, volume, 1000..1100, 3).await;
    expected[1000..1100].fill(3);
    pool.checkpoint().await.unwrap();
    let clone = pool.clone_snapshot("v", "s1", "c").await.unwrap().volume_id;
    let mut clone_expected = snapshot_expected.clone();
    write_blocks(&pool, clone, 5000..5010, 4).await;
    clone_expected[5000..5010].fill(4);
    pool.trim(volume, 0, 512 * BLOCK as u64, false)
        .await
        .unwrap();
    expected[0..512].fill(0);
    pool.checkpoint().await.unwrap();
    pool.create_snapshot("v", "s2").await.unwrap();
    write_blocks(&pool, volume, 3000..3001, 5).await;
    pool.rollback_snapshot("v", "s2").await.unwrap();
    let scratch = pool
        .create_volume("scratch", 4 << 20)
        .await
        .unwrap()
        .volume_id;
    write_blocks(&pool, scratch, 0..10, 6).await;
    pool.delete_volume("scratch").await.unwrap();
    pool.flush().await.unwrap();
    pool.checkpoint().await.unwrap();
    let (_, newest) = newest_slot(&memory);
    assert!(
        !newest.earlier_links.is_empty(),
        "the last checkpoint is an increment"
    );
    pool.abandon();
    drop(pool);

    let pool = open(&memory).await;
    check_view(&pool, "v", &expected).await;
    check_view(&pool, "v@s1", &snapshot_expected).await;
    check_view(&pool, "v@s2", &expected).await;
    check_view(&pool, "c", &clone_expected).await;
    assert!(pool.resolve_view("scratch").is_err());
    // The first checkpoint after open is a base; the next ones increments,
    // until the chain is full.
    pool.checkpoint().await.unwrap();
    assert!(newest_slot(&memory).1.earlier_links.is_empty());
    for increment in 1..=CHECKPOINT_INCREMENTS_MAX {
        write_blocks(&pool, volume, 2000..2001, 7).await;
        pool.checkpoint().await.unwrap();
        assert_eq!(newest_slot(&memory).1.earlier_links.len(), increment);
    }
    pool.checkpoint().await.unwrap();
    assert!(
        newest_slot(&memory).1.earlier_links.is_empty(),
        "a full chain is compacted into a new base"
    );
    pool.close().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_corrupt_newest_increment_falls_back_to_the_older_slot_and_the_log() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = new_pool(&memory).await;
    let volume = pool.create_volume("v", 16 << 20).await.unwrap().volume_id;
    // Enough mappings that increments are much smaller than the base.
    write_blocks(&pool, volume, 0..4096, 1).await;
    pool.checkpoint().await.unwrap();
    write_blocks(&pool, volume, 10..20, 2).await;
    pool.checkpoint().await.unwrap();
    // Durable but only in the newest increment and the log.
    write_blocks(&pool, volume, 20..30, 3).await;
    pool.flush().await.unwrap();
    pool.checkpoint().await.unwrap();
    pool.abandon();
    drop(pool);
    assert!(corrupt_newest_checkpoint_body(&memory), "an increment");
    let pool = open(&memory).await;
    let mut expected = vec![1u8; 4096];
    expected[10..20].fill(2);
    expected[20..30].fill(3);
    check_view(&pool, "v", &expected).await;
    pool.close().await.unwrap();
}

/// Power cuts right after segments were opened since an increment (flushed
/// writes in them, unflushed ones in flight), half with the newest increment
/// corrupt: recovery finds those segments through the segment openings
/// record (format version 8), from the increment or from the older slot.
#[tokio::test(flavor = "current_thread")]
async fn power_cuts_after_segments_opened_since_an_increment_never_lose_flushed_data() {
    for seed in 0..30u64 {
        let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
        let faulty = Arc::new(FaultyDevice::new(memory.clone(), seed));
        let options = PoolOptions {
            segment_size_bytes: SEGMENT_BYTES,
            ..PoolOptions::default()
        };
        let pool = Pool::create(faulty.clone(), options, manual_checkpoint_limits(true))
            .await
            .unwrap();
        let volume = pool.create_volume("v", 16 << 20).await.unwrap().volume_id;
        write_blocks(&pool, volume, 0..4096, 1).await;
        pool.checkpoint().await.unwrap();
        write_blocks(&pool, volume, 10..20, 2).await;
        pool.checkpoint().await.unwrap();
        assert!(
            !newest_slot(&memory).1.earlier_links.is_empty(),
            "an increment"
        );
        // New segments (64 blocks each) since the increment, flushed.
        let flushed_end = 1000 + 100 + seed * 7;
        write_blocks(&pool, volume, 1000..flushed_end, 3).await;
        pool.flush().await.unwrap();
        let unflushed = {
            let pool = pool.clone();
            tokio::spawn(async move { write_blocks(&pool, volume, 2000..2100, 4).await })
        };
        for _ in 0..seed % 6 {
            tokio::task::yield_now().await;
        }
        faulty.power_cut(PowerCutStyle::Random).await.unwrap();
        unflushed.abort();
        let _ = unflushed.await;
        pool.abandon();
        drop(pool);
        if seed % 2 == 1 {
            assert!(corrupt_newest_checkpoint_body(&memory), "an increment");
        }
        let pool = open(&memory).await;
        let mut expected = vec![1u8; 4096];
        expected[10..20].fill(2);
        expected[1000..flushed_end as usize].fill(3);
        let view = pool.resolve_view("v").unwrap();
        let mut buffer = vec![0u8; BLOCK];
        for (block, generation) in expected.iter().enumerate() {
            pool.read_view(view, (block * BLOCK) as u64, &mut buffer)
                .await
                .unwrap();
            // The unflushed writes may or may not have survived, each whole.
            let survived =
                (2000..2100).contains(&block) && buffer == block_contents(block as u64, 4);
            assert!(
                survived || buffer == block_contents(block as u64, *generation),
                "seed {seed}: block {block} is not generation {generation}"
            );
        }
        pool.close().await.unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_corrupt_base_both_slots_need_refuses_the_open() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = new_pool(&memory).await;
    let volume = pool.create_volume("v", 16 << 20).await.unwrap().volume_id;
    // Enough mappings that increments are much smaller than the base.
    write_blocks(&pool, volume, 0..4096, 1).await;
    pool.checkpoint().await.unwrap();
    write_blocks(&pool, volume, 0..1, 2).await;
    pool.checkpoint().await.unwrap();
    write_blocks(&pool, volume, 1..2, 2).await;
    pool.checkpoint().await.unwrap();
    pool.abandon();
    drop(pool);
    let (_, slot) = newest_slot(&memory);
    assert!(slot.earlier_links.len() >= 2, "both slots share the base");
    corrupt_checkpoint_body(&memory, slot.earlier_links[0].checkpoint_sequence);
    let error = Pool::open(
        memory.clone() as Arc<dyn BlockDevice>,
        manual_checkpoint_limits(true),
    )
    .await
    .err()
    .expect("a corrupt shared base refuses the open");
    let message = error.to_string();
    assert!(
        message.contains("neither checkpoint slot holds a valid checkpoint")
            && message.contains("no older state can be recovered"),
        "{message}"
    );
}

/// The image: `lamina pool create --flash pool.img:64M --segment-size 1M`
/// by the version 6 binary (commit c5c3faf), volume `vol` (16 MiB): 8 MiB of
/// 0x11, snapshot `vol@first`, 2 MiB of 0x22 at 2 MiB, a clean stop; then
/// 1 MiB of 0x33 at 6 MiB, flushed, and the daemon killed (a log tail to
/// replay).
fn version_6_image() -> Vec<u8> {
    let packed = include_bytes!("data/pool-format-6.img.gz");
    let mut image = Vec::new();
    flate2::read::GzDecoder::new(&packed[..])
        .read_to_end(&mut image)
        .unwrap();
    image
}

fn pattern_check(buffer: &[u8], byte: u8, what: &str) {
    assert!(
        buffer.iter().all(|found| *found == byte),
        "{what}: expected {byte:#x}"
    );
}

async fn check_version_6_contents(pool: &Pool) {
    const MIB: usize = 1 << 20;
    let mut buffer = vec![0u8; MIB];
    let live = pool.resolve_view("vol").unwrap();
    let expected = [0x11, 0x11, 0x22, 0x22, 0x11, 0x11, 0x33, 0x11, 0];
    for (mebibyte, byte) in expected.iter().enumerate() {
        pool.read_view(live, (mebibyte * MIB) as u64, &mut buffer)
            .await
            .unwrap();
        pattern_check(&buffer, *byte, &format!("vol MiB {mebibyte}"));
    }
    let snapshot = pool.resolve_view("vol@first").unwrap();
    for mebibyte in 0..10 {
        pool.read_view(snapshot, (mebibyte * MIB) as u64, &mut buffer)
            .await
            .unwrap();
        let byte = if mebibyte < 8 { 0x11 } else { 0 };
        pattern_check(&buffer, byte, &format!("vol@first MiB {mebibyte}"));
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_version_6_pool_opens_is_upgraded_and_used() {
    let image = version_6_image();
    let read_version = |memory: &MemoryDevice| {
        let mut bytes = vec![0u8; BLOCK];
        memory.read_sync(0, &mut bytes);
        Superblock::decode(&bytes).unwrap().0
    };
    let memory = Arc::new(MemoryDevice::new(image.len() as u64));
    memory.write_sync(0, &image);
    assert_eq!(read_version(&memory), 6, "the image is version 6");
    let pool = open(&memory).await;
    check_version_6_contents(&pool).await;
    // Upgraded at open: the superblock and both slots are this version now.
    assert_eq!(read_version(&memory), FORMAT_VERSION);
    for slot_block in lamina_engine::log::geometry::CHECKPOINT_SLOT_BLOCKS {
        let mut bytes = vec![0u8; BLOCK];
        memory.read_sync(slot_block * BLOCK as u64, &mut bytes);
        let (version, _) = lamina_engine::log::frame::peek_header(
            lamina_engine::log::checkpoint::SLOT_MAGIC,
            &bytes,
        )
        .unwrap();
        assert_eq!(version, FORMAT_VERSION);
        Slot::decode(&bytes).unwrap();
    }
    // Used: writes and increments on the upgraded pool, then a crash.
    let volume = pool.resolve_view("vol").unwrap().volume_id();
    pool.write(volume, 9 << 20, &vec![0x44; 1 << 20], false)
        .await
        .unwrap();
    pool.checkpoint().await.unwrap();
    assert!(!newest_slot(&memory).1.earlier_links.is_empty());
    pool.flush().await.unwrap();
    pool.abandon();
    drop(pool);
    let pool = open(&memory).await;
    check_version_6_contents(&pool).await;
    let mut buffer = vec![0u8; 1 << 20];
    pool.read(volume, 9 << 20, &mut buffer).await.unwrap();
    pattern_check(&buffer, 0x44, "vol MiB 9");
    pool.close().await.unwrap();
}
