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
//!   `get` again, CRC32C-compare each route's items with the last seen and tell each agent
//!   session of this worker that can see a route whose items changed, once
//!   (`list_changed`). A read that fails (a networked store that is down) leaves the view
//!   as it was and is tried again with backoff, and so is a key the store no longer has
//!   (a Redis restarted empty): agents keep being served the last lists;
//! - its **lease loop** tries the binding's `lifecycle.lock`. The one worker that holds it
//!   hydrates ([`hydrate`]): it opens a session through its own proxy (one session per
//!   route, with the cache's credential), lists every kind from every route in parallel,
//!   and writes each route's items (a fragment) and the merged list. It refreshes on the
//!   cache TTL and at once when a route says a list changed; a route whose refresh fails
//!   keeps its previous fragment ("stale on failure") and that route alone is tried again
//!   with backoff from 100 ms up to the lease TTL, so a route that was down (even at the
//!   first hydration) joins as soon as it answers, and a failing route costs the others
//!   no extra listing. Every lease is renewed at a third of its TTL for as long as the
//!   work it guards runs (opening the session, a slow list), so a slow upstream makes the
//!   cache slow, never absent. A renewal the store refuses (another holds the lease) stops
//!   the work; one that errs is tried again while the lease could still be held; another
//!   worker takes over once the lease has expired.
//!
//! **Identity.** A route whose client forwards the agent's `Authorization` may answer each
//! agent differently, and the cache holds what it gave the cache's own credential. So a
//! session is shown such a route's items only once that route accepted the session's own
//! credential (its upstream `initialize` with it succeeded); until then they are cut out
//! of the cached lists it is served ([`CachedList::for_session`]), and a session that no
//! route accepts gets the routes' refusal at `initialize`, as without a cache.
//!
//! Store keys, per proxy binding `p`: `p/tools`, `p/prompts`, `p/resources`,
//! `p/resources/templates` (the merged result objects, exactly as agents get them, behind
//! a one-line header that says where each route's items are: see [`encode_list`]), their
//! fragments `p/<kind>@<toolkit>`, `p/caps` (the routes' capabilities and instructions),
//! and the leases `p/lifecycle.lock` and `p/<kind>.lock`.

use super::list::{self, ListRequest};
use super::session::{self, ProxySession};
use super::{Family, Proxy, Route, join_all};
use crate::binding::proxy::metrics as proxy_metrics;
use crate::limits::{
    CACHE_LIST_BYTES_MAX, CACHE_RETRY_MIN, CACHE_STORE_RETRY_MAX, PROXY_ROUTES_MAX,
};
use crate::log;
use crate::metrics;
use crate::runtime::notify::Notify;
use crate::store::{Store, Token, Value};
use crate::stream::{
    self, Begin, Caps, Challenge, ClientHello, Event, Flush, Frame, Kind, ListKind, Reset,
};
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::fmt::Write;
use std::future::Future;
use std::ops::Range;
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A set of a proxy's routes, bit i for route i.
pub type Routes = u64;
const _: () = assert!(PROXY_ROUTES_MAX <= Routes::BITS as usize);

/// Every route of a proxy with `count` routes.
fn all_routes(count: usize) -> Routes {
    assert!(count <= PROXY_ROUTES_MAX);
    if count == Routes::BITS as usize {
        Routes::MAX
    } else {
        (1 << count) - 1
    }
}

/// True if `set` has route `index`.
fn has(set: Routes, index: usize) -> bool {
    index < Routes::BITS as usize && set & (1 << index) != 0
}

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
pub fn announced(kind: Kind) -> ListKind {
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
    /// The routes whose client forwards the agent's `Authorization` (see "Identity" in
    /// the module doc).
    pub forwarding: Routes,
}

/// What the store says about the routes (`p/caps`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
struct StoredCaps {
    /// Per route, its capability bits (0: it could not be reached).
    caps: Vec<u16>,
    /// Per route, its instructions, as text: each session is told those of the routes it
    /// may see.
    instructions: Vec<Option<String>>,
}

/// The routes' capabilities, as cached.
#[derive(Clone, Debug)]
pub struct CachedCaps {
    pub routes: Vec<Caps>,
    /// Per route, its instructions, as text.
    pub instructions: Vec<Option<String>>,
}

/// A cached list as the store holds it: the merged result object, and where each route's
/// items sit in it.
#[derive(Debug, PartialEq, Eq)]
pub struct CachedList {
    /// `{"<array>":[...]}`, exactly as an agent that sees every route gets it.
    json: Bytes,
    /// The runs of items in `json`, in order, each with the route it came from: its index in
    /// this proxy, or `None` for a route this proxy does not have (a store shared with a node
    /// whose config differs). Invariant: within `json`, not empty, not overlapping.
    spans: Vec<(Option<usize>, Range<usize>)>,
    /// `crcs[i]`: CRC32C of route i's items (0 for none); the last one the foreign routes'.
    crcs: Vec<u32>,
}

impl CachedList {
    /// Reads a stored list for a proxy whose routes are `labels` (in route order); `None`
    /// for bytes not made by [`encode_list`].
    pub(crate) fn decode(stored: &Bytes, labels: &[&str]) -> Option<CachedList> {
        let header_end = memchr::memchr(b'\n', stored)?;
        let header = std::str::from_utf8(stored.get(..header_end)?).ok()?;
        let json = stored.slice(header_end + 1..);
        let mut spans = Vec::new();
        let mut from = 0;
        for (n, span) in header
            .strip_prefix('L')?
            .split_ascii_whitespace()
            .enumerate()
        {
            if n == PROXY_ROUTES_MAX {
                return None;
            }
            let (label, range) = span.split_once('=')?;
            let (start, end) = range.split_once('-')?;
            let (start, end): (usize, usize) = (start.parse().ok()?, end.parse().ok()?);
            if start > end || end > json.len() || (start < end && start < from) {
                return None;
            }
            from = from.max(end);
            if start < end {
                spans.push((labels.iter().position(|l| *l == label), start..end));
            }
        }
        let mut crcs = vec![0; labels.len() + 1];
        for (route, span) in &spans {
            let at = route.unwrap_or(labels.len());
            if let (Some(crc), Some(items)) = (crcs.get_mut(at), json.get(span.clone())) {
                *crc = crc32c::crc32c_append(*crc, items);
            }
        }
        Some(CachedList { json, spans, crcs })
    }

    /// The result a session that may not see the routes in `hidden` is served: the stored
    /// bytes themselves when it sees every route that has items, else a copy without the
    /// hidden routes' items. Items of routes this proxy does not know are shown only to a
    /// session that sees everything (who else may see them cannot be told).
    pub fn for_session(&self, hidden: Routes) -> Bytes {
        let shown = |route: &Option<usize>| match route {
            Some(i) => !has(hidden, *i),
            None => hidden == 0,
        };
        if self.spans.iter().all(|(route, _)| shown(route)) {
            return self.json.clone();
        }
        let items: Vec<&[u8]> = self
            .spans
            .iter()
            .filter(|(route, _)| shown(route))
            .filter_map(|(_, span)| self.json.get(span.clone()))
            .collect();
        let (head, tail) = self.frame();
        let len = head.len() + tail.len() + items.iter().map(|i| i.len() + 1).sum::<usize>();
        let mut out = BytesMut::with_capacity(len);
        out.put_slice(head);
        for (n, item) in items.into_iter().enumerate() {
            if n > 0 {
                out.put_u8(b',');
            }
            out.put_slice(item);
        }
        out.put_slice(tail);
        out.freeze()
    }

    /// The bytes around the items: `{"<array>":[` and `]}` (everything before the first
    /// `[` and from the last `]`: the spans are the only items).
    fn frame(&self) -> (&[u8], &[u8]) {
        let json = &self.json[..];
        let open = memchr::memchr(b'[', json).map_or(0, |at| at + 1);
        let close = memchr::memrchr(b']', json).unwrap_or(json.len());
        (
            json.get(..open).unwrap_or_default(),
            json.get(close.max(open)..).unwrap_or_default(),
        )
    }

    /// The routes whose items differ between `self` and `newer`; every route when the
    /// foreign routes' items changed (who sees those cannot be told apart).
    fn changed(&self, newer: &CachedList) -> Routes {
        let routes = self.crcs.len().max(newer.crcs.len()).saturating_sub(1);
        let routes = routes.min(PROXY_ROUTES_MAX);
        let foreign = |list: &CachedList| list.crcs.last().copied().unwrap_or(0);
        if foreign(self) != foreign(newer) {
            return all_routes(routes);
        }
        let crc = |list: &CachedList, i: usize| {
            let own = list.crcs.len().saturating_sub(1);
            if i < own {
                list.crcs.get(i).copied().unwrap_or(0)
            } else {
                0
            }
        };
        (0..routes)
            .filter(|&i| crc(self, i) != crc(newer, i))
            .fold(0, |set, i| set | (1 << i))
    }
}

/// A worker's copy of the cache.
#[derive(Default)]
struct View {
    lists: [Option<Rc<CachedList>>; 4],
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
    /// Keys whose last read failed: one log line when the first starts failing and one when
    /// the last works again, not one per key.
    failing_reads: std::cell::Cell<usize>,
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
            failing_reads: std::cell::Cell::new(0),
            stop: Notify::new(),
        }
    }

    /// A key's read started failing.
    fn read_failed(&self, proxy: &Proxy, e: &crate::store::StoreError) {
        let before = self.failing_reads.get();
        self.failing_reads.set(before + 1);
        // Agents waiting for the first lists stop waiting (see `wait_ready`).
        self.changed.notify_waiters();
        if before == 0 {
            log::warn(format_args!(
                "cache: proxy {} on worker {}: reading the store failed: {e}; serving what \
                 this worker has, retrying",
                proxy.name, proxy.worker
            ));
        }
    }

    /// A key that failed was read again.
    fn read_recovered(&self, proxy: &Proxy) {
        let now = self.failing_reads.get().saturating_sub(1);
        self.failing_reads.set(now);
        if now == 0 {
            log::info(format_args!(
                "cache: proxy {} on worker {}: reading the store works again",
                proxy.name, proxy.worker
            ));
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

    /// The cached list of `kind`, if hydrated.
    pub fn list(&self, kind: Kind) -> Option<Rc<CachedList>> {
        let at = slot(kind)?;
        self.view.borrow().lists.get(at)?.clone()
    }

    /// True if route `index` forwards the agent's `Authorization` (its items are shown to
    /// a session only once it accepted the session's own credential).
    pub fn forwards(&self, index: usize) -> bool {
        has(self.setup.forwarding, index)
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

    /// Waits (until `deadline`) for [`Cache::ready`]; `None` at the deadline, or at once
    /// while the store cannot be read (a networked store that is down: waiting for lists
    /// that cannot arrive would only hold the agent, who is served live lists instead).
    pub async fn wait_ready(&self, deadline: Instant) -> Option<CachedCaps> {
        loop {
            let changed = self.changed.notified();
            if let Some(caps) = self.ready() {
                return Some(caps);
            }
            if self.failing_reads.get() > 0 {
                return None;
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

    /// Takes a new value of a key into the view; for a list whose routes' items differ
    /// from the last one seen, tells every agent session of this worker that can see one
    /// of those routes. The first value of a list is news only to sessions that were shown
    /// a live list before (they fell back while the cache was not ready), and only if it
    /// differs from what they were shown.
    ///
    /// A key that is absent leaves the view as it was: the cache never deletes its keys, so
    /// an absent one means a store that lost them (a Redis restarted without persistence),
    /// and the last lists stay served until the lease holder writes them again.
    fn apply(&self, proxy: &Proxy, kind: Option<Kind>, value: Option<Value>) {
        let Some(value) = value else {
            return;
        };
        let Some(kind) = kind else {
            if let Some(caps) = decode_caps(&value.bytes) {
                self.view.borrow_mut().caps = Some(caps);
                self.changed.notify_waiters();
            }
            return;
        };
        let Some(at) = slot(kind) else {
            return;
        };
        let labels: Vec<&str> = proxy.routes.iter().map(|r| &*r.label).collect();
        let Some(list) = CachedList::decode(&value.bytes, &labels).map(Rc::new) else {
            // What this worker had stays served.
            log::warn(format_args!(
                "cache: proxy {}: {} in the store is not a cached list; kept the previous",
                proxy.name,
                self.list_key(kind)
            ));
            return;
        };
        let before = {
            let mut view = self.view.borrow_mut();
            match view.lists.get_mut(at) {
                Some(held) => held.replace(list.clone()),
                None => return,
            }
        };
        self.changed.notify_waiters();
        let news = match &before {
            Some(before) => News::Changed(before.changed(&list)),
            None => News::First(&list, at),
        };
        let told = proxy.announce(announced(kind), news);
        proxy_metrics::with(|m| m.cache.notifications += told);
    }
}

/// What a new value of a cached list is to the sessions.
pub enum News<'a> {
    /// The routes whose items changed.
    Changed(Routes),
    /// The first value of the list in slot `.1`, for sessions shown a live list before.
    First(&'a CachedList, usize),
}

fn decode_caps(bytes: &[u8]) -> Option<CachedCaps> {
    let stored: StoredCaps = serde_json::from_slice(bytes).ok()?;
    Some(CachedCaps {
        routes: stored.caps.into_iter().map(Caps).collect(),
        instructions: stored.instructions,
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
    // While reads fail (a networked store that is down), the view keeps what it had and
    // the read is tried again with backoff: the change it was for may never be announced
    // again.
    let mut retry = CACHE_RETRY_MIN;
    let mut failing = false;
    loop {
        let read = store.get(&key).await;
        let Some(proxy) = proxy.upgrade() else {
            return;
        };
        let Some(cache) = proxy.cache.as_ref() else {
            return;
        };
        match read {
            Ok(value) => {
                if failing {
                    failing = false;
                    cache.read_recovered(&proxy);
                }
                retry = CACHE_RETRY_MIN;
                cache.apply(&proxy, kind, value);
            }
            Err(e) => {
                if !failing {
                    failing = true;
                    cache.read_failed(&proxy, &e);
                }
                drop(proxy);
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(CACHE_STORE_RETRY_MAX);
                continue;
            }
        }
        drop(proxy);
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
    // Logged when taking the lease starts failing (the store is down) and not again until
    // it has worked once.
    let mut failing = false;
    let mut retry = CACHE_RETRY_MIN;
    // A lease this worker gave up while the store could not be told.
    let mut unreleased: Option<Token> = None;
    loop {
        let Some(p) = proxy.upgrade() else {
            return;
        };
        let Some(cache) = p.cache.as_ref() else {
            return;
        };
        let key = format!("{}lifecycle.lock", cache.prefix);
        if cache.stopping.get() {
            // One last try to release a lease the store could not be told about, so a
            // node that stops does not hold the others up until it expires.
            if let Some(token) = unreleased.take() {
                let _ = cache.setup.store.unlock(&key, &token).await;
            }
            return;
        }
        if let Some(token) = unreleased.take()
            && cache.setup.store.unlock(&key, &token).await.is_err()
        {
            unreleased = Some(token);
        }
        let taken = cache.setup.store.lock(&key, cache.lease_ttl()).await;
        if taken.is_ok() && failing {
            log::info(format_args!("cache: taking {key} works again"));
            failing = false;
        }
        // A store that failed is tried again soon (with backoff), so hydration resumes
        // as soon as it is back; a lease held elsewhere is tried every third of its TTL.
        let wait = if taken.is_err() {
            let wait = retry.min(cache.lease_ttl() / 3);
            retry = (retry * 2).min(CACHE_STORE_RETRY_MAX);
            wait
        } else {
            retry = CACHE_RETRY_MIN;
            cache.lease_ttl() / 3
        };
        match taken {
            Ok(Some(token)) => {
                proxy_metrics::with(|m| m.cache.lease_changes += 1);
                log::info(format_args!(
                    "cache: worker {} holds the hydration lease of proxy {}",
                    p.worker, p.name
                ));
                // Boxed: it lives as long as the lease, the loop around it far longer.
                Box::pin(hydrate(&p, &key, &token)).await;
                if cache.setup.store.unlock(&key, &token).await.is_err() {
                    // The store could not be told (it is down, or was for a moment): the
                    // lease would block every node until it expires. Released once the
                    // store answers again (a no-op if it expired and was taken meanwhile:
                    // the store compares the token).
                    unreleased = Some(token);
                }
                log::info(format_args!(
                    "cache: worker {} gave up the hydration lease of proxy {}",
                    p.worker, p.name
                ));
            }
            Ok(None) => {}
            Err(e) if !failing => {
                log::warn(format_args!("cache: taking {key} failed: {e}; retrying"));
                failing = true;
            }
            Err(_) => {}
        }
        let stopped = cache.stop.notified();
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = stopped => return,
        }
    }
}

/// A refresh in progress: the routes each kind failed to list, and the fragments.
type Refresh = std::pin::Pin<Box<dyn Future<Output = (Vec<(Kind, Failed)>, Fragments)>>>;

/// The routes' last good items per kind: `[kind][route]`.
type Fragments = Vec<Vec<Option<Bytes>>>;

/// The routes one kind's refresh could not list, with why (for the log), or `All` when
/// the kind's lease was lost or its list could not be written (nothing was).
enum Failed {
    Routes(Vec<(usize, Reset)>),
    All,
}

/// What the hydrator is waiting for next.
enum Wake {
    Renew,
    Refresh(Vec<(Kind, Routes)>),
    Done(Vec<(Kind, Failed)>),
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

/// A lease held: its key, token and TTL.
struct Lease<'a> {
    store: &'a dyn Store,
    key: &'a str,
    token: &'a Token,
    ttl: Duration,
}

impl Lease<'_> {
    /// Renews the lease, renewed last at `renewed`; false once it is lost. The store saying
    /// the token no longer holds it is final; a store error (a timeout, a reconnection) is
    /// tried again every tenth of the TTL for as long as the lease, counted from its last
    /// renewal, could still be held, so one slow answer does not give the lease up early.
    async fn keep(&self, renewed: &mut Instant) -> bool {
        loop {
            match self.store.renew(self.key, self.token, self.ttl).await {
                Ok(true) => {
                    *renewed = Instant::now();
                    return true;
                }
                Ok(false) => return false,
                Err(_) => {
                    let retry = Instant::now() + self.ttl / 10;
                    if retry >= *renewed + self.ttl {
                        return false;
                    }
                    tokio::time::sleep_until(retry.into()).await;
                }
            }
        }
    }

    /// Runs `work` while renewing the lease every third of its TTL; `None` (the work
    /// dropped) once the lease is lost: the work is someone else's by then.
    async fn renewing<T>(&self, work: impl Future<Output = T>) -> Option<T> {
        let mut work = std::pin::pin!(work);
        let mut renewed = Instant::now();
        loop {
            let renew_at = tokio::time::sleep_until((renewed + self.ttl / 3).into());
            tokio::select! {
                biased;
                out = &mut work => return Some(out),
                () = renew_at => {
                    if !self.keep(&mut renewed).await {
                        return None;
                    }
                }
            }
        }
    }
}

/// Per kind: the routes to list again after a failure, when, and the wait after that.
struct Retry {
    routes: [Routes; 4],
    at: [Option<Instant>; 4],
    backoff: [Duration; 4],
    /// Routes that failed their last listing of some kind: logged when they start failing
    /// and when they answer again, not at every retry.
    failing: [Routes; 4],
}

/// Hydrates while this worker holds the lease `key` (token `token`): until a renewal
/// fails or the hydration session ends.
async fn hydrate(proxy: &Rc<Proxy>, key: &str, token: &Token) {
    let Some(cache) = proxy.cache.as_ref() else {
        return;
    };
    let lease = Lease {
        store: &*cache.setup.store,
        key,
        token,
        ttl: cache.lease_ttl(),
    };
    // Opening the session can take the routes' whole connect and response timeouts,
    // longer than the lease: it is renewed meanwhile.
    let opened = lease
        .renewing(async {
            let (life, session) = open_session(proxy, cache).await?;
            let caps = write_caps(proxy, cache, &session, None).await;
            let fragments = load_fragments(proxy, cache).await;
            Some((life, session, caps, fragments))
        })
        .await
        .flatten();
    let Some((life, session, mut caps, mut fragments)) = opened else {
        return;
    };
    // Routes' list_changed arrive on their event streams.
    let _ = life.reply.challenge(Challenge::Resume {
        last_event_id: None,
    });
    let every = all_routes(proxy.routes.len());
    let mut pending: [Routes; 4] = [every; 4];
    let mut retry = Retry {
        routes: [0; 4],
        at: [None; 4],
        backoff: [CACHE_RETRY_MIN; 4],
        failing: [0; 4],
    };
    let mut next_ttl = Instant::now() + cache.setup.ttl;
    let mut renewed = Instant::now();
    let mut renew_at = renewed + lease.ttl / 3;
    let mut running: Option<Refresh> = None;
    loop {
        let stopped = cache.stop.notified();
        if cache.stopping.get() {
            break;
        }
        if running.is_none() && pending.iter().any(|p| *p != 0) {
            let jobs: Vec<(Kind, Routes)> = KINDS
                .iter()
                .zip(std::mem::take(&mut pending))
                .filter(|(_, routes)| *routes != 0)
                .map(|(kind, routes)| (*kind, routes))
                .collect();
            let held = std::mem::take(&mut fragments);
            let (p, s) = (proxy.clone(), session.clone());
            running = Some(Box::pin(async move { refresh(&p, &s, jobs, held).await }));
        }
        let due_retry = retry.at.iter().flatten().min().copied();
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
                Wake::Refresh(KINDS.iter().map(|k| (*k, every)).collect())
            }
            () = async {
                match due_retry {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => Wake::Refresh(retry.due(Instant::now())),
        };
        match wake {
            Wake::Renew => match lease.keep(&mut renewed).await {
                true => renew_at = renewed + lease.ttl / 3,
                false => {
                    log::warn(format_args!(
                        "cache: worker {} lost the hydration lease of proxy {}",
                        proxy.worker, proxy.name
                    ));
                    break;
                }
            },
            Wake::Refresh(jobs) => {
                for (kind, routes) in jobs {
                    if let Some(p) = slot(kind).and_then(|at| pending.get_mut(at)) {
                        *p |= routes;
                    }
                }
            }
            Wake::Done(results) => {
                retry.record(proxy, results, every, lease.ttl);
                // A route that opened (or came back) may serve more than was recorded.
                caps = write_caps(proxy, cache, &session, caps).await;
            }
            Wake::Lifecycle(Some(Frame::Flush(Flush {
                event: Event::ListChanged(list),
                ..
            }))) => {
                for kind in kinds_of(list) {
                    if let Some(p) = slot(kind).and_then(|at| pending.get_mut(at)) {
                        *p = every;
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

impl Retry {
    /// The kinds and routes whose retry is due at `now` (taken off the schedule).
    fn due(&mut self, now: Instant) -> Vec<(Kind, Routes)> {
        let mut due = Vec::new();
        for (at, kind) in KINDS.iter().enumerate() {
            let (Some(when), Some(routes)) = (self.at.get_mut(at), self.routes.get_mut(at)) else {
                continue;
            };
            if when.is_some_and(|t| t <= now) {
                *when = None;
                due.push((*kind, std::mem::take(routes)));
            }
        }
        due
    }

    /// Takes a refresh's results: failed routes are scheduled again (per kind, backoff
    /// doubling from [`CACHE_RETRY_MIN`] up to `cap`), a kind that fully succeeded has its
    /// backoff reset; a route that starts failing, or answers again, is one log line.
    fn record(
        &mut self,
        proxy: &Proxy,
        results: Vec<(Kind, Failed)>,
        every: Routes,
        cap: Duration,
    ) {
        for (kind, failed) in results {
            let Some(at) = slot(kind) else { continue };
            // A lost lease or a failed write says nothing about the routes: all are tried
            // again, and what is known of which route fails stays as it was.
            let (routes, reasons, judged) = match failed {
                Failed::All => (every, Vec::new(), false),
                Failed::Routes(list) => (
                    list.iter().fold(0, |set, (i, _)| set | (1 << *i)),
                    list,
                    true,
                ),
            };
            proxy_metrics::with(|m| {
                if routes == 0 {
                    m.cache.refreshes_ok += 1;
                } else {
                    m.cache.refreshes_failed += 1;
                }
            });
            let (Some(retry_routes), Some(when), Some(backoff), Some(failing)) = (
                self.routes.get_mut(at),
                self.at.get_mut(at),
                self.backoff.get_mut(at),
                self.failing.get_mut(at),
            ) else {
                continue;
            };
            for (index, reason) in &reasons {
                if !has(*failing, *index)
                    && let Some(route) = proxy.routes.get(*index)
                {
                    log::warn(format_args!(
                        "cache: proxy {}: toolkit {} kept its previous {} (refresh failed: {}); retrying with backoff",
                        proxy.name,
                        route.label,
                        kind.method(),
                        session::describe(reason)
                    ));
                }
            }
            if judged {
                let recovered = *failing & !routes;
                for route in proxy.routes.iter().filter(|r| has(recovered, r.index)) {
                    log::info(format_args!(
                        "cache: proxy {}: toolkit {} listed its {} again",
                        proxy.name,
                        route.label,
                        kind.method()
                    ));
                }
                *failing = routes;
            }
            if routes == 0 {
                *backoff = CACHE_RETRY_MIN;
                *retry_routes = 0;
                *when = None;
            } else {
                *retry_routes |= routes;
                *when = Some(Instant::now() + *backoff);
                *backoff = (*backoff * 2).min(cap);
            }
        }
    }
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
        protocol_version: crate::binding::protocol::LATEST,
        authorization: cache.setup.authorization.clone(),
        adopt: None,
        shared: false,
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

/// Writes what the routes serve (`p/caps`) unless it is what was written last
/// (`written`); returns what the store holds now.
async fn write_caps(
    proxy: &Proxy,
    cache: &Cache,
    session: &ProxySession,
    written: Option<StoredCaps>,
) -> Option<StoredCaps> {
    let caps: Vec<u16> = proxy
        .routes
        .iter()
        .map(|r| session.open_caps(r.index).unwrap_or(r.known_caps.get()).0)
        .collect();
    let instructions = (0..proxy.routes.len())
        .map(|i| session::route_instructions(session, i))
        .collect();
    let stored = StoredCaps { caps, instructions };
    if written.as_ref() == Some(&stored) {
        return written;
    }
    let bytes = match serde_json::to_vec(&stored) {
        Ok(bytes) => bytes,
        Err(e) => {
            log::error(format_args!("cache: encoding the capabilities failed: {e}"));
            return written;
        }
    };
    match cache
        .setup
        .store
        .put(&cache.caps_key(), Bytes::from(bytes))
        .await
    {
        Ok(_) => Some(stored),
        Err(e) => {
            log::warn(format_args!(
                "cache: writing {} failed: {e}",
                cache.caps_key()
            ));
            written
        }
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

/// Hydrates each kind of `jobs` from its routes, all in parallel; returns each kind's
/// failed routes and the fragments (updated).
async fn refresh(
    proxy: &Rc<Proxy>,
    session: &Rc<ProxySession>,
    jobs: Vec<(Kind, Routes)>,
    mut fragments: Fragments,
) -> (Vec<(Kind, Failed)>, Fragments) {
    let work = jobs.iter().map(|(kind, routes)| {
        let held = slot(*kind)
            .and_then(|at| fragments.get(at).cloned())
            .unwrap_or_default();
        refresh_kind(proxy, session, *kind, *routes, held)
    });
    let done = join_all(work.collect()).await;
    let mut results = Vec::with_capacity(jobs.len());
    for ((kind, _), (failed, row)) in jobs.into_iter().zip(done) {
        if let Some(at) = slot(kind)
            && let Some(slot_row) = fragments.get_mut(at)
        {
            *slot_row = row;
        }
        results.push((kind, failed));
    }
    (results, fragments)
}

/// Hydrates one kind under its lease (renewed while the routes list): the items of the
/// `routes` that serve it are fetched again, every other route keeps its fragment, and
/// the merged list is written. A route that fails keeps its previous fragment. Returns
/// the routes that failed, and the fragments.
async fn refresh_kind(
    proxy: &Rc<Proxy>,
    session: &Rc<ProxySession>,
    kind: Kind,
    routes: Routes,
    mut held: Vec<Option<Bytes>>,
) -> (Failed, Vec<Option<Bytes>>) {
    let Some(cache) = proxy.cache.as_ref() else {
        return (Failed::All, held);
    };
    held.resize(proxy.routes.len(), None);
    let lock_key = format!("{}{}.lock", cache.prefix, names(kind).0);
    let Ok(Some(token)) = cache.setup.store.lock(&lock_key, cache.lease_ttl()).await else {
        return (Failed::All, held);
    };
    let lease = Lease {
        store: &*cache.setup.store,
        key: &lock_key,
        token: &token,
        ttl: cache.lease_ttl(),
    };
    let request = ListRequest {
        kind,
        deadline: Instant::now() + cache.setup.route_timeout,
        authorization: cache.setup.authorization.clone(),
        force_open: true,
    };
    // A route whose capabilities are not known yet (it was never reached) is asked too:
    // asking opens it, and a route that turns out not to serve the kind gives nothing.
    let asked: Vec<&Route> = proxy
        .routes
        .iter()
        .filter(|r| has(routes, r.index) && r.serves(family(kind)))
        .filter(|r| {
            let caps = session.open_caps(r.index).unwrap_or(r.known_caps.get());
            caps == Caps::empty() || caps.contains(kind.capability())
        })
        .collect();
    let fetch = join_all(
        asked
            .iter()
            .map(|r| async {
                let started = Instant::now();
                let got = list::collect(proxy, session, r, &request, CACHE_LIST_BYTES_MAX).await;
                let outcome = if got.is_ok() {
                    metrics::Outcome::Ok
                } else {
                    metrics::Outcome::Error
                };
                proxy_metrics::record_hydration(r.metrics, outcome, started.elapsed());
                got
            })
            .collect(),
    );
    let fetched = lease.renewing(fetch).await;
    // Still ours? A worker that was stuck past the lease must not overwrite what its
    // successor wrote meanwhile.
    let ours = fetched.is_some()
        && matches!(
            cache.setup.store.renew(&lock_key, &token, lease.ttl).await,
            Ok(true)
        );
    let Some(fetched) = fetched.filter(|_| ours) else {
        log::warn(format_args!(
            "cache: proxy {}: lost {lock_key} while listing; nothing written",
            proxy.name
        ));
        return (Failed::All, held);
    };
    let mut failed = Vec::new();
    for (route, got) in asked.iter().zip(fetched) {
        match got {
            Ok(fragment) => {
                let key = cache.fragment_key(kind, route);
                let _ = cache.setup.store.put(&key, fragment.clone()).await;
                if let Some(h) = held.get_mut(route.index) {
                    *h = Some(fragment);
                }
            }
            Err(reset) => failed.push((route.index, reset)),
        }
    }
    // Routes asked that no longer serve the kind (open, without the capability, or
    // excluded by their allow-list) have nothing to contribute.
    for route in proxy.routes.iter().filter(|r| has(routes, r.index)) {
        let serves = asked.iter().any(|r| r.index == route.index);
        if !serves && let Some(h) = held.get_mut(route.index) {
            *h = None;
        }
    }
    let labels: Vec<&str> = proxy.routes.iter().map(|r| &*r.label).collect();
    let merged = encode_list(names(kind).1, &labels, &held);
    if let Err(e) = cache.setup.store.put(&cache.list_key(kind), merged).await {
        log::warn(format_args!(
            "cache: writing {} failed: {e}",
            cache.list_key(kind)
        ));
        let _ = cache.setup.store.unlock(&lock_key, &token).await;
        return (Failed::All, held);
    }
    let _ = cache.setup.store.unlock(&lock_key, &token).await;
    (Failed::Routes(failed), held)
}

/// A cached list as stored: the header `L <label>=<start>-<end> …` (each route's toolkit
/// label and its items' span within the JSON, `0-0` for none) and a newline, then
/// `{"<array>":[` + the non-empty fragments joined by commas + `]}`. Agents are served the
/// JSON after the header (a slice: no copy); the header lets a session that may not see a
/// route be served without it, by any node whose config names the same toolkits.
pub fn encode_list(array: &str, labels: &[&str], fragments: &[Option<Bytes>]) -> Bytes {
    assert!(labels.len() == fragments.len());
    let mut json = BytesMut::with_capacity(
        fragments
            .iter()
            .flatten()
            .map(|f| f.len() + 1)
            .sum::<usize>()
            + array.len()
            + 8,
    );
    json.put_slice(b"{\"");
    json.put_slice(array.as_bytes());
    json.put_slice(b"\":[");
    let mut spans = Vec::with_capacity(fragments.len());
    let mut first = true;
    for fragment in fragments {
        match fragment.as_ref().filter(|f| !f.is_empty()) {
            Some(fragment) => {
                if !first {
                    json.put_u8(b',');
                }
                first = false;
                let start = json.len();
                json.put_slice(fragment);
                spans.push(start..json.len());
            }
            None => spans.push(0..0),
        }
    }
    json.put_slice(b"]}");
    let mut header = String::with_capacity(2 + spans.len() * 24);
    header.push('L');
    for (label, span) in labels.iter().zip(&spans) {
        let _ = write!(header, " {label}={}-{}", span.start, span.end);
    }
    header.push('\n');
    let mut out = BytesMut::with_capacity(header.len() + json.len());
    out.put_slice(header.as_bytes());
    out.put_slice(&json);
    out.freeze()
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::store::testing::Hooked;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_renewal_that_errs_is_tried_again_while_the_lease_could_be_held() {
        crate::testing::run_local(async {
            let store = Hooked::default();
            let ttl = Duration::from_millis(400);
            let Ok(Some(token)) = store.lock("l", ttl).await else {
                panic!("the lease is free")
            };
            let lease = Lease {
                store: &store,
                key: "l",
                token: &token,
                ttl,
            };
            // Two errors, then an answer: still held.
            store.renew_errors.store(2, Ordering::Release);
            let mut renewed = Instant::now();
            assert!(lease.keep(&mut renewed).await);
            assert_eq!(store.renew_errors.load(Ordering::Acquire), 0);
            // Errors for longer than the lease could be held: given up, in bounded time.
            store.renew_errors.store(1000, Ordering::Release);
            let started = Instant::now();
            assert!(!lease.keep(&mut renewed).await);
            assert!(started.elapsed() < ttl + ttl / 5, "{:?}", started.elapsed());
            // Another holds it: final at once.
            store.renew_errors.store(0, Ordering::Release);
            assert_eq!(store.unlock("l", &token).await, Ok(true));
            assert!(store.lock("l", ttl).await.is_ok_and(|t| t.is_some()));
            let started = Instant::now();
            assert!(!lease.keep(&mut renewed).await);
            assert!(started.elapsed() < ttl / 10);
        });
    }

    fn f(s: &'static str) -> Option<Bytes> {
        Some(Bytes::from_static(s.as_bytes()))
    }

    const ABCD: [&str; 4] = ["a", "b", "c", "d"];

    #[test]
    fn merged_lists_join_the_non_empty_fragments_behind_their_spans() {
        let empty = encode_list("tools", &[], &[]);
        assert_eq!(&empty[..], b"L\n{\"tools\":[]}");
        let stored = encode_list(
            "tools",
            &ABCD,
            &[
                f(r#"{"name":"a__x"}"#),
                None,
                f(""),
                f(r#"{"name":"c__y"},{"name":"c__z"}"#),
            ],
        );
        let list = CachedList::decode(&stored, &ABCD).unwrap();
        assert_eq!(
            &list.json[..],
            br#"{"tools":[{"name":"a__x"},{"name":"c__y"},{"name":"c__z"}]}"#
        );
        assert_eq!(list.spans, [(Some(0), 10..25), (Some(3), 26..57)]);
        assert_eq!(
            &stored[..stored.len() - list.json.len()],
            b"L a=10-25 b=0-0 c=0-0 d=26-57\n"
        );
        let templates =
            CachedList::decode(&encode_list("resourceTemplates", &["a"], &[None]), &["a"]).unwrap();
        assert_eq!(&templates.json[..], br#"{"resourceTemplates":[]}"#);
    }

    #[test]
    fn a_session_is_served_only_the_routes_it_may_see() {
        let stored = encode_list(
            "tools",
            &ABCD,
            &[
                f(r#"{"name":"a__x"}"#),
                f(r#"{"name":"b__y"},{"name":"b__z"}"#),
                None,
                f(r#"{"name":"d__w"}"#),
            ],
        );
        let list = CachedList::decode(&stored, &ABCD).unwrap();
        // Seeing everything (or hiding only routes without items): the stored bytes.
        assert_eq!(list.for_session(0), list.json);
        assert_eq!(
            list.for_session(0b0100).as_ptr(),
            list.json.as_ptr(),
            "no copy"
        );
        assert_eq!(
            &list.for_session(0b0010)[..],
            br#"{"tools":[{"name":"a__x"},{"name":"d__w"}]}"#
        );
        assert_eq!(
            &list.for_session(0b1001)[..],
            br#"{"tools":[{"name":"b__y"},{"name":"b__z"}]}"#
        );
        assert_eq!(&list.for_session(0b1011)[..], br#"{"tools":[]}"#);
        for hidden in 0..16u64 {
            let got: serde_json::Value = serde_json::from_slice(&list.for_session(hidden)).unwrap();
            assert!(got["tools"].is_array(), "{hidden:#b}: {got}");
        }
    }

    #[test]
    fn routes_are_found_by_label_and_unknown_ones_shown_only_to_who_sees_all() {
        // Written by a node whose routes are a, b, d; read by one whose routes are d, a.
        let stored = encode_list(
            "tools",
            &["a", "b", "d"],
            &[
                f(r#"{"name":"a__x"}"#),
                f(r#"{"name":"b__y"}"#),
                f(r#"{"name":"d__w"}"#),
            ],
        );
        let list = CachedList::decode(&stored, &["d", "a"]).unwrap();
        assert_eq!(
            list.spans.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
            [Some(1), None, Some(0)]
        );
        assert_eq!(list.for_session(0), list.json);
        assert_eq!(
            &list.for_session(0b01)[..],
            br#"{"tools":[{"name":"a__x"}]}"#
        );
        assert_eq!(
            &list.for_session(0b10)[..],
            br#"{"tools":[{"name":"d__w"}]}"#
        );
    }

    #[test]
    fn changes_are_told_route_by_route() {
        let two = ["a", "b"];
        let decode = |fragments: &[Option<Bytes>], labels: &[&str]| {
            CachedList::decode(&encode_list("tools", labels, fragments), &["a", "b", "c"]).unwrap()
        };
        let one = decode(&[f("{\"n\":1}"), f("{\"n\":2}")], &two);
        let two_ = decode(&[f("{\"n\":1}"), f("{\"n\":3}")], &two);
        let three = decode(&[f("{\"n\":1}"), f("{\"n\":3}"), f("{}")], &["a", "b", "c"]);
        let gone = decode(&[None, f("{\"n\":3}")], &two);
        let foreign = decode(
            &[f("{\"n\":1}"), f("{\"n\":3}"), f("{}")],
            &["a", "b", "zz"],
        );
        assert_eq!(one.changed(&one), 0);
        assert_eq!(one.changed(&two_), 0b10);
        assert_eq!(two_.changed(&three), 0b100, "a route that joins");
        assert_eq!(two_.changed(&gone), 0b01, "a route whose items went");
        assert_eq!(
            two_.changed(&foreign),
            0b111,
            "a foreign route's items: everyone"
        );
    }

    #[test]
    fn stored_bytes_that_are_not_a_cached_list_are_refused() {
        for bad in [
            &b""[..],
            b"{\"tools\":[]}",
            b"X a=0-0\n{}",
            b"L a=5-3\n{\"tools\":[]}",
            b"L a=0-99\n{\"tools\":[]}",
            b"L a=10-12 b=9-11\n{\"tools\":[1,2]}",
            b"L a=a-b\n{}",
            b"L a=1\n{}",
            b"L 0-0\n{}",
            b"L \xff=0-0\n{}",
        ] {
            assert!(
                CachedList::decode(&Bytes::copy_from_slice(bad), &ABCD).is_none(),
                "{bad:?}"
            );
        }
        let many = format!("L{}\n{{}}", " a=0-0".repeat(PROXY_ROUTES_MAX + 1));
        assert!(CachedList::decode(&Bytes::from(many), &ABCD).is_none());
    }

    #[test]
    fn route_sets() {
        assert_eq!(all_routes(0), 0);
        assert_eq!(all_routes(3), 0b111);
        assert_eq!(all_routes(64), u64::MAX);
        assert!(has(0b100, 2));
        assert!(!has(0b100, 1));
        assert!(!has(u64::MAX, 64));
    }

    #[test]
    fn caps_round_trip_through_the_store() {
        let stored = StoredCaps {
            caps: vec![Caps::TOOLS.0, 0],
            instructions: vec![Some("say \"hi\"".into()), None],
        };
        let bytes = serde_json::to_vec(&stored).unwrap();
        let back = decode_caps(&bytes).unwrap();
        assert_eq!(back.routes, [Caps::TOOLS, Caps::empty()]);
        assert_eq!(back.instructions, [Some("say \"hi\"".to_owned()), None]);
        assert!(decode_caps(b"garbage").is_none());
    }
}
