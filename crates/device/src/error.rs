//! Typed device errors carrying the device, offset and length of the failed request,
//! so that a report from deep in the engine still says where it happened.

/// What went wrong with one device request.
#[derive(Debug, thiserror::Error)]
pub enum DeviceErrorKind {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("request beyond the end of the device ({size_bytes} bytes)")]
    OutOfRange { size_bytes: u64 },
    #[error("injected fault")]
    Injected,
    /// Another process (or another open in this one) holds the device: see
    /// `lock.rs`.
    #[error("{}", crate::lock::in_use_message(holder))]
    InUse {
        /// Who holds it, when `/proc/locks` says.
        holder: Option<crate::LockHolder>,
    },
}

/// A failed device request with its context.
#[derive(Debug, thiserror::Error)]
#[error("device {device}: {kind}{}", self.request_context())]
pub struct DeviceError {
    pub kind: DeviceErrorKind,
    pub device: String,
    pub offset: u64,
    pub length: u64,
}

impl DeviceError {
    /// The request's offset and length, which an open refused because the
    /// device is in use does not have.
    fn request_context(&self) -> String {
        match self.kind {
            DeviceErrorKind::InUse { .. } => String::new(),
            _ => format!(" (offset {}, length {})", self.offset, self.length),
        }
    }

    pub fn new(kind: DeviceErrorKind, device: &str, offset: u64, length: u64) -> Self {
        Self {
            kind,
            device: device.to_string(),
            offset,
            length,
        }
    }
}
