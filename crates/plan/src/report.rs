//! The plan as a whole (`PlanReport`) and its two renderings: a readable report
//! that walks through the reasoning step by step, and JSON for tools.

use std::fmt::{Display, Write};

use serde::Serialize;

use crate::analysis::{Analysis, AnalysisOptions};
use crate::backend::{BackendSizing, DriveModel, ProposalCheck, Redundancy};
use crate::convert::saturating_u64;
use crate::flash::{FlashOptions, FlashSizing, WorkingSet};
use crate::reduction::CapacitySizing;
use crate::trace::{Trace, TraceFormat};

/// What the trace was and what the parsers skipped.
#[derive(Debug, Clone, Serialize)]
pub struct TraceSummary {
    pub path: String,
    pub format: TraceFormat,
    pub start_label: Option<String>,
    pub sample_count: usize,
    pub interval_seconds: f64,
    pub duration_seconds: f64,
    pub disk_count: Option<usize>,
    pub skipped_row_count: usize,
    pub skipped_column_count: usize,
    pub address_access_count: Option<usize>,
}

impl TraceSummary {
    pub fn of(path: &str, trace: &Trace, address_access_count: Option<usize>) -> TraceSummary {
        TraceSummary {
            path: path.to_string(),
            format: trace.format,
            start_label: trace.start_label.clone(),
            sample_count: trace.samples.len(),
            interval_seconds: trace.interval_seconds,
            duration_seconds: trace.duration_seconds(),
            disk_count: trace.disk_count,
            skipped_row_count: trace.skipped_row_count,
            skipped_column_count: trace.skipped_columns.len(),
            address_access_count,
        }
    }
}

/// The complete plan: inputs, every intermediate figure, the answer and warnings.
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub trace: TraceSummary,
    pub analysis_options: AnalysisOptions,
    pub flash_options: FlashOptions,
    pub analysis: Analysis,
    pub redundancy: Redundancy,
    pub drive: DriveModel,
    pub latency_target_ms: f64,
    /// What one drive delivers at the latency target.
    pub drive_iops_at_target: f64,
    pub sizing: BackendSizing,
    pub flash: FlashSizing,
    pub proposal: Option<ProposalCheck>,
    /// Capacity after data reduction, when `--reduction` or `--capacity-gib` was given.
    pub capacity: Option<CapacitySizing>,
    /// Every warning from parsing, analysis and sizing, in that order.
    pub warnings: Vec<String>,
}

/// `1234567.8` as `1,234,568`.
pub fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return "∞".to_string();
    }
    let rounded = value.round();
    let digits = saturating_u64(rounded.abs()).to_string();
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    // -0.4 rounds to -0.0, which is not below zero: printed as 0.
    if rounded < 0.0 {
        format!("-{grouped}")
    } else {
        grouped
    }
}

/// Bytes in the largest binary unit that keeps the number above one.
pub fn bytes(value: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut scaled = value;
    let mut unit = 0;
    while scaled >= 1024.0 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{scaled:.0} B")
    } else {
        format!("{scaled:.1} {}", UNITS[unit])
    }
}

/// Seconds as `+H:MM` since the first sample.
fn offset(seconds: f64) -> String {
    let minutes = saturating_u64((seconds / 60.0).round());
    format!("+{}:{:02}", minutes / 60, minutes % 60)
}

/// Seconds as a short duration.
fn duration(seconds: f64) -> String {
    if seconds < 120.0 {
        format!("{seconds:.0} s")
    } else if seconds < 2.0 * 3600.0 {
        format!("{:.0} min", seconds / 60.0)
    } else {
        format!("{:.1} h", seconds / 3600.0)
    }
}

fn percent(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

/// Spikes listed in the text report; JSON has them all.
const SHOWN_SPIKE_COUNT: usize = 15;

/// The report's text as it is written, a line at a time.
#[derive(Default)]
struct ReportText {
    text: String,
}

impl ReportText {
    fn line(&mut self, line: impl Display) {
        // Writing to a `String` cannot fail.
        let _ = writeln!(self.text, "{line}");
    }

    /// A heading, after a blank line.
    fn heading(&mut self, heading: impl Display) {
        self.text.push('\n');
        self.line(heading);
    }
}

/// A numbered section of the report: the number comes from its place in the
/// list, so a section added or left out renumbers the ones after it.
struct Section<'a> {
    title: String,
    body: Box<dyn Fn(&mut ReportText) + 'a>,
}

impl<'a> Section<'a> {
    fn new(title: impl Into<String>, body: impl Fn(&mut ReportText) + 'a) -> Section<'a> {
        Section {
            title: title.into(),
            body: Box::new(body),
        }
    }
}

/// The readable report: what the trace was and any warnings, the numbered
/// sections that walk through the reasoning, then the assumptions.
pub fn render_text(report: &PlanReport) -> String {
    let mut text = ReportText::default();
    write_header(&mut text, report);
    for (index, section) in sections(report).iter().enumerate() {
        text.heading(format_args!("{}. {}", index + 1, section.title));
        (section.body)(&mut text);
    }
    write_assumptions(&mut text, report);
    text.text
}

/// The numbered sections, in order; the proposal only when one was given.
fn sections(report: &PlanReport) -> Vec<Section<'_>> {
    let options = &report.analysis_options;
    let mut sections = vec![
        Section::new("Load in the trace", |text| write_load(text, report)),
        Section::new(
            format!(
                "Spikes (load above {} x steady state = {} IOPS)",
                options.spike_factor,
                thousands(report.analysis.spike_threshold_iops)
            ),
            |text| write_spikes(text, report),
        ),
        Section::new("Was the traced system saturated?", |text| {
            write_saturation(text, report)
        }),
        Section::new(
            format!(
                "Back-end load and drives ({}, {})",
                report.redundancy, report.drive.name
            ),
            |text| write_steps(text, report),
        ),
        Section::new("Flash in front", |text| write_flash(text, report)),
    ];
    if let Some(capacity) = &report.capacity {
        sections.push(Section::new(
            format!(
                "Capacity after data reduction ({:.2} : 1)",
                capacity.reduction_ratio
            ),
            move |text| write_capacity(text, capacity),
        ));
    }
    if let Some(proposal) = &report.proposal {
        sections.push(Section::new(
            format!(
                "Proposal: {} working drives",
                proposal.proposed_working_drives
            ),
            move |text| write_proposal(text, report, proposal),
        ));
    }
    sections
}

fn write_header(text: &mut ReportText, report: &PlanReport) {
    let trace = &report.trace;
    text.line(format_args!(
        "lamina plan: sizing a pool from {}",
        trace.path
    ));
    text.line(format_args!(
        "  {} trace, {} samples every {}, {}{}{}",
        trace.format.name(),
        trace.sample_count,
        duration(trace.interval_seconds),
        duration(trace.duration_seconds),
        trace
            .start_label
            .as_ref()
            .map(|label| format!(" from {label}"))
            .unwrap_or_default(),
        trace
            .disk_count
            .map(|count| format!(", {count} disk(s) summed"))
            .unwrap_or_default(),
    ));
    if !report.warnings.is_empty() {
        text.heading("Warnings");
        for warning in &report.warnings {
            text.line(format_args!("  ! {warning}"));
        }
    }
}

fn write_load(text: &mut ReportText, report: &PlanReport) {
    let analysis = &report.analysis;
    let options = &report.analysis_options;
    text.line(format_args!("  {:<14} {:>10}", "", "IOPS"));
    text.line(format_args!(
        "  {:<14} {:>10}  at {}",
        "peak",
        thousands(analysis.peak_iops),
        offset(analysis.peak_time_seconds)
    ));
    text.line(format_args!(
        "  {:<14} {:>10}  over the whole trace, idle time included",
        "mean",
        thousands(analysis.mean_iops)
    ));
    let busy_seconds: f64 = analysis
        .busy_periods
        .iter()
        .map(|period| period.duration_seconds)
        .sum();
    text.line(format_args!(
        "  {:<14} {:>10}  {:.0}th percentile of {} busy samples ({} in {} busy period(s))",
        "steady state",
        thousands(analysis.steady_state_iops),
        analysis.steady_percentile,
        analysis.busy_sample_count,
        duration(busy_seconds),
        analysis.busy_periods.len()
    ));
    text.line(format_args!(
        "  {:<14} {:>10}  busy = rolling {}-minute median at least {:.0}% of its maximum",
        "busy from",
        thousands(analysis.busy_threshold_iops),
        (options.busy_window_seconds / 60.0).round(),
        options.busy_fraction * 100.0
    ));
    text.line(format_args!(
        "  mix in busy periods: {} reads, {} writes",
        percent(1.0 - analysis.write_fraction),
        percent(analysis.write_fraction)
    ));
    match analysis.mean_io_size_bytes {
        Some(size) => text.line(format_args!(
            "  mean I/O size: {} (reads {}, writes {})",
            bytes(size),
            analysis.mean_read_size_bytes.map_or("-".to_string(), bytes),
            analysis
                .mean_write_size_bytes
                .map_or("-".to_string(), bytes)
        )),
        None => text.line(format_args!(
            "  mean I/O size: not in the trace; assumed {}",
            bytes(analysis.io_size_bytes_used)
        )),
    }
}

fn write_spikes(text: &mut ReportText, report: &PlanReport) {
    let analysis = &report.analysis;
    if analysis.spikes.is_empty() {
        text.line("  none");
        return;
    }
    text.line(format_args!(
        "  {:<8} {:>9} {:>10} {:>9} {:>13}  cache {} at {} IOPS",
        "start",
        "duration",
        "peak IOPS",
        "x steady",
        "excess writes",
        bytes(report.analysis_options.cache_size_bytes),
        thousands(report.analysis_options.cache_iops)
    ));
    let mut spikes: Vec<_> = analysis.spikes.iter().collect();
    spikes.sort_by(|a, b| b.excess_operations.total_cmp(&a.excess_operations));
    for spike in spikes.iter().take(SHOWN_SPIKE_COUNT) {
        text.line(format_args!(
            "  {:<8} {:>9} {:>10} {:>9.1} {:>13}  {}",
            offset(spike.start_seconds),
            duration(spike.duration_seconds),
            thousands(spike.peak_iops),
            spike.magnitude,
            bytes(spike.excess_write_bytes),
            if spike.absorbed_by_cache {
                "absorbed"
            } else {
                "NOT absorbed: size the drives for it or grow the cache"
            }
        ));
    }
    if spikes.len() > SHOWN_SPIKE_COUNT {
        text.line(format_args!(
            "  ... and {} smaller spikes",
            spikes.len() - SHOWN_SPIKE_COUNT
        ));
    }
}

fn write_saturation(text: &mut ReportText, report: &PlanReport) {
    let saturation = &report.analysis.saturation;
    match saturation.busy_latency_p90_ms {
        Some(latency) => text.line(format_args!(
            "  latency, 90th percentile in busy periods: {latency:.1} ms (target {:.0} ms)",
            report.latency_target_ms
        )),
        None => text.line("  latency: not in the trace"),
    }
    match (
        saturation.busy_queue_per_disk_p90,
        saturation.busy_queue_p90,
    ) {
        (Some(per_disk), _) => text.line(format_args!(
            "  queue per disk, 90th percentile in busy periods: {per_disk:.2} (limit {:.0})",
            report.analysis_options.saturated_queue_per_disk
        )),
        (None, Some(queue)) => text.line(format_args!(
            "  queue, all disks, 90th percentile in busy periods: {queue:.2} (disk count unknown)"
        )),
        (None, None) => text.line("  queue length: not in the trace"),
    }
    let verdict = if saturation.saturated {
        "SATURATED: the trace understates the real demand; size with margin or trace a faster system"
    } else if saturation.busy_latency_p90_ms.is_none()
        && saturation.busy_queue_per_disk_p90.is_none()
    {
        "cannot tell (no latency or per-disk queue in the trace)"
    } else {
        "not saturated: the traced load is what users asked for"
    };
    text.line(format_args!("  verdict: {verdict}"));
}

/// One step of the back-end sizing: what it works out, and the result. The
/// step's number comes from its place in the list.
struct Step {
    what: String,
    result: String,
}

impl Step {
    fn new(what: impl Into<String>, result: String) -> Step {
        Step {
            what: what.into(),
            result,
        }
    }
}

fn write_steps(text: &mut ReportText, report: &PlanReport) {
    for (index, step) in backend_steps(report).iter().enumerate() {
        let number = index + 1;
        text.line(format_args!(
            "  step {number}  {:<34} {}",
            step.what, step.result
        ));
    }
    text.line(format_args!(
        "  (sizing at the mean, {} IOPS, would under-buy; at the peak, {} IOPS, would over-buy)",
        thousands(report.analysis.mean_iops),
        thousands(report.analysis.peak_iops)
    ));
}

/// From the steady front-end load to the drives to buy, in order.
fn backend_steps(report: &PlanReport) -> Vec<Step> {
    let sizing = &report.sizing;
    let penalty_text = penalty_text(sizing.write_penalty);
    vec![
        Step::new(
            "steady front-end load",
            format!(
                "{} IOPS = {} reads + {} writes",
                thousands(sizing.front_end_iops),
                thousands(sizing.front_end_read_iops),
                thousands(sizing.front_end_write_iops)
            ),
        ),
        Step::new(
            format!(
                "{} write penalty {penalty_text}",
                short_name(report.redundancy)
            ),
            format!(
                "back-end = {} + {penalty_text} x {} = {} IOPS ({:+.0}%)",
                thousands(sizing.backend_read_iops),
                thousands(sizing.front_end_write_iops),
                thousands(sizing.backend_iops),
                sizing.backend_increase_percent
            ),
        ),
        Step::new(
            format!(
                "{} at {:.0} ms",
                report.drive.name, report.latency_target_ms
            ),
            format!("{} IOPS per drive", thousands(sizing.drive_iops)),
        ),
        Step::new(
            "drives before redundancy",
            format!(
                "{} / {} = {:.1} -> {}",
                thousands(sizing.front_end_iops),
                thousands(sizing.drive_iops),
                sizing.drives_before_redundancy_exact,
                sizing.drives_before_redundancy
            ),
        ),
        Step::new(
            "drives after redundancy",
            format!(
                "{} / {} = {:.1} -> {}",
                thousands(sizing.backend_iops),
                thousands(sizing.drive_iops),
                sizing.drives_after_redundancy_exact,
                sizing.drives_after_redundancy
            ),
        ),
        Step::new(
            "working drives, layout rules",
            format!("{} {}", sizing.working_drives, layout_note(report)),
        ),
        Step::new(
            format!("plus {} spare(s)", sizing.spare_drives),
            format!(
                "{} drives  (1 spare: {}, 2 spares: {})",
                sizing.total_drives,
                sizing.working_drives.saturating_add(1),
                sizing.working_drives.saturating_add(2)
            ),
        ),
    ]
}

/// A write penalty as a whole number when it is one (RAID5's 4), else with
/// three decimals (lamina-raid6's 1.250).
fn penalty_text(penalty: f64) -> String {
    if penalty.fract() == 0.0 {
        format!("{penalty:.0}")
    } else {
        format!("{penalty:.3}")
    }
}

/// Why the working drives differ from the drives after redundancy, if they do.
fn layout_note(report: &PlanReport) -> String {
    if report.sizing.working_drives == report.sizing.drives_after_redundancy {
        "(no change for the layout)".to_string()
    } else {
        format!(
            "(at least {}{})",
            report.redundancy.minimum_drive_count(),
            if report.redundancy == Redundancy::Raid10 {
                ", in pairs"
            } else {
                ""
            }
        )
    }
}

fn short_name(redundancy: Redundancy) -> String {
    match redundancy {
        Redundancy::LaminaRaid6 { data_device_count } => {
            format!("lamina-raid6:{data_device_count}")
        }
        other => other.to_string(),
    }
}

fn write_flash(text: &mut ReportText, report: &PlanReport) {
    let flash = &report.flash;
    text.line(format_args!(
        "  working set per hour: {} ({})",
        bytes(flash.working_set_bytes),
        working_set_source(&flash.working_set)
    ));
    text.line(format_args!("  hit-ratio model: {}", flash.model));
    text.line(format_args!(
        "  flash for {} read hits: {}{}",
        percent(flash.target_hit_ratio),
        bytes(flash.flash_bytes),
        if flash.read_hit_ratio < flash.target_hit_ratio {
            format!(" (reaches only {})", percent(flash.read_hit_ratio))
        } else {
            String::new()
        }
    ));
    text.line(format_args!(
        "  with it: back-end = {} reads x {:.2} misses + {} writes x {:.3} = {} IOPS -> {} working drives (+{} spare) instead of {}",
        thousands(flash.with_flash.front_end_read_iops),
        1.0 - flash.read_hit_ratio,
        thousands(flash.with_flash.front_end_write_iops),
        flash.with_flash.write_penalty,
        thousands(flash.with_flash.backend_iops),
        flash.with_flash.working_drives,
        flash.with_flash.spare_drives,
        report.sizing.working_drives
    ));
    flash_table_row(text, "read hits", "flash", "working drives");
    flash_table_row(text, percent(0.0), bytes(0.0), report.sizing.working_drives);
    for point in &flash.table {
        flash_table_row(
            text,
            percent(point.read_hit_ratio),
            bytes(point.flash_bytes),
            point.working_drives,
        );
    }
}

fn write_capacity(text: &mut ReportText, capacity: &CapacitySizing) {
    if let (Some(logical), Some(physical)) = (capacity.logical_bytes, capacity.physical_bytes) {
        text.line(format_args!(
            "  data to hold: {} as written -> {} stored (/ {:.2})",
            bytes(logical),
            bytes(physical),
            capacity.reduction_ratio
        ));
    } else {
        text.line("  data to hold: not given (--capacity-gib)");
    }
    text.line(format_args!(
        "  flash for the working set: {} as written -> {} stored compressed",
        bytes(capacity.flash_logical_bytes),
        bytes(capacity.flash_physical_bytes)
    ));
    text.line(
        "  the ratio is an input: measure it on the real data with `lamina reduction estimate`",
    );
}

fn flash_table_row(
    text: &mut ReportText,
    read_hits: impl Display,
    flash: impl Display,
    working_drives: impl Display,
) {
    text.line(format_args!(
        "  {read_hits:>10} {flash:>12} {working_drives:>15}"
    ));
}

/// Where the working set's size comes from, said as plainly as the figure.
fn working_set_source(working_set: &WorkingSet) -> String {
    match working_set {
        WorkingSet::Measured {
            hour_count,
            access_count,
        } => format!(
            "measured: distinct 4 KiB blocks in the busiest of {hour_count} hour(s) of the address trace ({} accesses)",
            thousands(*access_count as f64)
        ),
        WorkingSet::Stated => "stated with --working-set-gib".to_string(),
        WorkingSet::Assumed {
            bytes_per_hour,
            unique_fraction,
        } => format!(
            "ASSUMED (no addresses in the trace): {:.0}% of the {} moved in a steady-state hour falls on distinct blocks",
            unique_fraction * 100.0,
            bytes(*bytes_per_hour)
        ),
    }
}

fn write_proposal(text: &mut ReportText, report: &PlanReport, proposal: &ProposalCheck) {
    if proposal.under_sized {
        text.line(format_args!(
            "  UNDER-SIZED: the steady state needs {} working drives; {} is {} short.",
            proposal.needed_working_drives,
            proposal.proposed_working_drives,
            proposal.needed_working_drives - proposal.proposed_working_drives
        ));
    } else {
        text.line(format_args!(
            "  enough: the steady state needs {} working drives.",
            proposal.needed_working_drives
        ));
    }
    let latency = proposal.predicted_latency_ms.map_or(
        "beyond saturation: queues grow without bound".to_string(),
        |latency| format!("about {latency:.0} ms mean response time"),
    );
    text.line(format_args!(
        "  each drive would carry {} back-end IOPS: {latency};",
        thousands(proposal.iops_per_drive)
    ));
    text.line(format_args!(
        "  within {:.0} ms they carry about {} front-end IOPS against a steady state of {}.",
        report.latency_target_ms,
        thousands(proposal.supported_front_end_iops),
        thousands(report.analysis.steady_state_iops)
    ));
    if let Some(enough) = proposal.enough_with_flash {
        text.line(format_args!(
            "  with {} of flash in front ({} read hits): {}",
            bytes(report.flash.flash_bytes),
            percent(report.flash.read_hit_ratio),
            if enough {
                "enough"
            } else {
                "still under-sized"
            }
        ));
    }
}

fn write_assumptions(text: &mut ReportText, report: &PlanReport) {
    text.heading("Assumptions");
    text.line(format_args!(
        "  - {} is rated {} IOPS at {} ms; other latencies follow an M/M/1 model through that point (service time {:.2} ms).",
        report.drive.name,
        thousands(report.drive.rated_iops),
        report.drive.rated_latency_ms,
        report.drive.service_time_ms()
    ));
    text.line(
        "  - Every front-end operation is small and random; sequential streams would need fewer drives.",
    );
    text.line(format_args!(
        "  - Spikes up to {} x steady state are left to the cache, not to the drives.",
        report.analysis_options.spike_factor
    ));
    text.line(
        "  - Flash serves reads only; every write still reaches the drives with the scheme's penalty.",
    );
}

/// The report as pretty-printed JSON.
pub fn render_json(report: &PlanReport) -> String {
    // Every field is a plain number, string, option or vector, so this cannot fail;
    // infinite figures become null.
    serde_json::to_string_pretty(report).expect("plan reports always serialise")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::GIB;

    #[test]
    fn numbers_are_grouped_and_bytes_scaled() {
        assert_eq!(thousands(4500.0), "4,500");
        assert_eq!(thousands(1234567.6), "1,234,568");
        assert_eq!(thousands(-1500.0), "-1,500");
        assert_eq!(thousands(12.0), "12");
        assert_eq!(bytes(512.0), "512 B");
        assert_eq!(bytes(8192.0), "8.0 KiB");
        assert_eq!(bytes(3.5 * GIB), "3.5 GiB");
    }

    #[test]
    fn offsets_and_durations_read_naturally() {
        assert_eq!(offset(3.0 * 3600.0 + 5.0 * 60.0), "+3:05");
        assert_eq!(duration(30.0), "30 s");
        assert_eq!(duration(600.0), "10 min");
        assert_eq!(duration(7.5 * 3600.0), "7.5 h");
    }
}
