//! The options every scenario repeats, declared once and flattened into each
//! scenario's arguments (`#[command(flatten)]`): where lamina and fio are, where the
//! data goes ([`CommonArgs`]) and where the report goes ([`OutputArgs`], also used
//! alone by the in-process scenarios, which start no server).

use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use crate::plot::PlotError;

/// The options of every scenario that starts servers or runs fio.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// The lamina binary (default: `lamina` beside this program, else on PATH).
    #[arg(long, env = "LAMINA_BIN")]
    pub lamina_bin: Option<PathBuf>,
    /// Directory for the data copies and pools (default: the system temporary
    /// directory).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// The fio program.
    #[arg(long, default_value = "fio")]
    pub fio: String,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for CommonArgs {
    fn default() -> Self {
        Self {
            lamina_bin: None,
            work_dir: None,
            fio: "fio".to_owned(),
            output: OutputArgs::default(),
        }
    }
}

impl CommonArgs {
    /// The lamina binary: the configured one, else `lamina` beside this program
    /// (cargo and packages put both in one directory), else `lamina` on PATH.
    pub fn lamina_program(&self) -> PathBuf {
        self.lamina_bin
            .clone()
            .or_else(|| {
                let beside = std::env::current_exe().ok()?.parent()?.join("lamina");
                beside.is_file().then_some(beside)
            })
            .unwrap_or_else(|| PathBuf::from("lamina"))
    }

    /// A private work directory under `--work-dir`, removed when dropped.
    pub fn work_directory(&self) -> anyhow::Result<tempfile::TempDir> {
        work_directory_in(self.work_dir.as_deref())
    }
}

/// A private work directory in `parent` (default: the system temporary directory),
/// removed when dropped.
pub fn work_directory_in(parent: Option<&Path>) -> anyhow::Result<tempfile::TempDir> {
    // Unix socket paths are limited to 108 bytes, so the directory name stays short.
    let mut builder = tempfile::Builder::new();
    builder.prefix("lbench");
    Ok(match parent {
        Some(directory) => builder.tempdir_in(directory)?,
        None => builder.tempdir()?,
    })
}

/// Where a scenario's report goes.
#[derive(Debug, Clone, Default, Args)]
pub struct OutputArgs {
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the JSON document to this file.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// Draw the figures to this file (.svg or .png), for the scenarios that chart.
    #[arg(long)]
    pub plot: Option<PathBuf>,
}

/// A report's chart: draws it to a path.
pub type Draw<'a> = Box<dyn FnOnce(&Path) -> Result<(), PlotError> + 'a>;

impl OutputArgs {
    /// Publishes a report: saved as JSON to `--output`, drawn by `draw` to `--plot`
    /// (an error for a scenario without a chart), and printed as JSON (`--json`) or
    /// as `table` followed by where it was saved.
    pub fn publish<T: Serialize>(
        &self,
        report: &T,
        table: &str,
        draw: Option<Draw<'_>>,
    ) -> anyhow::Result<()> {
        let document = serde_json::to_string_pretty(report)?;
        if let Some(path) = &self.output {
            std::fs::write(path, format!("{document}\n"))
                .map_err(|error| anyhow::anyhow!("cannot write {}: {error}", path.display()))?;
        }
        if let Some(path) = &self.plot {
            let draw = draw.ok_or_else(|| anyhow::anyhow!("this benchmark draws no chart"))?;
            draw(path)?;
        }
        if self.json {
            println!("{document}");
        } else {
            print!("{table}");
            if let Some(path) = &self.output {
                println!("json: {}", path.display());
            }
            if let Some(path) = &self.plot {
                println!("plot: {}", path.display());
            }
        }
        Ok(())
    }
}
