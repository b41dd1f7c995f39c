//! Who is on the other end of an admin connection (`SO_PEERCRED`) and who
//! may use the admin socket: its owner, root and the members of
//! `admin_group` (the [`AdminGate`] the listener checks every peer against).

/// Who is on the other end of an admin connection (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminPeer {
    pub uid: u32,
    pub gid: u32,
    pub pid: Option<i32>,
}

/// Who may use the admin socket: its owner (the daemon's user), root, and the
/// members of `group`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdminGate {
    pub owner_uid: u32,
    pub group: Option<u32>,
}

impl AdminGate {
    pub fn admits(&self, peer: &AdminPeer) -> bool {
        if peer.uid == self.owner_uid || peer.uid == 0 {
            return true;
        }
        self.group.is_some_and(|group| {
            peer.gid == group || crate::access::supplementary_groups(peer.pid).contains(&group)
        })
    }
}
