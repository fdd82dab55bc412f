//! Request streams: one upstream POST per internal request stream.
//!
//! The body is `{"jsonrpc":"2.0","id":<n>,"method":"<m>","params":` + the caller's params
//! DATA + `}`, so its `Content-Length` is known from the `Begin` before any params byte
//! arrives and the params are written as they come, never assembled. The pieces are kept
//! (they are reference-counted slices, not copies) until the response head arrives, so a
//! request can be sent again once: on a fresh connection when a reused one turns out dead,
//! or after re-initializing an upstream session the upstream forgot (404).
//!
//! The answer is read with [`super::exchange`]: a JSON document, or an event stream whose
//! progress, logging and server-to-client requests become FLUSH events in order, and whose
//! response becomes the result DATA. An event stream that breaks before the response is
//! resumed with `Last-Event-ID` (after the upstream's `retry:`) when the upstream gave
//! event ids. Cancellation (the caller RESETs the reply or ABORTs the initial) closes the
//! upstream connection and sends `notifications/cancelled` for the upstream request id.

use super::exchange::{self, BodyKind, Broken, Messages, Response, Upward};
use super::pool::Lease;
use super::session::{self, UpSession};
use super::{Answered, Client, Outgoing, UpErr, check_status, write_bounded, write_known};
use crate::binding::client::metrics as client_metrics;
use crate::config::ClientAuth;
use crate::http::{Decimal, ResponseEvent};
use crate::jsonrpc::{self, ResultScanner, ScanError, ScanEvent, ScanEvents};
use crate::limits::{
    MESSAGE_BYTES_MAX, UPSTREAM_COALESCE_BYTES_MAX, UPSTREAM_RESULT_HOLD_BYTES,
    UPSTREAM_RESUME_ATTEMPTS_MAX, UPSTREAM_RETRY_DEFAULT, UPSTREAM_RETRY_MAX, UPSTREAM_RETRY_MIN,
};
use crate::runtime::{encode_pool, pass};
use crate::stream::{Callee, Challenge, Flush, Frame, ReplyBegin, Throttle, pieces};
use bytes::{BufMut, Bytes, BytesMut};
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Result slices of one answer held back inline: a result read in one or two pieces is a
/// slice or a few, so holding it allocates nothing (small slices are joined: a result in
/// one-byte chunks is held in few pieces, see [`pieces::keep`]).
type HeldResult = smallvec::SmallVec<[Bytes; 4]>;

/// Bytes set aside for an upstream request's head (request line and a handful of short
/// headers): a guess for the buffer's first size, not a limit (a longer head grows it).
const HEAD_BYTES_TYPICAL: usize = 256;

/// Serves one request stream.
pub async fn serve(client: Rc<Client>, callee: Callee) {
    let found = client
        .sessions
        .borrow()
        .get(&*callee.begin.session)
        .cloned();
    let Some(session) = found else {
        callee
            .initial
            .reset(exchange::upstream_error("Unknown upstream session"));
        callee.reply.abort();
        return;
    };
    if callee.begin.params_len as usize > MESSAGE_BYTES_MAX {
        callee
            .initial
            .reset(exchange::upstream_error("Params too large"));
        callee.reply.abort();
        return;
    }
    if matches!(client.authorization, Some(ClientAuth::Forward))
        && let Some(renewed) = &callee.begin.authorization
    {
        *session.authorization.borrow_mut() = Some(renewed.clone());
    }
    let rpc_id = session.next_rpc_id();
    let mut exchange = Exchange {
        client: &client,
        session: &session,
        callee: &callee,
        id: Decimal::new(rpc_id),
        params: None,
        params_more: Vec::new(),
        params_read: 0,
        begun: Cell::new(false),
    };
    let outcome = exchange.run().await;
    client_metrics::with(|m| m.requests += 1);
    match outcome {
        Ok(()) => {}
        Err(UpErr::Gone) => {
            callee.reply.abort();
            client_metrics::with(|m| m.cancelled += 1);
            tokio::task::spawn_local(cancel_upstream(client.clone(), session.clone(), rpc_id));
        }
        Err(e) => {
            client_metrics::with(|m| m.failed += 1);
            callee
                .initial
                .reset(e.into_reset(client.authorization.as_ref()));
            callee.reply.abort();
        }
    }
}

/// Tells the upstream a request is abandoned (MCP `notifications/cancelled`).
async fn cancel_upstream(client: Rc<Client>, session: Rc<UpSession>, rpc_id: u64) {
    if session.is_closed() {
        return;
    }
    let mut params = BytesMut::with_capacity(64);
    params.put_slice(b"{\"requestId\":");
    params.put_slice(rpc_id.to_string().as_bytes());
    params.put_slice(b",\"reason\":\"Cancelled by the client\"}");
    let mut body = BytesMut::with_capacity(128);
    jsonrpc::write_notification("notifications/cancelled", Some(&params), &mut body);
    let _ = client.call(&session, body.freeze(), None).await;
}

/// One request in flight.
struct Exchange<'a> {
    client: &'a Rc<Client>,
    session: &'a Rc<UpSession>,
    callee: &'a Callee,
    /// Our upstream JSON-RPC id, as its lexeme.
    id: Decimal,
    /// The params pieces read so far (kept for a resend): the first, and any after it
    /// (most params come in one piece, which then costs no allocation here).
    params: Option<Bytes>,
    params_more: Vec<Bytes>,
    params_read: usize,
    begun: Cell<bool>,
}

/// What woke a wait on the upstream.
enum Wake<T> {
    Upstream(T),
    /// The caller went away (cancelled, timed out).
    Gone,
    /// The agent answered a server-to-client request of this request.
    Answer(Bytes, Option<Bytes>, Option<Bytes>),
    Deadline,
}

impl Exchange<'_> {
    async fn run(&mut self) -> Result<(), UpErr> {
        let (mut response, head) = self.send().await?;
        let kind = BodyKind::of(&head);
        let outcome = match kind {
            BodyKind::Json => self.answer_json(&mut response).await.map(|()| None),
            // Boxed: an event-stream answer's state (resume, nested waits) is three times
            // a JSON answer's, and a spawned task is as large as its largest state.
            BodyKind::Sse => Box::pin(self.answer_sse(&mut response)).await,
            BodyKind::Other => Err(UpErr::Exchange(exchange::Failure::Body(
                exchange::BadBody::NotJsonRpc,
            ))),
        };
        match outcome {
            Ok(Some(resumed)) => {
                // The result came on a resumed stream; the original connection is over.
                drop(response);
                drop(resumed);
                Ok(())
            }
            Ok(None) => {
                if kind == BodyKind::Json {
                    self.client.finish(response, &head);
                }
                Ok(())
            }
            Err(e) => {
                response.lease.link.wire().close();
                Err(e)
            }
        }
    }

    /// Sends the request (once more after a dead reused connection or a forgotten
    /// session) until a 2xx head arrives.
    async fn send(&mut self) -> Result<(Response, crate::http::ResponseHead), UpErr> {
        let mut stale_retry = true;
        let mut renew = true;
        loop {
            let generation = self.session.ids().generation;
            let lease = self.with_caller(self.client.pool.take()).await?;
            let lease = lease.map_err(UpErr::Connect)?;
            let reused = lease.link.reused;
            let written = self.write(&lease).await;
            let mut response = Response::new(lease);
            let head = match written {
                Ok(()) => match self
                    .with_caller(self.client.await_head(&mut response))
                    .await
                {
                    Ok(head) => head,
                    Err(e) => {
                        response.lease.link.wire().close();
                        return Err(e);
                    }
                },
                Err(e) => Err(e),
            };
            let failure = match head.and_then(|h| check_status(&h).map(|()| h)) {
                Ok(head) => return Ok((response, head)),
                Err(e) => e,
            };
            response.lease.link.wire().close();
            match failure {
                UpErr::Write | UpErr::Broken(Broken::Closed)
                    if reused && stale_retry && !response.started =>
                {
                    client_metrics::with(|m| m.stale_retries += 1);
                    stale_retry = false;
                }
                UpErr::SessionGone if renew && self.session.ids().session.is_some() => {
                    renew = false;
                    drop(response);
                    // The caller may go meanwhile (its deadline, a cancellation): then this
                    // request stops waiting for the renewal, which goes on without it.
                    let renewal = session::renew(self.client, self.session, generation);
                    if !self
                        .with_caller(async { renewal.await.unwrap_or(false) })
                        .await?
                    {
                        return Err(UpErr::SessionGone);
                    }
                }
                UpErr::SessionGone => return Err(UpErr::Status(404)),
                e => return Err(e),
            }
        }
    }

    /// Writes head and body; the first time, the params come from the caller as they
    /// arrive, later times from the kept pieces.
    async fn write(&mut self, lease: &Lease) -> Result<(), UpErr> {
        let begin = &self.callee.begin;
        let params_len = begin.params_len as usize;
        let mut prefix = encode_pool::take(64);
        prefix.put_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
        prefix.put_slice(self.id.as_str().as_bytes());
        prefix.put_slice(b",\"method\":");
        jsonrpc::escape_str(begin.method_name(), &mut prefix);
        if params_len > 0 {
            prefix.put_slice(b",\"params\":");
        }
        let suffix: &'static [u8] = b"}";
        let body_len = prefix.len() + params_len + suffix.len();
        let req = Outgoing::post(Some(self.session), body_len);
        // Room for the head, the prefix and the params coalesced below, so the params'
        // copy does not grow (reallocate and copy) the buffer.
        let coalesced = params_len.min(UPSTREAM_COALESCE_BYTES_MAX) + suffix.len();
        let mut out = encode_pool::take(HEAD_BYTES_TYPICAL + prefix.len() + coalesced);
        self.client.head(&req, &mut out)?;
        out.put_slice(&prefix);
        // Back to the pool now, not after a wait for the agent's streamed params.
        drop(prefix);
        let deadline = pass::now() + self.client.response_timeout;
        if self.params_read == params_len {
            // All params are known (none, or a resend).
            let mut body = self.kept_params();
            body.push(Bytes::from_static(suffix));
            return write_known(lease, out, &body, deadline).await;
        }
        if self.params_read > 0 {
            // A resend after a write failed partway through the params (a pooled
            // connection the upstream had closed): the pieces read so far, kept, then the
            // rest as it comes.
            write_known(lease, out, &self.kept_params(), deadline).await?;
        } else {
            // Coalesce what is already queued if it is small; stream the rest.
            while let Some(frame) = self.callee.initial.try_next() {
                match frame {
                    Frame::Data(piece)
                        if out.len() + piece.len() <= UPSTREAM_COALESCE_BYTES_MAX =>
                    {
                        self.take_piece(&piece)?;
                        out.put_slice(&piece);
                    }
                    other => {
                        self.callee.initial.unread(other);
                        break;
                    }
                }
            }
            if self.params_read == params_len {
                out.put_slice(suffix);
                return write_bounded(lease, out.freeze(), deadline).await;
            }
            write_bounded(lease, out.freeze(), deadline).await?;
        }
        while self.params_read < params_len {
            match self.callee.initial.next().await {
                Some(Frame::Data(piece)) => {
                    self.take_piece(&piece)?;
                    write_bounded(lease, piece, deadline).await?;
                }
                Some(Frame::Begin(_) | Frame::Flush(_)) => {}
                Some(Frame::End | Frame::Abort) | None => return Err(UpErr::Gone),
            }
        }
        write_bounded(lease, Bytes::from_static(suffix), deadline).await
    }

    /// The params pieces read so far, in order (shared, not copied).
    fn kept_params(&self) -> Vec<Bytes> {
        self.params
            .iter()
            .chain(&self.params_more)
            .cloned()
            .collect()
    }

    /// Accounts one params piece: acknowledged, kept for a resend.
    fn take_piece(&mut self, piece: &Bytes) -> Result<(), UpErr> {
        self.callee.initial.ack(piece.len() as u32);
        if piece.len() > self.callee.begin.params_len as usize - self.params_read {
            return Err(UpErr::Rpc(exchange::upstream_error(
                "Params longer than announced",
            )));
        }
        self.params_read += piece.len();
        match self.params {
            None => self.params = Some(piece.clone()),
            Some(_) => self.params_more.push(piece.clone()),
        }
        Ok(())
    }

    /// Races `work` against the caller going away.
    async fn with_caller<T>(&self, work: impl std::future::Future<Output = T>) -> Result<T, UpErr> {
        tokio::pin!(work);
        loop {
            match self.wake(&mut work, None).await {
                Wake::Upstream(t) => return Ok(t),
                Wake::Gone => return Err(UpErr::Gone),
                Wake::Answer(id, result, error) => self.relay_answer(id, result, error),
                Wake::Deadline => unreachable!("no deadline given"),
            }
        }
    }

    /// Waits for `work`, the caller's RESET/ABORT/answers, or `deadline`.
    async fn wake<T>(
        &self,
        work: &mut std::pin::Pin<&mut impl std::future::Future<Output = T>>,
        deadline: Option<Instant>,
    ) -> Wake<T> {
        loop {
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            // Until every params byte is read, the initial direction belongs to `write`;
            // a caller that gives up meanwhile also RESETs the reply, seen below.
            let params_pending = self.params_read < self.callee.begin.params_len as usize;
            let initial = async {
                if params_pending {
                    std::future::pending::<()>().await;
                }
                loop {
                    match self.callee.initial.next().await {
                        Some(Frame::Data(piece)) => self.callee.initial.ack(piece.len() as u32),
                        Some(Frame::Begin(_) | Frame::Flush(_)) => {}
                        Some(Frame::Abort) | None => return,
                        // END comes only after our reply ended; keep waiting on the rest.
                        Some(Frame::End) => std::future::pending::<()>().await,
                    }
                }
            };
            // `biased`: the work is polled first and is often ready at once; the other
            // branches (and the timer's registration) are then skipped. The caller going
            // away is still seen: relaying to a gone caller fails, and the next wait polls
            // it; deadlines of work that never waits are checked by the callers.
            let woke = tokio::select! {
                biased;
                t = work.as_mut() => Wake::Upstream(t),
                throttle = self.callee.reply.throttle() => match throttle {
                    Some(Throttle::Challenge(Challenge::Answer { id, result, error })) => {
                        Wake::Answer(id, result, error)
                    }
                    // The server replays its own events to a reconnecting agent; the
                    // upstream stream goes on meanwhile.
                    Some(Throttle::Challenge(Challenge::Resume { .. } | Challenge::Suspended)) => {
                        continue;
                    }
                    Some(Throttle::Reset(_)) | None => Wake::Gone,
                },
                () = initial => Wake::Gone,
                () = sleep => Wake::Deadline,
            };
            return woke;
        }
    }

    fn relay_answer(&self, id: Bytes, result: Option<Bytes>, error: Option<Bytes>) {
        let body = session::answer_body(&id, result.as_deref(), error.as_deref());
        let client = self.client.me.upgrade();
        let session = self.client.sessions.borrow().get(&self.session.id).cloned();
        if let (Some(client), Some(session)) = (client, session) {
            tokio::task::spawn_local(async move {
                let _ = client.call(&session, body, None).await;
            });
        }
    }

    /// Sends the reply BEGIN once.
    async fn open_reply(&self) -> Result<(), UpErr> {
        if self.begun.replace(true) {
            return Ok(());
        }
        self.callee
            .reply
            .begin(ReplyBegin::default())
            .await
            .map_err(|_| UpErr::Gone)
    }

    /// Relays an event-stream answer: events as FLUSH, the response as DATA. Returns the
    /// resumed stream's response if the result came on one (the caller closes both).
    async fn answer_sse(&mut self, response: &mut Response) -> Result<Option<Response>, UpErr> {
        let mut messages = Messages::new(BodyKind::Sse);
        let mut last_event: Option<String> = None;
        let mut retry = UPSTREAM_RETRY_DEFAULT;
        let mut resumes = 0;
        let mut resumed: Option<Response> = None;
        // An event stream may be silent while the tool works, up to the request's deadline.
        let deadline = self.callee.begin.deadline;
        loop {
            let current = resumed.as_mut().unwrap_or(response);
            let next = {
                let work = exchange::next_message(current, &mut messages);
                tokio::pin!(work);
                loop {
                    match self.wake(&mut work, Some(deadline)).await {
                        Wake::Upstream(n) => break n,
                        Wake::Gone => return Err(UpErr::Gone),
                        Wake::Deadline => return Err(UpErr::Gone),
                        Wake::Answer(id, result, error) => self.relay_answer(id, result, error),
                    }
                }
            };
            let incoming = match next {
                Ok(Some(incoming)) => incoming,
                Ok(None) | Err(exchange::Failure::Broken(_))
                    if last_event.is_some() && resumes < UPSTREAM_RESUME_ATTEMPTS_MAX =>
                {
                    resumes += 1;
                    client_metrics::with(|m| m.resumed += 1);
                    let wait = async { tokio::time::sleep(retry).await };
                    tokio::pin!(wait);
                    loop {
                        match self.wake(&mut wait, Some(deadline)).await {
                            Wake::Upstream(()) => break,
                            Wake::Gone | Wake::Deadline => return Err(UpErr::Gone),
                            Wake::Answer(id, result, error) => self.relay_answer(id, result, error),
                        }
                    }
                    let last = last_event.clone().unwrap_or_default();
                    if let Some(old) = resumed.take() {
                        old.lease.link.wire().close();
                    }
                    resumed = Some(self.resume(&last).await?);
                    messages = Messages::new(BodyKind::Sse);
                    continue;
                }
                Ok(None) => {
                    return Err(UpErr::Exchange(exchange::Failure::Body(
                        exchange::BadBody::NotJsonRpc,
                    )));
                }
                Err(e) => return Err(UpErr::Exchange(e)),
            };
            if let Some(ms) = incoming.retry_ms {
                retry = Duration::from_millis(ms).clamp(UPSTREAM_RETRY_MIN, UPSTREAM_RETRY_MAX);
            }
            if let Some(id) = incoming.event_id {
                // An id this request could not send back is no place to resume from.
                last_event = Some(id).filter(|id| super::session::resendable(id));
            }
            let Some(data) = incoming.data else { continue };
            let upward = match exchange::classify(&data, Some(self.id.as_str())) {
                Ok(upward) => upward,
                // Not a message at all, so no answer to this request: skipped and counted,
                // as on the session's GET stream.
                Err(exchange::BadBody::NotAMessage) => {
                    client_metrics::count_malformed();
                    continue;
                }
                // A message that cannot be what it says (this request's response without
                // a result): the agent gets the error now, not at the deadline.
                Err(e) => return Err(UpErr::Exchange(exchange::Failure::Body(e))),
            };
            match upward {
                Upward::Result(result) => {
                    self.open_reply().await?;
                    // The event is read whole already: it goes on in one frame.
                    self.callee
                        .reply
                        .data_whole(result)
                        .await
                        .map_err(|_| UpErr::Gone)?;
                    self.callee.reply.end();
                    return Ok(resumed);
                }
                Upward::Error(reset) => return Err(UpErr::Rpc(reset)),
                Upward::Event(event) => {
                    self.open_reply().await?;
                    let flush = Flush { id: None, event };
                    self.callee
                        .reply
                        .flush(flush)
                        .await
                        .map_err(|_| UpErr::Gone)?;
                }
                Upward::Ignore => {}
            }
        }
    }

    /// Relays a JSON answer: the `result` value's bytes go to the caller as zero-copy
    /// slices of what was read, never assembled (held back only while they fit in
    /// [`UPSTREAM_RESULT_HOLD_BYTES`]); an `error` becomes the RESET. The whole body must
    /// arrive within the response timeout.
    async fn answer_json(&mut self, response: &mut Response) -> Result<(), UpErr> {
        let timeout = self.client.response_timeout;
        let deadline = (pass::now() + timeout).min(self.callee.begin.deadline);
        let mut scanner = ResultScanner::new();
        let mut events = ScanEvents::new();
        let mut outcome: Option<Result<(), UpErr>> = None;
        // A small result is held until the document is complete, so an upstream that
        // breaks mid-answer still gets the agent a clean error; past the bound the result
        // streams (committed: a later failure can only cut the answer short).
        let mut held = HeldResult::new();
        let mut held_len = 0usize;
        let mut committed = false;
        let malformed = |e: ScanError| {
            UpErr::Rpc(exchange::upstream_error(&format!(
                "Upstream sent malformed JSON: {e}"
            )))
        };
        loop {
            let next = {
                let work = response.next();
                tokio::pin!(work);
                loop {
                    match self.wake(&mut work, Some(deadline)).await {
                        Wake::Upstream(n) => break n,
                        Wake::Gone => return Err(UpErr::Gone),
                        Wake::Deadline if Instant::now() >= self.callee.begin.deadline => {
                            return Err(UpErr::Gone);
                        }
                        Wake::Deadline => {
                            client_metrics::with(|m| m.timeouts += 1);
                            return Err(UpErr::Timeout(timeout));
                        }
                        Wake::Answer(id, result, error) => self.relay_answer(id, result, error),
                    }
                }
            };
            let ended = match next.map_err(UpErr::Broken)? {
                ResponseEvent::Data(piece) => {
                    // The clock itself, not the pass's: a body that keeps arriving may be
                    // read within one long poll.
                    let now = Instant::now();
                    if now >= deadline {
                        // A body that keeps arriving never lets the wait's timer fire.
                        if now >= self.callee.begin.deadline {
                            return Err(UpErr::Gone);
                        }
                        client_metrics::with(|m| m.timeouts += 1);
                        return Err(UpErr::Timeout(timeout));
                    }
                    scanner.feed(piece, &mut events).map_err(malformed)?;
                    false
                }
                ResponseEvent::End => {
                    scanner.finish(&mut events).map_err(malformed)?;
                    true
                }
                ResponseEvent::Head(_) => return Err(UpErr::Broken(Broken::Closed)),
            };
            for event in events.drain(..) {
                match event {
                    ScanEvent::Result(slice) => {
                        held_len += slice.len();
                        let kept = held.len();
                        if let Some(slice) = pieces::keep(kept, held.last_mut(), slice) {
                            held.push(slice);
                        }
                        if committed || held_len > UPSTREAM_RESULT_HOLD_BYTES {
                            committed = true;
                            self.relay_held(&mut held).await?;
                        }
                    }
                    ScanEvent::Done {
                        id,
                        error,
                        had_result,
                    } => {
                        let ours = id
                            .as_deref()
                            .is_none_or(|id| id == self.id.as_str().as_bytes());
                        outcome = Some(match (error, had_result) {
                            (Some(error), _) => {
                                Err(UpErr::Rpc(exchange::error_object_reset(&error)))
                            }
                            (None, true) if ours => Ok(()),
                            _ => Err(UpErr::Exchange(exchange::Failure::Body(
                                exchange::BadBody::NotJsonRpc,
                            ))),
                        });
                    }
                }
            }
            if ended {
                break;
            }
        }
        match outcome {
            Some(Ok(())) => {
                self.relay_held(&mut held).await?;
                self.callee.reply.end();
                Ok(())
            }
            Some(Err(e)) => Err(e),
            None => Err(UpErr::Exchange(exchange::Failure::Body(
                exchange::BadBody::NotJsonRpc,
            ))),
        }
    }

    /// Sends the held result pieces (opening the reply first).
    async fn relay_held(&self, held: &mut HeldResult) -> Result<(), UpErr> {
        self.open_reply().await?;
        for piece in held.drain(..) {
            self.callee
                .reply
                .data(piece)
                .await
                .map_err(|_| UpErr::Gone)?;
        }
        Ok(())
    }

    /// Reopens a broken request stream with `GET` and `Last-Event-ID`.
    async fn resume(&self, last_event: &str) -> Result<Response, UpErr> {
        let req = Outgoing {
            method: "GET",
            session: Some(self.session),
            body_len: None,
            accept: b"text/event-stream",
            last_event_id: Some(last_event.as_bytes()),
            initialize: false,
        };
        let Answered { response, head } = self.with_caller(self.client.send(&req, &[])).await??;
        check_status(&head)?;
        if BodyKind::of(&head) != BodyKind::Sse {
            return Err(UpErr::Status(head.status));
        }
        Ok(response)
    }
}
