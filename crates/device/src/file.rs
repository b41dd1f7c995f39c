//! A file or block device: lamina's production device. It opens the file with
//! O_DIRECT and does its I/O through one io_uring per thread that uses it, submitted and
//! reaped by a task on the tokio runtime with no thread of its own (see
//! `file/ring.rs`), so that data goes straight between lamina's buffers and the
//! device without the page cache or a hand-off to another thread. Where O_DIRECT is refused (ramfs, some FUSE and
//! network filesystems) or io_uring is unavailable (old kernels, seccomp, the
//! `io_uring_disabled` sysctl), it falls back to pread/pwrite through the page
//! cache on the blocking thread pool, and says so once with a warning. Opening
//! claims the device for this process first (`lock.rs`): a second open, by this
//! process or another, is refused while the device is open.

mod extents;
mod preallocation;
mod ring;

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::lock::DeviceLock;
use crate::{AlignedBuffer, BlockDevice, DEVICE_ALIGNMENT_BYTES, DeviceError, DeviceErrorKind};
use extents::ByteRange;
pub use preallocation::FilePreallocation;
use preallocation::{ChunkTurn, Preallocation};
pub use ring::thread_has_device_completions;
use ring::{Completed, Operation, Ring, RingLimits};

/// How a [`FileDevice`] performs I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoBackend {
    /// io_uring with O_DIRECT: the production path.
    IoUringDirect,
    /// pread/pwrite on a thread pool through the page cache, used only where
    /// O_DIRECT is refused (ramfs, some FUSE and network filesystems) or io_uring
    /// is unavailable.
    PositionalBuffered,
}

/// Options for opening a file device.
#[derive(Clone, Debug, Default)]
pub struct FileDeviceOptions {
    /// Create the file with this size (sparse, owner-only) if it does not exist, or
    /// extend it to this size if it exists and is empty.
    pub create_size_bytes: Option<u64>,
    /// Force a backend instead of choosing the best available. Forcing
    /// [`IoBackend::IoUringDirect`] turns a refusal into an error instead of a fallback.
    pub backend: Option<IoBackend>,
    /// Submission queue entries of the io_uring (its queue depth); defaults to
    /// [`FileDeviceOptions::RING_ENTRIES_DEFAULT`].
    pub ring_entries: Option<u32>,
    /// Requests accepted and not yet answered, over both backends; further callers
    /// wait. Defaults to [`FileDeviceOptions::IN_FLIGHT_REQUESTS_MAX_DEFAULT`].
    pub in_flight_requests_max: Option<usize>,
    /// How a regular file on the io_uring backend is prepared ahead of its
    /// writes; defaults to [`FilePreallocation::Zeroes`] (see
    /// `file/preallocation.rs`).
    pub preallocation: Option<FilePreallocation>,
}

impl FileDeviceOptions {
    /// Deep enough to keep an NVMe drive busy from one thread, small enough that the
    /// ring's memory (a few tens of KiB) does not matter.
    pub const RING_ENTRIES_DEFAULT: u32 = 256;
    /// Four rings' worth, so that bursts queue in lamina rather than block callers.
    pub const IN_FLIGHT_REQUESTS_MAX_DEFAULT: usize = 1024;
}

/// See the module documentation.
pub struct FileDevice {
    name: String,
    path: PathBuf,
    size_bytes: u64,
    engine: Engine,
    /// For a regular file on the ring: its chunks prepared ahead of writes.
    preallocation: Option<Arc<Preallocation>>,
    /// The claim on the device, held while it is open. Declared after `engine`
    /// so that it is released only once the kernel holds no request of the ring.
    _lock: DeviceLock,
}

enum Engine {
    Ring(Ring),
    Positional {
        file: Arc<File>,
        /// Bounds the blocking-pool threads this device can occupy.
        permits: Arc<Semaphore>,
    },
}

/// `_IOR(0x12, 114, size_t)`: the size in bytes of a block device. The libc crate
/// does not export it; this encoding is the one used by x86, Arm and RISC-V.
const BLKGETSIZE64: libc::Ioctl = 0x8008_1272;

impl FileDevice {
    /// Opens (and with `create_size_bytes`, creates) a file or block device,
    /// claiming it for as long as the device is open; a device another open
    /// holds is refused with [`DeviceErrorKind::InUse`]. The usable size is the
    /// file's size rounded down to the device alignment.
    pub fn open(path: &Path, options: FileDeviceOptions) -> Result<Self, DeviceError> {
        let name = path.display().to_string();
        let open_error =
            |error: io::Error| DeviceError::new(DeviceErrorKind::from(error), &name, 0, 0);
        let lock = DeviceLock::acquire(path, options.create_size_bytes)
            .map_err(|kind| DeviceError::new(kind, &name, 0, 0))?;
        let limits = RingLimits {
            ring_entries: options
                .ring_entries
                .unwrap_or(FileDeviceOptions::RING_ENTRIES_DEFAULT),
            in_flight_requests_max: options
                .in_flight_requests_max
                .unwrap_or(FileDeviceOptions::IN_FLIGHT_REQUESTS_MAX_DEFAULT),
        };
        assert!(
            limits.in_flight_requests_max >= 1,
            "in_flight_requests_max must be positive"
        );

        let (file, engine) = match options.backend {
            Some(IoBackend::PositionalBuffered) => {
                let file = open_file(path, false).map_err(open_error)?;
                let engine = positional_engine(&file, limits);
                (file, engine)
            }
            Some(IoBackend::IoUringDirect) => {
                let file = open_file(path, true).map_err(open_error)?;
                probe_direct_read(&file).map_err(open_error)?;
                let ring_file = file.try_clone().map_err(open_error)?;
                let ring = Ring::start(ring_file, &name, limits).map_err(open_error)?;
                (file, Engine::Ring(ring))
            }
            None => match open_direct_ring(path, &name, limits) {
                Ok((file, ring)) => (file, Engine::Ring(ring)),
                Err(Refusal::Refused(reason)) => {
                    tracing::warn!(
                        device = %name,
                        %reason,
                        "falling back to buffered pread/pwrite through the page cache"
                    );
                    let file = open_file(path, false).map_err(open_error)?;
                    let engine = positional_engine(&file, limits);
                    (file, engine)
                }
                Err(Refusal::Failed(error)) => return Err(open_error(error)),
            },
        };
        lock.check_same_file(&file).map_err(open_error)?;
        let size_bytes = device_size(&file).map_err(open_error)?;
        let size_bytes = size_bytes - size_bytes % DEVICE_ALIGNMENT_BYTES;
        // Block devices have no holes; the positional backend writes through
        // the page cache, which allocates without stalling the caller's ring.
        let is_regular_file = file.metadata().map_err(open_error)?.file_type().is_file();
        let mode = options.preallocation.unwrap_or_default();
        let preallocation = (is_regular_file && matches!(engine, Engine::Ring(_)))
            .then(|| Arc::new(Preallocation::new(&name, Arc::new(file), size_bytes, mode)));
        Ok(Self {
            name,
            path: path.to_path_buf(),
            size_bytes,
            engine,
            preallocation,
            _lock: lock,
        })
    }

    /// The backend this device ended up with.
    pub fn backend(&self) -> IoBackend {
        match self.engine {
            Engine::Ring(_) => IoBackend::IoUringDirect,
            Engine::Positional { .. } => IoBackend::PositionalBuffered,
        }
    }

    /// The io_uring rings this device has set up so far: one per thread that
    /// did I/O on it, up to a limit (0 on the positional backend).
    pub fn ring_count(&self) -> usize {
        match &self.engine {
            Engine::Ring(ring) => ring.ring_count(),
            Engine::Positional { .. } => 0,
        }
    }

    pub fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Prepares the chunks of the file a write is about to touch that no
    /// write since the open has, or waits for the write preparing them (see
    /// `file/preallocation.rs`).
    async fn prepare_ahead(&self, offset: u64, length: u64) {
        let Some(preallocation) = &self.preallocation else {
            return;
        };
        let write = ByteRange {
            offset,
            length_bytes: length,
        };
        for chunk in preallocation.chunks(offset, length) {
            match preallocation.turn(chunk) {
                ChunkTurn::GoAhead => {}
                ChunkTurn::Wait => preallocation.wait_ready(chunk).await,
                ChunkTurn::Prepare(range) => {
                    // On the blocking pool, not awaited in place: a preparation
                    // finishes and marks its chunk ready even when this write
                    // is abandoned, so that no later write waits for ever.
                    let preparing = preallocation.clone();
                    let task = tokio::task::spawn_blocking(move || preparing.prepare(range, write));
                    task.await.expect("a chunk preparation panicked");
                }
            }
        }
    }

    fn error(&self, error: io::Error, offset: u64, length: u64) -> DeviceError {
        DeviceError::new(DeviceErrorKind::from(error), &self.name, offset, length)
    }
}

/// Why the automatic choice could not use io_uring with O_DIRECT.
enum Refusal {
    /// O_DIRECT or io_uring is not available here: fall back, with this reason.
    Refused(String),
    /// Any other failure, which a fallback would only hide.
    Failed(io::Error),
}

fn open_direct_ring(path: &Path, name: &str, limits: RingLimits) -> Result<(File, Ring), Refusal> {
    let file = match open_file(path, true) {
        Ok(file) => file,
        Err(error) if refuses_direct(&error) => {
            return Err(Refusal::Refused(format!(
                "the filesystem refuses O_DIRECT: {error}"
            )));
        }
        Err(error) => return Err(Refusal::Failed(error)),
    };
    match probe_direct_read(&file) {
        Ok(()) => {}
        Err(error) if refuses_direct(&error) => {
            return Err(Refusal::Refused(format!(
                "O_DIRECT reads of {DEVICE_ALIGNMENT_BYTES} bytes fail: {error}"
            )));
        }
        Err(error) => return Err(Refusal::Failed(error)),
    }
    let ring_file = file.try_clone().map_err(Refusal::Failed)?;
    match Ring::start(ring_file, name, limits) {
        Ok(ring) => Ok((file, ring)),
        Err(error) if io_uring_unavailable(&error) => Err(Refusal::Refused(format!(
            "io_uring is unavailable: {error}"
        ))),
        Err(error) => Err(Refusal::Failed(error)),
    }
}

/// The errors with which Linux refuses O_DIRECT on a filesystem or a request.
fn refuses_direct(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP))
}

/// The errors of `io_uring_setup` that mean io_uring is not available to this
/// process (not compiled in, disabled by sysctl, or blocked by seccomp).
fn io_uring_unavailable(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::ENOSYS | libc::EPERM))
}

fn open_file(path: &Path, direct: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true);
    if direct {
        options.custom_flags(libc::O_DIRECT);
    }
    options.open(path)
}

/// Some filesystems accept O_DIRECT at open and refuse it at the first request
/// (for example when their block size is larger than lamina's alignment), so one
/// aligned read proves the direct path before it is chosen.
fn probe_direct_read(file: &File) -> io::Result<()> {
    if device_size(file)? < DEVICE_ALIGNMENT_BYTES {
        return Ok(());
    }
    let mut buffer = AlignedBuffer::zeroed(crate::buffer_length(DEVICE_ALIGNMENT_BYTES));
    file.read_exact_at(&mut buffer, 0)
}

fn positional_engine(file: &File, limits: RingLimits) -> Engine {
    Engine::Positional {
        file: Arc::new(file.try_clone().expect("duplicating a descriptor")),
        permits: Arc::new(Semaphore::new(limits.in_flight_requests_max)),
    }
}

/// The size in bytes of a regular file (from its metadata) or of a block device
/// (from the BLKGETSIZE64 ioctl, since its metadata says 0).
fn device_size(file: &File) -> io::Result<u64> {
    let metadata = file.metadata()?;
    if !metadata.file_type().is_block_device() {
        return Ok(metadata.len());
    }
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at a
    // live local; the descriptor is open for the duration of the call.
    let result = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &raw mut size_bytes) };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size_bytes)
}

/// A permit for one positional request. It moves into the blocking task, so that
/// a caller that gives up does not free a slot while its pread or pwrite still runs.
async fn acquire(permits: &Arc<Semaphore>) -> tokio::sync::OwnedSemaphorePermit {
    permits
        .clone()
        .acquire_owned()
        .await
        .expect("the positional semaphore is never closed")
}

#[async_trait::async_trait]
impl BlockDevice for FileDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset: u64, length: usize) -> crate::DeviceReadFuture<'_> {
        crate::DeviceReadFuture::from(async move {
            crate::check_request(&self.name, self.size_bytes, offset, length as u64)?;
            // Not cleared: the buffer is returned only once the device has filled
            // every byte (the ring resubmits short reads; read_exact_at fills or
            // fails), and a failed read drops it unseen.
            let buffer = AlignedBuffer::for_overwrite(length);
            if length == 0 {
                return Ok(buffer);
            }
            let result = match &self.engine {
                Engine::Ring(ring) => {
                    match ring.execute(Operation::Read { buffer }, offset).await {
                        Ok(Completed::Read(buffer)) => Ok(buffer),
                        Ok(_) => unreachable!("a read completes as a read"),
                        Err(error) => Err(error),
                    }
                }
                Engine::Positional { file, permits } => {
                    let permit = acquire(permits).await;
                    let file = file.clone();
                    let mut buffer = buffer;
                    tokio::task::spawn_blocking(move || {
                        let _permit = permit;
                        file.read_exact_at(&mut buffer, offset).map(|()| buffer)
                    })
                    .await
                    .expect("positional read task panicked")
                }
            };
            result.map_err(|error| self.error(error, offset, length as u64))
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        let length = data.len() as u64;
        crate::check_request(&self.name, self.size_bytes, offset, length)?;
        if length == 0 {
            return Ok(());
        }
        let result = match &self.engine {
            Engine::Ring(ring) => {
                self.prepare_ahead(offset, length).await;
                ring.execute(Operation::Write { buffer: data }, offset)
                    .await
                    .map(|_| ())
            }
            Engine::Positional { file, permits } => {
                let permit = acquire(permits).await;
                let file = file.clone();
                tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    file.write_all_at(&data, offset)
                })
                .await
                .expect("positional write task panicked")
            }
        };
        result.map_err(|error| self.error(error, offset, length))
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        // A write counts as completed only once its CQE was reaped (or its pwrite
        // returned), so an fdatasync issued after that covers it; no ordering
        // against writes still in flight is needed or promised.
        let result = match &self.engine {
            Engine::Ring(ring) => ring.execute(Operation::Flush, 0).await.map(|_| ()),
            Engine::Positional { file, permits } => {
                let permit = acquire(permits).await;
                let file = file.clone();
                tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    file.sync_data()
                })
                .await
                .expect("positional flush task panicked")
            }
        };
        result.map_err(|error| self.error(error, 0, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_classification() {
        assert!(refuses_direct(&io::Error::from_raw_os_error(libc::EINVAL)));
        assert!(!refuses_direct(&io::Error::from_raw_os_error(libc::EIO)));
        assert!(io_uring_unavailable(&io::Error::from_raw_os_error(
            libc::ENOSYS
        )));
        assert!(io_uring_unavailable(&io::Error::from_raw_os_error(
            libc::EPERM
        )));
        assert!(!io_uring_unavailable(&io::Error::from_raw_os_error(
            libc::ENOMEM
        )));
    }
}
