//! `lamina plan` sizes flash from exact LRU stack distances (Mattson's
//! method, `flash::stack_distances`); the cache-policy models of
//! `lamina-model` simulate an LRU cache request by request. Both must tell the
//! same hit count for every cache size on the same trace, or one of them is
//! wrong.

use lamina_model::cache::{LruPolicy, simulate};
use lamina_model::zipf::ZipfKeys;
use lamina_plan::flash::{BLOCK_SIZE_BYTES, stack_distances};
use lamina_plan::parse::addresses::{Access, AddressTrace};

#[test]
fn stack_distances_predict_the_lru_model_hits_at_every_size() {
    let keys: Vec<u64> = ZipfKeys::new(5_000, 0.9, 7).take(40_000).collect();
    let trace = AddressTrace {
        accesses: keys
            .iter()
            .enumerate()
            .map(|(position, key)| Access {
                time_seconds: position as f64,
                offset_bytes: key * BLOCK_SIZE_BYTES,
                length_bytes: BLOCK_SIZE_BYTES,
                is_read: Some(true),
            })
            .collect(),
        skipped_row_count: 0,
    };
    let distances = stack_distances(&trace);
    assert_eq!(distances.read_count, keys.len() as u64);
    for capacity_entries in [1usize, 10, 100, 1_000, 4_000] {
        let mut lru = LruPolicy::new(capacity_entries);
        let counts = simulate(&mut lru, keys.iter().copied(), 0);
        // A cache of C blocks hits exactly the reads whose distance is below C.
        let predicted = distances
            .distances
            .iter()
            .filter(|distance| **distance < capacity_entries as u64)
            .count() as u64;
        assert_eq!(counts.hits, predicted, "{capacity_entries} entries");
    }
}
