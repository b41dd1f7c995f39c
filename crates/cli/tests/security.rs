//! Who may reach what, end to end (issue 21): `lamina serve` refuses a
//! non-loopback TCP address without TLS and says how to enable it, creates its
//! data directory and sockets owner-only, prints one line per listener saying
//! what is exposed where and to whom, and, for a second user (uid 65534 run
//! with `setpriv`, no account needed): without the configured group it cannot
//! reach the sockets; with it, it sees only the exports its `[[access]]` rule
//! grants, read-only, and its admin requests are audited with its uid and
//! counted on `/metrics`.

// The NBD crate's test certificates (openssl), shared rather than copied.
#[allow(dead_code)]
#[path = "../../nbd/tests/common/certificates.rs"]
mod certificates;
mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{DAEMON_READY_TIMEOUT_MS, Daemon, LAMINA, POLL_INTERVAL_MS, system_path};

/// The uid and gids the second user runs with (no account is created).
const OTHER_UID: &str = "65534";
const SHARED_GID: &str = "4242";
const STRANGER_GID: &str = "4343";

fn pool_config(server_lines: &str, rest: &str) -> String {
    format!(
        "[server]\n{server_lines}\n[pool]\nembedded_size_bytes = {}\ndefault_volume_bytes = {}\n[limits]\nflush_interval_ms = 200\n{rest}",
        1u64 << 30,
        64u64 << 20
    )
}

/// `lamina serve` with `config`, audit lines in its log, stdout kept; ready
/// once root's `nbdinfo` reaches `default`.
fn start(data_dir: &Path, config: &str) -> Daemon {
    start_with_arguments(data_dir, config, &[])
}

/// [`start`] with more `lamina serve` arguments.
fn start_with_arguments(data_dir: &Path, config: &str, arguments: &[&str]) -> Daemon {
    let config_path = data_dir.with_extension("toml");
    std::fs::write(&config_path, config).unwrap();
    let log = std::fs::File::create(data_dir.with_extension("log")).unwrap();
    let out = std::fs::File::create(data_dir.with_extension("out")).unwrap();
    let child = Command::new(LAMINA)
        .args(["serve", "--data"])
        .arg(data_dir)
        .arg("--config")
        .arg(&config_path)
        .args(arguments)
        .env("LAMINA_LOG", "warn,lamina::audit=info")
        .stdout(out)
        .stderr(log)
        .spawn()
        .expect("start lamina serve");
    let mut daemon = Daemon {
        child,
        data_dir: data_dir.to_path_buf(),
    };
    let deadline = Instant::now() + Duration::from_millis(DAEMON_READY_TIMEOUT_MS);
    while !Command::new("nbdinfo")
        .arg("--size")
        .arg(daemon.uri("default"))
        .env("PATH", system_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
    {
        if let Some(status) = daemon.child.try_wait().unwrap() {
            panic!("lamina serve exited before serving: {status}");
        }
        assert!(Instant::now() < deadline, "daemon did not come up");
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS * 2));
    }
    daemon
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// `program arguments` as uid 65534 with primary group `gid` and no others.
fn as_other_user(gid: &str, program: &str, arguments: &[&str]) -> std::process::Output {
    Command::new("setpriv")
        .arg(format!("--reuid={OTHER_UID}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg(program)
        .args(arguments)
        .env("PATH", system_path())
        .env("LAMINA_LOG", "warn")
        .output()
        .expect("setpriv runs")
}

fn text(output: &std::process::Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn a_non_loopback_address_without_tls_is_refused_and_says_how_to_enable_it() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let config_path = directory.path().join("config.toml");
    std::fs::write(&config_path, pool_config("tcp_address = \"0.0.0.0:0\"", "")).unwrap();
    let output = Command::new(LAMINA)
        .args(["serve", "--data"])
        .arg(&data_dir)
        .arg("--config")
        .arg(&config_path)
        .env("LAMINA_LOG", "warn")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(message.contains("without TLS"), "{message}");
    assert!(message.contains("tls = \"require\""), "{message}");
    assert!(message.contains("tls_certificates"), "{message}");
    assert!(message.contains("insecure_tcp = true"), "{message}");
    assert!(!data_dir.join("nbd.sock").exists(), "nothing was served");

    // The explicit opt-out serves, and says so.
    let daemon = start(
        &data_dir,
        &pool_config("tcp_address = \"0.0.0.0:0\"\ninsecure_tcp = true", ""),
    );
    let printed = std::fs::read_to_string(data_dir.with_extension("out")).unwrap();
    assert!(printed.contains("NBD on tcp 0.0.0.0:"), "{printed}");
    assert!(
        printed.contains("plain text (no TLS); to any host that reaches it"),
        "{printed}"
    );
    assert!(daemon.terminate().success());
}

#[test]
fn sockets_are_owner_only_and_serve_prints_one_line_per_listener() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let daemon = start(&data_dir, &pool_config("tcp_address = \"127.0.0.1:0\"", ""));
    assert_eq!(mode(&data_dir), 0o700);
    assert_eq!(mode(&data_dir.join("nbd.sock")), 0o600);
    assert_eq!(mode(&data_dir.join("admin.sock")), 0o600);
    let printed = std::fs::read_to_string(data_dir.with_extension("out")).unwrap();
    let lines: Vec<&str> = printed
        .lines()
        .filter(|line| line.starts_with("lamina: "))
        .collect();
    assert_eq!(lines.len(), 4, "{printed}");
    assert!(
        lines[0].starts_with("lamina: NBD on tcp 127.0.0.1:"),
        "{printed}"
    );
    assert!(
        lines[0].contains(
            "to uid 0 and the uids and gids [[access]] rules name, on this host (loopback; checked per connection); every export"
        ),
        "{printed}"
    );
    assert!(lines[1].contains("NBD on unix"), "{printed}");
    assert!(lines[1].contains("uid 0 only (mode 0600)"), "{printed}");
    assert!(lines[2].contains("admin API on unix"), "{printed}");
    assert!(lines[3].contains("web page"), "{printed}");
    assert!(daemon.terminate().success());
}

#[test]
fn a_second_user_gets_only_what_its_group_and_rules_grant() {
    if common_tool_missing("setpriv") {
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    // The other user must be able to walk to the data directory.
    std::fs::set_permissions(directory.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data_dir = directory.path().join("data");
    let rules = format!(
        "[[access]]\nexports = [\"*\"]\nuid = 0\n[[access]]\nexports = [\"default\"]\nuid = {OTHER_UID}\naccess = \"read-only\"\n"
    );
    let server = format!(
        "tcp_address = \"\"\nsocket_group = \"{SHARED_GID}\"\nadmin_group = \"{SHARED_GID}\""
    );
    let daemon = start(&data_dir, &pool_config(&server, &rules));
    assert_eq!(mode(&data_dir), 0o710);
    assert_eq!(mode(&data_dir.join("nbd.sock")), 0o660);
    assert_eq!(
        std::fs::metadata(data_dir.join("admin.sock"))
            .unwrap()
            .gid(),
        4242
    );
    let data = data_dir.to_str().unwrap();
    // Root creates a volume the other user is not granted.
    let created = Command::new(LAMINA)
        .args(["volume", "create", "secret", "16M", "--data", data])
        .env("LAMINA_LOG", "warn")
        .output()
        .unwrap();
    assert!(created.status.success(), "{}", text(&created));

    // Outside the group: neither socket can be reached.
    let stranger = as_other_user(STRANGER_GID, "nbdinfo", &["--list", &daemon.uri("")]);
    assert!(!stranger.status.success(), "{}", text(&stranger));
    let stranger_admin = as_other_user(STRANGER_GID, LAMINA, &["volume", "list", "--data", data]);
    assert!(
        !stranger_admin.status.success(),
        "{}",
        text(&stranger_admin)
    );
    assert!(
        !String::from_utf8_lossy(&stranger_admin.stdout).contains("secret"),
        "{}",
        text(&stranger_admin)
    );

    // In the group: only `default` is listed, read-only; `secret` is refused.
    let listing = as_other_user(
        SHARED_GID,
        "nbdinfo",
        &["--list", "--json", &daemon.uri("")],
    );
    assert!(listing.status.success(), "{}", text(&listing));
    let listed = String::from_utf8_lossy(&listing.stdout);
    assert!(listed.contains("\"default\""), "{listed}");
    assert!(
        !listed.contains("secret"),
        "a hidden export is not listed: {listed}"
    );
    assert!(listed.contains("\"is_read_only\": true"), "{listed}");
    let refused = as_other_user(SHARED_GID, "nbdinfo", &[&daemon.uri("secret")]);
    assert!(!refused.status.success(), "{}", text(&refused));
    let missing = as_other_user(SHARED_GID, "nbdinfo", &[&daemon.uri("no-such-volume")]);
    let same = |output: &std::process::Output, name: &str| {
        String::from_utf8_lossy(&output.stderr).replace(name, "NAME")
    };
    assert_eq!(same(&refused, "secret"), same(&missing, "no-such-volume"));
    let source = directory.path().join("source.bin");
    std::fs::write(&source, vec![0x5a; 65536]).unwrap();
    std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o644)).unwrap();
    let write = as_other_user(
        SHARED_GID,
        "nbdcopy",
        &[source.to_str().unwrap(), &daemon.uri("default")],
    );
    assert!(
        !write.status.success(),
        "a read-only grant cannot write: {}",
        text(&write)
    );

    // The group's admin request works and is audited with its uid.
    let admin = as_other_user(
        SHARED_GID,
        LAMINA,
        &["volume", "create", "theirs", "8M", "--data", data],
    );
    assert!(admin.status.success(), "{}", text(&admin));
    let log = daemon.log();
    assert!(
        log.lines().any(|line| line.contains("admin operation")
            && line.contains("uid=65534")
            && line.contains("volume_create")),
        "{log}"
    );
    assert!(
        log.lines().any(|line| line.contains("admin operation")
            && line.contains("uid=0")
            && line.contains("secret")),
        "{log}"
    );
    let metrics = daemon.metrics();
    assert!(
        metrics.contains(
            "lamina_admin_operations_total{operation=\"volume_create\",outcome=\"ok\"} 2"
        ),
        "{metrics}"
    );
    assert!(daemon.terminate().success());
}

fn common_tool_missing(program: &str) -> bool {
    let found =
        std::env::split_paths(&system_path()).any(|directory| directory.join(program).is_file());
    if !found {
        println!("SKIPPED: {program} is not installed");
    }
    !found
}

#[test]
fn the_admin_socket_checks_the_peer_even_when_its_mode_lets_others_in() {
    if common_tool_missing("setpriv") {
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    std::fs::set_permissions(directory.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let data_dir = directory.path().join("data");
    let daemon = start(&data_dir, &pool_config("tcp_address = \"\"", ""));
    // Someone loosens the modes by hand: the peer check still keeps others out.
    std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o711)).unwrap();
    let admin_socket = data_dir.join("admin.sock");
    std::fs::set_permissions(&admin_socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let data = data_dir.to_str().unwrap();
    let refused = as_other_user(
        STRANGER_GID,
        LAMINA,
        &["volume", "create", "sneaky", "8M", "--data", data],
    );
    assert!(!refused.status.success(), "{}", text(&refused));
    let metrics = daemon.metrics();
    assert!(
        metrics.contains("lamina_admin_connections_refused_total 1"),
        "{metrics}"
    );
    assert!(!metrics.contains("sneaky"), "{metrics}");
    assert!(
        daemon.log().contains("admin connection refused"),
        "{}",
        daemon.log()
    );
    assert!(daemon.terminate().success());
}

/// The path of `program` on the system PATH, or `None` after saying why the
/// test is skipped (what `certificates.rs` asks its parent module for).
fn tool(program: &str) -> Option<std::path::PathBuf> {
    if common_tool_missing(program) {
        return None;
    }
    std::env::split_paths(&system_path())
        .map(|directory| directory.join(program))
        .find(|path| path.is_file())
}

#[test]
fn serve_with_tls_required_on_every_address_serves_nbds_and_refuses_plain() {
    let Some(certificates) = certificates::TestCertificates::make() else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let server_directory = certificates.server.to_str().unwrap().to_string();
    // Not loopback, but TLS is required: allowed.
    let daemon = start_with_arguments(
        &data_dir,
        &pool_config(&format!("tcp_address = \"0.0.0.0:{port}\""), ""),
        &[
            "--tls",
            "require",
            "--tls-certificates",
            &server_directory,
            "--tls-verify-peer",
        ],
    );
    let printed = std::fs::read_to_string(data_dir.with_extension("out")).unwrap();
    assert!(
        printed.contains(&format!(
            "NBD on tcp 0.0.0.0:{port}: TLS required, client certificates checked against"
        )),
        "{printed}"
    );
    let secure = format!(
        "nbds://localhost:{port}/default?tls-certificates={}",
        certificates.alice.display()
    );
    let size = common::run(Command::new("nbdinfo").arg("--size").arg(&secure));
    assert_eq!(size.trim(), (64u64 << 20).to_string());
    let plain = Command::new("nbdinfo")
        .arg(format!("nbd://127.0.0.1:{port}/default"))
        .env("PATH", system_path())
        .output()
        .unwrap();
    assert!(!plain.status.success(), "{}", text(&plain));
    let stranger = format!(
        "nbds://localhost:{port}/default?tls-certificates={}",
        certificates.stranger.display()
    );
    let foreign = Command::new("nbdinfo")
        .arg(&stranger)
        .env("PATH", system_path())
        .output()
        .unwrap();
    assert!(!foreign.status.success(), "{}", text(&foreign));
    let metrics = daemon.metrics();
    assert!(
        metrics.contains("lamina_nbd_handshakes_closed_total{reason=\"tls_failed\"} 1"),
        "{metrics}"
    );
    assert!(daemon.terminate().success());
}
