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
    /// Logs and counts a changing operation from a peer on the admin socket.
    pub(crate) fn record(
        &self,
        peer: &AdminPeer,
        operation: &Operation,
        outcome: &Result<(), String>,
    ) {
        self.audit(operation, outcome, |entry| {
            tracing::info!(target: "lamina::audit", uid = peer.uid, gid = peer.gid, pid = peer.pid, operation = %entry.name, request = %entry.request, outcome = entry.outcome, error = entry.error(), "admin operation");
        });
    }

    /// Logs and counts a changing operation from the web page's TCP listener.
    pub(crate) fn record_from_address(
        &self,
        address: std::net::SocketAddr,
        operation: &Operation,
        outcome: &Result<(), String>,
    ) {
        self.audit(operation, outcome, |entry| {
            tracing::info!(target: "lamina::audit", %address, operation = %entry.name, request = %entry.request, outcome = entry.outcome, error = entry.error(), "admin operation from the web page");
        });
    }

    /// What [`Self::record`] and [`Self::record_from_address`] share: the
    /// entry `log` writes (each names its requester in its own fields), then
    /// the count.
    fn audit(
        &self,
        operation: &Operation,
        outcome: &Result<(), String>,
        log: impl FnOnce(&AuditEntry<'_>),
    ) {
        let entry = AuditEntry {
            name: operation.name(),
            request: serde_json::to_string(operation).unwrap_or_default(),
            outcome: if outcome.is_ok() { "ok" } else { "error" },
            error: outcome.as_ref().err(),
        };
        log(&entry);
        self.count(entry.name, outcome.is_ok());
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

/// One changing operation as the audit log writes it.
struct AuditEntry<'outcome> {
    name: String,
    /// The operation as JSON.
    request: String,
    /// `ok` or `error`.
    outcome: &'static str,
    error: Option<&'outcome String>,
}

impl AuditEntry<'_> {
    /// The error as a log field, absent from the line when the operation
    /// succeeded (as `%error` would be where there is none).
    fn error(&self) -> Option<tracing::field::DisplayValue<&String>> {
        self.error.map(tracing::field::display)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Log lines written through it, shared with the test.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the audit logs for `record` as the daemon's subscriber writes it.
    fn logged(record: impl FnOnce(&AdminAudit)) -> String {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .without_time()
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || record(&AdminAudit::default()));
        String::from_utf8(lines.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn the_audit_names_the_requester_and_the_error_only_when_there_is_one() {
        let peer = AdminPeer {
            uid: 1000,
            gid: 1001,
            pid: Some(42),
        };
        let operation = Operation::VolumeList;
        let succeeded = logged(|audit| audit.record(&peer, &operation, &Ok(())));
        assert!(
            succeeded.contains(
                "admin operation uid=1000 gid=1001 pid=42 operation=volume_list request={\"operation\":\"volume_list\"} outcome=\"ok\"\n"
            ),
            "{succeeded}"
        );
        let address: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
        let failed = logged(|audit| {
            audit.record_from_address(address, &operation, &Err("refused".to_string()));
            assert_eq!(audit.operation_counts()[0].count, 1);
        });
        assert!(
            failed.contains(
                "admin operation from the web page address=127.0.0.1:9 operation=volume_list request={\"operation\":\"volume_list\"} outcome=\"error\" error=refused\n"
            ),
            "{failed}"
        );
    }
}
