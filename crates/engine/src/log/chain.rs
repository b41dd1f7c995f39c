//! Walking a segment's chain of batches: the one rule recovery and the cleaner
//! both use to find the batches of one segment incarnation and their data.
//!
//! From format version 5 every summary is written twice, as the batch's first
//! block and again as its last (the copy, right after the data), so that one
//! damaged sector never hides a batch: a summary that fails its checksum is
//! read from its copy. When both are damaged the walk does not stop there (that
//! would silently hide every later batch of the segment): it looks for the
//! next batch within the largest span a batch can have, and reports the blocks
//! in between as a damaged range whose records are lost, so that the caller can
//! report them. A walk ends where no batch of the incarnation follows.

use std::future::Future;

use super::batch::{BATCH_DATA_BLOCKS_MAX, Summary};
use crate::BLOCK_BYTES;
use crate::convert::block_in_segment;

/// The first format version whose batches end with a copy of their summary.
pub const SUMMARY_COPY_VERSION_MIN: u32 = 5;

/// Blocks after a batch's first block that the batch can cover at most (its
/// data and the summary's copy).
// A constant far below `u32::MAX` (the assertion keeps it so), converted at
// compile time where `try_from` is not available.
#[allow(clippy::cast_possible_truncation)]
pub const BATCH_TAIL_BLOCKS_MAX: u32 = {
    assert!(BATCH_DATA_BLOCKS_MAX < u32::MAX as usize);
    BATCH_DATA_BLOCKS_MAX as u32 + 1
};

/// How far a walk looks past a summary it cannot read, for its copy or for the
/// next batch: the longest batch's tail, and the block after it, where the
/// next batch begins.
pub const RESYNC_WINDOW_BLOCKS: u32 = BATCH_TAIL_BLOCKS_MAX + 1;

/// The segment a walk follows: its size, and the row its batches are
/// aligned to (format version 6: a batch on a striped tier starts at a
/// multiple of the tier's data blocks per row, see `lamina_layout`; 1 on a
/// single device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentShape {
    pub size_blocks: u32,
    pub row_blocks: u32,
}

impl SegmentShape {
    /// Where the batch after one that ends before `end` begins.
    pub fn next_batch_start(&self, end: u32) -> u32 {
        end.next_multiple_of(self.row_blocks).min(self.size_blocks)
    }
}

/// Where a walk reads a segment's blocks from: the device at recovery, a victim
/// read into memory for the cleaner.
pub trait SegmentBlocks {
    type Error;
    /// `block_count` blocks from `first_block_in_segment` (never past the segment).
    fn read_blocks(
        &mut self,
        first_block_in_segment: u32,
        block_count: u32,
    ) -> impl Future<Output = Result<Vec<u8>, Self::Error>>;
}

/// One batch found by a walk.
#[derive(Clone, Debug)]
pub struct ChainBatch {
    pub summary: Summary,
    /// Where its (first) summary block is; its data blocks follow it.
    pub block_in_segment: u32,
    /// Whether the first summary was damaged and its copy was used.
    pub from_copy: bool,
}

impl ChainBatch {
    /// Block in the segment of the batch's data block `data_index`.
    pub fn data_block_in_segment(&self, data_index: u32) -> u32 {
        self.block_in_segment + 1 + data_index
    }
}

/// Blocks of a segment where a batch was written whose summary and copy are
/// both unreadable: its records are lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DamagedRange {
    pub first_block_in_segment: u32,
    pub block_count: u32,
}

/// What a walk found.
#[derive(Clone, Debug, Default)]
pub struct Chain {
    pub batches: Vec<ChainBatch>,
    pub damaged: Vec<DamagedRange>,
    /// The incarnation walked (found at the first batch when not given).
    pub segment_sequence: Option<u64>,
}

/// A summary, with how many blocks its batch spans.
struct Link {
    summary: Summary,
    span_blocks: u32,
    /// Whether the batch ends with a copy of its summary (version 5 on).
    has_copy: bool,
}

fn decode_link(bytes: &[u8]) -> Option<Link> {
    let (version, summary) = Summary::decode_versioned(bytes).ok()?;
    let has_copy = version >= SUMMARY_COPY_VERSION_MIN;
    let data_block_count = u32::try_from(summary.data_block_count())
        .expect("decoding checks at most BATCH_DATA_BLOCKS_MAX data records");
    let span_blocks = 1 + data_block_count + u32::from(has_copy);
    Some(Link {
        summary,
        span_blocks,
        has_copy,
    })
}

/// Whether `link`, found at `block_in_segment`, is a batch of `incarnation`
/// (any, when not known yet) that starts at `start` and fits in the segment.
fn belongs(link: &Link, start: u32, incarnation: Option<u64>, segment_size_blocks: u32) -> bool {
    incarnation.is_none_or(|sequence| link.summary.segment_sequence == sequence)
        && link.summary.block_in_segment == start
        && u64::from(start) + u64::from(link.span_blocks) <= u64::from(segment_size_blocks)
}

/// What follows a position whose first block is not a summary of the chain.
enum Resync {
    /// The summary's copy, which names `start`.
    Copy(Link),
    /// The next batch begins at this block (of this incarnation): the blocks
    /// before it are lost.
    Next {
        position: u32,
        segment_sequence: u64,
    },
    End,
}

/// Looks past `start` for the copy of a batch beginning there, or else for the
/// next batch of the incarnation.
async fn resync<S: SegmentBlocks>(
    source: &mut S,
    start: u32,
    incarnation: Option<u64>,
    shape: SegmentShape,
) -> Result<Resync, S::Error> {
    let segment_size_blocks = shape.size_blocks;
    let first = start + 1;
    // A batch may be followed by padding to the next row.
    let window = RESYNC_WINDOW_BLOCKS + shape.row_blocks - 1;
    let count = window.min(segment_size_blocks.saturating_sub(first));
    if count == 0 {
        return Ok(Resync::End);
    }
    let window = source.read_blocks(first, count).await?;
    let block = BLOCK_BYTES;
    let links: Vec<(u32, Link)> = window
        .chunks_exact(block)
        .enumerate()
        .filter_map(|(index, bytes)| Some((first + block_in_segment(index), decode_link(bytes)?)))
        .collect();
    // A copy is the last block of its batch.
    let copy = links.iter().position(|(position, link)| {
        link.has_copy
            && start + link.span_blocks - 1 == *position
            && belongs(link, start, incarnation, segment_size_blocks)
    });
    if let Some(index) = copy {
        let (_, link) = links.into_iter().nth(index).expect("found above");
        return Ok(Resync::Copy(link));
    }
    // The next batch: a summary at its own position, or a copy at the end of
    // its batch (whose first summary may be damaged too), whichever starts
    // first.
    let next = links
        .iter()
        .filter_map(|(position, link)| {
            let begins = link.summary.block_in_segment;
            let is_first = begins == *position;
            let is_copy =
                link.has_copy && begins > start && begins + link.span_blocks - 1 == *position;
            ((is_first || is_copy) && belongs(link, begins, incarnation, segment_size_blocks))
                .then_some((begins, link.summary.segment_sequence))
        })
        .min_by_key(|(begins, _)| *begins);
    Ok(
        next.map_or(Resync::End, |(position, segment_sequence)| Resync::Next {
            position,
            segment_sequence,
        }),
    )
}

/// Follows the chain of batches of one segment incarnation from `first_block`
/// (`incarnation` unknown: the first batch found names it).
pub async fn walk<S: SegmentBlocks>(
    source: &mut S,
    shape: SegmentShape,
    first_block: u32,
    incarnation: Option<u64>,
) -> Result<Chain, S::Error> {
    let mut chain = Chain {
        segment_sequence: incarnation,
        ..Chain::default()
    };
    let segment_size_blocks = shape.size_blocks;
    let mut position = first_block;
    while position + 2 <= segment_size_blocks {
        let bytes = source.read_blocks(position, 1).await?;
        let (link, from_copy) = match decode_link(&bytes) {
            Some(link) if belongs(&link, position, chain.segment_sequence, segment_size_blocks) => {
                (link, false)
            }
            _ => match resync(source, position, chain.segment_sequence, shape).await? {
                Resync::Copy(link) => (link, true),
                Resync::Next {
                    position: next,
                    segment_sequence,
                } => {
                    chain.damaged.push(DamagedRange {
                        first_block_in_segment: position,
                        block_count: next - position,
                    });
                    chain.segment_sequence = Some(segment_sequence);
                    position = next;
                    continue;
                }
                Resync::End => break,
            },
        };
        chain.segment_sequence = Some(link.summary.segment_sequence);
        let span = link.span_blocks;
        chain.batches.push(ChainBatch {
            summary: link.summary,
            block_in_segment: position,
            from_copy,
        });
        position = shape.next_batch_start(position + span);
    }
    Ok(chain)
}

/// The incarnation of the segment's first batch, read from its summary, or
/// its copy, or else from the next batch after it: how recovery finds segments
/// written since a checkpoint even when their first summary is damaged.
pub async fn first_incarnation<S: SegmentBlocks>(
    source: &mut S,
    shape: SegmentShape,
) -> Result<Option<u64>, S::Error> {
    let segment_size_blocks = shape.size_blocks;
    let bytes = source.read_blocks(0, 1).await?;
    if let Some(link) = decode_link(&bytes)
        && belongs(&link, 0, None, segment_size_blocks)
    {
        return Ok(Some(link.summary.segment_sequence));
    }
    if bytes.iter().all(|byte| *byte == 0) {
        // Never written (a damaged block is not all zeros).
        return Ok(None);
    }
    Ok(match resync(source, 0, None, shape).await? {
        Resync::Copy(link) => Some(link.summary.segment_sequence),
        Resync::Next {
            segment_sequence, ..
        } => Some(segment_sequence),
        Resync::End => None,
    })
}

/// A segment held in memory (the cleaner's victim, tests).
pub struct InMemorySegment<'a> {
    bytes: &'a [u8],
}

impl<'a> InMemorySegment<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        assert!(bytes.len().is_multiple_of(BLOCK_BYTES));
        Self { bytes }
    }
}

impl SegmentBlocks for InMemorySegment<'_> {
    type Error = std::convert::Infallible;

    async fn read_blocks(
        &mut self,
        first_block_in_segment: u32,
        block_count: u32,
    ) -> Result<Vec<u8>, Self::Error> {
        let block = BLOCK_BYTES;
        let start = first_block_in_segment as usize * block;
        let end = start + block_count as usize * block;
        assert!(end <= self.bytes.len(), "read past the segment");
        Ok(self.bytes[start..end].to_vec())
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // test patterns: small indexes, wrapping bytes
mod tests {
    use super::*;
    use crate::log::batch::Record;
    use crate::log::frame::FRAME_HEADER_BYTES;

    const SEGMENT_BLOCKS: u32 = 64;

    /// A segment of `batches` batches of `data_count` data blocks each, written
    /// as version 5 does (summary, data, copy).
    /// The summary of a batch of incarnation 9 at `position` holding
    /// `data_count` data records.
    fn test_summary(position: u32, batch_sequence: u64, data_count: u32) -> Summary {
        Summary {
            segment_sequence: 9,
            block_in_segment: position,
            batch_sequence,
            flushed_through_sequence: 0,
            records: (0..data_count)
                .map(|data| Record::Data {
                    volume_id: 1,
                    logical_block: u64::from(data),
                    checksum: 0,
                })
                .collect(),
        }
    }

    fn shape(size_blocks: u32) -> SegmentShape {
        SegmentShape {
            size_blocks,
            row_blocks: 1,
        }
    }

    fn segment(batches: &[u32]) -> (Vec<u8>, Vec<u32>) {
        segment_of(shape(SEGMENT_BLOCKS), batches)
    }

    fn segment_of(shape: SegmentShape, batches: &[u32]) -> (Vec<u8>, Vec<u32>) {
        let segment_blocks = shape.size_blocks;
        let block = BLOCK_BYTES;
        let mut bytes = vec![0u8; segment_blocks as usize * block];
        let mut starts = Vec::new();
        let mut position = 0u32;
        for (index, data_count) in batches.iter().enumerate() {
            let encoded = test_summary(position, 100 + index as u64, *data_count).encode();
            let at = |blocks: u32| blocks as usize * block;
            bytes[at(position)..at(position + 1)].copy_from_slice(&encoded);
            let copy = position + 1 + data_count;
            bytes[at(copy)..at(copy + 1)].copy_from_slice(&encoded);
            for data in 0..*data_count {
                let start = at(position + 1 + data);
                bytes[start..start + block].fill(0xAB);
            }
            starts.push(position);
            position = shape.next_batch_start(copy + 1);
        }
        (bytes, starts)
    }

    /// Batches aligned to rows of 4 (a 4+2 array's), the padding zero:
    /// walked whole, and past a batch whose summary and copy are both damaged.
    #[test]
    fn row_aligned_batches_are_walked_across_their_padding() {
        let aligned = SegmentShape {
            size_blocks: SEGMENT_BLOCKS,
            row_blocks: 4,
        };
        let (mut bytes, starts) = segment_of(aligned, &[1, 2, 6, 3]);
        assert_eq!(starts, vec![0, 4, 8, 16]);
        let walk_aligned = |bytes: &[u8]| {
            let mut source = InMemorySegment::new(bytes);
            futures::executor::block_on(walk(&mut source, aligned, 0, Some(9))).expect("in memory")
        };
        let chain = walk_aligned(&bytes);
        let found: Vec<u32> = chain
            .batches
            .iter()
            .map(|batch| batch.block_in_segment)
            .collect();
        assert_eq!(found, starts);
        // Both summaries of the second batch damaged: the walk finds the third.
        let block = BLOCK_BYTES;
        bytes[4 * block + 30] ^= 1;
        bytes[7 * block + 30] ^= 1;
        let chain = walk_aligned(&bytes);
        let found: Vec<u32> = chain
            .batches
            .iter()
            .map(|batch| batch.block_in_segment)
            .collect();
        assert_eq!(found, vec![0, 8, 16]);
        assert_eq!(chain.damaged[0].first_block_in_segment, 4);
    }

    fn walk_bytes(bytes: &[u8]) -> Chain {
        let mut source = InMemorySegment::new(bytes);
        futures::executor::block_on(walk(&mut source, shape(SEGMENT_BLOCKS), 0, Some(9)))
            .expect("in memory")
    }

    #[test]
    fn an_intact_chain_is_walked_to_its_end() {
        let (bytes, starts) = segment(&[3, 5, 1]);
        let chain = walk_bytes(&bytes);
        let found: Vec<u32> = chain.batches.iter().map(|b| b.block_in_segment).collect();
        assert_eq!(found, starts);
        assert!(chain.damaged.is_empty());
        assert!(chain.batches.iter().all(|batch| !batch.from_copy));
    }

    #[test]
    fn a_damaged_summary_is_read_from_its_copy() {
        for damaged in 0..3 {
            let (mut bytes, starts) = segment(&[3, 5, 1]);
            let offset = starts[damaged] as usize * BLOCK_BYTES + 26;
            bytes[offset] ^= 0x10;
            let chain = walk_bytes(&bytes);
            let found: Vec<u32> = chain.batches.iter().map(|b| b.block_in_segment).collect();
            assert_eq!(found, starts, "damaged batch {damaged}");
            assert!(chain.batches[damaged].from_copy);
            assert!(chain.damaged.is_empty());
        }
    }

    #[test]
    fn a_batch_with_both_summaries_damaged_is_reported_and_the_walk_goes_on() {
        let (mut bytes, starts) = segment(&[3, 5, 1]);
        let block = BLOCK_BYTES;
        bytes[starts[1] as usize * block + 26] ^= 1;
        bytes[(starts[1] as usize + 6) * block + 26] ^= 1;
        let chain = walk_bytes(&bytes);
        let found: Vec<u32> = chain.batches.iter().map(|b| b.block_in_segment).collect();
        assert_eq!(found, vec![starts[0], starts[2]]);
        assert_eq!(
            chain.damaged,
            vec![DamagedRange {
                first_block_in_segment: starts[1],
                block_count: 7,
            }]
        );
    }

    /// Random chains with random damage to their summaries (never to both
    /// copies of two neighbouring batches): a batch with one good copy is
    /// always found, from its copy when its first summary is damaged; a batch
    /// with both damaged is a damaged range when a batch follows it in the
    /// segment, and ends the walk otherwise; nothing else is reported.
    #[test]
    fn random_damage_to_summaries_is_repaired_or_reported() {
        use rand::{Rng, SeedableRng};
        let block = BLOCK_BYTES;
        for seed in 0..2_000u64 {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let mut data_counts = Vec::new();
            let mut used = 0u32;
            loop {
                let data_count = rng.random_range(0..6u32);
                if used + data_count + 2 > SEGMENT_BLOCKS {
                    break;
                }
                used += data_count + 2;
                data_counts.push(data_count);
            }
            let (mut bytes, starts) = segment(&data_counts);
            // 0: intact, 1: first damaged, 2: copy damaged, 3: both.
            let mut damage: Vec<u8> = Vec::new();
            for index in 0..data_counts.len() {
                let previous_both = index > 0 && damage[index - 1] == 3;
                let kind = if previous_both {
                    rng.random_range(0..3)
                } else {
                    rng.random_range(0..4)
                };
                damage.push(kind);
                let first = starts[index] as usize;
                let copy = first + 1 + data_counts[index] as usize;
                let byte = rng.random_range(FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + 4);
                if kind & 1 != 0 {
                    bytes[first * block + byte] ^= 1 << rng.random_range(0..8);
                }
                if kind & 2 != 0 {
                    bytes[copy * block + byte] ^= 1 << rng.random_range(0..8);
                }
            }
            let chain = walk_bytes(&bytes);
            let end = damage
                .iter()
                .rposition(|kind| *kind != 3)
                .map_or(0, |last| last + 1);
            let expected: Vec<(u32, bool)> = (0..end)
                .filter(|index| damage[*index] != 3)
                .map(|index| (starts[index], damage[index] & 1 != 0))
                .collect();
            let found: Vec<(u32, bool)> = chain
                .batches
                .iter()
                .map(|batch| (batch.block_in_segment, batch.from_copy))
                .collect();
            assert_eq!(found, expected, "seed {seed} damage {damage:?}");
            let damaged: Vec<u32> = chain
                .damaged
                .iter()
                .map(|range| range.first_block_in_segment)
                .collect();
            let expected_damaged: Vec<u32> = (0..end)
                .filter(|index| damage[*index] == 3)
                .map(|index| starts[index])
                .collect();
            assert_eq!(damaged, expected_damaged, "seed {seed} damage {damage:?}");
        }
    }

    #[test]
    fn past_the_largest_batch_with_both_summaries_damaged_the_next_is_found() {
        let segment_blocks = 512;
        let data_max = BATCH_DATA_BLOCKS_MAX as u32;
        let (mut bytes, starts) = segment_of(shape(segment_blocks), &[data_max, data_max, 3]);
        let block = BLOCK_BYTES;
        let copy = starts[0] as usize + 1 + data_max as usize;
        bytes[starts[0] as usize * block + 26] ^= 1;
        bytes[copy * block + 26] ^= 1;
        let mut source = InMemorySegment::new(&bytes);
        let chain =
            futures::executor::block_on(walk(&mut source, shape(segment_blocks), 0, Some(9)))
                .unwrap();
        let found: Vec<u32> = chain.batches.iter().map(|b| b.block_in_segment).collect();
        assert_eq!(found, starts[1..].to_vec());
        assert_eq!(chain.damaged.len(), 1);
        assert_eq!(chain.damaged[0].block_count, data_max + 2);
    }

    /// Version 4 batches (no copy: summary, then data) are walked as written.
    #[test]
    fn version_4_batches_are_walked_without_copies() {
        use crate::log::batch::BATCH_MAGIC;
        let block = BLOCK_BYTES;
        let mut bytes = vec![0u8; SEGMENT_BLOCKS as usize * block];
        let mut position = 0u32;
        let mut starts = Vec::new();
        for (index, data_count) in [3u32, 0, 5].iter().enumerate() {
            let mut summary = test_summary(position, 10 + index as u64, *data_count);
            if *data_count == 0 {
                summary.records.push(Record::VolumeDelete { volume_id: 3 });
            }
            let encoded = crate::log::frame::encode(BATCH_MAGIC, 4, &summary, block);
            let at = position as usize * block;
            bytes[at..at + block].copy_from_slice(&encoded);
            starts.push(position);
            position += 1 + data_count;
        }
        let chain = walk_bytes(&bytes);
        let found: Vec<u32> = chain.batches.iter().map(|b| b.block_in_segment).collect();
        assert_eq!(found, starts);
        assert!(chain.damaged.is_empty());
    }

    #[test]
    fn another_incarnation_ends_the_walk() {
        let (bytes, _) = segment(&[3]);
        let mut source = InMemorySegment::new(&bytes);
        let chain =
            futures::executor::block_on(walk(&mut source, shape(SEGMENT_BLOCKS), 0, Some(8)))
                .unwrap();
        assert!(chain.batches.is_empty() && chain.damaged.is_empty());
    }
}
