//! What the tier holds, in memory: for each segment its generation, the parts
//! stored in the store for that generation, and the runs written but not yet
//! flushed (pending). Pure logic without I/O: it decides which bytes a read
//! takes from where (pending over stored, a later part over an earlier one,
//! zeros where nothing was written), which runs a flush uploads, and
//! which objects become garbage.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use lamina_device::AlignedBuffer;

use crate::key::PartKey;

/// Written data not yet stored: a slice of a writer's buffer.
#[derive(Clone, Debug)]
struct PendingExtent {
    length: u64,
    data: Arc<AlignedBuffer>,
    /// Where the extent's first byte is in `data`.
    data_start: usize,
    /// Order of the write among all writes to the tier: a flush removes
    /// only what it uploaded, not what was written over it meanwhile.
    write_sequence: u64,
}

impl PendingExtent {
    /// The extent without its first `bytes` bytes.
    fn skip(&self, bytes: u64) -> Self {
        Self {
            length: self.length - bytes,
            data_start: self.data_start + crate::to_usize(bytes),
            ..self.clone()
        }
    }

    fn bytes(&self) -> &[u8] {
        &self.data[self.data_start..self.data_start + crate::to_usize(self.length)]
    }
}

/// Where a piece of a read comes from.
#[derive(Clone, Debug)]
pub enum PieceSource {
    Zeros,
    Pending {
        data: Arc<AlignedBuffer>,
        data_start: usize,
    },
    /// Bytes `object_offset..object_offset + length` of a stored part.
    Stored {
        key: PartKey,
        object_offset: u64,
    },
}

/// One piece of a read within a segment.
#[derive(Clone, Debug)]
pub struct Piece {
    pub offset_in_segment: u64,
    pub length: u64,
    pub source: PieceSource,
}

/// A run a flush uploads as one part object.
#[derive(Clone, Debug)]
pub struct UploadRun {
    pub key: PartKey,
    pub payload: Bytes,
}

/// Whose runs [`SegmentIndex::take_runs`] makes: the segment's, for a flush
/// of an epoch.
#[derive(Clone, Copy, Debug)]
pub struct RunTarget {
    pub segment_index: u64,
    pub epoch: u64,
    pub flush: u64,
}

/// One segment's state.
#[derive(Debug, Default)]
pub struct SegmentIndex {
    generation: u64,
    next_part_sequence: u64,
    /// Stored parts of `generation`, in ascending order (epoch, then part
    /// sequence).
    parts: Vec<PartKey>,
    /// Pending extents by offset in the segment; they never overlap.
    pending: BTreeMap<u64, PendingExtent>,
}

impl SegmentIndex {
    /// A segment whose highest generation in the store is `generation`,
    /// holding `parts` (all of that generation), and the parts among them
    /// that newer ones hide entirely (garbage a deleter did not get to).
    pub fn from_stored(generation: u64, mut parts: Vec<PartKey>) -> (Self, Vec<PartKey>) {
        parts.sort_by_key(PartKey::order);
        let next_part_sequence = parts
            .iter()
            .map(|part| part.part_sequence + 1)
            .max()
            .unwrap_or(0);
        let mut segment = Self {
            generation,
            next_part_sequence,
            parts,
            pending: BTreeMap::new(),
        };
        let hidden = segment.remove_hidden_parts();
        (segment, hidden)
    }

    #[cfg(test)]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn parts(&self) -> &[PartKey] {
        &self.parts
    }

    pub fn pending_bytes(&self) -> u64 {
        self.pending.values().map(|extent| extent.length).sum()
    }

    /// Records a write of `data[data_start..][..length]` at `offset` in the
    /// segment, over whatever was pending there.
    pub fn write(
        &mut self,
        offset: u64,
        length: u64,
        data: Arc<AlignedBuffer>,
        data_start: usize,
        write_sequence: u64,
    ) {
        self.cut_pending(offset..offset + length, u64::MAX);
        let extent = PendingExtent {
            length,
            data,
            data_start,
            write_sequence,
        };
        self.pending.insert(offset, extent);
    }

    /// Removes `range` from the pending extents written up to
    /// `write_sequence_max`, keeping what lies outside it (and newer extents
    /// whole).
    fn cut_pending(&mut self, range: Range<u64>, write_sequence_max: u64) {
        let overlapping: Vec<u64> = self
            .pending
            .range(..range.end)
            .filter(|(start, extent)| {
                **start + extent.length > range.start && extent.write_sequence <= write_sequence_max
            })
            .map(|(start, _)| *start)
            .collect();
        for start in overlapping {
            let extent = self.pending.remove(&start).expect("listed just now");
            let end = start + extent.length;
            if start < range.start {
                let mut head = extent.clone();
                head.length = range.start - start;
                self.pending.insert(start, head);
            }
            if end > range.end {
                self.pending
                    .insert(range.end, extent.skip(range.end - start));
            }
        }
    }

    /// Where each byte of `range` comes from, in order of offset.
    pub fn resolve(&self, range: Range<u64>) -> Vec<Piece> {
        let mut uncovered = vec![range.clone()];
        let mut pieces = Vec::new();
        for (start, extent) in self.pending.range(..range.end) {
            let end = start + extent.length;
            let overlap = (*start).max(range.start)..end.min(range.end);
            if overlap.is_empty() {
                continue;
            }
            pieces.push(Piece {
                offset_in_segment: overlap.start,
                length: overlap.end - overlap.start,
                source: PieceSource::Pending {
                    data: extent.data.clone(),
                    data_start: extent.data_start + crate::to_usize(overlap.start - start),
                },
            });
            uncovered = subtract(uncovered, &overlap);
        }
        for part in self.parts.iter().rev() {
            if uncovered.is_empty() {
                break;
            }
            let part_range = part.offset_in_segment..part.offset_in_segment + part.length;
            for piece in &uncovered {
                let overlap = piece.start.max(part_range.start)..piece.end.min(part_range.end);
                if !overlap.is_empty() {
                    pieces.push(Piece {
                        offset_in_segment: overlap.start,
                        length: overlap.end - overlap.start,
                        source: PieceSource::Stored {
                            key: *part,
                            object_offset: overlap.start - part_range.start,
                        },
                    });
                }
            }
            uncovered = subtract(uncovered, &part_range);
        }
        pieces.extend(uncovered.into_iter().map(|gap| Piece {
            offset_in_segment: gap.start,
            length: gap.end - gap.start,
            source: PieceSource::Zeros,
        }));
        pieces.sort_by_key(|piece| piece.offset_in_segment);
        pieces
    }

    /// The pending extents as contiguous runs of at most `part_bytes_max`,
    /// each with its part key (of `flush` in `epoch`, sequences taken now,
    /// in offset order) and its bytes copied out.
    pub fn take_runs(&mut self, target: RunTarget, part_bytes_max: u64) -> Vec<UploadRun> {
        let mut runs = Vec::new();
        let mut current: Option<(u64, Vec<u8>)> = None;
        for (start, extent) in &self.pending {
            let continues = current.as_ref().is_some_and(|(run_start, bytes)| {
                run_start + bytes.len() as u64 == *start
                    && bytes.len() as u64 + extent.length <= part_bytes_max
            });
            if !continues && let Some(run) = current.take() {
                runs.push(run);
            }
            let mut extent = extent.clone();
            let mut start = *start;
            // An extent longer than a part is cut into parts of its own.
            while current.is_none() && extent.length > part_bytes_max {
                runs.push((
                    start,
                    extent.bytes()[..crate::to_usize(part_bytes_max)].to_vec(),
                ));
                extent = extent.skip(part_bytes_max);
                start += part_bytes_max;
            }
            let (_, bytes) = current.get_or_insert_with(|| (start, Vec::new()));
            bytes.extend_from_slice(extent.bytes());
        }
        runs.extend(current);
        runs.into_iter()
            .map(|(offset_in_segment, bytes)| {
                let key = PartKey {
                    segment_index: target.segment_index,
                    generation: self.generation,
                    epoch: target.epoch,
                    flush: target.flush,
                    part_sequence: self.next_part_sequence,
                    offset_in_segment,
                    length: bytes.len() as u64,
                };
                self.next_part_sequence += 1;
                UploadRun {
                    key,
                    payload: Bytes::from(bytes),
                }
            })
            .collect()
    }

    /// Part `key` is stored: it joins the index (if its generation is still
    /// the segment's), the pending data it holds (written up to
    /// `write_sequence_max`, within the part's range) leaves the pending
    /// runs, and older parts it and newer ones hide entirely are returned as
    /// garbage. A part of an older generation is itself garbage.
    ///
    /// Only the part's range is cut out of the pending extents: an extent
    /// longer than `part_bytes_max` is uploaded as several parts, and the
    /// rest of it must stay pending until its own parts are stored (a read
    /// meanwhile, or after their PUT failed, would see older data).
    pub fn stored(&mut self, key: PartKey, write_sequence_max: u64) -> Vec<PartKey> {
        if key.generation != self.generation {
            return vec![key];
        }
        self.cut_pending(
            key.offset_in_segment..key.offset_in_segment + key.length,
            write_sequence_max,
        );
        let position = self
            .parts
            .partition_point(|part| part.order() < key.order());
        self.parts.insert(position, key);
        self.remove_hidden_parts()
    }

    /// Removes and returns every part that newer parts cover entirely.
    fn remove_hidden_parts(&mut self) -> Vec<PartKey> {
        let mut hidden = Vec::new();
        let mut kept = Vec::with_capacity(self.parts.len());
        for (position, part) in self.parts.iter().enumerate() {
            let whole = part.offset_in_segment..part.offset_in_segment + part.length;
            let mut uncovered = vec![whole];
            for newer in &self.parts[position + 1..] {
                uncovered = subtract(
                    uncovered,
                    &(newer.offset_in_segment..newer.offset_in_segment + newer.length),
                );
                if uncovered.is_empty() {
                    break;
                }
            }
            if uncovered.is_empty() {
                hidden.push(*part);
            } else {
                kept.push(*part);
            }
        }
        self.parts = kept;
        hidden
    }

    /// The segment is used again from its start: a new generation, nothing
    /// pending, and every stored part of the old one returned as garbage.
    pub fn reopen(&mut self) -> Vec<PartKey> {
        self.generation += 1;
        self.next_part_sequence = 0;
        self.pending.clear();
        std::mem::take(&mut self.parts)
    }
}

/// `ranges` without `cut`.
fn subtract(ranges: Vec<Range<u64>>, cut: &Range<u64>) -> Vec<Range<u64>> {
    let mut left = Vec::with_capacity(ranges.len() + 1);
    for range in ranges {
        if range.end <= cut.start || cut.end <= range.start {
            left.push(range);
            continue;
        }
        if range.start < cut.start {
            left.push(range.start..cut.start);
        }
        if cut.end < range.end {
            left.push(cut.end..range.end);
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = 4096;

    fn target(segment_index: u64) -> RunTarget {
        RunTarget {
            segment_index,
            epoch: 1,
            flush: 1,
        }
    }

    fn block_data(blocks: u64, seed: u8) -> Arc<AlignedBuffer> {
        let mut buffer = AlignedBuffer::zeroed(crate::to_usize(blocks * BLOCK));
        for (index, byte) in buffer.iter_mut().enumerate() {
            *byte = seed ^ u8::try_from(index / 4096 % 251).unwrap();
        }
        Arc::new(buffer)
    }

    /// What the index says the segment holds, with stored parts read from
    /// `store` (key → bytes).
    fn contents(
        index: &SegmentIndex,
        range: Range<u64>,
        store: &BTreeMap<PartKey, Bytes>,
    ) -> Vec<u8> {
        let mut bytes = Vec::new();
        for piece in index.resolve(range) {
            let length = crate::to_usize(piece.length);
            match piece.source {
                PieceSource::Zeros => bytes.extend(std::iter::repeat_n(0, length)),
                PieceSource::Pending { data, data_start } => {
                    bytes.extend_from_slice(&data[data_start..data_start + length]);
                }
                PieceSource::Stored { key, object_offset } => {
                    let object = &store[&key];
                    let start = crate::to_usize(object_offset);
                    bytes.extend_from_slice(&object[start..start + length]);
                }
            }
        }
        bytes
    }

    #[test]
    fn a_random_history_reads_like_a_flat_model() {
        use rand::seq::SliceRandom;
        use rand::{Rng, SeedableRng};
        let segment_blocks = 64;
        for seed in 0..40u64 {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let mut index = SegmentIndex::default();
            let mut model = vec![0u8; crate::to_usize(segment_blocks * BLOCK)];
            let mut store = BTreeMap::new();
            let mut write_sequence = 0;
            for step in 0..200 {
                match rng.random_range(0..10) {
                    0..6 => {
                        let start = rng.random_range(0..segment_blocks);
                        let blocks = rng.random_range(1..=(segment_blocks - start).min(9));
                        let data = block_data(blocks + 1, u8::try_from(step % 256).unwrap());
                        write_sequence += 1;
                        index.write(
                            start * BLOCK,
                            blocks * BLOCK,
                            data.clone(),
                            4096,
                            write_sequence,
                        );
                        let at = crate::to_usize(start * BLOCK);
                        model[at..at + crate::to_usize(blocks * BLOCK)]
                            .copy_from_slice(&data[4096..4096 + crate::to_usize(blocks * BLOCK)]);
                    }
                    6..9 => {
                        let part_bytes_max = BLOCK * rng.random_range(1..20);
                        let runs = index.take_runs(target(0), part_bytes_max);
                        let flushed_up_to = write_sequence;
                        // A write between the snapshot and the upload's end.
                        if rng.random_bool(0.3) {
                            let start = rng.random_range(0..segment_blocks);
                            let data = block_data(1, 0xee);
                            write_sequence += 1;
                            index.write(start * BLOCK, BLOCK, data.clone(), 0, write_sequence);
                            let at = crate::to_usize(start * BLOCK);
                            model[at..at + 4096].copy_from_slice(&data[..]);
                        }
                        // PUTs finish in any order and some fail (their
                        // runs stay pending); the segment reads right
                        // between any two of them.
                        let mut runs = runs;
                        runs.shuffle(&mut rng);
                        for run in runs {
                            assert!(run.key.length <= part_bytes_max);
                            if rng.random_bool(0.2) {
                                continue;
                            }
                            store.insert(run.key, run.payload);
                            for garbage in index.stored(run.key, flushed_up_to) {
                                store.remove(&garbage);
                            }
                            let got = contents(&index, 0..segment_blocks * BLOCK, &store);
                            assert!(got == model, "seed {seed} step {step}: between PUTs");
                        }
                    }
                    _ => {
                        for garbage in index.reopen() {
                            store.remove(&garbage);
                        }
                        model.fill(0);
                    }
                }
                let start = rng.random_range(0..segment_blocks);
                let end = rng.random_range(start + 1..=segment_blocks);
                let got = contents(&index, start * BLOCK..end * BLOCK, &store);
                let expected = &model[crate::to_usize(start * BLOCK)..crate::to_usize(end * BLOCK)];
                assert!(got == expected, "seed {seed} step {step}");
            }
            assert_eq!(contents(&index, 0..segment_blocks * BLOCK, &store), model);
        }
    }

    #[test]
    fn an_upload_finishing_after_a_reopen_is_garbage() {
        let mut index = SegmentIndex::default();
        index.write(0, BLOCK, block_data(1, 1), 0, 1);
        let runs = index.take_runs(target(5), 1 << 20);
        assert_eq!(runs.len(), 1);
        assert!(index.reopen().is_empty());
        assert_eq!(index.stored(runs[0].key, 1), vec![runs[0].key]);
        assert!(index.parts().is_empty());
        assert_eq!(index.generation(), 1);
    }

    #[test]
    fn adjacent_writes_become_one_run_and_long_ones_are_cut() {
        let mut index = SegmentIndex::default();
        index.write(0, 2 * BLOCK, block_data(2, 1), 0, 1);
        index.write(2 * BLOCK, 3 * BLOCK, block_data(3, 2), 0, 2);
        index.write(8 * BLOCK, BLOCK, block_data(1, 3), 0, 3);
        let runs = index.take_runs(target(0), 4 * BLOCK);
        let shapes: Vec<(u64, u64, u64)> = runs
            .iter()
            .map(|run| {
                (
                    run.key.part_sequence,
                    run.key.offset_in_segment / BLOCK,
                    run.key.length / BLOCK,
                )
            })
            .collect();
        assert_eq!(shapes, vec![(0, 0, 2), (1, 2, 3), (2, 8, 1)]);
        let runs = index.take_runs(target(0), BLOCK);
        assert_eq!(runs.len(), 6);
    }

    /// A pending extent longer than a part is uploaded as several parts;
    /// the first one stored must leave the rest of the extent pending, or a
    /// read meanwhile (and, if a later part's PUT fails, every read) sees
    /// older data or zeros where the rest was written.
    #[test]
    fn storing_one_part_of_a_long_extent_keeps_the_rest_pending() {
        let mut index = SegmentIndex::default();
        let data = block_data(4, 7);
        index.write(0, 4 * BLOCK, data.clone(), 0, 1);
        let runs = index.take_runs(target(0), BLOCK);
        assert_eq!(runs.len(), 4);
        let mut store = BTreeMap::new();
        store.insert(runs[0].key, runs[0].payload.clone());
        assert!(index.stored(runs[0].key, 1).is_empty());
        assert_eq!(contents(&index, 0..4 * BLOCK, &store), data[..]);
        assert_eq!(index.pending_bytes(), 3 * BLOCK);
        // The second part's PUT failed: the next flush uploads it again.
        let again = index.take_runs(target(0), BLOCK);
        let shapes: Vec<(u64, u64)> = again
            .iter()
            .map(|run| (run.key.offset_in_segment / BLOCK, run.key.length / BLOCK))
            .collect();
        assert_eq!(shapes, vec![(1, 1), (2, 1), (3, 1)]);
        for run in &again {
            store.insert(run.key, run.payload.clone());
            index.stored(run.key, 1);
        }
        assert_eq!(index.pending_bytes(), 0);
        assert_eq!(contents(&index, 0..4 * BLOCK, &store), data[..]);
    }
}
