//! The loop every side-by-side scenario shares: rows (servers, pools, cases) measured
//! in rounds, each row started, measured and stopped by the scenario's own step; a
//! row that fails is skipped with its reason and the others go on; an interruption
//! (Ctrl-C) ends the run instead of being taken for a failure; the machine's load
//! is recorded around it all.

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

/// Measures every row named in `labels` in each of `rounds` rounds, in `order`, with
/// `measure(row, round)`. A row that fails is skipped (named with its round when
/// there is more than one) and the run goes on.
pub fn each_round<Sample>(
    labels: &[String],
    rounds: u32,
    order: Order,
    mut measure: impl FnMut(usize, u32) -> anyhow::Result<Sample>,
) -> anyhow::Result<Outcome<Sample>> {
    let mut outcome = Outcome {
        measured: Vec::new(),
        run: RunNotes {
            load_average_start: load_average(),
            ..RunNotes::default()
        },
    };
    for round in 1..=rounds {
        let reversed = order == Order::Alternating && round % 2 == 0;
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
        let outcome = each_round(&labels, 3, Order::Alternating, |row, round| {
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
    }
}
