//! Sessions and everything that flows to the agent outside a plain JSON answer: the
//! lifecycle stream, the GET event stream with keepalives and `Last-Event-ID` replay,
//! request SSE streams that survive a dropped connection, cancellation and expiry.
//!
//! Event ids are `<stream>.<seq>`: stream 0 is the session's GET stream, streams 1.. are
//! request SSE streams, so every id is unique within the session and names the stream it
//! belongs to (MCP: ids encode the originating stream; replay never crosses streams).

use super::Server;
use super::app::{accepts_sse, http_error};
use super::net::Request;
use super::shared::{self, Ending, Link};
use super::sink::Sink;
use crate::FastMap;
use crate::jsonrpc::{self, IdKey};
use crate::limits::{
    EVENTS_PROBE_TIMEOUT, GET_SETUP_EVENTS_MAX, PENDING_ANSWER_ID_BYTES_MAX,
    PENDING_ANSWERS_PER_SESSION_MAX, REQUEST_REPLAY_EVENTS_MAX, SESSION_REPLAY_EVENTS_MAX,
    SSE_KEEPALIVE_INTERVAL,
};
use crate::log;
use crate::metrics::{self, Outcome};
use crate::runtime::notify::Notify;
use crate::sse;
use crate::stream::{
    BearerChallenge, Caller, Caps, Challenge, Event, Flush, Frame, ReplyBegin, Reset, Throttle,
};
use bytes::{Bytes, BytesMut};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

/// JSON-RPC code of the answer to a request the agent cancelled (the code MCP SDKs use).
const REQUEST_CANCELLED: i32 = -32800;

/// Whether the exit has a server-to-agent event stream.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Support {
    Unknown,
    Yes,
    No,
}

/// Where an agent's answer to a server-to-client request goes.
enum AnswerTo {
    Lifecycle,
    Request(Weak<Inflight>),
}

/// A server-to-client request relayed to the agent and not answered yet.
struct Pending {
    to: AnswerTo,
    /// The request's id as the exit wrote it (an answer refusing it for the agent echoes it).
    id: Bytes,
    /// Order of arrival: when the table is full, the oldest is answered for the agent.
    order: u64,
}

struct State {
    closed: bool,
    last_active: Instant,
    requests: FastMap<IdKey, Rc<Inflight>>,
    streams: FastMap<u32, Weak<Inflight>>,
    next_stream: u32,
    /// Encoded GET-stream events kept for replay, oldest first.
    ring: VecDeque<(u64, Bytes)>,
    next_seq: u64,
    get_generation: u64,
    get_live: bool,
    /// The last seq the live GET stream has taken from the ring to write. While a GET is
    /// live, the ring never drops an event it has not taken: the lifecycle task stops
    /// reading the exit's events once `next_seq - 1 - get_taken` reaches the ring's size
    /// (see [`Session::get_behind`]), so a burst is back-pressured, not lost.
    get_taken: u64,
    /// A GET stream being set up (from its arrival until it is live): the seq it starts
    /// after, and how many exit answers (`acks`) there were when it asked the exit. Until
    /// it is live the ring keeps up to [`GET_SETUP_EVENTS_MAX`] more events than usual,
    /// and once the exit has answered it, the lifecycle task holds back as for a live GET.
    get_hold: Option<GetHold>,
    support: Support,
    /// Control events (resumable, suspend) seen from the exit: how a GET knows the exit
    /// has answered the resume it just asked for.
    acks: u64,
    /// The ring's last seq when the latest of them came: a stream resumed by the exit
    /// starts after it (what the exit sent before its answer belongs to the old flow).
    acked_at: u64,
    last_exit_event: Option<Rc<str>>,
    /// Server-to-client requests relayed to the agent and not answered yet, by id.
    /// Invariant: `len() <= PENDING_ANSWERS_PER_SESSION_MAX`.
    answers: FastMap<IdKey, Pending>,
    /// The next `Pending::order`.
    answers_order: u64,
    /// The number the next GET setup's hold gets (holds are told apart by it).
    holds: u64,
}

/// One agent session, owned by the worker that created it.
pub struct Session {
    pub id: Rc<str>,
    /// The exit's id for this session, sent in every request `Begin`.
    pub exit_session: Rc<str>,
    pub caps: Caps,
    pub version: &'static str,
    lifecycle: Caller,
    st: RefCell<State>,
    /// Woken on new GET events, a replaced GET, support news and close.
    changed: Notify,
    /// Woken when the live GET took events from the ring, or ended (the lifecycle task
    /// waits on it while the GET is behind).
    taken: Notify,
    /// The fields of this session's `200 application/json` reply head, made once (the id
    /// is ours, so the check cannot fail; should it, replies are encoded field by field).
    json_head: Option<Bytes>,
    /// A shared session (`sessions: { store }`): what its record is written from.
    pub(super) shared: Option<Link>,
}

/// One request in flight on a session.
pub struct Inflight {
    pub caller: Caller,
    id_raw: Bytes,
    key: IdKey,
    stream_no: u32,
    cancelled: Cell<bool>,
    wake: Notify,
    /// A connection resuming this request's SSE stream, with the last seq it saw.
    attach: RefCell<Option<(Sink, u64)>>,
}

impl Session {
    /// Creates and registers a session whose lifecycle the exit just accepted.
    pub fn create(
        server: &Rc<Server>,
        id: Rc<str>,
        version: &'static str,
        reply: ReplyBegin,
        lifecycle: Caller,
        shared: Option<Link>,
    ) -> Rc<Session> {
        if let (Some(store), Some(link)) = (server.shared.as_ref(), shared.as_ref()) {
            match store.watch(&shared::key(&id)) {
                Ok(watch) => *link.watch.borrow_mut() = Some(watch),
                Err(e) => {
                    // It is then told of a DELETE at another node only at its expiry.
                    metrics::with(|m| m.session_store_failures += 1);
                    log::warn(format_args!(
                        "server {}: a shared session is not watched: {e}",
                        server.name
                    ));
                }
            }
        }
        let session = Rc::new(Session {
            exit_session: reply.session.clone().unwrap_or_else(|| Rc::from("")),
            caps: reply.caps,
            id: id.clone(),
            version,
            lifecycle,
            st: RefCell::new(State {
                closed: false,
                last_active: Instant::now(),
                requests: FastMap::default(),
                streams: FastMap::default(),
                next_stream: 1,
                ring: VecDeque::new(),
                next_seq: 1,
                get_generation: 0,
                get_live: false,
                get_taken: 0,
                get_hold: None,
                support: Support::Unknown,
                acks: 0,
                acked_at: 0,
                last_exit_event: None,
                answers: FastMap::default(),
                answers_order: 0,
                holds: 0,
            }),
            changed: Notify::new(),
            taken: Notify::new(),
            json_head: crate::http::response_head_fields(
                200,
                &[
                    ("content-type", b"application/json"),
                    ("mcp-session-id", id.as_bytes()),
                ],
            )
            .ok(),
            shared,
        });
        server.sessions.borrow_mut().insert(id, session.clone());
        metrics::with(|m| {
            m.sessions += 1;
            m.sessions_created += 1;
        });
        tokio::task::spawn_local(lifecycle_task(server.clone(), session.clone()));
        session
    }

    /// Marks the session active now.
    pub fn touch(&self) {
        self.st.borrow_mut().last_active = Instant::now();
    }

    /// When the session was last active here (now, while it streams).
    pub fn last_active(&self) -> Instant {
        let st = self.st.borrow();
        if st.get_live || !st.requests.is_empty() {
            return Instant::now();
        }
        st.last_active
    }

    /// True while requests are in flight.
    pub fn has_requests(&self) -> bool {
        !self.st.borrow().requests.is_empty()
    }

    /// True while a request or the GET stream is still being answered.
    pub fn streaming(&self) -> bool {
        let st = self.st.borrow();
        st.get_live || !st.requests.is_empty()
    }

    /// Requests in flight.
    pub fn request_count(&self) -> usize {
        self.st.borrow().requests.len()
    }

    /// True while a live GET stream (or one being set up, once the exit answered it) has
    /// a ring's worth of events it has not taken yet: one more would push an event it
    /// never wrote out of the ring. Before the exit's answer the lifecycle task must not
    /// wait (the answer comes through it), so a GET being set up only makes the ring keep
    /// more ([`GET_SETUP_EVENTS_MAX`]).
    fn get_behind(&self) -> bool {
        let st = self.st.borrow();
        let last = st.next_seq - 1;
        let ring = SESSION_REPLAY_EVENTS_MAX as u64;
        match st.get_hold {
            // A new GET waits for the exit's answer, which comes through the lifecycle
            // task: it must go on reading, even for a live GET that stopped taking events
            // (the one the new GET replaces; the ring keeps more meanwhile).
            Some(hold) if st.acks <= hold.asked => false,
            Some(hold) => last.saturating_sub(hold.from) >= ring,
            None => st.get_live && last.saturating_sub(st.get_taken) >= ring,
        }
    }

    fn is_closed(&self) -> bool {
        self.st.borrow().closed
    }

    async fn closed_wait(&self) {
        loop {
            let n = self.changed.notified();
            if self.is_closed() {
                return;
            }
            n.await;
        }
    }

    /// Records a request's stream; a duplicate id replaces the older entry for
    /// cancellation purposes (the older request still completes).
    pub fn register(&self, key: IdKey, id_raw: Bytes, caller: Caller) -> Rc<Inflight> {
        let mut st = self.st.borrow_mut();
        let stream_no = st.next_stream;
        st.next_stream = st.next_stream.wrapping_add(1).max(1);
        let inflight = Rc::new(Inflight {
            caller,
            id_raw,
            key: key.clone(),
            stream_no,
            cancelled: Cell::new(false),
            wake: Notify::new(),
            attach: RefCell::new(None),
        });
        st.requests.insert(key, inflight.clone());
        st.streams.insert(stream_no, Rc::downgrade(&inflight));
        inflight
    }

    /// Forgets a finished request.
    pub fn unregister(&self, inflight: &Rc<Inflight>) {
        let mut st = self.st.borrow_mut();
        if st
            .requests
            .get(&inflight.key)
            .is_some_and(|i| Rc::ptr_eq(i, inflight))
        {
            st.requests.remove(&inflight.key);
        }
        st.streams.remove(&inflight.stream_no);
        st.answers.retain(|_, pending| match &pending.to {
            AnswerTo::Request(w) => w.upgrade().is_some_and(|i| !Rc::ptr_eq(&i, inflight)),
            AnswerTo::Lifecycle => true,
        });
        st.last_active = Instant::now();
    }

    /// `notifications/cancelled`: cancels the request with that id, if in flight.
    pub fn cancel(&self, key: &IdKey) {
        if let Some(inflight) = self.st.borrow().requests.get(key) {
            inflight.cancelled.set(true);
            inflight.wake.notify_one();
        }
    }

    /// Passes an agent notification to the exit (FLUSH on the lifecycle's initial
    /// direction). Never waits: a lifecycle whose queue is full drops it, counted.
    pub fn notify_exit(&self, method: &str, params: Option<Bytes>) {
        let flush = Flush {
            id: None,
            event: Event::Notification {
                method: Rc::from(method),
                params,
            },
        };
        if !self.lifecycle.initial.try_flush(flush) {
            metrics::with(|m| m.overload_rejections += 1);
        }
    }

    /// Records where the agent's answer to the exit's request `id` goes, before the request
    /// is relayed. False when it must not be relayed: its id is longer than
    /// [`PENDING_ANSWER_ID_BYTES_MAX`] (see [`refuse_request`]). When the table is full the
    /// oldest request waiting (one the agent may never have seen, or will not answer) is
    /// answered for the agent with an error and forgotten, so a session whose agent
    /// ignores some requests still relays new ones. An id that is not a JSON string or
    /// number is relayed unrecorded (no answer can find it).
    fn expect_answer(&self, id: &Bytes, to: AnswerTo) -> bool {
        if id.len() > PENDING_ANSWER_ID_BYTES_MAX {
            return false;
        }
        let Some(key) = std::str::from_utf8(id)
            .ok()
            .and_then(jsonrpc::id_key_of_raw)
        else {
            return true;
        };
        let evicted = {
            let mut st = self.st.borrow_mut();
            let full = st.answers.len() >= PENDING_ANSWERS_PER_SESSION_MAX;
            let evicted = if full && !st.answers.contains_key(&key) {
                let oldest = st
                    .answers
                    .iter()
                    .min_by_key(|(_, p)| p.order)
                    .map(|(k, _)| k.clone());
                oldest.and_then(|k| st.answers.remove(&k))
            } else {
                None
            };
            let order = st.answers_order;
            st.answers_order += 1;
            st.answers.insert(
                key,
                Pending {
                    to,
                    id: id.clone(),
                    order,
                },
            );
            assert!(st.answers.len() <= PENDING_ANSWERS_PER_SESSION_MAX);
            evicted
        };
        if let Some(old) = evicted {
            match old.to {
                AnswerTo::Lifecycle => refuse_request(&self.lifecycle, old.id),
                AnswerTo::Request(w) => {
                    if let Some(inflight) = w.upgrade() {
                        refuse_request(&inflight.caller, old.id);
                    }
                }
            }
        }
        true
    }

    /// Routes the agent's answer to a server-to-client request back to its stream.
    pub fn answer(&self, id: Bytes, result: Option<Bytes>, error: Option<Bytes>) {
        let Some(key) = std::str::from_utf8(&id)
            .ok()
            .and_then(jsonrpc::id_key_of_raw)
        else {
            return;
        };
        let to = self.st.borrow_mut().answers.remove(&key).map(|p| p.to);
        let challenge = Challenge::Answer { id, result, error };
        let _ = match to {
            Some(AnswerTo::Lifecycle) => self.lifecycle.reply.challenge(challenge),
            Some(AnswerTo::Request(w)) => match w.upgrade() {
                Some(i) => i.caller.reply.challenge(challenge),
                None => Ok(()),
            },
            None => Ok(()),
        };
    }

    /// Appends a notification to the GET stream's ring and wakes the live GET. Its id is
    /// `0.<seq>`, followed by `:<exit id>` when the exit named its position (an upstream's
    /// event id, or a proxy's aggregate of its routes' ids): the agent's Last-Event-ID then
    /// says where every exit was even after the ring has moved on.
    fn push_event(&self, json: &[u8], exit_id: Option<&str>) {
        let mut st = self.st.borrow_mut();
        let seq = st.next_seq;
        st.next_seq += 1;
        let out = exit_id
            .filter(|exit| exit_id_carried(exit))
            .and_then(|exit| data_event(&format!("0.{seq}:{exit}"), json))
            .or_else(|| data_event(&format!("0.{seq}"), json));
        let Some(out) = out else {
            return;
        };
        st.ring.push_back((seq, out));
        let keep = match st.get_hold {
            Some(_) => SESSION_REPLAY_EVENTS_MAX + GET_SETUP_EVENTS_MAX,
            None => SESSION_REPLAY_EVENTS_MAX,
        };
        while st.ring.len() > keep {
            st.ring.pop_front();
        }
        drop(st);
        self.changed.notify_waiters();
    }
}

impl Inflight {
    async fn woken(&self) {
        self.wake.notified().await;
    }
}

/// Finds the session a request names: 400 without the header, 404 if unknown.
pub fn lookup(server: &Server, req: &Request) -> Result<Rc<Session>, (u16, &'static str)> {
    let Some(id) = req.head.headers.get("mcp-session-id") else {
        return Err((400, "Bad Request: Mcp-Session-Id header is required"));
    };
    let id = std::str::from_utf8(id).map_err(|_| (404, "Session not found"))?;
    server
        .sessions
        .borrow()
        .get(id)
        .cloned()
        .ok_or((404, "Session not found"))
}

/// The session a request names: held here, or a shared session taken up from the store
/// (only when this one is not held here, so the request path does not touch the store).
pub async fn find(server: &Rc<Server>, req: &Request) -> Result<Rc<Session>, (u16, &'static str)> {
    match lookup(server, req) {
        Err((404, _)) if server.shared.is_some() => Box::pin(shared::adopt(server, req)).await,
        found => found,
    }
}

/// The session a request names, checked and marked active: 400 without the session
/// header or with an unsupported `MCP-Protocol-Version`, 404 if unknown.
pub async fn session_for(
    server: &Rc<Server>,
    req: &Request,
) -> Result<Rc<Session>, (u16, &'static str)> {
    let session = find(server, req).await?;
    if !Server::version_ok(req) {
        return Err((400, "Bad Request: unsupported MCP-Protocol-Version"));
    }
    session.touch();
    Ok(session)
}

/// Ends a session: forgets it, ends its lifecycle stream (the exit closes its side),
/// wakes its requests and GET stream so they finish.
pub fn close(server: &Server, session: &Rc<Session>, reason: &str) {
    end(server, session, reason, Ending::End);
}

/// As [`close`]; with [`Ending::Detach`] the exit lets go of its sessions without ending
/// them upstream (a shared session that lives on at another node).
pub fn end(server: &Server, session: &Rc<Session>, reason: &str, ending: Ending) {
    {
        let mut st = session.st.borrow_mut();
        if st.closed {
            return;
        }
        st.closed = true;
    }
    server.sessions.borrow_mut().remove(&session.id);
    metrics::with(|m| m.sessions -= 1);
    if ending == Ending::Detach {
        metrics::with(|m| m.sessions_detached += 1);
        let detach = Flush {
            id: None,
            event: Event::Detach,
        };
        if !session.lifecycle.initial.try_flush(detach) {
            metrics::with(|m| m.overload_rejections += 1);
            log::warn(format_args!(
                "server {}: a shared session could not be let go of (its lifecycle is \
                 full): its exit ends it",
                server.name
            ));
        }
    }
    session.lifecycle.initial.end();
    let requests: Vec<Rc<Inflight>> = session.st.borrow().requests.values().cloned().collect();
    for r in requests {
        r.wake.notify_one();
    }
    session.changed.notify_waiters();
    if reason == "expired" {
        metrics::with(|m| m.sessions_expired += 1);
    }
}

/// Renders an MCP notification (`{"jsonrpc":"2.0","method":..,"params":..}`).
fn notification(method: &str, params: Option<&[u8]>) -> BytesMut {
    let mut out = BytesMut::with_capacity(64 + params.map_or(0, <[u8]>::len));
    jsonrpc::write_notification(method, params, &mut out);
    out
}

/// Renders an event from the exit as agent-facing JSON; `None` for control events.
fn render_event(event: &Event) -> Option<BytesMut> {
    Some(match event {
        Event::Resumable | Event::Suspend { .. } | Event::Handoff(_) | Event::Detach => {
            return None;
        }
        Event::ListChanged(k) => notification(k.method(), None),
        Event::ResourcesUpdated { params } => {
            notification("notifications/resources/updated", Some(params))
        }
        Event::Progress { params } => notification("notifications/progress", Some(params)),
        Event::Notification { method, params } => notification(method, params.as_deref()),
        Event::Request { id, method, params } => {
            let mut out = BytesMut::with_capacity(64);
            let id = std::str::from_utf8(id).unwrap_or("null");
            jsonrpc::write_request(id, method, params.as_deref(), &mut out);
            out
        }
    })
}

/// The session's task: reads the exit's lifecycle reply (notifications for the GET stream,
/// support news, the end of the session when the exit ends it) and expires the session
/// once it has been idle (no request, no GET stream) for the binding's session timeout.
/// One task for both: it lives as long as the session, and every task costs a task cell.
async fn lifecycle_task(server: Rc<Server>, session: Rc<Session>) {
    let timeout = server.cfg.session_timeout;
    let mut reason = "lifecycle ended";
    let mut ending = Ending::End;
    // A shared session's record: its changes at any node wake this task.
    let mut watch = session.shared.as_ref().and_then(|l| l.watch.take());
    loop {
        let (expired, mut check_at) = expiry(&session, timeout);
        if expired {
            let decided = shared::at_expiry(&server, &session).await;
            // Activity that came while the store was asked keeps the session.
            if !expiry(&session, timeout).0 {
                continue;
            }
            reason = "expired";
            ending = decided;
            break;
        }
        if let Some(at) = shared::touch(&server, &session) {
            check_at = check_at.min(at);
        }
        let record_changed = async {
            match watch.as_mut() {
                Some(w) => w.changed().await,
                None => std::future::pending().await,
            }
        };
        if session.get_behind() {
            // The agent's GET stream is a ring behind: the exit's next event waits in its
            // stream (whose credit then holds the exit back) until the GET took more.
            let taken = session.taken.notified();
            if session.get_behind() {
                tokio::select! {
                    () = taken => {}
                    () = session.closed_wait() => break,
                    () = tokio::time::sleep_until(check_at.into()) => {}
                }
                continue;
            }
        }
        let frame = tokio::select! {
            f = session.lifecycle.reply.next() => f,
            () = session.closed_wait() => None,
            () = tokio::time::sleep_until(check_at.into()) => continue,
            alive = record_changed => {
                if alive {
                    shared::recheck(&server, &session);
                } else {
                    watch = None;
                }
                continue;
            }
        };
        match frame {
            Some(Frame::Flush(Flush {
                event: Event::Handoff(handoff),
                ..
            })) => {
                if let Some(link) = session.shared.as_ref() {
                    link.set_handoff(handoff);
                }
            }
            Some(Frame::Flush(Flush { id, event })) => {
                if id.is_some() {
                    session.st.borrow_mut().last_exit_event = id.clone();
                }
                match &event {
                    Event::Resumable | Event::Suspend { retry_ms: 0.. } => {
                        set_support(&session, Support::Yes)
                    }
                    Event::Suspend { .. } => set_support(&session, Support::No),
                    Event::Request { id, .. }
                        if !session.expect_answer(id, AnswerTo::Lifecycle) =>
                    {
                        refuse_request(&session.lifecycle, id.clone());
                        continue;
                    }
                    _ => {}
                }
                if let Some(json) = render_event(&event) {
                    session.push_event(&json, id.as_deref());
                }
            }
            Some(Frame::Data(d)) => session.lifecycle.reply.ack(d.len() as u32),
            Some(Frame::Begin(_)) => {}
            Some(Frame::End | Frame::Abort) | None => break,
        }
    }
    end(&server, &session, reason, ending);
    if reason == "expired" && ending == Ending::End {
        // Out of the table first, so no request is served and then cut off meanwhile;
        // then the record goes, so no node takes the session up again.
        shared::forget(&server, &session).await;
    }
}

/// Answers the exit's server-to-client request `id` for the agent, with a JSON-RPC error,
/// because it could not be relayed or waited too long among too many
/// ([`Session::expect_answer`]); counted as an overload.
fn refuse_request(caller: &Caller, id: Bytes) {
    metrics::with(|m| m.overload_rejections += 1);
    let error = Bytes::from_static(
        b"{\"code\":-32603,\"message\":\"Not answered: too many requests awaiting the agent's answer\"}",
    );
    let _ = caller.reply.challenge(Challenge::Answer {
        id,
        result: None,
        error: Some(error),
    });
}

fn set_support(session: &Session, support: Support) {
    let mut st = session.st.borrow_mut();
    st.support = support;
    st.acks += 1;
    st.acked_at = st.next_seq - 1;
    drop(st);
    session.changed.notify_waiters();
}

/// Whether the session has been idle (no request, no GET stream) for `timeout`, and when
/// to look again if not.
fn expiry(session: &Session, timeout: Duration) -> (bool, Instant) {
    let st = session.st.borrow();
    let now = Instant::now();
    if !st.requests.is_empty() || st.get_live {
        return (false, now + timeout);
    }
    let due = st.last_active + timeout;
    (now >= due, due)
}

/// A `Last-Event-ID` as the agent sent it back.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LastEvent<'a> {
    /// One of ours: `<stream>.<seq>`, and for the GET stream (0) perhaps `:<exit id>`.
    Ours {
        stream: u32,
        seq: u64,
        exit: Option<&'a str>,
    },
    /// Not ours: an id only the exit may know (e.g. a proxy's aggregate).
    Foreign(&'a str),
}

/// Reads a `Last-Event-ID`; `None` when it is not UTF-8 or empty.
pub(crate) fn parse_event_id(raw: &[u8]) -> Option<LastEvent<'_>> {
    // HTTP trims SP and HTAB around a field value (the decoder already has); nothing else,
    // since other Unicode spaces are part of an opaque exit id.
    let text = std::str::from_utf8(raw).ok()?.trim_matches([' ', '\t']);
    if text.is_empty() {
        return None;
    }
    let (ours, exit) = match text.split_once(':') {
        Some((ours, exit)) => (ours, Some(exit).filter(|e| !e.is_empty())),
        None => (text, None),
    };
    let parsed = ours.split_once('.').and_then(|(stream, seq)| {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(stream) || !digits(seq) {
            return None;
        }
        Some((stream.parse::<u32>().ok()?, seq.parse::<u64>().ok()?))
    });
    Some(match parsed {
        Some((stream, seq)) if stream == 0 || exit.is_none() => {
            LastEvent::Ours { stream, seq, exit }
        }
        _ => LastEvent::Foreign(text),
    })
}

/// GET: opens (or resumes) the session's event stream, or resumes a request's stream.
pub async fn get(server: Rc<Server>, req: Request, sink: Sink) {
    if !accepts_sse(&req) {
        return http_error(
            sink,
            406,
            "Not Acceptable: Accept must list text/event-stream",
            None,
        )
        .await;
    }
    let session = match session_for(&server, &req).await {
        Ok(s) => s,
        Err((status, message)) => return http_error(sink, status, message, None).await,
    };
    let last = req
        .head
        .headers
        .get("last-event-id")
        .and_then(parse_event_id);
    let resume = match last {
        Some(LastEvent::Ours { stream, seq, .. }) if stream != 0 => {
            let inflight = session
                .st
                .borrow()
                .streams
                .get(&stream)
                .and_then(Weak::upgrade);
            let Some(inflight) = inflight else {
                return http_error(
                    sink,
                    400,
                    "Bad Request: Last-Event-ID names no live stream",
                    None,
                )
                .await;
            };
            let old = inflight.attach.borrow_mut().replace((sink, seq));
            drop(old); // a resume that never got picked up: its connection is aborted
            inflight.wake.notify_one();
            return;
        }
        Some(LastEvent::Ours { seq, exit, .. }) => match replayable(&session, seq) {
            true => Resume::Ring(seq),
            false => {
                metrics::with(|m| m.events_replay_missed += 1);
                match exit {
                    Some(exit) => Resume::Exit(Rc::from(exit)),
                    None => Resume::Now,
                }
            }
        },
        Some(LastEvent::Foreign(id)) => Resume::Exit(Rc::from(id)),
        None => Resume::Now,
    };
    // Where the stream starts without a resume point: the events from this moment on,
    // including those that arrive while the exit is asked (they come right behind its
    // answer, and the task that records them runs before this one resumes).
    let (asked, now) = {
        let st = session.st.borrow();
        (st.acks, st.next_seq - 1)
    };
    let from = match resume {
        Resume::Ring(seq) => seq,
        Resume::Exit(_) | Resume::Now => now,
    };
    let hold = Hold::new(&session, from, asked);
    let last_event_id = match &resume {
        Resume::Exit(id) => Some(id.clone()),
        Resume::Ring(_) | Resume::Now => None,
    };
    let _ = session
        .lifecycle
        .reply
        .challenge(Challenge::Resume { last_event_id });
    // Resuming the exit from its own id: what it queued before answering belongs to the
    // old flow (the exit replays from the id), so the stream starts after its answer.
    let answered = match resume {
        Resume::Exit(_) => Some(asked),
        Resume::Ring(_) | Resume::Now => None,
    };
    if !wait_support(&session, answered).await {
        return http_error(
            sink,
            405,
            "Method Not Allowed: the exit has no event stream",
            None,
        )
        .await;
    }
    let cursor = {
        let st = session.st.borrow();
        match resume {
            Resume::Ring(seq) => seq,
            Resume::Exit(_) if st.acks > asked => st.acked_at,
            Resume::Exit(_) => st.next_seq - 1,
            Resume::Now => now,
        }
    };
    // The stream gets its own small task: the one answering this request is sized for
    // every kind of request (POST is the largest) and would be held for the stream's
    // whole life, as would the request (its head keeps the read buffer alive).
    drop(req);
    tokio::task::spawn_local(serve_get(session, sink, cursor, hold));
}

/// What the session knows of a GET being set up (see [`State::get_hold`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct GetHold {
    /// The seq the stream starts after.
    from: u64,
    /// The exit's answers (`acks`) when the GET asked it.
    asked: u64,
    /// Which setup this is (`State::holds`): each releases only its own hold.
    number: u64,
}

/// A GET stream being set up ([`State::get_hold`]); released when it is live, or dropped
/// when the setup fails (a 405, the agent gone).
struct Hold {
    session: Rc<Session>,
    hold: GetHold,
}

impl Hold {
    fn new(session: &Rc<Session>, from: u64, asked: u64) -> Hold {
        let mut st = session.st.borrow_mut();
        let hold = GetHold {
            from,
            asked,
            number: st.holds,
        };
        st.holds += 1;
        st.get_hold = Some(hold);
        drop(st);
        Hold {
            session: session.clone(),
            hold,
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut st = self.session.st.borrow_mut();
        // A newer GET's hold is its own to release.
        if st.get_hold == Some(self.hold) {
            st.get_hold = None;
        }
        drop(st);
        self.session.taken.notify_waiters();
    }
}

/// Where a GET stream starts.
enum Resume {
    /// After this seq, from the ring.
    Ring(u64),
    /// After this exit event id, replayed by the exit; the ring is not used.
    Exit(Rc<str>),
    /// From now on.
    Now,
}

/// True if every GET event after `seq` is still in the ring (or none has come yet).
fn replayable(session: &Session, seq: u64) -> bool {
    let st = session.st.borrow();
    let latest = st.next_seq - 1;
    let oldest = st.ring.front().map_or(st.next_seq, |(first, _)| *first);
    seq <= latest && seq + 1 >= oldest
}

/// Waits (bounded) for the exit to say whether it has an event stream; true = serve it.
/// With `answered`, waits for an answer counted after that many (the answer to the resume
/// just asked for), not for one the exit gave earlier.
async fn wait_support(session: &Session, answered: Option<u64>) -> bool {
    let probe = tokio::time::sleep(EVENTS_PROBE_TIMEOUT);
    tokio::pin!(probe);
    loop {
        let n = session.changed.notified();
        let (support, fresh) = {
            let st = session.st.borrow();
            (st.support, answered.is_none_or(|before| st.acks > before))
        };
        match support {
            Support::Yes if fresh => return true,
            Support::No if fresh => return false,
            _ => {}
        }
        tokio::select! {
            () = n => {}
            () = &mut probe => return true,
        }
    }
}

/// Serves the session's GET event stream from `cursor` on, until the agent goes, the
/// session closes or a newer GET replaces it.
///
/// This is the state an idle session with an open GET stream sits in, once per session,
/// so it is kept small: writes are boxed (a write future is larger than the whole wait,
/// and is only alive while an event or keepalive goes out).
async fn serve_get(session: Rc<Session>, mut sink: Sink, mut cursor: u64, hold: Hold) {
    let generation = {
        let mut st = session.st.borrow_mut();
        st.get_generation += 1;
        st.get_live = true;
        st.get_taken = cursor;
        st.get_generation
    };
    drop(hold);
    // A GET replaced by this one ends.
    session.changed.notify_waiters();
    let mut gone = Box::pin(sink.head(200, &sse_head(&session.id)))
        .await
        .is_err();
    if !gone && session.version >= "2025-11-25" {
        let mut out = BytesMut::with_capacity(32);
        let id = priming_id(&session, cursor);
        let priming = sse::Event {
            id: Some(&id),
            event: None,
            data: Some(b""),
            retry_ms: None,
        };
        if sse::encode_event(&priming, &mut out).is_ok() {
            gone = Box::pin(sink.body(&out)).await.is_err();
        }
    }
    let mut replaced = false;
    while !gone {
        let changed = session.changed.notified();
        let pending: Vec<Bytes> = {
            let st = session.st.borrow();
            if st.closed || st.get_generation != generation {
                replaced = true;
                break;
            }
            // The cursor moves past the events taken here only: events pushed while they
            // are being written are the next round's (the `changed` above fires for them).
            let before = cursor;
            if let Some(&(last, _)) = st.ring.back() {
                cursor = cursor.max(last);
            }
            let fresh = st.ring.iter().filter(|(seq, _)| *seq > before);
            fresh.map(|(_, b)| b.clone()).collect()
        };
        if !pending.is_empty() {
            session.st.borrow_mut().get_taken = cursor;
            session.taken.notify_waiters();
        }
        if !pending.is_empty() {
            gone = !Box::pin(write_events(&mut sink, pending)).await;
        }
        if gone {
            break;
        }
        let keepalive = tokio::time::sleep(SSE_KEEPALIVE_INTERVAL);
        let step = tokio::select! {
            () = changed => 0,
            () = keepalive => 1,
            () = sink.closed() => 2,
        };
        match step {
            1 => {
                let mut out = BytesMut::with_capacity(4);
                sse::encode_comment("", &mut out);
                gone = Box::pin(sink.body(&out)).await.is_err();
            }
            2 => gone = true,
            _ => {}
        }
    }
    let current = {
        let mut st = session.st.borrow_mut();
        let current = st.get_generation == generation;
        if current {
            st.get_live = false;
            st.last_active = Instant::now();
        }
        current
    };
    session.taken.notify_waiters();
    if replaced || !gone {
        let _ = Box::pin(sink.finish()).await;
    } else if current {
        let _ = session.lifecycle.reply.challenge(Challenge::Suspended);
    }
}

/// The id of a GET stream's priming event at `cursor`: the exit's position too when the
/// cursor is the latest event (an older cursor is followed at once by replayed events,
/// which carry their own).
fn priming_id(session: &Session, cursor: u64) -> String {
    let st = session.st.borrow();
    match &st.last_exit_event {
        Some(exit) if cursor + 1 == st.next_seq && exit_id_carried(exit) => {
            format!("0.{cursor}:{exit}")
        }
        _ => format!("0.{cursor}"),
    }
}

/// True if an exit's event id may ride in ours (`0.<seq>:<exit id>`): it must come back
/// whole in the agent's `Last-Event-ID`, so it is a valid header value (no control byte but
/// HTAB) that HTTP does not trim (no SP or HTAB at either end). An id that is not rides
/// nowhere: the event carries `0.<seq>` alone, and a resume past the ring resumes the exit
/// from where it is.
pub(crate) fn exit_id_carried(exit: &str) -> bool {
    crate::http::field_value_round_trips(exit.as_bytes())
}

/// Writes already-encoded events in order; false once the connection is gone.
async fn write_events(sink: &mut Sink, events: Vec<Bytes>) -> bool {
    for event in events {
        if sink.body(&event).await.is_err() {
            return false;
        }
    }
    true
}

/// An SSE event carrying `json` under event id `id`; `None` if the id cannot be encoded.
fn data_event(id: &str, json: &[u8]) -> Option<Bytes> {
    let mut out = BytesMut::with_capacity(json.len() + 32);
    let event = sse::Event {
        id: Some(id),
        event: None,
        data: Some(json),
        retry_ms: None,
    };
    sse::encode_event(&event, &mut out).ok()?;
    Some(out.freeze())
}

/// Response headers opening an SSE stream for `session`.
fn sse_head(session: &str) -> [(&'static str, &[u8]); 3] {
    [
        ("content-type", b"text/event-stream"),
        ("cache-control", b"no-cache"),
        ("mcp-session-id", session.as_bytes()),
    ]
}

/// DELETE: terminates the session.
pub async fn delete(server: Rc<Server>, req: Request, sink: Sink) {
    let session = match find(&server, &req).await {
        Ok(s) => s,
        Err((status, message)) => return http_error(sink, status, message, None).await,
    };
    // A shared session ends everywhere: its record goes first, so no node takes it up
    // again, and the nodes holding it are told through their watch.
    shared::forget(&server, &session).await;
    close(&server, &session, "deleted");
    let _ = sink.respond(200, &[], b"").await;
}

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
    next_seq: u64,
    /// The result event has started (SSE) or the JSON body has (JSON).
    result_started: bool,
    /// The SSE result event being written (its `data:` lines span DATA frames).
    writer: Option<sse::DataWriter>,
    /// DATA frames gathered for one write (kept to reuse its allocation). Bounded by the
    /// stream's credit window: only frames the exit was given credit for can be queued.
    parts: Vec<Bytes>,
}

impl Render<'_> {
    fn event_id(&self, seq: u64) -> String {
        format!("{}.{seq}", self.inflight.stream_no)
    }

    async fn write(&mut self, bytes: &[u8]) -> bool {
        match self.sink.as_mut() {
            Some(sink) => {
                if sink.body(bytes).await.is_err() {
                    self.sink = None;
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
        let Some(sink) = self.sink.as_mut() else {
            return;
        };
        let headers = sse_head(&self.session.id);
        if sink.head(200, &headers).await.is_err() {
            self.sink = None;
            return;
        }
        if self.session.version >= "2025-11-25" {
            let id = self.event_id(0);
            let mut out = BytesMut::with_capacity(32);
            let priming = sse::Event {
                id: Some(&id),
                event: None,
                data: Some(b""),
                retry_ms: None,
            };
            if sse::encode_event(&priming, &mut out).is_ok() {
                self.write(&out).await;
            }
        }
    }

    /// Emits one event on the SSE stream and keeps it for replay.
    async fn emit(&mut self, json: &[u8]) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let Some(out) = data_event(&self.event_id(seq), json) else {
            return;
        };
        self.ring.push_back((seq, out.clone()));
        while self.ring.len() > REQUEST_REPLAY_EVENTS_MAX {
            self.ring.pop_front();
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
            let _ = old.finish().await;
        }
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
                if let Some(sink) = self.sink.take() {
                    let headers: [(&str, &[u8]); 2] = [
                        ("content-type", b"application/json"),
                        ("mcp-session-id", self.session.id.as_bytes()),
                    ];
                    let _ = sink.respond(200, &headers, &body).await;
                }
            }
            Mode::Sse if !self.result_started => {
                self.emit(&body).await;
                self.finish().await;
            }
            // A body is half written: the only honest end is an abort (drop).
            _ => self.sink = None,
        }
    }

    fn id(&self) -> &str {
        std::str::from_utf8(&self.inflight.id_raw).unwrap_or("null")
    }

    async fn finish(&mut self) {
        if let Some(sink) = self.sink.take() {
            let _ = sink.finish().await;
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
                    let header = render_bearer(&challenge);
                    let status = if challenge.status == 403 { 403 } else { 401 };
                    let mut body = BytesMut::with_capacity(96);
                    jsonrpc::write_error(
                        Some(self.id()),
                        jsonrpc::INVALID_REQUEST,
                        "Unauthorized upstream",
                        None,
                        &mut body,
                    );
                    let headers: [(&str, &[u8]); 2] = [
                        ("content-type", b"application/json"),
                        ("www-authenticate", header.as_bytes()),
                    ];
                    let _ = sink.respond(status, &headers, &body).await;
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
    async fn on_data(&mut self, data: Bytes) -> bool {
        let reply = &self.inflight.caller.reply;
        // Credit goes back before the agent-side write, not after it: `data` is ours now
        // and is copied into the encoded chunk, so the exit can read the next window from
        // upstream while this one is written (double buffering). Memory stays bounded: one
        // window queued plus the one being written.
        reply.ack(data.len() as u32);
        if self.mode == Mode::Undecided {
            // Common case: the whole result is already here; answer in one write, copying
            // the result once, straight after the head.
            let mut prefix = BytesMut::with_capacity(64);
            jsonrpc::write_result_prefix(self.id(), &mut prefix);
            if let Some(Frame::End) = peek_end(reply) {
                if let Some(sink) = self.sink.take() {
                    let body: [&[u8]; 3] = [&prefix, &data, jsonrpc::RESULT_SUFFIX];
                    let _ = match &self.session.json_head {
                        Some(fields) => sink.respond_with_fields(fields, &body).await,
                        None => {
                            let headers: [(&str, &[u8]); 2] = [
                                ("content-type", b"application/json"),
                                ("mcp-session-id", self.session.id.as_bytes()),
                            ];
                            sink.respond_of(200, &headers, &body).await
                        }
                    };
                }
                self.result_started = true;
                return true;
            }
            self.mode = Mode::Json;
            self.result_started = true;
            if let Some(sink) = self.sink.as_mut() {
                let headers: [(&str, &[u8]); 2] = [
                    ("content-type", b"application/json"),
                    ("mcp-session-id", self.session.id.as_bytes()),
                ];
                if sink.head(200, &headers).await.is_err() {
                    self.sink = None;
                }
            }
            if let Some(sink) = self.sink.as_mut()
                && sink.body_of([&prefix[..], &data[..]]).await.is_err()
            {
                self.sink = None;
            }
            return false;
        }
        // Whatever else the exit has queued goes out in the same write, and if its END is
        // among it, the body's end too: one write per turn instead of one per frame.
        let mut parts = std::mem::take(&mut self.parts);
        parts.push(data);
        let ended = loop {
            match reply.try_next() {
                Some(Frame::Data(more)) => {
                    reply.ack(more.len() as u32);
                    parts.push(more);
                }
                Some(Frame::End) => break true,
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
                && sink.body_of(parts.iter().map(|b| &b[..])).await.is_err()
            {
                self.sink = None;
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
        self.end_with(&[]).await;
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
            Mode::Json => {
                if let Some(sink) = self.sink.take() {
                    let all = parts.iter().map(|b| &b[..]).chain([jsonrpc::RESULT_SUFFIX]);
                    let _ = sink.finish_of(all).await;
                }
            }
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
                if let Some(sink) = self.sink.take() {
                    let _ = sink.finish_of([&out[..]]).await;
                }
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
    sink: Sink,
    progress: bool,
    deadline: Instant,
) -> Outcome {
    let mut r = Render {
        session,
        inflight,
        sink: Some(sink),
        mode: Mode::Undecided,
        ring: VecDeque::new(),
        next_seq: 1,
        result_started: false,
        writer: None,
        parts: Vec::new(),
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
                match (r.mode, r.sink.as_ref()) {
                    (Mode::Sse, Some(s)) => s.closed().await,
                    _ => std::future::pending().await,
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
                if inflight.cancelled.get() {
                    caller.reply.reset(Reset::Plain);
                    caller.initial.abort();
                    // The HTTP request still gets an answer, as MCP SDK servers give it:
                    // an error naming the cancellation (the agent's SDK discards it).
                    r.error(REQUEST_CANCELLED, "Request cancelled", None).await;
                    return Outcome::Cancelled;
                }
                let attach = inflight.attach.borrow_mut().take();
                if let Some((sink, last)) = attach {
                    r.attach(sink, last).await;
                }
            }
            Step::Timeout => {
                caller.reply.reset(Reset::Plain);
                caller.initial.abort();
                r.error(jsonrpc::INTERNAL_ERROR, "Request timed out", None)
                    .await;
                return Outcome::Error;
            }
            Step::SessionClosed => {
                caller.reply.reset(Reset::Plain);
                caller.initial.abort();
                r.finish().await;
                return Outcome::Cancelled;
            }
            Step::Detached => {
                r.sink = None;
                let _ = caller.reply.challenge(Challenge::Suspended);
            }
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
                if let Event::Request { id, .. } = &event
                    && !session.expect_answer(id, AnswerTo::Request(Rc::downgrade(inflight)))
                {
                    refuse_request(caller, id.clone());
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
                if r.on_data(d).await {
                    caller.initial.end();
                    return Outcome::Ok;
                }
            }
            Step::Frame(Some(Frame::End)) => {
                caller.initial.end();
                r.on_end().await;
                return Outcome::Ok;
            }
            Step::Frame(Some(Frame::Abort) | None) => {
                r.on_abort().await;
                caller.initial.abort();
                return Outcome::Error;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_are_ours_or_the_exits() {
        let ours = |stream, seq, exit| Some(LastEvent::Ours { stream, seq, exit });
        assert_eq!(parse_event_id(b"0.17"), ours(0, 17, None));
        assert_eq!(parse_event_id(b" 3.0 "), ours(3, 0, None));
        assert_eq!(
            parse_event_id(b"0.5:2=200;S=101"),
            ours(0, 5, Some("2=200;S=101"))
        );
        assert_eq!(parse_event_id(b"0.5:"), ours(0, 5, None));
        // An exit's own id after `:` keeps every byte, colons included.
        assert_eq!(parse_event_id(b"0.5:a:b"), ours(0, 5, Some("a:b")));
        for foreign in [
            "3",
            "a.b",
            "3.",
            ".4",
            "-1.2",
            "1.2.3",
            "2=200;S=101",
            "4.1:x",
        ] {
            assert_eq!(
                parse_event_id(foreign.as_bytes()),
                Some(LastEvent::Foreign(foreign)),
                "{foreign:?}"
            );
        }
        assert_eq!(parse_event_id(b""), None);
        assert_eq!(parse_event_id(b"  "), None);
        assert_eq!(parse_event_id(b"\xff.1"), None);
        // Only SP and HTAB are trimmed (as HTTP does): other Unicode spaces are the exit's
        // (a fuzz finding: `str::trim` cut them).
        assert_eq!(
            parse_event_id("0.17:S=abc\u{3000}".as_bytes()),
            ours(0, 17, Some("S=abc\u{3000}"))
        );
        assert_eq!(
            parse_event_id("\u{a0}0.1".as_bytes()),
            Some(LastEvent::Foreign("\u{a0}0.1"))
        );
        assert_eq!(parse_event_id(b"\t0.2:x \t"), ours(0, 2, Some("x")));
    }

    #[test]
    fn exit_ids_ride_in_ours_only_when_they_come_back_whole() {
        // A fuzz finding: an exit id ending in a space came back without it.
        for fine in ["7", "S=abc;2=1", "a b", "x\ty", "\u{3000}"] {
            assert!(exit_id_carried(fine), "{fine:?}");
        }
        for not in [
            "", "abc ", " abc", "\tabc", "abc\t", "a\rb", "a\nb", "a\0b", "a\x7fb",
        ] {
            assert!(!exit_id_carried(not), "{not:?}");
        }
    }

    #[test]
    fn bearer_challenges_render_quoted_and_escaped() {
        let c = BearerChallenge {
            status: 403,
            realm: Some("git\"hub".into()),
            scope: Some("repo read".into()),
            error: Some("insufficient_scope".into()),
            error_description: None,
            resource_metadata: Some("https://x/.well-known/oauth-protected-resource".into()),
        };
        assert_eq!(
            render_bearer(&c),
            "Bearer realm=\"git\\\"hub\", scope=\"repo read\", error=\"insufficient_scope\", resource_metadata=\"https://x/.well-known/oauth-protected-resource\""
        );
        assert_eq!(render_bearer(&BearerChallenge::default()), "Bearer");
    }
}
