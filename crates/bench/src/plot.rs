//! Plots of a report with `plotters`: SVG or PNG chosen by the file extension.
//!
//! Sweeps draw p99 latency (log scale) against achieved IOPS, one curve per server,
//! with the latency objective as a horizontal line: the latency-versus-load curve.
//! Single-point profiles draw each server's latency percentiles (p50, p90, p99, p99.9),
//! one curve per server. Text is laid out with a TrueType font read at run time (the
//! `ab_glyph` renderer is pure Rust, so PNG needs no system library); the font comes
//! from `LAMINA_BENCH_FONT` or the usual Debian locations (package fonts-dejavu-core).

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::report::Report;
use crate::workload::Profile;

/// Plot size in pixels.
const PLOT_WIDTH_PIXELS: u32 = 1024;
const PLOT_HEIGHT_PIXELS: u32 = 640;

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
        "plots need a TrueType font: set LAMINA_BENCH_FONT or install fonts-dejavu-core (tried {0})"
    )]
    NoFont(String),
    #[error("unknown plot format for {0}: use .svg or .png")]
    UnknownFormat(String),
    #[error("drawing {path} failed: {message}")]
    Draw { path: String, message: String },
    #[error("nothing to plot: no server was measured")]
    Empty,
}

static FONT_REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();

fn register_font() -> Result<(), PlotError> {
    FONT_REGISTERED
        .get_or_init(|| {
            let candidates: Vec<String> = std::env::var("LAMINA_BENCH_FONT")
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
        .map_err(PlotError::NoFont)
}

/// Draws `report` to `path` (`.svg` or `.png`).
pub fn draw(report: &Report, path: &Path) -> Result<(), PlotError> {
    if report.servers.is_empty() {
        return Err(PlotError::Empty);
    }
    render(
        &Curves(report),
        path,
        (PLOT_WIDTH_PIXELS, PLOT_HEIGHT_PIXELS),
    )
}

/// A chart that draws itself on any plotters backend, so that one function
/// ([`render`]) picks the backend from the file's extension for all of them.
trait Chart {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String>;
}

struct Curves<'a>(&'a Report);
struct Bars<'a>(&'a crate::snapshots::SnapshotsReport);
struct Tiers<'a>(&'a crate::tiers::TiersReport);

impl Chart for Curves<'_> {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        draw_on(self.0, root)
    }
}

impl Chart for Bars<'_> {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        draw_bars_on(self.0, root)
    }
}

impl Chart for Tiers<'_> {
    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        draw_tiers_on(self.0, root)
    }
}

/// Draws `chart` at `size` pixels into `path`: SVG or PNG by its extension.
fn render(chart: &impl Chart, path: &Path, size: (u32, u32)) -> Result<(), PlotError> {
    register_font()?;
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
        Some("png") => {
            let root = BitMapBackend::new(path, size).into_drawing_area();
            chart.draw_on(&root).map_err(draw_error)?;
            root.present()
                .map_err(|error| draw_error(error.to_string()))
        }
        _ => Err(PlotError::UnknownFormat(path.display().to_string())),
    }
}

fn profile_name(profile: Profile) -> String {
    serde_json::to_value(profile)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// One curve: a server's name and its (x, y) points.
type Series = (String, Vec<(f64, f64)>);

fn draw_on<DB: DrawingBackend>(
    report: &Report,
    root: &DrawingArea<DB, Shift>,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|error| error.to_string())?;
    let (series, x_label, percentile_axis): (Vec<Series>, &str, bool) = if report.profile.is_sweep()
    {
        let series = report
            .servers
            .iter()
            .map(|server| {
                let points: Vec<(f64, f64)> = server
                    .points
                    .iter()
                    .filter(|point| {
                        point.target_iops.is_some() || report.profile == Profile::QdSweep
                    })
                    .map(|point| (point.measurement.total_iops, point.measurement.p99_us))
                    .filter(|(x, y)| x.is_finite() && y.is_finite() && *y > 0.0)
                    .collect();
                // Points stay in the order measured (rising depth, then jobs), so the
                // line shows the path the server took as the load grew.
                (server.server.clone(), points)
            })
            .collect();
        (series, "achieved IOPS", false)
    } else {
        let series = report
            .servers
            .iter()
            .flat_map(|server| {
                server.points.iter().map(move |point| {
                    let measurement = &point.measurement;
                    let name = if server.points.len() > 1 {
                        format!("{} {}", server.server, point.label)
                    } else {
                        server.server.clone()
                    };
                    let values = [
                        measurement.p50_us,
                        measurement.p90_us,
                        measurement.p99_us,
                        measurement.p999_us,
                    ];
                    let points = values
                        .iter()
                        .enumerate()
                        .map(|(index, value)| (index as f64, *value))
                        .filter(|(_, y)| y.is_finite() && *y > 0.0)
                        .collect();
                    (name, points)
                })
            })
            .collect();
        (series, "percentile", true)
    };
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|(_, points)| points.clone())
        .collect();
    let slo = report.settings.slo_us;
    let x_max = all.iter().map(|(x, _)| *x).fold(0.0, f64::max);
    let mut y_min = all.iter().map(|(_, y)| *y).fold(f64::INFINITY, f64::min);
    let mut y_max = all.iter().map(|(_, y)| *y).fold(0.0, f64::max);
    if report.profile.is_sweep() {
        y_min = y_min.min(slo);
        y_max = y_max.max(slo);
    }
    if !y_min.is_finite() || y_max <= 0.0 {
        y_min = 1.0;
        y_max = 10.0;
    }
    let x_range = if percentile_axis {
        -0.2..3.2
    } else {
        0.0..(x_max * 1.05).max(1.0)
    };
    let y_range = (y_min * 0.8).max(0.1)..(y_max * 1.25);
    let title = format!(
        "lamina bench {} — p99 latency{}",
        profile_name(report.profile),
        if percentile_axis {
            " percentiles"
        } else {
            " vs load"
        }
    );
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x_range, y_range.log_scale())
        .map_err(|error| error.to_string())?;
    let percentile_names = ["p50", "p90", "p99", "p99.9"];
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("latency (µs, log)")
        .x_labels(if percentile_axis { 4 } else { 10 })
        .x_label_formatter(&|x| {
            if percentile_axis {
                let index = x.round();
                if (x - index).abs() < 0.01 && (0.0..4.0).contains(&index) {
                    percentile_names[index as usize].to_owned()
                } else {
                    String::new()
                }
            } else {
                crate::report::format_number(*x)
            }
        })
        .y_label_formatter(&|y| crate::report::format_number(*y))
        .draw()
        .map_err(|error| error.to_string())?;
    for (index, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|error| error.to_string())?
            .label(name.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .iter()
                    .map(|point| Circle::new(*point, 4, color.filled())),
            )
            .map_err(|error| error.to_string())?;
    }
    if report.profile.is_sweep() && x_max > 0.0 {
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, slo), (x_max * 1.05, slo)],
                BLACK.mix(0.5).stroke_width(1),
            ))
            .map_err(|error| error.to_string())?
            .label(format!(
                "p99 objective {} µs",
                crate::report::format_number(slo)
            ))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.5)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|error| error.to_string())?;
    Ok(())
}

/// Draws the median IOPS of every case of `lamina bench snapshots` as horizontal bars,
/// one per server and case, colored by server (`.svg` or `.png`).
pub fn draw_bars(report: &crate::snapshots::SnapshotsReport, path: &Path) -> Result<(), PlotError> {
    if report.cases.is_empty() {
        return Err(PlotError::Empty);
    }
    render(&Bars(report), path, (PLOT_WIDTH_PIXELS, PLOT_HEIGHT_PIXELS))
}

fn draw_bars_on<DB: DrawingBackend>(
    report: &crate::snapshots::SnapshotsReport,
    root: &DrawingArea<DB, Shift>,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|error| error.to_string())?;
    // Cases grouped by kind so that the servers' bars of one case sit together.
    let mut rows: Vec<&crate::snapshots::CaseResult> = Vec::new();
    for case in &report.cases {
        if rows.iter().any(|row| row.case == case.case) {
            continue;
        }
        rows.extend(report.cases.iter().filter(|other| other.case == case.case));
    }
    let mut servers: Vec<&str> = Vec::new();
    for row in &rows {
        if !servers.contains(&row.server.as_str()) {
            servers.push(&row.server);
        }
    }
    let labels: Vec<String> = rows
        .iter()
        .map(|row| format!("{} — {}", row.case.label(), row.server))
        .collect();
    let x_max = rows
        .iter()
        .map(|row| row.median_iops)
        .filter(|iops| iops.is_finite())
        .fold(0.0, f64::max)
        .max(1.0);
    let count = rows.len();
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!(
                "lamina bench snapshots — median 4 KiB IOPS, QD{}",
                report.settings.iodepth
            ),
            ("sans-serif", 24),
        )
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(300)
        .build_cartesian_2d(0.0..x_max * 1.15, -0.6..(count as f64 - 0.4))
        .map_err(|error| error.to_string())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("IOPS (median)")
        .y_labels(count)
        .y_label_style(("sans-serif", 15))
        .y_label_formatter(&|y| {
            // Row i is drawn at y = count - 1 - i, so the first case is on top.
            let index = y.round();
            if (y - index).abs() < 0.01 && (0.0..count as f64).contains(&index) {
                labels[count - 1 - index as usize].clone()
            } else {
                String::new()
            }
        })
        .x_label_formatter(&|x| crate::report::format_number(*x))
        .draw()
        .map_err(|error| error.to_string())?;
    for (server_index, server) in servers.iter().enumerate() {
        let color = Palette99::pick(server_index).to_rgba();
        let bars: Vec<(f64, f64)> = rows
            .iter()
            .enumerate()
            .filter(|(_, row)| row.server == *server && row.median_iops.is_finite())
            .map(|(index, row)| ((count - 1 - index) as f64, row.median_iops))
            .collect();
        chart
            .draw_series(bars.iter().map(|(y, iops)| {
                Rectangle::new([(0.0, y - 0.35), (*iops, y + 0.35)], color.filled())
            }))
            .map_err(|error| error.to_string())?
            .label((*server).to_owned())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 20, y + 5)], color.filled()));
        chart
            .draw_series(bars.iter().map(|(y, iops)| {
                Text::new(
                    crate::report::format_number(*iops),
                    (*iops + x_max * 0.01, *y + 0.15),
                    ("sans-serif", 14),
                )
            }))
            .map_err(|error| error.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(|error| error.to_string())?;
    Ok(())
}

/// Height of the tiers plot: two curve panels above the reaction timeline.
const TIERS_PLOT_HEIGHT_PIXELS: u32 = 960;

/// Draws `lamina bench tiers`: p99 against achieved IOPS (both log scales) for the
/// working set smaller than flash and the one larger, one curve per pool, and below
/// them the reaction's p99 per sliding window over time with its bound (`.svg` or
/// `.png`).
pub fn draw_tiers(report: &crate::tiers::TiersReport, path: &Path) -> Result<(), PlotError> {
    if report.curves.is_empty() {
        return Err(PlotError::Empty);
    }
    render(
        &Tiers(report),
        path,
        (PLOT_WIDTH_PIXELS, TIERS_PLOT_HEIGHT_PIXELS),
    )
}

fn draw_tiers_on<DB: DrawingBackend>(
    report: &crate::tiers::TiersReport,
    root: &DrawingArea<DB, Shift>,
) -> Result<(), String> {
    use crate::tiers::{TierConfig, WorkingSet};
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
    let configs = [
        TierConfig::AllFlash,
        TierConfig::FlashDisk,
        TierConfig::Disk,
    ];
    for (panel, working_set) in panels.iter().zip([WorkingSet::Small, WorkingSet::Large]) {
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
            .x_label_formatter(&|x| crate::report::format_number(*x))
            .y_label_formatter(&|y| crate::report::format_number(*y))
            .draw()
            .map_err(|error| error.to_string())?;
        for (index, config) in configs.iter().enumerate() {
            let points = series_of(*config, working_set);
            if points.is_empty() {
                continue;
            }
            let color = Palette99::pick(index).to_rgba();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(|error| error.to_string())?
                .label(config.name())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|point| Circle::new(*point, 3, color.filled())),
                )
                .map_err(|error| error.to_string())?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(|error| error.to_string())?;
    }
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
    let latency_min = windows
        .iter()
        .map(|(_, p99)| *p99)
        .fold(reaction.reference_p99_us, f64::min)
        .max(0.1);
    let latency_max = windows
        .iter()
        .map(|(_, p99)| *p99)
        .fold(reaction.bound_p99_us, f64::max);
    let title = format!(
        "reaction: demoted {} MiB volume read at {}/s (flash+disk); settled {}",
        reaction.working_set_bytes >> 20,
        reaction.rate_iops,
        reaction
            .settled_seconds
            .map_or("never".to_owned(), |seconds| format!("at {seconds:.1} s")),
    );
    let mut chart = ChartBuilder::on(&bottom)
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
        .y_label_formatter(&|y| crate::report::format_number(*y))
        .draw()
        .map_err(|error| error.to_string())?;
    let color = Palette99::pick(1).to_rgba();
    chart
        .draw_series(LineSeries::new(windows, color.stroke_width(2)))
        .map_err(|error| error.to_string())?
        .label("flash+disk p99, sliding 1 s windows")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    for (value, label, style) in [
        (
            reaction.bound_p99_us,
            format!(
                "bound: {} x all-flash p99",
                crate::tiers::REACTION_BOUND_FACTOR
            ),
            BLACK.mix(0.6).stroke_width(1),
        ),
        (
            reaction.reference_p99_us,
            "all-flash p99".to_owned(),
            Palette99::pick(0).to_rgba().stroke_width(1),
        ),
    ] {
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, value), (time_max * 1.02, value)],
                style,
            ))
            .map_err(|error| error.to_string())?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|error| error.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{ServerResult, compute_figures};
    use crate::workload::tests::sample_point;
    use crate::workload::{Mix, Settings, headline};

    fn report(profile: Profile) -> Report {
        let make = |server: &str, scale: f64| {
            let points = vec![
                sample_point(1000.0 * scale, 150.0, false),
                sample_point(2000.0 * scale, 300.0, false),
                sample_point(3000.0 * scale, 4000.0, true),
            ];
            ServerResult {
                server: server.into(),
                uri: String::new(),
                notes: vec![],
                headline: Some(headline(&points, 1000.0)),
                points: if profile.is_sweep() {
                    points
                } else {
                    points[..1].to_vec()
                },
                figures: vec![],
            }
        };
        let mut servers = vec![make("lamina", 1.0), make("nbdkit", 0.7)];
        let reference = compute_figures(profile, &mut servers);
        Report {
            profile,
            settings: Settings {
                runtime_seconds: 1,
                ramp_seconds: 0,
                region_bytes: 1 << 20,
                iodepth: 32,
                jobs: 1,
                max_jobs: 2,
                mix: Mix::Oltp,
                rate_jobs: 2,
                rate_iodepth: 64,
                rate_targets: None,
                slo_us: 1000.0,
            },
            fio_version: "fio-3.33".into(),
            reference,
            servers,
            skipped: vec![],
        }
    }

    #[test]
    fn sweep_svg_has_one_curve_per_server_and_the_objective() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("sweep.svg");
        draw(&report(Profile::RateSweep), &path).expect("draws");
        let svg = std::fs::read_to_string(&path).expect("reads");
        assert!(svg.starts_with("<svg"));
        let has_text = |text: &str| svg.lines().any(|line| line.trim() == text);
        assert!(has_text("lamina") && has_text("nbdkit"), "legend names");
        assert!(svg.contains("p99 objective"));
        assert!(svg.matches("<polyline").count() >= 3);
    }

    #[test]
    fn single_point_png_is_a_png() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("oltp.png");
        draw(&report(Profile::Oltp), &path).expect("draws");
        let bytes = std::fs::read(&path).expect("reads");
        assert!(bytes.starts_with(b"\x89PNG"));
        let svg_path = directory.path().join("oltp.svg");
        draw(&report(Profile::Oltp), &svg_path).expect("draws");
        assert!(
            std::fs::read_to_string(&svg_path)
                .expect("reads")
                .contains("p99.9")
        );
    }

    #[test]
    fn snapshot_bars_name_every_case_and_server() {
        use crate::snapshots::{CaseKind, CaseResult, SnapshotsReport, SnapshotsSettings};
        let case = |server: &str, kind: CaseKind, iops: f64| {
            CaseResult::new(
                server,
                kind,
                "target".into(),
                vec![sample_point(iops, 100.0, false).measurement],
            )
        };
        let report = SnapshotsReport {
            settings: SnapshotsSettings {
                size_bytes: 1 << 20,
                runtime_seconds: 1,
                ramp_seconds: 0,
                iodepth: 32,
                repetitions: 1,
                snapshots: 100,
                chain_depth: 20,
                clone_write_bytes: 4096,
                pool_size_bytes: 1 << 30,
                memory_cache_bytes: None,
            },
            fio_version: "fio-3.33".into(),
            qemu_version: None,
            cases: vec![
                case("lamina", CaseKind::Write { snapshots: 0 }, 9000.0),
                case("lamina", CaseKind::ReadClone { depth: 20 }, 8000.0),
                case("qemu-nbd", CaseKind::Write { snapshots: 0 }, 3000.0),
            ],
            timings: vec![],
            comparisons: vec![],
            notes: vec![],
            skipped: vec![],
            load_average_start: None,
            load_average_end: None,
        };
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("bars.svg");
        draw_bars(&report, &path).expect("draws");
        let svg = std::fs::read_to_string(&path).expect("reads");
        assert!(svg.contains("randwrite, 0 snapshots — lamina"));
        assert!(svg.contains("randwrite, 0 snapshots — qemu-nbd"));
        assert!(svg.contains("randread, clone depth 20 — lamina"));
        assert!(svg.contains("9,000") && svg.contains("3,000"));
        assert!(svg.matches("<rect").count() >= 3);
    }

    #[test]
    fn unknown_extensions_are_refused() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("plot.gif");
        assert!(matches!(
            draw(&report(Profile::Oltp), &path),
            Err(PlotError::UnknownFormat(_))
        ));
    }
}
