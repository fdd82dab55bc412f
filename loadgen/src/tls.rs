//! TLS for the generator (`run --url https://... --tls-ca PEM`) and the fixture (`upstream
//! --tls-cert PEM --tls-key PEM`): rustls (ring) with mcpyard's own configs
//! (`mcpyard::certs::{client_config, server_config}`: ALPN `http/1.1`, TLS 1.2 and
//! 1.3, stateless tickets on the server, an in-memory resumption cache on the client).
//!
//! [`Layer`] is sans-IO, like mcpyard's `Conn::received`: the caller reads the raw socket
//! exactly as for plain connections (so kernel receive stamps keep working) and hands what
//! arrived to [`Layer::received`], which returns the plaintext; [`Layer::seal`] turns
//! plaintext into the records to write. Both the blocking client and the async fixture
//! drive the same layer.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use bytes::BytesMut;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};

use crate::limits::TLS_PLAINTEXT_READ_BYTES;

/// Whether the generator's new connections may resume an earlier TLS session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resumption {
    /// Tickets (TLS 1.3) and session ids (TLS 1.2) from earlier connections are offered:
    /// a new connection per request then mostly costs an abbreviated handshake.
    On,
    /// Every connection makes a full handshake (certificate, key exchange).
    Off,
}

impl Resumption {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Resumption::On => "on",
            Resumption::Off => "off",
        }
    }
}

/// The generator's TLS settings for one target: config and the name to verify.
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl ClientTls {
    /// Trusts the CA certificates in `ca` (PEM; the platform's roots without one) and
    /// verifies `host` (a DNS name, sent as SNI, or an IP address, verified only).
    pub fn new(host: &str, ca: Option<&Path>, resumption: Resumption) -> Result<ClientTls, String> {
        let shared = mcpyard::certs::client_config(ca)?;
        let config = match resumption {
            Resumption::On => shared,
            Resumption::Off => {
                let mut config = (*shared).clone();
                config.resumption = rustls::client::Resumption::disabled();
                Arc::new(config)
            }
        };
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("{host}: not a name TLS can verify: {e}"))?;
        Ok(ClientTls { config, name })
    }

    /// A session for one new connection.
    pub fn session(&self) -> Result<Layer, rustls::Error> {
        ClientConnection::new(Arc::clone(&self.config), self.name.clone())
            .map(|c| Layer::new(Connection::Client(c)))
    }
}

/// The fixture's TLS config: certificate chain and key from PEM files.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, String> {
    mcpyard::certs::server_config(cert, key)
}

/// A server session for one accepted connection.
pub fn server_session(config: &Arc<ServerConfig>) -> Result<Layer, rustls::Error> {
    ServerConnection::new(Arc::clone(config)).map(|c| Layer::new(Connection::Server(c)))
}

/// One connection's TLS state between the raw socket and the HTTP codecs.
#[derive(Debug)]
pub struct Layer {
    session: Connection,
    /// The peer sent close_notify.
    closed: bool,
}

impl Layer {
    fn new(session: Connection) -> Layer {
        Layer {
            session,
            closed: false,
        }
    }

    /// True until the handshake is complete.
    pub fn is_handshaking(&self) -> bool {
        self.session.is_handshaking()
    }

    /// True once the peer sent close_notify: no more plaintext will come.
    pub fn peer_closed(&self) -> bool {
        self.closed
    }

    /// Feeds the raw bytes of one socket read, appends the plaintext they completed to
    /// `plain` and returns how much; records rustls must answer (handshake flights, alerts)
    /// are appended to `out`, which the caller writes to the socket. A TLS error leaves its
    /// alert in `out` too.
    pub fn received(
        &mut self,
        mut raw: &[u8],
        plain: &mut BytesMut,
        out: &mut Vec<u8>,
    ) -> io::Result<usize> {
        let before = plain.len();
        while !raw.is_empty() {
            // read_tls takes at most what its buffer holds: loop, processing in between.
            let taken = self.session.read_tls(&mut raw)?;
            let state = match self.session.process_new_packets() {
                Ok(state) => state,
                Err(err) => {
                    self.pending(out)?;
                    return Err(io::Error::new(io::ErrorKind::InvalidData, err));
                }
            };
            self.drain(plain)?;
            if state.peer_has_closed() {
                self.closed = true;
            }
            if taken == 0 {
                break;
            }
        }
        self.pending(out)?;
        Ok(plain.len() - before)
    }

    /// Moves the plaintext rustls holds into `plain`.
    fn drain(&mut self, plain: &mut BytesMut) -> io::Result<()> {
        let mut scratch = [0u8; TLS_PLAINTEXT_READ_BYTES];
        loop {
            match self.session.reader().read(&mut scratch) {
                Ok(0) => return Ok(()),
                Ok(n) => plain.extend_from_slice(scratch.get(..n).unwrap_or_default()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                // close_notify seen: plaintext ends here.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Appends the records rustls wants to send (handshake, tickets, alerts) to `out`.
    pub fn pending(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        while self.session.wants_write() {
            self.session.write_tls(out)?;
        }
        Ok(())
    }

    /// Seals `plain` and appends the records to `out`.
    pub fn seal(&mut self, mut plain: &[u8], out: &mut Vec<u8>) -> io::Result<()> {
        while !plain.is_empty() {
            // The writer takes what fits its buffer limit; emptying it makes room.
            let n = self.session.writer().write(plain)?;
            plain = plain.get(n..).unwrap_or_default();
            self.pending(out)?;
            if n == 0 && !self.session.wants_write() {
                return Err(io::Error::other("TLS: the session takes no more plaintext"));
            }
        }
        self.pending(out)
    }

    /// Appends close_notify to `out`.
    pub fn close(&mut self, out: &mut Vec<u8>) -> io::Result<()> {
        self.session.send_close_notify();
        self.pending(out)
    }
}

/// Splits `host:port` (IPv6 in brackets) and returns the host alone, without brackets.
pub fn host_of(authority: &str) -> &str {
    let host = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => host,
        _ => authority,
    };
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_comes_without_port_or_brackets() {
        assert_eq!(host_of("localhost:443"), "localhost");
        assert_eq!(host_of("127.0.0.1:8443"), "127.0.0.1");
        assert_eq!(host_of("[::1]:8443"), "::1");
        assert_eq!(host_of("example.test"), "example.test");
    }

    /// A client and a server layer handshake and exchange bytes with no socket at all.
    #[test]
    fn a_client_and_a_server_layer_talk_in_memory() {
        let dir = std::env::temp_dir().join(format!("loadgen-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let ca = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let mut ca_params =
            rcgen::CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| panic!("{e}"));
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca_cert = ca_params.self_signed(&ca).unwrap_or_else(|e| panic!("{e}"));
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap_or_else(|e| panic!("{e}"));
        let issuer = rcgen::Issuer::new(ca_params, ca);
        let cert = params
            .signed_by(&key, &issuer)
            .unwrap_or_else(|e| panic!("{e}"));
        let (ca_path, cert_path, key_path) = (
            dir.join("ca.pem"),
            dir.join("cert.pem"),
            dir.join("key.pem"),
        );
        for (path, text) in [
            (&ca_path, ca_cert.pem()),
            (&cert_path, cert.pem()),
            (&key_path, key.serialize_pem()),
        ] {
            std::fs::write(path, text).unwrap_or_else(|e| panic!("{e}"));
        }
        let server_cfg = server_config(&cert_path, &key_path).unwrap_or_else(|e| panic!("{e}"));
        let mut server = server_session(&server_cfg).unwrap_or_else(|e| panic!("{e}"));
        let client_tls = ClientTls::new("localhost", Some(&ca_path), Resumption::Off)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut client = client_tls.session().unwrap_or_else(|e| panic!("{e}"));
        let (mut to_server, mut to_client) = (Vec::new(), Vec::new());
        let (mut at_server, mut at_client) = (BytesMut::new(), BytesMut::new());
        client
            .pending(&mut to_server)
            .unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..4 {
            let raw = std::mem::take(&mut to_server);
            server
                .received(&raw, &mut at_server, &mut to_client)
                .unwrap_or_else(|e| panic!("{e}"));
            let raw = std::mem::take(&mut to_client);
            client
                .received(&raw, &mut at_client, &mut to_server)
                .unwrap_or_else(|e| panic!("{e}"));
        }
        assert!(!client.is_handshaking() && !server.is_handshaking());
        let big = vec![b'x'; 100_000];
        client
            .seal(&big, &mut to_server)
            .unwrap_or_else(|e| panic!("{e}"));
        client
            .close(&mut to_server)
            .unwrap_or_else(|e| panic!("{e}"));
        let n = server
            .received(&to_server, &mut at_server, &mut to_client)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n, big.len());
        assert_eq!(&at_server[..], &big[..]);
        assert!(server.peer_closed());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
