//! `cargo run --release -p lamina-engine --example array_write_cost --` (formerly `lamina bench array-write-cost`;
//! decision 0060): what 4 KiB random writes cost on a tier of
//! several devices (issue 18), with the engine in process on memory devices:
//! one device, a raid6 array of 4+2, raid5 of 3+1 and mirrors of 2 and 3,
//! with a flush after every 1, 16 or 128 writes. Per configuration it reports
//! member bytes written ÷ client bytes written (split between the log and the
//! fixed metadata: superblock, flush markers, checkpoints, which an array
//! mirrors on every member), the bytes read from the members while clients
//! only write (no read-modify-write: 0), the log space a client block takes
//! with the padding of each batch's last row, and the ratio to one device
//! measured side by side in the same run. Every device, single or member, is
//! behind the same byte counter ([`CountingDevice`]), and so is the array as
//! the engine sees it, so padding is what the members got beyond what the
//! engine wrote. The pools are sized so that the cleaner never runs (its
//! relocations are reported, and would show as reads).

mod support;

use support::counting_device::{ByteCounts, CountingDevice};
use support::{median, runtime};

use std::sync::Arc;
use std::time::Instant;

use clap::{Parser, ValueEnum};
use lamina_api::size::parse_size;
use lamina_device::{BlockDevice, MemoryDevice};
use lamina_engine::log::geometry::DATA_START_BLOCK;
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits, PoolOptions};
use lamina_layout::{ArrayIdentity, LABEL_AREA_BLOCKS, MemberDevice, Redundancy, TierRole};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// Segment size of every pool: 768 blocks, whole rows of 4 (raid6 4+2), 3
/// (raid5 3+1) and 1 (mirrors, one device), so all configurations share it.
const SEGMENT_SIZE_BYTES: u64 = 3 << 20;
/// Writes (with the cell's flush pattern) before measuring: the pool's first
/// batches and volume creation stay out of the figures.
const WARM_UP_WRITES: u64 = 1024;
/// Log blocks a client write takes at most: flushed alone on raid6, the
/// block and two summary copies padded to a row of four.
const LOG_BLOCKS_PER_WRITE_MAX: u64 = 4;
/// Segments beyond the log's worst case, so that the cleaner never starts.
const SPARE_SEGMENTS: u64 = 32;
/// Background flushes and checkpoints by time are pushed beyond the run, so
/// that only the cell's own flushes count (checkpoints by log volume stay).
const BACKGROUND_INTERVAL_MS: u64 = 3_600_000;
/// Shared by every array the benchmark builds.
const ARRAY_IDENTIFIER: u128 = 18;

/// The devices under the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Configuration {
    /// One memory device, no array.
    Single,
    /// raid6 over six members: four data and two parity columns per row.
    Raid6,
    /// raid5 over four members: three data columns and one parity.
    Raid5,
    /// Two copies.
    Mirror2,
    /// Three copies (survives two lost devices, like raid6).
    Mirror3,
}

impl Configuration {
    pub fn name(self) -> &'static str {
        match self {
            Self::Single => "one device",
            Self::Raid6 => "raid6 4+2",
            Self::Raid5 => "raid5 3+1",
            Self::Mirror2 => "mirror 2",
            Self::Mirror3 => "mirror 3",
        }
    }

    /// The array's scheme and member count; `None` for one plain device.
    fn array(self) -> Option<(Redundancy, usize)> {
        match self {
            Self::Single => None,
            Self::Raid6 => Some((Redundancy::Raid6, 6)),
            Self::Raid5 => Some((Redundancy::Raid5, 4)),
            Self::Mirror2 => Some((Redundancy::Mirror, 2)),
            Self::Mirror3 => Some((Redundancy::Mirror, 3)),
        }
    }

    pub fn member_count(self) -> usize {
        self.array().map_or(1, |(_, members)| members)
    }

    pub fn data_columns(self) -> usize {
        self.array()
            .map_or(1, |(redundancy, members)| redundancy.data_columns(members))
    }
}

/// In process on memory devices: what 4 KiB random writes cost on arrays.
#[derive(Debug, Clone, Parser)]
pub struct ArrayWriteCostArgs {
    /// Configurations, measured side by side in each run (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = vec![
        Configuration::Single, Configuration::Raid6, Configuration::Raid5,
        Configuration::Mirror2, Configuration::Mirror3])]
    pub configurations: Vec<Configuration>,
    /// A flush after every this many writes (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 16, 128])]
    pub flush_every: Vec<u64>,
    /// 4 KiB random writes measured per cell (rounded up to whole flushes).
    #[arg(long, default_value_t = 16_384)]
    pub writes: u64,
    /// Size of the volume the writes land in, uniformly (e.g. 64M).
    #[arg(long, value_parser = parse_size, default_value = "64M")]
    pub volume_size: u64,
    /// Runs; each measures every cell once, with its own random blocks.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
    pub runs: u64,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// One measurement: one configuration, one flush interval, one run.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub configuration: Configuration,
    pub flush_every: u64,
    pub run: u64,
    pub client_bytes: u64,
    /// What the engine wrote to and read from the device it sees (the array).
    pub engine: ByteCounts,
    /// What the members (or the one device) got, summed.
    pub members: ByteCounts,
    pub relocated_blocks: u64,
    pub seconds: f64,
}

impl Measurement {
    fn per_client_block(&self, bytes: u64) -> f64 {
        bytes as f64 / self.client_bytes as f64
    }

    pub fn write_amplification(&self) -> f64 {
        self.per_client_block(self.members.written_bytes())
    }

    /// Log blocks per client block, padding included: the members' log
    /// bytes scaled back from whole rows to their data columns.
    pub fn log_space_per_client_block(&self) -> f64 {
        let data_share =
            self.configuration.data_columns() as f64 / self.configuration.member_count() as f64;
        self.per_client_block(self.members.log_written_bytes) * data_share
    }

    /// Log blocks per client block that the engine wrote (no padding).
    pub fn engine_log_per_client_block(&self) -> f64 {
        self.per_client_block(self.engine.log_written_bytes)
    }
}

/// The medians of one configuration at one flush interval, over the runs.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub configuration: Configuration,
    pub flush_every: u64,
    pub member_count: usize,
    pub data_columns: usize,
    /// Member bytes written ÷ client bytes written.
    pub write_amplification: f64,
    pub log_write_amplification: f64,
    pub metadata_write_amplification: f64,
    /// Largest over the runs; 0 means no read-modify-write.
    pub member_read_bytes_max: u64,
    pub engine_log_blocks_per_client_block: f64,
    pub log_space_blocks_per_client_block: f64,
    /// Log space lost to the zeros that fill each batch's last row.
    pub padding_blocks_per_client_block: f64,
    /// Member writes the padding costs per client block (its rows' share).
    pub padding_write_amplification: f64,
    pub relocated_blocks_per_client_block: f64,
    pub writes_per_second: f64,
    /// members ÷ data columns: the ratio to one device of full rows.
    pub full_row_ratio: f64,
    /// Per-run ratios of write amplification to one device's, median.
    pub ratio_to_single: Option<f64>,
    /// full_row_ratio × one device's write amplification + the padding's
    /// write cost (the goal), median over runs.
    pub goal_write_amplification: Option<f64>,
    pub write_amplification_runs: Vec<f64>,
}

/// What the array-write-cost benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct ArrayWriteCostReport {
    pub writes_per_cell: u64,
    pub warm_up_writes: u64,
    pub volume_size_bytes: u64,
    pub segment_size_bytes: u64,
    pub runs: u64,
    pub summaries: Vec<Summary>,
    pub measurements: Vec<Measurement>,
}

/// A pool on the devices of one configuration, and their counters.
struct Target {
    pool: Pool,
    /// The device the engine writes (the array, or the one device).
    engine_device: Arc<CountingDevice>,
    members: Vec<Arc<CountingDevice>>,
}

impl Target {
    fn member_counts(&self) -> ByteCounts {
        ByteCounts::sum(self.members.iter().map(|member| member.counts()))
    }
}

/// Bytes of array (or device) space the log needs so that the cleaner never
/// runs: every write at its worst, and spare segments.
fn data_bytes_needed(arguments: &ArrayWriteCostArgs) -> u64 {
    let blocks = (WARM_UP_WRITES + arguments.writes + 128) * LOG_BLOCKS_PER_WRITE_MAX;
    (blocks * BLOCK_SIZE_BYTES).next_multiple_of(SEGMENT_SIZE_BYTES)
        + SPARE_SEGMENTS * SEGMENT_SIZE_BYTES
}

fn limits() -> PoolLimits {
    PoolLimits {
        checkpoint_interval_ms: BACKGROUND_INTERVAL_MS,
        flush_interval_ms: BACKGROUND_INTERVAL_MS,
        ..PoolLimits::default()
    }
}

/// The device the engine sees for `configuration`, its members (counted),
/// and its data blocks per row.
async fn devices(
    configuration: Configuration,
    data_bytes: u64,
) -> anyhow::Result<(Arc<dyn BlockDevice>, Vec<Arc<CountingDevice>>, u64)> {
    let metadata_bytes = DATA_START_BLOCK * BLOCK_SIZE_BYTES;
    let Some((redundancy, member_count)) = configuration.array() else {
        let memory = Arc::new(MemoryDevice::new(metadata_bytes + data_bytes));
        let device = Arc::new(CountingDevice::new(memory, metadata_bytes));
        return Ok((device.clone(), vec![device], 1));
    };
    let member_metadata_bytes = LABEL_AREA_BLOCKS * BLOCK_SIZE_BYTES + metadata_bytes;
    let member_data_bytes =
        (data_bytes / configuration.data_columns() as u64).next_multiple_of(BLOCK_SIZE_BYTES);
    let members: Vec<Arc<CountingDevice>> = (0..member_count)
        .map(|_| {
            let memory = Arc::new(MemoryDevice::new(member_metadata_bytes + member_data_bytes));
            Arc::new(CountingDevice::new(memory, member_metadata_bytes))
        })
        .collect();
    let member_devices = members
        .iter()
        .enumerate()
        .map(|(index, member)| MemberDevice {
            path: format!("memory{index}"),
            device: member.clone() as Arc<dyn BlockDevice>,
        })
        .collect();
    let identity = ArrayIdentity {
        array_identifier: ARRAY_IDENTIFIER,
        tier: TierRole::Flash,
    };
    let array =
        lamina_layout::create(identity, redundancy, DATA_START_BLOCK, member_devices).await?;
    let row_data_blocks = array.row_data_blocks();
    Ok((Arc::new(array), members, row_data_blocks))
}

async fn build(configuration: Configuration, data_bytes: u64) -> anyhow::Result<Target> {
    let (device, members, row_data_blocks) = devices(configuration, data_bytes).await?;
    let engine_device = Arc::new(CountingDevice::new(
        device,
        DATA_START_BLOCK * BLOCK_SIZE_BYTES,
    ));
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_SIZE_BYTES,
        flash_row_blocks: row_data_blocks,
        ..PoolOptions::default()
    };
    let pool = Pool::create(engine_device.clone(), options, limits()).await?;
    Ok(Target {
        pool,
        engine_device,
        members,
    })
}

/// `count` 4 KiB writes at uniformly random blocks of the volume, a flush
/// after every `flush_every`.
async fn write_randomly(
    pool: &Pool,
    volume_id: u32,
    volume_blocks: u64,
    count: u64,
    flush_every: u64,
    random: &mut SmallRng,
) -> anyhow::Result<()> {
    let mut data = vec![0u8; lamina_engine::BLOCK_BYTES];
    random.fill(&mut data[..]);
    for index in 1..=count {
        let block = random.random_range(0..volume_blocks);
        // No two writes carry the same data.
        data[..8].copy_from_slice(&index.to_le_bytes());
        pool.write(volume_id, block * BLOCK_SIZE_BYTES, &data, false)
            .await?;
        if index % flush_every == 0 {
            pool.flush().await?;
        }
    }
    pool.flush().await?;
    // The flush marker is written after the flush returns: count it here.
    pool.flush_marker_written().await;
    Ok(())
}

/// Measures one cell on a fresh pool.
async fn measure_cell(
    arguments: &ArrayWriteCostArgs,
    configuration: Configuration,
    flush_every: u64,
    run: u64,
) -> anyhow::Result<Measurement> {
    let target = build(configuration, data_bytes_needed(arguments)).await?;
    let volume_blocks = arguments.volume_size / BLOCK_SIZE_BYTES;
    let volume_id = target
        .pool
        .create_volume("cost", volume_blocks * BLOCK_SIZE_BYTES)
        .await?
        .volume_id;
    // The same blocks in the same order for every configuration of a run.
    let mut random = SmallRng::seed_from_u64(run * 1000 + flush_every);
    let warm_up = WARM_UP_WRITES.next_multiple_of(flush_every);
    let pool = &target.pool;
    write_randomly(
        pool,
        volume_id,
        volume_blocks,
        warm_up,
        flush_every,
        &mut random,
    )
    .await?;
    let count = arguments.writes.next_multiple_of(flush_every);
    let (engine_before, members_before) = (target.engine_device.counts(), target.member_counts());
    let relocated_before = pool.status().cleaner_relocated_blocks;
    let started = Instant::now();
    write_randomly(
        pool,
        volume_id,
        volume_blocks,
        count,
        flush_every,
        &mut random,
    )
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let measurement = Measurement {
        configuration,
        flush_every,
        run,
        client_bytes: count * BLOCK_SIZE_BYTES,
        engine: target.engine_device.counts().since(&engine_before),
        members: target.member_counts().since(&members_before),
        relocated_blocks: pool.status().cleaner_relocated_blocks - relocated_before,
        seconds,
    };
    target.pool.close().await?;
    Ok(measurement)
}

/// The summary of one configuration at one flush interval.
fn summarise(
    measurements: &[Measurement],
    configuration: Configuration,
    flush_every: u64,
) -> Summary {
    let cell = |candidate: &&Measurement| candidate.flush_every == flush_every;
    let own: Vec<&Measurement> = measurements
        .iter()
        .filter(cell)
        .filter(|measurement| measurement.configuration == configuration)
        .collect();
    let singles: Vec<&Measurement> = measurements
        .iter()
        .filter(cell)
        .filter(|measurement| measurement.configuration == Configuration::Single)
        .collect();
    let of = |figure: &dyn Fn(&Measurement) -> f64| {
        median(&own.iter().map(|m| figure(m)).collect::<Vec<_>>())
    };
    let full_row_ratio = configuration.member_count() as f64 / configuration.data_columns() as f64;
    let padding =
        |m: &Measurement| m.log_space_per_client_block() - m.engine_log_per_client_block();
    let paired = |figure: &dyn Fn(&Measurement, &Measurement) -> f64| {
        (singles.len() == own.len()).then(|| {
            let values: Vec<f64> = own
                .iter()
                .zip(&singles)
                .map(|(m, single)| figure(m, single))
                .collect();
            median(&values)
        })
    };
    Summary {
        configuration,
        flush_every,
        member_count: configuration.member_count(),
        data_columns: configuration.data_columns(),
        write_amplification: of(&Measurement::write_amplification),
        log_write_amplification: of(&|m| m.per_client_block(m.members.log_written_bytes)),
        metadata_write_amplification: of(&|m| m.per_client_block(m.members.metadata_written_bytes)),
        member_read_bytes_max: own.iter().map(|m| m.members.read_bytes).max().unwrap_or(0),
        engine_log_blocks_per_client_block: of(&Measurement::engine_log_per_client_block),
        log_space_blocks_per_client_block: of(&Measurement::log_space_per_client_block),
        padding_blocks_per_client_block: of(&padding),
        padding_write_amplification: of(&|m| padding(m) * full_row_ratio),
        relocated_blocks_per_client_block: of(&|m| {
            m.relocated_blocks as f64 * BLOCK_SIZE_BYTES as f64 / m.client_bytes as f64
        }),
        writes_per_second: of(&|m| m.client_bytes as f64 / BLOCK_SIZE_BYTES as f64 / m.seconds),
        full_row_ratio,
        ratio_to_single: paired(&|m, single| {
            m.write_amplification() / single.write_amplification()
        }),
        goal_write_amplification: paired(&|m, single| {
            full_row_ratio * single.write_amplification() + padding(m) * full_row_ratio
        }),
        write_amplification_runs: own.iter().map(|m| m.write_amplification()).collect(),
    }
}

/// Measures every cell, run by run, and returns the report (the CLI prints
/// it; tests inspect it).
pub fn measure(arguments: &ArrayWriteCostArgs) -> anyhow::Result<ArrayWriteCostReport> {
    anyhow::ensure!(
        arguments.flush_every.iter().all(|every| *every >= 1),
        "--flush-every takes counts of at least 1"
    );
    anyhow::ensure!(
        arguments.volume_size >= BLOCK_SIZE_BYTES,
        "--volume-size is smaller than a block"
    );
    let runtime = runtime(0)?;
    let mut measurements = Vec::new();
    for run in 0..arguments.runs {
        for &flush_every in &arguments.flush_every {
            for &configuration in &arguments.configurations {
                eprintln!(
                    "run {run}: {}, flush every {flush_every}",
                    configuration.name()
                );
                measurements.push(runtime.block_on(measure_cell(
                    arguments,
                    configuration,
                    flush_every,
                    run,
                ))?);
            }
        }
    }
    let summaries = arguments
        .flush_every
        .iter()
        .flat_map(|&flush_every| {
            let measurements = &measurements;
            arguments
                .configurations
                .iter()
                .map(move |&configuration| summarise(measurements, configuration, flush_every))
        })
        .collect();
    Ok(ArrayWriteCostReport {
        writes_per_cell: arguments.writes,
        warm_up_writes: WARM_UP_WRITES,
        volume_size_bytes: arguments.volume_size,
        segment_size_bytes: SEGMENT_SIZE_BYTES,
        runs: arguments.runs,
        summaries,
        measurements,
    })
}

fn optional(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |value| format!("{value:.2}"))
}

impl ArrayWriteCostReport {
    /// The human-readable table: one block per flush interval.
    pub fn table(&self) -> String {
        let mut out = format!(
            "4 KiB random writes over {} MiB, {} per cell after {} warm-up, {} MiB segments, medians of {} runs\n\
             WA: member bytes written / client bytes (log + metadata); goal: full-row ratio x one device's WA + padding\n",
            self.volume_size_bytes >> 20,
            self.writes_per_cell,
            self.warm_up_writes,
            self.segment_size_bytes >> 20,
            self.runs
        );
        let mut flush_every = None;
        for summary in &self.summaries {
            if flush_every != Some(summary.flush_every) {
                flush_every = Some(summary.flush_every);
                out.push_str(&format!(
                    "flush every {} writes:\n{:<11} {:>6} {:>6} {:>6} {:>7} {:>6} {:>10} {:>10} {:>8} {:>8} {:>9}\n",
                    summary.flush_every,
                    "devices", "WA", "log", "meta", "/ one", "goal", "reads (B)",
                    "space/blk", "pad/blk", "reloc", "writes/s"
                ));
            }
            out.push_str(&summary.line());
        }
        out
    }
}

impl Summary {
    fn line(&self) -> String {
        format!(
            "{:<11} {:>6.2} {:>6.2} {:>6.2} {:>7} {:>6} {:>10} {:>10.3} {:>8.3} {:>8.3} {:>9.0}\n",
            self.configuration.name(),
            self.write_amplification,
            self.log_write_amplification,
            self.metadata_write_amplification,
            optional(self.ratio_to_single),
            optional(self.goal_write_amplification),
            self.member_read_bytes_max,
            self.log_space_blocks_per_client_block,
            self.padding_blocks_per_client_block,
            self.relocated_blocks_per_client_block,
            self.writes_per_second
        )
    }
}

fn main() -> anyhow::Result<()> {
    let arguments = ArrayWriteCostArgs::parse();
    let report = measure(&arguments)?;
    support::print_report(&report, &report.table(), arguments.json)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_write_cost_reports_every_cell_without_member_reads() {
        let arguments = ArrayWriteCostArgs::try_parse_from([
            "array_write_cost",
            "--configurations",
            "single,raid6,raid5",
            "--flush-every",
            "1,16",
            "--writes",
            "256",
            "--volume-size",
            "4M",
            "--runs",
            "1",
        ])
        .expect("parses");
        let report = measure(&arguments).expect("measures");
        let table = report.table();
        assert!(table.contains("flush every 16 writes:"), "{table}");
        assert!(table.contains("raid6 4+2"), "{table}");
        let document =
            support::json_with(&report, &["writes_per_cell", "summaries", "measurements"]);
        let summaries = document["summaries"].as_array().unwrap();
        assert_eq!(summaries.len(), 6);
        for summary in summaries {
            // Whole rows only: nothing is read while clients write.
            assert_eq!(summary["member_read_bytes_max"], 0, "{summary}");
            assert!(summary["write_amplification"].as_f64().unwrap() >= 1.0);
        }
        let raid6_flushing_each_write = &summaries[1];
        assert_eq!(raid6_flushing_each_write["configuration"], "raid6");
        // A lone block and its two summary copies fill three of a row's four
        // data blocks: one block of padding per write.
        assert_eq!(
            raid6_flushing_each_write["padding_blocks_per_client_block"],
            1.0
        );
        assert!(
            raid6_flushing_each_write["ratio_to_single"]
                .as_f64()
                .unwrap()
                >= 1.5
        );
    }
}
