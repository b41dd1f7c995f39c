//! The servers `lamina bench compare` measures side by side: lamina itself and the
//! peers a user would otherwise pick (nbdkit, qemu-nbd on raw and qcow2, nbd-server).
//!
//! Each server gets its own copy of the same prepared data (random bytes, fully
//! allocated, so reads hit data and not holes), listens on a Unix socket in a private
//! directory (no TCP port conflicts), exports the name `default`, and is stopped by PID
//! when its runs are over. Everything a server needs is written under its directory so
//! that nothing is left behind when the directory is removed.

use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rand::{RngCore, SeedableRng};
use serde::Serialize;

use crate::process::{ManagedChild, check_interrupted, find_program, run_helper};

/// How long a server gets to accept connections after it was started.
pub const READY_TIMEOUT_MS: u64 = 30_000;

/// How often readiness is polled.
const READY_POLL_INTERVAL_MS: u64 = 50;

/// Bytes written per call while generating the data file.
const DATA_CHUNK_BYTES: usize = 1 << 20;

/// The export name every server uses, so that URIs differ only by socket.
pub const EXPORT_NAME: &str = "default";

/// The servers `compare` knows how to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ServerKind {
    Lamina,
    Nbdkit,
    QemuNbd,
    QemuNbdQcow2,
    NbdServer,
}

impl ServerKind {
    /// The name shown in tables and plots.
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::Lamina => "lamina",
            ServerKind::Nbdkit => "nbdkit",
            ServerKind::QemuNbd => "qemu-nbd",
            ServerKind::QemuNbdQcow2 => "qemu-nbd-qcow2",
            ServerKind::NbdServer => "nbd-server",
        }
    }

    /// Every known server, lamina first.
    pub fn all() -> Vec<ServerKind> {
        vec![
            ServerKind::Lamina,
            ServerKind::Nbdkit,
            ServerKind::QemuNbd,
            ServerKind::QemuNbdQcow2,
            ServerKind::NbdServer,
        ]
    }

    /// Programs that must be installed for this peer (lamina is checked by path).
    fn required_programs(self) -> &'static [&'static str] {
        match self {
            ServerKind::Lamina => &[],
            ServerKind::Nbdkit => &["nbdkit"],
            ServerKind::QemuNbd => &["qemu-nbd"],
            ServerKind::QemuNbdQcow2 => &["qemu-nbd", "qemu-img"],
            ServerKind::NbdServer => &["nbd-server"],
        }
    }

    /// `None` when the server can be tried, or why it cannot.
    pub fn missing_reason(self, lamina_program: &Path) -> Option<String> {
        if self == ServerKind::Lamina {
            return (!lamina_program.is_file())
                .then(|| format!("lamina binary {} not found", lamina_program.display()));
        }
        self.required_programs()
            .iter()
            .find(|program| find_program(program).is_none())
            .map(|program| format!("`{program}` is not installed"))
    }
}

/// Writes `size_bytes` of seeded pseudo-random data to `path` (fully allocated).
pub fn write_random_data(path: &Path, size_bytes: u64) -> anyhow::Result<()> {
    let file = std::fs::File::create(path)
        .map_err(|error| anyhow::anyhow!("cannot create {}: {error}", path.display()))?;
    let mut writer = std::io::BufWriter::with_capacity(DATA_CHUNK_BYTES, file);
    let mut generator = rand::rngs::SmallRng::seed_from_u64(0x6c61_6d69_6e61);
    let mut chunk = vec![0u8; DATA_CHUNK_BYTES];
    let mut remaining = size_bytes;
    while remaining > 0 {
        check_interrupted()?;
        let length =
            usize::try_from(remaining.min(DATA_CHUNK_BYTES as u64)).expect("chunk fits in usize");
        generator.fill_bytes(&mut chunk[..length]);
        writer.write_all(&chunk[..length])?;
        remaining -= length as u64;
    }
    writer.into_inner()?.sync_all()?;
    Ok(())
}

/// Options shared by every server start.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub lamina_program: PathBuf,
    /// The prepared random data every server starts from.
    pub data_file: PathBuf,
    pub data_size_bytes: u64,
    /// Largest number of concurrent connections the workload opens.
    pub max_connections: u32,
    /// Every server without its cache: lamina's memory cache off, nbdkit's file plugin
    /// with `cache=none`; qemu-nbd runs with `--cache=none` (O_DIRECT) in every mode.
    pub cache_miss: bool,
}

/// A running server: its process, its URI and the notes about how it was run.
#[derive(Debug)]
pub struct RunningServer {
    pub kind: ServerKind,
    pub uri: String,
    /// How this server was configured (cache mode, aio, fallbacks).
    pub notes: Vec<String>,
    process: ServerProcess,
    directory: PathBuf,
    /// How the process was started, so that [`RunningServer::restart`] can start it again.
    launch: Launch,
}

/// A server's command line and how it runs: what a restart repeats.
#[derive(Debug, Clone)]
struct Launch {
    program: std::ffi::OsString,
    arguments: Vec<std::ffi::OsString>,
    socket: PathBuf,
    /// nbd-server daemonizes and writes its PID here; the others are our children.
    daemon_pid_file: Option<PathBuf>,
}

impl Launch {
    fn from_command(command: &Command, socket: &Path, daemon_pid_file: Option<&Path>) -> Self {
        Self {
            program: command.get_program().to_owned(),
            arguments: command.get_args().map(ToOwned::to_owned).collect(),
            socket: socket.to_owned(),
            daemon_pid_file: daemon_pid_file.map(Path::to_owned),
        }
    }

    /// Starts the process, its output appended to `directory/server.log`.
    fn spawn(&self, directory: &Path) -> anyhow::Result<ServerProcess> {
        // A stopped nbdkit or nbd-server leaves its socket file behind, and binding
        // to an existing path fails.
        if self.socket.exists() {
            std::fs::remove_file(&self.socket)?;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(directory.join("server.log"))?;
        let mut command = Command::new(&self.program);
        command.args(&self.arguments);
        match &self.daemon_pid_file {
            None => Ok(ServerProcess::Child(spawn_logged(command, &log)?)),
            Some(pid_file) => {
                let _ = std::fs::remove_file(pid_file);
                run_helper(command)?;
                Ok(ServerProcess::Daemon(
                    crate::process::DaemonProcess::from_pid_file(
                        pid_file,
                        Duration::from_millis(READY_TIMEOUT_MS),
                    )?,
                ))
            }
        }
    }
}

#[derive(Debug)]
enum ServerProcess {
    Child(ManagedChild),
    /// nbd-server serves more than one connection only when it daemonizes; it is then
    /// our grandchild, stopped by the PID it wrote to its PID file.
    Daemon(crate::process::DaemonProcess),
}

impl RunningServer {
    /// Stops the server (SIGTERM, then SIGKILL after a grace period) and removes its data.
    pub fn stop(mut self) {
        self.stop_process();
    }

    /// The server's PID (nbd-server: the daemon that forks one process per connection).
    pub fn pid(&self) -> Option<u32> {
        match &self.process {
            ServerProcess::Child(child) => Some(child.id()).filter(|pid| *pid != 0),
            ServerProcess::Daemon(daemon) => daemon.id(),
        }
    }

    /// Stops the server cleanly (SIGTERM: lamina shuts down as on any clean stop) and
    /// starts it again on the same data with the same command, then waits until it
    /// serves. Nothing else is touched: the host page cache keeps what it held.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.terminate();
        self.process = self.launch.spawn(&self.directory)?;
        let socket = self.launch.socket.clone();
        wait_ready(self, &socket)
    }

    fn terminate(&mut self) {
        match &mut self.process {
            ServerProcess::Child(child) => {
                child.stop();
            }
            ServerProcess::Daemon(daemon) => daemon.stop(),
        }
    }

    fn stop_process(&mut self) {
        self.terminate();
        let _ = std::fs::remove_dir_all(&self.directory);
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop_process();
    }
}

/// Prepares `kind`'s copy of the data under `work_directory` and starts it.
pub fn start(
    kind: ServerKind,
    options: &ServerOptions,
    work_directory: &Path,
) -> anyhow::Result<RunningServer> {
    let directory = work_directory.join(kind.name());
    std::fs::create_dir_all(&directory)?;
    let socket = directory.join("nbd.sock");
    let uri = format!("nbd+unix:///{EXPORT_NAME}?socket={}", socket.display());
    let mut notes = Vec::new();
    let raw_image = directory.join("image.raw");
    let log = std::fs::File::create(directory.join("server.log"))?;
    let launch: Launch;
    let process = match kind {
        ServerKind::Lamina => {
            drop(log);
            let extra_config = if options.cache_miss {
                "[limits]\nmemory_cache_bytes = 0\n"
            } else {
                ""
            };
            let mut server =
                start_lamina_daemon(&options.lamina_program, &directory, extra_config)?;
            // lamina starts empty, so the data is written through NBD like a client would.
            prefill_over_nbd(&server.uri, &options.data_file)?;
            server
                .notes
                .push("data written over NBD with nbdcopy".to_owned());
            if options.cache_miss {
                server.notes.push("memory_cache_bytes = 0".to_owned());
            }
            return Ok(server);
        }
        ServerKind::Nbdkit => {
            copy_data(&options.data_file, &raw_image)?;
            let mut command = Command::new("nbdkit");
            command
                .arg("--unix")
                .arg(&socket)
                .args(["--foreground", "--exit-with-parent", "file"])
                .arg(&raw_image);
            if options.cache_miss {
                // nbdkit's file plugin has no O_DIRECT; cache=none evicts what it
                // touched with posix_fadvise, the nearest it has to a miss.
                command.arg("cache=none");
                notes.push("file plugin, cache=none (posix_fadvise, no O_DIRECT)".to_owned());
            } else {
                notes.push("file plugin, page cache".to_owned());
            }
            launch = Launch::from_command(&command, &socket, None);
            ServerProcess::Child(spawn_logged(command, &log)?)
        }
        ServerKind::QemuNbd | ServerKind::QemuNbdQcow2 => {
            let (image, format) = if kind == ServerKind::QemuNbdQcow2 {
                let image = directory.join("image.qcow2");
                let mut convert = Command::new("qemu-img");
                convert
                    .args(["convert", "-f", "raw", "-O", "qcow2"])
                    .arg(&options.data_file)
                    .arg(&image);
                run_helper(convert)?;
                (image, "qcow2")
            } else {
                copy_data(&options.data_file, &raw_image)?;
                (raw_image.clone(), "raw")
            };
            drop(log);
            let mut server =
                serve_qemu_nbd(&image, format, &directory, options.max_connections, false)?;
            server.kind = kind;
            return Ok(server);
        }
        ServerKind::NbdServer => {
            copy_data(&options.data_file, &raw_image)?;
            let config = directory.join("nbd-server.conf");
            let pid_file = directory.join("nbd-server.pid");
            std::fs::write(
                &config,
                format!(
                    "[generic]\n    unixsock = {}\n[{EXPORT_NAME}]\n    exportname = {}\n",
                    socket.display(),
                    raw_image.display()
                ),
            )?;
            let mut command = Command::new("nbd-server");
            command.arg("-C").arg(&config).arg("-p").arg(&pid_file);
            notes.push("daemon mode (one process per connection)".to_owned());
            if options.cache_miss {
                notes.push("no O_DIRECT option: page cache".to_owned());
            }
            drop(log);
            let recipe = Launch::from_command(&command, &socket, Some(&pid_file));
            let process = recipe.spawn(&directory)?;
            launch = recipe;
            process
        }
    };
    let mut server = RunningServer {
        kind,
        uri,
        notes,
        process,
        directory,
        launch,
    };
    wait_ready(&mut server, &socket)?;
    Ok(server)
}

/// Starts `lamina serve` with a fresh data directory `DIRECTORY/data` and waits until
/// its export `default` answers. `extra_config` is appended to the generated TOML
/// (sections such as `[pool]` or `[limits]`). The data directory is removed on stop.
pub(crate) fn start_lamina_daemon(
    program: &Path,
    directory: &Path,
    extra_config: &str,
) -> anyhow::Result<RunningServer> {
    std::fs::create_dir_all(directory)?;
    let data = directory.join("data");
    std::fs::create_dir_all(&data)?;
    serve_lamina_data(program, directory, &data, extra_config, EXPORT_NAME)
}

/// Starts `lamina serve` on an existing data directory `data` (a pool made with
/// `lamina pool create`, its volumes already created, or an empty directory
/// for the embedded default pool) and waits until `export` answers. The
/// configuration and log go to `directory`, which must hold `data` and is
/// removed on stop.
pub(crate) fn serve_lamina_data(
    program: &Path,
    directory: &Path,
    data: &Path,
    extra_config: &str,
    export: &str,
) -> anyhow::Result<RunningServer> {
    std::fs::create_dir_all(directory)?;
    let log = std::fs::File::create(directory.join("server.log"))?;
    let config = directory.join("lamina.toml");
    // The Unix socket is what we use; the TCP listener gets a free port so that
    // it cannot collide with a running lamina or another benchmark.
    let port = free_tcp_port()?;
    std::fs::write(
        &config,
        format!("[server]\ntcp_address = \"127.0.0.1:{port}\"\n{extra_config}"),
    )?;
    let mut command = Command::new(program);
    command
        .arg("serve")
        .arg("--data")
        .arg(data)
        .arg("--config")
        .arg(&config);
    let socket = data.join("nbd.sock");
    let uri = format!("nbd+unix:///{export}?socket={}", socket.display());
    let launch = Launch::from_command(&command, &socket, None);
    let child = spawn_logged(command, &log)?;
    let mut server = RunningServer {
        kind: ServerKind::Lamina,
        uri,
        notes: Vec::new(),
        process: ServerProcess::Child(child),
        directory: directory.to_owned(),
        launch,
    };
    wait_ready(&mut server, &socket)?;
    Ok(server)
}

/// Serves `image` (raw or qcow2, left in place) with qemu-nbd on `DIRECTORY/nbd.sock`
/// as export `default`: `--cache=none --aio=io_uring` where the filesystem and kernel
/// allow, with the fallbacks noted. `directory` (socket and log only) is removed on stop.
pub(crate) fn serve_qemu_nbd(
    image: &Path,
    format: &str,
    directory: &Path,
    max_connections: u32,
    read_only: bool,
) -> anyhow::Result<RunningServer> {
    std::fs::create_dir_all(directory)?;
    let log = std::fs::File::create(directory.join("server.log"))?;
    let socket = directory.join("nbd.sock");
    let uri = format!("nbd+unix:///{EXPORT_NAME}?socket={}", socket.display());
    let mut notes = Vec::new();
    let direct = supports_direct_io(image);
    let (cache, aio) = if direct {
        ("none", "io_uring")
    } else {
        notes.push("O_DIRECT refused by this filesystem: page cache".to_owned());
        ("writeback", "threads")
    };
    let qemu_command = |aio: &str| -> Command {
        let mut command = Command::new("qemu-nbd");
        command
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--format={format}"))
            .arg(format!("--cache={cache}"))
            .arg(format!("--aio={aio}"))
            .arg(format!("--shared={}", max_connections.max(1)))
            .arg("--persistent")
            .arg(format!("--export-name={EXPORT_NAME}"));
        if read_only {
            command.arg("--read-only");
        }
        command.arg(image);
        command
    };
    let mut launch = Launch::from_command(&qemu_command(aio), &socket, None);
    let mut child = spawn_logged(qemu_command(aio), &log)?;
    std::thread::sleep(Duration::from_millis(200));
    if aio == "io_uring" && child.try_wait()?.is_some() {
        notes.push("io_uring refused: --aio=threads".to_owned());
        launch = Launch::from_command(&qemu_command("threads"), &socket, None);
        child = spawn_logged(qemu_command("threads"), &log)?;
        notes.push(format!("--cache={cache} --aio=threads"));
    } else {
        notes.push(format!("--cache={cache} --aio={aio}"));
    }
    let mut server = RunningServer {
        kind: ServerKind::QemuNbd,
        uri,
        notes,
        process: ServerProcess::Child(child),
        directory: directory.to_owned(),
        launch,
    };
    wait_ready(&mut server, &socket)?;
    Ok(server)
}

/// Serves nbdkit's `plugin` (with its `parameters`, such as `size=1G`) on
/// `DIRECTORY/nbd.sock` as export `default`; `directory` is removed on stop.
pub(crate) fn serve_nbdkit_plugin(
    plugin: &str,
    parameters: &[String],
    directory: &Path,
) -> anyhow::Result<RunningServer> {
    std::fs::create_dir_all(directory)?;
    let log = std::fs::File::create(directory.join("server.log"))?;
    let socket = directory.join("nbd.sock");
    let mut command = Command::new("nbdkit");
    command
        .arg("--unix")
        .arg(&socket)
        .args(["--foreground", "--exit-with-parent", plugin])
        .args(parameters);
    let launch = Launch::from_command(&command, &socket, None);
    let mut server = RunningServer {
        kind: ServerKind::Nbdkit,
        uri: format!("nbd+unix:///{EXPORT_NAME}?socket={}", socket.display()),
        notes: vec![format!("nbdkit {plugin} {}", parameters.join(" "))],
        process: ServerProcess::Child(spawn_logged(command, &log)?),
        directory: directory.to_owned(),
        launch,
    };
    wait_ready(&mut server, &socket)?;
    Ok(server)
}

fn spawn_logged(mut command: Command, log: &std::fs::File) -> anyhow::Result<ManagedChild> {
    command
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?);
    Ok(ManagedChild::spawn(command)?)
}

fn copy_data(source: &Path, destination: &Path) -> anyhow::Result<()> {
    std::fs::copy(source, destination).map_err(|error| {
        anyhow::anyhow!(
            "cannot copy {} to {}: {error}",
            source.display(),
            destination.display()
        )
    })?;
    Ok(())
}

/// Polls until the socket accepts a connection and an NBD handshake succeeds.
fn wait_ready(server: &mut RunningServer, socket: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(READY_TIMEOUT_MS);
    let log = server.directory.join("server.log");
    loop {
        check_interrupted()?;
        if let ServerProcess::Child(child) = &mut server.process
            && let Some(status) = child.try_wait()?
        {
            let log_text = std::fs::read_to_string(&log).unwrap_or_default();
            let summary: Vec<&str> = log_text
                .lines()
                .map(str::trim)
                .filter(|line| !line.is_empty())
                .take(3)
                .collect();
            anyhow::bail!(
                "{} exited before serving ({status}): {}",
                server.kind.name(),
                summary.join(" / ")
            );
        }
        if UnixStream::connect(socket).is_ok() && handshake_succeeds(&server.uri) {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "{} did not accept NBD connections on {} within {READY_TIMEOUT_MS} ms",
                server.kind.name(),
                socket.display()
            );
        }
        std::thread::sleep(Duration::from_millis(READY_POLL_INTERVAL_MS));
    }
}

/// True when `nbdinfo --size` completes a handshake; without nbdinfo, the socket
/// connection alone is taken as readiness.
fn handshake_succeeds(uri: &str) -> bool {
    if find_program("nbdinfo").is_none() {
        return true;
    }
    let mut command = Command::new("nbdinfo");
    command.arg("--size").arg(uri);
    run_helper(command).is_ok()
}

pub(crate) fn prefill_over_nbd(uri: &str, data_file: &Path) -> anyhow::Result<()> {
    let mut command = Command::new("nbdcopy");
    command.arg(data_file).arg(uri);
    run_helper(command)?;
    Ok(())
}

/// Whether the filesystem holding `path` accepts O_DIRECT opens.
fn supports_direct_io(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .is_ok()
}

fn free_tcp_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_data_has_the_requested_size_and_is_not_zero() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("data");
        write_random_data(&path, 3 * 1024 * 1024 + 17).expect("writes");
        let bytes = std::fs::read(&path).expect("reads");
        assert_eq!(bytes.len(), 3 * 1024 * 1024 + 17);
        assert!(bytes.iter().filter(|byte| **byte == 0).count() < bytes.len() / 100);
    }

    #[test]
    fn a_missing_lamina_binary_is_reported() {
        let reason = ServerKind::Lamina.missing_reason(Path::new("/no/such/lamina"));
        assert!(reason.expect("missing").contains("not found"));
    }
}
