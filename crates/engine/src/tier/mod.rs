//! The tier layer: where a block's bytes are served from. Today that is the
//! memory cache in front of the pool's device; the flash/capacity placement of
//! later work belongs here too.

pub mod memory_cache;
pub mod policy;
