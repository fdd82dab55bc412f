//! Request streams through the proxy: each goes to one route (the one owning the item it
//! names), or fans out (lists, `logging/setLevel`).
//!
//! An item request is relayed frame by frame: the params stream up with the toolkit prefix
//! spliced out of the name ([`super::rename::Splice`]), the reply streams down (a
//! `resources/read` result with its `contents[].uri` prefixed again), RESETs and
//! CHALLENGEs cross in both directions, and the held-open initial ends with the reply's
//! severity. Credit is returned to each side only once its bytes were queued on the other,
//! so back-pressure runs through the proxy unchanged.

use super::rename::{self, Splice};
use super::session::{self, ProxySession};
use super::{Family, Proxy, Route, answer, fail, internal, join_all, list, read_params, rpc_error};
use crate::binding::proxy::metrics as proxy_metrics;
use crate::jsonrpc::{self, ItemMode, ItemRewriter, ItemRules, ItemSink};
use crate::limits::MESSAGE_BYTES_MAX;
use crate::metrics::Outcome;
use crate::runtime::pass;
use crate::stream::{
    self, Begin, Callee, Caller, Challenge, Flush, Frame, Kind, Reset, TargetAt, Throttle,
};
use bytes::{Bytes, BytesMut};
use std::rc::Rc;
use std::time::Instant;

/// Serves one request stream.
pub async fn serve(proxy: Rc<Proxy>, callee: Callee) {
    let found = proxy.sessions.borrow().get(&*callee.begin.session).cloned();
    let Some(session) = found else {
        return fail(&callee, internal("Unknown proxy session"));
    };
    if session.renew_authorization(callee.begin.authorization.as_ref()) && session.hidden() != 0 {
        // A route that refused the agent's old credential may accept the new one.
        session::readmit(&proxy, &session);
    }
    match callee.begin.kind {
        Kind::ToolsList
        | Kind::PromptsList
        | Kind::ResourcesList
        // Boxed: their states are far larger than an item relay's, and a spawned task is
        // as large as its largest state.
        | Kind::ResourcesTemplatesList => {
            if let Some(cached) = proxy.cached_list(callee.begin.kind, &session) {
                return Box::pin(list::serve_cached(&callee, cached)).await;
            }
            Box::pin(list::serve(&proxy, &session, &callee)).await
        }
        Kind::LoggingSetLevel => Box::pin(set_level(&proxy, &session, &callee)).await,
        Kind::Other if proxy.routes.len() == 1 => {
            let begin = callee.begin.clone();
            relay(&proxy, &session, &callee, 0, begin, None, false).await;
        }
        Kind::Other | Kind::Lifecycle => fail(
            &callee,
            rpc_error(jsonrpc::METHOD_NOT_FOUND, "Method not found"),
        ),
        Kind::ToolsCall
        | Kind::PromptsGet
        | Kind::ResourcesRead
        | Kind::ResourcesSubscribe
        | Kind::ResourcesUnsubscribe
        | Kind::CompletionComplete => item(&proxy, &session, &callee).await,
    }
}

/// The family a request's target belongs to.
fn family(begin: &Begin) -> Option<Family> {
    Some(match begin.kind {
        Kind::ToolsCall => Family::Tools,
        Kind::PromptsGet => Family::Prompts,
        Kind::ResourcesRead | Kind::ResourcesSubscribe | Kind::ResourcesUnsubscribe => {
            Family::Resources
        }
        Kind::CompletionComplete => match begin.target_at {
            Some(TargetAt { uri: true, .. }) => Family::Resources,
            Some(TargetAt { uri: false, .. }) => Family::Prompts,
            None => return None,
        },
        _ => return None,
    })
}

/// The error for a target no route serves, as the upstream itself would answer.
fn unknown(begin: &Begin, target: &str) -> Reset {
    let (code, message) = crate::binding::protocol::unknown_item(begin.kind, target);
    rpc_error(code, &message)
}

/// A request naming one item: resolved to its route, renamed, relayed.
async fn item(proxy: &Rc<Proxy>, session: &Rc<ProxySession>, callee: &Callee) {
    let begin = &callee.begin;
    let (Some(family), Some(target), Some(at)) = (family(begin), &begin.target, begin.target_at)
    else {
        if proxy.routes.len() == 1 {
            // Nothing to route on (a completion without a reference): the one route judges.
            let begin = begin.clone();
            return relay(proxy, session, callee, 0, begin, None, false).await;
        }
        return fail(
            callee,
            rpc_error(jsonrpc::INVALID_PARAMS, "Invalid params: no item named"),
        );
    };
    let Some((route, name)) = proxy.resolve(family, target) else {
        return fail(callee, unknown(begin, target));
    };
    let mut up = begin.clone();
    let splice = if route.prefix(family).is_empty() {
        None
    } else {
        let with = rename::lexeme(name);
        let splice = Splice::new(at.start as usize, at.end as usize, with.clone());
        up.target = Some(Rc::from(name));
        up.target_at = Some(TargetAt {
            start: at.start,
            end: at.start + with.len() as u32,
            uri: at.uri,
        });
        up.params_len = splice.out_len(begin.params_len as usize) as u32;
        Some(splice)
    };
    let rewrite_reply = begin.kind == Kind::ResourcesRead && !route.uri_prefix.is_empty();
    let index = route.index;
    relay(proxy, session, callee, index, up, splice, rewrite_reply).await;
}

/// Relays one request stream to route `index` with `up` as its `Begin` (the route's
/// session id is filled in here). `splice` renames the params; `rewrite_reply` prefixes
/// the uris of a `resources/read` result.
async fn relay(
    proxy: &Rc<Proxy>,
    session: &Rc<ProxySession>,
    callee: &Callee,
    index: usize,
    mut up: Begin,
    splice: Option<Splice>,
    rewrite_reply: bool,
) {
    let started = Instant::now();
    let Some(route) = proxy.routes.get(index) else {
        return fail(callee, internal("Unreachable: no such route"));
    };
    let life = match session.route(proxy, index, true, up.deadline).await {
        Ok(life) => life,
        Err(reset) => {
            proxy_metrics::record_toolkit(
                route.metrics,
                up.kind,
                Outcome::Error,
                started.elapsed(),
            );
            return fail(callee, reset);
        }
    };
    up.session = life.session.clone();
    let (caller, route_callee) = stream::open(up);
    // The route's work runs in this task, beside the relay: no task per request.
    let serving = route.exit.serve(route_callee);
    // Owns the caller's end: it drops when the relay is done, which the route sees.
    let relaying = async move {
        let mut relay = Relay {
            proxy,
            route,
            callee,
            caller: &caller,
            rewriter: rewrite_reply.then(|| {
                Box::new(ItemRewriter::new(
                    ItemRules {
                        array: b"contents",
                        key: b"uri",
                        prefix: route.uri_prefix.clone(),
                    },
                    ItemMode::Document,
                ))
            }),
        };
        let outcome = match relay.params(splice).await {
            Ok(()) => relay.reply().await,
            Err(outcome) => outcome,
        };
        proxy_metrics::record_toolkit(route.metrics, callee.begin.kind, outcome, started.elapsed());
    };
    // The relay first, so the route finds the params queued; polled again after the route
    // when the route woke it, so what the route answers in a poll is relayed in that poll
    // (see `runtime::pass`).
    let serving = async {
        if let Some(serving) = serving {
            serving.await;
        }
    };
    pass::join_in_order(std::pin::pin!(relaying), std::pin::pin!(serving)).await;
}

/// One request relayed to one route.
struct Relay<'a> {
    proxy: &'a Proxy,
    route: &'a Route,
    callee: &'a Callee,
    /// The stream to the route.
    caller: &'a Caller,
    /// Renames `contents[].uri` in a `resources/read` result (boxed: most requests have
    /// none, and the relay's state is a spawned task's size).
    rewriter: Option<Box<ItemRewriter>>,
}

impl Relay<'_> {
    /// Streams the params up. `Err` with the outcome if the request ended here (the
    /// caller went away); a route refusing the params is seen in its reply.
    async fn params(&mut self, mut splice: Option<Splice>) -> Result<(), Outcome> {
        let total = self.callee.begin.params_len as usize;
        let mut read = 0usize;
        while read < total {
            let piece = match self.callee.initial.next().await {
                Some(Frame::Data(piece)) => piece,
                Some(Frame::Begin(_) | Frame::Flush(_)) => continue,
                Some(Frame::End | Frame::Abort) | None => {
                    self.cancel();
                    return Err(Outcome::Cancelled);
                }
            };
            let len = piece.len();
            if len > total - read {
                self.caller.initial.abort();
                fail(self.callee, internal("Params longer than announced"));
                return Err(Outcome::Error);
            }
            read += len;
            let pieces = match splice.as_mut() {
                Some(splice) => Either::Spliced(splice.feed(piece)),
                None => Either::Whole(std::iter::once(piece)),
            };
            for piece in pieces {
                if self.caller.initial.data(piece).await.is_err() {
                    // The route refused the request: its RESET comes with its reply.
                    self.callee.initial.ack(len as u32);
                    return Ok(());
                }
            }
            // Credit back to the caller only once the bytes are queued toward the route.
            self.callee.initial.ack(len as u32);
        }
        Ok(())
    }

    /// The caller went away: the route's stream is reset and aborted.
    fn cancel(&self) {
        self.caller.reply.reset(Reset::Plain);
        self.caller.initial.abort();
    }

    /// Relays the route's reply to the caller until it ends.
    async fn reply(&mut self) -> Outcome {
        loop {
            let step = tokio::select! {
                biased;
                throttle = self.callee.reply.throttle() => Step::Caller(throttle),
                frame = self.caller.reply.next() => Step::Route(frame),
                frame = self.callee.initial.next() => Step::Initial(frame),
            };
            match step {
                Step::Caller(Some(Throttle::Challenge(challenge))) => self.challenge(challenge),
                Step::Caller(Some(Throttle::Reset(_)) | None) => {
                    self.cancel();
                    return Outcome::Cancelled;
                }
                // The caller's held-open initial: END comes after our reply ended, which
                // ends this loop first; ABORT means the caller gave up.
                Step::Initial(Some(Frame::Data(piece))) => {
                    self.callee.initial.ack(piece.len() as u32);
                }
                Step::Initial(Some(Frame::Begin(_) | Frame::Flush(_) | Frame::End)) => {}
                Step::Initial(Some(Frame::Abort) | None) => {
                    self.cancel();
                    return Outcome::Cancelled;
                }
                Step::Route(frame) => {
                    if let Some(outcome) = self.on_route(frame).await {
                        return outcome;
                    }
                }
            }
        }
    }

    /// One frame of the route's reply; `Some` when the reply is over.
    async fn on_route(&mut self, frame: Option<Frame>) -> Option<Outcome> {
        let gone = match frame {
            Some(Frame::Begin(begin)) => self.callee.reply.begin(begin).await.is_err(),
            Some(Frame::Data(piece)) => {
                let len = piece.len() as u32;
                let sent = self.data(piece).await;
                self.caller.reply.ack(len);
                match sent {
                    Ok(()) => false,
                    Err(Some(reset)) => {
                        self.caller.reply.reset(Reset::Plain);
                        self.caller.initial.abort();
                        self.callee.initial.reset(reset);
                        self.callee.reply.abort();
                        return Some(Outcome::Error);
                    }
                    Err(None) => true,
                }
            }
            Some(Frame::Flush(flush)) => {
                let flush = self.event(flush);
                self.callee.reply.flush(flush).await.is_err()
            }
            Some(Frame::End) => {
                if let Some(rewriter) = self.rewriter.as_mut()
                    && rewriter.finish().is_err()
                {
                    self.callee
                        .initial
                        .reset(internal("Upstream sent a malformed resources/read result"));
                    self.callee.reply.abort();
                    self.caller.initial.abort();
                    return Some(Outcome::Error);
                }
                self.callee.reply.end();
                self.caller.initial.end();
                return Some(Outcome::Ok);
            }
            Some(Frame::Abort) | None => {
                // The route failed the request: its RESET (a JSON-RPC error, a bearer
                // challenge) goes to the caller as it is.
                let reset = match self.caller.initial.try_throttle() {
                    Some(Throttle::Reset(reset)) => reset,
                    _ => Reset::Plain,
                };
                self.callee.initial.reset(reset);
                self.callee.reply.abort();
                self.caller.initial.abort();
                return Some(Outcome::Error);
            }
        };
        if gone {
            self.cancel();
            return Some(Outcome::Cancelled);
        }
        None
    }

    /// Sends result bytes to the caller (renamed for `resources/read`). `Err(None)` if
    /// the caller is gone, `Err(Some(reset))` if the result cannot be renamed.
    async fn data(&mut self, piece: Bytes) -> Result<(), Option<Reset>> {
        let Some(rewriter) = self.rewriter.as_mut() else {
            return self.callee.reply.data(piece).await.map_err(|_| None);
        };
        let mut sink = ItemSink::default();
        rewriter
            .feed(piece, &mut |_| true, &mut sink)
            .map_err(|_| Some(internal("Upstream sent a malformed resources/read result")))?;
        for part in sink.parts {
            self.callee.reply.data(part).await.map_err(|_| None)?;
        }
        Ok(())
    }

    /// An event on the route's reply, as the caller sees it: server-to-client request ids
    /// carry the toolkit when several routes share the session.
    fn event(&self, flush: Flush) -> Flush {
        match flush.event {
            stream::Event::Request { id, method, params } if self.proxy.aggregating() => Flush {
                id: flush.id,
                event: stream::Event::Request {
                    id: rename::wrap_id(&self.route.label, &id),
                    method,
                    params,
                },
            },
            event => Flush {
                id: flush.id,
                event,
            },
        }
    }

    /// A challenge from the caller, passed to the route (an answer with the id the route
    /// gave its request).
    fn challenge(&self, challenge: Challenge) {
        let challenge = match challenge {
            Challenge::Answer { id, result, error } if self.proxy.aggregating() => {
                match rename::unwrap_id(&id) {
                    Some((toolkit, raw)) if toolkit == *self.route.label => Challenge::Answer {
                        id: raw,
                        result,
                        error,
                    },
                    _ => {
                        proxy_metrics::with(|m| m.answers_unroutable += 1);
                        return;
                    }
                }
            }
            other => other,
        };
        let _ = self.caller.reply.challenge(challenge);
    }
}

/// One of two iterators of params pieces.
enum Either<A, B> {
    Spliced(A),
    Whole(B),
}

impl<A: Iterator<Item = Bytes>, B: Iterator<Item = Bytes>> Iterator for Either<A, B> {
    type Item = Bytes;

    fn next(&mut self) -> Option<Bytes> {
        match self {
            Either::Spliced(a) => a.next(),
            Either::Whole(b) => b.next(),
        }
    }
}

/// What the relay woke up for.
enum Step {
    Caller(Option<Throttle>),
    Route(Option<Frame>),
    Initial(Option<Frame>),
}

/// `logging/setLevel`: sent to every open route that logs; answered `{}` once they have
/// answered, unless none of them took it.
async fn set_level(proxy: &Rc<Proxy>, session: &Rc<ProxySession>, callee: &Callee) {
    let Some(params) = read_params(callee).await else {
        return fail(callee, internal("Params not received"));
    };
    let deadline = callee.begin.deadline;
    let routes = proxy.routes.iter().map(|route| {
        let params = params.clone();
        async move {
            let life = session
                .route(proxy, route.index, false, deadline)
                .await
                .ok()?;
            if !life.caps.contains(crate::stream::Caps::LOGGING) {
                return None;
            }
            let begin = Begin {
                session: life.session.clone(),
                ..callee.begin.clone()
            };
            Some(call(route, begin, params).await)
        }
    });
    let answers: Vec<Result<Bytes, Reset>> = join_all(routes.collect())
        .await
        .into_iter()
        .flatten()
        .collect();
    if answers.iter().any(Result::is_ok) || answers.is_empty() {
        answer(callee, Bytes::from_static(b"{}")).await;
        return;
    }
    let reset = answers.into_iter().find_map(Result::err);
    fail(
        callee,
        reset.unwrap_or_else(|| internal("No toolkit took the level")),
    );
}

/// Sends one small request to `route` and collects its whole result.
pub async fn call(route: &Route, begin: Begin, params: Bytes) -> Result<Bytes, Reset> {
    let begin = Begin {
        params_len: params.len() as u32,
        ..begin
    };
    let (caller, callee) = stream::open(begin);
    route.exit.open(callee);
    if caller.initial.data(params).await.is_err() {
        caller.initial.abort();
    }
    let mut result = BytesMut::new();
    loop {
        match caller.reply.next().await {
            Some(Frame::Data(piece)) => {
                caller.reply.ack(piece.len() as u32);
                if result.len() + piece.len() > MESSAGE_BYTES_MAX {
                    caller.reply.reset(Reset::Plain);
                    caller.initial.abort();
                    return Err(internal("Result too large"));
                }
                result.extend_from_slice(&piece);
            }
            Some(Frame::Begin(_) | Frame::Flush(_)) => {}
            Some(Frame::End) => {
                caller.initial.end();
                return Ok(result.freeze());
            }
            Some(Frame::Abort) | None => {
                caller.initial.abort();
                return Err(match caller.initial.try_throttle() {
                    Some(Throttle::Reset(reset)) => reset,
                    _ => internal("Toolkit failed the request"),
                });
            }
        }
    }
}
