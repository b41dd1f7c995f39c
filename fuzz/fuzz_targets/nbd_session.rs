//! Fuzzes a whole connection: the input is everything a client sends, fed to
//! `serve_connection` over an in-memory stream against a small memory export.
//! Whatever the bytes, the server must neither panic nor hang.

#![no_main]

use std::sync::Arc;
use std::time::Duration;

use lamina_nbd::memory::{MemoryCatalog, MemoryExport};
use lamina_nbd::{ServerConfig, serve_connection};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let catalog = Arc::new(MemoryCatalog::new());
        catalog.insert("", "default", Arc::new(MemoryExport::new(1 << 20)));
        catalog.insert("ro", "", Arc::new(MemoryExport::new(1 << 16).with_read_only(true)));
        let config = ServerConfig {
            max_request_bytes: 1 << 16,
            in_flight_bytes_max: 1 << 18,
            ..ServerConfig::default()
        };
        let (client, server_side) = tokio::io::duplex(1 << 16);
        let server = tokio::spawn(async move { serve_connection(server_side, catalog, &config).await });
        let input = data.to_vec();
        let session = async move {
            let (mut reader, mut writer) = tokio::io::split(client);
            let drain = tokio::spawn(async move {
                let mut sink = vec![0u8; 1 << 16];
                while let Ok(count) = reader.read(&mut sink).await {
                    if count == 0 {
                        break;
                    }
                }
            });
            let _ = writer.write_all(&input).await;
            let _ = writer.shutdown().await;
            let _ = drain.await;
        };
        tokio::time::timeout(Duration::from_secs(10), session)
            .await
            .expect("the server finished the session");
        let result = tokio::time::timeout(Duration::from_secs(10), server)
            .await
            .expect("the server returned");
        assert!(result.is_ok(), "the connection task did not panic");
    });
});
