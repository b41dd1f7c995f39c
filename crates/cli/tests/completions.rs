//! Shell completions and manual pages generated from the command line's
//! definition (issue 24): each shell's script names the real subcommands, bash
//! can source its script and then completes `lamina`, zsh and fish parse
//! theirs when installed, and `lamina man` writes a page per subcommand that
//! `man` can format.

mod common;

use std::process::Command;

use common::{LAMINA, Setup, system_path};

/// Subcommands every completion script and the manual must know.
const SUBCOMMANDS: [&str; 8] = [
    "serve",
    "pool",
    "volume",
    "snapshot",
    "clone",
    "completions",
    "man",
    "plan",
];

fn lamina_stdout(arguments: &[&str]) -> String {
    let output = Command::new(LAMINA).args(arguments).output().unwrap();
    assert!(
        output.status.success(),
        "lamina {arguments:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn every_shell_gets_a_script_naming_the_subcommands() {
    for shell in ["bash", "zsh", "fish"] {
        let script = lamina_stdout(&["completions", shell]);
        assert!(!script.trim().is_empty(), "{shell}: empty script");
        for subcommand in SUBCOMMANDS {
            assert!(
                script.contains(subcommand),
                "{shell}'s script lacks {subcommand}"
            );
        }
        // Second-level subcommands too.
        assert!(
            script.contains("rollback") && script.contains("scrub"),
            "{shell}"
        );
    }
    let refused = Command::new(LAMINA)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("bash, zsh, fish"));
}

#[test]
fn bash_sources_the_script_and_completes_lamina_and_its_subcommands() {
    // `complete -p lamina` fails unless sourcing registered a completion;
    // calling the function as bash would for `lamina vol<TAB>` checks that it
    // completes.
    let script = format!(
        "source <({LAMINA} completions bash) && complete -p lamina && \
         COMP_WORDS=(lamina vol) COMP_CWORD=1 COMP_LINE='lamina vol' COMP_POINT=10 && \
         _lamina lamina vol lamina && printf '%s\\n' \"${{COMPREPLY[@]}}\""
    );
    let output = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &script])
        .env("PATH", system_path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("-F _lamina lamina"), "{stdout}");
    assert!(
        stdout.lines().any(|line| line == "volume"),
        "`lamina vol<TAB>` should offer volume:\n{stdout}"
    );
}

#[test]
fn zsh_and_fish_parse_their_scripts_when_installed() {
    for (shell, arguments) in [("zsh", ["-n"]), ("fish", ["--no-execute"])] {
        let Ok(path) = which(shell) else {
            eprintln!("{shell} is not installed: its script is checked only for content");
            continue;
        };
        let setup = Setup::new();
        let file = setup.root.join(format!("lamina.{shell}"));
        std::fs::write(&file, lamina_stdout(&["completions", shell])).unwrap();
        let status = Command::new(path)
            .args(arguments)
            .arg(&file)
            .status()
            .unwrap();
        assert!(
            status.success(),
            "{shell} cannot parse its completion script"
        );
    }
}

fn which(program: &str) -> Result<String, ()> {
    let output = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .env("PATH", system_path())
        .output()
        .map_err(|_| ())?;
    match output.status.success() {
        true => Ok(String::from_utf8_lossy(&output.stdout).trim().to_string()),
        false => Err(()),
    }
}

#[test]
fn man_prints_lamina_1_and_writes_a_page_per_subcommand() {
    let page = lamina_stdout(&["man"]);
    assert!(page.contains(".TH lamina 1"), "{page}");
    for subcommand in SUBCOMMANDS {
        assert!(page.contains(subcommand), "lamina(1) lacks {subcommand}");
    }

    let setup = Setup::new();
    let directory = setup.root.join("man1");
    let listing = lamina_stdout(&["man", "--output", directory.to_str().unwrap()]);
    for name in [
        "lamina.1",
        "lamina-serve.1",
        "lamina-pool-create.1",
        "lamina-volume-resize.1",
        "lamina-snapshot-rollback.1",
        "lamina-completions.1",
    ] {
        let path = directory.join(name);
        assert!(path.is_file(), "{name} not written");
        assert!(listing.contains(path.to_str().unwrap()), "{listing}");
    }
    let serve = std::fs::read_to_string(directory.join("lamina-serve.1")).unwrap();
    assert!(serve.contains("tcp\\-address"), "options are documented");

    // man formats the page (a real reader, not only a file that exists).
    let formatted = Command::new("man")
        .arg("--local-file")
        .arg(directory.join("lamina-pool-create.1"))
        .env("PATH", system_path())
        .env("MANWIDTH", "80")
        .env("MANPAGER", "cat")
        .output();
    match formatted {
        Ok(output) if output.status.success() => {
            let text = String::from_utf8_lossy(&output.stdout);
            assert!(text.contains("--flash"), "{text}");
        }
        Ok(output) => panic!(
            "man cannot format lamina-pool-create.1: {}",
            String::from_utf8_lossy(&output.stderr)
        ),
        Err(error) => panic!("cannot run man ({error}): install the Debian package man-db"),
    }
}
