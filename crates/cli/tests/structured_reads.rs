//! Structured reads of lamina volumes through a real client (libnbd's
//! `nbdsh`): the daemon finds a read's holes in the same walk of the map that
//! plans the read (decision 0046), so every chunk must tell the truth about
//! the bytes it carries. Checked on a volume and a snapshot, for reads served
//! from unwritten batches, from the memory cache and from the device (after a
//! restart), aligned and not: the bytes equal what was written, data chunks
//! hold the written blocks, a hole chunk covers only blocks never written,
//! and the chunks tile the request exactly.

mod common;

use std::process::Command;

use common::{Daemon, lamina_ok, run, system_path};

const VOLUME_BYTES: u64 = 64 << 20;

/// Checks structured reads of `h` against a model of the blocks written
/// (`BLOCKS`: block index → fill byte), over a set of aligned and unaligned
/// ranges.
const CHECK_SCRIPT: &str = r#"
import os
written = {int(index): int(fill) for index, fill in
           (pair.split(":") for pair in os.environ["BLOCKS"].split(","))}
def expected(offset, length):
    out = bytearray(length)
    for position in range(offset, offset + length):
        out[position - offset] = written.get(position // 4096, 0)
    return bytes(out)
ranges = [(0, 3 * 65536), (10000, 60000), (65536, 4096), (65536 + 100, 8000),
          (0, 4096), (4096 * 40, 4096 * 30), (4096 * 49 + 7, 4096 * 3)]
for offset, length in ranges:
    chunks = []
    def chunk(subbuf, chunk_offset, status, error):
        chunks.append((chunk_offset, len(subbuf), status))
        return 0
    data = h.pread_structured(length, offset, chunk)
    assert data == expected(offset, length), (offset, length)
    chunks.sort()
    position = offset
    for chunk_offset, chunk_length, status in chunks:
        assert chunk_offset == position, (offset, length, chunks)
        position += chunk_length
        blocks = range(chunk_offset // 4096, (chunk_offset + chunk_length - 1) // 4096 + 1)
        if status == nbd.READ_HOLE:
            assert not any(block in written for block in blocks), (offset, length, chunks)
        else:
            assert status == nbd.READ_DATA, status
    assert position == offset + length, (offset, length, chunks)
    # Unwritten blocks are sent as holes, not as data.
    if (offset, length) == (0, 3 * 65536):
        assert (0, 12288, nbd.READ_HOLE) in chunks, chunks
        assert (16384, 49152, nbd.READ_HOLE) in chunks, chunks
        assert (65536, 4096, nbd.READ_DATA) in chunks, chunks
print("checked", len(ranges))
"#;

/// Writes a block of `fill` bytes at each `index:fill` of `BLOCKS`, then flushes.
const WRITE_SCRIPT: &str = r#"
import os
for pair in os.environ["BLOCKS"].split(","):
    index, fill = (int(part) for part in pair.split(":"))
    h.pwrite(bytes([fill]) * 4096, index * 4096)
h.flush()
"#;

fn nbdsh(daemon: &Daemon, export: &str, script: &str, blocks: &str) -> String {
    run(Command::new("nbdsh")
        .env("PATH", system_path())
        .env("BLOCKS", blocks)
        .args(["-u", &daemon.uri(export), "-c", script]))
}

fn assert_checked(output: &str) {
    assert!(output.contains("checked 7"), "nbdsh said: {output}");
}

#[test]
fn structured_reads_report_holes_that_match_the_data() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let daemon = Daemon::start_with_pool(&data_dir, 1 << 30, VOLUME_BYTES);

    // Block 16 is the data at 64 KiB; 40..70 has a gap at 50..55.
    let mut blocks = vec!["16:90".to_string(), "3:7".to_string()];
    blocks.extend(
        (40..50)
            .chain(55..70)
            .map(|index| format!("{index}:{}", index + 1)),
    );
    let blocks = blocks.join(",");
    nbdsh(&daemon, "default", WRITE_SCRIPT, &blocks);
    // Read right away (recent blocks), then again (the memory cache).
    assert_checked(&nbdsh(&daemon, "default", CHECK_SCRIPT, &blocks));
    assert_checked(&nbdsh(&daemon, "default", CHECK_SCRIPT, &blocks));

    // A snapshot keeps them; the volume changes after it.
    lamina_ok(&data_dir, &["snapshot", "create", "default@before"]);
    let after = format!("{blocks},50:200,51:201");
    nbdsh(&daemon, "default", WRITE_SCRIPT, "50:200,51:201");
    assert_checked(&nbdsh(&daemon, "default@before", CHECK_SCRIPT, &blocks));
    assert_checked(&nbdsh(&daemon, "default", CHECK_SCRIPT, &after));

    // Restarted without a memory cache: the reads come from the device.
    assert!(daemon.terminate().success());
    let daemon =
        Daemon::start_with_config(&data_dir, 1 << 30, VOLUME_BYTES, "memory_cache_bytes = 0");
    assert_checked(&nbdsh(&daemon, "default", CHECK_SCRIPT, &after));
    assert_checked(&nbdsh(&daemon, "default@before", CHECK_SCRIPT, &blocks));
}
