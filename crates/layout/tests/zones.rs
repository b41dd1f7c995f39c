//! Zones (issue 19): each zone (one engine segment) striped over its own
//! member set. A zone opened after a loss is laid out over the survivors and
//! survives losing the parity's worth more; old zones still read; the sets
//! and the table survive reassembly and power cuts during `open_region`;
//! members are removed and added; the prefix is copied again after a holder
//! is lost; arrays without zones (version 2) work as before.

#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use lamina_device::{
    AlignedBuffer, BlockDevice, DeviceError, DeviceErrorKind, FaultyDevice, MemoryDevice,
    PowerCutStyle,
};
use lamina_layout::{
    ArrayError, ArrayIdentity, MemberDevice, MemberState, Redundancy, RedundantArray, TierRole,
    assemble, create, create_zoned,
};
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
const PREFIX_BLOCKS: u64 = 16;
const MEMBER_BYTES: u64 = 1 << 20;
/// Rows per zone; a raid6 of six has four data columns at full width.
const ZONE_ROWS: u64 = 8;
const SEGMENT_BLOCKS: u64 = ZONE_ROWS * 4;

type Faulty = Arc<FaultyDevice<MemoryDevice>>;

fn blank(seed: u64) -> Faulty {
    Arc::new(FaultyDevice::new(
        Arc::new(MemoryDevice::new(MEMBER_BYTES)),
        seed,
    ))
}

fn identity() -> ArrayIdentity {
    ArrayIdentity {
        array_identifier: 91,
        tier: TierRole::Flash,
    }
}

fn as_members(devices: &[Arc<dyn BlockDevice>], skip: &[usize]) -> Vec<MemberDevice> {
    devices
        .iter()
        .enumerate()
        .filter(|(index, _)| !skip.contains(index))
        .map(|(index, device)| MemberDevice {
            path: format!("/test/member{index}"),
            device: device.clone(),
        })
        .collect()
}

fn dynamic(devices: &[Faulty]) -> Vec<Arc<dyn BlockDevice>> {
    devices
        .iter()
        .map(|device| device.clone() as Arc<dyn BlockDevice>)
        .collect()
}

async fn zoned_raid6(devices: &[Arc<dyn BlockDevice>]) -> RedundantArray {
    create_zoned(
        identity(),
        Redundancy::Raid6,
        PREFIX_BLOCKS,
        SEGMENT_BLOCKS,
        as_members(devices, &[]),
    )
    .await
    .unwrap()
}

fn random_blocks(count: u64, seed: u64) -> Vec<u8> {
    let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..count as usize * BLOCK)
        .map(|_| random.random())
        .collect()
}

/// Zone `zone`'s offset and length in bytes (one engine segment).
fn zone_range(zone: u64) -> (u64, u64) {
    let offset = (PREFIX_BLOCKS + zone * SEGMENT_BLOCKS) * BLOCK as u64;
    (offset, SEGMENT_BLOCKS * BLOCK as u64)
}

/// Opens zone `zone` and fills its usable blocks; returns what was written.
async fn open_and_fill(array: &RedundantArray, zone: u64, seed: u64) -> Vec<u8> {
    let (offset, length) = zone_range(zone);
    let shape = array.open_region(offset, length).await.unwrap().unwrap();
    let data = random_blocks(shape.usable_bytes / BLOCK as u64, seed);
    let buffer = Arc::new(AlignedBuffer::from_slice_padded(&data));
    array.write(offset, buffer).await.unwrap();
    array.flush().await.unwrap();
    data
}

async fn read_zone(
    array: &dyn BlockDevice,
    zone: u64,
    bytes: usize,
) -> Result<Vec<u8>, DeviceError> {
    let (offset, _) = zone_range(zone);
    Ok(array.read(offset, bytes).await?.to_vec())
}

#[tokio::test]
async fn a_zone_opened_after_a_loss_is_narrower_and_survives_two_more_losses() {
    let faulty: Vec<Faulty> = (0..6).map(blank).collect();
    let devices = dynamic(&faulty);
    let array = zoned_raid6(&devices).await;
    let old = open_and_fill(&array, 0, 1).await;
    assert_eq!(
        old.len() as u64,
        SEGMENT_BLOCKS * BLOCK as u64,
        "full width"
    );
    array.fail_member(1);
    array.flush().await.unwrap();
    assert!(array.new_regions_redundant());
    assert_eq!(array.write_set().members, vec![0, 2, 3, 4, 5]);
    let narrowed = open_and_fill(&array, 3, 2).await;
    let (offset, length) = zone_range(3);
    let shape = array.region_shape(offset, length).unwrap();
    assert_eq!(shape.usable_bytes, ZONE_ROWS * 3 * BLOCK as u64);
    assert_eq!(shape.row_bytes, 3 * BLOCK as u64);
    assert!(!shape.degraded);
    let (old_offset, old_length) = zone_range(0);
    assert!(array.region_shape(old_offset, old_length).unwrap().degraded);
    assert_eq!(array.zones_containing(1), array.geometry().zone_count() - 1);
    // The old zone still reads, degraded.
    assert_eq!(read_zone(&array, 0, old.len()).await.unwrap(), old);
    // Past a narrowed zone's usable blocks: zeros.
    let tail = array
        .read(offset + shape.usable_bytes, BLOCK)
        .await
        .unwrap();
    assert!(tail.iter().all(|byte| *byte == 0));
    array.fail_member(2);
    array.fail_member(4);
    array.flush().await.unwrap();
    assert_eq!(
        read_zone(&array, 3, narrowed.len()).await.unwrap(),
        narrowed
    );
    // The old zone lost three of its six: gone, and said so.
    assert!(read_zone(&array, 0, old.len()).await.is_err());
    // After reassembly from the three survivors.
    drop(array);
    let assembled = assemble(TierRole::Flash, as_members(&devices, &[1, 2, 4]))
        .await
        .unwrap();
    let array = assembled.array;
    assert_eq!(
        read_zone(&array, 3, narrowed.len()).await.unwrap(),
        narrowed
    );
    assert_eq!(
        array.unreadable_zone_count(),
        array.geometry().zone_count() - 1
    );
}

#[tokio::test]
async fn sets_table_and_write_set_survive_reassembly() {
    let faulty: Vec<Faulty> = (0..6).map(blank).collect();
    let devices = dynamic(&faulty);
    let array = zoned_raid6(&devices).await;
    let full = open_and_fill(&array, 0, 3).await;
    array.fail_member(4);
    let narrowed = open_and_fill(&array, 1, 4).await;
    let sets = array.member_sets();
    drop(array);
    let array = assemble(TierRole::Flash, as_members(&devices, &[4]))
        .await
        .unwrap()
        .array;
    assert_eq!(array.member_sets(), sets);
    assert_eq!(sets[1], vec![0, 1, 2, 3, 5]);
    assert_eq!(array.write_set().members, vec![0, 1, 2, 3, 5]);
    let (offset, length) = zone_range(1);
    assert_eq!(
        array.region_shape(offset, length).unwrap().usable_bytes,
        narrowed.len() as u64
    );
    assert_eq!(read_zone(&array, 0, full.len()).await.unwrap(), full);
    assert_eq!(
        read_zone(&array, 1, narrowed.len()).await.unwrap(),
        narrowed
    );
    // Reopening at the same set writes nothing new and keeps the shape.
    let again = array.open_region(offset, length).await.unwrap().unwrap();
    assert_eq!(again.usable_bytes, narrowed.len() as u64);
}

/// A member that cuts the power of every member at the `cut_at`-th flush
/// (counted over all members) and fails from then on.
struct CutAtFlush {
    inner: Faulty,
    everyone: Arc<std::sync::Mutex<Vec<Faulty>>>,
    flushes: Arc<AtomicUsize>,
    cut_at: Arc<AtomicUsize>,
    cut: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl BlockDevice for CutAtFlush {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        self.inner.read(offset, length)
    }
    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        self.inner.write(offset, data).await
    }
    async fn flush(&self) -> Result<(), DeviceError> {
        let count = self.flushes.fetch_add(1, Ordering::SeqCst) + 1;
        if count == self.cut_at.load(Ordering::SeqCst) && !self.cut.swap(true, Ordering::SeqCst) {
            let everyone = self.everyone.lock().unwrap().clone();
            for device in everyone {
                device.power_cut(PowerCutStyle::Random).await.unwrap();
            }
        }
        if self.cut.load(Ordering::SeqCst) {
            return Err(DeviceError::new(DeviceErrorKind::Injected, "cut", 0, 0));
        }
        self.inner.flush().await
    }
}

/// Runs one power cut at the `cut_at`-th flush of `open_region` narrowing
/// zone 2; returns whether the cut happened before `open_region` returned.
async fn cut_during_open_region(cut_at: usize, seed: u64) -> bool {
    let faulty: Vec<Faulty> = (0..6).map(|index| blank(seed * 10 + index)).collect();
    let everyone = Arc::new(std::sync::Mutex::new(faulty.clone()));
    let flushes = Arc::new(AtomicUsize::new(0));
    let cut_at_flush = Arc::new(AtomicUsize::new(usize::MAX));
    let cut = Arc::new(AtomicBool::new(false));
    let devices: Vec<Arc<dyn BlockDevice>> = faulty
        .iter()
        .map(|inner| {
            Arc::new(CutAtFlush {
                inner: inner.clone(),
                everyone: everyone.clone(),
                flushes: flushes.clone(),
                cut_at: cut_at_flush.clone(),
                cut: cut.clone(),
            }) as Arc<dyn BlockDevice>
        })
        .collect();
    let array = zoned_raid6(&devices).await;
    let kept = open_and_fill(&array, 0, seed).await;
    array.fail_member(5);
    array.flush().await.unwrap();
    flushes.store(0, Ordering::SeqCst);
    cut_at_flush.store(cut_at, Ordering::SeqCst);
    let (offset, length) = zone_range(2);
    let opened = array.open_region(offset, length).await;
    let was_cut = cut.load(Ordering::SeqCst);
    assert_eq!(opened.is_ok(), !was_cut, "open_region fails only when cut");
    // After a returned open_region, whatever was not flushed is lost: the
    // zone's new set must not depend on it.
    let style = match was_cut {
        true => PowerCutStyle::Random,
        false => PowerCutStyle::DropAll,
    };
    for device in &faulty {
        device.power_cut(style).await.ok();
    }
    drop(array);
    let restarted: Vec<Arc<dyn BlockDevice>> = faulty
        .iter()
        .map(|device| {
            Arc::new(FaultyDevice::new(device.inner().clone(), seed)) as Arc<dyn BlockDevice>
        })
        .collect();
    let array = assemble(TierRole::Flash, as_members(&restarted, &[5]))
        .await
        .unwrap()
        .array;
    let usable = array.region_shape(offset, length).unwrap().usable_bytes;
    let old = SEGMENT_BLOCKS * BLOCK as u64;
    let new = ZONE_ROWS * 3 * BLOCK as u64;
    assert!(
        usable == old || usable == new,
        "zone 2 at its old or new set"
    );
    if !was_cut {
        assert_eq!(usable, new, "a returned open_region is durable");
    }
    assert_eq!(read_zone(&array, 0, kept.len()).await.unwrap(), kept);
    // The zone works at whichever set it came back at.
    let data = open_and_fill(&array, 2, seed + 1).await;
    assert_eq!(read_zone(&array, 2, data.len()).await.unwrap(), data);
    was_cut
}

#[tokio::test]
async fn a_power_cut_at_any_flush_of_open_region_leaves_the_old_or_new_set() {
    let mut cut_at = 1;
    while cut_during_open_region(cut_at, cut_at as u64).await {
        cut_at += 1;
        assert!(
            cut_at < 200,
            "open_region flushes a bounded number of times"
        );
    }
    assert!(cut_at > 10, "every flush point was tried ({cut_at})");
}

#[tokio::test]
async fn a_member_is_removed_once_its_zones_are_moved_and_a_device_added_in_its_slot() {
    let faulty: Vec<Faulty> = (0..6).map(blank).collect();
    let devices = dynamic(&faulty);
    let array = zoned_raid6(&devices).await;
    let zone_count = array.geometry().zone_count();
    array.begin_removal(2).await.unwrap();
    assert_eq!(array.write_set().members, vec![0, 1, 3, 4, 5]);
    assert!(matches!(
        array.finish_removal(2).await,
        Err(ArrayError::MemberStillInZones { index: 2, zones, .. }) if zones == zone_count
    ));
    let mut written = Vec::new();
    for zone in 0..zone_count {
        written.push(open_and_fill(&array, zone, 100 + zone).await);
    }
    assert_eq!(array.zones_containing(2), 0);
    array.finish_removal(2).await.unwrap();
    assert_eq!(array.member_status()[2].state, MemberState::Removed);
    assert_eq!(array.state(), lamina_layout::ArrayState::Online);
    // The removed device's label is wiped.
    assert!(
        lamina_layout::read_label(devices[2].as_ref())
            .await
            .is_err()
    );
    drop(array);
    let array = assemble(TierRole::Flash, as_members(&devices, &[2]))
        .await
        .unwrap()
        .array;
    assert_eq!(array.member_status()[2].state, MemberState::Removed);
    for (zone, data) in written.iter().enumerate() {
        assert_eq!(
            read_zone(&array, zone as u64, data.len()).await.unwrap(),
            *data
        );
    }
    let added = blank(50) as Arc<dyn BlockDevice>;
    let index = array
        .add_member(MemberDevice {
            path: "/test/added".into(),
            device: added.clone(),
        })
        .await
        .unwrap();
    assert_eq!(index, 2);
    assert_eq!(array.write_set().members, vec![0, 1, 2, 3, 4, 5]);
    let wide = open_and_fill(&array, 0, 7).await;
    assert_eq!(wide.len() as u64, SEGMENT_BLOCKS * BLOCK as u64);
    assert_eq!(array.zones_containing(2), 1);
    drop(array);
    let mut after = devices.clone();
    after[2] = added;
    let array = assemble(TierRole::Flash, as_members(&after, &[]))
        .await
        .unwrap()
        .array;
    assert_eq!(read_zone(&array, 0, wide.len()).await.unwrap(), wide);
    assert_eq!(
        read_zone(&array, 1, written[1].len()).await.unwrap(),
        written[1]
    );
    // No empty slot left: adding is refused, naming the limit.
    let refused = array
        .add_member(MemberDevice {
            path: "/test/more".into(),
            device: blank(51),
        })
        .await;
    assert!(matches!(
        refused,
        Err(ArrayError::NoEmptySlot { slots: 6, .. })
    ));
}

#[tokio::test]
async fn removal_is_refused_below_the_minimum_width() {
    let faulty: Vec<Faulty> = (0..4).map(blank).collect();
    let devices = dynamic(&faulty);
    let array = create_zoned(
        identity(),
        Redundancy::Raid6,
        PREFIX_BLOCKS,
        ZONE_ROWS * 2,
        as_members(&devices, &[]),
    )
    .await
    .unwrap();
    assert!(matches!(
        array.begin_removal(0).await,
        Err(ArrayError::RemovalTooNarrow {
            remaining: 3,
            needed: 4,
            ..
        })
    ));
    // Too few survivors to narrow: new zones keep the full set, degraded.
    array.fail_member(3);
    assert!(!array.new_regions_redundant());
    let (offset, _) = zone_range(0);
    let length = ZONE_ROWS * 2 * BLOCK as u64;
    let shape = array.open_region(offset, length).await.unwrap().unwrap();
    assert_eq!(shape.usable_bytes, length);
    assert!(shape.degraded);
}

#[tokio::test]
async fn the_prefix_is_copied_again_after_a_holder_is_lost() {
    let faulty: Vec<Faulty> = (0..6).map(blank).collect();
    let devices = dynamic(&faulty);
    let array = zoned_raid6(&devices).await;
    let prefix = random_blocks(PREFIX_BLOCKS, 9);
    array
        .write(0, Arc::new(AlignedBuffer::from_slice_padded(&prefix)))
        .await
        .unwrap();
    array.flush().await.unwrap();
    assert_eq!(array.prefix_holders(), vec![0, 1, 2]);
    array.fail_member(0);
    array.flush().await.unwrap();
    assert_eq!(array.restore_prefix_redundancy().await.unwrap(), vec![3]);
    assert_eq!(array.prefix_holders(), vec![1, 2, 3]);
    // Written after the copy: reaches the new holder too.
    let later = random_blocks(1, 10);
    array
        .write(
            5 * BLOCK as u64,
            Arc::new(AlignedBuffer::from_slice_padded(&later)),
        )
        .await
        .unwrap();
    array.fail_member(1);
    array.fail_member(2);
    array.flush().await.unwrap();
    let mut expected = prefix.clone();
    expected[5 * BLOCK..6 * BLOCK].copy_from_slice(&later);
    let read = array.read(0, PREFIX_BLOCKS as usize * BLOCK).await.unwrap();
    assert_eq!(read.to_vec(), expected);
    drop(array);
    let array = assemble(TierRole::Flash, as_members(&devices, &[0, 1, 2]))
        .await
        .unwrap()
        .array;
    let read = array.read(0, PREFIX_BLOCKS as usize * BLOCK).await.unwrap();
    assert_eq!(read.to_vec(), expected);
}

/// A label as version 2 wrote it, for an array made without zones.
#[derive(serde::Serialize)]
struct LabelVersion2 {
    array_identifier: u128,
    tier: TierRole,
    member_index: u32,
    member_count: u32,
    redundancy: Redundancy,
    prefix_blocks: u64,
    row_count: u64,
    generation: u64,
    faulted_members: Vec<u32>,
    member_paths: Vec<String>,
    rebuilding_rows_done: Option<u64>,
}

fn version_2_block(label: &LabelVersion2) -> Vec<u8> {
    let payload = postcard::to_stdvec(label).unwrap();
    let mut block = vec![0_u8; BLOCK];
    block[0..8].copy_from_slice(b"LAMINAML");
    block[8..12].copy_from_slice(&2_u32.to_le_bytes());
    block[12..16].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    block[16..20].copy_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    let header = crc32c::crc32c(&block[0..20]);
    block[20..24].copy_from_slice(&header.to_le_bytes());
    block[24..24 + payload.len()].copy_from_slice(&payload);
    block
}

#[tokio::test]
async fn a_version_2_array_assembles_and_works_without_zones() {
    let faulty: Vec<Faulty> = (0..6).map(blank).collect();
    let devices = dynamic(&faulty);
    let array = create(
        identity(),
        Redundancy::Raid6,
        PREFIX_BLOCKS,
        as_members(&devices, &[]),
    )
    .await
    .unwrap();
    let data = random_blocks(40, 11);
    array
        .write(
            PREFIX_BLOCKS * BLOCK as u64,
            Arc::new(AlignedBuffer::from_slice_padded(&data)),
        )
        .await
        .unwrap();
    array.flush().await.unwrap();
    let row_count = array.geometry().row_count;
    drop(array);
    for (index, device) in faulty.iter().enumerate() {
        let label = LabelVersion2 {
            array_identifier: 91,
            tier: TierRole::Flash,
            member_index: index as u32,
            member_count: 6,
            redundancy: Redundancy::Raid6,
            prefix_blocks: PREFIX_BLOCKS,
            row_count,
            generation: 1,
            faulted_members: Vec::new(),
            member_paths: (0..6)
                .map(|member| format!("/test/member{member}"))
                .collect(),
            rebuilding_rows_done: None,
        };
        let block = Arc::new(AlignedBuffer::from_slice_padded(&version_2_block(&label)));
        device.write(0, block.clone()).await.unwrap();
        device.write(32 * BLOCK as u64, block).await.unwrap();
        device.flush().await.unwrap();
    }
    let array = assemble(TierRole::Flash, as_members(&devices, &[]))
        .await
        .unwrap()
        .array;
    let read = array
        .read(PREFIX_BLOCKS * BLOCK as u64, data.len())
        .await
        .unwrap();
    assert_eq!(read.to_vec(), data);
    let (offset, length) = zone_range(0);
    assert_eq!(array.open_region(offset, length).await.unwrap(), None);
    assert_eq!(array.region_shape(offset, length), None);
    assert!(array.new_regions_redundant());
    assert!(matches!(
        array.begin_removal(1).await,
        Err(ArrayError::NotZoned { .. })
    ));
    array.fail_member(1);
    assert!(!array.new_regions_redundant(), "no narrowing without zones");
    let read = array
        .read(PREFIX_BLOCKS * BLOCK as u64, data.len())
        .await
        .unwrap();
    assert_eq!(read.to_vec(), data);
}

#[tokio::test]
async fn a_replacement_is_rebuilt_zone_by_zone_and_receives_the_table() {
    let faulty: Vec<Faulty> = (0..6).map(blank).collect();
    let devices = dynamic(&faulty);
    let array = zoned_raid6(&devices).await;
    let full = open_and_fill(&array, 0, 21).await;
    array.fail_member(1);
    let narrowed = open_and_fill(&array, 1, 22).await;
    let new = blank(60) as Arc<dyn BlockDevice>;
    array
        .begin_replacement(
            "/test/member1",
            MemberDevice {
                path: "/test/new1".into(),
                device: new.clone(),
            },
        )
        .await
        .unwrap();
    // The member being replaced is in the write set again.
    assert_eq!(array.write_set().members, vec![0, 1, 2, 3, 4, 5]);
    let wide = open_and_fill(&array, 2, 23).await;
    let everything = array.size_bytes();
    array
        .rebuild_range(0, everything, &|_, _| true)
        .await
        .unwrap();
    array.finish_rebuild().await.unwrap();
    drop(array);
    let mut after = devices.clone();
    after[1] = new;
    // Without two others, the rebuilt member's columns are needed.
    let array = assemble(TierRole::Flash, as_members(&after, &[0, 2]))
        .await
        .unwrap()
        .array;
    assert_eq!(read_zone(&array, 0, full.len()).await.unwrap(), full);
    assert_eq!(
        read_zone(&array, 1, narrowed.len()).await.unwrap(),
        narrowed
    );
    assert_eq!(read_zone(&array, 2, wide.len()).await.unwrap(), wide);
}

/// A raid6 array of six devices in eight slots: zones are sized for eight
/// (six data columns), so each holds four sixths of its range at first.
async fn raid6_of_six_in_eight_slots(devices: &[Arc<dyn BlockDevice>]) -> RedundantArray {
    lamina_layout::create_zoned_with_slots(
        identity(),
        lamina_layout::ZonedArrayRequest {
            redundancy: Redundancy::Raid6,
            prefix_blocks: PREFIX_BLOCKS,
            segment_blocks: ZONE_ROWS * 6,
            slot_count: 8,
        },
        as_members(devices, &[]),
    )
    .await
    .unwrap()
}

/// Zone `zone` of the eight-slot array: its offset and length in bytes.
fn wide_zone_range(zone: u64) -> (u64, u64) {
    let offset = (PREFIX_BLOCKS + zone * ZONE_ROWS * 6) * BLOCK as u64;
    (offset, ZONE_ROWS * 6 * BLOCK as u64)
}

async fn fill_wide_zone(array: &RedundantArray, zone: u64, seed: u64) -> Vec<u8> {
    let (offset, length) = wide_zone_range(zone);
    let shape = array.open_region(offset, length).await.unwrap().unwrap();
    assert!(shape.current && !shape.degraded);
    let data = random_blocks(shape.usable_bytes / BLOCK as u64, seed);
    array
        .write(offset, Arc::new(AlignedBuffer::from_slice_padded(&data)))
        .await
        .unwrap();
    array.flush().await.unwrap();
    data
}

async fn read_wide_zone(array: &RedundantArray, zone: u64, bytes: usize) -> Vec<u8> {
    let (offset, _) = wide_zone_range(zone);
    array.read(offset, bytes).await.unwrap().to_vec()
}

#[tokio::test]
async fn an_array_with_empty_slots_widens_as_devices_are_added() {
    let faulty: Vec<Faulty> = (0..6).map(blank).collect();
    let devices = dynamic(&faulty);
    let array = raid6_of_six_in_eight_slots(&devices).await;
    assert_eq!(array.write_set().members, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(array.state(), lamina_layout::ArrayState::Online);
    let narrow = fill_wide_zone(&array, 0, 1).await;
    assert_eq!(
        narrow.len() as u64,
        ZONE_ROWS * 4 * BLOCK as u64,
        "six of eight slots"
    );
    let other = fill_wide_zone(&array, 1, 2).await;
    // Reassembled from the six devices: the two slots are empty, not missing.
    drop(array);
    let array = assemble(TierRole::Flash, as_members(&devices, &[]))
        .await
        .unwrap()
        .array;
    assert_eq!(array.state(), lamina_layout::ArrayState::Online);
    assert_eq!(array.member_status()[7].state, MemberState::Removed);
    assert_eq!(read_wide_zone(&array, 0, narrow.len()).await, narrow);
    // A seventh device: zone 0 is not current any more, and once opened
    // again it holds five sixths; old zone 1 still reads.
    let seventh = blank(60) as Arc<dyn BlockDevice>;
    let index = array
        .add_member(MemberDevice {
            path: "/test/seventh".into(),
            device: seventh.clone(),
        })
        .await
        .unwrap();
    assert_eq!(index, 6);
    let (offset, length) = wide_zone_range(0);
    assert!(!array.region_shape(offset, length).unwrap().current);
    assert_eq!(
        array.new_region_usable_bytes(offset, length),
        Some(ZONE_ROWS * 5 * BLOCK as u64)
    );
    let wider = fill_wide_zone(&array, 0, 3).await;
    assert_eq!(wider.len() as u64, ZONE_ROWS * 5 * BLOCK as u64);
    assert_eq!(read_wide_zone(&array, 1, other.len()).await, other);
    // The eighth fills the last slot: full width; a ninth is refused.
    let eighth = blank(61) as Arc<dyn BlockDevice>;
    array
        .add_member(MemberDevice {
            path: "/test/eighth".into(),
            device: eighth.clone(),
        })
        .await
        .unwrap();
    let full = fill_wide_zone(&array, 2, 4).await;
    assert_eq!(full.len() as u64, ZONE_ROWS * 6 * BLOCK as u64);
    assert!(matches!(
        array
            .add_member(MemberDevice {
                path: "/test/ninth".into(),
                device: blank(62),
            })
            .await,
        Err(ArrayError::NoEmptySlot { slots: 8, .. })
    ));
    // All eight reassemble, and the widest zone survives two losses.
    drop(array);
    let mut all = devices.clone();
    all.push(seventh);
    all.push(eighth);
    let array = assemble(TierRole::Flash, as_members(&all, &[3, 7]))
        .await
        .unwrap()
        .array;
    assert_eq!(read_wide_zone(&array, 0, wider.len()).await, wider);
    assert_eq!(read_wide_zone(&array, 1, other.len()).await, other);
    assert_eq!(read_wide_zone(&array, 2, full.len()).await, full);
}

#[tokio::test]
async fn slots_are_refused_below_the_device_count_and_for_mirrors() {
    let devices = dynamic(&(0..4).map(blank).collect::<Vec<_>>());
    let request = |redundancy, slot_count| lamina_layout::ZonedArrayRequest {
        redundancy,
        prefix_blocks: PREFIX_BLOCKS,
        segment_blocks: 48,
        slot_count,
    };
    let fewer = lamina_layout::create_zoned_with_slots(
        identity(),
        request(Redundancy::Raid6, 3),
        as_members(&devices, &[]),
    )
    .await;
    assert!(matches!(
        fewer,
        Err(ArrayError::BadSlotCount {
            slot_count: 3,
            member_count: 4,
            ..
        })
    ));
    let mirror = lamina_layout::create_zoned_with_slots(
        identity(),
        request(Redundancy::Mirror, 6),
        as_members(&devices, &[]),
    )
    .await;
    assert!(matches!(mirror, Err(ArrayError::SlotsNeedParity { .. })));
}
