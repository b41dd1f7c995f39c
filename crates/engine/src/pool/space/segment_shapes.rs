//! How each segment is laid out on the device beneath: how many of its
//! blocks hold data and the row its batches align to. On a single device
//! every segment is alike (the pool's [`Geometry`]). On an array the layout
//! follows the members in use when the segment was last opened
//! (`lamina_device::BlockDevice::open_region`): a segment opened after a
//! member was lost is striped over the survivors, one column narrower, and
//! holds fewer blocks (issue 19, decision 0024). The writer, the cleaner,
//! recovery, checkpoints and space accounting all ask here, never the
//! geometry alone, for a segment's size.
//!
//! The device is the one record of each segment's layout: it keeps it
//! durably (an array's zone table) and in memory, so asking costs no I/O.

use std::sync::Arc;

use lamina_device::{BlockDevice, DeviceError, RegionShape};

use crate::BLOCK_SIZE_BYTES;
use crate::log::chain::SegmentShape;
use crate::log::geometry::Geometry;

/// See the module documentation. Cheap to clone.
#[derive(Clone)]
pub struct SegmentShapes {
    geometry: Geometry,
    /// `None` for a pool whose segments are all laid out alike (tests of
    /// the components alone).
    device: Option<Arc<dyn BlockDevice>>,
}

/// What one segment's layout says of its redundancy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentLayout {
    pub shape: SegmentShape,
    /// Part of it is on a device out of use: its data has less redundancy
    /// than the device offers until it is moved to a segment opened since.
    pub degraded: bool,
    /// Laid out over the devices a segment opened now would use.
    pub current: bool,
    /// Its data can be read (no more devices lost than it has redundancy).
    pub readable: bool,
}

impl SegmentShapes {
    /// Segments laid out as `geometry` says, whatever the device.
    pub fn uniform(geometry: Geometry) -> Self {
        Self {
            geometry,
            device: None,
        }
    }

    /// Segments laid out as `device` says.
    pub fn of_device(geometry: Geometry, device: Arc<dyn BlockDevice>) -> Self {
        Self {
            geometry,
            device: Some(device),
        }
    }

    /// The pool's geometry (where segments are).
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The largest a segment can be: what the pool's geometry was made for.
    pub fn size_blocks_max(&self) -> u32 {
        u32::try_from(self.geometry.segment_size_blocks)
            .expect("segment sizes fit in 32 bits of blocks (Geometry checks)")
    }

    /// Segment `segment_index`'s size and row, for writing and walking it.
    pub fn shape(&self, segment_index: u32) -> SegmentShape {
        self.layout(segment_index).shape
    }

    /// Segment `segment_index`'s shape and whether it is degraded.
    pub fn layout(&self, segment_index: u32) -> SegmentLayout {
        let default = SegmentLayout {
            shape: self.geometry.segment_shape(segment_index),
            degraded: false,
            current: true,
            readable: true,
        };
        let Some(device) = &self.device else {
            return default;
        };
        let (offset, length) = self.region_of(segment_index);
        match device.region_shape(offset, length) {
            Some(region) => self.checked(segment_index, region),
            None => default,
        }
    }

    /// Bytes segment `segment_index` would hold if it were opened now.
    pub fn new_size_bytes(&self, segment_index: u32) -> u64 {
        let (offset, length) = self.region_of(segment_index);
        self.device
            .as_ref()
            .and_then(|device| device.new_region_usable_bytes(offset, length))
            .unwrap_or_else(|| self.size_bytes(segment_index))
    }

    /// Whether moving a degraded segment's data into a segment opened now
    /// restores its redundancy (the device has enough members in use).
    pub fn new_segments_redundant(&self) -> bool {
        self.device
            .as_ref()
            .is_none_or(|device| device.new_regions_redundant())
    }

    /// Whether free segment `segment_index` must be laid out again
    /// ([`SegmentShapes::open`]) before it is written, so that what is
    /// written there gets the device's full redundancy (after a loss) and
    /// width (after an addition).
    pub fn needs_layout(&self, segment_index: u32) -> bool {
        !self.layout(segment_index).current && self.new_segments_redundant()
    }

    /// Lays free segment `segment_index` out over the devices in use now,
    /// durably. The caller owns the segment (it is out of every free list),
    /// so nothing writes or reads it meanwhile.
    pub async fn open(&self, segment_index: u32) -> Result<SegmentLayout, DeviceError> {
        let Some(device) = &self.device else {
            return Ok(self.layout(segment_index));
        };
        let (offset, length) = self.region_of(segment_index);
        match device.open_region(offset, length).await? {
            Some(region) => Ok(self.checked(segment_index, region)),
            None => Ok(self.layout(segment_index)),
        }
    }

    /// Lays every free segment of `segment_indexes` out over the devices
    /// in use now, durably, in one update of the device's record where it
    /// can (an array's zone table: two copies and two flushes for the whole
    /// batch). The caller owns every segment, as for [`SegmentShapes::open`].
    pub async fn open_many(
        &self,
        segment_indexes: &[u32],
    ) -> Result<Vec<SegmentLayout>, DeviceError> {
        let Some(device) = &self.device else {
            return Ok(segment_indexes
                .iter()
                .map(|index| self.layout(*index))
                .collect());
        };
        let offsets: Vec<u64> = segment_indexes
            .iter()
            .map(|index| self.region_of(*index).0)
            .collect();
        let regions = device
            .open_regions(&offsets, self.geometry.segment_size_bytes())
            .await?;
        assert_eq!(regions.len(), segment_indexes.len(), "one shape per region");
        Ok(segment_indexes
            .iter()
            .zip(regions)
            .map(|(index, region)| match region {
                Some(region) => self.checked(*index, region),
                None => self.layout(*index),
            })
            .collect())
    }

    fn region_of(&self, segment_index: u32) -> (u64, u64) {
        let offset = self.geometry.segment_first_block(segment_index) * BLOCK_SIZE_BYTES;
        (offset, self.geometry.segment_size_bytes())
    }

    /// The device's word on a region, as a segment's layout; a region the
    /// engine could not use (no room for one batch, a row that does not
    /// divide it) is a device bug.
    fn checked(&self, segment_index: u32, region: RegionShape) -> SegmentLayout {
        let size_blocks = region.usable_bytes / BLOCK_SIZE_BYTES;
        let row_blocks = region.row_bytes / BLOCK_SIZE_BYTES;
        assert!(
            region.usable_bytes.is_multiple_of(BLOCK_SIZE_BYTES)
                && region.row_bytes.is_multiple_of(BLOCK_SIZE_BYTES)
                && row_blocks >= 1
                && size_blocks.is_multiple_of(row_blocks)
                && size_blocks <= self.geometry.segment_size_blocks
                && size_blocks > u64::from(crate::log::batch::BATCH_OVERHEAD_BLOCKS),
            "segment {segment_index}: the device lays it out as {region:?}, which the log cannot use"
        );
        SegmentLayout {
            shape: SegmentShape {
                size_blocks: u32::try_from(size_blocks).expect("at most the segment size"),
                row_blocks: u32::try_from(row_blocks).expect("at most the segment size"),
            },
            degraded: region.degraded,
            current: region.current,
            readable: region.readable,
        }
    }
}

/// One segment's part of a checkpoint body: the body's bytes are laid out
/// over its segments in order, each filled to its size but the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BodyPiece {
    pub segment_index: u32,
    /// Where the piece starts in the body.
    pub body_offset: u64,
    pub length_bytes: u64,
}

impl SegmentShapes {
    /// Segment `segment_index`'s size in bytes.
    pub fn size_bytes(&self, segment_index: u32) -> u64 {
        u64::from(self.shape(segment_index).size_blocks) * BLOCK_SIZE_BYTES
    }

    /// Where each byte of a checkpoint body of `body_bytes` lives in
    /// `body_segments`, or `None` when they do not hold exactly that much
    /// (every segment at least one byte of it, none past the body's end):
    /// the one rule for writing a body and for reading one back.
    pub fn body_pieces(&self, body_segments: &[u32], body_bytes: u64) -> Option<Vec<BodyPiece>> {
        let mut pieces = Vec::with_capacity(body_segments.len());
        let mut body_offset = 0;
        for segment_index in body_segments {
            if u64::from(*segment_index) >= self.geometry.segment_count || body_offset >= body_bytes
            {
                return None;
            }
            let length_bytes = self
                .size_bytes(*segment_index)
                .min(body_bytes - body_offset);
            pieces.push(BodyPiece {
                segment_index: *segment_index,
                body_offset,
                length_bytes,
            });
            body_offset += length_bytes;
        }
        (body_offset == body_bytes).then_some(pieces)
    }
}
