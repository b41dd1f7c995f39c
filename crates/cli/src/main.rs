//! The `lamina` command line: placeholder until the subcommands are wired.
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "lamina", version, about = "Flash-first virtual block storage")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Size a pool from a workload trace.
    Plan(lamina_plan::PlanArgs),
    /// Latency-versus-load benchmarks against peer servers.
    Bench(lamina_bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Plan(arguments) => lamina_plan::run(arguments),
        Command::Bench(arguments) => lamina_bench::run(arguments),
    }
}
