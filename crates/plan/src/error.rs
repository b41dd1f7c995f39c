//! Operating errors of the planner: a trace that cannot be read or holds no usable
//! samples, and options that make no sense. Bad rows inside a readable trace are not
//! errors; they are counted and reported as warnings by the parsers.

use std::path::PathBuf;

/// Everything that stops `lamina plan` from producing a report.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The trace (or address trace) file could not be opened or read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read but is not in the expected format at all.
    #[error("{path}: not a {format} trace: {reason}")]
    Format {
        path: PathBuf,
        format: &'static str,
        reason: String,
    },
    /// The file parsed but not a single row was usable.
    #[error("{path}: no usable samples ({skipped_row_count} rows skipped); {reason}")]
    NoSamples {
        path: PathBuf,
        skipped_row_count: usize,
        reason: String,
    },
    /// A command-line value is out of range or malformed.
    #[error("invalid option {option}: {reason}")]
    Option {
        option: &'static str,
        reason: String,
    },
    /// The timeline plot could not be drawn or written.
    #[error("cannot write plot {path}: {reason}")]
    Plot { path: PathBuf, reason: String },
}
