//! `cargo run --release -p lamina-engine --example cleaner_latency --` (formerly `lamina bench cleaner-latency`;
//! decision 0060): client latency with the cleaner busy versus idle
//! (issue 5). A steady 70/30 read/write mix of 4 KiB random requests over one volume,
//! offered open-loop (Poisson arrivals, latency counted from each request's scheduled
//! arrival, so that a stalled engine cannot hide its queueing) at 70% of the
//! saturation rate, against two pools that differ only in free space:
//!
//! - busy: the volume holds `--live` (default 85%) of the pool and has been
//!   overwritten at random before the window, so every write in the window needs the
//!   cleaner to relocate live blocks;
//! - idle: the same volume, written the same way, in a pool large enough that the
//!   window's writes fit in free space and the cleaner never runs.
//!
//! The saturation rate is measured on the busy pool, closed-loop with
//! `SATURATION_CLIENTS` concurrent clients, in each run just before its busy window;
//! both windows of that run are offered 70% of it. Each run reports p50/p99/p99.9 for
//! both pools and the cleaner's relocations in the window; the medians over the runs
//! and the p99 ratio come last.
//!
//! Arrivals are dispatched by a timer with millisecond resolution, so every latency
//! includes up to about 1 ms of dispatch delay, in both windows alike.
//!
//! Device: a `FileDevice` (io_uring, O_DIRECT where the file system allows it) on a
//! temporary file, not a `MemoryDevice`: relocation competes with client requests for
//! the device queue, and a memory device would complete every request at once and
//! hide exactly the effect being measured. The memory block cache is off, so that
//! reads reach the device as they do on a pool larger than its cache.

mod support;

use support::cleaner::CleanerOptions;
use support::{core_count, create_pool, open_file_device, runtime, upper_median, write_blocks};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use hdrhistogram::Histogram;
use lamina_api::size::parse_size;
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Share of requests that are reads, in percent.
const READ_PERCENT: u32 = 70;
/// Offered load as a fraction of the measured saturation rate.
const LOAD_FRACTION: f64 = 0.7;
/// Concurrent clients of the closed-loop saturation measurement.
const SATURATION_CLIENTS: usize = 32;
/// Random overwrite passes over the busy volume before measuring, so that the pool
/// is in its cleaning steady state.
const AGEING_PASSES: u64 = 1;
/// Open-loop requests outstanding at most; an arrival beyond it is counted as
/// overload instead of being sent (the run then says the load was too high).
const IN_FLIGHT_REQUESTS_MAX: usize = 65_536;
/// Largest latency the histograms record, in microseconds.
const LATENCY_MICROSECONDS_MAX: u64 = 60_000_000;
/// The pool's own metadata (superblock, checkpoint slots) beyond `--pool-size`.
const METADATA_BYTES: u64 = 4 << 20;

/// In process on files: client latency with the cleaner busy versus idle.
#[derive(Debug, Clone, Parser)]
pub struct CleanerLatencyArgs {
    /// Size of the busy pool (e.g. 256M, 1G).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub pool_size: u64,
    /// Share of the busy pool's usable space the volume holds.
    #[arg(long, default_value_t = 0.85)]
    pub live: f64,
    /// Seconds of each open-loop window.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub seconds: u64,
    /// Seconds of the closed-loop saturation measurement before each busy window.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub saturation_seconds: u64,
    /// Runs (busy and idle window each); the medians are reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub runs: u64,
    /// Where the pool files go (default: the system temporary directory).
    #[arg(long)]
    pub directory: Option<PathBuf>,
    #[command(flatten)]
    pub cleaner: CleanerOptions,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// A pool on a temporary file with one fully written volume.
struct Setup {
    pool: Pool,
    volume_id: u32,
    volume_blocks: u64,
    /// Removes the file when dropped.
    _file: tempfile::TempPath,
}

/// What one open-loop window measured.
#[derive(Debug, Clone, Serialize)]
pub struct Window {
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub completed: u64,
    pub overloaded: u64,
    pub relocated_blocks: u64,
    /// Device bytes written over client bytes written in the window.
    pub write_amplification: f64,
}

/// One run: the saturation rate and both windows at 70% of it.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub saturation_per_second: f64,
    pub offered_per_second: f64,
    pub busy: Window,
    pub idle: Window,
}

/// Medians over the runs.
#[derive(Debug, Clone, Serialize)]
pub struct Medians {
    pub offered_per_second: u64,
    pub busy_p50_us: u64,
    pub busy_p99_us: u64,
    pub busy_p999_us: u64,
    pub idle_p50_us: u64,
    pub idle_p99_us: u64,
    pub idle_p999_us: u64,
    pub busy_to_idle_p99: f64,
}

/// What the cleaner-latency benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct CleanerLatencyReport {
    pub pool_size_bytes: u64,
    pub live: f64,
    pub volume_bytes: u64,
    pub seconds: u64,
    pub read_percent: u32,
    pub load_fraction: f64,
    pub runs: Vec<Run>,
    pub medians: Medians,
}

async fn create_file_pool(
    arguments: &CleanerLatencyArgs,
    directory: &Path,
    device_bytes: u64,
) -> anyhow::Result<(Pool, tempfile::TempPath)> {
    let file = tempfile::Builder::new()
        .prefix("cleaner-latency-")
        .tempfile_in(directory)?
        .into_temp_path();
    let device = open_file_device(&file, Some(device_bytes))?;
    let limits = arguments.cleaner.apply(PoolLimits {
        memory_cache_bytes: 0,
        ..PoolLimits::default()
    });
    Ok((create_pool(device, limits).await?, file))
}

/// A pool whose volume of `volume_blocks` blocks is written sequentially once, then
/// overwritten at random [`AGEING_PASSES`] times.
async fn set_up(
    arguments: &CleanerLatencyArgs,
    directory: &Path,
    device_bytes: u64,
    volume_blocks: u64,
) -> anyhow::Result<Setup> {
    let (pool, file) = create_file_pool(arguments, directory, device_bytes).await?;
    let volume_id = pool
        .create_volume("latency", volume_blocks * BLOCK_SIZE_BYTES)
        .await?
        .volume_id;
    write_blocks(&pool, volume_id, (0..volume_blocks).collect()).await?;
    pool.flush().await?;
    let mut rng = SmallRng::seed_from_u64(11);
    let random: Vec<u64> = (0..volume_blocks * AGEING_PASSES)
        .map(|_| rng.random_range(0..volume_blocks))
        .collect();
    write_blocks(&pool, volume_id, random).await?;
    pool.flush().await?;
    Ok(Setup {
        pool,
        volume_id,
        volume_blocks,
        _file: file,
    })
}

/// One 4 KiB request of the 70/30 mix at a random block.
async fn request(pool: &Pool, volume_id: u32, volume_blocks: u64, seed: u64) -> anyhow::Result<()> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let offset = rng.random_range(0..volume_blocks) * BLOCK_SIZE_BYTES;
    let mut buffer = vec![0u8; lamina_engine::BLOCK_BYTES];
    if rng.random_range(0..100) < READ_PERCENT {
        pool.read(volume_id, offset, &mut buffer).await?;
    } else {
        rng.fill(&mut buffer[..]);
        pool.write(volume_id, offset, &buffer, false).await?;
    }
    Ok(())
}

/// Closed-loop requests per second with [`SATURATION_CLIENTS`] clients.
async fn saturation_rate(setup: &Setup, seconds: u64) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs(seconds);
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
            anyhow::Ok(())
        }));
    }
    let started = Instant::now();
    for task in tasks {
        task.await??;
    }
    Ok(done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// The requests of an open-loop window in flight, and what they left behind.
#[derive(Clone)]
struct Tally {
    histogram: Arc<Mutex<Histogram<u64>>>,
    in_flight: Arc<AtomicUsize>,
    failures: Arc<AtomicUsize>,
}

impl Tally {
    /// Sends one request scheduled at `scheduled` and records its latency from then.
    fn send(&self, setup: &Setup, scheduled: Instant, seed: u64) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        let tally = self.clone();
        let pool = setup.pool.clone();
        let (volume_id, volume_blocks) = (setup.volume_id, setup.volume_blocks);
        tokio::spawn(async move {
            if request(&pool, volume_id, volume_blocks, seed)
                .await
                .is_err()
            {
                tally.failures.fetch_add(1, Ordering::Relaxed);
            }
            let microseconds = u64::try_from(scheduled.elapsed().as_micros()).unwrap_or(u64::MAX);
            tally
                .histogram
                .lock()
                .expect("histogram lock")
                .saturating_record(microseconds.clamp(1, LATENCY_MICROSECONDS_MAX));
            tally.in_flight.fetch_sub(1, Ordering::Relaxed);
        });
    }
}

/// Offers `rate` requests per second open-loop for `seconds`.
async fn open_loop(setup: &Setup, rate: f64, seconds: u64) -> anyhow::Result<Window> {
    let tally = Tally {
        histogram: Arc::new(Mutex::new(Histogram::new_with_bounds(
            1,
            LATENCY_MICROSECONDS_MAX,
            3,
        )?)),
        in_flight: Arc::new(AtomicUsize::new(0)),
        failures: Arc::new(AtomicUsize::new(0)),
    };
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
            if tally.in_flight.load(Ordering::Relaxed) >= IN_FLIGHT_REQUESTS_MAX {
                overloaded += 1;
                continue;
            }
            seed += 1;
            tally.send(setup, scheduled, seed);
        }
        tokio::time::sleep_until(next_arrival.into()).await;
    }
    while tally.in_flight.load(Ordering::Relaxed) > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let failures = tally.failures.load(Ordering::Relaxed);
    if failures > 0 {
        anyhow::bail!("{failures} requests failed");
    }
    let after = setup.pool.status();
    let histogram = tally.histogram.lock().expect("histogram lock");
    Ok(Window {
        p50_us: histogram.value_at_quantile(0.50),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
        completed: histogram.len(),
        overloaded,
        relocated_blocks: after.cleaner_relocated_blocks - before.cleaner_relocated_blocks,
        write_amplification: (after.device_bytes_written - before.device_bytes_written) as f64
            / (after.client_bytes_written - before.client_bytes_written).max(1) as f64,
    })
}

/// The usable bytes of a pool on `device_bytes`: capacity less the clients' reserve.
async fn usable_bytes(
    arguments: &CleanerLatencyArgs,
    directory: &Path,
    device_bytes: u64,
) -> anyhow::Result<u64> {
    let (probe, _file) = create_file_pool(arguments, directory, device_bytes).await?;
    let status = probe.status();
    probe.close().await?;
    Ok(status.capacity_bytes - status.reserved_bytes)
}

async fn one_run(
    arguments: &CleanerLatencyArgs,
    directory: &Path,
    volume_blocks: u64,
) -> anyhow::Result<Run> {
    let busy_device_bytes = arguments.pool_size + METADATA_BYTES;
    let busy = set_up(arguments, directory, busy_device_bytes, volume_blocks).await?;
    let saturation = saturation_rate(&busy, arguments.saturation_seconds).await?;
    let rate = saturation * LOAD_FRACTION;
    let busy_window = open_loop(&busy, rate, arguments.seconds).await?;
    busy.pool.close().await?;
    drop(busy);
    // The idle pool must absorb the ageing pass and the window's writes without
    // cleaning: room for both twice over, beyond the volume.
    let window_writes = rate * arguments.seconds as f64 * f64::from(100 - READ_PERCENT) / 100.0;
    let window_write_bytes = support::saturating_u64(window_writes.floor()) * BLOCK_SIZE_BYTES;
    let idle_device_bytes = busy_device_bytes
        + 2 * (volume_blocks * BLOCK_SIZE_BYTES * AGEING_PASSES + window_write_bytes);
    let idle = set_up(arguments, directory, idle_device_bytes, volume_blocks).await?;
    let idle_window = open_loop(&idle, rate, arguments.seconds).await?;
    idle.pool.close().await?;
    Ok(Run {
        saturation_per_second: saturation,
        offered_per_second: rate,
        busy: busy_window,
        idle: idle_window,
    })
}

fn median_of(runs: &[Run], figure: impl Fn(&Run) -> u64) -> u64 {
    upper_median(runs.iter().map(figure))
}

fn medians(runs: &[Run]) -> Medians {
    let busy_p99_us = median_of(runs, |run| run.busy.p99_us);
    let idle_p99_us = median_of(runs, |run| run.idle.p99_us);
    Medians {
        offered_per_second: median_of(runs, |run| {
            support::saturating_u64(run.offered_per_second.floor())
        }),
        busy_p50_us: median_of(runs, |run| run.busy.p50_us),
        busy_p99_us,
        busy_p999_us: median_of(runs, |run| run.busy.p999_us),
        idle_p50_us: median_of(runs, |run| run.idle.p50_us),
        idle_p99_us,
        idle_p999_us: median_of(runs, |run| run.idle.p999_us),
        busy_to_idle_p99: busy_p99_us as f64 / idle_p99_us.max(1) as f64,
    }
}

async fn measure_async(arguments: &CleanerLatencyArgs) -> anyhow::Result<CleanerLatencyReport> {
    let directory = arguments
        .directory
        .clone()
        .unwrap_or_else(std::env::temp_dir);
    let usable = usable_bytes(arguments, &directory, arguments.pool_size + METADATA_BYTES).await?;
    let volume_blocks =
        support::saturating_u64((usable as f64 * arguments.live).floor()) / BLOCK_SIZE_BYTES;
    let mut runs = Vec::new();
    for run in 1..=arguments.runs {
        let measured = one_run(arguments, &directory, volume_blocks).await?;
        eprintln!(
            "run {run}: saturation {:.0} requests/s, offered {:.0}/s",
            measured.saturation_per_second, measured.offered_per_second
        );
        runs.push(measured);
    }
    Ok(CleanerLatencyReport {
        pool_size_bytes: arguments.pool_size,
        live: arguments.live,
        volume_bytes: volume_blocks * BLOCK_SIZE_BYTES,
        seconds: arguments.seconds,
        read_percent: READ_PERCENT,
        load_fraction: LOAD_FRACTION,
        medians: medians(&runs),
        runs,
    })
}

/// Measures and returns the report (the CLI prints it; tests inspect it).
pub fn measure(arguments: &CleanerLatencyArgs) -> anyhow::Result<CleanerLatencyReport> {
    anyhow::ensure!(
        arguments.live > 0.0 && arguments.live < 1.0,
        "--live {} is not a fraction strictly between 0 and 1",
        arguments.live
    );
    runtime(core_count())?.block_on(measure_async(arguments))
}

fn window_line(label: &str, window: &Window) -> String {
    format!(
        "  {label:<5} p50 {:>7} us  p99 {:>7} us  p99.9 {:>7} us  ({} requests, {} overload, {} blocks relocated, WA {:.2})\n",
        window.p50_us,
        window.p99_us,
        window.p999_us,
        window.completed,
        window.overloaded,
        window.relocated_blocks,
        window.write_amplification
    )
}

impl CleanerLatencyReport {
    /// The human-readable report: every run, then the medians.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{}/{} read/write, 4 KiB random, open-loop at {:.0}% of saturation, {} s windows; volume {} MiB; busy pool {} MiB ({:.0}% live), idle pool large enough not to clean\n",
            self.read_percent,
            100 - self.read_percent,
            self.load_fraction * 100.0,
            self.seconds,
            self.volume_bytes >> 20,
            self.pool_size_bytes >> 20,
            self.live * 100.0
        );
        for (index, run) in self.runs.iter().enumerate() {
            out.push_str(&format!(
                "run {}: saturation {:.0} requests/s, offered {:.0}/s\n",
                index + 1,
                run.saturation_per_second,
                run.offered_per_second
            ));
            out.push_str(&window_line("busy", &run.busy));
            out.push_str(&window_line("idle", &run.idle));
        }
        let medians = &self.medians;
        out.push_str(&format!(
            "median of {} runs (offered {}/s): busy p50 {} p99 {} p99.9 {} us; idle p50 {} p99 {} p99.9 {} us; p99 busy/idle {:.2}\n",
            self.runs.len(),
            medians.offered_per_second,
            medians.busy_p50_us,
            medians.busy_p99_us,
            medians.busy_p999_us,
            medians.idle_p50_us,
            medians.idle_p99_us,
            medians.idle_p999_us,
            medians.busy_to_idle_p99
        ));
        out
    }
}

fn main() -> anyhow::Result<()> {
    let arguments = CleanerLatencyArgs::parse();
    let report = measure(&arguments)?;
    support::print_report(&report, &report.table(), arguments.json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleaner_latency_reports_busy_and_idle_windows() {
        let directory = tempfile::tempdir().unwrap();
        let directory_text = directory.path().display().to_string();
        let arguments = CleanerLatencyArgs::try_parse_from([
            "cleaner_latency",
            "--pool-size",
            "256M",
            "--live",
            "0.5",
            "--seconds",
            "1",
            "--saturation-seconds",
            "1",
            "--runs",
            "1",
            "--directory",
            &directory_text,
        ])
        .expect("parses");
        let report = measure(&arguments).expect("measures");
        let table = report.table();
        assert!(table.contains("  busy  p50"), "{table}");
        assert!(table.contains("p99 busy/idle"), "{table}");
        let document = support::json_with(&report, &["volume_bytes", "runs", "medians"]);
        let run = &document["runs"][0];
        assert!(run["idle"]["completed"].as_u64().unwrap() > 0);
        assert_eq!(
            run["idle"]["relocated_blocks"], 0,
            "the idle pool never cleans"
        );
        assert!(document["medians"]["busy_to_idle_p99"].is_f64());
        assert_eq!(
            std::fs::read_dir(directory.path()).unwrap().count(),
            0,
            "the pool files are removed"
        );
    }
}
