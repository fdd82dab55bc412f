//! The agent-facing connection: one long-lived read loop decoding HTTP/1.1 requests, and a
//! dispatcher answering them strictly in order (pipelining).
//!
//! The reader never has more than [`PIPELINE_DEPTH_MAX`] decoded requests waiting; past
//! that it stops reading, so a fast sender is slowed to the speed of its responses.
//! Deadlines (idle keep-alive, slow request) are kept by the dispatcher while it waits for
//! the next request: it shuts the socket down, which completes the pending read (io_uring
//! rule: never cancel an I/O future by dropping it).
//!
//! Memory: a connection is one task (reader and dispatcher joined), and a connection
//! carrying an event stream (GET) waits for its next bytes in a small heap buffer, not a
//! slot: thousands of agents hold such streams open for hours, and each would otherwise pin
//! a slot (or, with the pool empty, a fallback buffer) for nothing.

use super::Server;
use super::sink::{self, Answer, ConnShared, Sink};
use crate::binding::server::metrics as server_metrics;
use crate::http::Method;
use crate::http::{self, HttpError, RequestDecoder, RequestEvent, RequestHead};
use crate::limits::{
    CONNECTION_IDLE_TIMEOUT, CONNECTION_STREAM_READ_BYTES, ERROR_LINGER_BYTES_MAX,
    ERROR_LINGER_TIMEOUT, MESSAGE_BYTES_MAX, PIPELINE_BYTES_MAX, PIPELINE_DEPTH_MAX,
    REQUEST_READ_TIMEOUT, SLOT_BYTES, TLS_HANDSHAKE_TIMEOUT,
};
use crate::log;
use crate::runtime::notify::Notify;
use crate::runtime::{Conn, ReadBuf, Slots, pass, tls};
use crate::stream::pieces::Whole;
use bytes::{Bytes, BytesMut};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Instant;
use tokio::time::Sleep;

/// One complete request: its head and its whole body (bounded by MESSAGE_BYTES_MAX).
pub struct Request {
    pub head: RequestHead,
    pub body: Bytes,
}

enum Item {
    Request(Request),
    Error(HttpError),
    Eof,
}

/// State shared by a connection's reader and dispatcher.
struct Link {
    shared: Rc<ConnShared>,
    /// Requests read and not yet taken by the dispatcher. Invariant: at most
    /// [`PIPELINE_DEPTH_MAX`] requests, and the end or error that closes them.
    queue: RefCell<VecDeque<Item>>,
    /// The body bytes of the queued requests: no more is read while it is at
    /// [`PIPELINE_BYTES_MAX`] or more.
    queued_bytes: Cell<usize>,
    /// Woken when an item is queued.
    queued: Notify,
    /// Woken when the dispatcher takes an item (room to read more).
    taken: Notify,
    /// A request is being answered.
    busy: Cell<bool>,
    /// The dispatcher has ended (the connection closes): nothing queued will be taken.
    dispatched: Cell<bool>,
    /// When the current partial request started arriving, if one is.
    partial_since: Cell<Option<Instant>>,
    last_activity: Cell<Instant>,
}

thread_local! {
    /// This worker's live connections, so a drain can shut every one of them down.
    static LIVE: RefCell<slab::Slab<std::rc::Weak<Link>>> = const { RefCell::new(slab::Slab::new()) };
}

/// Connections open on this worker.
pub fn live() -> usize {
    LIVE.with(|l| l.borrow().len())
}

/// Connections of this worker in the middle of a response (a drain waits for these
/// before [`shutdown_all`], so a response ended by the drain still gets its last bytes
/// out, e.g. a relayed reply or the terminating chunk of an SSE stream).
pub fn busy() -> usize {
    LIVE.with(|l| {
        l.borrow()
            .iter()
            .filter(|(_, c)| c.upgrade().is_some_and(|c| c.busy.get()))
            .count()
    })
}

/// Shuts every connection of this worker down (drain): pending reads complete, the
/// connections' tasks finish.
pub fn shutdown_all() {
    LIVE.with(|l| {
        for (_, c) in l.borrow().iter() {
            if let Some(c) = c.upgrade() {
                c.shared.conn.shutdown();
            }
        }
    });
}

/// Body of the 503 for a connection we cannot take.
const OVERLOADED: &[u8] = b"server overloaded\n";

/// Answers a connection we cannot take (table full or draining) with 503 and closes it.
/// A TLS listener's connection is closed without an answer: a 503 would cost a whole
/// handshake, which is what an overloaded worker cannot afford.
pub async fn refuse(conn: Conn, tls: bool) {
    if tls {
        conn.shutdown();
        return;
    }
    let mut out = BytesMut::with_capacity(128);
    let written = http::encode_response_head(
        503,
        &[("content-type", b"text/plain"), ("connection", b"close")],
        http::BodyFraming::Length(OVERLOADED.len() as u64),
        &mut out,
    );
    assert!(written.is_ok(), "constant headers pass the check");
    out.extend_from_slice(OVERLOADED);
    // A fresh connection's buffers take it at once; the bound is for a peer that sent a
    // flood and reads nothing.
    let at = Instant::now() + crate::limits::WRITE_LIMIT_MIN;
    let _ = crate::runtime::deadline::within(at, conn.write_all(out.freeze())).await;
    conn.shutdown();
}

/// Serves one accepted connection until it closes (over TLS when the server has it: the
/// handshake runs first, on the live connection, so a drain or the connection bound sees
/// it like any other).
pub async fn serve(server: Rc<Server>, slots: Rc<Slots>, conn: Conn) {
    let conn = match &server.tls {
        None => conn,
        Some(config) => match tls::server_session(&config.load_full()) {
            Ok(session) => conn.with_tls(session),
            Err(e) => {
                log::warn(format_args!("server {}: TLS session: {e}", server.name));
                conn.shutdown();
                return;
            }
        },
    };
    server_metrics::with(|m| {
        m.connections += 1;
        m.connections_accepted += 1;
    });
    let link = Rc::new(Link {
        shared: Rc::new(ConnShared::new(
            conn,
            sink::write_limit(server.cfg.request_timeout),
        )),
        queue: RefCell::new(VecDeque::with_capacity(2)),
        queued_bytes: Cell::new(0),
        queued: Notify::new(),
        taken: Notify::new(),
        busy: Cell::new(false),
        dispatched: Cell::new(false),
        partial_since: Cell::new(None),
        last_activity: Cell::new(Instant::now()),
    });
    let key = LIVE.with(|l| l.borrow_mut().insert(Rc::downgrade(&link)));
    if link.shared.conn.is_tls()
        && let Err(e) = link.shared.conn.handshake(TLS_HANDSHAKE_TIMEOUT).await
    {
        // Rate of these is what an operator watches (mcpyard_tls_handshakes_total); one
        // line each, with the reason, and the connection goes.
        log::warn(format_args!(
            "server {}: agent TLS handshake failed ({}): {e}",
            server.name,
            e.failure().label()
        ));
        link.shared.conn.shutdown();
        LIVE.with(|l| l.borrow_mut().try_remove(key));
        server_metrics::with(|m| m.connections -= 1);
        return;
    }
    // One task for both halves (a task per half would cost a second task cell per
    // connection); neither future is ever dropped before it completes. The reader is
    // polled first in every pass, so a request it queues is taken by the dispatcher in the
    // same pass (and the wake it made is dropped: see `runtime::pass`).
    let dispatching = async {
        dispatch(&server, &link).await;
        // The read loop ends once the shutdown completes its pending read, or at once if
        // it waits for room in the queue.
        link.dispatched.set(true);
        link.taken.notify_one();
        link.shared.conn.shutdown();
    };
    let reading = read_loop(&link, &slots);
    pass::join_in_order(std::pin::pin!(reading), std::pin::pin!(dispatching)).await;
    LIVE.with(|l| l.borrow_mut().try_remove(key));
    server_metrics::with(|m| m.connections -= 1);
}

/// The next item from the reader. While it waits the connection is idle (no response in
/// progress), so this is where the idle keep-alive and slow-request deadlines are kept:
/// past the idle one the socket is shut down, which ends the reader with an `Eof`; past
/// the slow-request one the answer is a 408 (the dispatcher then closes). Cancel-safe (an
/// item is only taken in the poll that returns it).
///
/// `timer` is the connection's one deadline timer, armed lazily: it is moved only when
/// it fired or when the deadline came earlier, never just because the deadline moved
/// later (as it does after every request). A timer armed per wait would re-register in
/// tokio's wheel on every request, and on io_uring, where the worker is parked while the
/// response is written, each re-registration also wakes the worker through its eventfd.
async fn next_item(link: &Link, timer: &mut Pin<&mut Sleep>) -> Item {
    let mut shut = false;
    loop {
        let notified = link.queued.notified();
        if let Some(item) = link.queue.borrow_mut().pop_front() {
            if let Item::Request(req) = &item {
                link.queued_bytes
                    .set(link.queued_bytes.get() - req.body.len());
            }
            link.taken.notify_one();
            return item;
        }
        if shut {
            notified.await;
            continue;
        }
        // Recomputed on every wake: the reader moves `partial_since` and `last_activity`.
        let partial = link.partial_since.get();
        let deadline = match partial {
            Some(since) => since + REQUEST_READ_TIMEOUT,
            None => link.last_activity.get() + CONNECTION_IDLE_TIMEOUT,
        };
        if deadline <= Instant::now() {
            if partial.is_some() {
                return Item::Error(HttpError::RequestTimeout);
            }
            link.shared.conn.shutdown();
            shut = true;
            continue;
        }
        if timer.is_elapsed() || deadline < timer.deadline().into_std() {
            timer.as_mut().reset(deadline.into());
        }
        tokio::select! {
            biased;
            () = notified => {}
            // Fired: maybe early (the deadline moved later meanwhile); the loop re-checks.
            () = timer.as_mut() => {}
        }
    }
}

async fn dispatch(server: &Rc<Server>, link: &Rc<Link>) {
    let timer = tokio::time::sleep_until((Instant::now() + CONNECTION_IDLE_TIMEOUT).into());
    let mut timer = std::pin::pin!(timer);
    loop {
        match next_item(link, &mut timer).await {
            Item::Request(req) => {
                link.busy.set(true);
                let answer = Answer::to(&req.head, server.draining());
                let sink = Sink::local(link.shared.clone(), answer);
                let done = link.shared.response_done();
                tokio::pin!(done);
                // Boxed before any await: the connection's task must keep no per-request
                // state while it idles (an unboxed future held by the `match` below would
                // widen every connection's task by the size of a request's future).
                let serving = server
                    .clone()
                    .handle(req, sink, link.shared.clone())
                    .map(Box::pin);
                let keep_alive = match serving {
                    Some(mut serving) => {
                        // Run here until the response is complete. Work that outlives it
                        // (a reply whose SSE connection dropped waits for a resuming GET)
                        // moves to a task of its own, so the connection is free at once.
                        tokio::select! {
                            biased;
                            () = &mut serving => {
                                // Freed before waiting out the response: a GET's stream
                                // runs in a task of its own and can last for hours.
                                drop(serving);
                                done.await
                            }
                            kept = &mut done => {
                                tokio::task::spawn_local(pass::run(serving));
                                kept
                            }
                        }
                    }
                    None => done.await,
                };
                link.busy.set(false);
                link.last_activity.set(pass::now());
                if !keep_alive {
                    return;
                }
            }
            Item::Error(e) => {
                server_metrics::with(|m| m.http_errors += 1);
                let mut out = BytesMut::with_capacity(256);
                http::encode_error_response(&e, &mut out);
                // Boxed: rare, and larger than the rest of the dispatcher's state.
                let written = Box::pin(link.shared.write_bounded(out.freeze())).await;
                // A decoding error ended the reader; a slow request's 408 did not (its
                // read is still pending, and the agent is slow anyway: no lingering).
                if written && e != HttpError::RequestTimeout {
                    Box::pin(linger(&link.shared.conn)).await;
                }
                return;
            }
            Item::Eof => return,
        }
    }
}

/// After an error answer the reader has stopped at: the sending side is shut (the agent sees
/// the answer end), and what the agent still sends (the rest of a body refused by its
/// length, say) is read and dropped for [`ERROR_LINGER_TIMEOUT`] or
/// [`ERROR_LINGER_BYTES_MAX`], or until the agent closes. Closing with unread input would
/// reset the connection, and the agent could lose the answer it has not read yet.
async fn linger(conn: &Conn) {
    conn.shutdown_write();
    let at = Instant::now() + ERROR_LINGER_TIMEOUT;
    let mut dropped = 0;
    let mut buf = ReadBuf::Heap(Vec::with_capacity(LINGER_READ_BYTES));
    while dropped < ERROR_LINGER_BYTES_MAX {
        // Never dropped in flight (io_uring): at the deadline the shutdown completes it.
        let mut read = std::pin::pin!(conn.read(buf));
        let (result, back) = tokio::select! {
            biased;
            done = &mut read => done,
            // A tokio timer, not the worker's deadline queue: this path is rare, and
            // a second user of the queue's future costs the request path its inlining.
            () = tokio::time::sleep_until(at.into()) => {
                conn.shutdown();
                read.await
            }
        };
        buf = back;
        match result {
            Ok(n) if n > 0 => dropped += n,
            _ => return,
        }
    }
}

/// The buffer a lingering connection's input is read into (and dropped from), reused.
const LINGER_READ_BYTES: usize = 16 * 1024;

/// Back-pressure: waits while the dispatcher is [`PIPELINE_DEPTH_MAX`] requests or
/// [`PIPELINE_BYTES_MAX`] bytes behind. False once the dispatcher has ended (nothing more
/// will be taken).
async fn room(link: &Link) -> bool {
    loop {
        let taken = link.taken.notified();
        if link.dispatched.get() {
            return false;
        }
        if !full(link) {
            return true;
        }
        taken.await;
    }
}

/// The queue holds as many requests, or as many bytes, as the dispatcher may be behind.
fn full(link: &Link) -> bool {
    link.queue.borrow().len() >= PIPELINE_DEPTH_MAX || link.queued_bytes.get() >= PIPELINE_BYTES_MAX
}

fn push(link: &Link, item: Item) {
    if let Item::Request(req) = &item {
        link.queued_bytes
            .set(link.queued_bytes.get() + req.body.len());
    }
    let mut queue = link.queue.borrow_mut();
    // A request is read only with room for it ([`room`]); an end or an error may come
    // on top of a full queue.
    assert!(queue.len() <= PIPELINE_DEPTH_MAX);
    queue.push_back(item);
    drop(queue);
    link.queued.notify_one();
}

async fn read_loop(link: &Link, slots: &Slots) {
    let mut decoder = RequestDecoder::new(MESSAGE_BYTES_MAX);
    let mut buf = BytesMut::new();
    let mut partial: Option<(RequestHead, Whole)> = None;
    // The last request read was a GET (an event stream): its connection most likely stays
    // quiet until the agent closes it, so the next read waits in a small heap buffer.
    let mut streaming = false;
    // The last read filled its buffer: more is likely waiting, read into a slot.
    let mut burst = false;
    // Plaintext that came with the TLS handshake's last flight is decoded before any read.
    let mut early = link.shared.conn.take_early(&mut buf) > 0;
    'read: loop {
        if !room(link).await {
            break 'read;
        }
        if !std::mem::take(&mut early) {
            let slot = if streaming && !burst {
                ReadBuf::Heap(Vec::with_capacity(CONNECTION_STREAM_READ_BYTES))
            } else {
                slots.lend()
            };
            let room = match &slot {
                ReadBuf::Fixed(_) => SLOT_BYTES,
                ReadBuf::Heap(v) => v.capacity(),
            };
            let (result, slot) = link.shared.conn.read(slot).await;
            let n = match result {
                Ok(n) if n > 0 => n,
                _ => {
                    slots.give_back(slot);
                    break 'read;
                }
            };
            burst = n >= room;
            let received = link
                .shared
                .conn
                .received(slot.get(..n).unwrap_or_default(), &mut buf);
            slots.give_back(slot);
            if received.is_err() {
                // A broken TLS stream: nothing after it can be trusted.
                break 'read;
            }
        }
        // One clock read per read: the request deadlines are whole seconds.
        let mut now = Instant::now();
        link.last_activity.set(now);
        let was_partial = link.partial_since.get().is_some();
        if !was_partial {
            link.partial_since.set(Some(now));
        }
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(RequestEvent::Head(head))) => {
                    if head.expects_continue() && !link.busy.get() && link.queue.borrow().is_empty()
                    {
                        // Boxed: a write future is larger than the rest of this loop's
                        // state, and this one is rare.
                        let interim = Bytes::from_static(b"HTTP/1.1 100 Continue\r\n\r\n");
                        let _ = Box::pin(link.shared.write_bounded(interim)).await;
                    }
                    partial = Some((head, Whole::default()));
                }
                Ok(Some(RequestEvent::Data(data))) => {
                    if let Some((_, body)) = partial.as_mut() {
                        body.push(data);
                    }
                }
                Ok(Some(RequestEvent::End)) => {
                    if let Some((head, mut body)) = partial.take() {
                        streaming = head.method == Method::Get;
                        push(
                            link,
                            Item::Request(Request {
                                head,
                                body: body.take(),
                            }),
                        );
                    }
                    link.partial_since
                        .set(if buf.is_empty() { None } else { Some(now) });
                    // The requests still in the buffer wait for room as a read would
                    // (and a partial one after them is timed from when it can be taken).
                    if full(link) {
                        if !room(link).await {
                            break 'read;
                        }
                        now = Instant::now();
                        if link.partial_since.get().is_some() {
                            link.partial_since.set(Some(now));
                        }
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    push(link, Item::Error(e));
                    return;
                }
            }
        }
        if !was_partial && link.partial_since.get().is_some() {
            // A request started and is not complete: the dispatcher, waiting out the idle
            // deadline, must bring its timer forward to the slow-request one.
            link.queued.notify_one();
        }
        if streaming && buf.is_empty() {
            // The stream's request head (its headers borrow this buffer) is done with
            // here; let the buffer go with it rather than keep it for a later request.
            buf = BytesMut::new();
        }
        if link.shared.conn.tls_closed() {
            // close_notify: the agent sends nothing more (what came before it is decoded).
            break 'read;
        }
    }
    link.shared.peer_closed.set(true);
    link.shared.closed.notify_waiters();
    push(link, Item::Eof);
}
