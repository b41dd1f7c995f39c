//! `lamina plan`: sizes a pool from a real workload trace the way a careful storage
//! engineer does. It finds the steady-state load in busy periods (not the mean, which
//! idle nights drag down, nor the peak, which short spikes inflate), leaves spikes to
//! the cache, converts front-end load to back-end device operations for the chosen
//! redundancy, counts drives at a latency target and sizes flash for the working set.
//!
//! The pieces are separate so tests and other tools can use them alone: `parse`
//! (one module per trace format), `analysis`, `backend`, `flash`, `report`, `plot`.
//! `plan` runs them in order on a parsed trace.

pub mod analysis;
pub mod backend;
mod convert;
pub mod error;
pub mod flash;
pub mod parse;
pub mod plot;
pub mod reduction;
pub mod report;
pub mod trace;

use std::path::PathBuf;

pub use analysis::{Analysis, AnalysisOptions};
pub use backend::{BackendSizing, DriveModel, ProposalCheck, Redundancy};
pub use error::PlanError;
pub use flash::{FlashOptions, FlashSizing};
pub use parse::addresses::AddressTrace;
pub use parse::{ParseOptions, parse_file};
pub use reduction::{CapacitySizing, REDUCTION_RATIO_MAX, ReductionRatio};
pub use report::{PlanReport, render_json, render_text};
pub use trace::{Sample, Trace, TraceFormat};

use analysis::GIB;

/// Everything `plan` needs besides the traces.
#[derive(Debug, Clone)]
pub struct PlanSettings {
    pub analysis: AnalysisOptions,
    pub flash: FlashOptions,
    pub redundancy: Redundancy,
    pub drive: DriveModel,
    pub spare_drives: u64,
    /// Working drives in a proposal to check, if any.
    pub proposal_drives: Option<u64>,
    /// The compression ratio measured on the data (`lamina reduction estimate`).
    pub reduction: Option<ReductionRatio>,
    /// The data the pool must hold, as hosts write it.
    pub capacity_bytes: Option<f64>,
}

impl PlanSettings {
    /// Default analysis and flash options for a scheme and drive.
    pub fn new(redundancy: Redundancy, drive: DriveModel) -> PlanSettings {
        PlanSettings {
            analysis: AnalysisOptions::default(),
            flash: FlashOptions::default(),
            redundancy,
            drive,
            spare_drives: 1,
            proposal_drives: None,
            reduction: None,
            capacity_bytes: None,
        }
    }
}

/// Runs the whole method on a parsed trace. `trace_name` only labels the report.
pub fn plan(
    trace_name: &str,
    trace: &Trace,
    addresses: Option<&AddressTrace>,
    settings: &PlanSettings,
) -> PlanReport {
    let analysis = analysis::analyse(trace, &settings.analysis);
    let latency_target_ms = settings.analysis.latency_target_ms;
    let drive_iops_at_target = settings.drive.iops_at_latency(latency_target_ms);
    let mut warnings = trace.warnings.clone();
    if let Some(addresses) = addresses
        && addresses.skipped_row_count > 0
    {
        warnings.push(format!(
            "skipped {} unusable row(s) of the address trace",
            addresses.skipped_row_count
        ));
    }
    warnings.extend(analysis.warnings.iter().cloned());
    warnings.extend(analysis.saturation.warnings.iter().cloned());
    // A drive that cannot meet the target even idle cannot be sized; one operation
    // per second keeps the arithmetic finite and the warning says why.
    let drive_iops = if drive_iops_at_target > 0.0 {
        drive_iops_at_target
    } else {
        warnings.push(format!(
            "{} cannot meet a {latency_target_ms} ms target even when idle; the drive count is meaningless",
            settings.drive.name
        ));
        1.0
    };
    if (latency_target_ms - settings.drive.rated_latency_ms).abs() > 1e-9 {
        warnings.push(format!(
            "{} is rated at {} ms; at the {latency_target_ms} ms target the queueing model gives {:.0} IOPS per drive",
            settings.drive.name, settings.drive.rated_latency_ms, drive_iops_at_target
        ));
    }
    let sizing = backend::size_backend(
        analysis.steady_read_iops,
        analysis.steady_write_iops,
        0.0,
        settings.redundancy,
        drive_iops,
        settings.spare_drives,
    );
    let flash = flash::size_flash(
        &analysis,
        addresses,
        &settings.flash,
        settings.redundancy,
        drive_iops,
        settings.spare_drives,
    );
    warnings.extend(flash.warnings.iter().cloned());
    let proposal = settings.proposal_drives.map(|drives| {
        backend::check_proposal(drives, &sizing, Some(&flash.with_flash), &settings.drive)
    });
    if let Some(proposal) = &proposal
        && proposal.under_sized
    {
        warnings.push(format!(
            "the proposal of {} working drives is under-sized: the steady state needs {}",
            proposal.proposed_working_drives, proposal.needed_working_drives
        ));
    }
    let capacity = capacity_sizing(settings, flash.flash_bytes);
    PlanReport {
        trace: report::TraceSummary::of(
            trace_name,
            trace,
            addresses.map(|addresses| addresses.accesses.len()),
        ),
        analysis_options: settings.analysis.clone(),
        flash_options: settings.flash.clone(),
        analysis,
        redundancy: settings.redundancy,
        drive: settings.drive.clone(),
        latency_target_ms,
        drive_iops_at_target,
        sizing,
        flash,
        proposal,
        capacity,
        warnings,
    }
}

/// Capacity after reduction, when a ratio or a capacity was given (a
/// capacity alone is shown at ratio 1).
fn capacity_sizing(settings: &PlanSettings, flash_bytes: f64) -> Option<CapacitySizing> {
    if settings.reduction.is_none() && settings.capacity_bytes.is_none() {
        return None;
    }
    let ratio = settings
        .reduction
        .unwrap_or_else(|| ReductionRatio::new(1.0).expect("1 is a valid ratio"));
    Some(reduction::size_capacity(
        ratio,
        settings.capacity_bytes,
        flash_bytes,
    ))
}

/// Command-line arguments of `lamina plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The workload trace to analyse.
    #[arg(long)]
    pub trace: PathBuf,
    /// Trace format; detected from the content when omitted.
    #[arg(long, value_enum)]
    pub format: Option<TraceFormat>,
    /// raid10, raid5, raid6, or lamina-raid6:K (log-structured full stripes over K data devices).
    #[arg(long)]
    pub redundancy: Redundancy,
    /// hdd-15k, hdd-10k, hdd-7k, ssd, or custom:IOPS@LATENCY_MS.
    #[arg(long)]
    pub drive: DriveModel,
    /// Mean response time the pool must meet.
    #[arg(long, default_value_t = 20.0)]
    pub latency_target_ms: f64,
    /// Hot spares on top of the working drives.
    #[arg(long, default_value_t = 1)]
    pub spares: u64,
    /// Print the plan as JSON instead of the readable report.
    #[arg(long)]
    pub json: bool,
    /// Write a timeline of the load with peak, mean and steady state to this SVG file.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Working drives in a vendor proposal to check against the plan.
    #[arg(long)]
    pub proposal_drives: Option<u64>,
    /// Percentile of busy-period samples taken as the steady state.
    #[arg(long, default_value_t = 90.0)]
    pub steady_percentile: f64,
    /// Window of the rolling median that finds busy periods, in minutes.
    #[arg(long, default_value_t = 15.0)]
    pub busy_window_minutes: f64,
    /// Busy when the rolling median reaches this fraction of its maximum.
    #[arg(long, default_value_t = 0.2)]
    pub busy_fraction: f64,
    /// Load above this multiple of the steady state counts as a spike.
    #[arg(long, default_value_t = 1.5)]
    pub spike_factor: f64,
    /// Size of the cache that should absorb spikes, in GiB.
    #[arg(long, default_value_t = 8.0)]
    pub cache_gib: f64,
    /// Rate the cache serves above the drives, in IOPS.
    #[arg(long, default_value_t = 50_000.0)]
    pub cache_iops: f64,
    /// Read hit ratio the flash is sized for.
    #[arg(long, default_value_t = 0.9)]
    pub target_hit_ratio: f64,
    /// Working set per hour, in GiB, when you know it (overrides the estimate).
    #[arg(long)]
    pub working_set_gib: Option<f64>,
    /// Address trace (blkparse output or timestamp,offset_bytes,length_bytes[,operation])
    /// to measure the working set and hit ratios from.
    #[arg(long)]
    pub addresses: Option<PathBuf>,
    /// Without addresses: share of an hour's bytes assumed to fall on distinct blocks.
    #[arg(long, default_value_t = 0.25)]
    pub unique_fraction: f64,
    /// Disks behind the traced load, to judge queue lengths (when the trace does not say).
    #[arg(long)]
    pub current_drives: Option<usize>,
    /// Sampling interval for iostat captures without timestamps.
    #[arg(long)]
    pub interval_seconds: Option<f64>,
    /// Only these devices (iostat names, perfmon instances), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub devices: Vec<String>,
    /// Compression ratio of the data, as `lamina reduction estimate` measured it:
    /// capacity and flash are divided by it.
    #[arg(long, value_name = "RATIO")]
    pub reduction: Option<f64>,
    /// Data the pool must hold, as hosts write it, in GiB.
    #[arg(long)]
    pub capacity_gib: Option<f64>,
}

impl PlanArgs {
    /// Checks ranges and builds the settings.
    pub fn settings(&self) -> Result<PlanSettings, PlanError> {
        let check = |option: &'static str, ok: bool, reason: &str| {
            if ok {
                Ok(())
            } else {
                Err(PlanError::Option {
                    option,
                    reason: reason.to_string(),
                })
            }
        };
        let positive = |value: f64| value.is_finite() && value > 0.0;
        let fraction = |value: f64| (0.0..=1.0).contains(&value);
        check(
            "--latency-target-ms",
            positive(self.latency_target_ms),
            "must be a positive number",
        )?;
        check(
            "--steady-percentile",
            (0.0..=100.0).contains(&self.steady_percentile),
            "must be between 0 and 100",
        )?;
        check(
            "--busy-window-minutes",
            positive(self.busy_window_minutes),
            "must be positive",
        )?;
        check(
            "--busy-fraction",
            fraction(self.busy_fraction),
            "must be between 0 and 1",
        )?;
        check(
            "--spike-factor",
            self.spike_factor.is_finite() && self.spike_factor >= 1.0,
            "must be at least 1",
        )?;
        check(
            "--cache-gib",
            self.cache_gib.is_finite() && self.cache_gib >= 0.0,
            "must not be negative",
        )?;
        check(
            "--cache-iops",
            self.cache_iops.is_finite() && self.cache_iops >= 0.0,
            "must not be negative",
        )?;
        check(
            "--target-hit-ratio",
            fraction(self.target_hit_ratio),
            "must be between 0 and 1",
        )?;
        check(
            "--unique-fraction",
            self.unique_fraction > 0.0 && self.unique_fraction <= 1.0,
            "must be in (0, 1]",
        )?;
        if let Some(gib) = self.working_set_gib {
            check(
                "--working-set-gib",
                gib.is_finite() && gib >= 0.0,
                "must not be negative",
            )?;
        }
        if let Some(seconds) = self.interval_seconds {
            check("--interval-seconds", positive(seconds), "must be positive")?;
        }
        if let Some(gib) = self.capacity_gib {
            check(
                "--capacity-gib",
                gib.is_finite() && gib >= 0.0,
                "must not be negative",
            )?;
        }
        let reduction = self
            .reduction
            .map(ReductionRatio::new)
            .transpose()
            .map_err(|error| PlanError::Option {
                option: "--reduction",
                reason: error.to_string(),
            })?;
        let mut settings = PlanSettings::new(self.redundancy, self.drive.clone());
        settings.spare_drives = self.spares;
        settings.proposal_drives = self.proposal_drives;
        settings.reduction = reduction;
        settings.capacity_bytes = self.capacity_gib.map(|gib| gib * GIB);
        settings.analysis = AnalysisOptions {
            steady_percentile: self.steady_percentile,
            busy_window_seconds: self.busy_window_minutes * 60.0,
            busy_fraction: self.busy_fraction,
            spike_factor: self.spike_factor,
            cache_size_bytes: self.cache_gib * GIB,
            cache_iops: self.cache_iops,
            latency_target_ms: self.latency_target_ms,
            current_drive_count: self.current_drives,
            ..AnalysisOptions::default()
        };
        settings.flash = FlashOptions {
            target_hit_ratio: self.target_hit_ratio,
            working_set_bytes: self.working_set_gib.map(|gib| gib * GIB),
            unique_fraction: self.unique_fraction,
            ..FlashOptions::default()
        };
        Ok(settings)
    }
}

/// Runs `lamina plan`: parse, plan, print, and plot when asked.
pub fn run(arguments: PlanArgs) -> anyhow::Result<()> {
    let settings = arguments.settings()?;
    let parse_options = ParseOptions {
        interval_seconds: arguments.interval_seconds,
        devices: arguments.devices.clone(),
    };
    let trace = parse_file(&arguments.trace, arguments.format, &parse_options)?;
    let addresses = arguments
        .addresses
        .as_deref()
        .map(parse::addresses::parse_file)
        .transpose()?;
    let report = plan(
        &arguments.trace.display().to_string(),
        &trace,
        addresses.as_ref(),
        &settings,
    );
    if let Some(path) = &arguments.plot {
        plot::write_svg(path, &trace, &report.analysis)?;
    }
    let mut output = if arguments.json {
        render_json(&report) + "\n"
    } else {
        render_text(&report)
    };
    if let Some(path) = arguments.plot.as_ref().filter(|_| !arguments.json) {
        output.push_str(&format!("\nTimeline written to {}\n", path.display()));
    }
    write_stdout(&output)
}

/// Prints to standard output; a reader that went away (`| head`) is not an error.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => Ok(result?),
    }
}
