//! Fuzzes recovery: a small two-tier pool is built once in memory (volumes,
//! data, snapshots, clones, a checkpoint, demotions to the capacity tier, a
//! promotion, a tier policy, then more writes, a trim, a rename and a new volume
//! that only the log holds, flushed and abandoned as a crash leaves it). Each input overwrites
//! one structure of a copy of that image (the superblock, a checkpoint slot, a
//! checkpoint body, a batch summary or a data block) and `Pool::open` runs on it.
//! Opening must return Ok or Err, never panic; an opened pool must then survive
//! reads of every volume, a write, a flush and a checkpoint (errors allowed).
//!
//! Input: region selector, mode, two bytes of offset, then the bytes. Mode 0
//! overwrites raw bytes (checksums break: the checks and fallbacks are tested).
//! Mode 1 splices the bytes into the structure's own payload and mode 2 replaces
//! the payload; both re-frame it with correct checksums (and re-point the slot at
//! a changed body), so that the fuzzer reaches the code that trusts a verified
//! structure's fields.

#![no_main]

use std::sync::{Arc, OnceLock};

use lamina_device::MemoryDevice;
use lamina_engine::log::batch::BATCH_MAGIC;
use lamina_engine::log::checkpoint::{BODY_MAGIC, SLOT_MAGIC, Slot};
use lamina_engine::log::frame::{FRAME_HEADER_BYTES, peek_header};
use lamina_engine::log::geometry::{CHECKPOINT_SLOT_BLOCKS, DATA_START_BLOCK};
use lamina_engine::log::superblock::SUPERBLOCK_MAGIC;
use lamina_engine::{Pool, PoolLimits, PoolOptions};
use libfuzzer_sys::fuzz_target;

const BLOCK: usize = 4096;
const SEGMENT_BYTES: u64 = 64 << 10;
/// Flash: metadata and 24 segments; then capacity: its label and 16 segments.
const FLASH_BYTES: u64 = (4 << 20) + 24 * SEGMENT_BYTES;
const DEVICE_BYTES: u64 = FLASH_BYTES + (1 << 20) + 16 * SEGMENT_BYTES;

/// One structure of the image that inputs may overwrite.
struct Region {
    offset: usize,
    length: usize,
    /// The frame magic of a metadata structure; `None` for a data block.
    magic: Option<u64>,
    /// For a checkpoint body: the slot naming it, to re-point after a change.
    slot_offset: Option<usize>,
}

struct Image {
    bytes: Vec<u8>,
    regions: Vec<Region>,
}

fn limits() -> PoolLimits {
    PoolLimits {
        flush_interval_ms: 3_600_000,
        checkpoint_interval_ms: 3_600_000,
        dirty_bytes_max: u64::MAX / 2,
        checkpoint_interval_bytes: u64::MAX / 2,
        ..PoolLimits::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime")
}

fn build_image() -> Image {
    let device = Arc::new(MemoryDevice::new(DEVICE_BYTES));
    runtime().block_on(async {
        let options = PoolOptions {
            segment_size_bytes: SEGMENT_BYTES,
            force: false,
            flash_region_bytes: Some(FLASH_BYTES),
        };
        let pool = Pool::create(device.clone(), options, limits())
            .await
            .expect("create");
        let first = pool
            .create_volume("first", 512 << 10)
            .await
            .expect("volume")
            .volume_id;
        let pattern: Vec<u8> = (0..48 * BLOCK).map(|index| (index / 7) as u8).collect();
        pool.write(first, 0, &pattern, false).await.expect("write");
        // Snapshots and clones, so that the checkpoint body has shared chunks,
        // chunk deltas and origins, and the log has snapshot records.
        pool.create_snapshot("first", "s1").await.expect("snapshot");
        pool.write(first, 3 * BLOCK as u64, &[0x3C; BLOCK], false)
            .await
            .expect("write");
        let clone = pool
            .clone_snapshot("first", "s1", "clone")
            .await
            .expect("clone")
            .volume_id;
        pool.write(clone, 7 * BLOCK as u64, &[0x7E; BLOCK], false)
            .await
            .expect("write");
        pool.checkpoint().await.expect("checkpoint");
        pool.create_snapshot("first", "s2").await.expect("snapshot");
        pool.clone_snapshot("first", "s2", "clone2")
            .await
            .expect("clone");
        // Demote (cleaning flash moves cold blocks to capacity), then read the
        // first volume twice so that blocks on capacity are promoted back.
        pool.clean(4).await.expect("clean");
        pool.set_volume_policy(
            "clone",
            lamina_engine::TierPolicy {
                priority: lamina_engine::CachePriority::High,
                pin: lamina_engine::Pin::Auto,
            },
        )
        .await
        .expect("policy");
        let mut contents = vec![0u8; 48 * BLOCK];
        for _ in 0..2 {
            pool.read(first, 0, &mut contents).await.expect("read");
        }
        pool.write(first, 10 * BLOCK as u64 + 5, &[0xA5; 3 * BLOCK], false)
            .await
            .expect("write");
        pool.trim(first, 40 * BLOCK as u64, 8 * BLOCK as u64, false)
            .await
            .expect("trim");
        let second = pool
            .create_volume("second", 128 << 10)
            .await
            .expect("volume")
            .volume_id;
        pool.write(second, 0, &pattern[..20 * BLOCK], false)
            .await
            .expect("write");
        pool.rename_volume("first", "renamed")
            .await
            .expect("rename");
        pool.flush().await.expect("flush");
        pool.abandon();
    });
    let bytes = device.snapshot();
    // The superblock and its copy, the capacity device's label.
    let mut regions: Vec<Region> = [0, FLASH_BYTES as usize]
        .into_iter()
        .map(|offset| Region {
            offset,
            length: BLOCK,
            magic: Some(SUPERBLOCK_MAGIC),
            slot_offset: None,
        })
        .collect();
    for slot_block in CHECKPOINT_SLOT_BLOCKS {
        let slot_offset = slot_block as usize * BLOCK;
        regions.push(Region {
            offset: slot_offset,
            length: BLOCK,
            magic: Some(SLOT_MAGIC),
            slot_offset: None,
        });
        let slot = Slot::decode(&bytes[slot_offset..slot_offset + BLOCK]).expect("valid slot");
        let body_offset = (DATA_START_BLOCK as usize) * BLOCK
            + slot.body_segments[0] as usize * SEGMENT_BYTES as usize;
        regions.push(Region {
            offset: body_offset,
            length: SEGMENT_BYTES as usize,
            magic: Some(BODY_MAGIC),
            slot_offset: Some(slot_offset),
        });
    }
    // Every block that starts with a batch summary, and the block after it.
    for block in DATA_START_BLOCK as usize..bytes.len() / BLOCK {
        let offset = block * BLOCK;
        if peek_header(BATCH_MAGIC, &bytes[offset..offset + BLOCK]).is_ok() {
            regions.push(Region {
                offset,
                length: BLOCK,
                magic: Some(BATCH_MAGIC),
                slot_offset: None,
            });
            regions.push(Region {
                offset: offset + BLOCK,
                length: BLOCK,
                magic: None,
                slot_offset: None,
            });
        }
    }
    Image { bytes, regions }
}

fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(build_image)
}

/// A frame around `payload` with correct checksums.
fn framed(magic: u64, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
    bytes.extend_from_slice(&magic.to_le_bytes());
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let header_checksum = crc32c::crc32c(&bytes[..20]);
    bytes.extend_from_slice(&header_checksum.to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// The payload of the frame at the start of `bytes`, if its header is sane.
fn payload_of(bytes: &[u8]) -> &[u8] {
    let length = u32::from_le_bytes(bytes[12..16].try_into().expect("four bytes")) as usize;
    &bytes[FRAME_HEADER_BYTES..(FRAME_HEADER_BYTES + length).min(bytes.len())]
}

fn mutate(image: &Image, data: &[u8]) -> Option<Vec<u8>> {
    let [selector, mode, offset_low, offset_high, fuzz @ ..] = data else {
        return None;
    };
    let region = &image.regions[*selector as usize % image.regions.len()];
    let offset = usize::from(u16::from_le_bytes([*offset_low, *offset_high]));
    let mut bytes = image.bytes.clone();
    let area = region.offset..region.offset + region.length;
    match (mode % 3, region.magic) {
        (0, _) | (_, None) => {
            let start = offset % region.length;
            let length = fuzz.len().min(region.length - start);
            bytes[area.start + start..area.start + start + length].copy_from_slice(&fuzz[..length]);
        }
        (mode, Some(magic)) => {
            let mut payload = payload_of(&bytes[area.clone()]).to_vec();
            if mode == 1 {
                let start = offset % (payload.len() + 1);
                let end = start + fuzz.len();
                if end > payload.len() {
                    payload.resize(end, 0);
                }
                payload[start..end].copy_from_slice(fuzz);
            } else {
                payload = fuzz.to_vec();
            }
            let mut frame = framed(magic, &payload);
            frame.truncate(region.length);
            bytes[area.clone()].fill(0);
            bytes[area.start..area.start + frame.len()].copy_from_slice(&frame);
            if let Some(slot_offset) = region.slot_offset
                && let Ok(mut slot) = Slot::decode(&bytes[slot_offset..slot_offset + BLOCK])
            {
                // Point the slot at the new body so that its checksum verifies.
                slot.body_bytes = frame.len() as u64;
                slot.body_checksum = crc32c::crc32c(&frame);
                slot.body_segments.truncate(1);
                let encoded = slot.encode();
                bytes[slot_offset..slot_offset + encoded.len()].copy_from_slice(&encoded);
            }
        }
    }
    Some(bytes)
}

fuzz_target!(|data: &[u8]| {
    let image = image();
    let Some(bytes) = mutate(image, data) else {
        return;
    };
    let device = Arc::new(MemoryDevice::from_bytes(bytes));
    runtime().block_on(async move {
        let Ok(pool) = Pool::open(device, limits()).await else {
            return;
        };
        for volume in pool.list_volumes() {
            let mut buffer = vec![0u8; volume.size_bytes.min(1 << 20) as usize];
            let _ = pool.read(volume.volume_id, 0, &mut buffer).await;
            let _ = pool.extents(volume.volume_id, 0, buffer.len() as u64);
            let _ = pool
                .write(volume.volume_id, 4096, &[0x5A; 4096], false)
                .await;
        }
        let _ = pool.flush().await;
        let _ = pool.checkpoint().await;
        pool.abandon();
    });
});
