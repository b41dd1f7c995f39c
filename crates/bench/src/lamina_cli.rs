//! The `lamina` command line run against one data directory: how the scenarios
//! create pools and volumes, take snapshots, fail devices and read the admin API's
//! JSON documents ([`lamina_api`]), and the NBD URI of an export the daemon serves
//! from that directory; a pool served by its own daemon with that command line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::process::run_helper;
use crate::servers::{RunningServer, serve_lamina_data};

/// `lamina ARGUMENTS` printed something that is not the JSON document expected
/// (not JSON, or a field missing or renamed: the error names it).
#[derive(Debug, thiserror::Error)]
#[error("`lamina {command}` printed no JSON of the expected shape ({source}): {stdout}")]
pub struct NoJsonError {
    pub command: String,
    pub stdout: String,
    pub source: serde_json::Error,
}

/// A lamina binary and the data directory its commands name with `--data`.
#[derive(Debug, Clone)]
pub struct LaminaCli {
    program: PathBuf,
    data: PathBuf,
}

impl LaminaCli {
    pub fn new(program: &Path, data: &Path) -> Self {
        Self {
            program: program.to_owned(),
            data: data.to_owned(),
        }
    }

    /// The data directory.
    pub fn data(&self) -> &Path {
        &self.data
    }

    /// `lamina ARGUMENTS --data DATA`, not yet run.
    pub fn command(&self, arguments: &[&str]) -> Command {
        let mut command = Command::new(&self.program);
        command.args(arguments).arg("--data").arg(&self.data);
        command
    }

    /// Runs `lamina ARGUMENTS --data DATA`; fails with its stderr when it fails.
    pub fn run(&self, arguments: &[&str]) -> anyhow::Result<Output> {
        run_helper(self.command(arguments))
    }

    /// Runs `lamina ARGUMENTS --data DATA` and reads the JSON it prints as `T`.
    pub fn json<T: serde::de::DeserializeOwned>(&self, arguments: &[&str]) -> anyhow::Result<T> {
        let output = self.run(arguments)?;
        serde_json::from_slice(&output.stdout).map_err(|source| {
            NoJsonError {
                command: arguments.join(" "),
                stdout: String::from_utf8_lossy(&output.stdout).trim().to_owned(),
                source,
            }
            .into()
        })
    }

    /// The NBD URI of `export` on the daemon serving this data directory.
    pub fn uri(&self, export: &str) -> String {
        export_uri(&self.data, export)
    }
}

/// A lamina pool served by its own daemon, and the command line that administers it.
#[derive(Debug)]
pub struct ServedPool {
    pub cli: LaminaCli,
    pub server: RunningServer,
}

impl ServedPool {
    /// Serves the pool in `data` with `extra_config` (see [`serve_lamina_data`]:
    /// `directory` holds `data` and is removed on stop) once `export` answers.
    pub fn serve(
        program: &Path,
        directory: &Path,
        data: &Path,
        extra_config: &str,
        export: &str,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            cli: LaminaCli::new(program, data),
            server: serve_lamina_data(program, directory, data, extra_config, export)?,
        })
    }
}

/// The NBD URI of `export` on the daemon serving the data directory `data`.
pub fn export_uri(data: &Path, export: &str) -> String {
    format!(
        "nbd+unix:///{export}?socket={}",
        data.join("nbd.sock").display()
    )
}
