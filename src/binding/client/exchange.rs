//! One HTTP exchange with the upstream, and the JSON-RPC messages in its answer.
//!
//! [`Response`] decodes the response head and body from a pooled connection; every wait in
//! it is safe to drop (see [`super::wire`]), so callers may race it against timers and
//! cancellation. [`Messages`] turns the body into JSON-RPC messages whether it is one
//! `application/json` document or a `text/event-stream`, and [`classify`] sorts each
//! message into what the internal stream carries.

use super::pool::Lease;
use crate::http::{HttpError, ResponseDecoder, ResponseEvent, ResponseHead};
use crate::jsonrpc::Raw;
use crate::jsonrpc::{self, Kind as RpcKind};
use crate::limits::MESSAGE_BYTES_MAX;
use crate::sse;
use crate::stream::pieces::Whole;
use crate::stream::{Event, ListKind, Reset};
use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::rc::Rc;

/// How an exchange broke before its response was complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broken {
    /// The connection closed or failed before the response ended.
    Closed,
    /// The response was not valid HTTP/1.1.
    Malformed(HttpError),
}

impl Broken {
    pub fn describe(&self) -> String {
        match self {
            Broken::Closed => "Upstream closed the connection mid-response".to_owned(),
            Broken::Malformed(e) => format!("Upstream sent a malformed response: {}", e.detail()),
        }
    }
}

/// The response side of an exchange on a leased connection.
pub struct Response {
    pub lease: Lease,
    decoder: ResponseDecoder,
    /// Bytes have arrived for this response (a failure after that is not retryable).
    pub started: bool,
    /// The response ended cleanly.
    pub ended: bool,
}

impl Response {
    pub fn new(lease: Lease) -> Response {
        Response {
            lease,
            // Bodies are bounded per message (JSON documents, SSE events), not per response:
            // an event stream may run for the whole session.
            decoder: ResponseDecoder::new(usize::MAX),
            started: false,
            ended: false,
        }
    }

    /// The next response event. Safe to drop while waiting.
    pub async fn next(&mut self) -> Result<ResponseEvent, Broken> {
        loop {
            let wire = self.lease.link.wire();
            let decoded = {
                let mut inbox = wire.inbox();
                if !inbox.is_empty() {
                    self.started = true;
                }
                match self.decoder.decode(&mut inbox, false) {
                    Ok(Some(event)) => Some(Ok(event)),
                    Ok(None) if wire.is_over() => Some(match self.decoder.decode_eof(&mut inbox) {
                        // Over TLS a body that runs until the close ends with close_notify
                        // only: a bare TCP close may be anyone's cut (RFC 8446 §6.1).
                        Ok(Some(ResponseEvent::End)) if wire.cut_short() => Err(Broken::Closed),
                        Ok(Some(event)) => Ok(event),
                        Ok(None) => Err(Broken::Closed),
                        Err(e) => Err(Broken::Malformed(e)),
                    }),
                    Ok(None) => None,
                    Err(e) => Some(Err(Broken::Malformed(e))),
                }
            };
            match decoded {
                Some(Ok(ResponseEvent::End)) => {
                    self.ended = true;
                    return Ok(ResponseEvent::End);
                }
                Some(result) => return result,
                None => {
                    wire.fill().await;
                }
            }
        }
    }

    /// True if the connection may carry another exchange after this one.
    pub fn reusable(&self, head: &ResponseHead) -> bool {
        self.ended && head.keep_alive() && !self.lease.link.wire().is_over()
    }
}

/// The body type of a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyKind {
    Json,
    Sse,
    /// Anything else (or no content type): no JSON-RPC message can be read from it.
    Other,
}

impl BodyKind {
    pub fn of(head: &ResponseHead) -> BodyKind {
        let Some(ct) = head.headers.get("content-type") else {
            return BodyKind::Other;
        };
        let media = ct.split(|b| *b == b';').next().unwrap_or_default();
        let media = media.trim_ascii();
        if media.eq_ignore_ascii_case(b"application/json") {
            BodyKind::Json
        } else if media.eq_ignore_ascii_case(b"text/event-stream") {
            BodyKind::Sse
        } else {
            BodyKind::Other
        }
    }
}

/// One JSON-RPC message from the upstream, with its SSE event id and retry if any.
#[derive(Debug, Default)]
pub struct Incoming {
    /// The SSE `id` field (the upstream's event id for resumption); `Some("")` when the
    /// event reset it (no id to resume from since).
    pub event_id: Option<String>,
    /// The SSE `retry` field in milliseconds.
    pub retry_ms: Option<u64>,
    /// The message; `None` for an SSE event without data (a priming event).
    pub data: Option<Bytes>,
}

/// Why a body could not be read as JSON-RPC messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BadBody {
    TooLarge,
    Sse(String),
    /// A JSON-RPC message that cannot be what it says (a response without a result, a
    /// request without an id).
    NotJsonRpc,
    /// Data that is not a JSON-RPC message at all.
    NotAMessage,
}

impl BadBody {
    pub fn describe(&self) -> String {
        match self {
            BadBody::TooLarge => format!("Upstream message larger than {MESSAGE_BYTES_MAX} bytes"),
            BadBody::Sse(e) => format!("Upstream sent a malformed event stream: {e}"),
            BadBody::NotJsonRpc | BadBody::NotAMessage => {
                "Upstream sent a response that is not JSON-RPC".to_owned()
            }
        }
    }
}

/// Splits a response body into messages.
pub struct Messages {
    kind: BodyKind,
    /// JSON: the body so far. Invariant: at most `MESSAGE_BYTES_MAX`.
    body: Whole,
    /// SSE: undecoded bytes and the decoder.
    sse_buf: BytesMut,
    sse: sse::Decoder,
    ended: bool,
    /// JSON: the single message was handed out.
    taken: bool,
}

impl Messages {
    pub fn new(kind: BodyKind) -> Messages {
        Messages {
            kind,
            body: Whole::default(),
            sse_buf: BytesMut::new(),
            sse: sse::Decoder::new(),
            ended: false,
            taken: false,
        }
    }

    /// Adds body bytes.
    pub fn feed(&mut self, data: Bytes) -> Result<(), BadBody> {
        match self.kind {
            BodyKind::Sse => {
                self.sse_buf.extend_from_slice(&data);
                Ok(())
            }
            BodyKind::Json | BodyKind::Other => {
                if self.body.len() + data.len() > MESSAGE_BYTES_MAX {
                    return Err(BadBody::TooLarge);
                }
                self.body.push(data);
                Ok(())
            }
        }
    }

    /// Marks the body complete.
    pub fn end(&mut self) {
        self.ended = true;
    }

    /// The next complete message, if one is ready.
    pub fn next(&mut self) -> Result<Option<Incoming>, BadBody> {
        match self.kind {
            BodyKind::Sse => {
                let message = self
                    .sse
                    .decode(&mut self.sse_buf)
                    .map_err(|e| BadBody::Sse(e.to_string()))?;
                Ok(message.map(|m| {
                    // An event of a type other than `message` carries no JSON-RPC message
                    // (the SDKs' clients skip them too); its id still moves the resume point.
                    let message_type = m
                        .event
                        .as_deref()
                        .is_none_or(|t| t.is_empty() || t == "message");
                    Incoming {
                        event_id: m.id,
                        retry_ms: m.retry_ms,
                        data: m.data.filter(|d| message_type && !d.is_empty()),
                    }
                }))
            }
            BodyKind::Json | BodyKind::Other => {
                if !self.ended || self.taken {
                    return Ok(None);
                }
                self.taken = true;
                let data = self.body.take();
                if data.is_empty() {
                    // An empty body (a 202 that still names a type) holds no message.
                    return Ok(None);
                }
                Ok(Some(Incoming {
                    data: Some(data),
                    ..Incoming::default()
                }))
            }
        }
    }
}

/// Reads the next message of a response body; `Ok(None)` when the body ended. Safe to
/// drop while waiting (the only wait is in [`Response::next`]).
pub async fn next_message(
    response: &mut Response,
    messages: &mut Messages,
) -> Result<Option<Incoming>, Failure> {
    loop {
        if let Some(m) = messages.next().map_err(Failure::Body)? {
            return Ok(Some(m));
        }
        if messages.ended {
            return Ok(None);
        }
        match response.next().await.map_err(Failure::Broken)? {
            ResponseEvent::Data(d) => messages.feed(d).map_err(Failure::Body)?,
            ResponseEvent::End => messages.end(),
            ResponseEvent::Head(_) => {
                return Err(Failure::Broken(Broken::Malformed(HttpError::BadRequest(
                    "a second response head",
                ))));
            }
        }
    }
}

/// Why reading an answer failed.
#[derive(Debug, Clone)]
pub enum Failure {
    Broken(Broken),
    Body(BadBody),
}

impl Failure {
    pub fn describe(&self) -> String {
        match self {
            Failure::Broken(b) => b.describe(),
            Failure::Body(b) => b.describe(),
        }
    }
}

/// What one upstream JSON-RPC message means for the internal stream.
#[derive(Debug)]
pub enum Upward {
    /// The response to the request with the id we expect: the raw `result`.
    Result(Bytes),
    /// The error response to our request, as the RESET to send.
    Error(Reset),
    /// A notification or server-to-client request to relay.
    Event(Event),
    /// A response to some other id: nothing to relay.
    Ignore,
}

/// Sorts one message; `expect` is the raw id lexeme of our request (responses to other ids
/// are ignored). Fails if the data is not a JSON-RPC message ([`BadBody::NotAMessage`]) or
/// is one that cannot be what it says ([`BadBody::NotJsonRpc`]).
pub fn classify(data: &Bytes, expect: Option<&str>) -> Result<Upward, BadBody> {
    let envelope = jsonrpc::parse_envelope(data).map_err(|_| BadBody::NotAMessage)?;
    let slice = |raw: Raw<'_>| data.slice_ref(raw.get().as_bytes());
    let ours = |id: Option<&str>| match (id, expect) {
        (Some(id), Some(expect)) => id == expect,
        (None, _) => true,
        (Some(_), None) => true,
    };
    Ok(match envelope.kind {
        RpcKind::Response => {
            if !ours(envelope.id.map(|i| i.raw)) {
                return Ok(Upward::Ignore);
            }
            match envelope.result {
                Some(result) => Upward::Result(slice(result)),
                None => return Err(BadBody::NotJsonRpc),
            }
        }
        RpcKind::ErrorResponse => {
            if !ours(envelope.id.map(|i| i.raw)) {
                return Ok(Upward::Ignore);
            }
            Upward::Error(error_reset(envelope.error, data))
        }
        RpcKind::Notification => {
            let method = envelope.method.as_deref().unwrap_or_default();
            let params = envelope.params.map(slice);
            Upward::Event(notification_event(method, params))
        }
        RpcKind::Request => {
            let method = envelope.method.as_deref().unwrap_or_default();
            let Some(id) = envelope.id else {
                return Err(BadBody::NotJsonRpc);
            };
            Upward::Event(Event::Request {
                id: data.slice_ref(id.raw.as_bytes()),
                method: Rc::from(method),
                params: envelope.params.map(slice),
            })
        }
    })
}

/// The event for an upstream notification.
pub fn notification_event(method: &str, params: Option<Bytes>) -> Event {
    match (method, params) {
        ("notifications/progress", Some(params)) => Event::Progress { params },
        ("notifications/tools/list_changed", _) => Event::ListChanged(ListKind::Tools),
        ("notifications/prompts/list_changed", _) => Event::ListChanged(ListKind::Prompts),
        ("notifications/resources/list_changed", _) => Event::ListChanged(ListKind::Resources),
        ("notifications/resources/updated", Some(params)) => Event::ResourcesUpdated { params },
        (method, params) => Event::Notification {
            method: Rc::from(method),
            params,
        },
    }
}

/// The members of a JSON-RPC error object.
#[derive(Deserialize)]
struct ErrorObject<'a> {
    code: i64,
    #[serde(borrow)]
    message: Cow<'a, str>,
    /// Kept whenever the member is there, `null` included: the agent gets the same error.
    #[serde(borrow, default, deserialize_with = "present")]
    data: Option<&'a RawValue>,
}

/// A member that is present, whatever its value (serde reads `null` as `None` otherwise).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// The RESET for an upstream error response: the same code, message and data when the
/// error object is well formed, an internal error otherwise.
fn error_reset(error: Option<Raw<'_>>, data: &Bytes) -> Reset {
    let parsed = error.and_then(|raw| serde_json::from_str::<ErrorObject<'_>>(raw.get()).ok());
    match parsed {
        Some(e) => match i32::try_from(e.code) {
            Ok(code) => Reset::Error {
                code,
                message: Rc::from(e.message.as_ref()),
                data: e.data.map(|d| data.slice_ref(d.get().as_bytes())),
            },
            Err(_) => upstream_error("Upstream sent an error code out of range"),
        },
        None => upstream_error("Upstream sent a malformed error response"),
    }
}

/// The RESET for the raw `error` object of an upstream response (as the streaming scanner
/// captured it).
pub fn error_object_reset(error: &Bytes) -> Reset {
    let raw = std::str::from_utf8(error).ok().and_then(Raw::parse);
    match raw {
        Some(raw) => error_reset(Some(raw), error),
        None => upstream_error("Upstream sent a malformed error response"),
    }
}

/// An internal-error RESET (-32603) with `message`.
pub fn upstream_error(message: &str) -> Reset {
    Reset::Error {
        code: jsonrpc::INTERNAL_ERROR,
        message: Rc::from(message),
        data: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(text: &str, expect: Option<&str>) -> Upward {
        classify(&Bytes::copy_from_slice(text.as_bytes()), expect).unwrap()
    }

    #[test]
    fn results_errors_and_events() {
        let r = sorted(
            r#"{"jsonrpc":"2.0","id":7,"result":{"a": [1, 2]}}"#,
            Some("7"),
        );
        assert!(matches!(r, Upward::Result(b) if &b[..] == br#"{"a": [1, 2]}"#));
        let r = sorted(r#"{"jsonrpc":"2.0","id":8,"result":{}}"#, Some("7"));
        assert!(matches!(r, Upward::Ignore));
        let r = sorted(
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"bad \"x\"","data":{"k":1}}}"#,
            Some("7"),
        );
        match r {
            Upward::Error(Reset::Error {
                code,
                message,
                data,
            }) => {
                assert_eq!(code, -32602);
                assert_eq!(&*message, "bad \"x\"");
                assert_eq!(data.as_deref(), Some(&br#"{"k":1}"#[..]));
            }
            other => panic!("unexpected {other:?}"),
        }
        let r = sorted(
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"m","data":null}}"#,
            Some("7"),
        );
        assert!(
            matches!(r, Upward::Error(Reset::Error { data: Some(d), .. }) if &d[..] == b"null")
        );
        let r = sorted(
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":"x"}}"#,
            Some("7"),
        );
        assert!(matches!(
            r,
            Upward::Error(Reset::Error { code: -32603, .. })
        ));
        let r = sorted(
            r#"{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":2}}"#,
            Some("7"),
        );
        assert!(matches!(r, Upward::Event(Event::Progress { .. })));
        let r = sorted(
            r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#,
            None,
        );
        assert!(matches!(
            r,
            Upward::Event(Event::ListChanged(ListKind::Tools))
        ));
        let r = sorted(
            r#"{"jsonrpc":"2.0","id":"e1","method":"elicitation/create","params":{"message":"hi"}}"#,
            Some("7"),
        );
        match r {
            Upward::Event(Event::Request { id, method, params }) => {
                assert_eq!(&id[..], b"\"e1\"");
                assert_eq!(&*method, "elicitation/create");
                assert_eq!(params.as_deref(), Some(&br#"{"message":"hi"}"#[..]));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(classify(&Bytes::from_static(b"{not json"), None).is_err());
    }

    #[test]
    fn json_bodies_join_their_pieces() {
        let mut m = Messages::new(BodyKind::Json);
        m.feed(Bytes::from_static(b"{\"jsonrpc\":\"2.0\","))
            .unwrap();
        assert!(m.next().unwrap().is_none());
        m.feed(Bytes::from_static(b"\"id\":1,\"result\":{}}"))
            .unwrap();
        m.end();
        let one = m.next().unwrap().unwrap();
        assert_eq!(
            one.data.as_deref(),
            Some(&b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}"[..])
        );
        assert!(m.next().unwrap().is_none());
    }

    #[test]
    fn sse_bodies_give_ids_retry_and_data() {
        let mut m = Messages::new(BodyKind::Sse);
        m.feed(Bytes::from_static(
            b"id: 5\nretry: 250\ndata:\n\nid: 6\ndata: {\"a\":\ndata: 1}\n\n",
        ))
        .unwrap();
        let first = m.next().unwrap().unwrap();
        assert_eq!(first.event_id.as_deref(), Some("5"));
        assert_eq!(first.retry_ms, Some(250));
        assert!(first.data.is_none());
        let second = m.next().unwrap().unwrap();
        assert_eq!(second.event_id.as_deref(), Some("6"));
        assert_eq!(second.data.as_deref(), Some(&b"{\"a\":\n1}"[..]));
        assert!(m.next().unwrap().is_none());
    }

    #[test]
    fn content_types() {
        let head = |ct: &str| {
            let text =
                format!("HTTP/1.1 200 OK\r\ncontent-type: {ct}\r\ncontent-length: 0\r\n\r\n");
            let mut buf = BytesMut::from(text.as_bytes());
            match ResponseDecoder::new(16).decode(&mut buf, false) {
                Ok(Some(ResponseEvent::Head(h))) => h,
                other => panic!("no head: {other:?}"),
            }
        };
        assert_eq!(BodyKind::of(&head("application/json")), BodyKind::Json);
        assert_eq!(
            BodyKind::of(&head("Application/JSON; charset=utf-8")),
            BodyKind::Json
        );
        assert_eq!(BodyKind::of(&head("text/event-stream")), BodyKind::Sse);
        assert_eq!(BodyKind::of(&head("text/html")), BodyKind::Other);
    }
}
