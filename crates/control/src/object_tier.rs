//! A two-tier pool's capacity tier on S3-compatible object storage (issue 22,
//! decision 0031): what `pool.toml` records of it (where it is, never the
//! credentials), what the daemon's config adds (`[object_store]`: credentials,
//! endpoint and region overrides, request limits), what the environment adds
//! by the AWS SDKs' convention (`AWS_ENDPOINT_URL`, `AWS_REGION`: used where
//! nothing else names them, and recorded by `pool create`), the rule that
//! keeps plain HTTP on loopback unless allowed, and creating and opening the
//! tier's device (`lamina_objects::ObjectStoreDevice`) under the flash
//! device.

use std::sync::Arc;

use anyhow::Context;
use lamina_engine::BLOCK_SIZE_BYTES;
use lamina_engine::log::geometry::CAPACITY_DATA_START_BLOCKS;
use lamina_objects::{
    EpochRecord, ObjectStoreConfig, ObjectStoreDevice, ObjectStoreError, ObjectStoreLimits,
    RequestStatistics, TierGeometry,
};
use serde::{Deserialize, Serialize};

use crate::exposition::{Exposition, label};

/// The address space of an object tier created without a size: the engine
/// lays segments over it, and only what is written costs anything in the
/// store.
pub const OBJECT_TIER_DEFAULT_SIZE_BYTES: u64 = 1 << 40;

/// The scheme that names an object tier instead of a device path.
const OBJECT_URL_SCHEME: &str = "s3://";
/// Microseconds in a second: `/metrics` shows in seconds the latencies the
/// tier keeps in microseconds.
const MICROSECONDS_PER_SECOND: f64 = 1e6;

/// What `pool.toml` records of an object tier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectTierDescription {
    /// `s3://bucket` or `s3://bucket/prefix`.
    pub url: String,
    /// The store's address (`http://127.0.0.1:8333`); absent: the
    /// environment's (`AWS_ENDPOINT_URL`, ...), or AWS's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// `bucket.host/key` rather than `host/bucket/key`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub virtual_hosted_style: bool,
    /// Plain HTTP to an endpoint that is not loopback (never needed for
    /// loopback).
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_http: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The environment variables the AWS SDKs (and object_store) take an S3
/// endpoint from, the most specific first.
const ENDPOINT_VARIABLES: [&str; 3] = ["AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT"];

/// The environment variables the AWS SDKs take the region from, in order.
const REGION_VARIABLES: [&str; 2] = ["AWS_REGION", "AWS_DEFAULT_REGION"];

/// A value from the environment and the variable that gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct EnvironmentSetting {
    value: String,
    variable: &'static str,
}

/// The first of `variables` set to something other than blanks.
fn from_environment(variables: &[&'static str]) -> Option<EnvironmentSetting> {
    variables.iter().find_map(|variable| {
        let value = std::env::var(variable).ok()?;
        let value = value.trim();
        (!value.is_empty()).then(|| EnvironmentSetting {
            value: value.to_string(),
            variable,
        })
    })
}

impl ObjectTierDescription {
    /// This description with the endpoint and region the environment gives
    /// where it names none: what `pool create` and `pool restore` record, so
    /// that the pool opens on the store it was created on, as with
    /// `--s3-endpoint` and `--s3-region`.
    pub fn with_environment_defaults(&self) -> Self {
        let mut description = self.clone();
        if description.endpoint.is_none() {
            description.endpoint =
                from_environment(&ENDPOINT_VARIABLES).map(|setting| setting.value);
        }
        if description.region.is_none() {
            description.region = from_environment(&REGION_VARIABLES).map(|setting| setting.value);
        }
        description
    }
}

/// The endpoint a tier is reached at and where it was named.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Endpoint {
    url: String,
    /// The environment variable that named it; `None` for `pool.toml` and
    /// the daemon's config.
    variable: Option<&'static str>,
}

/// The daemon config's endpoint, else `pool.toml`'s, else the environment's.
fn resolve_endpoint(
    description: &ObjectTierDescription,
    section: &ObjectStoreSection,
) -> Option<Endpoint> {
    let named = section.endpoint.clone().or(description.endpoint.clone());
    match named {
        Some(url) => Some(Endpoint {
            url,
            variable: None,
        }),
        None => from_environment(&ENDPOINT_VARIABLES).map(|setting| Endpoint {
            url: setting.value,
            variable: Some(setting.variable),
        }),
    }
}

/// The daemon config's `[object_store]`: what an object tier needs beyond
/// `pool.toml` when it opens. Every field is optional; credentials not given
/// here come from the standard `AWS_*` environment variables.
#[derive(Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectStoreSection {
    /// Replaces the endpoint `pool.toml` records.
    pub endpoint: Option<String>,
    /// Replaces the region `pool.toml` records.
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Allows plain HTTP to an endpoint that is not loopback.
    pub allow_http: bool,
    /// Requests to the store in flight at once at most.
    pub requests_in_flight_max: Option<usize>,
    /// One request's time limit, retries apart.
    pub request_timeout_ms: Option<u64>,
    /// Retries of a failed request (5xx, timeouts, throttling) at most.
    pub retries_max: Option<usize>,
}

impl std::fmt::Debug for ObjectStoreSection {
    /// The secret never reaches a log line.
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ObjectStoreSection")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "(set)"),
            )
            .field("allow_http", &self.allow_http)
            .field("requests_in_flight_max", &self.requests_in_flight_max)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("retries_max", &self.retries_max)
            .finish()
    }
}

/// `--capacity s3://bucket/prefix[:SIZE]` as given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectTierArgument {
    pub url: String,
    pub size_bytes: u64,
}

/// Whether a `--capacity` argument names an object tier.
pub fn is_object_url(argument: &str) -> bool {
    argument.starts_with(OBJECT_URL_SCHEME)
}

/// `s3://bucket/prefix[:SIZE]`: a size is a trailing `:` and digits (object
/// keys with a colon followed by a digit are not supported as prefixes).
pub fn parse_argument(argument: &str) -> anyhow::Result<ObjectTierArgument> {
    anyhow::ensure!(
        is_object_url(argument),
        "{argument:?} is not an object store address (s3://bucket/prefix)"
    );
    let (url, size_bytes) = match argument[OBJECT_URL_SCHEME.len()..].rsplit_once(':') {
        Some((_, size)) if size.starts_with(|character: char| character.is_ascii_digit()) => {
            let size_bytes = crate::size::parse_size(size)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("the object tier's size in {argument:?}"))?;
            let url = &argument[..argument.len() - size.len() - 1];
            (url, size_bytes)
        }
        _ => (argument, OBJECT_TIER_DEFAULT_SIZE_BYTES),
    };
    // Parsed here as well as when the tier opens, so that a bad address is
    // refused before anything is created.
    ObjectStoreConfig::from_url(url).with_context(|| format!("the object tier {url:?}"))?;
    Ok(ObjectTierArgument {
        url: url.to_string(),
        size_bytes,
    })
}

/// The store's settings: `pool.toml`'s, with the config's overrides and
/// credentials, refused when they would send plain HTTP off the machine.
fn store_config(
    description: &ObjectTierDescription,
    section: &ObjectStoreSection,
) -> anyhow::Result<ObjectStoreConfig> {
    let endpoint = resolve_endpoint(description, section);
    let allow_http = http_allowed(
        endpoint.as_ref(),
        description.allow_http || section.allow_http,
    )?;
    let mut config = ObjectStoreConfig::from_url(&description.url)
        .with_context(|| format!("the object tier {:?}", description.url))?
        .with_virtual_hosted_style(description.virtual_hosted_style)
        .with_allow_http(allow_http)
        .with_limits(limits(section)?);
    if let Some(endpoint) = endpoint {
        config = config.with_endpoint(endpoint.url);
    }
    if let Some(region) = section.region.clone().or(description.region.clone()) {
        config = config.with_region(region);
    }
    match (&section.access_key_id, &section.secret_access_key) {
        (Some(access_key_id), Some(secret_access_key)) => {
            config = config.with_credentials(access_key_id.clone(), secret_access_key.clone());
        }
        // The client would otherwise ask a cloud's instance metadata service
        // for credentials, which no other store has, and fail with an error
        // about that service.
        (None, None) if config.endpoint().is_some() && !environment_has_credentials() => {
            anyhow::bail!(
                "no credentials for the object store at {}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or access_key_id and secret_access_key under [object_store] in the daemon's config",
                config.endpoint().unwrap_or_default()
            )
        }
        (None, None) => {}
        _ => anyhow::bail!(
            "[object_store] needs both access_key_id and secret_access_key, or neither (then AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        ),
    }
    Ok(config)
}

/// Whether the standard environment variables give the client a key.
fn environment_has_credentials() -> bool {
    std::env::var_os("AWS_ACCESS_KEY_ID").is_some_and(|key| !key.is_empty())
}

fn limits(section: &ObjectStoreSection) -> anyhow::Result<ObjectStoreLimits> {
    let mut limits = ObjectStoreLimits::default();
    if let Some(count) = section.requests_in_flight_max {
        limits.requests_in_flight_max = count;
    }
    if let Some(milliseconds) = section.request_timeout_ms {
        limits.request_timeout_ms = milliseconds;
    }
    if let Some(count) = section.retries_max {
        limits.retries_max = count;
    }
    limits
        .validate()
        .map_err(|error| anyhow::anyhow!("[object_store] {error}"))?;
    Ok(limits)
}

/// Whether the client may speak plain HTTP: always to a loopback endpoint;
/// elsewhere only when allowed, since credentials and data would cross the
/// network unencrypted. Refuses the rest. The same rule whether the endpoint
/// comes from the command line, the config or the environment.
fn http_allowed(endpoint: Option<&Endpoint>, allowed: bool) -> anyhow::Result<bool> {
    let Some(endpoint) = endpoint else {
        return Ok(allowed);
    };
    let Some(rest) = endpoint.url.strip_prefix("http://") else {
        return Ok(allowed);
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host),
    };
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|address| address.is_loopback());
    if loopback || allowed {
        return Ok(true);
    }
    let named_by = endpoint
        .variable
        .map(|variable| format!(" (named by {variable})"))
        .unwrap_or_default();
    anyhow::bail!(
        "refusing plain HTTP to the object store at {host}{named_by}: credentials and data would cross the network unencrypted. Use an https:// endpoint, or allow it with --s3-allow-http (pool create) or allow_http = true under [object_store]"
    )
}

/// The file of a pool's data directory that keeps the epoch the pool last
/// took of its object tier (decision 0034).
pub const EPOCH_RECORD_FILE: &str = "object-tier-epoch";

/// The pool's [`EpochRecord`]: a decimal number in `DATA/object-tier-epoch`,
/// replaced atomically (written beside, synced, renamed, the folder synced).
pub struct FileEpochRecord {
    path: std::path::PathBuf,
}

impl FileEpochRecord {
    pub fn new(data_dir: &std::path::Path) -> Self {
        Self {
            path: data_dir.join(EPOCH_RECORD_FILE),
        }
    }
}

impl EpochRecord for FileEpochRecord {
    fn last_epoch(&self) -> std::io::Result<Option<u64>> {
        match std::fs::read_to_string(&self.path) {
            Ok(text) => text.trim().parse().map(Some).map_err(|_| {
                std::io::Error::other(format!(
                    "{} holds {:?}, not an epoch number",
                    self.path.display(),
                    text.trim()
                ))
            }),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    fn record(&self, epoch: u64) -> std::io::Result<()> {
        use std::io::Write as _;
        let staged = self.path.with_extension("new");
        let mut file = crate::data_files::create_data_file(&staged)?;
        writeln!(file, "{epoch}")?;
        file.sync_all()?;
        std::fs::rename(&staged, &self.path)?;
        if let Some(folder) = self.path.parent() {
            std::fs::File::open(folder)?.sync_all()?;
        }
        Ok(())
    }
}

/// Creates the object tier (refused when its prefix already holds one).
pub(crate) async fn create_device(
    data_dir: &std::path::Path,
    description: &ObjectTierDescription,
    section: &ObjectStoreSection,
    size_bytes: u64,
    segment_size_bytes: u64,
) -> anyhow::Result<Arc<ObjectStoreDevice>> {
    let config = store_config(description, section)?;
    // The engine's capacity segments start after the capacity device's
    // label: the tier's segments start there too, one object key per
    // engine segment.
    let origin_bytes = CAPACITY_DATA_START_BLOCKS * BLOCK_SIZE_BYTES;
    let geometry = TierGeometry::new(size_bytes, segment_size_bytes, origin_bytes);
    // The caller's message names the tier; the error names the request.
    ObjectStoreDevice::create_recorded(&config, geometry, &FileEpochRecord::new(data_dir))
        .await
        .context("cannot create the object tier")
}

/// Opens the object tier `pool.toml` describes; refused when another
/// process took it since this pool last did (the message says how to take
/// it back on purpose).
pub(crate) async fn open_device(
    data_dir: &std::path::Path,
    description: &ObjectTierDescription,
    section: &ObjectStoreSection,
) -> anyhow::Result<Arc<ObjectStoreDevice>> {
    let config = store_config(description, section)?;
    let record = FileEpochRecord::new(data_dir);
    let device = match ObjectStoreDevice::open_recorded(&config, &record).await {
        Ok(device) => device,
        Err(error @ ObjectStoreError::TakenSinceLastUse { .. }) => anyhow::bail!(
            "cannot open the object tier {}: {error}. If that process is gone for good and this pool is the copy to keep, remove {} and open the pool again; blocks the other process changed will then read as errors",
            description.url,
            record.path.display()
        ),
        Err(error) => {
            return Err(anyhow::Error::new(error)
                .context(format!("cannot open the object tier {}", description.url)));
        }
    };
    tracing::info!(url = %description.url, "object tier opened");
    Ok(device)
}

/// The open object tier, for `pool status` and `/metrics`.
#[derive(Clone)]
pub struct ObjectTier {
    device: Arc<ObjectStoreDevice>,
}

impl std::fmt::Debug for ObjectTier {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ObjectTier")
            .field("url", &self.device.url())
            .finish()
    }
}

impl ObjectTier {
    pub fn new(device: Arc<ObjectStoreDevice>) -> Self {
        Self { device }
    }

    /// `pool status`'s object tier section.
    pub fn status(&self) -> lamina_api::ObjectTierStatus {
        let statistics = self.device.statistics();
        let request =
            |kind: &str, request: &RequestStatistics| lamina_api::ObjectRequestStatistics {
                kind: kind.to_string(),
                count: request.count,
                errors: request.errors,
                bytes: request.bytes,
                latency_p50_us: request.latency_p50_us,
                latency_p99_us: request.latency_p99_us,
                latency_max_us: request.latency_max_us,
                retries: request.retries,
                throttled: request.throttled,
                server_errors: request.server_errors,
                timeouts: request.timeouts,
                transport_errors: request.transport_errors,
            };
        lamina_api::ObjectTierStatus {
            url: self.device.url(),
            object_count: statistics.objects_stored,
            stored_bytes: statistics.bytes_stored,
            pending_bytes: statistics.pending_bytes,
            requests: vec![
                request("get", &statistics.get),
                request("put", &statistics.put),
                request("delete", &statistics.delete),
                request("list", &statistics.list),
                request("label_put", &statistics.label_put),
            ],
            epoch: statistics.epoch,
            flushes_committed: statistics.flushes_committed,
            fenced_by_epoch: statistics.fenced_by_epoch,
        }
    }

    /// Series in the Prometheus text format.
    pub fn metrics(&self, exposition: &mut Exposition) {
        let status = self.status();
        let gauges = [
            (
                "lamina_object_tier_objects",
                "Objects the object tier holds.",
                status.object_count,
            ),
            (
                "lamina_object_tier_stored_bytes",
                "Bytes the object tier's objects hold.",
                status.stored_bytes,
            ),
            (
                "lamina_object_tier_pending_bytes",
                "Bytes written to the object tier and not yet stored (the next flush uploads them).",
                status.pending_bytes,
            ),
            (
                "lamina_object_tier_fenced",
                "1 when another process opened the object tier after this daemon, which then stores nothing more in it.",
                u64::from(status.fenced_by_epoch.is_some()),
            ),
        ];
        for (name, help, value) in gauges {
            exposition.gauge(name, help).sample(&[], value);
        }
        Self::request_metrics(&status.requests, exposition);
        Self::latency_metrics(&status.requests, exposition);
    }

    /// The requests' counters since the pool opened, by kind.
    fn request_metrics(
        requests: &[lamina_api::ObjectRequestStatistics],
        exposition: &mut Exposition,
    ) {
        type Field = fn(&lamina_api::ObjectRequestStatistics) -> u64;
        let series: [(&str, &str, Field); 8] = [
            (
                "lamina_object_requests_total",
                "Requests to the object store since the pool opened.",
                |request| request.count,
            ),
            (
                "lamina_object_request_errors_total",
                "Requests to the object store that failed after their retries.",
                |request| request.errors,
            ),
            (
                "lamina_object_request_bytes_total",
                "Bytes sent (put) or received (get) by requests to the object store.",
                |request| request.bytes,
            ),
            (
                "lamina_object_request_retries_total",
                "HTTP attempts beyond a request's first (retries with backoff on throttling, 5xx, timeouts and dropped connections).",
                |request| request.retries,
            ),
            (
                "lamina_object_request_throttled_total",
                "Attempts the object store answered 503 (Slow Down) or 429.",
                |request| request.throttled,
            ),
            (
                "lamina_object_request_server_errors_total",
                "Attempts the object store answered with a 5xx other than 503.",
                |request| request.server_errors,
            ),
            (
                "lamina_object_request_timeouts_total",
                "Attempts to the object store that timed out.",
                |request| request.timeouts,
            ),
            (
                "lamina_object_request_transport_errors_total",
                "Attempts to the object store whose connection was refused, reset or cut.",
                |request| request.transport_errors,
            ),
        ];
        for (name, help, field) in series {
            let mut family = exposition.counter(name, help);
            for request in requests {
                family.sample(&[label("kind", &request.kind)], field(request));
            }
        }
    }

    /// The requests' latency percentiles and maximum since the pool opened,
    /// in seconds, as gauges (the histograms stay in the tier; a summary's
    /// `quantile` label would need the sum of latencies, which it does not
    /// keep).
    fn latency_metrics(
        requests: &[lamina_api::ObjectRequestStatistics],
        exposition: &mut Exposition,
    ) {
        type Field = fn(&lamina_api::ObjectRequestStatistics) -> u64;
        let series: [(&str, &str, Field); 3] = [
            (
                "lamina_object_request_latency_p50_seconds",
                "Median latency of requests to the object store (retries included) since the pool opened.",
                |request| request.latency_p50_us,
            ),
            (
                "lamina_object_request_latency_p99_seconds",
                "99th percentile latency of requests to the object store (retries included) since the pool opened.",
                |request| request.latency_p99_us,
            ),
            (
                "lamina_object_request_latency_max_seconds",
                "Longest request to the object store (retries included) since the pool opened.",
                |request| request.latency_max_us,
            ),
        ];
        for (name, help, microseconds) in series {
            let mut family = exposition.gauge(name, help);
            for request in requests {
                let seconds = microseconds(request) as f64 / MICROSECONDS_PER_SECOND;
                family.sample(&[label("kind", &request.kind)], seconds);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_after_the_prefix_is_the_tiers_size() {
        let argument = parse_argument("s3://bucket/pools/one:2T").unwrap();
        assert_eq!(argument.url, "s3://bucket/pools/one");
        assert_eq!(argument.size_bytes, 2 << 40);
        let argument = parse_argument("s3://bucket").unwrap();
        assert_eq!(argument.url, "s3://bucket");
        assert_eq!(argument.size_bytes, OBJECT_TIER_DEFAULT_SIZE_BYTES);
    }

    #[test]
    fn a_bad_size_or_address_is_refused() {
        assert!(parse_argument("s3://bucket/prefix:12Q").is_err());
        assert!(parse_argument("s3://").is_err());
        assert!(parse_argument("/dev/sda").is_err());
    }

    fn named(url: &str) -> Option<Endpoint> {
        Some(Endpoint {
            url: url.to_string(),
            variable: None,
        })
    }

    #[test]
    fn plain_http_stays_on_loopback_unless_allowed() {
        let allowed = |url: &str, allowed: bool| http_allowed(named(url).as_ref(), allowed);
        assert!(allowed("http://127.0.0.1:8333", false).unwrap());
        assert!(allowed("http://localhost:8333/", false).unwrap());
        assert!(allowed("http://[::1]:8333", false).unwrap());
        let refused = allowed("http://10.0.0.5:8333", false).unwrap_err();
        assert!(refused.to_string().contains("10.0.0.5"), "{refused}");
        assert!(allowed("http://10.0.0.5:8333", true).unwrap());
        assert!(!allowed("https://s3.example.com", false).unwrap());
        assert!(!http_allowed(None, false).unwrap());
    }

    /// An endpoint from the environment meets the same rule, and a refusal
    /// names the variable that gave it.
    #[test]
    fn plain_http_named_by_the_environment_follows_the_same_rule() {
        let from_environment = |url: &str| Endpoint {
            url: url.to_string(),
            variable: Some("AWS_ENDPOINT_URL"),
        };
        assert!(http_allowed(Some(&from_environment("http://127.0.0.1:8333")), false).unwrap());
        let refused =
            http_allowed(Some(&from_environment("http://10.0.0.5:8333")), false).unwrap_err();
        assert!(
            refused.to_string().contains("AWS_ENDPOINT_URL"),
            "{refused}"
        );
    }

    #[test]
    fn the_secret_is_not_debug_printed() {
        let section = ObjectStoreSection {
            secret_access_key: Some("hunter2".to_string()),
            ..ObjectStoreSection::default()
        };
        assert!(!format!("{section:?}").contains("hunter2"));
    }
}
