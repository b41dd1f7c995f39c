//! Least recently used: the baseline every other policy is measured against.

use super::key_lists::KeyLists;
use super::policy::CachePolicy;

/// Least recently used: the baseline every other policy is measured against.
pub struct LruPolicy {
    capacity_entries: usize,
    lists: KeyLists<1>,
}

impl LruPolicy {
    pub fn new(capacity_entries: usize) -> Self {
        assert!(capacity_entries > 0, "a cache needs room for one entry");
        Self {
            capacity_entries,
            lists: KeyLists::with_capacity(capacity_entries),
        }
    }
}

impl CachePolicy for LruPolicy {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn capacity_entries(&self) -> usize {
        self.capacity_entries
    }

    fn len(&self) -> usize {
        self.lists.length(0)
    }

    fn contains(&self, key: u64) -> bool {
        self.lists.find(key).is_some()
    }

    fn access(&mut self, key: u64) -> bool {
        match self.lists.find(key) {
            Some(index) => {
                self.lists.move_to_front(index, 0);
                true
            }
            None => false,
        }
    }

    fn insert(&mut self, key: u64, evicted: &mut Vec<u64>) -> bool {
        if self.lists.length(0) >= self.capacity_entries {
            let back = self.lists.back(0).expect("a full list has a back");
            evicted.push(self.lists.remove(back));
        }
        self.lists.push_front(0, key, 0);
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

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn lru_evicts_the_least_recently_used_key() {
        let mut policy = LruPolicy::new(3);
        let mut evicted = Vec::new();
        for key in [1, 2, 3] {
            policy.access(key);
            policy.insert(key, &mut evicted);
        }
        assert!(policy.access(1));
        policy.insert(4, &mut evicted);
        assert_eq!(evicted, vec![2]);
    }
}
