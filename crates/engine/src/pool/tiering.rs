//! The demoter of a two-tier pool: keeps a share of flash free
//! (`tier_flash_free_percent`), so that bursts of writes and promotions find
//! room on flash without a writer ever waiting for a demotion to the slow tier.
//! It cleans the oldest flash segments, which demotes their cold blocks and
//! keeps their hot ones on flash (see `tier::heat`), then flushes, which frees
//! the emptied segments (decision 0006), and takes a checkpoint only for those
//! written since the older checkpoint. The paced cleaner and a blocked
//! writer's reclaim call the same `clean`, so all three agree on what moves.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::state::{Allocation, SegmentState, State};
use super::{Inner, Pool};
use crate::error::EngineError;
use crate::log::geometry::Tier;

/// Flash victims cleaned per look at most, so that the demoter yields to the
/// writers it competes with for the state lock and the devices.
const DEMOTION_VICTIMS_PER_LOOK_MAX: usize = 2;

/// Dead flash segments that wait for a checkpoint at most while flash is under
/// its free target (each checkpoint writes the whole map, so it is shared).
const DEAD_SEGMENTS_PER_CHECKPOINT_MAX: usize = 4;

/// Free flash segments the demoter keeps: the target share of flash, and at
/// least enough for the clients' reserve plus room for promotions.
pub(crate) fn flash_free_target_segment_count(state: &State, free_percent: u8) -> usize {
    let flash_segments = state.geometry.flash_segment_count as usize;
    let share = flash_segments * usize::from(free_percent.min(90)) / 100;
    share.max(state.reserve_for(Allocation::Client) + super::PROMOTION_HEADROOM_SEGMENT_COUNT + 2)
}

/// Dead flash segments that a checkpoint can free (their death is sealed).
fn freeable_dead_flash_segment_count(state: &State) -> usize {
    state
        .segments
        .iter()
        .enumerate()
        .filter(|(index, segment)| {
            matches!(segment.state, SegmentState::Dead { died_at } if died_at <= state.sealed_through)
                && state.geometry.tier_of_segment(*index as u32) == Tier::Flash
        })
        .count()
}

impl Pool {
    /// Starts the demoter in a two-tier pool. It stops when the pool is
    /// closed, abandoned or dropped.
    pub(crate) fn start_demoter(&self) {
        if !self.inner.geometry.has_capacity_tier()
            || self.inner.limits.tier_flash_free_percent == 0
        {
            return;
        }
        let interval = Duration::from_millis(self.inner.limits.tier_demotion_interval_ms.max(1));
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.shutdown.load(std::sync::atomic::Ordering::Acquire) {
                    return;
                }
                let pool = Pool { inner };
                if pool.inner.lock().failed.is_some() {
                    return;
                }
                match pool.demote_once().await {
                    Ok(()) | Err(EngineError::NoSpace) => {}
                    Err(error) => tracing::error!(%error, "demotion failed"),
                }
            }
        });
    }

    /// One look: clean flash victims while free flash is under its target,
    /// then checkpoint if that frees enough.
    async fn demote_once(&self) -> Result<(), EngineError> {
        let free_percent = self.inner.limits.tier_flash_free_percent;
        let short = |state: &mut State| {
            state.free_reusable_dead_segments();
            state.free_segments.len() + freeable_dead_flash_segment_count(state)
                < flash_free_target_segment_count(state, free_percent)
        };
        if !short(&mut self.inner.lock()) {
            return Ok(());
        }
        if self.clean(DEMOTION_VICTIMS_PER_LOOK_MAX).await? > 0 {
            // The victims' deaths become durable, which frees those that both
            // checkpoints cover.
            self.flush().await?;
            self.inner.lock().free_reusable_dead_segments();
        }
        let checkpoint_due = {
            let state = self.inner.lock();
            let dead = freeable_dead_flash_segment_count(&state);
            let target = flash_free_target_segment_count(&state, free_percent);
            dead > 0
                && (dead >= DEAD_SEGMENTS_PER_CHECKPOINT_MAX
                    || state.free_segments.len() < target / 2 + 1)
        };
        if checkpoint_due {
            self.checkpoint().await?;
        }
        Ok(())
    }
}
