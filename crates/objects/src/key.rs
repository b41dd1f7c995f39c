//! The names of the objects a tier keeps: the label and one object per stored
//! part of a segment. A part's key says everything the index needs (segment,
//! generation, the epoch and flush that stored it, order among the segment's
//! parts, where in the segment it goes and how long it is), so that opening a
//! tier is a LIST and no GET per object.
//! Keys read back from a LIST are untrusted input: the parser accepts exactly
//! the keys [`PartKey::relative_key`] writes and nothing else, without panicking.

/// The label's object name under the tier's prefix.
pub const LABEL_OBJECT_NAME: &str = "lamina-object-tier.json";

/// The folder under the tier's prefix that holds every part.
pub const SEGMENTS_FOLDER_NAME: &str = "segments";

/// Decimal digits of a segment index, generation or part sequence in a key.
const INDEX_DIGITS: usize = 8;

/// Decimal digits of a flush number in a key.
const FLUSH_DIGITS: usize = 10;

/// Decimal digits of an offset or a length within a segment in a key.
const BYTE_COUNT_DIGITS: usize = 10;

/// What a part object's key says of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartKey {
    pub segment_index: u64,
    /// Which use of the segment the part belongs to: bumped each time the
    /// segment is opened again, so that older parts are hidden at once.
    pub generation: u64,
    /// The open of the tier whose process stored the part.
    pub epoch: u64,
    /// The flush of that epoch that stored it: the part counts only once
    /// the label records that flush as committed.
    pub flush: u64,
    /// Order among the segment's parts of one generation and epoch: a
    /// higher (epoch, sequence) wins where parts overlap.
    pub part_sequence: u64,
    pub offset_in_segment: u64,
    pub length: u64,
}

/// Where a part stands among a segment's parts: the later wins.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PartOrder {
    pub epoch: u64,
    pub part_sequence: u64,
}

impl PartKey {
    /// The key below the tier's prefix:
    /// `segments/{segment:08}/{generation:08}/{epoch:08}-{flush:010}-{sequence:08}-{offset:010}-{length:010}`.
    /// Wider numbers are written in full (the widths are minimums).
    pub fn relative_key(&self) -> String {
        format!(
            "{SEGMENTS_FOLDER_NAME}/{:0index$}/{:0index$}/{:0index$}-{:0flush$}-{:0index$}-{:0bytes$}-{:0bytes$}",
            self.segment_index,
            self.generation,
            self.epoch,
            self.flush,
            self.part_sequence,
            self.offset_in_segment,
            self.length,
            index = INDEX_DIGITS,
            flush = FLUSH_DIGITS,
            bytes = BYTE_COUNT_DIGITS,
        )
    }

    pub fn order(&self) -> PartOrder {
        PartOrder {
            epoch: self.epoch,
            part_sequence: self.part_sequence,
        }
    }

    /// Parses a key below the tier's prefix; `None` for anything
    /// [`PartKey::relative_key`] would not have written.
    pub fn parse_relative(key: &str) -> Option<Self> {
        let mut folders = key.split('/');
        if folders.next()? != SEGMENTS_FOLDER_NAME {
            return None;
        }
        let segment_index = parse_number(folders.next()?, INDEX_DIGITS)?;
        let generation = parse_number(folders.next()?, INDEX_DIGITS)?;
        let name = folders.next()?;
        if folders.next().is_some() {
            return None;
        }
        let mut fields = name.split('-');
        let epoch = parse_number(fields.next()?, INDEX_DIGITS)?;
        let flush = parse_number(fields.next()?, FLUSH_DIGITS)?;
        let part_sequence = parse_number(fields.next()?, INDEX_DIGITS)?;
        let offset_in_segment = parse_number(fields.next()?, BYTE_COUNT_DIGITS)?;
        let length = parse_number(fields.next()?, BYTE_COUNT_DIGITS)?;
        if fields.next().is_some() {
            return None;
        }
        Some(Self {
            segment_index,
            generation,
            epoch,
            flush,
            part_sequence,
            offset_in_segment,
            length,
        })
    }
}

/// A number written as [`PartKey::relative_key`] writes it: ASCII digits, at
/// least `digits_min` of them, zero-padded to exactly that width and no more
/// (so that every part has exactly one key).
fn parse_number(text: &str, digits_min: usize) -> Option<u64> {
    if text.len() < digits_min || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let value: u64 = text.parse().ok()?;
    (format!("{value:0digits_min$}") == text).then_some(value)
}

/// `prefix/name`, or `name` alone under an empty prefix.
pub fn join_key(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

/// The part of `key` below `prefix/`; `None` when it is not below it.
pub fn strip_prefix<'a>(prefix: &str, key: &'a str) -> Option<&'a str> {
    if prefix.is_empty() {
        return Some(key);
    }
    key.strip_prefix(prefix)?.strip_prefix('/')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_part_key() -> impl Strategy<Value = PartKey> {
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(
                |(
                    segment_index,
                    generation,
                    epoch,
                    flush,
                    part_sequence,
                    offset_in_segment,
                    length,
                )| PartKey {
                    segment_index,
                    generation,
                    epoch,
                    flush,
                    part_sequence,
                    offset_in_segment,
                    length,
                },
            )
    }

    #[test]
    fn a_key_reads_as_written() {
        let key = PartKey {
            segment_index: 3,
            generation: 2,
            epoch: 5,
            flush: 41,
            part_sequence: 17,
            offset_in_segment: 65536,
            length: 4096,
        };
        assert_eq!(
            key.relative_key(),
            "segments/00000003/00000002/00000005-0000000041-00000017-0000065536-0000004096"
        );
        assert_eq!(PartKey::parse_relative(&key.relative_key()), Some(key));
    }

    #[test]
    fn near_misses_are_refused() {
        for text in [
            "",
            "segments",
            "segments/",
            "segments/00000003/00000002",
            "segments/00000003/00000002/",
            // Format 1's names, without an epoch and a flush.
            "segments/00000003/00000002/00000017-0000065536-0000004096",
            "segments/0000003/00000002/00000005-0000000041-00000017-0000065536-0000004096",
            "segments/000000003/00000002/00000005-0000000041-00000017-0000065536-0000004096",
            "segments/00000003/00000002/00000005-000000041-00000017-0000065536-0000004096",
            "segments/00000003/00000002/00000005-0000000041-00000017-0000065536-0000004096-1",
            "segments/00000003/00000002/00000005-0000000041-00000017-0000065536-0000004096/x",
            "segments/00000003/00000002/00000005_0000000041_00000017_0000065536_0000004096",
            "segments/+0000003/00000002/00000005-0000000041-00000017-0000065536-0000004096",
            "segments/0000000３/00000002/00000005-0000000041-00000017-0000065536-0000004096",
            "segments/00000003/00000002/00000005-0000000041-00000017-0000065536-00000040960",
            "segments/00000003/00000002/00000005-0000000041-00000017-0000065536-99999999999999999999",
            "Segments/00000003/00000002/00000005-0000000041-00000017-0000065536-0000004096",
            "lamina-object-tier.json",
        ] {
            assert_eq!(PartKey::parse_relative(text), None, "{text:?}");
        }
    }

    #[test]
    fn prefixes_join_and_strip() {
        assert_eq!(join_key("", "a"), "a");
        assert_eq!(join_key("p/q", "a"), "p/q/a");
        assert_eq!(strip_prefix("p/q", "p/q/a"), Some("a"));
        assert_eq!(strip_prefix("p/q", "p/qa"), None);
        assert_eq!(strip_prefix("", "a"), Some("a"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn every_key_round_trips(key in any_part_key()) {
            prop_assert_eq!(PartKey::parse_relative(&key.relative_key()), Some(key));
        }

        /// Whatever parses is exactly the rendering of what it parsed to: no
        /// two keys name the same part.
        #[test]
        fn arbitrary_text_parses_only_when_canonical(text in ".{0,80}") {
            if let Some(key) = PartKey::parse_relative(&text) {
                prop_assert_eq!(key.relative_key(), text);
            }
        }

        /// Text shaped like a key (digits, dashes, slashes) exercises the
        /// number and field paths, not just the first comparison.
        #[test]
        fn key_shaped_text_parses_only_when_canonical(
            text in "segments/[0-9+-]{0,22}/[0-9-]{0,22}/[0-9a-]{0,64}(/[0-9]{0,3})?"
        ) {
            if let Some(key) = PartKey::parse_relative(&text) {
                prop_assert_eq!(key.relative_key(), text);
            }
        }

        #[test]
        fn mutated_keys_never_panic(key in any_part_key(), position in any::<usize>(), byte in any::<u8>()) {
            let mut bytes = key.relative_key().into_bytes();
            let index = position % bytes.len();
            bytes[index] = byte;
            if let Ok(text) = String::from_utf8(bytes) && let Some(parsed) = PartKey::parse_relative(&text) {
                prop_assert_eq!(parsed.relative_key(), text);
            }
        }
    }
}
