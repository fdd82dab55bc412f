//! One fixture connection: read requests with mcpyard's `RequestDecoder`, route them, and
//! write the replies (JSON, SSE with progress and delays, or a held-open GET stream).
//!
//! Requests on a connection are answered in order, one at a time; pipelined requests wait
//! in the read buffer. Replies are staged in one reused buffer; a large pre-rendered
//! payload is not copied but written from its shared `Bytes` with a vectored write.
//!
//! A reply's delay starts when its request arrived (`--delay-from arrival`, the default):
//! with a delay configured, the socket stamps what it receives (`SO_TIMESTAMPNS`) and the
//! stamp of the read that completed the request is the start, so the time this worker took
//! to wake up and read it is part of the delay rather than added to it. A pipelined
//! request starts when the reply before it was written. `--delay-from read` starts at the
//! read instead.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use mcpyard::http::{
    BodyFraming, RequestDecoder, RequestEvent, RequestHead, encode_chunk, encode_error_response,
    encode_last_chunk, encode_response_head,
};
use mcpyard::jsonrpc::{write_error, write_notification, write_result_prefix};
use mcpyard::sse::encode_comment;
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};
use tokio::net::TcpStream;

use super::route::{Message, ProgressPlan, Reply, route};
use super::state::Shared;
use crate::args::DelayFrom;
use crate::arrival::arrival;
use crate::limits::{
    FIXTURE_COPY_BYTES_MAX, FIXTURE_KEEPALIVE, READ_CHUNK_BYTES, REQUEST_BYTES_MAX,
};
use crate::sys::{enable_receive_timestamps, recv_stamped_buf, sleep_until_precise};
use crate::tls::Layer;

/// `{"jsonrpc":"2.0","id":` `,"result":` `}` around an id and a result.
const RESULT_FRAME_BYTES: usize = r#"{"jsonrpc":"2.0","id":,"result":}"#.len();

/// One request, complete.
struct Request {
    head: RequestHead,
    body: Bytes,
}

/// The socket, plain or with TLS: everything written goes through [`Wire::send`].
pub struct Wire {
    stream: TcpStream,
    /// The TLS session (`--tls-cert`); the handshake runs as its records arrive.
    tls: Option<Box<Layer>>,
    /// Raw records read, before TLS opens them.
    raw: BytesMut,
    /// Records sealed, before they are written.
    sealed: Vec<u8>,
}

impl Wire {
    /// Writes `bytes` whole (sealed first on TLS).
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self.tls.as_deref_mut() {
            None => self.stream.write_all(bytes).await,
            Some(layer) => {
                layer.seal(bytes, &mut self.sealed)?;
                self.flush_sealed().await
            }
        }
    }

    /// Writes the segments of `buf` whole (one vectored write where plain).
    async fn send_buf(&mut self, buf: &mut impl Buf) -> io::Result<()> {
        let Some(layer) = self.tls.as_deref_mut() else {
            return self.stream.write_all_buf(buf).await;
        };
        while buf.has_remaining() {
            let chunk = buf.chunk();
            layer.seal(chunk, &mut self.sealed)?;
            let n = chunk.len();
            buf.advance(n);
        }
        self.flush_sealed().await
    }

    async fn flush_sealed(&mut self) -> io::Result<()> {
        let written = self.stream.write_all(&self.sealed).await;
        self.sealed.clear();
        written
    }
}

/// A connection and its buffers.
pub struct Connection {
    wire: Wire,
    shared: Arc<Shared>,
    decoder: RequestDecoder,
    read: BytesMut,
    out: BytesMut,
    /// True if the socket stamps what it receives (see the module comment).
    stamped: bool,
    /// When the bytes of the latest read arrived (stamped) or were read.
    arrived: Instant,
    /// When the latest reply was written (the connection was accepted, at first).
    free_since: Instant,
}

impl Connection {
    /// Wraps an accepted stream; with `tls` it speaks TLS (handshake first).
    pub fn new(stream: TcpStream, shared: Arc<Shared>, tls: Option<Layer>) -> Connection {
        let args = &shared.args;
        let delays = !args.delay.is_zero() || !args.progress_interval.is_zero();
        // Stamps cost a clock read per segment: only when a delay uses them.
        let stamped = delays
            && args.delay_from == DelayFrom::Arrival
            && enable_receive_timestamps(stream.as_raw_fd()).is_ok();
        let now = Instant::now();
        Connection {
            wire: Wire {
                stream,
                tls: tls.map(Box::new),
                raw: BytesMut::new(),
                sealed: Vec::new(),
            },
            shared,
            stamped,
            arrived: now,
            free_since: now,
            decoder: RequestDecoder::new(REQUEST_BYTES_MAX),
            read: BytesMut::with_capacity(READ_CHUNK_BYTES),
            out: BytesMut::with_capacity(READ_CHUNK_BYTES),
        }
    }

    /// Serves requests until the peer closes, asks to close, or errs.
    pub async fn serve(mut self) {
        let _ = self.wire.stream.set_nodelay(true);
        loop {
            let request = match self.read_request().await {
                Ok(Some(request)) => request,
                Ok(None) | Err(_) => return,
            };
            let keep_alive = request.head.keep_alive();
            let start = reply_start(self.arrived, self.free_since);
            let reply = route(&self.shared, &request.head, &request.body);
            let written = match reply {
                Reply::Stream => {
                    self.serve_stream().await;
                    return;
                }
                Reply::Message {
                    status,
                    session,
                    message,
                    delay,
                    progress,
                    sse,
                } if sse || progress.is_some() => {
                    let session = session.as_deref();
                    self.write_sse(status, session, &message, start, delay, progress.as_ref())
                        .await
                }
                Reply::Message {
                    status,
                    session,
                    message,
                    delay,
                    ..
                } => {
                    if !delay.is_zero() {
                        sleep_until_precise(after(start, delay)).await;
                    }
                    self.write_json(status, session.as_deref(), &message).await
                }
                other => self.write_simple(&other).await,
            };
            if written.is_err() || !keep_alive {
                return;
            }
            self.free_since = Instant::now();
        }
    }

    /// Reads one whole request; `Ok(None)` when the peer closed between requests. A
    /// malformed request is answered with its canned error and ends the connection.
    async fn read_request(&mut self) -> io::Result<Option<Request>> {
        let mut head = None;
        let mut body = BytesMut::new();
        let mut first_data = None;
        loop {
            match self.decoder.decode(&mut self.read) {
                Ok(Some(RequestEvent::Head(h))) => {
                    if h.expects_continue() {
                        self.wire.send(b"HTTP/1.1 100 Continue\r\n\r\n").await?;
                    }
                    head = Some(h);
                }
                // Most bodies arrive in one piece: keep it without copying.
                Ok(Some(RequestEvent::Data(d))) => match first_data.take() {
                    None if body.is_empty() => first_data = Some(d),
                    earlier => {
                        if let Some(earlier) = earlier {
                            body.extend_from_slice(&earlier);
                        }
                        body.extend_from_slice(&d);
                    }
                },
                Ok(Some(RequestEvent::End)) => {
                    let Some(head) = head.take() else {
                        return Err(io::Error::other("request ended before its head"));
                    };
                    let body = match first_data {
                        Some(d) => d,
                        None => body.freeze(),
                    };
                    return Ok(Some(Request { head, body }));
                }
                Ok(None) => {
                    if self.receive().await? == 0 {
                        return Ok(None);
                    }
                }
                Err(err) => {
                    self.out.clear();
                    encode_error_response(&err, &mut self.out);
                    self.wire.send(&self.out).await?;
                    return Ok(None);
                }
            }
        }
    }

    /// Reads what the socket has into `self.read` and notes when it arrived; returns the
    /// byte count (0 when the peer closed). On TLS the count is of plaintext: reads that
    /// bring only handshake records (answered here) or tickets are read past.
    async fn receive(&mut self) -> io::Result<usize> {
        let fd = self.wire.stream.as_raw_fd();
        let (n, stamp) = loop {
            let wire = &mut self.wire;
            let into = if wire.tls.is_some() {
                &mut wire.raw
            } else {
                &mut self.read
            };
            let (n, stamp) = wire
                .stream
                .async_io(Interest::READABLE, || {
                    recv_stamped_buf(fd, into, READ_CHUNK_BYTES)
                })
                .await?;
            let Some(layer) = wire.tls.as_deref_mut() else {
                break (n, stamp);
            };
            if n == 0 {
                break (0, stamp);
            }
            let opened = layer.received(&wire.raw, &mut self.read, &mut wire.sealed);
            wire.raw.clear();
            let closed = layer.peer_closed();
            if !wire.sealed.is_empty() {
                wire.flush_sealed().await?;
            }
            let opened = opened?;
            if opened > 0 || closed {
                break (opened, stamp);
            }
        };
        // The wall clock first, then the monotonic one (see `arrival.rs`).
        let real_at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let read_at = Instant::now();
        self.arrived = match stamp {
            Some(stamp) if self.stamped => {
                arrival(read_at, real_at, stamp, self.free_since).unwrap_or(read_at)
            }
            _ => read_at,
        };
        Ok(n)
    }

    async fn flush_out(&mut self) -> io::Result<()> {
        self.wire.send(&self.out).await?;
        self.out.clear();
        Ok(())
    }

    async fn write_simple(&mut self, reply: &Reply) -> io::Result<()> {
        self.out.clear();
        match reply {
            Reply::Accepted => {
                encode_response_head(202, &[], BodyFraming::Length(0), &mut self.out)
                    .map_err(io::Error::other)?;
            }
            Reply::Empty(status) => {
                encode_response_head(*status, &[], BodyFraming::Length(0), &mut self.out)
                    .map_err(io::Error::other)?;
            }
            Reply::Text(status, text) => {
                let headers: [(&str, &[u8]); 1] = [("content-type", b"text/plain")];
                let length = BodyFraming::Length(text.len() as u64 + 1);
                encode_response_head(*status, &headers, length, &mut self.out)
                    .map_err(io::Error::other)?;
                self.out.put_slice(text.as_bytes());
                self.out.put_u8(b'\n');
            }
            Reply::Triggered(streams) => {
                let body = format!("{{\"streams\":{streams}}}");
                let headers: [(&str, &[u8]); 1] = [("content-type", b"application/json")];
                let length = BodyFraming::Length(body.len() as u64);
                encode_response_head(200, &headers, length, &mut self.out)
                    .map_err(io::Error::other)?;
                self.out.put_slice(body.as_bytes());
            }
            Reply::Message { .. } | Reply::Stream => {
                return Err(io::Error::other("not a simple reply"));
            }
        }
        self.flush_out().await
    }

    /// Writes a JSON reply; a large result is sent from its shared buffer, not copied.
    async fn write_json(
        &mut self,
        status: u16,
        session: Option<&str>,
        message: &Message,
    ) -> io::Result<()> {
        self.out.clear();
        let all: [(&str, &[u8]); 2] = [
            ("content-type", b"application/json"),
            ("mcp-session-id", session.unwrap_or_default().as_bytes()),
        ];
        let headers = all
            .get(..1 + usize::from(session.is_some()))
            .unwrap_or_default();
        let Message::Result { id, result } = message else {
            let mut body = BytesMut::new();
            put_message(message, &mut body);
            encode_response_head(
                status,
                headers,
                BodyFraming::Length(body.len() as u64),
                &mut self.out,
            )
            .map_err(io::Error::other)?;
            self.out.put_slice(&body);
            return self.flush_out().await;
        };
        let length = RESULT_FRAME_BYTES + id.len() + result.len();
        encode_response_head(
            status,
            headers,
            BodyFraming::Length(length as u64),
            &mut self.out,
        )
        .map_err(io::Error::other)?;
        write_result_prefix(id, &mut self.out);
        if result.len() < FIXTURE_COPY_BYTES_MAX {
            self.out.put_slice(result);
            self.out.put_u8(b'}');
            return self.flush_out().await;
        }
        let head = self.out.split().freeze();
        let mut segments = head.chain(result.clone()).chain(&b"}"[..]);
        self.wire.send_buf(&mut segments).await
    }

    /// Writes a chunked `text/event-stream` reply: progress event `i` at `start + i *
    /// interval`, the result `delay` after the last one.
    async fn write_sse(
        &mut self,
        status: u16,
        session: Option<&str>,
        message: &Message,
        start: Instant,
        delay: Duration,
        progress: Option<&ProgressPlan>,
    ) -> io::Result<()> {
        self.out.clear();
        let all: [(&str, &[u8]); 3] = [
            ("content-type", b"text/event-stream"),
            ("cache-control", b"no-cache"),
            ("mcp-session-id", session.unwrap_or_default().as_bytes()),
        ];
        let headers = all
            .get(..2 + usize::from(session.is_some()))
            .unwrap_or_default();
        encode_response_head(status, headers, BodyFraming::Chunked, &mut self.out)
            .map_err(io::Error::other)?;
        let mut last = start;
        if let Some(plan) = progress {
            for i in 1..=plan.count {
                if !plan.interval.is_zero() {
                    self.flush_out().await?;
                    last = after(start, plan.interval.saturating_mul(i));
                    sleep_until_precise(last).await;
                }
                let params = format!(
                    r#"{{"progressToken":{},"progress":{i},"total":{}}}"#,
                    plan.token, plan.count
                );
                let mut data = BytesMut::new();
                write_notification("notifications/progress", Some(params.as_bytes()), &mut data);
                put_event_chunk(&data, &mut self.out);
            }
        }
        if !delay.is_zero() {
            self.flush_out().await?;
            sleep_until_precise(after(last, delay)).await;
        }
        let mut data = BytesMut::new();
        put_message(message, &mut data);
        put_event_chunk(&data, &mut self.out);
        encode_last_chunk(&mut self.out);
        self.flush_out().await
    }

    /// Holds the session's GET stream open: list_changed events when triggered, a comment
    /// every `FIXTURE_KEEPALIVE`, until the peer closes or a write fails.
    async fn serve_stream(&mut self) {
        let mut changes = self.shared.list_changed.subscribe();
        self.out.clear();
        let headers: [(&str, &[u8]); 2] = [
            ("content-type", b"text/event-stream"),
            ("cache-control", b"no-cache"),
        ];
        if encode_response_head(200, &headers, BodyFraming::Chunked, &mut self.out).is_err()
            || self.flush_out().await.is_err()
        {
            return;
        }
        let _open = StreamCount::open(&self.shared);
        let mut keepalive = tokio::time::interval(FIXTURE_KEEPALIVE);
        keepalive.tick().await; // the first tick is immediate
        let mut scratch = [0u8; 256];
        loop {
            // Readiness-based tokio I/O: dropping the losing read future loses no bytes.
            let chunk = tokio::select! {
                changed = changes.changed() => match changed {
                    Ok(()) => self.shared.rendered.list_changed_chunk.clone(),
                    Err(_) => return,
                },
                _ = keepalive.tick() => {
                    let mut comment = BytesMut::new();
                    encode_comment("", &mut comment);
                    let mut chunk = BytesMut::new();
                    encode_chunk(&comment, &mut chunk);
                    chunk.freeze()
                }
                // Raw bytes, TLS records too: nothing is expected on a GET stream.
                read = self.wire.stream.read(&mut scratch) => match read {
                    Ok(0) | Err(_) => return,
                    Ok(_) => continue, // nothing is expected on a GET stream; ignore it
                },
            };
            if self.wire.send(&chunk).await.is_err() {
                return;
            }
        }
    }
}

/// When the reply to a request starts: when its bytes arrived, but not before the
/// connection was free (a pipelined request waits for the reply before it).
fn reply_start(arrived: Instant, free_since: Instant) -> Instant {
    arrived.max(free_since)
}

/// `start + delay`, or `start` if that is past what an `Instant` can hold.
fn after(start: Instant, delay: Duration) -> Instant {
    start.checked_add(delay).unwrap_or(start)
}

/// Counts an open GET stream for as long as it lives.
struct StreamCount<'a>(&'a Shared);

impl<'a> StreamCount<'a> {
    fn open(shared: &'a Shared) -> StreamCount<'a> {
        shared.streams.fetch_add(1, Ordering::Relaxed);
        StreamCount(shared)
    }
}

impl Drop for StreamCount<'_> {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Appends a JSON-RPC message body.
fn put_message(message: &Message, out: &mut BytesMut) {
    match message {
        Message::Result { id, result } => {
            write_result_prefix(id, out);
            out.put_slice(result);
            out.put_u8(b'}');
        }
        Message::Error { id, code, message } => {
            write_error(id.as_deref(), *code, message, None, out)
        }
    }
}

/// Appends `data: <json>\n\n` as one chunk. JSON written by mcpyard's writers has no
/// newlines, so one `data:` line carries it.
fn put_event_chunk(json: &[u8], out: &mut BytesMut) {
    let mut event = BytesMut::with_capacity(json.len() + 8);
    event.put_slice(b"data: ");
    event.put_slice(json);
    event.put_slice(b"\n\n");
    encode_chunk(&event, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_starts_at_arrival_unless_the_connection_was_busy() {
        let accepted = Instant::now();
        let arrived = accepted + Duration::from_micros(300);
        // The usual case: the request arrived after the previous reply was written.
        assert_eq!(reply_start(arrived, accepted), arrived);
        // Pipelined: it arrived with the one before, so it starts when that was answered.
        let answered = arrived + Duration::from_millis(1);
        assert_eq!(reply_start(arrived, answered), answered);
    }

    #[test]
    fn after_adds_the_delay() {
        let start = Instant::now();
        assert_eq!(
            after(start, Duration::from_millis(1)),
            start + Duration::from_millis(1)
        );
        assert_eq!(after(start, Duration::ZERO), start);
    }
}
