//! Explicit integer conversions for values an invariant bounds, one helper per
//! invariant so that the reason a value fits is written once (issue 17: no
//! silent `as` truncation). Values read from the device or given by a user are
//! not converted here: their callers use `try_from` and turn a misfit into a
//! typed error.

use std::time::Duration;

/// A byte count, a position or an index of something already held in memory
/// (a buffer, a table with one entry per block or segment), as a `usize`. The
/// thing exists in memory, so the value fits; on 64-bit targets the check
/// compiles away.
pub(crate) fn to_usize(value: u64) -> usize {
    usize::try_from(value).expect("a size or index of something in memory fits in a usize")
}

/// A segment index from a count or position that the geometry bounds:
/// `segment_count` fits in 32 bits (Geometry checks it when a superblock is
/// read).
pub(crate) fn segment_index(value: u64) -> u32 {
    u32::try_from(value).expect("segment indexes fit in 32 bits (Geometry checks)")
}

/// A block position or count within one segment: segments hold at most 2^20
/// blocks (Geometry checks it when a superblock is read), so it fits in 32 bits.
pub(crate) fn block_in_segment(value: impl TryInto<u32>) -> u32 {
    value
        .try_into()
        .unwrap_or_else(|_| panic!("segments hold at most 2^20 blocks (Geometry checks)"))
}

/// Milliseconds of a duration for logs and statistics, saturating: a duration
/// past 584 million years is reported as `u64::MAX` rather than wrapped.
pub(crate) fn milliseconds_saturating(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A float already rounded by the caller (`round`, `floor`, `ceil`) as a `u64`,
/// saturating: negative values and NaN become 0 and values past `u64::MAX`
/// become `u64::MAX`, which is what `as` does from a float since Rust 1.45;
/// this names that choice once instead of at each statistic.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(crate) fn saturating_u64(rounded: f64) -> u64 {
    rounded as u64
}
