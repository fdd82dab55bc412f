//! Upstream sessions: one per lifecycle stream.
//!
//! The lifecycle task ([`serve`]) initializes the upstream, answers the caller with the
//! session's id and the upstream's capabilities, then relays until the caller ends the
//! lifecycle: events of the upstream GET stream (FLUSH), the agent's answers to
//! server-to-client requests (POSTed upstream), and the caller's resume challenges (which
//! open the upstream GET stream once). It is the only task that sends on the lifecycle
//! reply: the GET task ([`events_task`]) queues into a bounded outbox and stops reading
//! the upstream while the outbox is full, so nothing is dropped.
//!
//! When the upstream forgets the session (404), [`reinitialize`] runs `initialize` again,
//! once for all requests that saw the same session.
//!
//! Shared sessions (a server with `sessions: { store }`): the reply's handoff is the
//! upstream's session id, protocol version and capabilities ([`Handoff`]). Another node
//! takes the session up from it without an `initialize`; a handoff that does not check
//! out opens a fresh upstream session instead. A lifecycle ended by [`Event::Detach`] lets
//! the upstream session be (no `DELETE`): another node goes on with it.

use super::exchange::{self, BodyKind, Messages, Upward};
use super::{Client, Outgoing, PROTOCOL_VERSION, UpErr};
use crate::binding::client::metrics as client_metrics;
use crate::jsonrpc;
use crate::limits::{
    EXIT_EVENT_ID_BYTES_MAX, SESSIONS_PER_WORKER_MAX, UPSTREAM_OUTBOX_EVENTS_MAX,
    UPSTREAM_RETRY_DEFAULT, UPSTREAM_RETRY_MAX, UPSTREAM_RETRY_MIN, UPSTREAM_STREAM_WORKED_MIN,
};
use crate::log;
use crate::metrics;
use crate::runtime::held::Held;
use crate::runtime::notify::Notify;
use crate::stream::{Callee, Caps, Challenge, Event, Flush, Frame, ReplyBegin, Throttle};
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::cell::{Cell, Ref, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Longest upstream `MCP-Session-Id` accepted (the spec allows visible ASCII of any length;
/// ours are 48 bytes, common ones are UUIDs).
const UPSTREAM_SESSION_ID_BYTES_MAX: usize = 256;

/// What the upstream said about the session: sent on every later request.
#[derive(Clone, Debug, Default)]
pub struct Ids {
    /// The upstream's `MCP-Session-Id`, if it gave one.
    pub session: Option<Bytes>,
    /// The negotiated protocol version (after initialize).
    pub version: Option<Bytes>,
    /// Bumped by every (re)initialize: a 404 seen under an older generation needs none.
    pub generation: u64,
}

/// Whether the upstream has a GET event stream for this session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Events {
    /// Not asked yet (no agent opened a GET stream).
    NotAsked,
    /// The GET task is connecting.
    Connecting,
    /// The upstream GET stream is open.
    Live,
    /// The upstream answered 405: it has none.
    Unsupported,
}

/// One upstream session.
pub struct UpSession {
    /// The id the caller uses in request `Begin`s.
    pub id: Rc<str>,
    /// The agent's raw `capabilities`, sent in every `initialize`.
    capabilities: Bytes,
    /// The `Authorization` value to send upstream (never logged); in `forward` mode the
    /// agent's latest header, renewed by each request that carries one.
    pub authorization: RefCell<Option<Bytes>>,
    ids: RefCell<Ids>,
    /// The next upstream JSON-RPC id (`initialize` is 1).
    next_rpc: Cell<u64>,
    /// Serializes re-initialization.
    renewing: tokio::sync::Mutex<()>,
    /// The last re-initialize that failed: the generation it was to replace, and when. The
    /// requests that queued behind it for the same generation fail with it, for
    /// [`UPSTREAM_RETRY_DEFAULT`], instead of each trying one more `initialize` in turn.
    renew_failed: Cell<Option<(u64, Instant)>>,
    closed: Cell<bool>,
    /// Woken when the session closes (the GET task stops).
    closing: Notify,
    events: Cell<Events>,
    /// Events from the GET task for the lifecycle task. Invariant:
    /// `len() <= UPSTREAM_OUTBOX_EVENTS_MAX`.
    outbox: RefCell<VecDeque<Flush>>,
    outbox_ready: Notify,
    outbox_room: Notify,
    /// The last upstream event id seen on the GET stream (resume point).
    last_event: RefCell<Option<Rc<str>>>,
    /// The caller asked to resume from an earlier event id: the GET task drops its stream
    /// and reopens it at once from `last_event`.
    restart: Cell<bool>,
    restarting: Notify,
    /// The fixed part of this session's POST heads, as last written (see
    /// [`UpSession::post_head`]).
    head: RefCell<Option<HeadTemplate>>,
    /// What the upstream serves, as its latest `initialize` said (for the handoff).
    caps: Cell<Caps>,
}

/// A session's POST head up to its framing: everything but `content-length` and the empty
/// line, with the values it was made from (it is made again when one changes).
struct HeadTemplate {
    session: Option<Bytes>,
    version: Option<Bytes>,
    accept: &'static [u8],
    authorization: Option<Bytes>,
    fixed: Bytes,
}

impl UpSession {
    /// A session not yet initialized upstream.
    fn new(id: Rc<str>, capabilities: Bytes, authorization: Option<Bytes>) -> UpSession {
        UpSession {
            id,
            capabilities,
            authorization: RefCell::new(authorization),
            ids: RefCell::new(Ids::default()),
            next_rpc: Cell::new(1),
            renewing: tokio::sync::Mutex::new(()),
            renew_failed: Cell::new(None),
            closed: Cell::new(false),
            closing: Notify::new(),
            events: Cell::new(Events::NotAsked),
            outbox: RefCell::new(VecDeque::new()),
            outbox_ready: Notify::new(),
            outbox_room: Notify::new(),
            last_event: RefCell::new(None),
            restart: Cell::new(false),
            restarting: Notify::new(),
            head: RefCell::new(None),
            caps: Cell::new(Caps::empty()),
        }
    }

    /// Writes the head of a POST of `body_len` bytes on this session: the fixed part from
    /// the session's template (made by `make`, which writes the whole head without
    /// framing, when there is none yet or a value in it changed), then `content-length`.
    /// The head is byte for byte what `make` with the length would write; only the
    /// length is formatted per request.
    pub fn post_head<E>(
        &self,
        accept: &'static [u8],
        body_len: u64,
        out: &mut BytesMut,
        make: impl FnOnce(&mut BytesMut) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut template = self.head.borrow_mut();
        let current = {
            let ids = self.ids.borrow();
            let authorization = self.authorization.borrow();
            template.as_ref().is_some_and(|t| {
                t.session == ids.session
                    && t.version == ids.version
                    && t.accept == accept
                    && t.authorization == *authorization
            })
        };
        if !current {
            let mut fixed = BytesMut::with_capacity(256);
            make(&mut fixed)?;
            // `make` ended the head with its empty line; the template stops before it.
            assert!(fixed.ends_with(b"\r\n\r\n"));
            fixed.truncate(fixed.len() - 2);
            let ids = self.ids.borrow();
            *template = Some(HeadTemplate {
                session: ids.session.clone(),
                version: ids.version.clone(),
                accept,
                authorization: self.authorization.borrow().clone(),
                fixed: fixed.freeze(),
            });
        }
        if let Some(t) = template.as_ref() {
            out.put_slice(&t.fixed);
            crate::http::put_content_length(body_len, out);
        }
        Ok(())
    }

    /// The upstream ids, for a request head.
    pub fn ids(&self) -> Ref<'_, Ids> {
        self.ids.borrow()
    }

    /// A fresh upstream JSON-RPC id.
    pub fn next_rpc_id(&self) -> u64 {
        let id = self.next_rpc.get();
        self.next_rpc.set(id + 1);
        id
    }

    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Resolves when the session closes.
    pub async fn closed(&self) {
        loop {
            let notified = self.closing.notified();
            if self.closed.get() {
                return;
            }
            notified.await;
        }
    }

    fn close(&self) {
        self.closed.set(true);
        self.closing.notify_waiters();
        self.outbox_room.notify_waiters();
    }

    /// Queues an event for the lifecycle reply, waiting for room; false if the session
    /// closed first. An `upstream` event read from the GET stream is dropped instead once a
    /// restart was asked (the restart cleared the outbox, and the replay brings the event
    /// again).
    async fn post(&self, flush: Flush, upstream: bool) -> bool {
        loop {
            let room = self.outbox_room.notified();
            if self.closed.get() {
                return false;
            }
            if upstream && self.restart.get() {
                return true;
            }
            {
                let mut outbox = self.outbox.borrow_mut();
                if outbox.len() < UPSTREAM_OUTBOX_EVENTS_MAX {
                    outbox.push_back(flush);
                    drop(outbox);
                    self.outbox_ready.notify_one();
                    return true;
                }
            }
            room.await;
        }
    }

    /// Queues an event without waiting (control events, when there is room).
    fn post_now(&self, flush: Flush) {
        let mut outbox = self.outbox.borrow_mut();
        if outbox.len() < UPSTREAM_OUTBOX_EVENTS_MAX {
            outbox.push_back(flush);
            drop(outbox);
            self.outbox_ready.notify_one();
        }
    }

    fn take(&self) -> Option<Flush> {
        let mut outbox = self.outbox.borrow_mut();
        let flush = outbox.pop_front();
        if outbox.is_empty() && outbox.capacity() > 0 {
            // Events come rarely on most sessions: an empty outbox keeps no allocation.
            *outbox = VecDeque::new();
        }
        drop(outbox);
        if flush.is_some() {
            self.outbox_room.notify_waiters();
        }
        flush
    }
}

/// Keeps a session in its client's table while the lifecycle task runs.
struct Registration {
    client: Rc<Client>,
    id: Rc<str>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.client.sessions.borrow_mut().remove(&*self.id);
        client_metrics::with(|m| m.sessions -= 1);
    }
}

/// Serves one lifecycle stream from `initialize` to `DELETE`.
pub async fn serve(client: Rc<Client>, callee: Callee) {
    let fail = |err: UpErr| {
        callee
            .initial
            .reset(err.into_reset(client.authorization.as_ref()));
        callee.reply.abort();
    };
    let Some(hello) = callee.begin.client.as_ref() else {
        return fail(UpErr::Rpc(exchange::upstream_error(
            "Lifecycle stream without the agent's hello",
        )));
    };
    let open = client.sessions.borrow().len();
    let Some(opening) = Held::take(&client.opening, open, SESSIONS_PER_WORKER_MAX) else {
        metrics::with(|m| m.overload_rejections += 1);
        return fail(UpErr::Rpc(exchange::upstream_error(
            "Too many upstream sessions",
        )));
    };
    let authorization = match &client.authorization {
        None => None,
        Some(crate::config::ClientAuth::Forward) => hello.authorization.clone(),
        Some(crate::config::ClientAuth::Bearer(secret)) => Some(secret.bearer_header()),
    };
    let session = Rc::new(UpSession::new(
        client.mint_session_id(),
        hello.capabilities.clone(),
        authorization,
    ));
    let adopted = hello
        .adopt
        .as_deref()
        .and_then(|raw| match Handoff::read(raw) {
            Ok(handoff) => Some(handoff),
            Err(why) => {
                log::warn(format_args!(
                    "client {}: a shared session's handoff was not taken up ({why}); \
                 opening a fresh upstream session",
                    client.name
                ));
                None
            }
        });
    // This task lives as long as the session, in `relay`: the larger futures of its
    // beginning and end (initialize, the reply's BEGIN, DELETE) are boxed so that its
    // task cell is sized for the relay alone.
    let adopted_here = adopted.is_some();
    let init = match adopted {
        Some(handoff) => {
            let mut ids = session.ids.borrow_mut();
            ids.session = handoff.session;
            ids.version = Some(handoff.version);
            ids.generation += 1;
            client_metrics::with(|m| m.adopted += 1);
            session.caps.set(handoff.caps);
            Initialized {
                caps: handoff.caps,
                instructions: None,
            }
        }
        None => match Box::pin(initialize(&client, &session)).await {
            Ok(init) => {
                client_metrics::with(|m| m.initializes += 1);
                init
            }
            Err(e) => {
                client_metrics::with(|m| m.initialize_failures += 1);
                return fail(e);
            }
        },
    };
    client
        .sessions
        .borrow_mut()
        .insert(session.id.clone(), session.clone());
    drop(opening);
    client_metrics::with(|m| m.sessions += 1);
    let _registration = Registration {
        client: client.clone(),
        id: session.id.clone(),
    };
    let begin = ReplyBegin {
        session: Some(session.id.clone()),
        handoff: Handoff::write(&session.ids.borrow(), init.caps),
        // Methods mcpyard does not know are forwarded as they are.
        caps: init.caps.union(Caps::OTHER),
        instructions: init.instructions,
    };
    let mut ended = Ended::Gone;
    if Box::pin(callee.reply.begin(begin)).await.is_ok() {
        ended = relay(&client, &session, &callee).await;
    }
    session.close();
    callee.reply.end();
    // A session taken up from another node's handoff may be in use there: it is deleted
    // upstream only when its caller says so, never because the caller went away.
    if ended == Ended::End || (ended == Ended::Gone && !adopted_here) {
        Box::pin(terminate(&client, &session)).await;
    }
}

/// What another node needs to go on with an upstream session: its id, the negotiated
/// version and what the upstream serves (as `initialize` told).
struct Handoff {
    session: Option<Bytes>,
    version: Bytes,
    caps: Caps,
}

/// A handoff as written (JSON).
#[derive(Serialize, Deserialize)]
struct HandoffJson<'a> {
    #[serde(borrow)]
    session: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow)]
    version: std::borrow::Cow<'a, str>,
    caps: u16,
}

impl Handoff {
    /// The handoff of a session with `ids`; `None` before it has a version.
    fn write(ids: &Ids, caps: Caps) -> Option<Bytes> {
        let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
        let json = HandoffJson {
            session: ids.session.as_ref().map(|s| text(s).into()),
            version: text(ids.version.as_ref()?).into(),
            caps: caps.0,
        };
        serde_json::to_vec(&json).ok().map(Bytes::from)
    }

    /// Reads a handoff back, checked as an upstream's answer is: the id must be a valid
    /// `MCP-Session-Id` and the version a valid protocol version (both go into heads).
    fn read(raw: &[u8]) -> Result<Handoff, &'static str> {
        let json: HandoffJson<'_> =
            serde_json::from_slice(raw).map_err(|_| "not a client handoff")?;
        let session = match json.session {
            Some(id) if valid_session_id(id.as_bytes()) => Some(Bytes::from(id.into_owned())),
            Some(_) => return Err("an invalid upstream session id"),
            None => None,
        };
        if !valid_version(&json.version) {
            return Err("an invalid protocol version");
        }
        Ok(Handoff {
            session,
            version: Bytes::from(json.version.into_owned()),
            caps: Caps(json.caps),
        })
    }
}

/// How a lifecycle ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// The caller ended it (END or ABORT): the session ends upstream.
    End,
    /// The caller detached: the session lives on at another node.
    Detach,
    /// The caller went away without a word.
    Gone,
}

/// Relays events and challenges until the caller ends the lifecycle.
async fn relay(client: &Rc<Client>, session: &Rc<UpSession>, callee: &Callee) -> Ended {
    loop {
        while let Some(flush) = session.take() {
            // Boxed: larger than the wait below, where the relay spends its life.
            if Box::pin(callee.reply.flush(flush)).await.is_err() {
                return Ended::Gone;
            }
        }
        // Biased, the caller's initial direction first: a caller that detaches sends
        // DETACH and goes away at once, and its going away must not be seen first.
        tokio::select! {
            biased;
            frame = callee.initial.next() => match frame {
                Some(Frame::Data(piece)) => callee.initial.ack(piece.len() as u32),
                Some(Frame::Flush(Flush { event: Event::Detach, .. })) => return Ended::Detach,
                Some(Frame::Flush(Flush { event: Event::Notification { method, params }, .. })) => {
                    // The agent's own notifications (roots/list_changed, ...) go upstream.
                    let mut body = BytesMut::with_capacity(64);
                    jsonrpc::write_notification(&method, params.as_deref(), &mut body);
                    let (client, session) = (client.clone(), session.clone());
                    tokio::task::spawn_local(async move {
                        if let Err(e) = client.call(&session, body.freeze(), None).await {
                            log::warn(format_args!(
                                "client {}: relaying a notification upstream failed: {}",
                                client.name,
                                describe(e)
                            ));
                        }
                    });
                }
                Some(Frame::Begin(_) | Frame::Flush(_)) => {}
                Some(Frame::End | Frame::Abort) => return Ended::End,
                None => return Ended::Gone,
            },
            throttle = callee.reply.throttle() => match throttle {
                Some(Throttle::Challenge(Challenge::Resume { last_event_id })) => {
                    resume(client, session, last_event_id)
                }
                Some(Throttle::Challenge(Challenge::Answer { id, result, error })) => {
                    tokio::task::spawn_local(answer(
                        client.clone(),
                        session.clone(),
                        id,
                        result,
                        error,
                    ));
                }
                // The agent's GET went away: the upstream stream stays open, so events
                // meanwhile reach the agent's next GET through the server's replay.
                Some(Throttle::Challenge(Challenge::Suspended)) => {}
                Some(Throttle::Reset(_)) | None => return Ended::Gone,
            },
            () = session.outbox_ready.notified() => {}
        }
    }
}

/// The agent opened (or reopened) its GET stream. With an upstream event id, the events
/// after it are wanted: the upstream replays them on a GET with that `Last-Event-ID`, and
/// what this session had queued from the old stream is dropped (the replay repeats it).
/// The answer (resumable or suspend) comes after every event of the old flow.
fn resume(client: &Rc<Client>, session: &Rc<UpSession>, from: Option<Rc<str>>) {
    let behind = from
        .as_ref()
        .is_some_and(|id| session.last_event.borrow().as_ref() != Some(id));
    if from.as_deref().is_some_and(|id| !resendable(id)) {
        // Not an id this session could have handed out (too long, or one that would not
        // read back unchanged in the `Last-Event-ID` header): resume from where it is.
        return resume(client, session, None);
    }
    match session.events.get() {
        Events::NotAsked => {
            if behind {
                *session.last_event.borrow_mut() = from;
            }
            session.events.set(Events::Connecting);
            tokio::task::spawn_local(events_task(client.clone(), session.clone()));
        }
        Events::Connecting => {
            // The GET task will say; its next attempt starts from the id asked for.
            if behind {
                *session.last_event.borrow_mut() = from;
            }
        }
        Events::Live if behind => {
            *session.last_event.borrow_mut() = from;
            session.outbox.borrow_mut().clear();
            session.outbox_room.notify_waiters();
            session.restart.set(true);
            session.restarting.notify_waiters();
        }
        Events::Live => session.post_now(Flush {
            id: None,
            event: Event::Resumable,
        }),
        Events::Unsupported => session.post_now(Flush {
            id: None,
            event: Event::Suspend { retry_ms: -1 },
        }),
    }
}

/// What `initialize` told us.
struct Initialized {
    caps: Caps,
    instructions: Option<Bytes>,
}

/// The members of an `InitializeResult` we use.
#[derive(Deserialize)]
struct InitializeResult<'a> {
    /// A `Cow`, so a version written with JSON escapes still reads (and is then judged by
    /// [`valid_version`], not refused as malformed JSON).
    #[serde(rename = "protocolVersion", borrow)]
    protocol_version: std::borrow::Cow<'a, str>,
    #[serde(default)]
    capabilities: ServerCapabilities,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct ServerCapabilities {
    tools: Option<ListCap>,
    prompts: Option<ListCap>,
    resources: Option<ResourcesCap>,
    logging: Option<serde::de::IgnoredAny>,
    completions: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize, Default)]
struct ListCap {
    #[serde(rename = "listChanged", default)]
    list_changed: bool,
}

#[derive(Deserialize, Default)]
struct ResourcesCap {
    #[serde(default)]
    subscribe: bool,
    #[serde(rename = "listChanged", default)]
    list_changed: bool,
}

impl ServerCapabilities {
    fn bits(&self) -> Caps {
        let mut caps = Caps::empty();
        let mut set = |on: bool, bit: Caps| {
            if on {
                caps = caps.union(bit);
            }
        };
        set(self.tools.is_some(), Caps::TOOLS);
        set(
            self.tools.as_ref().is_some_and(|t| t.list_changed),
            Caps::TOOLS_LIST_CHANGED,
        );
        set(self.prompts.is_some(), Caps::PROMPTS);
        set(
            self.prompts.as_ref().is_some_and(|p| p.list_changed),
            Caps::PROMPTS_LIST_CHANGED,
        );
        set(self.resources.is_some(), Caps::RESOURCES);
        set(
            self.resources.as_ref().is_some_and(|r| r.subscribe),
            Caps::RESOURCES_SUBSCRIBE,
        );
        set(
            self.resources.as_ref().is_some_and(|r| r.list_changed),
            Caps::RESOURCES_LIST_CHANGED,
        );
        set(self.logging.is_some(), Caps::LOGGING);
        set(self.completions.is_some(), Caps::COMPLETIONS);
        caps
    }
}

/// Runs `initialize` and `notifications/initialized` upstream and records the session's
/// ids (bumping their generation).
async fn initialize(client: &Client, session: &UpSession) -> Result<Initialized, UpErr> {
    let id = session.next_rpc_id().to_string();
    let mut body = BytesMut::with_capacity(192 + session.capabilities.len());
    body.put_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    body.put_slice(id.as_bytes());
    body.put_slice(b",\"method\":\"initialize\",\"params\":{\"protocolVersion\":\"");
    body.put_slice(PROTOCOL_VERSION.as_bytes());
    body.put_slice(b"\",\"capabilities\":");
    body.put_slice(&session.capabilities);
    body.put_slice(b",\"clientInfo\":{\"name\":\"");
    body.put_slice(super::CLIENT_NAME.as_bytes());
    body.put_slice(b"\",\"version\":\"");
    body.put_slice(env!("CARGO_PKG_VERSION").as_bytes());
    body.put_slice(b"\"}}}");
    let body = body.freeze();
    // The initialize request carries no session headers, but the session's ids stay as
    // they are until it succeeds: a request sent meanwhile names the old upstream session,
    // gets its 404 and waits for this re-initialize (or, if this one fails, tries one of
    // its own), where one sent without an id would get a 400 that nothing renews.
    let req = Outgoing {
        initialize: true,
        ..Outgoing::post(Some(session), body.len())
    };
    let super::Answered { response, head } = client.send(&req, &[body]).await?;
    match super::check_status(&head) {
        Ok(()) => {}
        Err(UpErr::SessionGone) => return Err(UpErr::Status(404)),
        Err(e) => return Err(e),
    }
    let upstream_id = match head.headers.get("mcp-session-id") {
        None => None,
        Some(v) if valid_session_id(v) => Some(Bytes::copy_from_slice(v)),
        Some(_) => {
            return Err(UpErr::Rpc(exchange::upstream_error(
                "Upstream sent an invalid MCP-Session-Id",
            )));
        }
    };
    // With an id to expect, `read_answer` fails rather than answer without a result.
    let result = client
        .read_answer(response, &head, Some(&id))
        .await?
        .unwrap_or_default();
    let parsed: InitializeResult<'_> = std::str::from_utf8(&result)
        .ok()
        .and_then(|text| serde_json::from_str(text).ok())
        .ok_or_else(|| {
            UpErr::Rpc(exchange::upstream_error(
                "Upstream sent a malformed initialize result",
            ))
        })?;
    if !valid_version(&parsed.protocol_version) {
        return Err(UpErr::Rpc(exchange::upstream_error(
            "Upstream sent an invalid protocolVersion",
        )));
    }
    let version = Bytes::copy_from_slice(parsed.protocol_version.as_bytes());
    let caps = parsed.capabilities.bits();
    session.caps.set(caps);
    let instructions = parsed
        .instructions
        .filter(|raw| raw.get().starts_with('"'))
        .map(|raw| result.slice_ref(raw.get().as_bytes()));
    {
        let mut ids = session.ids.borrow_mut();
        ids.session = upstream_id;
        ids.version = Some(version);
        ids.generation += 1;
    }
    let mut note = BytesMut::with_capacity(64);
    jsonrpc::write_notification("notifications/initialized", None, &mut note);
    client.call(session, note.freeze(), None).await?;
    Ok(Initialized { caps, instructions })
}

/// True for an upstream event id this session may resume from: at most
/// [`EXIT_EVENT_ID_BYTES_MAX`] bytes, read back unchanged from a `Last-Event-ID` header,
/// and without U+FFFD: the event stream decoder puts that in place of bytes that are not
/// UTF-8, so such an id may not be the one the upstream sent.
pub(super) fn resendable(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= EXIT_EVENT_ID_BYTES_MAX
        && crate::http::field_value_round_trips(id.as_bytes())
        && !id.contains(char::REPLACEMENT_CHARACTER)
}

/// A protocol version we may send back in `MCP-Protocol-Version`: MCP's are dates
/// (`2025-11-25`); anything of letters, digits, `-`, `.` and `_` up to 32 bytes passes, so
/// an upstream on a newer scheme still works, and nothing can break the header.
fn valid_version(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 32
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// MCP: a session id is visible ASCII (0x21..=0x7E).
fn valid_session_id(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= UPSTREAM_SESSION_ID_BYTES_MAX
        && v.iter().all(|b| (0x21..=0x7e).contains(b))
}

/// [`reinitialize`] in a task of its own, for a request's caller to wait on: a caller that
/// goes (its deadline, a cancel) stops waiting, but never cuts a renewal short between the
/// upstream's `initialize` and `notifications/initialized` (which would leave an upstream
/// session that refuses requests until it is not initialized, or one never used).
pub fn renew(
    client: &Rc<Client>,
    session: &Rc<UpSession>,
    generation: u64,
) -> tokio::task::JoinHandle<bool> {
    let (client, session) = (client.clone(), session.clone());
    tokio::task::spawn_local(async move { reinitialize(&client, &session, generation).await })
}

/// Re-initializes the upstream session after a 404 seen under `generation`, unless
/// another request already did. True if the session has fresh ids.
pub async fn reinitialize(client: &Client, session: &UpSession, generation: u64) -> bool {
    let _turn = session.renewing.lock().await;
    if session.ids.borrow().generation != generation {
        return true;
    }
    if session.closed.get() {
        return false;
    }
    if let Some((failed, at)) = session.renew_failed.get()
        && failed == generation
        && at.elapsed() < UPSTREAM_RETRY_DEFAULT
    {
        return false;
    }
    client_metrics::with(|m| m.reinitialized += 1);
    match initialize(client, session).await {
        Ok(_) if session.closed.get() => {
            // The session ended while it was renewed (its DELETE went for the old ids):
            // the new upstream session would be left open, so it is ended too.
            Box::pin(terminate(client, session)).await;
            false
        }
        Ok(_) => {
            // A shared session's record must name the new upstream session, or another
            // node taking it up would find the old one gone and open one more.
            if let Some(handoff) = Handoff::write(&session.ids.borrow(), session.caps.get()) {
                session.post_now(Flush {
                    id: None,
                    event: Event::Handoff(handoff),
                });
            }
            true
        }
        Err(e) => {
            session.renew_failed.set(Some((generation, Instant::now())));
            log::warn(format_args!(
                "client {}: re-initializing the upstream session failed: {}",
                client.name,
                describe(e)
            ));
            false
        }
    }
}

fn describe(e: UpErr) -> String {
    match e.into_reset(None) {
        crate::stream::Reset::Error { message, .. } => log::field(message.as_bytes()),
        crate::stream::Reset::Bearer(c) => format!("bearer challenge ({})", c.status),
        crate::stream::Reset::Plain => "gone".to_owned(),
    }
}

/// POSTs the agent's answer to a server-to-client request upstream.
async fn answer(
    client: Rc<Client>,
    session: Rc<UpSession>,
    id: Bytes,
    result: Option<Bytes>,
    error: Option<Bytes>,
) {
    let body = answer_body(&id, result.as_deref(), error.as_deref());
    if let Err(e) = client.call(&session, body, None).await {
        log::warn(format_args!(
            "client {}: relaying an answer upstream failed: {}",
            client.name,
            describe(e)
        ));
    }
}

/// `{"jsonrpc":"2.0","id":<id>,"result":<result>}` (or `"error":<error>`).
pub fn answer_body(id: &[u8], result: Option<&[u8]>, error: Option<&[u8]>) -> Bytes {
    let mut body = BytesMut::with_capacity(48 + id.len() + result.map_or(0, <[u8]>::len));
    body.put_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    body.put_slice(id);
    match (result, error) {
        (_, Some(error)) => {
            body.put_slice(b",\"error\":");
            body.put_slice(error);
        }
        (Some(result), None) => {
            body.put_slice(b",\"result\":");
            body.put_slice(result);
        }
        (None, None) => body.put_slice(b",\"result\":{}"),
    }
    body.put_slice(b"}");
    body.freeze()
}

/// Sends `DELETE` for the upstream session (MCP: the client should; 405 means the
/// upstream does not let clients end sessions, which is fine).
async fn terminate(client: &Client, session: &UpSession) {
    if session.ids.borrow().session.is_none() {
        return;
    }
    let req = Outgoing {
        method: "DELETE",
        session: Some(session),
        body_len: None,
        accept: b"application/json, text/event-stream",
        last_event_id: None,
        initialize: false,
    };
    match client.send(&req, &[]).await {
        Ok(super::Answered { mut response, head }) => {
            if super::drain(&mut response, client.response_timeout)
                .await
                .is_ok()
            {
                client.finish(response, &head);
            }
        }
        Err(e) => log::warn(format_args!(
            "client {}: DELETE of the upstream session failed: {}",
            client.name,
            describe(e)
        )),
    }
}

/// Doublings of the reconnect wait after failed attempts (2^5 × 1 s passes the cap anyway).
const RETRY_DOUBLINGS_MAX: u32 = 5;

/// Keeps the upstream GET event stream open for the session's life, relaying its events
/// and reconnecting (with `Last-Event-ID`, after the upstream's `retry:`) when it breaks.
async fn events_task(client: Rc<Client>, session: Rc<UpSession>) {
    // The upstream's `retry:` (or the default) after a stream that ran; doubled per failed
    // attempt in a row, up to UPSTREAM_RETRY_MAX, so a broken upstream is not hammered.
    let mut retry = UPSTREAM_RETRY_DEFAULT;
    let mut failures: u32 = 0;
    let mut announced = false;
    // The last attempt re-initialized after its GET got 404: a second 404 in a row is an
    // upstream that answers every GET so (it has no stream for anyone), not a forgotten
    // session, and is waited out like any failure instead of renewed again at once.
    let mut renewed = false;
    while !session.closed.get() {
        let generation = session.ids.borrow().generation;
        // Boxed, as is re-initializing: both are far larger than following the stream,
        // where this task spends its life (once per session with a GET stream).
        let resumed_from = session.last_event.borrow().clone();
        // This attempt starts from the latest point asked for: a restart asked while no
        // stream was followed (during the wait below) is served by it, not left to end
        // the new stream at once and drop its resume point.
        session.restart.set(false);
        let mut opened = Box::pin(open_events(&client, &session)).await;
        // Matched by reference: moving the response out would keep a second copy of it
        // in this task's state for as long as the stream is followed.
        match &mut opened {
            Opened::Closed => return,
            Opened::Failed => failures += 1,
            Opened::Stream {
                status: 200,
                kind: BodyKind::Sse,
                response,
            } => {
                renewed = false;
                response.lease.link.wire().set_event_stream();
                session.events.set(Events::Live);
                announced = true;
                let live = Flush {
                    id: None,
                    event: Event::Resumable,
                };
                if !Box::pin(session.post(live, false)).await {
                    return;
                }
                let started = Instant::now();
                let followed = follow(&session, response).await;
                if let Some(asked) = followed.retry {
                    retry = asked;
                }
                // A stream that ends at once with nothing is no better than a refusal: an
                // upstream that does so every time is waited out with backoff, not
                // reconnected to at `retry:` forever.
                if followed.seen || started.elapsed() >= UPSTREAM_STREAM_WORKED_MIN {
                    failures = 0;
                } else {
                    failures += 1;
                }
                if !followed.seen && resumed_from.is_some() {
                    // An upstream that does not know the id ends such a stream at once
                    // (nothing to replay, nothing live): start afresh next time.
                    let mut last = session.last_event.borrow_mut();
                    if *last == resumed_from {
                        *last = None;
                    }
                }
                if session.restart.replace(false) {
                    // The caller wants an earlier point: reopen at once from it.
                    continue;
                }
                // The stream ended (or broke): reconnect after `retry`.
            }
            Opened::Stream { status: 405, .. } => {
                session.events.set(Events::Unsupported);
                session.post_now(Flush {
                    id: None,
                    event: Event::Suspend { retry_ms: -1 },
                });
                return;
            }
            Opened::Stream { status: 404, .. }
                if session.ids.borrow().session.is_some() && !renewed =>
            {
                if Box::pin(reinitialize(&client, &session, generation)).await {
                    renewed = true;
                    continue;
                }
                // The upstream forgot the session and could not open a new one yet (it
                // is restarting, say): a failed attempt like any other, tried again after
                // the backoff. Giving up here would leave the session without events,
                // its notifications (list changes among them) lost for good.
                failures += 1;
            }
            Opened::Stream { status, .. } => {
                failures += 1;
                renewed = false;
                log::warn(format_args!(
                    "client {}: upstream GET stream answered {status}",
                    client.name
                ));
            }
        }
        drop(opened);
        let wait = retry
            .saturating_mul(1 << failures.min(RETRY_DOUBLINGS_MAX))
            .min(UPSTREAM_RETRY_MAX);
        if !announced {
            // Let the agent's GET be served meanwhile; events follow once connected.
            announced = true;
            session.events.set(Events::Connecting);
            session.post_now(Flush {
                id: None,
                event: Event::Suspend {
                    retry_ms: wait.as_millis() as i64,
                },
            });
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = session.closed() => return,
        }
    }
}

/// What asking the upstream for its event stream gave.
enum Opened {
    /// The session closed first.
    Closed,
    /// The request failed (logged).
    Failed,
    /// A response head arrived (any status); only what the task needs of the head is kept.
    Stream {
        status: u16,
        kind: BodyKind,
        response: exchange::Response,
    },
}

/// Sends the GET that opens the upstream event stream (resuming after the last event
/// seen) and waits for its head.
async fn open_events(client: &Client, session: &UpSession) -> Opened {
    let last = session.last_event.borrow().clone();
    let req = Outgoing {
        method: "GET",
        session: Some(session),
        body_len: None,
        accept: b"text/event-stream",
        last_event_id: last.as_deref().map(str::as_bytes),
        initialize: false,
    };
    let sent = tokio::select! {
        r = client.send(&req, &[]) => r,
        () = session.closed() => return Opened::Closed,
    };
    match sent {
        Ok(super::Answered { response, head }) => Opened::Stream {
            status: head.status,
            kind: BodyKind::of(&head),
            response,
        },
        Err(e) => {
            log::warn(format_args!(
                "client {}: upstream GET stream failed: {}",
                client.name,
                describe(e)
            ));
            Opened::Failed
        }
    }
}

/// How a followed GET stream went.
struct Followed {
    /// The upstream's last `retry:`.
    retry: Option<Duration>,
    /// Some event (a priming one counts) arrived before the stream ended.
    seen: bool,
}

/// Relays one open GET stream until it ends.
async fn follow(session: &UpSession, response: &mut exchange::Response) -> Followed {
    let mut messages = Messages::new(BodyKind::Sse);
    let mut out = Followed {
        retry: None,
        seen: false,
    };
    loop {
        let restarting = session.restarting.notified();
        if session.restart.get() {
            response.lease.link.wire().close();
            return out;
        }
        let next = tokio::select! {
            m = exchange::next_message(response, &mut messages) => m,
            () = session.closed() => {
                response.lease.link.wire().close();
                return out;
            }
            () = restarting => continue,
        };
        let incoming = match next {
            Ok(Some(incoming)) => incoming,
            Ok(None) | Err(_) => return out,
        };
        // A block with only `retry:` (or a comment) is no event.
        out.seen |= incoming.event_id.is_some() || incoming.data.is_some();
        if session.restart.get() {
            // Read before the restart: the replay brings it again, and the resume point
            // the restart asked for must not move past it.
            continue;
        }
        let retry = &mut out.retry;
        if let Some(ms) = incoming.retry_ms {
            *retry = Some(Duration::from_millis(ms).clamp(UPSTREAM_RETRY_MIN, UPSTREAM_RETRY_MAX));
        }
        // An id that cannot be handed on or sent back (too long, or one a header would not
        // carry back unchanged: a control byte, a space at an end) is not one to resume
        // from either: the stream resumes from now, not from an older id (which would
        // replay what the agent already had). So does an empty one (SSE: the id is reset).
        let id: Option<Rc<str>> = match incoming.event_id.as_deref() {
            Some(id) if resendable(id) => Some(Rc::from(id)),
            Some(_) => {
                *session.last_event.borrow_mut() = None;
                None
            }
            None => None,
        };
        if let Some(id) = &id {
            *session.last_event.borrow_mut() = Some(id.clone());
        }
        let Some(data) = incoming.data else { continue };
        let event = match exchange::classify(&data, None) {
            Ok(Upward::Event(event)) => event,
            Ok(_) => continue,
            Err(_) => {
                client_metrics::count_malformed();
                continue;
            }
        };
        // Boxed: rare next to the wait above, and as large.
        if !Box::pin(session.post(Flush { id, event }, true)).await {
            response.lease.link.wire().close();
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(authorization: Option<&'static [u8]>) -> UpSession {
        UpSession::new(
            Rc::from("s1"),
            Bytes::new(),
            authorization.map(Bytes::from_static),
        )
    }

    /// The head a field-by-field encoder writes for the session's current values.
    fn full_head(s: &UpSession, accept: &'static [u8], len: Option<u64>) -> BytesMut {
        let ids = s.ids();
        let auth = s.authorization.borrow().clone();
        let mut headers: Vec<(&'static str, &[u8])> = vec![("host", b"up:1"), ("accept", accept)];
        if let Some(sid) = &ids.session {
            headers.push(("mcp-session-id", sid));
        }
        if let Some(a) = &auth {
            headers.push(("authorization", a));
        }
        let framing = len.map_or(
            crate::http::BodyFraming::None,
            crate::http::BodyFraming::Length,
        );
        let mut out = BytesMut::new();
        let written = crate::http::encode_request_head("POST", "/mcp", &headers, framing, &mut out);
        assert!(written.is_ok());
        out
    }

    #[test]
    fn ids_the_decoder_may_have_changed_are_no_place_to_resume_from() {
        assert!(resendable("42"));
        assert!(resendable("caf\u{e9}"));
        assert!(!resendable(""));
        assert!(!resendable("a\u{fffd}b"), "bytes the decoder replaced");
        assert!(!resendable(&"x".repeat(EXIT_EVENT_ID_BYTES_MAX + 1)));
        // The decoder's replacement of a byte that is not UTF-8 is refused end to end.
        let mut decoder = crate::sse::Decoder::new();
        let mut buf = bytes::BytesMut::from(&b"id: a\xffb\ndata: x\n\n"[..]);
        let message = decoder.decode(&mut buf).ok().flatten();
        let id = message.and_then(|m| m.id).unwrap_or_default();
        assert!(!resendable(&id), "{id:?}");
    }

    #[test]
    fn a_post_head_from_the_template_is_the_field_by_field_head_and_follows_every_change() {
        const ACCEPT: &[u8] = b"application/json, text/event-stream";
        let s = session(Some(b"Bearer one"));
        let made = Cell::new(0);
        let post = |len: u64| {
            let mut out = BytesMut::new();
            let r: Result<(), ()> = s.post_head(ACCEPT, len, &mut out, |fixed| {
                made.set(made.get() + 1);
                fixed.put_slice(&full_head(&s, ACCEPT, None));
                Ok(())
            });
            assert!(r.is_ok());
            out
        };
        assert_eq!(post(17), full_head(&s, ACCEPT, Some(17)));
        assert_eq!(post(1_000_000), full_head(&s, ACCEPT, Some(1_000_000)));
        assert_eq!(made.get(), 1, "made once, reused");
        // A new credential from the agent, a new upstream session: made again, each time.
        *s.authorization.borrow_mut() = Some(Bytes::from_static(b"Bearer two"));
        assert_eq!(post(0), full_head(&s, ACCEPT, Some(0)));
        s.ids.borrow_mut().session = Some(Bytes::from_static(b"up-7"));
        assert_eq!(post(5), full_head(&s, ACCEPT, Some(5)));
        *s.authorization.borrow_mut() = None;
        assert_eq!(post(5), full_head(&s, ACCEPT, Some(5)));
        assert_eq!(made.get(), 4);
    }

    #[test]
    fn a_head_that_cannot_be_made_is_refused_and_leaves_no_template() {
        let s = session(None);
        let mut out = BytesMut::new();
        let r = s.post_head(b"*/*", 3, &mut out, |_| Err("bad value"));
        assert_eq!(r, Err("bad value"));
        assert!(out.is_empty());
        assert!(s.head.borrow().is_none());
    }

    #[test]
    fn capability_bits() {
        let caps: ServerCapabilities = serde_json::from_str(
            r#"{"tools":{"listChanged":true},"resources":{"subscribe":true},"logging":{},"experimental":{"x":{}}}"#,
        )
        .unwrap();
        let bits = caps.bits();
        assert!(bits.contains(Caps::TOOLS));
        assert!(bits.contains(Caps::TOOLS_LIST_CHANGED));
        assert!(bits.contains(Caps::RESOURCES));
        assert!(bits.contains(Caps::RESOURCES_SUBSCRIBE));
        assert!(!bits.contains(Caps::RESOURCES_LIST_CHANGED));
        assert!(!bits.contains(Caps::PROMPTS));
        assert!(bits.contains(Caps::LOGGING));
        assert!(!bits.contains(Caps::COMPLETIONS));
    }

    #[test]
    fn session_ids_and_answers() {
        assert!(valid_version("2025-11-25"));
        assert!(valid_version("draft.v2_1"));
        for hostile in [
            "",
            "2025-11-25\r\nx: y",
            "2025\0",
            "a b",
            "ü",
            &"9".repeat(33),
        ] {
            assert!(!valid_version(hostile), "{hostile:?}");
        }
        assert!(valid_session_id(b"abc-123"));
        assert!(!valid_session_id(b""));
        assert!(!valid_session_id(b"\r\n"));
        assert!(!valid_session_id(b"a\0"));
        assert!(!valid_session_id(b"has space"));
        assert!(!valid_session_id(
            &[b'a'; UPSTREAM_SESSION_ID_BYTES_MAX + 1]
        ));
        assert_eq!(
            &answer_body(b"\"e1\"", Some(b"{\"action\":\"accept\"}"), None)[..],
            br#"{"jsonrpc":"2.0","id":"e1","result":{"action":"accept"}}"#
        );
        assert_eq!(
            &answer_body(b"3", None, Some(b"{\"code\":-1,\"message\":\"no\"}"))[..],
            br#"{"jsonrpc":"2.0","id":3,"error":{"code":-1,"message":"no"}}"#
        );
    }
}
