//! In-process benchmarks of the storage engine and the device layer: the engine's
//! `Pool` driven from this process on a real file (FileDevice: io_uring, O_DIRECT) or
//! on a memory device, with no NBD or process start in the measured path. Each
//! subcommand is one module; [`common`] holds what they share (runtimes, pools on
//! files, concurrent fills, memory readings).

pub mod array_write_cost;
pub mod cleaner_latency;
pub mod common;
pub mod counting_device;
pub mod device_iops;
pub mod iops_recovery_memory;
pub mod write_amplification;
