//! S3-FIFO (Yang et al., SOSP 2023): a small probationary FIFO, a main FIFO
//! with lazy reinsertion and a ghost FIFO of recently evicted keys.

use super::key_lists::KeyLists;
use super::policy::CachePolicy;

/// S3-FIFO's lists.
const SMALL: usize = 0;
const MAIN: usize = 1;
const GHOST: usize = 2;

/// Frequencies are two-bit counters.
const S3FIFO_FREQUENCY_MAX: u8 = 3;

/// S3-FIFO: new keys enter a small FIFO (10% of the capacity). A key that reaches
/// the small queue's end without having been hit since it entered is evicted at
/// once (quick demotion, so a one-pass scan only ever occupies the small queue)
/// and remembered in a ghost FIFO; a key that was hit moves to the main FIFO.
/// A missed key found in the ghost FIFO goes straight to the main FIFO. The main
/// FIFO reinserts a key reaching its end while the key's frequency (a two-bit
/// counter of hits, decremented at each reinsertion) is above zero (lazy
/// promotion: a hit costs one counter update, no list move).
pub struct S3FifoPolicy {
    capacity_entries: usize,
    small_capacity_entries: usize,
    ghost_capacity_entries: usize,
    lists: KeyLists<3>,
}

impl S3FifoPolicy {
    /// The small queue's share of the capacity, in percent (the paper's 10%).
    pub const SMALL_QUEUE_PERCENT: usize = 10;

    pub fn new(capacity_entries: usize) -> Self {
        assert!(capacity_entries > 0, "a cache needs room for one entry");
        let small_capacity_entries = (capacity_entries * Self::SMALL_QUEUE_PERCENT / 100).max(1);
        // The ghost remembers as many keys as the main queue holds.
        let ghost_capacity_entries = (capacity_entries - small_capacity_entries).max(1);
        Self {
            capacity_entries,
            small_capacity_entries,
            ghost_capacity_entries,
            lists: KeyLists::with_capacity(capacity_entries + ghost_capacity_entries),
        }
    }

    fn resident(&self) -> usize {
        self.lists.length(SMALL) + self.lists.length(MAIN)
    }

    /// Evicts exactly one resident key, appending it to `evicted`.
    fn evict_one(&mut self, evicted: &mut Vec<u64>) {
        loop {
            let from_small = self.lists.length(SMALL) >= self.small_capacity_entries
                || self.lists.length(MAIN) == 0;
            if from_small {
                let index = self.lists.back(SMALL).expect("a resident key exists");
                if self.lists.node(index).counter > 0 {
                    self.lists.node_mut(index).counter = 0;
                    self.lists.move_to_front(index, MAIN);
                } else {
                    self.lists.move_to_front(index, GHOST);
                    evicted.push(self.lists.node(index).key);
                    while self.lists.length(GHOST) > self.ghost_capacity_entries {
                        let oldest = self.lists.back(GHOST).expect("the ghost is not empty");
                        self.lists.remove(oldest);
                    }
                    return;
                }
            } else {
                let index = self.lists.back(MAIN).expect("the main queue is not empty");
                let counter = self.lists.node(index).counter;
                if counter > 0 {
                    self.lists.node_mut(index).counter = counter - 1;
                    self.lists.move_to_front(index, MAIN);
                } else {
                    evicted.push(self.lists.remove(index));
                    return;
                }
            }
        }
    }
}

impl CachePolicy for S3FifoPolicy {
    fn name(&self) -> &'static str {
        "s3-fifo"
    }

    fn capacity_entries(&self) -> usize {
        self.capacity_entries
    }

    fn len(&self) -> usize {
        self.resident()
    }

    fn contains(&self, key: u64) -> bool {
        self.lists
            .find(key)
            .is_some_and(|index| self.lists.node(index).list as usize != GHOST)
    }

    fn access(&mut self, key: u64) -> bool {
        match self.lists.find(key) {
            Some(index) if self.lists.node(index).list as usize != GHOST => {
                let node = self.lists.node_mut(index);
                node.counter = (node.counter + 1).min(S3FIFO_FREQUENCY_MAX);
                true
            }
            _ => false,
        }
    }

    fn insert(&mut self, key: u64, evicted: &mut Vec<u64>) -> bool {
        let was_ghost = match self.lists.find(key) {
            Some(index) => {
                assert!(
                    self.lists.node(index).list as usize == GHOST,
                    "key {key} inserted while resident"
                );
                self.lists.remove(index);
                true
            }
            None => false,
        };
        if self.resident() >= self.capacity_entries {
            self.evict_one(evicted);
        }
        self.lists
            .push_front(if was_ghost { MAIN } else { SMALL }, key, 0);
        true
    }

    fn remove(&mut self, key: u64) -> bool {
        match self.lists.find(key) {
            Some(index) => {
                let resident = self.lists.node(index).list as usize != GHOST;
                self.lists.remove(index);
                resident
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn s3fifo_readmits_a_recently_evicted_key_into_the_main_queue() {
        let mut policy = S3FifoPolicy::new(10);
        let mut evicted = Vec::new();
        // Ten keys fill the cache, all in the small queue; the eleventh evicts the
        // oldest of them, key 0, which was never hit.
        for key in 0..11 {
            policy.access(key);
            policy.insert(key, &mut evicted);
        }
        assert_eq!(evicted, vec![0]);
        evicted.clear();
        assert!(!policy.access(0));
        policy.insert(0, &mut evicted);
        let index = policy.lists.find(0).unwrap();
        assert_eq!(policy.lists.node(index).list as usize, MAIN);
    }
}
