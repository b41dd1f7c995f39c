//! What the admin API is asked and how it refuses: the [`Operation`]s of
//! `lamina volume ...`, `snapshot ...`, `clone`, `pool status|scrub` and
//! `device ...` (the JSON body of `POST /v1/operations`, tagged by
//! `"operation"`), the [`AnswerKind`] each is answered with, and the
//! [`OperationError`] of a refused one (an HTTP status, a message and a kind
//! clients act on).

use lamina_engine::{CachePriority, Codec, EngineError, IoError, Pin, VolumeError};
use serde::{Deserialize, Serialize};

use super::answer::AnswerKind;

/// One administrative operation.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case", deny_unknown_fields)]
pub enum Operation {
    VolumeList,
    /// A thin volume; a priority or pin given here is set right after it is
    /// created (the rest of the policy is the default). Its codec
    /// (`"off"`, `"lz4"`, `"zstd:N"`) is `compression`, or the pool default
    /// of the daemon's config when absent.
    VolumeCreate {
        name: String,
        size_bytes: u64,
        #[serde(default)]
        priority: Option<CachePriority>,
        #[serde(default)]
        pin: Option<Pin>,
        #[serde(default)]
        compression: Option<Codec>,
    },
    /// Changes a volume's tier policy and its codec, live and durably; what
    /// is absent stays.
    VolumeSetPolicy {
        name: String,
        #[serde(default)]
        priority: Option<CachePriority>,
        #[serde(default)]
        pin: Option<Pin>,
        #[serde(default)]
        compression: Option<Codec>,
    },
    /// Where a volume's blocks live and where its reads were served from.
    VolumeStats {
        name: String,
    },
    /// NBD reads, writes, bytes and latency histograms since the daemon
    /// started, of one volume or of all (empty without a daemon).
    VolumeIo {
        #[serde(default)]
        name: Option<String>,
    },
    VolumeResize {
        name: String,
        size_bytes: u64,
        force: bool,
    },
    VolumeRename {
        name: String,
        new_name: String,
    },
    VolumeDelete {
        name: String,
    },
    /// A read-only snapshot `volume@snapshot` of a volume's current contents.
    SnapshotCreate {
        volume: String,
        snapshot: String,
    },
    /// Snapshots of one volume, or of all when `volume` is absent.
    SnapshotList {
        #[serde(default)]
        volume: Option<String>,
    },
    SnapshotDelete {
        volume: String,
        snapshot: String,
    },
    /// Reads every live block, checks it, repairs what fails from redundancy.
    PoolScrub {
        /// Scrub to the end before answering (otherwise in the background).
        #[serde(default)]
        wait: bool,
    },
    /// Refused while NBD clients have the volume open, unless `force`.
    SnapshotRollback {
        volume: String,
        snapshot: String,
        #[serde(default)]
        force: bool,
    },
    /// A writable volume `new_name` starting as `volume@snapshot`.
    VolumeClone {
        volume: String,
        snapshot: String,
        new_name: String,
    },
    PoolStatus,
    /// Every device of an array pool.
    DeviceList,
    /// Takes a device out by hand, as if it had failed.
    DeviceFail {
        path: String,
    },
    /// Rebuilds `old`'s contents onto `new` (`PATH[:SIZE]`), which then
    /// takes its place.
    DeviceReplace {
        old: String,
        new: String,
        /// Rebuild to the end before answering (otherwise in the background).
        #[serde(default)]
        wait: bool,
    },
    /// Moves the data of `path` onto the tier's other devices, then empties
    /// its slot (answers when done).
    DeviceRemove {
        path: String,
    },
    /// `path` (`PATH[:SIZE]`) joins `tier`'s array in an empty slot.
    DeviceAdd {
        path: String,
        tier: lamina_api::TierName,
    },
    /// Rebuilds onto distributed spare space now (what `rebuild_automatic`
    /// does by itself): the data of segments on a lost device moves to the
    /// others.
    DeviceRebuild,
    /// Moves the data of segments narrower than the arrays now are (after
    /// `device add`) to segments laid out over every device in use
    /// (answers when done).
    DeviceRebalance,
}

impl Operation {
    /// The operation's name as sent (`volume_create`).
    pub fn name(&self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|value| value["operation"].as_str().map(str::to_owned))
            .unwrap_or_default()
    }

    /// Whether the operation changes the pool (and is therefore audited).
    pub fn changes_state(&self) -> bool {
        !matches!(
            self,
            Operation::VolumeList
                | Operation::VolumeStats { .. }
                | Operation::VolumeIo { .. }
                | Operation::SnapshotList { .. }
                | Operation::PoolStatus
                | Operation::DeviceList
        )
    }

    /// The document the operation is answered with: what a client decodes
    /// the answer's JSON as ([`super::answer::Answer::from_json`]).
    pub fn answer_kind(&self) -> AnswerKind {
        match self {
            Operation::VolumeList => AnswerKind::Volumes,
            Operation::VolumeCreate { .. }
            | Operation::VolumeSetPolicy { .. }
            | Operation::VolumeResize { .. }
            | Operation::VolumeRename { .. }
            | Operation::SnapshotRollback { .. }
            | Operation::VolumeClone { .. } => AnswerKind::Volume,
            Operation::VolumeStats { .. } => AnswerKind::VolumeTierStats,
            Operation::VolumeIo { .. } => AnswerKind::VolumeIo,
            Operation::VolumeDelete { .. } | Operation::SnapshotDelete { .. } => {
                AnswerKind::Deleted
            }
            Operation::SnapshotCreate { .. } => AnswerKind::Snapshot,
            Operation::SnapshotList { .. } => AnswerKind::Snapshots,
            Operation::PoolStatus => AnswerKind::PoolStatus,
            Operation::PoolScrub { .. } => AnswerKind::Scrub,
            Operation::DeviceList | Operation::DeviceFail { .. } | Operation::DeviceAdd { .. } => {
                AnswerKind::Devices
            }
            Operation::DeviceReplace { .. }
            | Operation::DeviceRemove { .. }
            | Operation::DeviceRebuild
            | Operation::DeviceRebalance => AnswerKind::Rebuild,
        }
    }
}

/// A failed operation: an HTTP status, a message for the user, and what kind
/// of error it is, for clients that act on it (the CLI adds which flag
/// overrides a refusal) without reading the message.
#[derive(Debug, Serialize, Deserialize, thiserror::Error)]
#[error("{error}")]
pub struct OperationError {
    pub status: u16,
    pub error: String,
    /// The engine error's [`EngineError::kind`] (`"shrink_needs_force"`), one
    /// of the control plane's own (`"volume_in_use"`), or empty when unknown
    /// (answers of daemons from before kinds were sent).
    #[serde(default)]
    pub kind: String,
}

/// [`OperationError::kind`] of a rollback refused because NBD clients have the
/// volume open.
pub const VOLUME_IN_USE_KIND: &str = "volume_in_use";

impl From<EngineError> for OperationError {
    fn from(error: EngineError) -> Self {
        let status = match &error {
            EngineError::Volume(error) => match error {
                VolumeError::NoSuchVolume(_) | VolumeError::NoSuchSnapshot { .. } => 404,
                VolumeError::VolumeExists(_)
                | VolumeError::SnapshotExists { .. }
                | VolumeError::HasClones { .. }
                | VolumeError::NotNewestSnapshot { .. } => 409,
                VolumeError::InvalidName { .. }
                | VolumeError::InvalidSize { .. }
                | VolumeError::ShrinkNeedsForce { .. } => 400,
                VolumeError::ReadOnly(_) => 500,
            },
            EngineError::Io(IoError::NoSpace | IoError::DeviceFull { .. }) => 507,
            _ => 500,
        };
        Self {
            status,
            error: error.to_string(),
            kind: error.kind().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_refusal_carries_its_kind_and_an_old_answer_without_one_reads() {
        let refused = OperationError::from(EngineError::Volume(VolumeError::ShrinkNeedsForce {
            volume: "db".into(),
            from_bytes: 2,
            to_bytes: 1,
        }));
        assert_eq!(
            (refused.status, refused.kind.as_str()),
            (400, "shrink_needs_force")
        );
        let answer = serde_json::to_value(&refused).expect("serialises");
        assert_eq!(answer["kind"], "shrink_needs_force");
        let old: OperationError =
            serde_json::from_str(r#"{"status": 404, "error": "no such volume: db"}"#)
                .expect("an answer without a kind reads");
        assert_eq!((old.status, old.kind.as_str()), (404, ""));
        assert_eq!(old.to_string(), "no such volume: db");
    }

    #[test]
    fn a_codec_is_read_by_its_name_and_a_bad_one_refused_with_the_parser_message() {
        let operation: Operation = serde_json::from_str(
            r#"{"operation": "volume_create", "name": "db", "size_bytes": 4096, "compression": "zstd:9"}"#,
        )
        .unwrap();
        assert!(matches!(
            operation,
            Operation::VolumeCreate { compression: Some(codec), .. } if codec.to_string() == "zstd:9"
        ));
        let without: Operation = serde_json::from_str(
            r#"{"operation": "volume_set_policy", "name": "db", "pin": "flash"}"#,
        )
        .unwrap();
        assert!(matches!(
            without,
            Operation::VolumeSetPolicy {
                compression: None,
                ..
            }
        ));
        let error = serde_json::from_str::<Operation>(
            r#"{"operation": "volume_set_policy", "name": "db", "compression": "zstd:0"}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("zstd level \"0\" is out of range"),
            "{error}"
        );
    }
}
