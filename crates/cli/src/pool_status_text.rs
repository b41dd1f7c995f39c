//! The text of `lamina pool status`, which `pool create` and `pool restore`
//! print too: one line per figure, then the sections that only appear when
//! they have something to say (a capacity tier, a suspension, damage, a scrub,
//! a rebuild, an array's layout, an object tier, a full device, a failure).

use lamina_api::{IntegrityStatus, PoolStatus, TierSpace};
use lamina_control::size::format_size;

use crate::{device_commands, json_name, pool_commands};

pub fn print_status(status: &PoolStatus) {
    print_space(status);
    if let Some(capacity) = &status.capacity {
        print_tiers(status, capacity);
    }
    print_conditions(status);
}

/// Space, volumes, write amplification and the cleaner: lines every pool has.
fn print_space(status: &PoolStatus) {
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
        "compression          {} (logical {}, stored {})",
        crate::volume_commands::format_ratio(status.compress_ratio),
        format_size(status.logical_bytes),
        format_size(status.stored_bytes)
    );
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
    print_flush_stages(&status.flush_stages);
}

/// The flushes since the pool opened and the mean time a device flush
/// spent in each stage.
fn print_flush_stages(flushes: &lamina_api::FlushStages) {
    print!(
        "flushes              {} device flushes, {} covered by another",
        flushes.device_flushes, flushes.covered_flushes
    );
    if flushes.device_flushes > 0 {
        let means: Vec<String> = flushes
            .stages()
            .iter()
            .map(|(name, microseconds)| {
                format!(
                    "{} {}",
                    name.replace('_', " "),
                    microseconds / flushes.device_flushes
                )
            })
            .collect();
        print!("; mean µs: {}", means.join(", "));
    }
    if flushes.batches_sealed_at_write > 0 {
        print!(
            "; {} batches written at their write",
            flushes.batches_sealed_at_write
        );
    }
    println!();
}

/// Each tier's space and the moves between them, in a two-tier pool.
fn print_tiers(status: &PoolStatus, capacity: &TierSpace) {
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

/// What the pool is going through or has found: lines that appear only when
/// there is something to say, and the damage line that always does.
fn print_conditions(status: &PoolStatus) {
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
