//! Fuzzes the SSE encoder and decoder together with an encode-then-decode round trip:
//! events built from the input are written with `encode_event` (or the streaming
//! `DataWriter`, whose bytes must equal `encode_event`'s), interleaved with comments and
//! retry blocks, and the decoder, fed the stream cut at a point the input chooses, must give
//! back exactly those events: the same id, event name and retry, and the data with each CR,
//! LF or CRLF read as LF. Fields the encoder refuses (CR, LF or NUL in an id or event name)
//! must be refused without writing a byte.
//!
//! Input: two bytes of cut point, then blocks separated by 0xFE. A block's first byte holds
//! flags (bit 0 id, 1 event, 2 retry, 3 data, 4 write with `DataWriter`, 5 a comment instead,
//! 6 a retry block instead, bits 5-7 also the writer's fragment size); the rest of the block
//! is split on 0xFF into the id, the event name, the retry value's eight bytes and the data.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use mcpyard::sse::{
    DataWriter, Decoder, Event, Message, encode_comment, encode_event, encode_retry,
};
use mcpyard_fuzz::{Input, split};

/// The data a receiver reads for `data`: every CR, LF or CRLF is one LF.
fn lines_as_lf(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len());
    let mut bytes = data.iter().peekable();
    while let Some(&b) = bytes.next() {
        if b == b'\r' {
            if bytes.peek() == Some(&&b'\n') {
                bytes.next();
            }
            out.push(b'\n');
        } else {
            out.push(b);
        }
    }
    out
}

fn retry_of(bytes: &[u8]) -> u64 {
    let mut all = [0u8; 8];
    for (slot, b) in all.iter_mut().zip(bytes) {
        *slot = *b;
    }
    u64::from_le_bytes(all)
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let selector = input.u16();
    let mut wire = BytesMut::new();
    let mut want: Vec<Message> = Vec::new();
    let mut want_last_id: Option<String> = None;
    for block in input.rest().split(|&b| b == 0xFE) {
        let Some((&flags, fields)) = block.split_first() else {
            continue;
        };
        let mut parts = fields.splitn(4, |&b| b == 0xFF);
        let id = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        let event = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
        let retry = retry_of(parts.next().unwrap_or_default());
        let payload = parts.next().unwrap_or_default();
        if flags & 0x60 == 0x20 {
            // A comment: the receiver dispatches nothing for it.
            encode_comment(&event, &mut wire);
            continue;
        }
        if flags & 0x60 == 0x40 {
            encode_retry(retry, &mut wire);
            want.push(Message {
                retry_ms: Some(retry),
                ..Message::default()
            });
            continue;
        }
        let ev = Event {
            id: (flags & 1 == 1).then_some(id.as_str()),
            event: (flags & 2 == 2).then_some(event.as_str()),
            retry_ms: (flags & 4 == 4).then_some(retry),
            data: (flags & 8 == 8).then_some(payload),
        };
        let bad = |s: Option<&str>| s.is_some_and(|s| s.contains(['\r', '\n', '\0']));
        let mut encoded = BytesMut::new();
        let result = encode_event(&ev, &mut encoded);
        if bad(ev.id) || bad(ev.event) {
            assert!(result.is_err(), "a bad field was accepted: {ev:?}");
            assert!(encoded.is_empty(), "a refused event wrote bytes");
            continue;
        }
        assert_eq!(result, Ok(()));
        let writer_fits = ev.event.is_none() && ev.retry_ms.is_none() && ev.data.is_some();
        if flags & 0x10 == 0x10 && writer_fits {
            // The streaming writer must produce exactly what encode_event does.
            let size = usize::from(flags >> 5) + 1;
            let mut streamed = BytesMut::new();
            let mut writer = DataWriter::begin(ev.id, &mut streamed).expect("id was checked");
            for fragment in payload.chunks(size) {
                writer.write(fragment, &mut streamed);
            }
            writer.write(b"", &mut streamed);
            writer.finish(&mut streamed);
            assert_eq!(streamed, encoded, "DataWriter and encode_event differ");
        }
        wire.extend_from_slice(&encoded);
        if let Some(id) = ev.id {
            want_last_id = Some(id.to_owned()).filter(|id| !id.is_empty());
        }
        let message = Message {
            id: ev.id.map(str::to_owned),
            event: ev.event.map(str::to_owned),
            data: ev.data.map(|d| Bytes::from(lines_as_lf(d))),
            retry_ms: ev.retry_ms,
        };
        if message != Message::default() {
            want.push(message);
        }
    }

    let mut decoder = Decoder::new();
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for part in split(&wire, selector) {
        buf.extend_from_slice(part);
        while let Some(message) = decoder.decode(&mut buf).expect("encoded events decode") {
            got.push(message);
        }
    }
    assert!(buf.is_empty(), "bytes left over");
    assert_eq!(got, want, "wire {:?}", String::from_utf8_lossy(&wire));
    assert_eq!(
        decoder.last_event_id(),
        want_last_id.as_deref(),
        "last event id"
    );
});
