//! TLS as a sans-IO layer: rustls' buffered API between the bytes a socket read brought
//! and the HTTP codecs, with no socket in sight.
//!
//! A [`Tls`] takes received ciphertext ([`Tls::decrypt`], which feeds rustls with
//! `read_tls` and `process_new_packets` and moves the plaintext into the caller's buffer)
//! and gives back records to send ([`Tls::seal`] seals plaintext in batches of at most
//! [`TLS_WRITE_BATCH_BYTES`]; [`Tls::sealed_output`] is what rustls queued by itself:
//! handshake flights, alerts, tickets). [`crate::runtime::Conn`] does the reads and writes
//! (`runtime/io.rs`), and `runtime/handshake.rs` drives a handshake over it; the codecs,
//! the request paths and the stream windows above never see TLS.

use crate::limits::TLS_WRITE_BATCH_BYTES;
use crate::metrics::{TlsFailure, TlsSide};
use bytes::{Bytes, BytesMut};
use rustls::{CertificateError, Connection, Error, ServerConfig};
use std::cell::{Cell, RefCell};
use std::io::{self, BufRead, Write};
use std::sync::Arc;
use std::time::Duration;

/// The TLS state of one connection.
pub(crate) struct Tls {
    session: RefCell<Connection>,
    /// Plaintext that arrived with the handshake's last flight, not yet taken.
    early: RefCell<BytesMut>,
    /// The peer sent close_notify.
    peer_closed: Cell<bool>,
    /// A write is in progress: a close_notify now could overtake its records.
    writing: Cell<bool>,
}

/// A write in progress on a [`Tls`] ([`Tls::start_write`]). It clears the mark only when
/// it ends ([`Writing::done`], or an error, which leaves the connection broken anyway): a
/// write dropped halfway (its deadline passed) leaves a record cut short on the wire, so
/// the mark stays, no close_notify is sent after it and no later write starts.
pub(crate) struct Writing<'a>(&'a Cell<bool>);

impl Writing<'_> {
    /// The write ended: every sealed record reached the socket, or the socket failed.
    pub(crate) fn done(self) {
        self.0.set(false);
    }
}

/// How a handshake ended well.
#[derive(Debug, Clone, Copy)]
pub struct Handshake {
    /// The session was resumed (ticket or session id): no certificate exchange.
    pub resumed: bool,
}

/// Why a handshake failed.
#[derive(Debug)]
pub enum HandshakeError {
    /// The deadline passed first.
    Timeout(Duration),
    /// The peer closed the connection in the middle.
    Closed,
    /// The socket failed.
    Io(io::Error),
    /// The peer's TLS was refused by rustls (or the peer refused ours, with an alert).
    Tls(Error),
}

impl HandshakeError {
    /// The metrics label.
    pub fn failure(&self) -> TlsFailure {
        match self {
            HandshakeError::Timeout(_) => TlsFailure::Timeout,
            HandshakeError::Closed => TlsFailure::Closed,
            HandshakeError::Io(_) => TlsFailure::Io,
            HandshakeError::Tls(e) => match e {
                Error::InvalidCertificate(
                    CertificateError::Expired | CertificateError::ExpiredContext { .. },
                ) => TlsFailure::CertificateExpired,
                Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                ) => TlsFailure::CertificateName,
                Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                    TlsFailure::CertificateUnknownIssuer
                }
                Error::InvalidCertificate(_) => TlsFailure::CertificateInvalid,
                Error::AlertReceived(_) => TlsFailure::AlertReceived,
                Error::NoApplicationProtocol | Error::PeerIncompatible(_) => {
                    TlsFailure::Incompatible
                }
                _ => TlsFailure::Protocol,
            },
        }
    }
}

impl std::fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeError::Timeout(d) => write!(f, "timed out after {} ms", d.as_millis()),
            HandshakeError::Closed => f.write_str("the peer closed the connection"),
            HandshakeError::Io(e) => write!(f, "{e}"),
            HandshakeError::Tls(e) => write!(f, "{e}"),
        }
    }
}

impl Tls {
    /// A connection's TLS state, handshake next.
    pub(crate) fn new(session: Connection) -> Tls {
        Tls {
            session: RefCell::new(session),
            early: RefCell::new(BytesMut::new()),
            peer_closed: Cell::new(false),
            writing: Cell::new(false),
        }
    }

    /// Which edge this connection is on.
    pub(crate) fn side(&self) -> TlsSide {
        match &*self.session.borrow() {
            Connection::Client(_) => TlsSide::Client,
            Connection::Server(_) => TlsSide::Server,
        }
    }

    /// The handshake's end, once it has ended: whether the session was resumed.
    pub(crate) fn handshake_done(&self) -> Option<Handshake> {
        let session = self.session.borrow();
        (!session.is_handshaking()).then(|| Handshake {
            resumed: session.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
        })
    }

    /// Feeds a handshake flight from the peer; plaintext that came with its last flight
    /// is kept for [`Tls::take_early`].
    pub(crate) fn feed_handshake(&self, data: &[u8]) -> Result<(), Error> {
        self.feed(data, &mut self.early.borrow_mut())
    }

    /// Feeds received ciphertext to rustls and moves the plaintext it yields into `out`.
    fn feed(&self, mut data: &[u8], out: &mut BytesMut) -> Result<(), Error> {
        let mut session = self.session.borrow_mut();
        while !data.is_empty() {
            match session.read_tls(&mut data) {
                // close_notify was received: whatever follows it is not read.
                Ok(0) => break,
                Ok(_) => {}
                // The plaintext buffer is full; it is emptied after every record batch,
                // so this is a broken peer (or rustls) state, not back-pressure.
                Err(e) => return Err(Error::General(format!("reading TLS records: {e}"))),
            }
            let state = session.process_new_packets()?;
            drain_plaintext(&mut session, out);
            if state.peer_has_closed() {
                self.peer_closed.set(true);
            }
        }
        Ok(())
    }

    /// Decrypts what a read brought into `out` (which may gain nothing, e.g. for a
    /// session ticket); an error is a broken TLS stream.
    pub(crate) fn decrypt(&self, data: &[u8], out: &mut BytesMut) -> io::Result<()> {
        self.feed(data, out).map_err(io::Error::other)
    }

    pub(crate) fn peer_closed(&self) -> bool {
        self.peer_closed.get()
    }

    pub(crate) fn take_early(&self, out: &mut BytesMut) -> usize {
        let early = self.early.take();
        out.extend_from_slice(&early);
        early.len()
    }

    /// The records rustls has queued to send (handshake flights, alerts, tickets).
    pub(crate) fn sealed_output(&self) -> io::Result<Bytes> {
        let mut out = Vec::new();
        drain_records(&mut self.session.borrow_mut(), &mut out)?;
        Ok(Bytes::from(out))
    }

    /// Marks a write in progress (a close_notify now could overtake its records); an
    /// error if one is already: records must reach the socket in the order they were
    /// sealed, so a connection has one writer at a time.
    pub(crate) fn start_write(&self) -> io::Result<Writing<'_>> {
        if self.writing.replace(true) {
            return Err(io::Error::other("concurrent writes on one TLS connection"));
        }
        Ok(Writing(&self.writing))
    }

    /// Seals at most [`TLS_WRITE_BATCH_BYTES`] of `data` into records, after anything
    /// rustls queued before them; gives back the records (to be written in one socket
    /// write) and the rest of `data`.
    pub(crate) fn seal<'d>(&self, data: &'d [u8]) -> io::Result<(Bytes, &'d [u8])> {
        let mut session = self.session.borrow_mut();
        let (batch, rest) = data.split_at(data.len().min(TLS_WRITE_BATCH_BYTES));
        let mut out = Vec::with_capacity(batch.len() + batch.len() / 256 + 64);
        let mut left = batch;
        // rustls seals at most its buffer limit at a time: drain, then go on.
        loop {
            drain_records(&mut session, &mut out)?;
            if left.is_empty() {
                break;
            }
            let n = session.writer().write(left)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            left = left.get(n..).unwrap_or_default();
        }
        Ok((Bytes::from(out), rest))
    }

    /// close_notify, sealed, to send just before the socket is shut down; `None` while a
    /// write is in progress (it could overtake the write's records) or the handshake is
    /// not done.
    pub(crate) fn close_notify(&self) -> Option<Vec<u8>> {
        if self.writing.get() {
            return None;
        }
        let mut session = self.session.try_borrow_mut().ok()?;
        if session.is_handshaking() {
            return None;
        }
        session.send_close_notify();
        let mut out = Vec::new();
        drain_records(&mut session, &mut out).ok()?;
        Some(out)
    }

    /// Takes in bytes that arrived on an idle connection (session tickets, key updates are
    /// fine); true if they make it unusable: data nobody asked for, close_notify, or
    /// records that do not decrypt.
    pub(crate) fn idle_input_unusable(&self, data: &[u8]) -> bool {
        let mut plain = BytesMut::new();
        self.feed(data, &mut plain).is_err() || !plain.is_empty() || self.peer_closed.get()
    }
}

/// Appends every record rustls has queued to send to `out`.
fn drain_records(session: &mut Connection, out: &mut Vec<u8>) -> io::Result<()> {
    while session.wants_write() {
        session.write_tls(out)?;
    }
    Ok(())
}

/// Moves every plaintext byte rustls holds into `out`.
fn drain_plaintext(session: &mut Connection, out: &mut BytesMut) {
    let mut reader = session.reader();
    loop {
        match reader.fill_buf() {
            Ok([]) | Err(_) => return,
            Ok(chunk) => {
                let n = chunk.len();
                out.extend_from_slice(chunk);
                reader.consume(n);
            }
        }
    }
}

/// A server session for one accepted connection.
pub fn server_session(config: &Arc<ServerConfig>) -> Result<Connection, Error> {
    rustls::ServerConnection::new(config.clone()).map(Connection::Server)
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
