//! Windows performance-monitor CSV (PDH-CSV 4.0): a timestamp column, then one
//! column per counter path such as `\\HOST\PhysicalDisk(_Total)\Disk Reads/sec`.
//!
//! Counters of several hosts and disks are summed per timestamp. To avoid counting
//! the same I/O twice, each host contributes either its `_Total` instance or the sum
//! of its individual instances (never both), and `PhysicalDisk` is preferred over
//! `LogicalDisk` when a host logs both.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::common::{ParseOptions, parse_counter, parse_timestamp};
use crate::error::PlanError;
use crate::trace::{Sample, Trace, TraceFormat};

/// The disk counters the planner uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Counter {
    ReadsPerSecond,
    WritesPerSecond,
    ReadBytesPerSecond,
    WriteBytesPerSecond,
    QueueLength,
    SecondsPerTransfer,
}

impl Counter {
    fn from_name(name: &str) -> Option<Counter> {
        match name.trim().to_ascii_lowercase().as_str() {
            "disk reads/sec" => Some(Counter::ReadsPerSecond),
            "disk writes/sec" => Some(Counter::WritesPerSecond),
            "disk read bytes/sec" => Some(Counter::ReadBytesPerSecond),
            "disk write bytes/sec" => Some(Counter::WriteBytesPerSecond),
            "avg. disk queue length" => Some(Counter::QueueLength),
            "avg. disk sec/transfer" => Some(Counter::SecondsPerTransfer),
            _ => None,
        }
    }
}

/// A counter path split into its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
struct CounterPath {
    host: String,
    object: String,
    instance: String,
    counter: String,
}

/// Splits `\\HOST\Object(Instance)\Counter`; the host part is optional.
fn split_path(path: &str) -> Option<CounterPath> {
    let path = path.trim();
    let (host, rest) = match path.strip_prefix("\\\\") {
        Some(rest) => {
            let (host, rest) = rest.split_once('\\')?;
            (host.to_string(), rest)
        }
        None => (String::new(), path.strip_prefix('\\')?),
    };
    let (object_part, counter) = rest.rsplit_once('\\')?;
    let (object, instance) = match object_part.split_once('(') {
        Some((object, instance)) => (object, instance.strip_suffix(')')?),
        None => (object_part, ""),
    };
    Some(CounterPath {
        host,
        object: object.to_string(),
        instance: instance.to_string(),
        counter: counter.to_string(),
    })
}

/// One (host, object, instance) whose counters are summed into the samples.
#[derive(Debug, Default)]
struct Group {
    columns: BTreeMap<Counter, usize>,
}

pub fn parse(text: &str, options: &ParseOptions, path: &Path) -> Result<Trace, PlanError> {
    let format_error = |reason: String| PlanError::Format {
        path: path.to_path_buf(),
        format: "perfmon",
        reason,
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .from_reader(text.as_bytes());
    let mut records = reader.records();
    let header = match records.next() {
        Some(Ok(header)) => header,
        Some(Err(error)) => return Err(format_error(format!("unreadable header: {error}"))),
        None => return Err(format_error("the file is empty".to_string())),
    };
    if header.len() < 2 {
        return Err(format_error(
            "the header has no counter columns".to_string(),
        ));
    }

    // Sort every column into (host, object, instance) groups of known counters.
    let mut skipped_columns = Vec::new();
    let mut candidates: BTreeMap<(String, String, String), Group> = BTreeMap::new();
    for (index, name) in header.iter().enumerate().skip(1) {
        let parsed = split_path(name).and_then(|parts| {
            let counter = Counter::from_name(&parts.counter)?;
            let object = parts.object.to_ascii_lowercase();
            (object == "physicaldisk" || object == "logicaldisk").then_some((parts, counter))
        });
        match parsed {
            Some((parts, counter)) => {
                let key = (
                    parts.host,
                    parts.object.to_ascii_lowercase(),
                    parts.instance,
                );
                candidates
                    .entry(key)
                    .or_default()
                    .columns
                    .insert(counter, index);
            }
            None => skipped_columns.push(name.to_string()),
        }
    }
    let mut warnings = Vec::new();
    let selected = select_groups(
        candidates,
        options,
        &header,
        &mut skipped_columns,
        &mut warnings,
    );
    if selected.is_empty() {
        return Err(format_error(
            "no PhysicalDisk or LogicalDisk columns with Disk Reads/sec or Disk Writes/sec"
                .to_string(),
        ));
    }
    let individual_disks: BTreeSet<&(String, String, String)> = selected
        .iter()
        .map(|(key, _)| key)
        .filter(|key| key.2 != "_Total")
        .collect();
    let disk_count =
        (selected.iter().all(|(key, _)| key.2 != "_Total")).then_some(individual_disks.len());

    let mut samples = Vec::new();
    let mut skipped_row_count = 0;
    let mut start_label = None;
    for record in records {
        let Ok(record) = record else {
            skipped_row_count += 1;
            continue;
        };
        if record.iter().all(|cell| cell.trim().is_empty()) {
            continue;
        }
        // A row cut short (a log copied while perfmon wrote it) can run into the next
        // one through an open quote; its cells would land under the wrong counters.
        if record.len() != header.len() {
            skipped_row_count += 1;
            continue;
        }
        let Some(time_seconds) = record.get(0).and_then(parse_timestamp) else {
            skipped_row_count += 1;
            continue;
        };
        match sample_of_row(&record, &selected, time_seconds) {
            Some(sample) => {
                if start_label.is_none() {
                    start_label = record.get(0).map(|cell| cell.trim().to_string());
                }
                samples.push(sample);
            }
            None => skipped_row_count += 1,
        }
    }
    Trace::finish(
        TraceFormat::Perfmon,
        start_label,
        samples,
        disk_count,
        skipped_row_count,
        skipped_columns,
        warnings,
    )
    .ok_or_else(|| PlanError::NoSamples {
        path: path.to_path_buf(),
        skipped_row_count,
        reason: "every row had a bad timestamp or blank disk counters".to_string(),
    })
}

/// Chooses, per host, the object and instances to sum, moving the rest to the
/// skipped columns with a warning that says why.
fn select_groups(
    candidates: BTreeMap<(String, String, String), Group>,
    options: &ParseOptions,
    header: &csv::StringRecord,
    skipped_columns: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Vec<((String, String, String), Group)> {
    let hosts: BTreeSet<String> = candidates.keys().map(|key| key.0.clone()).collect();
    let mut selected = Vec::new();
    let mut double_count_column_count = 0;
    let mut incomplete_groups = Vec::new();
    let mut candidates = candidates;
    for host in hosts {
        let host_groups: Vec<(String, String, String)> = candidates
            .keys()
            .filter(|key| key.0 == host)
            .cloned()
            .collect();
        let has_physical = host_groups.iter().any(|key| key.1 == "physicaldisk");
        let object = if has_physical {
            "physicaldisk"
        } else {
            "logicaldisk"
        };
        let has_total = host_groups
            .iter()
            .any(|key| key.1 == object && key.2 == "_Total");
        for key in host_groups {
            let group = candidates.remove(&key).unwrap_or_default();
            let wanted_instance = if !options.devices.is_empty() {
                options.devices.iter().any(|device| device == &key.2)
            } else if has_total {
                key.2 == "_Total"
            } else {
                true
            };
            let usable = group.columns.contains_key(&Counter::ReadsPerSecond)
                && group.columns.contains_key(&Counter::WritesPerSecond);
            if key.1 == object && wanted_instance && usable {
                selected.push((key, group));
            } else {
                if key.1 == object && wanted_instance {
                    incomplete_groups.push(format!("{}\\{}({})", key.0, key.1, key.2));
                } else {
                    double_count_column_count += group.columns.len();
                }
                skipped_columns.extend(
                    group
                        .columns
                        .values()
                        .map(|index| header.get(*index).unwrap_or_default().to_string()),
                );
            }
        }
    }
    if double_count_column_count > 0 {
        warnings.push(format!(
            "ignored {double_count_column_count} disk column(s) that would count the same I/O twice \
             (per-disk instances next to _Total, or LogicalDisk next to PhysicalDisk)"
        ));
    }
    if !incomplete_groups.is_empty() {
        warnings.push(format!(
            "ignored disk instance(s) lacking Disk Reads/sec or Disk Writes/sec: {}",
            incomplete_groups.join(", ")
        ));
    }
    selected
}

/// Sums one row over the selected groups. A row whose read or write rate is blank
/// or non-numeric for any group is unusable (perfmon leaves rate counters blank in
/// its first row and whenever a sample was missed); optional counters that are
/// blank just leave that field unknown for the row.
fn sample_of_row(
    record: &csv::StringRecord,
    selected: &[((String, String, String), Group)],
    time_seconds: f64,
) -> Option<Sample> {
    let cell = |index: usize| -> Result<Option<f64>, ()> {
        parse_counter(record.get(index).unwrap_or(""))
    };
    let mut sample = Sample {
        time_seconds,
        read_iops: 0.0,
        write_iops: 0.0,
        read_bytes_per_second: Some(0.0),
        write_bytes_per_second: Some(0.0),
        latency_ms: None,
        queue_depth: Some(0.0),
    };
    let mut latency_weighted_ms = 0.0;
    let mut latency_weight = 0.0;
    let mut latency_known = true;
    for (_, group) in selected {
        let value = |counter: Counter| -> Result<Option<f64>, ()> {
            group
                .columns
                .get(&counter)
                .map_or(Ok(None), |index| cell(*index))
        };
        let reads = value(Counter::ReadsPerSecond).ok()??;
        let writes = value(Counter::WritesPerSecond).ok()??;
        sample.read_iops += reads;
        sample.write_iops += writes;
        let add = |total: &mut Option<f64>, counter: Counter| {
            *total = match (*total, value(counter)) {
                (Some(sum), Ok(Some(value))) => Some(sum + value),
                _ => None,
            };
        };
        add(
            &mut sample.read_bytes_per_second,
            Counter::ReadBytesPerSecond,
        );
        add(
            &mut sample.write_bytes_per_second,
            Counter::WriteBytesPerSecond,
        );
        add(&mut sample.queue_depth, Counter::QueueLength);
        match value(Counter::SecondsPerTransfer) {
            Ok(Some(seconds)) => {
                latency_weighted_ms += seconds * 1000.0 * (reads + writes);
                latency_weight += reads + writes;
            }
            _ => latency_known = false,
        }
    }
    if latency_known && latency_weight > 0.0 {
        sample.latency_ms = Some(latency_weighted_ms / latency_weight);
    }
    Some(sample)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_paths_split_into_host_object_instance_and_counter() {
        let parts = split_path(r"\\SQL01\PhysicalDisk(0 C: D:)\Disk Reads/sec").unwrap();
        assert_eq!(parts.host, "SQL01");
        assert_eq!(parts.object, "PhysicalDisk");
        assert_eq!(parts.instance, "0 C: D:");
        assert_eq!(parts.counter, "Disk Reads/sec");
        let parts = split_path(r"\\SQL01\Memory\Available MBytes").unwrap();
        assert_eq!(parts.object, "Memory");
        assert_eq!(parts.instance, "");
        assert!(split_path("(PDH-CSV 4.0)").is_none());
    }
}
