//! Incremental bookkeeping for a head that is still arriving.
//!
//! httparse is not resumable, so a naive decoder reparses the whole partial head on every
//! read, which costs O(n²) on a head trickled in one byte at a time. `HeadScan` remembers how
//! far the buffer has been searched for line ends, so each byte is searched once and the head
//! is reparsed only when a new line has completed. Parsing only complete lines also makes the
//! outcome independent of how reads were split: the same lines give the same answer.

use bytes::{Buf, BytesMut};

/// How much of the head being received has been looked at.
#[derive(Debug, Default)]
pub(super) struct HeadScan {
    /// Bytes at the front of the buffer already searched for line ends.
    /// Invariant: `lines_bytes <= scanned_bytes`.
    scanned_bytes: usize,
    /// Length of the prefix made of complete lines (ending in LF), as last parsed.
    lines_bytes: usize,
}

impl HeadScan {
    /// Forgets the head; called once a head is complete and split off the buffer.
    pub(super) fn reset(&mut self) {
        *self = HeadScan::default();
    }

    /// Returns true once the start line has completed (a line ending has been seen).
    pub(super) fn start_line_complete(&self) -> bool {
        self.lines_bytes > 0
    }

    /// Returns the length of the complete-lines prefix of `window` if it grew since the last
    /// call (the head should be parsed again), or `None` if no new line has completed.
    pub(super) fn grown_lines(&mut self, window: &[u8]) -> Option<usize> {
        if window.len() < self.scanned_bytes {
            // The caller shrank the buffer under us; start over rather than trust stale marks.
            self.reset();
        }
        let fresh = window.get(self.scanned_bytes..).unwrap_or_default();
        let last_lf = fresh.iter().rposition(|b| *b == b'\n');
        let fresh_start = self.scanned_bytes;
        self.scanned_bytes = window.len();
        let lines_bytes = fresh_start.checked_add(last_lf?)?.checked_add(1)?;
        assert!(lines_bytes > self.lines_bytes);
        self.lines_bytes = lines_bytes;
        Some(lines_bytes)
    }
}

/// Removes empty lines (CRLF or LF) from the front of `buf` (RFC 9112 §2.2: a server
/// should ignore at least one empty line before the request line). A lone CR is left for
/// the next read or for the parser to refuse. The caller resets its `HeadScan` if this
/// returns true.
pub(super) fn strip_empty_lines(buf: &mut BytesMut) -> bool {
    let mut stripped = false;
    // Each iteration removes at least one byte, so the loop ends within buf.len() steps.
    loop {
        let skip = match (buf.first(), buf.get(1)) {
            (Some(b'\n'), _) => 1,
            (Some(b'\r'), Some(b'\n')) => 2,
            _ => return stripped,
        };
        buf.advance(skip);
        stripped = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_grow_only_on_new_line_ends() {
        let mut scan = HeadScan::default();
        assert_eq!(scan.grown_lines(b"GET / HT"), None);
        assert!(!scan.start_line_complete());
        assert_eq!(scan.grown_lines(b"GET / HTTP/1.1\r\nHo"), Some(16));
        assert!(scan.start_line_complete());
        assert_eq!(scan.grown_lines(b"GET / HTTP/1.1\r\nHost"), None);
        assert_eq!(
            scan.grown_lines(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"),
            Some(27)
        );
        assert_eq!(scan.grown_lines(b"x\n"), Some(2));
    }

    #[test]
    fn empty_lines_are_stripped() {
        let mut buf = BytesMut::from(&b"\r\n\n\r\nGET"[..]);
        assert!(strip_empty_lines(&mut buf));
        assert_eq!(&buf[..], b"GET");
        assert!(!strip_empty_lines(&mut buf));
        let mut lone_cr = BytesMut::from(&b"\r"[..]);
        assert!(!strip_empty_lines(&mut lone_cr));
        assert_eq!(&lone_cr[..], b"\r");
    }
}
