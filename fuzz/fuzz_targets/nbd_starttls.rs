//! Fuzzes the STARTTLS path: a client greets, sends `NBD_OPT_STARTTLS` to a
//! listener that requires TLS, and then the input is everything it sends
//! after the ACK (a TLS handshake, or garbage, or a cut one), fed to
//! `serve_connection_with` over an in-memory stream. The first input byte
//! chooses whether options are sent in clear first (they must get
//! `NBD_REP_ERR_TLS_REQD`). Whatever the bytes, the server must neither panic
//! nor hang. `fuzz/tls/` holds a throwaway self-signed certificate and key,
//! for this target only.

#![no_main]

use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lamina_nbd::memory::{MemoryCatalog, MemoryExport};
use lamina_nbd::wire::{
    CLIENT_FLAG_FIXED_NEWSTYLE, CLIENT_FLAG_NO_ZEROES, IHAVEOPT_MAGIC, OPT_LIST, OPT_STARTTLS,
};
use lamina_nbd::{ClientIdentity, ServerConfig, ServerTls, TlsMode, serve_connection_with};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn server_tls() -> Arc<ServerTls> {
    static TLS: OnceLock<Arc<ServerTls>> = OnceLock::new();
    TLS.get_or_init(|| {
        let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("tls");
        Arc::new(ServerTls::load(&directory, TlsMode::Require, false).expect("fuzz/tls loads"))
    })
    .clone()
}

fn option(code: u32) -> Vec<u8> {
    let mut bytes = IHAVEOPT_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&code.to_be_bytes());
    bytes.extend_from_slice(&0u32.to_be_bytes());
    bytes
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, after_ack)) = data.split_first() else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let catalog = Arc::new(MemoryCatalog::new());
        catalog.insert("", "default", Arc::new(MemoryExport::new(1 << 20)));
        let config = ServerConfig {
            handshake_timeout_ms: 2_000,
            ..ServerConfig::default()
        };
        let (client, server_side) = tokio::io::duplex(1 << 16);
        let tls = Some(server_tls());
        let server = tokio::spawn(async move {
            serve_connection_with(
                server_side,
                catalog,
                &config,
                tls,
                None,
                ClientIdentity::default(),
                lamina_nbd::CancellationToken::new(),
            )
            .await
        });
        let mut input = (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES)
            .to_be_bytes()
            .to_vec();
        for _ in 0..(choice % 4) {
            input.extend_from_slice(&option(OPT_LIST));
        }
        input.extend_from_slice(&option(OPT_STARTTLS));
        input.extend_from_slice(after_ack);
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
