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
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("lamina-data"),
            server: ServerSection::default(),
            pool: PoolSection::default(),
            limits: PoolLimits::default(),
            disk_models: BTreeMap::new(),
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
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| anyhow::anyhow!("cannot read config {}: {error}", path.display()))?;
        let config: Config = toml::from_str(&text)
            .map_err(|error| anyhow::anyhow!("invalid config {}: {error}", path.display()))?;
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
        // The engine checks them again when it opens the pool; here a bad
        // file fails at startup, before anything is opened.
        self.limits
            .validate()
            .map_err(|error| format!("[limits] {error}"))?;
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
        }
    }
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
