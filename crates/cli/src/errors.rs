//! What the CLI adds to an error so that its one line says what to do: the
//! flag that overrides a refusal, or the command that lists what a name did
//! not match. The engine and the control plane say what failed and on what;
//! only the CLI knows its own flags and commands.

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
        Some(hint) => anyhow::anyhow!("{error:#} ({hint})"),
        None => error,
    }
}

/// [`with_flag_hint`], and for a name that matched nothing in the pool in
/// `data_dir`, the command that lists the names there are.
pub fn with_hint(error: anyhow::Error, data_dir: &Path) -> anyhow::Error {
    let listing = refusal_kind(&error).and_then(|kind| listing_hint_for_kind(&kind, data_dir));
    match listing {
        Some(hint) => anyhow::anyhow!("{error:#} ({hint})"),
        None => with_flag_hint(error),
    }
}
