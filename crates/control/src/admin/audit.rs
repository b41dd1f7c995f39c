//! The admin socket's audit: every operation that changes the pool is logged
//! with who asked (the peer's uid, gid and pid on the admin socket, or the
//! address of the web page's TCP client; target `lamina::audit`), and
//! counted by operation and outcome, with the connections the gate refused,
//! for `/metrics`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use super::operation::Operation;
use super::peer::AdminPeer;

/// What the admin socket has refused and done: connections from peers the
/// gate does not admit, and changing operations by name and outcome.
#[derive(Debug, Default)]
pub struct AdminAudit {
    refused_connections: AtomicU64,
    operations: Mutex<BTreeMap<OperationOutcome, u64>>,
}

/// An operation's name and whether it succeeded: what the audit counts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct OperationOutcome {
    pub operation: String,
    pub succeeded: bool,
}

/// How often one [`OperationOutcome`] happened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperationCount {
    pub outcome: OperationOutcome,
    pub count: u64,
}

impl AdminAudit {
    pub(crate) fn record(
        &self,
        peer: &AdminPeer,
        operation: &Operation,
        outcome: &Result<(), String>,
    ) {
        let name = operation.name();
        let detail = serde_json::to_string(operation).unwrap_or_default();
        match outcome {
            Ok(()) => {
                tracing::info!(target: "lamina::audit", uid = peer.uid, gid = peer.gid, pid = peer.pid, operation = %name, request = %detail, outcome = "ok", "admin operation")
            }
            Err(error) => {
                tracing::info!(target: "lamina::audit", uid = peer.uid, gid = peer.gid, pid = peer.pid, operation = %name, request = %detail, outcome = "error", %error, "admin operation")
            }
        }
        self.count(name, outcome.is_ok());
    }

    /// Logs and counts a changing operation from the web page's TCP listener.
    pub(crate) fn record_from_address(
        &self,
        address: std::net::SocketAddr,
        operation: &Operation,
        outcome: &Result<(), String>,
    ) {
        let name = operation.name();
        let detail = serde_json::to_string(operation).unwrap_or_default();
        match outcome {
            Ok(()) => {
                tracing::info!(target: "lamina::audit", %address, operation = %name, request = %detail, outcome = "ok", "admin operation from the web page")
            }
            Err(error) => {
                tracing::info!(target: "lamina::audit", %address, operation = %name, request = %detail, outcome = "error", %error, "admin operation from the web page")
            }
        }
        self.count(name, outcome.is_ok());
    }

    /// Logs and counts a connection the gate refused.
    pub(crate) fn record_refused(&self, peer: &AdminPeer) {
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(target: "lamina::audit", uid = peer.uid, gid = peer.gid, pid = peer.pid, "admin connection refused: not the owner, root or a member of admin_group");
    }

    fn count(&self, operation: String, succeeded: bool) {
        let mut operations = self
            .operations
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let outcome = OperationOutcome {
            operation,
            succeeded,
        };
        *operations.entry(outcome).or_insert(0) += 1;
    }

    /// Connections refused because the peer is not the owner, root or in the group.
    pub fn refused_connection_count(&self) -> u64 {
        self.refused_connections.load(Ordering::Relaxed)
    }

    /// The changing operations counted so far, by name and outcome (in that order).
    pub fn operation_counts(&self) -> Vec<OperationCount> {
        self.operations
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .iter()
            .map(|(outcome, count)| OperationCount {
                outcome: outcome.clone(),
                count: *count,
            })
            .collect()
    }
}
