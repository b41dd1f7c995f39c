//! S3 errors a person can read, and the AWS SDKs' environment (issue 42,
//! item 5), through the real `lamina` binary against a real S3 server
//! (SeaweedFS's `weed mini` on loopback, started and stopped by each test):
//! a `pool create --capacity s3://...` that fails says so in one line that
//! names the request, its URL, the HTTP status or the transport failure, and
//! what to check, without repeating any cause; `AWS_ENDPOINT_URL` and
//! `AWS_REGION` work as `--s3-endpoint` and `--s3-region` do, under the same
//! plain-HTTP rule, and the pool then serves through the daemon.

use std::net::TcpListener;
use std::process::{Command, Output};

use lamina_objects::test_support::SeaweedServer;

mod common;

use common::{Daemon, LAMINA, Setup, assert_same, pattern_file, write_file};

const BUCKET: &str = "lamina-tests";

/// The longest text a failure's line may hold twice: longer repeats are a
/// cause printed again. Test prefixes are kept short so that the tier's own
/// `bucket/prefix`, which the request's URL holds too, stays below it.
const REPEAT_CHARACTERS_MAX: usize = 20;

/// The AWS variables a test's commands get only from the test: whatever the
/// machine's environment holds must not reach them.
const AWS_VARIABLES: [&str; 9] = [
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ALLOW_HTTP",
];

/// `lamina pool create` of a pool with 64 MiB of flash and its capacity tier
/// at `capacity`, with `arguments` added and only `environment` of the AWS
/// variables.
fn pool_create(
    setup: &Setup,
    capacity: &str,
    arguments: &[&str],
    environment: &[(&str, &str)],
) -> Output {
    let mut command = Command::new(LAMINA);
    command
        .args(["pool", "create", "--flash"])
        .arg(setup.device("flash.img:64M"))
        .args(["--capacity", capacity, "--segment-size", "1M", "--json"])
        .args(arguments)
        .arg("--data")
        .arg(&setup.data_dir)
        .env("LAMINA_LOG", "warn");
    for variable in AWS_VARIABLES {
        command.env_remove(variable);
    }
    command.envs(environment.iter().copied()).output().unwrap()
}

/// The credentials `server` accepts, as environment variables.
fn credentials(server: &SeaweedServer) -> [(&str, &str); 2] {
    [
        ("AWS_ACCESS_KEY_ID", server.access_key_id()),
        ("AWS_SECRET_ACCESS_KEY", server.secret_access_key()),
    ]
}

/// The failure's stderr, checked to be one line starting `lamina: error:`
/// in which no text longer than `REPEAT_CHARACTERS_MAX` appears twice, and
/// that nothing was created.
fn one_line_failure(setup: &Setup, output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "pool create succeeded: {stderr}");
    let line = stderr.trim_end();
    assert_eq!(line.lines().count(), 1, "not one line: {stderr}");
    assert!(line.starts_with("lamina: error: "), "{stderr}");
    if let Some(repeated) = repeated_text(line, REPEAT_CHARACTERS_MAX + 1) {
        panic!("{repeated:?} appears twice in: {line}");
    }
    assert!(
        !setup.data_dir.join("pool.toml").exists(),
        "nothing is recorded for a failed pool"
    );
    line.to_string()
}

/// Some text of `length` characters that occurs twice in `line` (the two
/// occurrences may overlap).
fn repeated_text(line: &str, length: usize) -> Option<String> {
    let characters: Vec<char> = line.chars().collect();
    let windows: Vec<String> = characters
        .windows(length)
        .map(|window| window.iter().collect())
        .collect();
    let mut seen = std::collections::HashSet::new();
    windows
        .into_iter()
        .find(|window| !seen.insert(window.clone()))
}

/// A loopback port nothing listens on (bound, then released).
fn unused_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[test]
fn the_repeat_check_finds_a_repeated_cause_and_passes_a_plain_line() {
    let repeated =
        "GET failed: Generic S3 error: connection refused: Generic S3 error: connection refused";
    assert!(repeated_text(repeated, REPEAT_CHARACTERS_MAX + 1).is_some());
    assert_eq!(
        repeated_text("GET http://127.0.0.1:1/b/p: could not connect", 21),
        None
    );
}

/// Nothing listens at the endpoint: one line with the request, the URL, the
/// refused connection, the attempts and what to check.
#[test]
fn an_endpoint_where_nothing_listens_fails_in_one_line() {
    let setup = Setup::new();
    let endpoint = format!("http://127.0.0.1:{}", unused_port());
    let output = pool_create(
        &setup,
        &format!("s3://{BUCKET}/e1"),
        &["--s3-endpoint", &endpoint],
        &[
            ("AWS_ACCESS_KEY_ID", "key"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
        ],
    );
    let line = one_line_failure(&setup, &output);
    eprintln!("{line}");
    assert!(
        line.contains(&format!("GET {endpoint}/{BUCKET}/e1/")),
        "{line}"
    );
    assert!(line.contains("could not connect"), "{line}");
    assert!(line.contains("Connection refused"), "{line}");
    assert!(line.contains("attempts"), "{line}");
    assert!(line.contains("check the endpoint"), "{line}");
}

/// A bucket the store does not have, and a secret it does not accept: one
/// line each, with the request, the URL, the HTTP status and S3's error code,
/// and what to check.
#[test]
fn a_missing_bucket_and_wrong_credentials_fail_in_one_line() {
    let Some(server) = SeaweedServer::start_or_skip() else {
        return;
    };
    server.create_bucket(BUCKET).expect("create the bucket");
    let endpoint = server.endpoint();

    let setup = Setup::new();
    let output = pool_create(
        &setup,
        "s3://lamina-absent/e2",
        &["--s3-endpoint", &endpoint],
        &credentials(&server),
    );
    let line = one_line_failure(&setup, &output);
    eprintln!("{line}");
    assert!(
        line.contains(&format!("GET {endpoint}/lamina-absent")),
        "{line}"
    );
    assert!(line.contains("HTTP 404 Not Found"), "{line}");
    assert!(line.contains("NoSuchBucket"), "{line}");
    assert!(line.contains("create the bucket"), "{line}");

    let setup = Setup::new();
    let output = pool_create(
        &setup,
        &format!("s3://{BUCKET}/e3"),
        &["--s3-endpoint", &endpoint],
        &[
            ("AWS_ACCESS_KEY_ID", server.access_key_id()),
            ("AWS_SECRET_ACCESS_KEY", "not-the-secret"),
        ],
    );
    let line = one_line_failure(&setup, &output);
    eprintln!("{line}");
    assert!(
        line.contains(&format!("GET {endpoint}/{BUCKET}/e3/")),
        "{line}"
    );
    assert!(line.contains("HTTP 403 Forbidden"), "{line}");
    assert!(line.contains("SignatureDoesNotMatch"), "{line}");
    assert!(line.contains("check the credentials"), "{line}");
}

/// `AWS_ENDPOINT_URL` and `AWS_REGION` without `--s3-endpoint`: the pool is
/// created (the endpoint and region recorded as the flags' would be) and
/// serves a block written and read back through the daemon, started with
/// the same environment. Plain HTTP from the environment to a host that is
/// not loopback is refused, naming the variable; `--s3-endpoint` wins over
/// `AWS_ENDPOINT_URL_S3`.
#[test]
fn the_environment_names_the_endpoint_and_region_as_the_flags_do() {
    let Some(server) = SeaweedServer::start_or_skip() else {
        return;
    };
    server.create_bucket(BUCKET).expect("create the bucket");
    let endpoint = server.endpoint();
    let [access_key, secret_key] = credentials(&server);
    let environment = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_REGION", "us-east-1"),
        access_key,
        secret_key,
    ];
    let setup = Setup::new();
    let output = pool_create(&setup, &format!("s3://{BUCKET}/env"), &[], &environment);
    assert!(
        output.status.success(),
        "pool create failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let recorded = std::fs::read_to_string(setup.data_dir.join("pool.toml")).unwrap();
    assert!(
        recorded.contains(&format!("endpoint = \"{endpoint}\""))
            && recorded.contains("region = \"us-east-1\""),
        "{recorded}"
    );
    serve_a_block(&setup, &environment);

    let refused = Setup::new();
    let output = pool_create(
        &refused,
        &format!("s3://{BUCKET}/far"),
        &[],
        &[
            ("AWS_ENDPOINT_URL", "http://192.0.2.1:8333"),
            access_key,
            secret_key,
        ],
    );
    let line = one_line_failure(&refused, &output);
    assert!(
        line.contains("refusing plain HTTP") && line.contains("AWS_ENDPOINT_URL"),
        "{line}"
    );

    let flagged = Setup::new();
    let elsewhere = format!("http://127.0.0.1:{}", unused_port());
    let output = pool_create(
        &flagged,
        &format!("s3://{BUCKET}/flag"),
        &["--s3-endpoint", &endpoint],
        &[
            ("AWS_ENDPOINT_URL_S3", elsewhere.as_str()),
            access_key,
            secret_key,
        ],
    );
    assert!(
        output.status.success(),
        "--s3-endpoint lost to AWS_ENDPOINT_URL_S3: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A 1 MiB volume of the pool in `setup`, written and read back through the
/// daemon started with `environment` and no `[object_store]` section.
fn serve_a_block(setup: &Setup, environment: &[(&str, &str)]) {
    let mut command = Command::new(LAMINA);
    command
        .args(["volume", "create", "v", "1048576", "--data"])
        .arg(&setup.data_dir)
        .env("LAMINA_LOG", "warn");
    for variable in AWS_VARIABLES {
        command.env_remove(variable);
    }
    let output = command.envs(environment.iter().copied()).output().unwrap();
    assert!(output.status.success(), "{output:?}");
    let config = "[server]\ntcp_address = \"\"\n[limits]\nflush_interval_ms = 200\n";
    let daemon = Daemon::start_on_pool_with_environment(&setup.data_dir, config, "v", environment);
    let file = setup.root.join("v.pattern");
    pattern_file(&file, 1 << 20, 5);
    write_file(&daemon, "v", &file);
    assert_same(&daemon, "v", &file);
    assert!(daemon.terminate().success());
}
