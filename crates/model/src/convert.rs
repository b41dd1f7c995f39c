//! Explicit numeric conversions for the models (issue 17: no silent `as`
//! truncation): positions of things held in memory, and statistics computed in
//! floating point and turned back into counts.

/// A position or count of something the model holds in memory (a slot of a
/// simulated flash, a row of a sketch), as a `usize`: it exists, so it fits.
pub(crate) fn to_usize(value: u64) -> usize {
    usize::try_from(value).expect("a position of something in memory fits in a usize")
}

/// A float already rounded by the caller (`round`, `floor`, `ceil`) as a `u64`,
/// saturating: negative values and NaN become 0, values past the range its
/// maximum, which is what `as` does from a float; this names that choice once.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(crate) fn saturating_u64(rounded: f64) -> u64 {
    rounded as u64
}

/// [`saturating_u64`] for a count held in memory.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(crate) fn saturating_usize(rounded: f64) -> usize {
    rounded as usize
}
