//! The proxy's list cache: lists hydrated from the routes into the store by one worker,
//! served from the store by all.
//!
//! Per proxy binding and per worker there is one [`Cache`]. Its **view** holds the
//! worker's current copy of every cached list (the stored `Bytes`, a reference, not a
//! copy) and of the routes' capabilities; list requests are answered from it
//! ([`Cache::list`]) and never reach upstream. A new value of a key ([`Cache::apply`]) is
//! CRC32C-compared route by route with the last seen, and each agent session of this
//! worker that can see a route whose items changed is told once (`list_changed`). The
//! watchers that bring new values and the lease holder that writes them are in
//! `hydrate.rs`, a layer above this one.
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
//! fragments `p/<kind>@<toolkit>`, `p/routes` (the routes' capabilities and instructions),
//! and the leases `p/lifecycle.lock` and `p/<kind>.lock`.

use super::{Family, Proxy, Route};
use crate::limits::PROXY_ROUTES_MAX;
use crate::log;
use crate::runtime::notify::Notify;
use crate::store::{Store, Value};
use crate::stream::{Caps, Kind, ListKind};
use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::fmt::Write;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A set of a proxy's routes, bit i for route i.
pub type Routes = u64;
const _: () = assert!(PROXY_ROUTES_MAX <= Routes::BITS as usize);

/// Every route of a proxy with `count` routes.
pub(super) fn all_routes(count: usize) -> Routes {
    assert!(count <= PROXY_ROUTES_MAX);
    if count == Routes::BITS as usize {
        Routes::MAX
    } else {
        (1 << count) - 1
    }
}

/// True if `set` has route `index`.
pub(super) fn has(set: Routes, index: usize) -> bool {
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
pub(super) fn names(kind: Kind) -> (&'static str, &'static str) {
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
pub(super) fn family(kind: Kind) -> Family {
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

/// What the store says about the routes (`p/routes`), each named by its toolkit label, as
/// the lists' fragments are: nodes whose configs order the routes differently (a rolling
/// change of config) read each route's record, not the one at its position.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct StoredCaps {
    pub(super) routes: Vec<StoredRoute>,
}

/// One route's record in `p/routes`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub(super) struct StoredRoute {
    /// The route's toolkit label.
    pub(super) label: String,
    /// Its capability bits (0: it could not be reached).
    pub(super) caps: u16,
    /// Its instructions, as text: each session is told those of the routes it may see.
    pub(super) instructions: Option<String>,
}

/// The routes' capabilities, as cached, in this node's route order.
#[derive(Clone, Debug)]
pub struct CachedCaps {
    /// Per route, its capabilities (empty: unreachable, or not in the store's record).
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
    pub(super) setup: CacheSetup,
    /// `p/`.
    pub(super) prefix: String,
    view: RefCell<View>,
    /// Woken when the view changes (agents waiting for the first hydration).
    changed: Notify,
    /// Set at drain: hydration ends (its route sessions close) and no lease is taken.
    pub(super) stopping: std::cell::Cell<bool>,
    /// Keys whose last read failed: one log line when the first starts failing and one when
    /// the last works again, not one per key.
    failing_reads: std::cell::Cell<usize>,
    pub(super) stop: Notify,
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
    pub(super) fn read_failed(&self, proxy: &Proxy, e: &crate::store::StoreError) {
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
    pub(super) fn read_recovered(&self, proxy: &Proxy) {
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
    pub(super) fn lease_ttl(&self) -> Duration {
        self.setup.ttl.min(crate::limits::CACHE_LEASE_TTL_MAX)
    }

    pub(super) fn list_key(&self, kind: Kind) -> String {
        format!("{}{}", self.prefix, names(kind).0)
    }

    pub(super) fn caps_key(&self) -> String {
        format!("{}routes", self.prefix)
    }

    pub(super) fn fragment_key(&self, kind: Kind, route: &Route) -> String {
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

    /// Takes a new value of a key into the view; for a list whose routes' items differ
    /// from the last one seen, tells every agent session of this worker that can see one
    /// of those routes. The first value of a list is news only to sessions that were shown
    /// a live list before (they fell back while the cache was not ready), and only if it
    /// differs from what they were shown.
    ///
    /// A key that is absent leaves the view as it was: the cache never deletes its keys, so
    /// an absent one means a store that lost them (a Redis restarted without persistence),
    /// and the last lists stay served until the lease holder writes them again.
    pub(super) fn apply(&self, proxy: &Proxy, kind: Option<Kind>, value: Option<Value>) {
        let Some(value) = value else {
            return;
        };
        let Some(kind) = kind else {
            let labels: Vec<&str> = proxy.routes.iter().map(|r| &*r.label).collect();
            match decode_caps(&value.bytes, &labels) {
                Some(caps) => {
                    self.view.borrow_mut().caps = Some(caps);
                    self.changed.notify_waiters();
                }
                None => log::warn(format_args!(
                    "cache: proxy {}: {} in the store is not a routes record; kept the previous",
                    proxy.name,
                    self.caps_key()
                )),
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
            None => News::First(list, at),
        };
        proxy.announce(at, announced(kind), news);
    }
}

/// What a new value of a cached list is to the sessions.
#[derive(Clone)]
pub enum News {
    /// The routes whose items changed.
    Changed(Routes),
    /// The first value of the list in slot `.1`, for sessions shown a live list before.
    First(Rc<CachedList>, usize),
}

/// Reads `p/routes` for the routes labelled `labels` (this node's, in its order); a route
/// the record does not name gets nothing. `None` if the value is not such a record.
fn decode_caps(bytes: &[u8], labels: &[&str]) -> Option<CachedCaps> {
    let stored: StoredCaps = serde_json::from_slice(bytes).ok()?;
    if stored.routes.len() > PROXY_ROUTES_MAX {
        return None;
    }
    let record = |label: &str| stored.routes.iter().find(|r| r.label == label);
    Some(CachedCaps {
        routes: labels
            .iter()
            .map(|l| record(l).map_or(Caps::empty(), |r| Caps(r.caps)))
            .collect(),
        instructions: labels
            .iter()
            .map(|l| record(l).and_then(|r| r.instructions.clone()))
            .collect(),
    })
}

/// A cached list as stored: the header `L <label>=<start>-<end> …` (each route's toolkit
/// label and its items' span within the JSON, `0-0` for none) and a newline, then
/// `{"<array>":[` + the non-empty fragments joined by commas + `]}`. Agents are served the
/// JSON after the header (a slice: no copy); the header lets a session that may not see a
/// route be served without it, by any node whose config names the same toolkits.
pub fn encode_list(array: &str, labels: &[&str], fragments: &[Option<Bytes>]) -> Bytes {
    assert!(labels.len() == fragments.len());
    let (spans, json_len) = list_spans(array, fragments);
    let mut json = BytesMut::with_capacity(json_len);
    json.put_slice(b"{\"");
    json.put_slice(array.as_bytes());
    json.put_slice(b"\":[");
    for (fragment, span) in fragments.iter().zip(&spans) {
        if let Some(fragment) = fragment.as_ref().filter(|f| !f.is_empty()) {
            if json.len() < span.start {
                json.put_u8(b',');
            }
            json.put_slice(fragment);
            assert!(json.len() == span.end);
        }
    }
    json.put_slice(b"]}");
    assert!(json.len() == json_len);
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

/// How long [`encode_list`] of these would be, without making it.
pub fn encoded_list_len(array: &str, labels: &[&str], fragments: &[Option<Bytes>]) -> usize {
    let digits = |n: usize| n.checked_ilog10().map_or(1, |d| d as usize + 1);
    let (spans, json_len) = list_spans(array, fragments);
    let header: usize = labels
        .iter()
        .zip(&spans)
        .map(|(label, span)| 3 + label.len() + digits(span.start) + digits(span.end))
        .sum();
    2 + header + json_len
}

/// Where each fragment's items go in a list's JSON (`0..0` for none), and the JSON's
/// length: `{"<array>":[` + the non-empty fragments joined by commas + `]}`.
fn list_spans(array: &str, fragments: &[Option<Bytes>]) -> (Vec<std::ops::Range<usize>>, usize) {
    let mut at = 2 + array.len() + 3;
    let mut first = true;
    let spans = fragments
        .iter()
        .map(
            |fragment| match fragment.as_ref().filter(|f| !f.is_empty()) {
                Some(fragment) => {
                    if !first {
                        at += 1;
                    }
                    first = false;
                    let start = at;
                    at += fragment.len();
                    start..at
                }
                None => 0..0,
            },
        )
        .collect();
    (spans, at + 2)
}

#[cfg(test)]
mod unit {
    use super::*;

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
        let route = |label: &str, caps: Caps, instructions: Option<&str>| StoredRoute {
            label: label.into(),
            caps: caps.0,
            instructions: instructions.map(Into::into),
        };
        let stored = StoredCaps {
            routes: vec![
                route("a", Caps::TOOLS, Some("say \"hi\"")),
                route("b", Caps::PROMPTS, None),
            ],
        };
        let bytes = serde_json::to_vec(&stored).unwrap();
        let back = decode_caps(&bytes, &["a", "b"]).unwrap();
        assert_eq!(back.routes, [Caps::TOOLS, Caps::PROMPTS]);
        assert_eq!(back.instructions, [Some("say \"hi\"".to_owned()), None]);
        // Another node's order, and a route the record does not name: each by its label.
        let back = decode_caps(&bytes, &["c", "b", "a"]).unwrap();
        assert_eq!(back.routes, [Caps::empty(), Caps::PROMPTS, Caps::TOOLS]);
        assert_eq!(
            back.instructions,
            [None, None, Some("say \"hi\"".to_owned())]
        );
        assert!(decode_caps(b"garbage", &["a"]).is_none());
        let many = StoredCaps {
            routes: (0..=PROXY_ROUTES_MAX)
                .map(|i| route(&format!("r{i}"), Caps::TOOLS, None))
                .collect(),
        };
        let bytes = serde_json::to_vec(&many).unwrap();
        assert!(decode_caps(&bytes, &["r0"]).is_none());
    }
}
