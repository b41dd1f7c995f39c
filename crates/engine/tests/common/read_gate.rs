//! Reads held at a gate: an [`InstrumentedDevice`](super::InstrumentedDevice)
//! with a read gate makes device reads wait while the gate is closed, so
//! that a test can let a read look its blocks up and then change what they
//! hold (overwrite them, reuse their segment) before the read reaches the
//! device.

use lamina_engine::{BLOCK_SIZE_BYTES, EngineError, Pool};

/// The task of a held read: its result and the bytes it read.
pub type HeldRead = tokio::task::JoinHandle<(Result<(), EngineError>, Vec<u8>)>;

/// Closes `gate` and starts a read of blocks `0..count` of `volume`, which
/// looks its blocks up and then waits at the gate for its device reads.
pub async fn start_held_read(
    pool: &Pool,
    gate: &tokio::sync::watch::Sender<bool>,
    volume: u32,
    count: u64,
) -> HeldRead {
    gate.send(false).unwrap();
    let pool = pool.clone();
    let reader = tokio::spawn(async move {
        let length = usize::try_from(count * BLOCK_SIZE_BYTES).expect("a test read fits memory");
        let mut buffer = vec![0u8; length];
        let result = pool.read(volume, 0, &mut buffer).await;
        (result, buffer)
    });
    // Long enough for the read to look its blocks up and reach the gate.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    reader
}
