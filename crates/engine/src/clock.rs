//! Wall-clock time for what the engine records (creation times of volumes,
//! snapshots and pools; when the device filled up). Intervals and timeouts
//! use tokio's clock, which tests pause and advance (`tokio::time::pause`).

/// Seconds since the Unix epoch (0 if the system clock is before it).
pub fn now_unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |duration| duration.as_secs())
}
