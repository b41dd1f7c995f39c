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
}

/// A failed device request with its context.
#[derive(Debug, thiserror::Error)]
#[error("device {device}: {kind} (offset {offset}, length {length})")]
pub struct DeviceError {
    pub kind: DeviceErrorKind,
    pub device: String,
    pub offset: u64,
    pub length: u64,
}

impl DeviceError {
    pub fn new(kind: DeviceErrorKind, device: &str, offset: u64, length: u64) -> Self {
        Self {
            kind,
            device: device.to_string(),
            offset,
            length,
        }
    }
}
