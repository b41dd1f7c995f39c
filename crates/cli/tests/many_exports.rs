//! A daemon with 10,000 volumes lists them all to `nbdinfo --list` (issue 42,
//! item 13): nbdinfo sends `NBD_OPT_LIST` and then asks about every export it
//! was told of in the same handshake, so the handshake's option limit must
//! leave room for that, and still cut off a client that sends endless
//! options (checked in the NBD crate's `handshake_option_count` test). The
//! volumes are created through the admin socket, one request each, which is
//! what `lamina volume create` sends without a process per volume.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, run};

/// Exports the test lists: the daemon's `default` and the volumes it creates.
const EXPORT_COUNT: usize = 10_000;
/// Each created volume's size (thin: nothing is written).
const VOLUME_BYTES: u64 = 1 << 20;
/// How long one admin request may take.
const ADMIN_TIMEOUT_MS: u64 = 10_000;

/// `POST /v1/operations` with `body` on the admin socket; the status line
/// and the body of the answer.
fn admin_post(data_dir: &Path, body: &str) -> String {
    let mut stream = UnixStream::connect(data_dir.join("admin.sock")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(ADMIN_TIMEOUT_MS)))
        .unwrap();
    write!(
        stream,
        "POST /v1/operations HTTP/1.1\r\nHost: lamina\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

fn volume_name(index: usize) -> String {
    format!("vol{index}")
}

#[test]
fn nbdinfo_lists_ten_thousand_volumes() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let daemon = Daemon::start_with_pool(&data_dir, 1 << 30, VOLUME_BYTES);
    let started = Instant::now();
    for index in 1..EXPORT_COUNT {
        let answer = admin_post(
            &data_dir,
            &format!(
                r#"{{"operation":"volume_create","name":"{}","size_bytes":{VOLUME_BYTES}}}"#,
                volume_name(index)
            ),
        );
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }
    eprintln!(
        "created {} volumes in {:?}",
        EXPORT_COUNT - 1,
        started.elapsed()
    );

    let started = Instant::now();
    let listing = run(Command::new("nbdinfo")
        .args(["--list", "--json"])
        .arg(daemon.uri("")));
    eprintln!("nbdinfo --list took {:?}", started.elapsed());
    let listing: serde_json::Value = serde_json::from_str(&listing).unwrap();
    let exports = listing["exports"].as_array().unwrap();
    assert_eq!(exports.len(), EXPORT_COUNT);
    let mut names: Vec<&str> = exports
        .iter()
        .map(|export| export["export-name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    let mut expected: Vec<String> = (1..EXPORT_COUNT).map(volume_name).collect();
    expected.push("default".to_string());
    expected.sort_unstable();
    assert_eq!(names, expected);
    // Every export was asked about, not only listed: its size is known.
    for export in exports {
        assert_eq!(export["export-size"], VOLUME_BYTES, "{export}");
    }
    assert!(daemon.terminate().success());
}
