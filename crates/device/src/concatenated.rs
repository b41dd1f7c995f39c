//! Two devices seen as one: the first `first_region_bytes` of the address space
//! are the first device, the rest is the second device from its byte 0. This is
//! how a two-tier pool (flash, then capacity) presents its tiers to the engine,
//! which tells them apart by address (see the engine's `Geometry`). Requests that
//! cross the boundary are split; a flush flushes both devices.

use std::sync::Arc;

use crate::{AlignedBuffer, BlockDevice, DEVICE_ALIGNMENT_BYTES, DeviceError};

/// The regions of one batch that fall on one of the two devices.
#[derive(Default)]
struct RegionBatch {
    /// Where each region is in the batch asked for.
    positions: Vec<usize>,
    /// Its offset on that device.
    offsets: Vec<u64>,
}

impl RegionBatch {
    fn push(&mut self, position: usize, offset: u64) {
        self.positions.push(position);
        self.offsets.push(offset);
    }
}

/// See the module documentation.
pub struct ConcatenatedDevice {
    first: Arc<dyn BlockDevice>,
    second: Arc<dyn BlockDevice>,
    first_region_bytes: u64,
    name: String,
}

impl ConcatenatedDevice {
    /// Joins `first` (its size rounded down to the device alignment) and `second`.
    pub fn new(first: Arc<dyn BlockDevice>, second: Arc<dyn BlockDevice>) -> Self {
        let first_region_bytes = Self::first_region_bytes_of(first.size_bytes());
        let name = format!("{}+{}", first.name(), second.name());
        Self {
            first,
            second,
            first_region_bytes,
            name,
        }
    }

    /// Where the second device starts for a first device of `size_bytes`.
    pub fn first_region_bytes_of(size_bytes: u64) -> u64 {
        size_bytes - size_bytes % DEVICE_ALIGNMENT_BYTES
    }

    pub fn first_region_bytes(&self) -> u64 {
        self.first_region_bytes
    }

    pub fn first(&self) -> &Arc<dyn BlockDevice> {
        &self.first
    }

    pub fn second(&self) -> &Arc<dyn BlockDevice> {
        &self.second
    }

    /// The part of `offset..offset + length` on each device.
    /// The part that holds all of `offset..offset + length`, and the
    /// range's offset in it; `None` for a range across both (metadata and
    /// fragments never straddle them: segments do not).
    fn part_holding(&self, offset: u64, length: usize) -> Option<(&dyn BlockDevice, u64)> {
        let split = self.split(offset, length);
        match (split.first.length, split.second.length) {
            (_, 0) => Some((&*self.first, offset)),
            (0, _) => Some((&*self.second, split.second.offset)),
            _ => None,
        }
    }

    fn split(&self, offset: u64, length: usize) -> Split {
        let boundary = self.first_region_bytes;
        // Whatever lies before the boundary, at most the whole request.
        let first_length = usize::try_from(boundary.saturating_sub(offset))
            .map_or(length, |before_boundary| before_boundary.min(length));
        Split {
            first: Part {
                offset,
                length: first_length,
            },
            second: Part {
                offset: offset.max(boundary) - boundary,
                length: length - first_length,
            },
        }
    }
}

/// A request's part on one of the two devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Part {
    /// Offset on that device.
    offset: u64,
    /// Bytes there; zero when the request does not reach that device.
    length: usize,
}

/// A request split at the boundary between the two devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Split {
    first: Part,
    second: Part,
}

#[async_trait::async_trait]
impl BlockDevice for ConcatenatedDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn has_redundancy(&self) -> bool {
        self.first.has_redundancy() || self.second.has_redundancy()
    }

    fn size_bytes(&self) -> u64 {
        self.first_region_bytes + self.second.size_bytes()
    }

    fn read(&self, offset: u64, length: usize) -> crate::DeviceReadFuture<'_> {
        if let Err(error) =
            crate::check_request(&self.name, self.size_bytes(), offset, length as u64)
        {
            return crate::DeviceReadFuture::from(std::future::ready(Err(error)));
        }
        // A read within one part is that part's read future itself, so the
        // common case boxes nothing.
        let Split { first, second } = self.split(offset, length);
        if second.length == 0 {
            return self.first.read(first.offset, first.length);
        }
        if first.length == 0 {
            return self.second.read(second.offset, second.length);
        }
        crate::DeviceReadFuture::from_or_box(async move {
            let (head, tail) = futures_join(
                self.first.read(first.offset, first.length),
                self.second.read(second.offset, second.length),
            )
            .await;
            let (head, tail) = (head?, tail?);
            let mut joined = AlignedBuffer::zeroed(length);
            joined[..first.length].copy_from_slice(&head);
            joined[first.length..].copy_from_slice(&tail);
            Ok(joined)
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        crate::check_request(&self.name, self.size_bytes(), offset, data.len() as u64)?;
        let Split { first, second } = self.split(offset, data.len());
        if second.length == 0 {
            return self.first.write(first.offset, data).await;
        }
        if first.length == 0 {
            return self.second.write(second.offset, data).await;
        }
        let head = Arc::new(AlignedBuffer::from_slice_padded(&data[..first.length]));
        let tail = Arc::new(AlignedBuffer::from_slice_padded(&data[first.length..]));
        let (head, tail) = futures_join(
            self.first.write(first.offset, head),
            self.second.write(second.offset, tail),
        )
        .await;
        head.and(tail)
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        let (first, second) = futures_join(self.first.flush(), self.second.flush()).await;
        first.and(second)
    }

    async fn flush_range(&self, offset: u64, length: u64) -> Result<(), DeviceError> {
        let boundary = self.first_region_bytes;
        let end = offset.saturating_add(length);
        match (offset < boundary, end > boundary) {
            (true, false) => self.first.flush_range(offset, length).await,
            (false, _) => self.second.flush_range(offset - boundary, length).await,
            (true, true) => {
                let (first, second) = futures_join(
                    self.first.flush_range(offset, boundary - offset),
                    self.second.flush_range(0, end - boundary),
                )
                .await;
                first.and(second)
            }
        }
    }

    async fn recover_block(
        &self,
        offset: u64,
        is_valid: crate::BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        if offset < self.first_region_bytes {
            self.first.recover_block(offset, is_valid).await
        } else {
            let offset = offset - self.first_region_bytes;
            self.second.recover_block(offset, is_valid).await
        }
    }

    async fn recover_range(
        &self,
        offset: u64,
        length: usize,
        is_valid: crate::BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        match self.part_holding(offset, length) {
            Some((part, offset)) => part.recover_range(offset, length, is_valid).await,
            None => Ok(None),
        }
    }

    async fn reconstruct_range(
        &self,
        offset: u64,
        length: usize,
        is_valid: crate::BlockCheck<'_>,
    ) -> Result<Option<AlignedBuffer>, DeviceError> {
        match self.part_holding(offset, length) {
            Some((part, offset)) => part.reconstruct_range(offset, length, is_valid).await,
            None => Ok(None),
        }
    }

    fn rebuild_pending(&self) -> bool {
        self.first.rebuild_pending() || self.second.rebuild_pending()
    }

    async fn rebuild_range(
        &self,
        offset: u64,
        length: u64,
        is_valid: crate::PlacedBlockCheck<'_>,
    ) -> Result<crate::RebuildReport, DeviceError> {
        let split = self.split(offset, crate::buffer_length(length));
        let mut report = crate::RebuildReport::default();
        if split.first.length > 0 {
            let first = &split.first;
            report.add(
                self.first
                    .rebuild_range(first.offset, first.length as u64, is_valid)
                    .await?,
            );
        }
        if split.second.length > 0 {
            let shift_blocks = self.first_region_bytes / crate::DEVICE_ALIGNMENT_BYTES;
            let shifted = |block: u64, contents: &[u8]| is_valid(block + shift_blocks, contents);
            let second = &split.second;
            report.add(
                self.second
                    .rebuild_range(second.offset, second.length as u64, &shifted)
                    .await?,
            );
        }
        Ok(report)
    }

    async fn scrub_range(
        &self,
        offset: u64,
        length: u64,
        blocks: &dyn crate::ScrubBlocks,
    ) -> Result<crate::ScrubReport, DeviceError> {
        let split = self.split(offset, crate::buffer_length(length));
        let mut report = crate::ScrubReport::default();
        if split.first.length > 0 {
            let first = &split.first;
            report.add(
                self.first
                    .scrub_range(first.offset, first.length as u64, blocks)
                    .await?,
            );
        }
        if split.second.length > 0 {
            let shift_blocks = self.first_region_bytes / crate::DEVICE_ALIGNMENT_BYTES;
            let shifted = crate::ShiftedScrubBlocks {
                blocks,
                shift_blocks,
            };
            let second = &split.second;
            let mut part = self
                .second
                .scrub_range(second.offset, second.length as u64, &shifted)
                .await?;
            for block in &mut part.unrepairable_blocks {
                *block += shift_blocks;
            }
            report.add(part);
        }
        Ok(report)
    }

    async fn scrub_copies(
        &self,
        offset: u64,
        length: usize,
        is_valid: crate::BlockCheck<'_>,
    ) -> Result<crate::ScrubReport, DeviceError> {
        let split = self.split(offset, length);
        match (split.first.length, split.second.length) {
            (_, 0) => self.first.scrub_copies(offset, length, is_valid).await,
            (0, _) => {
                let second = &split.second;
                self.second
                    .scrub_copies(second.offset, second.length, is_valid)
                    .await
            }
            // Metadata never straddles the two devices.
            _ => Ok(crate::ScrubReport::default()),
        }
    }

    fn region_shape(&self, offset: u64, length: u64) -> Option<crate::RegionShape> {
        match offset.checked_sub(self.first_region_bytes) {
            None => self.first.region_shape(offset, length),
            Some(second_offset) => self.second.region_shape(second_offset, length),
        }
    }

    async fn open_region(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Option<crate::RegionShape>, DeviceError> {
        match offset.checked_sub(self.first_region_bytes) {
            None => self.first.open_region(offset, length).await,
            Some(second_offset) => self.second.open_region(second_offset, length).await,
        }
    }

    async fn open_regions(
        &self,
        offsets: &[u64],
        length_bytes: u64,
    ) -> Result<Vec<Option<crate::RegionShape>>, DeviceError> {
        // Each device opens its own regions in one batch; the shapes go
        // back in the order asked.
        let mut first = RegionBatch::default();
        let mut second = RegionBatch::default();
        for (position, offset) in offsets.iter().enumerate() {
            match offset.checked_sub(self.first_region_bytes) {
                None => first.push(position, *offset),
                Some(second_offset) => second.push(position, second_offset),
            }
        }
        let mut shapes = vec![None; offsets.len()];
        for (device, batch) in [(&self.first, first), (&self.second, second)] {
            if batch.offsets.is_empty() {
                continue;
            }
            let opened = device.open_regions(&batch.offsets, length_bytes).await?;
            for (position, shape) in batch.positions.into_iter().zip(opened) {
                shapes[position] = shape;
            }
        }
        Ok(shapes)
    }

    async fn restore_metadata_redundancy(&self) -> Result<(), DeviceError> {
        self.first.restore_metadata_redundancy().await?;
        self.second.restore_metadata_redundancy().await
    }

    fn new_region_usable_bytes(&self, offset: u64, length: u64) -> Option<u64> {
        match offset.checked_sub(self.first_region_bytes) {
            None => self.first.new_region_usable_bytes(offset, length),
            Some(second_offset) => self.second.new_region_usable_bytes(second_offset, length),
        }
    }

    fn new_regions_redundant(&self) -> bool {
        self.first.new_regions_redundant() && self.second.new_regions_redundant()
    }

    async fn finish_rebuild(&self) -> Result<(), DeviceError> {
        if self.first.rebuild_pending() {
            self.first.finish_rebuild().await?;
        }
        if self.second.rebuild_pending() {
            self.second.finish_rebuild().await?;
        }
        Ok(())
    }
}

/// Runs two futures concurrently (tokio's `join!` as a function).
async fn futures_join<A, B>(
    left: impl Future<Output = A>,
    right: impl Future<Output = B>,
) -> (A, B) {
    tokio::join!(left, right)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DeviceErrorKind, MemoryDevice};

    fn pattern(length: usize, seed: u8) -> Arc<AlignedBuffer> {
        let bytes: Vec<u8> = (0..length)
            .map(|index| u8::try_from(index / 4096).expect("test patterns are short") ^ seed)
            .collect();
        Arc::new(AlignedBuffer::from_slice_padded(&bytes))
    }

    /// A device whose regions' usable bytes say where they were opened,
    /// and which counts the batches it was asked to open.
    struct ShapedByOffset {
        inner: MemoryDevice,
        batches: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl BlockDevice for ShapedByOffset {
        fn name(&self) -> &str {
            self.inner.name()
        }
        fn size_bytes(&self) -> u64 {
            self.inner.size_bytes()
        }
        fn read(&self, offset: u64, length: usize) -> crate::DeviceReadFuture<'_> {
            crate::DeviceReadFuture::from_or_box(
                async move { self.inner.read(offset, length).await },
            )
        }
        async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
            self.inner.write(offset, data).await
        }
        async fn flush(&self) -> Result<(), DeviceError> {
            self.inner.flush().await
        }
        async fn open_regions(
            &self,
            offsets: &[u64],
            _length_bytes: u64,
        ) -> Result<Vec<Option<crate::RegionShape>>, DeviceError> {
            self.batches
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(offsets
                .iter()
                .map(|offset| {
                    Some(crate::RegionShape {
                        usable_bytes: *offset,
                        row_bytes: 4096,
                        degraded: false,
                        current: true,
                        readable: true,
                    })
                })
                .collect())
        }
    }

    #[tokio::test]
    async fn a_batch_of_regions_is_opened_as_one_batch_per_device_in_order() {
        let shaped = |blocks: u64| {
            Arc::new(ShapedByOffset {
                inner: MemoryDevice::new(blocks * 4096),
                batches: 0.into(),
            })
        };
        let (first, second) = (shaped(8), shaped(16));
        let joined = ConcatenatedDevice::new(first.clone(), second.clone());
        let offsets = [12 * 4096, 0, 9 * 4096, 4 * 4096];
        let shapes = joined.open_regions(&offsets, 4096).await.unwrap();
        let usable: Vec<u64> = shapes
            .iter()
            .map(|shape| shape.expect("shaped").usable_bytes)
            .collect();
        assert_eq!(usable, vec![4 * 4096, 0, 4096, 4 * 4096]);
        for device in [&first, &second] {
            assert_eq!(device.batches.load(std::sync::atomic::Ordering::SeqCst), 1);
        }
    }

    #[tokio::test]
    async fn addresses_past_the_first_device_land_on_the_second() {
        let first = Arc::new(MemoryDevice::new(8 * 4096));
        let second = Arc::new(MemoryDevice::new(16 * 4096));
        let joined = ConcatenatedDevice::new(first.clone(), second.clone());
        assert_eq!(joined.size_bytes(), 24 * 4096);
        // A write across the boundary: two blocks on each device.
        let data = pattern(4 * 4096, 7);
        joined.write(6 * 4096, data.clone()).await.unwrap();
        let back = joined.read(6 * 4096, 4 * 4096).await.unwrap();
        assert_eq!(&back[..], &data[..]);
        let on_first = first.read(6 * 4096, 2 * 4096).await.unwrap();
        assert_eq!(&on_first[..], &data[..2 * 4096]);
        let on_second = second.read(0, 2 * 4096).await.unwrap();
        assert_eq!(&on_second[..], &data[2 * 4096..]);
        // Entirely on the second device.
        joined.write(20 * 4096, pattern(4096, 9)).await.unwrap();
        let on_second = second.read(12 * 4096, 4096).await.unwrap();
        assert_eq!(&on_second[..], &pattern(4096, 9)[..]);
        joined.flush().await.unwrap();
    }

    /// A device that refuses to flush: the capacity tier's store away.
    struct Unflushable(MemoryDevice);

    #[async_trait::async_trait]
    impl BlockDevice for Unflushable {
        fn name(&self) -> &str {
            "unflushable"
        }
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
        fn read(&self, offset: u64, length: usize) -> crate::DeviceReadFuture<'_> {
            self.0.read(offset, length)
        }
        async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
            self.0.write(offset, data).await
        }
        async fn flush(&self) -> Result<(), DeviceError> {
            Err(DeviceError::new(
                DeviceErrorKind::Injected,
                "unflushable",
                0,
                0,
            ))
        }
    }

    #[tokio::test]
    async fn a_range_flush_flushes_only_the_devices_it_touches() {
        let joined = ConcatenatedDevice::new(
            Arc::new(MemoryDevice::new(8 * 4096)),
            Arc::new(Unflushable(MemoryDevice::new(8 * 4096))),
        );
        joined.flush_range(0, 8 * 4096).await.unwrap();
        assert!(joined.flush_range(8 * 4096, 4096).await.is_err());
        assert!(joined.flush_range(4 * 4096, 8 * 4096).await.is_err());
        assert!(joined.flush().await.is_err());
    }

    #[tokio::test]
    async fn requests_beyond_the_end_are_refused() {
        let joined = ConcatenatedDevice::new(
            Arc::new(MemoryDevice::new(8 * 4096)),
            Arc::new(MemoryDevice::new(8 * 4096)),
        );
        assert!(joined.read(15 * 4096, 2 * 4096).await.is_err());
        assert!(joined.write(16 * 4096, pattern(4096, 1)).await.is_err());
    }
}
