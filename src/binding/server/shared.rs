//! Shared sessions (`sessions: { store }`): a session any node of a cluster can serve.
//!
//! The node that opens a session writes its record to the store under `session:<id>`
//! before it answers `initialize`: the negotiated version, the agent's capabilities, and
//! the exit's handoff (what the exit needs to go on with its own sessions: each route's
//! upstream session id, version and capabilities). No credential is in it: a node that
//! takes a session up uses the `Authorization` of the request in hand.
//!
//! A node that gets a request for a session it does not hold, with an id of our format,
//! reads the record once and takes the session up ([`adopt`]): it opens the session's
//! lifecycle with the handoff, so the exit goes on with the same upstream sessions without
//! an `initialize`. From then on the session is served from this node's memory as any
//! other; the per-request path does not touch the store.
//!
//! Why a record in the store rather than state sealed into the session id: the id stays
//! 26 characters and needs no key to rotate, a `DELETE` ends the session everywhere (the
//! record is gone, and every node holding it is told through its watch), and the cost is
//! one store read per session per node, once.
//!
//! The record's life:
//! - it changes when the exit's handoff does (a route opened later), and a node writes its
//!   latest activity to it at most [`SHARED_SESSION_TOUCHES_PER_TIMEOUT`] times per session
//!   timeout while it serves the session, never per request;
//! - it lives in the store for the session timeout plus [`SHARED_SESSION_RECORD_GRACE`]
//!   after its last write, so a cluster that died entirely leaves nothing behind;
//! - when a node's copy has been idle for the session timeout, the node reads the record:
//!   activity at another node within the timeout means the session lives on there, and the
//!   node lets go of its copy without ending anything upstream (detach); otherwise it
//!   deletes the record and ends the session (the exit ends its upstream sessions);
//! - `DELETE` deletes the record and ends the session; the other nodes holding it see the
//!   record gone through their watch and end their copies;
//! - a drained node (SIGTERM) detaches every shared session: the others go on with them.
//!
//! Everything read from the store is outside input: a record is checked (format, version,
//! size) before it is used, and the exit checks the handoff it is given in turn.

use super::net::Request;
use super::session::{self, Session};
use super::{PROTOCOL_VERSIONS, Server, session_id};
use crate::limits::{
    SESSIONS_PER_WORKER_MAX, SHARED_SESSION_ADOPTIONS_MAX, SHARED_SESSION_RECORD_BYTES_MAX,
    SHARED_SESSION_RECORD_GRACE, SHARED_SESSION_TOUCHES_PER_TIMEOUT,
};
use crate::runtime::notify::Notify;
use crate::store::Watch;
use crate::stream::{self, Begin, ClientHello, Event, Flush, Frame};
use crate::{log, metrics};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The record format this build writes and reads.
const RECORD_FORMAT: u64 = 1;

/// Log lines about the session store, per worker, at most once per this long (a store
/// that is down would otherwise log once per request or session).
const STORE_LOG_SPACING: Duration = Duration::from_secs(10);

thread_local! {
    /// When this worker last logged a session store failure.
    static STORE_LOGGED: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// True if a session store failure may be logged now (see [`STORE_LOG_SPACING`]); the
/// failures are all counted either way.
fn store_log_due() -> bool {
    STORE_LOGGED.with(|last| {
        let now = Instant::now();
        if last.get().is_some_and(|at| now < at + STORE_LOG_SPACING) {
            return false;
        }
        last.set(Some(now));
        true
    })
}

/// This process's tag in the records it writes (random, once): a node whose copy of a
/// session expires ends it for the cluster when the record's last writer is itself.
fn node_tag() -> u64 {
    static TAG: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TAG.get_or_init(|| {
        let mut bytes = [0u8; 8];
        if getrandom::fill(&mut bytes).is_err() {
            // No entropy: the process id and the time tell nodes apart well enough.
            let time = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            return time ^ u64::from(std::process::id()).rotate_left(32);
        }
        u64::from_le_bytes(bytes)
    })
}

/// The store key of session `id`'s record (`id` is of our format: checked by the caller).
pub fn key(id: &str) -> String {
    format!("session:{id}")
}

/// What a node holding a shared session keeps to write its record.
pub struct Link {
    /// The agent's raw `capabilities` object.
    capabilities: Bytes,
    /// The exit's latest handoff.
    handoff: RefCell<Option<Bytes>>,
    /// The activity last written to the record (and when it was written): the next write
    /// is due once there is newer activity and a touch interval has passed.
    written: Cell<Option<(Instant, Instant)>>,
    /// The record must be written again (the handoff changed).
    stale: Cell<bool>,
    /// A write is in flight (at most one per session at a time from [`touch`]).
    writing: Cell<bool>,
    /// When the last write failed: the next is tried a touch interval later.
    failed_at: Cell<Option<Instant>>,
    /// A read of the record after its watch fired is in flight ([`recheck`]).
    checking: Cell<bool>,
    /// Wakes the session's task when the record changes at any node; taken by that task.
    pub(super) watch: RefCell<Option<Watch>>,
}

impl Link {
    pub fn new(capabilities: Bytes, handoff: Option<Bytes>) -> Link {
        Link {
            capabilities,
            handoff: RefCell::new(handoff),
            written: Cell::new(None),
            stale: Cell::new(true),
            writing: Cell::new(false),
            failed_at: Cell::new(None),
            checking: Cell::new(false),
            watch: RefCell::new(None),
        }
    }

    /// The exit's handoff changed: the record is written again.
    pub fn set_handoff(&self, handoff: Bytes) {
        *self.handoff.borrow_mut() = Some(handoff);
        self.stale.set(true);
    }
}

/// A record as stored (JSON).
#[derive(Serialize, Deserialize)]
struct RecordJson<'a> {
    v: u64,
    #[serde(borrow)]
    version: Cow<'a, str>,
    #[serde(borrow)]
    capabilities: &'a RawValue,
    #[serde(borrow)]
    handoff: Option<&'a RawValue>,
    /// The last activity written, in milliseconds since the Unix epoch.
    touched: u64,
    /// The writing node's tag ([`node_tag`]).
    by: u64,
}

/// A record read back and checked.
#[derive(Debug, PartialEq, Eq)]
pub struct Record {
    pub version: &'static str,
    pub capabilities: Bytes,
    pub handoff: Option<Bytes>,
    pub touched: u64,
    pub by: u64,
}

/// Writes a record; `None` if a part is not JSON (our own values: not expected).
fn encode(
    version: &str,
    capabilities: &[u8],
    handoff: Option<&[u8]>,
    touched: u64,
) -> Option<Bytes> {
    let raw = |bytes: &[u8]| -> Option<Box<RawValue>> {
        RawValue::from_string(std::str::from_utf8(bytes).ok()?.to_owned()).ok()
    };
    let capabilities = raw(capabilities)?;
    let handoff = match handoff {
        Some(h) => Some(raw(h)?),
        None => None,
    };
    let json = RecordJson {
        v: RECORD_FORMAT,
        version: Cow::Borrowed(version),
        capabilities: &capabilities,
        handoff: handoff.as_deref(),
        touched,
        by: node_tag(),
    };
    serde_json::to_vec(&json).ok().map(Bytes::from)
}

/// Reads a record from the store, checked: our format, a version we speak, capabilities
/// that are an object, no more than [`SHARED_SESSION_RECORD_BYTES_MAX`] bytes.
pub fn decode(bytes: &[u8]) -> Result<Record, &'static str> {
    if bytes.len() > SHARED_SESSION_RECORD_BYTES_MAX {
        return Err("a record larger than any mcpyard writes");
    }
    let json: RecordJson<'_> = serde_json::from_slice(bytes).map_err(|_| "not a session record")?;
    if json.v != RECORD_FORMAT {
        return Err("a session record of another format");
    }
    let version = PROTOCOL_VERSIONS
        .iter()
        .find(|v| **v == json.version)
        .copied()
        .ok_or("a session record with a protocol version not spoken here")?;
    if !json.capabilities.get().starts_with('{') {
        return Err("a session record whose capabilities are not an object");
    }
    let bytes_of = |raw: &RawValue| Bytes::copy_from_slice(raw.get().as_bytes());
    Ok(Record {
        version,
        capabilities: bytes_of(json.capabilities),
        handoff: json.handoff.filter(|h| h.get() != "null").map(bytes_of),
        touched: json.touched,
        by: json.by,
    })
}

/// Milliseconds since the Unix epoch at `at` (wall clock: nodes compare each other's).
fn unix_ms(at: Instant) -> u64 {
    let ago = Instant::now().saturating_duration_since(at);
    let wall = SystemTime::now()
        .checked_sub(ago)
        .unwrap_or(SystemTime::now());
    wall.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How long a record lives in the store after a write.
fn record_ttl(server: &Server) -> Duration {
    server.cfg.session_timeout + SHARED_SESSION_RECORD_GRACE
}

/// The time between two activity writes of one session.
fn touch_interval(server: &Server) -> Duration {
    server.cfg.session_timeout / SHARED_SESSION_TOUCHES_PER_TIMEOUT
}

/// How a record is written.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// The session was just opened here: the record is made.
    Create,
    /// Over the record that is there only: a record that is gone was deleted (a `DELETE`
    /// at another node) and must not come back.
    Update,
}

/// What came of a write.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Written {
    Done,
    /// [`Write::Update`] found no record: the session was ended elsewhere.
    Gone,
    /// The store failed (counted; logged if asked).
    Failed,
}

/// Writes `session`'s record now (its latest activity and handoff). A failure is counted,
/// and logged when `loud` (the periodic writes of many sessions to a store that is down
/// would otherwise log one line each per interval).
pub async fn write(server: &Server, session: &Session, how: Write, loud: bool) -> Written {
    let (Some(store), Some(link)) = (server.shared.as_ref(), session.shared.as_ref()) else {
        return Written::Done;
    };
    let active = session.last_active();
    let record = encode(
        session.version,
        &link.capabilities,
        link.handoff.borrow().as_deref(),
        unix_ms(active),
    );
    let Some(record) = record else {
        return Written::Failed;
    };
    let stale = link.stale.replace(false);
    link.writing.set(true);
    let key = key(&session.id);
    let existing_only = how == Write::Update;
    let written = store
        .put_for(&key, record, record_ttl(server), existing_only)
        .await;
    link.writing.set(false);
    match written {
        Ok(Some(_)) => {
            link.written.set(Some((active, Instant::now())));
            link.failed_at.set(None);
            Written::Done
        }
        Ok(None) => Written::Gone,
        Err(e) => {
            link.stale.set(stale || link.stale.get());
            link.failed_at.set(Some(Instant::now()));
            metrics::with(|m| m.session_store_failures += 1);
            if loud && store_log_due() {
                log::warn(format_args!(
                    "server {}: a shared session's record was not written: {e}",
                    server.name
                ));
            }
            Written::Failed
        }
    }
}

/// Writes the record in a task of its own if it is due (the handoff changed, or there was
/// activity since the last write and a touch interval has passed); returns when to look
/// again. The session's task looks at least once per touch interval, so activity reaches
/// the record within about one interval of happening, whatever this node's own timers.
pub fn touch(server: &Rc<Server>, session: &Rc<Session>) -> Option<Instant> {
    let link = session.shared.as_ref()?;
    let now = Instant::now();
    let interval = touch_interval(server);
    if link.writing.get() {
        return Some(now + interval);
    }
    if let Some(failed) = link.failed_at.get()
        && now < failed + interval
    {
        return Some(failed + interval);
    }
    let due = match link.written.get() {
        Some((active, at)) if !link.stale.get() => {
            if now < at + interval {
                return Some(at + interval);
            }
            session.last_active() > active
        }
        _ => true,
    };
    if due {
        link.writing.set(true);
        let (server, session) = (server.clone(), session.clone());
        tokio::task::spawn_local(async move {
            if write(&server, &session, Write::Update, false).await == Written::Gone {
                // Deleted at another node meanwhile: this copy goes too (that node ended
                // the upstream sessions).
                session::end(&server, &session, "deleted at another node", Ending::Detach);
            }
        });
    }
    Some(now + interval)
}

/// Deletes `session`'s record (a `DELETE`, or the cluster-wide end at expiry).
pub async fn forget(server: &Server, session: &Session) {
    let (Some(store), Some(_)) = (server.shared.as_ref(), session.shared.as_ref()) else {
        return;
    };
    if let Err(e) = store.delete(&key(&session.id)).await {
        metrics::with(|m| m.session_store_failures += 1);
        log::warn(format_args!(
            "server {}: a shared session's record was not deleted: {e}",
            server.name
        ));
    }
}

/// How a session held here ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// For good: its exit ends its upstream sessions.
    End,
    /// Here only: it lives on at another node.
    Detach,
}

/// `session` has been idle here for the session timeout: ends it for the cluster if no
/// node used it within the timeout either (the caller then deletes its record), else lets
/// go of it here.
/// A store that cannot be read detaches (another node may be using it; the record's own
/// time to live ends it in the store).
pub async fn at_expiry(server: &Server, session: &Session) -> Ending {
    let Some(store) = server.shared.as_ref() else {
        return Ending::End;
    };
    if session.shared.is_none() {
        return Ending::End;
    }
    let record = match store.get(&key(&session.id)).await {
        Ok(None) => return Ending::End,
        Ok(Some(value)) => decode(&value.bytes),
        Err(e) => {
            metrics::with(|m| m.session_store_failures += 1);
            if store_log_due() {
                log::warn(format_args!(
                    "server {}: a shared session expired here while its record could not \
                     be read ({e}); letting it go here only",
                    server.name
                ));
            }
            return Ending::Detach;
        }
    };
    let timeout = u64::try_from(server.cfg.session_timeout.as_millis()).unwrap_or(u64::MAX);
    let now = unix_ms(Instant::now());
    match record {
        // Another node wrote it last, with activity within the timeout (and not from the
        // future: a forged or skewed time cannot keep a session from ending).
        Ok(record)
            if record.by != node_tag()
                && record.touched.saturating_add(timeout) > now
                && record.touched <= now.saturating_add(timeout) =>
        {
            Ending::Detach
        }
        _ => Ending::End,
    }
}

/// The record of `session` changed at some node (its watch fired): reads it in a task of
/// its own (one at a time per session, so the session's task never waits on the store),
/// and lets go of the session here when the record is gone (a `DELETE` at another node).
/// A record that is gone is let go of without ending anything upstream: the node that
/// deleted it ended the upstream sessions, and a store that lost its data (a Redis
/// restarted empty) must not make every node end every session upstream. A store that
/// cannot be read keeps the session.
pub fn recheck(server: &Rc<Server>, session: &Rc<Session>) {
    let (Some(store), Some(link)) = (server.shared.clone(), session.shared.as_ref()) else {
        return;
    };
    if link.checking.replace(true) {
        return;
    }
    let (server, session) = (server.clone(), session.clone());
    tokio::task::spawn_local(async move {
        let gone = matches!(store.get(&key(&session.id)).await, Ok(None));
        if let Some(link) = session.shared.as_ref() {
            link.checking.set(false);
        }
        if gone {
            session::end(&server, &session, "deleted at another node", Ending::Detach);
        }
    });
}

/// One session being taken up: requests for the same one wait for it, and get its
/// answer.
#[derive(Default)]
pub struct Adoption {
    done: Notify,
    failed: Cell<Option<(u16, &'static str)>>,
}

/// Ends an adoption's entry in the table of adoptions in flight, and wakes whoever waits
/// for the same session.
struct Adopting<'a> {
    server: &'a Server,
    id: Rc<str>,
    adoption: Rc<Adoption>,
}

impl Drop for Adopting<'_> {
    fn drop(&mut self) {
        self.server.adopting.borrow_mut().remove(&self.id);
        self.adoption.done.notify_waiters();
    }
}

/// Takes up the session `req` names from the store: 404 if the store has no record of it
/// (or one that is not ours), 503 when the store cannot be read or too much is in flight.
pub async fn adopt(server: &Rc<Server>, req: &Request) -> Result<Rc<Session>, (u16, &'static str)> {
    const NOT_FOUND: (u16, &str) = (404, "Session not found");
    let Some(store) = server.shared.as_ref() else {
        return Err(NOT_FOUND);
    };
    let id = req
        .head
        .headers
        .get("mcp-session-id")
        .filter(|id| session_id::owner(id).is_some())
        .and_then(|id| std::str::from_utf8(id).ok())
        .ok_or(NOT_FOUND)?;
    let id: Rc<str> = Rc::from(id);
    // Another request of this worker is taking the same session up: wait for it.
    let waiting = server.adopting.borrow().get(&id).cloned();
    if let Some(adoption) = waiting {
        let notified = adoption.done.notified();
        if server.adopting.borrow().contains_key(&id) {
            notified.await;
        }
        let found = server.sessions.borrow().get(&id).cloned();
        return found.ok_or_else(|| adoption.failed.get().unwrap_or(NOT_FOUND));
    }
    if server.adopting.borrow().len() >= SHARED_SESSION_ADOPTIONS_MAX
        || server.sessions.borrow().len() >= SESSIONS_PER_WORKER_MAX
    {
        metrics::with(|m| m.overload_rejections += 1);
        return Err((503, "Service Unavailable: session table full"));
    }
    let adoption = Rc::new(Adoption::default());
    server
        .adopting
        .borrow_mut()
        .insert(id.clone(), adoption.clone());
    let _adopting = Adopting {
        server,
        id: id.clone(),
        adoption: adoption.clone(),
    };
    let result = take_up(server, store.as_ref(), id, req).await;
    if let Err(failure) = result {
        adoption.failed.set(Some(failure));
    }
    result
}

/// [`adopt`]'s work once it is the one adoption of `id` on this worker.
async fn take_up(
    server: &Rc<Server>,
    store: &dyn crate::store::Store,
    id: Rc<str>,
    req: &Request,
) -> Result<Rc<Session>, (u16, &'static str)> {
    const NOT_FOUND: (u16, &str) = (404, "Session not found");
    let record = match store.get(&key(&id)).await {
        Ok(Some(value)) => value,
        Ok(None) => return Err(NOT_FOUND),
        Err(e) => {
            metrics::with(|m| m.session_store_failures += 1);
            if store_log_due() {
                log::warn(format_args!(
                    "server {}: a shared session could not be looked up: {e}",
                    server.name
                ));
            }
            return Err((503, "Service Unavailable: the session store cannot be read"));
        }
    };
    let record = match decode(&record.bytes) {
        Ok(record) => record,
        Err(why) => {
            log::warn(format_args!(
                "server {}: the store holds {why} for a session id; answered as unknown",
                server.name
            ));
            return Err(NOT_FOUND);
        }
    };
    if let Some(session) = server.sessions.borrow().get(&id) {
        // Opened here meanwhile (an id from another worker of this node, handed over).
        return Ok(session.clone());
    }
    let hello = ClientHello {
        capabilities: record.capabilities.clone(),
        protocol_version: record.version,
        authorization: super::edge::authorization(req),
        adopt: record.handoff.clone(),
    };
    let begin = Begin::lifecycle(hello, Instant::now() + server.cfg.request_timeout);
    let (caller, callee) = stream::open(begin);
    server.exit.open(callee);
    let first = tokio::time::timeout(server.cfg.request_timeout, caller.reply.next()).await;
    let Ok(Some(Frame::Begin(reply))) = first else {
        let_go(&caller);
        log::warn(format_args!(
            "server {}: a shared session could not be taken up: its exit did not open it",
            server.name
        ));
        return Err((
            503,
            "Service Unavailable: the session could not be taken up",
        ));
    };
    if server.sessions.borrow().len() >= SESSIONS_PER_WORKER_MAX {
        // Filled up while the exit was asked.
        let_go(&caller);
        metrics::with(|m| m.overload_rejections += 1);
        return Err((503, "Service Unavailable: session table full"));
    }
    let link = Link::new(
        record.capabilities,
        reply.handoff.clone().or(record.handoff),
    );
    let session = Session::create(server, id, record.version, reply, caller, Some(link));
    metrics::with(|m| m.sessions_adopted += 1);
    // The record now names this node's handoff and activity too, unless the session was
    // deleted at another node since it was read: then it is gone here too.
    if write(server, &session, Write::Update, true).await == Written::Gone {
        session::end(server, &session, "deleted at another node", Ending::Detach);
        return Err(NOT_FOUND);
    }
    Ok(session)
}

/// Ends a lifecycle opened to take a session up without ending the session upstream: the
/// exit's sessions may be in use at other nodes.
fn let_go(caller: &stream::Caller) {
    let detach = Flush {
        id: None,
        event: Event::Detach,
    };
    let _ = caller.initial.try_flush(detach);
    caller.initial.end();
}

/// Lets go of every shared session held here (a drain): they live on at the other nodes.
/// One whose record was never written (the store was down when it opened) is known to no
/// other node: it ends.
pub fn detach_all(server: &Server) -> Vec<Rc<Session>> {
    let sessions: Vec<Rc<Session>> = server.sessions.borrow().values().cloned().collect();
    for s in &sessions {
        let recorded = s.shared.as_ref().is_some_and(|l| l.written.get().is_some());
        let ending = if recorded {
            Ending::Detach
        } else {
            Ending::End
        };
        session::end(server, s, "shutdown", ending);
    }
    sessions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_carry_no_credential() {
        let record = encode(
            "2025-11-25",
            br#"{"roots":{"listChanged":true}}"#,
            Some(br#"{"routes":{"a":{"session":"abc","version":"2025-06-18","caps":5}}}"#),
            1_700_000_000_000,
        )
        .expect("our own parts are JSON");
        let text = std::str::from_utf8(&record).expect("JSON text");
        assert!(!text.to_ascii_lowercase().contains("authorization"));
        let back = decode(&record).expect("ours");
        assert_eq!(back.version, "2025-11-25");
        assert_eq!(&back.capabilities[..], br#"{"roots":{"listChanged":true}}"#);
        assert_eq!(back.touched, 1_700_000_000_000);
        assert_eq!(back.by, node_tag());
        assert!(back.handoff.is_some());
        let none = encode("2025-06-18", b"{}", None, 1).expect("JSON");
        assert_eq!(decode(&none).expect("ours").handoff, None);
    }

    #[test]
    fn hostile_records_are_refused_not_used() {
        let big = format!(
            r#"{{"v":1,"version":"2025-11-25","capabilities":{{"x":"{}"}},"handoff":null,"touched":1,"by":1}}"#,
            "a".repeat(SHARED_SESSION_RECORD_BYTES_MAX)
        );
        for bad in [
            &b""[..],
            b"\xff\xfe",
            b"null",
            b"[]",
            b"{}",
            br#"{"v":2,"version":"2025-11-25","capabilities":{},"handoff":null,"touched":1,"by":1}"#,
            br#"{"v":1,"version":"1999-01-01","capabilities":{},"handoff":null,"touched":1,"by":1}"#,
            br#"{"v":1,"version":"2025-11-25\r\n","capabilities":{},"handoff":null,"touched":1,"by":1}"#,
            br#"{"v":1,"version":"2025-11-25","capabilities":[],"handoff":null,"touched":1,"by":1}"#,
            br#"{"v":1,"version":"2025-11-25","capabilities":"{}","handoff":null,"touched":1,"by":1}"#,
            br#"{"v":1,"version":"2025-11-25","capabilities":{},"handoff":null,"touched":-1,"by":1}"#,
            br#"{"v":1,"version":"2025-11-25","capabilities":{},"handoff":null,"by":1}"#,
            br#"{"v":1,"version":"2025-11-25","capabilities":{,"handoff":null,"touched":1,"by":1}"#,
            big.as_bytes(),
            br#"{"v":1,"version":"2025-11-25","capabilities":{},"handoff":null,"touched":1}"#,
        ] {
            assert!(
                decode(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(&bad[..bad.len().min(80)])
            );
        }
    }

    #[test]
    fn the_wall_clock_of_an_instant_is_now_less_its_age() {
        let now = unix_ms(Instant::now());
        let earlier = Instant::now()
            .checked_sub(Duration::from_secs(10))
            .map(unix_ms)
            .expect("a monotonic clock 10 s old");
        assert!(
            (9_900..=10_100).contains(&(now - earlier)),
            "{}",
            now - earlier
        );
    }
}
