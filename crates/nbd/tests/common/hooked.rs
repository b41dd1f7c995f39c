//! A memory export with a hook run before each read: tests use it to slow
//! reads down, count how many run at once, or make a handler panic, while
//! every other request goes straight to the memory export.

use lamina_nbd::memory::MemoryExport;
use lamina_nbd::{Export, ExportError, ExportFuture, Extent};

/// What runs before a read of a [`HookedExport`] reaches its memory export.
#[async_trait::async_trait]
pub trait ReadHook: Send + Sync {
    async fn before_read(&self, offset: u64);
}

/// A memory export whose reads first run `hook`.
pub struct HookedExport<H> {
    pub inner: MemoryExport,
    pub hook: H,
}

#[async_trait::async_trait]
impl<H: ReadHook + 'static> Export for HookedExport<H> {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn read<'a>(&'a self, offset: u64, buffer: &'a mut [u8]) -> ExportFuture<'a> {
        // Holds the memory export's own read future: too big to fit beside
        // the hook in place, so it is boxed (tests only).
        ExportFuture::from_or_box(async move {
            self.hook.before_read(offset).await;
            self.inner.read(offset, buffer).await
        })
    }
    async fn extents(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        self.inner.extents(offset, length).await
    }
    fn write<'a>(&'a self, offset: u64, data: &'a [u8], fua: bool) -> ExportFuture<'a> {
        self.inner.write(offset, data, fua)
    }
    async fn flush(&self) -> Result<(), ExportError> {
        self.inner.flush().await
    }
    async fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError> {
        self.inner.trim(offset, length, fua).await
    }
    async fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
        may_punch_hole: bool,
        fast_only: bool,
    ) -> Result<(), ExportError> {
        self.inner
            .write_zeroes(offset, length, fua, may_punch_hole, fast_only)
            .await
    }
    async fn cache(&self, offset: u64, length: u64) -> Result<(), ExportError> {
        self.inner.cache(offset, length).await
    }
}
