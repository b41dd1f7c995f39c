//! Parity throughput per core (`cargo run --release -p lamina-layout --example parity`,
//! formerly `lamina bench parity`; decision 0060): how fast one core computes an array's parity and
//! restores lost columns (issue 18), for raid6 4+2 and raid5 3+1 with one
//! 4 KiB block per column, through `lamina_layout::ParityCodec` as the array
//! calls it (one row per call), through the same codec with many rows per
//! call (the codec is `reed-solomon-erasure`, GF(2^8)), and side by side
//! `reed-solomon-simd` (GF(2^16)) with its encoder and decoder kept and reset
//! between rows, the library the codec used first;
//! then the whole write path, `RedundantArray::write` of whole rows onto
//! memory members, against one memory device taking the same writes. Rates
//! are data bytes (the data columns) per second on one thread; each figure is
//! the median of several timed windows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use lamina_api::size::parse_size;
use lamina_device::{AlignedBuffer, BlockDevice, MemoryDevice};
use lamina_layout::{ArrayIdentity, MemberDevice, ParityCodec, Redundancy, TierRole};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
use serde::Serialize;

/// Bytes of one column of one row: a block.
const COLUMN_BYTES: usize = 4096;
/// Rows per call in the batched codec measurement (128 KiB columns).
const ROWS_PER_BATCHED_CALL: usize = 32;
/// Rows of random data cycled through, so that one row's bytes are not
/// always in the cache.
const DATA_ROWS: usize = 256;
/// Data bytes of each member of the arrays in the write-path measurement
/// (writes wrap around within it).
const MEMBER_DATA_BYTES: u64 = 64 << 20;
const BLOCK_SIZE_BYTES: u64 = 4096;
/// The first block of the array's rows on each member: where the engine's log starts
/// its data (`lamina_engine::log::geometry::DATA_START_BLOCK`, which this crate cannot
/// name: the engine depends on it).
const DATA_START_BLOCK: u64 = 1024;

/// Parity encode and decode throughput per core, and the array's write path.
#[derive(Debug, Clone, Parser)]
pub struct ParityArgs {
    /// Milliseconds of each timed window.
    #[arg(long, default_value_t = 500)]
    pub window_ms: u64,
    /// Timed windows per figure (the median is reported).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub windows: u64,
    /// Size of each array write in the write-path measurement.
    #[arg(long, value_parser = parse_size, default_value = "128K")]
    pub write_size: u64,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Rates of one operation, in data bytes per second (medians).
#[derive(Debug, Clone, Serialize)]
pub struct OperationRates {
    pub operation: String,
    /// `ParityCodec`, one 4 KiB row per call (as the array calls it).
    pub codec_per_row: f64,
    /// `ParityCodec`, [`ROWS_PER_BATCHED_CALL`] rows per call.
    pub codec_batched: f64,
    /// `reed-solomon-simd` with its encoder or decoder reused, one row per
    /// call: the other library, side by side.
    pub reused_per_row: f64,
}

/// The whole array write path.
#[derive(Debug, Clone, Serialize)]
pub struct WritePath {
    pub write_bytes: u64,
    /// Client bytes per second through `RedundantArray::write`.
    pub array_bytes_per_second: f64,
    /// The same writes to one memory device.
    pub single_device_bytes_per_second: f64,
    /// Share of the array's write time that per-row encoding would take at
    /// the `codec_per_row` rate.
    pub encode_share: f64,
}

/// Everything measured for one scheme.
#[derive(Debug, Clone, Serialize)]
pub struct SchemeReport {
    pub scheme: String,
    pub data_columns: usize,
    pub parity_columns: usize,
    pub operations: Vec<OperationRates>,
    pub write_path: WritePath,
}

/// What the parity benchmark measured.
#[derive(Debug, Clone, Serialize)]
pub struct ParityReport {
    pub column_bytes: usize,
    pub rows_per_batched_call: usize,
    pub window_ms: u64,
    pub windows: u64,
    pub schemes: Vec<SchemeReport>,
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    if !values.len().is_multiple_of(2) {
        values[middle]
    } else {
        (values[middle - 1] + values[middle]) / 2.0
    }
}

/// The median over `windows` windows of `bytes_per_call` × calls per second.
fn rate(
    arguments: &ParityArgs,
    bytes_per_call: usize,
    mut call: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let window = Duration::from_millis(arguments.window_ms);
    let mut rates = Vec::new();
    let mut index = 0;
    for _ in 0..arguments.windows {
        let started = Instant::now();
        let mut calls = 0u64;
        while started.elapsed() < window {
            call(index)?;
            index += 1;
            calls += 1;
        }
        rates.push(calls as f64 * bytes_per_call as f64 / started.elapsed().as_secs_f64());
    }
    Ok(median(rates))
}

/// Random rows: `columns` columns of `rows × COLUMN_BYTES` bytes each.
struct Rows {
    columns: Vec<Vec<u8>>,
}

impl Rows {
    fn random(columns: usize, rows: usize, seed: u64) -> Self {
        let mut random = SmallRng::seed_from_u64(seed);
        let columns = (0..columns)
            .map(|_| {
                let mut column = vec![0u8; rows * COLUMN_BYTES];
                random.fill(&mut column[..]);
                column
            })
            .collect();
        Self { columns }
    }

    /// Rows `first..first + count` of every column.
    fn slice(&self, first: usize, count: usize) -> Vec<&[u8]> {
        let range = first * COLUMN_BYTES..(first + count) * COLUMN_BYTES;
        self.columns
            .iter()
            .map(|column| &column[range.clone()])
            .collect()
    }
}

fn encode_rates(arguments: &ParityArgs, codec: &ParityCodec) -> anyhow::Result<OperationRates> {
    let (data_columns, parity_columns) = (codec.data_columns(), codec.parity_columns());
    let data = Rows::random(data_columns, DATA_ROWS, 1);
    let row_bytes = data_columns * COLUMN_BYTES;
    let codec_per_row = rate(arguments, row_bytes, |index| {
        codec.encode(&data.slice(index % DATA_ROWS, 1))?;
        Ok(())
    })?;
    let batches = DATA_ROWS / ROWS_PER_BATCHED_CALL;
    let codec_batched = rate(arguments, row_bytes * ROWS_PER_BATCHED_CALL, |index| {
        codec.encode(&data.slice(
            (index % batches) * ROWS_PER_BATCHED_CALL,
            ROWS_PER_BATCHED_CALL,
        ))?;
        Ok(())
    })?;
    let mut encoder = ReedSolomonEncoder::new(data_columns, parity_columns, COLUMN_BYTES)?;
    let reused_per_row = rate(arguments, row_bytes, |index| {
        encoder.reset(data_columns, parity_columns, COLUMN_BYTES)?;
        for column in data.slice(index % DATA_ROWS, 1) {
            encoder.add_original_shard(column)?;
        }
        let result = encoder.encode()?;
        std::hint::black_box(result.recovery(0));
        Ok(())
    })?;
    Ok(OperationRates {
        operation: "encode".to_owned(),
        codec_per_row,
        codec_batched,
        reused_per_row,
    })
}

/// A row's columns (data, then parity) with the first `lost` data columns
/// gone, for `ParityCodec::reconstruct`.
fn with_lost<'a>(data: &[&'a [u8]], parity: &'a [Vec<u8>], lost: usize) -> Vec<Option<&'a [u8]>> {
    data.iter()
        .enumerate()
        .map(|(index, column)| (index >= lost).then_some(*column))
        .chain(parity.iter().map(|column| Some(column.as_slice())))
        .collect()
}

fn decode_rates(
    arguments: &ParityArgs,
    codec: &ParityCodec,
    lost: usize,
) -> anyhow::Result<OperationRates> {
    let (data_columns, parity_columns) = (codec.data_columns(), codec.parity_columns());
    let data = Rows::random(data_columns, DATA_ROWS, 2);
    let parity_of = |first: usize, count: usize| codec.encode(&data.slice(first, count));
    let parity_per_row: Vec<Vec<Vec<u8>>> = (0..DATA_ROWS)
        .map(|row| parity_of(row, 1))
        .collect::<Result<_, _>>()?;
    let batches = DATA_ROWS / ROWS_PER_BATCHED_CALL;
    let parity_batched: Vec<Vec<Vec<u8>>> = (0..batches)
        .map(|batch| parity_of(batch * ROWS_PER_BATCHED_CALL, ROWS_PER_BATCHED_CALL))
        .collect::<Result<_, _>>()?;
    let row_bytes = data_columns * COLUMN_BYTES;
    let codec_per_row = rate(arguments, row_bytes, |index| {
        let row = index % DATA_ROWS;
        codec.reconstruct(&with_lost(&data.slice(row, 1), &parity_per_row[row], lost))?;
        Ok(())
    })?;
    let codec_batched = rate(arguments, row_bytes * ROWS_PER_BATCHED_CALL, |index| {
        let batch = index % batches;
        let columns = data.slice(batch * ROWS_PER_BATCHED_CALL, ROWS_PER_BATCHED_CALL);
        codec.reconstruct(&with_lost(&columns, &parity_batched[batch], lost))?;
        Ok(())
    })?;
    // reed-solomon-simd decodes its own code: its parity, made once.
    let mut encoder = ReedSolomonEncoder::new(data_columns, parity_columns, COLUMN_BYTES)?;
    let mut simd_parity_per_row: Vec<Vec<Vec<u8>>> = Vec::with_capacity(DATA_ROWS);
    for row in 0..DATA_ROWS {
        for column in data.slice(row, 1) {
            encoder.add_original_shard(column)?;
        }
        let result = encoder.encode()?;
        simd_parity_per_row.push(result.recovery_iter().map(<[u8]>::to_vec).collect());
    }
    let mut decoder = ReedSolomonDecoder::new(data_columns, parity_columns, COLUMN_BYTES)?;
    let reused_per_row = rate(arguments, row_bytes, |index| {
        let row = index % DATA_ROWS;
        decoder.reset(data_columns, parity_columns, COLUMN_BYTES)?;
        for (column, bytes) in data.slice(row, 1).into_iter().enumerate().skip(lost) {
            decoder.add_original_shard(column, bytes)?;
        }
        for (column, bytes) in simd_parity_per_row[row].iter().enumerate().take(lost) {
            decoder.add_recovery_shard(column, bytes)?;
        }
        let result = decoder.decode()?;
        std::hint::black_box(result.restored_original(0));
        Ok(())
    })?;
    Ok(OperationRates {
        operation: format!("decode, {lost} lost"),
        codec_per_row,
        codec_batched,
        reused_per_row,
    })
}

/// Client bytes per second of `write_bytes` writes to `device`, each
/// starting where `offset_of` puts the `index`th.
async fn write_rate(
    arguments: &ParityArgs,
    device: &dyn BlockDevice,
    write_bytes: u64,
    offset_of: impl Fn(u64) -> u64,
) -> anyhow::Result<f64> {
    let mut contents = vec![0u8; usize::try_from(write_bytes)?];
    SmallRng::seed_from_u64(3).fill(&mut contents[..]);
    let buffer = Arc::new(AlignedBuffer::from_slice_padded(&contents));
    let window = Duration::from_millis(arguments.window_ms);
    let mut rates = Vec::new();
    let mut index = 0;
    for _ in 0..arguments.windows {
        let started = Instant::now();
        let mut writes = 0u64;
        while started.elapsed() < window {
            device.write(offset_of(index), buffer.clone()).await?;
            index += 1;
            writes += 1;
        }
        rates.push((writes * write_bytes) as f64 / started.elapsed().as_secs_f64());
    }
    Ok(median(rates))
}

async fn write_path(
    arguments: &ParityArgs,
    redundancy: Redundancy,
    member_count: usize,
    encode_per_row: f64,
) -> anyhow::Result<WritePath> {
    let prefix_bytes = (lamina_layout::LABEL_AREA_BLOCKS + DATA_START_BLOCK) * BLOCK_SIZE_BYTES;
    let members = (0..member_count)
        .map(|index| MemberDevice {
            path: format!("memory{index}"),
            device: Arc::new(MemoryDevice::new(prefix_bytes + MEMBER_DATA_BYTES)),
        })
        .collect();
    let identity = ArrayIdentity {
        array_identifier: 18,
        tier: TierRole::Flash,
    };
    let array = lamina_layout::create(identity, redundancy, DATA_START_BLOCK, members).await?;
    let row_blocks = array.row_data_blocks();
    let write_blocks = arguments.write_size / BLOCK_SIZE_BYTES;
    // Each write starts at a row boundary: the array pads a partial last row.
    let rows_per_write = write_blocks.div_ceil(row_blocks);
    let writes_that_fit = array.geometry().row_count / rows_per_write;
    let striped_offset = |index: u64| {
        (DATA_START_BLOCK + (index % writes_that_fit) * rows_per_write * row_blocks)
            * BLOCK_SIZE_BYTES
    };
    let array_rate = write_rate(arguments, &array, arguments.write_size, striped_offset).await?;
    let single = MemoryDevice::new(array.size_bytes());
    let single_rate = write_rate(arguments, &single, arguments.write_size, striped_offset).await?;
    Ok(WritePath {
        write_bytes: arguments.write_size,
        array_bytes_per_second: array_rate,
        single_device_bytes_per_second: single_rate,
        encode_share: array_rate / encode_per_row,
    })
}

fn measure_scheme(
    arguments: &ParityArgs,
    redundancy: Redundancy,
    member_count: usize,
) -> anyhow::Result<SchemeReport> {
    let codec = ParityCodec::new(redundancy, member_count);
    let mut operations = vec![encode_rates(arguments, &codec)?];
    for lost in 1..=codec.parity_columns() {
        operations.push(decode_rates(arguments, &codec, lost)?);
    }
    let encode_per_row = operations[0].codec_per_row;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let write_path = runtime.block_on(write_path(
        arguments,
        redundancy,
        member_count,
        encode_per_row,
    ))?;
    Ok(SchemeReport {
        scheme: format!(
            "{redundancy} {}+{}",
            codec.data_columns(),
            codec.parity_columns()
        ),
        data_columns: codec.data_columns(),
        parity_columns: codec.parity_columns(),
        operations,
        write_path,
    })
}

/// Measures both schemes and returns the report (the CLI prints it; tests
/// inspect it).
pub fn measure(arguments: &ParityArgs) -> anyhow::Result<ParityReport> {
    anyhow::ensure!(
        arguments.write_size >= BLOCK_SIZE_BYTES
            && arguments.write_size.is_multiple_of(BLOCK_SIZE_BYTES),
        "--write-size must be a whole number of 4 KiB blocks"
    );
    let mut schemes = Vec::new();
    for (redundancy, member_count) in [(Redundancy::Raid6, 6), (Redundancy::Raid5, 4)] {
        eprintln!("{redundancy} over {member_count} members");
        schemes.push(measure_scheme(arguments, redundancy, member_count)?);
    }
    Ok(ParityReport {
        column_bytes: COLUMN_BYTES,
        rows_per_batched_call: ROWS_PER_BATCHED_CALL,
        window_ms: arguments.window_ms,
        windows: arguments.windows,
        schemes,
    })
}

fn gigabytes(bytes_per_second: f64) -> f64 {
    bytes_per_second / 1e9
}

impl ParityReport {
    /// The human-readable table: GB/s of data per core, then the write path.
    pub fn table(&self) -> String {
        let mut out = format!(
            "GB/s of data bytes on one thread, {} KiB per column, medians of {} windows of {} ms\n\
             {:<12} {:<16} {:>14} {:>16} {:>14}\n",
            self.column_bytes / 1024,
            self.windows,
            self.window_ms,
            "scheme",
            "operation",
            "codec/row",
            format!("codec/{} rows", self.rows_per_batched_call),
            "simd lib/row"
        );
        for scheme in &self.schemes {
            for operation in &scheme.operations {
                out.push_str(&format!(
                    "{:<12} {:<16} {:>14.3} {:>16.3} {:>14.3}\n",
                    scheme.scheme,
                    operation.operation,
                    gigabytes(operation.codec_per_row),
                    gigabytes(operation.codec_batched),
                    gigabytes(operation.reused_per_row)
                ));
            }
        }
        out.push_str("array write path (RedundantArray::write onto memory members, whole rows):\n");
        for scheme in &self.schemes {
            let path = &scheme.write_path;
            out.push_str(&format!(
                "{:<12} {} KiB writes: {:.0} MB/s, one memory device {:.0} MB/s, per-row encoding {:.0}% of the array's time\n",
                scheme.scheme,
                path.write_bytes / 1024,
                path.array_bytes_per_second / 1e6,
                path.single_device_bytes_per_second / 1e6,
                path.encode_share * 100.0
            ));
        }
        out
    }
}

fn main() -> anyhow::Result<()> {
    let arguments = ParityArgs::parse();
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

    #[test]
    fn parity_reports_encode_and_decode_rates_and_the_write_path() {
        let arguments =
            ParityArgs::try_parse_from(["parity", "--window-ms", "20", "--windows", "1"])
                .expect("parses");
        let report = measure(&arguments).expect("measures");
        let table = report.table();
        assert!(table.contains("raid6 4+2    decode, 2 lost"), "{table}");
        assert!(table.contains("array write path"), "{table}");
        let document = serde_json::to_value(&report).expect("serialises");
        assert!(document.get("column_bytes").is_some(), "{document}");
        let schemes = document["schemes"].as_array().unwrap();
        assert_eq!(schemes.len(), 2);
        assert_eq!(schemes[0]["operations"].as_array().unwrap().len(), 3);
        assert_eq!(schemes[1]["operations"].as_array().unwrap().len(), 2);
        for scheme in schemes {
            let rate = scheme["write_path"]["array_bytes_per_second"].as_f64();
            assert!(rate.unwrap() > 0.0);
        }
    }
}
