//! The proxy's list cache: lists hydrated from the routes into the store by one worker,
//! served from the store by all.
//!
//! Per proxy binding and per worker there is one [`Cache`]:
//!
//! - its **view** holds the worker's current copy of every cached list (the stored `Bytes`,
//!   a reference, not a copy) and of the routes' capabilities; list requests are answered
//!   from it ([`Cache::list`]) and never reach upstream;
//! - its **watchers** (one small task per key) follow the store: at start they `get` every
//!   key (a watch may never fire for a value written before it began), then on each change
//!   `get` again, CRC32C-compare the new list with the last one seen and, only when it
//!   differs, tell each agent session of this worker once (`list_changed`);
//! - its **lease loop** tries the binding's `lifecycle.lock`. The one worker that holds it
//!   hydrates ([`hydrate`]): it opens a session through its own proxy (one session per
//!   route, with the cache's credential), lists every kind from every route in parallel,
//!   and writes each route's items (a fragment) and the merged list, renewing the lease at a
//!   third of its TTL. It refreshes on the cache TTL and at once when a route says a list
//!   changed; a route whose refresh fails keeps its previous fragment ("stale on
//!   failure"), and the kind is retried with backoff from 100 ms up to the lease TTL. A
//!   renewal that fails stops it; another worker takes over once the lease has expired.
//!
//! Store keys, per proxy binding `p`: `p/tools`, `p/prompts`, `p/resources`,
//! `p/resources/templates` (the merged result objects, exactly as agents get them), their
//! fragments `p/<kind>@<toolkit>`, `p/caps` (the routes' capabilities and instructions),
//! and the leases `p/lifecycle.lock` and `p/<kind>.lock`.

use super::list::{self, ListRequest};
use super::rename;
use super::session::{self, ProxySession};
use super::{Family, Proxy, Route, join_all};
use crate::limits::{CACHE_LIST_BYTES_MAX, CACHE_RETRY_MIN};
use crate::log;
use crate::metrics;
use crate::runtime::notify::Notify;
use crate::store::{Store, Token, Value};
use crate::stream::{
    self, Begin, Caps, Challenge, ClientHello, Event, Flush, Frame, Kind, ListKind,
};
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The cached list kinds, in slot order.
pub const KINDS: [Kind; 4] = [
    Kind::ToolsList,
    Kind::PromptsList,
    Kind::ResourcesList,
    Kind::ResourcesTemplatesList,
];

/// The slot of a cached kind.
pub fn slot(kind: Kind) -> Option<usize> {
    KINDS.iter().position(|k| *k == kind)
}

/// A kind's key suffix and the member its result holds the items in.
fn names(kind: Kind) -> (&'static str, &'static str) {
    match kind {
        Kind::PromptsList => ("prompts", "prompts"),
        Kind::ResourcesList => ("resources", "resources"),
        Kind::ResourcesTemplatesList => ("resources/templates", "resourceTemplates"),
        _ => ("tools", "tools"),
    }
}

/// The list whose `list_changed` announces a kind's change.
fn announced(kind: Kind) -> ListKind {
    match kind {
        Kind::PromptsList => ListKind::Prompts,
        Kind::ResourcesList | Kind::ResourcesTemplatesList => ListKind::Resources,
        _ => ListKind::Tools,
    }
}

/// The family a kind's items belong to.
fn family(kind: Kind) -> Family {
    match kind {
        Kind::PromptsList => Family::Prompts,
        Kind::ResourcesList | Kind::ResourcesTemplatesList => Family::Resources,
        _ => Family::Tools,
    }
}

/// How a worker's proxy reaches its cache (built once per process, shared by workers).
#[derive(Clone)]
pub struct CacheSetup {
    pub store: Arc<dyn Store>,
    /// How often lists are refreshed.
    pub ttl: Duration,
    /// `Bearer <token>` for hydration, if configured. Never logged.
    pub authorization: Option<Bytes>,
    /// Bounds an agent's wait for the first hydration and one hydration's list requests:
    /// the routes' clients' connect and response timeouts together.
    pub route_timeout: Duration,
}

/// What the store says about the routes (`p/caps`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct StoredCaps {
    /// Per route, its capability bits (0: it could not be reached).
    caps: Vec<u16>,
    /// The routes' joined instructions, as text.
    instructions: Option<String>,
}

/// The routes' capabilities, as cached.
#[derive(Clone, Debug)]
pub struct CachedCaps {
    pub routes: Vec<Caps>,
    /// A JSON string lexeme.
    pub instructions: Option<Bytes>,
}

/// A worker's copy of the cache.
#[derive(Default)]
struct View {
    lists: [Option<Value>; 4],
    crcs: [Option<u32>; 4],
    caps: Option<CachedCaps>,
}

/// One worker's cache of one proxy binding.
pub struct Cache {
    setup: CacheSetup,
    /// `p/`.
    prefix: String,
    view: RefCell<View>,
    /// Woken when the view changes (agents waiting for the first hydration).
    changed: Notify,
    /// Set at drain: hydration ends (its route sessions close) and no lease is taken.
    stopping: std::cell::Cell<bool>,
    stop: Notify,
}

impl Cache {
    /// The cache of proxy binding `name`.
    pub fn new(name: &str, setup: CacheSetup) -> Cache {
        Cache {
            setup,
            prefix: format!("{name}/"),
            view: RefCell::new(View::default()),
            changed: Notify::new(),
            stopping: std::cell::Cell::new(false),
            stop: Notify::new(),
        }
    }

    /// Stops hydrating on this worker (drain): the hydration session ends, so its route
    /// sessions are closed upstream, and the lease is given up.
    pub fn stop(&self) {
        self.stopping.set(true);
        self.stop.notify_waiters();
    }

    /// How long an agent's `initialize` waits for the first hydration.
    pub fn gate(&self) -> Duration {
        self.setup.route_timeout
    }

    /// The lease under which one worker hydrates.
    fn lease_ttl(&self) -> Duration {
        self.setup.ttl.min(crate::limits::CACHE_LEASE_TTL_MAX)
    }

    fn list_key(&self, kind: Kind) -> String {
        format!("{}{}", self.prefix, names(kind).0)
    }

    fn caps_key(&self) -> String {
        format!("{}caps", self.prefix)
    }

    fn fragment_key(&self, kind: Kind, route: &Route) -> String {
        format!("{}{}@{}", self.prefix, names(kind).0, route.label)
    }

    /// The cached result of a list request of `kind`, if hydrated.
    pub fn list(&self, kind: Kind) -> Option<Bytes> {
        let at = slot(kind)?;
        let view = self.view.borrow();
        view.lists.get(at)?.as_ref().map(|v| v.bytes.clone())
    }

    /// The cached capabilities, once every list kind has been hydrated (or has failed once)
    /// and the routes' capabilities are known: what an agent's `initialize` waits for.
    pub fn ready(&self) -> Option<CachedCaps> {
        let view = self.view.borrow();
        if view.lists.iter().all(Option::is_some) {
            view.caps.clone()
        } else {
            None
        }
    }

    /// Waits (until `deadline`) for [`Cache::ready`].
    pub async fn wait_ready(&self, deadline: Instant) -> Option<CachedCaps> {
        loop {
            let changed = self.changed.notified();
            if let Some(caps) = self.ready() {
                return Some(caps);
            }
            if tokio::time::timeout_at(deadline.into(), changed)
                .await
                .is_err()
            {
                return None;
            }
        }
    }

    /// Starts this worker's watchers and lease loop.
    pub fn start(proxy: &Rc<Proxy>) {
        let Some(cache) = proxy.cache.as_ref() else {
            return;
        };
        let mut keys: Vec<(Option<Kind>, String)> = KINDS
            .iter()
            .map(|k| (Some(*k), cache.list_key(*k)))
            .collect();
        keys.push((None, cache.caps_key()));
        for (kind, key) in keys {
            tokio::task::spawn_local(follow(Rc::downgrade(proxy), kind, key));
        }
        tokio::task::spawn_local(lease_loop(Rc::downgrade(proxy)));
    }

    /// Takes a new value of a key into the view; for a list that differs from the last
    /// one seen, tells every agent session of this worker.
    fn apply(&self, proxy: &Proxy, kind: Option<Kind>, value: Option<Value>) {
        let Some(kind) = kind else {
            let caps = value.and_then(|v| decode_caps(&v.bytes));
            self.view.borrow_mut().caps = caps;
            self.changed.notify_waiters();
            return;
        };
        let Some(at) = slot(kind) else {
            return;
        };
        let crc = value.as_ref().map(|v| crc32c::crc32c(&v.bytes));
        let differs = {
            let mut view = self.view.borrow_mut();
            let before = view.crcs.get(at).copied().flatten();
            let view = &mut *view;
            if let (Some(s), Some(c)) = (view.lists.get_mut(at), view.crcs.get_mut(at)) {
                *s = value;
                *c = crc;
            }
            before.is_some() && crc.is_some() && before != crc
        };
        self.changed.notify_waiters();
        if differs {
            let told = proxy.announce(announced(kind));
            metrics::with(|m| m.cache.notifications += told);
        }
    }
}

fn decode_caps(bytes: &[u8]) -> Option<CachedCaps> {
    let stored: StoredCaps = serde_json::from_slice(bytes).ok()?;
    Some(CachedCaps {
        routes: stored.caps.into_iter().map(Caps).collect(),
        instructions: stored.instructions.as_deref().map(rename::lexeme),
    })
}

/// Follows one key for this worker: the value now, then every change.
async fn follow(proxy: Weak<Proxy>, kind: Option<Kind>, key: String) {
    let Some(store) = proxy
        .upgrade()
        .and_then(|p| p.cache.as_ref().map(|c| c.setup.store.clone()))
    else {
        return;
    };
    // Watch first, then read: a write in between shows up as a change, not as nothing.
    let mut watch = match store.watch(&key) {
        Ok(watch) => Some(watch),
        Err(e) => {
            log::error(format_args!("cache: cannot watch {key}: {e}"));
            None
        }
    };
    loop {
        match store.get(&key).await {
            Ok(value) => {
                let Some(proxy) = proxy.upgrade() else {
                    return;
                };
                if let Some(cache) = proxy.cache.as_ref() {
                    cache.apply(&proxy, kind, value);
                }
            }
            Err(e) => log::warn(format_args!("cache: reading {key} failed: {e}")),
        }
        match watch.as_mut() {
            Some(w) => {
                if !w.changed().await {
                    return;
                }
            }
            None => tokio::time::sleep(CACHE_RETRY_MIN).await,
        }
    }
}

/// Tries the hydration lease, and hydrates while holding it.
async fn lease_loop(proxy: Weak<Proxy>) {
    loop {
        let Some(p) = proxy.upgrade() else {
            return;
        };
        let Some(cache) = p.cache.as_ref() else {
            return;
        };
        if cache.stopping.get() {
            return;
        }
        let key = format!("{}lifecycle.lock", cache.prefix);
        let wait = cache.lease_ttl() / 3;
        match cache.setup.store.lock(&key, cache.lease_ttl()).await {
            Ok(Some(token)) => {
                metrics::with(|m| m.cache.lease_changes += 1);
                log::info(format_args!(
                    "cache: worker {} holds the hydration lease of proxy {}",
                    p.worker, p.name
                ));
                // Boxed: it lives as long as the lease, the loop around it far longer.
                Box::pin(hydrate(&p, &key, &token)).await;
                let _ = cache.setup.store.unlock(&key, &token).await;
                log::info(format_args!(
                    "cache: worker {} gave up the hydration lease of proxy {}",
                    p.worker, p.name
                ));
            }
            Ok(None) => {}
            Err(e) => log::warn(format_args!("cache: taking {key} failed: {e}")),
        }
        let stopped = cache.stop.notified();
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stopped => return,
        }
    }
}

/// A refresh in progress: each kind's success, and the fragments (`[kind][route]`).
type Refresh = std::pin::Pin<Box<dyn std::future::Future<Output = (Vec<(Kind, bool)>, Fragments)>>>;

/// The routes' last good items per kind: `[kind][route]`.
type Fragments = Vec<Vec<Option<Bytes>>>;

/// What the hydrator is waiting for next.
enum Wake {
    Renew,
    Refresh(Vec<Kind>),
    Done(Vec<(Kind, bool)>),
    Lifecycle(Option<Frame>),
}

/// The kinds a `list_changed` of `list` covers.
fn kinds_of(list: ListKind) -> Vec<Kind> {
    match list {
        ListKind::Tools => vec![Kind::ToolsList],
        ListKind::Prompts => vec![Kind::PromptsList],
        ListKind::Resources => vec![Kind::ResourcesList, Kind::ResourcesTemplatesList],
    }
}

/// Hydrates while this worker holds the lease `key` (token `token`): until a renewal
/// fails or the hydration session ends.
async fn hydrate(proxy: &Rc<Proxy>, key: &str, token: &Token) {
    let Some(cache) = proxy.cache.as_ref() else {
        return;
    };
    let lease = cache.lease_ttl();
    let Some((life, session)) = open_session(proxy, cache).await else {
        return;
    };
    write_caps(proxy, cache, &session).await;
    // Routes' list_changed arrive on their event streams.
    let _ = life.reply.challenge(Challenge::Resume {
        last_event_id: None,
    });
    let mut fragments: Fragments = load_fragments(proxy, cache).await;
    let mut pending: Vec<Kind> = KINDS.to_vec();
    let mut backoff = [CACHE_RETRY_MIN; 4];
    let mut retry_at: [Option<Instant>; 4] = [None; 4];
    let mut next_ttl = Instant::now() + cache.setup.ttl;
    let mut renew_at = Instant::now() + lease / 3;
    let mut running: Option<Refresh> = None;
    loop {
        let stopped = cache.stop.notified();
        if cache.stopping.get() {
            break;
        }
        if running.is_none() && !pending.is_empty() {
            let kinds = std::mem::take(&mut pending);
            let held = std::mem::take(&mut fragments);
            let (p, s) = (proxy.clone(), session.clone());
            running = Some(Box::pin(async move { refresh(&p, &s, kinds, held).await }));
        }
        let due_retry = retry_at.iter().flatten().min().copied();
        let wake = tokio::select! {
            biased;
            () = stopped => continue,
            () = tokio::time::sleep_until(renew_at.into()) => Wake::Renew,
            done = async {
                match running.as_mut() {
                    Some(f) => f.await,
                    None => std::future::pending().await,
                }
            } => {
                running = None;
                let (results, held) = done;
                fragments = held;
                Wake::Done(results)
            }
            frame = life.reply.next() => Wake::Lifecycle(frame),
            () = tokio::time::sleep_until(next_ttl.into()) => {
                next_ttl = Instant::now() + cache.setup.ttl;
                Wake::Refresh(KINDS.to_vec())
            }
            () = async {
                match due_retry {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => {
                let now = Instant::now();
                let mut due = Vec::new();
                for (at, kind) in retry_at.iter_mut().zip(KINDS) {
                    if at.is_some_and(|t| t <= now) {
                        *at = None;
                        due.push(kind);
                    }
                }
                Wake::Refresh(due)
            }
        };
        match wake {
            Wake::Renew => match cache.setup.store.renew(key, token, lease).await {
                Ok(true) => renew_at = Instant::now() + lease / 3,
                _ => {
                    log::warn(format_args!(
                        "cache: worker {} lost the hydration lease of proxy {}",
                        proxy.worker, proxy.name
                    ));
                    break;
                }
            },
            Wake::Refresh(kinds) => {
                for k in kinds {
                    if !pending.contains(&k) {
                        pending.push(k);
                    }
                }
            }
            Wake::Done(results) => {
                for (kind, ok) in results {
                    let Some(at) = slot(kind) else { continue };
                    metrics::with(|m| {
                        if ok {
                            m.cache.refreshes_ok += 1;
                        } else {
                            m.cache.refreshes_failed += 1;
                        }
                    });
                    if let (Some(b), Some(r)) = (backoff.get_mut(at), retry_at.get_mut(at)) {
                        if ok {
                            *b = CACHE_RETRY_MIN;
                            *r = None;
                        } else {
                            *r = Some(Instant::now() + *b);
                            *b = (*b * 2).min(lease);
                        }
                    }
                }
            }
            Wake::Lifecycle(Some(Frame::Flush(Flush {
                event: Event::ListChanged(list),
                ..
            }))) => {
                for k in kinds_of(list) {
                    if !pending.contains(&k) {
                        pending.push(k);
                    }
                }
            }
            Wake::Lifecycle(Some(Frame::Data(d))) => life.reply.ack(d.len() as u32),
            Wake::Lifecycle(Some(_)) => {}
            Wake::Lifecycle(None) => break,
        }
    }
    drop(running);
    life.initial.end();
}

/// Opens the hydration session: a lifecycle through this proxy, as an agent would, with
/// the cache's credential; its routes are its hydration sessions.
async fn open_session(
    proxy: &Rc<Proxy>,
    cache: &Cache,
) -> Option<(stream::Caller, Rc<ProxySession>)> {
    let deadline = Instant::now() + cache.setup.route_timeout;
    let hello = ClientHello {
        capabilities: Bytes::from_static(b"{}"),
        protocol_version: crate::binding::server::PROTOCOL_VERSIONS[0],
        authorization: cache.setup.authorization.clone(),
    };
    let begin = Begin::lifecycle(hello, deadline);
    let (caller, callee) = stream::open(begin);
    tokio::task::spawn_local(session::serve_hydration(proxy.clone(), callee));
    let first = tokio::time::timeout_at(deadline.into(), caller.reply.next()).await;
    let Ok(Some(Frame::Begin(reply))) = first else {
        log::warn(format_args!(
            "cache: proxy {}: no route could be reached for hydration",
            proxy.name
        ));
        caller.initial.abort();
        return None;
    };
    let id = reply.session?;
    let session = proxy.sessions.borrow().get(&id).cloned()?;
    Some((caller, session))
}

/// Writes what the routes serve (`p/caps`).
async fn write_caps(proxy: &Proxy, cache: &Cache, session: &ProxySession) {
    let caps: Vec<u16> = proxy
        .routes
        .iter()
        .map(|r| session.open_caps(r.index).unwrap_or(r.known_caps.get()).0)
        .collect();
    let instructions = session::instructions(proxy, session)
        .and_then(|raw| serde_json::from_slice::<String>(&raw).ok());
    let stored = StoredCaps { caps, instructions };
    match serde_json::to_vec(&stored) {
        Ok(bytes) => {
            if let Err(e) = cache
                .setup
                .store
                .put(&cache.caps_key(), Bytes::from(bytes))
                .await
            {
                log::warn(format_args!(
                    "cache: writing {} failed: {e}",
                    cache.caps_key()
                ));
            }
        }
        Err(e) => log::error(format_args!("cache: encoding the capabilities failed: {e}")),
    }
}

/// The fragments stored by an earlier holder: `[kind][route]`.
async fn load_fragments(proxy: &Proxy, cache: &Cache) -> Fragments {
    let mut out = Vec::with_capacity(KINDS.len());
    for kind in KINDS {
        let mut row = Vec::with_capacity(proxy.routes.len());
        for route in &proxy.routes {
            let value = cache
                .setup
                .store
                .get(&cache.fragment_key(kind, route))
                .await;
            row.push(value.ok().flatten().map(|v| v.bytes));
        }
        out.push(row);
    }
    out
}

/// Hydrates `kinds` in parallel; returns each kind's success and the fragments (updated).
async fn refresh(
    proxy: &Rc<Proxy>,
    session: &Rc<ProxySession>,
    kinds: Vec<Kind>,
    mut fragments: Fragments,
) -> (Vec<(Kind, bool)>, Fragments) {
    let jobs = kinds.iter().map(|kind| {
        let held = slot(*kind)
            .and_then(|at| fragments.get(at).cloned())
            .unwrap_or_default();
        refresh_kind(proxy, session, *kind, held)
    });
    let done = join_all(jobs.collect()).await;
    let mut results = Vec::with_capacity(kinds.len());
    for (kind, (ok, row)) in kinds.into_iter().zip(done) {
        if let Some(at) = slot(kind)
            && let Some(slot_row) = fragments.get_mut(at)
        {
            *slot_row = row;
        }
        results.push((kind, ok));
    }
    (results, fragments)
}

/// Hydrates one kind under its lease: every serving route's items, the merged list
/// written; a route that fails keeps its previous fragment. Returns whether every route
/// answered, and the fragments.
async fn refresh_kind(
    proxy: &Rc<Proxy>,
    session: &Rc<ProxySession>,
    kind: Kind,
    mut held: Vec<Option<Bytes>>,
) -> (bool, Vec<Option<Bytes>>) {
    let Some(cache) = proxy.cache.as_ref() else {
        return (false, held);
    };
    held.resize(proxy.routes.len(), None);
    let lock_key = format!("{}{}.lock", cache.prefix, names(kind).0);
    let Ok(Some(token)) = cache.setup.store.lock(&lock_key, cache.lease_ttl()).await else {
        return (false, held);
    };
    let request = ListRequest {
        kind,
        deadline: Instant::now() + cache.setup.route_timeout,
        authorization: cache.setup.authorization.clone(),
    };
    let serving: Vec<&Route> = proxy
        .routes
        .iter()
        .filter(|r| {
            let caps = session.open_caps(r.index).unwrap_or(r.known_caps.get());
            r.serves(family(kind)) && caps.contains(kind.capability())
        })
        .collect();
    let fetched = join_all(
        serving
            .iter()
            .map(|r| async {
                let started = Instant::now();
                let got = list::collect(proxy, session, r, &request, CACHE_LIST_BYTES_MAX).await;
                let outcome = if got.is_ok() {
                    metrics::Outcome::Ok
                } else {
                    metrics::Outcome::Error
                };
                metrics::record_hydration(r.metrics, outcome, started.elapsed());
                got
            })
            .collect(),
    )
    .await;
    // Still ours? A worker that was stuck past the lease must not overwrite what its
    // successor wrote meanwhile.
    match cache
        .setup
        .store
        .renew(&lock_key, &token, cache.lease_ttl())
        .await
    {
        Ok(true) => {}
        _ => {
            log::warn(format_args!(
                "cache: proxy {}: lost {lock_key} while listing; nothing written",
                proxy.name
            ));
            return (false, held);
        }
    }
    let mut ok = true;
    for (route, got) in serving.iter().zip(fetched) {
        match got {
            Ok(fragment) => {
                let key = cache.fragment_key(kind, route);
                let _ = cache.setup.store.put(&key, fragment.clone()).await;
                if let Some(h) = held.get_mut(route.index) {
                    *h = Some(fragment);
                }
            }
            Err(reset) => {
                ok = false;
                log::warn(format_args!(
                    "cache: proxy {}: toolkit {} kept its previous {} (refresh failed: {})",
                    proxy.name,
                    route.label,
                    kind.method(),
                    session::describe(&reset)
                ));
            }
        }
    }
    // Routes that no longer serve the kind have nothing to contribute.
    for route in &proxy.routes {
        if !serving.iter().any(|r| r.index == route.index)
            && let Some(h) = held.get_mut(route.index)
        {
            *h = None;
        }
    }
    let merged = merge(names(kind).1, &held);
    if let Err(e) = cache.setup.store.put(&cache.list_key(kind), merged).await {
        ok = false;
        log::warn(format_args!(
            "cache: writing {} failed: {e}",
            cache.list_key(kind)
        ));
    }
    let _ = cache.setup.store.unlock(&lock_key, &token).await;
    (ok, held)
}

/// `{"<array>":[` + the non-empty fragments joined by commas + `]}`.
pub(crate) fn merge(array: &str, fragments: &[Option<Bytes>]) -> Bytes {
    let len: usize = fragments.iter().flatten().map(|f| f.len() + 1).sum();
    let mut out = BytesMut::with_capacity(len + array.len() + 8);
    out.put_slice(b"{\"");
    out.put_slice(array.as_bytes());
    out.put_slice(b"\":[");
    let mut first = true;
    for fragment in fragments.iter().flatten().filter(|f| !f.is_empty()) {
        if !first {
            out.put_u8(b',');
        }
        first = false;
        out.put_slice(fragment);
    }
    out.put_slice(b"]}");
    out.freeze()
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn merged_lists_join_the_non_empty_fragments() {
        let f = |s: &'static str| Some(Bytes::from_static(s.as_bytes()));
        assert_eq!(&merge("tools", &[])[..], br#"{"tools":[]}"#);
        assert_eq!(
            &merge(
                "tools",
                &[
                    f(r#"{"name":"a__x"}"#),
                    None,
                    f(""),
                    f(r#"{"name":"c__y"},{"name":"c__z"}"#)
                ]
            )[..],
            br#"{"tools":[{"name":"a__x"},{"name":"c__y"},{"name":"c__z"}]}"#
        );
        assert_eq!(
            &merge("resourceTemplates", &[None])[..],
            br#"{"resourceTemplates":[]}"#
        );
    }

    #[test]
    fn caps_round_trip_through_the_store() {
        let stored = StoredCaps {
            caps: vec![Caps::TOOLS.0, 0],
            instructions: Some("a: \"hi\"".into()),
        };
        let bytes = serde_json::to_vec(&stored).unwrap();
        let back = decode_caps(&bytes).unwrap();
        assert_eq!(back.routes, [Caps::TOOLS, Caps::empty()]);
        assert_eq!(back.instructions.as_deref(), Some(&br#""a: \"hi\"""#[..]));
        assert!(decode_caps(b"garbage").is_none());
    }
}
