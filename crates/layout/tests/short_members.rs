//! A member shorter than the array needs (a file truncated under the
//! daemon: its label at block 0 still reads, its rows do not) is a faulted
//! member, not a reason to refuse the array: assembly leaves it out, names
//! it with its size and the size needed, counts it against the parity like
//! a missing member, and every block reads back exact; with more such
//! members than the parity covers, assembly refuses, naming each one. A
//! replacement that is too short is left out and its member stays as it is.

#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockDevice, DeviceError, DeviceReadFuture, MemoryDevice};
use lamina_layout::{
    ArrayError, ArrayIdentity, ArrayState, MemberDevice, MemberState, Redundancy, RedundantArray,
    TierRole, assemble, create,
};
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
const PREFIX_BLOCKS: u64 = 16;
const MEMBER_BYTES: u64 = 1 << 20;
/// What a truncated member keeps: its labels and a little more (as
/// `truncate -s 16M` leaves of a 256 MiB member).
const SHORT_BYTES: u64 = 64 * BLOCK as u64;
/// Rows of random data written before the members are cut short.
const ROWS_WRITTEN: u64 = 40;

/// A member device cut short: the first `size_bytes` of `inner`.
struct Truncated {
    inner: Arc<MemoryDevice>,
    size_bytes: u64,
}

#[async_trait::async_trait]
impl BlockDevice for Truncated {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn read(&self, offset: u64, length: usize) -> DeviceReadFuture<'_> {
        assert!(
            offset + length as u64 <= self.size_bytes,
            "a read past the end of a truncated member"
        );
        self.inner.read(offset, length)
    }
    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        assert!(
            offset + data.len() as u64 <= self.size_bytes,
            "a write past the end of a truncated member"
        );
        self.inner.write(offset, data).await
    }
    async fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush().await
    }
}

fn path(index: usize) -> String {
    format!("/test/f{index}.img")
}

/// `count` members of `MEMBER_BYTES`.
fn memories(count: usize) -> Vec<Arc<MemoryDevice>> {
    (0..count)
        .map(|_| Arc::new(MemoryDevice::new(MEMBER_BYTES)))
        .collect()
}

/// The members as offered at assembly, those in `short` cut to
/// `SHORT_BYTES`.
fn offered(memories: &[Arc<MemoryDevice>], short: &[usize]) -> Vec<MemberDevice> {
    memories
        .iter()
        .enumerate()
        .map(|(index, memory)| {
            let device: Arc<dyn BlockDevice> = if short.contains(&index) {
                Arc::new(Truncated {
                    inner: memory.clone(),
                    size_bytes: SHORT_BYTES,
                })
            } else {
                memory.clone()
            };
            MemberDevice {
                path: path(index),
                device,
            }
        })
        .collect()
}

async fn created(redundancy: Redundancy, memories: &[Arc<MemoryDevice>]) -> RedundantArray {
    let identity = ArrayIdentity {
        array_identifier: 42,
        tier: TierRole::Flash,
    };
    create(identity, redundancy, PREFIX_BLOCKS, offered(memories, &[]))
        .await
        .unwrap()
}

/// Writes the prefix and `ROWS_WRITTEN` rows of random data, flushed;
/// returns the contents from block 0.
async fn fill(array: &RedundantArray, seed: u64) -> Vec<u8> {
    let blocks = PREFIX_BLOCKS + ROWS_WRITTEN * array.row_data_blocks();
    let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
    let data: Vec<u8> = (0..blocks as usize * BLOCK)
        .map(|_| random.random())
        .collect();
    array
        .write(0, Arc::new(AlignedBuffer::from_slice_padded(&data)))
        .await
        .unwrap();
    array.flush().await.unwrap();
    data
}

async fn read_all(array: &RedundantArray, length: usize) -> Vec<u8> {
    array.read(0, length).await.unwrap().to_vec()
}

/// The size the array needs of each member, as the refusal used to name it.
fn needed_bytes(array: &RedundantArray) -> u64 {
    array.geometry().member_size_blocks() * BLOCK as u64
}

/// Assembles with `short` cut short and checks: degraded, the short member
/// faulted and named with both sizes, every byte exact.
async fn assembles_degraded(redundancy: Redundancy, member_count: usize, short: usize) {
    let memories = memories(member_count);
    let array = created(redundancy, &memories).await;
    let data = fill(&array, member_count as u64).await;
    let needed = needed_bytes(&array);
    drop(array);

    let assembled = assemble(TierRole::Flash, offered(&memories, &[short]))
        .await
        .unwrap_or_else(|error| panic!("{redundancy}: {error}"));
    let sizes = format!("{SHORT_BYTES} bytes, at least {needed} needed");
    assert_eq!(assembled.excluded.len(), 1, "{:?}", assembled.excluded);
    assert_eq!(assembled.excluded[0].path, path(short));
    assert!(
        assembled.excluded[0].reason.contains(&sizes),
        "{:?}",
        assembled.excluded
    );
    let array = assembled.array;
    assert_eq!(array.state(), ArrayState::Degraded, "{redundancy}");
    let status = &array.member_status()[short];
    assert_eq!(status.state, MemberState::Faulted);
    assert_eq!(status.path, path(short));
    let unfit = status
        .unfit
        .as_deref()
        .expect("the reason it is out of use");
    assert!(unfit.contains(&sizes), "{unfit}");
    assert_eq!(read_all(&array, data.len()).await, data, "{redundancy}");
    // The others' labels now list it as faulted: back at its full size
    // (its rows missed nothing yet, but the array cannot know that), it
    // stays out as stale rather than serving rows it may lack.
    array.flush().await.unwrap();
    drop(array);
    let assembled = assemble(TierRole::Flash, offered(&memories, &[]))
        .await
        .unwrap();
    assert!(
        assembled.excluded[0].reason.contains("stale"),
        "{:?}",
        assembled.excluded
    );
    assert_eq!(read_all(&assembled.array, data.len()).await, data);
}

#[tokio::test]
async fn one_short_member_of_raid6_or_raid5_is_faulted_and_the_array_serves_degraded() {
    assembles_degraded(Redundancy::Raid6, 6, 2).await;
    assembles_degraded(Redundancy::Raid5, 4, 1).await;
}

#[tokio::test]
async fn more_short_members_than_the_parity_covers_are_refused_each_named() {
    let memories = memories(6);
    let array = created(Redundancy::Raid6, &memories).await;
    fill(&array, 7).await;
    let needed = needed_bytes(&array);
    drop(array);
    let short = [1, 3, 4];
    let error = assemble(TierRole::Flash, offered(&memories, &short))
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(
        matches!(error, ArrayError::TooManyMissing { .. }),
        "{message}"
    );
    assert!(message.contains("3 are missing"), "{message}");
    for index in short {
        let named = format!(
            "{} is too small: {SHORT_BYTES} bytes, at least {needed} needed",
            path(index)
        );
        assert!(message.contains(&named), "{message}");
    }
}

#[tokio::test]
async fn a_short_replacement_is_left_out_and_its_member_stays() {
    let memories = memories(7);
    let array = created(Redundancy::Raid6, &memories[..6]).await;
    let data = fill(&array, 8).await;
    let new = MemberDevice {
        path: path(6),
        device: memories[6].clone(),
    };
    array.begin_replacement(&path(3), new).await.unwrap();
    drop(array);

    let assembled = assemble(TierRole::Flash, offered(&memories, &[6]))
        .await
        .unwrap();
    assert_eq!(assembled.excluded.len(), 1, "{:?}", assembled.excluded);
    assert_eq!(assembled.excluded[0].path, path(6));
    assert!(assembled.excluded[0].reason.contains("too small"));
    let array = assembled.array;
    assert!(!array.rebuild_pending(), "no rebuild onto a short device");
    assert_eq!(array.state(), ArrayState::Online);
    assert_eq!(array.member_status()[3].path, path(3));
    assert_eq!(read_all(&array, data.len()).await, data);
}
