//! Certificates made for a test with the `openssl` command: a CA, a server
//! certificate for `localhost` and 127.0.0.1 signed by it, client certificates
//! signed by it, and a second, unrelated CA with a client of its own. The
//! directories are laid out as nbdkit (server) and libnbd and qemu (client)
//! expect them: `ca-cert.pem` with `server-cert.pem`/`server-key.pem` or
//! `client-cert.pem`/`client-key.pem`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every directory a TLS test needs, inside one temporary directory.
pub struct TestCertificates {
    _root: tempfile::TempDir,
    /// The server's directory (`ca-cert.pem`, `server-cert.pem`, `server-key.pem`).
    pub server: PathBuf,
    /// A client signed by the server's CA, subject `CN=alice,O=Lamina test`.
    pub alice: PathBuf,
    /// A second client signed by the server's CA, subject `CN=bob,O=Lamina test`.
    pub bob: PathBuf,
    /// A client signed by another CA (which trusts the server's CA, so only the
    /// server's check of the client certificate can fail).
    pub stranger: PathBuf,
}

/// The subject DN of `alice`'s certificate in RFC 4514 order.
pub const ALICE_DN: &str = "CN=alice,O=Lamina test";
/// The subject DN of `bob`'s certificate.
pub const BOB_DN: &str = "CN=bob,O=Lamina test";

fn openssl(arguments: &[&str], directory: &Path) {
    let output = Command::new("openssl")
        .args(arguments)
        .current_dir(directory)
        .output()
        .expect("openssl runs");
    assert!(
        output.status.success(),
        "openssl {arguments:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A self-signed CA `name` in `directory`: `NAME-cert.pem`, `NAME-key.pem`.
fn make_ca(directory: &Path, name: &str) {
    let (certificate, key) = (format!("{name}-cert.pem"), format!("{name}-key.pem"));
    openssl(
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &certificate,
            "-days",
            "2",
            "-subj",
            &format!("/CN=Lamina test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        directory,
    );
}

/// A certificate for `subject` signed by CA `ca`, written as `cert_file` and
/// `key_file` into `output`; `extensions` are the v3 extensions.
fn make_signed(
    directory: &Path,
    ca: &str,
    subject: &str,
    extensions: &str,
    output: &Path,
    base_name: &str,
) {
    let key = output.join(format!("{base_name}-key.pem"));
    let certificate = output.join(format!("{base_name}-cert.pem"));
    let request = directory.join(format!("{base_name}-{ca}.csr"));
    let extension_file = directory.join(format!("{base_name}-{ca}.ext"));
    std::fs::write(&extension_file, extensions).expect("write extensions");
    let text = |path: &Path| path.to_str().expect("UTF-8 path").to_string();
    openssl(
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &text(&key),
            "-out",
            &text(&request),
            "-subj",
            subject,
        ],
        directory,
    );
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            &text(&request),
            "-CA",
            &format!("{ca}-cert.pem"),
            "-CAkey",
            &format!("{ca}-key.pem"),
            "-CAcreateserial",
            "-out",
            &text(&certificate),
            "-days",
            "2",
            "-extfile",
            &text(&extension_file),
        ],
        directory,
    );
}

// qemu insists on keyEncipherment in both certificates.
const SERVER_EXTENSIONS: &str = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost,IP:127.0.0.1\n";
const CLIENT_EXTENSIONS: &str = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n";

impl TestCertificates {
    /// Makes every certificate; `None` (after saying why) without `openssl`.
    pub fn make() -> Option<Self> {
        super::tool("openssl")?;
        let root = tempfile::tempdir().expect("temporary directory");
        let work = root.path().to_path_buf();
        make_ca(&work, "ca");
        make_ca(&work, "other");
        let directory = |name: &str| {
            let path = work.join(name);
            std::fs::create_dir(&path).expect("create directory");
            path
        };
        let (server, alice, bob, stranger) = (
            directory("server"),
            directory("alice"),
            directory("bob"),
            directory("stranger"),
        );
        make_signed(
            &work,
            "ca",
            "/CN=localhost",
            SERVER_EXTENSIONS,
            &server,
            "server",
        );
        make_signed(
            &work,
            "ca",
            "/O=Lamina test/CN=alice",
            CLIENT_EXTENSIONS,
            &alice,
            "client",
        );
        make_signed(
            &work,
            "ca",
            "/O=Lamina test/CN=bob",
            CLIENT_EXTENSIONS,
            &bob,
            "client",
        );
        make_signed(
            &work,
            "other",
            "/O=Lamina test/CN=alice",
            CLIENT_EXTENSIONS,
            &stranger,
            "client",
        );
        for directory in [&server, &alice, &bob, &stranger] {
            std::fs::copy(work.join("ca-cert.pem"), directory.join("ca-cert.pem"))
                .expect("copy the CA certificate");
        }
        Some(TestCertificates {
            _root: root,
            server,
            alice,
            bob,
            stranger,
        })
    }
}
