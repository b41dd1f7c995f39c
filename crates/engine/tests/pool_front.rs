//! The pool's front stays thin (issue 43, item 2; decision 0059): `Pool` is
//! the handle clients and the control plane hold, and its methods belong in
//! the front module, `src/pool/mod.rs`, where each delegates to the part of
//! the engine that does the work. Long-running work is a service (a struct
//! that owns its state) started by the supervisor, not more `impl Pool`
//! blocks reaching into the core from every folder.
//!
//! This test fails when a file outside the front holds an `impl Pool` block,
//! unless the file is one of the exceptions listed here, in one place: the
//! files whose blocks predate the services and are to be converted. A
//! converted file must leave the list (the test fails on a listed file that
//! no longer needs it), so that the list only shrinks.

use std::path::{Path, PathBuf};

/// The front module: where `impl Pool` blocks belong.
const FRONT: &str = "src/pool/mod.rs";

/// Files that still hold `impl Pool` blocks, to be converted into services
/// (or into named operations of the core) and then taken off this list.
const TO_BE_CONVERTED: &[&str] = &[
    // The core: `Pool`'s definition, its batch writes and waits; to become
    // `Core`'s own methods.
    "src/pool/core/mod.rs",
    "src/pool/cleaner/mod.rs",
    "src/pool/io/read.rs",
    "src/pool/io/write.rs",
    "src/pool/open/flash_restore.rs",
    "src/pool/open/mod.rs",
    "src/pool/status.rs",
    "src/pool/tiering/flush.rs",
];

/// Whether `line` opens an `impl Pool` block (not `impl PoolLimits` and
/// the like).
fn opens_impl_pool(line: &str) -> bool {
    let line = line.trim_start();
    line.strip_prefix("impl Pool")
        .is_some_and(|rest| rest.trim_start().starts_with('{'))
}

fn rust_files(directory: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(directory).expect("read the source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(path);
        }
    }
}

/// The files under `src/` (relative to the crate, with `/`) that hold an
/// `impl Pool` block.
fn files_with_impl_pool() -> Vec<String> {
    let crate_root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&crate_root.join("src"), &mut files);
    let mut holding: Vec<String> = files
        .into_iter()
        .filter(|file| {
            let text = std::fs::read_to_string(file).expect("read a source file");
            text.lines().any(opens_impl_pool)
        })
        .map(|file| {
            let relative = file.strip_prefix(crate_root).expect("under the crate");
            let parts: Vec<_> = relative
                .components()
                .map(|part| part.as_os_str().to_string_lossy().into_owned())
                .collect();
            parts.join("/")
        })
        .collect();
    holding.sort();
    holding
}

#[test]
fn impl_pool_blocks_are_in_the_front_or_listed_for_conversion() {
    let holding = files_with_impl_pool();
    let outside: Vec<&String> = holding
        .iter()
        .filter(|file| file.as_str() != FRONT && !TO_BE_CONVERTED.contains(&file.as_str()))
        .collect();
    assert!(
        outside.is_empty(),
        "`impl Pool` outside the front ({FRONT}) in {outside:?}: make the work a \
         service (a struct that owns its state) and let the front delegate to it"
    );
    let converted: Vec<&&str> = TO_BE_CONVERTED
        .iter()
        .filter(|file| !holding.iter().any(|held| held == *file))
        .collect();
    assert!(
        converted.is_empty(),
        "{converted:?} no longer hold `impl Pool`: take them off TO_BE_CONVERTED"
    );
}

#[test]
fn the_check_recognises_impl_pool_and_nothing_else() {
    assert!(opens_impl_pool("impl Pool {"));
    assert!(opens_impl_pool("    impl Pool {"));
    assert!(!opens_impl_pool("impl PoolLimits {"));
    assert!(!opens_impl_pool("impl Periodic for Pacer {"));
}
