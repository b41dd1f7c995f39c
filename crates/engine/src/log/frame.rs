//! The frame every on-disk metadata structure is wrapped in: a magic naming the
//! structure, the format version, the payload's length and crc32c, and a crc32c of
//! the frame header itself. Checking both checksums before trusting a byte is what
//! turns a torn or rotted block into a clean "corrupt" answer instead of garbage.
//!
//! Layout (little-endian): magic u64 | version u32 | payload length u32 |
//! payload crc32c u32 | header crc32c u32 (over the 20 bytes before it) | payload.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Bytes before the payload.
pub const FRAME_HEADER_BYTES: usize = 24;

/// Why a frame failed to decode.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("wrong magic (not this structure)")]
    WrongMagic,
    #[error("format version {0} is newer than supported")]
    NewerVersion(u32),
    #[error("header checksum mismatch")]
    HeaderChecksum,
    #[error("payload length {0} exceeds the area")]
    PayloadTooLong(u64),
    #[error("payload checksum mismatch")]
    PayloadChecksum,
    #[error("payload does not decode: {0}")]
    Decode(String),
}

/// Encodes `payload` in a frame, zero-padded to a multiple of `pad_to_bytes`.
pub fn encode<T: Serialize>(magic: u64, version: u32, payload: &T, pad_to_bytes: usize) -> Vec<u8> {
    let body = postcard::to_allocvec(payload).expect("postcard encoding into a Vec cannot fail");
    let mut bytes =
        Vec::with_capacity((FRAME_HEADER_BYTES + body.len()).next_multiple_of(pad_to_bytes));
    bytes.extend_from_slice(&magic.to_le_bytes());
    bytes.extend_from_slice(&version.to_le_bytes());
    bytes.extend_from_slice(
        &u32::try_from(body.len())
            .expect("frame payload under 4 GiB")
            .to_le_bytes(),
    );
    bytes.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    let header_checksum = crc32c::crc32c(&bytes[..20]);
    bytes.extend_from_slice(&header_checksum.to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes.resize(bytes.len().next_multiple_of(pad_to_bytes), 0);
    bytes
}

/// The version and payload length of a frame header, after checking its magic and
/// checksum, so that a caller can read the rest of a long frame.
pub fn peek_header(magic: u64, bytes: &[u8]) -> Result<(u32, usize), FrameError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::PayloadTooLong(bytes.len() as u64));
    }
    let field = |start: usize| -> u32 {
        u32::from_le_bytes(bytes[start..start + 4].try_into().expect("four bytes"))
    };
    let stored_magic = u64::from_le_bytes(bytes[0..8].try_into().expect("eight bytes"));
    if stored_magic != magic {
        return Err(FrameError::WrongMagic);
    }
    if field(20) != crc32c::crc32c(&bytes[..20]) {
        return Err(FrameError::HeaderChecksum);
    }
    let length = field(12);
    let length =
        usize::try_from(length).map_err(|_| FrameError::PayloadTooLong(u64::from(length)))?;
    Ok((field(8), length))
}

/// Decodes a frame, checking magic, header checksum, version, length and payload
/// checksum in that order.
pub fn decode<T: DeserializeOwned>(
    magic: u64,
    supported_version: u32,
    bytes: &[u8],
) -> Result<(u32, T), FrameError> {
    let (version, length) = peek_header(magic, bytes)?;
    if version > supported_version {
        return Err(FrameError::NewerVersion(version));
    }
    let body = checked_payload(bytes, length)?;
    let value =
        postcard::from_bytes(body).map_err(|error| FrameError::Decode(error.to_string()))?;
    Ok((version, value))
}

/// The payload of `length` bytes after the header checked by
/// [`peek_header`], once it is within `bytes` and matches its checksum.
fn checked_payload(bytes: &[u8], length: usize) -> Result<&[u8], FrameError> {
    let end = FRAME_HEADER_BYTES
        .checked_add(length)
        .filter(|end| *end <= bytes.len())
        .ok_or(FrameError::PayloadTooLong(length as u64))?;
    let body = &bytes[FRAME_HEADER_BYTES..end];
    let checksum = u32::from_le_bytes(bytes[16..20].try_into().expect("four bytes"));
    if crc32c::crc32c(body) != checksum {
        return Err(FrameError::PayloadChecksum);
    }
    Ok(body)
}

/// Whether `bytes` starts with a whole frame of `magic`, of any version:
/// magic, header and payload checksums pass (scrub compares the copies of
/// a frame without decoding it).
pub fn is_whole(magic: u64, bytes: &[u8]) -> bool {
    peek_header(magic, bytes)
        .and_then(|(_, length)| checked_payload(bytes, length))
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_whole_only_with_its_magic_and_both_checksums() {
        let bytes = encode(0xABCD, 9, &(1_u64, 2_u64), 4096);
        assert!(is_whole(0xABCD, &bytes));
        assert!(!is_whole(0xABCE, &bytes));
        let mut flipped = bytes.clone();
        flipped[FRAME_HEADER_BYTES] ^= 1;
        assert!(!is_whole(0xABCD, &flipped));
        assert!(!is_whole(0xABCD, &vec![0; 4096]));
    }

    #[test]
    fn round_trip_and_every_single_bit_flip_is_caught() {
        let payload = (7u64, String::from("volume"), vec![1u32, 2, 3]);
        let bytes = encode(0xABCD, 1, &payload, 64);
        assert_eq!(bytes.len() % 64, 0);
        let (version, decoded): (u32, (u64, String, Vec<u32>)) = decode(0xABCD, 1, &bytes).unwrap();
        assert_eq!((version, &decoded), (1, &payload));
        let used =
            FRAME_HEADER_BYTES + u32::from_le_bytes(bytes[12..16].try_into().unwrap()) as usize;
        for bit in 0..used * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode::<(u64, String, Vec<u32>)>(0xABCD, 1, &flipped).is_err(),
                "bit {bit}"
            );
        }
        assert_eq!(
            decode::<u8>(0x1111, 1, &bytes).unwrap_err(),
            FrameError::WrongMagic
        );
        let newer = encode(0xABCD, 2, &payload, 64);
        assert_eq!(
            decode::<u8>(0xABCD, 1, &newer).unwrap_err(),
            FrameError::NewerVersion(2)
        );
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
        for _ in 0..20_000 {
            let length = rng.random_range(0..200);
            let mut bytes: Vec<u8> = (0..length).map(|_| rng.random()).collect();
            if bytes.len() >= 24 && rng.random_bool(0.5) {
                bytes[..8].copy_from_slice(&0xABCDu64.to_le_bytes());
                let checksum = crc32c::crc32c(&bytes[..20]);
                bytes[20..24].copy_from_slice(&checksum.to_le_bytes());
            }
            let _ = decode::<(u64, String, Vec<u32>)>(0xABCD, 1, &bytes);
        }
    }
}
