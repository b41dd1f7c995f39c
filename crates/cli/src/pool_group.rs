//! `lamina pool`: its subcommands' arguments, which function runs each, and
//! the two that make a pool, `pool create` (on plain devices, on arrays, or
//! over an object tier) and `pool restore`. The array and object-tier helpers,
//! `pool scrub` and the layout lines are in `pool_commands.rs`; the status
//! text all of them print is in `pool_status_text.rs`.

use anyhow::Context;
use clap::{Args, Subcommand};
use lamina_api::PoolStatus;
use lamina_control::admin::Operation;
use lamina_control::size::{format_size, parse_size};
use lamina_control::store::{BUILT_IN_DEVICE_MODELS, TierDevice};
use lamina_engine::{PoolLimits, PoolOptions};

use crate::errors::with_flag_hint;
use crate::pool_status_text::print_status;
use crate::{DataArgs, admin, pool_commands};

#[derive(Subcommand)]
pub enum PoolCommand {
    /// Create a pool on a flash device or file (PATH:SIZE creates a sparse file),
    /// optionally with a capacity tier behind it.
    Create(CreateArgs),
    /// Restore a pool whose flash device is lost from its object tier alone:
    /// writes the pool's metadata onto a new flash device and opens the pool
    /// as of the newest checkpoint in the bucket. Blocks that were on the
    /// lost flash only read as I/O errors until overwritten.
    Restore(RestoreArgs),
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

#[derive(Args)]
pub struct CreateArgs {
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
    #[arg(long, value_name = "MODEL", value_parser = BUILT_IN_DEVICE_MODELS)]
    flash_model: Option<String>,
    /// A latency model for the capacity device: none, or hdd-7200.
    #[arg(long, value_name = "MODEL", requires = "capacity", value_parser = BUILT_IN_DEVICE_MODELS)]
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
}

#[derive(Args)]
pub struct RestoreArgs {
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
    #[arg(long, value_name = "MODEL", value_parser = BUILT_IN_DEVICE_MODELS)]
    flash_model: Option<String>,
    #[command(flatten)]
    object_store: pool_commands::ObjectStoreArgs,
    /// Write over a flash device that already holds data.
    #[arg(long)]
    force: bool,
    #[arg(long)]
    json: bool,
}

pub async fn run(command: PoolCommand) -> anyhow::Result<()> {
    match command {
        PoolCommand::Create(arguments) => create(arguments).await,
        PoolCommand::Restore(arguments) => restore(arguments).await,
        PoolCommand::Scrub { data, wait, json } => {
            pool_commands::scrub(&data.data_dir, wait, json).await
        }
        PoolCommand::Status { data, json } => {
            admin(data, Operation::PoolStatus, json, print_status).await
        }
    }
}

/// `pool create`: over an object tier when --capacity is a URL, on arrays
/// when the devices call for them, else on one device per tier.
async fn create(arguments: CreateArgs) -> anyhow::Result<()> {
    let _lock = lamina_control::store::lock_directory(&arguments.data.data_dir)?;
    if arguments
        .capacity
        .as_deref()
        .is_some_and(lamina_control::object_tier::is_object_url)
    {
        return create_over_object_tier(arguments).await;
    }
    let flash_list = pool_commands::split_devices(&arguments.flash);
    let capacity_list = arguments
        .capacity
        .as_deref()
        .map(pool_commands::split_devices)
        .unwrap_or_default();
    let array = pool_commands::array_request(
        &flash_list,
        &capacity_list,
        arguments.redundancy,
        [
            arguments.flash_model.as_deref(),
            arguments.capacity_model.as_deref(),
        ],
    )?
    .map(|mut request| {
        request.slot_counts = lamina_control::arrays::TierSlotCounts {
            flash: arguments.flash_slots,
            capacity: arguments.capacity_slots,
        };
        request
    });
    if array.is_none() && (arguments.flash_slots.is_some() || arguments.capacity_slots.is_some()) {
        anyhow::bail!(
            "--flash-slots and --capacity-slots leave room in an array: give --redundancy raid5 or raid6"
        );
    }
    if let Some(request) = array {
        let options = PoolOptions {
            segment_size_bytes: arguments.segment_size,
            force: arguments.force,
            ..PoolOptions::default()
        };
        let status = pool_commands::create_arrays(&arguments.data.data_dir, &request, options)
            .await
            .with_context(|| format!("cannot create a pool on {}", arguments.flash))
            .map_err(with_flag_hint)?;
        return print_created(&status, &arguments.flash, arguments.json);
    }
    create_on_devices(arguments).await
}

/// `pool create --capacity s3://...`: flash in front of an object store.
async fn create_over_object_tier(arguments: CreateArgs) -> anyhow::Result<()> {
    let url = arguments
        .capacity
        .as_deref()
        .expect("create saw an object URL in --capacity");
    anyhow::ensure!(
        arguments.redundancy.is_none() && arguments.capacity_model.is_none(),
        "an object tier (--capacity {url}) takes neither --redundancy nor --capacity-model: the store keeps its own copies"
    );
    let flash = TierDevice::from_argument(&arguments.flash, arguments.flash_model.as_deref())?;
    let request = pool_commands::ObjectTierPoolRequest {
        url,
        object_store: arguments.object_store,
        segment_size_bytes: arguments.segment_size,
        force: arguments.force,
    };
    let status = pool_commands::create_over_object_tier(&arguments.data.data_dir, &flash, &request)
        .await
        .with_context(|| format!("cannot create a pool on {} and {url}", flash.path.display()))
        .map_err(with_flag_hint)?;
    print_created(
        &status,
        &format!("{} and {url}", flash.path.display()),
        arguments.json,
    )
}

/// `pool create` on one flash device, and one capacity device or none.
async fn create_on_devices(arguments: CreateArgs) -> anyhow::Result<()> {
    let flash = TierDevice::from_argument(&arguments.flash, arguments.flash_model.as_deref())?;
    let capacity = arguments
        .capacity
        .map(|capacity| TierDevice::from_argument(&capacity, arguments.capacity_model.as_deref()))
        .transpose()?;
    let options = PoolOptions {
        segment_size_bytes: arguments.segment_size,
        force: arguments.force,
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
        &arguments.data.data_dir,
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
    print_created(&status, &devices, arguments.json)
}

/// `pool restore`: a new flash device in front of the lost one's object tier.
async fn restore(arguments: RestoreArgs) -> anyhow::Result<()> {
    let RestoreArgs {
        data,
        from,
        flash,
        flash_model,
        object_store,
        force,
        json,
    } = arguments;
    let _lock = lamina_control::store::lock_directory(&data.data_dir)?;
    let flash = TierDevice::from_argument(&flash, flash_model.as_deref())?;
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
