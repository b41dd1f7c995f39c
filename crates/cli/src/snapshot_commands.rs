//! `lamina snapshot` and `lamina clone`: their arguments (snapshots are named
//! `VOL@SNAP`), the admin operation each one asks the daemon for, and the
//! snapshot table they print.

use clap::{Args, Subcommand};
use lamina_api::SnapshotInfo;
use lamina_control::admin::Operation;
use lamina_control::size::format_size;

use crate::volume_commands::{print_deleted, print_volume};
use crate::{DataArgs, admin};

/// Snapshot commands. Names are `VOL@SNAP`; a snapshot name follows the volume
/// name rules (1 to 64 of `A-Z a-z 0-9 . _ -`, not starting with `.` or `-`).
#[derive(Subcommand)]
pub enum SnapshotCommand {
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

/// `lamina clone VOL@SNAP NEWVOL`.
#[derive(Args)]
pub struct CloneArgs {
    /// The snapshot to start from, as VOL@SNAP.
    #[arg(value_parser = parse_snapshot_argument)]
    snapshot: (String, String),
    /// The new volume's name.
    new_name: String,
    #[command(flatten)]
    data: DataArgs,
    #[arg(long)]
    json: bool,
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

pub async fn run(command: SnapshotCommand) -> anyhow::Result<()> {
    match command {
        SnapshotCommand::Create {
            snapshot: (volume, snapshot),
            data,
            json,
        } => {
            let operation = Operation::SnapshotCreate { volume, snapshot };
            admin(data, operation, json, print_snapshot).await
        }
        SnapshotCommand::List { volume, data, json } => {
            let print = |snapshots: &Vec<SnapshotInfo>| print_snapshots(snapshots);
            admin(data, Operation::SnapshotList { volume }, json, print).await
        }
        SnapshotCommand::Delete {
            snapshot: (volume, snapshot),
            data,
            json,
        } => {
            let operation = Operation::SnapshotDelete { volume, snapshot };
            admin(data, operation, json, print_deleted).await
        }
        SnapshotCommand::Rollback {
            snapshot: (volume, snapshot),
            force,
            data,
            json,
        } => {
            let operation = Operation::SnapshotRollback {
                volume,
                snapshot,
                force,
            };
            admin(data, operation, json, print_volume).await
        }
    }
}

/// `lamina clone`: a writable volume from a snapshot.
pub async fn clone(arguments: CloneArgs) -> anyhow::Result<()> {
    let (volume, snapshot) = arguments.snapshot;
    let operation = Operation::VolumeClone {
        volume,
        snapshot,
        new_name: arguments.new_name,
    };
    admin(arguments.data, operation, arguments.json, print_volume).await
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
