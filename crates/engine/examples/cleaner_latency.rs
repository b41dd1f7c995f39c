//! Client latency with the cleaner busy versus idle (issue 5): a steady 70/30
//! read/write mix of 4 KiB random requests over one volume, offered open-loop
//! (Poisson arrivals, latency counted from each request's scheduled arrival, so
//! that a stalled engine cannot hide its queueing) at 70% of the saturation rate,
//! against two pools that differ only in free space:
//!
//! - busy: the volume holds `--live` (default 85%) of the pool and has been
//!   overwritten at random before the window, so every write in the window needs
//!   the cleaner to relocate live blocks;
//! - idle: the same volume, written the same way, in a pool large enough that
//!   the window's writes fit in free space and the cleaner never runs.
//!
//! The saturation rate is measured on the busy pool, closed-loop with
//! `SATURATION_CLIENTS` concurrent clients, in each run just before its busy
//! window; both windows of that run are offered 70% of it. Each run prints
//! p50/p99/p99.9 for both pools and the cleaner's relocations in the window;
//! the medians over the runs and the p99 ratio come last.
//!
//! Arrivals are dispatched by a timer with millisecond resolution, so every
//! latency includes up to about 1 ms of dispatch delay, in both windows alike.
//!
//! Device: a `FileDevice` (io_uring, O_DIRECT where the file system allows it)
//! on a temporary file, not a `MemoryDevice`: relocation competes with client
//! requests for the device queue, and a memory device would complete every
//! request at once and hide exactly the effect being measured. The memory block
//! cache is off, so that reads reach the device as they do on a pool larger
//! than its cache.
//!
//!     cargo run --release -p lamina-engine --example cleaner_latency -- \
//!         [--pool-mib 256] [--live 0.85] [--seconds 10] [--runs 3] [--directory DIR] \
//!         [--paced-cleaner on|off] [--relocation-ratio 32] [--cleaner-headroom 4]

// This example is moving into `lamina bench` on another branch; until then it
// keeps its `as` casts (issue 17 converts the library and binaries).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

#[path = "common/mod.rs"]
mod common;
use common::argument;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use lamina_device::{FileDevice, FileDeviceOptions};
use lamina_engine::{Pool, PoolLimits, PoolOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BLOCK_BYTES: u64 = 4096;
/// Share of requests that are reads, in percent.
const READ_PERCENT: u32 = 70;
/// Offered load as a fraction of the measured saturation rate.
const LOAD_FRACTION: f64 = 0.7;
/// Concurrent clients of the closed-loop saturation measurement.
const SATURATION_CLIENTS: usize = 32;
/// Length of the saturation measurement.
const SATURATION_SECONDS: u64 = 5;
/// Concurrent writers while filling and ageing a volume.
const FILL_WRITERS: usize = 32;
/// Random overwrite passes over the busy volume before measuring, so that the
/// pool is in its cleaning steady state.
const AGEING_PASSES: u64 = 1;
/// Open-loop requests outstanding at most; an arrival beyond it is counted as
/// overload instead of being sent (the run then says the load was too high).
const IN_FLIGHT_REQUESTS_MAX: usize = 65_536;
/// Largest latency the histograms record, in microseconds.
const LATENCY_MICROSECONDS_MAX: u64 = 60_000_000;

type ExampleResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// A pool on a temporary file with one fully written volume.
struct Setup {
    pool: Pool,
    volume_id: u32,
    volume_blocks: u64,
    /// Removes the file when dropped.
    _file: tempfile::TempPath,
}

async fn create_pool(
    directory: &str,
    device_bytes: u64,
) -> ExampleResult<(Pool, tempfile::TempPath)> {
    let file = tempfile::Builder::new()
        .prefix("cleaner-latency-")
        .tempfile_in(directory)?
        .into_temp_path();
    let device = FileDevice::open(
        &file,
        FileDeviceOptions {
            create_size_bytes: Some(device_bytes),
            ..FileDeviceOptions::default()
        },
    )?;
    let mut limits = PoolLimits {
        memory_cache_bytes: 0,
        ..PoolLimits::default()
    };
    limits.cleaner_relocation_blocks_per_client_block_max = argument(
        "--relocation-ratio",
        &limits
            .cleaner_relocation_blocks_per_client_block_max
            .to_string(),
    )
    .parse()?;
    limits.cleaner_headroom_segment_count = argument(
        "--cleaner-headroom",
        &limits.cleaner_headroom_segment_count.to_string(),
    )
    .parse()?;
    if argument("--paced-cleaner", "on") == "off" {
        limits.cleaner_relocation_blocks_per_client_block_max = 0.0;
    }
    let options = PoolOptions {
        force: true,
        ..PoolOptions::default()
    };
    let pool = Pool::create(Arc::new(device), options, limits).await?;
    Ok((pool, file))
}

/// Writes every block in `blocks` once from [`FILL_WRITERS`] concurrent tasks.
async fn write_blocks(pool: &Pool, volume_id: u32, blocks: Vec<u64>) -> ExampleResult<()> {
    let blocks = Arc::new(blocks);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for writer in 0..FILL_WRITERS {
        let (pool, blocks, next) = (pool.clone(), blocks.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut data = vec![0u8; BLOCK_BYTES as usize];
            SmallRng::seed_from_u64(writer as u64).fill(&mut data[..]);
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(block) = blocks.get(index) else {
                    return Ok::<(), lamina_engine::EngineError>(());
                };
                pool.write(volume_id, block * BLOCK_BYTES, &data, false)
                    .await?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    pool.flush().await?;
    Ok(())
}

/// A pool whose volume of `volume_blocks` blocks is written sequentially once,
/// then overwritten at random `ageing_passes` times.
async fn set_up(
    directory: &str,
    device_bytes: u64,
    volume_blocks: u64,
    ageing_passes: u64,
) -> ExampleResult<Setup> {
    let (pool, file) = create_pool(directory, device_bytes).await?;
    pool.create_volume("latency", volume_blocks * BLOCK_BYTES)
        .await?;
    let volume_id = pool.volume_id("latency")?;
    write_blocks(&pool, volume_id, (0..volume_blocks).collect()).await?;
    let mut rng = SmallRng::seed_from_u64(11);
    let random: Vec<u64> = (0..volume_blocks * ageing_passes)
        .map(|_| rng.random_range(0..volume_blocks))
        .collect();
    write_blocks(&pool, volume_id, random).await?;
    Ok(Setup {
        pool,
        volume_id,
        volume_blocks,
        _file: file,
    })
}

/// One 4 KiB request of the 70/30 mix at a random block.
async fn request(
    setup_pool: &Pool,
    volume_id: u32,
    volume_blocks: u64,
    seed: u64,
) -> ExampleResult<()> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let block = rng.random_range(0..volume_blocks);
    let mut buffer = vec![0u8; BLOCK_BYTES as usize];
    if rng.random_range(0..100) < READ_PERCENT {
        setup_pool
            .read(volume_id, block * BLOCK_BYTES, &mut buffer)
            .await?;
    } else {
        rng.fill(&mut buffer[..]);
        setup_pool
            .write(volume_id, block * BLOCK_BYTES, &buffer, false)
            .await?;
    }
    Ok(())
}

/// Closed-loop requests per second with [`SATURATION_CLIENTS`] clients.
async fn saturation_rate(setup: &Setup) -> ExampleResult<f64> {
    let deadline = Instant::now() + Duration::from_secs(SATURATION_SECONDS);
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for client in 0..SATURATION_CLIENTS {
        let (pool, done) = (setup.pool.clone(), done.clone());
        let (volume_id, volume_blocks) = (setup.volume_id, setup.volume_blocks);
        tasks.push(tokio::spawn(async move {
            let mut seed = (client as u64) << 40;
            while Instant::now() < deadline {
                seed += 1;
                request(&pool, volume_id, volume_blocks, seed).await?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    let started = Instant::now();
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// What one open-loop window measured.
struct Window {
    p50_microseconds: u64,
    p99_microseconds: u64,
    p999_microseconds: u64,
    completed: u64,
    overloaded: u64,
    relocated_blocks: u64,
    /// Device bytes written over client bytes written in the window.
    write_amplification: f64,
}

/// Offers `rate` requests per second open-loop for `seconds`.
async fn open_loop(setup: &Setup, rate: f64, seconds: u64) -> ExampleResult<Window> {
    let histogram = Arc::new(Mutex::new(Histogram::<u64>::new_with_bounds(
        1,
        LATENCY_MICROSECONDS_MAX,
        3,
    )?));
    let in_flight = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let mut overloaded = 0u64;
    let before = setup.pool.status();
    let mut rng = SmallRng::seed_from_u64(99);
    let start = Instant::now();
    let end = start + Duration::from_secs(seconds);
    let mut next_arrival = start;
    let mut seed = 0u64;
    while next_arrival < end {
        let now = Instant::now();
        while next_arrival <= now && next_arrival < end {
            let scheduled = next_arrival;
            // Exponential gaps: a Poisson arrival process at `rate`.
            let uniform: f64 = rng.random_range(f64::EPSILON..1.0);
            next_arrival += Duration::from_secs_f64(-uniform.ln() / rate);
            if in_flight.load(Ordering::Relaxed) >= IN_FLIGHT_REQUESTS_MAX {
                overloaded += 1;
                continue;
            }
            in_flight.fetch_add(1, Ordering::Relaxed);
            seed += 1;
            let (pool, histogram, in_flight, failures) = (
                setup.pool.clone(),
                histogram.clone(),
                in_flight.clone(),
                failures.clone(),
            );
            let (volume_id, volume_blocks) = (setup.volume_id, setup.volume_blocks);
            tokio::spawn(async move {
                if request(&pool, volume_id, volume_blocks, seed)
                    .await
                    .is_err()
                {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                let microseconds = scheduled.elapsed().as_micros() as u64;
                histogram
                    .lock()
                    .expect("histogram lock")
                    .saturating_record(microseconds.clamp(1, LATENCY_MICROSECONDS_MAX));
                in_flight.fetch_sub(1, Ordering::Relaxed);
            });
        }
        tokio::time::sleep_until(next_arrival.into()).await;
    }
    while in_flight.load(Ordering::Relaxed) > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    if failures.load(Ordering::Relaxed) > 0 {
        return Err(format!("{} requests failed", failures.load(Ordering::Relaxed)).into());
    }
    let after = setup.pool.status();
    let relocated_blocks = after.cleaner_relocated_blocks - before.cleaner_relocated_blocks;
    let write_amplification = (after.device_bytes_written - before.device_bytes_written) as f64
        / (after.client_bytes_written - before.client_bytes_written).max(1) as f64;
    let histogram = histogram.lock().expect("histogram lock");
    Ok(Window {
        p50_microseconds: histogram.value_at_quantile(0.50),
        p99_microseconds: histogram.value_at_quantile(0.99),
        p999_microseconds: histogram.value_at_quantile(0.999),
        completed: histogram.len(),
        overloaded,
        relocated_blocks,
        write_amplification,
    })
}

fn median(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    values[values.len() / 2]
}

fn print_window(label: &str, window: &Window) {
    println!(
        "  {label:<5} p50 {:>7} us  p99 {:>7} us  p99.9 {:>7} us  ({} requests, {} overload, {} blocks relocated, WA {:.2})",
        window.p50_microseconds,
        window.p99_microseconds,
        window.p999_microseconds,
        window.completed,
        window.overloaded,
        window.relocated_blocks,
        window.write_amplification
    );
}

#[tokio::main]
async fn main() -> ExampleResult<()> {
    let pool_mib: u64 = argument("--pool-mib", "256").parse()?;
    let live: f64 = argument("--live", "0.85").parse()?;
    let seconds: u64 = argument("--seconds", "10").parse()?;
    let runs: usize = argument("--runs", "3").parse()?;
    let directory = argument("--directory", &std::env::temp_dir().to_string_lossy());
    // The pool's own metadata (superblock, checkpoint slots) takes the first MiBs.
    let busy_device_bytes = (pool_mib + 4) << 20;
    let usable_bytes = {
        let (probe, _file) = create_pool(&directory, busy_device_bytes).await?;
        let status = probe.status();
        probe.close().await?;
        status.capacity_bytes - status.reserved_bytes
    };
    let volume_blocks = (usable_bytes as f64 * live) as u64 / BLOCK_BYTES;
    println!(
        "{READ_PERCENT}/{} read/write, 4 KiB random, open-loop at {:.0}% of saturation, {seconds} s windows; volume {} MiB; busy pool {pool_mib} MiB ({:.0}% live), idle pool large enough not to clean",
        100 - READ_PERCENT,
        LOAD_FRACTION * 100.0,
        (volume_blocks * BLOCK_BYTES) >> 20,
        live * 100.0
    );
    let (mut busy_p50, mut busy_p99, mut busy_p999) = (Vec::new(), Vec::new(), Vec::new());
    let (mut idle_p50, mut idle_p99, mut idle_p999) = (Vec::new(), Vec::new(), Vec::new());
    let mut rates = Vec::new();
    for run in 1..=runs {
        let busy = set_up(&directory, busy_device_bytes, volume_blocks, AGEING_PASSES).await?;
        let saturation = saturation_rate(&busy).await?;
        let rate = saturation * LOAD_FRACTION;
        let busy_window = open_loop(&busy, rate, seconds).await?;
        busy.pool.close().await?;
        drop(busy);
        // The idle pool must absorb the ageing pass and the window's writes
        // without cleaning: room for both twice over, beyond the volume.
        let window_write_bytes =
            (rate * seconds as f64 * f64::from(100 - READ_PERCENT) / 100.0) as u64 * BLOCK_BYTES;
        let idle_device_bytes = busy_device_bytes
            + 2 * (volume_blocks * BLOCK_BYTES * AGEING_PASSES + window_write_bytes);
        let idle = set_up(&directory, idle_device_bytes, volume_blocks, AGEING_PASSES).await?;
        let idle_window = open_loop(&idle, rate, seconds).await?;
        idle.pool.close().await?;
        drop(idle);
        println!("run {run}: saturation {saturation:.0} requests/s, offered {rate:.0}/s");
        print_window("busy", &busy_window);
        print_window("idle", &idle_window);
        rates.push(rate as u64);
        busy_p50.push(busy_window.p50_microseconds);
        busy_p99.push(busy_window.p99_microseconds);
        busy_p999.push(busy_window.p999_microseconds);
        idle_p50.push(idle_window.p50_microseconds);
        idle_p99.push(idle_window.p99_microseconds);
        idle_p999.push(idle_window.p999_microseconds);
    }
    let (busy_p99_median, idle_p99_median) = (median(&mut busy_p99), median(&mut idle_p99));
    println!(
        "median of {runs} runs (offered {}/s): busy p50 {} p99 {} p99.9 {} us; idle p50 {} p99 {} p99.9 {} us; p99 busy/idle {:.2}",
        median(&mut rates),
        median(&mut busy_p50),
        busy_p99_median,
        median(&mut busy_p999),
        median(&mut idle_p50),
        idle_p99_median,
        median(&mut idle_p999),
        busy_p99_median as f64 / idle_p99_median.max(1) as f64
    );
    Ok(())
}
