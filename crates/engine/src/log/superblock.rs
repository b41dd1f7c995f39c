//! The superblock: block 0 of a pool, written once at creation. It says that the
//! device is a lamina pool, which format version wrote it, and its geometry.

use serde::{Deserialize, Serialize};

use super::frame;
use super::geometry::Geometry;
use crate::BLOCK_SIZE_BYTES;

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
        frame::encode(
            SUPERBLOCK_MAGIC,
            super::FORMAT_VERSION,
            self,
            BLOCK_SIZE_BYTES as usize,
        )
    }

    /// The superblock and the format version it was written with.
    pub fn decode(bytes: &[u8]) -> Result<(u32, Self), frame::FrameError> {
        frame::decode(SUPERBLOCK_MAGIC, super::FORMAT_VERSION, bytes)
    }
}
