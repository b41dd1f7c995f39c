//! The paced cleaner's headroom in the cleaning steady state (decision
//! 0042): clients with many writes in flight overwrite a half-full pool at
//! random, on a device whose writes and flushes take time (tokio's paused
//! clock), long enough for the cleaner to work all the time. The cleaner
//! must stay far enough ahead that no write ever finds the pool without a
//! free segment: with a headroom of 4 segments (the default before), a
//! cleaning step or checkpoint outlasted it and sixteen writes at once
//! waited for a cleaning pass in their own path, the daemon's latency
//! spikes under load.
// Test arithmetic on small, known values.
#![allow(clippy::cast_possible_truncation)]

mod common;
use common::blocks::versioned_contents;

use std::sync::Arc;
use std::time::Duration;

use common::InstrumentedDevice;
use lamina_device::MemoryDevice;
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits, PoolOptions};

const MIB: u64 = 1 << 20;
/// 2048 segments of 64 KiB: enough for a headroom of 32 (2% of the pool
/// is 40).
const DEVICE_BYTES: u64 = 128 * MIB;
const SEGMENT_BYTES: u64 = 64 << 10;
/// Share of the pool's capacity the volume fills, in percent.
const FILL_PERCENT: u64 = 50;
/// Writes in flight at once, as fio's QD16.
const WRITER_COUNT: u64 = 16;
/// Each writer's pause between two writes: 16 writers at 4 ms each offer
/// 4000 writes a second (16 MiB/s).
const WRITE_PAUSE: Duration = Duration::from_millis(4);
/// Times the volume is overwritten: its free half is used up twice over.
const OVERWRITE_PASSES: u64 = 2;
/// Every device write and flush takes this long.
const WRITE_DELAY: Duration = Duration::from_millis(2);
const FLUSH_DELAY: Duration = Duration::from_millis(2);

/// A pool on a memory device with slow writes and flushes, one volume
/// written in full and flushed.
async fn half_full_pool(limits: PoolLimits) -> (Pool, u32, u64) {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let device = Arc::new(
        InstrumentedDevice::new(memory)
            .with_write_delay(WRITE_DELAY)
            .with_flush_delay(FLUSH_DELAY),
    );
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        ..PoolOptions::default()
    };
    let pool = Pool::create(device, options, limits)
        .await
        .expect("creates a pool");
    let block_count = pool.status().capacity_bytes * FILL_PERCENT / 100 / BLOCK_SIZE_BYTES;
    let volume_id = pool
        .create_volume("data", block_count * BLOCK_SIZE_BYTES)
        .await
        .expect("creates a volume")
        .volume_id;
    let chunk_blocks = 256;
    for first in (0..block_count).step_by(chunk_blocks) {
        let contents: Vec<u8> = (first..(first + chunk_blocks as u64).min(block_count))
            .flat_map(|block| versioned_contents(block, 0))
            .collect();
        pool.write(volume_id, first * BLOCK_SIZE_BYTES, &contents, false)
            .await
            .expect("writes");
    }
    pool.flush().await.expect("flushes");
    (pool, volume_id, block_count)
}

/// One writer: random overwrites of the blocks `block % WRITER_COUNT ==
/// writer`, with a pause between two; returns the versions it wrote last.
async fn overwrite(pool: Pool, volume_id: u32, writer: u64, block_count: u64) -> Vec<(u64, u32)> {
    let own_blocks = block_count / WRITER_COUNT;
    let mut versions = vec![0u32; own_blocks as usize];
    let mut position = 0x9e37_79b9_u64 + writer;
    for _ in 0..own_blocks * OVERWRITE_PASSES {
        position = position
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let index = (position >> 33) % own_blocks;
        versions[index as usize] += 1;
        let block = index * WRITER_COUNT + writer;
        let contents = versioned_contents(block, versions[index as usize]);
        pool.write(volume_id, block * BLOCK_SIZE_BYTES, &contents, false)
            .await
            .expect("writes");
        tokio::time::sleep(WRITE_PAUSE).await;
    }
    (0..own_blocks)
        .map(|index| (index * WRITER_COUNT + writer, versions[index as usize]))
        .collect()
}

/// Overwrites the half-full pool with `WRITER_COUNT` writers, then checks
/// that every block reads back as its newest version; the pool's status
/// after.
async fn overwrite_and_verify(limits: PoolLimits) -> lamina_engine::PoolStatus {
    let (pool, volume_id, block_count) = half_full_pool(limits).await;
    let writers: Vec<_> = (0..WRITER_COUNT)
        .map(|writer| tokio::spawn(overwrite(pool.clone(), volume_id, writer, block_count)))
        .collect();
    let mut newest = Vec::new();
    for writer in writers {
        newest.extend(writer.await.expect("writer"));
    }
    pool.flush().await.expect("flushes");
    let mut buffer = vec![0u8; BLOCK_SIZE_BYTES as usize];
    for (block, version) in newest {
        pool.read(volume_id, block * BLOCK_SIZE_BYTES, &mut buffer)
            .await
            .expect("reads");
        assert!(
            buffer == versioned_contents(block, version),
            "block {block} reads back as version {version}"
        );
    }
    let status = pool.status();
    pool.close().await.expect("closes");
    status
}

#[tokio::test(start_paused = true)]
async fn writers_in_the_cleaning_steady_state_never_wait_for_space() {
    let status = overwrite_and_verify(PoolLimits::default()).await;
    assert!(
        status.cleaner_relocated_blocks > 0,
        "the cleaner never had to run"
    );
    let waits = status.space_waits;
    assert_eq!(
        waits.count, 0,
        "writers waited for space {} times, {} ms in all",
        waits.count, waits.milliseconds
    );
}
