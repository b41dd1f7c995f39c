//! How the runner brings up one row of a scenario: which server it starts (through
//! the one process wrapper, [`crate::servers::RunningServer`]), on which data, and
//! what it does to the export before the measured workloads (fill it, read it once so
//! that a cache is warm). Also the shared pool several rows serve in turn, made once
//! per run by the first lamina build.

use std::path::{Path, PathBuf};

use lamina_api::PoolStatus;
use serde::Serialize;

use crate::fio::{FioTarget, Pattern, sequential_pass};
use crate::lamina_cli::{LaminaCli, export_uri};
use crate::servers::{
    EXPORT_NAME, RunningServer, prefill_over_nbd, serve_lamina_data, serve_nbdkit_plugin,
    serve_qemu_nbd, start_lamina_daemon,
};

/// The range of a pool file its data fills is rounded up to this many bytes.
const POOL_RANGE_ALIGNMENT_BYTES: u64 = 1 << 20;

/// The warm-up read: large sequential reads at a small depth.
const WARM_READ_IODEPTH: u32 = 8;

/// The connections a read-only qemu-nbd accepts (fio opens one per job).
const QEMU_NBD_CONNECTIONS: u32 = 8;

/// What serves a row, or the file fio reads itself.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Server {
    /// `lamina serve` on the shared pool, serving `export`; `config` follows the
    /// `[server]` line of the generated configuration (settings of `[server]` first,
    /// then other sections).
    LaminaShared {
        program: PathBuf,
        config: String,
        export: String,
    },
    /// `lamina serve` on a fresh embedded pool (sized by `config`), removed on stop.
    LaminaFresh { program: PathBuf, config: String },
    /// nbdkit's `memory` plugin or its `null` plugin, of the scenario's size.
    Nbdkit { plugin: String },
    /// qemu-nbd, read-only and without its cache, on the shared pool's file, over the
    /// range its data fills: a peer's cache miss on the very same bytes.
    QemuNbdOnPoolFile,
    /// No server: fio's io_uring engine with O_DIRECT on the shared pool's file, over
    /// the range its data fills (the device ceiling of those bytes).
    DeviceOnPoolFile,
    /// No server: fio's io_uring engine with O_DIRECT on the file of the random data.
    DeviceOnDataFile,
}

/// What is done to a row's export after its server starts, before it is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preparation {
    Nothing,
    /// The scenario's random data is written to it (nbdcopy).
    Fill,
    /// It is read once from end to end, so that a memory cache holds it.
    WarmRead,
    /// The shared pool's volume `default` is read once from end to end through the
    /// row's daemon, which serves another export of the pool: its cache then holds
    /// the data, as after serving it for a while.
    WarmReadOfData,
}

/// The pool the `LaminaShared` rows serve: one file of `file_bytes` holding the
/// volume `default` of the scenario's size filled with its random data, and the
/// empty `extra_volumes`. Made by `program`, the first build, before the first round.
#[derive(Debug, Clone, Serialize)]
pub struct SharedPool {
    pub program: PathBuf,
    pub file_bytes: u64,
    pub extra_volumes: Vec<String>,
}

/// Where a run's files are: the random data, the shared pool once made.
#[derive(Debug)]
pub struct Ground {
    pub work: PathBuf,
    pub data_file: PathBuf,
    pub size_bytes: u64,
    pub fio: String,
    pool: Option<MadePool>,
}

/// The shared pool on disk: its data directory, its file and the bytes data fills.
#[derive(Debug)]
struct MadePool {
    data: PathBuf,
    file: PathBuf,
    used_bytes: u64,
}

/// A row brought up: a server (or a file) and the bytes a workload covers.
pub struct Started {
    server: Option<RunningServer>,
    file: Option<PathBuf>,
    region_bytes: u64,
}

impl Started {
    /// The bytes of the export (or file) a workload covers.
    pub fn region_bytes(&self) -> u64 {
        self.region_bytes
    }

    /// The server's PID, whose CPU time is watched; none when fio reads a file.
    pub fn pid(&self) -> Option<u32> {
        self.server.as_ref().and_then(RunningServer::pid)
    }

    /// How the server was run (cache mode, fallbacks).
    pub fn notes(&self) -> &[String] {
        self.server.as_ref().map_or(&[], |server| &server.notes)
    }

    /// Stops the server, if any.
    pub fn stop(self) {
        if let Some(server) = self.server {
            server.stop();
        }
    }

    /// Where fio sends the row's I/O.
    pub fn target(&self) -> FioTarget<'_> {
        match (&self.server, &self.file) {
            (Some(server), _) => FioTarget::Nbd { uri: &server.uri },
            (None, Some(path)) => FioTarget::File { path },
            (None, None) => unreachable!("a started row has a server or a file"),
        }
    }
}

impl Ground {
    /// Writes the random data of `size_bytes` under `work`.
    pub fn new(work: &Path, size_bytes: u64, fio: &str) -> anyhow::Result<Self> {
        let data_file = work.join("data.raw");
        crate::servers::write_random_data(&data_file, size_bytes)?;
        Ok(Self {
            work: work.to_owned(),
            data_file,
            size_bytes,
            fio: fio.to_owned(),
            pool: None,
        })
    }

    /// Makes the shared pool: created offline, served once to write the data into
    /// `default`, stopped; the range its data fills is read from its status.
    pub fn make_pool(&mut self, pool: &SharedPool) -> anyhow::Result<()> {
        let directory = self.work.join("pool");
        let data = directory.join("data");
        std::fs::create_dir_all(&data)?;
        let file = directory.join("flash.img");
        let lamina = LaminaCli::new(&pool.program, &data);
        let flash = format!("{}:{}", file.display(), pool.file_bytes);
        lamina.run(&["pool", "create", "--flash", &flash])?;
        let size = self.size_bytes.to_string();
        let extra = pool.extra_volumes.iter().map(String::as_str);
        for volume in std::iter::once(EXPORT_NAME).chain(extra) {
            lamina.run(&["volume", "create", volume, "--size", &size])?;
        }
        let config = "[limits]\nmemory_cache_bytes = 0\n";
        let prefill = self.work.join("prefill");
        let server = serve_lamina_data(&pool.program, &prefill, &data, config, EXPORT_NAME)?;
        prefill_over_nbd(&server.uri, &self.data_file)?;
        server.stop();
        let status: PoolStatus = lamina.json(&["pool", "status", "--json"])?;
        let used_bytes =
            status.used_bytes.div_ceil(POOL_RANGE_ALIGNMENT_BYTES) * POOL_RANGE_ALIGNMENT_BYTES;
        self.pool = Some(MadePool {
            data,
            file,
            used_bytes,
        });
        Ok(())
    }

    fn pool(&self) -> anyhow::Result<&MadePool> {
        self.pool
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("this row needs the scenario's shared pool"))
    }

    /// Starts `server` in `directory` (removed when it stops) and prepares its export.
    pub fn start(
        &self,
        server: &Server,
        preparation: Preparation,
        directory: &Path,
    ) -> anyhow::Result<Started> {
        let size = self.size_bytes;
        let running = |server: RunningServer, region_bytes| Started {
            server: Some(server),
            file: None,
            region_bytes,
        };
        let started = match server {
            Server::LaminaShared {
                program,
                config,
                export,
            } => running(
                serve_lamina_data(program, directory, &self.pool()?.data, config, export)?,
                size,
            ),
            Server::LaminaFresh { program, config } => {
                running(start_lamina_daemon(program, directory, config)?, size)
            }
            Server::Nbdkit { plugin } => running(
                serve_nbdkit_plugin(plugin, &[format!("size={size}")], directory)?,
                size,
            ),
            Server::QemuNbdOnPoolFile => {
                let pool = self.pool()?;
                let server =
                    serve_qemu_nbd(&pool.file, "raw", directory, QEMU_NBD_CONNECTIONS, true)?;
                running(server, pool.used_bytes)
            }
            Server::DeviceOnPoolFile => {
                let pool = self.pool()?;
                Started {
                    server: None,
                    file: Some(pool.file.clone()),
                    region_bytes: pool.used_bytes,
                }
            }
            Server::DeviceOnDataFile => Started {
                server: None,
                file: Some(self.data_file.clone()),
                region_bytes: size,
            },
        };
        self.prepare(&started, preparation)?;
        Ok(started)
    }

    fn prepare(&self, started: &Started, preparation: Preparation) -> anyhow::Result<()> {
        let Some(server) = &started.server else {
            return Ok(());
        };
        match preparation {
            Preparation::Nothing => Ok(()),
            Preparation::Fill => prefill_over_nbd(&server.uri, &self.data_file),
            Preparation::WarmRead | Preparation::WarmReadOfData => {
                let uri = match preparation {
                    Preparation::WarmReadOfData => export_uri(&self.pool()?.data, EXPORT_NAME),
                    _ => server.uri.clone(),
                };
                let (pattern, bytes) = (Pattern::SequentialRead, self.size_bytes);
                sequential_pass(&self.fio, &uri, pattern, bytes, WARM_READ_IODEPTH, &[]).map(drop)
            }
        }
    }
}
