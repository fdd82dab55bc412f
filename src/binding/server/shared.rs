//! Shared sessions (`sessions: { store }`): a session any node of a cluster can serve.
//!
//! The node that opens a session writes its record to the store under
//! `session:<binding>:<id>` before it answers `initialize`: the negotiated version, the
//! agent's capabilities, and the exit's handoff (what the exit needs to go on with its own
//! sessions: each route's upstream session id, version and capabilities). No credential is in it: a node that
//! takes a session up uses the `Authorization` of the request in hand.
//!
//! A node that gets a request for a session it does not hold, with an id of our format,
//! reads the record once and takes the session up ([`lookup::adopt`](super::lookup::adopt)): it opens the session's
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
//! - `DELETE` replaces the record with a tombstone that lasts as long as a record would,
//!   and ends the session; the other nodes holding it see the record gone through their
//!   watch and end their copies, and no write of theirs (an update on its way, or a first
//!   write whose answer was lost and is tried again) can make the record again: only a
//!   write over nothing makes one, and only a write over a record updates one. A `DELETE`
//!   whose tombstone cannot be written is answered 503, and the session is kept;
//! - the end at expiry deletes the record only if it is still the one the decision was
//!   taken on: a record written since means another node took the session up;
//! - a write whose answer never came (the store was slow, or the connection broke) may
//!   have landed: the session is then treated as known to other nodes;
//! - a drained node (SIGTERM) detaches every shared session: the others go on with them.
//!
//! Everything read from the store is outside input: a record is checked (format, version,
//! size) before it is used, and the exit checks the handoff it is given in turn.

use super::{PROTOCOL_VERSIONS, Server};
use crate::binding::server::metrics as server_metrics;
use crate::limits::{
    SHARED_SESSION_RECORD_BYTES_MAX, SHARED_SESSION_RECORD_GRACE,
    SHARED_SESSION_TOUCHES_PER_TIMEOUT,
};
use crate::log;
use crate::store::{Over, Put, Watch};
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
pub(super) fn store_log_due() -> bool {
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

/// The store key of session `id`'s record at server binding `binding` (`id` is of our
/// format: checked by the caller; binding names are `[A-Za-z0-9_-]`, so the key is
/// unambiguous). The binding is in it so that two bindings sharing one store never find
/// each other's sessions, whatever their `auth`.
pub fn key(binding: &str, id: &str) -> String {
    format!("session:{binding}:{id}")
}

/// What a node holding a shared session keeps to write its record.
pub struct Link {
    /// The agent's raw `capabilities` object.
    capabilities: Bytes,
    /// `auth`: the subject whose token opened the session (no credential: only who).
    owner: Option<Rc<str>>,
    /// The exit's latest handoff.
    handoff: RefCell<Option<Bytes>>,
    /// The activity last written to the record (and when it was written): the next write
    /// is due once there is newer activity and a touch interval has passed.
    written: Cell<Option<(Instant, Instant)>>,
    /// A write went out whose answer never came (a timeout, a connection lost under it),
    /// or the session was taken up from its record: the record may be (or is) in the
    /// store, and other nodes may hold the session.
    maybe_written: Cell<bool>,
    /// The agent asked this node to delete the session (`DELETE`): a record found gone
    /// from now on (this node's own tombstone, whose answer may have been lost) ends the
    /// session here with its upstream sessions, rather than letting go of them.
    delete_asked: Cell<bool>,
    /// The record must be written again (the handoff changed).
    stale: Cell<bool>,
    /// A write is in flight (at most one per session at a time from [`touch`]).
    writing: Cell<bool>,
    /// When the last write failed: the next is tried a touch interval later.
    failed_at: Cell<Option<Instant>>,
    /// A read of the record after its watch fired is in flight (one at a time).
    pub(super) checking: Cell<bool>,
    /// The latest recheck the exit asked for ([`crate::stream::Event::Recheck`]'s `seq`),
    /// and the latest one answered: a read answers the asks made before it began.
    pub(super) asked: Cell<u64>,
    pub(super) answered: Cell<u64>,
    /// Bumped by every handoff of this node's exit ([`Link::set_handoff`]): a read that
    /// began before one must not replace it with the record's older handoff.
    pub(super) generation: Cell<u64>,
    /// Wakes the session's task when the record changes at any node; taken by that task.
    pub(super) watch: RefCell<Option<Watch>>,
}

impl Link {
    /// True once the record has been written (another node can take the session up).
    pub fn recorded(&self) -> bool {
        self.written.get().is_some()
    }

    /// True if the record may be in the store: written, or a write of it went out without
    /// an answer. Such a session may be known to other nodes, so a record found gone
    /// means it was deleted (or lost), not that it was never written.
    pub fn maybe_recorded(&self) -> bool {
        self.recorded() || self.maybe_written.get()
    }

    /// True while a write of the record is in flight.
    pub fn writing(&self) -> bool {
        self.writing.get()
    }

    /// The session was taken up from its record: the record is in the store (this node
    /// read it), whether or not a write of this node's lands.
    pub fn taken_up(&self) {
        self.maybe_written.set(true);
    }

    /// The agent asked this node to delete the session (see `delete_asked`).
    pub fn ask_delete(&self) {
        self.delete_asked.set(true);
    }

    /// True once the agent asked this node to delete the session.
    pub fn delete_asked(&self) -> bool {
        self.delete_asked.get()
    }

    pub fn new(capabilities: Bytes, handoff: Option<Bytes>, owner: Option<Rc<str>>) -> Link {
        Link {
            capabilities,
            owner,
            handoff: RefCell::new(handoff),
            written: Cell::new(None),
            maybe_written: Cell::new(false),
            delete_asked: Cell::new(false),
            stale: Cell::new(true),
            writing: Cell::new(false),
            failed_at: Cell::new(None),
            checking: Cell::new(false),
            asked: Cell::new(0),
            answered: Cell::new(0),
            generation: Cell::new(0),
            watch: RefCell::new(None),
        }
    }

    /// The exit's latest handoff, as written to the record or read from it.
    pub fn handoff(&self) -> Option<Bytes> {
        self.handoff.borrow().clone()
    }

    /// Another node's handoff, read from the record: what this node writes from now on
    /// (its exit takes it up where it has routes closed), not a change to write.
    pub fn adopt_handoff(&self, handoff: Bytes) {
        *self.handoff.borrow_mut() = Some(handoff);
    }

    /// The exit's handoff changed: the record is written again.
    pub fn set_handoff(&self, handoff: Bytes) {
        *self.handoff.borrow_mut() = Some(handoff);
        self.stale.set(true);
        self.generation.set(self.generation.get().wrapping_add(1));
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
    /// `auth`: the subject the session belongs to.
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    owner: Option<Cow<'a, str>>,
    /// `auth`: the issuer of the owner's token (a subject is unique only per issuer).
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    issuer: Option<Cow<'a, str>>,
}

/// A record read back and checked.
#[derive(Debug, PartialEq, Eq)]
pub struct Record {
    pub version: &'static str,
    pub capabilities: Bytes,
    pub handoff: Option<Bytes>,
    pub touched: u64,
    pub by: u64,
    pub owner: Option<Rc<str>>,
    pub issuer: Option<Rc<str>>,
}

/// Writes a record; `None` if a part is not JSON (our own values: not expected) or the
/// record would be larger than any node reads ([`SHARED_SESSION_RECORD_BYTES_MAX`]: the
/// exit's handoffs, from what upstreams gave, are not bounded on their own).
fn encode(
    version: &str,
    capabilities: &[u8],
    handoff: Option<&[u8]>,
    touched: u64,
    owner: Option<(&str, &str)>,
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
        owner: owner.map(|(_, subject)| Cow::Borrowed(subject)),
        issuer: owner.map(|(issuer, _)| Cow::Borrowed(issuer)),
    };
    serde_json::to_vec(&json)
        .ok()
        .filter(|record| record.len() <= SHARED_SESSION_RECORD_BYTES_MAX)
        .map(Bytes::from)
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
        owner: json.owner.map(|o| Rc::from(&*o)),
        issuer: json.issuer.map(|i| Rc::from(&*i)),
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
    /// The session was opened here: the record is made, unless a `DELETE` left a
    /// tombstone (then it is gone). A record already there is this node's own earlier
    /// write, whose answer was lost: it is written over.
    Create,
    /// Over the record that is there only: a record that is gone was deleted (a `DELETE`
    /// at another node) and must not come back.
    Update,
}

/// What came of a write.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Written {
    Done,
    /// The record was deleted ([`Write::Update`] found none, or either found a
    /// tombstone): the session was ended elsewhere.
    Gone,
    /// The store failed (counted; logged if asked).
    Failed,
}

/// The issuer and subject a session belongs to, as its record names them (`auth` only).
fn owner_of<'a>(server: &'a Server, link: &'a Link) -> Option<(&'a str, &'a str)> {
    let issuer = server.gate.as_ref()?.guard.cfg.jwt.issuer.as_str();
    Some((issuer, link.owner.as_deref()?))
}

/// Writes the record of session `id` (negotiated `version`, last active at `active`) now,
/// from what `link` holds. A failure is counted, and logged when `loud` (the periodic
/// writes of many sessions to a store that is down would otherwise log one line each per
/// interval).
pub async fn write(
    server: &Server,
    id: &str,
    version: &str,
    link: &Link,
    active: Instant,
    how: Write,
    loud: bool,
) -> Written {
    let Some(store) = server.shared.as_ref() else {
        return Written::Done;
    };
    let record = encode(
        version,
        &link.capabilities,
        link.handoff.borrow().as_deref(),
        unix_ms(active),
        owner_of(server, link),
    );
    let Some(record) = record else {
        // Capabilities are bounded at `initialize`, but the exit's handoffs (one per route,
        // from what upstreams gave) are not: a record no node could read is not written.
        // The write [`touch`] took is over, and the next is tried an interval later (the
        // handoff may be smaller by then).
        link.writing.set(false);
        link.failed_at.set(Some(Instant::now()));
        server_metrics::with(|m| m.session_store_failures += 1);
        if loud && store_log_due() {
            log::warn(format_args!(
                "server {}: a shared session's record was not written: larger than {} bytes, or not JSON",
                server.name, SHARED_SESSION_RECORD_BYTES_MAX
            ));
        }
        return Written::Failed;
    };
    let stale = link.stale.replace(false);
    link.writing.set(true);
    let key = key(&server.name, id);
    let mut over = match how {
        Write::Create => Over::Nothing,
        Write::Update => Over::Value,
    };
    let written = loop {
        let put = store
            .put_for(&key, record.clone(), record_ttl(server), over)
            .await;
        match put {
            // This node's earlier write landed although its answer was lost: the record
            // is there, and is written over (once: a value cannot be missing and there).
            Ok(Put::Taken) if over == Over::Nothing => over = Over::Value,
            put => break put,
        }
    };
    link.writing.set(false);
    match written {
        Ok(Put::Written(_)) => {
            link.written.set(Some((active, Instant::now())));
            link.failed_at.set(None);
            Written::Done
        }
        Ok(Put::Missing | Put::Buried) => Written::Gone,
        Ok(Put::Taken) | Err(_) => {
            if let Err(e) = &written
                && e.maybe_done
            {
                link.maybe_written.set(true);
            }
            link.stale.set(stale || link.stale.get());
            link.failed_at.set(Some(Instant::now()));
            server_metrics::with(|m| m.session_store_failures += 1);
            if loud && store_log_due() {
                let why = match &written {
                    Err(e) => e.to_string(),
                    Ok(_) => "the store answered out of turn".to_owned(),
                };
                log::warn(format_args!(
                    "server {}: a shared session's record was not written: {why}",
                    server.name
                ));
            }
            Written::Failed
        }
    }
}

/// Whether the record of a session last active at `active` is due to be written now (the
/// handoff changed, or there was activity since the last write and a touch interval has
/// passed; a write in flight or one that failed lately waits), and when to look again.
/// The session's task looks at least once per touch interval, so activity reaches the
/// record within about one interval of happening, whatever this node's own timers.
pub fn touch(server: &Server, link: &Link, active: Instant) -> (bool, Instant) {
    let now = Instant::now();
    let interval = touch_interval(server);
    if link.writing.get() {
        return (false, now + interval);
    }
    if let Some(failed) = link.failed_at.get()
        && now < failed + interval
    {
        return (false, failed + interval);
    }
    let due = match link.written.get() {
        Some((written, at)) if !link.stale.get() => {
            if now < at + interval {
                return (false, at + interval);
            }
            active > written
        }
        _ => true,
    };
    if due {
        // Taken for the write the caller starts now.
        link.writing.set(true);
    }
    (due, now + interval)
}

/// What came of [`forget`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forgot {
    /// The record is deleted: a tombstone stands in its place for the record's time to
    /// live, so no late or stale write (from a node that had not heard yet) makes it again.
    Done,
    /// The record was written again since the version given was read (another node took
    /// the session up): it is left alone.
    Moved,
    /// The store failed (counted; logged at most every [`STORE_LOG_SPACING`]).
    Failed,
}

/// Deletes session `id`'s record: for a `DELETE` (`read`: `None`, whatever is there), or
/// for the cluster-wide end at expiry (`read`: the version the decision was taken on; a
/// record written since is left alone).
pub async fn forget(server: &Server, id: &str, read: Option<u64>) -> Forgot {
    let Some(store) = server.shared.as_ref() else {
        return Forgot::Done;
    };
    match store
        .bury(&key(&server.name, id), record_ttl(server), read)
        .await
    {
        Ok(true) => Forgot::Done,
        Ok(false) => Forgot::Moved,
        Err(e) => {
            server_metrics::with(|m| m.session_store_failures += 1);
            if store_log_due() {
                log::warn(format_args!(
                    "server {}: a shared session's record was not deleted: {e}",
                    server.name
                ));
            }
            Forgot::Failed
        }
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

/// Session `id` has been idle here for the session timeout: ends it for the cluster if no
/// node used it within the timeout either (the caller then deletes its record, if it is
/// still of the version returned: see [`forget`]), else lets go of it here.
/// A store that cannot be read detaches (another node may be using it; the record's own
/// time to live ends it in the store).
pub async fn at_expiry(server: &Server, id: &str) -> (Ending, Option<u64>) {
    let Some(store) = server.shared.as_ref() else {
        return (Ending::End, None);
    };
    let (record, read) = match store.get(&key(&server.name, id)).await {
        Ok(None) => return (Ending::End, None),
        Ok(Some(value)) => (decode(&value.bytes), value.version),
        Err(e) => {
            server_metrics::with(|m| m.session_store_failures += 1);
            if store_log_due() {
                log::warn(format_args!(
                    "server {}: a shared session expired here while its record could not \
                     be read ({e}); letting it go here only",
                    server.name
                ));
            }
            return (Ending::Detach, None);
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
            (Ending::Detach, None)
        }
        _ => (Ending::End, Some(read)),
    }
}

/// What the store holds for a session, read after its watch fired.
pub enum Looked {
    /// Its record, with the handoff in it (another node may have opened routes).
    Recorded(Option<Bytes>),
    /// No record: a `DELETE` at another node removed it (or the store lost it). The
    /// caller lets go of its copy without ending anything upstream: the node that deleted
    /// it ended the upstream sessions, and a store that lost its data (a Redis restarted
    /// empty) must not make every node end every session upstream.
    Gone,
    /// The store could not be read, or the record is not ours: the session is kept.
    Unknown,
}

/// Reads session `id`'s record (see [`Looked`]).
pub async fn look(server: &Server, id: &str) -> Looked {
    let Some(store) = server.shared.as_ref() else {
        return Looked::Unknown;
    };
    match store.get(&key(&server.name, id)).await {
        Ok(None) => Looked::Gone,
        Ok(Some(value)) => match decode(&value.bytes) {
            Ok(record) => Looked::Recorded(record.handoff),
            Err(_) => Looked::Unknown,
        },
        Err(_) => Looked::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::SESSION_CAPABILITIES_BYTES_MAX;

    #[test]
    fn records_round_trip_and_carry_no_credential() {
        let record = encode(
            "2025-11-25",
            br#"{"roots":{"listChanged":true}}"#,
            Some(br#"{"routes":{"a":{"session":"abc","version":"2025-06-18","caps":5}}}"#),
            1_700_000_000_000,
            Some(("https://login.example.com", "alice \"x\"")),
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
        assert_eq!(back.owner.as_deref(), Some("alice \"x\""));
        assert_eq!(back.issuer.as_deref(), Some("https://login.example.com"));
        let none = encode("2025-06-18", b"{}", None, 1, None).expect("JSON");
        assert_eq!(decode(&none).expect("ours").owner, None);
        assert_eq!(decode(&none).expect("ours").handoff, None);
    }

    /// What no node would read back is not written: a record whose handoff (from what
    /// upstreams gave) makes it larger than any node reads.
    #[test]
    fn a_record_larger_than_any_node_reads_is_not_made() {
        let caps = format!(
            r#"{{"x":"{}"}}"#,
            "c".repeat(SESSION_CAPABILITIES_BYTES_MAX - 8)
        );
        assert!(encode("2025-11-25", caps.as_bytes(), None, 1, None).is_some());
        let handoff = format!(
            r#"{{"routes":{{"a":"{}"}}}}"#,
            "h".repeat(SHARED_SESSION_RECORD_BYTES_MAX)
        );
        assert!(encode("2025-11-25", b"{}", Some(handoff.as_bytes()), 1, None).is_none());
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
