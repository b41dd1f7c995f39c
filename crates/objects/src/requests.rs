//! Every request a tier makes goes through here: it waits for one of
//! `requests_in_flight_max` permits (so that a flush of many runs or a burst
//! of reads cannot open hundreds of connections), and it is counted and timed
//! per kind (GET, PUT, DELETE, LIST) for the tier's statistics. object_store
//! does the retries and timeouts underneath: a request counts once here
//! whatever it took, and its HTTP attempts (retries, throttling, server and
//! transport errors) are counted by `attempts.rs`, which sees them because
//! each request runs inside [`in_request`].

use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion,
};
use tokio::sync::Semaphore;

use crate::ObjectStoreError;
use crate::attempts::{AttemptCounters, AttemptCounts, LastAttempt, in_request};
use crate::request_kind::RequestKind;
use crate::statistics::RequestStatistics;

/// Highest latency the histograms track (one hour), in microseconds.
const LATENCY_MAX_US: u64 = 3_600_000_000;

/// Objects one bulk DELETE request may name (S3's limit).
pub const DELETE_REQUEST_OBJECTS_MAX: usize = 1000;

/// Per-kind counters and latencies.
struct KindRecord {
    count: u64,
    errors: u64,
    bytes: u64,
    objects: u64,
    latency_us: hdrhistogram::Histogram<u64>,
}

impl KindRecord {
    fn new() -> Self {
        Self {
            count: 0,
            errors: 0,
            bytes: 0,
            objects: 0,
            latency_us: hdrhistogram::Histogram::new_with_bounds(1, LATENCY_MAX_US, 2)
                .expect("valid histogram bounds"),
        }
    }

    fn statistics(&self, attempts: AttemptCounts) -> RequestStatistics {
        let quantile = |quantile: f64| {
            if self.latency_us.is_empty() {
                0
            } else {
                self.latency_us.value_at_quantile(quantile)
            }
        };
        RequestStatistics {
            count: self.count,
            errors: self.errors,
            bytes: self.bytes,
            objects: self.objects,
            latency_p50_us: quantile(0.5),
            latency_p99_us: quantile(0.99),
            latency_max_us: self.latency_us.max(),
            retries: attempts.retries,
            throttled: attempts.throttled,
            server_errors: attempts.server_errors,
            timeouts: attempts.timeouts,
            transport_errors: attempts.transport_errors,
        }
    }
}

/// The store with its permits and counters. See the module documentation.
pub struct CountedStore {
    store: Arc<dyn ObjectStore>,
    bucket: String,
    permits: Semaphore,
    records: Mutex<[KindRecord; 5]>,
    attempts: Arc<AttemptCounters>,
}

fn kind_slot(kind: RequestKind) -> usize {
    match kind {
        RequestKind::Get => 0,
        RequestKind::Put => 1,
        RequestKind::Delete => 2,
        RequestKind::List => 3,
        RequestKind::LabelPut => 4,
    }
}

impl CountedStore {
    pub fn new(store: Arc<dyn ObjectStore>, bucket: &str, requests_in_flight_max: usize) -> Self {
        assert!(requests_in_flight_max > 0);
        Self {
            store,
            bucket: bucket.to_string(),
            permits: Semaphore::new(requests_in_flight_max),
            records: Mutex::new([
                KindRecord::new(),
                KindRecord::new(),
                KindRecord::new(),
                KindRecord::new(),
                KindRecord::new(),
            ]),
            attempts: Arc::new(AttemptCounters::default()),
        }
    }

    pub fn statistics(&self, kind: RequestKind) -> RequestStatistics {
        let attempts = self.attempts.counts(kind);
        self.records.lock().expect("request records lock")[kind_slot(kind)].statistics(attempts)
    }

    fn record(
        &self,
        kind: RequestKind,
        started: Instant,
        succeeded: bool,
        bytes: u64,
        objects: u64,
    ) {
        let elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let mut records = self.records.lock().expect("request records lock");
        let record = &mut records[kind_slot(kind)];
        record.count += 1;
        record.latency_us.saturating_record(elapsed_us.max(1));
        if succeeded {
            record.bytes += bytes;
            record.objects += objects;
        } else {
            record.errors += 1;
        }
    }

    fn error(
        &self,
        operation: RequestKind,
        key: &str,
        last_attempt: Option<LastAttempt>,
        cause: object_store::Error,
    ) -> ObjectStoreError {
        ObjectStoreError::Request {
            operation,
            bucket: self.bucket.clone(),
            key: key.to_string(),
            last_attempt: last_attempt.map(Box::new),
            cause: Box::new(cause),
        }
    }

    async fn permit(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.permits
            .acquire()
            .await
            .expect("the request semaphore is never closed")
    }

    pub async fn put(&self, key: &str, payload: Bytes) -> Result<(), ObjectStoreError> {
        self.put_with_mode(RequestKind::Put, key, payload, PutMode::Overwrite)
            .await
            .map(|_| ())
    }

    /// A PUT, counted as `kind`, that is conditional as `mode` says
    /// (`Create`: only if absent; `Update`: only if the object is still the
    /// version given); the new version on success.
    pub async fn put_with_mode(
        &self,
        kind: RequestKind,
        key: &str,
        payload: Bytes,
        mode: PutMode,
    ) -> Result<UpdateVersion, ObjectStoreError> {
        let _permit = self.permit().await;
        let started = Instant::now();
        let length = payload.len() as u64;
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        let attempted = in_request(
            &self.attempts,
            kind,
            self.store
                .put_opts(&Path::from(key), PutPayload::from_bytes(payload), options),
        )
        .await;
        let result = attempted.output;
        self.record(kind, started, result.is_ok(), length, 1);
        result
            .map(|result| UpdateVersion {
                e_tag: result.e_tag,
                version: result.version,
            })
            .map_err(|cause| self.error(kind, key, attempted.last_attempt, cause))
    }

    /// Bytes `range` of object `key` (one ranged GET).
    pub async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes, ObjectStoreError> {
        let _permit = self.permit().await;
        let started = Instant::now();
        let expected = range.end - range.start;
        let attempted = in_request(
            &self.attempts,
            RequestKind::Get,
            self.store.get_range(&Path::from(key), range),
        )
        .await;
        let result = match attempted.output {
            Ok(bytes) if bytes.len() as u64 != expected => Err(object_store::Error::Generic {
                store: "S3",
                source: format!(
                    "a ranged GET returned {} bytes, not {expected}",
                    bytes.len()
                )
                .into(),
            }),
            other => other,
        };
        self.record(RequestKind::Get, started, result.is_ok(), expected, 1);
        result.map_err(|cause| self.error(RequestKind::Get, key, attempted.last_attempt, cause))
    }

    /// The whole of object `key`, with the version it was (for a later
    /// conditional PUT over it).
    pub async fn get(&self, key: &str) -> Result<(Bytes, UpdateVersion), ObjectStoreError> {
        let _permit = self.permit().await;
        let started = Instant::now();
        let whole_object = async {
            let object = self.store.get(&Path::from(key)).await?;
            let version = UpdateVersion {
                e_tag: object.meta.e_tag.clone(),
                version: object.meta.version.clone(),
            };
            object.bytes().await.map(|bytes| (bytes, version))
        };
        let attempted = in_request(&self.attempts, RequestKind::Get, whole_object).await;
        let result = attempted.output;
        let length = result.as_ref().map_or(0, |(bytes, _)| bytes.len() as u64);
        self.record(RequestKind::Get, started, result.is_ok(), length, 1);
        result.map_err(|cause| self.error(RequestKind::Get, key, attempted.last_attempt, cause))
    }

    /// Every object under `prefix` (a folder: `prefix/...`), the pages of
    /// one listing counted as one request.
    pub async fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>, ObjectStoreError> {
        let _permit = self.permit().await;
        let started = Instant::now();
        let path = Path::from(prefix);
        let pages = async {
            let mut listing = self.store.list(Some(&path));
            let mut objects = Vec::new();
            while let Some(item) = listing.next().await {
                match item {
                    Ok(meta) => objects.push(meta),
                    Err(error) => return (objects, Some(error)),
                }
            }
            (objects, None)
        };
        let attempted = in_request(&self.attempts, RequestKind::List, pages).await;
        let (objects, failure) = attempted.output;
        self.record(
            RequestKind::List,
            started,
            failure.is_none(),
            0,
            objects.len() as u64,
        );
        match failure {
            None => Ok(objects),
            Some(cause) => {
                Err(self.error(RequestKind::List, prefix, attempted.last_attempt, cause))
            }
        }
    }

    /// Deletes `keys` (one bulk request of at most 1000 where the store
    /// supports it). An object already gone counts as deleted; on any other
    /// failure the first error is returned and the caller tries them all
    /// again later (deleting twice is harmless).
    pub async fn delete_many(&self, keys: Vec<String>) -> Result<(), ObjectStoreError> {
        // One bulk DELETE is one POST: `attempts.rs` takes a repeated POST
        // within one request for a retry.
        assert!(
            keys.len() <= DELETE_REQUEST_OBJECTS_MAX,
            "a bulk DELETE names at most {DELETE_REQUEST_OBJECTS_MAX} objects"
        );
        let _permit = self.permit().await;
        let started = Instant::now();
        let requested = keys.len() as u64;
        let first_key = keys.first().cloned().unwrap_or_default();
        let paths = futures::stream::iter(keys.into_iter().map(|key| Ok(Path::from(key)))).boxed();
        let attempted = in_request(
            &self.attempts,
            RequestKind::Delete,
            self.store
                .delete_stream(paths)
                .collect::<Vec<object_store::Result<Path>>>(),
        )
        .await;
        let failure = attempted
            .output
            .into_iter()
            .find_map(|result| match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => None,
                Err(error) => Some(error),
            });
        self.record(
            RequestKind::Delete,
            started,
            failure.is_none(),
            0,
            requested,
        );
        match failure {
            None => Ok(()),
            Some(cause) => Err(self.error(
                RequestKind::Delete,
                &first_key,
                attempted.last_attempt,
                cause,
            )),
        }
    }
}
