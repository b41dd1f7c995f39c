//! Typed errors of an object-store tier, each with its context (bucket, key,
//! operation), and their conversion into the device layer's error, which the
//! engine reports to clients as EIO.
//!
//! A failed request is told in one line a person can act on: the request
//! (method and URL of its last HTTP attempt), what came back (the HTTP status
//! and S3's error code, or the transport failure), how many attempts it took,
//! and what to check. object_store's own error is kept for its kind but is
//! neither printed whole nor offered as the error's `source()`: each of its
//! layers prints the next one's text and then offers it as its source, so
//! printing the chain said the same cause four or five times (issue 42).

use lamina_device::{DeviceError, DeviceErrorKind};
use object_store::client::HttpErrorKind;

use crate::attempts::LastAttempt;
pub use crate::request_kind::RequestKind;

/// What went wrong with a tier.
#[derive(Debug, thiserror::Error)]
pub enum ObjectStoreError {
    #[error("object store URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("object store limits: {reason}")]
    InvalidLimits { reason: String },
    #[error("object store tier geometry: {reason}")]
    InvalidGeometry { reason: String },
    /// The S3 client could not be set up (a malformed endpoint, say).
    #[error("cannot set up the S3 client for bucket {bucket}: {}", condensed_chain(.cause))]
    Client {
        bucket: String,
        /// Not a `source()`: see the module documentation.
        cause: object_store::Error,
    },
    /// A request failed after object_store's retries.
    #[error("{}", RequestFailureText::new(.operation, .bucket, .key, .last_attempt, .cause))]
    Request {
        operation: RequestKind,
        bucket: String,
        key: String,
        /// The request's last HTTP attempt; `None` when it made none (its
        /// credentials could not be had, say).
        last_attempt: Option<Box<LastAttempt>>,
        /// Not a `source()`: see the module documentation. Boxed, as is
        /// the last attempt: errors travel in `Result`s of the hot path.
        cause: Box<object_store::Error>,
    },
    #[error(
        "s3://{bucket}/{key} already holds a lamina tier label: refusing to create a tier over it"
    )]
    LabelExists { bucket: String, key: String },
    #[error(
        "s3://{bucket}/{prefix} already holds segment objects ({key} and maybe more) but no label: refusing to create a tier over them"
    )]
    PrefixNotEmpty {
        bucket: String,
        prefix: String,
        key: String,
    },
    #[error("s3://{bucket}/{key}: no lamina tier label (create the tier first, or check the URL)")]
    LabelMissing { bucket: String, key: String },
    #[error("s3://{bucket}/{key}: not a valid lamina tier label: {reason}")]
    LabelInvalid {
        bucket: String,
        key: String,
        reason: String,
    },
    #[error(
        "s3://{bucket}/{key}: tier label format version {found}, this lamina reads version {supported}"
    )]
    LabelFormatUnsupported {
        bucket: String,
        key: String,
        found: u32,
        supported: u32,
    },
    /// Another process opened the tier after this one: this one no longer
    /// writes to it (what it flushed since is not committed).
    #[error(
        "s3://{bucket}/{key}: the tier was opened again by another process (epoch {newer_epoch}, this process has epoch {epoch}); this process stores nothing more in it"
    )]
    Fenced {
        bucket: String,
        key: String,
        epoch: u64,
        newer_epoch: u64,
    },
    /// The tier's label carries an epoch this pool did not take: another
    /// process opened the tier since this pool last used it.
    #[error(
        "s3://{bucket}/{key}: the tier was opened by another process since this pool last used it (the tier is at epoch {epoch}, this pool last took epoch {last_epoch}): it may hold that process's writes, which this pool's metadata does not know; refusing to open it"
    )]
    TakenSinceLastUse {
        bucket: String,
        key: String,
        epoch: u64,
        last_epoch: u64,
    },
    /// The pool's record of its epoch could not be read or written.
    #[error("the record of this pool's object tier epoch: {source}")]
    EpochRecord { source: std::io::Error },
    /// The label kept changing while this process tried to open the tier.
    #[error(
        "s3://{bucket}/{key}: the tier's label changed during each of {attempts} attempts to open it: is another process opening the tier?"
    )]
    OpenContended {
        bucket: String,
        key: String,
        attempts: usize,
    },
    /// The layer above asked to open a region that is not one segment of
    /// the tier (its segment size or origin differs from the tier's label).
    #[error(
        "region at {offset} of {length} bytes is not one segment of the tier (segment size {segment_size_bytes}, origin {segment_origin_bytes})"
    )]
    RegionNotSegment {
        offset: u64,
        length: u64,
        segment_size_bytes: u64,
        segment_origin_bytes: u64,
    },
}

impl ObjectStoreError {
    /// As a device error on `device` for the request at `offset` of `length`.
    pub fn into_device_error(self, device: &str, offset: u64, length: u64) -> DeviceError {
        DeviceError::new(
            DeviceErrorKind::Io(std::io::Error::other(self)),
            device,
            offset,
            length,
        )
    }

    /// Whether a conditional PUT was refused: the object exists (`Create`)
    /// or is no longer the version given (`Update`).
    pub fn is_condition_failed(&self) -> bool {
        matches!(
            self,
            Self::Request { cause, .. } if matches!(
                **cause,
                object_store::Error::Precondition { .. } | object_store::Error::AlreadyExists { .. }
            )
        )
    }

    /// Whether a request failed because the object is not there.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Self::Request { cause, .. } if matches!(**cause, object_store::Error::NotFound { .. })
        )
    }
}

/// `error`'s text followed by each of its causes' that it does not already
/// hold: object_store's errors print their source's text and offer it as
/// their source too.
pub(crate) fn condensed_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(current) = cause {
        let current_text = current.to_string();
        if !text.contains(&current_text) {
            text.push_str(": ");
            text.push_str(&current_text);
        }
        cause = current.source();
    }
    text
}

/// The text of the deepest cause of `error` (for a refused connection,
/// `Connection refused (os error 111)`).
fn deepest_cause(error: &(dyn std::error::Error + 'static)) -> String {
    let mut deepest = error;
    while let Some(cause) = deepest.source() {
        deepest = cause;
    }
    deepest.to_string()
}

/// The text between `<{tag}>` and `</{tag}>` in an S3 error document.
fn xml_element(text: &str, tag: &str) -> Option<String> {
    let start = text.find(&format!("<{tag}>"))? + tag.len() + 2;
    let length = text[start..].find(&format!("</{tag}>"))?;
    Some(text[start..start + length].trim().to_string())
}

/// What a failed request met, in the terms of its advice.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    /// The store answered with an error status (and, with a body, S3's
    /// error code and message).
    Status {
        status: crate::attempts::HttpStatus,
        code: Option<String>,
        message: Option<String>,
    },
    /// No answer, or an answer cut off.
    Transport { kind: HttpErrorKind, detail: String },
    /// Anything else (an answer that could not be understood, a request
    /// never sent).
    Other { detail: String },
}

impl Answer {
    fn of(last_attempt: Option<&LastAttempt>, cause: &object_store::Error) -> Self {
        let status = last_attempt.and_then(|attempt| attempt.status);
        if let Some(status) = status.filter(|status| status.code >= 300) {
            let text = condensed_chain(cause);
            return Self::Status {
                status,
                code: xml_element(&text, "Code"),
                message: xml_element(&text, "Message")
                    .map(|message| message.trim_end_matches('.').to_string()),
            };
        }
        match last_attempt.and_then(|attempt| attempt.transport_failure) {
            Some(kind) => Self::Transport {
                kind,
                detail: deepest_cause(cause),
            },
            None => Self::Other {
                detail: condensed_chain(cause),
            },
        }
    }

    /// What to check, where the answer says.
    fn advice(&self) -> Option<&'static str> {
        match self {
            Self::Status { status, code, .. } => status_advice(status.code, code.as_deref()),
            Self::Transport { kind, .. } => match kind {
                HttpErrorKind::Connect => Some(
                    "check the endpoint (--s3-endpoint, AWS_ENDPOINT_URL, or endpoint under [object_store]) and that the store is running there",
                ),
                HttpErrorKind::Timeout => Some(
                    "the store did not answer in time: check the endpoint and the network, or raise request_timeout_ms under [object_store]",
                ),
                HttpErrorKind::Request | HttpErrorKind::Interrupted => {
                    Some("the connection broke off: check the network and the store")
                }
                _ => None,
            },
            Self::Other { .. } => None,
        }
    }
}

/// What to check after an error status, by the status and S3's code.
fn status_advice(status: u16, code: Option<&str>) -> Option<&'static str> {
    const CREDENTIALS: &str = "check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or access_key_id and secret_access_key under [object_store])";
    match (status, code) {
        (_, Some("NoSuchBucket")) => Some("create the bucket, or check its name and the endpoint"),
        (_, Some("InvalidAccessKeyId" | "SignatureDoesNotMatch")) | (401, _) => Some(CREDENTIALS),
        (403, _) => Some(
            "the store refused the request: check the key and secret, and that they may use this bucket",
        ),
        (_, Some("AuthorizationHeaderMalformed" | "PermanentRedirect")) | (301 | 307, _) => {
            Some("check the region (--s3-region, AWS_REGION, or region under [object_store])")
        }
        (429 | 500..=599, _) => Some(
            "the store failed or is overloaded (the request was retried with backoff): check its health",
        ),
        _ => None,
    }
}

impl std::fmt::Display for Answer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Status {
                status,
                code,
                message,
            } => {
                write!(formatter, "{status}")?;
                match (code, message) {
                    (Some(code), Some(message)) => write!(formatter, ", {code}: {message}"),
                    (Some(code), None) => write!(formatter, ", {code}"),
                    _ => Ok(()),
                }
            }
            Self::Transport { kind, detail } => {
                let what = match kind {
                    HttpErrorKind::Connect => "could not connect",
                    HttpErrorKind::Request => "could not send the request",
                    HttpErrorKind::Timeout => "timed out",
                    HttpErrorKind::Interrupted => "the connection broke off",
                    HttpErrorKind::Decode => "could not read the answer",
                    _ => "failed",
                };
                write!(formatter, "{what}: {detail}")
            }
            Self::Other { detail } => formatter.write_str(detail),
        }
    }
}

/// A failed request's one line. See the module documentation.
struct RequestFailureText<'a> {
    operation: RequestKind,
    bucket: &'a str,
    key: &'a str,
    last_attempt: Option<&'a LastAttempt>,
    cause: &'a object_store::Error,
}

impl<'a> RequestFailureText<'a> {
    fn new(
        operation: &RequestKind,
        bucket: &'a str,
        key: &'a str,
        last_attempt: &'a Option<Box<LastAttempt>>,
        cause: &'a object_store::Error,
    ) -> Self {
        Self {
            operation: *operation,
            bucket,
            key,
            last_attempt: last_attempt.as_deref(),
            cause,
        }
    }
}

impl std::fmt::Display for RequestFailureText<'_> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.last_attempt {
            Some(attempt) => {
                write!(formatter, "{} {}", attempt.method, attempt.url)?;
                // A LIST is a GET and a bulk DELETE a POST: say which.
                if !self.operation.to_string().starts_with(&attempt.method) {
                    write!(formatter, " ({})", self.operation)?;
                }
            }
            None => write!(
                formatter,
                "{} s3://{}/{}",
                self.operation, self.bucket, self.key
            )?,
        }
        let answer = Answer::of(self.last_attempt, self.cause);
        write!(formatter, ": {answer}")?;
        if let Some(attempts) = self
            .last_attempt
            .map(|attempt| attempt.attempts)
            .filter(|attempts| *attempts > 1)
        {
            write!(formatter, ", after {attempts} attempts")?;
        }
        match answer.advice() {
            Some(advice) => write!(formatter, "; {advice}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attempts::HttpStatus;

    /// An error that prints its source's text and offers it as its source
    /// too, as object_store's layers do.
    #[derive(Debug)]
    struct Wrapping {
        prefix: &'static str,
        source: Box<dyn std::error::Error + Send + Sync>,
    }

    impl std::fmt::Display for Wrapping {
        fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(formatter, "{}{}", self.prefix, self.source)
        }
    }

    impl std::error::Error for Wrapping {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&*self.source)
        }
    }

    fn generic(innermost: &str) -> object_store::Error {
        let retry = Wrapping {
            prefix: "Error performing GET http://127.0.0.1:1/b/k in 2s - ",
            source: Box::new(std::io::Error::other(innermost.to_string())),
        };
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(retry),
        }
    }

    fn request(last_attempt: Option<LastAttempt>, cause: object_store::Error) -> String {
        ObjectStoreError::Request {
            operation: RequestKind::List,
            bucket: "bucket".to_string(),
            key: "pools/one".to_string(),
            last_attempt: last_attempt.map(Box::new),
            cause: Box::new(cause),
        }
        .to_string()
    }

    fn attempt(status: Option<u16>, transport_failure: Option<HttpErrorKind>) -> LastAttempt {
        LastAttempt {
            method: "GET".to_string(),
            url: "http://127.0.0.1:1/bucket?list-type=2".to_string(),
            status: status.map(|code| HttpStatus { code, reason: None }),
            transport_failure,
            attempts: 3,
        }
    }

    #[test]
    fn a_refused_connection_names_the_request_the_cause_once_and_what_to_check() {
        let text = request(
            Some(attempt(None, Some(HttpErrorKind::Connect))),
            generic("Connection refused (os error 111)"),
        );
        assert_eq!(
            text,
            "GET http://127.0.0.1:1/bucket?list-type=2 (LIST): could not connect: Connection refused (os error 111), after 3 attempts; check the endpoint (--s3-endpoint, AWS_ENDPOINT_URL, or endpoint under [object_store]) and that the store is running there"
        );
    }

    #[test]
    fn an_error_status_gives_s3s_code_and_message() {
        let body = "Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?>\n<Error><Code>NoSuchBucket</Code><Message>The specified bucket does not exist</Message></Error>";
        let text = request(Some(attempt(Some(404), None)), generic(body));
        assert!(
            text.contains("(LIST): HTTP 404, NoSuchBucket: The specified bucket does not exist, after 3 attempts; create the bucket"),
            "{text}"
        );
        assert!(!text.contains("<Error>"), "{text}");
    }

    #[test]
    fn without_an_attempt_the_tier_location_and_the_condensed_cause_are_told() {
        let text = request(None, generic("no credentials"));
        assert_eq!(
            text,
            "LIST s3://bucket/pools/one: Generic S3 error: Error performing GET http://127.0.0.1:1/b/k in 2s - no credentials"
        );
    }

    #[test]
    fn statuses_and_codes_lead_to_their_advice() {
        assert!(
            status_advice(403, Some("InvalidAccessKeyId"))
                .unwrap()
                .contains("credentials")
        );
        assert!(status_advice(403, None).unwrap().contains("key and secret"));
        assert!(
            status_advice(400, Some("AuthorizationHeaderMalformed"))
                .unwrap()
                .contains("region")
        );
        assert!(status_advice(503, None).unwrap().contains("overloaded"));
        assert_eq!(status_advice(404, Some("NoSuchKey")), None);
    }
}
