//! The pool's front stays thin (issue 43, item 2; decision 0059): `Pool` is
//! the handle clients and the control plane hold, and its methods belong in
//! the front module, `src/pool/mod.rs`, where each delegates to the part of
//! the engine that does the work. Long-running work is a service (a struct
//! that owns its state) started by the supervisor, not more `impl Pool`
//! blocks reaching into the core from every folder.
//!
//! This test fails when a file outside the front holds an `impl Pool`
//! block: the work belongs to a service or to the core's own operations
//! (`impl Inner` in the file of the subsystem), and the front delegates to
//! it.

use std::path::{Path, PathBuf};

/// The front module: where `impl Pool` blocks belong.
const FRONT: &str = "src/pool/mod.rs";

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
fn impl_pool_blocks_are_in_the_front_only() {
    let outside: Vec<String> = files_with_impl_pool()
        .into_iter()
        .filter(|file| file.as_str() != FRONT)
        .collect();
    assert!(
        outside.is_empty(),
        "`impl Pool` outside the front ({FRONT}) in {outside:?}: make the work a \
         service (a struct that owns its state) or an operation of the core, \
         and let the front delegate to it"
    );
}

#[test]
fn the_check_recognises_impl_pool_and_nothing_else() {
    assert!(opens_impl_pool("impl Pool {"));
    assert!(opens_impl_pool("    impl Pool {"));
    assert!(!opens_impl_pool("impl PoolLimits {"));
    assert!(!opens_impl_pool("impl Periodic for Pacer {"));
}
