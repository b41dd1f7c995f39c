//! `lamina volume`: its subcommands' arguments, the admin operation each one
//! asks the daemon for, and the volume table they print. `volume stats` has
//! its own file, `volume_stats_commands.rs`.

use clap::{Args, Subcommand};
use lamina_api::{Deleted, VolumeInfo};
use lamina_control::admin::Operation;
use lamina_control::size::{format_size, parse_size};
use lamina_engine::{CachePriority, Codec, Pin};

use crate::{DataArgs, admin, json_name, volume_stats_commands};

#[derive(Subcommand)]
pub enum VolumeCommand {
    /// Create a thin volume: `lamina volume create NAME SIZE` (or `--size SIZE`).
    Create(CreateArgs),
    /// Change a volume's tier policy or codec, live.
    Set {
        name: String,
        #[command(flatten)]
        policy: RequiredPolicyArgs,
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
    /// Where a volume's blocks live (bytes per tier) and which tier served its
    /// reads (hit ratios, promotions, demotions) since the pool opened, and
    /// its NBD I/O (IOPS, MB/s, latency percentiles) while a daemon runs.
    Stats {
        name: String,
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        watch: volume_stats_commands::WatchArgs,
    },
    /// List volumes.
    List {
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
    /// Grow a volume online; shrinking discards the tail and needs --force.
    Resize {
        name: String,
        #[arg(long, value_parser = parse_size)]
        size: u64,
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
    /// Rename a volume.
    Rename {
        name: String,
        new_name: String,
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
    /// Delete a volume with its snapshots (refused while clones of its snapshots exist).
    Delete {
        name: String,
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Args)]
pub struct CreateArgs {
    name: String,
    /// The volume's size (e.g. 20G).
    #[arg(value_name = "SIZE", value_parser = parse_size, required_unless_present = "size", conflicts_with = "size")]
    size_argument: Option<u64>,
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    #[command(flatten)]
    policy: PolicyArgs,
    /// The codec of its writes: off, lz4, zstd (level 3) or zstd:LEVEL
    /// (1 to 19); default: the daemon config's [pool] compression.
    #[arg(long, value_name = "CODEC", value_parser = parse_codec)]
    compression: Option<Codec>,
    #[command(flatten)]
    data: DataArgs,
    #[arg(long)]
    json: bool,
}

/// A volume's tier policy on `volume create` (both optional).
#[derive(Args)]
struct PolicyArgs {
    /// Cache priority in a two-tier pool: high, normal, low or none.
    #[arg(long, value_parser = parse_priority)]
    priority: Option<CachePriority>,
    /// Where the volume's blocks stay regardless of heat: auto, flash or capacity.
    #[arg(long, value_parser = parse_pin)]
    pin: Option<Pin>,
}

/// A volume's tier policy and codec on `volume set` (at least one).
#[derive(Args)]
#[group(required = true, multiple = true)]
pub struct RequiredPolicyArgs {
    /// Cache priority in a two-tier pool: high, normal, low or none.
    #[arg(long, value_parser = parse_priority)]
    priority: Option<CachePriority>,
    /// Where the volume's blocks stay regardless of heat: auto, flash or capacity.
    #[arg(long, value_parser = parse_pin)]
    pin: Option<Pin>,
    /// The codec of its new writes: off, lz4, zstd (level 3) or zstd:LEVEL
    /// (1 to 19); what was written before keeps its form until it is moved.
    #[arg(long, value_name = "CODEC", value_parser = parse_codec)]
    compression: Option<Codec>,
}

fn parse_priority(argument: &str) -> Result<CachePriority, String> {
    argument.parse()
}

fn parse_pin(argument: &str) -> Result<Pin, String> {
    argument.parse()
}

fn parse_codec(argument: &str) -> Result<Codec, String> {
    argument
        .parse()
        .map_err(|error: lamina_engine::CodecParseError| error.to_string())
}

pub async fn run(command: VolumeCommand) -> anyhow::Result<()> {
    match command {
        VolumeCommand::Create(arguments) => create(arguments).await,
        VolumeCommand::Set {
            name,
            policy,
            data,
            json,
        } => {
            let operation = Operation::VolumeSetPolicy {
                name,
                priority: policy.priority,
                pin: policy.pin,
                compression: policy.compression,
            };
            admin(data, operation, json, print_volume).await
        }
        VolumeCommand::Stats {
            name,
            data,
            json,
            watch,
        } => volume_stats_commands::volume_stats(name, data, json, watch).await,
        VolumeCommand::List { data, json } => {
            let print = |volumes: &Vec<VolumeInfo>| print_volumes(volumes);
            admin(data, Operation::VolumeList, json, print).await
        }
        VolumeCommand::Resize {
            name,
            size,
            force,
            data,
            json,
        } => {
            let operation = Operation::VolumeResize {
                name,
                size_bytes: size,
                force,
            };
            admin(data, operation, json, print_volume).await
        }
        VolumeCommand::Rename {
            name,
            new_name,
            data,
            json,
        } => {
            let operation = Operation::VolumeRename { name, new_name };
            admin(data, operation, json, print_volume).await
        }
        VolumeCommand::Delete { name, data, json } => {
            admin(data, Operation::VolumeDelete { name }, json, print_deleted).await
        }
    }
}

async fn create(arguments: CreateArgs) -> anyhow::Result<()> {
    let size_bytes = arguments
        .size_argument
        .or(arguments.size)
        .expect("clap requires a size argument or --size");
    let operation = Operation::VolumeCreate {
        name: arguments.name,
        size_bytes,
        priority: arguments.policy.priority,
        pin: arguments.policy.pin,
        compression: arguments.compression,
    };
    admin(arguments.data, operation, arguments.json, print_volume).await
}

fn print_volumes(volumes: &[VolumeInfo]) {
    println!(
        "{:<32} {:>10} {:>12} {:>12} {:>6} {:>12} {:>12} {:>9}  {:<8} {:<8} {:<11}  ORIGIN",
        "NAME",
        "SIZE",
        "ALLOCATED",
        "STORED",
        "RATIO",
        "UNIQUE",
        "USED",
        "SNAPSHOTS",
        "PRIORITY",
        "PIN",
        "COMPRESSION"
    );
    for volume in volumes {
        println!(
            "{:<32} {:>10} {:>12} {:>12} {:>6} {:>12} {:>12} {:>9}  {:<8} {:<8} {:<11}  {}",
            volume.name,
            format_size(volume.size_bytes),
            format_size(volume.allocated_bytes),
            format_size(volume.stored_bytes),
            format_ratio(volume.compress_ratio),
            format_size(volume.unique_bytes),
            format_size(volume.used_bytes),
            volume.snapshot_count,
            json_name(&volume.policy.priority),
            json_name(&volume.policy.pin),
            volume.compression,
            volume.origin.as_deref().unwrap_or("-"),
        );
    }
}

/// A compression ratio as ZFS shows one: `1.81x`.
pub fn format_ratio(ratio: f64) -> String {
    format!("{ratio:.2}x")
}

pub fn print_volume(volume: &VolumeInfo) {
    print_volumes(std::slice::from_ref(volume));
}

pub fn print_deleted(deleted: &Deleted) {
    println!("deleted {}", deleted.deleted);
}
