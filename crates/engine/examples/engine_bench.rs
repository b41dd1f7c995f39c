//! In-process benchmarks of the storage engine on a real file (FileDevice:
//! io_uring, O_DIRECT), each figure measured side by side with a peer in the same
//! invocation, because absolute numbers on a shared machine are noise:
//!
//! (a) 4 KiB random write and random read IOPS at queue depth 32 (32 concurrent
//!     tasks on one volume) against `fio --ioengine=io_uring --direct=1` on a
//!     separate, fully written file of the same size; runs alternate engine and
//!     fio, three of each, and the medians and their ratio are printed. The
//!     engine's memory block cache is off (fio runs with --direct=1). The
//!     engine's run ends with a flush, inside the timed window, because it
//!     acknowledges writes from memory.
//! (b) recovery time: a 4 GiB volume filled with random-order 4 KiB writes (every
//!     block once), a final flush (so the data is durable and must be recovered),
//!     then `abandon()` (no clean shutdown) and the wall time of `Pool::open` with
//!     default limits; a clean close and reopen is timed for comparison.
//! (c) memory per mapped block: a volume of N blocks fully written, its first
//!     quarter in random order and then the rest in random order, with VmRSS
//!     sampled after each; the growth between the two samples over the blocks
//!     written between them excludes fixed buffers (in-flight batches, the open
//!     batch, allocator arenas), which the first quarter has already grown. The
//!     memory block cache is off, so that only the map grows.
//!
//! Usage: `cargo run --release -p lamina-engine --example engine_bench -- PATH
//! SIZE SECONDS [PHASES] [MEMORY_BLOCKS]`, with SIZE in bytes or with a K/M/G
//! suffix (at least 5G for phase b), PHASES a subset of `abc` (default all), and
//! MEMORY_BLOCKS the N of phase c (default 262144). PATH and PATH.fio are created
//! and removed. `RUST_LOG=lamina_engine=info` shows the engine's recovery log.

// This example is moving into `lamina bench` on another branch; until then it
// keeps its `as` casts (issue 17 converts the library and binaries).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lamina_device::{FileDevice, FileDeviceOptions};
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits, PoolOptions};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Concurrent requests in the IOPS phase, for the engine and for fio.
const QUEUE_DEPTH: usize = 32;
/// Repetitions of each IOPS measurement; the median is reported.
const REPETITIONS: usize = 3;
/// Bytes the recovery phase writes (its volume's size).
const RECOVERY_FILL_BYTES: u64 = 4 << 30;
/// Size of the writes that lay out files and fill volumes sequentially.
const FILL_WRITE_BYTES: usize = 1 << 20;
/// Concurrent writers when filling a volume in random order.
const FILL_WRITERS: usize = 32;

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn parse_size(text: &str) -> BenchResult<u64> {
    let (digits, multiplier) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 1 << 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 1 << 30),
        Some('T' | 't') => (&text[..text.len() - 1], 1 << 40),
        _ => (text, 1),
    };
    Ok(digits.parse::<u64>()? * multiplier)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|field| field.parse().ok())
        .expect("VmRSS value");
    kib * 1024
}

/// Writes `size_bytes` of non-zero data to `path`, so that neither the engine
/// nor fio runs on sparse or unwritten extents.
fn lay_out(path: &Path, size_bytes: u64) -> BenchResult<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    let mut chunk = vec![0u8; FILL_WRITE_BYTES];
    SmallRng::seed_from_u64(99).fill(&mut chunk[..]);
    let mut written = 0;
    while written < size_bytes {
        let length = (size_bytes - written).min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..length])?;
        written += length as u64;
    }
    file.sync_all()?;
    Ok(())
}

fn open_device(path: &Path) -> BenchResult<Arc<FileDevice>> {
    let device = FileDevice::open(path, FileDeviceOptions::default())?;
    Ok(Arc::new(device))
}

async fn create_pool(path: &Path, limits: PoolLimits) -> BenchResult<Pool> {
    let device = open_device(path)?;
    let options = PoolOptions {
        force: true,
        ..PoolOptions::default()
    };
    Ok(Pool::create(device, options, limits).await?)
}

/// Fills `size_bytes` of a volume sequentially and flushes.
async fn fill_sequentially(pool: &Pool, volume_id: u32, size_bytes: u64) -> BenchResult<()> {
    let mut chunk = vec![0u8; FILL_WRITE_BYTES];
    SmallRng::seed_from_u64(7).fill(&mut chunk[..]);
    let mut offset = 0;
    while offset < size_bytes {
        let length = (size_bytes - offset).min(chunk.len() as u64) as usize;
        pool.write(volume_id, offset, &chunk[..length], false)
            .await?;
        offset += length as u64;
    }
    pool.flush().await?;
    Ok(())
}

/// Writes every block in `blocks` once, in the given order, from
/// [`FILL_WRITERS`] concurrent tasks.
async fn write_blocks(pool: &Pool, volume_id: u32, blocks: Arc<Vec<u64>>) -> BenchResult<()> {
    let mut tasks = Vec::new();
    for writer in 0..FILL_WRITERS {
        let pool = pool.clone();
        let blocks = blocks.clone();
        tasks.push(tokio::spawn(async move {
            let mut data = vec![0u8; BLOCK_SIZE_BYTES as usize];
            let mut rng = SmallRng::seed_from_u64(writer as u64);
            for block in blocks.iter().skip(writer).step_by(FILL_WRITERS) {
                rng.fill(&mut data[..64]);
                pool.write(volume_id, block * BLOCK_SIZE_BYTES, &data, false)
                    .await?;
            }
            Ok::<(), lamina_engine::EngineError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

fn shuffled_blocks(block_count: u64, seed: u64) -> Vec<u64> {
    let mut blocks: Vec<u64> = (0..block_count).collect();
    blocks.shuffle(&mut SmallRng::seed_from_u64(seed));
    blocks
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    RandomRead,
    RandomWrite,
}

impl Pattern {
    fn fio_name(self) -> &'static str {
        match self {
            Pattern::RandomRead => "randread",
            Pattern::RandomWrite => "randwrite",
        }
    }
}

struct Measurement {
    iops: f64,
    p50_us: f64,
    p99_us: f64,
}

/// QUEUE_DEPTH tasks issuing 4 KiB requests at random block offsets for `seconds`.
async fn engine_run(
    pool: &Pool,
    volume_id: u32,
    block_count: u64,
    pattern: Pattern,
    seconds: u64,
) -> BenchResult<Measurement> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for task_index in 0..QUEUE_DEPTH {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(1000 + task_index as u64);
            let mut buffer = vec![0u8; BLOCK_SIZE_BYTES as usize];
            rng.fill(&mut buffer[..]);
            let mut latencies_ns: Vec<u64> = Vec::with_capacity(1 << 16);
            while Instant::now() < deadline {
                let offset = rng.random_range(0..block_count) * BLOCK_SIZE_BYTES;
                let request_started = Instant::now();
                match pattern {
                    Pattern::RandomRead => pool.read(volume_id, offset, &mut buffer).await?,
                    Pattern::RandomWrite => {
                        buffer[0] = buffer[0].wrapping_add(1);
                        pool.write(volume_id, offset, &buffer, false).await?
                    }
                }
                latencies_ns.push(request_started.elapsed().as_nanos() as u64);
            }
            Ok::<Vec<u64>, lamina_engine::EngineError>(latencies_ns)
        }));
    }
    let mut latencies_ns = Vec::new();
    for task in tasks {
        latencies_ns.extend(task.await??);
    }
    // Writes are acknowledged from memory (a volatile write cache); the flush
    // that makes them durable is part of the run, so IOPS are durable IOPS.
    pool.flush().await?;
    let elapsed = started.elapsed().as_secs_f64();
    latencies_ns.sort_unstable();
    let percentile = |fraction: f64| -> f64 {
        latencies_ns[((latencies_ns.len() - 1) as f64 * fraction) as usize] as f64 / 1000.0
    };
    Ok(Measurement {
        iops: latencies_ns.len() as f64 / elapsed,
        p50_us: percentile(0.5),
        p99_us: percentile(0.99),
    })
}

fn fio_command(path: &Path, size_bytes: u64, pattern: Pattern, seconds: u64) -> Command {
    let mut command = Command::new("fio");
    command.args([
        "--name=peer",
        "--ioengine=io_uring",
        "--direct=1",
        "--bs=4k",
        &format!("--iodepth={QUEUE_DEPTH}"),
        &format!("--rw={}", pattern.fio_name()),
        &format!("--filename={}", path.display()),
        &format!("--size={size_bytes}"),
        &format!("--runtime={seconds}"),
        "--time_based",
        "--randrepeat=0",
        "--output-format=json",
    ]);
    command
}

fn fio_run(
    path: &Path,
    size_bytes: u64,
    pattern: Pattern,
    seconds: u64,
) -> BenchResult<Measurement> {
    let output = fio_command(path, size_bytes, pattern, seconds).output()?;
    if !output.status.success() {
        return Err(format!("fio failed: {}", String::from_utf8_lossy(&output.stderr)).into());
    }
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let side = match pattern {
        Pattern::RandomRead => "read",
        Pattern::RandomWrite => "write",
    };
    let job = &report["jobs"][0][side];
    let percentile = |key: &str| {
        job["clat_ns"]["percentile"][key]
            .as_f64()
            .unwrap_or(f64::NAN)
            / 1000.0
    };
    Ok(Measurement {
        iops: job["iops"].as_f64().ok_or("fio report without iops")?,
        p50_us: percentile("50.000000"),
        p99_us: percentile("99.000000"),
    })
}

async fn phase_iops(
    path: &Path,
    fio_path: &Path,
    size_bytes: u64,
    seconds: u64,
) -> BenchResult<()> {
    let volume_bytes = (size_bytes / 4) / (1 << 20) * (1 << 20);
    let block_count = volume_bytes / BLOCK_SIZE_BYTES;
    println!(
        "== (a) 4 KiB random IOPS, queue depth {QUEUE_DEPTH}, volume/fio size {} MiB, {seconds} s per run, median of {REPETITIONS}",
        volume_bytes >> 20
    );
    println!(
        "fio: {:?}",
        fio_command(fio_path, volume_bytes, Pattern::RandomRead, seconds)
            .get_args()
            .collect::<Vec<_>>()
    );
    lay_out(fio_path, size_bytes)?;
    for pattern in [Pattern::RandomWrite, Pattern::RandomRead] {
        let mut engine_iops = Vec::new();
        let mut fio_iops = Vec::new();
        for repetition in 0..REPETITIONS {
            // A fresh pool per run, so that every write run starts with the same free space.
            // The memory block cache is off, so that reads reach the device as
            // fio's do with --direct=1.
            let limits = PoolLimits {
                memory_cache_bytes: 0,
                ..PoolLimits::default()
            };
            let pool = create_pool(path, limits).await?;
            let volume_id = pool.create_volume("bench", volume_bytes).await?.volume_id;
            fill_sequentially(&pool, volume_id, volume_bytes).await?;
            let engine = engine_run(&pool, volume_id, block_count, pattern, seconds).await?;
            pool.close().await?;
            drop(pool);
            let peer = fio_run(fio_path, volume_bytes, pattern, seconds)?;
            println!(
                "{:9} run {repetition}: engine {:8.0} IOPS (p50 {:7.0} us, p99 {:7.0} us)   fio {:8.0} IOPS (p50 {:7.0} us, p99 {:7.0} us)   ratio {:.2}",
                pattern.fio_name(),
                engine.iops,
                engine.p50_us,
                engine.p99_us,
                peer.iops,
                peer.p50_us,
                peer.p99_us,
                engine.iops / peer.iops
            );
            engine_iops.push(engine.iops);
            fio_iops.push(peer.iops);
        }
        let engine_median = median(&mut engine_iops);
        let fio_median = median(&mut fio_iops);
        println!(
            "{:9} median: engine {engine_median:.0} IOPS, fio {fio_median:.0} IOPS, engine/fio {:.2}",
            pattern.fio_name(),
            engine_median / fio_median
        );
    }
    std::fs::remove_file(fio_path)?;
    Ok(())
}

async fn phase_recovery(path: &Path) -> BenchResult<()> {
    println!(
        "== (b) recovery after a crash: 4 GiB volume filled with random-order 4 KiB writes, default limits"
    );
    let pool = create_pool(path, PoolLimits::default()).await?;
    let volume_id = pool
        .create_volume("recovery", RECOVERY_FILL_BYTES)
        .await?
        .volume_id;
    let blocks = Arc::new(shuffled_blocks(RECOVERY_FILL_BYTES / BLOCK_SIZE_BYTES, 5));
    let started = Instant::now();
    write_blocks(&pool, volume_id, blocks).await?;
    pool.flush().await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    let status = pool.status();
    println!(
        "filled in {fill_seconds:.1} s ({:.0} writes/s); checkpoints taken {}, device bytes written {} MiB",
        (RECOVERY_FILL_BYTES / BLOCK_SIZE_BYTES) as f64 / fill_seconds,
        status.checkpoint_sequence,
        status.device_bytes_written >> 20
    );
    pool.abandon();
    drop(pool);
    // Let background tasks notice the abandonment and release the device.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let started = Instant::now();
    let pool = Pool::open(open_device(path)?, PoolLimits::default()).await?;
    let crash_open = started.elapsed();
    let info = pool.volume_info("recovery")?;
    assert_eq!(
        info.allocated_bytes, RECOVERY_FILL_BYTES,
        "every block recovered"
    );
    println!(
        "Pool::open after a crash: {:.3} s (includes the two checkpoints recovery writes)",
        crash_open.as_secs_f64()
    );
    pool.close().await?;
    drop(pool);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut clean = Vec::new();
    for _ in 0..REPETITIONS {
        let started = Instant::now();
        let pool = Pool::open(open_device(path)?, PoolLimits::default()).await?;
        clean.push(started.elapsed().as_secs_f64());
        pool.abandon();
        drop(pool);
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    println!(
        "Pool::open after a clean close: median {:.3} s of {REPETITIONS}",
        median(&mut clean)
    );
    Ok(())
}

async fn phase_memory(path: &Path, block_count: u64) -> BenchResult<()> {
    println!(
        "== (c) memory per mapped block: {block_count} blocks ({} MiB) written in random order, background checkpoints off",
        (block_count * BLOCK_SIZE_BYTES) >> 20
    );
    let limits = PoolLimits {
        // The block cache would be counted as map memory.
        memory_cache_bytes: 0,
        checkpoint_interval_bytes: u64::MAX / 2,
        checkpoint_interval_ms: 3_600_000_000,
        ..PoolLimits::default()
    };
    let pool = create_pool(path, limits).await?;
    let volume_id = pool
        .create_volume("memory", block_count * BLOCK_SIZE_BYTES)
        .await?
        .volume_id;
    // The first quarter of the volume, then the rest, each in random order, so
    // that map chunks are allocated in proportion to the blocks written.
    let quarter = (block_count / 4) as usize;
    let mut first: Vec<u64> = (0..quarter as u64).collect();
    let mut rest: Vec<u64> = (quarter as u64..block_count).collect();
    first.shuffle(&mut SmallRng::seed_from_u64(6));
    rest.shuffle(&mut SmallRng::seed_from_u64(7));
    let rss_start = rss_bytes();
    write_blocks(&pool, volume_id, Arc::new(first)).await?;
    pool.flush().await?;
    let rss_quarter = rss_bytes();
    write_blocks(&pool, volume_id, Arc::new(rest)).await?;
    pool.flush().await?;
    let rss_end = rss_bytes();
    let later_blocks = block_count - quarter as u64;
    println!(
        "VmRSS: start {} MiB, after {quarter} blocks {} MiB, after {block_count} blocks {} MiB",
        rss_start >> 20,
        rss_quarter >> 20,
        rss_end >> 20
    );
    println!(
        "bytes per mapped block: {:.1} (growth between the quarter and the end), {:.1} (whole fill, includes fixed buffers)",
        (rss_end.saturating_sub(rss_quarter)) as f64 / later_blocks as f64,
        (rss_end.saturating_sub(rss_start)) as f64 / block_count as f64
    );
    pool.abandon();
    Ok(())
}

#[tokio::main]
async fn main() -> BenchResult<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let arguments: Vec<String> = std::env::args().collect();
    if arguments.len() < 4 {
        return Err("usage: engine_bench PATH SIZE SECONDS [PHASES] [MEMORY_BLOCKS]".into());
    }
    let path = PathBuf::from(&arguments[1]);
    let size_bytes = parse_size(&arguments[2])? / (1 << 20) * (1 << 20);
    let seconds: u64 = arguments[3].parse()?;
    let phases = arguments.get(4).map_or("abc", String::as_str);
    let memory_blocks: u64 = match arguments.get(5) {
        Some(text) => text.parse()?,
        None => 1 << 18,
    };
    let fio_path = PathBuf::from(format!("{}.fio", path.display()));
    println!(
        "engine_bench: {} ({} MiB), peer file {}, {} cores",
        path.display(),
        size_bytes >> 20,
        fio_path.display(),
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    lay_out(&path, size_bytes)?;
    let backend = open_device(&path)?.backend();
    println!("engine device backend: {backend:?}");
    if phases.contains('a') {
        phase_iops(&path, &fio_path, size_bytes, seconds).await?;
    }
    if phases.contains('b') {
        if size_bytes < RECOVERY_FILL_BYTES + RECOVERY_FILL_BYTES / 8 {
            return Err("phase b needs SIZE of at least 4.5 GiB (5G)".into());
        }
        phase_recovery(&path).await?;
    }
    if phases.contains('c') {
        phase_memory(&path, memory_blocks).await?;
    }
    std::fs::remove_file(&path)?;
    Ok(())
}
