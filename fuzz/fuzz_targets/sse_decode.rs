//! Fuzzes the SSE decoder with a split oracle: an upstream event stream fed whole, cut in
//! two at a point the input chooses, and in small pieces must give the same messages, the
//! same last event id and the same error. Every message must also keep the line structure:
//! no CR or LF in an id or event name, no NUL in an id, no CR in the data (the decoder joins
//! data lines with LF).
//!
//! Input: one byte picks the piece size, two the cut point; the rest is the stream.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use mcpyard::sse::{Decoder, Message, SseError};
use mcpyard_fuzz::{Input, pieces, split};

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    messages: Vec<Message>,
    last_id: Option<String>,
    error: Option<SseError>,
}

fn run(parts: &[&[u8]]) -> Outcome {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let mut decoder = Decoder::new();
    let mut buf = BytesMut::new();
    let mut messages = Vec::new();
    let mut calls = 0usize;
    for part in parts {
        buf.extend_from_slice(part);
        loop {
            calls += 1;
            assert!(
                calls <= total + 2 * parts.len() + 4,
                "decoder does not settle"
            );
            match decoder.decode(&mut buf) {
                Ok(Some(message)) => {
                    check(&message);
                    messages.push(message);
                }
                Ok(None) => break,
                Err(error) => {
                    assert_eq!(decoder.decode(&mut buf), Err(error), "error does not stick");
                    return Outcome {
                        messages,
                        last_id: decoder.last_event_id().map(str::to_owned),
                        error: Some(error),
                    };
                }
            }
        }
    }
    Outcome {
        messages,
        last_id: decoder.last_event_id().map(str::to_owned),
        error: None,
    }
}

/// The line structure a dispatched message must keep.
fn check(message: &Message) {
    let line_break = |s: &str| s.contains(['\r', '\n']);
    if let Some(id) = &message.id {
        assert!(!line_break(id) && !id.contains('\0'), "id {id:?}");
    }
    if let Some(event) = &message.event {
        assert!(!line_break(event), "event {event:?}");
    }
    if let Some(data) = &message.data {
        assert!(!data.contains(&b'\r'), "data {data:?}");
    }
    let empty = message.id.is_none()
        && message.event.is_none()
        && message.data.is_none()
        && message.retry_ms.is_none();
    assert!(!empty, "a message without fields was dispatched");
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let piece = usize::from(input.byte() % 16);
    let selector = input.u16();
    let bytes = input.rest();
    let whole = run(&[bytes]);
    assert_eq!(
        whole,
        run(&split(bytes, selector)),
        "whole and cut in two differ"
    );
    assert_eq!(
        whole,
        run(&pieces(bytes, piece)),
        "whole and in pieces of {piece} differ"
    );
});
