//! Where a response goes: straight to the connection's socket (the session lives on this
//! worker) or, encoded, over a bounded channel to the worker that holds the connection.
//!
//! The MCP logic writes every response through [`Sink`], so it never knows which case it is
//! in. Bytes are HTTP-encoded here, on the worker that owns the session; the connection's
//! worker only copies them to the socket.

use crate::binding::server::metrics as server_metrics;
use crate::http::{self, BodyFraming};
use crate::limits::WRITE_LIMIT_MIN;
use crate::runtime::encode_pool::{self, Encoded};
use crate::runtime::notify::Notify;
use crate::runtime::pass::Waiter;
use crate::runtime::{Conn, deadline};
use bytes::{Bytes, BytesMut};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// The connection went away (write failed, peer closed, or the forwarding worker quit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

/// Shared bytes at least this long go to the socket as they are, in a vectored write
/// behind the bytes copied before them (a stored list answered from the cache); shorter
/// ones are copied, which costs less than a part more in the write.
pub const SHARED_PIECE_MIN_BYTES: usize = 16 * 1024;

/// One piece of a response body.
#[derive(Clone, Copy)]
pub enum Piece<'a> {
    /// Copied into the write.
    Copy(&'a [u8]),
    /// Shared bytes: written as they are from [`SHARED_PIECE_MIN_BYTES`] on, copied below.
    Shared(&'a Bytes),
}

impl Piece<'_> {
    fn len(&self) -> usize {
        match self {
            Piece::Copy(b) => b.len(),
            Piece::Shared(b) => b.len(),
        }
    }

    /// How many of its bytes a write copies.
    fn copied(&self) -> usize {
        match self {
            Piece::Shared(b) if b.len() >= SHARED_PIECE_MIN_BYTES => 0,
            piece => piece.len(),
        }
    }
}

/// The bytes of one write, gathered: copied pieces in a buffer, large shared pieces kept
/// as they are between them.
struct Gather {
    /// What comes before the copied bytes in `buf`, in order.
    parts: Vec<Bytes>,
    buf: Encoded,
}

impl Gather {
    /// Room for `copied` bytes, from the worker's encode buffers.
    fn new(copied: usize) -> Gather {
        Gather {
            parts: Vec::new(),
            buf: encode_pool::take(copied),
        }
    }

    fn put(&mut self, piece: Piece) {
        match piece {
            Piece::Shared(b) if b.len() >= SHARED_PIECE_MIN_BYTES => {
                if !self.buf.is_empty() {
                    self.parts.push(self.buf.split_frozen());
                }
                self.parts.push(b.clone());
            }
            Piece::Shared(b) => http::put_bulk(b, &mut self.buf),
            Piece::Copy(b) => http::put_bulk(b, &mut self.buf),
        }
    }

    fn is_empty(&self) -> bool {
        self.parts.is_empty() && self.buf.is_empty()
    }

    fn done(mut self) -> Gathered {
        if self.parts.is_empty() {
            return Gathered::One(self.buf.freeze());
        }
        if !self.buf.is_empty() {
            self.parts.push(self.buf.freeze());
        }
        Gathered::Parts(self.parts)
    }
}

/// What one write of a [`Sink`] sends.
enum Gathered {
    One(Bytes),
    /// Back to back, in one vectored write.
    Parts(Vec<Bytes>),
}

/// A response part sent from the session's worker to the connection's worker.
pub enum Part {
    /// Encoded response bytes to write.
    Bytes(Bytes),
    /// Encoded response bytes in parts (large shared bytes among them), for one vectored
    /// write.
    Parts(Vec<Bytes>),
    /// The response is complete; keep the connection open if `keep_alive`.
    End { keep_alive: bool },
}

/// The connection half a local sink writes to, shared with the connection's reader.
pub struct ConnShared {
    pub conn: Conn,
    /// The longest one write without a deadline of its own may take ([`ConnShared::write`]).
    write_limit: Duration,
    /// The reader saw EOF or an error.
    pub peer_closed: Cell<bool>,
    /// Woken when `peer_closed` turns true.
    pub closed: Notify,
    /// Set once the response in progress is over: whether the connection may carry another
    /// request. Reset by the dispatcher before each request (one response at a time).
    pub done: Cell<Option<bool>>,
    /// The dispatcher waiting for `done`.
    done_waiter: RefCell<Waiter>,
}

impl ConnShared {
    /// `write_limit`: see [`write_limit`].
    pub fn new(conn: Conn, write_limit: Duration) -> ConnShared {
        ConnShared {
            conn,
            write_limit,
            peer_closed: Cell::new(false),
            closed: Notify::new(),
            done: Cell::new(None),
            done_waiter: RefCell::new(Waiter::default()),
        }
    }

    /// Waits until the response in progress is over and takes whether the connection may
    /// carry another request (one waiter: the connection's dispatcher).
    pub async fn response_done(&self) -> bool {
        std::future::poll_fn(|cx| {
            let mut waiter = self.done_waiter.borrow_mut();
            waiter.polled();
            if let Some(keep_alive) = self.done.take() {
                waiter.clear();
                return Poll::Ready(keep_alive);
            }
            waiter.register(cx);
            Poll::Pending
        })
        .await
    }

    fn signal_done(&self, keep_alive: bool) {
        self.done.set(Some(keep_alive));
        self.done_waiter.borrow_mut().wake();
    }

    /// Writes `gathered` to the connection by `until`, or, without one, within the write
    /// limit from now. A write still going then (an agent that stopped reading) shuts the
    /// connection down and is counted; false once the connection is gone.
    async fn write(&self, gathered: Gathered, until: Option<Instant>) -> bool {
        let until = until.unwrap_or_else(|| Instant::now() + self.write_limit);
        let write = async {
            match gathered {
                Gathered::One(bytes) => self.conn.write_all(bytes).await,
                Gathered::Parts(parts) => self.conn.write_all_parts(parts).await,
            }
        };
        let written = match deadline::within(until, write).await {
            Some(written) => written.is_ok(),
            None => {
                // Cut halfway: the connection can carry nothing more.
                server_metrics::with(|m| m.write_deadline_cuts += 1);
                self.conn.shutdown();
                false
            }
        };
        if !written {
            self.peer_closed.set(true);
            self.closed.notify_waiters();
        }
        written
    }

    /// Writes bytes outside any response (an interim `100 Continue`, an HTTP error the
    /// connection ends with) within the write limit; false once the connection is gone.
    pub async fn write_bounded(&self, bytes: Bytes) -> bool {
        self.write(Gathered::One(bytes), None).await
    }

    async fn wait_closed(&self) {
        loop {
            let notified = self.closed.notified();
            if self.peer_closed.get() {
                return;
            }
            notified.await;
        }
    }
}

enum Out {
    Local {
        shared: Rc<ConnShared>,
        /// The end of the response was not signalled yet.
        pending: bool,
    },
    Remote {
        tx: mpsc::Sender<Part>,
        /// Shared with the relay on the connection's worker, which writes the bytes.
        handoff: Arc<Handoff>,
        /// The response's end was sent.
        ended: bool,
    },
}

/// What a sink sending to another worker shares with the relay there. The relay's own
/// writes are the ones that can stall, so they carry the response's deadline; the sending
/// side is bounded through them (the relay stops, and the channel closes).
#[derive(Default)]
pub struct Handoff {
    /// Told when the sink goes before its response's end was sent: the relay stops, even
    /// in the middle of a write.
    pub aborted: tokio::sync::Notify,
    /// The response's deadline ([`Sink::bound_until`]), once it has one.
    until: std::sync::Mutex<Option<Instant>>,
    /// The relay's verdict: [`VERDICT_PENDING`] while it writes, then whether the whole
    /// response reached the connection ([`VERDICT_WRITTEN`]) or not ([`VERDICT_FAILED`]).
    verdict: AtomicU8,
    /// Told once, when the verdict is in (a permit: the owner may wait after it came).
    settled: tokio::sync::Notify,
}

const VERDICT_PENDING: u8 = 0;
const VERDICT_WRITTEN: u8 = 1;
const VERDICT_FAILED: u8 = 2;

impl Handoff {
    /// The response's deadline, if it has one yet.
    pub fn until(&self) -> Option<Instant> {
        *self.deadline()
    }

    fn bound_until(&self, at: Instant) {
        *self.deadline() = Some(at);
    }

    /// The deadline's slot. It only ever holds a plain value, so a lock poisoned by a
    /// panic elsewhere still holds a good one.
    fn deadline(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The relay's verdict: `written`, the whole response reached the connection (its end
    /// included), or not. Given once, by [`Verdict`]'s drop.
    fn settle(&self, written: bool) {
        let verdict = if written {
            VERDICT_WRITTEN
        } else {
            VERDICT_FAILED
        };
        self.verdict.store(verdict, Ordering::Release);
        self.settled.notify_one();
    }

    /// Waits for the relay's verdict: true if the whole response reached the connection.
    /// The relay's writes are bounded (by the response's deadline, else each by the
    /// connection's write limit), and it gives a verdict however it stops.
    async fn written(&self) -> bool {
        loop {
            match self.verdict.load(Ordering::Acquire) {
                VERDICT_PENDING => self.settled.notified().await,
                verdict => return verdict == VERDICT_WRITTEN,
            }
        }
    }
}

/// The relay's side of a [`Handoff`]'s verdict: failed unless [`Verdict::written`] was
/// called, however the relay stops (its task may be dropped at a worker's end).
pub struct Verdict {
    handoff: Arc<Handoff>,
    written: bool,
}

impl Verdict {
    pub fn new(handoff: Arc<Handoff>) -> Verdict {
        Verdict {
            handoff,
            written: false,
        }
    }

    /// The response's end reached the connection, every byte before it written.
    pub fn written(&mut self) {
        self.written = true;
    }
}

impl Drop for Verdict {
    fn drop(&mut self) {
        self.handoff.settle(self.written);
    }
}

/// What the request allows its response, beyond the status and headers.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Answer {
    /// The connection may carry another request after this response.
    pub keep_alive: bool,
    /// The response has a body; not for `HEAD`, whose response has the head only (RFC 9110
    /// §9.3.2), its length fields as the body would have had them.
    pub body: bool,
    /// A streamed body may use the chunked coding; an HTTP/1.0 agent knows none, so its
    /// streamed body runs until the connection closes (RFC 9112 §6.1, §6.3).
    pub chunked: bool,
}

impl Answer {
    /// An HTTP/1.1 request that keeps its connection.
    pub const KEEP: Answer = Answer {
        keep_alive: true,
        body: true,
        chunked: true,
    };

    /// What `head` allows; `draining` closes the connection after the response. An
    /// HTTP/1.0 agent's connection is closed after each response: keeping it would need a
    /// `connection: keep-alive` answer and a length on every body, for a client mcpyard
    /// serves only for compatibility.
    pub fn to(head: &http::RequestHead, draining: bool) -> Answer {
        let chunked = head.minor_version >= 1;
        Answer {
            keep_alive: chunked && head.keep_alive() && !draining,
            body: head.method != http::Method::Head,
            chunked,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    Head,
    Body { chunked: bool },
    Done,
}

/// One HTTP response being written.
pub struct Sink {
    out: Out,
    state: State,
    /// What the request allows; `keep_alive` is cleared when a refused head closes the
    /// connection.
    answer: Answer,
    /// Every write ends by then ([`Sink::bound_until`]); `None`: within the connection's
    /// write limit from when it began.
    until: Option<Instant>,
}

/// The longest one write to an agent may take when it has no deadline of its own (a GET
/// stream's events, an HTTP error): the binding's `request_timeout`, but never less than
/// [`WRITE_LIMIT_MIN`], so a deadline set short for quick tools does not cut a stream an
/// agent reads slowly.
pub fn write_limit(request_timeout: Duration) -> Duration {
    request_timeout.max(WRITE_LIMIT_MIN)
}

impl Sink {
    /// A sink writing to a connection on this worker; [`ConnShared::response_done`] tells,
    /// once the response is over, whether the connection may carry another request.
    pub fn local(shared: Rc<ConnShared>, answer: Answer) -> Sink {
        shared.done.set(None);
        Sink::new(
            Out::Local {
                shared,
                pending: true,
            },
            answer,
        )
    }

    fn new(out: Out, answer: Answer) -> Sink {
        Sink {
            out,
            state: State::Head,
            answer,
            until: None,
        }
    }

    /// A sink whose bytes travel to another worker over `tx` (built on the owning worker),
    /// sharing `handoff` with the relay there.
    pub fn from_channel(tx: mpsc::Sender<Part>, handoff: Arc<Handoff>, answer: Answer) -> Sink {
        Sink::new(
            Out::Remote {
                tx,
                handoff,
                ended: false,
            },
            answer,
        )
    }

    /// Bounds every write of this response from now on by `at`: a write still going then
    /// (an agent that stopped reading) cuts the connection and fails, so a reply past its
    /// deadline never holds the connection, or the bytes it was writing, for longer.
    ///
    /// Without it, each write is bounded by the connection's [`write_limit`] from when it
    /// began. A sink sending to another worker passes the bound on to the relay that
    /// writes its bytes.
    pub fn bound_until(&mut self, at: Instant) {
        self.until = Some(at);
        if let Out::Remote { handoff, .. } = &self.out {
            handoff.bound_until(at);
        }
    }

    /// Writes already-encoded response bytes (relaying a remote response).
    pub async fn write_raw(&mut self, bytes: Bytes) -> Result<(), Gone> {
        self.state = State::Body { chunked: false };
        self.write(bytes).await
    }

    /// Writes already-encoded response parts back to back, in one vectored write.
    pub async fn write_raw_parts(&mut self, parts: Vec<Bytes>) -> Result<(), Gone> {
        self.state = State::Body { chunked: false };
        self.write_gathered(Gathered::Parts(parts)).await
    }

    /// Marks a relayed response complete.
    pub fn complete_raw(&mut self, keep_alive: bool) {
        self.state = State::Done;
        if let Out::Local { shared, pending } = &mut self.out
            && std::mem::take(pending)
        {
            shared.signal_done(keep_alive && self.answer.keep_alive);
        }
    }

    /// True until the response head was written.
    pub fn head_pending(&self) -> bool {
        self.state == State::Head
    }

    /// What the request allows this response (for a sink built on another worker).
    pub fn answer(&self) -> Answer {
        self.answer
    }

    async fn write(&mut self, bytes: Bytes) -> Result<(), Gone> {
        self.write_gathered(Gathered::One(bytes)).await
    }

    async fn write_gathered(&mut self, gathered: Gathered) -> Result<(), Gone> {
        match &mut self.out {
            Out::Local { shared, .. } => match shared.write(gathered, self.until).await {
                true => Ok(()),
                false => Err(Gone),
            },
            Out::Remote { tx, .. } => {
                let part = match gathered {
                    Gathered::One(bytes) => Part::Bytes(bytes),
                    Gathered::Parts(parts) => Part::Parts(parts),
                };
                // Bounded by the relay: it writes by the same deadline, and closes the
                // channel when it stops.
                tx.send(part).await.map_err(|_| Gone)
            }
        }
    }

    /// Encodes a response head (with `connection: close` when the connection ends after
    /// it). A header value with a control byte (possible only for values that came from an
    /// upstream, such as a relayed challenge) refuses the head: see [`Sink::refused`].
    fn encode_head(
        &self,
        status: u16,
        headers: &[(&'static str, &[u8])],
        body: BodyFraming,
        out: &mut BytesMut,
    ) -> Result<(), http::HeadError> {
        if self.answer.keep_alive {
            // The common case needs no extra header, so no copy of the list.
            return http::encode_response_head(status, headers, body, out);
        }
        let mut all: Vec<(&str, &[u8])> = Vec::with_capacity(headers.len() + 1);
        all.extend_from_slice(headers);
        all.push(("connection", b"close"));
        http::encode_response_head(status, &all, body, out)
    }

    /// Answers in place of a response whose head was refused: a 502 naming the header, the
    /// connection closed after it, one log line and a counter. Returns `Gone`, so the caller
    /// stops writing that response.
    async fn refused(&mut self, err: http::HeadError) -> Result<(), Gone> {
        crate::log::warn(format_args!("server: response not sent: {err}"));
        server_metrics::with(|m| m.heads_refused_downstream += 1);
        let detail = format!("response not sent: {err}\n");
        let mut out = BytesMut::with_capacity(128 + detail.len());
        let headers: [(&str, &[u8]); 2] =
            [("content-type", b"text/plain"), ("connection", b"close")];
        let written = http::encode_response_head(
            502,
            &headers,
            BodyFraming::Length(detail.len() as u64),
            &mut out,
        );
        assert!(written.is_ok(), "constant headers pass the check");
        out.extend_from_slice(detail.as_bytes());
        self.answer.keep_alive = false;
        self.state = State::Done;
        self.write(out.freeze()).await?;
        self.complete().await?;
        Err(Gone)
    }

    /// Writes a complete response with a known body in one write.
    pub async fn respond(
        self,
        status: u16,
        headers: &[(&'static str, &[u8])],
        body: &[u8],
    ) -> Result<(), Gone> {
        self.respond_of(status, headers, &[Piece::Copy(body)]).await
    }

    /// Writes a complete response whose body is `parts` back to back, in one write: the
    /// parts are copied once, straight after the head (large shared ones not at all).
    pub async fn respond_of(
        mut self,
        status: u16,
        headers: &[(&'static str, &[u8])],
        parts: &[Piece<'_>],
    ) -> Result<(), Gone> {
        assert!(self.state == State::Head);
        let len: usize = parts.iter().map(Piece::len).sum();
        let mut out = Gather::new(256 + parts.iter().map(Piece::copied).sum::<usize>());
        let framing = BodyFraming::Length(len as u64);
        if let Err(e) = self.encode_head(status, headers, framing, &mut out.buf) {
            return self.refused(e).await;
        }
        if self.answer.body {
            for part in parts {
                out.put(*part);
            }
        }
        self.state = State::Done;
        self.write_gathered(out.done()).await?;
        self.complete().await
    }

    /// Writes a complete response in one write, like [`Sink::respond_of`], whose head's
    /// fields come ready made: `fields` is from [`http::response_head_fields`] (checked
    /// there). `connection: close` and the length are added here, as the encoder would add
    /// them, so the bytes are the same as `respond_of`'s.
    pub async fn respond_with_fields(
        mut self,
        fields: &[u8],
        parts: &[Piece<'_>],
    ) -> Result<(), Gone> {
        assert!(self.state == State::Head);
        const CLOSE: &[u8] = b"connection: close\r\n";
        let len: usize = parts.iter().map(Piece::len).sum();
        let copied: usize = parts.iter().map(Piece::copied).sum();
        let close = if self.answer.keep_alive {
            0
        } else {
            CLOSE.len()
        };
        let size = fields.len() + close + http::content_length_bytes(len as u64) + copied;
        let mut out = Gather::new(size);
        out.buf.extend_from_slice(fields);
        if !self.answer.keep_alive {
            out.buf.extend_from_slice(CLOSE);
        }
        http::put_content_length(len as u64, &mut out.buf);
        if self.answer.body {
            for part in parts {
                out.put(*part);
            }
        }
        self.state = State::Done;
        self.write_gathered(out.done()).await?;
        self.complete().await
    }

    /// Writes the head of a response whose body is streamed with [`Sink::body`] and
    /// [`Sink::finish`] (chunked transfer coding). `Err(Gone)` also when the head was
    /// refused and a 502 went in its place (the connection then closes).
    pub async fn head(
        &mut self,
        status: u16,
        headers: &[(&'static str, &[u8])],
    ) -> Result<(), Gone> {
        assert!(self.state == State::Head);
        let mut out = encode_pool::take(256);
        let framing = match self.answer.chunked {
            true => BodyFraming::Chunked,
            false => BodyFraming::CloseDelimited,
        };
        if let Err(e) = self.encode_head(status, headers, framing, &mut out) {
            return self.refused(e).await;
        }
        self.state = State::Body {
            chunked: self.answer.chunked,
        };
        self.write(out.freeze()).await
    }

    /// Writes body bytes (as one chunk).
    pub async fn body(&mut self, data: &[u8]) -> Result<(), Gone> {
        self.body_of([Piece::Copy(data)]).await
    }

    /// Writes `parts` as one chunk in one write.
    pub async fn body_of<'a, I>(&mut self, parts: I) -> Result<(), Gone>
    where
        I: IntoIterator<Item = Piece<'a>>,
        I::IntoIter: Clone,
    {
        let State::Body { chunked } = self.state else {
            panic!("a body is written after its head");
        };
        let out = match self.answer.body {
            true => chunk_of(parts, chunked, false),
            false => Gather::new(0),
        };
        if out.is_empty() {
            return Ok(());
        }
        self.write_gathered(out.done()).await
    }

    /// Ends a streamed body and hands the connection back.
    pub async fn finish(self) -> Result<(), Gone> {
        self.finish_of([]).await
    }

    /// Writes `parts` as a last data chunk, then ends the body, all in one write, and hands
    /// the connection back.
    pub async fn finish_of<'a, I>(mut self, parts: I) -> Result<(), Gone>
    where
        I: IntoIterator<Item = Piece<'a>>,
        I::IntoIter: Clone,
    {
        let State::Body { chunked } = self.state else {
            panic!("a body is finished after its head");
        };
        let out = match self.answer.body {
            true => chunk_of(parts, chunked, true),
            false => Gather::new(0),
        };
        self.state = State::Done;
        if !out.is_empty() {
            self.write_gathered(out.done()).await?;
        }
        self.complete().await
    }

    async fn complete(&mut self) -> Result<(), Gone> {
        let keep_alive = self.answer.keep_alive;
        match &mut self.out {
            Out::Local { shared, pending } => {
                if std::mem::take(pending) {
                    shared.signal_done(keep_alive);
                }
                Ok(())
            }
            Out::Remote { tx, ended, handoff } => {
                tx.send(Part::End { keep_alive }).await.map_err(|_| Gone)?;
                *ended = true;
                // Done when the relay wrote it, as a local response is: a write cut there
                // (an agent that stopped reading) fails this response here too.
                match handoff.written().await {
                    true => Ok(()),
                    false => Err(Gone),
                }
            }
        }
    }

    /// Resolves once the agent's connection is gone.
    pub async fn closed(&self) {
        match &self.out {
            Out::Local { shared, .. } => shared.wait_closed().await,
            Out::Remote { tx, .. } => tx.closed().await,
        }
    }
}

/// `parts` as one chunk, and the body's end after it when `last`. No chunk when the parts
/// are all empty, since an empty chunk would end the body. Not `chunked`: the parts as
/// they are (the body ends with the connection).
fn chunk_of<'a, I>(parts: I, chunked: bool, last: bool) -> Gather
where
    I: IntoIterator<Item = Piece<'a>>,
    I::IntoIter: Clone,
{
    let parts = parts.into_iter();
    if !chunked {
        let mut out = Gather::new(parts.clone().map(|p| p.copied()).sum());
        parts.for_each(|part| out.put(part));
        return out;
    }
    let len: usize = parts.clone().map(|p| p.len()).sum();
    let copied: usize = parts.clone().map(|p| p.copied()).sum();
    let end = if last { http::LAST_CHUNK_BYTES } else { 0 };
    let mut out = Gather::new(http::CHUNK_FRAMING_MAX + copied + end);
    if len > 0 {
        http::encode_chunk_size(len as u64, &mut out.buf);
        for part in parts {
            out.put(part);
        }
        out.buf.extend_from_slice(b"\r\n");
    }
    if last {
        http::encode_last_chunk(&mut out.buf);
    }
    out
}

impl Drop for Sink {
    /// A sink dropped before its response completed aborts the connection.
    fn drop(&mut self) {
        match &mut self.out {
            Out::Local { shared, pending } => {
                if std::mem::take(pending) {
                    if self.state != State::Done {
                        shared.conn.shutdown();
                    }
                    shared.signal_done(false);
                }
            }
            Out::Remote { handoff, ended, .. } => {
                if !*ended {
                    handoff.aborted.notify_one();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(gathered: Gathered) -> (Vec<u8>, usize) {
        match gathered {
            Gathered::One(b) => (b.to_vec(), 1),
            Gathered::Parts(parts) => (parts.concat(), parts.len()),
        }
    }

    #[test]
    fn a_chunk_with_a_large_shared_piece_has_the_same_bytes_and_shares_the_piece() {
        let stored: Bytes = vec![b'x'; SHARED_PIECE_MIN_BYTES].into();
        let pieces = [
            Piece::Copy(b"{\"a\":"),
            Piece::Shared(&stored),
            Piece::Copy(b"}"),
        ];
        let gathered = chunk_of(pieces, true, true).done();
        if let Gathered::Parts(parts) = &gathered {
            assert_eq!(
                parts.len(),
                3,
                "size line and prefix, the stored bytes, the rest"
            );
            assert_eq!(
                parts.get(1).map(|p| p.as_ptr()),
                Some(stored.as_ptr()),
                "not copied"
            );
        } else {
            panic!("a large shared piece is written as it is");
        }
        let mut want = BytesMut::new();
        http::encode_chunk_of([&b"{\"a\":"[..], &stored, b"}"], &mut want);
        http::encode_last_chunk(&mut want);
        assert_eq!(joined(gathered).0, want.to_vec());
    }

    #[test]
    fn small_shared_pieces_are_copied_into_one_buffer() {
        let small: Bytes = vec![b'y'; SHARED_PIECE_MIN_BYTES - 1].into();
        let gathered = chunk_of([Piece::Shared(&small), Piece::Copy(b"z")], true, false).done();
        let (bytes, parts) = joined(gathered);
        assert_eq!(parts, 1);
        let mut want = BytesMut::new();
        http::encode_chunk_of([&small[..], b"z"], &mut want);
        assert_eq!(bytes, want.to_vec());
    }

    /// What a sink sending to another worker put on its channel, joined.
    fn sent(mut rx: mpsc::Receiver<Part>) -> Vec<u8> {
        let mut out = Vec::new();
        while let Ok(part) = rx.try_recv() {
            match part {
                Part::Bytes(b) => out.extend_from_slice(&b),
                Part::Parts(parts) => parts.iter().for_each(|b| out.extend_from_slice(b)),
                Part::End { keep_alive } => assert!(keep_alive),
            }
        }
        out
    }

    #[test]
    fn a_whole_response_with_a_large_shared_piece_counts_it_in_its_length() {
        crate::testing::run_local(async {
            let stored: Bytes = vec![b'z'; SHARED_PIECE_MIN_BYTES + 3].into();
            let body = [
                Piece::Copy(b"{\"r\":\""),
                Piece::Shared(&stored),
                Piece::Copy(b"\"}"),
            ];
            let mut want_body = b"{\"r\":\"".to_vec();
            want_body.extend_from_slice(&stored);
            want_body.extend_from_slice(b"\"}");
            let headers: [(&str, &[u8]); 1] = [("content-type", b"application/json")];
            let length = format!("content-length: {}\r\n\r\n", want_body.len());

            let (tx, rx) = mpsc::channel(8);
            let sink = Sink::from_channel(tx, relayed(true), Answer::KEEP);
            assert!(sink.respond_of(200, &headers, &body).await.is_ok());
            let got = sent(rx);
            let split = got
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .expect("a head")
                + 4;
            let (head, rest) = got.split_at(split);
            assert!(
                head.ends_with(length.as_bytes()),
                "{}",
                String::from_utf8_lossy(head)
            );
            assert!(rest == want_body, "the body, the stored bytes in it");

            let fields = http::response_head_fields(200, &headers).expect("fields");
            let (tx, rx) = mpsc::channel(8);
            let sink = Sink::from_channel(tx, relayed(true), Answer::KEEP);
            assert!(sink.respond_with_fields(&fields, &body).await.is_ok());
            assert_eq!(sent(rx), got, "the same bytes either way");
        });
    }

    /// A handoff whose relay already gave its verdict: `written`, or not.
    fn relayed(written: bool) -> Arc<Handoff> {
        let handoff = Arc::new(Handoff::default());
        let mut verdict = Verdict::new(handoff.clone());
        if written {
            verdict.written();
        }
        handoff
    }

    /// A response handed to another worker is done when the relay there wrote it: one
    /// whose relay failed (its agent stopped reading, or went) fails, and one still being
    /// written is not done yet.
    #[test]
    fn a_remote_response_is_done_when_its_relay_wrote_it() {
        crate::testing::run_local(async {
            let (tx, _rx) = mpsc::channel(8);
            let sink = Sink::from_channel(tx, relayed(false), Answer::KEEP);
            assert!(sink.respond(200, &[], b"{}").await.is_err());

            let handoff = Arc::new(Handoff::default());
            let verdict = Verdict::new(handoff.clone());
            let (tx, _rx) = mpsc::channel(8);
            let sink = Sink::from_channel(tx, handoff, Answer::KEEP);
            let mut respond = std::pin::pin!(sink.respond(200, &[], b"{}"));
            let pending =
                std::future::poll_fn(|cx| Poll::Ready(respond.as_mut().poll(cx).is_pending()))
                    .await;
            assert!(pending, "done before the relay wrote it");
            drop(verdict);
            assert!(
                respond.await.is_err(),
                "the relay stopped without writing it"
            );
        });
    }

    #[test]
    fn empty_pieces_make_no_chunk() {
        let empty = [Piece::Copy(b""), Piece::Shared(&Bytes::new())];
        assert!(chunk_of(empty, true, false).is_empty());
        assert_eq!(
            joined(chunk_of(empty, true, true).done()).0,
            b"0\r\n\r\n",
            "the end only"
        );
    }

    /// A remote sink that goes before its response's end tells the relay (which stops a
    /// write that may never end); one that sent its end does not. The response's deadline
    /// reaches the relay through the same hand-off.
    #[test]
    fn a_remote_sink_dropped_before_its_end_tells_the_relay() {
        fn told(handoff: &Handoff) -> bool {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            std::pin::pin!(handoff.aborted.notified())
                .poll(&mut cx)
                .is_ready()
        }
        crate::testing::run_local(async {
            let headers: [(&str, &[u8]); 1] = [("content-type", b"application/json")];
            let handoff = Arc::new(Handoff::default());
            let (tx, _rx) = mpsc::channel(8);
            let mut sink = Sink::from_channel(tx, handoff.clone(), Answer::KEEP);
            assert_eq!(handoff.until(), None);
            let at = Instant::now() + Duration::from_secs(5);
            sink.bound_until(at);
            assert_eq!(handoff.until(), Some(at), "the deadline is passed on");
            assert!(sink.head(200, &headers).await.is_ok());
            drop(sink);
            assert!(told(&handoff), "dropped halfway: told");

            let handoff = relayed(true);
            let (tx, _rx) = mpsc::channel(8);
            let sink = Sink::from_channel(tx, handoff.clone(), Answer::KEEP);
            assert!(sink.respond(200, &headers, b"{}").await.is_ok());
            assert!(!told(&handoff), "ended: not told");
        });
    }

    /// The one bound on every write to an agent: a stream with no deadline of its own (a
    /// GET stream) still cannot write for longer than its sink's limit. A peer that
    /// stops reading loses the connection then, the write fails, and the cut is counted.
    #[test]
    fn a_write_without_a_deadline_ends_within_the_sink_limit() {
        use std::io::Read;
        crate::testing::run_local(async {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
            let addr = listener.local_addr().expect("addr");
            let conn = Conn::connect(addr, crate::runtime::Backend::Epoll)
                .await
                .expect("connect");
            // The peer never reads until the write was cut.
            let (mut peer, _) = listener.accept().expect("accept");
            let limit = Duration::from_millis(300);
            let mut sink = Sink::local(Rc::new(ConnShared::new(conn, limit)), Answer::KEEP);
            let headers: [(&str, &[u8]); 1] = [("content-type", b"text/event-stream")];
            assert!(sink.head(200, &headers).await.is_ok());
            let cuts = server_metrics::with(|m| m.write_deadline_cuts);
            let started = Instant::now();
            // Far more than the two sockets' buffers hold.
            let event = vec![b'x'; 64 * 1024 * 1024];
            let cut = tokio::time::timeout(Duration::from_secs(20), sink.body(&event)).await;
            assert_eq!(cut, Ok(Err(Gone)), "the write was cut");
            let took = started.elapsed();
            assert!(took >= limit, "not before the limit: {took:?}");
            assert!(took < Duration::from_secs(10), "at the limit: {took:?}");
            assert_eq!(server_metrics::with(|m| m.write_deadline_cuts), cuts + 1);
            drop(sink);
            assert_eq!(write_limit(Duration::from_millis(100)), WRITE_LIMIT_MIN);
            assert_eq!(
                write_limit(Duration::from_secs(300)),
                Duration::from_secs(300)
            );
            // The peer sees the connection's end (EOF or a reset, not a read that times
            // out) after part of the body.
            peer.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
            let mut got = Vec::new();
            let read = peer.read_to_end(&mut got);
            assert!(
                !read.as_ref().is_err_and(|e| matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )),
                "the connection ended: {read:?}"
            );
            assert!(
                got.len() < event.len(),
                "cut off: {} of {} bytes",
                got.len(),
                event.len()
            );
        });
    }
}
