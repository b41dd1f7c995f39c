//! The plain CSV trace:
//! `timestamp,read_iops,write_iops,read_bytes_per_sec,write_bytes_per_sec[,latency_ms,queue_depth]`.
//!
//! A header row is optional; with one, columns are matched by name (in any order,
//! unknown names skipped with a warning); without one, they are taken in the order
//! above. Timestamps may be seconds or any date-time form `parse_timestamp` knows.

use std::path::Path;

use super::common::{parse_counter, parse_timestamp};
use crate::error::PlanError;
use crate::trace::{Sample, Trace, TraceFormat};

/// Column positions of the fields, from the header or the fixed order.
#[derive(Debug, Clone, Copy, Default)]
struct Columns {
    timestamp: Option<usize>,
    read_iops: Option<usize>,
    write_iops: Option<usize>,
    read_bytes_per_second: Option<usize>,
    write_bytes_per_second: Option<usize>,
    latency_ms: Option<usize>,
    queue_depth: Option<usize>,
}

const POSITIONAL: Columns = Columns {
    timestamp: Some(0),
    read_iops: Some(1),
    write_iops: Some(2),
    read_bytes_per_second: Some(3),
    write_bytes_per_second: Some(4),
    latency_ms: Some(5),
    queue_depth: Some(6),
};

pub fn parse(text: &str, path: &Path) -> Result<Trace, PlanError> {
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(text.as_bytes());
    let mut records = reader.records().peekable();
    let mut skipped_columns = Vec::new();
    let mut field_count_range = 3..=7;
    let columns = match records.peek() {
        Some(Ok(first)) if first.get(0).and_then(parse_timestamp).is_none() => {
            let header = first.clone();
            records.next();
            let mut columns = Columns::default();
            for (index, name) in header.iter().enumerate() {
                let slot = match name.to_ascii_lowercase().as_str() {
                    "timestamp" | "time" => &mut columns.timestamp,
                    "read_iops" => &mut columns.read_iops,
                    "write_iops" => &mut columns.write_iops,
                    "read_bytes_per_sec" | "read_bytes_per_second" => {
                        &mut columns.read_bytes_per_second
                    }
                    "write_bytes_per_sec" | "write_bytes_per_second" => {
                        &mut columns.write_bytes_per_second
                    }
                    "latency_ms" => &mut columns.latency_ms,
                    "queue_depth" => &mut columns.queue_depth,
                    _ => {
                        skipped_columns.push(name.to_string());
                        continue;
                    }
                };
                *slot = Some(index);
            }
            if columns.timestamp.is_none()
                || columns.read_iops.is_none()
                || columns.write_iops.is_none()
            {
                return Err(PlanError::Format {
                    path: path.to_path_buf(),
                    format: "csv",
                    reason: {
                        const SHOWN_HEADER_CHARACTERS: usize = 200;
                        let shown: String = header
                            .iter()
                            .collect::<Vec<_>>()
                            .join(",")
                            .chars()
                            .take(SHOWN_HEADER_CHARACTERS)
                            .collect();
                        format!(
                            "the first row {shown:?} is neither a header with timestamp, read_iops and write_iops nor a data row"
                        )
                    },
                });
            }
            field_count_range = 3..=header.len();
            columns
        }
        _ => POSITIONAL,
    };

    let mut samples = Vec::new();
    let mut skipped_row_count = 0;
    let mut start_label = None;
    for record in records {
        let Ok(record) = record else {
            skipped_row_count += 1;
            continue;
        };
        if !field_count_range.contains(&record.len()) {
            skipped_row_count += 1;
            continue;
        }
        match sample_of_row(&record, &columns) {
            Some(sample) => {
                if start_label.is_none() {
                    start_label = record.get(0).map(str::to_string);
                }
                samples.push(sample);
            }
            None => skipped_row_count += 1,
        }
    }
    Trace::finish(
        TraceFormat::Csv,
        start_label,
        samples,
        None,
        skipped_row_count,
        skipped_columns,
        Vec::new(),
    )
    .ok_or_else(|| PlanError::NoSamples {
        path: path.to_path_buf(),
        skipped_row_count,
        reason:
            "expected rows of timestamp,read_iops,write_iops,read_bytes_per_sec,write_bytes_per_sec"
                .to_string(),
    })
}

/// A row is usable when its timestamp and both rates parse; an optional field that
/// is missing or blank is unknown, but one that is present and malformed spoils the row.
fn sample_of_row(record: &csv::StringRecord, columns: &Columns) -> Option<Sample> {
    let required =
        |index: Option<usize>| -> Option<f64> { parse_counter(record.get(index?)?).ok().flatten() };
    let optional = |index: Option<usize>| -> Result<Option<f64>, ()> {
        match index.and_then(|index| record.get(index)) {
            Some(cell) => parse_counter(cell),
            None => Ok(None),
        }
    };
    Some(Sample {
        time_seconds: parse_timestamp(record.get(columns.timestamp?)?)?,
        read_iops: required(columns.read_iops)?,
        write_iops: required(columns.write_iops)?,
        read_bytes_per_second: optional(columns.read_bytes_per_second).ok()?,
        write_bytes_per_second: optional(columns.write_bytes_per_second).ok()?,
        latency_ms: optional(columns.latency_ms).ok()?,
        queue_depth: optional(columns.queue_depth).ok()?,
    })
}
