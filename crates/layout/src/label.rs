//! The label every member device carries (at its block 0, with a copy at
//! block 32): which array and tier it belongs to, its index, the array's
//! shape, and the generation, so that an array assembles from its devices at
//! any paths in any order, and refuses a device of another array or a stale
//! member, naming it. See `docs/format.md`, "Member labels".

use serde::{Deserialize, Serialize};

use crate::geometry::{ArrayGeometry, BLOCK_BYTES};
use crate::redundancy::Redundancy;
use crate::stripe::full_set;

/// The label's magic: "LAMINAML" read as a little-endian u64.
pub const LABEL_MAGIC: u64 = u64::from_le_bytes(*b"LAMINAML");
/// The label format this build writes; it reads this and every earlier one.
/// Version 2 added `rebuilding_rows_done` (a replacement being rebuilt);
/// version 3 zones, the prefix's holders, removed and empty slots.
pub const LABEL_VERSION: u32 = 3;
/// Bytes of the label's frame header.
const HEADER_BYTES: usize = 24;

/// Which tier an array serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TierRole {
    Flash,
    Capacity,
}

impl TierRole {
    pub fn name(self) -> &'static str {
        match self {
            Self::Flash => "flash",
            Self::Capacity => "capacity",
        }
    }
}

/// One member's label.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberLabel {
    /// Shared by every member of every tier of one pool.
    pub array_identifier: u128,
    pub tier: TierRole,
    pub member_index: u32,
    pub member_count: u32,
    pub redundancy: Redundancy,
    pub prefix_blocks: u64,
    pub row_count: u64,
    /// Raised, on every member still in the array, each time a member leaves
    /// it (faulted): a member with an older generation missed writes.
    pub generation: u64,
    /// Members out of the array as of this generation.
    pub faulted_members: Vec<u32>,
    /// Where each member was last seen, for messages about missing ones.
    pub member_paths: Vec<String>,
    /// Set on a replacement device while it is rebuilt: it takes member
    /// `member_index`'s place once rebuilt, and holds every row below this
    /// one that the pool kept when its rebuild passed it (version 2).
    pub rebuilding_rows_done: Option<u64>,
    /// The zones and their member sets (version 3, arrays made with a
    /// segment size); `None`: one zone at the full set (version 2 layout).
    pub zones: Option<ZoneLabel>,
    /// Members holding a valid copy of the mirrored prefix.
    pub prefix_members: Vec<u32>,
    /// Members being removed: out of the write set, still read.
    pub removing_members: Vec<u32>,
    /// Slots whose member was removed and not yet filled (not missing).
    pub empty_members: Vec<u32>,
}

/// The zone part of a version 3 label (`docs/format.md`, "Zones").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZoneLabel {
    /// Rows per zone: the engine's segment size over the full set's data
    /// columns.
    pub zone_rows: u64,
    pub zone_count: u64,
    /// Blocks of one copy of the zone table.
    pub table_blocks: u64,
    /// Bitmasks of member indexes; 0 marks an unused index.
    pub member_sets: Vec<u64>,
}

/// A label as version 2 wrote it (no zones).
#[derive(Deserialize)]
struct MemberLabelVersion2 {
    array_identifier: u128,
    tier: TierRole,
    member_index: u32,
    member_count: u32,
    redundancy: Redundancy,
    prefix_blocks: u64,
    row_count: u64,
    generation: u64,
    faulted_members: Vec<u32>,
    member_paths: Vec<String>,
    rebuilding_rows_done: Option<u64>,
}

impl From<MemberLabelVersion2> for MemberLabel {
    fn from(old: MemberLabelVersion2) -> Self {
        let parity = old.redundancy.parity_columns(to_usize(old.member_count));
        Self {
            array_identifier: old.array_identifier,
            tier: old.tier,
            member_index: old.member_index,
            member_count: old.member_count,
            redundancy: old.redundancy,
            prefix_blocks: old.prefix_blocks,
            row_count: old.row_count,
            generation: old.generation,
            faulted_members: old.faulted_members,
            member_paths: old.member_paths,
            rebuilding_rows_done: old.rebuilding_rows_done,
            zones: None,
            prefix_members: initial_prefix_members(parity, old.member_count),
            removing_members: Vec::new(),
            empty_members: Vec::new(),
        }
    }
}

/// The prefix's holders at creation: the first `parity + 1` members.
pub(crate) fn initial_prefix_members(parity: usize, member_count: u32) -> Vec<u32> {
    let holders = u32::try_from(parity + 1).expect("parity fits in u32");
    (0..holders.min(member_count)).collect()
}

/// A label as version 1 wrote it (no rebuild state).
#[derive(Deserialize)]
struct MemberLabelVersion1 {
    array_identifier: u128,
    tier: TierRole,
    member_index: u32,
    member_count: u32,
    redundancy: Redundancy,
    prefix_blocks: u64,
    row_count: u64,
    generation: u64,
    faulted_members: Vec<u32>,
    member_paths: Vec<String>,
}

impl From<MemberLabelVersion1> for MemberLabel {
    fn from(old: MemberLabelVersion1) -> Self {
        MemberLabelVersion2 {
            array_identifier: old.array_identifier,
            tier: old.tier,
            member_index: old.member_index,
            member_count: old.member_count,
            redundancy: old.redundancy,
            prefix_blocks: old.prefix_blocks,
            row_count: old.row_count,
            generation: old.generation,
            faulted_members: old.faulted_members,
            member_paths: old.member_paths,
            rebuilding_rows_done: None,
        }
        .into()
    }
}

/// A label that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LabelError {
    #[error("no lamina member label")]
    NoLabel,
    #[error("member label version {found} is newer than this build's {supported}")]
    NewerVersion { found: u32, supported: u32 },
    #[error("member label fails its checksum")]
    Checksum,
    #[error("member label does not decode")]
    Undecodable,
}

impl MemberLabel {
    pub fn geometry(&self) -> ArrayGeometry {
        ArrayGeometry {
            redundancy: self.redundancy,
            member_count: to_usize(self.member_count),
            prefix_blocks: self.prefix_blocks,
            row_count: self.row_count,
            zone_rows: self
                .zones
                .as_ref()
                .map_or(self.row_count, |zones| zones.zone_rows),
            table_blocks: self.zones.as_ref().map_or(0, |zones| zones.table_blocks),
        }
    }

    /// The label as one block.
    pub fn encode(&self) -> Vec<u8> {
        let payload = postcard::to_stdvec(self).expect("a label serialises");
        assert!(
            HEADER_BYTES + payload.len() <= BLOCK_BYTES,
            "a label fits one block"
        );
        let mut block = vec![0_u8; BLOCK_BYTES];
        block[0..8].copy_from_slice(&LABEL_MAGIC.to_le_bytes());
        block[8..12].copy_from_slice(&LABEL_VERSION.to_le_bytes());
        let length = u32::try_from(payload.len()).expect("fits one block");
        block[12..16].copy_from_slice(&length.to_le_bytes());
        block[16..20].copy_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        let header_checksum = crc32c::crc32c(&block[0..20]);
        block[20..24].copy_from_slice(&header_checksum.to_le_bytes());
        block[HEADER_BYTES..HEADER_BYTES + payload.len()].copy_from_slice(&payload);
        // Checked in pairs: what is written must read back as itself.
        assert_eq!(Self::decode(&block).as_ref(), Ok(self));
        block
    }

    pub fn decode(block: &[u8]) -> Result<Self, LabelError> {
        let field = |range: std::ops::Range<usize>| -> u32 {
            u32::from_le_bytes(block[range].try_into().expect("four bytes"))
        };
        if block.len() < HEADER_BYTES
            || u64::from_le_bytes(block[0..8].try_into().expect("eight bytes")) != LABEL_MAGIC
        {
            return Err(LabelError::NoLabel);
        }
        if crc32c::crc32c(&block[0..20]) != field(20..24) {
            return Err(LabelError::Checksum);
        }
        let version = field(8..12);
        if version > LABEL_VERSION {
            return Err(LabelError::NewerVersion {
                found: version,
                supported: LABEL_VERSION,
            });
        }
        let length = to_usize(field(12..16));
        let payload = block
            .get(HEADER_BYTES..HEADER_BYTES + length)
            .ok_or(LabelError::Undecodable)?;
        if crc32c::crc32c(payload) != field(16..20) {
            return Err(LabelError::Checksum);
        }
        if version == 1 {
            return postcard::from_bytes::<MemberLabelVersion1>(payload)
                .map(MemberLabel::from)
                .map_err(|_| LabelError::Undecodable);
        }
        if version == 2 {
            return postcard::from_bytes::<MemberLabelVersion2>(payload)
                .map(MemberLabel::from)
                .map_err(|_| LabelError::Undecodable);
        }
        postcard::from_bytes(payload).map_err(|_| LabelError::Undecodable)
    }

    /// Whether this is a replacement's label, still being rebuilt.
    pub fn is_rebuilding(&self) -> bool {
        self.rebuilding_rows_done.is_some()
    }
}

fn to_usize(value: u32) -> usize {
    usize::try_from(value).expect("a u32 fits in a usize on the platforms lamina runs on")
}

/// The label's `zones` for a new array: one set, the full one.
/// The zones' label at creation: one set, the `present_count` members
/// given (the slots past them start empty).
pub(crate) fn initial_zone_label(
    geometry: &crate::geometry::ArrayGeometry,
    present_count: usize,
) -> Option<ZoneLabel> {
    assert!(present_count <= geometry.member_count);
    geometry.is_zoned().then(|| ZoneLabel {
        zone_rows: geometry.zone_rows,
        zone_count: geometry.zone_count(),
        table_blocks: geometry.table_blocks,
        member_sets: vec![full_set(present_count)],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn a_label() -> MemberLabel {
        MemberLabel {
            array_identifier: 0x1234,
            tier: TierRole::Flash,
            member_index: 2,
            member_count: 6,
            redundancy: Redundancy::Raid6,
            prefix_blocks: 1024,
            row_count: 5000,
            generation: 3,
            faulted_members: vec![4],
            member_paths: (0..6).map(|index| format!("/dev/f{index}")).collect(),
            rebuilding_rows_done: None,
            zones: None,
            prefix_members: vec![0, 1, 2],
            removing_members: Vec::new(),
            empty_members: Vec::new(),
        }
    }

    #[test]
    fn a_zoned_label_round_trips() {
        let mut label = a_label();
        label.zones = Some(ZoneLabel {
            zone_rows: 256,
            zone_count: 19,
            table_blocks: 1,
            member_sets: vec![0b11_1111, 0b10_1111],
        });
        label.prefix_members = vec![0, 1, 3];
        label.removing_members = vec![5];
        assert_eq!(MemberLabel::decode(&label.encode()), Ok(label));
    }

    #[test]
    fn a_version_1_label_reads_as_not_rebuilding() {
        #[derive(Serialize)]
        struct Version1<'a> {
            array_identifier: u128,
            tier: TierRole,
            member_index: u32,
            member_count: u32,
            redundancy: Redundancy,
            prefix_blocks: u64,
            row_count: u64,
            generation: u64,
            faulted_members: &'a [u32],
            member_paths: &'a [String],
        }
        let label = a_label();
        let payload = postcard::to_stdvec(&Version1 {
            array_identifier: label.array_identifier,
            tier: label.tier,
            member_index: label.member_index,
            member_count: label.member_count,
            redundancy: label.redundancy,
            prefix_blocks: label.prefix_blocks,
            row_count: label.row_count,
            generation: label.generation,
            faulted_members: &label.faulted_members,
            member_paths: &label.member_paths,
        })
        .unwrap();
        let mut block = label.encode();
        block[8..12].copy_from_slice(&1_u32.to_le_bytes());
        let length = u32::try_from(payload.len()).unwrap();
        block[12..16].copy_from_slice(&length.to_le_bytes());
        block[16..20].copy_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
        let header_checksum = crc32c::crc32c(&block[0..20]);
        block[20..24].copy_from_slice(&header_checksum.to_le_bytes());
        block[HEADER_BYTES..].fill(0);
        block[HEADER_BYTES..HEADER_BYTES + payload.len()].copy_from_slice(&payload);
        assert_eq!(MemberLabel::decode(&block), Ok(label));
    }

    #[test]
    fn a_label_round_trips_and_damage_is_named() {
        let label = a_label();
        let mut block = label.encode();
        assert_eq!(MemberLabel::decode(&block), Ok(label));
        block[40] ^= 1;
        assert_eq!(MemberLabel::decode(&block), Err(LabelError::Checksum));
        assert_eq!(MemberLabel::decode(&[0_u8; 4096]), Err(LabelError::NoLabel));
    }

    #[test]
    fn random_bytes_never_decode_as_a_label() {
        use rand::{Rng, SeedableRng};
        let mut random = rand::rngs::SmallRng::seed_from_u64(9);
        let mut block = a_label().encode();
        for _ in 0..2000 {
            let position = random.random_range(0..200);
            block[position] = random.random();
            let _ = MemberLabel::decode(&block);
        }
    }
}
