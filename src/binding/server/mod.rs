//! The agent-facing `server` binding: MCP Streamable HTTP (2025-11-25, 2025-06-18).
//!
//! Flow: [`net`] decodes HTTP/1.1 requests off the socket; [`Server::handle`] admits them
//! (path, method, Host, Origin) and either serves them here or, when the session lives on
//! another worker, hands them to that worker's inbox; [`app`] speaks MCP (POST),
//! [`session`] owns sessions and their lifecycle stream, [`get`] the GET event stream,
//! [`reply`] renders each request's reply, and [`shared`] keeps sessions in a store that
//! every node of a cluster reads. Responses go through a [`sink::Sink`], local or remote.
//! The binding's own counters (sessions, connections, hand-offs, HTTP errors) are kept
//! per worker in [`metrics`].

pub(crate) mod app;
pub mod auth;
pub(crate) mod edge;
pub(crate) mod get;
pub(crate) mod lookup;
pub mod metrics;
pub mod net;
pub(crate) mod reply;
pub(crate) mod session;
pub mod session_id;
pub(crate) mod shared;
pub mod sink;

use crate::FastMap;
use crate::binding::Exit;
use crate::binding::server::metrics as server_metrics;
use crate::config::ServerBinding;
use crate::http::Method;
use crate::runtime::Inboxes;
use crate::store::Store;
use net::Request;
use session::Session;
use sink::{ConnShared, Handoff, Part, Sink, Verdict};
use std::cell::{Cell, RefCell};
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

use crate::binding::protocol::HEADER_VERSIONS;
pub use crate::binding::protocol::PROTOCOL_VERSIONS;

/// One worker's instance of a server binding.
pub struct Server {
    /// The binding's name (logs, metrics).
    pub name: Rc<str>,
    /// Index among the config's server bindings (same on every worker).
    pub index: usize,
    pub(crate) cfg: ServerBinding,
    pub(crate) worker: u8,
    pub(crate) exit: Rc<dyn Exit>,
    inboxes: Inboxes,
    /// The listener is a loopback address (tightens default Origin/Host rules).
    loopback: bool,
    pub(crate) sessions: RefCell<FastMap<Rc<str>, Rc<Session>>>,
    /// Sessions being opened (their `initialize` waits for the exit): they count against
    /// `SESSIONS_PER_WORKER_MAX` from the start.
    pub(crate) opening: Cell<usize>,
    /// `sessions: { store }`: the store every node of the cluster finds sessions in.
    pub(crate) shared: Option<Arc<dyn Store>>,
    /// Shared sessions being taken up from the store, by id: later requests for the same
    /// one wait for it. Invariant: `len() <= SHARED_SESSION_ADOPTIONS_MAX`.
    pub(crate) adopting: RefCell<FastMap<Rc<str>, Rc<lookup::Adoption>>>,
    /// Shared session ids the store was just found not to hold.
    pub(crate) absent: RefCell<lookup::Absent>,
    draining: Cell<bool>,
    /// Agents connect over TLS with the current config (swapped on SIGHUP); `None`: plain.
    pub(crate) tls: Option<Arc<arc_swap::ArcSwap<rustls::ServerConfig>>>,
    /// `auth`: this worker's side of the token check, rules and rate limits.
    pub(crate) gate: Option<auth::Gate>,
}

/// What every worker's instance of a binding shares with the others.
#[derive(Default)]
pub struct Common {
    /// The TLS config agents connect with (swapped on SIGHUP); `None`: plain HTTP.
    pub tls: Option<Arc<arc_swap::ArcSwap<rustls::ServerConfig>>>,
    /// `sessions: { store }`.
    pub sessions: Option<Arc<dyn Store>>,
    /// `auth`: the config and key set every worker checks tokens with.
    pub auth: Option<Arc<auth::Guard>>,
}

thread_local! {
    /// This worker's server instances, by server index, for hand-offs from other workers.
    static SERVERS: RefCell<Vec<Rc<Server>>> = const { RefCell::new(Vec::new()) };
}

impl Server {
    /// Creates this worker's instance and registers it for hand-offs.
    pub fn new(
        name: &str,
        index: usize,
        cfg: ServerBinding,
        worker: u8,
        exit: Rc<dyn Exit>,
        inboxes: Inboxes,
        common: Common,
    ) -> Rc<Server> {
        let Common {
            tls,
            sessions: shared,
            auth,
        } = common;
        let loopback = cfg.listen.ip().is_loopback();
        let server = Rc::new(Server {
            name: Rc::from(name),
            index,
            cfg,
            worker,
            exit,
            inboxes,
            loopback,
            sessions: RefCell::new(FastMap::default()),
            opening: Cell::new(0),
            shared,
            adopting: RefCell::new(FastMap::default()),
            absent: RefCell::new(lookup::Absent::default()),
            draining: Cell::new(false),
            tls,
            gate: auth.map(auth::Gate::new),
        });
        SERVERS.with(|s| {
            let mut s = s.borrow_mut();
            assert!(s.len() == index);
            s.push(server.clone());
        });
        server
    }

    /// True once a graceful drain began: responses close their connections.
    pub fn draining(&self) -> bool {
        self.draining.get()
    }

    /// Admits one request and starts answering it; the answer goes to `sink`. A request
    /// served on this worker is returned as a future for the connection's own task to
    /// run (a task of its own per request would cost a spawn); refusals and hand-offs to
    /// another worker run on their own and give `None`.
    pub fn handle(
        self: Rc<Self>,
        req: Request,
        sink: Sink,
        shared: Rc<ConnShared>,
    ) -> Option<impl Future<Output = ()> + 'static> {
        if let Some(gate) = self.gate.as_ref()
            && gate.guard.is_metadata_path(req.head.path())
        {
            if !self.host_allowed(req.head.host()) {
                let refusal = edge::http_error(sink, 421, "host not allowed", None);
                tokio::task::spawn_local(refusal);
                return None;
            }
            let server = self.clone();
            tokio::task::spawn_local(async move {
                if let Some(gate) = server.gate.as_ref() {
                    auth::serve_metadata(&gate.guard, &req, sink).await;
                }
            });
            return None;
        }
        if let Err((status, message)) = self.admit(&req) {
            tokio::task::spawn_local(edge::http_error(sink, status, message, None));
            return None;
        }
        // The worker named in the id owns the session (another node's id names a worker
        // there: the same worker here, modulo this node's count, takes it up).
        let owner = req
            .head
            .headers
            .get("mcp-session-id")
            .and_then(session_id::owner)
            .map(|(_, worker)| usize::from(worker) % self.inboxes.len().max(1));
        match owner {
            Some(w) if w != usize::from(self.worker) => {
                self.hand_off(w, req, sink, shared);
                None
            }
            _ => Some(self.serve(req, sink)),
        }
    }

    /// Serves a request whose session (if any) lives on this worker.
    async fn serve(self: Rc<Self>, req: Request, sink: Sink) {
        let who = match self.gate.as_ref() {
            None => None,
            Some(gate) => match gate.check(&req).await {
                Ok(identity) => Some(identity),
                Err(refusal) => return auth::refuse(&gate.guard, &req, sink, refusal).await,
            },
        };
        match req.head.method {
            Method::Post => app::post(self, req, sink, who).await,
            Method::Get => get::get(self, req, sink, who).await,
            Method::Delete => lookup::delete(self, req, sink, who).await,
            _ => edge::http_error(sink, 405, "method not allowed", None).await,
        }
    }

    /// Sends the request to the worker owning its session and relays the answer back.
    fn hand_off(&self, owner: usize, req: Request, sink: Sink, shared: Rc<ConnShared>) {
        let (tx, rx) = mpsc::channel(crate::limits::CROSS_WORKER_REPLY_QUEUE_LEN);
        let handoff = Arc::new(Handoff::default());
        let answer = sink.answer();
        let index = self.index;
        let owner_handoff = handoff.clone();
        let task = Box::new(move || {
            let server = SERVERS.with(|s| s.borrow().get(index).cloned());
            if let Some(server) = server {
                let sink = Sink::from_channel(tx, owner_handoff, answer);
                tokio::task::spawn_local(crate::runtime::pass::run(server.serve(req, sink)));
            }
        });
        if self.inboxes.send(owner, task).is_err() {
            crate::metrics::with(|m| m.overload_rejections += 1);
            tokio::task::spawn_local(edge::http_error(sink, 503, "worker busy", None));
            return;
        }
        server_metrics::with(|m| m.handoffs += 1);
        // The verdict exists before the relay's task first runs, so a task dropped
        // unpolled (the worker stopping) still gives one.
        let verdict = Verdict::new(handoff.clone());
        tokio::task::spawn_local(relay(rx, sink, shared, handoff, verdict));
    }

    /// Path, method, Host and Origin checks: `Err((status, message))` to refuse.
    fn admit(&self, req: &Request) -> Result<(), (u16, &'static str)> {
        if req.head.path() != self.cfg.path {
            return Err((404, "not found"));
        }
        if !matches!(req.head.method, Method::Post | Method::Get | Method::Delete) {
            return Err((405, "method not allowed"));
        }
        if !self.host_allowed(req.head.host()) {
            return Err((421, "host not allowed"));
        }
        if let Some(origin) = req.head.headers.get("origin")
            && !self.origin_allowed(origin)
        {
            return Err((403, "origin not allowed"));
        }
        Ok(())
    }

    fn host_allowed(&self, host: Option<&[u8]>) -> bool {
        let Some(host) = host.and_then(|h| std::str::from_utf8(h).ok()) else {
            // HTTP/1.0 without Host: nothing to check against.
            return true;
        };
        let name = host_name(host);
        match &self.cfg.hosts {
            Some(allowed) => allowed.iter().any(|a| a.eq_ignore_ascii_case(name)),
            None if self.loopback => is_loopback_name(name),
            None => true,
        }
    }

    fn origin_allowed(&self, origin: &[u8]) -> bool {
        let Ok(origin) = std::str::from_utf8(origin) else {
            return false;
        };
        match &self.cfg.origins {
            Some(allowed) => allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)),
            None if self.loopback => {
                let rest = origin
                    .strip_prefix("http://")
                    .or_else(|| origin.strip_prefix("https://"));
                rest.is_some_and(|r| !r.contains('/') && is_loopback_name(host_name(r)))
            }
            None => false,
        }
    }

    /// Checks `MCP-Protocol-Version`: absent (clients of 2025-03-26 never send it) or a
    /// version mcpyard speaks is fine. It is not held to the session's own version: MCP
    /// asks a 400 for an invalid or unsupported one only, and the conformance suite's
    /// clients send another supported version than the one negotiated.
    pub(crate) fn version_ok(req: &Request) -> bool {
        match req.head.headers.get("mcp-protocol-version") {
            None => true,
            Some(v) => HEADER_VERSIONS.iter().any(|s| s.as_bytes() == v),
        }
    }

    /// Begins a graceful drain: finish in-flight requests up to `deadline`, then close
    /// every session.
    pub async fn drain(&self, deadline: Instant) {
        self.draining.set(true);
        while Instant::now() < deadline {
            let busy = self.sessions.borrow().values().any(|s| s.has_requests());
            if !busy {
                break;
            }
            tokio::time::sleep(crate::limits::TICK).await;
        }
        let sessions = if self.shared.is_some() {
            // The other nodes of the cluster go on with them.
            lookup::detach_all(self)
        } else {
            let sessions: Vec<Rc<Session>> = self.sessions.borrow().values().cloned().collect();
            for s in &sessions {
                session::close(self, s, "shutdown");
            }
            sessions
        };
        // Let the streams those closes ended write their last bytes (to a local
        // connection or to another worker's relay) before the worker stops.
        while Instant::now() < deadline && sessions.iter().any(|s| s.streaming()) {
            tokio::time::sleep(crate::limits::TICK).await;
        }
    }
}

/// Copies a remote response onto the local connection (runs on the connection's worker).
/// Its writes carry the response's deadline once the owner set one (else each is bounded
/// by the connection's write limit): the owner may have queued the whole answer and ended
/// before an agent that stopped reading takes it. The owner's sink going before the
/// response's end (it failed, or its deadline passed) stops the relay at once, even in the
/// middle of a write. Dropping the sink then aborts the connection.
async fn relay(
    mut rx: mpsc::Receiver<Part>,
    mut sink: Sink,
    shared: Rc<ConnShared>,
    handoff: Arc<Handoff>,
    mut verdict: Verdict,
) {
    let _ = shared; // the sink holds the connection; kept for symmetry of ownership
    loop {
        let part = tokio::select! {
            biased;
            () = handoff.aborted.notified() => None,
            p = rx.recv() => p,
            () = sink.closed() => None,
        };
        // The deadline this write starts with (the owner may move it meanwhile, for its
        // timeout answer).
        let until = handoff.until();
        if let Some(at) = until {
            sink.bound_until(at);
        }
        let write = async {
            match part {
                Some(Part::Bytes(b)) => sink.write_raw(b).await.is_ok(),
                Some(Part::Parts(parts)) => sink.write_raw_parts(parts).await.is_ok(),
                Some(Part::End { keep_alive }) => {
                    sink.complete_raw(keep_alive);
                    verdict.written();
                    false
                }
                // The owner dropped the response unfinished: dropping the sink aborts.
                None => false,
            }
        };
        let written = tokio::select! {
            biased;
            () = handoff.aborted.notified() => {
                // A write cut because the response's deadline passed (the sink's own cut,
                // at the same deadline, would have counted it had it come first).
                if until.is_some_and(|at| Instant::now() >= at) {
                    server_metrics::with(|m| m.write_deadline_cuts += 1);
                }
                return;
            }
            w = write => w,
        };
        if !written {
            return;
        }
    }
}

/// `host[:port]` → host (brackets kept for IPv6 literals).
fn host_name(authority: &str) -> &str {
    if authority.starts_with('[') {
        return match authority.find(']') {
            Some(end) => authority.get(..=end).unwrap_or(authority),
            None => authority,
        };
    }
    match authority.rsplit_once(':') {
        Some((h, port)) if port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    }
}

fn is_loopback_name(name: &str) -> bool {
    if name.eq_ignore_ascii_case("localhost") {
        return true;
    }
    let bare = name.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_split_from_ports() {
        assert_eq!(host_name("localhost:7114"), "localhost");
        assert_eq!(host_name("[::1]:80"), "[::1]");
        assert_eq!(host_name("example.com"), "example.com");
        assert!(is_loopback_name("[::1]"));
        assert!(is_loopback_name("127.0.0.2"));
        assert!(is_loopback_name("LOCALHOST"));
        assert!(!is_loopback_name("evil.example"));
        assert!(!is_loopback_name("127.0.0.1.evil.example"));
    }
}
