//! The demoter of a two-tier pool: keeps a share of flash free
//! (`tier_flash_free_percent`), so that bursts of writes and promotions find
//! room on flash without a writer ever waiting for a demotion to the slow tier.
//! It cleans the oldest flash segments, which demotes their cold blocks and
//! keeps their hot ones on flash (see `tier::heat`), then flushes, which frees
//! the emptied segments (decision 0006), and takes a checkpoint only for those
//! written since the older checkpoint. The paced cleaner and a blocked
//! writer's reclaim call the same `clean`, so all three agree on what moves.
//! Each clean first waits for the background budget (`budget`) to allow the
//! victims' live bytes: demotion is background work like any other. While
//! the capacity tier's writes are suspended (`capacity_writes`), each look
//! only retries its flush when due, and demotes nothing.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::EngineError;
use crate::pool::background::periodic::{Periodic, spawn_periodic};
use crate::pool::budget::BackgroundWork;
use crate::pool::checkpoint::Checkpointer;
use crate::pool::cleaner::{Cleaner, next_victims_live_bytes};
use crate::pool::core::Core;
use crate::pool::core::limits::TIER_FLASH_FREE_PERCENT_MAX;
use crate::pool::core::state::State;
use crate::pool::space::Allocation;

/// Flash victims cleaned per look at most, so that the demoter yields to the
/// writers it competes with for the state lock and the devices.
const DEMOTION_VICTIMS_PER_LOOK_MAX: usize = 2;

/// Time between the demoter's checkpoints at least: a checkpoint writes the
/// whole map, and frees only dead segments written since the older one (the
/// others are freed by flushes), so it is shared by all that died meanwhile.
const DEMOTER_CHECKPOINT_INTERVAL_MS: u64 = 250;

/// Free flash segments the demoter keeps: the target share of flash, and at
/// least enough for the clients' reserve plus room for promotions.
pub(crate) fn flash_free_target_segment_count(state: &State, free_percent: u8) -> usize {
    debug_assert!(
        free_percent <= TIER_FLASH_FREE_PERCENT_MAX,
        "PoolLimits::validate refuses more"
    );
    let flash_segments = crate::convert::to_usize(state.geometry().flash_segment_count);
    let share = flash_segments * usize::from(free_percent) / 100;
    share.max(
        state.space().reserve_for(Allocation::Client)
            + crate::pool::io::read::PROMOTION_HEADROOM_SEGMENT_COUNT
            + 2,
    )
}

/// The demoter's state between two looks at free flash.
pub(in crate::pool) struct Demoter {
    /// When the demoter last took a checkpoint.
    last_checkpoint: Option<Instant>,
}

impl Periodic for Demoter {
    const NAME: &'static str = "demotion";

    async fn step(&mut self, core: &Arc<Core>) -> Result<(), EngineError> {
        self.demote_once(core).await
    }
}

impl Demoter {
    /// Starts the demoter in a two-tier pool. It stops when the pool is
    /// closed, abandoned, dropped or failed.
    pub(in crate::pool) fn start(core: &Arc<Core>) {
        if !core.geometry().has_capacity_tier() || core.limits().tier_flash_free_percent == 0 {
            return;
        }
        spawn_periodic(
            core,
            core.limits().tier_demotion_interval_ms,
            Demoter {
                last_checkpoint: None,
            },
        );
    }

    /// Cleans up to `DEMOTION_VICTIMS_PER_LOOK_MAX` flash victims once the
    /// background budget allows their live bytes (asked for holding no
    /// lock). Returns how many were emptied.
    async fn demote_victims(core: &Arc<Core>) -> Result<usize, EngineError> {
        let bytes = next_victims_live_bytes(&core.lock(), DEMOTION_VICTIMS_PER_LOOK_MAX);
        core.budget().acquire(BackgroundWork::Demoter, bytes).await;
        // The pool may have been closed while this waited: a closed pool's
        // device may already belong to the next open.
        if core.background_stopped() {
            return Ok(0);
        }
        Cleaner::new(core)
            .clean(DEMOTION_VICTIMS_PER_LOOK_MAX)
            .await
    }

    /// One look: while free flash is under its target, free what flushes
    /// free, clean flash victims (which demotes their cold blocks), and take a
    /// checkpoint (at most one per `DEMOTER_CHECKPOINT_INTERVAL_MS`) for dead
    /// segments that only a checkpoint frees.
    async fn demote_once(&mut self, core: &Arc<Core>) -> Result<(), EngineError> {
        // Demotion pauses while the capacity tier cannot make its writes
        // durable, and resumes once a retry finds it back (decision 0032).
        if !core.retry_capacity_writes_when_due().await {
            return Ok(());
        }
        let free_percent = core.limits().tier_flash_free_percent;
        // Free segments, and dead ones whose death a sealed batch covers.
        let look = |state: &mut State| {
            state.free_reusable_dead_segments();
            (
                state.space().free_flash_segment_count(),
                state.sealed_dead_flash_segment_counts(),
                flash_free_target_segment_count(state, free_percent),
            )
        };
        let (free, dead, target) = look(&mut core.lock());
        if free >= target {
            return Ok(());
        }
        if free + dead.total() < target && Self::demote_victims(core).await? > 0 {
            // The victims' deaths become durable, which frees those that both
            // checkpoints cover.
            core.flush_all().await?;
        }
        let (mut free, mut dead, target) = look(&mut core.lock());
        if free < target && dead.awaiting_flush > 0 {
            // Deaths that are not durable yet need a flush, not a checkpoint.
            core.flush_all().await?;
            (free, dead, _) = look(&mut core.lock());
        }
        let checkpoint_allowed = self
            .last_checkpoint
            .is_none_or(|at| at.elapsed() >= Duration::from_millis(DEMOTER_CHECKPOINT_INTERVAL_MS));
        if free < target && dead.awaiting_checkpoints > 0 && checkpoint_allowed {
            Checkpointer::new(core).checkpoint().await?;
            self.last_checkpoint = Some(Instant::now());
            core.lock().free_reusable_dead_segments();
        }
        Ok(())
    }
}
