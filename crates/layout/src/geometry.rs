//! Where each block of an array lives: which device, which block of it. Pure
//! arithmetic, no I/O, so that every reader and writer of the array agrees.
//!
//! A member device holds, in order: its label area, the zone table's two
//! copies (version 3 arrays), the **mirrored prefix** (the array's first
//! `prefix_blocks` blocks, copied on the prefix's holders and unused on the
//! others: the engine's superblock, flush markers and checkpoint slots,
//! which are rewritten in place and so must never be striped under parity),
//! then the **striped region**, one block of each row per member of the
//! row's set, at member block `label_area + 2·table + prefix + r`. The
//! striped region is cut into zones of `zone_rows` rows (one engine segment
//! each), each striped over its own member set (`stripe.rs`); a version 2
//! array is one zone at the full set.

use crate::redundancy::Redundancy;

/// Member blocks before the mirrored prefix: the member label and its copy.
pub const LABEL_AREA_BLOCKS: u64 = 64;
/// Member block of the label.
pub const LABEL_BLOCK: u64 = 0;
/// Member block of the label's copy, far enough from block 0 not to share
/// its sectors.
pub const LABEL_COPY_BLOCK: u64 = 32;
/// Bytes of a block.
pub const BLOCK_BYTES: usize = 4096;
/// Bytes of a block, as a device offset.
pub const BLOCK_SIZE_BYTES: u64 = 4096;

const _: () = assert!(LABEL_BLOCK < LABEL_COPY_BLOCK && LABEL_COPY_BLOCK < LABEL_AREA_BLOCKS);
const _: () = assert!(BLOCK_SIZE_BYTES == lamina_device::DEVICE_ALIGNMENT_BYTES);

/// A block count or index within memory, as a `usize`.
pub(crate) fn to_usize(value: u64) -> usize {
    usize::try_from(value).expect("a block count within a request fits in a usize")
}

/// The shape of one array, fixed at creation (stored in every label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayGeometry {
    pub redundancy: Redundancy,
    pub member_count: usize,
    /// Blocks of the mirrored prefix.
    pub prefix_blocks: u64,
    /// Rows of the striped region (blocks of it on each member).
    pub row_count: u64,
    /// Rows per zone (version 3; a version 2 array is one zone of
    /// `row_count` rows).
    pub zone_rows: u64,
    /// Blocks of one copy of the zone table (0: no table, version 2).
    pub table_blocks: u64,
}

/// Zone table entries per table block (one byte each, after a 64-byte
/// header; `docs/format.md`, "Zone table").
pub const ZONE_TABLE_ENTRIES_PER_BLOCK: u64 = 4032;

/// What a member holds in one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Column {
    Data(usize),
    Parity(usize),
}

impl ArrayGeometry {
    /// The geometry over members of `member_size_bytes` (the smallest member's
    /// size), or `None` when they have no room for one row.
    pub fn for_members(
        redundancy: Redundancy,
        member_count: usize,
        prefix_blocks: u64,
        member_size_bytes: u64,
    ) -> Option<Self> {
        assert!(member_count >= redundancy.member_count_min());
        let member_blocks = member_size_bytes / BLOCK_SIZE_BYTES;
        let row_count = member_blocks.checked_sub(LABEL_AREA_BLOCKS + prefix_blocks)?;
        (row_count > 0).then_some(Self {
            redundancy,
            member_count,
            prefix_blocks,
            row_count,
            zone_rows: row_count,
            table_blocks: 0,
        })
    }

    /// The geometry of a version 3 array with zones of `zone_rows` rows:
    /// as many whole zones as fit beside their table. `None` when not one
    /// fits.
    pub fn for_members_zoned(
        redundancy: Redundancy,
        member_count: usize,
        prefix_blocks: u64,
        member_size_bytes: u64,
        zone_rows: u64,
    ) -> Option<Self> {
        assert!(member_count >= redundancy.member_count_min() && zone_rows > 0);
        let member_blocks = member_size_bytes / BLOCK_SIZE_BYTES;
        let available = member_blocks.checked_sub(LABEL_AREA_BLOCKS + prefix_blocks)?;
        let table_blocks_for = |zones: u64| zones.div_ceil(ZONE_TABLE_ENTRIES_PER_BLOCK).max(1);
        let mut zones = available / zone_rows;
        // The table takes a few blocks from the rows: give up zones until
        // both fit (a handful of steps: a table block serves 4032 zones).
        while zones > 0 && 2 * table_blocks_for(zones) + zones * zone_rows > available {
            zones -= 1;
        }
        (zones > 0).then_some(Self {
            redundancy,
            member_count,
            prefix_blocks,
            row_count: zones * zone_rows,
            zone_rows,
            table_blocks: table_blocks_for(zones),
        })
    }

    /// Whether the array has zones of their own sets (version 3).
    pub fn is_zoned(&self) -> bool {
        self.table_blocks > 0
    }

    pub fn zone_count(&self) -> u64 {
        self.row_count / self.zone_rows
    }

    /// Array blocks of one zone's address range: its rows at the full
    /// set's data columns.
    pub fn zone_address_blocks(&self) -> u64 {
        self.zone_rows * self.row_data_blocks()
    }

    /// Member block of block `index` of table copy `copy` (0: A, 1: B).
    pub fn table_member_block(&self, copy: u64, index: u64) -> u64 {
        assert!(copy < 2 && index < self.table_blocks);
        LABEL_AREA_BLOCKS + copy * self.table_blocks + index
    }

    /// Member block holding prefix block `block` (on the prefix's holders).
    pub fn prefix_member_block(&self, block: u64) -> u64 {
        assert!(block <= self.prefix_blocks);
        LABEL_AREA_BLOCKS + 2 * self.table_blocks + block
    }

    pub fn data_columns(&self) -> usize {
        self.redundancy.data_columns(self.member_count)
    }

    pub fn parity_columns(&self) -> usize {
        self.redundancy.parity_columns(self.member_count)
    }

    /// Data blocks per row, as a block count: every write into the striped
    /// region starts at a multiple of it (counted from the prefix's end).
    pub fn row_data_blocks(&self) -> u64 {
        self.data_columns() as u64
    }

    /// Copies of the mirrored prefix the array keeps: one more than the
    /// parity columns, so that losing as many members as the parity covers
    /// leaves a copy. Every flush rewrites a flush marker in the prefix, so
    /// copies beyond that would cost a block per member per flush.
    pub fn prefix_copies(&self) -> usize {
        (self.parity_columns() + 1).min(self.member_count)
    }

    /// Blocks the array presents.
    pub fn size_blocks(&self) -> u64 {
        self.prefix_blocks + self.row_count * self.row_data_blocks()
    }

    /// Blocks each member needs.
    pub fn member_size_blocks(&self) -> u64 {
        LABEL_AREA_BLOCKS + 2 * self.table_blocks + self.prefix_blocks + self.row_count
    }

    /// Member block holding every member's part of `row`.
    pub fn member_block_of_row(&self, row: u64) -> u64 {
        LABEL_AREA_BLOCKS + 2 * self.table_blocks + self.prefix_blocks + row
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raid6_of_six() -> ArrayGeometry {
        ArrayGeometry::for_members(Redundancy::Raid6, 6, 1024, 64 << 20).unwrap()
    }

    #[test]
    fn a_version_2_geometry_uses_the_whole_member() {
        let geometry = raid6_of_six();
        assert_eq!(geometry.row_data_blocks(), 4);
        assert_eq!(geometry.prefix_member_block(5), LABEL_AREA_BLOCKS + 5);
        assert_eq!(
            geometry.member_size_blocks() * BLOCK_SIZE_BYTES,
            64 << 20,
            "the whole member is used"
        );
    }

    #[test]
    fn zones_and_their_table_fit_the_member() {
        let member_bytes = 64 << 20;
        let geometry =
            ArrayGeometry::for_members_zoned(Redundancy::Raid6, 6, 1024, member_bytes, 256)
                .unwrap();
        assert!(geometry.is_zoned());
        assert_eq!(geometry.row_count % 256, 0);
        assert!(geometry.member_size_blocks() * BLOCK_SIZE_BYTES <= member_bytes);
        assert!(
            (geometry.member_size_blocks() + 256) * BLOCK_SIZE_BYTES > member_bytes,
            "no room for one more zone"
        );
        assert_eq!(geometry.prefix_member_block(0), LABEL_AREA_BLOCKS + 2);
        assert_eq!(
            geometry.member_block_of_row(0),
            LABEL_AREA_BLOCKS + 2 + 1024
        );
    }

    #[test]
    fn members_too_small_for_a_row_are_refused() {
        let too_small = (LABEL_AREA_BLOCKS + 1024) * BLOCK_SIZE_BYTES;
        assert_eq!(
            ArrayGeometry::for_members(Redundancy::Raid6, 6, 1024, too_small),
            None
        );
    }
}
