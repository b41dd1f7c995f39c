//! What a completed handshake hands to the transmission phase. A module of its
//! own so that the handshake produces it and transmission consumes it without
//! either depending on the other.

use std::sync::Arc;

use tokio::sync::OwnedSemaphorePermit;

use crate::backend::{Export, ExportSummary};
use crate::wire::TransmissionContext;

/// What the handshake agreed on, enough to run the transmission phase.
pub(crate) struct Negotiated {
    pub export: Arc<dyn Export>,
    pub summary: ExportSummary,
    pub context: TransmissionContext,
    /// The connection's transmission slot (`connections_max`), when the server
    /// limits connections; released when the transmission phase ends.
    pub transmission_slot: Option<OwnedSemaphorePermit>,
}
