//! Server-Sent Events, sans-IO: an encoder for the event streams mcpyard writes downstream and
//! an incremental decoder for the event streams upstream MCP servers send back.
//!
//! Streamable HTTP (MCP 2025-11-25) answers a POST or a GET with `text/event-stream`. The
//! gateway writes events with [`encode_event`] (or, for a large result forwarded fragment by
//! fragment, with a [`DataWriter`]), keeps idle streams alive with [`encode_comment`], and
//! reads upstream bodies with a [`Decoder`] that accepts bytes in arbitrary fragments. Both
//! sides follow the WHATWG HTML "Server-sent events" section (§9.2.6, "Parsing an event
//! stream" and "Interpreting an event stream"). Nothing here does I/O: bytes in, bytes or
//! messages out.

mod decode;
mod encode;

pub use decode::{Decoder, Message};
pub use encode::{DataWriter, Event, encode_comment, encode_event, encode_retry};

use std::fmt;

/// Why an event could not be written or an upstream stream could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SseError {
    /// A field given to the encoder (named here: `"id"` or `"event"`) contains CR, LF or NUL,
    /// which would end the line early or be dropped by the receiver.
    InvalidField(&'static str),
    /// An upstream event block (all its lines, comments included) exceeds
    /// [`crate::limits::SSE_EVENT_BYTES_MAX`].
    EventTooLarge,
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::InvalidField(name) => {
                write!(f, "sse field `{name}` contains CR, LF or NUL")
            }
            SseError::EventTooLarge => f.write_str("sse event exceeds the size limit"),
        }
    }
}

impl std::error::Error for SseError {}

#[cfg(test)]
mod tests;
