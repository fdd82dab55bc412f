//! The upstream-facing `client` binding: every internal stream it is handed becomes MCP
//! Streamable HTTP toward one upstream server.
//!
//! - A lifecycle stream becomes an upstream session ([`session`]): `initialize` and
//!   `notifications/initialized` upstream, the upstream's `MCP-Session-Id` and protocol
//!   version sent on every later request, the upstream GET event stream relayed while the
//!   session lives, `DELETE` upstream when it ends.
//! - A request stream becomes one upstream POST ([`request`]) whose params stream through
//!   with the exact `Content-Length` computed up front, and whose JSON or SSE answer is
//!   decoded incrementally ([`exchange`]) into the result DATA, in-band events, or a typed
//!   RESET (JSON-RPC error, bearer challenge).
//! - Connections are pooled per worker ([`pool`]); an exchange reads its connection in
//!   place ([`wire`]), and on io_uring a read whose exchange gave up (a timer, a
//!   cancellation) stays in flight in the wire for the next one, so no read is dropped.
//! - Its `mcpyard_upstream_*` counters are kept per worker in [`metrics`].
//!
//! Everything here lives on one worker: the binding is built once per worker and its
//! sessions, connections and tasks stay there.

pub mod bearer;
mod exchange;
pub mod fetch;
pub mod metrics;
mod pool;
mod request;
mod session;
mod wire;

use crate::FastMap;
use crate::binding::client::metrics as client_metrics;
use crate::binding::{Exit, Serving};
use crate::config::{ClientAuth, ClientBinding, UpstreamUrl};
use crate::http::{self, BodyFraming, ResponseEvent, ResponseHead};
use crate::jsonrpc;
use crate::limits::{UPSTREAM_COALESCE_BYTES_MAX, UPSTREAM_POOL_IDLE_TIMEOUT};
use crate::runtime::encode_pool::{self, Encoded};
use crate::runtime::pass;
use crate::runtime::{Backend, Slots};
use crate::stream::{BearerChallenge, Callee, Kind, Reset};
use bytes::{BufMut, Bytes, BytesMut};
use exchange::{BadBody, BodyKind, Broken, Messages, Response, Upward};
use pool::{ConnectError, Lease, Pool};
use session::UpSession;
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

/// What mcpyard calls itself in `clientInfo` upstream.
const CLIENT_NAME: &str = "mcpyard";

/// The protocol version mcpyard asks upstreams for.
const PROTOCOL_VERSION: &str = crate::binding::protocol::LATEST;

/// `Accept` of every upstream POST (MCP: both media types must be listed).
const ACCEPT_BOTH: &[u8] = b"application/json, text/event-stream";

/// One worker's instance of a client binding: the exit a server or proxy hands streams to.
pub struct Client {
    /// This instance, for the tasks `Exit::open` spawns.
    me: Weak<Client>,
    /// The binding's name, for logs.
    name: Rc<str>,
    url: Rc<UpstreamUrl>,
    authorization: Option<ClientAuth>,
    response_timeout: Duration,
    pool: Pool,
    /// Upstream sessions of this worker, by the id given to the caller.
    /// Invariant: `len() <= SESSIONS_PER_WORKER_MAX`.
    sessions: RefCell<FastMap<Rc<str>, Rc<UpSession>>>,
    /// Sessions being opened (their `initialize` upstream in flight): they count against
    /// `SESSIONS_PER_WORKER_MAX` from the start, not from when they enter `sessions`.
    opening: Cell<usize>,
    worker: u8,
    /// Session ids minted on this worker so far.
    minted: Cell<u64>,
}

impl Client {
    /// Builds the worker-local instance; must run inside the worker's runtime.
    pub fn new(
        name: &str,
        cfg: &ClientBinding,
        worker: u8,
        backend: Backend,
        slots: Rc<Slots>,
        tls: Option<crate::certs::Upstream>,
    ) -> Rc<Client> {
        let url = Rc::new(cfg.server.clone());
        let client = Rc::new_cyclic(|me| Client {
            me: me.clone(),
            name: Rc::from(name),
            pool: Pool::new(url.clone(), backend, slots, cfg.connect_timeout, tls),
            url,
            authorization: cfg.authorization.clone(),
            response_timeout: cfg.response_timeout,
            sessions: RefCell::new(FastMap::default()),
            opening: Cell::new(0),
            worker,
            minted: Cell::new(0),
        });
        tokio::task::spawn_local(sweep_idle(Rc::downgrade(&client)));
        client
    }

    /// Upstream sessions open on this worker.
    pub fn sessions(&self) -> usize {
        self.sessions.borrow().len()
    }

    /// Closes idle pooled connections (drain).
    pub fn close_idle(&self) {
        self.pool.close_idle();
    }

    /// A fresh id for a session of this worker (`c<worker>-<n>`, unique per process).
    fn mint_session_id(&self) -> Rc<str> {
        let n = self.minted.get() + 1;
        self.minted.set(n);
        Rc::from(format!("c{:02x}-{n}", self.worker))
    }

    /// Writes a request head toward the upstream: target, `Host`, the MCP headers of
    /// `session` (when it has been initialized), the credential, and the framing.
    /// `Err(UpErr::Head)` (nothing written, one log line, a counter) if a value would
    /// break the head: the request is not sent.
    fn head(&self, req: &Outgoing<'_>, out: &mut BytesMut) -> Result<(), UpErr> {
        if let (Some(session), "POST", Some(len), None, false) = (
            req.session,
            req.method,
            req.body_len,
            req.last_event_id,
            req.initialize,
        ) {
            // A session's POST (every call): the fixed part comes from the session's
            // template, checked when it was made; only the length is written here.
            let whole = Outgoing {
                body_len: None,
                ..*req
            };
            return session.post_head(req.accept, len, out, |fixed| {
                self.encode_head(&whole, fixed)
            });
        }
        self.encode_head(req, out)
    }

    /// Writes the head of `req` field by field, checking every value.
    fn encode_head(&self, req: &Outgoing<'_>, out: &mut BytesMut) -> Result<(), UpErr> {
        let mut headers: Vec<(&str, &[u8])> = Vec::with_capacity(8);
        headers.push(("host", self.url.authority.as_bytes()));
        let ids = req.session.filter(|_| !req.initialize).map(|s| s.ids());
        if req.method == "POST" {
            headers.push(("content-type", b"application/json"));
        }
        headers.push(("accept", req.accept));
        if let Some(ids) = &ids {
            if let Some(sid) = &ids.session {
                headers.push(("mcp-session-id", sid));
            }
            if let Some(version) = &ids.version {
                headers.push(("mcp-protocol-version", version));
            }
        }
        let auth = req.session.and_then(|s| s.authorization.borrow().clone());
        if let Some(auth) = &auth {
            headers.push(("authorization", auth));
        }
        if let Some(last) = req.last_event_id {
            headers.push(("last-event-id", last));
        }
        let framing = match req.body_len {
            Some(n) => BodyFraming::Length(n),
            None => BodyFraming::None,
        };
        http::encode_request_head(req.method, &self.url.path_and_query, &headers, framing, out)
            .map_err(|e| {
                crate::log::warn(format_args!("client {}: request not sent: {e}", self.name));
                client_metrics::with(|m| m.heads_refused += 1);
                UpErr::Head(e)
            })
    }

    /// Sends a request whose body is known in full and waits for the response head
    /// (bounded by `response_timeout`). A reused connection that turns out closed before
    /// any response byte is retried once on a fresh one.
    async fn send(&self, req: &Outgoing<'_>, body: &[Bytes]) -> Result<Answered, UpErr> {
        let mut retried = false;
        loop {
            let lease = self.pool.take().await.map_err(UpErr::Connect)?;
            let reused = lease.link.reused;
            // Room for the body too when `write_known` coalesces it behind the head.
            let mut head = encode_pool::take(256 + coalesced_len(body).unwrap_or(0));
            self.head(req, &mut head)?;
            let sent =
                write_known(&lease, head, body, Instant::now() + self.response_timeout).await;
            let mut response = Response::new(lease);
            let outcome = match sent {
                Ok(()) => self.await_head(&mut response).await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(head) => return Ok(Answered { response, head }),
                Err(UpErr::Write | UpErr::Broken(Broken::Closed))
                    if reused && !retried && !response.started =>
                {
                    client_metrics::with(|m| m.stale_retries += 1);
                    retried = true;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Waits for the response head, closing the connection past `response_timeout`.
    async fn await_head(&self, response: &mut Response) -> Result<ResponseHead, UpErr> {
        // In the worker's deadline queue, not a runtime timer. `biased`: the head is often
        // already read; then the deadline is never polled, so it is never queued.
        let deadline = crate::runtime::deadline::until(pass::now() + self.response_timeout);
        tokio::select! {
            biased;
            event = response.next() => match event {
                Ok(ResponseEvent::Head(head)) => Ok(head),
                Ok(_) => Err(UpErr::Broken(Broken::Closed)),
                Err(b) => Err(UpErr::Broken(b)),
            },
            () = deadline => {
                response.lease.link.wire().close();
                client_metrics::with(|m| m.timeouts += 1);
                Err(UpErr::Timeout(self.response_timeout))
            }
        }
    }

    /// Sends one JSON-RPC message on `session` and reads its answer: `Ok(None)` for an
    /// accepted notification or response (202), `Ok(Some(result))` for a request's result.
    /// Events the upstream sends meanwhile are ignored (this is for the session's own
    /// traffic: initialize, notifications, answers, pings).
    async fn call(
        &self,
        session: &UpSession,
        body: Bytes,
        expect: Option<&str>,
    ) -> Result<Option<Bytes>, UpErr> {
        let req = Outgoing::post(Some(session), body.len());
        let Answered { response, head } = self.send(&req, &[body]).await?;
        check_status(&head)?;
        self.read_answer(response, &head, expect).await
    }

    /// Reads the answer to one of a session's own messages (a 2xx head has arrived):
    /// the result of the request with id `expect`, or nothing for an accepted notification
    /// or response. Events meanwhile are ignored. The whole answer must arrive within the
    /// response timeout; a connection whose answer ended cleanly goes back to the pool.
    async fn read_answer(
        &self,
        mut response: Response,
        head: &ResponseHead,
        expect: Option<&str>,
    ) -> Result<Option<Bytes>, UpErr> {
        let kind = BodyKind::of(head);
        let mut messages = Messages::new(kind);
        let mut result = None;
        let deadline = Instant::now() + self.response_timeout;
        if kind != BodyKind::Other || expect.is_some() {
            loop {
                let next = tokio::select! {
                    biased;
                    m = exchange::next_message(&mut response, &mut messages) => m,
                    () = tokio::time::sleep_until(deadline.into()) => {
                        response.lease.link.wire().close();
                        return Err(UpErr::Timeout(self.response_timeout));
                    }
                };
                let Some(incoming) = next.map_err(UpErr::Exchange)? else {
                    break;
                };
                let Some(data) = incoming.data else { continue };
                match exchange::classify(&data, expect)
                    .map_err(|e| UpErr::Exchange(exchange::Failure::Body(e)))?
                {
                    Upward::Result(r) => {
                        result = Some(r);
                        if kind == BodyKind::Sse {
                            // An SSE answer may stay open; the result is all we wait for.
                            break;
                        }
                    }
                    Upward::Error(reset) => return Err(UpErr::Rpc(reset)),
                    Upward::Event(_) | Upward::Ignore => {}
                }
            }
        } else {
            // Accepted (a 2xx head, nothing to read from the body): the body is read only
            // so that the connection can serve again. One that does not end in time (no
            // framing, the upstream never closes) costs the connection, not the answer.
            let left = deadline.saturating_duration_since(Instant::now());
            if drain(&mut response, left).await.is_err() {
                response.lease.link.wire().close();
                return Ok(None);
            }
        }
        if expect.is_some() && result.is_none() {
            return Err(UpErr::Exchange(exchange::Failure::Body(
                BadBody::NotJsonRpc,
            )));
        }
        self.finish(response, head);
        Ok(result)
    }

    /// Returns a connection to the pool if its response ended cleanly (else closes it).
    fn finish(&self, response: Response, head: &ResponseHead) {
        if response.reusable(head) {
            self.pool.give_back(response.lease);
        }
    }
}

impl Exit for Client {
    fn serve(&self, callee: Callee) -> Option<Serving> {
        // None: the worker is shutting down; dropping the callee aborts the stream.
        let client = self.me.upgrade()?;
        if callee.begin.kind == Kind::Lifecycle {
            Some(Box::pin(session::serve(client, callee)))
        } else {
            Some(Box::pin(request::serve(client, callee)))
        }
    }
}

/// A request toward the upstream, before its head is written.
struct Outgoing<'a> {
    method: &'static str,
    session: Option<&'a UpSession>,
    /// `Content-Length`; `None` for a request without a body.
    body_len: Option<u64>,
    accept: &'static [u8],
    last_event_id: Option<&'a [u8]>,
    /// An `initialize`: sent without the session's MCP headers (they may name the upstream
    /// session it replaces, which the session's other requests go on naming until it
    /// succeeds), with its credential.
    initialize: bool,
}

impl<'a> Outgoing<'a> {
    fn post(session: Option<&'a UpSession>, len: usize) -> Outgoing<'a> {
        Outgoing {
            method: "POST",
            session,
            body_len: Some(len as u64),
            accept: ACCEPT_BOTH,
            last_event_id: None,
            initialize: false,
        }
    }
}

/// A response whose head arrived.
struct Answered {
    response: Response,
    head: ResponseHead,
}

/// Why an upstream exchange failed, as the caller will be told.
#[derive(Debug)]
enum UpErr {
    Connect(ConnectError),
    /// Writing the request failed (the upstream closed or reset the connection).
    Write,
    /// No response head within the response timeout.
    Timeout(Duration),
    Broken(Broken),
    Exchange(exchange::Failure),
    /// A non-2xx status without anything more specific.
    Status(u16),
    /// 401/403 with a Bearer challenge.
    Bearer(BearerChallenge),
    /// The upstream answered with a JSON-RPC error.
    Rpc(Reset),
    /// 404 on a request carrying the upstream session: the upstream forgot the session.
    SessionGone,
    /// The caller went away (cancelled, timed out, disconnected).
    Gone,
    /// The request head was refused before anything was sent (a value with a control
    /// byte: never written upstream).
    Head(http::HeadError),
}

impl UpErr {
    /// The RESET that tells the caller, from a client whose upstream credential is `auth`.
    /// A bearer challenge is relayed as one (marked `forwarded` when the refused credential
    /// was the agent's own), but not when the credential was the gateway's own service
    /// token: the agent cannot answer that one, so it hears of a failure.
    fn into_reset(self, auth: Option<&ClientAuth>) -> Reset {
        let message = match self {
            UpErr::Rpc(reset) => return reset,
            UpErr::Bearer(mut challenge) => match auth {
                Some(ClientAuth::Bearer(_)) => format!(
                    "Upstream refused the gateway's credential (HTTP {})",
                    challenge.status
                ),
                forward => {
                    challenge.forwarded = matches!(forward, Some(ClientAuth::Forward));
                    return Reset::Bearer(challenge);
                }
            },
            UpErr::Gone => return Reset::Plain,
            UpErr::Connect(e) => e.describe(),
            UpErr::Write => "Upstream closed the connection while the request was sent".to_owned(),
            UpErr::Timeout(d) => format!("Upstream did not answer within {} ms", d.as_millis()),
            UpErr::Broken(b) => b.describe(),
            UpErr::Exchange(f) => f.describe(),
            UpErr::Status(s) => format!("Upstream answered HTTP {s}"),
            UpErr::SessionGone => "Upstream session expired and could not be renewed".to_owned(),
            UpErr::Head(e) => format!("Request not sent upstream: {e}"),
        };
        Reset::Error {
            code: jsonrpc::INTERNAL_ERROR,
            message: Rc::from(message.as_str()),
            data: None,
        }
    }
}

/// Maps a non-2xx status to the failure it means.
fn check_status(head: &ResponseHead) -> Result<(), UpErr> {
    match head.status {
        200..=299 => Ok(()),
        401 | 403 => match bearer::parse(head.status, head.headers.get_all("www-authenticate")) {
            Some(challenge) => {
                client_metrics::with(|m| m.bearer_challenges += 1);
                Err(UpErr::Bearer(challenge))
            }
            None => Err(UpErr::Status(head.status)),
        },
        404 => Err(UpErr::SessionGone),
        s => Err(UpErr::Status(s)),
    }
}

/// Closes the client's expired idle connections every half idle timeout, for as long as
/// the client lives. Waits in the worker's deadline queue, not on a tokio timer: a timer
/// that stays in tokio's wheel made every turn of the loop dearer (about 580 instructions
/// per `tools/call` in callgrind).
async fn sweep_idle(client: Weak<Client>) {
    loop {
        crate::runtime::deadline::until(Instant::now() + UPSTREAM_POOL_IDLE_TIMEOUT / 2).await;
        let Some(client) = client.upgrade() else {
            return;
        };
        client.pool.close_expired();
    }
}

/// Reads a response body to its end, discarding it, within `timeout` (past it the
/// connection is closed: a body with no framing ends only when the upstream closes, and
/// one that never does must not hold the connection and its task for good).
async fn drain(response: &mut Response, timeout: Duration) -> Result<(), UpErr> {
    let read = async {
        loop {
            match response.next().await.map_err(UpErr::Broken)? {
                ResponseEvent::End => return Ok(()),
                ResponseEvent::Data(_) => {}
                ResponseEvent::Head(_) => return Err(UpErr::Broken(Broken::Closed)),
            }
        }
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(done) => done,
        Err(_) => {
            response.lease.link.wire().close();
            Err(UpErr::Timeout(timeout))
        }
    }
}

/// The length of `body` when it is small enough to go behind its head in one write.
fn coalesced_len(body: &[Bytes]) -> Option<usize> {
    let total: usize = body.iter().map(Bytes::len).sum();
    (total <= UPSTREAM_COALESCE_BYTES_MAX).then_some(total)
}

/// Writes a head and a known body, coalescing small bodies into one write. Past
/// `deadline` the connection is closed (which completes a write stuck on a full socket).
async fn write_known(
    lease: &Lease,
    mut head: Encoded,
    body: &[Bytes],
    deadline: Instant,
) -> Result<(), UpErr> {
    if coalesced_len(body).is_some() {
        for piece in body {
            head.put_slice(piece);
        }
        return write_bounded(lease, head.freeze(), deadline).await;
    }
    write_bounded(lease, head.freeze(), deadline).await?;
    for piece in body {
        write_bounded(lease, piece.clone(), deadline).await?;
    }
    Ok(())
}

/// Writes `data`, closing the connection if the write is still pending at `deadline`.
/// The write future is never dropped before it completes (io_uring rule).
async fn write_bounded(lease: &Lease, data: Bytes, deadline: Instant) -> Result<(), UpErr> {
    let wire = lease.link.wire();
    let write = wire.write(data);
    tokio::pin!(write);
    let result = tokio::select! {
        biased;
        r = &mut write => r,
        () = tokio::time::sleep_until(deadline.into()) => {
            wire.close();
            write.await
        }
    };
    result.map_err(|_| UpErr::Write)
}
