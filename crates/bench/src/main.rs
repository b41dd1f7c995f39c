//! The `lamina-bench` program: the benchmarks as a binary of their own, so that the
//! daemon's binary does not carry them (decision 0060). `lamina bench ARGS` runs this
//! program with the same arguments.

use clap::Parser;
use tracing_subscriber::EnvFilter;

/// The environment variable that sets the log filter, as for the `lamina` daemon.
const LOG_ENVIRONMENT_VARIABLE: &str = "LAMINA_LOG";

/// Benchmarks: latency versus load against peer servers, side by side.
#[derive(Debug, Parser)]
#[command(name = "lamina-bench", version)]
struct Cli {
    #[command(subcommand)]
    command: lamina_bench::BenchCommand,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Benchmarks report their progress at `info`, as they did inside `lamina`.
    let filter = EnvFilter::try_from_env(LOG_ENVIRONMENT_VARIABLE)
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let arguments = lamina_bench::BenchArgs {
        command: cli.command,
    };
    match lamina_bench::run(arguments) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
