//! The deduplication half of `lamina reduction estimate` (issue 45): counts an
//! image's distinct 4 KiB blocks exactly, by a BLAKE3 fingerprint of each
//! non-zero block, and works out the fingerprint index that decision 0073's
//! design would hold for them: its sealed run of 64-byte records in 4 KiB
//! pages on flash, and in memory one fence per page and a Rice-coded filter
//! of each page's fingerprints. The index figures are computed from this
//! image's own fingerprints (page by page, code by code), not from a formula,
//! so they show what the design costs on real data.
//!
//! Zero blocks never reach this module: lamina stores them as holes. The
//! count keeps 16 bytes per distinct block in a hash set, 17–39 bytes with
//! the set's control bytes and growth: about 1 GiB per 30 million distinct
//! blocks (110 GiB of distinct data).

use std::collections::HashSet;
use std::time::{Duration, Instant};

/// A BLAKE3 fingerprint: what decision 0073 stores and compares in full.
pub const FINGERPRINT_SIZE_BYTES: usize = blake3::OUT_LEN;
/// The part of the fingerprint this estimate keeps to count distinct blocks:
/// 128 bits, so that two of 2^40 blocks collide with probability 2^-49, far
/// below a count's last digit (the engine compares all 256 bits).
pub const COUNTED_FINGERPRINT_SIZE_BYTES: usize = 16;
/// One record of a sealed run on flash (decision 0073): fingerprint, target,
/// the writer's volume and logical block, the segment's incarnation.
pub const INDEX_RECORD_SIZE_BYTES: usize = 64;
/// A sealed run's page: the unit read to prove a probable match.
pub const INDEX_PAGE_SIZE_BYTES: usize = 4096;
/// The page's frame header and record count.
pub const INDEX_PAGE_HEADER_SIZE_BYTES: usize = 64;
/// Records per page: 63.
pub const INDEX_RECORDS_PER_PAGE: usize =
    (INDEX_PAGE_SIZE_BYTES - INDEX_PAGE_HEADER_SIZE_BYTES) / INDEX_RECORD_SIZE_BYTES;
/// The filter's Rice parameter: a probe of a page whose filter holds `n`
/// fingerprints matches by chance with probability 2^-26 (about 1.5e-8).
pub const FILTER_FALSE_POSITIVE_BITS: u32 = 26;
/// In memory per page: its first fingerprint's top 64 bits (the fence a
/// lookup binary-searches) and where its filter starts in the filter arena.
pub const PAGE_FENCE_SIZE_BYTES: usize = 8;
pub const PAGE_FILTER_OFFSET_SIZE_BYTES: usize = 4;
/// The pool size the decision record quotes the index memory for.
pub const QUOTED_POOL_SIZE_BYTES: u64 = 100 << 40;
const BLOCK_SIZE_BYTES: usize = 4096;
const _: () = assert!(INDEX_RECORDS_PER_PAGE == 63);
const _: () = assert!(COUNTED_FINGERPRINT_SIZE_BYTES * 2 == FINGERPRINT_SIZE_BYTES);
const _: () = assert!(FILTER_FALSE_POSITIVE_BITS < 64);
const MEBIBYTE_BYTES: f64 = 1_048_576.0;

/// Counts distinct non-zero blocks; `finish` gives the figures.
#[derive(Default)]
pub struct DedupCounter {
    distinct: HashSet<u128>,
    data_block_count: u64,
    fingerprint_time: Duration,
}

impl DedupCounter {
    pub fn new() -> DedupCounter {
        DedupCounter::default()
    }

    /// Fingerprints one non-zero block: true when no block fed before had
    /// the same content (the block a pool with dedup on would store).
    pub fn add(&mut self, block: &[u8]) -> bool {
        assert_eq!(
            block.len(),
            BLOCK_SIZE_BYTES,
            "a fingerprint is of one block"
        );
        let started = Instant::now();
        let fingerprint = blake3::hash(block);
        self.fingerprint_time += started.elapsed();
        let mut counted = [0u8; COUNTED_FINGERPRINT_SIZE_BYTES];
        counted.copy_from_slice(&fingerprint.as_bytes()[..COUNTED_FINGERPRINT_SIZE_BYTES]);
        self.data_block_count += 1;
        self.distinct.insert(u128::from_be_bytes(counted))
    }

    /// The figures for every block added so far.
    pub fn finish(&self) -> DedupEstimate {
        let distinct_block_count = u64_of(self.distinct.len());
        let mut sorted: Vec<u128> = self.distinct.iter().copied().collect();
        sorted.sort_unstable();
        let index = IndexEstimate::of_sorted(&sorted);
        DedupEstimate {
            fingerprint: "blake3".to_owned(),
            data_block_count: self.data_block_count,
            distinct_block_count,
            duplicate_block_count: self.data_block_count - distinct_block_count,
            ratio: ratio(self.data_block_count, distinct_block_count),
            fingerprint_mib_per_second: mib_per_second(
                self.data_block_count * u64_of(BLOCK_SIZE_BYTES),
                self.fingerprint_time,
            ),
            index,
        }
    }
}

/// Deduplication figures of an image.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DedupEstimate {
    pub fingerprint: String,
    /// Non-zero blocks.
    pub data_block_count: u64,
    /// Distinct contents among them: what a pool with dedup on stores.
    pub distinct_block_count: u64,
    /// Blocks that would be stored as references only.
    pub duplicate_block_count: u64,
    /// `data_block_count / distinct_block_count`.
    pub ratio: f64,
    pub fingerprint_mib_per_second: f64,
    pub index: IndexEstimate,
}

/// The fingerprint index of decision 0073 for the image's distinct blocks,
/// as one sealed run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct IndexEstimate {
    pub record_count: u64,
    pub page_count: u64,
    /// Fences, filter offsets and Rice-coded filters.
    pub memory_bytes: u64,
    pub memory_bytes_per_distinct_block: f64,
    /// The same bytes per block for `QUOTED_POOL_SIZE_BYTES` of distinct data.
    pub memory_bytes_at_100_tib: f64,
    /// The run's pages and its filters (written with the run, read at open).
    pub flash_bytes: u64,
    pub flash_bytes_per_distinct_block: f64,
    /// The chance that a probe of one run for unique data reads a page.
    pub false_positive_rate_per_run: f64,
}

impl IndexEstimate {
    /// The run holding `sorted` (top 128 bits of each fingerprint, ascending).
    fn of_sorted(sorted: &[u128]) -> IndexEstimate {
        let pages: Vec<&[u128]> = sorted.chunks(INDEX_RECORDS_PER_PAGE).collect();
        let mut filter_bytes = 0u64;
        for (page_index, page) in pages.iter().enumerate() {
            let fence = top_64_bits(page[0]);
            // The page covers fingerprints up to the next page's fence.
            let upper = pages
                .get(page_index + 1)
                .map_or(1u128 << 64, |next| u128::from(top_64_bits(next[0])));
            filter_bytes += rice_filter_bits(page, fence, upper).div_ceil(8);
        }
        let page_count = u64_of(pages.len());
        let record_count = u64_of(sorted.len());
        let per_page_bytes = u64_of(PAGE_FENCE_SIZE_BYTES + PAGE_FILTER_OFFSET_SIZE_BYTES);
        let memory_bytes = filter_bytes + page_count * per_page_bytes;
        let flash_bytes = page_count * u64_of(INDEX_PAGE_SIZE_BYTES) + filter_bytes;
        let memory_bytes_per_distinct_block = per_block(memory_bytes, record_count);
        IndexEstimate {
            record_count,
            page_count,
            memory_bytes,
            memory_bytes_per_distinct_block,
            memory_bytes_at_100_tib: memory_bytes_per_distinct_block
                * as_f64(QUOTED_POOL_SIZE_BYTES / u64_of(BLOCK_SIZE_BYTES)),
            flash_bytes,
            flash_bytes_per_distinct_block: per_block(flash_bytes, record_count),
            false_positive_rate_per_run: 0.5f64
                .powi(i32::try_from(FILTER_FALSE_POSITIVE_BITS).expect("a small exponent")),
        }
    }
}

/// The size in bits of one page's filter: each fingerprint's offset from the
/// fence, quantised so that the page's range holds `n × 2^26` slots (a probe
/// then lands on a stored slot with probability 2^-26), sorted, and the
/// gaps Rice-coded with parameter 26 (a unary quotient, a stop bit, 26 bits).
fn rice_filter_bits(page: &[u128], fence: u64, upper: u128) -> u64 {
    let slot_count = u128::from(u64_of(page.len())) << FILTER_FALSE_POSITIVE_BITS;
    let range = upper - u128::from(fence);
    let step = (range / slot_count).max(1);
    let mut previous = 0u128;
    let mut bits = 0u64;
    for &fingerprint in page {
        let slot = u128::from(top_64_bits(fingerprint) - fence) / step;
        let gap = slot - previous;
        previous = slot;
        let quotient = u64::try_from(gap >> FILTER_FALSE_POSITIVE_BITS)
            .expect("a gap inside one page's range");
        bits += quotient + 1 + u64::from(FILTER_FALSE_POSITIVE_BITS);
    }
    bits
}

fn top_64_bits(fingerprint: u128) -> u64 {
    u64::try_from(fingerprint >> 64).expect("the top half of 128 bits")
}

#[expect(clippy::cast_precision_loss, reason = "a size to print")]
fn as_f64(value: u64) -> f64 {
    value as f64
}

fn per_block(bytes: u64, block_count: u64) -> f64 {
    if block_count == 0 {
        0.0
    } else {
        as_f64(bytes) / as_f64(block_count)
    }
}

fn ratio(data: u64, stored: u64) -> f64 {
    if stored == 0 {
        1.0
    } else {
        as_f64(data) / as_f64(stored)
    }
}

fn mib_per_second(bytes: u64, time: Duration) -> f64 {
    let seconds = time.as_secs_f64();
    if seconds > 0.0 {
        as_f64(bytes) / MEBIBYTE_BYTES / seconds
    } else {
        0.0
    }
}

fn u64_of(count: usize) -> u64 {
    u64::try_from(count).expect("a count in memory fits in u64")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks whose bytes come from a counter through BLAKE3: every one differs.
    fn distinct_block(seed: u64) -> Vec<u8> {
        let mut output = vec![0u8; BLOCK_SIZE_BYTES];
        blake3::Hasher::new()
            .update(&seed.to_le_bytes())
            .finalize_xof()
            .fill(&mut output);
        output
    }

    #[test]
    fn repeated_contents_count_once() {
        let mut counter = DedupCounter::new();
        let blocks: Vec<Vec<u8>> = (0..10).map(distinct_block).collect();
        for block in &blocks {
            assert!(counter.add(block));
        }
        for block in &blocks[..4] {
            assert!(!counter.add(block), "seen before");
        }
        // One byte's difference is another block.
        let mut changed = blocks[0].clone();
        changed[4095] ^= 1;
        assert!(counter.add(&changed));
        let estimate = counter.finish();
        assert_eq!(estimate.data_block_count, 15);
        assert_eq!(estimate.distinct_block_count, 11);
        assert_eq!(estimate.duplicate_block_count, 4);
        assert!((estimate.ratio - 15.0 / 11.0).abs() < 1e-12);
        assert_eq!(estimate.index.record_count, 11);
        assert_eq!(estimate.index.page_count, 1);
    }

    #[test]
    fn nothing_fed_is_a_ratio_of_one_and_an_empty_index() {
        let estimate = DedupCounter::new().finish();
        assert_eq!(estimate.distinct_block_count, 0);
        assert_eq!(estimate.ratio, 1.0);
        assert_eq!(estimate.index.memory_bytes, 0);
        assert_eq!(estimate.index.memory_bytes_per_distinct_block, 0.0);
    }

    /// The design's bound (decision 0073): under 4 bytes of memory per
    /// distinct block once pages are full, near the Rice code's
    /// 26 + 1 + ~0.6 bits plus 12 bytes per 63 records.
    #[test]
    fn the_index_takes_under_four_bytes_per_distinct_block() {
        let mut counter = DedupCounter::new();
        for seed in 0..20_000 {
            counter.add(&distinct_block(seed));
        }
        let index = counter.finish().index;
        assert_eq!(index.page_count, 20_000u64.div_ceil(63));
        let per_block = index.memory_bytes_per_distinct_block;
        assert!(
            (3.5..4.0).contains(&per_block),
            "{per_block} bytes per block"
        );
        assert!(index.flash_bytes_per_distinct_block > 64.0);
        assert!(index.flash_bytes_per_distinct_block < 70.0);
        let blocks_at_100_tib = (100u64 << 40) / 4096;
        assert!(index.memory_bytes_at_100_tib < 4.0 * as_f64(blocks_at_100_tib));
    }

    proptest::proptest! {
        /// Any sequence of blocks drawn from a few contents: the count of
        /// distinct blocks is the count of distinct byte strings, and `add`
        /// says "new" exactly at each content's first appearance.
        #[test]
        fn distinct_counts_match_the_blocks_themselves(
            choices in proptest::collection::vec(0u64..12, 0..64)
        ) {
            let mut counter = DedupCounter::new();
            let mut seen = HashSet::new();
            for &choice in &choices {
                let block = distinct_block(choice);
                proptest::prop_assert_eq!(counter.add(&block), seen.insert(block));
            }
            let estimate = counter.finish();
            proptest::prop_assert_eq!(estimate.data_block_count, u64_of(choices.len()));
            proptest::prop_assert_eq!(estimate.distinct_block_count, u64_of(seen.len()));
            proptest::prop_assert_eq!(estimate.index.record_count, u64_of(seen.len()));
        }
    }

    #[test]
    fn a_filter_stays_small_where_fingerprints_crowd_a_range() {
        // Sorted neighbours a few apart: gaps of zero cost 27 bits each.
        let page: Vec<u128> = (0..63u128).map(|index| (index * 3) << 64).collect();
        let bits = rice_filter_bits(&page, 0, 1u128 << 64);
        assert_eq!(bits, 63 * 27);
    }
}
