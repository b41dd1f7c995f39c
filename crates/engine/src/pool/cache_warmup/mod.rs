//! A warm memory cache after a restart. The cache is keyed by physical block,
//! but physical blocks move (cleaning, demotion, promotion) and segments are
//! reused, so what is recorded is the *logical* identity of each cached block
//! (the view — a volume or one of its snapshots — and the logical block),
//! hottest first ([`Pool::cache_contents`], encoded by
//! [`CacheContents::to_bytes`]). The control layer keeps that record in a
//! file of the data directory (decision 0025); after the pool opens it hands
//! the record back ([`Pool::warm_cache`]) and the blocks are loaded in the
//! background: resolved through the maps of that moment (blocks no longer
//! mapped are skipped), read in runs of neighbouring blocks with a bounded
//! number of reads in flight so that clients keep the device, checked
//! against the map's crc32c, and taken into the cache only if, under the
//! state lock, the map still points there with that checksum and the cache
//! has room without evicting anything. A stale or torn record therefore
//! costs reads, never wrong data: what enters the cache is what the map says
//! the block holds now, and every later hit is checked against the map again.
//!
//! The cache holds the device blocks compressed fragments are packed in, as
//! they are (decision 0070): such a block is recorded as the logical block
//! of a fragment that starts in it, and warmed by loading the one or two
//! blocks that fragment touches, checked against the fragment's checksum
//! (decision 0074).

pub(super) mod progress;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;

use crate::log::batch::block_checksum;
use crate::log::fragment::fragment_units;
use crate::log::location::Location;
pub use crate::pool::cache_warmup::progress::{CacheWarmupState, CacheWarmupStatus};
use crate::pool::core::Core;
use crate::volume::View;
use crate::volume::map::{BlockMap, CHUNK_ENTRY_COUNT};
use crate::{BLOCK_BYTES, BLOCK_SIZE_BYTES};

/// The first bytes of an encoded record.
const CACHE_CONTENTS_MAGIC: [u8; 8] = *b"LMCACHE\0";
/// The encoding's version; a record of another version is ignored.
const CACHE_CONTENTS_VERSION: u32 = 1;
/// Magic, version and entry count.
const HEADER_BYTES: usize = 8 + 4 + 8;
/// Volume id, snapshot id and logical block of one entry.
const ENTRY_BYTES: usize = 4 + 4 + 8;
/// The crc32c of everything before it.
const TRAILER_BYTES: usize = 4;
/// The snapshot id an entry of a volume's live contents carries.
const LIVE_VOLUME_SNAPSHOT_ID: u32 = u32::MAX;

/// Blocks not listed that one warm-up read may span between two listed ones:
/// on flash a few more blocks cost transfer only, and save a request each.
const WARMUP_GAP_BLOCKS_MAX: u64 = 4;

/// One block the cache held: which view and which logical block of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedBlock {
    pub view: View,
    pub logical_block: u64,
}

/// What the memory cache held, hottest first, by logical identity.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheContents {
    pub blocks: Vec<CachedBlock>,
}

/// Why an encoded record was not taken (it is then ignored: the cache starts
/// cold, which is always safe).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheContentsError {
    #[error("cache contents record of {length_bytes} bytes is too short for its header")]
    TooShort { length_bytes: usize },
    #[error("cache contents record does not start with the expected magic")]
    BadMagic,
    #[error(
        "cache contents record has version {version}, this build reads {CACHE_CONTENTS_VERSION}"
    )]
    UnsupportedVersion { version: u32 },
    #[error(
        "cache contents record of {length_bytes} bytes does not hold the {entry_count} entries its header announces"
    )]
    LengthMismatch {
        length_bytes: usize,
        entry_count: u64,
    },
    #[error(
        "cache contents record fails its checksum (stored {stored:#x}, computed {computed:#x})"
    )]
    ChecksumMismatch { stored: u32, computed: u32 },
}

impl CacheContents {
    /// The record's bytes: magic, version, entry count, entries (volume id,
    /// snapshot id or `u32::MAX` for the live volume, logical block; little
    /// endian), crc32c of all that.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes =
            Vec::with_capacity(HEADER_BYTES + self.blocks.len() * ENTRY_BYTES + TRAILER_BYTES);
        bytes.extend_from_slice(&CACHE_CONTENTS_MAGIC);
        bytes.extend_from_slice(&CACHE_CONTENTS_VERSION.to_le_bytes());
        bytes.extend_from_slice(&(self.blocks.len() as u64).to_le_bytes());
        for block in &self.blocks {
            let (volume_id, snapshot_id) = match block.view {
                View::Volume(volume_id) => (volume_id, LIVE_VOLUME_SNAPSHOT_ID),
                View::Snapshot {
                    volume_id,
                    snapshot_id,
                } => {
                    assert_ne!(snapshot_id, LIVE_VOLUME_SNAPSHOT_ID, "snapshot id in range");
                    (volume_id, snapshot_id)
                }
            };
            bytes.extend_from_slice(&volume_id.to_le_bytes());
            bytes.extend_from_slice(&snapshot_id.to_le_bytes());
            bytes.extend_from_slice(&block.logical_block.to_le_bytes());
        }
        let checksum = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Decodes [`CacheContents::to_bytes`]'s record, refusing anything torn,
    /// truncated or of another version.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CacheContentsError> {
        if bytes.len() < HEADER_BYTES + TRAILER_BYTES {
            return Err(CacheContentsError::TooShort {
                length_bytes: bytes.len(),
            });
        }
        if bytes[..8] != CACHE_CONTENTS_MAGIC {
            return Err(CacheContentsError::BadMagic);
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != CACHE_CONTENTS_VERSION {
            return Err(CacheContentsError::UnsupportedVersion { version });
        }
        let entry_count = u64::from_le_bytes(bytes[12..20].try_into().expect("8 bytes"));
        let expected_length = usize::try_from(entry_count)
            .ok()
            .and_then(|count| count.checked_mul(ENTRY_BYTES))
            .and_then(|entries| entries.checked_add(HEADER_BYTES + TRAILER_BYTES));
        if expected_length != Some(bytes.len()) {
            return Err(CacheContentsError::LengthMismatch {
                length_bytes: bytes.len(),
                entry_count,
            });
        }
        let (body, trailer) = bytes.split_at(bytes.len() - TRAILER_BYTES);
        let stored = u32::from_le_bytes(trailer.try_into().expect("4 bytes"));
        let computed = crc32c::crc32c(body);
        if stored != computed {
            return Err(CacheContentsError::ChecksumMismatch { stored, computed });
        }
        let blocks = body[HEADER_BYTES..]
            .chunks_exact(ENTRY_BYTES)
            .map(|entry| {
                let volume_id = u32::from_le_bytes(entry[0..4].try_into().expect("4 bytes"));
                let snapshot_id = u32::from_le_bytes(entry[4..8].try_into().expect("4 bytes"));
                let logical_block = u64::from_le_bytes(entry[8..16].try_into().expect("8 bytes"));
                let view = match snapshot_id {
                    LIVE_VOLUME_SNAPSHOT_ID => View::Volume(volume_id),
                    snapshot_id => View::Snapshot {
                        volume_id,
                        snapshot_id,
                    },
                };
                CachedBlock {
                    view,
                    logical_block,
                }
            })
            .collect();
        Ok(Self { blocks })
    }
}

/// A listed block resolved through its view's map at warm-up time: a whole
/// block, or a fragment and the blocks it touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WarmupBlock {
    view: View,
    logical_block: u64,
    location: Location,
    checksum: u32,
}

impl WarmupBlock {
    /// The first device block it touches.
    fn first_block(&self) -> u64 {
        self.location.block()
    }

    /// The last device block it touches.
    fn last_block(&self) -> u64 {
        self.location.block() + u64::from(self.location.block_count()) - 1
    }

    /// Whether `touched` (the blocks it touches, read from the device) holds
    /// what the map expects.
    fn passes(&self, touched: &[u8]) -> bool {
        if self.location.is_fragment() {
            fragment_units(self.location, touched)
                .is_ok_and(|units| crc32c::crc32c(units) == self.checksum)
        } else {
            block_checksum(touched) == self.checksum
        }
    }
}

/// Every view's map (O(1) copies), taken under the state lock so that the
/// walks run outside it. Live volumes come first: a block a volume shares
/// with its snapshots is recorded as the volume's.
fn view_maps(core: &Core) -> Vec<(View, BlockMap)> {
    let state = core.lock();
    let volumes = state.volumes();
    let mut maps: Vec<(View, BlockMap)> = volumes
        .iter()
        .map(|volume| (View::Volume(volume.volume_id), volume.map.clone()))
        .collect();
    for volume in volumes.iter() {
        for snapshot in &volume.snapshots {
            let view = View::Snapshot {
                volume_id: volume.volume_id,
                snapshot_id: snapshot.snapshot_id,
            };
            maps.push((view, snapshot.map.clone()));
        }
    }
    maps
}

/// The memory cache's warm-up after a restart: a service built with the
/// pool's core, through which it reads the listed blocks into the cache;
/// started once per opening under the supervisor.
pub(in crate::pool) struct CacheWarmup {
    core: Arc<Core>,
}

impl CacheWarmup {
    /// What the memory cache holds now, by logical identity, hottest first
    /// (blocks no map holds any more are left out). Walks copies of the maps
    /// outside the state lock.
    pub(in crate::pool) fn contents(core: &Core) -> CacheContents {
        let hottest = core.cache().physical_blocks_hottest_first();
        let maps = view_maps(core);
        let mut rank_of: HashMap<u64, usize> = hottest
            .iter()
            .enumerate()
            .map(|(rank, physical_block)| (*physical_block, rank))
            .collect();
        let mut found: Vec<Option<CachedBlock>> = vec![None; hottest.len()];
        for (view, map) in &maps {
            for (chunk_index, chunk) in map.chunks() {
                // A block packed with fragments is found through the first
                // fragment seen that starts in it.
                for (entry, mapping) in chunk.mappings() {
                    if let Some(rank) = rank_of.remove(&mapping.location.block()) {
                        found[rank] = Some(CachedBlock {
                            view: *view,
                            logical_block: chunk_index * CHUNK_ENTRY_COUNT as u64 + entry as u64,
                        });
                    }
                }
            }
            if rank_of.is_empty() {
                break;
            }
        }
        CacheContents {
            blocks: found.into_iter().flatten().collect(),
        }
    }

    /// Loads the blocks `contents` lists into the memory cache in the
    /// background (see the module documentation); returns at once. Does
    /// nothing with `memory_cache_warm_restart` off, without a memory cache,
    /// or when a warm-up already ran since the pool opened.
    pub(in crate::pool) fn start(core: &Arc<Core>, contents: CacheContents) {
        let capacity_blocks = core.cache().statistics().capacity_bytes / BLOCK_SIZE_BYTES;
        if !core.limits().memory_cache_warm_restart
            || capacity_blocks == 0
            || !core.cache_warmup().start(contents.blocks.len() as u64)
        {
            return;
        }
        let warmup = CacheWarmup { core: core.clone() };
        core.supervisor().spawn("memory cache warm-up", async move {
            warmup.run(contents, capacity_blocks).await;
            warmup.core.cache_warmup().finish();
            let status = warmup.core.cache_warmup().status();
            tracing::info!(
                blocks_loaded = status.blocks_loaded,
                blocks_skipped = status.blocks_skipped,
                elapsed_ms = status.elapsed_ms,
                "memory cache warm-up finished"
            );
        });
    }

    async fn run(&self, contents: CacheContents, capacity_blocks: u64) {
        let blocks = self.resolve_cached_blocks(contents, capacity_blocks);
        let warmer = self.core.cache_warmup();
        warmer
            .blocks_to_load
            .store(blocks.len() as u64, Ordering::Relaxed);
        tracing::info!(
            blocks_listed = warmer.blocks_listed.load(Ordering::Relaxed),
            blocks_to_load = blocks.len(),
            "warming the memory cache in the background"
        );
        let runs = warmup_runs(&blocks, self.core.limits().read_run_blocks_max);
        let in_flight_max = self.core.limits().memory_cache_warm_reads_in_flight_max;
        let mut in_flight = futures::stream::FuturesUnordered::new();
        for run in runs {
            if in_flight.len() >= in_flight_max {
                in_flight.next().await;
            }
            if self.core.supervisor().is_stopping() {
                return;
            }
            in_flight.push(self.load_run(run));
        }
        while in_flight.next().await.is_some() {}
    }

    /// The listed blocks (the hottest `capacity_blocks` of them) resolved
    /// through the maps of this moment, distinct and in physical order;
    /// blocks no longer mapped, and views gone, are left out.
    fn resolve_cached_blocks(
        &self,
        mut contents: CacheContents,
        capacity_blocks: u64,
    ) -> Vec<WarmupBlock> {
        contents
            .blocks
            .truncate(usize::try_from(capacity_blocks).unwrap_or(usize::MAX));
        let maps: HashMap<View, BlockMap> = view_maps(&self.core).into_iter().collect();
        let mut blocks: Vec<WarmupBlock> = contents
            .blocks
            .iter()
            .filter_map(|listed| {
                let mapping = maps
                    .get(&listed.view)?
                    .get(listed.logical_block)
                    .filter(|mapping| !mapping.is_lost())?;
                Some(WarmupBlock {
                    view: listed.view,
                    logical_block: listed.logical_block,
                    location: mapping.location,
                    checksum: mapping.checksum,
                })
            })
            .collect();
        blocks.sort_unstable_by_key(|block| (block.first_block(), block.location.unit_offset()));
        blocks.dedup_by_key(|block| block.location);
        blocks
    }

    /// Reads one run from the device and takes the blocks that pass their
    /// checksum and are still mapped there into the cache.
    async fn load_run(&self, run: &[WarmupBlock]) {
        let warmer = self.core.cache_warmup();
        let first = run[0].first_block();
        let last = run
            .iter()
            .map(WarmupBlock::last_block)
            .max()
            .expect("a run is not empty");
        let span_blocks = last - first + 1;
        let read = self
            .core
            .device()
            .read(
                first * BLOCK_SIZE_BYTES,
                usize::try_from(span_blocks).expect("a run fits in memory") * BLOCK_BYTES,
            )
            .await;
        let data = match read {
            Ok(data) => data,
            Err(error) => {
                tracing::warn!(%error, "memory cache warm-up could not read a run; skipped");
                warmer
                    .blocks_skipped
                    .fetch_add(run.len() as u64, Ordering::Relaxed);
                return;
            }
        };
        let touched = |block: &WarmupBlock| {
            let start = usize::try_from(block.first_block() - first).expect("in the run");
            let end = usize::try_from(block.last_block() - first).expect("in the run") + 1;
            &data[start * BLOCK_BYTES..end * BLOCK_BYTES]
        };
        // Checked before the lock is taken, so that clients wait for less.
        let checked: Vec<(&WarmupBlock, &[u8])> = run
            .iter()
            .map(|block| (block, touched(block)))
            .filter(|(block, contents)| block.passes(contents))
            .collect();
        let loaded = self.insert_still_mapped(&checked);
        warmer.blocks_loaded.fetch_add(loaded, Ordering::Relaxed);
        warmer
            .blocks_skipped
            .fetch_add(run.len() as u64 - loaded, Ordering::Relaxed);
    }

    /// Takes into the cache the `checked` blocks (each with the device
    /// blocks it touches, which passed their checksum) that their view's
    /// map still holds there; returns how many.
    fn insert_still_mapped(&self, checked: &[(&WarmupBlock, &[u8])]) -> u64 {
        // Under the state lock: a segment is invalidated in the cache under
        // it before it is reused, so a block still mapped here now cannot be
        // replaced behind the insert.
        let state = self.core.lock();
        let mut loaded = 0;
        for (block, touched) in checked {
            let still_mapped = state
                .volumes()
                .view(block.view)
                .and_then(|found| found.map.get(block.logical_block))
                .is_some_and(|now| {
                    now.location == block.location && now.checksum == block.checksum
                });
            if !still_mapped {
                continue;
            }
            // A fragment's blocks (the second one may be cached already,
            // through another fragment): it counts once it starts there.
            let mut inserted = false;
            for (contents, physical_block) in
                touched.chunks_exact(BLOCK_BYTES).zip(block.first_block()..)
            {
                let now = self.core.cache().insert_if_room(physical_block, contents);
                inserted |= now && physical_block == block.first_block();
            }
            loaded += u64::from(inserted);
        }
        loaded
    }
}

/// Splits blocks in physical order into runs read with one device request
/// each: neighbours at most [`WARMUP_GAP_BLOCKS_MAX`] blocks apart, spanning
/// at most `run_blocks_max` blocks.
fn warmup_runs(blocks: &[WarmupBlock], run_blocks_max: u64) -> Vec<&[WarmupBlock]> {
    let mut runs = Vec::new();
    let mut start = 0;
    for index in 1..=blocks.len() {
        let breaks = index == blocks.len()
            || blocks[index]
                .first_block()
                .saturating_sub(blocks[index - 1].last_block())
                > WARMUP_GAP_BLOCKS_MAX + 1
            || blocks[index].last_block() - blocks[start].first_block() >= run_blocks_max;
        if breaks {
            runs.push(&blocks[start..index]);
            start = index;
        }
    }
    assert_eq!(
        runs.iter().map(|run| run.len()).sum::<usize>(),
        blocks.len(),
        "runs cover every block once"
    );
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(physical_block: u64) -> WarmupBlock {
        WarmupBlock {
            view: View::Volume(1),
            logical_block: physical_block,
            location: Location::whole_block(physical_block),
            checksum: 0,
        }
    }

    #[test]
    fn runs_bridge_small_gaps_and_stop_at_their_span() {
        let blocks: Vec<WarmupBlock> = [10, 11, 15, 30, 31, 32, 100]
            .into_iter()
            .chain(200..300)
            .map(block)
            .collect();
        let lengths: Vec<usize> = warmup_runs(&blocks, 64)
            .iter()
            .map(|run| run.len())
            .collect();
        assert_eq!(lengths, vec![3, 3, 1, 64, 36]);
        assert!(warmup_runs(&[], 64).is_empty());
    }

    #[test]
    fn records_round_trip_and_damage_is_refused() {
        let contents = CacheContents {
            blocks: vec![
                CachedBlock {
                    view: View::Volume(3),
                    logical_block: 7,
                },
                CachedBlock {
                    view: View::Snapshot {
                        volume_id: 3,
                        snapshot_id: 2,
                    },
                    logical_block: u64::MAX >> 12,
                },
            ],
        };
        let bytes = contents.to_bytes();
        assert_eq!(CacheContents::from_bytes(&bytes), Ok(contents.clone()));
        let mut flipped = bytes.clone();
        flipped[HEADER_BYTES + 3] ^= 1;
        assert!(matches!(
            CacheContents::from_bytes(&flipped),
            Err(CacheContentsError::ChecksumMismatch { .. })
        ));
        assert!(matches!(
            CacheContents::from_bytes(&bytes[..bytes.len() - 1]),
            Err(CacheContentsError::LengthMismatch { .. })
        ));
        assert_eq!(
            CacheContents::from_bytes(&bytes[..10]),
            Err(CacheContentsError::TooShort { length_bytes: 10 })
        );
        let mut other_version = bytes;
        other_version[8] = 9;
        assert_eq!(
            CacheContents::from_bytes(&other_version),
            Err(CacheContentsError::UnsupportedVersion { version: 9 })
        );
        assert_eq!(
            CacheContents::from_bytes(&CacheContents::default().to_bytes()),
            Ok(CacheContents::default())
        );
    }
}
