//! `lamina-bench ab`: lamina builds (and their peers) side by side in interleaved
//! rounds, medians, ratios to the first row and server CPU time per operation: the
//! one harness of the before/after comparisons that were shell scripts
//! (`scripts/bench-read-ab.sh`, `bench-cache-miss.sh`, `bench-connections.sh`,
//! `bench-write-cpu.sh`, `bench-read-ceiling.sh`, `cpu-per-op`; decision 0060). Each
//! comparison is a preset ([`presets`]), a scenario written as data over the one
//! runner ([`crate::runner`]).

pub mod presets;

use clap::Args;
use lamina_api::size::parse_size;

use crate::harness::arguments::CommonArgs;
use crate::runner::{Ground, ScenarioReport};
use presets::{Build, Cache, Choices, Preset};

/// Arguments of `lamina-bench ab`.
#[derive(Debug, Clone, Args)]
pub struct AbArgs {
    /// The comparison.
    #[arg(long, value_enum)]
    pub preset: Preset,
    /// A lamina build as LABEL=BINARY, repeated or comma-separated; the first makes
    /// the shared pool (default: lamina=the --lamina-bin binary).
    #[arg(long = "build", value_delimiter = ',')]
    pub builds: Vec<String>,
    /// Rounds; every row runs once per round, rows interleaved.
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Seconds measured per workload (default: the preset's).
    #[arg(long)]
    pub runtime: Option<u64>,
    /// Seconds run before measuring (default: the preset's).
    #[arg(long)]
    pub ramp: Option<u64>,
    /// Bytes of data every export holds (default: the preset's, 1G or 2G).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// connections: the connection counts (the total queue depth stays 32).
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8])]
    pub connections: Vec<u32>,
    /// read-ab: the cache settings of every build.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Cache::Warm, Cache::Cold])]
    pub cache: Vec<Cache>,
    /// write-cpu: runs in a row on each fresh pool (later ones find the cleaner busy).
    #[arg(long, default_value_t = 3)]
    pub runs_per_pool: u32,
    /// write-cpu: the 70/30 mix instead of random writes.
    #[arg(long)]
    pub mixed: bool,
    /// cpu-per-op: lamina's memory cache (default: the size of the data).
    #[arg(long, value_parser = parse_size)]
    pub memory_cache: Option<u64>,
    /// A `KEY = VALUE` line for lamina's `[server]` section, repeated (for example
    /// `volume_latency_histograms = false`).
    #[arg(long)]
    pub server_setting: Vec<String>,
    #[command(flatten)]
    pub common: CommonArgs,
}

impl AbArgs {
    /// The builds: `LABEL=BINARY`, or a bare binary named by its file name.
    fn builds(&self) -> anyhow::Result<Vec<Build>> {
        if self.builds.is_empty() {
            return Ok(vec![Build {
                label: "lamina".to_owned(),
                program: self.common.lamina_program(),
            }]);
        }
        self.builds
            .iter()
            .map(|argument| {
                let (label, program) = argument.split_once('=').ok_or_else(|| {
                    anyhow::anyhow!("--build takes LABEL=BINARY, not {argument:?}")
                })?;
                Ok(Build {
                    label: label.to_owned(),
                    program: program.into(),
                })
            })
            .collect()
    }

    fn choices(&self) -> anyhow::Result<Choices> {
        let (size_bytes, runtime_seconds, ramp_seconds) = self.preset.defaults();
        let choices = Choices {
            builds: self.builds()?,
            rounds: self.rounds,
            runtime_seconds: self.runtime.unwrap_or(runtime_seconds),
            ramp_seconds: self.ramp.unwrap_or(ramp_seconds),
            size_bytes: self.size.unwrap_or(size_bytes),
            connections: self.connections.clone(),
            caches: self.cache.clone(),
            runs_per_pool: self.runs_per_pool,
            mixed: self.mixed,
            memory_cache_bytes: self.memory_cache,
            server_settings: self.server_setting.clone(),
        };
        if choices.rounds == 0 || choices.runtime_seconds == 0 || choices.runs_per_pool == 0 {
            anyhow::bail!("--rounds, --runtime and --runs-per-pool must be positive");
        }
        if choices.connections.contains(&0) || !choices.size_bytes.is_multiple_of(4096) {
            anyhow::bail!("connections must be positive and --size a multiple of 4 KiB");
        }
        Ok(choices)
    }
}

/// Runs the chosen comparison and returns its report (the CLI prints it; tests
/// inspect it).
pub fn measure(arguments: &AbArgs) -> anyhow::Result<ScenarioReport> {
    crate::process::install_interrupt_handler();
    crate::process::become_subreaper();
    let choices = arguments.choices()?;
    let scenario = arguments.preset.scenario(&choices);
    let work = arguments.common.work_directory()?;
    let mut ground = Ground::new(work.path(), choices.size_bytes, &arguments.common.fio)?;
    crate::runner::run(scenario, &mut ground)
}

/// Runs `lamina-bench ab`.
pub fn run_ab(arguments: &AbArgs) -> anyhow::Result<()> {
    let report = measure(arguments)?;
    arguments
        .common
        .output
        .publish(&report, &report.table(), None)
}
