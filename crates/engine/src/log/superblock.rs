//! The superblock: block 0 of a pool, written once at creation. It says that the
//! device is a lamina pool, which format version wrote it, and its geometry.

use serde::{Deserialize, Serialize};

use super::frame;
use super::geometry::{Geometry, GeometryVersion2, GeometryVersion5};
use crate::BLOCK_BYTES;

/// "LAMINASB" in ASCII, read as a little-endian u64.
pub const SUPERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"LAMINASB");

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Superblock {
    pub pool_identifier: u128,
    pub geometry: Geometry,
    pub created_unix_seconds: u64,
}

impl Superblock {
    pub fn encode(&self) -> Vec<u8> {
        frame::encode(SUPERBLOCK_MAGIC, super::FORMAT_VERSION, self, BLOCK_BYTES)
    }

    /// The superblock and the format version it was written with.
    pub fn decode(bytes: &[u8]) -> Result<(u32, Self), frame::FrameError> {
        let (version, _) = frame::peek_header(SUPERBLOCK_MAGIC, bytes)?;
        if version == 2 {
            let (version, old): (u32, SuperblockVersion2) =
                frame::decode(SUPERBLOCK_MAGIC, super::FORMAT_VERSION, bytes)?;
            return Ok((
                version,
                Self {
                    pool_identifier: old.pool_identifier,
                    geometry: old.geometry.into(),
                    created_unix_seconds: old.created_unix_seconds,
                },
            ));
        }
        if version < ROW_ALIGNMENT_VERSION {
            let (version, old): (u32, SuperblockVersion5) =
                frame::decode(SUPERBLOCK_MAGIC, super::FORMAT_VERSION, bytes)?;
            return Ok((
                version,
                Self {
                    pool_identifier: old.pool_identifier,
                    geometry: old.geometry.into(),
                    created_unix_seconds: old.created_unix_seconds,
                },
            ));
        }
        frame::decode(SUPERBLOCK_MAGIC, super::FORMAT_VERSION, bytes)
    }
}

/// The first format version whose geometry has row alignments.
pub const ROW_ALIGNMENT_VERSION: u32 = 6;

/// The superblock as format versions 3 to 5 wrote it (no row alignment).
#[derive(Deserialize)]
struct SuperblockVersion5 {
    pool_identifier: u128,
    geometry: GeometryVersion5,
    created_unix_seconds: u64,
}

/// The superblock as format version 2 wrote it (one tier).
#[derive(Deserialize)]
struct SuperblockVersion2 {
    pool_identifier: u128,
    geometry: GeometryVersion2,
    created_unix_seconds: u64,
}
