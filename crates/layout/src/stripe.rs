//! How the rows of one zone are striped over its member set, and which zone
//! an array block or row falls in. A member set is a bitmask of member
//! indexes; its members, in ascending index order, are the row's positions,
//! parity rotating one position per (global) row, exactly as a version 2
//! array rotates over all its members, so a zone at the full set is laid out
//! as before. Pure arithmetic, no I/O.

use std::sync::Arc;

use crate::codec::ParityCodec;
use crate::geometry::{ArrayGeometry, Column, ZONE_TABLE_ENTRIES_PER_BLOCK, to_usize};
use crate::redundancy::Redundancy;

/// A member set: bit `i` set for member `i` (at most 64 members).
pub(crate) type SetMask = u64;

/// The set of members `0..member_count`.
pub(crate) fn full_set(member_count: usize) -> SetMask {
    assert!((1..=64).contains(&member_count));
    u64::MAX >> (64 - member_count)
}

/// The member indexes of `mask`, ascending.
pub(crate) fn members_of(mask: SetMask) -> Vec<usize> {
    (0..64).filter(|index| mask & (1 << index) != 0).collect()
}

/// One member set's row layout and parity code.
#[derive(Debug)]
pub(crate) struct Stripe {
    mask: SetMask,
    members: Vec<usize>,
    parity_columns: usize,
    codec: ParityCodec,
}

impl Stripe {
    /// The layout over `mask` with `codec`, the code for its width.
    pub fn new(redundancy: Redundancy, mask: SetMask, codec: ParityCodec) -> Self {
        let members = members_of(mask);
        assert!(members.len() >= redundancy.member_count_min());
        assert_eq!(codec.data_columns() + codec.parity_columns(), members.len());
        Self {
            mask,
            parity_columns: redundancy.parity_columns(members.len()),
            members,
            codec,
        }
    }

    pub fn mask(&self) -> SetMask {
        self.mask
    }

    pub fn members(&self) -> &[usize] {
        &self.members
    }

    pub fn contains(&self, member: usize) -> bool {
        member < 64 && self.mask & (1 << member) != 0
    }

    pub fn width(&self) -> usize {
        self.members.len()
    }

    pub fn data_columns(&self) -> usize {
        self.width() - self.parity_columns
    }

    pub fn parity_columns(&self) -> usize {
        self.parity_columns
    }

    pub fn codec(&self) -> &ParityCodec {
        &self.codec
    }

    fn rotation(&self, row: u64) -> usize {
        usize::try_from(row % self.width() as u64).expect("below the width")
    }

    /// The member holding `column` of `row`.
    pub fn member_of(&self, row: u64, column: Column) -> usize {
        let position = match column {
            Column::Parity(index) => {
                assert!(index < self.parity_columns);
                index
            }
            Column::Data(index) => {
                assert!(index < self.data_columns());
                self.parity_columns + index
            }
        };
        self.members[(self.rotation(row) + position) % self.width()]
    }

    /// What `member` holds in `row`; `None` when it is not in the set.
    pub fn column_of(&self, row: u64, member: usize) -> Option<Column> {
        let slot = self.members.iter().position(|index| *index == member)?;
        let position = (slot + self.width() - self.rotation(row)) % self.width();
        Some(if position < self.parity_columns {
            Column::Parity(position)
        } else {
            Column::Data(position - self.parity_columns)
        })
    }

    /// The member at each codec position of `row`: data columns first,
    /// then parity (the order [`ParityCodec::reconstruct`] takes).
    pub fn codec_order(&self, row: u64) -> impl Iterator<Item = usize> + '_ {
        let data = (0..self.data_columns()).map(Column::Data);
        let parity = (0..self.parity_columns).map(Column::Parity);
        data.chain(parity)
            .map(move |column| self.member_of(row, column))
    }
}

/// One zone as reads and writes see it: its rows and its set's layout.
#[derive(Clone, Debug)]
pub(crate) struct ZoneView {
    pub index: u64,
    pub stripe: Arc<Stripe>,
    /// The array block of the zone's start.
    pub first_block: u64,
    pub first_row: u64,
    pub row_count: u64,
}

impl ZoneView {
    pub fn new(geometry: &ArrayGeometry, index: u64, stripe: Arc<Stripe>) -> Self {
        Self {
            index,
            stripe,
            first_block: geometry.prefix_blocks + index * geometry.zone_address_blocks(),
            first_row: index * geometry.zone_rows,
            row_count: geometry.zone_rows,
        }
    }

    pub fn row_data_blocks(&self) -> u64 {
        self.stripe.data_columns() as u64
    }

    /// Blocks of the zone that hold data (a narrowed zone holds fewer than
    /// its address range).
    pub fn usable_blocks(&self) -> u64 {
        self.row_count * self.row_data_blocks()
    }

    pub fn usable_end(&self) -> u64 {
        self.first_block + self.usable_blocks()
    }

    pub fn last_row(&self) -> u64 {
        self.first_row + self.row_count - 1
    }

    /// The row and data column of usable block `block`.
    pub fn locate(&self, block: u64) -> (u64, usize) {
        assert!(
            block >= self.first_block && block < self.usable_end(),
            "block {block} outside zone {}'s usable blocks",
            self.index
        );
        let offset = block - self.first_block;
        let column = usize::try_from(offset % self.row_data_blocks()).expect("a column");
        (self.first_row + offset / self.row_data_blocks(), column)
    }

    /// The array block of data column `column` of `row`.
    pub fn block_of(&self, row: u64, column: usize) -> u64 {
        assert!(row >= self.first_row && row <= self.last_row());
        self.first_block + (row - self.first_row) * self.row_data_blocks() + column as u64
    }

    /// The row holding usable block `block`, or the zone's last row for a
    /// block past the usable ones.
    pub fn row_of_clamped(&self, block: u64) -> u64 {
        if block >= self.usable_end() {
            return self.last_row();
        }
        self.locate(block).0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe(redundancy: Redundancy, mask: SetMask) -> Stripe {
        let width = members_of(mask).len();
        Stripe::new(redundancy, mask, ParityCodec::new(redundancy, width))
    }

    #[test]
    fn every_member_of_a_set_holds_one_column_of_every_row() {
        for scheme in Redundancy::ALL {
            for members in scheme.member_count_min()..=8 {
                // The full set, and the set without member 1 when wide enough.
                let mut masks = vec![full_set(members)];
                if members > scheme.member_count_min() {
                    masks.push(full_set(members) & !0b10);
                }
                for mask in masks {
                    let stripe = stripe(scheme, mask);
                    for row in 0..20 {
                        let mut seen = Vec::new();
                        for member in stripe.members() {
                            let column = stripe.column_of(row, *member).unwrap();
                            assert_eq!(stripe.member_of(row, column), *member);
                            seen.push(column);
                        }
                        seen.sort_by_key(|column| format!("{column:?}"));
                        seen.dedup();
                        assert_eq!(seen.len(), stripe.width());
                        assert_eq!(
                            stripe.column_of(row, 1),
                            (mask & 0b10 != 0)
                                .then(|| stripe.column_of(row, 1))
                                .flatten()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_full_set_is_laid_out_as_version_2() {
        // Version 2: parity k of row r on member (r + k) mod n, data j on
        // (r + p + j) mod n.
        let stripe = stripe(Redundancy::Raid6, full_set(6));
        for row in 0..12_u64 {
            let rotation = (row % 6) as usize;
            assert_eq!(stripe.member_of(row, Column::Parity(1)), (rotation + 1) % 6);
            assert_eq!(stripe.member_of(row, Column::Data(3)), (rotation + 5) % 6);
        }
    }

    #[test]
    fn parity_rotates_over_every_member_of_a_narrowed_set() {
        let stripe = stripe(Redundancy::Raid6, 0b11_1101);
        let mut parity_rows = [0_u32; 6];
        for row in 0..50 {
            parity_rows[stripe.member_of(row, Column::Parity(0))] += 1;
        }
        assert_eq!(parity_rows, [10, 0, 10, 10, 10, 10]);
    }

    #[test]
    fn a_narrowed_zone_maps_blocks_to_fewer_columns() {
        let geometry =
            ArrayGeometry::for_members_zoned(Redundancy::Raid6, 6, 16, 8 << 20, 8).unwrap();
        let zone = ZoneView::new(&geometry, 2, Arc::new(stripe(Redundancy::Raid6, 0b11_1110)));
        assert_eq!(zone.first_block, 16 + 2 * 8 * 4);
        assert_eq!(zone.usable_blocks(), 8 * 3);
        for block in zone.first_block..zone.usable_end() {
            let (row, column) = zone.locate(block);
            assert_eq!(zone.block_of(row, column), block);
        }
        assert_eq!(zone.row_of_clamped(zone.usable_end() + 3), 23);
    }
}

/// The zones' sets, in memory (the table's latest intended state: an entry
/// is set before its block is written, so a failed write keeps the new
/// entry, and its set index from reuse).
#[derive(Debug)]
pub(crate) struct ZoneState {
    /// By set index; `None` for an unused index.
    pub sets: Vec<Option<Arc<Stripe>>>,
    /// Set index of each zone.
    pub table: Vec<u8>,
    /// Per table block, the sequence it was last written with.
    pub sequences: Vec<u64>,
}

impl ZoneState {
    pub fn stripe_of(&self, zone: u64) -> Arc<Stripe> {
        let set = self.table[to_usize(zone)];
        self.sets[usize::from(set)]
            .clone()
            .expect("every zone names a set the label lists")
    }

    /// Whether any zone names set `index`.
    pub fn set_in_use(&self, index: usize) -> bool {
        self.table.iter().any(|set| usize::from(*set) == index)
    }

    /// The entries of table block `index`, padded with zeros.
    pub(crate) fn entries_of_block(&self, index: u64) -> Vec<u8> {
        let per_block = to_usize(ZONE_TABLE_ENTRIES_PER_BLOCK);
        let start = (to_usize(index) * per_block).min(self.table.len());
        let end = (start + per_block).min(self.table.len());
        let mut entries = self.table[start..end].to_vec();
        entries.resize(per_block, 0);
        entries
    }
}
