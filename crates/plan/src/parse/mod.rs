//! Trace parsers, one file per input format: reading a trace file, detecting
//! its format and dispatching to that format's parser. What the parsers share
//! (options, decoding, timestamps, counters) is in `common.rs`.

pub mod addresses;
mod common;
pub mod iostat;
pub mod perfmon;
pub mod plain;

use std::path::Path;

use crate::error::PlanError;
use crate::trace::{Trace, TraceFormat};
pub use common::{ParseOptions, decode, parse_timestamp};

/// Reads and parses a trace file, detecting the format when none is given.
pub fn parse_file(
    path: &Path,
    format: Option<TraceFormat>,
    options: &ParseOptions,
) -> Result<Trace, PlanError> {
    let bytes = std::fs::read(path).map_err(|source| PlanError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    // perfmon can write UTF-16 with a byte-order mark when saved from the GUI.
    let text = decode(&bytes);
    let format = format.unwrap_or_else(|| detect_format(&text));
    if looks_binary(&text) {
        return Err(PlanError::Format {
            path: path.to_path_buf(),
            format: format.name(),
            reason: "the file is binary, not a text trace".to_string(),
        });
    }
    parse_text(&text, format, options, path)
}

/// Parses trace text in a known format; `path` is only used in error messages.
pub fn parse_text(
    text: &str,
    format: TraceFormat,
    options: &ParseOptions,
    path: &Path,
) -> Result<Trace, PlanError> {
    match format {
        TraceFormat::Perfmon => perfmon::parse(text, options, path),
        TraceFormat::Iostat => iostat::parse(text, options, path),
        TraceFormat::Csv => plain::parse(text, path),
    }
}

/// True when text holds NUL characters or more than 1% undecodable bytes.
fn looks_binary(text: &str) -> bool {
    let mut character_count = 0usize;
    let mut bad_count = 0usize;
    for character in text.chars() {
        character_count += 1;
        if character == '\0' || character == char::REPLACEMENT_CHARACTER {
            bad_count += 1;
        }
    }
    text.contains('\0') || bad_count * 100 > character_count
}

/// Guesses the format from the first lines: perfmon files name their PDH-CSV
/// version in the first cell; iostat prints a `Device` header; everything else is
/// taken as plain CSV.
pub fn detect_format(text: &str) -> TraceFormat {
    const DETECTION_LINE_COUNT: usize = 50;
    for line in text.lines().take(DETECTION_LINE_COUNT) {
        if line.contains("PDH-CSV") {
            return TraceFormat::Perfmon;
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with("Device") || trimmed.starts_with("avg-cpu") {
            return TraceFormat::Iostat;
        }
    }
    TraceFormat::Csv
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_recognises_each_format() {
        assert_eq!(
            detect_format(
                "\"(PDH-CSV 4.0) (UTC)(0)\",\"\\\\H\\PhysicalDisk(_Total)\\Disk Reads/sec\"\n"
            ),
            TraceFormat::Perfmon
        );
        assert_eq!(
            detect_format(
                "Linux 6.1.0 (host) \t04/15/2024 \t_x86_64_\t(8 CPU)\n\nDevice r/s w/s\n"
            ),
            TraceFormat::Iostat
        );
        assert_eq!(
            detect_format("timestamp,read_iops,write_iops\n"),
            TraceFormat::Csv
        );
    }
}
