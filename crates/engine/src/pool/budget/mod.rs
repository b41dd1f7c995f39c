//! The background budget: one pacer that rebuild, the cleaner, the demoter
//! and scrub share, so that together they take from clients no more than
//! client latency allows. Background work asks [`BackgroundBudget::acquire`]
//! before it issues a run of bytes and waits until the budget allows them;
//! the client read and write paths report each request's latency
//! ([`BackgroundBudget::record_client_latency`], lock-free). The allowed
//! rate moves between a floor and a ceiling with that latency (`rate`), so
//! that background work always progresses at least at the floor and runs
//! at the ceiling while no client is there; the latency it is held to is a
//! ratio over the clients' own baseline, learned while background work is
//! idle or at its floor.
//!
//! The rate is one token bucket for all the work: a grant may overdraw it,
//! and the next grant waits until the debt is paid off at the current rate
//! (so a single run larger than any burst still goes, and the rate holds
//! over time). When several kinds of work wait at once, the next grant goes
//! by start-time fair queueing with the weights of [`BackgroundWork`]:
//! rebuild 8, cleaner 4, demoter 2, scrub 1 of the rate, and one kind alone
//! gets all of it. Work that must not wait (the cleaner when writers are
//! about to find no free segment) is charged without waiting
//! ([`BackgroundBudget::charge_urgent`]), so that the others yield to it.
//! The paced cleaner never waits: its work is the price of the clients'
//! own writes, paced by free space (decision 0039); short of the urgent
//! case its bytes are only counted ([`BackgroundBudget::count_unpaced`]).
//!
//! The budget only delays work; it never skips or reorders a step. Its
//! mutex is a leaf: never held across an `.await`, and no other lock is
//! taken under it; `acquire` is awaited holding no pool lock.

mod latency;
mod rate;
mod work;

pub use work::BackgroundWork;

use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use latency::ClientLatency;
pub use latency::ClientOperation;
use rate::RateController;

use crate::convert::saturating_u64;
use crate::pool::core::limits::{BackgroundBudgetLimits, BackgroundImpact};

/// Credit an idle budget keeps at most, in milliseconds of its rate: work
/// that starts after a quiet spell goes at once, but does not burst.
const BURST_MS: u64 = 10;

/// The shortest wait for a debt to be paid off: tokio's timers tick in
/// milliseconds, and a wait rounded to nothing would spin.
const PAY_OFF_WAIT_MIN: Duration = Duration::from_millis(1);

/// Bytes the budget granted each kind of work since the pool opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct GrantedBytes {
    pub rebuild: u64,
    pub cleaner: u64,
    pub demoter: u64,
    pub scrub: u64,
}

impl GrantedBytes {
    /// The figure of `work`.
    pub fn of(&self, work: BackgroundWork) -> u64 {
        match work {
            BackgroundWork::Rebuild => self.rebuild,
            BackgroundWork::Cleaner => self.cleaner,
            BackgroundWork::Demoter => self.demoter,
            BackgroundWork::Scrub => self.scrub,
        }
    }
}

/// What `pool status` shows of the budget.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackgroundBudgetStatus {
    pub impact: BackgroundImpact,
    /// The rate background work may issue now.
    pub bytes_per_second: u64,
    pub bytes_per_second_min: u64,
    pub bytes_per_second_max: u64,
    /// The client latency over which background work backs off now: the
    /// lower of `client_latency_target_ratio` × the baseline and the
    /// absolute target if one is set; none while neither is known.
    pub client_latency_target_us: Option<u64>,
    pub client_latency_target_ratio: f64,
    /// The clients' latency (a low quantile of the windows' 99th
    /// percentiles) learned while background work was idle or at its
    /// floor; none until learned.
    pub client_latency_baseline_us: Option<u64>,
    /// The 99th percentile of client reads and writes over the latest
    /// window judged; none when no client request came in it.
    pub client_latency_us: Option<u64>,
    /// Bytes granted per kind of work, urgent work included.
    pub granted_bytes: GrantedBytes,
    /// Of those, bytes charged without waiting (the cleaner while free
    /// space is short).
    pub urgent_bytes: u64,
}

/// One kind of work's account.
#[derive(Clone, Copy, Debug, Default)]
struct Account {
    /// Requests of this kind waiting for a grant.
    waiting: usize,
    /// The virtual time at which this kind's last grant ends (its bytes over
    /// its weight past its start).
    finish_tag: f64,
    granted_bytes: u64,
    urgent_bytes: u64,
}

/// The state under the budget's mutex.
struct Scheduler {
    rate: RateController,
    /// Bytes that may be issued now; negative, a debt paid off first.
    tokens_bytes: f64,
    refilled_at: Instant,
    /// The start tag of the latest grant: a kind that was idle starts from
    /// here, so that it gains no credit from idling.
    virtual_time: f64,
    accounts: [Account; 4],
}

/// What a request may do now.
enum Decision {
    Granted,
    /// Its turn, once the debt is paid off in this long.
    PayOff(Duration),
    /// Another kind goes first.
    NotItsTurn,
}

impl Scheduler {
    /// Adds the credit earned since the last refill at the rate that held,
    /// then lets the rate follow client latency.
    fn refill(&mut self, now: Instant, latency: &ClientLatency) {
        let elapsed = now.duration_since(self.refilled_at).as_secs_f64();
        let rate = self.rate.bytes_per_second();
        let burst = rate * BURST_MS as f64 / 1000.0;
        self.tokens_bytes = (self.tokens_bytes + elapsed * rate).min(burst);
        self.refilled_at = now;
        self.rate.update(now, latency);
    }

    /// A waiting kind's start tag.
    fn start_tag(&self, work: BackgroundWork) -> f64 {
        self.accounts[work.index()]
            .finish_tag
            .max(self.virtual_time)
    }

    /// The waiting kind with the earliest start tag (the heavier on a tie).
    fn next_turn(&self) -> Option<BackgroundWork> {
        BackgroundWork::ALL
            .into_iter()
            .filter(|work| self.accounts[work.index()].waiting > 0)
            .min_by(|one, other| self.start_tag(*one).total_cmp(&self.start_tag(*other)))
    }

    fn decide(&mut self, work: BackgroundWork, bytes: u64) -> Decision {
        if self.next_turn() != Some(work) {
            return Decision::NotItsTurn;
        }
        // Less than a byte owed is the rounding of credit added in pieces.
        if self.tokens_bytes <= -1.0 {
            let seconds = -self.tokens_bytes / self.rate.bytes_per_second();
            return Decision::PayOff(Duration::from_secs_f64(seconds));
        }
        let start = self.start_tag(work);
        self.virtual_time = start;
        let account = &mut self.accounts[work.index()];
        account.finish_tag = start + bytes as f64 / f64::from(work.weight());
        account.granted_bytes += bytes;
        account.waiting -= 1;
        self.tokens_bytes -= bytes as f64;
        self.rate.count_background(work, bytes);
        Decision::Granted
    }
}

/// See the module documentation.
pub struct BackgroundBudget {
    impact: BackgroundImpact,
    latency: ClientLatency,
    scheduler: Mutex<Scheduler>,
    /// Woken at every grant: the next kind in turn may go.
    turn: Notify,
}

/// A request counted as waiting until it is granted or given up (its
/// future dropped).
struct Waiting<'a> {
    budget: &'a BackgroundBudget,
    work: BackgroundWork,
    granted: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.granted {
            self.budget.lock().accounts[self.work.index()].waiting -= 1;
            // It may have been the one in turn.
            self.budget.turn.notify_waiters();
        }
    }
}

impl BackgroundBudget {
    pub fn new(impact: BackgroundImpact, limits: BackgroundBudgetLimits) -> Self {
        let now = Instant::now();
        Self {
            impact,
            latency: ClientLatency::new(),
            scheduler: Mutex::new(Scheduler {
                rate: RateController::new(limits, now),
                tokens_bytes: 0.0,
                refilled_at: now,
                virtual_time: 0.0,
                accounts: [Account::default(); 4],
            }),
            turn: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Scheduler> {
        self.scheduler
            .lock()
            .expect("background budget lock poisoned")
    }

    /// Counts one client request that took `duration` (from the engine
    /// call's start to its end). Lock-free: one atomic add.
    pub fn record_client_latency(&self, operation: ClientOperation, duration: Duration) {
        // Reads and writes share one target: either waiting is a client
        // waiting.
        let _ = operation;
        self.latency.record(duration);
    }

    /// Waits until `bytes` of `work` may be issued. Never fails: at worst
    /// the bytes wait for the floor rate and for heavier kinds' turns.
    pub async fn acquire(&self, work: BackgroundWork, bytes: u64) {
        self.lock().accounts[work.index()].waiting += 1;
        let mut waiting = Waiting {
            budget: self,
            work,
            granted: false,
        };
        loop {
            let notified = self.turn.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let decision = {
                let mut scheduler = self.lock();
                scheduler.refill(Instant::now(), &self.latency);
                let decision = scheduler.decide(work, bytes);
                // Re-checked at least once per window, which may change the rate.
                (decision, scheduler.rate.window())
            };
            let wait = match decision {
                (Decision::Granted, _) => {
                    waiting.granted = true;
                    self.turn.notify_waiters();
                    return;
                }
                (Decision::PayOff(wait), window) => wait.clamp(PAY_OFF_WAIT_MIN, window),
                (Decision::NotItsTurn, window) => window,
            };
            let _ = tokio::time::timeout(wait, notified).await;
        }
    }

    /// Grants `bytes` of `work` if they may be issued now, without waiting:
    /// for work run by a task that has other steps to take on time (the
    /// flush-and-checkpoint loop's cleaning pass), which tries again at its
    /// next tick.
    pub fn try_acquire(&self, work: BackgroundWork, bytes: u64) -> bool {
        let mut scheduler = self.lock();
        scheduler.refill(Instant::now(), &self.latency);
        scheduler.accounts[work.index()].waiting += 1;
        let granted = matches!(scheduler.decide(work, bytes), Decision::Granted);
        if !granted {
            scheduler.accounts[work.index()].waiting -= 1;
        }
        drop(scheduler);
        if granted {
            self.turn.notify_waiters();
        }
        granted
    }

    /// Charges `bytes` of `work` that must go now (writers are about to find
    /// no free segment): never waits, but the debt delays every other grant.
    pub fn charge_urgent(&self, work: BackgroundWork, bytes: u64) {
        let mut scheduler = self.lock();
        scheduler.refill(Instant::now(), &self.latency);
        scheduler.tokens_bytes -= bytes as f64;
        scheduler.rate.count_background(work, bytes);
        let account = &mut scheduler.accounts[work.index()];
        // Not in the fair-queueing tag: urgent work should not cost the
        // same kind its turn once it is paced again.
        account.granted_bytes += bytes;
        account.urgent_bytes += bytes;
    }

    /// Counts `bytes` of `work` that is paced by something else than the
    /// budget (the cleaner, by free space and the clients' own writes:
    /// decision 0039): shown in `granted_bytes`, but not charged to the
    /// rate, so that the others keep their floor beside it.
    pub fn count_unpaced(&self, work: BackgroundWork, bytes: u64) {
        self.lock().accounts[work.index()].granted_bytes += bytes;
    }

    pub fn status(&self) -> BackgroundBudgetStatus {
        let mut scheduler = self.lock();
        scheduler.refill(Instant::now(), &self.latency);
        let limits = scheduler.rate.limits();
        let granted = |work: BackgroundWork| scheduler.accounts[work.index()].granted_bytes;
        BackgroundBudgetStatus {
            impact: self.impact,
            bytes_per_second: saturating_u64(scheduler.rate.bytes_per_second().round()),
            bytes_per_second_min: limits.bytes_per_second_min,
            bytes_per_second_max: limits.bytes_per_second_max,
            client_latency_target_us: scheduler.rate.target_us(),
            client_latency_target_ratio: limits.client_latency_target_ratio,
            client_latency_baseline_us: scheduler.rate.baseline_us(),
            client_latency_us: scheduler.rate.latency_us(),
            granted_bytes: GrantedBytes {
                rebuild: granted(BackgroundWork::Rebuild),
                cleaner: granted(BackgroundWork::Cleaner),
                demoter: granted(BackgroundWork::Demoter),
                scrub: granted(BackgroundWork::Scrub),
            },
            urgent_bytes: scheduler
                .accounts
                .iter()
                .map(|account| account.urgent_bytes)
                .sum(),
        }
    }
}

#[cfg(test)]
mod tests;
