//! Smoke test of `lamina bench tiers --quick`: three tiny pools (all-flash,
//! flash + modelled disk, modelled disk alone), two 1-second steps per curve, a
//! short warm-up and a 2-second reaction, checking that every part of the report
//! is there and well formed (table, JSON, plot), never how fast anything was.
//! Needs a built `lamina` binary (`target/{debug,release}/lamina` or `LAMINA_BIN`);
//! skipped with a printed note otherwise.

use std::path::PathBuf;

use clap::Parser;
use lamina_bench::built_lamina;
use lamina_bench::process::find_program;
use lamina_bench::tiers::{TierConfig, TiersArgs, WorkingSet, measure};

fn lamina_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("LAMINA_BIN") {
        return Some(PathBuf::from(path));
    }
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    built_lamina(&workspace)
}

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    tiers: TiersArgs,
}

#[test]
fn tiers_quick_reports_curves_ratios_and_the_reaction() {
    for program in ["fio", "nbdcopy", "nbdinfo"] {
        assert!(
            find_program(program).is_some(),
            "{program} must be installed for the tiers benchmark test"
        );
    }
    let Some(lamina) = lamina_binary() else {
        println!("note: no built lamina binary (set LAMINA_BIN); tiers benchmark not run");
        return;
    };
    let directory = tempfile::tempdir().expect("tempdir");
    let plot = directory.path().join("tiers.svg");
    let arguments = Cli::try_parse_from([
        "tiers".into(),
        "--quick".into(),
        "--lamina-bin".into(),
        lamina.display().to_string(),
        "--work-dir".into(),
        directory.path().display().to_string(),
    ])
    .expect("arguments parse")
    .tiers;
    let report = measure(&arguments).expect("the benchmark runs");

    assert!(
        report.run.skipped.is_empty(),
        "pools skipped: {:?}",
        report.run.skipped
    );
    assert_eq!(report.curves.len(), 6, "three pools, two working sets each");
    for config in TierConfig::all() {
        for working_set in [WorkingSet::Small, WorkingSet::Large] {
            let curve = report
                .curves
                .iter()
                .find(|curve| curve.config == config && curve.working_set == working_set)
                .unwrap_or_else(|| panic!("no curve for {config:?} {working_set:?}"));
            assert!(!curve.points.is_empty());
            for point in &curve.points {
                let measurement = &point.point.measurement;
                assert!(point.point.target_iops.is_some_and(|target| target > 0));
                assert!(measurement.completed_ios > 0, "{point:?}");
                assert!(measurement.p99_us.is_finite() && measurement.p99_us > 0.0);
                assert!(measurement.p50_us <= measurement.p99_us);
                // Only the two-tier pool counts where reads came from.
                assert_eq!(
                    point.reads.is_some(),
                    config == TierConfig::FlashDisk,
                    "{point:?}"
                );
            }
            assert_eq!(curve.warmup.is_some(), config == TierConfig::FlashDisk);
            if let Some(warmup) = &curve.warmup {
                assert!(!warmup.rounds.is_empty());
                assert!(!warmup.outcome.is_empty());
            }
        }
    }
    // Two pools compared with all-flash for each working set.
    assert_eq!(report.comparisons.len(), 4);

    let reaction = report.reaction.as_ref().expect("the reaction was measured");
    assert!(reaction.reference_p99_us > 0.0);
    assert_eq!(reaction.bound_p99_us, 2.0 * reaction.reference_p99_us);
    assert!(!reaction.windows.is_empty());
    assert!(
        reaction
            .windows
            .iter()
            .any(|window| window.completed_ios > 0)
    );
    assert!(reaction.measurement.completed_ios > 0);
    // The reaction volume was left idle in a pool whose flash was cycled: demoted.
    assert!(
        reaction.before.flash_bytes * 100 <= reaction.working_set_bytes,
        "{:?}",
        reaction.before
    );
    assert_eq!(
        reaction.goal_met,
        reaction
            .settled_seconds
            .is_some_and(|seconds| seconds <= reaction.goal_seconds)
    );

    let table = report.table();
    for text in [
        "all-flash",
        "flash+disk",
        "disk",
        "reaction:",
        "ratio to all-flash",
    ] {
        assert!(table.contains(text), "{text:?} missing from\n{table}");
    }
    let json = serde_json::to_value(&report).expect("serialises");
    assert_eq!(json["curves"].as_array().map(Vec::len), Some(6));
    assert!(json["reaction"]["windows"].is_array());
    assert!(
        json["fio_version"]
            .as_str()
            .is_some_and(|version| version.starts_with("fio"))
    );
    lamina_bench::plot::render(&report, &plot).expect("plots");
    let svg = std::fs::read_to_string(&plot).expect("reads the plot");
    assert!(svg.starts_with("<svg") && svg.contains("flash+disk"));
}
