//! The log layer: everything that gives bytes on the device their meaning. Data
//! is only ever appended, in batches inside segments; the maps are persisted by
//! checkpoints in two alternating slots; recovery loads the newest valid
//! checkpoint and replays every newer batch. See `docs/format.md`.

pub mod batch;
pub mod checkpoint;
pub mod frame;
pub mod geometry;
pub mod superblock;

/// The on-disk format version this build writes and the only one it reads.
/// Version 2 added snapshots and clones (records, checkpoint chunk table);
/// version 1 pools came from development builds and must be recreated.
pub const FORMAT_VERSION: u32 = 2;
