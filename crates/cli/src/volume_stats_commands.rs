//! `lamina volume stats VOL [--watch]` and `lamina top`: the daemon's live
//! per-volume NBD statistics (IOPS, MB/s and latency percentiles), read from
//! the admin API's `volume_io` operation. The daemon keeps cumulative counters
//! and histograms; these commands take the difference between two readings,
//! so every line covers exactly one interval.

use std::io::IsTerminal;
use std::time::Duration;

use clap::Args;
use lamina_api::VolumeTierStats;
use lamina_control::admin::Operation;
use lamina_control::client::run_operation;
use lamina_control::volume_statistics::{VolumeIo, percentile_us};
use lamina_nbd::statistics::OperationSnapshot;
use serde::Serialize;

use crate::DataArgs;

/// The interval of `--watch` and `top` unless given.
const WATCH_INTERVAL_MS_DEFAULT: u64 = 1000;
/// The shortest interval accepted: shorter ones measure mostly noise.
const WATCH_INTERVAL_MS_MIN: u64 = 100;

#[derive(Args)]
pub struct WatchArgs {
    /// Print the volume's I/O once per interval until interrupted.
    #[arg(long)]
    pub watch: bool,
    /// The interval of --watch, in milliseconds.
    #[arg(long, default_value_t = WATCH_INTERVAL_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(WATCH_INTERVAL_MS_MIN..))]
    pub interval_ms: u64,
    /// Stop after this many intervals (0: never).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
}

#[derive(Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub data: DataArgs,
    /// The refresh interval, in milliseconds.
    #[arg(long, default_value_t = WATCH_INTERVAL_MS_DEFAULT, value_parser = clap::value_parser!(u64).range(WATCH_INTERVAL_MS_MIN..))]
    pub interval_ms: u64,
    /// Stop after this many intervals (0: never).
    #[arg(long, default_value_t = 0)]
    pub count: u64,
    /// Volumes shown, busiest first.
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// One JSON document per interval instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// One volume's I/O over one interval.
#[derive(Debug, Serialize)]
pub struct IntervalFigures {
    pub volume: String,
    pub interval_seconds: f64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_megabytes_per_second: f64,
    pub write_megabytes_per_second: f64,
    pub read_latency_us: Percentiles,
    pub write_latency_us: Percentiles,
}

/// Latency percentiles in microseconds (none without requests or histograms).
#[derive(Debug, Serialize)]
pub struct Percentiles {
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub p99_9: Option<f64>,
}

impl Percentiles {
    fn of(snapshot: &OperationSnapshot) -> Self {
        Self {
            p50: percentile_us(snapshot, 0.5),
            p99: percentile_us(snapshot, 0.99),
            p99_9: percentile_us(snapshot, 0.999),
        }
    }

    fn text(&self) -> String {
        let one = |value: Option<f64>| value.map_or("-".to_string(), |us| format!("{us:.0}"));
        format!("{}/{}/{}", one(self.p50), one(self.p99), one(self.p99_9))
    }
}

fn interval_figures(now: &VolumeIo, before: Option<&VolumeIo>, seconds: f64) -> IntervalFigures {
    let (reads, writes) = match before {
        Some(before) => (
            now.reads.snapshot().since(&before.reads.snapshot()),
            now.writes.snapshot().since(&before.writes.snapshot()),
        ),
        None => (now.reads.snapshot(), now.writes.snapshot()),
    };
    let seconds = seconds.max(1e-3);
    IntervalFigures {
        volume: now.volume.clone(),
        interval_seconds: seconds,
        read_iops: reads.requests as f64 / seconds,
        write_iops: writes.requests as f64 / seconds,
        read_megabytes_per_second: reads.bytes as f64 / seconds / 1e6,
        write_megabytes_per_second: writes.bytes as f64 / seconds / 1e6,
        read_latency_us: Percentiles::of(&reads),
        write_latency_us: Percentiles::of(&writes),
    }
}

async fn volume_io(data: &DataArgs, name: Option<String>) -> anyhow::Result<Vec<VolumeIo>> {
    let answer = run_operation(&data.data_dir, Operation::VolumeIo { name }).await?;
    Ok(Vec::<VolumeIo>::try_from(answer)?)
}

/// `lamina volume stats`: the tier statistics and, while a daemon runs, the
/// I/O since it started; with `--watch`, one line of I/O per interval.
pub async fn volume_stats(
    name: String,
    data: DataArgs,
    json: bool,
    watch: WatchArgs,
) -> anyhow::Result<()> {
    if watch.watch {
        return watch_volume(name, data, json, watch).await;
    }
    let tiers = run_operation(
        &data.data_dir,
        Operation::VolumeStats { name: name.clone() },
    )
    .await?;
    let io = volume_io(&data, Some(name)).await?.into_iter().next();
    if json {
        let mut document = tiers.to_json_value();
        // Since the daemon started; null without a daemon.
        document["io"] = match &io {
            Some(io) => serde_json::json!({
                "totals": io,
                "read_latency_us": Percentiles::of(&io.reads.snapshot()),
                "write_latency_us": Percentiles::of(&io.writes.snapshot()),
            }),
            None => serde_json::Value::Null,
        };
        println!("{}", serde_json::to_string_pretty(&document)?);
        return Ok(());
    }
    let tiers = VolumeTierStats::try_from(tiers)?;
    crate::print_volume_stats(&tiers);
    match io {
        Some(io) if io.reads.requests + io.writes.requests > 0 || io.latency_histograms => {
            let totals = interval_figures(&io, None, 1.0);
            println!(
                "reads (NBD)          {} requests, {}",
                io.reads.requests,
                lamina_control::size::format_size(io.reads.bytes)
            );
            println!(
                "writes (NBD)         {} requests, {}",
                io.writes.requests,
                lamina_control::size::format_size(io.writes.bytes)
            );
            println!(
                "read latency         p50/p99/p99.9 {} µs",
                totals.read_latency_us.text()
            );
            println!(
                "write latency        p50/p99/p99.9 {} µs",
                totals.write_latency_us.text()
            );
        }
        _ => {
            println!("NBD I/O              none counted (no daemon, or no client since it started)")
        }
    }
    Ok(())
}

/// The header of `watch_line`'s columns (the same widths).
fn watch_header() -> String {
    format!(
        "{:<8} {:>8} {:>8} {:>10} {:>10}  {:>22}  {:>23}",
        "time",
        "read/s",
        "write/s",
        "read MB/s",
        "write MB/s",
        "read µs p50/p99/p99.9",
        "write µs p50/p99/p99.9"
    )
}

fn watch_line(figures: &IntervalFigures) -> String {
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
        % 86_400;
    format!(
        "{:02}:{:02}:{:02} {:>8.0} {:>8.0} {:>10.2} {:>10.2}  {:>22}  {:>23}",
        clock / 3600,
        clock / 60 % 60,
        clock % 60,
        figures.read_iops,
        figures.write_iops,
        figures.read_megabytes_per_second,
        figures.write_megabytes_per_second,
        figures.read_latency_us.text(),
        figures.write_latency_us.text()
    )
}

async fn watch_volume(
    name: String,
    data: DataArgs,
    json: bool,
    watch: WatchArgs,
) -> anyhow::Result<()> {
    let mut previous = volume_io(&data, Some(name.clone())).await?;
    let mut last = std::time::Instant::now();
    if !json {
        println!("{}", watch_header());
    }
    let mut printed = 0u64;
    while watch.count == 0 || printed < watch.count {
        tokio::time::sleep(Duration::from_millis(watch.interval_ms)).await;
        let now = volume_io(&data, Some(name.clone())).await?;
        let seconds = last.elapsed().as_secs_f64();
        last = std::time::Instant::now();
        let (Some(current), Some(before)) = (now.first(), previous.first()) else {
            anyhow::bail!("no statistics for volume {name}");
        };
        let figures = interval_figures(current, Some(before), seconds);
        if json {
            println!("{}", serde_json::to_string(&figures)?);
        } else {
            println!("{}", watch_line(&figures));
        }
        previous = now;
        printed += 1;
    }
    Ok(())
}

/// `lamina top`: the busiest volumes by IOPS, refreshed every interval.
pub async fn top(arguments: TopArgs) -> anyhow::Result<()> {
    let mut previous = volume_io(&arguments.data, None).await?;
    let mut last = std::time::Instant::now();
    let terminal = std::io::stdout().is_terminal();
    let mut printed = 0u64;
    while arguments.count == 0 || printed < arguments.count {
        tokio::time::sleep(Duration::from_millis(arguments.interval_ms)).await;
        let now = volume_io(&arguments.data, None).await?;
        let seconds = last.elapsed().as_secs_f64();
        last = std::time::Instant::now();
        let mut rows: Vec<IntervalFigures> = now
            .iter()
            .map(|volume| {
                let before = previous
                    .iter()
                    .find(|earlier| earlier.volume == volume.volume);
                interval_figures(volume, before, seconds)
            })
            .collect();
        rows.sort_by(|a, b| {
            (b.read_iops + b.write_iops)
                .total_cmp(&(a.read_iops + a.write_iops))
                .then_with(|| a.volume.cmp(&b.volume))
        });
        rows.truncate(arguments.limit);
        if arguments.json {
            println!("{}", serde_json::to_string(&rows)?);
        } else {
            if terminal {
                // Clear the screen and go home, as top does.
                print!("\x1b[2J\x1b[H");
            }
            // The time column gives way to the volume's name.
            println!("{:<24} {}", "volume", &watch_header()[9..]);
            for row in &rows {
                println!("{:<24} {}", row.volume, &watch_line(row)[9..]);
            }
            println!();
        }
        previous = now;
        printed += 1;
    }
    Ok(())
}
