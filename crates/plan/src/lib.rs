//! `lamina plan`: sizes a pool from a workload trace (placeholder until built).

/// Command-line arguments of `lamina plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// The trace to analyse.
    #[arg(long)]
    pub trace: std::path::PathBuf,
}

/// Runs `lamina plan`.
pub fn run(arguments: PlanArgs) -> anyhow::Result<()> {
    anyhow::bail!(
        "lamina plan is not built yet (trace {})",
        arguments.trace.display()
    )
}
