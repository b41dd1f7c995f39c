//! The process's log subscriber, with a filter the daemon can replace while it
//! runs (`[log] level`, applied at start and on SIGHUP).

use std::sync::{Arc, OnceLock};

use lamina_control::systemd::LogFilterSetter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

/// The environment variable that sets the log filter at start.
pub const LOG_ENVIRONMENT_VARIABLE: &str = "LAMINA_LOG";

/// What replaces the filter of the subscriber [`init`] installed.
static FILTER_SETTER: OnceLock<LogFilterSetter> = OnceLock::new();

/// Logs to stderr, filtered by `LAMINA_LOG` or else `default_level`.
pub fn init(default_level: &str) {
    let filter = EnvFilter::try_from_env(LOG_ENVIRONMENT_VARIABLE)
        .unwrap_or_else(|_| EnvFilter::new(default_level));
    let (filter, handle) = reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(filter)
        .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
        .init();
    let setter: LogFilterSetter = Arc::new(move |level: &str| set_filter(&handle, level));
    assert!(
        FILTER_SETTER.set(setter).is_ok(),
        "logging is initialised once"
    );
}

/// What replaces the log filter, once [`init`] ran.
pub fn filter_setter() -> Option<LogFilterSetter> {
    FILTER_SETTER.get().cloned()
}

fn set_filter(handle: &reload::Handle<EnvFilter, Registry>, level: &str) -> Result<(), String> {
    let filter = EnvFilter::try_new(level).map_err(|error| error.to_string())?;
    handle.reload(filter).map_err(|error| error.to_string())
}

/// Whether `LAMINA_LOG` chose the filter (it then wins over `[log] level` at
/// start).
pub fn set_by_environment() -> bool {
    std::env::var_os(LOG_ENVIRONMENT_VARIABLE).is_some()
}
