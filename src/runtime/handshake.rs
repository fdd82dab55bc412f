//! A TLS connection's start: [`Conn::with_tls`] puts a [`Tls`] on a connection and
//! [`Conn::handshake`] runs the handshake over it.
//!
//! A handshake reads into a small heap buffer (never a slot), is bounded by a deadline
//! enforced like every other one here (the socket is shut down, which completes the
//! pending read), and costs one counter and one log line when it fails.

use super::io::Conn;
use super::slots::ReadBuf;
use super::tls::{Handshake, HandshakeError, Tls};
use crate::limits::{TLS_HANDSHAKE_FIRST_READ_BYTES, TLS_HANDSHAKE_READ_BYTES};
use crate::metrics;
use rustls::Connection;
use std::time::{Duration, Instant};

impl Conn {
    /// This connection, to carry TLS with `session` from now on (handshake next).
    pub fn with_tls(self, session: Connection) -> Conn {
        assert!(self.tls.is_none(), "a connection gets TLS once");
        Conn {
            socket: self.socket,
            tls: Some(Box::new(Tls::new(session))),
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
        let side = tls.side();
        let started = Instant::now();
        // Declared before the work, so dropped after it: a caller that drops this future
        // mid-way (an agent cancelling the request that waits for an upstream connection)
        // leaves no read pending on a live socket. On io_uring such a read keeps the
        // socket and its buffer until the peer sends or closes, outside every bound; the
        // shutdown completes it at once.
        let mut unfinished = Unfinished(Some(self));
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
        unfinished.0 = None;
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
            if let Some(done) = tls.handshake_done() {
                return Ok(done);
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
            if let Err(e) = tls.feed_handshake(buf.get(..n).unwrap_or_default()) {
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

/// Shuts its connection down when dropped, unless taken (the handshake finished).
struct Unfinished<'a>(Option<&'a Conn>);

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.0 {
            conn.shutdown();
        }
    }
}
