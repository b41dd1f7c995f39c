//! What a tier reports about itself: per kind of request, how many, how many
//! failed, bytes and objects moved, latency quantiles, and what their HTTP
//! attempts met (retries, throttling, server and transport errors); and what it holds
//! (objects and bytes stored, bytes written but not yet flushed).

/// One kind of request since the tier was opened.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct RequestStatistics {
    /// Requests made (a retried request counts once; its retries count in
    /// `retries`).
    pub count: u64,
    /// Requests that failed after their retries.
    pub errors: u64,
    /// Payload bytes of the successful requests (PUT: sent, GET: received).
    pub bytes: u64,
    /// Objects the successful requests concerned (a bulk DELETE names many,
    /// a LIST returns many).
    pub objects: u64,
    /// Of a whole request, its retries included.
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
    pub latency_max_us: u64,
    /// HTTP attempts beyond a request's first: object_store retries with
    /// backoff on throttling, 5xx, timeouts and dropped connections.
    pub retries: u64,
    /// Attempts the store answered 503 (S3's Slow Down) or 429.
    pub throttled: u64,
    /// Attempts answered with another 5xx.
    pub server_errors: u64,
    /// Attempts that timed out (`request_timeout_ms`, `connect_timeout_ms`,
    /// or a 408 from the store).
    pub timeouts: u64,
    /// Attempts whose connection was refused, reset or cut.
    pub transport_errors: u64,
}

/// See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ObjectStoreStatistics {
    pub url: String,
    pub get: RequestStatistics,
    pub put: RequestStatistics,
    pub delete: RequestStatistics,
    pub list: RequestStatistics,
    /// Conditional writes of the label: one per open, one per committed
    /// flush.
    pub label_put: RequestStatistics,
    /// Part objects of the segments' current generations.
    pub objects_stored: u64,
    pub bytes_stored: u64,
    /// Objects no longer needed (older generations, parts hidden by newer
    /// ones) that the background deleter has yet to delete.
    pub objects_awaiting_deletion: u64,
    /// Bytes written but not yet stored by a flush.
    pub pending_bytes: u64,
    /// This process's open of the tier (docs/format.md, "Epochs").
    pub epoch: u64,
    /// Flushes of this epoch whose parts are committed in the label.
    pub flushes_committed: u64,
    /// Set when another process opened the tier after this one: the epoch
    /// it took. This process then stores nothing more.
    pub fenced_by_epoch: Option<u64>,
}
