//! Sans-IO HTTP/1.1: bytes in, events out, and bytes out again.
//!
//! This module is the wire codec shared by the agent-facing server (which decodes requests and
//! encodes responses) and the upstream-facing client (which encodes requests and decodes
//! responses). It performs no I/O and owns no sockets: a connection hands it the bytes it has
//! read so far in a `BytesMut`, and the decoder removes what it used and returns one event
//! (`Head`, `Data`, `End`) or `Ok(None)` when it needs more bytes. Body bytes are never
//! buffered here; each `Data` event is a zero-copy slice split off the caller's buffer.
//!
//! Reading order: `error.rs` (what can go wrong and the status it maps to), `headers.rs`
//! (zero-copy header fields), `scan.rs` (incremental head scanning), `framing.rs` (RFC 9112 §6.3 body length rules), `body.rs`
//! (Content-Length, chunked and close-delimited bodies), `request.rs` and `response.rs` (the two
//! decoders), `encode.rs` (heads, chunks and canned error responses).
//!
//! Every bound comes from `crate::limits`; outside input never reaches an assertion and always
//! becomes an [`HttpError`].

mod body;
mod encode;
mod error;
mod framing;
mod headers;
mod request;
mod response;
mod scan;
#[cfg(test)]
mod testing;

pub use encode::{
    CHUNK_FRAMING_MAX, Decimal, HeadError, LAST_CHUNK_BYTES, content_length_bytes, encode_chunk,
    encode_chunk_of, encode_chunk_size, encode_error_response, encode_last_chunk,
    encode_request_head, encode_response_head, field_value_ok, field_value_round_trips, put_bulk,
    put_content_length, reason_phrase, response_head_fields, token_ok,
};
pub use error::HttpError;
pub use headers::Headers;
pub use request::{Method, RequestDecoder, RequestEvent, RequestHead};
pub use response::{ResponseDecoder, ResponseEvent, ResponseHead};

/// How the body of a message is delimited (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyFraming {
    /// The message has no body: `End` follows `Head` directly.
    None,
    /// The body is exactly this many bytes (`Content-Length`).
    Length(u64),
    /// The body uses the chunked transfer coding (RFC 9112 §7.1).
    Chunked,
    /// The body runs until the peer closes the connection; only responses use this.
    CloseDelimited,
}
