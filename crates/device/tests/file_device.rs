//! Tests of the production file device: data written concurrently through io_uring
//! (or the buffered fallback) reads back bit for bit, geometry errors are typed,
//! flushed data survives a reopen, abandoned requests are harmless, the backend
//! is chosen the way the module documentation promises on each kind of filesystem,
//! and a device is open once (through any name) and created owner-only.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use lamina_device::{
    AlignedBuffer, BlockDevice, DEVICE_ALIGNMENT_BYTES, DeviceErrorKind, FileDevice,
    FileDeviceOptions, FilePreallocation, IoBackend,
};
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

const BLOCK_BYTES: u64 = DEVICE_ALIGNMENT_BYTES;

/// Concurrent requests in the round-trip tests: enough to fill a 256-entry ring.
const CONCURRENT_REQUESTS: usize = 256;

fn options_with_size(size_bytes: u64) -> FileDeviceOptions {
    FileDeviceOptions {
        create_size_bytes: Some(size_bytes),
        ..FileDeviceOptions::default()
    }
}

/// The filesystem type name of `path`, for test diagnostics.
fn filesystem_name(path: &Path) -> String {
    let mut best = (0, String::from("unknown"));
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    for line in mounts.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() > 2 && path.starts_with(fields[1]) && fields[1].len() >= best.0 {
            best = (fields[1].len(), fields[2].to_string());
        }
    }
    best.1
}

/// Whether the filesystem of `directory` accepts O_DIRECT, probed independently of
/// the device under test.
fn accepts_direct(directory: &Path) -> bool {
    let probe = directory.join("direct-probe");
    let accepted = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    accepted
}

/// Writes random data of random aligned lengths at random, non-overlapping aligned
/// offsets with `CONCURRENT_REQUESTS` requests in flight, then reads it all back
/// concurrently and compares.
async fn round_trip_concurrently(device: Arc<FileDevice>, seed: u64) {
    let mut random = SmallRng::seed_from_u64(seed);
    let slot_blocks = 16u64;
    let slot_count = device.size_bytes() / (slot_blocks * BLOCK_BYTES);
    assert!(
        slot_count >= CONCURRENT_REQUESTS as u64,
        "device too small for the test"
    );
    // Distinct slots keep the writes from overlapping, so every read has one answer.
    let mut slots: Vec<u64> = (0..slot_count).collect();
    for index in 0..CONCURRENT_REQUESTS {
        let other = random.random_range(index..slots.len());
        slots.swap(index, other);
    }
    let mut expected = Vec::new();
    let mut writes = tokio::task::JoinSet::new();
    for slot in &slots[..CONCURRENT_REQUESTS] {
        let blocks = random.random_range(1..=slot_blocks);
        let offset = slot * slot_blocks * BLOCK_BYTES
            + random.random_range(0..=slot_blocks - blocks) * BLOCK_BYTES;
        let mut data = AlignedBuffer::zeroed((blocks * BLOCK_BYTES) as usize);
        random.fill_bytes(&mut data);
        let data = Arc::new(data);
        expected.push((offset, data.clone()));
        let device = device.clone();
        writes.spawn(async move { device.write(offset, data).await });
    }
    while let Some(result) = writes.join_next().await {
        result.expect("write task").expect("write");
    }
    let mut reads = tokio::task::JoinSet::new();
    for (offset, data) in expected {
        let device = device.clone();
        reads.spawn(async move {
            let read = device.read(offset, data.len()).await.expect("read");
            assert!(
                read[..] == data[..],
                "data at offset {offset} differs after a round trip"
            );
        });
    }
    while let Some(result) = reads.join_next().await {
        result.expect("read task");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_round_trip_on_tmp_uses_io_uring_where_direct_is_accepted() {
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let filesystem = filesystem_name(directory.path());
    let path = directory.path().join("device");
    let device = FileDevice::open(&path, options_with_size(64 << 20)).expect("open");
    assert_eq!(device.size_bytes(), 64 << 20);
    let expected_backend = if accepts_direct(directory.path()) {
        IoBackend::IoUringDirect
    } else {
        IoBackend::PositionalBuffered
    };
    eprintln!("/tmp is {filesystem}; backend {:?}", device.backend());
    assert_eq!(device.backend(), expected_backend);
    round_trip_concurrently(Arc::new(device), 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_shm_file_uses_the_backend_its_filesystem_allows() {
    // tmpfs refused O_DIRECT before Linux 6.6 and accepts it since, so the expected
    // backend follows an independent probe rather than the kernel version.
    let directory = tempfile::tempdir_in("/dev/shm").expect("temp dir on /dev/shm");
    let path = directory.path().join("device");
    let device = FileDevice::open(&path, options_with_size(32 << 20)).expect("open");
    let expected_backend = if accepts_direct(directory.path()) {
        IoBackend::IoUringDirect
    } else {
        IoBackend::PositionalBuffered
    };
    eprintln!(
        "/dev/shm is {}; backend {:?}",
        filesystem_name(directory.path()),
        device.backend()
    );
    assert_eq!(device.backend(), expected_backend);
    round_trip_concurrently(Arc::new(device), 2).await;
}

/// A ramfs mount in a temporary directory, unmounted when dropped.
struct RamfsMount {
    directory: tempfile::TempDir,
}

impl RamfsMount {
    /// Mounts ramfs, which has never supported O_DIRECT; `None` without the privilege.
    fn new() -> Option<Self> {
        let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
        let target = CString::new(directory.path().as_os_str().as_bytes()).expect("path");
        // SAFETY: all pointers are valid NUL-terminated strings that outlive the call;
        // ramfs takes no mount data.
        let result = unsafe {
            libc::mount(
                c"ramfs".as_ptr(),
                target.as_ptr(),
                c"ramfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if result != 0 {
            eprintln!(
                "skipping the ramfs test: mount failed: {}",
                std::io::Error::last_os_error()
            );
            return None;
        }
        Some(Self { directory })
    }

    fn path(&self) -> &Path {
        self.directory.path()
    }
}

impl Drop for RamfsMount {
    fn drop(&mut self) {
        let target = CString::new(self.directory.path().as_os_str().as_bytes()).expect("path");
        // SAFETY: `target` is a valid NUL-terminated path that outlives the call.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Collects formatted log output so that a test can check what was warned.
#[derive(Clone, Default)]
struct CapturedLog(Arc<Mutex<Vec<u8>>>);

impl Write for CapturedLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log lock").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ramfs_refuses_direct_so_the_device_falls_back_and_warns_once() {
    let Some(mount) = RamfsMount::new() else {
        return;
    };
    assert!(!accepts_direct(mount.path()), "ramfs accepted O_DIRECT");
    let path = mount.path().join("device");

    let forced = FileDevice::open(
        &path,
        FileDeviceOptions {
            create_size_bytes: Some(16 << 20),
            backend: Some(IoBackend::IoUringDirect),
            ..FileDeviceOptions::default()
        },
    );
    let error = forced
        .err()
        .expect("forcing io_uring with O_DIRECT on ramfs must fail");
    assert!(matches!(error.kind, DeviceErrorKind::Io(_)), "{error}");

    let log = CapturedLog::default();
    let writer_log = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer_log.clone())
        .with_ansi(false)
        .finish();
    let device = tracing::subscriber::with_default(subscriber, || {
        FileDevice::open(&path, options_with_size(16 << 20))
    })
    .expect("open with fallback");
    assert_eq!(device.backend(), IoBackend::PositionalBuffered);
    let log = String::from_utf8(log.0.lock().expect("log lock").clone()).expect("utf-8 log");
    let warnings: Vec<&str> = log.lines().filter(|line| line.contains("WARN")).collect();
    assert_eq!(warnings.len(), 1, "expected one warning, got: {log}");
    assert!(warnings[0].contains(&path.display().to_string()), "{log}");
    assert!(warnings[0].contains("O_DIRECT"), "{log}");
    round_trip_concurrently(Arc::new(device), 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_requests_are_typed_errors() {
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let size_bytes = 1 << 20;
    for backend in [IoBackend::IoUringDirect, IoBackend::PositionalBuffered] {
        let device = reopen_with(
            &path,
            FileDeviceOptions {
                create_size_bytes: Some(size_bytes),
                backend: Some(backend),
                ..FileDeviceOptions::default()
            },
        );
        let block = BLOCK_BYTES as usize;
        let cases = [
            device.read(size_bytes, block).await.err(),
            device.read(size_bytes - BLOCK_BYTES, 2 * block).await.err(),
            device.read(u64::MAX - BLOCK_BYTES + 1, block).await.err(),
            device
                .write(size_bytes, Arc::new(AlignedBuffer::zeroed(block)))
                .await
                .err(),
        ];
        for error in cases {
            let error = error.expect("out-of-range request succeeded");
            assert!(
                matches!(error.kind, DeviceErrorKind::OutOfRange { size_bytes: reported } if reported == size_bytes),
                "{error}"
            );
            assert_eq!(error.device, path.display().to_string());
        }
        // The last block is still in range.
        device
            .write(
                size_bytes - BLOCK_BYTES,
                Arc::new(AlignedBuffer::zeroed(block)),
            )
            .await
            .expect("write of the last block");
    }
}

/// Bytes of `path` the filesystem has allocated.
fn allocated_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).expect("metadata").blocks() * 512
}

/// The first write into a chunk of a sparse file allocates the whole chunk
/// (so that later direct writes there are overwrites the kernel issues
/// inline), keeps the file's size, and never touches bytes written before:
/// after a reopen, when the chunks are allocated again, earlier data, later
/// data and the holes between read back as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_allocate_their_chunk_ahead_and_keep_what_was_written() {
    const MIB: u64 = 1 << 20;
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let mut random = SmallRng::seed_from_u64(5);
    let mut first = AlignedBuffer::zeroed(64 << 10);
    random.fill_bytes(&mut first);
    let first = Arc::new(first);
    let mut second = AlignedBuffer::zeroed(BLOCK_BYTES as usize);
    random.fill_bytes(&mut second);
    let second = Arc::new(second);
    {
        let device = FileDevice::open(&path, options_with_size(16 * MIB)).expect("open");
        if device.backend() != IoBackend::IoUringDirect {
            eprintln!(
                "skipped: /tmp is {}, no io_uring",
                filesystem_name(directory.path())
            );
            return;
        }
        assert_eq!(allocated_bytes(&path), 0, "a new device file is sparse");
        device.write(5 * MIB, first.clone()).await.expect("write");
        device.flush().await.expect("flush");
        let allocated = allocated_bytes(&path);
        assert!(
            (4 * MIB..8 * MIB).contains(&allocated),
            "one 4 MiB chunk allocated for a 64 KiB write, found {allocated} bytes"
        );
    }
    let device = reopen(&path);
    device.write(6 * MIB, second.clone()).await.expect("write");
    device.write(15 * MIB, second.clone()).await.expect("write");
    device.flush().await.expect("flush");
    assert_eq!(
        device.size_bytes(),
        16 * MIB,
        "allocating never grows the file"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 16 * MIB);
    let read = device.read(5 * MIB, first.len()).await.expect("read");
    assert!(
        read[..] == first[..],
        "data written before the chunk's allocation"
    );
    for offset in [6 * MIB, 15 * MIB] {
        let read = device.read(offset, second.len()).await.expect("read");
        assert!(read[..] == second[..], "data at {offset}");
    }
    let allocated_hole = device.read(4 * MIB, MIB as usize).await.expect("read");
    assert!(
        allocated_hole.iter().all(|byte| *byte == 0),
        "allocated holes read as zeros"
    );
}

/// The parts of `path` the filesystem reports as unwritten extents
/// (`filefrag -v`), or `None` where filefrag is not installed.
fn unwritten_extent_count(path: &Path) -> Option<usize> {
    let output = std::process::Command::new("filefrag")
        .arg("-v")
        .arg(path)
        .output()
        .ok()?;
    output.status.success().then(|| {
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter(|line| line.contains("unwritten"))
            .count()
    })
}

fn options_with_preallocation(
    size_bytes: u64,
    preallocation: FilePreallocation,
) -> FileDeviceOptions {
    FileDeviceOptions {
        preallocation: Some(preallocation),
        ..options_with_size(size_bytes)
    }
}

/// Zeros written ahead (decision 0062) land only where the file holds no
/// data: a chunk left half written and allocated by an earlier open (its
/// rest unwritten extents) is written ahead by the first write after a
/// reopen, and every byte written before, the new write and the zeros in
/// between read back; afterwards the file has no unwritten extent left in
/// the chunks written, so that flushes after overwrites commit no extent
/// changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeros_written_ahead_keep_what_was_written_before_and_leave_no_unwritten_space() {
    const MIB: u64 = 1 << 20;
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let mut random = SmallRng::seed_from_u64(11);
    let mut earlier = AlignedBuffer::zeroed(64 << 10);
    random.fill_bytes(&mut earlier);
    let earlier = Arc::new(earlier);
    let mut later = AlignedBuffer::zeroed(BLOCK_BYTES as usize);
    random.fill_bytes(&mut later);
    let later = Arc::new(later);
    {
        let options = options_with_preallocation(12 * MIB, FilePreallocation::Allocate);
        let device = FileDevice::open(&path, options).expect("open");
        if device.backend() != IoBackend::IoUringDirect {
            eprintln!(
                "skipped: no io_uring on {}",
                filesystem_name(directory.path())
            );
            return;
        }
        device
            .write(4 * MIB + 8192, earlier.clone())
            .await
            .expect("write");
        device.flush().await.expect("flush");
    }
    let Some(before) = unwritten_extent_count(&path) else {
        eprintln!("skipped: filefrag is not installed");
        return;
    };
    assert!(before > 0, "allocating alone leaves unwritten extents");
    let device = reopen(&path);
    device.write(6 * MIB, later.clone()).await.expect("write");
    device.write(0, later.clone()).await.expect("write");
    device.flush().await.expect("flush");
    let read = device
        .read(4 * MIB + 8192, earlier.len())
        .await
        .expect("read");
    assert!(read[..] == earlier[..], "data written before the zeros");
    for offset in [0, 6 * MIB] {
        let read = device.read(offset, later.len()).await.expect("read");
        assert!(read[..] == later[..], "data at {offset}");
    }
    let zeros = device.read(4 * MIB, 8192).await.expect("read");
    assert!(zeros.iter().all(|byte| *byte == 0), "space before the data");
    let zeros = device
        .read(4 * MIB + 8192 + (64 << 10), MIB as usize)
        .await
        .expect("read");
    assert!(zeros.iter().all(|byte| *byte == 0), "space after the data");
    drop(device);
    assert_eq!(
        unwritten_extent_count(&path),
        Some(0),
        "both chunks written were written ahead whole; the untouched third is a hole"
    );
}

/// Writes racing into chunks that are being written ahead wait for the
/// zeros, so that no zero lands on their data: many concurrent writes into
/// fresh chunks, each at its own block, read back exactly, before and after
/// a reopen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writes_into_chunks_being_written_ahead_all_land() {
    const MIB: u64 = 1 << 20;
    const CHUNKS: u64 = 3;
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let size_bytes = CHUNKS * 4 * MIB;
    let device = Arc::new(FileDevice::open(&path, options_with_size(size_bytes)).expect("open"));
    let block_count = size_bytes / BLOCK_BYTES;
    let mut random = SmallRng::seed_from_u64(12);
    let mut blocks: Vec<u64> = (0..block_count).collect();
    // Every fourth block, in random order, so that writes into one chunk
    // arrive from many tasks at once while its zeros are being written.
    blocks.retain(|block| block % 4 == 1);
    for index in (1..blocks.len()).rev() {
        blocks.swap(index, random.random_range(0..=index));
    }
    let tasks: Vec<_> = blocks
        .iter()
        .map(|block| {
            let device = device.clone();
            let block = *block;
            tokio::spawn(async move {
                let mut data = AlignedBuffer::zeroed(BLOCK_BYTES as usize);
                data.fill((block % 251) as u8 + 1);
                device
                    .write(block * BLOCK_BYTES, Arc::new(data))
                    .await
                    .expect("write");
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("write task");
    }
    device.flush().await.expect("flush");
    let check = |contents: &[u8]| {
        for (index, block) in contents.chunks(BLOCK_BYTES as usize).enumerate() {
            let expected = if index % 4 == 1 {
                (index % 251) as u8 + 1
            } else {
                0
            };
            assert!(
                block.iter().all(|byte| *byte == expected),
                "block {index} holds {}, expected {expected}",
                block[0]
            );
        }
    };
    check(&device.read(0, size_bytes as usize).await.expect("read"));
    drop(device);
    let device = reopen(&path);
    check(&device.read(0, size_bytes as usize).await.expect("read"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushed_data_is_seen_after_reopen() {
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let mut random = SmallRng::seed_from_u64(4);
    let mut data = AlignedBuffer::zeroed(64 << 10);
    random.fill_bytes(&mut data);
    let data = Arc::new(data);
    {
        let device = FileDevice::open(&path, options_with_size(8 << 20)).expect("open");
        device.write(3 << 20, data.clone()).await.expect("write");
        device.flush().await.expect("flush");
    }
    let device = reopen(&path);
    assert_eq!(device.size_bytes(), 8 << 20, "reopening must not resize");
    let read = device.read(3 << 20, data.len()).await.expect("read");
    assert!(read[..] == data[..]);
    // The rest of the sparse file still reads as zeroes.
    let hole = device.read(0, 1 << 20).await.expect("read hole");
    assert!(hole.iter().all(|byte| *byte == 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_requests_are_safe_and_the_device_keeps_working() {
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = Arc::new(FileDevice::open(&path, options_with_size(64 << 20)).expect("open"));
    assert_eq!(device.backend(), IoBackend::IoUringDirect);
    let mut random = SmallRng::seed_from_u64(5);
    for round in 0..20 {
        let mut tasks = Vec::new();
        for index in 0..64u64 {
            let device = device.clone();
            let offset = (index * 256 + round) * BLOCK_BYTES;
            if index % 2 == 0 {
                let mut data = AlignedBuffer::zeroed(256 << 10);
                random.fill_bytes(&mut data);
                let data = Arc::new(data);
                tasks.push(tokio::spawn(async move {
                    let _ = device.write(offset, data).await;
                }));
            } else {
                tasks.push(tokio::spawn(async move {
                    let _ = device.read(offset, 256 << 10).await;
                }));
            }
        }
        // Abort at different points: before the request is queued, while it is in
        // the ring, or after it completed.
        if round % 2 == 1 {
            tokio::task::yield_now().await;
        }
        for task in &tasks {
            task.abort();
        }
        for task in tasks {
            let _ = task.await;
        }
    }
    device.flush().await.expect("flush after aborted requests");
    round_trip_concurrently(device.clone(), 6).await;
    // Dropping the device with nothing in flight stops its reaper.
    drop(Arc::into_inner(device).expect("last reference"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_device_with_abandoned_requests_in_flight_is_clean() {
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = Arc::new(FileDevice::open(&path, options_with_size(64 << 20)).expect("open"));
    let mut tasks = Vec::new();
    for index in 0..128u64 {
        let device = device.clone();
        tasks.push(tokio::spawn(async move {
            let data = Arc::new(AlignedBuffer::zeroed(128 << 10));
            let _ = device.write(index * (128 << 10), data).await;
        }));
    }
    tokio::task::yield_now().await;
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let _ = task.await;
    }
    // The aborted tasks released their references; the last drop waits until the
    // kernel has returned every buffer.
    drop(Arc::into_inner(device).expect("last reference"));
    let device = reopen(&path);
    device.read(0, 4096).await.expect("read after reopen");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_positional_backend_round_trips() {
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = FileDevice::open(
        &path,
        FileDeviceOptions {
            create_size_bytes: Some(64 << 20),
            backend: Some(IoBackend::PositionalBuffered),
            ..FileDeviceOptions::default()
        },
    )
    .expect("open");
    assert_eq!(device.backend(), IoBackend::PositionalBuffered);
    assert_eq!(device.path(), path);
    let device = Arc::new(device);
    round_trip_concurrently(device.clone(), 7).await;
    device.flush().await.expect("flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_ring_and_in_flight_limit_still_complete_every_request() {
    // 256 concurrent requests through a 4-entry ring with at most 8 accepted: the
    // queue, the pending list and the permit wait all get exercised.
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = FileDevice::open(
        &path,
        FileDeviceOptions {
            create_size_bytes: Some(64 << 20),
            ring_entries: Some(4),
            in_flight_requests_max: Some(8),
            ..FileDeviceOptions::default()
        },
    )
    .expect("open");
    assert_eq!(device.backend(), IoBackend::IoUringDirect);
    round_trip_concurrently(Arc::new(device), 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_requests_and_flushes_mixed_with_writes() {
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = Arc::new(FileDevice::open(&path, options_with_size(64 << 20)).expect("open"));
    let mut random = SmallRng::seed_from_u64(9);
    let mut data = AlignedBuffer::zeroed(16 << 20);
    random.fill_bytes(&mut data);
    let data = Arc::new(data);
    let mut tasks = tokio::task::JoinSet::new();
    for index in 0..3u64 {
        let writer = device.clone();
        let data = data.clone();
        tasks.spawn(async move { writer.write(index * (16 << 20), data).await });
        let flusher = device.clone();
        tasks.spawn(async move { flusher.flush().await });
    }
    while let Some(result) = tasks.join_next().await {
        result.expect("task").expect("write or flush");
    }
    device.flush().await.expect("final flush");
    for index in 0..3u64 {
        let read = device
            .read(index * (16 << 20), 16 << 20)
            .await
            .expect("read");
        assert!(read[..] == data[..], "16 MiB block {index} differs");
    }
}

/// How long a lock may outlive the device that held it: a child that a
/// concurrent test spawns holds a copy of every descriptor of this process from
/// its fork until its exec, and with it the claim.
const LOCK_RELEASE_TIMEOUT_MS: u64 = 2_000;

/// Opens `path` again once the spawned children of concurrent tests have let go
/// of the previous open's claim (see [`LOCK_RELEASE_TIMEOUT_MS`]).
fn reopen(path: &Path) -> FileDevice {
    reopen_with(path, FileDeviceOptions::default())
}

fn reopen_with(path: &Path, options: FileDeviceOptions) -> FileDevice {
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(LOCK_RELEASE_TIMEOUT_MS);
    loop {
        match FileDevice::open(path, options.clone()) {
            Ok(device) => return device,
            Err(error)
                if matches!(error.kind, DeviceErrorKind::InUse { .. })
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(error) => panic!("reopening {path:?}: {error}"),
        }
    }
}

/// Whether another process (util-linux `flock --nonblock`) can take an flock
/// on `path` right now.
fn another_process_can_flock(path: &Path) -> bool {
    std::process::Command::new("flock")
        .arg("--nonblock")
        .arg(path)
        .arg("true")
        .status()
        .expect("run flock")
        .success()
}

/// The holder named by an open refused because the device is in use.
fn refused_holder(path: &Path) -> lamina_device::LockHolder {
    match FileDevice::open(path, FileDeviceOptions::default()) {
        Err(error) => {
            let message = error.to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(message.contains("in use by this process"), "{message}");
            match error.kind {
                DeviceErrorKind::InUse {
                    holder: Some(holder),
                } => holder,
                other => panic!("{path:?}: expected in use with a holder, got {other:?}"),
            }
        }
        Ok(_) => panic!("a second open of {path:?} was not refused"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_device_is_created_owner_only_and_open_once_through_any_name() {
    use std::os::unix::fs::PermissionsExt;
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = FileDevice::open(&path, options_with_size(8 << 20)).expect("open");
    let mode = std::fs::metadata(&path).expect("stat").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "created with mode {mode:o}");

    let symlink = directory.path().join("symlink");
    std::os::unix::fs::symlink(&path, &symlink).expect("symlink");
    let hard_link = directory.path().join("hard-link");
    std::fs::hard_link(&path, &hard_link).expect("hard link");
    for name in [&path, &symlink, &hard_link] {
        let holder = refused_holder(name);
        assert_eq!(holder.pid, std::process::id());
        assert!(!another_process_can_flock(name), "{name:?} is not locked");
    }
    // Data written through the first open is untouched by the refused ones.
    let mut data = AlignedBuffer::zeroed(BLOCK_BYTES as usize);
    data.fill(0x5c);
    device.write(0, Arc::new(data)).await.expect("write");
    device.flush().await.expect("flush");
    drop(device);
    let device = reopen(&symlink);
    let read = device.read(0, BLOCK_BYTES as usize).await.expect("read");
    assert!(read.iter().all(|byte| *byte == 0x5c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_device_is_open_once_and_exclusively() {
    let Some(loop_device) = LoopDevice::new(16 << 20) else {
        return;
    };
    let device = FileDevice::open(&loop_device.path, FileDeviceOptions::default()).expect("open");
    let holder = refused_holder(&loop_device.path);
    assert_eq!(holder.pid, std::process::id());
    // O_EXCL: the kernel refuses other exclusive opens, such as a mount or mkfs.
    let exclusive = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&loop_device.path);
    assert_eq!(
        exclusive.err().and_then(|error| error.raw_os_error()),
        Some(libc::EBUSY)
    );
    drop(device);
    reopen(&loop_device.path);
}

/// A loop device over a file in a temporary directory, detached when dropped.
struct LoopDevice {
    path: PathBuf,
    _directory: tempfile::TempDir,
}

impl LoopDevice {
    fn new(size_bytes: u64) -> Option<Self> {
        let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
        let backing = directory.path().join("backing");
        std::fs::File::create(&backing)
            .and_then(|file| file.set_len(size_bytes))
            .expect("backing file");
        let output = std::process::Command::new("losetup")
            .args(["--find", "--show", "--direct-io=on"])
            .arg(&backing)
            .output();
        match output {
            Ok(output) if output.status.success() => {
                let path = String::from_utf8_lossy(&output.stdout).trim().to_string();
                Some(Self {
                    path: PathBuf::from(path),
                    _directory: directory,
                })
            }
            Ok(output) => {
                eprintln!(
                    "skipping the block device test: losetup failed: {}",
                    String::from_utf8_lossy(&output.stderr)
                );
                None
            }
            Err(error) => {
                eprintln!("skipping the block device test: cannot run losetup: {error}");
                None
            }
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .arg("--detach")
            .arg(&self.path)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_device_size_comes_from_the_kernel_and_data_round_trips() {
    let size_bytes = 48 << 20;
    let Some(loop_device) = LoopDevice::new(size_bytes) else {
        return;
    };
    let device = FileDevice::open(&loop_device.path, FileDeviceOptions::default()).expect("open");
    assert_eq!(device.size_bytes(), size_bytes);
    assert_eq!(device.backend(), IoBackend::IoUringDirect);
    let device = Arc::new(device);
    round_trip_concurrently(device.clone(), 10).await;
    device.flush().await.expect("flush");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_at_a_time_is_always_submitted_and_reaped() {
    // With one request in flight the reaper task goes idle between requests, so
    // every request depends on a caller waking it to submit and on the eventfd
    // waking it to reap; a lost wake-up hangs, which the timeout turns into a
    // failure.
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = FileDevice::open(&path, options_with_size(8 << 20)).expect("open");
    assert_eq!(device.backend(), IoBackend::IoUringDirect);
    let block_count = device.size_bytes() / BLOCK_BYTES;
    let sequence = async {
        for index in 0..2000u64 {
            let offset = (index % block_count) * BLOCK_BYTES;
            let mut data = AlignedBuffer::zeroed(BLOCK_BYTES as usize);
            data[..8].copy_from_slice(&index.to_le_bytes());
            device.write(offset, Arc::new(data)).await.expect("write");
            let read = device
                .read(offset, BLOCK_BYTES as usize)
                .await
                .expect("read");
            assert_eq!(read[..8], index.to_le_bytes());
            if index % 500 == 0 {
                // Let the reaper and the workers fall fully asleep now and then.
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), sequence)
        .await
        .expect("a request was never answered: lost wake-up");
}

/// Opens a fresh io_uring device of `size_bytes` with a ring of `ring_entries`.
fn open_ring_device(path: &Path, size_bytes: u64, ring_entries: Option<u32>) -> FileDevice {
    let device = FileDevice::open(
        path,
        FileDeviceOptions {
            create_size_bytes: Some(size_bytes),
            ring_entries,
            ..FileDeviceOptions::default()
        },
    )
    .expect("open");
    assert_eq!(device.backend(), IoBackend::IoUringDirect);
    device
}

/// Polls `future` once, so that its request is accepted (and put in the ring).
async fn poll_once<F: std::future::Future + Unpin>(future: &mut F) {
    std::future::poll_fn(|context| {
        let _ = std::pin::Pin::new(&mut *future).poll(context);
        std::task::Poll::Ready(())
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_read_keeps_its_buffer_until_the_kernel_is_done() {
    // On one thread, a 4 KiB buffer freed by a dropped read would be the next
    // 4 KiB buffer handed out (buffers are recycled per thread); if the kernel
    // still wrote into it, the pattern written there afterwards would change.
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = open_ring_device(&path, 8 << 20, None);
    let mut data = AlignedBuffer::zeroed(1 << 20);
    data.fill(0xab);
    device.write(0, Arc::new(data)).await.expect("fill");
    for round in 0..200u64 {
        let offset = (round % 256) * BLOCK_BYTES;
        let mut read = Box::pin(device.read(offset, BLOCK_BYTES as usize));
        poll_once(&mut read).await;
        if round % 2 == 0 {
            // Let the reaper submit it, so that it is in the kernel when dropped.
            tokio::task::yield_now().await;
        }
        drop(read);
        let mut reused = AlignedBuffer::for_overwrite(BLOCK_BYTES as usize);
        reused.fill(0x5a);
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        device.flush().await.expect("flush");
        assert!(
            reused.iter().all(|byte| *byte == 0x5a),
            "round {round}: the kernel wrote into memory a dropped read had freed"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_more_requests_than_ring_entries_all_complete() {
    // 2000 requests at once through an 8-entry ring: most wait for room, and the
    // ring is refilled from the completions of the others.
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = Arc::new(open_ring_device(&path, 16 << 20, Some(8)));
    let block_count = 2000u64;
    let mut writes = tokio::task::JoinSet::new();
    for index in 0..block_count {
        let device = device.clone();
        writes.spawn(async move {
            let mut data = AlignedBuffer::zeroed(BLOCK_BYTES as usize);
            data[..8].copy_from_slice(&index.to_le_bytes());
            device.write(index * BLOCK_BYTES, Arc::new(data)).await
        });
    }
    while let Some(result) = writes.join_next().await {
        result.expect("write task").expect("write");
    }
    let mut reads = tokio::task::JoinSet::new();
    for index in 0..block_count {
        let device = device.clone();
        reads.spawn(async move {
            let read = device
                .read(index * BLOCK_BYTES, BLOCK_BYTES as usize)
                .await
                .expect("read");
            assert_eq!(read[..8], index.to_le_bytes(), "block {index}");
        });
    }
    while let Some(result) = reads.join_next().await {
        result.expect("read task");
    }
}

/// Writes and reads back blocks `first..first + count` with their index in them.
async fn write_and_check(device: &FileDevice, first: u64, count: u64) {
    for index in first..first + count {
        let mut data = AlignedBuffer::zeroed(BLOCK_BYTES as usize);
        data[..8].copy_from_slice(&index.to_le_bytes());
        device
            .write(index * BLOCK_BYTES, Arc::new(data))
            .await
            .expect("write");
        let read = device
            .read(index * BLOCK_BYTES, BLOCK_BYTES as usize)
            .await
            .expect("read");
        assert_eq!(read[..8], index.to_le_bytes());
    }
}

fn runtime(worker_threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn a_device_serves_one_runtime_after_another() {
    // The reaper starts on the runtime of the first request and dies with it; the
    // next runtime's first request starts another.
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = open_ring_device(&path, 8 << 20, None);
    for round in 0..3u64 {
        let runtime = runtime(2);
        runtime.block_on(write_and_check(&device, round * 100, 100));
        drop(runtime);
    }
    let current_thread = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    current_thread.block_on(write_and_check(&device, 300, 100));
}

#[test]
fn requests_waiting_when_the_reapers_runtime_dies_still_complete() {
    // This thread's ring gets its reaper from the runtime of its first request;
    // requests of this thread made under a second runtime are in flight while
    // that first runtime shuts down: they are woken and start a reaper on the
    // second, so none hangs.
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = Arc::new(open_ring_device(&path, 8 << 20, None));
    let first = runtime(1);
    first.block_on(write_and_check(&device, 0, 10));
    let second = runtime(1);
    let dropper = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(first);
    });
    let busy = async {
        tokio::join!(
            write_and_check(&device, 100, 400),
            write_and_check(&device, 500, 400),
            write_and_check(&device, 900, 400),
            write_and_check(&device, 1300, 400),
        )
    };
    second
        .block_on(async { tokio::time::timeout(std::time::Duration::from_secs(60), busy).await })
        .expect("a request hung after the reaper's runtime shut down");
    dropper.join().expect("dropper thread");
}

/// Runs `count` blocks of writes from `first` on a runtime of its own on a new
/// thread, the way a connection thread does.
fn write_on_a_thread_of_its_own(
    device: &Arc<FileDevice>,
    first: u64,
    count: u64,
) -> std::thread::JoinHandle<()> {
    let device = device.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let writes = (first..first + count).map(|index| {
                let device = device.clone();
                tokio::spawn(async move {
                    let mut data = AlignedBuffer::zeroed(BLOCK_BYTES as usize);
                    data[..8].copy_from_slice(&index.to_le_bytes());
                    device.write(index * BLOCK_BYTES, Arc::new(data)).await
                })
            });
            for write in writes.collect::<Vec<_>>() {
                write.await.expect("write task").expect("write");
            }
        });
    })
}

#[test]
fn each_thread_has_a_ring_and_a_flush_covers_writes_from_every_ring() {
    // Decision 0048: threads on runtimes of their own each set up a ring; one
    // flush from yet another thread covers what all of them wrote, and every
    // block reads back after a reopen. More threads than rings share rings.
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = Arc::new(open_ring_device(&path, 64 << 20, None));
    let writers_count = 12u64;
    let blocks_per_writer = 300u64;
    let writers: Vec<_> = (0..writers_count)
        .map(|writer| {
            write_on_a_thread_of_its_own(&device, writer * blocks_per_writer, blocks_per_writer)
        })
        .collect();
    for writer in writers {
        writer.join().expect("writer thread");
    }
    let rings = device.ring_count();
    assert!(
        (2..=8).contains(&rings),
        "{writers_count} threads set up {rings} rings (at most 8 per device)"
    );
    let flusher = {
        let device = device.clone();
        std::thread::spawn(move || runtime(1).block_on(device.flush()))
    };
    flusher.join().expect("flusher").expect("flush");
    drop(device);
    let device = reopen(&path);
    runtime(2).block_on(async {
        for index in 0..writers_count * blocks_per_writer {
            let read = device
                .read(index * BLOCK_BYTES, BLOCK_BYTES as usize)
                .await
                .expect("read");
            assert_eq!(read[..8], index.to_le_bytes(), "block {index}");
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_across_a_shrunken_end_of_file_is_short_then_a_clear_error() {
    // Truncating the file under the open device makes a read that spans the new
    // end transfer only its first part; the rest is resubmitted, gets end of
    // file, and the caller sees that error rather than a half-filled buffer.
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = open_ring_device(&path, 8 << 20, None);
    let mut data = AlignedBuffer::zeroed(1 << 20);
    data.fill(0x77);
    device.write(0, Arc::new(data)).await.expect("write");
    device.flush().await.expect("flush");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open for truncation");
    file.set_len(1 << 19).expect("truncate");
    let error = device
        .read((1 << 19) - BLOCK_BYTES, 4 * BLOCK_BYTES as usize)
        .await
        .expect_err("a read past the end of the file must fail");
    assert!(
        error.to_string().contains("end of file"),
        "unexpected error: {error}"
    );
    // What is still inside the file reads back whole.
    let read = device.read(0, 1 << 19).await.expect("read inside");
    assert!(read.iter().all(|byte| *byte == 0x77));
}

#[tokio::test(flavor = "current_thread")]
async fn dropping_the_device_with_reads_in_the_kernel_waits_for_them() {
    // Reads accepted, some submitted and some not, all abandoned, then the device
    // dropped on the same thread: the drop must wait for the kernel before the
    // buffers go, and the file must be usable again afterwards.
    let directory = tempfile::tempdir_in("/tmp").expect("temp dir");
    let path = directory.path().join("device");
    let device = open_ring_device(&path, 64 << 20, Some(32));
    let mut reads = Vec::new();
    for index in 0..96u64 {
        let mut read = Box::pin(device.read(index * (512 << 10), 512 << 10));
        poll_once(&mut read).await;
        reads.push(read);
        if index == 40 {
            tokio::task::yield_now().await;
        }
    }
    drop(reads);
    drop(device);
    let device = reopen(&path);
    device.read(0, 4096).await.expect("read after reopen");
}
