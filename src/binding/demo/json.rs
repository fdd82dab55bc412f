//! The demo's small JSON toolkit: params in (simd-json over a buffer the demo owns),
//! result bytes out (hand-written, with every piece of outside text escaped).
//!
//! Handlers in the sibling modules read params through [`parse`] and [`Args`] and build
//! their results with [`push_str`] and [`text_result`]; nothing here does I/O.

use crate::limits::LOG_FIELD_BYTES_MAX;
use crate::stream::Reset;
use bytes::Bytes;
use simd_json::BorrowedValue;
use simd_json::prelude::*;
use std::rc::Rc;

/// JSON-RPC: the request is not a valid request object (here: unknown session, bad stream).
pub(super) const INVALID_REQUEST: i32 = -32600;
/// JSON-RPC: invalid method parameters.
pub(super) const INVALID_PARAMS: i32 = -32602;
/// JSON-RPC: internal error (here: a worker bound was hit).
pub(super) const INTERNAL_ERROR: i32 = -32603;
/// MCP: resources/read (or subscribe) of a uri the server does not have.
pub(super) const RESOURCE_NOT_FOUND: i32 = -32002;

/// A JSON-RPC error for one request, sent back as a RESET of its initial direction.
#[derive(Debug)]
pub(super) struct Failure {
    /// The JSON-RPC error code.
    pub code: i32,
    /// The error message (plain text; the edge escapes it).
    pub message: Rc<str>,
    /// Raw JSON for the error's `data`, if any.
    pub data: Option<Bytes>,
}

impl Failure {
    /// An error with `code` and `message` and no data.
    pub fn new(code: i32, message: impl Into<Rc<str>>) -> Failure {
        Failure {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// A `-32602` invalid-params error.
    pub fn invalid_params(message: impl Into<Rc<str>>) -> Failure {
        Failure::new(INVALID_PARAMS, message)
    }

    /// The RESET frame that carries this error to the caller.
    pub fn into_reset(self) -> Reset {
        Reset::Error {
            code: self.code,
            message: self.message,
            data: self.data,
        }
    }
}

/// Parses params the caller copied into `buf` (simd-json rewrites its input in place).
/// Empty params read as an empty object. Returns an invalid-params failure unless the
/// params are a JSON object.
pub(super) fn parse(buf: &mut Vec<u8>) -> Result<BorrowedValue<'_>, Failure> {
    if buf.is_empty() {
        buf.extend_from_slice(b"{}");
    }
    let value = simd_json::to_borrowed_value(buf.as_mut_slice())
        .map_err(|_| Failure::invalid_params("Invalid params: not JSON"))?;
    if value.as_object().is_none() {
        return Err(Failure::invalid_params(
            "Invalid params: expected an object",
        ));
    }
    Ok(value)
}

/// The string member `key` of `params`, falling back to the stream's `target` (which the
/// caller filled from the same member) when params do not name it.
pub(super) fn name_or_target<'v>(
    params: &'v BorrowedValue<'_>,
    key: &str,
    target: Option<&'v str>,
) -> Option<&'v str> {
    params.get(key).and_then(|v| v.as_str()).or(target)
}

/// The optional object member `key` of `params` (`arguments`, `ref`, ...).
#[derive(Clone, Copy)]
pub(super) struct Args<'v, 'b>(Option<&'v BorrowedValue<'b>>);

impl<'v, 'b> Args<'v, 'b> {
    /// The members of `params` itself.
    pub fn whole(params: &'v BorrowedValue<'b>) -> Args<'v, 'b> {
        Args(Some(params))
    }

    /// Reads `params[key]`: absent or `null` gives empty args; a non-object is an
    /// invalid-params failure naming `key`.
    pub fn of(params: &'v BorrowedValue<'b>, key: &str) -> Result<Args<'v, 'b>, Failure> {
        match params.get(key) {
            None => Ok(Args(None)),
            Some(v) if v.is_null() => Ok(Args(None)),
            Some(v) if v.as_object().is_some() => Ok(Args(Some(v))),
            Some(_) => Err(Failure::invalid_params(format!(
                "Invalid params: {key} must be an object"
            ))),
        }
    }

    /// The member `key`, if present.
    pub fn get(&self, key: &str) -> Option<&'v BorrowedValue<'b>> {
        self.0.and_then(|v| v.get(key))
    }

    /// The member `key` if it is a string; `None` when absent or of another type.
    pub fn str(&self, key: &str) -> Option<&'v str> {
        self.get(key).and_then(|v| v.as_str())
    }
}

/// Appends `text` as a JSON string literal: quoted, with `"`, `\` and control characters
/// escaped (RFC 8259 §7). Bytes of multi-byte UTF-8 characters pass through unchanged.
pub(super) fn push_str(out: &mut Vec<u8>, text: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(text.len() + 2);
    out.push(b'"');
    for &byte in text.as_bytes() {
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x00..=0x1f => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(byte >> 4)]);
                out.push(HEX[usize::from(byte & 0xf)]);
            }
            _ => out.push(byte),
        }
    }
    out.push(b'"');
}

/// A tools/call result with one text block; `is_error` marks a tool-level failure
/// (bad arguments) that the agent's model should see, as opposed to a JSON-RPC error.
pub(super) fn text_result(text: &str, is_error: bool) -> Bytes {
    structured_result(text, is_error, None)
}

/// A tools/call result with one text block and, if given, raw `structuredContent` JSON.
pub(super) fn structured_result(text: &str, is_error: bool, structured: Option<&[u8]>) -> Bytes {
    let mut out = Vec::with_capacity(text.len() + 64);
    out.extend_from_slice(br#"{"content":[{"type":"text","text":"#);
    push_str(&mut out, text);
    out.extend_from_slice(b"}]");
    if let Some(structured) = structured {
        out.extend_from_slice(br#","structuredContent":"#);
        out.extend_from_slice(structured);
    }
    out.extend_from_slice(if is_error {
        br#","isError":true}"#
    } else {
        br#","isError":false}"#
    });
    Bytes::from(out)
}

/// `text` cut to at most [`LOG_FIELD_BYTES_MAX`] bytes at a character boundary, so that
/// agent-chosen names echoed into error messages stay bounded.
pub(super) fn clip(text: &str) -> &str {
    if text.len() <= LOG_FIELD_BYTES_MAX {
        return text;
    }
    let mut end = LOG_FIELD_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_str_escapes_what_json_requires() {
        let text = "a\"b\\c\nd\re\tf\u{1}g é ☃";
        let mut out = Vec::new();
        push_str(&mut out, text);
        let back: String = serde_json::from_slice(&out).expect("valid JSON string");
        assert_eq!(back, text);
        let expected = r#""a\"b\\c\nd\re\tf\u0001g é ☃""#;
        assert_eq!(out, expected.as_bytes());
    }

    #[test]
    fn parse_accepts_empty_and_rejects_non_objects() {
        let mut empty = Vec::new();
        assert!(parse(&mut empty).is_ok());
        for bad in [&b"[1]"[..], b"3", b"{", b"\"x\""] {
            let mut buf = bad.to_vec();
            let failure = parse(&mut buf).expect_err("not an object");
            assert_eq!(failure.code, INVALID_PARAMS);
        }
    }

    #[test]
    fn clip_cuts_at_a_char_boundary() {
        let long = "é".repeat(LOG_FIELD_BYTES_MAX);
        let clipped = clip(&long);
        assert!(clipped.len() <= LOG_FIELD_BYTES_MAX);
        assert!(clipped.len() >= LOG_FIELD_BYTES_MAX - 1);
        assert_eq!(clip("short"), "short");
    }
}
