//! Round trips of every codec: arbitrary blocks (proptest, biased toward the
//! repetitive data that compresses), and real files from this machine cut
//! into 4 KiB blocks. Whatever a codec stores must read back exactly at the
//! recorded length, and early abort must keep only forms that save 1/8.

use lamina_reduction::{
    BlockCompressor, BlockDecompressor, Codec, StoredForm, largest_kept_length,
};
use proptest::prelude::*;

const BLOCK_SIZE_BYTES: usize = 4096;
/// How much of the machine's files the real-data test reads.
const REAL_DATA_LIMIT_BYTES: usize = 4 << 20;
/// Where the real-data test finds files: text, manual pages and libraries.
const REAL_DATA_DIRECTORIES: [&str; 3] = [
    "/usr/share/doc",
    "/usr/share/man",
    "/usr/lib/x86_64-linux-gnu",
];

fn codecs() -> Vec<Codec> {
    ["lz4", "zstd:1", "zstd:3", "zstd:19"]
        .iter()
        .map(|name| name.parse().expect("a codec name"))
        .collect()
}

/// Compresses `input` with `codec` and checks what comes back.
fn check_round_trip(
    compressor: &mut BlockCompressor,
    decompressor: &mut BlockDecompressor,
    input: &[u8],
) -> Result<(), String> {
    let codec = compressor.codec();
    match compressor
        .compress(input)
        .map_err(|error| error.to_string())?
    {
        StoredForm::AsIs(stored) => {
            if stored != input {
                return Err(format!("{codec}: stored as is, but not the input"));
            }
        }
        StoredForm::Compressed(stored) => {
            if stored.len() > largest_kept_length(input.len()) {
                return Err(format!(
                    "{codec}: kept {} of {} bytes",
                    stored.len(),
                    input.len()
                ));
            }
            let mut output = vec![0xA5; input.len()];
            decompressor
                .decompress(codec, stored, &mut output)
                .map_err(|error| error.to_string())?;
            if output != input {
                return Err(format!("{codec}: read back differs"));
            }
        }
    }
    Ok(())
}

/// A block made of runs of a few byte values and of random bytes.
fn block_strategy() -> impl Strategy<Value = Vec<u8>> {
    let run = (any::<u8>(), 1usize..600).prop_map(|(byte, length)| vec![byte; length]);
    let noise = proptest::collection::vec(any::<u8>(), 1..200);
    proptest::collection::vec(prop_oneof![3 => run, 1 => noise], 1..40).prop_map(|parts| {
        let mut block: Vec<u8> = parts.concat();
        block.resize(BLOCK_SIZE_BYTES, 0);
        block
    })
}

proptest! {
    // 64 cases of four codecs each (zstd:19 is slow) keep the test to seconds.
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn arbitrary_blocks_round_trip(block in block_strategy(), small in proptest::collection::vec(any::<u8>(), 0..64)) {
        let mut decompressor = BlockDecompressor::new().expect("context");
        for codec in codecs() {
            let mut compressor = BlockCompressor::new(codec).expect("context");
            prop_assert_eq!(check_round_trip(&mut compressor, &mut decompressor, &block), Ok(()));
            prop_assert_eq!(check_round_trip(&mut compressor, &mut decompressor, &small), Ok(()));
        }
    }
}

/// Files under `directory`, depth first, until `limit_bytes` are gathered.
fn gather_files(directory: &std::path::Path, data: &mut Vec<u8>, limit_bytes: usize) {
    let Ok(entries) = std::fs::read_dir(directory) else {
        return;
    };
    let mut paths: Vec<_> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    paths.sort();
    for path in paths {
        if data.len() >= limit_bytes {
            return;
        }
        let Ok(kind) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if kind.is_dir() {
            gather_files(&path, data, limit_bytes);
        } else if kind.is_file()
            && let Ok(bytes) = std::fs::read(&path)
        {
            data.extend_from_slice(&bytes[..bytes.len().min(limit_bytes / 8)]);
        }
    }
}

#[test]
fn real_files_round_trip_block_by_block() {
    let mut data = Vec::new();
    for directory in REAL_DATA_DIRECTORIES {
        // A third of the total from each directory, so all three kinds are in.
        let limit_bytes = (data.len() + REAL_DATA_LIMIT_BYTES / 3).min(REAL_DATA_LIMIT_BYTES);
        gather_files(std::path::Path::new(directory), &mut data, limit_bytes);
    }
    assert!(
        data.len() >= BLOCK_SIZE_BYTES,
        "no files found under {REAL_DATA_DIRECTORIES:?}"
    );
    let mut decompressor = BlockDecompressor::new().expect("context");
    for codec in codecs() {
        let mut compressor = BlockCompressor::new(codec).expect("context");
        let mut compressed_count = 0;
        for block in data.chunks(BLOCK_SIZE_BYTES) {
            check_round_trip(&mut compressor, &mut decompressor, block).expect("a round trip");
            compressed_count += usize::from(
                compressor
                    .compress(block)
                    .expect("compress")
                    .is_compressed(),
            );
        }
        assert!(compressed_count > 0, "{codec}: no real block compressed");
    }
}
