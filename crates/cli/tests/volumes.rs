//! Volume and pool commands without a daemon (the CLI opens the pool itself):
//! the refusals a flag overrides say which flag in the CLI's words, while the
//! engine's and the control plane's own messages name no flag; and the text
//! output, read from the admin API's typed documents, shows the real figures.

mod common;

use common::{lamina, lamina_error, lamina_ok};

/// The part of a refusal before the CLI's hint: the engine's (or control
/// plane's) own message.
fn before_hint<'a>(error: &'a str, hint: &str) -> &'a str {
    let (message, _) = error
        .split_once(hint)
        .unwrap_or_else(|| panic!("no hint {hint:?} in {error:?}"));
    message
}

#[test]
fn refusals_that_a_flag_overrides_name_the_flag_only_in_the_cli() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let image = directory.path().join("pool.img");
    let flash = format!("{}:256M", image.display());
    lamina_ok(&data_dir, &["pool", "create", "--flash", &flash]);
    lamina_ok(&data_dir, &["volume", "create", "db", "64M"]);

    // Shrinking without --force: the engine says it must be forced, the CLI how.
    let error = lamina_error(&data_dir, &["volume", "resize", "db", "--size", "32M"]);
    let engine_message = before_hint(&error, " (pass --force to shrink it)");
    assert!(
        engine_message.contains("discards its tail; the resize must be forced")
            && !engine_message.contains("--force"),
        "{error}"
    );
    assert_eq!(
        lamina_ok(&data_dir, &["volume", "list"])[0]["size_bytes"],
        64 << 20
    );
    let resized = lamina_ok(
        &data_dir,
        &["volume", "resize", "db", "--size", "32M", "--force"],
    );
    assert_eq!(resized["size_bytes"], 32 << 20);

    // A data directory that already describes a pool (the control plane's refusal).
    let error = lamina_error(&data_dir, &["pool", "create", "--flash", &flash]);
    let control_message = before_hint(&error, " (pass --force to replace it)");
    assert!(
        control_message.contains("already describes a pool")
            && !control_message.contains("--force"),
        "{error}"
    );

    // A device holding data (the engine's refusal at create).
    let other_dir = directory.path().join("other");
    let error = lamina_error(
        &other_dir,
        &["pool", "create", "--flash", &image.display().to_string()],
    );
    let engine_message = before_hint(&error, " (pass --force to overwrite it)");
    assert!(
        engine_message.contains("already holds data") && !engine_message.contains("--force"),
        "{error}"
    );

    // An error no flag overrides gets no hint.
    let error = lamina_error(&data_dir, &["volume", "resize", "ghost", "--size", "32M"]);
    assert!(
        error.contains("no such volume: ghost") && !error.contains("--force"),
        "{error}"
    );
}

#[test]
fn text_output_shows_the_typed_documents_figures() {
    let directory = tempfile::tempdir().unwrap();
    let data_dir = directory.path().join("data");
    let flash = format!("{}:256M", directory.path().join("pool.img").display());
    let created = lamina(&data_dir, &["pool", "create", "--flash", &flash]);
    assert!(created.status.success(), "{created:?}");
    let created = String::from_utf8(created.stdout).unwrap();
    assert!(
        created.contains("volumes              0\n")
            && created.contains("integrity            no damage found\n"),
        "{created}"
    );
    lamina_ok(
        &data_dir,
        &["volume", "create", "db", "64M", "--priority", "high"],
    );
    lamina_ok(&data_dir, &["snapshot", "create", "db@monday"]);

    let text = |arguments: &[&str]| {
        let output = lamina(&data_dir, arguments);
        assert!(output.status.success(), "{output:?}");
        String::from_utf8(output.stdout).unwrap()
    };
    let volumes = text(&["volume", "list"]);
    let row = volumes.lines().nth(1).expect("a row for db");
    let columns: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(columns[..3], ["db", "64.0", "MiB"], "{volumes}");
    assert!(
        row.contains(" 1  high     auto") && row.ends_with('-'),
        "{volumes}"
    );
    let status = text(&["pool", "status"]);
    assert!(
        status.contains("volumes              1\n") && status.contains("capacity             "),
        "{status}"
    );
    let snapshots = text(&["snapshot", "list"]);
    assert!(
        snapshots.contains("db@monday") && snapshots.contains("64.0 MiB"),
        "{snapshots}"
    );
    let stats = text(&["volume", "stats", "db"]);
    assert!(
        stats.contains("volume               db\n")
            && stats.contains("policy               priority high, pin auto\n"),
        "{stats}"
    );
    assert_eq!(text(&["volume", "delete", "db"]), "deleted db\n");
}
