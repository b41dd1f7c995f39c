//! W-TinyLFU (Einziger et al., 2017): a small LRU window in front of a
//! segmented LRU main cache, admission to which is decided by comparing
//! approximate access frequencies from a count-min sketch behind a doorkeeper.

use super::key_lists::KeyLists;
use super::policy::CachePolicy;
use crate::convert::to_usize;

/// A count-min sketch of recent access frequencies with 4-bit saturating counters
/// (kept one per byte for simplicity) behind a doorkeeper, halved every
/// `sample_size` accesses so that old popularity fades (TinyLFU's reset).
///
/// The doorkeeper is a Bloom filter that absorbs each key's first access in a
/// sample period, so keys seen once (a scan's) never reach the counters, where
/// their collisions would inflate the estimates of other keys.
struct FrequencySketch {
    /// `SKETCH_ROWS` rows of `width_mask + 1` counters.
    counters: Vec<u8>,
    width_mask: u64,
    /// Doorkeeper bits, 64 per word.
    doorkeeper: Vec<u64>,
    doorkeeper_bit_mask: u64,
    accesses: u64,
    sample_size: u64,
}

const SKETCH_ROWS: usize = 4;
const SKETCH_COUNTER_MAX: u8 = 15;
/// Odd 64-bit multipliers giving each row its own hash of the key; the
/// doorkeeper uses the last two as well.
const SKETCH_SEEDS: [u64; SKETCH_ROWS + 2] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0xd6e8_feb8_6659_fd93,
    0xa076_1d64_78bd_642f,
    0xe703_7ed1_a0b4_28db,
];

fn mix(key: u64, seed: u64) -> u64 {
    // A multiply-xorshift mix; the high bits are the best mixed, folded down.
    let mixed = (key ^ (key >> 31)).wrapping_mul(seed);
    mixed ^ (mixed >> 29)
}

impl FrequencySketch {
    /// A sketch for a cache of `capacity_entries`: about one counter per entry and
    /// row, a reset every ten capacities of accesses (the TinyLFU paper's W), and
    /// a doorkeeper of four to eight bits per access in a sample period (with two
    /// hashes, under 7% false positives when every access is a new key).
    fn new(capacity_entries: usize) -> Self {
        let width = capacity_entries.max(16).next_power_of_two();
        let sample_size = 10 * capacity_entries.max(16) as u64;
        let doorkeeper_bits = (4 * sample_size).next_power_of_two();
        Self {
            counters: vec![0; width * SKETCH_ROWS],
            width_mask: width as u64 - 1,
            doorkeeper: vec![0; (doorkeeper_bits / 64).max(1) as usize],
            doorkeeper_bit_mask: doorkeeper_bits.max(64) - 1,
            accesses: 0,
            sample_size,
        }
    }

    fn slot(&self, key: u64, row: usize) -> usize {
        row * (to_usize(self.width_mask) + 1)
            + to_usize(mix(key, SKETCH_SEEDS[row]) & self.width_mask)
    }

    fn doorkeeper_bits(&self, key: u64) -> [u64; 2] {
        [SKETCH_ROWS, SKETCH_ROWS + 1]
            .map(|seed| mix(key, SKETCH_SEEDS[seed]) & self.doorkeeper_bit_mask)
    }

    fn in_doorkeeper(&self, key: u64) -> bool {
        self.doorkeeper_bits(key)
            .iter()
            .all(|bit| self.doorkeeper[(bit / 64) as usize] & (1 << (bit % 64)) != 0)
    }

    fn counted(&self, key: u64) -> u8 {
        (0..SKETCH_ROWS)
            .map(|row| self.counters[self.slot(key, row)])
            .min()
            .unwrap_or(0)
    }

    /// Accesses of `key` in the recent past, approximately (never fewer).
    fn estimate(&self, key: u64) -> u8 {
        self.counted(key) + u8::from(self.in_doorkeeper(key))
    }

    fn increment(&mut self, key: u64) {
        if self.in_doorkeeper(key) {
            // Conservative update: only the smallest counters grow, which keeps
            // estimates of rare keys from being inflated by collisions.
            let counted = self.counted(key);
            if counted < SKETCH_COUNTER_MAX {
                for row in 0..SKETCH_ROWS {
                    let slot = self.slot(key, row);
                    if self.counters[slot] == counted {
                        self.counters[slot] += 1;
                    }
                }
            }
        } else {
            for bit in self.doorkeeper_bits(key) {
                self.doorkeeper[(bit / 64) as usize] |= 1 << (bit % 64);
            }
        }
        self.accesses += 1;
        if self.accesses >= self.sample_size {
            for counter in &mut self.counters {
                *counter /= 2;
            }
            self.doorkeeper.fill(0);
            self.accesses = 0;
        }
    }
}

/// W-TinyLFU's lists.
const WINDOW: usize = 0;
const PROBATION: usize = 1;
const PROTECTED: usize = 2;

/// W-TinyLFU: new keys enter a small LRU window (1% of the capacity). A key
/// leaving the window competes with the main cache's next victim (the back of
/// its probation segment) and enters only if the sketch says it was accessed more
/// often; otherwise the window key is the one evicted. The main cache is a
/// segmented LRU: a hit in probation moves the key to the protected segment (80%
/// of the main cache), whose overflow returns to probation.
pub struct WTinyLfuPolicy {
    capacity_entries: usize,
    window_capacity_entries: usize,
    protected_capacity_entries: usize,
    lists: KeyLists<3>,
    sketch: FrequencySketch,
}

impl WTinyLfuPolicy {
    /// The window's share of the capacity, in percent.
    pub const WINDOW_PERCENT: usize = 1;
    /// The protected segment's share of the main cache, in percent.
    pub const PROTECTED_PERCENT: usize = 80;

    pub fn new(capacity_entries: usize) -> Self {
        assert!(capacity_entries > 0, "a cache needs room for one entry");
        let window_capacity_entries = (capacity_entries * Self::WINDOW_PERCENT / 100).max(1);
        let main_capacity_entries = capacity_entries.saturating_sub(window_capacity_entries);
        Self {
            capacity_entries,
            window_capacity_entries,
            protected_capacity_entries: main_capacity_entries * Self::PROTECTED_PERCENT / 100,
            lists: KeyLists::with_capacity(capacity_entries),
            sketch: FrequencySketch::new(capacity_entries),
        }
    }

    fn main_length(&self) -> usize {
        self.lists.length(PROBATION) + self.lists.length(PROTECTED)
    }

    fn main_capacity_entries(&self) -> usize {
        self.capacity_entries - self.window_capacity_entries.min(self.capacity_entries)
    }
}

impl CachePolicy for WTinyLfuPolicy {
    fn name(&self) -> &'static str {
        "w-tinylfu"
    }

    fn capacity_entries(&self) -> usize {
        self.capacity_entries
    }

    fn len(&self) -> usize {
        self.lists.length(WINDOW) + self.main_length()
    }

    fn contains(&self, key: u64) -> bool {
        self.lists.find(key).is_some()
    }

    fn access(&mut self, key: u64) -> bool {
        self.sketch.increment(key);
        let Some(index) = self.lists.find(key) else {
            return false;
        };
        match self.lists.node(index).list as usize {
            WINDOW => self.lists.move_to_front(index, WINDOW),
            PROTECTED => self.lists.move_to_front(index, PROTECTED),
            _ => {
                self.lists.move_to_front(index, PROTECTED);
                if self.lists.length(PROTECTED) > self.protected_capacity_entries {
                    let demoted = self.lists.back(PROTECTED).expect("protected is not empty");
                    self.lists.move_to_front(demoted, PROBATION);
                }
            }
        }
        true
    }

    fn insert(&mut self, key: u64, evicted: &mut Vec<u64>) -> bool {
        self.lists.push_front(WINDOW, key, 0);
        if self.lists.length(WINDOW) <= self.window_capacity_entries {
            return true;
        }
        let candidate = self.lists.back(WINDOW).expect("the window is not empty");
        if self.main_length() < self.main_capacity_entries() {
            self.lists.move_to_front(candidate, PROBATION);
            return true;
        }
        // The main cache is full: the candidate must beat its victim.
        let victim = self
            .lists
            .back(PROBATION)
            .or_else(|| self.lists.back(PROTECTED));
        match victim {
            Some(victim)
                if self.sketch.estimate(self.lists.node(candidate).key)
                    > self.sketch.estimate(self.lists.node(victim).key) =>
            {
                evicted.push(self.lists.remove(victim));
                self.lists.move_to_front(candidate, PROBATION);
            }
            _ => evicted.push(self.lists.remove(candidate)),
        }
        true
    }

    fn remove(&mut self, key: u64) -> bool {
        match self.lists.find(key) {
            Some(index) => {
                self.lists.remove(index);
                true
            }
            None => false,
        }
    }
}
