//! Proxy sessions: one agent session, and one lifecycle stream to each of its routes.
//!
//! [`serve`] opens every route's session in parallel when the agent initializes, answers
//! with the union of what the routes serve, and then runs the session's one relay task:
//! it reads every open route's lifecycle reply (events), the caller's challenges (resume,
//! suspended, answers to server-to-client requests) and the caller's initial direction
//! (the agent's notifications, the end of the session), polling all of them from one
//! `poll_fn` so a session costs one task however many routes it has. It is also the only
//! task that sends on the caller's lifecycle reply.
//!
//! A route that fails to open is skipped; the session works without it and the next
//! request that needs it opens it again ([`ProxySession::route`]). A route that comes back
//! later makes the agent re-list (`list_changed`).
//!
//! Events: with several routes every event id becomes the aggregate of the routes' last
//! ids ([`super::event_id`]); a resume is split back into per-route resumes and answered
//! once every asked route has answered, so the caller's stream starts after all of the
//! old flow.
//!
//! Shared sessions: the reply's handoff names each open route's own handoff by the
//! route's label (`{"routes":{"<label>":<handoff>}}`). A session taken up at another node
//! ([`ClientHello::adopt`]) opens the routes named there from their handoffs (no upstream
//! round trip) and leaves the others closed until a request needs them. A caller that
//! detaches ([`Event::Detach`]) has every open route detach in turn.

use super::{Proxy, Route, cache, fail, internal, join_all, rename};
use crate::binding::proxy::metrics as proxy_metrics;
use crate::limits::{EVENTS_PROBE_TIMEOUT, EXIT_EVENT_ID_BYTES_MAX, SHARED_SESSION_RECHECK_WAIT};
use crate::log;
use crate::metrics;
use crate::runtime::notify::Notify;
use crate::stream::{
    self, Begin, Callee, Caller, Caps, Challenge, ClientHello, Event, Flush, Frame, ListKind,
    ReplyBegin, Reset, SenderHandle, Throttle,
};
use bytes::Bytes;
use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// A route that failed is not reopened by list requests or resumes for this long (an item
/// request for it always tries again).
const ROUTE_RETRY_BACKOFF: Duration = Duration::from_secs(1);

/// Where one route of a session is.
enum RouteState {
    /// Not open: never tried, failed (`failure`, at `since`), or its session ended.
    Closed {
        failure: Option<Reset>,
        since: Option<Instant>,
    },
    /// Being opened by some task; others wait on `ProxySession::changed`.
    Opening,
    Open(Rc<RouteLife>),
}

/// An open route session.
pub struct RouteLife {
    /// The route exit's id for this session (sent in request `Begin`s).
    pub session: Rc<str>,
    /// What the route serves.
    pub caps: Caps,
    instructions: Option<Bytes>,
    /// What another node needs to take this route's session up, if the route gave it
    /// (renewed by the route's [`Event::Handoff`]).
    handoff: RefCell<Option<Bytes>>,
    /// The lifecycle stream to the route.
    caller: Caller,
}

/// The state of a resume (the agent opening its GET stream) across the routes.
#[derive(Default)]
struct Round {
    /// `waiting[i]`: route i was asked and has not answered yet.
    waiting: Vec<bool>,
    /// Some route answered that it has an event stream.
    any_yes: bool,
    /// The caller has had its answer for this round.
    answered: bool,
    /// What the caller was told last: `Some(true)` resumable, `Some(false)` no event
    /// stream, `None` before the first resume.
    told: Option<bool>,
    /// A route that has not answered by then is answered for (as without events).
    deadline: Option<Instant>,
}

impl Round {
    /// True while some asked route has yet to answer. Meanwhile only those routes are
    /// read: events of a route that answered wait in its stream, since they belong after
    /// the caller's answer (the caller's stream starts there).
    fn open(&self) -> bool {
        !self.answered && self.waiting.iter().any(|w| *w)
    }
}

/// One agent session of the proxy.
pub struct ProxySession {
    pub id: Rc<str>,
    /// The agent's raw capabilities and protocol version, for every route session.
    capabilities: Bytes,
    version: &'static str,
    /// The agent's latest `Authorization` header (renewed by its requests), for routes
    /// whose client forwards it. Never logged.
    authorization: RefCell<Option<Bytes>>,
    routes: Vec<RefCell<RouteState>>,
    /// Each route's last event id: the parts of the aggregate id.
    event_ids: RefCell<Vec<Option<Rc<str>>>>,
    /// The id the caller's events carry now: the aggregate of `event_ids` (several routes)
    /// or the one route's last id.
    aggregate: RefCell<Option<Rc<str>>>,
    /// `pending_resume[i]`: resume route i from this id once it opens.
    pending_resume: RefCell<Vec<Option<Option<Rc<str>>>>>,
    /// A shared session: `adoptable[i]` is route i's handoff from another node that opened
    /// it while this node had it closed; the next opening takes it up instead of opening a
    /// new upstream session.
    adoptable: RefCell<Vec<Option<Bytes>>>,
    round: RefCell<Round>,
    /// The caller has been answered: routes opened from now on are news to the agent.
    answered: Cell<bool>,
    closed: Cell<bool>,
    /// Woken when a route's state changes (tasks waiting for an opening route).
    changed: Notify,
    /// Whether the relay task waits with nothing to do, and the waker its inputs hold.
    relay: Arc<RelayWake>,
    relay_waker: Waker,
    /// Another task asked something of the relay task.
    poked: Cell<bool>,
    /// The caller's reply direction, while the relay task runs: while the relay waits with
    /// nothing to do, news for the caller goes straight onto it instead of through a
    /// wake-up of the relay task, which would only pass it on. At a list change every
    /// session of the worker is told, so this saves a task's wake and poll per session.
    direct: RefCell<Option<SenderHandle>>,
    /// Lists to announce as changed (a route came back, a cached list changed).
    list_changed: Cell<[bool; 3]>,
    /// The cache's own session ([`Lists::Hydrating`]): per list kind, the routes whose
    /// `list_changed` came since the hydrator last took them, so that it lists those
    /// routes again and not every route.
    changed_routes: Cell<[cache::Routes; 3]>,
    /// With a cache: the routes whose items this session may not see, because they forward
    /// the agent's credential and have not accepted this session's (see `cache`).
    hidden: Cell<cache::Routes>,
    /// With a cache, for a session that fell back to live lists: per cached kind, the
    /// CRC32C of the last list it was shown (what the first cached value is compared to).
    shown: Cell<[Option<u32>; 4]>,
    /// Rises each time the agent's `Authorization` changes: a route that refused the old
    /// one may accept the new one.
    credential: Cell<u64>,
    /// A task retries the hidden forwarding routes ([`readmit`]); at most one per session.
    readmitting: Cell<bool>,
    /// Where this session's lists come from: the one place a session asks whether there
    /// is a cache and whose session it is.
    pub lists: Lists,
    /// The caller detached: the routes' sessions live on at another node.
    detached: Cell<bool>,
    /// The session was taken up from another node's handoff.
    adopted: Cell<bool>,
    /// A route opened, ended or renewed its handoff since the caller was answered: the
    /// relay sends the caller the session's new handoff.
    handoff_changed: Cell<bool>,
    /// The caller's session is shared with other nodes: a route's first opening here asks
    /// for the record again ([`Event::Recheck`]) before it opens an upstream session.
    shared: bool,
    /// Routes whose first opening here asked already (bit i: route i), and routes waiting
    /// for that answer now.
    rechecked: Cell<cache::Routes>,
    awaiting_recheck: Cell<cache::Routes>,
    /// The latest recheck asked (the relay task sends it as [`Event::Recheck`] when it is
    /// past `recheck_sent`), and the latest the caller answered ([`Event::Rechecked`]).
    recheck_asked: Cell<u64>,
    recheck_sent: Cell<u64>,
    recheck_answered: Cell<u64>,
}

/// Where a session's lists come from. Decided when the session opens, this is the one
/// seam between the list cache and a session: every place that behaves differently with a
/// cache asks this, not whether the proxy has one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lists {
    /// No cache: lists are asked of the routes, and a route's `list_changed` goes to the
    /// agent as it comes.
    Live,
    /// An agent's session in front of a cache: lists come from the store (live only while
    /// the cache was not ready), routes open at first use, and the cache alone announces
    /// list changes, once and only real ones.
    Cached,
    /// The cache's own session (hydration): every route opened at once, lists asked of
    /// the routes, their `list_changed` passed on to trigger a refresh; never shared with
    /// other nodes, never told of list changes.
    Hydrating,
}

impl ProxySession {
    /// Route `index` said its `list` changed ([`Lists::Hydrating`]).
    fn mark_changed_route(&self, list: ListKind, index: usize) {
        let mut changed = self.changed_routes.get();
        if let Some(routes) = changed.get_mut(list.index()) {
            *routes |= 1 << index;
        }
        self.changed_routes.set(changed);
    }

    /// The routes whose `list` changed since the last call ([`Lists::Hydrating`]).
    pub(super) fn take_changed_routes(&self, list: ListKind) -> cache::Routes {
        let mut changed = self.changed_routes.get();
        let routes = changed
            .get_mut(list.index())
            .map(std::mem::take)
            .unwrap_or_default();
        self.changed_routes.set(changed);
        routes
    }

    fn new(id: Rc<str>, hello: &ClientHello, routes: usize, lists: Lists) -> ProxySession {
        let relay = Arc::new(RelayWake {
            waiting: AtomicBool::new(false),
            task: Mutex::new(None),
        });
        ProxySession {
            lists,
            detached: Cell::new(false),
            adopted: Cell::new(false),
            handoff_changed: Cell::new(false),
            shared: hello.shared && lists != Lists::Hydrating,
            rechecked: Cell::new(0),
            awaiting_recheck: Cell::new(0),
            recheck_asked: Cell::new(0),
            recheck_sent: Cell::new(0),
            recheck_answered: Cell::new(0),
            id,
            capabilities: hello.capabilities.clone(),
            version: hello.protocol_version,
            authorization: RefCell::new(hello.authorization.clone()),
            routes: (0..routes)
                .map(|_| {
                    RefCell::new(RouteState::Closed {
                        failure: None,
                        since: None,
                    })
                })
                .collect(),
            event_ids: RefCell::new(vec![None; routes]),
            aggregate: RefCell::new(None),
            pending_resume: RefCell::new(vec![None; routes]),
            adoptable: RefCell::new(vec![None; routes]),
            round: RefCell::new(Round::default()),
            answered: Cell::new(false),
            closed: Cell::new(false),
            changed: Notify::new(),
            relay: relay.clone(),
            relay_waker: Waker::from(relay),
            poked: Cell::new(false),
            direct: RefCell::new(None),
            list_changed: Cell::new([false; 3]),
            changed_routes: Cell::new([0; 3]),
            hidden: Cell::new(0),
            shown: Cell::new([None; 4]),
            credential: Cell::new(0),
            readmitting: Cell::new(false),
        }
    }

    /// The routes whose items this session may not see (bit i: route i).
    pub fn hidden(&self) -> cache::Routes {
        self.hidden.get()
    }

    /// Records the CRC32C of a live list of `kind` this session was shown.
    pub fn shown(&self, kind: crate::stream::Kind, crc: u32) {
        let mut shown = self.shown.get();
        if let Some(at) = cache::slot(kind).and_then(|at| shown.get_mut(at)) {
            *at = Some(crc);
        }
        self.shown.set(shown);
    }

    /// The CRC32C of the last live list of the kind in cache slot `at` this session was
    /// shown, if any.
    pub fn shown_crc(&self, at: usize) -> Option<u32> {
        self.shown.get().get(at).copied().flatten()
    }

    /// Keeps the agent's latest `Authorization` header for routes opened from now on.
    /// True if it changed (see [`ProxySession::credential`]).
    pub fn renew_authorization(&self, header: Option<&Bytes>) -> bool {
        let Some(header) = header else {
            return false;
        };
        let mut held = self.authorization.borrow_mut();
        if held.as_ref() == Some(header) {
            return false;
        }
        *held = Some(header.clone());
        self.credential.set(self.credential.get() + 1);
        true
    }

    /// Tells the agent (once, however often it is asked before the relay runs) that `list`
    /// changed.
    pub fn announce(&self, list: ListKind) {
        // A relay task that waits, not woken since (a poke wakes it too), with no resume
        // round open (whose answer the agent's new GET stream starts after), has nothing
        // to send that this could overtake.
        if self.relay.waiting.load(Ordering::Relaxed)
            && !self.round.borrow().open()
            && let Some(direct) = self.direct.borrow().as_ref()
        {
            let flush = Flush {
                id: None,
                event: Event::ListChanged(list),
            };
            let same = |f: &Flush| matches!(f.event, Event::ListChanged(k) if k == list);
            if direct.try_flush_once(flush, same) {
                return;
            }
        }
        let mut lists = self.list_changed.get();
        if let Some(flag) = lists.get_mut(list.index()) {
            *flag = true;
        }
        self.list_changed.set(lists);
        self.poke();
    }

    /// Wakes the relay task.
    fn poke(&self) {
        self.poked.set(true);
        self.relay_waker.wake_by_ref();
    }

    /// The open session of route `index`, opening it first if it is not open. `force`
    /// tries a route that failed moments ago again (item requests); otherwise such a route
    /// answers with its last failure. Bounded by `deadline`.
    pub async fn route(
        self: &Rc<Self>,
        proxy: &Proxy,
        index: usize,
        force: bool,
        deadline: Instant,
    ) -> Result<Rc<RouteLife>, Reset> {
        // The common case: open already, nothing to wait for.
        if let Some(life) = self.open_life(index)
            && !self.closed.get()
        {
            return Ok(life);
        }
        loop {
            let changed = self.changed.notified();
            if self.closed.get() {
                return Err(internal("Session closed"));
            }
            let Some(slot) = self.routes.get(index) else {
                return Err(internal("Unreachable: no such route"));
            };
            match &*slot.borrow() {
                RouteState::Open(life) => return Ok(life.clone()),
                RouteState::Opening => {}
                RouteState::Closed { failure, since } => {
                    let recent = since.is_some_and(|t| t.elapsed() < ROUTE_RETRY_BACKOFF);
                    if recent && !force {
                        let failure = failure.clone();
                        return Err(failure.unwrap_or_else(|| internal("Toolkit unavailable")));
                    }
                }
            }
            if matches!(&*slot.borrow(), RouteState::Opening) {
                if tokio::time::timeout_at(deadline.into(), changed)
                    .await
                    .is_err()
                {
                    return Err(internal("Timed out waiting for the toolkit's session"));
                }
                continue;
            }
            // Boxed: rare, and far larger than the callers' own states.
            let adopt = self
                .adoptable
                .borrow_mut()
                .get_mut(index)
                .and_then(Option::take);
            return Box::pin(self.open(proxy, index, deadline, adopt)).await;
        }
    }

    /// Opens route `index`'s session (its state must not be `Opening`); with `adopt`, takes
    /// it up from that handoff of another node's.
    async fn open(
        self: &Rc<Self>,
        proxy: &Proxy,
        index: usize,
        deadline: Instant,
        adopt: Option<Bytes>,
    ) -> Result<Rc<RouteLife>, Reset> {
        let (Some(slot), Some(route)) = (self.routes.get(index), proxy.routes.get(index)) else {
            return Err(internal("Unreachable: no such route"));
        };
        *slot.borrow_mut() = RouteState::Opening;
        // Should this future be dropped before it is done (a hydration whose lease was
        // lost drops its work), the route must not stay `Opening` for good.
        let mut opening = Opening {
            session: self,
            index,
            done: false,
        };
        let adopt = match adopt {
            None => Box::pin(self.recheck(index, deadline)).await,
            adopt => adopt,
        };
        if self.closed.get() {
            // Closed while the record was read: no upstream session for a dead one.
            return Err(internal("Session closed"));
        }
        let hello = ClientHello {
            capabilities: self.capabilities.clone(),
            protocol_version: self.version,
            authorization: self.authorization.borrow().clone(),
            adopt,
            shared: false,
        };
        let begin = Begin::lifecycle(hello, deadline);
        let (caller, callee) = stream::open(begin);
        route.exit.open(callee);
        let first = tokio::time::timeout_at(deadline.into(), caller.reply.next()).await;
        let opened = match first {
            Ok(Some(Frame::Begin(reply))) => Ok(Rc::new(RouteLife {
                session: reply.session.unwrap_or_else(|| Rc::from("")),
                caps: reply.caps,
                instructions: reply.instructions,
                handoff: RefCell::new(reply.handoff),
                caller,
            })),
            Ok(_) => {
                let reset = match caller.initial.try_throttle() {
                    Some(Throttle::Reset(Reset::Plain)) | None => {
                        internal(&format!("Toolkit {} ended its session", route.label))
                    }
                    Some(Throttle::Reset(reset)) => reset,
                    Some(Throttle::Challenge(_)) => internal("Unreachable: challenge at open"),
                };
                caller.initial.abort();
                Err(reset)
            }
            Err(_) => {
                caller.initial.abort();
                Err(internal(&format!(
                    "Toolkit {} did not answer initialize in time",
                    route.label
                )))
            }
        };
        let result = match opened {
            Ok(life) if self.closed.get() => {
                // The agent went away meanwhile: end what was just opened.
                self.end_route(&life);
                Err(internal("Session closed"))
            }
            Ok(life) => {
                route.known_caps.set(life.caps);
                *slot.borrow_mut() = RouteState::Open(life.clone());
                // With a cache, lists are the cache's: a route opening changes none, unless
                // it accepted this session's credential only now (its items were hidden).
                let bit = 1 << index;
                let unhidden = self.hidden.get() & bit != 0;
                self.hidden.set(self.hidden.get() & !bit);
                self.on_opened(route, &life, self.lists == Lists::Live || unhidden);
                Ok(life)
            }
            Err(reset) => {
                *slot.borrow_mut() = RouteState::Closed {
                    failure: Some(reset.clone()),
                    since: Some(Instant::now()),
                };
                set_waiting(self, index, false);
                if matches!(reset, Reset::Bearer(_)) && self.admits_by_credential(proxy, index) {
                    // It refuses this session's credential now: its items are hidden again.
                    let bit = 1 << index;
                    let was_shown = self.hidden.get() & bit == 0;
                    self.hidden.set(self.hidden.get() | bit);
                    if was_shown && self.answered.get() {
                        self.lists_changed(route, route.known_caps.get());
                    }
                }
                Err(reset)
            }
        };
        opening.done = true;
        self.changed.notify_waiters();
        self.poke();
        result
    }

    /// A shared session's route opening here for the first time after the caller was
    /// answered: another node may have opened it moments ago, and its record may say so
    /// before this node's watch has. Asks the caller to read the record again and waits
    /// (bounded) for its answer; gives back the route's handoff if another node has one.
    /// Costs one store read per route and node, once; never for a session not shared.
    async fn recheck(&self, index: usize, deadline: Instant) -> Option<Bytes> {
        let bit: cache::Routes = 1 << index;
        if !self.shared || !self.answered.get() || self.rechecked.get() & bit != 0 {
            return None;
        }
        self.rechecked.set(self.rechecked.get() | bit);
        // Cleared however the wait ends, this future dropped included.
        let _awaiting = Awaiting::set(self, bit);
        let seq = self.recheck_asked.get() + 1;
        self.recheck_asked.set(seq);
        self.poke();
        let until = deadline.min(Instant::now() + SHARED_SESSION_RECHECK_WAIT);
        while self.recheck_answered.get() < seq && !self.closed.get() {
            let changed = self.changed.notified();
            if tokio::time::timeout_at(until.into(), changed)
                .await
                .is_err()
            {
                break;
            }
        }
        self.adoptable
            .borrow_mut()
            .get_mut(index)
            .and_then(Option::take)
    }

    /// True if route `index` shows this session its cached items only once it accepted the
    /// session's own credential (a cache, a forwarding route, an agent's session).
    fn admits_by_credential(&self, proxy: &Proxy, index: usize) -> bool {
        self.lists == Lists::Cached && proxy.cache.as_ref().is_some_and(|c| c.forwards(index))
    }

    /// Flags the lists a route with `caps` serves as changed for this session.
    fn lists_changed(&self, route: &Route, caps: Caps) {
        let mut lists = self.list_changed.get();
        let caps = route.mask(caps);
        lists[0] |= caps.contains(Caps::TOOLS);
        lists[1] |= caps.contains(Caps::PROMPTS);
        lists[2] |= caps.contains(Caps::RESOURCES);
        self.list_changed.set(lists);
    }

    /// A route opened: resume its events if the agent has asked for them, and once the
    /// agent was answered, tell it the lists may have grown (`lists_grow`: not when a cache
    /// owns the lists).
    fn on_opened(&self, route: &Route, life: &RouteLife, lists_grow: bool) {
        let pending = self
            .pending_resume
            .borrow_mut()
            .get_mut(route.index)
            .and_then(Option::take);
        let asked = self.round.borrow().told.is_some() || pending.is_some();
        if asked {
            let last_event_id = pending.flatten();
            if let Some(w) = self.round.borrow_mut().waiting.get_mut(route.index) {
                *w = true;
            }
            let _ = life
                .caller
                .reply
                .challenge(Challenge::Resume { last_event_id });
        }
        if lists_grow && self.answered.get() {
            self.lists_changed(route, life.caps);
        }
        if self.answered.get() {
            self.handoff_changed.set(true);
        }
    }

    /// The capabilities the agent is told: the union over routes (the last known ones for
    /// routes not open), minus what allow-lists exclude; `listChanged` wherever a route can
    /// change a list, which includes a route coming back.
    fn caps(&self, proxy: &Proxy) -> Caps {
        let mut missing = false;
        let per_route: Vec<Caps> = self
            .routes
            .iter()
            .zip(&proxy.routes)
            .map(|(slot, route)| match &*slot.borrow() {
                RouteState::Open(life) => life.caps,
                _ => {
                    missing = true;
                    route.known_caps.get()
                }
            })
            .collect();
        Self::union_caps(proxy, &per_route, missing)
    }

    /// The capabilities the agent is told from the cache's record of the routes (but for
    /// those it may not see): the cache announces every change of a list it serves.
    fn cached_caps(&self, proxy: &Proxy, routes: &[Caps]) -> Caps {
        for (route, caps) in proxy.routes.iter().zip(routes) {
            if *caps != Caps::empty() {
                route.known_caps.set(*caps);
            }
        }
        // The store's list may be longer than this node's routes (another config): only
        // the routes this node has are looked at.
        let seen: Vec<Caps> = routes
            .iter()
            .take(proxy.routes.len())
            .enumerate()
            .map(|(i, caps)| {
                if cache::has(self.hidden.get(), i) {
                    Caps::empty()
                } else {
                    *caps
                }
            })
            .collect();
        Self::union_caps(proxy, &seen, true)
    }

    /// The union of the routes' capabilities (`per_route[i]` is route i's), minus what
    /// allow-lists exclude; `list_changing` adds `listChanged` to every list served.
    fn union_caps(proxy: &Proxy, per_route: &[Caps], list_changing: bool) -> Caps {
        let mut caps = Caps::empty();
        for (route, route_caps) in proxy.routes.iter().zip(per_route) {
            caps = caps.union(route.mask(*route_caps));
        }
        if proxy.routes.len() > 1 {
            // Methods mcpyard does not know can only go where exactly one route serves.
            caps = Caps(caps.0 & !Caps::OTHER.0);
        }
        if list_changing {
            for (list, changed) in [
                (Caps::TOOLS, Caps::TOOLS_LIST_CHANGED),
                (Caps::PROMPTS, Caps::PROMPTS_LIST_CHANGED),
                (Caps::RESOURCES, Caps::RESOURCES_LIST_CHANGED),
            ] {
                if caps.contains(list) {
                    caps = caps.union(changed);
                }
            }
        }
        caps
    }

    /// Route `index`'s session, if it is open.
    fn open_life(&self, index: usize) -> Option<Rc<RouteLife>> {
        match &*self.routes.get(index)?.borrow() {
            RouteState::Open(life) => Some(life.clone()),
            _ => None,
        }
    }

    /// What route `index` serves, if it is open.
    pub fn open_caps(&self, index: usize) -> Option<Caps> {
        self.open_life(index).map(|life| life.caps)
    }

    /// The open routes, with their index.
    fn open_routes(&self) -> Vec<(usize, Rc<RouteLife>)> {
        self.routes
            .iter()
            .enumerate()
            .filter_map(|(i, slot)| match &*slot.borrow() {
                RouteState::Open(life) => Some((i, life.clone())),
                _ => None,
            })
            .collect()
    }

    /// What another node needs to take this session up: each open route's handoff by the
    /// route's label; `None` when no open route gave one.
    fn handoff(&self, proxy: &Proxy) -> Option<Bytes> {
        use serde_json::value::RawValue;
        #[derive(serde::Serialize)]
        struct Handoff<'a> {
            routes: std::collections::BTreeMap<&'a str, &'a RawValue>,
        }
        let given: Vec<(Rc<str>, Bytes)> = self
            .open_routes()
            .iter()
            .filter_map(|(index, life)| {
                let label = proxy.routes.get(*index)?.label.clone();
                Some((label, life.handoff.borrow().clone()?))
            })
            .collect();
        // Each route's handoff goes in as it came (checked to be JSON, not rebuilt).
        let routes: std::collections::BTreeMap<&str, &RawValue> = given
            .iter()
            .filter_map(|(label, raw)| {
                let text = std::str::from_utf8(raw).ok()?;
                Some((&**label, serde_json::from_str::<&RawValue>(text).ok()?))
            })
            .collect();
        if routes.is_empty() {
            return None;
        }
        serde_json::to_vec(&Handoff { routes })
            .ok()
            .map(Bytes::from)
    }

    /// Ends the session: every open route's lifecycle ends (its upstream session is
    /// deleted, or let be when the caller detached), routes still opening end theirs when
    /// they finish.
    /// Ends a route's lifecycle, or lets go of it (DETACH first) when this session lives on
    /// at another node, which may be using the route's upstream session.
    fn end_route(&self, life: &RouteLife) {
        if self.detached.get() {
            let detach = Flush {
                id: None,
                event: Event::Detach,
            };
            if !life.caller.initial.try_flush(detach) {
                metrics::with(|m| m.overload_rejections += 1);
            }
        }
        life.caller.initial.end();
    }

    /// True once the session's lifecycle ended here.
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    fn close(&self) {
        self.closed.set(true);
        for slot in &self.routes {
            let state = std::mem::replace(
                &mut *slot.borrow_mut(),
                RouteState::Closed {
                    failure: None,
                    since: None,
                },
            );
            match state {
                RouteState::Open(life) => self.end_route(&life),
                RouteState::Opening => *slot.borrow_mut() = RouteState::Opening,
                RouteState::Closed { .. } => {}
            }
        }
        self.changed.notify_waiters();
    }
}

/// A route being opened by [`ProxySession::open`]: if the opening is dropped before it is
/// done, the route is closed again (with no failure, so it is tried at once) and whoever
/// waits for it is woken.
/// Marks a route as waiting for a recheck's answer for as long as it lives.
struct Awaiting<'a> {
    session: &'a ProxySession,
    bit: cache::Routes,
}

impl<'a> Awaiting<'a> {
    fn set(session: &'a ProxySession, bit: cache::Routes) -> Awaiting<'a> {
        session
            .awaiting_recheck
            .set(session.awaiting_recheck.get() | bit);
        Awaiting { session, bit }
    }
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        let s = self.session;
        s.awaiting_recheck.set(s.awaiting_recheck.get() & !self.bit);
    }
}

struct Opening<'a> {
    session: &'a ProxySession,
    index: usize,
    done: bool,
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(slot) = self.session.routes.get(self.index) {
            let mut state = slot.borrow_mut();
            if matches!(&*state, RouteState::Opening) {
                *state = RouteState::Closed {
                    failure: None,
                    since: None,
                };
            }
        }
        self.session.changed.notify_waiters();
    }
}

/// Keeps a session in its proxy's table while its lifecycle task runs.
struct Registration {
    proxy: Rc<Proxy>,
    id: Rc<str>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.proxy.sessions.borrow_mut().remove(&*self.id);
    }
}

/// Serves one lifecycle stream from the agent's `initialize` to the session's end.
pub async fn serve(proxy: Rc<Proxy>, callee: Callee) {
    let lists = match proxy.cache {
        Some(_) => Lists::Cached,
        None => Lists::Live,
    };
    serve_as(proxy, callee, lists).await;
}

/// Serves the cache's hydration session: every route opened at once, lists never served
/// from the cache, routes' `list_changed` passed on (they trigger a refresh).
pub async fn serve_hydration(proxy: Rc<Proxy>, callee: Callee) {
    serve_as(proxy, callee, Lists::Hydrating).await;
}

async fn serve_as(proxy: Rc<Proxy>, callee: Callee, lists: Lists) {
    let Some(hello) = callee.begin.client.as_ref() else {
        return fail(
            &callee,
            internal("Lifecycle stream without the agent's hello"),
        );
    };
    let session = Rc::new(ProxySession::new(
        proxy.mint_session_id(),
        hello,
        proxy.routes.len(),
        lists,
    ));
    proxy
        .sessions
        .borrow_mut()
        .insert(session.id.clone(), session.clone());
    let _registration = Registration {
        proxy: proxy.clone(),
        id: session.id.clone(),
    };
    // Boxed: opening is far larger than the relay the task then lives in.
    let Some(reply) = Box::pin(start(&proxy, &session, &callee)).await else {
        return;
    };
    session.answered.set(true);
    if Box::pin(callee.reply.begin(reply)).await.is_ok() {
        relay(&proxy, &session, &callee).await;
    }
    session.relay.waiting.store(false, Ordering::Relaxed);
    session.direct.borrow_mut().take();
    session.close();
    callee.reply.end();
}

/// The answer to the caller's lifecycle, with the session's handoff: a session another
/// node opened is taken up where it can be, else the session opens as a new one.
async fn start(
    proxy: &Rc<Proxy>,
    session: &Rc<ProxySession>,
    callee: &Callee,
) -> Option<ReplyBegin> {
    let adopted = match callee
        .begin
        .client
        .as_ref()
        .and_then(|h| h.adopt.as_deref())
    {
        Some(raw) if session.lists != Lists::Hydrating => {
            adopting(proxy, session, callee, raw).await
        }
        _ => None,
    };
    let mut reply = match adopted {
        Some(reply) => {
            session.adopted.set(true);
            reply
        }
        None => opening(proxy, session, callee).await?,
    };
    reply.handoff = session.handoff(proxy);
    Some(reply)
}

/// The answer to the caller's lifecycle: from the cache (no route opened: they open when a
/// request needs them), or after opening every route at once. `None` if the caller has
/// been failed (no route could be opened).
async fn opening(
    proxy: &Rc<Proxy>,
    session: &Rc<ProxySession>,
    callee: &Callee,
) -> Option<ReplyBegin> {
    let deadline = callee.begin.deadline;
    if session.lists == Lists::Cached
        && let Some(cache) = proxy.cache.as_ref()
    {
        // With a cache the agent gets what the routes serve from the store, once every
        // list has been hydrated (or has failed once), without an upstream round trip.
        let bound = deadline.min(Instant::now() + cache.gate());
        if let Some(cached) = cache.wait_ready(bound).await {
            if !Box::pin(admit(proxy, session, callee, cache, deadline)).await {
                return None;
            }
            return Some(ReplyBegin {
                session: Some(session.id.clone()),
                caps: session.cached_caps(proxy, &cached.routes),
                instructions: cached_instructions(proxy, session, &cached.instructions),
                handoff: None,
            });
        }
        proxy_metrics::with(|m| m.cache.misses += 1);
        log::warn(format_args!(
            "proxy {}: cache not hydrated in time; opening the routes for this session",
            proxy.name
        ));
    }
    let opens = (0..proxy.routes.len()).map(|i| session.open(proxy, i, deadline, None));
    let opened = join_all(opens.collect()).await;
    for (route, result) in proxy.routes.iter().zip(&opened) {
        if let Err(reset) = result {
            if session.admits_by_credential(proxy, route.index) {
                // Once this session is served from the cache, this route's items stay
                // hidden from it until the route accepts its credential.
                session.hidden.set(session.hidden.get() | 1 << route.index);
            }
            proxy_metrics::with(|m| m.routes_skipped += 1);
            log::warn(format_args!(
                "proxy {}: toolkit {} skipped at initialize: {}",
                proxy.name,
                route.label,
                describe(reset)
            ));
        }
    }
    if opened.iter().all(Result::is_err) {
        // Nothing to serve: the agent gets the reason, a bearer challenge first (it can
        // act on that one), else the first route's.
        let reset = opened
            .into_iter()
            .filter_map(Result::err)
            .min_by_key(|r| !matches!(r, Reset::Bearer(_)));
        session.close();
        fail(callee, reset.unwrap_or_else(|| internal("No toolkit")));
        return None;
    }
    Some(ReplyBegin {
        session: Some(session.id.clone()),
        caps: session.caps(proxy),
        instructions: instructions(proxy, session),
        handoff: None,
    })
}

/// The routes a proxy handoff names, each with its own handoff; `None` if `raw` is not a
/// proxy's handoff.
fn route_handoffs(proxy: &Proxy, raw: &[u8]) -> Option<Vec<(usize, Bytes)>> {
    #[derive(serde::Deserialize)]
    struct Handoff<'a> {
        #[serde(borrow)]
        routes:
            std::collections::BTreeMap<std::borrow::Cow<'a, str>, &'a serde_json::value::RawValue>,
    }
    let handoff = serde_json::from_slice::<Handoff<'_>>(raw).ok()?;
    let named = proxy
        .routes
        .iter()
        .filter_map(|route| {
            let raw = handoff.routes.get(&*route.label)?;
            Some((route.index, Bytes::copy_from_slice(raw.get().as_bytes())))
        })
        .collect();
    Some(named)
}

/// A session another node opened, taken up from its handoff `raw`: the routes it names
/// open from their own handoffs (in parallel, bounded by the caller's deadline), the
/// others stay closed until a request needs them. `None` when nothing could be taken up
/// (a handoff that is not ours, or no route opened from it): the caller then opens the
/// session as a new one.
async fn adopting(
    proxy: &Rc<Proxy>,
    session: &Rc<ProxySession>,
    callee: &Callee,
    raw: &[u8],
) -> Option<ReplyBegin> {
    let deadline = callee.begin.deadline;
    let Some(named) = route_handoffs(proxy, raw) else {
        log::warn(format_args!(
            "proxy {}: a shared session's handoff is not a proxy's; opening the routes",
            proxy.name
        ));
        return None;
    };
    let opens = named
        .into_iter()
        .map(|(i, raw)| session.open(proxy, i, deadline, Some(raw)));
    let opened = join_all(opens.collect()).await;
    if !opened.iter().any(Result::is_ok) {
        return None;
    }
    let Some(cache) = proxy.cache.as_ref() else {
        return Some(ReplyBegin {
            session: Some(session.id.clone()),
            caps: session.caps(proxy),
            ..ReplyBegin::default()
        });
    };
    // Routes that forward the agent's credential show their cached items only once
    // they accepted it: those not taken up are hidden, as at the node that opened it.
    let hidden = (0..proxy.routes.len())
        .filter(|i| cache.forwards(*i) && session.open_life(*i).is_none())
        .fold(0, |set, i| set | 1 << i);
    session.hidden.set(hidden);
    let bound = deadline.min(Instant::now() + cache.gate());
    let caps = match cache.wait_ready(bound).await {
        Some(cached) => session.cached_caps(proxy, &cached.routes),
        None => session.caps(proxy),
    };
    Some(ReplyBegin {
        session: Some(session.id.clone()),
        caps,
        ..ReplyBegin::default()
    })
}

/// With a cache: opens every route that forwards the agent's credential with this
/// session's (in parallel, bounded by `deadline`), so that their cached items are shown to
/// it only if they accept it; the others stay hidden (see `cache`). When no route is left
/// to show, the caller is failed with the routes' refusal, a bearer challenge first, as
/// without a cache; returns false then.
async fn admit(
    proxy: &Rc<Proxy>,
    session: &Rc<ProxySession>,
    callee: &Callee,
    cache: &cache::Cache,
    deadline: Instant,
) -> bool {
    let forwarding: Vec<usize> = (0..proxy.routes.len())
        .filter(|i| cache.forwards(*i))
        .collect();
    if forwarding.is_empty() {
        return true;
    }
    session
        .hidden
        .set(forwarding.iter().fold(0, |set, i| set | 1 << i));
    let opens = forwarding
        .iter()
        .map(|i| session.open(proxy, *i, deadline, None));
    let opened = join_all(opens.collect()).await;
    let mut refusals = Vec::new();
    let mut unreached = false;
    for (index, result) in forwarding.iter().zip(opened) {
        if let (Err(reset), Some(route)) = (result, proxy.routes.get(*index)) {
            proxy_metrics::with(|m| m.routes_skipped += 1);
            // Hidden either way (what it would show this session is not known), but only
            // a refused credential is final: a route that could not be reached is asked
            // again in the background, and shown once it accepts.
            let refused = matches!(reset, Reset::Bearer(_));
            unreached |= !refused;
            log::warn(format_args!(
                "proxy {}: toolkit {} hidden from a session ({}: {})",
                proxy.name,
                route.label,
                if refused {
                    "it refused the session's credential"
                } else {
                    "it could not be asked to accept the session's credential; asking again"
                },
                describe(&reset)
            ));
            refusals.push(reset);
        }
    }
    if forwarding.len() < proxy.routes.len() || refusals.len() < forwarding.len() {
        if unreached {
            readmit(proxy, session);
        }
        return true;
    }
    let reset = refusals
        .into_iter()
        .min_by_key(|r| !matches!(r, Reset::Bearer(_)));
    session.close();
    fail(callee, reset.unwrap_or_else(|| internal("No toolkit")));
    false
}

/// First and longest wait between two tries of [`readmit`].
const READMIT_RETRY_MIN: Duration = Duration::from_secs(1);
const READMIT_RETRY_MAX: Duration = Duration::from_secs(30);

/// Asks the forwarding routes hidden from `session` again, in a task of its own (at most
/// one per session), with backoff from [`READMIT_RETRY_MIN`] up to [`READMIT_RETRY_MAX`],
/// until each has accepted the session's credential (it is then shown, with a
/// `list_changed`) or refused it (asked again only when the agent's credential changes),
/// or the session ends.
pub(super) fn readmit(proxy: &Proxy, session: &Rc<ProxySession>) {
    if session.readmitting.replace(true) {
        return;
    }
    let (Some(proxy), session) = (proxy.me.upgrade(), session.clone()) else {
        session.readmitting.set(false);
        return;
    };
    tokio::task::spawn_local(async move {
        let gate = proxy.cache.as_ref().map_or(READMIT_RETRY_MAX, |c| c.gate());
        let mut wait = READMIT_RETRY_MIN;
        let mut refused: cache::Routes = 0;
        let mut credential = session.credential.get();
        loop {
            if session.credential.get() != credential {
                // A new credential: every hidden route may accept it.
                credential = session.credential.get();
                refused = 0;
                wait = READMIT_RETRY_MIN;
            }
            let asked = session.hidden() & !refused;
            if session.closed.get() || asked == 0 {
                break;
            }
            for index in (0..proxy.routes.len()).filter(|i| asked & (1 << i) != 0) {
                let deadline = Instant::now() + gate;
                if let Err(Reset::Bearer(_)) = session.route(&proxy, index, true, deadline).await {
                    refused |= 1 << index;
                }
            }
            if session.hidden() & !refused == 0 {
                break;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(READMIT_RETRY_MAX);
        }
        session.readmitting.set(false);
    });
}

/// The routes' `instructions`: one route's as they are; several joined, each under its
/// toolkit's name (a JSON string lexeme either way).
pub(super) fn instructions(proxy: &Proxy, session: &ProxySession) -> Option<Bytes> {
    let given: Vec<(Rc<str>, Bytes)> = session
        .open_routes()
        .into_iter()
        .filter_map(|(i, life)| {
            Some((
                proxy.routes.get(i)?.label.clone(),
                life.instructions.clone()?,
            ))
        })
        .collect();
    match given.as_slice() {
        [] => None,
        [(_, one)] => Some(one.clone()),
        several => {
            let texts = several.iter().filter_map(|(label, raw)| {
                let text: String = serde_json::from_slice(raw).ok()?;
                Some((label.clone(), text))
            });
            Some(joined_instructions(texts))
        }
    }
}

/// Several routes' instructions as one text, each under its toolkit's name, as a JSON
/// string lexeme.
pub(super) fn joined_instructions(texts: impl Iterator<Item = (Rc<str>, String)>) -> Bytes {
    let text: Vec<String> = texts
        .map(|(label, text)| format!("{label}: {text}"))
        .collect();
    rename::lexeme(&text.join("\n\n"))
}

/// The instructions a session is told from the cache's record (`texts[i]`: route i's, as
/// text): those of the routes it may see, one alone as it is, several joined.
pub(super) fn cached_instructions(
    proxy: &Proxy,
    session: &ProxySession,
    texts: &[Option<String>],
) -> Option<Bytes> {
    let given: Vec<(Rc<str>, String)> = proxy
        .routes
        .iter()
        .zip(texts)
        .filter(|(route, _)| session.hidden() & (1 << route.index) == 0)
        .filter_map(|(route, text)| Some((route.label.clone(), text.clone()?)))
        .collect();
    match given.as_slice() {
        [] => None,
        [(_, one)] => Some(rename::lexeme(one)),
        _ => Some(joined_instructions(given.into_iter())),
    }
}

/// Route `index`'s instructions, as text, if it is open and gave some.
pub(super) fn route_instructions(session: &ProxySession, index: usize) -> Option<String> {
    let raw = session.open_life(index)?.instructions.clone()?;
    serde_json::from_slice(&raw).ok()
}

/// The waker a session's relay task gives its inputs: it wakes the task, and first marks
/// it as having something to do (see `ProxySession::announce`).
struct RelayWake {
    /// The relay task waits, and nothing woke it since.
    waiting: AtomicBool,
    /// The task's own waker.
    task: Mutex<Option<Waker>>,
}

impl RelayWake {
    /// At the start of a poll of the relay: not waiting; the task's waker kept.
    fn enter(&self, waker: &Waker) {
        self.waiting.store(false, Ordering::Relaxed);
        if let Ok(mut task) = self.task.lock()
            && !task.as_ref().is_some_and(|t| t.will_wake(waker))
        {
            *task = Some(waker.clone());
        }
    }
}

impl Wake for RelayWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.waiting.store(false, Ordering::Relaxed);
        // Woken outside the lock: waking may run code that wakes this again.
        let task = self.task.lock().ok().and_then(|t| t.clone());
        if let Some(task) = task {
            task.wake();
        }
    }
}

/// One thing the relay task woke up for.
enum Step {
    /// The caller's initial direction (the agent's notifications, the session's end).
    Initial(Option<Frame>),
    /// A challenge (or the end) from the caller.
    Throttle(Option<Throttle>),
    /// Route `.0`'s lifecycle reply.
    Route(usize, Rc<RouteLife>, Option<Frame>),
    /// Another task changed something (a route opened, lists to announce).
    Poke,
    /// The resume round's deadline passed.
    RoundTimeout,
}

/// Relays until the caller ends the session.
async fn relay(proxy: &Proxy, session: &Rc<ProxySession>, callee: &Callee) {
    let mut turn = 0usize;
    // The resume round's deadline (boxed: the relay task lives as long as the session).
    let mut round_timer = Box::pin(tokio::time::sleep(EVENTS_PROBE_TIMEOUT));
    *session.direct.borrow_mut() = Some(callee.reply.handle());
    loop {
        for flush in pending_flushes(proxy, session) {
            if Box::pin(callee.reply.flush(flush)).await.is_err() {
                return;
            }
        }
        let step = poll_fn(|cx| {
            // Every input is polled with the relay's own waker, so any of them waking the
            // task tells `announce` that it no longer waits with nothing to do.
            session.relay.enter(cx.waker());
            let cx = &mut Context::from_waker(&session.relay_waker);
            if let Poll::Ready(frame) = callee.initial.poll_next(cx) {
                return Poll::Ready(Step::Initial(frame));
            }
            if let Poll::Ready(throttle) = callee.reply.poll_throttle(cx) {
                return Poll::Ready(Step::Throttle(throttle));
            }
            let round = session.round.borrow();
            let open_round = round.open();
            if open_round && let Some(deadline) = round.deadline {
                let deadline = tokio::time::Instant::from_std(deadline);
                if round_timer.deadline() != deadline {
                    round_timer.as_mut().reset(deadline);
                }
                if round_timer.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Step::RoundTimeout);
                }
            }
            // Routes are polled round-robin, so a busy one cannot starve the others.
            let count = session.routes.len();
            for k in 0..count {
                let i = (turn + k) % count;
                if open_round && round.waiting.get(i) != Some(&true) {
                    continue;
                }
                let Some(slot) = session.routes.get(i) else {
                    continue;
                };
                let RouteState::Open(life) = &*slot.borrow() else {
                    continue;
                };
                if let Poll::Ready(frame) = life.caller.reply.poll_next(cx) {
                    turn = i + 1;
                    return Poll::Ready(Step::Route(i, life.clone(), frame));
                }
            }
            drop(round);
            if session.poked.replace(false) {
                return Poll::Ready(Step::Poke);
            }
            session.relay.waiting.store(true, Ordering::Relaxed);
            Poll::Pending
        })
        .await;
        match step {
            Step::Initial(Some(Frame::Flush(Flush {
                event: Event::Notification { method, params },
                ..
            }))) => {
                // The agent's own notifications (roots/list_changed, ...) go to every route.
                for (_, life) in session.open_routes() {
                    let flush = Flush {
                        id: None,
                        event: Event::Notification {
                            method: method.clone(),
                            params: params.clone(),
                        },
                    };
                    if !life.caller.initial.try_flush(flush) {
                        metrics::with(|m| m.overload_rejections += 1);
                    }
                }
            }
            Step::Initial(Some(Frame::Data(piece))) => callee.initial.ack(piece.len() as u32),
            Step::Initial(Some(Frame::Flush(Flush {
                event: event @ (Event::Handoff(_) | Event::Rechecked { .. }),
                ..
            }))) => {
                // Another node opened routes of this shared session: those closed here
                // are taken up from it when a request needs them, and so are those
                // waiting for this answer to their recheck.
                let raw = match event {
                    Event::Rechecked { seq, handoff } => {
                        let answered = session.recheck_answered.get().max(seq);
                        session.recheck_answered.set(answered);
                        handoff
                    }
                    Event::Handoff(handoff) => handoff,
                    _ => Bytes::new(),
                };
                let awaiting = session.awaiting_recheck.get();
                for (index, handoff) in route_handoffs(proxy, &raw).unwrap_or_default() {
                    let closed = session
                        .routes
                        .get(index)
                        .is_some_and(|slot| matches!(&*slot.borrow(), RouteState::Closed { .. }));
                    if (closed || awaiting & 1 << index != 0)
                        && let Some(slot) = session.adoptable.borrow_mut().get_mut(index)
                    {
                        *slot = Some(handoff);
                    }
                }
                session.changed.notify_waiters();
            }
            Step::Initial(Some(Frame::Flush(Flush {
                event: Event::Detach,
                ..
            }))) => {
                session.detached.set(true);
                return;
            }
            Step::Initial(Some(Frame::Begin(_) | Frame::Flush(_))) => {}
            Step::Initial(Some(Frame::End | Frame::Abort)) => return,
            Step::Initial(None) => {
                // The caller went away without a word: a session taken up from another
                // node's handoff may be in use there, so it is let go of, not ended.
                session.detached.set(session.adopted.get());
                return;
            }
            Step::Throttle(Some(Throttle::Challenge(challenge))) => {
                on_challenge(proxy, session, challenge);
            }
            Step::Throttle(Some(Throttle::Reset(_)) | None) => {
                session.detached.set(session.adopted.get());
                return;
            }
            Step::Route(i, life, frame) => {
                let out = on_route_frame(proxy, session, i, &life, frame);
                if let Some(flush) = out
                    && Box::pin(callee.reply.flush(flush)).await.is_err()
                {
                    return;
                }
            }
            Step::RoundTimeout => {
                // Routes that have not answered yet count as without events for this
                // round; their answer, should it come, still tells the caller.
                let mut round = session.round.borrow_mut();
                round.waiting.iter_mut().for_each(|w| *w = false);
            }
            Step::Poke => {}
        }
    }
}

/// Flushes other tasks asked for: lists that changed, a resume round that completed.
fn pending_flushes(proxy: &Proxy, session: &ProxySession) -> Vec<Flush> {
    let mut out = Vec::new();
    if let Some(answer) = round_answer(session) {
        out.push(answer);
    }
    if session.handoff_changed.replace(false)
        && session.lists != Lists::Hydrating
        && let Some(handoff) = session.handoff(proxy)
    {
        out.push(Flush {
            id: None,
            event: Event::Handoff(handoff),
        });
    }
    // After the handoff: the caller records this node's routes before it reads the record
    // for the recheck, so the read cannot bring back an older handoff over them.
    let asked = session.recheck_asked.get();
    if asked > session.recheck_sent.get() {
        session.recheck_sent.set(asked);
        out.push(Flush {
            id: None,
            event: Event::Recheck { seq: asked },
        });
    }
    // A list change during a resume round follows the round's answer: the caller's new
    // stream starts after that answer, so one before it would never reach the agent.
    if session.round.borrow().open() {
        return out;
    }
    let lists = session.list_changed.replace([false; 3]);
    for (changed, kind) in
        lists
            .into_iter()
            .zip([ListKind::Tools, ListKind::Prompts, ListKind::Resources])
    {
        if changed {
            out.push(Flush {
                id: None,
                event: Event::ListChanged(kind),
            });
        }
    }
    out
}

/// A challenge from the caller on the lifecycle.
fn on_challenge(proxy: &Proxy, session: &Rc<ProxySession>, challenge: Challenge) {
    match challenge {
        Challenge::Resume { last_event_id } => resume(proxy, session, last_event_id),
        Challenge::Suspended => {
            for (_, life) in session.open_routes() {
                let _ = life.caller.reply.challenge(Challenge::Suspended);
            }
        }
        Challenge::Answer { id, result, error } => {
            let target = if proxy.aggregating() {
                rename::unwrap_id(&id).and_then(|(toolkit, raw)| {
                    let route = proxy
                        .routes
                        .iter()
                        .position(|r| r.toolkit.as_deref() == Some(toolkit.as_str()))?;
                    Some((route, raw))
                })
            } else {
                Some((0, id))
            };
            let Some((route, id)) = target else {
                proxy_metrics::with(|m| m.answers_unroutable += 1);
                return;
            };
            match session.open_life(route) {
                Some(life) => {
                    let answer = Challenge::Answer { id, result, error };
                    let _ = life.caller.reply.challenge(answer);
                }
                None => proxy_metrics::with(|m| m.answers_unroutable += 1),
            }
        }
    }
}

/// The agent opened its GET stream (`last_event_id`: where it was). Each route is resumed
/// from its own part of the id; routes not open are opened first (unless they failed
/// moments ago); the caller is answered once every asked route has answered.
///
/// With a cache the proxy itself has events (the lists' changes), so the caller always
/// has a stream, and a GET opens no route of its own accord: only routes already open,
/// or those the agent's id names a place in (their events are to be replayed); a route
/// a request opens later joins the stream then. Ten thousand agents listening for list
/// changes therefore hold no upstream stream.
fn resume(proxy: &Proxy, session: &Rc<ProxySession>, last_event_id: Option<Rc<str>>) {
    let lazy = session.lists == Lists::Cached;
    let count = proxy.routes.len();
    let mut from: Vec<Option<Rc<str>>> = vec![None; count];
    if proxy.aggregating() {
        if let Some(aggregate) = &last_event_id {
            let mut ids = session.event_ids.borrow_mut();
            for (route, id) in proxy.prefixes.decode(aggregate) {
                // The next aggregate still names where the agent is for routes that say
                // nothing new.
                if let Some(slot) = ids.get_mut(route) {
                    *slot = Some(id.clone());
                }
                if let Some(slot) = from.get_mut(route) {
                    *slot = Some(id);
                }
            }
        }
    } else if let Some(first) = from.first_mut() {
        *first = last_event_id;
    }
    {
        let mut round = session.round.borrow_mut();
        round.waiting = vec![false; count];
        round.any_yes = lazy;
        round.answered = false;
        round.deadline = Some(Instant::now() + EVENTS_PROBE_TIMEOUT);
    }
    for (i, id) in from.into_iter().enumerate() {
        let Some(slot) = session.routes.get(i) else {
            continue;
        };
        let state = match &*slot.borrow() {
            RouteState::Open(life) => Ok(life.clone()),
            RouteState::Opening => Err(true),
            RouteState::Closed { .. } if lazy && id.is_none() => Err(false),
            RouteState::Closed { since, .. } => {
                Err(since.is_none_or(|t| t.elapsed() >= ROUTE_RETRY_BACKOFF))
            }
        };
        match state {
            Ok(life) => {
                let asked = life
                    .caller
                    .reply
                    .challenge(Challenge::Resume { last_event_id: id });
                set_waiting(session, i, asked.is_ok());
            }
            Err(false) => {}
            Err(true) => {
                // Opening (or to be opened): resumed as soon as it is open.
                if let Some(slot) = session.pending_resume.borrow_mut().get_mut(i) {
                    *slot = Some(id);
                }
                set_waiting(session, i, true);
                if !matches!(&*slot.borrow(), RouteState::Opening) {
                    let (session, proxy_rc) = (session.clone(), proxy.me.upgrade());
                    if let Some(proxy_rc) = proxy_rc {
                        let deadline = Instant::now() + ROUTE_RESUME_OPEN_TIMEOUT;
                        tokio::task::spawn_local(async move {
                            let _ = session.route(&proxy_rc, i, false, deadline).await;
                        });
                    }
                }
            }
        }
    }
    session.poke();
}

/// How long a resume waits for a route it had to open.
const ROUTE_RESUME_OPEN_TIMEOUT: Duration = Duration::from_secs(30);

fn set_waiting(session: &ProxySession, route: usize, waiting: bool) {
    if let Some(w) = session.round.borrow_mut().waiting.get_mut(route) {
        *w = waiting;
    }
}

/// The caller's answer to the current resume, once no asked route is still to answer; and
/// later, the news that events flow after all (a route answered yes after all said no).
fn round_answer(session: &ProxySession) -> Option<Flush> {
    let mut round = session.round.borrow_mut();
    if !round.answered {
        if round.waiting.iter().any(|w| *w) || round.waiting.is_empty() {
            return None;
        }
        round.answered = true;
        round.told = Some(round.any_yes);
        let event = if round.any_yes {
            Event::Resumable
        } else {
            Event::Suspend { retry_ms: -1 }
        };
        drop(round);
        return Some(Flush {
            id: aggregate_id(session),
            event,
        });
    }
    if round.any_yes && round.told == Some(false) {
        round.told = Some(true);
        drop(round);
        return Some(Flush {
            id: aggregate_id(session),
            event: Event::Resumable,
        });
    }
    None
}

/// The id the caller's next event carries (see `ProxySession::aggregate`).
fn aggregate_id(session: &ProxySession) -> Option<Rc<str>> {
    session.aggregate.borrow().clone()
}

/// One frame of route `index`'s lifecycle reply: what (if anything) goes to the caller.
fn on_route_frame(
    proxy: &Proxy,
    session: &ProxySession,
    index: usize,
    life: &RouteLife,
    frame: Option<Frame>,
) -> Option<Flush> {
    let route = proxy.routes.get(index)?;
    let flush = match frame {
        Some(Frame::Flush(flush)) => flush,
        Some(Frame::Data(piece)) => {
            life.caller.reply.ack(piece.len() as u32);
            return None;
        }
        Some(Frame::Begin(_)) => return None,
        Some(Frame::End | Frame::Abort) | None => {
            route_ended(proxy, session, route, life);
            return None;
        }
    };
    if let Event::Handoff(handoff) = &flush.event {
        *life.handoff.borrow_mut() = Some(handoff.clone());
        session.handoff_changed.set(true);
        return None;
    }
    let Flush { id, event } = flush;
    let id = id.filter(|id| id.len() <= EXIT_EVENT_ID_BYTES_MAX);
    let out_id = if proxy.aggregating() {
        if let Some(id) = &id
            && let Some(slot) = session.event_ids.borrow_mut().get_mut(index)
        {
            *slot = Some(id.clone());
        }
        let encoded = proxy
            .prefixes
            .encode(&session.event_ids.borrow())
            .map(|s| Rc::from(s.as_str()));
        *session.aggregate.borrow_mut() = encoded.clone();
        encoded
    } else {
        if id.is_some() {
            *session.aggregate.borrow_mut() = id.clone();
        }
        id
    };
    let event = match event {
        Event::Resumable | Event::Suspend { .. } => {
            let yes = !matches!(event, Event::Suspend { retry_ms: ..0 });
            {
                let mut round = session.round.borrow_mut();
                if let Some(w) = round.waiting.get_mut(index) {
                    *w = false;
                }
                round.any_yes |= yes;
            }
            return round_answer(session);
        }
        Event::Request { id, method, params } if proxy.aggregating() => Event::Request {
            id: rename::wrap_id(&route.label, &id),
            method,
            params,
        },
        // With a cache, the cache announces list changes (once, and only real ones).
        Event::ListChanged(_) if session.lists == Lists::Cached => return None,
        Event::ListChanged(list) if session.lists == Lists::Hydrating => {
            session.mark_changed_route(list, route.index);
            Event::ListChanged(list)
        }
        Event::ResourcesUpdated { params } if !route.uri_prefix.is_empty() => {
            match rename::prefix_member(&params, "uri", &route.uri_prefix) {
                Some(params) => Event::ResourcesUpdated { params },
                None => Event::ResourcesUpdated { params },
            }
        }
        Event::Notification { method, params }
            if proxy.aggregating() && &*method == "notifications/cancelled" =>
        {
            // The route gave up on one of its server-to-client requests: name it the way
            // the agent knows it.
            let params =
                params.map(|p| rename::wrap_member_id(&p, "requestId", &route.label).unwrap_or(p));
            Event::Notification { method, params }
        }
        other => other,
    };
    Some(Flush { id: out_id, event })
}

/// Route `route`'s lifecycle ended on its own: the route is closed, and the next request
/// that needs it opens it again.
fn route_ended(proxy: &Proxy, session: &ProxySession, route: &Route, life: &RouteLife) {
    life.caller.initial.abort();
    if let Some(slot) = session.routes.get(route.index) {
        let ours = matches!(&*slot.borrow(), RouteState::Open(l) if std::ptr::eq(&**l, life));
        if ours {
            *slot.borrow_mut() = RouteState::Closed {
                failure: Some(internal(&format!(
                    "Session of toolkit {} ended",
                    route.label
                ))),
                since: Some(Instant::now()),
            };
        }
    }
    set_waiting(session, route.index, false);
    session.handoff_changed.set(true);
    proxy_metrics::with(|m| m.routes_ended += 1);
    log::warn(format_args!(
        "proxy {}: toolkit {} ended its session",
        proxy.name, route.label
    ));
    session.changed.notify_waiters();
    session.poke();
}

/// A RESET as a log reason (never a credential).
pub fn describe(reset: &Reset) -> String {
    match reset {
        Reset::Error { code, message, .. } => {
            format!("error {code} {}", log::field(message.as_bytes()))
        }
        Reset::Bearer(c) => format!("bearer challenge ({})", c.status),
        Reset::Plain => "gone".to_owned(),
    }
}
