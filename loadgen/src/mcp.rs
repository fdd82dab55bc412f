//! The MCP messages the generator sends and the checks it applies to what comes back.
//!
//! Bodies are written with mcpyard's JSON-RPC writers into a reused buffer; responses are
//! read with its envelope peek, whether they arrive as JSON or as an SSE stream (in which
//! case notifications before the response are counted).

use bytes::{BufMut, BytesMut};
use mcpyard::jsonrpc::{
    IdKey, Kind, escape_str, parse_envelope, write_notification, write_request,
};
use mcpyard::sse::Decoder;

use crate::client::{BodyKind, PROTOCOL_VERSION, Response};
use crate::record::{ErrorKind, Failure, Served};

/// The pattern repeated to fill generated `text` arguments.
const FILL_PATTERN: &[u8] = b"mcpyard-loadgen-";

/// Appends the `initialize` request with id `id`.
pub fn initialize(id: u64, out: &mut BytesMut) {
    let params = format!(
        r#"{{"protocolVersion":"{PROTOCOL_VERSION}","capabilities":{{}},"clientInfo":{{"name":"mcpyard-loadgen","version":"{}"}}}}"#,
        env!("CARGO_PKG_VERSION")
    );
    write_request(&id.to_string(), "initialize", Some(params.as_bytes()), out);
}

/// Appends the `notifications/initialized` notification.
pub fn initialized(out: &mut BytesMut) {
    write_notification("notifications/initialized", None, out);
}

/// Appends a request with no params (`tools/list`, `ping`).
pub fn bare_request(id: u64, method: &str, out: &mut BytesMut) {
    write_request(&id.to_string(), method, None, out);
}

/// A `tools/call` whose params are rendered once and reused for every request.
#[derive(Clone, Debug)]
pub struct ToolsCall {
    /// `"name":...,"arguments":...` without braces, so a `_meta` member can be put first.
    members: Vec<u8>,
}

impl ToolsCall {
    /// Prepares calls of `tool` with `args_json` (a JSON object) or, when that is `None`, a
    /// `text` argument of `params_bytes` bytes of a repeated ASCII pattern.
    pub fn new(tool: &str, args_json: Option<&str>, params_bytes: usize) -> ToolsCall {
        let mut members = BytesMut::new();
        members.put_slice(b"\"name\":");
        escape_str(tool, &mut members);
        members.put_slice(b",\"arguments\":");
        match args_json {
            Some(args) => members.put_slice(args.as_bytes()),
            None => {
                members.put_slice(b"{\"text\":\"");
                members.put_slice(&fill(params_bytes));
                members.put_slice(b"\"}");
            }
        }
        ToolsCall {
            members: members.to_vec(),
        }
    }

    /// Appends the request with id `id`; with `progress` the params carry
    /// `_meta.progressToken` equal to the id, so progress notifications can be matched.
    ///
    /// Written in place (the same bytes `write_request` would produce), so a request costs
    /// no allocation beyond the caller's reused buffer.
    pub fn encode(&self, id: u64, progress: bool, out: &mut BytesMut) {
        out.put_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
        put_u64(id, out);
        out.put_slice(b",\"method\":\"tools/call\",\"params\":{");
        if progress {
            out.put_slice(b"\"_meta\":{\"progressToken\":");
            put_u64(id, out);
            out.put_slice(b"},");
        }
        out.put_slice(&self.members);
        out.put_slice(b"}}");
    }
}

/// Appends `n` in decimal without allocating.
fn put_u64(n: u64, out: &mut BytesMut) {
    use std::io::Write as _;
    // Writing to a BytesMut grows it and cannot fail.
    let _ = write!(out.writer(), "{n}");
}

/// Returns `len` bytes of the repeated fill pattern (valid inside a JSON string).
pub fn fill(len: usize) -> Vec<u8> {
    FILL_PATTERN.iter().copied().cycle().take(len).collect()
}

/// Checks that `response` is a 2xx carrying the JSON-RPC result of request `id`, as JSON or
/// as an SSE stream; returns how many notifications preceded it.
pub fn expect_result(response: &Response, id: u64, method: &str) -> Result<Served, Failure> {
    expect_status(response, 200, method)?;
    match response.kind {
        BodyKind::Json => check_reply(&response.body, id, method).map(|_| Served::default()),
        BodyKind::EventStream => expect_result_in_stream(response, id, method),
        BodyKind::Other => Err(Failure::new(
            ErrorKind::Decode,
            format!("{method}: answer is neither application/json nor text/event-stream"),
        )),
    }
}

/// Checks the status of a response: `expected` exactly, or any 2xx when `expected` is 0.
pub fn expect_status(response: &Response, expected: u16, what: &str) -> Result<(), Failure> {
    let ok = if expected == 0 {
        (200..300).contains(&response.status)
    } else {
        response.status == expected
    };
    if ok {
        return Ok(());
    }
    let expected = if expected == 0 {
        "2xx".to_owned()
    } else {
        expected.to_string()
    };
    Err(Failure::new(
        ErrorKind::HttpStatus,
        format!("{what}: http {} (expected {expected})", response.status),
    ))
}

fn expect_result_in_stream(response: &Response, id: u64, method: &str) -> Result<Served, Failure> {
    let mut decoder = Decoder::new();
    let mut buf = BytesMut::from(&response.body[..]);
    let mut served = Served::default();
    // Each message consumes at least one line of `buf`, so this ends with the body.
    while let Some(message) = decoder.decode(&mut buf).map_err(|e| {
        Failure::new(
            ErrorKind::Decode,
            format!("{method}: bad event stream: {e}"),
        )
    })? {
        let Some(data) = message.data.filter(|d| !d.is_empty()) else {
            continue; // priming events and retry hints carry no message
        };
        if check_reply(&data, id, method)? {
            return Ok(served);
        }
        served.notifications += 1;
    }
    Err(Failure::new(
        ErrorKind::Decode,
        format!("{method}: event stream ended without the response"),
    ))
}

/// Reads one JSON-RPC message: `Ok(true)` if it is the result of `id`, `Ok(false)` if it is
/// something else that may precede it (a notification or a server request), and a
/// failure for an error response or a reply to another id.
fn check_reply(body: &[u8], id: u64, method: &str) -> Result<bool, Failure> {
    let envelope = parse_envelope(body).map_err(|e| {
        Failure::new(
            ErrorKind::Decode,
            format!("{method}: not a JSON-RPC message: {e}"),
        )
    })?;
    let is_ours = envelope
        .id
        .is_some_and(|got| i64::try_from(id).is_ok_and(|id| got.key() == IdKey::Int(id)));
    match envelope.kind {
        Kind::Notification | Kind::Request => Ok(false),
        Kind::Response if is_ours => Ok(true),
        Kind::ErrorResponse => Err(Failure::new(
            ErrorKind::JsonRpc,
            format!(
                "{method}: error {}",
                envelope.error.map_or("(none)", |e| e.get())
            ),
        )),
        Kind::Response => Err(Failure::new(
            ErrorKind::Decode,
            format!("{method}: response to another id"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn response(kind: BodyKind, body: &str) -> Response {
        Response {
            arrived: None,
            status: 200,
            kind,
            session: None,
            keep_alive: true,
            body: Bytes::copy_from_slice(body.as_bytes()),
        }
    }

    #[test]
    fn tools_call_bodies_are_valid_json_with_the_requested_size() {
        let call = ToolsCall::new("echo", None, 40);
        let mut out = BytesMut::new();
        call.encode(7, true, &mut out);
        let v: serde_json::Value =
            serde_json::from_slice(&out).unwrap_or_else(|e| panic!("invalid json: {e}"));
        assert_eq!(v["id"], 7);
        assert_eq!(v["params"]["_meta"]["progressToken"], 7);
        assert_eq!(v["params"]["name"], "echo");
        assert_eq!(
            v["params"]["arguments"]["text"].as_str().map(str::len),
            Some(40)
        );
    }

    #[test]
    fn json_results_match_the_id() {
        let ok = response(BodyKind::Json, r#"{"jsonrpc":"2.0","id":3,"result":{}}"#);
        assert_eq!(expect_result(&ok, 3, "ping"), Ok(Served::default()));
        let other = expect_result(&ok, 4, "ping").map_err(|f| f.kind);
        assert_eq!(other, Err(ErrorKind::Decode));
        let err = response(
            BodyKind::Json,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"Method not found"}}"#,
        );
        assert_eq!(
            expect_result(&err, 3, "x").map_err(|f| f.kind),
            Err(ErrorKind::JsonRpc)
        );
        let html = response(BodyKind::Other, "<html>");
        assert_eq!(
            expect_result(&html, 3, "x").map_err(|f| f.kind),
            Err(ErrorKind::Decode)
        );
    }

    #[test]
    fn event_streams_count_notifications_before_the_result() {
        let body = "id: 1\ndata: \n\n\
            data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":9,\"progress\":1}}\n\n\
            data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":9,\"progress\":2}}\n\n\
            data: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{}}\n\n";
        let got = expect_result(&response(BodyKind::EventStream, body), 9, "tools/call");
        assert_eq!(
            got,
            Ok(Served {
                notifications: 2,
                lead: 0
            })
        );
        let cut = "data: {\"jsonrpc\":\"2.0\",\"method\":\"x\"}\n\n";
        let got = expect_result(&response(BodyKind::EventStream, cut), 9, "tools/call");
        assert_eq!(got.map_err(|f| f.kind), Err(ErrorKind::Decode));
    }

    #[test]
    fn non_2xx_is_an_http_status_failure() {
        let mut r = response(BodyKind::Json, "{}");
        r.status = 404;
        assert_eq!(
            expect_result(&r, 1, "x").map_err(|f| f.kind),
            Err(ErrorKind::HttpStatus)
        );
    }
}
