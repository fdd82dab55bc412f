//! Fuzzes chunked transfer coding with an encode-then-decode round trip: a body cut into
//! chunks by the input is written with mcpyard's chunk encoder behind a request or response
//! head (with a header field whose value comes from the input), followed by a second,
//! Content-Length message on the same connection; the decoder, fed those bytes cut at a
//! point the input chooses, must give back both heads with that field value (less the
//! spaces and tabs HTTP drops around a value), exactly the body bytes, both ends, and
//! nothing left over. A value the head encoder refuses (a control byte other than HTAB)
//! must be refused without a byte written.
//!
//! Input: one byte of flags (request or response, `encode_chunk` or `encode_chunk_of` in two
//! parts), one byte giving the number of chunk lengths that follow (one byte each), two
//! bytes of cut point, one byte giving the header value's length; then the value, then the
//! body.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mcpyard::http::{
    BodyFraming, HeadError, Headers, RequestDecoder, RequestEvent, ResponseDecoder, ResponseEvent,
    encode_chunk, encode_chunk_of, encode_last_chunk, encode_request_head, encode_response_head,
    field_value_ok,
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
    let headers: [(&str, &[u8]); 2] = [("host", b"fuzz"), ("x-fuzz", value)];
    let head = |wire: &mut BytesMut, framing: BodyFraming, first: bool| {
        if response {
            encode_response_head(200, &headers, framing, wire)
        } else {
            let method = if first { "POST" } else { "GET" };
            encode_request_head(method, "/mcp", &headers, framing, wire)
        }
    };
    let mut wire = BytesMut::new();
    let written = head(&mut wire, BodyFraming::Chunked, true);
    if !field_value_ok(value) {
        assert_eq!(written, Err(HeadError::Value("x-fuzz")));
        assert!(wire.is_empty(), "a refused head wrote bytes");
        return;
    }
    assert_eq!(written, Ok(()));
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
    assert_eq!(head(&mut wire, framing, false), Ok(()));
    wire.extend_from_slice(tail);

    // RFC 9110 §5.5: spaces and tabs around a field value are not part of it.
    let want_value = Some(value.trim_ascii().to_vec());
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
