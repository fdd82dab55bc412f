//! Demo sessions: the lifecycle stream of each agent session, its event outbox, its
//! resource subscriptions and its logging threshold.
//!
//! A session lives on the worker whose [`super::Demo`] served its lifecycle stream. Its
//! lifecycle task is the only task that awaits on the lifecycle reply [`Sender`]: the
//! pipe keeps a single sender-side waker, so a second task waiting on the same sender (a
//! FLUSH waiting for queue room while this task waits for a CHALLENGE) could lose a wakeup.
//! Every other producer (the tools watcher, `touch_resource`, `log`) therefore [`posts`]
//! events into the session's bounded outbox and the lifecycle task FLUSHes them in order.
//!
//! [`posts`]: Session::post
//! [`Sender`]: crate::stream::Sender

use super::Worker;
use super::json::Failure;
use crate::runtime::notify::Notify;
use crate::stream::{Callee, Challenge, Event, Flush, Frame, ReplyBegin, Throttle};
use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::collections::{HashSet, VecDeque};
use std::rc::Rc;

/// Events queued for one session's lifecycle stream before they are FLUSHed; more are
/// dropped (and counted). A live agent drains far faster than the demo produces.
pub(super) const OUTBOX_EVENTS_MAX: usize = 64;

/// Resource subscriptions per session; more are refused with invalid-params.
pub(super) const SUBSCRIPTIONS_PER_SESSION_MAX: usize = 64;

const _: () = assert!(OUTBOX_EVENTS_MAX <= crate::limits::STREAM_FRAMES_MAX);

/// The `instructions` of every demo session, as a raw JSON string lexeme.
const INSTRUCTIONS: &[u8] =
    br#""mcpyard demo toolkit: try the progress tool, add_tool, touch_resource and log""#;

/// RFC 5424 severities, as MCP `logging/setLevel` names them, least severe first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Level {
    Debug,
    Info,
    Notice,
    Warning,
    Error,
    Critical,
    Alert,
    Emergency,
}

impl Level {
    /// Every level, least severe first.
    pub const ALL: [Level; 8] = [
        Level::Debug,
        Level::Info,
        Level::Notice,
        Level::Warning,
        Level::Error,
        Level::Critical,
        Level::Alert,
        Level::Emergency,
    ];

    /// The level called `name`; `None` for anything else (names are lower case).
    pub fn parse(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|level| level.name() == name)
    }

    /// The MCP name of this level.
    pub fn name(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Notice => "notice",
            Level::Warning => "warning",
            Level::Error => "error",
            Level::Critical => "critical",
            Level::Alert => "alert",
            Level::Emergency => "emergency",
        }
    }
}

/// One agent session served by this worker's demo.
pub(super) struct Session {
    /// Events waiting for the lifecycle task, oldest first.
    /// Invariant: `outbox.len() <= OUTBOX_EVENTS_MAX`.
    outbox: RefCell<VecDeque<Event>>,
    /// Wakes the lifecycle task when the outbox gains an event (keeps a permit if the
    /// task is busy, so no post is missed).
    outbox_ready: Notify,
    /// Events dropped because the outbox was full.
    dropped: Cell<u64>,
    /// Uris this session subscribed to. Invariant: `len() <= SUBSCRIPTIONS_PER_SESSION_MAX`.
    subscriptions: RefCell<HashSet<Box<str>>>,
    /// `notifications/message` below this level are not sent. Until the agent sets a level
    /// every message is sent (MCP leaves the default to the server).
    level: Cell<Level>,
}

impl Session {
    fn new() -> Session {
        Session {
            outbox: RefCell::new(VecDeque::new()),
            outbox_ready: Notify::new(),
            dropped: Cell::new(0),
            subscriptions: RefCell::new(HashSet::new()),
            level: Cell::new(Level::Debug),
        }
    }

    /// Queues `event` for the session's lifecycle stream. A list change already waiting
    /// absorbs a new one of the same list (the agent re-lists once either way). Returns
    /// false if the outbox was full and the event was dropped.
    pub fn post(&self, event: Event) -> bool {
        let mut outbox = self.outbox.borrow_mut();
        if let Event::ListChanged(list) = event {
            let waiting = outbox
                .iter()
                .any(|e| matches!(e, Event::ListChanged(l) if *l == list));
            if waiting {
                return true;
            }
        }
        if outbox.len() >= OUTBOX_EVENTS_MAX {
            self.dropped.set(self.dropped.get() + 1);
            return false;
        }
        outbox.push_back(event);
        assert!(outbox.len() <= OUTBOX_EVENTS_MAX);
        drop(outbox);
        self.outbox_ready.notify_one();
        true
    }

    /// The oldest queued event, if any.
    fn take(&self) -> Option<Event> {
        self.outbox.borrow_mut().pop_front()
    }

    /// Events dropped so far because the outbox was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.get()
    }

    /// True if the session subscribed to `uri`.
    pub fn is_subscribed(&self, uri: &str) -> bool {
        self.subscriptions.borrow().contains(uri)
    }

    /// Records a subscription to `uri` (idempotent); fails past the per-session bound.
    pub fn subscribe(&self, uri: &str) -> Result<(), Failure> {
        let mut subscriptions = self.subscriptions.borrow_mut();
        if subscriptions.contains(uri) {
            return Ok(());
        }
        if subscriptions.len() >= SUBSCRIPTIONS_PER_SESSION_MAX {
            return Err(Failure::invalid_params("Too many subscriptions"));
        }
        subscriptions.insert(Box::from(uri));
        assert!(subscriptions.len() <= SUBSCRIPTIONS_PER_SESSION_MAX);
        Ok(())
    }

    /// Forgets a subscription to `uri`; unsubscribing from nothing is fine.
    pub fn unsubscribe(&self, uri: &str) {
        self.subscriptions.borrow_mut().remove(uri);
    }

    /// The logging threshold set by `logging/setLevel`.
    pub fn level(&self) -> Level {
        self.level.get()
    }

    /// Sets the logging threshold.
    pub fn set_level(&self, level: Level) {
        self.level.set(level);
    }
}

/// Keeps a session in its worker's table while the lifecycle task runs; removes it when
/// the task ends in any way (including being dropped with the worker's task set).
struct Registration {
    worker: Rc<Worker>,
    id: Rc<str>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.worker.sessions.borrow_mut().remove(&*self.id);
    }
}

/// Serves one lifecycle stream: mints the session, answers with its id and capabilities,
/// then relays its events until either side ends it.
pub(super) async fn serve(worker: Rc<Worker>, callee: Callee) {
    // The lifecycle's params (the agent's initialize params) carry nothing the demo needs,
    // but they are read and acknowledged like any other stream's.
    match super::read_params(&callee).await {
        Ok(_) => {}
        Err(super::Halt::Fail(failure)) => {
            callee.initial.reset(failure.into_reset());
            callee.reply.abort();
            return;
        }
        Err(super::Halt::Gone) => {
            callee.reply.abort();
            return;
        }
    }
    if worker.sessions.borrow().len() >= crate::limits::SESSIONS_PER_WORKER_MAX {
        let failure = Failure::new(super::json::INTERNAL_ERROR, "Too many sessions");
        callee.initial.reset(failure.into_reset());
        callee.reply.abort();
        return;
    }
    let id: Rc<str> = Rc::from(format!("demo-{}", worker.shared.next_session_id()));
    let session = Rc::new(Session::new());
    worker
        .sessions
        .borrow_mut()
        .insert(id.clone(), session.clone());
    let _registration = Registration {
        worker: worker.clone(),
        id: id.clone(),
    };
    let begin = ReplyBegin {
        session: Some(id),
        caps: super::CAPS,
        instructions: Some(Bytes::from_static(INSTRUCTIONS)),
        // A demo session has nothing to hand over: another node's demo serves it afresh.
        handoff: Some(Bytes::from_static(b"{}")),
    };
    if callee.reply.begin(begin).await.is_ok() {
        relay(&session, &callee).await;
    }
    callee.reply.end();
}

/// Relays the session's events and answers CHALLENGEs until the caller ends the initial
/// direction or goes away. Every future in the `select!` is a channel future that takes
/// nothing until it completes, so dropping the losers loses nothing.
async fn relay(session: &Session, callee: &Callee) {
    loop {
        while let Some(event) = session.take() {
            let flush = Flush { id: None, event };
            if callee.reply.flush(flush).await.is_err() {
                return;
            }
        }
        tokio::select! {
            throttle = callee.reply.throttle() => match throttle {
                Some(Throttle::Challenge(Challenge::Resume { .. })) => {
                    // The demo keeps no replay log: it marks the stream live again.
                    let flush = Flush { id: None, event: Event::Resumable };
                    if callee.reply.flush(flush).await.is_err() {
                        return;
                    }
                }
                Some(Throttle::Challenge(Challenge::Suspended | Challenge::Answer { .. })) => {}
                Some(Throttle::Reset(_)) | None => return,
            },
            frame = callee.initial.next() => match frame {
                Some(Frame::Data(piece)) => {
                    // Bytes past the params mean nothing here; credit them back.
                    callee.initial.ack(super::piece_len(&piece));
                }
                Some(Frame::Begin(_) | Frame::Flush(_)) => {}
                Some(Frame::End | Frame::Abort) | None => return,
            },
            () = session.outbox_ready.notified() => {}
        }
    }
}
