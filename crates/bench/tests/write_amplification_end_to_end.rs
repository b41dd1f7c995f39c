//! `lamina bench write-amplification` end to end: the real command (the `lamina`
//! shim running this crate's `lamina-bench`, which starts the `lamina` daemon found
//! beside it), on small
//! file-backed pools served by the daemon and written by fio over NBD, must
//! produce a finite figure of at least 1 for every cell, and the client bytes
//! the pool counted in the measured window must be the bytes fio wrote (the
//! check that makes the figure describe fio's writes). Skipped, with the reason
//! printed, only when fio or its nbd engine is missing.

use std::path::PathBuf;
use std::process::Command;

/// The benchmark program cargo built for this test.
const LAMINA_BENCH: &str = env!("CARGO_BIN_EXE_lamina-bench");

/// The `lamina` binary beside `lamina-bench`: cargo builds every workspace member's
/// binaries into one directory, and `cargo test --workspace` builds them all before
/// any test runs (with `-p lamina-bench` alone, build it first: `cargo build -p lamina`).
fn lamina() -> PathBuf {
    let path = PathBuf::from(LAMINA_BENCH).with_file_name("lamina");
    assert!(
        path.is_file(),
        "no lamina binary at {}: run `cargo build -p lamina` (cargo test --workspace builds it)",
        path.display()
    );
    path
}

/// `/usr/bin` and `/bin` ahead of the test's PATH, where fio and nbdkit live.
fn system_path() -> String {
    format!(
        "/usr/bin:/bin:{}",
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn lamina_bench_runs_the_bench_program_beside_it() {
    let output = Command::new(lamina())
        .args(["bench", "write-amplification", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("--warm-up-passes"), "{help}");
}

/// Why the test cannot run here, if fio or its nbd engine is missing.
fn fio_nbd_missing() -> Option<String> {
    match Command::new("fio")
        .arg("--enghelp=nbd")
        .env("PATH", system_path())
        .output()
    {
        Err(error) => Some(format!("fio cannot be run: {error}")),
        Ok(output) if !output.status.success() => Some(format!(
            "fio has no nbd engine: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )),
        Ok(_) => None,
    }
}

#[test]
fn both_workloads_report_a_trustworthy_write_amplification() {
    if let Some(reason) = fio_nbd_missing() {
        eprintln!("skipped: {reason}");
        return;
    }
    let directory = tempfile::tempdir().unwrap();
    let output = Command::new(lamina())
        .args([
            "bench",
            "write-amplification",
            "--pool-size",
            "64M",
            "--segment-size",
            "1M",
            "--live",
            "0.5",
            "--workloads",
            "uniform,zipf",
            "--warm-up-passes",
            "1",
            "--passes",
            "1.5",
            "--iodepth",
            "8",
            "--json",
            "--directory",
        ])
        .arg(directory.path())
        .env("PATH", system_path())
        .env("LAMINA_LOG", "warn")
        .env_remove("LAMINA_BIN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the benchmark failed: {stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
            panic!(
                "no JSON ({error}): {}",
                String::from_utf8_lossy(&output.stdout)
            )
        });
    let cells = report["cells"].as_array().expect("cells");
    let workloads: Vec<&str> = cells
        .iter()
        .map(|cell| cell["workload"].as_str().expect("workload"))
        .collect();
    assert_eq!(workloads, ["uniform", "zipf"]);
    for cell in cells {
        let number = |name: &str| {
            cell[name]
                .as_f64()
                .unwrap_or_else(|| panic!("{name} in {cell}"))
        };
        let count = |name: &str| {
            cell[name]
                .as_u64()
                .unwrap_or_else(|| panic!("{name} in {cell}"))
        };
        assert_eq!(number("live_fraction"), 0.5);
        let amplification = number("write_amplification");
        assert!(
            amplification.is_finite() && amplification >= 1.0,
            "write amplification {amplification} in {cell}"
        );
        let volume_bytes = count("volume_size_bytes");
        let usable_bytes = count("capacity_bytes") - count("reserved_bytes");
        assert!(volume_bytes > 0 && volume_bytes <= usable_bytes / 2);
        // 1.5 passes of the volume, in whole 4 KiB blocks: what fio was asked to
        // write, what it says it wrote and what the pool counted are the same.
        let expected_bytes = volume_bytes * 3 / 2 / 4096 * 4096;
        assert_eq!(count("fio_bytes_written"), expected_bytes, "{cell}");
        assert_eq!(count("client_bytes_written"), expected_bytes, "{cell}");
        assert!(count("device_bytes_written") >= count("client_bytes_written"));
        assert!(number("relocated_per_client_block") >= 0.0);
        assert!(number("client_iops") > 0.0);
        match cell["workload"].as_str() {
            Some("uniform") => assert!(number("greedy_bound") > 1.0),
            _ => assert!(cell["greedy_bound"].is_null()),
        }
    }
    // With --directory each cell's pool file is kept, and its daemon's directory
    // (configuration, sockets, pool description) is gone.
    let kept: Vec<_> = std::fs::read_dir(directory.path())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 2, "{kept:?}");
    for cell_directory in kept {
        assert!(cell_directory.join("pool.img").is_file());
        assert!(!cell_directory.join("server").exists());
    }
}
