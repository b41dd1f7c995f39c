//! `cargo run --release -p lamina-model --example engine_write_amplification --` (formerly `lamina bench engine-write-amplification`;
//! decision 0060): write amplification (device bytes
//! written ÷ client bytes written) of 4 KiB random overwrites at given live-data
//! fractions, uniform or Zipf, in steady state, with the engine in process on an
//! in-memory device: the figure the cleaner is judged by, without fio, NBD or a file
//! system in the way (`lamina bench write-amplification` measures the same through
//! the daemon and fio). Besides the total it reports the blocks the cleaner relocated
//! per client block; the rest of the total above 1 is summaries and checkpoints.
//! Every write carries its block and generation and the volume is read back at the
//! end, so a block the cleaner lost or mixed up fails the run.

#[path = "../../engine/examples/support/cleaner.rs"]
mod cleaner;

use cleaner::{CleanerOptions, Switch};

use std::sync::Arc;

use clap::{Parser, ValueEnum};
use lamina_api::size::parse_size;
use lamina_device::MemoryDevice;
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits, PoolOptions};
use lamina_model::bounds::greedy_write_amplification;
use lamina_model::zipf::Zipf;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Segment size of the pools, in bytes.
const SEGMENT_SIZE_BYTES: u64 = 1 << 20;
/// The pool's own metadata (superblock, checkpoint slots) beyond `--pool-size`.
const METADATA_BYTES: u64 = 4 << 20;
/// Volume sizes of random overwrites before measuring.
const WARM_UP_PASSES: u64 = 2;
/// Writes between two looks at the segment counts (with `--verbose`).
const SAMPLE_INTERVAL_WRITES: usize = 1000;
/// Background checkpoints and flushes are pushed beyond the run, in milliseconds.
const BACKGROUND_INTERVAL_MS: u64 = 3_600_000;

/// The access pattern of the overwrites.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// Every block equally likely.
    Uniform,
    /// Zipf ranks mapped to blocks as fio maps them (`lib/zipf.c`: a 48-bit
    /// multiplicative hash of the rank, modulo the block count): several ranks may
    /// share a block and 40-65% of the blocks get none, so they are written once
    /// and never again. This is what `fio --random_distribution=zipf:0.99` writes.
    Zipf,
    /// Zipf ranks mapped to blocks by a random permutation: every block has exactly
    /// one rank, so the whole volume follows Zipf's law (harder: the cold tail is all
    /// overwritten).
    ZipfPermuted,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Uniform => "uniform",
            Workload::Zipf => "zipf",
            Workload::ZipfPermuted => "zipf-permuted",
        }
    }
}

/// In process on a memory device: the cleaner's write amplification.
#[derive(Debug, Clone, Parser)]
pub struct EngineWriteAmplificationArgs {
    /// Live-data fractions of the usable space (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![0.5, 0.7, 0.85])]
    pub live: Vec<f64>,
    /// Size of the in-memory pool (e.g. 512M).
    #[arg(long, value_parser = parse_size, default_value = "512M")]
    pub pool_size: u64,
    /// Volume sizes of random overwrites measured, after two of warm-up.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub passes: u64,
    /// Skew of the Zipf workloads.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_theta: f64,
    /// Workloads (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = vec![Workload::Uniform, Workload::Zipf, Workload::ZipfPermuted])]
    pub workloads: Vec<Workload>,
    #[command(flatten)]
    pub cleaner: CleanerOptions,
    /// Close and reopen the pool between warm-up and measurement: shows what
    /// placement loses with its in-memory hints (segment streams and data ages,
    /// per-block interval estimates).
    #[arg(long, value_enum, default_value_t = Switch::Off)]
    pub restart_before_measuring: Switch,
    /// Also report checkpoints, blocks overwritten, mean free and dead segments and
    /// the cleaner's victims per stream in the measured window (the looks take the
    /// pool's lock inside it).
    #[arg(long)]
    pub verbose: bool,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// What `--verbose` adds to a cell.
#[derive(Debug, Clone, Serialize)]
pub struct CellDetails {
    pub checkpoints: u64,
    pub blocks_overwritten_percent: f64,
    pub segment_count: u64,
    pub reserved_segment_count: u64,
    pub mean_free_segments: f64,
    pub mean_dead_segments: f64,
    /// Per cleaner stream with victims: (stream, victims, mean live fraction).
    pub victims: Vec<StreamVictims>,
}

/// The cleaner's victims of one stream.
#[derive(Debug, Clone, Serialize)]
pub struct StreamVictims {
    pub stream: usize,
    pub victims: u64,
    pub mean_live_fraction: f64,
}

/// One cell: a live fraction and a workload.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub live_fraction: f64,
    pub workload: Workload,
    pub volume_blocks: u64,
    pub write_amplification: f64,
    pub relocated_per_client_block: f64,
    /// The analytic bound of a greedy cleaner (uniform cells only).
    pub greedy_bound: Option<f64>,
    pub details: Option<CellDetails>,
}

/// What the engine-write-amplification benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct EngineWriteAmplificationReport {
    pub pool_size_bytes: u64,
    pub segment_size_bytes: u64,
    pub warm_up_passes: u64,
    pub passes: u64,
    pub zipf_theta: f64,
    pub cells: Vec<Cell>,
}

/// fio's map from a Zipf rank (0-based) to a block: `hash_64(rank, 48)` with the
/// golden-ratio multiplier, modulo the block count (fio adds a random offset first,
/// which only rotates the blocks).
fn fio_scatter(rank: u64, block_count: u64) -> u64 {
    (rank.wrapping_mul(0x61C8_8646_80B5_83EB) >> 16) % block_count
}

/// Draws the blocks of the overwrites of one workload.
struct BlockDraws {
    workload: Workload,
    volume_blocks: u64,
    zipf: Zipf,
    permutation: Vec<u64>,
    rng: SmallRng,
}

impl BlockDraws {
    fn new(workload: Workload, volume_blocks: u64, theta: f64) -> anyhow::Result<Self> {
        // Scatter Zipf ranks over the volume so that hot blocks are not adjacent.
        let mut permutation: Vec<u64> = (0..volume_blocks).collect();
        permutation.shuffle(&mut SmallRng::seed_from_u64(7));
        Ok(Self {
            workload,
            volume_blocks,
            zipf: Zipf::new(usize::try_from(volume_blocks)?, theta),
            permutation,
            rng: SmallRng::seed_from_u64(42),
        })
    }

    fn draw(&mut self, count: u64) -> Vec<u64> {
        (0..count)
            .map(|_| match self.workload {
                Workload::Uniform => self.rng.random_range(0..self.volume_blocks),
                Workload::Zipf => {
                    fio_scatter(self.zipf.sample(&mut self.rng) as u64, self.volume_blocks)
                }
                Workload::ZipfPermuted => self.permutation[self.zipf.sample(&mut self.rng)],
            })
            .collect()
    }
}

/// The volume's blocks and the generation each last got, so that the final read-back
/// finds every block's last write.
struct Volume {
    volume_id: u32,
    generations: Vec<u32>,
}

impl Volume {
    fn contents(block: u64, generation: u32) -> Vec<u8> {
        let mut data = vec![0x5au8; lamina_engine::BLOCK_BYTES];
        data[..8].copy_from_slice(&block.to_le_bytes());
        data[8..12].copy_from_slice(&generation.to_le_bytes());
        data
    }

    async fn write(&mut self, pool: &Pool, block: u64) -> anyhow::Result<()> {
        let generation = &mut self.generations[usize::try_from(block)?];
        *generation += 1;
        let data = Self::contents(block, *generation);
        pool.write(self.volume_id, block * BLOCK_SIZE_BYTES, &data, false)
            .await?;
        Ok(())
    }

    async fn check(&self, pool: &Pool) -> anyhow::Result<()> {
        let mut read_back = vec![0u8; lamina_engine::BLOCK_BYTES];
        for (block, generation) in (0u64..).zip(&self.generations) {
            pool.read(self.volume_id, block * BLOCK_SIZE_BYTES, &mut read_back)
                .await?;
            anyhow::ensure!(
                read_back == Self::contents(block, *generation),
                "block {block} does not hold its last write"
            );
        }
        Ok(())
    }
}

/// A fresh pool on a memory device with the volume written once.
async fn prepare(
    arguments: &EngineWriteAmplificationArgs,
    live: f64,
) -> anyhow::Result<(Pool, Arc<MemoryDevice>, PoolLimits, Volume)> {
    let device = Arc::new(MemoryDevice::new(METADATA_BYTES + arguments.pool_size));
    let limits = arguments.cleaner.apply(PoolLimits {
        checkpoint_interval_ms: BACKGROUND_INTERVAL_MS,
        flush_interval_ms: BACKGROUND_INTERVAL_MS,
        ..PoolLimits::default()
    });
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_SIZE_BYTES,
        force: false,
        flash_region_bytes: None,
        ..PoolOptions::default()
    };
    let pool = Pool::create(device.clone(), options, limits.clone()).await?;
    let status = pool.status();
    let usable_bytes = status.capacity_bytes - status.reserved_bytes;
    let volume_blocks = saturating_u64((usable_bytes as f64 * live).floor()) / BLOCK_SIZE_BYTES;
    let volume_id = pool
        .create_volume("wa", volume_blocks * BLOCK_SIZE_BYTES)
        .await?
        .volume_id;
    let volume = Volume {
        volume_id,
        generations: vec![0; usize::try_from(volume_blocks)?],
    };
    for block in 0..volume_blocks {
        pool.write(
            volume_id,
            block * BLOCK_SIZE_BYTES,
            &Volume::contents(block, 0),
            false,
        )
        .await?;
    }
    Ok((pool, device, limits, volume))
}

/// Measures one cell: warm-up to steady state, then the measured passes.
async fn measure_cell(
    arguments: &EngineWriteAmplificationArgs,
    live: f64,
    workload: Workload,
) -> anyhow::Result<Cell> {
    let (mut pool, device, limits, mut volume) = prepare(arguments, live).await?;
    let volume_blocks = volume.generations.len() as u64;
    let mut draws = BlockDraws::new(workload, volume_blocks, arguments.zipf_theta)?;
    for block in draws.draw(volume_blocks * WARM_UP_PASSES) {
        volume.write(&pool, block).await?;
    }
    if arguments.restart_before_measuring == Switch::On {
        pool.close().await?;
        pool = Pool::open(device.clone(), limits).await?;
    }
    let before = pool.status();
    let victims_before = pool.cleaner_victim_counts();
    let mut samples = SegmentSamples::default();
    for (index, block) in draws
        .draw(volume_blocks * arguments.passes)
        .into_iter()
        .enumerate()
    {
        if arguments.verbose && index % SAMPLE_INTERVAL_WRITES == 0 {
            samples.look(&pool);
        }
        volume.write(&pool, block).await?;
    }
    let after = pool.status();
    volume.check(&pool).await?;
    let client = (after.client_bytes_written - before.client_bytes_written) as f64;
    let device_bytes = (after.device_bytes_written - before.device_bytes_written) as f64;
    let relocated = (after.cleaner_relocated_blocks - before.cleaner_relocated_blocks) as f64;
    let details = arguments.verbose.then(|| {
        details(
            &pool,
            &volume,
            &samples,
            before.checkpoint_sequence,
            &victims_before,
        )
    });
    Ok(Cell {
        live_fraction: live,
        workload,
        volume_blocks,
        write_amplification: device_bytes / client,
        relocated_per_client_block: relocated * BLOCK_SIZE_BYTES as f64 / client,
        greedy_bound: (workload == Workload::Uniform).then(|| greedy_write_amplification(live)),
        details,
    })
}

/// Free and dead segments, summed over looks during the measured window.
#[derive(Debug, Default)]
struct SegmentSamples {
    looks: u64,
    free: u64,
    dead: u64,
}

impl SegmentSamples {
    fn look(&mut self, pool: &Pool) {
        let status = pool.status();
        self.looks += 1;
        self.free += status.free_segment_count;
        self.dead += status.dead_segment_count;
    }
}

fn details(
    pool: &Pool,
    volume: &Volume,
    samples: &SegmentSamples,
    checkpoint_before: u64,
    victims_before: &lamina_engine::pool::cleaner::placement::VictimCounts,
) -> CellDetails {
    let status = pool.status();
    let overwritten = volume
        .generations
        .iter()
        .filter(|generation| **generation > 0)
        .count();
    // The measured window's victims only, not the fill's and warm-up's.
    let mut counts = pool.cleaner_victim_counts();
    for stream in 0..counts.victims.len() {
        counts.victims[stream] -= victims_before.victims[stream];
        counts.live_blocks[stream] -= victims_before.live_blocks[stream];
    }
    let victims = (0..counts.victims.len())
        .filter(|stream| counts.victims[*stream] > 0)
        .map(|stream| StreamVictims {
            stream,
            victims: counts.victims[stream],
            mean_live_fraction: counts.live_blocks[stream] as f64
                / counts.victims[stream] as f64
                / 255.0,
        })
        .collect();
    let looks = samples.looks.max(1) as f64;
    CellDetails {
        checkpoints: status.checkpoint_sequence - checkpoint_before,
        blocks_overwritten_percent: overwritten as f64 * 100.0 / volume.generations.len() as f64,
        segment_count: status.segment_count,
        reserved_segment_count: status.reserved_bytes / status.segment_size_bytes,
        mean_free_segments: samples.free as f64 / looks,
        mean_dead_segments: samples.dead as f64 / looks,
        victims,
    }
}

/// Measures every cell and returns the report (the CLI prints it; tests inspect it).
pub fn measure(
    arguments: &EngineWriteAmplificationArgs,
) -> anyhow::Result<EngineWriteAmplificationReport> {
    if let Some(live) = arguments
        .live
        .iter()
        .find(|live| !(**live > 0.0 && **live < 1.0))
    {
        anyhow::bail!("--live {live} is not a fraction strictly between 0 and 1");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut cells = Vec::new();
    for &live in &arguments.live {
        for &workload in &arguments.workloads {
            eprintln!("live {live} {}", workload.name());
            cells.push(runtime.block_on(measure_cell(arguments, live, workload))?);
        }
    }
    Ok(EngineWriteAmplificationReport {
        pool_size_bytes: arguments.pool_size,
        segment_size_bytes: SEGMENT_SIZE_BYTES,
        warm_up_passes: WARM_UP_PASSES,
        passes: arguments.passes,
        zipf_theta: arguments.zipf_theta,
        cells,
    })
}

impl EngineWriteAmplificationReport {
    /// The human-readable table, one row per cell.
    pub fn table(&self) -> String {
        let mut out = format!(
            "pool {} MiB, {} MiB segments, {} measured passes after {} warm-up passes\n",
            self.pool_size_bytes >> 20,
            self.segment_size_bytes >> 20,
            self.passes,
            self.warm_up_passes
        );
        out.push_str(&format!(
            "{:>6} {:>20} {:>14} {:>14} {:>14}\n",
            "live", "workload", "WA (measured)", "relocated/blk", "greedy bound"
        ));
        for cell in &self.cells {
            let workload = match cell.workload {
                Workload::Uniform => cell.workload.name().to_owned(),
                _ => format!("{}:{}", cell.workload.name(), self.zipf_theta),
            };
            out.push_str(&format!(
                "{:>6.2} {:>20} {:>14.2} {:>14.2} {:>14}\n",
                cell.live_fraction,
                workload,
                cell.write_amplification,
                cell.relocated_per_client_block,
                cell.greedy_bound
                    .map_or_else(|| "-".to_owned(), |bound| format!("{bound:.2}"))
            ));
            if let Some(details) = &cell.details {
                out.push_str(&details.lines());
            }
        }
        out
    }
}

impl CellDetails {
    fn lines(&self) -> String {
        let mut out = format!(
            "  checkpoints: {}\n  blocks overwritten at least once: {:.1}%\n  segments {}, reserved {}, mean free {:.1}, mean dead {:.1}\n",
            self.checkpoints,
            self.blocks_overwritten_percent,
            self.segment_count,
            self.reserved_segment_count,
            self.mean_free_segments,
            self.mean_dead_segments
        );
        for stream in &self.victims {
            out.push_str(&format!(
                "  stream {}: {} victims, mean live fraction {:.3}\n",
                stream.stream, stream.victims, stream.mean_live_fraction
            ));
        }
        out
    }
}

/// A float already rounded by the caller as a `u64`, saturating (as `as` does).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn saturating_u64(rounded: f64) -> u64 {
    rounded as u64
}

fn main() -> anyhow::Result<()> {
    let arguments = EngineWriteAmplificationArgs::parse();
    let report = measure(&arguments)?;
    if arguments.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The report as JSON, with `fields` present at its top level.
    fn json_with(report: &impl serde::Serialize, fields: &[&str]) -> serde_json::Value {
        let document = serde_json::to_value(report).expect("serialises");
        for field in fields {
            assert!(
                document.get(field).is_some(),
                "JSON lacks `{field}`: {document}"
            );
        }
        document
    }

    #[test]
    fn engine_write_amplification_reports_every_cell() {
        let arguments = EngineWriteAmplificationArgs::try_parse_from([
            "engine_write_amplification",
            "--pool-size",
            "32M",
            "--passes",
            "1",
            "--live",
            "0.5",
            "--workloads",
            "uniform,zipf-permuted",
            "--verbose",
        ])
        .expect("parses");
        let report = measure(&arguments).expect("measures");
        let table = report.table();
        assert!(table.contains("WA (measured)"), "{table}");
        assert!(table.contains("zipf-permuted:0.99"), "{table}");
        assert!(
            table.contains("blocks overwritten at least once"),
            "{table}"
        );
        let document = json_with(&report, &["pool_size_bytes", "passes", "cells"]);
        let cells = document["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 2);
        assert_eq!(cells[0]["workload"], "uniform");
        assert!(cells[0]["greedy_bound"].is_f64());
        assert!(cells[1]["greedy_bound"].is_null());
        for cell in cells {
            assert!(cell["write_amplification"].as_f64().unwrap() >= 1.0);
        }
    }
}
