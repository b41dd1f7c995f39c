//! Measures the flash cache's admission/eviction policies (issue 7): hit ratio
//! against flash size for LRU, S3-FIFO, W-TinyLFU and the engine's own
//! placement (`lamina_model::cache::HeatPolicy`: the log FIFO driven by the
//! engine's `tier::heat`) on a Zipf(0.99) trace and on the same trace
//! polluted by one-pass sequential scans, beside the bound of the most popular keys held statically. Prints a
//! table (hit ratio of all requests, then of Zipf requests only, per policy;
//! and the engine policy's flash writes per request), and writes the figures
//! as JSON and a plot as SVG, for BENCHMARKS.md and
//! `docs/decisions/0004-cache-admission-policy.md`.
//!
//! `cargo run --release -p lamina-model --example cache_policy -- [--keys N]
//! [--requests N] [--requests-between-scans N] [--scan-percent P]
//! [--policies lru,s3-fifo,w-tinylfu,heat] [--json PATH] [--svg PATH]`
//!
//! Defaults: 100,000 Zipf keys, 2,000,000 requests per run of which the first
//! 200,000 warm the cache and are not counted; scans of 25,000 never-reused keys
//! (larger than every flash size measured) after every 100,000 Zipf requests, so
//! scans are 20% of the polluted trace. Every run uses the same seeds, so the
//! figures repeat exactly.

use std::path::PathBuf;
use std::sync::OnceLock;

use lamina_model::cache::{CachePolicy, HeatPolicy, POLICY_NAMES, policy_by_name};
use lamina_model::zipf::{ScanPollutedZipfKeys, ZipfKeys};
use plotters::prelude::*;

/// Cache sizes measured, in percent of the Zipf key count.
const CACHE_PERCENTS: [f64; 5] = [1.0, 2.0, 5.0, 10.0, 20.0];
const ZIPF_THETA: f64 = 0.99;
/// The name under which [`top_keys_bound`] is reported beside the policies.
const TOP_KEYS_BOUND: &str = "top-keys bound";
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
    /// Policies measured, in the order of `POLICY_NAMES` by default.
    policies: Vec<&'static str>,
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
        policies: POLICY_NAMES.to_vec(),
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
            "--policies" => {
                settings.policies = value
                    .split(',')
                    .map(|name| {
                        *POLICY_NAMES
                            .iter()
                            .find(|known| **known == name)
                            .unwrap_or_else(|| {
                                panic!("unknown policy {name}: use {POLICY_NAMES:?}")
                            })
                    })
                    .collect()
            }
            "--json" => settings.json_path = PathBuf::from(value),
            "--svg" => settings.svg_path = PathBuf::from(value),
            _ => panic!(
                "unknown flag {flag}: use --keys, --requests, --requests-between-scans, --scan-percent, --policies, --json or --svg"
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
    /// Flash writes per counted request (the engine's policy only).
    #[serde(skip_serializing_if = "Option::is_none")]
    flash_writes_per_request: Option<f64>,
}

/// What one run measured (after the warm-up).
struct Outcome {
    /// Hits per request, scans included.
    hit_ratio: f64,
    /// Hits per Zipf request.
    zipf_hit_ratio: f64,
    /// Flash writes (promotions and relocations within flash) per request,
    /// for the engine's policy only.
    flash_writes_per_request: Option<f64>,
}

/// Runs one policy over one trace, counting all hits and Zipf-only hits after
/// the warm-up. The engine's policy also counts its flash writes.
fn run(
    policy_name: &'static str,
    capacity_entries: usize,
    trace: impl Iterator<Item = u64>,
    settings: &Settings,
) -> Outcome {
    if policy_name == "heat" {
        let mut policy = HeatPolicy::new(capacity_entries);
        let flash_writes = |policy: &HeatPolicy| policy.promoted_count() + policy.relocated_count();
        return drive(&mut policy, trace, settings, Some(&flash_writes));
    }
    let mut policy = policy_by_name(policy_name, capacity_entries).expect("known policy");
    drive(policy.as_mut(), trace, settings, None)
}

/// [`run`]'s loop: `hit` tells whether a key is resident.
fn drive<P: CachePolicy + ?Sized>(
    policy: &mut P,
    trace: impl Iterator<Item = u64>,
    settings: &Settings,
    flash_writes: Option<&dyn Fn(&P) -> u64>,
) -> Outcome {
    let mut evicted = Vec::new();
    let (mut requests, mut hits, mut zipf_requests, mut zipf_hits) = (0u64, 0u64, 0u64, 0u64);
    let mut writes_at_warmup = 0;
    for (position, key) in trace.take(request_count(settings.requests)).enumerate() {
        if position as u64 == settings.warmup_requests {
            writes_at_warmup = flash_writes.map_or(0, |writes| writes(policy));
        }
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
    Outcome {
        hit_ratio: hits as f64 / requests.max(1) as f64,
        zipf_hit_ratio: zipf_hits as f64 / zipf_requests.max(1) as f64,
        flash_writes_per_request: flash_writes
            .map(|writes| (writes(policy) - writes_at_warmup) as f64 / requests.max(1) as f64),
    }
}

/// A policy's run, or the bound.
fn measure(
    policy_name: &'static str,
    capacity_entries: usize,
    trace: impl Iterator<Item = u64>,
    settings: &Settings,
) -> Outcome {
    if policy_name == TOP_KEYS_BOUND {
        top_keys_bound(capacity_entries, trace, settings)
    } else {
        run(policy_name, capacity_entries, trace, settings)
    }
}

/// The bound no policy without knowledge of the future beats on average: the
/// `capacity_entries` most popular Zipf keys always resident (under
/// independent requests, the best a cache can hold). Keys 0.. are the most
/// popular; scan keys never hit.
fn top_keys_bound(
    capacity_entries: usize,
    trace: impl Iterator<Item = u64>,
    settings: &Settings,
) -> Outcome {
    let (mut requests, mut hits, mut zipf_requests) = (0u64, 0u64, 0u64);
    for key in trace
        .take(request_count(settings.requests))
        .skip(request_count(settings.warmup_requests))
    {
        requests += 1;
        hits += u64::from(key < capacity_entries as u64);
        zipf_requests += u64::from(key < settings.key_count);
    }
    Outcome {
        hit_ratio: hits as f64 / requests.max(1) as f64,
        zipf_hit_ratio: hits as f64 / zipf_requests.max(1) as f64,
        flash_writes_per_request: None,
    }
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
            .x_desc("flash (cache) size (% of keys, log)")
            .y_desc("hit ratio (%)")
            .light_line_style(WHITE)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .draw()?;
        let plotted = settings
            .policies
            .iter()
            .map(|policy| {
                let index = POLICY_NAMES.iter().position(|name| name == policy);
                (*policy, POLICY_COLORS[index.expect("a known policy")])
            })
            .chain(std::iter::once((TOP_KEYS_BOUND, RGBColor(140, 140, 140))));
        for (policy, color) in plotted {
            let series: Vec<(f64, f64)> = points
                .iter()
                .filter(|point| point.trace == trace && point.policy == policy)
                .map(|point| (point.cache_percent, point.hit_ratio * 100.0))
                .collect();
            chart
                .draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?
                .label(policy)
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

/// A request count from the command line as an iterator length: past the
/// address space it means "all of them".
fn request_count(requests: u64) -> usize {
    usize::try_from(requests).unwrap_or(usize::MAX)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let settings = parse_arguments();
    let scan_length_keys = settings.key_count * settings.scan_length_percent / 100;
    let mut points = Vec::new();
    print!("{:<20} {:>7} {:>9}", "trace", "flash %", "entries");
    for policy in settings.policies.iter().chain(&[TOP_KEYS_BOUND]) {
        print!(" {policy:>10} {:>10}", format!("{policy} zipf"));
    }
    println!(" {:>12}", "heat writes/request");
    for trace in ["zipf", "scan-polluted zipf"] {
        for cache_percent in CACHE_PERCENTS {
            // Rounded down; `as` saturates out of range.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let capacity_entries =
                (settings.key_count as f64 * cache_percent / 100.0).floor() as usize;
            let mut row = Vec::new();
            let mut flash_writes = None;
            let measured = settings
                .policies
                .iter()
                .copied()
                .chain(std::iter::once(TOP_KEYS_BOUND));
            for policy in measured {
                let zipf = ZipfKeys::new(settings.key_count, ZIPF_THETA, TRACE_SEED);
                let outcome = if trace == "zipf" {
                    measure(policy, capacity_entries, zipf, &settings)
                } else {
                    let polluted = ScanPollutedZipfKeys::new(
                        zipf,
                        settings.requests_between_scans,
                        scan_length_keys,
                    );
                    measure(policy, capacity_entries, polluted, &settings)
                };
                row.push((outcome.hit_ratio, outcome.zipf_hit_ratio));
                if let Some(writes) = outcome.flash_writes_per_request {
                    flash_writes = Some(writes);
                }
                points.push(Point {
                    trace,
                    policy,
                    cache_percent,
                    capacity_entries,
                    hit_ratio: outcome.hit_ratio,
                    zipf_hit_ratio: outcome.zipf_hit_ratio,
                    flash_writes_per_request: outcome.flash_writes_per_request,
                });
            }
            print!("{trace:<20} {cache_percent:>7} {capacity_entries:>9}");
            for (hit_ratio, zipf_hit_ratio) in row {
                print!(
                    " {:>9.2}% {:>9.2}%",
                    hit_ratio * 100.0,
                    zipf_hit_ratio * 100.0
                );
            }
            match flash_writes {
                Some(writes) => println!(" {writes:>12.4}"),
                None => println!(),
            }
        }
    }
    let report = serde_json::json!({
        "command": format!(
            "cargo run --release -p lamina-model --example cache_policy -- {}",
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
