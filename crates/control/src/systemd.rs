//! Running under a service manager: readiness and state notifications over
//! `$NOTIFY_SOCKET` (systemd's `Type=notify` protocol, through the `sd-notify`
//! crate; without the variable they cost nothing), and reloading on SIGHUP the
//! parts of the configuration that can change while volumes are served — the
//! `[[access]]` rules and the `[log]` level. A change anywhere else is logged as
//! needing a restart and not applied, so that the daemon never runs with a
//! configuration it only half took.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use lamina_nbd::{Access, AccessPolicy, ClientIdentity};
use sd_notify::NotifyState;

use crate::access::{AccessRules, LoopbackGate};
use crate::config::Config;

/// The top-level keys of the configuration a SIGHUP applies; every other key
/// needs a restart.
pub const RELOADABLE_KEYS: [&str; 2] = ["access", "log"];

/// Sends `states` to the service manager, if one asked for them: a failure is
/// logged, never fatal (the daemon serves whether or not anyone listens).
fn notify(states: &[NotifyState]) {
    if let Err(error) = sd_notify::notify(states) {
        tracing::warn!(%error, "cannot notify the service manager ($NOTIFY_SOCKET)");
    }
}

/// READY=1 with a status line: the pool is open and every listener is bound.
pub fn notify_ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// STOPPING=1: the daemon stops accepting and flushes.
pub fn notify_stopping() {
    notify(&[
        NotifyState::Stopping,
        NotifyState::Status("flushing and stopping"),
    ]);
}

/// RELOADING=1 with the monotonic time systemd 253 and later ask for.
fn notify_reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => notify(&[NotifyState::Reloading, now]),
        Err(_) => notify(&[NotifyState::Reloading]),
    }
}

/// Access rules that a reload replaces under running connections: each new
/// handshake reads the rules current when it asks. No rules: every client
/// that reaches a socket may open every export, as without a policy. With a
/// [`LoopbackGate`], plain loopback TCP clients pass it first, against the
/// current rules.
#[derive(Default)]
pub struct LiveAccessRules {
    rules: RwLock<Option<Arc<AccessRules>>>,
    loopback_gate: Option<LoopbackGate>,
}

impl LiveAccessRules {
    pub fn new(rules: Option<AccessRules>) -> Self {
        Self {
            rules: RwLock::new(rules.map(Arc::new)),
            loopback_gate: None,
        }
    }

    /// The rules with `gate` checking plain loopback TCP clients.
    pub fn with_loopback_gate(mut self, gate: LoopbackGate) -> Self {
        self.loopback_gate = Some(gate);
        self
    }

    fn replace(&self, rules: Option<AccessRules>) {
        *self.rules.write().expect("access rules lock") = rules.map(Arc::new);
    }
}

impl AccessPolicy for LiveAccessRules {
    fn admit(&self, identity: &ClientIdentity) -> Result<(), String> {
        let Some(gate) = &self.loopback_gate else {
            return Ok(());
        };
        let current = self.rules.read().expect("access rules lock").clone();
        gate.admit(current.as_deref(), identity)
    }

    fn access(&self, identity: &ClientIdentity, export_name: &str) -> Option<Access> {
        let current = self.rules.read().expect("access rules lock").clone();
        match current {
            Some(rules) => rules.access(identity, export_name),
            None => Some(Access::ReadWrite),
        }
    }
}

/// Sets the daemon's log filter (an `EnvFilter` directive); the command line
/// owns the subscriber, so it hands the daemon this.
pub type LogFilterSetter = Arc<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The log filter when `[log] level` is not set.
pub const DEFAULT_LOG_LEVEL: &str = "info";

/// What the daemon needs to reload its configuration on SIGHUP.
#[derive(Clone, Default)]
pub struct ReloadSource {
    /// The `--config` file, read again on each SIGHUP; none: nothing to reload.
    pub config_path: Option<PathBuf>,
    /// The file's configuration as loaded at start, before the command line's
    /// overrides: a reload compares the file with itself.
    pub file_config: Option<Config>,
    pub log_filter: Option<LogFilterSetter>,
}

/// What one SIGHUP did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Reloadable keys that changed and now apply (`access`, `log.level`).
    pub applied: Vec<String>,
    /// Keys that changed but need a restart (`server.connections_max`).
    pub needs_restart: Vec<String>,
}

/// Reloads the configuration on SIGHUP.
pub struct Reloader {
    source: ReloadSource,
    access: Arc<LiveAccessRules>,
}

impl Reloader {
    pub fn new(source: ReloadSource, access: Arc<LiveAccessRules>) -> Self {
        Self { source, access }
    }

    /// Reads the file again, applies what can change live, logs what changed
    /// and what needs a restart, and tells the service manager.
    pub fn reload(&mut self) {
        notify_reloading();
        match self.apply_file() {
            Ok(report) if report.applied.is_empty() && report.needs_restart.is_empty() => {
                tracing::info!("SIGHUP: configuration reloaded; nothing changed");
            }
            Ok(report) => {
                if !report.applied.is_empty() {
                    tracing::info!(
                        changed = %report.applied.join(", "),
                        "SIGHUP: configuration reloaded; applied"
                    );
                }
                if !report.needs_restart.is_empty() {
                    tracing::warn!(
                        changed = %report.needs_restart.join(", "),
                        "SIGHUP: these settings changed but need a restart (systemctl restart lamina); still running with the old values"
                    );
                }
            }
            Err(error) => tracing::error!(
                error = %format!("{error:#}"),
                "SIGHUP: configuration not reloaded; still running with the old one"
            ),
        }
        notify(&[NotifyState::Ready, NotifyState::Status("serving")]);
    }

    /// The reload proper: the new file is checked whole before anything of
    /// it applies.
    fn apply_file(&mut self) -> anyhow::Result<ReloadReport> {
        let Some(path) = &self.source.config_path else {
            anyhow::bail!("the daemon was started without --config: there is no file to reload");
        };
        let new = Config::load(path)?;
        let old = self.source.file_config.clone().unwrap_or_default();
        let report = compare(&old, &new);
        if new.access != old.access {
            let rules = match new.access.is_empty() {
                true => None,
                false => {
                    Some(AccessRules::new(&new.access).map_err(|error| anyhow::anyhow!(error))?)
                }
            };
            self.access.replace(rules);
        }
        if new.log.level != old.log.level
            && let Some(set_filter) = &self.source.log_filter
        {
            let level = new.log.level.as_deref().unwrap_or(DEFAULT_LOG_LEVEL);
            set_filter(level).map_err(|error| anyhow::anyhow!("[log] level {level:?}: {error}"))?;
        }
        // Only what applied becomes the base of the next comparison, so that a
        // restart-only change is reported again until the restart.
        let mut kept = old;
        kept.access = new.access;
        kept.log = new.log;
        self.source.file_config = Some(kept);
        Ok(report)
    }
}

/// The keys (dotted: `server.connections_max`, `access`) whose values differ,
/// split into those a reload applies and those that need a restart.
pub fn compare(old: &Config, new: &Config) -> ReloadReport {
    let old = serde_json::to_value(old).expect("a configuration serialises");
    let new = serde_json::to_value(new).expect("a configuration serialises");
    let mut changed = Vec::new();
    changed_keys("", &old, &new, &mut changed);
    let (applied, needs_restart) = changed.into_iter().partition(|key: &String| {
        let top = key.split('.').next().unwrap_or_default();
        RELOADABLE_KEYS.contains(&top)
    });
    ReloadReport {
        applied,
        needs_restart,
    }
}

/// Walks two JSON trees in step; a table is compared key by key, anything else
/// (arrays such as `[[access]]` included) as one value.
fn changed_keys(
    prefix: &str,
    old: &serde_json::Value,
    new: &serde_json::Value,
    changed: &mut Vec<String>,
) {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(old_table), Value::Object(new_table)) => {
            let mut keys: Vec<&String> = old_table.keys().chain(new_table.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                let path = match prefix {
                    "" => key.clone(),
                    _ => format!("{prefix}.{key}"),
                };
                let missing = Value::Null;
                changed_keys(
                    &path,
                    old_table.get(key).unwrap_or(&missing),
                    new_table.get(key).unwrap_or(&missing),
                    changed,
                );
            }
        }
        _ if old != new => changed.push(prefix.to_string()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_split_into_live_and_restart_only_keys() {
        let old: Config = toml::from_str("[server]\nconnections_max = 8\n").unwrap();
        let new: Config = toml::from_str(
            "[server]\nconnections_max = 16\n[log]\nlevel = \"debug\"\n[[access]]\nexports = [\"a\"]\nuid = 0\n",
        )
        .unwrap();
        let report = compare(&old, &new);
        assert_eq!(report.applied, ["access", "log.level"]);
        assert_eq!(report.needs_restart, ["server.connections_max"]);
        assert_eq!(compare(&new, &new), ReloadReport::default());
    }

    #[test]
    fn no_rules_let_everyone_open_everything_and_replaced_rules_apply() {
        let live = LiveAccessRules::new(None);
        let identity = ClientIdentity::default();
        assert_eq!(live.access(&identity, "a"), Some(Access::ReadWrite));
        let rule: Config = toml::from_str("[[access]]\nexports = [\"b\"]\nuid = 7\n").unwrap();
        live.replace(Some(AccessRules::new(&rule.access).unwrap()));
        assert_eq!(live.access(&identity, "a"), None);
    }
}
