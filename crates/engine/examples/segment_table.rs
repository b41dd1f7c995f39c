//! Prints a pool's segments as recovery rebuilt them: how many are in each
//! state, the live blocks of the sealed ones, the free list against the
//! clients' reserve, and what the cleaner would take next; then, with
//! `--write-blocks N`, tries N random 4 KiB overwrites of the first volume and
//! prints the table again. `--walk 59,62` first prints those segments' batch
//! chains as the device holds them (and, with `--open yes`, where their
//! blocks are mapped after recovery). A diagnostic for pools that fill up or
//! wedge (issue 16). Opening recovers the pool, which writes checkpoints: run
//! it on a copy.
//!
//!     cargo run --release -p lamina-engine --example segment_table -- \
//!         --device COPY.img [--write-blocks 0] [--walk SEGMENTS [--open yes]]

// This example is moving into `lamina bench` on another branch; until then it
// keeps its `as` casts (issue 17 converts the library and binaries).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::collections::BTreeMap;
use std::sync::Arc;

use lamina_device::{FileDevice, FileDeviceOptions};
use lamina_engine::pool::space::SegmentState;
use lamina_engine::{Pool, PoolLimits};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[path = "common/mod.rs"]
mod common;
use common::argument;

const BLOCK: u64 = 4096;

fn print_table(pool: &Pool, label: &str) {
    let table = pool.segment_table();
    let segment_blocks = pool.status().segment_size_bytes / BLOCK;
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    let mut live_histogram: BTreeMap<u64, usize> = BTreeMap::new();
    let mut live_total = 0u64;
    for (index, segment) in table.segments.iter().enumerate() {
        let name = match segment.state {
            SegmentState::Dead { died_at } => {
                println!(
                    "  dead segment {index}: died_at {died_at} last_batch {} needed_by_replay {}",
                    segment.last_batch_sequence, segment.needed_by_replay
                );
                "dead".to_string()
            }
            SegmentState::Checkpoint { .. } => "checkpoint".to_string(),
            other => format!("{other:?}").to_lowercase(),
        };
        *by_state.entry(name).or_default() += 1;
        if segment.state == SegmentState::Sealed {
            let tenth = u64::from(segment.live_blocks) * 10 / segment_blocks;
            *live_histogram.entry(tenth * 10).or_default() += 1;
            live_total += u64::from(segment.live_blocks);
        }
        if segment.state == SegmentState::Sealed
            && u64::from(segment.live_blocks) < segment_blocks / 10
        {
            println!(
                "  sealed segment {index}: {} live blocks, last batch {}",
                segment.live_blocks, segment.last_batch_sequence
            );
        }
    }
    println!("== {label}");
    let mut epochs: BTreeMap<u64, usize> = BTreeMap::new();
    for segment in &table.segments {
        *epochs.entry(segment.last_batch_sequence >> 24).or_default() += 1;
    }
    println!("segments by last batch sequence / 2^24 (the recovery they follow): {epochs:?}");
    println!("segments by state: {by_state:?}");
    println!("sealed segments by live percent (floor to 10): {live_histogram:?}");
    println!(
        "live blocks in sealed segments: {live_total} ({:.1} segments' worth)",
        live_total as f64 / segment_blocks as f64
    );
    println!(
        "free segments: {} {:?}; clients' reserve {}; covered by both checkpoints {}; durable through {}",
        table.free_segments.len(),
        table.free_segments,
        table.client_reserve_segment_count,
        table.covered_by_every_checkpoint,
        table.durable_through
    );
    for segment_index in &table.free_segments {
        let segment = table.segments[*segment_index as usize];
        println!(
            "  free segment {segment_index}: last_batch {} (settled: {})",
            segment.last_batch_sequence,
            segment.last_batch_sequence <= table.covered_by_every_checkpoint
        );
    }
    let victims = pool.victim_order(8);
    let victim_live: Vec<(u32, u32)> = victims
        .iter()
        .map(|victim| (*victim, table.segments[*victim as usize].live_blocks))
        .collect();
    println!("next victims (segment, live blocks): {victim_live:?}");
    let status = pool.status();
    println!(
        "status: used {} MiB free {} MiB reserved {} MiB cleaner {:?} pressure {:.2} relocated {}",
        status.used_bytes >> 20,
        status.free_bytes >> 20,
        status.reserved_bytes >> 20,
        status.cleaner_state,
        status.cleaner_pressure,
        status.cleaner_relocated_blocks
    );
}

/// Prints where the blocks that the batch whose summary is at device block
/// `summary_block` wrote are mapped now, counted by segment.
fn print_homes(
    pool: &Pool,
    geometry: &lamina_engine::log::geometry::Geometry,
    summary: &lamina_engine::log::batch::Summary,
    summary_block: u64,
) {
    let mut homes: BTreeMap<String, usize> = BTreeMap::new();
    let data_targets = summary
        .records
        .iter()
        .filter_map(|record| record.data_target());
    for (data_index, (volume_id, logical_block)) in data_targets.enumerate() {
        let here = summary_block + 1 + data_index as u64;
        let home = match pool.physical_block_of(volume_id, logical_block) {
            None => "unmapped".to_string(),
            Some(block) if block == here => "here".to_string(),
            Some(block) => format!("segment {}", geometry.segment_of(block)),
        };
        *homes.entry(home).or_default() += 1;
    }
    println!("    now mapped: {homes:?}");
}

/// Prints the batch chain of each segment in `--walk 1,2,3` as the device
/// holds it (read before recovery writes anything), walked as recovery and the
/// cleaner walk it (`log::chain`).
fn walk_segments(path: &str, segments: &[u32], pool: Option<&Pool>) {
    use lamina_engine::log::chain::{self, InMemorySegment};
    use lamina_engine::log::superblock::Superblock;
    let bytes = std::fs::read(path).expect("read the device");
    let (_, superblock) = Superblock::decode(&bytes[..BLOCK as usize]).expect("superblock");
    let geometry = superblock.geometry;
    for segment in segments {
        let first = geometry.segment_first_block(*segment);
        let start = (first * BLOCK) as usize;
        let end = start + geometry.segment_size_bytes() as usize;
        let mut source = InMemorySegment::new(&bytes[start..end]);
        let walked = futures::executor::block_on(chain::walk(
            &mut source,
            geometry.segment_size_blocks as u32,
            0,
            None,
        ));
        let Ok(walked) = walked;
        println!("segment {segment}:");
        for damaged in &walked.damaged {
            println!("  damaged range: {damaged:?}");
        }
        for batch in &walked.batches {
            let summary = &batch.summary;
            let kinds: BTreeMap<String, usize> =
                summary
                    .records
                    .iter()
                    .fold(BTreeMap::new(), |mut kinds, record| {
                        let kind = format!("{record:?}");
                        let kind = kind.split([' ', '{']).next().unwrap_or("").to_string();
                        *kinds.entry(kind).or_default() += 1;
                        kinds
                    });
            println!(
                "  block {}: segment sequence {} batch {} flushed through {} records {kinds:?}{}",
                batch.block_in_segment,
                summary.segment_sequence,
                summary.batch_sequence,
                summary.flushed_through_sequence,
                if batch.from_copy {
                    " (from its copy)"
                } else {
                    ""
                }
            );
            if let Some(pool) = pool {
                print_homes(
                    pool,
                    &geometry,
                    summary,
                    first + u64::from(batch.block_in_segment),
                );
            }
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = argument("--device", "");
    assert!(!path.is_empty(), "--device COPY.img is required");
    let write_blocks: u64 = argument("--write-blocks", "0").parse()?;
    let walk: Vec<u32> = argument("--walk", "")
        .split(',')
        .filter(|item| !item.is_empty())
        .map(|item| item.parse().expect("--walk takes segment numbers"))
        .collect();
    if !walk.is_empty() {
        walk_segments(&path, &walk, None);
        if argument("--open", "no") == "no" {
            return Ok(());
        }
    }
    let device = FileDevice::open(std::path::Path::new(&path), FileDeviceOptions::default())?;
    let pool = Pool::open(Arc::new(device), PoolLimits::default()).await?;
    print_table(&pool, "after recovery");
    if !walk.is_empty() {
        walk_segments(&path, &walk, Some(&pool));
    }
    if write_blocks > 0 {
        let volume = pool.list_volumes().into_iter().next().expect("a volume");
        let volume_id = pool.volume_id(&volume.name)?;
        let block_count = volume.size_bytes / BLOCK;
        let mut random = SmallRng::seed_from_u64(1);
        let mut data = vec![0u8; BLOCK as usize];
        let mut written = 0u64;
        let mut failure = None;
        for _ in 0..write_blocks {
            random.fill(&mut data[..]);
            let logical = random.random_range(0..block_count);
            match pool.write(volume_id, logical * BLOCK, &data, false).await {
                Ok(()) => written += 1,
                Err(error) => {
                    failure = Some(error.to_string());
                    break;
                }
            }
        }
        if failure.is_none() {
            pool.flush().await?;
        }
        println!("wrote {written} of {write_blocks} blocks; failure: {failure:?}");
        print_table(&pool, "after the writes");
    }
    pool.close().await?;
    Ok(())
}
