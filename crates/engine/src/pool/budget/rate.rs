//! The background rate: once per window the budget reads the window's
//! client latency (the 99th percentile of reads and writes) and moves the
//! rate background work may issue between the floor and the ceiling,
//! additive increase and multiplicative decrease (docs/decisions/
//! 0022-background-budget.md says why): a window over the target cuts the
//! rate by a third, a window under it adds a sixteenth of the range, and a
//! window with no client request at all sets it to the ceiling (nobody to
//! yield to, as md's resync runs at its maximum when the array is idle).
//!
//! The target is relative: `client_latency_target_ratio` times the
//! clients' baseline, a slow-moving low quantile (about the 25th
//! percentile) of the windows' 99th percentiles, learned upward only from
//! windows in which rebuild, the demoter and scrub took less than half the
//! floor (so that the background's own load does not raise the bar it is
//! held to; the cleaner's bytes do not count, it runs for the clients'
//! writes) and downward from any window. An absolute `client_latency_target_us` may be set as
//! well; the lower of the two holds. A window needs
//! [`CLIENT_REQUESTS_PER_JUDGEMENT_MIN`] requests before its percentile is
//! believed: fewer are pooled with the next windows', and a second with
//! fewer still lets the rate climb (too few clients to tell a tail from
//! one slow request). With no baseline yet and background work busy (a
//! rebuild resumed when the pool opened), the rate drops to the floor after
//! [`UNLEARNED_WINDOW_COUNT_MAX`] windows and the first window there gives
//! the baseline (with the floor's cost in it: the best there is without
//! stopping the work).

use std::time::Duration;

use tokio::time::Instant;

use super::latency::{ClientLatency, LatencyWindow};
use super::work::BackgroundWork;
use crate::convert::saturating_u64;
use crate::pool::core::limits::BackgroundBudgetLimits;

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
const ADJUSTMENTS_PER_UPDATE_MAX: u64 = 128;

/// Client requests a judgement needs: a 99th percentile of fewer is little
/// more than the slowest one. At 100 ms windows, 1,000 requests a second;
/// a disk's few hundred are pooled over two to four windows.
pub(super) const CLIENT_REQUESTS_PER_JUDGEMENT_MIN: u64 = 100;

/// Windows pooled at most before a judgement: a second. Fewer requests than
/// the minimum by then are too few clients to yield to; the rate climbs.
const WINDOWS_PER_JUDGEMENT_MAX: u64 = 10;

/// What the baseline is multiplied by at most per window toward a window
/// above it (learned upward slowly: it doubles in 7 s of light windows at
/// 100 ms) ...
const BASELINE_RISE_PER_WINDOW_MAX: f64 = 1.01;

/// ... and divided by at most per window toward one below it. Three times
/// the rise: the baseline settles where a quarter of the windows are under
/// it, a low quantile, which a few slow windows do not move.
const BASELINE_FALL_PER_WINDOW_MAX: f64 = 1.03;

/// Share of the floor's bytes under which background work is light enough
/// for the baseline to be learned upward: background work running at the
/// floor is not (a rebuild held there would otherwise teach the baseline
/// its own cost, and be let go faster for it).
const LIGHT_SHARE_OF_FLOOR: f64 = 0.5;

/// What each older window's background bytes count for in the recent
/// history: a time constant of ten windows (a second at 100 ms).
const BACKGROUND_HISTORY_DECAY_PER_WINDOW: f64 = 0.9;

/// Busy windows judged with no baseline before the rate drops to the floor
/// to learn one (2 s at 100 ms).
pub(super) const UNLEARNED_WINDOW_COUNT_MAX: u64 = 20;

/// Client requests and background bytes since the last judgement.
struct Span {
    requests: LatencyWindow,
    window_count: u64,
    /// Bytes granted to rebuild, the demoter and scrub. Not the cleaner's:
    /// it runs in proportion to client writes, the price of the clients'
    /// own workload, part of their baseline as much as the writes are.
    background_bytes: u64,
}

impl Span {
    fn new() -> Self {
        Self {
            requests: LatencyWindow::empty(),
            window_count: 0,
            background_bytes: 0,
        }
    }
}

/// See the module documentation.
pub(super) struct RateController {
    limits: BackgroundBudgetLimits,
    bytes_per_second: f64,
    window_started: Instant,
    /// The latest judgement's latency percentile; none when no client
    /// request came in it.
    latency_us: Option<u64>,
    /// The clients' latency without background load; none until learned.
    baseline_us: Option<f64>,
    span: Span,
    /// Busy windows judged since the pool opened with no baseline yet.
    unlearned_window_count: u64,
    /// Background bytes (as in [`Span`]) of the recent windows, each older
    /// window's counted [`BACKGROUND_HISTORY_DECAY_PER_WINDOW`] times less:
    /// grants come in runs of up to a few MiB, so one window without one
    /// says little.
    recent_background_bytes: f64,
}

impl RateController {
    /// Starts at the ceiling: no client has been measured yet.
    pub(super) fn new(limits: BackgroundBudgetLimits, now: Instant) -> Self {
        assert!(
            limits.bytes_per_second_min > 0
                && limits.bytes_per_second_min <= limits.bytes_per_second_max
                && limits.client_latency_window_ms > 0
                && limits.client_latency_target_ratio >= 1.0,
            "PoolLimits::validate refuses {limits:?}"
        );
        Self {
            limits,
            bytes_per_second: limits.bytes_per_second_max as f64,
            window_started: now,
            latency_us: None,
            baseline_us: None,
            span: Span::new(),
            unlearned_window_count: 0,
            recent_background_bytes: 0.0,
        }
    }

    pub(super) fn bytes_per_second(&self) -> f64 {
        self.bytes_per_second
    }

    pub(super) fn latency_us(&self) -> Option<u64> {
        self.latency_us
    }

    pub(super) fn baseline_us(&self) -> Option<u64> {
        self.baseline_us
            .map(|baseline| saturating_u64(baseline.round()))
    }

    /// The latency over which background work backs off now: the lower of
    /// the ratio over the baseline and the absolute target; none while
    /// neither is known.
    pub(super) fn target_us(&self) -> Option<u64> {
        let relative = self
            .baseline_us
            .map(|baseline| baseline * self.limits.client_latency_target_ratio);
        let absolute = self.limits.client_latency_target_us.map(|us| us as f64);
        match (relative, absolute) {
            (Some(relative), Some(absolute)) => Some(relative.min(absolute)),
            (one, other) => one.or(other),
        }
        .map(|us| saturating_u64(us.round()))
    }

    pub(super) fn limits(&self) -> BackgroundBudgetLimits {
        self.limits
    }

    pub(super) fn window(&self) -> Duration {
        Duration::from_millis(self.limits.client_latency_window_ms)
    }

    /// Counts bytes granted to `work` now.
    pub(super) fn count_background(&mut self, work: BackgroundWork, bytes: u64) {
        if work != BackgroundWork::Cleaner {
            self.span.background_bytes += bytes;
        }
    }

    /// Closes the window if it has run its length and judges the requests
    /// pooled since the last judgement if there are enough. The budget is
    /// looked at only when background work asks (or status is read), so
    /// several windows may have passed since: their requests are read as
    /// one window and the adjustment is made once per window that passed,
    /// so that work starting after a quiet spell finds the rate a pacer
    /// looking all along would have set.
    pub(super) fn update(&mut self, now: Instant, latency: &ClientLatency) {
        let window = self.window();
        let elapsed = now.duration_since(self.window_started);
        if elapsed < window {
            return;
        }
        let windows_passed =
            u64::try_from(elapsed.as_nanos() / window.as_nanos()).unwrap_or(u64::MAX);
        self.window_started += window * u32::try_from(windows_passed).unwrap_or(u32::MAX);
        let requests = latency.take_window();
        if requests.request_count() == 0 && self.span.requests.request_count() == 0 {
            // Nobody to yield to.
            self.latency_us = None;
            self.bytes_per_second = self.limits.bytes_per_second_max as f64;
            self.remember_background(windows_passed, self.span.background_bytes);
            self.span = Span::new();
            return;
        }
        self.span.requests.add(&requests);
        self.span.window_count = self.span.window_count.saturating_add(windows_passed);
        if self.span.requests.request_count() < CLIENT_REQUESTS_PER_JUDGEMENT_MIN
            && self.span.window_count < WINDOWS_PER_JUDGEMENT_MAX
        {
            return;
        }
        let span = std::mem::replace(&mut self.span, Span::new());
        self.judge(&span);
    }

    /// Adjusts the rate once per window of `span`, then learns from it.
    fn judge(&mut self, span: &Span) {
        let adjustments = span.window_count.min(ADJUSTMENTS_PER_UPDATE_MAX);
        let latency_us = span.requests.percentile_us(CLIENT_LATENCY_PERCENTILE);
        self.latency_us = latency_us;
        let Some(latency_us) = latency_us else {
            unreachable!("a span is judged only with requests in it")
        };
        if span.requests.request_count() < CLIENT_REQUESTS_PER_JUDGEMENT_MIN {
            // Too few clients to tell a tail from one slow request: climb.
            for _ in 0..adjustments {
                self.bytes_per_second = next_rate(self.limits, self.bytes_per_second, false);
            }
            return;
        }
        let over = self
            .target_us()
            .is_some_and(|target_us| latency_us > target_us);
        let background = self.background_during(span);
        for _ in 0..adjustments {
            self.bytes_per_second = next_rate(self.limits, self.bytes_per_second, over);
        }
        self.learn(latency_us as f64, adjustments, background);
    }

    /// Adds `bytes` of background work, done over `window_count` windows,
    /// to the recent history.
    fn remember_background(&mut self, window_count: u64, bytes: u64) {
        let steps = i32::try_from(window_count).unwrap_or(i32::MAX);
        self.recent_background_bytes = self.recent_background_bytes
            * BACKGROUND_HISTORY_DECAY_PER_WINDOW.powi(steps)
            + bytes as f64;
    }

    /// How much background work ran recently, through `span` and the
    /// windows before it (the rate that held through the span is the current
    /// one: it changes only when a span is judged or goes idle).
    fn background_during(&mut self, span: &Span) -> Background {
        self.remember_background(span.window_count, span.background_bytes);
        // What a steady rate at the floor adds up to in the history.
        let floor = self.limits.bytes_per_second_min as f64;
        let floor_bytes =
            floor * self.window().as_secs_f64() / (1.0 - BACKGROUND_HISTORY_DECAY_PER_WINDOW);
        if self.recent_background_bytes <= floor_bytes * LIGHT_SHARE_OF_FLOOR {
            Background::Light
        } else if self.bytes_per_second <= floor {
            Background::AtTheFloor
        } else {
            Background::Busy
        }
    }

    /// Moves the baseline toward `latency_us`: down from any span (lower is
    /// only more careful), up only from a light one. With no baseline yet,
    /// a light span or one at the floor gives it, and busy ones drop the
    /// rate to the floor after a while so that one comes.
    fn learn(&mut self, latency_us: f64, window_count: u64, background: Background) {
        let Some(baseline_us) = self.baseline_us else {
            if background == Background::Busy {
                self.unlearned_window_count += window_count;
                if self.unlearned_window_count >= UNLEARNED_WINDOW_COUNT_MAX {
                    self.bytes_per_second = self.limits.bytes_per_second_min as f64;
                    self.unlearned_window_count = 0;
                }
            } else {
                self.baseline_us = Some(latency_us);
            }
            return;
        };
        let steps = i32::try_from(window_count).unwrap_or(i32::MAX);
        let next = if latency_us < baseline_us {
            latency_us.max(baseline_us / BASELINE_FALL_PER_WINDOW_MAX.powi(steps))
        } else if background == Background::Light {
            latency_us.min(baseline_us * BASELINE_RISE_PER_WINDOW_MAX.powi(steps))
        } else {
            baseline_us
        };
        self.baseline_us = Some(next);
    }
}

/// How much background work ran through a span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Background {
    /// At most [`LIGHT_SHARE_OF_FLOOR`] of the floor's bytes: what clients
    /// see is their own latency.
    Light,
    /// More, with the rate at the floor: the least background work there
    /// can be while some waits.
    AtTheFloor,
    Busy,
}

/// The rate after a window `over` the target or not.
fn next_rate(limits: BackgroundBudgetLimits, bytes_per_second: f64, over: bool) -> f64 {
    let floor = limits.bytes_per_second_min as f64;
    let ceiling = limits.bytes_per_second_max as f64;
    let next = if over {
        bytes_per_second * DECREASE_FACTOR
    } else {
        bytes_per_second + (ceiling - floor) / INCREASE_WINDOW_COUNT
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
            client_latency_target_ratio: 1.5,
            client_latency_target_us: Some(1000),
            client_latency_window_ms: 100,
        }
    }

    #[test]
    fn over_the_target_cuts_by_a_third_down_to_the_floor() {
        assert_eq!(next_rate(limits(), 150.0, true), 100.0);
        assert_eq!(next_rate(limits(), 12.0, true), 10.0);
    }

    #[test]
    fn under_the_target_adds_a_sixteenth_of_the_range_up_to_the_ceiling() {
        assert_eq!(next_rate(limits(), 10.0, false), 20.0);
        assert_eq!(next_rate(limits(), 165.0, false), 170.0);
    }

    #[test]
    fn windows_that_passed_unobserved_are_each_adjusted() {
        let started = Instant::now();
        let window = Duration::from_millis(limits().client_latency_window_ms);
        let latency = ClientLatency::new();
        let mut controller = RateController::new(limits(), started);
        let requests = |latency: &ClientLatency| {
            for _ in 0..CLIENT_REQUESTS_PER_JUDGEMENT_MIN {
                latency.record(Duration::from_millis(5));
            }
        };
        requests(&latency);
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
        requests(&latency);
        controller.update(started + window * 7 / 2, &latency);
        assert!((controller.bytes_per_second() - expected).abs() < 1e-9);
    }

    #[test]
    fn the_lower_of_the_relative_and_the_absolute_target_holds() {
        let mut controller = RateController::new(limits(), Instant::now());
        assert_eq!(controller.target_us(), Some(1000));
        controller.baseline_us = Some(400.0);
        assert_eq!(controller.target_us(), Some(600));
        controller.baseline_us = Some(800.0);
        assert_eq!(controller.target_us(), Some(1000));
        controller.limits.client_latency_target_us = None;
        assert_eq!(controller.target_us(), Some(1200));
    }
}
