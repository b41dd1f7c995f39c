//! Serves sparse in-memory exports over a Unix socket until Ctrl-C, for trying
//! NBD clients by hand: `cargo run -p lamina-nbd --example memory_server -- SOCKET [NAME=SIZE_MIB ...]`.

use std::sync::Arc;

use lamina_nbd::memory::{MemoryCatalog, MemoryExport};
use lamina_nbd::{CancellationToken, NbdServer, ServerConfig};

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut arguments = std::env::args().skip(1);
    let socket = arguments
        .next()
        .expect("usage: memory_server SOCKET [NAME=SIZE_MIB ...]");
    let catalog = Arc::new(MemoryCatalog::new());
    let mut any = false;
    for argument in arguments {
        let (name, size) = argument.split_once('=').expect("export as NAME=SIZE_MIB");
        let size_mib: u64 = size.parse().expect("size in MiB");
        catalog.insert(name, "", Arc::new(MemoryExport::new(size_mib << 20)));
        any = true;
    }
    if !any {
        catalog.insert("disk", "", Arc::new(MemoryExport::new(64 << 20)));
    }
    let _ = std::fs::remove_file(&socket);
    let listener = tokio::net::UnixListener::bind(&socket).expect("bind socket");
    let server = NbdServer::new(catalog, ServerConfig::default()).expect("config");
    let shutdown = CancellationToken::new();
    let signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        signal.cancel();
    });
    server.serve_unix(listener, shutdown).await;
}
