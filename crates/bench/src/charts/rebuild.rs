//! The plot of `lamina bench rebuild` ([`RebuildReport`]): for each loaded run,
//! client IOPS per second above and p99 per second (log scale) below, with the
//! device's failure, the rebuild's start (`device replace` or `device rebuild`)
//! and its end marked, and the healthy p99 and the goal (1.5 × healthy) as
//! horizontal lines.

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use crate::plot::{Chart, PLOT_WIDTH_PIXELS, draw_legend, draw_line};
use crate::rebuild::{LoadRun, P99_GOAL_FACTOR, RebuildReport};
use crate::report::format_number;

/// Height of one loaded run's two panels.
const RUN_HEIGHT_PIXELS: u32 = 640;

impl Chart for RebuildReport {
    fn is_empty(&self) -> bool {
        self.load.is_empty()
    }

    fn size_pixels(&self) -> (u32, u32) {
        let runs = u32::try_from(self.load.len()).unwrap_or(u32::MAX);
        (
            PLOT_WIDTH_PIXELS,
            RUN_HEIGHT_PIXELS.saturating_mul(runs.max(1)),
        )
    }

    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        root.fill(&WHITE).map_err(|error| error.to_string())?;
        let areas = root.split_evenly((self.load.len(), 1));
        for (area, run) in areas.iter().zip(&self.load) {
            draw_run(self, run, area)?;
        }
        Ok(())
    }
}

/// The events as (seconds, label, colour).
fn events(run: &LoadRun) -> [(f64, &'static str, RGBColor); 3] {
    [
        (run.events.fail_seconds, "device fail", RED),
        (
            run.events.rebuild_start_seconds,
            run.kind.start_label(),
            BLUE,
        ),
        (
            run.events.rebuild_end_seconds,
            if run.rebuild_error.is_some() {
                "rebuild failed"
            } else {
                "rebuild over"
            },
            RGBColor(0, 150, 0),
        ),
    ]
}

fn draw_markers<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    run: &LoadRun,
    y_low: f64,
    y_high: f64,
) -> Result<(), String> {
    for (seconds, label, color) in events(run) {
        let style = color.stroke_width(2);
        draw_line(
            chart,
            vec![(seconds, y_low), (seconds, y_high)],
            style,
            label,
        )?;
    }
    Ok(())
}

fn draw_run<DB: DrawingBackend>(
    report: &RebuildReport,
    run: &LoadRun,
    area: &DrawingArea<DB, Shift>,
) -> Result<(), String> {
    let (top, bottom) = area.split_vertically(RUN_HEIGHT_PIXELS / 2);
    let time_max = run.events.end_seconds.max(1.0);
    let iops: Vec<(f64, f64)> = run
        .seconds
        .iter()
        .filter(|second| second.seconds <= time_max)
        .map(|second| (second.seconds, second.iops))
        .collect();
    let iops_max = iops.iter().map(|(_, iops)| *iops).fold(1.0, f64::max) * 1.2;
    let title = format!(
        "impact {}: 70/30 4 KiB at {} IOPS ({:.0}% of the {:.0} peak){}; {} MiB rebuilt in {:.1} s",
        run.impact.name(),
        run.target_iops,
        report.settings.load_share * 100.0,
        run.peak.total_iops,
        report
            .settings
            .model
            .as_ref()
            .map_or(String::new(), |model| format!(", {model}")),
        run.rebuild.bytes_total >> 20,
        run.rebuild.seconds
    );
    let mut chart = ChartBuilder::on(&top)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..time_max, 0.0..iops_max)
        .map_err(|error| error.to_string())?;
    chart
        .configure_mesh()
        .y_desc("IOPS per second")
        .y_label_formatter(&|y| format_number(*y))
        .draw()
        .map_err(|error| error.to_string())?;
    let color = BLACK;
    draw_line(&mut chart, iops, color.stroke_width(2), "client IOPS")?;
    draw_markers(&mut chart, run, 0.0, iops_max)?;
    draw_legend(&mut chart, SeriesLabelPosition::LowerLeft)?;
    draw_latency(run, &bottom, time_max)
}

fn draw_latency<DB: DrawingBackend>(
    run: &LoadRun,
    area: &DrawingArea<DB, Shift>,
    time_max: f64,
) -> Result<(), String> {
    let p99: Vec<(f64, f64)> = run
        .seconds
        .iter()
        .filter(|second| second.seconds <= time_max)
        .filter_map(|second| second.p99_us.map(|p99| (second.seconds, p99)))
        .filter(|(_, p99)| *p99 > 0.0)
        .collect();
    let healthy = run.phases.first().and_then(|phase| phase.p99_us);
    let goal = healthy.map(|healthy| healthy * P99_GOAL_FACTOR);
    let latencies = p99.iter().map(|(_, p99)| *p99);
    let low = latencies.clone().fold(f64::INFINITY, f64::min);
    let high = latencies.chain(goal).fold(1.0, f64::max) * 1.4;
    let low = if low.is_finite() { low * 0.7 } else { 1.0 };
    let title = format!(
        "p99 per second; rebuilding ÷ healthy p99 = {}",
        run.p99_ratio
            .map_or("-".to_owned(), |ratio| format!("{ratio:.2}"))
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..time_max, (low..high).log_scale())
        .map_err(|error| error.to_string())?;
    chart
        .configure_mesh()
        .x_desc("seconds since the load started")
        .y_desc("p99 (µs, log)")
        .y_label_formatter(&|y| format_number(*y))
        .draw()
        .map_err(|error| error.to_string())?;
    let color = BLACK;
    draw_line(
        &mut chart,
        p99,
        color.stroke_width(2),
        "client p99 (1 s windows)",
    )?;
    draw_markers(&mut chart, run, low, high)?;
    for (value, label, style) in [
        (
            healthy,
            "healthy p99 (phase)",
            RGBColor(128, 128, 128).stroke_width(2),
        ),
        (
            goal,
            "goal: 1.5 x healthy",
            RGBColor(230, 140, 0).stroke_width(2),
        ),
    ] {
        let Some(value) = value else { continue };
        draw_line(
            &mut chart,
            vec![(0.0, value), (time_max, value)],
            style,
            label,
        )?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    Ok(())
}
