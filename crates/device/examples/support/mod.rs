//! What the device's benchmark example shares with itself and, for fio, with the
//! engine's: fio's io_uring engine on a local file as the peer a measurement is
//! compared with ([`fio_file`], which lamina-engine's `iops_recovery_memory` example
//! includes by path, as an example cannot use another crate's example modules), the
//! runtime the measurement runs on, the median of its runs and how its report is
//! printed.

pub mod fio_file;
mod measurement;

pub use measurement::{median, print_report, runtime};
