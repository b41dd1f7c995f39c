//! `lamina reduction estimate FILE|URI`: reads an image file, a block device
//! or an NBD export (streamed by `nbdcopy URI -`, the client the tests and
//! `lamina bench` already use) and prints the compression ratio lamina would
//! reach on it per codec, writing nothing. The figures come from
//! `lamina_reduction::Estimator`; this file reads, shows progress and prints.

use std::io::Read;
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use lamina_control::size::format_size;
use lamina_reduction::Codec;
use lamina_reduction::estimate::{
    BLOCK_SIZE_BYTES, CHUNK_ALIGNMENT_BYTES, Estimate, Estimator, GROUP_SIZES_BYTES,
};

/// How much of the image is read and fed to the estimator at a time.
const READ_CHUNK_BYTES: usize = 4 << 20;
const _: () = assert!(READ_CHUNK_BYTES.is_multiple_of(CHUNK_ALIGNMENT_BYTES));

#[derive(Subcommand)]
pub enum ReductionCommand {
    /// The compression ratio lamina would reach on an image or an NBD export,
    /// per codec, with 8 KiB and 32 KiB groups beside it; writes nothing.
    Estimate(EstimateArgs),
}

#[derive(Args)]
pub struct EstimateArgs {
    /// An image file or block device, or an NBD URI (nbd://, nbds://, nbd+unix://).
    source: String,
    /// The codecs to compare, comma-separated: off, lz4, zstd, zstd:LEVEL.
    #[arg(long, value_delimiter = ',', default_value = "lz4,zstd:1,zstd:3")]
    codec: Vec<Codec>,
    /// Print the figures as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(command: ReductionCommand) -> anyhow::Result<()> {
    match command {
        ReductionCommand::Estimate(arguments) => estimate(&arguments),
    }
}

fn estimate(arguments: &EstimateArgs) -> anyhow::Result<()> {
    let mut source = Source::open(&arguments.source)?;
    let bar = progress_bar(source.length_bytes, arguments.json);
    let mut estimator = Estimator::new(&arguments.codec)?;
    let mut chunk = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let filled = read_full(&mut source.reader, &mut chunk)
            .with_context(|| format!("cannot read {}", arguments.source))?;
        if filled == 0 {
            break;
        }
        // A partial last block counts as a whole one, its tail zeros.
        let padded = filled.next_multiple_of(BLOCK_SIZE_BYTES);
        chunk[filled..padded].fill(0);
        estimator.feed(&chunk[..padded])?;
        bar.inc(u64::try_from(filled)?);
        if filled < chunk.len() {
            break;
        }
    }
    bar.finish_and_clear();
    source.finish()?;
    let estimate = estimator.finish();
    if arguments.json {
        println!("{}", serde_json::to_string_pretty(&estimate)?);
    } else {
        print_estimate(&arguments.source, &estimate);
    }
    Ok(())
}

/// The image being read: a file, or nbdcopy's output for an NBD URI.
struct Source {
    reader: Box<dyn Read>,
    /// The size when known ahead, for the progress bar.
    length_bytes: Option<u64>,
    nbdcopy: Option<Child>,
}

impl Source {
    fn open(source: &str) -> anyhow::Result<Source> {
        if source.starts_with("nbd://")
            || source.starts_with("nbds://")
            || source.starts_with("nbd+unix://")
            || source.starts_with("nbds+unix://")
        {
            return Source::open_export(source);
        }
        let mut file =
            std::fs::File::open(source).with_context(|| format!("cannot open {source}"))?;
        // Seeking to the end sizes block devices too, whose metadata says 0.
        let length_bytes = std::io::Seek::seek(&mut file, std::io::SeekFrom::End(0))
            .and_then(|length| {
                std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0)).map(|_| length)
            })
            .ok();
        Ok(Source {
            reader: Box::new(std::io::BufReader::with_capacity(READ_CHUNK_BYTES, file)),
            length_bytes,
            nbdcopy: None,
        })
    }

    fn open_export(uri: &str) -> anyhow::Result<Source> {
        let length_bytes = Command::new("nbdinfo")
            .args(["--size", uri])
            .stderr(Stdio::inherit())
            .output()
            .ok()
            .filter(|output| output.status.success())
            .and_then(|output| String::from_utf8(output.stdout).ok())
            .and_then(|text| text.trim().parse::<u64>().ok());
        let mut child = Command::new("nbdcopy")
            .args([uri, "-"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot run nbdcopy (from libnbd) to read the export")?;
        let stdout = child.stdout.take().expect("stdout was piped");
        Ok(Source {
            reader: Box::new(stdout),
            length_bytes,
            nbdcopy: Some(child),
        })
    }

    /// Waits for nbdcopy: a copy that failed midway is an error, not a short image.
    fn finish(self) -> anyhow::Result<()> {
        drop(self.reader);
        if let Some(mut child) = self.nbdcopy {
            let status = child.wait().context("waiting for nbdcopy")?;
            anyhow::ensure!(status.success(), "nbdcopy failed: {status}");
        }
        Ok(())
    }
}

/// Reads until `buffer` is full or the input ends; the count read.
fn read_full(reader: &mut dyn Read, buffer: &mut [u8]) -> std::io::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match reader.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(count) => filled += count,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(filled)
}

/// A bar on stderr; indicatif draws nothing when stderr is not a terminal.
fn progress_bar(length_bytes: Option<u64>, json: bool) -> ProgressBar {
    if json {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(length_bytes.unwrap_or(0));
    bar.set_style(
        ProgressStyle::with_template(
            "estimate [{bar:40}] {percent:>3}% {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}

fn print_estimate(source: &str, estimate: &Estimate) {
    println!("image                {source}");
    println!(
        "logical              {} ({} blocks of {} B)",
        format_size(estimate.logical_bytes),
        estimate.block_count,
        estimate.block_size_bytes
    );
    println!(
        "zero blocks          {} (never stored)",
        estimate.zero_block_count
    );
    println!("data                 {}", format_size(estimate.data_bytes));
    println!(
        "packing unit         {} B: each compressed block rounded up to it",
        estimate.packing_unit_bytes
    );
    println!();
    println!(
        "{:<9} {:>10} {:>7} {:>9} {:>8} {:>8} {:>12} {:>12} {:>10}",
        "codec",
        "physical",
        "ratio",
        "unrounded",
        "8K group",
        "32K group",
        "compress",
        "decompress",
        "+dedup"
    );
    for codec in &estimate.codecs {
        let alone = codec.blocks_alone();
        println!(
            "{:<9} {:>10} {:>7.3} {:>9.3} {:>8.3} {:>9.3} {:>7.0} MiB/s {:>6.0} MiB/s {:>10.3}",
            codec.codec.to_string(),
            format_size(alone.packed_bytes),
            alone.ratio,
            alone.unrounded_ratio,
            codec.groups[1].ratio,
            codec.groups[2].ratio,
            alone.compress_mib_per_second,
            codec.decompress_mib_per_second,
            codec.with_dedup.ratio,
        );
    }
    println!();
    println!(
        "ratio: data / physical, each 4 KiB block compressed alone (early abort: a block that \
         saves less than 1/8 is stored as is); unrounded: laid end to end, no packing unit; \
         8K/32K group: {} and {} consecutive blocks compressed as one.",
        GROUP_SIZES_BYTES[1] / BLOCK_SIZE_BYTES,
        GROUP_SIZES_BYTES[2] / BLOCK_SIZE_BYTES
    );
    print_dedup(estimate);
    for codec in &estimate.codecs {
        let alone = codec.blocks_alone();
        let units: Vec<String> = alone
            .packing
            .iter()
            .map(|packing| format!("{} B {:.3}", packing.unit_bytes, packing.ratio))
            .collect();
        println!(
            "{:<9} stored as is {} of {} blocks; ratio by packing unit: {}",
            codec.codec.to_string(),
            alone.stored_as_is_count,
            alone.group_count,
            units.join(", ")
        );
    }
}

/// The dedup figures: distinct blocks, and the index decision 0073 would need.
fn print_dedup(estimate: &Estimate) {
    let dedup = &estimate.dedup;
    let index = &dedup.index;
    println!("+dedup: data / physical with each distinct block stored, and compressed, once.");
    println!();
    println!(
        "dedup ratio          {:.3} ({} non-zero blocks, {} distinct, {} duplicates; {} at {:.0} MiB/s)",
        dedup.ratio,
        dedup.data_block_count,
        dedup.distinct_block_count,
        dedup.duplicate_block_count,
        dedup.fingerprint,
        dedup.fingerprint_mib_per_second
    );
    println!(
        "index memory         {} ({:.2} B per distinct block; {} at 100 TiB of distinct data)",
        format_size(index.memory_bytes),
        index.memory_bytes_per_distinct_block,
        format_size(rounded_bytes(index.memory_bytes_at_100_tib)),
    );
    println!(
        "index on flash       {} ({:.1} B per distinct block, {:.2} % of its data; {} pages)",
        format_size(index.flash_bytes),
        index.flash_bytes_per_distinct_block,
        100.0 * index.flash_bytes_per_distinct_block / 4096.0,
        index.page_count
    );
    println!();
}

#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a non-negative size to print, far below 2^64"
)]
fn rounded_bytes(bytes: f64) -> u64 {
    bytes.round() as u64
}
