//! Helpers shared by the engine's integration tests: finding the newest
//! checkpoint slot on a memory device, and corrupting it so that recovery must
//! fall back to the older checkpoint.

#![allow(dead_code)]

use lamina_device::MemoryDevice;
use lamina_engine::log::checkpoint::Slot;
use lamina_engine::log::geometry::CHECKPOINT_SLOT_BLOCKS;

const BLOCK: usize = 4096;

/// The valid slot with the highest checkpoint sequence, and its device block.
pub fn newest_slot(memory: &MemoryDevice) -> (u64, Slot) {
    CHECKPOINT_SLOT_BLOCKS
        .iter()
        .filter_map(|block| {
            let mut bytes = vec![0u8; BLOCK];
            memory.read_sync(block * BLOCK as u64, &mut bytes);
            Slot::decode(&bytes).ok().map(|slot| (*block, slot))
        })
        .max_by_key(|(_, slot)| slot.checkpoint_sequence)
        .expect("a valid checkpoint slot")
}

/// Flips a bit in the newest checkpoint slot, so that recovery must fall back to
/// the previous checkpoint and replay everything after it.
pub fn corrupt_newest_checkpoint_slot(memory: &MemoryDevice) {
    let (block, _) = newest_slot(memory);
    let mut bytes = vec![0u8; BLOCK];
    memory.read_sync(block * BLOCK as u64, &mut bytes);
    bytes[30] ^= 0x10;
    memory.write_sync(block * BLOCK as u64, &bytes);
}
