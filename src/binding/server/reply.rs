//! Rendering a request's reply to the agent: a plain JSON answer (streamed with chunked
//! coding), or an SSE stream when an event comes before the result (progress,
//! notifications, server-to-client requests), with its own replay ring so a dropped
//! connection can resume it ([`pump`]); and Bearer challenges as `WWW-Authenticate`.
//!
//! Invariants: the reply's mode is chosen once, by what comes first; a request's ring
//! holds at most [`REQUEST_REPLAY_EVENTS_MAX`] events and [`REQUEST_REPLAY_BYTES_MAX`]
//! bytes (but always its newest event); DATA gathered for one write is
//! bounded by the stream's credit window, besides one answer its exit held whole (a stored
//! list), which is written as it is, never copied: an SSE event or a list filter, which
//! copy, take it a window at a time.

use super::auth::rules::ListFilter;
use super::edge;
use super::session::{
    AnswerTo, Inflight, ReplyStream, Session, data_event, refuse_request, render_event, sse_head,
};
use super::sink::{Piece, Sink};
use crate::jsonrpc::{self};
use crate::limits::{
    REQUEST_REPLAY_BYTES_MAX, REQUEST_REPLAY_EVENTS_MAX, STREAM_WINDOW_BYTES,
    TIMEOUT_ANSWER_WRITE_GRACE,
};
use crate::metrics::Outcome;
use crate::sse;
use crate::stream::{BearerChallenge, Challenge, Event, Flush, Frame, Reset, Throttle};
use bytes::{Bytes, BytesMut};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Instant;

/// JSON-RPC code of the answer to a request the agent cancelled (the code MCP SDKs use).
const REQUEST_CANCELLED: i32 = -32800;

/// `WWW-Authenticate: Bearer ...` for a challenge (RFC 6750 §3).
pub fn render_bearer(c: &BearerChallenge) -> String {
    let mut params: Vec<String> = Vec::with_capacity(5);
    let mut add = |name: &str, value: &Option<Box<str>>| {
        if let Some(v) = value {
            let escaped: String = v
                .chars()
                .filter(|c| !c.is_control())
                .flat_map(|c| match c {
                    '"' | '\\' => vec!['\\', c],
                    c => vec![c],
                })
                .collect();
            params.push(format!("{name}=\"{escaped}\""));
        }
    };
    add("realm", &c.realm);
    add("scope", &c.scope);
    add("error", &c.error);
    add("error_description", &c.error_description);
    add("resource_metadata", &c.resource_metadata);
    if params.is_empty() {
        "Bearer".to_owned()
    } else {
        format!("Bearer {}", params.join(", "))
    }
}

/// Answers request `id` with an upstream's bearer challenge: 401 or 403 with the same
/// challenge. A server binding that authenticates agents itself (`authenticated`) relays
/// only a challenge to the agent's own credential (a client that forwards it): any other
/// is about a credential the agent never sent, and a 401 would make it fetch another token
/// for nothing (or follow a metadata URL an upstream chose). That one gets -32603 instead.
pub async fn respond_challenge(
    sink: Sink,
    id: &str,
    challenge: &BearerChallenge,
    authenticated: bool,
    session: Option<&str>,
) -> Result<(), super::sink::Gone> {
    let mut body = BytesMut::with_capacity(128);
    let status = if challenge.status == 403 { 403 } else { 401 };
    if authenticated && !challenge.forwarded {
        let message = format!("Upstream refused the request (HTTP {status})");
        jsonrpc::write_error(Some(id), jsonrpc::INTERNAL_ERROR, &message, None, &mut body);
        let mut headers: Vec<(&str, &[u8])> = vec![("content-type", b"application/json")];
        if let Some(s) = session {
            headers.push(("mcp-session-id", s.as_bytes()));
        }
        return sink.respond(200, &headers, &body).await;
    }
    let header = render_bearer(challenge);
    let message = if status == 403 {
        "Forbidden: insufficient scope upstream"
    } else {
        "Unauthorized upstream"
    };
    jsonrpc::write_error(Some(id), jsonrpc::INVALID_REQUEST, message, None, &mut body);
    let headers: [(&str, &[u8]); 2] = [
        ("content-type", b"application/json"),
        ("www-authenticate", header.as_bytes()),
    ];
    sink.respond(status, &headers, &body).await
}

/// How a request's reply is being rendered.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Nothing written yet: JSON if the result comes first, SSE if an event does.
    Undecided,
    /// `application/json`, streamed with chunked coding.
    Json,
    /// `text/event-stream`.
    Sse,
}

enum Step {
    Frame(Option<Frame>),
    Wake,
    Timeout,
    SessionClosed,
    Detached,
}

/// Renders one request's reply to the agent; returns the outcome for metrics.
struct Render<'a> {
    session: &'a Session,
    inflight: &'a Inflight,
    sink: Option<Sink>,
    mode: Mode,
    ring: VecDeque<(u64, Bytes)>,
    /// Bytes of the events in `ring`.
    ring_bytes: usize,
    next_seq: u64,
    /// The result event has started (SSE) or the JSON body has (JSON).
    result_started: bool,
    /// The SSE result event being written (its `data:` lines span DATA frames).
    writer: Option<sse::DataWriter>,
    /// DATA frames gathered for one write (kept to reuse its allocation). Bounded by the
    /// stream's credit window (only frames the exit was given credit for can be queued),
    /// besides one frame sent whole, which only a JSON answer gathers (shared, not copied).
    parts: Vec<Bytes>,
    /// `auth` rules: a list result loses the items this caller may not see on its way.
    filter: Option<ListFilter<'a>>,
    /// The agent's connection for this reply failed a write (it went, or its write was
    /// cut at the deadline) or went away, and no resuming GET took the stream up since:
    /// an answer now would reach nobody. A JSON reply, once lost, stays lost; an SSE reply
    /// is found again when a GET with its `Last-Event-ID` attaches and replays it.
    lost: bool,
    /// The answer written (or being written) is a JSON-RPC error or a bearer challenge,
    /// not a result.
    errored: bool,
}

impl Render<'_> {
    /// Lets go of a sink whose write failed or whose agent went. An SSE reply may be
    /// picked up again by a resuming GET ([`Render::attach`]); a JSON reply is lost.
    fn lose_sink(&mut self) {
        self.sink = None;
        self.lost = true;
    }

    /// The outcome of a reply whose answer was written: an error when that answer was a
    /// JSON-RPC error or a challenge ([`Render::errored`]), cancelled when it reached no
    /// agent ([`Render::lost`]).
    fn outcome(&self) -> Outcome {
        match (self.lost, self.errored) {
            (true, _) => Outcome::Cancelled,
            (false, true) => Outcome::Error,
            (false, false) => Outcome::Ok,
        }
    }

    /// `data` as the agent gets it: filtered when a list filter is on; `None` when the
    /// exit's result is not a list the filter can read.
    fn filtered(&mut self, data: Bytes) -> Option<Bytes> {
        match self.filter.as_mut() {
            None => Some(data),
            Some(f) => f.feed(data).ok(),
        }
    }

    /// True when what the result's bytes are written through copies them (an SSE event,
    /// a list filter), so a frame larger than a window is taken a window at a time.
    fn copies(&self) -> bool {
        self.mode == Mode::Sse || self.filter.is_some()
    }

    /// What a list filter has left to write at the result's end (nothing without one).
    fn filter_end(&mut self) -> Option<Bytes> {
        match self.filter.as_mut() {
            None => Some(Bytes::new()),
            Some(f) => f.finish().ok(),
        }
    }

    fn event_id(&self, seq: u64) -> String {
        format!("{}.{seq}", self.inflight.stream_no)
    }

    async fn write(&mut self, bytes: &[u8]) -> bool {
        match self.sink.as_mut() {
            Some(sink) => {
                if sink.body(bytes).await.is_err() {
                    self.lose_sink();
                    return false;
                }
                true
            }
            None => false,
        }
    }

    async fn start_sse(&mut self) {
        assert!(self.mode == Mode::Undecided);
        self.mode = Mode::Sse;
        self.inflight.stream.set(ReplyStream::Events);
        let Some(sink) = self.sink.as_mut() else {
            return;
        };
        let headers = sse_head(&self.session.id);
        if sink.head(200, &headers).await.is_err() {
            self.lose_sink();
            return;
        }
        if self.session.version >= "2025-11-25" {
            // The priming event: an id and empty data.
            if let Some(priming) = data_event(&self.event_id(0), b"") {
                self.write(&priming).await;
            }
        }
    }

    /// `json` as the stream's next event (`None` if it cannot be one), with its seq.
    fn next_event(&mut self, json: &[u8]) -> (u64, Option<Bytes>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        (seq, data_event(&self.event_id(seq), json))
    }

    /// Emits one event on the SSE stream and keeps it for replay.
    async fn emit(&mut self, json: &[u8]) {
        let (seq, out) = self.next_event(json);
        let Some(out) = out else {
            return;
        };
        self.ring_bytes += out.len();
        self.ring.push_back((seq, out.clone()));
        // Bounded in events and in bytes (events may be megabytes each); the newest stays.
        while self.ring.len() > 1
            && (self.ring.len() > REQUEST_REPLAY_EVENTS_MAX
                || self.ring_bytes > REQUEST_REPLAY_BYTES_MAX)
        {
            if let Some((_, old)) = self.ring.pop_front() {
                self.ring_bytes -= old.len();
            }
        }
        self.write(&out).await;
    }

    /// Takes a resuming connection: writes its SSE head and replays what it missed.
    async fn attach(&mut self, mut sink: Sink, last_seq: u64) {
        let headers = sse_head(&self.session.id);
        if sink.head(200, &headers).await.is_err() {
            return;
        }
        if let Some(old) = self.sink.replace(sink) {
            // The replaced connection gets its stream's clean end, without this reply
            // waiting for it (a sink on another worker is done when its relay wrote it).
            tokio::task::spawn_local(async move {
                let _ = old.finish().await;
            });
        }
        // Found again; a failed write of the replay below loses it anew.
        self.lost = false;
        let missed: Vec<Bytes> = self
            .ring
            .iter()
            .filter(|(s, _)| *s > last_seq)
            .map(|(_, b)| b.clone())
            .collect();
        for event in missed {
            if !self.write(&event).await {
                break;
            }
        }
    }

    /// Writes a JSON-RPC error as the reply (JSON response or final SSE event).
    async fn error(&mut self, code: i32, message: &str, data: Option<&[u8]>) {
        let mut body = BytesMut::with_capacity(128);
        jsonrpc::write_error(Some(self.id()), code, message, data, &mut body);
        match self.mode {
            Mode::Undecided => {
                self.errored = true;
                match self.sink.take() {
                    Some(sink) => {
                        let headers: [(&str, &[u8]); 2] = [
                            ("content-type", b"application/json"),
                            ("mcp-session-id", self.session.id.as_bytes()),
                        ];
                        if sink.respond(200, &headers, &body).await.is_err() {
                            self.lost = true;
                        }
                    }
                    None => self.lost = true,
                }
            }
            Mode::Sse if !self.result_started => {
                self.errored = true;
                // The error is the stream's last event, written with its end (not kept
                // for replay: no resume is taken from here on).
                let (_, event) = self.next_event(&body);
                self.finish(event.as_deref().unwrap_or_default()).await;
            }
            // A body is half written: the only honest end is an abort (drop), and no
            // answer reaches the agent.
            _ => self.lose_sink(),
        }
    }

    fn id(&self) -> &str {
        std::str::from_utf8(&self.inflight.id_raw).unwrap_or("null")
    }

    /// Ends the SSE stream on the agent's connection, `last` (encoded events) written
    /// with its end. Without a connection to take them, or with that write failed, the
    /// reply ends here and nobody can resume it: it is lost.
    async fn finish(&mut self, last: &[u8]) {
        assert!(self.mode == Mode::Sse, "only an event stream is finished");
        self.inflight.stream.set(ReplyStream::Closing);
        let written = match self.sink.take() {
            Some(sink) => sink.finish_of([Piece::Copy(last)]).await.is_ok(),
            None => false,
        };
        if !written {
            self.lost = true;
        }
    }

    /// The exit aborted: render its RESET if it sent one.
    async fn on_abort(&mut self) {
        match self.inflight.caller.initial.try_throttle() {
            Some(Throttle::Reset(Reset::Error {
                code,
                message,
                data,
            })) => {
                self.error(code, &message, data.as_deref()).await;
            }
            Some(Throttle::Reset(Reset::Bearer(challenge))) if self.mode == Mode::Undecided => {
                if let Some(sink) = self.sink.take() {
                    self.errored = true;
                    let authenticated = self.session.owner.is_some();
                    let session = Some(&*self.session.id);
                    let sent =
                        respond_challenge(sink, self.id(), &challenge, authenticated, session);
                    if sent.await.is_err() {
                        self.lost = true;
                    }
                }
            }
            _ => {
                self.error(jsonrpc::INTERNAL_ERROR, "Internal error", None)
                    .await
            }
        }
    }

    /// Renders result bytes; returns true if that completed the reply (the exit's END was
    /// already queued and has been consumed).
    async fn on_data(&mut self, mut data: Bytes) -> bool {
        let reply = &self.inflight.caller.reply;
        // An answer its exit held whole comes as one frame, which can be far larger than a
        // window. A JSON answer writes it as it is; an SSE event and a list filter copy
        // what they are given, so they take it a window at a time, as the exit would have
        // sent it (the rest goes back to the front of the queue, for the next turn).
        if self.copies() && data.len() > STREAM_WINDOW_BYTES as usize {
            let rest = data.split_off(STREAM_WINDOW_BYTES as usize);
            reply.unread(Frame::Data(rest));
        }
        // Credit goes back before the agent-side write, not after it: `data` is ours now
        // (copied into the encoded chunk, or, when large, held by the write as it is), so
        // the exit can read the next window from upstream while this one is written
        // (double buffering). Memory stays bounded: one window queued plus the one being
        // written, or one answer its exit holds whole anyway.
        reply.ack(data.len() as u32);
        let Some(data) = self.filtered(data) else {
            self.unreadable_list().await;
            return true;
        };
        if self.mode == Mode::Undecided {
            // Common case: the whole result is already here; answer in one write, copying
            // the result once, straight after the head.
            if let Some(Frame::End) = peek_end(reply) {
                let Some(tail) = self.filter_end() else {
                    self.unreadable_list().await;
                    return true;
                };
                if let Some(sink) = self.sink.take() {
                    let [open, id, member] = jsonrpc::result_prefix_parts(self.id());
                    let body = [
                        Piece::Copy(open),
                        Piece::Copy(id),
                        Piece::Copy(member),
                        Piece::Shared(&data),
                        Piece::Shared(&tail),
                        Piece::Copy(jsonrpc::RESULT_SUFFIX),
                    ];
                    let sent = match &self.session.json_head {
                        Some(fields) => sink.respond_with_fields(fields, &body).await,
                        None => {
                            let headers: [(&str, &[u8]); 2] = [
                                ("content-type", b"application/json"),
                                ("mcp-session-id", self.session.id.as_bytes()),
                            ];
                            sink.respond_of(200, &headers, &body).await
                        }
                    };
                    self.lost = sent.is_err();
                }
                self.result_started = true;
                return true;
            }
            self.mode = Mode::Json;
            self.result_started = true;
            let mut prefix = BytesMut::with_capacity(64);
            jsonrpc::write_result_prefix(self.id(), &mut prefix);
            if let Some(sink) = self.sink.as_mut() {
                let headers: [(&str, &[u8]); 2] = [
                    ("content-type", b"application/json"),
                    ("mcp-session-id", self.session.id.as_bytes()),
                ];
                if sink.head(200, &headers).await.is_err() {
                    self.lose_sink();
                }
            }
            if let Some(sink) = self.sink.as_mut()
                && sink
                    .body_of([Piece::Copy(&prefix), Piece::Shared(&data)])
                    .await
                    .is_err()
            {
                self.lose_sink();
            }
            return false;
        }
        // Whatever else the exit has queued goes out in the same write, and if its END is
        // among it, the body's end too: one write per turn instead of one per frame.
        let mut parts = std::mem::take(&mut self.parts);
        parts.push(data);
        let ended = loop {
            match reply.try_next() {
                Some(Frame::Data(more))
                    if self.copies() && more.len() > STREAM_WINDOW_BYTES as usize =>
                {
                    // Taken a window at a time on the next turns (see above).
                    reply.unread(Frame::Data(more));
                    break false;
                }
                Some(Frame::Data(more)) => {
                    reply.ack(more.len() as u32);
                    let Some(more) = self.filtered(more) else {
                        self.unreadable_list().await;
                        return true;
                    };
                    parts.push(more);
                }
                Some(Frame::End) => {
                    let Some(tail) = self.filter_end() else {
                        self.unreadable_list().await;
                        return true;
                    };
                    parts.push(tail);
                    break true;
                }
                Some(other) => {
                    reply.unread(other);
                    break false;
                }
                None => break false,
            }
        };
        if ended {
            self.end_with(&parts).await;
        } else if self.mode == Mode::Json {
            if let Some(sink) = self.sink.as_mut()
                && sink.body_of(parts.iter().map(Piece::Shared)).await.is_err()
            {
                self.lose_sink();
            }
        } else {
            let mut out = BytesMut::new();
            self.sse_result(&parts, &mut out);
            self.write(&out).await;
        }
        parts.clear();
        self.parts = parts;
        ended
    }

    /// Appends `parts` of the result to the SSE result event in `out`, starting the event
    /// (its id and the JSON-RPC prefix) the first time.
    fn sse_result(&mut self, parts: &[Bytes], out: &mut BytesMut) {
        out.reserve(parts.iter().map(Bytes::len).sum::<usize>() + 64);
        if !self.result_started {
            self.result_started = true;
            self.inflight.stream.set(ReplyStream::Closing);
            let seq = self.next_seq;
            self.next_seq += 1;
            let id = self.event_id(seq);
            let mut prefix = BytesMut::with_capacity(64);
            jsonrpc::write_result_prefix(self.id(), &mut prefix);
            if let Ok(mut w) = sse::DataWriter::begin(Some(&id), out) {
                w.write(&prefix, out);
                self.writer = Some(w);
            }
        }
        // Result JSON from the exit may hold raw newlines (pretty-printed); each becomes a
        // new `data:` line, which SSE joins back with '\n'.
        if let Some(w) = self.writer.as_mut() {
            for part in parts {
                w.write(part, out);
            }
        }
    }

    async fn on_end(&mut self) {
        if self.filter.is_none() || !self.result_started {
            // Without a result there is no list to end: `end_with` renders the error.
            return self.end_with(&[]).await;
        }
        match self.filter_end() {
            Some(tail) => self.end_with(&[tail]).await,
            None => self.unreadable_list().await,
        }
    }

    /// The exit's list result cannot be read as a list, so it cannot be filtered: an error
    /// when nothing is written yet, an abort otherwise (never unfiltered items).
    async fn unreadable_list(&mut self) {
        self.error(
            jsonrpc::INTERNAL_ERROR,
            "Internal error: the list could not be read",
            None,
        )
        .await;
    }

    /// The exit's END, after the last `parts` of the result: writes them, the result's
    /// end and the body's end in one write.
    async fn end_with(&mut self, parts: &[Bytes]) {
        match self.mode {
            Mode::Undecided if self.result_started => {}
            Mode::Undecided => {
                self.error(jsonrpc::INTERNAL_ERROR, "Internal error: no result", None)
                    .await
            }
            Mode::Json => match self.sink.take() {
                Some(sink) => {
                    let all = (parts.iter().map(Piece::Shared))
                        .chain([Piece::Copy(jsonrpc::RESULT_SUFFIX)]);
                    self.lost = sink.finish_of(all).await.is_err();
                }
                None => self.lost = true,
            },
            Mode::Sse => {
                let mut out = BytesMut::new();
                if !parts.is_empty() {
                    self.sse_result(parts, &mut out);
                }
                let Some(mut w) = self.writer.take() else {
                    self.write(&out).await;
                    self.error(jsonrpc::INTERNAL_ERROR, "Internal error: no result", None)
                        .await;
                    return;
                };
                w.write(jsonrpc::RESULT_SUFFIX, &mut out);
                w.finish(&mut out);
                // The result's last event.
                self.finish(&out).await;
            }
        }
    }
}

fn peek_end(reply: &crate::stream::Receiver) -> Option<Frame> {
    match reply.try_next() {
        Some(Frame::End) => Some(Frame::End),
        Some(other) => {
            reply.unread(other);
            None
        }
        None => None,
    }
}

/// Renders a request's reply from the exit to the agent, surviving dropped SSE
/// connections (the request waits, bounded by its deadline, for a resuming GET).
pub async fn pump(
    session: &Rc<Session>,
    inflight: &Rc<Inflight>,
    mut sink: Sink,
    progress: bool,
    deadline: Instant,
    filter: Option<ListFilter<'_>>,
) -> Outcome {
    // Every write of the reply ends by its deadline too: an agent that stops reading loses
    // its connection then, and what the reply held (a stored list) is let go.
    sink.bound_until(deadline);
    let mut r = Render {
        session,
        inflight,
        sink: Some(sink),
        mode: Mode::Undecided,
        ring: VecDeque::new(),
        ring_bytes: 0,
        next_seq: 1,
        result_started: false,
        writer: None,
        parts: Vec::new(),
        filter,
        lost: false,
        errored: false,
    };
    if progress {
        r.start_sse().await;
    }
    let caller = &inflight.caller;
    // One deadline for the whole reply, not one per frame, in the worker's queue (no
    // runtime timer per request). The selects below are `biased`, deadline first, so a
    // reply that keeps frames coming cannot starve it.
    let timeout = crate::runtime::deadline::until(deadline);
    tokio::pin!(timeout);
    loop {
        let detached = r.mode == Mode::Sse && r.sink.is_none();
        if detached && r.result_started {
            // Part of the result was lost with the connection: it cannot be replayed.
            caller.reply.reset(Reset::Plain);
            caller.initial.abort();
            return Outcome::Cancelled;
        }
        let step = if detached {
            tokio::select! {
                biased;
                () = &mut timeout => Step::Timeout,
                () = inflight.woken() => Step::Wake,
                () = session.closed_wait() => Step::SessionClosed,
            }
        } else {
            let sink_closed = async {
                match r.sink.as_ref() {
                    Some(s) => s.closed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = &mut timeout => Step::Timeout,
                () = inflight.woken() => Step::Wake,
                f = caller.reply.next() => Step::Frame(f),
                () = session.closed_wait() => Step::SessionClosed,
                () = sink_closed => Step::Detached,
            }
        };
        match step {
            Step::Wake => {
                // MCP: a cancellation that comes once the response is under way may be
                // ignored; it is, so the result ends whole rather than cut mid-body (which
                // would cut the connection, and the requests pipelined behind it).
                if inflight.cancelled.get() && !r.result_started {
                    caller.reply.reset(Reset::Plain);
                    caller.initial.abort();
                    // The HTTP request still gets an answer, as MCP SDK servers give it:
                    // an error naming the cancellation (the agent's SDK discards it).
                    r.error(REQUEST_CANCELLED, "Request cancelled", None).await;
                    return Outcome::Cancelled;
                }
                let attach = inflight.attach.borrow_mut().take();
                if let Some((mut sink, last)) = attach {
                    // The GET checked this before it attached; the reply may have moved
                    // on since.
                    if let Some(message) = inflight.stream.get().refusal() {
                        tokio::task::spawn_local(edge::http_error(sink, 400, message, None));
                        continue;
                    }
                    sink.bound_until(deadline);
                    r.attach(sink, last).await;
                }
            }
            Step::Timeout => {
                caller.reply.reset(Reset::Plain);
                caller.initial.abort();
                if r.lost {
                    // The agent's connection went (or was cut) before: no error reaches it.
                    return Outcome::Cancelled;
                }
                // The answer goes after the deadline: it gets a grace of its own (a
                // half-written body is dropped instead, see `Render::error`).
                if let Some(sink) = r.sink.as_mut() {
                    sink.bound_until(Instant::now() + TIMEOUT_ANSWER_WRITE_GRACE);
                }
                r.error(jsonrpc::INTERNAL_ERROR, "Request timed out", None)
                    .await;
                return r.outcome();
            }
            Step::SessionClosed => {
                caller.reply.reset(Reset::Plain);
                caller.initial.abort();
                match r.mode {
                    Mode::Sse => r.finish(&[]).await,
                    // Nothing written yet: the agent learns why it gets no result.
                    Mode::Undecided => r.error(jsonrpc::INTERNAL_ERROR, SESSION_ENDED, None).await,
                    // A body half written cannot be ended honestly: the connection is cut.
                    Mode::Json => r.lose_sink(),
                }
                return Outcome::Cancelled;
            }
            Step::Detached => match r.mode {
                Mode::Sse => {
                    r.lose_sink();
                    let _ = caller.reply.challenge(Challenge::Suspended);
                }
                // The agent went before anything was written. MCP: a disconnection is
                // not a cancellation, so the request goes on without its connection (which
                // is let go of now, not held until the answer) and its answer is dropped.
                // Upstream, it holds a connection of the exit's bounded pool meanwhile.
                Mode::Undecided => r.lose_sink(),
                // A body half written can reach no one: the rest is not read.
                Mode::Json => {
                    r.lose_sink();
                    caller.reply.reset(Reset::Plain);
                    caller.initial.abort();
                    return Outcome::Cancelled;
                }
            },
            Step::Frame(Some(Frame::Begin(_))) => {}
            Step::Frame(Some(Frame::Flush(Flush { event, .. }))) => {
                if let Event::Suspend { retry_ms } = event {
                    if r.mode == Mode::Sse && retry_ms >= 0 {
                        let mut out = BytesMut::with_capacity(24);
                        sse::encode_retry(retry_ms as u64, &mut out);
                        r.write(&out).await;
                    }
                    continue;
                }
                // The agent went before anything was written (see `Step::Detached`): no
                // stream will carry this event, and no one can answer a request.
                let gone = r.mode == Mode::Undecided && r.sink.is_none();
                if let Event::Request { id, .. } = &event
                    && (gone
                        || !session.expect_answer(id, AnswerTo::Request(Rc::downgrade(inflight))))
                {
                    refuse_request(caller, id.clone());
                    continue;
                }
                if gone {
                    continue;
                }
                let Some(json) = render_event(&event) else {
                    continue;
                };
                if r.mode == Mode::Undecided {
                    r.start_sse().await;
                }
                if r.mode == Mode::Sse && !r.result_started {
                    r.emit(&json).await;
                }
            }
            Step::Frame(Some(Frame::Data(d))) => {
                // Its writes end by the deadline (the sink's bound above): one cut then
                // loses the sink, and the timeout above ends the reply.
                if r.on_data(d).await {
                    caller.initial.end();
                    return r.outcome();
                }
            }
            Step::Frame(Some(Frame::End)) => {
                caller.initial.end();
                r.on_end().await;
                return r.outcome();
            }
            Step::Frame(Some(Frame::Abort) | None) => {
                r.on_abort().await;
                caller.initial.abort();
                return r.outcome();
            }
        }
    }
}

/// The error a request in flight gets when its session ends (the agent deleted it, or it
/// expired) before anything of its answer was written.
const SESSION_ENDED: &str = "Session ended before the request was answered";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_challenges_render_quoted_and_escaped() {
        let c = BearerChallenge {
            status: 403,
            realm: Some("git\"hub".into()),
            scope: Some("repo read".into()),
            error: Some("insufficient_scope".into()),
            error_description: None,
            resource_metadata: Some("https://x/.well-known/oauth-protected-resource".into()),
            forwarded: false,
        };
        assert_eq!(
            render_bearer(&c),
            "Bearer realm=\"git\\\"hub\", scope=\"repo read\", error=\"insufficient_scope\", resource_metadata=\"https://x/.well-known/oauth-protected-resource\""
        );
        assert_eq!(render_bearer(&BearerChallenge::default()), "Bearer");
    }
}
