//! IOPS, recovery and memory (`cargo run --release -p lamina-engine --example
//! iops_recovery_memory --`, formerly `lamina bench engine`; decision 0060):
//! in-process benchmarks of the storage engine on a real file (FileDevice: io_uring,
//! O_DIRECT), each figure measured side by side with a peer in the same invocation,
//! because absolute numbers on a shared machine are noise:
//!
//! (a) 4 KiB random write and random read IOPS at queue depth 32 (32 concurrent tasks
//!     on one volume) against `fio --ioengine=io_uring --direct=1` on a separate,
//!     fully written file of the same size; runs alternate engine and fio, three of
//!     each, and the medians and their ratio are reported. The engine's memory block
//!     cache is off (fio runs with --direct=1). The engine's run ends with a flush,
//!     inside the timed window, because it acknowledges writes from memory.
//! (b) recovery time: a 4 GiB volume filled with random-order 4 KiB writes (every
//!     block once), a final flush (so the data is durable and must be recovered),
//!     then `abandon()` (no clean shutdown) and the wall time of `Pool::open` with
//!     default limits; a clean close and reopen is timed for comparison.
//! (c) memory per mapped block: a volume of N blocks fully written, its first quarter
//!     in random order and then the rest in random order, with VmRSS sampled after
//!     each; the growth between the two samples over the blocks written between them
//!     excludes fixed buffers (in-flight batches, the open batch, allocator arenas),
//!     which the first quarter has already grown. The memory block cache is off, so
//!     that only the map grows.
//!
//! `--path PATH` and `PATH.fio` are created and removed. `LAMINA_LOG=lamina_engine=info`
//! shows the engine's recovery log.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::Parser;
use lamina_api::size::parse_size;
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

mod support;
// fio on a file is the device example's peer too; an example cannot use another
// crate's example modules, so the one file is included by path.
#[path = "../../device/examples/support/fio_file.rs"]
mod fio_file;

use fio_file::{FileMeasurement, FileRun, RandomPattern, file_arguments, run_on_file};
use support::pool_files::FILL_WRITE_BYTES;
use support::{
    core_count, create_pool, fill_sequentially, median, open_file_device, percentile_of_sorted,
    runtime, write_blocks,
};

/// Concurrent requests in the IOPS phase, for the engine and for fio.
const QUEUE_DEPTH: usize = 32;
/// Repetitions of each IOPS measurement and of the clean reopen; the median is reported.
const REPETITIONS: usize = 3;
/// Bytes the recovery phase writes (its volume's size).
const RECOVERY_FILL_BYTES: u64 = 4 << 30;
/// Smallest pool file of the recovery phase: its volume and room for its metadata.
const RECOVERY_DEVICE_BYTES_MIN: u64 = RECOVERY_FILL_BYTES + RECOVERY_FILL_BYTES / 8;
/// How long an abandoned pool's background tasks get to release the device.
const RELEASE_WAIT_MS: u64 = 1500;

/// Errors in the arguments of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum EngineBenchError {
    #[error("phase b needs --size of at least 4.5 GiB (5G), not {size_bytes} bytes")]
    TooSmallForRecovery { size_bytes: u64 },
    #[error("--phases {phases:?} names no phase (a, b or c)")]
    NoPhase { phases: String },
}

/// In process on a file: 4 KiB IOPS against fio, recovery time, memory per block.
#[derive(Debug, Clone, Parser)]
pub struct EngineArgs {
    /// The pool file (created and removed); fio's peer file is PATH.fio.
    #[arg(long)]
    pub path: PathBuf,
    /// Size of the pool file and of fio's file (e.g. 5G; at least 5G for phase b).
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Seconds per IOPS run of phase a.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Phases to run, a subset of `abc`: a IOPS, b recovery, c memory per block.
    #[arg(long, default_value = "abc")]
    pub phases: String,
    /// Blocks written in phase c.
    #[arg(long, default_value_t = 1 << 18, value_parser = clap::value_parser!(u64).range(4..))]
    pub memory_blocks: u64,
    /// The fio program.
    #[arg(long, default_value = "fio")]
    pub fio: String,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One engine run and one fio run of phase a.
#[derive(Debug, Clone, Serialize)]
pub struct IopsRun {
    pub pattern: RandomPattern,
    pub engine: FileMeasurement,
    pub fio: FileMeasurement,
}

/// The medians of one pattern in phase a.
#[derive(Debug, Clone, Serialize)]
pub struct IopsMedian {
    pub pattern: RandomPattern,
    pub engine_iops: f64,
    pub fio_iops: f64,
    pub engine_to_fio: f64,
}

/// Phase a.
#[derive(Debug, Clone, Serialize)]
pub struct IopsPhase {
    pub volume_bytes: u64,
    pub queue_depth: usize,
    pub seconds: u64,
    pub fio_arguments: Vec<String>,
    pub runs: Vec<IopsRun>,
    pub medians: Vec<IopsMedian>,
}

/// Phase b.
#[derive(Debug, Clone, Serialize)]
pub struct RecoveryPhase {
    pub fill_bytes: u64,
    pub fill_seconds: f64,
    pub checkpoint_sequence: u64,
    pub device_bytes_written: u64,
    /// `Pool::open` after `abandon()`, including the checkpoints recovery writes.
    pub open_after_crash_seconds: f64,
    /// The median `Pool::open` after a clean close.
    pub open_after_clean_close_seconds: f64,
}

/// Phase c.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPhase {
    pub block_count: u64,
    pub quarter_block_count: u64,
    pub resident_start_bytes: u64,
    pub resident_quarter_bytes: u64,
    pub resident_end_bytes: u64,
    /// Growth between the quarter and the end over the blocks written in between.
    pub bytes_per_mapped_block: f64,
    /// Growth over the whole fill (includes fixed buffers).
    pub bytes_per_block_whole_fill: f64,
}

/// What the benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct EngineReport {
    pub path: PathBuf,
    pub size_bytes: u64,
    pub cores: usize,
    pub device_backend: String,
    pub iops: Option<IopsPhase>,
    pub recovery: Option<RecoveryPhase>,
    pub memory: Option<MemoryPhase>,
}

/// QUEUE_DEPTH tasks issuing 4 KiB requests at random block offsets for `seconds`.
async fn engine_run(
    pool: &Pool,
    volume_id: u32,
    block_count: u64,
    pattern: RandomPattern,
    seconds: u64,
) -> anyhow::Result<FileMeasurement> {
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for task_index in 0..QUEUE_DEPTH {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(1000 + task_index as u64);
            let mut buffer = vec![0u8; lamina_engine::BLOCK_BYTES];
            rng.fill(&mut buffer[..]);
            let mut latencies_ns: Vec<u64> = Vec::with_capacity(1 << 16);
            while Instant::now() < deadline {
                let offset = rng.random_range(0..block_count) * BLOCK_SIZE_BYTES;
                let request_started = Instant::now();
                match pattern {
                    RandomPattern::RandomRead => pool.read(volume_id, offset, &mut buffer).await?,
                    RandomPattern::RandomWrite => {
                        buffer[0] = buffer[0].wrapping_add(1);
                        pool.write(volume_id, offset, &buffer, false).await?
                    }
                }
                latencies_ns.push(u64::try_from(request_started.elapsed().as_nanos())?);
            }
            anyhow::Ok(latencies_ns)
        }));
    }
    let mut latencies_ns = Vec::new();
    for task in tasks {
        latencies_ns.extend(task.await??);
    }
    // Writes are acknowledged from memory (a volatile write cache); the flush that
    // makes them durable is part of the run, so IOPS are durable IOPS.
    pool.flush().await?;
    let elapsed = started.elapsed().as_secs_f64();
    latencies_ns.sort_unstable();
    let percentile_us = |percentile: f64| {
        percentile_of_sorted(&latencies_ns, percentile).map_or(f64::NAN, |value| value as f64 / 1e3)
    };
    Ok(FileMeasurement {
        iops: latencies_ns.len() as f64 / elapsed,
        p50_us: percentile_us(50.0),
        p99_us: percentile_us(99.0),
    })
}

/// One repetition of phase a: a fresh pool (so every write run starts with the same
/// free space) measured, closed, then fio on its own file.
async fn iops_repetition(
    arguments: &EngineArgs,
    fio_path: &Path,
    volume_bytes: u64,
    pattern: RandomPattern,
) -> anyhow::Result<IopsRun> {
    // The memory block cache is off, so that reads reach the device as fio's do
    // with --direct=1.
    let limits = PoolLimits {
        memory_cache_bytes: 0,
        ..PoolLimits::default()
    };
    let pool = create_pool(open_file_device(&arguments.path, None)?, limits).await?;
    let volume_id = pool.create_volume("bench", volume_bytes).await?.volume_id;
    fill_sequentially(&pool, volume_id, volume_bytes, 7).await?;
    let block_count = volume_bytes / BLOCK_SIZE_BYTES;
    let engine = engine_run(&pool, volume_id, block_count, pattern, arguments.seconds).await?;
    pool.close().await?;
    drop(pool);
    let fio = run_on_file(
        &arguments.fio,
        &FileRun {
            path: fio_path,
            size_bytes: volume_bytes,
            pattern,
            iodepth: QUEUE_DEPTH,
            seconds: arguments.seconds,
        },
    )?;
    Ok(IopsRun {
        pattern,
        engine,
        fio,
    })
}

async fn phase_iops(arguments: &EngineArgs, fio_path: &Path) -> anyhow::Result<IopsPhase> {
    let volume_bytes = (arguments.size / 4) / (1 << 20) * (1 << 20);
    eprintln!(
        "(a) 4 KiB random IOPS, queue depth {QUEUE_DEPTH}, volume/fio size {} MiB, {} s per run, median of {REPETITIONS}",
        volume_bytes >> 20,
        arguments.seconds
    );
    lay_out(fio_path, arguments.size)?;
    let mut runs = Vec::new();
    let mut medians = Vec::new();
    for pattern in [RandomPattern::RandomWrite, RandomPattern::RandomRead] {
        let mut engine_iops = Vec::new();
        let mut fio_iops = Vec::new();
        for repetition in 0..REPETITIONS {
            let run = iops_repetition(arguments, fio_path, volume_bytes, pattern).await?;
            eprintln!("{}", iops_run_line(repetition, &run));
            engine_iops.push(run.engine.iops);
            fio_iops.push(run.fio.iops);
            runs.push(run);
        }
        let (engine_iops, fio_iops) = (median(&engine_iops), median(&fio_iops));
        medians.push(IopsMedian {
            pattern,
            engine_iops,
            fio_iops,
            engine_to_fio: engine_iops / fio_iops,
        });
    }
    std::fs::remove_file(fio_path)?;
    Ok(IopsPhase {
        volume_bytes,
        queue_depth: QUEUE_DEPTH,
        seconds: arguments.seconds,
        fio_arguments: file_arguments(&FileRun {
            path: fio_path,
            size_bytes: volume_bytes,
            pattern: RandomPattern::RandomRead,
            iodepth: QUEUE_DEPTH,
            seconds: arguments.seconds,
        }),
        runs,
        medians,
    })
}

/// Writes `size_bytes` of non-zero data to `path`, so that neither the engine nor
/// fio runs on sparse or unwritten extents.
fn lay_out(path: &Path, size_bytes: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    let mut chunk = vec![0u8; FILL_WRITE_BYTES];
    SmallRng::seed_from_u64(99).fill(&mut chunk[..]);
    let mut written = 0;
    while written < size_bytes {
        let length = usize::try_from((size_bytes - written).min(FILL_WRITE_BYTES as u64))?;
        file.write_all(&chunk[..length])?;
        written += length as u64;
    }
    file.sync_all()?;
    Ok(())
}

fn shuffled(blocks: std::ops::Range<u64>, seed: u64) -> Vec<u64> {
    let mut blocks: Vec<u64> = blocks.collect();
    blocks.shuffle(&mut SmallRng::seed_from_u64(seed));
    blocks
}

async fn phase_recovery(path: &Path) -> anyhow::Result<RecoveryPhase> {
    eprintln!("(b) recovery after a crash: 4 GiB volume filled with random-order 4 KiB writes");
    let pool = create_pool(open_file_device(path, None)?, PoolLimits::default()).await?;
    let volume_id = pool
        .create_volume("recovery", RECOVERY_FILL_BYTES)
        .await?
        .volume_id;
    let started = Instant::now();
    write_blocks(
        &pool,
        volume_id,
        shuffled(0..RECOVERY_FILL_BYTES / BLOCK_SIZE_BYTES, 5),
    )
    .await?;
    pool.flush().await?;
    let fill_seconds = started.elapsed().as_secs_f64();
    let status = pool.status();
    pool.abandon();
    drop(pool);
    let release_wait = Duration::from_millis(RELEASE_WAIT_MS);
    // Let background tasks notice the abandonment and release the device.
    tokio::time::sleep(release_wait).await;
    let started = Instant::now();
    let pool = Pool::open(open_file_device(path, None)?, PoolLimits::default()).await?;
    let open_after_crash_seconds = started.elapsed().as_secs_f64();
    let info = pool.volume_info("recovery")?;
    assert_eq!(
        info.allocated_bytes, RECOVERY_FILL_BYTES,
        "every block recovered"
    );
    pool.close().await?;
    drop(pool);
    tokio::time::sleep(release_wait).await;
    let mut clean = Vec::new();
    for _ in 0..REPETITIONS {
        let started = Instant::now();
        let pool = Pool::open(open_file_device(path, None)?, PoolLimits::default()).await?;
        clean.push(started.elapsed().as_secs_f64());
        pool.abandon();
        drop(pool);
        tokio::time::sleep(release_wait).await;
    }
    Ok(RecoveryPhase {
        fill_bytes: RECOVERY_FILL_BYTES,
        fill_seconds,
        checkpoint_sequence: status.checkpoint_sequence,
        device_bytes_written: status.device_bytes_written,
        open_after_crash_seconds,
        open_after_clean_close_seconds: median(&clean),
    })
}

async fn phase_memory(path: &Path, block_count: u64) -> anyhow::Result<MemoryPhase> {
    eprintln!("(c) memory per mapped block: {block_count} blocks written in random order");
    let limits = PoolLimits {
        // The block cache would be counted as map memory.
        memory_cache_bytes: 0,
        checkpoint_interval_bytes: u64::MAX / 2,
        checkpoint_interval_ms: 3_600_000_000,
        ..PoolLimits::default()
    };
    let pool = create_pool(open_file_device(path, None)?, limits).await?;
    let volume_id = pool
        .create_volume("memory", block_count * BLOCK_SIZE_BYTES)
        .await?
        .volume_id;
    // The first quarter of the volume, then the rest, each in random order, so that
    // map chunks are allocated in proportion to the blocks written.
    let quarter = block_count / 4;
    let resident_start_bytes = resident_bytes()?;
    write_blocks(&pool, volume_id, shuffled(0..quarter, 6)).await?;
    pool.flush().await?;
    let resident_quarter_bytes = resident_bytes()?;
    write_blocks(&pool, volume_id, shuffled(quarter..block_count, 7)).await?;
    pool.flush().await?;
    let resident_end_bytes = resident_bytes()?;
    pool.abandon();
    Ok(MemoryPhase {
        block_count,
        quarter_block_count: quarter,
        resident_start_bytes,
        resident_quarter_bytes,
        resident_end_bytes,
        bytes_per_mapped_block: resident_end_bytes.saturating_sub(resident_quarter_bytes) as f64
            / (block_count - quarter) as f64,
        bytes_per_block_whole_fill: resident_end_bytes.saturating_sub(resident_start_bytes) as f64
            / block_count as f64,
    })
}

async fn measure_phases(arguments: &EngineArgs, report: &mut EngineReport) -> anyhow::Result<()> {
    let fio_path = PathBuf::from(format!("{}.fio", arguments.path.display()));
    if arguments.phases.contains('a') {
        report.iops = Some(phase_iops(arguments, &fio_path).await?);
    }
    if arguments.phases.contains('b') {
        report.recovery = Some(phase_recovery(&arguments.path).await?);
    }
    if arguments.phases.contains('c') {
        report.memory = Some(phase_memory(&arguments.path, arguments.memory_blocks).await?);
    }
    Ok(())
}

/// Measures the phases asked for and returns the report (the CLI prints it; tests
/// inspect it).
pub fn measure(arguments: &EngineArgs) -> anyhow::Result<EngineReport> {
    if !arguments.phases.chars().any(|phase| "abc".contains(phase)) {
        return Err(EngineBenchError::NoPhase {
            phases: arguments.phases.clone(),
        }
        .into());
    }
    let size_bytes = arguments.size / (1 << 20) * (1 << 20);
    if arguments.phases.contains('b') && size_bytes < RECOVERY_DEVICE_BYTES_MIN {
        return Err(EngineBenchError::TooSmallForRecovery { size_bytes }.into());
    }
    let arguments = EngineArgs {
        size: size_bytes,
        ..arguments.clone()
    };
    lay_out(&arguments.path, size_bytes)?;
    let mut report = EngineReport {
        path: arguments.path.clone(),
        size_bytes,
        cores: core_count(),
        device_backend: format!("{:?}", open_file_device(&arguments.path, None)?.backend()),
        iops: None,
        recovery: None,
        memory: None,
    };
    let measured = runtime(core_count())?.block_on(measure_phases(&arguments, &mut report));
    std::fs::remove_file(&arguments.path)?;
    measured?;
    Ok(report)
}

fn iops_run_line(repetition: usize, run: &IopsRun) -> String {
    format!(
        "{:9} run {repetition}: engine {:8.0} IOPS (p50 {:7.0} us, p99 {:7.0} us)   fio {:8.0} IOPS (p50 {:7.0} us, p99 {:7.0} us)   ratio {:.2}",
        run.pattern.fio_name(),
        run.engine.iops,
        run.engine.p50_us,
        run.engine.p99_us,
        run.fio.iops,
        run.fio.p50_us,
        run.fio.p99_us,
        run.engine.iops / run.fio.iops
    )
}

impl EngineReport {
    /// The human-readable report, phase by phase.
    pub fn table(&self) -> String {
        let mut out = format!(
            "engine: {} ({} MiB), {} cores, device backend {}\n",
            self.path.display(),
            self.size_bytes >> 20,
            self.cores,
            self.device_backend
        );
        if let Some(iops) = &self.iops {
            out.push_str(&iops.table());
        }
        if let Some(recovery) = &self.recovery {
            out.push_str(&recovery.table());
        }
        if let Some(memory) = &self.memory {
            out.push_str(&memory.table());
        }
        out
    }
}

impl IopsPhase {
    fn table(&self) -> String {
        let mut out = format!(
            "== (a) 4 KiB random IOPS, queue depth {}, volume/fio size {} MiB, {} s per run, median of {REPETITIONS}\nfio: {}\n",
            self.queue_depth,
            self.volume_bytes >> 20,
            self.seconds,
            self.fio_arguments.join(" ")
        );
        for median in &self.medians {
            let runs = self.runs.iter().filter(|run| run.pattern == median.pattern);
            for (repetition, run) in runs.enumerate() {
                out.push_str(&iops_run_line(repetition, run));
                out.push('\n');
            }
            out.push_str(&format!(
                "{:9} median: engine {:.0} IOPS, fio {:.0} IOPS, engine/fio {:.2}\n",
                median.pattern.fio_name(),
                median.engine_iops,
                median.fio_iops,
                median.engine_to_fio
            ));
        }
        out
    }
}

impl RecoveryPhase {
    fn table(&self) -> String {
        format!(
            "== (b) recovery after a crash: {} GiB volume filled with random-order 4 KiB writes, default limits\n\
             filled in {:.1} s ({:.0} writes/s); checkpoints taken {}, device bytes written {} MiB\n\
             Pool::open after a crash: {:.3} s (includes the two checkpoints recovery writes)\n\
             Pool::open after a clean close: median {:.3} s of {REPETITIONS}\n",
            self.fill_bytes >> 30,
            self.fill_seconds,
            (self.fill_bytes / BLOCK_SIZE_BYTES) as f64 / self.fill_seconds,
            self.checkpoint_sequence,
            self.device_bytes_written >> 20,
            self.open_after_crash_seconds,
            self.open_after_clean_close_seconds
        )
    }
}

impl MemoryPhase {
    fn table(&self) -> String {
        format!(
            "== (c) memory per mapped block: {} blocks ({} MiB) written in random order, background checkpoints off\n\
             VmRSS: start {} MiB, after {} blocks {} MiB, after {} blocks {} MiB\n\
             bytes per mapped block: {:.1} (growth between the quarter and the end), {:.1} (whole fill, includes fixed buffers)\n",
            self.block_count,
            (self.block_count * BLOCK_SIZE_BYTES) >> 20,
            self.resident_start_bytes >> 20,
            self.quarter_block_count,
            self.resident_quarter_bytes >> 20,
            self.block_count,
            self.resident_end_bytes >> 20,
            self.bytes_per_mapped_block,
            self.bytes_per_block_whole_fill
        )
    }
}

/// The resident memory of this process (VmRSS), in bytes.
fn resident_bytes() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kibibytes = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|field| field.parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("/proc/self/status has no VmRSS line"))?;
    Ok(kibibytes * 1024)
}

fn main() -> anyhow::Result<()> {
    let arguments = EngineArgs::parse();
    let report = measure(&arguments)?;
    support::print_report(&report, &report.table(), arguments.json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_phase_reports_bytes_per_block() {
        // 128 MiB: the checkpoint reserve keeps a segment for every body a
        // chain of increments can hold at once (decision 0026), which leaves a
        // 64 MiB pool of 4 MiB segments no room for the 8 MiB written here.
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("engine.img");
        let path = path.to_str().unwrap();
        let arguments = EngineArgs::try_parse_from([
            "iops_recovery_memory",
            "--path",
            path,
            "--size",
            "128M",
            "--phases",
            "c",
            "--memory-blocks",
            "2048",
        ])
        .expect("parses");
        let report = measure(&arguments).expect("measures");
        let table = report.table();
        assert!(
            table.contains("== (c) memory per mapped block: 2048 blocks"),
            "{table}"
        );
        let document = support::json_with(&report, &["size_bytes", "device_backend", "memory"]);
        assert!(document["iops"].is_null() && document["recovery"].is_null());
        assert!(document["memory"]["bytes_per_mapped_block"].is_f64());
        assert!(
            !std::path::Path::new(path).exists(),
            "the pool file is removed"
        );
    }

    #[test]
    fn refuses_recovery_on_a_small_file() {
        let arguments = EngineArgs::try_parse_from([
            "iops_recovery_memory",
            "--path",
            "/nonexistent/x",
            "--size",
            "1G",
            "--phases",
            "b",
        ])
        .expect("parses");
        let error = measure(&arguments).unwrap_err();
        assert!(error.to_string().contains("at least 4.5 GiB"), "{error}");
    }
}
