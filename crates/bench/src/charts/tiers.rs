//! The plot of `lamina bench tiers` ([`TiersReport`]): p99 against achieved IOPS
//! (both log scales) for the working set smaller than flash and the one larger,
//! one curve per pool, and below them the reaction's p99 per sliding window over
//! time with its bound.

use std::ops::Range;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::plot::{Chart, PLOT_WIDTH_PIXELS, draw_curve, draw_legend, draw_line};
use crate::report::format_number;
use crate::tiers::{REACTION_BOUND_FACTOR, Reaction, TierConfig, TiersReport, WorkingSet};

impl Chart for TiersReport {
    fn is_empty(&self) -> bool {
        self.curves.is_empty()
    }

    fn size_pixels(&self) -> (u32, u32) {
        (PLOT_WIDTH_PIXELS, TIERS_PLOT_HEIGHT_PIXELS)
    }

    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        draw_tiers(self, root)
    }
}

/// Height of the tiers plot: two curve panels above the reaction timeline.
const TIERS_PLOT_HEIGHT_PIXELS: u32 = 960;

fn draw_tiers<DB: DrawingBackend>(
    report: &TiersReport,
    root: &DrawingArea<DB, Shift>,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|error| error.to_string())?;
    let (top, bottom) = root.split_vertically(TIERS_PLOT_HEIGHT_PIXELS * 3 / 5);
    let panels = top.split_evenly((1, 2));
    let series_of = |config: TierConfig, working_set: WorkingSet| -> Vec<(f64, f64)> {
        report
            .curves
            .iter()
            .filter(|curve| curve.config == config && curve.working_set == working_set)
            .flat_map(|curve| curve.points.iter())
            .map(|point| {
                (
                    point.point.measurement.total_iops,
                    point.point.measurement.p99_us,
                )
            })
            .filter(|(x, y)| x.is_finite() && y.is_finite() && *x > 0.0 && *y > 0.0)
            .collect()
    };
    // One scale for both panels, so that they compare at a glance.
    let everything: Vec<(f64, f64)> = report
        .curves
        .iter()
        .flat_map(|curve| series_of(curve.config, curve.working_set))
        .collect();
    let x_min = everything
        .iter()
        .map(|(x, _)| *x)
        .fold(f64::INFINITY, f64::min);
    let x_max = everything.iter().map(|(x, _)| *x).fold(0.0, f64::max);
    let y_min = everything
        .iter()
        .map(|(_, y)| *y)
        .fold(f64::INFINITY, f64::min);
    let y_max = everything.iter().map(|(_, y)| *y).fold(0.0, f64::max);
    let (x_range, y_range) = if x_min.is_finite() && y_min.is_finite() {
        (
            (x_min * 0.7).max(0.1)..(x_max * 1.4).max(1.0),
            (y_min * 0.7).max(0.1)..(y_max * 1.4).max(1.0),
        )
    } else {
        (1.0..10.0, 1.0..10.0)
    };
    for (panel, working_set) in panels.iter().zip([WorkingSet::Small, WorkingSet::Large]) {
        let series = |config| series_of(config, working_set);
        draw_panel(report, panel, working_set, &series, (&x_range, &y_range))?;
    }
    draw_reaction(report, &bottom)
}

/// The curves of one working set, one per pool, on the scale both panels share.
fn draw_panel<DB: DrawingBackend>(
    report: &TiersReport,
    panel: &DrawingArea<DB, Shift>,
    working_set: WorkingSet,
    series_of: &dyn Fn(TierConfig) -> Vec<(f64, f64)>,
    (x_range, y_range): (&Range<f64>, &Range<f64>),
) -> Result<(), String> {
    let configs = [
        TierConfig::AllFlash,
        TierConfig::FlashDisk,
        TierConfig::Disk,
    ];
    let bytes = match working_set {
        WorkingSet::Small => report.settings.small_working_set_bytes,
        WorkingSet::Large => report.settings.large_working_set_bytes,
    };
    let title = format!(
        "working set {} MiB {} flash {} MiB",
        bytes >> 20,
        if working_set == WorkingSet::Small {
            "<"
        } else {
            ">"
        },
        report.settings.flash_size_bytes >> 20
    );
    let mut chart = ChartBuilder::on(panel)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range.clone().log_scale(), y_range.clone().log_scale())
        .map_err(|error| error.to_string())?;
    chart
        .configure_mesh()
        .x_desc("achieved IOPS (log)")
        .y_desc("p99 latency (µs, log)")
        .x_label_formatter(&|x| format_number(*x))
        .y_label_formatter(&|y| format_number(*y))
        .draw()
        .map_err(|error| error.to_string())?;
    for (index, config) in configs.iter().enumerate() {
        let points = series_of(*config);
        if points.is_empty() {
            continue;
        }
        let color = Palette99::pick(index).to_rgba();
        draw_curve(&mut chart, &points, color, config.name(), 3)?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    Ok(())
}

fn reaction_title(reaction: &Reaction) -> String {
    format!(
        "reaction: demoted {} MiB volume read at {}/s (flash+disk); settled {}",
        reaction.working_set_bytes >> 20,
        reaction.rate_iops,
        reaction
            .settled_seconds
            .map_or("never".to_owned(), |seconds| format!("at {seconds:.1} s")),
    )
}

/// The reaction's p99 per sliding window over time, with its bound and reference.
fn draw_reaction<DB: DrawingBackend>(
    report: &TiersReport,
    bottom: &DrawingArea<DB, Shift>,
) -> Result<(), String> {
    let Some(reaction) = &report.reaction else {
        return bottom
            .titled("reaction: not measured", ("sans-serif", 18))
            .map(|_| ())
            .map_err(|error| error.to_string());
    };
    let windows: Vec<(f64, f64)> = reaction
        .windows
        .iter()
        .filter_map(|window| window.p99_us.map(|p99| (window.end_seconds, p99)))
        .filter(|(_, p99)| *p99 > 0.0)
        .collect();
    let time_max = windows.iter().map(|(time, _)| *time).fold(1.0, f64::max);
    let latencies = windows.iter().map(|(_, p99)| *p99);
    let latency_min = (latencies.clone())
        .fold(reaction.reference_p99_us, f64::min)
        .max(0.1);
    let latency_max = latencies.fold(reaction.bound_p99_us, f64::max);
    let title = reaction_title(reaction);
    let mut chart = ChartBuilder::on(bottom)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(
            0.0..time_max * 1.02,
            ((latency_min * 0.7)..(latency_max * 1.4)).log_scale(),
        )
        .map_err(|error| error.to_string())?;
    chart
        .configure_mesh()
        .x_desc("seconds since the first read (end of each 1 s window)")
        .y_desc("window p99 (µs, log)")
        .y_label_formatter(&|y| format_number(*y))
        .draw()
        .map_err(|error| error.to_string())?;
    let color = Palette99::pick(1).to_rgba();
    draw_line(
        &mut chart,
        windows,
        color.stroke_width(2),
        "flash+disk p99, sliding 1 s windows",
    )?;
    for (value, label, style) in [
        (
            reaction.bound_p99_us,
            format!("bound: {} x all-flash p99", REACTION_BOUND_FACTOR),
            BLACK.mix(0.6).stroke_width(1),
        ),
        (
            reaction.reference_p99_us,
            "all-flash p99".to_owned(),
            Palette99::pick(0).to_rgba().stroke_width(1),
        ),
    ] {
        draw_line(
            &mut chart,
            vec![(0.0, value), (time_max * 1.02, value)],
            style,
            label,
        )?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    Ok(())
}
