//! In-process benchmarks that measure against fio, and so need this harness's fio
//! runner: the engine's `Pool` (`engine`) and the file device alone (`device-iops`),
//! driven from this process on a real file (FileDevice: io_uring, O_DIRECT), with no
//! NBD or process start in the measured path. [`common`] holds what they share
//! (runtimes, pools on files, concurrent fills, memory readings). The in-process
//! benchmarks that need no harness are examples of the crates they measure
//! (decision 0060).

pub mod common;
pub mod device_iops;
pub mod iops_recovery_memory;
