//! Bad input at the engine's edges: opening devices that are not (or no longer)
//! a usable lamina pool, creating a pool where it must not be created, and volume
//! operations and I/O requests that are invalid. Each case must give the specific
//! `EngineError` variant with a message naming the problem, and refusing to open
//! must leave every byte of the device as it was (a full snapshot is compared),
//! because an operator who points lamina at the wrong disk must not lose it.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use lamina_device::{FileDevice, FileDeviceOptions, MemoryDevice};
use lamina_engine::log::geometry::{Geometry, SUPERBLOCK_COPY_BLOCK};
use lamina_engine::log::superblock::{SUPERBLOCK_MAGIC, Superblock};
use lamina_engine::log::{FORMAT_VERSION, frame};
use lamina_engine::{
    BLOCK_SIZE_BYTES, CreateError, EngineError, IoError, OpenError, Pool, PoolLimits, PoolOptions,
    VolumeError,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const SEGMENT_BYTES: u64 = 64 << 10;
const DEVICE_BYTES: u64 = (4 << 20) + 32 * SEGMENT_BYTES;

fn options(force: bool) -> PoolOptions {
    PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        force,
        flash_region_bytes: None,
        ..PoolOptions::default()
    }
}

/// Opens a pool on a copy of `image` and returns the error, after checking that
/// the device still holds exactly `image`.
async fn open_must_fail(image: Vec<u8>) -> EngineError {
    let device = Arc::new(MemoryDevice::from_bytes(image.clone()));
    let error = match Pool::open(device.clone(), PoolLimits::default()).await {
        Ok(_) => panic!("a pool opened on a device that should have been refused"),
        Err(error) => error,
    };
    assert!(
        device.snapshot() == image,
        "refusing to open ({error}) changed the device"
    );
    error
}

/// A freshly created and cleanly closed pool with one volume holding data.
async fn pool_image() -> Vec<u8> {
    let device = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    let pool = Pool::create(device.clone(), options(false), PoolLimits::default())
        .await
        .unwrap();
    let volume = pool.create_volume("data", 1 << 20).await.unwrap();
    pool.write(volume.volume_id, 8192, &[0x5A; 8192], false)
        .await
        .unwrap();
    pool.close().await.unwrap();
    device.snapshot()
}

#[tokio::test]
async fn zeros_are_not_a_pool() {
    let error = open_must_fail(vec![0u8; DEVICE_BYTES as usize]).await;
    assert!(
        matches!(&error, EngineError::Open(OpenError::NotAPool { device }) if device == "memory"),
        "{error:?}"
    );
    assert!(error.to_string().contains("not a lamina pool"), "{error}");
}

#[tokio::test]
async fn random_bytes_are_not_a_pool() {
    let mut rng = SmallRng::seed_from_u64(11);
    for _ in 0..4 {
        let mut image = vec![0u8; DEVICE_BYTES as usize];
        rng.fill(&mut image[..]);
        let error = open_must_fail(image).await;
        assert!(
            matches!(error, EngineError::Open(OpenError::NotAPool { .. })),
            "{error:?}"
        );
        assert!(error.to_string().contains("not a lamina pool"), "{error}");
    }
}

/// Only the magic survives: a block 0 that says LAMINASB but whose checksums are
/// garbage is a corrupt superblock, not "not a pool".
#[tokio::test]
async fn garbage_after_the_magic_is_a_corrupt_superblock() {
    let mut rng = SmallRng::seed_from_u64(12);
    let mut image = vec![0u8; DEVICE_BYTES as usize];
    rng.fill(&mut image[..]);
    image[..8].copy_from_slice(&SUPERBLOCK_MAGIC.to_le_bytes());
    let error = open_must_fail(image).await;
    assert!(
        matches!(
            &error,
            EngineError::Open(OpenError::Corrupt {
                structure: "superblock",
                offset: 0,
                ..
            })
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("corrupt superblock"), "{error}");
}

#[tokio::test]
async fn an_ext4_image_is_not_a_pool() {
    if Command::new("mkfs.ext4").arg("-V").output().is_err() {
        eprintln!("mkfs.ext4 not installed; skipping");
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("ext4.img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(DEVICE_BYTES * 4)
        .unwrap();
    let status = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success(), "mkfs.ext4 failed");
    let before = std::fs::read(&path).unwrap();
    let device = Arc::new(FileDevice::open(&path, FileDeviceOptions::default()).unwrap());
    let error = match Pool::open(device.clone(), PoolLimits::default()).await {
        Ok(_) => panic!("an ext4 image opened as a pool"),
        Err(error) => error,
    };
    assert!(
        matches!(error, EngineError::Open(OpenError::NotAPool { .. })),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("not a lamina pool") && message.contains("ext4.img"),
        "{message}"
    );
    // Create refuses it too: it holds data.
    let error = match Pool::create(device.clone(), options(false), PoolLimits::default()).await {
        Ok(_) => panic!("created a pool over an ext4 file system without force"),
        Err(error) => error,
    };
    assert!(
        matches!(
            error,
            EngineError::Create(CreateError::DeviceNotEmpty { .. })
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("unless forced") && !message.contains("--force"),
        "{message}"
    );
    drop(device);
    assert!(
        std::fs::read(&path).unwrap() == before,
        "refusing the ext4 image changed it"
    );
}

/// A superblock written by a future lamina (the next format version) is refused, naming
/// both versions, and the pool is left untouched for that newer lamina; one from
/// an older development build (version 1, before snapshots) is refused too.
#[tokio::test]
async fn newer_and_older_format_versions_are_refused_naming_both_versions() {
    let mut image = pool_image().await;
    let (_, superblock) = Superblock::decode(&image[..BLOCK_SIZE_BYTES as usize]).unwrap();
    let newer_version = FORMAT_VERSION + 1;
    let newer = frame::encode(
        SUPERBLOCK_MAGIC,
        newer_version,
        &superblock,
        BLOCK_SIZE_BYTES as usize,
    );
    image[..newer.len()].copy_from_slice(&newer);
    let error = open_must_fail(image.clone()).await;
    assert!(
        matches!(
            error,
            EngineError::Open(OpenError::NewerFormat {
                found,
                supported: FORMAT_VERSION,
                ..
            }) if found == newer_version
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains(&format!("format version {newer_version}"))
            && message.contains(&format!("({FORMAT_VERSION})")),
        "{message}"
    );
    let older = frame::encode(SUPERBLOCK_MAGIC, 1, &superblock, BLOCK_SIZE_BYTES as usize);
    image[..older.len()].copy_from_slice(&older);
    let error = open_must_fail(image).await;
    assert!(
        matches!(
            error,
            EngineError::Open(OpenError::OlderFormat {
                found: 1,
                supported: 2,
                ..
            })
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("recreate"), "{error}");
}

/// A version 2 pool (one tier, no tier policies) opens as it is, with its data.
#[tokio::test]
async fn a_version_2_superblock_still_opens() {
    let mut image = pool_image().await;
    let (_, superblock) = Superblock::decode(&image[..BLOCK_SIZE_BYTES as usize]).unwrap();
    let geometry = superblock.geometry;
    // Version 2's superblock: the same fields without the tier split.
    let old = (
        superblock.pool_identifier,
        (
            geometry.device_size_bytes,
            geometry.segment_size_blocks,
            geometry.segment_count,
        ),
        superblock.created_unix_seconds,
    );
    let encoded = frame::encode(SUPERBLOCK_MAGIC, 2, &old, BLOCK_SIZE_BYTES as usize);
    image[..encoded.len()].copy_from_slice(&encoded);
    let (version, decoded) = Superblock::decode(&image[..BLOCK_SIZE_BYTES as usize]).unwrap();
    assert_eq!((version, decoded.geometry), (2, geometry));
    let device = Arc::new(MemoryDevice::from_bytes(image));
    let pool = Pool::open(device, PoolLimits::default()).await.unwrap();
    let volume = pool.volume_id("data").unwrap();
    let mut contents = vec![0u8; 8192];
    pool.read(volume, 8192, &mut contents).await.unwrap();
    assert_eq!(contents, vec![0x5A; 8192]);
    pool.close().await.unwrap();
}

#[tokio::test]
async fn a_truncated_file_is_refused_and_left_alone() {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("pool.img");
    {
        let device = Arc::new(
            FileDevice::open(
                &path,
                FileDeviceOptions {
                    create_size_bytes: Some(DEVICE_BYTES),
                    ..FileDeviceOptions::default()
                },
            )
            .unwrap(),
        );
        let pool = Pool::create(device, options(false), PoolLimits::default())
            .await
            .unwrap();
        let volume = pool.create_volume("data", 1 << 20).await.unwrap();
        pool.write(volume.volume_id, 0, &[7u8; 4096], false)
            .await
            .unwrap();
        pool.close().await.unwrap();
    }
    let truncated_bytes = DEVICE_BYTES - 3 * SEGMENT_BYTES;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(truncated_bytes)
        .unwrap();
    let before = std::fs::read(&path).unwrap();
    let error = open_file_pool(&path).await;
    assert!(
        matches!(
            error,
            EngineError::Open(OpenError::Truncated {
                expected_bytes: DEVICE_BYTES,
                actual_bytes,
                ..
            }) if actual_bytes == truncated_bytes
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("truncated"), "{error}");
    assert!(
        std::fs::read(&path).unwrap() == before,
        "refusing a truncated pool changed it"
    );
}

async fn open_file_pool(path: &Path) -> EngineError {
    let device = Arc::new(FileDevice::open(path, FileDeviceOptions::default()).unwrap());
    match Pool::open(device, PoolLimits::default()).await {
        Ok(_) => panic!("opened a pool that should have been refused"),
        Err(error) => error,
    }
}

/// Every single-bit flip in the superblock frame (after the magic), made in
/// both the superblock and its copy, is caught as a corrupt superblock; a flip
/// in the magic makes block 0 "not a pool". Neither writes anything.
#[tokio::test]
async fn every_bit_flip_in_the_superblock_and_its_copy_is_refused() {
    let image = pool_image().await;
    let copy_offset = (SUPERBLOCK_COPY_BLOCK * BLOCK_SIZE_BYTES) as usize;
    let payload_bytes = u32::from_le_bytes(image[12..16].try_into().unwrap()) as usize;
    let used_bytes = frame::FRAME_HEADER_BYTES + payload_bytes;
    for bit in 0..used_bytes * 8 {
        let mut flipped = image.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        flipped[copy_offset + bit / 8] ^= 1 << (bit % 8);
        let device = Arc::new(MemoryDevice::from_bytes(flipped.clone()));
        let error = match Pool::open(device.clone(), PoolLimits::default()).await {
            Ok(_) => panic!("bit {bit}: opened a pool with a corrupt superblock"),
            Err(error) => error,
        };
        if bit < 64 {
            assert!(
                matches!(error, EngineError::Open(OpenError::NotAPool { .. })),
                "bit {bit}: {error:?}"
            );
        } else {
            assert!(
                matches!(
                    &error,
                    EngineError::Open(OpenError::Corrupt {
                        structure: "superblock",
                        offset: 0,
                        ..
                    })
                ),
                "bit {bit}: {error:?}"
            );
            assert!(
                error.to_string().contains("corrupt superblock"),
                "bit {bit}: {error}"
            );
        }
        // A full comparison for a sample of flips keeps the test fast; the flips
        // not compared in full are checked where a write would land first.
        let after = device.snapshot();
        if bit % 61 == 0 {
            assert!(after == flipped, "bit {bit}: refusing changed the device");
        } else {
            let metadata_end = copy_offset + BLOCK_SIZE_BYTES as usize;
            assert!(after[..metadata_end] == flipped[..metadata_end]);
        }
    }
}

/// A flip in the superblock alone (after the magic) is read from its copy,
/// and block 0 is rewritten from it; a flip in the magic is "not a pool"
/// whatever the copy holds (the device may have been reused).
#[tokio::test]
async fn a_bit_flip_in_the_superblock_alone_is_repaired_from_its_copy() {
    let image = pool_image().await;
    let payload_bytes = u32::from_le_bytes(image[12..16].try_into().unwrap()) as usize;
    let used_bytes = frame::FRAME_HEADER_BYTES + payload_bytes;
    let block = BLOCK_SIZE_BYTES as usize;
    for bit in (0..used_bytes * 8).step_by(7) {
        let mut flipped = image.clone();
        flipped[bit / 8] ^= 1 << (bit % 8);
        let device = Arc::new(MemoryDevice::from_bytes(flipped));
        match Pool::open(device.clone(), PoolLimits::default()).await {
            Ok(pool) => {
                assert!(bit >= 64, "bit {bit}: opened without the magic");
                pool.close().await.unwrap();
                assert!(
                    device.snapshot()[..block] == image[..block],
                    "bit {bit}: block 0 was not repaired"
                );
            }
            Err(error) => assert!(
                bit < 64 && matches!(error, EngineError::Open(OpenError::NotAPool { .. })),
                "bit {bit}: {error:?}"
            ),
        }
    }
}

/// Writes `geometry` into a valid superblock frame over a closed pool's image.
async fn image_with_geometry(change: impl Fn(&mut Geometry)) -> Vec<u8> {
    let mut image = pool_image().await;
    let (_, mut superblock) = Superblock::decode(&image[..BLOCK_SIZE_BYTES as usize]).unwrap();
    change(&mut superblock.geometry);
    let encoded = superblock.encode();
    image[..encoded.len()].copy_from_slice(&encoded);
    image
}

/// A superblock whose checksums are right but whose geometry does not fit the
/// device (as a bug or a hand edit could leave it) is refused, not trusted.
#[tokio::test]
async fn a_superblock_naming_more_segments_than_the_device_holds_is_refused() {
    let image = image_with_geometry(|geometry| geometry.segment_count *= 1000).await;
    let error = open_must_fail(image).await;
    assert!(
        matches!(
            error,
            EngineError::Open(OpenError::Corrupt {
                structure: "superblock",
                ..
            }) | EngineError::Device(_)
        ),
        "{error:?}"
    );
}

/// The same with a segment size of zero: it must be a corrupt superblock, not a
/// crash of the process that opens it.
#[tokio::test]
async fn a_superblock_with_a_zero_segment_size_is_corrupt() {
    let image = image_with_geometry(|geometry| geometry.segment_size_blocks = 0).await;
    let error = open_must_fail(image).await;
    assert!(
        matches!(
            &error,
            EngineError::Open(OpenError::Corrupt {
                structure: "superblock",
                ..
            })
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn create_refuses_a_device_holding_data_unless_forced() {
    let mut image = vec![0u8; DEVICE_BYTES as usize];
    image[12345] = 1;
    let device = Arc::new(MemoryDevice::from_bytes(image.clone()));
    let error = match Pool::create(device.clone(), options(false), PoolLimits::default()).await {
        Ok(_) => panic!("created a pool over data without force"),
        Err(error) => error,
    };
    assert!(
        matches!(
            error,
            EngineError::Create(CreateError::DeviceNotEmpty { offset: 12345, .. })
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("already holds data") && message.contains("12345"),
        "{message}"
    );
    assert!(device.snapshot() == image, "refusing changed the device");

    // Creating over an existing pool is refused the same way.
    let existing = pool_image().await;
    let device = Arc::new(MemoryDevice::from_bytes(existing.clone()));
    let error = match Pool::create(device.clone(), options(false), PoolLimits::default()).await {
        Ok(_) => panic!("created a pool over a pool without force"),
        Err(error) => error,
    };
    assert!(
        matches!(
            error,
            EngineError::Create(CreateError::DeviceNotEmpty { offset: 0, .. })
        ),
        "{error:?}"
    );
    assert!(device.snapshot() == existing);

    // With force it works, and the old pool's volumes are gone.
    let pool = Pool::create(device.clone(), options(true), PoolLimits::default())
        .await
        .unwrap();
    assert!(pool.list_volumes().is_empty());
    pool.create_volume("fresh", 1 << 20).await.unwrap();
    pool.close().await.unwrap();
    let pool = Pool::open(device, PoolLimits::default()).await.unwrap();
    let names: Vec<String> = pool
        .list_volumes()
        .into_iter()
        .map(|volume| volume.name)
        .collect();
    assert_eq!(names, ["fresh"]);
}

#[tokio::test]
async fn create_refuses_a_device_too_small() {
    let minimum_bytes = Geometry::minimum_device_bytes(SEGMENT_BYTES);
    let device = Arc::new(MemoryDevice::new(minimum_bytes - 4096));
    let error = match Pool::create(device.clone(), options(false), PoolLimits::default()).await {
        Ok(_) => panic!("created a pool on too small a device"),
        Err(error) => error,
    };
    assert!(
        matches!(
            error,
            EngineError::Create(CreateError::DeviceTooSmall { size_bytes, minimum_bytes: minimum, .. })
                if size_bytes == minimum_bytes - 4096 && minimum == minimum_bytes
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("too small"), "{error}");
    assert!(device.snapshot().iter().all(|byte| *byte == 0));
    // The minimum itself is enough.
    let device = Arc::new(MemoryDevice::new(minimum_bytes));
    let pool = Pool::create(device, options(false), PoolLimits::default())
        .await
        .unwrap();
    pool.close().await.unwrap();
}

async fn fresh_pool() -> Pool {
    let device = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    Pool::create(device, options(false), PoolLimits::default())
        .await
        .unwrap()
}

#[tokio::test]
async fn invalid_volume_names_and_sizes_are_refused() {
    let pool = fresh_pool().await;
    let long_name = "a".repeat(65);
    for name in [
        "",
        long_name.as_str(),
        ".hidden",
        "-option",
        "a/b",
        "snap@1",
        "space name",
        "ünicode",
        "tab\t",
    ] {
        let error = pool.create_volume(name, 1 << 20).await.unwrap_err();
        assert!(
            matches!(&error, EngineError::Volume(VolumeError::InvalidName { name: refused, .. }) if refused == name),
            "{name:?}: {error:?}"
        );
        assert!(
            error
                .to_string()
                .contains("invalid volume or snapshot name"),
            "{error}"
        );
    }
    // The longest allowed name and every allowed character work.
    pool.create_volume(&"b".repeat(64), 4096).await.unwrap();
    pool.create_volume("Az09._-", 4096).await.unwrap();
    for size_bytes in [0, 1, 4095, 4097, (1 << 50) + 4096, u64::MAX] {
        let error = pool.create_volume("sized", size_bytes).await.unwrap_err();
        assert!(
            matches!(error, EngineError::Volume(VolumeError::InvalidSize { size_bytes: refused, .. }) if refused == size_bytes),
            "{size_bytes}: {error:?}"
        );
        assert!(error.to_string().contains("invalid size"), "{error}");
    }
    pool.create_volume("sized", 1 << 20).await.unwrap();
    let error = pool.resize_volume("sized", 4095, true).await.unwrap_err();
    assert!(
        matches!(error, EngineError::Volume(VolumeError::InvalidSize { .. })),
        "{error:?}"
    );
    let error = pool.rename_volume("sized", "bad/name").await.unwrap_err();
    assert!(
        matches!(error, EngineError::Volume(VolumeError::InvalidName { .. })),
        "{error:?}"
    );
    // Nothing refused was created.
    let mut names: Vec<String> = pool
        .list_volumes()
        .into_iter()
        .map(|volume| volume.name)
        .collect();
    names.sort();
    assert_eq!(names, ["Az09._-", "b".repeat(64).as_str(), "sized"]);
    assert_eq!(pool.volume_info("sized").unwrap().size_bytes, 1 << 20);
}

#[tokio::test]
async fn duplicate_and_unknown_volumes_are_refused() {
    let pool = fresh_pool().await;
    pool.create_volume("one", 1 << 20).await.unwrap();
    pool.create_volume("two", 2 << 20).await.unwrap();
    let error = pool.create_volume("one", 4096).await.unwrap_err();
    assert!(
        matches!(&error, EngineError::Volume(VolumeError::VolumeExists(name)) if name == "one"),
        "{error:?}"
    );
    assert!(error.to_string().contains("already exists"), "{error}");
    assert_eq!(pool.volume_info("one").unwrap().size_bytes, 1 << 20);
    let error = pool.rename_volume("one", "two").await.unwrap_err();
    assert!(
        matches!(&error, EngineError::Volume(VolumeError::VolumeExists(name)) if name == "two"),
        "{error:?}"
    );

    let unknown = |error: EngineError| {
        assert!(
            matches!(&error, EngineError::Volume(VolumeError::NoSuchVolume(name)) if name == "ghost"),
            "{error:?}"
        );
        assert!(
            error.to_string().contains("no such volume: ghost"),
            "{error}"
        );
    };
    unknown(pool.volume_info("ghost").unwrap_err());
    unknown(pool.volume_id("ghost").unwrap_err());
    unknown(pool.resize_volume("ghost", 4096, false).await.unwrap_err());
    unknown(pool.rename_volume("ghost", "spirit").await.unwrap_err());
    unknown(pool.delete_volume("ghost").await.unwrap_err());

    // I/O to an identifier that names no volume (never created, or deleted).
    let deleted = pool.volume_id("two").unwrap();
    pool.delete_volume("two").await.unwrap();
    for volume_id in [deleted, 999] {
        let mut buffer = [0u8; 4096];
        assert!(matches!(
            pool.read(volume_id, 0, &mut buffer).await.unwrap_err(),
            EngineError::Volume(VolumeError::NoSuchVolume(_))
        ));
        assert!(matches!(
            pool.write(volume_id, 0, &buffer, false).await.unwrap_err(),
            EngineError::Volume(VolumeError::NoSuchVolume(_))
        ));
        assert!(matches!(
            pool.trim(volume_id, 0, 4096, false).await.unwrap_err(),
            EngineError::Volume(VolumeError::NoSuchVolume(_))
        ));
        assert!(matches!(
            pool.extents(volume_id, 0, 4096).unwrap_err(),
            EngineError::Volume(VolumeError::NoSuchVolume(_))
        ));
    }
    assert_eq!(pool.volume_size_bytes(deleted), None);
}

#[tokio::test]
async fn shrinking_needs_force() {
    let pool = fresh_pool().await;
    let volume = pool.create_volume("shrink", 1 << 20).await.unwrap();
    pool.write(volume.volume_id, (1 << 20) - 4096, &[9u8; 4096], false)
        .await
        .unwrap();
    let error = pool
        .resize_volume("shrink", 512 << 10, false)
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            EngineError::Volume(VolumeError::ShrinkNeedsForce { volume, from_bytes: 1_048_576, to_bytes: 524_288 })
                if volume == "shrink"
        ),
        "{error:?}"
    );
    // The engine says the resize must be forced, not how: the CLI names its flag.
    let message = error.to_string();
    assert!(
        message.contains("must be forced") && !message.contains("--force"),
        "{message}"
    );
    // Nothing changed: the size and the tail are still there.
    assert_eq!(pool.volume_info("shrink").unwrap().size_bytes, 1 << 20);
    let mut tail = [0u8; 4096];
    pool.read(volume.volume_id, (1 << 20) - 4096, &mut tail)
        .await
        .unwrap();
    assert_eq!(tail, [9u8; 4096]);
    // Growing and resizing to the same size need no force.
    pool.resize_volume("shrink", 2 << 20, false).await.unwrap();
    pool.resize_volume("shrink", 2 << 20, false).await.unwrap();
}

#[tokio::test]
async fn requests_beyond_the_end_are_out_of_range() {
    let pool = fresh_pool().await;
    let size_bytes: u64 = 1 << 20;
    let volume_id = pool
        .create_volume("edge", size_bytes)
        .await
        .unwrap()
        .volume_id;
    let out_of_range = |error: EngineError, offset: u64, length: u64| {
        assert!(
            matches!(
                &error,
                EngineError::Io(IoError::OutOfRange { volume, offset: o, length: l, size_bytes: s })
                    if volume == "edge" && *o == offset && *l == length && *s == size_bytes
            ),
            "offset {offset} length {length}: {error:?}"
        );
        assert!(error.to_string().contains("beyond the end"), "{error}");
    };
    let cases: [(u64, u64); 6] = [
        (size_bytes, 1),
        (size_bytes - 1, 2),
        (size_bytes - 4096, 8192),
        (size_bytes + 4096, 4096),
        (u64::MAX - 10, 100),
        (u64::MAX, 1),
    ];
    for (offset, length) in cases {
        let mut buffer = vec![0u8; length as usize];
        // Reads whose end overflows u64 are covered (and fail) in
        // `a_read_whose_end_overflows_is_out_of_range`.
        if offset.checked_add(length).is_some() {
            out_of_range(
                pool.read(volume_id, offset, &mut buffer).await.unwrap_err(),
                offset,
                length,
            );
        }
        out_of_range(
            pool.write(volume_id, offset, &buffer, false)
                .await
                .unwrap_err(),
            offset,
            length,
        );
        out_of_range(
            pool.write_zeroes(volume_id, offset, length, false, false)
                .await
                .unwrap_err(),
            offset,
            length,
        );
        out_of_range(
            pool.trim(volume_id, offset, length, false)
                .await
                .unwrap_err(),
            offset,
            length,
        );
        out_of_range(
            pool.extents(volume_id, offset, length).unwrap_err(),
            offset,
            length,
        );
    }
    // Huge lengths that overflow are out of range too, not a panic.
    out_of_range(
        pool.trim(volume_id, 4096, u64::MAX, false)
            .await
            .unwrap_err(),
        4096,
        u64::MAX,
    );
    // Nothing was written by the refused requests; the last byte is usable.
    assert_eq!(pool.volume_info("edge").unwrap().allocated_bytes, 0);
    pool.write(volume_id, size_bytes - 1, &[1], false)
        .await
        .unwrap();
    let mut last = [0u8; 1];
    pool.read(volume_id, size_bytes - 1, &mut last)
        .await
        .unwrap();
    assert_eq!(last, [1]);
}

#[tokio::test]
async fn a_read_whose_end_overflows_is_out_of_range() {
    let pool = fresh_pool().await;
    let volume_id = pool.create_volume("edge", 1 << 20).await.unwrap().volume_id;
    let mut buffer = vec![0u8; 100];
    let error = pool
        .read(volume_id, u64::MAX - 10, &mut buffer)
        .await
        .unwrap_err();
    assert!(
        matches!(error, EngineError::Io(IoError::OutOfRange { .. })),
        "{error:?}"
    );
}
