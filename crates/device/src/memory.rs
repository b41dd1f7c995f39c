//! A device held in memory: the fastest way to run the engine in tests, and the
//! backing store the fault-injecting device usually wraps. Flush is a no-op because
//! memory has no volatile cache of its own; power cuts are simulated one level up,
//! by [`crate::FaultyDevice`].

use std::sync::{Arc, Mutex};

use crate::{AlignedBuffer, BlockDevice, DeviceError, check_request};

/// A zero-filled byte array of fixed size.
pub struct MemoryDevice {
    name: String,
    bytes: Mutex<Vec<u8>>,
    size_bytes: u64,
}

impl MemoryDevice {
    pub fn new(size_bytes: u64) -> Self {
        assert!(size_bytes.is_multiple_of(crate::DEVICE_ALIGNMENT_BYTES));
        Self {
            name: "memory".to_string(),
            bytes: Mutex::new(vec![
                0;
                usize::try_from(size_bytes).expect(
                    "a memory device's size fits in the address space"
                )
            ]),
            size_bytes,
        }
    }

    /// A copy of the whole contents, for tests that inspect or clone a device.
    pub fn snapshot(&self) -> Vec<u8> {
        self.bytes.lock().expect("memory device lock").clone()
    }

    /// A device holding exactly `bytes`.
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        let size_bytes = bytes.len() as u64;
        assert!(size_bytes.is_multiple_of(crate::DEVICE_ALIGNMENT_BYTES));
        Self {
            name: "memory".to_string(),
            bytes: Mutex::new(bytes),
            size_bytes,
        }
    }

    /// Synchronous access used by the fault-injecting wrapper and by tests.
    pub fn read_sync(&self, offset: u64, destination: &mut [u8]) {
        let bytes = self.bytes.lock().expect("memory device lock");
        let start = crate::buffer_length(offset);
        destination.copy_from_slice(&bytes[start..start + destination.len()]);
    }

    pub fn write_sync(&self, offset: u64, source: &[u8]) {
        let mut bytes = self.bytes.lock().expect("memory device lock");
        let start = crate::buffer_length(offset);
        bytes[start..start + source.len()].copy_from_slice(source);
    }
}

#[async_trait::async_trait]
impl BlockDevice for MemoryDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset: u64, length: usize) -> crate::DeviceReadFuture<'_> {
        crate::DeviceReadFuture::from(async move {
            check_request(&self.name, self.size_bytes, offset, length as u64)?;
            let mut buffer = AlignedBuffer::zeroed(length);
            self.read_sync(offset, &mut buffer);
            Ok(buffer)
        })
    }

    async fn write(&self, offset: u64, data: Arc<AlignedBuffer>) -> Result<(), DeviceError> {
        check_request(&self.name, self.size_bytes, offset, data.len() as u64)?;
        self.write_sync(offset, &data);
        Ok(())
    }

    async fn flush(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_back_what_was_written_and_rejects_out_of_range() {
        let device = MemoryDevice::new(16384);
        let data = Arc::new(AlignedBuffer::from_slice_padded(b"hello"));
        device.write(4096, data).await.unwrap();
        let read = device.read(4096, 4096).await.unwrap();
        assert_eq!(&read[..5], b"hello");
        assert!(device.read(16384, 4096).await.is_err());
    }
}
