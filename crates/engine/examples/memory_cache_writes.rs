//! Measures the share of the memory cache that blocks written and not read
//! since may take by displacing blocks clients read (decision 0067), on the
//! real `MemoryCache` with simulated traces; hit ratios, so the figures do not
//! depend on the machine and repeat exactly (fixed seeds).
//!
//! - *Fill over a hot set*: a hot set of a quarter, half or three quarters
//!   of the cache is read until cached, then a sequential fill of four times
//!   the cache is written, with reads of the hot set (uniform) between the
//!   writes at 0, 0.1 or 1 read per write. Reported: the hot reads' hit ratio
//!   during the fill and the share of the hot set still cached after it.
//! - *Read back after writing*: blocks are written in sequence and each is
//!   read back once, a delay of a tenth or four tenths of the cache later
//!   (in writes), with one read of a hot set of half the cache per write.
//!   Reported: the read-backs' and the hot reads' hit ratios.
//! - *Read back over a stale cache*: the same without hot reads, in a cache
//!   first filled with blocks read once and never again (a working set that
//!   has moved on): what the share costs a new write-then-read working set.
//!   Reported: the read-backs' hit ratio.
//!
//! `100` is the cache before the decision (written blocks displace anything
//! the CLOCK hand reaches unreferenced), `0` a cache that takes written
//! blocks only into room.
//!
//!     cargo run --release -p lamina-engine --example memory_cache_writes

use lamina_engine::tier::memory_cache::MemoryCache;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BLOCK_BYTES: usize = 4096;
/// 64 MiB: sixteen shards of 1,024 blocks, as a large cache has.
const CACHE_BLOCKS: u64 = 16 * 1024;
/// Fills are this many times the cache.
const FILL_CACHES: u64 = 4;
/// The shares measured, in per cent of the cache.
const SHARES_PERCENT: [u64; 6] = [0, 10, 25, 50, 75, 100];
/// Written blocks are numbered from here, apart from the hot set.
const WRITTEN_FIRST_BLOCK: u64 = 1 << 30;

/// Hits and reads of one kind.
#[derive(Default)]
struct Ratio {
    hits: u64,
    reads: u64,
}

impl Ratio {
    /// The hit ratio in per cent; NaN (printed so) without reads.
    fn percent(&self) -> f64 {
        100.0 * self.hits as f64 / self.reads as f64
    }
}

/// Reads `physical_block` as the pool does: the cache, else the device and
/// an insert.
fn read(cache: &MemoryCache, physical_block: u64, scratch: &mut [u8], ratio: &mut Ratio) {
    ratio.reads += 1;
    if cache.get(physical_block, scratch) {
        ratio.hits += 1;
    } else {
        let generation = cache.generation(physical_block);
        cache.insert_read(physical_block, scratch, generation);
    }
}

/// A cache with a hot set of `hot_blocks` read twice (so cached and referenced).
fn cache_with_hot_set(share_percent: u64, hot_blocks: u64, scratch: &mut [u8]) -> MemoryCache {
    let cache = MemoryCache::with_written_unread_percent_max(
        CACHE_BLOCKS * BLOCK_BYTES as u64,
        share_percent,
    );
    let mut ignored = Ratio::default();
    for _ in 0..2 {
        for block in 0..hot_blocks {
            read(&cache, block, scratch, &mut ignored);
        }
    }
    cache
}

fn fill_over_hot_set(share_percent: u64, hot_blocks: u64, reads_per_write: f64) -> (f64, f64) {
    let mut scratch = vec![0_u8; BLOCK_BYTES];
    let cache = cache_with_hot_set(share_percent, hot_blocks, &mut scratch);
    let mut random = SmallRng::seed_from_u64(hot_blocks ^ share_percent);
    let mut hot = Ratio::default();
    let contents = vec![1_u8; BLOCK_BYTES];
    let mut owed_reads = 0.0;
    for written in 0..FILL_CACHES * CACHE_BLOCKS {
        cache.insert(WRITTEN_FIRST_BLOCK + written, &contents);
        owed_reads += reads_per_write;
        while owed_reads >= 1.0 {
            owed_reads -= 1.0;
            let block = random.random_range(0..hot_blocks);
            read(&cache, block, &mut scratch, &mut hot);
        }
    }
    let hot_cached = (0..hot_blocks)
        .filter(|block| cache.get(*block, &mut scratch))
        .count();
    (hot.percent(), 100.0 * hot_cached as f64 / hot_blocks as f64)
}

/// Writes `FILL_CACHES` caches of blocks, each read back `delay_blocks`
/// writes later, with one uniform read of blocks `0..hot_blocks` per write
/// (none for no hot set); returns the read-backs' and hot reads' hit ratios.
fn read_back_after_writing(
    cache: &MemoryCache,
    hot_blocks: u64,
    delay_blocks: u64,
    seed: u64,
) -> (f64, f64) {
    let mut scratch = vec![0_u8; BLOCK_BYTES];
    let mut random = SmallRng::seed_from_u64(seed);
    let (mut hot, mut read_back) = (Ratio::default(), Ratio::default());
    let contents = vec![1_u8; BLOCK_BYTES];
    for written in 0..FILL_CACHES * CACHE_BLOCKS {
        cache.insert(WRITTEN_FIRST_BLOCK + written, &contents);
        if let Some(earlier) = written.checked_sub(delay_blocks) {
            read(
                cache,
                WRITTEN_FIRST_BLOCK + earlier,
                &mut scratch,
                &mut read_back,
            );
        }
        if hot_blocks > 0 {
            let block = random.random_range(0..hot_blocks);
            read(cache, block, &mut scratch, &mut hot);
        }
    }
    (read_back.percent(), hot.percent())
}

fn main() {
    println!(
        "cache {CACHE_BLOCKS} blocks; fill {FILL_CACHES} x the cache; shares {SHARES_PERCENT:?} %"
    );
    println!("\nfill over a hot set: hot hit % during the fill / hot set cached % after it");
    for hot_percent in [25, 50, 75] {
        for reads_per_write in [0.0, 0.1, 1.0] {
            let cells: Vec<String> = SHARES_PERCENT
                .iter()
                .map(|share| {
                    let (during, after) = fill_over_hot_set(
                        *share,
                        CACHE_BLOCKS * hot_percent / 100,
                        reads_per_write,
                    );
                    format!("{share}%: {during:.1} / {after:.1}")
                })
                .collect();
            println!(
                "hot {hot_percent}% of the cache, {reads_per_write} reads per write | {}",
                cells.join(" | ")
            );
        }
    }
    println!("\nread back after writing: read-back hit % / hot hit % (hot set half the cache)");
    for delay_percent in [10, 40] {
        let cells: Vec<String> = SHARES_PERCENT
            .iter()
            .map(|share| {
                let mut scratch = vec![0_u8; BLOCK_BYTES];
                let hot_blocks = CACHE_BLOCKS / 2;
                let cache = cache_with_hot_set(*share, hot_blocks, &mut scratch);
                let delay_blocks = CACHE_BLOCKS * delay_percent / 100;
                let (read_back, hot) =
                    read_back_after_writing(&cache, hot_blocks, delay_blocks, *share);
                format!("{share}%: {read_back:.1} / {hot:.1}")
            })
            .collect();
        println!(
            "delay {delay_percent}% of the cache | {}",
            cells.join(" | ")
        );
    }
    println!("\nread back over a stale cache: read-back hit %");
    for delay_percent in [10, 25, 40, 60] {
        let cells: Vec<String> = SHARES_PERCENT
            .iter()
            .map(|share| {
                let mut scratch = vec![0_u8; BLOCK_BYTES];
                // Read once each: cached, and unreferenced after one lap.
                let stale = cache_with_hot_set(*share, CACHE_BLOCKS, &mut scratch);
                let delay_blocks = CACHE_BLOCKS * delay_percent / 100;
                let (read_back, _) = read_back_after_writing(&stale, 0, delay_blocks, *share);
                format!("{share}%: {read_back:.1}")
            })
            .collect();
        println!(
            "delay {delay_percent}% of the cache | {}",
            cells.join(" | ")
        );
    }
}
