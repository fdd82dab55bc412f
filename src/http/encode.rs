//! Encoders: request and response heads, chunks, and canned error responses.
//!
//! Everything appends to a caller-owned `BytesMut` and allocates nothing else: numbers are
//! formatted on the stack. Header names and values are written exactly as passed, after one
//! check where they are written: a head is the one place where a stray CR or LF turns data
//! into structure (a header of its own, or a second request on a shared connection), so a
//! method that is not a token, a target with a space or a control byte, or a value with a
//! control byte other than HTAB refuses the whole head ([`HeadError`]) and nothing is
//! written. Values that came from outside (an agent's `Last-Event-ID`, an upstream's
//! challenge or session id) are therefore safe here whatever path brought them. Header
//! names are `&'static str`: mcpyard's own constants, never outside bytes.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};

use super::BodyFraming;
use super::error::HttpError;

/// Digits in the longest `u64`, decimal (20) or hexadecimal (16).
const U64_DIGITS_MAX: usize = 20;

/// Largest piece `put_bulk` copies with one `memcpy` call.
///
/// glibc's x86-64 `memcpy` switches to `rep movsb` at 4 KiB (2 KiB x VEC_SIZE/16 with AVX2),
/// and on the AMD EPYC machines we measure on, `rep movsb` runs about 17 times slower
/// (32 KiB: 11 µs instead of 0.65 µs) when the destination sits 1 to ~32 bytes above the
/// source modulo 4096 (4K aliasing). A 32 KiB chunk written after its 6-byte size line hits
/// that whenever the two buffers are laid out back to back, as in `bench/codecs.rs`. Pieces
/// below the threshold take glibc's vector loop, which is as fast in every layout; each
/// extra call costs a few dozen instructions per 2 KiB.
const COPY_PIECE_BYTES: usize = 2 * 1024;

/// Why a head was not written: a piece that would change the message's structure.
///
/// The header name in `Value` is one of mcpyard's own constants, safe to log and show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// The method is not an RFC 9110 token.
    Method,
    /// The request target is empty or holds a space or a control byte.
    Target,
    /// The value of this header holds a control byte other than HTAB (CR, LF, NUL, ...).
    Value(&'static str),
}

impl fmt::Display for HeadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeadError::Method => f.write_str("request method is not a token"),
            HeadError::Target => f.write_str("request target holds a space or a control byte"),
            HeadError::Value(name) => write!(f, "value of header {name} holds a control byte"),
        }
    }
}

impl std::error::Error for HeadError {}

/// True if `value` may be written as a field value: no control byte but HTAB (RFC 9110
/// §5.5: CR, LF and NUL are never allowed, the other controls are not `field-vchar`s).
/// Bytes 0x80 and above (obs-text) pass, as the decoders accept them.
///
/// Every head mcpyard writes runs its values through this, so it looks at eight bytes at a
/// time: two word-wide tests say whether any byte is below 0x20 or is 0x7f (exact as to
/// whether, not which), and only a value where one fires (in practice one with a tab) is
/// looked at byte by byte.
pub fn field_value_ok(value: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let byte_ok = |b: &u8| (*b >= 0x20 && *b != 0x7f) || *b == b'\t';
    let mut words = value.chunks_exact(8);
    let mut suspect = 0u64;
    for word in &mut words {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        let x = u64::from_ne_bytes(bytes);
        // Some byte below 0x20 (bytes of 0x80 and above are masked out by `!x`) ...
        suspect |= x.wrapping_sub(0x20 * ONES) & !x & HIGH;
        // ... or some byte equal to 0x7f (a zero byte of x ^ 0x7f7f…).
        let y = x ^ (0x7f * ONES);
        suspect |= y.wrapping_sub(ONES) & !y & HIGH;
    }
    if suspect == 0 {
        return words.remainder().iter().all(byte_ok);
    }
    value.iter().all(byte_ok)
}

/// True if `value`, written as a header value, reads back unchanged on the other side: not
/// empty, a valid field value ([`field_value_ok`]), and no SP or HTAB at either end (HTTP
/// trims those). An id sent back to its source in a header (`Last-Event-ID`) must pass.
pub fn field_value_round_trips(value: &[u8]) -> bool {
    let edge = |b: Option<&u8>| matches!(b, Some(b' ' | b'\t'));
    !value.is_empty() && field_value_ok(value) && !edge(value.first()) && !edge(value.last())
}

/// RFC 9110 `tchar`s, by byte.
const TCHAR: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
                b'!' | b'#'
                    | b'$'
                    | b'%'
                    | b'&'
                    | b'\''
                    | b'*'
                    | b'+'
                    | b'-'
                    | b'.'
                    | b'^'
                    | b'_'
                    | b'`'
                    | b'|'
                    | b'~'
            );
        b += 1;
    }
    table
};

/// True for an RFC 9110 `token` (methods, header names): one or more `tchar`s.
pub fn token_ok(text: &[u8]) -> bool {
    !text.is_empty() && text.iter().all(|&b| TCHAR[usize::from(b)])
}
/// True for a request target we may write: visible ASCII or obs-text, no space, not empty.
fn target_ok(target: &[u8]) -> bool {
    !target.is_empty() && target.iter().all(|&b| b > 0x20 && b != 0x7f)
}

/// Checks every header value of a head before any of it is written. Names are `'static`:
/// mcpyard's own constants, never outside bytes, so their check is an invariant (one the
/// tests run, at a cost of about 4 instructions a byte that the release build skips on
/// every head).
fn check_fields(headers: &[(&'static str, &[u8])]) -> Result<(), HeadError> {
    for (name, value) in headers {
        debug_assert!(
            token_ok(name.as_bytes()),
            "header name {name:?} is not a token"
        );
        if !field_value_ok(value) {
            return Err(HeadError::Value(name));
        }
    }
    Ok(())
}
/// Returns the standard reason phrase for `status` (RFC 9110 §15), or `""` if it has none;
/// an empty reason phrase is valid (RFC 9112 §4).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        422 => "Unprocessable Content",
        426 => "Upgrade Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// Writes `HTTP/1.1 <status> <reason>\r\n`, the headers, the framing header and the blank
/// line.
///
/// The framing header is `content-length: N` for `Length(N)` and
/// `transfer-encoding: chunked` for `Chunked`; `None` and `CloseDelimited` write none. Pass
/// `Length(0)` for an empty body: `None` suits only 1xx, 204, 304 and HEAD responses, since
/// any other response without framing is read until close (RFC 9112 §6.3).
///
/// `Err` (nothing written) if a header name or value fails the check in the module doc.
pub fn encode_response_head(
    status: u16,
    headers: &[(&'static str, &[u8])],
    body: BodyFraming,
    out: &mut BytesMut,
) -> Result<(), HeadError> {
    check_fields(headers)?;
    let mut digits = Digits::new();
    let status_digits = digits.format(u64::from(status), 10);
    let reason = reason_phrase(status).as_bytes();
    let start_line: [&[u8]; 5] = [b"HTTP/1.1 ", status_digits, b" ", reason, b"\r\n"];
    put_head(&start_line, headers, body, out);
    Ok(())
}

/// Writes `<method> <target> HTTP/1.1\r\n`, the headers, the framing header and the blank
/// line.
///
/// Framing is written as for [`encode_response_head`]; a request has no close-delimited
/// body, so `CloseDelimited` writes nothing, like `None`. The caller supplies `host`.
///
/// `Err` (nothing written) if the method, the target or a header fails the check in the
/// module doc.
pub fn encode_request_head(
    method: &str,
    target: &str,
    headers: &[(&'static str, &[u8])],
    body: BodyFraming,
    out: &mut BytesMut,
) -> Result<(), HeadError> {
    if !token_ok(method.as_bytes()) {
        return Err(HeadError::Method);
    }
    if !target_ok(target.as_bytes()) {
        return Err(HeadError::Target);
    }
    check_fields(headers)?;
    let start_line: [&[u8]; 4] = [method.as_bytes(), b" ", target.as_bytes(), b" HTTP/1.1\r\n"];
    put_head(&start_line, headers, body, out);
    Ok(())
}

/// The fields part of a response head, for a template: what [`encode_response_head`]
/// writes for `status` and `headers` up to (not including) the framing and the empty line.
/// Checked as that function checks; complete it with [`put_content_length`] (after any
/// further field lines, each `name: value\r\n`, that the caller knows to be valid).
pub fn response_head_fields(
    status: u16,
    headers: &[(&'static str, &[u8])],
) -> Result<Bytes, HeadError> {
    let mut out = BytesMut::with_capacity(128);
    encode_response_head(status, headers, BodyFraming::None, &mut out)?;
    assert!(out.ends_with(b"\r\n\r\n"));
    out.truncate(out.len() - 2);
    Ok(out.freeze())
}

/// Ends a head whose fields are written (a template's fixed part) with the framing of a
/// body of `length` bytes and the empty line: what [`encode_request_head`] writes after its
/// fields for `BodyFraming::Length(length)`.
pub fn put_content_length(length: u64, out: &mut BytesMut) {
    let mut digits = Digits::new();
    for piece in content_length_pieces(&mut digits, length) {
        out.put_slice(piece);
    }
}

/// How many bytes [`put_content_length`] appends for `length`.
pub fn content_length_bytes(length: u64) -> usize {
    let mut digits = Digits::new();
    content_length_pieces(&mut digits, length)
        .iter()
        .map(|p| p.len())
        .sum()
}

fn content_length_pieces(digits: &mut Digits, length: u64) -> [&[u8]; 3] {
    [b"content-length: ", digits.format(length, 10), b"\r\n\r\n"]
}

/// Writes one chunk, `<hex size>\r\n<data>\r\n` (RFC 9112 §7.1). Writes nothing for empty
/// `data`, since an empty chunk would end the body.
pub fn encode_chunk(data: &[u8], out: &mut BytesMut) {
    encode_chunk_of([data], out);
}

/// Writes one chunk holding `parts` back to back (one size line for all of them), so
/// pieces that arrived separately leave in one chunk and one write. Writes nothing when
/// the parts are all empty.
pub fn encode_chunk_of<'a, I>(parts: I, out: &mut BytesMut)
where
    I: IntoIterator<Item = &'a [u8]>,
    I::IntoIter: Clone,
{
    let parts = parts.into_iter();
    let len: usize = parts.clone().map(<[u8]>::len).sum();
    if len == 0 {
        return;
    }
    // One reservation for the whole chunk: the size line, the data and the CRLF after it,
    // plus room for a last chunk, so ending the body right after never regrows the buffer.
    out.reserve(CHUNK_FRAMING_MAX + len + LAST_CHUNK_BYTES);
    encode_chunk_size(len as u64, out);
    for part in parts {
        put_bulk(part, out);
    }
    out.put_slice(b"\r\n");
}

/// Writes a chunk's size line, `<hex size>\r\n`: the caller writes the `size` bytes of
/// data after it and then `\r\n` (RFC 9112 §7.1), when the data goes to the socket
/// without being copied behind the size line.
pub fn encode_chunk_size(size: u64, out: &mut BytesMut) {
    put_hex(size, out);
    out.put_slice(b"\r\n");
}

/// Appends `data`, which may be large, in pieces of at most `COPY_PIECE_BYTES` so that no
/// single copy takes glibc's `rep movsb` path (see `COPY_PIECE_BYTES`). The caller reserves.
pub fn put_bulk(data: &[u8], out: &mut BytesMut) {
    for piece in data.chunks(COPY_PIECE_BYTES) {
        out.put_slice(piece);
    }
}

/// Writes the last chunk and an empty trailer section, `0\r\n\r\n`, ending a chunked body.
pub fn encode_last_chunk(out: &mut BytesMut) {
    out.put_slice(LAST_CHUNK);
}

/// The last chunk with an empty trailer section.
const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// Bytes of [`encode_last_chunk`]'s output.
pub const LAST_CHUNK_BYTES: usize = LAST_CHUNK.len();

/// Bytes a chunk adds around its data at most: the size line and the CRLF after the data.
pub const CHUNK_FRAMING_MAX: usize = U64_DIGITS_MAX + 4;

/// Writes a complete response for a decode error: the status line, `content-type:
/// text/plain`, `connection: close`, `content-length`, and a one-line body naming the
/// problem, such as `header fields too large\n`. The caller closes the connection after
/// sending it, as the error left the stream's framing unknown.
pub fn encode_error_response(err: &HttpError, out: &mut BytesMut) {
    let detail = err.detail().as_bytes();
    let body_bytes = detail.len() as u64 + 1;
    // Constant headers only: the check cannot refuse them.
    let headers: [(&str, &[u8]); 2] = [("content-type", b"text/plain"), ("connection", b"close")];
    let written =
        encode_response_head(err.status(), &headers, BodyFraming::Length(body_bytes), out);
    assert!(written.is_ok());
    out.put_slice(detail);
    out.put_u8(b'\n');
}

/// Writes a head: the start line given as pieces, the header lines, the framing header and
/// the blank line that ends the head.
///
/// A head is a dozen or more small pieces, and appending each with `put_slice` costs a
/// capacity check and a `memcpy` call apiece. So the head's length is summed first, the
/// buffer grown once, and the pieces copied into that space (constant separators compile
/// to plain stores).
fn put_head(
    start_line: &[&[u8]],
    headers: &[(&'static str, &[u8])],
    body: BodyFraming,
    out: &mut BytesMut,
) {
    let mut digits = Digits::new();
    let framing: [&[u8]; 3] = match body {
        BodyFraming::Length(length) => [b"content-length: ", digits.format(length, 10), b"\r\n"],
        BodyFraming::Chunked => [b"transfer-encoding: chunked\r\n", b"", b""],
        BodyFraming::None | BodyFraming::CloseDelimited => [b""; 3],
    };
    let pieces_bytes = |pieces: &[&[u8]]| pieces.iter().map(|piece| piece.len()).sum::<usize>();
    let field_bytes: usize = headers
        .iter()
        .map(|(name, value)| name.len() + value.len() + FIELD_SEPARATORS_BYTES)
        .sum();
    let head_bytes = pieces_bytes(start_line) + field_bytes + pieces_bytes(&framing) + 2;
    let start = out.len();
    out.resize(start + head_bytes, 0);
    let mut head = Filler::new(out.get_mut(start..).unwrap_or_default());
    for piece in start_line {
        head.put(piece);
    }
    for (name, value) in headers {
        head.put(name.as_bytes());
        head.put(b": ");
        head.put(value);
        head.put(b"\r\n");
    }
    for piece in framing {
        head.put(piece);
    }
    head.put(b"\r\n");
    head.finish();
}

/// Bytes a field line adds besides its name and value: `": "` and CRLF.
const FIELD_SEPARATORS_BYTES: usize = 4;

/// Copies pieces into a slice sized for exactly those pieces, front to back.
struct Filler<'a> {
    space: &'a mut [u8],
    /// Bytes filled so far. Invariant: `filled <= space.len()`.
    filled: usize,
}

impl<'a> Filler<'a> {
    fn new(space: &'a mut [u8]) -> Filler<'a> {
        Filler { space, filled: 0 }
    }

    /// Copies `piece` after what is already filled. The caller sized the space for every
    /// piece it puts, so running out is a bug in the caller's sum.
    fn put(&mut self, piece: &[u8]) {
        let end = self.filled + piece.len();
        let slot = self.space.get_mut(self.filled..end);
        assert!(slot.is_some(), "head pieces outgrew their computed length");
        if let Some(slot) = slot {
            slot.copy_from_slice(piece);
        }
        self.filled = end;
    }

    /// Checks that the space was filled exactly.
    fn finish(self) {
        assert!(self.filled == self.space.len());
    }
}

/// Appends `value` in lowercase hexadecimal without leading zeros.
fn put_hex(value: u64, out: &mut BytesMut) {
    out.put_slice(Digits::new().format(value, 16));
}

/// A `u64` written out in decimal and kept on the stack (an upstream JSON-RPC id, say),
/// so that writing it needs no allocation.
pub struct Decimal {
    digits: Digits,
    start: usize,
}

impl Decimal {
    pub fn new(value: u64) -> Decimal {
        let mut digits = Digits::new();
        let len = digits.format(value, 10).len();
        Decimal {
            digits,
            start: U64_DIGITS_MAX - len,
        }
    }

    /// The digits, without leading zeros.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.digits.0.get(self.start..).unwrap_or_default()).unwrap_or("0")
    }
}

/// A stack buffer that formats one `u64` at a time, so heads need no allocation.
struct Digits([u8; U64_DIGITS_MAX]);

impl Digits {
    fn new() -> Digits {
        Digits([0; U64_DIGITS_MAX])
    }

    /// Formats `value` in `radix` (10 or 16, lowercase), right to left, and returns the
    /// digits, without leading zeros.
    fn format(&mut self, mut value: u64, radix: u64) -> &[u8] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        assert!(radix == 10 || radix == 16);
        let mut start = U64_DIGITS_MAX;
        // A u64 has at most 20 decimal digits, so the loop runs at most U64_DIGITS_MAX times.
        for slot in self.0.iter_mut().rev() {
            *slot = DIGITS[(value % radix) as usize];
            start -= 1;
            value /= radix;
            if value == 0 {
                break;
            }
        }
        assert!(value == 0);
        &self.0[start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_bytes_is_what_put_content_length_appends() {
        for v in [0, 9, 10, 1023, 1024, 4 * 1024 * 1024, u64::MAX] {
            let mut out = BytesMut::new();
            put_content_length(v, &mut out);
            assert_eq!(content_length_bytes(v), out.len(), "{v}");
        }
    }

    #[test]
    fn decimals_are_the_numbers_lexemes() {
        for v in [
            0,
            1,
            9,
            10,
            99,
            100,
            12_345,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            assert_eq!(Decimal::new(v).as_str(), v.to_string());
        }
    }

    /// A reply made from ready fields is byte for byte the encoder's, with and without
    /// `connection: close` (the way `Sink::respond_with_fields` puts them together).
    #[test]
    fn head_fields_completed_are_the_encoders_head() {
        let headers: [(&str, &[u8]); 2] = [
            ("content-type", b"application/json"),
            ("mcp-session-id", b"s-1"),
        ];
        let fields = response_head_fields(200, &headers).expect("valid");
        for len in [0u64, 7, 123_456] {
            let mut whole = BytesMut::new();
            assert!(
                encode_response_head(200, &headers, BodyFraming::Length(len), &mut whole).is_ok()
            );
            let mut made = BytesMut::from(&fields[..]);
            put_content_length(len, &mut made);
            assert_eq!(made, whole);
            let closing: Vec<(&str, &[u8])> = headers
                .iter()
                .copied()
                .chain([("connection", &b"close"[..])])
                .collect();
            let mut whole = BytesMut::new();
            assert!(
                encode_response_head(200, &closing, BodyFraming::Length(len), &mut whole).is_ok()
            );
            let mut made = BytesMut::from(&fields[..]);
            made.extend_from_slice(b"connection: close\r\n");
            put_content_length(len, &mut made);
            assert_eq!(made, whole);
        }
        let bad: [(&str, &[u8]); 1] = [("mcp-session-id", b"a\r\nb")];
        assert!(response_head_fields(200, &bad).is_err());
    }

    fn encoded(write: impl FnOnce(&mut BytesMut)) -> String {
        let mut out = BytesMut::new();
        write(&mut out);
        String::from_utf8(out.to_vec()).expect("encoders write ASCII")
    }

    #[test]
    fn numbers_format_without_leading_zeros() {
        let table: [(u64, &str, &str); 6] = [
            (0, "0", "0"),
            (9, "9", "9"),
            (10, "10", "a"),
            (255, "255", "ff"),
            (4096, "4096", "1000"),
            (u64::MAX, "18446744073709551615", "ffffffffffffffff"),
        ];
        for (value, decimal, hex) in table {
            assert_eq!(Digits::new().format(value, 10), decimal.as_bytes());
            assert_eq!(encoded(|out| put_hex(value, out)), hex);
        }
    }

    #[test]
    fn response_head_with_length() {
        let out = encoded(|out| {
            encode_response_head(
                200,
                &[
                    ("content-type", b"application/json"),
                    ("mcp-session-id", b"abc"),
                ],
                BodyFraming::Length(42),
                out,
            )
            .unwrap()
        });
        assert_eq!(
            out,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: abc\r\n\
             content-length: 42\r\n\r\n"
        );
    }

    #[test]
    fn response_head_framings() {
        let chunked =
            encoded(|out| encode_response_head(200, &[], BodyFraming::Chunked, out).unwrap());
        assert_eq!(
            chunked,
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let none = encoded(|out| encode_response_head(204, &[], BodyFraming::None, out).unwrap());
        assert_eq!(none, "HTTP/1.1 204 No Content\r\n\r\n");
        let close = encoded(|out| {
            encode_response_head(
                200,
                &[("connection", b"close")],
                BodyFraming::CloseDelimited,
                out,
            )
            .unwrap()
        });
        assert_eq!(close, "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n");
        let unknown =
            encoded(|out| encode_response_head(299, &[], BodyFraming::Length(0), out).unwrap());
        assert_eq!(unknown, "HTTP/1.1 299 \r\ncontent-length: 0\r\n\r\n");
    }

    #[test]
    fn request_heads() {
        let post = encoded(|out| {
            encode_request_head(
                "POST",
                "/mcp",
                &[
                    ("host", b"upstream:8080"),
                    ("accept", b"application/json, text/event-stream"),
                ],
                BodyFraming::Chunked,
                out,
            )
            .unwrap()
        });
        assert_eq!(
            post,
            "POST /mcp HTTP/1.1\r\nhost: upstream:8080\r\n\
             accept: application/json, text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let get = encoded(|out| {
            encode_request_head("GET", "/mcp?x=1", &[("host", b"h")], BodyFraming::None, out)
                .unwrap()
        });
        assert_eq!(get, "GET /mcp?x=1 HTTP/1.1\r\nhost: h\r\n\r\n");
        let delete = encoded(|out| {
            encode_request_head(
                "DELETE",
                "/",
                &[("host", b"h")],
                BodyFraming::Length(0),
                out,
            )
            .unwrap()
        });
        assert_eq!(
            delete,
            "DELETE / HTTP/1.1\r\nhost: h\r\ncontent-length: 0\r\n\r\n"
        );
    }

    #[test]
    fn heads_append_after_bytes_already_in_the_buffer() {
        let mut out = BytesMut::from(&b"earlier bytes|"[..]);
        encode_response_head(200, &[("a", b"")], BodyFraming::Length(7), &mut out).unwrap();
        encode_request_head("GET", "/", &[], BodyFraming::None, &mut out).unwrap();
        assert_eq!(
            &out[..],
            b"earlier bytes|HTTP/1.1 200 OK\r\na: \r\ncontent-length: 7\r\n\r\nGET / HTTP/1.1\r\n\r\n"
        );
    }

    #[test]
    fn chunks() {
        assert_eq!(encoded(|out| encode_chunk(b"", out)), "");
        assert_eq!(encoded(|out| encode_chunk(b"hello", out)), "5\r\nhello\r\n");
        let big = vec![b'x'; 300];
        let expected = format!("12c\r\n{}\r\n", "x".repeat(300));
        assert_eq!(encoded(|out| encode_chunk(&big, out)), expected);
        assert_eq!(encoded(encode_last_chunk), "0\r\n\r\n");
    }

    #[test]
    fn one_chunk_of_several_parts() {
        let parts: [&[u8]; 4] = [b"he", b"", b"llo, ", b"world"];
        assert_eq!(
            encoded(|out| encode_chunk_of(parts, out)),
            "c\r\nhello, world\r\n"
        );
        let empty: [&[u8]; 2] = [b"", b""];
        assert_eq!(encoded(|out| encode_chunk_of(empty, out)), "");
        // Parts larger than a copy piece keep their order across the piece boundaries.
        let a = vec![b'a'; COPY_PIECE_BYTES + 3];
        let b = vec![b'b'; 2 * COPY_PIECE_BYTES];
        let expected = format!(
            "{:x}\r\n{}{}\r\n",
            a.len() + b.len(),
            "a".repeat(a.len()),
            "b".repeat(b.len())
        );
        assert_eq!(
            encoded(|out| encode_chunk_of([&a[..], &b[..]], out)),
            expected
        );
    }

    #[test]
    fn chunks_copied_in_pieces_keep_every_byte_in_order() {
        for len in [
            COPY_PIECE_BYTES - 1,
            COPY_PIECE_BYTES,
            COPY_PIECE_BYTES + 1,
            3 * COPY_PIECE_BYTES + 7,
        ] {
            // A period prime to the piece size, so a misplaced piece changes the bytes.
            let data: Vec<u8> = (0..len).map(|at| (at % 251) as u8).collect();
            let mut out = BytesMut::from(&b"prefix"[..]);
            encode_chunk(&data, &mut out);
            let size_line = format!("{len:x}\r\n");
            let expected = [b"prefix", size_line.as_bytes(), &data, b"\r\n"].concat();
            assert_eq!(&out[..], &expected[..], "chunk of {len} bytes");
        }
    }

    #[test]
    fn error_responses() {
        let table: [(HttpError, &str); 4] = [
            (
                HttpError::HeaderFieldsTooLarge,
                "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n\
                 connection: close\r\ncontent-length: 24\r\n\r\nheader fields too large\n",
            ),
            (
                HttpError::BadRequest("missing host"),
                "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\n\
                 connection: close\r\ncontent-length: 13\r\n\r\nmissing host\n",
            ),
            (
                HttpError::PayloadTooLarge,
                "HTTP/1.1 413 Content Too Large\r\ncontent-type: text/plain\r\n\
                 connection: close\r\ncontent-length: 18\r\n\r\npayload too large\n",
            ),
            (
                HttpError::VersionNotSupported,
                "HTTP/1.1 505 HTTP Version Not Supported\r\ncontent-type: text/plain\r\n\
                 connection: close\r\ncontent-length: 27\r\n\r\nhttp version not supported\n",
            ),
        ];
        for (err, expected) in table {
            assert_eq!(encoded(|out| encode_error_response(&err, out)), expected);
        }
    }

    #[test]
    fn heads_with_control_bytes_are_refused_and_nothing_is_written() {
        // Every control byte but HTAB, and DEL, in a value refuses the head, wherever it sits.
        let hostile: Vec<u8> = (0u8..0x20).filter(|b| *b != b'\t').chain([0x7f]).collect();
        for b in hostile {
            for value in [vec![b], vec![b'x', b, b'y'], vec![b'a', b'b', b'c', b]] {
                let mut out = BytesMut::from(&b"kept"[..]);
                let headers: [(&str, &[u8]); 2] = [("host", b"h"), ("last-event-id", &value)];
                assert_eq!(
                    encode_request_head("GET", "/mcp", &headers, BodyFraming::None, &mut out),
                    Err(HeadError::Value("last-event-id")),
                    "byte {b:#04x}"
                );
                assert_eq!(
                    encode_response_head(200, &headers, BodyFraming::Length(0), &mut out),
                    Err(HeadError::Value("last-event-id")),
                );
                assert_eq!(&out[..], b"kept", "nothing written for byte {b:#04x}");
            }
        }
        // The smuggling shape of a Last-Event-ID, and a NUL.
        let mut out = BytesMut::new();
        let injected: [(&str, &[u8]); 1] = [("last-event-id", b"x\r\nX-Injected: 1")];
        assert!(encode_request_head("GET", "/", &injected, BodyFraming::None, &mut out).is_err());
        assert!(out.is_empty());
        // HTAB, visible ASCII and obs-text pass.
        let fine: [(&str, &[u8]); 1] = [("x", b"a\tb ~\x80\xff")];
        assert!(encode_request_head("GET", "/", &fine, BodyFraming::None, &mut out).is_ok());
    }

    #[test]
    fn the_word_wide_value_check_agrees_with_the_byte_rule_everywhere() {
        let byte_ok = |b: u8| (b >= 0x20 && b != 0x7f) || b == b'\t';
        // Every byte at every position of values of every length up to 24, among fine
        // bytes of both halves (0x80 and above take part in the word arithmetic).
        for len in 1..=24 {
            for at in 0..len {
                for b in 0..=255u8 {
                    for filler in [b'a', 0xff, 0x80, b' ', b'~', b'\t'] {
                        let mut value = vec![filler; len];
                        value[at] = b;
                        assert_eq!(
                            field_value_ok(&value),
                            byte_ok(b),
                            "{b:#04x} at {at} of {len} in {filler:#04x}"
                        );
                    }
                }
            }
        }
        assert!(field_value_ok(b""));
        let (mut rng, seed) = crate::testing::Rng::seeded(0x5eed);
        for _ in 0..20_000 {
            let len = rng.index(40);
            let value: Vec<u8> = (0..len).map(|_| rng.below(256) as u8).collect();
            let want = value.iter().all(|&b| byte_ok(b));
            assert_eq!(field_value_ok(&value), want, "seed {seed}: {value:?}");
        }
        let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
        for b in 0..=255u8 {
            assert_eq!(token_ok(&[b]), tchar(b), "{b:#04x}");
        }
    }

    #[test]
    fn methods_and_targets_must_keep_the_start_line_whole() {
        let mut out = BytesMut::new();
        let none: [(&str, &[u8]); 0] = [];
        for method in ["", "GE T", "GET\r\n", "G\0"] {
            assert_eq!(
                encode_request_head(method, "/", &none, BodyFraming::None, &mut out),
                Err(HeadError::Method)
            );
        }
        for target in ["", "/a b", "/a\r\nb", "/\0", "/\x7f"] {
            assert_eq!(
                encode_request_head("GET", target, &none, BodyFraming::None, &mut out),
                Err(HeadError::Target)
            );
        }
        assert!(out.is_empty());
        assert_eq!(
            HeadError::Value("authorization").to_string(),
            "value of header authorization holds a control byte"
        );
    }
}
