//! SSE decoder: turns an upstream `text/event-stream` body, arriving in fragments of any size,
//! into [`Message`]s.
//!
//! The rules are WHATWG HTML §9.2.6 "Parsing an event stream" and "Interpreting an event
//! stream", with one intended difference: a block is dispatched whenever it set at least one
//! field, not only when its data buffer is non-empty, so that MCP priming events (an id with
//! no data) and `retry`-only blocks reach the gateway.
//!
//! The decoder consumes each complete line from the front of the caller's buffer as soon as
//! it is seen, and remembers how far it already searched an incomplete line for its end, so
//! every input byte is examined a bounded number of times however the stream is fragmented.

use bytes::{Buf, Bytes, BytesMut};

use super::SseError;
use crate::limits::SSE_EVENT_BYTES_MAX;

/// The UTF-8 byte order mark, skipped once at the start of a stream (WHATWG: "One leading
/// U+FEFF BYTE ORDER MARK character must be ignored if any are present").
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event: the fields its block set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Message {
    /// The `id` field set in this block (`Some("")` when the block reset the id). The id that
    /// persists across blocks is [`Decoder::last_event_id`].
    pub id: Option<String>,
    /// The `event` field (event type) set in this block.
    pub event: Option<String>,
    /// The `data` lines of this block joined with LF; `None` when the block had no `data`
    /// field. Not necessarily UTF-8.
    pub data: Option<Bytes>,
    /// The last valid `retry` value in this block, in milliseconds.
    pub retry_ms: Option<u64>,
}

/// Incremental event stream decoder; one per upstream response body.
///
/// After an error the decoder is poisoned: every later call returns the same error, because
/// the position in the stream can no longer be trusted.
#[derive(Debug, Default)]
pub struct Decoder {
    /// The stream start has been checked for a BOM (it was skipped or is absent).
    bom_checked: bool,
    /// The previous line ended with a CR: an LF at the front of the buffer completes that
    /// CRLF and is dropped rather than read as an empty line.
    after_cr: bool,
    /// Bytes at the front of the buffer already searched for a line end without finding one.
    /// Invariant: `line_scanned <= buf.len()` between calls with the same buffer.
    line_scanned: usize,
    /// Bytes of the current block consumed so far (lines and their ends, comments included).
    /// Invariant: `block_bytes <= SSE_EVENT_BYTES_MAX`.
    block_bytes: usize,
    /// The block being assembled.
    pending: Message,
    /// The data buffer of the block being assembled (moved into `pending.data` on dispatch).
    data: BytesMut,
    /// The persistent last event ID buffer (WHATWG), updated by every accepted `id` field.
    last_id: String,
    /// The error that poisoned this decoder, if any.
    failed: Option<SseError>,
}

impl Decoder {
    /// Creates a decoder positioned at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Next complete message from the front of `buf` (consumed bytes removed). Ok(None) = need
    /// more bytes.
    ///
    /// A message is emitted at a blank line if the block had at least one field (comments
    /// alone emit nothing). Bytes of an incomplete line stay in `buf`; the caller appends more
    /// to the same buffer and calls again (the decoder remembers how far it searched it). Errors: [`SseError::EventTooLarge`] when a block exceeds
    /// [`SSE_EVENT_BYTES_MAX`].
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Message>, SseError> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        let result = self.decode_lines(buf);
        if let Err(error) = result {
            self.failed = Some(error);
        }
        result
    }

    /// The event id most recently set (persists across messages, per the WHATWG rules) — what
    /// a client sends as Last-Event-ID. `None` when no id was set or it was reset to empty.
    pub fn last_event_id(&self) -> Option<&str> {
        if self.last_id.is_empty() {
            None
        } else {
            Some(&self.last_id)
        }
    }

    /// Consumes lines until one completes a block with fields, or the buffer runs out.
    fn decode_lines(&mut self, buf: &mut BytesMut) -> Result<Option<Message>, SseError> {
        if !self.bom_checked {
            if buf.len() < BOM.len() && BOM.starts_with(buf) {
                return Ok(None);
            }
            if buf.starts_with(BOM) {
                buf.advance(BOM.len());
            }
            self.bom_checked = true;
        }
        // Every iteration but the last consumes at least one line-end byte, so the number of
        // iterations is bounded by the buffer length.
        for _ in 0..=buf.len() {
            if self.after_cr {
                let Some(&first) = buf.first() else {
                    return Ok(None);
                };
                self.after_cr = false;
                if first == b'\n' {
                    buf.advance(1);
                }
            }
            let Some(end) = self.find_line_end(buf) else {
                self.check_block_bytes(buf.len())?;
                return Ok(None);
            };
            // `end < buf.len()`: it is the index of the CR or LF just found.
            self.check_block_bytes(end + 1)?;
            self.block_bytes += end + 1;
            self.after_cr = buf.get(end) == Some(&b'\r');
            let applied = self.on_line(buf.get(..end).unwrap_or_default());
            buf.advance(end + 1);
            self.line_scanned = 0;
            if let Some(message) = applied? {
                return Ok(Some(message));
            }
        }
        Ok(None)
    }

    /// Index of the first CR or LF in `buf`, searching only bytes not searched before.
    fn find_line_end(&mut self, buf: &[u8]) -> Option<usize> {
        // A caller that shrank the buffer behind our back gets a full rescan, never a miss.
        let from = if self.line_scanned <= buf.len() {
            self.line_scanned
        } else {
            0
        };
        let unscanned = buf.get(from..).unwrap_or_default();
        match unscanned.iter().position(|&b| b == b'\r' || b == b'\n') {
            Some(at) => Some(from + at),
            None => {
                self.line_scanned = buf.len();
                None
            }
        }
    }

    /// Fails when `more` bytes would take the current block past the limit.
    fn check_block_bytes(&self, more: usize) -> Result<(), SseError> {
        if more > SSE_EVENT_BYTES_MAX - self.block_bytes {
            return Err(SseError::EventTooLarge);
        }
        Ok(())
    }

    /// Applies one line (without its line end); returns the message a blank line dispatches.
    fn on_line(&mut self, line: &[u8]) -> Result<Option<Message>, SseError> {
        if line.is_empty() {
            return Ok(self.dispatch());
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(0) => return Ok(None), // A comment.
            Some(colon) => {
                let (name, rest) = line.split_at(colon);
                let value = rest.get(1..).unwrap_or_default();
                (name, value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        self.on_field(name, value)
    }

    /// Applies one field; unknown fields are ignored.
    fn on_field(&mut self, name: &[u8], value: &[u8]) -> Result<Option<Message>, SseError> {
        match name {
            b"data" => {
                if self.pending.data.is_some() {
                    self.data.extend_from_slice(b"\n");
                }
                self.data.extend_from_slice(value);
                self.pending.data = Some(Bytes::new());
            }
            // WHATWG: an id containing NUL is ignored entirely.
            // Bytes that are not UTF-8 are decoded as U+FFFD, as the WHATWG stream decoder
            // (and so any browser) does: one odd byte from an upstream does not end its
            // stream.
            b"id" if !value.contains(&0) => {
                let id = String::from_utf8_lossy(value);
                self.last_id.clear();
                self.last_id.push_str(&id);
                self.pending.id = Some(id.into_owned());
            }
            b"event" => {
                self.pending.event = Some(String::from_utf8_lossy(value).into_owned());
            }
            b"retry" => {
                if let Some(ms) = parse_digits(value) {
                    self.pending.retry_ms = Some(ms);
                }
            }
            _ => {}
        }
        Ok(None)
    }

    /// Ends the current block: returns it when it set any field, and starts a new one.
    fn dispatch(&mut self) -> Option<Message> {
        self.block_bytes = 0;
        let mut message = std::mem::take(&mut self.pending);
        if message.data.is_some() {
            message.data = Some(self.data.split().freeze());
        }
        let empty = message.id.is_none()
            && message.event.is_none()
            && message.data.is_none()
            && message.retry_ms.is_none();
        if empty { None } else { Some(message) }
    }
}

/// Parses a `retry` value: only ASCII digits, at least one, fitting in a u64; else `None`.
fn parse_digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    let mut n: u64 = 0;
    for &byte in value {
        if !byte.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(byte - b'0'))?;
    }
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One message built from its parts, for the tables below.
    fn msg(
        id: Option<&str>,
        event: Option<&str>,
        data: Option<&[u8]>,
        retry: Option<u64>,
    ) -> Message {
        Message {
            id: id.map(str::to_owned),
            event: event.map(str::to_owned),
            data: data.map(Bytes::copy_from_slice),
            retry_ms: retry,
        }
    }

    fn data(d: &[u8]) -> Message {
        msg(None, None, Some(d), None)
    }

    /// Drains every complete message from `buf`.
    fn drain(decoder: &mut Decoder, buf: &mut BytesMut, into: &mut Vec<Message>) {
        for _ in 0..=buf.len() + 1 {
            match decoder.decode(buf) {
                Ok(Some(message)) => into.push(message),
                Ok(None) => return,
                Err(error) => panic!("unexpected error {error}"),
            }
        }
        panic!("decoder did not settle");
    }

    /// Decodes `input` delivered as the given fragments; returns messages and the last id.
    fn feed(fragments: &[&[u8]]) -> (Vec<Message>, Option<String>) {
        let mut decoder = Decoder::new();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for fragment in fragments {
            buf.extend_from_slice(fragment);
            drain(&mut decoder, &mut buf, &mut out);
        }
        (out, decoder.last_event_id().map(str::to_owned))
    }

    /// Asserts that whole, every two-way split and byte-at-a-time deliveries agree with `want`.
    fn check(input: &[u8], want: &[Message], want_last_id: Option<&str>) {
        let want_last_id = want_last_id.map(str::to_owned);
        let whole = feed(&[input]);
        assert_eq!(whole.0, want, "whole input {input:?}");
        assert_eq!(whole.1, want_last_id, "last id, input {input:?}");
        for cut in 0..=input.len() {
            let (head, tail) = input.split_at(cut);
            assert_eq!(feed(&[head, tail]), whole, "input {input:?} cut at {cut}");
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(feed(&bytes), whole, "input {input:?} byte at a time");
    }

    #[test]
    fn table_of_streams() {
        let priming = msg(Some("p1"), None, Some(b""), None);
        let cases: Vec<(&[u8], Vec<Message>, Option<&str>)> = vec![
            (b"data: hi\n\n", vec![data(b"hi")], None),
            (b"\xEF\xBB\xBFdata: bom\n\n", vec![data(b"bom")], None),
            (b"\xEF\xBB\xBF\xEF\xBB\xBFdata: x\n\n", vec![], None),
            (b"\xEF\xBBdata: x\n\n", vec![], None),
            (b"data: a\rdata: b\r\r", vec![data(b"a\nb")], None),
            (b"data: a\r\ndata: b\r\n\r\n", vec![data(b"a\nb")], None),
            (
                b"data: a\r\n\r\r\ndata: b\n\n",
                vec![data(b"a"), data(b"b")],
                None,
            ),
            (b": comment\n\n:\n\n", vec![], None),
            (b": c\ndata: x\n: c2\n\n", vec![data(b"x")], None),
            (b"data\n\n", vec![data(b"")], None),
            (
                b"data:\n\ndata:  two\n\n",
                vec![data(b""), data(b" two")],
                None,
            ),
            (
                b"data: 1\ndata: 2\ndata: 3\n\n",
                vec![data(b"1\n2\n3")],
                None,
            ),
            (b"data: \xff\xfe\n\n", vec![data(b"\xff\xfe")], None),
            (
                b"id: 1\ndata: a\n\ndata: b\n\n",
                vec![msg(Some("1"), None, Some(b"a"), None), data(b"b")],
                Some("1"),
            ),
            (b"id: p1\ndata: \n\n", vec![priming], Some("p1")),
            (
                b"id: p2\n\n",
                vec![msg(Some("p2"), None, None, None)],
                Some("p2"),
            ),
            (
                b"id: 1\n\nid\n\n",
                vec![
                    msg(Some("1"), None, None, None),
                    msg(Some(""), None, None, None),
                ],
                None,
            ),
            (
                b"id: 1\n\nid: a\0b\ndata: x\n\n",
                vec![msg(Some("1"), None, None, None), data(b"x")],
                Some("1"),
            ),
            (b"id: a\0b\n\n", vec![], None),
            (
                b"retry: 3000\n\n",
                vec![msg(None, None, None, Some(3000))],
                None,
            ),
            (
                b"retry: 30s\n\nretry:\n\nretry: -1\n\nretry:  5\n\n",
                vec![],
                None,
            ),
            (b"retry: 99999999999999999999\n\n", vec![], None),
            (
                b"retry: 1\nretry: x\nretry: 2\ndata: d\n\n",
                vec![msg(None, None, Some(b"d"), Some(2))],
                None,
            ),
            (
                b"event: ping\n\n",
                vec![msg(None, Some("ping"), None, None)],
                None,
            ),
            (
                b"event\ndata: x\n\n",
                vec![msg(None, Some(""), Some(b"x"), None)],
                None,
            ),
            (b"foo: bar\nDATA: x\n\n", vec![], None),
            (b"data:x\n\ndata: partial\n", vec![data(b"x")], None),
            (b"data: partial", vec![], None),
            (b"data: cr\r", vec![], None),
            (
                b"id: 5\nevent: e\nretry: 7\ndata: d\n\n",
                vec![msg(Some("5"), Some("e"), Some(b"d"), Some(7))],
                Some("5"),
            ),
            (b"data: a:b: c\n\n", vec![data(b"a:b: c")], None),
            (b"\n\n\r\n\r\rdata: late\n\n", vec![data(b"late")], None),
        ];
        for (input, want, last_id) in &cases {
            check(input, want, *last_id);
        }
    }

    #[test]
    fn last_event_id_persists_across_messages() {
        let (messages, last) = feed(&[b"id: 42\ndata: a\n\ndata: b\n\nevent: e\n\n"]);
        assert_eq!(messages.len(), 3);
        assert_eq!(messages.get(1).and_then(|m| m.id.clone()), None);
        assert_eq!(last.as_deref(), Some("42"));
    }

    #[test]
    fn non_utf8_id_or_event_is_replaced_and_the_stream_goes_on() {
        let mut decoder = Decoder::new();
        let mut buf = BytesMut::from(&b"id: a\xffb\nevent: \xc3\x28\ndata: x\n\n"[..]);
        let message = decoder.decode(&mut buf);
        let message = message
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("one message"));
        assert_eq!(message.id.as_deref(), Some("a\u{fffd}b"));
        assert_eq!(message.event.as_deref(), Some("\u{fffd}("));
        assert_eq!(decoder.last_event_id(), Some("a\u{fffd}b"));
        let mut more = BytesMut::from(&b"data: y\n\n"[..]);
        assert!(matches!(decoder.decode(&mut more), Ok(Some(_))));
    }

    #[test]
    fn oversize_event_is_an_error() {
        // Many lines within one block.
        let line = b"data: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n";
        let mut buf = BytesMut::new();
        while buf.len() <= SSE_EVENT_BYTES_MAX {
            buf.extend_from_slice(line);
        }
        let mut decoder = Decoder::new();
        assert_eq!(decoder.decode(&mut buf), Err(SseError::EventTooLarge));

        // One unterminated line, delivered in pieces: fails before the line ends.
        let mut decoder = Decoder::new();
        let mut buf = BytesMut::from(&b"data: "[..]);
        let chunk = vec![b'x'; 64 * 1024];
        let mut result = Ok(None);
        for _ in 0..=SSE_EVENT_BYTES_MAX / chunk.len() {
            buf.extend_from_slice(&chunk);
            result = decoder.decode(&mut buf);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(SseError::EventTooLarge));
    }

    #[test]
    fn event_at_exactly_the_limit_is_accepted() {
        // "data: " + payload + "\n" + "\n" == SSE_EVENT_BYTES_MAX.
        let payload = vec![b'y'; SSE_EVENT_BYTES_MAX - 8];
        let mut buf = BytesMut::from(&b"data: "[..]);
        buf.extend_from_slice(&payload);
        buf.extend_from_slice(b"\n\n");
        assert_eq!(buf.len(), SSE_EVENT_BYTES_MAX);
        let mut decoder = Decoder::new();
        let got = decoder.decode(&mut buf);
        assert_eq!(got, Ok(Some(data(&payload))));
    }

    #[test]
    fn blank_lines_reset_the_block_limit() {
        let mut decoder = Decoder::new();
        let comment = vec![b':'; 1024 * 1024 - 1];
        for _ in 0..16 {
            let mut buf = BytesMut::from(&comment[..]);
            buf.extend_from_slice(b"\n\n");
            assert_eq!(decoder.decode(&mut buf), Ok(None));
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn long_line_is_searched_once() {
        let mut decoder = Decoder::new();
        let mut buf = BytesMut::from(&b"data: "[..]);
        for _ in 0..1024 {
            buf.extend_from_slice(&[b'z'; 61]);
            assert_eq!(decoder.decode(&mut buf), Ok(None));
            // The next call starts searching where this one stopped.
            assert_eq!(decoder.line_scanned, buf.len());
        }
        buf.extend_from_slice(b"\r");
        assert_eq!(decoder.decode(&mut buf), Ok(None));
        assert_eq!(decoder.line_scanned, 0);
        buf.extend_from_slice(b"\n\n");
        let got = decoder.decode(&mut buf);
        assert_eq!(
            got.map(|m| m.and_then(|m| m.data).map(|d| d.len())),
            Ok(Some(61 * 1024))
        );
        assert!(buf.is_empty());
    }
}
