//! The budget on tokio's paused clock: background work runs at the ceiling
//! with no client load, keeps the floor under latency far over the target,
//! slows when latency rises and speeds up again when it falls, and kinds of
//! work that compete share the rate by their weights.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

const MIB: u64 = 1 << 20;
const FLOOR_BYTES_PER_SECOND: u64 = MIB;
const CEILING_BYTES_PER_SECOND: u64 = 64 * MIB;
const TARGET_US: u64 = 1000;
/// What each acquire asks for (a scrub run).
const RUN_BYTES: u64 = 256 << 10;

fn budget() -> Arc<BackgroundBudget> {
    Arc::new(BackgroundBudget::new(
        BackgroundImpact::Medium,
        BackgroundBudgetLimits {
            bytes_per_second_min: FLOOR_BYTES_PER_SECOND,
            bytes_per_second_max: CEILING_BYTES_PER_SECOND,
            client_latency_target_ratio: 1.5,
            client_latency_target_us: Some(TARGET_US),
            client_latency_window_ms: 100,
        },
    ))
}

/// A client load: a request every millisecond taking what `latency_us` holds.
fn clients(
    budget: &Arc<BackgroundBudget>,
    latency_us: &Arc<AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    let budget = budget.clone();
    let latency_us = latency_us.clone();
    tokio::spawn(async move {
        loop {
            let latency = Duration::from_micros(latency_us.load(Ordering::Relaxed));
            budget.record_client_latency(ClientOperation::Read, latency);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
}

/// Background work of one kind asking for runs for as long as it is let run.
fn work(budget: &Arc<BackgroundBudget>, kind: BackgroundWork) -> tokio::task::JoinHandle<()> {
    let budget = budget.clone();
    tokio::spawn(async move {
        loop {
            budget.acquire(kind, RUN_BYTES).await;
        }
    })
}

fn granted(budget: &BackgroundBudget, kind: BackgroundWork) -> u64 {
    budget.status().granted_bytes.of(kind)
}

/// `value` is within `share` of `expected`.
fn assert_near(value: f64, expected: f64, share: f64, what: &str) {
    assert!(
        (value - expected).abs() <= expected * share,
        "{what}: {value} is not within {share} of {expected}"
    );
}

#[tokio::test(start_paused = true)]
async fn with_no_client_load_background_runs_at_the_ceiling() {
    let budget = budget();
    let scrub = work(&budget, BackgroundWork::Scrub);
    tokio::time::sleep(Duration::from_secs(10)).await;
    scrub.abort();
    let status = budget.status();
    assert_eq!(status.bytes_per_second, CEILING_BYTES_PER_SECOND);
    assert_eq!(status.client_latency_us, None);
    assert_near(
        status.granted_bytes.scrub as f64,
        (CEILING_BYTES_PER_SECOND * 10) as f64,
        0.02,
        "scrub alone at the ceiling for 10 s",
    );
}

#[tokio::test(start_paused = true)]
async fn the_floor_holds_under_client_latency_far_over_the_target() {
    let budget = budget();
    let latency_us = Arc::new(AtomicU64::new(100 * TARGET_US));
    let load = clients(&budget, &latency_us);
    let rebuild = work(&budget, BackgroundWork::Rebuild);
    // The rate falls by a third a window: from the ceiling to the floor in
    // about a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = budget.status();
    assert_eq!(status.bytes_per_second, FLOOR_BYTES_PER_SECOND);
    assert!(status.client_latency_us.expect("clients measured") >= 100 * TARGET_US);
    let before = granted(&budget, BackgroundWork::Rebuild);
    tokio::time::sleep(Duration::from_secs(20)).await;
    let during = granted(&budget, BackgroundWork::Rebuild) - before;
    rebuild.abort();
    load.abort();
    assert_near(
        during as f64,
        (FLOOR_BYTES_PER_SECOND * 20) as f64,
        0.05,
        "rebuild at the floor for 20 s",
    );
}

/// The rate after each of `seconds` of windows (sampled once a window).
async fn rates_over(budget: &BackgroundBudget, seconds: u64) -> Vec<u64> {
    let mut rates = Vec::new();
    for _ in 0..seconds * 10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        rates.push(budget.status().bytes_per_second);
    }
    rates
}

#[tokio::test(start_paused = true)]
async fn the_rate_falls_when_latency_rises_and_recovers_when_it_falls() {
    let budget = budget();
    let latency_us = Arc::new(AtomicU64::new(TARGET_US / 2));
    let load = clients(&budget, &latency_us);
    let cleaner = work(&budget, BackgroundWork::Cleaner);
    let calm = rates_over(&budget, 1).await;
    assert!(
        calm.iter().all(|rate| *rate == CEILING_BYTES_PER_SECOND),
        "{calm:?}"
    );

    latency_us.store(5 * TARGET_US, Ordering::Relaxed);
    let loaded = rates_over(&budget, 2).await;
    assert!(
        loaded.windows(2).all(|pair| pair[1] <= pair[0]),
        "{loaded:?}"
    );
    assert_eq!(*loaded.last().expect("rates"), FLOOR_BYTES_PER_SECOND);

    latency_us.store(TARGET_US / 2, Ordering::Relaxed);
    let recovered = rates_over(&budget, 2).await;
    assert!(
        recovered.windows(2).all(|pair| pair[1] >= pair[0]),
        "{recovered:?}"
    );
    // Additive: more than a second back up to the ceiling, not one window.
    assert!(recovered[5] < CEILING_BYTES_PER_SECOND, "{recovered:?}");
    assert_eq!(*recovered.last().expect("rates"), CEILING_BYTES_PER_SECOND);
    cleaner.abort();
    load.abort();
}

#[tokio::test(start_paused = true)]
async fn kinds_of_work_that_compete_share_the_rate_by_their_weights() {
    let budget = budget();
    let tasks: Vec<_> = BackgroundWork::ALL
        .into_iter()
        .map(|kind| work(&budget, kind))
        .collect();
    tokio::time::sleep(Duration::from_secs(15)).await;
    for task in tasks {
        task.abort();
    }
    let status = budget.status();
    let total: u64 = BackgroundWork::ALL
        .into_iter()
        .map(|kind| status.granted_bytes.of(kind))
        .sum();
    assert_near(
        total as f64,
        (CEILING_BYTES_PER_SECOND * 15) as f64,
        0.02,
        "all kinds together",
    );
    let weights: u32 = BackgroundWork::ALL
        .into_iter()
        .map(BackgroundWork::weight)
        .sum();
    for kind in BackgroundWork::ALL {
        let share = f64::from(kind.weight()) / f64::from(weights);
        assert_near(
            status.granted_bytes.of(kind) as f64,
            total as f64 * share,
            0.05,
            &format!("{kind:?}'s share"),
        );
    }
}

#[tokio::test(start_paused = true)]
async fn urgent_work_never_waits_and_the_others_yield_to_it() {
    let budget = budget();
    let started = Instant::now();
    // Ten seconds' worth at the ceiling, charged at once.
    budget.charge_urgent(BackgroundWork::Cleaner, 10 * CEILING_BYTES_PER_SECOND);
    assert_eq!(started.elapsed(), Duration::ZERO);
    budget.acquire(BackgroundWork::Rebuild, RUN_BYTES).await;
    assert_near(
        started.elapsed().as_secs_f64(),
        10.0,
        0.01,
        "rebuild waits for the urgent debt",
    );
    let status = budget.status();
    assert_eq!(status.urgent_bytes, 10 * CEILING_BYTES_PER_SECOND);
    assert_eq!(status.granted_bytes.cleaner, 10 * CEILING_BYTES_PER_SECOND);
}

#[tokio::test(start_paused = true)]
async fn a_request_given_up_does_not_hold_up_the_others() {
    let budget = budget();
    budget
        .acquire(BackgroundWork::Rebuild, 2 * CEILING_BYTES_PER_SECOND)
        .await;
    // In turn, paying off the debt; then dropped.
    let given_up = tokio::time::timeout(
        Duration::from_millis(500),
        budget.acquire(BackgroundWork::Rebuild, RUN_BYTES),
    )
    .await;
    assert!(given_up.is_err());
    let started = Instant::now();
    budget.acquire(BackgroundWork::Scrub, RUN_BYTES).await;
    assert_near(
        started.elapsed().as_secs_f64(),
        1.5,
        0.01,
        "scrub goes once the debt is paid",
    );
    assert_eq!(
        granted(&budget, BackgroundWork::Rebuild),
        2 * CEILING_BYTES_PER_SECOND
    );
}

#[tokio::test(start_paused = true)]
async fn trying_never_waits_and_succeeds_once_the_debt_is_paid() {
    let budget = budget();
    assert!(budget.try_acquire(BackgroundWork::Cleaner, CEILING_BYTES_PER_SECOND));
    assert!(!budget.try_acquire(BackgroundWork::Cleaner, RUN_BYTES));
    tokio::time::sleep(Duration::from_millis(999)).await;
    assert!(!budget.try_acquire(BackgroundWork::Cleaner, RUN_BYTES));
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(budget.try_acquire(BackgroundWork::Cleaner, RUN_BYTES));
    assert_eq!(
        granted(&budget, BackgroundWork::Cleaner),
        CEILING_BYTES_PER_SECOND + RUN_BYTES
    );
}

/// A budget held to 1.5 × the clients' baseline only (no absolute target).
fn relative_budget() -> Arc<BackgroundBudget> {
    Arc::new(BackgroundBudget::new(
        BackgroundImpact::Medium,
        BackgroundBudgetLimits {
            bytes_per_second_min: FLOOR_BYTES_PER_SECOND,
            bytes_per_second_max: CEILING_BYTES_PER_SECOND,
            client_latency_target_ratio: 1.5,
            client_latency_target_us: None,
            client_latency_window_ms: 100,
        },
    ))
}

/// Healthy client latency in the tests of the relative target; the
/// histogram reads it as its bucket's upper edge, 447 µs.
const HEALTHY_US: u64 = 400;
const HEALTHY_EDGE_US: u64 = 447;

/// Clients at `HEALTHY_US` (their latency, and the task to stop them)
/// after two seconds with no background work: the baseline is learned.
async fn learned_baseline(
    budget: &Arc<BackgroundBudget>,
) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let latency_us = Arc::new(AtomicU64::new(HEALTHY_US));
    let load = clients(budget, &latency_us);
    tokio::time::sleep(Duration::from_secs(2)).await;
    (latency_us, load)
}

#[tokio::test(start_paused = true)]
async fn the_baseline_is_learned_while_background_work_is_idle() {
    let budget = relative_budget();
    assert_eq!(budget.status().client_latency_baseline_us, None);
    assert_eq!(budget.status().client_latency_target_us, None);
    let (_, load) = learned_baseline(&budget).await;
    load.abort();
    let status = budget.status();
    assert_eq!(status.client_latency_baseline_us, Some(HEALTHY_EDGE_US));
    assert_eq!(
        status.client_latency_target_us,
        // 1.5 × 447, rounded.
        Some(671)
    );
    assert_eq!(status.bytes_per_second, CEILING_BYTES_PER_SECOND);
}

#[tokio::test(start_paused = true)]
async fn background_backs_off_past_the_ratio_over_the_baseline_down_to_the_floor() {
    let budget = relative_budget();
    let (latency_us, load) = learned_baseline(&budget).await;
    let rebuild = work(&budget, BackgroundWork::Rebuild);
    // 1.25 × healthy (its bucket's edge, 575 µs, 1.29 × the baseline):
    // under the ratio, far under any absolute target a disk would need.
    latency_us.store(500, Ordering::Relaxed);
    let under = rates_over(&budget, 2).await;
    assert!(
        under.iter().all(|rate| *rate == CEILING_BYTES_PER_SECOND),
        "{under:?}"
    );
    // Twice healthy: over 1.5 × the baseline, still under a millisecond.
    latency_us.store(2 * HEALTHY_US, Ordering::Relaxed);
    let over = rates_over(&budget, 2).await;
    assert_eq!(
        *over.last().expect("rates"),
        FLOOR_BYTES_PER_SECOND,
        "{over:?}"
    );
    // The floor holds: the rebuild still goes at it.
    let before = granted(&budget, BackgroundWork::Rebuild);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let during = granted(&budget, BackgroundWork::Rebuild) - before;
    rebuild.abort();
    load.abort();
    assert_near(
        during as f64,
        (FLOOR_BYTES_PER_SECOND * 10) as f64,
        0.05,
        "rebuild at the floor for 10 s",
    );
    // A rebuild at the floor teaches the baseline nothing of its cost.
    assert_eq!(
        budget.status().client_latency_baseline_us,
        Some(HEALTHY_EDGE_US)
    );
}

#[tokio::test(start_paused = true)]
async fn the_baseline_does_not_rise_while_background_runs_above_its_floor() {
    let budget = relative_budget();
    let (latency_us, load) = learned_baseline(&budget).await;
    let rebuild = work(&budget, BackgroundWork::Rebuild);
    // 1.4 × healthy (its edge, 639 µs, is under 1.5 × the baseline): the
    // rebuild keeps its ceiling, and what it costs clients must not become
    // the baseline.
    latency_us.store(560, Ordering::Relaxed);
    let rates = rates_over(&budget, 5).await;
    assert!(
        rates.iter().all(|rate| *rate == CEILING_BYTES_PER_SECOND),
        "{rates:?}"
    );
    assert_eq!(
        budget.status().client_latency_baseline_us,
        Some(HEALTHY_EDGE_US)
    );
    // With background work idle the same latency is the clients' own: the
    // baseline follows it.
    rebuild.abort();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(budget.status().client_latency_baseline_us, Some(639));
    load.abort();
}

#[tokio::test(start_paused = true)]
async fn windows_with_too_few_requests_are_not_judged() {
    let budget = relative_budget();
    let (_, dense) = learned_baseline(&budget).await;
    dense.abort();
    let rebuild = work(&budget, BackgroundWork::Rebuild);
    // Clients now take 50 ms, once every 20 ms: five a window, 50 a second,
    // too few for a 99th percentile.
    let sparse = {
        let budget = budget.clone();
        tokio::spawn(async move {
            loop {
                budget.record_client_latency(ClientOperation::Write, Duration::from_millis(50));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let rates = rates_over(&budget, 3).await;
    sparse.abort();
    rebuild.abort();
    assert!(
        rates.iter().all(|rate| *rate == CEILING_BYTES_PER_SECOND),
        "{rates:?}"
    );
    assert_eq!(
        budget.status().client_latency_baseline_us,
        Some(HEALTHY_EDGE_US)
    );
}

#[tokio::test(start_paused = true)]
async fn busy_background_with_no_baseline_drops_to_the_floor_to_learn_one() {
    let budget = relative_budget();
    let latency_us = Arc::new(AtomicU64::new(HEALTHY_US));
    let load = clients(&budget, &latency_us);
    // A rebuild resumed as the pool opened: busy from the first window.
    let rebuild = work(&budget, BackgroundWork::Rebuild);
    let rates = rates_over(&budget, 3).await;
    assert!(rates.contains(&FLOOR_BYTES_PER_SECOND), "{rates:?}");
    assert_eq!(
        budget.status().client_latency_baseline_us,
        Some(HEALTHY_EDGE_US)
    );
    // Learned, and latency is under the target: back to the ceiling.
    let rates = rates_over(&budget, 2).await;
    assert_eq!(*rates.last().expect("rates"), CEILING_BYTES_PER_SECOND);
    rebuild.abort();
    load.abort();
}
