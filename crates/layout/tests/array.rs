//! The array against memory and fault-injecting members: whole-row writes,
//! reads healthy and degraded, members lost at runtime, silent corruption
//! repaired through `recover_block` (and, for a range only its whole can
//! judge, `recover_range` and `reconstruct_range`), and assembling from
//! labelled devices.

#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockDevice, FaultyDevice, MemoryDevice};
use lamina_layout::{
    ArrayError, ArrayIdentity, ArrayState, MemberDevice, MemberState, Redundancy, RedundantArray,
    TierRole, assemble, create,
};
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
const PREFIX_BLOCKS: u64 = 16;
const MEMBER_BYTES: u64 = 1 << 20;

struct Members {
    faulty: Vec<Arc<FaultyDevice<MemoryDevice>>>,
}

impl Members {
    fn new(count: usize) -> Self {
        Self {
            faulty: (0..count)
                .map(|index| {
                    Arc::new(FaultyDevice::new(
                        Arc::new(MemoryDevice::new(MEMBER_BYTES)),
                        index as u64,
                    ))
                })
                .collect(),
        }
    }

    /// The member whose block at `member_offset` holds `contents`.
    fn holding(&self, member_offset: u64, contents: &[u8]) -> usize {
        (0..self.faulty.len())
            .find(|index| {
                let mut stored = vec![0; contents.len()];
                self.faulty[*index]
                    .inner()
                    .read_sync(member_offset, &mut stored);
                stored == contents
            })
            .expect("one member holds the block")
    }

    /// A raid6 array over these (six) members.
    async fn raid6(&self) -> RedundantArray {
        create(identity(), Redundancy::Raid6, PREFIX_BLOCKS, self.devices())
            .await
            .unwrap()
    }

    fn devices(&self) -> Vec<MemberDevice> {
        self.faulty
            .iter()
            .enumerate()
            .map(|(index, device)| MemberDevice {
                path: format!("/test/member{index}"),
                device: device.clone() as Arc<dyn BlockDevice>,
            })
            .collect()
    }
}

fn identity() -> ArrayIdentity {
    ArrayIdentity {
        array_identifier: 77,
        tier: TierRole::Flash,
    }
}

fn random_blocks(count: usize, seed: u64) -> Vec<u8> {
    let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..count * BLOCK).map(|_| random.random()).collect()
}

async fn write(array: &dyn BlockDevice, block: u64, data: &[u8]) {
    array
        .write(
            block * BLOCK as u64,
            Arc::new(AlignedBuffer::from_slice_padded(data)),
        )
        .await
        .unwrap();
}

async fn read(array: &dyn BlockDevice, block: u64, count: usize) -> Vec<u8> {
    array
        .read(block * BLOCK as u64, count * BLOCK)
        .await
        .unwrap()
        .to_vec()
}

/// Writes rows of random data at row boundaries (partial last rows too) and
/// a prefix block; returns the expected contents by array block.
async fn fill(array: &dyn BlockDevice, row_data_blocks: u64) -> Vec<(u64, Vec<u8>)> {
    let mut written = Vec::new();
    let prefix = random_blocks(3, 1);
    write(array, 2, &prefix).await;
    written.push((2, prefix));
    let mut block = PREFIX_BLOCKS;
    for (seed, count) in [5_usize, 1, 8, 3, 13].into_iter().enumerate() {
        let data = random_blocks(count, seed as u64 + 10);
        write(array, block, &data).await;
        written.push((block, data));
        let rows = (count as u64).div_ceil(row_data_blocks);
        block += rows * row_data_blocks;
    }
    written
}

async fn check(array: &dyn BlockDevice, written: &[(u64, Vec<u8>)]) {
    for (block, data) in written {
        assert_eq!(
            read(array, *block, data.len() / BLOCK).await,
            *data,
            "block {block}"
        );
        // Single blocks too, which take the one-member path.
        for index in 0..data.len() / BLOCK {
            assert_eq!(
                read(array, block + index as u64, 1).await,
                data[index * BLOCK..(index + 1) * BLOCK]
            );
        }
    }
}

#[tokio::test]
async fn every_scheme_reads_back_what_it_wrote_and_survives_its_parity_in_lost_members() {
    for (redundancy, count) in [
        (Redundancy::Raid6, 6),
        (Redundancy::Raid6, 4),
        (Redundancy::Raid5, 3),
        (Redundancy::Mirror, 3),
        (Redundancy::None, 2),
    ] {
        let members = Members::new(count);
        let array = create(identity(), redundancy, PREFIX_BLOCKS, members.devices())
            .await
            .unwrap();
        let written = fill(&array, array.row_data_blocks()).await;
        check(&array, &written).await;
        // Members fail one by one while the parity covers it.
        let parity = redundancy.parity_columns(count);
        for lost in 0..parity {
            members.faulty[lost * 2 % count]
                .fail_at_rate(1.0, 1.0)
                .await;
            check(&array, &written).await;
            assert_eq!(array.state(), ArrayState::Degraded, "{redundancy}");
        }
        // Writes go on, degraded, and read back.
        let more = random_blocks(5, 99);
        let at = array.geometry().prefix_blocks + 40 * array.row_data_blocks();
        write(&array, at, &more).await;
        assert_eq!(read(&array, at, 5).await, more);
        array.flush().await.unwrap();
    }
}

#[tokio::test]
async fn with_more_members_lost_than_the_parity_io_fails_and_nothing_wrong_is_returned() {
    let members = Members::new(6);
    let array = members.raid6().await;
    let written = fill(&array, array.row_data_blocks()).await;
    for index in [0, 3, 5] {
        members.faulty[index].fail_at_rate(1.0, 1.0).await;
    }
    let (block, data) = &written[1];
    assert!(array.read(*block * BLOCK as u64, data.len()).await.is_err());
    assert_eq!(array.state(), ArrayState::Faulted);
    assert!(array.flush().await.is_err());
}

#[tokio::test]
async fn a_bit_flip_is_repaired_from_parity_and_counted_against_its_member() {
    let members = Members::new(6);
    let array = members.raid6().await;
    let written = fill(&array, array.row_data_blocks()).await;
    array.flush().await.unwrap();
    let (block, data) = &written[3];
    let block = block + 2;
    let good = data[2 * BLOCK..3 * BLOCK].to_vec();
    // Flip a bit in whichever member holds the block: find it by reading
    // each member's row block.
    let geometry = array.geometry();
    let row = (block - geometry.prefix_blocks) / geometry.row_data_blocks();
    let member_offset = (lamina_layout::LABEL_AREA_BLOCKS + geometry.prefix_blocks + row) * 4096;
    let holder = members.holding(member_offset, &good);
    members.faulty[holder]
        .flip_bit(member_offset + 100, 3)
        .await
        .unwrap();
    assert_ne!(read(&array, block, 1).await, good, "the flip is visible");
    let expected = good.clone();
    let check = move |contents: &[u8]| contents == expected.as_slice();
    let recovered = array
        .recover_block(block * 4096, &check)
        .await
        .unwrap()
        .expect("rebuilt from parity");
    assert_eq!(recovered.to_vec(), good);
    assert_eq!(
        read(&array, block, 1).await,
        good,
        "the bad copy was rewritten"
    );
    let status = &array.member_status()[holder];
    assert_eq!(status.checksum_errors_repaired, 1);
    assert_eq!(status.state, MemberState::Degraded);
}

#[tokio::test]
async fn two_silently_bad_columns_are_found_with_double_parity() {
    let members = Members::new(6);
    let array = members.raid6().await;
    let data = random_blocks(4, 5);
    write(&array, PREFIX_BLOCKS, &data).await;
    let member_offset = (lamina_layout::LABEL_AREA_BLOCKS + PREFIX_BLOCKS) * 4096;
    // Damage two members' blocks of row 0 (one of them may be parity).
    for index in [1, 4] {
        members.faulty[index]
            .flip_bit(member_offset + 7, 0)
            .await
            .unwrap();
    }
    for column in 0..4_usize {
        let expected = data[column * BLOCK..(column + 1) * BLOCK].to_vec();
        let check = move |contents: &[u8]| contents == expected.as_slice();
        let recovered = array
            .recover_block((PREFIX_BLOCKS + column as u64) * 4096, &check)
            .await
            .unwrap()
            .expect("rebuilt");
        assert_eq!(
            recovered.to_vec(),
            data[column * BLOCK..(column + 1) * BLOCK]
        );
    }
    assert_eq!(read(&array, PREFIX_BLOCKS, 4).await, data);
}

/// A range of two blocks judged only as a whole (a compressed fragment
/// continuing from one block into the next, decision 0072) with both
/// blocks silently bad: one block at a time never passes (each rebuild is
/// judged with the other block as read), the range rebuilt together does,
/// `reconstruct_range` serves it without writing, and `recover_range`
/// rewrites both copies.
#[tokio::test]
async fn two_bad_blocks_judged_together_are_rebuilt_together() {
    let members = Members::new(6);
    let array = members.raid6().await;
    let data = random_blocks(4, 9);
    write(&array, PREFIX_BLOCKS, &data).await;
    let member_offset = (lamina_layout::LABEL_AREA_BLOCKS + PREFIX_BLOCKS) * 4096;
    let range = 1..3_usize;
    let good = data[range.start * BLOCK..range.end * BLOCK].to_vec();
    for column in range.clone() {
        let holder = members.holding(member_offset, &data[column * BLOCK..(column + 1) * BLOCK]);
        members.faulty[holder]
            .flip_bit(member_offset + 900, 5)
            .await
            .unwrap();
    }
    let offset = (PREFIX_BLOCKS + range.start as u64) * 4096;
    let as_read = read(&array, PREFIX_BLOCKS + range.start as u64, 2).await;
    assert_ne!(as_read, good, "the flips are visible");
    let second_as_read = as_read[BLOCK..].to_vec();
    let expected = good.clone();
    let judged_with_the_second_as_read =
        move |contents: &[u8]| [contents, second_as_read.as_slice()].concat() == expected;
    assert!(
        array
            .recover_block(offset, &judged_with_the_second_as_read)
            .await
            .unwrap()
            .is_none(),
        "one block at a time never passes"
    );
    let expected = good.clone();
    let whole = move |contents: &[u8]| contents == expected.as_slice();
    let served = array
        .reconstruct_range(offset, 2 * BLOCK, &whole)
        .await
        .unwrap()
        .expect("rebuilt together");
    assert_eq!(served.to_vec(), good);
    assert_eq!(
        read(&array, PREFIX_BLOCKS + range.start as u64, 2).await,
        as_read,
        "reconstruct_range writes nothing"
    );
    let repaired = array
        .recover_range(offset, 2 * BLOCK, &whole)
        .await
        .unwrap()
        .expect("rebuilt together");
    assert_eq!(repaired.to_vec(), good);
    assert_eq!(
        read(&array, PREFIX_BLOCKS, 4).await,
        data,
        "both copies rewritten"
    );
}

#[tokio::test]
async fn a_damaged_prefix_copy_is_repaired_from_another_member() {
    let members = Members::new(4);
    let array = members.raid6().await;
    let data = random_blocks(1, 8);
    write(&array, 3, &data).await;
    let member_offset = (lamina_layout::LABEL_AREA_BLOCKS + 3) * 4096;
    members.faulty[0].flip_bit(member_offset, 1).await.unwrap();
    let expected = data.clone();
    let check = move |contents: &[u8]| contents == expected.as_slice();
    let recovered = array
        .recover_block(3 * 4096, &check)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(recovered.to_vec(), data);
    assert_eq!(read(&array, 3, 1).await, data);
}

#[tokio::test]
async fn an_array_assembles_in_any_order_and_refuses_foreign_stale_and_too_few_members() {
    let members = Members::new(6);
    let array = members.raid6().await;
    let written = fill(&array, array.row_data_blocks()).await;
    array.flush().await.unwrap();
    let mut devices = members.devices();
    devices.reverse();
    let assembled = assemble(TierRole::Flash, devices.clone()).await.unwrap();
    assert!(assembled.excluded.is_empty());
    check(&assembled.array, &written).await;

    // Two missing: degraded, data intact; three: refused, naming them.
    let two_missing: Vec<MemberDevice> = devices[2..].to_vec();
    let assembled = assemble(TierRole::Flash, two_missing).await.unwrap();
    assert_eq!(assembled.array.state(), ArrayState::Degraded);
    check(&assembled.array, &written).await;
    let error = assemble(TierRole::Flash, devices[3..].to_vec())
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, ArrayError::TooManyMissing { .. }),
        "{message}"
    );
    assert!(
        message.contains("/test/member5") && message.contains("3 are missing"),
        "{message}"
    );

    // A member faulted at runtime is stale once the others' labels move on.
    members.faulty[1].fail_at_rate(1.0, 1.0).await;
    let original = assemble(TierRole::Flash, members.devices())
        .await
        .unwrap()
        .array;
    let _ = original.read(PREFIX_BLOCKS * 4096, 4 * BLOCK).await;
    original.flush().await.unwrap();
    members.faulty[1].heal().await;
    let assembled = assemble(TierRole::Flash, members.devices()).await.unwrap();
    assert_eq!(assembled.excluded.len(), 1, "{:?}", assembled.excluded);
    assert!(assembled.excluded[0].reason.contains("stale"));
    assert_eq!(
        assembled.array.member_status()[1].state,
        MemberState::Missing
    );
    check(&assembled.array, &written).await;

    // A device of another pool, and one of the wrong tier.
    let other = Members::new(4);
    let other_identity = ArrayIdentity {
        array_identifier: 78,
        tier: TierRole::Flash,
    };
    create(
        other_identity,
        Redundancy::Raid5,
        PREFIX_BLOCKS,
        other.devices(),
    )
    .await
    .unwrap();
    let mut mixed = members.devices();
    mixed[0] = other.devices()[0].clone();
    let error = assemble(TierRole::Flash, mixed).await.unwrap_err();
    assert!(matches!(error, ArrayError::ForeignMember { .. }), "{error}");
    let error = assemble(TierRole::Capacity, members.devices())
        .await
        .unwrap_err();
    assert!(matches!(error, ArrayError::WrongTier { .. }), "{error}");
}

#[tokio::test]
async fn bad_member_lists_are_refused_with_clear_errors() {
    let error = create(
        identity(),
        Redundancy::Raid6,
        PREFIX_BLOCKS,
        Members::new(3).devices(),
    )
    .await
    .unwrap_err();
    assert_eq!(error.to_string(), "raid6 needs at least 4 devices, 3 given");
    let small: Vec<MemberDevice> = (0..4)
        .map(|index| MemberDevice {
            path: format!("/small{index}"),
            device: Arc::new(MemoryDevice::new(64 * 4096)) as Arc<dyn BlockDevice>,
        })
        .collect();
    let error = create(identity(), Redundancy::Raid6, 1024, small)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("too small"), "{error}");
}

/// A degraded read of one lost block reads as many members as the row has
/// data columns (four of the five survivors of a 4+2 row), not all of them.
#[tokio::test]
async fn a_degraded_read_reads_only_as_many_members_as_data_columns() {
    let members = Members::new(6);
    let array = members.raid6().await;
    let data = random_blocks(4, 30);
    write(&array, PREFIX_BLOCKS, &data).await;
    // The member holding data column 0 of row 0 is lost.
    let row_offset = (lamina_layout::LABEL_AREA_BLOCKS + PREFIX_BLOCKS) * 4096;
    let lost = members.holding(row_offset, &data[..BLOCK]);
    array.fail_member(lost);
    let before: Vec<u64> = array
        .member_status()
        .iter()
        .map(|member| member.bytes_read)
        .collect();
    assert_eq!(read(&array, PREFIX_BLOCKS, 1).await, data[..BLOCK]);
    let members_read = array
        .member_status()
        .iter()
        .zip(&before)
        .filter(|(member, before)| member.bytes_read > **before)
        .count();
    assert_eq!(members_read, 4);
}
