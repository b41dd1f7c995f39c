//! Times the memory cache's lookups in isolation (decision 0047): a 3 GiB
//! cache filled with blocks spread over a pool twice its size (as a 2 GiB
//! volume in a 6 GiB pool), then rounds of random gets of cached blocks (the
//! lookup and the 4 KiB copy out) and of absent ones (the lookup alone). The
//! NBD benchmarks measure the same path through a socket, where a change of a
//! few per cent is lost in the machine's noise; here it is not.
//!
//!     cargo run --release -p lamina-engine --example memory_cache_hits

use std::time::Instant;

use lamina_engine::tier::memory_cache::MemoryCache;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const CACHE_BYTES: u64 = 3 << 30;
const BLOCK_BYTES: usize = 4096;
const GETS_PER_ROUND: usize = 2_000_000;
const ROUND_COUNT: usize = 5;
/// Physical block numbers of cached blocks are this far apart; odd, so the
/// blocks fall in every shard (shards are the low bits).
const SPREAD: u64 = 3;

fn nanoseconds_per_get(
    cache: &MemoryCache,
    blocks: &[u64],
    destination: &mut [u8],
) -> (f64, usize) {
    let started = Instant::now();
    let hits = blocks
        .iter()
        .filter(|physical_block| cache.get(**physical_block, destination))
        .count();
    let elapsed = started.elapsed().as_secs_f64();
    (elapsed * 1e9 / blocks.len() as f64, hits)
}

fn main() {
    let cache = MemoryCache::new(CACHE_BYTES);
    let block_count = CACHE_BYTES / BLOCK_BYTES as u64;
    let contents = vec![7_u8; BLOCK_BYTES];
    let cached: Vec<u64> = (0..block_count).map(|block| block * SPREAD + 1).collect();
    for physical_block in &cached {
        cache.insert(*physical_block, &contents);
    }
    let mut random = SmallRng::seed_from_u64(12_345);
    let mut destination = vec![0_u8; BLOCK_BYTES];
    for round in 0..ROUND_COUNT {
        let picks: Vec<u64> = (0..GETS_PER_ROUND)
            .map(|_| cached[random.random_range(0..cached.len())])
            .collect();
        let absent: Vec<u64> = picks
            .iter()
            .map(|physical_block| physical_block + 1)
            .collect();
        let (hit_ns, hits) = nanoseconds_per_get(&cache, &picks, &mut destination);
        let (absent_ns, found) = nanoseconds_per_get(&cache, &absent, &mut destination);
        assert_eq!(
            (hits, found),
            (GETS_PER_ROUND, 0),
            "every pick cached, no absent one"
        );
        println!("round {round}: hit {hit_ns:.0} ns, absent {absent_ns:.0} ns per get");
    }
}
