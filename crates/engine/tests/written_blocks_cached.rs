//! Writes warm the memory cache (issue 46, item 3, decision 0067). What must
//! hold: blocks written and never read are in the warm-restart record, and
//! after a clean close and a warm-up they are read from memory (the cache's
//! hit counter) with no device read; and a sequential fill four times the
//! cache, with no reads meanwhile, leaves a hot read set of
//! `100 - WRITTEN_UNREAD_PERCENT_MAX` per cent of the cache cached whole,
//! which is the policy's promise: written blocks not read since displace at
//! most `WRITTEN_UNREAD_PERCENT_MAX` per cent of the blocks clients read.

// Test code keeps `as` for small sizes and byte patterns.
#![allow(clippy::cast_possible_truncation)]

mod common;
use common::InstrumentedDevice;
use common::blocks::block_contents;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use lamina_device::{BlockDevice, MemoryDevice};
use lamina_engine::tier::memory_cache::WRITTEN_UNREAD_PERCENT_MAX;
use lamina_engine::{
    BLOCK_SIZE_BYTES, CacheContents, CacheWarmupState, Pool, PoolLimits, PoolOptions, View,
};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SEGMENT_BYTES: u64 = 256 << 10;
const DEVICE_BYTES: u64 = 64 << 20;
/// One shard (a cache under two shards' worth of blocks is not split), so
/// the share is the cache's.
const CACHE_BLOCKS: u64 = 1024;
/// Written and never read before the restart: half the cache.
const WRITTEN_BLOCKS: u64 = CACHE_BLOCKS / 2;
/// The hot read set the fill must leave: all the cache written blocks may
/// not take.
const HOT_BLOCKS: u64 = CACHE_BLOCKS * (100 - WRITTEN_UNREAD_PERCENT_MAX) / 100;
/// The sequential fill: four times the cache.
const FILL_BLOCKS: u64 = 4 * CACHE_BLOCKS;
/// Blocks per write request.
const WRITE_BLOCKS: u64 = 64;
const WARMUP_WAIT_MS_MAX: u64 = 10_000;

// Volumes are written in whole requests.
const _: () = assert!(HOT_BLOCKS > 0 && HOT_BLOCKS.is_multiple_of(WRITE_BLOCKS));
const _: () = assert!(FILL_BLOCKS.is_multiple_of(WRITE_BLOCKS));
const _: () = assert!(WRITTEN_BLOCKS.is_multiple_of(WRITE_BLOCKS));

fn limits() -> PoolLimits {
    PoolLimits {
        memory_cache_bytes: CACHE_BLOCKS * BLOCK_SIZE_BYTES,
        ..PoolLimits::default()
    }
}

/// A new volume of `block_count` blocks, written in sequence with
/// generation 1 and flushed; returns its id.
async fn write_volume(pool: &Pool, name: &str, block_count: u64) -> u32 {
    pool.create_volume(name, block_count * BLOCK_SIZE_BYTES)
        .await
        .unwrap();
    let volume_id = pool.volume_id(name).unwrap();
    for first in (0..block_count).step_by(WRITE_BLOCKS as usize) {
        let contents: Vec<u8> = (first..first + WRITE_BLOCKS)
            .flat_map(|logical_block| block_contents(logical_block, 1))
            .collect();
        pool.write(volume_id, first * BLOCK_SIZE_BYTES, &contents, false)
            .await
            .unwrap();
    }
    pool.flush().await.unwrap();
    volume_id
}

/// Reads blocks `0..block_count` of the volume, checking their contents;
/// returns how many were cache hits.
async fn read_hits(pool: &Pool, volume_id: u32, block_count: u64) -> u64 {
    let hits_before = pool.status().memory_cache.hits;
    for logical_block in 0..block_count {
        let mut buffer = vec![0u8; BLOCK];
        pool.read(volume_id, logical_block * BLOCK_SIZE_BYTES, &mut buffer)
            .await
            .unwrap();
        assert!(
            buffer == block_contents(logical_block, 1),
            "block {logical_block} does not read as written"
        );
    }
    pool.status().memory_cache.hits - hits_before
}

async fn wait_for_warmup(pool: &Pool) {
    let started = std::time::Instant::now();
    while pool.cache_warmup_status().state != CacheWarmupState::Finished {
        assert!(
            started.elapsed() < Duration::from_millis(WARMUP_WAIT_MS_MAX),
            "warm-up did not finish: {:?}",
            pool.cache_warmup_status()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A new pool on `memory` with this file's segments and limits.
async fn created_pool(memory: &Arc<MemoryDevice>) -> Pool {
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        ..PoolOptions::default()
    };
    Pool::create(memory.clone(), options, limits())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn written_blocks_are_reloaded_after_a_clean_restart_and_read_without_the_device() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = created_pool(&memory).await;
    let volume_id = write_volume(&pool, "written", WRITTEN_BLOCKS).await;
    // Never read: the record lists every written block all the same.
    let contents = pool.cache_contents();
    let mut listed: Vec<u64> = contents
        .blocks
        .iter()
        .filter(|block| block.view == View::Volume(volume_id))
        .map(|block| block.logical_block)
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, (0..WRITTEN_BLOCKS).collect::<Vec<u64>>());
    pool.close().await.unwrap();
    let record = contents.to_bytes();

    let device = Arc::new(InstrumentedDevice::new(memory));
    let pool = Pool::open(device.clone() as Arc<dyn BlockDevice>, limits())
        .await
        .unwrap();
    assert_eq!(pool.status().memory_cache.cached_bytes, 0);
    pool.warm_cache(CacheContents::from_bytes(&record).unwrap());
    wait_for_warmup(&pool).await;
    let status = pool.cache_warmup_status();
    assert!(
        status.blocks_loaded >= WRITTEN_BLOCKS,
        "every written block is loaded: {status:?}"
    );
    device.read_bytes.store(0, Ordering::Relaxed);
    device.recording.store(true, Ordering::Relaxed);
    assert_eq!(
        read_hits(&pool, volume_id, WRITTEN_BLOCKS).await,
        WRITTEN_BLOCKS
    );
    device.recording.store(false, Ordering::Relaxed);
    assert_eq!(
        device.read_bytes.load(Ordering::Relaxed),
        0,
        "no written block was read from the device"
    );
    pool.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_fill_larger_than_the_cache_leaves_the_hot_read_set_cached() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = created_pool(&memory).await;
    let hot_id = write_volume(&pool, "hot", HOT_BLOCKS).await;
    pool.close().await.unwrap();
    // Reopened without a warm-up: the hot set enters the cache by reads.
    let device = Arc::new(InstrumentedDevice::new(memory));
    let pool = Pool::open(device.clone() as Arc<dyn BlockDevice>, limits())
        .await
        .unwrap();
    assert_eq!(read_hits(&pool, hot_id, HOT_BLOCKS).await, 0);
    assert_eq!(read_hits(&pool, hot_id, HOT_BLOCKS).await, HOT_BLOCKS);

    let fill_id = write_volume(&pool, "fill", FILL_BLOCKS).await;
    assert_eq!(
        pool.status().memory_cache.cached_bytes,
        CACHE_BLOCKS * BLOCK_SIZE_BYTES,
        "the fill took the rest of the cache"
    );
    device.read_bytes.store(0, Ordering::Relaxed);
    device.recording.store(true, Ordering::Relaxed);
    assert_eq!(
        read_hits(&pool, hot_id, HOT_BLOCKS).await,
        HOT_BLOCKS,
        "the fill displaced none of the hot set"
    );
    device.recording.store(false, Ordering::Relaxed);
    assert_eq!(device.read_bytes.load(Ordering::Relaxed), 0);
    // The last blocks of the fill are cached too: a write is read soon.
    let last = FILL_BLOCKS - 1;
    let hits_before = pool.status().memory_cache.hits;
    let mut buffer = vec![0u8; BLOCK];
    pool.read(fill_id, last * BLOCK_SIZE_BYTES, &mut buffer)
        .await
        .unwrap();
    assert!(buffer == block_contents(last, 1));
    assert_eq!(pool.status().memory_cache.hits, hits_before + 1);
    pool.close().await.unwrap();
}
