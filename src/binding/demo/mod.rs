//! The embedded demo toolkit: an exit that serves a small, self-contained MCP server so
//! that `config/quickstart.yaml` runs with nothing else installed (the agent-facing
//! `server` binding exits straight to it).
//!
//! It sits at the end of the stream flow: the server opens a lifecycle stream per agent
//! session and a request stream per JSON-RPC request, and [`Demo::open`] serves each on
//! the worker that opened it. What it serves:
//!
//! - tools ([`tools`]): `echo`, `add`, `progress`, `add_tool`, `remove_tool`,
//!   `touch_resource`, `log`, plus echo tools added at run time;
//! - prompts ([`prompts`]): `greet`;
//! - resources ([`resources`]): three static documents, paginated two per page, and the
//!   template `demo://items/{id}`, with subscriptions;
//! - completions ([`complete`]) and `logging/setLevel`.
//!
//! State is split by reach. [`DemoShared`] is process-wide (run-time tools, a version
//! channel announcing their changes, counters) and is touched only by rare calls and list
//! reads. [`Demo`] is per worker: its sessions ([`session`]) live in an `Rc<RefCell<..>>`
//! table, and a watcher task turns shared version bumps into `tools/list_changed` events
//! for every session of the worker.

mod complete;
mod json;
mod prompts;
mod resources;
mod session;
mod tools;

#[cfg(test)]
mod tests;

use crate::FastMap;
use crate::binding::{Exit, Serving};
use crate::limits::{MESSAGE_BYTES_MAX, STREAMS_PER_WORKER_MAX};
use crate::stream::{Callee, Caps, Event, Flush, Frame, Gone, Kind, ListKind, ReplyBegin};
use bytes::Bytes;
use json::{Failure, INTERNAL_ERROR, INVALID_REQUEST};
use session::Session;
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch;

/// What every demo session is told the demo serves.
const CAPS: Caps = Caps(
    Caps::TOOLS.0
        | Caps::TOOLS_LIST_CHANGED.0
        | Caps::PROMPTS.0
        | Caps::RESOURCES.0
        | Caps::RESOURCES_SUBSCRIBE.0
        | Caps::RESOURCES_LIST_CHANGED.0
        | Caps::LOGGING.0
        | Caps::COMPLETIONS.0,
);

/// Process-wide state of one demo binding, shared by all workers (create once on the main
/// thread and hand a clone of the `Arc` to each worker's [`Demo::new`]).
pub struct DemoShared {
    /// Pause between two steps of the `progress` tool.
    progress_interval: Duration,
    /// Names of the tools added at run time, oldest first. Replaced whole on change, so a
    /// reader clones the `Arc` and lets go of the lock at once.
    /// Invariant: at most `tools::ADDED_TOOLS_MAX` names, none a built-in, no duplicates.
    added_tools: RwLock<Arc<Vec<Box<str>>>>,
    /// Bumped after every change of `added_tools`; each worker's watcher follows it.
    tools_version: watch::Sender<u64>,
    /// Session ids minted so far, by any worker (ids are `demo-<n>`).
    sessions_minted: AtomicU64,
    /// `touch_resource` calls so far; shown in `demo://status`.
    touches: AtomicU64,
}

impl DemoShared {
    /// Creates the shared state; `progress_interval` paces the `progress` tool.
    pub fn new(progress_interval: Duration) -> Arc<DemoShared> {
        let (tools_version, _) = watch::channel(0);
        Arc::new(DemoShared {
            progress_interval,
            added_tools: RwLock::new(Arc::new(Vec::new())),
            tools_version,
            sessions_minted: AtomicU64::new(0),
            touches: AtomicU64::new(0),
        })
    }

    /// A fresh session number, unique across workers.
    fn next_session_id(&self) -> u64 {
        // Relaxed: the number only has to be unique, it orders nothing.
        self.sessions_minted.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The tools added at run time, as of now.
    fn added_tools(&self) -> Arc<Vec<Box<str>>> {
        // A poisoned lock still holds a consistent list: every writer replaces it whole.
        let guard = self.added_tools.read().unwrap_or_else(|e| e.into_inner());
        Arc::clone(&guard)
    }

    /// Replaces the run-time tool list with what `change` makes of it, then tells every
    /// worker. An `Err` from `change` leaves the list (and the version) as they were.
    fn change_tools<T>(
        &self,
        change: impl FnOnce(&Vec<Box<str>>) -> Result<Vec<Box<str>>, T>,
    ) -> Result<(), T> {
        {
            let mut guard = self.added_tools.write().unwrap_or_else(|e| e.into_inner());
            let next = change(&guard)?;
            assert!(next.len() <= tools::ADDED_TOOLS_MAX);
            *guard = Arc::new(next);
        }
        // send_modify notifies even while no worker is subscribed yet.
        self.tools_version.send_modify(|version| *version += 1);
        Ok(())
    }

    /// `touch_resource` calls so far.
    fn touches(&self) -> u64 {
        self.touches.load(Ordering::Relaxed)
    }
}

/// One worker's demo instance: the exit the worker's server binding hands streams to.
pub struct Demo {
    worker: Rc<Worker>,
}

/// The worker-local state behind [`Demo`], shared by the tasks serving its streams.
struct Worker {
    shared: Arc<DemoShared>,
    /// Live sessions on this worker, by the id minted for them.
    /// Invariant: `len() <= SESSIONS_PER_WORKER_MAX`.
    sessions: RefCell<FastMap<Rc<str>, Rc<Session>>>,
    /// Request streams being served. Invariant: `<= STREAMS_PER_WORKER_MAX`.
    requests: Cell<usize>,
}

impl Demo {
    /// Creates the worker-local instance and spawns (with `tokio::task::spawn_local`) its
    /// watcher task that fans run-time tool changes out to this worker's sessions. Must be
    /// called inside the worker's `LocalSet`.
    pub fn new(shared: Arc<DemoShared>) -> Rc<Demo> {
        let version = shared.tools_version.subscribe();
        let worker = Rc::new(Worker {
            shared,
            sessions: RefCell::new(FastMap::default()),
            requests: Cell::new(0),
        });
        tokio::task::spawn_local(watch_tools(Rc::downgrade(&worker), version));
        Rc::new(Demo { worker })
    }

    /// Sessions currently open on this worker.
    pub fn sessions(&self) -> usize {
        self.worker.sessions.borrow().len()
    }

    /// Events the open sessions of this worker dropped because their outbox was full.
    pub fn events_dropped(&self) -> u64 {
        let sessions = self.worker.sessions.borrow();
        sessions.values().map(|s| s.dropped()).sum()
    }

    /// Request streams currently being served on this worker.
    pub fn requests_in_flight(&self) -> usize {
        self.worker.requests.get()
    }
}

impl Exit for Demo {
    fn serve(&self, callee: Callee) -> Option<Serving> {
        let worker = self.worker.clone();
        if callee.begin.kind == Kind::Lifecycle {
            Some(Box::pin(session::serve(worker, callee)))
        } else {
            Some(Box::pin(serve_request(worker, callee)))
        }
    }
}

/// Follows the shared tools version and posts `tools/list_changed` to every session of
/// the worker. Ends when the worker is gone (noticed at the next change) or the shared
/// state is dropped.
async fn watch_tools(worker: Weak<Worker>, mut version: watch::Receiver<u64>) {
    while version.changed().await.is_ok() {
        let Some(worker) = worker.upgrade() else {
            return;
        };
        for session in worker.sessions.borrow().values() {
            session.post(Event::ListChanged(ListKind::Tools));
        }
    }
}

/// Why a request stops without a result.
enum Halt {
    /// Answer with this JSON-RPC error.
    Fail(Failure),
    /// The caller is gone (cancelled, timed out, disconnected): stop quietly.
    Gone,
}

impl From<Failure> for Halt {
    fn from(failure: Failure) -> Halt {
        Halt::Fail(failure)
    }
}

impl From<Gone> for Halt {
    fn from(_: Gone) -> Halt {
        Halt::Gone
    }
}

/// What a request handler may touch: its worker, its session and its stream.
struct Cx<'a> {
    worker: &'a Worker,
    session: &'a Rc<Session>,
    callee: &'a Callee,
    /// The reply direction, opened on first use.
    reply: Reply<'a>,
}

/// The reply direction of one request, which sends its `ReplyBegin` lazily so that a
/// request failing early is a bare RESET + ABORT.
struct Reply<'a> {
    callee: &'a Callee,
    begun: Cell<bool>,
}

impl Reply<'_> {
    /// Sends the `ReplyBegin` unless already sent.
    async fn open(&self) -> Result<(), Gone> {
        if self.begun.replace(true) {
            return Ok(());
        }
        self.callee.reply.begin(ReplyBegin::default()).await
    }

    /// Sends an in-band event (opening the reply first if needed).
    async fn flush(&self, flush: Flush) -> Result<(), Gone> {
        self.open().await?;
        self.callee.reply.flush(flush).await
    }

    /// Sends the result bytes and ends the reply.
    async fn finish(&self, result: Bytes) -> Result<(), Gone> {
        self.open().await?;
        self.callee.reply.data(result).await?;
        self.callee.reply.end();
        Ok(())
    }

    /// Fails the request: the RESET carries the error, the ABORT tells the caller to look.
    fn fail(&self, failure: Failure) {
        self.callee.initial.reset(failure.into_reset());
        self.callee.reply.abort();
    }
}

/// Counts a request stream in flight for as long as it is served.
struct InFlight(Rc<Worker>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let requests = self.0.requests.get();
        assert!(requests > 0);
        self.0.requests.set(requests - 1);
    }
}

/// Serves one request stream from params to result (or error).
async fn serve_request(worker: Rc<Worker>, callee: Callee) {
    let reply = Reply {
        callee: &callee,
        begun: Cell::new(false),
    };
    if worker.requests.get() >= STREAMS_PER_WORKER_MAX {
        reply.fail(Failure::new(INTERNAL_ERROR, "Too many requests"));
        return;
    }
    worker.requests.set(worker.requests.get() + 1);
    let _in_flight = InFlight(worker.clone());
    let session = worker
        .sessions
        .borrow()
        .get(&*callee.begin.session)
        .cloned();
    let Some(session) = session else {
        reply.fail(Failure::new(INVALID_REQUEST, "Unknown session"));
        return;
    };
    let cx = Cx {
        worker: &worker,
        session: &session,
        callee: &callee,
        reply,
    };
    let outcome = match read_params(&callee).await {
        Ok(params) => dispatch(&cx, params).await,
        Err(halt) => Err(halt),
    };
    match outcome {
        Ok(result) => {
            if cx.reply.finish(result).await.is_err() {
                callee.reply.abort();
            }
        }
        Err(Halt::Fail(failure)) => cx.reply.fail(failure),
        Err(Halt::Gone) => callee.reply.abort(),
    }
}

/// Routes a request to its handler; `Ok` holds the raw `result` JSON.
async fn dispatch(cx: &Cx<'_>, mut params: Vec<u8>) -> Result<Bytes, Halt> {
    let shared = &*cx.worker.shared;
    let target = cx.callee.begin.target.as_deref();
    let params = json::parse(&mut params)?;
    let result = match cx.callee.begin.kind {
        Kind::ToolsList => tools::list(shared),
        Kind::ToolsCall => return tools::call(cx, &params).await,
        Kind::PromptsList => prompts::list(),
        Kind::PromptsGet => prompts::get(&params, target)?,
        Kind::ResourcesList => resources::list(&params)?,
        Kind::ResourcesTemplatesList => resources::templates(),
        Kind::ResourcesRead => resources::read(&params, target, shared)?,
        Kind::ResourcesSubscribe => {
            cx.session
                .subscribe(resources::target_uri(&params, target)?)?;
            Bytes::from_static(b"{}")
        }
        Kind::ResourcesUnsubscribe => {
            // Unsubscribing from what was never there is harmless: any uri will do.
            let Some(uri) = json::name_or_target(&params, "uri", target) else {
                return Err(Failure::invalid_params("Missing uri").into());
            };
            cx.session.unsubscribe(uri);
            Bytes::from_static(b"{}")
        }
        Kind::CompletionComplete => complete::complete(&params)?,
        Kind::LoggingSetLevel => {
            let level = json::Args::whole(&params).str("level");
            let Some(level) = level.and_then(session::Level::parse) else {
                return Err(Failure::invalid_params("Invalid level").into());
            };
            cx.session.set_level(level);
            Bytes::from_static(b"{}")
        }
        Kind::Other => {
            // The demo does not advertise Caps::OTHER, so a server never sends these.
            return Err(Failure::new(crate::jsonrpc::METHOD_NOT_FOUND, "Method not found").into());
        }
        Kind::Lifecycle => {
            // Exit::open sends lifecycle streams elsewhere; a caller cannot reach this.
            let failure = Failure::new(INTERNAL_ERROR, "Unreachable: lifecycle as request");
            return Err(failure.into());
        }
    };
    Ok(result)
}

/// Reads exactly `params_len` bytes of params DATA, acknowledging each piece, into a
/// buffer the demo owns. Fails with invalid-request if the caller sends more than it
/// announced or something other than DATA; `Halt::Gone` if the initial ends first.
async fn read_params(callee: &Callee) -> Result<Vec<u8>, Halt> {
    let len = callee.begin.params_len as usize;
    if len > MESSAGE_BYTES_MAX {
        return Err(Failure::new(INVALID_REQUEST, "Params too large").into());
    }
    let mut params = Vec::with_capacity(len);
    while params.len() < len {
        match callee.initial.next().await {
            Some(Frame::Data(piece)) => {
                callee.initial.ack(piece_len(&piece));
                if piece.len() > len - params.len() {
                    return Err(
                        Failure::new(INVALID_REQUEST, "Params longer than announced").into(),
                    );
                }
                params.extend_from_slice(&piece);
            }
            Some(Frame::Begin(_) | Frame::Flush(_)) => {
                return Err(Failure::new(INVALID_REQUEST, "Unexpected frame in params").into());
            }
            Some(Frame::End | Frame::Abort) | None => return Err(Halt::Gone),
        }
    }
    Ok(params)
}

/// The length of one DATA piece as credit. A piece is at most one window, or one answer
/// sent whole, which [`crate::stream::Sender::data_whole`] keeps within `u32`.
fn piece_len(piece: &Bytes) -> u32 {
    assert!(u32::try_from(piece.len()).is_ok());
    piece.len() as u32
}
