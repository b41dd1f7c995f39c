//! `lamina bench`: latency-versus-load benchmarks (placeholder until built).

/// Command-line arguments of `lamina bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// What to run.
    pub action: String,
}

/// Runs `lamina bench`.
pub fn run(arguments: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("lamina bench is not built yet ({})", arguments.action)
}
