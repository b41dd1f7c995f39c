//! Opening any pool (`open_pool_with_models`), and pools whose tiers are arrays (`lamina pool create --flash f1,f2,...
//! --redundancy raid6`): checking the device lists, making the arrays and the
//! pool on them, and opening them again from their labelled devices, which
//! may be at new paths or in another order, with some missing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use lamina_device::{BlockDevice, ConcatenatedDevice, RotatingDiskModel};
use lamina_engine::log::geometry::{CAPACITY_DATA_START_BLOCKS, DATA_START_BLOCK};
use lamina_engine::{BLOCK_SIZE_BYTES, Pool, PoolLimits, PoolOptions};
use lamina_layout::{ArrayIdentity, MemberDevice, Redundancy, RedundantArray, TierRole};

use crate::layout::{PoolLayout, TierArray};
use crate::store::{
    DeviceModels, NO_DEVICE_MODEL, PoolDescription, TierDevice, behind_model, open_device,
    recorded_model, refuse_if_described, same_file,
};

pub use crate::store::OpenedPool;

/// What `pool create` asks for when a tier has several devices or a
/// redundancy scheme is named.
#[derive(Clone, Debug)]
pub struct ArrayPoolRequest {
    pub flash: Vec<TierDevice>,
    /// Empty for a one-tier pool.
    pub capacity: Vec<TierDevice>,
    pub redundancy: Redundancy,
    /// Member slots per tier (`--flash-slots`, `--capacity-slots`): at least
    /// the devices given; the rest start empty for `device add` to fill,
    /// widening the array. `None`: as many as the devices.
    pub slot_counts: TierSlotCounts,
}

/// Member slots asked for each tier's array.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierSlotCounts {
    pub flash: Option<usize>,
    pub capacity: Option<usize>,
}

/// Refuses device lists that name one device twice (through symlinks and
/// hard links alike), and devices that neither exist nor have a size.
fn check_devices(request: &ArrayPoolRequest) -> anyhow::Result<()> {
    let all: Vec<(&str, &TierDevice)> = request
        .flash
        .iter()
        .map(|device| ("flash", device))
        .chain(request.capacity.iter().map(|device| ("capacity", device)))
        .collect();
    for (index, (tier, device)) in all.iter().enumerate() {
        if let Some((other_tier, _)) = all[..index]
            .iter()
            .find(|(_, other)| same_file(&other.path, &device.path))
        {
            anyhow::bail!(
                "device {} is listed twice (as {other_tier} and as {tier}); every device may hold one member",
                device.path.display()
            );
        }
    }
    for (tier, device) in all {
        if device.create_size_bytes.is_none() && !device.path.exists() {
            anyhow::bail!(
                "the {tier} device {} does not exist; give its size as PATH:SIZE to create a file",
                device.path.display()
            );
        }
    }
    Ok(())
}

/// The segment size nearest above `requested` that is whole rows of both
/// tiers (their data blocks per row).
fn segment_size_for_rows(requested: u64, flash_rows: u64, capacity_rows: u64) -> u64 {
    let lcm = flash_rows / gcd(flash_rows, capacity_rows) * capacity_rows;
    let blocks = (requested / BLOCK_SIZE_BYTES).next_multiple_of(lcm);
    blocks * BLOCK_SIZE_BYTES
}

fn gcd(first: u64, second: u64) -> u64 {
    if second == 0 {
        first
    } else {
        gcd(second, first % second)
    }
}

/// `pool create` on arrays: labels every device, creates the pool and
/// records it in `data_dir`. Files this call creates are removed again when
/// it fails.
pub async fn create_array_pool(
    data_dir: &Path,
    request: &ArrayPoolRequest,
    options: PoolOptions,
    limits: PoolLimits,
) -> anyhow::Result<OpenedPool> {
    refuse_if_described(data_dir, options.force)?;
    check_devices(request)?;
    let created: Vec<PathBuf> = request
        .flash
        .iter()
        .chain(&request.capacity)
        .filter(|device| !device.path.exists())
        .map(|device| device.path.clone())
        .collect();
    let result = create_arrays_and_pool(data_dir, request, options, limits).await;
    if result.is_err() {
        for path in created {
            let _ = std::fs::remove_file(path);
        }
    }
    result
}

async fn create_arrays_and_pool(
    data_dir: &Path,
    request: &ArrayPoolRequest,
    mut options: PoolOptions,
    limits: PoolLimits,
) -> anyhow::Result<OpenedPool> {
    let array_identifier: u128 = rand::random();
    let models = DeviceModels::default();
    // Segments are whole rows of both tiers (their data blocks per row), and
    // each array learns the segment size: every segment is one zone, laid
    // out over the members in use when it is opened (distributed spare
    // space after a loss, issue 19).
    let slots = SlotCounts::of(request);
    let rows_of = |slot_count: usize| match slot_count {
        0 => 1,
        count => request.redundancy.data_columns(count) as u64,
    };
    options.flash_row_blocks = rows_of(slots.flash);
    options.capacity_row_blocks = rows_of(slots.capacity);
    let segment_size_bytes = segment_size_for_rows(
        options.segment_size_bytes,
        options.flash_row_blocks,
        options.capacity_row_blocks,
    );
    if segment_size_bytes != options.segment_size_bytes {
        tracing::info!(
            requested = options.segment_size_bytes,
            segment_size_bytes,
            "segment size rounded up to whole rows of the arrays"
        );
        options.segment_size_bytes = segment_size_bytes;
    }
    let tier_array = |tier, devices, slot_count| TierArrayRequest {
        tier,
        devices,
        array_identifier,
        redundancy: request.redundancy,
        segment_blocks: segment_size_bytes / BLOCK_SIZE_BYTES,
        slot_count,
    };
    let flash = tier_array(TierRole::Flash, &request.flash, slots.flash);
    let flash = create_tier_array(flash, &models).await?;
    let capacity = match request.capacity.is_empty() {
        true => None,
        false => {
            let capacity = tier_array(TierRole::Capacity, &request.capacity, slots.capacity);
            Some(create_tier_array(capacity, &models).await?)
        }
    };
    assert_eq!(flash.row_data_blocks(), options.flash_row_blocks);
    assert_eq!(
        capacity.as_ref().map_or(1, |array| array.row_data_blocks()),
        options.capacity_row_blocks
    );
    let (device, layout) = pool_device(flash, capacity, &mut options);
    let pool = Pool::create(device, options, limits).await?;
    write_array_description(data_dir, request)?;
    Ok(OpenedPool { pool, layout })
}

/// The pool's device over its arrays, and the layout that shows them.
fn pool_device(
    flash: Arc<RedundantArray>,
    capacity: Option<Arc<RedundantArray>>,
    options: &mut PoolOptions,
) -> (Arc<dyn BlockDevice>, PoolLayout) {
    let mut tiers = vec![TierArray {
        tier: TierRole::Flash,
        array: flash.clone(),
    }];
    let device: Arc<dyn BlockDevice> = match capacity {
        None => flash,
        Some(capacity) => {
            tiers.push(TierArray {
                tier: TierRole::Capacity,
                array: capacity.clone(),
            });
            options.flash_region_bytes = Some(ConcatenatedDevice::first_region_bytes_of(
                flash.size_bytes(),
            ));
            Arc::new(ConcatenatedDevice::new(flash, capacity))
        }
    };
    (device, PoolLayout::new(tiers))
}

/// Each tier's slots: those asked for, or its devices (0 for no tier).
struct SlotCounts {
    flash: usize,
    capacity: usize,
}

impl SlotCounts {
    fn of(request: &ArrayPoolRequest) -> Self {
        Self {
            flash: request.slot_counts.flash.unwrap_or(request.flash.len()),
            capacity: match request.capacity.len() {
                0 => 0,
                count => request.slot_counts.capacity.unwrap_or(count),
            },
        }
    }
}

/// One tier's array to create.
struct TierArrayRequest<'a> {
    tier: TierRole,
    devices: &'a [TierDevice],
    array_identifier: u128,
    redundancy: Redundancy,
    /// The engine's segment size: each segment is one zone of the array.
    segment_blocks: u64,
    /// Member slots, at least the devices.
    slot_count: usize,
}

async fn create_tier_array(
    request: TierArrayRequest<'_>,
    models: &DeviceModels,
) -> anyhow::Result<Arc<RedundantArray>> {
    let tier = request.tier;
    let mut members = Vec::new();
    for device in request.devices {
        let model = models
            .resolve(device.model.as_deref().unwrap_or(NO_DEVICE_MODEL))
            .with_context(|| format!("the {} device {}", tier.name(), device.path.display()))?;
        members.push(member(&device.path, device.create_size_bytes, model)?);
    }
    warn_about_mixed_sizes(tier, &members);
    let identity = ArrayIdentity {
        array_identifier: request.array_identifier,
        tier,
    };
    let prefix_blocks = prefix_blocks_of(tier);
    let shape = lamina_layout::ZonedArrayRequest {
        redundancy: request.redundancy,
        prefix_blocks,
        segment_blocks: request.segment_blocks,
        slot_count: request.slot_count,
    };
    let array = lamina_layout::create_zoned_with_slots(identity, shape, members)
        .await
        .with_context(|| format!("cannot make the {} tier's array", tier.name()))?;
    Ok(Arc::new(array))
}

/// Blocks of a tier's device that the engine rewrites in place (superblock,
/// flush markers, checkpoint slots; the capacity label): mirrored on every
/// member, never striped.
fn prefix_blocks_of(tier: TierRole) -> u64 {
    match tier {
        TierRole::Flash => DATA_START_BLOCK,
        TierRole::Capacity => CAPACITY_DATA_START_BLOCKS,
    }
}

pub(crate) fn member(
    path: &Path,
    create_size_bytes: Option<u64>,
    model: Option<RotatingDiskModel>,
) -> anyhow::Result<MemberDevice> {
    let device = behind_model(open_device(path, create_size_bytes)?, model);
    // Named by its full path in labels, status and messages (it exists now).
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    Ok(MemberDevice {
        path: path.display().to_string(),
        device,
    })
}

/// Members of different sizes are used up to the smallest one's size: says
/// how much of the larger ones is left unused.
fn warn_about_mixed_sizes(tier: TierRole, members: &[MemberDevice]) {
    let smallest = members
        .iter()
        .map(|member| member.device.size_bytes())
        .min()
        .unwrap_or(0);
    for member in members {
        let unused = member.device.size_bytes() - smallest;
        if unused > 0 {
            tracing::warn!(
                tier = tier.name(),
                path = %member.path,
                unused_bytes = unused,
                "array members differ in size: each is used up to the smallest one's size"
            );
        }
    }
}

fn write_array_description(data_dir: &Path, request: &ArrayPoolRequest) -> anyhow::Result<()> {
    let canonical =
        |path: &Path| std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let paths = |devices: &[TierDevice]| -> Vec<PathBuf> {
        devices
            .iter()
            .map(|device| canonical(&device.path))
            .collect()
    };
    let first_model = |devices: &[TierDevice]| {
        devices
            .first()
            .and_then(|device| recorded_model(device.model.as_deref()))
    };
    let description = PoolDescription {
        flash: canonical(&request.flash[0].path),
        flash_model: first_model(&request.flash),
        capacity: request
            .capacity
            .first()
            .map(|device| canonical(&device.path)),
        capacity_model: first_model(&request.capacity),
        flash_devices: paths(&request.flash),
        capacity_devices: paths(&request.capacity),
        capacity_object_store: None,
        redundancy: Some(request.redundancy.name().to_string()),
    };
    crate::store::write_description(data_dir, &description)
}

/// Opens the pool described in `data_dir`, each device behind the model
/// `pool.toml` names (built-in parameters).
pub async fn open_pool(data_dir: &Path, limits: PoolLimits) -> anyhow::Result<OpenedPool> {
    open_pool_with_models(data_dir, limits, &DeviceModels::default()).await
}

/// Opens the pool described in `data_dir`, with the daemon config's model
/// overrides and definitions: on plain devices, or on arrays.
pub async fn open_pool_with_models(
    data_dir: &Path,
    limits: PoolLimits,
    models: &DeviceModels,
) -> anyhow::Result<OpenedPool> {
    let description = crate::store::existing_description(data_dir)?;
    let tier_models = crate::store::tier_models(&description, models)?;
    if description.redundancy.is_some() {
        return open_array_pool(&description, limits, tier_models).await;
    }
    crate::store::open_plain_pool(
        data_dir,
        &description,
        limits,
        tier_models,
        &models.object_store,
    )
    .await
}

/// Opens an array pool from its description: each tier's devices that exist
/// are assembled by their labels (order and paths do not matter; the array
/// names what is missing or stale).
async fn open_array_pool(
    description: &PoolDescription,
    limits: PoolLimits,
    models: [Option<RotatingDiskModel>; 2],
) -> anyhow::Result<OpenedPool> {
    let [flash_model, capacity_model] = models;
    let flash = assemble_tier(TierRole::Flash, &description.flash_devices, flash_model).await?;
    let capacity = match description.capacity_devices.is_empty() {
        true => None,
        false => Some(
            assemble_tier(
                TierRole::Capacity,
                &description.capacity_devices,
                capacity_model,
            )
            .await?,
        ),
    };
    let mut options = PoolOptions::default();
    let (device, layout) = pool_device(flash, capacity, &mut options);
    let pool = Pool::open(device, limits)
        .await
        .with_context(|| lost_devices(&layout))?;
    if let Some(state) = layout.state() {
        tracing::info!(state = state.name(), "array pool opened");
    }
    Ok(OpenedPool { pool, layout })
}

/// The devices out of use, for an open that failed: which to bring back.
fn lost_devices(layout: &PoolLayout) -> String {
    let lost: Vec<String> = layout
        .tiers()
        .iter()
        .flat_map(|tier| tier.array.member_status())
        .filter(|member| {
            !member.state.is_usable() && member.state != lamina_layout::MemberState::Removed
        })
        .map(|member| format!("{} ({})", member.path, member.state.name()))
        .collect();
    match lost.len() {
        0 => "cannot open the pool".to_owned(),
        count => format!(
            "cannot open the pool: {count} are missing or faulted: {}",
            lost.join(", ")
        ),
    }
}

async fn assemble_tier(
    tier: TierRole,
    paths: &[PathBuf],
    model: Option<RotatingDiskModel>,
) -> anyhow::Result<Arc<RedundantArray>> {
    let mut members = Vec::new();
    for path in paths {
        if !path.exists() {
            tracing::error!(tier = tier.name(), path = %path.display(), "array device missing");
            continue;
        }
        members.push(member(path, None, model.clone())?);
    }
    let assembled = lamina_layout::assemble(tier, members)
        .await
        .with_context(|| format!("cannot open the {} tier's array", tier.name()))?;
    for excluded in &assembled.excluded {
        tracing::error!(
            tier = tier.name(),
            path = %excluded.path,
            reason = %excluded.reason,
            "array device left out"
        );
    }
    Ok(Arc::new(assembled.array))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_whole_rows_of_both_tiers() {
        let four_mib = 4 << 20;
        assert_eq!(segment_size_for_rows(four_mib, 4, 1), four_mib);
        assert_eq!(segment_size_for_rows(four_mib, 3, 1), 1026 * 4096);
        assert_eq!(segment_size_for_rows(four_mib, 4, 6), 1032 * 4096);
    }
}
