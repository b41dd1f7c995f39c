//! Running lamina as a systemd service (issue 24), without systemd as init:
//! the unit file passes `systemd-analyze verify` (with lamina's own manual
//! pages on MANPATH, since the unit's Documentation= names them) and carries
//! the hardening it promises; the daemon speaks the `sd_notify` protocol to a
//! datagram socket the test listens on — READY=1 only once the NBD port
//! answers, RELOADING=1 and READY=1 around a SIGHUP, STOPPING=1 at SIGTERM —
//! and a SIGHUP applies changed `[[access]]` rules and `[log] level` live while
//! reporting any other change as needing a restart.

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{DAEMON_READY_TIMEOUT_MS, Daemon, LAMINA, POLL_INTERVAL_MS, Setup, system_path};

const UNIT_FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../contrib/systemd/lamina.service"
);
/// Where the unit starts lamina; the test points it at the binary under test,
/// because `systemd-analyze verify` checks that the program exists.
const INSTALLED_BINARY: &str = "/usr/local/bin/lamina";
/// How long a notification may take to arrive after what should send it.
const NOTIFY_TIMEOUT_MS: u64 = 30_000;

const SIGHUP: i32 = 1;

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

fn send_signal(daemon: &Daemon, signal: i32) {
    // SAFETY: kill(2) on the PID of a child this test started and has not reaped.
    let result = unsafe { libc_kill(daemon.child.id() as i32, signal) };
    assert_eq!(result, 0, "kill({}, {signal})", daemon.child.id());
}

/// Runs `systemd-analyze verify UNIT` with `man_directory` (holding man1/)
/// on MANPATH; its exit status and what it printed on stderr. A machine
/// without systemd-analyze fails the test with the package to install: the
/// check is not skipped.
fn systemd_analyze_verify(unit: &Path, man_directory: &Path) -> (bool, String) {
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(unit)
        .env("PATH", system_path())
        .env("MANPATH", man_directory)
        .output()
        .unwrap_or_else(|error| {
            panic!("cannot run systemd-analyze ({error}): install the Debian package `systemd` (scripts/test does)")
        });
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.success(), stderr)
}

#[test]
fn the_unit_file_verifies_and_is_hardened() {
    let setup = Setup::new();
    let unit_text = std::fs::read_to_string(UNIT_FILE).unwrap();
    for directive in [
        "Type=notify",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/lamina",
        "NoNewPrivileges=yes",
        "PrivateTmp=yes",
        "ProtectHome=yes",
        "serve --data /var/lib/lamina",
    ] {
        assert!(
            unit_text.lines().any(|line| line.contains(directive)),
            "the unit lacks {directive}"
        );
    }
    let man_directory = setup.root.join("man");
    let pages = man_directory.join("man1");
    let output = Command::new(LAMINA)
        .args(["man", "--output"])
        .arg(&pages)
        .output()
        .unwrap();
    assert!(output.status.success(), "lamina man --output failed");

    let unit = setup.root.join("lamina.service");
    std::fs::write(&unit, unit_text.replace(INSTALLED_BINARY, LAMINA)).unwrap();
    let (success, stderr) = systemd_analyze_verify(&unit, &man_directory);
    assert!(
        success && stderr.trim().is_empty(),
        "systemd-analyze verify found problems in {UNIT_FILE}:\n{stderr}"
    );

    // The check sees mistakes: verify reports an unparsable value on stderr
    // (and still exits 0, hence the test reads stderr).
    let broken = setup.root.join("broken.service");
    std::fs::write(
        &broken,
        unit_text
            .replace(INSTALLED_BINARY, LAMINA)
            .replace("ProtectSystem=strict", "ProtectSystem=strictly"),
    )
    .unwrap();
    let (_, stderr) = systemd_analyze_verify(&broken, &man_directory);
    assert!(stderr.contains("strictly"), "{stderr}");
}

/// A free TCP port on loopback (bound, read, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The service manager's side of `sd_notify`: a datagram socket.
struct NotifySocket {
    socket: UnixDatagram,
}

impl NotifySocket {
    fn bind(path: &Path) -> NotifySocket {
        let socket = UnixDatagram::bind(path).unwrap();
        socket
            .set_read_timeout(Some(Duration::from_millis(POLL_INTERVAL_MS * 10)))
            .unwrap();
        NotifySocket { socket }
    }

    /// Reads notifications until one has the line `line`; all of them, in order.
    fn wait_for(&self, line: &str, daemon: &mut Daemon) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_millis(NOTIFY_TIMEOUT_MS);
        let mut received = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            if let Ok(length) = self.socket.recv(&mut buffer) {
                let message = String::from_utf8_lossy(&buffer[..length]).into_owned();
                let found = message.lines().any(|each| each == line);
                received.push(message);
                if found {
                    return received;
                }
            }
            if let Some(status) = daemon.child.try_wait().unwrap() {
                panic!("lamina serve exited ({status}) before sending {line}: {received:?}");
            }
            assert!(
                Instant::now() < deadline,
                "no {line} within {NOTIFY_TIMEOUT_MS} ms; received {received:?}"
            );
        }
    }
}

/// `lamina serve` with `config` (written next to the data directory) and
/// NOTIFY_SOCKET set to `notify`; not waited for.
fn start_notifying(data_dir: &Path, config: &str, notify: &Path, log_filter: &str) -> Daemon {
    let config_path = data_dir.with_extension("toml");
    std::fs::write(&config_path, config).unwrap();
    let log = std::fs::File::create(data_dir.with_extension("log")).unwrap();
    let child = Command::new(LAMINA)
        .args(["serve", "--data"])
        .arg(data_dir)
        .arg("--config")
        .arg(&config_path)
        .env("NOTIFY_SOCKET", notify)
        .env("LAMINA_LOG", log_filter)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start lamina serve");
    Daemon {
        child,
        data_dir: data_dir.to_path_buf(),
    }
}

fn config_text(tcp_address: &str, rest: &str) -> String {
    format!(
        "[server]\ntcp_address = \"{tcp_address}\"\n[pool]\nembedded_size_bytes = {}\ndefault_volume_bytes = {}\n[limits]\nflush_interval_ms = 200\n{rest}",
        1u64 << 30,
        64u64 << 20
    )
}

/// Whether `nbdinfo --size URI` succeeds, once.
fn nbdinfo_answers(uri: &str) -> bool {
    Command::new("nbdinfo")
        .arg("--size")
        .arg(uri)
        .env("PATH", system_path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

#[test]
fn ready_is_sent_once_the_nbd_port_answers_and_stopping_at_sigterm() {
    let setup = Setup::new();
    let notify_path = setup.root.join("notify.sock");
    let notify = NotifySocket::bind(&notify_path);
    let port = free_port();
    let config = config_text(&format!("127.0.0.1:{port}"), "");
    let mut daemon = start_notifying(&setup.data_dir, &config, &notify_path, "warn");

    let received = notify.wait_for("READY=1", &mut daemon);
    // No retry: READY=1 promises the listeners are bound and the pool open.
    assert!(
        nbdinfo_answers(&format!("nbd://127.0.0.1:{port}/default")),
        "READY=1 arrived ({received:?}) but the NBD port does not answer"
    );
    let ready = received.last().unwrap();
    assert!(
        ready.lines().any(|line| line == "STATUS=serving 1 volumes"),
        "{ready:?}"
    );

    let pid = daemon.child.id() as i32;
    // SAFETY: kill(2) on the PID of the child this test started.
    assert_eq!(unsafe { libc_kill(pid, 15) }, 0);
    notify.wait_for("STOPPING=1", &mut daemon);
    let status = common::wait_with_timeout(&mut daemon.child, common::EXIT_TIMEOUT_MS)
        .expect("lamina serve exits after SIGTERM");
    assert!(status.success(), "{status}; log:\n{}", daemon.log());
}

/// Waits until the daemon's log has `text`.
fn wait_for_log(daemon: &Daemon, text: &str) {
    let deadline = Instant::now() + Duration::from_millis(DAEMON_READY_TIMEOUT_MS);
    while !daemon.log().contains(text) {
        assert!(
            Instant::now() < deadline,
            "the log never said {text:?}:\n{}",
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
    }
}

#[test]
fn sighup_applies_access_rules_and_log_level_and_names_what_needs_a_restart() {
    let setup = Setup::new();
    let notify_path = setup.root.join("notify.sock");
    let notify = NotifySocket::bind(&notify_path);
    let config_path = setup.data_dir.with_extension("toml");
    let mut daemon = start_notifying(&setup.data_dir, &config_text("", ""), &notify_path, "warn");
    notify.wait_for("READY=1", &mut daemon);
    let uri = daemon.uri("default");
    assert!(nbdinfo_answers(&uri), "no rules: everyone may open default");

    // A rule for another uid only hides `default` from this root client; the
    // log level lets the info line of the reload through; the connection
    // limit needs a restart.
    let changed = config_text(
        "",
        "[log]\nlevel = \"info\"\n[[access]]\nexports = [\"default\"]\nuid = 54321\n",
    )
    .replace("[server]\n", "[server]\nconnections_max = 8\n");
    std::fs::write(&config_path, &changed).unwrap();
    send_signal(&daemon, SIGHUP);
    let received = notify.wait_for("READY=1", &mut daemon);
    assert!(
        received
            .iter()
            .any(|message| message.lines().any(|line| line == "RELOADING=1")),
        "{received:?}"
    );
    assert!(
        !nbdinfo_answers(&uri),
        "the reloaded [[access]] rule should hide default from uid 0"
    );
    wait_for_log(&daemon, "configuration reloaded; applied");
    let log = daemon.log();
    assert!(
        log.contains("access, log.level"),
        "the applied keys are named:\n{log}"
    );
    assert!(
        log.contains("server.connections_max") && log.contains("need a restart"),
        "a restart-only change is reported:\n{log}"
    );

    // Without the rule again, the same connection succeeds; a file that does
    // not parse changes nothing and says so.
    std::fs::write(&config_path, config_text("", "[log]\nlevel = \"info\"\n")).unwrap();
    send_signal(&daemon, SIGHUP);
    notify.wait_for("READY=1", &mut daemon);
    assert!(nbdinfo_answers(&uri), "the rule was removed by the reload");
    std::fs::write(&config_path, "[server\n").unwrap();
    send_signal(&daemon, SIGHUP);
    notify.wait_for("READY=1", &mut daemon);
    wait_for_log(&daemon, "configuration not reloaded");
    assert!(nbdinfo_answers(&uri), "a broken file changes nothing");
    assert!(daemon.terminate().success());
}
