//! The result of a benchmark run and its two presentations: one JSON document and a
//! plain aligned text table in which every figure carries its ratio to the reference
//! server (lamina when it was measured, otherwise the first server measured).
//!
//! Ratios, not absolute figures, are the result: on a shared machine absolute numbers
//! are noise, but servers measured in the same run on the same data are comparable.

use serde::Serialize;

use crate::harness::table::{Table, align};
use crate::workload::{Headline, Point, Profile, Settings};

/// The load averages of `/proc/loadavg` (1, 5 and 15 minutes): how busy the shared
/// machine was when a run started or ended.
pub fn load_average() -> Option<String> {
    std::fs::read_to_string("/proc/loadavg").ok().map(|text| {
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    })
}

/// The lines that end a report's table: its notes, the machine's load around the
/// run and the servers skipped, with why.
pub fn footer(
    notes: &[String],
    load_average_start: Option<&str>,
    load_average_end: Option<&str>,
    skipped: &[Skipped],
) -> String {
    let mut out = String::new();
    for note in notes {
        out.push_str(&format!("note: {note}\n"));
    }
    if let Some(start) = load_average_start {
        out.push_str(&format!(
            "load average: {start} at the start, {} at the end\n",
            load_average_end.unwrap_or("-")
        ));
    }
    for skipped in skipped {
        out.push_str(&format!(
            "skipped: {}: {}\n",
            skipped.server, skipped.reason
        ));
    }
    out
}

/// What a report holds beside its figures: how its servers were run, which were
/// skipped and why, and how busy the shared machine was around the run. Flattened
/// into the report's JSON, where these fields always were.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunNotes {
    pub notes: Vec<String>,
    pub skipped: Vec<Skipped>,
    /// `/proc/loadavg` before and after the run.
    pub load_average_start: Option<String>,
    pub load_average_end: Option<String>,
}

impl RunNotes {
    /// The lines that end the report's table.
    pub fn footer(&self) -> String {
        footer(
            &self.notes,
            self.load_average_start.as_deref(),
            self.load_average_end.as_deref(),
            &self.skipped,
        )
    }
}

/// A server that was not measured, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub server: String,
    pub reason: String,
}

/// Everything measured for one server.
#[derive(Debug, Clone, Serialize)]
pub struct ServerResult {
    pub server: String,
    pub uri: String,
    pub notes: Vec<String>,
    pub points: Vec<Point>,
    /// Sweeps only.
    pub headline: Option<Headline>,
    /// The summary figures of the table, with their ratio to the reference server.
    pub figures: Vec<Figure>,
}

impl ServerResult {
    /// A server's points, with the headline of a sweep; its figures are computed
    /// later, against the reference ([`compute_figures`]).
    pub fn measured(
        server: String,
        uri: String,
        notes: Vec<String>,
        points: Vec<Point>,
        profile: Profile,
        slo_us: f64,
    ) -> Self {
        let headline = profile
            .is_sweep()
            .then(|| crate::workload::headline(&points, slo_us));
        Self {
            server,
            uri,
            notes,
            points,
            headline,
            figures: vec![],
        }
    }
}

/// One summary figure of a server.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    pub name: String,
    pub value: Option<f64>,
    /// This server's value divided by the reference server's.
    pub ratio_to_reference: Option<f64>,
    pub higher_is_better: bool,
}

/// A whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub profile: Profile,
    pub settings: Settings,
    pub fio_version: String,
    /// The server ratios are relative to.
    pub reference: Option<String>,
    pub servers: Vec<ServerResult>,
    pub skipped: Vec<Skipped>,
}

/// The names, values and directions of a profile's summary figures.
pub fn summary_figures(
    profile: Profile,
    points: &[Point],
    headline: Option<&Headline>,
) -> Vec<(String, Option<f64>, bool)> {
    let first = points.first().map(|point| &point.measurement);
    match profile {
        Profile::Randread4k | Profile::Randwrite4k | Profile::Oltp => vec![
            ("IOPS".into(), first.map(|m| m.total_iops), true),
            (
                "MB/s".into(),
                first.map(|m| m.read_megabytes_per_second + m.write_megabytes_per_second),
                true,
            ),
            ("p50 us".into(), first.map(|m| m.p50_us), false),
            ("p99 us".into(), first.map(|m| m.p99_us), false),
            ("p99.9 us".into(), first.map(|m| m.p999_us), false),
            (
                "CPU us/op".into(),
                points.first().and_then(|point| point.server_cpu_us_per_op),
                false,
            ),
        ],
        Profile::Seq1m => {
            let step = |label: &str| points.iter().find(|point| point.label == label);
            let read = step("seq1m-read").map(|point| &point.measurement);
            let write = step("seq1m-write").map(|point| &point.measurement);
            vec![
                (
                    "read MB/s".into(),
                    read.map(|m| m.read_megabytes_per_second),
                    true,
                ),
                ("read p99 us".into(), read.map(|m| m.p99_us), false),
                (
                    "write MB/s".into(),
                    write.map(|m| m.write_megabytes_per_second),
                    true,
                ),
                ("write p99 us".into(), write.map(|m| m.p99_us), false),
            ]
        }
        Profile::QdSweep | Profile::RateSweep => {
            let slo = headline.map_or(0.0, |headline| headline.slo_p99_us);
            vec![
                (
                    format!("IOPS p99<={}", format_number(slo)),
                    headline.and_then(|headline| headline.iops_within_slo),
                    true,
                ),
                (
                    "knee IOPS".into(),
                    headline.and_then(|headline| headline.knee_iops),
                    true,
                ),
                (
                    "knee p99 us".into(),
                    headline.and_then(|headline| headline.knee_p99_us),
                    false,
                ),
                (
                    "peak IOPS".into(),
                    headline.map(|headline| headline.peak_iops),
                    true,
                ),
            ]
        }
    }
}

/// Fills every server's figures and ratios; the reference is lamina when measured.
pub fn compute_figures(profile: Profile, servers: &mut [ServerResult]) -> Option<String> {
    let raw: Vec<Vec<(String, Option<f64>, bool)>> = servers
        .iter()
        .map(|server| summary_figures(profile, &server.points, server.headline.as_ref()))
        .collect();
    let reference_index = servers
        .iter()
        .position(|server| server.server == "lamina")
        .or(if servers.is_empty() { None } else { Some(0) });
    for (server, figures) in servers.iter_mut().zip(&raw) {
        server.figures = figures
            .iter()
            .enumerate()
            .map(|(index, (name, value, higher_is_better))| {
                let reference = reference_index.and_then(|reference| raw[reference][index].1);
                Figure {
                    name: name.clone(),
                    value: *value,
                    ratio_to_reference: ratio(*value, reference),
                    higher_is_better: *higher_is_better,
                }
            })
            .collect();
    }
    reference_index.map(|index| servers[index].server.clone())
}

/// `value / reference`, when both exist and the reference is not zero.
pub fn ratio(value: Option<f64>, reference: Option<f64>) -> Option<f64> {
    match (value, reference) {
        (Some(value), Some(reference))
            if reference != 0.0 && value.is_finite() && reference.is_finite() =>
        {
            Some(value / reference)
        }
        _ => None,
    }
}

/// A number with thousands separators above 1,000 and one decimal below 100.
pub fn format_number(value: f64) -> String {
    if !value.is_finite() {
        return "-".into();
    }
    if value.abs() < 100.0 {
        return format!("{value:.1}");
    }
    let digits = format!("{:.0}", value.abs());
    let mut grouped = String::new();
    for (index, character) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(character);
    }
    if value < 0.0 {
        format!("-{grouped}")
    } else {
        grouped
    }
}

impl Report {
    /// The human table: one row per server, each figure with its ratio in brackets.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let reference = self.reference.as_deref().unwrap_or("-");
        out.push_str(&format!(
            "profile {} ({} s per step, {} of data); ratios are server / {reference}\n",
            serde_json::to_value(self.profile)
                .ok()
                .and_then(|value| value.as_str().map(str::to_owned))
                .unwrap_or_default(),
            self.settings.runtime_seconds,
            format_bytes(self.settings.region_bytes),
        ));
        if self.servers.is_empty() {
            out.push_str("no server was measured\n");
        } else {
            let mut rows: Vec<Vec<String>> = Vec::new();
            let mut header = vec!["server".to_owned()];
            header.extend(
                self.servers[0]
                    .figures
                    .iter()
                    .map(|figure| figure.name.clone()),
            );
            rows.push(header);
            for server in &self.servers {
                let mut row = vec![server.server.clone()];
                row.extend(server.figures.iter().map(|figure| {
                    let value = figure.value.map_or("-".into(), format_number);
                    match figure.ratio_to_reference {
                        Some(ratio) => format!("{value} ({ratio:.2}x)"),
                        None => value,
                    }
                }));
                rows.push(row);
            }
            out.push_str(&align(&rows));
        }
        if self.profile.is_sweep() {
            for server in &self.servers {
                out.push_str(&format!("\n{} curve:\n", server.server));
                out.push_str(&self.curve_table(server));
            }
        }
        for server in &self.servers {
            if !server.notes.is_empty() {
                out.push_str(&format!(
                    "note: {}: {}\n",
                    server.server,
                    server.notes.join("; ")
                ));
            }
        }
        out.push_str(&footer(&[], None, None, &self.skipped));
        out
    }

    fn curve_table(&self, server: &ServerResult) -> String {
        Table::new()
            .column("step", |point: &Point| point.label.clone())
            .column("target", |point| {
                point
                    .target_iops
                    .map_or("closed".into(), |target| format_number(target as f64))
            })
            .column("IOPS", |point| format_number(point.measurement.total_iops))
            .column("p50 us", |point| format_number(point.measurement.p50_us))
            .column("p99 us", |point| format_number(point.measurement.p99_us))
            .column("p99.9 us", |point| format_number(point.measurement.p999_us))
            .column("CPU us/op", |point| {
                point.server_cpu_us_per_op.map_or("-".into(), format_number)
            })
            .column("saturated", |point| {
                if point.saturated { "yes" } else { "" }.to_owned()
            })
            .render(&server.points)
    }
}

fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.0} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::headline;
    use crate::workload::tests::{sample_point, settings};

    fn result(server: &str, iops: f64, p99_us: f64) -> ServerResult {
        ServerResult {
            server: server.into(),
            uri: format!("nbd+unix:///default?socket=/{server}"),
            notes: vec![],
            points: vec![sample_point(iops, p99_us, false)],
            headline: None,
            figures: vec![],
        }
    }

    #[test]
    fn ratios_are_relative_to_lamina_wherever_it_is_listed() {
        let mut servers = vec![
            result("nbdkit", 2000.0, 400.0),
            result("lamina", 1000.0, 200.0),
        ];
        let reference = compute_figures(Profile::Randread4k, &mut servers);
        assert_eq!(reference.as_deref(), Some("lamina"));
        let iops = &servers[0].figures[0];
        assert_eq!(iops.name, "IOPS");
        assert_eq!(iops.ratio_to_reference, Some(2.0));
        assert!(iops.higher_is_better);
        let p99 = servers[0]
            .figures
            .iter()
            .find(|figure| figure.name == "p99 us")
            .expect("p99 figure");
        assert_eq!(p99.ratio_to_reference, Some(2.0));
        assert!(!p99.higher_is_better);
        assert_eq!(servers[1].figures[0].ratio_to_reference, Some(1.0));
    }

    #[test]
    fn without_lamina_the_first_server_is_the_reference() {
        let mut servers = vec![
            result("nbdkit", 2000.0, 400.0),
            result("qemu-nbd", 1000.0, 200.0),
        ];
        let reference = compute_figures(Profile::Oltp, &mut servers);
        assert_eq!(reference.as_deref(), Some("nbdkit"));
        assert_eq!(servers[1].figures[0].ratio_to_reference, Some(0.5));
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
    }

    #[test]
    fn table_has_a_row_per_server_and_lists_skipped_ones() {
        let mut servers = vec![
            result("lamina", 1000.0, 200.0),
            result("nbdkit", 1500.0, 300.0),
        ];
        let reference = compute_figures(Profile::Randread4k, &mut servers);
        let report = Report {
            profile: Profile::Randread4k,
            settings: settings(),
            fio_version: "fio-3.33".into(),
            reference,
            servers,
            skipped: vec![Skipped {
                server: "nbd-server".into(),
                reason: "`nbd-server` is not installed".into(),
            }],
        };
        let table = report.table();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("randread4k"));
        assert!(lines[1].starts_with("server"));
        assert!(lines[2].starts_with("lamina") && lines[2].contains("1,000 (1.00x)"));
        assert!(lines[3].starts_with("nbdkit") && lines[3].contains("1,500 (1.50x)"));
        assert!(table.contains("skipped: nbd-server"));
        let json = serde_json::to_value(&report).expect("serialises");
        assert_eq!(json["servers"][1]["figures"][0]["ratio_to_reference"], 1.5);
        assert_eq!(json["profile"], "randread4k");
    }

    #[test]
    fn sweep_tables_show_the_headline_and_the_curve() {
        let points = vec![
            sample_point(1000.0, 200.0, false),
            sample_point(2000.0, 300.0, false),
            sample_point(3000.0, 2000.0, true),
        ];
        let mut servers = vec![ServerResult {
            headline: Some(headline(&points, 1000.0)),
            points,
            ..result("lamina", 0.0, 0.0)
        }];
        let reference = compute_figures(Profile::RateSweep, &mut servers);
        let report = Report {
            profile: Profile::RateSweep,
            settings: settings(),
            fio_version: "fio-3.33".into(),
            reference,
            servers,
            skipped: vec![],
        };
        let table = report.table();
        assert!(table.contains("IOPS p99<=1,000"), "{table}");
        assert!(table.contains("lamina curve:"));
        assert!(
            table
                .lines()
                .any(|line| line.starts_with("rate3000") && line.ends_with("yes"))
        );
    }

    #[test]
    fn numbers_are_grouped() {
        assert_eq!(format_number(1234567.4), "1,234,567");
        assert_eq!(format_number(999.6), "1,000");
        assert_eq!(format_number(12.34), "12.3");
        assert_eq!(format_number(f64::NAN), "-");
        assert_eq!(format_bytes(1 << 30), "1 GiB");
    }
}
