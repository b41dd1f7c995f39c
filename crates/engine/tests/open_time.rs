//! Measurement, not a check (ignored by default): how long opening a pool
//! takes after a crash with the same log tail (64 MiB of random 4 KiB writes
//! since the last checkpoint), and how many device reads it issues, at
//! increasing mapped sizes and with a 1 TiB capacity device (BENCHMARKS.md,
//! "Open time after a crash"). Real data through the engine in process, on
//! sparse files; reads are counted by a wrapper around the device.
//!
//! `LAMINA_OPEN_BENCH=one-tier:4,one-tier:16,two-tier:1024 cargo test
//! --release -p lamina-engine --test open_time -- --ignored --nocapture`
//! (`one-tier:G`: G GiB mapped on one device; `two-tier:C`: 1 GiB mapped on
//! a 4 GiB flash file and a C GiB capacity file; a `:disk` suffix puts the
//! capacity file behind the rotating-disk model at open; a `:whole` suffix
//! damages the segment openings record before the open, so that recovery
//! scans every segment as format version 7 did; a `:fast` suffix fills the
//! volume with the fast fill (`fast_fill`: the engine's whole write path, but
//! the device keeps only the batches' summaries; the log tail is real data),
//! for sizes whose data would not fit on the disk; files go to
//! `LAMINA_BENCH_DIR`, default the temporary directory).

#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

mod fast_fill;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use lamina_device::{
    AlignedBuffer, BlockCheck, BlockDevice, ConcatenatedDevice, DeviceError, FileDevice,
    FileDeviceOptions, RotatingDiskDevice, RotatingDiskModel,
};
use lamina_engine::log::geometry::SEGMENT_OPENINGS_AREA_BLOCKS;
use lamina_engine::{Pool, PoolLimits, PoolOptions, TestHooks};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use fast_fill::DataDroppingDevice;

const BLOCK: u64 = 4096;
const GIB: u64 = 1 << 30;
const FILL_WRITE_BYTES: usize = 1 << 20;
/// The log tail left for recovery: random 4 KiB writes after the checkpoint.
const TAIL_BYTES: u64 = 64 << 20;

/// Counts the reads that pass through it.
struct CountingDevice {
    inner: Arc<dyn BlockDevice>,
    reads: AtomicU64,
    read_bytes: AtomicU64,
}

#[async_trait::async_trait]
impl BlockDevice for CountingDevice {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }

    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        lamina_device::DeviceReadFuture::from_or_box(async move {
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.read_bytes.fetch_add(length as u64, Ordering::Relaxed);
            self.inner.read(offset, length).await
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        self.inner.write(offset, data).await
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush().await
    }

    async fn recover_block(
        &self,
        offset: u64,
        is_valid: BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        self.inner.recover_block(offset, is_valid).await
    }
}

fn file_device(path: &std::path::Path, size_bytes: u64) -> Arc<dyn BlockDevice> {
    let options = FileDeviceOptions {
        create_size_bytes: Some(size_bytes),
        ..FileDeviceOptions::default()
    };
    // The abandoned pool's background tasks may hold the file a moment longer.
    for _ in 0..100 {
        match FileDevice::open(path, options.clone()) {
            Ok(device) => return Arc::new(device),
            Err(error) if matches!(error.kind, lamina_device::DeviceErrorKind::InUse { .. }) => {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(error) => panic!("{error}"),
        }
    }
    panic!("{} stays in use", path.display());
}

/// The limits of both opens; after a fast fill without the memory cache's
/// warm-up, which would read blocks the fill never wrote.
fn limits(fast_fill: bool) -> PoolLimits {
    PoolLimits {
        memory_cache_warm_restart: !fast_fill,
        test_hooks: TestHooks {
            reuse_freed_segments_first: false,
            periodic_flush_and_checkpoint_off: true,
            checkpoint_increments_whatever_their_bytes: false,
        },
        ..PoolLimits::default()
    }
}

/// The pool's files and how to join them into its device.
struct Setup {
    label: String,
    paths: Vec<std::path::PathBuf>,
    sizes: Vec<u64>,
    mapped_bytes: u64,
    /// The capacity file behind the rotating-disk model at open.
    capacity_disk_model: bool,
    /// The segment openings record damaged before the open.
    whole_scan: bool,
    /// Filled with the fast fill.
    fast_fill: bool,
}

impl Setup {
    fn device(&self, at_open: bool) -> (Arc<dyn BlockDevice>, Option<u64>) {
        let mut devices: Vec<_> = self
            .paths
            .iter()
            .zip(&self.sizes)
            .map(|(path, size)| file_device(path, *size))
            .collect();
        if devices.len() == 1 {
            return (devices[0].clone(), None);
        }
        if at_open && self.capacity_disk_model {
            devices[1] = Arc::new(RotatingDiskDevice::new(
                devices[1].clone(),
                RotatingDiskModel::default(),
            ));
        }
        let joined = ConcatenatedDevice::new(devices[0].clone(), devices[1].clone());
        let flash = joined.first_region_bytes();
        (Arc::new(joined), Some(flash))
    }
}

/// Fills, checkpoints twice, writes the tail, flushes and abandons the pool.
async fn prepare(setup: &Setup) {
    for path in &setup.paths {
        let _ = std::fs::remove_file(path);
    }
    let (device, flash_region_bytes) = setup.device(false);
    let dropping = Arc::new(DataDroppingDevice::new(device.clone()));
    let device: Arc<dyn BlockDevice> = if setup.fast_fill {
        dropping.clone()
    } else {
        device
    };
    let options = PoolOptions {
        flash_region_bytes,
        ..PoolOptions::default()
    };
    let pool = Pool::create(device, options, limits(setup.fast_fill))
        .await
        .unwrap();
    let volume = pool
        .create_volume("v", setup.mapped_bytes)
        .await
        .unwrap()
        .volume_id;
    let started = Instant::now();
    let mut data = vec![0u8; FILL_WRITE_BYTES];
    for (index, offset) in (0..setup.mapped_bytes)
        .step_by(FILL_WRITE_BYTES)
        .enumerate()
    {
        data[..8].copy_from_slice(&(index as u64).to_le_bytes());
        pool.write(volume, offset, &data, false).await.unwrap();
    }
    pool.flush().await.unwrap();
    dropping.stop_dropping();
    pool.checkpoint().await.unwrap();
    pool.checkpoint().await.unwrap();
    println!(
        "{} | filled and checkpointed in {:.1} s ({} data blocks not written)",
        setup.label,
        started.elapsed().as_secs_f64(),
        dropping.dropped_blocks()
    );
    let mut rng = SmallRng::seed_from_u64(7);
    let block_count = setup.mapped_bytes / BLOCK;
    let mut block = vec![0u8; BLOCK as usize];
    for _ in 0..TAIL_BYTES / BLOCK {
        let logical = rng.random_range(0..block_count);
        rng.fill(&mut block[..64]);
        pool.write(volume, logical * BLOCK, &block, false)
            .await
            .unwrap();
    }
    pool.flush().await.unwrap();
    pool.flush_marker_written().await;
    pool.abandon();
}

/// Writes garbage over the first block of both areas of the segment
/// openings record, in the flash file.
fn damage_openings_record(setup: &Setup) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&setup.paths[0])
        .unwrap();
    for area in SEGMENT_OPENINGS_AREA_BLOCKS {
        file.write_all_at(&[0xA5; BLOCK as usize], area * BLOCK)
            .unwrap();
    }
    file.sync_all().unwrap();
}

async fn measure(setup: &Setup) {
    prepare(setup).await;
    if setup.whole_scan {
        damage_openings_record(setup);
    }
    let (device, _) = setup.device(true);
    let counting = Arc::new(CountingDevice {
        inner: device,
        reads: AtomicU64::new(0),
        read_bytes: AtomicU64::new(0),
    });
    let started = Instant::now();
    let pool = Pool::open(
        counting.clone() as Arc<dyn BlockDevice>,
        limits(setup.fast_fill),
    )
    .await
    .unwrap();
    let elapsed = started.elapsed();
    println!(
        "{} | open after a crash (64 MiB tail) | {:.3} s | {} reads, {:.1} MiB read",
        setup.label,
        elapsed.as_secs_f64(),
        counting.reads.load(Ordering::Relaxed),
        counting.read_bytes.load(Ordering::Relaxed) as f64 / (1 << 20) as f64
    );
    pool.close().await.unwrap();
    for path in &setup.paths {
        std::fs::remove_file(path).unwrap();
    }
}

fn setup(spec: &str, directory: &std::path::Path) -> Setup {
    let mut parts = spec.trim().split(':');
    let kind = parts.next().expect("kind");
    let size: u64 = parts.next().expect("kind:size").parse().unwrap();
    let flags: Vec<&str> = parts.collect();
    let capacity_disk_model = flags.contains(&"disk");
    let whole_scan = flags.contains(&"whole");
    let fast_fill = flags.contains(&"fast");
    let mut setup = match kind {
        "one-tier" => Setup {
            label: format!("one tier, {size} GiB mapped"),
            paths: vec![directory.join(format!("lamina-open-bench-{size}.img"))],
            sizes: vec![size * GIB + size * GIB / 3 + (256 << 20)],
            mapped_bytes: size * GIB,
            capacity_disk_model,
            whole_scan,
            fast_fill,
        },
        "two-tier" => Setup {
            label: format!("two tiers, 4 GiB flash + {size} GiB capacity, 1 GiB mapped"),
            paths: vec![
                directory.join("lamina-open-bench-flash.img"),
                directory.join(format!("lamina-open-bench-capacity-{size}.img")),
            ],
            sizes: vec![4 * GIB, size * GIB],
            mapped_bytes: GIB,
            capacity_disk_model,
            whole_scan,
            fast_fill,
        },
        other => panic!("unknown setup {other}"),
    };
    if capacity_disk_model {
        setup.label.push_str(", capacity behind the disk model");
    }
    if whole_scan {
        setup.label.push_str(", whole scan (record damaged)");
    }
    if fast_fill {
        setup.label.push_str(", fast fill");
    }
    setup
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: minutes and GiB of disk"]
async fn open_time_after_a_crash() {
    // The engine's own account of the open: `pool recovered` with its time,
    // the segments scanned and the batches replayed.
    let _ = tracing_subscriber::fmt()
        .with_env_filter("lamina_engine::pool::open=info")
        .try_init();
    let specs = std::env::var("LAMINA_OPEN_BENCH")
        .unwrap_or_else(|_| "one-tier:4,one-tier:16,two-tier:1024".to_string());
    let directory = std::env::var("LAMINA_BENCH_DIR")
        .map_or_else(|_| std::env::temp_dir(), std::path::PathBuf::from);
    for spec in specs.split(',') {
        measure(&setup(spec, &directory)).await;
    }
}
