//! Shared helpers for the integration tests: an in-process server on a temporary
//! Unix socket (or TCP port 0) serving memory exports, and helpers to find and run
//! the real NBD clients as subprocesses.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
#![allow(dead_code)]

pub mod certificates;
pub mod hooked;
pub mod raw;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use lamina_nbd::memory::{MemoryCatalog, MemoryExport};
use lamina_nbd::{
    AccessPolicy, CancellationToken, ConnectionThreads, NbdServer, ServerConfig, ServerTls,
};
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinHandle;

/// Longest time any one client subprocess may run before the test fails.
pub const CLIENT_TIMEOUT_MS: u64 = 60_000;

pub struct TestServer {
    pub directory: tempfile::TempDir,
    pub socket: PathBuf,
    pub tcp_port: Option<u16>,
    pub server: Arc<NbdServer>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

/// What a test server offers besides its exports: TLS on its listener and an
/// access policy.
#[derive(Default, Clone)]
pub struct Security {
    pub tls: Option<Arc<ServerTls>>,
    pub access: Option<Arc<dyn AccessPolicy>>,
    /// Serve connections on these threads instead of the test's runtime.
    pub threads: Option<Arc<ConnectionThreads>>,
}

impl TestServer {
    /// Serves `catalog` on a fresh Unix socket in a temporary directory.
    pub async fn unix(catalog: Arc<MemoryCatalog>, config: ServerConfig) -> Self {
        Self::unix_with(catalog, config, Security::default()).await
    }

    /// Like [`TestServer::unix`], with TLS and an access policy.
    pub async fn unix_with(
        catalog: Arc<MemoryCatalog>,
        config: ServerConfig,
        security: Security,
    ) -> Self {
        let directory = tempfile::tempdir().expect("temporary directory");
        let socket = directory.path().join("nbd.sock");
        let listener = UnixListener::bind(&socket).expect("bind unix socket");
        let server = Arc::new(server_with(
            catalog,
            config,
            security.access,
            security.threads,
        ));
        let shutdown = CancellationToken::new();
        let task = {
            let server = Arc::clone(&server);
            let shutdown = shutdown.clone();
            let tls = security.tls;
            tokio::spawn(async move { server.serve_unix_with_tls(listener, tls, shutdown).await })
        };
        TestServer {
            directory,
            socket,
            tcp_port: None,
            server,
            shutdown,
            task,
        }
    }

    /// Serves `catalog` on 127.0.0.1 with a port chosen by the kernel.
    pub async fn tcp(catalog: Arc<MemoryCatalog>, config: ServerConfig) -> Self {
        Self::tcp_with(catalog, config, Security::default()).await
    }

    /// Like [`TestServer::tcp`], with TLS and an access policy.
    pub async fn tcp_with(
        catalog: Arc<MemoryCatalog>,
        config: ServerConfig,
        security: Security,
    ) -> Self {
        let directory = tempfile::tempdir().expect("temporary directory");
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind tcp");
        let port = listener.local_addr().expect("local address").port();
        let server = Arc::new(server_with(
            catalog,
            config,
            security.access,
            security.threads,
        ));
        let shutdown = CancellationToken::new();
        let task = {
            let server = Arc::clone(&server);
            let shutdown = shutdown.clone();
            let tls = security.tls;
            tokio::spawn(async move { server.serve_tcp_with_tls(listener, tls, shutdown).await })
        };
        TestServer {
            socket: directory.path().join("unused.sock"),
            directory,
            tcp_port: Some(port),
            server,
            shutdown,
            task,
        }
    }

    /// The TLS URI of export `name` (`nbds://localhost:PORT/NAME` or
    /// `nbds+unix`) for a client whose certificates are in `certificates`.
    pub fn tls_uri(&self, name: &str, certificates: &Path) -> String {
        match self.tcp_port {
            Some(port) => format!(
                "nbds://localhost:{port}/{name}?tls-certificates={}",
                certificates.display()
            ),
            None => format!(
                "nbds+unix:///{name}?socket={}&tls-certificates={}",
                self.socket.display(),
                certificates.display()
            ),
        }
    }

    /// The NBD URI of export `name` on this server.
    pub fn uri(&self, name: &str) -> String {
        match self.tcp_port {
            Some(port) => format!("nbd://127.0.0.1:{port}/{name}"),
            None => format!("nbd+unix:///{name}?socket={}", self.socket.display()),
        }
    }

    /// Requests shutdown and waits (bounded) for the server to return.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.task)
            .await
            .expect("server stops within 20 s")
            .expect("server task did not panic");
    }
}

fn server_with(
    catalog: Arc<MemoryCatalog>,
    config: ServerConfig,
    access: Option<Arc<dyn AccessPolicy>>,
    threads: Option<Arc<ConnectionThreads>>,
) -> NbdServer {
    let mut server = NbdServer::new(catalog, config).expect("valid config");
    if let Some(policy) = access {
        server = server.with_access_policy(policy);
    }
    if let Some(threads) = threads {
        server = server.with_connection_threads(threads);
    }
    server
}

/// A catalog with one writable sparse export per `(name, size_bytes)`.
pub fn catalog_with(exports: &[(&str, u64)]) -> (Arc<MemoryCatalog>, Vec<Arc<MemoryExport>>) {
    let catalog = Arc::new(MemoryCatalog::new());
    let mut handles = Vec::new();
    for &(name, size_bytes) in exports {
        let export = Arc::new(MemoryExport::new(size_bytes));
        catalog.insert(name, &format!("test export {name}"), export.clone());
        handles.push(export);
    }
    (catalog, handles)
}

/// The path of `program` on PATH, or None after printing why the test is skipped.
pub fn tool(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for directory in std::env::split_paths(&path) {
        let candidate = directory.join(program);
        if candidate.is_file() {
            return Some(candidate);
        }
    }
    println!("SKIPPED: {program} is not installed (install it to run this test)");
    None
}

/// A python3 that can `import nbd` (python3-libnbd installs it for the system
/// python, which may not be the first python3 on PATH).
pub fn python_with_nbd() -> Option<PathBuf> {
    let mut candidates = vec![PathBuf::from("/usr/bin/python3")];
    if let Some(found) = tool("python3") {
        candidates.push(found);
    }
    for candidate in candidates {
        let works = std::process::Command::new(&candidate)
            .args(["-c", "import nbd"])
            .output()
            .map(|output| output.status.success())
            .unwrap_or(false);
        if works {
            return Some(candidate);
        }
    }
    println!("SKIPPED: no python3 with the nbd module (install python3-libnbd)");
    None
}

/// Runs a prepared command with a timeout and returns its output (not checked).
pub async fn run(command: &mut tokio::process::Command) -> Output {
    command.kill_on_drop(true);
    let description = format!("{command:?}");
    tokio::time::timeout(Duration::from_millis(CLIENT_TIMEOUT_MS), command.output())
        .await
        .unwrap_or_else(|_| panic!("{description} did not finish in {CLIENT_TIMEOUT_MS} ms"))
        .unwrap_or_else(|error| panic!("{description} could not start: {error}"))
}

/// Runs a command and panics with its output unless it succeeded; returns stdout.
pub async fn run_ok(command: &mut tokio::process::Command) -> String {
    let description = format!("{command:?}");
    let output = run(command).await;
    assert!(
        output.status.success(),
        "{description} failed with {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A command for `program` with a PATH on which `python` comes first, so that
/// nbdsh (a shell script calling `python3`) finds the nbd module.
pub fn command_with_python(program: &Path, python: &Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    let python_directory = python.parent().expect("python has a directory");
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut directories = vec![python_directory.to_path_buf()];
    directories.extend(std::env::split_paths(&path));
    command.env(
        "PATH",
        std::env::join_paths(directories).expect("joinable PATH"),
    );
    command
}

/// Deterministic test data: every byte depends on its position and `seed`.
pub fn pattern(length: usize, seed: u8) -> Vec<u8> {
    (0..length)
        .map(|index| ((index as u64).wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
        .collect()
}
