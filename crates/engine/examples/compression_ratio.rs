//! `cargo run --release -p lamina-engine --example compression_ratio -- IMAGE [CODEC...]`:
//! issue 44's goal 1 on a real image. The image is written through the
//! engine, in process, into a volume that compresses with each codec in turn
//! (a fresh pool on a memory device each), and the device blocks that hold
//! the volume's data (every block a mapped location touches, × 4096: the
//! fragments' headers, their rounding to units and the holes between them
//! included) and the pool's stored bytes (the segment table's live units ×
//! 16: fragments and whole blocks without the space between them) are
//! compared with the sum of the codec's output for
//! each non-zero 4 KiB block compressed alone (what a perfect packer with no
//! headers, no rounding and no layout waste would store: a block whose
//! output saves less than 1/8 counted at 4096, as the engine stores it).
//! Zero blocks are not stored by either. Also reports the write time per
//! block in process (one task, no NBD), for each codec and `off`.

use std::sync::Arc;
use std::time::Instant;

use lamina_device::MemoryDevice;
use lamina_engine::{BLOCK_BYTES, BLOCK_SIZE_BYTES, Codec, Pool, PoolLimits, PoolOptions};
use lamina_reduction::{BlockCompressor, StoredForm};

/// Bytes written per call.
const WRITE_BYTES: usize = 1 << 20;
const SEGMENT_SIZE_BYTES: u64 = 4 << 20;
/// The pool's room beyond the image: the log's summaries and checkpoints.
const SPARE_BYTES: u64 = 256 << 20;

struct Outcome {
    codec: Codec,
    nonzero_blocks: u64,
    stored_bytes: u64,
    holding_bytes: u64,
    alone_bytes: u64,
    seconds: f64,
}

fn main() {
    let mut arguments = std::env::args().skip(1);
    let image = arguments
        .next()
        .expect("usage: compression_ratio IMAGE [CODEC...]");
    let mut codecs: Vec<Codec> = arguments
        .map(|name| name.parse().expect("a codec"))
        .collect();
    if codecs.is_empty() {
        codecs = ["off", "lz4", "zstd:1", "zstd:3"]
            .map(|name| name.parse().unwrap())
            .to_vec();
    }
    let bytes = std::fs::read(&image).expect("the image reads");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    println!("image {image}: {} MiB", bytes.len() >> 20);
    println!(
        "| codec | non-zero blocks | blocks holding data, MiB | stored MiB | alone MiB | holding ÷ alone | stored ÷ alone | ratio (logical ÷ holding) | ratio alone | µs per block written |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for codec in codecs {
        let outcome = runtime.block_on(measure(&bytes, codec));
        let logical = outcome.nonzero_blocks as f64 * BLOCK_SIZE_BYTES as f64;
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.4} | {:.4} | {:.3} | {:.3} | {:.2} |",
            outcome.codec,
            outcome.nonzero_blocks,
            outcome.holding_bytes as f64 / 1048576.0,
            outcome.stored_bytes as f64 / 1048576.0,
            outcome.alone_bytes as f64 / 1048576.0,
            outcome.holding_bytes as f64 / outcome.alone_bytes as f64,
            outcome.stored_bytes as f64 / outcome.alone_bytes as f64,
            logical / outcome.holding_bytes as f64,
            logical / outcome.alone_bytes as f64,
            outcome.seconds * 1e6 / outcome.nonzero_blocks as f64,
        );
    }
}

async fn measure(bytes: &[u8], codec: Codec) -> Outcome {
    let device_bytes = (bytes.len() as u64).next_multiple_of(SEGMENT_SIZE_BYTES) + SPARE_BYTES;
    let memory = Arc::new(MemoryDevice::new(device_bytes));
    let options = PoolOptions {
        segment_size_bytes: SEGMENT_SIZE_BYTES,
        ..PoolOptions::default()
    };
    let limits = PoolLimits {
        memory_cache_bytes: 0,
        ..PoolLimits::default()
    };
    let pool = Pool::create(memory, options, limits).await.expect("a pool");
    let volume_bytes = (bytes.len() as u64).next_multiple_of(BLOCK_SIZE_BYTES);
    let volume = pool
        .create_volume_with_compression("image", volume_bytes, codec)
        .await
        .expect("a volume");
    let started = Instant::now();
    for (index, chunk) in bytes.chunks(WRITE_BYTES).enumerate() {
        let offset = (index * WRITE_BYTES) as u64;
        pool.write(volume.volume_id, offset, chunk, false)
            .await
            .expect("a write");
    }
    pool.flush().await.expect("a flush");
    let seconds = started.elapsed().as_secs_f64();
    let stored_bytes: u64 = pool
        .segment_table()
        .segments
        .iter()
        .map(|segment| u64::from(segment.live_units) * 16)
        .sum();
    let mut holding = std::collections::HashSet::new();
    for logical_block in 0..volume_bytes / BLOCK_SIZE_BYTES {
        if let Some(location) = pool.location_of(volume.volume_id, logical_block) {
            for block in location.block()..location.block() + u64::from(location.block_count()) {
                holding.insert(block);
            }
        }
    }
    let holding_bytes = holding.len() as u64 * BLOCK_SIZE_BYTES;
    pool.close().await.expect("a close");
    let (nonzero_blocks, alone_bytes) = compressed_alone(bytes, codec);
    Outcome {
        codec,
        nonzero_blocks,
        stored_bytes,
        holding_bytes,
        alone_bytes,
        seconds,
    }
}

/// Non-zero blocks, and the sum of the codec's output for each alone (4096
/// for a block it would store as is).
fn compressed_alone(bytes: &[u8], codec: Codec) -> (u64, u64) {
    let mut compressor = BlockCompressor::new(codec).expect("a compressor");
    let (mut blocks, mut stored) = (0u64, 0u64);
    for block in bytes.chunks(BLOCK_BYTES) {
        if block.iter().all(|byte| *byte == 0) {
            continue;
        }
        blocks += 1;
        let mut padded = [0u8; BLOCK_BYTES];
        padded[..block.len()].copy_from_slice(block);
        stored += match compressor.compress(&padded).expect("compression") {
            StoredForm::Compressed(output) => output.len() as u64,
            StoredForm::AsIs(_) => BLOCK_SIZE_BYTES,
        };
    }
    (blocks, stored)
}
