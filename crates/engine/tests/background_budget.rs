//! The background budget in a whole pool, on tokio's paused clock: while
//! clients wait longer than `client_latency_target_us` for every read, a
//! scrub runs at the budget's floor (it yields, and it still progresses),
//! and with no client it runs as fast as the device serves it.
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
