//! The plot of `lamina bench run` and `compare` ([`Report`]). Sweeps draw p99
//! latency (log scale) against achieved IOPS, one curve per server, with the
//! latency objective as a horizontal line: the latency-versus-load curve.
//! Single-point profiles draw each server's latency percentiles (p50, p90, p99,
//! p99.9), one curve per server.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::convert::saturating_usize;
use crate::plot::{Chart, draw_curve, draw_legend, legend_line};
use crate::report::{Report, format_number};
use crate::workload::Profile;

impl Chart for Report {
    fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        draw_curves(self, root)
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

fn draw_curves<DB: DrawingBackend>(
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
                    percentile_names[saturating_usize(index)].to_owned()
                } else {
                    String::new()
                }
            } else {
                format_number(*x)
            }
        })
        .y_label_formatter(&|y| format_number(*y))
        .draw()
        .map_err(|error| error.to_string())?;
    for (index, (name, points)) in series.iter().enumerate() {
        draw_curve(
            &mut chart,
            points,
            Palette99::pick(index).to_rgba(),
            name,
            4,
        )?;
    }
    if report.profile.is_sweep() && x_max > 0.0 {
        chart
            .draw_series(LineSeries::new(
                vec![(0.0, slo), (x_max * 1.05, slo)],
                BLACK.mix(0.5).stroke_width(1),
            ))
            .map_err(|error| error.to_string())?
            .label(format!("p99 objective {} µs", format_number(slo)))
            .legend(|(x, y)| legend_line(x, y, BLACK.mix(0.5)));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::render;
    use crate::report::{ServerResult, compute_figures};
    use crate::workload::tests::{sample_point, settings};
    use crate::workload::{Settings, headline};

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
                region_bytes: 1 << 20,
                max_jobs: 2,
                rate_jobs: 2,
                ..settings()
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
        render(&report(Profile::RateSweep), &path).expect("draws");
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
        render(&report(Profile::Oltp), &path).expect("draws");
        let bytes = std::fs::read(&path).expect("reads");
        assert!(bytes.starts_with(b"\x89PNG"));
        let svg_path = directory.path().join("oltp.svg");
        render(&report(Profile::Oltp), &svg_path).expect("draws");
        assert!(
            std::fs::read_to_string(&svg_path)
                .expect("reads")
                .contains("p99.9")
        );
    }
}
