//! Fuzzes the packed fragment decoder (`log::fragment`, decision 0070) and
//! `Location::from_raw`. The input is a selector byte, a raw location (8
//! bytes, little-endian), a checksum (4 bytes) and a payload. The selector
//! chooses how the payload reaches the decoder: as the blocks read from the
//! device, checked against the given checksum (the outer check); placed at a
//! fragment location with the checksum recomputed (so the fuzzer reaches the
//! header, padding and codec checks); behind a well-formed header of a known
//! codec (so it reaches the codecs themselves); or encoded first, when it must
//! read back exactly. Decoding must never panic, and whatever decodes is 4096
//! bytes whose crc32c is the one the fragment's header records.

#![no_main]

use lamina_engine::BLOCK_BYTES;
use lamina_engine::log::fragment::{
    EncodedBlock, FRAGMENT_HEADER_BYTES, FragmentDecoder, FragmentEncoder, STORED_BYTES_MAX,
    fragment_units,
};
use lamina_engine::log::location::{Location, UNIT_BYTES};
use lamina_reduction::Codec;
use libfuzzer_sys::fuzz_target;

/// Bytes before the payload: selector, raw location, checksum.
const PREFIX_BYTES: usize = 1 + 8 + 4;
/// Where placed fragments start: any block will do, the decoder only reads
/// the location's offset and count.
const PLACED_BLOCK: u64 = 7;

/// Decodes and checks what comes out.
fn decode(decoder: &mut FragmentDecoder, location: Location, blocks: &[u8], checksum: u32) -> bool {
    let mut output = [0; BLOCK_BYTES];
    if decoder
        .decode(location, blocks, checksum, &mut output)
        .is_err()
    {
        return false;
    }
    let fragment = fragment_units(location, blocks).expect("a decoded fragment's units");
    let recorded = u32::from_le_bytes(fragment[2..6].try_into().expect("4 bytes"));
    assert_eq!(crc32c::crc32c(&output), recorded, "{location}");
    assert_eq!(crc32c::crc32c(fragment), checksum, "{location}");
    true
}

/// A fragment location for `fragment_bytes` bytes (rounded up to units),
/// starting `unit_offset_byte` units into its block.
fn fragment_location(unit_offset_byte: u8, fragment_bytes: usize) -> Option<Location> {
    let unit_count = u32::try_from(fragment_bytes.div_ceil(UNIT_BYTES)).ok()?;
    (1..=255)
        .contains(&unit_count)
        .then(|| Location::fragment(PLACED_BLOCK, u32::from(unit_offset_byte), unit_count))
}

/// The blocks a location touches, `fragment` at its byte range (zero-padded
/// to its units) and `neighbour` bytes around it; the fragment's checksum.
fn placed(location: Location, fragment: &[u8], neighbour: u8) -> (Vec<u8>, u32) {
    let mut blocks = vec![neighbour; location.block_count() as usize * BLOCK_BYTES];
    let range = location.byte_range();
    blocks[range.clone()].fill(0);
    blocks[range.start..range.start + fragment.len()].copy_from_slice(fragment);
    let checksum = crc32c::crc32c(&blocks[range]);
    (blocks, checksum)
}

/// The payload behind a well-formed header of `codec_id` (1 lz4, 2 zstd).
fn with_header(codec_id: u16, inner_checksum: u32, stored: &[u8]) -> Vec<u8> {
    let stored = &stored[..stored.len().min(STORED_BYTES_MAX)];
    let length = u16::try_from(stored.len()).expect("at most STORED_BYTES_MAX");
    let mut fragment = Vec::with_capacity(FRAGMENT_HEADER_BYTES + stored.len());
    fragment.extend_from_slice(&(length | codec_id << 12).to_le_bytes());
    fragment.extend_from_slice(&inner_checksum.to_le_bytes());
    fragment.extend_from_slice(stored);
    fragment
}

/// Encodes the payload as a block and reads it back: it must be exact.
fn round_trip(decoder: &mut FragmentDecoder, selector: u8, unit_offset_byte: u8, payload: &[u8]) {
    let codec = match (selector >> 2) % 3 {
        0 => Codec::Lz4,
        1 => Codec::zstd(1).expect("level 1"),
        _ => Codec::zstd(3).expect("level 3"),
    };
    let mut block = [0; BLOCK_BYTES];
    let length = payload.len().min(BLOCK_BYTES);
    block[..length].copy_from_slice(&payload[..length]);
    let mut encoder = FragmentEncoder::new(codec).expect("a codec context");
    let EncodedBlock::Fragment(fragment) = encoder.encode(&block).expect("encode") else {
        return;
    };
    let location = Location::fragment(
        PLACED_BLOCK,
        u32::from(unit_offset_byte),
        fragment.unit_count(),
    );
    let (blocks, checksum) = placed(location, fragment.bytes(), selector);
    assert_eq!(checksum, fragment.checksum());
    let mut output = [0; BLOCK_BYTES];
    decoder
        .decode(location, &blocks, checksum, &mut output)
        .expect("an encoded block decodes");
    assert!(output == block, "{codec}: a round trip changed the block");
}

fuzz_target!(|data: &[u8]| {
    let Some((prefix, payload)) = data.split_first_chunk::<PREFIX_BYTES>() else {
        return;
    };
    let selector = prefix[0];
    let raw = u64::from_le_bytes(prefix[1..9].try_into().expect("8 bytes"));
    let checksum = u32::from_le_bytes(prefix[9..13].try_into().expect("4 bytes"));
    let unit_offset_byte = prefix[6];
    let mut decoder = FragmentDecoder::new().expect("a codec context");
    match selector % 4 {
        // The device's bytes as they are, against the given checksum.
        0 => {
            if let Ok(location) = Location::from_raw(raw) {
                assert_eq!(Location::from_raw(location.raw()), Ok(location));
                assert!(location.block_count() <= 2);
                decode(&mut decoder, location, payload, checksum);
            }
        }
        // The payload as a fragment, its checksum recomputed.
        1 => {
            if let Some(location) = fragment_location(unit_offset_byte, payload.len()) {
                let (blocks, checksum) = placed(location, payload, selector);
                decode(&mut decoder, location, &blocks, checksum);
            }
        }
        // The payload as a known codec's output behind a well-formed header.
        2 => {
            let codec_id = 1 + u16::from(selector >> 7);
            let fragment = with_header(codec_id, checksum, payload);
            if let Some(location) = fragment_location(unit_offset_byte, fragment.len()) {
                let (blocks, checksum) = placed(location, &fragment, 0);
                decode(&mut decoder, location, &blocks, checksum);
            }
        }
        _ => round_trip(&mut decoder, selector, unit_offset_byte, payload),
    }
});
