//! The generator's HTTP/1.1 client: request encoding and response collection (sans-IO, with
//! mcpyard's own codecs) and a blocking keep-alive connection for the `run` threads.
//!
//! A [`Collector`] turns response bytes into one [`Response`] with its whole body; the
//! blocking [`Conn`] and the async clients in `streams.rs` both feed it. Every way the
//! target can misbehave becomes a [`Failure`] of the right kind.

use std::cell::Cell;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant, SystemTime};

use bytes::{Bytes, BytesMut};
use mcpyard::http::{BodyFraming, ResponseDecoder, ResponseEvent, encode_request_head};
use mcpyard::jsonrpc::{Kind, parse_envelope};
use mcpyard::sse::Decoder as SseDecoder;

use crate::args::{ReceiveTime, Target};
use crate::arrival::arrival;
use crate::limits::{
    ARM_SLACK_DIVISOR, ARM_SLACK_MIN, IDLE_CLOSE_WINDOW, READ_CHUNK_BYTES, RESPONSE_BYTES_MAX,
    SSE_END_GRACE,
};
use crate::record::{ErrorKind, Failure};
use crate::tls::{ClientTls, Layer};

/// The protocol version the generator speaks.
pub const PROTOCOL_VERSION: &str = "2025-11-25";

/// What kind of body a response carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    /// `application/json`.
    Json,
    /// `text/event-stream`.
    EventStream,
    /// Anything else, or no content type.
    Other,
}

/// One complete response.
#[derive(Clone, Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body's media type.
    pub kind: BodyKind,
    /// The `mcp-session-id` header, if any.
    pub session: Option<String>,
    /// True if the connection can carry another request.
    pub keep_alive: bool,
    /// The whole body.
    pub body: Bytes,
    /// When its last bytes arrived, by the kernel's receive timestamp (blocking [`Conn`]
    /// with `--receive-time kernel` only).
    pub arrived: Option<Instant>,
}

/// Classifies a `content-type` value by its media type (parameters ignored).
pub fn body_kind(content_type: Option<&[u8]>) -> BodyKind {
    let Some(value) = content_type else {
        return BodyKind::Other;
    };
    let media = value.split(|b| *b == b';').next().unwrap_or_default();
    let media = media.trim_ascii();
    if media.eq_ignore_ascii_case(b"application/json") {
        BodyKind::Json
    } else if media.eq_ignore_ascii_case(b"text/event-stream") {
        BodyKind::EventStream
    } else {
        BodyKind::Other
    }
}

/// Appends one request to `out`: method, target, host, the MCP headers and the body.
///
/// `session` adds `mcp-session-id`; `initialized` (every request after initialize) adds
/// `mcp-protocol-version`, which MCP (Streamable HTTP, 2025-06-18 on) requires on all of
/// them, with a session id or without. A POST gets the JSON content type and the two-type
/// `accept` MCP requires, a GET asks for an event stream.
///
/// `Err` (a decode failure: nothing written) when the session id the gateway gave would
/// break the head (a control byte).
pub fn encode_request(
    method: &str,
    target: &Target,
    session: Option<&str>,
    initialized: bool,
    body: &[u8],
    out: &mut BytesMut,
) -> Result<(), Failure> {
    let accept: &[u8] = if method == "GET" {
        b"text/event-stream"
    } else {
        b"application/json, text/event-stream"
    };
    let mut headers: Vec<(&str, &[u8])> =
        vec![("host", target.authority.as_bytes()), ("accept", accept)];
    if method == "POST" {
        headers.push(("content-type", b"application/json"));
    }
    if let Some(session) = session {
        headers.push(("mcp-session-id", session.as_bytes()));
    }
    if initialized {
        headers.push(("mcp-protocol-version", PROTOCOL_VERSION.as_bytes()));
    }
    for (name, value) in &target.headers {
        headers.push((name, value.as_bytes()));
    }
    let framing = if method == "POST" {
        BodyFraming::Length(body.len() as u64)
    } else {
        BodyFraming::None
    };
    encode_request_head(method, &target.path, &headers, framing, out)
        .map_err(|e| Failure::new(ErrorKind::Decode, format!("request not sent: {e}")))?;
    out.extend_from_slice(body);
    Ok(())
}

/// Collects one response from bytes as they arrive.
#[derive(Debug)]
pub struct Collector {
    decoder: ResponseDecoder,
    head: Option<(u16, BodyKind, Option<String>, bool)>,
    /// An event-stream body's messages as they arrive (a copy of its bytes in `sse_buf`),
    /// to see the JSON-RPC response before the stream ends: MCP lets a server keep the
    /// stream open after it. `None` for other bodies, or once the stream would not decode
    /// (the end of the body then decides, and the check after it reports the fault).
    sse: Option<SseDecoder>,
    sse_buf: BytesMut,
    /// True once an event carrying a JSON-RPC response (or error) has arrived.
    answered: bool,
    /// The first body piece, kept without copying: most bodies arrive in one.
    first: Option<Bytes>,
    /// The body so far once a second piece arrived.
    body: BytesMut,
}

impl Default for Collector {
    fn default() -> Self {
        Collector::new()
    }
}

impl Collector {
    /// Creates a collector for one response.
    pub fn new() -> Collector {
        Collector {
            decoder: ResponseDecoder::new(RESPONSE_BYTES_MAX),
            head: None,
            sse: None,
            sse_buf: BytesMut::new(),
            answered: false,
            first: None,
            body: BytesMut::new(),
        }
    }

    /// True once an event-stream body has carried a JSON-RPC response: the exchange's
    /// answer is in, whether or not the server ends the stream.
    pub fn answered(&self) -> bool {
        self.answered
    }

    /// Finishes an answered event stream the server has not ended (see
    /// [`Collector::answered`]): the body so far, and a connection that cannot carry
    /// another request (the stream is still open on it).
    pub fn finish_unended(&mut self) -> Result<Response, Failure> {
        let mut response = self.finish()?;
        response.keep_alive = false;
        Ok(response)
    }

    /// Watches an event-stream body piece for the JSON-RPC response.
    fn watch_sse(&mut self, data: &[u8]) {
        let Some(decoder) = &mut self.sse else {
            return;
        };
        self.sse_buf.extend_from_slice(data);
        loop {
            match decoder.decode(&mut self.sse_buf) {
                Ok(Some(message)) => {
                    let Some(data) = message.data else { continue };
                    let kind = parse_envelope(&data).map(|e| e.kind);
                    if matches!(kind, Ok(Kind::Response | Kind::ErrorResponse)) {
                        self.answered = true;
                        self.sse = None;
                        return;
                    }
                }
                Ok(None) => return,
                Err(_) => {
                    self.sse = None;
                    return;
                }
            }
        }
    }

    /// Consumes what it can from `buf`; `Ok(Some(response))` once the response is complete,
    /// `Ok(None)` when more bytes are needed.
    pub fn feed(&mut self, buf: &mut BytesMut) -> Result<Option<Response>, Failure> {
        loop {
            let event = self
                .decoder
                .decode(buf, false)
                .map_err(|e| Failure::new(ErrorKind::Decode, format!("bad http response: {e}")))?;
            match event {
                None => return Ok(None),
                Some(ResponseEvent::Head(head)) => {
                    let kind = body_kind(head.headers.get("content-type"));
                    let session = head
                        .headers
                        .get("mcp-session-id")
                        .map(|v| String::from_utf8_lossy(v).into_owned());
                    if kind == BodyKind::EventStream {
                        self.sse = Some(SseDecoder::new());
                    }
                    self.head = Some((head.status, kind, session, head.keep_alive()));
                }
                Some(ResponseEvent::Data(data)) => {
                    self.watch_sse(&data);
                    self.on_data(data);
                }
                Some(ResponseEvent::End) => return Ok(Some(self.finish()?)),
            }
        }
    }

    /// Finishes a response whose body ran until the peer closed (RFC 9112 §6.3 (8)).
    pub fn feed_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Response>, Failure> {
        loop {
            let event = self
                .decoder
                .decode_eof(buf)
                .map_err(|e| Failure::new(ErrorKind::Io, format!("closed mid-response: {e}")))?;
            match event {
                None => return Ok(None),
                Some(ResponseEvent::Head(_)) => {}
                Some(ResponseEvent::Data(data)) => self.on_data(data),
                Some(ResponseEvent::End) => return Ok(Some(self.finish()?)),
            }
        }
    }

    fn on_data(&mut self, data: Bytes) {
        if self.first.is_none() && self.body.is_empty() {
            self.first = Some(data);
            return;
        }
        if let Some(first) = self.first.take() {
            self.body.extend_from_slice(&first);
        }
        self.body.extend_from_slice(&data);
    }

    fn finish(&mut self) -> Result<Response, Failure> {
        let (status, kind, session, keep_alive) = self
            .head
            .take()
            .ok_or_else(|| Failure::new(ErrorKind::Decode, "response ended before its head"))?;
        Ok(Response {
            status,
            kind,
            session,
            keep_alive,
            body: match self.first.take() {
                Some(first) => first,
                None => std::mem::take(&mut self.body).freeze(),
            },
            arrived: None,
        })
    }
}

/// Maps a socket error to the failure kind it counts as.
pub fn io_failure(err: &io::Error, doing: &str) -> Failure {
    let kind = match err.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => ErrorKind::Timeout,
        _ => ErrorKind::Io,
    };
    Failure::new(kind, format!("{doing}: {err}"))
}

/// Why [`Conn::send`] returned no response.
#[derive(Debug)]
pub enum SendFailure {
    /// The connection had carried an exchange before and the target had closed it while
    /// it sat idle: the close (or reset) came before any byte of the answer. HTTP lets a
    /// server close an idle persistent connection at any time (RFC 9112 §9.6), so this is
    /// no error of the target: reconnect and send once more.
    IdleClosed(Failure),
    /// Anything else: the exchange failed.
    Failed(Failure),
}

impl SendFailure {
    /// The failure to count when no retry is made.
    pub fn into_failure(self) -> Failure {
        match self {
            SendFailure::IdleClosed(f) | SendFailure::Failed(f) => f,
        }
    }
}

impl From<Failure> for SendFailure {
    fn from(failure: Failure) -> SendFailure {
        SendFailure::Failed(failure)
    }
}

/// True for the socket errors a peer's close produces on a write or read.
fn is_peer_close(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    )
}

/// The failure of an exchange that did not complete by its deadline.
fn deadline_failure(timeout: Duration) -> Failure {
    Failure::new(
        ErrorKind::Timeout,
        format!("no complete response within {timeout:?} of the send"),
    )
}

/// Resolves `target`'s host to the address every connection of a run goes to: once, so a
/// run's reconnects measure the target, not the resolver, and all go to the same place.
pub fn resolve(target: &Target) -> Result<SocketAddr, Failure> {
    target
        .authority
        .to_socket_addrs()
        .map_err(|e| connect_failure(target, &e))?
        .next()
        .ok_or_else(|| connect_failure(target, &"no address"))
}

/// A `Connect` failure for `target`: resolving it, connecting or its TLS handshake.
fn connect_failure(target: &Target, e: &dyn std::fmt::Display) -> Failure {
    Failure::new(ErrorKind::Connect, format!("{}: {e}", target.authority))
}

/// A blocking keep-alive connection, plain or TLS, whose exchanges each have a deadline.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    /// How long one exchange may take, from the send to the response's last byte.
    timeout: Duration,
    /// Exchanges this connection has completed: past the first, it may have been closed
    /// by the target while idle.
    exchanges: u64,
    /// The TLS session of an https target; its records pass through `scratch` (reads) and
    /// `sealed` (writes), and `read` holds plaintext only.
    tls: Option<Box<Layer>>,
    sealed: Vec<u8>,
    /// True if the socket stamps what it receives (`--receive-time kernel` and the kernel
    /// agreed).
    stamped: bool,
    read: BytesMut,
    write: BytesMut,
    /// Where each socket read lands before it is appended to `read`.
    scratch: Box<[u8]>,
    /// The socket's read and write timeouts as last set (see [`Conn::arm`]).
    armed: Cell<(Duration, Duration)>,
    /// The deadline of the exchange (or handshake) under way: every write is bounded by it.
    deadline: Cell<Instant>,
}

impl Conn {
    /// Connects to `target` at `addr` (resolved once per run, see [`resolve`]) within
    /// `timeout`; a refused or unreachable target is a
    /// `Connect` failure. With `ReceiveTime::Kernel` the socket stamps what it receives
    /// (if the kernel refuses, responses are timed when read). With `tls` the TLS
    /// handshake runs here, within `timeout` in all; a refused handshake is a `Connect`
    /// failure too. Each later exchange gets `timeout` from its send to its end.
    pub fn open(
        target: &Target,
        addr: SocketAddr,
        timeout: Duration,
        receive_time: ReceiveTime,
        tls: Option<&ClientTls>,
    ) -> Result<Conn, Failure> {
        let failed = |e: &dyn std::fmt::Display| connect_failure(target, e);
        let stream = TcpStream::connect_timeout(&addr, timeout).map_err(|e| failed(&e))?;
        stream.set_nodelay(true).map_err(|e| failed(&e))?;
        stream
            .set_read_timeout(Some(timeout))
            .map_err(|e| failed(&e))?;
        stream
            .set_write_timeout(Some(timeout))
            .map_err(|e| failed(&e))?;
        let stamped = receive_time == ReceiveTime::Kernel
            && crate::sys::enable_receive_timestamps(stream.as_raw_fd()).is_ok();
        let mut conn = Conn {
            stream,
            timeout,
            exchanges: 0,
            tls: None,
            sealed: Vec::new(),
            stamped,
            read: BytesMut::with_capacity(READ_CHUNK_BYTES),
            write: BytesMut::with_capacity(READ_CHUNK_BYTES),
            scratch: vec![0; READ_CHUNK_BYTES].into_boxed_slice(),
            armed: Cell::new((timeout, timeout)),
            deadline: Cell::new(Instant::now() + timeout),
        };
        if let Some(tls) = tls {
            let layer = tls.session().map_err(|e| failed(&e))?;
            conn.tls = Some(Box::new(layer));
            let deadline = Instant::now() + timeout;
            conn.handshake(deadline)
                .map_err(|f| failed(&format!("TLS handshake: {f}")))?;
        }
        Ok(conn)
    }

    /// Runs the TLS handshake to its end by `deadline`: flights out, answers in.
    fn handshake(&mut self, deadline: Instant) -> Result<(), Failure> {
        self.deadline.set(deadline);
        loop {
            let Some(layer) = self.tls.as_deref_mut() else {
                return Ok(());
            };
            layer
                .pending(&mut self.sealed)
                .map_err(|e| io_failure(&e, "TLS"))?;
            let handshaking = layer.is_handshaking();
            self.flush_sealed()?;
            if !handshaking {
                return Ok(());
            }
            self.arm_read(deadline)?;
            let (n, _) = crate::sys::recv_stamped(self.stream.as_raw_fd(), &mut self.scratch)
                .map_err(|e| io_failure(&e, "read"))?;
            if n == 0 {
                return Err(Failure::new(
                    ErrorKind::Io,
                    "the target closed the connection in the TLS handshake",
                ));
            }
            self.take_raw(n)?;
        }
    }

    /// What is left until `deadline`, or the timeout failure if nothing is.
    ///
    /// Each socket read and write is bounded by this, so a target that trickles its
    /// answer a byte at a time cannot stretch an exchange past its deadline (a per-read
    /// timeout alone would restart with every byte).
    fn left(&self, deadline: Instant) -> Result<Duration, Failure> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(deadline_failure(self.timeout));
        }
        Ok(left)
    }

    /// Bounds the next socket read by what is left until `deadline`.
    fn arm_read(&self, deadline: Instant) -> Result<(), Failure> {
        self.arm(deadline, true)
    }

    /// Writes all of `bytes` by the deadline of the exchange under way: the socket's
    /// write timeout is armed before each write (a target that takes a request a few
    /// bytes at a time must not get the whole timeout again for each part).
    fn write_by_deadline(&self, bytes: &[u8]) -> io::Result<()> {
        let mut rest = bytes;
        while !rest.is_empty() {
            if self.arm(self.deadline.get(), false).is_err() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            match (&self.stream).write(rest) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => rest = rest.get(n..).unwrap_or_default(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Sets the socket's read (or write) timeout to what is left until `deadline`, give
    /// or take a slack of a sixteenth of the timeout: the system call is made only when
    /// the timeout set would end a wait early or late by more than that. A generator
    /// that set it at every read and write would pay two system calls per request for
    /// nothing while its target answers in time; this way it pays them only while an
    /// answer is slow, and a wait overruns its deadline by at most the slack.
    fn arm(&self, deadline: Instant, read: bool) -> Result<(), Failure> {
        let left = self.left(deadline)?;
        // A short wait (an event stream's grace after its answer) gets a slack of its size.
        let slack = (self.timeout / ARM_SLACK_DIVISOR)
            .min(left / 4)
            .max(ARM_SLACK_MIN);
        let (read_set, write_set) = self.armed.get();
        let set = if read { read_set } else { write_set };
        if set >= left && set <= left + slack {
            return Ok(());
        }
        let want = left + slack / 2;
        let done = if read {
            self.stream.set_read_timeout(Some(want))
        } else {
            self.stream.set_write_timeout(Some(want))
        };
        done.map_err(|e| io_failure(&e, "socket timeout"))?;
        self.armed.set(if read {
            (want, write_set)
        } else {
            (read_set, want)
        });
        Ok(())
    }

    /// Writes the sealed records waiting in `self.sealed`.
    fn flush_sealed(&mut self) -> Result<(), Failure> {
        if !self.sealed.is_empty() {
            let written = self.write_by_deadline(&self.sealed);
            self.sealed.clear();
            written.map_err(|e| io_failure(&e, "write"))?;
        }
        Ok(())
    }

    /// Hands the `n` bytes a read left in `scratch` on: to `read` as they are, or through
    /// TLS (plaintext to `read`, answers such as alerts written at once).
    fn take_raw(&mut self, n: usize) -> Result<(), Failure> {
        let raw = self.scratch.get(..n).unwrap_or_default();
        match self.tls.as_deref_mut() {
            None => self.read.extend_from_slice(raw),
            Some(layer) => {
                let result = layer.received(raw, &mut self.read, &mut self.sealed);
                let flushed = self.flush_sealed();
                result.map_err(|e| Failure::new(ErrorKind::Io, format!("TLS: {e}")))?;
                flushed?;
            }
        }
        Ok(())
    }

    /// Sets the deadline of the exchanges still to come.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Ends the connection politely: close_notify on TLS (best effort), then the socket
    /// closes when `self` drops.
    pub fn close(mut self) {
        if let Some(layer) = self.tls.as_deref_mut()
            && layer.close(&mut self.sealed).is_ok()
        {
            self.deadline.set(Instant::now() + self.timeout);
            let _ = self.flush_sealed();
        }
    }

    /// Sends one request and reads its whole response by `timeout` after the send;
    /// `Response::arrived` is the kernel's receive time of the read that completed it, if
    /// the socket is stamped.
    ///
    /// A deadline passed is a `Timeout` failure (the caller drops the connection: the
    /// answer may still be on its way). A reused connection found closed before any byte
    /// of the answer, within [`IDLE_CLOSE_WINDOW`] of the send, is
    /// [`SendFailure::IdleClosed`].
    pub fn send(
        &mut self,
        method: &str,
        target: &Target,
        session: Option<&str>,
        initialized: bool,
        body: &[u8],
    ) -> Result<Response, SendFailure> {
        self.write.clear();
        encode_request(method, target, session, initialized, body, &mut self.write)?;
        let written = Instant::now();
        let deadline = written + self.timeout;
        let reused = self.exchanges > 0;
        // Bytes left over from an earlier answer would be part of this one.
        let mut answer_began = !self.read.is_empty();
        // A close that crossed the request on the wire (the target's idle timer fired as
        // it was sent) shows at once; one that comes later is the target failing the
        // request it took, and a failure.
        let idle_closed = |failure: Failure, answer_began: bool| {
            if reused && !answer_began && written.elapsed() <= IDLE_CLOSE_WINDOW {
                SendFailure::IdleClosed(failure)
            } else {
                SendFailure::Failed(failure)
            }
        };
        self.deadline.set(deadline);
        match self.write_request() {
            Ok(()) => {}
            Err(SendFailure::IdleClosed(failure)) => {
                return Err(idle_closed(failure, answer_began));
            }
            Err(failed) => return Err(failed),
        }
        let mut collector = Collector::new();
        let mut arrived = None;
        // When an event stream's JSON-RPC response arrived: the exchange ends there, and
        // the stream's own end is awaited only until `until`.
        let mut answered_at: Option<Instant> = None;
        let mut until = deadline;
        loop {
            if let Some(mut response) = collector.feed(&mut self.read)? {
                response.arrived = answered_at.or(arrived);
                self.exchanges += 1;
                return Ok(response);
            }
            if answered_at.is_none() && collector.answered() {
                answered_at = Some(arrived.unwrap_or_else(Instant::now));
                until = deadline.min(Instant::now() + SSE_END_GRACE);
            }
            let received = self
                .arm_read(until)
                .map_err(Received::Failed)
                .and_then(|()| self.receive_stamped(&written));
            let (n, read_arrived) = match received {
                Ok(got) => got,
                Err(_) if answered_at.is_some() => {
                    // The server keeps the stream open after the response; this
                    // connection cannot carry another request, and is dropped.
                    let mut response = collector.finish_unended()?;
                    response.arrived = answered_at;
                    return Ok(response);
                }
                Err(Received::Closed(failure)) => return Err(idle_closed(failure, answer_began)),
                Err(Received::Failed(failure)) => return Err(failure.into()),
            };
            arrived = read_arrived;
            // A TLS peer's close_notify is followed by the socket's end: n == 0 then.
            if n == 0 {
                return match self.at_end(&mut collector, answered_at.is_some()) {
                    Ok(mut response) => {
                        response.arrived = answered_at.or(arrived);
                        Ok(response)
                    }
                    Err(failure) => Err(idle_closed(failure, answer_began)),
                };
            }
            let before = self.read.len();
            self.take_raw(n)?;
            answer_began |= self.read.len() > before;
        }
    }

    /// The response when the target has closed the connection: one whose body ran to
    /// the close, or an event stream that had carried its answer (`answered`); anything
    /// else was cut off.
    fn at_end(&mut self, collector: &mut Collector, answered: bool) -> Result<Response, Failure> {
        match collector.feed_eof(&mut self.read) {
            Ok(Some(response)) => Ok(response),
            _ if answered => collector.finish_unended(),
            Ok(None) => Err(Failure::new(
                ErrorKind::Io,
                "the target closed the connection mid-response",
            )),
            Err(failure) => Err(failure),
        }
    }

    /// One socket read into `scratch`: the byte count and, if the socket stamps, when
    /// the bytes arrived on the monotonic clock (`sent`: the request's send, the earliest
    /// they can have).
    fn receive_stamped(&mut self, sent: &Instant) -> Result<(usize, Option<Instant>), Received> {
        let (n, stamp) = crate::sys::recv_stamped(self.stream.as_raw_fd(), &mut self.scratch)
            .map_err(|e| {
                if is_peer_close(&e) {
                    Received::Closed(io_failure(&e, "read"))
                } else if is_timeout(&e) {
                    Received::Failed(deadline_failure(self.timeout))
                } else {
                    Received::Failed(io_failure(&e, "read"))
                }
            })?;
        if !self.stamped {
            return Ok((n, None));
        }
        // The wall clock first, then the monotonic one: the age is then at most the few ns
        // between the two reads too long.
        let real_at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let read_at = Instant::now();
        Ok((
            n,
            stamp.and_then(|stamp| arrival(read_at, real_at, stamp, *sent)),
        ))
    }

    /// Writes the encoded request in `self.write`, through TLS if there is one. A write the
    /// peer's close refused is `IdleClosed` (whether it may be retried is the caller's
    /// call).
    fn write_request(&mut self) -> Result<(), SendFailure> {
        let written = match self.tls.as_deref_mut() {
            None => self.write_by_deadline(&self.write),
            Some(layer) => {
                layer
                    .seal(&self.write, &mut self.sealed)
                    .map_err(|e| io_failure(&e, "TLS"))?;
                let sealed = self.write_by_deadline(&self.sealed);
                self.sealed.clear();
                sealed
            }
        };
        match written {
            Ok(()) => Ok(()),
            Err(e) if is_peer_close(&e) => Err(SendFailure::IdleClosed(io_failure(&e, "write"))),
            Err(e) if is_timeout(&e) => Err(deadline_failure(self.timeout).into()),
            Err(e) => Err(io_failure(&e, "write").into()),
        }
    }
}

/// Why a socket read gave no bytes.
#[derive(Debug)]
enum Received {
    /// The peer closed or reset the connection.
    Closed(Failure),
    /// A timeout or another failure.
    Failed(Failure),
}

/// True for the errors a socket timeout produces.
fn is_timeout(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}
