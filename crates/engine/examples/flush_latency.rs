//! Measures what a synchronous 4 KiB write costs: a write followed by a flush,
//! one at a time, on a real file (FileDevice: io_uring, O_DIRECT), as a
//! database's commit does. Prints the median and 99th percentile of the
//! write-plus-flush time and the device bytes written per client byte, so that
//! a change to the flush path (decision 0013's flush marker and summary copies)
//! can be compared with the build before it on the same machine, in one run.
//!
//!     cargo run --release -p lamina-engine --example flush_latency -- PATH [COUNT]
//!
//! PATH is created (256 MiB, sparse) and removed; COUNT defaults to 3000.

// This example is moving into `lamina bench` on another branch; until then it
// keeps its `as` casts (issue 17 converts the library and binaries).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::sync::Arc;
use std::time::Instant;

use lamina_device::{FileDevice, FileDeviceOptions};
use lamina_engine::{Pool, PoolLimits, PoolOptions};
use rand::{Rng, SeedableRng};

const POOL_BYTES: u64 = 256 << 20;
const VOLUME_BLOCKS: u64 = 16_384;
const BLOCK: usize = 4096;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut arguments = std::env::args().skip(1);
    let path = arguments
        .next()
        .ok_or("usage: flush_latency PATH [COUNT]")?;
    let count: usize = arguments.next().map_or(Ok(3000), |text| text.parse())?;
    let _ = std::fs::remove_file(&path);
    let options = FileDeviceOptions {
        create_size_bytes: Some(POOL_BYTES),
        ..FileDeviceOptions::default()
    };
    let device = Arc::new(FileDevice::open(std::path::Path::new(&path), options)?);
    let pool = Pool::create(device, PoolOptions::default(), PoolLimits::default()).await?;
    let volume_id = pool
        .create_volume("bench", VOLUME_BLOCKS * BLOCK as u64)
        .await?
        .volume_id;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
    let mut block = vec![0u8; BLOCK];
    let before = pool.status();
    let mut microseconds = Vec::with_capacity(count);
    for _ in 0..count {
        rng.fill(&mut block[..]);
        let logical_block = rng.random_range(0..VOLUME_BLOCKS);
        let started = Instant::now();
        pool.write(volume_id, logical_block * BLOCK as u64, &block, false)
            .await?;
        pool.flush().await?;
        microseconds.push(started.elapsed().as_secs_f64() * 1e6);
    }
    let after = pool.status();
    microseconds.sort_by(f64::total_cmp);
    let percentile = |share: f64| microseconds[((microseconds.len() - 1) as f64 * share) as usize];
    let device_bytes = after.device_bytes_written - before.device_bytes_written;
    let client_bytes = after.client_bytes_written - before.client_bytes_written;
    println!(
        "sync 4 KiB writes: {count}, median {:.0} us, p99 {:.0} us, device bytes per client byte {:.2}",
        percentile(0.5),
        percentile(0.99),
        device_bytes as f64 / client_bytes as f64
    );
    pool.close().await?;
    drop(pool);
    std::fs::remove_file(&path)?;
    Ok(())
}
