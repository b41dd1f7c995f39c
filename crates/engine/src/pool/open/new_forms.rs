//! After a restore without the flash device (decisions 0056 and 0074):
//! whether a block the cleaner moved in a **new form** after the restored
//! checkpoint (cold compression: a whole block, or a fragment of the other
//! codec family, encoded again with the pool's cold codec and recorded as a
//! `Packed` or `RelocatePacked` record carrying the new units' checksum)
//! holds exactly the contents the restored maps hold for that block.
//!
//! Replay in restore mode applies a move only if it carries what the maps
//! hold (decision 0056); a new form carries another checksum, so the
//! checksum cannot say. Its contents can: the record's units, on the
//! capacity tier, are decoded (their checksum, header and decoded crc32c
//! checked) and compared with what the maps hold at the block the record
//! replaces: a whole block's checksum is the crc32c of its 4096 bytes, so
//! the decoded bytes must have it; a fragment's is the crc32c of its units,
//! so the decoded bytes encoded with the volume's codec must give those
//! units again (the encoders are deterministic; a fragment written with
//! another codec or library version is not reproduced, and stays as the
//! checkpoint has it, lost when that was on flash). The source's address
//! proves nothing on its own: the flash segment it names may have been
//! reused after the checkpoint, on the lost device, for a later version of
//! the same block; and a `Packed` record names no source at all.

use lamina_reduction::{Codec, CodecError};

use crate::BLOCK_BYTES;
use crate::log::batch::Record;
use crate::log::fragment::{EncodedBlock, FragmentDecoder, FragmentEncoder, FragmentError};
use crate::log::location::Location;
use crate::volume::VolumeTable;
use crate::volume::map::Mapping;

/// Why a move was not taken as a new form of the contents the maps hold
/// (it is then skipped, as any move of a version the checkpoint does not
/// have).
#[derive(Debug, thiserror::Error)]
pub(super) enum NotHeldContents {
    #[error("not a move to a fragment")]
    NotAPackedMove,
    #[error("no map holds the block it replaces")]
    NothingHeld,
    #[error("the block it replaces is lost")]
    HeldLost,
    #[error("the maps holding its source disagree on its checksum")]
    HoldersDisagree,
    #[error("its fragment does not read back: {0}")]
    Unreadable(#[from] FragmentError),
    #[error("it decodes to other contents than the whole block held")]
    OtherContents,
    #[error("{codec} does not encode what it decodes to as the fragment held")]
    NotReproduced { codec: Codec },
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// Judges moves in a new form during one replay, reusing a decoder and the
/// encoders it made (a restore may judge thousands).
#[derive(Default)]
pub(super) struct NewFormJudge {
    decoder: Option<FragmentDecoder>,
    encoders: Vec<FragmentEncoder>,
}

impl NewFormJudge {
    /// `Ok` when `record`, a `Packed` or `RelocatePacked` record whose
    /// fragment lies at `location` in `blocks` (the bytes of the batch's
    /// data blocks it touches), replaces at its block mappings that all
    /// hold what the fragment decodes to (see the module's comment).
    pub(super) fn check(
        &mut self,
        volumes: &VolumeTable,
        record: &Record,
        location: Location,
        blocks: &[u8],
    ) -> Result<(), NotHeldContents> {
        let (Record::Packed {
            volume_id,
            checksum,
            ..
        }
        | Record::RelocatePacked {
            volume_id,
            checksum,
            ..
        }) = record
        else {
            return Err(NotHeldContents::NotAPackedMove);
        };
        let held = one_held_mapping(&volumes.moved_mappings(record))?;
        let mut decoded = [0u8; BLOCK_BYTES];
        self.decoder()?
            .decode(location, blocks, *checksum, &mut decoded)?;
        if !held.location.is_fragment() {
            if crc32c::crc32c(&decoded) != held.checksum {
                return Err(NotHeldContents::OtherContents);
            }
            return Ok(());
        }
        self.reproduces(volumes.compression(*volume_id), held, &decoded)
    }

    /// `Ok` when `codec` encodes `decoded` as exactly the fragment `held`
    /// (its units' count and checksum).
    fn reproduces(
        &mut self,
        codec: Codec,
        held: Mapping,
        decoded: &[u8; BLOCK_BYTES],
    ) -> Result<(), NotHeldContents> {
        let encoder = self.encoder(codec)?;
        match encoder.encode(decoded)? {
            EncodedBlock::Fragment(fragment)
                if fragment.unit_count() == held.location.unit_count()
                    && fragment.checksum() == held.checksum =>
            {
                Ok(())
            }
            _ => Err(NotHeldContents::NotReproduced { codec }),
        }
    }

    fn decoder(&mut self) -> Result<&mut FragmentDecoder, NotHeldContents> {
        if self.decoder.is_none() {
            self.decoder = Some(FragmentDecoder::new()?);
        }
        Ok(self.decoder.as_mut().expect("made above"))
    }

    fn encoder(&mut self, codec: Codec) -> Result<&mut FragmentEncoder, NotHeldContents> {
        let index = match self.encoders.iter().position(|e| e.codec() == codec) {
            Some(index) => index,
            None => {
                self.encoders.push(FragmentEncoder::new(codec)?);
                self.encoders.len() - 1
            }
        };
        Ok(&mut self.encoders[index])
    }
}

/// The one mapping every holder has (they all hold the record's source, so
/// the same location; they must agree on its checksum), if it is not lost.
fn one_held_mapping(held: &[Mapping]) -> Result<Mapping, NotHeldContents> {
    let first = *held.first().ok_or(NotHeldContents::NothingHeld)?;
    if held.iter().any(|other| *other != first) {
        return Err(NotHeldContents::HoldersDisagree);
    }
    if first.is_lost() {
        return Err(NotHeldContents::HeldLost);
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::location::UNIT_BYTES;

    /// A block of text (this file's source from `skip` on).
    fn text_block(skip: usize) -> [u8; BLOCK_BYTES] {
        let source = include_bytes!("new_forms.rs");
        let mut block = [0u8; BLOCK_BYTES];
        block.copy_from_slice(&source[skip..skip + BLOCK_BYTES]);
        block
    }

    /// `block` as `codec` encodes it: its units and their checksum.
    fn fragment_of(codec: &str, block: &[u8; BLOCK_BYTES]) -> (Vec<u8>, u32) {
        let mut encoder = FragmentEncoder::new(codec.parse().unwrap()).unwrap();
        let EncodedBlock::Fragment(fragment) = encoder.encode(block).unwrap() else {
            panic!("text compresses with {codec}");
        };
        (fragment.bytes().to_vec(), fragment.checksum())
    }

    fn unit_count(units: &[u8]) -> u32 {
        u32::try_from(units.len() / UNIT_BYTES).unwrap()
    }

    /// Volume 1 of `codec`, mapping logical block 0 to `held`.
    fn table(codec: &str, held: Mapping) -> VolumeTable {
        let mut table = VolumeTable::new();
        let mut nothing = |location| panic!("{location} displaced");
        let create = Record::VolumeCreate {
            volume_id: 1,
            name: "v".to_string(),
            size_bytes: 1 << 20,
            created_unix_seconds: 1,
        };
        table.apply(&create, None, &mut nothing);
        let codec: Codec = codec.parse().unwrap();
        let compression = Record::VolumeCompression {
            volume_id: 1,
            codec: codec.into(),
        };
        table.apply(&compression, None, &mut nothing);
        let write = if held.location.is_fragment() {
            Record::Packed {
                volume_id: 1,
                logical_block: 0,
                unit_count: u8::try_from(held.location.unit_count()).unwrap(),
                checksum: held.checksum,
            }
        } else {
            Record::Data {
                volume_id: 1,
                logical_block: 0,
                checksum: held.checksum,
            }
        };
        table.apply(&write, Some(held.location), &mut nothing);
        table
    }

    /// Judges a `Packed` move of logical block 0 to `units`, and the same
    /// as a `RelocatePacked` from `from`.
    fn judge(table: &VolumeTable, units: &[u8], checksum: u32, from: Location) -> [String; 2] {
        let location = Location::fragment(5000, 0, unit_count(units));
        let mut blocks = vec![0u8; BLOCK_BYTES];
        blocks[..units.len()].copy_from_slice(units);
        let packed = Record::Packed {
            volume_id: 1,
            logical_block: 0,
            unit_count: u8::try_from(unit_count(units)).unwrap(),
            checksum,
        };
        let relocated = Record::RelocatePacked {
            volume_id: 1,
            logical_block: 0,
            from: from.raw(),
            unit_count: u8::try_from(unit_count(units)).unwrap(),
            checksum,
        };
        let mut judge = NewFormJudge::default();
        [packed, relocated].map(
            |record| match judge.check(table, &record, location, &blocks) {
                Ok(()) => "kept".to_string(),
                Err(reason) => reason.to_string(),
            },
        )
    }

    #[test]
    fn a_whole_block_in_a_new_form_is_kept_only_for_its_own_contents() {
        let block = text_block(0);
        let held = Mapping::whole_block(100, crc32c::crc32c(&block));
        let table = table("off", held);
        let (units, checksum) = fragment_of("zstd:9", &block);
        assert_eq!(
            judge(&table, &units, checksum, held.location),
            ["kept", "kept"]
        );
        // A later (or older) version: other bytes, whatever its source.
        let (other, other_checksum) = fragment_of("zstd:9", &text_block(7));
        let verdicts = judge(&table, &other, other_checksum, held.location);
        assert!(
            verdicts
                .iter()
                .all(|verdict| verdict.contains("other contents"))
        );
        // A source no map holds.
        let elsewhere = Location::whole_block(101);
        assert!(judge(&table, &units, checksum, elsewhere)[1].contains("no map holds"));
        // Damaged units prove nothing.
        let mut damaged = units.clone();
        damaged[20] ^= 1;
        assert!(judge(&table, &damaged, checksum, held.location)[0].contains("read back"));
    }

    #[test]
    fn a_fragment_in_a_new_form_is_kept_when_the_volume_codec_makes_the_held_one_again() {
        let block = text_block(0);
        let (lz4, lz4_checksum) = fragment_of("lz4", &block);
        let held = Mapping {
            location: Location::fragment(100, 3, unit_count(&lz4)),
            checksum: lz4_checksum,
        };
        let (units, checksum) = fragment_of("zstd:9", &block);
        assert!(units.len() < lz4.len());
        let lz4_volume = table("lz4", held);
        assert_eq!(
            judge(&lz4_volume, &units, checksum, held.location),
            ["kept", "kept"]
        );
        let (other, other_checksum) = fragment_of("zstd:9", &text_block(7));
        let verdicts = judge(&lz4_volume, &other, other_checksum, held.location);
        assert!(
            verdicts
                .iter()
                .all(|verdict| verdict.contains("does not encode"))
        );
        // Written with a codec the volume no longer has: not reproduced.
        let zstd_volume = table("zstd:1", held);
        let verdicts = judge(&zstd_volume, &units, checksum, held.location);
        assert!(
            verdicts
                .iter()
                .all(|verdict| verdict.contains("does not encode"))
        );
    }
}
