//! End-to-end tests of lamina-plan through its library API: the worked example the
//! method comes from, the idle/spike/busy trace where the mean misleads, every
//! parser on realistic and malformed input, and the text, JSON and SVG renderings.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::path::{Path, PathBuf};

use lamina_plan::analysis::GIB;
use lamina_plan::backend::size_backend;
use lamina_plan::parse::addresses;
use lamina_plan::{
    DriveModel, ParseOptions, PlanError, PlanSettings, Redundancy, TraceFormat, parse_file, plan,
    render_json, render_text,
};

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn settings(redundancy: &str, drive: &str) -> PlanSettings {
    PlanSettings::new(redundancy.parse().unwrap(), drive.parse().unwrap())
}

fn close(actual: f64, expected: f64, tolerance: f64) -> bool {
    (actual - expected).abs() <= tolerance
}

#[test]
fn worked_example_arithmetic_is_reproduced_exactly() {
    // 3,000 front-end IOPS, one write in six; RAID5; a 15k drive gives 220 IOPS at 20 ms.
    let drive: DriveModel = "hdd-15k".parse().unwrap();
    let drive_iops = drive.iops_at_latency(20.0);
    assert_eq!(drive_iops, 220.0);
    let sizing = size_backend(2500.0, 500.0, 0.0, Redundancy::Raid5, drive_iops, 1);
    assert_eq!(sizing.backend_iops, 4500.0);
    assert_eq!(sizing.backend_increase_percent, 50.0);
    assert!(close(sizing.drives_before_redundancy_exact, 13.64, 0.01));
    assert_eq!(sizing.drives_before_redundancy, 14);
    assert!(close(sizing.drives_after_redundancy_exact, 20.45, 0.01));
    assert_eq!(sizing.drives_after_redundancy, 21);
    assert_eq!(sizing.working_drives, 21);
    assert_eq!(sizing.total_drives, 22);
    let two_spares = size_backend(2500.0, 500.0, 0.0, Redundancy::Raid5, drive_iops, 2);
    assert_eq!(two_spares.total_drives, 23);
}

#[test]
fn worked_example_from_a_perfmon_trace() {
    let trace = parse_file(
        &data("perfmon-worked-example.csv"),
        None,
        &ParseOptions::default(),
    )
    .unwrap();
    assert_eq!(trace.format, TraceFormat::Perfmon);
    let mut settings = settings("raid5", "hdd-15k");
    settings.proposal_drives = Some(11);
    let report = plan("perfmon-worked-example.csv", &trace, None, &settings);
    let analysis = &report.analysis;
    // Steady state about 3,000 at one write in six.
    assert!(
        close(analysis.steady_state_iops, 3000.0, 60.0),
        "steady {}",
        analysis.steady_state_iops
    );
    assert!(close(analysis.write_fraction, 1.0 / 6.0, 0.005));
    // The mean (idle night included) and the peak (a report run) both mislead.
    assert!(analysis.mean_iops < 1500.0);
    assert!(analysis.peak_iops > 5000.0);
    // RAID5 raises the back-end load by 50%, to about 4,500.
    let sizing = &report.sizing;
    assert!(close(sizing.backend_increase_percent, 50.0, 1.0));
    assert!(close(sizing.backend_iops, 4500.0, 90.0));
    assert_eq!(sizing.drive_iops, 220.0);
    assert_eq!(sizing.drives_before_redundancy, 14);
    assert_eq!(sizing.drives_after_redundancy, 21);
    assert_eq!(sizing.total_drives, 22);
    settings.spare_drives = 2;
    assert_eq!(plan("x", &trace, None, &settings).sizing.total_drives, 23);
    // The vendor's 11 working drives are flagged.
    let proposal = report.proposal.as_ref().unwrap();
    assert!(proposal.under_sized);
    assert_eq!(proposal.needed_working_drives, 21);
    assert!(
        proposal.predicted_latency_ms.is_none(),
        "11 drives saturate"
    );
    assert!(
        report
            .warnings
            .iter()
            .any(|warning| warning.contains("proposal of 11 working drives is under-sized"))
    );
    // The report walks through the steps with these figures.
    let text = render_text(&report);
    for expected in [
        "RAID5 write penalty 4",
        "(+50%)",
        "hdd-15k at 20 ms",
        "220 IOPS per drive",
        "/ 220 = 13.5 -> 14",
        "-> 21",
        "22 drives  (1 spare: 22, 2 spares: 23)",
        "UNDER-SIZED: the steady state needs 21 working drives; 11 is 10 short.",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    // The six-minute report run is the one spike, and an 8 GiB cache absorbs it.
    assert_eq!(analysis.spikes.len(), 1);
    let spike = &analysis.spikes[0];
    assert!(close(spike.duration_seconds, 360.0, 1.0));
    assert!(close(spike.magnitude, 1.95, 0.1));
    assert!(spike.absorbed_by_cache);
    // Latency in the trace stayed well under target: not saturated.
    assert!(!analysis.saturation.saturated);
    // Flash in front of the same drives cuts the back-end reads.
    assert!(report.flash.with_flash.working_drives < sizing.working_drives);
}

#[test]
fn steady_state_is_not_dragged_down_by_idle_time_or_pushed_up_by_a_spike() {
    let trace = parse_file(
        &data("synthetic-idle-spike-busy.csv"),
        Some(TraceFormat::Csv),
        &ParseOptions::default(),
    )
    .unwrap();
    assert_eq!(trace.samples.len(), 1440);
    let report = plan("synthetic", &trace, None, &settings("raid10", "hdd-10k"));
    let analysis = &report.analysis;
    assert!(
        close(analysis.mean_iops, 260.0, 10.0),
        "mean {}",
        analysis.mean_iops
    );
    assert!(
        close(analysis.steady_state_iops, 500.0, 15.0),
        "steady {}",
        analysis.steady_state_iops
    );
    assert_eq!(analysis.peak_iops, 4000.0);
    // One busy period of about 700 minutes; the night spike is not part of it.
    assert_eq!(analysis.busy_periods.len(), 1);
    assert!(close(
        analysis.busy_periods[0].duration_seconds,
        700.0 * 60.0,
        8.0 * 60.0
    ));
    assert_eq!(analysis.spikes.len(), 1);
    assert!(close(analysis.spikes[0].start_seconds, 2.0 * 3600.0, 1.0));
    assert!(close(analysis.spikes[0].duration_seconds, 300.0, 1.0));
    // The sizing starts from the steady state, not the mean.
    assert!(close(
        report.sizing.front_end_iops,
        analysis.steady_state_iops,
        1e-9
    ));
    assert!(close(analysis.write_fraction, 0.3, 1e-6));
    assert!(close(analysis.mean_io_size_bytes.unwrap(), 4096.0, 0.1));
}

#[test]
fn perfmon_sums_hosts_without_double_counting_and_skips_bad_rows() {
    let trace = parse_file(
        &data("perfmon-worked-example.csv"),
        Some(TraceFormat::Perfmon),
        &ParseOptions::default(),
    )
    .unwrap();
    // 720 rows: the blank first row, the row with a missed write counter and the
    // truncated copy are skipped (and the truncated copy adds one line to the file).
    assert_eq!(trace.skipped_row_count, 3);
    assert_eq!(trace.samples.len(), 717);
    assert!(close(trace.interval_seconds, 120.0, 0.01));
    // Cross-check one row by hand: SQL01 contributes its _Total, FILE01 the sum of
    // its two disks; LogicalDisk and per-disk SQL01 columns are not added again.
    let text = std::fs::read_to_string(data("perfmon-worked-example.csv")).unwrap();
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(text.as_bytes());
    let header = reader.headers().unwrap().clone();
    let row = reader.records().nth(10).unwrap().unwrap();
    let value = |name: &str| -> f64 {
        let index = header.iter().position(|column| column == name).unwrap();
        row[index].parse().unwrap()
    };
    let expected_reads = value(r"\\SQL01\PhysicalDisk(_Total)\Disk Reads/sec")
        + value(r"\\FILE01\PhysicalDisk(0 C:)\Disk Reads/sec")
        + value(r"\\FILE01\PhysicalDisk(1 F:)\Disk Reads/sec");
    let sample = trace
        .samples
        .iter()
        // Times count from the first usable row (00:02), the blank 00:00 row being skipped.
        .find(|sample| close(sample.time_seconds, 9.0 * 120.0, 1.0))
        .unwrap();
    assert!(close(sample.read_iops, expected_reads, 1e-6));
    assert!(sample.latency_ms.unwrap() > 5.0 && sample.latency_ms.unwrap() < 11.0);
    assert!(
        trace
            .warnings
            .iter()
            .any(|warning| warning.contains("count the same I/O twice"))
    );
    assert!(
        trace
            .skipped_columns
            .iter()
            .any(|column| column.contains("Processor"))
    );
}

#[test]
fn perfmon_quoted_headers_blank_cells_and_disk_selection() {
    let text = concat!(
        "\"(PDH-CSV 4.0) (W. Europe Daylight Time)(-120)\",",
        "\"\\\\H1\\PhysicalDisk(0 C:)\\Disk Reads/sec\",\"\\\\H1\\PhysicalDisk(0 C:)\\Disk Writes/sec\",",
        "\"\\\\H1\\PhysicalDisk(1 D:)\\Disk Reads/sec\",\"\\\\H1\\PhysicalDisk(1 D:)\\Disk Writes/sec\",",
        "\"\\\\H1\\PhysicalDisk(1 D:)\\Avg. Disk sec/Transfer\",\"\\\\H1\\Paging File(_Total)\\% Usage\"\n",
        "\"04/15/2024 10:00:00.000\",\" \",\" \",\" \",\" \",\" \",\"3\"\n",
        "\"04/15/2024 10:00:15.000\",\"10\",\"5\",\"20\",\"15\",\"0.010\",\"3\"\n",
        "\"04/15/2024 10:00:30.000\",\"10\",\"5\",\"20\",\"15\",\" \",\"3\"\n",
        "\"04/15/2024 10:00:45.000\",\"x\",\"5\",\"20\",\"15\",\"0.010\",\"3\"\n",
    );
    let path = Path::new("inline.csv");
    let trace =
        lamina_plan::parse::parse_text(text, TraceFormat::Perfmon, &ParseOptions::default(), path)
            .unwrap();
    assert_eq!(trace.samples.len(), 2);
    assert_eq!(trace.skipped_row_count, 2);
    assert_eq!(trace.disk_count, Some(2));
    assert_eq!(trace.samples[0].read_iops, 30.0);
    assert_eq!(trace.samples[0].write_iops, 20.0);
    // Only disk 1 has latency, so the row's latency is unknown rather than half-known.
    assert_eq!(trace.samples[0].latency_ms, None);
    assert_eq!(trace.samples[1].time_seconds, 15.0);
    assert_eq!(
        trace.skipped_columns,
        vec![r"\\H1\Paging File(_Total)\% Usage"]
    );
    let only_d = ParseOptions {
        devices: vec!["1 D:".to_string()],
        ..ParseOptions::default()
    };
    let trace = lamina_plan::parse::parse_text(text, TraceFormat::Perfmon, &only_d, path).unwrap();
    assert_eq!(trace.samples[0].read_iops, 20.0);
    assert_eq!(trace.samples[0].latency_ms, Some(10.0));
}

#[test]
fn iostat_current_sysstat_with_timestamps() {
    let trace = parse_file(&data("iostat-x-t.txt"), None, &ParseOptions::default()).unwrap();
    assert_eq!(trace.format, TraceFormat::Iostat);
    // Four reports: the since-boot one is dropped and the one with a cut-short sdb row
    // is left out whole, so two samples remain, a minute and two minutes after 10:00.
    assert_eq!(trace.samples.len(), 2);
    assert_eq!(trace.samples[1].time_seconds, 120.0);
    assert_eq!(trace.start_label.as_deref(), Some("04/15/2024 10:00:00 AM"));
    assert_eq!(trace.disk_count, Some(3));
    let sample = &trace.samples[0];
    // sda + sdb + nvme0n1; partitions and dm-0 are not added again.
    assert_eq!(sample.read_iops, 450.0);
    assert_eq!(sample.write_iops, 90.0);
    assert_eq!(sample.read_bytes_per_second, Some(450.0 * 8.0 * 1024.0));
    assert_eq!(sample.write_bytes_per_second, Some(90.0 * 16.0 * 1024.0));
    assert!(close(sample.latency_ms.unwrap(), 833.0 / 540.0, 1e-9));
    assert!(close(sample.queue_depth.unwrap(), 1.0, 1e-9));
    assert_eq!(trace.skipped_row_count, 2);
    assert!(
        trace
            .warnings
            .iter()
            .any(|warning| warning.contains("since boot"))
    );
    assert!(
        trace
            .warnings
            .iter()
            .any(|warning| warning.contains("md or device-mapper"))
    );
    // Choosing the device-mapper device instead gives its own figures.
    let dm = ParseOptions {
        devices: vec!["dm-0".to_string()],
        ..ParseOptions::default()
    };
    let trace = parse_file(&data("iostat-x-t.txt"), None, &dm).unwrap();
    assert_eq!(trace.samples.len(), 3);
    assert_eq!(trace.samples[0].read_iops, 150.0);
}

#[test]
fn iostat_old_sysstat_without_timestamps_and_with_comma_decimals() {
    let options = ParseOptions {
        interval_seconds: Some(30.0),
        ..ParseOptions::default()
    };
    let trace = parse_file(&data("iostat-old-no-timestamps.txt"), None, &options).unwrap();
    assert_eq!(trace.samples.len(), 2);
    assert_eq!(trace.interval_seconds, 30.0);
    let sample = &trace.samples[0];
    assert_eq!(sample.read_iops, 200.0);
    assert_eq!(sample.write_iops, 50.0);
    assert_eq!(sample.read_bytes_per_second, Some(1600.0 * 1024.0));
    assert!(close(sample.latency_ms.unwrap(), 6.0, 1e-9));
    assert_eq!(sample.queue_depth, Some(1.5));
    assert!(
        trace
            .warnings
            .iter()
            .any(|warning| warning.contains("no timestamps"))
    );
    assert!(trace.skipped_columns.contains(&"svctm".to_string()));
}

#[test]
fn plain_csv_skips_bad_rows_and_unknown_columns_with_warnings() {
    let trace = parse_file(
        &data("plain-with-bad-rows.csv"),
        None,
        &ParseOptions::default(),
    )
    .unwrap();
    assert_eq!(trace.format, TraceFormat::Csv);
    assert_eq!(trace.samples.len(), 3);
    assert_eq!(trace.skipped_row_count, 5);
    assert_eq!(trace.skipped_columns, vec!["host_note"]);
    assert!(
        trace
            .warnings
            .iter()
            .any(|warning| warning.contains("skipped 5 unusable row(s)"))
    );
    assert!(
        trace
            .warnings
            .iter()
            .any(|warning| warning.contains("host_note"))
    );
    assert_eq!(trace.samples[1].latency_ms, Some(5.0));
    assert_eq!(trace.samples[2].time_seconds, 360.0);
    assert_eq!(trace.samples[2].read_bytes_per_second, None);

    let headerless = parse_file(
        &data("plain-headerless.csv"),
        None,
        &ParseOptions::default(),
    )
    .unwrap();
    assert_eq!(headerless.samples.len(), 3);
    assert_eq!(headerless.samples[2].read_iops, 300.0);
    assert_eq!(headerless.samples[2].latency_ms, None);
    assert!(headerless.warnings.is_empty());
}

#[test]
fn malformed_and_unreadable_input_gives_clear_errors() {
    let missing = parse_file(&data("no-such-file.csv"), None, &ParseOptions::default());
    let error = missing.unwrap_err();
    assert!(matches!(error, PlanError::Read { .. }));
    assert!(error.to_string().contains("no-such-file.csv"));

    let error = parse_file(&data("empty.csv"), None, &ParseOptions::default()).unwrap_err();
    assert!(matches!(error, PlanError::NoSamples { .. }), "{error}");
    assert!(error.to_string().contains("no usable samples"), "{error}");
    let error = parse_file(&data("garbage.bin"), None, &ParseOptions::default()).unwrap_err();
    assert!(matches!(error, PlanError::Format { .. }), "{error}");
    assert!(error.to_string().contains("binary"), "{error}");
    // A text file that is not a trace names what it expected.
    let error = lamina_plan::parse::parse_text(
        "name,age\nalice,30\n",
        TraceFormat::Csv,
        &ParseOptions::default(),
        Path::new("people.csv"),
    )
    .unwrap_err();
    assert!(error.to_string().contains("read_iops"), "{error}");
    let error = parse_file(
        &data("perfmon-no-disk-counters.csv"),
        None,
        &ParseOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(error, PlanError::Format { .. }));
    assert!(error.to_string().contains("Disk Reads/sec"), "{error}");
    // A plain CSV read as iostat is refused, not misread.
    let error = parse_file(
        &data("plain-headerless.csv"),
        Some(TraceFormat::Iostat),
        &ParseOptions::default(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("Device"), "{error}");
}

#[test]
fn saturation_in_the_trace_is_flagged() {
    let mut text = String::from(
        "timestamp,read_iops,write_iops,read_bytes_per_sec,write_bytes_per_sec,latency_ms,queue_depth\n",
    );
    for minute in 0..120 {
        text.push_str(&format!("{},800,200,3276800,819200,45,24\n", minute * 60));
    }
    let trace = lamina_plan::parse::parse_text(
        &text,
        TraceFormat::Csv,
        &ParseOptions::default(),
        Path::new("saturated.csv"),
    )
    .unwrap();
    let mut settings = settings("raid10", "hdd-15k");
    let report = plan("saturated.csv", &trace, None, &settings);
    let saturation = &report.analysis.saturation;
    assert!(saturation.saturated);
    assert_eq!(saturation.busy_latency_p90_ms, Some(45.0));
    assert!(
        report
            .warnings
            .iter()
            .any(|warning| warning.contains("understates"))
    );
    assert!(render_text(&report).contains("SATURATED"));
    // With the drive count, the queue tells the same story: 24 over 8 drives is 3 each.
    settings.analysis.current_drive_count = Some(8);
    let report = plan("saturated.csv", &trace, None, &settings);
    assert_eq!(
        report.analysis.saturation.busy_queue_per_disk_p90,
        Some(3.0)
    );
    assert_eq!(
        report
            .analysis
            .saturation
            .warnings
            .iter()
            .filter(|warning| warning.contains("saturated"))
            .count(),
        2
    );
}

#[test]
fn lamina_raid6_writes_cost_full_stripes_only() {
    let trace = parse_file(
        &data("synthetic-idle-spike-busy.csv"),
        None,
        &ParseOptions::default(),
    )
    .unwrap();
    let classic = plan("x", &trace, None, &settings("raid6", "hdd-7k"));
    let lamina = plan("x", &trace, None, &settings("lamina-raid6:8", "hdd-7k"));
    let steady = lamina.analysis.steady_state_iops;
    let writes = steady * lamina.analysis.write_fraction;
    assert!(close(
        lamina.sizing.backend_iops,
        steady - writes + writes * 1.25,
        1e-6
    ));
    assert!(close(
        classic.sizing.backend_iops,
        steady - writes + writes * 6.0,
        1e-6
    ));
    assert!(lamina.sizing.working_drives < classic.sizing.working_drives);
    assert!(
        lamina.sizing.working_drives >= 10,
        "8 data + 2 parity at least"
    );
    assert!(render_text(&lamina).contains("write penalty 1.250"));
}

#[test]
fn working_set_and_flash_come_from_an_address_trace_when_given() {
    // A hot 1,000-block region read over and over, plus a cold scan of 9,000 blocks.
    let mut text = String::from("timestamp,offset_bytes,length_bytes,operation\n");
    let mut time = 0.0;
    for round in 0..20 {
        for block in 0..1000u64 {
            text.push_str(&format!("{time},{},4096,R\n", block * 4096));
            time += 0.01;
        }
        for block in 0..450u64 {
            let cold = 1000 + round * 450 + block;
            text.push_str(&format!("{time},{},4096,R\n", cold * 4096));
            time += 0.01;
        }
    }
    let address_trace = addresses::parse_text(&text);
    assert_eq!(address_trace.accesses.len(), 29_000);
    let trace = parse_file(
        &data("synthetic-idle-spike-busy.csv"),
        None,
        &ParseOptions::default(),
    )
    .unwrap();
    let mut settings = settings("raid5", "hdd-15k");
    settings.flash.target_hit_ratio = 0.6;
    let report = plan("x", &trace, Some(&address_trace), &settings);
    let flash = &report.flash;
    // 10,000 distinct blocks, all within the first hour.
    assert_eq!(flash.working_set_bytes, 10_000.0 * 4096.0);
    // 19 of 20 hot rounds hit once the 1,000 hot blocks plus the 450 cold ones read
    // between their uses fit: 19,000 hits of 29,000 reads is 65.5%.
    assert!(flash.model.contains("LRU"));
    assert_eq!(flash.flash_bytes, 1450.0 * 4096.0);
    assert!(flash.read_hit_ratio >= 0.6);
    // A target above what the trace can reach is capped, with a warning.
    settings.flash.target_hit_ratio = 0.9;
    let report = plan("x", &trace, Some(&address_trace), &settings);
    assert!(close(
        report.flash.read_hit_ratio,
        19_000.0 / 29_000.0,
        1e-9
    ));
    assert!(
        report
            .warnings
            .iter()
            .any(|warning| warning.contains("at most"))
    );
}

#[test]
fn flash_estimate_without_addresses_states_its_assumption() {
    let trace = parse_file(
        &data("synthetic-idle-spike-busy.csv"),
        None,
        &ParseOptions::default(),
    )
    .unwrap();
    let mut settings = settings("raid5", "hdd-15k");
    let report = plan("x", &trace, None, &settings);
    let steady_bytes_per_hour =
        report.analysis.steady_state_iops * report.analysis.io_size_bytes_used * 3600.0;
    assert!(close(
        report.flash.working_set_bytes,
        steady_bytes_per_hour * 0.25,
        1e-6 * steady_bytes_per_hour
    ));
    assert!(render_text(&report).contains("ASSUMED"));
    settings.flash.working_set_bytes = Some(10.0 * GIB);
    settings.flash.target_hit_ratio = 0.8;
    let report = plan("x", &trace, None, &settings);
    // 80/20 skew: 80% of reads hit in the hottest 20% of the working set.
    assert!(close(report.flash.flash_bytes, 2.0 * GIB, 1.0));
    assert!(report.flash.with_flash.backend_read_iops < report.sizing.backend_read_iops);
}

#[test]
fn json_and_svg_renderings_carry_the_figures() {
    let trace = parse_file(
        &data("perfmon-worked-example.csv"),
        None,
        &ParseOptions::default(),
    )
    .unwrap();
    let mut settings = settings("raid5", "hdd-15k");
    settings.proposal_drives = Some(11);
    let report = plan("perfmon-worked-example.csv", &trace, None, &settings);
    let json: serde_json::Value = serde_json::from_str(&render_json(&report)).unwrap();
    assert_eq!(json["sizing"]["drives_after_redundancy"], 21);
    assert_eq!(json["sizing"]["total_drives"], 22);
    assert_eq!(json["redundancy"]["scheme"], "raid5");
    assert_eq!(json["proposal"]["under_sized"], true);
    assert_eq!(json["trace"]["format"], "perfmon");
    assert!(json["analysis"]["steady_state_iops"].as_f64().unwrap() > 2900.0);

    let svg = lamina_plan::plot::render_svg(&trace, &report.analysis).unwrap();
    assert!(svg.starts_with("<svg"));
    assert!(svg.contains("steady state (p90 of busy)"));
    assert!(svg.contains("peak 5857"));
    assert!(svg.contains("mean"));
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("timeline.svg");
    lamina_plan::plot::write_svg(&path, &trace, &report.analysis).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), svg);
}

#[test]
fn command_line_arguments_build_validated_settings() {
    use clap::Parser;
    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        plan: lamina_plan::PlanArgs,
    }
    let command = Command::try_parse_from([
        "plan",
        "--trace",
        "t.csv",
        "--redundancy",
        "lamina-raid6:6",
        "--drive",
        "custom:300@15",
        "--spares",
        "2",
        "--devices",
        "sda,sdb",
    ])
    .unwrap();
    let settings = command.plan.settings().unwrap();
    assert_eq!(
        settings.redundancy,
        Redundancy::LaminaRaid6 {
            data_device_count: 6
        }
    );
    assert_eq!(settings.drive.rated_iops, 300.0);
    assert_eq!(settings.spare_drives, 2);
    assert_eq!(command.plan.devices, vec!["sda", "sdb"]);
    assert!(
        Command::try_parse_from([
            "plan",
            "--trace",
            "t",
            "--redundancy",
            "raid4",
            "--drive",
            "ssd"
        ])
        .is_err()
    );
    let bad = Command::try_parse_from([
        "plan",
        "--trace",
        "t",
        "--redundancy",
        "raid5",
        "--drive",
        "ssd",
        "--target-hit-ratio",
        "1.5",
    ])
    .unwrap();
    let error = bad.plan.settings().unwrap_err();
    assert!(error.to_string().contains("--target-hit-ratio"));
}

#[test]
fn report_walks_through_the_worked_example_step_by_step() {
    // Eight busy hours at exactly 2,500 reads and 500 writes per second, idle otherwise.
    let mut text =
        String::from("timestamp,read_iops,write_iops,read_bytes_per_sec,write_bytes_per_sec\n");
    for minute in 0..24 * 60 {
        let (reads, writes) = if (9 * 60..17 * 60).contains(&minute) {
            (2500, 500)
        } else {
            (40, 8)
        };
        text.push_str(&format!(
            "{},{reads},{writes},{},{}\n",
            minute * 60,
            reads * 8192,
            writes * 8192
        ));
    }
    let trace = lamina_plan::parse::parse_text(
        &text,
        TraceFormat::Csv,
        &ParseOptions::default(),
        Path::new("example.csv"),
    )
    .unwrap();
    let mut settings = settings("raid5", "hdd-15k");
    settings.proposal_drives = Some(11);
    let report = plan("example.csv", &trace, None, &settings);
    assert_eq!(report.analysis.steady_state_iops, 3000.0);
    let text = render_text(&report);
    for expected in [
        "3,000 IOPS = 2,500 reads + 500 writes",
        "RAID5 write penalty 4",
        "back-end = 2,500 + 4 x 500 = 4,500 IOPS (+50%)",
        "hdd-15k at 20 ms",
        "220 IOPS per drive",
        "3,000 / 220 = 13.6 -> 14",
        "4,500 / 220 = 20.5 -> 21",
        "22 drives  (1 spare: 22, 2 spares: 23)",
        "UNDER-SIZED: the steady state needs 21 working drives; 11 is 10 short.",
        "each drive would carry 409 back-end IOPS",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
}

#[test]
fn sections_and_steps_number_themselves_in_order() {
    let trace = parse_file(
        &data("synthetic-idle-spike-busy.csv"),
        None,
        &ParseOptions::default(),
    )
    .unwrap();
    let numbers = |text: &str, prefix: &str| -> Vec<String> {
        text.lines()
            .filter_map(|line| line.strip_prefix(prefix))
            .filter_map(|rest| rest.split_once(|c: char| !c.is_ascii_digit()))
            .filter(|(number, _)| !number.is_empty())
            .map(|(number, _)| number.to_string())
            .collect()
    };
    let mut settings = settings("raid5", "hdd-15k");
    let without = render_text(&plan("trace.csv", &trace, None, &settings));
    assert_eq!(numbers(&without, ""), ["1", "2", "3", "4", "5"]);
    assert!(!without.contains("Proposal"));
    settings.proposal_drives = Some(3);
    let with = render_text(&plan("trace.csv", &trace, None, &settings));
    assert_eq!(numbers(&with, ""), ["1", "2", "3", "4", "5", "6"]);
    assert!(with.contains("\n6. Proposal: 3 working drives\n"));
    assert_eq!(
        numbers(&with, "  step "),
        ["1", "2", "3", "4", "5", "6", "7"]
    );
}

/// A small deterministic generator, so the mutation test is the same on every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[test]
fn mutated_traces_never_crash_the_parsers_or_the_planner() {
    let mut random = Lcg(0x1a31a);
    let fixtures = [
        ("iostat-x-t.txt", TraceFormat::Iostat),
        ("iostat-old-no-timestamps.txt", TraceFormat::Iostat),
        ("plain-with-bad-rows.csv", TraceFormat::Csv),
        ("plain-headerless.csv", TraceFormat::Csv),
    ];
    // The perfmon fixture is large; its first 40 lines keep the test fast.
    let perfmon: String = std::fs::read_to_string(data("perfmon-worked-example.csv"))
        .unwrap()
        .split_inclusive('\n')
        .take(40)
        .collect();
    let mut inputs: Vec<(Vec<u8>, TraceFormat)> = fixtures
        .iter()
        .map(|(name, format)| (std::fs::read(data(name)).unwrap(), *format))
        .collect();
    inputs.push((perfmon.into_bytes(), TraceFormat::Perfmon));
    const MUTATIONS_PER_INPUT: usize = 150;
    let mut parsed_count = 0;
    for (original, format) in &inputs {
        for _ in 0..MUTATIONS_PER_INPUT {
            let mut bytes = original.clone();
            match random.next() % 4 {
                0 => bytes.truncate(random.next() as usize % bytes.len()),
                1 => {
                    for _ in 0..8 {
                        let index = random.next() as usize % bytes.len();
                        bytes[index] = b",\n\" 0.-9e:/\\"[random.next() as usize % 12];
                    }
                }
                2 => {
                    let index = random.next() as usize % bytes.len();
                    let length = (random.next() as usize % 200).min(bytes.len() - index);
                    bytes.drain(index..index + length);
                }
                _ => {
                    let index = random.next() as usize % bytes.len();
                    let text: &[u8] = match random.next() % 3 {
                        0 => b"1e308,",
                        1 => b"\n\n",
                        _ => b"-0,NaN,inf",
                    };
                    bytes.splice(index..index, text.iter().copied());
                }
            }
            let text = lamina_plan::parse::decode(&bytes);
            let options = ParseOptions::default();
            if let Ok(trace) =
                lamina_plan::parse::parse_text(&text, *format, &options, Path::new("mutated"))
            {
                parsed_count += 1;
                assert!(!trace.samples.is_empty());
                let report = plan("mutated", &trace, None, &settings("raid6", "hdd-7k"));
                assert!(report.analysis.steady_state_iops.is_finite());
                let _ = render_text(&report);
                let _ = render_json(&report);
            }
        }
    }
    // Most mutations leave a usable trace; the planner ran on them.
    assert!(parsed_count > MUTATIONS_PER_INPUT, "{parsed_count}");
}

#[test]
fn reduction_ratio_divides_capacity_and_flash_and_is_checked() {
    use clap::Parser;
    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        plan: lamina_plan::PlanArgs,
    }
    let arguments = |extra: &[&str]| {
        let mut all = vec![
            "plan",
            "--trace",
            "t.csv",
            "--redundancy",
            "raid6",
            "--drive",
            "ssd",
        ];
        all.extend_from_slice(extra);
        Command::try_parse_from(all).unwrap().plan
    };
    let settings = arguments(&["--reduction", "2.5", "--capacity-gib", "100"])
        .settings()
        .unwrap();
    let trace = parse_file(
        &data("synthetic-idle-spike-busy.csv"),
        None,
        &ParseOptions::default(),
    )
    .unwrap();
    let report = plan("x", &trace, None, &settings);
    let capacity = report.capacity.as_ref().expect("a capacity section");
    assert!(close(capacity.physical_bytes.unwrap(), 40.0 * GIB, 1.0));
    assert!(close(
        capacity.flash_physical_bytes,
        report.flash.flash_bytes / 2.5,
        1.0
    ));
    let text = render_text(&report);
    assert!(
        text.contains("Capacity after data reduction (2.50 : 1)"),
        "{text}"
    );
    assert!(
        text.contains("100.0 GiB as written -> 40.0 GiB stored"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&render_json(&report)).unwrap();
    assert_eq!(json["capacity"]["reduction_ratio"], 2.5);

    let without = plan("x", &trace, None, &arguments(&[]).settings().unwrap());
    assert!(without.capacity.is_none());
    assert!(!render_text(&without).contains("data reduction"));

    for bad in ["0", "-2", "21", "NaN"] {
        let option = format!("--reduction={bad}");
        let error = arguments(&[&option]).settings().unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("--reduction") && message.contains("at most 20"),
            "{bad}: {message}"
        );
    }
}
