//! [`ObjectStoreDevice`]: a [`BlockDevice`] whose bytes live in an object
//! store. Writes stay in memory (pending, visible to reads at once) until a
//! flush stores each contiguous pending run of a segment as one part object;
//! a read takes pending bytes from memory and stored bytes by ranged GETs of
//! the parts that hold them; opening a segment again starts a new generation
//! and deletes the old one's parts in the background. Each open of the tier
//! is an epoch, taken by a conditional write of the label, and a flush's
//! parts count only once a second conditional label write commits the flush:
//! a request still in flight when a process died can never change what a
//! later open sees, and two processes cannot both write the tier. See
//! docs/decisions/0031-object-store-capacity-tier.md and
//! docs/decisions/0034-object-tier-epochs-and-commits.md.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use lamina_device::{AlignedBuffer, BlockDevice, DeviceError, RegionShape, check_request};
use object_store::{PutMode, UpdateVersion};

use crate::deleter::{DeletionQueue, run_deleter};
use crate::epoch_record::{EpochRecord, is_ours};
use crate::error::RequestKind;
use crate::index::{PieceSource, RunTarget, SegmentIndex, UploadRun};
use crate::key::{LABEL_OBJECT_NAME, PartKey, SEGMENTS_FOLDER_NAME, join_key, strip_prefix};
use crate::label::{LabelLocation, TierLabel};
use crate::requests::CountedStore;
use crate::{
    ObjectStoreConfig, ObjectStoreError, ObjectStoreLimits, ObjectStoreStatistics, TierGeometry,
};

/// Times an open reads the label, lists and writes the label again when
/// another process changed the label meanwhile.
const OPEN_ATTEMPTS_MAX: usize = 3;

/// Conditional label writes one commit tries (the second after reading the
/// label back: the first may have landed with its answer lost).
const COMMIT_ATTEMPTS_MAX: usize = 2;

/// Times a read resolves its pieces again when a part it was reading was
/// deleted meanwhile (hidden by a newer part that was stored just then).
const READ_ATTEMPTS_MAX: usize = 3;

/// Where a tier lives in its store.
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct TierLocation {
    pub bucket: String,
    pub prefix: String,
    pub limits: ObjectStoreLimits,
}

impl TierLocation {
    fn of(config: &ObjectStoreConfig) -> Self {
        Self {
            bucket: config.bucket.clone(),
            prefix: config.prefix.clone(),
            limits: config.limits.clone(),
        }
    }

    fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }
}

/// The index and the write order, behind one mutex held only for memory work.
#[derive(Default)]
struct TierState {
    segments: BTreeMap<u64, SegmentIndex>,
    /// Sequence of the latest write.
    write_sequence: u64,
    /// Bumped whenever a stored part leaves the index, so that a read that
    /// found a part gone can tell a race from a lost object.
    index_version: u64,
}

/// The label as this process last wrote it and the flush numbering; held
/// by one flush at a time (flushes run one at a time: a flush that waits for
/// another then stores whatever the other left pending or failed to store,
/// so it never returns before everything written before it started is
/// stored).
struct Commits {
    label: TierLabel,
    /// The label object's version after this process's last write of it.
    label_version: UpdateVersion,
    /// The number of the next flush that stores anything; a failed flush's
    /// number is used again, so that the committed ones stay 1..=n.
    next_flush: u64,
}

/// A piece of a read to fetch from the store.
struct Fetch {
    key: String,
    object_range: std::ops::Range<u64>,
    buffer_start: usize,
}

/// See the module documentation.
pub struct ObjectStoreDevice {
    url: String,
    prefix: String,
    bucket: String,
    label_key: String,
    store: Arc<CountedStore>,
    geometry: TierGeometry,
    tier_id: String,
    /// This process's open of the tier: every part it stores carries it.
    epoch: u64,
    limits: ObjectStoreLimits,
    state: Mutex<TierState>,
    commits: tokio::sync::Mutex<Commits>,
    /// The epoch of a later open by another process, once a commit found
    /// it (0: none); from then on writes and flushes fail.
    fenced_by_epoch: AtomicU64,
    /// This epoch's committed flushes, for the statistics.
    flushes_committed: AtomicU64,
    deletions: Arc<DeletionQueue>,
    deleter: tokio::task::JoinHandle<()>,
}

impl Drop for ObjectStoreDevice {
    fn drop(&mut self) {
        self.deleter.abort();
    }
}

impl ObjectStoreDevice {
    /// Creates a tier at `config`'s location: refuses a prefix that already
    /// holds a label or segment objects, then writes the label.
    pub async fn create(
        config: &ObjectStoreConfig,
        geometry: TierGeometry,
    ) -> Result<Arc<Self>, ObjectStoreError> {
        let store = config.build_store()?;
        Self::create_in_with(store, TierLocation::of(config), geometry, None).await
    }

    /// [`ObjectStoreDevice::create`], recording the epoch it takes in
    /// `record` (for [`ObjectStoreDevice::open_recorded`]).
    pub async fn create_recorded(
        config: &ObjectStoreConfig,
        geometry: TierGeometry,
        record: &dyn EpochRecord,
    ) -> Result<Arc<Self>, ObjectStoreError> {
        let store = config.build_store()?;
        Self::create_in_with(store, TierLocation::of(config), geometry, Some(record)).await
    }

    /// Opens the tier at `config`'s location: reads its label and LISTs its
    /// parts to build the index.
    pub async fn open(config: &ObjectStoreConfig) -> Result<Arc<Self>, ObjectStoreError> {
        let store = config.build_store()?;
        Self::open_in_with(store, TierLocation::of(config), None).await
    }

    /// [`ObjectStoreDevice::open`] for the pool whose epochs `record` keeps:
    /// refused when another process took the tier since the pool last did.
    pub async fn open_recorded(
        config: &ObjectStoreConfig,
        record: &dyn EpochRecord,
    ) -> Result<Arc<Self>, ObjectStoreError> {
        let store = config.build_store()?;
        Self::open_in_with(store, TierLocation::of(config), Some(record)).await
    }

    /// [`ObjectStoreDevice::create`] over any store (tests use object_store's
    /// in-memory store).
    #[doc(hidden)]
    pub async fn create_in(
        store: Arc<dyn object_store::ObjectStore>,
        location: TierLocation,
        geometry: TierGeometry,
    ) -> Result<Arc<Self>, ObjectStoreError> {
        Self::create_in_with(store, location, geometry, None).await
    }

    /// [`ObjectStoreDevice::create_in`], recording the epoch taken.
    #[doc(hidden)]
    pub async fn create_in_with(
        store: Arc<dyn object_store::ObjectStore>,
        location: TierLocation,
        geometry: TierGeometry,
        record: Option<&dyn EpochRecord>,
    ) -> Result<Arc<Self>, ObjectStoreError> {
        geometry.validate()?;
        location.limits.validate()?;
        let counted = Arc::new(CountedStore::new(
            store,
            &location.bucket,
            location.limits.requests_in_flight_max,
        ));
        let label_key = join_key(&location.prefix, LABEL_OBJECT_NAME);
        let label_exists = || ObjectStoreError::LabelExists {
            bucket: location.bucket.clone(),
            key: label_key.clone(),
        };
        match counted.get(&label_key).await {
            Ok(_) => return Err(label_exists()),
            Err(error) if error.is_not_found() => {}
            Err(error) => return Err(error),
        }
        let segments_key = join_key(&location.prefix, SEGMENTS_FOLDER_NAME);
        if let Some(object) = counted.list(&segments_key).await?.first() {
            return Err(ObjectStoreError::PrefixNotEmpty {
                bucket: location.bucket.clone(),
                prefix: location.prefix.clone(),
                key: object.location.to_string(),
            });
        }
        let label = TierLabel::new(geometry);
        if let Some(record) = record {
            record
                .record(label.current_epoch())
                .map_err(|source| ObjectStoreError::EpochRecord { source })?;
        }
        // Only if absent: of two processes creating one tier, one wins.
        let label_version = counted
            .put_with_mode(
                RequestKind::LabelPut,
                &label_key,
                Bytes::from(label.to_bytes()),
                PutMode::Create,
            )
            .await
            .map_err(|error| {
                if error.is_condition_failed() {
                    label_exists()
                } else {
                    error
                }
            })?;
        tracing::info!(tier = %location.url(), tier_id = %label.tier_id, "created object-store tier");
        let opened = OpenedTier {
            label,
            label_version,
            state: TierState::default(),
            garbage: Vec::new(),
        };
        Ok(Self::assemble(counted, location, opened))
    }

    /// [`ObjectStoreDevice::open`] over any store.
    #[doc(hidden)]
    pub async fn open_in(
        store: Arc<dyn object_store::ObjectStore>,
        location: TierLocation,
    ) -> Result<Arc<Self>, ObjectStoreError> {
        Self::open_in_with(store, location, None).await
    }

    /// [`ObjectStoreDevice::open_in`], checked against and recorded in
    /// `record` when given.
    #[doc(hidden)]
    pub async fn open_in_with(
        store: Arc<dyn object_store::ObjectStore>,
        location: TierLocation,
        record: Option<&dyn EpochRecord>,
    ) -> Result<Arc<Self>, ObjectStoreError> {
        location.limits.validate()?;
        let counted = Arc::new(CountedStore::new(
            store,
            &location.bucket,
            location.limits.requests_in_flight_max,
        ));
        // Read once: a retry must not accept the epoch an attempt recorded
        // and another process then took.
        let owner = match record {
            Some(record) => Some(EpochOwner {
                record,
                last_epoch: record
                    .last_epoch()
                    .map_err(|source| ObjectStoreError::EpochRecord { source })?,
            }),
            None => None,
        };
        let owner = owner.as_ref();
        for attempt in 1..=OPEN_ATTEMPTS_MAX {
            if let Some(opened) = take_epoch(&counted, &location, owner).await? {
                tracing::info!(
                    tier = %location.url(),
                    tier_id = %opened.label.tier_id,
                    epoch = opened.label.current_epoch(),
                    segments = opened.state.segments.len(),
                    objects_to_delete = opened.garbage.len(),
                    "opened object-store tier"
                );
                return Ok(Self::assemble(counted, location, opened));
            }
            tracing::warn!(tier = %location.url(), attempt, "the tier's label changed while opening it; trying again");
        }
        Err(ObjectStoreError::OpenContended {
            bucket: location.bucket.clone(),
            key: join_key(&location.prefix, LABEL_OBJECT_NAME),
            attempts: OPEN_ATTEMPTS_MAX,
        })
    }

    fn assemble(store: Arc<CountedStore>, location: TierLocation, opened: OpenedTier) -> Arc<Self> {
        let url = location.url();
        let deletions = Arc::new(DeletionQueue::default());
        deletions.push(opened.garbage);
        let deleter = tokio::spawn(run_deleter(
            deletions.clone(),
            store.clone(),
            location.limits.delete_batch_objects_max,
            Duration::from_millis(location.limits.delete_retry_delay_ms),
            url.clone(),
        ));
        let label = opened.label;
        Arc::new(Self {
            url,
            label_key: join_key(&location.prefix, LABEL_OBJECT_NAME),
            bucket: location.bucket,
            prefix: location.prefix,
            store,
            geometry: label.geometry,
            tier_id: label.tier_id.clone(),
            epoch: label.current_epoch(),
            limits: location.limits,
            state: Mutex::new(opened.state),
            commits: tokio::sync::Mutex::new(Commits {
                label,
                label_version: opened.label_version,
                next_flush: 1,
            }),
            fenced_by_epoch: AtomicU64::new(0),
            flushes_committed: AtomicU64::new(0),
            deletions,
            deleter,
        })
    }

    /// `s3://bucket/prefix`.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    pub fn geometry(&self) -> TierGeometry {
        self.geometry
    }

    /// The random id the tier's label was created with.
    pub fn tier_id(&self) -> &str {
        &self.tier_id
    }

    pub fn statistics(&self) -> ObjectStoreStatistics {
        let (objects_stored, bytes_stored, pending_bytes) = {
            let state = self.state.lock().expect("tier state lock");
            let mut totals = (0, 0, 0);
            for segment in state.segments.values() {
                totals.0 += segment.parts().len() as u64;
                totals.1 += segment.parts().iter().map(|part| part.length).sum::<u64>();
                totals.2 += segment.pending_bytes();
            }
            totals
        };
        ObjectStoreStatistics {
            url: self.url.clone(),
            get: self.store.statistics(RequestKind::Get),
            put: self.store.statistics(RequestKind::Put),
            delete: self.store.statistics(RequestKind::Delete),
            list: self.store.statistics(RequestKind::List),
            label_put: self.store.statistics(RequestKind::LabelPut),
            objects_stored,
            bytes_stored,
            objects_awaiting_deletion: self.deletions.awaiting() as u64,
            pending_bytes,
            epoch: self.epoch,
            flushes_committed: self.flushes_committed.load(Ordering::Acquire),
            fenced_by_epoch: Some(self.fenced_by_epoch.load(Ordering::Acquire))
                .filter(|epoch| *epoch != 0),
        }
    }

    fn part_object_key(&self, key: &PartKey) -> String {
        join_key(&self.prefix, &key.relative_key())
    }

    fn queue_deletions(&self, parts: Vec<PartKey>) {
        self.deletions
            .push(parts.iter().map(|part| self.part_object_key(part)));
    }

    /// Under the lock: the read's pending bytes copied into `buffer`, and
    /// what is left to fetch from the store, with the index version seen.
    fn plan_read(&self, offset: u64, buffer: &mut AlignedBuffer) -> (Vec<Fetch>, u64) {
        let geometry = self.geometry;
        let state = self.state.lock().expect("tier state lock");
        let mut fetches = Vec::new();
        for span in geometry.spans(offset, buffer.len() as u64) {
            let Some(segment) = state.segments.get(&span.segment_index) else {
                continue;
            };
            for piece in segment.resolve(span.range_in_segment.clone()) {
                let buffer_start = crate::to_usize(
                    span.request_start + piece.offset_in_segment - span.range_in_segment.start,
                );
                let length = crate::to_usize(piece.length);
                match piece.source {
                    PieceSource::Zeros => {}
                    PieceSource::Pending { data, data_start } => buffer
                        [buffer_start..buffer_start + length]
                        .copy_from_slice(&data[data_start..data_start + length]),
                    PieceSource::Stored { key, object_offset } => fetches.push(Fetch {
                        key: self.part_object_key(&key),
                        object_range: object_offset..object_offset + piece.length,
                        buffer_start,
                    }),
                }
            }
        }
        (fetches, state.index_version)
    }

    /// One attempt at a read; `Err(true)` when a part was missing while the
    /// index changed (try again), `Err(false)` with the error otherwise.
    async fn read_once(
        &self,
        offset: u64,
        length: usize,
    ) -> Result<AlignedBuffer, (bool, ObjectStoreError)> {
        let mut buffer = AlignedBuffer::zeroed(length);
        let (fetches, version) = self.plan_read(offset, &mut buffer);
        let results = futures::stream::iter(fetches)
            .map(|fetch| async move {
                let bytes = self.store.get_range(&fetch.key, fetch.object_range).await;
                (fetch.buffer_start, bytes)
            })
            .buffer_unordered(self.limits.requests_in_flight_max)
            .collect::<Vec<_>>()
            .await;
        for (buffer_start, bytes) in results {
            match bytes {
                Ok(bytes) => {
                    buffer[buffer_start..buffer_start + bytes.len()].copy_from_slice(&bytes)
                }
                Err(error) => {
                    let raced = error.is_not_found()
                        && self.state.lock().expect("tier state lock").index_version != version;
                    return Err((raced, error));
                }
            }
        }
        Ok(buffer)
    }

    /// The error of a fenced process, if this one is.
    fn fenced_error(&self) -> Option<ObjectStoreError> {
        let newer_epoch = self.fenced_by_epoch.load(Ordering::Acquire);
        (newer_epoch != 0).then(|| ObjectStoreError::Fenced {
            bucket: self.bucket.clone(),
            key: self.label_key.clone(),
            epoch: self.epoch,
            newer_epoch,
        })
    }

    /// Stores every pending run under the next flush's number and commits
    /// it; the first error if any PUT failed (then every run stays pending,
    /// and the next flush stores them all again under the same number).
    async fn flush_pending(&self, commits: &mut Commits) -> Result<(), ObjectStoreError> {
        if let Some(error) = self.fenced_error() {
            return Err(error);
        }
        let flush = commits.next_flush;
        let (runs, write_sequence_max) = {
            let mut state = self.state.lock().expect("tier state lock");
            let mut runs: Vec<UploadRun> = Vec::new();
            for (segment_index, segment) in &mut state.segments {
                let target = RunTarget {
                    segment_index: *segment_index,
                    epoch: self.epoch,
                    flush,
                };
                runs.extend(segment.take_runs(target, self.limits.part_bytes_max));
            }
            (runs, state.write_sequence)
        };
        if runs.is_empty() {
            return Ok(());
        }
        let stored = self.upload(runs).await?;
        self.commit(commits, flush).await?;
        commits.next_flush = flush + 1;
        self.flushes_committed.store(flush, Ordering::Release);
        for key in stored {
            let garbage = {
                let mut state = self.state.lock().expect("tier state lock");
                let segment = state
                    .segments
                    .get_mut(&key.segment_index)
                    .expect("segments are never removed");
                let garbage = segment.stored(key, write_sequence_max);
                if !garbage.is_empty() {
                    state.index_version += 1;
                }
                garbage
            };
            self.queue_deletions(garbage);
        }
        Ok(())
    }

    /// PUTs every run; their keys when all were stored, else the first error.
    async fn upload(&self, runs: Vec<UploadRun>) -> Result<Vec<PartKey>, ObjectStoreError> {
        let mut uploads = futures::stream::iter(runs)
            .map(|run| async move {
                let result = self
                    .store
                    .put(&self.part_object_key(&run.key), run.payload)
                    .await;
                (run.key, result)
            })
            .buffer_unordered(self.limits.requests_in_flight_max);
        let mut stored = Vec::new();
        let mut first_error = None;
        while let Some((key, result)) = uploads.next().await {
            match result {
                Ok(()) => stored.push(key),
                Err(error) => {
                    tracing::warn!(tier = %self.url, %error, "flush: a part could not be stored; the flush stays pending");
                    first_error.get_or_insert(error);
                }
            }
        }
        first_error.map_or(Ok(stored), Err)
    }

    /// Commits `flush`: the label, with this epoch's flushes committed
    /// through it, written over the version this process wrote last. A
    /// refused write means either that the previous attempt landed with its
    /// answer lost (the label is still this epoch's: take its version and
    /// try again) or that another process opened the tier (fenced).
    async fn commit(&self, commits: &mut Commits, flush: u64) -> Result<(), ObjectStoreError> {
        let committed = commits.label.with_committed(flush);
        let mut last_error = None;
        for _ in 0..COMMIT_ATTEMPTS_MAX {
            let mode = PutMode::Update(commits.label_version.clone());
            let error = match self
                .store
                .put_with_mode(
                    RequestKind::LabelPut,
                    &self.label_key,
                    Bytes::from(committed.to_bytes()),
                    mode,
                )
                .await
            {
                Ok(version) => {
                    commits.label = committed;
                    commits.label_version = version;
                    return Ok(());
                }
                Err(error) if error.is_condition_failed() => error,
                Err(error) => return Err(error),
            };
            let (bytes, version) = self.store.get(&self.label_key).await?;
            let found = TierLabel::parse(
                &bytes,
                &LabelLocation {
                    bucket: &self.bucket,
                    key: &self.label_key,
                },
            )?;
            if found.current_epoch() != self.epoch || found.tier_id != self.tier_id {
                return Err(self.fence(found.current_epoch()));
            }
            let landed = found.is_committed(self.epoch, flush);
            commits.label = found;
            commits.label_version = version;
            if landed {
                return Ok(());
            }
            last_error = Some(error);
        }
        Err(last_error.expect("at least one attempt"))
    }

    fn fence(&self, newer_epoch: u64) -> ObjectStoreError {
        self.fenced_by_epoch
            .store(newer_epoch.max(1), Ordering::Release);
        let error = self.fenced_error().expect("fenced just now");
        tracing::error!(tier = %self.url, %error, "fenced: another process opened the tier");
        error
    }
}

/// What an open found and wrote: the label with this open's epoch, its
/// version, the index and the objects to delete.
struct OpenedTier {
    label: TierLabel,
    label_version: UpdateVersion,
    state: TierState,
    garbage: Vec<String>,
}

/// One attempt at taking a new epoch: reads the label, LISTs the parts,
/// builds the index from the parts that count, and writes the label with a
/// new epoch over the version read. `None` when the label changed meanwhile
/// (another process opened the tier or committed a flush: try again).
async fn take_epoch(
    store: &CountedStore,
    location: &TierLocation,
    owner: Option<&EpochOwner<'_>>,
) -> Result<Option<OpenedTier>, ObjectStoreError> {
    let label_key = join_key(&location.prefix, LABEL_OBJECT_NAME);
    let (label_bytes, version) = match store.get(&label_key).await {
        Ok(found) => found,
        Err(error) if error.is_not_found() => {
            return Err(ObjectStoreError::LabelMissing {
                bucket: location.bucket.clone(),
                key: label_key,
            });
        }
        Err(error) => return Err(error),
    };
    let label = TierLabel::parse(
        &label_bytes,
        &LabelLocation {
            bucket: &location.bucket,
            key: &label_key,
        },
    )?;
    // After the label: every part of a flush the label commits was stored
    // before that commit was written, so the LIST shows it.
    let listing = store
        .list(&join_key(&location.prefix, SEGMENTS_FOLDER_NAME))
        .await?;
    let built = build_index(location, &label, &listing);
    let opened = label.opened_again(|epoch| built.epochs_holding.contains(&epoch));
    if let Some(owner) = owner {
        check_and_record(owner, &label, location, opened.current_epoch())?;
    }
    match store
        .put_with_mode(
            RequestKind::LabelPut,
            &label_key,
            Bytes::from(opened.to_bytes()),
            PutMode::Update(version),
        )
        .await
    {
        Ok(label_version) => Ok(Some(OpenedTier {
            label: opened,
            label_version,
            state: built.state,
            garbage: built.garbage,
        })),
        Err(error) if error.is_condition_failed() => Ok(None),
        Err(error) => Err(error),
    }
}

/// Refuses a tier another process took since the pool last did (its
/// record names neither the label's epoch nor the next), then records the
/// epoch about to be taken. A pool without a record yet takes it as is.
fn check_and_record(
    owner: &EpochOwner<'_>,
    label: &TierLabel,
    location: &TierLocation,
    epoch_to_take: u64,
) -> Result<(), ObjectStoreError> {
    if let Some(last_epoch) = owner.last_epoch
        && !is_ours(label.current_epoch(), last_epoch)
    {
        return Err(ObjectStoreError::TakenSinceLastUse {
            bucket: location.bucket.clone(),
            key: join_key(&location.prefix, LABEL_OBJECT_NAME),
            epoch: label.current_epoch(),
            last_epoch,
        });
    }
    owner
        .record
        .record(epoch_to_take)
        .map_err(|source| ObjectStoreError::EpochRecord { source })
}

/// The pool opening a tier: its record, and the epoch it held before this
/// open.
struct EpochOwner<'a> {
    record: &'a dyn EpochRecord,
    last_epoch: Option<u64>,
}

/// What [`build_index`] makes of a LIST.
struct BuiltIndex {
    state: TierState,
    /// Keys of objects to delete.
    garbage: Vec<String>,
    /// Epochs that still have parts that count.
    epochs_holding: BTreeSet<u64>,
}

/// The index from a LIST of the tier's segments: parts whose flush the
/// label does not commit are garbage; of the rest, for each segment the
/// highest generation present wins; lower generations and parts hidden by
/// newer ones are garbage too. Keys that do not parse, or name places
/// outside the tier, are logged and left alone.
fn build_index(
    location: &TierLocation,
    label: &TierLabel,
    listing: &[object_store::ObjectMeta],
) -> BuiltIndex {
    let mut by_segment: BTreeMap<u64, Vec<PartKey>> = BTreeMap::new();
    let mut garbage = Vec::new();
    for object in listing {
        let full_key = object.location.to_string();
        let Some(part) =
            strip_prefix(&location.prefix, &full_key).and_then(PartKey::parse_relative)
        else {
            tracing::warn!(tier = %location.url(), key = %full_key, "ignoring an object that is not a part");
            continue;
        };
        if let Err(reason) = check_part(&label.geometry, &part, object.size) {
            tracing::warn!(tier = %location.url(), key = %full_key, reason, "ignoring a part that does not fit the tier");
            continue;
        }
        if label.is_committed(part.epoch, part.flush) {
            by_segment.entry(part.segment_index).or_default().push(part);
        } else {
            garbage.push(full_key);
        }
    }
    let mut state = TierState::default();
    let mut epochs_holding = BTreeSet::new();
    for (segment_index, parts) in by_segment {
        let generation = parts
            .iter()
            .map(|part| part.generation)
            .max()
            .expect("a segment listed has parts");
        let (current, older): (Vec<PartKey>, Vec<PartKey>) = parts
            .into_iter()
            .partition(|part| part.generation == generation);
        let (segment, hidden) = SegmentIndex::from_stored(generation, current);
        epochs_holding.extend(segment.parts().iter().map(|part| part.epoch));
        garbage.extend(
            older
                .iter()
                .chain(&hidden)
                .map(|part| join_key(&location.prefix, &part.relative_key())),
        );
        state.segments.insert(segment_index, segment);
    }
    BuiltIndex {
        state,
        garbage,
        epochs_holding,
    }
}

/// Why a parsed part cannot be one this tier wrote: outside the segments,
/// misaligned, empty, or of another size than its key says.
fn check_part(
    geometry: &TierGeometry,
    part: &PartKey,
    object_bytes: u64,
) -> Result<(), &'static str> {
    if part.segment_index >= geometry.segment_count() {
        return Err("segment beyond the end of the tier");
    }
    let window = geometry.window(part.segment_index);
    let aligned = part
        .offset_in_segment
        .is_multiple_of(lamina_device::DEVICE_ALIGNMENT_BYTES)
        && part
            .length
            .is_multiple_of(lamina_device::DEVICE_ALIGNMENT_BYTES);
    if !aligned || part.length == 0 {
        return Err("misaligned or empty");
    }
    let fits = part.offset_in_segment >= window.start
        && part
            .offset_in_segment
            .checked_add(part.length)
            .is_some_and(|end| end <= window.end);
    if !fits {
        return Err("outside its segment");
    }
    if object_bytes != part.length {
        return Err("object size differs from the length in its key");
    }
    Ok(())
}

#[async_trait::async_trait]
impl BlockDevice for ObjectStoreDevice {
    fn name(&self) -> &str {
        &self.url
    }

    fn size_bytes(&self) -> u64 {
        self.geometry.size_bytes
    }

    fn read(&self, offset: u64, length: usize) -> lamina_device::DeviceReadFuture<'_> {
        lamina_device::DeviceReadFuture::from_or_box(async move {
            check_request(&self.url, self.size_bytes(), offset, length as u64)?;
            let mut attempt = 1;
            loop {
                match self.read_once(offset, length).await {
                    Ok(buffer) => return Ok(buffer),
                    Err((true, _)) if attempt < READ_ATTEMPTS_MAX => attempt += 1,
                    Err((_, error)) => {
                        return Err(error.into_device_error(&self.url, offset, length as u64));
                    }
                }
            }
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        check_request(&self.url, self.size_bytes(), offset, data.len() as u64)?;
        // A fenced process still takes writes into memory (they read back),
        // as with a store that is down: only its flushes fail, which the
        // engine answers by suspending the tier's writes, not by failing
        // the pool (decision 0032). Nothing of it is ever stored.
        let mut state = self.state.lock().expect("tier state lock");
        state.write_sequence += 1;
        let write_sequence = state.write_sequence;
        for span in self.geometry.spans(offset, data.len() as u64) {
            let range = span.range_in_segment;
            state.segments.entry(span.segment_index).or_default().write(
                range.start,
                range.end - range.start,
                data.clone(),
                crate::to_usize(span.request_start),
                write_sequence,
            );
        }
        Ok(())
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        let mut commits = self.commits.lock().await;
        self.flush_pending(&mut commits)
            .await
            .map_err(|error| error.into_device_error(&self.url, 0, 0))
    }

    /// Starts a new generation of the segment: its old parts are hidden at
    /// once and deleted in the background. Nothing is written to the store,
    /// so after a crash before the next flush the segment shows its old
    /// generation again: old contents the layer above no longer needs (see
    /// the decision).
    async fn open_region(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Option<RegionShape>, DeviceError> {
        check_request(&self.url, self.size_bytes(), offset, length)?;
        let geometry = self.geometry;
        let (segment_index, offset_in_segment) = geometry.locate(offset);
        let window = geometry.window(segment_index);
        if offset_in_segment != window.start || length != window.end - window.start {
            let error = ObjectStoreError::RegionNotSegment {
                offset,
                length,
                segment_size_bytes: geometry.segment_size_bytes,
                segment_origin_bytes: geometry.segment_origin_bytes,
            };
            return Err(error.into_device_error(&self.url, offset, length));
        }
        let garbage = {
            let mut state = self.state.lock().expect("tier state lock");
            let garbage = state.segments.entry(segment_index).or_default().reopen();
            state.index_version += 1;
            garbage
        };
        self.queue_deletions(garbage);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::{ObjectStore, ObjectStoreExt};

    const MIB: u64 = 1 << 20;

    fn location() -> TierLocation {
        TierLocation {
            bucket: "bucket".to_string(),
            prefix: "pool/capacity".to_string(),
            limits: ObjectStoreLimits {
                delete_retry_delay_ms: 10,
                ..ObjectStoreLimits::default()
            },
        }
    }

    fn geometry() -> TierGeometry {
        TierGeometry::new(16 * MIB, MIB, 256 * 1024)
    }

    fn pattern(blocks: usize, seed: u8) -> Arc<AlignedBuffer> {
        let mut buffer = AlignedBuffer::zeroed(blocks * 4096);
        for (index, byte) in buffer.iter_mut().enumerate() {
            *byte = seed.wrapping_add(u8::try_from(index % 253).unwrap());
        }
        Arc::new(buffer)
    }

    async fn keys(store: &Arc<dyn ObjectStore>) -> Vec<String> {
        let mut keys: Vec<String> = store
            .list(None)
            .map(|meta| meta.unwrap().location.to_string())
            .collect()
            .await;
        keys.sort();
        keys
    }

    async fn wait_for_deletions(device: &ObjectStoreDevice) {
        for _ in 0..500 {
            if device.statistics().objects_awaiting_deletion == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("deletions did not finish");
    }

    #[tokio::test]
    async fn flushed_writes_survive_a_reopen_and_unflushed_ones_do_not() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let device = ObjectStoreDevice::create_in(store.clone(), location(), geometry())
            .await
            .unwrap();
        // Across the short first segment's end and a whole segment.
        let first = pattern(320, 1);
        device.write(200 * 1024, first.clone()).await.unwrap();
        assert_eq!(
            &device.read(200 * 1024, 320 * 4096).await.unwrap()[..],
            &first[..]
        );
        device.flush().await.unwrap();
        assert_eq!(device.statistics().pending_bytes, 0);
        let unflushed = pattern(2, 9);
        device.write(8 * MIB, unflushed.clone()).await.unwrap();
        assert_eq!(
            &device.read(8 * MIB, 8192).await.unwrap()[..],
            &unflushed[..]
        );
        assert_eq!(device.statistics().pending_bytes, 8192);
        drop(device);
        let reopened = ObjectStoreDevice::open_in(store.clone(), location())
            .await
            .unwrap();
        assert_eq!(
            &reopened.read(200 * 1024, 320 * 4096).await.unwrap()[..],
            &first[..]
        );
        assert!(
            reopened
                .read(8 * MIB, 8192)
                .await
                .unwrap()
                .iter()
                .all(|byte| *byte == 0)
        );
        assert!(reopened.read(16 * MIB, 4096).await.is_err());
        // The write spanned three segments: one part in each.
        assert_eq!(reopened.statistics().objects_stored, 3);
    }

    #[tokio::test]
    async fn a_reopened_segment_hides_its_old_parts_and_deletes_them() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let device = ObjectStoreDevice::create_in(store.clone(), location(), geometry())
            .await
            .unwrap();
        let segment_start = 256 * 1024 + 2 * MIB;
        device.write(segment_start, pattern(16, 3)).await.unwrap();
        device
            .write(segment_start + MIB, pattern(1, 4))
            .await
            .unwrap();
        device.flush().await.unwrap();
        assert_eq!(keys(&store).await.len(), 3);
        assert!(
            device
                .open_region(segment_start, MIB)
                .await
                .unwrap()
                .is_none()
        );
        assert!(
            device
                .read(segment_start, 16 * 4096)
                .await
                .unwrap()
                .iter()
                .all(|byte| *byte == 0)
        );
        assert_eq!(
            &device.read(segment_start + MIB, 4096).await.unwrap()[..],
            &pattern(1, 4)[..]
        );
        wait_for_deletions(&device).await;
        assert_eq!(keys(&store).await.len(), 2);
        let new = pattern(1, 5);
        device
            .write(segment_start + 4096, new.clone())
            .await
            .unwrap();
        device.flush().await.unwrap();
        let listing = keys(&store).await;
        assert!(
            listing.iter().any(|key| key
                .contains("/00000003/00000001/00000001-0000000002-00000000-0000004096-0000004096")),
            "{listing:?}"
        );
        drop(device);
        let reopened = ObjectStoreDevice::open_in(store, location()).await.unwrap();
        assert!(
            reopened
                .read(segment_start, 4096)
                .await
                .unwrap()
                .iter()
                .all(|byte| *byte == 0)
        );
        assert_eq!(
            &reopened.read(segment_start + 4096, 4096).await.unwrap()[..],
            &new[..]
        );
    }

    /// A crash after a segment was opened again but before anything new in
    /// it was flushed: the old generation shows again (its deletion had not
    /// run), as a disk shows old contents the log no longer needs.
    #[tokio::test]
    async fn a_crash_before_the_new_generation_is_flushed_shows_the_old_one() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let device = ObjectStoreDevice::create_in(store.clone(), location(), geometry())
            .await
            .unwrap();
        let segment_start = 256 * 1024 + MIB;
        let old = pattern(4, 7);
        device.write(segment_start, old.clone()).await.unwrap();
        device.flush().await.unwrap();
        // The deleter is stopped, as a crash would stop it.
        device.deleter.abort();
        device.open_region(segment_start, MIB).await.unwrap();
        device.write(segment_start, pattern(4, 8)).await.unwrap();
        drop(device);
        let reopened = ObjectStoreDevice::open_in(store.clone(), location())
            .await
            .unwrap();
        assert_eq!(
            &reopened.read(segment_start, 4 * 4096).await.unwrap()[..],
            &old[..]
        );
        // Opened again and flushed: the new generation wins at the next open,
        // and that open deletes the old one.
        reopened.open_region(segment_start, MIB).await.unwrap();
        let new = pattern(1, 9);
        reopened.write(segment_start, new.clone()).await.unwrap();
        reopened.flush().await.unwrap();
        reopened.deleter.abort();
        drop(reopened);
        let again = ObjectStoreDevice::open_in(store.clone(), location())
            .await
            .unwrap();
        let expected: Vec<u8> = new
            .iter()
            .copied()
            .chain(std::iter::repeat_n(0, 3 * 4096))
            .collect();
        assert_eq!(
            &again.read(segment_start, 4 * 4096).await.unwrap()[..],
            &expected[..]
        );
        wait_for_deletions(&again).await;
        assert_eq!(keys(&store).await.len(), 2, "the label and the new part");
    }

    #[tokio::test]
    async fn parts_hidden_by_newer_ones_are_deleted() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let device = ObjectStoreDevice::create_in(store.clone(), location(), geometry())
            .await
            .unwrap();
        for seed in 0..5 {
            device.write(0, pattern(2, seed)).await.unwrap();
            device.flush().await.unwrap();
        }
        wait_for_deletions(&device).await;
        assert_eq!(keys(&store).await.len(), 2);
        assert_eq!(&device.read(0, 8192).await.unwrap()[..], &pattern(2, 4)[..]);
    }

    #[tokio::test]
    async fn labels_are_required_once_and_foreign_objects_are_ignored() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let error = ObjectStoreDevice::open_in(store.clone(), location())
            .await
            .err()
            .unwrap();
        assert!(
            matches!(error, ObjectStoreError::LabelMissing { .. }),
            "{error}"
        );
        let device = ObjectStoreDevice::create_in(store.clone(), location(), geometry())
            .await
            .unwrap();
        let data = pattern(1, 1);
        device.write(MIB + 256 * 1024, data.clone()).await.unwrap();
        device.flush().await.unwrap();
        drop(device);
        let error = ObjectStoreDevice::create_in(store.clone(), location(), geometry())
            .await
            .err()
            .unwrap();
        assert!(
            matches!(error, ObjectStoreError::LabelExists { .. }),
            "{error}"
        );
        for (key, length) in [
            ("pool/capacity/segments/junk", 4096),
            (
                "pool/capacity/segments/00000002/00000009/00000000-0000000000-0000008192",
                4096,
            ),
            (
                "pool/capacity/segments/00000099/00000000/00000000-0000000000-0000004096",
                4096,
            ),
            (
                "pool/capacity/segments/00000002/00000009/00000000-0000000100-0000004096",
                4096,
            ),
        ] {
            store
                .put(
                    &object_store::path::Path::from(key),
                    vec![0xff; length].into(),
                )
                .await
                .unwrap();
        }
        let reopened = ObjectStoreDevice::open_in(store.clone(), location())
            .await
            .unwrap();
        assert_eq!(
            &reopened.read(MIB + 256 * 1024, 4096).await.unwrap()[..],
            &data[..]
        );
        // Segment objects without a label are not a place for a new tier.
        store
            .delete(&object_store::path::Path::from(
                "pool/capacity/lamina-object-tier.json",
            ))
            .await
            .unwrap();
        let error = ObjectStoreDevice::create_in(store, location(), geometry())
            .await
            .err()
            .unwrap();
        assert!(
            matches!(error, ObjectStoreError::PrefixNotEmpty { .. }),
            "{error}"
        );
    }

    /// As a two-tier pool sees it: flash, then the tier; the engine's
    /// capacity segments start 1 MiB into the tier, which is the origin.
    #[tokio::test]
    async fn behind_a_concatenated_device_engine_segments_are_tier_segments() {
        use lamina_device::{ConcatenatedDevice, MemoryDevice};
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let tier_geometry = TierGeometry::new(18 * MIB, 4 * MIB, MIB);
        let tier = ObjectStoreDevice::create_in(store, location(), tier_geometry)
            .await
            .unwrap();
        let flash_bytes = 8 * MIB;
        let pool = ConcatenatedDevice::new(Arc::new(MemoryDevice::new(flash_bytes)), tier.clone());
        let label = pattern(1, 1);
        pool.write(flash_bytes, label.clone()).await.unwrap();
        for segment in 0..4 {
            let start = flash_bytes + MIB + segment * 4 * MIB;
            pool.open_region(start, 4 * MIB).await.unwrap();
            pool.write(start, pattern(1024, u8::try_from(segment).unwrap()))
                .await
                .unwrap();
        }
        pool.flush().await.unwrap();
        // Opening engine segment 1 again touches neither its neighbours nor the label.
        pool.open_region(flash_bytes + 5 * MIB, 4 * MIB)
            .await
            .unwrap();
        assert_eq!(&pool.read(flash_bytes, 4096).await.unwrap()[..], &label[..]);
        for segment in [0, 2, 3] {
            let start = flash_bytes + MIB + segment * 4 * MIB;
            let expected = pattern(1024, u8::try_from(segment).unwrap());
            assert_eq!(
                &pool.read(start, crate::to_usize(4 * MIB)).await.unwrap()[..],
                &expected[..]
            );
        }
        assert!(
            pool.read(flash_bytes + 5 * MIB, crate::to_usize(4 * MIB))
                .await
                .unwrap()
                .iter()
                .all(|byte| *byte == 0)
        );
        assert!(
            pool.open_region(flash_bytes + 3 * MIB, 4 * MIB)
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn regions_other_than_one_segment_are_refused() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let device = ObjectStoreDevice::create_in(store, location(), geometry())
            .await
            .unwrap();
        assert!(device.open_region(0, MIB).await.is_err());
        assert!(device.open_region(256 * 1024, MIB / 2).await.is_err());
        assert!(device.open_region(256 * 1024 + 4096, MIB).await.is_err());
        device.open_region(256 * 1024, MIB).await.unwrap();
        device.open_region(0, 256 * 1024).await.unwrap();
    }

    /// A store over an in-memory one whose PUTs of keys containing a marker
    /// fail (`failing_marker`), land but answer with an error once
    /// (`answer_lost_marker`), or are held in flight (`held_marker`): such a
    /// PUT never answers its caller and lands on the store only when
    /// [`ScriptedStore::release`] is called, whether or not its caller is
    /// still there — as a request of a process that died lands on a real
    /// server after the next process opened the tier.
    #[derive(Debug)]
    struct ScriptedStore {
        inner: Arc<InMemory>,
        failing_marker: Mutex<Option<String>>,
        answer_lost_marker: Mutex<Option<String>>,
        held_marker: Mutex<Option<String>>,
        gate: tokio::sync::watch::Sender<bool>,
        held_landed: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Default for ScriptedStore {
        fn default() -> Self {
            Self {
                inner: Arc::new(InMemory::new()),
                failing_marker: Mutex::default(),
                answer_lost_marker: Mutex::default(),
                held_marker: Mutex::default(),
                gate: tokio::sync::watch::channel(false).0,
                held_landed: Arc::default(),
            }
        }
    }

    impl ScriptedStore {
        fn matches(marker: &Mutex<Option<String>>, location: &object_store::path::Path) -> bool {
            marker
                .lock()
                .unwrap()
                .as_ref()
                .is_some_and(|marker| location.as_ref().contains(marker.as_str()))
        }

        /// Lets every held PUT land, and waits until `count` of them did.
        async fn release(&self, count: usize) {
            self.gate.send_replace(true);
            for _ in 0..1000 {
                if self.held_landed.load(std::sync::atomic::Ordering::Acquire) >= count {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            panic!("the held PUTs did not land");
        }
    }

    impl std::fmt::Display for ScriptedStore {
        fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(formatter, "ScriptedStore")
        }
    }

    #[async_trait::async_trait]
    impl ObjectStore for ScriptedStore {
        async fn put_opts(
            &self,
            location: &object_store::path::Path,
            payload: object_store::PutPayload,
            options: object_store::PutOptions,
        ) -> object_store::Result<object_store::PutResult> {
            let error = |reason: &str| object_store::Error::Generic {
                store: "ScriptedStore",
                source: reason.to_string().into(),
            };
            if Self::matches(&self.failing_marker, location) {
                return Err(error("this PUT fails"));
            }
            if Self::matches(&self.held_marker, location) {
                let inner = self.inner.clone();
                let mut gate = self.gate.subscribe();
                let landed = self.held_landed.clone();
                let location = location.clone();
                tokio::spawn(async move {
                    gate.wait_for(|open| *open).await.unwrap();
                    let _ = inner.put_opts(&location, payload, options).await;
                    landed.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                });
                return std::future::pending().await;
            }
            let result = self.inner.put_opts(location, payload, options).await;
            if result.is_ok() && Self::matches(&self.answer_lost_marker, location) {
                *self.answer_lost_marker.lock().unwrap() = None;
                return Err(error("the answer to this PUT was lost"));
            }
            result
        }

        async fn put_multipart_opts(
            &self,
            location: &object_store::path::Path,
            options: object_store::PutMultipartOptions,
        ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
            self.inner.put_multipart_opts(location, options).await
        }

        async fn get_opts(
            &self,
            location: &object_store::path::Path,
            options: object_store::GetOptions,
        ) -> object_store::Result<object_store::GetResult> {
            self.inner.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: futures::stream::BoxStream<
                'static,
                object_store::Result<object_store::path::Path>,
            >,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>>
        {
            self.inner.delete_stream(locations)
        }

        fn list(
            &self,
            prefix: Option<&object_store::path::Path>,
        ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
        {
            self.inner.list(prefix)
        }

        async fn list_with_delimiter(
            &self,
            prefix: Option<&object_store::path::Path>,
        ) -> object_store::Result<object_store::ListResult> {
            self.inner.list_with_delimiter(prefix).await
        }

        async fn copy_opts(
            &self,
            from: &object_store::path::Path,
            to: &object_store::path::Path,
            options: object_store::CopyOptions,
        ) -> object_store::Result<()> {
            self.inner.copy_opts(from, to, options).await
        }
    }

    /// A write longer than `part_bytes_max` is flushed as several parts. One
    /// of them failing leaves the flush uncommitted and the whole write
    /// pending: it reads back, and the next flush stores it, so that after it
    /// returns it survives a reopen (the first part stored once took the
    /// whole write out of the pending map, and the retried flush then
    /// returned with nothing to store).
    #[tokio::test]
    async fn a_failed_part_of_a_long_write_stays_pending_until_a_flush_stores_it() {
        let failing = Arc::new(ScriptedStore::default());
        let store: Arc<dyn ObjectStore> = failing.clone();
        let small_parts = TierLocation {
            limits: ObjectStoreLimits {
                part_bytes_max: 4096,
                ..location().limits
            },
            ..location()
        };
        let device = ObjectStoreDevice::create_in(store.clone(), small_parts.clone(), geometry())
            .await
            .unwrap();
        let segment_start = 256 * 1024 + 2 * MIB;
        let data = pattern(4, 6);
        device.write(segment_start, data.clone()).await.unwrap();
        // The part of the write's second block.
        *failing.failing_marker.lock().unwrap() = Some("-0000004096-0000004096".to_string());
        assert!(device.flush().await.is_err());
        assert_eq!(device.statistics().pending_bytes, 4 * 4096);
        assert_eq!(device.statistics().flushes_committed, 0);
        assert_eq!(
            &device.read(segment_start, 4 * 4096).await.unwrap()[..],
            &data[..]
        );
        *failing.failing_marker.lock().unwrap() = None;
        device.flush().await.unwrap();
        assert_eq!(device.statistics().pending_bytes, 0);
        drop(device);
        let reopened = ObjectStoreDevice::open_in(store, small_parts)
            .await
            .unwrap();
        assert_eq!(
            &reopened.read(segment_start, 4 * 4096).await.unwrap()[..],
            &data[..]
        );
    }
    fn zeros(buffer: &AlignedBuffer) -> bool {
        buffer.iter().all(|byte| *byte == 0)
    }

    /// A flush in flight when its process died: its PUTs land on the store
    /// only after the next process opened the tier and wrote over the same
    /// segment. They must never change what any later open sees — neither
    /// where the next process wrote (its data, not the older data that
    /// landed later) nor where it did not (what it saw there, not data that
    /// appeared after it looked). With format 1's keys the late part had the
    /// same key as the next process's first part and replaced it, and the
    /// other late part showed up at the third open.
    #[tokio::test]
    async fn a_dead_processes_late_parts_never_change_what_a_later_open_sees() {
        let scripted = Arc::new(ScriptedStore::default());
        let store: Arc<dyn ObjectStore> = scripted.clone();
        let first = ObjectStoreDevice::create_in(store.clone(), location(), geometry())
            .await
            .unwrap();
        let segment_start = 256 * 1024 + 2 * MIB;
        let committed = pattern(4, 1);
        first.write(segment_start, committed.clone()).await.unwrap();
        first.flush().await.unwrap();
        // The next flush's parts stay in flight, and the process dies.
        first.write(segment_start, pattern(4, 2)).await.unwrap();
        first
            .write(segment_start + 8 * 4096, pattern(2, 3))
            .await
            .unwrap();
        *scripted.held_marker.lock().unwrap() = Some("/segments/".to_string());
        let dying = first.clone();
        let flush = tokio::spawn(async move { dying.flush().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        flush.abort();
        first.deleter.abort();
        drop(first);
        *scripted.held_marker.lock().unwrap() = None;

        let second = ObjectStoreDevice::open_in(store.clone(), location())
            .await
            .unwrap();
        assert_eq!(second.statistics().epoch, 2);
        assert_eq!(
            &second.read(segment_start, 4 * 4096).await.unwrap()[..],
            &committed[..]
        );
        assert!(zeros(
            &second
                .read(segment_start + 8 * 4096, 2 * 4096)
                .await
                .unwrap()
        ));
        let newer = pattern(1, 4);
        second.write(segment_start, newer.clone()).await.unwrap();
        second.flush().await.unwrap();
        scripted.release(2).await;
        let expected: Vec<u8> = newer.iter().chain(&committed[4096..]).copied().collect();
        assert_eq!(
            &second.read(segment_start, 4 * 4096).await.unwrap()[..],
            &expected[..]
        );
        second.deleter.abort();
        drop(second);

        let third = ObjectStoreDevice::open_in(store.clone(), location())
            .await
            .unwrap();
        assert_eq!(
            &third.read(segment_start, 4 * 4096).await.unwrap()[..],
            &expected[..]
        );
        assert!(zeros(
            &third
                .read(segment_start + 8 * 4096, 2 * 4096)
                .await
                .unwrap()
        ));
        wait_for_deletions(&third).await;
        let listing = keys(&store).await;
        assert!(
            listing
                .iter()
                .all(|key| !key.contains("/00000001-0000000002-")),
            "the late parts are deleted: {listing:?}"
        );
    }

    /// A process whose parts were stored but whose commit (the label write)
    /// was still in flight when it died: the commit lands after the next
    /// open and is refused, since the label is no longer the version it was
    /// conditional on; the parts never count.
    #[tokio::test]
    async fn a_dead_processes_late_commit_is_refused() {
        let scripted = Arc::new(ScriptedStore::default());
        let store: Arc<dyn ObjectStore> = scripted.clone();
        let first = ObjectStoreDevice::create_in(store.clone(), location(), geometry())
            .await
            .unwrap();
        let segment_start = 256 * 1024 + MIB;
        first.write(segment_start, pattern(2, 1)).await.unwrap();
        *scripted.held_marker.lock().unwrap() = Some(LABEL_OBJECT_NAME.to_string());
        let dying = first.clone();
        let flush = tokio::spawn(async move { dying.flush().await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        flush.abort();
        drop(first);
        *scripted.held_marker.lock().unwrap() = None;
        let second = ObjectStoreDevice::open_in(store.clone(), location())
            .await
            .unwrap();
        scripted.release(1).await;
        assert!(zeros(&second.read(segment_start, 2 * 4096).await.unwrap()));
        drop(second);
        let third = ObjectStoreDevice::open_in(store, location()).await.unwrap();
        assert_eq!(third.statistics().epoch, 3);
        assert!(zeros(&third.read(segment_start, 2 * 4096).await.unwrap()));
    }

    /// Two processes on one tier: the later open fences the earlier one,
    /// whose next flush fails (and says why) instead of storing data that
    /// no open would count.
    #[tokio::test]
    async fn a_later_open_fences_the_earlier_process() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let first = ObjectStoreDevice::create_in(store.clone(), location(), geometry())
            .await
            .unwrap();
        let segment_start = 256 * 1024;
        let kept = pattern(1, 1);
        first.write(segment_start, kept.clone()).await.unwrap();
        first.flush().await.unwrap();
        let second = ObjectStoreDevice::open_in(store.clone(), location())
            .await
            .unwrap();
        first
            .write(segment_start + 4096, pattern(1, 2))
            .await
            .unwrap();
        let error = first.flush().await.unwrap_err();
        assert!(
            error
                .to_string()
                .contains("opened again by another process"),
            "{error}"
        );
        assert_eq!(first.statistics().fenced_by_epoch, Some(2));
        // Writes still land in memory and read back; flushes keep failing.
        first.write(segment_start, pattern(1, 3)).await.unwrap();
        assert_eq!(
            &first.read(segment_start, 4096).await.unwrap()[..],
            &pattern(1, 3)[..]
        );
        assert!(first.flush().await.is_err());
        let written = pattern(1, 4);
        second
            .write(segment_start + 2 * 4096, written.clone())
            .await
            .unwrap();
        second.flush().await.unwrap();
        drop((first, second));
        let third = ObjectStoreDevice::open_in(store, location()).await.unwrap();
        let expected: Vec<u8> = kept
            .iter()
            .copied()
            .chain(std::iter::repeat_n(0, 4096))
            .chain(written.iter().copied())
            .collect();
        assert_eq!(
            &third.read(segment_start, 3 * 4096).await.unwrap()[..],
            &expected[..]
        );
    }

    /// A commit that landed but whose answer was lost: the flush fails, the
    /// next one finds the label already committing its number (it keeps the
    /// failed flush's number) and succeeds instead of calling itself fenced.
    #[tokio::test]
    async fn a_commit_whose_answer_was_lost_is_recognised_as_its_own() {
        let scripted = Arc::new(ScriptedStore::default());
        let store: Arc<dyn ObjectStore> = scripted.clone();
        let device = ObjectStoreDevice::create_in(store.clone(), location(), geometry())
            .await
            .unwrap();
        let segment_start = 256 * 1024 + 3 * MIB;
        let first = pattern(1, 1);
        device.write(segment_start, first.clone()).await.unwrap();
        *scripted.answer_lost_marker.lock().unwrap() = Some(LABEL_OBJECT_NAME.to_string());
        assert!(device.flush().await.is_err());
        let second = pattern(1, 2);
        device
            .write(segment_start + 4096, second.clone())
            .await
            .unwrap();
        device.flush().await.unwrap();
        let statistics = device.statistics();
        assert_eq!(
            (statistics.flushes_committed, statistics.fenced_by_epoch),
            (1, None)
        );
        let third = pattern(1, 3);
        device
            .write(segment_start + 2 * 4096, third.clone())
            .await
            .unwrap();
        device.flush().await.unwrap();
        assert_eq!(device.statistics().flushes_committed, 2);
        drop(device);
        let reopened = ObjectStoreDevice::open_in(store, location()).await.unwrap();
        let expected: Vec<u8> = [first, second, third]
            .iter()
            .flat_map(|buffer| buffer.iter().copied())
            .collect();
        assert_eq!(
            &reopened.read(segment_start, 3 * 4096).await.unwrap()[..],
            &expected[..]
        );
    }

    /// A pool's record of its epoch: reopens by the same pool pass (also
    /// after a crash between recording an epoch and taking it); once another
    /// process took the tier, the pool is refused and says why.
    #[tokio::test]
    async fn a_pool_whose_tier_another_process_took_is_refused() {
        use crate::epoch_record::{EpochRecord, MemoryEpochRecord};
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let record = MemoryEpochRecord::default();
        let device =
            ObjectStoreDevice::create_in_with(store.clone(), location(), geometry(), Some(&record))
                .await
                .unwrap();
        assert_eq!(record.last_epoch().unwrap(), Some(1));
        drop(device);
        let device = ObjectStoreDevice::open_in_with(store.clone(), location(), Some(&record))
            .await
            .unwrap();
        assert_eq!(device.statistics().epoch, 2);
        assert_eq!(record.last_epoch().unwrap(), Some(2));
        drop(device);
        // Recorded, then the crash came before the label was written.
        record.record(3).unwrap();
        let device = ObjectStoreDevice::open_in_with(store.clone(), location(), Some(&record))
            .await
            .unwrap();
        assert_eq!(device.statistics().epoch, 3);
        drop(device);
        // A copy of the pool (its own record, copied) takes the tier.
        let copy = MemoryEpochRecord::default();
        copy.record(3).unwrap();
        let taken = ObjectStoreDevice::open_in_with(store.clone(), location(), Some(&copy))
            .await
            .unwrap();
        drop(taken);
        let error = ObjectStoreDevice::open_in_with(store.clone(), location(), Some(&record))
            .await
            .err()
            .unwrap();
        assert!(
            matches!(
                error,
                ObjectStoreError::TakenSinceLastUse {
                    epoch: 4,
                    last_epoch: 3,
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(record.last_epoch().unwrap(), Some(3), "nothing recorded");
        // Without a record (the operator removed it), the pool takes it.
        let fresh = MemoryEpochRecord::default();
        let device = ObjectStoreDevice::open_in_with(store, location(), Some(&fresh))
            .await
            .unwrap();
        assert_eq!(device.statistics().epoch, 5);
    }
}
