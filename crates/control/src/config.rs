//! The daemon's TOML configuration: where the pool lives, where to listen, and
//! every limit, and the latency models of a pool's devices. Every field has a
//! default, so an empty file (or none) works.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use lamina_device::RotatingDiskModel;
use lamina_engine::PoolLimits;
use serde::{Deserialize, Serialize};

/// Size of the embedded default pool's sparse file.
pub const DEFAULT_POOL_FILE_BYTES: u64 = 32 << 30;
/// Size of the volume `default` created in a new embedded pool.
pub const DEFAULT_VOLUME_BYTES: u64 = 10 << 30;

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The data directory: pool description, sockets, lock.
    pub data_dir: PathBuf,
    pub server: ServerSection,
    pub pool: PoolSection,
    pub limits: PoolLimits,
    /// Named rotating-disk models (`[disk_models.NAME]`, each field optional
    /// with the 7,200 rpm defaults): a name here replaces the built-in
    /// `hdd-7200`'s parameters or adds a model `[pool]` can select.
    pub disk_models: BTreeMap<String, RotatingDiskModel>,
    /// Who may open which exports (`[[access]]`); none: every client that
    /// reaches a socket may open every export. Reloaded on SIGHUP.
    pub access: Vec<crate::access::AccessRule>,
    /// The management web page (`[web]`).
    pub web: WebSection,
    /// The daemon's logging (`[log]`).
    pub log: LogSection,
    /// A capacity tier on object storage: credentials, overrides, limits.
    pub object_store: crate::object_tier::ObjectStoreSection,
    /// Two-tier pools (`[tiering]`).
    pub tiering: TieringSection,
}

/// How a two-tier pool treats the data its cleaner moves to the capacity tier.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TieringSection {
    /// The codec the cleaner encodes blocks with again as it moves them to
    /// the capacity tier (cold data compressed harder, decision 0074): `off`
    /// (the default: they move as they are), `lz4`, `zstd` or `zstd:LEVEL`
    /// (1 to 19). A pool with one tier has nothing to move there.
    pub cold_compression: lamina_engine::Codec,
}

impl Default for TieringSection {
    fn default() -> Self {
        Self {
            cold_compression: lamina_engine::Codec::Off,
        }
    }
}

/// Where the management web page listens besides the admin socket.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebSection {
    /// TCP address of the web page; empty: only on the admin socket. An
    /// address that is not loopback needs a token on every request.
    pub address: String,
    /// The file holding the token (created with a random one, mode 0600, when
    /// missing); relative paths are inside the data directory.
    pub token_file: PathBuf,
}

/// The web page's default TCP address (loopback only).
pub const DEFAULT_WEB_ADDRESS: &str = "127.0.0.1:10810";

impl Default for WebSection {
    fn default() -> Self {
        Self {
            address: DEFAULT_WEB_ADDRESS.to_string(),
            token_file: PathBuf::from("web.token"),
        }
    }
}

/// The daemon's logging (`[log]`), reloaded on SIGHUP.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSection {
    /// What the daemon logs, as `LAMINA_LOG` takes it (`info`, `warn`,
    /// `warn,lamina::audit=info`); none: `info`. `LAMINA_LOG`, when set,
    /// wins at start; a SIGHUP applies this one.
    pub level: Option<String>,
}

/// Whether a listener offers or requires TLS (`tls`, `unix_tls`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsSetting {
    Off,
    On,
    Require,
}

impl TlsSetting {
    pub fn mode(self) -> lamina_nbd::TlsMode {
        match self {
            TlsSetting::Off => lamina_nbd::TlsMode::Off,
            TlsSetting::On => lamina_nbd::TlsMode::On,
            TlsSetting::Require => lamina_nbd::TlsMode::Require,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// TCP listen address; empty disables TCP.
    pub tcp_address: String,
    /// Unix socket path; relative paths are inside the data directory.
    pub unix_socket: PathBuf,
    pub max_request_bytes: u32,
    /// Connections in the transmission phase at once (taken when a handshake
    /// completes).
    pub connections_max: usize,
    pub in_flight_requests_max: usize,
    /// Connections still in the handshake at once, over all peers.
    pub handshakes_in_progress_max: usize,
    /// Connections still in the handshake at once from one TCP address or one
    /// Unix uid.
    pub handshakes_per_peer_max: usize,
    /// Time a client has to finish the handshake.
    pub handshake_timeout_ms: u64,
    /// TLS on the TCP listener: `off`, `on` (offered) or `require`.
    pub tls: TlsSetting,
    /// TLS on the Unix socket (default `off`: the socket's permissions and the
    /// peer's uid already say who connects).
    pub unix_tls: TlsSetting,
    /// A directory as nbdkit's `--tls-certificates`: `ca-cert.pem`,
    /// `server-cert.pem`, `server-key.pem`.
    pub tls_certificates: Option<PathBuf>,
    /// Clients must present a certificate signed by `ca-cert.pem`; its DN can
    /// then be matched by `[[access]]` rules.
    pub tls_verify_peer: bool,
    /// Serve plain-text NBD on a non-loopback TCP address anyway (refused at
    /// start otherwise).
    pub insecure_tcp: bool,
    /// Admit a loopback TCP client without a verified certificate only if
    /// the uid that owns its socket could use the Unix socket (owner, root,
    /// `socket_group`) or an `[[access]]` rule names its uid or gid; false:
    /// every local user reaches the TCP listener, as before issue 42.
    pub tcp_loopback_uid_check: bool,
    /// A group (name or gid) whose members may use the NBD Unix socket (mode
    /// 0660); none: the owner only (0600).
    pub socket_group: Option<String>,
    /// A group whose members may use the admin API socket; none: the owner only.
    pub admin_group: Option<String>,
    /// Measure each NBD read's and write's latency into its volume's
    /// histogram (a clock read per request); off: only counts and bytes.
    pub volume_latency_histograms: bool,
    /// Threads that serve NBD connections, each on a runtime of its own, a
    /// connection staying on one from its handshake to its end (decision
    /// 0048). Absent: one per core; 0: none, connections are served by the
    /// daemon's shared runtime as before that decision.
    pub connection_threads: Option<usize>,
    /// Longest time a connection thread with nothing to run spins, looking
    /// for a request or a device completion, before it sleeps (0, the
    /// default: never spins). A thread woken from sleep costs tens of
    /// microseconds; a spin costs the core (decision 0048).
    pub connection_thread_idle_spin_us: u64,
}

impl ServerSection {
    /// The NBD server's limits: these fields, the rest at their defaults.
    pub fn server_config(&self) -> lamina_nbd::ServerConfig {
        lamina_nbd::ServerConfig {
            max_request_bytes: self.max_request_bytes,
            connections_max: self.connections_max,
            in_flight_requests_max: self.in_flight_requests_max,
            handshakes_in_progress_max: self.handshakes_in_progress_max,
            handshakes_per_peer_max: self.handshakes_per_peer_max,
            handshake_timeout_ms: self.handshake_timeout_ms,
            ..lamina_nbd::ServerConfig::default()
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolSection {
    /// Size of the embedded pool file created when the data directory has no pool.
    pub embedded_size_bytes: u64,
    /// Size of the `default` volume created with an embedded pool (0: none).
    pub default_volume_bytes: u64,
    /// The flash device's latency model (`none`, `hdd-7200` or a
    /// `[disk_models]` name), replacing the one `pool.toml` records.
    pub flash_model: Option<String>,
    /// The capacity device's latency model, replacing the one `pool.toml`
    /// records (ignored, with a warning, for a pool without a capacity tier).
    pub capacity_model: Option<String>,
    /// The codec of volumes created without `--compression` (the `default`
    /// volume included): `off` (the default), `lz4`, `zstd` or `zstd:LEVEL`
    /// (1 to 19). Each volume keeps the codec it was created with until
    /// `volume set --compression` changes it.
    pub compression: lamina_engine::Codec,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("lamina-data"),
            server: ServerSection::default(),
            pool: PoolSection::default(),
            limits: PoolLimits::default(),
            disk_models: BTreeMap::new(),
            access: Vec::new(),
            web: WebSection::default(),
            log: LogSection::default(),
            object_store: Default::default(),
            tiering: TieringSection::default(),
        }
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        let server = lamina_nbd::ServerConfig::default();
        Self {
            tcp_address: "127.0.0.1:10809".to_string(),
            unix_socket: PathBuf::from("nbd.sock"),
            max_request_bytes: server.max_request_bytes,
            connections_max: server.connections_max,
            in_flight_requests_max: server.in_flight_requests_max,
            handshakes_in_progress_max: server.handshakes_in_progress_max,
            handshakes_per_peer_max: server.handshakes_per_peer_max,
            handshake_timeout_ms: server.handshake_timeout_ms,
            tls: TlsSetting::Off,
            unix_tls: TlsSetting::Off,
            tls_certificates: None,
            tls_verify_peer: false,
            insecure_tcp: false,
            tcp_loopback_uid_check: true,
            socket_group: None,
            admin_group: None,
            volume_latency_histograms: true,
            connection_threads: None,
            connection_thread_idle_spin_us: lamina_nbd::IDLE_SPIN_US_DEFAULT,
        }
    }
}

impl Default for PoolSection {
    fn default() -> Self {
        Self {
            embedded_size_bytes: DEFAULT_POOL_FILE_BYTES,
            default_volume_bytes: DEFAULT_VOLUME_BYTES,
            flash_model: None,
            capacity_model: None,
            compression: lamina_engine::Codec::Off,
        }
    }
}

impl Config {
    /// The limits the pool runs under: `[limits]`, with the settings other
    /// sections give the engine (`[tiering] cold_compression`).
    pub fn pool_limits(&self) -> PoolLimits {
        PoolLimits {
            cold_compression: self.tiering.cold_compression,
            ..self.limits.clone()
        }
    }

    /// Reads, parses and checks the file at `path`; every failure is one line
    /// naming the file (and, for a parse error, the line and column).
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            let reason = match error.kind() {
                std::io::ErrorKind::NotFound => {
                    "no such file (give --config the path of an existing TOML file, or leave it out for the defaults)".to_string()
                }
                _ => error.to_string(),
            };
            anyhow::anyhow!("cannot read config {}: {reason}", path.display())
        })?;
        let config: Config = toml::from_str(&text).map_err(|error| {
            anyhow::anyhow!(
                "invalid config {}: {} (fix the file; README's Configuration lists every key)",
                path.display(),
                toml_error_line(&text, &error)
            )
        })?;
        config
            .check()
            .map_err(|error| anyhow::anyhow!("invalid config {}: {error}", path.display()))?;
        Ok(config)
    }

    /// Values that parse but cannot mean what was meant.
    fn check(&self) -> Result<(), String> {
        self.server
            .server_config()
            .validate()
            .map_err(|error| format!("[server] {error}"))?;
        if let Some(count) = self.server.connection_threads
            && count > lamina_nbd::CONNECTION_THREADS_MAX
        {
            return Err(format!(
                "[server] connection_threads = {count}: at most {}",
                lamina_nbd::CONNECTION_THREADS_MAX
            ));
        }
        let spin_us = self.server.connection_thread_idle_spin_us;
        if spin_us > lamina_nbd::IDLE_SPIN_US_MAX {
            return Err(format!(
                "[server] connection_thread_idle_spin_us = {spin_us}: at most {}",
                lamina_nbd::IDLE_SPIN_US_MAX
            ));
        }
        // The engine checks them again when it opens the pool; here a bad
        // file fails at startup, before anything is opened.
        self.limits
            .validate()
            .map_err(|error| format!("[limits] {error}"))?;
        crate::access::AccessRules::new(&self.access)?;
        if let Some(level) = &self.log.level {
            tracing_subscriber::EnvFilter::try_new(level)
                .map_err(|error| format!("[log] level {level:?}: {error}"))?;
        }
        Ok(())
    }

    /// Checks who the listeners expose the volumes to, at start (after the
    /// command line's overrides): TLS needs its certificate directory; a TCP
    /// address that is not loopback needs `tls = "require"` or an explicit
    /// `insecure_tcp = true`; the two socket groups share the data directory.
    pub fn check_exposure(&self) -> Result<(), String> {
        let server = &self.server;
        let tls_used = server.tls != TlsSetting::Off || server.unix_tls != TlsSetting::Off;
        if tls_used && server.tls_certificates.is_none() {
            return Err("[server] tls needs tls_certificates = \"DIR\" (a directory holding ca-cert.pem, server-cert.pem and server-key.pem)".to_string());
        }
        if let (Some(socket), Some(admin)) = (&server.socket_group, &server.admin_group)
            && socket != admin
        {
            return Err(format!(
                "[server] socket_group {socket:?} and admin_group {admin:?} must be one group: the data directory holding both sockets can belong to one group only"
            ));
        }
        if server.tcp_address.is_empty() || server.tls == TlsSetting::Require || server.insecure_tcp
        {
            return Ok(());
        }
        let addresses = std::net::ToSocketAddrs::to_socket_addrs(server.tcp_address.as_str())
            .map_err(|error| format!("[server] tcp_address {:?}: {error}", server.tcp_address))?;
        if let Some(exposed) = addresses
            .into_iter()
            .find(|address| !address.ip().is_loopback())
        {
            return Err(format!(
                "refusing to serve NBD on {exposed} without TLS: any host that reaches it could read and overwrite every volume. Require TLS with [server] tls = \"require\" and tls_certificates = \"DIR\" (ca-cert.pem, server-cert.pem, server-key.pem; add tls_verify_peer = true to demand client certificates), listen on 127.0.0.1, or set [server] insecure_tcp = true to serve plain text on a network you trust"
            ));
        }
        Ok(())
    }

    pub fn unix_socket_path(&self) -> PathBuf {
        self.data_dir.join(&self.server.unix_socket)
    }

    /// The device models the daemon opens its pool with.
    pub fn device_models(&self) -> crate::store::DeviceModels {
        crate::store::DeviceModels {
            flash_override: self.pool.flash_model.clone(),
            capacity_override: self.pool.capacity_model.clone(),
            definitions: self.disk_models.clone(),
            object_store: self.object_store.clone(),
        }
    }
}

/// A TOML error on one line: where (line and column, from 1) and what,
/// instead of the parser's multi-line excerpt of the file.
fn toml_error_line(text: &str, error: &toml::de::Error) -> String {
    let message = error.message().trim().replace('\n', " ");
    let Some(span) = error.span() else {
        return message;
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |newline| newline + 1) + 1;
    format!("line {line}, column {column}: {message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_and_partial_configs_use_defaults_and_typos_are_refused() {
        let config: Config = toml::from_str("").unwrap();
        assert_eq!(config.server.tcp_address, "127.0.0.1:10809");
        let config: Config =
            toml::from_str("[server]\ntcp_address = \"\"\n[limits]\nflush_interval_ms = 50\n")
                .unwrap();
        assert_eq!(config.server.tcp_address, "");
        assert_eq!(config.limits.flush_interval_ms, 50);
        assert_eq!(config.limits.usage_warning_percents, [80, 90]);
        let config: Config =
            toml::from_str("[limits]\nusage_warning_percents = [75, 95]\n").unwrap();
        assert_eq!(config.limits.usage_warning_percents, [75, 95]);
        assert!(config.check().is_ok());
        let config: Config =
            toml::from_str("[limits]\nusage_warning_percents = [80, 190]\n").unwrap();
        assert!(config.check().unwrap_err().contains("190"));
        assert!(toml::from_str::<Config>("[server]\ntcp_adress = \"x\"\n").is_err());
        // A misspelt or retired limit is refused by name, not ignored.
        let error = toml::from_str::<Config>("[limits]\nscrub_bytes_per_second_max = 5\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("scrub_bytes_per_second_max"), "{error}");
    }

    #[test]
    fn the_pool_compression_defaults_to_off_and_a_bad_codec_fails_loading() {
        let config: Config = toml::from_str("").unwrap();
        assert_eq!(config.pool.compression, lamina_engine::Codec::Off);
        let config: Config = toml::from_str("[pool]\ncompression = \"zstd:5\"\n").unwrap();
        assert_eq!(config.pool.compression.to_string(), "zstd:5");
        let path = std::env::temp_dir().join(format!(
            "lamina-config-test-{}-bad-codec.toml",
            std::process::id()
        ));
        for (codec, message) in [
            ("gzip", "unknown codec \"gzip\""),
            ("zstd:20", "zstd level \"20\" is out of range"),
            ("lz4:1", "codec lz4 takes no level"),
        ] {
            std::fs::write(&path, format!("[pool]\ncompression = \"{codec}\"\n")).unwrap();
            let error = Config::load(&path).unwrap_err().to_string();
            assert!(
                error.starts_with(&format!("invalid config {}: line 2", path.display()))
                    && error.contains(message),
                "{error}"
            );
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn cold_compression_defaults_to_off_reaches_the_limits_and_a_bad_codec_fails_loading() {
        let config: Config = toml::from_str("").unwrap();
        assert_eq!(
            config.pool_limits().cold_compression,
            lamina_engine::Codec::Off
        );
        let config: Config = toml::from_str("[tiering]\ncold_compression = \"zstd:9\"\n").unwrap();
        assert_eq!(config.pool_limits().cold_compression.to_string(), "zstd:9");
        let path = std::env::temp_dir().join(format!(
            "lamina-config-test-{}-bad-cold-codec.toml",
            std::process::id()
        ));
        for (codec, message) in [
            ("gzip", "unknown codec \"gzip\""),
            ("zstd:22", "zstd level \"22\" is out of range"),
        ] {
            std::fs::write(
                &path,
                format!("[tiering]\ncold_compression = \"{codec}\"\n"),
            )
            .unwrap();
            let error = Config::load(&path).unwrap_err().to_string();
            assert!(
                error.starts_with(&format!("invalid config {}: line 2", path.display()))
                    && error.contains(message),
                "{error}"
            );
        }
        // The engine's limits never take it from `[limits]`.
        assert!(toml::from_str::<Config>("[limits]\ncold_compression = \"lz4\"\n").is_err());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn a_limit_out_of_range_fails_loading_with_its_name_value_and_range() {
        let path = std::env::temp_dir().join(format!(
            "lamina-config-test-{}-bad-limit.toml",
            std::process::id()
        ));
        std::fs::write(&path, "[limits]\ncleaner_interval_ms = 0\n").unwrap();
        let error = Config::load(&path).unwrap_err().to_string();
        assert_eq!(
            error,
            format!(
                "invalid config {}: [limits] cleaner_interval_ms must be at least 1 (got 0)",
                path.display()
            )
        );
        std::fs::write(&path, "[limits]\ncleaner_interval_ms = 1\n").unwrap();
        assert_eq!(Config::load(&path).unwrap().limits.cleaner_interval_ms, 1);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn the_background_impact_gives_the_budget_limits_not_set_one_by_one() {
        let config: Config = toml::from_str(
            "[limits]\nbackground_impact = \"low\"\nbackground_bytes_per_second_min = 1048576\n",
        )
        .unwrap();
        assert!(config.check().is_ok());
        let budget = config.limits.background_budget();
        assert_eq!(budget.bytes_per_second_min, 1 << 20);
        assert_eq!(budget.bytes_per_second_max, 128 << 20);
        assert_eq!(budget.client_latency_target_ratio, 1.3);
        let config: Config =
            toml::from_str("[limits]\nbackground_bytes_per_second_min = 1000000000000\n").unwrap();
        let error = config.check().unwrap_err();
        assert!(
            error.contains("background_bytes_per_second_max must be at least"),
            "{error}"
        );
        assert!(toml::from_str::<Config>("[limits]\nbackground_impact = \"extreme\"\n").is_err());
    }

    #[test]
    fn connection_threads_default_to_one_per_core_and_are_bounded() {
        let config: Config = toml::from_str("").unwrap();
        assert_eq!(config.server.connection_threads, None);
        let config: Config = toml::from_str("[server]\nconnection_threads = 0\n").unwrap();
        assert_eq!(config.server.connection_threads, Some(0));
        assert!(config.check().is_ok());
        let config: Config = toml::from_str("[server]\nconnection_threads = 100000\n").unwrap();
        let error = config.check().unwrap_err();
        assert!(
            error.contains("connection_threads = 100000: at most 256"),
            "{error}"
        );
        let config: Config =
            toml::from_str("[server]\nconnection_thread_idle_spin_us = 5000\n").unwrap();
        let error = config.check().unwrap_err();
        assert!(error.contains("at most 1000"), "{error}");
    }

    #[test]
    fn handshake_limits_reach_the_server_and_are_checked() {
        let defaults = Config::default().server.server_config();
        assert_eq!(defaults, lamina_nbd::ServerConfig::default());
        let config: Config = toml::from_str(
            "[server]\nhandshakes_in_progress_max = 32\nhandshakes_per_peer_max = 4\nhandshake_timeout_ms = 2000\n",
        )
        .unwrap();
        assert!(config.check().is_ok());
        let server = config.server.server_config();
        assert_eq!(server.handshakes_in_progress_max, 32);
        assert_eq!(server.handshakes_per_peer_max, 4);
        assert_eq!(server.handshake_timeout_ms, 2000);
        assert_eq!(server.connections_max, 256);
        let config: Config = toml::from_str(
            "[server]\nhandshakes_in_progress_max = 4\nhandshakes_per_peer_max = 8\n",
        )
        .unwrap();
        let error = config.check().unwrap_err();
        assert!(error.contains("handshakes_per_peer_max"), "{error}");
    }

    #[test]
    fn exposure_needs_tls_off_loopback_and_says_how_to_enable_it() {
        let parse = |text: &str| toml::from_str::<Config>(text).unwrap();
        assert!(Config::default().check_exposure().is_ok());
        let open = parse("[server]\ntcp_address = \"0.0.0.0:10809\"\n");
        let error = open.check_exposure().unwrap_err();
        assert!(
            error.contains("without TLS") && error.contains("insecure_tcp = true"),
            "{error}"
        );
        assert!(
            parse("[server]\ntcp_address = \"0.0.0.0:10809\"\ninsecure_tcp = true\n")
                .check_exposure()
                .is_ok()
        );
        let required = parse("[server]\ntcp_address = \"0.0.0.0:10809\"\ntls = \"require\"\n");
        assert!(
            required
                .check_exposure()
                .unwrap_err()
                .contains("tls_certificates")
        );
        let required = parse(
            "[server]\ntcp_address = \"0.0.0.0:10809\"\ntls = \"require\"\ntls_certificates = \"/x\"\n",
        );
        assert!(required.check_exposure().is_ok());
        assert!(
            parse("[server]\ntcp_address = \"[::1]:10809\"\n")
                .check_exposure()
                .is_ok()
        );
        let groups = parse("[server]\nsocket_group = \"a\"\nadmin_group = \"b\"\n");
        assert!(groups.check_exposure().unwrap_err().contains("one group"));
        assert!(toml::from_str::<Config>("[server]\ntls = \"maybe\"\n").is_err());
        let bad_rule = parse("[[access]]\nexports = [\"x\"]\naddress = \"nowhere\"\n");
        assert!(bad_rule.check().unwrap_err().contains("rule 1"));
    }

    #[test]
    fn device_models_are_overridden_and_defined_in_the_config() {
        let config: Config = toml::from_str(
            "[pool]\ncapacity_model = \"slow\"\n[disk_models.slow]\nrotation_rpm = 5400\n[disk_models.hdd-7200]\nseek_full_stroke_ms = 20.0\n",
        )
        .unwrap();
        let models = config.device_models();
        assert_eq!(models.capacity_override.as_deref(), Some("slow"));
        assert_eq!(models.flash_override, None);
        let slow = models.resolve("slow").unwrap().unwrap();
        assert_eq!(slow.rotation_rpm, 5400);
        assert_eq!(
            slow.transfer_bytes_per_second,
            RotatingDiskModel::default().transfer_bytes_per_second
        );
        // A definition replaces the built-in model's parameters.
        let hdd = models.resolve("hdd-7200").unwrap().unwrap();
        assert_eq!(hdd.seek_full_stroke_ms, 20.0);
        assert_eq!(models.resolve("none").unwrap(), None);
        let unknown = models.resolve("ssd").unwrap_err().to_string();
        assert!(
            unknown.contains("unknown device model \"ssd\""),
            "{unknown}"
        );
        assert!(unknown.contains("hdd-7200, slow"), "{unknown}");
        let broken: Config = toml::from_str("[disk_models.stuck]\nrotation_rpm = 0\n").unwrap();
        let error = broken.device_models().resolve("stuck").unwrap_err();
        assert!(error.to_string().contains("rotation_rpm"), "{error}");
        // Built-in defaults without any config.
        let defaults = Config::default().device_models();
        assert_eq!(
            defaults.resolve("hdd-7200").unwrap(),
            Some(RotatingDiskModel::default())
        );
    }
}
