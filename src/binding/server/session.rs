//! Sessions: one agent session per [`Session`], owned by the worker whose id it carries;
//! its lifecycle stream to the exit (read by one task, [`lifecycle_task`], which also
//! expires the session), the requests in flight on it, the agent's answers to
//! server-to-client requests, and its end ([`close`], [`end`], `DELETE`).
//!
//! Event ids are `<stream>.<seq>`: stream 0 is the session's GET stream, streams 1.. are
//! request SSE streams, so every id is unique within the session and names the stream it
//! belongs to (MCP: ids encode the originating stream; replay never crosses streams). The
//! GET stream's ring of events lives here, with the session ([`get`](super::get) serves it);
//! a request's own events live with its reply ([`reply`](super::reply)).
//!
//! Invariants: a session is in its server's table from [`Session::create`] until [`end`],
//! which runs once; at most [`PENDING_ANSWERS_PER_SESSION_MAX`] server-to-client requests
//! wait for the agent's answer; the ring holds at most [`SESSION_REPLAY_EVENTS_MAX`] events
//! (plus [`GET_SETUP_EVENTS_MAX`] while a GET is being set up) and, once a GET being set up
//! is live, about [`SESSION_REPLAY_BYTES_MAX`] bytes (the newest event whatever its size),
//! and never drops one the live GET has not taken.

use super::Server;
use super::edge::http_error;
use super::shared::{self, Ending, Link, Write, Written};
use super::sink::Sink;
use crate::FastMap;
use crate::binding::server::metrics as server_metrics;
use crate::jsonrpc::{self, IdKey};
use crate::limits::{
    GET_SETUP_EVENTS_MAX, PENDING_ANSWER_ID_BYTES_MAX, PENDING_ANSWERS_PER_SESSION_MAX,
    SESSION_REPLAY_BYTES_MAX, SESSION_REPLAY_EVENTS_MAX,
};
use crate::log;
use crate::metrics::{self};
use crate::runtime::notify::Notify;
use crate::runtime::pass;
use crate::sse;
use crate::stream::{Caller, Caps, Challenge, Event, Flush, Frame, Inline, ReplyBegin};
use bytes::{Bytes, BytesMut};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::Write as _;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

/// The longest id of a GET-stream event without the exit's part: `0.` and a `u64`'s 20
/// decimal digits.
const GET_EVENT_ID_BYTES: usize = 22;

/// Whether the exit has a server-to-agent event stream.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Support {
    Unknown,
    Yes,
    No,
}

/// Where an agent's answer to a server-to-client request goes.
pub(super) enum AnswerTo {
    Lifecycle,
    Request(Weak<Inflight>),
}

/// A server-to-client request relayed to the agent and not answered yet.
pub(super) struct Pending {
    to: AnswerTo,
    /// The request's id as the exit wrote it (an answer refusing it for the agent echoes it).
    id: Bytes,
    /// Order of arrival: when the table is full, the oldest is answered for the agent.
    order: u64,
}

pub(super) struct State {
    pub(super) closed: bool,
    pub(super) last_active: Instant,
    pub(super) requests: FastMap<IdKey, Rc<Inflight>>,
    pub(super) streams: FastMap<u32, Weak<Inflight>>,
    pub(super) next_stream: u32,
    /// Encoded GET-stream events kept for replay, oldest first.
    pub(super) ring: VecDeque<(u64, Bytes)>,
    /// The bytes of the ring's events together (see [`State::trim_ring_bytes`]).
    pub(super) ring_bytes: usize,
    pub(super) next_seq: u64,
    pub(super) get_generation: u64,
    pub(super) get_live: bool,
    /// The last seq the live GET stream has written to the agent. While a GET is live,
    /// the ring never drops an event it has not written: the lifecycle task stops
    /// reading the exit's events once `next_seq - 1 - get_taken` reaches the ring's size
    /// (see [`Session::get_behind`]), so a burst is back-pressured, not lost.
    pub(super) get_taken: u64,
    /// A GET stream being set up (from its arrival until it is live): the seq it starts
    /// after, and how many exit answers (`acks`) there were when it asked the exit. Until
    /// it is live the ring keeps up to [`GET_SETUP_EVENTS_MAX`] more events than usual,
    /// and once the exit has answered it, the lifecycle task holds back as for a live GET.
    pub(super) get_hold: Option<GetHold>,
    pub(super) support: Support,
    /// Control events (resumable, suspend) seen from the exit: how a GET knows the exit
    /// has answered the resume it just asked for.
    pub(super) acks: u64,
    /// The ring's last seq when the latest of them came: a stream resumed by the exit
    /// starts after it (what the exit sent before its answer belongs to the old flow).
    pub(super) acked_at: u64,
    pub(super) last_exit_event: Option<Rc<str>>,
    /// Server-to-client requests relayed to the agent and not answered yet, by id.
    /// Invariant: `len() <= PENDING_ANSWERS_PER_SESSION_MAX`.
    pub(super) answers: FastMap<IdKey, Pending>,
    /// The next `Pending::order`.
    pub(super) answers_order: u64,
    /// The number the next GET setup's hold gets (holds are told apart by it).
    pub(super) holds: u64,
}

impl State {
    fn pop_ring(&mut self) {
        if let Some((_, old)) = self.ring.pop_front() {
            self.ring_bytes -= old.len();
        }
    }

    /// Drops the ring's oldest events while it holds more than [`SESSION_REPLAY_BYTES_MAX`]
    /// bytes, keeping the newest whatever its size, and never one a GET may still need to
    /// write: past the live GET's position, or, while one is set up, past where it starts.
    /// Such events stay, and [`Session::get_behind`] holds the exit back until the GET
    /// took them (it calls this again when it has).
    pub(super) fn trim_ring_bytes(&mut self) {
        let mut needed_after = u64::MAX;
        if self.get_live {
            needed_after = self.get_taken;
        }
        if let Some(hold) = self.get_hold {
            needed_after = needed_after.min(hold.from);
        }
        while self.ring_bytes > SESSION_REPLAY_BYTES_MAX
            && self.ring.len() > 1
            && self
                .ring
                .front()
                .is_some_and(|(seq, _)| *seq <= needed_after)
        {
            self.pop_ring();
        }
    }

    /// The ring is over its byte bound with events a GET has not taken (what is left
    /// after [`State::trim_ring_bytes`]).
    fn over_bytes(&self) -> bool {
        self.ring_bytes > SESSION_REPLAY_BYTES_MAX && self.ring.len() > 1
    }
}

/// One agent session, owned by the worker that created it.
pub struct Session {
    pub id: Rc<str>,
    /// The exit's id for this session, sent in every request `Begin`.
    pub exit_session: Rc<str>,
    pub caps: Caps,
    pub version: &'static str,
    pub(super) lifecycle: Caller,
    pub(super) st: RefCell<State>,
    /// Woken on new GET events, a replaced GET, support news and close.
    pub(super) changed: Notify,
    /// Woken at close only: the wait of tasks that care for nothing else (the lifecycle
    /// task, replies), which `changed` would wake at every event.
    ended: Notify,
    /// Woken when the live GET took events from the ring, or ended (the lifecycle task
    /// waits on it while the GET is behind).
    pub(super) taken: Notify,
    /// The fields of this session's `200 application/json` reply head, made once (the id
    /// is ours, so the check cannot fail; should it, replies are encoded field by field).
    pub(super) json_head: Option<Bytes>,
    /// A shared session (`sessions: { store }`): what its record is written from.
    pub(super) shared: Option<Link>,
    /// `auth`: the subject whose token opened it; only that subject's requests find it.
    pub owner: Option<Rc<str>>,
}

/// One request in flight on a session.
pub struct Inflight {
    pub caller: Caller,
    pub(super) id_raw: Bytes,
    pub(super) key: IdKey,
    pub(super) stream_no: u32,
    pub(super) cancelled: Cell<bool>,
    pub(super) wake: Notify,
    /// A connection resuming this request's SSE stream, with the last seq it saw.
    pub(super) attach: RefCell<Option<(Sink, u64)>>,
    /// How far its reply is, as a GET resuming it sees it (set by the reply's renderer).
    pub(super) stream: Cell<ReplyStream>,
}

/// A request's reply as a GET naming its stream sees it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum ReplyStream {
    /// No event stream (not decided yet, or answered as JSON): the agent cannot have had
    /// an id of one, and there is nothing to resume.
    None,
    /// An event stream before its result: a GET takes it up and gets what it missed.
    Events,
    /// The stream's last event (its result, or an error) is being written on the
    /// connection the stream has, or the stream ended. That event is not kept for replay,
    /// so a new connection could only get its rest, without its start: the old connection
    /// carries it to its end.
    Closing,
}

impl ReplyStream {
    /// Why a GET cannot take this stream up (the message of its 400); `None` when it can.
    pub(super) fn refusal(self) -> Option<&'static str> {
        match self {
            ReplyStream::None => Some(NO_LIVE_STREAM),
            ReplyStream::Events => None,
            ReplyStream::Closing => Some(
                "Bad Request: Last-Event-ID names a stream whose last event is being written on another connection",
            ),
        }
    }
}

/// The 400 a GET gets when its `Last-Event-ID` names no stream it can resume.
pub(super) const NO_LIVE_STREAM: &str = "Bad Request: Last-Event-ID names no live stream";

impl Session {
    /// Creates and registers a session whose lifecycle the exit just accepted.
    pub fn create(
        server: &Rc<Server>,
        id: Rc<str>,
        version: &'static str,
        reply: ReplyBegin,
        lifecycle: Caller,
        shared: Option<Link>,
        owner: Option<Rc<str>>,
    ) -> Rc<Session> {
        if let (Some(store), Some(link)) = (server.shared.as_ref(), shared.as_ref()) {
            match store.watch(&shared::key(&server.name, &id)) {
                Ok(watch) => *link.watch.borrow_mut() = Some(watch),
                Err(e) => {
                    // It is then told of a DELETE at another node only at its expiry. A
                    // full watch table refuses every new session: one line per spacing.
                    server_metrics::with(|m| m.session_store_failures += 1);
                    if shared::store_log_due() {
                        log::warn(format_args!(
                            "server {}: a shared session is not watched: {e}",
                            server.name
                        ));
                    }
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
                ring_bytes: 0,
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
            ended: Notify::new(),
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
            owner,
        });
        server.sessions.borrow_mut().insert(id, session.clone());
        server_metrics::with(|m| {
            m.sessions += 1;
            m.sessions_created += 1;
        });
        let taker: Weak<dyn Inline> = Rc::downgrade(&session) as Weak<Session>;
        session.lifecycle.reply.take_inline(taker);
        tokio::task::spawn_local(lifecycle_task(server.clone(), session.clone()));
        session
    }

    /// Marks the session active now.
    pub fn touch(&self) {
        self.st.borrow_mut().last_active = pass::now();
    }

    /// Writes this shared session's record (see [`shared::write`]); `Done` for a session
    /// that is not shared.
    pub async fn write_record(&self, server: &Server, how: Write, loud: bool) -> Written {
        let Some(link) = self.shared.as_ref() else {
            return Written::Done;
        };
        shared::write(
            server,
            &self.id,
            self.version,
            link,
            self.last_active(),
            how,
            loud,
        )
        .await
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

    /// Requests in flight (counted by stream: one per request, whatever its id).
    pub fn request_count(&self) -> usize {
        self.st.borrow().streams.len()
    }

    /// True while a request with this id is in flight (MCP: an id is not reused within a
    /// session, so a second one is refused rather than served beside the first).
    pub fn in_flight(&self, key: &IdKey) -> bool {
        self.st.borrow().requests.contains_key(key)
    }

    /// True while a live GET stream (or one being set up, once the exit answered it) has
    /// a ring's worth of events it has not taken yet: one more would push an event it
    /// never wrote out of the ring. Before the exit's answer the lifecycle task must not
    /// wait (the answer comes through it), so a GET being set up only makes the ring keep
    /// more ([`GET_SETUP_EVENTS_MAX`]).
    pub(super) fn get_behind(&self) -> bool {
        let st = self.st.borrow();
        let last = st.next_seq - 1;
        let ring = SESSION_REPLAY_EVENTS_MAX as u64;
        match st.get_hold {
            // A new GET waits for the exit's answer, which comes through the lifecycle
            // task: it must go on reading, even for a live GET that stopped taking events
            // (the one the new GET replaces; the ring keeps more meanwhile).
            Some(hold) if st.acks <= hold.asked => false,
            Some(hold) => last.saturating_sub(hold.from) >= ring || st.over_bytes(),
            None => st.get_live && (last.saturating_sub(st.get_taken) >= ring || st.over_bytes()),
        }
    }

    pub(super) fn is_closed(&self) -> bool {
        self.st.borrow().closed
    }

    pub(super) async fn closed_wait(&self) {
        loop {
            let n = self.ended.notified();
            if self.is_closed() {
                return;
            }
            n.await;
        }
    }

    /// Records a request's stream. The caller has refused an id in flight
    /// ([`Session::in_flight`]).
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
            stream: Cell::new(ReplyStream::None),
        });
        let replaced = st.requests.insert(key, inflight.clone());
        assert!(
            replaced.is_none(),
            "an id in flight is refused before it is registered"
        );
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
        if let Some((sink, _)) = inflight.attach.borrow_mut().take() {
            // A resume the reply ended without taking (it came as the last event went).
            tokio::task::spawn_local(http_error(sink, 400, NO_LIVE_STREAM, None));
        }
        st.answers.retain(|_, pending| match &pending.to {
            AnswerTo::Request(w) => w.upgrade().is_some_and(|i| !Rc::ptr_eq(&i, inflight)),
            AnswerTo::Lifecycle => true,
        });
        st.last_active = pass::now();
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
        self.to_exit(Event::Notification {
            method: Rc::from(method),
            params,
        });
    }

    /// Sends the exit an event on the lifecycle's initial direction. Never waits: a
    /// lifecycle whose queue is full drops it, counted as an overload.
    fn to_exit(&self, event: Event) {
        if !self.lifecycle.initial.try_flush(Flush { id: None, event }) {
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
    pub(super) fn expect_answer(&self, id: &Bytes, to: AnswerTo) -> bool {
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
    /// Keeps an event of the exit's lifecycle: its id as the exit's position, and, for
    /// the agent, its JSON in the GET stream's ring.
    fn on_event(&self, id: Option<Rc<str>>, event: &Event) {
        if id.is_some() {
            self.st.borrow_mut().last_exit_event = id.clone();
        }
        if let Some(json) = render_event(event) {
            self.push_event(&json, id.as_deref());
        }
    }

    pub(super) fn push_event(&self, json: &[u8], exit_id: Option<&str>) {
        let mut st = self.st.borrow_mut();
        let seq = st.next_seq;
        st.next_seq += 1;
        let out = match exit_id.filter(|exit| exit_id_carried(exit)) {
            Some(exit) => data_event(&format!("0.{seq}:{exit}"), json),
            None => None,
        };
        let out = out.or_else(|| {
            // Written on the stack: at a list change every session of the worker gets one.
            let mut id = [0u8; GET_EVENT_ID_BYTES];
            let mut rest = &mut id[..];
            write!(rest, "0.{seq}").ok()?;
            let len = GET_EVENT_ID_BYTES - rest.len();
            data_event(std::str::from_utf8(id.get(..len)?).ok()?, json)
        });
        let Some(out) = out else {
            return;
        };
        st.ring_bytes += out.len();
        st.ring.push_back((seq, out));
        let keep = match st.get_hold {
            Some(_) => SESSION_REPLAY_EVENTS_MAX + GET_SETUP_EVENTS_MAX,
            None => SESSION_REPLAY_EVENTS_MAX,
        };
        while st.ring.len() > keep {
            st.pop_ring();
        }
        st.trim_ring_bytes();
        drop(st);
        self.changed.notify_waiters();
    }
}

/// The exit's notifications reach the ring in the exit's own call when the lifecycle task
/// would do no more with them than keep them: at a list change every session of the worker
/// is told, and this saves a wake and a poll of each one's task. Everything else (events
/// that change the session's state, events while the GET stream is a ring behind, which
/// the task holds back) goes to the task.
impl Inline for Session {
    fn take(&self, flush: Flush) -> Option<Flush> {
        // A server-to-client request is recorded as awaiting the agent's answer, by the task.
        let plain = for_agent(&flush.event) && !matches!(flush.event, Event::Request { .. });
        // A sender called from inside the session's own code finds its state borrowed.
        let free = self.st.try_borrow_mut().is_ok();
        if !plain || !free || self.is_closed() || self.get_behind() {
            return Some(flush);
        }
        self.on_event(flush.id, &flush.event);
        None
    }
}

impl Inflight {
    pub(super) async fn woken(&self) {
        self.wake.notified().await;
    }
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
    server_metrics::with(|m| m.sessions -= 1);
    if ending == Ending::Detach {
        server_metrics::with(|m| m.sessions_detached += 1);
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
    session.ended.notify_waiters();
    if reason == "expired" {
        server_metrics::with(|m| m.sessions_expired += 1);
    }
}

/// Renders an MCP notification (`{"jsonrpc":"2.0","method":..,"params":..}`).
pub(super) fn notification(method: &str, params: Option<&[u8]>) -> BytesMut {
    let mut out = BytesMut::with_capacity(64 + params.map_or(0, <[u8]>::len));
    jsonrpc::write_notification(method, params, &mut out);
    out
}

/// True for the events the agent is told of: those [`render_event`] renders.
fn for_agent(event: &Event) -> bool {
    matches!(
        event,
        Event::ListChanged(_)
            | Event::ResourcesUpdated { .. }
            | Event::Progress { .. }
            | Event::Notification { .. }
            | Event::Request { .. }
    )
}

/// Renders an event from the exit as agent-facing JSON; `None` for control events.
pub(super) fn render_event(event: &Event) -> Option<Bytes> {
    Some(
        match event {
            Event::Resumable
            | Event::Suspend { .. }
            | Event::Handoff(_)
            | Event::Recheck { .. }
            | Event::Rechecked { .. }
            | Event::Detach => {
                return None;
            }
            // Told to every session of the worker at once: its fixed text, not rendered.
            Event::ListChanged(k) => return Some(Bytes::from_static(k.notification())),
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
        }
        .freeze(),
    )
}

/// How often an expiry that waits for its own record's write in flight looks again.
const EXPIRY_WRITE_WAIT: Duration = Duration::from_millis(50);

/// The session's task: reads the exit's lifecycle reply (notifications for the GET stream,
/// support news, the end of the session when the exit ends it) and expires the session
/// once it has been idle (no request, no GET stream) for the binding's session timeout.
/// One task for both: it lives as long as the session, and every task costs a task cell.
async fn lifecycle_task(server: Rc<Server>, session: Rc<Session>) {
    let timeout = server.cfg.session_timeout;
    let mut reason = "lifecycle ended";
    let mut ending = Ending::End;
    // At expiry: the version of the record the decision to end was taken on.
    let mut read = None;
    // A shared session's record: its changes at any node wake this task.
    let mut watch = session.shared.as_ref().and_then(|l| l.watch.take());
    // One idle timer for the session's life, moved only when it fired or must fire
    // earlier: a timer made at every wake would enter tokio's timer wheel and leave it
    // again for each of thousands of sessions at every list change. Firing early is
    // harmless (the loop checks the expiry again and re-arms it).
    let idle = tokio::time::sleep_until((Instant::now() + timeout).into());
    tokio::pin!(idle);
    loop {
        let (expired, mut check_at) = expiry(&session, timeout);
        if expired && session.shared.as_ref().is_some_and(Link::writing) {
            // A write of the record is in flight (a touch came due just before): decided
            // before it lands, the end would find its own record moved and only let go,
            // or find none and leave the write to make it again. It ends within the
            // store's deadline.
            tokio::time::sleep(EXPIRY_WRITE_WAIT).await;
            continue;
        }
        if expired {
            let (decided, version) = match session.shared {
                Some(_) => shared::at_expiry(&server, &session.id).await,
                None => (Ending::End, None),
            };
            // Activity that came while the store was asked keeps the session.
            if !expiry(&session, timeout).0 {
                continue;
            }
            reason = "expired";
            ending = decided;
            read = version;
            break;
        }
        if let Some(link) = session.shared.as_ref() {
            let (due, next) = shared::touch(&server, link, session.last_active());
            if due {
                tokio::task::spawn_local(write_record(server.clone(), session.clone()));
            }
            check_at = check_at.min(next);
        }
        if idle.is_elapsed() || check_at < idle.deadline().into_std() {
            idle.as_mut().reset(check_at.into());
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
                    () = idle.as_mut() => {}
                }
                continue;
            }
        }
        let frame = tokio::select! {
            f = session.lifecycle.reply.next() => f,
            () = session.closed_wait() => None,
            () = idle.as_mut() => continue,
            alive = record_changed => {
                if alive {
                    recheck(&server, &session, None);
                } else {
                    watch = None;
                }
                continue;
            }
        };
        match frame {
            // Events taken in the exit's call may have filled the ring since this task
            // looked: one for the agent then waits in the stream until the GET took more.
            Some(Frame::Flush(flush)) if for_agent(&flush.event) && session.get_behind() => {
                session.lifecycle.reply.unread(Frame::Flush(flush));
            }
            Some(Frame::Flush(Flush {
                event: Event::Handoff(handoff),
                ..
            })) => {
                if let Some(link) = session.shared.as_ref() {
                    link.set_handoff(handoff);
                }
            }
            Some(Frame::Flush(Flush {
                event: Event::Recheck { seq },
                ..
            })) => recheck(&server, &session, Some(seq)),
            Some(Frame::Flush(Flush { id, event })) => {
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
                session.on_event(id, &event);
            }
            Some(Frame::Data(d)) => session.lifecycle.reply.ack(d.len() as u32),
            Some(Frame::Begin(_)) => {}
            Some(Frame::End | Frame::Abort) | None => break,
        }
    }
    if let Some(version) = read
        && ending == Ending::End
    {
        // The record goes first, so no node takes the session up again; but only the
        // record the decision was taken on: one written since (another node took the
        // session up while the store was asked) means it lives on there, and this node
        // lets go of its copy without ending the upstream sessions that node now uses.
        // (A request that comes meanwhile is cut off by the end: the session was idle for
        // the whole timeout, and its record is gone.)
        if shared::forget(&server, &session.id, Some(version)).await == shared::Forgot::Moved {
            ending = Ending::Detach;
        }
    }
    end(&server, &session, reason, ending);
}

/// Writes a shared session's record over the one in the store (a task of its own, so the
/// session's task never waits on the store); a record that is gone was deleted at another
/// node meanwhile, and this copy goes too (that node ended the upstream sessions).
async fn write_record(server: Rc<Server>, session: Rc<Session>) {
    // A record never written (the store was down when the session opened) is made now: no
    // other node knew the session, so none can have deleted it.
    let how = match session.shared.as_ref().is_some_and(Link::recorded) {
        true => Write::Update,
        false => Write::Create,
    };
    if session.write_record(&server, how, false).await == Written::Gone {
        end(&server, &session, "deleted at another node", Ending::Detach);
    }
}

/// Reads a shared session's record again, in a task of its own (one at a time per
/// session): when its watch fired (the record changed at some node), or when the exit
/// asked (`asked`: [`Event::Recheck`]'s `seq`, a route about to open here for the first
/// time). A record gone lets go of the session here (see [`shared::Looked::Gone`]), unless
/// this node surely never wrote it (the store was down when the session opened: no other
/// node knows it, and the touch loop writes it; a write whose answer was lost may have
/// landed, and counts as written); a record whose handoff differs from this
/// node's (another node opened routes) is passed to the exit, which takes those routes up
/// instead of opening upstream sessions of its own. Every ask gets an
/// [`Event::Rechecked`] from a read that began after it, empty when there is no news.
fn recheck(server: &Rc<Server>, session: &Rc<Session>, asked: Option<u64>) {
    let Some(link) = session.shared.as_ref() else {
        // Not shared: the exit's wait ends at once.
        if let Some(seq) = asked {
            session.to_exit(Event::Rechecked {
                seq,
                handoff: Bytes::new(),
            });
        }
        return;
    };
    if let Some(seq) = asked {
        link.asked.set(link.asked.get().max(seq));
    }
    if link.checking.replace(true) {
        // The read in flight may have begun before this ask: the task reads once more.
        return;
    }
    let (server, session) = (server.clone(), session.clone());
    tokio::task::spawn_local(async move {
        loop {
            let Some(link) = session.shared.as_ref() else {
                return;
            };
            let asked = link.asked.get();
            let generation = link.generation.get();
            let looked = shared::look(&server, &session.id).await;
            let read = match looked {
                shared::Looked::Gone if link.maybe_recorded() => {
                    link.checking.set(false);
                    // A DELETE asked here (its tombstone's answer may have been lost, or
                    // this read overtook it): the session ends with its upstream ones.
                    if link.delete_asked() {
                        end(&server, &session, "deleted", Ending::End);
                    } else {
                        end(&server, &session, "deleted at another node", Ending::Detach);
                    }
                    return;
                }
                shared::Looked::Recorded(Some(handoff)) => Some(handoff),
                shared::Looked::Gone | shared::Looked::Recorded(None) | shared::Looked::Unknown => {
                    None
                }
            };
            // Another node's routes: this node writes them from now on, unless its own exit
            // handed off something newer while the store was read.
            let news = read
                .as_ref()
                .filter(|h| link.handoff().as_ref() != Some(*h));
            if let Some(handoff) = news
                && link.generation.get() == generation
            {
                link.adopt_handoff(handoff.clone());
            }
            if asked > link.answered.get() {
                link.answered.set(asked);
                let handoff = read.unwrap_or_default();
                session.to_exit(Event::Rechecked {
                    seq: asked,
                    handoff,
                });
            } else if let Some(handoff) = news {
                session.to_exit(Event::Handoff(handoff.clone()));
            }
            if link.asked.get() == asked {
                link.checking.set(false);
                return;
            }
        }
    });
}

/// Answers the exit's server-to-client request `id` for the agent, with a JSON-RPC error,
/// because it could not be relayed or waited too long among too many
/// ([`Session::expect_answer`]); counted as an overload.
pub(super) fn refuse_request(caller: &Caller, id: Bytes) {
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

pub(super) fn set_support(session: &Session, support: Support) {
    let mut st = session.st.borrow_mut();
    st.support = support;
    st.acks += 1;
    st.acked_at = st.next_seq - 1;
    drop(st);
    session.changed.notify_waiters();
}

/// Whether the session has been idle (no request, no GET stream) for `timeout`, and when
/// to look again if not.
pub(super) fn expiry(session: &Session, timeout: Duration) -> (bool, Instant) {
    let st = session.st.borrow();
    let now = Instant::now();
    if !st.requests.is_empty() || st.get_live {
        return (false, now + timeout);
    }
    let due = st.last_active + timeout;
    (now >= due, due)
}

/// What the session knows of a GET being set up (see [`State::get_hold`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) struct GetHold {
    /// The seq the stream starts after.
    pub(super) from: u64,
    /// The exit's answers (`acks`) when the GET asked it.
    pub(super) asked: u64,
    /// Which setup this is (`State::holds`): each releases only its own hold.
    pub(super) number: u64,
}

/// True if an exit's event id may ride in ours (`0.<seq>:<exit id>`): it must come back
/// whole in the agent's `Last-Event-ID`, so it is a valid header value (no control byte but
/// HTAB) that HTTP does not trim (no SP or HTAB at either end). An id that is not rides
/// nowhere: the event carries `0.<seq>` alone, and a resume past the ring resumes the exit
/// from where it is.
pub(crate) fn exit_id_carried(exit: &str) -> bool {
    crate::http::field_value_round_trips(exit.as_bytes())
}

/// An SSE event carrying `json` under event id `id`; `None` if the id cannot be encoded.
pub(super) fn data_event(id: &str, json: &[u8]) -> Option<Bytes> {
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
pub(super) fn sse_head(session: &str) -> [(&'static str, &[u8]); 3] {
    [
        ("content-type", b"text/event-stream"),
        ("cache-control", b"no-cache"),
        ("mcp-session-id", session.as_bytes()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binding::{Exit, Serving};
    use crate::config::ServerBinding;
    use crate::limits::{MEMORY_STORE_KEYS_MAX, SHARED_SESSION_RECORD_BYTES_MAX};
    use crate::store::memory::MemoryStore;
    use crate::store::testing::Hooked;
    use crate::store::{Store, Watch};
    use crate::stream::{Begin, Callee, ClientHello, ListKind};
    use crate::testing::{run_local as run, settle};
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    /// An exit that serves nothing: the tests hold the session's lifecycle themselves.
    struct NoExit;

    impl Exit for NoExit {
        fn serve(&self, _callee: Callee) -> Option<Serving> {
            None
        }
    }

    fn server() -> Rc<Server> {
        server_with(None, Duration::from_secs(600))
    }

    /// A server whose sessions are shared through `store` (`None`: not shared).
    fn server_with(store: Option<Arc<dyn Store>>, session_timeout: Duration) -> Rc<Server> {
        let cfg = ServerBinding {
            listen: "127.0.0.1:0".parse().expect("an address"),
            path: "/mcp".into(),
            exit: "none".into(),
            origins: None,
            hosts: None,
            session_timeout,
            request_timeout: Duration::from_secs(30),
            tls: None,
            sessions_store: None,
            auth: None,
        };
        let (inboxes, _receivers) = crate::runtime::inboxes(1);
        let common = super::super::Common {
            tls: None,
            sessions: store,
            auth: None,
        };
        Server::new("north", 0, cfg, 0, Rc::new(NoExit), inboxes, common)
    }

    /// A session whose lifecycle's exit end the test holds.
    fn session(server: &Rc<Server>) -> (Rc<Session>, Callee) {
        opened(server, "s-1", false)
    }

    /// A shared session `id` (its record not written yet) whose lifecycle's exit end the
    /// test holds.
    fn shared_session(server: &Rc<Server>, id: &str) -> (Rc<Session>, Callee) {
        opened(server, id, true)
    }

    fn opened(server: &Rc<Server>, id: &str, shared: bool) -> (Rc<Session>, Callee) {
        let link = shared.then(|| Link::new(Bytes::from_static(b"{}"), None, None));
        opened_with(server, id, link)
    }

    /// A session `id`, shared through `link` if there is one.
    fn opened_with(server: &Rc<Server>, id: &str, link: Option<Link>) -> (Rc<Session>, Callee) {
        let shared = link.is_some();
        let hello = ClientHello {
            capabilities: Bytes::from_static(b"{}"),
            protocol_version: "2025-11-25",
            authorization: None,
            adopt: None,
            shared,
        };
        let begin = Begin::lifecycle(hello, Instant::now() + Duration::from_secs(60));
        let (caller, callee) = crate::stream::open(begin);
        let reply = ReplyBegin {
            session: Some(Rc::from("up-1")),
            caps: Caps::empty(),
            instructions: None,
            handoff: None,
        };
        let session = Session::create(
            server,
            Rc::from(id),
            "2025-11-25",
            reply,
            caller,
            link,
            None,
        );
        (session, callee)
    }

    fn note(n: usize) -> Flush {
        Flush {
            id: None,
            event: Event::Notification {
                method: Rc::from("notifications/message"),
                params: Some(Bytes::from(format!(r#"{{"n":{n}}}"#))),
            },
        }
    }

    /// The seqs the ring holds, oldest first.
    fn ring(session: &Session) -> Vec<u64> {
        session
            .st
            .borrow()
            .ring
            .iter()
            .map(|(seq, _)| *seq)
            .collect()
    }

    #[test]
    fn events_the_exit_sends_faster_than_a_live_get_takes_wait_in_the_stream() {
        run(async {
            let server = server();
            let (session, callee) = session(&server);
            settle(64).await;
            // A live GET stream that takes nothing.
            let taken = {
                let mut st = session.st.borrow_mut();
                st.get_live = true;
                st.get_generation = 1;
                st.get_taken = st.next_seq - 1;
                st.get_taken
            };
            let total = 3 * SESSION_REPLAY_EVENTS_MAX;
            let exit = tokio::task::spawn_local(async move {
                for n in 0..total {
                    if callee.reply.flush(note(n)).await.is_err() {
                        break;
                    }
                }
                callee
            });
            settle(64).await;
            // Taken in the exit's call until the ring is full; then held in the stream,
            // by the lifecycle task too: nothing the GET has not taken is pushed out.
            let held: Vec<u64> = (taken + 1..=taken + SESSION_REPLAY_EVENTS_MAX as u64).collect();
            assert_eq!(ring(&session), held);
            // The GET takes them: the rest follows, a ring at a time.
            for _ in 0..2 {
                {
                    let mut st = session.st.borrow_mut();
                    st.get_taken = st.next_seq - 1;
                }
                session.taken.notify_waiters();
                settle(64).await;
                let last = session.st.borrow().get_taken;
                let next: Vec<u64> = (last + 1..=last + SESSION_REPLAY_EVENTS_MAX as u64).collect();
                assert_eq!(ring(&session), next);
            }
            assert_eq!(session.st.borrow().next_seq - 1, taken + total as u64);
            let _callee = exit.await.expect("the exit's task");
            close(&server, &session, "test over");
        });
    }

    /// A notification whose params are `bytes` long.
    fn big_note(n: usize, bytes: usize) -> Flush {
        let pad = "x".repeat(bytes);
        Flush {
            id: None,
            event: Event::Notification {
                method: Rc::from("notifications/message"),
                params: Some(Bytes::from(format!(r#"{{"n":{n},"pad":"{pad}"}}"#))),
            },
        }
    }

    #[test]
    fn the_ring_keeps_its_bytes_bounded_and_large_events_a_live_get_has_not_taken_wait() {
        run(async {
            let server = server();
            let (session, callee) = session(&server);
            settle(64).await;
            const MIB: usize = 1024 * 1024;
            let per_ring = SESSION_REPLAY_BYTES_MAX / MIB;
            // No GET: the oldest go once the ring is over its bytes, far before its count.
            for n in 0..2 * per_ring {
                assert!(callee.reply.flush(big_note(n, MIB)).await.is_ok());
            }
            settle(64).await;
            let kept = ring(&session).len();
            assert!(
                (per_ring - 1..=per_ring).contains(&kept),
                "{kept} events of 1 MiB kept"
            );
            assert!(session.st.borrow().ring_bytes <= SESSION_REPLAY_BYTES_MAX);
            // A live GET that takes nothing: what it has not taken stays, and the exit
            // waits once it holds the ring's bytes.
            let taken = {
                let mut st = session.st.borrow_mut();
                st.get_live = true;
                st.get_generation = 1;
                st.get_taken = st.next_seq - 1;
                st.get_taken
            };
            let exit = tokio::task::spawn_local(async move {
                for n in 0..2 * per_ring {
                    if callee.reply.flush(big_note(n, MIB)).await.is_err() {
                        break;
                    }
                }
                callee
            });
            settle(64).await;
            let held = ring(&session);
            let untaken = held.iter().filter(|seq| **seq > taken).count();
            assert!(
                (per_ring..=per_ring + 1).contains(&untaken),
                "{untaken} untaken events held"
            );
            assert_eq!(held.last().copied(), Some(taken + untaken as u64));
            assert!(session.get_behind());
            // The GET takes them: the ring drops the older ones and the exit goes on.
            {
                let mut st = session.st.borrow_mut();
                st.get_taken = st.next_seq - 1;
                st.trim_ring_bytes();
            }
            session.taken.notify_waiters();
            settle(64).await;
            assert!(session.st.borrow().next_seq - 1 > taken + untaken as u64);
            let _callee = exit.await.expect("the exit's task");
            close(&server, &session, "test over");
        });
    }

    #[test]
    fn a_closed_session_or_a_control_event_is_left_to_the_lifecycle_task() {
        run(async {
            let server = server();
            let (session, _callee) = session(&server);
            let list = Flush {
                id: None,
                event: Event::ListChanged(ListKind::Tools),
            };
            assert!(session.take(list.clone()).is_none());
            let resumable = Flush {
                id: None,
                event: Event::Resumable,
            };
            assert!(session.take(resumable).is_some());
            let request = Flush {
                id: None,
                event: Event::Request {
                    id: Bytes::from_static(b"1"),
                    method: Rc::from("ping"),
                    params: None,
                },
            };
            assert!(session.take(request).is_some());
            {
                let _busy = session.st.borrow_mut();
                assert!(session.take(list.clone()).is_some());
            }
            close(&server, &session, "test over");
            assert!(session.take(list).is_some());
        });
    }

    #[test]
    fn the_events_for_the_agent_are_those_rendered() {
        let events = [
            Event::ListChanged(ListKind::Prompts),
            Event::ResourcesUpdated {
                params: Bytes::from_static(b"{}"),
            },
            Event::Progress {
                params: Bytes::from_static(b"{}"),
            },
            Event::Notification {
                method: Rc::from("notifications/message"),
                params: None,
            },
            Event::Request {
                id: Bytes::from_static(b"7"),
                method: Rc::from("ping"),
                params: None,
            },
            Event::Resumable,
            Event::Suspend { retry_ms: 0 },
            Event::Handoff(Bytes::new()),
            Event::Recheck { seq: 1 },
            Event::Rechecked {
                seq: 1,
                handoff: Bytes::new(),
            },
            Event::Detach,
        ];
        for event in &events {
            assert_eq!(for_agent(event), render_event(event).is_some(), "{event:?}");
        }
    }

    /// A record too large to write fails the write, and the session's later touches are
    /// still tried (the write must not stay "in flight" for good).
    #[test]
    fn a_record_too_large_to_write_does_not_stop_later_touches() {
        run(async {
            let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
            // A touch interval of 100 ms.
            let server = server_with(Some(store), Duration::from_millis(400));
            let big = format!(
                r#"{{"routes":{{"a":"{}"}}}}"#,
                "h".repeat(SHARED_SESSION_RECORD_BYTES_MAX)
            );
            let link = Link::new(Bytes::from_static(b"{}"), Some(Bytes::from(big)), None);
            let (due, _) = shared::touch(&server, &link, Instant::now());
            assert!(due, "a record never written is due");
            let written = shared::write(
                &server,
                "s-1",
                "2025-11-25",
                &link,
                Instant::now(),
                Write::Create,
                false,
            )
            .await;
            assert_eq!(written, Written::Failed);
            // A route closed: the handoff fits again.
            link.set_handoff(Bytes::from_static(br#"{"routes":{}}"#));
            tokio::time::sleep(Duration::from_millis(150)).await;
            let (due, _) = shared::touch(&server, &link, Instant::now());
            assert!(
                due,
                "a touch is tried again an interval after the failed one"
            );
        });
    }

    /// A store whose watch table is full refuses a watch to every new shared session: one
    /// log line for all of them, not one each.
    #[test]
    fn refused_watches_are_logged_at_most_once_per_spacing() {
        run(async {
            let store = Arc::new(MemoryStore::default());
            let held: Vec<Watch> = (0..MEMORY_STORE_KEYS_MAX)
                .map(|n| store.watch(&format!("k{n}")))
                .collect::<Result<_, _>>()
                .expect("room for every watch");
            let server = server_with(Some(store.clone()), Duration::from_secs(600));
            let before = crate::log::lines_logged();
            let sessions: Vec<(Rc<Session>, Callee)> = (0..3)
                .map(|n| shared_session(&server, &format!("s-{n}")))
                .collect();
            let logged = crate::log::lines_logged() - before;
            assert!(logged <= 1, "{logged} lines for three refused watches");
            for (session, _) in &sessions {
                close(&server, session, "test over");
            }
            drop(held);
        });
    }

    /// Deletes of records that fail (the store is down) are counted each, logged once.
    #[test]
    fn failed_record_deletes_are_logged_at_most_once_per_spacing() {
        run(async {
            let store = Arc::new(Hooked::default());
            store.write_errors.store(3, Ordering::Release);
            let server = server_with(Some(store.clone()), Duration::from_secs(600));
            let before = crate::log::lines_logged();
            for n in 0..3 {
                shared::forget(&server, &format!("s-{n}"), None).await;
            }
            let logged = crate::log::lines_logged() - before;
            assert!(logged <= 1, "{logged} lines for three failed deletes");
        });
    }

    /// Node A's first write of a record went out but its answer came too late (A does not
    /// know it is there); node B took the session up and was sent `DELETE`. A's copy must
    /// end when its watch fires, and A's next write must not make the record again.
    #[test]
    fn a_record_whose_write_answered_late_is_not_made_again_after_a_delete() {
        run(async {
            let store = Arc::new(Hooked::default());
            let server = server_with(Some(store.clone()), Duration::from_secs(600));
            // The session's first write (its task's first touch) answers late.
            store.late_answers.store(1, Ordering::Release);
            let (session, _callee) = shared_session(&server, "s-1");
            settle(8).await;
            assert_eq!(store.late_answers.load(Ordering::Acquire), 0, "written");
            let key = shared::key("north", "s-1");
            assert!(store.inner.get_now(&key).is_some(), "the write landed");
            // Node B's DELETE (the same process stands for it: the record is all they share).
            assert_eq!(
                shared::forget(&server, "s-1", None).await,
                shared::Forgot::Done
            );
            settle(64).await;
            assert!(session.is_closed(), "node A lets go of its copy");
            let again = session.write_record(&server, Write::Create, false).await;
            assert_eq!(again, Written::Gone);
            assert!(store.inner.get_now(&key).is_none(), "the record came back");
        });
    }

    /// The session expires while its first record write is in flight: the expiry waits
    /// for the write to land, and then deletes the record it made. Decided before, it
    /// would find no record, delete nothing, and the write would leave one behind for an
    /// ended session.
    #[test]
    fn an_expiry_waits_out_its_own_record_write_in_flight() {
        run(async {
            let store = Arc::new(Hooked::default());
            let timeout = crate::store::testing::SLOW_WRITE / 3;
            let server = server_with(Some(store.clone()), timeout);
            store.slow_writes.store(1, Ordering::Release);
            let (session, _callee) = shared_session(&server, "s-slow");
            let key = shared::key("north", "s-slow");
            tokio::time::sleep(timeout * 2).await;
            assert!(
                store.inner.get_now(&key).is_none(),
                "the write is still slow"
            );
            tokio::time::sleep(crate::store::testing::SLOW_WRITE * 2).await;
            assert!(session.is_closed(), "expired");
            assert!(
                store.inner.get_now(&key).is_none(),
                "the record outlived its session"
            );
        });
    }

    /// A session this node took up from its record counts as recorded even when this
    /// node's own write of it failed: the record found gone later means it was deleted at
    /// another node, and the copy here ends (not kept on as never written).
    #[test]
    fn a_session_taken_up_whose_write_failed_still_ends_when_its_record_goes() {
        run(async {
            let store = Arc::new(Hooked::default());
            let server = server_with(Some(store.clone()), Duration::from_secs(600));
            // Node A's record.
            let a = Link::new(Bytes::from_static(b"{}"), None, None);
            let write = shared::write(
                &server,
                "s-up",
                "2025-11-25",
                &a,
                Instant::now(),
                Write::Create,
                false,
            );
            assert_eq!(write.await, Written::Done);
            // Node B takes it up; B's own write fails.
            let b = Link::new(Bytes::from_static(b"{}"), None, None);
            b.taken_up();
            store.write_errors.store(1, Ordering::Release);
            let (session, _callee) = opened_with(&server, "s-up", Some(b));
            settle(8).await;
            let link = session.shared.as_ref().expect("shared");
            assert!(!link.recorded(), "B's write failed");
            // Deleted at node A.
            let forgot = shared::forget(&server, "s-up", None).await;
            assert_eq!(forgot, shared::Forgot::Done);
            settle(64).await;
            assert!(
                session.is_closed(),
                "B's copy of a deleted session lives on"
            );
        });
    }

    /// A `DELETE` at this node whose tombstone the session's own watch sees (before the
    /// delete's answer, or instead of it when the answer was lost): the session ends with
    /// its upstream sessions, as a `DELETE` must, instead of being let go of as one
    /// deleted at another node.
    #[test]
    fn a_record_gone_after_a_delete_asked_here_ends_the_session_upstream_too() {
        run(async {
            let store = Arc::new(MemoryStore::default());
            let server = server_with(Some(store.clone()), Duration::from_secs(600));
            let detached = || server_metrics::with(|m| m.sessions_detached);
            for asked in [false, true] {
                let id = format!("s-asked-{asked}");
                let (session, _callee) = shared_session(&server, &id);
                settle(8).await;
                let link = session.shared.as_ref().expect("shared");
                assert!(link.recorded(), "the first touch wrote the record");
                if asked {
                    link.ask_delete();
                }
                let before = detached();
                // The tombstone lands; the delete's own answer is not waited for here.
                assert_eq!(
                    shared::forget(&server, &id, None).await,
                    shared::Forgot::Done
                );
                settle(64).await;
                assert!(session.is_closed(), "asked {asked}: the copy ends");
                let want = if asked { before } else { before + 1 };
                assert_eq!(
                    detached(),
                    want,
                    "asked {asked}: detached only if not asked here"
                );
            }
        });
    }

    /// Node A found a session idle and decided to end it; meanwhile node C took it up and
    /// wrote the record. A's delete must not remove C's record.
    #[test]
    fn an_expiry_does_not_remove_a_record_written_after_it_was_read() {
        run(async {
            let store = Arc::new(MemoryStore::default());
            let server = server_with(Some(store.clone()), Duration::from_secs(600));
            let link = Link::new(Bytes::from_static(b"{}"), None, None);
            let old = Instant::now();
            let write = |how| shared::write(&server, "s-2", "2025-11-25", &link, old, how, false);
            assert_eq!(write(Write::Create).await, Written::Done);
            let (decided, read) = shared::at_expiry(&server, "s-2").await;
            assert_eq!(decided, Ending::End, "this node wrote it last");
            // Node C's write (same process: the record is all they share).
            assert_eq!(write(Write::Update).await, Written::Done);
            let forgot = shared::forget(&server, "s-2", read).await;
            assert_eq!(forgot, shared::Forgot::Moved);
            assert!(
                store.get_now(&shared::key("north", "s-2")).is_some(),
                "the record C wrote was removed"
            );
            // Without another write, the same decision deletes it.
            let (decided, read) = shared::at_expiry(&server, "s-2").await;
            assert_eq!(decided, Ending::End);
            assert_eq!(
                shared::forget(&server, "s-2", read).await,
                shared::Forgot::Done
            );
            assert!(store.get_now(&shared::key("north", "s-2")).is_none());
        });
    }
}
