//! Compression in the engine (issue 44, decision 0070), one test binary:
//! compressed blocks end to end (`blocks`), a volume's codec setting
//! (`setting`) and the space accounting of compressed volumes
//! (`accounting`).

mod common;

use lamina_engine::{PoolLimits, TestHooks};

/// A test that decides every flush and checkpoint itself, with freed
/// segments reused first and no memory cache (reads reach the device).
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

mod blocks {
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
    use lamina_engine::{Codec, Pool, PoolLimits};
    use rand::{Rng, SeedableRng, rngs::SmallRng};

    use crate::common::machine_files::bytes_of_files;
    use crate::common::pools::options;

    const BLOCK: usize = 4096;
    const SEGMENT_BYTES: u64 = 256 << 10;
    const DEVICE_BYTES: u64 = (4 << 20) + 128 * SEGMENT_BYTES;
    const VOLUME_BLOCKS: usize = 1024;
    /// Blocks skipped at most before a test's blocks start, by seed.
    const SKIPPED_BLOCKS_MAX: usize = 64;
    /// Units of 16 bytes in a block.
    const UNITS_PER_BLOCK: u64 = 256;

    use super::limits;

    /// `count` blocks of this machine's files (Perl modules and
    /// executables, in directory order), every fifth block random instead.
    fn real_blocks(count: usize, seed: u64) -> Vec<Vec<u8>> {
        let bytes = bytes_of_files(
            &["/usr/share/perl5", "/usr/share/perl", "/usr/bin"],
            (count + SKIPPED_BLOCKS_MAX) * BLOCK,
        );
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

    /// The codec id in the header of the fragment at `location` as stored
    /// (docs/format.md, "Packed extents": the header's top 4 bits).
    fn stored_codec_id(
        memory: &MemoryDevice,
        location: lamina_engine::log::location::Location,
    ) -> u16 {
        let mut header = [0u8; 2];
        let offset = location.block() * BLOCK as u64 + location.byte_range().start as u64;
        memory.read_sync(offset, &mut header);
        u16::from_le_bytes(header) >> 12
    }

    /// Blocks are encoded before the state lock with the codec this thread
    /// last saw the volume use (`compressed_write`); a change of codec takes
    /// effect at the next write all the same: blocks encoded with the old
    /// codec are encoded again under the lock. One thread (the test's
    /// runtime), so the hint is this test's.
    #[tokio::test(flavor = "current_thread")]
    async fn a_change_of_codec_takes_effect_at_the_next_write() {
        let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
        let pool = new_pool(&memory).await;
        let volume_id = compressing_volume(&pool, "lz4").await;
        let blocks = real_blocks(48, 5);
        let compressible = |index: usize| index % 5 != 4;
        // Each codec for 16 blocks, written one at a time: the first write
        // of each is encoded under the lock, the others before it.
        for (round, codec) in ["lz4", "off", "zstd:1"].into_iter().enumerate() {
            pool.set_volume_compression("data", codec.parse().unwrap())
                .await
                .unwrap();
            let range = round * 16..(round + 1) * 16;
            for index in range.clone() {
                pool.write(volume_id, (index * BLOCK) as u64, &blocks[index], false)
                    .await
                    .unwrap();
            }
            pool.flush().await.unwrap();
            for index in range.filter(|index| compressible(*index)) {
                let location = pool.location_of(volume_id, index as u64).unwrap();
                match codec {
                    "off" => assert!(!location.is_fragment(), "{codec}: block {index}"),
                    _ => {
                        assert!(location.is_fragment(), "{codec}: block {index}");
                        let expected = if codec == "lz4" { 1 } else { 2 };
                        assert_eq!(
                            stored_codec_id(&memory, location),
                            expected,
                            "{codec}: block {index}"
                        );
                    }
                }
            }
        }
        check_all(&pool, volume_id, &blocks, "after three codecs").await;
        pool.close().await.unwrap();
    }

    #[tokio::test]
    async fn a_two_tier_pool_takes_a_codec() {
        // Tiering moves fragments as they are (decision 0074; the tiering
        // tests cover demotion, promotion and restores).
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
        let set = pool
            .set_volume_compression("data", "lz4".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(set.compression, Codec::Lz4);
        let blocks = real_blocks(64, 4);
        write_all(&pool, set.volume_id, &blocks).await;
        pool.flush().await.unwrap();
        check_all(&pool, set.volume_id, &blocks, "on a two-tier pool").await;
        pool.close().await.unwrap();
        // With a memory cache, read from the device, then kept decoded
        // (decision 0075; a two-tier pool decodes its hits while planning).
        let pool = Pool::open(memory.clone(), cached_limits()).await.unwrap();
        check_all(&pool, set.volume_id, &blocks, "from the device").await;
        let hits = decoded_hits_reading_thrice(&pool, set.volume_id, &blocks, "cached").await;
        assert!(hits > 0, "no read was served decoded on a two-tier pool");
        pool.close().await.unwrap();
    }

    /// The tests' limits with an 8 MiB memory cache.
    fn cached_limits() -> PoolLimits {
        PoolLimits {
            memory_cache_bytes: 8 << 20,
            ..limits()
        }
    }

    /// A new pool with an 8 MiB memory cache, whose volume compressing with
    /// `codec` holds `blocks`, flushed.
    async fn cached_pool_holding(
        codec: &str,
        blocks: &[Vec<u8>],
    ) -> (Arc<MemoryDevice>, Pool, u32) {
        let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
        let pool = Pool::create(
            memory.clone(),
            options(SEGMENT_BYTES, None),
            cached_limits(),
        )
        .await
        .unwrap();
        let volume_id = compressing_volume(&pool, codec).await;
        write_all(&pool, volume_id, blocks).await;
        pool.flush().await.unwrap();
        (memory, pool, volume_id)
    }

    /// Reads every block three times over and returns how many reads the
    /// memory cache served decoded meanwhile (a fragment decoded from the
    /// cache twice is kept decoded for the third).
    async fn decoded_hits_reading_thrice(
        pool: &Pool,
        volume_id: u32,
        blocks: &[Vec<u8>],
        when: &str,
    ) -> u64 {
        let before = pool.status().memory_cache.decoded_hits;
        for _ in 0..3 {
            check_all(pool, volume_id, blocks, when).await;
        }
        pool.status().memory_cache.decoded_hits - before
    }

    #[tokio::test]
    async fn hot_fragments_are_served_decoded_through_overwrites_cleaning_and_reuse() {
        // Decision 0075: a fragment read again from the cache is kept
        // decoded. Every read must still return the newest data while
        // fragments die, move and their segments are reused.
        let mut expected = real_blocks(VOLUME_BLOCKS / 2, 6);
        let (memory, pool, volume_id) = cached_pool_holding("lz4", &expected).await;
        let hits = decoded_hits_reading_thrice(&pool, volume_id, &expected, "written").await;
        assert!(hits > 0, "no read was served decoded");
        assert!(pool.status().memory_cache.decoded_bytes > 0);
        // Overwrites: the dead fragments' decoded copies are forgotten.
        let second = real_blocks(VOLUME_BLOCKS / 2, 7);
        for index in (0..expected.len()).step_by(2) {
            expected[index] = second[index].clone();
            pool.write(volume_id, (index * BLOCK) as u64, &second[index], false)
                .await
                .unwrap();
        }
        pool.flush().await.unwrap();
        let hits = decoded_hits_reading_thrice(&pool, volume_id, &expected, "overwritten").await;
        assert!(hits > 0, "no overwritten read was served decoded");
        // The cleaner moves the survivors and frees segments that new data
        // then takes (freed segments are reused first in this test).
        assert!(
            pool.clean(64).await.unwrap() > 0,
            "the cleaner took no victim"
        );
        pool.flush().await.unwrap();
        check_all(&pool, volume_id, &expected, "cleaned").await;
        let third = real_blocks(VOLUME_BLOCKS / 2, 8);
        for index in (1..expected.len()).step_by(2) {
            expected[index] = third[index].clone();
            pool.write(volume_id, (index * BLOCK) as u64, &third[index], false)
                .await
                .unwrap();
        }
        pool.flush().await.unwrap();
        let hits = decoded_hits_reading_thrice(&pool, volume_id, &expected, "reused").await;
        assert!(hits > 0, "no read was served decoded after reuse");
        pool.close().await.unwrap();
        let pool = Pool::open(memory.clone(), cached_limits()).await.unwrap();
        check_all(&pool, volume_id, &expected, "reopened").await;
        pool.close().await.unwrap();
    }

    #[tokio::test]
    async fn the_memory_cache_serves_fragments_from_the_packed_blocks_it_holds() {
        let blocks = real_blocks(64, 5);
        let (memory, pool, volume_id) = cached_pool_holding("zstd:1", &blocks).await;
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
        let pool = Pool::open(memory.clone(), cached_limits()).await.unwrap();
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
}

mod setting {
    //! A volume's compression setting (issue 44): set at creation and live,
    //! it survives a clean restart, a crash (replay of its record), a base
    //! checkpoint and an increment, for a plain volume and a clone; a clone
    //! starts with its origin volume's codec at clone time, a rollback keeps
    //! the volume's current one. These tests prove the setting, not the
    //! compression of writes (the write path's tests do).
    use std::sync::Arc;

    use lamina_device::MemoryDevice;
    use lamina_engine::{Codec, EngineError, Pool, PoolLimits, TestHooks, VolumeError};

    use crate::common::newest_slot;
    use crate::common::pools::options;

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
}

mod accounting {
    //! Space accounting of compressed volumes (issue 44): per volume, logical
    //! (`allocated_bytes`) and stored bytes and their ratio; per pool, the
    //! logical bytes of every distinct live location (kept as a running count,
    //! not a map walk) and the stored bytes of the segment table. The figures
    //! must be exact after writes, overwrites, trims, snapshots, clones,
    //! cleaning, a crash (replay) and a clean restart: the pool's logical bytes
    //! are checked against a model of which write each map holds, and the
    //! stored bytes against identities between the volumes' figures. The data
    //! is this machine's files (it compresses) and random bytes (it stays whole).
    use std::collections::{BTreeMap, HashSet};
    use std::sync::Arc;

    use lamina_device::{BlockDevice, ConcatenatedDevice, MemoryDevice};
    use lamina_engine::{Codec, Pool, VolumeInfo};
    use rand::{Rng, SeedableRng, rngs::SmallRng};

    use crate::common::machine_files::bytes_of_files;
    use crate::common::pools::options;

    const BLOCK: usize = 4096;
    const SEGMENT_BYTES: u64 = 256 << 10;
    const DEVICE_BYTES: u64 = (4 << 20) + 128 * SEGMENT_BYTES;
    const VOLUME_BLOCKS: usize = 512;
    /// Bytes of one unit the segment table counts in.
    const UNIT_BYTES: u64 = 16;

    use super::limits;

    /// The bytes of this machine's Perl modules, in directory order, from
    /// block `skip_blocks` on: text that compresses.
    fn real_blocks(count: usize, skip_blocks: usize) -> Vec<Vec<u8>> {
        let bytes = bytes_of_files(
            &["/usr/share/perl5", "/usr/share/perl"],
            (skip_blocks + count) * BLOCK,
        );
        let blocks: Vec<Vec<u8>> = bytes
            .chunks_exact(BLOCK)
            .skip(skip_blocks)
            .take(count)
            .map(<[u8]>::to_vec)
            .collect();
        assert_eq!(blocks.len(), count, "not enough files on this machine");
        blocks
    }

    fn random_blocks(count: usize, seed: u64) -> Vec<Vec<u8>> {
        let mut rng = SmallRng::seed_from_u64(seed);
        (0..count)
            .map(|_| {
                let mut block = vec![0u8; BLOCK];
                rng.fill(&mut block[..]);
                block
            })
            .collect()
    }

    /// Which write each map holds at each block: a write is one location, so
    /// the distinct writes all maps hold are the pool's live locations.
    #[derive(Default)]
    struct Model {
        maps: BTreeMap<String, Vec<Option<u64>>>,
        next_write: u64,
    }

    impl Model {
        fn create(&mut self, name: &str) {
            self.maps
                .insert(name.to_string(), vec![None; VOLUME_BLOCKS]);
        }

        fn copy(&mut self, from: &str, to: &str) {
            let map = self.maps[from].clone();
            self.maps.insert(to.to_string(), map);
        }

        fn remove(&mut self, name: &str) {
            self.maps.remove(name).expect("a map of the model");
        }

        fn write(&mut self, name: &str, block: usize) {
            let write = self.next_write;
            self.next_write += 1;
            self.maps.get_mut(name).expect("a map of the model")[block] = Some(write);
        }

        fn trim(&mut self, name: &str, blocks: std::ops::Range<usize>) {
            for entry in &mut self.maps.get_mut(name).expect("a map of the model")[blocks] {
                *entry = None;
            }
        }

        fn logical_bytes(&self) -> u64 {
            let distinct: HashSet<u64> = self.maps.values().flatten().flatten().copied().collect();
            distinct.len() as u64 * BLOCK as u64
        }
    }

    /// The pool, its model and the device under it.
    struct Harness {
        device: Arc<dyn BlockDevice>,
        pool: Pool,
        model: Model,
    }

    impl Harness {
        async fn write(&mut self, volume: &str, first_block: usize, blocks: &[Vec<u8>]) {
            let volume_id = self.volume(volume).volume_id;
            for (index, block) in blocks.iter().enumerate() {
                let at = first_block + index;
                self.pool
                    .write(volume_id, (at * BLOCK) as u64, block, false)
                    .await
                    .unwrap();
                self.model.write(volume, at);
            }
        }

        async fn trim(&mut self, volume: &str, blocks: std::ops::Range<usize>) {
            let volume_id = self.volume(volume).volume_id;
            let offset = (blocks.start * BLOCK) as u64;
            let length = (blocks.len() * BLOCK) as u64;
            self.pool
                .trim(volume_id, offset, length, false)
                .await
                .unwrap();
            self.model.trim(volume, blocks);
        }

        fn volume(&self, name: &str) -> VolumeInfo {
            self.pool.volume_info(name).unwrap()
        }

        /// The segment table's live units, in bytes.
        fn live_unit_bytes(&self) -> u64 {
            self.pool
                .segment_table()
                .segments
                .iter()
                .map(|segment| u64::from(segment.live_units))
                .sum::<u64>()
                * UNIT_BYTES
        }

        /// The pool's figures agree with the model and the segment table, and
        /// every volume's with its own definition.
        fn check(&self, when: &str) {
            let status = self.pool.status();
            assert_eq!(
                status.logical_bytes,
                self.model.logical_bytes(),
                "{when}: the pool's logical bytes"
            );
            assert_eq!(
                status.stored_bytes,
                self.live_unit_bytes(),
                "{when}: the pool's stored bytes"
            );
            let expected_ratio = match status.stored_bytes {
                0 => 1.0,
                stored => status.logical_bytes as f64 / stored as f64,
            };
            assert_eq!(status.compress_ratio, expected_ratio, "{when}: pool ratio");
            for volume in self.pool.list_volumes() {
                let mapped = self.model.maps[&volume.name].iter().flatten().count();
                assert_eq!(
                    volume.allocated_bytes,
                    (mapped * BLOCK) as u64,
                    "{when}: {} allocated",
                    volume.name
                );
                assert!(
                    volume.unique_stored_bytes <= volume.stored_bytes
                        && volume.stored_bytes <= volume.allocated_bytes,
                    "{when}: {volume:?}"
                );
                let stats = self.pool.volume_tier_stats(&volume.name).unwrap();
                assert_eq!(
                    (stats.logical_bytes, stats.stored_bytes),
                    (volume.allocated_bytes, volume.stored_bytes),
                    "{when}: volume stats of {}",
                    volume.name
                );
                assert_eq!(stats.compress_ratio, volume.compress_ratio);
            }
        }

        /// A crash after a flush: everything replays, the counts come back.
        async fn crash(&mut self) {
            self.pool.flush().await.unwrap();
            self.pool.abandon();
            self.pool = Pool::open(self.device.clone(), limits()).await.unwrap();
        }

        async fn restart(&mut self) {
            self.pool.checkpoint().await.unwrap();
            self.pool.close().await.unwrap();
            self.pool = Pool::open(self.device.clone(), limits()).await.unwrap();
        }
    }

    async fn new_harness() -> Harness {
        let device: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(DEVICE_BYTES));
        let pool = Pool::create(device.clone(), options(SEGMENT_BYTES, None), limits())
            .await
            .unwrap();
        let size_bytes = (VOLUME_BLOCKS * BLOCK) as u64;
        let mut model = Model::default();
        for (name, codec) in [("data", "lz4"), ("random", "lz4"), ("plain", "off")] {
            let codec: Codec = codec.parse().unwrap();
            pool.create_volume_with_compression(name, size_bytes, codec)
                .await
                .unwrap();
            model.create(name);
        }
        Harness {
            device,
            pool,
            model,
        }
    }

    #[tokio::test]
    async fn logical_and_stored_bytes_stay_exact_through_every_operation() {
        let mut harness = new_harness().await;
        let text = real_blocks(VOLUME_BLOCKS, 0);
        harness.write("data", 0, &text).await;
        harness.write("random", 0, &random_blocks(64, 1)).await;
        harness.write("plain", 0, &text[..64]).await;
        // The same blocks again before a flush: the open batch's copies die.
        harness.write("data", 0, &text[..32]).await;
        harness.check("after the writes");
        let data = harness.volume("data");
        assert!(data.compress_ratio > 1.2, "{data:?}");
        assert_eq!(data.unique_stored_bytes, data.stored_bytes);
        for name in ["random", "plain"] {
            let volume = harness.volume(name);
            assert_eq!(volume.stored_bytes, 64 * BLOCK as u64, "{volume:?}");
            assert_eq!(volume.compress_ratio, 1.0, "{volume:?}");
        }
        let stored_sum = |harness: &Harness| -> u64 {
            ["data", "random", "plain"]
                .iter()
                .map(|name| harness.volume(name).stored_bytes)
                .sum()
        };
        assert_eq!(harness.pool.status().stored_bytes, stored_sum(&harness));

        // A snapshot, then half of the volume overwritten and a quarter trimmed:
        // the snapshot keeps what the volume dropped.
        let at_snapshot = harness.volume("data").stored_bytes;
        harness.pool.create_snapshot("data", "s1").await.unwrap();
        harness.model.copy("data", "data@s1");
        let other = real_blocks(VOLUME_BLOCKS / 2, VOLUME_BLOCKS);
        harness.write("data", 0, &other).await;
        harness
            .trim("data", VOLUME_BLOCKS * 3 / 4..VOLUME_BLOCKS)
            .await;
        harness.check("after a snapshot, overwrites and a trim");
        let snapshot_only = |harness: &Harness| {
            let data = harness.volume("data");
            at_snapshot - (data.stored_bytes - data.unique_stored_bytes)
        };
        assert_eq!(
            harness.pool.status().stored_bytes,
            stored_sum(&harness) + snapshot_only(&harness),
            "the pool stores the volumes' blocks and what only the snapshot holds"
        );

        // A clone shares the snapshot's blocks: the pool's figures do not move.
        let before_clone = harness.pool.status();
        harness
            .pool
            .clone_snapshot("data", "s1", "copy")
            .await
            .unwrap();
        harness.model.copy("data@s1", "copy");
        harness.check("after a clone");
        assert_eq!(harness.volume("copy").stored_bytes, at_snapshot);
        assert_eq!(
            (before_clone.logical_bytes, before_clone.stored_bytes),
            (
                harness.pool.status().logical_bytes,
                harness.pool.status().stored_bytes
            )
        );
        harness.write("copy", 8, &random_blocks(8, 2)).await;
        harness.check("after writes to the clone");

        // The cleaner moves live locations: nothing changes.
        harness.pool.flush().await.unwrap();
        let before_cleaning = harness.pool.status();
        let moved = harness.pool.clean(64).await.unwrap();
        assert!(moved > 0, "the cleaner took no victim");
        harness.pool.flush().await.unwrap();
        harness.check("after cleaning");
        assert_eq!(
            harness.pool.status().logical_bytes,
            before_cleaning.logical_bytes
        );

        // A crash and a clean restart rebuild the count from the maps.
        let before_crash = harness.pool.status();
        harness.crash().await;
        harness.check("after replay");
        assert_eq!(
            (before_crash.logical_bytes, before_crash.stored_bytes),
            (
                harness.pool.status().logical_bytes,
                harness.pool.status().stored_bytes
            )
        );
        harness.write("data", 100, &text[200..240]).await;
        harness.restart().await;
        harness.check("after a clean restart");

        // A rollback drops what the volume wrote since the snapshot, then
        // new writes diverge again.
        let rolled_back = harness.pool.rollback_snapshot("data", "s1").await.unwrap();
        harness.model.copy("data@s1", "data");
        assert_eq!(rolled_back.stored_bytes, at_snapshot);
        assert_eq!(rolled_back.unique_stored_bytes, 0);
        harness.check("after a rollback");
        harness.write("data", 300, &text[..16]).await;
        harness.check("after writes since the rollback");

        // Deleting the clone and the snapshot, then trimming everything.
        harness.pool.delete_volume("copy").await.unwrap();
        harness.model.remove("copy");
        harness.pool.delete_snapshot("data", "s1").await.unwrap();
        harness.model.remove("data@s1");
        harness.check("after deleting the clone and the snapshot");
        assert_eq!(harness.pool.status().stored_bytes, stored_sum(&harness));
        for name in ["data", "random", "plain"] {
            harness.trim(name, 0..VOLUME_BLOCKS).await;
        }
        harness.check("after trimming everything");
        let status = harness.pool.status();
        assert_eq!(
            (
                status.logical_bytes,
                status.stored_bytes,
                status.compress_ratio
            ),
            (0, 0, 1.0)
        );
        harness.crash().await;
        harness.check("empty, after replay");
        harness.pool.close().await.unwrap();
    }

    /// 4 MiB of metadata, then 48 segments (12 MiB) of flash, and 48 MiB of
    /// capacity behind it: a two-tier pool (which stores every block whole).
    const FLASH_BYTES: u64 = (4 << 20) + 48 * SEGMENT_BYTES;
    const CAPACITY_BYTES: u64 = (1 << 20) + 192 * SEGMENT_BYTES;

    #[tokio::test]
    async fn the_pool_count_stays_exact_when_blocks_move_between_tiers() {
        let flash = Arc::new(MemoryDevice::new(FLASH_BYTES));
        let capacity = Arc::new(MemoryDevice::new(CAPACITY_BYTES));
        let device: Arc<dyn BlockDevice> = Arc::new(ConcatenatedDevice::new(flash, capacity));
        let pool = Pool::create(
            device.clone(),
            options(SEGMENT_BYTES, Some(FLASH_BYTES)),
            limits(),
        )
        .await
        .unwrap();
        pool.create_volume("data", (VOLUME_BLOCKS * BLOCK) as u64)
            .await
            .unwrap();
        let mut harness = Harness {
            device,
            pool,
            model: Model::default(),
        };
        harness.model.create("data");
        // Twice the flash tier in all: the cleaner demotes to make room.
        for round in 0..5 {
            harness
                .write("data", 0, &random_blocks(VOLUME_BLOCKS, 10 + round))
                .await;
            if round == 1 {
                harness.pool.create_snapshot("data", "s1").await.unwrap();
                harness.model.copy("data", "data@s1");
            }
            harness.pool.flush().await.unwrap();
            harness.pool.clean(48).await.unwrap();
            harness.check("while demoting");
        }
        let status = harness.pool.status();
        assert!(status.demoted_blocks > 0, "{status:?}");
        assert_eq!(status.logical_bytes, status.stored_bytes);
        harness.crash().await;
        harness.check("two tiers, after replay");
        harness.restart().await;
        harness.check("two tiers, after a restart");
        harness.pool.close().await.unwrap();
    }
}
