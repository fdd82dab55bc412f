//! Incremental bookkeeping for a head that is still arriving.
//!
//! httparse is not resumable, so a naive decoder reparses the whole partial head on every
//! read, which costs O(n²) on a head trickled in one byte at a time. `HeadScan` remembers how
//! far the buffer has been searched for line ends, so each byte is searched once and the head
//! is reparsed only when a new line has completed. Parsing only complete lines also makes the
//! outcome independent of how reads were split: the same lines give the same answer.
//!
//! The search stops at the empty line that ends the head, so the body bytes that usually
//! arrive in the same read (a Content-Length body rarely holds a newline) are never searched.
//! Stopping there does not change what the parser answers: httparse reads a head line by
//! line from the front and stops at that empty line, so any complete-lines prefix that
//! includes it parses the same as the head alone. Line ends are found with `memchr` (SIMD),
//! and each LF found costs O(1) more: a look at the one byte before it.

use bytes::{Buf, BytesMut};

/// How much of the head being received has been looked at.
#[derive(Debug, Default)]
pub(super) struct HeadScan {
    /// Bytes at the front of the buffer already searched for line ends.
    /// Invariant: `lines_bytes <= scanned_bytes`.
    scanned_bytes: usize,
    /// Length of the prefix made of complete lines (ending in LF), as last parsed; the next
    /// line starts here.
    lines_bytes: usize,
    /// True once a non-empty line has completed. Only an empty line after one ends the head;
    /// empty lines before the start line are skipped (RFC 9112 §2.2), as httparse does.
    text_seen: bool,
}

impl HeadScan {
    /// Forgets the head; called once a head is complete and split off the buffer.
    pub(super) fn reset(&mut self) {
        *self = HeadScan::default();
    }

    /// Parses the head at the front of `window` with `parse` once it can be: `Ok(None)`
    /// while it is not complete.
    ///
    /// The usual case, a whole head in its first read, is parsed at once, without the
    /// search for line ends. A head not complete (or not valid) there takes the line path,
    /// which decides as before: only complete lines are parsed, and only when a new one has
    /// arrived. httparse stops at the head's empty line, so a complete parse of the whole
    /// window is the parse of the head alone.
    pub(super) fn parse<T, E>(
        &mut self,
        window: &[u8],
        parse: impl Fn(&[u8]) -> Result<Option<T>, E>,
    ) -> Result<Option<T>, E> {
        if self.scanned_bytes == 0
            && let Ok(Some(head)) = parse(window)
        {
            return Ok(Some(head));
        }
        match self.grown_lines(window) {
            Some(lines_bytes) => parse(window.get(..lines_bytes).unwrap_or_default()),
            None => Ok(None),
        }
    }

    /// Returns true once the start line has completed (a line ending has been seen).
    pub(super) fn start_line_complete(&self) -> bool {
        self.lines_bytes > 0
    }

    /// Returns the length of the complete-lines prefix of `window` if it grew since the last
    /// call (the head should be parsed again), or `None` if no new line has completed.
    ///
    /// The prefix ends at the head's final empty line once that has arrived, even if more
    /// complete lines follow it; bytes after that line are left unsearched.
    pub(super) fn grown_lines(&mut self, window: &[u8]) -> Option<usize> {
        if window.len() < self.scanned_bytes {
            // The caller shrank the buffer under us; start over rather than trust stale marks.
            self.reset();
        }
        assert!(self.lines_bytes <= self.scanned_bytes);
        let fresh_start = self.scanned_bytes;
        let fresh = window.get(fresh_start..).unwrap_or_default();
        self.scanned_bytes = window.len();
        let lines_before = self.lines_bytes;
        for lf_at in memchr::memchr_iter(b'\n', fresh) {
            // `fresh_start + lf_at < window.len()`, so neither addition overflows.
            let line_end = fresh_start + lf_at + 1;
            // The line without its LF; it starts where the last complete line ended.
            let line = window
                .get(self.lines_bytes..line_end - 1)
                .unwrap_or_default();
            let empty = line.is_empty() || line == b"\r";
            self.lines_bytes = line_end;
            if empty && self.text_seen {
                // The head ends here; leave the rest (the body) unsearched.
                self.scanned_bytes = line_end;
                break;
            }
            self.text_seen |= !empty;
        }
        assert!(self.lines_bytes <= self.scanned_bytes);
        (self.lines_bytes > lines_before).then_some(self.lines_bytes)
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
    fn search_stops_at_the_empty_line_that_ends_the_head() {
        let mut scan = HeadScan::default();
        // The body after the head holds line ends; the prefix still ends at the head.
        assert_eq!(
            scan.grown_lines(b"HTTP/1.1 200 OK\r\nA: b\r\n\r\nbody\nmore\r\n\r\n"),
            Some(25)
        );
        scan.reset();
        assert_eq!(scan.grown_lines(b"GET / HTTP/1.1\nA: b\n\nx\n"), Some(21));
        scan.reset();
        // A head that ends exactly at the end of the window.
        assert_eq!(scan.grown_lines(b"GET / HTTP/1.1\n\r\n"), Some(17));
    }

    #[test]
    fn terminator_split_across_reads() {
        let head = b"GET / HTTP/1.1\r\nA: b\r\n\r\nbody\n";
        for cut in [21, 22, 23] {
            let mut scan = HeadScan::default();
            let first = scan.grown_lines(&head[..cut]);
            assert_ne!(
                first,
                Some(24),
                "cut at {cut}: the head is not complete yet"
            );
            // Whatever the first read held, the second ends the prefix at the head's end.
            assert_eq!(scan.grown_lines(head), Some(24), "cut at {cut}");
        }
        let mut scan = HeadScan::default();
        assert_eq!(scan.grown_lines(&head[..24]), Some(24));
    }

    #[test]
    fn empty_lines_before_any_text_do_not_end_the_head() {
        let mut scan = HeadScan::default();
        assert_eq!(
            scan.grown_lines(b"\r\n\nGET / HTTP/1.1\r\n\r\nx\n"),
            Some(21)
        );
    }

    #[test]
    fn trickled_head_grows_once_per_line() {
        let head = b"GET / HTTP/1.1\r\nA: b\r\nC: d\n\r\nbody\nbody\n";
        let mut scan = HeadScan::default();
        let mut grown = Vec::new();
        for end in 1..=head.len() {
            if let Some(lines_bytes) = scan.grown_lines(&head[..end]) {
                grown.push(lines_bytes);
            }
        }
        // One parse per line of the head; body lines after the head's end grow it no more
        // than the decoder, which resets the scan there, would ever see.
        assert_eq!(grown[..4], [16, 22, 27, 29]);
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
