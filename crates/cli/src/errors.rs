//! What the CLI adds to an error so that its one line says what to do: the
//! flag that overrides a refusal, or the command that lists what a name did
//! not match. The engine and the control plane say what failed and on what;
//! only the CLI knows its own flags and commands. And how that line is
//! printed: each cause once ([`one_line`]).

use std::path::Path;

use lamina_control::admin::{OperationError, VOLUME_IN_USE_KIND};
use lamina_control::store::PoolAlreadyDescribed;
use lamina_engine::EngineError;

/// The command-line flag that overrides a refusal, by the refusal's kind (an
/// engine error's [`EngineError::kind`], or the admin API's
/// [`OperationError::kind`]): the engine and the control plane say only that
/// the operation must be forced, the CLI says how.
fn flag_hint_for_kind(kind: &str) -> Option<&'static str> {
    match kind {
        "device_not_empty" => Some("pass --force to overwrite it"),
        "shrink_needs_force" => Some("pass --force to shrink it"),
        VOLUME_IN_USE_KIND => Some("pass --force to roll back under them"),
        _ => None,
    }
}

/// The command that shows the names a refused name should have been one of.
fn listing_hint_for_kind(kind: &str, data_dir: &Path) -> Option<String> {
    let data = data_dir.display();
    match kind {
        "no_such_volume" => Some(format!("see `lamina volume list --data {data}`")),
        "no_such_snapshot" => Some(format!("see `lamina snapshot list --data {data}`")),
        "volume_exists" => Some(format!(
            "pick another name; see `lamina volume list --data {data}`"
        )),
        _ => None,
    }
}

/// The kind of the first refusal in `error`'s chain of causes.
fn refusal_kind(error: &anyhow::Error) -> Option<String> {
    error.chain().find_map(|cause| {
        if let Some(refused) = cause.downcast_ref::<OperationError>() {
            Some(refused.kind.clone())
        } else {
            cause
                .downcast_ref::<EngineError>()
                .map(|engine| engine.kind().to_string())
        }
    })
}

/// `error` and its chain of causes in one line, `: ` between them, each
/// cause's text once: a cause whose text the line already holds is left out.
/// Some libraries' errors (object_store's, io::Error around another error)
/// print their source's text and offer it as their source too; printed as
/// anyhow's `{:#}` prints a chain, such a cause came out four or five times.
pub fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Adds to `error` the flag that overrides it, when it is a refusal a flag of
/// the command overrides (found anywhere in its chain of causes).
pub fn with_flag_hint(error: anyhow::Error) -> anyhow::Error {
    let hint = match refusal_kind(&error) {
        Some(kind) => flag_hint_for_kind(&kind),
        None if error
            .chain()
            .any(|cause| cause.is::<PoolAlreadyDescribed>()) =>
        {
            Some("pass --force to replace it")
        }
        None => None,
    };
    match hint {
        Some(hint) => anyhow::anyhow!("{} ({hint})", one_line(&error)),
        None => error,
    }
}

/// [`with_flag_hint`], and for a name that matched nothing in the pool in
/// `data_dir`, the command that lists the names there are.
pub fn with_hint(error: anyhow::Error, data_dir: &Path) -> anyhow::Error {
    let listing = refusal_kind(&error).and_then(|kind| listing_hint_for_kind(&kind, data_dir));
    match listing {
        Some(hint) => anyhow::anyhow!("{} ({hint})", one_line(&error)),
        None => with_flag_hint(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that prints its source's text and offers it as its source
    /// too, as object_store's do.
    #[derive(Debug)]
    struct Repeating {
        source: std::io::Error,
    }

    impl std::fmt::Display for Repeating {
        fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(formatter, "Generic S3 error: {}", self.source)
        }
    }

    impl std::error::Error for Repeating {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    #[test]
    fn a_cause_the_line_already_holds_is_printed_once() {
        let cause = std::io::Error::other("Connection refused (os error 111)");
        let error = anyhow::Error::new(Repeating { source: cause })
            .context("cannot create the object tier")
            .context("cannot create a pool");
        assert_eq!(
            one_line(&error),
            "cannot create a pool: cannot create the object tier: Generic S3 error: Connection refused (os error 111)"
        );
        assert_eq!(
            format!("{error:#}").matches("Connection refused").count(),
            2
        );
    }
}
