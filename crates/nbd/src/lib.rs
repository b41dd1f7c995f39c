//! The NBD layer: serves block exports to hosts over the NBD protocol (the NBD
//! project's `doc/proto.md`): fixed-newstyle handshake, options, structured
//! replies, `base:allocation` block status, and transmission with many requests in
//! flight per connection. It knows nothing of lamina's engine: anything that
//! implements [`Export`] and [`ExportCatalog`] can be served.

mod backend;

pub use backend::{Export, ExportCatalog, ExportError, ExportSummary, Extent};
