//! What every handler of the server binding checks and how it refuses: the `Accept` and
//! `Content-Type` media types, and the HTTP and JSON-RPC error answers. The handlers
//! ([`app`](super::app), [`session`](super::session), [`get`](super::get)) all use it, and it
//! uses none of them.

use super::net::Request;
use super::sink::Sink;
use crate::binding::server::metrics as server_metrics;
use crate::jsonrpc;
use bytes::{Bytes, BytesMut};

/// Writes an HTTP error whose body is a JSON-RPC error without id (MCP allows this for
/// transport-level refusals), or the given id.
pub async fn http_error(sink: Sink, status: u16, message: &str, id: Option<&str>) {
    let code = match status {
        400 | 406 | 415 => jsonrpc::INVALID_REQUEST,
        404 => jsonrpc::INVALID_REQUEST,
        _ => jsonrpc::INTERNAL_ERROR,
    };
    http_error_code(sink, status, code, message, id).await;
}

/// Like [`http_error`], with the JSON-RPC error code given: a body that is not JSON must
/// be answered -32700 (JSON-RPC 2.0 §5.1), not the -32600 `http_error` picks for a 400.
pub(super) async fn http_error_code(
    sink: Sink,
    status: u16,
    code: i32,
    message: &str,
    id: Option<&str>,
) {
    let mut body = BytesMut::with_capacity(128);
    jsonrpc::write_error(id, code, message, None, &mut body);
    let allow: &[(&str, &[u8])] = if status == 405 {
        &[
            ("content-type", b"application/json"),
            ("allow", b"GET, POST, DELETE"),
        ]
    } else {
        &[("content-type", b"application/json")]
    };
    server_metrics::with(|m| m.http_errors += 1);
    let _ = sink.respond(status, allow, &body).await;
}

/// Writes a JSON-RPC error response (HTTP 200) for a request that was understood.
pub(super) async fn rpc_error(
    sink: Sink,
    id: &str,
    code: i32,
    message: &str,
    session: Option<&str>,
) {
    let mut body = BytesMut::with_capacity(128);
    jsonrpc::write_error(Some(id), code, message, None, &mut body);
    let mut headers: Vec<(&str, &[u8])> = vec![("content-type", b"application/json")];
    if let Some(s) = session {
        headers.push(("mcp-session-id", s.as_bytes()));
    }
    let _ = sink.respond(200, &headers, &body).await;
}

pub(super) fn media_type(value: &[u8]) -> &[u8] {
    let end = value.iter().position(|b| *b == b';').unwrap_or(value.len());
    value.get(..end).unwrap_or_default().trim_ascii()
}

/// True if `Accept` admits both JSON and SSE (wildcards count).
pub(super) fn accepts(req: &Request, json: bool, sse: bool) -> bool {
    let Some(accept) = req.head.headers.get("accept") else {
        return false;
    };
    // What the MCP SDKs send, answered without splitting the list (a byte compare).
    if accept == b"application/json, text/event-stream" {
        return true;
    }
    let (mut j, mut s) = (!json, !sse);
    for item in accept.split(|b| *b == b',') {
        let mt = media_type(item);
        let any = mt.eq_ignore_ascii_case(b"*/*");
        j |= any
            || mt.eq_ignore_ascii_case(b"application/json")
            || mt.eq_ignore_ascii_case(b"application/*");
        s |= any
            || mt.eq_ignore_ascii_case(b"text/event-stream")
            || mt.eq_ignore_ascii_case(b"text/*");
    }
    j && s
}

/// Checks the `Accept` header of a GET event stream.
pub(super) fn accepts_sse(req: &Request) -> bool {
    accepts(req, false, true)
}

/// The agent's `Authorization` header, for exits that forward it.
pub(super) fn authorization(req: &Request) -> Option<Bytes> {
    req.head
        .headers
        .get("authorization")
        .map(Bytes::copy_from_slice)
}
