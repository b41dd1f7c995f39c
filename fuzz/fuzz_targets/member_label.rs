//! Fuzzes the decoder of the member label every array device carries
//! (`lamina_layout::MemberLabel`). The first input byte chooses whether the
//! rest is used raw (exercising the magic, version, length and checksum
//! checks) or wrapped in a label frame with correct checksums (so that the
//! fuzzer reaches the postcard payload). Decoding must never panic, and
//! whatever decodes must encode and decode again to the same value.

#![no_main]

use lamina_layout::MemberLabel;
use libfuzzer_sys::fuzz_target;

const MAGIC: &[u8; 8] = b"LAMINAML";
const BLOCK_BYTES: usize = 4096;

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut block = vec![0_u8; BLOCK_BYTES.max(24 + payload.len())];
    block[0..8].copy_from_slice(MAGIC);
    block[8..12].copy_from_slice(&1_u32.to_le_bytes());
    block[12..16].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    block[16..20].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let header_checksum = crc32c::crc32c(&block[0..20]);
    block[20..24].copy_from_slice(&header_checksum.to_le_bytes());
    block[24..24 + payload.len()].copy_from_slice(payload);
    block
}

fuzz_target!(|data: &[u8]| {
    let Some((choice, rest)) = data.split_first() else {
        return;
    };
    let bytes = if choice % 2 == 0 { rest.to_vec() } else { framed(rest) };
    if let Ok(label) = MemberLabel::decode(&bytes)
        && label.member_paths.iter().map(String::len).sum::<usize>() < 3000
    {
        let again = MemberLabel::decode(&label.encode()).expect("an encoded label decodes");
        assert_eq!(again, label);
    }
});
