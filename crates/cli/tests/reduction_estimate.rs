//! `lamina reduction estimate` on real data made here: an ext4 image built by
//! `mkfs.ext4 -d` from text files of this machine (manual pages unpacked into
//! plain text and the licences of /usr/share/common-licenses), read as a
//! file and as an NBD export served by nbdkit. The figures must hang
//! together (text compresses, zstd beats lz4, the image's empty space is
//! counted as zero blocks, the export gives the same figures as the file)
//! and a wrong codec must be a clear error. The dedup figures come from two
//! ext4 images of overlapping trees of this machine's files (the same text,
//! then each its own tree of other files, at different offsets): their
//! concatenation dedupes well above either image alone. Skips, saying why,
//! where mkfs.ext4 or nbdkit is missing, as the filesystem tests do.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::LAMINA;

/// The ext4 image's size: mostly empty, so zero blocks dominate.
const IMAGE_SIZE_MIB: u64 = 32;
/// How much text goes into the image.
const TREE_SIZE_LIMIT_BYTES: u64 = 4 << 20;
const NBDKIT_READY_TIMEOUT_MS: u64 = 10_000;
const POLL_INTERVAL_MS: u64 = 20;
/// Where the text comes from: plain licences, then any regular files.
const TEXT_DIRECTORIES: [&str; 2] = ["/usr/share/common-licenses", "/usr/share/doc"];
/// Each dedup image's own files, after the shared text: one tree each.
const OWN_DIRECTORIES: [&str; 2] = ["/usr/share/perl5", "/usr/lib/python3"];
/// How much of its own tree goes into each dedup image.
const OWN_TREE_SIZE_LIMIT_BYTES: u64 = 3 << 20;

fn missing_program() -> Option<&'static str> {
    ["mkfs.ext4", "nbdkit"].into_iter().find(|program| {
        !Command::new("sh")
            .args(["-c", &format!("command -v {program}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

/// Copies files whose names do not end in `.gz` (already compressed) into
/// `tree` until `limit_bytes`, in name order, each named by the bytes
/// copied before it (the same sources give the same names).
fn copy_text(source: &Path, tree: &Path, copied_bytes: &mut u64, limit_bytes: u64) {
    let Ok(entries) = std::fs::read_dir(source) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    paths.sort();
    for path in paths {
        if *copied_bytes >= limit_bytes {
            return;
        }
        let Ok(metadata) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if metadata.is_dir() {
            copy_text(&path, tree, copied_bytes, limit_bytes);
        } else if metadata.is_file() && path.extension().is_none_or(|extension| extension != "gz") {
            let name = format!(
                "{copied_bytes}-{}",
                path.file_name().expect("a file name").to_string_lossy()
            );
            if std::fs::copy(&path, tree.join(name)).is_ok() {
                *copied_bytes += metadata.len();
            }
        }
    }
}

/// An ext4 image of text files in `directory`.
fn build_image(directory: &Path) -> PathBuf {
    let tree = directory.join("tree");
    std::fs::create_dir(&tree).expect("tree directory");
    let mut copied_bytes = 0;
    for source in TEXT_DIRECTORIES {
        copy_text(
            Path::new(source),
            &tree,
            &mut copied_bytes,
            TREE_SIZE_LIMIT_BYTES,
        );
    }
    assert!(
        copied_bytes > 1 << 20,
        "too little text found: {copied_bytes} bytes"
    );
    let image = directory.join("text.ext4");
    let status = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&tree)
        .arg(&image)
        .arg(format!("{IMAGE_SIZE_MIB}M"))
        .status()
        .expect("mkfs.ext4 runs");
    assert!(status.success(), "mkfs.ext4 failed: {status}");
    image
}

fn estimate_json(source: &str) -> serde_json::Value {
    let output = Command::new(LAMINA)
        .args([
            "reduction",
            "estimate",
            source,
            "--codec",
            "lz4,zstd:1,zstd:3",
            "--json",
        ])
        .output()
        .expect("lamina runs");
    assert!(
        output.status.success(),
        "estimate failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the estimate is JSON")
}

fn number(value: &serde_json::Value, field: &str) -> f64 {
    value[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

/// The figures that depend on the data only (throughputs do not).
fn sizes(estimate: &serde_json::Value) -> Vec<f64> {
    let mut sizes = vec![
        number(estimate, "zero_block_count"),
        number(estimate, "data_bytes"),
    ];
    for codec in estimate["codecs"].as_array().expect("codecs") {
        for group in codec["groups"].as_array().expect("groups") {
            sizes.push(number(group, "packed_bytes"));
            sizes.push(number(group, "compressed_bytes"));
        }
    }
    sizes
}

fn check_figures(estimate: &serde_json::Value) {
    let logical_bytes = number(estimate, "logical_bytes");
    assert_eq!(
        logical_bytes,
        f64::from(u32::try_from(IMAGE_SIZE_MIB << 20).expect("small"))
    );
    let zero_block_count = number(estimate, "zero_block_count");
    assert!(
        zero_block_count > 0.5 * number(estimate, "block_count"),
        "a mostly empty image has mostly zero blocks: {estimate}"
    );
    let codecs = estimate["codecs"].as_array().expect("codecs");
    let names: Vec<&str> = codecs
        .iter()
        .map(|codec| codec["codec"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, ["lz4", "zstd:1", "zstd:3"]);
    let alone_ratio = |index: usize| number(&codecs[index]["groups"][0], "ratio");
    assert!(alone_ratio(0) > 1.3, "text compresses with lz4: {estimate}");
    assert!(
        alone_ratio(0) <= alone_ratio(1),
        "lz4 compresses less than zstd:1: {estimate}"
    );
    assert!(
        alone_ratio(0) <= alone_ratio(2),
        "lz4 compresses less than zstd:3: {estimate}"
    );
    for codec in codecs {
        let groups = codec["groups"].as_array().expect("groups");
        assert_eq!(groups.len(), 3);
        for group in groups {
            let packed = number(group, "packed_bytes");
            assert!(packed >= number(group, "compressed_bytes"));
            assert_eq!(packed % 16.0, 0.0, "packed at 16 B: {group}");
            assert_eq!(number(group, "data_bytes"), number(estimate, "data_bytes"));
        }
        // Grouping never loses much: the same bytes in fewer, larger pieces.
        assert!(
            number(&groups[2], "unrounded_ratio") >= 0.98 * number(&groups[0], "unrounded_ratio")
        );
    }
}

/// Serves `image` read-only over a Unix socket with nbdkit; stopped on drop.
struct Nbdkit {
    child: std::process::Child,
    socket: PathBuf,
}

impl Nbdkit {
    fn serve(image: &Path, socket: PathBuf) -> Nbdkit {
        let child = Command::new("nbdkit")
            .args(["--foreground", "--readonly", "--unix"])
            .arg(&socket)
            .arg("file")
            .arg(image)
            .stdout(Stdio::null())
            .spawn()
            .expect("nbdkit starts");
        let deadline = Instant::now() + Duration::from_millis(NBDKIT_READY_TIMEOUT_MS);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "nbdkit did not create {socket:?}"
            );
            std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS));
        }
        Nbdkit { child, socket }
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn estimate_of_an_ext4_image_read_as_a_file_and_as_an_export() {
    if let Some(program) = missing_program() {
        eprintln!("skipped: {program} is not installed");
        return;
    }
    let directory = tempfile::tempdir().expect("temporary directory");
    let image = build_image(directory.path());
    let from_file = estimate_json(image.to_str().expect("a UTF-8 path"));
    check_figures(&from_file);

    let server = Nbdkit::serve(&image, directory.path().join("nbd.sock"));
    let from_export = estimate_json(&server.uri());
    assert_eq!(
        sizes(&from_file),
        sizes(&from_export),
        "the export reads as the file"
    );

    let text = Command::new(LAMINA)
        .args(["reduction", "estimate"])
        .arg(&image)
        .output()
        .expect("lamina runs");
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).expect("UTF-8");
    for expected in ["zero blocks", "lz4", "zstd:3", "32K group"] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
}

#[test]
fn unknown_codecs_and_levels_are_clear_errors() {
    for (codec, expected) in [
        ("gzip", "unknown codec \"gzip\""),
        ("zstd:99", "out of range"),
        ("lz4:3", "takes no level"),
    ] {
        let output = Command::new(LAMINA)
            .args(["reduction", "estimate", "/dev/null", "--codec", codec])
            .output()
            .expect("lamina runs");
        assert!(!output.status.success(), "{codec} was accepted");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(message.contains(expected), "{codec}: {message}");
    }
    let output = Command::new(LAMINA)
        .args(["reduction", "estimate", "/nonexistent/image"])
        .output()
        .expect("lamina runs");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot open /nonexistent/image"));
}

/// An ext4 image of 4 KiB blocks (as real volumes have) holding its own
/// files from `own_directory` first, then the text every such image shares.
fn build_dedup_image(directory: &Path, name: &str, own_directory: &str) -> PathBuf {
    let tree = directory.join(format!("{name}-tree"));
    let own = tree.join("a-own");
    let shared = tree.join("b-shared");
    std::fs::create_dir_all(&own).expect("own directory");
    std::fs::create_dir_all(&shared).expect("shared directory");
    let mut own_bytes = 0;
    copy_text(
        Path::new(own_directory),
        &own,
        &mut own_bytes,
        OWN_TREE_SIZE_LIMIT_BYTES,
    );
    let mut shared_bytes = 0;
    for source in TEXT_DIRECTORIES {
        copy_text(
            Path::new(source),
            &shared,
            &mut shared_bytes,
            TREE_SIZE_LIMIT_BYTES,
        );
    }
    assert!(
        own_bytes > 1 << 20 && shared_bytes > 1 << 20,
        "too few files found: {own_bytes} bytes in {own_directory}, {shared_bytes} of text"
    );
    let image = directory.join(format!("{name}.ext4"));
    let status = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-b", "4096", "-d"])
        .arg(&tree)
        .arg(&image)
        .arg(format!("{IMAGE_SIZE_MIB}M"))
        .status()
        .expect("mkfs.ext4 runs");
    assert!(status.success(), "mkfs.ext4 failed: {status}");
    std::fs::remove_dir_all(&tree).expect("tree removed");
    image
}

fn path_text(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

#[test]
fn two_images_of_overlapping_trees_dedupe_together_and_not_alone() {
    if let Some(program) = missing_program() {
        eprintln!("skipped: {program} is not installed");
        return;
    }
    let directory = tempfile::tempdir().expect("temporary directory");
    let first = build_dedup_image(directory.path(), "first", OWN_DIRECTORIES[0]);
    let second = build_dedup_image(directory.path(), "second", OWN_DIRECTORIES[1]);
    let both = directory.path().join("both.img");
    let mut bytes = std::fs::read(&first).expect("first image");
    bytes.extend(std::fs::read(&second).expect("second image"));
    std::fs::write(&both, bytes).expect("the concatenation");

    let alone = [
        estimate_json(path_text(&first)),
        estimate_json(path_text(&second)),
    ];
    let together = estimate_json(path_text(&both));
    let distinct =
        |estimate: &serde_json::Value| number(&estimate["dedup"], "distinct_block_count");
    let dedup_ratio = |estimate: &serde_json::Value| number(&estimate["dedup"], "ratio");
    eprintln!(
        "dedup ratio alone {:.3} and {:.3}, together {:.3}",
        dedup_ratio(&alone[0]),
        dedup_ratio(&alone[1]),
        dedup_ratio(&together)
    );
    for (estimate, image) in alone.iter().zip([&first, &second]) {
        // An image alone: a few repeated blocks (identical files, metadata).
        assert!(
            (1.0..1.3).contains(&dedup_ratio(estimate)),
            "{image:?} alone: {}",
            estimate["dedup"]
        );
    }
    // Together the shared text is stored once: distinct blocks are at most
    // the sum of each image's, at least the larger, and well below the sum.
    let sum = distinct(&alone[0]) + distinct(&alone[1]);
    assert!(distinct(&together) <= sum);
    assert!(distinct(&together) >= distinct(&alone[0]).max(distinct(&alone[1])));
    assert!(distinct(&together) < 0.8 * sum, "{}", together["dedup"]);
    assert!(
        dedup_ratio(&together) > 1.25 * dedup_ratio(&alone[0]).max(dedup_ratio(&alone[1])),
        "together {} alone {} and {}",
        together["dedup"],
        alone[0]["dedup"],
        alone[1]["dedup"]
    );
    assert_eq!(
        number(&together["dedup"], "data_block_count"),
        number(&together, "data_bytes") / 4096.0
    );
    for codec in together["codecs"].as_array().expect("codecs") {
        // Each distinct block compressed once: above compression alone.
        let combined = number(&codec["with_dedup"], "ratio");
        let compression = number(&codec["groups"][0], "ratio");
        assert!(combined > 1.2 * compression, "{codec}");
    }
    // The design's index (decision 0073) within its bound of 4 bytes.
    let index = &together["dedup"]["index"];
    assert_eq!(
        number(index, "record_count"),
        distinct(&together),
        "{index}"
    );
    assert!(
        number(index, "memory_bytes_per_distinct_block") < 4.0,
        "{index}"
    );

    let text = Command::new(LAMINA)
        .args(["reduction", "estimate", "--codec", "lz4"])
        .arg(&both)
        .output()
        .expect("lamina runs");
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).expect("UTF-8");
    for expected in ["dedup ratio", "index memory", "+dedup"] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }
}
