//! A file or block device. Temporary positional-I/O implementation; the io_uring
//! O_DIRECT backend replaces the internals behind the same interface.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::{AlignedBuffer, BlockDevice, DeviceError, DeviceErrorKind, check_request};

/// How a [`FileDevice`] performs I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoBackend {
    /// io_uring with O_DIRECT: the production path.
    IoUringDirect,
    /// pread/pwrite on a thread pool through the page cache, used only where
    /// O_DIRECT is refused (tmpfs, some overlay filesystems).
    PositionalBuffered,
}

/// Options for opening a file device.
#[derive(Clone, Debug, Default)]
pub struct FileDeviceOptions {
    /// Create the file with this size (sparse) if it does not exist.
    pub create_size_bytes: Option<u64>,
    /// Force a backend instead of choosing the best available.
    pub backend: Option<IoBackend>,
}

/// See the module documentation.
pub struct FileDevice {
    name: String,
    file: Arc<File>,
    size_bytes: u64,
    backend: IoBackend,
}

impl FileDevice {
    pub fn open(path: &Path, options: FileDeviceOptions) -> Result<Self, DeviceError> {
        let name = path.display().to_string();
        let io_error =
            |error: std::io::Error| DeviceError::new(DeviceErrorKind::Io(error), &name, 0, 0);
        let mut open_options = OpenOptions::new();
        open_options.read(true).write(true);
        if options.create_size_bytes.is_some() {
            open_options.create(true);
        }
        let file = open_options.open(path).map_err(io_error)?;
        if let Some(size) = options.create_size_bytes
            && file.metadata().map_err(io_error)?.len() == 0
        {
            file.set_len(size).map_err(io_error)?;
        }
        let size_bytes = device_size(&file).map_err(io_error)?;
        let size_bytes = size_bytes - size_bytes % crate::DEVICE_ALIGNMENT_BYTES;
        Ok(Self {
            name,
            file: Arc::new(file),
            size_bytes,
            backend: IoBackend::PositionalBuffered,
        })
    }

    pub fn backend(&self) -> IoBackend {
        self.backend
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.name)
    }
}

fn device_size(file: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut handle = file;
    handle.seek(SeekFrom::End(0))
}

#[async_trait::async_trait]
impl BlockDevice for FileDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    async fn read(&self, offset: u64, length: usize) -> Result<AlignedBuffer, DeviceError> {
        check_request(&self.name, self.size_bytes, offset, length as u64)?;
        let file = self.file.clone();
        let result = tokio::task::spawn_blocking(move || {
            let mut buffer = AlignedBuffer::zeroed(length);
            file.read_exact_at(&mut buffer, offset).map(|_| buffer)
        })
        .await
        .expect("read task");
        result.map_err(|error| {
            DeviceError::new(
                DeviceErrorKind::Io(error),
                &self.name,
                offset,
                length as u64,
            )
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        let length = data.len() as u64;
        check_request(&self.name, self.size_bytes, offset, length)?;
        let file = self.file.clone();
        let result = tokio::task::spawn_blocking(move || file.write_all_at(&data, offset))
            .await
            .expect("write task");
        result.map_err(|error| {
            DeviceError::new(DeviceErrorKind::Io(error), &self.name, offset, length)
        })
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        let file = self.file.clone();
        let result = tokio::task::spawn_blocking(move || file.sync_data())
            .await
            .expect("flush task");
        result.map_err(|error| DeviceError::new(DeviceErrorKind::Io(error), &self.name, 0, 0))
    }
}
