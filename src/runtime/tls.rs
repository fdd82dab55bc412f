//! TLS on a [`Conn`]: rustls' buffered API between the socket and the HTTP codecs.
//!
//! The socket is read exactly as for plain connections (one read at a time, never dropped
//! in flight on io_uring); the caller hands what a read brought to [`Conn::received`],
//! which feeds rustls (`read_tls`, `process_new_packets`) and moves the plaintext into the
//! caller's buffer. [`Conn::write_all`] seals the plaintext in batches of at most
//! [`TLS_WRITE_BATCH_BYTES`] and writes the records. The codecs, the request paths and the
//! stream windows above never see TLS.
//!
//! A handshake ([`Conn::handshake`]) reads into a small heap buffer (never a slot), is
//! bounded by a deadline enforced like every other one here (the socket is shut down,
//! which completes the pending read), and costs one counter and one log line when it fails.
//! [`Conn::shutdown`] sends close_notify before the socket is shut down.

use super::io::{Conn, Socket, would_block};
use super::slots::ReadBuf;
use crate::limits::{
    TLS_HANDSHAKE_FIRST_READ_BYTES, TLS_HANDSHAKE_READ_BYTES, TLS_IDLE_CHECK_READ_BYTES,
    TLS_IDLE_CHECK_READS_MAX, TLS_WRITE_BATCH_BYTES,
};
use crate::metrics::{self, TlsFailure, TlsSide};
use bytes::{Bytes, BytesMut};
use rustls::{CertificateError, Connection, Error, ServerConfig};
use std::cell::{Cell, RefCell};
use std::io::{self, BufRead, Write};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Clears [`Tls::writing`] however the write ends.
struct Writing<'a>(&'a Cell<bool>);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
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

impl Conn {
    /// This connection, to carry TLS with `session` from now on (handshake next).
    pub fn with_tls(self, session: Connection) -> Conn {
        assert!(self.tls.is_none(), "a connection gets TLS once");
        Conn {
            socket: self.socket,
            tls: Some(Box::new(Tls {
                session: RefCell::new(session),
                early: RefCell::new(BytesMut::new()),
                peer_closed: Cell::new(false),
                writing: Cell::new(false),
            })),
        }
    }

    /// True if this connection carries TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Runs the TLS handshake to its end, within `timeout`; the outcome is counted (by
    /// side and reason) and timed in the worker's metrics. On failure the peer got an
    /// alert where rustls had one to send; the caller shuts the connection down.
    pub async fn handshake(&self, timeout: Duration) -> Result<Handshake, HandshakeError> {
        let Some(tls) = self.tls.as_deref() else {
            unreachable!("handshake on a connection without TLS")
        };
        let side = match &*tls.session.borrow() {
            Connection::Client(_) => TlsSide::Client,
            Connection::Server(_) => TlsSide::Server,
        };
        let started = Instant::now();
        let mut work = std::pin::pin!(self.drive_handshake(tls));
        let timer = std::pin::pin!(tokio::time::sleep(timeout));
        // The handshake future is never dropped before it completes (io_uring: its read
        // owns a buffer until the kernel is done with it): past the deadline the socket is
        // shut down, which completes the read, and the handshake fails on its own.
        let result = tokio::select! {
            biased;
            r = &mut work => r,
            () = timer => {
                self.socket.shutdown();
                match work.await {
                    Ok(done) => Ok(done),
                    Err(_) => Err(HandshakeError::Timeout(timeout)),
                }
            }
        };
        match &result {
            Ok(done) => metrics::record_tls_handshake(side, None, done.resumed, started.elapsed()),
            Err(e) => {
                metrics::record_tls_handshake(side, Some(e.failure()), false, started.elapsed())
            }
        }
        result
    }

    async fn drive_handshake(&self, tls: &Tls) -> Result<Handshake, HandshakeError> {
        // Small until a read fills its buffer (a certificate chain arriving, say).
        let mut room = TLS_HANDSHAKE_FIRST_READ_BYTES;
        loop {
            let out = tls.sealed_output().map_err(HandshakeError::Io)?;
            if !out.is_empty() {
                self.socket
                    .write_all(out)
                    .await
                    .map_err(HandshakeError::Io)?;
            }
            if !tls.session.borrow().is_handshaking() {
                let resumed =
                    tls.session.borrow().handshake_kind() == Some(rustls::HandshakeKind::Resumed);
                return Ok(Handshake { resumed });
            }
            let buf = ReadBuf::Heap(Vec::with_capacity(room));
            let (result, buf) = self.socket.read(buf).await;
            let n = result.map_err(HandshakeError::Io)?;
            if n == 0 {
                return Err(HandshakeError::Closed);
            }
            room = if n >= room {
                TLS_HANDSHAKE_READ_BYTES
            } else {
                TLS_HANDSHAKE_FIRST_READ_BYTES
            };
            let fed = tls.feed(
                buf.get(..n).unwrap_or_default(),
                &mut tls.early.borrow_mut(),
            );
            if let Err(e) = fed {
                // The alert rustls queued for the peer (unknown CA, bad certificate, …)
                // goes out before the connection is closed, if the socket takes it.
                if let Ok(alert) = tls.sealed_output()
                    && !alert.is_empty()
                {
                    let _ = self.socket.write_all(alert).await;
                }
                return Err(HandshakeError::Tls(e));
            }
        }
    }
}

impl Tls {
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

    /// [`Conn::received`] for TLS.
    pub(super) fn decrypt(&self, data: &[u8], out: &mut BytesMut) -> io::Result<()> {
        self.feed(data, out).map_err(io::Error::other)
    }

    pub(super) fn peer_closed(&self) -> bool {
        self.peer_closed.get()
    }

    pub(super) fn take_early(&self, out: &mut BytesMut) -> usize {
        let early = self.early.take();
        out.extend_from_slice(&early);
        early.len()
    }

    /// The records rustls has queued to send (handshake flights, alerts, tickets).
    fn sealed_output(&self) -> io::Result<Bytes> {
        let mut out = Vec::new();
        drain_records(&mut self.session.borrow_mut(), &mut out)?;
        Ok(Bytes::from(out))
    }

    /// [`Conn::write_all`] for TLS: seals `data` in batches and writes each batch's records
    /// (with anything rustls queued before them) in one socket write.
    pub(super) async fn write_all(&self, socket: &Socket, mut data: &[u8]) -> io::Result<()> {
        if self.writing.replace(true) {
            return Err(io::Error::other("concurrent writes on one TLS connection"));
        }
        let _writing = Writing(&self.writing);
        loop {
            let sealed = {
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
                data = rest;
                out
            };
            socket.write_all(Bytes::from(sealed)).await?;
            if data.is_empty() {
                return Ok(());
            }
        }
    }

    /// Queues close_notify and sends it without waiting (the socket is about to be shut
    /// down). Skipped while a write is in progress or the handshake is not done.
    pub(super) fn close_notify(&self, fd: RawFd) {
        if self.writing.get() {
            return;
        }
        let Ok(mut session) = self.session.try_borrow_mut() else {
            return;
        };
        if session.is_handshaking() {
            return;
        }
        session.send_close_notify();
        let mut out = Vec::new();
        if drain_records(&mut session, &mut out).is_err() {
            return;
        }
        drop(session);
        send_now(fd, &out);
    }

    /// [`Conn::unusable`] for an idle TLS connection: takes in what arrived without waiting.
    pub(super) fn idle_input_unusable(&self, fd: RawFd) -> bool {
        let mut buf = [0u8; TLS_IDLE_CHECK_READ_BYTES];
        let mut plain = BytesMut::new();
        for _ in 0..TLS_IDLE_CHECK_READS_MAX {
            // SAFETY: `fd` is a socket owned by the caller for the duration of the call; the
            // pointer and length describe `buf`, writable and owned here.
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            let Ok(n) = usize::try_from(n) else {
                return !would_block(&io::Error::last_os_error());
            };
            if n == 0 {
                return true;
            }
            if self
                .feed(buf.get(..n).unwrap_or_default(), &mut plain)
                .is_err()
                || !plain.is_empty()
                || self.peer_closed.get()
            {
                return true;
            }
        }
        true
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

/// One non-blocking send of `bytes` (best effort: a close_notify before a shutdown).
fn send_now(fd: RawFd, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    // SAFETY: `fd` is a socket owned by the caller for the duration of the call; the
    // pointer and length describe `bytes`, readable and borrowed for the call.
    let _ = unsafe {
        libc::send(
            fd,
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
}

/// A server session for one accepted connection.
pub fn server_session(config: &Arc<ServerConfig>) -> Result<Connection, Error> {
    rustls::ServerConnection::new(config.clone()).map(Connection::Server)
}

#[cfg(test)]
#[path = "tls_tests.rs"]
mod tests;
