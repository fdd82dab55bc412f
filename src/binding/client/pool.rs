//! A worker's keep-alive connections to one upstream.
//!
//! Idle connections are kept most-recent-first, at most [`UPSTREAM_POOL_IDLE_MAX`], each
//! for at most [`UPSTREAM_POOL_IDLE_TIMEOUT`]. A connection taken from the pool is checked
//! first ([`super::wire::Wire::reusable`]): one the upstream closed while it sat idle is
//! dropped and counted, never used. All connections of the binding on this worker (idle,
//! busy and event streams) count against [`UPSTREAM_CONNECTIONS_MAX`].

use super::wire::Link;
use crate::config::UpstreamUrl;
use crate::limits::{
    UPSTREAM_ADDRS_MAX, UPSTREAM_CONNECTIONS_MAX, UPSTREAM_POOL_IDLE_MAX,
    UPSTREAM_POOL_IDLE_TIMEOUT,
};
use crate::log;
use crate::metrics;
use crate::runtime::tls::Upstream;
use crate::runtime::{Backend, Conn, Slots};
use std::cell::{Cell, RefCell};
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
    /// Every address refused, failed or timed out; the last reason.
    Connect(String),
    /// The TLS handshake with an `https://` upstream failed (certificate, protocol, time).
    Tls(String),
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
    /// Idle connections, most recently used last. Invariant: `len() <= UPSTREAM_POOL_IDLE_MAX`.
    idle: RefCell<Vec<(Link, Instant)>>,
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
            idle: RefCell::new(Vec::new()),
            leased: Rc::new(Cell::new(0)),
        }
    }

    /// A usable connection: the most recent idle one, or a new one.
    pub async fn take(&self) -> Result<Lease, ConnectError> {
        loop {
            let popped = self.idle.borrow_mut().pop();
            let Some((mut link, since)) = popped else {
                break;
            };
            let idle_for = since.elapsed();
            if idle_for < UPSTREAM_POOL_IDLE_TIMEOUT && link.wire().reusable(idle_for) {
                link.reused = true;
                metrics::with(|m| m.upstream.reused += 1);
                return Ok(self.lease(link));
            }
            metrics::with(|m| m.upstream.stale_dropped += 1);
            drop(link); // closes it
        }
        self.connect().await.map(|link| self.lease(link))
    }

    /// Returns a connection whose exchange ended cleanly with keep-alive.
    pub fn give_back(&self, lease: Lease) {
        let Lease { link, _count } = lease;
        if link.wire().is_over() || !link.wire().inbox().is_empty() {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let now = Instant::now();
        idle.retain(|(_, since)| now.duration_since(*since) < UPSTREAM_POOL_IDLE_TIMEOUT);
        if idle.len() >= UPSTREAM_POOL_IDLE_MAX {
            // The oldest goes: the recent ones are the likeliest to be reused soon.
            idle.remove(0);
        }
        idle.push((link, now));
        assert!(idle.len() <= UPSTREAM_POOL_IDLE_MAX);
    }

    /// Closes every idle connection (drain).
    pub fn close_idle(&self) {
        self.idle.borrow_mut().clear();
    }

    fn lease(&self, link: Link) -> Lease {
        self.leased.set(self.leased.get() + 1);
        Lease {
            link,
            _count: Count(self.leased.clone()),
        }
    }

    async fn connect(&self) -> Result<Link, ConnectError> {
        if self.leased.get() + self.idle.borrow().len() >= UPSTREAM_CONNECTIONS_MAX {
            metrics::with(|m| m.overload_rejections += 1);
            return Err(ConnectError::Full);
        }
        let addrs = self.resolve().await?;
        let mut last = String::from("no address");
        for addr in addrs {
            let attempt =
                tokio::time::timeout(self.connect_timeout, Conn::connect(addr, self.backend)).await;
            match attempt {
                Ok(Ok(conn)) => {
                    let conn = match &self.tls {
                        Some(tls) => self.secure(conn, tls, addr).await?,
                        None => conn,
                    };
                    metrics::with(|m| m.upstream.connects += 1);
                    return Ok(Link::start(conn, self.slots.clone()));
                }
                Ok(Err(e)) => last = format!("connect to {addr}: {e}"),
                Err(_) => {
                    last = format!(
                        "connect to {addr}: timed out after {} ms",
                        self.connect_timeout.as_millis()
                    )
                }
            }
        }
        metrics::with(|m| m.upstream.connect_failures += 1);
        Err(ConnectError::Connect(last))
    }

    /// Runs the TLS handshake on a new connection, within the connect timeout. A failure
    /// is one log line and a counter; the agent gets the reason (never a secret: names,
    /// dates and alert names only).
    async fn secure(
        &self,
        conn: Conn,
        tls: &Upstream,
        addr: SocketAddr,
    ) -> Result<Conn, ConnectError> {
        let failed = |why: String| {
            metrics::with(|m| m.upstream.connect_failures += 1);
            log::warn(format_args!(
                "client: TLS handshake with {} ({addr}) failed: {why}",
                self.url.authority
            ));
            ConnectError::Tls(why)
        };
        let session = tls.session().map_err(|e| failed(e.to_string()))?;
        let conn = conn.with_tls(session);
        match conn.handshake(self.connect_timeout).await {
            Ok(_) => Ok(conn),
            Err(e) => {
                conn.shutdown();
                Err(failed(e.to_string()))
            }
        }
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
