//! Restoring a two-tier pool whose flash device is lost, from its capacity
//! device alone (format version 9, decision 0038): every block reads back as
//! the version the newest checkpoint (or a later demotion) left on capacity,
//! or as an I/O error when its only copy was on the lost flash — never as
//! another block's data or an older version than the restored checkpoint's;
//! the restored pool takes writes, frees the lost flash as clients overwrite
//! it, and opens again normally. Restores that cannot work are refused with
//! their reason. The devices are in memory.

// Test code keeps `as` for small sizes and byte patterns.
#![allow(clippy::cast_possible_truncation)]

mod common;
use common::blocks::{block_contents, write_blocks_flushed};
use common::pools::{options, wait_for_free_flash};

use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockDevice, ConcatenatedDevice, MemoryDevice};
use lamina_engine::{
    BLOCK_SIZE_BYTES, CachePriority, CreateError, EngineError, FlashRestore, OpenError, Pin, Pool,
    PoolLimits, TestHooks, TierPolicy,
};

const SEGMENT_BYTES: u64 = 256 << 10;
/// 4 MiB of metadata, then 48 segments (12 MiB) of flash.
const FLASH_BYTES: u64 = (4 << 20) + 48 * SEGMENT_BYTES;
/// 1 MiB label, then 192 segments (48 MiB) of capacity.
const CAPACITY_BYTES: u64 = (1 << 20) + 192 * SEGMENT_BYTES;
const BLOCK: usize = BLOCK_SIZE_BYTES as usize;
/// The volume: 32 MiB, more than flash holds, so that most of it is demoted.
const VOLUME_BLOCKS: u64 = 8192;
/// Capacity blocks (from the capacity device's start) of the two slot copies.
const SLOT_COPY_BLOCKS: [u64; 2] = [1, 129];

fn limits() -> PoolLimits {
    PoolLimits {
        memory_cache_bytes: 0,
        ..PoolLimits::default()
    }
}

/// A pool that held generation 1 everywhere, then generation 2 over its
/// first quarter, each flushed, demoted in part and checkpointed; closed.
/// Returns its capacity device (the flash device is dropped: lost).
async fn pool_whose_flash_is_lost() -> (Arc<MemoryDevice>, u64) {
    let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let capacity = Arc::new(MemoryDevice::new(CAPACITY_BYTES));
    let device = Arc::new(ConcatenatedDevice::new(flash, capacity.clone()));
    let pool = Pool::create(device, options(SEGMENT_BYTES, Some(FLASH_BYTES)), limits())
        .await
        .unwrap();
    let volume = pool
        .create_volume("data", VOLUME_BLOCKS * BLOCK_SIZE_BYTES)
        .await
        .unwrap()
        .volume_id;
    write_blocks_flushed(&pool, volume, 0..VOLUME_BLOCKS, 1).await;
    wait_for_free_flash(&pool, 7 * SEGMENT_BYTES).await;
    pool.checkpoint().await.unwrap();
    write_blocks_flushed(&pool, volume, 0..VOLUME_BLOCKS / 4, 2).await;
    pool.checkpoint().await.unwrap();
    pool.close().await.unwrap();
    // Closed: the final checkpoint holds what status shows now.
    let flash_only_bytes = pool.status().flash_only_bytes.unwrap();
    assert!(flash_only_bytes > 0);
    (capacity, flash_only_bytes)
}

/// Restores onto a new flash device and opens the pool; also returns the
/// device, for reopening.
async fn restored(
    capacity: Arc<MemoryDevice>,
) -> Result<(Pool, Arc<ConcatenatedDevice>), EngineError> {
    let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let device = Arc::new(ConcatenatedDevice::new(flash, capacity));
    Pool::restore_flash(FlashRestore {
        device: &*device,
        flash_region_bytes: FLASH_BYTES,
        force: false,
    })
    .await?;
    let pool = Pool::open_restored(device.clone(), limits()).await?;
    Ok((pool, device))
}

/// Reads every block: each is its newest generation, or an I/O error (its
/// only copy was on the lost flash). Returns how many were errors.
async fn count_lost_blocks(pool: &Pool, volume: u32) -> u64 {
    let mut lost = 0;
    let mut contents = vec![0u8; BLOCK];
    for index in 0..VOLUME_BLOCKS {
        let newest = if index < VOLUME_BLOCKS / 4 { 2 } else { 1 };
        match pool
            .read(volume, index * BLOCK_SIZE_BYTES, &mut contents)
            .await
        {
            Ok(()) => assert!(
                contents == block_contents(index, newest),
                "block {index} read back as neither generation {newest} nor an error"
            ),
            Err(_) => lost += 1,
        }
    }
    lost
}

#[tokio::test]
async fn a_lost_flash_device_is_restored_from_the_capacity_tier() {
    let (capacity, flash_only_bytes) = pool_whose_flash_is_lost().await;
    let (pool, device) = restored(capacity).await.unwrap();
    let volume = pool.volume_id("data").unwrap();
    let lost = count_lost_blocks(&pool, volume).await;
    let status = pool.status();
    // What status called "on flash only" is exactly what was marked lost
    // and what reads fail; the lost blocks hold no flash.
    assert!(lost > 0, "some blocks were on flash only");
    assert!(lost < VOLUME_BLOCKS / 2, "most of the volume was demoted");
    assert_eq!(lost * BLOCK_SIZE_BYTES, flash_only_bytes);
    assert_eq!(status.integrity.blocks_marked_lost, lost);
    assert_eq!(status.integrity.lost_block_reads, lost);
    assert_eq!(status.integrity.read_checksum_errors, 0);
    assert_eq!(status.flash_only_bytes, Some(0));

    // Clients overwrite what was lost: the pool takes it, and the lost flash
    // segments are freed as their blocks die.
    write_blocks_flushed(&pool, volume, 0..VOLUME_BLOCKS, 3).await;
    let mut contents = vec![0u8; BLOCK];
    for index in 0..VOLUME_BLOCKS {
        pool.read(volume, index * BLOCK_SIZE_BYTES, &mut contents)
            .await
            .unwrap();
        assert!(contents == block_contents(index, 3), "block {index}");
    }
    pool.close().await.unwrap();
    let pool = Pool::open(device, limits()).await.unwrap();
    for index in 0..VOLUME_BLOCKS {
        pool.read(volume, index * BLOCK_SIZE_BYTES, &mut contents)
            .await
            .unwrap();
        assert!(
            contents == block_contents(index, 3),
            "block {index} after reopening"
        );
    }
    pool.close().await.unwrap();
}

#[tokio::test]
async fn a_damaged_newest_copy_falls_back_to_the_older_checkpoint() {
    let (capacity, _) = pool_whose_flash_is_lost().await;
    // Which copy is newest: the one with the higher checkpoint sequence.
    let newest = newest_copy_index(&capacity).await;
    let garbage = Arc::new(AlignedBuffer::from_slice_padded(&[0xA5; BLOCK]));
    capacity
        .write(SLOT_COPY_BLOCKS[newest] * BLOCK_SIZE_BYTES, garbage)
        .await
        .unwrap();
    let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let device = Arc::new(ConcatenatedDevice::new(flash, capacity));
    let restored = Pool::restore_flash(FlashRestore {
        device: &*device,
        flash_region_bytes: FLASH_BYTES,
        force: false,
    })
    .await
    .unwrap();
    assert_eq!(restored.checkpoint_sequences.len(), 1, "{restored:?}");
    let pool = Pool::open_restored(device, limits()).await.unwrap();
    let volume = pool.volume_id("data").unwrap();
    // The older checkpoint (closing the pool wrote one after generation 2,
    // so both copies hold it), plus the capacity tier's log after it.
    count_lost_blocks(&pool, volume).await;
    pool.close().await.unwrap();
}

async fn newest_copy_index(capacity: &MemoryDevice) -> usize {
    let mut sequences = [0u64; 2];
    for (index, block) in SLOT_COPY_BLOCKS.iter().enumerate() {
        let bytes = capacity
            .read(block * BLOCK_SIZE_BYTES, 127 * BLOCK)
            .await
            .unwrap();
        sequences[index] = lamina_engine::log::checkpoint::Slot::decode(&bytes)
            .unwrap()
            .checkpoint_sequence;
    }
    usize::from(sequences[1] > sequences[0])
}

#[tokio::test]
async fn a_restore_that_cannot_work_is_refused_with_its_reason() {
    let (capacity, _) = pool_whose_flash_is_lost().await;

    // A new flash device of another size would shift the capacity tier.
    let small_flash = Arc::new(MemoryDevice::new(FLASH_BYTES - SEGMENT_BYTES));
    let device = ConcatenatedDevice::new(small_flash, capacity.clone());
    let error = Pool::restore_flash(FlashRestore {
        device: &device,
        flash_region_bytes: FLASH_BYTES - SEGMENT_BYTES,
        force: false,
    })
    .await
    .unwrap_err();
    assert!(
        matches!(
            error,
            EngineError::Open(OpenError::FlashSizeMismatch { .. })
        ),
        "{error}"
    );

    // A flash device that holds data is not written over unless forced.
    let used_flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let data = Arc::new(AlignedBuffer::from_slice_padded(&[7; BLOCK]));
    used_flash.write(8 * BLOCK_SIZE_BYTES, data).await.unwrap();
    let device = ConcatenatedDevice::new(used_flash, capacity.clone());
    let error = Pool::restore_flash(FlashRestore {
        device: &device,
        flash_region_bytes: FLASH_BYTES,
        force: false,
    })
    .await
    .unwrap_err();
    assert!(
        matches!(
            error,
            EngineError::Create(CreateError::DeviceNotEmpty { .. })
        ),
        "{error}"
    );

    // A pool whose capacity tier holds no slot copy (written by a build
    // before format version 9) cannot be restored.
    let zeros = Arc::new(AlignedBuffer::from_slice_padded(&[0; BLOCK]));
    for block in SLOT_COPY_BLOCKS {
        capacity
            .write(block * BLOCK_SIZE_BYTES, zeros.clone())
            .await
            .unwrap();
    }
    let error = restored(capacity).await.err().expect("refused");
    assert!(
        matches!(error, EngineError::Open(OpenError::NoCheckpointCopy { .. })),
        "{error}"
    );
    assert!(error.to_string().contains("format version 9"), "{error}");
}

/// Lost blocks through the operations that walk maps: a snapshot holds them
/// too, scrub skips them (they occupy no block to check), trimming and
/// deleting the snapshot release them, and the pool ends with lost blocks
/// nowhere and its space accounted (a second open agrees).
#[tokio::test]
async fn lost_blocks_survive_snapshots_scrub_trim_and_reopening() {
    let (capacity, _) = pool_whose_flash_is_lost().await;
    let (pool, device) = restored(capacity).await.unwrap();
    let volume = pool.volume_id("data").unwrap();
    pool.create_snapshot("data", "before").await.unwrap();
    let scrubbed = pool.scrub().await.unwrap();
    assert_eq!(scrubbed.blocks_unrepairable, 0, "{scrubbed:?}");
    let lost = count_lost_blocks(&pool, volume).await;
    assert!(lost > 0);
    // Trim the whole volume: the live map drops its lost entries (the
    // snapshot still holds them).
    pool.trim(volume, 0, VOLUME_BLOCKS * BLOCK_SIZE_BYTES, false)
        .await
        .unwrap();
    pool.flush().await.unwrap();
    let mut contents = vec![0u8; BLOCK];
    for index in 0..VOLUME_BLOCKS {
        pool.read(volume, index * BLOCK_SIZE_BYTES, &mut contents)
            .await
            .unwrap();
        assert!(
            contents.iter().all(|byte| *byte == 0),
            "block {index} trimmed"
        );
    }
    pool.delete_snapshot("data", "before").await.unwrap();
    write_blocks_flushed(&pool, volume, 0..VOLUME_BLOCKS, 4).await;
    pool.close().await.unwrap();
    let pool = Pool::open(device, limits()).await.unwrap();
    assert_eq!(pool.status().integrity.blocks_marked_lost, 0);
    for index in 0..VOLUME_BLOCKS {
        pool.read(volume, index * BLOCK_SIZE_BYTES, &mut contents)
            .await
            .unwrap();
        assert!(contents == block_contents(index, 4), "block {index}");
    }
    let scrubbed = pool.scrub().await.unwrap();
    assert_eq!(scrubbed.blocks_unrepairable, 0, "{scrubbed:?}");
    pool.close().await.unwrap();
}

/// Made by the version 8 build (commit eae4bc7) with `lamina pool create
/// --flash flash.img:32M --capacity cap.img:32M --segment-size 1M`, volume
/// `vol` (48 MiB), MiB `k` < 40 filled with `0x10 + k` through NBD, a clean
/// stop; the two files one after the other (the pool's address space).
fn version_8_two_tier_image() -> Vec<u8> {
    use std::io::Read;
    let packed = include_bytes!("data/pool-format-8-two-tier.img.gz");
    let mut image = Vec::new();
    flate2::read::GzDecoder::new(&packed[..])
        .read_to_end(&mut image)
        .unwrap();
    image
}

const VERSION_8_FLASH_BYTES: u64 = 32 << 20;

/// Reads `vol` MiB by MiB, 4 KiB at a time: each block its pattern, or lost
/// where `lost_allowed`. Returns the lost blocks.
async fn check_version_8_contents(pool: &Pool, lost_allowed: bool) -> u64 {
    let volume = pool.volume_id("vol").unwrap();
    let mut lost = 0;
    let mut contents = vec![0u8; BLOCK];
    for block in 0..(48u64 << 20) / BLOCK_SIZE_BYTES {
        let mebibyte = (block * BLOCK_SIZE_BYTES) >> 20;
        let expected = if mebibyte < 40 {
            0x10 + mebibyte as u8
        } else {
            0
        };
        match pool
            .read(volume, block * BLOCK_SIZE_BYTES, &mut contents)
            .await
        {
            Ok(()) => assert!(
                contents.iter().all(|byte| *byte == expected),
                "vol block {block}: expected {expected:#x}"
            ),
            Err(EngineError::Io(lamina_engine::IoError::BlockLost { .. })) if lost_allowed => {
                lost += 1;
            }
            Err(error) => panic!("vol block {block}: {error}"),
        }
    }
    lost
}

/// A version 8 two-tier pool has no slot copies: it cannot be restored
/// without its flash. Opened once by this build, it is upgraded (two
/// checkpoints write the copies) and keeps its data; from then on losing
/// its flash loses only what was on flash.
#[tokio::test]
async fn a_version_8_pool_is_upgraded_and_then_restorable_from_capacity() {
    let image = version_8_two_tier_image();
    let without_flash = |image: &[u8]| {
        let mut bytes = image.to_vec();
        bytes[..VERSION_8_FLASH_BYTES as usize].fill(0);
        Arc::new(MemoryDevice::from_bytes(bytes))
    };
    let restore = |device: Arc<MemoryDevice>| async move {
        Pool::restore_flash(FlashRestore {
            device: &*device,
            flash_region_bytes: VERSION_8_FLASH_BYTES,
            force: false,
        })
        .await?;
        Pool::open_restored(device, limits()).await
    };
    let error = restore(without_flash(&image)).await.err().expect("refused");
    assert!(
        matches!(error, EngineError::Open(OpenError::NoCheckpointCopy { .. })),
        "{error}"
    );

    let memory = Arc::new(MemoryDevice::from_bytes(image));
    assert_eq!(superblock_version(&memory), 8, "the image is version 8");
    let pool = Pool::open(memory.clone(), limits()).await.unwrap();
    assert_eq!(
        superblock_version(&memory),
        lamina_engine::log::FORMAT_VERSION
    );
    check_version_8_contents(&pool, false).await;
    pool.close().await.unwrap();
    let flash_only_bytes = pool.status().flash_only_bytes.unwrap();
    assert!(flash_only_bytes > 0 && flash_only_bytes < 40 << 20);

    let pool = restore(without_flash(&memory.snapshot())).await.unwrap();
    let lost = check_version_8_contents(&pool, true).await;
    assert_eq!(lost * BLOCK_SIZE_BYTES, flash_only_bytes);
    assert_eq!(pool.status().integrity.blocks_marked_lost, lost);
    pool.close().await.unwrap();
}

fn superblock_version(memory: &MemoryDevice) -> u32 {
    let mut bytes = vec![0u8; BLOCK];
    memory.read_sync(0, &mut bytes);
    lamina_engine::log::superblock::Superblock::decode(&bytes)
        .unwrap()
        .0
}

/// A compressing volume (issue 44, decision 0074): its fragments demoted to
/// capacity read back exactly after the restore, those that were on flash
/// only read as lost, and the restored pool takes compressed writes again.
#[tokio::test]
async fn fragments_on_the_capacity_tier_are_restored() {
    let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let capacity = Arc::new(MemoryDevice::new(CAPACITY_BYTES));
    let device = Arc::new(ConcatenatedDevice::new(flash, capacity.clone()));
    let pool = Pool::create(device, options(SEGMENT_BYTES, Some(FLASH_BYTES)), limits())
        .await
        .unwrap();
    let volume = pool
        .create_volume_with_compression(
            "data",
            VOLUME_BLOCKS * BLOCK_SIZE_BYTES,
            "zstd:1".parse().unwrap(),
        )
        .await
        .unwrap()
        .volume_id;
    let bytes = common::machine_files::bytes_of_files(
        &["/usr/share/perl5", "/usr/share/perl", "/usr/bin"],
        VOLUME_BLOCKS as usize * BLOCK,
    );
    assert!(
        bytes.len() >= VOLUME_BLOCKS as usize * BLOCK,
        "not enough files"
    );
    let blocks: Vec<&[u8]> = bytes
        .chunks_exact(BLOCK)
        .take(VOLUME_BLOCKS as usize)
        .collect();
    for (index, block) in blocks.iter().enumerate() {
        pool.write(volume, (index * BLOCK) as u64, block, false)
            .await
            .unwrap();
    }
    pool.flush().await.unwrap();
    wait_for_free_flash(&pool, 7 * SEGMENT_BYTES).await;
    pool.checkpoint().await.unwrap();
    pool.close().await.unwrap();
    let capacity_first_block = FLASH_BYTES / BLOCK_SIZE_BYTES;
    let on_capacity = (0..VOLUME_BLOCKS)
        .filter(|block| {
            pool.location_of(volume, *block).is_some_and(|location| {
                location.is_fragment() && location.block() >= capacity_first_block
            })
        })
        .count() as u64;
    assert!(
        on_capacity > VOLUME_BLOCKS / 4,
        "{on_capacity} fragments demoted"
    );

    let (pool, device) = restored(capacity).await.unwrap();
    let mut contents = vec![0u8; BLOCK];
    let mut lost = 0;
    for (index, block) in blocks.iter().enumerate() {
        match pool
            .read(volume, (index * BLOCK) as u64, &mut contents)
            .await
        {
            Ok(()) => assert!(
                contents == *block,
                "block {index} differs after the restore"
            ),
            Err(EngineError::Io(lamina_engine::IoError::BlockLost { .. })) => lost += 1,
            Err(error) => panic!("block {index}: {error}"),
        }
    }
    assert!(lost > 0, "some fragments were on flash only");
    assert!(
        lost <= VOLUME_BLOCKS - on_capacity,
        "{lost} lost, {on_capacity} on capacity"
    );
    assert_eq!(pool.status().integrity.blocks_marked_lost, lost);
    assert_eq!(pool.status().integrity.read_checksum_errors, 0);
    // Clients rewrite everything, compressed, and it stays through a reopen.
    for (index, block) in blocks.iter().enumerate().rev() {
        pool.write(volume, (index * BLOCK) as u64, block, false)
            .await
            .unwrap();
    }
    pool.close().await.unwrap();
    let pool = Pool::open(device, limits()).await.unwrap();
    for (index, block) in blocks.iter().enumerate() {
        pool.read(volume, (index * BLOCK) as u64, &mut contents)
            .await
            .unwrap();
        assert!(
            contents == *block,
            "block {index} differs after the rewrite"
        );
    }
    pool.close().await.unwrap();
}

/// Blocks of text (this machine's files) from `from_block` on: zstd
/// compresses them better than lz4, so cold compression encodes them again.
fn text_blocks(files: &[u8], from_block: usize, count: usize) -> Vec<Vec<u8>> {
    files[from_block * BLOCK..]
        .chunks_exact(BLOCK)
        .take(count)
        .map(<[u8]>::to_vec)
        .collect()
}

/// Cold data compressed harder (decision 0074): blocks the cleaner demoted
/// in a new form after the newest checkpoint (zstd:9 units under a new
/// checksum, in a `Packed` or `RelocatePacked` record, the only record of
/// that form) are restored when their contents are the checkpoint's: an lz4
/// volume without snapshots (`Packed` moves of lz4 fragments) and a volume
/// that does not compress, with a snapshot (`RelocatePacked` moves of whole
/// blocks). Versions written after the checkpoint, demoted in a new form
/// too, never come back: the lz4 volume's read as lost (their checkpoint
/// version was on flash), the other volume's as the checkpoint's version,
/// which its snapshot kept and the demoter moved.
#[tokio::test]
async fn blocks_demoted_in_a_new_form_after_the_checkpoint_are_restored() {
    const BLOCKS: usize = 512;
    const REWRITTEN: std::ops::Range<usize> = 64..128;
    let limits = PoolLimits {
        cold_compression: "zstd:9".parse().unwrap(),
        test_hooks: TestHooks::without_periodic_flush_and_checkpoint(),
        dirty_bytes_max: u64::MAX / 2,
        ..limits()
    };
    let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let capacity = Arc::new(MemoryDevice::new(CAPACITY_BYTES));
    let device = Arc::new(ConcatenatedDevice::new(flash, capacity.clone()));
    let pool = Pool::create(device, options(SEGMENT_BYTES, Some(FLASH_BYTES)), limits)
        .await
        .unwrap();
    let files = common::machine_files::bytes_of_files(
        &["/usr/share/perl5", "/usr/share/perl"],
        4 * BLOCKS * BLOCK,
    );
    assert!(files.len() >= 4 * BLOCKS * BLOCK, "not enough files");
    let names = ["packed", "whole"];
    let checkpointed = [
        text_blocks(&files, 0, BLOCKS),
        text_blocks(&files, BLOCKS, BLOCKS),
    ];
    let later = [
        text_blocks(&files, 2 * BLOCKS, BLOCKS),
        text_blocks(&files, 3 * BLOCKS, BLOCKS),
    ];
    let mut volumes = [0; 2];
    for (slot, (name, codec)) in volumes.iter_mut().zip(names.iter().zip(["lz4", "off"])) {
        let size = BLOCKS as u64 * BLOCK_SIZE_BYTES;
        *slot = pool
            .create_volume_with_compression(name, size, codec.parse().unwrap())
            .await
            .unwrap()
            .volume_id;
    }
    for (volume, blocks) in volumes.iter().zip(&checkpointed) {
        for (index, block) in blocks.iter().enumerate() {
            pool.write(*volume, (index * BLOCK) as u64, block, false)
                .await
                .unwrap();
        }
    }
    pool.create_snapshot("whole", "kept").await.unwrap();
    pool.flush().await.unwrap();
    pool.checkpoint().await.unwrap();
    let capacity_first_block = FLASH_BYTES / BLOCK_SIZE_BYTES;
    assert!(
        volumes
            .iter()
            .all(|volume| (0..BLOCKS as u64).all(|block| pool
                .location_of(*volume, block)
                .is_some_and(|location| location.block() < capacity_first_block))),
        "the checkpoint maps every block on flash"
    );

    // After the checkpoint, on flash only: later versions of some blocks,
    // then everything pinned to capacity and demoted in zstd:9.
    for (volume, blocks) in volumes.iter().zip(&later) {
        for index in REWRITTEN {
            pool.write(*volume, (index * BLOCK) as u64, &blocks[index], false)
                .await
                .unwrap();
        }
    }
    for name in names {
        let policy = TierPolicy {
            priority: CachePriority::Normal,
            pin: Pin::Capacity,
        };
        pool.set_volume_policy(name, policy).await.unwrap();
    }
    pool.flush().await.unwrap();
    // Every checkpointed version the live maps still hold (the later ones
    // in the open head may stay on flash).
    let demoted = |volume: u32, block: u64| {
        REWRITTEN.contains(&(block as usize))
            || pool.location_of(volume, block).is_some_and(|location| {
                location.is_fragment() && location.block() >= capacity_first_block
            })
    };
    let all_demoted = || {
        volumes
            .iter()
            .all(|volume| (0..BLOCKS as u64).all(|block| demoted(*volume, block)))
    };
    for _ in 0..16 {
        pool.clean(48).await.unwrap();
        pool.flush().await.unwrap();
        if all_demoted() {
            break;
        }
    }
    assert!(all_demoted(), "not every block was demoted in a new form");
    pool.abandon();
    drop(pool);

    let (pool, _device) = restored(capacity).await.unwrap();
    pool.clone_snapshot("whole", "kept", "kept-clone")
        .await
        .unwrap();
    let clone = pool.volume_id("kept-clone").unwrap();
    let mut contents = vec![0u8; BLOCK];
    let mut lost = 0;
    for (volume, (blocks, rewritten_lost)) in [volumes[0], volumes[1], clone].into_iter().zip(
        [&checkpointed[0], &checkpointed[1], &checkpointed[1]]
            .into_iter()
            .zip([true, false, false]),
    ) {
        for (index, block) in blocks.iter().enumerate() {
            let read = pool
                .read(volume, (index * BLOCK) as u64, &mut contents)
                .await;
            match read {
                Ok(()) => assert!(
                    contents == *block,
                    "volume {volume} block {index}: not its checkpointed contents"
                ),
                Err(EngineError::Io(lamina_engine::IoError::BlockLost { .. }))
                    if rewritten_lost && REWRITTEN.contains(&index) =>
                {
                    lost += 1;
                }
                Err(error) => panic!("volume {volume} block {index}: {error}"),
            }
        }
    }
    assert_eq!(lost, REWRITTEN.len() as u64, "the rewritten lz4 blocks");
    assert_eq!(pool.status().integrity.blocks_marked_lost, lost);
    assert_eq!(pool.status().integrity.read_checksum_errors, 0);
    pool.close().await.unwrap();
}
