//! Making an array from devices (`create`: labels written) and putting one
//! together again from its labelled devices at any paths, in any order
//! (`assemble`): each device's label says which member it is; a device of
//! another pool or another tier is refused, naming it; a stale member (an
//! older generation, or one the others list as faulted) is left out, named;
//! a member shorter than the array needs (a truncated file) is faulted,
//! named with its size, and counted against the parity like a missing one;
//! and with more members missing than the parity covers, assembling refuses,
//! naming the missing members where they were last seen.

use std::collections::BTreeMap;
use std::sync::Arc;

use lamina_device::{BlockDevice, DeviceError};

use crate::array::{RedundantArray, write_label};
use crate::geometry::{
    ArrayGeometry, BLOCK_BYTES, BLOCK_SIZE_BYTES, LABEL_BLOCK, LABEL_COPY_BLOCK,
};
use crate::label::{LabelError, MemberLabel, TierRole};
use crate::member::Member;
use crate::redundancy::{MEMBER_COUNT_MAX, Redundancy};

/// A device offered as a member, with the path it was found at.
#[derive(Clone)]
pub struct MemberDevice {
    pub path: String,
    pub device: Arc<dyn BlockDevice>,
}

/// What an array is part of.
#[derive(Clone, Copy, Debug)]
pub struct ArrayIdentity {
    /// Shared by the arrays of every tier of one pool.
    pub array_identifier: u128,
    pub tier: TierRole,
}

/// Why an array cannot be made or put together.
#[derive(Debug, thiserror::Error)]
pub enum ArrayError {
    #[error("a segment of {segment_blocks} blocks is not whole rows of {row_blocks} data blocks")]
    SegmentNotWholeRows {
        segment_blocks: u64,
        row_blocks: u64,
    },
    #[error(
        "the {tier} tier's zone table cannot be read: no member holds a valid copy of every block"
    )]
    ZoneTableUnreadable { tier: &'static str },
    #[error(
        "no member holding the {tier} tier's mirrored prefix is present (holders: {})",
        holders.join(", ")
    )]
    NoPrefixCopy {
        tier: &'static str,
        holders: Vec<String>,
    },
    #[error("{redundancy} needs at least {needed} devices, {given} given")]
    TooFewMembers {
        redundancy: Redundancy,
        needed: usize,
        given: usize,
    },
    #[error("at most {MEMBER_COUNT_MAX} devices per tier, {given} given")]
    TooManyMembers { given: usize },
    #[error("device {path} is too small: {size_bytes} bytes, at least {needed_bytes} needed")]
    TooSmall {
        path: String,
        size_bytes: u64,
        needed_bytes: u64,
    },
    #[error(
        "device {path} belongs to another pool (array {found:032x}, this pool's is {expected:032x})"
    )]
    ForeignMember {
        path: String,
        found: u128,
        expected: u128,
    },
    #[error("device {path} is a {found} device, not a {expected} one")]
    WrongTier {
        path: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error("devices {path} and {other} both claim to be {tier} member {index}")]
    DuplicateMember {
        path: String,
        other: String,
        tier: &'static str,
        index: u32,
    },
    #[error(
        "device {path}'s label describes another array shape than the rest of the {tier} tier's"
    )]
    InconsistentShape { path: String, tier: &'static str },
    #[error(
        "the {tier} tier ({redundancy} over {member_count} devices) survives the loss of {parity}, but {} are missing: {}",
        missing.len(),
        missing.join(", ")
    )]
    TooManyMissing {
        tier: &'static str,
        redundancy: Redundancy,
        member_count: usize,
        parity: usize,
        missing: Vec<String>,
    },
    #[error(
        "no device of the {tier} tier has a readable member label: {}",
        unreadable.join("; ")
    )]
    NoLabelledMember {
        tier: &'static str,
        unreadable: Vec<String>,
    },
    #[error(
        "a device of the {tier} tier is already being replaced; wait for its rebuild to finish"
    )]
    ReplacementInProgress { tier: &'static str },
    #[error("{path} is not a member of the {array}")]
    NotAMember { path: String, array: String },
    #[error("{path} is already a member of this array")]
    AlreadyAMember { path: String },
    #[error(
        "{path} carries a lamina member label (array {array_identifier:032x}); use a blank device"
    )]
    LabelledDevice {
        path: String,
        array_identifier: u128,
    },
    #[error(
        "the {array} has no zones (made before version 3 labels, or without a segment size): {operation} needs zones"
    )]
    NotZoned {
        array: String,
        operation: &'static str,
    },
    #[error(
        "the {array} already lists {limit} member sets, all used by zones; reopen zones of old sets first (moving their data)"
    )]
    TooManyMemberSets { array: String, limit: usize },
    #[error(
        "member {index} of the {array} cannot be removed: {remaining} members would remain, {redundancy} needs {needed}"
    )]
    RemovalTooNarrow {
        array: String,
        index: usize,
        remaining: usize,
        redundancy: Redundancy,
        needed: usize,
    },
    #[error("member {index} of the {array} is {state}: {operation} needs {needed}")]
    WrongMemberState {
        array: String,
        index: usize,
        state: String,
        operation: &'static str,
        needed: &'static str,
    },
    #[error(
        "member {index} of the {array} is still part of {zones} zones' member sets; move their data out first"
    )]
    MemberStillInZones {
        array: String,
        index: usize,
        zones: u64,
    },
    #[error(
        "the {array} has no empty slot for {path}: its {slots} slots are all in use (slots are fixed when the pool is created: leave room with --flash-slots or --capacity-slots)"
    )]
    NoEmptySlot {
        array: String,
        path: String,
        slots: usize,
    },
    #[error(
        "{slot_count} slots for {member_count} devices: give at least as many slots as devices, at most {slot_count_max}"
    )]
    BadSlotCount {
        slot_count: usize,
        member_count: usize,
        slot_count_max: usize,
    },
    #[error(
        "a {redundancy} array cannot leave slots empty to grow into: only raid5 and raid6 widen (a wider mirror is more copies, not more room)"
    )]
    SlotsNeedParity { redundancy: Redundancy },
    #[error("member index {index} is beyond the {array}'s {slots} slots")]
    NoSuchMember {
        array: String,
        index: usize,
        slots: usize,
    },
    #[error(
        "the {array} keeps its prefix's copies on {holders:?}; no other usable member can take one"
    )]
    NoMemberForPrefix { array: String, holders: Vec<usize> },
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// A member left out when the array was assembled, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExcludedMember {
    pub path: String,
    pub reason: String,
}

/// An assembled array and what was left out.
pub struct Assembled {
    pub array: RedundantArray,
    pub excluded: Vec<ExcludedMember>,
}

impl std::fmt::Debug for Assembled {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Assembled")
            .field("excluded", &self.excluded)
            .finish_non_exhaustive()
    }
}

/// Writes labels to `members` (in member order) and returns the new array,
/// without zones: every row over every member, as version 2 labels made
/// them (no narrowing after a loss, no removal or addition). Members of
/// different sizes are used up to the smallest one's size.
pub async fn create(
    identity: ArrayIdentity,
    redundancy: Redundancy,
    prefix_blocks: u64,
    members: Vec<MemberDevice>,
) -> Result<RedundantArray, ArrayError> {
    check_member_count(redundancy, members.len())?;
    let smallest = smallest(&members);
    let geometry = ArrayGeometry::for_members(
        redundancy,
        members.len(),
        prefix_blocks,
        smallest.device.size_bytes(),
    )
    .ok_or_else(|| too_small(smallest, prefix_blocks + 1))?;
    create_with(identity, geometry, members).await
}

/// [`create`] with zones (label version 3): the striped region is cut into
/// zones of `segment_blocks / data columns` rows, one per engine segment of
/// `segment_blocks` blocks (a multiple of the full set's data columns), each
/// with its own member set, so that zones opened after a loss are striped
/// over the survivors, and members can be removed and added.
pub async fn create_zoned(
    identity: ArrayIdentity,
    redundancy: Redundancy,
    prefix_blocks: u64,
    segment_blocks: u64,
    members: Vec<MemberDevice>,
) -> Result<RedundantArray, ArrayError> {
    let slot_count = members.len();
    let request = ZonedArrayRequest {
        redundancy,
        prefix_blocks,
        segment_blocks,
        slot_count,
    };
    create_zoned_with_slots(identity, request, members).await
}

/// The shape of a zoned array to create.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZonedArrayRequest {
    pub redundancy: Redundancy,
    pub prefix_blocks: u64,
    /// The engine's segment size in blocks: one zone's address range, a
    /// multiple of the data columns of all `slot_count` slots.
    pub segment_blocks: u64,
    /// Member slots, at least as many as the devices given: the slots past
    /// them start empty, and `device add` fills them later, widening the
    /// array. Every zone's address range is sized for all the slots, so a
    /// zone striped over fewer members (all of them at first) holds that
    /// fraction of its range: the headroom costs address space, not bytes.
    pub slot_count: usize,
}

/// [`create_zoned`] with room to grow: `request.slot_count` slots of which
/// the first `members.len()` are filled (see [`ZonedArrayRequest`]). Only
/// parity redundancies (raid5, raid6) have slots to spare: a wider mirror
/// is more copies, not more room.
pub async fn create_zoned_with_slots(
    identity: ArrayIdentity,
    request: ZonedArrayRequest,
    members: Vec<MemberDevice>,
) -> Result<RedundantArray, ArrayError> {
    let ZonedArrayRequest {
        redundancy,
        prefix_blocks,
        segment_blocks,
        slot_count,
    } = request;
    check_member_count(redundancy, members.len())?;
    check_slot_count(redundancy, members.len(), slot_count)?;
    let data_columns = redundancy.data_columns(slot_count) as u64;
    if segment_blocks == 0 || !segment_blocks.is_multiple_of(data_columns) {
        return Err(ArrayError::SegmentNotWholeRows {
            segment_blocks,
            row_blocks: data_columns,
        });
    }
    let smallest = smallest(&members);
    let zone_rows = segment_blocks / data_columns;
    let geometry = ArrayGeometry::for_members_zoned(
        redundancy,
        slot_count,
        prefix_blocks,
        smallest.device.size_bytes(),
        zone_rows,
    )
    .ok_or_else(|| too_small(smallest, prefix_blocks + 2 + zone_rows))?;
    create_with(identity, geometry, members).await
}

fn check_slot_count(
    redundancy: Redundancy,
    member_count: usize,
    slot_count: usize,
) -> Result<(), ArrayError> {
    if slot_count < member_count || slot_count > MEMBER_COUNT_MAX {
        return Err(ArrayError::BadSlotCount {
            slot_count,
            member_count,
            slot_count_max: MEMBER_COUNT_MAX,
        });
    }
    let parity_code = matches!(redundancy, Redundancy::Raid5 | Redundancy::Raid6);
    if slot_count > member_count && !parity_code {
        return Err(ArrayError::SlotsNeedParity { redundancy });
    }
    Ok(())
}

fn smallest(members: &[MemberDevice]) -> &MemberDevice {
    members
        .iter()
        .min_by_key(|member| member.device.size_bytes())
        .expect("at least one member")
}

fn too_small(member: &MemberDevice, blocks_after_labels: u64) -> ArrayError {
    ArrayError::TooSmall {
        path: member.path.clone(),
        size_bytes: member.device.size_bytes(),
        needed_bytes: (crate::geometry::LABEL_AREA_BLOCKS + blocks_after_labels) * BLOCK_SIZE_BYTES,
    }
}

/// Labels `members` for `geometry` (after writing the zone table, so that a
/// labelled member always has one) and returns the array.
async fn create_with(
    identity: ArrayIdentity,
    geometry: ArrayGeometry,
    members: Vec<MemberDevice>,
) -> Result<RedundantArray, ArrayError> {
    let redundancy = geometry.redundancy;
    let prefix_blocks = geometry.prefix_blocks;
    let present_count = members.len();
    let present = u32::try_from(present_count).expect("checked above");
    let slots = u32::try_from(geometry.member_count).expect("checked above");
    let label = MemberLabel {
        array_identifier: identity.array_identifier,
        tier: identity.tier,
        member_index: 0,
        member_count: slots,
        redundancy,
        prefix_blocks,
        row_count: geometry.row_count,
        generation: 1,
        faulted_members: Vec::new(),
        member_paths: members
            .iter()
            .map(|member| member.path.clone())
            .chain((present_count..geometry.member_count).map(|_| String::new()))
            .collect(),
        rebuilding_rows_done: None,
        zones: crate::label::initial_zone_label(&geometry, present_count),
        prefix_members: crate::label::initial_prefix_members(geometry.parity_columns(), present),
        removing_members: Vec::new(),
        empty_members: (present..slots).collect(),
    };
    let devices: Vec<Arc<dyn BlockDevice>> =
        members.iter().map(|member| member.device.clone()).collect();
    let members = members
        .into_iter()
        .enumerate()
        .map(|(index, member)| Member::present(index, member.path, member.device))
        .chain((present_count..geometry.member_count).map(Member::empty))
        .collect();
    let array = RedundantArray::new(geometry, members, label.clone());
    for (index, device) in devices.iter().enumerate() {
        array.write_whole_table(device.as_ref()).await?;
        let mut own = label.clone();
        own.member_index = u32::try_from(index).expect("checked above");
        write_label(device.as_ref(), &own).await?;
    }
    Ok(array)
}

fn check_member_count(redundancy: Redundancy, given: usize) -> Result<(), ArrayError> {
    if given < redundancy.member_count_min() {
        return Err(ArrayError::TooFewMembers {
            redundancy,
            needed: redundancy.member_count_min(),
            given,
        });
    }
    if given > MEMBER_COUNT_MAX {
        return Err(ArrayError::TooManyMembers { given });
    }
    Ok(())
}

/// A device's member label: block 0, or its copy when block 0 is damaged.
pub async fn read_label(device: &dyn BlockDevice) -> Result<MemberLabel, ArrayLabelReadError> {
    let first = device
        .read(LABEL_BLOCK * BLOCK_SIZE_BYTES, BLOCK_BYTES)
        .await?;
    match MemberLabel::decode(&first) {
        Ok(label) => Ok(label),
        Err(LabelError::Checksum | LabelError::Undecodable) => {
            let copy = device
                .read(LABEL_COPY_BLOCK * BLOCK_SIZE_BYTES, BLOCK_BYTES)
                .await?;
            Ok(MemberLabel::decode(&copy)?)
        }
        Err(error) => Err(error.into()),
    }
}

/// Why a label could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ArrayLabelReadError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Label(#[from] LabelError),
}

/// A candidate with its label read.
struct Labelled {
    member: MemberDevice,
    label: MemberLabel,
}

/// Puts the `tier` array together from `candidates` (any order).
pub async fn assemble(
    tier: TierRole,
    candidates: Vec<MemberDevice>,
) -> Result<Assembled, ArrayError> {
    let mut labelled = Vec::new();
    let mut unreadable = Vec::new();
    for member in candidates {
        let label = match read_label(member.device.as_ref()).await {
            Ok(label) => label,
            Err(error) => {
                // A member whose label cannot be read (failing, or overwritten)
                // is as good as missing: left out, named, and the array
                // assembles if the others suffice.
                tracing::error!(path = %member.path, %error, "array member left out: its label cannot be read");
                unreadable.push(ExcludedMember {
                    reason: format!("its label cannot be read: {error}"),
                    path: member.path,
                });
                continue;
            }
        };
        if label.tier != tier {
            return Err(ArrayError::WrongTier {
                path: member.path,
                found: label.tier.name(),
                expected: tier.name(),
            });
        }
        labelled.push(Labelled { member, label });
    }
    // The array most devices belong to is the one being assembled (a device
    // of another pool among them is the odd one out), at its newest label.
    let members_of = |identifier: u128| {
        labelled
            .iter()
            .filter(|candidate| candidate.label.array_identifier == identifier)
            .count()
    };
    let reference = labelled
        .iter()
        .max_by_key(|candidate| {
            (
                members_of(candidate.label.array_identifier),
                candidate.label.generation,
                !candidate.label.is_rebuilding(),
            )
        })
        .map(|candidate| MemberLabel {
            // A replacement's own rebuild state is not the array's.
            rebuilding_rows_done: None,
            ..candidate.label.clone()
        })
        .ok_or_else(|| ArrayError::NoLabelledMember {
            tier: tier.name(),
            unreadable: unreadable
                .iter()
                .map(|member| format!("{}: {}", member.path, member.reason))
                .collect(),
        })?;
    let generations_differ = labelled
        .iter()
        .any(|candidate| candidate.label.generation != reference.generation);
    let mut sorted = sort_members(tier, &reference, labelled)?;
    sorted.excluded.extend(unreadable);
    let assembled = build(tier, reference, sorted)?;
    if generations_differ {
        assembled.array.labels_out_of_date();
    }
    if assembled.array.geometry().is_zoned() && !assembled.array.load_zone_table().await? {
        return Err(ArrayError::ZoneTableUnreadable { tier: tier.name() });
    }
    Ok(assembled)
}

/// What assembly sorted the devices into.
struct Sorted {
    /// The current member at each index.
    current: BTreeMap<u32, Labelled>,
    /// Replacements being rebuilt, by the index they replace.
    replacements: BTreeMap<u32, Labelled>,
    excluded: Vec<ExcludedMember>,
}

/// The current member at each index, the replacements being rebuilt, and
/// the stale members left out.
fn sort_members(
    tier: TierRole,
    reference: &MemberLabel,
    labelled: Vec<Labelled>,
) -> Result<Sorted, ArrayError> {
    let mut sorted = Sorted {
        current: BTreeMap::new(),
        replacements: BTreeMap::new(),
        excluded: Vec::new(),
    };
    for candidate in labelled {
        check_belongs(tier, reference, &candidate)?;
        let index = candidate.label.member_index;
        if candidate.label.is_rebuilding() {
            if let Some(other) = sorted.replacements.insert(index, candidate) {
                return Err(duplicate(tier, &other, &sorted.replacements[&index]));
            }
            continue;
        }
        // The newest label lists every member that left the array; a member
        // with an older label that is not listed only missed the label
        // update (a crash while labels were rewritten), not data.
        if reference.faulted_members.contains(&index) {
            sorted.excluded.push(ExcludedMember {
                reason: format!(
                    "stale member {index}: it left the array at generation {} (its label says {}) and missed writes since",
                    reference.generation, candidate.label.generation
                ),
                path: candidate.member.path,
            });
            continue;
        }
        let Some(other) = sorted.current.remove(&index) else {
            sorted.current.insert(index, candidate);
            continue;
        };
        // Two devices at one index: a replacement that took the member's
        // place (one generation on) and the old device, whose label could
        // not be wiped. The newer wins.
        let (newer, older) = match other.label.generation.cmp(&candidate.label.generation) {
            std::cmp::Ordering::Less => (candidate, other),
            std::cmp::Ordering::Greater => (other, candidate),
            std::cmp::Ordering::Equal => return Err(duplicate(tier, &other, &candidate)),
        };
        sorted.excluded.push(ExcludedMember {
            reason: format!(
                "replaced member {index}: {} took its place at generation {}",
                newer.member.path, newer.label.generation
            ),
            path: older.member.path,
        });
        sorted.current.insert(index, newer);
    }
    Ok(sorted)
}

fn duplicate(tier: TierRole, one: &Labelled, other: &Labelled) -> ArrayError {
    ArrayError::DuplicateMember {
        path: one.member.path.clone(),
        other: other.member.path.clone(),
        tier: tier.name(),
        index: one.label.member_index,
    }
}

/// Refuses a device of another pool or of another shape.
fn check_belongs(
    tier: TierRole,
    reference: &MemberLabel,
    candidate: &Labelled,
) -> Result<(), ArrayError> {
    let label = &candidate.label;
    if label.array_identifier != reference.array_identifier {
        return Err(ArrayError::ForeignMember {
            path: candidate.member.path.clone(),
            found: label.array_identifier,
            expected: reference.array_identifier,
        });
    }
    if label.geometry() != reference.geometry() || label.member_index >= label.member_count {
        return Err(ArrayError::InconsistentShape {
            path: candidate.member.path.clone(),
            tier: tier.name(),
        });
    }
    Ok(())
}

fn build(tier: TierRole, reference: MemberLabel, sorted: Sorted) -> Result<Assembled, ArrayError> {
    let Sorted {
        mut current,
        replacements,
        mut excluded,
    } = sorted;
    let geometry = reference.geometry();
    let needed_bytes = geometry.member_size_blocks() * BLOCK_SIZE_BYTES;
    let mut members = Vec::new();
    let mut missing = Vec::new();
    for index in 0..geometry.member_count {
        let key = u32::try_from(index).expect("member indexes fit in u32");
        let last_seen = reference
            .member_paths
            .get(index)
            .cloned()
            .unwrap_or_default();
        if reference.empty_members.contains(&key) {
            // A removed member whose label could not be wiped.
            if let Some(Labelled { member, .. }) = current.remove(&key) {
                excluded.push(ExcludedMember {
                    reason: format!("removed member {index}: its slot is empty"),
                    path: member.path,
                });
            }
            members.push(Member::empty(index));
            continue;
        }
        match current.remove(&key) {
            Some(Labelled { member, .. }) => match too_short(&member, needed_bytes) {
                // Shorter than the rows (a truncated file): its label still
                // reads, but rows past its end cannot, nor be written. It is
                // a lost member, counted against the parity and named with
                // its size, not a reason to refuse the whole array.
                Some(reason) => {
                    missing.push(Missing {
                        recorded: false,
                        text: format!("member {index} ({} is {reason})", member.path),
                    });
                    excluded.push(ExcludedMember {
                        reason: format!("member {index} is {reason}"),
                        path: member.path.clone(),
                    });
                    members.push(Member::unfit(index, member.path, reason));
                }
                None => members.push(Member::present(index, member.path, member.device)),
            },
            None => {
                let recorded = reference.faulted_members.contains(&key);
                missing.push(Missing {
                    recorded,
                    text: format!("member {index} (last seen at {last_seen})"),
                });
                members.push(Member::missing(index, last_seen));
            }
        }
    }
    check_missing(tier, &reference, &members, missing)?;
    let array = RedundantArray::new(geometry, members, reference);
    resume_replacements(&array, replacements, needed_bytes, &mut excluded);
    Ok(Assembled { array, excluded })
}

/// Attaches the replacements found to resume their rebuilds; one too small
/// for the array is left out (named), and its member stays as it is.
fn resume_replacements(
    array: &RedundantArray,
    replacements: BTreeMap<u32, Labelled>,
    needed_bytes: u64,
    excluded: &mut Vec<ExcludedMember>,
) {
    for (index, Labelled { member, label }) in replacements {
        if let Some(reason) = too_short(&member, needed_bytes) {
            excluded.push(ExcludedMember {
                reason: format!("the replacement of member {index} is {reason}"),
                path: member.path,
            });
            continue;
        }
        let rows_done = label.rebuilding_rows_done.expect("a replacement's label");
        tracing::warn!(path = %member.path, member = index, rows_done, "resuming the rebuild of a replacement");
        array.resume_replacement(
            usize::try_from(index).expect("member indexes fit in usize"),
            member,
            rows_done,
        );
    }
}

/// Why `member` cannot hold its rows: its size and the size needed.
fn too_short(member: &MemberDevice, needed_bytes: u64) -> Option<String> {
    let size_bytes = member.device.size_bytes();
    (size_bytes < needed_bytes)
        .then(|| format!("too small: {size_bytes} bytes, at least {needed_bytes} needed"))
}

/// A member not found at assembly.
struct Missing {
    /// The newest label lists it as faulted (it left while the array ran).
    recorded: bool,
    text: String,
}

/// Refuses to assemble with more members missing than the parity covers
/// (a version 2 array); a zoned array counts only members that went missing
/// without the array noticing (zones opened since a recorded loss do not
/// hold the lost member, and each zone's reads check their own set), and
/// needs a present holder of the prefix.
fn check_missing(
    tier: TierRole,
    reference: &MemberLabel,
    members: &[Member],
    missing: Vec<Missing>,
) -> Result<(), ArrayError> {
    let geometry = reference.geometry();
    let counted = missing
        .iter()
        .filter(|member| !geometry.is_zoned() || !member.recorded)
        .count();
    if counted > geometry.parity_columns() {
        return Err(ArrayError::TooManyMissing {
            tier: tier.name(),
            redundancy: geometry.redundancy,
            member_count: geometry.member_count,
            parity: geometry.parity_columns(),
            missing: missing.into_iter().map(|member| member.text).collect(),
        });
    }
    let holders: Vec<usize> = reference
        .prefix_members
        .iter()
        .map(|index| usize::try_from(*index).expect("member indexes fit in usize"))
        .collect();
    if !holders
        .iter()
        .any(|index| members[*index].state().is_usable())
    {
        return Err(ArrayError::NoPrefixCopy {
            tier: tier.name(),
            holders: holders
                .iter()
                .map(|index| {
                    reference
                        .member_paths
                        .get(*index)
                        .cloned()
                        .unwrap_or_default()
                })
                .collect(),
        });
    }
    Ok(())
}
