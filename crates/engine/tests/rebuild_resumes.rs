//! A replacement rebuild cut again and again (the pool dropped mid-rebuild
//! with its devices' power cut, as `kill -9` of the daemon during `device
//! replace --wait` leaves them) resumes where its label says, each time:
//! after every restart the rebuild starts at the row last recorded, the
//! rows rebuilt again are bounded by how often progress is recorded, the
//! rows the replacement already holds pass at once without being paced (or
//! counted in the rate) by the background budget, the progress total stays
//! the real total, and every byte reads back exact through the rebuilt
//! device with two other members gone (issue 42, item 8).

#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;
use std::time::Duration;

use lamina_device::{BlockDevice, FaultyDevice, MemoryDevice, PowerCutStyle};
use lamina_engine::log::geometry::DATA_START_BLOCK;
use lamina_engine::{Pool, PoolLimits, PoolOptions, RebuildState, RebuildStatus, TestHooks};
use lamina_layout::{
    ArrayIdentity, MemberDevice, Redundancy, RedundantArray, TierRole, assemble, create_zoned,
    read_label,
};
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;
const MEMBER_COUNT: usize = 6;
const MEMBER_BYTES: u64 = 24 << 20;
/// Four data blocks per row: 64 KiB segments are 4 whole rows of 4 blocks.
const SEGMENT_BYTES: u64 = 64 << 10;
const VOLUME_BYTES: usize = 12 << 20;
/// Written in pieces of this size.
const WRITE_BYTES: usize = 1 << 20;
/// The member replaced, and the index of its replacement among the devices.
const REPLACED: usize = 2;
const REPLACEMENT: usize = MEMBER_COUNT;
/// Rows between two records of progress (the array's default is 4096 rows
/// or a second, whichever comes first): small, so that every cut lands a
/// few records into a run.
const PERSIST_ROWS: u64 = 32;
/// Rows of the engine's rebuild step (`REBUILD_STEP_BYTES_MAX`, 1 MiB, over
/// four data columns): a step under way when the pool is dropped is not
/// counted in its run's progress.
const ENGINE_STEP_ROWS: u64 = (1 << 20) / (4 * BLOCK as u64);
/// Rows a restart may rebuild again, at most: those since the last record,
/// and the step under way.
const REDONE_ROWS_MAX: u64 = PERSIST_ROWS + ENGINE_STEP_ROWS;
/// Times the rebuild is cut.
const RESTARTS: usize = 5;
/// How long a run may take to reach its cut or its end, at most.
const RUN_WAIT_MS_MAX: u64 = 60_000;
/// The background budget's ceiling: slow enough that the pacing of a
/// resumed rebuild shows, fast enough for a short test.
const BACKGROUND_BYTES_PER_SECOND_MAX: u64 = 64 << 20;

/// The members and the replacement: memory that outlives power cuts, and
/// the fault-injecting wrappers of the current power-on.
struct Devices {
    memories: Vec<Arc<MemoryDevice>>,
    faulty: Vec<Arc<FaultyDevice<MemoryDevice>>>,
}

impl Devices {
    fn new() -> Self {
        let memories = (0..=MEMBER_COUNT)
            .map(|_| Arc::new(MemoryDevice::new(MEMBER_BYTES)))
            .collect();
        let mut devices = Self {
            memories,
            faulty: Vec::new(),
        };
        devices.power_on(0);
        devices
    }

    fn power_on(&mut self, seed: u64) {
        self.faulty = self
            .memories
            .iter()
            .enumerate()
            .map(|(index, memory)| Arc::new(FaultyDevice::new(memory.clone(), seed + index as u64)))
            .collect();
    }

    /// Every device loses what it was not asked to flush, and serves
    /// nothing more until the next power-on.
    async fn power_cut(&self) {
        for device in &self.faulty {
            device.power_cut(PowerCutStyle::DropAll).await.unwrap();
        }
    }

    fn device(&self, index: usize) -> MemberDevice {
        MemberDevice {
            path: format!("/test/device{index}"),
            device: self.faulty[index].clone() as Arc<dyn BlockDevice>,
        }
    }
}

fn limits() -> PoolLimits {
    PoolLimits {
        test_hooks: TestHooks::without_periodic_flush_and_checkpoint(),
        background_bytes_per_second_max: Some(BACKGROUND_BYTES_PER_SECOND_MAX),
        memory_cache_bytes: 0,
        rebuild_automatic: false,
        ..PoolLimits::default()
    }
}

/// A pool on a zoned raid6 array of the six members, with a volume full of
/// random bytes, flushed.
async fn pool_with_data(devices: &Devices) -> Filled {
    let identity = ArrayIdentity {
        array_identifier: 42,
        tier: TierRole::Flash,
    };
    let members = (0..MEMBER_COUNT)
        .map(|index| devices.device(index))
        .collect();
    let array = create_zoned(
        identity,
        Redundancy::Raid6,
        DATA_START_BLOCK,
        SEGMENT_BYTES / BLOCK as u64,
        members,
    )
    .await
    .unwrap();
    let array = Arc::new(array);
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_BYTES,
        flash_row_blocks: array.row_data_blocks(),
        ..PoolOptions::default()
    };
    let pool = Pool::create(array.clone(), options, limits())
        .await
        .unwrap();
    let volume_id = pool
        .create_volume("v", VOLUME_BYTES as u64)
        .await
        .unwrap()
        .volume_id;
    let mut contents = vec![0_u8; VOLUME_BYTES];
    rand::rngs::SmallRng::seed_from_u64(42).fill(&mut contents[..]);
    for (index, piece) in contents.chunks(WRITE_BYTES).enumerate() {
        let offset = (index * WRITE_BYTES) as u64;
        pool.write(volume_id, offset, piece, false).await.unwrap();
    }
    pool.flush().await.unwrap();
    pool.checkpoint().await.unwrap();
    Filled {
        pool,
        array,
        volume_id,
        contents,
    }
}

/// A pool with data, and what the data is.
struct Filled {
    pool: Pool,
    array: Arc<RedundantArray>,
    volume_id: u32,
    contents: Vec<u8>,
}

/// The rows the replacement holds (in memory: recorded or not).
fn rows_done(array: &RedundantArray) -> u64 {
    array.member_status()[REPLACED]
        .replacement
        .as_ref()
        .map_or(0, |replacement| replacement.rows_done)
}

/// Lets the rebuild run until the replacement holds `rows` rows (or the
/// rebuild ends); returns its status then.
async fn run_until(pool: &Pool, array: &RedundantArray, rows: u64) -> RebuildStatus {
    for _ in 0..RUN_WAIT_MS_MAX {
        let status = pool.rebuild_status();
        let ended = status.state != RebuildState::Rebuilding && !pool.rebuild_pending();
        if ended || rows_done(array) >= rows {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("the rebuild neither reached row {rows} nor ended");
}

/// What the cut runs did, for the checks against the uninterrupted one.
#[derive(Default)]
struct Runs {
    /// Rows each run rebuilt and checked (a step under way at the cut not
    /// counted).
    rows_verified: Vec<u64>,
    /// Each run's progress total.
    bytes_total: Vec<u64>,
}

/// The pool dropped with its devices' power cut, the array assembled again
/// and the pool opened (which resumes the rebuild). Checks that the rebuild
/// resumes at the row last recorded and that the rows lost are bounded.
async fn cut_and_restart(
    devices: &mut Devices,
    pool: Pool,
    cycle: usize,
) -> (Pool, Arc<RedundantArray>) {
    assert_eq!(
        pool.rebuild_status().state,
        RebuildState::Rebuilding,
        "cut {cycle}"
    );
    pool.abandon();
    drop(pool);
    devices.power_cut().await;
    devices.power_on(100 * (cycle as u64 + 1));
    let recorded = read_label(devices.faulty[REPLACEMENT].as_ref())
        .await
        .unwrap()
        .rebuilding_rows_done
        .expect("still a replacement");
    let offered = (0..=MEMBER_COUNT)
        .map(|index| devices.device(index))
        .collect();
    let assembled = assemble(TierRole::Flash, offered).await.unwrap();
    assert!(assembled.excluded.is_empty(), "{:?}", assembled.excluded);
    let array = Arc::new(assembled.array);
    array.set_rebuild_persist_rows(PERSIST_ROWS);
    assert_eq!(
        rows_done(&array),
        recorded,
        "cut {cycle}: the rebuild resumes at the row its label records"
    );
    let pool = Pool::open(array.clone(), limits()).await.unwrap();
    pool.start_rebuild();
    (pool, array)
}

#[tokio::test(flavor = "current_thread")]
async fn a_rebuild_cut_five_times_resumes_where_it_was_each_time() {
    let mut devices = Devices::new();
    let Filled {
        pool,
        array,
        volume_id,
        contents,
    } = pool_with_data(&devices).await;
    let old = format!("/test/device{REPLACED}");
    array.set_rebuild_persist_rows(PERSIST_ROWS);
    array
        .begin_replacement(&old, devices.device(REPLACEMENT))
        .await
        .unwrap();
    pool.start_rebuild();
    // The rows of the volume, spread over the cuts.
    let rows_total = (VOLUME_BYTES / (4 * BLOCK)) as u64;
    let rows_per_run = rows_total / (RESTARTS as u64 + 1);
    let mut runs = Runs::default();
    let mut recorded_before = 0;
    let (mut pool, mut array) = (pool, array);
    for cycle in 0..RESTARTS {
        let target = rows_done(&array) + rows_per_run;
        let status = run_until(&pool, &array, target).await;
        runs.rows_verified.push(status.rows_verified);
        runs.bytes_total.push(status.bytes_total);
        let reached = rows_done(&array);
        (pool, array) = cut_and_restart(&mut devices, pool, cycle).await;
        let resumed = rows_done(&array);
        assert!(
            resumed >= recorded_before,
            "cut {cycle}: resumed at row {resumed}, below row {recorded_before} recorded before"
        );
        assert!(
            reached - resumed <= REDONE_ROWS_MAX,
            "cut {cycle}: row {reached} reached, resumed at row {resumed}"
        );
        recorded_before = resumed;
    }
    let last = finish(&pool, &array).await;
    runs.rows_verified.push(last.rows_verified);
    runs.bytes_total.push(last.bytes_total);
    check_last_run(&pool, &last);
    check_contents(&devices, &pool, volume_id, &contents).await;
    check_against_an_uninterrupted_rebuild(&pool, &array, &runs).await;
}

/// Waits for the resumed rebuild's end and returns its status.
async fn finish(pool: &Pool, array: &RedundantArray) -> RebuildStatus {
    let status = run_until(pool, array, u64::MAX).await;
    assert_eq!(status.state, RebuildState::Finished, "{status:?}");
    assert!(!pool.rebuild_pending());
    assert_eq!(
        array.member_status()[REPLACED].path,
        format!("/test/device{REPLACEMENT}")
    );
    status
}

/// The last run passed what the replacement held without work and without
/// pacing: the budget granted only the bytes it rebuilt.
fn check_last_run(pool: &Pool, last: &RebuildStatus) {
    assert_eq!(last.bytes_done, last.bytes_total, "{last:?}");
    assert!(last.bytes_skipped > 0, "{last:?}");
    let granted = pool.status().background.granted_bytes.rebuild;
    assert_eq!(
        granted,
        last.bytes_total - last.bytes_skipped,
        "the budget paced only the bytes rebuilt: {last:?}"
    );
}

/// The same member replaced again, uninterrupted (two other members lost
/// by now: rebuilt from the four left): the real amount. Every
/// cut run's total was the real total, and the cut runs together rebuilt
/// no row less than it (but for the steps cut) and at most
/// `REDONE_ROWS_MAX` rows more per cut.
async fn check_against_an_uninterrupted_rebuild(pool: &Pool, array: &RedundantArray, runs: &Runs) {
    let again = MemberDevice {
        path: "/test/again".into(),
        device: Arc::new(MemoryDevice::new(MEMBER_BYTES)) as Arc<dyn BlockDevice>,
    };
    array
        .begin_replacement(&format!("/test/device{REPLACEMENT}"), again)
        .await
        .unwrap();
    let real = pool.rebuild().await.unwrap();
    assert_eq!(real.bytes_skipped, 0, "{real:?}");
    for (run, total) in runs.bytes_total.iter().enumerate() {
        assert_eq!(*total, real.bytes_total, "run {run}'s total");
    }
    // A cut run's progress leaves out its step under way, whose rows may
    // have been recorded meanwhile (the array records within a step): they
    // count in no run.
    let rebuilt: u64 = runs.rows_verified.iter().sum();
    let uncounted_max = RESTARTS as u64 * ENGINE_STEP_ROWS;
    let redone_max = RESTARTS as u64 * REDONE_ROWS_MAX;
    assert!(
        rebuilt + uncounted_max >= real.rows_verified && rebuilt <= real.rows_verified + redone_max,
        "{rebuilt} rows rebuilt over the runs ({:?}), {} uninterrupted, at most {redone_max} redone",
        runs.rows_verified,
        real.rows_verified
    );
}

/// Every byte reads back with two other members gone: the rebuilt columns
/// carry their weight.
async fn check_contents(devices: &Devices, pool: &Pool, volume_id: u32, contents: &[u8]) {
    for lost in [0, 4] {
        devices.faulty[lost].fail_at_rate(1.0, 1.0).await;
    }
    let mut read = vec![0_u8; contents.len()];
    pool.read(volume_id, 0, &mut read).await.unwrap();
    assert!(read == contents, "the volume reads back exact");
}
