//! Rebuilding onto distributed spare space (issue 19): a pool on a zoned
//! raid6 array of six members (`lamina_layout::create_zoned_with_slots`, each segment
//! one zone) loses a member; the evacuation moves the live data of every
//! segment that had a column on it into segments laid out over the five
//! left (rows one column narrower), copies the mirrored metadata onto a
//! member in use, and then the pool survives two more losses — at runtime
//! and across a reopen — with every block read back. The rebuild also
//! starts by itself at open, and a member taken out of an evacuated array
//! can be removed and a new device added into its slot. A rebuild cut short
//! by a crash resumes by itself at open; one the members left lack the room
//! for says so (`Pool::rebuild_blocked`) and starts once space is freed.

#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;
use std::time::Duration;

use lamina_device::{BlockDevice, FaultyDevice, MemoryDevice};
use lamina_engine::log::geometry::DATA_START_BLOCK;
use lamina_engine::pool::evacuation::RebuildBlocked;
use lamina_engine::{
    EvacuationGoal, Pool, PoolLimits, PoolOptions, RebuildKind, RebuildStart, RebuildState,
    TestHooks,
};
use lamina_layout::{ArrayIdentity, MemberDevice, Redundancy, RedundantArray, TierRole, assemble};

mod common;

use common::blocks::{check, write_random};

const BLOCK: usize = 4096;
const MEMBER_BYTES: u64 = 24 << 20;
const MEMBER_COUNT: usize = 6;
/// Four data blocks per row at full width, three once narrowed: 64 KiB
/// segments are 4 rows, 16 blocks, then 12.
const SEGMENT_BYTES: u64 = 64 << 10;
/// How long a test waits for a rebuild started in the background.
const REBUILD_WAIT_MS_MAX: u64 = 60_000;

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

fn member_device(index: usize, member: &Member) -> MemberDevice {
    MemberDevice {
        path: format!("member{index}"),
        device: member.clone() as Arc<dyn BlockDevice>,
    }
}

fn limits(rebuild_automatic: bool) -> PoolLimits {
    PoolLimits {
        test_hooks: TestHooks::without_periodic_flush_and_checkpoint(),
        background_bytes_per_second_max: Some(1 << 40),
        memory_cache_bytes: 0,
        rebuild_automatic,
        ..PoolLimits::default()
    }
}

async fn new_pool(members: &[Member], rebuild_automatic: bool) -> (Pool, Arc<RedundantArray>) {
    new_pool_in_slots(members, MEMBER_COUNT, SEGMENT_BYTES, rebuild_automatic).await
}

/// A pool on the members in `slot_count` slots (the rest empty), whose
/// segments are `segment_bytes` of range.
async fn new_pool_in_slots(
    members: &[Member],
    slot_count: usize,
    segment_bytes: u64,
    rebuild_automatic: bool,
) -> (Pool, Arc<RedundantArray>) {
    let devices = members
        .iter()
        .enumerate()
        .map(|(index, member)| member_device(index, member))
        .collect();
    new_pool_on(devices, slot_count, segment_bytes, rebuild_automatic).await
}

async fn new_pool_on(
    devices: Vec<MemberDevice>,
    slot_count: usize,
    segment_bytes: u64,
    rebuild_automatic: bool,
) -> (Pool, Arc<RedundantArray>) {
    let identity = ArrayIdentity {
        array_identifier: 9,
        tier: TierRole::Flash,
    };
    let request = lamina_layout::ZonedArrayRequest {
        redundancy: Redundancy::Raid6,
        prefix_blocks: DATA_START_BLOCK,
        segment_blocks: segment_bytes / BLOCK as u64,
        slot_count,
    };
    let array = Arc::new(
        lamina_layout::create_zoned_with_slots(identity, request, devices)
            .await
            .expect("array"),
    );
    let options = PoolOptions {
        segment_size_bytes: segment_bytes,
        flash_row_blocks: array.row_data_blocks(),
        ..PoolOptions::default()
    };
    let pool = Pool::create(array.clone(), options, limits(rebuild_automatic))
        .await
        .expect("pool");
    (pool, array)
}

async fn reopen(
    members: &[Member],
    present: &[usize],
    rebuild_automatic: bool,
) -> (Pool, Arc<RedundantArray>) {
    let devices: Vec<MemberDevice> = present
        .iter()
        .map(|index| member_device(*index, &members[*index]))
        .collect();
    let array = Arc::new(
        assemble(TierRole::Flash, devices)
            .await
            .expect("assembles")
            .array,
    );
    let pool = Pool::open(array.clone(), limits(rebuild_automatic))
        .await
        .expect("opens");
    (pool, array)
}

async fn lose(members: &[Member], array: &RedundantArray, index: usize) {
    members[index].fail_at_rate(1.0, 1.0).await;
    members[index].fail_flushes(true).await;
    array.fail_member(index);
}

async fn wait_for_rebuild(pool: &Pool) {
    for _ in 0..REBUILD_WAIT_MS_MAX {
        if pool.rebuild_status().state != RebuildState::Rebuilding
            && pool.evacuation_need().is_empty()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the rebuild did not end: {:?}", pool.rebuild_status());
}

#[tokio::test]
async fn a_lost_member_is_rebuilt_onto_the_others_and_two_more_losses_lose_nothing() {
    let members = members();
    let (pool, array) = new_pool(&members, false).await;
    let volume = pool.create_volume("v", 4 << 20).await.unwrap();
    let mut blocks = vec![vec![0_u8; BLOCK]; 1024];
    write_random(&pool, volume.volume_id, &mut blocks, 700, 1).await;
    pool.checkpoint().await.unwrap();

    // Member 1 holds a copy of the metadata and a column of every segment.
    lose(&members, &array, 1).await;
    write_random(&pool, volume.volume_id, &mut blocks, 150, 2).await;
    let need = pool.evacuation_need();
    assert!(need.degraded_segment_count > 0, "{need:?}");
    assert!(need.live_bytes <= need.free_bytes, "{need:?}");

    let status = pool.evacuate().await.expect("rebuild onto the others");
    assert_eq!(status.state, RebuildState::Finished, "{status:?}");
    assert_eq!(status.kind, RebuildKind::DistributedSpare);
    assert!(status.bytes_done > 0, "{status:?}");
    assert!(
        pool.evacuation_need().is_empty(),
        "{:?}",
        pool.evacuation_need()
    );
    assert_eq!(
        array.zones_containing(1),
        0,
        "no zone in use holds member 1"
    );
    assert!(!array.prefix_holders().contains(&1));
    check(&pool, volume.volume_id, &blocks, "after the rebuild").await;

    // Writes go on over the five; then two more members are lost, one of
    // them the first metadata holder: nothing is lost.
    write_random(&pool, volume.volume_id, &mut blocks, 150, 3).await;
    lose(&members, &array, 0).await;
    lose(&members, &array, 4).await;
    check(&pool, volume.volume_id, &blocks, "with three members lost").await;
    pool.close().await.expect("close with three members lost");
    drop(pool);

    let (pool, _array) = reopen(&members, &[2, 3, 5], false).await;
    check(
        &pool,
        volume.volume_id,
        &blocks,
        "reopened on three members",
    )
    .await;
    pool.close().await.unwrap();
}

#[tokio::test]
async fn the_rebuild_starts_by_itself_when_the_pool_opens_without_a_member() {
    let members = members();
    let (pool, _array) = new_pool(&members, true).await;
    let volume = pool.create_volume("v", 4 << 20).await.unwrap();
    let mut blocks = vec![vec![0_u8; BLOCK]; 1024];
    write_random(&pool, volume.volume_id, &mut blocks, 500, 4).await;
    pool.close().await.unwrap();
    drop(pool);

    // Member 3 is missing at open: the pool rebuilds onto the others.
    let (pool, array) = reopen(&members, &[0, 1, 2, 4, 5], true).await;
    wait_for_rebuild(&pool).await;
    let status = pool.rebuild_status();
    assert_eq!(status.state, RebuildState::Finished, "{status:?}");
    assert_eq!(status.kind, RebuildKind::DistributedSpare);
    assert_eq!(array.zones_containing(3), 0);
    check(
        &pool,
        volume.volume_id,
        &blocks,
        "after the automatic rebuild",
    )
    .await;

    // The slot is then emptied and a new device added into it: new
    // segments use all six again.
    array
        .finish_removal(3)
        .await
        .expect("remove the lost member");
    let fresh: Member = Arc::new(FaultyDevice::new(
        Arc::new(MemoryDevice::new(MEMBER_BYTES)),
        33,
    ));
    let slot = array
        .add_member(member_device(3, &fresh))
        .await
        .expect("add a device into the empty slot");
    assert_eq!(slot, 3);
    // The free segments are laid out over the six again.
    assert!(pool.evacuation_need().free_segments_to_lay_out > 0);
    pool.start_rebuild();
    wait_for_rebuild(&pool).await;
    write_random(&pool, volume.volume_id, &mut blocks, 300, 5).await;
    assert!(
        array.zones_containing(3) > 0,
        "new segments use the added device"
    );
    // Any two lost still lose nothing.
    lose(&members, &array, 0).await;
    lose(&members, &array, 5).await;
    check(
        &pool,
        volume.volume_id,
        &blocks,
        "with the added device and two lost",
    )
    .await;
}

/// Six members in eight slots: segments are four rows of six data blocks
/// (96 KiB of range), sixteen blocks of them usable over the six.
const SEGMENT_BYTES_EIGHT_SLOTS: u64 = 96 << 10;

#[tokio::test]
async fn an_added_device_widens_the_pool_and_a_rebalance_spreads_the_data_over_it() {
    let members = members();
    let (pool, array) = new_pool_in_slots(&members, 8, SEGMENT_BYTES_EIGHT_SLOTS, false).await;
    let segment_count = pool.status().segment_count;
    // Space is counted at the width of the six, not the eight slots' range.
    assert_eq!(
        pool.status().capacity_bytes,
        segment_count * 16 * BLOCK as u64
    );
    let volume = pool.create_volume("v", 4 << 20).await.unwrap();
    let mut blocks = vec![vec![0_u8; BLOCK]; 1024];
    write_random(&pool, volume.volume_id, &mut blocks, 900, 11).await;
    pool.checkpoint().await.unwrap();

    let seventh: Member = Arc::new(FaultyDevice::new(
        Arc::new(MemoryDevice::new(MEMBER_BYTES)),
        70,
    ));
    let slot = array
        .add_member(member_device(6, &seventh))
        .await
        .expect("add into an empty slot");
    assert_eq!(slot, 6);
    assert_eq!(
        pool.status().capacity_bytes,
        segment_count * 20 * BLOCK as u64,
        "segments opened now hold five rows' worth"
    );
    let before = pool.evacuation_need_for(EvacuationGoal::Width);
    assert!(before.degraded_segment_count > 0, "{before:?}");
    assert_eq!(
        pool.evacuation_need().degraded_segment_count,
        0,
        "nothing is degraded"
    );

    let status = pool.rebalance().await.expect("rebalance");
    assert_eq!(status.state, RebuildState::Finished, "{status:?}");
    assert_eq!(status.kind, RebuildKind::Rebalance);
    assert!(status.bytes_done > 0, "{status:?}");
    let after = pool.evacuation_need_for(EvacuationGoal::Width);
    assert_eq!(after.degraded_segment_count, 0, "{after:?}");
    assert!(array.zones_containing(6) > 0, "data moved onto the seventh");
    check(&pool, volume.volume_id, &blocks, "after the rebalance").await;

    // Every segment in use is striped over the seven at raid6: any two
    // lost, the added one among them, lose nothing, here and reopened.
    write_random(&pool, volume.volume_id, &mut blocks, 100, 12).await;
    let mut all = members.clone();
    all.push(seventh);
    lose(&all, &array, 6).await;
    lose(&all, &array, 2).await;
    check(
        &pool,
        volume.volume_id,
        &blocks,
        "two lost after the rebalance",
    )
    .await;
    pool.close().await.unwrap();
    drop(pool);
    let (pool, _array) = reopen(&all, &[0, 1, 3, 4, 5], false).await;
    check(&pool, volume.volume_id, &blocks, "reopened without them").await;
    pool.close().await.unwrap();
}

/// How long a flush of a slow member takes: the zone table's updates and
/// the metadata's copy then take long enough for clients to write meanwhile.
const SLOW_FLUSH_MS: u64 = 2;

/// A member whose flushes take [`SLOW_FLUSH_MS`], as a disk's take time.
struct SlowFlushes(Member);

#[async_trait::async_trait]
impl BlockDevice for SlowFlushes {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        lamina_device::DeviceReadFuture::from_or_box(
            async move { self.0.read(offset, length).await },
        )
    }
    async fn write(
        &self,
        offset: u64,
        data: Arc<lamina_device::AlignedBuffer>,
    ) -> Result<(), lamina_device::DeviceError> {
        self.0.write(offset, data).await
    }
    async fn flush(&self) -> Result<(), lamina_device::DeviceError> {
        tokio::time::sleep(Duration::from_millis(SLOW_FLUSH_MS)).await;
        self.0.flush().await
    }
}

/// Clients keep writing while the rebuild runs on members whose flushes
/// take time: the status never counts more done than its total (it
/// counted the total before the free segments were laid out again, while
/// clients still wrote into the degraded head, and reached 202%).
#[tokio::test]
async fn the_rebuild_never_counts_more_done_than_its_total_under_writes() {
    let members = members();
    let devices = members
        .iter()
        .enumerate()
        .map(|(index, member)| MemberDevice {
            path: format!("member{index}"),
            device: Arc::new(SlowFlushes(member.clone())) as Arc<dyn BlockDevice>,
        })
        .collect();
    let (pool, array) = new_pool_on(devices, MEMBER_COUNT, SEGMENT_BYTES, false).await;
    let volume = pool.create_volume("v", 4 << 20).await.unwrap();
    let mut blocks = vec![vec![0_u8; BLOCK]; 1024];
    write_random(&pool, volume.volume_id, &mut blocks, 400, 21).await;
    pool.checkpoint().await.unwrap();
    lose(&members, &array, 2).await;

    let rebuilding = {
        let pool = pool.clone();
        tokio::spawn(async move { pool.evacuate().await })
    };
    let mut samples = 0;
    let mut seed = 100;
    while !rebuilding.is_finished() {
        write_random(&pool, volume.volume_id, &mut blocks, 4, seed).await;
        seed += 1;
        let status = pool.rebuild_status();
        assert!(
            status.bytes_done <= status.bytes_total,
            "{status:?} after {samples} samples"
        );
        samples += 1;
    }
    let status = rebuilding.await.unwrap().expect("rebuild onto the others");
    assert_eq!(status.state, RebuildState::Finished, "{status:?}");
    assert!(status.bytes_done <= status.bytes_total, "{status:?}");
    assert!(
        samples > 10,
        "the clients wrote during the rebuild ({samples})"
    );
    check(
        &pool,
        volume.volume_id,
        &blocks,
        "after the rebuild under writes",
    )
    .await;
    pool.close().await.unwrap();
}

/// The background budget of the crash test's first run: slow enough that
/// the rebuild is cut in its middle.
const PACED_BYTES_PER_SECOND: u64 = 1 << 20;

/// Member 1 is lost and the rebuild onto the others is cut short (the
/// pool abandoned mid-way, as by `kill -9`): the next open resumes it by
/// itself, it ends with no segment on member 1, nothing says it is
/// blocked, every block reads back, and two more losses lose nothing.
#[tokio::test]
async fn a_rebuild_cut_short_resumes_by_itself_when_the_pool_opens() {
    let members = members();
    let (pool, array) = new_pool(&members, true).await;
    let volume = pool.create_volume("v", 4 << 20).await.unwrap();
    let mut blocks = vec![vec![0_u8; BLOCK]; 1024];
    write_random(&pool, volume.volume_id, &mut blocks, 900, 31).await;
    pool.close().await.unwrap();
    drop((pool, array));

    let paced = PoolLimits {
        background_bytes_per_second_min: Some(PACED_BYTES_PER_SECOND),
        background_bytes_per_second_max: Some(PACED_BYTES_PER_SECOND),
        ..limits(true)
    };
    let all: Vec<usize> = (0..MEMBER_COUNT).collect();
    let array = Arc::new(
        assemble(TierRole::Flash, devices_of(&members, &all))
            .await
            .unwrap()
            .array,
    );
    let pool = Pool::open(array.clone(), paced).await.unwrap();
    lose(&members, &array, 1).await;
    assert_eq!(pool.start_rebuild(), RebuildStart::Started);
    let cut_at = wait_for_progress(&pool).await;
    pool.abandon();
    while pool.rebuild_status().state == RebuildState::Rebuilding {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop((pool, array));

    let (pool, array) = reopen(&members, &[0, 2, 3, 4, 5], true).await;
    wait_for_rebuild(&pool).await;
    let status = pool.rebuild_status();
    assert_eq!(status.state, RebuildState::Finished, "{status:?}");
    assert_eq!(status.kind, RebuildKind::DistributedSpare);
    assert!(
        status.bytes_done > 0,
        "the reopened pool moved the rest itself (cut at {cut_at:?}): {status:?}"
    );
    assert_eq!(
        array.zones_containing(1),
        0,
        "no zone in use holds member 1"
    );
    assert_eq!(pool.rebuild_blocked(), None);
    check(
        &pool,
        volume.volume_id,
        &blocks,
        "after the resumed rebuild",
    )
    .await;
    lose(&members, &array, 0).await;
    lose(&members, &array, 4).await;
    check(&pool, volume.volume_id, &blocks, "with three members lost").await;
    pool.close().await.unwrap();
}

fn devices_of(members: &[Member], present: &[usize]) -> Vec<MemberDevice> {
    present
        .iter()
        .map(|index| member_device(*index, &members[*index]))
        .collect()
}

/// Waits until the rebuild has moved something and has more to move.
async fn wait_for_progress(pool: &Pool) -> lamina_engine::RebuildStatus {
    for _ in 0..REBUILD_WAIT_MS_MAX {
        let status = pool.rebuild_status();
        // None until the rebuild's task first runs.
        assert_ne!(status.state, RebuildState::Finished, "{status:?}");
        assert_ne!(status.state, RebuildState::Failed, "{status:?}");
        if status.bytes_done > 0 {
            assert!(status.bytes_done < status.bytes_total, "{status:?}");
            return status;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the rebuild moved nothing: {:?}", pool.rebuild_status());
}

/// Share of the space clients can fill that the full test writes with
/// live data: more than the five members left hold at their width (three
/// data columns of four), so the lost member's data has no room.
const FULL_SHARE_PERCENT: u64 = 85;

/// Member 2 of a pool whose live data fills 85 % of what clients can fill
/// is lost: the others cannot hold it at their narrower width. No rebuild
/// starts, and the pool says why, with the figures, at every ask; once a
/// volume is deleted the rebuild starts and ends with full redundancy.
#[tokio::test]
async fn a_rebuild_without_room_says_why_and_starts_once_space_is_freed() {
    let members = members();
    let (pool, array) = new_pool(&members, true).await;
    let status = pool.status();
    let fillable = status.free_bytes + status.used_bytes;
    let live_bytes = fillable * FULL_SHARE_PERCENT / 100;
    // Two volumes: `kept` (a quarter) stays, `freed` goes to make room.
    let kept_bytes = (live_bytes / 4) / (64 << 10) * (64 << 10);
    let freed_bytes = (live_bytes - kept_bytes) / (64 << 10) * (64 << 10);
    let kept = pool.create_volume("kept", kept_bytes).await.unwrap();
    let freed = pool.create_volume("freed", freed_bytes).await.unwrap();
    let kept_contents = fill(&pool, kept.volume_id, kept_bytes, 41).await;
    fill(&pool, freed.volume_id, freed_bytes, 42).await;
    pool.checkpoint().await.unwrap();

    lose(&members, &array, 2).await;
    let start = pool.start_rebuild();
    let Some(RebuildBlocked::NoRoom(need)) = pool.rebuild_blocked() else {
        panic!(
            "not blocked for room: {:?} ({start:?})",
            pool.rebuild_blocked()
        );
    };
    assert_eq!(start, RebuildStart::LacksSpace(need));
    assert!(need.live_bytes > need.free_bytes, "{need:?}");
    assert_eq!(pool.rebuild_status().state, RebuildState::None);
    let message = RebuildBlocked::NoRoom(need).to_string();
    assert!(
        message.contains("not enough free space") && message.contains("device replace"),
        "{message}"
    );

    pool.delete_volume("freed").await.unwrap();
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    assert_eq!(pool.rebuild_blocked(), None, "{:?}", pool.evacuation_need());
    assert_eq!(pool.start_rebuild(), RebuildStart::Started);
    wait_for_rebuild(&pool).await;
    assert_eq!(pool.rebuild_status().state, RebuildState::Finished);
    assert_eq!(
        array.zones_containing(2),
        0,
        "no zone in use holds member 2"
    );
    let mut read = vec![0_u8; kept_contents.len()];
    pool.read(kept.volume_id, 0, &mut read).await.unwrap();
    assert!(read == kept_contents, "the kept volume reads back");
    pool.close().await.unwrap();
}

/// Writes `length` random bytes from `seed` over a volume, 64 KiB at a
/// time; returns them.
async fn fill(pool: &Pool, volume_id: u32, length: u64, seed: u64) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut contents = vec![0_u8; length as usize];
    rand::rngs::SmallRng::seed_from_u64(seed).fill(&mut contents[..]);
    for (index, chunk) in contents.chunks(64 << 10).enumerate() {
        let offset = (index * (64 << 10)) as u64;
        pool.write(volume_id, offset, chunk, false).await.unwrap();
    }
    pool.flush().await.unwrap();
    contents
}
