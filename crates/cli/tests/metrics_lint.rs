//! `/metrics` passes Prometheus's own lint: a daemon on a raid5 array pool
//! (one device's path holding a double quote and a backslash, so that label
//! escaping is exercised) serves a volume that is written, read and scrubbed,
//! with changing admin operations done through it; its `/metrics` then has
//! every kind of labelled series (per volume, per device, per tier, the
//! request histogram, the admin operations), and `promtool check metrics`
//! (Debian's `prometheus` package, which `scripts/test` installs) must find
//! no problem in it: each series typed and named as the format wants
//! (counters end in `_total`, gauges do not, base units), HELP on every
//! family, the text parseable.

use std::process::Command;

mod common;

use common::{ArrayMembers, Daemon, Setup, create_array_pool, lamina_ok, run};

/// No TCP; no memory cache, so that reads reach the devices.
const CONFIG: &str = "[server]\ntcp_address = \"\"\nvolume_latency_histograms = true\n[limits]\nmemory_cache_bytes = 0\nflush_interval_ms = 200\n";
const MEMBER_SIZE: &str = "96M";

#[test]
fn metrics_of_a_busy_array_pool_pass_promtool() {
    let setup = Setup::new();
    let data_dir = &setup.data_dir;
    let members = ArrayMembers::new(
        ["f0.img", "f\"1\\.img", "f2.img"].map(|name| setup.root.join(name)),
        MEMBER_SIZE,
    );
    create_array_pool(data_dir, "raid5", &members, &[]);
    lamina_ok(data_dir, &["volume", "create", "v", "16M"]);
    let daemon = Daemon::start_on_pool(data_dir, CONFIG, "v");

    let source = setup.root.join("source.img");
    common::pattern_file(&source, 16 << 20, 7);
    common::write_file(&daemon, "v", &source);
    common::assert_same(&daemon, "v", &source);
    lamina_ok(data_dir, &["volume", "create", "w", "8M"]);
    lamina_ok(data_dir, &["snapshot", "create", "v@one"]);
    assert!(
        !common::lamina(data_dir, &["volume", "create", "w", "8M"])
            .status
            .success()
    );
    lamina_ok(data_dir, &["pool", "scrub", "--wait"]);
    run(Command::new("nbdinfo").arg("--size").arg(daemon.uri("w")));

    let text = daemon.metrics();
    for series in [
        "lamina_volume_requests_total{volume=\"v\",op=\"write\"}",
        "lamina_volume_request_seconds_bucket{volume=\"v\",op=\"read\",le=\"+Inf\"}",
        "lamina_volume_allocated_bytes{volume=\"v\"}",
        "lamina_volume_read_blocks_total{volume=\"v\",tier=\"flash\"}",
        "lamina_tier_size_bytes{tier=\"flash\"}",
        "lamina_device_read_bytes_total{tier=\"flash\",index=\"1\",path=",
        "f\\\"1\\\\.img\"",
        "lamina_admin_operations_total{operation=\"volume_create\",outcome=\"error\"}",
        "lamina_background_granted_bytes_total{work=",
        "# TYPE lamina_client_space_waits_total counter",
        "# TYPE lamina_cleaner_relocated_blocks_total counter",
    ] {
        assert!(text.contains(series), "no {series} in /metrics:\n{text}");
    }
    common::promtool::assert_lints_clean(&text);
    assert!(daemon.terminate().success());
}
