//! The log layer: everything that gives bytes on the device their meaning. Data
//! is only ever appended, in batches inside segments; the maps are persisted by
//! checkpoints in two alternating slots; recovery loads the newest valid
//! checkpoint and replays every newer batch. See `docs/format.md`.

pub mod batch;
pub mod chain;
pub mod checkpoint;
pub mod data_layout;
pub mod fragment;
pub mod frame;
pub mod geometry;
pub mod location;
pub mod marker;
pub mod openings;
pub mod superblock;

/// The on-disk format version this build writes. Version 10 adds packed
/// extents (decision 0070): 64-bit locations, fragments in a batch's packed
/// area, records 12 to 14 (a volume's codec among them) and the checkpoints'
/// codec table; older bodies read with every volume's codec `Off`. Version 9 copies every
/// checkpoint slot onto the capacity device of a two-tier pool, so that a
/// lost flash device can be restored from the capacity tier alone. Version 8 adds the segment
/// openings record (`openings`), so that recovery reads only the segments
/// the log can have reached since the checkpoint. Version 7 adds incremental
/// checkpoints (increment bodies; slots naming their chain). Version 6 adds row alignment to the geometry (batches on a striped tier
/// start at row boundaries; 1 elsewhere). Version 5 writes every batch's
/// summary twice (first and last block of the batch, `chain`), and adds the
/// superblock's copy and the flush markers (blocks before the checkpoint
/// slots, which older versions left zero). Version 4 added the write
/// counters to checkpoint bodies (earlier bodies read as zero). Version 3 added the capacity
/// tier (geometry), per-volume tier policies (a record and a checkpoint table);
/// version 2 pools are read as they are (one tier, default policies) and
/// written as version 3 from then on. Version 2 added snapshots and clones;
/// version 1 pools came from development builds and must be recreated.
pub const FORMAT_VERSION: u32 = 10;

/// The oldest format version this build reads.
pub const FORMAT_VERSION_READ_MIN: u32 = 2;
