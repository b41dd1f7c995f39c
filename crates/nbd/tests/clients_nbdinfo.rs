//! nbdinfo against the in-process server: export listing, allocation map before
//! and after a write, the JSON description (flags and block sizes), and the same
//! over TCP.

mod common;

use common::{TestServer, catalog_with, pattern, run_ok, tool};
use lamina_nbd::{Export, ServerConfig};
use tokio::process::Command;

const MIB: u64 = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_lists_every_export() {
    let Some(nbdinfo) = tool("nbdinfo") else {
        return;
    };
    let (catalog, _exports) = catalog_with(&[("alpha", MIB), ("beta", 2 * MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    let listing = run_ok(Command::new(&nbdinfo).arg("--list").arg(server.uri(""))).await;
    assert!(
        listing.contains("export=\"alpha\"") || listing.contains("alpha"),
        "{listing}"
    );
    assert!(listing.contains("beta"), "{listing}");
    assert!(
        listing.contains("test export beta"),
        "description missing: {listing}"
    );
    assert!(
        listing.contains(&(2 * MIB).to_string()),
        "size missing: {listing}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_map_shows_holes_then_data() {
    let Some(nbdinfo) = tool("nbdinfo") else {
        return;
    };
    let (catalog, exports) = catalog_with(&[("disk", 4 * MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    let fresh = run_ok(Command::new(&nbdinfo).arg("--map").arg(server.uri("disk"))).await;
    let lines: Vec<&str> = fresh.lines().collect();
    assert_eq!(lines.len(), 1, "a fresh export is one hole: {fresh}");
    let fields: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(fields[0], "0");
    assert_eq!(fields[1], (4 * MIB).to_string());
    assert_eq!(fields[2], "3", "hole and zero: {fresh}");

    exports[0]
        .write(MIB, &pattern(8192, 1), false)
        .await
        .expect("write");
    let written = run_ok(Command::new(&nbdinfo).arg("--map").arg(server.uri("disk"))).await;
    let rows: Vec<Vec<String>> = written
        .lines()
        .map(|line| line.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(rows.len(), 3, "hole, data, hole: {written}");
    assert_eq!(
        rows[0][..3],
        ["0".to_string(), MIB.to_string(), "3".to_string()]
    );
    assert_eq!(
        rows[1][..3],
        [MIB.to_string(), "8192".to_string(), "0".to_string()]
    );
    assert_eq!(rows[2][0], (MIB + 8192).to_string());
    assert_eq!(rows[2][2], "3");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_json_reports_flags_and_block_sizes() {
    let Some(nbdinfo) = tool("nbdinfo") else {
        return;
    };
    let (catalog, _exports) = catalog_with(&[("disk", 3 * MIB)]);
    let read_only =
        std::sync::Arc::new(lamina_nbd::memory::MemoryExport::new(MIB).with_read_only(true));
    catalog.insert("snapshot", "a read-only snapshot", read_only);
    let config = ServerConfig {
        max_request_bytes: 4 * 1024 * 1024,
        ..ServerConfig::default()
    };
    let server = TestServer::unix(catalog, config).await;
    let text = run_ok(Command::new(&nbdinfo).arg("--json").arg(server.uri("disk"))).await;
    let json: serde_json::Value = serde_json::from_str(&text).expect("nbdinfo prints JSON");
    let export = &json["exports"][0];
    assert_eq!(export["export-name"], "disk", "{text}");
    assert_eq!(export["export-size"], 3 * MIB, "{text}");
    assert_eq!(export["description"], "test export disk", "{text}");
    assert_eq!(export["is_read_only"], false, "{text}");
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_fast_zero",
        "can_df",
        "can_cache",
        "can_multi_conn",
    ] {
        assert_eq!(export[flag], true, "{flag} in {text}");
    }
    assert_eq!(export["block_size_minimum"], 1, "{text}");
    assert_eq!(export["block_size_preferred"], 4096, "{text}");
    assert_eq!(export["block_size_maximum"], 4 * 1024 * 1024, "{text}");
    assert_eq!(json["protocol"], "newstyle-fixed", "{text}");
    let contexts = export["contexts"].as_array().expect("contexts listed");
    assert!(
        contexts.iter().any(|context| context == "base:allocation"),
        "{text}"
    );

    let text = run_ok(
        Command::new(&nbdinfo)
            .arg("--json")
            .arg(server.uri("snapshot")),
    )
    .await;
    let json: serde_json::Value = serde_json::from_str(&text).expect("nbdinfo prints JSON");
    assert_eq!(json["exports"][0]["is_read_only"], true, "{text}");
    assert_eq!(json["exports"][0]["can_trim"], false, "{text}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdinfo_over_tcp() {
    let Some(nbdinfo) = tool("nbdinfo") else {
        return;
    };
    let (catalog, exports) = catalog_with(&[("tcpdisk", MIB)]);
    exports[0]
        .write(0, &pattern(4096, 2), false)
        .await
        .expect("write");
    let server = TestServer::tcp(catalog, ServerConfig::default()).await;
    assert!(server.uri("tcpdisk").starts_with("nbd://127.0.0.1:"));
    let size = run_ok(
        Command::new(&nbdinfo)
            .arg("--size")
            .arg(server.uri("tcpdisk")),
    )
    .await;
    assert_eq!(size.trim(), MIB.to_string());
    let map = run_ok(
        Command::new(&nbdinfo)
            .arg("--map")
            .arg(server.uri("tcpdisk")),
    )
    .await;
    assert!(
        map.lines()
            .next()
            .expect("a line")
            .split_whitespace()
            .nth(2)
            == Some("0"),
        "{map}"
    );
    server.stop().await;
}
