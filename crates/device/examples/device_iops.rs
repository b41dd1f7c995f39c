//! Device IOPS (`cargo run --release -p lamina-device --example device_iops --`,
//! formerly `lamina bench device-iops`; decision 0060): 4 KiB random read and random
//! write IOPS at queue depth 32 through a [`FileDevice`] alone (no engine), and, with
//! `--with-fio`, fio's io_uring engine on the same file in the same run, so that the
//! result is a ratio rather than an absolute number. The file is created if missing
//! and then filled once with data, so that reads hit allocated blocks rather than
//! holes; it is left in place. Each figure is the median of the repeats; runs of
//! lamina and fio alternate so that drift hits both.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use lamina_api::size::parse_size;
use lamina_device::{AlignedBuffer, BlockDevice, FileDevice, FileDeviceOptions};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};
use serde::Serialize;

mod support;

use support::fio_file::{FileRun, RandomPattern, run_on_file};
use support::{median, runtime};

/// Requests kept in flight, as fio's `--iodepth`.
const QUEUE_DEPTH: usize = 32;
/// Bytes per request, as fio's `--bs`.
const BLOCK_BYTES: usize = 4096;
/// Size of the writes that fill the file.
const FILL_WRITE_BYTES: usize = 1 << 20;
/// Fill writes in flight at once.
const FILL_WRITES_IN_FLIGHT: usize = 8;

/// The file device alone: 4 KiB random IOPS, optionally against fio.
#[derive(Debug, Clone, Parser)]
pub struct DeviceIopsArgs {
    /// The file: created with --size and filled if missing, kept afterwards.
    #[arg(long)]
    pub path: PathBuf,
    /// Size of the file when it is created (e.g. 4G).
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// Seconds per run.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Also run fio's io_uring engine on the same file, alternating with lamina.
    #[arg(long)]
    pub with_fio: bool,
    /// Runs per pattern; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub repeats: u64,
    /// Tokio worker threads; 0 runs the workers on the main thread.
    #[arg(long, default_value_t = 0)]
    pub workers: usize,
    /// The fio program.
    #[arg(long, default_value = "fio")]
    pub fio: String,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// The runs and medians of one pattern.
#[derive(Debug, Clone, Serialize)]
pub struct PatternResult {
    pub pattern: RandomPattern,
    pub lamina_iops_runs: Vec<f64>,
    pub lamina_iops: f64,
    /// With `--with-fio` only.
    pub fio_iops_runs: Vec<f64>,
    pub fio_iops: Option<f64>,
    pub lamina_to_fio: Option<f64>,
}

/// What the device IOPS benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceIopsReport {
    pub path: PathBuf,
    pub size_bytes: u64,
    pub backend: String,
    pub queue_depth: usize,
    pub seconds: u64,
    pub repeats: u64,
    /// Seconds the initial fill took, when the file was created.
    pub fill_seconds: Option<f64>,
    pub patterns: Vec<PatternResult>,
}

/// Writes the whole device once with non-zero data and flushes it.
async fn fill(device: &Arc<FileDevice>) -> anyhow::Result<()> {
    let mut data = AlignedBuffer::zeroed(FILL_WRITE_BYTES);
    SmallRng::seed_from_u64(0).fill_bytes(&mut data);
    let data = Arc::new(data);
    let size_bytes = device.size_bytes();
    let mut offset = 0;
    while offset < size_bytes {
        let mut batch = tokio::task::JoinSet::new();
        for _ in 0..FILL_WRITES_IN_FLIGHT {
            if offset >= size_bytes {
                break;
            }
            let length = usize::try_from((size_bytes - offset).min(FILL_WRITE_BYTES as u64))?;
            let chunk = if length == FILL_WRITE_BYTES {
                data.clone()
            } else {
                Arc::new(AlignedBuffer::zeroed(length))
            };
            let device = device.clone();
            let chunk_offset = offset;
            batch.spawn(async move { device.write(chunk_offset, chunk).await });
            offset += length as u64;
        }
        while let Some(result) = batch.join_next().await {
            result??;
        }
    }
    device.flush().await?;
    Ok(())
}

/// Runs `QUEUE_DEPTH` closed-loop workers for `duration` and returns operations per
/// second.
async fn measure_lamina(
    device: &Arc<FileDevice>,
    pattern: RandomPattern,
    duration: Duration,
) -> anyhow::Result<f64> {
    let block_count = device.size_bytes() / BLOCK_BYTES as u64;
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..QUEUE_DEPTH {
        let device = device.clone();
        workers.spawn(async move {
            let mut random = SmallRng::seed_from_u64(worker as u64 + 1);
            let mut data = AlignedBuffer::zeroed(BLOCK_BYTES);
            random.fill_bytes(&mut data);
            let data = Arc::new(data);
            let mut operations: u64 = 0;
            while Instant::now() < deadline {
                let offset = random.random_range(0..block_count) * BLOCK_BYTES as u64;
                match pattern {
                    RandomPattern::RandomRead => {
                        device.read(offset, BLOCK_BYTES).await?;
                    }
                    RandomPattern::RandomWrite => device.write(offset, data.clone()).await?,
                }
                operations += 1;
            }
            anyhow::Ok(operations)
        });
    }
    let mut operations = 0;
    while let Some(result) = workers.join_next().await {
        operations += result??;
    }
    Ok(operations as f64 / started.elapsed().as_secs_f64())
}

fn measure_pattern(
    arguments: &DeviceIopsArgs,
    runtime: &tokio::runtime::Runtime,
    device: &Arc<FileDevice>,
    pattern: RandomPattern,
) -> anyhow::Result<PatternResult> {
    let duration = Duration::from_secs(arguments.seconds);
    let mut lamina = Vec::new();
    let mut fio = Vec::new();
    for _ in 0..arguments.repeats {
        lamina.push(runtime.block_on(measure_lamina(device, pattern, duration))?);
        if arguments.with_fio {
            let run = FileRun {
                path: &arguments.path,
                size_bytes: device.size_bytes(),
                pattern,
                iodepth: QUEUE_DEPTH,
                seconds: arguments.seconds,
            };
            fio.push(run_on_file(&arguments.fio, &run)?.iops);
        }
    }
    let lamina_iops = median(&lamina);
    let fio_iops = arguments.with_fio.then(|| median(&fio));
    Ok(PatternResult {
        pattern,
        lamina_iops_runs: lamina,
        lamina_iops,
        fio_iops_runs: fio,
        fio_iops,
        lamina_to_fio: fio_iops.map(|fio_iops| lamina_iops / fio_iops),
    })
}

/// Measures and returns the report (the CLI prints it; tests inspect it).
pub fn measure(arguments: &DeviceIopsArgs) -> anyhow::Result<DeviceIopsReport> {
    let runtime = runtime(arguments.workers)?;
    let existed = arguments.path.exists();
    let device = open_file_device(&arguments.path, arguments.size)?;
    let fill_seconds = if existed {
        None
    } else {
        let started = Instant::now();
        runtime.block_on(fill(&device))?;
        Some(started.elapsed().as_secs_f64())
    };
    let mut patterns = Vec::new();
    for pattern in [RandomPattern::RandomRead, RandomPattern::RandomWrite] {
        patterns.push(measure_pattern(arguments, &runtime, &device, pattern)?);
    }
    Ok(DeviceIopsReport {
        path: arguments.path.clone(),
        size_bytes: device.size_bytes(),
        backend: format!("{:?}", device.backend()),
        queue_depth: QUEUE_DEPTH,
        seconds: arguments.seconds,
        repeats: arguments.repeats,
        fill_seconds,
        patterns,
    })
}

impl DeviceIopsReport {
    /// The human-readable table, one line per pattern.
    pub fn table(&self) -> String {
        let mut out = format!(
            "device {} ({} bytes, backend {}), 4 KiB requests, queue depth {}, {} s per run, median of {}\n",
            self.path.display(),
            self.size_bytes,
            self.backend,
            self.queue_depth,
            self.seconds,
            self.repeats
        );
        if let Some(seconds) = self.fill_seconds {
            out.push_str(&format!("filled in {seconds:.1} s\n"));
        }
        for result in &self.patterns {
            out.push_str(&format!(
                "{:<9} lamina {:>9.0} IOPS {:.0?}",
                result.pattern.fio_name(),
                result.lamina_iops,
                result.lamina_iops_runs
            ));
            if let (Some(fio_iops), Some(ratio)) = (result.fio_iops, result.lamina_to_fio) {
                out.push_str(&format!(
                    "  fio {fio_iops:>9.0} IOPS {:.0?}  ratio {ratio:.2}",
                    result.fio_iops_runs
                ));
            }
            out.push('\n');
        }
        out
    }
}

/// Opens the file as a device, creating it sparse with `create_size_bytes` if it is
/// missing.
fn open_file_device(path: &Path, create_size_bytes: u64) -> anyhow::Result<Arc<FileDevice>> {
    let options = FileDeviceOptions {
        create_size_bytes: Some(create_size_bytes),
        ..FileDeviceOptions::default()
    };
    let device = FileDevice::open(path, options)
        .map_err(|error| anyhow::anyhow!("cannot open {}: {error}", path.display()))?;
    Ok(Arc::new(device))
}

fn main() -> anyhow::Result<()> {
    let arguments = DeviceIopsArgs::parse();
    let report = measure(&arguments)?;
    support::print_report(&report, &report.table(), arguments.json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_iops_reports_both_patterns() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("device.img");
        let path = path.to_str().unwrap();
        let arguments = DeviceIopsArgs::try_parse_from([
            "device_iops",
            "--path",
            path,
            "--size",
            "16M",
            "--seconds",
            "1",
            "--repeats",
            "1",
        ])
        .expect("parses");
        let report = measure(&arguments).expect("measures");
        let table = report.table();
        assert!(table.contains("randread  lamina"), "{table}");
        assert!(table.contains("filled in"), "{table}");
        let document = serde_json::to_value(&report).unwrap();
        for field in ["backend", "queue_depth", "patterns"] {
            assert!(document.get(field).is_some(), "{field} in {document}");
        }
        let patterns = document["patterns"].as_array().unwrap();
        assert_eq!(patterns.len(), 2);
        assert!(patterns[1]["lamina_iops"].as_f64().unwrap() > 0.0);
        assert!(patterns[1]["fio_iops"].is_null());
        assert!(std::path::Path::new(path).exists(), "the file is kept");
    }
}
