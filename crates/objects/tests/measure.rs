//! Measurements for decisions 0031 and 0037, not timed tests (ignored by
//! default; run with `cargo test --release -p lamina-objects --test measure
//! -- --ignored --nocapture`): PUT and GET latency against a local SeaweedFS
//! for 64 KiB, 1 MiB and 4 MiB objects and a 4 KiB ranged GET, the requests
//! per GiB written with 4 MiB segments flushed every 8 MiB, and PUT
//! throughput and latency for 1 to 64 MiB objects at the device's
//! concurrency.

// Sizes in tests are small constants: `as` between them is exact.
#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;

use lamina_device::{AlignedBuffer, BlockDevice};
use lamina_objects::test_support::SeaweedServer;
use lamina_objects::{
    ObjectStoreConfig, ObjectStoreDevice, ObjectStoreLimits, RequestStatistics, TierGeometry,
};

const MIB: u64 = 1 << 20;

fn line(label: &str, statistics: &RequestStatistics) {
    println!(
        "{label:<28} count {:>5}  p50 {:>7} us  p99 {:>7} us  max {:>7} us",
        statistics.count,
        statistics.latency_p50_us,
        statistics.latency_p99_us,
        statistics.latency_max_us
    );
}

fn filled(length: usize, seed: u8) -> Arc<AlignedBuffer> {
    let mut buffer = AlignedBuffer::zeroed(length);
    for (index, byte) in buffer.iter_mut().enumerate() {
        *byte = seed ^ (index % 251) as u8;
    }
    Arc::new(buffer)
}

/// `count` objects of `object_bytes` each: one PUT each (a write and a
/// flush), then one whole-object GET each, then (if asked) 4 KiB ranged GETs.
async fn object_latencies(config: &ObjectStoreConfig, object_bytes: u64, count: u64, ranged: bool) {
    let size = (count * object_bytes).next_multiple_of(4 * MIB);
    let device = ObjectStoreDevice::create(config, TierGeometry::new(size, 4 * MIB, 0))
        .await
        .unwrap();
    for index in 0..count {
        device
            .write(
                index * object_bytes,
                filled(object_bytes as usize, index as u8),
            )
            .await
            .unwrap();
        device.flush().await.unwrap();
    }
    drop(device);
    let device = ObjectStoreDevice::open(config).await.unwrap();
    for index in 0..count {
        device
            .read(index * object_bytes, object_bytes as usize)
            .await
            .unwrap();
    }
    let statistics = device.statistics();
    let size_label = format!("{} KiB", object_bytes / 1024);
    let puts_device = ObjectStoreDevice::open(config).await.unwrap();
    drop(puts_device);
    line(&format!("GET {size_label} (whole part)"), &statistics.get);
    if ranged {
        let device = ObjectStoreDevice::open(config).await.unwrap();
        for index in 0..count * 8 {
            let offset =
                (index % count) * object_bytes + (index * 37 % (object_bytes / 4096)) * 4096;
            device.read(offset, 4096).await.unwrap();
        }
        line(
            &format!("GET 4 KiB of {size_label}"),
            &device.statistics().get,
        );
    }
}

async fn put_latencies(config: &ObjectStoreConfig, object_bytes: u64, count: u64) {
    let size = (count * object_bytes).next_multiple_of(4 * MIB);
    let device = ObjectStoreDevice::create(config, TierGeometry::new(size, 4 * MIB, 0))
        .await
        .unwrap();
    for index in 0..count {
        device
            .write(
                index * object_bytes,
                filled(object_bytes as usize, index as u8),
            )
            .await
            .unwrap();
        device.flush().await.unwrap();
    }
    line(
        &format!("PUT {} KiB", object_bytes / 1024),
        &device.statistics().put,
    );
}

#[tokio::test]
#[ignore = "a measurement for the decision record, not a test"]
async fn measure_request_latencies_and_requests_per_gib() {
    let Some(server) = SeaweedServer::start_or_skip() else {
        return;
    };
    server.create_bucket("measure").unwrap();
    let limits = ObjectStoreLimits::default();
    for (object_bytes, count, ranged) in [
        (64 * 1024, 200, false),
        (MIB, 100, false),
        (4 * MIB, 50, true),
    ] {
        let put_config = server.config(&format!("s3://measure/put-{object_bytes}"), limits.clone());
        put_latencies(&put_config, object_bytes, count).await;
        object_latencies(
            &server.config(&format!("s3://measure/get-{object_bytes}"), limits.clone()),
            object_bytes,
            count,
            ranged,
        )
        .await;
    }

    // 1 GiB written as the engine writes a capacity tier: 256 KiB batches
    // appended to 4 MiB segments, a flush every 8 MiB, each segment opened
    // before it is written.
    let config = server.config("s3://measure/requests-per-gib", limits);
    let segment_origin_bytes = MIB;
    let size = 1024 * MIB + 2 * segment_origin_bytes;
    let device = ObjectStoreDevice::create(
        &config,
        TierGeometry::new(size, 4 * MIB, segment_origin_bytes),
    )
    .await
    .unwrap();
    let batch = filled(256 * 1024, 1);
    let started = std::time::Instant::now();
    let mut written = 0;
    while written < 1024 * MIB {
        let offset = segment_origin_bytes + written;
        if written % (4 * MIB) == 0 {
            device.open_region(offset, 4 * MIB).await.unwrap();
        }
        device.write(offset, batch.clone()).await.unwrap();
        written += batch.len() as u64;
        if written % (8 * MIB) == 0 {
            device.flush().await.unwrap();
        }
    }
    let elapsed = started.elapsed();
    let statistics = device.statistics();
    println!(
        "1 GiB in 256 KiB writes, 4 MiB segments, flush every 8 MiB: {} PUT (and {} of the label), {} GET, {} DELETE, {} LIST requests; {:.1} s ({:.0} MiB/s)",
        statistics.put.count,
        statistics.label_put.count,
        statistics.get.count,
        statistics.delete.count,
        statistics.list.count,
        elapsed.as_secs_f64(),
        1024.0 / elapsed.as_secs_f64()
    );
    line("PUT 4 MiB (flush of 8 MiB)", &statistics.put);
}

/// One flush of `total_bytes` written as objects of `object_bytes` each (one
/// segment each, so one part each), PUT at the device's concurrency
/// (`requests_in_flight_max`): wall time and PUT latency.
async fn put_object_size(server: &SeaweedServer, name: &str, object_bytes: u64, total_bytes: u64) {
    let limits = ObjectStoreLimits {
        part_bytes_max: object_bytes.max(16 * MIB),
        ..ObjectStoreLimits::default()
    };
    let in_flight = limits.requests_in_flight_max;
    let config = server.config(&format!("s3://measure/{name}"), limits);
    let device =
        ObjectStoreDevice::create(&config, TierGeometry::new(total_bytes, object_bytes, 0))
            .await
            .unwrap();
    let object = filled(object_bytes as usize, 3);
    for offset in (0..total_bytes).step_by(object_bytes as usize) {
        device.write(offset, object.clone()).await.unwrap();
    }
    let started = std::time::Instant::now();
    device.flush().await.unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let statistics = device.statistics();
    let gib = total_bytes as f64 / (1024 * MIB) as f64;
    println!(
        "{:>3} MiB objects: {:>4} PUTs in {:>5.1} s = {:>5.0} MiB/s at up to {} in flight; PUT p50 {:>7} us p99 {:>7} us max {:>7} us; {:.0} PUTs per GiB (+ {} label PUTs per flush)",
        object_bytes / MIB,
        statistics.put.count,
        elapsed,
        (total_bytes / MIB) as f64 / elapsed,
        in_flight.min((total_bytes / object_bytes) as usize),
        statistics.put.latency_p50_us,
        statistics.put.latency_p99_us,
        statistics.put.latency_max_us,
        statistics.put.count as f64 / gib,
        statistics.label_put.count - 1,
    );
}

/// For decision 0037: PUT throughput and latency against object size (1, 4,
/// 16, 64 MiB) at the device's concurrency; run with `cargo test --release
/// -p lamina-objects --test measure measure_put_object_sizes -- --ignored
/// --nocapture`. `LAMINA_MEASURE_GIB` sets the bytes per size (default 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement for the decision record, not a test"]
async fn measure_put_object_sizes() {
    let Some(server) = SeaweedServer::start_or_skip() else {
        return;
    };
    server.create_bucket("measure").unwrap();
    let gib: u64 = std::env::var("LAMINA_MEASURE_GIB")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(1);
    // A first pass, not reported: SeaweedFS grows its volumes.
    put_object_size(&server, "warm-up", 4 * MIB, 256 * MIB).await;
    println!("(the line above warms the server up)");
    for round in 0..2 {
        println!("round {round}");
        for object_bytes in [MIB, 4 * MIB, 16 * MIB, 64 * MIB] {
            let name = format!("size-{object_bytes}-round-{round}");
            put_object_size(&server, &name, object_bytes, gib * 1024 * MIB).await;
        }
    }
}
