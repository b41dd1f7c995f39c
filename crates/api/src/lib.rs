//! The admin API's answers as typed structs: what `lamina pool status --json`,
//! `volume list --json`, `volume stats --json` and `snapshot list --json` print,
//! and what the daemon's `POST /v1/operations` returns. The daemon serializes
//! these (converted from the engine's own types, see lamina-control's `api`
//! module); readers such as `lamina bench` deserialize them, so that neither
//! reads a field by a string key and neither depends on the engine.
//!
//! Every field is required when reading, `Option`s included (they are written as
//! `null`): a field the daemon renamed or dropped is a deserialization error that
//! names it, never a silent zero. Fields a reader does not know are ignored, so a
//! daemon may add fields without breaking older readers.
//!
//! The field names and order are the JSON's; changing them changes what users'
//! scripts read (docs/decisions/0015-typed-admin-api.md).

pub mod size;

use serde::{Deserialize, Deserializer, Serialize};

/// Reads an `Option` field that must be present (as `null` or a value): serde
/// would otherwise take a missing `Option` field for `None`.
fn required<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    Option::deserialize(deserializer)
}

/// What `pool status` shows (see the engine's `PoolStatus` for each figure).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoolStatus {
    pub device: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub reserved_bytes: u64,
    /// Bytes clients would read back from the live data (each block once
    /// however many snapshots and clones share it), the device bytes it
    /// takes after compression, and their ratio as ZFS's `compressratio`
    /// (absent from daemons before issue 44: 0, 0 and 1.0).
    #[serde(default)]
    pub logical_bytes: u64,
    #[serde(default)]
    pub stored_bytes: u64,
    #[serde(default = "ratio_one")]
    pub compress_ratio: f64,
    /// Used share of the space clients can fill, in percent: 100 when writes
    /// fail with ENOSPC.
    pub used_percent: f64,
    /// The highest usage warning threshold reached, 0 for none.
    pub usage_warning_percent: u8,
    pub segment_size_bytes: u64,
    pub segment_count: u64,
    pub free_segment_count: u64,
    pub volume_count: usize,
    /// Bytes clients have written over the pool's life.
    pub client_bytes_written: u64,
    /// Log and checkpoint bytes written to the devices over the pool's life.
    pub device_bytes_written: u64,
    /// `device_bytes_written / client_bytes_written`; none before clients write.
    #[serde(deserialize_with = "required")]
    pub write_amplification: Option<f64>,
    pub cleaner_relocated_blocks: u64,
    pub dead_segment_count: u64,
    pub cleaner_state: CleanerState,
    /// Free-space pressure on the cleaner, 0 (idle) to 1.
    pub cleaner_pressure: f64,
    /// Writes that found no free segment and waited for a reclaim since
    /// the daemon opened the pool (absent from daemons that predate it:
    /// zero).
    #[serde(default)]
    pub space_waits: SpaceWaits,
    /// The flash tier's flushes since the daemon opened the pool, and the
    /// time spent in each stage in all (absent from daemons that predate
    /// it: zero).
    #[serde(default)]
    pub flush_stages: FlushStages,
    pub durable_batch_sequence: u64,
    pub checkpoint_sequence: u64,
    /// Why the pool refuses writes, after an I/O error.
    #[serde(deserialize_with = "required")]
    pub failed: Option<String>,
    /// Set while the device under the pool is out of space.
    #[serde(deserialize_with = "required")]
    pub device_full: Option<DeviceFullStatus>,
    pub device_full_retries: u64,
    pub memory_cache: CacheStatistics,
    /// The memory cache's warm-up after a restart (absent from daemons that
    /// predate it: no warm-up).
    #[serde(default)]
    pub cache_warmup: CacheWarmupStatus,
    /// Space of the flash tier (all of a one-tier pool).
    pub flash: TierSpace,
    /// Space of the capacity tier, in a two-tier pool.
    #[serde(deserialize_with = "required")]
    pub capacity: Option<TierSpace>,
    /// In a two-tier pool, live bytes whose only copy is on flash: lost with
    /// the flash device (absent from one-tier pools and older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flash_only_bytes: Option<u64>,
    pub promoted_blocks: u64,
    pub demoted_blocks: u64,
    /// Whether the capacity tier takes writes, in a two-tier pool (absent
    /// from one-tier pools and from daemons before decision 0032).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_writes: Option<CapacityWritesStatus>,
    pub integrity: IntegrityStatus,
    /// The latest scrub since the pool opened.
    pub scrub: ScrubStatus,
    /// The latest rebuild since the pool opened (a device being replaced).
    #[serde(default)]
    pub rebuild: RebuildStatus,
    /// The budget rebuild, cleaner, demoter and scrub share.
    pub background: BackgroundBudgetStatus,
    /// The pool's devices, when a tier is an array (several devices or a
    /// redundancy scheme); absent for a pool on one device per tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<LayoutStatus>,
    /// The capacity tier on object storage, when the pool has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_tier: Option<ObjectTierStatus>,
}

/// Whether the capacity tier takes writes (decision 0032): after a failed
/// capacity flush (an object store away) they are `suspended` — demotion and
/// checkpoints wait, client writes go on on flash — until a retry succeeds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacityWritesStatus {
    pub suspended: Option<CapacitySuspension>,
    /// Times the tier's writes were suspended, and resumed, since the pool
    /// opened.
    pub suspensions: u64,
    pub resumptions: u64,
}

/// Why and since when the capacity tier's writes are suspended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapacitySuspension {
    /// The capacity flush's error, or the latest retry's.
    pub last_error: String,
    pub since_unix_seconds: u64,
    /// Retries of the capacity flush that failed since.
    pub failed_retries: u64,
}

/// A capacity tier on S3-compatible object storage (issue 22).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectTierStatus {
    /// `s3://bucket/prefix`.
    pub url: String,
    /// Objects the tier holds (parts of segments).
    pub object_count: u64,
    /// Bytes its objects hold.
    pub stored_bytes: u64,
    /// Bytes written and not yet stored: the next flush uploads them.
    pub pending_bytes: u64,
    /// Requests since the pool opened, by kind (`get`, `put` of parts,
    /// `delete`, `list`, and `label_put`: the conditional writes of the
    /// label, one per open and one per committed flush).
    pub requests: Vec<ObjectRequestStatistics>,
    /// This daemon's open of the tier (each open takes the next epoch in
    /// the tier's label).
    #[serde(default)]
    pub epoch: u64,
    /// Flushes of this epoch committed in the label.
    #[serde(default)]
    pub flushes_committed: u64,
    /// Set when another process opened the tier after this daemon did: the
    /// epoch it took. This daemon then stores nothing more in the tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_by_epoch: Option<u64>,
}

/// One kind of request to the object store since the pool opened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRequestStatistics {
    pub kind: String,
    pub count: u64,
    /// Requests that failed after their retries.
    pub errors: u64,
    /// Bytes sent (put) or received (get).
    pub bytes: u64,
    /// Of a whole request, its retries included.
    pub latency_p50_us: u64,
    pub latency_p99_us: u64,
    pub latency_max_us: u64,
    /// HTTP attempts beyond a request's first (object_store retries with
    /// backoff on throttling, 5xx, timeouts and dropped connections).
    #[serde(default)]
    pub retries: u64,
    /// Attempts the store answered 503 (S3's Slow Down) or 429.
    #[serde(default)]
    pub throttled: u64,
    /// Attempts answered with another 5xx.
    #[serde(default)]
    pub server_errors: u64,
    /// Attempts that timed out.
    #[serde(default)]
    pub timeouts: u64,
    /// Attempts whose connection was refused, reset or cut.
    #[serde(default)]
    pub transport_errors: u64,
}

/// What the rebuild is doing, named as mdadm and zpool name it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RebuildState {
    #[default]
    None,
    Rebuilding,
    Finished,
    Failed,
}

/// `pool status`'s rebuild section (see the engine's `RebuildStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildStatus {
    pub state: RebuildState,
    /// `replacement` (onto a new device) or `distributed-spare` (into the
    /// free space of the devices left).
    #[serde(default)]
    pub kind: RebuildKind,
    pub bytes_total: u64,
    pub bytes_done: u64,
    /// Of `bytes_done`, those that needed no work (what a resumed
    /// rebuild's replacement held already).
    #[serde(default)]
    pub bytes_skipped: u64,
    pub bytes_per_second: u64,
    pub seconds_left: Option<u64>,
    pub rows_verified: u64,
    pub blocks_unrepairable: u64,
    pub elapsed_ms: u64,
    pub error: Option<String>,
    /// Present while the pool has less redundancy than it was made with
    /// and no rebuild runs or can start by itself: why, and what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked: Option<RebuildBlocked>,
}

/// Why no rebuild restores a pool's redundancy (`pool status`'s
/// `rebuild.blocked`; `device rebuild` fails with its message).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildBlocked {
    pub reason: RebuildBlockedReason,
    /// One line: the cause, the figures, what to do.
    pub message: String,
    /// Live data in segments with less redundancy (0 when not counted).
    pub bytes_to_move: u64,
    /// Room for it on the devices left, at their narrower width.
    pub bytes_free: u64,
}

/// See [`RebuildBlocked`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebuildBlockedReason {
    /// The devices left lack the room for the data at their narrower width.
    NoRoom,
    /// Fewer devices left than the redundancy needs: only a replacement
    /// restores it.
    TooFewDevices,
    /// An array made before zones (label version 2) cannot narrow: only a
    /// replacement restores it.
    NotZoned,
    /// `rebuild_automatic` is off: `device rebuild` starts it.
    AutomaticOff,
}

/// A tier of an array pool, as the device commands name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TierName {
    Flash,
    Capacity,
}

/// Where a rebuild puts what the lost device held (see the engine's
/// `RebuildKind`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebuildKind {
    #[default]
    Replacement,
    DistributedSpare,
    /// After `device add --rebalance`: existing data spreads over the
    /// widened array.
    Rebalance,
}

impl RebuildKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Replacement => "onto the replacement",
            Self::DistributedSpare => "onto distributed spare space",
            Self::Rebalance => "rebalancing over the added device",
        }
    }
}

/// What scrub is doing, named as zpool names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrubState {
    None,
    Scrubbing,
    Finished,
}

/// `pool status`'s scrub section (see the engine's `ScrubStatus`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubStatus {
    pub state: ScrubState,
    pub blocks_total: u64,
    pub blocks_scrubbed: u64,
    pub blocks_repaired: u64,
    pub blocks_unrepairable: u64,
    /// Parity columns and metadata copies found disagreeing with their row
    /// and rewritten.
    #[serde(default)]
    pub parity_repaired: u64,
    /// Rows (and metadata copies) whose every column was checked.
    #[serde(default)]
    pub rows_checked: u64,
    /// Devices faulted because nearly all their columns were bad.
    #[serde(default)]
    pub devices_faulted: u64,
    pub elapsed_ms: u64,
}

/// What the memory cache's warm-up is doing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheWarmupState {
    /// No record of the cache's contents was loaded since the pool opened.
    #[default]
    None,
    Loading,
    Finished,
}

/// `pool status`'s cache warm-up section (see the engine's
/// `CacheWarmupStatus`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheWarmupStatus {
    pub state: CacheWarmupState,
    pub blocks_listed: u64,
    pub blocks_to_load: u64,
    pub blocks_loaded: u64,
    pub blocks_skipped: u64,
    pub elapsed_ms: u64,
}

/// How much background work may take from clients (`background_impact`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackgroundImpact {
    Low,
    Medium,
    High,
}

/// `pool status`'s background section (see the engine's
/// `BackgroundBudgetStatus`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackgroundBudgetStatus {
    pub impact: BackgroundImpact,
    /// The rate background work may issue now.
    pub bytes_per_second: u64,
    pub bytes_per_second_min: u64,
    pub bytes_per_second_max: u64,
    /// The client latency over which background work backs off now (the
    /// ratio over the baseline, or the absolute target if lower); none
    /// while neither is known.
    #[serde(deserialize_with = "required")]
    pub client_latency_target_us: Option<u64>,
    pub client_latency_target_ratio: f64,
    /// The clients' latency learned while background work was idle or at
    /// its floor; none until learned.
    #[serde(deserialize_with = "required")]
    pub client_latency_baseline_us: Option<u64>,
    /// The 99th percentile of client reads and writes over the latest
    /// window judged; none when no client request came in it.
    #[serde(deserialize_with = "required")]
    pub client_latency_us: Option<u64>,
    /// Bytes granted per kind of work since the pool opened.
    pub granted_bytes: GrantedBytes,
    /// Of those, bytes the cleaner issued without waiting (space short).
    pub urgent_bytes: u64,
}

/// Bytes the background budget granted each kind of work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantedBytes {
    pub rebuild: u64,
    pub cleaner: u64,
    pub demoter: u64,
    pub scrub: u64,
}

/// The pool's state and its devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutStatus {
    /// `online`, `degraded` (devices lost, within what the redundancy
    /// covers) or `faulted` (more lost: I/O fails).
    pub state: String,
    pub tiers: Vec<TierLayoutStatus>,
}

/// One tier's array.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierLayoutStatus {
    /// `flash` or `capacity`.
    pub tier: String,
    /// `none`, `mirror`, `raid5` or `raid6`.
    pub redundancy: String,
    pub state: String,
    /// Devices of the tier that may be lost without losing data.
    pub parity_devices: usize,
    pub devices: Vec<DeviceStatus>,
}

/// One device of an array.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStatus {
    pub path: String,
    pub tier: String,
    pub index: usize,
    /// `online`, `degraded` (checksum errors repaired), `faulted` or `missing`.
    pub state: String,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub io_errors: u64,
    pub checksum_errors_repaired: u64,
    /// Parity columns, metadata copies and blocks no volume holds that a
    /// scrub found disagreeing with their row and rewrote.
    #[serde(default)]
    pub parity_repaired: u64,
    /// A device being rebuilt to take this one's place (`device replace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
    /// Why the device is out of use although it was found when the pool
    /// opened: too small for the array (a truncated file), with its size
    /// and the size needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unfit: Option<String>,
}

/// What the paced cleaner is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CleanerState {
    Off,
    Idle,
    Paced,
    Short,
}

/// Writes that found no free segment and waited for space (a reclaim in
/// the write path) since the pool opened, and the time they waited in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpaceWaits {
    pub count: u64,
    pub milliseconds: u64,
}

/// The flash tier's flushes since the pool opened and where their time went,
/// stage by stage, in the order a flush waits: the batch writes it covers,
/// another flush (the flush lock), the capacity tier's flush, the previous
/// flush marker's write, the device flush.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlushStages {
    pub device_flushes: u64,
    pub covered_flushes: u64,
    pub batch_writes_microseconds: u64,
    pub flush_lock_microseconds: u64,
    pub capacity_flush_microseconds: u64,
    pub marker_write_microseconds: u64,
    pub device_flush_microseconds: u64,
    /// Open batches sealed and written right after a write, for a writer
    /// that flushes after each (absent from daemons that predate it: zero).
    #[serde(default)]
    pub batches_sealed_at_write: u64,
}

impl FlushStages {
    /// The stages with their names (as `/metrics` labels them) and time.
    pub fn stages(&self) -> [(&'static str, u64); 5] {
        [
            ("batch_writes", self.batch_writes_microseconds),
            ("flush_lock", self.flush_lock_microseconds),
            ("capacity_flush", self.capacity_flush_microseconds),
            ("marker_write", self.marker_write_microseconds),
            ("device_flush", self.device_flush_microseconds),
        ]
    }
}

/// What `pool status` shows while the device is full.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFullStatus {
    pub reason: String,
    pub since_unix_seconds: u64,
    pub waiting_batch_count: usize,
}

/// The memory cache's size and hit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStatistics {
    pub capacity_bytes: u64,
    /// Slots in use, decoded copies of compressed blocks included.
    pub cached_bytes: u64,
    /// Lookups of device blocks that found them, and that did not.
    pub hits: u64,
    pub misses: u64,
    /// Slots holding compressed blocks decoded (decision 0075); absent
    /// from older daemons.
    #[serde(default)]
    pub decoded_bytes: u64,
    /// Reads of compressed blocks served decoded, without a decode.
    #[serde(default)]
    pub decoded_hits: u64,
}

/// One tier's space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierSpace {
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
}

/// Damage found since the pool opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntegrityStatus {
    pub read_checksum_errors: u64,
    pub checksum_errors_repaired: u64,
    pub summaries_repaired: u64,
    pub lost_batches: u64,
    pub torn_blocks_dropped: u64,
    pub damaged_flushed_blocks: u64,
    pub segments_set_aside: u64,
    /// Map entries marked lost by a restore without the flash device, and
    /// reads of them (absent from older daemons).
    #[serde(default)]
    pub blocks_marked_lost: u64,
    #[serde(default)]
    pub lost_block_reads: u64,
}

/// What `volume list` shows about a volume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeInfo {
    pub volume_id: u32,
    pub name: String,
    pub size_bytes: u64,
    /// Logical bytes of its live contents (mapped blocks × 4096).
    pub allocated_bytes: u64,
    /// Device bytes its live contents take after compression, and
    /// `allocated_bytes / stored_bytes` (absent from daemons before issue
    /// 44: 0 and 1.0).
    #[serde(default)]
    pub stored_bytes: u64,
    #[serde(default = "ratio_one")]
    pub compress_ratio: f64,
    pub unique_bytes: u64,
    /// Device bytes of the blocks only the live contents reference.
    #[serde(default)]
    pub unique_stored_bytes: u64,
    pub used_bytes: u64,
    pub snapshot_count: usize,
    /// `VOL@SNAP` this volume was cloned from.
    #[serde(deserialize_with = "required")]
    pub origin: Option<String>,
    pub created_unix_seconds: u64,
    pub policy: TierPolicy,
    /// The codec of its new writes: `off`, `lz4` or `zstd:LEVEL` (`off`
    /// from daemons before issue 44).
    #[serde(default = "compression_off")]
    pub compression: String,
}

/// The compression ratio in answers of daemons from before issue 44.
fn ratio_one() -> f64 {
    1.0
}

/// The codec of volumes in answers of daemons from before issue 44.
fn compression_off() -> String {
    "off".to_string()
}

/// A volume's tier policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierPolicy {
    pub priority: CachePriority,
    pub pin: Pin,
}

/// How much a volume's data deserves flash, relative to other volumes'.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CachePriority {
    High,
    Normal,
    Low,
    None,
}

/// Where a volume's blocks are kept regardless of heat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pin {
    Auto,
    Flash,
    Capacity,
}

/// What `snapshot list` shows about a snapshot.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// `VOL@SNAP`, also its NBD export name.
    pub full_name: String,
    pub volume: String,
    pub name: String,
    pub snapshot_id: u32,
    pub size_bytes: u64,
    pub referenced_bytes: u64,
    pub unique_bytes: u64,
    /// Volumes cloned from this snapshot.
    pub clones: Vec<String>,
    pub created_unix_seconds: u64,
}

/// What `volume stats` shows: where a volume's blocks live and where its reads
/// were served from since the pool opened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VolumeTierStats {
    pub volume: String,
    pub policy: TierPolicy,
    /// As [`VolumeInfo::compression`].
    #[serde(default = "compression_off")]
    pub compression: String,
    pub flash_bytes: u64,
    pub capacity_bytes: u64,
    /// As [`VolumeInfo::allocated_bytes`], `stored_bytes` and
    /// `compress_ratio` (absent from daemons before issue 44: 0, 0, 1.0).
    #[serde(default)]
    pub logical_bytes: u64,
    #[serde(default)]
    pub stored_bytes: u64,
    #[serde(default = "ratio_one")]
    pub compress_ratio: f64,
    pub counters: VolumeTierCounters,
    pub memory_hit_ratio: f64,
    pub flash_hit_ratio: f64,
    pub capacity_read_ratio: f64,
}

/// What one volume's reads and moves did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeTierCounters {
    pub memory_read_blocks: u64,
    pub flash_read_blocks: u64,
    pub capacity_read_blocks: u64,
    pub promoted_blocks: u64,
    pub demoted_blocks: u64,
}

/// The answer to `volume delete` (`VOL`) and `snapshot delete` (`VOL@SNAP`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    pub deleted: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_json() -> serde_json::Value {
        let mut document = serde_json::json!({
            "device": "/p/flash", "capacity_bytes": 100, "used_bytes": 10, "free_bytes": 80,
            "reserved_bytes": 10, "used_percent": 11.1, "usage_warning_percent": 0,
            "segment_size_bytes": 4, "segment_count": 25, "free_segment_count": 20,
            "volume_count": 1, "client_bytes_written": 8, "device_bytes_written": 12,
            "write_amplification": 1.5, "cleaner_relocated_blocks": 0,
            "dead_segment_count": 0, "cleaner_state": "idle", "cleaner_pressure": 0.0,
            "durable_batch_sequence": 3, "checkpoint_sequence": 1, "failed": null,
            "device_full": null, "device_full_retries": 0,
            "memory_cache": {"capacity_bytes": 0, "cached_bytes": 0, "hits": 0, "misses": 0, "decoded_bytes": 0, "decoded_hits": 0},
            "flash": {"size_bytes": 100, "used_bytes": 10, "free_bytes": 90},
            "capacity": null, "promoted_blocks": 0, "demoted_blocks": 0,
            "integrity": {"read_checksum_errors": 0, "checksum_errors_repaired": 0,
                "summaries_repaired": 0, "lost_batches": 0,
                "torn_blocks_dropped": 0, "damaged_flushed_blocks": 0, "segments_set_aside": 0,
                "blocks_marked_lost": 0, "lost_block_reads": 0},
            "scrub": {"state": "none", "blocks_total": 0, "blocks_scrubbed": 0,
                "blocks_repaired": 0, "blocks_unrepairable": 0, "parity_repaired": 0,
                "rows_checked": 0, "devices_faulted": 0, "elapsed_ms": 0}
        });
        for (field, value) in [
            ("logical_bytes", serde_json::json!(9)),
            ("stored_bytes", serde_json::json!(6)),
            ("compress_ratio", serde_json::json!(1.5)),
        ] {
            document[field] = value;
        }
        // Apart: one literal this deep passes the json! macro's recursion limit.
        document["background"] = serde_json::json!({
            "impact": "medium", "bytes_per_second": 16777216,
            "bytes_per_second_min": 16777216, "bytes_per_second_max": 536870912,
            "client_latency_target_us": 10000, "client_latency_target_ratio": 1.5,
            "client_latency_baseline_us": 6667, "client_latency_us": 12000,
            "granted_bytes": {"rebuild": 0, "cleaner": 4096, "demoter": 0, "scrub": 8192},
            "urgent_bytes": 0
        });
        document["space_waits"] = serde_json::json!({"count": 3, "milliseconds": 120});
        document["flush_stages"] = serde_json::json!({"device_flushes": 5, "covered_flushes": 2,
            "batch_writes_microseconds": 250, "flush_lock_microseconds": 0,
            "capacity_flush_microseconds": 0, "marker_write_microseconds": 40,
            "device_flush_microseconds": 900, "batches_sealed_at_write": 4});
        document["cache_warmup"] = serde_json::json!({"state": "loading", "blocks_listed": 10,
            "blocks_to_load": 8, "blocks_loaded": 5, "blocks_skipped": 1, "elapsed_ms": 300});
        document["rebuild"] = serde_json::json!({"state": "rebuilding", "kind": "replacement", "bytes_total": 100,
            "bytes_done": 40, "bytes_skipped": 0, "bytes_per_second": 20, "seconds_left": 3, "rows_verified": 10,
            "blocks_unrepairable": 0, "elapsed_ms": 2000, "error": null});
        document
    }

    #[test]
    fn a_status_without_a_rebuild_section_reads_as_no_rebuild() {
        let mut document = status_json();
        document.as_object_mut().unwrap().remove("rebuild");
        let status: PoolStatus = serde_json::from_value(document).expect("reads");
        assert_eq!(status.rebuild.state, RebuildState::None);
    }

    #[test]
    fn a_status_without_a_cache_warmup_section_reads_as_no_warmup() {
        let mut document = status_json();
        document.as_object_mut().unwrap().remove("cache_warmup");
        let status: PoolStatus = serde_json::from_value(document).expect("reads");
        assert_eq!(status.cache_warmup, CacheWarmupStatus::default());
    }

    #[test]
    fn a_status_without_the_lost_block_counts_reads_them_as_zero() {
        let mut document = status_json();
        let integrity = document["integrity"].as_object_mut().unwrap();
        integrity.remove("blocks_marked_lost");
        integrity.remove("lost_block_reads");
        let status: PoolStatus = serde_json::from_value(document).expect("reads");
        assert_eq!(status.integrity.blocks_marked_lost, 0);
        assert_eq!(status.integrity.lost_block_reads, 0);
        assert_eq!(status.flash_only_bytes, None);
    }

    #[test]
    fn answers_without_compression_figures_read_as_uncompressed() {
        let mut document = status_json();
        for field in ["logical_bytes", "stored_bytes", "compress_ratio"] {
            document.as_object_mut().unwrap().remove(field);
        }
        let status: PoolStatus = serde_json::from_value(document).expect("reads");
        assert_eq!(
            (
                status.logical_bytes,
                status.stored_bytes,
                status.compress_ratio
            ),
            (0, 0, 1.0)
        );
        let volume: VolumeInfo = serde_json::from_value(serde_json::json!({
            "volume_id": 1, "name": "v", "size_bytes": 8192, "allocated_bytes": 4096,
            "unique_bytes": 4096, "used_bytes": 4096, "snapshot_count": 0, "origin": null,
            "created_unix_seconds": 0, "policy": {"priority": "normal", "pin": "auto"}
        }))
        .expect("reads");
        assert_eq!(
            (
                volume.stored_bytes,
                volume.unique_stored_bytes,
                volume.compress_ratio
            ),
            (0, 0, 1.0)
        );
    }

    #[test]
    fn a_status_without_space_waits_or_flush_stages_reads_them_as_zero() {
        let mut document = status_json();
        document.as_object_mut().unwrap().remove("space_waits");
        document.as_object_mut().unwrap().remove("flush_stages");
        let status: PoolStatus = serde_json::from_value(document).expect("reads");
        assert_eq!(status.space_waits, SpaceWaits::default());
        assert_eq!(status.flush_stages, FlushStages::default());
    }

    #[test]
    fn an_array_pool_status_carries_its_devices() {
        let mut document = status_json();
        document["layout"] = serde_json::json!({
            "state": "degraded",
            "tiers": [{"tier": "flash", "redundancy": "raid6", "state": "degraded",
                "parity_devices": 2, "devices": [{"path": "/d/f0", "tier": "flash", "index": 0,
                "state": "missing", "bytes_read": 0, "bytes_written": 0, "io_errors": 0,
                "checksum_errors_repaired": 0, "parity_repaired": 0, "replacement": "/d/new0"}]}]
        });
        let status: PoolStatus = serde_json::from_value(document.clone()).expect("reads");
        let layout = status.layout.as_ref().expect("a layout");
        assert_eq!(layout.tiers[0].devices[0].state, "missing");
        assert_eq!(
            layout.tiers[0].devices[0].replacement.as_deref(),
            Some("/d/new0")
        );
        assert_eq!(serde_json::to_value(&status).expect("writes"), document);
    }

    #[test]
    fn a_status_reads_and_writes_back_the_same_document() {
        let status: PoolStatus = serde_json::from_value(status_json()).expect("reads");
        assert_eq!(status.write_amplification, Some(1.5));
        assert_eq!(status.cleaner_state, CleanerState::Idle);
        assert_eq!(
            serde_json::to_value(&status).expect("writes"),
            status_json()
        );
    }

    #[test]
    fn a_renamed_or_missing_field_is_an_error_that_names_it() {
        for field in [
            "device_bytes_written",
            "write_amplification",
            "capacity",
            "background",
        ] {
            let mut document = status_json();
            let value = document
                .as_object_mut()
                .expect("object")
                .remove(field)
                .expect("field");
            document[format!("{field}_renamed")] = value;
            let error = serde_json::from_value::<PoolStatus>(document).expect_err(field);
            assert!(error.to_string().contains(field), "{error}");
        }
    }

    #[test]
    fn unknown_fields_are_ignored() {
        let mut document = status_json();
        document["added_later"] = serde_json::json!(7);
        assert!(serde_json::from_value::<PoolStatus>(document).is_ok());
    }
}
