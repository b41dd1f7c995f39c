//! Locks over ranges of an array's rows. A striped write holds its rows
//! shared; a repair (a rebuild step onto a replacement, a read repair) holds
//! its rows exclusively, so that no write of those rows lands between the
//! repair's read of them and its write of what it rebuilt (which would put
//! back what the write replaced). Writes of other rows go on meanwhile:
//! the log writes new rows, so a rebuild step and the clients' writes
//! almost never meet, and an array-wide lock made every client write wait
//! for every rebuild step (decision 0042, "not fixed by this").
//!
//! A repair waiting for its rows keeps new writes of those rows out until it
//! has them, so a stream of writes of the same rows cannot starve it.

use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// Rows `first_row..=last_row` (array-wide row indexes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RowSpan {
    pub first_row: u64,
    pub last_row: u64,
}

impl RowSpan {
    fn overlaps(self, other: RowSpan) -> bool {
        self.first_row <= other.last_row && other.first_row <= self.last_row
    }
}

/// Who holds or waits for which rows.
#[derive(Default)]
struct Held {
    shared: Vec<RowSpan>,
    exclusive: Vec<RowSpan>,
    /// Repairs waiting for their rows: new shared holders of those rows wait.
    exclusive_waiting: Vec<RowSpan>,
}

impl Held {
    fn admits(&self, span: RowSpan, mode: Mode) -> bool {
        let overlaps = |spans: &[RowSpan]| spans.iter().any(|held| held.overlaps(span));
        match mode {
            Mode::Shared => !overlaps(&self.exclusive) && !overlaps(&self.exclusive_waiting),
            Mode::Exclusive => !overlaps(&self.exclusive) && !overlaps(&self.shared),
        }
    }

    fn spans(&mut self, mode: Mode) -> &mut Vec<RowSpan> {
        match mode {
            Mode::Shared => &mut self.shared,
            Mode::Exclusive => &mut self.exclusive,
        }
    }
}

/// Removes one copy of `span` from `spans`; it must be there.
fn remove_one(spans: &mut Vec<RowSpan>, span: RowSpan) {
    let position = spans
        .iter()
        .position(|held| *held == span)
        .expect("a released row span was held");
    spans.swap_remove(position);
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Shared,
    Exclusive,
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct RowLocks {
    held: Mutex<Held>,
    released: Notify,
}

/// Rows held until dropped.
#[must_use = "the rows are released when the guard is dropped"]
pub(crate) struct RowGuard<'a> {
    locks: &'a RowLocks,
    span: RowSpan,
    mode: Mode,
}

/// A repair's place among the waiters, taken back if its future is dropped.
struct Waiting<'a> {
    locks: &'a RowLocks,
    span: RowSpan,
}

impl RowLocks {
    fn lock(&self) -> MutexGuard<'_, Held> {
        // Every update is a single push or removal: a poisoned lock is consistent.
        self.held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Holds `span` shared (a striped write), once no repair holds or waits
    /// for any of its rows.
    pub(crate) async fn shared(&self, span: RowSpan) -> RowGuard<'_> {
        self.acquire(span, Mode::Shared).await
    }

    /// Holds `span` exclusively (a repair), once no write or repair holds any
    /// of its rows.
    pub(crate) async fn exclusive(&self, span: RowSpan) -> RowGuard<'_> {
        self.lock().exclusive_waiting.push(span);
        let waiting = Waiting { locks: self, span };
        let guard = self.acquire(span, Mode::Exclusive).await;
        drop(waiting);
        guard
    }

    async fn acquire(&self, span: RowSpan, mode: Mode) -> RowGuard<'_> {
        assert!(span.first_row <= span.last_row, "an empty row span");
        loop {
            // Registered before the check, so that a release between the
            // check and the wait is not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut held = self.lock();
                if held.admits(span, mode) {
                    held.spans(mode).push(span);
                    return RowGuard {
                        locks: self,
                        span,
                        mode,
                    };
                }
            }
            released.await;
        }
    }
}

impl Drop for RowGuard<'_> {
    fn drop(&mut self) {
        remove_one(self.locks.lock().spans(self.mode), self.span);
        self.locks.released.notify_waiters();
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        remove_one(&mut self.locks.lock().exclusive_waiting, self.span);
        self.locks.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn span(first_row: u64, last_row: u64) -> RowSpan {
        RowSpan {
            first_row,
            last_row,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn writes_of_other_rows_go_on_while_a_repair_holds_its_rows() {
        let locks = RowLocks::default();
        let repair = locks.exclusive(span(64, 127)).await;
        let _before = locks.shared(span(0, 63)).await;
        let _after = locks.shared(span(128, 200)).await;
        let overlapping =
            tokio::time::timeout(Duration::from_secs(1), locks.shared(span(100, 140)));
        assert!(
            overlapping.await.is_err(),
            "a write of the repair's rows waits"
        );
        drop(repair);
        let _now = locks.shared(span(100, 140)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_repair_waits_for_writes_of_its_rows_and_keeps_new_ones_out() {
        let locks = Arc::new(RowLocks::default());
        let write = locks.shared(span(10, 20)).await;
        let repair = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _rows = locks.exclusive(span(0, 15)).await;
                tokio::time::sleep(Duration::from_secs(5)).await;
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        let late = tokio::time::timeout(Duration::from_secs(1), locks.shared(span(15, 15)));
        assert!(
            late.await.is_err(),
            "a new write waits behind the waiting repair"
        );
        let _other = locks.shared(span(16, 30)).await;
        drop(write);
        repair.await.expect("the repair ran");
        let _now = locks.shared(span(0, 15)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_repair_given_up_while_waiting_lets_writes_in() {
        let locks = RowLocks::default();
        let write = locks.shared(span(0, 0)).await;
        let repair = tokio::time::timeout(Duration::from_secs(1), locks.exclusive(span(0, 5)));
        assert!(repair.await.is_err());
        let _second = locks.shared(span(0, 5)).await;
        drop(write);
        assert!(locks.lock().exclusive_waiting.is_empty());
    }
}
