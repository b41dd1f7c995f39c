//! Capacity after data reduction: `lamina plan --reduction RATIO` divides the
//! data the pool must hold (`--capacity-gib`) and the flash sized for the
//! working set by a compression ratio, measured beforehand on the real data
//! with `lamina reduction estimate` (its `ratio` column). The ratio is an
//! input, checked here, never a guess the planner makes.

use serde::Serialize;

/// The largest ratio accepted: text and empty databases can compress further,
/// but a pool planned on more would be sized on data that is not typical.
pub const REDUCTION_RATIO_MAX: f64 = 20.0;

/// Why a reduction ratio was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("must be a number above 0 and at most {REDUCTION_RATIO_MAX}, got {ratio}")]
pub struct RatioOutOfRange {
    pub ratio: f64,
}

/// A checked compression ratio: logical bytes per physical byte.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ReductionRatio(f64);

impl ReductionRatio {
    pub fn new(ratio: f64) -> Result<ReductionRatio, RatioOutOfRange> {
        if ratio.is_finite() && ratio > 0.0 && ratio <= REDUCTION_RATIO_MAX {
            Ok(ReductionRatio(ratio))
        } else {
            Err(RatioOutOfRange { ratio })
        }
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

/// The capacity figures after reduction.
#[derive(Debug, Clone, Serialize)]
pub struct CapacitySizing {
    pub reduction_ratio: f64,
    /// The data to hold as written by hosts, when given.
    pub logical_bytes: Option<f64>,
    /// `logical_bytes / reduction_ratio`.
    pub physical_bytes: Option<f64>,
    /// The flash sized for the working set, as blocks before compression.
    pub flash_logical_bytes: f64,
    /// The same flash holding compressed blocks.
    pub flash_physical_bytes: f64,
}

/// Divides the capacity and the flash by the ratio.
pub fn size_capacity(
    ratio: ReductionRatio,
    logical_bytes: Option<f64>,
    flash_logical_bytes: f64,
) -> CapacitySizing {
    let ratio = ratio.get();
    CapacitySizing {
        reduction_ratio: ratio,
        logical_bytes,
        physical_bytes: logical_bytes.map(|bytes| bytes / ratio),
        flash_logical_bytes,
        flash_physical_bytes: flash_logical_bytes / ratio,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_divided_by_a_checked_ratio() {
        let sizing = size_capacity(ReductionRatio::new(2.5).expect("valid"), Some(100.0), 50.0);
        assert_eq!(sizing.physical_bytes, Some(40.0));
        assert_eq!(sizing.flash_physical_bytes, 20.0);
        for bad in [
            0.0,
            -1.0,
            f64::NAN,
            f64::INFINITY,
            REDUCTION_RATIO_MAX + 0.1,
        ] {
            assert!(ReductionRatio::new(bad).is_err(), "{bad} accepted");
        }
        assert!(ReductionRatio::new(REDUCTION_RATIO_MAX).is_ok());
        assert!(
            ReductionRatio::new(0.5).is_ok(),
            "a ratio below 1 is data that grows"
        );
    }
}
