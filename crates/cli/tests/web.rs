//! The management web page in a real browser, and the per-volume statistics
//! it and the CLI show: a daemon with a loopback web address serves a pool
//! with a volume under load; headless Chromium loads the page, and the numbers
//! its JavaScript rendered are checked against `pool status --json` and
//! `volume list --json`; a screenshot is decoded and must not be blank; one
//! action goes through the page's own endpoint (refused without the token or
//! the confirmation) and shows in `lamina volume list`. `/metrics`, `volume
//! stats --watch` and `top` are checked against the I/O the test sent.
//! `LAMINA_UPDATE_SCREENSHOT=1` also copies the screenshot to
//! `docs/web-page.png`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{ArrayMembers, Daemon, Setup, lamina_ok, run};

/// How long Chromium may run the page's scripts (virtual time) before it dumps.
const BROWSER_VIRTUAL_TIME_MS: u64 = 5_000;
/// How long a plain HTTP exchange with the page may take.
const HTTP_TIMEOUT_MS: u64 = 10_000;

/// A TCP port free at the time of asking.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn config(port: u16, histograms: bool) -> String {
    format!(
        "[server]\ntcp_address = \"\"\nvolume_latency_histograms = {histograms}\n[pool]\nembedded_size_bytes = {}\ndefault_volume_bytes = {}\n[web]\naddress = \"127.0.0.1:{port}\"\n",
        2u64 << 30,
        256u64 << 20
    )
}

/// A daemon on an embedded pool with a volume `default`.
fn start(setup: &Setup, port: u16, histograms: bool) -> Daemon {
    Daemon::start_on_pool(&setup.data_dir, &config(port, histograms), "default")
}

/// Members of the test arrays.
const MEMBER_COUNT: usize = 4;

/// A RAID 5 pool of four files with a 64 MiB volume `default`.
fn create_array_pool(setup: &Setup) {
    let members = ArrayMembers::new((0..MEMBER_COUNT).map(|index| member(setup, index)), "96M");
    common::create_array_pool(&setup.data_dir, "raid5", &members, &[]);
    lamina_ok(&setup.data_dir, &["volume", "create", "default", "64M"]);
}

fn member(setup: &Setup, index: usize) -> std::path::PathBuf {
    setup.root.join(format!("f{index}.img"))
}

/// A status code and body of one HTTP/1.1 exchange with the web listener.
struct Answer {
    status: u16,
    body: String,
}

fn http(port: u16, request: &str) -> Answer {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(HTTP_TIMEOUT_MS)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    Answer {
        status,
        body: body.to_string(),
    }
}

/// `POST /v1/web/operations` as the page's buttons send it.
fn post_operation(port: u16, host: &str, token: Option<&str>, body: &str) -> Answer {
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    http(
        port,
        &format!(
            "POST /v1/web/operations HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{authorization}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Writes and reads `default` for `seconds` with fio (4 KiB, random).
fn load(daemon: &Daemon, seconds: u32) -> std::process::Child {
    Command::new("fio")
        .args([
            "--name=load",
            "--ioengine=nbd",
            &format!("--uri={}", daemon.uri("default")),
            "--rw=randrw",
            "--bs=4k",
            "--iodepth=4",
            "--size=64m",
            "--time_based",
            &format!("--runtime={seconds}"),
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start fio")
}

/// Runs headless Chromium on `url` with `arguments`; its standard output.
fn chromium(profile: &Path, url: &str, arguments: &[&str]) -> String {
    run(Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            &format!("--user-data-dir={}", profile.display()),
            &format!("--virtual-time-budget={BROWSER_VIRTUAL_TIME_MS}"),
        ])
        .args(arguments)
        .arg(url))
}

/// The value of attribute `attribute` on the element whose opening tag
/// contains `marker` in `dom`.
fn attribute_after(dom: &str, marker: &str, attribute: &str) -> String {
    let start = dom
        .find(marker)
        .unwrap_or_else(|| panic!("no {marker} in the page:\n{dom}"));
    let tag_end = start + dom[start..].find('>').unwrap();
    let tag_start = dom[..start].rfind('<').unwrap();
    let tag = &dom[tag_start..tag_end];
    let key = format!("{attribute}=\"");
    let value_start = tag
        .find(&key)
        .unwrap_or_else(|| panic!("no {attribute} in {tag}"))
        + key.len();
    tag[value_start..value_start + tag[value_start..].find('"').unwrap()].to_string()
}

/// The `data-bytes` of the `td` cell `index` (0-based) of the row `row_marker`.
fn row_cell_bytes(dom: &str, row_marker: &str, index: usize) -> u64 {
    let start = dom
        .find(row_marker)
        .unwrap_or_else(|| panic!("no {row_marker} in the page:\n{dom}"));
    let row = &dom[start..start + dom[start..].find("</tr>").unwrap()];
    let cell = row.split("<td").nth(index + 1).unwrap();
    let key = "data-bytes=\"";
    let value_start = cell
        .find(key)
        .unwrap_or_else(|| panic!("cell {index} of {row_marker} has no bytes: {row}"))
        + key.len();
    cell[value_start..value_start + cell[value_start..].find('"').unwrap()]
        .parse()
        .unwrap()
}

/// Decodes a PNG and counts its distinct colours and the pixels that are not
/// the most common colour (the background).
fn picture_variety(path: &Path) -> (usize, usize, u32, u32) {
    let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buffer = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buffer).unwrap();
    let channels = info.color_type.samples();
    let pixels = &buffer[..info.buffer_size()];
    let mut counts = std::collections::HashMap::new();
    for pixel in pixels.chunks(channels) {
        *counts.entry(pixel.to_vec()).or_insert(0usize) += 1;
    }
    let background = counts.values().copied().max().unwrap_or(0);
    let total = pixels.len() / channels;
    (counts.len(), total - background, info.width, info.height)
}

#[test]
fn the_page_shows_the_pool_in_a_browser_and_acts_with_token_and_confirmation() {
    let setup = Setup::new();
    let port = free_port();
    create_array_pool(&setup);
    let daemon = Daemon::start_on_pool(&setup.data_dir, &config(port, true), "default");
    let mut fio = load(&daemon, 3);
    assert!(fio.wait().unwrap().success(), "fio failed");
    // The sampler has taken per-second samples of the load.
    std::thread::sleep(Duration::from_millis(1500));

    let url = format!("http://127.0.0.1:{port}/");
    let profile = setup.root.join("chromium-profile");
    let dom = chromium(&profile, &url, &["--dump-dom"]);
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page's script did not render:\n{dom}"
    );
    let status = lamina_ok(&setup.data_dir, &["pool", "status"]);
    let capacity: u64 = attribute_after(&dom, "id=\"pool-capacity\"", "data-bytes")
        .parse()
        .unwrap();
    assert_eq!(capacity, status["capacity_bytes"].as_u64().unwrap());
    let flash_size = row_cell_bytes(&dom, "data-tier=\"flash\"", 1);
    assert_eq!(flash_size, status["flash"]["size_bytes"].as_u64().unwrap());
    // The array is whole; the badge warns when `pool status` does (fio's
    // writes fill most of this small pool, past the 90 % warning).
    assert_eq!(status["layout"]["state"], "online");
    let badge = if status["usage_warning_percent"] == 0 {
        "healthy"
    } else {
        "warning"
    };
    assert!(
        dom.contains(&format!("class=\"badge {badge}\"")),
        "{badge}: {dom}"
    );
    assert_devices_shown(&dom, &status);
    let volumes = lamina_ok(&setup.data_dir, &["volume", "list"]);
    let default = volumes
        .as_array()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == "default")
        .unwrap();
    assert_eq!(
        row_cell_bytes(&dom, "data-volume=\"default\"", 1),
        default["size_bytes"].as_u64().unwrap()
    );
    assert_eq!(
        row_cell_bytes(&dom, "data-volume=\"default\"", 2),
        default["allocated_bytes"].as_u64().unwrap()
    );
    assert_eq!(
        row_cell_bytes(&dom, "data-volume=\"default\"", 3),
        default["stored_bytes"].as_u64().unwrap()
    );
    // An uncompressed pool: the ratio 1.00x, with its logical and stored bytes.
    assert!(
        dom.contains("id=\"pool-compress-ratio\" data-ratio=\"1\">1.00x (logical "),
        "{dom}"
    );

    // The screenshot has the page on it, not a blank canvas.
    let screenshot = setup.root.join("page.png");
    chromium(
        &profile,
        &url,
        &[
            &format!("--screenshot={}", screenshot.display()),
            "--window-size=1280,1100",
        ],
    );
    let (colours, foreground, width, height) = picture_variety(&screenshot);
    assert_eq!((width, height), (1280, 1100));
    assert!(colours > 20, "only {colours} colours: a blank page?");
    assert!(
        foreground > (width * height / 50) as usize,
        "only {foreground} pixels differ from the background"
    );
    if std::env::var_os("LAMINA_UPDATE_SCREENSHOT").is_some() {
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/web-page.png");
        std::fs::copy(&screenshot, target).unwrap();
    }

    // The create button's request: refused without the token, then without
    // the confirmation, then done.
    let token = std::fs::read_to_string(setup.data_dir.join("web.token")).unwrap();
    let token = token.trim();
    let host = format!("127.0.0.1:{port}");
    let create =
        r#"{"operation":{"operation":"volume_create","name":"fromweb","size_bytes":16777216}}"#;
    let confirmed = r#"{"confirmed":true,"operation":{"operation":"volume_create","name":"fromweb","size_bytes":16777216}}"#;
    assert_eq!(post_operation(port, &host, None, confirmed).status, 401);
    assert_eq!(
        post_operation(port, &host, Some("wrong"), confirmed).status,
        401
    );
    let unconfirmed = post_operation(port, &host, Some(token), create);
    assert_eq!(unconfirmed.status, 428, "{}", unconfirmed.body);
    // A page on another site that rebinds its name to 127.0.0.1 is refused.
    assert_eq!(
        post_operation(port, "evil.example", Some(token), confirmed).status,
        403
    );
    let done = post_operation(port, &host, Some(token), confirmed);
    assert_eq!(done.status, 200, "{}", done.body);
    let volumes = lamina_ok(&setup.data_dir, &["volume", "list"]);
    let created = volumes
        .as_array()
        .unwrap()
        .iter()
        .find(|volume| volume["name"] == "fromweb")
        .expect("the page's create is in volume list");
    assert_eq!(created["size_bytes"], 16_777_216);
    // Reads need no token on loopback.
    let overview = http(
        port,
        &format!("GET /v1/web/overview HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(overview.status, 200);
    let overview: serde_json::Value = serde_json::from_str(&overview.body).unwrap();
    let samples = overview["history"]
        .as_array()
        .unwrap()
        .iter()
        .find(|history| history["volume"] == "default")
        .unwrap()["samples"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        samples
            .iter()
            .any(|sample| sample["write_iops"].as_f64().unwrap() > 0.0),
        "no second with writes in {samples:?}"
    );
    assert!(daemon.terminate().success());
}

/// `POST /v1/web/operations` on the admin socket; the whole answer.
fn admin_socket_post(data_dir: &Path, body: &str) -> String {
    let mut stream = std::os::unix::net::UnixStream::connect(data_dir.join("admin.sock")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(HTTP_TIMEOUT_MS)))
        .unwrap();
    write!(
        stream,
        "POST /v1/web/operations HTTP/1.1\r\nHost: lamina\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// Every device of `pool status`'s layout is a row of the page with its state.
fn assert_devices_shown(dom: &str, status: &serde_json::Value) {
    let devices = status["layout"]["tiers"][0]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), MEMBER_COUNT);
    for device in devices {
        let path = device["path"].as_str().unwrap();
        let shown = attribute_after(dom, &format!("data-device=\"{path}\""), "data-state");
        assert_eq!(shown, device["state"].as_str().unwrap(), "{path}");
    }
}

#[test]
fn a_degraded_array_shows_degraded_with_its_missing_device() {
    let setup = Setup::new();
    let port = free_port();
    create_array_pool(&setup);
    std::fs::remove_file(member(&setup, 2)).unwrap();
    let daemon = Daemon::start_on_pool(&setup.data_dir, &config(port, true), "default");
    let status = lamina_ok(&setup.data_dir, &["pool", "status"]);
    assert_eq!(status["layout"]["state"], "degraded");
    let profile = setup.root.join("chromium-profile");
    let dom = chromium(
        &profile,
        &format!("http://127.0.0.1:{port}/"),
        &["--dump-dom"],
    );
    assert!(dom.contains("class=\"badge degraded\""), "{dom}");
    assert_devices_shown(&dom, &status);
    assert_eq!(
        attribute_after(
            &dom,
            &format!("data-device=\"{}\"", member(&setup, 2).display()),
            "data-state"
        ),
        "missing"
    );
    // On the admin socket the page needs no token: the socket's gate decides.
    let unconfirmed = admin_socket_post(
        &setup.data_dir,
        r#"{"operation":{"operation":"volume_create","name":"viasocket","size_bytes":16777216}}"#,
    );
    assert!(unconfirmed.starts_with("HTTP/1.1 428"), "{unconfirmed}");
    let done = admin_socket_post(
        &setup.data_dir,
        r#"{"confirmed":true,"operation":{"operation":"volume_create","name":"viasocket","size_bytes":16777216}}"#,
    );
    assert!(done.starts_with("HTTP/1.1 200"), "{done}");
    let volumes = lamina_ok(&setup.data_dir, &["volume", "list"]);
    assert!(
        volumes
            .as_array()
            .unwrap()
            .iter()
            .any(|volume| volume["name"] == "viasocket")
    );
    // The missing device replaced: the page shows the rebuild finished and
    // the array online with the new device.
    let new = setup.root.join("new2.img");
    lamina_ok(
        &setup.data_dir,
        &[
            "device",
            "replace",
            &member(&setup, 2).display().to_string(),
            &format!("{}:96M", new.display()),
            "--wait",
        ],
    );
    let status = lamina_ok(&setup.data_dir, &["pool", "status"]);
    assert_eq!(status["layout"]["state"], "online", "{status}");
    let dom = chromium(
        &profile,
        &format!("http://127.0.0.1:{port}/"),
        &["--dump-dom"],
    );
    assert_eq!(
        attribute_after(&dom, "id=\"rebuild-state\"", "data-rebuild-state"),
        "finished",
        "{dom}"
    );
    assert_devices_shown(&dom, &status);
    assert!(daemon.terminate().success());
}

/// The figure of the series `name{labels}` in Prometheus text.
fn series(metrics: &str, name_and_labels: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name_and_labels)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name_and_labels} in\n{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn metrics_volume_stats_and_top_count_what_a_client_sent() {
    let setup = Setup::new();
    let daemon = start(&setup, free_port(), true);
    let uri = daemon.uri("default");
    // 3 writes of 64 KiB and 2 reads of 4 KiB, each one request.
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write 0 64k",
        "-c",
        "write 64k 64k",
        "-c",
        "write 1M 64k",
        "-c",
        "read 0 4k",
        "-c",
        "read 8k 4k",
        &uri,
    ]));
    let metrics = daemon.metrics();
    let write = "{volume=\"default\",op=\"write\"}";
    let read = "{volume=\"default\",op=\"read\"}";
    assert_eq!(
        series(&metrics, &format!("lamina_volume_requests_total{write}")),
        3.0
    );
    assert_eq!(
        series(&metrics, &format!("lamina_volume_bytes_total{write}")),
        196_608.0
    );
    assert_eq!(
        series(&metrics, &format!("lamina_volume_bytes_total{read}")),
        8192.0
    );
    assert_eq!(
        series(
            &metrics,
            &format!("lamina_volume_request_seconds_count{write}")
        ),
        3.0
    );
    assert_eq!(
        series(
            &metrics,
            "lamina_volume_request_seconds_bucket{volume=\"default\",op=\"read\",le=\"+Inf\"}"
        ),
        2.0
    );
    assert!(
        series(
            &metrics,
            &format!("lamina_volume_request_seconds_sum{write}")
        ) > 0.0
    );
    assert!(metrics.contains("# TYPE lamina_volume_request_seconds histogram"));

    let stats = lamina_ok(&setup.data_dir, &["volume", "stats", "default"]);
    assert_eq!(stats["volume"], "default", "the tier statistics stay");
    assert_eq!(stats["io"]["totals"]["writes"]["requests"], 3);
    assert!(stats["io"]["write_latency_us"]["p99"].as_f64().unwrap() > 0.0);

    let mut fio = load(&daemon, 4);
    std::thread::sleep(Duration::from_millis(500));
    let output = common::lamina(
        &setup.data_dir,
        &[
            "volume",
            "stats",
            "default",
            "--watch",
            "--count",
            "2",
            "--interval-ms",
            "500",
            "--json",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    for line in &lines {
        assert!(line["write_iops"].as_f64().unwrap() > 0.0, "{line}");
        assert!(
            line["read_latency_us"]["p99_9"].as_f64().unwrap() > 0.0,
            "{line}"
        );
    }
    let created = lamina_ok(&setup.data_dir, &["volume", "create", "idle", "16M"]);
    assert_eq!(created["name"], "idle");
    let output = common::lamina(
        &setup.data_dir,
        &["top", "--count", "1", "--interval-ms", "500", "--json"],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rows: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(rows[0]["volume"], "default", "the busiest first: {rows}");
    assert!(rows[0]["read_iops"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[1]["volume"], "idle");
    assert_eq!(rows[1]["read_iops"], 0.0);
    let text = common::lamina(
        &setup.data_dir,
        &["top", "--count", "1", "--interval-ms", "200"],
    );
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("default") && text.contains("read µs p50/p99/p99.9"),
        "{text}"
    );
    assert!(fio.wait().unwrap().success());
    assert!(daemon.terminate().success());
}

#[test]
fn without_histograms_requests_are_counted_and_no_histogram_is_exported() {
    let setup = Setup::new();
    let daemon = start(&setup, free_port(), false);
    run(Command::new("qemu-io").args(["-f", "raw", "-c", "write 0 4k", &daemon.uri("default")]));
    let metrics = daemon.metrics();
    assert_eq!(
        series(
            &metrics,
            "lamina_volume_requests_total{volume=\"default\",op=\"write\"}"
        ),
        1.0
    );
    assert!(
        !metrics.contains("lamina_volume_request_seconds"),
        "{metrics}"
    );
    assert!(daemon.terminate().success());
}

/// `GET /v1/web/overview` on the loopback web listener, parsed.
fn overview(port: u16) -> serde_json::Value {
    let answer = http(
        port,
        &format!(
            "GET /v1/web/overview HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
        ),
    );
    assert_eq!(answer.status, 200, "{}", answer.body);
    serde_json::from_str(&answer.body).unwrap()
}

/// The usage warning threshold of the badge test, in percent of what
/// clients can fill.
const TEST_USAGE_WARNING_PERCENT: u64 = 10;
/// How long the badge test waits for the written data to count as used.
const USAGE_UPDATE_TIMEOUT_MS: u64 = 10_000;

#[test]
fn the_badge_warns_as_pool_status_does_once_usage_passes_a_threshold() {
    let setup = Setup::new();
    let port = free_port();
    let config = format!(
        "[server]\ntcp_address = \"\"\n[pool]\nembedded_size_bytes = {}\ndefault_volume_bytes = {}\n[web]\naddress = \"127.0.0.1:{port}\"\n[limits]\nflush_interval_ms = 100\nusage_warning_percents = [{TEST_USAGE_WARNING_PERCENT}]\n",
        256u64 << 20,
        128u64 << 20
    );
    let daemon = Daemon::start_on_pool(&setup.data_dir, &config, "default");
    let healthy = overview(port);
    assert_eq!(
        healthy["health"]["state"], "healthy",
        "{}",
        healthy["health"]
    );
    assert_eq!(healthy["health"]["reasons"], serde_json::json!([]));

    // Past the threshold (the pool holds about 200 MiB for clients).
    run(Command::new("qemu-io").args([
        "-f",
        "raw",
        "-c",
        "write -P 0x5a 0 64M",
        "-c",
        "flush",
        &daemon.uri("default"),
    ]));
    let deadline = std::time::Instant::now() + Duration::from_millis(USAGE_UPDATE_TIMEOUT_MS);
    let mut warned = overview(port);
    while warned["pool"]["usage_warning_percent"] == 0 {
        assert!(std::time::Instant::now() < deadline, "{}", warned["pool"]);
        std::thread::sleep(Duration::from_millis(100));
        warned = overview(port);
    }
    let health = &warned["health"];
    assert_eq!(health["state"], "warning", "{health}");
    let reason = health["reasons"][0]["text"].as_str().unwrap();
    assert!(
        reason.contains(&format!("above the {TEST_USAGE_WARNING_PERCENT}% warning")),
        "{reason}"
    );
    // `pool status` warns about the same.
    let status = common::lamina(&setup.data_dir, &["pool", "status"]);
    let status = String::from_utf8(status.stdout).unwrap();
    assert!(
        status.contains(&format!("warning: above {TEST_USAGE_WARNING_PERCENT}%")),
        "{status}"
    );
    // And the page shows it.
    let dom = chromium(
        &setup.root.join("chromium-profile"),
        &format!("http://127.0.0.1:{port}/"),
        &["--dump-dom"],
    );
    assert!(dom.contains("class=\"badge warning\""), "{dom}");
    assert!(
        dom.contains("% warning: trim, delete or add capacity"),
        "{dom}"
    );
    assert!(daemon.terminate().success());
}
