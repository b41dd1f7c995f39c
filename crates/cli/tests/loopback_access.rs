//! Local users on the TCP listener (issue 42, item 11): a plain loopback TCP
//! client is admitted as the Unix socket would admit it. The daemon runs as
//! root (its owner); a second user (uid 65534, `nobody`, run with `setpriv`)
//! connects with the real `nbdinfo` over 127.0.0.1: refused with its uid named
//! in the reply and the daemon's log, unless an `[[access]]` rule names its uid
//! (then it gets what the rule grants) or `tcp_loopback_uid_check = false`.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Daemon, system_path};

/// The second user: `nobody`, whose entry the user database has.
const OTHER_UID: &str = "65534";

/// A free loopback port for the daemon's TCP listener.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `lamina serve` on 127.0.0.1:`port` with `server_lines` and `rest` in its
/// config, ready once root's `nbdinfo` reaches `default` on the Unix socket.
fn start(data_dir: &Path, port: u16, server_lines: &str, rest: &str) -> Daemon {
    let config = format!(
        "[server]\ntcp_address = \"127.0.0.1:{port}\"\n{server_lines}\n[pool]\nembedded_size_bytes = {}\ndefault_volume_bytes = {}\n[limits]\nflush_interval_ms = 200\n{rest}",
        1u64 << 30,
        64u64 << 20
    );
    Daemon::start_on_pool(data_dir, &config, "default")
}

/// `nbdinfo arguments` as root (`None`) or as uid 65534 with its own group
/// and no others; with libnbd's debug lines, which carry the server's
/// messages (nbdinfo itself prints only the error code's meaning).
fn nbdinfo(user: Option<&str>, arguments: &[&str]) -> Output {
    let mut command = match user {
        None => Command::new("nbdinfo"),
        Some(uid) => {
            let mut command = Command::new("setpriv");
            command
                .arg(format!("--reuid={uid}"))
                .arg(format!("--regid={uid}"))
                .arg("--clear-groups")
                .arg("nbdinfo");
            command
        }
    };
    command
        .args(arguments)
        .env("PATH", system_path())
        .env("LIBNBD_DEBUG", "1")
        .output()
        .expect("nbdinfo runs")
}

fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn tool_missing(program: &str) -> bool {
    let found =
        std::env::split_paths(&system_path()).any(|directory| directory.join(program).is_file());
    if !found {
        println!("SKIPPED: {program} is not installed");
    }
    !found
}

/// Whether the test can run: it needs setpriv, and root to change uid.
fn cannot_run() -> bool {
    if tool_missing("setpriv") || tool_missing("nbdinfo") {
        return true;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: running as another uid needs root");
        return true;
    }
    false
}

#[test]
fn another_local_user_is_refused_over_tcp_and_the_owner_is_not() {
    if cannot_run() {
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let port = free_port();
    let daemon = start(&data_dir, port, "", "");
    let uri = format!("nbd://127.0.0.1:{port}/default");

    let owner = nbdinfo(None, &["--size", &uri]);
    assert!(owner.status.success(), "{}", text(&owner));
    assert_eq!(
        String::from_utf8_lossy(&owner.stdout).trim(),
        (64u64 << 20).to_string()
    );

    let other = nbdinfo(Some(OTHER_UID), &["--size", &uri]);
    assert!(!other.status.success(), "{}", text(&other));
    let refusal = String::from_utf8_lossy(&other.stderr);
    assert!(
        refusal.contains("server policy prevents NBD_OPT_GO")
            && refusal.contains("uid 65534 may not use this server"),
        "refused by policy, saying why: {}",
        text(&other)
    );
    let listing = nbdinfo(
        Some(OTHER_UID),
        &["--list", "--json", &format!("nbd://127.0.0.1:{port}")],
    );
    assert!(
        !String::from_utf8_lossy(&listing.stdout).contains("\"default\""),
        "no export is listed to it: {}",
        text(&listing)
    );
    let log = daemon.log();
    assert!(
        log.lines()
            .any(|line| line.contains("loopback TCP refused") && line.contains("uid=65534")),
        "{log}"
    );
    assert!(daemon.terminate().success());
}

#[test]
fn a_rule_naming_the_uid_lets_it_in_with_what_the_rule_grants() {
    if cannot_run() {
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let port = free_port();
    let rules = format!(
        "[[access]]\nexports = [\"*\"]\nuid = 0\n[[access]]\nexports = [\"default\"]\nuid = {OTHER_UID}\naccess = \"read-only\"\n"
    );
    let daemon = start(&data_dir, port, "", &rules);
    let created = common::lamina(&data_dir, &["volume", "create", "secret", "16M"]);
    assert!(created.status.success(), "{}", text(&created));

    let uri = |export: &str| format!("nbd://127.0.0.1:{port}/{export}");
    let granted = nbdinfo(Some(OTHER_UID), &["--json", &uri("default")]);
    assert!(granted.status.success(), "{}", text(&granted));
    assert!(
        String::from_utf8_lossy(&granted.stdout).contains("\"is_read_only\": true"),
        "{}",
        text(&granted)
    );
    let hidden = nbdinfo(Some(OTHER_UID), &[&uri("secret")]);
    assert!(!hidden.status.success(), "{}", text(&hidden));
    // Root's own rule still gives it everything, over TCP as over the socket.
    let root = nbdinfo(None, &["--size", &uri("secret")]);
    assert!(root.status.success(), "{}", text(&root));
    assert!(daemon.terminate().success());
}

#[test]
fn the_check_can_be_turned_off() {
    if cannot_run() {
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let port = free_port();
    let daemon = start(&data_dir, port, "tcp_loopback_uid_check = false", "");
    let other = nbdinfo(
        Some(OTHER_UID),
        &["--size", &format!("nbd://127.0.0.1:{port}/default")],
    );
    assert!(other.status.success(), "{}", text(&other));
    assert!(daemon.terminate().success());
}
