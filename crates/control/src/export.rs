//! Engine volumes as NBD exports: the adapter between the protocol layer's
//! `Export`/`ExportCatalog` traits and the pool, including the mapping from engine
//! errors to NBD error codes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use lamina_engine::{EngineError, IoError, Pool, ReadExtents, View, VolumeError};
use lamina_nbd::{
    Export, ExportCatalog, ExportError, ExportFuture, ExportStatistics, ExportSummary, Extent,
};

use crate::volume_statistics::VolumeStatistics;

/// The name served to clients that ask for the default (empty) export name.
pub const DEFAULT_EXPORT_NAME: &str = "default";

/// An engine extent as NBD's allocation status: what is not allocated is a
/// hole and reads as zeros.
fn nbd_extent(extent: lamina_engine::Extent) -> Extent {
    Extent {
        length: extent.length,
        hole: !extent.allocated,
        zero: !extent.allocated,
    }
}

fn to_export_error(error: EngineError) -> ExportError {
    match error {
        EngineError::Io(IoError::NoSpace | IoError::DeviceFull { .. }) => ExportError::NoSpace,
        EngineError::Io(IoError::OutOfRange { .. })
        | EngineError::Volume(VolumeError::InvalidSize { .. }) => {
            ExportError::Invalid(error.to_string())
        }
        EngineError::Volume(VolumeError::NoSuchVolume(_) | VolumeError::NoSuchSnapshot { .. }) => {
            ExportError::Shutdown
        }
        EngineError::Volume(VolumeError::ReadOnly(_)) => ExportError::ReadOnly,
        other => ExportError::Io(other.to_string()),
    }
}

/// How many NBD connections have each volume open, so that operations that
/// replace a volume's contents under its clients (rollback) can refuse while
/// any are connected.
#[derive(Clone, Default)]
pub struct OpenExports {
    counts: Arc<Mutex<BTreeMap<u32, usize>>>,
}

impl OpenExports {
    pub fn count(&self, volume_id: u32) -> usize {
        self.counts
            .lock()
            .expect("open export counts")
            .get(&volume_id)
            .copied()
            .unwrap_or(0)
    }

    fn open(&self, volume_id: u32) -> OpenGuard {
        *self
            .counts
            .lock()
            .expect("open export counts")
            .entry(volume_id)
            .or_default() += 1;
        OpenGuard {
            exports: self.clone(),
            volume_id,
        }
    }
}

/// One open connection to a volume; counted until dropped.
struct OpenGuard {
    exports: OpenExports,
    volume_id: u32,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let mut counts = self.exports.counts.lock().expect("open export counts");
        if let Some(count) = counts.get_mut(&self.volume_id) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.volume_id);
            }
        }
    }
}

/// Every volume of a pool, one export each, named after it, and every snapshot,
/// read-only, named `VOL@SNAP`.
pub struct PoolCatalog {
    pub pool: Pool,
    pub open_exports: OpenExports,
    /// Where each volume's reads and writes are counted (snapshots are not).
    pub statistics: Option<Arc<VolumeStatistics>>,
}

impl ExportCatalog for PoolCatalog {
    fn list(&self) -> Vec<ExportSummary> {
        let volumes = self
            .pool
            .list_volumes()
            .into_iter()
            .map(|volume| ExportSummary {
                description: format!("lamina volume {}", volume.name),
                name: volume.name,
            });
        let snapshots = self
            .pool
            .snapshot_full_names()
            .into_iter()
            .map(|full_name| ExportSummary {
                description: format!("lamina snapshot {full_name} (read-only)"),
                name: full_name,
            });
        volumes.chain(snapshots).collect()
    }

    fn open(&self, name: &str) -> Option<(ExportSummary, Arc<dyn Export>)> {
        let name = if name.is_empty() {
            DEFAULT_EXPORT_NAME
        } else {
            name
        };
        let view = self.pool.resolve_view(name).ok()?;
        let (description, guard, statistics) = match view {
            View::Volume(volume_id) => (
                format!("lamina volume {name}"),
                Some(self.open_exports.open(volume_id)),
                self.statistics
                    .as_ref()
                    .map(|statistics| statistics.for_volume(volume_id)),
            ),
            View::Snapshot { .. } => (format!("lamina snapshot {name} (read-only)"), None, None),
        };
        let summary = ExportSummary {
            name: name.to_string(),
            description,
        };
        Some((
            summary,
            Arc::new(VolumeExport {
                pool: self.pool.clone(),
                view,
                _guard: guard,
                statistics,
            }),
        ))
    }
}

/// One volume or snapshot served over NBD.
pub struct VolumeExport {
    pool: Pool,
    view: View,
    _guard: Option<OpenGuard>,
    statistics: Option<Arc<ExportStatistics>>,
}

impl VolumeExport {
    /// The volume writes go to; snapshots refuse them.
    fn writable_volume(&self) -> Result<u32, ExportError> {
        match self.view {
            View::Volume(volume_id) => Ok(volume_id),
            View::Snapshot { .. } => Err(ExportError::ReadOnly),
        }
    }
}

#[async_trait::async_trait]
impl Export for VolumeExport {
    fn size_bytes(&self) -> u64 {
        self.pool.view_size_bytes(self.view).unwrap_or(0)
    }

    fn read_only(&self) -> bool {
        matches!(self.view, View::Snapshot { .. })
    }

    fn read<'a>(&'a self, offset: u64, buffer: &'a mut [u8]) -> ExportFuture<'a> {
        ExportFuture::from(async move {
            self.pool
                .read_view(self.view, offset, buffer)
                .await
                .map_err(to_export_error)
        })
    }

    fn read_visiting_extents<'a>(
        &'a self,
        offset: u64,
        buffer: &'a mut [u8],
        visit: &'a mut (dyn FnMut(Extent) + Send),
    ) -> Option<ExportFuture<'a>> {
        Some(ExportFuture::from(async move {
            let mut extents = ReadExtents::new();
            self.pool
                .read_view_with_extents(self.view, offset, buffer, &mut extents)
                .await
                .map_err(to_export_error)?;
            extents
                .into_iter()
                .for_each(|extent| visit(nbd_extent(extent)));
            Ok(())
        }))
    }

    async fn extents(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        Ok(self
            .pool
            .extents_view(self.view, offset, length)
            .map_err(to_export_error)?
            .into_iter()
            .map(nbd_extent)
            .collect())
    }

    fn visit_extents(
        &self,
        offset: u64,
        length: u64,
        visit: &mut dyn FnMut(Extent),
    ) -> Option<Result<(), ExportError>> {
        let visited = self
            .pool
            .visit_extents_view(self.view, offset, length, |extent| {
                visit(nbd_extent(extent));
            })
            .map_err(to_export_error);
        Some(visited)
    }

    fn write<'a>(&'a self, offset: u64, data: &'a [u8], fua: bool) -> ExportFuture<'a> {
        ExportFuture::from(async move {
            self.pool
                .write(self.writable_volume()?, offset, data, fua)
                .await
                .map_err(to_export_error)
        })
    }

    fn write_without_waiting(&self, offset: u64, data: &[u8]) -> Option<Result<(), ExportError>> {
        let volume_id = match self.writable_volume() {
            Ok(volume_id) => volume_id,
            Err(error) => return Some(Err(error)),
        };
        self.pool
            .write_without_waiting(volume_id, offset, data)
            .map(|result| result.map_err(to_export_error))
    }

    async fn flush(&self) -> Result<(), ExportError> {
        self.pool.flush().await.map_err(to_export_error)?;
        // A flush confirms this client's earlier writes; if the volume (or
        // snapshot) was deleted before or while it ran, those writes are gone,
        // so success would be a lie. Identifiers are never reused, so a volume
        // created since under the same name does not count. Checked after the
        // pool flush so that a deletion during it is seen too.
        if self.pool.view_size_bytes(self.view).is_none() {
            return Err(ExportError::Shutdown);
        }
        Ok(())
    }

    async fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError> {
        self.pool
            .trim(self.writable_volume()?, offset, length, fua)
            .await
            .map_err(to_export_error)
    }

    async fn write_zeroes(
        &self,
        offset: u64,
        length: u64,
        fua: bool,
        may_punch_hole: bool,
        fast_only: bool,
    ) -> Result<(), ExportError> {
        if fast_only && !may_punch_hole {
            // Writing real zero blocks is no faster than the client writing them.
            return Err(ExportError::NotSupported);
        }
        self.pool
            .write_zeroes(self.writable_volume()?, offset, length, fua, may_punch_hole)
            .await
            .map_err(to_export_error)
    }

    async fn cache(&self, _offset: u64, _length: u64) -> Result<(), ExportError> {
        // Everything is on flash already; there is no slower tier to prefetch from yet.
        Ok(())
    }

    fn statistics(&self) -> Option<Arc<ExportStatistics>> {
        self.statistics.clone()
    }
}
