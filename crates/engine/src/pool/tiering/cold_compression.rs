//! Cold data compressed harder (issue 44, decision 0074): with the pool's
//! `cold_compression` codec set (config `[tiering] cold_compression`), a
//! block the cleaner moves to the capacity tier (a demotion, or a move out
//! of a capacity victim) is encoded again with that codec before it is
//! appended: a whole block, or a fragment written with the other codec
//! family (lz4, when the cold codec is zstd). The new fragment is kept only
//! when it is at least one unit smaller; otherwise the block moves as it is.
//! NetApp's cold-data compression groups do the same on their capacity
//! tier: data rarely read pays a slower codec once, for space, and the
//! codec's CPU is spent by the cleaner, whose relocations the background
//! budget paces, never by a client's write.
//!
//! The encoding runs before the cleaner takes the state lock for a chunk,
//! on the cleaner's task: the block's form is decided from the victim's
//! contents as read, and the relocation under the lock then moves the new
//! fragment if the maps still hold the old location (else nothing moves, as
//! for any relocation).

use std::cell::RefCell;

use lamina_reduction::Codec;

use crate::BLOCK_BYTES;
use crate::log::batch::block_checksum;
use crate::log::fragment::{EncodedBlock, FragmentEncoder, written_with};
use crate::log::location::{Location, UNIT_BYTES, UNITS_PER_BLOCK};
use crate::pool::io::fragment_read;

thread_local! {
    /// This thread's encoder for the cold codec, made at its first block
    /// (and again if the setting changed between two cleanings).
    static ENCODER: RefCell<Option<FragmentEncoder>> = const { RefCell::new(None) };
}

/// A block encoded again with the cold codec: the new fragment's units and
/// their crc32c (what the relocation record and the map then carry).
pub(in crate::pool) struct Recompressed {
    pub units: Vec<u8>,
    pub checksum: u32,
}

/// The block at `location` (its 4 KiB when whole, its units when a
/// fragment, with `checksum` the map's) encoded with `codec`, if that saves
/// at least one unit; `None` to move it as it is: the codec is off, the
/// fragment is of the same codec family already (its level is not stored),
/// the block does not compress, or it does not match `checksum` (damage: it
/// then moves as it is, and reading it stays an error, as it was).
pub(in crate::pool) fn recompress(
    codec: Codec,
    location: Location,
    data: &[u8],
    checksum: u32,
) -> Option<Recompressed> {
    if codec == Codec::Off {
        return None;
    }
    let mut decoded = [0u8; BLOCK_BYTES];
    let current_units = if location.is_fragment() {
        if written_with(data, codec) {
            return None;
        }
        decode_units(location, data, checksum, &mut decoded)?;
        location.unit_count()
    } else {
        // A damaged block must not be sealed under a fresh checksum: it
        // moves as it is, and reading it stays an error.
        if block_checksum(data) != checksum {
            return None;
        }
        decoded.copy_from_slice(data);
        UNITS_PER_BLOCK
    };
    ENCODER.with_borrow_mut(|encoder| {
        if encoder
            .as_ref()
            .is_none_or(|encoder| encoder.codec() != codec)
        {
            *encoder = FragmentEncoder::new(codec).ok();
        }
        let encoder = encoder.as_mut()?;
        match encoder.encode(&decoded) {
            Ok(EncodedBlock::Fragment(fragment)) if fragment.unit_count() < current_units => {
                debug_assert_eq!(fragment.bytes().len() % UNIT_BYTES, 0);
                Some(Recompressed {
                    units: fragment.bytes().to_vec(),
                    checksum: fragment.checksum(),
                })
            }
            Ok(_) => None,
            Err(error) => {
                tracing::warn!(%codec, %error, "cold compression failed: the block moves as it is");
                None
            }
        }
    })
}

/// Decodes a fragment's `units` (read from its victim) into `output`: laid
/// at the start of a block, where a one-block fragment of that many units
/// would be.
fn decode_units(
    location: Location,
    units: &[u8],
    checksum: u32,
    output: &mut [u8; BLOCK_BYTES],
) -> Option<()> {
    let mut block = [0u8; BLOCK_BYTES];
    block.get_mut(..units.len())?.copy_from_slice(units);
    let alone = Location::fragment(location.block(), 0, location.unit_count());
    fragment_read::decode(alone, &block, checksum, output).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::fragment::FragmentEncoder;

    /// A block of text that compresses (this file's own source).
    fn text_block() -> [u8; BLOCK_BYTES] {
        let source = include_bytes!("cold_compression.rs");
        let mut block = [0u8; BLOCK_BYTES];
        block.copy_from_slice(&source[..BLOCK_BYTES]);
        block
    }

    fn zstd(level: i32) -> Codec {
        Codec::zstd(level).unwrap()
    }

    #[test]
    fn a_whole_block_is_encoded_only_when_it_matches_its_checksum() {
        let block = text_block();
        let location = Location::whole_block(1000);
        let recompressed =
            recompress(zstd(9), location, &block, block_checksum(&block)).expect("text compresses");
        assert!(recompressed.units.len() < BLOCK_BYTES / 2);
        assert_eq!(recompressed.checksum, crc32c::crc32c(&recompressed.units));
        // Damaged on the device: it moves as it is, never sealed anew.
        let mut damaged = block;
        damaged[100] ^= 1;
        assert!(recompress(zstd(9), location, &damaged, block_checksum(&block)).is_none());
        assert!(recompress(Codec::Off, location, &block, block_checksum(&block)).is_none());
    }

    #[test]
    fn an_lz4_fragment_is_encoded_again_and_a_zstd_one_moves_as_it_is() {
        let block = text_block();
        let mut lz4 = FragmentEncoder::new(Codec::Lz4).unwrap();
        let EncodedBlock::Fragment(fragment) = lz4.encode(&block).unwrap() else {
            panic!("text compresses with lz4");
        };
        let units = fragment.bytes().to_vec();
        let location = Location::fragment(2000, 37, fragment.unit_count());
        let recompressed = recompress(zstd(9), location, &units, fragment.checksum())
            .expect("zstd:9 saves units over lz4 on text");
        assert!(recompressed.units.len() < units.len());
        // It decodes to the block.
        let mut decoded = [0u8; BLOCK_BYTES];
        let alone = Location::fragment(
            0,
            0,
            u32::try_from(recompressed.units.len() / UNIT_BYTES).unwrap(),
        );
        decode_units(
            alone,
            &recompressed.units,
            recompressed.checksum,
            &mut decoded,
        )
        .unwrap();
        assert_eq!(decoded, block);
        // Damaged units move as they are.
        let mut damaged = units.clone();
        damaged[20] ^= 1;
        assert!(recompress(zstd(9), location, &damaged, fragment.checksum()).is_none());
        // A zstd fragment (any level) is left alone by a zstd cold codec.
        let mut zstd_encoder = FragmentEncoder::new(zstd(1)).unwrap();
        let EncodedBlock::Fragment(zstd_fragment) = zstd_encoder.encode(&block).unwrap() else {
            panic!("text compresses with zstd");
        };
        let zstd_location = Location::fragment(3000, 0, zstd_fragment.unit_count());
        let zstd_units = zstd_fragment.bytes().to_vec();
        assert!(
            recompress(
                zstd(19),
                zstd_location,
                &zstd_units,
                zstd_fragment.checksum()
            )
            .is_none()
        );
    }
}
