//! The admin socket's listener: accepts like a Unix listener, reads each
//! peer's credentials (`SO_PEERCRED`) and closes the connections of peers
//! its [`AdminGate`] does not admit before any request is read (logged and
//! counted by the audit).

use std::sync::Arc;

use super::audit::AdminAudit;
use super::peer::{AdminGate, AdminPeer};

/// The admin socket's listener: accepts like a Unix listener, but closes
/// connections from peers the gate does not admit, before any request is read.
pub struct AdminListener {
    pub listener: tokio::net::UnixListener,
    pub gate: AdminGate,
    pub audit: Arc<AdminAudit>,
}

/// Pause after a failed accept, so the loop does not spin.
const ADMIN_ACCEPT_ERROR_PAUSE_MS: u64 = 100;

impl axum::serve::Listener for AdminListener {
    type Io = tokio::net::UnixStream;
    type Addr = AdminPeer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    tracing::warn!(%error, "admin socket accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(
                        ADMIN_ACCEPT_ERROR_PAUSE_MS,
                    ))
                    .await;
                    continue;
                }
            };
            let Ok(credentials) = stream.peer_cred() else {
                continue;
            };
            let peer = AdminPeer {
                uid: credentials.uid(),
                gid: credentials.gid(),
                pid: credentials.pid(),
            };
            if self.gate.admits(&peer) {
                return (stream, peer);
            }
            self.audit.record_refused(&peer);
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(AdminPeer {
            uid: self.gate.owner_uid,
            gid: 0,
            pid: None,
        })
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, AdminListener>>
    for AdminPeer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, AdminListener>) -> Self {
        *stream.remote_addr()
    }
}
