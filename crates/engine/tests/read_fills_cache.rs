//! Reads from the device fill the memory cache (issue 20, decision 0028): a
//! block read once after a restart is served from memory the second time
//! (the cache's hit counter tells), a block overwritten after being cached is
//! never served stale, and a read still in flight when its block dies does not
//! put the dead block's contents into the cache.

// Test code keeps `as` for small sizes and byte patterns.
#![allow(clippy::cast_possible_truncation)]

mod common;
use common::blocks::block_contents;
use common::pools::options;
use common::read_gate::start_held_read;

use std::sync::Arc;
use std::time::Duration;

use common::InstrumentedDevice;
use lamina_device::{BlockDevice, MemoryDevice};
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SEGMENT_BYTES: u64 = 256 << 10;
const DEVICE_BYTES: u64 = 16 << 20;
const VOLUME_BLOCKS: u64 = 64;
/// Holds the whole volume.
const CACHE_BLOCKS: u64 = 4 * VOLUME_BLOCKS;
/// Rounds of overwriting every block of the volume and reading it back: the
/// pool (4 MiB of live data at most on 16 MiB) cleans and reuses segments.
const OVERWRITE_ROUNDS: u8 = 40;
const WAIT_MS_MAX: u64 = 10_000;

fn limits() -> PoolLimits {
    PoolLimits {
        memory_cache_bytes: CACHE_BLOCKS * BLOCK_SIZE_BYTES,
        ..PoolLimits::default()
    }
}

async fn write_all(pool: &Pool, volume_id: u32, round: u8) {
    for logical_block in 0..VOLUME_BLOCKS {
        let contents = block_contents(logical_block, round);
        pool.write(
            volume_id,
            logical_block * BLOCK_SIZE_BYTES,
            &contents,
            false,
        )
        .await
        .unwrap();
    }
}

/// Reads one block; returns whether it was a cache hit.
async fn read_block(pool: &Pool, volume_id: u32, logical_block: u64, round: u8) -> bool {
    let hits_before = pool.status().memory_cache.hits;
    let mut buffer = vec![0u8; BLOCK];
    pool.read(volume_id, logical_block * BLOCK_SIZE_BYTES, &mut buffer)
        .await
        .unwrap();
    assert!(
        buffer == block_contents(logical_block, round),
        "block {logical_block}: not the contents of round {round}"
    );
    pool.status().memory_cache.hits > hits_before
}

/// A pool whose volume `volume` holds round 1, reopened: its cache is empty.
async fn reopened_pool(device: Arc<dyn BlockDevice>) -> (Pool, u32) {
    let pool = Pool::create(device.clone(), options(SEGMENT_BYTES, None), limits())
        .await
        .unwrap();
    pool.create_volume("volume", VOLUME_BLOCKS * BLOCK_SIZE_BYTES)
        .await
        .unwrap();
    let volume_id = pool.volume_id("volume").unwrap();
    write_all(&pool, volume_id, 1).await;
    pool.close().await.unwrap();
    let pool = Pool::open(device, limits()).await.unwrap();
    assert_eq!(pool.status().memory_cache.cached_bytes, 0, "no warm-up");
    (pool, volume_id)
}

#[tokio::test]
async fn a_block_read_from_the_device_is_served_from_memory_the_second_time() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let (pool, volume_id) = reopened_pool(memory).await;
    for logical_block in 0..VOLUME_BLOCKS {
        assert!(
            !read_block(&pool, volume_id, logical_block, 1).await,
            "block {logical_block}: the first read goes to the device"
        );
        assert!(
            read_block(&pool, volume_id, logical_block, 1).await,
            "block {logical_block}: the second read is a cache hit"
        );
    }
    pool.close().await.unwrap();
}

#[tokio::test]
async fn a_block_overwritten_after_it_was_cached_is_never_served_stale() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let (pool, volume_id) = reopened_pool(memory.clone()).await;
    for logical_block in 0..VOLUME_BLOCKS {
        read_block(&pool, volume_id, logical_block, 1).await;
    }
    for round in 2..=OVERWRITE_ROUNDS {
        write_all(&pool, volume_id, round).await;
        if round % 2 == 0 {
            pool.flush().await.unwrap();
        }
        for logical_block in 0..VOLUME_BLOCKS {
            read_block(&pool, volume_id, logical_block, round).await;
        }
    }
    pool.close().await.unwrap();
    let pool = Pool::open(memory, limits()).await.unwrap();
    for logical_block in 0..VOLUME_BLOCKS {
        read_block(&pool, volume_id, logical_block, OVERWRITE_ROUNDS).await;
        read_block(&pool, volume_id, logical_block, OVERWRITE_ROUNDS).await;
    }
    pool.close().await.unwrap();
}

#[tokio::test]
async fn a_read_in_flight_when_its_block_dies_does_not_cache_it() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let (gate, gate_receiver) = tokio::sync::watch::channel(true);
    let device = Arc::new(InstrumentedDevice::new(memory).with_read_gate(gate_receiver));
    let (pool, volume_id) = reopened_pool(device).await;
    // The read is planned (block 0 at its round-1 home) and waits at the gate.
    let reader = start_held_read(&pool, &gate, volume_id, 1).await;
    write_all(&pool, volume_id, 2).await;
    pool.flush().await.unwrap();
    let cached_before = pool.status().memory_cache.cached_bytes;
    gate.send(true).unwrap();
    let (result, read) = tokio::time::timeout(Duration::from_millis(WAIT_MS_MAX), reader)
        .await
        .expect("the read ends")
        .unwrap();
    result.unwrap();
    // Either contents is right for a read concurrent with the write.
    assert!(read == block_contents(0, 1) || read == block_contents(0, 2));
    assert_eq!(
        pool.status().memory_cache.cached_bytes,
        cached_before,
        "the dead block's contents took no slot"
    );
    assert!(
        read_block(&pool, volume_id, 0, 2).await,
        "round 2 is cached"
    );
    pool.close().await.unwrap();
}
