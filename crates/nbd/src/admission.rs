//! Admission of connections that are still in the handshake: who the peer is
//! (TCP address or Unix uid), the registry of handshakes in progress with its
//! total and per-peer limits, and the choice of which half-open connection to
//! close when a limit is reached. Transmission slots (`connections_max`) are not
//! kept here: a connection only takes one when its handshake completes, so
//! half-open connections can never keep a finished client out.
//!
//! **Policy at a limit.** A new connection is never refused for lack of a
//! handshake slot; the oldest handshake of the peer that holds the most (the new
//! connection's own peer when it is at `handshakes_per_peer_max`) is closed
//! instead. A real client finishes its handshake in a few round trips, so the
//! oldest half-open connection is almost surely a stalled one; refusing the new
//! connection instead would let anyone who opens connections and sends nothing
//! keep every slot until the handshake timeout, reopening them as they expire.
//! Taking from the greediest peer means a peer never loses a handshake to
//! another peer that holds fewer.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Who is at the other end of a connection, as far as limits are concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerKey {
    /// A TCP peer's IP address (IPv4-mapped IPv6 addresses as IPv4).
    Address(IpAddr),
    /// A Unix-socket peer's user id (`SO_PEERCRED`).
    Uid(u32),
    /// A peer whose identity could not be read; all such peers share one key.
    Unknown,
}

impl std::fmt::Display for PeerKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerKey::Address(address) => write!(formatter, "{address}"),
            PeerKey::Uid(uid) => write!(formatter, "unix uid {uid}"),
            PeerKey::Unknown => write!(formatter, "unknown peer"),
        }
    }
}

/// Why a handshake in progress was closed to make room for a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvictionReason {
    /// Its peer already held `handshakes_per_peer_max` handshakes.
    PeerLimit,
    /// `handshakes_in_progress_max` handshakes were in progress.
    TotalLimit,
}

/// A handshake closed by [`Handshakes::admit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Eviction {
    pub peer: PeerKey,
    pub reason: EvictionReason,
}

#[derive(Default)]
struct Registry {
    /// Per peer, its handshakes in progress by connection number (oldest first);
    /// cancelling the token closes that connection.
    by_peer: HashMap<PeerKey, BTreeMap<u64, CancellationToken>>,
    in_progress: usize,
    next_connection: u64,
}

impl Registry {
    fn remove(&mut self, peer: PeerKey, connection: u64) -> Option<CancellationToken> {
        let handshakes = self.by_peer.get_mut(&peer)?;
        let token = handshakes.remove(&connection)?;
        if handshakes.is_empty() {
            self.by_peer.remove(&peer);
        }
        self.in_progress -= 1;
        Some(token)
    }

    /// The peer to take a handshake from when every slot is taken: the one with
    /// the most, and among those the one whose oldest handshake is oldest.
    fn greediest_peer(&self) -> Option<PeerKey> {
        self.by_peer
            .iter()
            .filter_map(|(peer, handshakes)| {
                let (oldest, _) = handshakes.first_key_value()?;
                Some((handshakes.len(), std::cmp::Reverse(*oldest), *peer))
            })
            .max_by_key(|(count, oldest, _)| (*count, *oldest))
            .map(|(_, _, peer)| peer)
    }

    fn evict_oldest(&mut self, peer: PeerKey) {
        let oldest = self
            .by_peer
            .get(&peer)
            .and_then(|handshakes| handshakes.first_key_value())
            .map(|(connection, _)| *connection);
        if let Some(connection) = oldest
            && let Some(token) = self.remove(peer, connection)
        {
            token.cancel();
        }
    }
}

/// The handshakes in progress on one server, over all its listeners.
pub(crate) struct Handshakes {
    registry: Mutex<Registry>,
    in_progress_max: usize,
    per_peer_max: usize,
}

/// A connection's place among the handshakes in progress; dropping it (when
/// the handshake ends, however it ends) frees the slot.
pub(crate) struct HandshakeTicket {
    handshakes: Arc<Handshakes>,
    peer: PeerKey,
    connection: u64,
    evicted: CancellationToken,
}

impl HandshakeTicket {
    /// Completes when this handshake was closed to make room for another.
    pub async fn evicted(&self) {
        self.evicted.cancelled().await;
    }
}

impl Drop for HandshakeTicket {
    fn drop(&mut self) {
        // An evicted handshake was already removed.
        let _ = self.handshakes.lock().remove(self.peer, self.connection);
    }
}

/// A new connection's ticket, and the handshake closed to make room for it.
pub(crate) struct Admission {
    pub ticket: HandshakeTicket,
    pub eviction: Option<Eviction>,
}

impl Handshakes {
    pub fn new(in_progress_max: usize, per_peer_max: usize) -> Self {
        assert!(in_progress_max >= 1 && (1..=in_progress_max).contains(&per_peer_max));
        Handshakes {
            registry: Mutex::new(Registry::default()),
            in_progress_max,
            per_peer_max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        // The registry is consistent after every statement that can panic.
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Handshakes in progress right now.
    pub fn in_progress(&self) -> usize {
        self.lock().in_progress
    }

    /// Registers a new connection from `peer`, first closing the handshake the
    /// module's policy picks when a limit is reached.
    pub fn admit(self: &Arc<Self>, peer: PeerKey) -> Admission {
        let mut registry = self.lock();
        let peer_count = registry.by_peer.get(&peer).map_or(0, BTreeMap::len);
        let eviction = if peer_count >= self.per_peer_max {
            Some(Eviction {
                peer,
                reason: EvictionReason::PeerLimit,
            })
        } else if registry.in_progress >= self.in_progress_max {
            registry.greediest_peer().map(|greediest| Eviction {
                peer: greediest,
                reason: EvictionReason::TotalLimit,
            })
        } else {
            None
        };
        if let Some(eviction) = eviction {
            registry.evict_oldest(eviction.peer);
        }
        let connection = registry.next_connection;
        registry.next_connection += 1;
        let evicted = CancellationToken::new();
        registry
            .by_peer
            .entry(peer)
            .or_default()
            .insert(connection, evicted.clone());
        registry.in_progress += 1;
        assert!(registry.in_progress <= self.in_progress_max);
        Admission {
            ticket: HandshakeTicket {
                handshakes: Arc::clone(self),
                peer,
                connection,
                evicted,
            },
            eviction,
        }
    }
}

/// Lets one warning through per interval and counts the ones held back, so that
/// a flood of connections cannot flood the log.
pub(crate) struct RateLimitedWarning {
    interval: Duration,
    state: Mutex<WarningState>,
}

#[derive(Default)]
struct WarningState {
    last_logged: Option<Instant>,
    suppressed: u64,
}

impl RateLimitedWarning {
    pub fn new(interval: Duration) -> Self {
        RateLimitedWarning {
            interval,
            state: Mutex::new(WarningState::default()),
        }
    }

    /// `Some(warnings held back since the last one)` when a warning may be
    /// logged now, `None` when it must be held back.
    pub fn allow(&self) -> Option<u64> {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        match state.last_logged {
            Some(last) if now.duration_since(last) < self.interval => {
                state.suppressed += 1;
                None
            }
            _ => {
                state.last_logged = Some(now);
                Some(std::mem::take(&mut state.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(last: u8) -> PeerKey {
        PeerKey::Address(IpAddr::from([127, 0, 0, last]))
    }

    #[test]
    fn a_peer_at_its_limit_loses_its_own_oldest_handshake() {
        let handshakes = Arc::new(Handshakes::new(8, 2));
        let first = handshakes.admit(address(2));
        let second = handshakes.admit(address(2));
        let other = handshakes.admit(address(1));
        assert!(first.eviction.is_none() && second.eviction.is_none());
        let third = handshakes.admit(address(2));
        assert_eq!(
            third.eviction,
            Some(Eviction {
                peer: address(2),
                reason: EvictionReason::PeerLimit
            })
        );
        assert!(first.ticket.evicted.is_cancelled());
        assert!(!second.ticket.evicted.is_cancelled());
        assert!(!other.ticket.evicted.is_cancelled());
        assert_eq!(handshakes.in_progress(), 3);
        drop(first);
        assert_eq!(
            handshakes.in_progress(),
            3,
            "an evicted ticket was already freed"
        );
        drop(second);
        drop(third);
        drop(other);
        assert_eq!(handshakes.in_progress(), 0);
        assert!(handshakes.lock().by_peer.is_empty());
    }

    #[test]
    fn at_the_total_limit_the_greediest_peer_loses_its_oldest() {
        let handshakes = Arc::new(Handshakes::new(4, 3));
        let lone = handshakes.admit(address(1));
        let greedy: Vec<Admission> = (0..3).map(|_| handshakes.admit(address(2))).collect();
        let newcomer = handshakes.admit(address(3));
        assert_eq!(
            newcomer.eviction,
            Some(Eviction {
                peer: address(2),
                reason: EvictionReason::TotalLimit
            })
        );
        assert!(greedy[0].ticket.evicted.is_cancelled());
        assert!(!greedy[1].ticket.evicted.is_cancelled());
        assert!(!lone.ticket.evicted.is_cancelled());
        // Ties go to the peer whose oldest handshake is oldest.
        let second_newcomer = handshakes.admit(address(4));
        assert_eq!(second_newcomer.eviction.unwrap().peer, address(2));
        let third_newcomer = handshakes.admit(address(5));
        assert_eq!(third_newcomer.eviction.unwrap().peer, address(1));
        assert!(lone.ticket.evicted.is_cancelled());
        assert_eq!(handshakes.in_progress(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn warnings_are_let_through_once_per_interval() {
        let warning = RateLimitedWarning::new(Duration::from_secs(10));
        assert_eq!(warning.allow(), Some(0));
        assert_eq!(warning.allow(), None);
        assert_eq!(warning.allow(), None);
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(warning.allow(), Some(2));
        assert_eq!(warning.allow(), None);
    }
}
