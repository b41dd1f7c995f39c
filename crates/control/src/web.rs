//! The management web page: one static page (HTML, JavaScript and CSS
//! embedded in the binary, no build step, nothing fetched from elsewhere) and
//! the two JSON endpoints it uses, `GET /v1/web/overview` (pool, its health
//! badge, devices, tiers, volumes, snapshots, the per-second I/O samples) and
//! `POST /v1/web/operations` (an admin [`Operation`] with `"confirmed": true`
//! for anything that changes the pool). Served on the admin socket (behind its
//! `SO_PEERCRED` gate) and on a TCP address, loopback by default. Over TCP
//! every changing operation needs the token of `[web] token_file` (any local
//! user reaches a loopback port, and the admin socket admits only its owner,
//! root and its group), reads need it too when the address is not loopback,
//! and on loopback the `Host` header must name loopback (so a web site that
//! rebinds its DNS name to 127.0.0.1 gets nothing).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use axum::Json;
use axum::Router;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};

use crate::admin::{AdminAudit, AdminContext, AdminPeer, Operation, execute};
use crate::volume_statistics::{SAMPLE_INTERVAL_MS, Sample};

mod health;

pub use health::{HealthReason, HealthState, PoolHealth};

const INDEX_HTML: &str = include_str!("web/index.html");
const APP_JS: &str = include_str!("web/app.js");
const STYLE_CSS: &str = include_str!("web/style.css");

/// Bytes of randomness in a generated token (hex-encoded in the file).
const TOKEN_BYTES: usize = 32;
/// Mode of the token file: the daemon's user only.
const TOKEN_FILE_MODE: u32 = 0o600;

/// Who sent a web request, as the handlers see it.
#[derive(Clone, Copy, Debug)]
enum Requester {
    /// A peer of the admin socket (already admitted by its gate).
    AdminSocket(AdminPeer),
    /// A TCP client; `authenticated` when it presented the token.
    Tcp {
        address: SocketAddr,
        authenticated: bool,
    },
}

impl Requester {
    fn may_change(&self) -> bool {
        match self {
            Requester::AdminSocket(_) => true,
            Requester::Tcp { authenticated, .. } => *authenticated,
        }
    }
}

/// What the web handlers share.
#[derive(Clone)]
struct WebState {
    context: AdminContext,
    audit: Arc<AdminAudit>,
}

/// What the TCP listener checks before any handler runs.
#[derive(Clone)]
struct TcpGuard {
    token: Arc<str>,
    /// Reads need the token too (an address that is not loopback).
    token_for_reads: bool,
    /// `Host` values accepted on a loopback listener; empty: any.
    allowed_hosts: Arc<[String]>,
}

/// The page's routes with their handlers, without a gate.
fn routes(state: WebState) -> Router<()> {
    Router::new()
        .route("/", get(index))
        .route("/web/app.js", get(app_js))
        .route("/web/style.css", get(style_css))
        .route("/v1/web/overview", get(overview))
        .route("/v1/web/operations", post(operations))
        .with_state(state)
}

/// The page on the admin socket: every admitted peer may read and act.
pub fn admin_socket_router(context: AdminContext, audit: Arc<AdminAudit>) -> Router<()> {
    routes(WebState { context, audit }).layer(axum::middleware::from_fn(
        |ConnectInfo(peer): ConnectInfo<AdminPeer>, mut request: Request, next: Next| async move {
            request
                .extensions_mut()
                .insert(Requester::AdminSocket(peer));
            next.run(request).await
        },
    ))
}

/// The page on a TCP listener bound to `address`, guarded by `token`.
pub fn tcp_router(
    context: AdminContext,
    audit: Arc<AdminAudit>,
    address: SocketAddr,
    token: String,
) -> Router<()> {
    let loopback = address.ip().is_loopback();
    let port = address.port();
    let allowed_hosts: Vec<String> = if loopback {
        ["127.0.0.1", "localhost", "[::1]"]
            .iter()
            .map(|host| format!("{host}:{port}"))
            .collect()
    } else {
        Vec::new()
    };
    let guard = TcpGuard {
        token: token.into(),
        token_for_reads: !loopback,
        allowed_hosts: allowed_hosts.into(),
    };
    routes(WebState { context, audit }).layer(axum::middleware::from_fn_with_state(guard, tcp_gate))
}

/// Refuses a wrong `Host` on loopback and a missing token where reads need
/// one; marks requests that carry the token.
async fn tcp_gate(
    State(guard): State<TcpGuard>,
    ConnectInfo(address): ConnectInfo<SocketAddr>,
    mut request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    if !guard.allowed_hosts.is_empty() {
        let host = headers
            .get(header::HOST)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default();
        if !guard.allowed_hosts.iter().any(|allowed| allowed == host) {
            return (
                StatusCode::FORBIDDEN,
                format!(
                    "the web page answers only to {}\n",
                    guard.allowed_hosts.join(", ")
                ),
            )
                .into_response();
        }
    }
    let authenticated = bearer_token(headers)
        .is_some_and(|presented| same_secret(presented.as_bytes(), guard.token.as_bytes()));
    let is_page_asset = matches!(request.uri().path(), "/" | "/web/app.js" | "/web/style.css");
    if guard.token_for_reads && !authenticated && !is_page_asset {
        return unauthorized();
    }
    request.extensions_mut().insert(Requester::Tcp {
        address,
        authenticated,
    });
    next.run(request).await
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

/// Compares secrets in time independent of where they differ.
fn same_secret(presented: &[u8], expected: &[u8]) -> bool {
    presented.len() == expected.len()
        && presented
            .iter()
            .zip(expected)
            .fold(0u8, |difference, (a, b)| difference | (a ^ b))
            == 0
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        Json(serde_json::json!({
            "status": 401,
            "error": "this needs the web token: open the page as http://ADDRESS/#token=TOKEN with the contents of the data directory's web.token ([web] token_file)",
            "kind": "token_required",
        })),
    )
        .into_response()
}

async fn index() -> impl IntoResponse {
    static_file("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> impl IntoResponse {
    static_file("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> impl IntoResponse {
    static_file("text/css; charset=utf-8", STYLE_CSS)
}

fn static_file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            // Everything the page loads comes from here.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; frame-ancestors 'none'",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        body,
    )
        .into_response()
}

/// One volume's samples, oldest first.
#[derive(Debug, Serialize, Deserialize)]
pub struct VolumeHistory {
    pub volume: String,
    pub samples: Vec<Sample>,
}

/// What the page shows, in one answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct Overview {
    pub pool: serde_json::Value,
    /// The badge: what `pool status` warns about, decided from `pool`.
    pub health: PoolHealth,
    pub volumes: serde_json::Value,
    pub snapshots: serde_json::Value,
    pub sample_interval_ms: u64,
    pub latency_histograms: bool,
    pub history: Vec<VolumeHistory>,
}

async fn overview(State(state): State<WebState>) -> Response {
    match build_overview(&state.context).await {
        Ok(overview) => Json(overview).into_response(),
        Err(error) => (
            StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            Json(error),
        )
            .into_response(),
    }
}

async fn build_overview(context: &AdminContext) -> Result<Overview, crate::admin::OperationError> {
    let pool = execute(context, Operation::PoolStatus).await?;
    let pool_json = pool.to_json_value();
    let status = lamina_api::PoolStatus::try_from(pool).expect("pool_status answers a pool status");
    let volumes = execute(context, Operation::VolumeList)
        .await?
        .to_json_value();
    let snapshots = execute(context, Operation::SnapshotList { volume: None })
        .await?
        .to_json_value();
    let statistics = context.volume_statistics.as_ref();
    let history = crate::admin::volume_names(&context.pool)
        .into_iter()
        .map(|(volume_id, volume)| VolumeHistory {
            samples: statistics
                .map(|statistics| statistics.samples(volume_id))
                .unwrap_or_default(),
            volume,
        })
        .collect();
    Ok(Overview {
        health: health::pool_health(&status),
        pool: pool_json,
        volumes,
        snapshots,
        sample_interval_ms: SAMPLE_INTERVAL_MS,
        latency_histograms: statistics.is_some_and(|statistics| statistics.latency_histograms()),
        history,
    })
}

/// A request of the page's action buttons.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebOperation {
    /// The user confirmed it (required for operations that change the pool).
    #[serde(default)]
    pub confirmed: bool,
    pub operation: Operation,
}

async fn operations(
    State(state): State<WebState>,
    axum::Extension(requester): axum::Extension<Requester>,
    Json(request): Json<WebOperation>,
) -> Response {
    let operation = request.operation;
    let changes = operation.changes_state();
    if changes && !requester.may_change() {
        return unauthorized();
    }
    if changes && !request.confirmed {
        return (
            StatusCode::PRECONDITION_REQUIRED,
            Json(serde_json::json!({
                "status": 428,
                "error": format!("{} changes the pool: confirm it (\"confirmed\": true)", operation.name()),
                "kind": "confirmation_required",
            })),
        )
            .into_response();
    }
    let audited = changes.then(|| operation.clone());
    let result = execute(&state.context, operation).await;
    if let Some(operation) = audited {
        let outcome = result
            .as_ref()
            .map(|_| ())
            .map_err(|error| error.error.clone());
        match requester {
            Requester::AdminSocket(peer) => state.audit.record(&peer, &operation, &outcome),
            Requester::Tcp { address, .. } => state
                .audit
                .record_from_address(address, &operation, &outcome),
        }
    }
    match result {
        Ok(answer) => Json(answer.to_json_value()).into_response(),
        Err(error) => crate::admin::refused(error).into_response(),
    }
}

/// The token in `path`, created with a random one (mode 0600) when missing.
pub fn load_or_create_token(path: &Path) -> anyhow::Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(text) = std::fs::read_to_string(path) {
        let token = text.trim().to_string();
        anyhow::ensure!(
            token.len() >= 16,
            "the web token in {} is shorter than 16 characters",
            path.display()
        );
        return Ok(token);
    }
    let mut bytes = [0u8; TOKEN_BYTES];
    rand::fill(&mut bytes);
    let token: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(TOKEN_FILE_MODE)
        .open(path)
        .with_context(|| format!("cannot create the web token file {}", path.display()))?;
    std::io::Write::write_all(&mut file, format!("{token}\n").as_bytes())
        .with_context(|| format!("cannot write the web token file {}", path.display()))?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
    }

    #[test]
    fn a_token_is_created_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("web.token");
        let token = load_or_create_token(&path).unwrap();
        assert_eq!(token.len(), TOKEN_BYTES * 2);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, TOKEN_FILE_MODE);
        assert_eq!(load_or_create_token(&path).unwrap(), token);
    }
}
