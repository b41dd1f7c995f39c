//! Typed errors of an object-store tier, each with its context (bucket, key,
//! operation), and their conversion into the device layer's error, which the
//! engine reports to clients as EIO.

use lamina_device::{DeviceError, DeviceErrorKind};

/// The kinds of request a tier makes, for errors and statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestKind {
    Get,
    /// PUTs of part objects.
    Put,
    Delete,
    List,
    /// Conditional PUTs of the tier's label: one per open and one per
    /// committed flush (decision 0034).
    LabelPut,
}

impl std::fmt::Display for RequestKind {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let word = match self {
            Self::Get => "GET",
            Self::Put => "PUT",
            Self::Delete => "DELETE",
            Self::List => "LIST",
            Self::LabelPut => "PUT (label)",
        };
        formatter.write_str(word)
    }
}

/// What went wrong with a tier.
#[derive(Debug, thiserror::Error)]
pub enum ObjectStoreError {
    #[error("object store URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("object store limits: {reason}")]
    InvalidLimits { reason: String },
    #[error("object store tier geometry: {reason}")]
    InvalidGeometry { reason: String },
    #[error("object store client for bucket {bucket}: {source}")]
    Client {
        bucket: String,
        source: object_store::Error,
    },
    /// A request failed after object_store's retries.
    #[error("{operation} s3://{bucket}/{key} failed: {source}")]
    Request {
        operation: RequestKind,
        bucket: String,
        key: String,
        source: object_store::Error,
    },
    #[error(
        "s3://{bucket}/{key} already holds a lamina tier label: refusing to create a tier over it"
    )]
    LabelExists { bucket: String, key: String },
    #[error(
        "s3://{bucket}/{prefix} already holds segment objects ({key} and maybe more) but no label: refusing to create a tier over them"
    )]
    PrefixNotEmpty {
        bucket: String,
        prefix: String,
        key: String,
    },
    #[error("s3://{bucket}/{key}: no lamina tier label (create the tier first, or check the URL)")]
    LabelMissing { bucket: String, key: String },
    #[error("s3://{bucket}/{key}: not a valid lamina tier label: {reason}")]
    LabelInvalid {
        bucket: String,
        key: String,
        reason: String,
    },
    #[error(
        "s3://{bucket}/{key}: tier label format version {found}, this lamina reads version {supported}"
    )]
    LabelFormatUnsupported {
        bucket: String,
        key: String,
        found: u32,
        supported: u32,
    },
    /// Another process opened the tier after this one: this one no longer
    /// writes to it (what it flushed since is not committed).
    #[error(
        "s3://{bucket}/{key}: the tier was opened again by another process (epoch {newer_epoch}, this process has epoch {epoch}); this process stores nothing more in it"
    )]
    Fenced {
        bucket: String,
        key: String,
        epoch: u64,
        newer_epoch: u64,
    },
    /// The tier's label carries an epoch this pool did not take: another
    /// process opened the tier since this pool last used it.
    #[error(
        "s3://{bucket}/{key}: the tier was opened by another process since this pool last used it (the tier is at epoch {epoch}, this pool last took epoch {last_epoch}): it may hold that process's writes, which this pool's metadata does not know; refusing to open it"
    )]
    TakenSinceLastUse {
        bucket: String,
        key: String,
        epoch: u64,
        last_epoch: u64,
    },
    /// The pool's record of its epoch could not be read or written.
    #[error("the record of this pool's object tier epoch: {source}")]
    EpochRecord { source: std::io::Error },
    /// The label kept changing while this process tried to open the tier.
    #[error(
        "s3://{bucket}/{key}: the tier's label changed during each of {attempts} attempts to open it: is another process opening the tier?"
    )]
    OpenContended {
        bucket: String,
        key: String,
        attempts: usize,
    },
    /// The layer above asked to open a region that is not one segment of
    /// the tier (its segment size or origin differs from the tier's label).
    #[error(
        "region at {offset} of {length} bytes is not one segment of the tier (segment size {segment_size_bytes}, origin {segment_origin_bytes})"
    )]
    RegionNotSegment {
        offset: u64,
        length: u64,
        segment_size_bytes: u64,
        segment_origin_bytes: u64,
    },
}

impl ObjectStoreError {
    /// As a device error on `device` for the request at `offset` of `length`.
    pub fn into_device_error(self, device: &str, offset: u64, length: u64) -> DeviceError {
        DeviceError::new(
            DeviceErrorKind::Io(std::io::Error::other(self)),
            device,
            offset,
            length,
        )
    }

    /// Whether a conditional PUT was refused: the object exists (`Create`)
    /// or is no longer the version given (`Update`).
    pub fn is_condition_failed(&self) -> bool {
        matches!(
            self,
            Self::Request {
                source: object_store::Error::Precondition { .. }
                    | object_store::Error::AlreadyExists { .. },
                ..
            }
        )
    }

    /// Whether a request failed because the object is not there.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Self::Request {
                source: object_store::Error::NotFound { .. },
                ..
            }
        )
    }
}
