//! `lamina serve`: opens (or, with an empty data directory, creates) the pool,
//! serves every volume over NBD on TCP and a Unix socket, serves the admin API,
//! and on SIGINT or SIGTERM stops accepting, lets in-flight requests finish,
//! flushes, checkpoints and exits 0.

use std::sync::Arc;

use anyhow::Context;
use lamina_nbd::{CancellationToken, NbdServer};
use tokio::net::{TcpListener, UnixListener};

use crate::config::Config;
use crate::export::{DEFAULT_EXPORT_NAME, PoolCatalog};
use crate::store::{self, ADMIN_SOCKET_FILE, EMBEDDED_POOL_FILE};

/// Opens the pool in the data directory, creating the embedded default when the
/// directory has none.
async fn open_or_create(config: &Config) -> anyhow::Result<crate::arrays::OpenedPool> {
    let data_dir = &config.data_dir;
    if store::read_description(data_dir)?.is_some() {
        return crate::arrays::open_pool_with_models(
            data_dir,
            config.limits.clone(),
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
        config.limits.clone(),
        &config.device_models(),
    )
    .await?;
    if config.pool.default_volume_bytes > 0 {
        pool.create_volume(DEFAULT_EXPORT_NAME, config.pool.default_volume_bytes)
            .await?;
    }
    Ok(crate::arrays::OpenedPool {
        pool,
        layout: Default::default(),
    })
}

fn bind_unix(path: &std::path::Path) -> anyhow::Result<UnixListener> {
    // A socket file left by a killed daemon is stale: the directory lock proves
    // that no live daemon owns it.
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).with_context(|| format!("cannot listen on {}", path.display()))
}

/// Runs the daemon until a signal asks it to stop.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let _lock = store::lock_directory(&config.data_dir)?;
    let crate::arrays::OpenedPool { pool, layout } = open_or_create(&config).await?;
    let open_exports = crate::export::OpenExports::default();
    let catalog = Arc::new(PoolCatalog {
        pool: pool.clone(),
        open_exports: open_exports.clone(),
    });
    let server_config = config.server.server_config();
    let server = Arc::new(
        NbdServer::new(catalog, server_config).map_err(|error| anyhow::anyhow!("{error}"))?,
    );
    let shutdown = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();

    if !config.server.tcp_address.is_empty() {
        let listener = TcpListener::bind(&config.server.tcp_address)
            .await
            .with_context(|| format!("cannot listen on {}", config.server.tcp_address))?;
        tracing::info!(address = %listener.local_addr()?, "serving NBD over TCP");
        let (server, shutdown) = (server.clone(), shutdown.clone());
        tasks.spawn(async move { server.serve_tcp(listener, shutdown).await });
    }
    let unix_path = config.unix_socket_path();
    let listener = bind_unix(&unix_path)?;
    tracing::info!(path = %unix_path.display(), "serving NBD over a Unix socket");
    {
        let (server, shutdown) = (server.clone(), shutdown.clone());
        tasks.spawn(async move { server.serve_unix(listener, shutdown).await });
    }
    let admin_path = config.data_dir.join(ADMIN_SOCKET_FILE);
    let admin_listener = bind_unix(&admin_path)?;
    {
        let router = crate::admin::router(crate::admin::AdminContext {
            pool: pool.clone(),
            layout,
            open_exports,
            nbd_server: Some(server.clone()),
        });
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            if let Err(error) = axum::serve(admin_listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
            {
                tracing::error!(%error, "admin API stopped");
            }
        });
    }
    let volumes = pool.list_volumes();
    tracing::info!(
        volumes = volumes.len(),
        exports = %volumes.iter().map(|volume| volume.name.as_str()).collect::<Vec<_>>().join(","),
        "lamina is ready"
    );

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
        _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
    }
    shutdown.cancel();
    while tasks.join_next().await.is_some() {}
    pool.close()
        .await
        .context("flushing the pool at shutdown")?;
    let _ = std::fs::remove_file(&unix_path);
    let _ = std::fs::remove_file(&admin_path);
    tracing::info!("stopped cleanly");
    Ok(())
}
