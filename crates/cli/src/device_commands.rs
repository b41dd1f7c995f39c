//! `lamina device list|fail|replace`: the devices of an array pool, through
//! the daemon while it runs or on the pool directly when it does not. A
//! replacement's rebuild is followed with a progress bar (`--wait`), and
//! `pool status` shows it as `rebuilding` with bytes done, rate and time left.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use lamina_api::{
    BackgroundBudgetStatus, BackgroundImpact, DeviceStatus, PoolStatus, RebuildKind, RebuildState,
    RebuildStatus, TierName,
};
use lamina_control::admin::{Answer, Operation, UnexpectedAnswer};
use lamina_control::client::{daemon_running, run_operation};
use lamina_control::size::format_size;

/// How often `--wait` asks the daemon for the rebuild's progress.
const REBUILD_POLL_INTERVAL_MS: u64 = 500;

#[derive(Args)]
pub struct DeviceData {
    /// The data directory holding the pool description and the daemon's sockets.
    #[arg(long = "data", default_value = "lamina-data", env = "LAMINA_DATA")]
    data_dir: PathBuf,
}

#[derive(Subcommand)]
pub enum DeviceCommand {
    /// Every device of the pool's arrays, with its state and counters.
    List {
        #[command(flatten)]
        data: DeviceData,
        #[arg(long)]
        json: bool,
    },
    /// Take a device out by hand, as if it had failed (its data is then
    /// reconstructed from the others).
    Fail {
        path: String,
        #[command(flatten)]
        data: DeviceData,
        #[arg(long)]
        json: bool,
    },
    /// Rebuild OLD's contents onto NEW, which then takes its place. While OLD
    /// works it stays in use until NEW is whole (no loss of redundancy).
    Replace {
        old: String,
        /// The new device, or PATH:SIZE to create a file of that size.
        new: String,
        /// Wait for the rebuild to finish, drawing a progress bar.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        data: DeviceData,
        #[arg(long)]
        json: bool,
    },
    /// Move a device's data onto the tier's other devices, then drop it
    /// from the array (refused when they lack the room). Waits, drawing a
    /// progress bar.
    Remove {
        path: String,
        #[command(flatten)]
        data: DeviceData,
        #[arg(long)]
        json: bool,
    },
    /// Add a device to a tier's array, into the slot of a removed device
    /// (or a lost one whose data was rebuilt onto the others): new
    /// segments are striped over it too.
    Add {
        /// The new device, or PATH:SIZE to create a file of that size.
        path: String,
        #[arg(long, value_enum)]
        tier: TierArgument,
        /// Then spread the data already stored over it (`device
        /// rebalance`), drawing a progress bar.
        #[arg(long)]
        rebalance: bool,
        #[command(flatten)]
        data: DeviceData,
        #[arg(long)]
        json: bool,
    },
    /// Spread the data stored over every device in use: segments laid out
    /// before a device was added move to segments striped over it too
    /// (waits, drawing a progress bar).
    Rebalance {
        #[command(flatten)]
        data: DeviceData,
        #[arg(long)]
        json: bool,
    },
    /// Rebuild onto distributed spare space now: the data a lost device held
    /// is striped again over the devices left (what `rebuild_automatic`
    /// does by itself).
    Rebuild {
        /// Wait for the rebuild to finish, drawing a progress bar.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        data: DeviceData,
        #[arg(long)]
        json: bool,
    },
}

/// The tier `device add` puts a device in.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum TierArgument {
    Flash,
    Capacity,
}

pub async fn run(command: DeviceCommand) -> anyhow::Result<()> {
    match command {
        DeviceCommand::List { data, json } => {
            let devices = list(&data).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&devices)?);
            } else {
                print_devices(&devices);
            }
            Ok(())
        }
        DeviceCommand::Fail { path, data, json } => {
            let answer =
                run_operation(&data.data_dir, Operation::DeviceFail { path: path.clone() }).await?;
            let devices: Vec<DeviceStatus> = parse(answer)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&devices)?);
            } else {
                println!("device {path} taken out");
                print_devices(&devices);
            }
            Ok(())
        }
        DeviceCommand::Replace {
            old,
            new,
            wait,
            data,
            json,
        } => replace(&data, old, new, wait, json).await,
        DeviceCommand::Remove { path, data, json } => remove(&data, path, json).await,
        DeviceCommand::Add {
            path,
            tier,
            rebalance: rebalance_after,
            data,
            json,
        } => {
            let tier = match tier {
                TierArgument::Flash => TierName::Flash,
                TierArgument::Capacity => TierName::Capacity,
            };
            let operation = Operation::DeviceAdd {
                path: path.clone(),
                tier,
            };
            let devices: Vec<DeviceStatus> =
                parse(run_operation(&data.data_dir, operation).await?)?;
            if json && !rebalance_after {
                println!("{}", serde_json::to_string_pretty(&devices)?);
            } else if !json {
                println!("device {path} added");
                print_devices(&devices);
            }
            match rebalance_after {
                true => rebalance(&data, json).await,
                false => Ok(()),
            }
        }
        DeviceCommand::Rebalance { data, json } => rebalance(&data, json).await,
        DeviceCommand::Rebuild { wait, data, json } => {
            let mut status: RebuildStatus =
                parse(run_operation(&data.data_dir, Operation::DeviceRebuild).await?)?;
            if wait && daemon_running(&data.data_dir).await {
                status = follow_rebuild(&data, json).await?;
            }
            finish_rebuild_report(&status, json, "rebuild")
        }
    }
}

/// `device remove`: the operation runs to its end; through the daemon a
/// progress bar follows it meanwhile.
async fn remove(data: &DeviceData, path: String, json: bool) -> anyhow::Result<()> {
    let operation = Operation::DeviceRemove { path: path.clone() };
    let data_dir = data.data_dir.clone();
    let through_daemon = daemon_running(&data.data_dir).await;
    let removal = tokio::spawn(async move { run_operation(&data_dir, operation).await });
    if through_daemon && !json {
        draw_progress_until(data, &removal).await;
    }
    let status: RebuildStatus = parse(removal.await.context("the removal task")??)?;
    finish_rebuild_report(&status, json, &format!("removing {path}"))
}

/// `device rebalance`: the operation runs to its end; through the daemon
/// a progress bar follows it meanwhile.
async fn rebalance(data: &DeviceData, json: bool) -> anyhow::Result<()> {
    let data_dir = data.data_dir.clone();
    let through_daemon = daemon_running(&data.data_dir).await;
    let running =
        tokio::spawn(async move { run_operation(&data_dir, Operation::DeviceRebalance).await });
    if through_daemon && !json {
        draw_progress_until(data, &running).await;
    }
    let status: RebuildStatus = parse(running.await.context("the rebalance task")??)?;
    finish_rebuild_report(&status, json, "rebalanced")
}

fn finish_rebuild_report(status: &RebuildStatus, json: bool, what: &str) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(status)?);
    } else {
        println!("{what}");
        print_rebuild(status);
    }
    match status.state {
        RebuildState::Failed => anyhow::bail!(
            "the rebuild failed: {}",
            status.error.clone().unwrap_or_default()
        ),
        _ => Ok(()),
    }
}

async fn list(data: &DeviceData) -> anyhow::Result<Vec<DeviceStatus>> {
    parse(run_operation(&data.data_dir, Operation::DeviceList).await?)
}

/// The answer's document `T`.
fn parse<T: TryFrom<Answer, Error = UnexpectedAnswer>>(answer: Answer) -> anyhow::Result<T> {
    Ok(T::try_from(answer)?)
}

/// `device replace`: offline the rebuild runs to the end before the pool
/// closes; through the daemon it runs in the background and `--wait`
/// follows it.
async fn replace(
    data: &DeviceData,
    old: String,
    new: String,
    wait: bool,
    json: bool,
) -> anyhow::Result<()> {
    let through_daemon = daemon_running(&data.data_dir).await;
    let wait_here = !through_daemon;
    let operation = Operation::DeviceReplace {
        old: old.clone(),
        new: new.clone(),
        wait: wait_here,
    };
    let mut status: RebuildStatus = parse(run_operation(&data.data_dir, operation).await?)?;
    if wait && through_daemon {
        status = follow_rebuild(data, json).await?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        println!("replacing {old} with {new}");
        print_rebuild(&status);
    }
    match status.state {
        RebuildState::Failed => {
            anyhow::bail!("the rebuild failed: {}", status.error.unwrap_or_default())
        }
        _ if status.blocks_unrepairable > 0 => anyhow::bail!(
            "{} blocks could not be rebuilt (reading them is an I/O error)",
            status.blocks_unrepairable
        ),
        _ => Ok(()),
    }
}

/// Draws the rebuild's progress from the daemon's status until `task` ends.
async fn draw_progress_until<T>(data: &DeviceData, task: &tokio::task::JoinHandle<T>) {
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "moving data [{bar:40}] {percent:>3}% {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    while !task.is_finished() {
        if let Ok(answer) = run_operation(&data.data_dir, Operation::PoolStatus).await
            && let Ok(status) = parse::<PoolStatus>(answer)
        {
            bar.set_length(status.rebuild.bytes_total);
            bar.set_position(status.rebuild.bytes_done);
        }
        tokio::time::sleep(Duration::from_millis(REBUILD_POLL_INTERVAL_MS)).await;
    }
    bar.finish_and_clear();
}

/// Polls the daemon until the rebuild ends, drawing a progress bar.
async fn follow_rebuild(data: &DeviceData, json: bool) -> anyhow::Result<RebuildStatus> {
    let bar = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "rebuild [{bar:40}] {percent:>3}% {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    loop {
        let status: PoolStatus =
            parse(run_operation(&data.data_dir, Operation::PoolStatus).await?)?;
        bar.set_length(status.rebuild.bytes_total);
        bar.set_position(status.rebuild.bytes_done);
        let replacing = status
            .layout
            .iter()
            .flat_map(|layout| layout.tiers.iter())
            .flat_map(|tier| tier.devices.iter())
            .any(|device| device.replacement.is_some());
        if status.rebuild.state != RebuildState::Rebuilding && !replacing {
            bar.finish_and_clear();
            return Ok(status.rebuild);
        }
        tokio::time::sleep(Duration::from_millis(REBUILD_POLL_INTERVAL_MS)).await;
    }
}

fn print_devices(devices: &[DeviceStatus]) {
    println!(
        "{:<9} {:<5} {:<9} {:>10} {:>10} {:>7} {:>9} {:>7}  path",
        "tier", "index", "state", "read", "written", "errors", "repaired", "parity"
    );
    for device in devices {
        println!(
            "{:<9} {:<5} {:<9} {:>10} {:>10} {:>7} {:>9} {:>7}  {}",
            device.tier,
            device.index,
            device.state,
            format_size(device.bytes_read),
            format_size(device.bytes_written),
            device.io_errors,
            device.checksum_errors_repaired,
            device.parity_repaired,
            device.path
        );
        if let Some(replacement) = &device.replacement {
            println!(
                "{:<9} {:<5} {:<9}  replacing it: {replacement}",
                "", "", "rebuilding"
            );
        }
        if let Some(unfit) = &device.unfit {
            println!("{:<9} {:<5} {:<9}  {unfit}", "", "", "");
        }
    }
}

/// `pool status`'s rebuild line (also after `device replace`).
pub fn print_rebuild(rebuild: &RebuildStatus) {
    // Less redundancy than the pool was made with and no rebuild: why, and
    // what to do, before the latest rebuild's figures (if any).
    if let Some(blocked) = &rebuild.blocked {
        println!("rebuild              blocked: {}", blocked.message);
    }
    let state = match rebuild.state {
        RebuildState::None => return,
        RebuildState::Rebuilding if rebuild.kind == RebuildKind::Rebalance => "rebalancing",
        RebuildState::Rebuilding => "rebuilding",
        RebuildState::Finished => "finished",
        RebuildState::Failed => "failed",
    };
    let percent = (rebuild.bytes_done * 100)
        .checked_div(rebuild.bytes_total)
        .unwrap_or(100);
    let left = rebuild
        .seconds_left
        .map(|seconds| format!(", {seconds} s left"))
        .unwrap_or_default();
    println!(
        "rebuild              {state} {}: {} of {} ({percent}%), {}/s{left}, {} rows verified, {} blocks unrepairable",
        rebuild.kind.name(),
        format_size(rebuild.bytes_done),
        format_size(rebuild.bytes_total),
        format_size(rebuild.bytes_per_second),
        rebuild.rows_verified,
        rebuild.blocks_unrepairable
    );
    if let Some(error) = &rebuild.error {
        println!("rebuild error        {error}");
    }
}

/// `pool status`'s background budget line: the rate rebuild, the cleaner,
/// the demoter and scrub may use now, and why (client latency).
pub fn print_background(background: &BackgroundBudgetStatus) {
    let latency = background.client_latency_us.map_or_else(
        || "no client I/O".to_string(),
        |us| format!("client p99 {us} µs"),
    );
    let impact = match background.impact {
        BackgroundImpact::Low => "low",
        BackgroundImpact::Medium => "medium",
        BackgroundImpact::High => "high",
    };
    let target = match (
        background.client_latency_target_us,
        background.client_latency_baseline_us,
    ) {
        (Some(target), Some(baseline)) => format!(
            "target {target} µs, {} × baseline {baseline} µs",
            background.client_latency_target_ratio
        ),
        (Some(target), None) => format!("target {target} µs"),
        (None, _) => format!(
            "target {} × a baseline not learned yet",
            background.client_latency_target_ratio
        ),
    };
    println!(
        "background           {}/s of {}–{}/s ({impact} impact; {latency}, {target})",
        format_size(background.bytes_per_second),
        format_size(background.bytes_per_second_min),
        format_size(background.bytes_per_second_max),
    );
    let granted = &background.granted_bytes;
    println!(
        "background granted   rebuild {}, cleaner {}, demoter {}, scrub {} (urgent cleaning {})",
        format_size(granted.rebuild),
        format_size(granted.cleaner),
        format_size(granted.demoter),
        format_size(granted.scrub),
        format_size(background.urgent_bytes)
    );
}
