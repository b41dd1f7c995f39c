//! The record of the memory cache's contents in the data directory
//! (`cache-contents`, decision 0025): which blocks the cache held, by volume
//! and logical block, hottest first, in the engine's encoding
//! (`lamina_engine::CacheContents`). The daemon writes it at clean shutdown
//! and every `memory_cache_record_interval_ms`, replacing the file
//! atomically (a new file, synced, renamed over the old one), and hands it
//! to the pool after opening so that the cache is warmed in the background.
//! The record is only a hint: the engine resolves it through the maps of the
//! moment and checks every block it loads against its checksum, so a stale,
//! torn or foreign file costs device reads at most, never wrong data.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use lamina_engine::{CacheContents, CacheWarmupState, Pool};
use lamina_nbd::CancellationToken;

/// The record's file name in the data directory.
pub const CACHE_CONTENTS_FILE: &str = "cache-contents";

fn record_path(data_dir: &Path) -> PathBuf {
    data_dir.join(CACHE_CONTENTS_FILE)
}

/// Writes what the pool's memory cache holds to the data directory,
/// replacing the previous record atomically. Returns the blocks recorded.
pub fn record(pool: &Pool, data_dir: &Path) -> anyhow::Result<usize> {
    let contents = pool.cache_contents();
    let path = record_path(data_dir);
    let temporary = data_dir.join(format!("{CACHE_CONTENTS_FILE}.new"));
    let mut file = crate::data_files::create_data_file(&temporary)
        .with_context(|| format!("cannot create {}", temporary.display()))?;
    file.write_all(&contents.to_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", temporary.display()))?;
    std::fs::rename(&temporary, &path).with_context(|| {
        format!(
            "cannot rename {} to {}",
            temporary.display(),
            path.display()
        )
    })?;
    // The rename itself survives a power loss once the directory is synced.
    std::fs::File::open(data_dir)
        .and_then(|directory| directory.sync_all())
        .with_context(|| format!("cannot sync {}", data_dir.display()))?;
    Ok(contents.blocks.len())
}

/// Hands the recorded contents, if any, to the pool to load in the
/// background (nothing with `memory_cache_warm_restart` off). A missing or
/// unreadable record only means a cold cache.
pub fn warm(pool: &Pool, data_dir: &Path) {
    if !pool.limits().memory_cache_warm_restart {
        return;
    }
    let path = record_path(data_dir);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot read the memory cache's record; starting cold");
            return;
        }
    };
    match CacheContents::from_bytes(&bytes) {
        Ok(contents) => pool.warm_cache(contents),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "ignoring the memory cache's record; starting cold");
        }
    }
}

/// Records the cache's contents every `memory_cache_record_interval_ms`
/// until `shutdown`, so that a crash leaves a recent record (a warm-up in
/// progress is not recorded over: its record is the better one).
pub async fn run_recorder(pool: Pool, data_dir: PathBuf, shutdown: CancellationToken) {
    let limits = pool.limits();
    if !limits.memory_cache_warm_restart || limits.memory_cache_bytes == 0 {
        return;
    }
    let interval = Duration::from_millis(limits.memory_cache_record_interval_ms);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
        if pool.cache_warmup_status().state == CacheWarmupState::Loading {
            continue;
        }
        let (pool, data_dir) = (pool.clone(), data_dir.clone());
        // The walk of the maps and the file write stay off the runtime's
        // workers, which serve clients.
        let result = tokio::task::spawn_blocking(move || record(&pool, &data_dir)).await;
        match result {
            Ok(Ok(blocks)) => tracing::debug!(blocks, "recorded the memory cache's contents"),
            Ok(Err(error)) => tracing::warn!(%error, "cannot record the memory cache's contents"),
            Err(error) => tracing::warn!(%error, "recording the memory cache's contents failed"),
        }
    }
}

/// At clean shutdown: records the cache's contents for the next start
/// (unless a warm-up is still loading: the record it loads is the better one).
pub fn record_at_shutdown(pool: &Pool, data_dir: &Path) {
    let limits = pool.limits();
    if !limits.memory_cache_warm_restart
        || limits.memory_cache_bytes == 0
        || pool.cache_warmup_status().state == CacheWarmupState::Loading
    {
        return;
    }
    match record(pool, data_dir) {
        Ok(blocks) => tracing::info!(
            blocks,
            "recorded the memory cache's contents for the next start"
        ),
        Err(error) => tracing::warn!(%error, "cannot record the memory cache's contents"),
    }
}
