//! An object-store tier: a [`lamina_device::BlockDevice`] whose bytes live
//! in S3-compatible object storage, for a two-tier pool's capacity tier. The
//! engine writes the capacity tier log-structured (segments written from
//! their start, then flushed, reused only after `open_region`), which is what
//! makes an object store usable under it: each flushed run of a segment
//! becomes one immutable part object, and a reused segment becomes a new
//! generation of objects. See docs/decisions/0031-object-store-capacity-tier.md.

mod attempts;
mod config;
mod deleter;
mod device;
mod epoch_record;
mod error;
mod geometry;
mod index;
mod key;
mod label;
mod request_kind;
mod requests;
mod statistics;
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;

pub use attempts::{HttpStatus, LastAttempt};
pub use config::{ObjectStoreConfig, ObjectStoreLimits};
pub use device::{ObjectStoreDevice, TierLocation};
pub use epoch_record::{EpochRecord, MemoryEpochRecord};
pub use error::{ObjectStoreError, RequestKind};
pub use geometry::TierGeometry;
pub use key::{LABEL_OBJECT_NAME, PartKey};
pub use label::LABEL_FORMAT_VERSION;
pub use statistics::{ObjectStoreStatistics, RequestStatistics};

/// A byte count or position within a buffer in memory, as a `usize`; the
/// buffer exists, so it fits (a failure is a programmer error).
pub(crate) fn to_usize(bytes: u64) -> usize {
    usize::try_from(bytes).expect("a length within a buffer in memory fits in a usize")
}
