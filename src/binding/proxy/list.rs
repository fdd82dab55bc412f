//! List requests through the proxy: every serving route is asked at once, each followed
//! through all its pages, and their items are merged into one answer as they stream in.
//!
//! Each route gets a fetch task ([`fetch`]) that pages through the route's list and runs
//! every page's result through an [`ItemRewriter`]: items come out whole, renamed
//! (`<toolkit>__name`, `<toolkit>+uri`) and filtered by the route's allow-list, never
//! parsed into a tree. The task hands them on over an internal stream of its own, so a
//! route that runs ahead of the merge is held by that stream's credit window (one slot),
//! and memory stays bounded however long the lists are. The merge ([`serve`]) takes the
//! routes in config order, so the merged list is deterministic, and writes
//! `{"tools":[` + items + `]}` to the caller.
//!
//! A route that fails or times out is left out of the answer (one log line, a counter);
//! items it already gave stay (they are whole). Only when every route fails does the
//! caller get an error, the first bearer challenge if there is one.

use super::session::{ProxySession, describe};
use super::{Family, Proxy, Route, answer, cache, fail, internal, read_params, rpc_error};
use crate::binding::proxy::metrics as proxy_metrics;
use crate::jsonrpc::{self, ItemMode, ItemRewriter, ItemRules, ItemSink};
use crate::limits::LIST_PAGES_MAX;
use crate::log;
use crate::metrics::Outcome;
use crate::stream::{self, Begin, Callee, Caller, Frame, Kind, ReplyBegin, Reset, Throttle};
use bytes::{BufMut, Bytes, BytesMut};
use std::rc::Rc;
use std::time::Instant;

/// What a list kind's result holds: the array member and each item's name member.
fn shape(kind: Kind) -> Option<(Family, &'static [u8], &'static [u8])> {
    Some(match kind {
        Kind::ToolsList => (Family::Tools, b"tools", b"name"),
        Kind::PromptsList => (Family::Prompts, b"prompts", b"name"),
        Kind::ResourcesList => (Family::Resources, b"resources", b"uri"),
        Kind::ResourcesTemplatesList => (Family::Resources, b"resourceTemplates", b"uriTemplate"),
        _ => return None,
    })
}

/// Serves one list request: fan out, merge, answer.
pub async fn serve(proxy: &Rc<Proxy>, session: &Rc<ProxySession>, callee: &Callee) {
    let Some((family, array, _)) = shape(callee.begin.kind) else {
        return fail(callee, internal("Unreachable: not a list"));
    };
    if !accept(callee).await {
        return;
    }
    let serving: Vec<&Route> = proxy
        .routes
        .iter()
        .filter(|route| route.serves(family) && serves_kind(session, route, callee.begin.kind))
        .collect();
    let feeds: Vec<(&Route, Caller)> = serving
        .into_iter()
        .map(|route| {
            let (caller, feed) = stream::open(callee.begin.clone());
            tokio::task::spawn_local(fetch(proxy.clone(), session.clone(), route.index, feed));
            (route, caller)
        })
        .collect();
    let mut merge = Merge {
        callee,
        array,
        begun: false,
        items: false,
        succeeded: false,
        failures: Vec::new(),
        crc: 0,
    };
    if merge.run(&feeds).await != Outcome::Ok {
        return;
    }
    if let Some(cache) = proxy.cache.as_ref() {
        // A live list with a cache: this session fell back while the cache was not
        // ready; the first cached value tells it only if it differs from this. That value
        // may have come while this list was merged: then it is compared now.
        let kind = callee.begin.kind;
        session.shown(kind, merge.crc);
        if let Some(first) = cache.list(kind)
            && crc32c::crc32c(&first.for_session(session.hidden())) != merge.crc
        {
            session.announce(cache::announced(kind));
        }
    }
}

/// True unless the route is known not to serve this list (a route not open yet counts as
/// serving: its fetch opens it or is left out).
fn serves_kind(session: &ProxySession, route: &Route, kind: Kind) -> bool {
    let caps = session
        .open_caps(route.index)
        .unwrap_or_else(|| route.known_caps.get());
    caps == crate::stream::Caps::empty() || caps.contains(kind.capability())
}

/// Reads a list request's params; false (the caller failed) if they did not arrive or
/// carry a cursor: a merged list, live or cached, is one page, so no cursor was ever
/// handed out.
pub(super) async fn accept(callee: &Callee) -> bool {
    let Some(params) = read_params(callee).await else {
        fail(callee, internal("Params not received"));
        return false;
    };
    if has_cursor(&params) {
        fail(callee, rpc_error(jsonrpc::INVALID_PARAMS, "Invalid cursor"));
        return false;
    }
    true
}

/// True if list params carry a `cursor` (other members, `_meta`, are fine).
fn has_cursor(params: &[u8]) -> bool {
    if params.is_empty() {
        return false;
    }
    let Some(raw) = std::str::from_utf8(params)
        .ok()
        .and_then(jsonrpc::Raw::parse)
    else {
        return false;
    };
    jsonrpc::param_raw(raw, "cursor").is_some_and(|c| c.get() != "null")
}

/// The merge of the routes' feeds into the caller's reply.
struct Merge<'a> {
    callee: &'a Callee,
    array: &'static [u8],
    /// The reply and `{"<array>":[` have gone out.
    begun: bool,
    /// An item has gone out (the next route's first needs a comma).
    items: bool,
    /// A route gave its whole list.
    succeeded: bool,
    failures: Vec<Reset>,
    /// CRC32C of every byte sent so far (what the agent was shown).
    crc: u32,
}

impl Merge<'_> {
    /// Takes the feeds in route order; returns how the request ended.
    async fn run(&mut self, feeds: &[(&Route, Caller)]) -> Outcome {
        for (_, feed) in feeds {
            match self.route(feed).await {
                Ok(()) => {}
                Err(outcome) => return outcome,
            }
        }
        if !self.begun {
            if !self.succeeded && !self.failures.is_empty() {
                // Every route failed: the first bearer challenge, else the first failure.
                let reset = std::mem::take(&mut self.failures)
                    .into_iter()
                    .min_by_key(|r| !matches!(r, Reset::Bearer(_)));
                fail(self.callee, reset.unwrap_or(Reset::Plain));
                return Outcome::Error;
            }
            if self.begin().await.is_err() {
                return Outcome::Cancelled;
            }
        }
        if self.send(Bytes::from_static(b"]}")).await.is_err() {
            return Outcome::Cancelled;
        }
        self.callee.reply.end();
        Outcome::Ok
    }

    /// Opens the reply with `{"<array>":[`.
    async fn begin(&mut self) -> Result<(), stream::Gone> {
        self.begun = true;
        self.callee.reply.begin(ReplyBegin::default()).await?;
        let mut head = BytesMut::with_capacity(self.array.len() + 5);
        head.put_slice(b"{\"");
        head.put_slice(self.array);
        head.put_slice(b"\":[");
        self.send(head.freeze()).await
    }

    /// Sends bytes of the answer, folding them into `crc`.
    async fn send(&mut self, bytes: Bytes) -> Result<(), stream::Gone> {
        self.crc = crc32c::crc32c_append(self.crc, &bytes);
        self.callee.reply.data(bytes).await
    }

    /// Copies one route's feed to the caller. `Err` if the caller went away.
    async fn route(&mut self, feed: &Caller) -> Result<(), Outcome> {
        let mut first = true;
        loop {
            let frame = tokio::select! {
                biased;
                throttle = self.callee.reply.throttle() => match throttle {
                    // No challenge means anything to a list; a RESET is the caller giving up.
                    Some(Throttle::Challenge(_)) => continue,
                    Some(Throttle::Reset(_)) | None => return Err(Outcome::Cancelled),
                },
                frame = feed.reply.next() => frame,
            };
            match frame {
                Some(Frame::Data(piece)) => {
                    let len = piece.len() as u32;
                    if !self.begun && self.begin().await.is_err() {
                        return Err(Outcome::Cancelled);
                    }
                    if first && self.items {
                        let comma = Bytes::from_static(b",");
                        if self.send(comma).await.is_err() {
                            return Err(Outcome::Cancelled);
                        }
                    }
                    first = false;
                    self.items = true;
                    if self.send(piece).await.is_err() {
                        return Err(Outcome::Cancelled);
                    }
                    feed.reply.ack(len);
                }
                Some(Frame::Begin(_) | Frame::Flush(_)) => {}
                Some(Frame::End) => {
                    self.succeeded = true;
                    return Ok(());
                }
                Some(Frame::Abort) | None => {
                    if let Some(Throttle::Reset(reset)) = feed.initial.try_throttle() {
                        self.failures.push(reset);
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// Pages through route `index`'s list, handing renamed, admitted items to `feed` (whose
/// reader is the merge). Fails `feed` (RESET + ABORT) if the route fails.
async fn fetch(proxy: Rc<Proxy>, session: Rc<ProxySession>, index: usize, feed: Callee) {
    let Some(route) = proxy.routes.get(index) else {
        return fail(&feed, internal("Unreachable: no such route"));
    };
    let started = Instant::now();
    let kind = feed.begin.kind;
    let request = ListRequest {
        kind: feed.begin.kind,
        deadline: feed.begin.deadline,
        authorization: feed.begin.authorization.clone(),
        force_open: false,
    };
    let mut out = Out::Feed(&feed);
    let outcome = match pages(&proxy, &session, route, &request, &mut out).await {
        Ok(()) => {
            feed.reply.end();
            Outcome::Ok
        }
        Err(None) => Outcome::Cancelled,
        Err(Some(reset)) => {
            proxy_metrics::with(|m| m.list_omitted += 1);
            log::warn(format_args!(
                "proxy {}: toolkit {} left out of {}: {}",
                proxy.name,
                route.label,
                kind.method(),
                describe(&reset)
            ));
            fail(&feed, reset);
            Outcome::Error
        }
    };
    proxy_metrics::record_toolkit(route.metrics, kind, outcome, started.elapsed());
}

/// What one route's list is asked with.
pub struct ListRequest {
    pub kind: Kind,
    pub deadline: Instant,
    /// The `Authorization` header for routes that forward it.
    pub authorization: Option<Bytes>,
    /// Open a route that failed moments ago again (the hydrator keeps its own backoff).
    pub force_open: bool,
}

/// Where a route's renamed items go: to the merge of an agent's list request, or into a
/// buffer (a cache fragment).
pub enum Out<'a> {
    Feed(&'a Callee),
    /// Invariant: `buf.len() <= cap` (a longer list fails instead).
    Buffer {
        buf: BytesMut,
        cap: usize,
    },
}

impl Out<'_> {
    /// Hands on one chunk of items. `Err(None)`: the merge went away; `Err(Some(_))`: the
    /// buffer is full.
    async fn push(&mut self, chunk: Bytes) -> Result<(), Option<Reset>> {
        match self {
            Out::Feed(feed) => feed.reply.data(chunk).await.map_err(|_| None),
            Out::Buffer { buf, cap } => {
                if buf.len() + chunk.len() > *cap {
                    return Err(Some(internal(&format!(
                        "Toolkit's list is larger than {cap} bytes, too large to cache"
                    ))));
                }
                buf.put_slice(&chunk);
                Ok(())
            }
        }
    }

    /// Resolves when the merge gives up (never for a buffer).
    async fn gone(&self) {
        match self {
            Out::Feed(feed) => loop {
                match feed.reply.throttle().await {
                    Some(Throttle::Challenge(_)) => continue,
                    Some(Throttle::Reset(_)) | None => return,
                }
            },
            Out::Buffer { .. } => std::future::pending().await,
        }
    }
}

/// Every item of route `route`'s list of `request.kind`, renamed and admitted, joined by
/// commas (at most `cap` bytes): a cache fragment.
pub async fn collect(
    proxy: &Proxy,
    session: &Rc<ProxySession>,
    route: &Route,
    request: &ListRequest,
    cap: usize,
) -> Result<Bytes, Reset> {
    let mut out = Out::Buffer {
        buf: BytesMut::new(),
        cap,
    };
    match pages(proxy, session, route, request, &mut out).await {
        Ok(()) => match out {
            Out::Buffer { buf, .. } => Ok(buf.freeze()),
            Out::Feed(_) => Err(internal("Unreachable: not a buffer")),
        },
        Err(reset) => Err(reset.unwrap_or(Reset::Plain)),
    }
}

/// The pages of one route's list. `Err(Some(reset))` if the route failed, `Err(None)` if
/// the merge went away.
async fn pages(
    proxy: &Proxy,
    session: &Rc<ProxySession>,
    route: &Route,
    begin: &ListRequest,
    out: &mut Out<'_>,
) -> Result<(), Option<Reset>> {
    let Some((family, array, key)) = shape(begin.kind) else {
        return Err(Some(internal("Unreachable: not a list")));
    };
    let life = session
        .route(proxy, route.index, begin.force_open, begin.deadline)
        .await
        .map_err(Some)?;
    if !life.caps.contains(begin.kind.capability()) {
        // Opened just now, and it turns out not to serve this list: nothing to give.
        return Ok(());
    }
    let mut sink = ItemSink::default();
    let mut cursor: Option<Bytes> = None;
    // Every cursor given so far (by hash: 8 bytes each, at most LIST_PAGES_MAX of them), so
    // an upstream that hands out a cursor again (a cycle of any length) is not followed
    // round it up to the page limit.
    let mut given: std::collections::HashSet<u64, foldhash::fast::RandomState> = Default::default();
    let hasher = foldhash::fast::RandomState::default();
    for _ in 0..LIST_PAGES_MAX {
        let params = match &cursor {
            Some(c) => {
                let mut p = BytesMut::with_capacity(c.len() + 12);
                p.put_slice(b"{\"cursor\":");
                p.put_slice(c);
                p.put_slice(b"}");
                p.freeze()
            }
            None => Bytes::new(),
        };
        let up = Begin {
            kind: begin.kind,
            session: life.session.clone(),
            target: None,
            target_at: None,
            method: None,
            params_len: params.len() as u32,
            deadline: begin.deadline,
            progress_token: None,
            client: None,
            authorization: begin.authorization.clone(),
        };
        let rules = ItemRules {
            array,
            key,
            prefix: route.prefix(family).clone(),
        };
        let next = page(route, family, up, params, rules, &mut sink, out).await?;
        proxy_metrics::with(|m| m.items_dropped += std::mem::take(&mut sink.dropped));
        match next {
            Some(next) if given.insert(std::hash::BuildHasher::hash_one(&hasher, &next[..])) => {
                cursor = Some(next);
            }
            Some(_) => {
                log::warn(format_args!(
                    "proxy {}: toolkit {} gave a cursor of {} it had given before; the list ends there",
                    proxy.name,
                    route.label,
                    begin.kind.method()
                ));
                return Ok(());
            }
            // No cursor: the list is whole.
            None => return Ok(()),
        }
    }
    log::warn(format_args!(
        "proxy {}: toolkit {} gave more than {LIST_PAGES_MAX} pages of {}; the rest is left out",
        proxy.name,
        route.label,
        begin.kind.method()
    ));
    Ok(())
}

/// One page: asks the route, renames its items into `out`; returns its `nextCursor`.
async fn page(
    route: &Route,
    family: Family,
    up: Begin,
    params: Bytes,
    rules: ItemRules,
    sink: &mut ItemSink,
    out: &mut Out<'_>,
) -> Result<Option<Bytes>, Option<Reset>> {
    let (caller, callee) = stream::open(up);
    route.exit.open(callee);
    if !params.is_empty() && caller.initial.data(params).await.is_err() {
        caller.initial.abort();
    }
    let mut rewriter = ItemRewriter::new(rules, ItemMode::Items);
    let mut admit = |name: &str| route.admits(family, name);
    loop {
        let frame = tokio::select! {
            biased;
            () = out.gone() => {
                caller.reply.reset(Reset::Plain);
                caller.initial.abort();
                return Err(None);
            }
            frame = caller.reply.next() => frame,
        };
        match frame {
            Some(Frame::Data(piece)) => {
                let len = piece.len() as u32;
                let fed = rewriter.feed(piece, &mut admit, sink);
                caller.reply.ack(len);
                if let Err(e) = fed {
                    caller.reply.reset(Reset::Plain);
                    caller.initial.abort();
                    return Err(Some(internal(&format!(
                        "Toolkit sent a malformed list: {e}"
                    ))));
                }
                // The rewriter hands items on as slices around each prefix: a few parts
                // per item. They go on as one DATA per piece read (one copy), not as
                // thousands of frames through two more streams.
                if let Some(chunk) = gather(&mut sink.parts)
                    && let Err(e) = out.push(chunk).await
                {
                    caller.reply.reset(Reset::Plain);
                    caller.initial.abort();
                    return Err(e);
                }
            }
            Some(Frame::Begin(_) | Frame::Flush(_)) => {}
            Some(Frame::End) => {
                caller.initial.end();
                return rewriter
                    .finish()
                    .map_err(|e| Some(internal(&format!("Toolkit sent a malformed list: {e}"))));
            }
            Some(Frame::Abort) | None => {
                caller.initial.abort();
                return Err(Some(match caller.initial.try_throttle() {
                    Some(Throttle::Reset(reset)) => reset,
                    _ => internal("Toolkit failed the list request"),
                }));
            }
        }
    }
}

/// `parts` joined into one buffer (the one part itself when there is only one); `None`
/// when there are none. Leaves `parts` empty.
fn gather(parts: &mut Vec<Bytes>) -> Option<Bytes> {
    if parts.len() <= 1 {
        return parts.pop();
    }
    let mut out = BytesMut::with_capacity(parts.iter().map(Bytes::len).sum());
    for part in parts.drain(..) {
        out.put_slice(&part);
    }
    Some(out.freeze())
}

/// Answers a list request from the cache: the stored bytes as they are (or, for a session
/// that may not see every route, without those routes' items), in one DATA frame.
pub async fn serve_cached(callee: &Callee, cached: Bytes) {
    if !accept(callee).await {
        return;
    }
    proxy_metrics::with(|m| m.cache.hits += 1);
    answer(callee, cached).await;
}
