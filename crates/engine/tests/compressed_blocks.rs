//! Compressed blocks end to end in the engine (issue 44, decision 0070):
//! a volume that compresses stores what compresses as fragments packed in
//! its batches and the rest whole; every block reads back exactly, from
//! the open batch, from the device, after a crash (replay), after a clean
//! restart (checkpoint) and after the cleaner moved the fragments; space is
//! counted in units, and overwrites release them. The data is this
//! machine's own files (text and binaries) and random bytes, not patterns
//! made to compress.

use std::sync::Arc;

use lamina_device::MemoryDevice;
use lamina_engine::{Codec, Pool, PoolLimits, TestHooks};
use rand::{Rng, SeedableRng, rngs::SmallRng};

mod common;
use common::pools::options;

const BLOCK: usize = 4096;
const SEGMENT_BYTES: u64 = 256 << 10;
const DEVICE_BYTES: u64 = (4 << 20) + 128 * SEGMENT_BYTES;
const VOLUME_BLOCKS: usize = 1024;
/// Blocks skipped at most before a test's blocks start, by seed.
const SKIPPED_BLOCKS_MAX: usize = 64;
/// Units of 16 bytes in a block.
const UNITS_PER_BLOCK: u64 = 256;

fn limits() -> PoolLimits {
    PoolLimits {
        memory_cache_bytes: 0,
        test_hooks: TestHooks {
            reuse_freed_segments_first: true,
            periodic_flush_and_checkpoint_off: true,
            checkpoint_increments_whatever_their_bytes: false,
        },
        dirty_bytes_max: u64::MAX / 2,
        ..PoolLimits::default()
    }
}

/// `count` blocks of this machine's files (Perl modules and
/// executables, in directory order), every fifth block random instead.
fn real_blocks(count: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut bytes = Vec::new();
    for directory in ["/usr/share/perl5", "/usr/share/perl", "/usr/bin"] {
        let mut entries: Vec<_> = walk(std::path::Path::new(directory));
        entries.sort();
        for path in entries {
            if let Ok(contents) = std::fs::read(&path) {
                bytes.extend_from_slice(&contents);
            }
            if bytes.len() >= (count + SKIPPED_BLOCKS_MAX) * BLOCK {
                break;
            }
        }
    }
    assert!(
        bytes.len() >= (count + SKIPPED_BLOCKS_MAX) * BLOCK,
        "not enough files on this machine"
    );
    let mut rng = SmallRng::seed_from_u64(seed);
    let blocks: Vec<Vec<u8>> = bytes
        .chunks_exact(BLOCK)
        .skip(rng.random_range(0..SKIPPED_BLOCKS_MAX))
        .take(count)
        .enumerate()
        .map(|(index, block)| {
            if index % 5 == 4 {
                let mut random = vec![0u8; BLOCK];
                rng.fill(&mut random[..]);
                random
            } else {
                block.to_vec()
            }
        })
        .collect();
    assert_eq!(blocks.len(), count);
    blocks
}

fn walk(directory: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(directory) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => found.extend(walk(&path)),
            Ok(kind) if kind.is_file() => found.push(path),
            _ => {}
        }
    }
    found
}

async fn write_all(pool: &Pool, volume_id: u32, blocks: &[Vec<u8>]) {
    for (index, block) in blocks.iter().enumerate() {
        pool.write(volume_id, (index * BLOCK) as u64, block, false)
            .await
            .unwrap();
    }
}

async fn check_all(pool: &Pool, volume_id: u32, blocks: &[Vec<u8>], when: &str) {
    // Single blocks and a long read across many fragments and whole blocks.
    let mut all = vec![0u8; blocks.len() * BLOCK];
    pool.read(volume_id, 0, &mut all).await.unwrap();
    for (index, block) in blocks.iter().enumerate() {
        assert!(
            all[index * BLOCK..(index + 1) * BLOCK] == block[..],
            "{when}: block {index} differs"
        );
    }
    let mut one = vec![0u8; 1000];
    pool.read(volume_id, 3 * BLOCK as u64 + 100, &mut one)
        .await
        .unwrap();
    assert_eq!(one[..], blocks[3][100..1100], "{when}: a partial read");
}

/// Live bytes the segment table counts, in units of 16 bytes.
fn live_units(pool: &Pool) -> u64 {
    pool.segment_table()
        .segments
        .iter()
        .map(|segment| u64::from(segment.live_units))
        .sum()
}

async fn new_pool(memory: &Arc<MemoryDevice>) -> Pool {
    Pool::create(memory.clone(), options(SEGMENT_BYTES, None), limits())
        .await
        .unwrap()
}

async fn compressing_volume(pool: &Pool, codec: &str) -> u32 {
    let codec: Codec = codec.parse().unwrap();
    pool.create_volume_with_compression("data", (VOLUME_BLOCKS * BLOCK) as u64, codec)
        .await
        .unwrap()
        .volume_id
}

#[tokio::test]
async fn compressed_blocks_read_back_from_memory_device_replay_and_checkpoint() {
    for codec in ["lz4", "zstd:1"] {
        let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
        let pool = new_pool(&memory).await;
        let volume_id = compressing_volume(&pool, codec).await;
        let blocks = real_blocks(VOLUME_BLOCKS / 2, 1);
        write_all(&pool, volume_id, &blocks).await;
        // Some of it still in open batches: read from memory.
        check_all(&pool, volume_id, &blocks, "before the flush").await;
        pool.flush().await.unwrap();
        check_all(&pool, volume_id, &blocks, "from the device").await;
        let units = live_units(&pool);
        let whole_units = blocks.len() as u64 * UNITS_PER_BLOCK;
        assert!(
            units < whole_units * 4 / 5,
            "{codec}: {units} live units for {whole_units} written: little was compressed"
        );
        // A crash: the flushed batches are replayed.
        pool.abandon();
        let pool = Pool::open(memory.clone(), limits()).await.unwrap();
        check_all(&pool, volume_id, &blocks, "after replay").await;
        assert_eq!(live_units(&pool), units, "{codec}: units after replay");
        // A clean restart: the checkpoint holds the fragments' locations.
        pool.close().await.unwrap();
        let pool = Pool::open(memory.clone(), limits()).await.unwrap();
        check_all(&pool, volume_id, &blocks, "after a clean restart").await;
        assert_eq!(live_units(&pool), units, "{codec}: units after a restart");
        pool.close().await.unwrap();
    }
}

#[tokio::test]
async fn overwrites_release_units_and_the_cleaner_moves_fragments_as_they_are() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = new_pool(&memory).await;
    let volume_id = compressing_volume(&pool, "lz4").await;
    let first = real_blocks(VOLUME_BLOCKS / 2, 2);
    write_all(&pool, volume_id, &first).await;
    pool.flush().await.unwrap();
    // Overwrite every other block with other real data: half of the
    // first version dies, scattered over its segments.
    let second = real_blocks(VOLUME_BLOCKS / 2, 3);
    let mut expected = first.clone();
    for index in (0..expected.len()).step_by(2) {
        expected[index] = second[index].clone();
        pool.write(volume_id, (index * BLOCK) as u64, &second[index], false)
            .await
            .unwrap();
    }
    pool.flush().await.unwrap();
    check_all(&pool, volume_id, &expected, "after the overwrites").await;
    let units_before = live_units(&pool);
    let moved = pool.clean(64).await.unwrap();
    assert!(moved > 0, "the cleaner took no victim");
    pool.flush().await.unwrap();
    check_all(&pool, volume_id, &expected, "after cleaning").await;
    assert_eq!(
        live_units(&pool),
        units_before,
        "moving fragments as they are keeps their units"
    );
    // Replay of the relocations, then a checkpoint's view of them.
    pool.abandon();
    let pool = Pool::open(memory.clone(), limits()).await.unwrap();
    check_all(&pool, volume_id, &expected, "after cleaning and replay").await;
    pool.checkpoint().await.unwrap();
    pool.close().await.unwrap();
    let pool = Pool::open(memory.clone(), limits()).await.unwrap();
    check_all(&pool, volume_id, &expected, "after cleaning and a restart").await;
    // Trimming everything releases every unit.
    pool.trim(volume_id, 0, (VOLUME_BLOCKS * BLOCK) as u64, false)
        .await
        .unwrap();
    assert_eq!(
        live_units(&pool),
        0,
        "trimmed fragments release their units"
    );
    pool.close().await.unwrap();
}

#[tokio::test]
async fn a_damaged_fragment_is_an_error_for_its_block_alone() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = new_pool(&memory).await;
    let volume_id = compressing_volume(&pool, "lz4").await;
    let blocks = real_blocks(64, 4);
    write_all(&pool, volume_id, &blocks).await;
    pool.flush().await.unwrap();
    pool.close().await.unwrap();
    let pool = Pool::open(memory.clone(), limits()).await.unwrap();
    // Flip one byte in the middle of block 0's fragment: block 0 fails,
    // every other block (fragments in the same device block included)
    // still reads back.
    let location = pool.location_of(volume_id, 0).expect("block 0 is mapped");
    assert!(location.is_fragment(), "block 0 of a text file compresses");
    let byte = location.block() * BLOCK as u64
        + location.byte_range().start as u64
        + location.byte_range().len() as u64 / 2;
    let clean = pool.scrub().await.unwrap();
    assert_eq!(clean.blocks_total, clean.blocks_scrubbed);
    // Zero blocks (binaries have some) are not stored: every mapped block
    // is checked, fragments included.
    let mapped = (0..64)
        .filter(|block| pool.location_of(volume_id, *block).is_some())
        .count();
    assert_eq!(
        clean.blocks_total, mapped as u64,
        "every mapped block checked"
    );
    assert_eq!(clean.blocks_unrepairable, 0);
    let mut flipped = [0u8; 1];
    memory.read_sync(byte, &mut flipped);
    flipped[0] ^= 0x40;
    memory.write_sync(byte, &flipped);
    let mut buffer = vec![0u8; BLOCK];
    let error = pool.read(volume_id, 0, &mut buffer).await.unwrap_err();
    assert!(
        error.to_string().contains("fragment is damaged"),
        "unexpected error: {error}"
    );
    for (index, block) in blocks.iter().enumerate().skip(1) {
        pool.read(volume_id, (index * BLOCK) as u64, &mut buffer)
            .await
            .unwrap();
        assert!(buffer == *block, "block {index} differs");
    }
    // Scrub finds the damaged fragment, and only it.
    let scrubbed = pool.scrub().await.unwrap();
    assert_eq!(scrubbed.blocks_unrepairable, 1, "{scrubbed:?}");
    pool.close().await.unwrap();
}

#[tokio::test]
async fn compression_is_refused_where_fragments_are_not_handled_yet() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let flash_bytes = (4 << 20) + 32 * SEGMENT_BYTES;
    let pool = Pool::create(
        memory.clone(),
        options(SEGMENT_BYTES, Some(flash_bytes)),
        limits(),
    )
    .await
    .unwrap();
    pool.create_volume("data", 1 << 20).await.unwrap();
    let error = pool
        .set_volume_compression("data", "lz4".parse().unwrap())
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("capacity tier"),
        "unexpected error: {error}"
    );
    pool.set_volume_compression("data", Codec::Off)
        .await
        .unwrap();
    pool.close().await.unwrap();
}

#[tokio::test]
async fn the_memory_cache_serves_fragments_from_the_packed_blocks_it_holds() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let cached = PoolLimits {
        memory_cache_bytes: 8 << 20,
        ..limits()
    };
    let pool = Pool::create(memory.clone(), options(SEGMENT_BYTES, None), cached.clone())
        .await
        .unwrap();
    let volume_id = compressing_volume(&pool, "zstd:1").await;
    let blocks = real_blocks(64, 5);
    write_all(&pool, volume_id, &blocks).await;
    pool.flush().await.unwrap();
    // Written batches entered the cache: with the device's copy of block
    // 0's fragment damaged, the cached packed block still serves it.
    let location = pool.location_of(volume_id, 0).expect("block 0 is mapped");
    assert!(location.is_fragment(), "block 0 of a text file compresses");
    let byte = location.block() * BLOCK as u64 + location.byte_range().start as u64 + 8;
    let mut flipped = [0u8; 1];
    memory.read_sync(byte, &mut flipped);
    flipped[0] ^= 0x01;
    memory.write_sync(byte, &flipped);
    check_all(&pool, volume_id, &blocks, "from the cache").await;
    // Reopened, the cache is empty: the device's damage shows, for that
    // block only; the blocks read from the device are cached and read again.
    pool.close().await.unwrap();
    let pool = Pool::open(memory.clone(), cached).await.unwrap();
    let mut buffer = vec![0u8; BLOCK];
    assert!(pool.read(volume_id, 0, &mut buffer).await.is_err());
    for _ in 0..2 {
        for (index, block) in blocks.iter().enumerate().skip(1) {
            pool.read(volume_id, (index * BLOCK) as u64, &mut buffer)
                .await
                .unwrap();
            assert!(buffer == *block, "block {index} differs");
        }
    }
    pool.close().await.unwrap();
}
