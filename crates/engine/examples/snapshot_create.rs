//! How long `Pool::create_snapshot` takes on fully written volumes of different sizes
//! (issue 4's goal: at most 10 ms, and independent of the volume's size), measured in
//! process on a real file (FileDevice: io_uring, O_DIRECT) so that no process start or
//! admin round trip is counted.
//!
//! One pool holds one volume per size. Each volume is written completely with 1 MiB
//! sequential writes and the pool is flushed. Then:
//! (a) `REPETITIONS` rounds, each timing one `create_snapshot` per volume in turn (the
//!     volumes are not written between snapshots, so every snapshot shares all chunks);
//! (b) `REPETITIONS` more rounds in which 1 % of each volume's blocks is first
//!     overwritten with scattered 4 KiB writes and flushed (untimed), so that every
//!     map chunk diverges from the previous snapshot, then `create_snapshot` is timed.
//!     This is the state of a volume that lives with snapshots: the per-snapshot space
//!     accounting that creation returns has to compare diverged chunks.
//!
//! `list_snapshots` of the volume is timed right after each creation, to tell apart
//! the cost of the snapshot itself and the cost of the accounting it reports.
//! (c) The longest 4 KiB read of the smallest volume (one reader, queue depth 1) while
//!     `list_snapshots` of the largest volume runs in a loop, against the longest read
//!     in an equal time without it: whether the accounting stalls other volumes' I/O.
//!
//! Usage: `cargo run --release -p lamina-engine --example snapshot_create -- PATH
//! [REPETITIONS] [SIZES]`, SIZES comma-separated with a K/M/G suffix (default `1G,10G`),
//! REPETITIONS default 5. PATH is created (sparse) and removed.

// This example is moving into `lamina bench` on another branch; until then it
// keeps its `as` casts (issue 17 converts the library and binaries).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use lamina_device::{FileDevice, FileDeviceOptions};
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits, PoolOptions};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Size of the sequential writes that fill the volumes.
const FILL_WRITE_BYTES: usize = 1 << 20;
/// Concurrent writers of the scattered overwrites of phase (b).
const OVERWRITE_WRITERS: usize = 32;
/// Share of a volume's blocks overwritten before each snapshot of phase (b), in
/// thousandths.
const OVERWRITE_PER_MILLE: u64 = 10;
/// Free space left in the pool beyond the volumes and their diverged copies, in percent
/// of the volumes' total size.
const POOL_HEADROOM_PERCENT: u64 = 60;

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn parse_size(text: &str) -> BenchResult<u64> {
    let (digits, multiplier) = match text.chars().last() {
        Some('K' | 'k') => (&text[..text.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&text[..text.len() - 1], 1 << 20),
        Some('G' | 'g') => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    Ok(digits.parse::<u64>()? * multiplier)
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let middle = sorted.len() / 2;
    if sorted.len() % 2 == 1 {
        sorted[middle]
    } else {
        (sorted[middle - 1] + sorted[middle]) / 2.0
    }
}

fn format_list(values: &[f64]) -> String {
    values
        .iter()
        .map(|value| format!("{value:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

async fn create_pool(path: &Path, size_bytes: u64) -> BenchResult<Pool> {
    let device = FileDevice::open(
        path,
        FileDeviceOptions {
            create_size_bytes: Some(size_bytes),
            ..FileDeviceOptions::default()
        },
    )?;
    println!("device backend: {:?}", device.backend());
    let options = PoolOptions {
        force: true,
        ..PoolOptions::default()
    };
    Ok(Pool::create(Arc::new(device), options, PoolLimits::default()).await?)
}

/// Writes the whole volume sequentially in [`FILL_WRITE_BYTES`] writes and flushes.
async fn fill(pool: &Pool, volume_id: u32, size_bytes: u64) -> BenchResult<f64> {
    let mut chunk = vec![0u8; FILL_WRITE_BYTES];
    SmallRng::seed_from_u64(u64::from(volume_id)).fill(&mut chunk[..]);
    let started = Instant::now();
    let mut offset = 0;
    while offset < size_bytes {
        let length = (size_bytes - offset).min(chunk.len() as u64) as usize;
        // A different first byte per write, so that no two blocks are equal.
        chunk[0] = chunk[0].wrapping_add(1);
        pool.write(volume_id, offset, &chunk[..length], false)
            .await?;
        offset += length as u64;
    }
    pool.flush().await?;
    Ok(started.elapsed().as_secs_f64())
}

/// Overwrites [`OVERWRITE_PER_MILLE`] of the volume's blocks at random offsets and flushes.
async fn overwrite_scattered(
    pool: &Pool,
    volume_id: u32,
    size_bytes: u64,
    seed: u64,
) -> BenchResult<()> {
    let block_count = size_bytes / BLOCK_SIZE_BYTES;
    let writes = block_count * OVERWRITE_PER_MILLE / 1000;
    let mut tasks = Vec::new();
    for writer in 0..OVERWRITE_WRITERS {
        let pool = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(seed * 1000 + writer as u64);
            let mut data = vec![0u8; BLOCK_SIZE_BYTES as usize];
            rng.fill(&mut data[..]);
            for _ in (writer as u64..writes).step_by(OVERWRITE_WRITERS) {
                data[0] = data[0].wrapping_add(1);
                let block = rng.random_range(0..block_count);
                pool.write(volume_id, block * BLOCK_SIZE_BYTES, &data, false)
                    .await?;
            }
            Ok::<(), lamina_engine::EngineError>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    pool.flush().await?;
    Ok(())
}

/// How long phase (c) reads, with and without `list_snapshots` running.
const STALL_WINDOW_MS: u64 = 3_000;

/// Reads 4 KiB blocks of a volume one at a time for [`STALL_WINDOW_MS`], while (if
/// given) another task lists `listed_volume`'s snapshots in a loop. Returns the longest
/// read in milliseconds, the reads done and the lists done.
async fn longest_read_ms(
    pool: &Pool,
    volume_id: u32,
    size_bytes: u64,
    listed_volume: Option<&str>,
) -> BenchResult<(f64, u64, u64)> {
    let deadline = Instant::now() + std::time::Duration::from_millis(STALL_WINDOW_MS);
    let lister = listed_volume.map(|volume| {
        let pool = pool.clone();
        let volume = volume.to_owned();
        // A blocking thread: list_snapshots is synchronous, as the admin API calls it.
        tokio::task::spawn_blocking(move || {
            let mut lists = 0u64;
            while Instant::now() < deadline {
                pool.list_snapshots(Some(&volume))?;
                lists += 1;
            }
            Ok::<u64, lamina_engine::EngineError>(lists)
        })
    });
    let mut rng = SmallRng::seed_from_u64(77);
    let mut buffer = vec![0u8; BLOCK_SIZE_BYTES as usize];
    let block_count = size_bytes / BLOCK_SIZE_BYTES;
    let mut longest: f64 = 0.0;
    let mut reads = 0u64;
    while Instant::now() < deadline {
        let offset = rng.random_range(0..block_count) * BLOCK_SIZE_BYTES;
        let started = Instant::now();
        pool.read(volume_id, offset, &mut buffer).await?;
        longest = longest.max(started.elapsed().as_secs_f64() * 1000.0);
        reads += 1;
    }
    let lists = match lister {
        Some(task) => task.await??,
        None => 0,
    };
    Ok((longest, reads, lists))
}

/// Creation and list times of one volume, in milliseconds.
#[derive(Default)]
struct Samples {
    create_ms: Vec<f64>,
    list_ms: Vec<f64>,
}

async fn timed_snapshot(
    pool: &Pool,
    volume: &str,
    snapshot: &str,
    samples: &mut Samples,
) -> BenchResult<()> {
    let started = Instant::now();
    let info = pool.create_snapshot(volume, snapshot).await?;
    samples
        .create_ms
        .push(started.elapsed().as_secs_f64() * 1000.0);
    assert_eq!(info.full_name, format!("{volume}@{snapshot}"));
    let started = Instant::now();
    let listed = pool.list_snapshots(Some(volume))?;
    samples
        .list_ms
        .push(started.elapsed().as_secs_f64() * 1000.0);
    assert!(listed.iter().any(|listed| listed.name == snapshot));
    Ok(())
}

fn report(phase: &str, volumes: &[(String, u32, u64)], samples: &[Samples]) {
    for ((name, _, size_bytes), samples) in volumes.iter().zip(samples) {
        println!(
            "{phase} {name} ({} MiB): create_snapshot ms: {}  median {:.2}; then list_snapshots ms: {}  median {:.2}",
            size_bytes >> 20,
            format_list(&samples.create_ms),
            median(&samples.create_ms),
            format_list(&samples.list_ms),
            median(&samples.list_ms),
        );
    }
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
    if arguments.len() < 2 {
        return Err("usage: snapshot_create PATH [REPETITIONS] [SIZES]".into());
    }
    let path = Path::new(&arguments[1]);
    let repetitions: usize = match arguments.get(2) {
        Some(text) => text.parse()?,
        None => 5,
    };
    assert!(repetitions > 0, "at least one repetition");
    let sizes: Vec<u64> = arguments
        .get(3)
        .map_or("1G,10G", String::as_str)
        .split(',')
        .map(|text| parse_size(text.trim()).map(|size| size / (1 << 20) * (1 << 20)))
        .collect::<BenchResult<_>>()?;
    let total: u64 = sizes.iter().sum();
    let pool_bytes = total + total * POOL_HEADROOM_PERCENT / 100 + (1 << 30);
    println!(
        "snapshot_create: {} ({} MiB sparse pool), volumes {:?} MiB, {repetitions} repetitions, {} cores",
        path.display(),
        pool_bytes >> 20,
        sizes.iter().map(|size| size >> 20).collect::<Vec<_>>(),
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    let _ = std::fs::remove_file(path);
    let pool = create_pool(path, pool_bytes).await?;
    let mut volumes = Vec::new();
    for size_bytes in &sizes {
        let name = format!("volume{}m", size_bytes >> 20);
        let volume_id = pool.create_volume(&name, *size_bytes).await?.volume_id;
        let seconds = fill(&pool, volume_id, *size_bytes).await?;
        println!(
            "{name}: written fully in {seconds:.1} s ({:.0} MiB/s)",
            (*size_bytes >> 20) as f64 / seconds
        );
        volumes.push((name, volume_id, *size_bytes));
    }
    let mut shared: Vec<Samples> = volumes.iter().map(|_| Samples::default()).collect();
    for repetition in 0..repetitions {
        for ((name, _, _), samples) in volumes.iter().zip(&mut shared) {
            timed_snapshot(&pool, name, &format!("a{repetition}"), samples).await?;
        }
    }
    report(
        "(a) unchanged since the previous snapshot:",
        &volumes,
        &shared,
    );
    let mut diverged: Vec<Samples> = volumes.iter().map(|_| Samples::default()).collect();
    for repetition in 0..repetitions {
        for ((name, volume_id, size_bytes), samples) in volumes.iter().zip(&mut diverged) {
            overwrite_scattered(&pool, *volume_id, *size_bytes, repetition as u64).await?;
            timed_snapshot(&pool, name, &format!("b{repetition}"), samples).await?;
        }
    }
    report(
        &format!(
            "(b) after overwriting {}.{} % of the blocks:",
            OVERWRITE_PER_MILLE / 10,
            OVERWRITE_PER_MILLE % 10
        ),
        &volumes,
        &diverged,
    );
    let (smallest, largest) = (&volumes[0], &volumes[volumes.len() - 1]);
    let quiet = longest_read_ms(&pool, smallest.1, smallest.2, None).await?;
    let busy = longest_read_ms(&pool, smallest.1, smallest.2, Some(&largest.0)).await?;
    println!(
        "(c) longest 4 KiB read of {} in {STALL_WINDOW_MS} ms: {:.2} ms alone ({} reads), {:.2} ms while list_snapshots({}) ran {} times ({} reads)",
        smallest.0, quiet.0, quiet.1, busy.0, largest.0, busy.2, busy.1
    );
    let all_create: Vec<f64> = shared
        .iter()
        .chain(&diverged)
        .flat_map(|samples| samples.create_ms.iter().copied())
        .collect();
    println!(
        "all create_snapshot samples: median {:.2} ms, max {:.2} ms (goal: <= 10 ms)",
        median(&all_create),
        all_create.iter().copied().fold(0.0, f64::max)
    );
    pool.close().await?;
    drop(pool);
    std::fs::remove_file(path)?;
    Ok(())
}
