//! The background budget in a whole pool, on tokio's paused clock: while
//! clients wait longer than `client_latency_target_us` for every read, a
//! scrub runs at the budget's floor (it yields, and it still progresses),
//! and with no client it runs as fast as the device serves it; and the
//! paced cleaner keeps up with the clients' writes whatever the budget's
//! rate (its work is the price of those writes, decision 0039).
// Test arithmetic on small, known values.
#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::InstrumentedDevice;
use lamina_device::MemoryDevice;
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits, PoolOptions, ScrubState};
use tokio::time::Instant;

const MIB: u64 = 1 << 20;
const DEVICE_BYTES: u64 = 64 * MIB;
const VOLUME_BYTES: u64 = 8 * MIB;
const FLOOR_BYTES_PER_SECOND: u64 = MIB;
const CEILING_BYTES_PER_SECOND: u64 = 1 << 30;
const TARGET_US: u64 = 1000;
/// Every device read takes this long: five times the target.
const READ_DELAY: Duration = Duration::from_millis(5);

fn limits() -> PoolLimits {
    PoolLimits {
        // Reads reach the device, so that clients feel its delay.
        memory_cache_bytes: 0,
        background_bytes_per_second_min: Some(FLOOR_BYTES_PER_SECOND),
        background_bytes_per_second_max: Some(CEILING_BYTES_PER_SECOND),
        client_latency_target_us: Some(TARGET_US),
        ..PoolLimits::default()
    }
}

/// A pool on a slow memory device with one volume written in full and
/// flushed.
async fn pool_with_a_full_volume() -> (Pool, u32) {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let device = Arc::new(InstrumentedDevice::new(memory).with_read_delay(READ_DELAY));
    let options = PoolOptions {
        segment_size_bytes: MIB,
        ..PoolOptions::default()
    };
    let pool = Pool::create(device, options, limits())
        .await
        .expect("creates a pool");
    let volume_id = pool
        .create_volume("data", VOLUME_BYTES)
        .await
        .expect("creates a volume")
        .volume_id;
    let contents: Vec<u8> = (0..VOLUME_BYTES).map(|index| (index % 251) as u8).collect();
    pool.write(volume_id, 0, &contents, true)
        .await
        .expect("writes and flushes");
    (pool, volume_id)
}

/// A client reading one block after another, for as long as it is let run.
fn client(pool: &Pool, volume_id: u32) -> tokio::task::JoinHandle<()> {
    let pool = pool.clone();
    tokio::spawn(async move {
        let mut buffer = vec![0u8; BLOCK_SIZE_BYTES as usize];
        let blocks = VOLUME_BYTES / BLOCK_SIZE_BYTES;
        for index in 0u64.. {
            let offset = (index * 97 % blocks) * BLOCK_SIZE_BYTES;
            pool.read(volume_id, offset, &mut buffer)
                .await
                .expect("reads");
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_scrub_under_slow_clients_runs_at_the_floor() {
    let (pool, volume_id) = pool_with_a_full_volume().await;
    let reader = client(&pool, volume_id);
    // The rate falls by a third a window (100 ms) from the ceiling while
    // clients wait 5 ms for each read.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let budget = pool.status().background;
    assert_eq!(budget.bytes_per_second, FLOOR_BYTES_PER_SECOND);
    let latency_us = budget.client_latency_us.expect("clients measured");
    assert!(latency_us >= READ_DELAY.as_micros() as u64, "{latency_us}");

    let started = Instant::now();
    let scrub = pool.scrub().await.expect("scrubs");
    let elapsed = started.elapsed().as_secs_f64();
    reader.abort();
    assert_eq!(scrub.state, ScrubState::Finished);
    assert_eq!(scrub.blocks_scrubbed, VOLUME_BYTES / BLOCK_SIZE_BYTES);
    // At the floor: eight seconds for 8 MiB, where the device alone would
    // serve it in a sixth of a second; and no slower than the floor.
    let at_floor = (VOLUME_BYTES / FLOOR_BYTES_PER_SECOND) as f64;
    assert!(
        elapsed >= 0.9 * at_floor && elapsed <= 1.1 * at_floor,
        "scrubbed {VOLUME_BYTES} bytes in {elapsed} s"
    );
    let budget = pool.status().background;
    assert_eq!(budget.granted_bytes.scrub, VOLUME_BYTES);
    assert_eq!(budget.bytes_per_second, FLOOR_BYTES_PER_SECOND);
}

#[tokio::test(start_paused = true)]
async fn a_scrub_with_no_client_runs_as_fast_as_the_device_serves() {
    let (pool, _) = pool_with_a_full_volume().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let budget = pool.status().background;
    assert_eq!(budget.bytes_per_second, CEILING_BYTES_PER_SECOND);
    // The only client request was the write that filled the volume.
    assert!(
        budget
            .client_latency_us
            .is_none_or(|latency| latency < TARGET_US)
    );
    let started = Instant::now();
    let scrub = pool.scrub().await.expect("scrubs");
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(scrub.blocks_scrubbed, VOLUME_BYTES / BLOCK_SIZE_BYTES);
    // 32 runs of 64 blocks, 5 ms each.
    let runs = (VOLUME_BYTES / BLOCK_SIZE_BYTES).div_ceil(64);
    let device_seconds = runs as f64 * READ_DELAY.as_secs_f64();
    assert!(
        elapsed <= 1.2 * device_seconds,
        "scrubbed {VOLUME_BYTES} bytes in {elapsed} s"
    );
}

/// Segments of the cleaner test's pool: small, so that its 64 MiB hold
/// enough of them (about 250) for a headroom of 5 (2% of the pool).
const CLEANER_SEGMENT_BYTES: u64 = 256 << 10;
/// The cleaner test's floor: a victim's live bytes take seconds at it.
const CLEANER_FLOOR_BYTES_PER_SECOND: u64 = 64 << 10;
/// Client writes between the cleaner test's pauses, and the pause: a
/// client writing 4 MiB/s at random.
const WRITES_PER_PAUSE: u64 = 4;
const WRITE_PAUSE: Duration = Duration::from_millis(4);
/// A device flush in the cleaner test, so that a writer's reclaim (at
/// least one flush) takes time.
const FLUSH_DELAY: Duration = Duration::from_millis(1);

/// The contents of version `version` of `block`: unique per version.
fn block_contents(block: u64, version: u32) -> Vec<u8> {
    let mut contents = vec![0u8; BLOCK_SIZE_BYTES as usize];
    contents[..8].copy_from_slice(&block.to_le_bytes());
    contents[8..12].copy_from_slice(&version.to_le_bytes());
    for (index, byte) in contents.iter_mut().enumerate().skip(12) {
        *byte = (index as u64 ^ block ^ u64::from(version)) as u8;
    }
    contents
}

/// A pool of small segments on a memory device whose reads take
/// [`READ_DELAY`], with one volume of 60% of its space written in full.
async fn pool_for_the_cleaner() -> (Pool, u32, u64) {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let device = Arc::new(
        InstrumentedDevice::new(memory)
            .with_read_delay(READ_DELAY)
            .with_flush_delay(FLUSH_DELAY),
    );
    let options = PoolOptions {
        segment_size_bytes: CLEANER_SEGMENT_BYTES,
        ..PoolOptions::default()
    };
    let limits = PoolLimits {
        background_bytes_per_second_min: Some(CLEANER_FLOOR_BYTES_PER_SECOND),
        ..limits()
    };
    let pool = Pool::create(device, options, limits)
        .await
        .expect("creates a pool");
    let capacity_bytes = pool.status().capacity_bytes;
    let block_count = capacity_bytes * 6 / 10 / BLOCK_SIZE_BYTES;
    let volume_id = pool
        .create_volume("data", block_count * BLOCK_SIZE_BYTES)
        .await
        .expect("creates a volume")
        .volume_id;
    for block in 0..block_count {
        pool.write(
            volume_id,
            block * BLOCK_SIZE_BYTES,
            &block_contents(block, 0),
            false,
        )
        .await
        .expect("writes");
    }
    pool.flush().await.expect("flushes");
    (pool, volume_id, block_count)
}

/// With the budget held at its floor by slow client reads, a client
/// overwriting blocks at random for long enough to need cleaning many times
/// over never has to clean for itself (at most flush): the paced cleaner
/// does not wait for the budget (before decision 0039 it did, one victim's
/// live bytes at the floor taking seconds, and writers ran out of free
/// segments behind it, cleaning and checkpointing for themselves).
#[tokio::test(start_paused = true)]
async fn the_paced_cleaner_keeps_up_with_writers_while_the_budget_is_at_its_floor() {
    let (pool, volume_id, block_count) = pool_for_the_cleaner().await;
    let reader = client(&pool, volume_id);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        pool.status().background.bytes_per_second,
        CLEANER_FLOOR_BYTES_PER_SECOND
    );
    let mut versions = vec![0u32; block_count as usize];
    // Three times the volume: the free space (40% of the pool) is used up
    // several times over.
    let write_count = 3 * block_count;
    let mut position = 0x9e37_79b9_u64;
    for index in 0..write_count {
        position = position
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let block = (position >> 33) % block_count;
        versions[block as usize] += 1;
        let contents = block_contents(block, versions[block as usize]);
        pool.write(volume_id, block * BLOCK_SIZE_BYTES, &contents, false)
            .await
            .expect("writes");
        if index % WRITES_PER_PAUSE == 0 {
            tokio::time::sleep(WRITE_PAUSE).await;
        }
    }
    reader.abort();
    let status = pool.status();
    assert!(
        status.cleaner_relocated_blocks > block_count / 2,
        "the cleaner moved {} blocks",
        status.cleaner_relocated_blocks
    );
    // A writer that finds no free segment first flushes, which frees the
    // segments the cleaner emptied since its last look: that much waiting
    // (one flush) is allowed, a cleaning pass or checkpoint is not. Before
    // decision 0039: 57 waits of 68 ms each on average.
    let waits = status.space_waits;
    let flush_ms = FLUSH_DELAY.as_millis() as u64;
    assert!(
        waits.milliseconds <= 2 * flush_ms * waits.count,
        "writers waited for space {} times, {} ms in all",
        waits.count,
        waits.milliseconds
    );
    let mut buffer = vec![0u8; BLOCK_SIZE_BYTES as usize];
    for block in 0..block_count {
        pool.read(volume_id, block * BLOCK_SIZE_BYTES, &mut buffer)
            .await
            .expect("reads");
        assert!(
            buffer == block_contents(block, versions[block as usize]),
            "block {block} reads back as its newest version"
        );
    }
}
