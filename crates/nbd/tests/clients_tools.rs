//! Whole-image tools against the in-process server: qemu-img convert, compare and
//! map, qemu-io, nbdcopy (checked by SHA-256) and fio's nbd engine with four
//! connections and crc32c verification.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use std::path::Path;

use std::sync::Arc;

use common::{Security, TestServer, catalog_with, pattern, run, run_ok, tool};
use lamina_nbd::{ConnectionThreadOptions, ConnectionThreads, ServerConfig};
use sha2::{Digest, Sha256};
use tokio::process::Command;

const MIB: u64 = 1024 * 1024;

/// A 16 MiB image: patterned data with an all-zero gap and a short tail of data.
fn write_image(path: &Path) -> Vec<u8> {
    let mut image = vec![0u8; 16 * MIB as usize];
    image[..3 * MIB as usize].copy_from_slice(&pattern(3 * MIB as usize, 11));
    let tail = 12 * MIB as usize + 4096 + 17;
    image[tail..tail + 70_000].copy_from_slice(&pattern(70_000, 12));
    std::fs::write(path, &image).expect("write image");
    image
}

fn sha256(data: &[u8]) -> String {
    format!("{:x}", Sha256::digest(data))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_img_convert_compare_and_map() {
    let Some(qemu_img) = tool("qemu-img") else {
        return;
    };
    let (catalog, exports) = catalog_with(&[("disk", 16 * MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    let source = server.directory.path().join("source.img");
    let image = write_image(&source);
    let uri = server.uri("disk");
    run_ok(
        Command::new(&qemu_img)
            .args(["convert", "-n", "-f", "raw", "-O", "raw"])
            .arg(&source)
            .arg(&uri),
    )
    .await;
    assert_eq!(sha256(&exports[0].contents()), sha256(&image));
    run_ok(
        Command::new(&qemu_img)
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&source)
            .arg(&uri),
    )
    .await;
    // qemu-img skips zero runs, so the gap must still be a hole on the server.
    let map = run_ok(
        Command::new(&qemu_img)
            .args(["map", "--output=json", "-f", "raw"])
            .arg(&uri),
    )
    .await;
    let entries: serde_json::Value = serde_json::from_str(&map).expect("qemu-img map JSON");
    let gap = entries
        .as_array()
        .expect("a list")
        .iter()
        .find(|entry| entry["start"].as_u64() == Some(3 * MIB))
        .unwrap_or_else(|| panic!("an extent starts at 3 MiB: {map}"));
    assert_eq!(gap["data"], false, "{map}");
    assert_eq!(gap["zero"], true, "{map}");
    // Back out to a file, bit for bit.
    let copy = server.directory.path().join("copy.img");
    run_ok(
        Command::new(&qemu_img)
            .args(["convert", "-f", "raw", "-O", "raw"])
            .arg(&uri)
            .arg(&copy),
    )
    .await;
    assert_eq!(
        sha256(&std::fs::read(&copy).expect("read copy")),
        sha256(&image)
    );
    // A changed byte is noticed by compare.
    exports[0].set_failing(false);
    lamina_nbd::Export::write(exports[0].as_ref(), 5 * MIB, b"!", false)
        .await
        .expect("write");
    let output = run(Command::new(&qemu_img)
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&source)
        .arg(&uri))
    .await;
    assert_eq!(output.status.code(), Some(1), "compare sees the difference");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn qemu_io_commands() {
    let Some(qemu_io) = tool("qemu-io") else {
        return;
    };
    let (catalog, exports) = catalog_with(&[("disk", 8 * MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    let commands = [
        "write -P 0xab 0 1M",
        "write -P 0xcd -f 1M 64k",
        "read -P 0xab 0 1M",
        "read -P 0xcd 1M 64k",
        "write -z 512k 128k",
        "read -P 0 512k 128k",
        "discard 0 64k",
        "read -P 0 0 64k",
        "read -P 0 2M 1M",
        "flush",
    ];
    let mut command = Command::new(&qemu_io);
    command.args(["-f", "raw"]);
    for line in commands {
        command.arg("-c").arg(line);
    }
    command.arg(server.uri("disk"));
    let output = run_ok(&mut command).await;
    assert!(
        !output.contains("failed") && !output.contains("error"),
        "{output}"
    );
    assert_eq!(output.matches("read ").count(), 5, "{output}");
    let counts = exports[0].operation_counts();
    assert!(counts.fua_writes >= 1, "write -f used FUA: {counts:?}");
    assert!(
        counts.trims >= 1 && counts.write_zeroes >= 1 && counts.flushes >= 1,
        "{counts:?}"
    );
    let contents = exports[0].contents();
    assert!(contents[65536..524288].iter().all(|&byte| byte == 0xab));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nbdcopy_round_trip() {
    let Some(nbdcopy) = tool("nbdcopy") else {
        return;
    };
    let (catalog, exports) = catalog_with(&[("disk", 16 * MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    let source = server.directory.path().join("source.img");
    let image = write_image(&source);
    let uri = server.uri("disk");
    run_ok(
        Command::new(&nbdcopy)
            .args(["--connections=4", "--requests=16"])
            .arg(&source)
            .arg(&uri),
    )
    .await;
    assert_eq!(sha256(&exports[0].contents()), sha256(&image));
    let copy = server.directory.path().join("copy.img");
    run_ok(
        Command::new(&nbdcopy)
            .args(["--connections=4", "--requests=16"])
            .arg(&uri)
            .arg(&copy),
    )
    .await;
    assert_eq!(
        sha256(&std::fs::read(&copy).expect("read copy")),
        sha256(&image)
    );
    // nbdcopy writes zeros as holes: the gap never became data.
    assert!(exports[0].allocated_block_count() < (5 * MIB / 4096) as usize);
    server.stop().await;
}

/// Four fio jobs (four connections) of verified random reads and writes on
/// export `disk` of `server`; fails the test on any error or bad block.
async fn fio_four_connections_verified(fio: &Path, server: &TestServer) {
    let output = run_ok(
        Command::new(fio)
            .args([
                "--name=lamina-nbd",
                "--ioengine=nbd",
                "--rw=randrw",
                "--bs=4k",
                "--size=8m",
                "--offset_increment=16m",
                "--numjobs=4",
                "--iodepth=16",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--group_reporting",
                "--verify_state_save=0",
            ])
            // fio may still drop files in its working directory; keep them in the temporary one.
            .current_dir(server.directory.path())
            .arg(format!("--uri={}", server.uri("disk"))),
    )
    .await;
    // fio exits non-zero on a verify mismatch (verify_fatal); also check it
    // reports no errors for the group.
    assert!(output.contains("err= 0"), "{output}");
    assert!(!output.contains("verify: bad"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_random_read_write_verified_over_four_connections() {
    let Some(fio) = tool("fio") else { return };
    let (catalog, exports) = catalog_with(&[("disk", 64 * MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    fio_four_connections_verified(&fio, &server).await;
    assert!(exports[0].operation_counts().writes > 0);
    assert!(exports[0].operation_counts().reads > 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fio_over_connection_threads_is_spread_and_verified() {
    // Decision 0048: four connections over TCP go two to each connection
    // thread, are served there, and fio's crc32c verification passes.
    let Some(fio) = tool("fio") else { return };
    let (catalog, exports) = catalog_with(&[("disk", 64 * MIB)]);
    let threads =
        Arc::new(ConnectionThreads::start(2, ConnectionThreadOptions::default()).expect("threads"));
    let security = Security {
        threads: Some(threads.clone()),
        ..Security::default()
    };
    let server = TestServer::tcp_with(catalog, ServerConfig::default(), security).await;
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (threads, sampling) = (threads.clone(), sampling.clone());
        tokio::task::spawn_blocking(move || {
            let mut busiest = vec![0; threads.count()];
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                for (most, now) in busiest.iter_mut().zip(threads.connection_counts()) {
                    *most = (*most).max(now);
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            busiest
        })
    };
    fio_four_connections_verified(&fio, &server).await;
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let busiest = sampler.await.expect("sampler");
    assert!(exports[0].operation_counts().writes > 0);
    assert!(
        busiest.iter().all(|most| *most >= 1),
        "connections were not spread over the threads: {busiest:?}"
    );
    server.stop().await;
    assert_eq!(threads.connection_counts(), vec![0, 0]);
}
