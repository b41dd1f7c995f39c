//! `lamina reduction estimate` on real data made here: an ext4 image built by
//! `mkfs.ext4 -d` from text files of this machine (manual pages unpacked into
//! plain text and the licences of /usr/share/common-licenses), read as a
//! file and as an NBD export served by nbdkit. The figures must hang
//! together (text compresses, zstd beats lz4, the image's empty space is
//! counted as zero blocks, the export gives the same figures as the file)
//! and a wrong codec must be a clear error. Skips, saying why, where
//! mkfs.ext4 or nbdkit is missing, as the filesystem tests do.

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
/// `tree` until `TREE_SIZE_LIMIT_BYTES`.
fn copy_text(source: &Path, tree: &Path, copied_bytes: &mut u64) {
    let Ok(entries) = std::fs::read_dir(source) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    paths.sort();
    for path in paths {
        if *copied_bytes >= TREE_SIZE_LIMIT_BYTES {
            return;
        }
        let Ok(metadata) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if metadata.is_dir() {
            copy_text(&path, tree, copied_bytes);
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
        copy_text(Path::new(source), &tree, &mut copied_bytes);
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
