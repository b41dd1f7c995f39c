//! Prometheus's lint of a `/metrics` page: `promtool check metrics` (Debian's
//! `prometheus` package, which `scripts/test` installs). A missing promtool
//! fails the test that needs it, as the other real tools do.

use std::io::Write;
use std::process::{Command, Stdio};

/// The lint tool of Debian's `prometheus` package.
const PROMTOOL: &str = "promtool";

/// `promtool check metrics` finds no problem in `text` (it exits 0 and
/// prints nothing).
pub fn assert_lints_clean(text: &str) {
    let mut child = Command::new(PROMTOOL)
        .args(["check", "metrics"])
        .env("PATH", super::system_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| {
            panic!(
                "cannot run {PROMTOOL} ({error}): install Debian's prometheus package (scripts/test does)"
            )
        });
    child
        .stdin
        .take()
        .expect("promtool's standard input")
        .write_all(text.as_bytes())
        .expect("/metrics written to promtool");
    let output = child.wait_with_output().expect("promtool ends");
    let problems = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success() && problems.trim().is_empty(),
        "promtool check metrics ({}) found problems:\n{problems}\nin /metrics:\n{text}",
        output.status
    );
}
