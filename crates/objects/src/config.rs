//! Where a tier lives (`s3://bucket/prefix`, an endpoint, a region,
//! credentials) and the limits every request to it runs under. The URL is
//! operator input: it is checked strictly here, with messages that say what
//! is wrong, so that a typo never becomes a tier in the wrong place.

use std::sync::Arc;
use std::time::Duration;

use crate::ObjectStoreError;
use crate::attempts::CountingConnector;
use crate::requests::DELETE_REQUEST_OBJECTS_MAX;

/// Limits of the requests a tier makes. Every request waits for one of
/// `requests_in_flight_max` permits; object_store retries a failed request
/// with exponential backoff until `retries_max` retries or
/// `retry_timeout_ms` since its first attempt, whichever comes first.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectStoreLimits {
    /// Requests (PUT, GET, DELETE, LIST) in flight at once.
    pub requests_in_flight_max: usize,
    /// One attempt of one request, from sending to the end of the body.
    pub request_timeout_ms: u64,
    /// Establishing a connection.
    pub connect_timeout_ms: u64,
    /// Retries of one request after its first attempt.
    pub retries_max: usize,
    /// No retry starts later than this after a request's first attempt.
    pub retry_timeout_ms: u64,
    /// The first backoff between attempts; it doubles up to
    /// `retry_backoff_max_ms`.
    pub retry_backoff_initial_ms: u64,
    pub retry_backoff_max_ms: u64,
    /// The longest part object a flush writes: a longer run of a segment is
    /// written as several parts (each one PUT, in parallel).
    pub part_bytes_max: u64,
    /// Objects one bulk DELETE request names (S3 allows 1000).
    pub delete_batch_objects_max: usize,
    /// How long a failed background delete waits before it is tried again.
    pub delete_retry_delay_ms: u64,
}

impl Default for ObjectStoreLimits {
    fn default() -> Self {
        Self {
            requests_in_flight_max: 32,
            request_timeout_ms: 30_000,
            connect_timeout_ms: 5_000,
            retries_max: 10,
            retry_timeout_ms: 120_000,
            retry_backoff_initial_ms: 100,
            retry_backoff_max_ms: 15_000,
            part_bytes_max: 16 << 20,
            delete_batch_objects_max: 1000,
            delete_retry_delay_ms: 30_000,
        }
    }
}

impl ObjectStoreLimits {
    /// Refuses limits that cannot work (zero concurrency, zero timeouts, a
    /// part size that is not a whole number of device blocks).
    pub fn validate(&self) -> Result<(), ObjectStoreError> {
        let invalid = |reason: &str| {
            Err(ObjectStoreError::InvalidLimits {
                reason: reason.to_string(),
            })
        };
        if self.requests_in_flight_max == 0 {
            return invalid("requests_in_flight_max must be at least 1");
        }
        if self.request_timeout_ms == 0 || self.connect_timeout_ms == 0 {
            return invalid("request_timeout_ms and connect_timeout_ms must be above 0");
        }
        if self.retry_backoff_initial_ms == 0
            || self.retry_backoff_max_ms < self.retry_backoff_initial_ms
        {
            return invalid(
                "retry_backoff_initial_ms must be above 0 and at most retry_backoff_max_ms",
            );
        }
        if self.part_bytes_max == 0
            || !self
                .part_bytes_max
                .is_multiple_of(lamina_device::DEVICE_ALIGNMENT_BYTES)
        {
            return invalid("part_bytes_max must be a positive multiple of 4096");
        }
        if !(1..=DELETE_REQUEST_OBJECTS_MAX).contains(&self.delete_batch_objects_max) {
            return invalid("delete_batch_objects_max must be between 1 and 1000");
        }
        Ok(())
    }

    pub(crate) fn retry_config(&self) -> object_store::RetryConfig {
        object_store::RetryConfig {
            backoff: object_store::BackoffConfig {
                init_backoff: Duration::from_millis(self.retry_backoff_initial_ms),
                max_backoff: Duration::from_millis(self.retry_backoff_max_ms),
                base: 2.0,
            },
            max_retries: self.retries_max,
            retry_timeout: Duration::from_millis(self.retry_timeout_ms),
        }
    }
}

/// Where and how to reach a tier's store. See the module documentation.
#[derive(Clone, PartialEq, Eq)]
pub struct ObjectStoreConfig {
    pub(crate) bucket: String,
    /// Folders below the bucket, without leading or trailing slashes; empty
    /// for the bucket's root.
    pub(crate) prefix: String,
    pub(crate) endpoint: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) access_key_id: Option<String>,
    pub(crate) secret_access_key: Option<String>,
    pub(crate) virtual_hosted_style: bool,
    pub(crate) allow_http: bool,
    pub(crate) limits: ObjectStoreLimits,
}

impl std::fmt::Debug for ObjectStoreConfig {
    /// Everything but the secret.
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ObjectStoreConfig")
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field(
                "secret_access_key",
                &self.secret_access_key.as_ref().map(|_| "<hidden>"),
            )
            .field("virtual_hosted_style", &self.virtual_hosted_style)
            .field("allow_http", &self.allow_http)
            .field("limits", &self.limits)
            .finish()
    }
}

/// The URL scheme a tier's location is written with.
const URL_SCHEME: &str = "s3://";

impl ObjectStoreConfig {
    /// `s3://bucket` or `s3://bucket/some/prefix` (a trailing slash is
    /// allowed); everything else (other schemes, ports, credentials, queries,
    /// empty or dot folders, characters outside S3's safe set) is refused.
    pub fn from_url(url: &str) -> Result<Self, ObjectStoreError> {
        let invalid = |reason: String| ObjectStoreError::InvalidUrl {
            url: url.to_string(),
            reason,
        };
        let rest = url
            .strip_prefix(URL_SCHEME)
            .ok_or_else(|| invalid("it must start with s3://".to_string()))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        check_bucket_name(bucket).map_err(invalid)?;
        if rest.contains('/') && prefix.is_empty() {
            return Err(invalid(
                "the prefix has an empty folder (two slashes in a row)".to_string(),
            ));
        }
        check_prefix(prefix).map_err(invalid)?;
        Ok(Self {
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
            endpoint: None,
            region: None,
            access_key_id: None,
            secret_access_key: None,
            virtual_hosted_style: false,
            allow_http: false,
            limits: ObjectStoreLimits::default(),
        })
    }

    /// The store's URL, e.g. `https://s3.example.com:9000`; absent: AWS (or
    /// the `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL` or `AWS_ENDPOINT`
    /// environment variable).
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> Self {
        self.endpoint = Some(endpoint.into());
        self
    }

    pub fn with_region(mut self, region: impl Into<String>) -> Self {
        self.region = Some(region.into());
        self
    }

    /// A SigV4 access key; absent: the standard `AWS_*` environment variables.
    pub fn with_credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> Self {
        self.access_key_id = Some(access_key_id.into());
        self.secret_access_key = Some(secret_access_key.into());
        self
    }

    /// `https://bucket.host/key` instead of `https://host/bucket/key`.
    pub fn with_virtual_hosted_style(mut self, virtual_hosted_style: bool) -> Self {
        self.virtual_hosted_style = virtual_hosted_style;
        self
    }

    /// Allows an `http://` endpoint (a local test server).
    pub fn with_allow_http(mut self, allow_http: bool) -> Self {
        self.allow_http = allow_http;
        self
    }

    pub fn with_limits(mut self, limits: ObjectStoreLimits) -> Self {
        self.limits = limits;
        self
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    pub fn region(&self) -> Option<&str> {
        self.region.as_deref()
    }

    /// Whether an access key was given (otherwise the `AWS_*` environment
    /// variables, or the instance's credentials, are used).
    pub fn has_explicit_credentials(&self) -> bool {
        self.access_key_id.is_some() && self.secret_access_key.is_some()
    }

    pub fn virtual_hosted_style(&self) -> bool {
        self.virtual_hosted_style
    }

    pub fn allow_http(&self) -> bool {
        self.allow_http
    }

    pub fn limits(&self) -> &ObjectStoreLimits {
        &self.limits
    }

    /// `s3://bucket/prefix` (`s3://bucket` for the root).
    pub fn url(&self) -> String {
        if self.prefix.is_empty() {
            format!("{URL_SCHEME}{}", self.bucket)
        } else {
            format!("{URL_SCHEME}{}/{}", self.bucket, self.prefix)
        }
    }

    /// The S3 client, over the `AWS_*` environment with the explicit
    /// settings on top, its HTTP attempts counted (`attempts.rs`).
    pub(crate) fn build_store(
        &self,
    ) -> Result<Arc<dyn object_store::ObjectStore>, ObjectStoreError> {
        self.limits.validate()?;
        let mut builder = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(&self.bucket)
            .with_virtual_hosted_style_request(self.virtual_hosted_style)
            .with_allow_http(self.allow_http)
            .with_retry(self.limits.retry_config())
            // Counts each HTTP attempt (retries, throttling, errors).
            .with_http_connector(CountingConnector::default())
            .with_client_options(
                object_store::ClientOptions::new()
                    .with_allow_http(self.allow_http)
                    .with_timeout(Duration::from_millis(self.limits.request_timeout_ms))
                    .with_connect_timeout(Duration::from_millis(self.limits.connect_timeout_ms)),
            );
        if let Some(endpoint) = &self.endpoint {
            // Also as the S3 endpoint, which object_store prefers to the
            // endpoint: AWS_ENDPOINT_URL_S3 in the environment would
            // otherwise send the requests elsewhere.
            builder = builder
                .with_endpoint(endpoint)
                .with_config(object_store::aws::AmazonS3ConfigKey::S3Endpoint, endpoint);
        }
        if let Some(region) = &self.region {
            builder = builder.with_region(region);
        }
        if let (Some(key), Some(secret)) = (&self.access_key_id, &self.secret_access_key) {
            builder = builder
                .with_access_key_id(key)
                .with_secret_access_key(secret);
        }
        let store = builder.build().map_err(|cause| ObjectStoreError::Client {
            bucket: self.bucket.clone(),
            cause,
        })?;
        Ok(Arc::new(store))
    }
}

/// S3's rules for bucket names: 3 to 63 lowercase letters, digits, dots and
/// hyphens, starting and ending with a letter or digit, no `..`.
fn check_bucket_name(bucket: &str) -> Result<(), String> {
    if bucket.is_empty() {
        return Err("it names no bucket".to_string());
    }
    if bucket.contains(['@', ':']) {
        return Err(format!(
            "bucket {bucket:?}: credentials and ports do not belong in the URL (use the endpoint and credential options)"
        ));
    }
    if !(3..=63).contains(&bucket.len()) {
        return Err(format!("bucket {bucket:?} must be 3 to 63 characters long"));
    }
    let allowed = |byte: u8| {
        byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'.' || byte == b'-'
    };
    let alphanumeric = |byte: u8| byte.is_ascii_lowercase() || byte.is_ascii_digit();
    let bytes = bucket.as_bytes();
    if !bytes.iter().all(|byte| allowed(*byte))
        || !alphanumeric(bytes[0])
        || !alphanumeric(bytes[bytes.len() - 1])
        || bucket.contains("..")
    {
        return Err(format!(
            "bucket {bucket:?} may hold only lowercase letters, digits, dots and hyphens, and must start and end with a letter or digit"
        ));
    }
    Ok(())
}

/// Folders of S3's safe characters (letters, digits, `!-_.*'()`), none empty,
/// `.` or `..`; the whole prefix at most 512 bytes (keys are at most 1024).
fn check_prefix(prefix: &str) -> Result<(), String> {
    const PREFIX_BYTES_MAX: usize = 512;
    if prefix.is_empty() {
        return Ok(());
    }
    if prefix.len() > PREFIX_BYTES_MAX {
        return Err(format!(
            "the prefix is longer than {PREFIX_BYTES_MAX} bytes"
        ));
    }
    let safe =
        |character: char| character.is_ascii_alphanumeric() || "!-_.*'()".contains(character);
    for folder in prefix.split('/') {
        if folder.is_empty() {
            return Err("the prefix has an empty folder (two slashes in a row)".to_string());
        }
        if folder == "." || folder == ".." {
            return Err(format!("the prefix may not hold a {folder:?} folder"));
        }
        if let Some(character) = folder.chars().find(|character| !safe(*character)) {
            return Err(format!(
                "the prefix holds {character:?}: only letters, digits and !-_.*'() are allowed in folder names"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_and_prefixes_parse() {
        let config = ObjectStoreConfig::from_url("s3://my-bucket").unwrap();
        assert_eq!((config.bucket(), config.prefix()), ("my-bucket", ""));
        assert_eq!(config.url(), "s3://my-bucket");
        let config = ObjectStoreConfig::from_url("s3://my.bucket/pools/a-1/").unwrap();
        assert_eq!(
            (config.bucket(), config.prefix()),
            ("my.bucket", "pools/a-1")
        );
        assert_eq!(config.url(), "s3://my.bucket/pools/a-1");
    }

    #[test]
    fn bad_urls_are_refused_with_a_reason() {
        for (url, words) in [
            ("", "s3://"),
            ("http://bucket/x", "s3://"),
            ("s3:/bucket", "s3://"),
            ("s3://", "no bucket"),
            ("s3:///prefix", "no bucket"),
            ("s3://ab", "3 to 63"),
            ("s3://Bucket", "lowercase"),
            ("s3://-bucket", "start and end"),
            ("s3://bucket..x", "lowercase"),
            ("s3://key:secret@bucket", "credentials"),
            ("s3://bucket:9000/x", "ports"),
            ("s3://bucket//x", "empty folder"),
            ("s3://bucket//", "empty folder"),
            ("s3://bucket/a//b", "empty folder"),
            ("s3://bucket/a/../b", "\"..\""),
            ("s3://bucket/a b", "' '"),
            ("s3://bucket/a?versionId=1", "'?'"),
            ("s3://bucket/a#b", "'#'"),
            ("s3://bucket/ä", "'ä'"),
        ] {
            let error = ObjectStoreConfig::from_url(url).expect_err(url).to_string();
            assert!(error.contains(words), "{url}: {error}");
            assert!(error.contains(url), "{url}: {error}");
        }
    }

    #[test]
    fn limits_read_from_a_partial_document_keep_their_defaults() {
        let limits: ObjectStoreLimits =
            serde_json::from_str(r#"{"requests_in_flight_max": 8}"#).unwrap();
        assert_eq!(limits.requests_in_flight_max, 8);
        assert_eq!(limits.retries_max, ObjectStoreLimits::default().retries_max);
        assert!(serde_json::from_str::<ObjectStoreLimits>(r#"{"requests_max": 8}"#).is_err());
    }

    #[test]
    fn the_secret_is_not_in_debug_output() {
        let config = ObjectStoreConfig::from_url("s3://bucket")
            .unwrap()
            .with_credentials("key", "very-secret");
        assert!(!format!("{config:?}").contains("very-secret"));
    }

    #[test]
    fn default_limits_are_valid_and_zeros_are_not() {
        ObjectStoreLimits::default().validate().unwrap();
        let limits = ObjectStoreLimits {
            requests_in_flight_max: 0,
            ..ObjectStoreLimits::default()
        };
        assert!(limits.validate().is_err());
        let limits = ObjectStoreLimits {
            part_bytes_max: 5000,
            ..ObjectStoreLimits::default()
        };
        assert!(limits.validate().is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Any text: no panic, and what parses renders back as the same
        /// location (up to a trailing slash).
        #[test]
        fn arbitrary_urls_never_panic(text in "(s3://)?.{0,70}") {
            if let Ok(config) = ObjectStoreConfig::from_url(&text) {
                prop_assert_eq!(config.url(), text.trim_end_matches('/'));
            }
        }

        #[test]
        fn url_shaped_text_round_trips(text in "s3://[a-z0-9.:@-]{0,12}(/[a-zA-Z0-9./ _-]{0,8}){0,4}/?") {
            if let Ok(config) = ObjectStoreConfig::from_url(&text) {
                prop_assert_eq!(ObjectStoreConfig::from_url(&config.url()).unwrap(), config.clone());
                prop_assert_eq!(config.url(), text.strip_suffix('/').unwrap_or(&text));
            }
        }
    }
}
