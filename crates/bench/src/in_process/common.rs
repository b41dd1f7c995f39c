//! What the in-process benchmarks share: their tokio runtime, pools on files, the
//! concurrent and sequential fills that put data in a volume before a measurement
//! (one file with the engine's benchmark examples, included by path), and the
//! process's resident memory.

#[path = "../../../engine/examples/support/pool_files.rs"]
mod pool_files;

pub use pool_files::{
    FILL_WRITE_BYTES, core_count, create_pool, fill_sequentially, open_file_device, runtime,
    write_blocks,
};

/// The resident memory of this process (VmRSS), in bytes.
pub fn resident_bytes() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kibibytes = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|field| field.parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("/proc/self/status has no VmRSS line"))?;
    Ok(kibibytes * 1024)
}
