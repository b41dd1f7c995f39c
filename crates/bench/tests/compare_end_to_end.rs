//! End-to-end `compare`: a 2-second randread4k on small data against nbdkit (always)
//! and lamina (when a built `lamina` binary is found), checking the structure of the
//! table, the JSON document and the plot, never the speed.

use std::path::PathBuf;

use lamina_bench::harness::arguments::{CommonArgs, OutputArgs};
use lamina_bench::servers::ServerKind;
use lamina_bench::workload::{Mix, Profile};
use lamina_bench::{CompareArgs, StepOptions, built_lamina, compare, peers_available};

fn lamina_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LAMINA_BIN") {
        return Some(PathBuf::from(path));
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    built_lamina(&workspace)
}

#[test]
fn compare_randread_against_nbdkit_and_lamina() {
    if !peers_available() {
        // The suite documents fio and nbdkit as requirements; say loudly what is missing.
        panic!("fio and nbdkit must be installed for the end-to-end benchmark test");
    }
    let lamina = lamina_binary();
    let mut servers = vec![ServerKind::Nbdkit];
    match &lamina {
        Some(path) => {
            println!("measuring lamina at {}", path.display());
            servers.insert(0, ServerKind::Lamina);
        }
        None => println!("note: no built lamina binary (set LAMINA_BIN); measuring nbdkit only"),
    }
    let directory = tempfile::tempdir().expect("tempdir");
    let plot = directory.path().join("randread4k.svg");
    let arguments = CompareArgs {
        servers: servers.clone(),
        size: 16 << 20,
        cache_miss: false,
        restart: false,
        device_row: false,
        step: StepOptions {
            profile: Profile::Randread4k,
            runtime: 2,
            ramp: 0,
            iodepth: 8,
            jobs: 1,
            max_jobs: 1,
            mix: Mix::Randread4k,
            rate_jobs: 1,
            rate_iodepth: 8,
            rate_targets: None,
            slo_us: 1000.0,
        },
        common: CommonArgs {
            lamina_bin: lamina.clone(),
            work_dir: Some(directory.path().to_owned()),
            fio: "fio".into(),
            output: OutputArgs {
                json: true,
                output: None,
                plot: Some(plot.clone()),
            },
        },
    };
    let report = compare(&arguments).expect("compare runs");

    // nbdkit is always measured; lamina is either measured or skipped with a reason.
    let nbdkit = report
        .servers
        .iter()
        .find(|server| server.server == "nbdkit")
        .expect("nbdkit measured");
    assert_eq!(nbdkit.points.len(), 1);
    assert!(nbdkit.points[0].measurement.completed_ios > 0);
    assert!(nbdkit.uri.starts_with("nbd+unix:///default?socket="));
    if lamina.is_some() {
        let measured = report
            .servers
            .iter()
            .any(|server| server.server == "lamina");
        let skipped = report
            .skipped
            .iter()
            .find(|skipped| skipped.server == "lamina");
        assert!(
            measured || skipped.is_some(),
            "lamina neither measured nor skipped"
        );
        if let Some(skipped) = skipped {
            println!("note: lamina skipped: {}", skipped.reason);
        }
    }
    assert_eq!(
        report.servers.len() + report.skipped.len(),
        servers.len(),
        "every server is measured or skipped"
    );

    // Table: a header and one row per measured server, every figure with a ratio.
    let table = report.table();
    println!("{table}");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[1].starts_with("server") && lines[1].contains("p99 us"));
    for (index, server) in report.servers.iter().enumerate() {
        assert!(lines[2 + index].starts_with(&server.server));
        // IOPS, MB/s, p50, p99, p99.9 and the server's CPU per operation.
        assert_eq!(
            lines[2 + index].matches("x)").count(),
            6,
            "{}",
            lines[2 + index]
        );
        let cpu = server.points[0]
            .server_cpu_us_per_op
            .expect("the started server's CPU is measured");
        assert!(cpu > 0.0, "{} used no CPU for its I/O", server.server);
    }

    // JSON: the fields users script against.
    let json = serde_json::to_value(&report).expect("serialises");
    assert_eq!(json["profile"], "randread4k");
    assert!(
        json["fio_version"]
            .as_str()
            .unwrap_or("")
            .starts_with("fio-")
    );
    let first = &json["servers"][0];
    for field in [
        "total_iops",
        "p50_us",
        "p99_us",
        "p999_us",
        "read_megabytes_per_second",
    ] {
        assert!(
            first["points"][0]["measurement"][field].is_number(),
            "{field}"
        );
    }
    assert_eq!(first["figures"][0]["ratio_to_reference"], 1.0);

    // Plot: lamina bench draws it in the CLI; here through the same function.
    lamina_bench::plot::render(&report, &plot).expect("plots");
    let svg = std::fs::read_to_string(&plot).expect("svg written");
    assert!(svg.starts_with("<svg") && svg.len() > 1000);

    // Nothing left behind: every server directory was removed after its run.
    for kind in servers {
        let leftover = std::fs::read_dir(directory.path())
            .expect("lists")
            .flatten()
            .flat_map(|work| {
                std::fs::read_dir(work.path())
                    .into_iter()
                    .flatten()
                    .flatten()
            })
            .any(|entry| entry.file_name() == kind.name());
        assert!(!leftover, "{} directory left behind", kind.name());
    }
}

#[test]
fn cache_miss_restart_mode_adds_the_device_row_and_restarts_each_server() {
    assert!(peers_available(), "fio and nbdkit must be installed");
    let directory = tempfile::tempdir().expect("tempdir");
    let arguments = CompareArgs {
        servers: vec![ServerKind::Nbdkit],
        size: 16 << 20,
        cache_miss: true,
        restart: true,
        device_row: false,
        step: StepOptions {
            profile: Profile::Randread4k,
            runtime: 1,
            ramp: 0,
            iodepth: 4,
            jobs: 1,
            max_jobs: 1,
            mix: Mix::Randread4k,
            rate_jobs: 1,
            rate_iodepth: 4,
            rate_targets: None,
            slo_us: 1000.0,
        },
        common: CommonArgs {
            work_dir: Some(directory.path().to_owned()),
            ..CommonArgs::default()
        },
    };
    let report = compare(&arguments).expect("compare runs");
    assert!(report.skipped.is_empty(), "{:?}", report.skipped);
    let names: Vec<&str> = report.servers.iter().map(|s| s.server.as_str()).collect();
    assert_eq!(names, vec!["nbdkit", "device"], "the device row comes last");
    let nbdkit = &report.servers[0];
    assert!(nbdkit.notes.iter().any(|note| note.contains("cache=none")));
    assert!(
        nbdkit
            .notes
            .iter()
            .any(|note| note.starts_with("restarted"))
    );
    assert!(nbdkit.points[0].measurement.completed_ios > 0);
    let device = &report.servers[1];
    assert!(device.points[0].measurement.completed_ios > 0);
    assert_eq!(device.points[0].server_cpu_us_per_op, None);
}
