//! A map entry holds a physical block in 40 bits (2^40 blocks of 4 KiB: 4 PiB
//! of devices; decision 0035), so a pool whose address space is larger is
//! refused where it is created and where it is opened, with a typed error that
//! names the device and its size, rather than reaching the map's assertion.
//! The devices here claim such sizes over a small memory device, which is
//! all that creation and open touch before they refuse.

// Test code keeps `as` for small sizes (issue 17 converts the library and
// binaries only).
#![allow(clippy::cast_possible_truncation)]

mod common;
use common::pools::options;

use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockDevice, DeviceError, MemoryDevice};
use lamina_engine::log::geometry::{Geometry, SUPERBLOCK_COPY_BLOCK};
use lamina_engine::log::superblock::{SUPERBLOCK_MAGIC, Superblock};
use lamina_engine::log::{FORMAT_VERSION, frame};
use lamina_engine::volume::map::POOL_SIZE_BYTES_MAX;
use lamina_engine::{BLOCK_SIZE_BYTES, CreateError, EngineError, OpenError, Pool, PoolLimits};

const SEGMENT_BYTES: u64 = 64 << 10;
const BACKING_BYTES: u64 = (4 << 20) + 32 * SEGMENT_BYTES;
/// The segments of the claimed geometries: large, so that a lamina without
/// the check would build tables for 2^22 segments (200 MiB or so) and fail
/// further on, rather than try to allocate terabytes of them.
const LARGE_SEGMENT_BYTES: u64 = 1 << 30;

/// A device claiming `claimed_size_bytes` whose first bytes are `backing`:
/// reads beyond them are zeros, writes beyond them fail.
struct ClaimedDevice {
    backing: MemoryDevice,
    claimed_size_bytes: u64,
}

#[async_trait::async_trait]
impl BlockDevice for ClaimedDevice {
    fn name(&self) -> &str {
        "claimed"
    }

    fn size_bytes(&self) -> u64 {
        self.claimed_size_bytes
    }

    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        lamina_device::DeviceReadFuture::from_or_box(async move {
            if offset + length as u64 <= self.backing.size_bytes() {
                return self.backing.read(offset, length).await;
            }
            Ok(AlignedBuffer::zeroed(length))
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        self.backing.write(offset, data).await
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

#[tokio::test]
async fn create_refuses_a_device_beyond_the_maps_40_bits() {
    let size_bytes = POOL_SIZE_BYTES_MAX + LARGE_SEGMENT_BYTES;
    let device = Arc::new(ClaimedDevice {
        backing: MemoryDevice::new(BACKING_BYTES),
        claimed_size_bytes: size_bytes,
    });
    let created = Pool::create(
        device.clone(),
        options(LARGE_SEGMENT_BYTES, None),
        PoolLimits::default(),
    );
    let error = match created.await {
        Ok(_) => panic!("created a pool beyond 2^40 blocks"),
        Err(error) => error,
    };
    assert!(
        matches!(
            &error,
            EngineError::Create(CreateError::DeviceTooLarge {
                device,
                size_bytes: found,
                maximum_bytes: POOL_SIZE_BYTES_MAX,
            }) if device == "claimed" && *found == size_bytes
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("2^40 blocks"), "{error}");
    assert!(
        device.backing.snapshot().iter().all(|byte| *byte == 0),
        "refusing wrote to the device"
    );
}

/// A superblock whose geometry spans more than 2^40 blocks (which this lamina
/// never writes) is refused on open before anything else is read.
#[tokio::test]
async fn open_refuses_a_geometry_beyond_the_maps_40_bits() {
    let backing = Arc::new(MemoryDevice::new(BACKING_BYTES));
    Pool::create(
        backing.clone(),
        options(SEGMENT_BYTES, None),
        PoolLimits::default(),
    )
    .await
    .unwrap()
    .close()
    .await
    .unwrap();
    let mut image = backing.snapshot();
    let (_, mut superblock) = Superblock::decode(&image[..BLOCK_SIZE_BYTES as usize]).unwrap();
    let size_bytes = POOL_SIZE_BYTES_MAX + LARGE_SEGMENT_BYTES;
    superblock.geometry = Geometry::for_device(size_bytes, LARGE_SEGMENT_BYTES).unwrap();
    let encoded = frame::encode(
        SUPERBLOCK_MAGIC,
        FORMAT_VERSION,
        &superblock,
        BLOCK_SIZE_BYTES as usize,
    );
    for block in [0, SUPERBLOCK_COPY_BLOCK] {
        let start = (block * BLOCK_SIZE_BYTES) as usize;
        image[start..start + encoded.len()].copy_from_slice(&encoded);
    }
    let device = Arc::new(ClaimedDevice {
        backing: MemoryDevice::from_bytes(image.clone()),
        claimed_size_bytes: size_bytes,
    });
    let error = match Pool::open(device.clone(), PoolLimits::default()).await {
        Ok(_) => panic!("opened a pool beyond 2^40 blocks"),
        Err(error) => error,
    };
    assert!(
        matches!(
            &error,
            EngineError::Open(OpenError::DeviceTooLarge {
                size_bytes: found,
                maximum_bytes: POOL_SIZE_BYTES_MAX,
                ..
            }) if *found == size_bytes
        ),
        "{error:?}"
    );
    assert!(
        device.backing.snapshot() == image,
        "refusing to open changed the device"
    );
}
