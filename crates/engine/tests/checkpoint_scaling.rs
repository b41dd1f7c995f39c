//! Measurement, not a check (ignored by default): checkpoint bytes and time
//! at increasing mapped sizes, a full base against an increment after 1% of
//! the blocks changed at random, and the process's resident memory per
//! mapped block (BENCHMARKS.md, "Metadata that scales (issue 23)"). Real
//! data through the engine in process, on a sparse file device; a size with
//! `:fast` is filled with the fast fill (`fast_fill`: the engine's whole
//! write path, but the device keeps only the batches' summaries), for sizes
//! whose data would not fit on the disk; with `:one-client-stream` client
//! writes are not split by lifespan (before decision 0035 was built, that
//! dropped the placement's byte per physical block, which told it from the
//! map; the level now lives in the map entry, so both cost the same). The
//! 1% rewrites are real data
//! either way. The memory cache is off, so that resident memory is the
//! engine's metadata (the cache is a fixed `memory_cache_bytes`).
//!
//! `LAMINA_CHECKPOINT_BENCH_GIB=1,4,64:fast cargo test --release -p
//! lamina-engine --test checkpoint_scaling -- --ignored --nocapture` (the
//! file goes to `LAMINA_BENCH_DIR`, default the temporary directory; run one
//! size per process for resident memory, since memory freed by an earlier
//! size stays with the allocator).

#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

mod fast_fill;

use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::Instant;

use lamina_device::{BlockDevice, FileDevice, FileDeviceOptions};
use lamina_engine::log::checkpoint::Slot;
use lamina_engine::log::geometry::CHECKPOINT_SLOT_BLOCKS;
use lamina_engine::{Pool, PoolLimits, PoolOptions, TestHooks};

use fast_fill::{DataDroppingDevice, ResidentMemory};
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

/// Prints memory now, and its growth since `before` per mapped block.
fn print_memory(mapped_gib: u64, what: &str, before: ResidentMemory) {
    let now = ResidentMemory::now();
    let block_count = (mapped_gib * GIB / BLOCK) as f64;
    let anonymous_grown = now.anonymous_bytes.saturating_sub(before.anonymous_bytes);
    let heap_grown = now
        .heap_in_use_bytes
        .saturating_sub(before.heap_in_use_bytes);
    println!(
        "mapped {mapped_gib} GiB | {what} | resident {:.1} MiB (peak {:.1}), anonymous {:.1} MiB, \
         heap in use {:.1} MiB | grown: anonymous {:.2} bytes, heap {:.2} bytes per mapped block",
        now.resident_bytes as f64 / (1 << 20) as f64,
        now.peak_resident_bytes as f64 / (1 << 20) as f64,
        now.anonymous_bytes as f64 / (1 << 20) as f64,
        now.heap_in_use_bytes as f64 / (1 << 20) as f64,
        anonymous_grown as f64 / block_count,
        heap_grown as f64 / block_count
    );
}

async fn measure(spec: &str, directory: &std::path::Path) {
    let mut parts = spec.trim().split(':');
    let mapped_gib: u64 = parts.next().expect("a size").parse().unwrap();
    let flags: Vec<&str> = parts.collect();
    let fast = flags.contains(&"fast");
    // One client stream: no interval levels set. They cost memory of their
    // own (a byte per physical block in `cleaner::placement`) until decision
    // 0035 moved them into the map entry; kept to compare with the figures
    // from before.
    let one_client_stream = flags.contains(&"one-client-stream");
    let path = directory.join(format!("lamina-checkpoint-bench-{mapped_gib}.img"));
    let _ = std::fs::remove_file(&path);
    let mapped_bytes = mapped_gib * GIB;
    let device_bytes = mapped_bytes + mapped_bytes / 3 + (256 << 20);
    let options = FileDeviceOptions {
        create_size_bytes: Some(device_bytes),
        ..FileDeviceOptions::default()
    };
    let file_device: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&path, options).unwrap());
    let dropping = Arc::new(DataDroppingDevice::new(file_device.clone()));
    let device: Arc<dyn BlockDevice> = if fast { dropping.clone() } else { file_device };
    let limits = PoolLimits {
        memory_cache_bytes: 0,
        memory_cache_warm_restart: false,
        separate_client_writes_by_lifespan: !one_client_stream,
        test_hooks: TestHooks {
            reuse_freed_segments_first: false,
            periodic_flush_and_checkpoint_off: true,
            checkpoint_increments_whatever_their_bytes: false,
        },
        ..PoolLimits::default()
    };
    let before = ResidentMemory::now();
    print_memory(mapped_gib, "before the pool", before);
    let pool = Pool::create(device, PoolOptions::default(), limits)
        .await
        .unwrap();
    print_memory(mapped_gib, "empty pool (segment table)", before);
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
    dropping.stop_dropping();
    println!(
        "mapped {mapped_gib} GiB | filled in {:.1} s ({}; {} data blocks not written)",
        started.elapsed().as_secs_f64(),
        if fast { "fast fill" } else { "real data" },
        dropping.dropped_blocks()
    );
    print_memory(mapped_gib, "after the fill, before a checkpoint", before);
    let file = std::fs::File::open(&path).unwrap();
    measured_checkpoint(&pool, &file, mapped_gib, "after the fill (full)").await;
    print_memory(mapped_gib, "after the fill and a checkpoint", before);
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
        print_memory(mapped_gib, &format!("after round {round}"), before);
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
    for spec in sizes.split(',') {
        measure(spec, &directory).await;
    }
}

/// Resident memory of an empty pool on a sparse file of each size given in
/// GiB (`LAMINA_EMPTY_POOL_BENCH_GIB`, default 1024): what grows with the
/// segment count alone (the segment table, placement hints, free lists).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: a sparse file of the size given"]
async fn resident_memory_of_an_empty_pool_by_device_size() {
    let sizes = std::env::var("LAMINA_EMPTY_POOL_BENCH_GIB").unwrap_or_else(|_| "1024".to_string());
    let directory = std::env::var("LAMINA_BENCH_DIR")
        .map_or_else(|_| std::env::temp_dir(), std::path::PathBuf::from);
    for size in sizes.split(',') {
        let device_gib: u64 = size.trim().parse().unwrap();
        let path = directory.join(format!("lamina-empty-pool-bench-{device_gib}.img"));
        let _ = std::fs::remove_file(&path);
        let options = FileDeviceOptions {
            create_size_bytes: Some(device_gib * GIB),
            ..FileDeviceOptions::default()
        };
        let device: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&path, options).unwrap());
        let limits = PoolLimits {
            memory_cache_bytes: 0,
            memory_cache_warm_restart: false,
            test_hooks: TestHooks::without_periodic_flush_and_checkpoint(),
            ..PoolLimits::default()
        };
        let before = ResidentMemory::now();
        let pool = Pool::create(device, PoolOptions::default(), limits)
            .await
            .unwrap();
        let segment_count = pool.status().segment_count;
        let created = ResidentMemory::now();
        pool.checkpoint().await.unwrap();
        let checkpointed = ResidentMemory::now();
        let per_segment = |after: ResidentMemory| {
            (
                after.anonymous_bytes.saturating_sub(before.anonymous_bytes) as f64
                    / segment_count as f64,
                after
                    .heap_in_use_bytes
                    .saturating_sub(before.heap_in_use_bytes) as f64
                    / segment_count as f64,
            )
        };
        println!(
            "device {device_gib} GiB | {segment_count} segments | per segment (anonymous, heap): \
             after create {:.1?}, after a checkpoint {:.1?}",
            per_segment(created),
            per_segment(checkpointed)
        );
        pool.close().await.unwrap();
        std::fs::remove_file(&path).unwrap();
    }
}
