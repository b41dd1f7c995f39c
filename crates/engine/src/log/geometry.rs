//! Where things are on the device: the superblock, the two checkpoint slots and
//! the segments. Every address the engine computes comes from here.

use serde::{Deserialize, Serialize};

use crate::BLOCK_SIZE_BYTES;

/// Device block of the superblock.
pub const SUPERBLOCK_BLOCK: u64 = 0;
/// First device block of each checkpoint slot.
pub const CHECKPOINT_SLOT_BLOCKS: [u64; 2] = [256, 512];
/// Size of each checkpoint slot in blocks (1 MiB).
pub const CHECKPOINT_SLOT_SIZE_BLOCKS: u64 = 256;
/// First block of segment 0: everything before it is fixed metadata (4 MiB).
pub const DATA_START_BLOCK: u64 = 1024;
/// Default segment size: the unit of allocation, striping and cleaning.
pub const DEFAULT_SEGMENT_SIZE_BYTES: u64 = 4 << 20;

/// The shape of a pool's device, fixed at creation and stored in the superblock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    pub device_size_bytes: u64,
    pub segment_size_blocks: u64,
    pub segment_count: u64,
}

impl Geometry {
    pub fn for_device(device_size_bytes: u64, segment_size_bytes: u64) -> Option<Self> {
        assert!(
            segment_size_bytes.is_multiple_of(BLOCK_SIZE_BYTES)
                && segment_size_bytes >= 16 * BLOCK_SIZE_BYTES
        );
        let segment_size_blocks = segment_size_bytes / BLOCK_SIZE_BYTES;
        let device_blocks = device_size_bytes / BLOCK_SIZE_BYTES;
        let segment_count = device_blocks.checked_sub(DATA_START_BLOCK)? / segment_size_blocks;
        (segment_count >= 8).then_some(Self {
            device_size_bytes,
            segment_size_blocks,
            segment_count,
        })
    }

    /// The smallest device that holds a pool with this segment size.
    pub fn minimum_device_bytes(segment_size_bytes: u64) -> u64 {
        DATA_START_BLOCK * BLOCK_SIZE_BYTES + 8 * segment_size_bytes
    }

    pub fn segment_first_block(&self, segment_index: u32) -> u64 {
        assert!(u64::from(segment_index) < self.segment_count);
        DATA_START_BLOCK + u64::from(segment_index) * self.segment_size_blocks
    }

    /// The segment holding device block `physical_block`.
    pub fn segment_of(&self, physical_block: u64) -> u32 {
        assert!(
            physical_block >= DATA_START_BLOCK,
            "block {physical_block} is not in a segment"
        );
        let index = (physical_block - DATA_START_BLOCK) / self.segment_size_blocks;
        assert!(
            index < self.segment_count,
            "block {physical_block} beyond the last segment"
        );
        index as u32
    }

    pub fn segment_size_bytes(&self) -> u64 {
        self.segment_size_blocks * BLOCK_SIZE_BYTES
    }

    pub fn data_capacity_bytes(&self) -> u64 {
        self.segment_count * self.segment_size_bytes()
    }
}
