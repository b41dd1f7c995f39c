//! Packed fragments (format version 10, `docs/format.md`, "Packed extents";
//! decision 0070): turning a 4 KiB block into a compressed fragment of whole
//! 16-byte units (or saying it is better stored as is), and reading a
//! fragment back from the blocks its location touches with both of its
//! checksums checked. Where a fragment goes in its batch is
//! `log::data_layout`'s rule. Everything read from a device is checked and
//! refused with a typed error: decoding must never panic on any input (the
//! `engine_fragment` fuzz target feeds it arbitrary bytes).

use lamina_reduction::{
    BlockCompressor, BlockDecompressor, Codec, CodecError, MINIMUM_SAVING_FRACTION_DENOMINATOR,
    StoredForm, ZSTD_LEVEL_DEFAULT,
};

use crate::BLOCK_BYTES;
use crate::log::location::{FRAGMENT_BLOCKS_MAX, Location, UNIT_BYTES, UNITS_PER_BLOCK};

/// Bytes of a fragment's header: the stored length and codec (2), the crc32c
/// of the decoded block (4).
pub const FRAGMENT_HEADER_BYTES: usize = 6;

/// The longest codec output a fragment holds: a block is compressed only if
/// that saves at least 1/8 (decision 0068), so at most 3,584 bytes.
pub const STORED_BYTES_MAX: usize = BLOCK_BYTES - BLOCK_BYTES / MINIMUM_SAVING_FRACTION_DENOMINATOR;

/// The longest fragment, in units: `ceil((6 + 3584) / 16)` = 225.
pub const FRAGMENT_UNITS_MAX: u32 = units_for_stored_bytes(STORED_BYTES_MAX);

/// The longest fragment, in bytes.
pub const FRAGMENT_BYTES_MAX: usize = FRAGMENT_UNITS_MAX as usize * UNIT_BYTES;

/// The header's stored length has 12 bits; the codec the 4 above them.
const STORED_BYTES_MASK: u16 = 0x0fff;
const CODEC_SHIFT: u32 = 12;
/// The header's codec numbers.
const CODEC_LZ4_ID: u8 = 1;
const CODEC_ZSTD_ID: u8 = 2;

const _: () = assert!(STORED_BYTES_MAX <= STORED_BYTES_MASK as usize);
const _: () = assert!(FRAGMENT_UNITS_MAX == 225);
// A fragment's unit count fits the location's 8 bits (0 meaning a whole block)
// and stays below a block, so a fragment touches at most two blocks.
const _: () = assert!(FRAGMENT_UNITS_MAX < UNITS_PER_BLOCK);
const _: () = assert!(FRAGMENT_BLOCKS_MAX == 2);

/// `ceil((6 + stored_bytes) / 16)`: the units a fragment of that codec output takes.
pub const fn units_for_stored_bytes(stored_bytes: usize) -> u32 {
    let units = (FRAGMENT_HEADER_BYTES + stored_bytes).div_ceil(UNIT_BYTES);
    assert!(units <= u32::MAX as usize);
    #[allow(clippy::cast_possible_truncation)] // checked on the line above
    {
        units as u32
    }
}

/// What encoding a block produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodedBlock<'a> {
    /// Store the block whole (a `Data` record): the codec is off, or it saved less than 1/8.
    AsIs,
    /// Store this fragment in the batch's data region (a `Packed` record).
    Fragment(EncodedFragment<'a>),
}

/// A fragment ready for its batch's data region, with what its record carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodedFragment<'a> {
    bytes: &'a [u8],
    checksum: u32,
}

impl<'a> EncodedFragment<'a> {
    /// The fragment's `unit_count × 16` bytes: header, codec output, zero padding.
    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Its length in units (1..=`FRAGMENT_UNITS_MAX`).
    pub fn unit_count(&self) -> u32 {
        u32::try_from(self.bytes.len() / UNIT_BYTES).expect("at most FRAGMENT_BYTES_MAX")
    }

    /// The crc32c of all its bytes: what the `Packed` record and the map carry.
    pub fn checksum(&self) -> u32 {
        self.checksum
    }
}

/// Encodes blocks as fragments with one codec. One per writer: it reuses the
/// codec's context and its fragment buffer, so encoding allocates nothing
/// after the first block.
pub struct FragmentEncoder {
    compressor: BlockCompressor,
    fragment: Vec<u8>,
}

impl FragmentEncoder {
    pub fn new(codec: Codec) -> Result<FragmentEncoder, CodecError> {
        Ok(FragmentEncoder {
            compressor: BlockCompressor::new(codec)?,
            fragment: Vec::with_capacity(FRAGMENT_BYTES_MAX),
        })
    }

    pub fn codec(&self) -> Codec {
        self.compressor.codec()
    }

    /// The fragment of `block`, or [`EncodedBlock::AsIs`] when it is better
    /// stored whole. The fragment borrows this encoder until the next call.
    pub fn encode(&mut self, block: &[u8; BLOCK_BYTES]) -> Result<EncodedBlock<'_>, CodecError> {
        let codec = self.compressor.codec();
        let codec_id = match codec {
            Codec::Off => return Ok(EncodedBlock::AsIs),
            Codec::Lz4 => CODEC_LZ4_ID,
            Codec::Zstd { .. } => CODEC_ZSTD_ID,
        };
        let stored = match self.compressor.compress(block)? {
            StoredForm::AsIs(_) => return Ok(EncodedBlock::AsIs),
            StoredForm::Compressed(stored) => stored,
        };
        assert!(
            (1..=STORED_BYTES_MAX).contains(&stored.len()),
            "{codec}: kept {} bytes of output",
            stored.len()
        );
        let stored_bytes = u16::try_from(stored.len()).expect("at most STORED_BYTES_MAX");
        let header = stored_bytes | u16::from(codec_id) << CODEC_SHIFT;
        let unit_count = units_for_stored_bytes(stored.len());
        self.fragment.clear();
        self.fragment.extend_from_slice(&header.to_le_bytes());
        self.fragment
            .extend_from_slice(&crc32c::crc32c(block).to_le_bytes());
        self.fragment.extend_from_slice(stored);
        self.fragment.resize(unit_count as usize * UNIT_BYTES, 0);
        Ok(EncodedBlock::Fragment(EncodedFragment {
            bytes: &self.fragment,
            checksum: crc32c::crc32c(&self.fragment),
        }))
    }
}

/// Why a fragment was not read back. `ChecksumMismatch` is damage to the
/// stored units (the read path may rebuild them from parity); the header and
/// decoding errors come after a matching checksum (a writer's bug or a
/// checksum collision); the location and length errors are the caller's.
#[derive(Debug, thiserror::Error)]
pub enum FragmentError {
    #[error("{location}: not a fragment (a whole block is read as is)")]
    NotAFragment { location: Location },
    #[error("{location}: {unit_count} units, longer than a fragment's {FRAGMENT_UNITS_MAX}")]
    TooManyUnits { location: Location, unit_count: u32 },
    #[error(
        "{location}: given {actual_bytes} bytes, expected the {expected_bytes} bytes of the blocks it touches"
    )]
    InputLength {
        location: Location,
        expected_bytes: usize,
        actual_bytes: usize,
    },
    #[error("{location}: checksum mismatch: expected {expected:#010x}, found {actual:#010x}")]
    ChecksumMismatch {
        location: Location,
        expected: u32,
        actual: u32,
    },
    #[error("{location}: header's stored length {stored_bytes} is outside 1..={STORED_BYTES_MAX}")]
    StoredLength {
        location: Location,
        stored_bytes: usize,
    },
    #[error(
        "{location}: header's stored length {stored_bytes} takes {expected_units} units, the location has {unit_count}"
    )]
    UnitCount {
        location: Location,
        stored_bytes: usize,
        expected_units: u32,
        unit_count: u32,
    },
    #[error("{location}: unknown codec {codec_id} (expected 1 = lz4 or 2 = zstd)")]
    UnknownCodec { location: Location, codec_id: u8 },
    #[error("{location}: padding byte {offset} of the fragment is {value:#04x}, not zero")]
    NonzeroPadding {
        location: Location,
        offset: usize,
        value: u8,
    },
    #[error("{location}: the stored bytes do not decode to a block")]
    Undecodable {
        location: Location,
        #[source]
        source: CodecError,
    },
    #[error(
        "{location}: decoded block checksum mismatch: the header says {expected:#010x}, the decoded bytes have {actual:#010x}"
    )]
    DecodedChecksumMismatch {
        location: Location,
        expected: u32,
        actual: u32,
    },
}

/// A fragment's header, as stored.
#[derive(Debug, Clone, Copy)]
struct FragmentHeader {
    stored_bytes: usize,
    codec_id: u8,
    decoded_checksum: u32,
}

impl FragmentHeader {
    fn read(fragment: &[u8; FRAGMENT_HEADER_BYTES]) -> FragmentHeader {
        let [low, high, checksum @ ..] = *fragment;
        let field = u16::from_le_bytes([low, high]);
        FragmentHeader {
            stored_bytes: usize::from(field & STORED_BYTES_MASK),
            codec_id: u8::try_from(field >> CODEC_SHIFT).expect("4 bits"),
            decoded_checksum: u32::from_le_bytes(checksum),
        }
    }
}

/// A fragment's units within `blocks`, the bytes of the blocks `location`
/// touches read together (what a read, a scrub or the cleaner fetches), after
/// checking the location's shape and the input's length. The cleaner moves
/// these bytes as they are.
pub fn fragment_units(location: Location, blocks: &[u8]) -> Result<&[u8], FragmentError> {
    if !location.is_fragment() {
        return Err(FragmentError::NotAFragment { location });
    }
    let unit_count = location.unit_count();
    if unit_count > FRAGMENT_UNITS_MAX {
        return Err(FragmentError::TooManyUnits {
            location,
            unit_count,
        });
    }
    let expected_bytes = location.block_count() as usize * BLOCK_BYTES;
    if blocks.len() != expected_bytes {
        return Err(FragmentError::InputLength {
            location,
            expected_bytes,
            actual_bytes: blocks.len(),
        });
    }
    Ok(&blocks[location.byte_range()])
}

/// Whether the fragment `units` (its header first) was written with
/// `codec`'s family: lz4, or zstd at any level (the level is not stored).
pub fn written_with(units: &[u8], codec: Codec) -> bool {
    let Some(header) = units.first_chunk::<FRAGMENT_HEADER_BYTES>() else {
        return false;
    };
    let codec_id = FragmentHeader::read(header).codec_id;
    match codec {
        Codec::Off => false,
        Codec::Lz4 => codec_id == CODEC_LZ4_ID,
        Codec::Zstd { .. } => codec_id == CODEC_ZSTD_ID,
    }
}

/// Reads fragments back, reusing the codec's decompression context (one per reader).
pub struct FragmentDecoder {
    decompressor: BlockDecompressor,
}

impl FragmentDecoder {
    pub fn new() -> Result<FragmentDecoder, CodecError> {
        Ok(FragmentDecoder {
            decompressor: BlockDecompressor::new()?,
        })
    }

    /// Decodes the fragment at `location` from `blocks` (see
    /// [`fragment_units`]) into `output`, checking the fragment's `checksum`
    /// (from its record or map entry) first, then its header, then the
    /// decoded bytes' crc32c. On an error `output` holds no meaningful data.
    pub fn decode(
        &mut self,
        location: Location,
        blocks: &[u8],
        checksum: u32,
        output: &mut [u8; BLOCK_BYTES],
    ) -> Result<(), FragmentError> {
        let fragment = fragment_units(location, blocks)?;
        let actual = crc32c::crc32c(fragment);
        if actual != checksum {
            return Err(FragmentError::ChecksumMismatch {
                location,
                expected: checksum,
                actual,
            });
        }
        let (header, rest) = fragment
            .split_first_chunk::<FRAGMENT_HEADER_BYTES>()
            .expect("a fragment has at least one unit");
        let header = FragmentHeader::read(header);
        let codec = check_header(location, header, rest)?;
        self.decompressor
            .decompress(codec, &rest[..header.stored_bytes], output)
            .map_err(|source| FragmentError::Undecodable { location, source })?;
        let decoded = crc32c::crc32c(output);
        if decoded != header.decoded_checksum {
            return Err(FragmentError::DecodedChecksumMismatch {
                location,
                expected: header.decoded_checksum,
                actual: decoded,
            });
        }
        Ok(())
    }
}

/// Checks a header against the location and the bytes after it (`rest`: the
/// codec output and padding); the codec to decode with.
fn check_header(
    location: Location,
    header: FragmentHeader,
    rest: &[u8],
) -> Result<Codec, FragmentError> {
    let stored_bytes = header.stored_bytes;
    if !(1..=STORED_BYTES_MAX).contains(&stored_bytes) {
        return Err(FragmentError::StoredLength {
            location,
            stored_bytes,
        });
    }
    let expected_units = units_for_stored_bytes(stored_bytes);
    if expected_units != location.unit_count() {
        return Err(FragmentError::UnitCount {
            location,
            stored_bytes,
            expected_units,
            unit_count: location.unit_count(),
        });
    }
    let codec = match header.codec_id {
        CODEC_LZ4_ID => Codec::Lz4,
        // Any level decodes any zstd frame; the level is not stored.
        CODEC_ZSTD_ID => Codec::zstd(ZSTD_LEVEL_DEFAULT).expect("the default level"),
        codec_id => return Err(FragmentError::UnknownCodec { location, codec_id }),
    };
    let padding = &rest[stored_bytes..];
    if let Some(index) = padding.iter().position(|&value| value != 0) {
        return Err(FragmentError::NonzeroPadding {
            location,
            offset: FRAGMENT_HEADER_BYTES + stored_bytes + index,
            value: padding[index],
        });
    }
    Ok(codec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::data_layout::{DataLayout, Placement};

    /// Where the tests place their data regions.
    const AREA_FIRST_BLOCK: u64 = 1000;

    fn codecs() -> [Codec; 3] {
        [
            Codec::Lz4,
            Codec::zstd(1).expect("level 1"),
            Codec::zstd(3).expect("level 3"),
        ]
    }

    /// Real text: this repository's format description.
    fn text() -> Vec<u8> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/format.md");
        std::fs::read(path).expect("docs/format.md")
    }

    /// A real binary: the first 512 KiB of this test executable.
    fn binary() -> Vec<u8> {
        let mut bytes = std::fs::read(std::env::current_exe().expect("the test executable"))
            .expect("read the test executable");
        bytes.truncate(512 << 10);
        bytes
    }

    fn blocks_of(data: &[u8]) -> Vec<[u8; BLOCK_BYTES]> {
        data.chunks(BLOCK_BYTES)
            .map(|chunk| {
                let mut block = [0; BLOCK_BYTES];
                block[..chunk.len()].copy_from_slice(chunk);
                block
            })
            .collect()
    }

    /// A fragment of `block` (which must compress) and its record's checksum.
    fn fragment_of(codec: Codec, block: &[u8; BLOCK_BYTES]) -> (Vec<u8>, u32) {
        let mut encoder = FragmentEncoder::new(codec).expect("context");
        match encoder.encode(block).expect("encode") {
            EncodedBlock::Fragment(fragment) => (fragment.bytes().to_vec(), fragment.checksum()),
            EncodedBlock::AsIs => panic!("{codec}: the block did not compress"),
        }
    }

    /// The blocks a fragment placed `unit_offset` units into block
    /// `AREA_FIRST_BLOCK` touches, the rest filled with a neighbour's bytes.
    fn placed(fragment: &[u8], unit_offset: u32) -> (Location, Vec<u8>) {
        let unit_count = u32::try_from(fragment.len() / UNIT_BYTES).unwrap();
        let location = Location::fragment(AREA_FIRST_BLOCK, unit_offset, unit_count);
        let mut blocks = vec![0xa5; location.block_count() as usize * BLOCK_BYTES];
        blocks[location.byte_range()].copy_from_slice(fragment);
        (location, blocks)
    }

    fn decode(
        location: Location,
        blocks: &[u8],
        checksum: u32,
    ) -> Result<Box<[u8; BLOCK_BYTES]>, FragmentError> {
        let mut decoder = FragmentDecoder::new().expect("context");
        let mut output = Box::new([0; BLOCK_BYTES]);
        decoder.decode(location, blocks, checksum, &mut output)?;
        Ok(output)
    }

    /// Every block of `data` through the encoder, into a batch's data region
    /// as `log::data_layout` places whole blocks and fragments, and back
    /// through the decoder; how many were stored as fragments.
    fn round_trip_through_a_data_region(codec: Codec, data: &[u8]) -> usize {
        let blocks = blocks_of(data);
        let mut encoder = FragmentEncoder::new(codec).expect("context");
        let mut layout = DataLayout::new();
        let mut region = Vec::new();
        let mut stored = Vec::new();
        for block in &blocks {
            let (placement, bytes, checksum) = match encoder.encode(block).expect("encode") {
                EncodedBlock::AsIs => (layout.place_whole_block(), &block[..], None),
                EncodedBlock::Fragment(fragment) => {
                    let stored_bytes =
                        usize::from(header_field(fragment.bytes()) & STORED_BYTES_MASK);
                    assert_eq!(fragment.unit_count(), units_for_stored_bytes(stored_bytes));
                    assert!(fragment.unit_count() <= FRAGMENT_UNITS_MAX);
                    assert_eq!(fragment.checksum(), crc32c::crc32c(fragment.bytes()));
                    let placement = layout.place_fragment(fragment.unit_count());
                    (placement, fragment.bytes(), Some(fragment.checksum()))
                }
            };
            let location = match placement {
                Placement::WholeBlock { data_index } => {
                    Location::whole_block(AREA_FIRST_BLOCK + u64::from(data_index))
                }
                Placement::Fragment {
                    data_index,
                    unit_offset,
                    unit_count,
                } => Location::fragment(
                    AREA_FIRST_BLOCK + u64::from(data_index),
                    unit_offset,
                    unit_count,
                ),
            };
            region.resize(layout.block_count() as usize * BLOCK_BYTES, 0);
            let start = region_offset(location);
            region[start..start + bytes.len()].copy_from_slice(bytes);
            stored.push((location, checksum));
        }
        let mut decoder = FragmentDecoder::new().expect("context");
        let mut output = [0; BLOCK_BYTES];
        for (index, &(location, checksum)) in stored.iter().enumerate() {
            let first = region_offset(location) - location.byte_range().start;
            let touched = &region[first..first + location.block_count() as usize * BLOCK_BYTES];
            match checksum {
                None => assert_eq!(touched, blocks[index], "{codec}: whole block {index}"),
                Some(checksum) => {
                    decoder
                        .decode(location, touched, checksum, &mut output)
                        .expect("decode");
                    assert_eq!(
                        output, blocks[index],
                        "{codec}: block {index} at {location}"
                    );
                }
            }
        }
        stored
            .iter()
            .filter(|(_, checksum)| checksum.is_some())
            .count()
    }

    /// Where a location's data starts in a region that begins at `AREA_FIRST_BLOCK`.
    fn region_offset(location: Location) -> usize {
        usize::try_from(location.block() - AREA_FIRST_BLOCK).unwrap() * BLOCK_BYTES
            + location.byte_range().start
    }

    #[test]
    fn real_text_and_binary_round_trip_through_a_data_region() {
        for codec in codecs() {
            for (name, data) in [("text", text()), ("binary", binary())] {
                let packed_count = round_trip_through_a_data_region(codec, &data);
                assert!(packed_count > 0, "{codec}: no {name} block compressed");
            }
        }
    }

    #[test]
    fn the_limits_follow_the_codecs_early_abort() {
        assert_eq!(
            STORED_BYTES_MAX,
            lamina_reduction::largest_kept_length(BLOCK_BYTES)
        );
        assert_eq!(units_for_stored_bytes(1), 1);
        assert_eq!(units_for_stored_bytes(10), 1);
        assert_eq!(units_for_stored_bytes(11), 2);
        assert_eq!(units_for_stored_bytes(STORED_BYTES_MAX), 225);
        assert_eq!(FRAGMENT_BYTES_MAX, 3600);
    }

    #[test]
    fn incompressible_data_and_codec_off_are_stored_as_is() {
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut noise = [0; BLOCK_BYTES];
        for byte in &mut noise {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state.to_le_bytes()[0];
        }
        for codec in codecs() {
            let mut encoder = FragmentEncoder::new(codec).expect("context");
            assert_eq!(
                encoder.encode(&noise).expect("encode"),
                EncodedBlock::AsIs,
                "{codec}"
            );
        }
        let mut off = FragmentEncoder::new(Codec::Off).expect("context");
        assert_eq!(
            off.encode(&[0; BLOCK_BYTES]).expect("encode"),
            EncodedBlock::AsIs
        );
    }

    #[test]
    fn encoding_reuses_its_buffer() {
        let blocks = blocks_of(&text());
        let mut encoder = FragmentEncoder::new(Codec::Lz4).expect("context");
        let buffer = encoder.fragment.as_ptr();
        for block in &blocks {
            encoder.encode(block).expect("encode");
        }
        assert_eq!(encoder.fragment.as_ptr(), buffer);
    }

    #[test]
    fn a_fragment_straddling_a_block_boundary_reads_back() {
        let block = blocks_of(&text())[3];
        for codec in codecs() {
            let (fragment, checksum) = fragment_of(codec, &block);
            let unit_count = u32::try_from(fragment.len() / UNIT_BYTES).unwrap();
            let (location, blocks) = placed(&fragment, UNITS_PER_BLOCK - unit_count / 2);
            assert_eq!(location.block_count(), 2);
            assert_eq!(
                *decode(location, &blocks, checksum).expect("decode"),
                block,
                "{codec}"
            );
            // The same fragment ending at its block's end touches one block.
            let (location, blocks) = placed(&fragment, UNITS_PER_BLOCK - unit_count);
            assert_eq!(location.block_count(), 1);
            assert_eq!(*decode(location, &blocks, checksum).expect("decode"), block);
        }
    }

    /// Each byte of the fragment changed (every bit alone, and all of them):
    /// the outer checksum refuses it; with the outer checksum recomputed to
    /// match, a header check, the codec or the inner checksum does, unless
    /// the change decodes to the very same block: a few do, in both codecs
    /// (a match offset moved to an equal earlier string, a zstd frame
    /// header's window size), and then the block returned is still right.
    #[test]
    fn every_flipped_byte_is_caught() {
        let block = blocks_of(&text())[5];
        for codec in [Codec::Lz4, Codec::zstd(3).expect("level 3")] {
            let (fragment, checksum) = fragment_of(codec, &block);
            let (location, blocks) = placed(&fragment, 200);
            let range = location.byte_range();
            let masks = [1, 2, 4, 8, 16, 32, 64, 128, 0xff];
            let mut harmless_count = 0;
            for index in range.clone() {
                for mask in masks {
                    let mut damaged = blocks.clone();
                    damaged[index] ^= mask;
                    assert!(matches!(
                        decode(location, &damaged, checksum),
                        Err(FragmentError::ChecksumMismatch { .. })
                    ));
                    let recomputed = crc32c::crc32c(&damaged[range.clone()]);
                    match decode(location, &damaged, recomputed) {
                        Err(FragmentError::ChecksumMismatch { .. }) => panic!("recomputed"),
                        Err(_) => {}
                        Ok(output) => {
                            assert_eq!(*output, block, "{codec}: byte {index} mask {mask:#x}");
                            harmless_count += 1;
                        }
                    }
                }
            }
            assert!(
                harmless_count * 100 < range.len() * masks.len(),
                "{codec}: {harmless_count} changes decode to the same block"
            );
            // The neighbours' bytes around the fragment are not its business.
            let mut neighbours = blocks.clone();
            neighbours[range.start - 1] ^= 0xff;
            neighbours[range.end] ^= 0xff;
            assert_eq!(
                *decode(location, &neighbours, checksum).expect("decode"),
                block
            );
        }
    }

    /// `fragment` with its header's first two bytes replaced by `field`, and
    /// its units' checksum recomputed.
    fn with_header_field(fragment: &[u8], field: u16) -> (Vec<u8>, u32) {
        let mut changed = fragment.to_vec();
        changed[..2].copy_from_slice(&field.to_le_bytes());
        let checksum = crc32c::crc32c(&changed);
        (changed, checksum)
    }

    fn header_field(fragment: &[u8]) -> u16 {
        u16::from_le_bytes([fragment[0], fragment[1]])
    }

    /// A text block's lz4 fragment whose codec output does not end on a unit boundary.
    fn padded_fragment() -> (Vec<u8>, u32, usize) {
        for block in blocks_of(&text()) {
            let (fragment, checksum) = fragment_of(Codec::Lz4, &block);
            let stored_bytes = usize::from(header_field(&fragment) & STORED_BYTES_MASK);
            if !(FRAGMENT_HEADER_BYTES + stored_bytes).is_multiple_of(UNIT_BYTES) {
                return (fragment, checksum, stored_bytes);
            }
        }
        panic!("no text block with padding");
    }

    #[test]
    fn nonzero_padding_is_refused() {
        let (mut fragment, _, stored_bytes) = padded_fragment();
        *fragment.last_mut().unwrap() = 1;
        let checksum = crc32c::crc32c(&fragment);
        let (location, blocks) = placed(&fragment, 0);
        let error = decode(location, &blocks, checksum).unwrap_err();
        assert!(
            matches!(error, FragmentError::NonzeroPadding { value: 1, .. }),
            "{error}"
        );
        assert!(FRAGMENT_HEADER_BYTES + stored_bytes < fragment.len());
    }

    #[test]
    fn a_unit_count_the_stored_length_does_not_give_is_refused() {
        let (fragment, _, stored_bytes) = padded_fragment();
        // One zero unit more than the header's length takes.
        let mut longer = fragment.clone();
        longer.resize(fragment.len() + UNIT_BYTES, 0);
        let (location, blocks) = placed(&longer, 3);
        let error = decode(location, &blocks, crc32c::crc32c(&longer)).unwrap_err();
        assert!(matches!(error, FragmentError::UnitCount { .. }), "{error}");
        // A header that claims more bytes than the units hold.
        let codec_bits = header_field(&fragment) & !STORED_BYTES_MASK;
        let claimed = u16::try_from(fragment.len()).unwrap();
        let (changed, checksum) = with_header_field(&fragment, codec_bits | claimed);
        let (location, blocks) = placed(&changed, 3);
        let error = decode(location, &blocks, checksum).unwrap_err();
        assert!(matches!(error, FragmentError::UnitCount { .. }), "{error}");
        // Stored lengths outside 1..=3584.
        for stored in [0, STORED_BYTES_MAX + 1, usize::from(STORED_BYTES_MASK)] {
            let field = codec_bits | u16::try_from(stored).unwrap();
            let (changed, checksum) = with_header_field(&fragment, field);
            let (location, blocks) = placed(&changed, 3);
            let error = decode(location, &blocks, checksum).unwrap_err();
            assert!(
                matches!(error, FragmentError::StoredLength { .. }),
                "{stored}: {error}"
            );
        }
        assert!(stored_bytes > 0);
    }

    #[test]
    fn an_unknown_codec_is_refused() {
        let (fragment, _, _) = padded_fragment();
        let stored = header_field(&fragment) & STORED_BYTES_MASK;
        for codec_id in [0_u16, 3, 15] {
            let (changed, checksum) =
                with_header_field(&fragment, stored | codec_id << CODEC_SHIFT);
            let (location, blocks) = placed(&changed, 100);
            let error = decode(location, &blocks, checksum).unwrap_err();
            assert!(
                matches!(error, FragmentError::UnknownCodec { .. }),
                "{codec_id}: {error}"
            );
        }
        // The other known codec: its decoder refuses the bytes.
        let (changed, checksum) =
            with_header_field(&fragment, stored | u16::from(CODEC_ZSTD_ID) << CODEC_SHIFT);
        let (location, blocks) = placed(&changed, 100);
        let error = decode(location, &blocks, checksum).unwrap_err();
        assert!(
            matches!(error, FragmentError::Undecodable { .. }),
            "{error}"
        );
    }

    #[test]
    fn truncated_input_and_wrong_locations_are_refused() {
        let (fragment, checksum, _) = padded_fragment();
        let (location, blocks) = placed(&fragment, 250);
        assert_eq!(location.block_count(), 2);
        for length in [0, 1, BLOCK_BYTES, blocks.len() - 1, blocks.len() + 1] {
            let mut input = blocks.clone();
            input.resize(length, 0);
            let error = decode(location, &input, checksum).unwrap_err();
            assert!(
                matches!(error, FragmentError::InputLength { .. }),
                "{length}: {error}"
            );
        }
        let error = decode(
            Location::whole_block(AREA_FIRST_BLOCK),
            &blocks[..BLOCK_BYTES],
            checksum,
        )
        .unwrap_err();
        assert!(
            matches!(error, FragmentError::NotAFragment { .. }),
            "{error}"
        );
        let too_long = Location::fragment(AREA_FIRST_BLOCK, 0, FRAGMENT_UNITS_MAX + 1);
        let error = decode(too_long, &blocks[..BLOCK_BYTES], checksum).unwrap_err();
        assert!(
            matches!(error, FragmentError::TooManyUnits { .. }),
            "{error}"
        );
        // The codec output cut short, with a header and checksum to match.
        let stored = usize::from(header_field(&fragment) & STORED_BYTES_MASK);
        let mut cut = fragment[..FRAGMENT_HEADER_BYTES + stored / 2].to_vec();
        cut[..2].copy_from_slice(
            &(header_field(&fragment) - u16::try_from(stored - stored / 2).unwrap()).to_le_bytes(),
        );
        cut.resize(cut.len().next_multiple_of(UNIT_BYTES), 0);
        let (location, blocks) = placed(&cut, 7);
        let error = decode(location, &blocks, crc32c::crc32c(&cut)).unwrap_err();
        assert!(
            matches!(error, FragmentError::Undecodable { .. }),
            "{error}"
        );
    }
}
