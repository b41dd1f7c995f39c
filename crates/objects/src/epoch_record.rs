//! Where a pool keeps the epoch it last took of its object tier, so that an
//! open can tell that another process took the tier since (decision 0034):
//! a copy of a pool started by mistake fences the original, and the original
//! must then not take the tier back as if nothing happened — the tier holds
//! the copy's writes, which the original's metadata knows nothing of.

/// See the module documentation. The daemon keeps it in a file of its data
/// directory; tests keep it in memory.
pub trait EpochRecord: Send + Sync {
    /// The epoch this pool last took (or was about to take), if any.
    fn last_epoch(&self) -> std::io::Result<Option<u64>>;

    /// Records `epoch` as about to be taken: called before the label write
    /// that takes it, and durable when it returns. So after a crash between
    /// the two, the record is one ahead of the label.
    fn record(&self, epoch: u64) -> std::io::Result<()>;
}

/// Whether a tier whose label says `current_epoch` is still the one this
/// pool left: its record names the current epoch, or the next one when a
/// crash came between recording and taking it.
pub(crate) fn is_ours(current_epoch: u64, last_epoch: u64) -> bool {
    current_epoch == last_epoch || current_epoch + 1 == last_epoch
}

/// An [`EpochRecord`] in memory (tests).
#[derive(Debug, Default)]
pub struct MemoryEpochRecord {
    epoch: std::sync::Mutex<Option<u64>>,
}

impl EpochRecord for MemoryEpochRecord {
    fn last_epoch(&self) -> std::io::Result<Option<u64>> {
        Ok(*self.epoch.lock().expect("epoch record lock"))
    }

    fn record(&self, epoch: u64) -> std::io::Result<()> {
        *self.epoch.lock().expect("epoch record lock") = Some(epoch);
        Ok(())
    }
}
