//! Fuzzes the HTTP/1.1 response decoder (status lines, interim responses, Content-Length,
//! chunked and close-delimited bodies, the close at the end) with a split oracle: the same
//! bytes fed whole, cut in two at a point the input chooses, and in small pieces must give
//! the same heads, body bytes, ends and error, before and after the peer's close.
//!
//! Input: one byte picks the body limit and whether the request was HEAD, one the piece
//! size, two the cut point; the rest is what the upstream sent before closing.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mcpyard::http::{HttpError, ResponseDecoder, ResponseEvent, ResponseHead};
use mcpyard::limits::MESSAGE_BYTES_MAX;
use mcpyard_fuzz::{Input, pieces, split};

/// What a decoder made of a connection's bytes, adjacent body bytes joined.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Head(Box<ResponseHead>),
    Body(Vec<u8>),
    End,
}

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    seen: Vec<Seen>,
    error: Option<HttpError>,
}

/// Records one decode result; `Some` when the loop should stop.
fn record(
    seen: &mut Vec<Seen>,
    got: Result<Option<ResponseEvent>, HttpError>,
) -> Option<Result<(), HttpError>> {
    match got {
        Ok(Some(ResponseEvent::Head(head))) => seen.push(Seen::Head(Box::new(head))),
        Ok(Some(ResponseEvent::Data(data))) => {
            assert!(!data.is_empty(), "empty Data event");
            match seen.last_mut() {
                Some(Seen::Body(body)) => body.extend_from_slice(&data),
                _ => seen.push(Seen::Body(data.to_vec())),
            }
        }
        Ok(Some(ResponseEvent::End)) => seen.push(Seen::End),
        Ok(None) => return Some(Ok(())),
        Err(error) => return Some(Err(error)),
    }
    None
}

fn run(limit: usize, head_request: bool, parts: &[&[u8]]) -> Outcome {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let bound = 2 * total + 2 * parts.len() + 16;
    let mut decoder = ResponseDecoder::new(limit);
    let mut buf = BytesMut::new();
    let mut seen = Vec::new();
    let mut calls = 0usize;
    for part in parts {
        buf.extend_from_slice(part);
        loop {
            calls += 1;
            assert!(calls <= bound, "decoder does not settle");
            match record(&mut seen, decoder.decode(&mut buf, head_request)) {
                None => continue,
                Some(Ok(())) => break,
                Some(Err(error)) => {
                    assert_eq!(decoder.decode(&mut buf, head_request), Err(error));
                    return Outcome {
                        seen,
                        error: Some(error),
                    };
                }
            }
        }
    }
    // The upstream closes: a close-delimited body ends, anything else cut short fails.
    loop {
        calls += 1;
        assert!(calls <= bound, "decoder does not settle after the close");
        match record(&mut seen, decoder.decode_eof(&mut buf)) {
            None => continue,
            Some(Ok(())) => break,
            Some(Err(error)) => {
                return Outcome {
                    seen,
                    error: Some(error),
                };
            }
        }
    }
    Outcome { seen, error: None }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let control = input.byte();
    let head_request = control & 1 == 1;
    let limit = match control >> 1 {
        0..=63 => MESSAGE_BYTES_MAX,
        small => usize::from(small - 64),
    };
    let piece = usize::from(input.byte() % 16);
    let selector = input.u16();
    let bytes = input.rest();
    let whole = run(limit, head_request, &[bytes]);
    let halves = run(limit, head_request, &split(bytes, selector));
    assert_eq!(whole, halves, "whole and cut in two differ");
    let small = run(limit, head_request, &pieces(bytes, piece));
    assert_eq!(whole, small, "whole and in pieces of {piece} differ");
});
