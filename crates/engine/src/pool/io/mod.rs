//! The pool's data path: client reads ([`read`]; compressed blocks through
//! [`fragment_read`]) and writes ([`write`];
//! a compressing volume's blocks through [`compressed_write`]), the
//! log writer that batches them onto the device ([`writer`]) with the streams
//! and lanes it appends to ([`stream`]), the flush marker written after each
//! device flush ([`flush_marker`]), where a flush's time goes
//! ([`flush_stages`]), the write-behind of synchronous writers
//! ([`write_behind`]), and what happens when the device or the pool runs out
//! of room ([`device_full`], [`space_waits`]).

pub(super) mod compressed_write;
pub(super) mod device_full;
pub(super) mod flush_marker;
pub mod flush_stages;
pub(super) mod fragment_read;
pub(super) mod read;
pub mod space_waits;
pub mod stream;
pub(super) mod write;
pub(super) mod write_behind;
pub(super) mod writer;
