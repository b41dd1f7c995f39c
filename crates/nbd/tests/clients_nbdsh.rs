//! libnbd (through `nbdsh`) against the in-process server: data round trips and
//! the protocol's edge cases, with libnbd's client-side checks turned off where
//! the point is to see what the server answers.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{TestServer, catalog_with, command_with_python, python_with_nbd, run, tool};
use lamina_nbd::memory::{MemoryCatalog, MemoryExport};
use lamina_nbd::{Export, ServerConfig};

const MIB: u64 = 1024 * 1024;

/// Helpers every script starts with; `URI` is the export under test.
const PRELUDE: &str = r#"
import os, nbd
URI = os.environ["NBD_TEST_URI"]

def connect(uri=URI, structured=True, meta=True, strict=True):
    handle = nbd.NBD()
    handle.set_request_structured_replies(structured)
    if meta:
        handle.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
    handle.connect_uri(uri)
    if not strict:
        handle.set_strict_mode(0)
    return handle

def expect_error(name, function, *arguments, **keywords):
    try:
        function(*arguments, **keywords)
    except nbd.Error as error:
        assert error.errno == name, f"expected {name}, got {error.errno}: {error.string}"
        return
    raise AssertionError(f"expected {name}, but the call succeeded")

def extents(handle, length, offset, flags=0):
    found = []
    def callback(context, start, entries, error):
        assert context == nbd.CONTEXT_BASE_ALLOCATION
        found.extend(zip(entries[0::2], entries[1::2]))
        return 0
    handle.block_status(length, offset, callback, flags)
    return found
"#;

struct Nbdsh {
    nbdsh: PathBuf,
    python: PathBuf,
}

fn nbdsh() -> Option<Nbdsh> {
    let nbdsh = tool("nbdsh")?;
    let python = python_with_nbd()?;
    Some(Nbdsh { nbdsh, python })
}

impl Nbdsh {
    /// Runs `script` (after the prelude) in nbdsh and fails the test if it raises.
    async fn check(&self, uri: &str, script: &str) {
        let program = format!("{PRELUDE}\n{script}\nprint('script passed')\n");
        let output = run(command_with_python(&self.nbdsh, &self.python)
            .arg("-c")
            .arg(&program)
            .env("NBD_TEST_URI", uri))
        .await;
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("script passed"),
            "nbdsh script failed ({}):\n{script}\nstdout:\n{stdout}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_round_trip_structured_and_simple() {
    let Some(shell) = nbdsh() else { return };
    let (catalog, exports) = catalog_with(&[("disk", 8 * MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    shell
        .check(
            &server.uri("disk"),
            r#"
for structured in (True, False):
    h = connect(structured=structured, meta=structured)
    assert h.get_structured_replies_negotiated() == structured
    assert h.get_size() == 8 * 1024 * 1024
    data = bytes((i * 7 + (1 if structured else 2)) % 251 for i in range(3 * 65536 + 123))
    offset = 1000 if structured else 4 * 1024 * 1024 + 17
    h.pwrite(data, offset)
    assert h.pread(len(data), offset) == data
    # Unwritten space reads as zeros, across holes and data.
    assert h.pread(4096, 7 * 1024 * 1024) == bytes(4096)
    mixed = h.pread(8192, offset + len(data) - 100)
    assert mixed == data[-100:] + bytes(8192 - 100)
    h.shutdown()
"#,
        )
        .await;
    assert!(exports[0].allocated_block_count() > 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_read_uses_holes_and_honours_df() {
    let Some(shell) = nbdsh() else { return };
    let (catalog, exports) = catalog_with(&[("disk", 4 * MIB)]);
    exports[0]
        .write(65536, &[0x5a; 4096], false)
        .await
        .expect("write");
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    shell
        .check(
            &server.uri("disk"),
            r#"
h = connect()
assert h.can_df()
chunks = []
def chunk(subbuf, offset, status, error):
    chunks.append((offset, len(subbuf), status))
    return 0
buffer = h.pread_structured(3 * 65536, 0, chunk)
assert buffer == bytes(65536) + b"\x5a" * 4096 + bytes(2 * 65536 - 4096)
kinds = [(offset, length, status) for offset, length, status in chunks]
assert (0, 65536, nbd.READ_HOLE) in kinds, kinds
assert (65536, 4096, nbd.READ_DATA) in kinds, kinds
assert (65536 + 4096, 2 * 65536 - 4096, nbd.READ_HOLE) in kinds, kinds
chunks.clear()
buffer = h.pread_structured(3 * 65536, 0, chunk, nbd.CMD_FLAG_DF)
assert buffer == bytes(65536) + b"\x5a" * 4096 + bytes(2 * 65536 - 4096)
assert chunks == [(0, 3 * 65536, nbd.READ_DATA)], chunks
"#,
        )
        .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_and_oversized_requests_get_errors() {
    let Some(shell) = nbdsh() else { return };
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let config = ServerConfig {
        max_request_bytes: 1024 * 1024,
        ..ServerConfig::default()
    };
    let server = TestServer::unix(catalog, config).await;
    shell
        .check(
            &server.uri("disk"),
            r#"
for structured in (True, False):
    h = connect(structured=structured, meta=structured, strict=False)
    assert h.get_block_size(nbd.SIZE_MAXIMUM) == 1024 * 1024
    size = h.get_size()
    expect_error("EINVAL", h.pread, 4096, size - 100)
    expect_error("EINVAL", h.pread, 1, size)
    expect_error("ENOSPC", h.pwrite, b"x" * 4096, size - 100)
    expect_error("ENOSPC", h.zero, 4096, size)
    expect_error("EINVAL", h.trim, 4096, size)
    expect_error("EINVAL", h.cache, 8192, size - 4096)
    # Over the advertised maximum: refused, and the connection stays usable.
    expect_error("EINVAL", h.pread, 2 * 1024 * 1024, 0)
    expect_error("EINVAL", h.pwrite, b"y" * (2 * 1024 * 1024), 0)
    if structured:
        expect_error("EOVERFLOW", h.pread, 2 * 1024 * 1024, 0, nbd.CMD_FLAG_DF)
        expect_error("EINVAL", h.block_status, 4096, size, lambda *a: 0)
    else:
        # DF is only valid with structured replies.
        expect_error("EINVAL", h.pread, 512, 0, nbd.CMD_FLAG_DF)
    # A flag that does not belong to the command.
    expect_error("EINVAL", h.pwrite, b"z", 0, nbd.CMD_FLAG_REQ_ONE)
    h.pwrite(b"still works", 0)
    assert h.pread(11, 0) == b"still works"
    h.shutdown()
"#,
        )
        .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_export_refuses_writes_with_eperm() {
    let Some(shell) = nbdsh() else { return };
    let catalog = Arc::new(MemoryCatalog::new());
    let snapshot = Arc::new(
        MemoryExport::new(MIB)
            .with_contents(&[7u8; 8192])
            .with_read_only(true),
    );
    catalog.insert("snapshot", "read-only", snapshot.clone());
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    shell
        .check(
            &server.uri("snapshot"),
            r#"
h = connect(strict=False)
assert h.is_read_only()
assert not h.can_trim() and not h.can_zero()
assert h.pread(8192, 0) == b"\x07" * 8192
expect_error("EPERM", h.pwrite, b"x" * 512, 0)
expect_error("EPERM", h.trim, 4096, 0)
expect_error("EPERM", h.zero, 4096, 0)
h.flush()
assert h.pread(8192, 0) == b"\x07" * 8192
"#,
        )
        .await;
    assert_eq!(snapshot.operation_counts().writes, 0);
    assert_eq!(snapshot.operation_counts().trims, 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trim_zero_block_status_fua_flush_cache() {
    let Some(shell) = nbdsh() else { return };
    let catalog = Arc::new(MemoryCatalog::new());
    let disk = Arc::new(MemoryExport::new(4 * MIB));
    catalog.insert("disk", "", disk.clone());
    let slow = Arc::new(MemoryExport::new(MIB).with_fast_zero(false));
    catalog.insert("slowzero", "", slow.clone());
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    shell
        .check(
            &server.uri("disk"),
            r#"
h = connect()
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
assert h.can_fua() and h.can_flush() and h.can_trim() and h.can_zero()
assert h.can_fast_zero() and h.can_cache() and h.can_multi_conn()
HOLE, ZERO = nbd.STATE_HOLE, nbd.STATE_ZERO
assert extents(h, 4 * 1024 * 1024, 0) == [(4 * 1024 * 1024, HOLE | ZERO)]
h.pwrite(b"\xff" * 65536, 0, nbd.CMD_FLAG_FUA)
assert extents(h, 4 * 1024 * 1024, 0) == [(65536, 0), (4 * 1024 * 1024 - 65536, HOLE | ZERO)]
# REQ_ONE: a single descriptor.
assert extents(h, 4 * 1024 * 1024, 0, nbd.CMD_FLAG_REQ_ONE) == [(65536, 0)]
# Trim punches whole blocks; the partial edges read as zeros.
h.trim(8192 + 100, 4096)
assert h.pread(12288, 4096) == bytes(8292) + b"\xff" * (12288 - 8292)
assert extents(h, 12288, 4096) == [(8192, HOLE | ZERO), (4096, 0)]
# Write zeroes with NO_HOLE keeps the blocks allocated but zero.
h.zero(8192, 32768, nbd.CMD_FLAG_NO_HOLE)
assert h.pread(8192, 32768) == bytes(8192)
assert extents(h, 8192, 32768) == [(8192, 0)]
h.zero(65536 - 8192, 0, nbd.CMD_FLAG_FAST_ZERO)
# Write zeroes that may punch: the range becomes a hole.
h.zero(65536, 0)
assert extents(h, 65536, 0) == [(65536, HOLE | ZERO)]
assert h.pread(65536, 0) == bytes(65536)
h.cache(65536, 0)
h.flush()
"#,
        )
        .await;
    let counts = disk.operation_counts();
    assert_eq!(counts.fua_writes, 1, "FUA reached the backend: {counts:?}");
    assert!(
        counts.flushes >= 1 && counts.caches == 1 && counts.trims == 1,
        "{counts:?}"
    );
    assert_eq!(counts.write_zeroes, 3, "{counts:?}");
    shell
        .check(
            &server.uri("slowzero"),
            r#"
h = connect()
expect_error("ENOTSUP", h.zero, 4096, 0, nbd.CMD_FLAG_FAST_ZERO)
h.zero(4096, 0)
"#,
        )
        .await;
    assert_eq!(slow.operation_counts().fast_zero_refusals, 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_failures_become_eio() {
    let Some(shell) = nbdsh() else { return };
    let (catalog, exports) = catalog_with(&[("disk", MIB)]);
    exports[0].set_failing(true);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    shell
        .check(
            &server.uri("disk"),
            r#"
for structured in (True, False):
    h = connect(structured=structured, meta=structured)
    expect_error("EIO", h.pread, 4096, 0)
    expect_error("EIO", h.pwrite, b"a" * 4096, 0)
    expect_error("EIO", h.flush)
    h.shutdown()
"#,
        )
        .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_and_requests_in_flight() {
    let Some(shell) = nbdsh() else { return };
    let (catalog, exports) = catalog_with(&[("disk", 16 * MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    shell
        .check(
            &server.uri("disk"),
            r#"
handles = [connect() for _ in range(4)]
# Each connection keeps many asynchronous writes in flight at once.
for index, handle in enumerate(handles):
    for block in range(64):
        data = bytes([index * 64 + block & 0xff]) * 65536
        handle.aio_pwrite(data, (index * 64 + block) * 65536)
for handle in handles:
    while handle.aio_in_flight() > 0:
        handle.poll(-1)
handles[0].flush()
# Every connection sees every other connection's writes.
for reader in handles:
    for block in range(0, 256, 17):
        assert reader.pread(65536, block * 65536) == bytes([block & 0xff]) * 65536
# Out-of-order completion: many reads in flight on one handle.
buffers = [nbd.Buffer(65536) for _ in range(256)]
for block, buffer in enumerate(buffers):
    handles[1].aio_pread(buffer, block * 65536)
assert handles[1].aio_in_flight() > 1
while handles[1].aio_in_flight() > 0:
    handles[1].poll(-1)
for block, buffer in enumerate(buffers):
    assert buffer.to_bytearray() == bytes([block & 0xff]) * 65536
for handle in handles:
    handle.shutdown()
"#,
        )
        .await;
    let contents = exports[0].contents();
    for block in 0..256usize {
        assert!(
            contents[block * 65536..(block + 1) * 65536]
                .iter()
                .all(|&byte| byte == block as u8)
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn option_negotiation_through_libnbd() {
    let Some(shell) = nbdsh() else { return };
    let (catalog, _exports) = catalog_with(&[("one", MIB), ("two", 2 * MIB)]);
    let server = TestServer::unix(catalog, ServerConfig::default()).await;
    shell
        .check(
            &server.uri("one"),
            r#"
h = nbd.NBD()
h.set_opt_mode(True)
h.connect_uri(URI)
names = []
h.opt_list(lambda name, description: names.append((name, description)) or 0)
assert names == [("one", "test export one"), ("two", "test export two")], names
contexts = []
h.opt_list_meta_context(lambda name: contexts.append(name) or 0)
assert contexts == ["base:allocation"], contexts
h.set_export_name("two")
h.opt_info()
assert h.get_size() == 2 * 1024 * 1024
h.set_export_name("missing")
try:
    h.opt_info()
    raise AssertionError("info on a missing export succeeded")
except nbd.Error:
    pass
h.set_export_name("one")
h.opt_go()
assert h.get_size() == 1024 * 1024
h.shutdown()
h2 = nbd.NBD()
h2.set_opt_mode(True)
h2.connect_uri(URI)
h2.opt_abort()
"#,
        )
        .await;
    server.stop().await;
}
