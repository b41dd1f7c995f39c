//! Space management: a pool written far beyond its capacity by overwrites keeps
//! working because the cleaner reclaims dead blocks; a pool filled with live data
//! fails writes with NoSpace, keeps every earlier write, and accepts writes again
//! once data is trimmed or a volume is deleted.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::sync::Arc;

use lamina_device::MemoryDevice;
use lamina_engine::{CleanerState, EngineError, IoError, Pool, PoolLimits, PoolOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
const SEGMENT_BYTES: u64 = 256 << 10;

async fn small_pool(segment_count: u64) -> Pool {
    let device = Arc::new(MemoryDevice::new((4 << 20) + segment_count * SEGMENT_BYTES));
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        force: false,
        flash_region_bytes: None,
        ..PoolOptions::default()
    };
    Pool::create(device, options, PoolLimits::default())
        .await
        .unwrap()
}

fn pattern(block: u64, generation: u32) -> Vec<u8> {
    let mut data = vec![0u8; BLOCK];
    data[..8].copy_from_slice(&block.to_le_bytes());
    data[8..12].copy_from_slice(&generation.to_le_bytes());
    data[12..].fill((block as u8) ^ (generation as u8));
    data
}

#[tokio::test]
async fn overwrites_far_beyond_capacity_are_reclaimed_by_the_cleaner() {
    let pool = small_pool(64).await; // 16 MiB of segments
    let volume_blocks: u64 = 1536; // 6 MiB live: under half the pool
    pool.create_volume("hot", volume_blocks * BLOCK as u64)
        .await
        .unwrap();
    let volume = pool.volume_id("hot").unwrap();
    let mut generations = vec![0u32; volume_blocks as usize];
    let mut rng = SmallRng::seed_from_u64(5);
    // 20,000 random 4 KiB overwrites: 80 MiB through a 16 MiB pool.
    for step in 0..20_000u32 {
        let block = rng.random_range(0..volume_blocks);
        generations[block as usize] = step + 1;
        pool.write(
            volume,
            block * BLOCK as u64,
            &pattern(block, step + 1),
            false,
        )
        .await
        .unwrap_or_else(|error| panic!("write {step} failed: {error}"));
    }
    pool.flush().await.unwrap();
    for block in 0..volume_blocks {
        let mut data = vec![0u8; BLOCK];
        pool.read(volume, block * BLOCK as u64, &mut data)
            .await
            .unwrap();
        let expected = if generations[block as usize] == 0 {
            vec![0u8; BLOCK]
        } else {
            pattern(block, generations[block as usize])
        };
        assert!(data == expected, "block {block}");
    }
    let status = pool.status();
    assert!(
        status.cleaner_relocated_blocks > 0,
        "the cleaner ran: {status:?}"
    );
    assert!(status.write_amplification.expect("clients wrote") >= 1.0);
    pool.close().await.unwrap();
}

#[tokio::test]
async fn a_full_pool_says_no_space_keeps_data_and_recovers_after_trim() {
    let pool = small_pool(32).await; // 8 MiB of segments
    pool.create_volume("big", 64 << 20).await.unwrap(); // thin over-commit
    let volume = pool.volume_id("big").unwrap();
    let mut written = 0u64;
    let error = loop {
        match pool
            .write(volume, written * BLOCK as u64, &pattern(written, 1), false)
            .await
        {
            Ok(()) => written += 1,
            Err(error) => break error,
        }
        assert!(written < 16384, "the pool never filled");
    };
    assert!(
        matches!(error, EngineError::Io(IoError::NoSpace)),
        "{error}"
    );
    assert!(
        written > 256,
        "a useful amount fit before the pool filled: {written}"
    );
    pool.flush().await.unwrap();
    // Status tells it as it is: all the space clients can fill is used, the
    // highest warning is in force, and the cleaner is short of space.
    let status = pool.status();
    assert_eq!(status.free_bytes, 0, "{status:?}");
    assert_eq!(status.used_percent, 100.0, "{status:?}");
    assert_eq!(status.usage_warning_percent, 90, "{status:?}");
    assert_eq!(status.cleaner_state, CleanerState::Short, "{status:?}");
    assert!(status.cleaner_pressure > 0.0, "{status:?}");
    for block in 0..written {
        let mut data = vec![0u8; BLOCK];
        pool.read(volume, block * BLOCK as u64, &mut data)
            .await
            .unwrap();
        assert!(
            data == pattern(block, 1),
            "block {block} survived the full pool"
        );
    }
    // Trim half, and writes succeed again.
    pool.trim(volume, 0, (written / 2) * BLOCK as u64, false)
        .await
        .unwrap();
    // Once checkpoints free the trimmed segments, the warning is lifted and
    // the cleaner has nothing to do.
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    let status = pool.status();
    assert!(status.used_percent < 80.0, "{status:?}");
    assert_eq!(status.usage_warning_percent, 0, "{status:?}");
    assert_eq!(status.cleaner_state, CleanerState::Idle, "{status:?}");
    for block in 0..written / 4 {
        pool.write(volume, block * BLOCK as u64, &pattern(block, 2), false)
            .await
            .unwrap_or_else(|error| panic!("write after trim failed: {error}"));
    }
    pool.flush().await.unwrap();
    let mut data = vec![0u8; BLOCK];
    pool.read(volume, (written - 1) * BLOCK as u64, &mut data)
        .await
        .unwrap();
    assert!(data == pattern(written - 1, 1));
    // Deleting the volume frees everything: once checkpoints free its
    // segments, only the open log heads are in use, and a new volume takes
    // 3 MiB, most of what this pool holds for clients (32 segments less the
    // reserves, 13 here, and the open heads: 3.75 MiB). 4 MiB, more than
    // that, fit only when the paced cleaner's timing left the reserve
    // unspent (it failed at block 969 of 1024 in 4 of 250 runs on a loaded
    // machine, before and after decision 0048).
    pool.delete_volume("big").await.unwrap();
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    let status = pool.status();
    assert!(status.used_bytes < 2 << 20, "{status:?}");
    pool.create_volume("again", 4 << 20).await.unwrap();
    let again = pool.volume_id("again").unwrap();
    let again_blocks = (3 << 20) / BLOCK as u64;
    for block in 0..again_blocks {
        pool.write(again, block * BLOCK as u64, &pattern(block, 3), false)
            .await
            .unwrap_or_else(|error| panic!("block {block} after the delete: {error}"));
    }
    pool.flush().await.unwrap();
    let mut data = vec![0u8; BLOCK];
    pool.read(again, (again_blocks - 1) * BLOCK as u64, &mut data)
        .await
        .unwrap();
    assert!(data == pattern(again_blocks - 1, 3));
    pool.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_pool_frees_trimmed_segments_in_the_background() {
    let device = Arc::new(MemoryDevice::new((4 << 20) + 64 * SEGMENT_BYTES));
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        force: false,
        flash_region_bytes: None,
        ..PoolOptions::default()
    };
    let limits = PoolLimits {
        flush_interval_ms: 20,
        checkpoint_interval_ms: 50,
        ..PoolLimits::default()
    };
    let pool = Pool::create(device, options, limits).await.unwrap();
    pool.create_volume("v", 8 << 20).await.unwrap();
    let volume = pool.volume_id("v").unwrap();
    for block in 0..1024u64 {
        pool.write(volume, block * BLOCK as u64, &pattern(block, 1), false)
            .await
            .unwrap();
    }
    pool.flush().await.unwrap();
    pool.checkpoint().await.unwrap();
    let used_full = pool.status().used_bytes;
    pool.trim(volume, 0, 1024 * BLOCK as u64, true)
        .await
        .unwrap();
    // No more client I/O: only background checkpoints can free the dead segments.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let status = pool.status();
        if status.dead_segment_count == 0 && status.used_bytes + (3 << 20) <= used_full {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "dead segments never freed: {status:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    pool.close().await.unwrap();
}
