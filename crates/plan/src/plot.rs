//! The timeline plot: total IOPS over time with the peak, mean and steady-state
//! levels drawn across it and the busy periods shaded, as an SVG file.
//!
//! Text is laid out with plotters' pure-Rust `ab_glyph` renderer, which needs a
//! TrueType font at run time: `LAMINA_PLAN_FONT`, or the usual Debian locations
//! (package fonts-dejavu-core), found by `lamina_plot::register_font`, which the
//! benchmark plots share.

use std::path::Path;

use plotters::prelude::*;

use crate::analysis::Analysis;
use crate::error::PlanError;
use crate::trace::Trace;

/// Size of the drawing in pixels.
const PLOT_WIDTH_PIXELS: u32 = 1200;
const PLOT_HEIGHT_PIXELS: u32 = 500;

/// The environment variable naming the plot's font.
const FONT_VARIABLE: &str = "LAMINA_PLAN_FONT";

/// Draws the timeline into an SVG string.
pub fn render_svg(trace: &Trace, analysis: &Analysis) -> Result<String, String> {
    lamina_plot::register_font(FONT_VARIABLE).map_err(|error| error.to_string())?;
    let mut svg = String::new();
    {
        let backend = SVGBackend::with_string(&mut svg, (PLOT_WIDTH_PIXELS, PLOT_HEIGHT_PIXELS));
        draw(backend.into_drawing_area(), trace, analysis).map_err(|error| error.to_string())?;
    }
    Ok(svg)
}

/// Draws the timeline into an SVG file.
pub fn write_svg(path: &Path, trace: &Trace, analysis: &Analysis) -> Result<(), PlanError> {
    let plot_error = |reason: String| PlanError::Plot {
        path: path.to_path_buf(),
        reason,
    };
    let svg = render_svg(trace, analysis).map_err(plot_error)?;
    std::fs::write(path, svg).map_err(|error| plot_error(error.to_string()))
}

fn draw<B: DrawingBackend>(
    area: DrawingArea<B, plotters::coord::Shift>,
    trace: &Trace,
    analysis: &Analysis,
) -> Result<(), DrawingAreaErrorKind<B::ErrorType>> {
    const HOUR_SECONDS: f64 = 3600.0;
    area.fill(&WHITE)?;
    let end_hours = (analysis.duration_seconds / HOUR_SECONDS).max(1e-3);
    let top_iops = (analysis.peak_iops * 1.1).clamp(1.0, f64::MAX);
    let mut chart = ChartBuilder::on(&area)
        .caption("Front-end load over time", ("sans-serif", 22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..end_hours, 0.0..top_iops)?;
    chart
        .configure_mesh()
        .x_desc("hours since the first sample")
        .y_desc("IOPS (reads + writes)")
        .x_label_formatter(&|hours| format!("{hours:.0}"))
        .y_label_formatter(&|iops| format!("{iops:.0}"))
        .draw()?;

    let busy_colour = RGBColor(230, 240, 255);
    chart
        .draw_series(analysis.busy_periods.iter().map(|period| {
            let start = period.start_seconds / HOUR_SECONDS;
            let end = (period.start_seconds + period.duration_seconds) / HOUR_SECONDS;
            Rectangle::new([(start, 0.0), (end, top_iops)], busy_colour.filled())
        }))?
        .label("busy periods")
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], busy_colour.filled()));

    chart
        .draw_series(LineSeries::new(
            trace
                .samples
                .iter()
                .map(|sample| (sample.time_seconds / HOUR_SECONDS, sample.total_iops())),
            BLACK.stroke_width(1),
        ))?
        .label("IOPS")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK));

    let levels = [
        (
            format!("peak {:.0}", analysis.peak_iops),
            analysis.peak_iops,
            RED,
        ),
        (
            format!("mean {:.0}", analysis.mean_iops),
            analysis.mean_iops,
            GREEN,
        ),
        (
            format!(
                "steady state (p{:.0} of busy) {:.0}",
                analysis.steady_percentile, analysis.steady_state_iops
            ),
            analysis.steady_state_iops,
            BLUE,
        ),
    ];
    for (label, level, colour) in levels {
        chart
            .draw_series(LineSeries::new(
                [(0.0, level), (end_hours, level)],
                colour.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    area.present()
}
