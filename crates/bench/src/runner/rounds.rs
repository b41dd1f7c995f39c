//! The loop every scenario shares: rows (servers, pools, cases, fill levels)
//! measured in rounds, each row started, measured and stopped by the scenario's own
//! step; a row that fails is skipped with its reason and the others go on (or, for a
//! scenario whose failure is its finding, the run stops); an interruption (Ctrl-C)
//! ends the run instead of being taken for a failure; the machine's load is
//! recorded around it all.

use crate::process::check_interrupted;
use crate::report::{RunNotes, Skipped, load_average};

/// In which order the rows run in each round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// The same order every round.
    Same,
    /// Reversed on every second round, so that a drift of the shared machine does not
    /// favour the rows that come first.
    Alternating,
}

/// What a failed row does to the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// The row is skipped with its reason; the others go on.
    Skip,
    /// The run ends with the row's error.
    Stop,
}

/// How the rows run: how many rounds, in which order, what a failure does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundPlan {
    pub rounds: u32,
    pub order: Order,
    pub on_failure: OnFailure,
}

impl RoundPlan {
    /// One round, failed rows skipped.
    pub fn once() -> Self {
        Self {
            rounds: 1,
            order: Order::Same,
            on_failure: OnFailure::Skip,
        }
    }
}

/// One row's result in one round.
#[derive(Debug, Clone)]
pub struct Measured<Sample> {
    /// The row's index in the labels given.
    pub row: usize,
    /// From 1.
    pub round: u32,
    pub sample: Sample,
}

/// What the rounds gave: the samples in the order measured, and the run's notes
/// (the rows skipped and why, the load average before and after).
#[derive(Debug)]
pub struct Outcome<Sample> {
    pub measured: Vec<Measured<Sample>>,
    pub run: RunNotes,
}

impl<Sample> Outcome<Sample> {
    /// The samples in the order measured, without their rows and rounds.
    pub fn samples(&mut self) -> Vec<Sample> {
        std::mem::take(&mut self.measured)
            .into_iter()
            .map(|measured| measured.sample)
            .collect()
    }
}

/// Measures every row named in `labels` in each round of `plan`, with
/// `measure(row, round)`. A row that fails is skipped (named with its round when
/// there is more than one) and the run goes on, unless the plan stops on failure.
pub fn each_round<Sample>(
    labels: &[String],
    plan: RoundPlan,
    mut measure: impl FnMut(usize, u32) -> anyhow::Result<Sample>,
) -> anyhow::Result<Outcome<Sample>> {
    let mut outcome = Outcome {
        measured: Vec::new(),
        run: RunNotes {
            load_average_start: load_average(),
            ..RunNotes::default()
        },
    };
    let rounds = plan.rounds;
    for round in 1..=rounds {
        let reversed = plan.order == Order::Alternating && round % 2 == 0;
        let rows: Vec<usize> = if reversed {
            (0..labels.len()).rev().collect()
        } else {
            (0..labels.len()).collect()
        };
        for row in rows {
            check_interrupted()?;
            match measure(row, round) {
                Ok(sample) => outcome.measured.push(Measured { row, round, sample }),
                Err(error) => {
                    check_interrupted()?;
                    if plan.on_failure == OnFailure::Stop {
                        return Err(error);
                    }
                    let server = if rounds > 1 {
                        format!("{} (round {round})", labels[row])
                    } else {
                        labels[row].clone()
                    };
                    outcome.run.skipped.push(Skipped {
                        server,
                        reason: first_lines(&format!("{error:#}")),
                    });
                }
            }
        }
    }
    outcome.run.load_average_end = load_average();
    Ok(outcome)
}

/// An error's first lines: fio repeats one error line per failed I/O.
fn first_lines(text: &str) -> String {
    const LINES_SHOWN: usize = 3;
    let lines: Vec<&str> = text.lines().collect();
    let mut shown = lines[..lines.len().min(LINES_SHOWN)].join(" / ");
    if lines.len() > LINES_SHOWN {
        shown.push_str(&format!(" (+{} lines)", lines.len() - LINES_SHOWN));
    }
    shown
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_alternate_and_failures_are_skipped_with_their_round() {
        let labels = vec!["a".to_owned(), "b".to_owned()];
        let plan = RoundPlan {
            rounds: 3,
            order: Order::Alternating,
            on_failure: OnFailure::Skip,
        };
        let outcome = each_round(&labels, plan, |row, round| {
            if row == 1 && round == 2 {
                anyhow::bail!("did not come up")
            }
            Ok(format!("{}{round}", labels[row]))
        })
        .expect("runs");
        let samples: Vec<&str> = outcome
            .measured
            .iter()
            .map(|measured| measured.sample.as_str())
            .collect();
        assert_eq!(samples, ["a1", "b1", "a2", "a3", "b3"]);
        assert_eq!(outcome.run.skipped.len(), 1);
        assert_eq!(outcome.run.skipped[0].server, "b (round 2)");
        assert_eq!(outcome.run.skipped[0].reason, "did not come up");
        assert!(outcome.run.load_average_start.is_some());
        let stop = RoundPlan {
            on_failure: OnFailure::Stop,
            ..plan
        };
        let failed = each_round(&labels, stop, |row, _| match row {
            0 => Ok(()),
            _ => anyhow::bail!("rebuild failed"),
        });
        assert_eq!(failed.expect_err("stops").to_string(), "rebuild failed");
    }
}
