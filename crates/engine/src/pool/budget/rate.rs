//! The background rate: once per window the budget reads the window's
//! client latency (the 99th percentile of reads and writes) and moves the
//! rate background work may issue between the floor and the ceiling,
//! additive increase and multiplicative decrease (docs/decisions/
//! 0022-background-budget.md says why): a window over the target cuts the
//! rate by a third, a window under it adds a sixteenth of the range, and a
//! window with no client request at all sets it to the ceiling (nobody to
//! yield to, as md's resync runs at its maximum when the array is idle).

use std::time::Duration;

use tokio::time::Instant;

use super::latency::ClientLatency;
use crate::pool::limits::BackgroundBudgetLimits;

/// The percentile of client latency held against the target: the tail is
/// what background I/O queued at the device ahead of a client costs.
const CLIENT_LATENCY_PERCENTILE: f64 = 99.0;

/// What the rate is multiplied by after a window over the target.
const DECREASE_FACTOR: f64 = 2.0 / 3.0;

/// Windows under the target that take the rate from the floor to the
/// ceiling (1.6 s at 100 ms windows): slow enough that the rate stays near
/// where latency starts to suffer instead of overshooting it each time.
const INCREASE_WINDOW_COUNT: f64 = 16.0;

/// Adjustments made for windows that passed unobserved, at most: more than
/// the decreases from any ceiling to any floor (a factor of 2^64 is 110).
const ADJUSTMENTS_PER_UPDATE_MAX: u128 = 128;

/// See the module documentation.
pub(super) struct RateController {
    limits: BackgroundBudgetLimits,
    bytes_per_second: f64,
    window_started: Instant,
    /// The latest window's latency percentile; none when it had no client
    /// request.
    latency_us: Option<u64>,
}

impl RateController {
    /// Starts at the ceiling: no client has been measured yet.
    pub(super) fn new(limits: BackgroundBudgetLimits, now: Instant) -> Self {
        assert!(
            limits.bytes_per_second_min > 0
                && limits.bytes_per_second_min <= limits.bytes_per_second_max
                && limits.client_latency_window_ms > 0,
            "PoolLimits::validate refuses {limits:?}"
        );
        Self {
            limits,
            bytes_per_second: limits.bytes_per_second_max as f64,
            window_started: now,
            latency_us: None,
        }
    }

    pub(super) fn bytes_per_second(&self) -> f64 {
        self.bytes_per_second
    }

    pub(super) fn latency_us(&self) -> Option<u64> {
        self.latency_us
    }

    pub(super) fn limits(&self) -> BackgroundBudgetLimits {
        self.limits
    }

    pub(super) fn window(&self) -> Duration {
        Duration::from_millis(self.limits.client_latency_window_ms)
    }

    /// Closes the window if it has run its length: reads its latency and
    /// adjusts the rate. The budget is looked at only when background work
    /// asks (or status is read), so several windows may have passed since:
    /// their requests are read as one window and the adjustment is made
    /// once per window that passed, so that work starting after a quiet
    /// spell finds the rate a pacer looking all along would have set.
    pub(super) fn update(&mut self, now: Instant, latency: &ClientLatency) {
        let window = self.window();
        let elapsed = now.duration_since(self.window_started);
        if elapsed < window {
            return;
        }
        let windows_passed = elapsed.as_nanos() / window.as_nanos();
        self.window_started += window * u32::try_from(windows_passed).unwrap_or(u32::MAX);
        self.latency_us = latency
            .take_window()
            .percentile_us(CLIENT_LATENCY_PERCENTILE);
        // More than enough steps to cross the whole range.
        for _ in 0..windows_passed.min(ADJUSTMENTS_PER_UPDATE_MAX) {
            self.bytes_per_second = next_rate(self.limits, self.bytes_per_second, self.latency_us);
        }
    }
}

/// The rate after a window whose client latency was `latency_us` (none: no
/// client request).
fn next_rate(
    limits: BackgroundBudgetLimits,
    bytes_per_second: f64,
    latency_us: Option<u64>,
) -> f64 {
    let floor = limits.bytes_per_second_min as f64;
    let ceiling = limits.bytes_per_second_max as f64;
    let next = match latency_us {
        None => ceiling,
        Some(latency) if latency > limits.client_latency_target_us => {
            bytes_per_second * DECREASE_FACTOR
        }
        Some(_) => bytes_per_second + (ceiling - floor) / INCREASE_WINDOW_COUNT,
    };
    next.clamp(floor, ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> BackgroundBudgetLimits {
        BackgroundBudgetLimits {
            bytes_per_second_min: 10,
            bytes_per_second_max: 170,
            client_latency_target_us: 1000,
            client_latency_window_ms: 100,
        }
    }

    #[test]
    fn over_the_target_cuts_by_a_third_down_to_the_floor() {
        assert_eq!(next_rate(limits(), 150.0, Some(1001)), 100.0);
        assert_eq!(next_rate(limits(), 12.0, Some(50_000)), 10.0);
    }

    #[test]
    fn under_the_target_adds_a_sixteenth_of_the_range_up_to_the_ceiling() {
        assert_eq!(next_rate(limits(), 10.0, Some(1000)), 20.0);
        assert_eq!(next_rate(limits(), 165.0, Some(10)), 170.0);
    }

    #[test]
    fn windows_that_passed_unobserved_are_each_adjusted() {
        let started = Instant::now();
        let window = Duration::from_millis(limits().client_latency_window_ms);
        let latency = ClientLatency::new();
        let mut controller = RateController::new(limits(), started);
        latency.record(Duration::from_millis(5));
        controller.update(started + window / 2, &latency);
        assert_eq!(
            controller.bytes_per_second(),
            170.0,
            "within the first window"
        );
        controller.update(started + window * 3, &latency);
        let expected = 170.0 * DECREASE_FACTOR.powi(3);
        assert!((controller.bytes_per_second() - expected).abs() < 1e-9);
        assert_eq!(controller.latency_us(), Some(5119));
        // The next window starts where the last one passed ended.
        latency.record(Duration::from_millis(5));
        controller.update(started + window * 7 / 2, &latency);
        assert!((controller.bytes_per_second() - expected).abs() < 1e-9);
    }

    #[test]
    fn no_client_request_goes_to_the_ceiling() {
        assert_eq!(next_rate(limits(), 10.0, None), 170.0);
    }
}
