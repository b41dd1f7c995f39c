//! A volume's compression setting through the CLI and a real daemon (issue
//! 44): `volume create --compression`, the config's `[pool] compression`
//! default, `volume set --compression`, the COMPRESSION column of `volume
//! list` (text and `--json`) and `volume stats`, the settings kept across a
//! daemon restart, and bad codecs refused with the parser's message, on the
//! command line and in the config at startup.

mod common;

use std::path::Path;
use std::process::Command;

use common::{Daemon, LAMINA, Setup, lamina, lamina_error, lamina_ok};

/// A daemon on an embedded pool whose volumes default to `compression`.
fn start(data_dir: &Path, compression: &str) -> Daemon {
    let config = format!(
        "[server]\ntcp_address = \"\"\n[pool]\nembedded_size_bytes = {}\ndefault_volume_bytes = {}\ncompression = \"{compression}\"\n",
        2u64 << 30,
        64u64 << 20
    );
    Daemon::start_on_pool(data_dir, &config, "default")
}

/// Each volume's name and codec, from `volume list --json`.
fn codecs(data_dir: &Path) -> Vec<(String, String)> {
    let listed = lamina_ok(data_dir, &["volume", "list"]);
    listed
        .as_array()
        .expect("a list of volumes")
        .iter()
        .map(|volume| {
            let field = |name: &str| volume[name].as_str().expect(name).to_string();
            (field("name"), field("compression"))
        })
        .collect()
}

fn pairs(expected: &[(&str, &str)]) -> Vec<(String, String)> {
    expected
        .iter()
        .map(|(name, codec)| (name.to_string(), codec.to_string()))
        .collect()
}

fn text(data_dir: &Path, arguments: &[&str]) -> String {
    let output = lamina(data_dir, arguments);
    assert!(output.status.success(), "{output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn codecs_are_set_at_create_and_live_shown_kept_across_a_restart_and_bad_ones_refused() {
    let setup = Setup::new();
    let data_dir = &setup.data_dir;
    let daemon = start(data_dir, "lz4");
    // The pool default applies to the `default` volume and to volumes
    // created without --compression.
    let created = lamina_ok(
        data_dir,
        &["volume", "create", "db", "64M", "--compression", "zstd:5"],
    );
    assert_eq!(created["compression"], "zstd:5");
    lamina_ok(data_dir, &["volume", "create", "plain", "64M"]);
    lamina_ok(
        data_dir,
        &["volume", "create", "raw", "64M", "--compression", "off"],
    );
    // A bare zstd is level 3.
    lamina_ok(
        data_dir,
        &["volume", "create", "logs", "64M", "--compression", "zstd"],
    );
    assert_eq!(
        codecs(data_dir),
        pairs(&[
            ("default", "lz4"),
            ("db", "zstd:5"),
            ("plain", "lz4"),
            ("raw", "off"),
            ("logs", "zstd:3"),
        ])
    );

    // Live, alone or with the tier policy.
    let set = lamina_ok(data_dir, &["volume", "set", "db", "--compression", "lz4"]);
    assert_eq!(set["compression"], "lz4");
    let set = lamina_ok(
        data_dir,
        &[
            "volume",
            "set",
            "plain",
            "--compression",
            "off",
            "--priority",
            "high",
        ],
    );
    assert_eq!(
        (&set["compression"], &set["policy"]["priority"]),
        (&serde_json::json!("off"), &serde_json::json!("high"))
    );

    // Text: the COMPRESSION column and the stats line.
    let listed = text(data_dir, &["volume", "list"]);
    let header = listed.lines().next().unwrap();
    assert!(header.contains(" PIN      COMPRESSION  ORIGIN"), "{listed}");
    let row = listed
        .lines()
        .find(|line| line.starts_with("db "))
        .expect("a row for db");
    assert!(row.contains(" auto     lz4  "), "{listed}");
    let stats = text(data_dir, &["volume", "stats", "plain"]);
    assert!(stats.contains("compression          off\n"), "{stats}");
    let stats = lamina_ok(data_dir, &["volume", "stats", "logs"]);
    assert_eq!(stats["compression"], "zstd:3");

    // Bad codecs: exit status not zero, the parser's message, nothing changed.
    for (codec, message) in [
        (
            "gzip",
            "unknown codec \"gzip\": expected off, lz4, zstd or zstd:LEVEL",
        ),
        (
            "zstd:0",
            "zstd level \"0\" is out of range: expected a whole number from 1 to 19",
        ),
        ("zstd:20", "zstd level \"20\" is out of range"),
        ("lz4:1", "codec lz4 takes no level"),
    ] {
        let error = lamina_error(
            data_dir,
            &["volume", "create", "bad", "64M", "--compression", codec],
        );
        assert!(error.contains(message), "create {codec}: {error}");
        let error = lamina_error(data_dir, &["volume", "set", "db", "--compression", codec]);
        assert!(error.contains(message), "set {codec}: {error}");
    }
    let error = lamina_error(
        data_dir,
        &["volume", "set", "ghost", "--compression", "lz4"],
    );
    assert!(error.contains("no such volume: ghost"), "{error}");
    let expected = pairs(&[
        ("default", "lz4"),
        ("db", "lz4"),
        ("plain", "off"),
        ("raw", "off"),
        ("logs", "zstd:3"),
    ]);
    assert_eq!(codecs(data_dir), expected);

    // A restart keeps every volume's codec, whatever the new default.
    assert!(daemon.terminate().success());
    let daemon = start(data_dir, "zstd:9");
    assert_eq!(codecs(data_dir), expected);
    lamina_ok(data_dir, &["volume", "create", "later", "64M"]);
    assert_eq!(codecs(data_dir).last().unwrap().1, "zstd:9");
    assert!(daemon.terminate().success());
}

#[test]
fn a_bad_pool_default_stops_the_daemon_at_startup_with_the_parser_message() {
    let setup = Setup::new();
    let config_path = setup.root.join("bad.toml");
    std::fs::write(&config_path, "[pool]\ncompression = \"zstd:99\"\n").unwrap();
    let output = Command::new(LAMINA)
        .args(["serve", "--data"])
        .arg(&setup.data_dir)
        .arg("--config")
        .arg(&config_path)
        .env("LAMINA_LOG", "warn")
        .output()
        .unwrap();
    let error = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{error}");
    assert!(
        error.contains("invalid config")
            && error.contains("line 2")
            && error.contains("zstd level \"99\" is out of range"),
        "{error}"
    );
    assert!(
        !setup.data_dir.join("pool.img").exists(),
        "nothing is created before the config is read"
    );
}
