//! Where a logical block's data lives on the device (format version 10,
//! `docs/format.md`, "Packed extents"; decision 0070): a whole 4 KiB block, or
//! a compressed fragment of whole 16-byte units that starts inside a block and
//! may continue into the next one. Encoded as a u64 whose low 40 bits are the
//! device block, so that every value older formats wrote reads as a whole
//! block. A newtype, so that no code uses a fragment's location as a block
//! number: segment arithmetic on the raw value would be a silent data-loss bug.

use crate::BLOCK_BYTES;

/// Bytes in a packing unit (decision 0068).
pub const UNIT_BYTES: usize = 16;

/// Units in a block.
pub const UNITS_PER_BLOCK: u32 = 256;

const _: () = assert!(UNIT_BYTES * UNITS_PER_BLOCK as usize == BLOCK_BYTES);

/// Bits of the device block in a location.
const BLOCK_BITS: u32 = 40;
const BLOCK_MASK: u64 = (1 << BLOCK_BITS) - 1;
const UNIT_OFFSET_SHIFT: u32 = BLOCK_BITS;
const UNIT_COUNT_SHIFT: u32 = BLOCK_BITS + 8;
/// Bits that must be zero in a location (56..64).
const RESERVED_MASK: u64 = !((1 << (UNIT_COUNT_SHIFT + 8)) - 1);

/// A fragment spans at most two blocks: it starts in one and may end in the
/// next (an offset and a count below 256 units each end before unit 512).
pub const FRAGMENT_BLOCKS_MAX: u32 = 2;

const _: () = assert!(2 * (UNITS_PER_BLOCK - 1) <= FRAGMENT_BLOCKS_MAX * UNITS_PER_BLOCK);

/// A raw value that is not a location.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LocationError {
    #[error("location {raw:#x}: reserved bits 56..64 are set")]
    ReservedBits { raw: u64 },
    #[error("location {raw:#x}: a whole block with unit offset {unit_offset}")]
    WholeBlockWithOffset { raw: u64, unit_offset: u32 },
}

/// A location: a whole block, or a fragment (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Location(u64);

impl Location {
    /// A whole block stored as is.
    pub fn whole_block(block: u64) -> Location {
        assert!(block <= BLOCK_MASK, "block {block} beyond 40 bits");
        Location(block)
    }

    /// A fragment of `unit_count` units starting `unit_offset` units into `block`.
    pub fn fragment(block: u64, unit_offset: u32, unit_count: u32) -> Location {
        assert!(block <= BLOCK_MASK, "block {block} beyond 40 bits");
        assert!(unit_offset < UNITS_PER_BLOCK, "unit offset {unit_offset}");
        assert!(
            (1..UNITS_PER_BLOCK).contains(&unit_count),
            "unit count {unit_count}"
        );
        Location(
            block
                | u64::from(unit_offset) << UNIT_OFFSET_SHIFT
                | u64::from(unit_count) << UNIT_COUNT_SHIFT,
        )
    }

    /// Reads a location as the format stores it, refusing values no writer makes.
    pub fn from_raw(raw: u64) -> Result<Location, LocationError> {
        if raw & RESERVED_MASK != 0 {
            return Err(LocationError::ReservedBits { raw });
        }
        let location = Location(raw);
        let (unit_offset, unit_count) = (location.unit_offset(), location.unit_count());
        if unit_count == 0 && unit_offset != 0 {
            return Err(LocationError::WholeBlockWithOffset { raw, unit_offset });
        }
        Ok(location)
    }

    /// The value the format stores.
    pub fn raw(self) -> u64 {
        self.0
    }

    /// The device block the data starts in.
    pub fn block(self) -> u64 {
        self.0 & BLOCK_MASK
    }

    /// Where a fragment starts in its first block, in units (0 for a whole block).
    pub fn unit_offset(self) -> u32 {
        u32::from(u8::try_from((self.0 >> UNIT_OFFSET_SHIFT) & 0xff).expect("masked to 8 bits"))
    }

    /// A fragment's length in units; 0 for a whole block.
    pub fn unit_count(self) -> u32 {
        u32::from(u8::try_from((self.0 >> UNIT_COUNT_SHIFT) & 0xff).expect("masked to 8 bits"))
    }

    /// The block of a location that code reading whole blocks handles:
    /// a fragment reaching such code is a programmer error (decision 0070:
    /// nothing writes fragments before every reader understands them).
    pub fn whole_block_number(self) -> u64 {
        assert!(
            !self.is_fragment(),
            "{self} reached code that handles whole blocks only"
        );
        self.block()
    }

    pub fn is_fragment(self) -> bool {
        self.unit_count() != 0
    }

    /// The units the data occupies on the device: 256 for a whole block.
    pub fn units(self) -> u32 {
        if self.is_fragment() {
            self.unit_count()
        } else {
            UNITS_PER_BLOCK
        }
    }

    /// The device blocks the data touches: one, or two for a fragment that
    /// continues into the next block.
    pub fn block_count(self) -> u32 {
        if self.is_fragment() {
            (self.unit_offset() + self.unit_count()).div_ceil(UNITS_PER_BLOCK)
        } else {
            1
        }
    }

    /// The data's byte range within its blocks read together (from the start
    /// of [`Location::block`]).
    pub fn byte_range(self) -> std::ops::Range<usize> {
        let start = self.unit_offset() as usize * UNIT_BYTES;
        start..start + self.units() as usize * UNIT_BYTES
    }

    /// The bytes of block `physical_block` this location's data covers,
    /// counted from that block's start; `None` when it does not touch it.
    pub fn part_in_block(self, physical_block: u64) -> Option<std::ops::Range<usize>> {
        let first = self.block();
        if physical_block < first || physical_block >= first + u64::from(self.block_count()) {
            return None;
        }
        let block_start = crate::convert::to_usize(physical_block - first) * BLOCK_BYTES;
        let range = self.byte_range();
        let start = range.start.max(block_start) - block_start;
        let end = range.end.min(block_start + BLOCK_BYTES) - block_start;
        Some(start..end)
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_fragment() {
            write!(
                formatter,
                "block {} units {}+{}",
                self.block(),
                self.unit_offset(),
                self.unit_count()
            )
        } else {
            write!(formatter, "block {}", self.block())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_format_value_is_a_whole_block() {
        let location = Location::from_raw(123_456).unwrap();
        assert_eq!(location, Location::whole_block(123_456));
        assert!(!location.is_fragment());
        assert_eq!(location.units(), UNITS_PER_BLOCK);
        assert_eq!(location.block_count(), 1);
        assert_eq!(location.byte_range(), 0..BLOCK_BYTES);
    }

    #[test]
    fn a_fragment_round_trips_and_may_touch_two_blocks() {
        let location = Location::fragment((1 << 40) - 1, 250, 10);
        assert_eq!(Location::from_raw(location.raw()).unwrap(), location);
        assert_eq!(location.block(), (1 << 40) - 1);
        assert_eq!((location.unit_offset(), location.unit_count()), (250, 10));
        assert_eq!(location.block_count(), 2);
        assert_eq!(location.byte_range(), 4000..4160);
        assert_eq!(Location::fragment(7, 0, 255).block_count(), 1);
    }

    #[test]
    fn values_no_writer_makes_are_refused() {
        assert!(matches!(
            Location::from_raw(1 << 56),
            Err(LocationError::ReservedBits { .. })
        ));
        assert!(matches!(
            Location::from_raw(9 | 3 << 40),
            Err(LocationError::WholeBlockWithOffset { .. })
        ));
        assert!(Location::from_raw(9 | 255 << 40 | 255 << 48).is_ok());
    }
}
