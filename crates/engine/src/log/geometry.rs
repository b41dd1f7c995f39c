//! Where things are on the device: the superblock, the two checkpoint slots and
//! the segments. Every address the engine computes comes from here.
//!
//! A pool has one tier (flash) or two (flash, then capacity). With two, the
//! engine sees one address space: the flash device, then the capacity device
//! (see `lamina_device::ConcatenatedDevice`). Segments are numbered flash first,
//! so a segment's tier follows from its index and a block's from its address.
//! The capacity device starts with a copy of the superblock (its label, so that
//! a pool never opens with another pool's capacity device), then its segments.

use serde::{Deserialize, Serialize};

use crate::BLOCK_SIZE_BYTES;
use crate::convert::segment_index;

/// Device block of the superblock.
pub const SUPERBLOCK_BLOCK: u64 = 0;
/// Device block of the superblock's copy (format version 5), read when the
/// superblock fails its checksum; far enough from block 0 not to share its
/// sectors or, on most devices, its erase block.
pub const SUPERBLOCK_COPY_BLOCK: u64 = 128;
/// Device blocks of the two flush markers (`log::marker`, format version 5).
pub const FLUSH_MARKER_BLOCKS: [u64; 2] = [192, 193];
/// First device block of each checkpoint slot.
pub const CHECKPOINT_SLOT_BLOCKS: [u64; 2] = [256, 512];
/// Size of each checkpoint slot in blocks (1 MiB).
pub const CHECKPOINT_SLOT_SIZE_BLOCKS: u64 = 256;
/// First device block of each area of the segment openings record
/// (`log::openings`, format version 8).
pub const SEGMENT_OPENINGS_AREA_BLOCKS: [u64; 2] = [768, 896];
/// Size of each segment openings area in blocks (512 KiB).
pub const SEGMENT_OPENINGS_AREA_SIZE_BLOCKS: u64 = 128;
/// First block of segment 0: everything before it is fixed metadata (4 MiB).
pub const DATA_START_BLOCK: u64 = 1024;
/// Default segment size: the unit of allocation, striping and cleaning.
pub const DEFAULT_SEGMENT_SIZE_BYTES: u64 = 4 << 20;
/// Blocks at the start of the capacity device before its first segment (the
/// label, 1 MiB).
pub const CAPACITY_DATA_START_BLOCKS: u64 = 256;
/// First block of each checkpoint slot's copy on the capacity device,
/// relative to its start (format version 9): slot A's copy between the label
/// and the label's copy, slot B's after the label's copy.
pub const CAPACITY_SLOT_COPY_BLOCKS: [u64; 2] = [1, 129];
/// Size of each slot copy area in blocks; a longer slot is not copied.
pub const CAPACITY_SLOT_COPY_SIZE_BLOCKS: u64 = 127;
/// Capacity segments a two-tier pool needs at least.
pub const CAPACITY_SEGMENT_COUNT_MIN: u64 = 4;
/// Blocks a segment has at least.
pub const SEGMENT_SIZE_BLOCKS_MIN: u64 = 16;

// The fixed metadata in its order, none overlapping the next, all before the
// first segment: moving one of these blocks must not silently overwrite another.
const _: () = assert!(SUPERBLOCK_BLOCK < SUPERBLOCK_COPY_BLOCK);
const _: () = assert!(SUPERBLOCK_COPY_BLOCK < FLUSH_MARKER_BLOCKS[0]);
const _: () = assert!(FLUSH_MARKER_BLOCKS[0] < FLUSH_MARKER_BLOCKS[1]);
const _: () = assert!(FLUSH_MARKER_BLOCKS[1] < CHECKPOINT_SLOT_BLOCKS[0]);
const _: () =
    assert!(CHECKPOINT_SLOT_BLOCKS[0] + CHECKPOINT_SLOT_SIZE_BLOCKS <= CHECKPOINT_SLOT_BLOCKS[1]);
const _: () = assert!(
    CHECKPOINT_SLOT_BLOCKS[1] + CHECKPOINT_SLOT_SIZE_BLOCKS <= SEGMENT_OPENINGS_AREA_BLOCKS[0]
);
const _: () = assert!(
    SEGMENT_OPENINGS_AREA_BLOCKS[0] + SEGMENT_OPENINGS_AREA_SIZE_BLOCKS
        <= SEGMENT_OPENINGS_AREA_BLOCKS[1]
);
const _: () = assert!(
    SEGMENT_OPENINGS_AREA_BLOCKS[1] + SEGMENT_OPENINGS_AREA_SIZE_BLOCKS <= DATA_START_BLOCK
);
// The capacity device's label (a copy of the superblock) comes before its
// first segment.
const _: () = assert!(CAPACITY_DATA_START_BLOCKS > SUPERBLOCK_BLOCK);
// The slot copies sit between the label, its copy and the first segment.
const _: () = assert!(CAPACITY_SLOT_COPY_BLOCKS[0] > SUPERBLOCK_BLOCK);
const _: () =
    assert!(CAPACITY_SLOT_COPY_BLOCKS[0] + CAPACITY_SLOT_COPY_SIZE_BLOCKS <= SUPERBLOCK_COPY_BLOCK);
const _: () = assert!(CAPACITY_SLOT_COPY_BLOCKS[1] > SUPERBLOCK_COPY_BLOCK);
const _: () = assert!(
    CAPACITY_SLOT_COPY_BLOCKS[1] + CAPACITY_SLOT_COPY_SIZE_BLOCKS <= CAPACITY_DATA_START_BLOCKS
);
// A slot copy area is smaller than a slot: longer slots are not copied.
const _: () = assert!(CAPACITY_SLOT_COPY_SIZE_BLOCKS < CHECKPOINT_SLOT_SIZE_BLOCKS);
// The default segment size is one `for_device` accepts.
const _: () = assert!(
    DEFAULT_SEGMENT_SIZE_BYTES.is_multiple_of(BLOCK_SIZE_BYTES)
        && DEFAULT_SEGMENT_SIZE_BYTES / BLOCK_SIZE_BYTES >= SEGMENT_SIZE_BLOCKS_MIN
);

/// Where a segment or block lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Tier {
    Flash,
    Capacity,
}

/// The shape of a pool's device, fixed at creation and stored in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    /// The whole address space: flash, then capacity if any.
    pub device_size_bytes: u64,
    pub segment_size_blocks: u64,
    /// Segments of both tiers.
    pub segment_count: u64,
    /// Segments `0..flash_segment_count` are on flash, the rest on capacity.
    pub flash_segment_count: u64,
    /// First block of the capacity device in the address space (its label);
    /// 0 for a pool without a capacity tier.
    pub capacity_start_block: u64,
    /// Format version 6: every batch on flash starts at a multiple of this
    /// many blocks from its segment's start (the flash array's data blocks
    /// per row, so that the array only ever writes whole rows; 1 for a
    /// single device). Segment sizes are multiples of it.
    pub flash_row_blocks: u64,
    /// The same for the capacity tier (1 without one).
    pub capacity_row_blocks: u64,
}

/// Geometry as format versions 3 to 5 stored it (no row alignment).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct GeometryVersion5 {
    pub device_size_bytes: u64,
    pub segment_size_blocks: u64,
    pub segment_count: u64,
    pub flash_segment_count: u64,
    pub capacity_start_block: u64,
}

impl From<GeometryVersion5> for Geometry {
    fn from(old: GeometryVersion5) -> Self {
        Self {
            device_size_bytes: old.device_size_bytes,
            segment_size_blocks: old.segment_size_blocks,
            segment_count: old.segment_count,
            flash_segment_count: old.flash_segment_count,
            capacity_start_block: old.capacity_start_block,
            flash_row_blocks: 1,
            capacity_row_blocks: 1,
        }
    }
}

/// Geometry as format version 2 stored it (one tier).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct GeometryVersion2 {
    pub device_size_bytes: u64,
    pub segment_size_blocks: u64,
    pub segment_count: u64,
}

impl From<GeometryVersion2> for Geometry {
    fn from(old: GeometryVersion2) -> Self {
        Self {
            device_size_bytes: old.device_size_bytes,
            segment_size_blocks: old.segment_size_blocks,
            segment_count: old.segment_count,
            flash_segment_count: old.segment_count,
            capacity_start_block: 0,
            flash_row_blocks: 1,
            capacity_row_blocks: 1,
        }
    }
}

impl Geometry {
    pub fn for_device(device_size_bytes: u64, segment_size_bytes: u64) -> Option<Self> {
        assert!(
            segment_size_bytes.is_multiple_of(BLOCK_SIZE_BYTES)
                && segment_size_bytes >= SEGMENT_SIZE_BLOCKS_MIN * BLOCK_SIZE_BYTES
        );
        let segment_size_blocks = segment_size_bytes / BLOCK_SIZE_BYTES;
        let device_blocks = device_size_bytes / BLOCK_SIZE_BYTES;
        let segment_count = device_blocks.checked_sub(DATA_START_BLOCK)? / segment_size_blocks;
        (segment_count >= 8).then_some(Self {
            device_size_bytes,
            segment_size_blocks,
            segment_count,
            flash_segment_count: segment_count,
            capacity_start_block: 0,
            flash_row_blocks: 1,
            capacity_row_blocks: 1,
        })
    }

    /// This geometry with batches aligned to rows of `flash_row_blocks` and
    /// `capacity_row_blocks`, or `None` when the segment size is not a
    /// multiple of both.
    pub fn with_rows(self, flash_row_blocks: u64, capacity_row_blocks: u64) -> Option<Self> {
        let fits = |row_blocks: u64| {
            row_blocks >= 1 && self.segment_size_blocks.is_multiple_of(row_blocks)
        };
        (fits(flash_row_blocks) && fits(capacity_row_blocks)).then_some(Self {
            flash_row_blocks,
            capacity_row_blocks,
            ..self
        })
    }

    /// Segment `segment_index`'s size and row alignment, for walking it.
    pub fn segment_shape(&self, segment_index: u32) -> crate::log::chain::SegmentShape {
        let row_blocks = match self.tier_of_segment(segment_index) {
            Tier::Flash => self.flash_row_blocks,
            Tier::Capacity => self.capacity_row_blocks,
        };
        crate::log::chain::SegmentShape {
            size_blocks: u32::try_from(self.segment_size_blocks)
                .expect("segment sizes fit in 32 bits of blocks"),
            row_blocks: u32::try_from(row_blocks).expect("a row is smaller than a segment"),
        }
    }

    /// A two-tier pool: a flash region of `flash_bytes` (a multiple of the block
    /// size) followed by a capacity device of `capacity_bytes`.
    pub fn for_tiers(
        flash_bytes: u64,
        capacity_bytes: u64,
        segment_size_bytes: u64,
    ) -> Option<Self> {
        assert!(flash_bytes.is_multiple_of(BLOCK_SIZE_BYTES));
        let flash = Self::for_device(flash_bytes, segment_size_bytes)?;
        let capacity_segment_count = (capacity_bytes / BLOCK_SIZE_BYTES)
            .checked_sub(CAPACITY_DATA_START_BLOCKS)?
            / flash.segment_size_blocks;
        (capacity_segment_count >= CAPACITY_SEGMENT_COUNT_MIN).then_some(Self {
            device_size_bytes: flash_bytes + capacity_bytes - capacity_bytes % BLOCK_SIZE_BYTES,
            segment_count: flash.segment_count + capacity_segment_count,
            capacity_start_block: flash_bytes / BLOCK_SIZE_BYTES,
            ..flash
        })
    }

    /// The smallest capacity device for this segment size.
    pub fn minimum_capacity_bytes(segment_size_bytes: u64) -> u64 {
        CAPACITY_DATA_START_BLOCKS * BLOCK_SIZE_BYTES
            + CAPACITY_SEGMENT_COUNT_MIN * segment_size_bytes
    }

    pub fn has_capacity_tier(&self) -> bool {
        self.segment_count > self.flash_segment_count
    }

    pub fn capacity_segment_count(&self) -> u64 {
        self.segment_count - self.flash_segment_count
    }

    /// Bytes of the flash region (the whole device for a one-tier pool).
    pub fn flash_region_bytes(&self) -> u64 {
        if self.has_capacity_tier() {
            self.capacity_start_block * BLOCK_SIZE_BYTES
        } else {
            self.device_size_bytes
        }
    }

    pub fn tier_of_segment(&self, segment_index: u32) -> Tier {
        if u64::from(segment_index) < self.flash_segment_count {
            Tier::Flash
        } else {
            Tier::Capacity
        }
    }

    pub fn tier_of_block(&self, physical_block: u64) -> Tier {
        if self.has_capacity_tier() && physical_block >= self.capacity_start_block {
            Tier::Capacity
        } else {
            Tier::Flash
        }
    }

    /// First block of the capacity tier's first segment.
    pub fn capacity_data_start_block(&self) -> u64 {
        self.capacity_start_block + CAPACITY_DATA_START_BLOCKS
    }

    /// Blocks of data segments on flash (heat is tracked per flash block).
    pub fn flash_data_block_count(&self) -> u64 {
        self.flash_segment_count * self.segment_size_blocks
    }

    /// Index of a flash block among the flash data blocks.
    pub fn flash_data_index(&self, physical_block: u64) -> Option<u64> {
        (self.tier_of_block(physical_block) == Tier::Flash)
            .then(|| physical_block - DATA_START_BLOCK)
    }

    /// Whether `physical_block` lies inside some segment.
    pub fn is_data_block(&self, physical_block: u64) -> bool {
        let flash_end = DATA_START_BLOCK + self.flash_data_block_count();
        (DATA_START_BLOCK..flash_end).contains(&physical_block)
            || (self.has_capacity_tier()
                && (self.capacity_data_start_block()
                    ..self.capacity_data_start_block()
                        + self.capacity_segment_count() * self.segment_size_blocks)
                    .contains(&physical_block))
    }

    /// The smallest device that holds a pool with this segment size.
    pub fn minimum_device_bytes(segment_size_bytes: u64) -> u64 {
        DATA_START_BLOCK * BLOCK_SIZE_BYTES + 8 * segment_size_bytes
    }

    pub fn segment_first_block(&self, segment_index: u32) -> u64 {
        let index = u64::from(segment_index);
        assert!(index < self.segment_count);
        if index < self.flash_segment_count {
            DATA_START_BLOCK + index * self.segment_size_blocks
        } else {
            self.capacity_data_start_block()
                + (index - self.flash_segment_count) * self.segment_size_blocks
        }
    }

    /// The segment holding device block `physical_block`.
    pub fn segment_of(&self, physical_block: u64) -> u32 {
        let index = match self.tier_of_block(physical_block) {
            Tier::Flash => {
                assert!(
                    physical_block >= DATA_START_BLOCK,
                    "block {physical_block} is not in a segment"
                );
                let index = (physical_block - DATA_START_BLOCK) / self.segment_size_blocks;
                assert!(
                    index < self.flash_segment_count,
                    "block {physical_block} beyond the last flash segment"
                );
                index
            }
            Tier::Capacity => {
                assert!(
                    physical_block >= self.capacity_data_start_block(),
                    "block {physical_block} is in the capacity label"
                );
                let index = self.flash_segment_count
                    + (physical_block - self.capacity_data_start_block())
                        / self.segment_size_blocks;
                assert!(
                    index < self.segment_count,
                    "block {physical_block} beyond the last segment"
                );
                index
            }
        };
        segment_index(index)
    }

    pub fn segment_size_bytes(&self) -> u64 {
        self.segment_size_blocks * BLOCK_SIZE_BYTES
    }

    /// Bytes of segments in both tiers.
    pub fn data_capacity_bytes(&self) -> u64 {
        self.segment_count * self.segment_size_bytes()
    }

    /// Bytes of segments in one tier.
    pub fn tier_data_bytes(&self, tier: Tier) -> u64 {
        let segments = match tier {
            Tier::Flash => self.flash_segment_count,
            Tier::Capacity => self.capacity_segment_count(),
        };
        segments * self.segment_size_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_segments_follow_the_flash_region_and_its_label() {
        let segment = 1 << 20;
        let geometry = Geometry::for_tiers(64 << 20, 32 << 20, segment).unwrap();
        assert_eq!(geometry.flash_segment_count, 60);
        assert_eq!(geometry.capacity_segment_count(), 31);
        assert_eq!(geometry.capacity_start_block, (64 << 20) / BLOCK_SIZE_BYTES);
        for index in [0u32, 59, 60, 90] {
            let first = geometry.segment_first_block(index);
            assert_eq!(geometry.segment_of(first), index);
            assert_eq!(
                geometry.segment_of(first + geometry.segment_size_blocks - 1),
                index
            );
            assert!(geometry.is_data_block(first));
        }
        assert_eq!(geometry.tier_of_segment(59), Tier::Flash);
        assert_eq!(geometry.tier_of_segment(60), Tier::Capacity);
        assert_eq!(
            geometry.segment_first_block(60),
            geometry.capacity_start_block + CAPACITY_DATA_START_BLOCKS
        );
        assert!(!geometry.is_data_block(geometry.capacity_start_block));
        assert_eq!(geometry.device_size_bytes, 96 << 20);
        assert!(Geometry::for_tiers(64 << 20, 4 << 20, segment).is_none());
    }

    #[test]
    fn a_one_tier_pool_is_all_flash() {
        let geometry = Geometry::for_device(64 << 20, 1 << 20).unwrap();
        assert!(!geometry.has_capacity_tier());
        assert_eq!(geometry.flash_segment_count, geometry.segment_count);
        assert_eq!(geometry.tier_of_block(u64::MAX / 8), Tier::Flash);
        assert_eq!(geometry.flash_region_bytes(), 64 << 20);
    }
}
