//! The log layer: everything that gives bytes on the device their meaning. Data
//! is only ever appended, in batches inside segments; the maps are persisted by
//! checkpoints in two alternating slots; recovery loads the newest valid
//! checkpoint and replays every newer batch. See `docs/format.md`.

pub mod batch;
pub mod checkpoint;
pub mod frame;
pub mod geometry;
pub mod superblock;

/// The on-disk format version this build writes and the newest it can read.
pub const FORMAT_VERSION: u32 = 1;
