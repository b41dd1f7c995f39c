//! Measures 4 KiB random read and random write IOPS at queue depth 32 through a
//! [`FileDevice`], and, with `--fio`, runs fio's io_uring engine on the same file in
//! the same run so that the result is a ratio rather than an absolute number.
//!
//! Usage: `device_iops PATH SIZE SECONDS [--fio] [--repeats N] [--workers N]`, where SIZE takes a
//! K, M or G suffix. The file is created if missing and filled once with data, so
//! that reads hit allocated blocks rather than holes. Each figure is the median of
//! the repeats; runs of lamina and fio alternate so that drift hits both.

// This example is moving into `lamina bench` on another branch; until then it
// keeps its `as` casts (issue 17 converts the library and binaries).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lamina_device::{AlignedBuffer, BlockDevice, FileDevice, FileDeviceOptions};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

/// Requests kept in flight, as fio's `--iodepth`.
const QUEUE_DEPTH: usize = 32;
/// Bytes per request, as fio's `--bs`.
const BLOCK_BYTES: u64 = 4096;
/// Bytes per write while filling the file before the measurements.
const FILL_REQUEST_BYTES: usize = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq)]
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

struct Arguments {
    path: PathBuf,
    size_bytes: u64,
    seconds: u64,
    with_fio: bool,
    repeats: usize,
    /// Tokio worker threads; 0 runs the workers on the main thread.
    workers: usize,
}

fn parse_size(text: &str) -> u64 {
    let (digits, multiplier) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 1 << 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 1 << 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    digits
        .parse::<u64>()
        .expect("SIZE must be a number with an optional K, M or G")
        * multiplier
}

fn parse_arguments() -> Arguments {
    let mut positional = Vec::new();
    let mut with_fio = false;
    let mut repeats = 3;
    let mut workers = 0;
    let mut arguments = std::env::args().skip(1);
    while let Some(argument) = arguments.next() {
        match argument.as_str() {
            "--fio" => with_fio = true,
            "--repeats" => {
                repeats = arguments
                    .next()
                    .and_then(|value| value.parse().ok())
                    .expect("--repeats takes a count");
            }
            "--workers" => {
                workers = arguments
                    .next()
                    .and_then(|value| value.parse().ok())
                    .expect("--workers takes a count");
            }
            _ => positional.push(argument),
        }
    }
    assert!(
        positional.len() == 3,
        "usage: device_iops PATH SIZE SECONDS [--fio] [--repeats N] [--workers N]"
    );
    Arguments {
        path: PathBuf::from(&positional[0]),
        size_bytes: parse_size(&positional[1]),
        seconds: positional[2].parse().expect("SECONDS must be a number"),
        with_fio,
        repeats,
        workers,
    }
}

/// Writes the whole device once with non-zero data and flushes it.
async fn fill(device: &Arc<FileDevice>) {
    let mut random = SmallRng::seed_from_u64(0);
    let mut data = AlignedBuffer::zeroed(FILL_REQUEST_BYTES);
    random.fill_bytes(&mut data);
    let data = Arc::new(data);
    let size_bytes = device.size_bytes();
    let mut offset = 0;
    while offset < size_bytes {
        let mut batch = tokio::task::JoinSet::new();
        for _ in 0..8 {
            if offset >= size_bytes {
                break;
            }
            let length = (size_bytes - offset).min(FILL_REQUEST_BYTES as u64) as usize;
            let chunk = if length == FILL_REQUEST_BYTES {
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
            result.expect("fill task").expect("fill write");
        }
    }
    device.flush().await.expect("flush after fill");
}

/// Runs `QUEUE_DEPTH` closed-loop workers for `duration` and returns operations per second.
async fn measure_lamina(device: &Arc<FileDevice>, pattern: Pattern, duration: Duration) -> f64 {
    let block_count = device.size_bytes() / BLOCK_BYTES;
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..QUEUE_DEPTH {
        let device = device.clone();
        workers.spawn(async move {
            let mut random = SmallRng::seed_from_u64(worker as u64 + 1);
            let mut data = AlignedBuffer::zeroed(BLOCK_BYTES as usize);
            random.fill_bytes(&mut data);
            let data = Arc::new(data);
            let mut operations: u64 = 0;
            while Instant::now() < deadline {
                let offset = random.random_range(0..block_count) * BLOCK_BYTES;
                match pattern {
                    Pattern::RandomRead => {
                        device
                            .read(offset, BLOCK_BYTES as usize)
                            .await
                            .expect("read");
                    }
                    Pattern::RandomWrite => {
                        device.write(offset, data.clone()).await.expect("write")
                    }
                }
                operations += 1;
            }
            operations
        });
    }
    let mut operations = 0;
    while let Some(result) = workers.join_next().await {
        operations += result.expect("worker");
    }
    operations as f64 / started.elapsed().as_secs_f64()
}

/// Runs fio's io_uring engine with O_DIRECT on the same file and returns its IOPS.
fn measure_fio(path: &Path, size_bytes: u64, seconds: u64, pattern: Pattern) -> f64 {
    let output = Command::new("fio")
        .arg(format!("--name=device_iops_{}", pattern.fio_name()))
        .args(["--ioengine=io_uring", "--direct=1", "--bs=4k"])
        .arg(format!("--iodepth={QUEUE_DEPTH}"))
        .arg(format!("--rw={}", pattern.fio_name()))
        .arg(format!("--filename={}", path.display()))
        .arg(format!("--size={size_bytes}"))
        .arg(format!("--runtime={seconds}"))
        .args(["--time_based", "--output-format=json"])
        .output()
        .expect("running fio");
    assert!(
        output.status.success(),
        "fio failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("fio's JSON report");
    let direction = match pattern {
        Pattern::RandomRead => "read",
        Pattern::RandomWrite => "write",
    };
    report["jobs"][0][direction]["iops"]
        .as_f64()
        .expect("iops in fio's report")
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let arguments = parse_arguments();
    let runtime = if arguments.workers == 0 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(arguments.workers)
            .enable_all()
            .build()
    }
    .expect("tokio runtime");
    let existed = arguments.path.exists();
    let device = FileDevice::open(
        &arguments.path,
        FileDeviceOptions {
            create_size_bytes: Some(arguments.size_bytes),
            ..FileDeviceOptions::default()
        },
    )
    .expect("open the device");
    println!(
        "device {} ({} bytes, backend {:?}), 4 KiB requests, queue depth {QUEUE_DEPTH}, {} s per run, median of {}",
        arguments.path.display(),
        device.size_bytes(),
        device.backend(),
        arguments.seconds,
        arguments.repeats
    );
    let device = Arc::new(device);
    if !existed {
        let started = Instant::now();
        runtime.block_on(fill(&device));
        println!("filled in {:.1} s", started.elapsed().as_secs_f64());
    }
    let duration = Duration::from_secs(arguments.seconds);
    for pattern in [Pattern::RandomRead, Pattern::RandomWrite] {
        let mut lamina = Vec::new();
        let mut fio = Vec::new();
        for _ in 0..arguments.repeats {
            lamina.push(runtime.block_on(measure_lamina(&device, pattern, duration)));
            if arguments.with_fio {
                fio.push(measure_fio(
                    &arguments.path,
                    device.size_bytes(),
                    arguments.seconds,
                    pattern,
                ));
            }
        }
        let lamina_runs = format!("{lamina:.0?}");
        let lamina_iops = median(&mut lamina);
        if arguments.with_fio {
            let fio_runs = format!("{fio:.0?}");
            let fio_iops = median(&mut fio);
            println!(
                "{:<9} lamina {lamina_iops:>9.0} IOPS {lamina_runs}  fio {fio_iops:>9.0} IOPS {fio_runs}  ratio {:.2}",
                pattern.fio_name(),
                lamina_iops / fio_iops
            );
        } else {
            println!(
                "{:<9} lamina {lamina_iops:>9.0} IOPS {lamina_runs}",
                pattern.fio_name()
            );
        }
    }
}
