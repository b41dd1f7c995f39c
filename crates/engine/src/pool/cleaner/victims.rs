//! Choosing what the cleaner cleans next: cost-benefit (or greedy) scores of
//! sealed segments, and the FIFO order of a two-tier pool's flash.

use crate::log::geometry::Tier;
use crate::pool::core::state::State;
use crate::pool::space::SegmentState;

/// Segments fuller than this fraction are never worth cleaning.
pub const VICTIM_UTILIZATION_MAX: f64 = 0.97;

/// How victims are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VictimPolicy {
    /// `(1 - u) × √age / (1 + u)`: lets young segments die further and takes
    /// old ones at a higher live fraction. The square root weighs age less than
    /// the classic `(1 - u) × age / (1 + u)`, which with several cleaner streams
    /// recleaned the coldest segments at ~72% live (measured: Zipf(0.99) write
    /// amplification 2.76 instead of 2.89 counting relocations only).
    CostBenefit,
    /// Emptiest first. Measured worse than cost-benefit on skewed (Zipf)
    /// overwrites and no better on uniform ones
    /// (`lamina bench engine-write-amplification`), so blocked writers use
    /// cost-benefit too; kept for comparison.
    Greedy,
}

impl VictimPolicy {
    /// How much a sealed segment is worth cleaning, higher first: `utilization`
    /// is its live fraction and `age` (at least 1) how long since it was last
    /// written. Pure, so that models of the cleaner (crates/model) score
    /// victims as the engine does.
    pub fn score(self, utilization: f64, age: f64) -> f64 {
        match self {
            VictimPolicy::CostBenefit => (1.0 - utilization) * age.sqrt() / (1.0 + utilization),
            VictimPolicy::Greedy => 1.0 - utilization,
        }
    }
}

/// Sealed segments worth cleaning, best first by `policy`, with `u` the live
/// fraction and `age` the number of batches appended since the segment was
/// last written (relocated data is young by this measure; estimating its age
/// from its victim's instead was measured worse).
pub fn pick_victims(state: &State, count: usize, policy: VictimPolicy) -> Vec<u32> {
    pick_victims_in(state, Tier::Flash, count, policy)
}

/// [`pick_victims`] among the segments of one tier (flash is every segment of
/// a one-tier pool).
///
/// The flash tier of a two-tier pool is different: it is a FIFO (see
/// `tier::heat`), cleaned oldest first whatever its live fraction, because
/// cleaning it demotes the cold blocks and so frees flash even when every
/// block is live.
pub fn pick_victims_in(state: &State, tier: Tier, count: usize, policy: VictimPolicy) -> Vec<u32> {
    let now = state.writer().next_batch_sequence();
    let now_blocks = state.client_blocks_written();
    let fifo = tier == Tier::Flash && state.geometry().has_capacity_tier();
    let mut scored: Vec<(f64, u32)> = state
        .space()
        .segments_of(tier)
        .filter(|(_, segment)| segment.state == SegmentState::Sealed && !segment.set_aside)
        .filter_map(|(index, segment)| {
            // Of the blocks the segment's layout holds (fewer on an array
            // narrowed after a loss).
            let segment_blocks = f64::from(state.shapes().shape(index).size_blocks);
            let utilization = f64::from(segment.live_blocks()) / segment_blocks;
            if fifo {
                // Oldest first: batch sequences keep the order across restarts.
                let age = now.saturating_sub(segment.last_batch_sequence) as f64 + 1.0;
                return Some((age, index));
            }
            if utilization > VICTIM_UTILIZATION_MAX {
                return None;
            }
            let age = now_blocks.saturating_sub(state.placement().last_written_at_blocks(index))
                as f64
                + 1.0;
            Some((policy.score(utilization, age), index))
        })
        .collect();
    scored.sort_by(|left, right| right.0.total_cmp(&left.0));
    scored
        .into_iter()
        .take(count)
        .map(|(_, index)| index)
        .collect()
}
