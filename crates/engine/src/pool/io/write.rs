//! The write path: client writes of any byte range, zeroing and trimming.
//! Whole blocks are appended to the log as they are; a partial block at
//! either end of a write is first merged with its current contents, under a
//! striped lock per block so that two partial writes to one block cannot
//! lose each other's bytes. Appends wait for an in-flight batch slot, and a
//! full pool reclaims space and tries again.

use std::ops::Range;
use std::sync::Arc;

use super::compressed_write::{self, ClientBlock, PreparedBlock};
use super::read::{BlockSpan, ReadExtents, check_range};
use super::writer::InFlightBatch;
use crate::convert::to_usize;
use crate::error::{EngineError, IoError};
use crate::log::batch::{BATCH_DATA_BLOCKS_MAX, Record, block_checksum};
use crate::pool::budget::ClientOperation;
use crate::pool::cleaner::Cleaner;
use crate::pool::core::state::State;
use crate::pool::core::{Core, RMW_LOCK_COUNT};
use crate::volume::View;
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// Blocks a write appends per hold of the state lock: one batch, so that a
/// long write lets reads and other writers in between.
const APPEND_PER_LOCK_HOLD_BLOCKS_MAX: u64 = BATCH_DATA_BLOCKS_MAX as u64;

/// Blocks of zeros per write when zeroing without punching a hole: one batch.
const ZEROES_PER_WRITE_BLOCKS_MAX: u64 = BATCH_DATA_BLOCKS_MAX as u64;

/// A client write: `data` at byte `offset` of volume `volume_id`.
#[derive(Clone, Copy)]
struct WriteRequest<'a> {
    volume_id: u32,
    offset: u64,
    data: &'a [u8],
}

/// A partial block of a write merged with the block's current contents.
struct MergedBlock {
    logical_block: u64,
    /// The whole block as it is to be written.
    contents: Vec<u8>,
}

impl WriteRequest<'_> {
    fn first_block(&self) -> u64 {
        self.offset / BLOCK_SIZE_BYTES
    }

    fn last_block(&self) -> u64 {
        (self.offset + self.data.len() as u64 - 1) / BLOCK_SIZE_BYTES
    }

    /// Whether the write covers whole blocks only.
    fn is_whole_blocks(&self) -> bool {
        self.offset.is_multiple_of(BLOCK_SIZE_BYTES)
            && (self.data.len() as u64).is_multiple_of(BLOCK_SIZE_BYTES)
    }

    /// The blocks the write covers only in part (at most two: the first and
    /// the last), which must be merged with their current contents.
    fn partial_blocks(&self) -> Vec<u64> {
        let length = self.data.len() as u64;
        let head_partial =
            !self.offset.is_multiple_of(BLOCK_SIZE_BYTES) || length < BLOCK_SIZE_BYTES;
        let tail_partial = !(self.offset + length).is_multiple_of(BLOCK_SIZE_BYTES);
        let mut partial_blocks = Vec::new();
        if head_partial {
            partial_blocks.push(self.first_block());
        }
        if tail_partial && !partial_blocks.contains(&self.last_block()) {
            partial_blocks.push(self.last_block());
        }
        partial_blocks
    }

    /// What block `logical_block` of the write is: merged, or the request's
    /// own bytes.
    fn contents_of<'a>(&'a self, logical_block: u64, merged: &'a [MergedBlock]) -> &'a [u8] {
        if let Some(block) = merged
            .iter()
            .find(|block| block.logical_block == logical_block)
        {
            return &block.contents;
        }
        let block_start = logical_block * BLOCK_SIZE_BYTES;
        assert!(
            block_start >= self.offset
                && block_start + BLOCK_SIZE_BYTES <= self.offset + self.data.len() as u64,
            "block {logical_block} is not merged, so the write covers all of it"
        );
        let start = to_usize(block_start - self.offset);
        &self.data[start..start + BLOCK_BYTES]
    }
}

/// The checksums (into `checksums`, from index 0) and, for a volume this
/// thread saw compress, the blocks encoded before the lock
/// (`compressed_write::prepare`; empty otherwise, which allocates nothing)
/// of `logical_blocks` of a write: the work of an append that needs no lock.
fn prepare_blocks(
    request: &WriteRequest<'_>,
    merged: &[MergedBlock],
    logical_blocks: std::ops::Range<u64>,
    checksums: &mut [u32; BATCH_DATA_BLOCKS_MAX],
) -> Vec<Option<PreparedBlock>> {
    let codec = compressed_write::hinted_codec(request.volume_id);
    let mut prepared = Vec::new();
    for (checksum, logical_block) in checksums.iter_mut().zip(logical_blocks) {
        let contents = request.contents_of(logical_block, merged);
        *checksum = block_checksum(contents);
        if let Some(codec) = codec {
            prepared.push(Some(compressed_write::prepare(codec, contents)));
        }
    }
    prepared
}

/// What one hold of the state lock appends: the write, its merged blocks,
/// the checksums of the blocks from the next one on, and the in-flight limit.
struct AppendStep<'request, 'data> {
    request: &'request WriteRequest<'data>,
    merged: &'request [MergedBlock],
    checksums: &'request [u32],
    /// The blocks encoded before the lock, in order (`compressed_write`).
    prepared: &'request mut [Option<PreparedBlock>],
    in_flight_limit: usize,
    /// Whether the write has FUA (its own flush follows, so write-behind
    /// does not seal it).
    fua: bool,
}

/// What one hold of the state lock did.
enum Appended {
    /// Blocks were appended; whether unflushed data is now over
    /// `dirty_bytes_max`.
    Blocks { over_dirty_limit: bool },
    /// Every in-flight batch slot was taken: nothing was appended.
    NoInFlightSlot,
}

/// Refuses a write outside its volume, or to a pool that failed.
fn check_write(state: &State, request: &WriteRequest<'_>) -> Result<(), EngineError> {
    check_range(
        state.volumes(),
        View::Volume(request.volume_id),
        request.offset,
        request.data.len() as u64,
    )?;
    state.check_failed()
}

/// Which striped lock serialises read-modify-write of `logical_block`.
fn rmw_lock_index(volume_id: u32, logical_block: u64) -> usize {
    let mixed = (u64::from(volume_id) << 48) ^ logical_block.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    to_usize(mixed % RMW_LOCK_COUNT as u64)
}

impl Core {
    /// Writes `data` at byte `offset`. Partial blocks at either end are merged
    /// with their current contents under a per-block lock. With `fua`, the write
    /// (and everything before it) is durable when this returns. Its latency
    /// goes to the background budget, which yields to slow clients.
    pub(in crate::pool) async fn write(
        self: &Arc<Self>,
        volume_id: u32,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), EngineError> {
        let started = tokio::time::Instant::now();
        let result = self.write_untimed(volume_id, offset, data, fua).await;
        self.budget()
            .record_client_latency(ClientOperation::Write, started.elapsed());
        result
    }

    /// `Pool::write` without the timing.
    async fn write_untimed(
        self: &Arc<Self>,
        volume_id: u32,
        offset: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<(), EngineError> {
        if data.is_empty() {
            return if fua { self.flush().await } else { Ok(()) };
        }
        let request = WriteRequest {
            volume_id,
            offset,
            data,
        };
        // A write of whole blocks is checked under the state lock it appends
        // under (one hold for both); a partial one reads first, so it is
        // checked before it reads, and so is one whose end overflows (its
        // blocks cannot even be named).
        let checked = !request.is_whole_blocks() || offset.checked_add(data.len() as u64).is_none();
        if checked {
            let state = self.lock();
            check_write(&state, &request)?;
        }
        let partial_blocks = request.partial_blocks();
        let guards = self.lock_blocks(volume_id, &partial_blocks).await;
        let merged = self.merge_partial_blocks(&request, &partial_blocks).await?;
        let over_dirty_limit = self.append_blocks(&request, &merged, checked, fua).await?;
        drop(guards);
        self.after_append(over_dirty_limit);
        if fua { self.flush().await } else { Ok(()) }
    }

    /// What follows a write's append: the dirty limit's background flush
    /// (`over_dirty_limit`: what the append's last lock hold found).
    fn after_append(self: &Arc<Self>, over_dirty_limit: bool) {
        if over_dirty_limit {
            crate::pool::background::flush_over_dirty_limit(self);
        }
    }

    /// A write without FUA of whole blocks, at most one lock hold's worth,
    /// appended at once when it can be without waiting: `None` when it
    /// would have to wait (no in-flight batch slot free, the pool full, or a
    /// write of another shape), and the caller then runs [`Core::write`].
    /// This is the common case of a client's write, and answering it here
    /// spares the caller a future (and its moves) per write. `None` from a
    /// full pool may leave some of the write's blocks appended: the write is
    /// not acknowledged yet, and the waiting write appends them again.
    pub(in crate::pool) fn write_without_waiting(
        self: &Arc<Self>,
        volume_id: u32,
        offset: u64,
        data: &[u8],
    ) -> Option<Result<(), EngineError>> {
        let request = WriteRequest {
            volume_id,
            offset,
            data,
        };
        let fits = !data.is_empty()
            && request.is_whole_blocks()
            && offset.checked_add(data.len() as u64).is_some()
            && request.last_block() - request.first_block() < APPEND_PER_LOCK_HOLD_BLOCKS_MAX;
        if !fits {
            return None;
        }
        let started = tokio::time::Instant::now();
        let mut checksums = [0u32; BATCH_DATA_BLOCKS_MAX];
        let blocks = request.first_block()..request.last_block() + 1;
        let mut prepared = prepare_blocks(&request, &[], blocks, &mut checksums);
        let (mut checked, mut next_block, mut sealed) = (false, request.first_block(), Vec::new());
        let step = AppendStep {
            request: &request,
            merged: &[],
            checksums: &checksums,
            prepared: &mut prepared,
            in_flight_limit: self.limits().in_flight_batches_max,
            fua: false,
        };
        let appended = self.append_under_lock(step, &mut checked, &mut next_block, &mut sealed);
        self.spawn_writes(sealed);
        let result = match appended {
            Ok(Appended::Blocks { over_dirty_limit }) => {
                assert!(next_block > request.last_block(), "one hold appends it all");
                self.after_append(over_dirty_limit);
                Ok(())
            }
            Ok(Appended::NoInFlightSlot) | Err(EngineError::Io(IoError::NoSpace)) => return None,
            Err(error) => Err(error),
        };
        self.budget()
            .record_client_latency(ClientOperation::Write, started.elapsed());
        Some(result)
    }

    /// Takes the read-modify-write locks of `logical_blocks`, in lock order
    /// (so that two writers cannot deadlock), each once.
    async fn lock_blocks(
        self: &Arc<Self>,
        volume_id: u32,
        logical_blocks: &[u64],
    ) -> Vec<tokio::sync::MutexGuard<'_, ()>> {
        let mut lock_indexes: Vec<usize> = logical_blocks
            .iter()
            .map(|logical_block| rmw_lock_index(volume_id, *logical_block))
            .collect();
        lock_indexes.sort_unstable();
        lock_indexes.dedup();
        let mut guards = Vec::with_capacity(lock_indexes.len());
        for index in lock_indexes {
            guards.push(self.rmw_lock(index).lock().await);
        }
        guards
    }

    /// Reads each partial block of the write and lays the write's bytes over it.
    async fn merge_partial_blocks(
        self: &Arc<Self>,
        request: &WriteRequest<'_>,
        partial_blocks: &[u64],
    ) -> Result<Vec<MergedBlock>, EngineError> {
        let mut merged = Vec::with_capacity(partial_blocks.len());
        for logical_block in partial_blocks {
            let mut contents = vec![0u8; BLOCK_BYTES];
            // Untimed: the write's own latency covers it.
            self.read_view_attempts(
                View::Volume(request.volume_id),
                logical_block * BLOCK_SIZE_BYTES,
                &mut contents,
                &mut ReadExtents::new(),
            )
            .await?;
            let span = BlockSpan::of(request.offset, request.data.len(), *logical_block);
            contents[span.block_range()].copy_from_slice(&request.data[span.request_range()]);
            merged.push(MergedBlock {
                logical_block: *logical_block,
                contents,
            });
        }
        Ok(merged)
    }

    /// Appends every block of the write, one lock hold per
    /// [`APPEND_PER_LOCK_HOLD_BLOCKS_MAX`] blocks, waiting for an in-flight
    /// batch slot when none is free, and reclaiming space when the pool is
    /// full. `checked`: whether the write's range was checked already.
    /// Returns whether unflushed data was over the dirty limit at the last
    /// append.
    async fn append_blocks(
        self: &Arc<Self>,
        request: &WriteRequest<'_>,
        merged: &[MergedBlock],
        mut checked: bool,
        fua: bool,
    ) -> Result<bool, EngineError> {
        let in_flight_limit = self.limits().in_flight_batches_max;
        let mut next_block = request.first_block();
        let mut over_dirty_limit = false;
        while next_block <= request.last_block() {
            let stop = (next_block + APPEND_PER_LOCK_HOLD_BLOCKS_MAX).min(request.last_block() + 1);
            // Checksummed before the lock is taken: the lock's hold is the
            // bookkeeping and one copy per block.
            let mut checksums = [0u32; BATCH_DATA_BLOCKS_MAX];
            let mut prepared = prepare_blocks(request, merged, next_block..stop, &mut checksums);
            let mut sealed = Vec::new();
            let appended = self.append_under_lock(
                AppendStep {
                    request,
                    merged,
                    checksums: &checksums,
                    prepared: &mut prepared,
                    in_flight_limit,
                    fua,
                },
                &mut checked,
                &mut next_block,
                &mut sealed,
            );
            self.spawn_writes(sealed);
            match appended {
                Ok(Appended::Blocks {
                    over_dirty_limit: over,
                }) => over_dirty_limit = over,
                Ok(Appended::NoInFlightSlot) => {
                    self.wait_unless_device_full(|state| {
                        state.writer().in_flight_count() < in_flight_limit
                            || state.writer().failed().is_some()
                    })
                    .await?;
                }
                Err(EngineError::Io(IoError::NoSpace)) if Cleaner::new(self).reclaim().await? => {}
                Err(error) => return Err(error),
            }
        }
        Ok(over_dirty_limit)
    }

    /// Appends blocks of the write from `*next_block` on under one hold of
    /// the state lock, at most [`APPEND_PER_LOCK_HOLD_BLOCKS_MAX`] (the
    /// checksums of `step` are theirs, in order); `*next_block` moves past
    /// each block appended. Checks the write first unless `*checked`, and
    /// appends nothing while every in-flight batch slot is taken. The hold
    /// that appends the write's last block also seals the open batch for
    /// write-behind (`io/write_behind.rs`) and reads the dirty limit, so
    /// that a write takes the lock once.
    fn append_under_lock(
        &self,
        step: AppendStep<'_, '_>,
        checked: &mut bool,
        next_block: &mut u64,
        sealed: &mut Vec<Arc<InFlightBatch>>,
    ) -> Result<Appended, EngineError> {
        let AppendStep {
            request,
            merged,
            checksums,
            prepared,
            in_flight_limit,
            fua,
        } = step;
        let mut state = self.lock();
        if !*checked {
            check_write(&state, request)?;
            *checked = true;
        }
        if state.writer().in_flight_count() >= in_flight_limit && state.writer().failed().is_none()
        {
            return Ok(Appended::NoInFlightSlot);
        }
        let first = *next_block;
        let stop = (first + APPEND_PER_LOCK_HOLD_BLOCKS_MAX).min(request.last_block() + 1);
        let codec = state.volumes().compression(request.volume_id);
        compressed_write::remember_codec(request.volume_id, codec);
        while *next_block < stop {
            let index = to_usize(*next_block - first);
            let block = ClientBlock {
                volume_id: request.volume_id,
                logical_block: *next_block,
                contents: request.contents_of(*next_block, merged),
                checksum: checksums[index],
            };
            let prepared_block = prepared.get_mut(index).and_then(Option::take);
            compressed_write::append_block(&mut state, codec, block, prepared_block, sealed)?;
            *next_block += 1;
        }
        if *next_block > request.last_block() && !fua && self.write_behind().write_appended() {
            let before = sealed.len();
            sealed.extend(state.seal_open_batch());
            if sealed.len() > before {
                self.write_behind().sealed();
            }
        }
        let over_dirty_limit = state.counters().unflushed_bytes() > self.limits().dirty_bytes_max;
        Ok(Appended::Blocks { over_dirty_limit })
    }

    /// Makes `length` bytes at `offset` read as zeros. Whole blocks are unmapped
    /// (their space becomes reclaimable) unless `punch_hole` is false, in which
    /// case zero blocks are written; partial blocks at the edges are zeroed in place.
    pub(in crate::pool) async fn write_zeroes(
        self: &Arc<Self>,
        volume_id: u32,
        offset: u64,
        length: u64,
        fua: bool,
        punch_hole: bool,
    ) -> Result<(), EngineError> {
        {
            let state = self.lock();
            check_range(state.volumes(), View::Volume(volume_id), offset, length)?;
        }
        if length == 0 {
            return if fua { self.flush().await } else { Ok(()) };
        }
        let end = offset + length;
        let whole = offset.next_multiple_of(BLOCK_SIZE_BYTES)..end - end % BLOCK_SIZE_BYTES;
        if whole.is_empty() {
            let zeros = vec![0u8; to_usize(length)];
            return self.write(volume_id, offset, &zeros, fua).await;
        }
        self.zero_edges(volume_id, offset..end, &whole).await?;
        if punch_hole {
            let record = Record::Unmap {
                volume_id,
                logical_block: whole.start / BLOCK_SIZE_BYTES,
                block_count: (whole.end - whole.start) / BLOCK_SIZE_BYTES,
            };
            self.append_record(|_| Ok(record.clone())).await?;
        } else {
            self.write_zero_blocks(volume_id, whole).await?;
        }
        if fua { self.flush().await } else { Ok(()) }
    }

    /// Writes zeros over the bytes of `range` before and after its whole
    /// blocks `whole` (both ranges of bytes).
    async fn zero_edges(
        self: &Arc<Self>,
        volume_id: u32,
        range: Range<u64>,
        whole: &Range<u64>,
    ) -> Result<(), EngineError> {
        assert!(range.start <= whole.start && whole.end <= range.end);
        if range.start < whole.start {
            let zeros = vec![0u8; to_usize(whole.start - range.start)];
            self.write(volume_id, range.start, &zeros, false).await?;
        }
        if whole.end < range.end {
            let zeros = vec![0u8; to_usize(range.end - whole.end)];
            self.write(volume_id, whole.end, &zeros, false).await?;
        }
        Ok(())
    }

    /// Writes blocks of zeros over `whole`, a range of bytes on block boundaries.
    async fn write_zero_blocks(
        self: &Arc<Self>,
        volume_id: u32,
        whole: Range<u64>,
    ) -> Result<(), EngineError> {
        assert!(
            whole.start.is_multiple_of(BLOCK_SIZE_BYTES)
                && whole.end.is_multiple_of(BLOCK_SIZE_BYTES)
        );
        let chunk_bytes = ZEROES_PER_WRITE_BLOCKS_MAX * BLOCK_SIZE_BYTES;
        let zeros = vec![0u8; to_usize(chunk_bytes)];
        let mut position = whole.start;
        while position < whole.end {
            let step = (whole.end - position).min(chunk_bytes);
            self.write(volume_id, position, &zeros[..to_usize(step)], false)
                .await?;
            position += step;
        }
        Ok(())
    }

    /// Discards a range: the same as punching zeros (reads return zeros after).
    pub(in crate::pool) async fn trim(
        self: &Arc<Self>,
        volume_id: u32,
        offset: u64,
        length: u64,
        fua: bool,
    ) -> Result<(), EngineError> {
        self.write_zeroes(volume_id, offset, length, fua, true)
            .await
    }

    /// Appends a record without data and applies it; when the pool is full,
    /// reclaims space and tries again, rebuilding the record so that it is
    /// checked against the state of that moment.
    pub(in crate::pool) async fn append_record(
        self: &Arc<Self>,
        build: impl Fn(&State) -> Result<Record, EngineError>,
    ) -> Result<(), EngineError> {
        loop {
            let result = {
                let mut state = self.lock();
                let record = build(&state)?;
                state.append_record(record)
            };
            match result {
                Ok(sealed) => {
                    self.spawn_writes(sealed);
                    return Ok(());
                }
                Err(EngineError::Io(IoError::NoSpace)) if Cleaner::new(self).reclaim().await? => {}
                Err(error) => return Err(error),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)] // test patterns: small indexes, wrapping bytes
mod tests {
    use super::*;

    fn request(offset: u64, data: &[u8]) -> WriteRequest<'_> {
        WriteRequest {
            volume_id: 1,
            offset,
            data,
        }
    }

    #[test]
    fn partial_blocks_are_the_edges_a_write_covers_in_part() {
        let data = vec![0u8; 3 * BLOCK_BYTES];
        assert!(request(0, &data).partial_blocks().is_empty());
        assert_eq!(request(100, &data).partial_blocks(), [0, 3]);
        assert_eq!(request(100, &data[..10]).partial_blocks(), [0]);
        assert_eq!(
            request(BLOCK_SIZE_BYTES, &data[..100]).partial_blocks(),
            [1]
        );
    }

    #[test]
    fn contents_of_a_block_come_from_the_merge_or_the_request() {
        let data: Vec<u8> = (0..2 * BLOCK_BYTES).map(|index| index as u8).collect();
        let write = request(100, &data);
        let merged = [MergedBlock {
            logical_block: 0,
            contents: vec![7; BLOCK_BYTES],
        }];
        assert_eq!(write.contents_of(0, &merged), &merged[0].contents[..]);
        assert_eq!(
            write.contents_of(1, &merged),
            &data[BLOCK_BYTES - 100..2 * BLOCK_BYTES - 100]
        );
    }
}
