//! What a dedup fingerprint costs per 4 KiB block on this machine (decision
//! 0073): BLAKE3 (the `blake3` crate the estimate and the design use) against
//! SHA-256 (`sha2`, which uses the CPU's SHA extensions where present), one
//! block at a time as a write path would hash them, over the first 64 MiB of
//! this machine's /usr/bin files. Prints the median of five rounds per hash.
//!
//!     cargo run --release -p lamina-reduction --example fingerprint_cost

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use sha2::Digest;

const BLOCK_SIZE_BYTES: usize = 4096;
const SAMPLE_SIZE_BYTES: usize = 64 << 20;
const ROUND_COUNT: usize = 5;
const SOURCE_DIRECTORY: &str = "/usr/bin";

fn main() {
    let data = machine_bytes(Path::new(SOURCE_DIRECTORY));
    let block_count = data.len() / BLOCK_SIZE_BYTES;
    assert!(block_count > 0, "no files under {SOURCE_DIRECTORY}");
    println!("{block_count} blocks of {BLOCK_SIZE_BYTES} B from {SOURCE_DIRECTORY}");
    let blake3_ns = median_ns_per_block(&data, |block| *blake3::hash(block).as_bytes());
    let sha256_ns = median_ns_per_block(&data, |block| sha2::Sha256::digest(block).into());
    for (name, nanoseconds) in [("blake3", blake3_ns), ("sha256", sha256_ns)] {
        let mib_per_second = 4096.0 / 1_048_576.0 / (nanoseconds / 1e9);
        println!("{name:<7} {nanoseconds:>8.0} ns per 4 KiB block  {mib_per_second:>6.0} MiB/s");
    }
    println!("sha256 / blake3: {:.2}", sha256_ns / blake3_ns);
}

/// The median over `ROUND_COUNT` rounds of the time per block of `hash`.
fn median_ns_per_block(data: &[u8], hash: impl Fn(&[u8]) -> [u8; 32]) -> f64 {
    let mut rounds: Vec<f64> = (0..ROUND_COUNT)
        .map(|_| {
            let started = Instant::now();
            let mut block_count = 0u32;
            for block in data.chunks_exact(BLOCK_SIZE_BYTES) {
                black_box(hash(black_box(block)));
                block_count += 1;
            }
            started.elapsed().as_secs_f64() * 1e9 / f64::from(block_count)
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[ROUND_COUNT / 2]
}

/// Up to `SAMPLE_SIZE_BYTES` of the regular files under `directory`.
fn machine_bytes(directory: &Path) -> Vec<u8> {
    let mut data = Vec::with_capacity(SAMPLE_SIZE_BYTES);
    let mut paths: Vec<_> = std::fs::read_dir(directory)
        .map(|entries| {
            entries
                .filter_map(|entry| entry.ok().map(|entry| entry.path()))
                .collect()
        })
        .unwrap_or_default();
    paths.sort();
    for path in paths {
        if data.len() >= SAMPLE_SIZE_BYTES {
            break;
        }
        if std::fs::symlink_metadata(&path).is_ok_and(|metadata| metadata.is_file())
            && let Ok(bytes) = std::fs::read(&path)
        {
            data.extend_from_slice(&bytes);
        }
    }
    data.truncate(SAMPLE_SIZE_BYTES.min(data.len() / BLOCK_SIZE_BYTES * BLOCK_SIZE_BYTES));
    data
}
