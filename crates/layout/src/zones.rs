//! The zone table: which member set each zone (one engine segment) is
//! striped over, one byte per zone, in memory and on every member in two
//! copies (`docs/format.md`, "Zone table"). A block is written copy A to
//! every usable member, flushed, then copy B, flushed, each copy with its own
//! checksum and a sequence number raised by every write, so a torn write
//! leaves the other copy; assembly takes, per block, the valid copy with the
//! highest sequence from any usable member.

use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockDevice, DeviceError};

use crate::array::RedundantArray;
use crate::geometry::to_usize;
use crate::geometry::{BLOCK_BYTES, BLOCK_SIZE_BYTES, ZONE_TABLE_ENTRIES_PER_BLOCK};
use crate::stripe::ZoneView;

/// The table block's magic: "LAMINAZT" read as a little-endian u64.
const TABLE_MAGIC: u64 = u64::from_le_bytes(*b"LAMINAZT");
/// Bytes of a table block's header; the entries follow.
const TABLE_HEADER_BYTES: usize = 64;
/// Where the checksum sits in the header.
const CHECKSUM_AT: std::ops::Range<usize> = 36..40;

const _: () =
    assert!(TABLE_HEADER_BYTES as u64 + ZONE_TABLE_ENTRIES_PER_BLOCK == BLOCK_BYTES as u64);

/// Member sets a label may list (one byte per zone could name 255; the
/// label, with its member paths, must fit one block: 64 sets of a u64 mask
/// take at most 640 of its bytes). An index no zone uses is reused first.
pub const MEMBER_SETS_MAX: usize = 64;

/// Table block `index` as stored.
pub(crate) fn encode_table_block(
    array_identifier: u128,
    sequence: u64,
    index: u64,
    entries: &[u8],
) -> AlignedBuffer {
    assert_eq!(entries.len() as u64, ZONE_TABLE_ENTRIES_PER_BLOCK);
    let mut block = AlignedBuffer::zeroed(BLOCK_BYTES);
    block[0..8].copy_from_slice(&TABLE_MAGIC.to_le_bytes());
    block[8..24].copy_from_slice(&array_identifier.to_le_bytes());
    block[24..32].copy_from_slice(&sequence.to_le_bytes());
    let index = u32::try_from(index).expect("table blocks fit in u32");
    block[32..36].copy_from_slice(&index.to_le_bytes());
    block[TABLE_HEADER_BYTES..].copy_from_slice(entries);
    let checksum = table_checksum(&block);
    block[CHECKSUM_AT].copy_from_slice(&checksum.to_le_bytes());
    block
}

fn table_checksum(block: &[u8]) -> u32 {
    let head = crc32c::crc32c(&block[..CHECKSUM_AT.start]);
    crc32c::crc32c_append(head, &block[CHECKSUM_AT.end..])
}

/// A stored table block's sequence and entries, if it is block `index` of
/// this array's table and passes its checksum.
pub(crate) fn decode_table_block(
    block: &[u8],
    array_identifier: u128,
    index: u64,
) -> Option<(u64, Vec<u8>)> {
    let field = |range: std::ops::Range<usize>| block[range].to_vec();
    let u64_at = |at: usize| u64::from_le_bytes(block[at..at + 8].try_into().expect("8 bytes"));
    if block.len() != BLOCK_BYTES || u64_at(0) != TABLE_MAGIC {
        return None;
    }
    let stored = u32::from_le_bytes(field(CHECKSUM_AT).try_into().expect("4 bytes"));
    let identifier = u128::from_le_bytes(field(8..24).try_into().expect("16 bytes"));
    let stored_index = u32::from_le_bytes(field(32..36).try_into().expect("4 bytes"));
    let valid = stored == table_checksum(block)
        && identifier == array_identifier
        && u64::from(stored_index) == index;
    valid.then(|| (u64_at(24), block[TABLE_HEADER_BYTES..].to_vec()))
}

/// Consecutive table blocks written together, as stored.
struct TableRun {
    first_block: u64,
    blocks: Arc<AlignedBuffer>,
}

/// The newest valid copy of each table block found so far.
struct NewestBlocks {
    blocks: Vec<Option<(u64, Vec<u8>)>>,
}

impl NewestBlocks {
    fn offer(&mut self, index: u64, candidate: (u64, Vec<u8>)) {
        let slot = &mut self.blocks[to_usize(index)];
        if slot
            .as_ref()
            .is_none_or(|(sequence, _)| candidate.0 > *sequence)
        {
            *slot = Some(candidate);
        }
    }
}

impl RedundantArray {
    /// The zone holding array block `block` (a striped block).
    pub(crate) fn zone_of_block(&self, block: u64) -> ZoneView {
        let striped = block - self.geometry.prefix_blocks;
        self.zone(striped / self.geometry.zone_address_blocks())
    }

    /// The zone holding row `row`.
    pub(crate) fn zone_of_row(&self, row: u64) -> ZoneView {
        self.zone(row / self.geometry.zone_rows)
    }

    pub(crate) fn zone(&self, index: u64) -> ZoneView {
        let stripe = self.zones.read().expect("zone state lock").stripe_of(index);
        ZoneView::new(&self.geometry, index, stripe)
    }

    /// Sets every zone of `zones` to set `set` and makes the table durable
    /// on every usable member in one update, whatever the number of zones:
    /// the run of table blocks holding them, each with a new sequence, as
    /// one write per member of copy A, a flush, the same of copy B, a
    /// flush. Stale labels (a member missing since assembly) are rewritten
    /// first, so a member that missed table writes never counts again.
    /// Called under `open_lock`, for zones nothing reads or writes (free
    /// engine segments).
    ///
    /// Why a power cut anywhere in it leaves every zone at its old or its
    /// new set: a table block is written whole with its own checksum and
    /// assembly takes, per block, the valid copy with the highest sequence
    /// on any usable member. Before copy A's flush every member still holds
    /// a valid copy B of the old block (torn A copies fail their checksum,
    /// whole ones are the new block); between the flushes copy A is the new
    /// block, durable; during copy B, copy A stays. So each block is old
    /// or new as a whole, and the zones in it with it. Which one does not
    /// matter for what they held (nothing: they are free), and the caller
    /// writes into them only after this returns, when both copies are
    /// durable: the new set is what assembly finds.
    pub(crate) async fn persist_zone_sets(
        &self,
        zones: &[u64],
        set: u8,
    ) -> Result<(), DeviceError> {
        assert!(!zones.is_empty(), "a table update changes some zone");
        self.flush_members_and_labels().await?;
        let run = {
            let mut state = self.zones.write().expect("zone state lock");
            for zone in zones {
                state.table[to_usize(*zone)] = set;
            }
            let blocks = zones.iter().map(|zone| zone / ZONE_TABLE_ENTRIES_PER_BLOCK);
            let first = blocks.clone().min().expect("some zone");
            let last = blocks.max().expect("some zone");
            let mut run = AlignedBuffer::zeroed(to_usize(last - first + 1) * BLOCK_BYTES);
            for block_index in first..=last {
                let sequence = self
                    .next_table_sequence
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                state.sequences[to_usize(block_index)] = sequence;
                let entries = state.entries_of_block(block_index);
                let block =
                    encode_table_block(self.array_identifier, sequence, block_index, &entries);
                let at = to_usize(block_index - first) * BLOCK_BYTES;
                run[at..at + BLOCK_BYTES].copy_from_slice(&block);
            }
            TableRun {
                first_block: first,
                blocks: Arc::new(run),
            }
        };
        for copy in 0..2 {
            let offset = self.geometry.table_member_block(copy, run.first_block) * BLOCK_SIZE_BYTES;
            let writes = (0..self.members.len()).map(|index| (index, offset, run.blocks.clone()));
            self.write_members(writes).await?;
            self.flush_members_and_labels().await?;
        }
        Ok(())
    }

    /// Writes the whole table, both copies, to `device` and flushes it: a
    /// replacement before it takes its member's place, a member added into
    /// an empty slot before it joins the write set.
    pub(crate) async fn write_whole_table(
        &self,
        device: &dyn BlockDevice,
    ) -> Result<(), DeviceError> {
        if !self.geometry.is_zoned() {
            return Ok(());
        }
        let blocks: Vec<AlignedBuffer> = {
            let state = self.zones.read().expect("zone state lock");
            (0..self.geometry.table_blocks)
                .map(|index| {
                    let entries = state.entries_of_block(index);
                    let sequence = state.sequences[to_usize(index)];
                    encode_table_block(self.array_identifier, sequence, index, &entries)
                })
                .collect()
        };
        for copy in 0..2 {
            for (index, block) in blocks.iter().enumerate() {
                let member_block = self.geometry.table_member_block(copy, index as u64);
                device
                    .write(member_block * BLOCK_SIZE_BYTES, Arc::new(block.clone()))
                    .await?;
            }
            device.flush().await?;
        }
        Ok(())
    }

    /// Reads the table from every usable member at assembly: per block, the
    /// valid copy with the highest sequence. `Ok(false)` when some block has
    /// no valid copy on any usable member.
    pub(crate) async fn load_zone_table(&self) -> Result<bool, DeviceError> {
        let blocks = self.geometry.table_blocks;
        let mut newest = NewestBlocks {
            blocks: vec![None; to_usize(blocks)],
        };
        for (member_index, member) in self.members.iter().enumerate() {
            let Some(device) = member.usable_device() else {
                continue;
            };
            for copy in 0..2 {
                let offset = self.geometry.table_member_block(copy, 0) * BLOCK_SIZE_BYTES;
                let data = match device.read(offset, to_usize(blocks) * BLOCK_BYTES).await {
                    Ok(data) => data,
                    Err(error) => {
                        // A member that cannot be read is faulted, as on
                        // any I/O; the others hold the table too.
                        self.member_failed(member_index, &error);
                        break;
                    }
                };
                for (index, block) in data.chunks_exact(BLOCK_BYTES).enumerate() {
                    let index = index as u64;
                    if let Some(found) = decode_table_block(block, self.array_identifier, index) {
                        newest.offer(index, found);
                    }
                }
            }
        }
        let mut state = self.zones.write().expect("zone state lock");
        let zone_count = to_usize(self.geometry.zone_count());
        let mut table = Vec::with_capacity(zone_count);
        for (index, block) in newest.blocks.into_iter().enumerate() {
            let Some((sequence, entries)) = block else {
                return Ok(false);
            };
            state.sequences[index] = sequence;
            self.next_table_sequence
                .fetch_max(sequence + 1, std::sync::atomic::Ordering::SeqCst);
            table.extend_from_slice(&entries);
        }
        table.truncate(zone_count);
        if table.iter().any(|set| {
            state
                .sets
                .get(usize::from(*set))
                .is_none_or(Option::is_none)
        }) {
            return Ok(false);
        }
        state.table = table;
        Ok(true)
    }
}
