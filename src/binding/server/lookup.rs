//! Finding the session a request names: held on this worker, or (a shared session,
//! `sessions: { store }`) taken up from the store when this node does not hold it; and the
//! ends that concern the cluster: `DELETE`, which ends a session everywhere, and a drain,
//! which lets go of shared sessions here only.
//!
//! Invariants: a worker takes a session up once however many requests name it at the same
//! time (the later ones wait for the first); at most [`SHARED_SESSION_ADOPTIONS_MAX`] are
//! taken up at once per worker; a lifecycle opened to take a session up is never ended in a
//! way that deletes its upstream sessions (they may be in use at other nodes).

use super::auth::Identity;
use super::edge::http_error;
use super::net::Request;
use super::session::{self, Session};
use super::shared::{self, Ending, Link, Write, Written, decode, key, store_log_due};
use super::sink::Sink;
use super::{Server, session_id};
use crate::binding::server::metrics::{self as server_metrics, REJECTED_SUBJECT};
use crate::limits::{
    SESSIONS_PER_WORKER_MAX, SHARED_SESSION_ABSENT_KEPT, SHARED_SESSION_ABSENT_TTL,
    SHARED_SESSION_ADOPTIONS_MAX, SHARED_SESSION_ADOPTIONS_NODE_MAX,
};
use crate::runtime::notify::Notify;
use crate::stream::{self, Begin, ClientHello, Event, Flush, Frame};
use crate::{log, metrics};
use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

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
pub async fn find(
    server: &Rc<Server>,
    req: &Request,
    who: Option<&Identity>,
) -> Result<Rc<Session>, (u16, &'static str)> {
    let session = match lookup(server, req) {
        Err((404, _)) if server.shared.is_some() => Box::pin(adopt(server, req, who)).await,
        found => found,
    }?;
    // With `auth`, a session is found only by the subject it belongs to: another caller's
    // valid token gets the answer an unknown id gets.
    if let Some(who) = who
        && session.owner.as_deref() != Some(&*who.subject)
    {
        count_subject_refusal();
        return Err((404, "Session not found"));
    }
    Ok(session)
}

/// Counts a request refused because its session belongs to another subject.
fn count_subject_refusal() {
    server_metrics::count_rejected(REJECTED_SUBJECT);
}

/// The session a request names, checked and marked active: 400 without the session
/// header or with an unsupported `MCP-Protocol-Version`, 404 if unknown.
pub async fn session_for(
    server: &Rc<Server>,
    req: &Request,
    who: Option<&Identity>,
) -> Result<Rc<Session>, (u16, &'static str)> {
    let session = find_versioned(server, req, who).await?;
    session.touch();
    Ok(session)
}

/// [`find`], and the request's `MCP-Protocol-Version` checked.
async fn find_versioned(
    server: &Rc<Server>,
    req: &Request,
    who: Option<&Identity>,
) -> Result<Rc<Session>, (u16, &'static str)> {
    let session = find(server, req, who).await?;
    if !Server::version_ok(req) {
        return Err((400, "Bad Request: unsupported MCP-Protocol-Version"));
    }
    Ok(session)
}

/// DELETE: terminates the session.
pub async fn delete(server: Rc<Server>, req: Request, sink: Sink, who: Option<Rc<Identity>>) {
    let session = match find_versioned(&server, &req, who.as_deref()).await {
        Ok(s) => s,
        Err((status, message)) => return http_error(sink, status, message, None).await,
    };
    // A shared session ends everywhere: its record goes first (a tombstone), so no node
    // takes it up again or writes it back, and the nodes holding it are told through
    // their watch. A record that could not be deleted would keep the session alive at
    // the other nodes: the agent is told to try again, and the session is kept here so
    // that its retry finds it. Only a record surely never written (the store was down
    // since the session opened here, and no write is in flight) is known to no other
    // node: then the session ends here alone.
    // Asked first: this node's own watch may see the tombstone before `forget` returns,
    // and the session must then end with its upstream sessions, not just be let go of.
    if let Some(link) = session.shared.as_ref() {
        link.ask_delete();
        let forgot = shared::forget(&server, &session.id, None).await;
        if forgot == shared::Forgot::Failed && (link.maybe_recorded() || link.writing()) {
            let message = "Service Unavailable: the session store cannot be written; try again";
            return http_error(sink, 503, message, None).await;
        }
    }
    session::close(&server, &session, "deleted");
    let _ = sink.respond(200, &[], b"").await;
}

/// One session being taken up: requests for the same one wait for it, and get its
/// answer.
#[derive(Default)]
pub struct Adoption {
    done: Notify,
    failed: Cell<Option<(u16, &'static str)>>,
}

/// Ends an adoption's entry in the table of adoptions in flight, gives back its place in
/// the process's count, and wakes whoever waits for the same session.
struct Adopting<'a> {
    server: &'a Server,
    id: Rc<str>,
    adoption: Rc<Adoption>,
    _place: Place<'static>,
}

impl Drop for Adopting<'_> {
    fn drop(&mut self) {
        self.server.adopting.borrow_mut().remove(&self.id);
        self.adoption.done.notify_waiters();
    }
}

/// A count of things in flight across threads, up to a bound.
struct Places {
    taken: AtomicUsize,
    max: usize,
}

/// One place taken in [`Places`], given back when dropped.
struct Place<'a>(&'a Places);

impl Places {
    const fn new(max: usize) -> Places {
        Places {
            taken: AtomicUsize::new(0),
            max,
        }
    }

    /// Takes a place; `None` when all are taken.
    fn take(&self) -> Option<Place<'_>> {
        self.taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| Place(self))
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.taken.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Adoptions in flight in the whole process ([`SHARED_SESSION_ADOPTIONS_NODE_MAX`]).
static ADOPTIONS: Places = Places::new(SHARED_SESSION_ADOPTIONS_NODE_MAX);

/// Takes up the session `req` names from the store: 404 if the store has no record of it
/// (or one that is not ours), 503 when the store cannot be read or too much is in flight.
pub async fn adopt(
    server: &Rc<Server>,
    req: &Request,
    who: Option<&Identity>,
) -> Result<Rc<Session>, (u16, &'static str)> {
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
    if server.absent.borrow_mut().holds(id, Instant::now()) {
        server_metrics::with(|m| m.sessions_absent_remembered += 1);
        return Err(NOT_FOUND);
    }
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
    let place = match server.adopting.borrow().len() >= SHARED_SESSION_ADOPTIONS_MAX
        || server.sessions.borrow().len() + server.opening.get() >= SESSIONS_PER_WORKER_MAX
    {
        true => None,
        false => ADOPTIONS.take(),
    };
    let Some(place) = place else {
        metrics::with(|m| m.overload_rejections += 1);
        return Err((503, "Service Unavailable: session table full"));
    };
    let adoption = Rc::new(Adoption::default());
    server
        .adopting
        .borrow_mut()
        .insert(id.clone(), adoption.clone());
    let _adopting = Adopting {
        server,
        id: id.clone(),
        adoption: adoption.clone(),
        _place: place,
    };
    let result = take_up(server, store.as_ref(), id, req, who).await;
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
    who: Option<&Identity>,
) -> Result<Rc<Session>, (u16, &'static str)> {
    const NOT_FOUND: (u16, &str) = (404, "Session not found");
    let record = match store.get(&key(&server.name, &id)).await {
        Ok(Some(value)) => value,
        Ok(None) => {
            server.absent.borrow_mut().add(id, Instant::now());
            return Err(NOT_FOUND);
        }
        Err(e) => {
            server_metrics::with(|m| m.session_store_failures += 1);
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
    let issuer = server
        .gate
        .as_ref()
        .map(|g| g.guard.cfg.jwt.issuer.as_str());
    if !owner_matches(issuer, &record, who.map(|w| &*w.subject)) {
        count_subject_refusal();
        return Err(NOT_FOUND);
    }
    if let Some(session) = server.sessions.borrow().get(&id) {
        // Opened here meanwhile (an id from another worker of this node, handed over).
        return Ok(session.clone());
    }
    let hello = ClientHello {
        capabilities: record.capabilities.clone(),
        protocol_version: record.version,
        authorization: super::edge::authorization(req),
        adopt: record.handoff.clone(),
        shared: true,
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
    if server.sessions.borrow().len() + server.opening.get() >= SESSIONS_PER_WORKER_MAX {
        // Filled up while the exit was asked.
        let_go(&caller);
        metrics::with(|m| m.overload_rejections += 1);
        return Err((503, "Service Unavailable: session table full"));
    }
    let owner = record.owner.clone();
    let link = Link::new(
        record.capabilities,
        reply.handoff.clone().or(record.handoff),
        record.owner,
    );
    // Read from the store: other nodes know it, even if this node's first write fails.
    link.taken_up();
    let session = Session::create(server, id, record.version, reply, caller, Some(link), owner);
    server_metrics::with(|m| m.sessions_adopted += 1);
    // The record now names this node's handoff and activity too, unless the session was
    // deleted at another node since it was read: then it is gone here too.
    if session.write_record(server, Write::Update, true).await == Written::Gone {
        session::end(server, &session, "deleted at another node", Ending::Detach);
        return Err(NOT_FOUND);
    }
    Ok(session)
}

/// Whether the caller (subject `who`) may take up the session `record` describes, at a
/// binding whose `auth` trusts tokens of `issuer` (`None`: no `auth`). With `auth`, only
/// the owner the record names (issuer and subject) does: another caller's token must not
/// reach the exit, nor move the record, nor keep it alive; a record without an owner
/// (written without `auth`) is no one's here. Without `auth`, a record with an owner (a
/// binding with `auth` wrote it) is no one's either: this binding cannot tell who calls.
fn owner_matches(issuer: Option<&str>, record: &shared::Record, who: Option<&str>) -> bool {
    let Some(issuer) = issuer else {
        return record.owner.is_none() && record.issuer.is_none();
    };
    match who {
        Some(who) => {
            record.owner.as_deref() == Some(who) && record.issuer.as_deref() == Some(issuer)
        }
        // Not expected (a binding with `auth` checks every request first).
        None => record.owner.is_none(),
    }
}

/// Shared session ids the store was just found not to hold
/// ([`SHARED_SESSION_ABSENT_KEPT`], each for [`SHARED_SESSION_ABSENT_TTL`]): a repeated one
/// is answered 404 without a store read. Only a store's plain "no record" is kept: a read
/// that failed, or a record of another subject's, is asked again.
///
/// Invariant: `ids.len() <= SHARED_SESSION_ABSENT_KEPT`, ordered by expiry (every entry
/// lives the same time), so the expired ones are at the front.
#[derive(Default)]
pub struct Absent {
    ids: VecDeque<(Rc<str>, Instant)>,
}

impl Absent {
    /// Whether `id` was found absent less than [`SHARED_SESSION_ABSENT_TTL`] ago.
    fn holds(&mut self, id: &str, now: Instant) -> bool {
        while self.ids.front().is_some_and(|(_, until)| *until <= now) {
            self.ids.pop_front();
        }
        self.ids.iter().any(|(kept, _)| **kept == *id)
    }

    /// Remembers `id` as absent from now, forgetting the oldest when full.
    fn add(&mut self, id: Rc<str>, now: Instant) {
        if self.ids.len() == SHARED_SESSION_ABSENT_KEPT {
            self.ids.pop_front();
        }
        self.ids.push_back((id, now + SHARED_SESSION_ABSENT_TTL));
        assert!(self.ids.len() <= SHARED_SESSION_ABSENT_KEPT);
    }
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
        // A record whose write got no answer may be there, and the session in use at
        // another node: it is let go of, not ended.
        let recorded = s.shared.as_ref().is_some_and(Link::maybe_recorded);
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
    fn places_are_taken_up_to_the_bound_and_given_back_when_dropped() {
        let places = Places::new(2);
        let a = places.take();
        let b = places.take();
        assert!(a.is_some() && b.is_some());
        assert!(places.take().is_none(), "a third place past a bound of 2");
        drop(a);
        let c = places.take();
        assert!(c.is_some(), "a place given back is taken again");
        assert!(places.take().is_none());
        drop((b, c));
        assert_eq!(places.taken.load(Ordering::Acquire), 0);
    }

    #[test]
    fn absent_ids_are_kept_for_their_time_and_up_to_the_bound() {
        let mut absent = Absent::default();
        let t0 = Instant::now();
        absent.add(Rc::from("a"), t0);
        assert!(absent.holds("a", t0));
        assert!(!absent.holds("b", t0));
        assert!(absent.holds("a", t0 + SHARED_SESSION_ABSENT_TTL / 2));
        assert!(!absent.holds("a", t0 + SHARED_SESSION_ABSENT_TTL));
        assert!(absent.ids.is_empty(), "an expired id is forgotten");
        for n in 0..SHARED_SESSION_ABSENT_KEPT + 10 {
            absent.add(Rc::from(n.to_string()), t0);
        }
        assert_eq!(absent.ids.len(), SHARED_SESSION_ABSENT_KEPT);
        assert!(!absent.holds("0", t0), "the oldest goes first");
        assert!(absent.holds(&(SHARED_SESSION_ABSENT_KEPT + 9).to_string(), t0));
    }

    /// Two bindings sharing a store never find each other's sessions, and a record is
    /// taken up only by the owner it names: issuer and subject, and with `auth` only.
    #[test]
    fn records_are_scoped_to_their_binding_and_owner() {
        assert_ne!(key("north", "s"), key("south", "s"));
        let record = |owner: Option<&str>, issuer: Option<&str>| shared::Record {
            version: "2025-11-25",
            capabilities: bytes::Bytes::from_static(b"{}"),
            handoff: None,
            touched: 1,
            by: 1,
            owner: owner.map(Rc::from),
            issuer: issuer.map(Rc::from),
        };
        let iss = Some("https://a.example");
        let alice = record(Some("alice"), iss);
        assert!(owner_matches(iss, &alice, Some("alice")));
        assert!(!owner_matches(iss, &alice, Some("bob")));
        assert!(!owner_matches(
            Some("https://b.example"),
            &alice,
            Some("alice")
        ));
        assert!(!owner_matches(
            iss,
            &record(Some("alice"), None),
            Some("alice")
        ));
        assert!(!owner_matches(iss, &record(None, None), Some("alice")));
        // Without `auth`: an owned record is no one's; an unowned one is anyone's.
        assert!(!owner_matches(None, &alice, None));
        assert!(owner_matches(None, &record(None, None), None));
    }
}
