//! Where each block of an array lives: which device, which block of it. Pure
//! arithmetic, no I/O, so that every reader and writer of the array agrees.
//!
//! A member device holds, in order: its label area, the **mirrored prefix**
//! (the array's first `prefix_blocks` blocks, copied on the first
//! `parity_columns + 1` members and unused on the others: the engine's
//! superblock, flush markers and checkpoint slots, which are rewritten in
//! place and so must never be striped under parity), then the
//! **striped region**, one block of each row per member. Row `r` holds
//! `data_columns` data blocks and `parity_columns` parity blocks, one per
//! member, at member block `label_area + prefix + r`; parity rotates by one
//! member per row so that every member takes its share of parity writes and
//! of reads. The array's block `prefix + s` is data column `s % data_columns`
//! of row `s / data_columns`.

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

/// The shape of one array, fixed at creation (stored in every label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArrayGeometry {
    pub redundancy: Redundancy,
    pub member_count: usize,
    /// Blocks of the mirrored prefix.
    pub prefix_blocks: u64,
    /// Rows of the striped region (blocks of it on each member).
    pub row_count: u64,
}

/// Where an array block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// In the mirrored prefix: the same member block on every member.
    Prefix { member_block: u64 },
    /// Data column `column` of row `row`.
    Striped { row: u64, column: usize },
}

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
        })
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

    /// The members holding a copy of the mirrored prefix: one more than the
    /// parity columns (the first ones), so that losing as many members as the
    /// parity covers leaves a copy. Every flush rewrites a flush marker in the
    /// prefix, so copies beyond that would cost a block per member per flush.
    pub fn prefix_members(&self) -> std::ops::Range<usize> {
        0..(self.parity_columns() + 1).min(self.member_count)
    }

    /// Blocks the array presents.
    pub fn size_blocks(&self) -> u64 {
        self.prefix_blocks + self.row_count * self.row_data_blocks()
    }

    /// Blocks each member needs.
    pub fn member_size_blocks(&self) -> u64 {
        LABEL_AREA_BLOCKS + self.prefix_blocks + self.row_count
    }

    pub fn locate(&self, block: u64) -> Location {
        assert!(block < self.size_blocks(), "block {block} beyond the array");
        match block.checked_sub(self.prefix_blocks) {
            None => Location::Prefix {
                member_block: LABEL_AREA_BLOCKS + block,
            },
            Some(striped) => Location::Striped {
                row: striped / self.row_data_blocks(),
                column: usize::try_from(striped % self.row_data_blocks())
                    .expect("a column index is below the member count"),
            },
        }
    }

    /// The array block of data column `column` of `row`.
    pub fn block_of(&self, row: u64, column: usize) -> u64 {
        self.prefix_blocks + row * self.row_data_blocks() + column as u64
    }

    /// Member block holding every member's part of `row`.
    pub fn member_block_of_row(&self, row: u64) -> u64 {
        LABEL_AREA_BLOCKS + self.prefix_blocks + row
    }

    /// The member holding `column` of `row`.
    pub fn member_of(&self, row: u64, column: Column) -> usize {
        let rotation =
            usize::try_from(row % self.member_count as u64).expect("below the member count");
        let position = match column {
            Column::Parity(index) => {
                assert!(index < self.parity_columns());
                index
            }
            Column::Data(index) => {
                assert!(index < self.data_columns());
                self.parity_columns() + index
            }
        };
        (rotation + position) % self.member_count
    }

    /// What `member` holds in `row`.
    pub fn column_of(&self, row: u64, member: usize) -> Column {
        assert!(member < self.member_count);
        let rotation =
            usize::try_from(row % self.member_count as u64).expect("below the member count");
        let position = (member + self.member_count - rotation) % self.member_count;
        if position < self.parity_columns() {
            Column::Parity(position)
        } else {
            Column::Data(position - self.parity_columns())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raid6_of_six() -> ArrayGeometry {
        ArrayGeometry::for_members(Redundancy::Raid6, 6, 1024, 64 << 20).unwrap()
    }

    #[test]
    fn every_member_holds_one_column_of_every_row() {
        for scheme in Redundancy::ALL {
            for members in scheme.member_count_min()..=8 {
                let geometry = ArrayGeometry::for_members(scheme, members, 16, 1 << 20).unwrap();
                for row in 0..20 {
                    let mut seen = vec![false; members];
                    for (member, seen) in seen.iter_mut().enumerate() {
                        let column = geometry.column_of(row, member);
                        assert_eq!(geometry.member_of(row, column), member);
                        assert!(!std::mem::replace(seen, true));
                    }
                }
            }
        }
    }

    #[test]
    fn blocks_locate_to_rows_and_columns_and_back() {
        let geometry = raid6_of_six();
        assert_eq!(geometry.row_data_blocks(), 4);
        assert_eq!(
            geometry.locate(5),
            Location::Prefix {
                member_block: LABEL_AREA_BLOCKS + 5
            }
        );
        for block in 1024..1100 {
            let Location::Striped { row, column } = geometry.locate(block) else {
                panic!("striped");
            };
            assert_eq!(geometry.block_of(row, column), block);
        }
        assert_eq!(
            geometry.member_size_blocks() * BLOCK_SIZE_BYTES,
            64 << 20,
            "the whole member is used"
        );
    }

    #[test]
    fn parity_rotates_over_every_member() {
        let geometry = raid6_of_six();
        let mut parity_rows = [0_u32; 6];
        for row in 0..60 {
            parity_rows[geometry.member_of(row, Column::Parity(0))] += 1;
        }
        assert!(parity_rows.iter().all(|count| *count == 10));
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
