//! Background activity on tokio's paused clock: the periodic flush makes a
//! write durable once `flush_interval_ms` has passed, and not before, without
//! the test sleeping for real; the test hook keeps it from starting. And limits
//! outside their range are refused when a pool is created or opened.
// Test arithmetic on small, known values.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;
use common::pools::options;

use std::sync::Arc;
use std::time::Duration;

use lamina_device::{FaultyDevice, MemoryDevice, PowerCutStyle};
use lamina_engine::{BLOCK_SIZE_BYTES, EngineError, LimitsError, Pool, PoolLimits, TestHooks};
use tokio::time::Instant;

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SEGMENT_BYTES: u64 = 64 << 10;
const DEVICE_BYTES: u64 = (4 << 20) + 48 * SEGMENT_BYTES;
/// A minute: the test would take that long if it slept for real.
const FLUSH_INTERVAL_MS: u64 = 60_000;
/// Turns of the runtime given to background tasks to finish what a tick started.
const SETTLE_YIELD_COUNT: usize = 1000;

/// Only the periodic flush-and-checkpoint task has a timer: the paced cleaner
/// is off (its 5 ms timer would let the paused clock run on by itself), and a
/// one-tier pool has no demoter.
fn limits(test_hooks: TestHooks) -> PoolLimits {
    PoolLimits {
        flush_interval_ms: FLUSH_INTERVAL_MS,
        checkpoint_interval_ms: 100 * FLUSH_INTERVAL_MS,
        cleaner_relocation_blocks_per_client_block_max: 0.0,
        test_hooks,
        ..PoolLimits::default()
    }
}

/// Lets the background tasks run without moving the clock.
async fn settle() {
    for _ in 0..SETTLE_YIELD_COUNT {
        tokio::task::yield_now().await;
    }
}

/// Advances the paused clock to `at` (if it is not there already).
async fn advance_to(at: Instant) {
    let now = Instant::now();
    if at > now {
        tokio::time::advance(at - now).await;
    }
}

/// A pool on a power-cuttable memory device, a volume, and one block written
/// to it (acknowledged, not flushed). Returns when the periodic task started.
async fn pool_with_one_write(
    test_hooks: TestHooks,
) -> (
    Arc<MemoryDevice>,
    Arc<FaultyDevice<MemoryDevice>>,
    Pool,
    Instant,
    Vec<u8>,
) {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let faulty = Arc::new(FaultyDevice::new(memory.clone(), 1));
    let pool = Pool::create(
        faulty.clone(),
        options(SEGMENT_BYTES, None),
        limits(test_hooks),
    )
    .await
    .expect("create");
    let started = Instant::now();
    let volume_id = pool
        .create_volume("data", 64 * BLOCK as u64)
        .await
        .expect("create volume")
        .volume_id;
    let data: Vec<u8> = (0..BLOCK).map(|index| (index % 251) as u8).collect();
    pool.write(volume_id, 0, &data, false).await.expect("write");
    (memory, faulty, pool, started, data)
}

#[tokio::test(start_paused = true)]
async fn a_write_becomes_durable_when_the_flush_interval_passes_on_the_paused_clock() {
    let real_start = std::time::Instant::now();
    let (memory, faulty, pool, started, data) = pool_with_one_write(TestHooks::default()).await;
    let durable_before = pool.status().durable_batch_sequence;
    // Just short of the first tick: nothing flushed the write.
    advance_to(started + Duration::from_millis(FLUSH_INTERVAL_MS - 1)).await;
    settle().await;
    assert_eq!(
        pool.status().durable_batch_sequence,
        durable_before,
        "flushed before flush_interval_ms passed"
    );
    // The tick: the periodic task flushes.
    advance_to(started + Duration::from_millis(FLUSH_INTERVAL_MS)).await;
    settle().await;
    assert!(
        pool.status().durable_batch_sequence > durable_before,
        "not flushed once flush_interval_ms passed"
    );
    // Durable means it survives losing every unflushed write.
    faulty.power_cut(PowerCutStyle::DropAll).await.unwrap();
    drop(pool);
    let pool = Pool::open(memory, limits(TestHooks::default()))
        .await
        .expect("open");
    let mut read_back = vec![0u8; BLOCK];
    let volume_id = pool.volume_id("data").unwrap();
    pool.read(volume_id, 0, &mut read_back).await.unwrap();
    assert!(read_back == data, "the periodically flushed block was lost");
    assert!(
        real_start.elapsed() < Duration::from_millis(FLUSH_INTERVAL_MS / 2),
        "the test waited for real: {:?}",
        real_start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn the_test_hook_keeps_the_periodic_flush_from_starting() {
    let (_memory, _faulty, pool, started, _data) =
        pool_with_one_write(TestHooks::without_periodic_flush_and_checkpoint()).await;
    let status_before = pool.status();
    advance_to(started + Duration::from_millis(10 * FLUSH_INTERVAL_MS)).await;
    settle().await;
    let status = pool.status();
    assert_eq!(
        status.durable_batch_sequence,
        status_before.durable_batch_sequence
    );
    assert_eq!(
        status.checkpoint_sequence,
        status_before.checkpoint_sequence
    );
}

#[tokio::test]
async fn limits_out_of_range_are_refused_with_the_field_and_its_range() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let zero_interval = PoolLimits {
        flush_interval_ms: 0,
        ..PoolLimits::default()
    };
    let Err(error) = Pool::create(
        memory.clone(),
        options(SEGMENT_BYTES, None),
        zero_interval.clone(),
    )
    .await
    else {
        panic!("a 0 ms flush interval was accepted");
    };
    assert!(
        matches!(
            error,
            EngineError::InvalidLimits(LimitsError::TooSmall {
                field: "flush_interval_ms",
                value: 0,
                minimum: 1
            })
        ),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "invalid pool limits: flush_interval_ms must be at least 1 (got 0)"
    );
    let pool = Pool::create(
        memory.clone(),
        options(SEGMENT_BYTES, None),
        PoolLimits::default(),
    )
    .await
    .expect("create");
    pool.close().await.unwrap();
    drop(pool);
    let no_reads = PoolLimits {
        cleaner_in_flight_reads_max: 0,
        ..PoolLimits::default()
    };
    let Err(error) = Pool::open(memory, no_reads).await else {
        panic!("no cleaner reads in flight was accepted");
    };
    assert!(
        error
            .to_string()
            .contains("cleaner_in_flight_reads_max must be at least 1 (got 0)"),
        "{error}"
    );
}
