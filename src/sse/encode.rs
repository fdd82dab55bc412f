//! SSE encoder: whole events, comments, retry hints and a streaming data writer.
//!
//! Every function appends to a caller-owned `BytesMut` (the connection's write staging), so
//! encoding never allocates on its own beyond growing that buffer. Fields are written in the
//! fixed order `id`, `event`, `retry`, `data`, always with one space after the colon, and an
//! event ends with a blank line. WHATWG HTML §9.2.6 treats CR, LF and CRLF alike as line ends,
//! so a newline inside `data` is written as the start of a new `data:` line; the receiver
//! joins those lines with LF.

use bytes::{BufMut, BytesMut};

use super::SseError;

/// One event to write. `data` may contain any bytes; CR, LF and CRLF inside it become
/// separate `data:` lines.
///
/// `data: None` writes no `data` line at all; `data: Some(b"")` writes one empty `data:` line.
/// The MCP 2025-11-25 priming event (an event id and an empty data field) is therefore
/// `Event { id: Some(..), data: Some(b""), .. }`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event<'a> {
    /// The `id` field; must not contain CR, LF or NUL.
    pub id: Option<&'a str>,
    /// The `event` field (event type); must not contain CR, LF or NUL.
    pub event: Option<&'a str>,
    /// The payload; any bytes.
    pub data: Option<&'a [u8]>,
    /// The `retry` field: the reconnection delay the receiver should use, in milliseconds.
    pub retry_ms: Option<u64>,
}

/// Appends one complete event (its fields, then a blank line) to `out`.
///
/// Returns `Err(SseError::InvalidField("id" | "event"))` without writing anything when the id
/// or event name contains CR, LF or NUL. An event with no fields writes a lone blank line,
/// which receivers ignore.
pub fn encode_event(ev: &Event<'_>, out: &mut BytesMut) -> Result<(), SseError> {
    if let Some(id) = ev.id {
        check_field(id, "id")?;
    }
    if let Some(event) = ev.event {
        check_field(event, "event")?;
    }
    if let Some(id) = ev.id {
        put_line(b"id: ", id.as_bytes(), out);
    }
    if let Some(event) = ev.event {
        put_line(b"event: ", event.as_bytes(), out);
    }
    if let Some(ms) = ev.retry_ms {
        out.put_slice(b"retry: ");
        put_u64(ms, out);
        out.put_u8(b'\n');
    }
    if let Some(data) = ev.data {
        out.put_slice(b"data: ");
        put_data(data, out);
        out.put_u8(b'\n');
    }
    out.put_u8(b'\n');
    Ok(())
}

/// Appends a comment block `":" + text + "\n\n"` to `out`; receivers dispatch nothing for it.
///
/// CR and LF in `text` are replaced by spaces so the comment stays one line. The keepalive
/// written on idle streams is `encode_comment("", out)`, which is exactly `":\n\n"`.
pub fn encode_comment(text: &str, out: &mut BytesMut) {
    out.put_u8(b':');
    for &byte in text.as_bytes() {
        let safe = if byte == b'\r' || byte == b'\n' {
            b' '
        } else {
            byte
        };
        out.put_u8(safe);
    }
    out.put_slice(b"\n\n");
}

/// Appends a block that only sets the receiver's reconnection delay: `"retry: <ms>\n\n"`.
pub fn encode_retry(ms: u64, out: &mut BytesMut) {
    out.put_slice(b"retry: ");
    put_u64(ms, out);
    out.put_slice(b"\n\n");
}

/// Streaming data writer for one event whose data arrives in fragments (large JSON results
/// forwarded without buffering).
///
/// Usage: [`DataWriter::begin`], any number of [`DataWriter::write`], then
/// [`DataWriter::finish`]. The bytes written are identical to [`encode_event`] with the
/// concatenated fragments as `data`, however the fragments are split.
#[must_use = "an unfinished DataWriter leaves the event unterminated"]
#[derive(Debug)]
pub struct DataWriter {
    /// The last byte written was a CR that ended a data line: an LF at the start of the next
    /// fragment completes that CRLF and must not start another line.
    after_cr: bool,
}

impl DataWriter {
    /// Writes the `id` line (when given) and the first `"data: "` prefix to `out`.
    ///
    /// Returns `Err(SseError::InvalidField("id"))` without writing anything when `id` contains
    /// CR, LF or NUL.
    pub fn begin(id: Option<&str>, out: &mut BytesMut) -> Result<Self, SseError> {
        if let Some(id) = id {
            check_field(id, "id")?;
            put_line(b"id: ", id.as_bytes(), out);
        }
        out.put_slice(b"data: ");
        Ok(DataWriter { after_cr: false })
    }

    /// Appends one fragment of the data; each CR, LF or CRLF becomes `"\ndata: "`, also when
    /// the CR ends one fragment and the LF starts the next.
    pub fn write(&mut self, fragment: &[u8], out: &mut BytesMut) {
        if fragment.is_empty() {
            return;
        }
        let rest = if self.after_cr {
            fragment.strip_prefix(b"\n").unwrap_or(fragment)
        } else {
            fragment
        };
        self.after_cr = put_data(rest, out);
    }

    /// Ends the last data line and the event: `"\n\n"`.
    pub fn finish(self, out: &mut BytesMut) {
        out.put_slice(b"\n\n");
    }
}

/// Rejects a field value that would break the line structure or be dropped by the receiver
/// (WHATWG ignores an `id` containing NUL).
fn check_field(value: &str, name: &'static str) -> Result<(), SseError> {
    let bad = memchr::memchr3(b'\r', b'\n', 0, value.as_bytes()).is_some();
    if bad {
        return Err(SseError::InvalidField(name));
    }
    Ok(())
}

/// Writes `prefix`, `value` and LF.
fn put_line(prefix: &[u8], value: &[u8], out: &mut BytesMut) {
    out.put_slice(prefix);
    out.put_slice(value);
    out.put_u8(b'\n');
}

/// Writes data bytes, turning each CR, LF or CRLF into `"\ndata: "`.
///
/// Returns true when `data` ends with a CR, so the caller streaming fragments knows that an LF
/// at the start of the next fragment belongs to that CR.
fn put_data(data: &[u8], out: &mut BytesMut) -> bool {
    let mut rest = data;
    let mut ended_cr = false;
    // Each iteration consumes at least one byte (a run plus its line end), so the loop is
    // bounded by the input length.
    while !rest.is_empty() {
        let Some(at) = memchr::memchr2(b'\r', b'\n', rest) else {
            out.put_slice(rest);
            return false;
        };
        let (run, tail) = rest.split_at(at);
        out.put_slice(run);
        out.put_slice(b"\ndata: ");
        match tail {
            [b'\r', b'\n', after @ ..] => {
                rest = after;
                ended_cr = false;
            }
            [b'\r', after @ ..] => {
                rest = after;
                ended_cr = true;
            }
            [_, after @ ..] => {
                rest = after;
                ended_cr = false;
            }
            [] => break,
        }
    }
    ended_cr
}

/// Writes `n` in decimal without allocating.
fn put_u64(n: u64, out: &mut BytesMut) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut n = n;
    // u64::MAX has 20 decimal digits, so `at` never underflows.
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.put_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event_bytes(ev: &Event<'_>) -> Vec<u8> {
        let mut out = BytesMut::new();
        assert_eq!(encode_event(ev, &mut out), Ok(()));
        out.to_vec()
    }

    #[test]
    fn event_fields_in_fixed_order() {
        let ev = Event {
            id: Some("7"),
            event: Some("message"),
            data: Some(b"{\"a\":1}"),
            retry_ms: Some(1500),
        };
        assert_eq!(
            event_bytes(&ev),
            b"id: 7\nevent: message\nretry: 1500\ndata: {\"a\":1}\n\n"
        );
    }

    #[test]
    fn priming_event_with_empty_data_has_data_line() {
        let ev = Event {
            id: Some("s1-0"),
            data: Some(b""),
            ..Event::default()
        };
        assert_eq!(event_bytes(&ev), b"id: s1-0\ndata: \n\n");
    }

    #[test]
    fn event_without_data_has_no_data_line() {
        let ev = Event {
            id: Some("s1-0"),
            ..Event::default()
        };
        assert_eq!(event_bytes(&ev), b"id: s1-0\n\n");
    }

    #[test]
    fn data_newlines_become_data_lines() {
        let cases: [(&[u8], &[u8]); 7] = [
            (b"a\nb", b"data: a\ndata: b\n\n"),
            (b"a\r\nb", b"data: a\ndata: b\n\n"),
            (b"a\rb", b"data: a\ndata: b\n\n"),
            (b"a\r\rb", b"data: a\ndata: \ndata: b\n\n"),
            (b"a\n\r\nb", b"data: a\ndata: \ndata: b\n\n"),
            (b"\n", b"data: \ndata: \n\n"),
            (b"x\r", b"data: x\ndata: \n\n"),
        ];
        for (data, want) in cases {
            let ev = Event {
                data: Some(data),
                ..Event::default()
            };
            assert_eq!(event_bytes(&ev), want, "data {data:?}");
        }
    }

    #[test]
    fn data_keeps_leading_space_and_non_utf8() {
        let ev = Event {
            data: Some(b" \xff\x00"),
            ..Event::default()
        };
        assert_eq!(event_bytes(&ev), b"data:  \xff\x00\n\n");
    }

    #[test]
    fn invalid_id_and_event_rejected_without_output() {
        let mut out = BytesMut::new();
        for bad in ["a\nb", "a\rb", "a\0b"] {
            let ev = Event {
                id: Some(bad),
                data: Some(b"x"),
                ..Event::default()
            };
            assert_eq!(
                encode_event(&ev, &mut out),
                Err(SseError::InvalidField("id"))
            );
            let ev = Event {
                event: Some(bad),
                ..Event::default()
            };
            assert_eq!(
                encode_event(&ev, &mut out),
                Err(SseError::InvalidField("event"))
            );
            assert!(DataWriter::begin(Some(bad), &mut out).is_err());
        }
        assert!(out.is_empty());
    }

    #[test]
    fn comment_and_retry_exact() {
        let mut out = BytesMut::new();
        encode_comment("", &mut out);
        assert_eq!(&out[..], b":\n\n");
        out.clear();
        encode_comment("ping\r\nnow\r", &mut out);
        assert_eq!(&out[..], b":ping  now \n\n");
        out.clear();
        encode_retry(0, &mut out);
        encode_retry(u64::MAX, &mut out);
        assert_eq!(&out[..], b"retry: 0\n\nretry: 18446744073709551615\n\n");
    }

    #[test]
    fn data_writer_matches_encode_event_for_every_split() {
        let inputs: [&[u8]; 6] = [
            b"ab\r\ncd",
            b"\r\n\r\n",
            b"a\r\rb\n",
            b"\r",
            b"",
            b"x\ny\rz",
        ];
        for data in inputs {
            let want = event_bytes(&Event {
                id: Some("9"),
                data: Some(data),
                ..Event::default()
            });
            for cut in 0..=data.len() {
                let (head, tail) = data.split_at(cut);
                let mut out = BytesMut::new();
                let writer = DataWriter::begin(Some("9"), &mut out);
                let Ok(mut writer) = writer else {
                    panic!("begin failed")
                };
                writer.write(head, &mut out);
                writer.write(b"", &mut out);
                writer.write(tail, &mut out);
                writer.finish(&mut out);
                assert_eq!(&out[..], &want[..], "data {data:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn data_writer_cr_then_lf_across_fragments() {
        let mut out = BytesMut::new();
        let Ok(mut writer) = DataWriter::begin(None, &mut out) else {
            panic!("begin failed")
        };
        writer.write(b"{\"a\":\r", &mut out);
        writer.write(b"\n1}", &mut out);
        writer.finish(&mut out);
        assert_eq!(&out[..], b"data: {\"a\":\ndata: 1}\n\n");
    }
}
