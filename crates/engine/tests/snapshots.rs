//! Snapshots and clones in the engine: contents frozen at creation, writes to a
//! volume or a clone never reaching its snapshots or origin, space accounting
//! (referenced and unique bytes, and space coming back when snapshots and clones
//! are deleted), the cleaner moving blocks that many snapshots share, a
//! thousand snapshots and clones in one family surviving a reopen, and bad input.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::sync::Arc;
use std::time::Instant;

use lamina_device::{BlockDevice, MemoryDevice};
mod common;

use lamina_engine::{EngineError, Pool, PoolLimits, PoolOptions, VolumeError};

const BLOCK: usize = 4096;
const SEGMENT_BYTES: u64 = 256 << 10;

fn limits() -> PoolLimits {
    PoolLimits {
        test_hooks: lamina_engine::TestHooks::without_periodic_flush_and_checkpoint(),
        ..PoolLimits::default()
    }
}

async fn new_pool(device_bytes: u64) -> (Arc<MemoryDevice>, Pool) {
    let memory = Arc::new(MemoryDevice::new(device_bytes));
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        force: false,
        flash_region_bytes: None,
        ..PoolOptions::default()
    };
    let pool = Pool::create(memory.clone(), options, limits())
        .await
        .unwrap();
    (memory, pool)
}

async fn read_named(pool: &Pool, name: &str, offset: u64, length: usize) -> Vec<u8> {
    let view = pool.resolve_view(name).unwrap();
    let mut buffer = vec![0u8; length];
    pool.read_view(view, offset, &mut buffer).await.unwrap();
    buffer
}

fn pattern(seed: u8, length: usize) -> Vec<u8> {
    (0..length)
        .map(|index| seed.wrapping_mul(31).wrapping_add((index / 512) as u8) | 1)
        .collect()
}

#[tokio::test]
async fn snapshots_freeze_contents_and_clones_are_independent() {
    let (_, pool) = new_pool(64 << 20).await;
    let volume = pool.create_volume("db", 1 << 20).await.unwrap().volume_id;
    let first = pattern(1, 64 * BLOCK);
    pool.write(volume, 0, &first, false).await.unwrap();
    let snapshot = pool.create_snapshot("db", "monday").await.unwrap();
    assert_eq!(snapshot.full_name, "db@monday");
    assert_eq!(snapshot.referenced_bytes, (64 * BLOCK) as u64);
    assert_eq!(
        snapshot.unique_bytes, 0,
        "everything is shared with the volume"
    );

    // Overwrite half, trim a quarter: the snapshot keeps the old contents.
    let second = pattern(2, 32 * BLOCK);
    pool.write(volume, 0, &second, false).await.unwrap();
    pool.trim(volume, (48 * BLOCK) as u64, (16 * BLOCK) as u64, false)
        .await
        .unwrap();
    assert_eq!(read_named(&pool, "db@monday", 0, 64 * BLOCK).await, first);
    let live = read_named(&pool, "db", 0, 64 * BLOCK).await;
    assert_eq!(&live[..32 * BLOCK], &second[..]);
    assert_eq!(
        &live[32 * BLOCK..48 * BLOCK],
        &first[32 * BLOCK..48 * BLOCK]
    );
    assert!(live[48 * BLOCK..].iter().all(|byte| *byte == 0));

    let snapshot = &pool.list_snapshots(Some("db")).unwrap()[0];
    assert_eq!(
        snapshot.unique_bytes,
        (48 * BLOCK) as u64,
        "overwritten and trimmed blocks belong to the snapshot alone"
    );
    let info = pool.volume_info("db").unwrap();
    assert_eq!(info.allocated_bytes, (48 * BLOCK) as u64);
    assert_eq!(info.unique_bytes, (32 * BLOCK) as u64);
    assert_eq!(info.used_bytes, (32 * BLOCK + 64 * BLOCK) as u64);

    // A clone starts as the snapshot and diverges on its own.
    let clone = pool
        .clone_snapshot("db", "monday", "db-test")
        .await
        .unwrap();
    assert_eq!(clone.origin.as_deref(), Some("db@monday"));
    assert_eq!(clone.unique_bytes, 0);
    pool.write(clone.volume_id, 0, &pattern(3, BLOCK), false)
        .await
        .unwrap();
    assert_eq!(
        read_named(&pool, "db-test", 0, BLOCK).await,
        pattern(3, BLOCK)
    );
    assert_eq!(
        read_named(&pool, "db-test", BLOCK as u64, 63 * BLOCK).await,
        first[BLOCK..]
    );
    assert_eq!(read_named(&pool, "db@monday", 0, 64 * BLOCK).await, first);
    assert_eq!(&read_named(&pool, "db", 0, BLOCK).await, &second[..BLOCK]);

    // Clones of clones.
    pool.create_snapshot("db-test", "t1").await.unwrap();
    let grandchild = pool
        .clone_snapshot("db-test", "t1", "db-test-2")
        .await
        .unwrap();
    assert_eq!(
        read_named(&pool, "db-test-2", 0, 64 * BLOCK).await,
        read_named(&pool, "db-test", 0, 64 * BLOCK).await
    );
    pool.write(
        grandchild.volume_id,
        (5 * BLOCK) as u64,
        &pattern(4, BLOCK),
        false,
    )
    .await
    .unwrap();
    assert_eq!(
        read_named(&pool, "db-test", (5 * BLOCK) as u64, BLOCK).await,
        first[5 * BLOCK..6 * BLOCK]
    );

    // Rollback to the newest snapshot.
    pool.rollback_snapshot("db", "monday").await.unwrap();
    assert_eq!(read_named(&pool, "db", 0, 64 * BLOCK).await, first);
    assert_eq!(pool.volume_info("db").unwrap().unique_bytes, 0);
}

#[tokio::test]
async fn bad_snapshot_operations_are_refused_and_change_nothing() {
    let (_, pool) = new_pool(64 << 20).await;
    let volume = pool.create_volume("db", 1 << 20).await.unwrap().volume_id;
    pool.write(volume, 0, &pattern(1, 8 * BLOCK), false)
        .await
        .unwrap();
    pool.create_snapshot("db", "a").await.unwrap();
    pool.create_snapshot("db", "b").await.unwrap();
    pool.clone_snapshot("db", "a", "child").await.unwrap();
    let before = pool.list_snapshots(None).unwrap();
    let volumes_before = pool.list_volumes();

    let error = pool.create_snapshot("nope", "x").await.unwrap_err();
    assert!(
        matches!(error, EngineError::Volume(VolumeError::NoSuchVolume(_))),
        "{error}"
    );
    let error = pool.create_snapshot("db", "a").await.unwrap_err();
    assert!(
        matches!(
            error,
            EngineError::Volume(VolumeError::SnapshotExists { .. })
        ),
        "{error}"
    );
    for bad in ["", "has space", "a@b", ".hidden", "-dash", &"x".repeat(65)] {
        let error = pool.create_snapshot("db", bad).await.unwrap_err();
        assert!(
            matches!(error, EngineError::Volume(VolumeError::InvalidName { .. })),
            "{bad:?}: {error}"
        );
    }
    let error = pool.delete_snapshot("db", "zzz").await.unwrap_err();
    assert!(
        matches!(
            error,
            EngineError::Volume(VolumeError::NoSuchSnapshot { .. })
        ),
        "{error}"
    );
    let error = pool.delete_snapshot("db", "a").await.unwrap_err();
    assert!(
        matches!(error, EngineError::Volume(VolumeError::HasClones { .. }))
            && error.to_string().contains("child"),
        "{error}"
    );
    let error = pool.delete_volume("db").await.unwrap_err();
    assert!(
        matches!(error, EngineError::Volume(VolumeError::HasClones { .. }))
            && error.to_string().contains("child"),
        "{error}"
    );
    let error = pool.rollback_snapshot("db", "a").await.unwrap_err();
    assert!(
        matches!(
            error,
            EngineError::Volume(VolumeError::NotNewestSnapshot { .. })
        ) && error.to_string().contains('b'),
        "{error}"
    );
    let error = pool.clone_snapshot("db", "b", "child").await.unwrap_err();
    assert!(
        matches!(error, EngineError::Volume(VolumeError::VolumeExists(_))),
        "{error}"
    );
    let error = pool
        .clone_snapshot("db", "nope", "other")
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            EngineError::Volume(VolumeError::NoSuchSnapshot { .. })
        ),
        "{error}"
    );
    let error = pool
        .clone_snapshot("db", "b", "bad name")
        .await
        .unwrap_err();
    assert!(
        matches!(error, EngineError::Volume(VolumeError::InvalidName { .. })),
        "{error}"
    );
    assert!(pool.resolve_view("db@nope").is_err());

    assert_eq!(pool.list_snapshots(None).unwrap(), before);
    assert_eq!(pool.list_volumes(), volumes_before);

    // Once the clone is gone, the snapshot and then the volume can go.
    pool.delete_volume("child").await.unwrap();
    pool.delete_snapshot("db", "a").await.unwrap();
    pool.delete_volume("db").await.unwrap();
    assert!(pool.list_snapshots(None).unwrap().is_empty());
}

/// Deleting snapshots and clones returns their unique blocks to the pool; the
/// cleaner moves blocks shared by many snapshots without changing any of them.
#[tokio::test]
async fn deleting_snapshots_frees_space_and_the_cleaner_moves_shared_blocks() {
    let (_, pool) = new_pool(48 << 20).await;
    let volume = pool.create_volume("db", 4 << 20).await.unwrap().volume_id;
    let blocks = 1024;
    let mut expected: Vec<Vec<u8>> = Vec::new();
    for round in 0..6u8 {
        // Each round rewrites a different half, so each snapshot owns some blocks.
        let start = (round as usize % 2) * blocks / 2;
        pool.write(
            volume,
            (start * BLOCK) as u64,
            &pattern(round, blocks / 2 * BLOCK),
            false,
        )
        .await
        .unwrap();
        pool.create_snapshot("db", &format!("s{round}"))
            .await
            .unwrap();
        expected.push(read_named(&pool, "db", 0, blocks * BLOCK).await);
    }
    pool.clone_snapshot("db", "s2", "clone").await.unwrap();
    let used_with_snapshots = pool.status().used_bytes;

    // Clean everything cleanable, several times, with checkpoints between.
    for _ in 0..4 {
        pool.clean(64).await.unwrap();
        pool.checkpoint().await.unwrap();
        pool.checkpoint().await.unwrap();
    }
    assert!(
        pool.status().cleaner_relocated_blocks > 0,
        "the cleaner moved nothing"
    );
    for (round, contents) in expected.iter().enumerate() {
        assert_eq!(
            &read_named(&pool, &format!("db@s{round}"), 0, blocks * BLOCK).await,
            contents,
            "snapshot s{round} changed after cleaning"
        );
    }
    assert_eq!(
        &read_named(&pool, "clone", 0, blocks * BLOCK).await,
        &expected[2]
    );

    pool.delete_volume("clone").await.unwrap();
    for round in 0..6 {
        pool.delete_snapshot("db", &format!("s{round}"))
            .await
            .unwrap();
    }
    for _ in 0..4 {
        pool.clean(64).await.unwrap();
        pool.checkpoint().await.unwrap();
        pool.checkpoint().await.unwrap();
    }
    let used_after = pool.status().used_bytes;
    // The snapshots alone held 2048 blocks (8 MiB): what the six rounds wrote
    // (12 MiB) minus what the volume still maps (4 MiB).
    assert!(
        used_after + (7 << 20) < used_with_snapshots,
        "deleting snapshots returned too little: {used_with_snapshots} -> {used_after}"
    );
    assert_eq!(
        read_named(&pool, "db", 0, blocks * BLOCK).await,
        expected[5]
    );
}

/// A thousand snapshots and clones in one family: creation, listing, reading,
/// a reopen from a checkpoint (whose body stays small because shared chunks are
/// stored once), and deletion all work; listing stays fast.
#[tokio::test]
async fn a_thousand_snapshots_and_clones_in_one_family() {
    let (memory, pool) = new_pool(256 << 20).await;
    let volume = pool.create_volume("db", 16 << 20).await.unwrap().volume_id;
    pool.write(volume, 0, &pattern(200, 4096 * BLOCK), false)
        .await
        .unwrap();
    let snapshot_count = 800;
    let clone_count = 200;
    for index in 0..snapshot_count {
        // One distinct block per snapshot, spread over the volume's chunks.
        let block = (index * 7) % 4096;
        pool.write(
            volume,
            (block * BLOCK) as u64,
            &pattern(index as u8, BLOCK),
            false,
        )
        .await
        .unwrap();
        pool.create_snapshot("db", &format!("s{index}"))
            .await
            .unwrap();
    }
    // A chain of clones of clones hanging off the middle snapshot.
    let mut origin = ("db".to_string(), "s400".to_string());
    for index in 0..clone_count {
        let name = format!("c{index}");
        let clone = pool
            .clone_snapshot(&origin.0, &origin.1, &name)
            .await
            .unwrap();
        pool.write(
            clone.volume_id,
            (index * BLOCK) as u64,
            &pattern(index as u8 ^ 0x55, BLOCK),
            false,
        )
        .await
        .unwrap();
        pool.create_snapshot(&name, "base").await.unwrap();
        origin = (name, "base".to_string());
    }
    let started = Instant::now();
    let listed = pool.list_snapshots(None).unwrap();
    let list_elapsed = started.elapsed();
    assert_eq!(listed.len(), snapshot_count + clone_count);
    // A generous bound that only a listing walking every block of every
    // snapshot (instead of skipping shared chunks) would exceed.
    assert!(
        list_elapsed.as_secs_f64() < 5.0,
        "listing took {list_elapsed:?}"
    );
    assert_eq!(pool.list_volumes().len(), 1 + clone_count);

    let check = |pool: Pool| async move {
        for index in [0usize, 1, 399, 400, 799] {
            let block = (index * 7) % 4096;
            assert_eq!(
                read_named(
                    &pool,
                    &format!("db@s{index}"),
                    (block * BLOCK) as u64,
                    BLOCK
                )
                .await,
                pattern(index as u8, BLOCK),
                "db@s{index}"
            );
        }
        // The deepest clone sees every ancestor's write and the snapshot's data.
        let deepest = format!("c{}", clone_count - 1);
        for index in [0usize, 57, clone_count - 1] {
            assert_eq!(
                read_named(&pool, &deepest, (index * BLOCK) as u64, BLOCK).await,
                pattern(index as u8 ^ 0x55, BLOCK),
                "{deepest} block {index}"
            );
        }
        let untouched = 4000;
        assert_eq!(
            read_named(&pool, &deepest, (untouched * BLOCK) as u64, BLOCK).await,
            read_named(&pool, "db@s400", (untouched * BLOCK) as u64, BLOCK).await
        );
        pool
    };
    let pool = check(pool).await;
    pool.checkpoint().await.unwrap();
    let body_bytes = common::newest_slot(&memory).1.body_bytes;
    // 4096 mapped blocks plus about a thousand small differences: far below one
    // full copy of the map per snapshot (1000 × 8 chunks × ~5 KiB = 40 MB).
    assert!(
        body_bytes < 2 << 20,
        "checkpoint body is {body_bytes} bytes"
    );
    pool.close().await.unwrap();
    drop(pool);
    let pool = Pool::open(memory.clone() as Arc<dyn BlockDevice>, limits())
        .await
        .unwrap();
    let pool = check(pool).await;
    assert_eq!(
        pool.list_snapshots(None).unwrap().len(),
        snapshot_count + clone_count
    );

    // Delete everything but the volume, clones first (deepest first).
    for index in (0..clone_count).rev() {
        pool.delete_volume(&format!("c{index}")).await.unwrap();
    }
    for index in 0..snapshot_count {
        pool.delete_snapshot("db", &format!("s{index}"))
            .await
            .unwrap();
    }
    assert!(pool.list_snapshots(None).unwrap().is_empty());
    let info = pool.volume_info("db").unwrap();
    assert_eq!(info.used_bytes, info.allocated_bytes);
    assert_eq!(info.allocated_bytes, (4096 * BLOCK) as u64);
}
