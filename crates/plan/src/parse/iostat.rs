//! Linux `iostat -x` output captured over time (`iostat -x -t 60 > trace.txt`), in
//! the column layouts of both current sysstat (`r/s rkB/s ... aqu-sz %util`) and
//! older releases (`Device: rrqm/s wrqm/s r/s w/s ... avgqu-sz await`).
//!
//! Each report (a `Device` header and its rows) becomes one sample, summed over the
//! whole disks. Partitions and stacked devices (device-mapper, md, loop) are left
//! out by default because their I/O is already counted on the disks below them;
//! `--devices` selects devices by name instead.

use std::collections::BTreeSet;
use std::path::Path;

use super::common::{ParseOptions, parse_counter, parse_timestamp};
use crate::error::PlanError;
use crate::trace::{Sample, Trace, TraceFormat};

/// Sampling interval assumed when the capture has no timestamps and none was given.
pub const DEFAULT_INTERVAL_SECONDS: f64 = 60.0;

/// Column positions of the fields the planner uses, from a `Device` header.
#[derive(Debug, Clone, Default)]
struct Columns {
    reads_per_second: Option<usize>,
    writes_per_second: Option<usize>,
    read_bytes_per_second: Option<(usize, f64)>,
    write_bytes_per_second: Option<(usize, f64)>,
    read_await_ms: Option<usize>,
    write_await_ms: Option<usize>,
    await_ms: Option<usize>,
    queue_size: Option<usize>,
    field_count: usize,
}

impl Columns {
    fn from_header(line: &str, unused: &mut BTreeSet<String>) -> Columns {
        let mut columns = Columns::default();
        let names: Vec<&str> = line.split_whitespace().collect();
        columns.field_count = names.len();
        for (index, name) in names.iter().enumerate().skip(1) {
            match *name {
                "r/s" => columns.reads_per_second = Some(index),
                "w/s" => columns.writes_per_second = Some(index),
                "rkB/s" => columns.read_bytes_per_second = Some((index, 1024.0)),
                "wkB/s" => columns.write_bytes_per_second = Some((index, 1024.0)),
                "rMB/s" => columns.read_bytes_per_second = Some((index, 1024.0 * 1024.0)),
                "wMB/s" => columns.write_bytes_per_second = Some((index, 1024.0 * 1024.0)),
                "rsec/s" => columns.read_bytes_per_second = Some((index, 512.0)),
                "wsec/s" => columns.write_bytes_per_second = Some((index, 512.0)),
                "r_await" => columns.read_await_ms = Some(index),
                "w_await" => columns.write_await_ms = Some(index),
                "await" => columns.await_ms = Some(index),
                "aqu-sz" | "avgqu-sz" => columns.queue_size = Some(index),
                other => {
                    unused.insert(other.to_string());
                }
            }
        }
        columns
    }
}

/// One device row of one report.
#[derive(Debug, Clone)]
struct DeviceRow {
    name: String,
    reads: f64,
    writes: f64,
    read_bytes: Option<f64>,
    write_bytes: Option<f64>,
    latency_ms: Option<f64>,
    queue: Option<f64>,
}

/// A report: its timestamp line (if the capture has them) and its device rows.
#[derive(Debug, Default)]
struct Report {
    time_seconds: Option<f64>,
    time_label: Option<String>,
    rows: Vec<DeviceRow>,
}

/// True for names of whole disks; false for partitions and stacked or virtual devices.
pub fn is_whole_disk(name: &str) -> bool {
    const STACKED_PREFIXES: [&str; 7] = ["dm-", "md", "loop", "ram", "zram", "sr", "fd"];
    if STACKED_PREFIXES
        .iter()
        .any(|prefix| name.starts_with(prefix))
    {
        return false;
    }
    // nvme0n1p2, mmcblk0p1: partitions carry a `p` and a number after the disk number.
    if name.starts_with("nvme") || name.starts_with("mmcblk") {
        let trimmed = name.trim_end_matches(|c: char| c.is_ascii_digit());
        return !(trimmed.ends_with('p') && trimmed.len() < name.len());
    }
    // sda1, vdb2, xvda1, hda3: a trailing number means a partition.
    if ["sd", "vd", "xvd", "hd"]
        .iter()
        .any(|prefix| name.starts_with(prefix))
    {
        return !name.ends_with(|c: char| c.is_ascii_digit());
    }
    true
}

/// iostat prints numbers in the C library's locale, so `12,50` also means 12.5.
fn number(text: &str) -> Result<Option<f64>, ()> {
    if text.contains(',') && !text.contains('.') {
        parse_counter(&text.replace(',', "."))
    } else {
        parse_counter(text)
    }
}

fn parse_row(line: &str, columns: &Columns) -> Option<DeviceRow> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() != columns.field_count {
        return None;
    }
    let get = |index: Option<usize>| -> Result<Option<f64>, ()> {
        index.map_or(Ok(None), |index| number(fields[index]))
    };
    let reads = get(columns.reads_per_second).ok()??;
    let writes = get(columns.writes_per_second).ok()??;
    let scaled = |column: Option<(usize, f64)>| -> Result<Option<f64>, ()> {
        Ok(match column {
            Some((index, scale)) => number(fields[index])?.map(|value| value * scale),
            None => None,
        })
    };
    let read_bytes = scaled(columns.read_bytes_per_second).ok()?;
    let write_bytes = scaled(columns.write_bytes_per_second).ok()?;
    let read_await = get(columns.read_await_ms).ok()?;
    let write_await = get(columns.write_await_ms).ok()?;
    let plain_await = get(columns.await_ms).ok()?;
    let latency_ms = match (read_await, write_await) {
        (Some(read), Some(write)) if reads + writes > 0.0 => {
            Some((read * reads + write * writes) / (reads + writes))
        }
        (Some(_), Some(_)) => Some(0.0),
        _ => plain_await,
    };
    Some(DeviceRow {
        name: fields[0].to_string(),
        reads,
        writes,
        read_bytes,
        write_bytes,
        latency_ms,
        queue: get(columns.queue_size).ok()?,
    })
}

pub fn parse(text: &str, options: &ParseOptions, path: &Path) -> Result<Trace, PlanError> {
    let mut reports: Vec<Report> = Vec::new();
    let mut columns: Option<Columns> = None;
    let mut in_device_block = false;
    let mut skip_cpu_values = false;
    let mut pending_time: Option<(f64, String)> = None;
    let mut skipped_row_count = 0;
    let mut unused_columns = BTreeSet::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            in_device_block = false;
            continue;
        }
        if in_device_block {
            let parsed = columns
                .as_ref()
                .and_then(|columns| parse_row(trimmed, columns));
            match (parsed, reports.last_mut()) {
                (Some(row), Some(report)) => report.rows.push(row),
                _ => skipped_row_count += 1,
            }
            continue;
        }
        if skip_cpu_values {
            skip_cpu_values = false;
            continue;
        }
        if trimmed.starts_with("Linux ") {
            continue;
        }
        if trimmed.starts_with("avg-cpu") {
            skip_cpu_values = true;
            continue;
        }
        if trimmed.starts_with("Device") {
            columns = Some(Columns::from_header(trimmed, &mut unused_columns));
            in_device_block = true;
            let (time_seconds, time_label) = pending_time.take().unzip();
            reports.push(Report {
                time_seconds,
                time_label,
                rows: Vec::new(),
            });
            continue;
        }
        match parse_timestamp(trimmed) {
            Some(seconds) => pending_time = Some((seconds, trimmed.to_string())),
            None => skipped_row_count += 1,
        }
    }
    if reports.is_empty() {
        return Err(PlanError::Format {
            path: path.to_path_buf(),
            format: "iostat",
            reason: "no `Device` header found; capture with `iostat -x -t INTERVAL`".to_string(),
        });
    }
    if let Some(columns) = &columns
        && (columns.reads_per_second.is_none() || columns.writes_per_second.is_none())
    {
        return Err(PlanError::Format {
            path: path.to_path_buf(),
            format: "iostat",
            reason: "the Device header has no r/s and w/s columns; capture with `iostat -x`"
                .to_string(),
        });
    }

    let mut warnings = Vec::new();
    // Without -y, iostat's first report is the average since boot, not an interval.
    if reports.len() > 1 {
        reports.remove(0);
        warnings.push(
            "dropped the first iostat report (it is the average since boot unless iostat ran with -y)"
                .to_string(),
        );
    }
    let all_devices: BTreeSet<String> = reports
        .iter()
        .flat_map(|report| report.rows.iter().map(|row| row.name.clone()))
        .collect();
    let chosen: BTreeSet<String> = if options.devices.is_empty() {
        let whole: BTreeSet<String> = all_devices
            .iter()
            .filter(|name| is_whole_disk(name))
            .cloned()
            .collect();
        if whole.is_empty() {
            all_devices.clone()
        } else {
            whole
        }
    } else {
        let chosen: BTreeSet<String> = options
            .devices
            .iter()
            .filter(|name| all_devices.contains(*name))
            .cloned()
            .collect();
        if chosen.is_empty() {
            return Err(PlanError::NoSamples {
                path: path.to_path_buf(),
                skipped_row_count,
                reason: format!(
                    "none of the devices {:?} appear in the trace (it has {:?})",
                    options.devices, all_devices
                ),
            });
        }
        chosen
    };
    let left_out: Vec<&String> = all_devices.difference(&chosen).collect();
    if !left_out.is_empty() {
        warnings.push(format!(
            "summed {} device(s) {:?}; left out {:?} (partitions or stacked devices whose I/O is counted below them; choose with --devices)",
            chosen.len(),
            chosen,
            left_out
        ));
    }
    if options.devices.is_empty()
        && all_devices
            .iter()
            .any(|name| name.starts_with("md") || name.starts_with("dm-"))
    {
        warnings.push(
            "md or device-mapper devices are present: if the disks sit under a software RAID, their load already includes its redundancy writes; pass the front-end device with --devices".to_string(),
        );
    }

    let has_timestamps = reports.iter().all(|report| report.time_seconds.is_some());
    let interval_seconds = options.interval_seconds.unwrap_or(DEFAULT_INTERVAL_SECONDS);
    if !has_timestamps {
        warnings.push(format!(
            "the capture has no timestamps (iostat without -t); assumed one report every {interval_seconds} s{}",
            if options.interval_seconds.is_none() { " (set --interval-seconds)" } else { "" }
        ));
    }
    let start_label = if has_timestamps {
        reports.first().and_then(|report| report.time_label.clone())
    } else {
        None
    };
    let mut samples = Vec::new();
    for (index, report) in reports.iter().enumerate() {
        let rows: Vec<&DeviceRow> = report
            .rows
            .iter()
            .filter(|row| chosen.contains(&row.name))
            .collect();
        // A report that lacks one of the chosen devices (a row cut short) would
        // understate the load, so the whole report is left out.
        let complete = chosen
            .iter()
            .all(|name| rows.iter().any(|row| &row.name == name));
        if !complete {
            skipped_row_count += 1;
            continue;
        }
        let time_seconds = match (has_timestamps, report.time_seconds) {
            (true, Some(seconds)) => seconds,
            _ => index as f64 * interval_seconds,
        };
        let sum = |field: fn(&DeviceRow) -> Option<f64>| -> Option<f64> {
            rows.iter().map(|row| field(row)).sum()
        };
        let reads: f64 = rows.iter().map(|row| row.reads).sum();
        let writes: f64 = rows.iter().map(|row| row.writes).sum();
        let latency_ms = rows
            .iter()
            .map(|row| {
                row.latency_ms
                    .map(|latency| latency * (row.reads + row.writes))
            })
            .sum::<Option<f64>>()
            .map(|weighted| {
                if reads + writes > 0.0 {
                    weighted / (reads + writes)
                } else {
                    0.0
                }
            });
        samples.push(Sample {
            time_seconds,
            read_iops: reads,
            write_iops: writes,
            read_bytes_per_second: sum(|row| row.read_bytes),
            write_bytes_per_second: sum(|row| row.write_bytes),
            latency_ms,
            queue_depth: sum(|row| row.queue),
        });
    }
    Trace::finish(
        TraceFormat::Iostat,
        start_label,
        samples,
        Some(chosen.len()),
        skipped_row_count,
        unused_columns.into_iter().collect(),
        warnings,
    )
    .ok_or_else(|| PlanError::NoSamples {
        path: path.to_path_buf(),
        skipped_row_count,
        reason: "no report had a usable device row".to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_disks_are_told_apart_from_partitions_and_stacked_devices() {
        for name in [
            "sda", "vdb", "xvda", "nvme0n1", "nvme12n3", "mmcblk0", "sdaa",
        ] {
            assert!(is_whole_disk(name), "{name}");
        }
        for name in [
            "sda1",
            "vdb2",
            "nvme0n1p1",
            "mmcblk0p2",
            "dm-0",
            "md127",
            "loop3",
        ] {
            assert!(!is_whole_disk(name), "{name}");
        }
    }

    #[test]
    fn locale_commas_are_decimal_points() {
        assert_eq!(number("12,50"), Ok(Some(12.5)));
        assert_eq!(number("12.50"), Ok(Some(12.5)));
    }
}
