//! Engine volumes as NBD exports: the adapter between the protocol layer's
//! `Export`/`ExportCatalog` traits and the pool, including the mapping from engine
//! errors to NBD error codes.

use std::sync::Arc;

use lamina_engine::{EngineError, Pool};
use lamina_nbd::{Export, ExportCatalog, ExportError, ExportSummary, Extent};

/// The name served to clients that ask for the default (empty) export name.
pub const DEFAULT_EXPORT_NAME: &str = "default";

fn to_export_error(error: EngineError) -> ExportError {
    match error {
        EngineError::NoSpace => ExportError::NoSpace,
        EngineError::OutOfRange { .. } | EngineError::InvalidSize { .. } => {
            ExportError::Invalid(error.to_string())
        }
        EngineError::NoSuchVolume(_) => ExportError::Shutdown,
        other => ExportError::Io(other.to_string()),
    }
}

/// Every volume of a pool, one export each, named after it.
pub struct PoolCatalog {
    pub pool: Pool,
}

impl ExportCatalog for PoolCatalog {
    fn list(&self) -> Vec<ExportSummary> {
        self.pool
            .list_volumes()
            .into_iter()
            .map(|volume| ExportSummary {
                description: format!("lamina volume {}", volume.name),
                name: volume.name,
            })
            .collect()
    }

    fn open(&self, name: &str) -> Option<(ExportSummary, Arc<dyn Export>)> {
        let name = if name.is_empty() {
            DEFAULT_EXPORT_NAME
        } else {
            name
        };
        let volume_id = self.pool.volume_id(name).ok()?;
        let summary = ExportSummary {
            name: name.to_string(),
            description: format!("lamina volume {name}"),
        };
        Some((
            summary,
            Arc::new(VolumeExport {
                pool: self.pool.clone(),
                volume_id,
            }),
        ))
    }
}

/// One volume served over NBD.
pub struct VolumeExport {
    pool: Pool,
    volume_id: u32,
}

#[async_trait::async_trait]
impl Export for VolumeExport {
    fn size_bytes(&self) -> u64 {
        self.pool.volume_size_bytes(self.volume_id).unwrap_or(0)
    }

    fn read_only(&self) -> bool {
        false
    }

    async fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), ExportError> {
        self.pool
            .read(self.volume_id, offset, buffer)
            .await
            .map_err(to_export_error)
    }

    async fn extents(&self, offset: u64, length: u64) -> Result<Vec<Extent>, ExportError> {
        Ok(self
            .pool
            .extents(self.volume_id, offset, length)
            .map_err(to_export_error)?
            .into_iter()
            .map(|extent| Extent {
                length: extent.length,
                hole: !extent.allocated,
                zero: !extent.allocated,
            })
            .collect())
    }

    async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.pool
            .write(self.volume_id, offset, data, fua)
            .await
            .map_err(to_export_error)
    }

    async fn flush(&self) -> Result<(), ExportError> {
        self.pool.flush().await.map_err(to_export_error)
    }

    async fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), ExportError> {
        self.pool
            .trim(self.volume_id, offset, length, fua)
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
            .write_zeroes(self.volume_id, offset, length, fua, may_punch_hole)
            .await
            .map_err(to_export_error)
    }

    async fn cache(&self, _offset: u64, _length: u64) -> Result<(), ExportError> {
        // Everything is on flash already; there is no slower tier to prefetch from yet.
        Ok(())
    }
}
