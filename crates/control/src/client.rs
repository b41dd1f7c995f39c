//! The CLI side of the admin API: sends one operation to the daemon over its
//! Unix socket, or, when no daemon is listening, opens the pool itself (under the
//! directory lock and the device layer's claims), executes the operation and
//! closes the pool cleanly. When a daemon holds the pool after all (one still
//! opening it, or one serving the same devices from another data directory),
//! the error says so and points at it.

use std::path::Path;

use anyhow::Context;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use crate::admin::{AdminContext, Answer, Operation, OperationError, execute};
use crate::arrays::open_pool;
use crate::store::{ADMIN_SOCKET_FILE, DirectoryInUse, lock_directory};
use lamina_device::{DeviceError, DeviceErrorKind};

/// Whether a daemon serves the pool in `data_dir` (its admin socket answers).
pub async fn daemon_running(data_dir: &Path) -> bool {
    UnixStream::connect(data_dir.join(ADMIN_SOCKET_FILE))
        .await
        .is_ok()
}

/// Runs `operation` against the pool in `data_dir`, through the daemon when one
/// runs, and answers with its typed document (take it out with `TryFrom`).
/// A refused operation is an [`OperationError`] (callers may downcast to it
/// for its kind), the same through the daemon and directly.
pub async fn run_operation(data_dir: &Path, operation: Operation) -> anyhow::Result<Answer> {
    let socket = data_dir.join(ADMIN_SOCKET_FILE);
    if let Ok(stream) = UnixStream::connect(&socket).await {
        return send(stream, &operation).await;
    }
    let _lock = lock_directory(data_dir).map_err(point_at_daemon)?;
    let pool = open_pool(data_dir, Default::default())
        .await
        .map_err(point_at_daemon)?;
    let context = AdminContext {
        pool: pool.pool.clone(),
        layout: pool.layout.clone(),
        open_exports: Default::default(),
        nbd_server: None,
        devices: crate::devices::DeviceContext {
            data_dir: data_dir.to_path_buf(),
            models: Default::default(),
        },
        volume_statistics: None,
        default_compression: lamina_engine::Codec::Off,
    };
    let result = execute(&context, operation).await;
    pool.pool.close().await.context("closing the pool")?;
    result.map_err(anyhow::Error::new)
}

/// Adds to an error about a pool held by another process, when that process
/// is a lamina daemon, that the daemon is the way to the pool.
fn point_at_daemon(error: anyhow::Error) -> anyhow::Error {
    for cause in error.chain() {
        if let Some(DirectoryInUse {
            holder: Some(holder),
            ..
        }) = cause.downcast_ref()
            && holder.is_lamina_daemon()
        {
            let advice = format!(
                "the pool is in use by the daemon (pid {}), which does not answer on {ADMIN_SOCKET_FILE} yet (still opening the pool?); try again shortly",
                holder.pid
            );
            return error.context(advice);
        }
        if let Some(DeviceError {
            kind: DeviceErrorKind::InUse {
                holder: Some(holder),
            },
            ..
        }) = cause.downcast_ref()
            && holder.is_lamina_daemon()
        {
            let advice = format!(
                "the pool is in use by the daemon (pid {}); use the daemon: give this command the daemon's --data directory, so that it goes through its {ADMIN_SOCKET_FILE}",
                holder.pid
            );
            return error.context(advice);
        }
    }
    error
}

/// Sends `operation` to the daemon and reads its answer as the document the
/// operation is answered with.
async fn send(stream: UnixStream, operation: &Operation) -> anyhow::Result<Answer> {
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("admin socket handshake")?;
    tokio::spawn(connection);
    let body = serde_json::to_vec(operation).expect("operation serialises");
    let request = Request::post("/v1/operations")
        .header("host", "lamina")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("valid request");
    let response = sender
        .send_request(request)
        .await
        .context("admin request")?;
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .context("admin response")?
        .to_bytes();
    if status.is_success() {
        Answer::from_json(operation.answer_kind(), &bytes)
            .context("the admin API's answer is not the document this lamina reads")
    } else {
        let error: OperationError = serde_json::from_slice(&bytes).unwrap_or(OperationError {
            status: status.as_u16(),
            error: String::from_utf8_lossy(&bytes).into_owned(),
            kind: String::new(),
        });
        Err(error.into())
    }
}
