//! Compressing one block (or one group of consecutive blocks) and reading it
//! back. Early abort: a compressed form that does not save at least
//! `1 / MINIMUM_SAVING_FRACTION_DENOMINATOR` of the input is dropped and the
//! input is stored as it is, so data that does not compress costs one failed
//! attempt and no decompression on reads. Before that attempt, a sample of
//! the input's bytes is counted ([`looks_incompressible`]): bytes as evenly
//! spread as random ones (compressed media, encrypted data, archives) are
//! stored as they are without running the codec, which costs a fraction of
//! a failed attempt. Decompression checks the length it produced against
//! the length the caller recorded at write time.

use crate::codec::Codec;

/// The compressed form is kept only if it saves at least 1/8 of the input
/// (issue 44): a smaller saving is not worth a decompression on every read.
pub const MINIMUM_SAVING_FRACTION_DENOMINATOR: usize = 8;

/// The largest compressed form kept for an input of `input_length` bytes.
pub fn largest_kept_length(input_length: usize) -> usize {
    input_length - input_length / MINIMUM_SAVING_FRACTION_DENOMINATOR
}

/// The incompressibility check counts this many runs of bytes, spread
/// evenly over the input...
pub const INCOMPRESSIBLE_SAMPLE_RUN_COUNT: usize = 4;
/// ...of this many consecutive bytes each (1 KiB of a 4 KiB block): runs
/// rather than every Nth byte, so that data made of fixed-size words is not
/// judged by one byte of each word (every 8th byte of fio's random buffers
/// is often zero, though they do not compress).
pub const INCOMPRESSIBLE_SAMPLE_RUN_BYTES: usize = 256;
const INCOMPRESSIBLE_SAMPLE_BYTES: usize =
    INCOMPRESSIBLE_SAMPLE_RUN_COUNT * INCOMPRESSIBLE_SAMPLE_RUN_BYTES;
/// The check calls an input incompressible when the order-0 entropy of the
/// sampled bytes is at least this many bits per byte, in hundredths: no
/// entropy coder saves 1/8 of such data, and the dictionary coders seldom
/// do. (1,024 samples read a little below the bytes' true entropy: random
/// bytes 7.75 bits or more.) Measured on this machine's files (decision
/// 0070, "Built"): random 4 KiB blocks sample at 7.75 bits or more, fio's
/// random buffers at 7.24 or more, and at 7.10 bits 26 of 17,225 blocks of
/// /usr that compress by 1/8 (0.15 %) are stored whole instead.
pub const INCOMPRESSIBLE_ENTROPY_CENTIBITS_MIN: u32 = 710;

/// Whether the order-0 entropy of `input`'s sampled bytes reaches
/// [`INCOMPRESSIBLE_ENTROPY_CENTIBITS_MIN`]: then no codec is run. Inputs
/// shorter than the sample are left to the codec.
pub fn looks_incompressible(input: &[u8]) -> bool {
    if input.len() < INCOMPRESSIBLE_SAMPLE_BYTES {
        return false;
    }
    let spacing = input.len() / INCOMPRESSIBLE_SAMPLE_RUN_COUNT;
    let mut counts = [0u32; 256];
    for run in 0..INCOMPRESSIBLE_SAMPLE_RUN_COUNT {
        let start = run * spacing;
        for byte in &input[start..start + INCOMPRESSIBLE_SAMPLE_RUN_BYTES] {
            counts[usize::from(*byte)] += 1;
        }
    }
    // n·H = n·log2(n) − Σ c·log2(c), the terms from a table, summed in
    // eight lanes: one running sum waits on each addition before the next
    // (about a fifth of the check's time on a 4 KiB block).
    let count_log_count = count_log_count_table();
    let mut lane_sums = [0.0f32; ENTROPY_SUM_LANES];
    for counts in counts.chunks_exact(ENTROPY_SUM_LANES) {
        for (lane_sum, count) in lane_sums.iter_mut().zip(counts) {
            *lane_sum += count_log_count[*count as usize];
        }
    }
    let sum: f32 = lane_sums.iter().sum();
    let length = INCOMPRESSIBLE_SAMPLE_BYTES as f32;
    let bits_per_byte = length.log2() - sum / length;
    bits_per_byte * 100.0 >= INCOMPRESSIBLE_ENTROPY_CENTIBITS_MIN as f32
}

/// Partial sums the entropy check keeps (a divisor of 256).
const ENTROPY_SUM_LANES: usize = 8;

const _: () = assert!(256 % ENTROPY_SUM_LANES == 0);

/// `c·log2(c)` for every count `c` a sample can hold (0 for 0), made once.
fn count_log_count_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=INCOMPRESSIBLE_SAMPLE_BYTES)
            .map(|count| {
                let count = count as f32;
                if count == 0.0 {
                    0.0
                } else {
                    count * count.log2()
                }
            })
            .collect()
    })
}

/// What a compression attempt produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredForm<'a> {
    /// The compressed bytes, which save at least the minimum.
    Compressed(&'a [u8]),
    /// The input as it is: the codec is off, or the saving was too small.
    AsIs(&'a [u8]),
}

impl StoredForm<'_> {
    /// The bytes to store.
    pub fn bytes(&self) -> &[u8] {
        match self {
            StoredForm::Compressed(bytes) | StoredForm::AsIs(bytes) => bytes,
        }
    }

    pub fn is_compressed(&self) -> bool {
        matches!(self, StoredForm::Compressed(_))
    }
}

/// A codec's library failed, or stored bytes did not decode to what was recorded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("{codec}: cannot create a compression context")]
    Context {
        codec: Codec,
        #[source]
        source: std::io::Error,
    },
    #[error("{codec}: compressing {input_length} bytes failed")]
    Compress {
        codec: Codec,
        input_length: usize,
        #[source]
        source: std::io::Error,
    },
    #[error("{codec}: {stored_length} stored bytes do not decode: {reason}")]
    Corrupt {
        codec: Codec,
        stored_length: usize,
        reason: String,
    },
    #[error(
        "{codec}: {stored_length} stored bytes decode to {actual_length} bytes, not {expected_length}"
    )]
    LengthMismatch {
        codec: Codec,
        stored_length: usize,
        expected_length: usize,
        actual_length: usize,
    },
    #[error("codec off stores blocks as they are: there is nothing to decompress")]
    NothingToDecompress,
}

/// Compresses blocks with one codec, reusing its context and output buffer
/// (one per thread: zstd's context is not shared).
pub struct BlockCompressor {
    codec: Codec,
    zstd: Option<zstd::bulk::Compressor<'static>>,
    output: Vec<u8>,
}

impl BlockCompressor {
    pub fn new(codec: Codec) -> Result<BlockCompressor, CodecError> {
        let zstd = match codec {
            Codec::Zstd { level } => Some(zstd_compressor(codec, level.get())?),
            Codec::Off | Codec::Lz4 => None,
        };
        Ok(BlockCompressor {
            codec,
            zstd,
            output: Vec::new(),
        })
    }

    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Compresses `input`, keeping the compressed form only if it saves enough.
    pub fn compress<'a>(&'a mut self, input: &'a [u8]) -> Result<StoredForm<'a>, CodecError> {
        if self.codec != Codec::Off && looks_incompressible(input) {
            return Ok(StoredForm::AsIs(input));
        }
        let compressed_length = match self.codec {
            Codec::Off => return Ok(StoredForm::AsIs(input)),
            Codec::Lz4 => {
                self.output
                    .resize(lz4_flex::block::get_maximum_output_size(input.len()), 0);
                lz4_flex::block::compress_into(input, &mut self.output).map_err(|error| {
                    CodecError::Compress {
                        codec: self.codec,
                        input_length: input.len(),
                        source: std::io::Error::other(error.to_string()),
                    }
                })?
            }
            Codec::Zstd { .. } => {
                let compressor = self.zstd.as_mut().expect("a zstd codec has its context");
                self.output.clear();
                self.output
                    .reserve(zstd::zstd_safe::compress_bound(input.len()));
                compressor
                    .compress_to_buffer(input, &mut self.output)
                    .map_err(|source| CodecError::Compress {
                        codec: self.codec,
                        input_length: input.len(),
                        source,
                    })?
            }
        };
        if compressed_length <= largest_kept_length(input.len()) {
            Ok(StoredForm::Compressed(&self.output[..compressed_length]))
        } else {
            Ok(StoredForm::AsIs(input))
        }
    }
}

/// zstd without the frame's checksum, content size and dictionary id: the
/// engine records the codec and both lengths beside each block (and checks
/// the block's own checksum), so those would be bytes stored twice.
fn zstd_compressor(
    codec: Codec,
    level: i32,
) -> Result<zstd::bulk::Compressor<'static>, CodecError> {
    let context = |source| CodecError::Context { codec, source };
    let mut compressor = zstd::bulk::Compressor::new(level).map_err(context)?;
    compressor.include_checksum(false).map_err(context)?;
    compressor.include_contentsize(false).map_err(context)?;
    compressor.include_dictid(false).map_err(context)?;
    Ok(compressor)
}

/// Reads compressed blocks back, reusing zstd's decompression context.
pub struct BlockDecompressor {
    zstd: zstd::bulk::Decompressor<'static>,
}

impl BlockDecompressor {
    pub fn new() -> Result<BlockDecompressor, CodecError> {
        let zstd = zstd::bulk::Decompressor::new().map_err(|source| CodecError::Context {
            codec: Codec::zstd(crate::codec::ZSTD_LEVEL_DEFAULT).expect("the default level"),
            source,
        })?;
        Ok(BlockDecompressor { zstd })
    }

    /// Decompresses `stored` (compressed with `codec`) into `output`, whose
    /// length is the one recorded at write time; anything else is an error.
    pub fn decompress(
        &mut self,
        codec: Codec,
        stored: &[u8],
        output: &mut [u8],
    ) -> Result<(), CodecError> {
        let corrupt = |reason: String| CodecError::Corrupt {
            codec,
            stored_length: stored.len(),
            reason,
        };
        let actual_length = match codec {
            Codec::Off => return Err(CodecError::NothingToDecompress),
            Codec::Lz4 => lz4_flex::block::decompress_into(stored, output)
                .map_err(|error| corrupt(error.to_string()))?,
            Codec::Zstd { .. } => self
                .zstd
                .decompress_to_buffer(stored, output)
                .map_err(|error| corrupt(error.to_string()))?,
        };
        if actual_length == output.len() {
            Ok(())
        } else {
            Err(CodecError::LengthMismatch {
                codec,
                stored_length: stored.len(),
                expected_length: output.len(),
                actual_length,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_look_incompressible_and_text_and_zeros_do_not() {
        use rand::{RngCore, SeedableRng};

        let mut random = vec![0u8; 4096];
        let mut generator = rand::rngs::SmallRng::seed_from_u64(7);
        for _ in 0..100 {
            generator.fill_bytes(&mut random);
            assert!(super::looks_incompressible(&random));
        }
        let text: Vec<u8> = b"the quick brown fox jumps over the lazy dog; "
            .iter()
            .copied()
            .cycle()
            .take(4096)
            .collect();
        assert!(!super::looks_incompressible(&text));
        assert!(!super::looks_incompressible(&[0u8; 4096]));
        // Too few bytes to judge: the codec decides.
        assert!(!super::looks_incompressible(&random[..512]));
        // Random 64-bit words whose top byte is zero (fio's buffers) do not
        // compress by 1/8 and are judged so.
        let mut words = random.clone();
        for word in words.chunks_exact_mut(8) {
            word[0] = 0;
        }
        assert!(super::looks_incompressible(&words));
    }

    const BLOCK_SIZE_BYTES: usize = 4096;

    fn codecs() -> [Codec; 4] {
        [
            Codec::Off,
            Codec::Lz4,
            Codec::zstd(1).expect("level 1"),
            Codec::zstd(19).expect("level 19"),
        ]
    }

    #[test]
    fn text_compresses_and_reads_back() {
        let text: Vec<u8> = b"a log-structured storage controller "
            .iter()
            .copied()
            .cycle()
            .take(BLOCK_SIZE_BYTES)
            .collect();
        let mut decompressor = BlockDecompressor::new().expect("context");
        for codec in codecs() {
            let mut compressor = BlockCompressor::new(codec).expect("context");
            let stored = compressor
                .compress(&text)
                .expect("compress")
                .bytes()
                .to_vec();
            if codec == Codec::Off {
                assert_eq!(stored, text);
                continue;
            }
            assert!(
                stored.len() < BLOCK_SIZE_BYTES / 8,
                "{codec}: {}",
                stored.len()
            );
            let mut output = vec![0; BLOCK_SIZE_BYTES];
            decompressor
                .decompress(codec, &stored, &mut output)
                .expect("decompress");
            assert_eq!(output, text, "{codec}");
        }
    }

    #[test]
    fn random_data_is_stored_as_is() {
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let noise: Vec<u8> = (0..BLOCK_SIZE_BYTES)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()[0]
            })
            .collect();
        for codec in codecs() {
            let mut compressor = BlockCompressor::new(codec).expect("context");
            let stored = compressor.compress(&noise).expect("compress");
            assert_eq!(stored, StoredForm::AsIs(&noise), "{codec}");
        }
    }

    #[test]
    fn the_saving_limit_is_one_eighth() {
        assert_eq!(largest_kept_length(BLOCK_SIZE_BYTES), 3584);
        assert_eq!(largest_kept_length(8), 7);
    }

    #[test]
    fn a_wrong_recorded_length_or_damaged_bytes_are_errors() {
        let zeros = vec![0; BLOCK_SIZE_BYTES];
        let mut decompressor = BlockDecompressor::new().expect("context");
        for codec in [Codec::Lz4, Codec::zstd(3).expect("level 3")] {
            let mut compressor = BlockCompressor::new(codec).expect("context");
            let stored = compressor
                .compress(&zeros)
                .expect("compress")
                .bytes()
                .to_vec();
            let mut short = vec![0; BLOCK_SIZE_BYTES / 2];
            assert!(decompressor.decompress(codec, &stored, &mut short).is_err());
            let mut long = vec![0; BLOCK_SIZE_BYTES * 2];
            assert!(matches!(
                decompressor.decompress(codec, &stored, &mut long),
                Err(CodecError::LengthMismatch { .. })
            ));
            let mut output = vec![0; BLOCK_SIZE_BYTES];
            assert!(
                decompressor
                    .decompress(codec, &stored[..stored.len() / 2], &mut output)
                    .is_err(),
                "{codec}: a truncated block decoded"
            );
        }
        let mut output = vec![0; BLOCK_SIZE_BYTES];
        assert!(matches!(
            decompressor.decompress(Codec::Off, &zeros, &mut output),
            Err(CodecError::NothingToDecompress)
        ));
    }
}
