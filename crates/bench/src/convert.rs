//! Explicit conversions of measurements computed in floating point back into
//! counts (issue 17: no silent `as` truncation).

/// A float already rounded by the caller (`round`, `floor`, `ceil`) as a `u64`,
/// saturating: negative values and NaN become 0, values past the range its
/// maximum, which is what `as` does from a float; this names that choice once.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(crate) fn saturating_u64(rounded: f64) -> u64 {
    rounded as u64
}

/// [`saturating_u64`] for a count or index held in memory.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(crate) fn saturating_usize(rounded: f64) -> usize {
    rounded as usize
}
