//! This machine's own files as test data (issue 44: data reduction is
//! measured and tested on real data, not patterns made to compress): the
//! regular files under a directory, in a stable order, and their bytes.

use std::path::{Path, PathBuf};

/// The regular files under `directory`, recursively, sorted by path (none
/// if it does not exist).
pub fn files_under(directory: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(directory) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => found.extend(files_under(&path)),
            Ok(kind) if kind.is_file() => found.push(path),
            _ => {}
        }
    }
    found.sort();
    found
}

/// The bytes of the files under `directories` (each in sorted order, one
/// after the other), read until there are at least `bytes_min`; fewer if the
/// machine has no more.
pub fn bytes_of_files(directories: &[&str], bytes_min: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for directory in directories {
        for path in files_under(Path::new(directory)) {
            if bytes.len() >= bytes_min {
                return bytes;
            }
            if let Ok(contents) = std::fs::read(&path) {
                bytes.extend_from_slice(&contents);
            }
        }
    }
    bytes
}
