//! `lamina bench ARGS`: runs the `lamina-bench` program with the same arguments.
//! The benchmarks are a binary of their own so that the daemon's binary does not
//! carry them, their plotting and their peers' harness (decision 0060); this shim
//! keeps the command users know. The program is looked for beside this executable
//! first (cargo and packages install both there), then on PATH.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use clap::Args;

/// The benchmark program's file name.
const BENCH_PROGRAM: &str = "lamina-bench";

/// Arguments of `lamina bench`: passed to `lamina-bench` as they are.
#[derive(Debug, Args)]
#[command(disable_help_flag = true)]
pub struct BenchArgs {
    /// The `lamina-bench` subcommand and its options (`lamina bench --help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    arguments: Vec<OsString>,
}

/// Why `lamina bench` could not start the benchmark program.
#[derive(Debug, thiserror::Error)]
pub enum BenchShimError {
    #[error(
        "the benchmarks are a separate program, `{BENCH_PROGRAM}`, found neither beside {exe} \
         nor on PATH: build it with `cargo build --release -p lamina-bench` (it lands beside \
         `lamina` in target/release) or install it with `cargo install --path crates/bench`"
    )]
    Missing { exe: String },
    #[error("cannot run {program}: {source}")]
    Exec {
        program: String,
        source: std::io::Error,
    },
}

/// Replaces this process with `lamina-bench ARGS`; returns only if that fails.
pub fn run(arguments: BenchArgs) -> anyhow::Result<()> {
    let own_executable = std::env::current_exe().ok();
    let program =
        find_bench_program(own_executable.as_deref()).ok_or_else(|| BenchShimError::Missing {
            exe: own_executable.as_deref().map_or_else(
                || "this program".to_owned(),
                |path| path.display().to_string(),
            ),
        })?;
    // exec: the benchmark's exit status, signals and terminal are the user's directly.
    let source = std::process::Command::new(&program)
        .args(&arguments.arguments)
        .exec();
    Err(BenchShimError::Exec {
        program: program.display().to_string(),
        source,
    }
    .into())
}

/// `lamina-bench` beside `own_executable`, else the first on PATH.
fn find_bench_program(own_executable: Option<&Path>) -> Option<PathBuf> {
    let beside = own_executable
        .and_then(Path::parent)
        .map(|directory| directory.join(BENCH_PROGRAM))
        .filter(|candidate| candidate.is_file());
    beside.or_else(|| {
        let path_variable = std::env::var_os("PATH")?;
        std::env::split_paths(&path_variable)
            .map(|directory| directory.join(BENCH_PROGRAM))
            .find(|candidate| candidate.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_beside_the_executable_is_preferred() {
        let directory = tempfile::tempdir().unwrap();
        let program = directory.path().join(BENCH_PROGRAM);
        std::fs::write(&program, b"").unwrap();
        let own = directory.path().join("lamina");
        assert_eq!(find_bench_program(Some(&own)), Some(program));
    }
}
