//! The tier's label object, `{prefix}/lamina-object-tier.json`: what makes a
//! prefix a lamina tier, and the geometry every open must agree on. JSON
//! because it is written once and read by people debugging a bucket; it has a
//! format version that an open checks before anything else.

use crate::ObjectStoreError;

/// The label format this code writes and reads.
pub const LABEL_FORMAT_VERSION: u32 = 1;

/// See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TierLabel {
    pub format_version: u32,
    pub geometry: crate::TierGeometry,
    /// Random, to tell tiers apart in logs and to catch a label copied
    /// between prefixes by hand.
    pub tier_id: String,
    pub created_unix_seconds: u64,
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
        }
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
        newer["format_version"] = 2.into();
        let error =
            TierLabel::parse(&serde_json::to_vec(&newer).unwrap(), &location()).unwrap_err();
        assert!(
            matches!(
                error,
                ObjectStoreError::LabelFormatUnsupported { found: 2, .. }
            ),
            "{error}"
        );
        for garbage in [&b""[..], b"{}", b"[1]", b"{\"format_version\":1}"] {
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
    }
}
