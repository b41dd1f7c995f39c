//! Block contents and writes the engine's tests share: contents that name
//! their block and generation (so that a read of the wrong block or an older
//! version is caught), writes of ranges of them, and the random writes and
//! whole-volume checks of the tests on arrays (`array.rs`,
//! `distributed_spare.rs`).

#![allow(clippy::cast_possible_truncation)]

use lamina_engine::{BLOCK_SIZE_BYTES, Pool};
use rand::{Rng, SeedableRng};

const BLOCK: usize = 4096;

/// Writes `count` random blocks at random places, flushing now and then.
pub async fn write_random(
    pool: &Pool,
    volume_id: u32,
    blocks: &mut [Vec<u8>],
    count: usize,
    seed: u64,
) {
    let mut random = rand::rngs::SmallRng::seed_from_u64(seed);
    for index in 0..count {
        let block = random.random_range(0..blocks.len());
        let data: Vec<u8> = (0..BLOCK).map(|_| random.random()).collect();
        pool.write(volume_id, (block * BLOCK) as u64, &data, false)
            .await
            .unwrap();
        blocks[block] = data;
        if index % 7 == 0 {
            pool.flush().await.unwrap();
        }
    }
    pool.flush().await.unwrap();
}

pub async fn check(pool: &Pool, volume_id: u32, blocks: &[Vec<u8>], when: &str) {
    let mut contents = vec![0_u8; blocks.len() * BLOCK];
    pool.read(volume_id, 0, &mut contents)
        .await
        .unwrap_or_else(|error| panic!("{when}: {error}"));
    for (index, expected) in blocks.iter().enumerate() {
        assert!(
            contents[index * BLOCK..(index + 1) * BLOCK] == expected[..],
            "{when}: block {index}"
        );
    }
}

/// A block's contents that name it: `block` in the first 8 bytes,
/// `generation` in every other byte.
pub fn block_contents(block: u64, generation: u8) -> Vec<u8> {
    let mut contents = vec![generation; BLOCK];
    contents[..8].copy_from_slice(&block.to_le_bytes());
    contents
}

/// A block's contents that name it with a 32-bit version: `block`, then
/// `version`, then a byte made of both.
pub fn versioned_contents(block: u64, version: u32) -> Vec<u8> {
    let mut contents = vec![0u8; BLOCK];
    contents[..8].copy_from_slice(&block.to_le_bytes());
    contents[8..12].copy_from_slice(&version.to_le_bytes());
    contents[12..].fill((block as u8) ^ (version as u8).wrapping_mul(31));
    contents
}

/// Writes `blocks` of `volume` with [`block_contents`] of `generation`, one
/// write per block, without a flush.
pub async fn write_blocks(pool: &Pool, volume: u32, blocks: std::ops::Range<u64>, generation: u8) {
    for block in blocks {
        pool.write(
            volume,
            block * BLOCK_SIZE_BYTES,
            &block_contents(block, generation),
            false,
        )
        .await
        .unwrap();
    }
}

/// Writes `blocks` of `volume` with [`block_contents`] of `generation`, 32
/// blocks a write, then flushes.
pub async fn write_blocks_flushed(
    pool: &Pool,
    volume: u32,
    blocks: std::ops::Range<u64>,
    generation: u8,
) {
    for chunk_start in blocks.clone().step_by(32) {
        let chunk_end = (chunk_start + 32).min(blocks.end);
        let mut data = Vec::with_capacity((chunk_end - chunk_start) as usize * BLOCK);
        for block in chunk_start..chunk_end {
            data.extend_from_slice(&block_contents(block, generation));
        }
        pool.write(volume, chunk_start * BLOCK_SIZE_BYTES, &data, false)
            .await
            .unwrap();
    }
    pool.flush().await.unwrap();
}
