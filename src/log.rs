//! Structured, one-line-per-event logging to stderr.
//!
//! Lines are `<unix seconds>.<millis> <level> <message>`; callers put `key=value` pairs in
//! the message. Never log a credential or a body: quote outside input with [`field`],
//! which bounds and sanitises it.

use crate::limits::LOG_FIELD_BYTES_MAX;
use std::fmt;
use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

#[cfg(test)]
thread_local! {
    /// Lines this thread logged (tests count them: a failure that repeats must not log
    /// once per repeat).
    static LINES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many lines this thread has logged.
#[cfg(test)]
pub fn lines_logged() -> usize {
    LINES.with(std::cell::Cell::get)
}

fn line(level: &str, args: fmt::Arguments<'_>) {
    #[cfg(test)]
    LINES.with(|n| n.set(n.get() + 1));
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "{}.{:03} {level} {args}",
        now.as_secs(),
        now.subsec_millis()
    );
}

/// Logs an informational event.
pub fn info(args: fmt::Arguments<'_>) {
    line("INFO", args);
}

/// Logs a warning: something degraded but mcpyard keeps serving.
pub fn warn(args: fmt::Arguments<'_>) {
    line("WARN", args);
}

/// Logs an error: something failed that an operator should look at.
pub fn error(args: fmt::Arguments<'_>) {
    line("ERROR", args);
}

/// Outside input made safe for a log line: printable ASCII only, at most
/// [`LOG_FIELD_BYTES_MAX`] bytes, quoted.
pub fn field(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len().min(LOG_FIELD_BYTES_MAX) + 2);
    out.push('"');
    for &b in raw.iter().take(LOG_FIELD_BYTES_MAX) {
        match b {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(b as char);
            }
            0x20..=0x7e => out.push(b as char),
            _ => out.push('?'),
        }
    }
    if raw.len() > LOG_FIELD_BYTES_MAX {
        out.push_str("...");
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn field_is_bounded_and_sanitised() {
        assert_eq!(super::field(b"a\"b\n"), "\"a\\\"b?\"");
        let long = vec![b'x'; 1000];
        assert!(super::field(&long).len() < 140);
    }
}
