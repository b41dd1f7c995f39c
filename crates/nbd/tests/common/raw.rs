//! Raw-socket client helpers for tests that speak the protocol byte by byte:
//! greeting, options, GO, requests and replies, and closed-connection checks.

use std::time::Duration;

use lamina_nbd::wire::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long a test waits for the server to answer or close before failing.
pub const WAIT_MS: u64 = 5_000;

pub async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    within_ms(WAIT_MS, future).await
}

/// Like [`within`], with a bound of the caller's (one derived from a server
/// limit, where [`WAIT_MS`] is not the right one).
pub async fn within_ms<T>(wait_ms: u64, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_millis(wait_ms), future)
        .await
        .unwrap_or_else(|_| panic!("server did not answer within {wait_ms} ms"))
}

/// Reads the greeting and sends client flags.
pub async fn greet<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, client_flags: u32) {
    let mut greeting = [0u8; 18];
    within(stream.read_exact(&mut greeting))
        .await
        .expect("greeting");
    assert_eq!(
        u64::from_be_bytes(greeting[0..8].try_into().unwrap()),
        NBD_MAGIC
    );
    assert_eq!(
        u64::from_be_bytes(greeting[8..16].try_into().unwrap()),
        IHAVEOPT_MAGIC
    );
    assert_eq!(
        u16::from_be_bytes([greeting[16], greeting[17]]),
        FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES
    );
    stream
        .write_all(&client_flags.to_be_bytes())
        .await
        .expect("send flags");
}

pub async fn send_option<S: AsyncWrite + Unpin>(stream: &mut S, option: u32, data: &[u8]) {
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&IHAVEOPT_MAGIC.to_be_bytes());
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    stream.write_all(&bytes).await.expect("send option");
}

/// Reads one option reply: (option, reply type, data).
pub async fn option_reply<S: AsyncRead + Unpin>(stream: &mut S) -> (u32, u32, Vec<u8>) {
    let mut header = [0u8; 20];
    within(stream.read_exact(&mut header))
        .await
        .expect("option reply");
    assert_eq!(
        u64::from_be_bytes(header[0..8].try_into().unwrap()),
        OPTION_REPLY_MAGIC
    );
    let option = u32::from_be_bytes(header[8..12].try_into().unwrap());
    let reply_type = u32::from_be_bytes(header[12..16].try_into().unwrap());
    let length = u32::from_be_bytes(header[16..20].try_into().unwrap());
    let mut data = vec![0u8; length as usize];
    within(stream.read_exact(&mut data))
        .await
        .expect("option reply data");
    (option, reply_type, data)
}

pub fn go_data(name: &str) -> Vec<u8> {
    let mut data = Vec::new();
    data.extend_from_slice(&(name.len() as u32).to_be_bytes());
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    data
}

/// Negotiates `name` with NBD_OPT_GO (simple replies); returns (size, flags).
pub async fn go<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, name: &str) -> (u64, u16) {
    greet(stream, CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).await;
    send_option(stream, OPT_GO, &go_data(name)).await;
    let mut export = None;
    loop {
        let (option, reply_type, data) = option_reply(stream).await;
        assert_eq!(option, OPT_GO);
        match reply_type {
            REP_INFO if u16::from_be_bytes([data[0], data[1]]) == INFO_EXPORT => {
                export = Some((
                    u64::from_be_bytes(data[2..10].try_into().unwrap()),
                    u16::from_be_bytes([data[10], data[11]]),
                ));
            }
            REP_INFO => {}
            REP_ACK => return export.expect("NBD_INFO_EXPORT before the ACK"),
            other => panic!("unexpected reply {other:#x} to GO"),
        }
    }
}

/// The bytes of a request header (no payload).
pub fn request_bytes(flags: u16, command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(28);
    bytes.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    bytes.extend_from_slice(&flags.to_be_bytes());
    bytes.extend_from_slice(&command.to_be_bytes());
    bytes.extend_from_slice(&cookie.to_be_bytes());
    bytes.extend_from_slice(&offset.to_be_bytes());
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes
}

pub async fn send_request<S: AsyncWrite + Unpin>(
    stream: &mut S,
    flags: u16,
    command: u16,
    cookie: u64,
    offset: u64,
    length: u32,
    payload: &[u8],
) {
    let mut bytes = request_bytes(flags, command, cookie, offset, length);
    bytes.extend_from_slice(payload);
    stream.write_all(&bytes).await.expect("send request");
}

/// Reads a simple reply header: (errno, cookie).
pub async fn simple_reply<S: AsyncRead + Unpin>(stream: &mut S) -> (u32, u64) {
    simple_reply_within(stream, WAIT_MS).await
}

/// Like [`simple_reply`], waiting at most `wait_ms`.
pub async fn simple_reply_within<S: AsyncRead + Unpin>(stream: &mut S, wait_ms: u64) -> (u32, u64) {
    let mut header = [0u8; 16];
    within_ms(wait_ms, stream.read_exact(&mut header))
        .await
        .expect("simple reply");
    assert_eq!(
        u32::from_be_bytes(header[0..4].try_into().unwrap()),
        SIMPLE_REPLY_MAGIC
    );
    (
        u32::from_be_bytes(header[4..8].try_into().unwrap()),
        u64::from_be_bytes(header[8..16].try_into().unwrap()),
    )
}

/// Asserts the server closed the connection (no more bytes, end of stream).
pub async fn expect_closed<S: AsyncRead + Unpin>(stream: &mut S) {
    let mut byte = [0u8; 1];
    match within(stream.read(&mut byte)).await {
        Ok(0) => {}
        Err(_) => {}
        Ok(count) => panic!("expected the connection to close, read {count} bytes"),
    }
}

/// Writes and reads back on an established connection to prove it still works.
pub async fn round_trip<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, cookie: u64) {
    round_trip_within(stream, cookie, WAIT_MS).await;
}

/// Like [`round_trip`], waiting at most `wait_ms` for each answer.
pub async fn round_trip_within<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    cookie: u64,
    wait_ms: u64,
) {
    let data = vec![cookie as u8; 512];
    send_request(stream, 0, CMD_WRITE, cookie, 4096, 512, &data).await;
    assert_eq!(simple_reply_within(stream, wait_ms).await, (0, cookie));
    send_request(stream, 0, CMD_READ, cookie + 1, 4096, 512, &[]).await;
    assert_eq!(simple_reply_within(stream, wait_ms).await, (0, cookie + 1));
    let mut back = vec![0u8; 512];
    within_ms(wait_ms, stream.read_exact(&mut back))
        .await
        .expect("read data");
    assert_eq!(back, data);
}
