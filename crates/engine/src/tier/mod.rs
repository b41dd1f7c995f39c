//! The tier layer: where a block's bytes are served from and where they live.
//! The memory cache sits in front of every device; in a two-tier pool, `heat`
//! decides which blocks stay on or move to flash and which the cleaner demotes
//! to capacity. The cache policies the choice was measured on are in the
//! `lamina-model` crate (`lamina_model::cache`).

mod cache_index;
mod decoded_entries;
pub mod heat;
pub mod memory_cache;
