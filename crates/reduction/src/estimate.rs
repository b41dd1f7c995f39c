//! The estimate behind `lamina reduction estimate`: what a volume holding an
//! image would take once compressed, per codec, without writing anything.
//! Zero blocks are counted and left out (lamina never stores them); every
//! other 4 KiB block is compressed alone with early abort and its stored form
//! rounded up to the packing unit, the way packed extents would lay it in the
//! log. The same data is also compressed in groups of consecutive blocks
//! (8 KiB and 32 KiB, as ONTAP's compression groups) to show what grouping
//! would gain, and every 4 KiB block is read back and compared, which times
//! decompression and proves the round trip on real data. Every non-zero block
//! is also fingerprinted (`dedup`): the distinct blocks give the dedup ratio,
//! and each codec's packed bytes counted over distinct blocks only (each
//! stored once, compressed once) give the combined dedup and compression
//! ratio, since a pool fingerprints a block before compressing it.

use std::time::{Duration, Instant};

use crate::block::{BlockCompressor, BlockDecompressor, CodecError, StoredForm};
use crate::codec::Codec;
use crate::dedup::{DedupCounter, DedupEstimate};

/// The engine's block: the unit compressed alone.
pub const BLOCK_SIZE_BYTES: usize = 4096;
/// The granularity compressed blocks are packed at in a batch: decision 0068
/// measured 512 B wasting 10–64 % and 16 B 0.3–2 % (Goal 1 allows 5 %).
pub const PACKING_UNIT_BYTES: usize = 16;
/// Other granularities whose rounding waste the estimate reports beside it.
pub const PACKING_UNITS_COMPARED_BYTES: [usize; 4] = [16, 128, 512, BLOCK_SIZE_BYTES];
/// Consecutive blocks compressed as one unit: alone, then two and eight.
pub const GROUP_SIZES_BYTES: [usize; 3] =
    [BLOCK_SIZE_BYTES, 2 * BLOCK_SIZE_BYTES, 8 * BLOCK_SIZE_BYTES];
/// Every chunk fed to the estimator but the last is whole largest groups.
pub const CHUNK_ALIGNMENT_BYTES: usize = 8 * BLOCK_SIZE_BYTES;
const _: () = assert!(BLOCK_SIZE_BYTES.is_multiple_of(PACKING_UNIT_BYTES));
const _: () = assert!(PACKING_UNITS_COMPARED_BYTES[0] == PACKING_UNIT_BYTES);
const _: () = assert!(CHUNK_ALIGNMENT_BYTES.is_multiple_of(GROUP_SIZES_BYTES[1]));
const _: () = assert!(CHUNK_ALIGNMENT_BYTES == GROUP_SIZES_BYTES[2]);
const MEBIBYTE_BYTES: f64 = 1_048_576.0;

/// A compressed block did not read back as the block that was compressed.
#[derive(Debug, thiserror::Error)]
pub enum EstimateError {
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("{codec}: block {block_index} did not read back as it was written")]
    RoundTrip { codec: Codec, block_index: u64 },
}

/// Feeds an image through every codec, chunk by chunk; `finish` gives the figures.
pub struct Estimator {
    codecs: Vec<CodecTally>,
    decompressor: BlockDecompressor,
    block_count: u64,
    zero_block_count: u64,
    dedup: DedupCounter,
    /// A chunk of less than `CHUNK_ALIGNMENT_BYTES` multiples was fed: it was the last.
    fed_last_chunk: bool,
    /// Whether each block of the current chunk is all zeros.
    zero_flags: Vec<bool>,
    /// Whether each block of the current chunk is the first with its content.
    first_flags: Vec<bool>,
    group: Vec<u8>,
    readback: Vec<u8>,
}

struct CodecTally {
    compressor: BlockCompressor,
    groups: Vec<GroupTally>,
    decompress_time: Duration,
    decompressed_bytes: u64,
    /// Blocks alone, packed, counting each distinct content once.
    distinct_packed_bytes: u64,
}

#[derive(Default)]
struct GroupTally {
    group_size_bytes: usize,
    data_bytes: u64,
    group_count: u64,
    stored_as_is_count: u64,
    stored_bytes: u64,
    packed_bytes_by_unit: [u64; PACKING_UNITS_COMPARED_BYTES.len()],
    compress_time: Duration,
}

impl Estimator {
    pub fn new(codecs: &[Codec]) -> Result<Estimator, EstimateError> {
        let codecs = codecs
            .iter()
            .map(|&codec| {
                Ok(CodecTally {
                    compressor: BlockCompressor::new(codec)?,
                    groups: GROUP_SIZES_BYTES
                        .iter()
                        .map(|&group_size_bytes| GroupTally {
                            group_size_bytes,
                            ..GroupTally::default()
                        })
                        .collect(),
                    decompress_time: Duration::ZERO,
                    decompressed_bytes: 0,
                    distinct_packed_bytes: 0,
                })
            })
            .collect::<Result<Vec<_>, EstimateError>>()?;
        Ok(Estimator {
            codecs,
            decompressor: BlockDecompressor::new()?,
            block_count: 0,
            zero_block_count: 0,
            dedup: DedupCounter::new(),
            fed_last_chunk: false,
            zero_flags: Vec::new(),
            first_flags: Vec::new(),
            group: Vec::with_capacity(CHUNK_ALIGNMENT_BYTES),
            readback: vec![0; BLOCK_SIZE_BYTES],
        })
    }

    /// Adds the next part of the image: whole blocks, and whole
    /// `CHUNK_ALIGNMENT_BYTES` unless it is the last (the caller pads a
    /// partial last block with zeros).
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), EstimateError> {
        assert!(
            chunk.len().is_multiple_of(BLOCK_SIZE_BYTES),
            "a chunk of {} bytes is not whole blocks",
            chunk.len()
        );
        assert!(
            !self.fed_last_chunk,
            "a chunk fed after one that was not whole groups"
        );
        self.fed_last_chunk = !chunk.len().is_multiple_of(CHUNK_ALIGNMENT_BYTES);
        let first_block_index = self.block_count;
        self.zero_flags.clear();
        self.zero_flags.extend(
            chunk
                .chunks_exact(BLOCK_SIZE_BYTES)
                .map(|block| block.iter().all(|&byte| byte == 0)),
        );
        self.block_count += u64_of(self.zero_flags.len());
        self.zero_block_count += u64_of(self.zero_flags.iter().filter(|&&zero| zero).count());
        self.first_flags.clear();
        for (block, &zero) in chunk.chunks_exact(BLOCK_SIZE_BYTES).zip(&self.zero_flags) {
            self.first_flags.push(!zero && self.dedup.add(block));
        }
        for tally_index in 0..self.codecs.len() {
            for group_index in 0..GROUP_SIZES_BYTES.len() {
                self.compress_groups(tally_index, group_index, chunk, first_block_index)?;
            }
        }
        Ok(())
    }

    /// Compresses the chunk's non-zero blocks, `GROUP_SIZES_BYTES[group_index]`
    /// of the image at a time (zero blocks inside a group are left out);
    /// blocks compressed alone are read back and compared.
    fn compress_groups(
        &mut self,
        tally_index: usize,
        group_index: usize,
        chunk: &[u8],
        first_block_index: u64,
    ) -> Result<(), EstimateError> {
        let group_size_bytes = GROUP_SIZES_BYTES[group_index];
        let blocks_per_group = group_size_bytes / BLOCK_SIZE_BYTES;
        let tally = &mut self.codecs[tally_index];
        let codec = tally.compressor.codec();
        for (group_number, group) in chunk.chunks(group_size_bytes).enumerate() {
            self.group.clear();
            for (offset, block) in group.chunks_exact(BLOCK_SIZE_BYTES).enumerate() {
                if !self.zero_flags[group_number * blocks_per_group + offset] {
                    self.group.extend_from_slice(block);
                }
            }
            if self.group.is_empty() {
                continue;
            }
            let started = Instant::now();
            let stored = tally.compressor.compress(&self.group)?;
            tally.groups[group_index].compress_time += started.elapsed();
            tally.groups[group_index].add(self.group.len(), &stored);
            if blocks_per_group == 1 && self.first_flags[group_number] {
                tally.distinct_packed_bytes +=
                    u64_of(stored.bytes().len().next_multiple_of(PACKING_UNIT_BYTES));
            }
            let StoredForm::Compressed(stored) = stored else {
                continue;
            };
            if blocks_per_group == 1 {
                let started = Instant::now();
                self.decompressor
                    .decompress(codec, stored, &mut self.readback)?;
                tally.decompress_time += started.elapsed();
                tally.decompressed_bytes += u64_of(BLOCK_SIZE_BYTES);
                if self.readback != self.group {
                    return Err(EstimateError::RoundTrip {
                        codec,
                        block_index: first_block_index + u64_of(group_number),
                    });
                }
            }
        }
        Ok(())
    }

    /// The figures for everything fed so far.
    pub fn finish(&self) -> Estimate {
        let block_size = u64_of(BLOCK_SIZE_BYTES);
        let dedup = self.dedup.finish();
        Estimate {
            block_size_bytes: BLOCK_SIZE_BYTES,
            packing_unit_bytes: PACKING_UNIT_BYTES,
            logical_bytes: self.block_count * block_size,
            block_count: self.block_count,
            zero_block_count: self.zero_block_count,
            data_bytes: (self.block_count - self.zero_block_count) * block_size,
            codecs: self
                .codecs
                .iter()
                .map(|tally| tally.estimate(&dedup))
                .collect(),
            dedup,
        }
    }
}

impl GroupTally {
    fn add(&mut self, input_length: usize, stored: &StoredForm<'_>) {
        let stored_length = stored.bytes().len();
        self.data_bytes += u64_of(input_length);
        self.group_count += 1;
        self.stored_bytes += u64_of(stored_length);
        if !stored.is_compressed() {
            self.stored_as_is_count += 1;
        }
        for (packed, unit) in self
            .packed_bytes_by_unit
            .iter_mut()
            .zip(PACKING_UNITS_COMPARED_BYTES)
        {
            *packed += u64_of(stored_length.next_multiple_of(unit));
        }
    }

    fn estimate(&self) -> GroupEstimate {
        // The packing unit is the first compared (a const assertion above).
        let packed_bytes = self.packed_bytes_by_unit[0];
        GroupEstimate {
            group_size_bytes: self.group_size_bytes,
            group_count: self.group_count,
            stored_as_is_count: self.stored_as_is_count,
            data_bytes: self.data_bytes,
            compressed_bytes: self.stored_bytes,
            packed_bytes,
            ratio: ratio(self.data_bytes, packed_bytes),
            unrounded_ratio: ratio(self.data_bytes, self.stored_bytes),
            compress_mib_per_second: mib_per_second(self.data_bytes, self.compress_time),
            packing: PACKING_UNITS_COMPARED_BYTES
                .iter()
                .zip(self.packed_bytes_by_unit)
                .map(|(&unit_bytes, packed_bytes)| UnitPacking {
                    unit_bytes,
                    packed_bytes,
                    ratio: ratio(self.data_bytes, packed_bytes),
                })
                .collect(),
        }
    }
}

impl CodecTally {
    fn estimate(&self, dedup: &DedupEstimate) -> CodecEstimate {
        let data_bytes = dedup.data_block_count * u64_of(BLOCK_SIZE_BYTES);
        CodecEstimate {
            codec: self.compressor.codec(),
            with_dedup: DedupCodecEstimate {
                packed_bytes: self.distinct_packed_bytes,
                ratio: ratio(data_bytes, self.distinct_packed_bytes),
            },
            groups: self.groups.iter().map(GroupTally::estimate).collect(),
            decompress_mib_per_second: mib_per_second(
                self.decompressed_bytes,
                self.decompress_time,
            ),
        }
    }
}

/// What an image would take, per codec and grouping.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Estimate {
    pub block_size_bytes: usize,
    pub packing_unit_bytes: usize,
    pub logical_bytes: u64,
    pub block_count: u64,
    pub zero_block_count: u64,
    /// The non-zero blocks' bytes: what a volume would store without compression.
    pub data_bytes: u64,
    pub codecs: Vec<CodecEstimate>,
    /// Distinct blocks and the fingerprint index they would need.
    pub dedup: DedupEstimate,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct CodecEstimate {
    pub codec: Codec,
    /// One per `GROUP_SIZES_BYTES`, in that order: the first is blocks alone.
    pub groups: Vec<GroupEstimate>,
    /// Blocks compressed alone, read back (those stored as is take no time).
    pub decompress_mib_per_second: f64,
    /// Blocks compressed alone, each distinct content stored once.
    pub with_dedup: DedupCodecEstimate,
}

/// Dedup and compression together: what a pool with both would store.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DedupCodecEstimate {
    /// The distinct blocks' stored forms, each rounded up to the packing unit.
    pub packed_bytes: u64,
    /// `data_bytes / packed_bytes`: the combined ratio.
    pub ratio: f64,
}

impl CodecEstimate {
    /// Blocks compressed alone, the way lamina stores them.
    pub fn blocks_alone(&self) -> &GroupEstimate {
        &self.groups[0]
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GroupEstimate {
    pub group_size_bytes: usize,
    /// Groups holding at least one non-zero block.
    pub group_count: u64,
    /// Groups whose compressed form saved too little (early abort).
    pub stored_as_is_count: u64,
    pub data_bytes: u64,
    /// Stored bytes laid end to end, no rounding.
    pub compressed_bytes: u64,
    /// Stored bytes, each group's rounded up to `PACKING_UNIT_BYTES`.
    pub packed_bytes: u64,
    /// `data_bytes / packed_bytes`.
    pub ratio: f64,
    /// `data_bytes / compressed_bytes`.
    pub unrounded_ratio: f64,
    pub compress_mib_per_second: f64,
    /// The same data packed at each of `PACKING_UNITS_COMPARED_BYTES`.
    pub packing: Vec<UnitPacking>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct UnitPacking {
    pub unit_bytes: usize,
    pub packed_bytes: u64,
    pub ratio: f64,
}

#[expect(
    clippy::cast_precision_loss,
    reason = "a ratio of byte counts to print"
)]
fn ratio(data_bytes: u64, stored_bytes: u64) -> f64 {
    if stored_bytes == 0 {
        1.0
    } else {
        data_bytes as f64 / stored_bytes as f64
    }
}

#[expect(clippy::cast_precision_loss, reason = "a throughput to print")]
fn mib_per_second(bytes: u64, time: Duration) -> f64 {
    let seconds = time.as_secs_f64();
    if seconds > 0.0 {
        bytes as f64 / MEBIBYTE_BYTES / seconds
    } else {
        0.0
    }
}

fn u64_of(count: usize) -> u64 {
    u64::try_from(count).expect("a count in memory fits in u64")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_blocks_are_counted_and_text_compresses() {
        let mut chunk = vec![0u8; CHUNK_ALIGNMENT_BYTES];
        let text = b"lamina packs compressed blocks end to end. ";
        for (index, byte) in chunk[..3 * BLOCK_SIZE_BYTES].iter_mut().enumerate() {
            *byte = text[index % text.len()];
        }
        let codecs = [Codec::Off, Codec::Lz4, Codec::zstd(3).expect("level")];
        let mut estimator = Estimator::new(&codecs).expect("contexts");
        estimator.feed(&chunk).expect("feed");
        estimator
            .feed(&chunk[..BLOCK_SIZE_BYTES])
            .expect("a last, short chunk");
        let estimate = estimator.finish();
        assert_eq!(estimate.block_count, 9);
        assert_eq!(estimate.zero_block_count, 5);
        assert_eq!(estimate.data_bytes, 4 * 4096);
        let off = estimate.codecs[0].blocks_alone();
        assert_eq!(off.packed_bytes, 4 * 4096);
        assert_eq!(off.stored_as_is_count, 4);
        // The last chunk's block repeats the first: three distinct contents.
        assert_eq!(estimate.dedup.data_block_count, 4);
        assert_eq!(estimate.dedup.distinct_block_count, 3);
        assert_eq!(estimate.codecs[0].with_dedup.packed_bytes, 3 * 4096);
        assert!((estimate.codecs[0].with_dedup.ratio - 4.0 / 3.0).abs() < 1e-12);
        for codec in &estimate.codecs[1..] {
            let alone = codec.blocks_alone();
            // Each distinct block compressed once: three quarters of the four.
            assert!(codec.with_dedup.packed_bytes < alone.packed_bytes);
            assert!(codec.with_dedup.ratio > alone.ratio);
        }
        for codec in &estimate.codecs[1..] {
            for group in &codec.groups {
                assert!(group.ratio > 4.0, "{}: {group:?}", codec.codec);
                assert!(group.packed_bytes >= group.compressed_bytes);
                assert_eq!(group.packed_bytes % 16, 0);
            }
            // Eight text blocks compress better together than one by one.
            assert!(codec.groups[2].unrounded_ratio > codec.groups[0].unrounded_ratio);
        }
    }
}
