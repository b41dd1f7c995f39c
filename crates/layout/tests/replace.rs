//! Replacing a member: copy first while the old member works, reconstruct
//! when it is lost; a second loss during a raid6 rebuild; a crash mid-rebuild
//! resumed from the replacement's label, whose progress is recorded by time
//! as well as by rows; refusals of unfit devices; and a replacement that
//! fails is dropped without harm.

#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;

use lamina_device::{
    AlignedBuffer, BlockDevice, DeviceError, FaultyDevice, MemoryDevice, PowerCutStyle,
};
use lamina_layout::{
    ArrayError, ArrayIdentity, ArrayState, MemberDevice, MemberState, Redundancy, RedundantArray,
    TierRole, assemble, create,
};
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
const PREFIX_BLOCKS: u64 = 16;
const MEMBER_BYTES: u64 = 2 << 20;

type Faulty = Arc<FaultyDevice<MemoryDevice>>;

fn faulty(seed: u64) -> Faulty {
    Arc::new(FaultyDevice::new(
        Arc::new(MemoryDevice::new(MEMBER_BYTES)),
        seed,
    ))
}

fn member(path: String, device: &Faulty) -> MemberDevice {
    MemberDevice {
        path,
        device: device.clone() as Arc<dyn BlockDevice>,
    }
}

fn path(index: usize) -> String {
    format!("/test/member{index}")
}

async fn raid6(devices: &[Faulty]) -> RedundantArray {
    let members = devices
        .iter()
        .enumerate()
        .map(|(index, device)| member(path(index), device))
        .collect();
    raid6_over(members).await
}

async fn raid6_over(members: Vec<MemberDevice>) -> RedundantArray {
    let identity = ArrayIdentity {
        array_identifier: 91,
        tier: TierRole::Capacity,
    };
    create(identity, Redundancy::Raid6, PREFIX_BLOCKS, members)
        .await
        .unwrap()
}

fn random_blocks(count: usize, seed: u64) -> Vec<u8> {
    let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..count * BLOCK).map(|_| random.random()).collect()
}

/// Writes the prefix and `rows` rows of random data; returns the contents.
async fn fill(array: &RedundantArray, rows: u64, seed: u64) -> Vec<u8> {
    let blocks = PREFIX_BLOCKS + rows * array.row_data_blocks();
    let data = random_blocks(blocks as usize, seed);
    array
        .write(0, Arc::new(AlignedBuffer::from_slice_padded(&data)))
        .await
        .unwrap();
    data
}

async fn read_all(array: &RedundantArray, length: usize) -> Vec<u8> {
    array.read(0, length).await.unwrap().to_vec()
}

/// Rebuilds everything written (the check passes every block).
async fn rebuild_everything(array: &RedundantArray, length: u64) {
    let accept = |_: u64, _: &[u8]| true;
    array.rebuild_range(0, length, &accept).await.unwrap();
    array.finish_rebuild().await.unwrap();
}

#[tokio::test]
async fn a_lost_member_is_rebuilt_onto_a_new_device_which_then_serves_reads() {
    let devices: Vec<Faulty> = (0..6).map(faulty).collect();
    let array = raid6(&devices).await;
    let data = fill(&array, 40, 1).await;
    devices[2].fail_at_rate(1.0, 1.0).await;
    assert_eq!(read_all(&array, data.len()).await, data);
    assert_eq!(array.state(), ArrayState::Degraded);

    let new = faulty(10);
    array
        .begin_replacement(&path(2), member("/test/new".into(), &new))
        .await
        .unwrap();
    assert!(array.rebuild_pending());
    rebuild_everything(&array, data.len() as u64).await;
    assert!(!array.rebuild_pending());
    assert_eq!(array.state(), ArrayState::Online);
    let status = array.member_status();
    assert_eq!(status[2].path, "/test/new");
    assert_eq!(status[2].state, MemberState::Online);

    // The new device holds its column: with two other members lost, every
    // row needs it.
    devices[0].fail_at_rate(1.0, 1.0).await;
    devices[4].fail_at_rate(1.0, 1.0).await;
    assert_eq!(read_all(&array, data.len()).await, data);
}

#[tokio::test]
async fn writes_during_the_rebuild_reach_the_new_device_and_a_second_loss_loses_nothing() {
    let devices: Vec<Faulty> = (0..6).map(faulty).collect();
    let array = raid6(&devices).await;
    let mut data = fill(&array, 60, 2).await;
    devices[1].fail_at_rate(1.0, 1.0).await;
    let new = faulty(11);
    array
        .begin_replacement(&path(1), member("/test/new".into(), &new))
        .await
        .unwrap();
    // Half the rows rebuilt, then new writes and a second member lost.
    let half = (PREFIX_BLOCKS + 30 * array.row_data_blocks()) * BLOCK as u64;
    let accept = |_: u64, _: &[u8]| true;
    array.rebuild_range(0, half, &accept).await.unwrap();
    let rewritten_at = PREFIX_BLOCKS + 45 * array.row_data_blocks();
    let rewritten = random_blocks(4 * array.row_data_blocks() as usize, 3);
    array
        .write(
            rewritten_at * BLOCK as u64,
            Arc::new(AlignedBuffer::from_slice_padded(&rewritten)),
        )
        .await
        .unwrap();
    let start = rewritten_at as usize * BLOCK;
    data[start..start + rewritten.len()].copy_from_slice(&rewritten);
    devices[5].fail_at_rate(1.0, 1.0).await;
    assert_eq!(
        read_all(&array, data.len()).await,
        data,
        "two lost, mid-rebuild"
    );
    array
        .rebuild_range(half, data.len() as u64 - half, &accept)
        .await
        .unwrap();
    array.finish_rebuild().await.unwrap();
    assert_eq!(array.lost_member_count(), 1, "only the second loss remains");
    // And the rebuilt member carries its weight: one more loss is covered.
    devices[3].fail_at_rate(1.0, 1.0).await;
    assert_eq!(read_all(&array, data.len()).await, data);
}

#[tokio::test]
async fn copy_first_keeps_the_old_member_until_the_new_one_is_whole() {
    let devices: Vec<Faulty> = (0..6).map(faulty).collect();
    let array = raid6(&devices).await;
    let data = fill(&array, 30, 4).await;
    let new = faulty(12);
    array
        .begin_replacement(&path(3), member("/test/new".into(), &new))
        .await
        .unwrap();
    assert_eq!(array.state(), ArrayState::Online, "no redundancy lost");
    rebuild_everything(&array, data.len() as u64).await;
    assert_eq!(array.member_status()[3].path, "/test/new");
    // The old device no longer carries a label.
    assert!(
        lamina_layout::read_label(devices[3].as_ref())
            .await
            .is_err()
    );
    devices[0].fail_at_rate(1.0, 1.0).await;
    devices[1].fail_at_rate(1.0, 1.0).await;
    assert_eq!(read_all(&array, data.len()).await, data);
}

#[tokio::test]
async fn a_rebuild_cut_by_a_crash_resumes_from_the_replacements_label() {
    let devices: Vec<Faulty> = (0..6).map(faulty).collect();
    let array = raid6(&devices).await;
    let data = fill(&array, 200, 5).await;
    array.flush().await.unwrap();
    devices[4].fail_at_rate(1.0, 1.0).await;
    let new = faulty(13);
    array
        .begin_replacement(&path(4), member("/test/new".into(), &new))
        .await
        .unwrap();
    let part = (PREFIX_BLOCKS + 120 * array.row_data_blocks()) * BLOCK as u64;
    let accept = |_: u64, _: &[u8]| true;
    array.rebuild_range(0, part, &accept).await.unwrap();
    drop(array);
    for device in devices.iter().chain([&new]) {
        device.power_cut(PowerCutStyle::Random).await.unwrap();
    }
    let restarted = |device: &Faulty| Arc::new(FaultyDevice::new(device.inner().clone(), 0));
    let devices: Vec<Faulty> = devices.iter().map(restarted).collect();
    let new = restarted(&new);
    // The old member stays lost; the replacement is found by its label.
    let mut candidates: Vec<MemberDevice> = devices
        .iter()
        .enumerate()
        .filter(|(index, _)| *index != 4)
        .map(|(index, device)| member(path(index), device))
        .collect();
    candidates.push(member("/test/new".into(), &new));
    let array = assemble(TierRole::Capacity, candidates)
        .await
        .unwrap()
        .array;
    assert!(array.rebuild_pending(), "the rebuild resumes");
    rebuild_everything(&array, data.len() as u64).await;
    devices[0].fail_at_rate(1.0, 1.0).await;
    devices[1].fail_at_rate(1.0, 1.0).await;
    assert_eq!(read_all(&array, data.len()).await, data);
}

#[tokio::test]
async fn after_the_swap_the_old_device_is_left_out_even_with_its_label() {
    let devices: Vec<Faulty> = (0..6).map(faulty).collect();
    let array = raid6(&devices).await;
    let data = fill(&array, 20, 6).await;
    let new = faulty(14);
    array
        .begin_replacement(&path(0), member("/test/new".into(), &new))
        .await
        .unwrap();
    // The old device cannot be wiped: its label stays.
    devices[0].fail_writes_in(0..MEMBER_BYTES).await;
    rebuild_everything(&array, data.len() as u64).await;
    drop(array);
    devices[0].heal().await;
    let mut candidates: Vec<MemberDevice> = devices
        .iter()
        .enumerate()
        .map(|(index, device)| member(path(index), device))
        .collect();
    candidates.push(member("/test/new".into(), &new));
    let assembled = assemble(TierRole::Capacity, candidates).await.unwrap();
    assert_eq!(assembled.excluded.len(), 1, "{:?}", assembled.excluded);
    assert_eq!(assembled.excluded[0].path, path(0));
    assert!(assembled.excluded[0].reason.contains("replaced"));
    assert_eq!(read_all(&assembled.array, data.len()).await, data);
}

#[tokio::test]
async fn unfit_replacements_are_refused_and_a_failing_one_is_dropped() {
    let devices: Vec<Faulty> = (0..6).map(faulty).collect();
    let array = raid6(&devices).await;
    let data = fill(&array, 20, 7).await;
    let small = Arc::new(FaultyDevice::new(Arc::new(MemoryDevice::new(1 << 20)), 1));
    let refused = array
        .begin_replacement(&path(1), member("/test/small".into(), &small))
        .await;
    assert!(
        matches!(refused, Err(ArrayError::TooSmall { .. })),
        "{refused:?}"
    );
    let refused = array
        .begin_replacement("/test/nothing", member("/test/new".into(), &faulty(3)))
        .await;
    assert!(
        matches!(refused, Err(ArrayError::NotAMember { .. })),
        "{refused:?}"
    );
    let refused = array
        .begin_replacement(&path(1), member(path(2), &devices[2]))
        .await;
    assert!(
        matches!(refused, Err(ArrayError::AlreadyAMember { .. })),
        "{refused:?}"
    );

    devices[1].fail_at_rate(1.0, 1.0).await;
    let failing = faulty(15);
    array
        .begin_replacement(&path(1), member("/test/failing".into(), &failing))
        .await
        .unwrap();
    failing.fail_at_rate(1.0, 1.0).await;
    let accept = |_: u64, _: &[u8]| true;
    assert!(
        array
            .rebuild_range(0, data.len() as u64, &accept)
            .await
            .is_err()
    );
    assert!(array.finish_rebuild().await.is_err());
    assert!(!array.rebuild_pending());
    assert!(
        array
            .rebuild_failure()
            .unwrap()
            .contains("replacement device failed")
    );
    assert_eq!(read_all(&array, data.len()).await, data, "nothing lost");
    // A labelled device (the failed attempt's) is refused; a blank one works.
    let labelled = array
        .begin_replacement(&path(1), member("/test/failing".into(), &failing))
        .await;
    assert!(labelled.is_err());
    let good = faulty(16);
    array
        .begin_replacement(&path(1), member("/test/good".into(), &good))
        .await
        .unwrap();
    rebuild_everything(&array, data.len() as u64).await;
    assert_eq!(array.state(), ArrayState::Online);
}

#[tokio::test]
async fn a_block_that_fails_the_check_is_rebuilt_from_the_other_columns() {
    let devices: Vec<Faulty> = (0..6).map(faulty).collect();
    let array = raid6(&devices).await;
    let data = fill(&array, 10, 8).await;
    devices[2].fail_at_rate(1.0, 1.0).await;
    // Silently damage a data block on another member of row 3.
    let geometry = array.geometry();
    let row = 3;
    let block = geometry.prefix_blocks + row * array.row_data_blocks();
    let expected = data[block as usize * BLOCK..(block as usize + 1) * BLOCK].to_vec();
    let member_offset =
        (lamina_layout::LABEL_AREA_BLOCKS + geometry.prefix_blocks + row) * BLOCK as u64;
    let holder = (0..6)
        .filter(|index| *index != 2)
        .find(|index| {
            let mut stored = vec![0; BLOCK];
            devices[*index]
                .inner()
                .read_sync(member_offset, &mut stored);
            stored == expected
        })
        .expect("a member holds the block");
    devices[holder]
        .flip_bit(member_offset + 7, 3)
        .await
        .unwrap();
    let expected_checksum = crc32c::crc32c(&expected);
    let check = move |at: u64, contents: &[u8]| {
        at != block || crc32c::crc32c(contents) == expected_checksum
    };
    let new = faulty(17);
    array
        .begin_replacement(&path(2), member("/test/new".into(), &new))
        .await
        .unwrap();
    let report = array
        .rebuild_range(0, data.len() as u64, &check)
        .await
        .unwrap();
    assert_eq!(report.blocks_unrepairable, 0);
    array.finish_rebuild().await.unwrap();
    // With the damaged member also lost, the row still reads right: the new
    // device's column was rebuilt from good data.
    devices[holder].fail_at_rate(1.0, 1.0).await;
    assert_eq!(read_all(&array, data.len()).await, data);
}

/// A member device that yields to the runtime before every read and
/// write, so that a rebuild step and client writes interleave at every
/// device request, as they do on real devices.
struct Yielding {
    inner: Faulty,
}

#[async_trait::async_trait]
impl BlockDevice for Yielding {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        lamina_device::DeviceReadFuture::from_or_box(async move {
            tokio::task::yield_now().await;
            self.inner.read(offset, length).await
        })
    }
    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        tokio::task::yield_now().await;
        self.inner.write(offset, data).await
    }
    async fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush().await
    }
}

/// Rows a writer rewrites at once, and the rewrites of each writer.
const REWRITE_ROWS: u64 = 3;
const REWRITES_PER_WRITER: u64 = 40;

/// Rewrites whole rows at random, over and over, while a rebuild runs;
/// returns what it wrote last at each row (its own rows only: writer `w`
/// takes the groups `g` with `g % writers == w`).
async fn rewrite_rows(
    array: Arc<RedundantArray>,
    seed: u64,
    writers: u64,
    group_count: u64,
) -> Vec<(u64, Vec<u8>)> {
    let writer = seed % 16;
    let mut random = rand::rngs::SmallRng::seed_from_u64(100 + seed);
    let group_blocks = REWRITE_ROWS * array.row_data_blocks();
    let mut last = std::collections::BTreeMap::new();
    for round in 0..REWRITES_PER_WRITER {
        let group = random.random_range(0..group_count / writers) * writers + writer;
        let first_block = PREFIX_BLOCKS + group * group_blocks;
        let contents = random_blocks(group_blocks as usize, 1000 * seed + round);
        array
            .write(
                first_block * BLOCK as u64,
                Arc::new(AlignedBuffer::from_slice_padded(&contents)),
            )
            .await
            .unwrap();
        last.insert(first_block, contents);
    }
    last.into_iter().collect()
}

/// Client writes of the very rows a rebuild step is rebuilding, all through
/// the rebuild: every row the rebuild wrote onto the replacement before a
/// write must be replaced by that write, never the other way round (the
/// step holds its rows; decision 0043). With the replacement in place and
/// two other members lost, every block reads back as last written.
/// Each run interleaves differently; without the row locks about one run
/// in five fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_of_the_rows_a_rebuild_step_holds_are_never_undone_by_it() {
    for seed in 0..INTERLEAVED_RUNS {
        rebuild_under_rewrites(seed).await;
    }
}

/// Runs of the test above.
const INTERLEAVED_RUNS: u64 = 20;

async fn rebuild_under_rewrites(seed: u64) {
    let devices: Vec<Faulty> = (0..6).map(|index| faulty(seed * 16 + index)).collect();
    let yielding = |path: String, device: &Faulty| MemberDevice {
        path,
        device: Arc::new(Yielding {
            inner: device.clone(),
        }) as Arc<dyn BlockDevice>,
    };
    let members = devices
        .iter()
        .enumerate()
        .map(|(index, device)| yielding(path(index), device))
        .collect();
    let array = Arc::new(raid6_over(members).await);
    let group_count = 60;
    let mut data = fill(&array, group_count * REWRITE_ROWS, seed).await;
    devices[2].fail_at_rate(1.0, 1.0).await;
    let new = faulty(12);
    array
        .begin_replacement(&path(2), yielding("/test/new".into(), &new))
        .await
        .unwrap();
    let writers = 4;
    let rewrites: Vec<_> = (0..writers)
        .map(|writer| {
            tokio::spawn(rewrite_rows(
                array.clone(),
                seed * 16 + writer,
                writers,
                group_count,
            ))
        })
        .collect();
    rebuild_everything(&array, data.len() as u64).await;
    for rewrite in rewrites {
        for (first_block, contents) in rewrite.await.unwrap() {
            let start = first_block as usize * BLOCK;
            data[start..start + contents.len()].copy_from_slice(&contents);
        }
    }
    devices[0].fail_at_rate(1.0, 1.0).await;
    devices[4].fail_at_rate(1.0, 1.0).await;
    assert_eq!(
        read_all(&array, data.len()).await,
        data,
        "run {seed}: the rebuilt member holds every write"
    );
}

/// A replacement whose writes each take `write_ms` (of paused test time):
/// a rebuild paced so slowly that a record every
/// `REBUILD_PERSIST_ROWS` rows alone would never come.
struct SlowWrites {
    inner: Faulty,
    write_ms: u64,
}

#[async_trait::async_trait]
impl BlockDevice for SlowWrites {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        self.inner.read(offset, length)
    }
    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        tokio::time::sleep(std::time::Duration::from_millis(self.write_ms)).await;
        self.inner.write(offset, data).await
    }
    async fn flush(&self) -> Result<(), DeviceError> {
        self.inner.flush().await
    }
}

/// The persist interval of `lamina_layout`'s replace.rs
/// (`REBUILD_PERSIST_INTERVAL_MS`): progress is recorded at least this
/// often while rows are rebuilt, however few.
const PERSIST_INTERVAL_MS: u64 = 1_000;
/// Rows one rebuild step holds (`REBUILD_ROWS_PER_STEP`).
const ROWS_PER_STEP: u64 = 64;

/// Progress is recorded by time as well as by rows: with a step taking
/// 400 ms, the label records the rows done within three steps of the
/// interval passing, long before `REBUILD_PERSIST_ROWS` (4096) rows, and a
/// crash then costs at most the rows rebuilt since (issue 42: a paced
/// rebuild restarted five times resumed from the same first record).
#[tokio::test(start_paused = true)]
async fn rebuild_progress_is_recorded_by_time_as_well_as_by_rows() {
    let write_ms = 400;
    let devices: Vec<Faulty> = (0..6).map(faulty).collect();
    let array = raid6(&devices).await;
    let rows = 300;
    let data = fill(&array, rows, 9).await;
    array.flush().await.unwrap();
    devices[1].fail_at_rate(1.0, 1.0).await;
    let new = faulty(18);
    let slow = MemberDevice {
        path: "/test/new".into(),
        device: Arc::new(SlowWrites {
            inner: new.clone(),
            write_ms,
        }),
    };
    array.begin_replacement(&path(1), slow).await.unwrap();
    let accept = |_: u64, _: &[u8]| true;
    let started = tokio::time::Instant::now();
    array
        .rebuild_range(0, data.len() as u64, &accept)
        .await
        .unwrap();
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let recorded = lamina_layout::read_label(new.as_ref())
        .await
        .unwrap()
        .rebuilding_rows_done
        .expect("still a replacement");
    let rows_done = array.member_status()[1]
        .replacement
        .as_ref()
        .unwrap()
        .rows_done;
    assert_eq!(rows_done, rows);
    // Rows rebuilt since the last record: at most what the steps of one
    // interval (and the step that crossed it) hold.
    let steps_per_interval = PERSIST_INTERVAL_MS.div_ceil(write_ms);
    let unrecorded_rows_max = (steps_per_interval + 1) * ROWS_PER_STEP;
    assert!(
        elapsed_ms > 2 * PERSIST_INTERVAL_MS,
        "the rebuild took {elapsed_ms} ms"
    );
    assert!(
        recorded > 0 && rows_done - recorded <= unrecorded_rows_max,
        "{rows_done} rows done in {elapsed_ms} ms, {recorded} recorded"
    );
    array.finish_rebuild().await.unwrap();
    devices[0].fail_at_rate(1.0, 1.0).await;
    devices[2].fail_at_rate(1.0, 1.0).await;
    assert_eq!(read_all(&array, data.len()).await, data);
}
