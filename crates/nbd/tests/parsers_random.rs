//! Feeds thousands of random and mutated byte strings to every wire parser, so
//! that CI exercises them without cargo-fuzz: no input may panic, and whatever
//! parses must re-encode or validate consistently.

// Test code keeps `as` for small sizes and byte patterns (issue 17 converts
// the library and binaries only).
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use lamina_nbd::wire::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Inputs per parser; enough to hit every branch with the mutations below.
const CASES_PER_PARSER: usize = 5_000;

fn valid_options() -> Vec<(u32, Vec<u8>)> {
    let mut go = Vec::new();
    go.extend_from_slice(&4u32.to_be_bytes());
    go.extend_from_slice(b"disk");
    go.extend_from_slice(&2u16.to_be_bytes());
    go.extend_from_slice(&INFO_NAME.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    let mut meta = Vec::new();
    meta.extend_from_slice(&4u32.to_be_bytes());
    meta.extend_from_slice(b"disk");
    meta.extend_from_slice(&2u32.to_be_bytes());
    for query in ["base:allocation", "base:"] {
        meta.extend_from_slice(&(query.len() as u32).to_be_bytes());
        meta.extend_from_slice(query.as_bytes());
    }
    vec![
        (OPT_GO, go.clone()),
        (OPT_INFO, go),
        (OPT_SET_META_CONTEXT, meta.clone()),
        (OPT_LIST_META_CONTEXT, meta),
        (OPT_EXPORT_NAME, b"disk".to_vec()),
        (OPT_LIST, Vec::new()),
        (OPT_STRUCTURED_REPLY, Vec::new()),
    ]
}

fn mutate(rng: &mut SmallRng, input: &mut Vec<u8>) {
    match rng.random_range(0..5) {
        0 if !input.is_empty() => {
            let index = rng.random_range(0..input.len());
            input[index] ^= 1 << rng.random_range(0..8);
        }
        1 if !input.is_empty() => {
            let index = rng.random_range(0..input.len());
            input[index] = rng.random();
        }
        2 => input.truncate(rng.random_range(0..=input.len())),
        3 => {
            let extra = rng.random_range(1..8);
            input.extend((0..extra).map(|_| rng.random::<u8>()));
        }
        _ if input.len() >= 4 => {
            // Lengths are the interesting fields: make one huge or zero.
            let index = rng.random_range(0..input.len() - 3);
            let value: u32 = if rng.random() { u32::MAX } else { 0 };
            input[index..index + 4].copy_from_slice(&value.to_be_bytes());
        }
        _ => {}
    }
}

#[test]
fn option_parsers_survive_random_input() {
    let mut rng = SmallRng::seed_from_u64(0x6e62_6431);
    let seeds = valid_options();
    for (option, data) in &seeds {
        assert!(
            parse_option(*option, data).is_ok(),
            "seed for option {option} parses"
        );
    }
    for case in 0..CASES_PER_PARSER {
        let (option, mut data) = if case % 4 == 0 {
            let length = rng.random_range(0..64);
            (
                rng.random_range(0..16),
                (0..length).map(|_| rng.random()).collect(),
            )
        } else {
            seeds[rng.random_range(0..seeds.len())].clone()
        };
        for _ in 0..rng.random_range(1..4) {
            mutate(&mut rng, &mut data);
        }
        if let Ok(OptionRequest::Go(info) | OptionRequest::Info(info)) = parse_option(option, &data)
        {
            // A parsed request accounts for every byte.
            assert_eq!(
                4 + info.export_name.len() + 2 + 2 * info.requested.len(),
                data.len()
            );
        }
        let mut header = Vec::new();
        header.extend_from_slice(&IHAVEOPT_MAGIC.to_be_bytes());
        header.extend_from_slice(&option.to_be_bytes());
        header.extend_from_slice(&(data.len() as u32).to_be_bytes());
        mutate(&mut rng, &mut header);
        let _ = parse_option_header(&header);
        let _ = parse_client_flags(&data[..data.len().min(4)]);
    }
}

#[test]
fn request_parser_and_validation_survive_random_input() {
    let mut rng = SmallRng::seed_from_u64(0x6e62_6432);
    for _ in 0..CASES_PER_PARSER {
        let mut bytes = Vec::with_capacity(REQUEST_HEADER_BYTES);
        bytes.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        bytes.extend_from_slice(&(1u16 << rng.random_range(0..6) & 0x1f).to_be_bytes());
        bytes.extend_from_slice(&rng.random_range(0u16..10).to_be_bytes());
        bytes.extend_from_slice(&rng.random::<u64>().to_be_bytes());
        let offset: u64 = if rng.random() {
            rng.random_range(0..1 << 21)
        } else {
            rng.random()
        };
        bytes.extend_from_slice(&offset.to_be_bytes());
        let length: u32 = if rng.random() {
            rng.random_range(0..1 << 21)
        } else {
            rng.random()
        };
        bytes.extend_from_slice(&length.to_be_bytes());
        if rng.random_range(0..4) == 0 {
            mutate(&mut rng, &mut bytes);
        }
        let Ok(header) = parse_request_header(&bytes) else {
            continue;
        };
        let context = TransmissionContext {
            export_size_bytes: 1 << 20,
            read_only: rng.random(),
            structured_replies: rng.random(),
            base_allocation: rng.random(),
            max_request_bytes: 1 << 16,
        };
        match validate_request(&header, &context) {
            Ok(Command::Read { offset, length, .. } | Command::Write { offset, length, .. }) => {
                assert!(length <= context.max_request_bytes);
                assert!(offset + u64::from(length) <= context.export_size_bytes);
            }
            Ok(
                Command::Trim { offset, length, .. } | Command::WriteZeroes { offset, length, .. },
            ) => {
                assert!(!context.read_only);
                assert!(offset + u64::from(length) <= context.export_size_bytes);
            }
            Ok(Command::BlockStatus { length, .. }) => {
                assert!(context.base_allocation && length > 0);
            }
            Ok(_) => {}
            Err(rejection) => {
                assert!([EPERM, EINVAL, ENOSPC, EOVERFLOW].contains(&rejection.errno));
            }
        }
    }
}
