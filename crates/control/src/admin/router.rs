//! The admin API's HTTP routes on the admin socket: `POST /v1/operations`
//! (one [`Operation`] as the body, its [`super::answer::Answer`] or an
//! [`OperationError`] back; changing operations audited with the peer),
//! `GET /v1/health` and `GET /metrics`.

use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::{Json, Router};

use super::audit::AdminAudit;
use super::operation::{Operation, OperationError};
use super::operations::{AdminContext, execute};
use super::peer::AdminPeer;

/// What the daemon's admin handlers share: the operations' context and the audit.
#[derive(Clone)]
struct Served {
    context: AdminContext,
    audit: Arc<AdminAudit>,
}

/// The admin API; serve it on an [`super::listener::AdminListener`] with
/// `into_make_service_with_connect_info::<AdminPeer>()` (operations need the peer).
pub fn router(context: AdminContext, audit: Arc<AdminAudit>) -> Router {
    Router::new()
        .route("/v1/operations", post(operations))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(Served { context, audit })
}

async fn operations(
    State(served): State<Served>,
    ConnectInfo(peer): ConnectInfo<AdminPeer>,
    Json(operation): Json<Operation>,
) -> impl IntoResponse {
    let audited = operation.changes_state().then(|| operation.clone());
    let result = execute(&served.context, operation).await;
    if let Some(operation) = audited {
        let outcome = match &result {
            Ok(_) => Ok(()),
            Err(error) => Err(error.error.clone()),
        };
        served.audit.record(&peer, &operation, &outcome);
    }
    match result {
        Ok(answer) => (StatusCode::OK, Json(answer.to_json_value())).into_response(),
        Err(error) => refused(error).into_response(),
    }
}

/// A refused operation's answer: its status and the error as JSON.
pub(crate) fn refused(error: OperationError) -> impl IntoResponse {
    (
        StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        Json(error),
    )
}

async fn health() -> &'static str {
    "ok\n"
}

/// Pool and volume figures in the Prometheus text format.
async fn metrics(State(served): State<Served>) -> impl IntoResponse {
    let text = super::metrics::metrics_text(&served.context, &served.audit);
    ([("content-type", "text/plain; version=0.0.4")], text)
}
