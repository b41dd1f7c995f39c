//! Random block writes and whole-volume checks for the engine tests on
//! arrays (`array.rs`, `distributed_spare.rs`).

use lamina_engine::Pool;
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
