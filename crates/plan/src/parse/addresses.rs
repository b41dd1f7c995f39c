//! Address traces, which say which blocks were touched and so let the planner
//! measure the working set instead of assuming it. Two forms are read:
//!
//! - `blkparse` default text output (`8,0 3 1 0.000000000 697 Q W 223490 + 8 [proc]`);
//!   queued (`Q`) events are used, or issued (`D`) or completed (`C`) ones when a
//!   capture has no `Q` events, so each request is counted once.
//! - CSV `timestamp,offset_bytes,length_bytes[,operation]` with an optional header,
//!   where operation is `R`/`W` or `read`/`write`.

use std::path::Path;

use super::common::{decode, parse_timestamp};
use crate::error::PlanError;

/// One request from an address trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Access {
    /// Seconds since an arbitrary epoch; only differences matter.
    pub time_seconds: f64,
    pub offset_bytes: u64,
    pub length_bytes: u64,
    /// `None` when the trace does not say whether it was a read or a write.
    pub is_read: Option<bool>,
}

/// The requests of an address trace and what had to be skipped.
#[derive(Debug, Clone, Default)]
pub struct AddressTrace {
    pub accesses: Vec<Access>,
    pub skipped_row_count: usize,
}

/// Bytes per sector in blkparse output.
const SECTOR_SIZE_BYTES: u64 = 512;

/// Longest single request accepted; longer ones are taken as corrupt rows (Linux
/// splits requests far below this), which also bounds the work per row.
pub const MAX_ACCESS_LENGTH_BYTES: u64 = 64 * 1024 * 1024;

impl Access {
    /// Keeps only requests with a sane length whose end fits in 64 bits.
    fn checked(self) -> Option<Access> {
        let sane = self.length_bytes > 0
            && self.length_bytes <= MAX_ACCESS_LENGTH_BYTES
            && self.offset_bytes.checked_add(self.length_bytes).is_some()
            && self.time_seconds.is_finite();
        sane.then_some(self)
    }
}

pub fn parse_file(path: &Path) -> Result<AddressTrace, PlanError> {
    let bytes = std::fs::read(path).map_err(|source| PlanError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let trace = parse_text(&decode(&bytes));
    if trace.accesses.is_empty() {
        return Err(PlanError::NoSamples {
            path: path.to_path_buf(),
            skipped_row_count: trace.skipped_row_count,
            reason: "expected blkparse output or timestamp,offset_bytes,length_bytes[,operation]"
                .to_string(),
        });
    }
    Ok(trace)
}

pub fn parse_text(text: &str) -> AddressTrace {
    let first = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'));
    match first {
        Some(line) if blkparse_fields(line).is_some() => parse_blkparse(text),
        _ => parse_csv(text),
    }
}

/// The fields of a blkparse event line, or `None` when the line is not one.
fn blkparse_fields(line: &str) -> Option<Vec<&str>> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields.len() >= 10 && fields[0].contains(',') && fields[8] == "+").then_some(fields)
}

fn parse_blkparse(text: &str) -> AddressTrace {
    // Events per action, so that one kind can be chosen once the whole file is read.
    let mut by_action: [Vec<Access>; 3] = Default::default();
    let mut skipped_row_count = 0;
    for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
        let Some(fields) = blkparse_fields(line) else {
            // blkparse ends with per-CPU summaries; those lines are not events.
            skipped_row_count += 1;
            continue;
        };
        let slot = match fields[5] {
            "Q" => 0,
            "D" => 1,
            "C" => 2,
            _ => continue,
        };
        let kind = fields[6];
        let is_read = if kind.contains('R') {
            true
        } else if kind.contains('W') {
            false
        } else {
            continue;
        };
        let parsed = (|| {
            Access {
                time_seconds: fields[3].parse::<f64>().ok()?,
                offset_bytes: fields[7]
                    .parse::<u64>()
                    .ok()?
                    .checked_mul(SECTOR_SIZE_BYTES)?,
                length_bytes: fields[9]
                    .parse::<u64>()
                    .ok()?
                    .checked_mul(SECTOR_SIZE_BYTES)?,
                is_read: Some(is_read),
            }
            .checked()
        })();
        match parsed {
            Some(access) => by_action[slot].push(access),
            None => skipped_row_count += 1,
        }
    }
    let accesses = by_action
        .into_iter()
        .find(|accesses| !accesses.is_empty())
        .unwrap_or_default();
    AddressTrace {
        accesses,
        skipped_row_count,
    }
}

fn parse_csv(text: &str) -> AddressTrace {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(text.as_bytes());
    let mut trace = AddressTrace::default();
    for (index, record) in reader.records().enumerate() {
        let parsed = record.ok().and_then(|record| {
            let is_read = match record.get(3).map(str::to_ascii_lowercase).as_deref() {
                None | Some("") => None,
                Some("r" | "read") => Some(true),
                Some("w" | "write") => Some(false),
                Some(_) => return None,
            };
            Access {
                time_seconds: parse_timestamp(record.get(0)?)?,
                offset_bytes: record.get(1)?.parse().ok()?,
                length_bytes: record.get(2)?.parse().ok()?,
                is_read,
            }
            .checked()
        });
        match parsed {
            Some(access) => trace.accesses.push(access),
            // A header line is not a bad row.
            None if index == 0 => {}
            None => trace.skipped_row_count += 1,
        }
    }
    trace
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blkparse_queue_events_are_used_once_each() {
        let text = "\
  8,0    3        1     0.000000000  697  Q   W 223490 + 8 [kjournald]
  8,0    3        2     0.000001000  697  G   W 223490 + 8 [kjournald]
  8,0    3        3     0.000002000  697  D   W 223490 + 8 [kjournald]
  8,0    3        4     0.000500000    0  C   W 223490 + 8 [0]
  8,0    1        5     0.001000000  701  Q   R 1000 + 16 [postgres]
CPU3 (8,0):
 Reads Queued:           0,        0KiB\t Writes Queued:           1,        4KiB
";
        let trace = parse_text(text);
        assert_eq!(trace.accesses.len(), 2);
        assert_eq!(trace.accesses[0].offset_bytes, 223490 * 512);
        assert_eq!(trace.accesses[0].length_bytes, 4096);
        assert_eq!(trace.accesses[0].is_read, Some(false));
        assert_eq!(trace.accesses[1].is_read, Some(true));
        assert_eq!(trace.skipped_row_count, 2);
    }

    #[test]
    fn csv_address_traces_take_an_optional_header_and_operation() {
        let text = "timestamp,offset_bytes,length_bytes,operation\n0,0,4096,R\n1.5,8192,8192,write\n2,x,4096,R\n3,4096,4096\n\
                    4,0,0,R\n5,0,1099511627776,R\n6,18446744073709551615,4096,R\n";
        let trace = parse_text(text);
        assert_eq!(trace.accesses.len(), 3);
        assert_eq!(trace.accesses[1].is_read, Some(false));
        assert_eq!(trace.accesses[2].is_read, None);
        // Non-numbers, empty and oversized requests and ones past 2^64 are skipped.
        assert_eq!(trace.skipped_row_count, 4);
    }
}
