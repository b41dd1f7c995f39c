//! The segment cleaner: reclaims the space of overwritten, trimmed and deleted
//! blocks. It picks victim segments by cost-benefit (free space gained, weighted
//! by how long the segment's data has stayed unchanged, over the cost of reading
//! and rewriting its live blocks), reads each victim in pieces with few of them
//! in flight, and moves every block that is still live to the cleaner's own log
//! head, apart from fresh client writes, so that cold data gathers in segments
//! that stay full. Client reads go before the cleaner's I/O as far as the engine
//! can arrange it: the cleaner keeps little of its own I/O in the device queue
//! (`PoolLimits::cleaner_read_bytes_max`, `cleaner_in_flight_reads_max`,
//! `cleaner_in_flight_batches_max`; docs/decisions/0009-cleaner-latency.md). A victim
//! whose live blocks are all moved is dead, and is freed once its relocations
//! are durable, or by the checkpoints that follow if it was written since the
//! older kept checkpoint (see `state::dead_segment_reusable`).
//!
//! Relocations go to one of several cleaner streams by how many cleanings the
//! data has survived (`placement`). The cleaner runs in the background, paced
//! by client writes and free space (`pacing`), and in the foreground, inside the
//! write that found the pool full, so that a full pool slows writers down
//! instead of failing them while space is reclaimable.
//!
//! The cleaner is a service (`Cleaner`, in `cleaning.rs`): built with an
//! `Arc` of the core, like the checkpointer, by the paced cleaner, the
//! demoter, evacuation, the flush-and-checkpoint loop, a writer that found
//! the pool full, and the front (`Pool::clean`).

mod cleaning;
pub(super) mod pacing;
pub mod victims;
pub use pacing::CleanerState;
pub(crate) use pacing::cleaner_state;
pub use victims::{VictimPolicy, pick_victims, pick_victims_in};
pub mod placement;

pub(in crate::pool) use cleaning::Cleaner;
pub(crate) use cleaning::next_victims_live_bytes;
pub use cleaning::{CLEAN_PASS_SEGMENTS_MAX, SegmentTable};
