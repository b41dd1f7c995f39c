//! What decision 0073's in-memory index costs when built and probed: one
//! sealed run's fences and Rice-coded page filters (the layout of
//! docs/format.md, "Shared blocks", `RunFilter`) for RECORD_COUNT distinct
//! fingerprints, its bytes as allocated, and the time of a probe for a
//! fingerprint it holds and for one it does not (the unique write's cost,
//! which must find nothing without a device read), median of five rounds.
//! Fingerprints are BLAKE3 outputs of a counter: uniform, as real ones are.
//!
//!     cargo run --release -p lamina-reduction --example index_filter_cost

use std::hint::black_box;
use std::time::Instant;

const RECORD_COUNT: u64 = 4 << 20;
const RECORDS_PER_PAGE: usize = 63;
const FILTER_BITS: u32 = 26;
const ROUND_COUNT: usize = 5;
const PROBE_COUNT: u64 = 1 << 20;

/// The run's memory: per page a fence and a bit offset, and the codes.
struct RunFilter {
    fences: Vec<u64>,
    filter_offsets: Vec<u32>,
    /// Page `p`'s code ends where page `p + 1`'s starts.
    filter_bits: Vec<u64>,
    record_count: usize,
}

fn fingerprint_top_64(seed: u64) -> u64 {
    let hash = blake3::hash(&seed.to_le_bytes());
    let mut top = [0u8; 8];
    top.copy_from_slice(&hash.as_bytes()[..8]);
    u64::from_be_bytes(top)
}

struct BitWriter {
    words: Vec<u64>,
    length_bits: u64,
}

impl BitWriter {
    fn push(&mut self, bit: bool) {
        let word = usize::try_from(self.length_bits / 64).expect("small");
        if word == self.words.len() {
            self.words.push(0);
        }
        if bit {
            self.words[word] |= 1 << (self.length_bits % 64);
        }
        self.length_bits += 1;
    }
}

/// The 64 bits from `position` on (zeros past the end).
fn window(words: &[u64], position: u64) -> u64 {
    let word = usize::try_from(position / 64).expect("small");
    let shift = position % 64;
    let low = words.get(word).copied().unwrap_or(0) >> shift;
    if shift == 0 {
        low
    } else {
        low | words.get(word + 1).copied().unwrap_or(0) << (64 - shift)
    }
}

impl RunFilter {
    fn build(sorted: &[u64]) -> RunFilter {
        let mut writer = BitWriter {
            words: Vec::new(),
            length_bits: 0,
        };
        let pages: Vec<&[u64]> = sorted.chunks(RECORDS_PER_PAGE).collect();
        let mut filter = RunFilter {
            fences: Vec::with_capacity(pages.len()),
            filter_offsets: Vec::with_capacity(pages.len()),
            filter_bits: Vec::new(),
            record_count: sorted.len(),
        };
        for (index, page) in pages.iter().enumerate() {
            let fence = page[0];
            let upper = pages
                .get(index + 1)
                .map_or(1u128 << 64, |next| u128::from(next[0]));
            let slot_count = (page.len() as u128) << FILTER_BITS;
            let step =
                u64::try_from(((upper - u128::from(fence)) / slot_count).max(1)).expect("step");
            filter.fences.push(fence);
            filter
                .filter_offsets
                .push(u32::try_from(writer.length_bits).expect("offset"));
            let mut previous = 0;
            for &fingerprint in *page {
                let slot = (fingerprint - fence) / step;
                let gap = slot - previous;
                previous = slot;
                for _ in 0..gap >> FILTER_BITS {
                    writer.push(true);
                }
                writer.push(false);
                for bit in 0..FILTER_BITS {
                    writer.push(gap >> bit & 1 == 1);
                }
            }
        }
        writer.words.shrink_to_fit();
        filter.filter_bits = writer.words;
        filter
    }

    /// The rank of a probable match in its page, or none.
    fn probe(&self, fingerprint: u64) -> Option<(usize, usize)> {
        let page = self.page_of(fingerprint)?;
        // Every page holds RECORDS_PER_PAGE records but the last.
        let page_records = if page + 1 == self.fences.len() {
            self.record_count - page * RECORDS_PER_PAGE
        } else {
            RECORDS_PER_PAGE
        };
        let fence = self.fences[page];
        let upper = self
            .fences
            .get(page + 1)
            .map_or(1u128 << 64, |&next| u128::from(next));
        let slot_count = (page_records as u128) << FILTER_BITS;
        let step = u64::try_from(((upper - u128::from(fence)) / slot_count).max(1)).expect("step");
        let target = (fingerprint - fence) / step;
        let mut position = u64::from(self.filter_offsets[page]);
        let mut slot = 0u64;
        for rank in 0..page_records {
            let mut quotient = 0u64;
            loop {
                let ones = u64::from(window(&self.filter_bits, position).trailing_ones());
                quotient += ones;
                position += ones;
                if ones < 64 {
                    break;
                }
            }
            position += 1;
            let remainder = window(&self.filter_bits, position) & ((1 << FILTER_BITS) - 1);
            position += u64::from(FILTER_BITS);
            slot += (quotient << FILTER_BITS) | remainder;
            if slot == target {
                return Some((page, rank));
            }
            if slot > target {
                return None;
            }
        }
        None
    }

    /// The page whose range holds `fingerprint`: fingerprints are uniform,
    /// so the page is near `fingerprint / 2^64 × pages`; gallop from there.
    fn page_of(&self, fingerprint: u64) -> Option<usize> {
        let page_count = self.fences.len();
        let guess =
            usize::try_from((u128::from(fingerprint) * page_count as u128) >> 64).expect("a page");
        let (mut low, mut high) = (guess, guess + 1);
        let mut step = 1;
        while low > 0 && self.fences[low] > fingerprint {
            low = low.saturating_sub(step);
            step *= 2;
        }
        step = 1;
        while high < page_count && self.fences[high] <= fingerprint {
            high = (high + step).min(page_count);
            step *= 2;
        }
        let within = self.fences[low..high].partition_point(|&fence| fence <= fingerprint);
        (low + within).checked_sub(1)
    }

    fn allocated_bytes(&self) -> usize {
        self.fences.capacity() * 8
            + self.filter_offsets.capacity() * 4
            + self.filter_bits.capacity() * 8
    }
}

fn median_ns_per_probe(filter: &RunFilter, first_seed: u64) -> (f64, u64) {
    let mut matches = 0;
    let mut rounds: Vec<f64> = (0..ROUND_COUNT)
        .map(|_| {
            let keys: Vec<u64> = (first_seed..first_seed + PROBE_COUNT)
                .map(fingerprint_top_64)
                .collect();
            matches = 0;
            let started = Instant::now();
            for &key in &keys {
                if black_box(filter.probe(black_box(key))).is_some() {
                    matches += 1;
                }
            }
            started.elapsed().as_secs_f64() * 1e9 / PROBE_COUNT as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    (rounds[ROUND_COUNT / 2], matches)
}

fn main() {
    let mut sorted: Vec<u64> = (0..RECORD_COUNT).map(fingerprint_top_64).collect();
    sorted.sort_unstable();
    let filter = RunFilter::build(&sorted);
    let memory = filter.allocated_bytes();
    println!(
        "{RECORD_COUNT} records, {} pages: {memory} bytes allocated (fences, offsets, codes), {:.3} B per record",
        filter.fences.len(),
        memory as f64 / RECORD_COUNT as f64
    );
    let (present_ns, present_matches) = median_ns_per_probe(&filter, 0);
    let (absent_ns, false_positives) = median_ns_per_probe(&filter, RECORD_COUNT);
    println!(
        "probe of a fingerprint it holds:     {present_ns:>6.0} ns ({present_matches} of {PROBE_COUNT} found)"
    );
    println!(
        "probe of a fingerprint it does not:  {absent_ns:>6.0} ns ({false_positives} false positives in {PROBE_COUNT})"
    );
}
