//! TLS end to end with the real binary: the fixture serving TLS (`upstream --tls-cert
//! --tls-key`) and `run --url https://... --tls-ca` against it over loopback, with
//! certificates made at test time (rcgen). Assertions are on counts and bytes, never on how
//! long anything took.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, SanType};

mod common;

use common::{BIN, Fixture};

/// The fixture serving TLS with `certs`, and `extra` flags.
fn tls_fixture(certs: &Certs, extra: &[&str]) -> Fixture {
    let path = |p: &Path| {
        p.to_str()
            .unwrap_or_else(|| panic!("a UTF-8 temp path"))
            .to_owned()
    };
    let (cert, key) = (path(&certs.cert), path(&certs.key));
    let mut args = vec!["--tls-cert", &cert, "--tls-key", &key];
    args.extend_from_slice(extra);
    Fixture::start(&args)
}

/// A CA and a server certificate for 127.0.0.1 and localhost, as PEM files in a temp dir.
struct Certs {
    dir: PathBuf,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

impl Certs {
    fn new(tag: &str) -> Certs {
        let dir = std::env::temp_dir().join(format!("loadgen-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let ca_key = KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("loadgen test CA {tag}"));
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .unwrap_or_else(|e| panic!("{e}"));
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned()]).unwrap_or_else(|e| panic!("{e}"));
        params
            .subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = params
            .signed_by(&key, &issuer)
            .unwrap_or_else(|e| panic!("{e}"));
        let certs = Certs {
            ca: dir.join("ca.pem"),
            cert: dir.join("cert.pem"),
            key: dir.join("key.pem"),
            dir,
        };
        for (path, text) in [
            (&certs.ca, ca_cert.pem()),
            (&certs.cert, cert.pem()),
            (&certs.key, key.serialize_pem()),
        ] {
            std::fs::write(path, text).unwrap_or_else(|e| panic!("{e}"));
        }
        certs
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A running TLS fixture, killed on drop.
/// `run` against `url` trusting `ca`, with `extra` flags; returns the output and the
/// parsed JSON report (Null when the run wrote none).
fn run(url: &str, ca: &Path, tag: &str, extra: &[&str]) -> (Output, serde_json::Value) {
    let json =
        std::env::temp_dir().join(format!("loadgen-tls-run-{tag}-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&json);
    let out = Command::new(BIN)
        .args(["run", "--url", url, "--tls-ca"])
        .arg(ca)
        .args(["--connections", "2", "--warmup", "0s", "--json"])
        .arg(&json)
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("run {BIN}: {e}"));
    let v = std::fs::read_to_string(&json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    let _ = std::fs::remove_file(&json);
    (out, v)
}

fn errors(v: &serde_json::Value) -> u64 {
    v["errors"]
        .as_object()
        .map_or(u64::MAX, |m| m.values().filter_map(|e| e.as_u64()).sum())
}

#[test]
fn every_request_scenario_runs_over_tls() {
    let certs = Certs::new("scenarios");
    let fx = tls_fixture(&certs, &["--progress", "3"]);
    for scenario in [
        "initialize",
        "tools-call",
        "tools-call-progress",
        "tools-list",
    ] {
        let (out, v) = run(
            &fx.url(),
            &certs.ca,
            scenario,
            &[
                "--scenario",
                scenario,
                "--rate",
                "200",
                "--duration",
                "200ms",
            ],
        );
        assert!(
            out.status.success(),
            "{scenario}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ok = v["requests_ok"].as_u64().unwrap_or(0);
        assert!(ok > 0, "{scenario}: {v}");
        assert_eq!(errors(&v), 0, "{scenario}: {v}");
        assert_eq!(v["tls"], true);
        assert_eq!(v["new_connection"], false);
        let expected_notes = if scenario == "tools-call-progress" {
            3 * ok
        } else {
            0
        };
        assert_eq!(v["notifications"], expected_notes, "{scenario}");
    }
}

/// Results larger than one TLS record and than the fixture's copy threshold (written from
/// shared segments) arrive whole: the client checks every result's bytes.
#[test]
fn large_results_cross_many_records() {
    let certs = Certs::new("large");
    let fx = tls_fixture(&certs, &["--result-bytes", "300000"]);
    let (out, v) = run(
        &fx.url(),
        &certs.ca,
        "large",
        &["--mode", "closed", "--duration", "300ms"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(v["requests_ok"].as_u64().unwrap_or(0) > 0, "{v}");
    assert_eq!(errors(&v), 0, "{v}");
}

#[test]
fn a_new_connection_per_request_handshakes_with_and_without_resumption() {
    let certs = Certs::new("newconn");
    let fx = tls_fixture(&certs, &[]);
    for resumption in ["off", "on"] {
        let (out, v) = run(
            &fx.url(),
            &certs.ca,
            resumption,
            &[
                "--mode",
                "closed",
                "--duration",
                "300ms",
                "--new-connection",
                "--tls-resumption",
                resumption,
            ],
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{resumption}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(v["requests_ok"].as_u64().unwrap_or(0) > 0, "{v}");
        assert_eq!(errors(&v), 0, "{resumption}: {v}");
        assert_eq!(v["new_connection"], true);
        assert_eq!(v["tls_resumption"], resumption);
        assert!(
            stdout.contains(&format!(
                "a new connection per request (TLS resumption {resumption})"
            )),
            "{stdout}"
        );
    }
}

#[test]
fn a_certificate_from_another_ca_is_refused_clearly() {
    let certs = Certs::new("served");
    let other = Certs::new("other");
    let fx = tls_fixture(&certs, &[]);
    let (out, _) = run(
        &fx.url(),
        &other.ca,
        "refused",
        &["--mode", "closed", "--duration", "200ms"],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("TLS handshake")
            && stderr.contains("UnknownIssuer")
            && stderr.contains("--tls-ca"),
        "{stderr}"
    );
}

#[test]
fn a_missing_ca_file_and_a_lone_key_are_refused() {
    let certs = Certs::new("files");
    let fx = tls_fixture(&certs, &[]);
    let (out, _) = run(
        &fx.url(),
        Path::new("/nonexistent/ca.pem"),
        "noca",
        &["--duration", "100ms"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("/nonexistent/ca.pem"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(BIN)
        .args(["upstream", "--listen", "127.0.0.1:0", "--tls-key"])
        .arg(&certs.key)
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-cert is required"));
}
