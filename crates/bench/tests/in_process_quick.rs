//! Smoke test of the in-process subcommands (`engine`, `device-iops`): each parsed
//! from its command line as `lamina bench` parses it, run
//! with tiny sizes and one-second windows, and its table and JSON checked for the
//! fields they promise, never for how fast anything was. fio is left out (the
//! `--with-fio` peer and phase a of `engine` need it and take longer).

use clap::Parser;
use lamina_bench::in_process;
use lamina_bench::{BenchArgs, BenchCommand};
use serde_json::Value;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn parse(arguments: &[&str]) -> BenchCommand {
    let mut line = vec!["lamina"];
    line.extend_from_slice(arguments);
    Cli::try_parse_from(line).expect("parses").bench.command
}

/// The report as JSON, with `fields` present at its top level.
fn json_with(report: &impl serde::Serialize, fields: &[&str]) -> Value {
    let document = serde_json::to_value(report).expect("serialises");
    for field in fields {
        assert!(
            document.get(field).is_some(),
            "JSON lacks `{field}`: {document}"
        );
    }
    document
}

fn path_in(directory: &tempfile::TempDir, name: &str) -> String {
    directory.path().join(name).display().to_string()
}

#[test]
fn engine_memory_phase_reports_bytes_per_block() {
    // 128 MiB: the checkpoint reserve keeps a segment for every body a
    // chain of increments can hold at once (decision 0026), which leaves a
    // 64 MiB pool of 4 MiB segments no room for the 8 MiB written here.
    let directory = tempfile::tempdir().unwrap();
    let path = path_in(&directory, "engine.img");
    let BenchCommand::Engine(arguments) = parse(&[
        "engine",
        "--path",
        &path,
        "--size",
        "128M",
        "--phases",
        "c",
        "--memory-blocks",
        "2048",
    ]) else {
        panic!("not engine");
    };
    let report = in_process::iops_recovery_memory::measure(&arguments).expect("measures");
    let table = report.table();
    assert!(
        table.contains("== (c) memory per mapped block: 2048 blocks"),
        "{table}"
    );
    let document = json_with(&report, &["size_bytes", "device_backend", "memory"]);
    assert!(document["iops"].is_null() && document["recovery"].is_null());
    assert!(document["memory"]["bytes_per_mapped_block"].is_f64());
    assert!(
        !std::path::Path::new(&path).exists(),
        "the pool file is removed"
    );
}

#[test]
fn engine_refuses_recovery_on_a_small_file() {
    let BenchCommand::Engine(arguments) = parse(&[
        "engine",
        "--path",
        "/nonexistent/x",
        "--size",
        "1G",
        "--phases",
        "b",
    ]) else {
        panic!("not engine");
    };
    let error = in_process::iops_recovery_memory::measure(&arguments).unwrap_err();
    assert!(error.to_string().contains("at least 4.5 GiB"), "{error}");
}

#[test]
fn device_iops_reports_both_patterns() {
    let directory = tempfile::tempdir().unwrap();
    let path = path_in(&directory, "device.img");
    let BenchCommand::DeviceIops(arguments) = parse(&[
        "device-iops",
        "--path",
        &path,
        "--size",
        "16M",
        "--seconds",
        "1",
        "--repeats",
        "1",
    ]) else {
        panic!("not device-iops");
    };
    let report = in_process::device_iops::measure(&arguments).expect("measures");
    let table = report.table();
    assert!(table.contains("randread  lamina"), "{table}");
    assert!(table.contains("filled in"), "{table}");
    let document = json_with(&report, &["backend", "queue_depth", "patterns"]);
    let patterns = document["patterns"].as_array().unwrap();
    assert_eq!(patterns.len(), 2);
    assert!(patterns[1]["lamina_iops"].as_f64().unwrap() > 0.0);
    assert!(patterns[1]["fio_iops"].is_null());
}
