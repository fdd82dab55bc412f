//! What keeps the proxy's list cache filled and followed, per proxy binding and worker
//! (the cache itself, the worker's view of it, is [`super::cache`]):
//!
//! - the **watchers** (one small task per key) follow the store: at start they `get` every
//!   key (a watch may never fire for a value written before it began), then on each change
//!   `get` again and hand the value to the view ([`Cache::apply`], which tells the
//!   sessions a list changed). A read that fails (a networked store that is down) leaves
//!   the view as it was and is tried again with backoff, and so is a key the store no
//!   longer has (a Redis restarted empty): agents keep being served the last lists;
//! - the **lease loop** tries the binding's `lifecycle.lock`. The one worker that holds it
//!   hydrates ([`hydrate`]): it opens a session through its own proxy (one session per
//!   route, with the cache's credential), lists every kind from every route in parallel
//!   (the same merge as an agent's live list, `list::collect`), and writes each route's
//!   items (a fragment) and the merged list. It refreshes on the cache TTL and at once when
//!   a route says a list changed; a route whose refresh fails keeps its previous fragment
//!   ("stale on failure") and that route alone is tried again with backoff from 100 ms up
//!   to the lease TTL, so a route that was down (even at the first hydration) joins as soon
//!   as it answers, and a failing route costs the others no extra listing. Every lease is
//!   renewed at a third of its TTL for as long as the work it guards runs (opening the
//!   session, a slow list), so a slow upstream makes the cache slow, never absent. A
//!   renewal the store refuses (another holds the lease) stops the work; one that errs is
//!   tried again while the lease could still be held; another worker takes over once the
//!   lease has expired.
//!
//! This module sits above the view, the sessions and the list merge: it uses all three,
//! and none of them uses it.

use super::cache::{
    Cache, KINDS, Routes, StoredCaps, StoredRoute, all_routes, encode_list, encoded_list_len,
    family, has, names, slot,
};
use super::list::{self, ListRequest};
use super::session::{self, ProxySession};
use super::{Proxy, Route, join_all};
use crate::binding::proxy::metrics as proxy_metrics;
use crate::limits::{
    CACHE_FRAGMENT_READ_TRIES, CACHE_LIST_BYTES_MAX, CACHE_MERGED_LIST_BYTES_MAX,
    CACHE_REFRESH_INTERVAL_MIN, CACHE_RETRY_MIN, CACHE_STORE_RETRY_MAX,
};
use crate::log;
use crate::metrics;
use crate::store::{Store, StoreError, Token};
use crate::stream::{
    self, Begin, Caps, Challenge, ClientHello, Event, Flush, Frame, Kind, ListKind, Reset,
};
use bytes::Bytes;
use std::future::Future;
use std::rc::{Rc, Weak};
use std::time::{Duration, Instant};

/// Starts this worker's watchers and lease loop for the proxy's cache.
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
            let fragments = load_fragments(proxy, cache).await?;
            let (life, session) = open_session(proxy, cache).await?;
            let caps = write_caps(proxy, cache, &session, None).await;
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
    // When the last refresh began: the next waits until CACHE_REFRESH_INTERVAL_MIN after.
    let mut began: Option<Instant> = None;
    loop {
        let stopped = cache.stop.notified();
        if cache.stopping.get() {
            break;
        }
        let due = pending.iter().any(|p| *p != 0);
        let held_back = began
            .map(|at| at + CACHE_REFRESH_INTERVAL_MIN)
            .filter(|at| *at > Instant::now());
        let wait_for_turn = held_back.filter(|_| running.is_none() && due);
        if running.is_none() && due && held_back.is_none() {
            began = Some(Instant::now());
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
            () = async {
                match wait_for_turn {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            } => Wake::Refresh(Vec::new()),
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
                // Only the routes that said so are listed again (one route's storm of
                // notifications must not re-list every other route), and not sooner
                // than CACHE_REFRESH_INTERVAL_MIN after the last refresh began.
                let routes = session.take_changed_routes(list);
                for kind in kinds_of(list) {
                    if let Some(p) = slot(kind).and_then(|at| pending.get_mut(at)) {
                        *p |= routes;
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

/// Writes what the routes serve (`p/routes`) unless it is what was written last
/// (`written`); returns what the store holds now.
async fn write_caps(
    proxy: &Proxy,
    cache: &Cache,
    session: &ProxySession,
    written: Option<StoredCaps>,
) -> Option<StoredCaps> {
    let routes = proxy
        .routes
        .iter()
        .map(|r| StoredRoute {
            label: r.label.to_string(),
            caps: session.open_caps(r.index).unwrap_or(r.known_caps.get()).0,
            instructions: session::route_instructions(session, r.index),
        })
        .collect();
    let stored = StoredCaps { routes };
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

/// The fragments stored by an earlier holder: `[kind][route]`. `None` when one of them
/// cannot be read: a route that then failed its listing would keep no fragment, and the
/// merged list written without it would drop the route's items that the store still
/// holds. The lease is given up instead, and taken again once the store answers.
async fn load_fragments(proxy: &Proxy, cache: &Cache) -> Option<Fragments> {
    let store = &*cache.setup.store;
    let mut out = Vec::with_capacity(KINDS.len());
    for kind in KINDS {
        let mut row = Vec::with_capacity(proxy.routes.len());
        for route in &proxy.routes {
            let key = cache.fragment_key(kind, route);
            match read_fragment(store, &key).await {
                Ok(bytes) => row.push(bytes),
                Err(e) => {
                    log::warn(format_args!(
                        "cache: reading {key} failed: {e}; giving the hydration lease up"
                    ));
                    return None;
                }
            }
        }
        out.push(row);
    }
    Some(out)
}

/// One stored fragment, tried [`CACHE_FRAGMENT_READ_TRIES`] times (waits doubling from
/// [`CACHE_RETRY_MIN`]) before its store error is final. A value that will never read
/// (planted by someone else, of another type: [`StoreError::lasting`]) is no fragment,
/// logged: giving the lease up for it would stop every node's hydration for good.
async fn read_fragment(store: &dyn Store, key: &str) -> Result<Option<Bytes>, StoreError> {
    let mut wait = CACHE_RETRY_MIN;
    let mut tries = 1;
    loop {
        match store.get(key).await {
            Ok(value) => return Ok(value.map(|v| v.bytes)),
            Err(e) if e.lasting => {
                log::warn(format_args!(
                    "cache: {key} cannot be read ({e}); hydrating as if it were not there"
                ));
                return Ok(None);
            }
            Err(e) if tries >= CACHE_FRAGMENT_READ_TRIES => return Err(e),
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
                tries += 1;
            }
        }
    }
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
    let (merged, left_out) = merge_within(
        names(kind).1,
        &labels,
        &mut held,
        CACHE_MERGED_LIST_BYTES_MAX,
    );
    for (index, len) in left_out {
        let label = proxy.routes.get(index).map_or("?", |r| &*r.label);
        log::warn(format_args!(
            "cache: proxy {}: the {} of toolkit {label} ({len} bytes) are left out: with the \
             other toolkits' they pass {CACHE_MERGED_LIST_BYTES_MAX} bytes",
            proxy.name,
            names(kind).1,
        ));
        failed.retain(|(i, _)| *i != index);
        failed.push((index, super::internal("the list is too large to cache")));
    }
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

/// The merged list of `held` (see [`encode_list`]) in at most `bytes_max` bytes: while it
/// is longer, the largest fragment is left out (set to `None`). Returns the list and the
/// routes left out, with their fragments' lengths.
fn merge_within(
    array: &str,
    labels: &[&str],
    held: &mut [Option<Bytes>],
    bytes_max: usize,
) -> (Bytes, Vec<(usize, usize)>) {
    let mut left_out = Vec::new();
    // Measured before it is made: the fragments may together be far larger than the bound.
    while encoded_list_len(array, labels, held) > bytes_max {
        let largest = held
            .iter()
            .enumerate()
            .filter_map(|(index, f)| f.as_ref().map(|f| (index, f.len())))
            .max_by_key(|(_, len)| *len);
        let Some((index, len)) = largest else {
            break;
        };
        if let Some(h) = held.get_mut(index) {
            *h = None;
        }
        left_out.push((index, len));
    }
    (encode_list(array, labels, held), left_out)
}

#[cfg(test)]
mod unit {
    use super::*;
    use crate::store::testing::Hooked;
    use std::sync::atomic::Ordering;

    #[test]
    fn fragments_too_long_together_leave_the_largest_out() {
        let labels = ["a", "b", "c"];
        let fragment = |n: usize| Some(Bytes::from(format!(r#"{{"name":"{}"}}"#, "x".repeat(n))));
        let mut held = vec![fragment(100), fragment(300), fragment(200)];
        let all = encode_list("tools", &labels, &held).len();
        // Room for all: nothing left out.
        let (merged, out) = merge_within("tools", &labels, &mut held.clone(), all);
        assert_eq!((merged.len(), out), (all, vec![]));
        // One byte short: the largest (b) goes, the others are published.
        let (merged, out) = merge_within("tools", &labels, &mut held, all - 1);
        assert_eq!(out, vec![(1, 311)]);
        assert!(merged.len() < all);
        assert!(held[1].is_none() && held[0].is_some() && held[2].is_some());
        // Room for almost nothing: every fragment goes, the empty list stays.
        let mut held = vec![fragment(100), fragment(300), fragment(200)];
        let (merged, out) = merge_within("tools", &labels, &mut held, 10);
        assert_eq!(
            out.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![1, 2, 0]
        );
        assert!(held.iter().all(Option::is_none));
        assert!(merged.ends_with(br#"{"tools":[]}"#));
        // The length is known before the list is made.
        for held in [
            vec![fragment(100), None, fragment(2000)],
            vec![None, None, None],
            vec![Some(Bytes::new()), fragment(9), fragment(99_999)],
        ] {
            let made = encode_list("resourceTemplates", &labels, &held).len();
            assert_eq!(encoded_list_len("resourceTemplates", &labels, &held), made);
        }
    }

    #[test]
    fn a_fragment_the_store_cannot_give_now_is_an_error_and_one_it_never_can_is_none() {
        crate::testing::run_local(async {
            let store = Hooked::default();
            let stored = Bytes::from_static(br#"{"name":"a"}"#);
            assert!(store.put("f", stored.clone()).await.is_ok());
            // A store that fails for a moment: read on a later try.
            store.read_errors.store(2, Ordering::Release);
            assert_eq!(read_fragment(&store, "f").await, Ok(Some(stored)));
            assert_eq!(read_fragment(&store, "none").await, Ok(None));
            // One that keeps failing: an error after the tries, never "no fragment".
            store.read_errors.store(1000, Ordering::Release);
            assert!(read_fragment(&store, "f").await.is_err());
            let left = 1000 - CACHE_FRAGMENT_READ_TRIES;
            assert_eq!(store.read_errors.load(Ordering::Acquire), left);
            // A value that will never read is no fragment, at once: giving the lease up
            // for it would stop hydration on every node for good.
            store.read_errors.store(0, Ordering::Release);
            store.unreadable.store(1, Ordering::Release);
            assert_eq!(read_fragment(&store, "f").await, Ok(None));
            assert_eq!(store.unreadable.load(Ordering::Acquire), 0);
        });
    }

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
}
