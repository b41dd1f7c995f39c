//! Where each whole block and each fragment of a batch goes in its data
//! region (format version 10, `docs/format.md`, "Batch layout"; decision
//! 0070). The writer places records as they are appended, and every walk
//! (replay, the cleaner) places them again from the summary's records alone,
//! so the rule must live in exactly one place: here. A batch with only whole
//! blocks is laid out as in version 9: whole block `k` at data index `k`.

use super::location::UNITS_PER_BLOCK;

/// Holes kept at most (see [`DataLayout`]); making one more drops the oldest.
pub const HOLE_COUNT_MAX: usize = 4;

/// Units of the largest fragment a record may name: a 6-byte header and at
/// most 3,584 stored bytes (decision 0068's early abort), in 16-byte units.
pub const FRAGMENT_UNIT_COUNT_MAX: u32 = super::fragment::FRAGMENT_UNITS_MAX;

const _: () = assert!(FRAGMENT_UNIT_COUNT_MAX < UNITS_PER_BLOCK);

/// What a record carries into the data region (`Record::data_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataKind {
    WholeBlock,
    Fragment { unit_count: u32 },
}

/// Where one record's data went: data index 0 is the block after the summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    WholeBlock {
        data_index: u32,
    },
    Fragment {
        data_index: u32,
        unit_offset: u32,
        unit_count: u32,
    },
}

/// Free units at the end of a block of fragments that a whole block
/// followed: later fragments that fit go there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hole {
    data_index: u32,
    first_free_unit: u32,
}

/// The data region's state while it is filled (or walked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DataLayout {
    /// Blocks of the region taken so far.
    block_count: u32,
    /// Units used in the region's last block when it holds fragments and has
    /// free units (the tail); `None` when the last block is a whole block,
    /// full, or there is none.
    tail_units: Option<u32>,
    holes: Vec<Hole>,
}

impl DataLayout {
    pub fn new() -> DataLayout {
        DataLayout::default()
    }

    /// Blocks the region spans so far.
    pub fn block_count(&self) -> u32 {
        self.block_count
    }

    /// Places the next whole block.
    pub fn place_whole_block(&mut self) -> Placement {
        if let Some(used) = self.tail_units.take() {
            if self.holes.len() == HOLE_COUNT_MAX {
                self.holes.remove(0);
            }
            self.holes.push(Hole {
                data_index: self.block_count - 1,
                first_free_unit: used,
            });
        }
        let data_index = self.block_count;
        self.block_count += 1;
        Placement::WholeBlock { data_index }
    }

    /// Places the next fragment of `unit_count` units.
    pub fn place_fragment(&mut self, unit_count: u32) -> Placement {
        assert!(
            (1..=FRAGMENT_UNIT_COUNT_MAX).contains(&unit_count),
            "a fragment of {unit_count} units"
        );
        let fitting = self
            .holes
            .iter()
            .position(|hole| UNITS_PER_BLOCK - hole.first_free_unit >= unit_count);
        if let Some(index) = fitting {
            let hole = &mut self.holes[index];
            let placement = Placement::Fragment {
                data_index: hole.data_index,
                unit_offset: hole.first_free_unit,
                unit_count,
            };
            hole.first_free_unit += unit_count;
            if hole.first_free_unit == UNITS_PER_BLOCK {
                self.holes.remove(index);
            }
            return placement;
        }
        let (data_index, unit_offset) = match self.tail_units {
            Some(used) => (self.block_count - 1, used),
            None => {
                self.block_count += 1;
                (self.block_count - 1, 0)
            }
        };
        let end = unit_offset + unit_count;
        if end > UNITS_PER_BLOCK {
            self.block_count += 1;
        }
        let used_in_last = end % UNITS_PER_BLOCK;
        self.tail_units = (used_in_last != 0).then_some(used_in_last);
        Placement::Fragment {
            data_index,
            unit_offset,
            unit_count,
        }
    }

    /// Places a record's data, if it carries any (`kind`).
    pub fn place(&mut self, kind: Option<DataKind>) -> Option<Placement> {
        match kind? {
            DataKind::WholeBlock => Some(self.place_whole_block()),
            DataKind::Fragment { unit_count } => Some(self.place_fragment(unit_count)),
        }
    }

    /// The blocks the region would span after placing data of `kind`.
    pub fn block_count_after(&self, kind: Option<DataKind>) -> u32 {
        if kind.is_none() {
            return self.block_count;
        }
        let mut trial = self.clone();
        trial.place(kind);
        trial.block_count
    }

    /// The placement of every record that carries data, given what each
    /// record carries in record order (`Summary::placements`): record index
    /// and placement, and the region's size in blocks. Fragment unit counts
    /// must have been checked (`Summary::decode` does).
    pub fn of_kinds(
        kinds: impl Iterator<Item = Option<DataKind>>,
    ) -> (Vec<(usize, Placement)>, u32) {
        let mut layout = DataLayout::new();
        let placements = kinds
            .enumerate()
            .filter_map(|(index, kind)| Some((index, layout.place(kind)?)))
            .collect();
        (placements, layout.block_count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fragment(data_index: u32, unit_offset: u32, unit_count: u32) -> Placement {
        Placement::Fragment {
            data_index,
            unit_offset,
            unit_count,
        }
    }

    #[test]
    fn whole_blocks_alone_are_laid_out_as_in_version_9() {
        let mut layout = DataLayout::new();
        for index in 0..5 {
            assert_eq!(
                layout.place_whole_block(),
                Placement::WholeBlock { data_index: index }
            );
        }
        assert_eq!(layout.block_count(), 5);
    }

    #[test]
    fn fragments_run_end_to_end_and_continue_into_the_next_block() {
        let mut layout = DataLayout::new();
        assert_eq!(layout.place_fragment(200), fragment(0, 0, 200));
        assert_eq!(layout.place_fragment(100), fragment(0, 200, 100));
        assert_eq!(layout.block_count(), 2);
        assert_eq!(layout.place_fragment(212), fragment(1, 44, 212));
        // The last block is exactly full: the next fragment starts a block.
        assert_eq!(layout.block_count(), 2);
        assert_eq!(layout.place_fragment(1), fragment(2, 0, 1));
        assert_eq!(layout.block_count(), 3);
    }

    #[test]
    fn a_whole_block_after_fragments_leaves_a_hole_later_fragments_fill() {
        let mut layout = DataLayout::new();
        assert_eq!(layout.place_fragment(100), fragment(0, 0, 100));
        assert_eq!(
            layout.place_whole_block(),
            Placement::WholeBlock { data_index: 1 }
        );
        // Too large for the hole's 156 units: a new block after the whole one.
        assert_eq!(layout.place_fragment(200), fragment(2, 0, 200));
        assert_eq!(layout.place_fragment(150), fragment(0, 100, 150));
        assert_eq!(layout.place_fragment(6), fragment(0, 250, 6));
        // The hole is full and gone; the tail goes on.
        assert_eq!(layout.place_fragment(10), fragment(2, 200, 10));
        assert_eq!(layout.block_count(), 3);
    }

    #[test]
    fn the_oldest_hole_is_dropped_past_the_limit() {
        let mut layout = DataLayout::new();
        for index in 0..=u32::try_from(HOLE_COUNT_MAX).unwrap() {
            assert_eq!(layout.place_fragment(200), fragment(2 * index, 0, 200));
            layout.place_whole_block();
        }
        // Holes at blocks 2, 4, 6, 8; block 0's was dropped.
        assert_eq!(layout.place_fragment(56), fragment(2, 200, 56));
        assert_eq!(layout.holes.len(), HOLE_COUNT_MAX - 1);
    }

    #[test]
    fn a_walk_of_the_kinds_places_what_the_writer_placed() {
        let kinds = [
            Some(DataKind::Fragment { unit_count: 150 }),
            None,
            Some(DataKind::WholeBlock),
            Some(DataKind::Fragment { unit_count: 100 }),
        ];
        let (placements, block_count) = DataLayout::of_kinds(kinds.into_iter());
        assert_eq!(
            placements,
            vec![
                (0, fragment(0, 0, 150)),
                (2, Placement::WholeBlock { data_index: 1 }),
                (3, fragment(0, 150, 100)),
            ]
        );
        assert_eq!(block_count, 2);
        let layout = DataLayout::new();
        assert_eq!(layout.block_count_after(kinds[0]), 1);
        assert_eq!(layout.block_count_after(kinds[1]), 0);
    }
}
