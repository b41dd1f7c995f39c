//! One member device of an array: the device (absent when missing), its state
//! and its counters. A member that fails any I/O is faulted at once and no
//! longer used: from then on its columns are reconstructed from the others.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lamina_device::BlockDevice;
use serde::Serialize;

/// A member's state, named the way zpool names a vdev's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberState {
    /// In use, no errors since the array was opened.
    Online,
    /// In use, but it returned data that failed a checksum (repaired).
    Degraded,
    /// Out of use: it failed an I/O, or was taken out.
    Faulted,
    /// Not found when the array was opened (or a stale member, left out).
    Missing,
    /// An empty slot: its member was removed (`device remove`); a device
    /// may be added into it. Not lost: nothing is expected there.
    Removed,
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Degraded => "degraded",
            Self::Faulted => "faulted",
            Self::Missing => "missing",
            Self::Removed => "removed",
        }
    }

    pub fn is_usable(self) -> bool {
        matches!(self, Self::Online | Self::Degraded)
    }

    /// Out of use although the array counts on it (not an empty slot).
    pub fn is_lost(self) -> bool {
        matches!(self, Self::Faulted | Self::Missing)
    }
}

/// What `pool status` shows of one member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemberStatus {
    pub path: String,
    pub index: usize,
    pub state: MemberState,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub io_errors: u64,
    pub checksum_errors_repaired: u64,
    /// Parity columns, metadata copies and columns the engine no longer
    /// holds that a scrub found disagreeing with their row and rewrote.
    pub parity_repaired: u64,
    /// A device being rebuilt to take this member's place.
    pub replacement: Option<ReplacementStatus>,
    /// Why assembly left the member's device out of use although it was
    /// found (a device shorter than the array needs), for `pool status`.
    pub unfit: Option<String>,
}

/// Rows rebuilt between two records of progress in a replacement's label
/// (each costs two flushes of it): what a crash makes the rebuild redo, at
/// most, when the rebuild runs fast.
pub const REBUILD_PERSIST_ROWS: u64 = 4096;
/// Time between two records of progress, at most, while rows are rebuilt:
/// a rebuild paced behind client I/O takes minutes for
/// [`REBUILD_PERSIST_ROWS`] rows, and a crash would cost all of them
/// (issue 42: five restarts each resumed from the same first record).
pub const REBUILD_PERSIST_INTERVAL_MS: u64 = 1_000;

/// A device being rebuilt to take a member's place (`device replace`): every
/// write to the member's rows goes to it too, and the rebuild writes the rows
/// written before; it is never read until it takes the member's place.
pub(crate) struct Replacement {
    pub(crate) device: Arc<dyn BlockDevice>,
    pub(crate) path: String,
    /// Rows below this one hold what the pool kept when the rebuild passed
    /// them (the label's `rebuilding_rows_done`, once persisted).
    pub(crate) rows_done: AtomicU64,
    /// Rows done as recorded in its label (durable).
    pub(crate) rows_persisted: AtomicU64,
    /// When `rows_persisted` was last recorded (or the rebuild began or
    /// resumed): see [`REBUILD_PERSIST_INTERVAL_MS`].
    pub(crate) persisted_at: Mutex<tokio::time::Instant>,
    pub(crate) bytes_written: AtomicU64,
}

impl Replacement {
    /// `device` at `path`, holding every row below `rows_done` durably.
    pub(crate) fn new(device: Arc<dyn BlockDevice>, path: String, rows_done: u64) -> Self {
        Self {
            device,
            path,
            rows_done: rows_done.into(),
            rows_persisted: rows_done.into(),
            persisted_at: Mutex::new(tokio::time::Instant::now()),
            bytes_written: 0.into(),
        }
    }

    /// Whether the rows done should be recorded now: `persist_rows` rows
    /// since the last record, or some rows and
    /// [`REBUILD_PERSIST_INTERVAL_MS`] since then.
    pub(crate) fn progress_due(&self, persist_rows: u64) -> bool {
        let rows_done = self.rows_done.load(Ordering::SeqCst);
        let persisted = self.rows_persisted.load(Ordering::SeqCst);
        let rows_since = rows_done.saturating_sub(persisted);
        let since = self
            .persisted_at
            .lock()
            .expect("replacement persist time lock")
            .elapsed();
        rows_since >= persist_rows
            || (rows_since > 0
                && since >= std::time::Duration::from_millis(REBUILD_PERSIST_INTERVAL_MS))
    }

    /// `rows_done` is durable in the label.
    pub(crate) fn persisted(&self, rows_done: u64) {
        self.rows_persisted.fetch_max(rows_done, Ordering::SeqCst);
        *self
            .persisted_at
            .lock()
            .expect("replacement persist time lock") = tokio::time::Instant::now();
    }
}

/// What `pool status` shows of a replacement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReplacementStatus {
    pub path: String,
    pub rows_done: u64,
    pub bytes_written: u64,
}

/// Where a write of a member's column goes, read at one moment (see
/// [`Member::write_targets`]).
pub(crate) struct WriteTargets {
    /// The member's device, while it is usable.
    pub(crate) device: Option<Arc<dyn BlockDevice>>,
    /// The device being rebuilt to take its place, which gets every write too.
    pub(crate) replacement: Option<Arc<Replacement>>,
}

/// See the module documentation. Lock order: `replacement` before `state`,
/// `device` and `path` (taken together only by `write_targets` and
/// `promote_replacement`); `state` before `path` (`fault`); `unfit` last.
pub(crate) struct Member {
    device: Mutex<Option<Arc<dyn BlockDevice>>>,
    path: Mutex<String>,
    replacement: Mutex<Option<Arc<Replacement>>>,
    /// See [`MemberStatus::unfit`]; cleared when a device takes its place.
    unfit: Mutex<Option<String>>,
    index: usize,
    state: Mutex<MemberState>,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    io_errors: AtomicU64,
    checksum_errors_repaired: AtomicU64,
    parity_repaired: AtomicU64,
    /// Columns scrubbed and found bad in the current window (see
    /// `scrub.rs`).
    scrub_window: Mutex<ScrubWindow>,
}

/// A member's columns in the scrub's current window of rows.
#[derive(Debug, Default)]
struct ScrubWindow {
    rows_checked: u64,
    rows_bad: u64,
}

impl Member {
    pub fn present(index: usize, path: String, device: Arc<dyn BlockDevice>) -> Self {
        Self::with(index, path, Some(device), MemberState::Online)
    }

    pub fn missing(index: usize, path: String) -> Self {
        Self::with(index, path, None, MemberState::Missing)
    }

    /// A member whose device was found but cannot be used (`reason`: too
    /// small for the array): faulted, with no device, counted against the
    /// parity like a missing member, and named at `path` with the reason.
    pub fn unfit(index: usize, path: String, reason: String) -> Self {
        let member = Self::with(index, path, None, MemberState::Faulted);
        *member.unfit.lock().expect("member unfit lock") = Some(reason);
        member
    }

    /// An empty slot (its member was removed).
    pub fn empty(index: usize) -> Self {
        Self::with(index, String::new(), None, MemberState::Removed)
    }

    /// Whether the array counts on this member and cannot use it.
    pub fn is_lost(&self) -> bool {
        self.state().is_lost()
    }

    /// The member is removed: the slot is empty. Returns the device it had.
    pub fn empty_out(&self) -> Option<Arc<dyn BlockDevice>> {
        *self.state.lock().expect("member state lock") = MemberState::Removed;
        *self.path.lock().expect("member path lock") = String::new();
        self.device.lock().expect("member device lock").take()
    }

    /// A device added into this empty slot: usable, at `path`.
    pub fn fill(&self, path: String, device: Arc<dyn BlockDevice>) {
        *self.device.lock().expect("member device lock") = Some(device);
        *self.path.lock().expect("member path lock") = path;
        *self.state.lock().expect("member state lock") = MemberState::Online;
        *self.unfit.lock().expect("member unfit lock") = None;
        self.io_errors.store(0, Ordering::Relaxed);
        self.checksum_errors_repaired.store(0, Ordering::Relaxed);
        self.parity_repaired.store(0, Ordering::Relaxed);
    }
    fn with(
        index: usize,
        path: String,
        device: Option<Arc<dyn BlockDevice>>,
        state: MemberState,
    ) -> Self {
        Self {
            device: Mutex::new(device),
            path: Mutex::new(path),
            replacement: Mutex::new(None),
            unfit: Mutex::new(None),
            index,
            state: Mutex::new(state),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            io_errors: AtomicU64::new(0),
            checksum_errors_repaired: AtomicU64::new(0),
            parity_repaired: AtomicU64::new(0),
            scrub_window: Mutex::new(ScrubWindow::default()),
        }
    }

    pub fn path(&self) -> String {
        self.path.lock().expect("member path lock").clone()
    }

    pub fn state(&self) -> MemberState {
        *self.state.lock().expect("member state lock")
    }

    /// The device, while the member is usable.
    pub fn usable_device(&self) -> Option<Arc<dyn BlockDevice>> {
        if !self.state().is_usable() {
            return None;
        }
        self.device.lock().expect("member device lock").clone()
    }

    /// The device, usable or not (to wipe the label of a replaced one).
    pub fn any_device(&self) -> Option<Arc<dyn BlockDevice>> {
        self.device.lock().expect("member device lock").clone()
    }

    pub fn replacement(&self) -> Option<Arc<Replacement>> {
        self.replacement
            .lock()
            .expect("member replacement lock")
            .clone()
    }

    /// The device and the replacement a write of this member's column goes
    /// to, as one snapshot. Read one after the other, a write on one thread
    /// could find the member faulted, then, with the replacement promoted
    /// meanwhile on another, no replacement either, and skip the column: the
    /// new member would keep what the rebuild wrote before that write, and
    /// read back older data once two more members are lost. The replacement
    /// lock is held across both reads, as `promote_replacement` holds it
    /// while it moves the replacement into the member's place.
    pub fn write_targets(&self) -> WriteTargets {
        let replacement = self.replacement.lock().expect("member replacement lock");
        WriteTargets {
            device: self.usable_device(),
            replacement: replacement.clone(),
        }
    }

    /// Starts writing to `replacement` too; false if one is already set.
    pub fn set_replacement(&self, replacement: Arc<Replacement>) -> bool {
        let mut slot = self.replacement.lock().expect("member replacement lock");
        if slot.is_some() {
            return false;
        }
        *slot = Some(replacement);
        true
    }

    /// Stops using the replacement (it failed); true if there was one.
    pub fn drop_replacement(&self, reason: &str) -> bool {
        let Some(replacement) = self
            .replacement
            .lock()
            .expect("member replacement lock")
            .take()
        else {
            return false;
        };
        tracing::error!(
            member = self.index,
            path = %replacement.path,
            %reason,
            "replacement device failed: the rebuild onto it stops and the member stays as it was"
        );
        true
    }

    /// The replacement takes the member's place: usable, at its path.
    /// Held under the replacement lock throughout, so that
    /// [`Member::write_targets`] sees the replacement either pending or in
    /// the member's place, never gone from both.
    pub fn promote_replacement(&self) {
        let mut slot = self.replacement.lock().expect("member replacement lock");
        let replacement = slot
            .take()
            .expect("a member being replaced has a replacement");
        *self.device.lock().expect("member device lock") = Some(replacement.device.clone());
        *self.path.lock().expect("member path lock") = replacement.path.clone();
        *self.state.lock().expect("member state lock") = MemberState::Online;
        *self.unfit.lock().expect("member unfit lock") = None;
        drop(slot);
        self.io_errors.store(0, Ordering::Relaxed);
        self.checksum_errors_repaired.store(0, Ordering::Relaxed);
        self.parity_repaired.store(0, Ordering::Relaxed);
        tracing::warn!(
            member = self.index,
            path = %replacement.path,
            "replacement rebuilt: it takes the member's place"
        );
    }

    /// Takes the member out after a failed I/O; true if it was in use until now.
    pub fn fault(&self, reason: &str) -> bool {
        self.io_errors.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock().expect("member state lock");
        let was_usable = state.is_usable();
        if was_usable {
            tracing::error!(
                member = self.index,
                path = %self.path(),
                %reason,
                "array member faulted: its data is now reconstructed from the other members"
            );
            *state = MemberState::Faulted;
        }
        was_usable
    }

    pub fn counted_read(&self, bytes: usize) {
        self.bytes_read.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    pub fn counted_write(&self, bytes: usize) {
        self.bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// A block of this member failed its checksum and was rewritten.
    pub fn repaired(&self) {
        self.checksum_errors_repaired
            .fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock().expect("member state lock");
        if *state == MemberState::Online {
            *state = MemberState::Degraded;
        }
    }

    /// A column of this member other than a held data block (parity, a
    /// metadata copy, a dead block) disagreed with its row and was
    /// rewritten by a scrub.
    pub fn parity_repaired(&self) {
        self.parity_repaired.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock().expect("member state lock");
        if *state == MemberState::Online {
            *state = MemberState::Degraded;
        }
    }

    /// Adds `rows_checked` rows scrubbed, `rows_bad` of them with this
    /// member's column rewritten, to the current window; whether the
    /// window, once it holds `window_rows` rows, had more than
    /// `failed_percent` % of them bad (a full window starts a new one).
    pub fn scrub_tally(
        &self,
        rows_checked: u64,
        rows_bad: u64,
        window_rows: u64,
        failed_percent: u64,
    ) -> bool {
        let mut window = self.scrub_window.lock().expect("member scrub window lock");
        window.rows_checked += rows_checked;
        window.rows_bad += rows_bad;
        if window.rows_checked < window_rows {
            return false;
        }
        let mostly_bad = window.rows_bad * 100 > window.rows_checked * failed_percent;
        *window = ScrubWindow::default();
        mostly_bad
    }

    pub fn status(&self) -> MemberStatus {
        MemberStatus {
            path: self.path(),
            index: self.index,
            state: self.state(),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            io_errors: self.io_errors.load(Ordering::Relaxed),
            checksum_errors_repaired: self.checksum_errors_repaired.load(Ordering::Relaxed),
            parity_repaired: self.parity_repaired.load(Ordering::Relaxed),
            replacement: self.replacement().map(|replacement| ReplacementStatus {
                path: replacement.path.clone(),
                rows_done: replacement.rows_done.load(Ordering::Relaxed),
                bytes_written: replacement.bytes_written.load(Ordering::Relaxed),
            }),
            unfit: self.unfit.lock().expect("member unfit lock").clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_device::MemoryDevice;

    fn replacement() -> Arc<Replacement> {
        Arc::new(Replacement::new(
            Arc::new(MemoryDevice::new(4096 * 16)),
            "/test/new".to_string(),
            0,
        ))
    }

    /// A write racing the promotion on another thread must always find a
    /// target for the member's column: the replacement still pending, or
    /// the replacement in the member's place. (Two separate reads found
    /// neither about once in 600 rebuilds of `replace.rs`'s
    /// `writes_of_the_rows_a_rebuild_step_holds_are_never_undone_by_it`.)
    #[test]
    fn a_write_racing_the_promotion_always_finds_a_target() {
        let promotions = 2_000;
        for _ in 0..promotions {
            let member = Arc::new(Member::missing(2, "/test/old".to_string()));
            assert!(member.set_replacement(replacement()));
            let promoter = {
                let member = member.clone();
                std::thread::spawn(move || member.promote_replacement())
            };
            loop {
                let targets = member.write_targets();
                assert!(
                    targets.device.is_some() || targets.replacement.is_some(),
                    "a write found neither the member's device nor its replacement"
                );
                if targets.replacement.is_none() {
                    break;
                }
            }
            promoter.join().expect("the promotion ran");
        }
    }
}
