//! The NBD wire format: constants, pure parsers over byte slices and encoders
//! into byte vectors. Nothing here does I/O, so every parser can be fed arbitrary
//! bytes by the fuzz targets and by the randomized unit test; a parser never
//! panics, it returns a typed error describing what was wrong with the input.

/// `NBDMAGIC`, the first eight bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`, sent by the server after `NBDMAGIC` and by the client before each option.
pub const IHAVEOPT_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of every transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Magic of a structured reply chunk.
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags sent by the server.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;

/// Client flags.
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub const TRANSMISSION_FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TRANSMISSION_FLAG_READ_ONLY: u16 = 1 << 1;
pub const TRANSMISSION_FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TRANSMISSION_FLAG_SEND_FUA: u16 = 1 << 3;
pub const TRANSMISSION_FLAG_ROTATIONAL: u16 = 1 << 4;
pub const TRANSMISSION_FLAG_SEND_TRIM: u16 = 1 << 5;
pub const TRANSMISSION_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TRANSMISSION_FLAG_SEND_DF: u16 = 1 << 7;
pub const TRANSMISSION_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TRANSMISSION_FLAG_SEND_CACHE: u16 = 1 << 10;
pub const TRANSMISSION_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Option types.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
/// Extended headers; not implemented, so answered with `NBD_REP_ERR_UNSUP`.
pub const OPT_EXTENDED_HEADERS: u32 = 11;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

/// Information types of `NBD_OPT_INFO` / `NBD_OPT_GO`.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Command types.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// The protocol's name of a command number, for logs.
pub fn command_name(command: u16) -> &'static str {
    match command {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_CACHE => "CACHE",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "unknown",
    }
}

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flags and chunk types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

/// `base:allocation` status flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context this server knows.
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The context id the server assigns to `base:allocation` in `NBD_OPT_SET_META_CONTEXT`.
pub const BASE_ALLOCATION_CONTEXT_ID: u32 = 1;

/// NBD error values (they match Linux errno numbers).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The spec's hard limit on any string (export names, queries, messages).
pub const STRING_BYTES_MAX: usize = 4096;

/// Size of the client's option header: magic, option, length.
pub const OPTION_HEADER_BYTES: usize = 16;
/// Size of a transmission request header.
pub const REQUEST_HEADER_BYTES: usize = 28;

/// What was wrong with bytes that should have been a header or a payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("expected {expected} bytes, got {actual}")]
    WrongLength { expected: usize, actual: usize },
    #[error("bad magic {0:#x}")]
    BadMagic(u64),
    #[error("unknown client flags {0:#x}")]
    UnknownClientFlags(u32),
    #[error("payload truncated: needed {needed} bytes at byte {at}")]
    Truncated { at: usize, needed: usize },
    #[error("{0} trailing bytes after the payload")]
    TrailingBytes(usize),
    #[error("string is {0} bytes, over the {STRING_BYTES_MAX}-byte limit")]
    StringTooLong(usize),
    #[error("string is not valid UTF-8")]
    NotUtf8,
    #[error("string contains a NUL byte")]
    ContainsNul,
    #[error("option {0} takes no data, got {1} bytes")]
    UnexpectedData(u32, usize),
}

fn be_u16(bytes: &[u8], at: usize) -> Result<u16, WireError> {
    let slice = bytes
        .get(at..at + 2)
        .ok_or(WireError::Truncated { at, needed: 2 })?;
    Ok(u16::from_be_bytes([slice[0], slice[1]]))
}

fn be_u32(bytes: &[u8], at: usize) -> Result<u32, WireError> {
    let slice = bytes
        .get(at..at + 4)
        .ok_or(WireError::Truncated { at, needed: 4 })?;
    Ok(u32::from_be_bytes(slice.try_into().expect("slice of 4")))
}

fn be_u64(bytes: &[u8], at: usize) -> Result<u64, WireError> {
    let slice = bytes
        .get(at..at + 8)
        .ok_or(WireError::Truncated { at, needed: 8 })?;
    Ok(u64::from_be_bytes(slice.try_into().expect("slice of 8")))
}

/// Checks a protocol string: UTF-8, no NUL, at most 4096 bytes.
pub fn parse_string(bytes: &[u8]) -> Result<&str, WireError> {
    if bytes.len() > STRING_BYTES_MAX {
        return Err(WireError::StringTooLong(bytes.len()));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| WireError::NotUtf8)?;
    if text.contains('\0') {
        return Err(WireError::ContainsNul);
    }
    Ok(text)
}

/// Reads a 32-bit length followed by that many bytes of string at `*at`.
fn take_string<'a>(bytes: &'a [u8], at: &mut usize) -> Result<&'a str, WireError> {
    let length = be_u32(bytes, *at)? as usize;
    *at += 4;
    if length > STRING_BYTES_MAX {
        return Err(WireError::StringTooLong(length));
    }
    let slice = bytes.get(*at..*at + length).ok_or(WireError::Truncated {
        at: *at,
        needed: length,
    })?;
    *at += length;
    parse_string(slice)
}

/// The client flags after the server's greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

/// Parses the client's 32-bit flags; any flag the server did not offer is an error
/// (the spec requires the server to drop the connection).
pub fn parse_client_flags(bytes: &[u8]) -> Result<ClientFlags, WireError> {
    if bytes.len() != 4 {
        return Err(WireError::WrongLength {
            expected: 4,
            actual: bytes.len(),
        });
    }
    let flags = be_u32(bytes, 0)?;
    let known = CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES;
    if flags & !known != 0 {
        return Err(WireError::UnknownClientFlags(flags));
    }
    Ok(ClientFlags {
        fixed_newstyle: flags & CLIENT_FLAG_FIXED_NEWSTYLE != 0,
        no_zeroes: flags & CLIENT_FLAG_NO_ZEROES != 0,
    })
}

/// The fixed part of an option the client sends during the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub data_bytes: u32,
}

/// Parses the 16-byte option header (checking the `IHAVEOPT` magic).
pub fn parse_option_header(bytes: &[u8]) -> Result<OptionHeader, WireError> {
    if bytes.len() != OPTION_HEADER_BYTES {
        return Err(WireError::WrongLength {
            expected: OPTION_HEADER_BYTES,
            actual: bytes.len(),
        });
    }
    let magic = be_u64(bytes, 0)?;
    if magic != IHAVEOPT_MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    Ok(OptionHeader {
        option: be_u32(bytes, 8)?,
        data_bytes: be_u32(bytes, 12)?,
    })
}

/// The payload of `NBD_OPT_INFO` and `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest<'a> {
    pub export_name: &'a str,
    pub requested: Vec<u16>,
}

/// The payload of `NBD_OPT_LIST_META_CONTEXT` and `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest<'a> {
    pub export_name: &'a str,
    pub queries: Vec<&'a str>,
}

/// One parsed handshake option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionRequest<'a> {
    ExportName(&'a str),
    Abort,
    List,
    StartTls,
    Info(InfoRequest<'a>),
    Go(InfoRequest<'a>),
    StructuredReply,
    ListMetaContext(MetaContextRequest<'a>),
    SetMetaContext(MetaContextRequest<'a>),
    /// An option this server does not know; answered with `NBD_REP_ERR_UNSUP`.
    Unknown(u32),
}

fn expect_empty(option: u32, data: &[u8]) -> Result<(), WireError> {
    if data.is_empty() {
        Ok(())
    } else {
        Err(WireError::UnexpectedData(option, data.len()))
    }
}

fn expect_consumed(data: &[u8], at: usize) -> Result<(), WireError> {
    if at == data.len() {
        Ok(())
    } else {
        Err(WireError::TrailingBytes(data.len().saturating_sub(at)))
    }
}

fn parse_info_request(data: &[u8]) -> Result<InfoRequest<'_>, WireError> {
    let mut at = 0;
    let export_name = take_string(data, &mut at)?;
    let count = be_u16(data, at)? as usize;
    at += 2;
    let mut requested = Vec::with_capacity(count.min(data.len() / 2));
    for _ in 0..count {
        requested.push(be_u16(data, at)?);
        at += 2;
    }
    expect_consumed(data, at)?;
    Ok(InfoRequest {
        export_name,
        requested,
    })
}

fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest<'_>, WireError> {
    let mut at = 0;
    let export_name = take_string(data, &mut at)?;
    let count = be_u32(data, at)? as usize;
    at += 4;
    // Each query takes at least its 4-byte length, which bounds the allocation
    // by the data actually present rather than by the claimed count.
    let mut queries = Vec::with_capacity(count.min(data.len() / 4));
    for _ in 0..count {
        queries.push(take_string(data, &mut at)?);
    }
    expect_consumed(data, at)?;
    Ok(MetaContextRequest {
        export_name,
        queries,
    })
}

/// Parses the data of option `option`. Unknown options parse successfully as
/// [`OptionRequest::Unknown`] whatever their data.
pub fn parse_option(option: u32, data: &[u8]) -> Result<OptionRequest<'_>, WireError> {
    Ok(match option {
        OPT_EXPORT_NAME => OptionRequest::ExportName(parse_string(data)?),
        OPT_ABORT => OptionRequest::Abort,
        OPT_LIST => {
            expect_empty(option, data)?;
            OptionRequest::List
        }
        OPT_STARTTLS => {
            expect_empty(option, data)?;
            OptionRequest::StartTls
        }
        OPT_INFO => OptionRequest::Info(parse_info_request(data)?),
        OPT_GO => OptionRequest::Go(parse_info_request(data)?),
        OPT_STRUCTURED_REPLY => {
            expect_empty(option, data)?;
            OptionRequest::StructuredReply
        }
        OPT_LIST_META_CONTEXT => OptionRequest::ListMetaContext(parse_meta_context_request(data)?),
        OPT_SET_META_CONTEXT => OptionRequest::SetMetaContext(parse_meta_context_request(data)?),
        other => OptionRequest::Unknown(other),
    })
}

/// A transmission request header as sent on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Parses the 28-byte request header (checking the request magic).
pub fn parse_request_header(bytes: &[u8]) -> Result<RequestHeader, WireError> {
    if bytes.len() != REQUEST_HEADER_BYTES {
        return Err(WireError::WrongLength {
            expected: REQUEST_HEADER_BYTES,
            actual: bytes.len(),
        });
    }
    let magic = be_u32(bytes, 0)?;
    if magic != REQUEST_MAGIC {
        return Err(WireError::BadMagic(u64::from(magic)));
    }
    Ok(RequestHeader {
        flags: be_u16(bytes, 4)?,
        command: be_u16(bytes, 6)?,
        cookie: be_u64(bytes, 8)?,
        offset: be_u64(bytes, 16)?,
        length: be_u32(bytes, 24)?,
    })
}

/// What the connection negotiated, which decides whether a request is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransmissionContext {
    pub export_size_bytes: u64,
    pub read_only: bool,
    pub structured_replies: bool,
    /// Whether `base:allocation` was selected with `NBD_OPT_SET_META_CONTEXT`.
    pub base_allocation: bool,
    pub max_request_bytes: u32,
}

/// A validated command, ready to run against the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        length: u32,
        fua: bool,
        dont_fragment: bool,
    },
    Write {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u32,
        fua: bool,
    },
    Cache {
        offset: u64,
        length: u32,
    },
    WriteZeroes {
        offset: u64,
        length: u32,
        fua: bool,
        may_punch_hole: bool,
        fast_only: bool,
    },
    BlockStatus {
        offset: u64,
        length: u32,
        only_one: bool,
    },
    Disconnect,
}

/// Why a request is refused; `errno` is the NBD error value sent back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub errno: u32,
    pub message: String,
}

fn reject(errno: u32, message: impl Into<String>) -> Rejection {
    Rejection {
        errno,
        message: message.into(),
    }
}

/// Decides what a request means under the negotiated context, or which error it
/// earns. Pure, so that it can be fuzzed together with the header parser.
/// The checks run in order: command and flags, permissions, length, range.
pub fn validate_request(
    header: &RequestHeader,
    context: &TransmissionContext,
) -> Result<Command, Rejection> {
    // A disconnect is honoured whatever flags it carries.
    if header.command == CMD_DISC {
        return Ok(Command::Disconnect);
    }
    check_flags(header, context)?;
    check_permissions(header, context)?;
    check_length(header, context)?;
    check_range(header, context)?;
    Ok(command_of(header))
}

/// Refuses unknown commands and flags not valid for the command.
fn check_flags(header: &RequestHeader, context: &TransmissionContext) -> Result<(), Rejection> {
    let allowed = match header.command {
        CMD_READ if context.structured_replies => CMD_FLAG_FUA | CMD_FLAG_DF,
        CMD_READ => CMD_FLAG_FUA,
        CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_CACHE => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        other => return Err(reject(EINVAL, format!("unknown command {other}"))),
    };
    if header.flags & !allowed != 0 {
        return Err(reject(
            EINVAL,
            format!(
                "flags {:#x} are not valid for command {}",
                header.flags & !allowed,
                header.command
            ),
        ));
    }
    Ok(())
}

/// Refuses changes to a read-only export, and block status without a
/// negotiated context or of zero bytes.
fn check_permissions(
    header: &RequestHeader,
    context: &TransmissionContext,
) -> Result<(), Rejection> {
    let writes = matches!(header.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && context.read_only {
        return Err(reject(EPERM, "export is read-only"));
    }
    if header.command == CMD_BLOCK_STATUS {
        if !context.structured_replies || !context.base_allocation {
            return Err(reject(EINVAL, "no metadata context was negotiated"));
        }
        if header.length == 0 {
            return Err(reject(EINVAL, "block status of zero bytes"));
        }
    }
    Ok(())
}

/// Refuses a READ or WRITE over `max_request_bytes` (`EOVERFLOW` when the
/// client asked for one unfragmented reply).
fn check_length(header: &RequestHeader, context: &TransmissionContext) -> Result<(), Rejection> {
    let length = header.length;
    if matches!(header.command, CMD_READ | CMD_WRITE) && length > context.max_request_bytes {
        let errno = if header.flags & CMD_FLAG_DF != 0 {
            EOVERFLOW
        } else {
            EINVAL
        };
        return Err(reject(
            errno,
            format!(
                "length {length} is over the maximum request size {}",
                context.max_request_bytes
            ),
        ));
    }
    Ok(())
}

/// Refuses a range past the end of the export (`ENOSPC` for the commands
/// that write data).
fn check_range(header: &RequestHeader, context: &TransmissionContext) -> Result<(), Rejection> {
    if header.command == CMD_FLUSH {
        return Ok(());
    }
    let offset = header.offset;
    let length = header.length;
    let end = offset.checked_add(u64::from(length));
    if end.is_none_or(|end| end > context.export_size_bytes) {
        let errno = if matches!(header.command, CMD_WRITE | CMD_WRITE_ZEROES) {
            ENOSPC
        } else {
            EINVAL
        };
        return Err(reject(
            errno,
            format!(
                "{length} bytes at offset {offset} reach past the end of the export ({} bytes)",
                context.export_size_bytes
            ),
        ));
    }
    Ok(())
}

/// The command a header that passed every check means.
fn command_of(header: &RequestHeader) -> Command {
    let flags = header.flags;
    let fua = flags & CMD_FLAG_FUA != 0;
    let offset = header.offset;
    let length = header.length;
    match header.command {
        CMD_READ => Command::Read {
            offset,
            length,
            fua,
            dont_fragment: flags & CMD_FLAG_DF != 0,
        },
        CMD_WRITE => Command::Write {
            offset,
            length,
            fua,
        },
        CMD_FLUSH => Command::Flush,
        CMD_TRIM => Command::Trim {
            offset,
            length,
            fua,
        },
        CMD_CACHE => Command::Cache { offset, length },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            offset,
            length,
            fua,
            may_punch_hole: flags & CMD_FLAG_NO_HOLE == 0,
            fast_only: flags & CMD_FLAG_FAST_ZERO != 0,
        },
        CMD_BLOCK_STATUS => Command::BlockStatus {
            offset,
            length,
            only_one: flags & CMD_FLAG_REQ_ONE != 0,
        },
        CMD_DISC => Command::Disconnect,
        _ => unreachable!("check_flags refuses command {}", header.command),
    }
}

// ---- encoders -------------------------------------------------------------

/// The server's greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn encode_greeting() -> [u8; 18] {
    let mut out = [0u8; 18];
    out[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT_MAGIC.to_be_bytes());
    out[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    out
}

/// One option reply with its data.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let data_bytes = u32::try_from(data.len()).expect("option reply data fits in u32");
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&data_bytes.to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// The data of an `NBD_REP_SERVER` reply.
pub fn encode_server_entry(name: &str, description: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + name.len() + description.len());
    let name_bytes = u32::try_from(name.len()).expect("an export name is far shorter than 4 GiB");
    out.extend_from_slice(&name_bytes.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(description.as_bytes());
    out
}

/// The data of `NBD_REP_INFO` with `NBD_INFO_EXPORT`.
pub fn encode_info_export(size_bytes: u64, transmission_flags: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    out.extend_from_slice(&size_bytes.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    out
}

/// The data of `NBD_REP_INFO` with `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION`.
pub fn encode_info_text(info_type: u16, text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + text.len());
    out.extend_from_slice(&info_type.to_be_bytes());
    out.extend_from_slice(text.as_bytes());
    out
}

/// The data of `NBD_REP_INFO` with `NBD_INFO_BLOCK_SIZE`.
pub fn encode_info_block_size(minimum: u32, preferred: u32, maximum: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(14);
    out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    out.extend_from_slice(&minimum.to_be_bytes());
    out.extend_from_slice(&preferred.to_be_bytes());
    out.extend_from_slice(&maximum.to_be_bytes());
    out
}

/// The data of `NBD_REP_META_CONTEXT`.
pub fn encode_meta_context(context_id: u32, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + name.len());
    out.extend_from_slice(&context_id.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// The reply to `NBD_OPT_EXPORT_NAME`: size, flags and, unless the client set
/// `NO_ZEROES`, 124 bytes of zeroes.
pub fn encode_export_name_reply(
    size_bytes: u64,
    transmission_flags: u16,
    no_zeroes: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(134);
    out.extend_from_slice(&size_bytes.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        out.resize(out.len() + 124, 0);
    }
    out
}

/// A simple reply header (the data of a successful read follows it).
pub fn encode_simple_reply(errno: u32, cookie: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&errno.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// A structured reply chunk header; `payload_bytes` of payload follow it.
pub fn encode_chunk_header(
    flags: u16,
    chunk_type: u16,
    cookie: u64,
    payload_bytes: u32,
) -> [u8; 20] {
    let mut out = [0u8; 20];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&chunk_type.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&payload_bytes.to_be_bytes());
    out
}

/// A complete `NBD_REPLY_TYPE_ERROR` chunk (always final) with a message.
pub fn encode_error_chunk(cookie: u64, errno: u32, message: &str) -> Vec<u8> {
    // The message length field is 16 bits and strings are limited anyway.
    let mut message_bytes = message.as_bytes();
    if message_bytes.len() > STRING_BYTES_MAX {
        message_bytes = &message_bytes[..STRING_BYTES_MAX];
        while std::str::from_utf8(message_bytes).is_err() {
            message_bytes = &message_bytes[..message_bytes.len() - 1];
        }
    }
    let message_length =
        u16::try_from(message_bytes.len()).expect("the message was cut to STRING_BYTES_MAX");
    let payload_bytes = 6 + u32::from(message_length);
    let mut out = Vec::with_capacity(20 + 6 + message_bytes.len());
    out.extend_from_slice(&encode_chunk_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        payload_bytes,
    ));
    out.extend_from_slice(&errno.to_be_bytes());
    out.extend_from_slice(&message_length.to_be_bytes());
    out.extend_from_slice(message_bytes);
    out
}

/// A complete `NBD_REPLY_TYPE_OFFSET_HOLE` chunk.
pub fn encode_hole_chunk(cookie: u64, done: bool, offset: u64, hole_bytes: u32) -> [u8; 32] {
    assert!(
        hole_bytes > 0,
        "a hole chunk must describe at least one byte"
    );
    let mut out = [0u8; 32];
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    out[0..20].copy_from_slice(&encode_chunk_header(
        flags,
        REPLY_TYPE_OFFSET_HOLE,
        cookie,
        12,
    ));
    out[20..28].copy_from_slice(&offset.to_be_bytes());
    out[28..32].copy_from_slice(&hole_bytes.to_be_bytes());
    out
}

/// One `base:allocation` descriptor of a block-status reply: a run of
/// `length_bytes` with the `STATE_*` flags in `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStatusDescriptor {
    pub length_bytes: u32,
    pub status: u32,
}

/// A complete `NBD_REPLY_TYPE_BLOCK_STATUS` chunk (final) for one context.
pub fn encode_block_status_chunk(
    cookie: u64,
    context_id: u32,
    descriptors: &[BlockStatusDescriptor],
) -> Vec<u8> {
    assert!(!descriptors.is_empty(), "block status needs a descriptor");
    let payload_bytes = 4 + 8 * descriptors.len();
    let mut out = Vec::with_capacity(20 + payload_bytes);
    out.extend_from_slice(&encode_chunk_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_BLOCK_STATUS,
        cookie,
        u32::try_from(payload_bytes).expect("descriptor count is bounded"),
    ));
    out.extend_from_slice(&context_id.to_be_bytes());
    for descriptor in descriptors {
        out.extend_from_slice(&descriptor.length_bytes.to_be_bytes());
        out.extend_from_slice(&descriptor.status.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(command: u16, flags: u16, offset: u64, length: u32) -> RequestHeader {
        RequestHeader {
            flags,
            command,
            cookie: 7,
            offset,
            length,
        }
    }

    fn context() -> TransmissionContext {
        TransmissionContext {
            export_size_bytes: 1 << 20,
            read_only: false,
            structured_replies: true,
            base_allocation: true,
            max_request_bytes: 65536,
        }
    }

    #[test]
    fn request_header_round_trip() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        bytes.extend_from_slice(&1u16.to_be_bytes());
        bytes.extend_from_slice(&CMD_WRITE.to_be_bytes());
        bytes.extend_from_slice(&99u64.to_be_bytes());
        bytes.extend_from_slice(&4096u64.to_be_bytes());
        bytes.extend_from_slice(&512u32.to_be_bytes());
        let header = parse_request_header(&bytes).expect("valid header");
        assert_eq!(header, request(CMD_WRITE, 1, 4096, 512).with_cookie(99));
        bytes[0] ^= 1;
        assert!(matches!(
            parse_request_header(&bytes),
            Err(WireError::BadMagic(_))
        ));
        assert!(parse_request_header(&bytes[..27]).is_err());
    }

    impl RequestHeader {
        fn with_cookie(mut self, cookie: u64) -> Self {
            self.cookie = cookie;
            self
        }
    }

    #[test]
    fn validation_maps_range_and_length_errors() {
        let context = context();
        assert_eq!(errno(request(CMD_READ, 0, 0, 4096), &context), None);
        assert_eq!(
            errno(request(CMD_READ, 0, (1 << 20) - 1, 2), &context),
            Some(EINVAL)
        );
        assert_eq!(
            errno(request(CMD_READ, 0, u64::MAX, 2), &context),
            Some(EINVAL)
        );
        assert_eq!(
            errno(request(CMD_WRITE, 0, 1 << 20, 1), &context),
            Some(ENOSPC)
        );
        assert_eq!(
            errno(request(CMD_WRITE_ZEROES, 0, 1 << 20, 1), &context),
            Some(ENOSPC)
        );
        assert_eq!(
            errno(request(CMD_TRIM, 0, 1 << 20, 1), &context),
            Some(EINVAL)
        );
        assert_eq!(
            errno(request(CMD_READ, 0, 0, 65537), &context),
            Some(EINVAL)
        );
        assert_eq!(
            errno(request(CMD_READ, CMD_FLAG_DF, 0, 65537), &context),
            Some(EOVERFLOW)
        );
        assert_eq!(errno(request(CMD_TRIM, 0, 0, 1 << 20), &context), None);
    }

    /// The errno a request earns under `context`, `None` when it is valid.
    fn errno(header: RequestHeader, context: &TransmissionContext) -> Option<u32> {
        validate_request(&header, context)
            .err()
            .map(|rejection| rejection.errno)
    }

    #[test]
    fn validation_maps_command_permission_and_context_errors() {
        let context = context();
        assert_eq!(errno(request(42, 0, 0, 0), &context), Some(EINVAL));
        assert_eq!(
            errno(request(CMD_WRITE, CMD_FLAG_DF, 0, 1), &context),
            Some(EINVAL)
        );
        assert_eq!(
            errno(request(CMD_BLOCK_STATUS, 0, 0, 0), &context),
            Some(EINVAL)
        );
        let read_only = TransmissionContext {
            read_only: true,
            ..context
        };
        assert_eq!(errno(request(CMD_WRITE, 0, 0, 1), &read_only), Some(EPERM));
        assert_eq!(errno(request(CMD_TRIM, 0, 0, 1), &read_only), Some(EPERM));
        assert_eq!(
            errno(request(CMD_WRITE_ZEROES, 0, 0, 1), &read_only),
            Some(EPERM)
        );
        assert_eq!(errno(request(CMD_READ, 0, 0, 1), &read_only), None);
        let simple = TransmissionContext {
            structured_replies: false,
            base_allocation: false,
            ..context
        };
        assert_eq!(
            errno(request(CMD_READ, CMD_FLAG_DF, 0, 1), &simple),
            Some(EINVAL)
        );
        assert_eq!(
            errno(request(CMD_BLOCK_STATUS, 0, 0, 1), &simple),
            Some(EINVAL)
        );
        assert_eq!(
            validate_request(
                &request(
                    CMD_WRITE_ZEROES,
                    CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                    0,
                    8
                ),
                &context
            ),
            Ok(Command::WriteZeroes {
                offset: 0,
                length: 8,
                fua: false,
                may_punch_hole: false,
                fast_only: true
            })
        );
    }

    #[test]
    fn option_payloads() {
        let mut go = Vec::new();
        go.extend_from_slice(&3u32.to_be_bytes());
        go.extend_from_slice(b"abc");
        go.extend_from_slice(&2u16.to_be_bytes());
        go.extend_from_slice(&INFO_NAME.to_be_bytes());
        go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(
            parse_option(OPT_GO, &go),
            Ok(OptionRequest::Go(InfoRequest {
                export_name: "abc",
                requested: vec![INFO_NAME, INFO_BLOCK_SIZE]
            }))
        );
        assert!(parse_option(OPT_GO, &go[..go.len() - 1]).is_err());
        let mut trailing = go.clone();
        trailing.push(0);
        assert_eq!(
            parse_option(OPT_GO, &trailing),
            Err(WireError::TrailingBytes(1))
        );

        let mut meta = Vec::new();
        meta.extend_from_slice(&0u32.to_be_bytes());
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend_from_slice(&u32::try_from(BASE_ALLOCATION.len()).unwrap().to_be_bytes());
        meta.extend_from_slice(BASE_ALLOCATION.as_bytes());
        assert_eq!(
            parse_option(OPT_SET_META_CONTEXT, &meta),
            Ok(OptionRequest::SetMetaContext(MetaContextRequest {
                export_name: "",
                queries: vec![BASE_ALLOCATION]
            }))
        );
        // A huge claimed query count with no data must fail without allocating.
        let mut lying = Vec::new();
        lying.extend_from_slice(&0u32.to_be_bytes());
        lying.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_option(OPT_LIST_META_CONTEXT, &lying).is_err());
        assert_eq!(
            parse_option(OPT_LIST, b"x"),
            Err(WireError::UnexpectedData(OPT_LIST, 1))
        );
        assert_eq!(
            parse_option(OPT_EXPORT_NAME, b"a\0b"),
            Err(WireError::ContainsNul)
        );
        assert_eq!(
            parse_option(OPT_EXPORT_NAME, &[0xff]),
            Err(WireError::NotUtf8)
        );
        assert_eq!(
            parse_option(77, b"whatever"),
            Ok(OptionRequest::Unknown(77))
        );
    }

    #[test]
    fn client_flags() {
        assert_eq!(
            parse_client_flags(&3u32.to_be_bytes()),
            Ok(ClientFlags {
                fixed_newstyle: true,
                no_zeroes: true
            })
        );
        assert!(parse_client_flags(&4u32.to_be_bytes()).is_err());
        assert!(parse_client_flags(&[0, 0, 0]).is_err());
    }
}
