//! Many devices as one: the layout of one tier over several devices. A
//! [`RedundantArray`] stripes blocks over its members with parity (raid6,
//! raid5), mirrors them, or stripes without parity, and presents the result
//! through the same [`lamina_device::BlockDevice`] trait as a single device,
//! so the engine's log, cleaner and tiering run on it unchanged. The engine's
//! part of the bargain is to start every write into the striped region at a
//! row boundary (see `array.rs`): the array then only ever writes whole rows
//! and never reads parity to update it.
//!
//! - `redundancy.rs`: the schemes; `geometry.rs`: where each member area
//!   and row lives; `stripe.rs`: a zone's rows over its member set;
//! - `codec.rs`: parity (Reed-Solomon from `reed-solomon-erasure`);
//! - `label.rs`: the label on each member; `assemble.rs`: create and assemble;
//! - `zones.rs`: the zone table (each zone's member set), on disk and in memory;
//! - `member.rs`: member state and counters;
//! - `array.rs`, `read.rs`, `write.rs`, `recover.rs`: the array itself;
//! - `membership.rs`: the write set, `open_region`, member removal and
//!   addition, the prefix's copies after a loss;
//! - `replace.rs`: a replacement device and its rebuild;
//! - `row_locks.rs`: writes and repairs of the same rows kept apart;
//! - `scrub.rs`: every column of every held row checked, parity included.

mod array;
mod assemble;
mod codec;
mod geometry;
mod label;
mod member;
mod membership;
mod read;
mod recover;
mod recover_range;
mod redundancy;
mod replace;
mod row_locks;
mod scrub;
mod stripe;
mod write;
mod zones;

pub use array::{ArrayState, RedundantArray};
pub use assemble::{
    ArrayError, ArrayIdentity, ArrayLabelReadError, Assembled, ExcludedMember, MemberDevice,
    ZonedArrayRequest, assemble, create, create_zoned, create_zoned_with_slots, read_label,
};
pub use codec::{CodecError, ParityCodec};
pub use geometry::ZONE_TABLE_ENTRIES_PER_BLOCK;
pub use geometry::{ArrayGeometry, LABEL_AREA_BLOCKS};
pub use label::{LabelError, MemberLabel, TierRole, ZoneLabel};
pub use member::{MemberState, MemberStatus, ReplacementStatus};
pub use membership::WriteSet;
pub use recover_range::RECOVER_RANGE_BLOCKS_MAX;
pub use redundancy::{MEMBER_COUNT_MAX, Redundancy};
pub use scrub::{SCRUB_FAULT_FAILED_PERCENT, SCRUB_FAULT_WINDOW_ROWS, SCRUB_ROWS_PER_STEP};
pub use zones::MEMBER_SETS_MAX;
