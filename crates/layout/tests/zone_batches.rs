//! Laying many zones out again in one zone-table update (`open_regions`,
//! decision 0033): the table is written a constant number of times however
//! many zones the batch holds, and a power cut at any write or flush of the
//! update, with the members keeping, dropping or tearing what was not
//! flushed, leaves every zone of the batch at its old or its new set, the
//! zones holding data intact, and the array assembling; once the update
//! returns, every zone of the batch is at its new set even if everything
//! unflushed is lost.

#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use lamina_device::{
    AlignedBuffer, BlockDevice, DeviceError, DeviceErrorKind, FaultyDevice, MemoryDevice,
    PowerCutStyle,
};
use lamina_layout::{
    ArrayIdentity, LABEL_AREA_BLOCKS, MemberDevice, Redundancy, RedundantArray, TierRole,
    ZONE_TABLE_ENTRIES_PER_BLOCK, assemble, create_zoned,
};
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
const PREFIX_BLOCKS: u64 = 16;
const MEMBER_COUNT: usize = 6;
/// The member lost before the batch (its zones then need a new set).
const LOST: usize = 5;

type Faulty = Arc<FaultyDevice<MemoryDevice>>;

/// The array's shape for one test: zones of `zone_rows` rows of four data
/// blocks (raid6 of six), on members of `member_bytes`.
#[derive(Clone, Copy)]
struct Shape {
    member_bytes: u64,
    zone_rows: u64,
}

impl Shape {
    fn segment_blocks(self) -> u64 {
        self.zone_rows * 4
    }

    /// Zone `zone`'s offset in the array, in bytes.
    fn zone_offset(self, zone: u64) -> u64 {
        (PREFIX_BLOCKS + zone * self.segment_blocks()) * BLOCK as u64
    }

    fn zone_bytes(self) -> u64 {
        self.segment_blocks() * BLOCK as u64
    }
}

/// One-row zones on small members: one table block, its entries spread
/// over several sectors (a tear within the block mixes old and new entries,
/// which its checksum must catch).
const SMALL: Shape = Shape {
    member_bytes: 3 << 20,
    zone_rows: 1,
};

/// One-row zones, more than one table block of them.
const MANY: Shape = Shape {
    member_bytes: 17 << 20,
    zone_rows: 1,
};

fn identity() -> ArrayIdentity {
    ArrayIdentity {
        array_identifier: 33,
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

async fn zoned_raid6(shape: Shape, devices: &[Arc<dyn BlockDevice>]) -> RedundantArray {
    create_zoned(
        identity(),
        Redundancy::Raid6,
        PREFIX_BLOCKS,
        shape.segment_blocks(),
        as_members(devices, &[]),
    )
    .await
    .unwrap()
}

/// Opens zone `zone`, fills its usable blocks with random data and
/// flushes; returns what was written.
async fn open_and_fill(array: &RedundantArray, shape: Shape, zone: u64, seed: u64) -> Vec<u8> {
    let offset = shape.zone_offset(zone);
    let region = array
        .open_region(offset, shape.zone_bytes())
        .await
        .unwrap()
        .unwrap();
    let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
    let data: Vec<u8> = (0..region.usable_bytes).map(|_| random.random()).collect();
    let buffer = Arc::new(AlignedBuffer::from_slice_padded(&data));
    array.write(offset, buffer).await.unwrap();
    array.flush().await.unwrap();
    data
}

async fn read_zone(array: &RedundantArray, shape: Shape, zone: u64, bytes: usize) -> Vec<u8> {
    array
        .read(shape.zone_offset(zone), bytes)
        .await
        .unwrap()
        .to_vec()
}

/// A member that counts its writes into the zone table's copies (member
/// blocks `table_start..table_end`) and its flushes.
struct Counting {
    inner: Faulty,
    table_start: Arc<AtomicU64>,
    table_end: Arc<AtomicU64>,
    table_writes: Arc<AtomicUsize>,
    flushes: Arc<AtomicUsize>,
}

#[async_trait::async_trait]
impl BlockDevice for Counting {
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
        let first = offset / BLOCK as u64;
        let end = first + (data.len() / BLOCK) as u64;
        if first < self.table_end.load(Ordering::SeqCst)
            && self.table_start.load(Ordering::SeqCst) < end
        {
            self.table_writes.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.write(offset, data).await
    }
    async fn flush(&self) -> Result<(), DeviceError> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.inner.flush().await
    }
}

/// What a batch cost, over every member.
#[derive(Debug, PartialEq, Eq)]
struct Cost {
    table_writes: usize,
    flushes: usize,
}

#[tokio::test]
async fn a_batch_writes_the_table_as_often_as_one_zone_does() {
    let table_start = Arc::new(AtomicU64::new(0));
    let table_end = Arc::new(AtomicU64::new(0));
    let table_writes = Arc::new(AtomicUsize::new(0));
    let flushes = Arc::new(AtomicUsize::new(0));
    let devices: Vec<Arc<dyn BlockDevice>> = (0..MEMBER_COUNT)
        .map(|index| {
            Arc::new(Counting {
                inner: Arc::new(FaultyDevice::new(
                    Arc::new(MemoryDevice::new(MANY.member_bytes)),
                    index as u64,
                )),
                table_start: table_start.clone(),
                table_end: table_end.clone(),
                table_writes: table_writes.clone(),
                flushes: flushes.clone(),
            }) as Arc<dyn BlockDevice>
        })
        .collect();
    let array = zoned_raid6(MANY, &devices).await;
    let geometry = array.geometry();
    let zone_count = geometry.zone_count();
    assert!(
        zone_count > ZONE_TABLE_ENTRIES_PER_BLOCK,
        "the batch spans table blocks ({zone_count} zones)"
    );
    table_start.store(LABEL_AREA_BLOCKS, Ordering::SeqCst);
    table_end.store(
        LABEL_AREA_BLOCKS + 2 * geometry.table_blocks,
        Ordering::SeqCst,
    );
    array.fail_member(LOST);
    array.flush().await.unwrap();
    let cost_of = |before: Cost| Cost {
        table_writes: table_writes.load(Ordering::SeqCst) - before.table_writes,
        flushes: flushes.load(Ordering::SeqCst) - before.flushes,
    };
    let now = || Cost {
        table_writes: table_writes.load(Ordering::SeqCst),
        flushes: flushes.load(Ordering::SeqCst),
    };

    // One zone alone.
    let before = now();
    array
        .open_region(MANY.zone_offset(0), MANY.zone_bytes())
        .await
        .unwrap();
    let one = cost_of(before);
    let usable = MEMBER_COUNT - 1;
    assert_eq!(one.table_writes, 2 * usable, "two copies on each member");

    // Every other zone in one batch: the same cost.
    let offsets: Vec<u64> = (1..zone_count).map(|zone| MANY.zone_offset(zone)).collect();
    let before = now();
    let shapes = array
        .open_regions(&offsets, MANY.zone_bytes())
        .await
        .unwrap();
    let batch = cost_of(before);
    assert_eq!(
        batch.table_writes,
        one.table_writes,
        "{} zones cost what one does",
        offsets.len()
    );
    assert!(
        batch.flushes <= 3 * usable,
        "a flush before and after each copy: {batch:?}"
    );
    let narrowed = MANY.zone_rows * 3 * BLOCK as u64;
    for shape in &shapes {
        let shape = shape.expect("a zoned array has shapes");
        assert_eq!(shape.usable_bytes, narrowed);
        assert!(shape.current && !shape.degraded);
    }

    // Zones already at the write set cost nothing.
    let before = now();
    array
        .open_regions(&offsets, MANY.zone_bytes())
        .await
        .unwrap();
    assert_eq!(cost_of(before).table_writes, 0);

    // The batch is what assembly finds, in every table block.
    drop(array);
    let array = assemble(TierRole::Flash, as_members(&devices, &[LOST]))
        .await
        .unwrap()
        .array;
    for zone in [0, 1, ZONE_TABLE_ENTRIES_PER_BLOCK, zone_count - 1] {
        let shape = array
            .region_shape(MANY.zone_offset(zone), MANY.zone_bytes())
            .unwrap();
        assert_eq!(shape.usable_bytes, narrowed, "zone {zone}");
    }
}

/// Every member's write or flush, counted over all members: at the
/// `cut_at`-th, before doing it, every member loses power (`style` for
/// what was not flushed); every I/O fails from then on.
struct CutAtInputOutput {
    inner: Faulty,
    everyone: Arc<Vec<Faulty>>,
    count: Arc<AtomicUsize>,
    cut_at: Arc<AtomicUsize>,
    cut: Arc<AtomicBool>,
    style: PowerCutStyle,
}

impl CutAtInputOutput {
    async fn count_and_maybe_cut(&self) -> Result<(), DeviceError> {
        let count = self.count.fetch_add(1, Ordering::SeqCst) + 1;
        if count == self.cut_at.load(Ordering::SeqCst) && !self.cut.swap(true, Ordering::SeqCst) {
            for device in self.everyone.iter() {
                device.power_cut(self.style).await.unwrap();
            }
        }
        if self.cut.load(Ordering::SeqCst) {
            return Err(DeviceError::new(DeviceErrorKind::Injected, "cut", 0, 0));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl BlockDevice for CutAtInputOutput {
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
        self.count_and_maybe_cut().await?;
        self.inner.write(offset, data).await
    }
    async fn flush(&self) -> Result<(), DeviceError> {
        self.count_and_maybe_cut().await?;
        self.inner.flush().await
    }
}

/// One case: zones 0 and 1 hold data, member 5 is lost, every other zone
/// is laid out again in one batch with the power cut at the `cut_at`-th
/// write or flush. Returns whether the cut came before the batch returned.
async fn cut_during_batch(cut_at: usize, style: PowerCutStyle, seed: u64) -> bool {
    let faulty: Vec<Faulty> = (0..MEMBER_COUNT as u64)
        .map(|index| {
            Arc::new(FaultyDevice::new(
                Arc::new(MemoryDevice::new(SMALL.member_bytes)),
                seed * 10 + index,
            ))
        })
        .collect();
    let everyone = Arc::new(faulty.clone());
    let count = Arc::new(AtomicUsize::new(0));
    let cut_at_count = Arc::new(AtomicUsize::new(usize::MAX));
    let cut = Arc::new(AtomicBool::new(false));
    let devices: Vec<Arc<dyn BlockDevice>> = faulty
        .iter()
        .map(|inner| {
            Arc::new(CutAtInputOutput {
                inner: inner.clone(),
                everyone: everyone.clone(),
                count: count.clone(),
                cut_at: cut_at_count.clone(),
                cut: cut.clone(),
                style,
            }) as Arc<dyn BlockDevice>
        })
        .collect();
    let array = zoned_raid6(SMALL, &devices).await;
    let zone_count = array.geometry().zone_count();
    assert!(
        zone_count > 600,
        "the entries span sectors ({zone_count} zones)"
    );
    let kept = [
        open_and_fill(&array, SMALL, 0, seed).await,
        open_and_fill(&array, SMALL, 1, seed + 1).await,
    ];
    array.fail_member(LOST);
    array.flush().await.unwrap();
    count.store(0, Ordering::SeqCst);
    cut_at_count.store(cut_at, Ordering::SeqCst);
    let batch: Vec<u64> = (2..zone_count).collect();
    let offsets: Vec<u64> = batch.iter().map(|zone| SMALL.zone_offset(*zone)).collect();
    let opened = array.open_regions(&offsets, SMALL.zone_bytes()).await;
    let was_cut = cut.load(Ordering::SeqCst);
    assert_eq!(opened.is_ok(), !was_cut, "the batch fails only when cut");
    // After a batch that returned, whatever was not flushed is lost: the
    // new sets must not depend on it.
    if !was_cut {
        for device in &faulty {
            device.power_cut(PowerCutStyle::DropAll).await.unwrap();
        }
    }
    drop(array);
    let restarted: Vec<Arc<dyn BlockDevice>> = faulty
        .iter()
        .map(|device| {
            Arc::new(FaultyDevice::new(device.inner().clone(), seed)) as Arc<dyn BlockDevice>
        })
        .collect();
    let array = assemble(TierRole::Flash, as_members(&restarted, &[LOST]))
        .await
        .unwrap_or_else(|error| panic!("cut at {cut_at} ({style:?}): no assembly: {error}"))
        .array;
    let old = SMALL.zone_bytes();
    let new = SMALL.zone_rows * 3 * BLOCK as u64;
    for zone in &batch {
        let usable = array
            .region_shape(SMALL.zone_offset(*zone), SMALL.zone_bytes())
            .unwrap()
            .usable_bytes;
        assert!(
            usable == old || usable == new,
            "cut at {cut_at} ({style:?}): zone {zone} at neither set ({usable} bytes)"
        );
        if !was_cut {
            assert_eq!(
                usable, new,
                "{style:?}: zone {zone}: a returned batch is durable"
            );
        }
    }
    for (zone, data) in kept.iter().enumerate() {
        let zone = zone as u64;
        assert_eq!(
            &read_zone(&array, SMALL, zone, data.len()).await,
            data,
            "cut at {cut_at} ({style:?}): zone {zone}"
        );
    }
    // The zones work at whichever set they came back at, laid out again.
    let data = open_and_fill(&array, SMALL, batch[0], seed + 2).await;
    assert_eq!(read_zone(&array, SMALL, batch[0], data.len()).await, data);
    was_cut
}

#[tokio::test]
async fn a_power_cut_at_any_write_or_flush_of_a_batch_leaves_each_zone_old_or_new() {
    let styles = [
        PowerCutStyle::TearAll,
        PowerCutStyle::DropAll,
        PowerCutStyle::KeepAll,
        PowerCutStyle::Random,
    ];
    for (style_index, style) in styles.into_iter().enumerate() {
        let mut cut_at = 1;
        while cut_during_batch(cut_at, style, (style_index * 1000 + cut_at) as u64).await {
            cut_at += 1;
            assert!(
                cut_at < 100,
                "a batch does a bounded number of writes and flushes"
            );
        }
        assert!(
            cut_at > 10,
            "every write and flush point was tried ({cut_at})"
        );
    }
}
