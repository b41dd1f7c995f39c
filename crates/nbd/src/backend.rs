//! The interface between the protocol and the storage behind it. The daemon
//! implements it for lamina volumes and snapshots; tests implement it in memory.

use std::sync::Arc;

use stackfuture::StackFuture;

use crate::statistics::ExportStatistics;

/// Bytes a backend's read or write future may take. Those futures are held
/// in place in the request's future, which lives in a reused slot of its
/// connection, so a read or write allocates nothing for them (decision 0044);
/// a backend whose future is larger fails to compile (`StackFuture::from`)
/// or, through `StackFuture::from_or_box`, boxes it. lamina's volume export
/// needs about 1.9 KiB for a write and 1.5 KiB for a read (2026-11-29); the
/// rest is room for the engine's futures to grow.
pub const EXPORT_FUTURE_BYTES: usize = 3072;

/// The future of a backend's read or write.
pub type ExportFuture<'a> = StackFuture<'a, Result<(), ExportError>, EXPORT_FUTURE_BYTES>;

/// Errors a backend reports; each maps to one NBD error code.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// The medium failed, or a checksum did not match (NBD_EIO).
    #[error("I/O error: {0}")]
    Io(String),
    /// No space left to place the write (NBD_ENOSPC).
    #[error("no space left")]
    NoSpace,
    /// The export is read-only (NBD_EPERM).
    #[error("export is read-only")]
    ReadOnly,
    /// The request is outside the export or otherwise invalid (NBD_EINVAL).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The backend cannot do this quickly (NBD_ENOTSUP, used for FAST_ZERO).
    #[error("not supported")]
    NotSupported,
    /// The export went away (deleted while connected) (NBD_ESHUTDOWN).
    #[error("export is shutting down")]
    Shutdown,
}

/// One run of a block-status answer: `length` bytes that are all holes (never
/// written or trimmed, reading as zeros) or all allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    /// NBD_STATE_HOLE: not allocated.
    pub hole: bool,
    /// NBD_STATE_ZERO: reads as zeros.
    pub zero: bool,
}

/// What `NBD_OPT_LIST` and `NBD_INFO_DESCRIPTION` report about an export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportSummary {
    pub name: String,
    pub description: String,
}

/// One exported block device. Offsets and lengths are in bytes and arbitrary (not
/// necessarily aligned); the protocol layer has already checked them against
/// `size_bytes()` and the advertised maximum request size.
#[async_trait::async_trait]
pub trait Export: Send + Sync + 'static {
    /// Current size in bytes (read at handshake time).
    fn size_bytes(&self) -> u64;

    /// Writes, trims and write-zeroes are refused with EPERM when true.
    fn read_only(&self) -> bool;

    /// Fills `buffer` with the bytes at `offset`.
    fn read<'a>(&'a self, offset: u64, buffer: &'a mut [u8]) -> ExportFuture<'a>;

    /// Allocation status of `length` bytes at `offset`: extents in order whose
    /// lengths sum to at most `length` (at least one extent when `length > 0`).
    async fn extents(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError>;

    /// The allocation status [`Export::extents`] gives, handed to `visit`
    /// extent by extent, for an export that knows it without waiting or
    /// allocating; `None` (the default) sends the caller to `extents`. Every
    /// structured read asks it, to find the holes it sends as hole chunks.
    fn visit_extents(
        &self,
        _offset: u64,
        _length: u64,
        _visit: &mut dyn FnMut(Extent),
    ) -> Option<Result<(), ExportError>> {
        None
    }

    /// Reads like [`Export::read`] and, once the read succeeded, hands
    /// `visit` the allocation status of the bytes read, extent by extent, as
    /// [`Export::visit_extents`] would: for an export whose read finds the
    /// status anyway, so that a structured read, which sends holes as hole
    /// chunks, walks the export's map once instead of twice. `None` (the
    /// default) sends the caller to `visit_extents` and `read`.
    fn read_visiting_extents<'a>(
        &'a self,
        _offset: u64,
        _buffer: &'a mut [u8],
        _visit: &'a mut (dyn FnMut(Extent) + Send),
    ) -> Option<ExportFuture<'a>> {
        None
    }

    /// Writes `data` at `offset`; with `fua` the write is durable when this returns.
    fn write<'a>(&'a self, offset: u64, data: &'a [u8], fua: bool) -> ExportFuture<'a>;

    /// Writes `data` at `offset` (without FUA) at once when the export can
    /// without waiting, as [`Export::write`] would; `None` (the default)
    /// when it cannot, having written nothing the caller relies on, and the
    /// caller then runs [`Export::write`]. An export whose common write
    /// needs no waiting answers it here, which spares the server a request
    /// future per write (and the moves of its [`ExportFuture`]).
    fn write_without_waiting(&self, _offset: u64, _data: &[u8]) -> Option<Result<(), ExportError>> {
        None
    }

    /// Makes every write completed before this call, on any connection, durable.
    async fn flush(&self) -> Result<(), ExportError>;

    /// Discards `length` bytes at `offset` (they then read as zeros).
    async fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError>;

    /// Makes `length` bytes at `offset` read as zeros. `may_punch_hole` is false when
    /// the client sent NBD_CMD_FLAG_NO_HOLE; `fast_only` is NBD_CMD_FLAG_FAST_ZERO.
    async fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
        may_punch_hole: bool,
        fast_only: bool,
    ) -> Result<(), ExportError>;

    /// A hint to prefetch `length` bytes at `offset` (NBD_CMD_CACHE).
    async fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError>;

    /// Where the server counts this export's reads and writes and their
    /// latencies; none (the default): not counted.
    fn statistics(&self) -> Option<Arc<ExportStatistics>> {
        None
    }
}

/// The set of exports a server offers, looked up by name at handshake time.
pub trait ExportCatalog: Send + Sync + 'static {
    /// Every export, for NBD_OPT_LIST.
    fn list(&self) -> Vec<ExportSummary>;

    /// The export called `name`; the empty name means the default export.
    fn open(&self, name: &str) -> Option<(ExportSummary, Arc<dyn Export>)>;
}
