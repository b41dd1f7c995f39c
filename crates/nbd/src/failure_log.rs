//! Logs requests the backend failed (an I/O error, no space) at warn level,
//! so an operator can see why a client got EIO or ENOSPC without turning on
//! debug logging; a failing device fails every request, so at most
//! [`FAILURE_LOGS_PER_SECOND_MAX`] lines a second are written and the next
//! line says how many were left out. Errors the client caused (bad range,
//! read-only export, unsupported command) and shutdown stay at debug.

use std::sync::Mutex;

use tokio::time::{Duration, Instant};

use crate::backend::ExportError;
use crate::wire::RequestHeader;

/// Failed requests logged at warn in one second, across all connections.
pub const FAILURE_LOGS_PER_SECOND_MAX: u32 = 10;

/// The window [`FAILURE_LOGS_PER_SECOND_MAX`] counts in.
const FAILURE_LOG_WINDOW_MS: u64 = 1000;

/// The warn lines of the current window.
struct Window {
    started: Instant,
    logged_count: u32,
    /// Failures left out since the last line written.
    left_out_count: u64,
}

/// The rate limit on warn lines: one for the process, a fresh one per test.
struct FailureLog {
    window: Mutex<Option<Window>>,
}

static FAILURE_LOG: FailureLog = FailureLog::new();

/// Whether the backend's error is the server's failure rather than the
/// client's request or a shutdown.
fn is_server_failure(error: &ExportError) -> bool {
    matches!(error, ExportError::Io(_) | ExportError::NoSpace)
}

/// Logs one failed request: server failures at warn (within the rate), the
/// rest at debug.
pub(crate) fn log_failed_request(header: &RequestHeader, error: &ExportError) {
    let command = crate::wire::command_name(header.command);
    let (offset, length) = (header.offset, header.length);
    if !is_server_failure(error) {
        tracing::debug!(command, offset, length, %error, "request failed");
        return;
    }
    let Some(left_out_before) = FAILURE_LOG.admit(Instant::now()) else {
        return;
    };
    tracing::warn!(command, offset, length, left_out_before, %error, "request failed");
}

impl FailureLog {
    const fn new() -> Self {
        Self {
            window: Mutex::new(None),
        }
    }

    /// Counts a failure at `now`: `Some(failures left out since the last
    /// line)` when it may be logged, `None` when the window's lines are used
    /// up.
    fn admit(&self, now: Instant) -> Option<u64> {
        // A poisoned lock only means a panic elsewhere while counting: the
        // counts are still usable.
        let mut guard = self
            .window
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let window = guard.get_or_insert(Window {
            started: now,
            logged_count: 0,
            left_out_count: 0,
        });
        if now.duration_since(window.started) >= Duration::from_millis(FAILURE_LOG_WINDOW_MS) {
            window.started = now;
            window.logged_count = 0;
        }
        if window.logged_count >= FAILURE_LOGS_PER_SECOND_MAX {
            window.left_out_count += 1;
            return None;
        }
        window.logged_count += 1;
        Some(std::mem::take(&mut window.left_out_count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_server_failures_are_warnings() {
        assert!(is_server_failure(&ExportError::Io("device".into())));
        assert!(is_server_failure(&ExportError::NoSpace));
        assert!(!is_server_failure(&ExportError::ReadOnly));
        assert!(!is_server_failure(&ExportError::Invalid("range".into())));
        assert!(!is_server_failure(&ExportError::NotSupported));
        assert!(!is_server_failure(&ExportError::Shutdown));
    }

    #[test]
    fn a_flood_is_cut_to_the_rate_and_the_next_line_counts_what_was_left_out() {
        let log = FailureLog::new();
        let start = Instant::now();
        let admitted: Vec<Option<u64>> = (0..FAILURE_LOGS_PER_SECOND_MAX + 5)
            .map(|_| log.admit(start))
            .collect();
        let logged = admitted
            .iter()
            .filter(|admitted| admitted.is_some())
            .count();
        assert_eq!(logged, FAILURE_LOGS_PER_SECOND_MAX as usize);
        assert!(
            admitted[FAILURE_LOGS_PER_SECOND_MAX as usize..]
                .iter()
                .all(Option::is_none)
        );
        let next_window = start + Duration::from_millis(FAILURE_LOG_WINDOW_MS);
        assert_eq!(
            log.admit(next_window),
            Some(5),
            "the five left out are counted"
        );
        assert_eq!(log.admit(next_window), Some(0));
    }
}
