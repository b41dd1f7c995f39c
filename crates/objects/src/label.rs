//! The tier's label object, `{prefix}/lamina-object-tier.json`: what makes a
//! prefix a lamina tier, the geometry every open must agree on, and the
//! epochs with their committed flushes, which say which parts count (see
//! docs/format.md, "Object-store capacity tier"). Every change to it is a
//! conditional PUT on the ETag the writer last saw, so that two processes
//! can never both believe they own the tier. JSON because it is small and
//! read by people debugging a bucket; it has a format version that an open
//! checks before anything else.

use crate::ObjectStoreError;

/// The label format this code writes and reads.
pub const LABEL_FORMAT_VERSION: u32 = 2;

/// See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TierLabel {
    pub format_version: u32,
    pub geometry: crate::TierGeometry,
    /// Random, to tell tiers apart in logs and to catch a label copied
    /// between prefixes by hand.
    pub tier_id: String,
    pub created_unix_seconds: u64,
    /// Ascending; the last is the epoch of the latest open. Never empty.
    pub epochs: Vec<EpochRecord>,
}

/// One open of the tier and how many of its flushes are committed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EpochRecord {
    pub epoch: u64,
    /// Flushes 1..=this of the epoch are committed: their parts count.
    pub flushes_committed: u64,
}

/// Where a label came from, for its errors.
pub struct LabelLocation<'a> {
    pub bucket: &'a str,
    pub key: &'a str,
}

impl TierLabel {
    pub fn new(geometry: crate::TierGeometry) -> Self {
        use rand::Rng;
        let tier_id: u128 = rand::rng().random();
        let created_unix_seconds = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        Self {
            format_version: LABEL_FORMAT_VERSION,
            geometry,
            tier_id: format!("{tier_id:032x}"),
            created_unix_seconds,
            epochs: vec![EpochRecord {
                epoch: 1,
                flushes_committed: 0,
            }],
        }
    }

    /// The epoch of the latest open.
    pub fn current_epoch(&self) -> u64 {
        self.epochs.last().expect("a label has an epoch").epoch
    }

    /// Whether a part stored by `flush` of `epoch` counts.
    pub fn is_committed(&self, epoch: u64, flush: u64) -> bool {
        flush >= 1
            && self
                .epochs
                .binary_search_by_key(&epoch, |record| record.epoch)
                .is_ok_and(|position| flush <= self.epochs[position].flushes_committed)
    }

    /// The label a new open writes: a new epoch after the current one, and
    /// of the older epochs only those `still_holding` says have parts that
    /// count.
    pub fn opened_again(&self, still_holding: impl Fn(u64) -> bool) -> Self {
        let mut epochs: Vec<EpochRecord> = self
            .epochs
            .iter()
            .copied()
            .filter(|record| still_holding(record.epoch))
            .collect();
        epochs.push(EpochRecord {
            epoch: self.current_epoch() + 1,
            flushes_committed: 0,
        });
        Self {
            epochs,
            ..self.clone()
        }
    }

    /// The label with the current epoch's flushes committed through `flush`.
    pub fn with_committed(&self, flush: u64) -> Self {
        let mut label = self.clone();
        let current = label.epochs.last_mut().expect("a label has an epoch");
        assert!(flush >= current.flushes_committed, "commits only grow");
        current.flushes_committed = flush;
        label
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec_pretty(self).expect("a label serialises");
        bytes.push(b'\n');
        bytes
    }

    /// Parses a label: the version first (a newer format is refused as
    /// such, not as garbage), then the rest, then its geometry's sense.
    pub fn parse(bytes: &[u8], location: &LabelLocation<'_>) -> Result<Self, ObjectStoreError> {
        let invalid = |reason: String| ObjectStoreError::LabelInvalid {
            bucket: location.bucket.to_string(),
            key: location.key.to_string(),
            reason,
        };
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|error| invalid(error.to_string()))?;
        let version = value
            .get("format_version")
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| invalid("no format_version".to_string()))?;
        if version != u64::from(LABEL_FORMAT_VERSION) {
            return Err(ObjectStoreError::LabelFormatUnsupported {
                bucket: location.bucket.to_string(),
                key: location.key.to_string(),
                found: u32::try_from(version).unwrap_or(u32::MAX),
                supported: LABEL_FORMAT_VERSION,
            });
        }
        let label: Self =
            serde_json::from_value(value).map_err(|error| invalid(error.to_string()))?;
        label
            .geometry
            .validate()
            .map_err(|error| invalid(error.to_string()))?;
        let ascending = label
            .epochs
            .windows(2)
            .all(|pair| pair[0].epoch < pair[1].epoch);
        if label.epochs.is_empty() || !ascending {
            return Err(invalid(
                "its epochs are empty or not in ascending order".to_string(),
            ));
        }
        Ok(label)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn location() -> LabelLocation<'static> {
        LabelLocation {
            bucket: "bucket",
            key: "p/lamina-object-tier.json",
        }
    }

    #[test]
    fn a_label_reads_back_and_other_versions_or_garbage_are_refused() {
        let geometry = crate::TierGeometry::new(64 << 20, 4 << 20, 1 << 20);
        let label = TierLabel::new(geometry);
        assert_eq!(
            TierLabel::parse(&label.to_bytes(), &location()).unwrap(),
            label
        );
        let mut newer = serde_json::to_value(&label).unwrap();
        for version in [1, 3] {
            newer["format_version"] = version.into();
            let error =
                TierLabel::parse(&serde_json::to_vec(&newer).unwrap(), &location()).unwrap_err();
            assert!(
                matches!(
                    error,
                    ObjectStoreError::LabelFormatUnsupported { found, .. } if u64::from(found) == version
                ),
                "{error}"
            );
        }
        for garbage in [&b""[..], b"{}", b"[1]", b"{\"format_version\":2}"] {
            let error = TierLabel::parse(garbage, &location()).unwrap_err();
            assert!(
                matches!(error, ObjectStoreError::LabelInvalid { .. }),
                "{error}"
            );
        }
        let mut bad_geometry = serde_json::to_value(&label).unwrap();
        bad_geometry["geometry"]["segment_size_bytes"] = 3000.into();
        let error =
            TierLabel::parse(&serde_json::to_vec(&bad_geometry).unwrap(), &location()).unwrap_err();
        assert!(error.to_string().contains("power of two"), "{error}");
        for epochs in [
            serde_json::json!([]),
            serde_json::json!([{"epoch": 2, "flushes_committed": 0}, {"epoch": 2, "flushes_committed": 0}]),
        ] {
            let mut bad_epochs = serde_json::to_value(&label).unwrap();
            bad_epochs["epochs"] = epochs;
            let error = TierLabel::parse(&serde_json::to_vec(&bad_epochs).unwrap(), &location())
                .unwrap_err();
            assert!(error.to_string().contains("epochs"), "{error}");
        }
    }

    #[test]
    fn parts_count_only_when_their_flush_is_committed_and_opens_drop_empty_epochs() {
        let label = TierLabel::new(crate::TierGeometry::new(64 << 20, 4 << 20, 1 << 20));
        assert_eq!(label.current_epoch(), 1);
        assert!(!label.is_committed(1, 1));
        let label = label.with_committed(3);
        assert!(label.is_committed(1, 3) && !label.is_committed(1, 4) && !label.is_committed(1, 0));
        let again = label.opened_again(|_| true);
        assert_eq!(again.current_epoch(), 2);
        assert!(again.is_committed(1, 3) && !again.is_committed(2, 1));
        let again = again.with_committed(1).opened_again(|epoch| epoch != 1);
        assert_eq!(
            again.epochs,
            vec![
                EpochRecord {
                    epoch: 2,
                    flushes_committed: 1
                },
                EpochRecord {
                    epoch: 3,
                    flushes_committed: 0
                },
            ]
        );
        assert!(!again.is_committed(1, 1) && again.is_committed(2, 1));
        assert_eq!(
            TierLabel::parse(&again.to_bytes(), &location()).unwrap(),
            again
        );
    }
}
