//! Request decoder tables: every case is also fed split at every byte boundary.

use super::*;
use crate::http::testing::{Out, Outcome, XorShift, assert_all_splits, run};
use crate::http::{encode_chunk, encode_last_chunk};
use crate::limits::MESSAGE_BYTES_MAX;

/// Body bound for table cases, small enough to hit 413 with short inputs.
const TEST_BODY_BYTES_MAX: usize = 1024;

/// Cuts `wire` at up to `cuts_max - 1` random points into consecutive reads.
fn random_reads<'a>(rng: &mut XorShift, wire: &'a [u8], cuts_max: usize) -> Vec<&'a [u8]> {
    let mut cuts: Vec<usize> = (0..rng.below(cuts_max))
        .map(|_| rng.below(wire.len() + 1))
        .collect();
    cuts.push(wire.len());
    cuts.sort_unstable();
    let mut parts = Vec::with_capacity(cuts.len());
    let mut from = 0;
    for cut in cuts {
        parts.push(&wire[from..cut]);
        from = cut;
    }
    parts
}

fn decoder() -> RequestDecoder {
    RequestDecoder::new(TEST_BODY_BYTES_MAX)
}

/// One line per event, for readable tables. Heads show method, target, version, framing,
/// keep-alive and expect-continue; errors show status and detail (the status names the
/// variant one-to-one).
fn show(out: &Out<RequestHead>) -> String {
    match out {
        Out::Head(h) => format!(
            "head {:?} {} 1.{} {:?} keep_alive={} continue={}",
            h.method,
            h.target(),
            h.minor_version,
            h.body,
            h.keep_alive(),
            h.expects_continue()
        ),
        Out::Data(data) if data.len() > 40 => format!("data {} bytes", data.len()),
        Out::Data(data) => format!("data {}", String::from_utf8_lossy(data)),
        Out::End => "end".to_owned(),
        Out::Err(err) => format!("error {} {}", err.status(), err.detail()),
    }
}

fn check(name: &str, input: &[u8], want: &[&str]) -> Outcome<RequestHead> {
    let outcome = assert_all_splits(decoder, input, false);
    let seen: Vec<String> = outcome.events.iter().map(show).collect();
    assert_eq!(seen, want, "case {name}");
    outcome
}

const CHUNKED_POST: &[u8] = b"POST /mcp HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\
    5;name=value\r\nhello\r\n6 ; x=\"y\"\r\n world\r\n0\r\nX-Trailer: t\r\nX-Other: u\r\n\r\n";

#[test]
fn valid_requests() {
    let table: &[(&str, &[u8], &[&str])] = &[
        (
            "get without body",
            b"GET /mcp?session=1 HTTP/1.1\r\nHost: a\r\n\r\n",
            &["head Get /mcp?session=1 1.1 None keep_alive=true continue=false", "end"],
        ),
        (
            "post with content-length",
            b"POST /mcp HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
            &[
                "head Post /mcp 1.1 Length(5) keep_alive=true continue=false",
                "data hello",
                "end",
            ],
        ),
        (
            "post chunked with extensions and trailers",
            CHUNKED_POST,
            &[
                "head Post /mcp 1.1 Chunked keep_alive=true continue=false",
                "data hello world",
                "end",
            ],
        ),
        (
            "chunked coding name is case-insensitive, empty list elements ignored",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: , Chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            &["head Post / 1.1 Chunked keep_alive=true continue=false", "data ok", "end"],
        ),
        (
            "pipelined pair",
            b"GET /a HTTP/1.1\r\nHost: a\r\n\r\nPOST /b HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi",
            &[
                "head Get /a 1.1 None keep_alive=true continue=false",
                "end",
                "head Post /b 1.1 Length(2) keep_alive=true continue=false",
                "data hi",
                "end",
            ],
        ),
        (
            "http/1.0 closes by default",
            b"GET / HTTP/1.0\r\n\r\n",
            &["head Get / 1.0 None keep_alive=false continue=false", "end"],
        ),
        (
            "http/1.0 keep-alive",
            b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
            &["head Get / 1.0 None keep_alive=true continue=false", "end"],
        ),
        (
            "http/1.1 connection close",
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, close\r\n\r\n",
            &["head Get / 1.1 None keep_alive=false continue=false", "end"],
        ),
        (
            "expect 100-continue",
            b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
            &["head Post / 1.1 Length(2) keep_alive=true continue=true", "data ok", "end"],
        ),
        (
            "expect ignored for http/1.0",
            b"POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\nok",
            &["head Post / 1.0 Length(2) keep_alive=false continue=false", "data ok", "end"],
        ),
        (
            "empty line before request line",
            b"\r\nDELETE /mcp HTTP/1.1\r\nHost: a\r\n\r\n",
            &["head Delete /mcp 1.1 None keep_alive=true continue=false", "end"],
        ),
        (
            "content-length zero",
            b"PUT /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
            &["head Put /x 1.1 Length(0) keep_alive=true continue=false", "end"],
        ),
        (
            "identical repeated content-length",
            b"PATCH / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\nContent-Length: 3\r\n\r\nabc",
            &["head Patch / 1.1 Length(3) keep_alive=true continue=false", "data abc", "end"],
        ),
        (
            "other methods and asterisk form",
            b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\nPROPFIND / HTTP/1.1\r\nHost: a\r\n\r\nHEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
            &[
                "head Options * 1.1 None keep_alive=true continue=false",
                "end",
                "head Other / 1.1 None keep_alive=true continue=false",
                "end",
                "head Head / 1.1 None keep_alive=true continue=false",
                "end",
            ],
        ),
        (
            "body exactly at the limit",
            &[
                &b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1024\r\n\r\n"[..],
                &[b'x'; 1024],
            ]
            .concat(),
            &["head Post / 1.1 Length(1024) keep_alive=true continue=false", "data 1024 bytes", "end"],
        ),
    ];
    for (name, input, want) in table {
        let outcome = check(name, input, want);
        assert_eq!(outcome.rest.as_deref(), Some(&b""[..]), "case {name}");
    }
}

#[test]
fn incomplete_next_request_stays_in_buffer() {
    let outcome = check(
        "pipelined partial",
        b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /b HT",
        &["head Get / 1.1 None keep_alive=true continue=false", "end"],
    );
    assert_eq!(outcome.rest.as_deref(), Some(&b"GET /b HT"[..]));
}

#[test]
fn invalid_requests() {
    let long_target = [
        &b"GET /"[..],
        &[b'a'; REQUEST_TARGET_BYTES_MAX],
        b" HTTP/1.1\r\nHost: a\r\n\r\n",
    ]
    .concat();
    let unfinished_target = [&b"GET /"[..], &[b'a'; REQUEST_TARGET_BYTES_MAX]].concat();
    let target_at_limit = [
        &b"GET /"[..],
        &[b'a'; REQUEST_TARGET_BYTES_MAX - 1],
        b" HTTP/1.1\r\n",
    ]
    .concat();
    let mut many_headers = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
    for at in 0..HEADERS_PER_MESSAGE_MAX {
        many_headers.extend_from_slice(format!("X-{at}: v\r\n").as_bytes());
    }
    many_headers.extend_from_slice(b"\r\n");
    let big_header = [
        &b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: "[..],
        &[b'b'; HEADER_BYTES_MAX],
        b"\r\n\r\n",
    ]
    .concat();
    let long_chunk_line = [
        &b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1;"[..],
        &[b'e'; crate::limits::CHUNK_LINE_BYTES_MAX],
        b"\r\nx\r\n0\r\n\r\n",
    ]
    .concat();
    let chunked_over_max = [
        &b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n258\r\n"[..],
        &[b'x'; 600],
        b"\r\n258\r\n",
        &[b'x'; 600],
        b"\r\n0\r\n\r\n",
    ]
    .concat();
    let chunked_head = "head Post / 1.1 Chunked keep_alive=true continue=false";
    let table: &[(&str, &[u8], &[&str])] = &[
        (
            "transfer-encoding with content-length",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            &["error 400 both transfer-encoding and content-length"],
        ),
        (
            "gzip transfer coding",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
            &["error 501 transfer coding not implemented"],
        ),
        (
            "gzip then chunked",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
            &["error 501 transfer coding not implemented"],
        ),
        (
            "chunked twice",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
            &["error 400 chunked applied more than once"],
        ),
        (
            "empty transfer-encoding",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \r\n\r\n",
            &["error 400 empty transfer-encoding"],
        ),
        (
            "transfer-encoding in http/1.0",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            &["error 400 transfer-encoding in http/1.0"],
        ),
        (
            "non-numeric content-length",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5a\r\n\r\n",
            &["error 400 invalid content-length"],
        ),
        (
            "negative content-length",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
            &["error 400 invalid content-length"],
        ),
        (
            "empty content-length",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n",
            &["error 400 invalid content-length"],
        ),
        (
            "differing content-length fields",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
            &["error 400 conflicting content-length"],
        ),
        (
            "differing content-length list",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\nhello",
            &["error 400 conflicting content-length"],
        ),
        (
            "content-length over the limit",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1025\r\n\r\nx",
            &["error 413 payload too large"],
        ),
        (
            "chunked body over the limit",
            &chunked_over_max,
            &[chunked_head, "data 600 bytes", "error 413 payload too large"],
        ),
        ("target too long", &long_target, &["error 414 uri too long"]),
        ("unfinished target too long", &unfinished_target, &["error 414 uri too long"]),
        ("too many headers", &many_headers, &["error 431 header fields too large"]),
        ("header bytes over the limit", &big_header, &["error 431 header fields too large"]),
        (
            "missing host",
            b"GET / HTTP/1.1\r\n\r\n",
            &["error 400 missing host"],
        ),
        (
            "two hosts",
            b"GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n",
            &["error 400 more than one host"],
        ),
        (
            "host with a comma",
            b"GET / HTTP/1.1\r\nHost: a,b\r\n\r\n",
            &["error 400 invalid host"],
        ),
        (
            "chunk data without crlf",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
            &[chunked_head, "data hello", "error 400 chunk data not followed by crlf"],
        ),
        (
            "chunk data followed by cr only",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\rX",
            &[chunked_head, "data ok", "error 400 chunk data not followed by crlf"],
        ),
        (
            "chunk size line too long",
            &long_chunk_line,
            &[chunked_head, "error 400 chunk size line too long"],
        ),
        (
            "chunk size not hex",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            &[chunked_head, "error 400 invalid chunk size"],
        ),
        (
            "chunk size missing",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n;ext\r\n",
            &[chunked_head, "error 400 invalid chunk size"],
        ),
        (
            "chunk size overflows",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n11111111111111111\r\n",
            &[chunked_head, "error 400 invalid chunk size"],
        ),
        (
            "chunk size line with bare lf",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n",
            &[chunked_head, "error 400 chunk size line without crlf"],
        ),
        (
            "control byte in chunk extension",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;a\x00b\r\nhello\r\n",
            &[chunked_head, "error 400 invalid chunk extension"],
        ),
        (
            "invalid trailer",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nBad Trailer\r\n\r\n",
            &[chunked_head, "error 400 invalid trailer field"],
        ),
        (
            "http/2 preface",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            &["error 505 http version not supported"],
        ),
        (
            "http/1.2",
            b"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
            &["error 505 http version not supported"],
        ),
        (
            "not http",
            b"GET / HTTX/1.1\r\nHost: a\r\n\r\n",
            &["error 400 invalid http version"],
        ),
        (
            "http/0.9 request line",
            b"GET /\r\n\r\n",
            &["error 400 invalid request line"],
        ),
        (
            "non-ascii target",
            b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n",
            &["error 400 invalid request target"],
        ),
        (
            "space before colon",
            b"GET / HTTP/1.1\r\nHost : a\r\n\r\n",
            &["error 400 invalid header name"],
        ),
        (
            "obsolete line folding",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
            &["error 400 invalid header name"],
        ),
        (
            "lowercase method is another method",
            b"get / HTTP/1.1\r\nHost: a\r\n\r\n",
            &["head Other / 1.1 None keep_alive=true continue=false", "end"],
        ),
        (
            "bad method byte",
            b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n",
            &["error 400 invalid request line"],
        ),
    ];
    for (name, input, want) in table {
        check(name, input, want);
    }
    // A target of exactly REQUEST_TARGET_BYTES_MAX bytes is accepted (the head is incomplete).
    let outcome = check("target at the limit", &target_at_limit, &[]);
    assert_eq!(outcome.rest.as_deref(), Some(&target_at_limit[..]));
}

#[test]
fn errors_repeat_after_failure() {
    let mut decoder = decoder();
    let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n\r\n"[..]);
    let missing_host = HttpError::BadRequest("missing host");
    assert_eq!(decoder.decode(&mut buf), Err(missing_host));
    buf.extend_from_slice(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n");
    assert_eq!(decoder.decode(&mut buf), Err(missing_host));
}

#[test]
fn head_accessors() {
    let outcome = run(
        &mut decoder(),
        &[b"GET /mcp/x?a=1&b=2 HTTP/1.1\r\nHost: example\r\nAccept: text/event-stream, application/json\r\n\r\n"],
        false,
    );
    let Some(Out::Head(head)) = outcome.events.first() else {
        panic!("expected a head, got {:?}", outcome.events);
    };
    assert_eq!(head.path(), "/mcp/x");
    assert_eq!(head.headers.get("host"), Some(&b"example"[..]));
    assert!(head.headers.has_token("accept", "text/event-stream"));
    assert_eq!(head.headers.len(), 2);
    let plain = run(&mut decoder(), &[b"GET /plain HTTP/1.0\r\n\r\n"], false);
    let Some(Out::Head(head)) = plain.events.first() else {
        panic!("expected a head, got {:?}", plain.events);
    };
    assert_eq!(head.path(), "/plain");
    assert!(head.headers.is_empty());
    assert_eq!(head.host(), None);
}

#[test]
fn an_absolute_form_target_gives_its_path_and_its_authority_as_the_host() {
    type Case<'a> = (&'a [u8], &'a str, Option<&'a [u8]>);
    let table: [Case; 6] = [
        (
            b"GET http://a:8/mcp?x=1 HTTP/1.1\r\nHost: b\r\n\r\n",
            "/mcp",
            Some(b"a:8"),
        ),
        (
            b"GET HTTPS://a HTTP/1.1\r\nHost: b\r\n\r\n",
            "/",
            Some(b"a"),
        ),
        (
            b"GET http://a?q HTTP/1.1\r\nHost: b\r\n\r\n",
            "/",
            Some(b"a"),
        ),
        (
            b"GET http:///mcp HTTP/1.1\r\nHost: b\r\n\r\n",
            "/mcp",
            Some(b""),
        ),
        // Not absolute-form: left as it is.
        (
            b"GET ftp://a/mcp HTTP/1.1\r\nHost: b\r\n\r\n",
            "ftp://a/mcp",
            Some(b"b"),
        ),
        (
            b"GET /x?http://a/y HTTP/1.1\r\nHost: b\r\n\r\n",
            "/x",
            Some(b"b"),
        ),
    ];
    for (input, path, host) in table {
        let outcome = run(&mut decoder(), &[input], false);
        let Some(Out::Head(head)) = outcome.events.first() else {
            panic!("expected a head, got {:?}", outcome.events);
        };
        assert_eq!(
            (head.path(), head.host()),
            (path, host),
            "{}",
            head.target()
        );
    }
}

#[test]
fn data_is_emitted_as_it_arrives_without_copying() {
    let mut decoder = decoder();
    let mut buf =
        BytesMut::from(&b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc"[..]);
    assert!(matches!(
        decoder.decode(&mut buf),
        Ok(Some(RequestEvent::Head(_)))
    ));
    // Zero-copy: the Data event points at the very bytes that were in the read buffer.
    let body_at = buf.as_ptr();
    let Ok(Some(RequestEvent::Data(data))) = decoder.decode(&mut buf) else {
        panic!("expected data");
    };
    assert_eq!(&data[..], b"abc");
    assert_eq!(data.as_ptr(), body_at);
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    buf.extend_from_slice(b"defghijXYZ");
    assert_eq!(
        decoder.decode(&mut buf),
        Ok(Some(RequestEvent::Data("defghij".into())))
    );
    assert_eq!(decoder.decode(&mut buf), Ok(Some(RequestEvent::End)));
    assert_eq!(&buf[..], b"XYZ");
}

/// Random chunked bodies, encoded with `encode_chunk`, decode to the same bytes however the
/// stream is split. Reproduce a failure with `MCPYARD_SEED=<seed> cargo test --lib http`.
#[test]
fn random_chunked_bodies_round_trip() {
    const CASES: usize = 200;
    const CHUNKS_MAX: usize = 12;
    const CHUNK_BYTES_MAX: usize = 700;
    let (mut rng, seed) = XorShift::from_env(0x6d63_7079_6172_6421);
    for case in 0..CASES {
        let mut body = Vec::new();
        let mut wire = BytesMut::from(
            &b"POST /mcp HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n"[..],
        );
        for _ in 0..rng.below(CHUNKS_MAX + 1) {
            let chunk: Vec<u8> = (0..rng.below(CHUNK_BYTES_MAX + 1))
                .map(|_| rng.below(256) as u8)
                .collect();
            encode_chunk(&chunk, &mut wire);
            body.extend_from_slice(&chunk);
        }
        encode_last_chunk(&mut wire);
        let parts = random_reads(&mut rng, &wire, 6);
        let outcome = run(&mut RequestDecoder::new(MESSAGE_BYTES_MAX), &parts, false);
        let data: Vec<u8> = outcome
            .events
            .iter()
            .filter_map(|out| match out {
                Out::Data(data) => Some(data.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(data, body, "seed {seed} case {case}: body differs");
        assert!(
            matches!(outcome.events.last(), Some(Out::End)),
            "seed {seed} case {case}: {:?}",
            outcome.events.last()
        );
        assert_eq!(
            outcome.rest.as_deref(),
            Some(&b""[..]),
            "seed {seed} case {case}"
        );
    }
}

/// A request head of exactly `head_bytes` bytes (padded with one `X-Pad` field) announcing
/// a 5-byte body, followed by that body.
fn padded_post(head_bytes: usize) -> Vec<u8> {
    let start = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX-Pad: ";
    let end = b"\r\n\r\n";
    let pad = head_bytes - start.len() - end.len();
    [&start[..], &vec![b'p'; pad], end, b"hello"].concat()
}

#[test]
fn head_ends_where_httparse_says_whatever_follows() {
    let table: &[(&str, &[u8], &[&str])] = &[
        (
            "lf-only line ends",
            b"POST / HTTP/1.1\nHost: a\nContent-Length: 4\n\nab\r\n",
            &["head Post / 1.1 Length(4) keep_alive=true continue=false", "data ab\r\n", "end"],
        ),
        (
            "lf-only header line, then crlf empty line",
            b"GET / HTTP/1.1\r\nHost: a\n\r\n",
            &["head Get / 1.1 None keep_alive=true continue=false", "end"],
        ),
        (
            "body holding empty lines and a request-like text",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 28\r\n\r\n\r\n\r\nGET /x HTTP/1.1\n\nab\r\n\r\n\n",
            &[
                "head Post / 1.1 Length(28) keep_alive=true continue=false",
                "data \r\n\r\nGET /x HTTP/1.1\n\nab\r\n\r\n\n",
                "end",
            ],
        ),
        (
            "pipelined request after a body of empty lines",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\n\r\n\r\nGET /2 HTTP/1.1\r\nHost: b\r\n\r\n",
            &[
                "head Post / 1.1 Length(4) keep_alive=true continue=false",
                "data \r\n\r\n",
                "end",
                "head Get /2 1.1 None keep_alive=true continue=false",
                "end",
            ],
        ),
        (
            "cr then a non-lf byte is not an empty line",
            b"GET / HTTP/1.1\r\nHost: a\r\n\rX: b\r\n\r\n",
            &["error 400 invalid line ending"],
        ),
        (
            "empty lines before the request line",
            b"\r\n\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            &["head Get / 1.1 None keep_alive=true continue=false", "end"],
        ),
    ];
    for (name, input, want) in table {
        let outcome = check(name, input, want);
        if !want.iter().any(|line| line.starts_with("error")) {
            assert_eq!(outcome.rest.as_deref(), Some(&b""[..]), "case {name}");
        }
    }
}

#[test]
fn head_of_exactly_header_bytes_max_is_accepted_and_one_more_is_not() {
    check(
        "head at the limit",
        &padded_post(HEADER_BYTES_MAX),
        &[
            "head Post / 1.1 Length(5) keep_alive=true continue=false",
            "data hello",
            "end",
        ],
    );
    check(
        "head one byte over the limit",
        &padded_post(HEADER_BYTES_MAX + 1),
        &["error 431 header fields too large"],
    );
}

#[test]
fn random_line_ends_and_newline_bodies_round_trip() {
    const CASES: usize = 300;
    const REQUESTS_MAX: usize = 3;
    const FIELDS_MAX: usize = 5;
    const BODY_BYTES_MAX: usize = 300;
    // Bodies drawn mostly from line-end bytes, so they look like empty lines and heads.
    const BODY_ALPHABET: &[u8] = b"\r\n\r\n\r\n:GET a";
    let (mut rng, seed) = XorShift::from_env(0x6865_6164_2d65_6e64);
    for case in 0..CASES {
        let mut wire = Vec::new();
        let mut want = Vec::new();
        for request in 0..1 + rng.below(REQUESTS_MAX) {
            let body: Vec<u8> = (0..rng.below(BODY_BYTES_MAX + 1))
                .map(|_| BODY_ALPHABET[rng.below(BODY_ALPHABET.len())])
                .collect();
            let fields = rng.below(FIELDS_MAX + 1);
            let mut lines = vec![
                format!("POST /r{request} HTTP/1.1"),
                "Host: a".to_owned(),
                format!("Content-Length: {}", body.len()),
            ];
            lines.extend((0..fields).map(|at| format!("X-F{at}: v{at}")));
            lines.push(String::new());
            for line in lines {
                wire.extend_from_slice(line.as_bytes());
                wire.extend_from_slice(if rng.below(2) == 0 { b"\r\n" } else { b"\n" });
            }
            wire.extend_from_slice(&body);
            want.push(format!(
                "head Post /r{request} 1.1 Length({}) keep_alive=true continue=false fields={}",
                body.len(),
                fields + 2
            ));
            if !body.is_empty() {
                want.push(format!("data {body:?}"));
            }
            want.push("end".to_owned());
        }
        let parts = random_reads(&mut rng, &wire, 8);
        let outcome = run(&mut RequestDecoder::new(MESSAGE_BYTES_MAX), &parts, false);
        let seen: Vec<String> = outcome
            .events
            .iter()
            .map(|out| match out {
                Out::Head(head) => format!("{} fields={}", show(out), head.headers.len()),
                Out::Data(data) => format!("data {data:?}"),
                other => show(other),
            })
            .collect();
        assert_eq!(seen, want, "seed {seed} case {case}");
        assert_eq!(
            outcome.rest.as_deref(),
            Some(&b""[..]),
            "seed {seed} case {case}"
        );
    }
}

/// Decodes `wire` in one buffer to its end or first error: the data bytes delivered, and
/// the error if there was one.
fn decode_all(wire: &[u8]) -> (usize, Option<HttpError>) {
    let mut decoder = decoder();
    let mut buf = BytesMut::from(wire);
    let mut data = 0;
    loop {
        match decoder.decode(&mut buf) {
            Ok(Some(RequestEvent::Data(d))) => data += d.len(),
            Ok(Some(RequestEvent::End)) | Ok(None) => return (data, None),
            Ok(Some(RequestEvent::Head(_))) => {}
            Err(e) => return (data, Some(e)),
        }
    }
}

#[test]
fn a_body_padded_out_with_chunk_extensions_is_refused_and_one_byte_chunks_are_not() {
    let head = &b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"[..];
    // One byte of data per kilobyte of extension: refused once the framing passes its
    // bound, long before the body's data does.
    let padded_chunk = [
        &b"1;"[..],
        &[b'e'; crate::limits::CHUNK_LINE_BYTES_MAX - 4],
        b"\r\nx\r\n",
    ]
    .concat();
    // Enough chunks that their framing passes the bound and the allowance for their data
    // (16 bytes per data byte, so each chunk counts as its length less 17 against it).
    let chunks = crate::limits::CHUNK_FRAMING_BYTES_MAX / (padded_chunk.len() - 32) + 1;
    assert!(
        chunks < TEST_BODY_BYTES_MAX,
        "the data alone is within the limit"
    );
    let padded = [head, &padded_chunk.repeat(chunks), b"0\r\n\r\n"].concat();
    let (data, err) = decode_all(&padded);
    assert_eq!(err, Some(HttpError::PayloadTooLarge));
    assert!(data < chunks, "{data} of {chunks} bytes delivered");
    // The same data bytes in one-byte chunks with a short extension each: accepted.
    let plain = [head, &b"1;a=b\r\nx\r\n".repeat(chunks), b"0\r\n\r\n"].concat();
    assert_eq!(decode_all(&plain), (chunks, None));
}
