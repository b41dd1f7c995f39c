//! How a tier's byte addresses map onto segments. Segments are
//! `segment_size_bytes` long and start at `segment_origin_bytes` plus a
//! multiple of the segment size, because the engine's capacity device keeps a
//! label before its first segment (1 MiB): whatever lies before the origin
//! is a short segment 0 of its own, so that every engine segment is exactly
//! one segment of the tier and opening it again touches nothing else.

use std::ops::Range;

use lamina_device::DEVICE_ALIGNMENT_BYTES;

use crate::ObjectStoreError;

/// See the module documentation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TierGeometry {
    /// The device's size: everything at or beyond it is out of range.
    pub size_bytes: u64,
    /// A power of two, at least one device block.
    pub segment_size_bytes: u64,
    /// Where a segment starts (any segment; taken modulo the segment size).
    pub segment_origin_bytes: u64,
}

/// A range of the device within one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentSpan {
    pub segment_index: u64,
    /// Offsets within the segment's own coordinates.
    pub range_in_segment: Range<u64>,
    /// Where the span starts within the request.
    pub request_start: u64,
}

impl TierGeometry {
    pub fn new(size_bytes: u64, segment_size_bytes: u64, segment_origin_bytes: u64) -> Self {
        Self {
            size_bytes,
            segment_size_bytes,
            segment_origin_bytes,
        }
    }

    pub fn validate(&self) -> Result<(), ObjectStoreError> {
        let invalid = |reason: String| Err(ObjectStoreError::InvalidGeometry { reason });
        if !self.segment_size_bytes.is_power_of_two()
            || self.segment_size_bytes < DEVICE_ALIGNMENT_BYTES
        {
            return invalid(format!(
                "segment size {} is not a power of two of at least {DEVICE_ALIGNMENT_BYTES} bytes",
                self.segment_size_bytes
            ));
        }
        if self.size_bytes == 0 || !self.size_bytes.is_multiple_of(DEVICE_ALIGNMENT_BYTES) {
            return invalid(format!(
                "size {} is not a positive multiple of {DEVICE_ALIGNMENT_BYTES} bytes",
                self.size_bytes
            ));
        }
        if !self
            .segment_origin_bytes
            .is_multiple_of(DEVICE_ALIGNMENT_BYTES)
        {
            return invalid(format!(
                "segment origin {} is not a multiple of {DEVICE_ALIGNMENT_BYTES} bytes",
                self.segment_origin_bytes
            ));
        }
        Ok(())
    }

    /// How far the segment grid is shifted so that the origin falls on a
    /// segment boundary.
    fn shift_bytes(&self) -> u64 {
        (self.segment_size_bytes - self.segment_origin_bytes % self.segment_size_bytes)
            % self.segment_size_bytes
    }

    /// The segment holding `offset` and the offset within it.
    pub fn locate(&self, offset: u64) -> (u64, u64) {
        let shifted = offset + self.shift_bytes();
        (
            shifted / self.segment_size_bytes,
            shifted % self.segment_size_bytes,
        )
    }

    /// Segment indices in use are below this.
    pub fn segment_count(&self) -> u64 {
        self.locate(self.size_bytes - 1).0 + 1
    }

    /// The part of segment `segment_index`'s own coordinates that lies on
    /// the device (all of it but for the first and last segments).
    pub fn window(&self, segment_index: u64) -> Range<u64> {
        let shift = self.shift_bytes();
        let segment_start = segment_index * self.segment_size_bytes;
        let start = shift
            .saturating_sub(segment_start)
            .min(self.segment_size_bytes);
        let device_end_shifted = self.size_bytes + shift;
        let end = device_end_shifted
            .saturating_sub(segment_start)
            .min(self.segment_size_bytes);
        start..end.max(start)
    }

    /// The device offset of offset `offset_in_segment` of segment `segment_index`.
    pub fn device_offset(&self, segment_index: u64, offset_in_segment: u64) -> u64 {
        segment_index * self.segment_size_bytes + offset_in_segment - self.shift_bytes()
    }

    /// `offset..offset + length` cut at segment boundaries.
    pub fn spans(&self, offset: u64, length: u64) -> Vec<SegmentSpan> {
        let mut spans = Vec::new();
        let mut done = 0;
        while done < length {
            let (segment_index, offset_in_segment) = self.locate(offset + done);
            let take = (self.segment_size_bytes - offset_in_segment).min(length - done);
            spans.push(SegmentSpan {
                segment_index,
                range_in_segment: offset_in_segment..offset_in_segment + take,
                request_start: done,
            });
            done += take;
        }
        spans
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn an_origin_makes_a_short_first_segment() {
        let geometry = TierGeometry::new(10 * MIB, 4 * MIB, MIB);
        assert_eq!(geometry.locate(0), (0, 3 * MIB));
        assert_eq!(geometry.locate(MIB), (1, 0));
        assert_eq!(geometry.locate(5 * MIB + 4096), (2, 4096));
        assert_eq!(geometry.window(0), 3 * MIB..4 * MIB);
        assert_eq!(geometry.window(1), 0..4 * MIB);
        assert_eq!(geometry.window(2), 0..4 * MIB);
        assert_eq!(geometry.window(3), 0..MIB);
        assert_eq!(geometry.segment_count(), 4);
        assert_eq!(geometry.device_offset(2, 4096), 5 * MIB + 4096);
        let spans = geometry.spans(MIB - 4096, 4 * MIB + 8192);
        assert_eq!(spans.len(), 3);
        assert_eq!(spans[0].range_in_segment, 4 * MIB - 4096..4 * MIB);
        assert_eq!(spans[1].range_in_segment, 0..4 * MIB);
        assert_eq!(
            (spans[2].range_in_segment.clone(), spans[2].request_start),
            (0..4096, 4 * MIB + 4096)
        );
    }

    #[test]
    fn without_an_origin_segments_are_plain_divisions() {
        let geometry = TierGeometry::new(8 * MIB, 4 * MIB, 0);
        assert_eq!(geometry.locate(4 * MIB), (1, 0));
        assert_eq!(geometry.window(0), 0..4 * MIB);
        assert_eq!(geometry.segment_count(), 2);
        // An origin of a whole segment is no origin.
        assert_eq!(
            TierGeometry::new(8 * MIB, 4 * MIB, 4 * MIB).locate(4 * MIB),
            (1, 0)
        );
    }
}
