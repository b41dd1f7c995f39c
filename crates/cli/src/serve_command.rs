//! `lamina serve`: the daemon's configuration from the config file, then the
//! command line's overrides on top of it, and the daemon run with it until it
//! is stopped.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use lamina_control::config::{Config, TlsSetting};
use lamina_control::systemd::ReloadSource;

use crate::logging;

#[derive(Args)]
pub struct ServeArgs {
    /// The data directory (default ./lamina-data; overrides the config file's).
    #[arg(long = "data", env = "LAMINA_DATA")]
    data_dir: Option<PathBuf>,
    /// A TOML configuration file (addresses, limits, pool location).
    #[arg(long)]
    config: Option<PathBuf>,
    /// TCP listen address (empty string disables TCP); overrides the config file.
    #[arg(long)]
    tcp_address: Option<String>,
    /// TLS on the TCP listener (as nbdkit's --tls); overrides the config file.
    #[arg(long, value_enum)]
    tls: Option<TlsArgument>,
    /// A directory with ca-cert.pem, server-cert.pem and server-key.pem.
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,
    /// Clients must present a certificate signed by ca-cert.pem.
    #[arg(long)]
    tls_verify_peer: bool,
}

/// `--tls off|on|require`, spelled as the config file's `tls`. The variants
/// carry no doc comments on purpose: clap would print them as a list of
/// values in `--help`, where the flag's own line already says enough.
#[derive(Clone, Copy, ValueEnum)]
enum TlsArgument {
    Off,
    On,
    Require,
}

impl From<TlsArgument> for TlsSetting {
    fn from(argument: TlsArgument) -> TlsSetting {
        match argument {
            TlsArgument::Off => TlsSetting::Off,
            TlsArgument::On => TlsSetting::On,
            TlsArgument::Require => TlsSetting::Require,
        }
    }
}

pub async fn run(arguments: ServeArgs) -> anyhow::Result<()> {
    let config = match &arguments.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let reload = ReloadSource {
        config_path: arguments.config.clone(),
        file_config: Some(config.clone()),
        log_filter: logging::filter_setter(),
    };
    // The file's log level, unless RUST_LOG chose one: set before the daemon
    // starts so that its first lines follow it.
    if let (Some(level), Some(set_filter)) = (&config.log.level, &reload.log_filter)
        && !logging::set_by_environment()
    {
        set_filter(level).map_err(|error| anyhow::anyhow!("[log] level {level:?}: {error}"))?;
    }
    let config = with_overrides(config, arguments);
    lamina_control::daemon::run_service(config, reload).await
}

/// The configuration with what the command line sets in place of the file's.
fn with_overrides(mut config: Config, arguments: ServeArgs) -> Config {
    if let Some(data_dir) = arguments.data_dir {
        config.data_dir = data_dir;
    }
    if let Some(address) = arguments.tcp_address {
        config.server.tcp_address = address;
    }
    if let Some(tls) = arguments.tls {
        config.server.tls = tls.into();
    }
    if let Some(directory) = arguments.tls_certificates {
        config.server.tls_certificates = Some(directory);
    }
    config.server.tls_verify_peer |= arguments.tls_verify_peer;
    config
}
