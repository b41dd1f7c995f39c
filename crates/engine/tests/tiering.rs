//! Two-tier pools (flash, then capacity) in the engine: the cleaner demotes cold
//! blocks to capacity when flash fills, reads promote recently re-read capacity
//! blocks back to flash, one sequential scan promotes nothing, priorities and
//! pins steer both, and through all of it every block reads back as written,
//! also after a clean reopen and after a crash. The devices are in memory; the
//! rotating-disk model is exercised by the daemon tests and the benchmarks.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;
use common::blocks::{block_contents, write_blocks_flushed};
use common::pools::{options, wait_for_free_flash};

use std::sync::Arc;

use lamina_device::{BlockDevice, ConcatenatedDevice, MemoryDevice};
use lamina_engine::{
    BLOCK_SIZE_BYTES, CachePriority, CreateError, EngineError, OpenError, Pin, Pool, PoolLimits,
    PoolOptions, TierPolicy,
};

const SEGMENT_BYTES: u64 = 256 << 10;
/// 4 MiB of metadata, then 48 segments (12 MiB) of flash.
const FLASH_BYTES: u64 = (4 << 20) + 48 * SEGMENT_BYTES;
/// 1 MiB label, then 192 segments (48 MiB) of capacity.
const CAPACITY_BYTES: u64 = (1 << 20) + 192 * SEGMENT_BYTES;
const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

fn limits() -> PoolLimits {
    PoolLimits {
        // Reads must reach the tiers for the hit counts to mean anything.
        memory_cache_bytes: 0,
        ..PoolLimits::default()
    }
}

async fn verify_range(pool: &Pool, volume: u32, blocks: std::ops::Range<u64>, generation: u8) {
    let mut contents = vec![0u8; BLOCK];
    for index in blocks {
        pool.read(volume, index * BLOCK_SIZE_BYTES, &mut contents)
            .await
            .unwrap();
        assert!(
            contents == block_contents(index, generation),
            "block {index} changed"
        );
    }
}

/// A flash tier of 12 MiB under a 32 MiB volume: only demotion makes room.
async fn filled_pool() -> (Arc<MemoryDevice>, Arc<MemoryDevice>, Pool, u32) {
    filled_pool_with(limits()).await
}

async fn filled_pool_with(limits: PoolLimits) -> (Arc<MemoryDevice>, Arc<MemoryDevice>, Pool, u32) {
    let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let capacity = Arc::new(MemoryDevice::new(CAPACITY_BYTES));
    let device = Arc::new(ConcatenatedDevice::new(flash.clone(), capacity.clone()));
    let pool = Pool::create(device, options(SEGMENT_BYTES, Some(FLASH_BYTES)), limits)
        .await
        .unwrap();
    let volume = pool
        .create_volume("data", 32 << 20)
        .await
        .unwrap()
        .volume_id;
    write_blocks_flushed(&pool, volume, 0..8192, 1).await;
    wait_for_free_flash(&pool, 7 * SEGMENT_BYTES).await;
    (flash, capacity, pool, volume)
}

#[tokio::test]
async fn data_larger_than_flash_is_demoted_and_reads_back() {
    let (_, _, pool, volume) = filled_pool().await;
    let status = pool.status();
    let capacity = status.capacity.expect("a two-tier pool");
    assert!(status.demoted_blocks > 0, "{status:?}");
    assert!(capacity.used_bytes > 0);
    assert_eq!(status.flash.size_bytes, 48 * SEGMENT_BYTES);
    assert_eq!(capacity.size_bytes, 192 * SEGMENT_BYTES);
    let stats = pool.volume_tier_stats("data").unwrap();
    assert_eq!(stats.flash_bytes + stats.capacity_bytes, 32 << 20);
    assert!(stats.capacity_bytes >= (32 << 20) - 12 * (1 << 20));
    verify_range(&pool, volume, 0..8192, 1).await;
    // Overwriting everything kills the capacity copies; the cleaner keeps up.
    write_blocks_flushed(&pool, volume, 0..8192, 2).await;
    write_blocks_flushed(&pool, volume, 0..8192, 3).await;
    verify_range(&pool, volume, 0..8192, 3).await;
    pool.close().await.unwrap();
}

#[tokio::test]
async fn a_reread_working_set_moves_to_flash_and_a_scan_does_not() {
    let (_, _, pool, volume) = filled_pool().await;
    // The first blocks written are the oldest: demoted by now.
    let working_set = 0..256u64;
    let before = pool.volume_tier_stats("data").unwrap();
    assert!(before.capacity_bytes > 0);
    // One scan of 4,096 blocks: every block read once, none promoted.
    verify_range(&pool, volume, 2048..6144, 1).await;
    assert_eq!(pool.status().promoted_blocks, 0, "a scan promoted blocks");
    // The working set read again and again: from the second read on, its
    // blocks are promoted as fast as the demoter makes room on flash.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        verify_range(&pool, volume, working_set.clone(), 1).await;
        let stats = pool.volume_tier_stats("data").unwrap();
        if stats.counters.promoted_blocks >= 250 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the working set was not promoted: {stats:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Now it is served from flash.
    let reads_before = pool.volume_tier_stats("data").unwrap().counters;
    verify_range(&pool, volume, working_set.clone(), 1).await;
    let reads_after = pool.volume_tier_stats("data").unwrap().counters;
    let from_capacity = reads_after.capacity_read_blocks - reads_before.capacity_read_blocks;
    assert!(
        from_capacity <= 6,
        "{from_capacity} of 256 working-set reads still went to capacity"
    );
    pool.close().await.unwrap();
}

#[tokio::test]
async fn priorities_and_pins_steer_promotion_and_demotion() {
    let (_, _, pool, volume) = filled_pool().await;
    // High priority promotes on first read.
    pool.set_volume_policy(
        "data",
        TierPolicy {
            priority: CachePriority::High,
            pin: Pin::Auto,
        },
    )
    .await
    .unwrap();
    verify_range(&pool, volume, 0..64, 1).await;
    assert!(pool.status().promoted_blocks >= 60);
    // None never promotes.
    pool.set_volume_policy(
        "data",
        TierPolicy {
            priority: CachePriority::None,
            pin: Pin::Auto,
        },
    )
    .await
    .unwrap();
    let promoted = pool.status().promoted_blocks;
    for _ in 0..3 {
        verify_range(&pool, volume, 1024..1088, 1).await;
    }
    assert_eq!(pool.status().promoted_blocks, promoted);
    // Pinned to capacity: cleaning flash moves all of the volume off it.
    pool.set_volume_policy(
        "data",
        TierPolicy {
            priority: CachePriority::Normal,
            pin: Pin::Capacity,
        },
    )
    .await
    .unwrap();
    for _ in 0..8 {
        pool.clean(48).await.unwrap();
        pool.checkpoint().await.unwrap();
    }
    // All of it but what sits in the open log head (promoted blocks), which
    // is not cleaned while it is being written.
    let stats = pool.volume_tier_stats("data").unwrap();
    assert!(stats.flash_bytes <= SEGMENT_BYTES, "{stats:?}");
    assert_eq!(stats.policy.pin, Pin::Capacity);
    verify_range(&pool, volume, 0..8192, 1).await;
    pool.close().await.unwrap();
}

#[tokio::test]
async fn tiers_and_policies_survive_a_reopen_and_a_crash() {
    let (flash, capacity, pool, volume) = filled_pool().await;
    let policy = TierPolicy {
        priority: CachePriority::Low,
        pin: Pin::Flash,
    };
    pool.set_volume_policy("data", policy).await.unwrap();
    pool.close().await.unwrap();
    let reopen = || async {
        let device = Arc::new(ConcatenatedDevice::new(flash.clone(), capacity.clone()));
        Pool::open(device, limits()).await.unwrap()
    };
    let pool = reopen().await;
    assert_eq!(pool.volume_info("data").unwrap().policy, policy);
    // Pinned to flash but twice its size: reads promote until flash is full,
    // and a pin is a preference, so writes still find room.
    verify_range(&pool, volume, 0..8192, 1).await;
    write_blocks_flushed(&pool, volume, 0..512, 4).await;
    // Crash: nothing after the last flush is owed, everything before it is.
    pool.abandon();
    drop(pool);
    let pool = reopen().await;
    verify_range(&pool, volume, 0..512, 4).await;
    verify_range(&pool, volume, 512..8192, 1).await;
    assert_eq!(pool.volume_info("data").unwrap().policy, policy);
    pool.close().await.unwrap();
}

#[tokio::test]
async fn another_capacity_device_is_refused_and_left_alone() {
    let (flash, _, pool, _) = filled_pool().await;
    pool.close().await.unwrap();
    // A capacity device of another pool, and a blank one.
    let (_, other_capacity, other, _) = filled_pool().await;
    other.close().await.unwrap();
    for capacity in [other_capacity, Arc::new(MemoryDevice::new(CAPACITY_BYTES))] {
        let before = capacity.snapshot();
        let device = Arc::new(ConcatenatedDevice::new(flash.clone(), capacity.clone()));
        let error = match Pool::open(device as Arc<dyn BlockDevice>, limits()).await {
            Ok(_) => panic!("opened with the wrong capacity device"),
            Err(error) => error,
        };
        assert!(
            matches!(
                error,
                EngineError::Open(OpenError::WrongCapacityDevice { .. })
            ),
            "{error:?}"
        );
        assert!(error.to_string().contains("capacity"), "{error}");
        assert!(capacity.snapshot() == before, "refusing changed the device");
    }
}

/// Flash holds the records' and the cleaner's reserves and needs room beyond
/// them: a flash tier of 9 segments is refused at once, with the flash size it
/// would need; capacity holds the checkpoint bodies of both tiers, so one too
/// small for them is refused too.
#[tokio::test]
async fn tiers_too_small_for_their_reserves_are_refused() {
    let small_flash = (4 << 20) + 9 * SEGMENT_BYTES;
    let flash = Arc::new(MemoryDevice::new(small_flash));
    let capacity = Arc::new(MemoryDevice::new(CAPACITY_BYTES));
    let device = Arc::new(ConcatenatedDevice::new(flash, capacity));
    let small_flash_options = PoolOptions {
        flash_region_bytes: Some(small_flash),
        ..options(SEGMENT_BYTES, Some(FLASH_BYTES))
    };
    let error = match Pool::create(device, small_flash_options, limits()).await {
        Ok(_) => panic!("created a pool on 9 segments of flash"),
        Err(error) => error,
    };
    match &error {
        EngineError::Create(CreateError::DeviceTooSmall {
            device,
            minimum_bytes,
            ..
        }) => {
            assert!(device.contains("flash tier"), "{error}");
            assert!(*minimum_bytes > small_flash, "{error}");
        }
        other => panic!("{other:?}"),
    }
    // 8 capacity segments under 12 MiB of flash: too few for three checkpoint
    // bodies plus the capacity tier's own reserve.
    let small_capacity = (1 << 20) + 8 * SEGMENT_BYTES;
    let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let capacity = Arc::new(MemoryDevice::new(small_capacity));
    let device = Arc::new(ConcatenatedDevice::new(flash, capacity));
    let error =
        match Pool::create(device, options(SEGMENT_BYTES, Some(FLASH_BYTES)), limits()).await {
            Ok(_) => panic!("created a pool on 8 segments of capacity"),
            Err(error) => error,
        };
    assert!(
        matches!(&error, EngineError::Create(CreateError::DeviceTooSmall { device, .. }) if device.contains("checkpoints")),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_capacity_device_too_small_is_refused() {
    let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let capacity = Arc::new(MemoryDevice::new(3 << 19));
    let device = Arc::new(ConcatenatedDevice::new(flash, capacity));
    let error =
        match Pool::create(device, options(SEGMENT_BYTES, Some(FLASH_BYTES)), limits()).await {
            Ok(_) => panic!("created a pool on a capacity device of 1.5 MiB"),
            Err(error) => error,
        };
    assert!(
        matches!(&error, EngineError::Create(CreateError::DeviceTooSmall { device, .. }) if device.contains("capacity")),
        "{error:?}"
    );
}

/// A promoted block brings along the blocks that follow it both in the volume
/// and on capacity (written and demoted together): one more device read, and
/// a sequentially written working set returns to flash in a sixteenth of the
/// reads. Their contents are checked like any read's.
#[tokio::test]
async fn a_promoted_block_brings_its_demoted_neighbours() {
    let (_, _, pool, volume) = filled_pool().await;
    let mut contents = vec![0u8; BLOCK];
    // Block 1000 was written with its neighbours and demoted with them.
    for _ in 0..2 {
        pool.read(volume, 1000 * BLOCK_SIZE_BYTES, &mut contents)
            .await
            .unwrap();
    }
    assert_eq!(contents, block_contents(1000, 1));
    let stats = pool.volume_tier_stats("data").unwrap();
    assert_eq!(
        stats.counters.promoted_blocks, 16,
        "block 1000 and the 15 after it: {stats:?}"
    );
    // Once the moves are written, the 16 blocks read from flash.
    pool.flush().await.unwrap();
    let before = stats.counters;
    verify_range(&pool, volume, 1000..1016, 1).await;
    let after = pool.volume_tier_stats("data").unwrap().counters;
    assert_eq!(after.capacity_read_blocks, before.capacity_read_blocks);
    assert_eq!(after.flash_read_blocks - before.flash_read_blocks, 16);
    pool.close().await.unwrap();
}

/// The demoter frees flash whose deaths only need to become durable with a
/// flush, not a checkpoint: a client overwriting a small hot set, with no
/// periodic flush or checkpoint, keeps emptying flash segments, and each of
/// them is reusable once its batches are flushed. The demoter used to take a
/// checkpoint (a full map image) for them every 250 ms: 6 or 7 here, none now.
#[tokio::test]
async fn the_demoter_frees_flash_with_flushes_when_no_segment_needs_a_checkpoint() {
    let (_, _, pool, volume) = filled_pool_with(PoolLimits {
        test_hooks: lamina_engine::TestHooks::without_periodic_flush_and_checkpoint(),
        ..limits()
    })
    .await;
    let checkpoints_before = pool.status().checkpoint_sequence;
    // 2 MiB of hot blocks, rewritten 80 times (160 MiB through 12 MiB of
    // flash) for about two seconds: the demoter (every 20 ms) looks about 100
    // times, and the old rule took a checkpoint every 250 ms (7 or 8).
    let hot_blocks = 0..512u64;
    for generation in 2..82u8 {
        for chunk_start in hot_blocks.clone().step_by(32) {
            let mut data = Vec::with_capacity(32 * BLOCK);
            for index in chunk_start..chunk_start + 32 {
                data.extend_from_slice(&block_contents(index, generation));
            }
            pool.write(volume, chunk_start * BLOCK_SIZE_BYTES, &data, false)
                .await
                .unwrap();
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let status = pool.status();
    let checkpoints = status.checkpoint_sequence - checkpoints_before;
    assert!(
        checkpoints <= 1,
        "{checkpoints} checkpoints where flushes were enough"
    );
    verify_range(&pool, volume, hot_blocks.clone(), 81).await;
    verify_range(&pool, volume, 512..8192, 1).await;
    pool.close().await.unwrap();
}

/// A two-tier pool over fault-injecting flash and capacity devices, for the
/// rot tests: a `cold` volume (1,024 blocks) and a `hot` one (16) at version
/// 1 behind a checkpoint, `cold` then pinned to capacity.
struct RotRig {
    device: Arc<ConcatenatedDevice>,
    flash: Arc<lamina_device::FaultyDevice<MemoryDevice>>,
    capacity: Arc<lamina_device::FaultyDevice<MemoryDevice>>,
    limits: PoolLimits,
    pool: Pool,
    cold: u32,
    hot: u32,
}

const HOT_BLOCKS: u64 = 16;
const COLD_BLOCKS: u64 = 1024;

async fn rot_rig() -> RotRig {
    use lamina_device::FaultyDevice;
    let flash = Arc::new(FaultyDevice::new(
        Arc::new(MemoryDevice::new(FLASH_BYTES)),
        11,
    ));
    let capacity = Arc::new(FaultyDevice::new(
        Arc::new(MemoryDevice::new(CAPACITY_BYTES)),
        12,
    ));
    let device = Arc::new(ConcatenatedDevice::new(flash.clone(), capacity.clone()));
    let limits = PoolLimits {
        test_hooks: lamina_engine::TestHooks::without_periodic_flush_and_checkpoint(),
        dirty_bytes_max: u64::MAX / 2,
        ..limits()
    };
    let pool = Pool::create(
        device.clone(),
        options(SEGMENT_BYTES, Some(FLASH_BYTES)),
        limits.clone(),
    )
    .await
    .unwrap();
    let cold = pool.create_volume("cold", 4 << 20).await.unwrap().volume_id;
    let hot = pool.create_volume("hot", 1 << 20).await.unwrap().volume_id;
    write_blocks_flushed(&pool, cold, 0..COLD_BLOCKS, 1).await;
    write_blocks_flushed(&pool, hot, 0..HOT_BLOCKS, 1).await;
    pool.checkpoint().await.unwrap();
    let pinned = TierPolicy {
        priority: CachePriority::Normal,
        pin: Pin::Capacity,
    };
    pool.set_volume_policy("cold", pinned).await.unwrap();
    RotRig {
        device,
        flash,
        capacity,
        limits,
        pool,
        cold,
        hot,
    }
}

impl RotRig {
    /// The process dies right after its last flush's marker was written;
    /// then one bit of `logical_block` of `hot` (version 2) rots on flash,
    /// and the pool is opened again: that block must read as an error, the
    /// others as written.
    async fn crash_rot_and_check(self, logical_block: u64) {
        let physical = self
            .pool
            .physical_block_of(self.hot, logical_block)
            .unwrap();
        self.pool.flush_marker_written().await;
        self.pool.abandon();
        drop(self.pool);
        self.flash
            .flip_bit(physical * BLOCK_SIZE_BYTES + 100, 2)
            .await
            .unwrap();
        self.capacity.fail_flushes(false).await;
        let pool = Pool::open(self.device, self.limits).await.unwrap();
        let mut buffer = vec![0u8; BLOCK];
        let read = pool
            .read(self.hot, logical_block * BLOCK_SIZE_BYTES, &mut buffer)
            .await;
        assert!(
            matches!(
                read,
                Err(EngineError::Io(
                    lamina_engine::IoError::ChecksumMismatch { .. }
                ))
            ),
            "the rotted block read {:?} (version 1: {})",
            read.as_ref().map(|_| ()),
            buffer == block_contents(logical_block, 1)
        );
        for block in (0..HOT_BLOCKS).filter(|block| *block != logical_block) {
            pool.read(self.hot, block * BLOCK_SIZE_BYTES, &mut buffer)
                .await
                .unwrap();
            assert!(buffer == block_contents(block, 2), "block {block}");
        }
        verify_range(&pool, self.cold, 0..COLD_BLOCKS, 1).await;
        pool.close().await.unwrap();
    }
}

/// A client's flush taken while a demotion's capacity batch is written but
/// not yet flushed still makes the log claim the client's batch (decision
/// 0032, as amended): a block of it that rots on flash before a crash reads
/// as an error after recovery, never as the block's older version. (Had the
/// flush made flash alone durable, the client's batch would lie above the
/// log's claim and, without the flush marker's flash claim, recovery would
/// take it for the torn tail and drop the rotted block: version 1.)
#[tokio::test]
async fn rot_in_a_flush_after_a_pending_demotion_is_an_error_not_an_older_version() {
    let rig = rot_rig().await;
    // Cleaning flash demotes the cold volume: capacity batches, written and
    // not flushed (the cleaner leaves its flush to whoever needs the room).
    rig.pool.clean(48).await.unwrap();
    assert!(rig.pool.status().demoted_blocks > 0);
    write_blocks_flushed(&rig.pool, rig.hot, 0..HOT_BLOCKS, 2).await;
    rig.crash_rot_and_check(5).await;
}

/// The same with the capacity tier's writes suspended (its flushes fail, as
/// with an object store that is down): the client's flush makes flash alone
/// durable, the log's claim stays below the demotion's batch, and only the
/// flush marker's flash claim tells recovery that the client's batch was
/// durable — a block of it that rots is an error, never the older version.
#[tokio::test]
async fn rot_in_a_flush_while_capacity_writes_are_suspended_is_an_error_not_an_older_version() {
    let rig = rot_rig().await;
    rig.capacity.fail_flushes(true).await;
    rig.pool.clean(48).await.unwrap();
    assert!(rig.pool.status().demoted_blocks > 0);
    // The first flush finds the capacity tier failing and suspends it; it
    // and the next go on with flash alone and succeed.
    write_blocks_flushed(&rig.pool, rig.hot, 0..HOT_BLOCKS, 2).await;
    let writes = rig.pool.status().capacity_writes;
    assert!(
        writes
            .as_ref()
            .is_some_and(|writes| writes.suspended.is_some()),
        "{writes:?}"
    );
    rig.crash_rot_and_check(9).await;
}

mod compressed {
    //! Compressing volumes on a two-tier pool (issue 44, decision 0074):
    //! fragments are demoted as they are, promoted back to flash as they
    //! are when re-read, and every block reads back exactly through both
    //! moves, after a crash (replay of the moves) and after a clean
    //! restart. The data is this machine's own files.
    use super::*;
    use crate::common::machine_files::bytes_of_files;
    use lamina_engine::{Codec, Location};

    /// The first device block of the capacity tier (the concatenated
    /// device puts capacity right after flash).
    const CAPACITY_FIRST_BLOCK: u64 = FLASH_BYTES / BLOCK_SIZE_BYTES;
    const VOLUME_BLOCKS: u64 = 8192;

    /// `VOLUME_BLOCKS` blocks of this machine's files (Perl modules, then
    /// executables), every seventh one random bytes, which do not compress.
    fn real_blocks() -> Vec<Vec<u8>> {
        let bytes = bytes_of_files(
            &["/usr/share/perl5", "/usr/share/perl", "/usr/bin"],
            VOLUME_BLOCKS as usize * BLOCK,
        );
        assert!(
            bytes.len() >= VOLUME_BLOCKS as usize * BLOCK,
            "not enough files on this machine"
        );
        let mut state = 0x9E37_79B9_7F4A_7C15_u64;
        bytes
            .chunks_exact(BLOCK)
            .take(VOLUME_BLOCKS as usize)
            .enumerate()
            .map(|(index, block)| {
                if index % 7 == 6 {
                    (0..BLOCK)
                        .map(|_| {
                            state ^= state << 13;
                            state ^= state >> 7;
                            state ^= state << 17;
                            state as u8
                        })
                        .collect()
                } else {
                    block.to_vec()
                }
            })
            .collect()
    }

    async fn check_all(pool: &Pool, volume: u32, blocks: &[Vec<u8>], when: &str) {
        // 64 KiB reads: fragments, whole blocks, both tiers in one request.
        let mut contents = vec![0u8; 16 * BLOCK];
        for first in (0..blocks.len()).step_by(16) {
            pool.read(volume, (first * BLOCK) as u64, &mut contents)
                .await
                .unwrap_or_else(|error| panic!("{when}: reading block {first}: {error}"));
            for (position, expected) in blocks[first..first + 16].iter().enumerate() {
                assert!(
                    contents[position * BLOCK..(position + 1) * BLOCK] == expected[..],
                    "{when}: block {} differs",
                    first + position
                );
            }
        }
    }

    /// Fragments of the volume on the capacity tier and on flash.
    fn fragments_by_tier(pool: &Pool, volume: u32) -> (u64, u64) {
        let locations: Vec<Location> = (0..VOLUME_BLOCKS)
            .filter_map(|block| pool.location_of(volume, block))
            .filter(|location| location.is_fragment())
            .collect();
        let on_capacity = locations
            .iter()
            .filter(|location| location.block() >= CAPACITY_FIRST_BLOCK)
            .count() as u64;
        (on_capacity, locations.len() as u64 - on_capacity)
    }

    /// Writes the volume and waits until the demoter has made room on flash.
    async fn demoted_pool(
        codec: &str,
    ) -> (
        Arc<MemoryDevice>,
        Arc<MemoryDevice>,
        Pool,
        u32,
        Vec<Vec<u8>>,
    ) {
        demoted_pool_with(codec, limits()).await
    }

    async fn demoted_pool_with(
        codec: &str,
        limits: PoolLimits,
    ) -> (
        Arc<MemoryDevice>,
        Arc<MemoryDevice>,
        Pool,
        u32,
        Vec<Vec<u8>>,
    ) {
        let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
        let capacity = Arc::new(MemoryDevice::new(CAPACITY_BYTES));
        let device = Arc::new(ConcatenatedDevice::new(flash.clone(), capacity.clone()));
        let pool = Pool::create(device, options(SEGMENT_BYTES, Some(FLASH_BYTES)), limits)
            .await
            .unwrap();
        let codec: Codec = codec.parse().unwrap();
        let volume = pool
            .create_volume_with_compression("data", VOLUME_BLOCKS * BLOCK_SIZE_BYTES, codec)
            .await
            .unwrap()
            .volume_id;
        let blocks = real_blocks();
        for (index, block) in blocks.iter().enumerate() {
            pool.write(volume, (index * BLOCK) as u64, block, false)
                .await
                .unwrap();
        }
        pool.flush().await.unwrap();
        wait_for_free_flash(&pool, 7 * SEGMENT_BYTES).await;
        (flash, capacity, pool, volume, blocks)
    }

    #[tokio::test]
    async fn fragments_are_demoted_promoted_and_read_back_after_a_crash() {
        for codec in ["lz4", "zstd:3"] {
            let (flash, capacity, pool, volume, blocks) = demoted_pool(codec).await;
            let (demoted_fragments, _) = fragments_by_tier(&pool, volume);
            assert!(
                demoted_fragments > 1000,
                "{codec}: {demoted_fragments} fragments on capacity"
            );
            assert!(pool.status().demoted_blocks > 0);
            check_all(&pool, volume, &blocks, "after demotion").await;

            // The oldest blocks are on capacity: promoted on their first read
            // at high priority, as fragments.
            pool.set_volume_policy(
                "data",
                TierPolicy {
                    priority: CachePriority::High,
                    pin: Pin::Auto,
                },
            )
            .await
            .unwrap();
            let on_capacity_before: Vec<u64> = (0..512)
                .filter(|block| {
                    pool.location_of(volume, *block).is_some_and(|location| {
                        location.is_fragment() && location.block() >= CAPACITY_FIRST_BLOCK
                    })
                })
                .collect();
            assert!(
                on_capacity_before.len() > 100,
                "{codec}: {on_capacity_before:?}"
            );
            // Promotions wait for room on flash, which the demoter makes.
            let promoted = |pool: &Pool| {
                on_capacity_before
                    .iter()
                    .filter(|block| {
                        pool.location_of(volume, **block).is_some_and(|location| {
                            location.is_fragment() && location.block() < CAPACITY_FIRST_BLOCK
                        })
                    })
                    .count()
            };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while promoted(&pool) * 10 < on_capacity_before.len() * 9 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{codec}: {} of {} capacity fragments promoted as fragments",
                    promoted(&pool),
                    on_capacity_before.len()
                );
                check_all(&pool, volume, &blocks[..512], "promoting").await;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            let promoted_fragments = promoted(&pool);
            assert!(pool.status().promoted_blocks >= promoted_fragments as u64);
            check_all(&pool, volume, &blocks, "after promotion").await;

            // A crash: the demotions and promotions since the last checkpoint
            // are replayed.
            pool.abandon();
            drop(pool);
            let reopen = || async {
                let device = Arc::new(ConcatenatedDevice::new(flash.clone(), capacity.clone()));
                Pool::open(device, limits()).await.unwrap()
            };
            let pool = reopen().await;
            check_all(&pool, volume, &blocks, "after a crash").await;
            let (on_capacity, on_flash) = fragments_by_tier(&pool, volume);
            assert!(
                on_capacity > 0 && on_flash > 0,
                "{codec}: {on_capacity} {on_flash}"
            );
            // Everything to capacity and back through a clean restart.
            pool.set_volume_policy(
                "data",
                TierPolicy {
                    priority: CachePriority::Normal,
                    pin: Pin::Capacity,
                },
            )
            .await
            .unwrap();
            for _ in 0..8 {
                pool.clean(48).await.unwrap();
                pool.checkpoint().await.unwrap();
            }
            pool.close().await.unwrap();
            let pool = reopen().await;
            check_all(
                &pool,
                volume,
                &blocks,
                "pinned to capacity, after a restart",
            )
            .await;
            let (on_capacity_pinned, _) = fragments_by_tier(&pool, volume);
            assert!(
                on_capacity_pinned > on_capacity,
                "{codec}: pinning moved no fragment: {on_capacity_pinned}"
            );
            let stats = pool.volume_tier_stats("data").unwrap();
            assert!(
                stats.stored_bytes < stats.logical_bytes * 4 / 5,
                "{codec}: {stats:?}"
            );
            pool.close().await.unwrap();
        }
    }

    /// Cold data compressed harder (decision 0074): with a cold codec, the
    /// blocks the cleaner demotes are encoded again, whole blocks of a volume
    /// that does not compress and lz4 fragments alike; the capacity tier holds
    /// fewer bytes than it does without, and everything reads back exactly,
    /// also after a crash (replay of the new forms) and a restart.
    #[tokio::test]
    async fn cold_data_is_compressed_harder_and_reads_back_after_a_crash() {
        let mut capacity_used = Vec::new();
        for (codec, cold) in [
            ("off", "off"),
            ("off", "zstd:9"),
            ("lz4", "off"),
            ("lz4", "zstd:9"),
        ] {
            let cold_limits = PoolLimits {
                cold_compression: cold.parse().unwrap(),
                ..limits()
            };
            let (flash, capacity, pool, volume, blocks) =
                demoted_pool_with(codec, cold_limits.clone()).await;
            check_all(&pool, volume, &blocks, "after demotion").await;
            let (on_capacity, _) = fragments_by_tier(&pool, volume);
            match (codec, cold) {
                ("off", "off") => assert_eq!(on_capacity, 0),
                ("off", _) => assert!(on_capacity > 1000, "{on_capacity} whole blocks compressed"),
                _ => assert!(on_capacity > 1000, "{on_capacity}"),
            }
            pool.abandon();
            drop(pool);
            let reopen = || async {
                let device = Arc::new(ConcatenatedDevice::new(flash.clone(), capacity.clone()));
                Pool::open(device, cold_limits.clone()).await.unwrap()
            };
            let pool = reopen().await;
            check_all(&pool, volume, &blocks, "after a crash").await;
            // Pinned to capacity: the rest moves there, encoded again too.
            pool.set_volume_policy(
                "data",
                TierPolicy {
                    priority: CachePriority::Normal,
                    pin: Pin::Capacity,
                },
            )
            .await
            .unwrap();
            for _ in 0..8 {
                pool.clean(48).await.unwrap();
                pool.checkpoint().await.unwrap();
            }
            pool.close().await.unwrap();
            let pool = reopen().await;
            check_all(
                &pool,
                volume,
                &blocks,
                "pinned to capacity, after a restart",
            )
            .await;
            let stats = pool.volume_tier_stats("data").unwrap();
            capacity_used.push((codec, cold, stats.stored_bytes));
            pool.close().await.unwrap();
        }
        eprintln!("stored bytes (volume codec, cold codec): {capacity_used:?}");
        // zstd:9 on the capacity tier stores less than lz4 or nothing there.
        assert!(
            capacity_used[1].2 < capacity_used[0].2 * 7 / 10,
            "{capacity_used:?}"
        );
        assert!(capacity_used[3].2 < capacity_used[2].2, "{capacity_used:?}");
    }
}
