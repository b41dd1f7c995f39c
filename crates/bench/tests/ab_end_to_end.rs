//! End-to-end `ab --preset read-ceiling`: one round of 1-second steps on 32 MiB
//! against every kind of row the runner starts (nbdkit null and memory, lamina on
//! the shared pool warm, on holes and cold, fio and qemu-nbd on the pool's file),
//! checking the cells, the ratios and the JSON document, never the speed.

use std::path::PathBuf;

use clap::Parser;
use lamina_bench::ab::{AbArgs, measure};
use lamina_bench::{built_lamina, peers_available};

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    ab: AbArgs,
}

fn lamina_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LAMINA_BIN") {
        return Some(PathBuf::from(path));
    }
    built_lamina(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."))
}

#[test]
fn read_ceiling_rows_are_measured_with_medians_and_ratios() {
    assert!(
        peers_available(),
        "fio and nbdkit must be installed for the end-to-end benchmark test"
    );
    let Some(lamina) = lamina_binary() else {
        println!("note: no built lamina binary (set LAMINA_BIN); nothing to compare");
        return;
    };
    let directory = tempfile::tempdir().expect("tempdir");
    let build = format!("lamina={}", lamina.display());
    let work = directory.path().display().to_string();
    let cli = Cli::try_parse_from([
        "ab",
        "--preset",
        "read-ceiling",
        "--build",
        &build,
        "--rounds",
        "1",
        "--runtime",
        "1",
        "--ramp",
        "0",
        "--size",
        "32M",
        "--work-dir",
        &work,
    ])
    .expect("parses");
    let report = measure(&cli.ab).expect("runs");

    assert_eq!(report.reference.as_deref(), Some("lamina-warm"));
    for row in [
        "nbdkit-null",
        "nbdkit-memory",
        "lamina-warm",
        "lamina-holes",
        "lamina-cold",
        "device",
    ] {
        for workload in ["randread32", "randread1"] {
            let cell = report
                .cells
                .iter()
                .find(|cell| cell.row == row && cell.workload == workload)
                .unwrap_or_else(|| panic!("{row} {workload} measured: {:?}", report.run.skipped));
            assert_eq!(cell.rounds, 1);
            assert!(cell.iops > 0.0);
            assert_eq!(cell.server_cpu_us_per_op.is_some(), row != "device");
        }
    }
    let warm = &report.cells[4];
    assert_eq!(
        (warm.row.as_str(), warm.iops_ratio),
        ("lamina-warm", Some(1.0))
    );
    let table = report.table();
    assert!(table.starts_with("ab read-ceiling (1 rounds, medians; ratios are row / lamina-warm)"));
    assert!(table.contains("cpu us/op"));
    let document = serde_json::to_value(&report).expect("serializes");
    assert_eq!(
        document["scenario"]["rows"].as_array().map(Vec::len),
        Some(7)
    );
    assert_eq!(
        document["samples"].as_array().map(Vec::len),
        Some(report.cells.len())
    );
    assert!(document["load_average_start"].is_string());
}
