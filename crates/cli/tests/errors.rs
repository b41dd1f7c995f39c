//! The CLI's answer to common mistakes (issue 24): each exits non-zero with
//! one line (clap's usage errors: one line and its `--help` pointer) that says
//! what failed, names the object it failed on, and says what to do — a missing
//! device says "no such file" with its path, not an I/O error at offset 0.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::{LAMINA, Setup, lamina};

/// A mistake's stderr, checked: non-zero exit, at most `lines_max` non-empty
/// lines, and every one of `expected` present.
fn check_mistake(output: std::process::Output, lines_max: usize, expected: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "should have failed: {stderr}");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    assert!(
        !lines.is_empty() && lines.len() <= lines_max,
        "expected at most {lines_max} line(s):\n{stderr}"
    );
    assert!(
        lines[0].starts_with("lamina: error: ") || lines[0].starts_with("error: "),
        "{stderr}"
    );
    for text in expected {
        assert!(stderr.contains(text), "{text:?} missing from:\n{stderr}");
    }
    for vague in ["I/O error", "offset 0, length 0", "os error", "panicked"] {
        assert!(!stderr.contains(vague), "{vague:?} in:\n{stderr}");
    }
    stderr
}

fn create_pool(setup: &Setup, flash: &str) {
    let output = lamina(&setup.data_dir, &["pool", "create", "--flash", flash]);
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn a_missing_device_is_named_with_no_such_file_and_what_to_do() {
    let setup = Setup::new();
    let image = setup.root.join("pool.img");
    create_pool(&setup, &format!("{}:256M", image.display()));
    std::fs::remove_file(&image).unwrap();
    let image_path = image.display().to_string();
    check_mistake(
        lamina(&setup.data_dir, &["volume", "list"]),
        1,
        &[&image_path, "no such file", "pool.toml", "attach it again"],
    );

    // A new image in a directory that does not exist.
    let nowhere = setup.root.join("nowhere/pool.img");
    let other = setup.root.join("other");
    check_mistake(
        lamina(
            &other,
            &[
                "pool",
                "create",
                "--flash",
                &format!("{}:64M", nowhere.display()),
            ],
        ),
        1,
        &[
            &nowhere.display().to_string(),
            "no such file",
            "create its directory",
        ],
    );
    // An existing device named without a size that is not there.
    check_mistake(
        lamina(&other, &["pool", "create", "--flash", &image_path]),
        1,
        &[&image_path, "does not exist", "PATH:SIZE"],
    );
}

#[test]
fn no_pool_unknown_names_and_bad_sizes_say_what_to_run() {
    let setup = Setup::new();
    let empty = setup.root.join("empty");
    let empty_text = empty.display().to_string();
    check_mistake(
        lamina(&empty, &["volume", "list"]),
        1,
        &["no pool in", &empty_text, "lamina pool create"],
    );

    create_pool(&setup, &setup.device("pool.img:256M"));
    let data = setup.data_dir.display().to_string();
    check_mistake(
        lamina(&setup.data_dir, &["volume", "delete", "ghost"]),
        1,
        &["no such volume: ghost", "lamina volume list", &data],
    );
    check_mistake(
        lamina(&setup.data_dir, &["snapshot", "delete", "ghost@monday"]),
        1,
        &["ghost", "lamina volume list"],
    );
    check_mistake(
        lamina(&setup.data_dir, &["volume", "create", "db", "12Q"]),
        2,
        &["12Q", "use K, M, G, T or P", "20G"],
    );
    check_mistake(
        lamina(&setup.data_dir, &["volume", "create", "db", "lots"]),
        2,
        &["lots", "a number with an optional K, M, G, T or P suffix"],
    );
    lamina(&setup.data_dir, &["volume", "create", "db", "16M"]);
    check_mistake(
        lamina(&setup.data_dir, &["volume", "create", "db", "16M"]),
        1,
        &["volume db already exists", "pick another name"],
    );
}

#[test]
fn a_daemon_that_died_leaves_no_error_behind() {
    // A stale admin.sock (the daemon was killed) is not a mistake the user
    // must fix: commands open the pool directly.
    let setup = Setup::new();
    let daemon = common::Daemon::start(&setup.data_dir);
    daemon.kill_hard();
    assert!(setup.data_dir.join("admin.sock").exists());
    let output = lamina(&setup.data_dir, &["volume", "list"]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `lamina serve` with a config that must stop it at start; a daemon that
/// serves anyway is killed (by its PID) and fails the test.
fn serve_with(config: &Path) -> std::process::Output {
    let mut child = Command::new(LAMINA)
        .args(["serve", "--data"])
        .arg(config.with_extension("data"))
        .arg("--config")
        .arg(config)
        .env("LAMINA_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if common::wait_with_timeout(&mut child, common::EXIT_TIMEOUT_MS).is_none() {
        child.kill().unwrap();
        child.wait().unwrap();
        panic!("lamina serve started with {}", config.display());
    }
    child.wait_with_output().unwrap()
}

#[test]
fn an_invalid_config_is_one_line_with_the_file_place_and_key() {
    let setup = Setup::new();
    let config = setup.root.join("lamina.toml");
    let config_text = config.display().to_string();
    std::fs::write(&config, "[server]\ntcp_adress = \"127.0.0.1:1\"\n").unwrap();
    check_mistake(
        serve_with(&config),
        1,
        &[
            &config_text,
            "line 2, column 1",
            "tcp_adress",
            "tcp_address",
            "fix the file",
        ],
    );
    std::fs::write(&config, "[server\n").unwrap();
    check_mistake(serve_with(&config), 1, &[&config_text, "line 1"]);
    std::fs::write(&config, "[log]\nlevel = \"lamina=loud\"\n").unwrap();
    check_mistake(serve_with(&config), 1, &[&config_text, "[log] level"]);
    std::fs::write(&config, "[limits]\nflush_interval_ms = 0\n").unwrap();
    check_mistake(
        serve_with(&config),
        1,
        &[&config_text, "flush_interval_ms must be at least 1"],
    );
    let missing = setup.root.join("missing.toml");
    check_mistake(
        serve_with(&missing),
        1,
        &[&missing.display().to_string(), "no such file", "--config"],
    );
}
