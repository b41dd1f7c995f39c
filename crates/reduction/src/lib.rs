//! Data reduction for lamina (issue 44): the block codecs a volume can be
//! compressed with (`codec`: off, lz4, zstd:N, parsed and checked), one
//! block's compression with early abort and its checked decompression
//! (`block`), and the estimate of the ratio an image would reach (`estimate`,
//! behind `lamina reduction estimate`), with its dedup figures (`dedup`:
//! distinct blocks by BLAKE3 fingerprint and the index decision 0073 would
//! need). Decision 0068 says which crates, levels and packing granularity,
//! with the measurements.

pub mod block;
pub mod codec;
pub mod dedup;
pub mod estimate;

pub use block::{
    BlockCompressor, BlockDecompressor, CodecError, MINIMUM_SAVING_FRACTION_DENOMINATOR,
    StoredForm, largest_kept_length,
};
pub use codec::{
    Codec, CodecParseError, ZSTD_LEVEL_DEFAULT, ZSTD_LEVEL_MAX, ZSTD_LEVEL_MIN, ZstdLevel,
};
pub use dedup::{DedupCounter, DedupEstimate, IndexEstimate};
pub use estimate::{DedupCodecEstimate, Estimate, EstimateError, Estimator};
