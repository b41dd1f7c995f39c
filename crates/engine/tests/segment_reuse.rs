//! When a dead segment may be rewritten (docs/decisions/0006-segment-reuse.md):
//! only once both kept checkpoints cover every batch written into it, and the
//! batches that killed its blocks are durable. Every test here makes freed
//! segments the next ones taken (`TestHooks::reuse_freed_segments_first`), so that a
//! segment freed too early is rewritten at once instead of after the
//! checkpoints that would have made its reuse safe anyway.
//!
//! - A trim whose record and trimmed data sit in segments that died must be
//!   replayed when recovery falls back to the older checkpoint.
//! - A block the cleaner relocated out of a victim written after the older (or
//!   the newest) checkpoint must survive the victim's reuse: replay needs the
//!   victim's summaries to map the block before the relocation moves it
//!   (condition a).
//! - A segment whose blocks were overwritten by batches not yet durable must not
//!   be rewritten: a power cut may keep the rewrite and lose the overwrites, and
//!   the recovered map would point into the rewritten segment (condition b).

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::sync::Arc;

use lamina_device::{BlockDevice, MemoryDevice};
mod common;
use common::blocks::{block_contents, write_blocks};
use common::pools::{manual_checkpoint_limits, options};
use common::read_gate::start_held_read;

use common::{InstrumentedDevice, corrupt_newest_checkpoint_slot};
use lamina_device::{FaultyDevice, PowerCutStyle};
use lamina_engine::{Pool, PoolLimits, PoolOptions};

const BLOCK: usize = 4096;
const SEGMENT_BYTES: u64 = 64 << 10;
const DEVICE_BYTES: u64 = (4 << 20) + 48 * SEGMENT_BYTES;

fn limits() -> PoolLimits {
    PoolLimits {
        // No background cleaning: the test places every segment itself.
        cleaner_relocation_blocks_per_client_block_max: 0.0,
        ..manual_checkpoint_limits(true)
    }
}

#[tokio::test(flavor = "current_thread")]
async fn dead_segments_wait_for_both_checkpoints_before_reuse() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        force: false,
        flash_region_bytes: None,
        ..PoolOptions::default()
    };
    let pool = Pool::create(memory.clone(), options, limits())
        .await
        .unwrap();
    let volume = pool.create_volume("v", 16 << 20).await.unwrap().volume_id;

    // Blocks 0..40 in their own segments, covered by both checkpoints.
    write_blocks(&pool, volume, 0..40, 1).await;
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    // Trim them; the trim record shares its segment with filler data, which is
    // then overwritten, so the segments of the data and of the trim all die.
    pool.trim(volume, 0, 40 * BLOCK as u64, false)
        .await
        .unwrap();
    write_blocks(&pool, volume, 100..160, 2).await;
    write_blocks(&pool, volume, 100..160, 3).await;
    pool.flush().await.unwrap();
    // One checkpoint: only the newest checkpoint covers the deaths now.
    pool.checkpoint().await.unwrap();
    // Use every segment clients may take, so that any segment freed too early
    // is rewritten.
    let status = pool.status();
    let data_blocks_per_segment = SEGMENT_BYTES as usize / BLOCK - 2;
    let fresh = (status.free_bytes / SEGMENT_BYTES) as usize * data_blocks_per_segment;
    write_blocks(&pool, volume, 1000..1000 + fresh as u64, 4).await;
    // Overwrite half of it and clean: the cleaner may take segments clients may
    // not, which reaches the end of the free list, where freed segments wait.
    write_blocks(&pool, volume, 1000..1000 + fresh as u64 / 2, 5).await;
    pool.clean(64).await.unwrap();
    pool.flush().await.unwrap();
    pool.abandon();
    drop(pool);

    // Recovery must fall back to the older checkpoint and replay the trim.
    corrupt_newest_checkpoint_slot(&memory);
    let pool = Pool::open(memory.clone() as Arc<dyn BlockDevice>, limits())
        .await
        .unwrap();
    let mut buffer = vec![0u8; BLOCK];
    for block in 0..40u64 {
        pool.read(volume, block * BLOCK as u64, &mut buffer)
            .await
            .unwrap_or_else(|error| panic!("trimmed block {block}: {error}"));
        assert!(
            buffer.iter().all(|byte| *byte == 0),
            "trimmed block {block} came back"
        );
    }
    for block in (100..160).chain(1000..1000 + fresh as u64) {
        pool.read(volume, block * BLOCK as u64, &mut buffer)
            .await
            .unwrap();
        let generation = match block {
            ..1000 => 3,
            _ if block < 1000 + fresh as u64 / 2 => 5,
            _ => 4,
        };
        assert!(buffer == block_contents(block, generation), "block {block}");
    }
    pool.close().await.unwrap();
}

/// Data blocks a client segment holds when written block by block: one batch of
/// 15 behind its summary.
const CLIENT_BLOCKS_PER_SEGMENT: u64 = SEGMENT_BYTES / BLOCK as u64 - 1;

async fn read_block(pool: &Pool, volume: u32, block: u64) -> Vec<u8> {
    let mut buffer = vec![0u8; BLOCK];
    pool.read(volume, block * BLOCK as u64, &mut buffer)
        .await
        .unwrap_or_else(|error| panic!("block {block}: {error}"));
    buffer
}

/// A victim segment S holds one live block (P) among overwritten ones; the
/// cleaner relocates P, S dies, its death is flushed, and clients then write a
/// segment's worth of new blocks, into S if S was freed.
/// After a crash, replay must still map P. When a snapshot shares P, its
/// relocation record only moves what S's own summary put in the maps, so S must
/// not be rewritten before both checkpoints recovery may start from cover S's
/// batches. When the volume alone
/// holds P, the move is a plain data record that replay applies whatever S held,
/// so S is free as soon as the move is flushed.
async fn relocated_block_survives_its_victims_reuse(checkpoint_after_victim: bool, shared: bool) {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        force: false,
        flash_region_bytes: None,
        ..PoolOptions::default()
    };
    let pool = Pool::create(memory.clone(), options, limits())
        .await
        .unwrap();
    let volume = pool.create_volume("v", 16 << 20).await.unwrap().volume_id;
    let full = CLIENT_BLOCKS_PER_SEGMENT;
    // Old data, covered by both checkpoints.
    write_blocks(&pool, volume, 0..2 * full, 1).await;
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    // S: P (block 100) and fillers, which are then overwritten, so S is the
    // emptiest segment by far and the cleaner's first victim.
    write_blocks(&pool, volume, 100..100 + full, 1).await;
    write_blocks(&pool, volume, 101..100 + full, 2).await;
    if shared {
        pool.create_snapshot("v", "shares-p").await.unwrap();
    }
    if checkpoint_after_victim {
        // Only the newest checkpoint covers S: falling back to the older one
        // needs S's summaries.
        pool.checkpoint().await.unwrap();
    }
    let dead_before = pool.status().dead_segment_count;
    assert_eq!(pool.clean(1).await.unwrap(), 1, "S is emptied");
    pool.flush().await.unwrap();
    if shared {
        assert_eq!(
            pool.status().dead_segment_count,
            dead_before + 1,
            "S was freed before checkpoints covered it"
        );
    } else {
        assert_eq!(
            pool.status().dead_segment_count,
            dead_before,
            "S was not freed by the flush"
        );
    }
    // New blocks, in the next segment taken: S if it was freed (freed
    // segments are taken first in this test).
    let next = 1000 + full;
    write_blocks(&pool, volume, 1000..next, 3).await;
    pool.flush().await.unwrap();
    pool.abandon();
    drop(pool);

    if checkpoint_after_victim {
        corrupt_newest_checkpoint_slot(&memory);
    }
    let pool = Pool::open(memory.clone() as Arc<dyn BlockDevice>, limits())
        .await
        .unwrap();
    assert!(
        read_block(&pool, volume, 100).await == block_contents(100, 1),
        "the relocated block lost its contents"
    );
    if shared {
        let snapshot = pool.resolve_view("v@shares-p").unwrap();
        let mut buffer = vec![0u8; BLOCK];
        for block in 100..100 + full {
            pool.read_view(snapshot, block * BLOCK as u64, &mut buffer)
                .await
                .unwrap();
            let generation = if block == 100 { 1 } else { 2 };
            assert!(
                buffer == block_contents(block, generation),
                "snapshot block {block}"
            );
        }
    }
    for block in 0..2 * full {
        assert!(
            read_block(&pool, volume, block).await == block_contents(block, 1),
            "block {block}"
        );
    }
    for block in 101..100 + full {
        assert!(
            read_block(&pool, volume, block).await == block_contents(block, 2),
            "block {block}"
        );
    }
    for block in 1000..next {
        assert!(
            read_block(&pool, volume, block).await == block_contents(block, 3),
            "block {block}"
        );
    }
    pool.close().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_victim_written_after_both_checkpoints_is_not_rewritten_before_they_cover_it() {
    relocated_block_survives_its_victims_reuse(false, true).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_victim_only_the_newest_checkpoint_covers_is_not_rewritten_before_the_older_does() {
    relocated_block_survives_its_victims_reuse(true, true).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_victim_whose_blocks_one_volume_holds_is_rewritten_after_a_flush() {
    relocated_block_survives_its_victims_reuse(false, false).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_victim_rewritten_after_a_flush_survives_a_fallback_to_the_older_checkpoint() {
    relocated_block_survives_its_victims_reuse(true, false).await;
}

/// Segments that both checkpoints cover die through overwrites that are not
/// yet durable, while the paced cleaner looks at the pool (it frees what it
/// may at every look). New writes that take freed segments, and a power cut
/// that keeps some unflushed writes and loses others: every block must read
/// as its durable or a later content, never fail its checksum.
#[tokio::test(flavor = "current_thread")]
async fn segments_whose_death_is_not_durable_are_not_rewritten() {
    let full = CLIENT_BLOCKS_PER_SEGMENT;
    let old_blocks = 4 * full;
    let paced = PoolLimits {
        cleaner_relocation_blocks_per_client_block_max: 32.0,
        cleaner_interval_ms: 1,
        ..limits()
    };
    for seed in 0..24u64 {
        let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
        let faulty = Arc::new(FaultyDevice::new(memory.clone(), seed));
        let options = options(SEGMENT_BYTES, None);
        let pool = Pool::create(faulty.clone(), options, paced.clone())
            .await
            .unwrap();
        let volume = pool.create_volume("v", 16 << 20).await.unwrap().volume_id;
        write_blocks(&pool, volume, 0..old_blocks, 1).await;
        pool.checkpoint().await.unwrap();
        pool.checkpoint().await.unwrap();
        // Kill the old segments in batches that stay unflushed. Half the
        // seeds overwrite all but each segment's last block first and flush,
        // so that the batch that kills the segments is still open while every
        // sealed batch is durable.
        if seed % 2 == 1 {
            for block in (0..old_blocks).filter(|block| block % full != full - 1) {
                write_blocks(&pool, volume, block..block + 1, 2).await;
            }
            pool.flush().await.unwrap();
            for block in (0..old_blocks).filter(|block| block % full == full - 1) {
                write_blocks(&pool, volume, block..block + 1, 2).await;
            }
        } else {
            write_blocks(&pool, volume, 0..old_blocks, 2).await;
        }
        // Let the batches reach the device (unflushed) and the paced cleaner look.
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        write_blocks(&pool, volume, 1000..1000 + old_blocks, 3).await;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        faulty.power_cut(PowerCutStyle::Random).await.unwrap();
        pool.abandon();
        drop(pool);

        let pool = Pool::open(memory.clone() as Arc<dyn BlockDevice>, limits())
            .await
            .unwrap_or_else(|error| panic!("seed {seed}: recovery failed: {error}"));
        let zeros = vec![0u8; BLOCK];
        for block in 0..old_blocks {
            let mut buffer = vec![0u8; BLOCK];
            pool.read(volume, block * BLOCK as u64, &mut buffer)
                .await
                .unwrap_or_else(|error| panic!("seed {seed}: block {block}: {error}"));
            assert!(
                buffer == block_contents(block, 1) || buffer == block_contents(block, 2),
                "seed {seed}: block {block} holds content never written"
            );
        }
        for block in 1000..1000 + old_blocks {
            let mut buffer = vec![0u8; BLOCK];
            pool.read(volume, block * BLOCK as u64, &mut buffer)
                .await
                .unwrap_or_else(|error| panic!("seed {seed}: block {block}: {error}"));
            assert!(
                buffer == zeros || buffer == block_contents(block, 3),
                "seed {seed}: block {block} holds content never written"
            );
        }
        pool.close().await.unwrap();
    }
}

/// A pool whose device reads wait at `gate`, without a memory cache, and a
/// 4 MiB volume in it.
struct GatedPool {
    pool: Pool,
    gate: tokio::sync::watch::Sender<bool>,
    device: Arc<InstrumentedDevice>,
    volume: u32,
}

impl GatedPool {
    async fn create() -> Self {
        let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
        let (gate, open) = tokio::sync::watch::channel(true);
        let device = Arc::new(InstrumentedDevice::new(memory).with_read_gate(open));
        let options = options(SEGMENT_BYTES, None);
        let limits = PoolLimits {
            memory_cache_bytes: 0,
            ..limits()
        };
        let pool = Pool::create(device.clone(), options, limits).await.unwrap();
        let volume = pool.create_volume("data", 4 << 20).await.unwrap().volume_id;
        Self {
            pool,
            gate,
            device,
            volume,
        }
    }
}

/// Writes blocks `0..count` with generation 1 in one batch, then blocks
/// 200..232, which fill the rest of their segment.
async fn write_blocks_and_their_segment_filler(pool: &Pool, volume: u32, count: u64) {
    let first: Vec<u8> = (0..count)
        .flat_map(|block| block_contents(block, 1))
        .collect();
    pool.write(volume, 0, &first, false).await.unwrap();
    write_blocks(pool, volume, 200..232, 1).await;
}

/// Overwrites blocks `0..count` (written in one batch, with 200..232 filling
/// their segment) with generation 2 and writes enough elsewhere, flushed,
/// that their freed segment is rewritten: their old places hold other bytes.
async fn move_blocks_and_rewrite_their_segment(pool: &Pool, volume: u32, count: u64) {
    let second: Vec<u8> = (0..count)
        .flat_map(|block| block_contents(block, 2))
        .collect();
    pool.write(volume, 0, &second, false).await.unwrap();
    write_blocks(pool, volume, 200..232, 2).await;
    pool.flush().await.unwrap();
    write_blocks(pool, volume, 100..180, 3).await;
    pool.flush().await.unwrap();
}

/// A read looks its blocks up, then reads the device without the lock. If the
/// blocks are overwritten and their segment freed and rewritten meanwhile (now
/// possible a flush after the overwrite), the read finds another block's bytes:
/// it must read the blocks' new homes, not fail and never return the bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_whose_segment_is_rewritten_under_it_reads_the_new_home() {
    let GatedPool {
        pool, gate, volume, ..
    } = GatedPool::create().await;
    // Blocks 0..8 in one batch, then filler that fills their segment, all
    // covered by both checkpoints.
    write_blocks_and_their_segment_filler(&pool, volume, 8).await;
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    // A read of them held after its lookup.
    let reader = start_held_read(&pool, &gate, volume, 8).await;
    // Overwrite them (their segment dies and, once flushed, is freed first),
    // then write enough elsewhere that the freed segment is rewritten.
    move_blocks_and_rewrite_their_segment(&pool, volume, 8).await;
    gate.send(true).unwrap();
    let (result, buffer) = reader.await.unwrap();
    result.expect("the read failed instead of reading the blocks' new homes");
    for block in 0..8 {
        let found = &buffer[block * BLOCK..(block + 1) * BLOCK];
        assert!(
            found == block_contents(block as u64, 1) || found == block_contents(block as u64, 2),
            "block {block} read another block's bytes"
        );
    }
    pool.close().await.unwrap();
}

/// A long read of which only a few blocks move under it (overwritten, their
/// segment freed and rewritten) reads again only those blocks, not the whole
/// range: a whole-volume read under a busy cleaner used to start over each
/// time any block moved, and gave up with the moved block reported corrupt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_read_reads_again_only_the_blocks_that_moved_under_it() {
    const MOVED_BLOCKS: u64 = 8;
    const READ_BLOCKS: u64 = 48;
    let GatedPool {
        pool,
        gate,
        device,
        volume,
    } = GatedPool::create().await;
    // Blocks 0..8 in one batch and filler that fills their segment, then the
    // rest of the range in segments of their own, all checkpointed twice.
    write_blocks_and_their_segment_filler(&pool, volume, MOVED_BLOCKS).await;
    write_blocks(&pool, volume, MOVED_BLOCKS..READ_BLOCKS, 1).await;
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    let reader = start_held_read(&pool, &gate, volume, READ_BLOCKS).await;
    // Blocks 0..8 move and their old segment is rewritten; the rest stay.
    move_blocks_and_rewrite_their_segment(&pool, volume, MOVED_BLOCKS).await;
    device
        .recording
        .store(true, std::sync::atomic::Ordering::Relaxed);
    gate.send(true).unwrap();
    let (result, buffer) = reader.await.unwrap();
    result.expect("the read failed instead of reading the moved blocks' new homes");
    for block in 0..READ_BLOCKS {
        let found = &buffer[block as usize * BLOCK..(block as usize + 1) * BLOCK];
        let expected = if block < MOVED_BLOCKS { 2 } else { 1 };
        assert!(
            found == block_contents(block, expected),
            "block {block} does not hold generation {expected}"
        );
    }
    let read_bytes = device.read_bytes.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        read_bytes,
        (READ_BLOCKS + MOVED_BLOCKS) as usize * BLOCK,
        "the range once, then only the blocks that moved"
    );
    pool.close().await.unwrap();
}

/// Segments freed after a flush (rule (a')) are the next ones opened; a
/// power cut right after they were opened since the checkpoint (flushed
/// writes in them, unflushed ones in flight) must find them through the
/// segment openings record (format version 8), from the newest checkpoint
/// or, with its slot corrupt, from the older one.
#[tokio::test(flavor = "current_thread")]
async fn segments_reused_since_the_checkpoint_survive_a_power_cut_right_after_their_opening() {
    for seed in 0..40u64 {
        let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
        let faulty = Arc::new(FaultyDevice::new(memory.clone(), seed));
        let options = PoolOptions {
            segment_size_bytes: SEGMENT_BYTES,
            ..PoolOptions::default()
        };
        let pool = Pool::create(faulty.clone(), options, limits())
            .await
            .unwrap();
        let volume = pool.create_volume("v", 16 << 20).await.unwrap().volume_id;
        write_blocks(&pool, volume, 0..60, 1).await;
        pool.checkpoint().await.unwrap();
        pool.checkpoint().await.unwrap();
        // Kill the first segments and make the deaths durable: they are
        // free again, first in line.
        write_blocks(&pool, volume, 0..60, 2).await;
        pool.flush().await.unwrap();
        // New heads land on them; the flushed part must come back.
        let flushed_end = 200 + seed % 7 * 9;
        write_blocks(&pool, volume, 200..flushed_end + 1, 3).await;
        pool.flush().await.unwrap();
        // Unflushed writes into further new segments, cut after a few yields.
        let unflushed = {
            let pool = pool.clone();
            tokio::spawn(async move { write_blocks(&pool, volume, 400..440, 4).await })
        };
        for _ in 0..seed % 5 {
            tokio::task::yield_now().await;
        }
        faulty.power_cut(PowerCutStyle::Random).await.unwrap();
        unflushed.abort();
        let _ = unflushed.await;
        pool.abandon();
        drop(pool);
        if seed % 2 == 1 {
            corrupt_newest_checkpoint_slot(&memory);
        }
        let pool = Pool::open(
            Arc::new(FaultyDevice::new(memory.clone(), seed + 100)) as Arc<dyn BlockDevice>,
            limits(),
        )
        .await
        .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
        let mut buffer = vec![0u8; BLOCK];
        for (range, generation) in [(0..60, 2), (200..flushed_end + 1, 3)] {
            for block in range {
                pool.read(volume, block * BLOCK as u64, &mut buffer)
                    .await
                    .unwrap();
                assert!(
                    buffer == block_contents(block, generation),
                    "seed {seed}: block {block} is not generation {generation}"
                );
            }
        }
        pool.close().await.unwrap();
    }
}
