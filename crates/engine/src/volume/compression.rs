//! A volume's compression setting: the codec its new writes are stored
//! with (issue 44, decision 0070). The domain type is
//! `lamina_reduction::Codec`; the log and checkpoints encode it as
//! `log::batch::CodecRecord`, and the conversions between the two live here,
//! so that the format never depends on the domain (as for tier policies,
//! `policy.rs`).

use lamina_reduction::{Codec, CodecParseError, ZSTD_LEVEL_MAX, ZSTD_LEVEL_MIN};

use crate::log::batch::CodecRecord;

// Every accepted zstd level fits the record's byte.
const _: () = assert!(ZSTD_LEVEL_MIN >= 0 && ZSTD_LEVEL_MAX <= 255);

impl From<Codec> for CodecRecord {
    fn from(codec: Codec) -> Self {
        match codec {
            Codec::Off => CodecRecord::Off,
            Codec::Lz4 => CodecRecord::Lz4,
            Codec::Zstd { level } => CodecRecord::Zstd {
                level: u8::try_from(level.get())
                    .expect("zstd levels are checked to lie in 1..=19 when parsed"),
            },
        }
    }
}

impl TryFrom<CodecRecord> for Codec {
    type Error = CodecParseError;

    /// The codec a record names; a zstd level outside the accepted range
    /// (no build writes one) is refused with the parser's error.
    fn try_from(record: CodecRecord) -> Result<Self, CodecParseError> {
        match record {
            CodecRecord::Off => Ok(Codec::Off),
            CodecRecord::Lz4 => Ok(Codec::Lz4),
            CodecRecord::Zstd { level } => Codec::zstd(i32::from(level)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips_through_its_record_and_bad_levels_are_refused() {
        let mut codecs = vec![Codec::Off, Codec::Lz4];
        codecs.extend((ZSTD_LEVEL_MIN..=ZSTD_LEVEL_MAX).map(|level| Codec::zstd(level).unwrap()));
        for codec in codecs {
            let record = CodecRecord::from(codec);
            assert_eq!(Codec::try_from(record), Ok(codec));
        }
        assert_eq!(CodecRecord::from(Codec::Off), CodecRecord::default());
        for level in [0, 20, 255] {
            assert!(Codec::try_from(CodecRecord::Zstd { level }).is_err());
        }
        // The format's bytes: the variant index, then the level.
        let bytes = postcard::to_allocvec(&CodecRecord::from(Codec::zstd(3).unwrap())).unwrap();
        assert_eq!(bytes, [2, 3]);
    }
}
