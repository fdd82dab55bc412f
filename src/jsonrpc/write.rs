//! Writers: JSON-RPC envelopes built around ids and payloads that are already JSON.
//!
//! Ids, `result` and `params` are raw lexemes spliced verbatim (the caller got them from
//! [`super::parse_envelope`] or built them itself); only method names and error messages are
//! escaped here. Output has no whitespace and a fixed member order: `jsonrpc`, `id`, then
//! `result` / `error` / `method`, `params`; inside `error`: `code`, `message`, `data`.

use bytes::{BufMut, BytesMut};

/// Appends `{"jsonrpc":"2.0","id":<id>,"result":<result>}`.
pub fn write_result(id: &str, result: &[u8], out: &mut BytesMut) {
    write_result_prefix(id, out);
    out.put_slice(result);
    write_result_suffix(out);
}

/// Appends `{"jsonrpc":"2.0","id":<id>,"result":`; the caller streams the result bytes next
/// and ends with [`write_result_suffix`].
pub fn write_result_prefix(id: &str, out: &mut BytesMut) {
    for part in result_prefix_parts(id) {
        out.put_slice(part);
    }
}

/// What [`write_result_prefix`] appends, as the parts it is made of, for callers that
/// write the response as a list of parts (no buffer of its own to build).
pub fn result_prefix_parts(id: &str) -> [&[u8]; 3] {
    [
        b"{\"jsonrpc\":\"2.0\",\"id\":",
        id.as_bytes(),
        b",\"result\":",
    ]
}

/// Appends the `}` that closes [`write_result_prefix`].
pub fn write_result_suffix(out: &mut BytesMut) {
    out.put_slice(RESULT_SUFFIX);
}

/// What closes a response written with [`write_result_prefix`], for callers that write
/// it as one part among others.
pub const RESULT_SUFFIX: &[u8] = b"}";

/// Appends an error response:
/// `{"jsonrpc":"2.0","id":<id|null>,"error":{"code":<code>,"message":"<message>"[,"data":<data>]}}`.
///
/// `id` is a raw lexeme (`None` writes `null`), `message` is escaped, `data` is raw JSON and
/// its member is written only when given.
pub fn write_error(
    id: Option<&str>,
    code: i32,
    message: &str,
    data: Option<&[u8]>,
    out: &mut BytesMut,
) {
    out.put_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.put_slice(id.unwrap_or("null").as_bytes());
    out.put_slice(b",\"error\":{\"code\":");
    put_i32(code, out);
    out.put_slice(b",\"message\":");
    escape_str(message, out);
    if let Some(data) = data {
        out.put_slice(b",\"data\":");
        out.put_slice(data);
    }
    out.put_slice(b"}}");
}

/// Appends a request: `{"jsonrpc":"2.0","id":<id>,"method":"<method>"[,"params":<params>]}`.
pub fn write_request(id: &str, method: &str, params: Option<&[u8]>, out: &mut BytesMut) {
    out.put_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.put_slice(id.as_bytes());
    put_method_params(method, params, out);
}

/// Appends a notification: `{"jsonrpc":"2.0","method":"<method>"[,"params":<params>]}`.
pub fn write_notification(method: &str, params: Option<&[u8]>, out: &mut BytesMut) {
    out.put_slice(b"{\"jsonrpc\":\"2.0\"");
    put_method_params(method, params, out);
}

/// Appends `s` as a quoted JSON string (RFC 8259 §7).
///
/// `"` and `\` are escaped, as are control characters (`\b \f \n \r \t` in short form, the
/// rest as `\u00XX` with lowercase hex, matching `serde_json`); everything else, non-ASCII
/// included, is copied as UTF-8.
pub fn escape_str(s: &str, out: &mut BytesMut) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.put_u8(b'"');
    let mut rest = s.as_bytes();
    // Each iteration copies a run of plain bytes and escapes the byte after it, so the loop is
    // bounded by the input length.
    while let Some(at) = rest
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
    {
        let (run, tail) = rest.split_at(at);
        out.put_slice(run);
        let Some((&byte, after)) = tail.split_first() else {
            break;
        };
        match byte {
            b'"' => out.put_slice(b"\\\""),
            b'\\' => out.put_slice(b"\\\\"),
            0x08 => out.put_slice(b"\\b"),
            0x0c => out.put_slice(b"\\f"),
            b'\n' => out.put_slice(b"\\n"),
            b'\r' => out.put_slice(b"\\r"),
            b'\t' => out.put_slice(b"\\t"),
            _ => {
                out.put_slice(b"\\u00");
                out.put_u8(HEX[usize::from(byte >> 4)]);
                out.put_u8(HEX[usize::from(byte & 0xf)]);
            }
        }
        rest = after;
    }
    out.put_slice(rest);
    out.put_u8(b'"');
}

/// Appends `,"method":"<method>"[,"params":<params>]}`.
fn put_method_params(method: &str, params: Option<&[u8]>, out: &mut BytesMut) {
    out.put_slice(b",\"method\":");
    escape_str(method, out);
    if let Some(params) = params {
        out.put_slice(b",\"params\":");
        out.put_slice(params);
    }
    out.put_u8(b'}');
}

/// Appends `n` in decimal without allocating.
fn put_i32(n: i32, out: &mut BytesMut) {
    if n < 0 {
        out.put_u8(b'-');
    }
    let mut value = n.unsigned_abs();
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    // u32::MAX has 10 decimal digits, so `at` never underflows.
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.put_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(f: impl FnOnce(&mut BytesMut)) -> String {
        let mut out = BytesMut::new();
        f(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    #[test]
    fn result_exact() {
        let s = written(|out| write_result("\"a\\\"b\"", br#"{"ok":true}"#, out));
        assert_eq!(s, r#"{"jsonrpc":"2.0","id":"a\"b","result":{"ok":true}}"#);
        let s = written(|out| {
            write_result_prefix("7", out);
            out.put_slice(b"[1,");
            out.put_slice(b"2]");
            write_result_suffix(out);
        });
        assert_eq!(s, r#"{"jsonrpc":"2.0","id":7,"result":[1,2]}"#);
    }

    #[test]
    fn error_exact() {
        let s = written(|out| write_error(None, -32700, "Parse error", None, out));
        assert_eq!(
            s,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#
        );
        let s =
            written(|out| write_error(Some("3"), -32602, "bad \"x\"", Some(br#"{"k":[1]}"#), out));
        assert_eq!(
            s,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"bad \"x\"","data":{"k":[1]}}}"#
        );
        for (code, text) in [
            (0, "0"),
            (7, "7"),
            (i32::MIN, "-2147483648"),
            (i32::MAX, "2147483647"),
        ] {
            let s = written(|out| write_error(Some("1"), code, "", None, out));
            assert_eq!(
                s,
                format!(r#"{{"jsonrpc":"2.0","id":1,"error":{{"code":{text},"message":""}}}}"#)
            );
        }
    }

    #[test]
    fn request_and_notification_exact() {
        let s =
            written(|out| write_request("\"r-1\"", "tools/call", Some(br#"{"name":"x"}"#), out));
        assert_eq!(
            s,
            r#"{"jsonrpc":"2.0","id":"r-1","method":"tools/call","params":{"name":"x"}}"#
        );
        let s = written(|out| write_request("1", "ping", None, out));
        assert_eq!(s, r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
        let s = written(|out| {
            write_notification("notifications/cancelled", Some(br#"{"requestId":1}"#), out)
        });
        assert_eq!(
            s,
            r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}"#
        );
        let s = written(|out| write_notification("a\"b", None, out));
        assert_eq!(s, r#"{"jsonrpc":"2.0","method":"a\"b"}"#);
    }

    #[test]
    fn escape_exact() {
        let cases = [
            ("", r#""""#),
            ("plain", r#""plain""#),
            ("q\"b\\s/", r#""q\"b\\s/""#),
            ("\u{8}\u{c}\n\r\t", r#""\b\f\n\r\t""#),
            ("\u{0}\u{1}\u{1f}\u{7f}", "\"\\u0000\\u0001\\u001f\u{7f}\""),
            ("é€😀\u{2028}", "\"é€😀\u{2028}\""),
        ];
        for (input, want) in cases {
            assert_eq!(
                written(|out| escape_str(input, out)),
                want,
                "input {input:?}"
            );
        }
    }

    #[test]
    fn escape_matches_serde_json_on_every_char_class() {
        let mut all = String::new();
        for c in (0u32..0x300).filter_map(char::from_u32) {
            all.push(c);
        }
        all.push_str("\u{2028}\u{fffd}😀");
        let want = serde_json::to_string(&all).unwrap_or_default();
        assert_eq!(written(|out| escape_str(&all, out)), want);
    }

    #[test]
    fn written_envelopes_parse_back() {
        let mut out = BytesMut::new();
        write_error(
            Some("\"e\""),
            -32601,
            "Method not found: \u{1}x",
            None,
            &mut out,
        );
        let env = super::super::parse_envelope(&out);
        assert_eq!(
            env.map(|e| (e.kind, e.id.map(|id| id.raw.to_owned()))),
            Ok((super::super::Kind::ErrorResponse, Some("\"e\"".to_owned())))
        );
    }
}
