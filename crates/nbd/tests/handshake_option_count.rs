//! The handshake's option limit (issue 42, item 13): a client may send
//! `handshake_options_max` options plus `OPTIONS_PER_LISTED_EXPORT_MAX` per
//! export its largest `NBD_OPT_LIST` reply named, so that a listing client
//! can ask about every export (`nbdinfo --list`, checked with 10,000 volumes
//! in the CLI's `many_exports` test), and a client that sends options without
//! end, listing or not, is still answered `NBD_REP_ERR_POLICY` and cut off.

mod common;

use common::raw::*;
use common::{TestServer, catalog_with};
use lamina_nbd::wire::*;
use lamina_nbd::{OPTIONS_PER_LISTED_EXPORT_MAX, ServerConfig};
use tokio::net::UnixStream;

const MIB: u64 = 1024 * 1024;
/// The option limit of these tests, small so that reaching it is quick.
const TEST_OPTIONS_MAX: u32 = 16;
/// Exports in the listing test's catalog.
const LISTED_EXPORT_COUNT: u32 = 10;

fn config() -> ServerConfig {
    ServerConfig {
        handshake_options_max: TEST_OPTIONS_MAX,
        ..ServerConfig::default()
    }
}

/// Sends `NBD_OPT_STRUCTURED_REPLY` and expects its ACK.
async fn structured_reply(stream: &mut UnixStream) {
    send_option(stream, OPT_STRUCTURED_REPLY, &[]).await;
    assert_eq!(
        option_reply(stream).await,
        (OPT_STRUCTURED_REPLY, REP_ACK, Vec::new())
    );
}

/// Sends one more option and expects the refusal and the close.
async fn expect_cut_off(stream: &mut UnixStream, option: u32, data: &[u8]) {
    send_option(stream, option, data).await;
    let (replied_to, reply_type, message) = option_reply(stream).await;
    assert_eq!((replied_to, reply_type), (option, REP_ERR_POLICY));
    assert_eq!(message, b"too many options in one handshake");
    expect_closed(stream).await;
}

/// Sends `NBD_OPT_LIST`; the number of exports the reply named.
async fn list(stream: &mut UnixStream) -> u32 {
    send_option(stream, OPT_LIST, &[]).await;
    let mut named = 0;
    loop {
        match option_reply(stream).await {
            (OPT_LIST, REP_SERVER, _) => named += 1,
            (OPT_LIST, REP_ACK, _) => return named,
            other => panic!("unexpected reply to LIST: {other:?}"),
        }
    }
}

/// Sends `NBD_OPT_INFO` for `name` and reads its replies to the ACK.
async fn info(stream: &mut UnixStream, name: &str) {
    send_option(stream, OPT_INFO, &go_data(name)).await;
    loop {
        match option_reply(stream).await {
            (OPT_INFO, REP_INFO, _) => {}
            (OPT_INFO, REP_ACK, _) => return,
            other => panic!("unexpected reply to INFO: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sending_endless_options_is_cut_off_at_the_limit() {
    let (catalog, _exports) = catalog_with(&[("disk", MIB)]);
    let server = TestServer::unix(catalog, config()).await;
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    greet(
        &mut stream,
        CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES,
    )
    .await;
    for _ in 0..TEST_OPTIONS_MAX {
        structured_reply(&mut stream).await;
    }
    expect_cut_off(&mut stream, OPT_STRUCTURED_REPLY, &[]).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_earns_options_for_its_exports_once() {
    let names: Vec<String> = (0..LISTED_EXPORT_COUNT)
        .map(|index| format!("export{index}"))
        .collect();
    let exports: Vec<(&str, u64)> = names.iter().map(|name| (name.as_str(), MIB)).collect();
    let (catalog, _exports) = catalog_with(&exports);
    let server = TestServer::unix(catalog, config()).await;
    let allowed = TEST_OPTIONS_MAX + OPTIONS_PER_LISTED_EXPORT_MAX * LISTED_EXPORT_COUNT;
    assert_eq!(
        config().handshake_options_allowed(LISTED_EXPORT_COUNT),
        allowed
    );
    assert!(allowed > TEST_OPTIONS_MAX + 2);

    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    greet(
        &mut stream,
        CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES,
    )
    .await;
    // Listing twice earns the allowance once: it follows the largest
    // listing, not their sum.
    assert_eq!(list(&mut stream).await, LISTED_EXPORT_COUNT);
    assert_eq!(list(&mut stream).await, LISTED_EXPORT_COUNT);
    // Past the fixed limit, asking about the listed exports still works...
    for sent in 2..allowed {
        let name = &names[(sent % LISTED_EXPORT_COUNT) as usize];
        info(&mut stream, name).await;
    }
    // ...up to the allowance, whatever the option.
    expect_cut_off(&mut stream, OPT_INFO, &go_data(&names[0])).await;

    // Without a listing the fixed limit holds, for INFO too.
    let mut stream = UnixStream::connect(&server.socket).await.unwrap();
    greet(
        &mut stream,
        CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES,
    )
    .await;
    for _ in 0..TEST_OPTIONS_MAX {
        info(&mut stream, &names[0]).await;
    }
    expect_cut_off(&mut stream, OPT_INFO, &go_data(&names[0])).await;
    server.stop().await;
}
