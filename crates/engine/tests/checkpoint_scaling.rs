//! Measurement, not a check (ignored by default): checkpoint bytes and time
//! at increasing mapped sizes, a full base against an increment after 1% of
//! the blocks changed at random (BENCHMARKS.md, "Metadata that scales (issue
//! 23)"). Real data through the engine in process, on a sparse file device.
//!
//! `LAMINA_CHECKPOINT_BENCH_GIB=1,4 cargo test --release -p lamina-engine
//! --test checkpoint_scaling -- --ignored --nocapture` (the file goes to
//! `LAMINA_BENCH_DIR`, default the temporary directory).

#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;

use lamina_device::{BlockDevice, FileDevice, FileDeviceOptions};
use lamina_engine::log::checkpoint::Slot;
use lamina_engine::log::geometry::CHECKPOINT_SLOT_BLOCKS;
use lamina_engine::{Pool, PoolLimits, PoolOptions, TestHooks};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = 4096;
const GIB: u64 = 1 << 30;
const FILL_WRITE_BYTES: usize = 1 << 20;

/// The newest valid slot in the pool file.
fn newest_slot(file: &std::fs::File) -> Slot {
    CHECKPOINT_SLOT_BLOCKS
        .iter()
        .filter_map(|block| {
            let mut bytes = vec![0u8; BLOCK as usize];
            file.read_exact_at(&mut bytes, block * BLOCK).ok()?;
            Slot::decode(&bytes).ok()
        })
        .max_by_key(|slot| slot.checkpoint_sequence)
        .expect("a valid slot")
}

/// Takes a checkpoint and prints its kind, bytes and time.
async fn measured_checkpoint(pool: &Pool, file: &std::fs::File, mapped_gib: u64, what: &str) {
    let started = Instant::now();
    pool.checkpoint().await.expect("checkpoint");
    let elapsed = started.elapsed();
    let slot = newest_slot(file);
    let kind = if slot.earlier_links.is_empty() {
        "base"
    } else {
        "increment"
    };
    println!(
        "mapped {mapped_gib} GiB | {what} | {kind} | {} bytes ({:.1} KiB) | {:.1} ms",
        slot.body_bytes,
        slot.body_bytes as f64 / 1024.0,
        elapsed.as_secs_f64() * 1000.0
    );
}

async fn measure(mapped_gib: u64, directory: &std::path::Path) {
    let path = directory.join(format!("lamina-checkpoint-bench-{mapped_gib}.img"));
    let _ = std::fs::remove_file(&path);
    let mapped_bytes = mapped_gib * GIB;
    let device_bytes = mapped_bytes + mapped_bytes / 3 + (256 << 20);
    let options = FileDeviceOptions {
        create_size_bytes: Some(device_bytes),
        ..FileDeviceOptions::default()
    };
    let device: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&path, options).unwrap());
    let limits = PoolLimits {
        test_hooks: TestHooks {
            reuse_freed_segments_first: false,
            periodic_flush_and_checkpoint_off: true,
            checkpoint_increments_whatever_their_bytes: false,
        },
        ..PoolLimits::default()
    };
    let pool = Pool::create(device, PoolOptions::default(), limits)
        .await
        .unwrap();
    let volume = pool
        .create_volume("v", mapped_bytes)
        .await
        .unwrap()
        .volume_id;
    let started = Instant::now();
    let mut data = vec![0u8; FILL_WRITE_BYTES];
    for (index, offset) in (0..mapped_bytes).step_by(FILL_WRITE_BYTES).enumerate() {
        data[..8].copy_from_slice(&(index as u64).to_le_bytes());
        data[FILL_WRITE_BYTES / 2] = index as u8;
        pool.write(volume, offset, &data, false).await.unwrap();
    }
    pool.flush().await.unwrap();
    println!(
        "mapped {mapped_gib} GiB | filled in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let file = std::fs::File::open(&path).unwrap();
    measured_checkpoint(&pool, &file, mapped_gib, "after the fill (full)").await;
    let mut rng = SmallRng::seed_from_u64(mapped_gib);
    let block_count = mapped_bytes / BLOCK;
    for round in 1..=3 {
        let mut block = vec![0u8; BLOCK as usize];
        for _ in 0..block_count / 100 {
            let logical = rng.random_range(0..block_count);
            rng.fill(&mut block[..64]);
            pool.write(volume, logical * BLOCK, &block, false)
                .await
                .unwrap();
        }
        pool.flush().await.unwrap();
        measured_checkpoint(
            &pool,
            &file,
            mapped_gib,
            &format!("1% changed, round {round}"),
        )
        .await;
    }
    pool.close().await.unwrap();
    std::fs::remove_file(&path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: minutes and GiB of disk"]
async fn checkpoint_bytes_and_time_by_mapped_size() {
    let sizes = std::env::var("LAMINA_CHECKPOINT_BENCH_GIB").unwrap_or_else(|_| "1,4".to_string());
    let directory = std::env::var("LAMINA_BENCH_DIR")
        .map_or_else(|_| std::env::temp_dir(), std::path::PathBuf::from);
    for size in sizes.split(',') {
        measure(size.trim().parse().unwrap(), &directory).await;
    }
}
