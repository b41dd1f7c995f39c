//! Typed device errors carrying the device, offset and length of the failed request,
//! so that a report from deep in the engine still says where it happened. Running
//! out of space on the store under a device (ENOSPC, EDQUOT) has a kind of its own,
//! because the engine treats it as a wait for space, not as a failed device.

/// What went wrong with one device request.
#[derive(Debug, thiserror::Error)]
pub enum DeviceErrorKind {
    #[error("I/O error: {0}")]
    Io(std::io::Error),
    /// The device could not be opened at all (no such file, no permission):
    /// no request was made, so there is no offset or length to report.
    #[error("{}", open_failure_message(.0))]
    Open(std::io::Error),
    /// The file system or quota under the device has no room for the write
    /// (a sparse file or a thin device being filled); nothing else is wrong with
    /// it, and the write can succeed once space is freed.
    #[error("out of space on the backing store: {0}")]
    NoSpace(std::io::Error),
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

impl From<std::io::Error> for DeviceErrorKind {
    /// ENOSPC and EDQUOT become [`DeviceErrorKind::NoSpace`], every other error
    /// [`DeviceErrorKind::Io`].
    fn from(error: std::io::Error) -> Self {
        match error.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Self::NoSpace(error),
            _ => Self::Io(error),
        }
    }
}

/// Why an open failed, in the words an operator looks for: "no such file"
/// rather than the errno's text with its number.
fn open_failure_message(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        std::io::ErrorKind::PermissionDenied => {
            "permission denied (run as a user that may read and write it)".to_string()
        }
        _ => format!("cannot open: {error}"),
    }
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
            DeviceErrorKind::InUse { .. } | DeviceErrorKind::Open(_) => String::new(),
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

    /// Whether the request failed only for want of space under the device.
    pub fn is_out_of_space(&self) -> bool {
        matches!(self.kind, DeviceErrorKind::NoSpace(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_open_names_the_device_and_says_no_such_file_without_a_request() {
        let kind = DeviceErrorKind::Open(std::io::Error::from_raw_os_error(libc::ENOENT));
        let error = DeviceError::new(kind, "/dev/gone", 0, 0);
        assert_eq!(error.to_string(), "device /dev/gone: no such file");
    }

    #[test]
    fn enospc_and_edquot_are_out_of_space_and_eio_is_not() {
        for (errno, out_of_space) in [
            (libc::ENOSPC, true),
            (libc::EDQUOT, true),
            (libc::EIO, false),
        ] {
            let kind = DeviceErrorKind::from(std::io::Error::from_raw_os_error(errno));
            let error = DeviceError::new(kind, "test", 4096, 8192);
            assert_eq!(error.is_out_of_space(), out_of_space, "{error}");
        }
    }
}
