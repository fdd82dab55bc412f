//! The request decoder: the server side reads agent requests with it.
//!
//! `RequestDecoder::decode` turns the bytes at the front of a connection's read buffer into
//! `Head`, then `Data`* and `End` events, one per call, and then starts over for the next
//! pipelined request. The head is parsed by httparse within `HEADER_BYTES_MAX`; the body is
//! delimited per RFC 9112 §6.3 and handed out zero-copy.

use std::mem::MaybeUninit;

use bytes::BytesMut;

use super::BodyFraming;
use super::body::{BodyDecoder, BodyStep};
use super::error::HttpError;
use super::framing::declared_framing;
use super::headers::{Field, Headers, locate_fields, offsets};
use super::scan::{HeadScan, strip_empty_lines};
use crate::limits::{HEADER_BYTES_MAX, HEADERS_PER_MESSAGE_MAX, REQUEST_TARGET_BYTES_MAX};

/// Decode steps per `decode` call. A call emits at most one event, and reaching one takes at
/// most a head, or a chunk end, a chunk-size line and chunk data, or trailers and the end.
pub(super) const DECODE_STEPS_MAX: usize = 8;

/// A request method (RFC 9110 §9).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// `GET`
    Get,
    /// `POST`
    Post,
    /// `DELETE`
    Delete,
    /// `PUT`
    Put,
    /// `PATCH`
    Patch,
    /// `HEAD`
    Head,
    /// `OPTIONS`
    Options,
    /// Any other syntactically valid method token (methods are case-sensitive).
    Other,
}

impl Method {
    fn from_token(token: &str) -> Method {
        match token {
            "GET" => Method::Get,
            "POST" => Method::Post,
            "DELETE" => Method::Delete,
            "PUT" => Method::Put,
            "PATCH" => Method::Patch,
            "HEAD" => Method::Head,
            "OPTIONS" => Method::Options,
            _ => Method::Other,
        }
    }
}

/// A decoded request line and header section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestHead {
    /// The request method.
    pub method: Method,
    /// Where the request target lies in the head (see [`RequestHead::target`]).
    target: (u32, u32),
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// The header fields.
    pub headers: Headers,
    /// How the body is delimited; never `CloseDelimited` for a request.
    pub body: BodyFraming,
}

impl RequestHead {
    /// The request target as received; only visible ASCII (0x21..=0x7e), at most
    /// `REQUEST_TARGET_BYTES_MAX` bytes. Read from the head, not copied out of it.
    pub fn target(&self) -> &str {
        self.headers.text(self.target.0, self.target.1)
    }

    /// Returns the target's path: without its `?query` part, and for an absolute-form
    /// target (`http://host/path`, which RFC 9112 §3.2.2 says a server must accept) without
    /// its scheme and authority (`/` when the path is empty).
    pub fn path(&self) -> &str {
        let target = self.target();
        // The origin form every agent sends starts with `/`; the absolute form is decided
        // out of line, so the common path stays a byte compare and a scan for `?`.
        let target = if self.origin_form() {
            target
        } else {
            absolute_path(target)
        };
        target.split_once('?').map_or(target, |(path, _)| path)
    }

    /// The host the request is for: the authority of an absolute-form target, which
    /// RFC 9112 §3.2.2 puts before any `Host` field, or else the `Host` field.
    pub fn host(&self) -> Option<&[u8]> {
        if self.origin_form() {
            return self.headers.get("host");
        }
        match absolute_form(self.target()) {
            Some((authority, _)) => Some(authority.as_bytes()),
            None => self.headers.get("host"),
        }
    }

    /// True for a target in origin form (`/path?query`), the one agents send: read from the
    /// head's bytes, without the UTF-8 check of [`RequestHead::target`] (both run on every
    /// request).
    fn origin_form(&self) -> bool {
        self.headers.slice(self.target.0, self.target.1).first() == Some(&b'/')
    }

    /// Returns true if the connection stays open after this request (RFC 9112 §9.3):
    /// HTTP/1.1 unless `Connection: close`, HTTP/1.0 only with `Connection: keep-alive`.
    pub fn keep_alive(&self) -> bool {
        if self.headers.has_token("connection", "close") {
            return false;
        }
        self.minor_version >= 1 || self.headers.has_token("connection", "keep-alive")
    }

    /// Returns true if the client waits for `100 Continue` before sending the body
    /// (RFC 9110 §10.1.1; ignored for HTTP/1.0 requests, which cannot receive a 1xx).
    pub fn expects_continue(&self) -> bool {
        self.minor_version >= 1 && self.headers.has_token("expect", "100-continue")
    }
}

/// One step of a request's decoding, as returned by [`RequestDecoder::decode`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RequestEvent {
    /// The request line and headers; the body follows as `Data` events.
    Head(RequestHead),
    /// Body bytes (never empty), split off the caller's buffer without copying.
    Data(bytes::Bytes),
    /// The request is complete; the next `decode` starts the next pipelined request.
    End,
}

/// Where the request decoder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a request head.
    Head,
    /// Inside the body; the body decoder knows where.
    Body,
    /// A decode error happened; the connection must be answered and closed.
    Failed(HttpError),
}

/// The result of one decode step.
enum Step {
    Emit(RequestEvent),
    Again,
    Wait,
}

/// Decodes a stream of pipelined HTTP/1.x requests, one event per call.
#[derive(Debug)]
pub struct RequestDecoder {
    phase: Phase,
    /// Progress through a head still arriving; reset whenever a head starts.
    scan: HeadScan,
    body: BodyDecoder,
}

impl RequestDecoder {
    /// Creates a decoder that refuses bodies larger than `body_bytes_max` with 413.
    ///
    /// Callers pass `limits::MESSAGE_BYTES_MAX` or a lower configured bound.
    pub fn new(body_bytes_max: usize) -> RequestDecoder {
        RequestDecoder {
            phase: Phase::Head,
            scan: HeadScan::default(),
            body: BodyDecoder::new(body_bytes_max),
        }
    }

    /// Decodes the next event from the front of `buf`, removing the bytes it used.
    ///
    /// Returns `Ok(Some(event))` for each event, `Ok(None)` when more bytes are needed (the
    /// caller reads and calls again), and `Err` when the request is malformed; after an error
    /// every later call returns the same error and the caller should answer it with
    /// [`super::encode_error_response`] and close. After `End` the next call starts the next
    /// (pipelined) request.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<RequestEvent>, HttpError> {
        for _ in 0..DECODE_STEPS_MAX {
            let step = match self.phase {
                Phase::Failed(err) => return Err(err),
                Phase::Head => self.decode_head(buf),
                Phase::Body => self.decode_body(buf),
            };
            match step {
                Ok(Step::Emit(event)) => return Ok(Some(event)),
                Ok(Step::Again) => continue,
                Ok(Step::Wait) => return Ok(None),
                Err(err) => {
                    self.phase = Phase::Failed(err);
                    return Err(err);
                }
            }
        }
        // Each step either emits, waits or moves forward in a bounded sequence, so this is
        // only reachable through a bug in the decoder; fail the connection, do not panic.
        let err = HttpError::BadRequest("request decoder made no progress");
        self.phase = Phase::Failed(err);
        Err(err)
    }

    fn decode_body(&mut self, buf: &mut BytesMut) -> Result<Step, HttpError> {
        Ok(match self.body.step(buf)? {
            BodyStep::Data(data) => Step::Emit(RequestEvent::Data(data)),
            BodyStep::End => {
                self.phase = Phase::Head;
                Step::Emit(RequestEvent::End)
            }
            BodyStep::Again => Step::Again,
            BodyStep::Wait => Step::Wait,
        })
    }

    fn decode_head(&mut self, buf: &mut BytesMut) -> Result<Step, HttpError> {
        if strip_empty_lines(buf) {
            self.scan.reset();
        }
        if buf.is_empty() {
            return Ok(Step::Wait);
        }
        if !self.scan.start_line_complete() {
            // 414 before 431: a request line still arriving may already be too long.
            check_target_length(buf)?;
        }
        let window = buf
            .get(..buf.len().min(HEADER_BYTES_MAX))
            .unwrap_or_default();
        let parsed = self.scan.parse(window, parse_head)?;
        let Some(parsed) = parsed else {
            if buf.len() >= HEADER_BYTES_MAX {
                return Err(HttpError::HeaderFieldsTooLarge);
            }
            return Ok(Step::Wait);
        };
        self.scan.reset();
        let head = buf.split_to(parsed.head_len).freeze();
        let headers = Headers::new(head, parsed.fields);
        check_host(&headers, parsed.minor_version)?;
        let body = declared_framing(&headers, parsed.minor_version, self.body.body_bytes_max())?
            .unwrap_or(BodyFraming::None); // RFC 9112 §6.3 (7): no framing, no body.
        self.body.start(body);
        self.phase = Phase::Body;
        Ok(Step::Emit(RequestEvent::Head(RequestHead {
            method: parsed.method,
            target: parsed.target,
            minor_version: parsed.minor_version,
            headers,
            body,
        })))
    }
}

/// What `parse_head` extracts before the head is split off the buffer.
struct ParsedHead {
    head_len: usize,
    method: Method,
    /// The target's place in the head.
    target: (u32, u32),
    minor_version: u8,
    fields: Vec<Field>,
}

/// Parses a complete head at the front of `scan`; `Ok(None)` if it is not complete yet.
fn parse_head(scan: &[u8]) -> Result<Option<ParsedHead>, HttpError> {
    // Left uninitialized: httparse writes the slots it fills, and filling all 64 first would
    // cost more than parsing a typical head.
    let mut slots =
        [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; HEADERS_PER_MESSAGE_MAX];
    let mut request = httparse::Request::new(&mut []);
    let head_len = match request.parse_with_uninit_headers(scan, &mut slots) {
        Ok(httparse::Status::Complete(head_len)) => head_len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(err) => return Err(parse_error(err, scan)),
    };
    let (Some(method), Some(target), Some(minor_version)) =
        (request.method, request.path, request.version)
    else {
        return Err(HttpError::BadRequest("invalid request line"));
    };
    // RFC 9112 §3.2: httparse also admits octets above 0x7e, which no valid URI contains.
    if !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HttpError::BadRequest("invalid request target"));
    }
    if target.len() > REQUEST_TARGET_BYTES_MAX {
        return Err(HttpError::UriTooLong);
    }
    let fields = locate_fields(scan, request.headers)?;
    let target = offsets(scan, target.as_bytes())
        .ok_or(HttpError::BadRequest("request target outside head"))?;
    Ok(Some(ParsedHead {
        head_len,
        method: Method::from_token(method),
        target,
        minor_version,
        fields,
    }))
}

/// The authority and the rest (path and query) of an absolute-form target: `http://` or
/// `https://` (either case), the authority up to the first `/` or `?`, then the rest.
#[cold]
#[inline(never)]
fn absolute_form(target: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = target.split_once("://")?;
    if !scheme.eq_ignore_ascii_case("http") && !scheme.eq_ignore_ascii_case("https") {
        return None;
    }
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    rest.split_at_checked(end)
}

/// The path and query of a target that is not in origin form: of an absolute-form target,
/// what follows its authority (`/` when nothing does, RFC 9112 §3.2.2); any other target
/// (`*`, a form we do not serve) as it is.
#[cold]
#[inline(never)]
fn absolute_path(target: &str) -> &str {
    match absolute_form(target) {
        Some((_, "")) => "/",
        Some((_, rest)) if rest.starts_with('?') => "/",
        Some((_, rest)) => rest,
        None => target,
    }
}

/// Maps an httparse error on a request head to the error we answer with.
fn parse_error(err: httparse::Error, scan: &[u8]) -> HttpError {
    match err {
        httparse::Error::TooManyHeaders => HttpError::HeaderFieldsTooLarge,
        httparse::Error::Version => {
            // The version is the last word of the request line.
            let line = first_line(scan);
            let version = line.rsplit(|b| *b == b' ').next().unwrap_or_default();
            version_error(version)
        }
        httparse::Error::HeaderName => HttpError::BadRequest("invalid header name"),
        httparse::Error::HeaderValue => HttpError::BadRequest("invalid header value"),
        httparse::Error::NewLine => HttpError::BadRequest("invalid line ending"),
        httparse::Error::Token | httparse::Error::Status => {
            HttpError::BadRequest("invalid request line")
        }
    }
}

/// Classifies a version httparse refused: `HTTP/<d>` with a major other than 1, or
/// `HTTP/1.<d>` with a minor other than 0 and 1, is a real but unsupported version (505);
/// anything else, `HTTP/1x` or `FOO/1.1` say, is malformed (400). httparse reports the error
/// at the first offending byte, so the digits that decide this are always in `version`.
/// `PRI * HTTP/2.0` (the HTTP/2 preface) therefore gets 505.
pub(super) fn version_error(version: &[u8]) -> HttpError {
    let Some(rest) = version.strip_prefix(b"HTTP/") else {
        return HttpError::BadRequest("invalid http version");
    };
    match rest {
        [major, ..] if major.is_ascii_digit() && *major != b'1' => HttpError::VersionNotSupported,
        [b'1', b'.', minor, ..] if minor.is_ascii_digit() => HttpError::VersionNotSupported,
        _ => HttpError::BadRequest("invalid http version"),
    }
}

/// Returns the first non-empty line of `scan` without its line ending (or all of it).
pub(super) fn first_line(scan: &[u8]) -> &[u8] {
    // httparse skips empty lines before the start line (RFC 9112 §2.2); so do we.
    let start = scan
        .iter()
        .position(|b| *b != b'\r' && *b != b'\n')
        .unwrap_or(scan.len());
    let line = scan.get(start..).unwrap_or_default();
    let end = memchr::memchr2(b'\r', b'\n', line).unwrap_or(line.len());
    line.get(..end).unwrap_or_default()
}

/// Refuses a request target longer than `REQUEST_TARGET_BYTES_MAX` with 414, even while the
/// request line is still arriving, so a long target is not misreported as 431.
fn check_target_length(buf: &[u8]) -> Result<(), HttpError> {
    let scan = buf
        .get(..buf.len().min(HEADER_BYTES_MAX))
        .unwrap_or_default();
    let line = first_line(scan);
    // request-line = method SP request-target SP HTTP-version (RFC 9112 §3): the target is
    // what lies between the first space and the next one (or the end, while it arrives).
    let after_method = memchr::memchr(b' ', line)
        .and_then(|space_at| line.get(space_at + 1..))
        .unwrap_or_default();
    let target_len = memchr::memchr(b' ', after_method).unwrap_or(after_method.len());
    if target_len > REQUEST_TARGET_BYTES_MAX {
        return Err(HttpError::UriTooLong);
    }
    Ok(())
}

/// RFC 9112 §3.2: an HTTP/1.1 request needs exactly one Host field, any request at most one,
/// and an invalid Host value is refused; all with 400.
fn check_host(headers: &Headers, minor_version: u8) -> Result<(), HttpError> {
    let mut hosts = headers.get_all("host");
    let first = hosts.next();
    if hosts.next().is_some() {
        return Err(HttpError::BadRequest("more than one host"));
    }
    match first {
        None if minor_version >= 1 => Err(HttpError::BadRequest("missing host")),
        None => Ok(()),
        // An empty value is allowed when the target has no authority (RFC 9112 §3.2).
        Some(host) if host.iter().all(|b| b.is_ascii_graphic() && *b != b',') => Ok(()),
        Some(_) => Err(HttpError::BadRequest("invalid host")),
    }
}

#[cfg(test)]
mod tests;
