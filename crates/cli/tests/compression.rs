//! A volume's compression setting through the CLI and a real daemon (issue
//! 44): `volume create --compression`, the config's `[pool] compression`
//! default, `volume set --compression`, the COMPRESSION column of `volume
//! list` (text and `--json`) and `volume stats`, the settings kept across a
//! daemon restart, and bad codecs refused with the parser's message, on the
//! command line and in the config at startup.

mod common;

use std::path::Path;
use std::process::Command;

use common::{
    Daemon, LAMINA, Setup, assert_same, lamina, lamina_error, lamina_ok, run, write_file,
};

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

// Compressed volumes through real clients (issue 44, decision 0070): an
// ext4 image built on this machine from its own files (`mkfs.ext4 -d`) is
// copied onto a volume that compresses with `nbdcopy`, compared with
// `qemu-img compare`, read back and checked with `e2fsck`; the daemon is
// killed (a process crash after the copy's flush) and restarted, the codec
// changed live and half the image rewritten from another tree, and every
// byte is still the image's. The memory cache is off, so that reads reach
// the device's fragments.

const IMAGE_BYTES: u64 = 96 << 20;

fn start_compressing(data_dir: &Path) -> Daemon {
    let config = format!(
        "[server]\ntcp_address = \"\"\n[pool]\nembedded_size_bytes = {}\ndefault_volume_bytes = {IMAGE_BYTES}\ncompression = \"lz4\"\n[limits]\nflush_interval_ms = 200\nmemory_cache_bytes = 0\n",
        1u64 << 30
    );
    Daemon::start_on_pool(data_dir, &config, "default")
}

/// Bytes of files copied into an image's tree at most: room is left for
/// ext4's metadata.
const TREE_BYTES_MAX: u64 = IMAGE_BYTES / 2;

/// An ext4 image of `IMAGE_BYTES` holding this machine's files from
/// `source` (regular files, in directory order, up to `TREE_BYTES_MAX`).
fn ext4_image(path: &Path, source: &str) {
    let tree = path.with_extension("tree");
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::create_dir_all(&tree).unwrap();
    let mut copied = 0;
    copy_files(Path::new(source), &tree, &mut copied);
    assert!(copied > 0, "no files under {source}");
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&tree)
        .arg(path)
        .arg(format!("{}k", IMAGE_BYTES / 1024)));
    std::fs::remove_dir_all(&tree).unwrap();
}

fn copy_files(source: &Path, tree: &Path, copied: &mut u64) {
    let Ok(entries) = std::fs::read_dir(source) else {
        return;
    };
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let Ok(length) = entry.metadata().map(|metadata| metadata.len()) else {
            continue;
        };
        if kind.is_dir() {
            copy_files(&entry.path(), tree, copied);
        } else if kind.is_file() && *copied + length <= TREE_BYTES_MAX {
            let name = format!("{}-{}", *copied, entry.file_name().to_string_lossy());
            if std::fs::copy(entry.path(), tree.join(name)).is_ok() {
                *copied += length;
            }
        }
        if *copied >= TREE_BYTES_MAX * 9 / 10 {
            return;
        }
    }
}

/// The export read back whole into `copy`, and `e2fsck` finds it clean.
fn read_back_and_check(daemon: &Daemon, copy: &Path) {
    let _ = std::fs::remove_file(copy);
    run(Command::new("nbdcopy").arg(daemon.uri("default")).arg(copy));
    let output = Command::new("e2fsck")
        .args(["-f", "-n"])
        .arg(copy)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "e2fsck on the read-back image: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn an_ext4_image_of_this_machines_files_survives_compression_a_crash_and_a_codec_change() {
    let setup = Setup::new();
    let data_dir = &setup.data_dir;
    let image = data_dir.join("share.img");
    // /usr/share: text, and documents already compressed; /usr/bin:
    // executables that partly compress.
    ext4_image(&image, "/usr/share");
    let daemon = start_compressing(data_dir);
    let listed = lamina_ok(data_dir, &["volume", "list"]);
    assert_eq!(listed[0]["compression"], "lz4", "{listed}");
    write_file(&daemon, "default", &image);
    assert_same(&daemon, "default", &image);
    read_back_and_check(&daemon, &data_dir.join("copy.img"));
    // A process crash after the copy's flush: replay brings it all back.
    daemon.kill_hard();
    let daemon = start_compressing(data_dir);
    assert_same(&daemon, "default", &image);
    // Another codec from here on, and the first half rewritten from another
    // tree: old and new fragments, of both codecs, side by side.
    lamina_ok(
        data_dir,
        &["volume", "set", "default", "--compression", "zstd:3"],
    );
    let other = data_dir.join("bin.img");
    ext4_image(&other, "/usr/bin");
    let mut mixed = std::fs::read(&image).unwrap();
    let other_bytes = std::fs::read(&other).unwrap();
    let half = mixed.len() / 2;
    mixed[..half].copy_from_slice(&other_bytes[..half]);
    let mixed_path = data_dir.join("mixed.img");
    std::fs::write(&mixed_path, &mixed).unwrap();
    let first_half = data_dir.join("first-half.img");
    std::fs::write(&first_half, &other_bytes[..half]).unwrap();
    run(Command::new("nbdcopy")
        .arg("--flush")
        .arg(&first_half)
        .arg(daemon.uri("default")));
    assert_same(&daemon, "default", &mixed_path);
    // A clean restart: the checkpoint holds every fragment's location.
    assert!(daemon.terminate().success());
    let daemon = start_compressing(data_dir);
    assert_same(&daemon, "default", &mixed_path);
    drop(daemon);
}
