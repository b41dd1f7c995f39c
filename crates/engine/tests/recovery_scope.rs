//! Recovery reads only what the log can have reached since the checkpoint
//! (format version 8, docs/decisions/0030-recovery-from-the-checkpoint.md):
//! after a crash, open probes the heads the checkpoint recorded and the
//! segments the segment openings record lists, not every segment; a damaged
//! record area makes it scan every segment (and still recover exactly); a
//! batch in a newly opened segment is not durable before the record lists
//! its segment; and a version 7 pool is scanned whole once, upgraded, and
//! then opens like any other.

// Test code keeps `as` for small sizes and byte patterns.
#![allow(clippy::cast_possible_truncation)]

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use lamina_device::{
    AlignedBuffer, BlockDevice, DeviceError, FaultyDevice, MemoryDevice, PowerCutStyle,
};
use lamina_engine::log::FORMAT_VERSION;
use lamina_engine::log::geometry::{
    SEGMENT_OPENINGS_AREA_BLOCKS, SEGMENT_OPENINGS_AREA_SIZE_BLOCKS,
};
use lamina_engine::log::superblock::Superblock;
use lamina_engine::{Pool, PoolOptions};

mod common;
use common::blocks::{block_contents, write_blocks};
use common::pools::manual_checkpoint_limits;

use common::corrupt_segment_openings_record;

const BLOCK: usize = 4096;
const SEGMENT_BYTES: u64 = 256 << 10;
/// About 1000 segments, so that a whole scan is easy to tell from a
/// scan of the few segments a tail opened.
const DEVICE_BYTES: u64 = (4 << 20) + 1000 * SEGMENT_BYTES;
const SEGMENT_COUNT: u64 = 1000;

/// Counts reads; can hold writes into the segment openings areas until
/// released, and drops them once the power is cut.
struct TestDevice {
    inner: Arc<dyn BlockDevice>,
    reads: AtomicU64,
    hold_records: AtomicBool,
    released: tokio::sync::Notify,
}

impl TestDevice {
    fn new(inner: Arc<dyn BlockDevice>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            reads: AtomicU64::new(0),
            hold_records: AtomicBool::new(false),
            released: tokio::sync::Notify::new(),
        })
    }

    fn release_records(&self) {
        self.hold_records.store(false, Ordering::SeqCst);
        self.released.notify_waiters();
    }
}

fn is_record_write(offset: u64) -> bool {
    let start = SEGMENT_OPENINGS_AREA_BLOCKS[0] * BLOCK as u64;
    let end = (SEGMENT_OPENINGS_AREA_BLOCKS[1] + SEGMENT_OPENINGS_AREA_SIZE_BLOCKS) * BLOCK as u64;
    (start..end).contains(&offset)
}

#[async_trait::async_trait]
impl BlockDevice for TestDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        lamina_device::DeviceReadFuture::from_or_box(async move {
            self.reads.fetch_add(1, Ordering::SeqCst);
            self.inner.read(offset, length).await
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        if is_record_write(offset) {
            loop {
                let released = self.released.notified();
                if !self.hold_records.load(Ordering::SeqCst) {
                    break;
                }
                released.await;
            }
        }
        self.inner.write(offset, data).await
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush().await
    }
}

async fn check_range(pool: &Pool, volume: u32, blocks: std::ops::Range<u64>, generation: u8) {
    let mut buffer = vec![0u8; BLOCK];
    for block in blocks {
        pool.read(volume, block * BLOCK as u64, &mut buffer)
            .await
            .unwrap();
        assert!(
            buffer == block_contents(block, generation),
            "block {block}: expected generation {generation}"
        );
    }
}

/// A pool with 16 MiB written and covered by both slots, then a tail of 2
/// MiB (several new segments) flushed after them, and the process gone.
async fn pool_with_a_tail(memory: &Arc<MemoryDevice>) -> u32 {
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        ..PoolOptions::default()
    };
    let pool = Pool::create(memory.clone(), options, manual_checkpoint_limits(false))
        .await
        .unwrap();
    let volume = pool.create_volume("v", 64 << 20).await.unwrap().volume_id;
    write_blocks(&pool, volume, 0..4096, 1).await;
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    write_blocks(&pool, volume, 1000..1512, 2).await;
    pool.flush().await.unwrap();
    pool.flush_marker_written().await;
    pool.abandon();
    volume
}

async fn open_counting(memory: &Arc<MemoryDevice>) -> (Pool, u64) {
    let device = TestDevice::new(memory.clone());
    let pool = Pool::open(
        device.clone() as Arc<dyn BlockDevice>,
        manual_checkpoint_limits(false),
    )
    .await
    .unwrap();
    (pool, device.reads.load(Ordering::SeqCst))
}

async fn check_tail(pool: &Pool, volume: u32) {
    check_range(pool, volume, 0..1000, 1).await;
    check_range(pool, volume, 1000..1512, 2).await;
    check_range(pool, volume, 1512..4096, 1).await;
}

#[tokio::test(flavor = "current_thread")]
async fn open_after_a_crash_reads_only_the_segments_opened_since_the_checkpoint() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let volume = pool_with_a_tail(&memory).await;
    let (pool, reads) = open_counting(&memory).await;
    check_tail(&pool, volume).await;
    // A whole scan reads block 0 of each of the 1000 segments; the tail
    // opened about 10.
    assert!(reads < SEGMENT_COUNT / 5, "{reads} reads at open");
    // Again after this recovery's own checkpoints and record.
    write_blocks(&pool, volume, 3000..3100, 3).await;
    pool.flush().await.unwrap();
    pool.abandon();
    drop(pool);
    let (pool, reads) = open_counting(&memory).await;
    check_range(&pool, volume, 3000..3100, 3).await;
    check_range(&pool, volume, 1000..1512, 2).await;
    assert!(
        reads < SEGMENT_COUNT / 5,
        "{reads} reads at the second open"
    );
    pool.close().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_damaged_openings_record_makes_open_scan_every_segment() {
    for newest in [true, false] {
        let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
        let volume = pool_with_a_tail(&memory).await;
        assert!(corrupt_segment_openings_record(&memory, newest));
        let (pool, reads) = open_counting(&memory).await;
        check_tail(&pool, volume).await;
        assert!(
            reads >= SEGMENT_COUNT,
            "newest {newest}: {reads} reads at open"
        );
        pool.close().await.unwrap();
        // Repaired by the open: the next one reads little again.
        let (pool, reads) = open_counting(&memory).await;
        check_tail(&pool, volume).await;
        assert!(reads < SEGMENT_COUNT / 5, "{reads} reads after the repair");
        pool.close().await.unwrap();
    }
}

/// The record write of a new segment is held back: a flush must not return
/// (and so the batch must not count as durable) before it is written, or a
/// power cut right after the flush loses flushed data to a recovery that
/// trusts the older record.
#[tokio::test(flavor = "current_thread")]
async fn a_new_segment_is_durable_only_once_the_record_lists_it() {
    let memory = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let faulty = Arc::new(FaultyDevice::new(memory.clone(), 1));
    let device = TestDevice::new(faulty.clone());
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        ..PoolOptions::default()
    };
    let pool = Pool::create(device.clone(), options, manual_checkpoint_limits(false))
        .await
        .unwrap();
    let volume = pool.create_volume("v", 64 << 20).await.unwrap().volume_id;
    write_blocks(&pool, volume, 0..256, 1).await;
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    device.hold_records.store(true, Ordering::SeqCst);
    // Past the head segment's room: new segments are opened.
    write_blocks(&pool, volume, 256..512, 2).await;
    let releaser = {
        let device = device.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            device.release_records();
        })
    };
    pool.flush().await.unwrap();
    // Right after the flush: anything not flushed is lost.
    faulty.power_cut(PowerCutStyle::DropAll).await.unwrap();
    releaser.await.unwrap();
    pool.abandon();
    drop(pool);
    let pool = Pool::open(
        Arc::new(FaultyDevice::new(memory.clone(), 2)) as Arc<dyn BlockDevice>,
        manual_checkpoint_limits(false),
    )
    .await
    .unwrap();
    check_range(&pool, volume, 0..256, 1).await;
    check_range(&pool, volume, 256..512, 2).await;
    pool.close().await.unwrap();
}

/// Made by the version 7 build (commit a802662): a 64 MiB pool of 1 MiB
/// segments, volume `vol` (16 MiB): 8 MiB of 0x11, snapshot `vol@first`,
/// 2 MiB of 0x22 at 2 MiB, a clean close; then 1 MiB of 0x33 at 6 MiB,
/// flushed, and the process gone (a log tail in segments opened after the
/// checkpoint, which version 7 recorded nowhere).
fn version_7_image() -> Vec<u8> {
    let packed = include_bytes!("data/pool-format-7.img.gz");
    let mut image = Vec::new();
    flate2::read::GzDecoder::new(&packed[..])
        .read_to_end(&mut image)
        .unwrap();
    image
}

async fn check_version_7_contents(pool: &Pool) {
    const MIB: usize = 1 << 20;
    let mut buffer = vec![0u8; MIB];
    let live = pool.resolve_view("vol").unwrap();
    let expected = [0x11, 0x11, 0x22, 0x22, 0x11, 0x11, 0x33, 0x11, 0];
    for (mebibyte, byte) in expected.iter().enumerate() {
        pool.read_view(live, (mebibyte * MIB) as u64, &mut buffer)
            .await
            .unwrap();
        assert!(
            buffer.iter().all(|found| found == byte),
            "vol MiB {mebibyte}: expected {byte:#x}"
        );
    }
    let snapshot = pool.resolve_view("vol@first").unwrap();
    for mebibyte in 0..9 {
        pool.read_view(snapshot, (mebibyte * MIB) as u64, &mut buffer)
            .await
            .unwrap();
        let byte = if mebibyte < 8 { 0x11 } else { 0 };
        assert!(
            buffer.iter().all(|found| *found == byte),
            "vol@first MiB {mebibyte}"
        );
    }
}

fn superblock_version(memory: &MemoryDevice) -> u32 {
    let mut bytes = vec![0u8; BLOCK];
    memory.read_sync(0, &mut bytes);
    Superblock::decode(&bytes).unwrap().0
}

#[tokio::test(flavor = "current_thread")]
async fn a_version_7_pool_is_scanned_whole_once_then_upgraded() {
    let image = version_7_image();
    let memory = Arc::new(MemoryDevice::new(image.len() as u64));
    memory.write_sync(0, &image);
    assert_eq!(superblock_version(&memory), 7, "the image is version 7");
    let (pool, _) = open_counting(&memory).await;
    check_version_7_contents(&pool).await;
    // Upgraded: a version 7 build refuses it from now on (`NewerFormat`).
    assert_eq!(superblock_version(&memory), FORMAT_VERSION);
    let mut copy = vec![0u8; BLOCK];
    memory.read_sync(128 * BLOCK as u64, &mut copy);
    assert_eq!(Superblock::decode(&copy).unwrap().0, FORMAT_VERSION);
    // Used, then a crash: the tail's new segments are found through the record.
    let volume = pool.resolve_view("vol").unwrap().volume_id();
    pool.write(volume, 9 << 20, &vec![0x44; 3 << 20], false)
        .await
        .unwrap();
    pool.flush().await.unwrap();
    pool.abandon();
    drop(pool);
    let (pool, reads) = open_counting(&memory).await;
    check_version_7_contents(&pool).await;
    let mut buffer = vec![0u8; 3 << 20];
    pool.read(volume, 9 << 20, &mut buffer).await.unwrap();
    assert!(buffer.iter().all(|byte| *byte == 0x44), "vol MiB 9..12");
    pool.close().await.unwrap();
    eprintln!("{reads} reads at the open after the upgrade");
}

/// An upgraded pool takes compression (issue 44, format version 10): a
/// codec set on a volume of the version 7 image, this machine's text
/// written over MiB 9 and 10 (fragments beside the old whole blocks), a
/// crash after the flush, and every block, old and new, reads back; the
/// snapshot is untouched.
#[tokio::test(flavor = "current_thread")]
async fn an_upgraded_pool_compresses_new_writes_and_keeps_its_old_blocks() {
    let image = version_7_image();
    let memory = Arc::new(MemoryDevice::new(image.len() as u64));
    memory.write_sync(0, &image);
    let (pool, _) = open_counting(&memory).await;
    pool.set_volume_compression("vol", "lz4".parse().unwrap())
        .await
        .unwrap();
    let volume = pool.resolve_view("vol").unwrap().volume_id();
    let mut text = Vec::new();
    let mut directories = vec![std::path::PathBuf::from("/usr/share/perl5")];
    while let Some(directory) = directories.pop()
        && text.len() < 2 << 20
    {
        let mut entries: Vec<_> = std::fs::read_dir(&directory).unwrap().flatten().collect();
        entries.sort_by_key(std::fs::DirEntry::file_name);
        for entry in entries {
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => directories.push(entry.path()),
                Ok(kind) if kind.is_file() => text.extend(std::fs::read(entry.path()).unwrap()),
                _ => {}
            }
        }
    }
    assert!(
        text.len() >= 2 << 20,
        "not enough of this machine's Perl modules"
    );
    text.truncate(2 << 20);
    pool.write(volume, 9 << 20, &text, false).await.unwrap();
    pool.flush().await.unwrap();
    pool.abandon();
    drop(pool);
    let (pool, _) = open_counting(&memory).await;
    assert_eq!(superblock_version(&memory), FORMAT_VERSION);
    check_version_7_contents(&pool).await;
    let first = pool.location_of(volume, (9 << 20) / BLOCK as u64).unwrap();
    assert!(first.is_fragment(), "Perl text compresses: {first}");
    let mut buffer = vec![0u8; 2 << 20];
    pool.read(volume, 9 << 20, &mut buffer).await.unwrap();
    assert!(buffer == text, "vol MiB 9..11 after the crash");
    pool.close().await.unwrap();
}
