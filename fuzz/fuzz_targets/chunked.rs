//! Fuzzes chunked transfer coding with an encode-then-decode round trip: a body cut into
//! chunks by the input is written with mcpyard's chunk encoder behind a request or response
//! head (with a header field whose value comes from the input), followed by a second,
//! Content-Length message on the same connection; the decoder, fed those bytes cut at a
//! point the input chooses, must give back both heads with that field value, exactly the
//! body bytes, both ends, and nothing left over.
//!
//! Input: one byte of flags (request or response, `encode_chunk` or `encode_chunk_of` in two
//! parts), one byte giving the number of chunk lengths that follow (one byte each), two
//! bytes of cut point, one byte giving the header value's length; then the value, then the
//! body.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mcpyard::http::{
    BodyFraming, Headers, RequestDecoder, RequestEvent, ResponseDecoder, ResponseEvent,
    encode_chunk, encode_chunk_of, encode_last_chunk, encode_request_head, encode_response_head,
};
use mcpyard::limits::MESSAGE_BYTES_MAX;
use mcpyard_fuzz::{Input, split};

/// One decoded message: its head's framing and fields, and its body.
#[derive(Debug, PartialEq, Eq)]
struct Message {
    framing: BodyFraming,
    value: Option<Vec<u8>>,
    body: Vec<u8>,
}

fn message(framing: BodyFraming, headers: &Headers) -> Message {
    Message {
        framing,
        value: headers.get("x-fuzz").map(<[u8]>::to_vec),
        body: Vec::new(),
    }
}

/// Decodes requests from `parts`; returns the messages and the bytes left unread.
fn requests(parts: &[&[u8]]) -> (Vec<Message>, usize) {
    let mut decoder = RequestDecoder::new(MESSAGE_BYTES_MAX);
    let mut buf = BytesMut::new();
    let mut out: Vec<Message> = Vec::new();
    for part in parts {
        buf.extend_from_slice(part);
        while let Some(event) = decoder.decode(&mut buf).expect("encoded requests decode") {
            match event {
                RequestEvent::Head(head) => out.push(message(head.body, &head.headers)),
                RequestEvent::Data(data) => {
                    let last = out.last_mut().expect("data after a head");
                    last.body.extend_from_slice(&data);
                }
                RequestEvent::End => {}
            }
        }
    }
    (out, buf.len())
}

/// Decodes responses from `parts`; returns the messages and the bytes left unread.
fn responses(parts: &[&[u8]]) -> (Vec<Message>, usize) {
    let mut decoder = ResponseDecoder::new(MESSAGE_BYTES_MAX);
    let mut buf = BytesMut::new();
    let mut out: Vec<Message> = Vec::new();
    for part in parts {
        buf.extend_from_slice(part);
        while let Some(event) = decoder
            .decode(&mut buf, false)
            .expect("encoded responses decode")
        {
            match event {
                ResponseEvent::Head(head) => out.push(message(head.body, &head.headers)),
                ResponseEvent::Data(data) => {
                    let last = out.last_mut().expect("data after a head");
                    last.body.extend_from_slice(&data);
                }
                ResponseEvent::End => {}
            }
        }
    }
    (out, buf.len())
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let flags = input.byte();
    let response = flags & 1 == 1;
    let two_parts = flags & 2 == 2;
    let lengths: Vec<usize> = (0..input.byte() % 16)
        .map(|_| usize::from(input.byte()))
        .collect();
    let selector = input.u16();
    let value_len = usize::from(input.byte());
    let rest = input.rest();
    let (value, mut body) = rest.split_at(value_len.min(rest.len()));
    // A field value the decoder keeps as written: visible ASCII, spaces and tabs inside,
    // none at either end (RFC 9110 §5.5).
    let value: Vec<u8> = value
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' || b == b'\t' {
                b
            } else {
                b'x'
            }
        })
        .collect();
    let value = value.trim_ascii();
    let headers: [(&str, &[u8]); 2] = [("host", b"fuzz"), ("x-fuzz", value)];
    let mut wire = BytesMut::new();
    if response {
        encode_response_head(200, &headers, BodyFraming::Chunked, &mut wire);
    } else {
        encode_request_head("POST", "/mcp", &headers, BodyFraming::Chunked, &mut wire);
    }
    let whole_body = body.to_vec();
    for length in lengths.iter().copied().chain([usize::MAX]) {
        let (chunk, rest) = body.split_at(length.min(body.len()));
        if two_parts {
            let (a, b) = chunk.split_at(chunk.len() / 2);
            encode_chunk_of([a, b], &mut wire);
        } else {
            encode_chunk(chunk, &mut wire);
        }
        body = rest;
    }
    encode_last_chunk(&mut wire);
    // A second message right behind: the chunked body must end exactly where it should.
    let tail = b"next";
    let framing = BodyFraming::Length(tail.len() as u64);
    if response {
        encode_response_head(200, &headers, framing, &mut wire);
    } else {
        encode_request_head("GET", "/mcp", &headers, framing, &mut wire);
    }
    wire.extend_from_slice(tail);

    let want_value = if value.is_empty() {
        Some(Vec::new())
    } else {
        Some(value.to_vec())
    };
    let want = vec![
        Message {
            framing: BodyFraming::Chunked,
            value: want_value.clone(),
            body: whole_body,
        },
        Message {
            framing,
            value: want_value,
            body: tail.to_vec(),
        },
    ];
    let parts = split(&wire, selector);
    let got = if response {
        responses(&parts)
    } else {
        requests(&parts)
    };
    assert_eq!(got, (want, 0), "wire {:?}", String::from_utf8_lossy(&wire));
});
