//! `lamina pool create` on several devices per tier (arrays), `lamina pool
//! scrub`, and the device table of `lamina pool status`.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use lamina_api::{LayoutStatus, PoolStatus, ScrubState, ScrubStatus};
use lamina_control::admin::Operation;
use lamina_control::arrays::ArrayPoolRequest;
use lamina_control::client::{daemon_running, run_operation};
use lamina_control::size::format_size;
use lamina_control::store::TierDevice;
use lamina_engine::PoolOptions;
use lamina_layout::Redundancy;

/// How often `pool scrub --wait` asks the daemon for progress.
const SCRUB_POLL_INTERVAL_MS: u64 = 200;

/// `--flash`/`--capacity` as given: one `PATH[:SIZE]` or a comma-separated list.
pub fn split_devices(argument: &str) -> Vec<&str> {
    argument
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .collect()
}

/// The redundancy names `--redundancy` accepts.
pub fn parse_redundancy(text: &str) -> Result<Redundancy, String> {
    Redundancy::parse(text).ok_or_else(|| {
        let known: Vec<&str> = Redundancy::ALL.iter().map(|scheme| scheme.name()).collect();
        format!("unknown redundancy {text:?} (known: {})", known.join(", "))
    })
}

/// Whether `pool create` makes arrays: several devices in a tier, or a
/// redundancy scheme named. With several devices the scheme must be named.
pub fn array_request(
    flash: &[&str],
    capacity: &[&str],
    redundancy: Option<Redundancy>,
    models: [Option<&str>; 2],
) -> anyhow::Result<Option<ArrayPoolRequest>> {
    let several = flash.len() > 1 || capacity.len() > 1;
    let redundancy = match redundancy {
        None if several => anyhow::bail!(
            "{} flash and {} capacity devices given: say how they protect each other with --redundancy raid6, raid5, mirror or none",
            flash.len(),
            capacity.len()
        ),
        None | Some(Redundancy::None) if !several => return Ok(None),
        None => unreachable!("handled above"),
        Some(redundancy) => redundancy,
    };
    let tier = |arguments: &[&str], model: Option<&str>| -> anyhow::Result<Vec<TierDevice>> {
        arguments
            .iter()
            .map(|argument| TierDevice::from_argument(argument, model))
            .collect()
    };
    Ok(Some(ArrayPoolRequest {
        flash: tier(flash, models[0])?,
        capacity: tier(capacity, models[1])?,
        redundancy,
        slot_counts: Default::default(),
    }))
}

/// `pool create` for arrays; returns the new pool's status.
pub async fn create_arrays(
    data_dir: &std::path::Path,
    request: &ArrayPoolRequest,
    options: PoolOptions,
) -> anyhow::Result<PoolStatus> {
    let opened =
        lamina_control::arrays::create_array_pool(data_dir, request, options, Default::default())
            .await?;
    let mut status = lamina_control::api::pool_status(opened.pool.status());
    status.layout = opened.layout.status();
    opened.pool.close().await?;
    Ok(status)
}

/// Where an object tier (`--capacity s3://bucket/prefix[:SIZE]`) is
/// reached; recorded in `pool.toml`. Credentials come from
/// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or the daemon config's
/// `[object_store]` when it opens the pool), and are never recorded.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ObjectStoreArgs {
    /// The object store's address, e.g. http://127.0.0.1:8333 (default:
    /// AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL or AWS_ENDPOINT, recorded as
    /// this flag is; else AWS itself).
    #[arg(long, value_name = "URL", requires = "capacity")]
    pub s3_endpoint: Option<String>,
    /// The store's region (default: AWS_REGION or AWS_DEFAULT_REGION,
    /// recorded as this flag is; else us-east-1).
    #[arg(long, value_name = "REGION", requires = "capacity")]
    pub s3_region: Option<String>,
    /// Address buckets as bucket.host rather than host/bucket.
    #[arg(long, requires = "capacity")]
    pub s3_virtual_hosted_style: bool,
    /// Allow plain HTTP to an endpoint that is not loopback (credentials and
    /// data cross the network unencrypted).
    #[arg(long, requires = "capacity")]
    pub s3_allow_http: bool,
}

impl ObjectStoreArgs {
    /// The tier at `url` (parsed from the argument) as `pool.toml` records it.
    fn describe(&self, url: String) -> lamina_control::object_tier::ObjectTierDescription {
        lamina_control::object_tier::ObjectTierDescription {
            url,
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            virtual_hosted_style: self.s3_virtual_hosted_style,
            allow_http: self.s3_allow_http,
        }
    }
}

/// `pool create` with its capacity tier on object storage.
pub struct ObjectTierPoolRequest<'a> {
    /// `s3://bucket/prefix[:SIZE]` as given.
    pub url: &'a str,
    pub object_store: ObjectStoreArgs,
    pub segment_size_bytes: u64,
    pub force: bool,
}

/// `pool create --capacity s3://...`; returns the new pool's status.
pub async fn create_over_object_tier(
    data_dir: &std::path::Path,
    flash: &lamina_control::store::TierDevice,
    request: &ObjectTierPoolRequest<'_>,
) -> anyhow::Result<PoolStatus> {
    use lamina_control::object_tier::{ObjectStoreSection, parse_argument};
    let argument = parse_argument(request.url)?;
    let description = request.object_store.describe(argument.url);
    let options = PoolOptions {
        segment_size_bytes: request.segment_size_bytes,
        force: request.force,
        ..PoolOptions::default()
    };
    let opened = lamina_control::store::create_object_tier_pool(
        data_dir,
        flash,
        &description,
        argument.size_bytes,
        &ObjectStoreSection::default(),
        options,
        Default::default(),
    )
    .await?;
    let mut status = lamina_control::api::pool_status(opened.pool.status());
    status.object_tier = opened.layout.object_tier().map(|tier| tier.status());
    opened.pool.close().await?;
    Ok(status)
}

/// `pool restore --from s3://...`.
pub struct RestoreRequest<'a> {
    /// `s3://bucket/prefix` as given.
    pub url: &'a str,
    pub object_store: ObjectStoreArgs,
    pub force: bool,
}

/// What `pool restore` prints: the restored pool's status, opened as of the
/// checkpoint named.
#[derive(serde::Serialize)]
pub struct RestoredPool {
    pub url: String,
    pub flash: String,
    /// The point every volume and snapshot is as of (decision 0056): the
    /// checkpoint the pool was restored from, which covered the log through
    /// batch `covered_batch_sequence`. Nothing written after it is restored.
    pub checkpoint_sequence: u64,
    pub covered_batch_sequence: u64,
    pub pool: PoolStatus,
}

/// `pool restore --from s3://... --flash PATH`: restores the pool onto a new
/// flash device, opens it (recovery) and closes it again.
pub async fn restore_from_object_tier(
    data_dir: &std::path::Path,
    flash: &lamina_control::store::TierDevice,
    request: &RestoreRequest<'_>,
) -> anyhow::Result<RestoredPool> {
    use lamina_control::object_tier::{ObjectStoreSection, parse_argument};
    let argument = parse_argument(request.url)?;
    let description = request.object_store.describe(argument.url);
    // The copies found are logged by the engine; which one the open used
    // is the point below.
    let (opened, _copies_found) = lamina_control::store::restore_object_tier_pool(
        data_dir,
        flash,
        &description,
        &ObjectStoreSection::default(),
        request.force,
        Default::default(),
    )
    .await?;
    let mut status = lamina_control::api::pool_status(opened.pool.status());
    status.object_tier = opened.layout.object_tier().map(|tier| tier.status());
    let point = opened
        .pool
        .restored_as_of()
        .expect("a pool opened by a restore says which point it is as of");
    opened.pool.close().await?;
    Ok(RestoredPool {
        url: description.url,
        flash: flash.path.display().to_string(),
        checkpoint_sequence: point.checkpoint_sequence,
        covered_batch_sequence: point.covered_batch_sequence,
        pool: status,
    })
}

/// `pool status`'s object tier: where, what it holds, and its requests.
pub fn print_object_tier(tier: &lamina_api::ObjectTierStatus) {
    println!("object tier          {}", tier.url);
    println!(
        "  stored             {} in {} objects, {} waiting for upload",
        format_size(tier.stored_bytes),
        tier.object_count,
        format_size(tier.pending_bytes)
    );
    println!(
        "  epoch              {} ({} flushes committed)",
        tier.epoch, tier.flushes_committed
    );
    if let Some(newer_epoch) = tier.fenced_by_epoch {
        println!(
            "  FENCED             another process opened this tier (epoch {newer_epoch}): this daemon stores nothing more in it"
        );
    }
    for request in &tier.requests {
        println!(
            "  {:<8} {:>10} requests {:>6} errors {:>10}  p50 {} us  p99 {} us",
            request.kind,
            request.count,
            request.errors,
            format_size(request.bytes),
            request.latency_p50_us,
            request.latency_p99_us
        );
        let attempt_failures =
            request.throttled + request.server_errors + request.timeouts + request.transport_errors;
        if request.retries > 0 || attempt_failures > 0 {
            println!(
                "  {:<8} {:>10} retries: {} throttled, {} server errors, {} timeouts, {} transport errors",
                "",
                request.retries,
                request.throttled,
                request.server_errors,
                request.timeouts,
                request.transport_errors
            );
        }
    }
}

/// `lamina pool scrub [--wait] [--json]`.
pub async fn scrub(data_dir: &std::path::Path, wait: bool, json: bool) -> anyhow::Result<()> {
    let through_daemon = daemon_running(data_dir).await;
    // Offline, the scrub must finish before the pool closes.
    let wait_here = wait && !through_daemon;
    let started = run_operation(data_dir, Operation::PoolScrub { wait: wait_here }).await?;
    let mut status = ScrubStatus::try_from(started)?;
    if wait && through_daemon {
        status = follow_scrub(data_dir, json).await?;
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print_scrub(&status);
    }
    if status.blocks_unrepairable > 0 {
        anyhow::bail!(
            "{} blocks are damaged beyond repair (reading them is an I/O error)",
            status.blocks_unrepairable
        );
    }
    Ok(())
}

/// Polls the daemon until the scrub finishes, drawing a progress bar
/// (percent, rate, ETA) unless the output is JSON.
async fn follow_scrub(data_dir: &std::path::Path, json: bool) -> anyhow::Result<ScrubStatus> {
    let bar = if json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "scrub [{bar:40}] {percent:>3}% {pos}/{len} blocks {per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    loop {
        let status = PoolStatus::try_from(run_operation(data_dir, Operation::PoolStatus).await?)?;
        bar.set_length(status.scrub.blocks_total);
        bar.set_position(status.scrub.blocks_scrubbed);
        if status.scrub.state != ScrubState::Scrubbing {
            bar.finish_and_clear();
            return Ok(status.scrub);
        }
        tokio::time::sleep(Duration::from_millis(SCRUB_POLL_INTERVAL_MS)).await;
    }
}

pub fn print_scrub(scrub: &ScrubStatus) {
    let state = match scrub.state {
        ScrubState::None => "none since the pool opened",
        ScrubState::Scrubbing => "scrubbing",
        ScrubState::Finished => "finished",
    };
    println!(
        "scrub                {state}: {} of {} live blocks checked, {} repaired, {} unrepairable; {} rows checked (every column), {} parity and metadata copies repaired{} ({:.1} s)",
        scrub.blocks_scrubbed,
        scrub.blocks_total,
        scrub.blocks_repaired,
        scrub.blocks_unrepairable,
        scrub.rows_checked,
        scrub.parity_repaired,
        if scrub.devices_faulted > 0 {
            format!(
                "; {} devices faulted as nearly all bad (rebuilt, not repaired)",
                scrub.devices_faulted
            )
        } else {
            String::new()
        },
        scrub.elapsed_ms as f64 / 1000.0
    );
}

/// `pool status`'s line on the memory cache's warm-up after a restart.
pub fn print_cache_warmup(warmup: &lamina_api::CacheWarmupStatus) {
    let state = match warmup.state {
        lamina_api::CacheWarmupState::None => "none since the pool opened",
        lamina_api::CacheWarmupState::Loading => "loading",
        lamina_api::CacheWarmupState::Finished => "finished",
    };
    println!(
        "cache warm-up        {state}: {} of {} blocks loaded, {} skipped ({} listed, {:.1} s)",
        warmup.blocks_loaded,
        warmup.blocks_to_load,
        warmup.blocks_skipped,
        warmup.blocks_listed,
        warmup.elapsed_ms as f64 / 1000.0
    );
}

/// The state and device table of `pool status`, zpool-style.
pub fn print_layout(layout: &LayoutStatus) {
    println!("state                {}", layout.state);
    for tier in &layout.tiers {
        println!(
            "{:<21}{} over {} devices, {} ({} may be lost)",
            format!("{} array", tier.tier),
            tier.redundancy,
            tier.devices.len(),
            tier.state,
            tier.parity_devices
        );
        println!(
            "  {:<5} {:<9} {:>10} {:>10} {:>7} {:>9} {:>7}  path",
            "index", "state", "read", "written", "errors", "repaired", "parity"
        );
        for device in &tier.devices {
            println!(
                "  {:<5} {:<9} {:>10} {:>10} {:>7} {:>9} {:>7}  {}",
                device.index,
                device.state,
                format_size(device.bytes_read),
                format_size(device.bytes_written),
                device.io_errors,
                device.checksum_errors_repaired,
                device.parity_repaired,
                device.path
            );
            if let Some(unfit) = &device.unfit {
                println!("  {:<5} {:<9}  {unfit}", "", "");
            }
        }
    }
}
