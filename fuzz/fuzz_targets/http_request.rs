//! Fuzzes the HTTP/1.1 request decoder (request heads, Content-Length and chunked bodies,
//! pipelining) with a split oracle: the same bytes fed whole, cut in two at a point the
//! input chooses, and in small pieces must give the same heads, the same body bytes, the
//! same end of each request and the same error, and leave the same bytes unread.
//!
//! Input: one byte picks the body limit (small limits reach the 413 paths), one the piece
//! size, two the cut point; the rest is the connection's bytes.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use mcpyard::http::{HttpError, RequestDecoder, RequestEvent, RequestHead};
use mcpyard::limits::MESSAGE_BYTES_MAX;
use mcpyard_fuzz::{Input, pieces, split};

/// What a decoder made of a connection's bytes, with adjacent body bytes joined (how a body
/// is cut into `Data` events depends on how the bytes arrived; the bytes do not).
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Head(Box<RequestHead>),
    Body(Vec<u8>),
    End,
}

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    seen: Vec<Seen>,
    error: Option<HttpError>,
    unread: Bytes,
}

fn run(limit: usize, parts: &[&[u8]]) -> Outcome {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut decoder = RequestDecoder::new(limit);
    let mut buf = BytesMut::new();
    let mut seen = Vec::new();
    let mut calls = 0usize;
    for part in parts {
        buf.extend_from_slice(part);
        loop {
            // Every event but `End` consumes bytes and `End` follows something that did, so
            // a decoder that keeps emitting without input is stuck.
            calls += 1;
            assert!(
                calls <= 2 * total + 2 * parts.len() + 8,
                "decoder does not settle"
            );
            match decoder.decode(&mut buf) {
                Ok(Some(RequestEvent::Head(head))) => seen.push(Seen::Head(Box::new(head))),
                Ok(Some(RequestEvent::Data(data))) => {
                    assert!(!data.is_empty(), "empty Data event");
                    match seen.last_mut() {
                        Some(Seen::Body(body)) => body.extend_from_slice(&data),
                        _ => seen.push(Seen::Body(data.to_vec())),
                    }
                }
                Ok(Some(RequestEvent::End)) => seen.push(Seen::End),
                Ok(None) => break,
                Err(error) => {
                    // A failed decoder repeats its error.
                    assert_eq!(decoder.decode(&mut buf), Err(error));
                    return Outcome {
                        seen,
                        error: Some(error),
                        unread: Bytes::new(),
                    };
                }
            }
        }
    }
    Outcome {
        seen,
        error: None,
        unread: buf.freeze(),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let limit = match input.byte() {
        0..=127 => MESSAGE_BYTES_MAX,
        small => usize::from(small - 128),
    };
    let piece = usize::from(input.byte() % 16);
    let selector = input.u16();
    let bytes = input.rest();
    let whole = run(limit, &[bytes]);
    let halves = run(limit, &split(bytes, selector));
    assert_eq!(whole, halves, "whole and cut in two differ");
    let small = run(limit, &pieces(bytes, piece));
    assert_eq!(whole, small, "whole and in pieces of {piece} differ");
});
