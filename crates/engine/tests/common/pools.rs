//! Pool options and limits the engine's tests share, and waits on what
//! background work does.

use lamina_engine::{Pool, PoolLimits, PoolOptions, TestHooks};

/// One tier of `segment_size_bytes` segments, or with `flash_region_bytes`
/// a flash tier on the device's first bytes and a capacity tier on the rest.
/// Refuses a device that is not empty.
pub fn options(segment_size_bytes: u64, flash_region_bytes: Option<u64>) -> PoolOptions {
    PoolOptions {
        segment_size_bytes,
        force: false,
        flash_region_bytes,
        ..PoolOptions::default()
    }
}

/// Limits of a test that decides every flush and checkpoint itself: no
/// periodic ones, no flush forced by dirty data, and no memory cache, so
/// that reads reach the device.
pub fn quiet_limits() -> PoolLimits {
    PoolLimits {
        memory_cache_bytes: 0,
        test_hooks: TestHooks::without_periodic_flush_and_checkpoint(),
        dirty_bytes_max: u64::MAX / 2,
        ..PoolLimits::default()
    }
}

/// Limits of a test that checkpoints itself (no periodic flush or
/// checkpoint, no flush forced by dirty data), with the freed segments
/// reused first when `reuse_freed_segments_first`, so that reuse happens
/// within a few writes.
pub fn manual_checkpoint_limits(reuse_freed_segments_first: bool) -> PoolLimits {
    PoolLimits {
        test_hooks: TestHooks {
            reuse_freed_segments_first,
            periodic_flush_and_checkpoint_off: true,
            checkpoint_increments_whatever_their_bytes: false,
        },
        dirty_bytes_max: u64::MAX / 2,
        ..PoolLimits::default()
    }
}

/// Waits, 30 s at most, until the demoter has freed `free_bytes_min` of flash.
pub async fn wait_for_free_flash(pool: &Pool, free_bytes_min: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while pool.status().flash.free_bytes < free_bytes_min {
        assert!(
            std::time::Instant::now() < deadline,
            "the demoter did not free flash: {:?}",
            pool.status().flash
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
