//! The engine's behaviour through its public API, checked against simple models:
//! byte-granular reads and writes at any offset (a `Vec<u8>` per volume is the
//! model), concurrent sub-block writes into one block, zeroing with and without
//! punching holes and what `extents` reports, resizing, renaming and deleting,
//! that all of it survives a clean close and a replay after a crash, and that
//! the numbers `status()` reports are consistent.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::sync::Arc;

use lamina_device::MemoryDevice;
use lamina_engine::{
    BLOCK_SIZE_BYTES, EngineError, Extent, IoError, Pool, PoolLimits, PoolOptions, VolumeError,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
const SEGMENT_BYTES: u64 = 64 << 10;

fn quiet_limits() -> PoolLimits {
    PoolLimits {
        test_hooks: lamina_engine::TestHooks::without_periodic_flush_and_checkpoint(),
        dirty_bytes_max: u64::MAX / 2,
        ..PoolLimits::default()
    }
}

async fn new_pool(segment_count: u64) -> (Arc<MemoryDevice>, Pool) {
    let device = Arc::new(MemoryDevice::new((4 << 20) + segment_count * SEGMENT_BYTES));
    let pool = Pool::create(
        device.clone(),
        PoolOptions {
            segment_size_bytes: SEGMENT_BYTES,
            force: false,
            flash_region_bytes: None,
            ..PoolOptions::default()
        },
        quiet_limits(),
    )
    .await
    .unwrap();
    (device, pool)
}

async fn reopen(device: &Arc<MemoryDevice>, pool: Pool, clean: bool) -> Pool {
    if clean {
        pool.close().await.unwrap();
    } else {
        pool.flush().await.unwrap();
        pool.abandon();
    }
    drop(pool);
    Pool::open(device.clone(), quiet_limits()).await.unwrap()
}

async fn read_volume(pool: &Pool, name: &str) -> Vec<u8> {
    let info = pool.volume_info(name).unwrap();
    let mut buffer = vec![0u8; info.size_bytes as usize];
    pool.read(info.volume_id, 0, &mut buffer).await.unwrap();
    buffer
}

/// Bytes of the range the extents list as allocated / not allocated.
fn allocated_and_holes(extents: &[Extent]) -> (u64, u64) {
    extents.iter().fold((0, 0), |(allocated, holes), extent| {
        if extent.allocated {
            (allocated + extent.length, holes)
        } else {
            (allocated, holes + extent.length)
        }
    })
}

/// Checks that `extents` describe `model_allocated` (per block) for the range.
fn assert_extents(extents: &[Extent], offset: u64, allocated_per_block: &[bool], context: &str) {
    let mut position = offset;
    for (index, extent) in extents.iter().enumerate() {
        assert!(extent.length > 0, "{context}: empty extent");
        if index > 0 {
            assert_ne!(
                extents[index - 1].allocated,
                extent.allocated,
                "{context}: adjacent extents not merged"
            );
        }
        let end = position + extent.length;
        for block in position / BLOCK_SIZE_BYTES..end.div_ceil(BLOCK_SIZE_BYTES) {
            assert_eq!(
                allocated_per_block[block as usize], extent.allocated,
                "{context}: block {block}"
            );
        }
        position = end;
    }
}

#[tokio::test]
async fn random_unaligned_io_matches_a_byte_model_and_survives_reopen() {
    let mut rng = SmallRng::seed_from_u64(21);
    let (device, mut pool) = new_pool(64).await;
    let size_bytes: u64 = 160 * BLOCK_SIZE_BYTES;
    let volume_id = pool
        .create_volume("model", size_bytes)
        .await
        .unwrap()
        .volume_id;
    let mut model = vec![0u8; size_bytes as usize];
    for step in 0..1500 {
        let offset = rng.random_range(0..size_bytes - 1);
        let length = match rng.random_range(0..4u8) {
            0 => rng.random_range(1..64),
            1 => rng.random_range(1..BLOCK as u64 + 1),
            2 => rng.random_range(1..4 * BLOCK as u64),
            _ => rng.random_range(1..40 * BLOCK as u64),
        }
        .min(size_bytes - offset);
        let range = offset as usize..(offset + length) as usize;
        match rng.random_range(0..20u8) {
            0..=8 => {
                let mut data = vec![0u8; length as usize];
                rng.fill(&mut data[..]);
                let fua = rng.random_bool(0.05);
                pool.write(volume_id, offset, &data, fua).await.unwrap();
                model[range].copy_from_slice(&data);
            }
            9..=14 => {
                let mut buffer = vec![0xEEu8; length as usize];
                pool.read(volume_id, offset, &mut buffer).await.unwrap();
                assert!(
                    buffer == model[range],
                    "step {step}: read {length} bytes at {offset} differs from the model"
                );
            }
            15 => {
                let punch = rng.random_bool(0.5);
                pool.write_zeroes(volume_id, offset, length, false, punch)
                    .await
                    .unwrap();
                model[range].fill(0);
            }
            16 => {
                pool.trim(volume_id, offset, length, false).await.unwrap();
                model[range].fill(0);
            }
            17 => pool.flush().await.unwrap(),
            18 => pool.checkpoint().await.unwrap(),
            _ => {
                if rng.random_bool(0.1) {
                    pool = reopen(&device, pool, rng.random_bool(0.5)).await;
                }
            }
        }
    }
    assert!(read_volume(&pool, "model").await == model);
    let pool = reopen(&device, pool, true).await;
    assert!(read_volume(&pool, "model").await == model);
    let pool = reopen(&device, pool, false).await;
    assert!(read_volume(&pool, "model").await == model);
}

/// The write path's at-once form (`write_without_waiting`, what the NBD server
/// runs for every write without FUA) against a byte model, in a pool small
/// enough that the cleaner must reclaim: it takes whole-block writes unless it
/// would wait (no batch slot free, the pool full: the waiting write then runs),
/// leaves other shapes to the waiting write, and what it took is what a crash
/// after a flush reads back.
#[tokio::test]
async fn writes_without_waiting_match_a_model_and_survive_a_crash() {
    const VOLUME_BLOCKS: u64 = 96;
    let mut rng = SmallRng::seed_from_u64(46);
    let (device, mut pool) = new_pool(64).await;
    let size_bytes = VOLUME_BLOCKS * BLOCK_SIZE_BYTES;
    let volume_id = pool
        .create_volume("model", size_bytes)
        .await
        .unwrap()
        .volume_id;
    let mut model = vec![0u8; size_bytes as usize];
    let (mut at_once, mut waited) = (0u32, 0u32);
    for step in 0..3000 {
        let blocks = if rng.random_bool(0.8) {
            1
        } else {
            rng.random_range(2..=40u64)
        };
        let offset = rng.random_range(0..=VOLUME_BLOCKS - blocks) * BLOCK_SIZE_BYTES;
        let mut data = vec![0u8; (blocks * BLOCK_SIZE_BYTES) as usize];
        rng.fill(&mut data[..]);
        match pool.write_without_waiting(volume_id, offset, &data) {
            Some(result) => {
                result.unwrap();
                at_once += 1;
            }
            None => {
                pool.write(volume_id, offset, &data, false).await.unwrap();
                waited += 1;
            }
        }
        model[offset as usize..][..data.len()].copy_from_slice(&data);
        if step % 500 == 499 {
            pool = reopen(&device, pool, false).await;
            assert!(read_volume(&pool, "model").await == model, "step {step}");
        }
    }
    assert!(
        at_once > 0 && waited > 0,
        "{at_once} at once, {waited} waited"
    );
    for (offset, length) in [(100, BLOCK), (0, 0), (0, 512)] {
        let data = vec![1u8; length];
        assert!(
            pool.write_without_waiting(volume_id, offset, &data)
                .is_none()
        );
    }
    let outside = pool.write_without_waiting(volume_id, size_bytes, &[1u8; BLOCK]);
    assert!(matches!(outside, Some(Err(_))), "outside the volume");
    let pool = reopen(&device, pool, false).await;
    assert!(read_volume(&pool, "model").await == model);
}

/// Many tasks each write their own 512-byte sector of the same 4 KiB blocks at
/// once: every write is a read-modify-write of a shared block, and none may be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_sector_writes_into_one_block_are_all_kept() {
    let (device, pool) = new_pool(64).await;
    let block_count: u64 = 8;
    let volume_id = pool
        .create_volume("shared", block_count * BLOCK_SIZE_BYTES)
        .await
        .unwrap()
        .volume_id;
    let sectors_per_block = BLOCK / 512;
    for round in 0..40u8 {
        let mut tasks = Vec::new();
        for block in 0..block_count {
            for sector in 0..sectors_per_block {
                let pool = pool.clone();
                let value = round
                    .wrapping_mul(31)
                    .wrapping_add((block as u8) << 3)
                    .wrapping_add(sector as u8)
                    | 1;
                tasks.push(tokio::spawn(async move {
                    let offset = block * BLOCK_SIZE_BYTES + sector as u64 * 512;
                    pool.write(volume_id, offset, &[value; 512], false)
                        .await
                        .unwrap();
                }));
            }
        }
        for task in tasks {
            task.await.unwrap();
        }
        let contents = read_volume(&pool, "shared").await;
        for block in 0..block_count as usize {
            for sector in 0..sectors_per_block {
                let expected = round
                    .wrapping_mul(31)
                    .wrapping_add((block as u8) << 3)
                    .wrapping_add(sector as u8)
                    | 1;
                let start = block * BLOCK + sector * 512;
                assert!(
                    contents[start..start + 512]
                        .iter()
                        .all(|byte| *byte == expected),
                    "round {round}: block {block} sector {sector} lost its write"
                );
            }
        }
        if round % 10 == 9 {
            pool.flush().await.unwrap();
        }
    }
    // Smaller, odd-sized pieces too: 64 tasks each owning 64 bytes of one block.
    let mut tasks = Vec::new();
    for piece in 0..64u64 {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            pool.write(
                volume_id,
                3 * BLOCK_SIZE_BYTES + piece * 64,
                &[piece as u8 + 1; 64],
                false,
            )
            .await
            .unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let pool = reopen(&device, pool, false).await;
    let contents = read_volume(&pool, "shared").await;
    for piece in 0..64usize {
        let start = 3 * BLOCK + piece * 64;
        assert!(
            contents[start..start + 64]
                .iter()
                .all(|byte| *byte == piece as u8 + 1),
            "piece {piece} lost"
        );
    }
}

/// Concurrent writers of whole and partial blocks in disjoint regions of several
/// volumes, with concurrent readers and flushes; the final contents match.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_disjoint_writers_match_their_models() {
    let (device, pool) = new_pool(96).await;
    let region_bytes: u64 = 24 * BLOCK_SIZE_BYTES;
    let writer_count = 8u64;
    let mut volume_ids = Vec::new();
    for index in 0..2 {
        let name = format!("volume{index}");
        volume_ids.push(
            pool.create_volume(&name, region_bytes * writer_count)
                .await
                .unwrap()
                .volume_id,
        );
    }
    let mut tasks = Vec::new();
    for writer in 0..writer_count * 2 {
        let pool = pool.clone();
        let volume_id = volume_ids[(writer % 2) as usize];
        let base = (writer / 2) * region_bytes;
        tasks.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(writer);
            let mut model = vec![0u8; region_bytes as usize];
            for _ in 0..150 {
                let offset = rng.random_range(0..region_bytes - 1);
                let length = rng
                    .random_range(1..3 * BLOCK as u64)
                    .min(region_bytes - offset);
                let mut data = vec![0u8; length as usize];
                rng.fill(&mut data[..]);
                pool.write(volume_id, base + offset, &data, false)
                    .await
                    .unwrap();
                model[offset as usize..(offset + length) as usize].copy_from_slice(&data);
                if rng.random_bool(0.05) {
                    pool.flush().await.unwrap();
                }
                if rng.random_bool(0.2) {
                    let mut buffer = vec![0u8; region_bytes as usize];
                    pool.read(volume_id, base, &mut buffer).await.unwrap();
                    assert!(buffer == model, "writer {writer}: region differs");
                }
            }
            (volume_id, base, model)
        }));
    }
    let mut models = Vec::new();
    for task in tasks {
        models.push(task.await.unwrap());
    }
    let pool = reopen(&device, pool, false).await;
    for (volume_id, base, model) in models {
        let mut buffer = vec![0u8; model.len()];
        pool.read(volume_id, base, &mut buffer).await.unwrap();
        assert!(
            buffer == model,
            "volume {volume_id} region at {base} differs after reopen"
        );
    }
}

#[tokio::test]
async fn zeroing_reads_zeros_and_punching_leaves_holes() {
    let (device, pool) = new_pool(64).await;
    let block_count = 64u64;
    let size_bytes = block_count * BLOCK_SIZE_BYTES;
    let volume_id = pool
        .create_volume("zero", size_bytes)
        .await
        .unwrap()
        .volume_id;
    assert_eq!(
        pool.extents(volume_id, 0, size_bytes).unwrap(),
        [Extent {
            length: size_bytes,
            allocated: false
        }]
    );
    pool.write(volume_id, 0, &vec![0xABu8; size_bytes as usize], false)
        .await
        .unwrap();
    let mut model = vec![0xABu8; size_bytes as usize];
    let mut allocated = vec![true; block_count as usize];
    assert_eq!(
        pool.volume_info("zero").unwrap().allocated_bytes,
        size_bytes
    );

    // Punch whole blocks 4..12 plus partial edges (block 3 from byte 100, block 12 to byte 50).
    let offset = 3 * BLOCK_SIZE_BYTES + 100;
    let end = 12 * BLOCK_SIZE_BYTES + 50;
    pool.trim(volume_id, offset, end - offset, false)
        .await
        .unwrap();
    model[offset as usize..end as usize].fill(0);
    for flag in &mut allocated[4..12] {
        *flag = false;
    }
    // write_zeroes with punching, whole blocks only.
    pool.write_zeroes(
        volume_id,
        20 * BLOCK_SIZE_BYTES,
        5 * BLOCK_SIZE_BYTES,
        false,
        true,
    )
    .await
    .unwrap();
    model[20 * BLOCK..25 * BLOCK].fill(0);
    for flag in &mut allocated[20..25] {
        *flag = false;
    }
    // write_zeroes without punching: zeros are written, the blocks stay allocated.
    pool.write_zeroes(
        volume_id,
        30 * BLOCK_SIZE_BYTES,
        6 * BLOCK_SIZE_BYTES,
        false,
        false,
    )
    .await
    .unwrap();
    model[30 * BLOCK..36 * BLOCK].fill(0);
    // A sub-block zeroing stays within its block.
    pool.write_zeroes(volume_id, 40 * BLOCK_SIZE_BYTES + 10, 20, true, true)
        .await
        .unwrap();
    model[40 * BLOCK + 10..40 * BLOCK + 30].fill(0);

    let check = |pool: Pool, model: Vec<u8>, allocated: Vec<bool>, context: &'static str| async move {
        assert!(
            read_volume(&pool, "zero").await == model,
            "{context}: contents"
        );
        let extents = pool.extents(volume_id, 0, size_bytes).unwrap();
        assert_extents(&extents, 0, &allocated, context);
        let holes = allocated.iter().filter(|flag| !**flag).count() as u64;
        assert_eq!(
            allocated_and_holes(&extents),
            (
                (block_count - holes) * BLOCK_SIZE_BYTES,
                holes * BLOCK_SIZE_BYTES
            ),
            "{context}"
        );
        assert_eq!(
            pool.volume_info("zero").unwrap().allocated_bytes,
            (block_count - holes) * BLOCK_SIZE_BYTES,
            "{context}"
        );
        // An unaligned extents query is clipped to the range asked for.
        let extents = pool
            .extents(volume_id, 4 * BLOCK_SIZE_BYTES - 7, 14)
            .unwrap();
        assert_eq!(
            extents,
            [
                Extent {
                    length: 7,
                    allocated: true
                },
                Extent {
                    length: 7,
                    allocated: false
                }
            ],
            "{context}"
        );
        pool
    };
    let pool = check(pool, model.clone(), allocated.clone(), "live").await;
    let pool = reopen(&device, pool, false).await;
    let pool = check(pool, model.clone(), allocated.clone(), "after replay").await;
    let pool = reopen(&device, pool, true).await;
    check(pool, model, allocated, "after close").await;
}

#[tokio::test]
async fn resizing_grows_keeping_data_and_shrinks_discarding_the_tail() {
    let (device, pool) = new_pool(64).await;
    let volume_id = pool
        .create_volume("elastic", 16 * BLOCK_SIZE_BYTES)
        .await
        .unwrap()
        .volume_id;
    let mut rng = SmallRng::seed_from_u64(4);
    let mut contents = vec![0u8; 16 * BLOCK];
    rng.fill(&mut contents[..]);
    pool.write(volume_id, 0, &contents, false).await.unwrap();

    let info = pool
        .resize_volume("elastic", 64 * BLOCK_SIZE_BYTES, false)
        .await
        .unwrap();
    assert_eq!(info.size_bytes, 64 * BLOCK_SIZE_BYTES);
    assert_eq!(info.volume_id, volume_id);
    let mut expected = contents.clone();
    expected.resize(64 * BLOCK, 0);
    assert!(read_volume(&pool, "elastic").await == expected);
    pool.write(volume_id, 60 * BLOCK_SIZE_BYTES, &[7u8; BLOCK], false)
        .await
        .unwrap();
    expected[60 * BLOCK..61 * BLOCK].fill(7);

    // Shrink to a size inside block 8..: blocks 8.. are discarded.
    let info = pool
        .resize_volume("elastic", 8 * BLOCK_SIZE_BYTES, true)
        .await
        .unwrap();
    assert_eq!(info.size_bytes, 8 * BLOCK_SIZE_BYTES);
    assert_eq!(info.allocated_bytes, 8 * BLOCK_SIZE_BYTES);
    assert!(read_volume(&pool, "elastic").await == expected[..8 * BLOCK]);
    let mut buffer = [0u8; 1];
    assert!(matches!(
        pool.read(volume_id, 8 * BLOCK_SIZE_BYTES, &mut buffer)
            .await
            .unwrap_err(),
        EngineError::Io(IoError::OutOfRange { .. })
    ));

    // Growing again exposes zeros, never the discarded tail, also after reopen.
    pool.resize_volume("elastic", 64 * BLOCK_SIZE_BYTES, false)
        .await
        .unwrap();
    let mut regrown = expected[..8 * BLOCK].to_vec();
    regrown.resize(64 * BLOCK, 0);
    let tail_extents = pool
        .extents(volume_id, 8 * BLOCK_SIZE_BYTES, 56 * BLOCK_SIZE_BYTES)
        .unwrap();
    assert_eq!(
        tail_extents,
        [Extent {
            length: 56 * BLOCK_SIZE_BYTES,
            allocated: false
        }]
    );
    assert!(read_volume(&pool, "elastic").await == regrown);
    let pool = reopen(&device, pool, false).await;
    assert!(read_volume(&pool, "elastic").await == regrown);
    let pool = reopen(&device, pool, true).await;
    assert!(read_volume(&pool, "elastic").await == regrown);
    assert_eq!(
        pool.volume_info("elastic").unwrap().allocated_bytes,
        8 * BLOCK_SIZE_BYTES
    );
}

#[tokio::test]
async fn rename_and_delete_and_the_volume_list_survive_reopen() {
    let (device, pool) = new_pool(64).await;
    let alpha = pool.create_volume("alpha", 1 << 20).await.unwrap();
    let beta = pool.create_volume("beta", 2 << 20).await.unwrap();
    let gamma = pool.create_volume("gamma", 3 << 20).await.unwrap();
    assert!(alpha.volume_id != beta.volume_id && beta.volume_id != gamma.volume_id);
    pool.write(alpha.volume_id, 0, &[1u8; 3 * BLOCK], false)
        .await
        .unwrap();
    pool.write(beta.volume_id, 4096, &[2u8; BLOCK], false)
        .await
        .unwrap();
    pool.write(gamma.volume_id, 0, &[3u8; BLOCK], false)
        .await
        .unwrap();

    let renamed = pool.rename_volume("alpha", "omega").await.unwrap();
    assert_eq!(renamed.volume_id, alpha.volume_id);
    assert_eq!(renamed.created_unix_seconds, alpha.created_unix_seconds);
    assert!(matches!(
        pool.volume_info("alpha").unwrap_err(),
        EngineError::Volume(VolumeError::NoSuchVolume(_))
    ));
    assert_eq!(
        read_volume(&pool, "omega").await[..3 * BLOCK],
        [1u8; 3 * BLOCK]
    );
    // The old name is free again.
    let reused = pool.create_volume("alpha", 4096).await.unwrap();
    assert!(
        read_volume(&pool, "alpha")
            .await
            .iter()
            .all(|byte| *byte == 0)
    );

    pool.delete_volume("beta").await.unwrap();
    let mut buffer = [0u8; BLOCK];
    assert!(matches!(
        pool.read(beta.volume_id, 4096, &mut buffer)
            .await
            .unwrap_err(),
        EngineError::Volume(VolumeError::NoSuchVolume(_))
    ));
    // A new volume of a deleted one's name is a new, empty volume.
    let beta_again = pool.create_volume("beta", 2 << 20).await.unwrap();
    assert_ne!(beta_again.volume_id, beta.volume_id);
    assert_eq!(beta_again.allocated_bytes, 0);
    assert!(
        read_volume(&pool, "beta")
            .await
            .iter()
            .all(|byte| *byte == 0)
    );

    let listing = |pool: &Pool| {
        let mut volumes = pool.list_volumes();
        volumes.sort_by(|left, right| left.name.cmp(&right.name));
        volumes
    };
    let before = listing(&pool);
    let names: Vec<&str> = before.iter().map(|volume| volume.name.as_str()).collect();
    assert_eq!(names, ["alpha", "beta", "gamma", "omega"]);
    assert_eq!(before[0].volume_id, reused.volume_id);
    assert_eq!(before[3].allocated_bytes, 3 * BLOCK_SIZE_BYTES);
    assert_eq!(before[2].allocated_bytes, BLOCK_SIZE_BYTES);

    let pool = reopen(&device, pool, false).await;
    assert_eq!(listing(&pool), before, "after replay");
    let pool = reopen(&device, pool, true).await;
    assert_eq!(listing(&pool), before, "after close");
    assert_eq!(
        read_volume(&pool, "omega").await[..3 * BLOCK],
        [1u8; 3 * BLOCK]
    );
    assert_eq!(read_volume(&pool, "gamma").await[..BLOCK], [3u8; BLOCK]);
    assert!(
        read_volume(&pool, "beta")
            .await
            .iter()
            .all(|byte| *byte == 0)
    );
    // Identifiers are never reused after reopen either.
    let delta = pool.create_volume("delta", 4096).await.unwrap();
    assert!(
        before
            .iter()
            .all(|volume| volume.volume_id != delta.volume_id)
    );
    assert!(delta.volume_id != beta.volume_id);
    pool.delete_volume("omega").await.unwrap();
    let pool = reopen(&device, pool, false).await;
    let names: Vec<String> = listing(&pool)
        .into_iter()
        .map(|volume| volume.name)
        .collect();
    assert_eq!(names, ["alpha", "beta", "delta", "gamma"]);
}

#[tokio::test]
async fn status_numbers_are_consistent() {
    let (device, pool) = new_pool(64).await;
    let status = pool.status();
    assert_eq!(status.device, "memory");
    assert_eq!(status.segment_size_bytes, SEGMENT_BYTES);
    assert_eq!(status.segment_count, 64);
    assert_eq!(status.capacity_bytes, 64 * SEGMENT_BYTES);
    assert_eq!(status.volume_count, 0);
    assert_eq!(status.client_bytes_written, 0);
    assert!(status.failed.is_none());
    assert!(status.used_bytes <= status.capacity_bytes);
    assert_eq!(
        status.used_bytes + status.free_bytes + status.reserved_bytes,
        status.capacity_bytes,
        "used + free + reserved = capacity: {status:?}"
    );
    assert_eq!(
        status.free_segment_count * SEGMENT_BYTES,
        status.capacity_bytes - status.used_bytes
    );
    let empty_used = status.used_bytes;

    let volume_id = pool.create_volume("data", 4 << 20).await.unwrap().volume_id;
    let written: u64 = 1 << 20;
    pool.write(volume_id, 0, &vec![9u8; written as usize], false)
        .await
        .unwrap();
    pool.flush().await.unwrap();
    let status = pool.status();
    assert_eq!(status.volume_count, 1);
    assert_eq!(status.client_bytes_written, written);
    assert!(status.used_bytes >= empty_used + written, "{status:?}");
    assert!(status.device_bytes_written >= written);
    let amplification = status.write_amplification.expect("clients wrote");
    assert!((1.0..1.5).contains(&amplification), "{status:?}");
    assert_eq!(
        status.used_bytes + status.free_bytes + status.reserved_bytes,
        status.capacity_bytes
    );
    let durable = status.durable_batch_sequence;
    let checkpoint = status.checkpoint_sequence;
    assert!(durable > 0);

    // Sub-block writes cost a whole block each: amplification rises, stays finite.
    for index in 0..16u64 {
        pool.write(volume_id, index * 8192 + 1, &[1u8; 10], false)
            .await
            .unwrap();
    }
    pool.flush().await.unwrap();
    pool.checkpoint().await.unwrap();
    let status = pool.status();
    assert_eq!(status.client_bytes_written, written + 16 * BLOCK_SIZE_BYTES);
    assert!(status.write_amplification.expect("clients wrote") >= 1.0);
    assert!(status.durable_batch_sequence > durable);
    assert!(status.checkpoint_sequence > checkpoint);

    // Deleting the data and two checkpoints return the space.
    let used_full = status.used_bytes;
    pool.delete_volume("data").await.unwrap();
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    let status = pool.status();
    assert_eq!(status.volume_count, 0);
    assert!(
        status.used_bytes + written <= used_full,
        "deleting 1 MiB freed too little: {} -> {}",
        used_full,
        status.used_bytes
    );
    let pool = reopen(&device, pool, true).await;
    let status = pool.status();
    assert!(status.failed.is_none());
    assert_eq!(
        status.used_bytes + status.free_bytes + status.reserved_bytes,
        status.capacity_bytes
    );
}

/// The write counters behind `pool status` (client bytes, device bytes,
/// relocations, and so write amplification) cover the pool's life: a clean
/// reopen keeps them whole, and a crash keeps what the newest checkpoint held.
#[tokio::test]
async fn write_counters_survive_reopens_and_crashes() {
    let (device, pool) = new_pool(64).await;
    let volume = pool.create_volume("data", 2 << 20).await.unwrap().volume_id;
    let write_pass = |pool: Pool, generation: u8| async move {
        for block in 0..256u64 {
            pool.write(
                volume,
                block * BLOCK_SIZE_BYTES,
                &[generation; BLOCK_SIZE_BYTES as usize],
                false,
            )
            .await
            .unwrap();
        }
        pool
    };
    let pool = write_pass(pool, 1).await;
    pool.flush().await.unwrap();
    let before = pool.status();
    assert_eq!(before.client_bytes_written, 256 * BLOCK_SIZE_BYTES);
    let pool = reopen(&device, pool, true).await;
    let after = pool.status();
    assert_eq!(after.client_bytes_written, before.client_bytes_written);
    assert!(after.device_bytes_written >= before.device_bytes_written);
    assert_eq!(
        after.cleaner_relocated_blocks,
        before.cleaner_relocated_blocks
    );
    assert!(after.write_amplification.expect("clients wrote") >= 1.0);
    // A checkpoint, then writes it does not hold, then a crash: the counters
    // come back as the checkpoint held them.
    let pool = write_pass(pool, 2).await;
    pool.checkpoint().await.unwrap();
    let at_checkpoint = pool.status();
    let pool = write_pass(pool, 3).await;
    let pool = reopen(&device, pool, false).await;
    let recovered = pool.status();
    assert_eq!(
        recovered.client_bytes_written,
        at_checkpoint.client_bytes_written
    );
    assert_eq!(recovered.client_bytes_written, 512 * BLOCK_SIZE_BYTES);
    assert!(recovered.device_bytes_written >= at_checkpoint.device_bytes_written);
    // Everything written before the crash was flushed: the data is all there.
    let mut contents = vec![0u8; BLOCK_SIZE_BYTES as usize];
    pool.read(volume, 255 * BLOCK_SIZE_BYTES, &mut contents)
        .await
        .unwrap();
    assert_eq!(contents, vec![3u8; BLOCK_SIZE_BYTES as usize]);
    pool.close().await.unwrap();
}

/// Overwriting many times the pool's capacity reuses space: it never runs out.
#[tokio::test]
async fn overwrites_of_many_times_the_capacity_reuse_space() {
    let (device, pool) = new_pool(32).await;
    let capacity = pool.status().capacity_bytes;
    let small = pool
        .create_volume("small", 256 << 10)
        .await
        .unwrap()
        .volume_id;
    let mut rng = SmallRng::seed_from_u64(8);
    let mut contents = vec![0u8; 256 << 10];
    let mut total = 0u64;
    while total < 4 * capacity {
        rng.fill(&mut contents[..]);
        // Unaligned pieces, so that partial blocks are rewritten too.
        let mut offset = 0;
        while offset < contents.len() {
            let length = rng.random_range(1..64 << 10).min(contents.len() - offset);
            pool.write(
                small,
                offset as u64,
                &contents[offset..offset + length],
                false,
            )
            .await
            .unwrap_or_else(|error| panic!("after {total} bytes: {error:?}"));
            offset += length;
        }
        total += contents.len() as u64;
    }
    assert!(read_volume(&pool, "small").await == contents);
    assert!(pool.status().failed.is_none());
    let pool = reopen(&device, pool, false).await;
    assert!(read_volume(&pool, "small").await == contents);
}

/// Thin provisioning: a pool can hold a volume larger than itself; filling it
/// gives NoSpace (not a failed pool), the data written before stays readable,
/// and trimming, which is how a user frees a full pool, makes room again.
#[tokio::test]
async fn a_full_pool_says_no_space_and_trimming_makes_room() {
    let (device, pool) = new_pool(32).await;
    let capacity = pool.status().capacity_bytes;
    let big = pool
        .create_volume("big", 4 * capacity)
        .await
        .unwrap()
        .volume_id;
    let chunk = vec![0x42u8; 64 << 10];
    let mut offset = 0u64;
    let error = loop {
        match pool.write(big, offset, &chunk, false).await {
            Ok(()) => offset += chunk.len() as u64,
            Err(error) => break error,
        }
        assert!(offset < 4 * capacity, "never ran out of space");
    };
    assert!(
        matches!(error, EngineError::Io(IoError::NoSpace)),
        "{error:?}"
    );
    assert!(error.to_string().contains("full"), "{error}");
    assert!(
        pool.status().failed.is_none(),
        "NoSpace must not fail the pool"
    );
    pool.flush().await.unwrap();
    let mut buffer = vec![0u8; chunk.len()];
    pool.read(big, 0, &mut buffer).await.unwrap();
    assert!(buffer == chunk);
    pool.trim(big, chunk.len() as u64, offset - chunk.len() as u64, false)
        .await
        .unwrap_or_else(|error| panic!("trimming a full pool: {error:?} {:?}", pool.status()));
    pool.write(big, 4 * chunk.len() as u64, &chunk, false)
        .await
        .unwrap_or_else(|error| panic!("writing after a trim: {error:?} {:?}", pool.status()));
    let pool = reopen(&device, pool, true).await;
    for index in [0, 4] {
        let mut buffer = vec![0u8; chunk.len()];
        pool.read(big, index * chunk.len() as u64, &mut buffer)
            .await
            .unwrap();
        assert!(buffer == chunk);
    }
    let mut buffer = vec![0xFFu8; chunk.len()];
    pool.read(big, 2 * chunk.len() as u64, &mut buffer)
        .await
        .unwrap();
    assert!(buffer.iter().all(|byte| *byte == 0));
}

/// Deleting a volume is the other way to free a full pool.
#[tokio::test]
async fn a_full_pool_can_delete_a_volume() {
    let (_device, pool) = new_pool(32).await;
    let capacity = pool.status().capacity_bytes;
    let keep = pool
        .create_volume("keep", 64 << 10)
        .await
        .unwrap()
        .volume_id;
    pool.write(keep, 0, &[9u8; 64 << 10], false).await.unwrap();
    let big = pool
        .create_volume("big", 4 * capacity)
        .await
        .unwrap()
        .volume_id;
    let chunk = vec![0x42u8; 64 << 10];
    let mut offset = 0u64;
    while pool.write(big, offset, &chunk, false).await.is_ok() {
        offset += chunk.len() as u64;
        assert!(offset < 4 * capacity, "never ran out of space");
    }
    pool.delete_volume("big")
        .await
        .unwrap_or_else(|error| panic!("deleting in a full pool: {error:?} {:?}", pool.status()));
    let again = pool
        .create_volume("again", 1 << 20)
        .await
        .unwrap()
        .volume_id;
    pool.write(again, 0, &chunk, false).await.unwrap();
    assert!(read_volume(&pool, "keep").await == [9u8; 64 << 10]);
}

/// A flush with writes to cover issues one device flush, whose time is
/// counted stage by stage (issue 46); a flush with nothing written since
/// issues none and is counted as covered; concurrent flushes of the same
/// writes share one device flush.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_issues_one_device_flush_and_none_when_nothing_is_dirty() {
    let (_device, pool) = new_pool(64).await;
    let volume_id = pool.create_volume("v", 1 << 20).await.unwrap().volume_id;
    pool.flush().await.unwrap();
    let before = pool.status().flush_stages;
    pool.write(volume_id, 0, &[7u8; BLOCK], false)
        .await
        .unwrap();
    pool.flush().await.unwrap();
    let after_write = pool.status().flush_stages;
    assert_eq!(after_write.device_flushes, before.device_flushes + 1);
    assert_eq!(after_write.covered_flushes, before.covered_flushes);
    pool.flush().await.unwrap();
    let after_idle = pool.status().flush_stages;
    assert_eq!(
        after_idle.device_flushes, after_write.device_flushes,
        "nothing was written since: no device flush"
    );
    assert_eq!(after_idle.covered_flushes, after_write.covered_flushes + 1);
    pool.write(volume_id, 4096, &[8u8; BLOCK], false)
        .await
        .unwrap();
    let flushes: Vec<_> = (0..4)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.flush().await })
        })
        .collect();
    for flush in flushes {
        flush.await.unwrap().unwrap();
    }
    let after_concurrent = pool.status().flush_stages;
    let device_flushes = after_concurrent.device_flushes - after_idle.device_flushes;
    let covered = after_concurrent.covered_flushes - after_idle.covered_flushes;
    assert!(
        (1..=2).contains(&device_flushes) && device_flushes + covered == 4,
        "four concurrent flushes of one write: {device_flushes} device flushes, {covered} covered"
    );
}

/// A writer that flushes after every write gets its writes sealed and
/// written as they are appended (write-behind), so that its flush does not
/// start the batch write; a writer that then streams without flushing gets
/// at most two such batches, and its later writes fill batches as before.
/// What was written reads back after a crash that follows the flushes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_a_synchronous_writer_are_written_behind_and_streams_are_not() {
    let (device, pool) = new_pool(64).await;
    let volume_id = pool.create_volume("v", 1 << 20).await.unwrap().volume_id;
    for index in 0..16u64 {
        let block = [index as u8 + 1; BLOCK];
        pool.write(volume_id, index * BLOCK as u64, &block, false)
            .await
            .unwrap();
        pool.flush().await.unwrap();
    }
    let sealed = pool.status().flush_stages.batches_sealed_at_write;
    assert!(
        sealed >= 4,
        "after eight synchronous flushes each write is sealed at once: {sealed}"
    );
    for index in 16..80u64 {
        let block = [index as u8 + 1; BLOCK];
        pool.write(volume_id, index * BLOCK as u64, &block, false)
            .await
            .unwrap();
    }
    let streaming = pool.status().flush_stages.batches_sealed_at_write - sealed;
    assert!(
        streaming <= 2,
        "a streaming writer's batches fill: {streaming} sealed at write"
    );
    pool.flush().await.unwrap();
    let pool = reopen(&device, pool, false).await;
    let contents = read_volume(&pool, "v").await;
    for index in 0..80usize {
        assert!(
            contents[index * BLOCK..(index + 1) * BLOCK]
                .iter()
                .all(|byte| *byte == index as u8 + 1),
            "block {index}"
        );
    }
}

/// A write that leaves unflushed data over `dirty_bytes_max` starts a flush
/// in the background (the write's append reads the limit in its own hold of
/// the state lock), both on the path that answers a write at once and on
/// the waiting one (a partial block), with no client flush and no periodic
/// one; what was written reads back after a crash that follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_over_the_dirty_limit_start_a_flush_in_the_background() {
    for partial in [false, true] {
        let device = Arc::new(MemoryDevice::new((4 << 20) + 64 * SEGMENT_BYTES));
        let limits = PoolLimits {
            dirty_bytes_max: 16 * BLOCK as u64,
            ..quiet_limits()
        };
        let options = PoolOptions {
            segment_size_bytes: SEGMENT_BYTES,
            ..PoolOptions::default()
        };
        let pool = Pool::create(device.clone(), options, limits.clone())
            .await
            .unwrap();
        let volume_id = pool.create_volume("v", 1 << 20).await.unwrap().volume_id;
        let before = pool.status().durable_batch_sequence;
        for index in 0..64u64 {
            let block = [index as u8 + 1; BLOCK];
            let length = if partial { BLOCK - 1 } else { BLOCK };
            pool.write(volume_id, index * BLOCK as u64, &block[..length], false)
                .await
                .unwrap();
        }
        let mut durable = pool.status().durable_batch_sequence;
        for _ in 0..500 {
            if durable > before {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            durable = pool.status().durable_batch_sequence;
        }
        assert!(
            durable > before,
            "64 blocks over a 16-block dirty limit, partial {partial}: nothing made durable"
        );
        pool.flush().await.unwrap();
        pool.abandon();
        drop(pool);
        let pool = Pool::open(device.clone(), limits).await.unwrap();
        let contents = read_volume(&pool, "v").await;
        for index in 0..64usize {
            let expected = if partial { BLOCK - 1 } else { BLOCK };
            let block = &contents[index * BLOCK..(index + 1) * BLOCK];
            assert!(
                block[..expected]
                    .iter()
                    .all(|byte| *byte == index as u8 + 1),
                "block {index}"
            );
        }
    }
}
