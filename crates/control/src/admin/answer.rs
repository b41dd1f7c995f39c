//! What the admin API answers with, typed: one [`Answer`] per operation,
//! each holding the document of `lamina-api` (or the control plane's
//! [`VolumeIo`]) that the operation returns. The daemon and the offline CLI
//! get it from `execute`; a client of the socket decodes the JSON as the
//! [`AnswerKind`] its operation names ([`Answer::from_json`]), and takes the
//! document out with `TryFrom` (`let status: PoolStatus = answer.try_into()?`).
//!
//! The JSON is the document's own (the variant is not written), with its
//! keys in alphabetical order at every level ([`Answer::to_json_value`]):
//! what the daemon has always sent and `--json` has always printed.

use lamina_api::{
    Deleted, DeviceStatus, PoolStatus, RebuildStatus, ScrubStatus, SnapshotInfo, VolumeInfo,
    VolumeTierStats,
};
use serde::Serialize;

use crate::volume_statistics::VolumeIo;

/// The answer of one operation.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Answer {
    /// `volume_list`.
    Volumes(Vec<VolumeInfo>),
    /// A volume created, changed, renamed, rolled back or cloned.
    Volume(VolumeInfo),
    /// `volume_stats`: where a volume's blocks live and reads came from.
    VolumeTierStats(VolumeTierStats),
    /// `volume_io`: NBD figures since the daemon started.
    VolumeIo(Vec<VolumeIo>),
    /// A volume or snapshot deleted.
    Deleted(Deleted),
    /// `snapshot_create`.
    Snapshot(SnapshotInfo),
    /// `snapshot_list`.
    Snapshots(Vec<SnapshotInfo>),
    /// `pool_status` (boxed: by far the largest document).
    PoolStatus(Box<PoolStatus>),
    /// `pool_scrub`: the scrub's progress or result.
    Scrub(ScrubStatus),
    /// `device_list`, and the devices after `device_fail` or `device_add`.
    Devices(Vec<DeviceStatus>),
    /// A rebuild, removal or rebalance: its progress or result.
    Rebuild(RebuildStatus),
}

/// Which document an [`Answer`] holds, without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerKind {
    Volumes,
    Volume,
    VolumeTierStats,
    VolumeIo,
    Deleted,
    Snapshot,
    Snapshots,
    PoolStatus,
    Scrub,
    Devices,
    Rebuild,
}

/// An answer taken out as a document it does not hold (a client that
/// decoded the answer of one operation as another's).
#[derive(Debug, thiserror::Error)]
#[error("the admin API answered with {found:?} where {expected:?} was expected")]
pub struct UnexpectedAnswer {
    pub expected: AnswerKind,
    pub found: AnswerKind,
}

impl Answer {
    pub fn kind(&self) -> AnswerKind {
        match self {
            Answer::Volumes(_) => AnswerKind::Volumes,
            Answer::Volume(_) => AnswerKind::Volume,
            Answer::VolumeTierStats(_) => AnswerKind::VolumeTierStats,
            Answer::VolumeIo(_) => AnswerKind::VolumeIo,
            Answer::Deleted(_) => AnswerKind::Deleted,
            Answer::Snapshot(_) => AnswerKind::Snapshot,
            Answer::Snapshots(_) => AnswerKind::Snapshots,
            Answer::PoolStatus(_) => AnswerKind::PoolStatus,
            Answer::Scrub(_) => AnswerKind::Scrub,
            Answer::Devices(_) => AnswerKind::Devices,
            Answer::Rebuild(_) => AnswerKind::Rebuild,
        }
    }

    /// Reads an answer's JSON as the document `kind` (the one the operation
    /// sent names, see `Operation::answer_kind`): every field of it must be
    /// there, fields it does not know are ignored.
    pub fn from_json(kind: AnswerKind, json: &[u8]) -> serde_json::Result<Answer> {
        use serde_json::from_slice as read;
        Ok(match kind {
            AnswerKind::Volumes => Answer::Volumes(read(json)?),
            AnswerKind::Volume => Answer::Volume(read(json)?),
            AnswerKind::VolumeTierStats => Answer::VolumeTierStats(read(json)?),
            AnswerKind::VolumeIo => Answer::VolumeIo(read(json)?),
            AnswerKind::Deleted => Answer::Deleted(read(json)?),
            AnswerKind::Snapshot => Answer::Snapshot(read(json)?),
            AnswerKind::Snapshots => Answer::Snapshots(read(json)?),
            AnswerKind::PoolStatus => Answer::PoolStatus(read(json)?),
            AnswerKind::Scrub => Answer::Scrub(read(json)?),
            AnswerKind::Devices => Answer::Devices(read(json)?),
            AnswerKind::Rebuild => Answer::Rebuild(read(json)?),
        })
    }

    /// The answer as the admin API sends it and `--json` prints it: the
    /// document with its keys in alphabetical order at every level (the
    /// order of `serde_json::Value`'s map, through which every answer has
    /// always gone; a struct would write its fields in declaration order).
    pub fn to_json_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("admin answers serialise")
    }
}

/// `TryFrom<Answer>` for each document an answer holds.
macro_rules! answer_documents {
    ($($variant:ident => $document:ty),* $(,)?) => {
        $(
            impl TryFrom<Answer> for $document {
                type Error = UnexpectedAnswer;

                fn try_from(answer: Answer) -> Result<Self, UnexpectedAnswer> {
                    match answer {
                        Answer::$variant(document) => Ok(document),
                        other => Err(UnexpectedAnswer {
                            expected: AnswerKind::$variant,
                            found: other.kind(),
                        }),
                    }
                }
            }
        )*
    };
}

answer_documents! {
    Volumes => Vec<VolumeInfo>,
    Volume => VolumeInfo,
    VolumeTierStats => VolumeTierStats,
    VolumeIo => Vec<VolumeIo>,
    Deleted => Deleted,
    Snapshot => SnapshotInfo,
    Snapshots => Vec<SnapshotInfo>,
    Scrub => ScrubStatus,
    Devices => Vec<DeviceStatus>,
    Rebuild => RebuildStatus,
}

impl TryFrom<Answer> for PoolStatus {
    type Error = UnexpectedAnswer;

    fn try_from(answer: Answer) -> Result<Self, UnexpectedAnswer> {
        match answer {
            Answer::PoolStatus(status) => Ok(*status),
            other => Err(UnexpectedAnswer {
                expected: AnswerKind::PoolStatus,
                found: other.kind(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_its_document_on_the_wire_with_sorted_keys_and_reads_back() {
        let deleted = Answer::Deleted(Deleted {
            deleted: "db@monday".to_string(),
        });
        let io = Answer::VolumeIo(vec![VolumeIo {
            volume: "db".to_string(),
            latency_histograms: false,
            reads: crate::volume_statistics::OperationTotals {
                requests: 1,
                bytes: 4096,
                latency_sum_ns: 0,
                latency_buckets: vec![],
            },
            writes: crate::volume_statistics::OperationTotals {
                requests: 0,
                bytes: 0,
                latency_sum_ns: 0,
                latency_buckets: vec![],
            },
        }]);
        assert_eq!(
            deleted.to_json_value().to_string(),
            r#"{"deleted":"db@monday"}"#
        );
        // Declared volume, latency_histograms, reads, writes: sent sorted.
        let sent = io.to_json_value().to_string();
        assert!(
            sent.starts_with(r#"[{"latency_histograms":false,"reads":{"bytes":4096,"#),
            "{sent}"
        );
        for answer in [deleted, io] {
            let json = serde_json::to_vec(&answer.to_json_value()).unwrap();
            let read = Answer::from_json(answer.kind(), &json).unwrap();
            assert_eq!(read, answer);
        }
        let mismatch = VolumeInfo::try_from(Answer::Devices(Vec::new())).unwrap_err();
        assert_eq!(
            (mismatch.expected, mismatch.found),
            (AnswerKind::Volume, AnswerKind::Devices)
        );
    }
}
