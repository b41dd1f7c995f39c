//! Faults below the engine: silent bit flips in data blocks, a corrupt newest
//! checkpoint body, failing device writes, reads and flushes. The promises under
//! test are the durability contract's: a corrupt block is an error and never
//! wrong data; losing the newest checkpoint loses nothing that was flushed; a
//! write or flush the device did not complete is reported to the caller (never a
//! silent success) and stops the pool from acknowledging more writes, while data
//! that was already durable stays readable after reopening. A device whose file
//! system filled up (ENOSPC) is the exception: writes wait for space, flushes
//! fail with ENOSPC meanwhile, and the pool resumes by itself once space returns.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;
use common::pools::quiet_limits;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lamina_device::{FaultyDevice, MemoryDevice, PowerCutStyle};
use lamina_engine::log::checkpoint::Slot;
use lamina_engine::log::geometry::{CHECKPOINT_SLOT_BLOCKS, DATA_START_BLOCK};
use lamina_engine::{
    BLOCK_SIZE_BYTES, EngineError, IoError, OpenError, Pool, PoolLimits, PoolOptions,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SEGMENT_BYTES: u64 = 64 << 10;
const DEVICE_BYTES: u64 = (4 << 20) + 48 * SEGMENT_BYTES;
const DATA_START_BYTES: u64 = DATA_START_BLOCK * BLOCK_SIZE_BYTES;

struct Rig {
    memory: Arc<MemoryDevice>,
    faulty: Arc<FaultyDevice<MemoryDevice>>,
    pool: Pool,
}

async fn rig(seed: u64, limits: PoolLimits) -> Rig {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let faulty = Arc::new(FaultyDevice::new(memory.clone(), seed));
    let pool = Pool::create(
        faulty.clone(),
        PoolOptions {
            segment_size_bytes: SEGMENT_BYTES,
            force: false,
            flash_region_bytes: None,
            ..PoolOptions::default()
        },
        limits,
    )
    .await
    .unwrap();
    Rig {
        memory,
        faulty,
        pool,
    }
}

fn random_blocks(rng: &mut SmallRng, count: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; count * BLOCK];
    rng.fill(&mut bytes[..]);
    bytes
}

/// Where each logical block's contents sit on the device, found by content
/// (every block written is random, so its contents are unique).
fn locate_blocks(image: &[u8], contents: &[u8]) -> HashMap<u64, u64> {
    let by_contents: HashMap<&[u8], u64> = contents
        .chunks(BLOCK)
        .enumerate()
        .map(|(logical, block)| (block, logical as u64))
        .collect();
    let mut found = HashMap::new();
    for (index, block) in image
        .chunks(BLOCK)
        .enumerate()
        .skip(DATA_START_BLOCK as usize)
    {
        if let Some(logical) = by_contents.get(block) {
            found.insert(*logical, index as u64);
        }
    }
    found
}

async fn read_all(pool: &Pool, volume_id: u32, length: usize) -> Result<Vec<u8>, EngineError> {
    let mut buffer = vec![0u8; length];
    pool.read(volume_id, 0, &mut buffer).await?;
    Ok(buffer)
}

#[tokio::test]
async fn a_flipped_bit_in_a_data_block_is_a_checksum_error() {
    let mut rng = SmallRng::seed_from_u64(1);
    let Rig {
        memory,
        faulty,
        pool,
    } = rig(1, quiet_limits()).await;
    let block_count = 96;
    let volume_id = pool
        .create_volume("data", (block_count * BLOCK) as u64)
        .await
        .unwrap()
        .volume_id;
    let contents = random_blocks(&mut rng, block_count);
    pool.write(volume_id, 0, &contents, false).await.unwrap();
    pool.flush().await.unwrap();
    let located = locate_blocks(&memory.snapshot(), &contents);
    assert_eq!(located.len(), block_count, "every block is on the device");

    let victim: u64 = 37;
    let physical = located[&victim];
    let byte = physical * BLOCK_SIZE_BYTES + rng.random_range(0..BLOCK_SIZE_BYTES);
    faulty.flip_bit(byte, rng.random_range(0..8)).await.unwrap();
    for (offset, length) in [
        (victim * BLOCK_SIZE_BYTES, BLOCK),
        (victim * BLOCK_SIZE_BYTES + 100, 512),
        (0, block_count * BLOCK),
        ((victim - 1) * BLOCK_SIZE_BYTES + 4000, 200),
    ] {
        let mut buffer = vec![0u8; length];
        let error = pool.read(volume_id, offset, &mut buffer).await.unwrap_err();
        assert!(
            matches!(
                &error,
                EngineError::Io(IoError::ChecksumMismatch { volume, logical_block, physical_block })
                    if volume == "data" && *logical_block == victim && *physical_block == physical
            ),
            "offset {offset} length {length}: {error:?}"
        );
        assert!(error.to_string().contains("checksum mismatch"), "{error}");
    }
    // Its neighbours are intact and read normally.
    for neighbour in [victim - 1, victim + 1] {
        let mut buffer = vec![0u8; BLOCK];
        pool.read(volume_id, neighbour * BLOCK_SIZE_BYTES, &mut buffer)
            .await
            .unwrap();
        let start = neighbour as usize * BLOCK;
        assert!(buffer == contents[start..start + BLOCK]);
    }
    // A partial write into the corrupt block needs its old contents and must
    // fail rather than merge garbage; a whole-block overwrite repairs it.
    let error = pool
        .write(volume_id, victim * BLOCK_SIZE_BYTES + 8, &[1u8; 16], false)
        .await
        .unwrap_err();
    assert!(
        matches!(error, EngineError::Io(IoError::ChecksumMismatch { .. })),
        "{error:?}"
    );
    // Still detected after a clean close and reopen (the checksum is in the map).
    pool.close().await.unwrap();
    drop(pool);
    let pool = Pool::open(memory.clone(), quiet_limits()).await.unwrap();
    let error = read_all(&pool, volume_id, block_count * BLOCK)
        .await
        .unwrap_err();
    assert!(
        matches!(error, EngineError::Io(IoError::ChecksumMismatch { logical_block, .. }) if logical_block == victim),
        "{error:?}"
    );
    let start = victim as usize * BLOCK;
    pool.write(
        volume_id,
        victim * BLOCK_SIZE_BYTES,
        &contents[start..start + BLOCK],
        false,
    )
    .await
    .unwrap();
    assert!(
        read_all(&pool, volume_id, block_count * BLOCK)
            .await
            .unwrap()
            == contents
    );
}

/// Without locating anything: a bit flipped in every block of the segment
/// region in turn, and each time every block of the volume either reads back
/// exactly or fails. Wrong data is never returned.
#[tokio::test]
async fn bit_flips_anywhere_in_the_segments_never_return_wrong_data() {
    let mut rng = SmallRng::seed_from_u64(2);
    let Rig {
        memory,
        faulty,
        pool,
    } = rig(2, quiet_limits()).await;
    let block_count = 200;
    let volume_id = pool
        .create_volume("data", (block_count * BLOCK) as u64)
        .await
        .unwrap()
        .volume_id;
    let mut contents = random_blocks(&mut rng, block_count);
    pool.write(volume_id, 0, &contents, false).await.unwrap();
    // Overwrite some blocks so that stale copies exist on the device too.
    for _ in 0..40 {
        let logical = rng.random_range(0..block_count);
        let fresh = random_blocks(&mut rng, 1);
        pool.write(volume_id, (logical * BLOCK) as u64, &fresh, false)
            .await
            .unwrap();
        contents[logical * BLOCK..(logical + 1) * BLOCK].copy_from_slice(&fresh);
    }
    pool.flush().await.unwrap();
    let device_blocks = DEVICE_BYTES / BLOCK_SIZE_BYTES;
    let mut detected = 0;
    for physical in DATA_START_BLOCK..device_blocks {
        let byte = physical * BLOCK_SIZE_BYTES + rng.random_range(0..BLOCK_SIZE_BYTES);
        let bit = rng.random_range(0..8);
        faulty.flip_bit(byte, bit).await.unwrap();
        let mut failed_blocks = 0;
        for logical in 0..block_count {
            let mut buffer = vec![0u8; BLOCK];
            match pool
                .read(volume_id, (logical * BLOCK) as u64, &mut buffer)
                .await
            {
                Ok(()) => assert!(
                    buffer == contents[logical * BLOCK..(logical + 1) * BLOCK],
                    "device block {physical}: logical block {logical} read wrong data"
                ),
                Err(EngineError::Io(IoError::ChecksumMismatch { logical_block, .. })) => {
                    assert_eq!(logical_block, logical as u64);
                    failed_blocks += 1;
                }
                Err(error) => panic!("device block {physical}: unexpected {error:?}"),
            }
        }
        assert!(
            failed_blocks <= 1,
            "one flipped bit broke {failed_blocks} blocks"
        );
        detected += failed_blocks;
        faulty.flip_bit(byte, bit).await.unwrap();
    }
    assert_eq!(detected, block_count, "every live block was hit once");
    assert!(
        read_all(&pool, volume_id, block_count * BLOCK)
            .await
            .unwrap()
            == contents
    );
    drop(memory);
}

/// The slot naming the newest checkpoint, read from a device image.
fn newest_slot(image: &[u8]) -> (usize, Slot) {
    CHECKPOINT_SLOT_BLOCKS
        .iter()
        .enumerate()
        .filter_map(|(index, block)| {
            let start = (*block * BLOCK_SIZE_BYTES) as usize;
            Slot::decode(&image[start..start + BLOCK])
                .ok()
                .map(|slot| (index, slot))
        })
        .max_by_key(|(_, slot)| slot.checkpoint_sequence)
        .expect("a valid slot")
}

fn body_offset(slot: &Slot) -> u64 {
    DATA_START_BYTES + u64::from(slot.body_segments[0]) * SEGMENT_BYTES
}

#[tokio::test]
async fn a_corrupt_newest_checkpoint_body_falls_back_without_losing_flushed_data() {
    let mut rng = SmallRng::seed_from_u64(3);
    let Rig {
        memory,
        faulty,
        pool,
    } = rig(3, quiet_limits()).await;
    let block_count = 64;
    let first = pool
        .create_volume("first", (block_count * BLOCK) as u64)
        .await
        .unwrap()
        .volume_id;
    let mut first_contents = random_blocks(&mut rng, block_count);
    pool.write(first, 0, &first_contents, false).await.unwrap();
    pool.checkpoint().await.unwrap();
    // Between the two checkpoints: overwrites, a new volume, a rename, a trim.
    let overwrite = random_blocks(&mut rng, 16);
    pool.write(first, 8 * BLOCK_SIZE_BYTES, &overwrite, false)
        .await
        .unwrap();
    first_contents[8 * BLOCK..24 * BLOCK].copy_from_slice(&overwrite);
    pool.trim(first, 40 * BLOCK_SIZE_BYTES, 4 * BLOCK_SIZE_BYTES, false)
        .await
        .unwrap();
    first_contents[40 * BLOCK..44 * BLOCK].fill(0);
    let second = pool
        .create_volume("second", 1 << 20)
        .await
        .unwrap()
        .volume_id;
    let second_contents = random_blocks(&mut rng, 8);
    pool.write(second, 0, &second_contents, false)
        .await
        .unwrap();
    pool.rename_volume("second", "renamed").await.unwrap();
    pool.checkpoint().await.unwrap();
    // After the newest checkpoint: flushed writes that only the log holds.
    let late = random_blocks(&mut rng, 4);
    pool.write(first, 60 * BLOCK_SIZE_BYTES, &late, false)
        .await
        .unwrap();
    first_contents[60 * BLOCK..64 * BLOCK].copy_from_slice(&late);
    pool.flush().await.unwrap();
    pool.abandon();
    drop(pool);
    drop(faulty);

    let image = memory.snapshot();
    let (_, newest) = newest_slot(&image);
    // Corrupt the body, not the slot: the slot still verifies.
    let corrupt_at = body_offset(&newest) + 100;
    let mut corrupted = image.clone();
    corrupted[corrupt_at as usize] ^= 0x10;
    let device = Arc::new(MemoryDevice::from_bytes(corrupted));
    let pool = Pool::open(device.clone(), quiet_limits()).await.unwrap();
    let check = |pool: Pool, expected_first: Vec<u8>, expected_second: Vec<u8>| async move {
        let mut names: Vec<String> = pool
            .list_volumes()
            .into_iter()
            .map(|volume| volume.name)
            .collect();
        names.sort();
        assert_eq!(names, ["first", "renamed"]);
        let first = pool.volume_id("first").unwrap();
        assert!(read_all(&pool, first, expected_first.len()).await.unwrap() == expected_first);
        let renamed = pool.volume_id("renamed").unwrap();
        let read = read_all(&pool, renamed, expected_second.len())
            .await
            .unwrap();
        assert!(read == expected_second);
        assert_eq!(pool.extents(first, 40 * 4096, 4 * 4096).unwrap().len(), 1);
        assert!(!pool.extents(first, 40 * 4096, 4 * 4096).unwrap()[0].allocated);
    };
    check(
        pool.clone(),
        first_contents.clone(),
        second_contents.clone(),
    )
    .await;
    // The recovery repaired the checkpoints: a second reopen works on its own.
    pool.close().await.unwrap();
    drop(pool);
    let (_, repaired) = newest_slot(&device.snapshot());
    assert!(repaired.checkpoint_sequence > newest.checkpoint_sequence);
    let pool = Pool::open(device, quiet_limits()).await.unwrap();
    check(pool, first_contents, second_contents).await;
}

#[tokio::test]
async fn both_checkpoint_bodies_corrupt_is_refused_without_writing() {
    let Rig { memory, pool, .. } = rig(4, quiet_limits()).await;
    pool.create_volume("data", 1 << 20).await.unwrap();
    pool.close().await.unwrap();
    drop(pool);
    let mut image = memory.snapshot();
    for block in CHECKPOINT_SLOT_BLOCKS {
        let start = (block * BLOCK_SIZE_BYTES) as usize;
        let slot = Slot::decode(&image[start..start + BLOCK]).unwrap();
        image[body_offset(&slot) as usize + 30] ^= 1;
    }
    let device = Arc::new(MemoryDevice::from_bytes(image.clone()));
    let error = match Pool::open(device.clone(), quiet_limits()).await {
        Ok(_) => panic!("opened a pool with no valid checkpoint"),
        Err(error) => error,
    };
    assert!(
        matches!(
            error,
            EngineError::Open(OpenError::Corrupt {
                structure: "checkpoint",
                ..
            })
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("checkpoint"), "{error}");
    assert!(
        device.snapshot() == image,
        "a refused open wrote to the device"
    );
}

/// Writes `contents` and makes them durable, returning the volume identifier.
async fn durable_volume(pool: &Pool, contents: &[u8]) -> u32 {
    let volume_id = pool
        .create_volume("data", contents.len() as u64)
        .await
        .unwrap()
        .volume_id;
    pool.write(volume_id, 0, contents, false).await.unwrap();
    pool.flush().await.unwrap();
    volume_id
}

/// After a failure, every block of the volume reads as its durable contents, the
/// newer contents, or fails; nothing else.
async fn assert_old_new_or_error(pool: &Pool, volume_id: u32, durable: &[u8], newer: &[u8]) {
    for logical in 0..durable.len() / BLOCK {
        let range = logical * BLOCK..(logical + 1) * BLOCK;
        let mut buffer = vec![0u8; BLOCK];
        if pool
            .read(volume_id, (logical * BLOCK) as u64, &mut buffer)
            .await
            .is_ok()
        {
            assert!(
                buffer == durable[range.clone()] || buffer == newer[range],
                "block {logical} holds data never written"
            );
        }
    }
}

async fn assert_refuses_writes(pool: &Pool, volume_id: u32) {
    let failed = |error: EngineError| {
        assert!(
            matches!(error, EngineError::Io(IoError::Failed(_))),
            "{error:?}"
        );
        assert!(error.to_string().contains("has failed"), "{error}");
    };
    failed(
        pool.write(volume_id, 0, &[1u8; BLOCK], false)
            .await
            .unwrap_err(),
    );
    failed(
        pool.write(volume_id, 10, &[1u8; 10], true)
            .await
            .unwrap_err(),
    );
    failed(pool.trim(volume_id, 0, 8192, false).await.unwrap_err());
    failed(pool.flush().await.unwrap_err());
    failed(pool.checkpoint().await.unwrap_err());
    failed(pool.create_volume("another", 4096).await.unwrap_err());
    assert!(pool.status().failed.is_some());
}

#[tokio::test]
async fn a_failed_batch_write_fails_the_flush_and_the_pool() {
    let mut rng = SmallRng::seed_from_u64(5);
    let Rig {
        memory,
        faulty,
        pool,
    } = rig(5, quiet_limits()).await;
    let block_count = 32;
    let durable = random_blocks(&mut rng, block_count);
    let volume_id = durable_volume(&pool, &durable).await;
    faulty.fail_writes_in(DATA_START_BYTES..DEVICE_BYTES).await;
    let newer = random_blocks(&mut rng, block_count);
    // The write itself is acknowledged (it is in memory); the flush must fail.
    pool.write(volume_id, 0, &newer, false).await.unwrap();
    let error = pool.flush().await.unwrap_err();
    assert!(
        matches!(error, EngineError::Io(IoError::Failed(_))),
        "{error:?}"
    );
    assert_refuses_writes(&pool, volume_id).await;
    assert_old_new_or_error(&pool, volume_id, &durable, &newer).await;
    pool.abandon();
    drop(pool);

    let pool = Pool::open(memory, quiet_limits()).await.unwrap();
    assert!(read_all(&pool, volume_id, durable.len()).await.unwrap() == durable);
    drop(faulty);
}

#[tokio::test]
async fn random_write_errors_fail_the_pool_and_keep_durable_data() {
    for seed in 0..6u64 {
        let mut rng = SmallRng::seed_from_u64(100 + seed);
        let Rig {
            memory,
            faulty,
            pool,
        } = rig(100 + seed, quiet_limits()).await;
        let block_count = 48;
        let durable = random_blocks(&mut rng, block_count);
        let volume_id = durable_volume(&pool, &durable).await;
        faulty.fail_at_rate(0.0, 0.3).await;
        // Keep writing and flushing until an error surfaces; each acknowledged
        // flush moves the durable image forward.
        let mut durable_now = durable.clone();
        let mut newer = durable.clone();
        let mut surfaced = false;
        for _ in 0..50 {
            let logical = rng.random_range(0..block_count);
            let fresh = random_blocks(&mut rng, 1);
            let range = logical * BLOCK..(logical + 1) * BLOCK;
            match pool
                .write(volume_id, (logical * BLOCK) as u64, &fresh, false)
                .await
            {
                Ok(()) => newer[range].copy_from_slice(&fresh),
                Err(error) => {
                    assert!(
                        matches!(error, EngineError::Io(IoError::Failed(_))),
                        "{error:?}"
                    );
                    surfaced = true;
                    break;
                }
            }
            match pool.flush().await {
                Ok(()) => durable_now.clone_from(&newer),
                Err(error) => {
                    assert!(
                        matches!(
                            error,
                            EngineError::Io(IoError::Failed(_)) | EngineError::Device(_)
                        ),
                        "{error:?}"
                    );
                    surfaced = true;
                    break;
                }
            }
        }
        assert!(
            surfaced,
            "seed {seed}: a 30% write failure rate never surfaced"
        );
        assert_refuses_writes(&pool, volume_id).await;
        pool.abandon();
        drop(pool);
        faulty.heal().await;
        let pool = Pool::open(memory, quiet_limits()).await.unwrap();
        // Every flush that succeeded is kept; later writes may or may not be.
        let recovered = read_all(&pool, volume_id, durable.len()).await.unwrap();
        for logical in 0..block_count {
            let range = logical * BLOCK..(logical + 1) * BLOCK;
            assert!(
                recovered[range.clone()] == durable_now[range.clone()]
                    || recovered[range.clone()] == newer[range],
                "seed {seed}: block {logical} lost durable data"
            );
        }
    }
}

#[tokio::test]
async fn a_failing_device_flush_is_reported_never_silent() {
    let mut rng = SmallRng::seed_from_u64(6);
    let Rig {
        memory,
        faulty,
        pool,
    } = rig(6, quiet_limits()).await;
    let block_count = 16;
    let durable = random_blocks(&mut rng, block_count);
    let volume_id = durable_volume(&pool, &durable).await;
    faulty.fail_flushes(true).await;
    let newer = random_blocks(&mut rng, block_count);
    pool.write(volume_id, 0, &newer, false).await.unwrap();
    let error = pool.flush().await.unwrap_err();
    assert!(
        matches!(&error, EngineError::Device(_)),
        "the first failing flush reports the device error: {error:?}"
    );
    // Every later flush, FUA write and checkpoint keeps failing; none succeeds
    // silently, even after the device recovers, because what it holds is unknown.
    faulty.fail_flushes(false).await;
    assert!(pool.flush().await.is_err());
    assert!(
        pool.write(volume_id, 0, &newer[..BLOCK], true)
            .await
            .is_err()
    );
    assert_refuses_writes(&pool, volume_id).await;
    assert!(pool.close().await.is_err());
    drop(pool);
    let pool = Pool::open(memory, quiet_limits()).await.unwrap();
    assert_old_new_or_error(&pool, volume_id, &durable, &newer).await;
    drop(faulty);
}

#[tokio::test]
async fn a_fua_write_on_a_failing_flush_is_an_error() {
    let Rig { faulty, pool, .. } = rig(7, quiet_limits()).await;
    let volume_id = pool.create_volume("data", 1 << 20).await.unwrap().volume_id;
    faulty.fail_flushes(true).await;
    assert!(
        pool.write(volume_id, 4096, &[3u8; 4096], true)
            .await
            .is_err()
    );
    assert!(
        pool.write_zeroes(volume_id, 0, 8192, true, true)
            .await
            .is_err()
    );
}

/// A flush that fails in the background (nobody is waiting) still fails the
/// pool, so that the client's next flush cannot report success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_background_flush_is_reported_to_the_next_flush() {
    let limits = PoolLimits {
        // The periodic task on, for its flushes (its checkpoints, every
        // 30 s by default, do not come within the test).
        test_hooks: lamina_engine::TestHooks::default(),
        flush_interval_ms: 20,
        ..quiet_limits()
    };
    let Rig { faulty, pool, .. } = rig(8, limits).await;
    let volume_id = pool.create_volume("data", 1 << 20).await.unwrap().volume_id;
    faulty.fail_flushes(true).await;
    pool.write(volume_id, 0, &[5u8; 8192], false).await.unwrap();
    // Wait until the background flush has tried and failed.
    for _ in 0..200 {
        if pool.status().failed.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        pool.status().failed.is_some(),
        "the background flush never ran"
    );
    faulty.fail_flushes(false).await;
    let error = pool.flush().await.unwrap_err();
    assert!(
        matches!(error, EngineError::Io(IoError::Failed(_))),
        "{error:?}"
    );
}

#[tokio::test]
async fn read_errors_are_errors_not_zeros() {
    let mut rng = SmallRng::seed_from_u64(9);
    let Rig {
        memory,
        faulty,
        pool,
    } = rig(9, quiet_limits()).await;
    let block_count = 16;
    let contents = random_blocks(&mut rng, block_count);
    let volume_id = durable_volume(&pool, &contents).await;
    let located = locate_blocks(&memory.snapshot(), &contents);
    let physical = located[&5];
    faulty
        .fail_reads_in(physical * BLOCK_SIZE_BYTES..(physical + 1) * BLOCK_SIZE_BYTES)
        .await;
    let error = read_all(&pool, volume_id, contents.len())
        .await
        .unwrap_err();
    assert!(matches!(error, EngineError::Device(_)), "{error:?}");
    let mut buffer = vec![0u8; BLOCK];
    pool.read(volume_id, 4 * BLOCK_SIZE_BYTES, &mut buffer)
        .await
        .unwrap();
    assert!(buffer == contents[4 * BLOCK..5 * BLOCK]);
    // A read error is not a write error: the pool keeps accepting writes.
    pool.write(volume_id, 0, &contents[..BLOCK], true)
        .await
        .unwrap();
    faulty.heal().await;
    assert!(read_all(&pool, volume_id, contents.len()).await.unwrap() == contents);
}

/// A checkpoint body whose checksums are right but which maps a block outside
/// the segment area (as a bug or a hand edit could leave it; found by the
/// `engine_recovery` fuzz target) must not crash recovery: the body is invalid,
/// and recovery falls back to the other checkpoint or reports it corrupt.
#[tokio::test]
async fn a_verified_checkpoint_body_with_an_impossible_block_is_not_trusted() {
    use lamina_engine::log::checkpoint::Body;
    let Rig { memory, pool, .. } = rig(10, quiet_limits()).await;
    let volume_id = pool.create_volume("data", 1 << 20).await.unwrap().volume_id;
    pool.write(volume_id, 0, &[4u8; 4 * BLOCK], false)
        .await
        .unwrap();
    pool.close().await.unwrap();
    drop(pool);
    let mut image = memory.snapshot();
    let (slot_index, mut slot) = newest_slot(&image);
    let body_start = body_offset(&slot) as usize;
    let mut body = Body::decode(&image[body_start..body_start + slot.body_bytes as usize]).unwrap();
    let reference = body.volumes[0].map.chunk_references[0] as usize;
    body.chunks[reference].physical_blocks[0] = 33;
    let encoded = body.encode();
    image[body_start..body_start + encoded.len()].copy_from_slice(&encoded);
    slot.body_bytes = encoded.len() as u64;
    slot.body_checksum = crc32c::crc32c(&encoded);
    let slot_start = (CHECKPOINT_SLOT_BLOCKS[slot_index] * BLOCK_SIZE_BYTES) as usize;
    let slot_bytes = slot.encode();
    image[slot_start..slot_start + slot_bytes.len()].copy_from_slice(&slot_bytes);
    let device = Arc::new(MemoryDevice::from_bytes(image));
    match Pool::open(device, quiet_limits()).await {
        Ok(pool) => {
            // Fell back to the other checkpoint: the data is still there.
            let mut buffer = vec![0u8; 4 * BLOCK];
            pool.read(volume_id, 0, &mut buffer).await.unwrap();
            assert!(buffer.iter().all(|byte| *byte == 4));
        }
        Err(error) => assert!(
            matches!(error, EngineError::Open(OpenError::Corrupt { .. })),
            "{error:?}"
        ),
    }
}

/// The older checkpoint slot is trusted without reading its body. A slot whose
/// frame verifies but which names a segment beyond the device (found by the
/// `engine_recovery` fuzz target) must not crash the pool later.
#[tokio::test]
async fn an_older_slot_naming_impossible_segments_does_not_crash_later() {
    let Rig { memory, pool, .. } = rig(11, quiet_limits()).await;
    let volume_id = pool.create_volume("data", 1 << 20).await.unwrap().volume_id;
    pool.write(volume_id, 0, &[6u8; 2 * BLOCK], false)
        .await
        .unwrap();
    pool.close().await.unwrap();
    drop(pool);
    let mut image = memory.snapshot();
    let (newest_index, _) = newest_slot(&image);
    let older_start = (CHECKPOINT_SLOT_BLOCKS[1 - newest_index] * BLOCK_SIZE_BYTES) as usize;
    let mut older = Slot::decode(&image[older_start..older_start + BLOCK]).unwrap();
    older.body_segments = vec![73];
    let encoded = older.encode();
    image[older_start..older_start + encoded.len()].copy_from_slice(&encoded);
    let device = Arc::new(MemoryDevice::from_bytes(image));
    let Ok(pool) = Pool::open(device, quiet_limits()).await else {
        return;
    };
    let mut buffer = vec![0u8; 2 * BLOCK];
    pool.read(volume_id, 0, &mut buffer).await.unwrap();
    assert!(buffer.iter().all(|byte| *byte == 6));
    for _ in 0..3 {
        pool.checkpoint().await.unwrap();
    }
}

/// Quiet limits with a small in-flight limit (so that writers feel the full
/// device soon) and short device-full retries and waits.
fn device_full_limits() -> PoolLimits {
    PoolLimits {
        in_flight_batches_max: 4,
        device_full_retry_interval_ms: 20,
        device_full_wait_ms_max: 1000,
        ..quiet_limits()
    }
}

fn assert_device_full(error: EngineError) {
    assert!(
        matches!(error, EngineError::Io(IoError::DeviceFull { .. })),
        "a full device fails a flush or a held-back write with ENOSPC, not the pool: {error:?}"
    );
}

/// The file system under the pool fills up: acknowledged writes wait in
/// memory (readable), flushes fail with ENOSPC instead of succeeding or failing
/// the pool, writers are held back (and fail with ENOSPC after the bound), and
/// once space returns everything is written, a flush succeeds and survives a
/// power cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_device_holds_writes_and_resumes_when_space_returns() {
    let mut rng = SmallRng::seed_from_u64(21);
    let Rig {
        memory,
        faulty,
        pool,
    } = rig(21, device_full_limits()).await;
    let block_count = 320;
    let mut expected = random_blocks(&mut rng, block_count);
    let volume_id = durable_volume(&pool, &expected).await;

    faulty.run_out_of_space(true).await;
    let newer = random_blocks(&mut rng, 64);
    pool.write(volume_id, 0, &newer, false).await.unwrap();
    expected[..newer.len()].copy_from_slice(&newer);
    assert_device_full(pool.flush().await.unwrap_err());
    let status = pool.status();
    assert!(status.failed.is_none(), "{:?}", status.failed);
    let full = status.device_full.expect("status shows the full device");
    assert!(full.waiting_batch_count >= 1, "{full:?}");
    assert!(full.reason.contains("out of space"), "{}", full.reason);
    assert!(read_all(&pool, volume_id, expected.len()).await.unwrap() == expected);
    // More batches are in flight than the limit: a FUA write waits for a slot
    // until the bound, then fails with ENOSPC (its block is old or new).
    let fua = random_blocks(&mut rng, 1);
    let fua_range = 70 * BLOCK..71 * BLOCK;
    assert_device_full(
        pool.write(volume_id, fua_range.start as u64, &fua, true)
            .await
            .unwrap_err(),
    );
    let mut block = vec![0u8; BLOCK];
    pool.read(volume_id, fua_range.start as u64, &mut block)
        .await
        .unwrap();
    assert!(block == fua || block == expected[fua_range.clone()]);
    expected[fua_range].copy_from_slice(&block);

    // A writer is held back while the device is full and goes on once space
    // returns within the bound.
    let more = random_blocks(&mut rng, 200);
    let more_offset = 100 * BLOCK;
    let writer = {
        let pool = pool.clone();
        let more = more.clone();
        tokio::spawn(async move {
            pool.write(volume_id, more_offset as u64, &more, false)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !writer.is_finished(),
        "writers are held back on a full device"
    );
    expected[more_offset..more_offset + more.len()].copy_from_slice(&more);
    faulty.run_out_of_space(false).await;
    tokio::time::timeout(Duration::from_secs(10), writer)
        .await
        .expect("the writer goes on once space returns")
        .unwrap()
        .unwrap();
    pool.flush().await.unwrap();
    let status = pool.status();
    assert!(status.device_full.is_none() && status.failed.is_none());
    assert!(status.device_full_retries > 0);
    assert!(read_all(&pool, volume_id, expected.len()).await.unwrap() == expected);

    pool.abandon();
    faulty.power_cut(PowerCutStyle::Random).await.unwrap();
    drop(pool);
    let pool = Pool::open(memory, quiet_limits()).await.unwrap();
    assert!(
        read_all(&pool, volume_id, expected.len()).await.unwrap() == expected,
        "every block flushed after space returned survives a power cut"
    );
}
/// Power cuts while the device is full, after it was full once before and
/// resumed: every block of the last successful flush reads back exactly (the
/// writes the full device refused never reached it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_cut_on_a_full_device_keeps_every_flushed_block() {
    for seed in 0..4u64 {
        let mut rng = SmallRng::seed_from_u64(300 + seed);
        let Rig {
            memory,
            faulty,
            pool,
        } = rig(300 + seed, device_full_limits()).await;
        let block_count = 96;
        let mut durable = random_blocks(&mut rng, block_count);
        let volume_id = durable_volume(&pool, &durable).await;
        let mut newer = durable.clone();
        for episode in 0..2 {
            faulty.run_out_of_space(true).await;
            for _ in 0..rng.random_range(1..40) {
                let first = rng.random_range(0..block_count);
                let count = rng.random_range(1..=(block_count - first).min(24));
                let fresh = random_blocks(&mut rng, count);
                let range = first * BLOCK..(first + count) * BLOCK;
                let written = pool
                    .write(volume_id, range.start as u64, &fresh, false)
                    .await;
                if let Err(error) = written {
                    // Held back past the bound: each block of the range is
                    // old or new, and stays so.
                    assert_device_full(error);
                    let mut held = vec![0u8; range.len()];
                    pool.read(volume_id, range.start as u64, &mut held)
                        .await
                        .unwrap();
                    for (index, block) in held.chunks(BLOCK).enumerate() {
                        let at = range.start + index * BLOCK..range.start + (index + 1) * BLOCK;
                        assert!(
                            block == &fresh[index * BLOCK..(index + 1) * BLOCK]
                                || block == &newer[at]
                        );
                    }
                    newer[range].copy_from_slice(&held);
                    break;
                }
                newer[range].copy_from_slice(&fresh);
            }
            assert_device_full(pool.flush().await.unwrap_err());
            if episode == 0 {
                faulty.run_out_of_space(false).await;
                pool.flush().await.unwrap();
                durable.clone_from(&newer);
            }
        }
        pool.abandon();
        faulty.power_cut(PowerCutStyle::Random).await.unwrap();
        drop(pool);
        faulty.heal().await;
        let pool = Pool::open(memory, quiet_limits()).await.unwrap();
        assert!(
            read_all(&pool, volume_id, durable.len()).await.unwrap() == durable,
            "seed {seed}: a flushed block was lost or changed"
        );
    }
}

/// A checkpoint whose body finds the device full is skipped, not fatal: the
/// pool keeps its previous checkpoints and checkpoints again once space returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_on_a_full_device_is_skipped_not_fatal() {
    let mut rng = SmallRng::seed_from_u64(41);
    let Rig {
        memory,
        faulty,
        pool,
    } = rig(41, device_full_limits()).await;
    let contents = random_blocks(&mut rng, 64);
    let volume_id = durable_volume(&pool, &contents).await;
    faulty.run_out_of_space(true).await;
    assert_device_full(pool.checkpoint().await.unwrap_err());
    assert!(pool.status().failed.is_none());
    faulty.run_out_of_space(false).await;
    pool.checkpoint().await.unwrap();
    pool.close().await.unwrap();
    drop(pool);
    let pool = Pool::open(memory, quiet_limits()).await.unwrap();
    assert!(read_all(&pool, volume_id, contents.len()).await.unwrap() == contents);
}
