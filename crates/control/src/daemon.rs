//! `lamina serve`: opens (or, with an empty data directory, creates) the pool,
//! serves every volume over NBD on TCP and a Unix socket, serves the admin API,
//! tells a service manager when it is ready (`systemd.rs`), reloads what can
//! change live on SIGHUP, and on SIGINT or SIGTERM stops accepting, lets
//! in-flight requests finish, flushes, checkpoints, records the memory
//! cache's contents (`cache_contents.rs`) and exits 0.

use std::sync::Arc;

use anyhow::Context;
use lamina_nbd::{CancellationToken, ConnectionThreadOptions, ConnectionThreads, NbdServer};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use lamina_nbd::ServerTls;
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinSet;

use crate::access::{AccessRules, LoopbackGate};
use crate::admin::{AdminAudit, AdminGate, AdminListener, AdminPeer};
use crate::config::{Config, TlsSetting};
use crate::export::{DEFAULT_EXPORT_NAME, PoolCatalog};
use crate::store::{self, ADMIN_SOCKET_FILE, EMBEDDED_POOL_FILE};
use crate::systemd::{self, LiveAccessRules, ReloadSource, Reloader};

/// Opens the pool in the data directory, creating the embedded default when the
/// directory has none.
async fn open_or_create(config: &Config) -> anyhow::Result<crate::arrays::OpenedPool> {
    let data_dir = &config.data_dir;
    if store::read_description(data_dir)?.is_some() {
        return crate::arrays::open_pool_with_models(
            data_dir,
            config.pool_limits(),
            &config.device_models(),
        )
        .await;
    }
    let flash = data_dir.join(EMBEDDED_POOL_FILE);
    tracing::info!(
        path = %flash.display(),
        size_bytes = config.pool.embedded_size_bytes,
        "no pool in the data directory: creating the embedded default pool (a sparse file)"
    );
    let pool = store::create_embedded_pool(
        data_dir,
        &flash,
        config.pool.embedded_size_bytes,
        config.pool_limits(),
        &config.device_models(),
    )
    .await?;
    if config.pool.default_volume_bytes > 0 {
        let (size_bytes, codec) = (config.pool.default_volume_bytes, config.pool.compression);
        pool.create_volume_with_compression(DEFAULT_EXPORT_NAME, size_bytes, codec)
            .await?;
    }
    Ok(crate::arrays::OpenedPool {
        pool,
        layout: Default::default(),
    })
}

/// The TLS of the TCP listener and of the Unix socket, loaded once when both
/// use it.
struct ListenerTls {
    tcp: Option<Arc<ServerTls>>,
    unix: Option<Arc<ServerTls>>,
}

fn load_tls(config: &Config) -> anyhow::Result<ListenerTls> {
    let server = &config.server;
    let load = |setting: TlsSetting| -> anyhow::Result<Option<Arc<ServerTls>>> {
        if setting == TlsSetting::Off {
            return Ok(None);
        }
        let directory = server
            .tls_certificates
            .as_ref()
            .context("[server] tls needs tls_certificates")?;
        let tls = ServerTls::load(directory, setting.mode(), server.tls_verify_peer)?;
        Ok(Some(Arc::new(tls)))
    };
    Ok(ListenerTls {
        tcp: load(server.tls)?,
        unix: load(server.unix_tls)?,
    })
}

/// The Unix group the data directory and the sockets belong to, when
/// `socket_group` or `admin_group` names one.
fn configured_group(config: &Config) -> anyhow::Result<Option<u32>> {
    let server = &config.server;
    server
        .socket_group
        .as_ref()
        .or(server.admin_group.as_ref())
        .map(|group| crate::access::resolve_group(group).map_err(|error| anyhow::anyhow!(error)))
        .transpose()
}

/// Only the owner may enter the data directory (0700), or with a group, its
/// members too, without listing it (0710): the pool's files are in it and the
/// sockets are created there before their own modes are set. The files in it
/// are owner-only whatever the directory's mode (`store::DATA_FILE_MODE`).
fn protect_data_directory(data_dir: &Path, group: Option<u32>) -> anyhow::Result<()> {
    let mode = match group {
        Some(gid) => {
            std::os::unix::fs::chown(data_dir, None, Some(gid))
                .with_context(|| format!("cannot give {} to group {gid}", data_dir.display()))?;
            DATA_DIRECTORY_GROUP_MODE
        }
        None => DATA_DIRECTORY_OWNER_MODE,
    };
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", data_dir.display()))?;
    store::restrict_data_files(data_dir)
}

const DATA_DIRECTORY_OWNER_MODE: u32 = 0o700;
const DATA_DIRECTORY_GROUP_MODE: u32 = 0o710;
const SOCKET_OWNER_MODE: u32 = 0o600;
const SOCKET_GROUP_MODE: u32 = 0o660;

/// Binds a Unix socket readable and writable by its owner only, or also by
/// `group`.
fn bind_unix(path: &Path, group: Option<u32>) -> anyhow::Result<UnixListener> {
    // A socket file left by a killed daemon is stale: the directory lock proves
    // that no live daemon owns it.
    let _ = std::fs::remove_file(path);
    let listener =
        UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))?;
    let mode = match group {
        Some(gid) => {
            std::os::unix::fs::chown(path, None, Some(gid))
                .with_context(|| format!("cannot give {} to group {gid}", path.display()))?;
            SOCKET_GROUP_MODE
        }
        None => SOCKET_OWNER_MODE,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))?;
    Ok(listener)
}

/// How a listener's TLS reads in the exposure line.
fn tls_description(tls: Option<&Arc<ServerTls>>) -> String {
    match tls {
        None => "plain text (no TLS)".to_string(),
        Some(tls) => {
            let mode = if tls.required() {
                "TLS required"
            } else {
                "TLS offered, plain text allowed"
            };
            if tls.verify_peer() {
                format!(
                    "{mode}, client certificates checked against {}",
                    tls.directory()
                        .join(lamina_nbd::tls::CA_CERTIFICATE_FILE)
                        .display()
                )
            } else {
                format!("{mode}, no client certificates")
            }
        }
    }
}

/// Who may reach a Unix socket, as the exposure line says it.
fn socket_audience(path: &Path, group: Option<u32>) -> String {
    let owner = std::fs::metadata(path)
        .map(|metadata| metadata.uid())
        .unwrap_or(u32::MAX);
    match group {
        Some(gid) => format!("uid {owner} and group {gid} (mode 0660)"),
        None => format!("uid {owner} only (mode 0600)"),
    }
}

/// Which exports the access rules leave visible, as the exposure line says it.
fn exports_description(config: &Config) -> String {
    match config.access.len() {
        0 => "every export".to_string(),
        count => format!("exports as {count} [[access]] rule(s) allow"),
    }
}

/// The gate for plain loopback TCP clients, unless
/// `tcp_loopback_uid_check = false`: the daemon's uid owns the Unix socket,
/// whose group (if any) is `group`.
fn loopback_gate(config: &Config, group: Option<u32>) -> Option<LoopbackGate> {
    config.server.tcp_loopback_uid_check.then(|| LoopbackGate {
        owner_uid: nix::unistd::geteuid().as_raw(),
        socket_group: config.server.socket_group.as_ref().and(group),
    })
}

/// The `[[access]]` rules with the loopback gate: always the live policy,
/// even without rules, so that a SIGHUP can add some.
fn access_policy(config: &Config, group: Option<u32>) -> anyhow::Result<Arc<LiveAccessRules>> {
    let rules = match config.access.is_empty() {
        true => None,
        false => Some(AccessRules::new(&config.access).map_err(|error| anyhow::anyhow!(error))?),
    };
    let mut live_rules = LiveAccessRules::new(rules);
    if let Some(gate) = loopback_gate(config, group) {
        live_rules = live_rules.with_loopback_gate(gate);
    }
    Ok(Arc::new(live_rules))
}

/// Who the TCP exposure line says a loopback listener admits.
fn loopback_audience(gate: &LoopbackGate) -> String {
    let root = if gate.owner_uid == 0 { "" } else { ", root" };
    let group = match gate.socket_group {
        Some(gid) => format!(", group {gid}"),
        None => String::new(),
    };
    format!(
        "uid {}{root}{group} and the uids and gids [[access]] rules name, on this host (loopback; checked per connection)",
        gate.owner_uid
    )
}

/// What starting the listeners needs: each prints its exposure line, binds,
/// and spawns its accept loop into the daemon's tasks.
struct Listeners<'a> {
    config: &'a Config,
    server: &'a Arc<NbdServer>,
    shutdown: &'a CancellationToken,
    /// Which exports the access rules leave visible, for the exposure lines.
    exports: String,
    /// The group of the data directory and sockets, if configured.
    group: Option<u32>,
}

impl Listeners<'_> {
    /// NBD over TCP, unless `tcp_address` is empty.
    async fn start_tcp(
        &self,
        tasks: &mut JoinSet<()>,
        tls: Option<Arc<ServerTls>>,
    ) -> anyhow::Result<()> {
        let configured = &self.config.server.tcp_address;
        if configured.is_empty() {
            return Ok(());
        }
        let listener = TcpListener::bind(configured)
            .await
            .with_context(|| format!("cannot listen on {configured}"))?;
        let address = listener.local_addr()?;
        let reach = if !address.ip().is_loopback() {
            "any host that reaches it".to_string()
        } else if let Some(gate) = loopback_gate(self.config, self.group) {
            loopback_audience(&gate)
        } else {
            "processes on this host (loopback)".to_string()
        };
        println!(
            "lamina: NBD on tcp {address}: {}; to {reach}; {}",
            tls_description(tls.as_ref()),
            self.exports
        );
        tracing::info!(address = %address, tls = %self.config.server.tls.mode(), "serving NBD over TCP");
        let (server, shutdown) = (self.server.clone(), self.shutdown.clone());
        tasks.spawn(async move { server.serve_tcp_with_tls(listener, tls, shutdown).await });
        Ok(())
    }

    /// NBD over the Unix socket; returns its path.
    fn start_unix(
        &self,
        tasks: &mut JoinSet<()>,
        tls: Option<Arc<ServerTls>>,
    ) -> anyhow::Result<PathBuf> {
        let path = self.config.unix_socket_path();
        let group = self.config.server.socket_group.as_ref().and(self.group);
        let listener = bind_unix(&path, group)?;
        println!(
            "lamina: NBD on unix {}: {}; to {}; {}",
            path.display(),
            tls_description(tls.as_ref()),
            socket_audience(&path, group),
            self.exports
        );
        tracing::info!(path = %path.display(), "serving NBD over a Unix socket");
        let (server, shutdown) = (self.server.clone(), self.shutdown.clone());
        tasks.spawn(async move { server.serve_unix_with_tls(listener, tls, shutdown).await });
        Ok(path)
    }

    /// The web page on its TCP address, unless `[web] address` is empty.
    async fn start_web(
        &self,
        tasks: &mut JoinSet<()>,
        context: crate::admin::AdminContext,
        audit: Arc<AdminAudit>,
    ) -> anyhow::Result<()> {
        let configured = &self.config.web.address;
        if configured.is_empty() {
            return Ok(());
        }
        let token_path = self.config.data_dir.join(&self.config.web.token_file);
        let token = crate::web::load_or_create_token(&token_path)?;
        let listener = match TcpListener::bind(configured).await {
            Ok(listener) => listener,
            // The page is a convenience: a default port someone else holds
            // (another daemon on this host) must not keep the volumes from
            // being served. An address the config names must work.
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && configured == crate::config::DEFAULT_WEB_ADDRESS =>
            {
                println!(
                    "lamina: web page not on tcp {configured} (in use; set [web] address); on the admin socket only"
                );
                tracing::warn!(address = %configured, "web page address in use: serving the page on the admin socket only");
                return Ok(());
            }
            Err(error) => {
                return Err(anyhow::Error::new(error)
                    .context(format!("cannot listen on {configured} ([web] address)")));
            }
        };
        let address = listener.local_addr()?;
        let reach = if address.ip().is_loopback() {
            "processes on this host (loopback); changes need the token"
        } else {
            "any host that reaches it; every request needs the token"
        };
        println!(
            "lamina: web page on http://{address}/: plain HTTP; to {reach} (open http://{address}/#token=TOKEN with the token in {})",
            token_path.display()
        );
        let router = crate::web::tcp_router(context, audit, address, token);
        let shutdown = self.shutdown.clone();
        tasks.spawn(async move {
            let service = router.into_make_service_with_connect_info::<std::net::SocketAddr>();
            if let Err(error) = axum::serve(listener, service)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
            {
                tracing::error!(%error, "web page stopped");
            }
        });
        Ok(())
    }

    /// The admin API on its socket, gated by the peer's credentials; returns
    /// the socket's path.
    fn start_admin(
        &self,
        tasks: &mut JoinSet<()>,
        context: crate::admin::AdminContext,
        audit: Arc<AdminAudit>,
    ) -> anyhow::Result<PathBuf> {
        let path = self.config.data_dir.join(ADMIN_SOCKET_FILE);
        let group = self.config.server.admin_group.as_ref().and(self.group);
        let socket = bind_unix(&path, group)?;
        let owner_uid = std::fs::metadata(&path)?.uid();
        let root = if owner_uid == 0 { "" } else { ", root" };
        println!(
            "lamina: admin API on unix {}: to uid {owner_uid}{root}{} (checked per connection); changing requests audited",
            path.display(),
            group
                .map(|gid| format!(" and group {gid}"))
                .unwrap_or_default()
        );
        // The web page is served on the admin socket too, behind the same gate.
        let router = crate::admin::router(context.clone(), audit.clone())
            .merge(crate::web::admin_socket_router(context, audit.clone()));
        let listener = AdminListener {
            listener: socket,
            gate: AdminGate { owner_uid, group },
            audit,
        };
        let shutdown = self.shutdown.clone();
        tasks.spawn(async move {
            let service = router.into_make_service_with_connect_info::<AdminPeer>();
            if let Err(error) = axum::serve(listener, service)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
            {
                tracing::error!(%error, "admin API stopped");
            }
        });
        Ok(path)
    }
}

/// Runs the daemon until a signal asks it to stop; SIGHUP has nothing to
/// reload.
/// The threads that serve NBD connections (`[server] connection_threads`;
/// none when it is 0).
fn start_connection_threads(config: &Config) -> anyhow::Result<Option<Arc<ConnectionThreads>>> {
    let count = config
        .server
        .connection_threads
        .unwrap_or_else(ConnectionThreads::default_count);
    if count == 0 {
        tracing::info!("NBD connections served on the daemon's shared runtime");
        return Ok(None);
    }
    let options = ConnectionThreadOptions {
        idle_spin_us: config.server.connection_thread_idle_spin_us,
        ready: Some(Arc::new(lamina_device::thread_has_device_completions)),
    };
    let threads =
        ConnectionThreads::start(count, options).context("starting the NBD connection threads")?;
    tracing::info!(
        connection_threads = count,
        idle_spin_us = config.server.connection_thread_idle_spin_us,
        "NBD connections served on threads of their own"
    );
    Ok(Some(Arc::new(threads)))
}

pub async fn run(config: Config) -> anyhow::Result<()> {
    run_service(config, ReloadSource::default()).await
}

/// Runs the daemon until a signal asks it to stop, reloading `reload`'s
/// configuration file on SIGHUP.
pub async fn run_service(config: Config, reload: ReloadSource) -> anyhow::Result<()> {
    config
        .check_exposure()
        .map_err(|error| anyhow::anyhow!(error))?;
    let tls = load_tls(&config)?;
    let group = configured_group(&config)?;
    let _lock = store::lock_directory(&config.data_dir)?;
    protect_data_directory(&config.data_dir, group)?;
    let crate::arrays::OpenedPool { pool, layout } = open_or_create(&config).await?;
    let open_exports = crate::export::OpenExports::default();
    let volume_statistics = Arc::new(crate::volume_statistics::VolumeStatistics::new(
        config.server.volume_latency_histograms,
    ));
    let catalog = Arc::new(PoolCatalog {
        pool: pool.clone(),
        open_exports: open_exports.clone(),
        statistics: Some(volume_statistics.clone()),
    });
    let server_config = config.server.server_config();
    let mut server =
        NbdServer::new(catalog, server_config).map_err(|error| anyhow::anyhow!("{error}"))?;
    let access = access_policy(&config, group)?;
    server = server.with_access_policy(access.clone());
    // Stopped only after the pool is closed: the batch writes its connections
    // started run on these threads.
    let connection_threads = start_connection_threads(&config)?;
    if let Some(threads) = &connection_threads {
        server = server.with_connection_threads(threads.clone());
    }
    let server = Arc::new(server);
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();

    let listeners = Listeners {
        config: &config,
        server: &server,
        shutdown: &shutdown,
        exports: exports_description(&config),
        group,
    };
    listeners.start_tcp(&mut tasks, tls.tcp).await?;
    let unix_path = listeners.start_unix(&mut tasks, tls.unix)?;
    let context = crate::admin::AdminContext {
        pool: pool.clone(),
        layout,
        open_exports,
        nbd_server: Some(server.clone()),
        volume_statistics: Some(volume_statistics.clone()),
        default_compression: config.pool.compression,
        devices: crate::devices::DeviceContext {
            data_dir: config.data_dir.clone(),
            models: config.device_models(),
        },
    };
    // A rebuild resumed at open: `pool.toml` is brought up to date when it
    // ends.
    crate::devices::follow_rebuild(
        pool.clone(),
        context.layout.clone(),
        config.data_dir.clone(),
    );
    let audit = Arc::new(AdminAudit::default());
    let admin_path = listeners.start_admin(&mut tasks, context.clone(), audit.clone())?;
    listeners.start_web(&mut tasks, context, audit).await?;
    tasks.spawn(volume_statistics.run_sampler(pool.clone(), shutdown.clone()));
    // The memory cache's contents of the last run load behind client I/O.
    crate::cache_contents::warm(&pool, &config.data_dir);
    tasks.spawn(crate::cache_contents::run_recorder(
        pool.clone(),
        config.data_dir.clone(),
        shutdown.clone(),
    ));
    let volumes = pool.list_volumes();
    tracing::info!(
        volumes = volumes.len(),
        exports = %volumes.iter().map(|volume| volume.name.as_str()).collect::<Vec<_>>().join(","),
        "lamina is ready"
    );

    // Handlers first: a SIGHUP sent as soon as READY=1 arrives must reload,
    // not kill.
    let signals = StopSignals::register()?;
    systemd::notify_ready(&format!("serving {} volumes", volumes.len()));
    signals.wait(Reloader::new(reload, access)).await;
    systemd::notify_stopping();
    shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    pool.close()
        .await
        .context("flushing the pool at shutdown")?;
    drop(server);
    drop(connection_threads);
    crate::cache_contents::record_at_shutdown(&pool, &config.data_dir);
    let _ = std::fs::remove_file(&unix_path);
    let _ = std::fs::remove_file(&admin_path);
    tracing::info!("stopped cleanly");
    Ok(())
}

/// The signals the daemon handles once it serves.
struct StopSignals {
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn register() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// Waits for SIGINT or SIGTERM, reloading the configuration on each
    /// SIGHUP meanwhile.
    async fn wait(mut self, mut reloader: Reloader) {
        loop {
            tokio::select! {
                _ = self.interrupt.recv() => {
                    tracing::info!("SIGINT: shutting down");
                    return;
                }
                _ = self.terminate.recv() => {
                    tracing::info!("SIGTERM: shutting down");
                    return;
                }
                _ = self.hangup.recv() => reloader.reload(),
            }
        }
    }
}
