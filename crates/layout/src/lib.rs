//! Many devices as one: the layout of one tier over several devices. A
//! [`RedundantArray`] stripes blocks over its members with parity (raid6,
//! raid5), mirrors them, or stripes without parity, and presents the result
//! through the same [`lamina_device::BlockDevice`] trait as a single device,
//! so the engine's log, cleaner and tiering run on it unchanged. The engine's
//! part of the bargain is to start every write into the striped region at a
//! row boundary (see `array.rs`): the array then only ever writes whole rows
//! and never reads parity to update it.
//!
//! - `redundancy.rs`: the schemes; `geometry.rs`: where each block lives;
//! - `codec.rs`: parity (Reed-Solomon from `reed-solomon-simd`);
//! - `label.rs`: the label on each member; `assemble.rs`: create and assemble;
//! - `member.rs`: member state and counters;
//! - `array.rs`, `read.rs`, `write.rs`, `recover.rs`: the array itself;
//! - `replace.rs`: a replacement device and its rebuild.

mod array;
mod assemble;
mod codec;
mod geometry;
mod label;
mod member;
mod read;
mod recover;
mod redundancy;
mod replace;
mod write;

pub use array::{ArrayState, RedundantArray};
pub use assemble::{
    ArrayError, ArrayIdentity, ArrayLabelReadError, Assembled, ExcludedMember, MemberDevice,
    assemble, create, read_label,
};
pub use codec::{CodecError, ParityCodec};
pub use geometry::{ArrayGeometry, LABEL_AREA_BLOCKS};
pub use label::{LabelError, MemberLabel, TierRole};
pub use member::{MemberState, MemberStatus, ReplacementStatus};
pub use redundancy::{MEMBER_COUNT_MAX, Redundancy};
