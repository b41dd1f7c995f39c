//! The admin API: the operations of `lamina volume ...` (including tier
//! policies and tier statistics), `lamina snapshot ...`, `lamina clone`,
//! `lamina pool status|scrub` and `lamina device ...`, executed against a
//! pool, either by the daemon (HTTP + JSON on the Unix socket
//! `DIR/admin.sock`, `POST /v1/operations` with one [`Operation`] as the
//! body) or directly by the CLI when no daemon runs. One [`execute`] serves
//! both, so the two paths cannot drift apart, and answers with a typed
//! [`Answer`]. The daemon's socket admits only its owner, root and a
//! configured group ([`AdminListener`], checked with `SO_PEERCRED`), and
//! every operation that changes something is logged with the peer's uid (an
//! audit line, target `lamina::audit`) and counted on `/metrics`.
//!
//! By role: `operation` (what is asked, and refusals), `answer` (what is
//! answered), `operations` (running them), `peer` and `listener` (who may
//! connect), `audit` (what was refused and done), `router` (the HTTP routes)
//! and `metrics` (the `/metrics` page).

mod answer;
mod audit;
mod listener;
mod metrics;
mod operation;
mod operations;
mod peer;
mod router;

pub use answer::{Answer, AnswerKind, UnexpectedAnswer};
pub use audit::{AdminAudit, OperationCount, OperationOutcome};
pub use listener::AdminListener;
pub use operation::{Operation, OperationError, VOLUME_IN_USE_KIND};
pub(crate) use operations::volume_names;
pub use operations::{AdminContext, execute};
pub use peer::{AdminGate, AdminPeer};
pub(crate) use router::refused;
pub use router::router;
