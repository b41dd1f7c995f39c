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
mod volume_stats_commands;

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, CommandFactory, Parser, Subcommand};
use errors::with_flag_hint;
use lamina_api::{Deleted, IntegrityStatus, PoolStatus, SnapshotInfo, VolumeInfo, VolumeTierStats};
use lamina_control::admin::Operation;
use lamina_control::client::run_operation;
use lamina_control::config::Config;
use lamina_control::size::{format_size, parse_size};
use lamina_engine::{CachePriority, Pin, PoolLimits, PoolOptions};

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
    Serve(ServeArgs),
    /// Create a pool or show its state.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Create, list, resize, rename and delete volumes.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Create, list, delete and roll back to read-only snapshots (VOL@SNAP).
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// List, fail and replace the devices of an array pool.
    #[command(subcommand)]
    Device(device_commands::DeviceCommand),
    /// Create a writable volume from a snapshot: `lamina clone VOL@SNAP NEWVOL`.
    Clone {
        /// The snapshot to start from, as VOL@SNAP.
        #[arg(value_parser = parse_snapshot_argument)]
        snapshot: (String, String),
        /// The new volume's name.
        new_name: String,
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
    /// The busiest volumes, live: IOPS, MB/s and latency per interval.
    Top(volume_stats_commands::TopArgs),
    /// Size a pool from a workload trace.
    Plan(lamina_plan::PlanArgs),
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

#[derive(Args)]
struct ServeArgs {
    /// The data directory (default ./lamina-data; overrides the config file's).
    #[arg(long = "data", env = "LAMINA_DATA")]
    data_dir: Option<PathBuf>,
    /// A TOML configuration file (addresses, limits, pool location).
    #[arg(long)]
    config: Option<PathBuf>,
    /// TCP listen address (empty string disables TCP); overrides the config file.
    #[arg(long)]
    tcp_address: Option<String>,
    /// TLS on the TCP listener (as nbdkit's --tls); overrides the config file.
    #[arg(long, value_parser = ["off", "on", "require"])]
    tls: Option<String>,
    /// A directory with ca-cert.pem, server-cert.pem and server-key.pem.
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,
    /// Clients must present a certificate signed by ca-cert.pem.
    #[arg(long)]
    tls_verify_peer: bool,
}

#[derive(Subcommand)]
enum PoolCommand {
    /// Create a pool on a flash device or file (PATH:SIZE creates a sparse file),
    /// optionally with a capacity tier behind it.
    Create {
        #[command(flatten)]
        data: DataArgs,
        /// The flash device: PATH or PATH:SIZE (e.g. /dev/nvme0n1, ./pool.img:64G),
        /// or several, comma-separated, striped under --redundancy.
        #[arg(long)]
        flash: String,
        /// The capacity device(s) of a two-tier pool: PATH or PATH:SIZE, or a
        /// comma-separated list. Cold data moves there; data read again moves
        /// back to flash.
        #[arg(long)]
        capacity: Option<String>,
        /// How a tier's devices protect each other: raid6 (any two may fail),
        /// raid5 (any one), mirror (all but one), none (striped, no
        /// protection). Required with several devices; one device per tier
        /// without it is a pool on plain devices.
        #[arg(long, value_parser = pool_commands::parse_redundancy)]
        redundancy: Option<lamina_layout::Redundancy>,
        /// Member slots of the flash array (raid5, raid6): more than the
        /// devices leaves room for `device add` to widen it later. Each
        /// segment's address range is sized for every slot, so this costs
        /// address space, not bytes. Default: the devices given.
        #[arg(long, value_name = "COUNT", requires = "redundancy")]
        flash_slots: Option<usize>,
        /// Member slots of the capacity array, as --flash-slots.
        #[arg(long, value_name = "COUNT", requires_all = ["redundancy", "capacity"])]
        capacity_slots: Option<usize>,
        /// A latency model for the flash device: none, or hdd-7200 (a 7,200 rpm
        /// SATA disk; with no --capacity, a pool on a modelled disk alone).
        #[arg(long, value_name = "MODEL", value_parser = lamina_control::store::BUILT_IN_DEVICE_MODELS)]
        flash_model: Option<String>,
        /// A latency model for the capacity device: none, or hdd-7200.
        #[arg(long, value_name = "MODEL", requires = "capacity", value_parser = lamina_control::store::BUILT_IN_DEVICE_MODELS)]
        capacity_model: Option<String>,
        /// Segment size: the unit of allocation and cleaning.
        #[arg(long, default_value = "4M", value_parser = parse_size)]
        segment_size: u64,
        #[command(flatten)]
        object_store: pool_commands::ObjectStoreArgs,
        /// Overwrite a device that already holds data.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Restore a pool whose flash device is lost from its object tier alone:
    /// writes the pool's metadata onto a new flash device and opens the pool
    /// as of the newest checkpoint in the bucket. Blocks that were on the
    /// lost flash only read as I/O errors until overwritten.
    Restore {
        #[command(flatten)]
        data: DataArgs,
        /// The pool's object tier: s3://bucket/prefix.
        #[arg(long = "from", id = "capacity", value_name = "URL")]
        from: String,
        /// The new flash device: PATH (a file is created at the lost one's
        /// size) or PATH:SIZE.
        #[arg(long)]
        flash: String,
        /// A latency model for the flash device: none, or hdd-7200.
        #[arg(long, value_name = "MODEL", value_parser = lamina_control::store::BUILT_IN_DEVICE_MODELS)]
        flash_model: Option<String>,
        #[command(flatten)]
        object_store: pool_commands::ObjectStoreArgs,
        /// Write over a flash device that already holds data.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Read every live block, check it against its checksum and repair what
    /// fails from redundancy (parity or copies), in the background.
    Scrub {
        #[command(flatten)]
        data: DataArgs,
        /// Wait for the end, with a progress bar.
        #[arg(long)]
        wait: bool,
        #[arg(long)]
        json: bool,
    },
    /// Capacity, used, free and reserved space, write amplification; per-tier
    /// space, promotions and demotions in a two-tier pool; the state of each
    /// device of an array pool.
    Status {
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum VolumeCommand {
    /// Create a thin volume: `lamina volume create NAME SIZE` (or `--size SIZE`).
    Create {
        name: String,
        /// The volume's size (e.g. 20G).
        #[arg(value_name = "SIZE", value_parser = parse_size, required_unless_present = "size", conflicts_with = "size")]
        size_argument: Option<u64>,
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        #[command(flatten)]
        policy: PolicyArgs,
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
    /// Change a volume's tier policy, live.
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

/// Snapshot commands. Names are `VOL@SNAP`; a snapshot name follows the volume
/// name rules (1 to 64 of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`).
#[derive(Subcommand)]
enum SnapshotCommand {
    /// Take a snapshot of a volume's current contents (instant, read-only,
    /// exported over NBD as VOL@SNAP).
    Create {
        #[arg(value_parser = parse_snapshot_argument)]
        snapshot: (String, String),
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
    /// List snapshots of one volume, or of all volumes.
    List {
        volume: Option<String>,
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot (refused while clones of it exist).
    Delete {
        #[arg(value_parser = parse_snapshot_argument)]
        snapshot: (String, String),
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
    /// Make a volume's contents those of its newest snapshot again. Refused
    /// while NBD clients have the volume open, unless --force.
    Rollback {
        #[arg(value_parser = parse_snapshot_argument)]
        snapshot: (String, String),
        /// Roll back under connected clients: they read the snapshot's contents
        /// from their next request (their own caches are not told).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        data: DataArgs,
        #[arg(long)]
        json: bool,
    },
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

/// A volume's tier policy on `volume set` (at least one).
#[derive(Args)]
#[group(required = true, multiple = true)]
struct RequiredPolicyArgs {
    /// Cache priority in a two-tier pool: high, normal, low or none.
    #[arg(long, value_parser = parse_priority)]
    priority: Option<CachePriority>,
    /// Where the volume's blocks stay regardless of heat: auto, flash or capacity.
    #[arg(long, value_parser = parse_pin)]
    pin: Option<Pin>,
}

fn parse_priority(argument: &str) -> Result<CachePriority, String> {
    argument.parse()
}

fn parse_pin(argument: &str) -> Result<Pin, String> {
    argument.parse()
}

fn parse_snapshot_argument(argument: &str) -> Result<(String, String), String> {
    match argument.split_once('@') {
        Some((volume, snapshot)) if !volume.is_empty() && !snapshot.is_empty() => {
            Ok((volume.to_string(), snapshot.to_string()))
        }
        _ => Err(format!(
            "{argument:?} is not a snapshot name: expected VOL@SNAP"
        )),
    }
}

fn print_snapshots(snapshots: &[SnapshotInfo]) {
    println!(
        "{:<40} {:>10} {:>12} {:>12}  CLONES",
        "NAME", "SIZE", "REFERENCED", "UNIQUE"
    );
    for snapshot in snapshots {
        println!(
            "{:<40} {:>10} {:>12} {:>12}  {}",
            snapshot.full_name,
            format_size(snapshot.size_bytes),
            format_size(snapshot.referenced_bytes),
            format_size(snapshot.unique_bytes),
            if snapshot.clones.is_empty() {
                "-".to_string()
            } else {
                snapshot.clones.join(",")
            },
        );
    }
}

fn print_snapshot(snapshot: &SnapshotInfo) {
    print_snapshots(std::slice::from_ref(snapshot));
}

fn print_volumes(volumes: &[VolumeInfo]) {
    println!(
        "{:<32} {:>10} {:>12} {:>12} {:>12} {:>9}  {:<8} {:<8}  ORIGIN",
        "NAME", "SIZE", "ALLOCATED", "UNIQUE", "USED", "SNAPSHOTS", "PRIORITY", "PIN"
    );
    for volume in volumes {
        println!(
            "{:<32} {:>10} {:>12} {:>12} {:>12} {:>9}  {:<8} {:<8}  {}",
            volume.name,
            format_size(volume.size_bytes),
            format_size(volume.allocated_bytes),
            format_size(volume.unique_bytes),
            format_size(volume.used_bytes),
            volume.snapshot_count,
            json_name(&volume.policy.priority),
            json_name(&volume.policy.pin),
            volume.origin.as_deref().unwrap_or("-"),
        );
    }
}

fn print_volume(volume: &VolumeInfo) {
    print_volumes(std::slice::from_ref(volume));
}

fn print_deleted(deleted: &Deleted) {
    println!("deleted {}", deleted.deleted);
}

/// The name a unit enum variant has in the admin API's JSON (`"high"`, `"idle"`).
fn json_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => "?".to_string(),
    }
}

/// What `pool restore` prints: the point the restored pool is as of, what
/// was lost, and its status.
fn print_restored(status: &pool_commands::RestoredPool) {
    println!("restored pool from {} onto {}", status.url, status.flash);
    println!(
        "AS OF                checkpoint {} (log batch {}): every volume and snapshot as it was then; writes after it are not restored",
        status.checkpoint_sequence, status.covered_batch_sequence
    );
    let lost_bytes = status.pool.flash_only_bytes.unwrap_or(0);
    if lost_bytes > 0 {
        println!(
            "LOST                 {} were on the lost flash only: reading them gives I/O errors until they are written again",
            format_size(lost_bytes)
        );
    }
    print_status(&status.pool);
}

fn print_created(status: &PoolStatus, devices: &str, json: bool) -> anyhow::Result<()> {
    if json {
        // Through a `Value`, as the other commands print, so that the keys
        // come in the same order.
        let value = serde_json::to_value(status)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        println!("created pool on {devices}");
        print_status(status);
    }
    Ok(())
}

fn print_status(status: &PoolStatus) {
    println!("device               {}", status.device);
    println!(
        "capacity             {}",
        format_size(status.capacity_bytes)
    );
    println!("used                 {}", format_size(status.used_bytes));
    println!("free                 {}", format_size(status.free_bytes));
    println!(
        "reserved             {}",
        format_size(status.reserved_bytes)
    );
    let warning = match status.usage_warning_percent {
        0 => String::new(),
        threshold => format!(" (warning: above {threshold}%; trim, delete or add capacity)"),
    };
    println!(
        "used percent         {:.1}% of what clients can fill{warning}",
        status.used_percent
    );
    println!("volumes              {}", status.volume_count);
    println!(
        "write amplification  {}",
        status
            .write_amplification
            .map_or("- (no client writes yet)".to_owned(), |amplification| {
                format!("{amplification:.2} over the pool's life")
            })
    );
    println!(
        "cleaner              {} (pressure {:.2})",
        json_name(&status.cleaner_state),
        status.cleaner_pressure
    );
    println!(
        "cleaner relocated    {} blocks",
        status.cleaner_relocated_blocks
    );
    println!(
        "waited for space     {} writes, {} ms in all (cleaning in the write path)",
        status.space_waits.count, status.space_waits.milliseconds
    );
    println!(
        "dead segments        {} (freed by the next checkpoints)",
        status.dead_segment_count
    );
    if let Some(capacity) = &status.capacity {
        for (tier, space) in [("flash", &status.flash), ("capacity", capacity)] {
            println!(
                "{:<21}{} ({} used, {} free)",
                format!("{tier} tier"),
                format_size(space.size_bytes),
                format_size(space.used_bytes),
                format_size(space.free_bytes)
            );
        }
        if let Some(flash_only_bytes) = status.flash_only_bytes {
            println!(
                "on flash only        {} (not yet demoted: lost with the flash device)",
                format_size(flash_only_bytes)
            );
        }
        println!("promoted             {} blocks", status.promoted_blocks);
        println!("demoted              {} blocks", status.demoted_blocks);
    }
    if let Some(suspension) = status
        .capacity_writes
        .as_ref()
        .and_then(|writes| writes.suspended.as_ref())
    {
        println!(
            "CAPACITY SUSPENDED   since {} (unix seconds), {} retries failed: demotion and \
             checkpoints wait, writes land on flash: {}",
            suspension.since_unix_seconds, suspension.failed_retries, suspension.last_error
        );
    }
    print_integrity(&status.integrity);
    if status.scrub.state != lamina_api::ScrubState::None {
        pool_commands::print_scrub(&status.scrub);
    }
    if status.cache_warmup.state != lamina_api::CacheWarmupState::None {
        pool_commands::print_cache_warmup(&status.cache_warmup);
    }
    device_commands::print_rebuild(&status.rebuild);
    device_commands::print_background(&status.background);
    if let Some(layout) = &status.layout {
        pool_commands::print_layout(layout);
    }
    if let Some(object_tier) = &status.object_tier {
        pool_commands::print_object_tier(object_tier);
    }
    if let Some(device_full) = &status.device_full {
        println!(
            "DEVICE FULL          {} batches wait for space: {}",
            device_full.waiting_batch_count, device_full.reason
        );
    }
    if let Some(reason) = &status.failed {
        println!("FAILED               {reason}");
    }
}

/// Damage the pool found: one line when there is none, each finding otherwise.
fn print_integrity(integrity: &IntegrityStatus) {
    let findings = [
        (
            integrity.read_checksum_errors,
            "checksum errors on read (I/O errors returned)",
        ),
        (
            integrity.damaged_flushed_blocks,
            "flushed blocks found damaged at recovery (reads fail)",
        ),
        (
            integrity.lost_batches,
            "flushed batches lost (both summary copies damaged): DATA LOSS",
        ),
        (
            integrity.checksum_errors_repaired,
            "damaged blocks rebuilt from redundancy and rewritten",
        ),
        (
            integrity.summaries_repaired,
            "damaged summaries read from their copies",
        ),
        (
            integrity.torn_blocks_dropped,
            "unflushed blocks torn by a crash, dropped",
        ),
        (
            integrity.segments_set_aside,
            "segments set aside by the cleaner (unreadable summaries)",
        ),
        (
            integrity.blocks_marked_lost,
            "blocks lost with the flash device (the pool was restored without it): DATA LOSS",
        ),
        (
            integrity.lost_block_reads,
            "reads of blocks lost with the flash device (restored without it)",
        ),
    ];
    let found: Vec<_> = findings.iter().filter(|(count, _)| *count > 0).collect();
    if found.is_empty() {
        println!("integrity            no damage found");
    }
    for (count, what) in found {
        println!("integrity            {count} {what}");
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
    println!("on flash             {}", format_size(stats.flash_bytes));
    println!("on capacity          {}", format_size(stats.capacity_bytes));
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

/// Runs an admin operation and prints its answer: as the daemon's JSON with
/// `--json`, else as text from the answer read as its typed document `T` (a
/// field the answer lacks is an error, never a silent zero).
async fn admin<T: serde::de::DeserializeOwned>(
    data: DataArgs,
    operation: Operation,
    json: bool,
    print: fn(&T),
) -> anyhow::Result<()> {
    let value = run_operation(&data.data_dir, operation)
        .await
        .map_err(|error| errors::with_hint(error, &data.data_dir))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        let document: T = serde_json::from_value(value)
            .context("the admin API's answer is not the document this lamina reads")?;
        print(&document);
    }
    Ok(())
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(arguments) => {
            let mut config = match &arguments.config {
                Some(path) => Config::load(path)?,
                None => Config::default(),
            };
            let reload = lamina_control::systemd::ReloadSource {
                config_path: arguments.config.clone(),
                file_config: Some(config.clone()),
                log_filter: logging::filter_setter(),
            };
            if let (Some(level), Some(set_filter)) = (&config.log.level, &reload.log_filter)
                && !logging::set_by_environment()
            {
                set_filter(level)
                    .map_err(|error| anyhow::anyhow!("[log] level {level:?}: {error}"))?;
            }
            if let Some(data_dir) = arguments.data_dir {
                config.data_dir = data_dir;
            }
            if let Some(address) = arguments.tcp_address {
                config.server.tcp_address = address;
            }
            if let Some(tls) = arguments.tls {
                config.server.tls = match tls.as_str() {
                    "on" => lamina_control::config::TlsSetting::On,
                    "require" => lamina_control::config::TlsSetting::Require,
                    _ => lamina_control::config::TlsSetting::Off,
                };
            }
            if let Some(directory) = arguments.tls_certificates {
                config.server.tls_certificates = Some(directory);
            }
            config.server.tls_verify_peer |= arguments.tls_verify_peer;
            lamina_control::daemon::run_service(config, reload).await
        }
        Command::Pool(PoolCommand::Restore {
            data,
            from,
            flash,
            flash_model,
            object_store,
            force,
            json,
        }) => {
            let _lock = lamina_control::store::lock_directory(&data.data_dir)?;
            let flash =
                lamina_control::store::TierDevice::from_argument(&flash, flash_model.as_deref())?;
            let request = pool_commands::RestoreRequest {
                url: &from,
                object_store,
                force,
            };
            let status = pool_commands::restore_from_object_tier(&data.data_dir, &flash, &request)
                .await
                .with_context(|| {
                    format!(
                        "cannot restore the pool of {from} onto {}",
                        flash.path.display()
                    )
                })
                .map_err(with_flag_hint)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&serde_json::to_value(&status)?)?
                );
            } else {
                print_restored(&status);
            }
            Ok(())
        }
        Command::Pool(PoolCommand::Create {
            data,
            flash,
            capacity,
            flash_model,
            capacity_model,
            redundancy,
            flash_slots,
            capacity_slots,
            segment_size,
            object_store,
            force,
            json,
        }) => {
            use lamina_control::store::TierDevice;
            let _lock = lamina_control::store::lock_directory(&data.data_dir)?;
            if let Some(url) = capacity
                .as_deref()
                .filter(|capacity| lamina_control::object_tier::is_object_url(capacity))
            {
                anyhow::ensure!(
                    redundancy.is_none() && capacity_model.is_none(),
                    "an object tier (--capacity {url}) takes neither --redundancy nor --capacity-model: the store keeps its own copies"
                );
                let flash = TierDevice::from_argument(&flash, flash_model.as_deref())?;
                let request = pool_commands::ObjectTierPoolRequest {
                    url,
                    object_store,
                    segment_size_bytes: segment_size,
                    force,
                };
                let status =
                    pool_commands::create_over_object_tier(&data.data_dir, &flash, &request)
                        .await
                        .with_context(|| {
                            format!("cannot create a pool on {} and {url}", flash.path.display())
                        })
                        .map_err(with_flag_hint)?;
                return print_created(
                    &status,
                    &format!("{} and {url}", flash.path.display()),
                    json,
                );
            }
            let flash_list = pool_commands::split_devices(&flash);
            let capacity_list = capacity
                .as_deref()
                .map(pool_commands::split_devices)
                .unwrap_or_default();
            let array = pool_commands::array_request(
                &flash_list,
                &capacity_list,
                redundancy,
                [flash_model.as_deref(), capacity_model.as_deref()],
            )?
            .map(|mut request| {
                request.slot_counts = lamina_control::arrays::TierSlotCounts {
                    flash: flash_slots,
                    capacity: capacity_slots,
                };
                request
            });
            if array.is_none() && (flash_slots.is_some() || capacity_slots.is_some()) {
                anyhow::bail!(
                    "--flash-slots and --capacity-slots leave room in an array: give --redundancy raid5 or raid6"
                );
            }
            if let Some(request) = array {
                let options = PoolOptions {
                    segment_size_bytes: segment_size,
                    force,
                    ..PoolOptions::default()
                };
                let status = pool_commands::create_arrays(&data.data_dir, &request, options)
                    .await
                    .with_context(|| format!("cannot create a pool on {flash}"))
                    .map_err(with_flag_hint)?;
                return print_created(&status, &flash, json);
            }
            let flash = TierDevice::from_argument(&flash, flash_model.as_deref())?;
            let capacity = capacity
                .map(|capacity| TierDevice::from_argument(&capacity, capacity_model.as_deref()))
                .transpose()?;
            let options = PoolOptions {
                segment_size_bytes: segment_size,
                force,
                flash_region_bytes: None,
                ..PoolOptions::default()
            };
            let devices = match &capacity {
                Some(capacity) => {
                    format!("{} and {}", flash.path.display(), capacity.path.display())
                }
                None => flash.path.display().to_string(),
            };
            let pool = lamina_control::store::create_tiered_pool(
                &data.data_dir,
                &flash,
                capacity.as_ref(),
                options,
                PoolLimits::default(),
            )
            .await
            .with_context(|| format!("cannot create a pool on {devices}"))
            .map_err(with_flag_hint)?;
            let status = lamina_control::api::pool_status(pool.status());
            pool.close().await?;
            print_created(&status, &devices, json)
        }
        Command::Device(command) => device_commands::run(command).await,
        Command::Pool(PoolCommand::Scrub { data, wait, json }) => {
            pool_commands::scrub(&data.data_dir, wait, json).await
        }
        Command::Pool(PoolCommand::Status { data, json }) => {
            admin(data, Operation::PoolStatus, json, print_status).await
        }
        Command::Volume(VolumeCommand::Create {
            name,
            size_argument,
            size,
            policy,
            data,
            json,
        }) => {
            let size_bytes = size_argument
                .or(size)
                .expect("clap requires a size argument or --size");
            admin(
                data,
                Operation::VolumeCreate {
                    name,
                    size_bytes,
                    priority: policy.priority,
                    pin: policy.pin,
                },
                json,
                print_volume,
            )
            .await
        }
        Command::Volume(VolumeCommand::Set {
            name,
            policy,
            data,
            json,
        }) => {
            admin(
                data,
                Operation::VolumeSetPolicy {
                    name,
                    priority: policy.priority,
                    pin: policy.pin,
                },
                json,
                print_volume,
            )
            .await
        }
        Command::Volume(VolumeCommand::Stats {
            name,
            data,
            json,
            watch,
        }) => volume_stats_commands::volume_stats(name, data, json, watch).await,
        Command::Top(arguments) => volume_stats_commands::top(arguments).await,
        Command::Volume(VolumeCommand::List { data, json }) => {
            admin(
                data,
                Operation::VolumeList,
                json,
                |volumes: &Vec<VolumeInfo>| print_volumes(volumes),
            )
            .await
        }
        Command::Volume(VolumeCommand::Resize {
            name,
            size,
            force,
            data,
            json,
        }) => {
            admin(
                data,
                Operation::VolumeResize {
                    name,
                    size_bytes: size,
                    force,
                },
                json,
                print_volume,
            )
            .await
        }
        Command::Volume(VolumeCommand::Rename {
            name,
            new_name,
            data,
            json,
        }) => {
            admin(
                data,
                Operation::VolumeRename { name, new_name },
                json,
                print_volume,
            )
            .await
        }
        Command::Volume(VolumeCommand::Delete { name, data, json }) => {
            admin(data, Operation::VolumeDelete { name }, json, print_deleted).await
        }
        Command::Snapshot(SnapshotCommand::Create {
            snapshot: (volume, snapshot),
            data,
            json,
        }) => {
            admin(
                data,
                Operation::SnapshotCreate { volume, snapshot },
                json,
                print_snapshot,
            )
            .await
        }
        Command::Snapshot(SnapshotCommand::List { volume, data, json }) => {
            admin(
                data,
                Operation::SnapshotList { volume },
                json,
                |snapshots: &Vec<SnapshotInfo>| print_snapshots(snapshots),
            )
            .await
        }
        Command::Snapshot(SnapshotCommand::Delete {
            snapshot: (volume, snapshot),
            data,
            json,
        }) => {
            admin(
                data,
                Operation::SnapshotDelete { volume, snapshot },
                json,
                print_deleted,
            )
            .await
        }
        Command::Snapshot(SnapshotCommand::Rollback {
            snapshot: (volume, snapshot),
            force,
            data,
            json,
        }) => {
            admin(
                data,
                Operation::SnapshotRollback {
                    volume,
                    snapshot,
                    force,
                },
                json,
                print_volume,
            )
            .await
        }
        Command::Clone {
            snapshot: (volume, snapshot),
            new_name,
            data,
            json,
        } => {
            admin(
                data,
                Operation::VolumeClone {
                    volume,
                    snapshot,
                    new_name,
                },
                json,
                print_volume,
            )
            .await
        }
        Command::Plan(_) | Command::Bench(_) | Command::Completions(_) | Command::Man(_) => {
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
