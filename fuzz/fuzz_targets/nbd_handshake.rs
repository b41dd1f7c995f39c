//! Fuzzes the handshake parsers: client flags, option headers and every option's
//! payload. The input is read as client flags followed by options; when an
//! option header's magic is wrong the bytes are still used as an option number
//! and payload, so the payload parsers see inputs regardless of the magic.

#![no_main]

use lamina_nbd::wire::{
    self, OPTION_HEADER_BYTES, OptionRequest, parse_client_flags, parse_option, parse_option_header,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        let _ = parse_client_flags(data);
        return;
    }
    let _ = parse_client_flags(&data[..4]);
    let mut rest = &data[4..];
    while rest.len() >= OPTION_HEADER_BYTES {
        let (header_bytes, after) = rest.split_at(OPTION_HEADER_BYTES);
        let (option, wanted) = match parse_option_header(header_bytes) {
            Ok(header) => (header.option, header.data_bytes as usize),
            Err(_) => (
                u32::from_be_bytes(header_bytes[8..12].try_into().unwrap()) % 16,
                usize::from(u16::from_be_bytes(header_bytes[12..14].try_into().unwrap())),
            ),
        };
        let take = wanted.min(after.len());
        let (payload, remaining) = after.split_at(take);
        if let Ok(request) = parse_option(option, payload) {
            match request {
                OptionRequest::Go(info) | OptionRequest::Info(info) => {
                    assert!(info.export_name.len() <= wire::STRING_BYTES_MAX);
                    assert_eq!(4 + info.export_name.len() + 2 + 2 * info.requested.len(), payload.len());
                }
                OptionRequest::ListMetaContext(meta) | OptionRequest::SetMetaContext(meta) => {
                    let framing: usize = meta.queries.iter().map(|query| 4 + query.len()).sum();
                    assert_eq!(4 + meta.export_name.len() + 4 + framing, payload.len());
                }
                _ => {}
            }
        }
        rest = remaining;
    }
});
