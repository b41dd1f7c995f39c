//! Crash consistency of the engine over an object-store capacity tier: a
//! two-tier pool whose flash region (24 segments) is small enough that the
//! cleaner demotes constantly, over `ConcatenatedDevice(flash,
//! ObjectStoreDevice)`, the tier kept in object_store's in-memory store behind
//! a test wrapper ([`SwitchedStore`]) that can refuse every request from one
//! device instance on. A power cut stops both at the same instant: the flash
//! keeps, drops or tears its unflushed writes, and the tier's store takes no
//! further request from the dead instance (a request in flight at the cut
//! lands whole at once, lands only after the next instance opened the tier —
//! as a real server may complete a dead process's request late — or not at
//! all); the pool is then reopened over a fresh wrapper on the same store and
//! compared block by block with the shared shadow model (`common/shadow.rs`),
//! the late requests land, and the next cut's recovery is compared again. A second test takes the store away for a while
//! without a power cut (failing every request, or half of them) and checks
//! that after it returns and the pool is reopened, every block holds what was
//! flushed before, or something written since, never older data. A third
//! (decision 0032) takes it away after data was demoted, with an upload
//! waiting: clients' writes and flushes must go on succeeding on flash,
//! reads return the right data or an error, and then the power goes (every
//! flushed block must survive) or the store returns (the tier's writes and
//! demotion resume). A fourth (issue 42, item 10) loses the flash device
//! at a cut, after a store outage in half the runs, and restores the pool
//! from the tier alone: the volume must read as of one point of its history
//! (each block the write it held then, or lost), never a mix of two.
//! Seeds: half of `LAMINA_CRASH_RUNS` (default 1000) for power cuts, a fifth
//! each for outages and for the store down, a tenth for restores;
//! `LAMINA_CRASH_FIRST_SEED` is the first.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::ops::Range;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use lamina_device::{BlockDevice, ConcatenatedDevice, FaultyDevice, MemoryDevice, PowerCutStyle};
use lamina_engine::log::geometry::CAPACITY_DATA_START_BLOCKS;
use lamina_engine::{
    BLOCK_SIZE_BYTES, EngineError, FlashRestore, IoError, Pool, PoolLimits, PoolOptions,
};
use lamina_objects::{ObjectStoreDevice, ObjectStoreLimits, TierGeometry, TierLocation};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    ObjectStoreExt, PutMultipartOptions, PutOptions, PutPayload, PutResult,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

mod common;

use common::shadow::{
    approach_the_cut, check_recovered, crash_runs, create_volumes, first_seed, limits,
    run_operations,
};

const SEGMENT_BYTES: u64 = 64 << 10;
/// The flash device: metadata and 24 segments, so that the cleaner demotes
/// constantly.
const FLASH_BYTES: u64 = (4 << 20) + 24 * SEGMENT_BYTES;
/// The object tier: the capacity device's 1 MiB label, then 104 segments.
const TIER_BYTES: u64 = (1 << 20) + 104 * SEGMENT_BYTES;
/// Scheduler turns a store request stays in flight before it reaches the
/// store, at most: long enough for a power cut to land in between.
const IN_FLIGHT_TURNS_MAX: usize = 3;
/// Blocks of the volume of the outage test: half the flash region, so that
/// cleaning demotes.
const OUTAGE_VOLUME_BLOCKS: usize = 192;
const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// What a [`SwitchedStore`] does with requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum StoreMode {
    Serving = 0,
    /// Half the requests fail (decided per request).
    Flaky = 1,
    /// Every request fails: the store is unreachable, or (for good) the
    /// device instance using it is dead.
    Refusing = 2,
}

/// The switch of one device instance's view of the store, and what it did.
#[derive(Default)]
struct StoreSwitch {
    mode: AtomicU8,
    /// Requests refused, and requests in flight when the mode changed that
    /// landed anyway (their caller was told they failed).
    refused: AtomicU64,
    landed_unseen: AtomicU64,
    /// Requests in flight at a cut that land after the next open.
    deferred: AtomicU64,
    /// Requests admitted and not finished.
    in_flight: AtomicU64,
}

/// A request admitted to the store, until it finishes (or its future is
/// dropped).
struct InFlight(Arc<StoreSwitch>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl StoreSwitch {
    fn set(&self, mode: StoreMode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// Waits until no request of this instance is in flight: after a cut,
    /// every request in flight at it has landed or not before the pool is
    /// reopened (nothing of a dead process lands later).
    async fn settled(&self) {
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            tokio::task::yield_now().await;
        }
    }

    fn mode(&self) -> StoreMode {
        match self.mode.load(Ordering::SeqCst) {
            0 => StoreMode::Serving,
            1 => StoreMode::Flaky,
            _ => StoreMode::Refusing,
        }
    }
}

/// Whether a request reaches the store and its caller hears the result.
enum Fate {
    Reaches,
    /// The request lands, but the switch changed while it was in flight:
    /// the caller is told it failed.
    LandsUnseen,
    /// The switch changed while it was in flight: the caller is told it
    /// failed, and it lands (a PUT or a DELETE) only when
    /// [`LateRequests::land_all`] says so.
    LandsLate,
}

/// Requests of dead device instances held until the next instance has
/// opened the tier, then landed.
struct LateRequests {
    release: tokio::sync::watch::Sender<u64>,
    waiting: AtomicU64,
    landed: AtomicU64,
}

impl Default for LateRequests {
    fn default() -> Self {
        Self {
            release: tokio::sync::watch::Sender::new(0),
            waiting: AtomicU64::new(0),
            landed: AtomicU64::new(0),
        }
    }
}

impl LateRequests {
    /// Runs `request` at the next [`LateRequests::land_all`].
    fn defer(self: &Arc<Self>, request: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut release = self.release.subscribe();
        let now = *release.borrow();
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let this = self.clone();
        tokio::spawn(async move {
            release
                .wait_for(|released| *released > now)
                .await
                .expect("the sender lives as long as the media");
            request.await;
            this.landed.fetch_add(1, Ordering::SeqCst);
            this.waiting.fetch_sub(1, Ordering::SeqCst);
        });
    }

    /// Lands every request held so far and waits until they did.
    async fn land_all(&self) {
        self.release.send_modify(|released| *released += 1);
        while self.waiting.load(Ordering::SeqCst) > 0 {
            tokio::task::yield_now().await;
        }
    }
}

/// An [`ObjectStore`] over a shared [`InMemory`] that one device instance
/// uses; its switch refuses that instance's requests (a dead process's, or
/// all of them while the store is away) while a new wrapper over the same
/// store serves the next instance.
#[derive(Clone)]
struct SwitchedStore {
    inner: Arc<InMemory>,
    switch: Arc<StoreSwitch>,
    late: Arc<LateRequests>,
    random: Arc<Mutex<SmallRng>>,
}

impl std::fmt::Debug for SwitchedStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "SwitchedStore({:?})", self.switch.mode())
    }
}

impl std::fmt::Display for SwitchedStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "SwitchedStore")
    }
}

fn refused_error(operation: &str) -> object_store::Error {
    object_store::Error::Generic {
        store: "SwitchedStore",
        source: Box::new(std::io::Error::other(format!(
            "{operation}: the store refuses this device instance's requests"
        ))),
    }
}

impl SwitchedStore {
    fn new(
        inner: Arc<InMemory>,
        switch: Arc<StoreSwitch>,
        late: Arc<LateRequests>,
        seed: u64,
    ) -> Self {
        Self {
            inner,
            switch,
            late,
            random: Arc::new(Mutex::new(SmallRng::seed_from_u64(seed))),
        }
    }

    fn refuses_now(&self) -> bool {
        match self.switch.mode() {
            StoreMode::Serving => false,
            StoreMode::Flaky => self.random.lock().unwrap().random_bool(0.5),
            StoreMode::Refusing => true,
        }
    }

    /// Refused at once if the switch says so; otherwise in flight for a few
    /// turns, and if the switch changed meanwhile, it lands or not at random
    /// (its caller is told it failed either way).
    async fn fate(&self, operation: &str) -> Result<(Fate, InFlight), object_store::Error> {
        if self.refuses_now() {
            self.switch.refused.fetch_add(1, Ordering::Relaxed);
            return Err(refused_error(operation));
        }
        self.switch.in_flight.fetch_add(1, Ordering::SeqCst);
        let in_flight = InFlight(self.switch.clone());
        let turns = self
            .random
            .lock()
            .unwrap()
            .random_range(0..=IN_FLIGHT_TURNS_MAX);
        for _ in 0..turns {
            tokio::task::yield_now().await;
        }
        if self.switch.mode() == StoreMode::Serving {
            return Ok((Fate::Reaches, in_flight));
        }
        let choice = self.random.lock().unwrap().random_range(0..3);
        if choice == 0 {
            self.switch.landed_unseen.fetch_add(1, Ordering::Relaxed);
            Ok((Fate::LandsUnseen, in_flight))
        } else if choice == 1 {
            self.switch.deferred.fetch_add(1, Ordering::Relaxed);
            Ok((Fate::LandsLate, in_flight))
        } else {
            self.switch.refused.fetch_add(1, Ordering::Relaxed);
            Err(refused_error(operation))
        }
    }
}

#[async_trait]
impl ObjectStore for SwitchedStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        options: PutOptions,
    ) -> object_store::Result<PutResult> {
        let (fate, _in_flight) = self.fate("put").await?;
        if let Fate::LandsLate = fate {
            let (inner, location) = (self.inner.clone(), location.clone());
            self.late.defer(async move {
                let _ = inner.put_opts(&location, payload, options).await;
            });
            return Err(refused_error("put"));
        }
        let result = self.inner.put_opts(location, payload, options).await;
        match fate {
            Fate::Reaches => result,
            Fate::LandsUnseen | Fate::LandsLate => Err(refused_error("put")),
        }
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        options: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        // The tier never uploads in parts; refused like the rest when off.
        if self.refuses_now() {
            return Err(refused_error("put multipart"));
        }
        self.inner.put_multipart_opts(location, options).await
    }

    async fn get_opts(
        &self,
        location: &Path,
        options: GetOptions,
    ) -> object_store::Result<GetResult> {
        let (fate, _in_flight) = self.fate("get").await?;
        match fate {
            Fate::Reaches => self.inner.get_opts(location, options).await,
            Fate::LandsUnseen | Fate::LandsLate => Err(refused_error("get")),
        }
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        let this = self.clone();
        locations
            .then(move |location| {
                let this = this.clone();
                async move {
                    let location = location?;
                    let (fate, _in_flight) = this.fate("delete").await?;
                    if let Fate::LandsLate = fate {
                        let (inner, location) = (this.inner.clone(), location.clone());
                        this.late.defer(async move {
                            let _ = inner.delete(&location).await;
                        });
                        return Err(refused_error("delete"));
                    }
                    this.inner.delete(&location).await?;
                    match fate {
                        Fate::Reaches => Ok(location),
                        Fate::LandsUnseen | Fate::LandsLate => Err(refused_error("delete")),
                    }
                }
            })
            .boxed()
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let this = self.clone();
        let prefix = prefix.cloned();
        futures::stream::once(async move {
            match this.fate("list").await {
                Ok((Fate::Reaches, _)) => this.inner.list(prefix.as_ref()),
                Ok((Fate::LandsUnseen | Fate::LandsLate, _)) => {
                    futures::stream::once(async { Err(refused_error("list")) }).boxed()
                }
                Err(error) => futures::stream::once(async { Err(error) }).boxed(),
            }
        })
        .flatten()
        .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        let (fate, _in_flight) = self.fate("list").await?;
        match fate {
            Fate::Reaches => self.inner.list_with_delimiter(prefix).await,
            Fate::LandsUnseen | Fate::LandsLate => Err(refused_error("list")),
        }
    }

    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: CopyOptions,
    ) -> object_store::Result<()> {
        let (fate, _in_flight) = self.fate("copy").await?;
        let result = self.inner.copy_opts(from, to, options).await;
        match fate {
            Fate::Reaches => result,
            Fate::LandsUnseen | Fate::LandsLate => Err(refused_error("copy")),
        }
    }
}

/// The tier's place in the store, with limits picked per run: one part per
/// run or runs cut into small parts, and one to four requests at a time.
fn tier_location(rng: &mut SmallRng) -> TierLocation {
    let part_bytes_max = [16 << 20, 64 << 10, 16 << 10, 4 << 10][rng.random_range(0..4)];
    TierLocation {
        bucket: "crash".to_string(),
        prefix: "pool/capacity".to_string(),
        limits: ObjectStoreLimits {
            requests_in_flight_max: rng.random_range(1..=4),
            part_bytes_max,
            delete_batch_objects_max: rng.random_range(1..=8),
            delete_retry_delay_ms: 5,
            ..ObjectStoreLimits::default()
        },
    }
}

/// The shared crash limits, with the memory cache off in every other pair
/// of seeds, so that reads reach the tier instead of blocks cached when
/// they were written.
fn tier_limits(seed: u64) -> PoolLimits {
    // A third of the seeds compress cold data harder as the cleaner moves
    // it into the tier (decision 0074): its new forms are replayed too.
    let shared = PoolLimits {
        cold_compression: ["off", "off", "zstd:3"][(seed % 3) as usize]
            .parse()
            .unwrap(),
        ..limits(seed)
    };
    if (seed / 4).is_multiple_of(2) {
        shared
    } else {
        PoolLimits {
            memory_cache_bytes: 0,
            ..shared
        }
    }
}

fn tier_geometry() -> TierGeometry {
    TierGeometry::new(
        TIER_BYTES,
        SEGMENT_BYTES,
        CAPACITY_DATA_START_BLOCKS * BLOCK_SIZE_BYTES,
    )
}

/// One incarnation of the pool's device: the flash behind its fault
/// injector, the tier's switch, and the two joined.
struct Incarnation {
    faulty: Arc<FaultyDevice<MemoryDevice>>,
    switch: Arc<StoreSwitch>,
    device: Arc<dyn BlockDevice>,
}

/// Everything that outlives an incarnation: the flash's memory and the store.
struct Media {
    memory: Arc<MemoryDevice>,
    store: Arc<InMemory>,
    late: Arc<LateRequests>,
    location: TierLocation,
}

impl Media {
    /// Empty flash and an empty store, with limits picked by `rng`.
    fn new(rng: &mut SmallRng) -> Self {
        Self {
            memory: Arc::new(MemoryDevice::new(FLASH_BYTES)),
            store: Arc::new(InMemory::new()),
            late: Arc::default(),
            location: tier_location(rng),
        }
    }

    async fn incarnation(&self, seed: u64, create: bool) -> Incarnation {
        let faulty = Arc::new(FaultyDevice::new(self.memory.clone(), seed));
        let (switch, tier) = self.open_tier(seed, create).await;
        let device: Arc<dyn BlockDevice> = Arc::new(ConcatenatedDevice::new(faulty.clone(), tier));
        Incarnation {
            faulty,
            switch,
            device,
        }
    }

    /// The object tier as a new device instance sees it, through a switch
    /// of its own.
    async fn open_tier(
        &self,
        seed: u64,
        create: bool,
    ) -> (Arc<StoreSwitch>, Arc<ObjectStoreDevice>) {
        let switch = Arc::new(StoreSwitch::default());
        let store: Arc<dyn ObjectStore> = Arc::new(SwitchedStore::new(
            self.store.clone(),
            switch.clone(),
            self.late.clone(),
            seed,
        ));
        let tier = if create {
            ObjectStoreDevice::create_in(store, self.location.clone(), tier_geometry()).await
        } else {
            ObjectStoreDevice::open_in(store, self.location.clone()).await
        }
        .unwrap_or_else(|error| panic!("seed {seed}: the object tier: {error}"));
        (switch, tier)
    }

    async fn create_pool(&self, seed: u64) -> (Pool, Incarnation) {
        let incarnation = self.incarnation(seed, true).await;
        let options = PoolOptions {
            segment_size_bytes: SEGMENT_BYTES,
            force: false,
            flash_region_bytes: Some(FLASH_BYTES),
            ..PoolOptions::default()
        };
        let pool = Pool::create(incarnation.device.clone(), options, tier_limits(seed))
            .await
            .expect("create");
        (pool, incarnation)
    }

    async fn open_pool(&self, seed: u64) -> (Pool, Incarnation) {
        let incarnation = self.incarnation(seed, false).await;
        let pool = Pool::open(incarnation.device.clone(), tier_limits(seed))
            .await
            .unwrap_or_else(|error| panic!("seed {seed}: recovery failed: {error}"));
        (pool, incarnation)
    }

    /// Objects in the store, the tier's label included.
    async fn object_count(&self) -> usize {
        self.store.list(None).count().await
    }
}

impl Incarnation {
    /// The power goes: the store hears nothing more from this instance and
    /// the flash keeps, drops or tears its unflushed writes, at one instant
    /// (neither awaits anything another task could run in).
    async fn power_cut(&self, style: PowerCutStyle) {
        self.switch.set(StoreMode::Refusing);
        self.faulty.power_cut(style).await.expect("power cut");
    }

    /// Before the next incarnation starts: the requests in flight at the
    /// cut have landed or not.
    async fn settled(&self) {
        self.switch.settled().await;
    }
}

/// What the crash runs did, so that the test can show they proved something.
#[derive(Default, Debug)]
struct CrashTally {
    promoted_blocks: u64,
    demoted_blocks: u64,
    /// Store requests refused at a cut, and in flight at one that landed.
    requests_refused: u64,
    requests_landed_unseen: u64,
    /// Requests in flight at a cut that landed after the next open.
    requests_landed_late: u64,
    /// Cuts during a checkpoint.
    cuts_during_checkpoint: u64,
    /// Part objects in the stores at the runs' ends.
    objects_left: usize,
    /// Blocks found stored as fragments on the tier after the cuts
    /// (compressing volumes, decision 0074).
    tier_fragments_recovered: u64,
}

/// Creates the volume "alpha" of `blocks` blocks with a random codec: a
/// two-tier pool takes one, and the tier then holds fragments (issue 44,
/// decision 0074).
async fn create_alpha(pool: &Pool, blocks: usize, rng: &mut SmallRng) -> u32 {
    let codec = ["off", "lz4", "zstd:1"][rng.random_range(0..3)];
    pool.create_volume_with_compression("alpha", (blocks * BLOCK) as u64, codec.parse().unwrap())
        .await
        .expect("create volume")
        .volume_id
}

/// Blocks of the pool's volumes stored as fragments on the object tier.
fn tier_fragment_count(pool: &Pool) -> u64 {
    let first_tier_block = FLASH_BYTES / BLOCK_SIZE_BYTES;
    let mut count = 0;
    for volume in pool.list_volumes() {
        count += (0..volume.size_bytes / BLOCK_SIZE_BYTES)
            .filter(|block| {
                pool.location_of(volume.volume_id, *block)
                    .is_some_and(|location| {
                        location.is_fragment() && location.block() >= first_tier_block
                    })
            })
            .count() as u64;
    }
    count
}

async fn crash_run(seed: u64, tally: &mut CrashTally) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let media = Media::new(&mut rng);
    let (mut pool, mut incarnation) = media.create_pool(seed).await;
    let mut shadows = create_volumes(&pool, &mut rng).await;
    let mut names_used = 0;
    for cycle in 0..2 {
        let count = rng.random_range(5..120);
        run_operations(&pool, &mut shadows, &mut rng, count, &mut names_used).await;
        let pending = approach_the_cut(&pool, &shadows, &mut rng, cycle, seed).await;
        let checkpoint = rng.random_bool(0.5).then(|| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.checkpoint().await })
        });
        for _ in 0..rng.random_range(0..16) {
            tokio::task::yield_now().await;
        }
        incarnation.power_cut(PowerCutStyle::Random).await;
        if let Some(checkpoint) = checkpoint {
            if !checkpoint.is_finished() {
                tally.cuts_during_checkpoint += 1;
            }
            // Interrupted by the cut or done before it: either is fine.
            let _ = checkpoint.await.expect("checkpoint task");
        }
        let interrupted = match pending {
            Some(pending) => Some(pending.interrupted().await),
            None => None,
        };
        let status = pool.status();
        tally.promoted_blocks += status.promoted_blocks;
        tally.demoted_blocks += status.demoted_blocks;
        tally.requests_refused += incarnation.switch.refused.load(Ordering::Relaxed);
        tally.requests_landed_unseen += incarnation.switch.landed_unseen.load(Ordering::Relaxed);
        tally.requests_landed_late += incarnation.switch.deferred.load(Ordering::Relaxed);
        pool.abandon();
        drop(pool);
        incarnation.settled().await;
        if rng.random_bool(0.3) {
            common::corrupt_newest_checkpoint_slot(&media.memory);
        }
        (pool, incarnation) = media.open_pool(seed + 1000 * (cycle + 1)).await;
        check_recovered(&pool, &mut shadows, interrupted, seed).await;
        tally.tier_fragments_recovered += tier_fragment_count(&pool);
        // The dead instance's late requests land now, while this one runs:
        // the next cut's recovery must not see them.
        media.late.land_all().await;
    }
    let status = pool.status();
    tally.promoted_blocks += status.promoted_blocks;
    tally.demoted_blocks += status.demoted_blocks;
    pool.close().await.expect("close");
    drop(incarnation);
    // The late requests of the last cut landed while the pool ran: an open
    // after a clean close must not see them either.
    let (pool, incarnation) = media.open_pool(seed + 9000).await;
    check_recovered(&pool, &mut shadows, None, seed).await;
    pool.close().await.expect("close");
    tally.objects_left += media.object_count().await;
    drop(incarnation);
}

/// Seeded power cuts over an object tier never lose flushed data nor return
/// older data, whatever the store had taken when the power went.
#[tokio::test(flavor = "current_thread")]
async fn power_cuts_over_an_object_tier_never_lose_flushed_data() {
    let (first, runs) = (first_seed(), (crash_runs() / 2).max(1));
    let mut tally = CrashTally::default();
    for seed in first..first + runs {
        crash_run(seed, &mut tally).await;
    }
    eprintln!("{runs} runs over an object tier: {tally:?}");
    // The runs must have moved blocks into the tier and cut requests in
    // flight, or they prove nothing about it.
    assert!(tally.demoted_blocks > 0, "{tally:?}");
    assert!(tally.objects_left > runs as usize, "{tally:?}");
    assert!(runs < 20 || tally.tier_fragments_recovered > 0, "{tally:?}");
    assert!(
        runs < 200
            || (tally.requests_refused > 0
                && tally.requests_landed_unseen > 0
                && tally.requests_landed_late > 0),
        "{tally:?}"
    );
}

/// The outage test's model of its one volume: for every block, the contents
/// it may hold (index 0 the newest; the last one durable).
struct OutageShadow {
    blocks: Vec<Vec<Arc<Vec<u8>>>>,
    /// Per block, the candidates a flush keeps: 1, or more after writes
    /// that failed (which may or may not have reached the pool, so that the
    /// flush made either the failed write's contents or what came before
    /// durable).
    kept_by_flush: Vec<usize>,
}

impl OutageShadow {
    fn new() -> Self {
        Self {
            blocks: vec![vec![Arc::new(vec![0u8; BLOCK])]; OUTAGE_VOLUME_BLOCKS],
            kept_by_flush: vec![1; OUTAGE_VOLUME_BLOCKS],
        }
    }

    /// `contents` written to `block`, by a write that succeeded or not.
    fn written(&mut self, block: usize, contents: Vec<u8>, succeeded: bool) {
        self.blocks[block].insert(0, Arc::new(contents));
        self.kept_by_flush[block] = if succeeded {
            1
        } else {
            self.kept_by_flush[block] + 1
        };
    }

    fn flushed(&mut self) {
        for (candidates, kept) in self.blocks.iter_mut().zip(&self.kept_by_flush) {
            candidates.truncate(*kept);
        }
    }

    async fn check(&self, pool: &Pool, volume_id: u32, seed: u64, phase: &str) {
        let mut contents = vec![0u8; self.blocks.len() * BLOCK];
        pool.read(volume_id, 0, &mut contents)
            .await
            .unwrap_or_else(|error| panic!("seed {seed} {phase}: read failed: {error}"));
        self.compare(&contents, 0..self.blocks.len(), seed, phase);
    }

    fn compare(&self, contents: &[u8], blocks: Range<usize>, seed: u64, phase: &str) {
        for (position, block) in blocks.enumerate() {
            let actual = &contents[position * BLOCK..(position + 1) * BLOCK];
            let candidates = &self.blocks[block];
            assert!(
                candidates.iter().any(|candidate| candidate[..] == *actual),
                "seed {seed} {phase}: block {block} holds content that was never durable nor written since ({} candidates)",
                candidates.len()
            );
        }
    }
}

/// What the outage runs saw.
#[derive(Default, Debug)]
struct OutageTally {
    demoted_blocks: u64,
    flushes_failed: u64,
    reads_failed: u64,
    /// Writes that failed (a writer whose reclaim needed the capacity tier).
    writes_failed: u64,
    /// Runs whose pool refused writes after a failed flush, and runs whose
    /// pool flushed again once the store was back.
    pools_failed: u64,
    pools_recovered_without_reopen: u64,
    requests_refused: u64,
    first_flush_error: Option<String>,
    first_write_error: Option<String>,
}

/// One operation of the outage run, whose errors are expected while the
/// store is away: returns whether it succeeded.
async fn outage_operation(
    pool: &Pool,
    volume_id: u32,
    shadow: &mut OutageShadow,
    rng: &mut SmallRng,
    tally: &mut OutageTally,
    seed: u64,
) -> bool {
    match rng.random_range(0..100) {
        0..=59 => {
            let blocks = rng.random_range(1..=4);
            let first = rng.random_range(0..=OUTAGE_VOLUME_BLOCKS - blocks);
            let fill: u8 = rng.random();
            let data: Vec<u8> = (0..blocks * BLOCK)
                .map(|index| fill.wrapping_add((index / 512) as u8) | 1)
                .collect();
            let result = pool
                .write(volume_id, (first * BLOCK) as u64, &data, false)
                .await;
            // A write that failed may still have reached the pool's batches.
            for (position, block) in (first..first + blocks).enumerate() {
                let contents = data[position * BLOCK..(position + 1) * BLOCK].to_vec();
                shadow.written(block, contents, result.is_ok());
            }
            if let Err(error) = &result {
                tally.writes_failed += 1;
                tally.first_write_error.get_or_insert(error.to_string());
            }
            result.is_ok()
        }
        60..=74 => match pool.flush().await {
            Ok(()) => {
                shadow.flushed();
                true
            }
            Err(error) => {
                tally.flushes_failed += 1;
                tally.first_flush_error.get_or_insert(error.to_string());
                false
            }
        },
        75..=84 => pool.clean(4).await.is_ok(),
        85..=89 => {
            let result = pool.checkpoint().await;
            if result.is_ok() {
                shadow.flushed();
            }
            result.is_ok()
        }
        90..=94 => {
            // A read may fail while the store is away; what it returns must
            // be right.
            let first = rng.random_range(0..OUTAGE_VOLUME_BLOCKS);
            let blocks = rng.random_range(1..=(OUTAGE_VOLUME_BLOCKS - first).min(8));
            let mut contents = vec![0u8; blocks * BLOCK];
            match pool
                .read(volume_id, (first * BLOCK) as u64, &mut contents)
                .await
            {
                Ok(()) => {
                    shadow.compare(&contents, first..first + blocks, seed, "during the run");
                    true
                }
                Err(_) => {
                    tally.reads_failed += 1;
                    false
                }
            }
        }
        _ => {
            for _ in 0..rng.random_range(1..8) {
                tokio::task::yield_now().await;
            }
            true
        }
    }
}

async fn outage_run(seed: u64, tally: &mut OutageTally) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let media = Media::new(&mut rng);
    let (pool, incarnation) = media.create_pool(seed).await;
    let volume_id = create_alpha(&pool, OUTAGE_VOLUME_BLOCKS, &mut rng).await;
    let mut shadow = OutageShadow::new();
    // Before the outage everything succeeds.
    for _ in 0..rng.random_range(50..400) {
        let succeeded =
            outage_operation(&pool, volume_id, &mut shadow, &mut rng, tally, seed).await;
        assert!(
            succeeded,
            "seed {seed}: an operation failed before the outage"
        );
    }
    let mode = if rng.random_bool(0.5) {
        StoreMode::Refusing
    } else {
        StoreMode::Flaky
    };
    incarnation.switch.set(mode);
    for _ in 0..rng.random_range(10..150) {
        outage_operation(&pool, volume_id, &mut shadow, &mut rng, tally, seed).await;
    }
    incarnation.switch.set(StoreMode::Serving);
    // The store is back: the pool (failed or not) still serves reads, and
    // what it returns must be right.
    shadow
        .check(
            &pool,
            volume_id,
            seed,
            "after the outage, before the reopen",
        )
        .await;
    // Does the same pool flush again?
    match pool.flush().await {
        Ok(()) => {
            shadow.flushed();
            tally.pools_recovered_without_reopen += 1;
        }
        Err(_) => tally.pools_failed += 1,
    }
    let status = pool.status();
    tally.demoted_blocks += status.demoted_blocks;
    tally.requests_refused += incarnation.switch.refused.load(Ordering::Relaxed);
    // The process stops (nothing unflushed is lost on the flash, as when a
    // process dies and the kernel keeps its writes) and starts again.
    incarnation.power_cut(PowerCutStyle::KeepAll).await;
    pool.abandon();
    drop(pool);
    incarnation.settled().await;
    let (pool, _incarnation) = media.open_pool(seed + 1000).await;
    shadow
        .check(&pool, volume_id_of(&pool), seed, "after the reopen")
        .await;
    pool.close().await.expect("close");
}

fn volume_id_of(pool: &Pool) -> u32 {
    pool.volume_id("alpha").expect("the volume survives")
}

/// The store goes away for a while (every request fails, or half of them)
/// without a power cut: clients' flushes go on succeeding (they need only
/// flash) and the pool never fails; once the store is back and the pool
/// reopened, every block flushed before holds exactly that, or something
/// written since.
#[tokio::test(flavor = "current_thread")]
async fn an_object_store_outage_never_returns_older_data() {
    let (first, runs) = (first_seed(), (crash_runs() / 5).max(1));
    let mut tally = OutageTally::default();
    for seed in first..first + runs {
        outage_run(seed, &mut tally).await;
    }
    eprintln!("{runs} outage runs: {tally:#?}");
    assert!(tally.demoted_blocks > 0, "{tally:?}");
    assert_eq!(tally.flushes_failed, 0, "{tally:?}");
    assert_eq!(tally.pools_failed, 0, "{tally:?}");
    assert!(runs < 10 || tally.requests_refused > 0, "{tally:?}");
}

/// What the store-down runs saw, so that the test can show they proved
/// something.
#[derive(Default, Debug)]
struct StoreDownTally {
    /// Blocks demoted before the store went away, and after it returned.
    demoted_before: u64,
    demoted_after_return: u64,
    /// Blocks written and flushes made while the store was away.
    blocks_written_during: u64,
    flushes_during: u64,
    /// Reads that failed while the store was away (blocks held only by it),
    /// and reads that returned data (checked against the model).
    reads_failed_during: u64,
    reads_served_during: u64,
    /// Checkpoints refused while the store was away.
    checkpoints_refused_during: u64,
    /// Runs cut during the outage, and runs whose store returned.
    power_cuts_during: u64,
    returns: u64,
}

/// Blocks a run writes while the store is away, at most: few enough that
/// the flash tier's free space holds them without anything demoted.
const STORE_DOWN_WRITE_BLOCKS_MAX: usize = 48;

/// Free flash segments beyond the clients' reserve that a run has before
/// the store goes away: room for what it writes then (the writes' batches
/// with their summaries, one batch per flush at worst) with nothing
/// demoted or freed meanwhile.
const FREE_FLASH_SEGMENTS_BEFORE_OUTAGE: usize = 8;

/// Demotes, flushes both tiers and checkpoints, as the demoter does, until
/// flash has room for what the run writes while the store is away.
async fn make_room_on_flash(pool: &Pool, seed: u64) {
    for _ in 0..32 {
        let table = pool.segment_table();
        if table.free_segments.len()
            >= table.client_reserve_segment_count + FREE_FLASH_SEGMENTS_BEFORE_OUTAGE
        {
            return;
        }
        pool.clean(4).await.expect("clean");
        pool.flush_all().await.expect("flush");
        pool.checkpoint().await.expect("checkpoint");
        pool.checkpoint().await.expect("checkpoint");
    }
    panic!("seed {seed}: flash found no room before the outage");
}

/// A write of 1 to 4 blocks that must succeed, recorded in the model.
async fn required_write(
    pool: &Pool,
    volume_id: u32,
    shadow: &mut OutageShadow,
    rng: &mut SmallRng,
    seed: u64,
    phase: &str,
) -> usize {
    let blocks = rng.random_range(1..=4);
    let first = rng.random_range(0..=OUTAGE_VOLUME_BLOCKS - blocks);
    let fill: u8 = rng.random();
    let data: Vec<u8> = (0..blocks * BLOCK)
        .map(|index| fill.wrapping_add((index / 512) as u8) | 1)
        .collect();
    for (position, block) in (first..first + blocks).enumerate() {
        let contents = data[position * BLOCK..(position + 1) * BLOCK].to_vec();
        shadow.written(block, contents, true);
    }
    pool.write(volume_id, (first * BLOCK) as u64, &data, false)
        .await
        .unwrap_or_else(|error| panic!("seed {seed} {phase}: a write failed: {error}"));
    blocks
}

async fn required_flush(pool: &Pool, shadow: &mut OutageShadow, seed: u64, phase: &str) {
    pool.flush()
        .await
        .unwrap_or_else(|error| panic!("seed {seed} {phase}: a flush failed: {error}"));
    shadow.flushed();
}

/// The store away: writes and flushes of new data succeed on flash, reads
/// return the right data or an error, a checkpoint may be refused but fails
/// nothing. Returns after a last flush that must succeed too.
async fn while_the_store_is_down(
    pool: &Pool,
    volume_id: u32,
    shadow: &mut OutageShadow,
    rng: &mut SmallRng,
    tally: &mut StoreDownTally,
    seed: u64,
) {
    let phase = "while the store is down";
    let mut written = 0;
    while written < STORE_DOWN_WRITE_BLOCKS_MAX - 4 {
        match rng.random_range(0..100) {
            0..=49 => {
                written += required_write(pool, volume_id, shadow, rng, seed, phase).await;
            }
            50..=69 => {
                required_flush(pool, shadow, seed, phase).await;
                tally.flushes_during += 1;
            }
            70..=74 => {
                // Refused (the tier's uploads cannot be made durable) or
                // made; either way the pool goes on.
                match pool.checkpoint().await {
                    Ok(()) => shadow.flushed(),
                    Err(_) => tally.checkpoints_refused_during += 1,
                }
            }
            _ => {
                let first = rng.random_range(0..OUTAGE_VOLUME_BLOCKS);
                let blocks = rng.random_range(1..=(OUTAGE_VOLUME_BLOCKS - first).min(8));
                let mut contents = vec![0u8; blocks * BLOCK];
                match pool
                    .read(volume_id, (first * BLOCK) as u64, &mut contents)
                    .await
                {
                    Ok(()) => {
                        shadow.compare(&contents, first..first + blocks, seed, phase);
                        tally.reads_served_during += 1;
                    }
                    Err(_) => tally.reads_failed_during += 1,
                }
            }
        }
    }
    tally.blocks_written_during += written as u64;
    required_flush(pool, shadow, seed, phase).await;
    tally.flushes_during += 1;
    assert!(
        pool.status().failed.is_none(),
        "seed {seed}: the pool failed while the store was down: {:?}",
        pool.status().failed
    );
}

async fn store_down_run(seed: u64, tally: &mut StoreDownTally) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let media = Media::new(&mut rng);
    let (pool, incarnation) = media.create_pool(seed).await;
    let volume_id = create_alpha(&pool, OUTAGE_VOLUME_BLOCKS, &mut rng).await;
    let mut shadow = OutageShadow::new();
    let mut outage = OutageTally::default();
    for _ in 0..rng.random_range(100..400) {
        let succeeded =
            outage_operation(&pool, volume_id, &mut shadow, &mut rng, &mut outage, seed).await;
        assert!(
            succeeded,
            "seed {seed}: an operation failed before the outage"
        );
    }
    make_room_on_flash(&pool, seed).await;
    // A demotion whose upload has not been made durable yet, in most runs:
    // the client's next flush follows it.
    if rng.random_bool(0.8) {
        pool.clean(4).await.expect("clean");
    }
    tally.demoted_before += pool.status().demoted_blocks;
    let mode = if rng.random_bool(0.7) {
        StoreMode::Refusing
    } else {
        StoreMode::Flaky
    };
    incarnation.switch.set(mode);
    while_the_store_is_down(&pool, volume_id, &mut shadow, &mut rng, tally, seed).await;
    if rng.random_bool(0.5) {
        // The power goes during the outage; the store is back for the next
        // process (which cannot open the tier without it).
        tally.power_cuts_during += 1;
        let after = AfterCut {
            reopen_seed: seed + 1000,
            phase: "after a cut during the outage",
        };
        cut_reopen_and_check(&media, pool, incarnation, &mut shadow, seed, after).await;
        return;
    }
    incarnation.switch.set(StoreMode::Serving);
    tally.returns += 1;
    the_store_is_back(&pool, volume_id, &mut shadow, &mut rng, tally, seed).await;
    let after = AfterCut {
        reopen_seed: seed + 2000,
        phase: "after the return and a cut",
    };
    cut_reopen_and_check(&media, pool, incarnation, &mut shadow, seed, after).await;
}

/// How the store-down run reopens after its cut.
struct AfterCut {
    reopen_seed: u64,
    phase: &'static str,
}

/// The power goes (the store is back for the next process, which cannot
/// open the tier without it); the pool is opened again and every block
/// checked against `shadow`.
async fn cut_reopen_and_check(
    media: &Media,
    pool: Pool,
    incarnation: Incarnation,
    shadow: &mut OutageShadow,
    seed: u64,
    after: AfterCut,
) {
    incarnation.power_cut(PowerCutStyle::Random).await;
    pool.abandon();
    drop(pool);
    incarnation.settled().await;
    let (pool, _incarnation) = media.open_pool(after.reopen_seed).await;
    shadow
        .check(&pool, volume_id_of(&pool), seed, after.phase)
        .await;
    pool.close().await.expect("close");
}

/// The store is back: the tier's writes resume (what waited is uploaded),
/// demotion goes on, checkpoints are taken again, and every block reads as
/// the model says.
async fn the_store_is_back(
    pool: &Pool,
    volume_id: u32,
    shadow: &mut OutageShadow,
    rng: &mut SmallRng,
    tally: &mut StoreDownTally,
    seed: u64,
) {
    let phase = "after the store returned";
    pool.resume_capacity_writes()
        .await
        .unwrap_or_else(|error| panic!("seed {seed}: the tier's writes did not resume: {error}"));
    assert!(
        pool.status()
            .capacity_writes
            .is_none_or(|writes| writes.suspended.is_none()),
        "seed {seed}: the tier's writes are still suspended"
    );
    shadow.check(pool, volume_id, seed, phase).await;
    let demoted = pool.status().demoted_blocks;
    for _ in 0..rng.random_range(20..120) {
        required_write(pool, volume_id, shadow, rng, seed, phase).await;
        if rng.random_bool(0.2) {
            pool.clean(4)
                .await
                .unwrap_or_else(|error| panic!("seed {seed} {phase}: clean failed: {error}"));
        }
    }
    pool.clean(4).await.expect("clean");
    pool.checkpoint()
        .await
        .unwrap_or_else(|error| panic!("seed {seed} {phase}: checkpoint failed: {error}"));
    shadow.flushed();
    tally.demoted_after_return += pool.status().demoted_blocks - demoted;
    shadow.check(pool, volume_id, seed, phase).await;
}

/// The store goes away after data was demoted (with an upload of demoted
/// blocks still waiting, in most runs): the clients go on writing and
/// flushing on flash, which must succeed, and reading, which returns the
/// right data or an error; then the power goes (every flushed block must
/// survive) or the store returns (the tier's writes and demotion resume).
#[tokio::test(flavor = "current_thread")]
async fn with_the_store_down_writes_and_flushes_land_on_flash() {
    let (first, runs) = (first_seed(), (crash_runs() / 5).max(1));
    let mut tally = StoreDownTally::default();
    for seed in first..first + runs {
        store_down_run(seed, &mut tally).await;
    }
    eprintln!("{runs} store-down runs: {tally:#?}");
    assert!(tally.demoted_before > 0, "{tally:?}");
    assert!(tally.flushes_during > 0, "{tally:?}");
    assert!(
        runs < 20 || (tally.reads_failed_during > 0 && tally.demoted_after_return > 0),
        "{tally:?}"
    );
}

/// Blocks of the volume of the restore test: the flash region's data blocks,
/// so that most of the volume lives on the capacity tier while the newest
/// writes sit on flash.
const RESTORE_VOLUME_BLOCKS: usize = 384;

/// Bytes of a restore-test block that name the write that made it.
const WRITE_INDEX_BYTES: usize = 8;

/// The contents of the restore test's write number `index`: the number, then
/// a fill derived from it, so that a block read back names its write.
fn write_contents(index: u64) -> Vec<u8> {
    let mut contents = vec![(index as u8) | 1; BLOCK];
    contents[..WRITE_INDEX_BYTES].copy_from_slice(&index.to_le_bytes());
    contents
}

/// Which write a block read back holds: 0 for a block never written (zeros),
/// `None` for contents no write made.
fn write_of(contents: &[u8]) -> Option<u64> {
    if contents.iter().all(|byte| *byte == 0) {
        return Some(0);
    }
    let index = u64::from_le_bytes(contents[..WRITE_INDEX_BYTES].try_into().unwrap());
    (index > 0 && contents == write_contents(index).as_slice()).then_some(index)
}

/// Every write of the restore test's volume, numbered from 1 in the order
/// the pool acknowledged them (one number per block), and where the
/// checkpoints the test asked for completed.
struct WriteHistory {
    /// Per block, the numbers of the writes to it, in order.
    writes: Vec<Vec<u64>>,
    next_index: u64,
    /// The first write number after each checkpoint that succeeded.
    checkpoints_after: Vec<u64>,
    /// The store refuses every request of the pool's device instance.
    store_down: bool,
}

/// The writes a restored block is consistent with: it holds write `start`,
/// which the next write to the block (`end`, exclusive; none: `u64::MAX`)
/// replaced.
#[derive(Clone, Copy, Debug)]
struct ValidSpan {
    block: usize,
    start: u64,
    end: u64,
}

impl WriteHistory {
    fn new() -> Self {
        Self {
            writes: vec![Vec::new(); RESTORE_VOLUME_BLOCKS],
            next_index: 1,
            checkpoints_after: Vec::new(),
            store_down: false,
        }
    }

    /// Writes 1 to 4 blocks, each its own write number.
    async fn write(&mut self, pool: &Pool, volume_id: u32, rng: &mut SmallRng, seed: u64) {
        let blocks = rng.random_range(1..=4);
        let first = rng.random_range(0..=RESTORE_VOLUME_BLOCKS - blocks);
        let mut data = Vec::with_capacity(blocks * BLOCK);
        for block in first..first + blocks {
            data.extend_from_slice(&write_contents(self.next_index));
            self.writes[block].push(self.next_index);
            self.next_index += 1;
        }
        pool.write(volume_id, (first * BLOCK) as u64, &data, false)
            .await
            .unwrap_or_else(|error| panic!("seed {seed}: a write failed: {error}"));
    }

    /// The span of write numbers `block` holding `index` is consistent with.
    fn span(&self, block: usize, index: u64, seed: u64) -> ValidSpan {
        let writes = &self.writes[block];
        let position = if index == 0 {
            0
        } else {
            writes
                .iter()
                .position(|written| *written == index)
                .unwrap_or_else(|| {
                    panic!("seed {seed}: block {block} holds write {index}, made to another block")
                })
                + 1
        };
        ValidSpan {
            block,
            start: index,
            end: writes.get(position).copied().unwrap_or(u64::MAX),
        }
    }
}

/// One operation of the restore test before the flash is lost; while the
/// store is down, no cleaning (which fills flash with what it cannot demote,
/// as `while_the_store_is_down`'s writes are bounded by what flash keeps
/// free).
async fn restore_run_operation(
    pool: &Pool,
    volume_id: u32,
    history: &mut WriteHistory,
    rng: &mut SmallRng,
    seed: u64,
) {
    let store_down = history.store_down;
    match rng.random_range(0..100) {
        0..=59 => history.write(pool, volume_id, rng, seed).await,
        60..=69 => {
            // On flash alone while the store is away (decision 0032).
            pool.flush()
                .await
                .unwrap_or_else(|error| panic!("seed {seed}: a flush failed: {error}"));
        }
        70..=84 if !store_down => {
            let _ = pool.clean(4).await;
        }
        85..=89 => {
            if pool.checkpoint().await.is_ok() {
                history.checkpoints_after.push(history.next_index);
            }
        }
        _ => {
            for _ in 0..rng.random_range(1..8) {
                tokio::task::yield_now().await;
            }
        }
    }
}

#[derive(Default, Debug)]
struct RestoreTally {
    restores: u64,
    blocks_read: u64,
    blocks_lost: u64,
    /// Restored blocks older than the newest write of their block, though
    /// consistent with the others (the volume as of the restored point).
    blocks_rolled_back: u64,
    store_outages: u64,
    demoted_blocks: u64,
}

/// The pool's flash device lost (after a power cut), and the pool restored
/// from its object tier alone onto a new, empty one.
async fn restore_without_flash(media: &Media, seed: u64) -> Pool {
    let flash: Arc<dyn BlockDevice> = Arc::new(MemoryDevice::new(FLASH_BYTES));
    let (_, tier) = media.open_tier(seed, false).await;
    let device: Arc<dyn BlockDevice> = Arc::new(ConcatenatedDevice::new(flash, tier));
    let restored = Pool::restore_flash(FlashRestore {
        device: &*device,
        flash_region_bytes: FLASH_BYTES,
        force: false,
    })
    .await
    .unwrap_or_else(|error| panic!("seed {seed}: the restore was refused: {error}"));
    let pool = Pool::open_restored(device, tier_limits(seed))
        .await
        .unwrap_or_else(|error| panic!("seed {seed}: the restored pool did not open: {error}"));
    let point = pool
        .restored_as_of()
        .expect("a restored pool says its point");
    assert!(
        restored
            .checkpoint_sequences
            .contains(&point.checkpoint_sequence),
        "seed {seed}: restored as of {point:?}, not a copied checkpoint ({:?})",
        restored.checkpoint_sequences
    );
    pool
}

/// Reads every block of the restored volume: each must hold a write the
/// volume held at one same point of its history (or be lost), and that point
/// must be no older than the older of the last two checkpoints the test saw
/// complete (the restore starts from one of the two newest).
async fn check_restored(pool: &Pool, history: &WriteHistory, tally: &mut RestoreTally, seed: u64) {
    let volume_id = pool.volume_id("alpha").expect("the volume survives");
    let mut contents = vec![0u8; BLOCK];
    let mut spans = Vec::new();
    for block in 0..RESTORE_VOLUME_BLOCKS {
        match pool
            .read(volume_id, (block * BLOCK) as u64, &mut contents)
            .await
        {
            Ok(()) => {
                let index = write_of(&contents).unwrap_or_else(|| {
                    panic!("seed {seed}: block {block} holds contents no write made")
                });
                spans.push(history.span(block, index, seed));
            }
            Err(EngineError::Io(IoError::BlockLost { .. })) => tally.blocks_lost += 1,
            Err(error) => panic!("seed {seed}: reading block {block} failed: {error}"),
        }
    }
    tally.blocks_read += spans.len() as u64;
    tally.blocks_rolled_back += spans.iter().filter(|span| span.end != u64::MAX).count() as u64;
    let newest_start = spans.iter().max_by_key(|span| span.start);
    let oldest_end = spans.iter().min_by_key(|span| span.end);
    if let (Some(newest_start), Some(oldest_end)) = (newest_start, oldest_end) {
        assert!(
            newest_start.start < oldest_end.end,
            "seed {seed}: the restored volume mixes versions: block {} holds write {} while block {} holds write {}, which write {} replaced before it",
            newest_start.block,
            newest_start.start,
            oldest_end.block,
            oldest_end.start,
            oldest_end.end
        );
    }
    let checkpoints = &history.checkpoints_after;
    if checkpoints.len() >= 2 {
        let floor = checkpoints[checkpoints.len() - 2];
        assert!(
            spans.iter().all(|span| span.end >= floor),
            "seed {seed}: the restored volume is older than the checkpoint before write {floor}"
        );
    }
}

async fn restore_run(seed: u64, tally: &mut RestoreTally) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let media = Media::new(&mut rng);
    let (pool, incarnation) = media.create_pool(seed).await;
    let volume_id = create_alpha(&pool, RESTORE_VOLUME_BLOCKS, &mut rng).await;
    let mut history = WriteHistory::new();
    for _ in 0..rng.random_range(200..800) {
        restore_run_operation(&pool, volume_id, &mut history, &mut rng, seed).await;
    }
    if rng.random_bool(0.5) {
        // The store away for a while: writes and flushes go on on flash.
        // Only as much as the flash kept free takes.
        tally.store_outages += 1;
        make_room_on_flash(&pool, seed).await;
        incarnation.switch.set(StoreMode::Refusing);
        history.store_down = true;
        let outage_end = history.next_index + (STORE_DOWN_WRITE_BLOCKS_MAX - 4) as u64;
        while history.next_index < outage_end {
            restore_run_operation(&pool, volume_id, &mut history, &mut rng, seed).await;
        }
        incarnation.switch.set(StoreMode::Serving);
        history.store_down = false;
        let _ = pool.resume_capacity_writes().await;
        for _ in 0..rng.random_range(0..100) {
            restore_run_operation(&pool, volume_id, &mut history, &mut rng, seed).await;
        }
    }
    let _ = pool.flush().await;
    tally.demoted_blocks += pool.status().demoted_blocks;
    incarnation.power_cut(PowerCutStyle::Random).await;
    pool.abandon();
    drop(pool);
    incarnation.settled().await;
    let pool = restore_without_flash(&media, seed + 1000).await;
    tally.restores += 1;
    check_restored(&pool, &history, tally, seed).await;
    media.late.land_all().await;
    pool.close().await.expect("close");
}

/// Issue 42, item 10: a pool restored from its capacity tier after its
/// flash device was lost returns the volume as of one point of its history
/// (blocks lost with the flash read as errors), never some blocks newer and
/// others older than that point: a file system on it would be silently
/// corrupt.
#[tokio::test(flavor = "current_thread")]
async fn a_restore_from_the_capacity_tier_never_mixes_versions() {
    let (first, runs) = (first_seed(), (crash_runs() / 10).max(1));
    let mut tally = RestoreTally::default();
    for seed in first..first + runs {
        restore_run(seed, &mut tally).await;
    }
    eprintln!("{runs} restore runs: {tally:#?}");
    assert!(tally.demoted_blocks > 0, "{tally:?}");
    assert!(tally.blocks_read > 0, "{tally:?}");
}
