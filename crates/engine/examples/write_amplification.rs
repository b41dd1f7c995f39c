//! Measures write amplification (device bytes written ÷ client bytes written) of
//! 4 KiB random overwrites at a given live-data fraction, uniform or Zipf, in
//! steady state, on an in-memory device: the figure the cleaner is judged by.
//!
//!     cargo run --release -p lamina-engine --example write_amplification -- \
//!         [--live 0.5,0.7,0.85] [--pool-mib 512] [--passes 4] [--zipf 0.99] \
//!         [--workloads uniform,zipf,zipf-permuted] [--paced-cleaner on|off] [--cleaner-headroom 4] \
//!         [--separate-client-writes on|off] [--relocation-streams-by-age-from SEGMENTS] \
//!         [--restart-before-measuring off|on]
//!
//! Besides the total, it prints the blocks the cleaner relocated per client
//! block; the rest of the total above 1 is summaries and checkpoints.

// This example is moving into `lamina bench` on another branch; until then it
// keeps its `as` casts (issue 17 converts the library and binaries).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::sync::Arc;

use lamina_device::MemoryDevice;
use lamina_engine::{Pool, PoolLimits, PoolOptions};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

#[path = "common/mod.rs"]
mod common;
use common::argument;
use lamina_model::bounds::greedy_write_amplification;
use lamina_model::zipf::Zipf;

const BLOCK: u64 = 4096;

/// One measurement: total write amplification and the part of it that is
/// relocation (blocks the cleaner moved per client block).
struct Measured {
    write_amplification: f64,
    relocated_per_client_block: f64,
}

/// How Zipf ranks map to blocks.
#[derive(Clone, Copy, PartialEq)]
enum Scatter {
    /// As fio maps them (`lib/zipf.c`: a 48-bit multiplicative hash of the
    /// rank, modulo the block count): several ranks may share a block, and
    /// 40-65% of the blocks get none, so they are written once and never
    /// again. This is what `fio --random_distribution=zipf:0.99` writes.
    Fio,
    /// A random permutation: every block has exactly one rank, so the whole
    /// volume follows Zipf's law (harder: the cold tail is all overwritten).
    Permutation,
}

/// fio's map from a Zipf rank (0-based) to a block: `hash_64(rank, 48)` with
/// the golden-ratio multiplier, modulo the block count (fio adds a random
/// offset first, which only rotates the blocks).
fn fio_scatter(rank: u64, block_count: u64) -> u64 {
    (rank.wrapping_mul(0x61C8_8646_80B5_83EB) >> 16) % block_count
}

async fn measure(
    pool_mib: u64,
    live_fraction: f64,
    zipf_theta: Option<f64>,
    scatter: Scatter,
    passes: u64,
) -> Measured {
    let segment_bytes = 1u64 << 20;
    let device = Arc::new(MemoryDevice::new((4 << 20) + pool_mib * (1 << 20)));
    let mut limits = PoolLimits {
        checkpoint_interval_ms: 3_600_000,
        flush_interval_ms: 3_600_000,
        ..PoolLimits::default()
    };
    limits.cleaner_headroom_segment_count = argument("--cleaner-headroom", "4")
        .parse()
        .expect("--cleaner-headroom");
    if argument("--paced-cleaner", "on") == "off" {
        limits.cleaner_relocation_blocks_per_client_block_max = 0.0;
    }
    limits.separate_client_writes_by_lifespan = argument("--separate-client-writes", "on") != "off";
    limits.relocation_streams_by_age_segment_count_min = argument(
        "--relocation-streams-by-age-from",
        &limits
            .relocation_streams_by_age_segment_count_min
            .to_string(),
    )
    .parse()
    .expect("--relocation-streams-by-age-from");
    let options = PoolOptions {
        segment_size_bytes: segment_bytes,
        force: false,
        flash_region_bytes: None,
    };
    let mut pool = Pool::create(device.clone(), options, limits.clone())
        .await
        .expect("create");
    let capacity_bytes = pool.status().capacity_bytes - pool.status().reserved_bytes;
    let volume_blocks = ((capacity_bytes as f64 * live_fraction) as u64) / BLOCK;
    pool.create_volume("wa", volume_blocks * BLOCK)
        .await
        .expect("volume");
    let volume = pool.volume_id("wa").expect("id");
    // Every write carries its block and generation, so that the final check
    // would notice a block the cleaner lost or mixed up.
    let contents = |block: u64, generation: u32| {
        let mut data = vec![0x5au8; BLOCK as usize];
        data[..8].copy_from_slice(&block.to_le_bytes());
        data[8..12].copy_from_slice(&generation.to_le_bytes());
        data
    };
    let mut generations = vec![0u32; volume_blocks as usize];
    for block in 0..volume_blocks {
        pool.write(volume, block * BLOCK, &contents(block, 0), false)
            .await
            .expect("fill");
    }
    let mut rng = SmallRng::seed_from_u64(42);
    let zipf = zipf_theta.map(|theta| Zipf::new(volume_blocks as usize, theta));
    // Scatter Zipf ranks over the volume so that hot blocks are not adjacent.
    let mut permutation: Vec<u64> = (0..volume_blocks).collect();
    permutation.shuffle(&mut SmallRng::seed_from_u64(7));
    let scatter = |rank: u64| match scatter {
        Scatter::Fio => fio_scatter(rank, volume_blocks),
        Scatter::Permutation => permutation[rank as usize],
    };
    let overwrite = |count: u64, rng: &mut SmallRng| {
        (0..count)
            .map(|_| match &zipf {
                Some(zipf) => scatter(zipf.sample(rng) as u64),
                None => rng.random_range(0..volume_blocks),
            })
            .collect::<Vec<u64>>()
    };
    // Warm up to steady state, then measure.
    for block in overwrite(volume_blocks * 2, &mut rng) {
        generations[block as usize] += 1;
        let data = contents(block, generations[block as usize]);
        pool.write(volume, block * BLOCK, &data, false)
            .await
            .expect("warm-up");
    }
    // A restart between warm-up and measurement shows what placement loses
    // with its in-memory hints (segment streams and data ages, per-block
    // interval estimates).
    if argument("--restart-before-measuring", "off") == "on" {
        pool.close().await.expect("close");
        pool = Pool::open(device.clone(), limits).await.expect("reopen");
    }
    let verbose = std::env::var_os("WA_VERBOSE").is_some();
    let before = pool.status();
    // Free and dead segments, summed over looks every 1,000 writes (verbose
    // only: the looks take the pool's lock inside the measured window).
    let mut samples = (0u64, 0u64, 0u64);
    for (index, block) in overwrite(volume_blocks * passes, &mut rng)
        .into_iter()
        .enumerate()
    {
        if verbose && index % 1000 == 0 {
            let status = pool.status();
            samples.0 += 1;
            samples.1 += status.free_segment_count;
            samples.2 += status.dead_segment_count;
        }
        generations[block as usize] += 1;
        let data = contents(block, generations[block as usize]);
        pool.write(volume, block * BLOCK, &data, false)
            .await
            .expect("overwrite");
    }
    let after = pool.status();
    let mut read_back = vec![0u8; BLOCK as usize];
    for block in 0..volume_blocks {
        pool.read(volume, block * BLOCK, &mut read_back)
            .await
            .expect("read back");
        assert!(
            read_back == contents(block, generations[block as usize]),
            "block {block} does not hold its last write"
        );
    }
    if verbose {
        eprintln!(
            "  checkpoints: {}",
            after.checkpoint_sequence - before.checkpoint_sequence
        );
        eprintln!(
            "  blocks overwritten at least once: {:.1}%",
            generations
                .iter()
                .filter(|generation| **generation > 0)
                .count() as f64
                * 100.0
                / volume_blocks as f64
        );
        eprintln!(
            "  segments {}, reserved {}, mean free {:.1}, mean dead {:.1}",
            after.segment_count,
            after.reserved_bytes / after.segment_size_bytes,
            samples.1 as f64 / samples.0 as f64,
            samples.2 as f64 / samples.0 as f64
        );
        let counts = pool.cleaner_victim_counts();
        for stream in 0..counts.victims.len() {
            if counts.victims[stream] > 0 {
                eprintln!(
                    "  stream {stream}: {} victims, mean live fraction {:.3}",
                    counts.victims[stream],
                    counts.live_blocks[stream] as f64 / counts.victims[stream] as f64 / 255.0
                );
            }
        }
    }
    let client = (after.client_bytes_written - before.client_bytes_written) as f64;
    let device_bytes = (after.device_bytes_written - before.device_bytes_written) as f64;
    let relocated = (after.cleaner_relocated_blocks - before.cleaner_relocated_blocks) as f64;
    Measured {
        write_amplification: device_bytes / client,
        relocated_per_client_block: relocated * BLOCK as f64 / client,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let pool_mib: u64 = argument("--pool-mib", "512").parse().expect("--pool-mib");
    let passes: u64 = argument("--passes", "4").parse().expect("--passes");
    let theta: f64 = argument("--zipf", "0.99").parse().expect("--zipf");
    let lives: Vec<f64> = argument("--live", "0.5,0.7,0.85")
        .split(',')
        .map(|value| value.parse().expect("--live"))
        .collect();
    println!(
        "pool {pool_mib} MiB, 1 MiB segments, {passes} measured passes after 2 warm-up passes"
    );
    let workloads: Vec<String> = argument("--workloads", "uniform,zipf,zipf-permuted")
        .split(',')
        .map(str::to_string)
        .collect();
    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>14}",
        "live", "workload", "WA (measured)", "relocated/blk", "greedy bound"
    );
    for live in lives {
        if workloads.iter().any(|workload| workload == "uniform") {
            let uniform = measure(pool_mib, live, None, Scatter::Fio, passes).await;
            println!(
                "{:>6.2} {:>14} {:>14.2} {:>14.2} {:>14.2}",
                live,
                "uniform",
                uniform.write_amplification,
                uniform.relocated_per_client_block,
                greedy_write_amplification(live)
            );
        }
        for (name, scatter) in [
            ("zipf", Scatter::Fio),
            ("zipf-permuted", Scatter::Permutation),
        ] {
            if !workloads.iter().any(|workload| workload == name) {
                continue;
            }
            let zipf = measure(pool_mib, live, Some(theta), scatter, passes).await;
            println!(
                "{:>6.2} {:>14} {:>14.2} {:>14.2} {:>14}",
                live,
                format!("{name}:{theta}"),
                zipf.write_amplification,
                zipf.relocated_per_client_block,
                "-"
            );
        }
    }
}
