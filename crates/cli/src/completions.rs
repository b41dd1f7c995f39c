//! `lamina completions SHELL` and `lamina man`: shell completions and manual
//! pages generated from the command line's clap definition, so that they name
//! exactly the subcommands and options this binary has.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, ValueEnum};

/// The shells `lamina completions` writes for.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell: bash, zsh or fish.
    #[arg(value_enum)]
    pub shell: CompletionShell,
}

#[derive(Args)]
pub struct ManArgs {
    /// Write lamina.1 and one page per subcommand (lamina-pool-create.1, ...)
    /// into DIR instead of printing lamina(1).
    #[arg(long, value_name = "DIR")]
    pub output: Option<PathBuf>,
}

/// Prints the completion script for `shell` on stdout.
pub fn print_completions(
    arguments: &CompletionsArgs,
    mut command: clap::Command,
) -> anyhow::Result<()> {
    let shell = match arguments.shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    let name = command.get_name().to_string();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, name, &mut script);
    write_stdout(&script)
}

/// Prints lamina(1), or with `--output DIR` writes every page there and lists
/// the files written.
pub fn write_man_pages(arguments: &ManArgs, command: clap::Command) -> anyhow::Result<()> {
    match &arguments.output {
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(command).render(&mut page)?;
            write_stdout(&page)
        }
        Some(directory) => write_man_directory(directory, command),
    }
}

/// Writes `bytes` to stdout; a reader that stopped early (`| head`) is not an
/// error.
fn write_stdout(bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        result => result.context("cannot write to standard output"),
    }
}

fn write_man_directory(directory: &Path, command: clap::Command) -> anyhow::Result<()> {
    std::fs::create_dir_all(directory)
        .with_context(|| format!("cannot create the directory {}", directory.display()))?;
    clap_mangen::generate_to(command, directory).with_context(|| {
        format!(
            "cannot write manual pages into {} (is it writable?)",
            directory.display()
        )
    })?;
    let mut written: Vec<_> = std::fs::read_dir(directory)?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "1"))
        .collect();
    written.sort();
    let listing: String = written
        .iter()
        .map(|path| format!("{}\n", path.display()))
        .collect();
    write_stdout(listing.as_bytes())
}
