//! Space accounting of compressed volumes through a real daemon (issue 44):
//! this machine's Perl modules copied with nbdcopy onto a volume that
//! compresses and onto one that does not; `volume list --json`, `volume
//! stats --json`, `pool status --json`, their text and `/metrics` then
//! show the compressing volume and the pool at a ratio above 1.2, the
//! other volume at 1.0, the pool's figures the sum of the volumes' (nothing
//! shared), and the same after a restart.

mod common;

use std::path::Path;

use common::{Daemon, Setup, assert_same, lamina, lamina_ok, write_file};

/// Each test volume's size, and the bytes copied onto it.
const VOLUME_BYTES: u64 = 8 << 20;
const VOLUME_SIZE: &str = "8M";
/// A ratio compressible text must beat.
const RATIO_MIN: f64 = 1.2;

fn start(data_dir: &Path) -> Daemon {
    let config = format!(
        "[server]\ntcp_address = \"\"\n[pool]\nembedded_size_bytes = {}\ndefault_volume_bytes = {}\ncompression = \"off\"\n",
        1u64 << 30,
        16u64 << 20
    );
    Daemon::start_on_pool(data_dir, &config, "default")
}

/// `bytes` of this machine's Perl modules, concatenated in path order.
fn perl_text(path: &Path, bytes: u64) {
    let mut paths = Vec::new();
    for directory in ["/usr/share/perl5", "/usr/share/perl"] {
        walk(Path::new(directory), &mut paths);
    }
    paths.sort();
    let wanted = usize::try_from(bytes).unwrap();
    let mut contents = Vec::with_capacity(wanted);
    for file in paths {
        if contents.len() >= wanted {
            break;
        }
        if let Ok(read) = std::fs::read(&file) {
            contents.extend_from_slice(&read);
        }
    }
    assert!(contents.len() >= wanted, "not enough Perl on this machine");
    contents.truncate(wanted);
    std::fs::write(path, contents).unwrap();
}

fn walk(directory: &Path, found: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return;
    };
    for entry in entries.flatten() {
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => walk(&entry.path(), found),
            Ok(kind) if kind.is_file() => found.push(entry.path()),
            _ => {}
        }
    }
}

fn number(value: &serde_json::Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

fn ratio(value: &serde_json::Value) -> f64 {
    value["compress_ratio"]
        .as_f64()
        .unwrap_or_else(|| panic!("compress_ratio in {value}"))
}

/// The value of `lamina_volume_stored_bytes` for `volume` on `/metrics`.
fn volume_stored_metric(daemon: &Daemon, volume: &str) -> u64 {
    let prefix = format!("lamina_volume_stored_bytes{{volume=\"{volume}\"}} ");
    let metrics = daemon.metrics();
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix}in {metrics}"))
}

/// Every surface agrees: the text volume compresses, the raw one does not,
/// the pool holds both.
fn check_figures(daemon: &Daemon, data_dir: &Path, when: &str) {
    let listed = lamina_ok(data_dir, &["volume", "list"]);
    let volume = |name: &str| {
        listed
            .as_array()
            .unwrap()
            .iter()
            .find(|volume| volume["name"] == name)
            .unwrap_or_else(|| panic!("{name} in {listed}"))
            .clone()
    };
    let (text, raw) = (volume("text"), volume("raw"));
    assert_eq!(number(&text, "allocated_bytes"), VOLUME_BYTES, "{when}");
    assert!(ratio(&text) > RATIO_MIN, "{when}: {text}");
    assert!(
        number(&text, "stored_bytes") < VOLUME_BYTES,
        "{when}: {text}"
    );
    assert_eq!(
        (number(&raw, "stored_bytes"), ratio(&raw)),
        (VOLUME_BYTES, 1.0),
        "{when}: {raw}"
    );
    let stats = lamina_ok(data_dir, &["volume", "stats", "text"]);
    assert_eq!(
        (number(&stats, "stored_bytes"), ratio(&stats)),
        (number(&text, "stored_bytes"), ratio(&text)),
        "{when}: {stats}"
    );

    let status = lamina_ok(data_dir, &["pool", "status"]);
    let stored = number(&text, "stored_bytes") + number(&raw, "stored_bytes");
    assert_eq!(number(&status, "logical_bytes"), 2 * VOLUME_BYTES, "{when}");
    assert_eq!(number(&status, "stored_bytes"), stored, "{when}");
    assert!(ratio(&status) > RATIO_MIN, "{when}: {status}");

    assert_eq!(
        daemon.gauge("lamina_pool_logical_bytes"),
        Some((2 * VOLUME_BYTES) as f64),
        "{when}"
    );
    assert_eq!(
        daemon.gauge("lamina_pool_stored_bytes"),
        Some(stored as f64),
        "{when}"
    );
    assert!(
        daemon
            .gauge("lamina_pool_compress_ratio")
            .is_some_and(|ratio| ratio > RATIO_MIN),
        "{when}"
    );
    assert_eq!(
        volume_stored_metric(daemon, "text"),
        number(&text, "stored_bytes")
    );
    assert_eq!(volume_stored_metric(daemon, "raw"), VOLUME_BYTES);
}

fn text_of(data_dir: &Path, arguments: &[&str]) -> String {
    let output = lamina(data_dir, arguments);
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn logical_and_stored_bytes_show_the_ratio_on_every_surface() {
    let setup = Setup::new();
    let data_dir = &setup.data_dir;
    let daemon = start(data_dir);
    lamina_ok(
        data_dir,
        &[
            "volume",
            "create",
            "text",
            VOLUME_SIZE,
            "--compression",
            "lz4",
        ],
    );
    lamina_ok(
        data_dir,
        &[
            "volume",
            "create",
            "raw",
            VOLUME_SIZE,
            "--compression",
            "off",
        ],
    );
    let image = setup.root.join("perl.txt");
    perl_text(&image, VOLUME_BYTES);
    write_file(&daemon, "text", &image);
    write_file(&daemon, "raw", &image);
    assert_same(&daemon, "text", &image);
    check_figures(&daemon, data_dir, "after the copies");

    let listed = text_of(data_dir, &["volume", "list"]);
    let header = listed.lines().next().unwrap();
    assert!(header.contains("ALLOCATED       STORED  RATIO"), "{listed}");
    let raw_row = listed
        .lines()
        .find(|line| line.starts_with("raw "))
        .unwrap();
    assert!(raw_row.contains(" 1.00x "), "{listed}");
    let status = text_of(data_dir, &["pool", "status"]);
    assert!(
        status.contains("compression          ") && status.contains("x (logical 16.0 MiB, stored "),
        "{status}"
    );
    let stats = text_of(data_dir, &["volume", "stats", "raw"]);
    assert!(
        stats.contains("compression ratio    1.00x (logical 8.0 MiB, stored 8.0 MiB)\n"),
        "{stats}"
    );

    // A restart rebuilds the pool's count from the maps.
    daemon.terminate();
    let daemon = start(data_dir);
    check_figures(&daemon, data_dir, "after a restart");
    daemon.terminate();
}
