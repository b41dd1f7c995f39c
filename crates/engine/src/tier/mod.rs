//! The tier layer: where a block's bytes are served from and where they live.
//! The memory cache sits in front of every device; in a two-tier pool, `heat`
//! decides which blocks stay on or move to flash and which the cleaner demotes
//! to capacity; `policy` holds the cache policies the choice was measured on.

pub mod heat;
pub mod memory_cache;
pub mod policy;
