//! The daemon's TOML configuration: where the pool lives, where to listen, and
//! every limit. Every field has a default, so an empty file (or none) works.

use std::path::{Path, PathBuf};

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
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSection {
    /// TCP listen address; empty disables TCP.
    pub tcp_address: String,
    /// Unix socket path; relative paths are inside the data directory.
    pub unix_socket: PathBuf,
    pub max_request_bytes: u32,
    pub connections_max: usize,
    pub in_flight_requests_max: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolSection {
    /// Size of the embedded pool file created when the data directory has no pool.
    pub embedded_size_bytes: u64,
    /// Size of the `default` volume created with an embedded pool (0: none).
    pub default_volume_bytes: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("lamina-data"),
            server: ServerSection::default(),
            pool: PoolSection::default(),
            limits: PoolLimits::default(),
        }
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            tcp_address: "127.0.0.1:10809".to_string(),
            unix_socket: PathBuf::from("nbd.sock"),
            max_request_bytes: 32 << 20,
            connections_max: 256,
            in_flight_requests_max: 64,
        }
    }
}

impl Default for PoolSection {
    fn default() -> Self {
        Self {
            embedded_size_bytes: DEFAULT_POOL_FILE_BYTES,
            default_volume_bytes: DEFAULT_VOLUME_BYTES,
        }
    }
}

impl Config {
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| anyhow::anyhow!("cannot read config {}: {error}", path.display()))?;
        toml::from_str(&text)
            .map_err(|error| anyhow::anyhow!("invalid config {}: {error}", path.display()))
    }

    pub fn unix_socket_path(&self) -> PathBuf {
        self.data_dir.join(&self.server.unix_socket)
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
        assert!(toml::from_str::<Config>("[server]\ntcp_adress = \"x\"\n").is_err());
    }
}
