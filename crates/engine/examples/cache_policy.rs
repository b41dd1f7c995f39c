//! Measures the flash cache's candidate admission/eviction policies (issue 7): hit
//! ratio against cache size for LRU, S3-FIFO and W-TinyLFU on a Zipf(0.99) trace
//! and on the same trace polluted by one-pass sequential scans. Prints a table,
//! and writes the figures as JSON and a plot as SVG, for BENCHMARKS.md and
//! `docs/decisions/0004-cache-admission-policy.md`.
//!
//! `cargo run --release -p lamina-engine --example cache_policy -- [--keys N]
//! [--requests N] [--requests-between-scans N] [--scan-percent P] [--json PATH]
//! [--svg PATH]`
//!
//! Defaults: 100,000 Zipf keys, 2,000,000 requests per run of which the first
//! 200,000 warm the cache and are not counted; scans of 25,000 never-reused keys
//! (larger than every cache size measured) after every 100,000 Zipf requests, so
//! scans are 20% of the polluted trace. Every run uses the same seeds, so the
//! figures repeat exactly.

use std::path::PathBuf;
use std::sync::OnceLock;

use lamina_engine::tier::policy::{POLICY_NAMES, ScanPollutedZipfKeys, ZipfKeys, policy_by_name};
use plotters::prelude::*;

/// Cache sizes measured, in percent of the Zipf key count.
const CACHE_PERCENTS: [f64; 5] = [1.0, 2.0, 5.0, 10.0, 20.0];
const ZIPF_THETA: f64 = 0.99;
const TRACE_SEED: u64 = 42;
/// One colour per policy, in the order of `POLICY_NAMES`.
const POLICY_COLORS: [RGBColor; 4] = [
    RGBColor(200, 30, 30),
    RGBColor(20, 80, 200),
    RGBColor(20, 150, 60),
    RGBColor(230, 140, 0),
];
/// Fonts tried for the plot's text (package fonts-dejavu-core).
const FONT_CANDIDATES: [&str; 2] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

struct Settings {
    key_count: u64,
    requests: u64,
    /// Scans come after this many Zipf requests...
    requests_between_scans: u64,
    /// ...and are this share of the key count long, in percent.
    scan_length_percent: u64,
    warmup_requests: u64,
    json_path: PathBuf,
    svg_path: PathBuf,
}

fn parse_arguments() -> Settings {
    let mut settings = Settings {
        key_count: 100_000,
        requests: 2_000_000,
        requests_between_scans: 100_000,
        scan_length_percent: 25,
        warmup_requests: 0,
        json_path: PathBuf::from("docs/benchmarks/cache-policy.json"),
        svg_path: PathBuf::from("docs/benchmarks/cache-policy.svg"),
    };
    let mut arguments = std::env::args().skip(1);
    while let Some(flag) = arguments.next() {
        let value = arguments
            .next()
            .unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--keys" => settings.key_count = value.parse().expect("--keys takes a number"),
            "--requests" => settings.requests = value.parse().expect("--requests takes a number"),
            "--requests-between-scans" => {
                settings.requests_between_scans = value
                    .parse()
                    .expect("--requests-between-scans takes a number")
            }
            "--scan-percent" => {
                settings.scan_length_percent = value.parse().expect("--scan-percent takes a number")
            }
            "--json" => settings.json_path = PathBuf::from(value),
            "--svg" => settings.svg_path = PathBuf::from(value),
            _ => panic!(
                "unknown flag {flag}: use --keys, --requests, --requests-between-scans, --scan-percent, --json or --svg"
            ),
        }
    }
    settings.warmup_requests = settings.requests / 10;
    settings
}

#[derive(serde::Serialize)]
struct Point {
    trace: &'static str,
    policy: &'static str,
    cache_percent: f64,
    capacity_entries: usize,
    /// Hits per counted request, scans included.
    hit_ratio: f64,
    /// Hits per counted Zipf request (scan requests, which can never hit, left out).
    zipf_hit_ratio: f64,
}

/// Runs one policy over one trace, counting all hits and Zipf-only hits after
/// the warm-up.
fn run(
    policy_name: &'static str,
    capacity_entries: usize,
    trace: impl Iterator<Item = u64>,
    settings: &Settings,
) -> (f64, f64) {
    let mut policy = policy_by_name(policy_name, capacity_entries).expect("known policy");
    let mut evicted = Vec::new();
    let (mut requests, mut hits, mut zipf_requests, mut zipf_hits) = (0u64, 0u64, 0u64, 0u64);
    for (position, key) in trace.take(settings.requests as usize).enumerate() {
        let hit = policy.access(key);
        if !hit {
            policy.insert(key, &mut evicted);
            evicted.clear();
        }
        if position as u64 >= settings.warmup_requests {
            requests += 1;
            hits += u64::from(hit);
            if key < settings.key_count {
                zipf_requests += 1;
                zipf_hits += u64::from(hit);
            }
        }
    }
    (
        hits as f64 / requests.max(1) as f64,
        zipf_hits as f64 / zipf_requests.max(1) as f64,
    )
}

fn register_font() {
    static REGISTERED: OnceLock<()> = OnceLock::new();
    REGISTERED.get_or_init(|| {
        for candidate in FONT_CANDIDATES {
            if let Ok(bytes) = std::fs::read(candidate) {
                // The registry keeps `&'static` font data; one font is leaked on purpose.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                    return;
                }
            }
        }
        panic!("the plot needs a TrueType font: install fonts-dejavu-core");
    });
}

fn draw(points: &[Point], settings: &Settings) -> Result<(), Box<dyn std::error::Error>> {
    register_font();
    let root = SVGBackend::new(&settings.svg_path, (1200, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((1, 2));
    let scan_note = format!(
        ", scans of {}% every {} requests",
        settings.scan_length_percent, settings.requests_between_scans
    );
    for (panel, trace) in panels.iter().zip(["zipf", "scan-polluted zipf"]) {
        let note = if trace == "zipf" {
            ""
        } else {
            scan_note.as_str()
        };
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "{trace} θ = {ZIPF_THETA}, {} keys{note}",
                    settings.key_count
                ),
                ("sans-serif", 18),
            )
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(60)
            .build_cartesian_2d((0.8f64..25.0f64).log_scale(), 0.0f64..100.0f64)?;
        chart
            .configure_mesh()
            .x_desc("cache size (% of keys, log)")
            .y_desc("hit ratio (%)")
            .light_line_style(WHITE)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()?;
        for (policy, color) in POLICY_NAMES.iter().zip(POLICY_COLORS) {
            let series: Vec<(f64, f64)> = points
                .iter()
                .filter(|point| point.trace == trace && point.policy == *policy)
                .map(|point| (point.cache_percent, point.hit_ratio * 100.0))
                .collect();
            chart
                .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
                .label(*policy)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(
                series
                    .iter()
                    .map(|point| Circle::new(*point, 4, color.filled())),
            )?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let settings = parse_arguments();
    let scan_length_keys = settings.key_count * settings.scan_length_percent / 100;
    let mut points = Vec::new();
    print!("{:<20} {:>7} {:>9}", "trace", "flash %", "entries");
    for policy in POLICY_NAMES {
        print!(" {policy:>10} {:>10}", format!("{policy} zipf"));
    }
    println!();
    for trace in ["zipf", "scan-polluted zipf"] {
        for cache_percent in CACHE_PERCENTS {
            let capacity_entries = (settings.key_count as f64 * cache_percent / 100.0) as usize;
            let mut row = Vec::new();
            for policy in POLICY_NAMES {
                let zipf = ZipfKeys::new(settings.key_count, ZIPF_THETA, TRACE_SEED);
                let (hit_ratio, zipf_hit_ratio) = if trace == "zipf" {
                    run(policy, capacity_entries, zipf, &settings)
                } else {
                    let polluted = ScanPollutedZipfKeys::new(
                        zipf,
                        settings.requests_between_scans,
                        scan_length_keys,
                    );
                    run(policy, capacity_entries, polluted, &settings)
                };
                row.push((hit_ratio, zipf_hit_ratio));
                points.push(Point {
                    trace,
                    policy,
                    cache_percent,
                    capacity_entries,
                    hit_ratio,
                    zipf_hit_ratio,
                });
            }
            print!("{trace:<20} {cache_percent:>7} {capacity_entries:>9}");
            for (hit_ratio, zipf_hit_ratio) in row {
                print!(" {:>9.2}% {:>9.2}%", hit_ratio * 100.0, zipf_hit_ratio * 100.0);
            }
            println!();
        }
    }
    let report = serde_json::json!({
        "command": format!(
            "cargo run --release -p lamina-engine --example cache_policy -- {}",
            std::env::args().skip(1).collect::<Vec<_>>().join(" ")
        ),
        "zipf_theta": ZIPF_THETA,
        "key_count": settings.key_count,
        "requests_per_run": settings.requests,
        "warmup_requests": settings.warmup_requests,
        "requests_between_scans": settings.requests_between_scans,
        "scan_length_keys": scan_length_keys,
        "trace_seed": TRACE_SEED,
        "points": points,
    });
    std::fs::write(
        &settings.json_path,
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    draw(&points, &settings)?;
    println!(
        "wrote {} and {}",
        settings.json_path.display(),
        settings.svg_path.display()
    );
    Ok(())
}
