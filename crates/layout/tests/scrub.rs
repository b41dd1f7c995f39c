//! Scrub of an array against memory members (`BlockDevice::scrub_range`):
//! seeded damage of at most as many columns per row as the parity covers,
//! data and parity alike, is found and repaired, after which losing as many
//! members as the parity covers still reads every held block exact; a row
//! with more bad columns than that is reported and left as it was; copies
//! of a mirror that disagree on a held block are settled by the check.

#![allow(clippy::cast_possible_truncation)]

use std::collections::HashMap;
use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockDevice, MemoryDevice, ScrubBlocks};
use lamina_layout::{
    ArrayIdentity, LABEL_AREA_BLOCKS, MemberDevice, MemberState, Redundancy, RedundantArray,
    TierRole, create,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
const PREFIX_BLOCKS: u64 = 16;
const MEMBER_BYTES: u64 = 2 << 20;
const ROWS_WRITTEN: u64 = 200;
const SEEDS: u64 = 8;

/// The blocks the "engine" holds: their contents, by array block.
struct Held {
    blocks: HashMap<u64, Vec<u8>>,
}

impl ScrubBlocks for Held {
    fn is_held(&self, block_index: u64) -> bool {
        self.blocks.contains_key(&block_index)
    }

    fn is_valid(&self, block_index: u64, contents: &[u8]) -> bool {
        self.blocks
            .get(&block_index)
            .is_none_or(|expected| expected.as_slice() == contents)
    }
}

struct Setup {
    members: Vec<Arc<MemoryDevice>>,
    array: RedundantArray,
    held: Held,
}

/// `ROWS_WRITTEN` whole rows of random data over `member_count` members,
/// of which a random three quarters of the blocks are held.
async fn setup(redundancy: Redundancy, member_count: usize, random: &mut SmallRng) -> Setup {
    setup_rows(redundancy, member_count, ROWS_WRITTEN, random).await
}

async fn setup_rows(
    redundancy: Redundancy,
    member_count: usize,
    rows: u64,
    random: &mut SmallRng,
) -> Setup {
    let member_bytes = MEMBER_BYTES.max((LABEL_AREA_BLOCKS + PREFIX_BLOCKS + rows) * BLOCK as u64);
    let members: Vec<Arc<MemoryDevice>> = (0..member_count)
        .map(|_| Arc::new(MemoryDevice::new(member_bytes)))
        .collect();
    let devices = members
        .iter()
        .enumerate()
        .map(|(index, device)| MemberDevice {
            path: format!("/test/member{index}"),
            device: device.clone() as Arc<dyn BlockDevice>,
        })
        .collect();
    let identity = ArrayIdentity {
        array_identifier: 78,
        tier: TierRole::Flash,
    };
    let array = create(identity, redundancy, PREFIX_BLOCKS, devices)
        .await
        .unwrap();
    let block_count = rows * array.row_data_blocks();
    let data: Vec<u8> = (0..block_count as usize * BLOCK)
        .map(|_| random.random())
        .collect();
    let buffer = Arc::new(AlignedBuffer::from_slice_padded(&data));
    array
        .write(PREFIX_BLOCKS * BLOCK as u64, buffer)
        .await
        .unwrap();
    array.flush().await.unwrap();
    let mut held = HashMap::new();
    for (index, contents) in data.chunks_exact(BLOCK).enumerate() {
        if random.random_bool(0.75) {
            held.insert(PREFIX_BLOCKS + index as u64, contents.to_vec());
        }
    }
    Setup {
        members,
        array,
        held: Held { blocks: held },
    }
}

/// Random bytes over member `member`'s block of `row`.
fn damage(setup: &Setup, member: usize, row: u64, random: &mut SmallRng) {
    let garbage: Vec<u8> = (0..BLOCK).map(|_| random.random()).collect();
    let offset = (LABEL_AREA_BLOCKS + PREFIX_BLOCKS + row) * BLOCK as u64;
    setup.members[member].write_sync(offset, &garbage);
}

/// Every held block reads back as held.
async fn assert_held_read_exact(setup: &Setup, phase: &str) {
    for (block, expected) in &setup.held.blocks {
        let read = setup
            .array
            .read(block * BLOCK as u64, BLOCK)
            .await
            .unwrap_or_else(|error| panic!("{phase}: block {block}: {error}"));
        assert!(
            read.as_ref() == expected.as_slice(),
            "{phase}: block {block}"
        );
    }
}

async fn scrub_all(setup: &Setup) -> lamina_device::ScrubReport {
    let length = ROWS_WRITTEN * setup.array.row_data_blocks() * BLOCK as u64;
    setup
        .array
        .scrub_range(PREFIX_BLOCKS * BLOCK as u64, length, &setup.held)
        .await
        .unwrap()
}

#[tokio::test]
async fn damage_within_the_parity_is_repaired_and_two_more_losses_lose_nothing() {
    for (redundancy, member_count) in [
        (Redundancy::Raid6, 6),
        (Redundancy::Raid5, 4),
        (Redundancy::Mirror, 3),
    ] {
        for seed in 0..SEEDS {
            let mut random = SmallRng::seed_from_u64(seed);
            let setup = setup(redundancy, member_count, &mut random).await;
            let parity = redundancy.parity_columns(member_count);
            let mut damaged_columns = 0;
            for row in 0..ROWS_WRITTEN {
                let bad = random.random_range(0..=parity);
                for member in rand::seq::index::sample(&mut random, member_count, bad) {
                    damage(&setup, member, row, &mut random);
                    damaged_columns += 1;
                }
            }
            let label = format!("{redundancy} seed {seed}");
            let report = scrub_all(&setup).await;
            assert_eq!(report.rows_unrepairable, 0, "{label}: {report:?}");
            assert!(
                report.blocks_repaired + report.parity_repaired > 0,
                "{label}: {report:?}"
            );
            assert!(
                report.blocks_repaired + report.parity_repaired <= damaged_columns,
                "{label}: no more rewritten than was damaged: {report:?}"
            );
            let again = scrub_all(&setup).await;
            assert_eq!(
                again.blocks_repaired + again.parity_repaired,
                0,
                "{label}: a second scrub finds every row whole: {again:?}"
            );
            for member in rand::seq::index::sample(&mut random, member_count, parity) {
                setup.array.fail_member(member);
            }
            assert_held_read_exact(&setup, &label).await;
        }
    }
}

#[tokio::test]
async fn a_row_with_more_bad_columns_than_the_parity_is_reported_and_left_alone() {
    let mut random = SmallRng::seed_from_u64(99);
    let mut setup = setup(Redundancy::Raid6, 6, &mut random).await;
    // Row 3 wholly held; three of its data columns (members 0, 2 and 5:
    // parity is on members 3 and 4 in row 3) bad.
    for column in 0..4 {
        let block = PREFIX_BLOCKS + 3 * 4 + column;
        let contents = setup.array.read(block * BLOCK as u64, BLOCK).await.unwrap();
        setup.held.blocks.insert(block, contents.to_vec());
    }
    for member in [0, 2, 5] {
        damage(&setup, member, 3, &mut random);
    }
    let offset = (LABEL_AREA_BLOCKS + PREFIX_BLOCKS + 3) * BLOCK as u64;
    let before: Vec<Vec<u8>> = setup
        .members
        .iter()
        .map(|member| {
            let mut block = vec![0; BLOCK];
            member.read_sync(offset, &mut block);
            block
        })
        .collect();
    let report = scrub_all(&setup).await;
    assert_eq!(report.rows_unrepairable, 1, "{report:?}");
    assert_eq!(report.unrepairable_blocks.len(), 3, "{report:?}");
    for (member, was) in setup.members.iter().zip(&before) {
        let mut block = vec![0; BLOCK];
        member.read_sync(offset, &mut block);
        assert!(&block == was, "an unrepairable row is left as it was");
    }
    assert!(report.rows_checked <= ROWS_WRITTEN, "{report:?}");
}

#[tokio::test]
async fn a_member_bad_in_nearly_every_row_is_faulted_not_repaired_while_redundancy_is_left() {
    let rows = lamina_layout::SCRUB_FAULT_WINDOW_ROWS + 64;
    let mut random = SmallRng::seed_from_u64(5);
    let setup = setup_rows(Redundancy::Raid6, 6, rows, &mut random).await;
    for member in [2, 4] {
        for row in 0..rows {
            damage(&setup, member, row, &mut random);
        }
    }
    let length = rows * setup.array.row_data_blocks() * BLOCK as u64;
    let report = setup
        .array
        .scrub_range(PREFIX_BLOCKS * BLOCK as u64, length, &setup.held)
        .await
        .unwrap();
    assert_eq!(report.rows_unrepairable, 0, "{:?}", report.members_faulted);
    // The first is faulted; faulting the second too would leave raid6 with
    // no redundancy, so it is repaired instead.
    assert_eq!(report.members_faulted, vec!["/test/member2".to_string()]);
    let states: Vec<MemberState> = setup
        .array
        .member_status()
        .iter()
        .map(|member| member.state)
        .collect();
    assert_eq!(states[2], MemberState::Faulted);
    assert!(states[4].is_usable());
    assert_held_read_exact(&setup, "after the fault").await;
    // Member 4 was repaired: one more loss still reads every held block.
    setup.array.fail_member(0);
    assert_held_read_exact(&setup, "one more member lost").await;
}
