//! The response decoder: the upstream client reads upstream responses with it.
//!
//! `ResponseDecoder::decode` turns the bytes at the front of an upstream connection's read
//! buffer into `Head`, `Data`* and `End` events. Interim 1xx responses are consumed silently
//! (RFC 9110 §15.2); the body length follows RFC 9112 §6.3, including bodies that run until
//! the upstream closes, which `decode_eof` finishes.

use bytes::{Buf, BytesMut};

use super::BodyFraming;
use super::body::{BodyDecoder, BodyStep};
use super::error::HttpError;
use super::framing::declared_framing;
use super::headers::{Field, Headers, locate_fields};
use super::request::{DECODE_STEPS_MAX, first_line, version_error};
use super::scan::{HeadScan, strip_empty_lines};
use crate::limits::{HEADER_BYTES_MAX, HEADERS_PER_MESSAGE_MAX, INFORMATIONAL_RESPONSES_MAX};

/// A decoded status line and header section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code, 200..=599 (1xx are consumed by the decoder).
    pub status: u16,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// The header fields.
    pub headers: Headers,
    /// How the body is delimited.
    pub body: BodyFraming,
}

impl ResponseHead {
    /// Returns true if the connection can carry another request after this response
    /// (RFC 9112 §9.3): never after a close-delimited body; HTTP/1.1 unless
    /// `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`.
    pub fn keep_alive(&self) -> bool {
        if self.body == BodyFraming::CloseDelimited {
            return false;
        }
        if self.headers.has_token("connection", "close") {
            return false;
        }
        self.minor_version >= 1 || self.headers.has_token("connection", "keep-alive")
    }
}

/// One step of a response's decoding, as returned by [`ResponseDecoder::decode`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResponseEvent {
    /// The final status line and headers; the body follows as `Data` events.
    Head(ResponseHead),
    /// Body bytes (never empty), split off the caller's buffer without copying.
    Data(bytes::Bytes),
    /// The response is complete.
    End,
}

/// Where the response decoder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for (the rest of) a response head.
    Head,
    /// Inside the body; the body decoder knows where.
    Body,
    /// The peer closed and everything has been delivered.
    Closed,
    /// A decode error happened; the connection must be closed.
    Failed(HttpError),
}

/// The result of one decode step.
enum Step {
    Emit(ResponseEvent),
    Again,
    Wait,
}

/// Decodes a stream of HTTP/1.x responses, one event per call.
#[derive(Debug)]
pub struct ResponseDecoder {
    phase: Phase,
    /// Progress through a head still arriving; reset whenever a head starts.
    scan: HeadScan,
    body: BodyDecoder,
    /// Interim responses seen before the current final one. Invariant: at most
    /// `INFORMATIONAL_RESPONSES_MAX`; reset by each final head.
    informational_count: u32,
}

impl ResponseDecoder {
    /// Creates a decoder that refuses bodies larger than `body_bytes_max` with 413.
    pub fn new(body_bytes_max: usize) -> ResponseDecoder {
        ResponseDecoder {
            phase: Phase::Head,
            scan: HeadScan::default(),
            body: BodyDecoder::new(body_bytes_max),
            informational_count: 0,
        }
    }

    /// Decodes the next event from the front of `buf`, removing the bytes it used.
    ///
    /// `head_request` is true if the request this response answers was HEAD, so the
    /// response has no body whatever its headers say (RFC 9112 §6.3 (1)). Returns
    /// `Ok(Some(event))` for each event, `Ok(None)` when more bytes are needed (or after the
    /// peer closed), and `Err` when the response is malformed; after an error every later
    /// call returns the same error.
    pub fn decode(
        &mut self,
        buf: &mut BytesMut,
        head_request: bool,
    ) -> Result<Option<ResponseEvent>, HttpError> {
        for _ in 0..DECODE_STEPS_MAX + INFORMATIONAL_RESPONSES_MAX as usize {
            let step = match self.phase {
                Phase::Failed(err) => return Err(err),
                Phase::Closed => return Ok(None),
                Phase::Head => self.decode_head(buf, head_request),
                Phase::Body => self.decode_body(buf),
            };
            match self.settle(step)? {
                Step::Emit(event) => return Ok(Some(event)),
                Step::Again => continue,
                Step::Wait => return Ok(None),
            }
        }
        // Only reachable through a bug: every step makes bounded progress.
        self.settle(Err(HttpError::BadRequest(
            "response decoder made no progress",
        )))
        .map(|_| None)
    }

    /// Handles the peer closing the connection after `decode` returned `Ok(None)`.
    ///
    /// Delivers any buffered bytes of a close-delimited body as `Data`, then `End`; after
    /// that, or if the close fell between responses, returns `Ok(None)`. A close inside a
    /// head or inside a length-delimited or chunked body is an error (truncated response).
    /// Heads are not decoded here, because that needs `head_request`: call `decode` first.
    pub fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<ResponseEvent>, HttpError> {
        for _ in 0..DECODE_STEPS_MAX {
            let step = match self.phase {
                Phase::Failed(err) => return Err(err),
                Phase::Closed => return Ok(None),
                Phase::Head if buf.is_empty() => {
                    self.phase = Phase::Closed;
                    return Ok(None);
                }
                Phase::Head => Err(HttpError::BadRequest(
                    "connection closed inside response head",
                )),
                Phase::Body => match self.decode_body(buf) {
                    Ok(Step::Wait) => self.finish_body(),
                    other => other,
                },
            };
            match self.settle(step)? {
                Step::Emit(event) => return Ok(Some(event)),
                Step::Again => continue,
                Step::Wait => return Ok(None),
            }
        }
        self.settle(Err(HttpError::BadRequest(
            "response decoder made no progress",
        )))
        .map(|_| None)
    }

    /// Records an error so later calls repeat it; passes steps through.
    fn settle(&mut self, step: Result<Step, HttpError>) -> Result<Step, HttpError> {
        step.inspect_err(|err| self.phase = Phase::Failed(*err))
    }

    fn finish_body(&mut self) -> Result<Step, HttpError> {
        match self.body.finish()? {
            BodyStep::End => {
                self.phase = Phase::Closed;
                Ok(Step::Emit(ResponseEvent::End))
            }
            BodyStep::Data(data) => Ok(Step::Emit(ResponseEvent::Data(data))),
            BodyStep::Again => Ok(Step::Again),
            BodyStep::Wait => Ok(Step::Wait),
        }
    }

    fn decode_body(&mut self, buf: &mut BytesMut) -> Result<Step, HttpError> {
        Ok(match self.body.step(buf)? {
            BodyStep::Data(data) => Step::Emit(ResponseEvent::Data(data)),
            BodyStep::End => {
                self.phase = Phase::Head;
                Step::Emit(ResponseEvent::End)
            }
            BodyStep::Again => Step::Again,
            BodyStep::Wait => Step::Wait,
        })
    }

    fn decode_head(&mut self, buf: &mut BytesMut, head_request: bool) -> Result<Step, HttpError> {
        if strip_empty_lines(buf) {
            self.scan.reset();
        }
        if buf.is_empty() {
            return Ok(Step::Wait);
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
        match parsed.status {
            101 => return Err(HttpError::NotImplemented("protocol upgrade")),
            100..=199 => {
                // RFC 9110 §15.2: a client must be able to parse and ignore interim responses.
                if self.informational_count >= INFORMATIONAL_RESPONSES_MAX {
                    return Err(HttpError::BadRequest("too many informational responses"));
                }
                self.informational_count += 1;
                buf.advance(parsed.head_len);
                return Ok(Step::Again);
            }
            200..=599 => {}
            // RFC 9110 §15: values outside 100..=599 are invalid.
            _ => return Err(HttpError::BadRequest("invalid status code")),
        }
        self.informational_count = 0;
        let head = buf.split_to(parsed.head_len).freeze();
        let headers = Headers::new(head, parsed.fields);
        let body = if head_request || parsed.status == 204 || parsed.status == 304 {
            // RFC 9112 §6.3 (1): no body, whatever the framing fields say.
            BodyFraming::None
        } else {
            declared_framing(&headers, parsed.minor_version, self.body.body_bytes_max())?
                // RFC 9112 §6.3 (8): no framing fields, the body runs until close.
                .unwrap_or(BodyFraming::CloseDelimited)
        };
        self.body.start(body);
        self.phase = Phase::Body;
        Ok(Step::Emit(ResponseEvent::Head(ResponseHead {
            status: parsed.status,
            minor_version: parsed.minor_version,
            headers,
            body,
        })))
    }
}

/// What `parse_head` extracts before the head is split off the buffer.
struct ParsedHead {
    head_len: usize,
    status: u16,
    minor_version: u8,
    fields: Vec<Field>,
}

/// Parses a complete status line and header section at the front of `scan`; `Ok(None)` if
/// it is not complete yet.
fn parse_head(scan: &[u8]) -> Result<Option<ParsedHead>, HttpError> {
    let mut slots = [httparse::EMPTY_HEADER; HEADERS_PER_MESSAGE_MAX];
    let mut response = httparse::Response::new(&mut slots);
    let head_len = match response.parse(scan) {
        Ok(httparse::Status::Complete(head_len)) => head_len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(err) => return Err(parse_error(err, scan)),
    };
    let (Some(status), Some(minor_version)) = (response.code, response.version) else {
        return Err(HttpError::BadRequest("invalid status line"));
    };
    let fields = locate_fields(scan, response.headers)?;
    Ok(Some(ParsedHead {
        head_len,
        status,
        minor_version,
        fields,
    }))
}

/// Maps an httparse error on a response head to the error we report.
fn parse_error(err: httparse::Error, scan: &[u8]) -> HttpError {
    match err {
        httparse::Error::TooManyHeaders => HttpError::HeaderFieldsTooLarge,
        httparse::Error::Version => {
            // The version is the first word of the status line.
            let line = first_line(scan);
            version_error(line.split(|b| *b == b' ').next().unwrap_or_default())
        }
        httparse::Error::HeaderName => HttpError::BadRequest("invalid header name"),
        httparse::Error::HeaderValue => HttpError::BadRequest("invalid header value"),
        httparse::Error::NewLine => HttpError::BadRequest("invalid line ending"),
        httparse::Error::Status | httparse::Error::Token => {
            HttpError::BadRequest("invalid status line")
        }
    }
}

#[cfg(test)]
mod tests;
