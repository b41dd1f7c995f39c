//! Fuzzes the decoder of every on-disk metadata structure: `frame::decode` of
//! arbitrary bytes as a superblock, a batch summary, a checkpoint slot and a
//! checkpoint body. The first input byte chooses the structure and whether the
//! rest is used raw (exercising the magic, version, length and checksum checks)
//! or wrapped in a frame with correct magic and checksums (so that the fuzzer
//! reaches the postcard payload decoding, which is otherwise behind a crc32c).
//! Decoding must never panic, and whatever decodes must encode and decode again
//! to the same value.

#![no_main]

use lamina_engine::log::FORMAT_VERSION;
use lamina_engine::log::batch::{BATCH_MAGIC, Summary};
use lamina_engine::log::checkpoint::{BODY_MAGIC, Body, SLOT_MAGIC, Slot};
use lamina_engine::log::frame::{self, FRAME_HEADER_BYTES};
use lamina_engine::log::superblock::{SUPERBLOCK_MAGIC, Superblock};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A frame around `payload` with the given magic and version and correct checksums.
fn framed(magic: u64, version: u32, payload: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(FRAME_HEADER_BYTES + payload.len());
    bytes.extend_from_slice(&magic.to_le_bytes());
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let header_checksum = crc32c::crc32c(&bytes[..20]);
    bytes.extend_from_slice(&header_checksum.to_le_bytes());
    bytes.extend_from_slice(payload);
    bytes
}

/// Decodes with the generic decoder, and round-trips whatever decodes.
fn generic<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(
    magic: u64,
    bytes: &[u8],
) {
    if let Ok((version, value)) = frame::decode::<T>(magic, FORMAT_VERSION, bytes) {
        assert!(version <= FORMAT_VERSION);
        // The header peek used by the log scan agrees with the full decoder.
        assert!(frame::peek_header(magic, bytes).is_ok());
        let encoded = frame::encode(magic, FORMAT_VERSION, &value, 4096);
        let (_, again) =
            frame::decode::<T>(magic, FORMAT_VERSION, &encoded).expect("re-encoded frame decodes");
        assert_eq!(again, value);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let structure = selector % 4;
    let magic = [SUPERBLOCK_MAGIC, BATCH_MAGIC, SLOT_MAGIC, BODY_MAGIC][structure as usize];
    let bytes = match (selector / 4) % 4 {
        0 => rest.to_vec(),
        // A correct frame of the current version, or of a newer one.
        1 => framed(magic, FORMAT_VERSION, rest),
        2 => framed(magic, FORMAT_VERSION + 1 + u32::from(selector >> 4), rest),
        // A correct frame padded with zeros to a block, as structures are stored.
        _ => {
            let mut bytes = framed(magic, FORMAT_VERSION, rest);
            bytes.resize(bytes.len().next_multiple_of(4096), 0);
            bytes
        }
    };
    match structure {
        0 => {
            generic::<Superblock>(magic, &bytes);
            if let Ok((_, value)) = Superblock::decode(&bytes) {
                assert_eq!(Superblock::decode(&value.encode()).unwrap().1, value);
            }
        }
        1 => {
            generic::<Summary>(magic, &bytes);
            if let Ok(value) = Summary::decode(&bytes) {
                assert!(
                    value.data_block_count() <= lamina_engine::log::batch::BATCH_DATA_BLOCKS_MAX
                );
            }
        }
        2 => {
            generic::<Slot>(magic, &bytes);
            if let Ok(value) = Slot::decode(&bytes) {
                assert_eq!(Slot::decode(&value.encode()).unwrap(), value);
            }
        }
        _ => {
            generic::<Body>(magic, &bytes);
            if let Ok(value) = Body::decode(&bytes) {
                assert_eq!(Body::decode(&value.encode()).unwrap(), value);
            }
        }
    }
});
