//! The CPU cost per 4 KiB block of packed fragments (issue 44, decision
//! 0070): encoding with lz4, zstd:1 and zstd:3 (the codec, early abort, the
//! header and both crc32c), and decoding a fragment from the blocks its
//! location touches (the outer crc32c, the header checks, the codec, the
//! inner crc32c), on real data: the files under /usr/lib cut into 4 KiB
//! blocks. Beside them, in the same run, the work an uncompressed cache hit
//! does with the block (a 4 KiB copy), so that the difference is what issue
//! 44's goal 3 bounds (a compressed hit may cost at most 1 µs more CPU).
//! Medians of `ROUND_COUNT` rounds, one thread, in the thread's CPU time
//! (Linux's `/proc/thread-self/schedstat`).
//!
//!     cargo run --release -p lamina-engine --example fragment_cost

use std::path::Path;

use lamina_engine::BLOCK_BYTES;
use lamina_engine::log::data_layout::{DataLayout, Placement};
use lamina_engine::log::fragment::{EncodedBlock, FragmentDecoder, FragmentEncoder};
use lamina_engine::log::location::Location;
use lamina_reduction::Codec;

/// How much of /usr/lib the run reads.
const DATA_BYTES: usize = 64 << 20;
/// The largest share of the data one file gives, so that many kinds are in.
const FILE_BYTES_MAX: usize = 4 << 20;
const ROUND_COUNT: usize = 3;
const DATA_DIRECTORY: &str = "/usr/lib";
const CODEC_NAMES: [&str; 3] = ["lz4", "zstd:1", "zstd:3"];
/// Where the data region starts on the pretend device.
const REGION_FIRST_BLOCK: u64 = 0;

/// Files under `directory`, depth first in name order, until `limit_bytes`.
fn gather_files(directory: &Path, data: &mut Vec<u8>, limit_bytes: usize) {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return;
    };
    let mut paths: Vec<_> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    paths.sort();
    for path in paths {
        if data.len() >= limit_bytes {
            return;
        }
        let Ok(kind) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if kind.is_dir() {
            gather_files(&path, data, limit_bytes);
        } else if kind.is_file()
            && let Ok(bytes) = std::fs::read(&path)
        {
            let taken = bytes
                .len()
                .min(FILE_BYTES_MAX)
                .min(limit_bytes - data.len());
            data.extend_from_slice(&bytes[..taken]);
        }
    }
}

fn real_blocks() -> Vec<[u8; BLOCK_BYTES]> {
    let mut data = Vec::with_capacity(DATA_BYTES);
    gather_files(Path::new(DATA_DIRECTORY), &mut data, DATA_BYTES);
    data.chunks_exact(BLOCK_BYTES)
        .map(|chunk| chunk.try_into().expect("a whole block"))
        .collect()
}

/// One codec's fragments, end to end in one data region as
/// `log::data_layout` places them (without the batch's block limit, which
/// does not change the work per fragment).
struct Packed {
    region: Vec<u8>,
    locations: Vec<Location>,
    checksums: Vec<u32>,
}

impl Packed {
    /// The bytes of the blocks `location` touches.
    fn touched(&self, location: Location) -> &[u8] {
        let first =
            usize::try_from(location.block() - REGION_FIRST_BLOCK).expect("small") * BLOCK_BYTES;
        &self.region[first..first + location.block_count() as usize * BLOCK_BYTES]
    }
}

/// Encodes every block and lays the fragments out; the time per block.
fn encode_round(codec: Codec, blocks: &[[u8; BLOCK_BYTES]]) -> (f64, Packed) {
    let mut encoder = FragmentEncoder::new(codec).expect("a codec context");
    let mut layout = DataLayout::new();
    let mut packed = Packed {
        region: Vec::new(),
        locations: Vec::new(),
        checksums: Vec::new(),
    };
    let started = thread_cpu_nanoseconds();
    for block in blocks {
        let EncodedBlock::Fragment(fragment) = encoder.encode(block).expect("encode") else {
            continue;
        };
        let Placement::Fragment {
            data_index,
            unit_offset,
            unit_count,
        } = layout.place_fragment(fragment.unit_count())
        else {
            unreachable!("a fragment is placed as one");
        };
        let location = Location::fragment(
            REGION_FIRST_BLOCK + u64::from(data_index),
            unit_offset,
            unit_count,
        );
        packed
            .region
            .resize(layout.block_count() as usize * BLOCK_BYTES, 0);
        let start = data_index as usize * BLOCK_BYTES + location.byte_range().start;
        packed.region[start..start + fragment.bytes().len()].copy_from_slice(fragment.bytes());
        packed.locations.push(location);
        packed.checksums.push(fragment.checksum());
    }
    let nanoseconds = (thread_cpu_nanoseconds() - started) as f64 / blocks.len() as f64;
    (nanoseconds, packed)
}

/// Decodes every fragment; the time per fragment.
fn decode_round(packed: &Packed) -> f64 {
    let mut decoder = FragmentDecoder::new().expect("a codec context");
    let mut output = [0; BLOCK_BYTES];
    let started = thread_cpu_nanoseconds();
    for (&location, &checksum) in packed.locations.iter().zip(&packed.checksums) {
        decoder
            .decode(location, packed.touched(location), checksum, &mut output)
            .expect("decode");
        std::hint::black_box(&output);
    }
    (thread_cpu_nanoseconds() - started) as f64 / packed.locations.len() as f64
}

/// The two crc32c a decode computes (the fragment's units, the decoded
/// block), alone: the part of a decode that is not the codec.
fn checksum_round(packed: &Packed, blocks: &[[u8; BLOCK_BYTES]]) -> f64 {
    let started = thread_cpu_nanoseconds();
    for (location, block) in packed.locations.iter().zip(blocks) {
        let fragment = &packed.touched(*location)[location.byte_range()];
        std::hint::black_box(crc32c::crc32c(fragment) ^ crc32c::crc32c(block));
    }
    (thread_cpu_nanoseconds() - started) as f64 / packed.locations.len() as f64
}

/// A 4 KiB copy per block: what an uncompressed cache hit does with the data.
fn copy_round(blocks: &[[u8; BLOCK_BYTES]]) -> f64 {
    let mut output = [0; BLOCK_BYTES];
    let started = thread_cpu_nanoseconds();
    for block in blocks {
        output.copy_from_slice(std::hint::black_box(block));
        std::hint::black_box(&output);
    }
    (thread_cpu_nanoseconds() - started) as f64 / blocks.len() as f64
}

/// CPU time this thread has run, in nanoseconds (the scheduler's own
/// account): on a shared machine, time spent waiting for a core is not the
/// work's cost.
fn thread_cpu_nanoseconds() -> u64 {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let first = text.split_whitespace().next().expect("a first field");
    first.parse().expect("nanoseconds on a core")
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let blocks = real_blocks();
    assert!(!blocks.is_empty(), "no files under {DATA_DIRECTORY}");
    println!(
        "{} blocks ({} MiB) of {DATA_DIRECTORY}, {ROUND_COUNT} rounds, medians of CPU ns",
        blocks.len(),
        (blocks.len() * BLOCK_BYTES) >> 20
    );
    println!(
        "codec   packed%  units/fragment  encode ns/block  decode ns/fragment  of which crc32c ns  decode - copy ns"
    );
    let copy = median((0..ROUND_COUNT).map(|_| copy_round(&blocks)).collect());
    for name in CODEC_NAMES {
        let codec: Codec = name.parse().expect("a codec name");
        let mut encode_times = Vec::new();
        let mut decode_times = Vec::new();
        let mut checksum_times = Vec::new();
        let mut last = None;
        for _ in 0..ROUND_COUNT {
            let (nanoseconds, packed) = encode_round(codec, &blocks);
            encode_times.push(nanoseconds);
            decode_times.push(decode_round(&packed));
            checksum_times.push(checksum_round(&packed, &blocks));
            last = Some(packed);
        }
        let packed = last.expect("a round");
        let fragment_count = packed.locations.len();
        let decode = median(decode_times);
        println!(
            "{name:7} {:7.1}  {:14.1}  {:15.0}  {:18.0}  {:18.0}  {:16.0}",
            100.0 * fragment_count as f64 / blocks.len() as f64,
            packed
                .locations
                .iter()
                .map(|location| f64::from(location.unit_count()))
                .sum::<f64>()
                / fragment_count as f64,
            median(encode_times),
            decode,
            median(checksum_times),
            decode - copy,
        );
    }
    println!("4 KiB copy (an uncompressed hit's data work): {copy:.0} ns/block");
}
