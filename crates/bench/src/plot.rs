//! The plots of `lamina bench`: the shared primitives of [`lamina_plot`] with the
//! font named by `LAMINA_BENCH_FONT`. The charts themselves live in `charts/`, one
//! per report type, so that this module depends on no benchmark and no benchmark
//! on another's drawing.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

pub use lamina_plot::{
    Chart, PLOT_HEIGHT_PIXELS, PLOT_WIDTH_PIXELS, PlotError, draw_curve, draw_legend, legend_line,
};

/// The environment variable naming the font of the benchmarks' plots.
const FONT_VARIABLE: &str = "LAMINA_BENCH_FONT";

/// Draws `chart` into `path`: SVG or PNG by its extension.
pub fn render(chart: &impl Chart, path: &Path) -> Result<(), PlotError> {
    lamina_plot::render(chart, path, FONT_VARIABLE)
}

/// A line through `points` in `style`, named `label` in the legend.
pub fn draw_line<'a, DB, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    points: Vec<(f64, f64)>,
    style: ShapeStyle,
    label: impl Into<String>,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    Y: Ranged<ValueType = f64>,
{
    chart
        .draw_series(LineSeries::new(points, style))
        .map_err(|error| error.to_string())?
        .label(label)
        .legend(move |(x, y)| legend_line(x, y, style));
    Ok(())
}
