//! The plots of `lamina bench`: the shared primitives of [`lamina_plot`] with the
//! font named by `LAMINA_BENCH_FONT`. The charts themselves live in `charts/`, one
//! per report type, so that this module depends on no benchmark and no benchmark
//! on another's drawing.

use std::path::Path;

pub use lamina_plot::{
    Chart, PLOT_HEIGHT_PIXELS, PLOT_WIDTH_PIXELS, PlotError, draw_curve, draw_legend, legend_line,
};

/// The environment variable naming the font of the benchmarks' plots.
const FONT_VARIABLE: &str = "LAMINA_BENCH_FONT";

/// Draws `chart` into `path`: SVG or PNG by its extension.
pub fn render(chart: &impl Chart, path: &Path) -> Result<(), PlotError> {
    lamina_plot::render(chart, path, FONT_VARIABLE)
}
