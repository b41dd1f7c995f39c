//! The `lamina` command line. It only parses arguments and prints results; the
//! work happens in the control crate (daemon, admin operations), the planner and
//! the benchmark. Volume and pool commands talk to the running daemon over its
//! admin socket, or open the pool directly when no daemon runs.

mod bench_shim;
mod completions;
mod device_commands;
mod errors;
mod logging;
mod pool_commands;
mod pool_group;
mod pool_status_text;
mod reduction_commands;
mod serve_command;
mod snapshot_commands;
mod volume_commands;
mod volume_stats_commands;

use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};
use lamina_api::VolumeTierStats;
use lamina_control::admin::{Answer, Operation, UnexpectedAnswer};
use lamina_control::client::run_operation;
use lamina_control::size::format_size;

#[derive(Parser)]
#[command(
    name = "lamina",
    version,
    about = "Flash-first virtual block storage: thin volumes served over NBD"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: serve every volume over NBD (TCP and a Unix socket).
    Serve(serve_command::ServeArgs),
    /// Create a pool or show its state.
    #[command(subcommand)]
    Pool(pool_group::PoolCommand),
    /// Create, list, resize, rename and delete volumes.
    #[command(subcommand)]
    Volume(volume_commands::VolumeCommand),
    /// Create, list, delete and roll back to read-only snapshots (VOL@SNAP).
    #[command(subcommand)]
    Snapshot(snapshot_commands::SnapshotCommand),
    /// List, fail and replace the devices of an array pool.
    #[command(subcommand)]
    Device(device_commands::DeviceCommand),
    /// Create a writable volume from a snapshot: `lamina clone VOL@SNAP NEWVOL`.
    Clone(snapshot_commands::CloneArgs),
    /// The busiest volumes, live: IOPS, MB/s and latency per interval.
    Top(volume_stats_commands::TopArgs),
    /// Size a pool from a workload trace.
    Plan(lamina_plan::PlanArgs),
    /// Data reduction: the compression ratio lamina would reach on an image.
    #[command(subcommand)]
    Reduction(reduction_commands::ReductionCommand),
    /// Benchmarks: latency versus load against peer servers, and the engine in process.
    Bench(bench_shim::BenchArgs),
    /// Print the shell completion script: `source <(lamina completions bash)`.
    Completions(completions::CompletionsArgs),
    /// Print the manual page lamina(1), or write every page with --output DIR.
    Man(completions::ManArgs),
}

#[derive(Args)]
struct DataArgs {
    /// The data directory holding the pool description and the daemon's sockets.
    #[arg(long = "data", default_value = "lamina-data", env = "LAMINA_DATA")]
    data_dir: PathBuf,
}

/// The name a unit enum variant has in the admin API's JSON (`"high"`, `"idle"`).
fn json_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => "?".to_string(),
    }
}

fn print_volume_stats(stats: &VolumeTierStats) {
    let counters = &stats.counters;
    println!("volume               {}", stats.volume);
    println!(
        "policy               priority {}, pin {}",
        json_name(&stats.policy.priority),
        json_name(&stats.policy.pin)
    );
    println!("compression          {}", stats.compression);
    println!("on flash             {}", format_size(stats.flash_bytes));
    println!("on capacity          {}", format_size(stats.capacity_bytes));
    println!(
        "compression ratio    {} (logical {}, stored {})",
        volume_commands::format_ratio(stats.compress_ratio),
        format_size(stats.logical_bytes),
        format_size(stats.stored_bytes)
    );
    println!(
        "reads from memory    {} blocks ({:.1}%)",
        counters.memory_read_blocks,
        100.0 * stats.memory_hit_ratio
    );
    println!(
        "reads from flash     {} blocks ({:.1}%)",
        counters.flash_read_blocks,
        100.0 * stats.flash_hit_ratio
    );
    println!(
        "reads from capacity  {} blocks ({:.1}%)",
        counters.capacity_read_blocks,
        100.0 * stats.capacity_read_ratio
    );
    println!("promoted             {} blocks", counters.promoted_blocks);
    println!("demoted              {} blocks", counters.demoted_blocks);
}

/// Runs an admin operation and prints its answer: as the admin API's JSON
/// with `--json`, else as text from the answer's typed document `T` (read
/// strictly: a field the answer lacks is an error, never a silent zero).
async fn admin<T: TryFrom<Answer, Error = UnexpectedAnswer>>(
    data: DataArgs,
    operation: Operation,
    json: bool,
    print: fn(&T),
) -> anyhow::Result<()> {
    let answer = run_operation(&data.data_dir, operation)
        .await
        .map_err(|error| errors::with_hint(error, &data.data_dir))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&answer.to_json_value())?);
    } else {
        print(&T::try_from(answer)?);
    }
    Ok(())
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(arguments) => serve_command::run(arguments).await,
        Command::Pool(command) => pool_group::run(command).await,
        Command::Volume(command) => volume_commands::run(command).await,
        Command::Snapshot(command) => snapshot_commands::run(command).await,
        Command::Clone(arguments) => snapshot_commands::clone(arguments).await,
        Command::Device(command) => device_commands::run(command).await,
        Command::Top(arguments) => volume_stats_commands::top(arguments).await,
        Command::Plan(_)
        | Command::Reduction(_)
        | Command::Bench(_)
        | Command::Completions(_)
        | Command::Man(_) => {
            unreachable!("handled before the runtime starts")
        }
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // The daemon, benchmarks and planning report progress at `info`; one-shot
    // commands print their answer on stdout and log only warnings, so that
    // opening a pool directly does not add recovery chatter to it.
    let default_level = match cli.command {
        Command::Serve(_) | Command::Plan(_) | Command::Bench(_) => "info",
        _ => "warn",
    };
    logging::init(default_level);
    let result = match cli.command {
        Command::Plan(arguments) => lamina_plan::run(arguments),
        Command::Reduction(command) => reduction_commands::run(command),
        Command::Bench(arguments) => bench_shim::run(arguments),
        Command::Completions(arguments) => {
            completions::print_completions(&arguments, Cli::command())
        }
        Command::Man(arguments) => completions::write_man_pages(&arguments, Cli::command()),
        command => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
            .block_on(run(command)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("lamina: error: {}", errors::one_line(&error));
            std::process::ExitCode::FAILURE
        }
    }
}
