//! The files lamina keeps in its data directory are owner-only whatever the
//! umask (issue 42, item 12): with `socket_group` the directory is 0710, so a
//! member of that group who knows a file's name could otherwise read or
//! rewrite it, and `pool.toml` decides which devices the daemon writes to.
//! The tests run every lamina process under umask 0 (the umask of this test
//! binary, whose tests all want it), under which a file created with the
//! default mode would be 0666.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{Daemon, Setup, lamina_ok};

/// The mode bits that let the group or others at a file.
const GROUP_AND_OTHER_MODE_BITS: u32 = 0o077;

/// The files a pool created by `pool create` and served once has in its data
/// directory, at least.
const EXPECTED_FILES: [&str; 4] = ["pool.toml", "lock", "cache-contents", "web.token"];

/// Makes every file this process and its children create start from the
/// modes the program asks for, nothing taken away.
fn clear_umask() {
    // SAFETY: umask(2) only sets the process's file creation mask.
    unsafe { libc::umask(0) };
}

/// A daemon config serving the pool `pool create` made, with a web page on
/// a free loopback port (for its token file).
fn config() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("[server]\ntcp_address = \"\"\n[web]\naddress = \"127.0.0.1:{port}\"\n")
}

/// Every regular file under `directory`, walked whole.
fn regular_files(directory: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(directory).unwrap() {
        let path = entry.unwrap().path();
        let metadata = std::fs::symlink_metadata(&path).unwrap();
        if metadata.is_dir() {
            files.extend(regular_files(&path));
        } else if metadata.is_file() {
            files.push(path);
        }
    }
    files
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Every regular file of the data directory is owner-only, and the files a
/// served pool keeps there are among them.
fn assert_owner_only(data_dir: &Path) {
    let files = regular_files(data_dir);
    for file in &files {
        assert_eq!(
            mode(file) & GROUP_AND_OTHER_MODE_BITS,
            0,
            "{} is {:o}",
            file.display(),
            mode(file)
        );
    }
    for expected in EXPECTED_FILES {
        assert!(
            files.contains(&data_dir.join(expected)),
            "no {expected} in {files:?}"
        );
    }
}

#[test]
fn the_data_directory_files_are_owner_only_under_any_umask() {
    clear_umask();
    let setup = Setup::new();
    let flash = setup.device("flash.img:256M");
    lamina_ok(&setup.data_dir, &["pool", "create", "--flash", &flash]);
    lamina_ok(&setup.data_dir, &["volume", "create", "default", "64M"]);
    assert_eq!(mode(&setup.data_dir.join("pool.toml")), 0o600);
    assert_eq!(mode(&setup.data_dir.join("lock")), 0o600);

    let daemon = Daemon::start_on_pool(&setup.data_dir, &config(), "default");
    assert!(daemon.terminate().success());
    assert_owner_only(&setup.data_dir);
    assert_eq!(mode(&setup.data_dir.join("cache-contents")), 0o600);

    // Files an older version left with the umask's modes, and a temporary
    // a crash left behind, are owner-only once the daemon has started.
    let stale_temporary = setup.data_dir.join("pool.toml.new");
    std::fs::write(&stale_temporary, "stale").unwrap();
    for name in ["pool.toml", "lock", "cache-contents", "pool.toml.new"] {
        let path = setup.data_dir.join(name);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    }
    let daemon = Daemon::start_on_pool(&setup.data_dir, &config(), "default");
    assert_eq!(mode(&setup.data_dir.join("pool.toml")), 0o600);
    assert_eq!(mode(&stale_temporary), 0o600);
    assert!(daemon.terminate().success());
    assert_owner_only(&setup.data_dir);
}
