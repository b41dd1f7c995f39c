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
}

impl MemberState {
    pub fn name(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Degraded => "degraded",
            Self::Faulted => "faulted",
            Self::Missing => "missing",
        }
    }

    pub fn is_usable(self) -> bool {
        matches!(self, Self::Online | Self::Degraded)
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
}

/// See the module documentation.
pub(crate) struct Member {
    device: Option<Arc<dyn BlockDevice>>,
    path: String,
    index: usize,
    state: Mutex<MemberState>,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    io_errors: AtomicU64,
    checksum_errors_repaired: AtomicU64,
}

impl Member {
    pub fn present(index: usize, path: String, device: Arc<dyn BlockDevice>) -> Self {
        Self::with(index, path, Some(device), MemberState::Online)
    }

    pub fn missing(index: usize, path: String) -> Self {
        Self::with(index, path, None, MemberState::Missing)
    }

    fn with(
        index: usize,
        path: String,
        device: Option<Arc<dyn BlockDevice>>,
        state: MemberState,
    ) -> Self {
        Self {
            device,
            path,
            index,
            state: Mutex::new(state),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            io_errors: AtomicU64::new(0),
            checksum_errors_repaired: AtomicU64::new(0),
        }
    }

    pub fn path(&self) -> &str {
        &self.path
    }

    pub fn state(&self) -> MemberState {
        *self.state.lock().expect("member state lock")
    }

    /// The device, while the member is usable.
    pub fn usable_device(&self) -> Option<&Arc<dyn BlockDevice>> {
        self.state().is_usable().then_some(self.device.as_ref()?)
    }

    /// Takes the member out after a failed I/O; true if it was in use until now.
    pub fn fault(&self, reason: &str) -> bool {
        self.io_errors.fetch_add(1, Ordering::Relaxed);
        let mut state = self.state.lock().expect("member state lock");
        let was_usable = state.is_usable();
        if was_usable {
            tracing::error!(
                member = self.index,
                path = %self.path,
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

    pub fn status(&self) -> MemberStatus {
        MemberStatus {
            path: self.path.clone(),
            index: self.index,
            state: self.state(),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            io_errors: self.io_errors.load(Ordering::Relaxed),
            checksum_errors_repaired: self.checksum_errors_repaired.load(Ordering::Relaxed),
        }
    }
}
