//! `nopstream cluster init` through the real binary: the certificate set it writes, key
//! file modes, the refusal to overwrite, and that the files load as the identities they
//! name.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

fn nopstream(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nopstream"))
        .args(args)
        .output()
        .expect("run nopstream")
}

#[test]
fn init_writes_a_ca_and_one_certificate_per_identity_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let c = certs.to_str().unwrap();
    let out = nopstream(&["cluster", "init", c, "--nodes", "3"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for label in [
        "ca",
        "coordinator",
        "node-1",
        "node-2",
        "node-3",
        "cli-admin",
    ] {
        let crt = certs.join(format!("{label}.crt"));
        let key = certs.join(format!("{label}.key"));
        assert!(crt.is_file(), "{} missing", crt.display());
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} has mode {mode:o}", key.display());
    }
    assert!(!certs.join("node-4.crt").exists());
    for label in ["coordinator", "node-2", "cli-admin"] {
        let id: nop_stream_cluster::Identity = label.parse().unwrap();
        let creds = nop_stream_cluster::load_credentials(&certs, &id).unwrap();
        assert_eq!(creds.identity(), &id);
    }
    let ca_before = std::fs::read(certs.join("ca.key")).unwrap();
    let again = nopstream(&["cluster", "init", c, "--nodes", "3"]);
    assert!(!again.status.success(), "a second init must be refused");
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.contains("ca"),
        "the refusal names the existing file: {err}"
    );
    assert_eq!(
        std::fs::read(certs.join("ca.key")).unwrap(),
        ca_before,
        "the CA key is untouched"
    );
    let forced = nopstream(&["cluster", "init", c, "--nodes", "1", "--force"]);
    assert!(forced.status.success());
    assert_ne!(
        std::fs::read(certs.join("ca.key")).unwrap(),
        ca_before,
        "--force issues a new CA"
    );
}
