//! The one runner of the scenarios that set servers side by side (decision 0060): a
//! scenario is data ([`Scenario`]: the rows, which server each starts and how its
//! export is prepared; the workloads, fio steps; the rounds), and this module does
//! the rest for every one of them. Each round starts every row in turn through the
//! one process wrapper, runs every workload against it with the server's CPU time
//! watched, and stops it, so that rows interleave and a drift of the shared machine
//! falls on all of them alike. A cell is the median of its rounds
//! ([`crate::harness::statistics`]); the cells print through [`crate::harness::table`]
//! with their ratio to the reference row and publish as one JSON document.

pub mod rounds;
mod start;

use serde::Serialize;

pub use rounds::{OnFailure, Order, RoundPlan, each_round};
pub use start::{Ground, Preparation, Server, SharedPool};

use crate::fio::StepSpec;
use crate::harness::statistics::{median, median_if_any};
use crate::harness::table::{Table, optional};
use crate::process::check_interrupted;
use crate::report::{RunNotes, format_number, load_average, ratio};
use crate::workload::run_measured_step;

/// One row of a scenario: its label in the table, its server, its preparation.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub label: String,
    pub server: Server,
    pub preparation: Preparation,
}

/// One workload of a scenario: its name in the table and its fio step (the
/// step's region is the row's: the scenario's size, or what a pool file's data fills).
#[derive(Debug, Clone, Serialize)]
pub struct Workload {
    pub name: String,
    pub step: StepSpec,
}

/// A scenario as data: what runs, against what, how often.
#[derive(Debug, Clone, Serialize)]
pub struct Scenario {
    pub name: String,
    pub rounds: u32,
    /// Bytes of random data every row's export holds (or covers).
    pub size_bytes: u64,
    pub rows: Vec<Row>,
    pub workloads: Vec<Workload>,
    /// The pool the `lamina-shared` rows serve, made once before the first round.
    pub shared_pool: Option<SharedPool>,
    /// The row the ratios are to (the first row measured when absent).
    pub reference: Option<String>,
}

/// One workload on one row in one round.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub round: u32,
    pub row: String,
    pub workload: String,
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    /// Server CPU time (user + system of its process tree) per operation, over the
    /// measured part of the run; none for the rows fio reads itself.
    pub server_cpu_us_per_op: Option<f64>,
}

/// The medians of one row and workload over the rounds, with ratios to the reference.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    pub row: String,
    pub workload: String,
    pub rounds: usize,
    pub iops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub server_cpu_us_per_op: Option<f64>,
    pub iops_ratio: Option<f64>,
    pub server_cpu_ratio: Option<f64>,
}

/// What a scenario measured: its description, every sample and the cells.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioReport {
    pub scenario: Scenario,
    pub fio_version: String,
    pub reference: Option<String>,
    pub cells: Vec<Cell>,
    pub samples: Vec<Sample>,
    #[serde(flatten)]
    pub run: RunNotes,
}

/// Runs `scenario` on `ground` (its random data written, under its work directory).
pub fn run(scenario: Scenario, ground: &mut Ground) -> anyhow::Result<ScenarioReport> {
    let fio_version = crate::fio::version(&ground.fio)?;
    if let Some(pool) = &scenario.shared_pool {
        eprintln!("{}: making the shared pool", scenario.name);
        ground.make_pool(pool)?;
    }
    let labels: Vec<String> = scenario.rows.iter().map(|row| row.label.clone()).collect();
    let mut notes = Vec::new();
    let plan = RoundPlan {
        rounds: scenario.rounds,
        ..RoundPlan::once()
    };
    let mut outcome = each_round(&labels, plan, |row, round| {
        if row == 0 {
            let load = load_average().unwrap_or_default();
            eprintln!("round {round}/{}: load {load}", scenario.rounds);
        }
        run_row(&scenario, &scenario.rows[row], round, ground, &mut notes)
    })?;
    let samples: Vec<Sample> = outcome.samples().into_iter().flatten().collect();
    let mut run = outcome.run;
    run.notes = notes;
    let reference = scenario
        .reference
        .clone()
        .filter(|label| samples.iter().any(|sample| &sample.row == label))
        .or_else(|| samples.first().map(|sample| sample.row.clone()));
    let cells = cells(&scenario, &samples, reference.as_deref());
    Ok(ScenarioReport {
        scenario,
        fio_version,
        reference,
        cells,
        samples,
        run,
    })
}

/// Starts one row, runs every workload against it, stops it.
fn run_row(
    scenario: &Scenario,
    row: &Row,
    round: u32,
    ground: &Ground,
    notes: &mut Vec<String>,
) -> anyhow::Result<Vec<Sample>> {
    let directory = ground.work.join(format!("run-{round}-{}", row.label));
    let started = ground.start(&row.server, row.preparation, &directory)?;
    if round == 1 {
        notes.extend(
            started
                .notes()
                .iter()
                .map(|note| format!("{}: {note}", row.label)),
        );
    }
    let mut samples = Vec::new();
    for workload in &scenario.workloads {
        check_interrupted()?;
        let step = StepSpec {
            region_bytes: started.region_bytes(),
            ..workload.step.clone()
        };
        let measured = run_measured_step(&ground.fio, started.target(), &step, started.pid())?;
        let measurement = &measured.measurement;
        let sample = Sample {
            round,
            row: row.label.clone(),
            workload: workload.name.clone(),
            iops: measurement.total_iops,
            p50_us: measurement.p50_us,
            p99_us: measurement.p99_us,
            server_cpu_us_per_op: measured.server_cpu_us_per_op,
        };
        eprintln!(
            "  {} {}: {} IOPS, p50 {:.1} us, p99 {:.1} us, cpu {} us/op",
            sample.row,
            sample.workload,
            format_number(sample.iops),
            sample.p50_us,
            sample.p99_us,
            sample
                .server_cpu_us_per_op
                .map_or("-".to_owned(), |cpu| format!("{cpu:.2}"))
        );
        samples.push(sample);
    }
    started.stop();
    Ok(samples)
}

/// The medians of every row and workload that has samples, in the scenario's order.
fn cells(scenario: &Scenario, samples: &[Sample], reference: Option<&str>) -> Vec<Cell> {
    let of = |row: &str, workload: &str| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|sample| sample.row == row && sample.workload == workload)
            .collect()
    };
    let medians = |chosen: &[&Sample], figure: fn(&Sample) -> Option<f64>| {
        median_if_any(
            &chosen
                .iter()
                .filter_map(|sample| figure(sample))
                .collect::<Vec<_>>(),
        )
    };
    let mut cells = Vec::new();
    for row in &scenario.rows {
        for workload in &scenario.workloads {
            let chosen = of(&row.label, &workload.name);
            if chosen.is_empty() {
                continue;
            }
            let reference_samples = reference
                .map(|label| of(label, &workload.name))
                .unwrap_or_default();
            let iops = |chosen: &[&Sample]| medians(chosen, |sample| Some(sample.iops));
            let cpu = |chosen: &[&Sample]| medians(chosen, |sample| sample.server_cpu_us_per_op);
            cells.push(Cell {
                row: row.label.clone(),
                workload: workload.name.clone(),
                rounds: chosen.len(),
                iops: iops(&chosen).unwrap_or(f64::NAN),
                p50_us: median(
                    &chosen
                        .iter()
                        .map(|sample| sample.p50_us)
                        .collect::<Vec<_>>(),
                ),
                p99_us: median(
                    &chosen
                        .iter()
                        .map(|sample| sample.p99_us)
                        .collect::<Vec<_>>(),
                ),
                server_cpu_us_per_op: cpu(&chosen),
                iops_ratio: ratio(iops(&chosen), iops(&reference_samples)),
                server_cpu_ratio: ratio(cpu(&chosen), cpu(&reference_samples)),
            });
        }
    }
    cells
}

impl ScenarioReport {
    /// The cells as a table, ratios to the reference row, then the footer.
    pub fn table(&self) -> String {
        let table = Table::new()
            .column("row", |cell: &Cell| cell.row.clone())
            .column("workload", |cell| cell.workload.clone())
            .column("rounds", |cell| cell.rounds.to_string())
            .column("IOPS", |cell| format_number(cell.iops))
            .column("x ref", |cell| optional(cell.iops_ratio, 2))
            .column("p50 us", |cell| format!("{:.1}", cell.p50_us))
            .column("p99 us", |cell| format!("{:.1}", cell.p99_us))
            .column("cpu us/op", |cell| optional(cell.server_cpu_us_per_op, 2))
            .column("cpu x ref", |cell| optional(cell.server_cpu_ratio, 2));
        let mut out = format!(
            "{} ({} rounds, medians; ratios are row / {})\n",
            self.scenario.name,
            self.scenario.rounds,
            self.reference.as_deref().unwrap_or("-")
        );
        out.push_str(&table.render(&self.cells));
        out.push_str(&self.run.footer());
        out
    }
}
