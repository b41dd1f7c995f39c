//! Profiles and sweep control: which fio steps a profile runs, in what order, when an
//! open-loop rate sweep stops, and the headline figures of a curve (the highest IOPS
//! sustained within a p99 latency objective, and the knee).
//!
//! Everything here is pure (no processes), so the control logic is unit-tested on
//! made-up measurements; [`execute`] is the only function that runs fio.

use serde::{Deserialize, Serialize};

use crate::convert::saturating_u64;
use crate::cpu::{CpuUsage, sample_tree};
use crate::fio::{FioTarget, Measurement, Pattern, StepSpec};
use crate::process::check_interrupted;

/// Achieved IOPS below this share of the target mean the server is saturated.
pub const SATURATION_ACHIEVED_SHARE: f64 = 0.95;

/// More than this percent of time with fio's queue full also means saturation: the
/// generator could not issue I/O when the schedule asked for it.
pub const SATURATION_FULL_QUEUE_PERCENT: f64 = 5.0;

/// Rate-sweep targets as fractions of the closed-loop peak; the sweep stops at the
/// first saturated step, so the last fractions only run for servers the calibration
/// underestimated.
pub const RATE_FRACTIONS: [f64; 14] = [
    0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0, 1.1, 1.25,
];

/// The benchmark profiles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Profile {
    /// 4 KiB random reads.
    Randread4k,
    /// 4 KiB random writes.
    Randwrite4k,
    /// 4 KiB random, 70% reads and 30% writes.
    Oltp,
    /// 1 MiB sequential reads, then 1 MiB sequential writes.
    Seq1m,
    /// Queue depth 1 to 128 with one job, then jobs 2 to N at depth 32.
    QdSweep,
    /// Open loop: Poisson arrivals at increasing target IOPS until saturation.
    RateSweep,
}

impl Profile {
    /// True for profiles whose result is a curve rather than one or two points.
    pub fn is_sweep(self) -> bool {
        matches!(self, Profile::QdSweep | Profile::RateSweep)
    }
}

/// The 4 KiB mix a sweep runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Mix {
    Randread4k,
    Randwrite4k,
    Oltp,
}

impl Mix {
    /// The fio access pattern of the mix.
    pub fn pattern(self) -> Pattern {
        match self {
            Mix::Randread4k => Pattern::RandomRead,
            Mix::Randwrite4k => Pattern::RandomWrite,
            Mix::Oltp => Pattern::RandomMix { read_percent: 70 },
        }
    }
}

/// How long and how hard each step runs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Settings {
    pub runtime_seconds: u64,
    pub ramp_seconds: u64,
    pub region_bytes: u64,
    /// Queue depth per job of closed-loop profiles.
    pub iodepth: u32,
    /// Jobs (connections) of closed-loop profiles.
    pub jobs: u32,
    /// Largest job count of `qd-sweep`.
    pub max_jobs: u32,
    /// The mix of `qd-sweep` and `rate-sweep`.
    pub mix: Mix,
    /// Jobs of `rate-sweep`: independent Poisson streams, one connection each.
    pub rate_jobs: u32,
    /// Queue depth per job of `rate-sweep`: deep, so the schedule rarely waits.
    pub rate_iodepth: u32,
    /// Explicit targets for `rate-sweep` instead of fractions of the calibrated peak.
    pub rate_targets: Option<Vec<u64>>,
    /// The latency objective for the headline figure, microseconds of p99.
    pub slo_us: f64,
}

impl Settings {
    /// The largest number of NBD connections any step opens.
    pub fn max_connections(&self) -> u32 {
        self.jobs.max(self.max_jobs).max(self.rate_jobs)
    }

    fn step(&self, pattern: Pattern, block_size_bytes: u64, iodepth: u32, jobs: u32) -> StepSpec {
        StepSpec {
            pattern,
            block_size_bytes,
            iodepth,
            jobs,
            target_iops: None,
            runtime_seconds: self.runtime_seconds,
            ramp_seconds: self.ramp_seconds,
            region_bytes: self.region_bytes,
        }
    }

    fn rate_step(&self, target_iops: Option<u64>) -> StepSpec {
        StepSpec {
            target_iops,
            ..self.step(self.mix.pattern(), 4096, self.rate_iodepth, self.rate_jobs)
        }
    }
}

/// The closed-loop steps of a profile (for `rate-sweep`: its calibration step).
pub fn closed_loop_steps(profile: Profile, settings: &Settings) -> Vec<(String, StepSpec)> {
    let depth = settings.iodepth;
    let jobs = settings.jobs;
    match profile {
        Profile::Randread4k => vec![(
            "randread4k".into(),
            settings.step(Pattern::RandomRead, 4096, depth, jobs),
        )],
        Profile::Randwrite4k => vec![(
            "randwrite4k".into(),
            settings.step(Pattern::RandomWrite, 4096, depth, jobs),
        )],
        Profile::Oltp => vec![(
            "oltp".into(),
            settings.step(Pattern::RandomMix { read_percent: 70 }, 4096, depth, jobs),
        )],
        Profile::Seq1m => vec![
            (
                "seq1m-read".into(),
                settings.step(Pattern::SequentialRead, 1 << 20, 8, jobs),
            ),
            (
                "seq1m-write".into(),
                settings.step(Pattern::SequentialWrite, 1 << 20, 8, jobs),
            ),
        ],
        Profile::QdSweep => {
            let pattern = settings.mix.pattern();
            let mut steps: Vec<(String, StepSpec)> = (0..=7)
                .map(|power| 1u32 << power)
                .map(|depth| {
                    (
                        format!("qd{depth}-jobs1"),
                        settings.step(pattern, 4096, depth, 1),
                    )
                })
                .collect();
            let mut jobs = 2;
            while jobs <= settings.max_jobs {
                steps.push((
                    format!("qd32-jobs{jobs}"),
                    settings.step(pattern, 4096, 32, jobs),
                ));
                jobs *= 2;
            }
            steps
        }
        Profile::RateSweep => vec![("calibration".into(), settings.rate_step(None))],
    }
}

/// Decides the next target of an open-loop sweep from what was measured so far.
#[derive(Debug, Clone)]
pub struct RateSweepControl {
    targets: Vec<u64>,
    next_index: usize,
    stopped: bool,
}

impl RateSweepControl {
    /// Targets as [`RATE_FRACTIONS`] of a closed-loop `peak_iops`.
    pub fn from_peak(peak_iops: f64) -> Self {
        assert!(
            peak_iops.is_finite() && peak_iops >= 0.0,
            "peak must be a finite rate"
        );
        let mut targets: Vec<u64> = RATE_FRACTIONS
            .iter()
            .map(|fraction| saturating_u64((peak_iops * fraction).round()).max(1))
            .collect();
        targets.dedup();
        Self::from_targets(targets)
    }

    /// Explicit targets, run in increasing order.
    pub fn from_targets(mut targets: Vec<u64>) -> Self {
        targets.sort_unstable();
        targets.dedup();
        Self {
            targets,
            next_index: 0,
            stopped: false,
        }
    }

    /// The next target, or `None` when the sweep is over.
    pub fn next_target(&mut self) -> Option<u64> {
        if self.stopped {
            return None;
        }
        let target = self.targets.get(self.next_index).copied();
        self.next_index += 1;
        target
    }

    /// Records a step's outcome; a saturated step ends the sweep (it is past the edge).
    pub fn record(&mut self, saturated: bool) {
        if saturated {
            self.stopped = true;
        }
    }
}

/// Whether an open-loop step at `target_iops` failed to keep up.
pub fn is_saturated(target_iops: u64, measurement: &Measurement) -> bool {
    measurement.total_iops < SATURATION_ACHIEVED_SHARE * target_iops as f64
        || measurement.full_queue_percent > SATURATION_FULL_QUEUE_PERCENT
}

/// One measured step of a profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub label: String,
    pub iodepth: u32,
    pub jobs: u32,
    pub block_size_bytes: u64,
    /// The offered load of an open-loop step.
    pub target_iops: Option<u64>,
    /// Open-loop step that did not keep up (see [`is_saturated`]).
    pub saturated: bool,
    pub measurement: Measurement,
    /// Microseconds of server CPU (user + system of its process tree) per operation
    /// over the measured part of the step; `None` when no server process was watched.
    #[serde(default)]
    pub server_cpu_us_per_op: Option<f64>,
}

/// The highest IOPS a curve sustained within the latency objective.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Headline {
    pub slo_p99_us: f64,
    /// Highest achieved IOPS of an unsaturated step with p99 within the objective.
    pub iops_within_slo: Option<f64>,
    /// The knee: where latency leaves its flat part (see [`knee_index`]).
    pub knee_iops: Option<f64>,
    pub knee_p99_us: Option<f64>,
    /// Highest achieved IOPS of any step.
    pub peak_iops: f64,
}

/// Computes the headline of a curve.
pub fn headline(points: &[Point], slo_us: f64) -> Headline {
    let iops_within_slo = points
        .iter()
        .filter(|point| !point.saturated && point.measurement.p99_us <= slo_us)
        .map(|point| point.measurement.total_iops)
        .fold(None, |best: Option<f64>, iops| {
            Some(best.map_or(iops, |best| best.max(iops)))
        });
    let curve: Vec<(f64, f64)> = points
        .iter()
        .map(|point| (point.measurement.total_iops, point.measurement.p99_us))
        .collect();
    let knee = knee_index(&curve).map(|index| curve[index]);
    Headline {
        slo_p99_us: slo_us,
        iops_within_slo,
        knee_iops: knee.map(|(iops, _)| iops),
        knee_p99_us: knee.map(|(_, latency)| latency),
        peak_iops: curve.iter().map(|(iops, _)| *iops).fold(0.0, f64::max),
    }
}

/// The knee of a latency-versus-throughput curve, given as (IOPS, latency) points in
/// the order measured: after sorting by IOPS and scaling both axes to [0, 1], the point
/// farthest below the chord from the first to the last point (the "Kneedle" method for
/// a convex, increasing curve). `None` with fewer than three points or a flat curve.
pub fn knee_index(curve: &[(f64, f64)]) -> Option<usize> {
    let mut order: Vec<usize> = (0..curve.len())
        .filter(|index| curve[*index].0.is_finite() && curve[*index].1.is_finite())
        .collect();
    if order.len() < 3 {
        return None;
    }
    order.sort_by(|left, right| curve[*left].0.total_cmp(&curve[*right].0));
    let (x_min, x_max) = (curve[order[0]].0, curve[order[order.len() - 1]].0);
    let y_min = order
        .iter()
        .map(|index| curve[*index].1)
        .fold(f64::INFINITY, f64::min);
    let y_max = order
        .iter()
        .map(|index| curve[*index].1)
        .fold(0.0, f64::max);
    if x_max <= x_min || y_max <= y_min {
        return None;
    }
    let scale = |(x, y): (f64, f64)| ((x - x_min) / (x_max - x_min), (y - y_min) / (y_max - y_min));
    let (first_x, first_y) = scale(curve[order[0]]);
    let (last_x, last_y) = scale(curve[order[order.len() - 1]]);
    let slope = (last_y - first_y) / (last_x - first_x).max(f64::EPSILON);
    order[1..order.len() - 1]
        .iter()
        .map(|index| {
            let (x, y) = scale(curve[*index]);
            let chord = first_y + slope * (x - first_x);
            (*index, chord - y)
        })
        .filter(|(_, below)| *below > 0.0)
        .max_by(|left, right| left.1.total_cmp(&right.1))
        .map(|(index, _)| index)
}

/// One fio step's figures and the server CPU it cost.
pub(crate) struct MeasuredStep {
    pub(crate) measurement: Measurement,
    pub(crate) server_cpu_us_per_op: Option<f64>,
}

/// Runs one fio step; with `server_pid`, samples the server's CPU time when the ramp
/// is over and when fio has finished, and divides its rate by the achieved IOPS.
pub(crate) fn run_measured_step(
    fio_program: &str,
    target: FioTarget,
    step: &StepSpec,
    server_pid: Option<u32>,
) -> anyhow::Result<MeasuredStep> {
    let Some(pid) = server_pid else {
        let measurement = crate::fio::run_step_on(fio_program, target, step)?;
        return Ok(MeasuredStep {
            measurement,
            server_cpu_us_per_op: None,
        });
    };
    let ramp = std::time::Duration::from_secs(step.ramp_seconds);
    std::thread::scope(|scope| {
        let start_sampler = scope.spawn(move || {
            std::thread::sleep(ramp);
            sample_tree(pid)
        });
        let measurement = crate::fio::run_step_on(fio_program, target, step);
        let end = sample_tree(pid);
        let start = start_sampler.join().ok().flatten();
        let measurement = measurement?;
        let server_cpu_us_per_op = match (start, end) {
            (Some(start), Some(end)) => CpuUsage::between(&start, &end)
                .and_then(|usage| usage.microseconds_per_operation(measurement.total_iops)),
            _ => None,
        };
        Ok(MeasuredStep {
            measurement,
            server_cpu_us_per_op,
        })
    })
}

/// Runs every step of `profile` against `target`, calling `progress` before each step
/// with its label; with `server_pid`, each point carries the server's CPU per operation.
pub fn execute(
    fio_program: &str,
    profile: Profile,
    settings: &Settings,
    target: FioTarget,
    server_pid: Option<u32>,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<Vec<Point>> {
    let mut points = Vec::new();
    for (label, step) in closed_loop_steps(profile, settings) {
        check_interrupted()?;
        progress(&label);
        let measured = run_measured_step(fio_program, target, &step, server_pid)?;
        points.push(point(label, &step, false, measured));
    }
    if profile != Profile::RateSweep {
        return Ok(points);
    }
    let peak = points
        .first()
        .map_or(0.0, |point| point.measurement.total_iops);
    let mut control = match &settings.rate_targets {
        Some(targets) => RateSweepControl::from_targets(targets.clone()),
        None => RateSweepControl::from_peak(peak),
    };
    while let Some(target_iops) = control.next_target() {
        check_interrupted()?;
        let label = format!("rate{target_iops}");
        progress(&label);
        let step = settings.rate_step(Some(target_iops));
        let measured = run_measured_step(fio_program, target, &step, server_pid)?;
        let saturated = is_saturated(target_iops, &measured.measurement);
        control.record(saturated);
        points.push(point(label, &step, saturated, measured));
    }
    Ok(points)
}

/// The number of steps a profile runs, for the progress bar (rate sweeps: at most).
pub fn planned_step_count(profile: Profile, settings: &Settings) -> u64 {
    let closed = closed_loop_steps(profile, settings).len() as u64;
    match (profile, &settings.rate_targets) {
        (Profile::RateSweep, Some(targets)) => closed + targets.len() as u64,
        (Profile::RateSweep, None) => closed + RATE_FRACTIONS.len() as u64,
        _ => closed,
    }
}

fn point(label: String, step: &StepSpec, saturated: bool, measured: MeasuredStep) -> Point {
    Point {
        label,
        iodepth: step.iodepth,
        jobs: step.jobs,
        block_size_bytes: step.block_size_bytes,
        target_iops: step.target_iops,
        saturated,
        measurement: measured.measurement,
        server_cpu_us_per_op: measured.server_cpu_us_per_op,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn measurement(iops: f64, p99_us: f64) -> Measurement {
        Measurement {
            read_iops: iops,
            write_iops: 0.0,
            total_iops: iops,
            read_megabytes_per_second: iops * 4096.0 / 1e6,
            write_megabytes_per_second: 0.0,
            p50_us: p99_us / 2.0,
            p90_us: p99_us * 0.8,
            p99_us,
            p999_us: p99_us * 1.5,
            mean_us: p99_us / 2.0,
            max_us: p99_us * 3.0,
            full_queue_percent: 0.0,
            completed_ios: 1000,
        }
    }

    pub(crate) fn sample_point(iops: f64, p99_us: f64, saturated: bool) -> Point {
        Point {
            label: format!("rate{iops}"),
            iodepth: 64,
            jobs: 4,
            block_size_bytes: 4096,
            target_iops: Some(saturating_u64(iops.floor())),
            saturated,
            measurement: measurement(iops, p99_us),
            server_cpu_us_per_op: None,
        }
    }

    pub(crate) fn settings() -> Settings {
        Settings {
            runtime_seconds: 2,
            ramp_seconds: 0,
            region_bytes: 1 << 26,
            iodepth: 32,
            jobs: 1,
            max_jobs: 4,
            mix: Mix::Oltp,
            rate_jobs: 4,
            rate_iodepth: 64,
            rate_targets: None,
            slo_us: 1000.0,
        }
    }

    #[test]
    fn rate_sweep_stops_at_the_first_saturated_step() {
        let mut control = RateSweepControl::from_peak(10_000.0);
        let mut offered = Vec::new();
        while let Some(target) = control.next_target() {
            offered.push(target);
            // A server that keeps up to 6,000 IOPS.
            let achieved = (target as f64).min(6_000.0);
            control.record(is_saturated(target, &measurement(achieved, 100.0)));
        }
        assert_eq!(offered, vec![1000, 2000, 3000, 4000, 5000, 6000, 7000]);
    }

    #[test]
    fn rate_sweep_runs_all_targets_when_never_saturated_and_sorts_explicit_ones() {
        let mut control = RateSweepControl::from_targets(vec![300, 100, 200, 200]);
        let mut offered = Vec::new();
        while let Some(target) = control.next_target() {
            offered.push(target);
            control.record(false);
        }
        assert_eq!(offered, vec![100, 200, 300]);
        let mut control = RateSweepControl::from_peak(1_000.0);
        let mut count = 0;
        while control.next_target().is_some() {
            count += 1;
        }
        assert_eq!(count, RATE_FRACTIONS.len());
    }

    #[test]
    fn a_full_queue_is_saturation_even_at_the_target_rate() {
        let mut full = measurement(1000.0, 100.0);
        assert!(!is_saturated(1000, &full));
        full.full_queue_percent = 50.0;
        assert!(is_saturated(1000, &full));
        assert!(is_saturated(1000, &measurement(900.0, 100.0)));
    }

    #[test]
    fn headline_takes_the_best_unsaturated_point_within_the_objective() {
        let points = vec![
            sample_point(1000.0, 200.0, false),
            sample_point(2000.0, 400.0, false),
            sample_point(3000.0, 900.0, false),
            sample_point(3500.0, 5000.0, false),
            sample_point(3600.0, 800.0, true),
        ];
        let headline = headline(&points, 1000.0);
        assert_eq!(headline.iops_within_slo, Some(3000.0));
        assert_eq!(headline.peak_iops, 3600.0);
        assert_eq!(headline.slo_p99_us, 1000.0);
        let nothing = super::headline(&points[3..4], 1000.0);
        assert_eq!(nothing.iops_within_slo, None);
        assert_eq!(nothing.knee_iops, None);
    }

    #[test]
    fn knee_is_where_latency_turns_up() {
        // Flat until 8,000 IOPS, then steep.
        let curve = vec![
            (1000.0, 100.0),
            (2000.0, 102.0),
            (4000.0, 105.0),
            (8000.0, 120.0),
            (9000.0, 600.0),
            (9500.0, 3000.0),
        ];
        assert_eq!(knee_index(&curve), Some(3));
        assert_eq!(knee_index(&curve[..2]), None);
        let flat = vec![(1.0, 5.0), (2.0, 5.0), (3.0, 5.0)];
        assert_eq!(knee_index(&flat), None);
    }

    #[test]
    fn qd_sweep_steps_cover_depths_then_jobs() {
        let steps = closed_loop_steps(Profile::QdSweep, &settings());
        let labels: Vec<&str> = steps.iter().map(|(label, _)| label.as_str()).collect();
        assert_eq!(
            labels,
            vec![
                "qd1-jobs1",
                "qd2-jobs1",
                "qd4-jobs1",
                "qd8-jobs1",
                "qd16-jobs1",
                "qd32-jobs1",
                "qd64-jobs1",
                "qd128-jobs1",
                "qd32-jobs2",
                "qd32-jobs4"
            ]
        );
        assert!(steps.iter().all(|(_, step)| step.target_iops.is_none()));
        assert_eq!(planned_step_count(Profile::QdSweep, &settings()), 10);
        assert_eq!(
            planned_step_count(Profile::RateSweep, &settings()),
            1 + RATE_FRACTIONS.len() as u64
        );
        let seq = closed_loop_steps(Profile::Seq1m, &settings());
        assert_eq!(seq.len(), 2);
        assert_eq!(seq[0].1.block_size_bytes, 1 << 20);
    }
}
