//! Who may reach what: the `[[access]]` rules of the config (which clients may
//! open which exports, read-write or read-only) as the NBD server's
//! [`AccessPolicy`], and the Unix group helpers the daemon uses for socket
//! ownership and for admitting admin API clients (a configured group given by
//! name or number; a peer's supplementary groups read from `/proc`).

use std::net::IpAddr;

use lamina_nbd::{Access, AccessPolicy, ClientIdentity};
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
    /// A Unix-socket client's uid (`SO_PEERCRED`).
    #[serde(default)]
    pub uid: Option<u32>,
    /// A Unix-socket client's primary or supplementary group id.
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
}

/// Whether every identity field of `rule` matches `identity`.
fn identity_matches(compiled: &CompiledRule, identity: &ClientIdentity) -> bool {
    let rule = &compiled.rule;
    if let Some(uid) = rule.uid
        && identity.unix.is_none_or(|unix| unix.uid != uid)
    {
        return false;
    }
    if let Some(gid) = rule.gid {
        let Some(unix) = identity.unix else {
            return false;
        };
        if unix.gid != gid && !supplementary_groups(unix.pid).contains(&gid) {
            return false;
        }
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

    #[test]
    fn groups_resolve_by_number_and_name() {
        assert_eq!(resolve_group("1234"), Ok(1234));
        assert_eq!(resolve_group("root"), Ok(0));
        assert!(resolve_group("no-such-group-lamina").is_err());
        assert!(supplementary_groups(None).is_empty());
    }
}
