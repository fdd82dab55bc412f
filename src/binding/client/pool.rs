//! A worker's keep-alive connections to one upstream.
//!
//! Idle connections are kept most-recent-first, at most [`UPSTREAM_POOL_IDLE_MAX`], each
//! for at most [`UPSTREAM_POOL_IDLE_TIMEOUT`]: the pool keeps what the recent peak of
//! concurrent requests needed and shrinks as the load falls. A connection taken from the pool is checked
//! first ([`super::wire::Wire::reusable`]): one the upstream closed while it sat idle is
//! dropped and counted, never used. All connections of the binding on this worker (idle,
//! busy and event streams) count against [`UPSTREAM_CONNECTIONS_MAX`].
//!
//! A new connection tries the upstream's addresses in turn (the IP literal, or up to
//! [`UPSTREAM_ADDRS_MAX`] that the name resolved to). One attempt is the TCP connect and,
//! for `https://`, the TLS handshake, together within one `connect_timeout`: an address
//! that refuses, times out or fails the handshake (a certificate for another name, a
//! server that does not speak TLS, one that accepts and says nothing) costs at most that
//! long, and the next address is tried. When all fail, the agent is told the most telling
//! reason: a refused certificate over a handshake that went nowhere over a failed connect.

use super::wire::Link;
use crate::binding::client::metrics as client_metrics;
use crate::certs::Upstream;
use crate::config::UpstreamUrl;
use crate::limits::{
    UPSTREAM_ADDRS_MAX, UPSTREAM_CONNECTIONS_MAX, UPSTREAM_POOL_IDLE_MAX,
    UPSTREAM_POOL_IDLE_TIMEOUT,
};
use crate::log;
use crate::metrics::{self, TlsFailure};
use crate::runtime::tls::HandshakeError;
use crate::runtime::{Backend, Conn, Slots, pass};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Why no connection could be had.
#[derive(Debug)]
pub enum ConnectError {
    /// The binding already holds [`UPSTREAM_CONNECTIONS_MAX`] connections on this worker.
    Full,
    /// The name did not resolve (or to no address).
    Resolve(String),
    /// Every address's TCP connect was refused, failed or timed out; the last reason.
    Connect(String),
    /// No address of an `https://` upstream completed a TLS handshake (certificate,
    /// protocol, time), and at least one accepted TCP: the most telling handshake failure.
    Tls(String),
}

/// How much one failed attempt tells about what is wrong, least first: the agent is told
/// the most telling failure among the addresses tried, because the last one is often just
/// an address with nothing behind it (an IPv6 address of a name whose server listens on
/// IPv4 only, say) while an earlier one says what to fix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Telling {
    /// The TCP connect was refused, failed or timed out: nothing may listen there at all.
    Connect,
    /// TCP was accepted but no TLS came of it (silence until the deadline, a close, a
    /// socket error): something listens, and it may not speak TLS.
    Handshake,
    /// The handshake was refused on protocol grounds (garbage, an alert from the peer, no
    /// common version or protocol): a server that is not the expected TLS server.
    Refused,
    /// The upstream's certificate was refused (name, expiry, issuer): the operator's
    /// configuration or the upstream's certificate needs fixing.
    Certificate,
}

impl Telling {
    /// How telling a failed handshake is, by its metrics reason.
    fn of(failure: TlsFailure) -> Telling {
        match failure {
            TlsFailure::CertificateExpired
            | TlsFailure::CertificateName
            | TlsFailure::CertificateUnknownIssuer
            | TlsFailure::CertificateInvalid => Telling::Certificate,
            TlsFailure::AlertReceived | TlsFailure::Incompatible | TlsFailure::Protocol => {
                Telling::Refused
            }
            TlsFailure::Timeout | TlsFailure::Closed | TlsFailure::Io => Telling::Handshake,
        }
    }
}

impl ConnectError {
    /// A short description for the agent's JSON-RPC error (no secrets, no internals).
    pub fn describe(&self) -> String {
        match self {
            ConnectError::Full => "Upstream connection limit reached".to_owned(),
            ConnectError::Resolve(e) => format!("Upstream unreachable: {e}"),
            ConnectError::Connect(e) => format!("Upstream unreachable: {e}"),
            ConnectError::Tls(e) => format!("Upstream TLS handshake failed: {e}"),
        }
    }
}

/// One worker's connections to one upstream.
pub struct Pool {
    url: Rc<UpstreamUrl>,
    backend: Backend,
    slots: Rc<Slots>,
    connect_timeout: Duration,
    /// `https://`: the TLS every new connection starts with.
    tls: Option<Upstream>,
    /// Idle connections, most recently used last (so the ones idle longest are at the
    /// front). Invariant: `len() <= UPSTREAM_POOL_IDLE_MAX`.
    idle: RefCell<VecDeque<(Link, Instant)>>,
    /// Connections handed out and not yet returned or dropped (see [`Lease`]).
    leased: Rc<Cell<usize>>,
}

/// A connection handed out by the pool; counts against the bound until dropped.
pub struct Lease {
    pub link: Link,
    _count: Count,
}

/// One leased connection in the pool's count; uncounted on drop.
struct Count(Rc<Cell<usize>>);

impl Drop for Count {
    fn drop(&mut self) {
        let n = self.0.get();
        assert!(n > 0);
        self.0.set(n - 1);
    }
}

impl Pool {
    pub fn new(
        url: Rc<UpstreamUrl>,
        backend: Backend,
        slots: Rc<Slots>,
        connect_timeout: Duration,
        tls: Option<Upstream>,
    ) -> Pool {
        Pool {
            url,
            backend,
            slots,
            connect_timeout,
            tls,
            idle: RefCell::new(VecDeque::new()),
            leased: Rc::new(Cell::new(0)),
        }
    }

    /// A usable connection: the most recent idle one, or a new one.
    pub async fn take(&self) -> Result<Lease, ConnectError> {
        loop {
            let popped = self.idle.borrow_mut().pop_back();
            let Some((mut link, since)) = popped else {
                break;
            };
            let idle_for = pass::now().saturating_duration_since(since);
            if idle_for < UPSTREAM_POOL_IDLE_TIMEOUT && link.wire().reusable(idle_for) {
                link.reused = true;
                client_metrics::with(|m| m.reused += 1);
                return Ok(self.lease(link));
            }
            client_metrics::with(|m| m.stale_dropped += 1);
            drop(link); // closes it
        }
        let (link, count) = self.connect().await?;
        Ok(Lease {
            link,
            _count: count,
        })
    }

    /// Returns a connection whose exchange ended cleanly with keep-alive.
    pub fn give_back(&self, lease: Lease) {
        let Lease { link, _count } = lease;
        // Not reusable, so not kept: one with a read still in flight would also hold a
        // read slot for as long as it sat in the pool.
        if link.wire().is_over() || !link.wire().inbox().is_empty() || link.wire().read_pending() {
            return;
        }
        self.close_expired();
        let mut idle = self.idle.borrow_mut();
        let now = pass::now();
        if idle.len() >= UPSTREAM_POOL_IDLE_MAX {
            // The oldest goes: the recent ones are the likeliest to be reused soon.
            idle.pop_front();
        }
        idle.push_back((link, now));
        assert!(idle.len() <= UPSTREAM_POOL_IDLE_MAX);
    }

    /// Closes the connections idle for `UPSTREAM_POOL_IDLE_TIMEOUT` or more. Run as
    /// connections come back, and on a timer (`Client::sweep_idle`), so a pool whose
    /// traffic stopped does not keep its connections open for good.
    pub fn close_expired(&self) {
        let mut idle = self.idle.borrow_mut();
        let now = pass::now();
        // Entries are in the order they went idle, so the expired ones are a prefix.
        while idle.front().is_some_and(|(_, since)| {
            now.saturating_duration_since(*since) >= UPSTREAM_POOL_IDLE_TIMEOUT
        }) {
            idle.pop_front();
        }
    }

    /// Idle connections now.
    #[cfg(test)]
    pub fn idle_count(&self) -> usize {
        self.idle.borrow().len()
    }

    /// Makes the connection idle longest look idle for `by` longer.
    #[cfg(test)]
    pub fn age_oldest_idle(&self, by: Duration) {
        if let Some((_, since)) = self.idle.borrow_mut().front_mut() {
            *since -= by;
        }
    }

    /// Closes every idle connection (drain).
    pub fn close_idle(&self) {
        self.idle.borrow_mut().clear();
    }

    fn lease(&self, link: Link) -> Lease {
        Lease {
            link,
            _count: self.count(),
        }
    }

    /// One more connection in the bound's count, until the `Count` drops.
    fn count(&self) -> Count {
        self.leased.set(self.leased.get() + 1);
        Count(self.leased.clone())
    }

    /// A new connection, counted against the bound from before it is attempted: a connect
    /// may take several `connect_timeout`s (one per address), and a burst of them must not
    /// open more sockets than the bound.
    async fn connect(&self) -> Result<(Link, Count), ConnectError> {
        if self.leased.get() + self.idle.borrow().len() >= UPSTREAM_CONNECTIONS_MAX {
            metrics::with(|m| m.overload_rejections += 1);
            return Err(ConnectError::Full);
        }
        let count = self.count();
        let addrs = self.resolve().await?;
        let link = self.connect_any(&addrs).await?;
        Ok((link, count))
    }

    /// Tries `addrs` in turn (at most [`UPSTREAM_ADDRS_MAX`]) until one attempt gives a
    /// connection. When every attempt failed, the agent is told the most telling reason
    /// (see [`Telling`]), the later one of equally telling reasons.
    async fn connect_any(&self, addrs: &[SocketAddr]) -> Result<Link, ConnectError> {
        let mut told: Option<(Telling, ConnectError)> = None;
        for &addr in addrs.iter().take(UPSTREAM_ADDRS_MAX) {
            match self.attempt(addr, Instant::now()).await {
                Ok(conn) => {
                    client_metrics::with(|m| m.connects += 1);
                    return Ok(Link::start(conn, self.slots.clone()));
                }
                Err((telling, error)) => {
                    if told.as_ref().is_none_or(|(best, _)| telling >= *best) {
                        told = Some((telling, error));
                    }
                }
            }
        }
        client_metrics::with(|m| m.connect_failures += 1);
        Err(told.map_or_else(
            || ConnectError::Connect("no address".to_owned()),
            |(_, error)| error,
        ))
    }

    /// One attempt at `addr`, begun at `since`: the TCP connect and, for `https://`, the TLS
    /// handshake, both within one `connect_timeout` from `since` (the handshake gets what
    /// the connect left, not a deadline of its own). On failure nothing is left open.
    async fn attempt(
        &self,
        addr: SocketAddr,
        since: Instant,
    ) -> Result<Conn, (Telling, ConnectError)> {
        let timed_out = || format!("timed out after {} ms", self.connect_timeout.as_millis());
        let left = self.connect_timeout.saturating_sub(since.elapsed());
        // The connect runs on tokio's readiness reactor on both backends, so giving it up by
        // dropping its future is safe (see `Conn::connect`); the socket is not ours yet.
        let conn = match tokio::time::timeout(left, Conn::connect(addr, self.backend)).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(e)) => {
                let error = ConnectError::Connect(format!("connect to {addr}: {e}"));
                return Err((Telling::Connect, error));
            }
            Err(_) => {
                let error = ConnectError::Connect(format!("connect to {addr}: {}", timed_out()));
                return Err((Telling::Connect, error));
            }
        };
        let Some(tls) = &self.tls else {
            return Ok(conn);
        };
        let session = match tls.session() {
            Ok(session) => session,
            Err(e) => {
                conn.shutdown();
                return Err(self.tls_failed(addr, Telling::Refused, e.to_string()));
            }
        };
        let conn = conn.with_tls(session);
        let left = self.connect_timeout.saturating_sub(since.elapsed());
        match conn.handshake(left).await {
            Ok(_) => Ok(conn),
            Err(e) => {
                // The handshake has no read or write in flight once it returned (it ran
                // to its end, a deadline completing it by a shutdown): closing is safe.
                conn.shutdown();
                let why = match e {
                    // The budget it was given is what the connect left; the agent and the
                    // log are told the whole attempt's bound.
                    HandshakeError::Timeout(_) => timed_out(),
                    ref other => other.to_string(),
                };
                Err(self.tls_failed(addr, Telling::of(e.failure()), why))
            }
        }
    }

    /// A failed handshake with `addr`: one log line (the next address may still work, and
    /// an address that serves a bad certificate is worth an operator's look either way);
    /// the agent gets the reason if no address works (never a secret: names, dates and
    /// alert names only).
    fn tls_failed(
        &self,
        addr: SocketAddr,
        telling: Telling,
        why: String,
    ) -> (Telling, ConnectError) {
        // `why` may quote the upstream's certificate (the names it is valid for): bounded
        // and escaped like any outside bytes in a log line.
        log::warn(format_args!(
            "client: TLS handshake with {} ({addr}) failed: {}",
            self.url.authority,
            log::field(why.as_bytes())
        ));
        (telling, ConnectError::Tls(why))
    }

    /// The addresses to try: the literal IP, or up to [`UPSTREAM_ADDRS_MAX`] resolved ones.
    async fn resolve(&self) -> Result<Vec<SocketAddr>, ConnectError> {
        if let Ok(ip) = self.url.host.parse::<IpAddr>() {
            return Ok(vec![SocketAddr::new(ip, self.url.port)]);
        }
        let host = (self.url.host.as_str(), self.url.port);
        let found = tokio::time::timeout(self.connect_timeout, tokio::net::lookup_host(host))
            .await
            .map_err(|_| ConnectError::Resolve(format!("resolving {} timed out", self.url.host)))?
            .map_err(|e| ConnectError::Resolve(format!("resolving {}: {e}", self.url.host)))?;
        let addrs: Vec<SocketAddr> = found.take(UPSTREAM_ADDRS_MAX).collect();
        if addrs.is_empty() {
            return Err(ConnectError::Resolve(format!(
                "{} has no address",
                self.url.host
            )));
        }
        Ok(addrs)
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
