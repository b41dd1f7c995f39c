//! Smoke test of the in-process subcommands (`engine`, `cleaner-latency`,
//! `engine-write-amplification`, `device-iops`, `array-write-cost`): each parsed from its command line as `lamina bench` parses it, run
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
fn engine_write_amplification_reports_every_cell() {
    let BenchCommand::EngineWriteAmplification(arguments) = parse(&[
        "engine-write-amplification",
        "--pool-size",
        "32M",
        "--passes",
        "1",
        "--live",
        "0.5",
        "--workloads",
        "uniform,zipf-permuted",
        "--verbose",
    ]) else {
        panic!("not engine-write-amplification");
    };
    let report = in_process::write_amplification::measure(&arguments).expect("measures");
    let table = report.table();
    assert!(table.contains("WA (measured)"), "{table}");
    assert!(table.contains("zipf-permuted:0.99"), "{table}");
    assert!(
        table.contains("blocks overwritten at least once"),
        "{table}"
    );
    let document = json_with(&report, &["pool_size_bytes", "passes", "cells"]);
    let cells = document["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 2);
    assert_eq!(cells[0]["workload"], "uniform");
    assert!(cells[0]["greedy_bound"].is_f64());
    assert!(cells[1]["greedy_bound"].is_null());
    for cell in cells {
        assert!(cell["write_amplification"].as_f64().unwrap() >= 1.0);
    }
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

#[test]
fn cleaner_latency_reports_busy_and_idle_windows() {
    let directory = tempfile::tempdir().unwrap();
    let directory_text = directory.path().display().to_string();
    let BenchCommand::CleanerLatency(arguments) = parse(&[
        "cleaner-latency",
        "--pool-size",
        "256M",
        "--live",
        "0.5",
        "--seconds",
        "1",
        "--saturation-seconds",
        "1",
        "--runs",
        "1",
        "--directory",
        &directory_text,
    ]) else {
        panic!("not cleaner-latency");
    };
    let report = in_process::cleaner_latency::measure(&arguments).expect("measures");
    let table = report.table();
    assert!(table.contains("  busy  p50"), "{table}");
    assert!(table.contains("p99 busy/idle"), "{table}");
    let document = json_with(&report, &["volume_bytes", "runs", "medians"]);
    let run = &document["runs"][0];
    assert!(run["idle"]["completed"].as_u64().unwrap() > 0);
    assert_eq!(
        run["idle"]["relocated_blocks"], 0,
        "the idle pool never cleans"
    );
    assert!(document["medians"]["busy_to_idle_p99"].is_f64());
    assert_eq!(
        std::fs::read_dir(directory.path()).unwrap().count(),
        0,
        "the pool files are removed"
    );
}

#[test]
fn array_write_cost_reports_every_cell_without_member_reads() {
    let BenchCommand::ArrayWriteCost(arguments) = parse(&[
        "array-write-cost",
        "--configurations",
        "single,raid6,raid5",
        "--flush-every",
        "1,16",
        "--writes",
        "256",
        "--volume-size",
        "4M",
        "--runs",
        "1",
    ]) else {
        panic!("not array-write-cost");
    };
    let report = in_process::array_write_cost::measure(&arguments).expect("measures");
    let table = report.table();
    assert!(table.contains("flush every 16 writes:"), "{table}");
    assert!(table.contains("raid6 4+2"), "{table}");
    let document = json_with(&report, &["writes_per_cell", "summaries", "measurements"]);
    let summaries = document["summaries"].as_array().unwrap();
    assert_eq!(summaries.len(), 6);
    for summary in summaries {
        // Whole rows only: nothing is read while clients write.
        assert_eq!(summary["member_read_bytes_max"], 0, "{summary}");
        assert!(summary["write_amplification"].as_f64().unwrap() >= 1.0);
    }
    let raid6_flushing_each_write = &summaries[1];
    assert_eq!(raid6_flushing_each_write["configuration"], "raid6");
    // A lone block and its two summary copies fill three of a row's four
    // data blocks: one block of padding per write.
    assert_eq!(
        raid6_flushing_each_write["padding_blocks_per_client_block"],
        1.0
    );
    assert!(
        raid6_flushing_each_write["ratio_to_single"]
            .as_f64()
            .unwrap()
            >= 1.5
    );
}
