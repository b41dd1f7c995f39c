//! The paced background cleaner: cleans ahead of demand so that writers seldom
//! find the pool without a free segment (a writer that does cleans and
//! checkpoints for itself, which stalls it for a whole pass), and spreads its
//! device work out in proportion to what clients write instead of in bursts.
//!
//! Free space beyond the clients' reserve (counting dead segments, which the
//! next checkpoints free) is compared with `cleaner_headroom_segment_count`.
//! Above it the cleaner is idle. Below it, every block a client writes earns
//! the cleaner `pressure × cleaner_relocation_blocks_per_client_block_max`
//! blocks of relocation, where pressure grows from 0 at the headroom to 1 at
//! none left, and the cleaner cleans one victim whenever its budget covers the
//! victim's live blocks. When writers are about to block it cleans without
//! waiting for budget. In steady state the pressure settles where the budget matches the
//! relocation the workload needs, so client and cleaner share the device in
//! that proportion. An emptied victim whose batches both kept checkpoints
//! already cover (the usual case: victims are old) is free as soon as its
//! relocations are flushed, so the cleaner flushes, which writes nothing but
//! the open batch; one written since the older checkpoint waits for up to two
//! checkpoints (which write the whole map), so one is taken per group of such
//! victims (pipelined: each frees the group before), or at once when space is
//! short (docs/decisions/0006-segment-reuse.md).
//!
//! The paced cleaner does not wait for the shared background budget
//! (`budget/`): its work is the price of the clients' own writes and is
//! already held to it here, and waiting behind a rate held at its floor by
//! a rebuild under load only moved the cleaning into the writers' path
//! (decision 0039). Its bytes are counted there, and charged as urgent
//! from [`CLEANER_UNPACED_PRESSURE_MIN`] so that the others yield to it.
//!
//! Nothing here can deadlock a full pool: the paced cleaner only ever calls the
//! same `clean` and `checkpoint` as a blocked writer's reclaim, and a writer
//! never waits for it.

use std::sync::Arc;

use serde::Serialize;

use super::super::budget::BackgroundWork;
use super::super::space::Allocation;
use super::cleaning::Cleaner;
use super::victims::{VictimPolicy, pick_victims};
use crate::BLOCK_SIZE_BYTES;
use crate::error::EngineError;
use crate::pool::background::periodic::{Periodic, spawn_periodic};
use crate::pool::checkpoint::Checkpointer;
use crate::pool::core::Core;
use crate::pool::core::limits::PoolLimits;
use crate::pool::core::state::State;

/// Dead segments that need a checkpoint (written since the newest one) before
/// the paced cleaner takes another: each checkpoint writes the whole map, so it is shared by several
/// victims, as many as the cleaner's reserve (sized at several checkpoint
/// bodies) or half the headroom, whichever is more; they hold space until
/// freed. (Half the headroom alone, 2 victims of 4 MiB per checkpoint on a
/// 1 GiB pool, measured write amplification 5.9 against 4.7 unpaced.)
fn dead_segments_per_checkpoint_max(
    headroom_segment_count: usize,
    cleaner_reserve_segment_count: usize,
) -> usize {
    (headroom_segment_count / 2)
        .max(cleaner_reserve_segment_count)
        .max(1)
}

/// Unspent relocation budget kept at most, in segments' worth of blocks, so
/// that a quiet spell does not turn into a burst of cleaning later.
const BUDGET_SEGMENT_COUNT_MAX: u64 = 2;

/// Free segments beyond the clients' reserve under which space is short: the
/// cleaner then works without waiting for budget, and flushes or checkpoints
/// whenever a dead segment waits, because writers are about to block.
const SHORT_SEGMENT_COUNT: usize = 2;

/// Steps (victims cleaned or checkpoints) in one look at most, so that the
/// cleaner task yields now and then.
const STEPS_PER_LOOK_MAX: usize = 64;

/// What the paced cleaner is doing, as `pool status` and `/metrics` show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CleanerState {
    /// Turned off (`cleaner_relocation_blocks_per_client_block_max` = 0):
    /// writers that find no free segment clean for themselves.
    Off,
    /// At least the headroom is free: nothing to do.
    Idle,
    /// Under the headroom: cleaning in proportion to client writes.
    Paced,
    /// Nearly out of space: cleaning without waiting for budget, and writers
    /// may soon clean for themselves.
    Short,
}

/// Free space as the paced cleaner sees it (flash's: capacity has its own
/// cleaning, and is all of a one-tier pool's segments).
struct Outlook {
    headroom_segment_count: usize,
    /// Free segments beyond the clients' reserve.
    free_beyond_reserve_segment_count: usize,
    /// Those plus the dead segments that a flush or checkpoint frees.
    available_segment_count: usize,
    dead: Dead,
}

impl Outlook {
    fn of(state: &State, limits: &PoolLimits) -> Outlook {
        let flash_segment_count = crate::convert::to_usize(state.geometry().flash_segment_count);
        let headroom =
            headroom_segment_count(limits.cleaner_headroom_segment_count, flash_segment_count);
        let reserve = state.space().reserve_for(Allocation::Client);
        // A dead segment whose batches both kept checkpoints cover, or that
        // replay does not need, needs only a flush; one written since the
        // older checkpoint needs the next checkpoint, and one written since
        // the newest needs two. One that died in an open batch is not counted:
        // no flush or checkpoint frees it before that batch is sealed.
        let counts = state.sealed_dead_flash_segment_counts();
        let dead = Dead {
            total: counts.total(),
            awaiting_flush: counts.awaiting_flush,
            uncovered: counts.awaiting_two_checkpoints,
            group: dead_segments_per_checkpoint_max(
                headroom,
                state.space().cleaner_reserve_segment_count(),
            ),
        };
        let free_beyond_reserve = state
            .space()
            .free_flash_segment_count()
            .saturating_sub(reserve);
        Outlook {
            headroom_segment_count: headroom,
            free_beyond_reserve_segment_count: free_beyond_reserve,
            available_segment_count: free_beyond_reserve + dead.total,
            dead,
        }
    }

    fn pressure(&self) -> f64 {
        pressure(self.available_segment_count, self.headroom_segment_count)
    }

    fn short(&self) -> bool {
        self.free_beyond_reserve_segment_count < SHORT_SEGMENT_COUNT
    }
}

/// The paced cleaner's state and free-space pressure (0 at the headroom or
/// more, 1 with nothing free beyond the reserves).
pub(crate) fn cleaner_state(state: &State, limits: &PoolLimits) -> (CleanerState, f64) {
    let outlook = Outlook::of(state, limits);
    let pressure = outlook.pressure();
    let cleaner_state = if limits.cleaner_relocation_blocks_per_client_block_max <= 0.0 {
        CleanerState::Off
    } else if pressure == 0.0 {
        CleanerState::Idle
    } else if outlook.short() {
        CleanerState::Short
    } else {
        CleanerState::Paced
    };
    (cleaner_state, pressure)
}

/// The paced cleaner's state between two looks at the pool.
#[derive(Default)]
pub(in crate::pool) struct Pacer {
    /// Blocks the cleaner may still relocate.
    budget_blocks: f64,
    /// Client blocks written when the pool was last looked at.
    client_blocks_seen: Option<u64>,
}

/// What the paced cleaner should do now.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Step {
    Idle,
    /// Make the deaths of dead segments that both checkpoints cover durable,
    /// which frees them.
    Flush,
    /// Free what dead segments written since the older checkpoint hold (they
    /// need up to two checkpoints).
    Checkpoint,
    /// Clean one victim.
    Clean,
}

impl Periodic for Pacer {
    const NAME: &'static str = "paced cleaning";

    /// Steps until the budget or the need runs out, so that the cleaner keeps
    /// up however fast clients write between looks.
    async fn step(&mut self, core: &Arc<Core>) -> Result<(), EngineError> {
        for _ in 0..STEPS_PER_LOOK_MAX {
            if self.pace_once(core).await? == Step::Idle || core.background_stopped() {
                break;
            }
        }
        Ok(())
    }
}

impl Pacer {
    /// Starts the paced cleaner unless `cleaner_relocation_blocks_per_client_block_max`
    /// is 0. It stops when the pool is closed, abandoned, dropped or failed.
    pub(in crate::pool) fn start(core: &Arc<Core>) {
        let limits = core.limits();
        if limits.cleaner_relocation_blocks_per_client_block_max <= 0.0 {
            return;
        }
        spawn_periodic(core, limits.cleaner_interval_ms, Pacer::default());
    }

    /// One look at the pool: update the budget, then at most one step, which
    /// is returned.
    async fn pace_once(&mut self, core: &Arc<Core>) -> Result<Step, EngineError> {
        let Some(look) = self.look(core) else {
            return Ok(Step::Idle);
        };
        match look.step {
            Step::Idle => {}
            Step::Flush => {
                core.flush_all().await?;
                core.lock().free_reusable_dead_segments();
            }
            Step::Checkpoint => Checkpointer::new(core).checkpoint().await?,
            Step::Clean => self.clean_paced(core, &look).await?,
        }
        Ok(look.step)
    }

    /// Updates the budget and chooses the next step; none once the pool has
    /// failed.
    fn look(&mut self, core: &Core) -> Option<Look> {
        let mut state = core.lock();
        if state.writer().failed().is_some() {
            return None;
        }
        // Deaths made durable since the last look (by any flush) free their
        // segments now rather than at the next checkpoint.
        state.free_reusable_dead_segments();
        let limits = core.limits();
        let outlook = Outlook::of(&state, limits);
        let client_blocks = state.client_blocks_written();
        let written = client_blocks - self.client_blocks_seen.unwrap_or(client_blocks);
        self.client_blocks_seen = Some(client_blocks);
        let pressure = outlook.pressure();
        let budget_max = (BUDGET_SEGMENT_COUNT_MAX * core.geometry().segment_size_blocks) as f64;
        self.budget_blocks = (self.budget_blocks
            + written as f64 * pressure * limits.cleaner_relocation_blocks_per_client_block_max)
            .min(budget_max);
        let mut victim_live_blocks = 0;
        let next_victim_live_blocks = || {
            let live_blocks = pick_victims(&state, 1, VictimPolicy::CostBenefit)
                .first()
                .map(|victim| state.space().segment(*victim).live_blocks());
            victim_live_blocks = live_blocks.unwrap_or(0);
            live_blocks.map(f64::from)
        };
        let step = choose_step(
            pressure,
            outlook.short(),
            outlook.dead,
            self.budget_blocks,
            next_victim_live_blocks,
        );
        Some(Look {
            step,
            short: outlook.short() || pressure >= CLEANER_UNPACED_PRESSURE_MIN,
            victim_live_blocks,
        })
    }

    /// Cleans one victim, without waiting for the background budget: the
    /// pacer's own budget (pressure × client blocks written) already holds
    /// it to what the clients' writes call for, and waiting behind a rate
    /// held at its floor (a rebuild under load) only moved the cleaning
    /// into the writers' path, a whole reclaim at a time (decision 0039).
    /// The victim's live bytes (what it reads and rewrites) are counted;
    /// once the pressure reaches [`CLEANER_UNPACED_PRESSURE_MIN`] they are
    /// also charged to the rate, so that the other kinds yield to it.
    async fn clean_paced(&mut self, core: &Arc<Core>, look: &Look) -> Result<(), EngineError> {
        let bytes = u64::from(look.victim_live_blocks) * BLOCK_SIZE_BYTES;
        let budget = core.budget();
        if look.short {
            budget.charge_urgent(BackgroundWork::Cleaner, bytes);
        } else {
            budget.count_unpaced(BackgroundWork::Cleaner, bytes);
        }
        let before = core.lock().counters().relocated_blocks();
        Cleaner::new(core).clean(1).await?;
        let relocated = core.lock().counters().relocated_blocks() - before;
        self.budget_blocks = (self.budget_blocks - relocated as f64).max(0.0);
        Ok(())
    }
}

/// Free-space pressure (0 at the headroom, 1 with nothing free) from which
/// the paced cleaner's bytes are charged to the background budget as
/// urgent, so that rebuild, the demoter and scrub yield to it. (Below it
/// they are only counted; at no pressure does the cleaner wait for the
/// budget, decision 0039.)
pub const CLEANER_UNPACED_PRESSURE_MIN: f64 = 0.5;

/// What one look at the pool decided.
struct Look {
    step: Step,
    /// Free space is short, or the pressure is past
    /// [`CLEANER_UNPACED_PRESSURE_MIN`]: the cleaner's bytes are urgent.
    short: bool,
    /// Live blocks of the victim a `Step::Clean` takes.
    victim_live_blocks: u32,
}

/// The headroom in segments: the configured count, but at most 2% of the pool
/// (free space the cleaner keeps is space the data cannot use, which raises
/// write amplification, so a small pool of large segments keeps less), and at
/// least 2.
fn headroom_segment_count(configured_segment_count: usize, segment_count: usize) -> usize {
    configured_segment_count.min(segment_count / 50).max(2)
}

/// 0 when at least `headroom` segments are available, rising linearly to 1
/// when none are.
fn pressure(available_segment_count: usize, headroom_segment_count: usize) -> f64 {
    if available_segment_count >= headroom_segment_count {
        return 0.0;
    }
    (headroom_segment_count - available_segment_count) as f64 / headroom_segment_count as f64
}

/// Dead segments waiting to be freed whose death a sealed batch covers.
#[derive(Clone, Copy, Debug, Default)]
struct Dead {
    total: usize,
    /// Those whose batches both kept checkpoints cover: a flush frees them.
    awaiting_flush: usize,
    /// Those written since the newest durable checkpoint (two checkpoints
    /// free them; the others, neither this nor awaiting a flush, need one).
    uncovered: usize,
    /// How many uncovered ones call for a checkpoint.
    group: usize,
}

/// The paced cleaner's decision, given the free-space pressure, whether free
/// space is short (under `SHORT_SEGMENT_COUNT`), the emptied victims waiting for
/// checkpoints, the budget, and the live blocks of the next victim (if any).
/// Dead segments that both checkpoints cover are freed by a flush, taken at
/// once. Checkpoints are pipelined: one is taken when a group of segments
/// written since the last has died, and it frees the group before (a dead
/// segment is reused only once both kept checkpoints cover its batches); when
/// space is short, one is taken whenever anything waits for one.
fn choose_step(
    pressure: f64,
    short: bool,
    dead: Dead,
    budget_blocks: f64,
    next_victim_live_blocks: impl FnOnce() -> Option<f64>,
) -> Step {
    // Short of free segments, dead ones are freed whatever the pressure
    // (which counts them as available: it can be 0 while writers are about
    // to block, with nothing but a flush or checkpoint between them).
    if pressure == 0.0 {
        return Step::Idle;
    }
    if dead.awaiting_flush > 0 {
        return Step::Flush;
    }
    if dead.uncovered >= dead.group || (short && dead.total > 0) {
        return Step::Checkpoint;
    }
    match next_victim_live_blocks() {
        Some(live_blocks) if short || budget_blocks >= live_blocks => Step::Clean,
        _ => Step::Idle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_headroom_is_at_most_two_percent_of_the_pool_and_at_least_two_segments() {
        assert_eq!(headroom_segment_count(4, 256), 4);
        assert_eq!(headroom_segment_count(4, 64), 2);
        assert_eq!(headroom_segment_count(4, 100_000), 4);
        assert_eq!(headroom_segment_count(0, 100_000), 2);
    }

    #[test]
    fn pressure_rises_from_zero_at_the_headroom_to_one_at_none_left() {
        assert_eq!(pressure(8, 8), 0.0);
        assert_eq!(pressure(20, 8), 0.0);
        assert_eq!(pressure(4, 8), 0.5);
        assert_eq!(pressure(0, 8), 1.0);
    }

    #[test]
    fn cleaning_waits_for_budget_unless_space_is_short() {
        let victim = || Some(100.0);
        let none = Dead {
            total: 0,
            uncovered: 0,
            group: 4,
            ..Dead::default()
        };
        assert_eq!(choose_step(0.0, false, none, 1e9, victim), Step::Idle);
        assert_eq!(choose_step(0.5, false, none, 99.0, victim), Step::Idle);
        assert_eq!(choose_step(0.5, false, none, 100.0, victim), Step::Clean);
        assert_eq!(choose_step(0.9, true, none, 0.0, victim), Step::Clean);
        assert_eq!(choose_step(0.9, true, none, 0.0, || None), Step::Idle);
    }

    #[test]
    fn checkpoints_are_shared_by_groups_of_victims_unless_space_is_short() {
        let victim = || Some(0.0);
        let group = Dead {
            total: 4,
            uncovered: 4,
            group: 4,
            ..Dead::default()
        };
        assert_eq!(
            choose_step(0.5, false, group, 0.0, victim),
            Step::Checkpoint
        );
        // Covered by the newest checkpoint: the next group's checkpoint frees them.
        let covered = Dead {
            total: 4,
            uncovered: 0,
            group: 4,
            ..Dead::default()
        };
        assert_eq!(choose_step(0.5, false, covered, 0.0, victim), Step::Clean);
        let one = Dead {
            total: 1,
            uncovered: 1,
            group: 4,
            ..Dead::default()
        };
        assert_eq!(choose_step(0.5, false, one, 0.0, victim), Step::Clean);
        assert_eq!(choose_step(0.9, true, one, 0.0, victim), Step::Checkpoint);
    }

    #[test]
    fn dead_segments_both_checkpoints_cover_are_flushed_free_at_once() {
        let victim = || Some(0.0);
        let covered = Dead {
            total: 1,
            awaiting_flush: 1,
            uncovered: 0,
            group: 4,
        };
        assert_eq!(choose_step(0.1, false, covered, 1e9, victim), Step::Flush);
        assert_eq!(choose_step(0.9, true, covered, 0.0, victim), Step::Flush);
        // No pressure: nothing to do, the normal background flush frees them.
        assert_eq!(choose_step(0.0, false, covered, 1e9, victim), Step::Idle);
    }
}
