//! The fixture's MCP behaviour, sans-IO: a decoded request in, a [`Reply`] plan out.
//!
//! Follows MCP 2025-11-25 Streamable HTTP ("Transports" and "Lifecycle"): `initialize`
//! creates a session named in `mcp-session-id`; every other request must carry a live one
//! (400 without the header, 404 for an unknown id); notifications and responses get 202;
//! GET opens the session's event stream; DELETE ends the session. `conn.rs` turns the
//! plan into bytes and timers.

use std::time::Duration;

use bytes::Bytes;
use mcpyard::http::{Method, RequestHead};
use mcpyard::jsonrpc::{
    Envelope, INVALID_PARAMS, Kind, METHOD_NOT_FOUND, param_str, parse_envelope, progress_token,
};

use super::state::{ECHOED_VERSIONS, HEADER_VERSIONS, LATEST_VERSION, Shared};

/// The path that triggers list_changed on every open GET stream (no session needed).
pub const LIST_CHANGED_PATH: &str = "/control/list_changed";

/// Paths under this prefix are the fixture's own controls, not MCP.
pub const CONTROL_PREFIX: &str = "/control/";

/// A JSON-RPC message to send back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// `{"jsonrpc":"2.0","id":<id>,"result":<result>}`.
    Result {
        /// The request's id lexeme, echoed verbatim.
        id: String,
        /// The pre-rendered result object.
        result: Bytes,
    },
    /// `{"jsonrpc":"2.0","id":<id|null>,"error":{"code":..,"message":..}}`.
    Error {
        /// The request's id lexeme, when one could be read.
        id: Option<String>,
        /// The JSON-RPC error code.
        code: i32,
        /// A fixed message.
        message: &'static str,
    },
}

/// Progress notifications to send before a tools/call result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgressPlan {
    /// The request's `_meta.progressToken` lexeme.
    pub token: String,
    /// How many notifications (progress 1..=count, total count).
    pub count: u32,
    /// The pause before each one.
    pub interval: Duration,
}

/// What to answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// A JSON-RPC message, as JSON or as an SSE stream.
    Message {
        /// The HTTP status.
        status: u16,
        /// A new session id to announce in `mcp-session-id`.
        session: Option<String>,
        /// The message.
        message: Message,
        /// How long to wait before the result (after any progress events).
        delay: Duration,
        /// Progress events to send first; implies SSE.
        progress: Option<ProgressPlan>,
        /// Answer as `text/event-stream` with one event.
        sse: bool,
    },
    /// 202 Accepted with no body (notifications and client responses).
    Accepted,
    /// A status with an empty body (DELETE: 200).
    Empty(u16),
    /// A status with a one-line plain text body.
    Text(u16, &'static str),
    /// The control endpoint's answer: how many streams were told.
    Triggered(usize),
    /// Open the session's GET event stream on this connection.
    Stream,
}

/// Decides the reply to one request.
pub fn route(shared: &Shared, head: &RequestHead, body: &[u8]) -> Reply {
    let path = head.path();
    if path.starts_with(CONTROL_PREFIX) {
        return match (head.method, path) {
            (Method::Post, LIST_CHANGED_PATH) => Reply::Triggered(shared.trigger_list_changed()),
            _ => Reply::Text(404, "no such control"),
        };
    }
    match head.method {
        Method::Post => post(shared, head, body),
        Method::Get => get(shared, head),
        Method::Delete => delete(shared, head),
        _ => Reply::Text(405, "use POST, GET or DELETE"),
    }
}

/// Checks the session and version headers of a non-initialize request; `Some` is the
/// refusal.
fn check_session(shared: &Shared, head: &RequestHead) -> Option<Reply> {
    let Some(session) = head.headers.get("mcp-session-id") else {
        // MCP 2025-11-25 Transports §Session Management: missing header → 400.
        return Some(Reply::Text(400, "missing mcp-session-id"));
    };
    if !shared.has_session(session) {
        // Unknown or ended session → 404, so the client starts a new one.
        return Some(Reply::Text(404, "unknown session"));
    }
    match head.headers.get("mcp-protocol-version") {
        Some(v) if !HEADER_VERSIONS.iter().any(|known| known.as_bytes() == v) => {
            Some(Reply::Text(400, "unsupported mcp-protocol-version"))
        }
        _ => None,
    }
}

fn post(shared: &Shared, head: &RequestHead, body: &[u8]) -> Reply {
    let envelope = match parse_envelope(body) {
        Ok(envelope) => envelope,
        Err(err) => {
            return message(
                400,
                Message::Error {
                    id: err.id,
                    code: err.code,
                    message: err.message,
                },
                shared.args.sse,
            );
        }
    };
    if envelope.kind == Kind::Request && envelope.method.as_deref() == Some("initialize") {
        return initialize(shared, &envelope);
    }
    if let Some(refusal) = check_session(shared, head) {
        return refusal;
    }
    if envelope.kind != Kind::Request {
        return Reply::Accepted;
    }
    let id = envelope.id.map(|id| id.raw.to_owned()).unwrap_or_default();
    let rendered = &shared.rendered;
    let result = |result: &Bytes| Message::Result {
        id: id.clone(),
        result: result.clone(),
    };
    match envelope.method.as_deref() {
        Some("ping") => message(200, result(&rendered.empty), shared.args.sse),
        Some("tools/list") => message(200, result(&rendered.tools_list), shared.args.sse),
        Some("tools/call") => tools_call(shared, &envelope, id.clone()),
        _ => message(
            200,
            Message::Error {
                id: Some(id.clone()),
                code: METHOD_NOT_FOUND,
                message: "Method not found",
            },
            shared.args.sse,
        ),
    }
}

fn message(status: u16, message: Message, sse: bool) -> Reply {
    Reply::Message {
        status,
        session: None,
        message,
        delay: Duration::ZERO,
        progress: None,
        sse,
    }
}

fn initialize(shared: &Shared, envelope: &Envelope<'_>) -> Reply {
    let id = envelope.id.map(|id| id.raw.to_owned()).unwrap_or_default();
    let asked = envelope
        .params
        .and_then(|p| param_str(p, "protocolVersion").ok().flatten());
    let version = asked
        .as_deref()
        .filter(|v| ECHOED_VERSIONS.contains(v))
        .unwrap_or(LATEST_VERSION);
    let index = ECHOED_VERSIONS
        .iter()
        .position(|v| *v == version)
        .unwrap_or(0);
    let Some(result) = shared.rendered.initialize.get(index) else {
        return Reply::Text(500, "no rendered initialize result");
    };
    let session = shared.create_session();
    Reply::Message {
        status: 200,
        session: Some(session),
        message: Message::Result {
            id,
            result: result.clone(),
        },
        delay: Duration::ZERO,
        progress: None,
        sse: shared.args.sse,
    }
}

fn tools_call(shared: &Shared, envelope: &Envelope<'_>, id: String) -> Reply {
    let params = envelope.params;
    let name = params.and_then(|p| param_str(p, "name").ok().flatten());
    if !matches!(name.as_deref(), Some("echo" | "big")) {
        let error = Message::Error {
            id: Some(id),
            code: INVALID_PARAMS,
            message: "Unknown tool",
        };
        return message(200, error, shared.args.sse);
    }
    // MCP: progress notifications name the request's token, so without one there are none.
    let progress = match (shared.args.progress, params.and_then(progress_token)) {
        (count, Some(token)) if count > 0 => Some(ProgressPlan {
            token: token.get().to_owned(),
            count,
            interval: shared.args.progress_interval,
        }),
        _ => None,
    };
    Reply::Message {
        status: 200,
        session: None,
        sse: shared.args.sse || progress.is_some(),
        message: Message::Result {
            id,
            result: shared.rendered.call_result.clone(),
        },
        delay: shared.args.delay,
        progress,
    }
}

fn get(shared: &Shared, head: &RequestHead) -> Reply {
    let accepts_events = head.headers.get_all("accept").any(|v| {
        v.to_ascii_lowercase()
            .windows(17)
            .any(|w| w == b"text/event-stream")
    });
    if !accepts_events {
        return Reply::Text(406, "accept text/event-stream");
    }
    if let Some(refusal) = check_session(shared, head) {
        return refusal;
    }
    Reply::Stream
}

fn delete(shared: &Shared, head: &RequestHead) -> Reply {
    match head.headers.get("mcp-session-id") {
        None => Reply::Text(400, "missing mcp-session-id"),
        Some(session) if shared.remove_session(session) => Reply::Empty(200),
        Some(_) => Reply::Text(404, "unknown session"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::state::for_tests;
    use bytes::BytesMut;
    use mcpyard::http::{RequestDecoder, RequestEvent};

    /// Decodes one raw request and routes it.
    fn send(shared: &Shared, method: &str, session: Option<&str>, body: &str) -> Reply {
        let mut raw = format!(
            "{method} /mcp HTTP/1.1\r\nhost: x\r\naccept: application/json, text/event-stream\r\ncontent-length: {}\r\n",
            body.len()
        );
        if let Some(s) = session {
            raw.push_str(&format!("mcp-session-id: {s}\r\n"));
        }
        raw.push_str("\r\n");
        raw.push_str(body);
        let mut buf = BytesMut::from(raw.as_bytes());
        let mut decoder = RequestDecoder::new(1 << 20);
        let (mut head, mut data) = (None, Vec::new());
        while let Ok(Some(event)) = decoder.decode(&mut buf) {
            match event {
                RequestEvent::Head(h) => head = Some(h),
                RequestEvent::Data(d) => data.extend_from_slice(&d),
                RequestEvent::End => break,
            }
        }
        let head = head.unwrap_or_else(|| panic!("no head in {raw:?}"));
        route(shared, &head, &data)
    }

    fn session_of(reply: &Reply) -> String {
        match reply {
            Reply::Message {
                session: Some(s), ..
            } => s.clone(),
            other => panic!("no session in {other:?}"),
        }
    }

    const INIT: &str = r#"{"jsonrpc":"2.0","id":"a","method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#;

    #[test]
    fn initialize_echoes_the_id_and_a_supported_version() {
        let s = for_tests(10, 0, false);
        let reply = send(&s, "POST", None, INIT);
        let Reply::Message {
            status: 200,
            message: Message::Result { id, result },
            ..
        } = &reply
        else {
            panic!("{reply:?}");
        };
        assert_eq!(id, "\"a\"");
        assert!(std::str::from_utf8(result).is_ok_and(|r| r.contains("2025-06-18")));
        assert_eq!(session_of(&reply).len(), 16);
    }

    #[test]
    fn requests_need_a_live_session() {
        let s = for_tests(10, 0, false);
        let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        assert_eq!(
            send(&s, "POST", None, ping),
            Reply::Text(400, "missing mcp-session-id")
        );
        assert_eq!(
            send(&s, "POST", Some("0000000000000001"), ping),
            Reply::Text(404, "unknown session")
        );
        let sid = session_of(&send(&s, "POST", None, INIT));
        assert!(matches!(
            send(&s, "POST", Some(&sid), ping),
            Reply::Message { status: 200, .. }
        ));
        assert_eq!(send(&s, "DELETE", Some(&sid), ""), Reply::Empty(200));
        assert_eq!(
            send(&s, "POST", Some(&sid), ping),
            Reply::Text(404, "unknown session")
        );
    }

    #[test]
    fn notifications_get_202_and_unknown_methods_32601() {
        let s = for_tests(10, 0, false);
        let sid = session_of(&send(&s, "POST", None, INIT));
        let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert_eq!(send(&s, "POST", Some(&sid), note), Reply::Accepted);
        let unknown = r#"{"jsonrpc":"2.0","id":5,"method":"nope"}"#;
        let reply = send(&s, "POST", Some(&sid), unknown);
        assert!(matches!(
            reply,
            Reply::Message {
                message: Message::Error {
                    code: METHOD_NOT_FOUND,
                    ..
                },
                ..
            }
        ));
    }

    #[test]
    fn tools_call_streams_progress_only_with_a_token() {
        let s = for_tests(10, 3, false);
        let sid = session_of(&send(&s, "POST", None, INIT));
        let plain = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#;
        let reply = send(&s, "POST", Some(&sid), plain);
        assert!(
            matches!(
                reply,
                Reply::Message {
                    sse: false,
                    progress: None,
                    ..
                }
            ),
            "{reply:?}"
        );
        let with_token = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"_meta":{"progressToken":"t"},"name":"echo"}}"#;
        let reply = send(&s, "POST", Some(&sid), with_token);
        let Reply::Message {
            sse: true,
            progress: Some(plan),
            ..
        } = reply
        else {
            panic!("{reply:?}");
        };
        assert_eq!(plan.token, "\"t\"");
        assert_eq!(plan.count, 3);
        let unknown_tool =
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"x"}}"#;
        assert!(matches!(
            send(&s, "POST", Some(&sid), unknown_tool),
            Reply::Message {
                message: Message::Error {
                    code: INVALID_PARAMS,
                    ..
                },
                ..
            }
        ));
    }

    #[test]
    fn malformed_json_is_a_400_parse_error() {
        let s = for_tests(10, 0, false);
        let reply = send(&s, "POST", None, "{nope");
        assert!(matches!(
            reply,
            Reply::Message {
                status: 400,
                message: Message::Error { code: -32700, .. },
                ..
            }
        ));
    }

    #[test]
    fn get_opens_a_stream_for_a_live_session() {
        let s = for_tests(10, 0, false);
        let sid = session_of(&send(&s, "POST", None, INIT));
        assert_eq!(send(&s, "GET", Some(&sid), ""), Reply::Stream);
        assert_eq!(
            send(&s, "GET", Some("0000000000000001"), ""),
            Reply::Text(404, "unknown session")
        );
        assert_eq!(
            send(&s, "PUT", Some(&sid), ""),
            Reply::Text(405, "use POST, GET or DELETE")
        );
    }
}
