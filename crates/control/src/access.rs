//! Who may reach what: the `[[access]]` rules of the config (which clients may
//! open which exports, read-write or read-only) as the NBD server's
//! [`AccessPolicy`]; the gate that lets a plain loopback TCP client in only
//! when it could have used the Unix socket or a rule names it
//! ([`LoopbackGate`], issue 42, decision 0057); and the Unix group helpers the
//! daemon uses for socket ownership and for admitting admin API clients (a
//! configured group given by name or number; a peer's supplementary groups
//! read from `/proc`, a user's from the user database).

use std::net::IpAddr;

use lamina_nbd::{Access, AccessPolicy, ClientIdentity, LoopbackOwner};
use serde::{Deserialize, Serialize};

/// What a rule grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AccessLevel {
    ReadWrite,
    ReadOnly,
}

fn read_write() -> AccessLevel {
    AccessLevel::ReadWrite
}

/// One `[[access]]` rule: the clients it matches (every identity field given
/// must match; a rule with none matches every client) and the exports it
/// grants them (`name`, `prefix*` or `*`; a snapshot is `volume@snapshot`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessRule {
    pub exports: Vec<String>,
    /// A Unix-socket client's uid (`SO_PEERCRED`), or the uid that owns a
    /// loopback TCP client's socket.
    #[serde(default)]
    pub uid: Option<u32>,
    /// A Unix-socket client's primary or supplementary group id; for a
    /// loopback TCP client, one of its uid's groups.
    #[serde(default)]
    pub gid: Option<u32>,
    /// The client certificate's subject DN, RFC 4514 order as GnuTLS prints
    /// it (`CN=alice,O=Example`); needs `tls_verify_peer`.
    #[serde(default)]
    pub certificate_dn: Option<String>,
    /// A TCP client's address, `ADDRESS` or `ADDRESS/PREFIX_LENGTH`.
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default = "read_write")]
    pub access: AccessLevel,
}

/// An address range of a rule, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AddressRange {
    network: IpAddr,
    prefix_length: u8,
}

impl AddressRange {
    fn parse(text: &str) -> Result<Self, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = address
            .parse()
            .map_err(|_| format!("address {text:?} is not an IP address or ADDRESS/PREFIX"))?;
        let bits_max = if network.is_ipv4() { 32 } else { 128 };
        let prefix_length = match prefix {
            None => bits_max,
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|length| *length <= bits_max)
                .ok_or_else(|| format!("address {text:?} has a prefix length over {bits_max}"))?,
        };
        Ok(AddressRange {
            network: network.to_canonical(),
            prefix_length,
        })
    }

    fn contains(&self, address: IpAddr) -> bool {
        let bits = |address: IpAddr| -> (u128, u32) {
            match address.to_canonical() {
                IpAddr::V4(v4) => (u128::from(u32::from(v4)) << 96, 32),
                IpAddr::V6(v6) => (u128::from(v6), 128),
            }
        };
        let ((network, network_width), (candidate, candidate_width)) =
            (bits(self.network), bits(address));
        if network_width != candidate_width {
            return false;
        }
        let prefix = u32::from(self.prefix_length);
        let mask = if prefix == 0 {
            0
        } else {
            u128::MAX << (128 - prefix)
        };
        network & mask == candidate & mask
    }
}

/// Whether `pattern` (`name`, `prefix*` or `*`) covers the export `name`.
fn export_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// A rule with its address range parsed.
#[derive(Clone, Debug)]
struct CompiledRule {
    rule: AccessRule,
    address: Option<AddressRange>,
}

/// The config's rules as the NBD server's access policy: a client gets the
/// most any matching rule grants for an export, and nothing when no rule
/// matches.
#[derive(Clone, Debug)]
pub struct AccessRules {
    rules: Vec<CompiledRule>,
}

impl AccessRules {
    /// Checks and compiles `rules`; an error names the rule (1-based) at fault.
    pub fn new(rules: &[AccessRule]) -> Result<Self, String> {
        let mut compiled = Vec::with_capacity(rules.len());
        for (index, rule) in rules.iter().enumerate() {
            let position = index + 1;
            if rule.exports.is_empty() {
                return Err(format!("[[access]] rule {position} names no exports"));
            }
            let address = rule
                .address
                .as_deref()
                .map(AddressRange::parse)
                .transpose()
                .map_err(|error| format!("[[access]] rule {position}: {error}"))?;
            compiled.push(CompiledRule {
                rule: rule.clone(),
                address,
            });
        }
        Ok(AccessRules { rules: compiled })
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Whether a rule that names a uid or a gid matches `identity` whole.
    fn names_client(&self, identity: &ClientIdentity) -> bool {
        self.rules.iter().any(|compiled| {
            (compiled.rule.uid.is_some() || compiled.rule.gid.is_some())
                && identity_matches(compiled, identity)
        })
    }
}

/// The uid the kernel names for a client: a Unix-socket peer's, or the owner
/// of a loopback TCP client's socket.
fn client_uid(identity: &ClientIdentity) -> Option<u32> {
    match (&identity.unix, &identity.loopback_owner) {
        (Some(unix), _) => Some(unix.uid),
        (None, Some(LoopbackOwner::Uid(uid))) => Some(*uid),
        _ => None,
    }
}

/// Whether the client is in group `gid`: a Unix-socket peer by its primary
/// group or its process's supplementary ones, a loopback TCP client by its
/// uid's groups in the user database.
fn client_in_group(identity: &ClientIdentity, gid: u32) -> bool {
    if let Some(unix) = identity.unix {
        return unix.gid == gid || supplementary_groups(unix.pid).contains(&gid);
    }
    match identity.loopback_owner {
        Some(LoopbackOwner::Uid(uid)) => user_groups(uid).contains(&gid),
        _ => false,
    }
}

/// Whether every identity field of `rule` matches `identity`.
fn identity_matches(compiled: &CompiledRule, identity: &ClientIdentity) -> bool {
    let rule = &compiled.rule;
    if let Some(uid) = rule.uid
        && client_uid(identity) != Some(uid)
    {
        return false;
    }
    if let Some(gid) = rule.gid
        && !client_in_group(identity, gid)
    {
        return false;
    }
    if let Some(dn) = &rule.certificate_dn
        && identity.certificate_dn.as_deref() != Some(dn.as_str())
    {
        return false;
    }
    if let Some(range) = &compiled.address
        && identity
            .address
            .is_none_or(|address| !range.contains(address))
    {
        return false;
    }
    true
}

impl AccessPolicy for AccessRules {
    fn access(&self, identity: &ClientIdentity, export_name: &str) -> Option<Access> {
        self.rules
            .iter()
            .filter(|compiled| {
                compiled
                    .rule
                    .exports
                    .iter()
                    .any(|pattern| export_matches(pattern, export_name))
            })
            .filter(|compiled| identity_matches(compiled, identity))
            .map(|compiled| match compiled.rule.access {
                AccessLevel::ReadWrite => Access::ReadWrite,
                AccessLevel::ReadOnly => Access::ReadOnly,
            })
            .max()
    }
}

/// Who may use the NBD server over loopback TCP without a verified client
/// certificate: whoever could open the NBD Unix socket (its owner, root and
/// `socket_group`) and whoever an `[[access]]` rule names by uid or gid. TCP
/// carries no credentials, but for a loopback client the kernel names the uid
/// that owns its socket; without this gate every local user would reach
/// every volume over 127.0.0.1 (issue 42, decision 0057).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopbackGate {
    /// The daemon's uid, which owns the Unix socket.
    pub owner_uid: u32,
    /// The NBD Unix socket's group, if it has one.
    pub socket_group: Option<u32>,
}

impl LoopbackGate {
    /// Whether `identity` may go on to the export rules; `Err` is what the
    /// client is told. Only plain loopback TCP clients are checked: Unix
    /// clients passed the socket's mode, remote ones need TLS or an
    /// explicit `insecure_tcp`, and a verified certificate names its holder.
    pub fn admit(
        &self,
        rules: Option<&AccessRules>,
        identity: &ClientIdentity,
    ) -> Result<(), String> {
        let Some(owner) = &identity.loopback_owner else {
            return Ok(());
        };
        if identity.certificate_dn.is_some() {
            return Ok(());
        }
        let peer = identity.address.map(|address| address.to_string());
        let uid = match owner {
            LoopbackOwner::Uid(uid) => *uid,
            LoopbackOwner::Unknown(reason) => {
                tracing::warn!(target: "lamina::audit", peer, reason, "NBD connection over loopback TCP refused: cannot tell which uid it comes from (the kernel's socket diagnostics did not answer); use the Unix socket, TLS with client certificates, or [server] tcp_loopback_uid_check = false");
                return Err(format!(
                    "this server cannot tell which user the connection comes from ({reason}), so it admits none over loopback TCP; use the Unix socket"
                ));
            }
        };
        if uid == self.owner_uid
            || uid == 0
            || self
                .socket_group
                .is_some_and(|gid| client_in_group(identity, gid))
            || rules.is_some_and(|rules| rules.names_client(identity))
        {
            return Ok(());
        }
        tracing::warn!(target: "lamina::audit", peer, uid, owner_uid = self.owner_uid, "NBD connection over loopback TCP refused: uid is not the owner, root, in socket_group or named by an [[access]] rule");
        Err(format!(
            "uid {uid} may not use this server: over loopback TCP it admits the users that may use its Unix socket and those its [[access]] rules name by uid or gid"
        ))
    }
}

/// The groups of user `uid` in the user database (primary first); empty for
/// a uid with no entry or when the database cannot be read.
pub fn user_groups(uid: u32) -> Vec<u32> {
    let Ok(Some(user)) = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) else {
        return Vec::new();
    };
    let Ok(name) = std::ffi::CString::new(user.name) else {
        return vec![user.gid.as_raw()];
    };
    match nix::unistd::getgrouplist(&name, user.gid) {
        Ok(groups) => groups.into_iter().map(|gid| gid.as_raw()).collect(),
        Err(_) => vec![user.gid.as_raw()],
    }
}

/// The supplementary groups of process `pid` (the `Groups:` line of
/// `/proc/PID/status`); empty when it cannot be read.
pub fn supplementary_groups(pid: Option<i32>) -> Vec<u32> {
    let Some(pid) = pid else {
        return Vec::new();
    };
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Vec::new();
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("Groups:"))
        .map(|groups| {
            groups
                .split_whitespace()
                .filter_map(|gid| gid.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The gid of a group given by number or by name.
pub fn resolve_group(group: &str) -> Result<u32, String> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    let name =
        std::ffi::CString::new(group).map_err(|_| format!("group {group:?} is not a name"))?;
    let mut entry = std::mem::MaybeUninit::<libc::group>::uninit();
    let mut result: *mut libc::group = std::ptr::null_mut();
    let mut buffer = vec![0 as libc::c_char; GROUP_ENTRY_BUFFER_BYTES];
    // SAFETY: every pointer is valid for the call: `name` is NUL-terminated,
    // `entry` and `result` are writable, and `buffer` is as long as passed.
    let status = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            entry.as_mut_ptr(),
            buffer.as_mut_ptr(),
            buffer.len(),
            &mut result,
        )
    };
    if status != 0 || result.is_null() {
        return Err(format!("no group named {group:?}"));
    }
    // SAFETY: getgrnam_r succeeded and `result` points at `entry`, filled.
    Ok(unsafe { entry.assume_init() }.gr_gid)
}

/// Room for one group's entry (its member list) when resolving a name.
const GROUP_ENTRY_BUFFER_BYTES: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_nbd::UnixCredentials;

    fn unix(uid: u32, gid: u32) -> ClientIdentity {
        ClientIdentity {
            unix: Some(UnixCredentials {
                uid,
                gid,
                pid: None,
            }),
            ..ClientIdentity::default()
        }
    }

    #[test]
    fn rules_grant_the_most_any_matching_rule_gives_and_nothing_otherwise() {
        let rules: Vec<AccessRule> = toml::from_str::<toml::Table>(
            r#"
            [[access]]
            exports = ["db", "db@*"]
            uid = 1000
            [[access]]
            exports = ["*"]
            gid = 50
            access = "read-only"
            [[access]]
            exports = ["web"]
            address = "10.1.0.0/16"
            [[access]]
            exports = ["web"]
            certificate_dn = "CN=alice,O=Example"
            access = "read-only"
            "#,
        )
        .unwrap()["access"]
            .clone()
            .try_into()
            .unwrap();
        let policy = AccessRules::new(&rules).unwrap();
        assert_eq!(
            policy.access(&unix(1000, 1000), "db"),
            Some(Access::ReadWrite)
        );
        assert_eq!(
            policy.access(&unix(1000, 1000), "db@monday"),
            Some(Access::ReadWrite)
        );
        assert_eq!(policy.access(&unix(1000, 1000), "dbx"), None);
        assert_eq!(
            policy.access(&unix(1000, 50), "web"),
            Some(Access::ReadOnly)
        );
        assert_eq!(
            policy.access(&unix(1000, 50), "db"),
            Some(Access::ReadWrite)
        );
        assert_eq!(policy.access(&unix(1001, 1001), "db"), None);
        let tcp = |address: &str| ClientIdentity {
            address: Some(address.parse().unwrap()),
            ..ClientIdentity::default()
        };
        assert_eq!(
            policy.access(&tcp("10.1.2.3"), "web"),
            Some(Access::ReadWrite)
        );
        assert_eq!(
            policy.access(&tcp("::ffff:10.1.2.3"), "web"),
            Some(Access::ReadWrite)
        );
        assert_eq!(policy.access(&tcp("10.2.0.1"), "web"), None);
        let mut alice = tcp("192.168.0.1");
        alice.certificate_dn = Some("CN=alice,O=Example".into());
        assert_eq!(policy.access(&alice, "web"), Some(Access::ReadOnly));
        assert_eq!(policy.access(&alice, "db"), None);
    }

    #[test]
    fn bad_rules_are_refused_with_their_position() {
        let rule = |address: &str| AccessRule {
            exports: vec!["x".into()],
            uid: None,
            gid: None,
            certificate_dn: None,
            address: Some(address.into()),
            access: AccessLevel::ReadWrite,
        };
        assert!(AccessRules::new(&[rule("10.0.0.0/8")]).is_ok());
        let error = AccessRules::new(&[rule("10.0.0.0/8"), rule("10.0.0.0/33")]).unwrap_err();
        assert!(error.contains("rule 2"), "{error}");
        assert!(AccessRules::new(&[rule("example.com")]).is_err());
        let mut empty = rule("::1");
        empty.exports.clear();
        assert!(
            AccessRules::new(&[empty])
                .unwrap_err()
                .contains("no exports")
        );
    }

    /// A plain TCP client on 127.0.0.1 whose socket `uid` owns.
    fn loopback(uid: u32) -> ClientIdentity {
        ClientIdentity {
            address: Some("127.0.0.1".parse().unwrap()),
            loopback_owner: Some(LoopbackOwner::Uid(uid)),
            ..ClientIdentity::default()
        }
    }

    fn rules(text: &str) -> AccessRules {
        let table = toml::from_str::<toml::Table>(text).unwrap();
        let rules: Vec<AccessRule> = table["access"].clone().try_into().unwrap();
        AccessRules::new(&rules).unwrap()
    }

    #[test]
    fn loopback_clients_get_in_as_the_unix_socket_would_let_them() {
        let gate = LoopbackGate {
            owner_uid: 1000,
            socket_group: Some(4242),
        };
        assert_eq!(gate.admit(None, &loopback(1000)), Ok(()));
        assert_eq!(gate.admit(None, &loopback(0)), Ok(()));
        let refused = gate.admit(None, &loopback(1001)).unwrap_err();
        assert!(refused.contains("uid 1001"), "{refused}");
        let unknown = ClientIdentity {
            loopback_owner: Some(LoopbackOwner::Unknown("no sock_diag".into())),
            ..loopback(0)
        };
        let refused = gate.admit(None, &unknown).unwrap_err();
        assert!(refused.contains("no sock_diag"), "{refused}");
        // Not this gate's: Unix clients passed the socket's mode, remote TCP
        // clients are not on this host, certificates name their holder.
        assert_eq!(gate.admit(None, &unix(1001, 1001)), Ok(()));
        let remote = ClientIdentity {
            address: Some("10.0.0.1".parse().unwrap()),
            ..ClientIdentity::default()
        };
        assert_eq!(gate.admit(None, &remote), Ok(()));
        let certified = ClientIdentity {
            certificate_dn: Some("CN=alice".into()),
            ..loopback(1001)
        };
        assert_eq!(gate.admit(None, &certified), Ok(()));
    }

    #[test]
    fn rules_naming_a_uid_or_gid_let_a_loopback_client_in_and_grant_it_exports() {
        let gate = LoopbackGate {
            owner_uid: 1000,
            socket_group: None,
        };
        let by_uid = rules("[[access]]\nexports = [\"db\"]\nuid = 1001\naccess = \"read-only\"\n");
        assert_eq!(gate.admit(Some(&by_uid), &loopback(1001)), Ok(()));
        assert_eq!(by_uid.access(&loopback(1001), "db"), Some(Access::ReadOnly));
        assert_eq!(by_uid.access(&loopback(1001), "web"), None);
        assert!(gate.admit(Some(&by_uid), &loopback(1002)).is_err());
        // An address alone names no user: it does not open the gate.
        let by_address = rules("[[access]]\nexports = [\"*\"]\naddress = \"127.0.0.1\"\n");
        assert!(gate.admit(Some(&by_address), &loopback(1001)).is_err());
        // A gid rule matches the uid's groups in the user database.
        let groups = user_groups(65534);
        let Some(&gid) = groups.first() else {
            println!("SKIPPED: uid 65534 has no entry in the user database");
            return;
        };
        let by_gid = rules(&format!("[[access]]\nexports = [\"*\"]\ngid = {gid}\n"));
        assert_eq!(gate.admit(Some(&by_gid), &loopback(65534)), Ok(()));
        assert_eq!(
            by_gid.access(&loopback(65534), "db"),
            Some(Access::ReadWrite)
        );
        assert!(gate.admit(Some(&by_gid), &loopback(1001)).is_err());
    }

    #[test]
    fn groups_resolve_by_number_and_name() {
        assert_eq!(resolve_group("1234"), Ok(1234));
        assert_eq!(resolve_group("root"), Ok(0));
        assert!(resolve_group("no-such-group-lamina").is_err());
        assert!(supplementary_groups(None).is_empty());
        assert_eq!(user_groups(0).first(), Some(&0));
    }
}
