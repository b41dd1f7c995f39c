//! The memory cache warmed after a restart (issue 20, decision 0025): the
//! cache's contents recorded by logical identity, handed back after the pool
//! opens again and loaded in the background. What must hold: after a clean
//! close and a warm-up the hot set is served from memory (the cache's hit
//! counter) with the right data; and a record gone stale before a crash
//! (blocks overwritten, trimmed, a volume deleted) never makes a read return
//! anything but the current data.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;
use common::blocks::block_contents;

use std::sync::Arc;
use std::time::Duration;

use lamina_device::MemoryDevice;
use lamina_engine::{
    BLOCK_SIZE_BYTES, CacheContents, CacheWarmupState, Pool, PoolLimits, PoolOptions, View,
};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SEGMENT_BYTES: u64 = 256 << 10;
const DEVICE_BYTES: u64 = 64 << 20;
/// Blocks written: four times the cache.
const WRITTEN_BLOCKS: u64 = 256;
const CACHE_BLOCKS: u64 = 64;
/// The hot set: blocks the cache holds after the writes, read again before
/// the restart.
const HOT_BLOCKS: u64 = 32;
const WARMUP_WAIT_MS_MAX: u64 = 10_000;

/// A cache that holds both volumes of the crash test whole.
const LARGE_CACHE_BLOCKS: u64 = 4 * WRITTEN_BLOCKS;

fn limits(cache_blocks: u64) -> PoolLimits {
    PoolLimits {
        memory_cache_bytes: cache_blocks * BLOCK_SIZE_BYTES,
        ..PoolLimits::default()
    }
}

async fn create_pool(memory: &Arc<MemoryDevice>, cache_blocks: u64) -> Pool {
    Pool::create(
        memory.clone(),
        PoolOptions {
            segment_size_bytes: SEGMENT_BYTES,
            ..PoolOptions::default()
        },
        limits(cache_blocks),
    )
    .await
    .unwrap()
}

/// Writes `WRITTEN_BLOCKS` blocks of generation 1 to a new volume, flushes,
/// and reads its hot set twice: `HOT_BLOCKS` of the blocks the cache holds
/// then (batches complete in any order, so which of the last blocks written
/// stayed cached varies). Every hot read is a hit. Returns the volume's id and
/// its hot set.
async fn fill_and_read_hot_set(pool: &Pool, name: &str) -> (u32, Vec<u64>) {
    pool.create_volume(name, WRITTEN_BLOCKS * BLOCK_SIZE_BYTES)
        .await
        .unwrap();
    let volume_id = pool.volume_id(name).unwrap();
    for logical_block in 0..WRITTEN_BLOCKS {
        pool.write(
            volume_id,
            logical_block * BLOCK_SIZE_BYTES,
            &block_contents(logical_block, 1),
            false,
        )
        .await
        .unwrap();
    }
    pool.flush().await.unwrap();
    let mut hot_set: Vec<u64> = pool
        .cache_contents()
        .blocks
        .iter()
        .filter(|block| block.view == View::Volume(volume_id))
        .map(|block| block.logical_block)
        .collect();
    hot_set.sort_unstable();
    hot_set.drain(..hot_set.len() - HOT_BLOCKS as usize);
    for _ in 0..2 {
        let hits = hot_set_hits(pool, volume_id, &hot_set, |_| 1).await;
        assert_eq!(hits, HOT_BLOCKS, "the hot set is cached");
    }
    (volume_id, hot_set)
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

/// Reads the hot set; returns how many of its reads were cache hits.
async fn hot_set_hits(
    pool: &Pool,
    volume_id: u32,
    hot_set: &[u64],
    generation_of: impl Fn(u64) -> u8,
) -> u64 {
    let hits_before = pool.status().memory_cache.hits;
    for &logical_block in hot_set {
        let mut buffer = vec![0u8; BLOCK];
        pool.read(volume_id, logical_block * BLOCK_SIZE_BYTES, &mut buffer)
            .await
            .unwrap();
        let generation = generation_of(logical_block);
        let expected = match generation {
            0 => vec![0u8; BLOCK],
            generation => block_contents(logical_block, generation),
        };
        assert!(
            buffer == expected,
            "block {logical_block} does not read as generation {generation}"
        );
    }
    pool.status().memory_cache.hits - hits_before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_restart_serves_the_hot_set_from_memory_after_the_warm_up() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = create_pool(&memory, CACHE_BLOCKS).await;
    let (volume_id, hot_set) = fill_and_read_hot_set(&pool, "hot").await;
    let contents = pool.cache_contents();
    // A few slots hold batch blocks that are no volume's (control records).
    let listed = contents.blocks.len() as u64;
    assert!(
        (CACHE_BLOCKS - 4..=CACHE_BLOCKS).contains(&listed),
        "{listed} blocks listed"
    );
    // Referenced blocks lead the record: the hot set comes first.
    let leading: std::collections::HashSet<u64> = contents.blocks[..HOT_BLOCKS as usize]
        .iter()
        .map(|block| {
            assert_eq!(block.view, View::Volume(volume_id));
            block.logical_block
        })
        .collect();
    assert_eq!(leading, hot_set.iter().copied().collect());
    pool.close().await.unwrap();
    let record = contents.to_bytes();

    // Without the record, the hot set is read from the device.
    let cold = Pool::open(memory.clone(), limits(CACHE_BLOCKS))
        .await
        .unwrap();
    assert_eq!(cold.cache_warmup_status().state, CacheWarmupState::None);
    assert_eq!(hot_set_hits(&cold, volume_id, &hot_set, |_| 1).await, 0);
    cold.close().await.unwrap();

    let pool = Pool::open(memory.clone(), limits(CACHE_BLOCKS))
        .await
        .unwrap();
    assert_eq!(pool.status().memory_cache.cached_bytes, 0);
    pool.warm_cache(CacheContents::from_bytes(&record).unwrap());
    wait_for_warmup(&pool).await;
    let status = pool.cache_warmup_status();
    assert_eq!(status.blocks_listed, listed);
    assert_eq!(status.blocks_to_load, listed);
    assert_eq!(status.blocks_loaded, listed, "{status:?}");
    assert_eq!(
        hot_set_hits(&pool, volume_id, &hot_set, |_| 1).await,
        HOT_BLOCKS
    );
    // One warm-up per opening.
    pool.warm_cache(contents);
    assert_eq!(pool.cache_warmup_status().blocks_loaded, listed);
    pool.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_record_after_a_crash_never_serves_old_data() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = create_pool(&memory, LARGE_CACHE_BLOCKS).await;
    let (volume_id, hot_set) = fill_and_read_hot_set(&pool, "hot").await;
    let (doomed_id, _) = fill_and_read_hot_set(&pool, "doomed").await;
    // The record names blocks of both volumes.
    let stale = pool.cache_contents();
    assert!(
        stale
            .blocks
            .iter()
            .any(|block| block.view == View::Volume(doomed_id))
    );
    assert!(
        stale
            .blocks
            .iter()
            .any(|block| block.view == View::Volume(volume_id))
    );
    // A snapshot keeps the old contents mapped (on the device, with their
    // checksums): only the volume's map can tell they are no longer its own.
    pool.create_snapshot("hot", "before").await.unwrap();
    let generation_of = move |logical_block: u64| match logical_block % 4 {
        0 => 2, // overwritten
        1 => 0, // trimmed
        _ => 1, // unchanged
    };
    for &logical_block in &hot_set {
        let offset = logical_block * BLOCK_SIZE_BYTES;
        match generation_of(logical_block) {
            0 => pool
                .trim(volume_id, offset, BLOCK_SIZE_BYTES, false)
                .await
                .unwrap(),
            2 => pool
                .write(volume_id, offset, &block_contents(logical_block, 2), false)
                .await
                .unwrap(),
            _ => {}
        }
    }
    pool.delete_volume("doomed").await.unwrap();
    pool.flush().await.unwrap();
    pool.flush_marker_written().await;
    // The crash: nothing closes, the record is never rewritten.
    pool.abandon();
    drop(pool);

    let pool = Pool::open(memory.clone(), limits(LARGE_CACHE_BLOCKS))
        .await
        .unwrap();
    pool.warm_cache(stale.clone());
    wait_for_warmup(&pool).await;
    let status = pool.cache_warmup_status();
    assert_eq!(status.blocks_listed, stale.blocks.len() as u64);
    assert!(
        status.blocks_to_load < status.blocks_listed,
        "the deleted volume's and the trimmed blocks resolve to nothing: {status:?}"
    );
    // Every read returns the current data; trimmed blocks read zeros. The
    // overwritten blocks were loaded too, with their new contents.
    let mapped = hot_set
        .iter()
        .filter(|block| generation_of(**block) != 0)
        .count();
    assert_eq!(
        hot_set_hits(&pool, volume_id, &hot_set, generation_of).await,
        mapped as u64
    );
    assert!(pool.volume_id("doomed").is_err());
    // The snapshot still reads the old contents.
    let snapshot = pool.resolve_view("hot@before").unwrap();
    for &logical_block in &hot_set {
        let mut buffer = vec![0u8; BLOCK];
        pool.read_view(snapshot, logical_block * BLOCK_SIZE_BYTES, &mut buffer)
            .await
            .unwrap();
        assert!(buffer == block_contents(logical_block, 1));
    }
    pool.close().await.unwrap();
}

/// A compressing volume (issue 44, decisions 0070 and 0074): the cache holds
/// the device blocks its fragments are packed in; the record names each by a
/// fragment that starts in it, and the warm-up loads the blocks that fragment
/// touches, so that after a clean restart the listed blocks are hits again
/// and read back as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_warms_the_blocks_compressed_fragments_are_packed_in() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = create_pool(&memory, CACHE_BLOCKS).await;
    let volume_id = pool
        .create_volume_with_compression(
            "packed",
            WRITTEN_BLOCKS * BLOCK_SIZE_BYTES,
            "lz4".parse().unwrap(),
        )
        .await
        .unwrap()
        .volume_id;
    let bytes = common::machine_files::bytes_of_files(
        &["/usr/share/perl5", "/usr/share/perl"],
        WRITTEN_BLOCKS as usize * BLOCK,
    );
    assert!(
        bytes.len() >= WRITTEN_BLOCKS as usize * BLOCK,
        "not enough files"
    );
    let blocks: Vec<&[u8]> = bytes.chunks_exact(BLOCK).collect();
    for logical_block in 0..WRITTEN_BLOCKS {
        pool.write(
            volume_id,
            logical_block * BLOCK_SIZE_BYTES,
            blocks[logical_block as usize],
            false,
        )
        .await
        .unwrap();
    }
    pool.flush().await.unwrap();
    let contents = pool.cache_contents();
    let listed: Vec<u64> = contents
        .blocks
        .iter()
        .filter(|block| block.view == View::Volume(volume_id))
        .map(|block| block.logical_block)
        .collect();
    let fragments = listed
        .iter()
        .filter(|block| {
            pool.location_of(volume_id, **block)
                .is_some_and(|location| location.is_fragment())
        })
        .count();
    assert!(
        fragments > 16,
        "{fragments} of {} listed are fragments",
        listed.len()
    );
    pool.close().await.unwrap();

    let read_listed = |pool: Pool| {
        let listed = listed.clone();
        let blocks = &blocks;
        async move {
            let hits_before = pool.status().memory_cache.hits;
            let mut buffer = vec![0u8; BLOCK];
            for &logical_block in &listed {
                pool.read(volume_id, logical_block * BLOCK_SIZE_BYTES, &mut buffer)
                    .await
                    .unwrap();
                assert!(
                    buffer[..] == *blocks[logical_block as usize],
                    "block {logical_block} differs"
                );
            }
            let hits = pool.status().memory_cache.hits - hits_before;
            (pool, hits)
        }
    };
    let cold = Pool::open(memory.clone(), limits(CACHE_BLOCKS))
        .await
        .unwrap();
    let (cold, cold_hits) = read_listed(cold).await;
    cold.close().await.unwrap();

    let pool = Pool::open(memory.clone(), limits(CACHE_BLOCKS))
        .await
        .unwrap();
    pool.warm_cache(contents.clone());
    wait_for_warmup(&pool).await;
    let status = pool.cache_warmup_status();
    assert!(
        status.blocks_loaded + 4 >= contents.blocks.len() as u64,
        "{status:?}"
    );
    let (pool, warm_hits) = read_listed(pool).await;
    // Every listed block is found in memory (a fragment that straddles
    // looks up two blocks).
    assert!(
        warm_hits >= listed.len() as u64 && warm_hits > cold_hits,
        "{warm_hits} hits warm, {cold_hits} cold, {} listed",
        listed.len()
    );
    pool.close().await.unwrap();
}
