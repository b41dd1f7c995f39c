//! The engine on a raid6 array of six members (`lamina_layout`): batches
//! start at row boundaries so the array writes whole rows only (no member
//! is read while clients write), a member lost at runtime or at open costs
//! nothing, a bit flip is served right and repaired, and scrub finds and
//! repairs silent damage; compressed blocks (fragments packed in rows) are
//! served right, mended by scrub and survive two lost members after it.

#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;

use lamina_device::{BlockDevice, FaultyDevice, MemoryDevice};
use lamina_engine::log::geometry::DATA_START_BLOCK;
use lamina_engine::{Pool, PoolLimits, PoolOptions, ScrubState, TestHooks};
use lamina_layout::{
    ArrayIdentity, MemberDevice, Redundancy, RedundantArray, TierRole, assemble, create,
};
use rand::{Rng, SeedableRng};

mod common;

use common::blocks::{check, write_random};

const BLOCK: usize = 4096;
const MEMBER_BYTES: u64 = 24 << 20;
const MEMBER_COUNT: usize = 6;
/// Four data blocks per row: 64 KiB segments are 4 whole rows of 4 blocks.
const SEGMENT_BYTES: u64 = 64 << 10;

type Member = Arc<FaultyDevice<MemoryDevice>>;

fn members() -> Vec<Member> {
    (0..MEMBER_COUNT)
        .map(|index| {
            Arc::new(FaultyDevice::new(
                Arc::new(MemoryDevice::new(MEMBER_BYTES)),
                index as u64,
            ))
        })
        .collect()
}

fn member_devices(members: &[Member]) -> Vec<MemberDevice> {
    members
        .iter()
        .enumerate()
        .map(|(index, member)| MemberDevice {
            path: format!("member{index}"),
            device: member.clone() as Arc<dyn BlockDevice>,
        })
        .collect()
}

fn limits() -> PoolLimits {
    PoolLimits {
        test_hooks: TestHooks::without_periodic_flush_and_checkpoint(),
        background_bytes_per_second_max: Some(1 << 40),
        // Reads reach the members, not a cache of what was written.
        memory_cache_bytes: 0,
        ..PoolLimits::default()
    }
}

async fn new_pool(members: &[Member]) -> (Pool, Arc<RedundantArray>) {
    let identity = ArrayIdentity {
        array_identifier: 5,
        tier: TierRole::Flash,
    };
    let array = Arc::new(
        create(
            identity,
            Redundancy::Raid6,
            DATA_START_BLOCK,
            member_devices(members),
        )
        .await
        .expect("array"),
    );
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        flash_row_blocks: array.row_data_blocks(),
        ..PoolOptions::default()
    };
    let pool = Pool::create(array.clone(), options, limits())
        .await
        .expect("pool");
    (pool, array)
}

async fn reopen(members: &[Member], present: &[usize]) -> (Pool, Arc<RedundantArray>) {
    let devices: Vec<MemberDevice> = member_devices(members)
        .into_iter()
        .enumerate()
        .filter(|(index, _)| present.contains(index))
        .map(|(_, device)| device)
        .collect();
    let array = Arc::new(
        assemble(TierRole::Flash, devices)
            .await
            .expect("assembles")
            .array,
    );
    let pool = Pool::open(array.clone(), limits()).await.expect("opens");
    (pool, array)
}

#[tokio::test]
async fn a_raid6_pool_writes_whole_rows_and_survives_two_lost_members() {
    let members = members();
    let (pool, array) = new_pool(&members).await;
    let volume = pool.create_volume("v", 4 << 20).await.unwrap();
    let mut blocks = vec![vec![0_u8; BLOCK]; 1024];
    let reads_before: u64 = array
        .member_status()
        .iter()
        .map(|member| member.bytes_read)
        .sum();
    write_random(&pool, volume.volume_id, &mut blocks, 600, 1).await;
    let reads_after: u64 = array
        .member_status()
        .iter()
        .map(|member| member.bytes_read)
        .sum();
    assert_eq!(reads_after, reads_before, "writes never read a member");
    check(&pool, volume.volume_id, &blocks, "read back").await;

    // One member fails at runtime: reads and writes go on.
    members[2].fail_at_rate(1.0, 1.0).await;
    write_random(&pool, volume.volume_id, &mut blocks, 200, 2).await;
    check(&pool, volume.volume_id, &blocks, "read back").await;
    assert_eq!(array.state(), lamina_layout::ArrayState::Degraded);
    pool.close().await.unwrap();
    drop(pool);

    // Reopened with member 2 back (stale: left out) and member 4 missing.
    members[2].heal().await;
    let (pool, array) = reopen(&members, &[0, 1, 2, 3, 5]).await;
    assert_eq!(array.lost_member_count(), 2);
    check(&pool, volume.volume_id, &blocks, "read back").await;
    write_random(&pool, volume.volume_id, &mut blocks, 100, 3).await;
    check(&pool, volume.volume_id, &blocks, "read back").await;
    pool.close().await.unwrap();
}

/// Flips 40 random bits in the written part of each member's striped region.
async fn flip_bits(members: &[Member], which: &[usize], seed: u64) {
    flip_bits_in_rows(members, which, seed, 2048).await;
}

/// Flips 40 random bits in the first `used_rows` rows of each member's
/// striped region.
async fn flip_bits_in_rows(members: &[Member], which: &[usize], seed: u64, used_rows: u64) {
    let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
    let data_start = (lamina_layout::LABEL_AREA_BLOCKS + DATA_START_BLOCK) * 4096;
    for member in which {
        for _ in 0..40 {
            let offset = data_start
                + random.random_range(0..used_rows) * 4096
                + random.random_range(0..4096);
            members[*member]
                .flip_bit(offset, random.random_range(0..8))
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn bit_flips_are_served_right_repaired_and_found_by_scrub() {
    let members = members();
    let (pool, array) = new_pool(&members).await;
    let volume = pool.create_volume("v", 4 << 20).await.unwrap();
    let mut blocks = vec![vec![0_u8; BLOCK]; 1024];
    write_random(&pool, volume.volume_id, &mut blocks, 800, 4).await;
    pool.checkpoint().await.unwrap();
    // Flip bits all over the striped region of two members (a row with
    // both flipped is still within raid6's two parity columns).
    flip_bits(&members, &[1, 4], 10).await;
    let scrub = pool.scrub().await.unwrap();
    assert_eq!(scrub.state, ScrubState::Finished);
    assert_eq!(scrub.blocks_scrubbed, scrub.blocks_total);
    assert_eq!(scrub.blocks_unrepairable, 0);
    assert!(
        scrub.blocks_repaired > 0,
        "some flips hit live blocks: {scrub:?}"
    );
    let again = pool.scrub().await.unwrap();
    assert_eq!(
        again.blocks_repaired, 0,
        "the first pass repaired everything"
    );
    check(&pool, volume.volume_id, &blocks, "read back").await;
    assert_eq!(
        pool.status().integrity.checksum_errors_repaired,
        scrub.blocks_repaired
    );

    // Reads find and repair flips too.
    flip_bits(&members, &[0, 3], 11).await;
    check(&pool, volume.volume_id, &blocks, "read back").await;
    let repaired = pool.status().integrity.checksum_errors_repaired;
    assert!(repaired > scrub.blocks_repaired, "reads repaired flips");
    let per_member: u64 = array
        .member_status()
        .iter()
        .map(|member| member.checksum_errors_repaired)
        .sum();
    assert_eq!(
        per_member, repaired,
        "each repair is counted against its member"
    );
    check(&pool, volume.volume_id, &blocks, "read back").await;
    pool.close().await.unwrap();
}

/// The metadata blocks (superblock, its copy, both checkpoint slots) are
/// copied on parity + 1 members: damaged on the member read first, the pool
/// still opens from another member's copies, and with two of those members
/// gone from the third, with nothing lost.
#[tokio::test]
async fn damaged_metadata_on_one_member_is_read_from_another() {
    let members = members();
    let (pool, _array) = new_pool(&members).await;
    let volume = pool.create_volume("v", 4 << 20).await.unwrap();
    let mut blocks = vec![vec![0_u8; BLOCK]; 1024];
    write_random(&pool, volume.volume_id, &mut blocks, 300, 6).await;
    pool.close().await.unwrap();
    drop(pool);
    let label_area = lamina_layout::LABEL_AREA_BLOCKS;
    for block in [0, 128, 256, 512] {
        members[0]
            .flip_bit((label_area + block) * 4096 + 40, 2)
            .await
            .unwrap();
    }
    let (pool, _array) = reopen(&members, &[0, 1, 2, 3, 4, 5]).await;
    check(&pool, volume.volume_id, &blocks, "read back").await;
    pool.close().await.unwrap();
    drop(pool);
    // The metadata has parity + 1 copies (members 0 to 2): with the first
    // two gone, the third serves it.
    let (pool, _array) = reopen(&members, &[2, 3, 4, 5]).await;
    check(&pool, volume.volume_id, &blocks, "read back").await;
    pool.close().await.unwrap();
}

/// Compressed blocks on raid6 (issue 44): this machine's files, packed as
/// fragments in whole rows. Bit flips over two members are served right by
/// reads and mended by scrub, whose row checks take rows of fragments like
/// any other (a block of fragments is held, and checked by the fragments
/// that lie wholly in it) and whose fragment pass rebuilds what the rows
/// left; after that scrub, two more members lost lose nothing.
#[tokio::test]
async fn compressed_blocks_are_mended_and_survive_two_lost_members() {
    let members = members();
    let (pool, _array) = new_pool(&members).await;
    let volume = pool.create_volume("v", 4 << 20).await.unwrap();
    pool.set_volume_compression("v", "lz4".parse().unwrap())
        .await
        .expect("arrays take a codec");
    let bytes = common::machine_files::bytes_of_files(
        &["/usr/share/perl5", "/usr/share/perl", "/usr/bin"],
        4 << 20,
    );
    assert!(bytes.len() >= 4 << 20, "not enough files on this machine");
    let blocks: Vec<Vec<u8>> = bytes[..4 << 20]
        .chunks_exact(BLOCK)
        .map(<[u8]>::to_vec)
        .collect();
    for (index, contents) in blocks.iter().enumerate() {
        pool.write(volume.volume_id, (index * BLOCK) as u64, contents, false)
            .await
            .unwrap();
    }
    pool.flush().await.unwrap();
    pool.checkpoint().await.unwrap();
    let info = pool.volume_info("v").unwrap();
    assert!(
        info.stored_bytes * 10 < info.allocated_bytes * 8,
        "the files compress: {info:?}"
    );
    check(&pool, volume.volume_id, &blocks, "read back").await;

    // Rows of 4 data blocks: the compressed data fills fewer than 256
    // rows. Two members flipped: within raid6's two parity columns.
    flip_bits_in_rows(&members, &[1, 4], 30, 256).await;
    check(&pool, volume.volume_id, &blocks, "reads through the flips").await;
    flip_bits_in_rows(&members, &[1, 4], 31, 256).await;
    let scrub = pool.scrub().await.unwrap();
    assert_eq!(scrub.blocks_unrepairable, 0, "{scrub:?}");
    assert!(
        scrub.blocks_repaired + scrub.parity_repaired > 0,
        "some flips hit rows in use: {scrub:?}"
    );
    let again = pool.scrub().await.unwrap();
    assert_eq!(
        again.blocks_repaired + again.parity_repaired,
        0,
        "{scrub:?} {again:?}"
    );
    pool.close().await.unwrap();
    drop(pool);

    let (pool, _array) = reopen(&members, &[1, 2, 4, 5]).await;
    check(
        &pool,
        volume.volume_id,
        &blocks,
        "two members lost after the scrub",
    )
    .await;
    pool.close().await.unwrap();
}
