//! The plot of `lamina bench snapshots` ([`SnapshotsReport`]): the median IOPS of
//! every case as horizontal bars, one per server and case, colored by server.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::convert::saturating_usize;
use crate::plot::{Chart, draw_legend};
use crate::report::format_number;
use crate::snapshots::{CaseResult, SnapshotsReport};

impl Chart for SnapshotsReport {
    fn is_empty(&self) -> bool {
        self.cases.is_empty()
    }

    fn draw_on<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        draw_bars(self, root)
    }
}

fn draw_bars<DB: DrawingBackend>(
    report: &SnapshotsReport,
    root: &DrawingArea<DB, Shift>,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(|error| error.to_string())?;
    // Cases grouped by kind so that the servers' bars of one case sit together.
    let mut rows: Vec<&CaseResult> = Vec::new();
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
                labels[count - 1 - saturating_usize(index)].clone()
            } else {
                String::new()
            }
        })
        .x_label_formatter(&|x| format_number(*x))
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
                    format_number(*iops),
                    (*iops + x_max * 0.01, *y + 0.15),
                    ("sans-serif", 14),
                )
            }))
            .map_err(|error| error.to_string())?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::plot::render;
    use crate::snapshots::{CaseKind, CaseResult, SnapshotsReport, SnapshotsSettings};
    use crate::workload::tests::sample_point;

    #[test]
    fn snapshot_bars_name_every_case_and_server() {
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
            run: crate::report::RunNotes::default(),
        };
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("bars.svg");
        render(&report, &path).expect("draws");
        let svg = std::fs::read_to_string(&path).expect("reads");
        assert!(svg.contains("randwrite, 0 snapshots — lamina"));
        assert!(svg.contains("randwrite, 0 snapshots — qemu-nbd"));
        assert!(svg.contains("randread, clone depth 20 — lamina"));
        assert!(svg.contains("9,000") && svg.contains("3,000"));
        assert!(svg.matches("<rect").count() >= 3);
    }
}
