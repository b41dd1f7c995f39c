//! What lamina's plots share (`lamina bench`'s and `lamina plan`'s), and nothing
//! specific to one of them: the [`Chart`] trait a report implements to be drawn,
//! [`render`] that draws one to a file (SVG, or PNG with the `png` feature, chosen
//! by the extension), the font, and the legend's style.
//!
//! Text is laid out with a TrueType font read at run time (the `ab_glyph` renderer
//! is pure Rust, so PNG needs no system library); the font comes from the
//! caller's environment variable (`LAMINA_BENCH_FONT`, `LAMINA_PLAN_FONT`) or the
//! usual Debian locations (package fonts-dejavu-core).

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;

/// Plot size in pixels, unless a chart asks for another.
pub const PLOT_WIDTH_PIXELS: u32 = 1024;
pub const PLOT_HEIGHT_PIXELS: u32 = 640;

/// Fonts tried, in order, when `LAMINA_BENCH_FONT` is not set.
const FONT_CANDIDATES: [&str; 4] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
];

/// Errors drawing a plot.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error(
        "plots need a TrueType font: set {variable} or install fonts-dejavu-core (tried {tried})"
    )]
    NoFont {
        /// The environment variable that names a font.
        variable: String,
        tried: String,
    },
    #[error("unknown plot format for {0}: use .svg or .png")]
    UnknownFormat(String),
    #[error("drawing {path} failed: {message}")]
    Draw { path: String, message: String },
    #[error("nothing to plot: no server was measured")]
    Empty,
}

static FONT_REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();

/// Registers the first readable font as `sans-serif`, once per process: the one
/// named by the environment variable `variable`, else the first of the usual ones.
pub fn register_font(variable: &str) -> Result<(), PlotError> {
    FONT_REGISTERED
        .get_or_init(|| {
            let candidates: Vec<String> = std::env::var(variable)
                .ok()
                .into_iter()
                .chain(FONT_CANDIDATES.iter().map(|path| (*path).to_owned()))
                .collect();
            for candidate in &candidates {
                if let Ok(bytes) = std::fs::read(candidate) {
                    // The registry keeps `&'static` font data for the process lifetime;
                    // one font, read once, is leaked on purpose.
                    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                    if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
                        .is_ok()
                    {
                        return Ok(());
                    }
                }
            }
            Err(candidates.join(", "))
        })
        .clone()
        .map_err(|tried| PlotError::NoFont {
            variable: variable.to_owned(),
            tried,
        })
}

/// A report that draws itself on any plotters backend, so that one function
/// ([`render`]) picks the backend from the file's extension for all of them.
pub trait Chart {
    /// Whether there is nothing to draw ([`render`] then fails with [`PlotError::Empty`]).
    fn is_empty(&self) -> bool;

    /// Width and height of the drawing in pixels.
    fn size_pixels(&self) -> (u32, u32) {
        (PLOT_WIDTH_PIXELS, PLOT_HEIGHT_PIXELS)
    }

    /// Draws the whole chart on `root`.
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

/// Draws `chart` into `path`: SVG or PNG by its extension; the font as
/// [`register_font`] finds it with `font_variable`.
pub fn render(chart: &impl Chart, path: &Path, font_variable: &str) -> Result<(), PlotError> {
    if chart.is_empty() {
        return Err(PlotError::Empty);
    }
    register_font(font_variable)?;
    let size = chart.size_pixels();
    let draw_error = |error: String| PlotError::Draw {
        path: path.display().to_string(),
        message: error,
    };
    match path
        .extension()
        .and_then(|extension| extension.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("svg") => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            chart.draw_on(&root).map_err(draw_error)?;
            root.present()
                .map_err(|error| draw_error(error.to_string()))
        }
        #[cfg(feature = "png")]
        Some("png") => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            chart.draw_on(&root).map_err(draw_error)?;
            root.present()
                .map_err(|error| draw_error(error.to_string()))
        }
        _ => Err(PlotError::UnknownFormat(path.display().to_string())),
    }
}

/// Draws the legend of `chart`'s labelled series at `position`, in the one style
/// all plots share (white, slightly transparent, framed).
pub fn draw_legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(position)
        .draw()
        .map_err(|error| error.to_string())
}

/// Draws `points` as a labelled curve in `color`: a line through them with a
/// dot of `marker_radius` pixels on each.
pub fn draw_curve<'a, DB, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    points: &[(f64, f64)],
    color: RGBAColor,
    label: &str,
    marker_radius: u32,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .draw_series(LineSeries::new(points.to_vec(), color.stroke_width(2)))
        .map_err(|error| error.to_string())?
        .label(label)
        .legend(move |(x, y)| legend_line(x, y, color.stroke_width(2)));
    chart
        .draw_series(
            points
                .iter()
                .map(|point| Circle::new(*point, marker_radius, color.filled())),
        )
        .map_err(|error| error.to_string())?;
    Ok(())
}

/// A short horizontal line: the legend mark of a curve drawn in `style`.
pub fn legend_line(x: i32, y: i32, style: impl Into<ShapeStyle>) -> PathElement<(i32, i32)> {
    PathElement::new(vec![(x, y), (x + 20, y)], style)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chart with one line, to test what [`render`] does for any chart.
    struct Line {
        empty: bool,
    }

    impl Chart for Line {
        fn is_empty(&self) -> bool {
            self.empty
        }

        fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
            root.fill(&WHITE).map_err(|error| error.to_string())?;
            let mut chart = ChartBuilder::on(root)
                .build_cartesian_2d(0.0..1.0, 0.0..1.0)
                .map_err(|error| error.to_string())?;
            chart
                .draw_series(LineSeries::new(vec![(0.0, 0.0), (1.0, 1.0)], &BLACK))
                .map_err(|error| error.to_string())?
                .label("diagonal")
                .legend(|(x, y)| legend_line(x, y, BLACK));
            draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)
        }
    }

    const FONT_VARIABLE: &str = "LAMINA_PLOT_TEST_FONT";

    #[test]
    fn svg_and_png_are_chosen_by_the_extension() {
        let directory = tempfile::tempdir().expect("tempdir");
        let svg = directory.path().join("line.SVG");
        render(&Line { empty: false }, &svg, FONT_VARIABLE).expect("draws");
        let text = std::fs::read_to_string(&svg).expect("reads");
        assert!(text.starts_with("<svg") && text.contains("diagonal"));
        if cfg!(feature = "png") {
            let png = directory.path().join("line.png");
            render(&Line { empty: false }, &png, FONT_VARIABLE).expect("draws");
            assert!(std::fs::read(&png).expect("reads").starts_with(b"\x89PNG"));
        }
    }

    #[test]
    fn unknown_extensions_and_empty_charts_are_refused() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("plot.gif");
        assert!(matches!(
            render(&Line { empty: false }, &path, FONT_VARIABLE),
            Err(PlotError::UnknownFormat(_))
        ));
        let path = directory.path().join("plot.svg");
        assert!(matches!(
            render(&Line { empty: true }, &path, FONT_VARIABLE),
            Err(PlotError::Empty)
        ));
        assert!(!path.exists());
    }
}
