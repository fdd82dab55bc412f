//! TLS configs from PEM files: the server side's (certificate chain and key) and the client
//! side's (trust roots: a CA file or the platform's), both with ALPN `http/1.1` and the one
//! crypto provider compiled in. Loaded when the config is checked, again when the gateway
//! starts, and on SIGHUP; the per-connection TLS state lives with the connection
//! (`runtime::tls`), which uses these configs and nothing else from here.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, Connection, Error, RootCertStore, ServerConfig};
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// The one ALPN protocol spoken on both edges.
const ALPN_HTTP11: &[u8] = b"http/1.1";

/// The crypto every config here uses: ring (the only provider compiled in) with its default
/// suites, AES-128-GCM first. Its SHA-256 key schedule runs on the CPU's SHA instructions
/// where ring has none for SHA-384 (a profile of resumed handshakes put 9 % in portable
/// SHA-512 code under AES-256-GCM-SHA384); AES-128 is as safe for this use.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    Arc::new(provider)
}

/// What a `client` binding needs for an `https://` upstream: the config (trust roots,
/// ALPN, the resumption cache shared by every worker) and the name to verify and send
/// as SNI (the URL's host: a DNS name, or an IP address, which is verified but not sent).
#[derive(Clone, Debug)]
pub struct Upstream {
    pub config: Arc<ClientConfig>,
    pub name: ServerName<'static>,
}

impl Upstream {
    /// For the URL host `host`, trusting `ca` (PEM) or the platform's roots.
    pub fn new(host: &str, ca: Option<&Path>) -> Result<Upstream, String> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("{host}: not a name TLS can verify: {e}"))?;
        Ok(Upstream {
            config: client_config(ca)?,
            name,
        })
    }

    /// A client session for one new connection.
    pub fn session(&self) -> Result<Connection, Error> {
        rustls::ClientConnection::new(self.config.clone(), self.name.clone())
            .map(Connection::Client)
    }
}

/// The server side's config: the certificate chain and key from PEM files, ALPN
/// `http/1.1`, TLS 1.2 and 1.3, stateless resumption tickets (one key set shared by every
/// worker, rotated by rustls). Errors name the file.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    let chain = read_certificates(cert)?;
    let key_bytes = read_file(key)?;
    let private = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
        format!(
            "{}: expected a PEM private key (PKCS#8, PKCS#1 or SEC1): {e}",
            key.display()
        )
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| {
            format!(
                "{}: the key does not go with the certificate in {}: {e}",
                key.display(),
                cert.display()
            )
        })?;
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    config.ticketer =
        rustls::crypto::ring::Ticketer::new().map_err(|e| format!("TLS tickets: {e}"))?;
    // One ticket per full handshake (rustls sends 2 by default): a client resumes one
    // connection per ticket and gets a new one each time, and each ticket costs a seal.
    config.send_tls13_tickets = 1;
    Ok(Arc::new(config))
}

/// The client side's config: trust the certificates in `ca` (PEM) or, without one, the
/// platform's trust roots; ALPN `http/1.1`; TLS 1.2 and 1.3; resumption from an
/// in-memory session cache (rustls' default, shared by every worker).
pub fn client_config(ca: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let roots = match ca {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certificates(path)? {
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: not a usable CA certificate: {e}", path.display()))?;
            }
            Arc::new(roots)
        }
        None => platform_roots()?,
    };
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    Ok(Arc::new(config))
}

/// The platform's trust roots (`rustls-native-certs`: the system store, or the file or
/// directory `SSL_CERT_FILE` / `SSL_CERT_DIR` name), loaded once per process.
fn platform_roots() -> Result<Arc<RootCertStore>, String> {
    static ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut roots = RootCertStore::empty();
            let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                let why = found
                    .errors
                    .first()
                    .map_or_else(|| "none found".to_owned(), |e| e.to_string());
                return Err(format!(
                    "no trust roots on this system ({why}); install the CA certificates (e.g. the ca-certificates package), set SSL_CERT_FILE, or give tls.ca"
                ));
            }
            Ok(Arc::new(roots))
        })
        .clone()
}

fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))
}

/// Every certificate in a PEM file, in order (leaf first for a chain).
fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes = read_file(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: expected PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no certificate in it (expected PEM, -----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(certs)
}
