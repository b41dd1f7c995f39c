//! Fuzzes the transmission request parser and the request validator: the first
//! byte chooses the negotiated context, the rest is read as 28-byte request
//! headers; headers with a wrong magic are also retried with the right one so
//! the validator sees every command, flag, offset and length.

#![no_main]

use lamina_nbd::wire::{
    Command, REQUEST_HEADER_BYTES, REQUEST_MAGIC, TransmissionContext, parse_request_header, validate_request,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let context = TransmissionContext {
        export_size_bytes: if selector & 8 != 0 { u64::MAX } else { 1 << 30 },
        read_only: selector & 1 != 0,
        structured_replies: selector & 2 != 0,
        base_allocation: selector & 4 != 0,
        max_request_bytes: 1 << 25,
    };
    for chunk in rest.chunks(REQUEST_HEADER_BYTES) {
        let mut bytes = chunk.to_vec();
        let header = match parse_request_header(&bytes) {
            Ok(header) => header,
            Err(_) if bytes.len() == REQUEST_HEADER_BYTES => {
                bytes[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
                parse_request_header(&bytes).expect("a full header with the right magic parses")
            }
            Err(_) => continue,
        };
        if let Ok(command) = validate_request(&header, &context) {
            match command {
                Command::Read { offset, length, .. } | Command::Write { offset, length, .. } => {
                    assert!(length <= context.max_request_bytes);
                    assert!(offset.checked_add(u64::from(length)).is_some_and(|end| end <= context.export_size_bytes));
                }
                Command::Trim { .. } | Command::WriteZeroes { .. } => assert!(!context.read_only),
                Command::BlockStatus { .. } => assert!(context.base_allocation && context.structured_replies),
                _ => {}
            }
        }
    }
});
