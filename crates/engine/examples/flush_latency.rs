//! Flush latency (`cargo run --release -p lamina-engine --example flush_latency --`,
//! formerly `lamina bench flush-latency`; decision 0060): what a synchronous 4 KiB write costs, a write
//! followed by a flush, one at a time, on a real file (FileDevice: io_uring,
//! O_DIRECT), as a database's commit does. Reports the median and 99th percentile of
//! the write-plus-flush time and the device bytes written per client byte, so that a
//! change to the flush path (decision 0013's flush marker and summary copies) can be
//! compared with the build before it on the same machine, in one run.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use lamina_engine::{BLOCK_SIZE_BYTES, PoolLimits};
use rand::{Rng, SeedableRng};
use serde::Serialize;

mod support;

use support::{core_count, create_pool, open_file_device, percentile_of_sorted, runtime};

/// Size of the sparse pool file, in bytes.
const POOL_BYTES: u64 = 256 << 20;

/// Blocks of the volume the writes land in, at random.
const VOLUME_BLOCKS: u64 = 16_384;

/// In process on a file: the latency of a 4 KiB write followed by a flush.
#[derive(Debug, Clone, Parser)]
pub struct FlushLatencyArgs {
    /// The pool file: created (256 MiB, sparse) and removed.
    #[arg(long)]
    pub path: PathBuf,
    /// Synchronous writes measured.
    #[arg(long, default_value_t = 3000, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: u64,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// What the flush-latency benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct FlushLatencyReport {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Device bytes written per client byte over the writes.
    pub device_bytes_per_client_byte: f64,
}

impl FlushLatencyReport {
    /// The one-line table.
    pub fn table(&self) -> String {
        format!(
            "sync 4 KiB writes: {}, median {:.0} us, p99 {:.0} us, device bytes per client byte {:.2}\n",
            self.count, self.p50_us, self.p99_us, self.device_bytes_per_client_byte
        )
    }
}

/// Measures and returns the report (the CLI prints it; tests inspect it).
pub fn measure(arguments: &FlushLatencyArgs) -> anyhow::Result<FlushLatencyReport> {
    let report = runtime(core_count())?.block_on(measure_async(arguments));
    std::fs::remove_file(&arguments.path)?;
    report
}

async fn measure_async(arguments: &FlushLatencyArgs) -> anyhow::Result<FlushLatencyReport> {
    let _ = std::fs::remove_file(&arguments.path);
    let device = open_file_device(&arguments.path, Some(POOL_BYTES))?;
    let pool = create_pool(device, PoolLimits::default()).await?;
    let volume_id = pool
        .create_volume("bench", VOLUME_BLOCKS * BLOCK_SIZE_BYTES)
        .await?
        .volume_id;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let mut block = vec![0u8; lamina_engine::BLOCK_BYTES];
    let before = pool.status();
    let mut nanoseconds = Vec::with_capacity(usize::try_from(arguments.count)?);
    for _ in 0..arguments.count {
        rng.fill(&mut block[..]);
        let logical_block = rng.random_range(0..VOLUME_BLOCKS);
        let started = Instant::now();
        pool.write(volume_id, logical_block * BLOCK_SIZE_BYTES, &block, false)
            .await?;
        pool.flush().await?;
        nanoseconds.push(u64::try_from(started.elapsed().as_nanos())?);
    }
    let after = pool.status();
    pool.close().await?;
    nanoseconds.sort_unstable();
    let percentile_us = |percentile: f64| {
        percentile_of_sorted(&nanoseconds, percentile).map_or(f64::NAN, |value| value as f64 / 1e3)
    };
    let device_bytes = after.device_bytes_written - before.device_bytes_written;
    let client_bytes = after.client_bytes_written - before.client_bytes_written;
    Ok(FlushLatencyReport {
        count: arguments.count,
        p50_us: percentile_us(50.0),
        p99_us: percentile_us(99.0),
        device_bytes_per_client_byte: device_bytes as f64 / client_bytes as f64,
    })
}

fn main() -> anyhow::Result<()> {
    let arguments = FlushLatencyArgs::parse();
    let report = measure(&arguments)?;
    support::print_report(&report, &report.table(), arguments.json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_latency_reports_percentiles_and_removes_its_file() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("flush.img");
        let path = path.to_str().unwrap();
        let arguments =
            FlushLatencyArgs::try_parse_from(["flush_latency", "--path", path, "--count", "50"])
                .expect("parses");
        let report = measure(&arguments).expect("measures");
        assert!(report.table().starts_with("sync 4 KiB writes: 50, median "));
        let document = serde_json::to_value(&report).unwrap();
        for field in ["count", "p50_us", "p99_us"] {
            assert!(document.get(field).is_some(), "{field} in {document}");
        }
        assert!(document["device_bytes_per_client_byte"].as_f64().unwrap() >= 1.0);
        assert!(
            !std::path::Path::new(path).exists(),
            "the pool file is removed"
        );
    }
}
