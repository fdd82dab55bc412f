//! Response decoder tables: every case is also fed split at every byte boundary.

use super::*;
use crate::http::testing::{Out, Outcome, Responses, assert_all_splits};

/// Body bound for table cases, small enough to hit 413 with short inputs.
const TEST_BODY_BYTES_MAX: usize = 1024;

/// One line per event; errors show status and detail (the status names the variant).
fn show(out: &Out<ResponseHead>) -> String {
    match out {
        Out::Head(h) => format!(
            "head {} 1.{} {:?} keep_alive={}",
            h.status,
            h.minor_version,
            h.body,
            h.keep_alive()
        ),
        Out::Data(data) if data.len() > 40 => format!("data {} bytes", data.len()),
        Out::Data(data) => format!("data {}", String::from_utf8_lossy(data)),
        Out::End => "end".to_owned(),
        Out::Err(err) => format!("error {} {}", err.status(), err.detail()),
    }
}

/// How a case is fed: whether it answers HEAD, and whether the peer closes at the end.
#[derive(Clone, Copy)]
struct Feeding {
    head_request: bool,
    eof: bool,
}

const OPEN: Feeding = Feeding {
    head_request: false,
    eof: false,
};
const CLOSED: Feeding = Feeding {
    head_request: false,
    eof: true,
};
const HEAD_OPEN: Feeding = Feeding {
    head_request: true,
    eof: false,
};

fn check(name: &str, input: &[u8], feeding: Feeding, want: &[&str]) -> Outcome<ResponseHead> {
    let make = || Responses {
        decoder: ResponseDecoder::new(TEST_BODY_BYTES_MAX),
        head_request: feeding.head_request,
    };
    let outcome = assert_all_splits(make, input, feeding.eof);
    let seen: Vec<String> = outcome.events.iter().map(show).collect();
    assert_eq!(seen, want, "case {name}");
    outcome
}

#[test]
fn valid_responses() {
    let table: &[(&str, &[u8], Feeding, &[&str])] = &[
        (
            "content-length body",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
            OPEN,
            &["head 200 1.1 Length(5) keep_alive=true", "data hello", "end"],
        ),
        (
            "chunked body with trailers",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nA;x\r\n0123456789\r\n0\r\nT: v\r\n\r\n",
            OPEN,
            &["head 200 1.1 Chunked keep_alive=true", "data abc0123456789", "end"],
        ),
        (
            "100 continue then 200",
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            OPEN,
            &["head 200 1.1 Length(2) keep_alive=true", "data ok", "end"],
        ),
        (
            "204 ignores content-length",
            b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
            OPEN,
            &["head 204 1.1 None keep_alive=true", "end"],
        ),
        (
            "304 has no body",
            b"HTTP/1.1 304 Not Modified\r\n\r\n",
            OPEN,
            &["head 304 1.1 None keep_alive=true", "end"],
        ),
        (
            "response to head has no body",
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            HEAD_OPEN,
            &["head 200 1.1 None keep_alive=true", "end"],
        ),
        (
            "close-delimited body ends at eof",
            b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of this until close",
            CLOSED,
            &["head 200 1.1 CloseDelimited keep_alive=false", "data all of this until close", "end"],
        ),
        (
            "empty close-delimited body",
            b"HTTP/1.0 200 OK\r\n\r\n",
            CLOSED,
            &["head 200 1.0 CloseDelimited keep_alive=false", "end"],
        ),
        (
            "two responses then a clean close",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\naHTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            CLOSED,
            &[
                "head 200 1.1 Length(1) keep_alive=true",
                "data a",
                "end",
                "head 404 1.1 Length(0) keep_alive=false",
                "end",
            ],
        ),
        (
            "http/1.0 keep-alive",
            b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
            OPEN,
            &["head 200 1.0 Length(0) keep_alive=true", "end"],
        ),
        (
            "http/1.0 closes by default",
            b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
            OPEN,
            &["head 200 1.0 Length(0) keep_alive=false", "end"],
        ),
    ];
    for (name, input, feeding, want) in table {
        let outcome = check(name, input, *feeding, want);
        assert_eq!(outcome.rest.as_deref(), Some(&b""[..]), "case {name}");
    }
}

#[test]
fn invalid_responses() {
    let mut informational = Vec::new();
    for _ in 0..=INFORMATIONAL_RESPONSES_MAX {
        informational.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    informational.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
    let big_header = [
        &b"HTTP/1.1 200 OK\r\nX-Big: "[..],
        &[b'b'; HEADER_BYTES_MAX],
        b"\r\n\r\n",
    ]
    .concat();
    let close_over_max = [&b"HTTP/1.1 200 OK\r\n\r\n"[..], &[b'x'; 1025]].concat();
    let table: &[(&str, &[u8], Feeding, &[&str])] = &[
        (
            "truncated content-length body",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello",
            CLOSED,
            &[
                "head 200 1.1 Length(10) keep_alive=true",
                "data hello",
                "error 400 connection closed before end of body",
            ],
        ),
        (
            "truncated chunked body",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
            CLOSED,
            &[
                "head 200 1.1 Chunked keep_alive=true",
                "data hel",
                "error 400 connection closed before end of body",
            ],
        ),
        (
            "truncated head",
            b"HTTP/1.1 200 OK\r\nContent-Len",
            CLOSED,
            &["error 400 connection closed inside response head"],
        ),
        (
            "101 switching protocols",
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n",
            OPEN,
            &["error 501 protocol upgrade"],
        ),
        (
            "endless informational responses",
            &informational,
            OPEN,
            &["error 400 too many informational responses"],
        ),
        (
            "status out of range",
            b"HTTP/1.1 600 Odd\r\n\r\n",
            OPEN,
            &["error 400 invalid status code"],
        ),
        (
            "status not numeric",
            b"HTTP/1.1 2x0 OK\r\n\r\n",
            OPEN,
            &["error 400 invalid status line"],
        ),
        (
            "transfer-encoding with content-length",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            OPEN,
            &["error 400 both transfer-encoding and content-length"],
        ),
        (
            "gzip transfer coding",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            OPEN,
            &["error 501 transfer coding not implemented"],
        ),
        (
            "content-length over the limit",
            b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\n\r\n",
            OPEN,
            &["error 413 payload too large"],
        ),
        (
            "close-delimited over the limit",
            &close_over_max,
            CLOSED,
            &[
                "head 200 1.1 CloseDelimited keep_alive=false",
                "data 1024 bytes",
                "error 413 payload too large",
            ],
        ),
        (
            "header bytes over the limit",
            &big_header,
            OPEN,
            &["error 431 header fields too large"],
        ),
        (
            "bad chunk crlf",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
            OPEN,
            &[
                "head 200 1.1 Chunked keep_alive=true",
                "data a",
                "error 400 chunk data not followed by crlf",
            ],
        ),
        (
            "http/2 status line",
            b"HTTP/2 200\r\n\r\n",
            OPEN,
            &["error 505 http version not supported"],
        ),
        (
            "not http",
            b"SSH-2.0-OpenSSH\r\n\r\n",
            OPEN,
            &["error 400 invalid http version"],
        ),
    ];
    for (name, input, feeding, want) in table {
        check(name, input, *feeding, want);
    }
}

#[test]
fn decode_after_close_returns_none() {
    let mut decoder = ResponseDecoder::new(TEST_BODY_BYTES_MAX);
    let mut buf = BytesMut::from(&b"HTTP/1.1 200 OK\r\n\r\nbody"[..]);
    assert!(matches!(
        decoder.decode(&mut buf, false),
        Ok(Some(ResponseEvent::Head(_)))
    ));
    assert_eq!(
        decoder.decode(&mut buf, false),
        Ok(Some(ResponseEvent::Data("body".into())))
    );
    assert_eq!(decoder.decode(&mut buf, false), Ok(None));
    assert_eq!(decoder.decode_eof(&mut buf), Ok(Some(ResponseEvent::End)));
    assert_eq!(decoder.decode_eof(&mut buf), Ok(None));
    assert_eq!(decoder.decode(&mut buf, false), Ok(None));
}

#[test]
fn response_headers_are_kept() {
    let mut decoder = ResponseDecoder::new(TEST_BODY_BYTES_MAX);
    let mut buf = BytesMut::from(
        &b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: s1\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
    );
    let Ok(Some(ResponseEvent::Head(head))) = decoder.decode(&mut buf, false) else {
        panic!("expected a head");
    };
    assert_eq!(head.headers.get("mcp-session-id"), Some(&b"s1"[..]));
    assert_eq!(
        head.headers.get("content-type"),
        Some(&b"text/event-stream"[..])
    );
    assert_eq!(head.body, BodyFraming::Chunked);
    assert!(buf.is_empty());
}

/// A response head of exactly `head_bytes` bytes (padded with one `X-Pad` field) announcing
/// a 5-byte body, followed by that body.
fn padded_response(head_bytes: usize) -> Vec<u8> {
    let start = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Pad: ";
    let end = b"\r\n\r\n";
    let pad = head_bytes - start.len() - end.len();
    [&start[..], &vec![b'p'; pad], end, b"hello"].concat()
}

#[test]
fn head_ends_where_httparse_says_whatever_follows() {
    let body_1k: Vec<u8> = (0..1024).map(|at| b"0123456789abcdef"[at % 16]).collect();
    let one_read = [
        &b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1024\r\n\r\n"[..],
        &body_1k,
    ]
    .concat();
    let table: &[(&str, &[u8], Feeding, &[&str])] = &[
        (
            "head and a 1 KiB body without newlines in one read",
            &one_read,
            OPEN,
            &[
                "head 200 1.1 Length(1024) keep_alive=true",
                "data 1024 bytes",
                "end",
            ],
        ),
        (
            "lf-only line ends",
            b"HTTP/1.1 200 OK\nContent-Length: 3\n\na\r\n",
            OPEN,
            &[
                "head 200 1.1 Length(3) keep_alive=true",
                "data a\r\n",
                "end",
            ],
        ),
        (
            "body holding empty lines and a status-line-like text",
            b"HTTP/1.1 200 OK\r\nContent-Length: 25\r\n\r\n\r\n\r\nHTTP/1.1 500 No\r\n\r\n\n\n",
            OPEN,
            &[
                "head 200 1.1 Length(25) keep_alive=true",
                "data \r\n\r\nHTTP/1.1 500 No\r\n\r\n\n\n",
                "end",
            ],
        ),
        (
            "close-delimited body of empty lines",
            b"HTTP/1.1 200 OK\r\n\r\n\r\n\r\n\n",
            CLOSED,
            &[
                "head 200 1.1 CloseDelimited keep_alive=false",
                "data \r\n\r\n\n",
                "end",
            ],
        ),
        (
            "interim response, then a final one in the same read",
            b"HTTP/1.1 100 Continue\n\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n\r\n",
            OPEN,
            &["head 200 1.1 Length(2) keep_alive=true", "data \r\n", "end"],
        ),
    ];
    for (name, input, feeding, want) in table {
        let outcome = check(name, input, *feeding, want);
        assert_eq!(outcome.rest.as_deref(), Some(&b""[..]), "case {name}");
    }
}

#[test]
fn head_of_exactly_header_bytes_max_is_accepted_and_one_more_is_not() {
    check(
        "head at the limit",
        &padded_response(HEADER_BYTES_MAX),
        OPEN,
        &[
            "head 200 1.1 Length(5) keep_alive=true",
            "data hello",
            "end",
        ],
    );
    check(
        "head one byte over the limit",
        &padded_response(HEADER_BYTES_MAX + 1),
        OPEN,
        &["error 431 header fields too large"],
    );
}
