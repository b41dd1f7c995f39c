//! Pools on real files and the fills that put data in a volume before a
//! measurement: what the engine's benchmark examples share.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use lamina_device::{FileDevice, FileDeviceOptions};
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits, PoolOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Size of the sequential writes that fill volumes.
pub const FILL_WRITE_BYTES: usize = 1 << 20;

/// Concurrent writers when a volume is written block by block.
pub const FILL_WRITERS: usize = 32;

/// Bytes at the start of each block that change from one write to the next, so
/// that no two writes carry the same data.
const VARYING_PREFIX_BYTES: usize = 64;

/// The cores of this machine: the workers of the multi-threaded benchmarks.
pub fn core_count() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Opens a file as a device, creating it sparse with `create_size_bytes` if given.
pub fn open_file_device(
    path: &Path,
    create_size_bytes: Option<u64>,
) -> anyhow::Result<Arc<FileDevice>> {
    let options = FileDeviceOptions {
        create_size_bytes,
        ..FileDeviceOptions::default()
    };
    let device = FileDevice::open(path, options)
        .map_err(|error| anyhow::anyhow!("cannot open {}: {error}", path.display()))?;
    Ok(Arc::new(device))
}

/// Creates a pool on `device`, overwriting whatever the device held.
pub async fn create_pool(device: Arc<FileDevice>, limits: PoolLimits) -> anyhow::Result<Pool> {
    let options = PoolOptions {
        force: true,
        ..PoolOptions::default()
    };
    Ok(Pool::create(device, options, limits).await?)
}

/// Writes the first `size_bytes` of a volume sequentially in [`FILL_WRITE_BYTES`]
/// writes (each with a different first byte) and flushes; returns the seconds taken.
pub async fn fill_sequentially(
    pool: &Pool,
    volume_id: u32,
    size_bytes: u64,
    seed: u64,
) -> anyhow::Result<f64> {
    let mut chunk = vec![0u8; FILL_WRITE_BYTES];
    SmallRng::seed_from_u64(seed).fill(&mut chunk[..]);
    let started = Instant::now();
    let mut offset = 0;
    while offset < size_bytes {
        let length = usize::try_from((size_bytes - offset).min(FILL_WRITE_BYTES as u64))?;
        chunk[0] = chunk[0].wrapping_add(1);
        pool.write(volume_id, offset, &chunk[..length], false)
            .await?;
        offset += length as u64;
    }
    pool.flush().await?;
    Ok(started.elapsed().as_secs_f64())
}

/// Writes every 4 KiB block in `blocks` once, in about the given order, from
/// [`FILL_WRITERS`] concurrent tasks that take the next block in turn. Does not flush.
pub async fn write_blocks(pool: &Pool, volume_id: u32, blocks: Vec<u64>) -> anyhow::Result<()> {
    let blocks = Arc::new(blocks);
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for writer in 0..FILL_WRITERS {
        let (pool, blocks, next) = (pool.clone(), blocks.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut data = vec![0u8; lamina_engine::BLOCK_BYTES];
            let mut rng = SmallRng::seed_from_u64(writer as u64);
            rng.fill(&mut data[..]);
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                let Some(block) = blocks.get(index) else {
                    return anyhow::Ok(());
                };
                rng.fill(&mut data[..VARYING_PREFIX_BYTES]);
                pool.write(volume_id, block * BLOCK_SIZE_BYTES, &data, false)
                    .await?;
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}
