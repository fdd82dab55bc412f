//! The `proxy` binding: many MCP servers ("toolkits") behind one endpoint.
//!
//! A proxy sits between a `server` and its routes' exits (clients or demos) and speaks the
//! internal stream protocol on both sides. Per agent session it keeps one lifecycle stream
//! to every route ([`session`]); per request it either relays one stream to the route that
//! owns the named item ([`request`]) or fans a list out to every route and merges the
//! answers as they stream in ([`list`]).
//!
//! Names: tools and prompts appear as `<toolkit>__<name>`, resources and templates as
//! `<toolkit>+<uri>`; a proxy whose only route has no toolkit adds nothing. Inbound names
//! are resolved against the routes in order ([`Proxy::resolve`]) and renamed inside the
//! streamed params bytes ([`rename`]); event ids from several routes are merged into one
//! aggregate id ([`event_id`]). Its counters, its caches' and its toolkits' request and
//! hydration metrics are kept per worker in [`metrics`].
//!
//! Everything here lives on one worker: the binding is built once per worker, and its
//! sessions and streams stay there.

pub mod cache;
pub(crate) mod event_id;
mod hydrate;
mod list;
pub mod metrics;
pub(crate) mod rename;
mod request;
mod session;

use crate::FastMap;
use crate::binding::proxy::metrics as proxy_metrics;
use crate::binding::{Exit, Serving};
use crate::config::{AllowList, ProxyBinding};
use crate::limits::{MESSAGE_BYTES_MAX, SESSIONS_PER_WORKER_MAX};
use crate::stream::{Callee, Caps, Frame, Kind, ListKind, Reset};
use bytes::{Bytes, BytesMut};
use event_id::Prefixes;
use session::{Lists, ProxySession};
use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::task::Poll;

/// Which of a route's allow-lists an item is checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Tools,
    Prompts,
    /// Resources and resource templates (matched by uri / uri template).
    Resources,
}

/// One route of this worker's proxy: where a toolkit's streams go and how its names read.
pub struct Route {
    pub index: usize,
    /// The toolkit name, for logs and metrics labels (the exit's name for an unnamed route).
    pub label: Rc<str>,
    /// The toolkit name, if the route has one (a lone route may not).
    pub toolkit: Option<Rc<str>>,
    /// `<toolkit>__` (empty for an unnamed route): prepended to tool and prompt names.
    pub name_prefix: Bytes,
    /// `<toolkit>+` (empty for an unnamed route): prepended to resource uris and templates.
    pub uri_prefix: Bytes,
    tools: Option<AllowList>,
    prompts: Option<AllowList>,
    resources: Option<AllowList>,
    pub exit: Rc<dyn Exit>,
    /// What the route served the last time a session of this worker opened it; stands in
    /// for a route a new session could not reach, so its capabilities are still announced.
    pub known_caps: Cell<Caps>,
    /// The route's slot in this worker's per-toolkit metrics.
    pub metrics: usize,
}

impl Route {
    /// The prefix of names of `family` (`<toolkit>__` or `<toolkit>+`).
    pub fn prefix(&self, family: Family) -> &Bytes {
        match family {
            Family::Tools | Family::Prompts => &self.name_prefix,
            Family::Resources => &self.uri_prefix,
        }
    }

    /// True if the route's allow-list for `family` admits `name` (the upstream's name,
    /// without the prefix). No allow-list admits everything; a resources allow-list admits
    /// only URIs in normal form (`config::resource_uri_is_normal`: `docs/../etc` must not
    /// pass a glob for `docs/*`).
    pub fn admits(&self, family: Family, name: &str) -> bool {
        let list = match family {
            Family::Tools => &self.tools,
            Family::Prompts => &self.prompts,
            Family::Resources => &self.resources,
        };
        list.as_ref().is_none_or(|l| {
            l.admits(name)
                && (family != Family::Resources || crate::config::resource_uri_is_normal(name))
        })
    }

    /// True unless the route's allow-list for `family` is empty (it then serves none).
    pub fn serves(&self, family: Family) -> bool {
        let list = match family {
            Family::Tools => &self.tools,
            Family::Prompts => &self.prompts,
            Family::Resources => &self.resources,
        };
        list.as_ref().is_none_or(|l| !l.globs().is_empty())
    }

    /// `caps` without what this route's allow-lists exclude.
    fn mask(&self, caps: Caps) -> Caps {
        let mut bits = caps.0;
        if !self.serves(Family::Tools) {
            bits &= !(Caps::TOOLS.0 | Caps::TOOLS_LIST_CHANGED.0);
        }
        if !self.serves(Family::Prompts) {
            bits &= !(Caps::PROMPTS.0 | Caps::PROMPTS_LIST_CHANGED.0);
        }
        if !self.serves(Family::Resources) {
            bits &=
                !(Caps::RESOURCES.0 | Caps::RESOURCES_SUBSCRIBE.0 | Caps::RESOURCES_LIST_CHANGED.0);
        }
        Caps(bits)
    }
}

/// One worker's instance of a proxy binding.
pub struct Proxy {
    me: Weak<Proxy>,
    /// The binding's name, for logs.
    pub name: Rc<str>,
    /// Routes in config order (resolution order).
    pub routes: Vec<Route>,
    /// The routes' aggregate event-id prefixes.
    prefixes: Prefixes,
    /// Live sessions of this worker, by the id handed to the caller. Invariant:
    /// `len() <= SESSIONS_PER_WORKER_MAX + 1`: agents' sessions are refused past the bound
    /// ([`Exit::serve`]), and the cache's hydration session, one at a time per worker,
    /// opens without that check (it must not be starved by agents).
    sessions: RefCell<FastMap<Rc<str>, Rc<ProxySession>>>,
    worker: u8,
    /// Session ids minted on this worker so far.
    minted: Cell<u64>,
    /// The list cache, when the binding has one.
    cache: Option<cache::Cache>,
    /// Per cached list (by slot): `None` while no pass of [`Proxy::announce`] is under
    /// way; else the routes changed since that pass began, which the pass takes on next.
    /// So a list has at most one announcing task, however fast its changes come.
    announcing: [Cell<Option<cache::Routes>>; cache::KINDS.len()],
}

/// Sessions told of a list change in one turn of the worker (see [`Proxy::announce`]).
const ANNOUNCE_BATCH: usize = 256;

/// Tells each of `sessions` for which `news` is news that `list` changed, and counts them.
fn tell(sessions: &[Rc<ProxySession>], list: ListKind, news: &cache::News) {
    let mut told = 0;
    // A later batch's sessions may have ended since the list was taken.
    for session in sessions.iter().filter(|s| !s.is_closed()) {
        let tell = match news {
            cache::News::Changed(routes) => routes & !session.hidden() != 0,
            cache::News::First(first, at) => session
                .shown_crc(*at)
                .is_some_and(|crc| crc != crc32c::crc32c(&first.for_session(session.hidden()))),
        };
        if tell {
            session.announce(list);
            told += 1;
        }
    }
    proxy_metrics::with(|m| m.cache.notifications += told);
}

impl Proxy {
    /// Builds the worker-local instance; `exits[i]` serves route i. With `cache`, starts
    /// this worker's cache tasks (so it must run inside the worker's runtime).
    pub fn new(
        name: &str,
        cfg: &ProxyBinding,
        exits: Vec<Rc<dyn Exit>>,
        worker: u8,
        cache: Option<cache::CacheSetup>,
    ) -> Rc<Proxy> {
        assert!(exits.len() == cfg.routes.len());
        let routes: Vec<Route> = cfg
            .routes
            .iter()
            .zip(exits)
            .enumerate()
            .map(|(index, (r, exit))| {
                let toolkit: Option<Rc<str>> = r.toolkit.as_deref().map(Rc::from);
                let (name_prefix, uri_prefix) = match &toolkit {
                    Some(t) => (Bytes::from(format!("{t}__")), Bytes::from(format!("{t}+"))),
                    None => (Bytes::new(), Bytes::new()),
                };
                let label: Rc<str> = toolkit.clone().unwrap_or_else(|| Rc::from(r.exit.as_str()));
                Route {
                    index,
                    metrics: proxy_metrics::toolkit_slot(&label),
                    label,
                    toolkit,
                    name_prefix,
                    uri_prefix,
                    tools: r.tools.clone(),
                    prompts: r.prompts.clone(),
                    resources: r.resources.clone(),
                    exit,
                    known_caps: Cell::new(Caps::empty()),
                }
            })
            .collect();
        let prefixes: Vec<Option<&str>> = cfg
            .routes
            .iter()
            .map(|r| r.event_prefix.as_deref())
            .collect();
        let proxy = Rc::new_cyclic(|me| Proxy {
            me: me.clone(),
            name: Rc::from(name),
            prefixes: Prefixes::new(&prefixes),
            routes,
            sessions: RefCell::new(FastMap::default()),
            worker,
            minted: Cell::new(0),
            cache: cache.map(|setup| cache::Cache::new(name, setup)),
            announcing: Default::default(),
        });
        hydrate::start(&proxy);
        proxy
    }

    /// The cached result of a list request of `kind` as `session` is served it (without
    /// the items of routes it may not see), when this proxy has a cache and it has been
    /// hydrated; counts a miss otherwise.
    fn cached_list(&self, kind: Kind, session: &ProxySession) -> Option<Bytes> {
        let cache = self.cache.as_ref()?;
        let found = cache.list(kind);
        if found.is_none() {
            proxy_metrics::with(|m| m.cache.misses += 1);
        }
        Some(found?.for_session(session.hidden()))
    }

    /// The sessions of this worker served cached lists.
    fn cached_sessions(&self) -> Vec<Rc<ProxySession>> {
        self.sessions
            .borrow()
            .values()
            .filter(|s| s.lists == Lists::Cached)
            .cloned()
            .collect()
    }

    /// Tells the agent sessions of this worker for which `news` is news that `list` (the
    /// cached list in slot `at`) changed. A session waiting for news is told in this call
    /// (the watcher's, see `ProxySession::announce`), so a worker with many sessions tells
    /// them [`ANNOUNCE_BATCH`] at a time in a task, and its connections are served between
    /// batches. A change that comes while that task is under way joins it: once through
    /// the sessions, the task goes through them again for the routes changed meanwhile.
    fn announce(&self, at: usize, list: ListKind, news: cache::News) {
        let Some(pass) = self.announcing.get(at) else {
            return;
        };
        if matches!(news, cache::News::Changed(0)) {
            // New bytes, and no route's items changed (their order, say): news to nobody.
            return;
        }
        if let Some(pending) = pass.get() {
            // The first value of a list is its first news, so no pass can be under way.
            let cache::News::Changed(routes) = news else {
                unreachable!("a first value of a list announced twice");
            };
            pass.set(Some(pending | routes));
            return;
        }
        let sessions = self.cached_sessions();
        if sessions.len() <= ANNOUNCE_BATCH {
            tell(&sessions, list, &news);
            return;
        }
        pass.set(Some(0));
        let me = self.me.clone();
        tokio::task::spawn_local(async move {
            let (mut sessions, mut news) = (sessions, news);
            loop {
                for batch in sessions.chunks(ANNOUNCE_BATCH) {
                    tell(batch, list, &news);
                    tokio::task::yield_now().await;
                }
                let Some(proxy) = me.upgrade() else {
                    return;
                };
                let Some(pass) = proxy.announcing.get(at) else {
                    return;
                };
                match pass.get() {
                    Some(routes) if routes != 0 => {
                        pass.set(Some(0));
                        news = cache::News::Changed(routes);
                        sessions = proxy.cached_sessions();
                    }
                    _ => {
                        pass.set(None);
                        return;
                    }
                }
            }
        });
    }

    /// Stops this worker's cache tasks (drain).
    pub fn stop(&self) {
        if let Some(cache) = self.cache.as_ref() {
            cache.stop();
        }
    }

    /// Sessions open on this worker.
    pub fn sessions(&self) -> usize {
        self.sessions.borrow().len()
    }

    /// A fresh id for a session of this worker (`p<worker>-<n>`, unique per process).
    fn mint_session_id(&self) -> Rc<str> {
        let n = self.minted.get() + 1;
        self.minted.set(n);
        Rc::from(format!("p{:02x}-{n}", self.worker))
    }

    /// True if this proxy merges several routes' event ids (more than one route).
    fn aggregating(&self) -> bool {
        self.prefixes.aggregating()
    }

    /// The route serving the item `target` of `family` and the item's name upstream: the
    /// first route, in config order, whose prefix starts the name and whose allow-list
    /// admits the rest. `None` if no route does.
    pub fn resolve<'t>(&self, family: Family, target: &'t str) -> Option<(&Route, &'t str)> {
        self.routes.iter().find_map(|route| {
            let prefix = route.prefix(family);
            let rest = target.as_bytes().strip_prefix(&prefix[..])?;
            if rest.is_empty() {
                return None;
            }
            // The prefix is ASCII, so what follows it starts on a character boundary.
            let rest = target.get(prefix.len()..)?;
            route.admits(family, rest).then_some((route, rest))
        })
    }
}

impl Exit for Proxy {
    fn serve(&self, callee: Callee) -> Option<Serving> {
        // None: the worker is shutting down; dropping the callee aborts the stream.
        let proxy = self.me.upgrade()?;
        if callee.begin.kind == Kind::Lifecycle {
            if self.sessions.borrow().len() >= SESSIONS_PER_WORKER_MAX {
                crate::metrics::with(|m| m.overload_rejections += 1);
                fail(&callee, internal("Too many proxy sessions"));
                return None;
            }
            Some(Box::pin(session::serve(proxy, callee)))
        } else {
            Some(Box::pin(request::serve(proxy, callee)))
        }
    }
}

/// Fails a stream before its reply began: RESET of the initial, then ABORT of the reply
/// (the caller renders the RESET).
fn fail(callee: &Callee, reset: Reset) {
    callee.initial.reset(reset);
    callee.reply.abort();
}

/// A JSON-RPC error with `code` and `message`.
fn rpc_error(code: i32, message: &str) -> Reset {
    Reset::Error {
        code,
        message: Rc::from(message),
        data: None,
    }
}

/// JSON-RPC -32603 with `message`.
fn internal(message: &str) -> Reset {
    rpc_error(crate::jsonrpc::INTERNAL_ERROR, message)
}

/// Reads the caller's whole params (small ones: list and setLevel requests), bounded by
/// [`MESSAGE_BYTES_MAX`]; `None` if the caller went away or sent too much.
async fn read_params(callee: &Callee) -> Option<Bytes> {
    let total = callee.begin.params_len as usize;
    if total > MESSAGE_BYTES_MAX {
        return None;
    }
    let mut params = BytesMut::with_capacity(total);
    while params.len() < total {
        match callee.initial.next().await {
            Some(Frame::Data(piece)) => {
                callee.initial.ack(piece.len() as u32);
                if piece.len() > total - params.len() {
                    return None;
                }
                params.extend_from_slice(&piece);
            }
            Some(Frame::Begin(_) | Frame::Flush(_)) => {}
            Some(Frame::End | Frame::Abort) | None => return None,
        }
    }
    Some(params.freeze())
}

/// Answers the caller with a whole result (in one DATA frame: see
/// [`crate::stream::Sender::data_whole`]).
async fn answer(callee: &Callee, result: Bytes) {
    if callee.reply.begin(Default::default()).await.is_ok()
        && callee.reply.data_whole(result).await.is_ok()
    {
        callee.reply.end();
    }
}

/// Runs `futures` concurrently on the current task and returns their outputs in order.
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_some() {
                continue;
            }
            match future.as_mut().poll(cx) {
                Poll::Ready(value) => *output = Some(value),
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests;
