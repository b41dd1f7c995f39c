//! Which codec a volume's blocks are compressed with, as a user names it:
//! `off`, `lz4`, `zstd` (level 3) or `zstd:N`. Parsing checks the name and the
//! level range here, once, so every later user holds a valid codec.

use std::fmt;
use std::str::FromStr;

/// The lowest zstd level accepted (zstd's negative "fast" levels are not:
/// lz4 covers that ground, decision 0068).
pub const ZSTD_LEVEL_MIN: i32 = 1;
/// The highest zstd level accepted: 20 to 22 are zstd's "ultra" levels, which
/// need far more memory per context and gain nothing on 4 KiB blocks.
pub const ZSTD_LEVEL_MAX: i32 = 19;
/// The level of a bare `zstd`, zstd's own default.
pub const ZSTD_LEVEL_DEFAULT: i32 = 3;
const _: () = assert!(ZSTD_LEVEL_MIN <= ZSTD_LEVEL_DEFAULT && ZSTD_LEVEL_DEFAULT <= ZSTD_LEVEL_MAX);

/// A block codec. Build one with [`Codec::zstd`] or by parsing its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// Blocks are stored as they are.
    Off,
    /// LZ4's block format (`lz4_flex`).
    Lz4,
    /// zstd at a level in `ZSTD_LEVEL_MIN..=ZSTD_LEVEL_MAX`.
    Zstd { level: ZstdLevel },
}

/// A zstd level, checked to lie in `ZSTD_LEVEL_MIN..=ZSTD_LEVEL_MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ZstdLevel(i32);

impl ZstdLevel {
    /// The level, or an error naming the accepted range.
    pub fn new(level: i32) -> Result<ZstdLevel, CodecParseError> {
        if (ZSTD_LEVEL_MIN..=ZSTD_LEVEL_MAX).contains(&level) {
            Ok(ZstdLevel(level))
        } else {
            Err(CodecParseError::LevelOutOfRange {
                level: level.to_string(),
            })
        }
    }

    pub fn get(self) -> i32 {
        self.0
    }
}

impl Codec {
    /// zstd at `level`, checked.
    pub fn zstd(level: i32) -> Result<Codec, CodecParseError> {
        Ok(Codec::Zstd {
            level: ZstdLevel::new(level)?,
        })
    }
}

/// Why a codec name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecParseError {
    #[error("unknown codec {name:?}: expected off, lz4, zstd or zstd:LEVEL")]
    UnknownCodec { name: String },
    #[error("codec {codec} takes no level (only zstd:LEVEL does)")]
    LevelNotAccepted { codec: &'static str },
    #[error(
        "zstd level {level:?} is out of range: expected a whole number from {ZSTD_LEVEL_MIN} to {ZSTD_LEVEL_MAX}"
    )]
    LevelOutOfRange { level: String },
}

impl FromStr for Codec {
    type Err = CodecParseError;

    fn from_str(text: &str) -> Result<Codec, CodecParseError> {
        let trimmed = text.trim();
        let (name, level) = match trimmed.split_once(':') {
            Some((name, level)) => (name, Some(level)),
            None => (trimmed, None),
        };
        match (name.to_ascii_lowercase().as_str(), level) {
            ("off", None) => Ok(Codec::Off),
            ("lz4", None) => Ok(Codec::Lz4),
            ("zstd", None) => Codec::zstd(ZSTD_LEVEL_DEFAULT),
            ("off", Some(_)) => Err(CodecParseError::LevelNotAccepted { codec: "off" }),
            ("lz4", Some(_)) => Err(CodecParseError::LevelNotAccepted { codec: "lz4" }),
            ("zstd", Some(level)) => {
                let level =
                    level
                        .trim()
                        .parse::<i32>()
                        .map_err(|_| CodecParseError::LevelOutOfRange {
                            level: level.to_string(),
                        })?;
                Codec::zstd(level)
            }
            _ => Err(CodecParseError::UnknownCodec {
                name: trimmed.to_string(),
            }),
        }
    }
}

impl fmt::Display for Codec {
    /// The name that parses back to the same codec (`zstd:3`, never a bare `zstd`).
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::Off => formatter.write_str("off"),
            Codec::Lz4 => formatter.write_str("lz4"),
            Codec::Zstd { level } => write!(formatter, "zstd:{}", level.get()),
        }
    }
}

impl serde::Serialize for Codec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Codec {
    /// A codec's name, parsed as [`Codec::from_str`] does (a config file's
    /// `compression = "zstd:3"`, an admin request's field), with the parser's
    /// message when it is refused.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Codec, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        for (text, printed) in [
            ("off", "off"),
            ("lz4", "lz4"),
            ("LZ4", "lz4"),
            ("zstd", "zstd:3"),
            ("zstd:1", "zstd:1"),
            ("zstd:19", "zstd:19"),
            (" zstd: 7 ", "zstd:7"),
        ] {
            let codec: Codec = text.parse().expect(text);
            assert_eq!(codec.to_string(), printed);
            assert_eq!(printed.parse::<Codec>(), Ok(codec));
        }
    }

    #[test]
    fn unknown_codecs_and_bad_levels_are_typed_errors() {
        assert_eq!(
            "gzip".parse::<Codec>(),
            Err(CodecParseError::UnknownCodec {
                name: "gzip".to_string()
            })
        );
        assert!(matches!(
            "zstd:0".parse::<Codec>(),
            Err(CodecParseError::LevelOutOfRange { .. })
        ));
        assert!(matches!(
            "zstd:20".parse::<Codec>(),
            Err(CodecParseError::LevelOutOfRange { .. })
        ));
        assert!(matches!(
            "zstd:fast".parse::<Codec>(),
            Err(CodecParseError::LevelOutOfRange { .. })
        ));
        assert_eq!(
            "lz4:9".parse::<Codec>(),
            Err(CodecParseError::LevelNotAccepted { codec: "lz4" })
        );
        let message = "zstd:42".parse::<Codec>().unwrap_err().to_string();
        assert!(message.contains("1 to 19"), "{message}");
    }

    #[test]
    fn a_codec_deserializes_from_its_name_and_a_bad_name_gives_the_parser_message() {
        #[derive(serde::Deserialize)]
        struct Holder {
            codec: Codec,
        }
        let holder: Holder = serde_json::from_str(r#"{"codec": "zstd:7"}"#).unwrap();
        assert_eq!(holder.codec, Codec::zstd(7).unwrap());
        let error = serde_json::from_str::<Holder>(r#"{"codec": "lz4:2"}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("codec lz4 takes no level"), "{error}");
    }
}
