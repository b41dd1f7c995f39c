//! A volume's compression setting (issue 44): set at creation and live,
//! it survives a clean restart, a crash (replay of its record), a base
//! checkpoint and an increment, for a plain volume and a clone; a clone
//! starts with its origin volume's codec at clone time, a rollback keeps
//! the volume's current one; a pool that refuses codecs (two tiers) creates
//! no volume for a refused one. These tests prove the setting, not the
//! compression of writes (the write path's tests do).

use std::sync::Arc;

use lamina_device::MemoryDevice;
use lamina_engine::{Codec, EngineError, Pool, PoolLimits, TestHooks, VolumeError};

mod common;
use common::newest_slot;
use common::pools::options;

const SEGMENT_BYTES: u64 = 64 << 10;
const DEVICE_BYTES: u64 = (4 << 20) + 256 * SEGMENT_BYTES;
const VOLUME_BYTES: u64 = 1 << 20;

/// Every flush and checkpoint placed by the test; increments whatever
/// their size, so that a small pool's second checkpoint is one.
fn limits() -> PoolLimits {
    PoolLimits {
        test_hooks: TestHooks {
            reuse_freed_segments_first: false,
            periodic_flush_and_checkpoint_off: true,
            checkpoint_increments_whatever_their_bytes: true,
        },
        dirty_bytes_max: u64::MAX / 2,
        ..PoolLimits::default()
    }
}

fn codec(name: &str) -> Codec {
    name.parse().unwrap()
}

async fn new_pool(memory: &Arc<MemoryDevice>) -> Pool {
    Pool::create(memory.clone(), options(SEGMENT_BYTES, None), limits())
        .await
        .unwrap()
}

/// How the pool is reopened.
#[derive(Clone, Copy, Debug)]
enum Restart {
    /// Closed cleanly (a checkpoint covers everything).
    Clean,
    /// Flushed, then abandoned: the records are replayed.
    Crash,
}

async fn reopen(memory: &Arc<MemoryDevice>, pool: Pool, restart: Restart) -> Pool {
    match restart {
        Restart::Clean => pool.close().await.unwrap(),
        Restart::Crash => {
            pool.flush().await.unwrap();
            pool.abandon();
        }
    }
    drop(pool);
    Pool::open(memory.clone(), limits()).await.unwrap()
}

/// Each volume's codec, by name, as `volume list` shows it.
fn codecs(pool: &Pool) -> Vec<(String, String)> {
    pool.list_volumes()
        .into_iter()
        .map(|volume| (volume.name, volume.compression.to_string()))
        .collect()
}

fn expected(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(name, codec)| (name.to_string(), codec.to_string()))
        .collect()
}

/// Volumes `plain` (off), `db` (lz4 at creation, snapshot `s`), `logs`
/// (zstd:7 set live) and `copy` (cloned from db@s while db had lz4), then
/// db set to zstd:19: the clone keeps lz4.
async fn build_catalog(pool: &Pool) {
    pool.create_volume("plain", VOLUME_BYTES).await.unwrap();
    let db = pool
        .create_volume_with_compression("db", VOLUME_BYTES, codec("lz4"))
        .await
        .unwrap();
    assert_eq!(db.compression, Codec::Lz4);
    pool.create_volume("logs", VOLUME_BYTES).await.unwrap();
    let logs = pool
        .set_volume_compression("logs", codec("zstd:7"))
        .await
        .unwrap();
    assert_eq!(logs.compression, codec("zstd:7"));
    pool.create_snapshot("db", "s").await.unwrap();
    let copy = pool.clone_snapshot("db", "s", "copy").await.unwrap();
    assert_eq!(
        copy.compression,
        Codec::Lz4,
        "a clone starts with its origin's codec"
    );
    pool.set_volume_compression("db", codec("zstd:19"))
        .await
        .unwrap();
}

const CATALOG: [(&str, &str); 4] = [
    ("plain", "off"),
    ("db", "zstd:19"),
    ("logs", "zstd:7"),
    ("copy", "lz4"),
];

#[tokio::test(flavor = "current_thread")]
async fn codecs_survive_a_clean_restart_and_a_crash_replaying_their_records() {
    for restart in [Restart::Clean, Restart::Crash] {
        let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
        let pool = new_pool(&memory).await;
        build_catalog(&pool).await;
        assert_eq!(codecs(&pool), expected(&CATALOG), "{restart:?}: live");
        let pool = reopen(&memory, pool, restart).await;
        assert_eq!(codecs(&pool), expected(&CATALOG), "{restart:?}: reopened");
        // Set back to off after the restart: replayed too.
        pool.set_volume_compression("logs", Codec::Off)
            .await
            .unwrap();
        let pool = reopen(&memory, pool, Restart::Crash).await;
        let mut changed = CATALOG;
        changed[2] = ("logs", "off");
        assert_eq!(codecs(&pool), expected(&changed), "{restart:?}: set off");
        assert_eq!(
            pool.volume_tier_stats("db").unwrap().compression,
            codec("zstd:19")
        );
        pool.close().await.unwrap();
    }
}

#[tokio::test(flavor = "current_thread")]
async fn codecs_survive_a_base_checkpoint_and_an_increment() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = new_pool(&memory).await;
    build_catalog(&pool).await;
    pool.checkpoint_base().await.unwrap();
    // Nothing after the base: the codecs come from its table alone.
    let pool = reopen(&memory, pool, Restart::Crash).await;
    assert_eq!(codecs(&pool), expected(&CATALOG), "from the base");

    pool.checkpoint().await.unwrap();
    assert!(
        newest_slot(&memory).1.earlier_links.is_empty(),
        "a base after open"
    );
    pool.set_volume_compression("plain", codec("zstd:1"))
        .await
        .unwrap();
    pool.set_volume_compression("copy", Codec::Off)
        .await
        .unwrap();
    pool.checkpoint().await.unwrap();
    assert_eq!(
        newest_slot(&memory).1.earlier_links.len(),
        1,
        "the second checkpoint is an increment"
    );
    let pool = reopen(&memory, pool, Restart::Crash).await;
    let changed = [
        ("plain", "zstd:1"),
        ("db", "zstd:19"),
        ("logs", "zstd:7"),
        ("copy", "off"),
    ];
    assert_eq!(codecs(&pool), expected(&changed), "from the increment");
    pool.close().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_rollback_keeps_the_current_codec_and_unknown_volumes_are_refused() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = new_pool(&memory).await;
    build_catalog(&pool).await;
    let rolled_back = pool.rollback_snapshot("db", "s").await.unwrap();
    assert_eq!(rolled_back.compression, codec("zstd:19"));
    let pool = reopen(&memory, pool, Restart::Crash).await;
    assert_eq!(
        pool.volume_info("db").unwrap().compression,
        codec("zstd:19")
    );
    let refused = pool.set_volume_compression("nothing", Codec::Lz4).await;
    assert!(
        matches!(
            refused,
            Err(EngineError::Volume(VolumeError::NoSuchVolume(ref name))) if name == "nothing"
        ),
        "{refused:?}"
    );
    // A volume created again under a deleted one's name starts off.
    pool.delete_volume("logs").await.unwrap();
    let logs = pool.create_volume("logs", VOLUME_BYTES).await.unwrap();
    assert_eq!(logs.compression, Codec::Off);
    pool.close().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_pool_that_refuses_codecs_creates_no_volume_and_keeps_the_codec_off() {
    const FLASH_BYTES: u64 = (4 << 20) + 64 * SEGMENT_BYTES;
    let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let capacity = Arc::new(MemoryDevice::new((1 << 20) + 128 * SEGMENT_BYTES));
    let device = Arc::new(lamina_device::ConcatenatedDevice::new(flash, capacity));
    let pool = Pool::create(device, options(SEGMENT_BYTES, Some(FLASH_BYTES)), limits())
        .await
        .unwrap();
    let refused = pool
        .create_volume_with_compression("db", VOLUME_BYTES, Codec::Lz4)
        .await;
    assert!(
        matches!(
            refused,
            Err(EngineError::Volume(
                VolumeError::CompressionUnsupported { .. }
            ))
        ),
        "{refused:?}"
    );
    assert!(
        pool.list_volumes().is_empty(),
        "a refused codec creates nothing"
    );
    pool.create_volume_with_compression("db", VOLUME_BYTES, Codec::Off)
        .await
        .unwrap();
    let refused = pool.set_volume_compression("db", codec("zstd:3")).await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(codecs(&pool), expected(&[("db", "off")]));
    pool.close().await.unwrap();
}
