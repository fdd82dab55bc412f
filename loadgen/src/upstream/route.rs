//! The fixture's MCP behaviour, sans-IO: a decoded request in, a [`Reply`] plan out.
//!
//! Follows MCP 2025-11-25 Streamable HTTP ("Transports" and "Lifecycle"): `initialize`
//! creates a session named in `mcp-session-id`; every other request must carry a live one
//! (400 without the header, 404 for an unknown id); notifications and responses get 202;
//! GET opens the session's event stream; DELETE ends the session. tools/list answers a
//! page of `tools.rs`'s catalogue and tools/call answers only the tools listed there.
//! `conn.rs` turns the plan into bytes and timers.

use std::borrow::Cow;
use std::time::Duration;

use bytes::Bytes;
use mcpyard::http::{Method, RequestHead};
use mcpyard::jsonrpc::{
    Envelope, INVALID_PARAMS, Kind, METHOD_NOT_FOUND, param_raw, param_str, parse_envelope,
    progress_token, raw_is_object,
};

use super::state::{ECHOED_VERSIONS, HEADER_VERSIONS, LATEST_VERSION, Shared};
use crate::limits::FIXTURE_ECHOED_NAME_BYTES_MAX;

/// The path that triggers list_changed on every open GET stream (no session needed).
pub const LIST_CHANGED_PATH: &str = "/control/list_changed";

/// The path that moves the tool catalogue to its next revision, then triggers list_changed
/// on every open GET stream (no session needed).
pub const TOOLS_CHANGED_PATH: &str = "/control/tools_changed";

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
        /// A fixed message, or one naming what was wrong (an unknown tool); unescaped.
        message: Cow<'static, str>,
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
            (Method::Post, TOOLS_CHANGED_PATH) => Reply::Triggered(shared.trigger_tools_changed()),
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
                    message: Cow::Borrowed(err.message),
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
        Some("tools/list") => tools_list(shared, &envelope, id.clone()),
        Some("tools/call") => tools_call(shared, &envelope, id.clone()),
        _ => message(
            200,
            Message::Error {
                id: Some(id.clone()),
                code: METHOD_NOT_FOUND,
                message: Cow::Borrowed("Method not found"),
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

/// Answers tools/list with the page `params.cursor` names (the first without one).
fn tools_list(shared: &Shared, envelope: &Envelope<'_>, id: String) -> Reply {
    let tools = shared.tools.load();
    let page = match envelope.params {
        None => Ok(tools.first_page()),
        Some(params) if !raw_is_object(params) => Err("Invalid params"),
        // MCP Pagination: an absent (or null) cursor asks for the first page.
        Some(params) => match param_raw(params, "cursor") {
            None => Ok(tools.first_page()),
            Some(cursor) if cursor.get() == "null" => Ok(tools.first_page()),
            // MCP Pagination: an invalid cursor SHOULD be -32602 (Invalid params).
            Some(_) => match param_str(params, "cursor") {
                Ok(Some(cursor)) => tools.page(&cursor).ok_or("Invalid cursor"),
                Ok(None) | Err(_) => Err("Invalid cursor"),
            },
        },
    };
    let answer = match page {
        Ok(page) => Message::Result {
            id,
            result: page.clone(),
        },
        Err(refusal) => Message::Error {
            id: Some(id),
            code: INVALID_PARAMS,
            message: Cow::Borrowed(refusal),
        },
    };
    message(200, answer, shared.args.sse)
}

fn tools_call(shared: &Shared, envelope: &Envelope<'_>, id: String) -> Reply {
    let params = envelope.params;
    let refusal = match params.map(|p| param_str(p, "name")) {
        // Borrowed unless the name had escapes: a known name costs no allocation.
        Some(Ok(Some(name))) if shared.tools.load().contains(&name) => None,
        Some(Ok(Some(name))) => Some(Cow::Owned(format!("Unknown tool: {}", clip(&name)))),
        // No name, or params or name of the wrong type.
        Some(Ok(None) | Err(_)) | None => Some(Cow::Borrowed("Invalid params")),
    };
    if let Some(refusal) = refusal {
        let error = Message::Error {
            id: Some(id),
            code: INVALID_PARAMS,
            message: refusal,
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

/// `name` cut to at most `FIXTURE_ECHOED_NAME_BYTES_MAX` bytes at a char boundary.
fn clip(name: &str) -> &str {
    // At most 3 steps back: a UTF-8 char is at most 4 bytes.
    let end = (0..=FIXTURE_ECHOED_NAME_BYTES_MAX.min(name.len()))
        .rev()
        .find(|&end| name.is_char_boundary(end))
        .unwrap_or(0);
    name.get(..end).unwrap_or_default()
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
    use crate::upstream::state::{for_tests, for_tests_with_tools};
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

    /// The result bytes of a reply, or its error (code, message).
    fn outcome(reply: &Reply) -> Result<serde_json::Value, (i32, String)> {
        match reply {
            Reply::Message {
                message: Message::Result { result, .. },
                ..
            } => Ok(serde_json::from_slice(result).unwrap_or_else(|e| panic!("{e}"))),
            Reply::Message {
                message: Message::Error { code, message, .. },
                ..
            } => Err((*code, message.to_string())),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tools_list_follows_cursors_and_refuses_unknown_ones() {
        let s = for_tests_with_tools(5, 2);
        let sid = session_of(&send(&s, "POST", None, INIT));
        let list = |params: &str| {
            let body = format!(r#"{{"jsonrpc":"2.0","id":3,"method":"tools/list"{params}}}"#);
            outcome(&send(&s, "POST", Some(&sid), &body))
        };
        let mut names = Vec::new();
        let mut page = list("");
        for _ in 0..3 {
            let v = page.unwrap_or_else(|e| panic!("{e:?}"));
            let tools = v["tools"].as_array().cloned().unwrap_or_default();
            names.extend(
                tools
                    .iter()
                    .filter_map(|t| t["name"].as_str().map(str::to_owned)),
            );
            let Some(cursor) = v["nextCursor"].as_str() else {
                break;
            };
            page = list(&format!(r#","params":{{"cursor":"{cursor}"}}"#));
        }
        assert_eq!(
            names,
            ["echo", "big", "tool_00003", "tool_00004", "tool_00005"]
        );
        assert_eq!(list(r#","params":{}"#), list(""));
        assert_eq!(list(r#","params":{"cursor":null}"#), list(""));
        let invalid = Err((INVALID_PARAMS, "Invalid cursor".to_owned()));
        for cursor in [r#""nope""#, r#""offset-3""#, r#""offset-6""#, "2", "{}"] {
            assert_eq!(
                list(&format!(r#","params":{{"cursor":{cursor}}}"#)),
                invalid,
                "{cursor}"
            );
        }
        let unpaged = for_tests(10, 0, false);
        let sid = session_of(&send(&unpaged, "POST", None, INIT));
        let body =
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"cursor":"offset-2"}}"#;
        assert_eq!(outcome(&send(&unpaged, "POST", Some(&sid), body)), invalid);
    }

    #[test]
    fn tools_changed_revises_the_list_and_signals_the_streams() {
        let s = for_tests_with_tools(5, 2);
        let sid = session_of(&send(&s, "POST", None, INIT));
        let first_page = || {
            let body = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
            outcome(&send(&s, "POST", Some(&sid), body)).unwrap_or_else(|e| panic!("{e:?}"))
        };
        let before = first_page();
        let mut streams = s.list_changed.subscribe();
        let trigger = |path: &str| {
            let raw = format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n");
            let mut buf = BytesMut::from(raw.as_bytes());
            let mut decoder = RequestDecoder::new(1 << 20);
            match decoder.decode(&mut buf) {
                Ok(Some(RequestEvent::Head(head))) => route(&s, &head, b""),
                other => panic!("{other:?}"),
            }
        };
        // No GET stream is open, so none was told; the catalogue moved on regardless.
        assert_eq!(trigger(TOOLS_CHANGED_PATH), Reply::Triggered(0));
        assert_eq!(
            streams.has_changed().ok(),
            Some(true),
            "streams were signalled"
        );
        streams.mark_unchanged();
        let after = first_page();
        assert_ne!(after, before, "the list's content changed");
        assert_eq!(
            after["tools"][0]["description"],
            "Returns the fixture's payload (revision 1)"
        );
        assert_eq!(after["tools"][1], before["tools"][1]);
        assert_eq!(after["nextCursor"], before["nextCursor"]);
        // list_changed alone signals the streams and changes nothing.
        assert_eq!(trigger(LIST_CHANGED_PATH), Reply::Triggered(0));
        assert_eq!(streams.has_changed().ok(), Some(true));
        assert_eq!(first_page(), after);
        assert_eq!(trigger(TOOLS_CHANGED_PATH), Reply::Triggered(0));
        assert_eq!(
            first_page()["tools"][0]["description"],
            "Returns the fixture's payload (revision 2)"
        );
        assert_eq!(
            trigger("/control/nothing"),
            Reply::Text(404, "no such control")
        );
    }

    #[test]
    fn tools_call_names_an_unknown_tool_in_its_error() {
        let s = for_tests_with_tools(4, 0);
        let sid = session_of(&send(&s, "POST", None, INIT));
        let call = |name: &str| {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":{name},"arguments":{{}}}}}}"#
            );
            send(&s, "POST", Some(&sid), &body)
        };
        let known = call(r#""tool_00004""#);
        let echo = call(r#""echo""#);
        assert_eq!(known, echo, "every known tool answers the same result");
        assert!(outcome(&known).is_ok());
        assert_eq!(
            outcome(&call(r#""tool_00005""#)),
            Err((INVALID_PARAMS, "Unknown tool: tool_00005".to_owned()))
        );
        // An escaped name is decoded, then escaped again when the error is written.
        let reply = call(r#""a\"b\\c\n\u00e9""#);
        let Reply::Message {
            message: Message::Error { id, code, message },
            ..
        } = &reply
        else {
            panic!("{reply:?}");
        };
        assert_eq!(message, "Unknown tool: a\"b\\c\né");
        let mut wire = BytesMut::new();
        mcpyard::jsonrpc::write_error(id.as_deref(), *code, message, None, &mut wire);
        let v: serde_json::Value =
            serde_json::from_slice(&wire).unwrap_or_else(|e| panic!("{e}: {wire:?}"));
        assert_eq!(v["error"]["message"], "Unknown tool: a\"b\\c\né");
        // A huge name is cut, so the error stays small.
        let long = format!(r#""{}""#, "é".repeat(1000));
        let Err((_, message)) = outcome(&call(&long)) else {
            panic!("a long unknown name is refused");
        };
        assert!(message.len() <= "Unknown tool: ".len() + FIXTURE_ECHOED_NAME_BYTES_MAX);
        assert!(message.len() >= "Unknown tool: ".len() + FIXTURE_ECHOED_NAME_BYTES_MAX - 1);
        for params in [r#"{}"#, r#"{"name":3}"#, "[]"] {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{params}}}"#);
            assert_eq!(
                outcome(&send(&s, "POST", Some(&sid), &body)),
                Err((INVALID_PARAMS, "Invalid params".to_owned())),
                "{params}"
            );
        }
        let one = for_tests_with_tools(1, 0);
        let sid = session_of(&send(&one, "POST", None, INIT));
        let big = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"big"}}"#;
        assert_eq!(
            outcome(&send(&one, "POST", Some(&sid), big)),
            Err((INVALID_PARAMS, "Unknown tool: big".to_owned()))
        );
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
