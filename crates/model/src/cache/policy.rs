//! The interface every simulated cache replacement policy implements.

/// A cache replacement policy over `u64` keys with a fixed capacity in entries.
///
/// The caller's protocol for one request of `key`:
///
/// ```text
/// if !policy.access(key) {                 // a miss: fetch the block from below
///     if policy.insert(key, &mut evicted) { /* store the block in the cache */ }
///     for key in evicted.drain(..) { /* drop that block from the cache */ }
/// }
/// ```
pub trait CachePolicy: Send {
    /// A short name for reports ("lru", "s3-fifo", "w-tinylfu").
    fn name(&self) -> &'static str;

    /// The most keys that are ever resident at once.
    fn capacity_entries(&self) -> usize;

    /// Keys resident now.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `key` is resident, without counting an access.
    fn contains(&self, key: u64) -> bool;

    /// Records one access of `key` and returns whether it is resident (a hit). On
    /// a miss nothing is cached, though the policy may remember the access.
    fn access(&mut self, key: u64) -> bool;

    /// Offers a key that [`CachePolicy::access`] just reported missing. Returns
    /// whether it is now resident, and appends to `evicted` every key that is no
    /// longer resident (at most a few; the caller drops their data). `key` must not
    /// be resident.
    fn insert(&mut self, key: u64, evicted: &mut Vec<u64>) -> bool;

    /// Forgets `key` (its data was freed or changed) and returns whether it was
    /// resident.
    fn remove(&mut self, key: u64) -> bool;
}
