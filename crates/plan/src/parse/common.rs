//! What the trace parsers share: the user's parse options, decoding file bytes
//! into text, and parsing timestamps and counter values. A module of its own
//! so that the format parsers depend on it and `mod.rs` only dispatches.

/// Choices the user can make about how a trace is read.
#[derive(Debug, Clone, Default)]
pub struct ParseOptions {
    /// Sampling interval for traces without timestamps (iostat without `-t`).
    pub interval_seconds: Option<f64>,
    /// Only these devices (iostat) or instances (perfmon); all whole disks when empty.
    pub devices: Vec<String>,
}

/// Turns file bytes into text: UTF-8 (with or without a byte-order mark) or
/// UTF-16LE with a byte-order mark; invalid bytes become replacement characters,
/// which the parsers then reject row by row.
pub fn decode(bytes: &[u8]) -> String {
    if let Some(rest) = bytes.strip_prefix(&[0xFF, 0xFE]) {
        let units: Vec<u16> = rest
            .chunks_exact(2)
            .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
            .collect();
        return String::from_utf16_lossy(&units);
    }
    let bytes = bytes.strip_prefix(&[0xEF, 0xBB, 0xBF]).unwrap_or(bytes);
    String::from_utf8_lossy(bytes).into_owned()
}

/// Parses the timestamp forms found in traces into seconds since an arbitrary epoch
/// (wall-clock times without a zone are taken as UTC; only differences matter).
pub fn parse_timestamp(text: &str) -> Option<f64> {
    use chrono::{DateTime, NaiveDateTime};
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return seconds.is_finite().then_some(seconds);
    }
    if let Ok(time) = DateTime::parse_from_rfc3339(text) {
        return Some(seconds_of(time.naive_utc()));
    }
    for format in ["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S%z"] {
        if let Ok(time) = DateTime::parse_from_str(text, format) {
            return Some(seconds_of(time.naive_utc()));
        }
    }
    const NAIVE_FORMATS: [&str; 8] = [
        "%m/%d/%Y %H:%M:%S%.f",
        "%m/%d/%Y %I:%M:%S %p",
        "%m/%d/%y %H:%M:%S%.f",
        "%m/%d/%y %I:%M:%S %p",
        "%Y-%m-%d %H:%M:%S%.f",
        "%Y-%m-%dT%H:%M:%S%.f",
        "%Y/%m/%d %H:%M:%S%.f",
        "%d.%m.%Y %H:%M:%S%.f",
    ];
    NAIVE_FORMATS.iter().find_map(|format| {
        NaiveDateTime::parse_from_str(text, format)
            .ok()
            .map(seconds_of)
    })
}

fn seconds_of(time: chrono::NaiveDateTime) -> f64 {
    let utc = time.and_utc();
    utc.timestamp() as f64 + f64::from(utc.timestamp_subsec_nanos()) / 1e9
}

/// Parses a counter value: finite and not negative. Blank cells give `Ok(None)`.
pub(crate) fn parse_counter(text: &str) -> Result<Option<f64>, ()> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(Some(value)),
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_of_every_supported_form_parse_and_differ_correctly() {
        let perfmon = parse_timestamp("04/15/2024 10:00:00.000").unwrap();
        let perfmon_later = parse_timestamp("04/15/2024 10:01:30.500").unwrap();
        assert_eq!(perfmon_later - perfmon, 90.5);
        let iostat_am = parse_timestamp("04/15/2024 10:00:00 AM").unwrap();
        let iostat_pm = parse_timestamp("04/15/2024 01:00:00 PM").unwrap();
        assert_eq!(iostat_pm - iostat_am, 3.0 * 3600.0);
        let iso = parse_timestamp("2024-04-15T10:00:00+0000").unwrap();
        assert_eq!(iso, perfmon);
        assert_eq!(parse_timestamp("2024-04-15 10:00:00").unwrap(), perfmon);
        assert_eq!(
            parse_timestamp("2024-04-15T12:00:00+02:00").unwrap(),
            perfmon
        );
        assert_eq!(parse_timestamp("120").unwrap(), 120.0);
        assert_eq!(parse_timestamp("yesterday"), None);
        assert_eq!(parse_timestamp(" "), None);
    }

    #[test]
    fn counters_reject_negative_and_non_numeric_values() {
        assert_eq!(parse_counter(" 12.5 "), Ok(Some(12.5)));
        assert_eq!(parse_counter(" "), Ok(None));
        assert_eq!(parse_counter("-1"), Err(()));
        assert_eq!(parse_counter("NaN"), Err(()));
        assert_eq!(parse_counter("abc"), Err(()));
    }

    #[test]
    fn utf16_perfmon_files_are_decoded() {
        let mut bytes = vec![0xFF, 0xFE];
        for unit in "a,b".encode_utf16() {
            bytes.extend_from_slice(&unit.to_le_bytes());
        }
        assert_eq!(decode(&bytes), "a,b");
    }
}
