//! Array pools for the end-to-end tests: member files in a test's temporary
//! directory, and `lamina pool create` over them with a redundancy scheme and
//! small segments, as every test of arrays on real files begins.

use std::path::{Path, PathBuf};

use super::lamina_ok;

/// The test arrays' segment size: small, so that a few MiB of client writes
/// fill segments striped over every member.
pub const ARRAY_SEGMENT_SIZE: &str = "1M";

/// Member files of an array, each of the size `pool create` gives it.
pub struct ArrayMembers {
    paths: Vec<PathBuf>,
    /// A size as `pool create` reads it, such as `64M`.
    size: String,
}

impl ArrayMembers {
    /// The files at `paths` (which `pool create` creates), of `size` each.
    pub fn new(paths: impl IntoIterator<Item = PathBuf>, size: &str) -> ArrayMembers {
        let paths: Vec<PathBuf> = paths.into_iter().collect();
        assert!(!paths.is_empty(), "an array has members");
        ArrayMembers {
            paths,
            size: size.to_string(),
        }
    }

    /// The `--flash` (or `--capacity`) argument: `PATH:SIZE` for every
    /// member, comma-separated.
    pub fn argument(&self) -> String {
        self.paths
            .iter()
            .map(|path| format!("{}:{}", path.display(), self.size))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `lamina pool create --flash MEMBERS --redundancy REDUNDANCY --segment-size
/// 1M OPTIONS` on `data_dir`, which must succeed; its JSON answer (the new
/// pool's status).
pub fn create_array_pool(
    data_dir: &Path,
    redundancy: &str,
    members: &ArrayMembers,
    options: &[&str],
) -> serde_json::Value {
    let members = members.argument();
    let mut arguments = vec![
        "pool",
        "create",
        "--flash",
        &members,
        "--redundancy",
        redundancy,
        "--segment-size",
        ARRAY_SEGMENT_SIZE,
    ];
    arguments.extend_from_slice(options);
    lamina_ok(data_dir, &arguments)
}
