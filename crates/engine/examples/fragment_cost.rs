//! The CPU cost per 4 KiB block of packed fragments (issue 44, decision
//! 0070): encoding with lz4, zstd:1 and zstd:3 (the codec, early abort, the
//! header and both crc32c), and decoding a fragment from the blocks its
//! location touches (the outer crc32c, the header checks, the codec, the
//! inner crc32c), on real data: the files under /usr/lib cut into 4 KiB
//! blocks. Beside them, in the same run, the work an uncompressed cache hit
//! does with the block (a 4 KiB copy), so that the difference is what issue
//! 44's goal 3 bounds (a compressed hit may cost at most 1 µs more CPU).
//! Then cache hits through the real `MemoryCache`, in a shuffled order: an
//! uncompressed hit (the block copied out and its checksum checked, as the
//! read path does), a hit on packed blocks (copied out and decoded, as before
//! decision 0075) and a hit on a decoded copy (decision 0075).
//! Medians of `ROUND_COUNT` rounds, one thread, in the thread's CPU time
//! (Linux's `/proc/thread-self/schedstat`).
//!
//!     cargo run --release -p lamina-engine --example fragment_cost

use std::path::Path;

use lamina_engine::BLOCK_BYTES;
use lamina_engine::log::data_layout::{DataLayout, Placement};
use lamina_engine::log::fragment::{EncodedBlock, FragmentDecoder, FragmentEncoder};
use lamina_engine::log::location::Location;
use lamina_engine::tier::memory_cache::MemoryCache;
use lamina_reduction::Codec;
use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::SmallRng};

/// How much of /usr/lib the run reads.
const DATA_BYTES: usize = 64 << 20;
/// The largest share of the data one file gives, so that many kinds are in.
const FILE_BYTES_MAX: usize = 4 << 20;
const ROUND_COUNT: usize = 3;
const DATA_DIRECTORY: &str = "/usr/lib";
const CODEC_NAMES: [&str; 3] = ["lz4", "zstd:1", "zstd:3"];
/// Where the data region starts on the pretend device.
const REGION_FIRST_BLOCK: u64 = 0;
/// Where the uncompressed copies of the blocks start on the pretend device.
const WHOLE_FIRST_BLOCK: u64 = 1 << 30;
/// The memory cache of the hit rounds: every block whole, packed and decoded.
const CACHE_BYTES: u64 = 4 * DATA_BYTES as u64;

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

/// The order the hit rounds visit blocks or fragments in.
fn shuffled(count: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..count).collect();
    order.shuffle(&mut SmallRng::seed_from_u64(44));
    order
}

/// CPU time per hit of `hit` over `order`.
fn hit_round(order: &[usize], mut hit: impl FnMut(usize)) -> f64 {
    let started = thread_cpu_nanoseconds();
    for &index in order {
        hit(index);
    }
    (thread_cpu_nanoseconds() - started) as f64 / order.len() as f64
}

/// What a hit costs per block: uncompressed, packed (decoded on each hit)
/// and decoded (decision 0075), medians in ns.
struct HitCosts {
    uncompressed: f64,
    packed: f64,
    decoded: f64,
}

fn hit_costs(packed: &Packed, blocks: &[[u8; BLOCK_BYTES]]) -> HitCosts {
    let cache = MemoryCache::new(CACHE_BYTES);
    let checksums: Vec<u32> = blocks.iter().map(|block| crc32c::crc32c(block)).collect();
    for (block, number) in blocks.iter().zip(WHOLE_FIRST_BLOCK..) {
        cache.insert(number, block);
    }
    for (contents, number) in packed
        .region
        .chunks_exact(BLOCK_BYTES)
        .zip(REGION_FIRST_BLOCK..)
    {
        cache.insert(number, contents);
    }
    let mut decoder = FragmentDecoder::new().expect("a codec context");
    let mut output = [0; BLOCK_BYTES];
    for (&location, &checksum) in packed.locations.iter().zip(&packed.checksums) {
        decoder
            .decode(location, packed.touched(location), checksum, &mut output)
            .expect("decode");
        for _ in 0..2 {
            let generation = cache.generation(location.block());
            cache.offer_decoded(location, checksum, &output, generation);
        }
    }
    let whole_order = shuffled(blocks.len());
    let fragment_order = shuffled(packed.locations.len());
    let mut touched = [0u8; 2 * BLOCK_BYTES];
    let mut uncompressed = Vec::new();
    let mut packed_hits = Vec::new();
    let mut decoded = Vec::new();
    for _ in 0..ROUND_COUNT {
        uncompressed.push(hit_round(&whole_order, |index| {
            let hit = cache.get(WHOLE_FIRST_BLOCK + index as u64, &mut output)
                && crc32c::crc32c(&output) == checksums[index];
            assert!(hit, "block {index} is cached");
        }));
        packed_hits.push(hit_round(&fragment_order, |index| {
            let location = packed.locations[index];
            let touched = &mut touched[..location.block_count() as usize * BLOCK_BYTES];
            for (contents, number) in touched
                .chunks_exact_mut(BLOCK_BYTES)
                .zip(location.block()..)
            {
                assert!(
                    cache.get(number, contents),
                    "packed block {number} is cached"
                );
            }
            decoder
                .decode(location, touched, packed.checksums[index], &mut output)
                .expect("decode");
        }));
        decoded.push(hit_round(&fragment_order, |index| {
            let hit = cache.get_decoded(
                packed.locations[index],
                packed.checksums[index],
                &mut output,
            );
            assert!(hit, "fragment {index} is cached decoded");
        }));
    }
    HitCosts {
        uncompressed: median(uncompressed),
        packed: median(packed_hits),
        decoded: median(decoded),
    }
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
    let mut hits = Vec::new();
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
        hits.push((name, hit_costs(&packed, &blocks)));
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
    println!(
        "cache hits, ns: codec  uncompressed  packed (decode per hit)  decoded (0075)  decoded - uncompressed"
    );
    for (name, costs) in hits {
        println!(
            "                {name:7} {:12.0}  {:23.0}  {:14.0}  {:21.0}",
            costs.uncompressed,
            costs.packed,
            costs.decoded,
            costs.decoded - costs.uncompressed
        );
    }
}
