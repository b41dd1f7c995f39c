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

mod accounting {
    //! Space accounting of compressed volumes through a real daemon (issue 44):
    //! this machine's Perl modules copied with nbdcopy onto a volume that
    //! compresses and onto one that does not; `volume list --json`, `volume
    //! stats --json`, `pool status --json`, their text and `/metrics` then
    //! show the compressing volume and the pool at a ratio above 1.2, the
    //! other volume at 1.0, the pool's figures the sum of the volumes' (nothing
    //! shared), and the same after a restart.
    use std::path::Path;

    use crate::common::{Daemon, Setup, assert_same, lamina, lamina_ok, write_file};

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
            status.contains("compression          ")
                && status.contains("x (logical 16.0 MiB, stored "),
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
}
