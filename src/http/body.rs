//! Body decoding shared by requests and responses: Content-Length, chunked, close-delimited.
//!
//! A `BodyDecoder` is started with the framing the head declared and then stepped by its
//! owning decoder. Each step either splits body bytes off the front of the read buffer
//! (zero-copy, never more than is there), consumes framing bytes (chunk-size lines, the CRLF
//! after chunk data, trailers) and asks to be stepped again, reports the end of the body, or
//! says it needs more bytes. Nothing is buffered here.

use bytes::{Buf, Bytes, BytesMut};

use super::BodyFraming;
use super::error::HttpError;
use crate::limits::{
    CHUNK_FRAMING_BYTES_MAX, CHUNK_LINE_BYTES_MAX, HEADER_BYTES_MAX, HEADERS_PER_MESSAGE_MAX,
};

/// Where the body decoder is within the body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BodyState {
    /// Every body byte has been delivered; the next step reports the end.
    Done,
    /// A Content-Length body with `remaining` bytes still to deliver.
    Length { remaining: u64 },
    /// Expecting a chunk-size line (RFC 9112 §7.1).
    ChunkSize,
    /// Inside a chunk's data with `remaining` bytes still to deliver.
    ChunkData { remaining: u64 },
    /// Expecting the CRLF that closes a chunk's data (RFC 9112 §7.1).
    ChunkEnd,
    /// After the last chunk: expecting the trailer section and its blank line (§7.1.2).
    Trailers,
    /// Delivering everything until the peer closes (responses only, §6.3 (8)).
    UntilClose,
}

/// The result of one body step.
#[derive(Debug)]
pub(super) enum BodyStep {
    /// Body bytes split off the front of the buffer; never empty.
    Data(Bytes),
    /// The body is complete.
    End,
    /// Framing bytes were consumed; step again.
    Again,
    /// More bytes are needed before anything can happen.
    Wait,
}

/// Decodes one message body at a time.
#[derive(Debug)]
pub(super) struct BodyDecoder {
    state: BodyState,
    /// Body bytes delivered or announced by chunk sizes so far. Invariant: never above
    /// `body_bytes_max` (checked before each chunk and close-delimited read).
    body_bytes: u64,
    body_bytes_max: u64,
    /// Bytes of chunk framing (size lines with extensions, CRLF after the data) so far.
    /// Invariant: at most [`CHUNK_FRAMING_BYTES_MAX`] plus [`CHUNK_FRAMING_PER_DATA_BYTE`]
    /// times `body_bytes`, so a body padded out with extensions is refused (413) rather
    /// than parsed for as long as its sender likes.
    framing_bytes: u64,
}

/// Chunk framing allowed per byte of chunk data, beyond [`CHUNK_FRAMING_BYTES_MAX`]: a
/// stream of one-byte chunks (five bytes of framing each) passes, padding does not.
const CHUNK_FRAMING_PER_DATA_BYTE: u64 = 16;

impl BodyDecoder {
    /// A decoder that refuses bodies larger than `body_bytes_max` with 413.
    pub(super) fn new(body_bytes_max: usize) -> BodyDecoder {
        BodyDecoder {
            state: BodyState::Done,
            body_bytes: 0,
            body_bytes_max: u64::try_from(body_bytes_max).unwrap_or(u64::MAX),
            framing_bytes: 0,
        }
    }

    /// The largest body this decoder accepts, for the head's Content-Length check.
    pub(super) fn body_bytes_max(&self) -> u64 {
        self.body_bytes_max
    }

    /// Starts a new body with the framing its head declared.
    pub(super) fn start(&mut self, framing: BodyFraming) {
        self.body_bytes = 0;
        self.framing_bytes = 0;
        self.state = match framing {
            BodyFraming::None | BodyFraming::Length(0) => BodyState::Done,
            BodyFraming::Length(remaining) => BodyState::Length { remaining },
            BodyFraming::Chunked => BodyState::ChunkSize,
            BodyFraming::CloseDelimited => BodyState::UntilClose,
        };
    }

    /// Decodes the next piece of the body from the front of `buf`.
    pub(super) fn step(&mut self, buf: &mut BytesMut) -> Result<BodyStep, HttpError> {
        match self.state {
            BodyState::Done => Ok(BodyStep::End),
            BodyState::Length { remaining } => {
                let (data, remaining) = split_data(buf, remaining);
                self.state = match remaining {
                    0 => BodyState::Done,
                    _ => BodyState::Length { remaining },
                };
                Ok(data)
            }
            BodyState::ChunkSize => self.step_chunk_size(buf),
            BodyState::ChunkData { remaining } => {
                let (data, remaining) = split_data(buf, remaining);
                self.state = match remaining {
                    0 => BodyState::ChunkEnd,
                    _ => BodyState::ChunkData { remaining },
                };
                Ok(data)
            }
            BodyState::ChunkEnd => self.step_chunk_end(buf),
            BodyState::Trailers => self.step_trailers(buf),
            BodyState::UntilClose => self.step_until_close(buf),
        }
    }

    /// Handles the peer closing the connection: ends a close-delimited body, refuses others.
    ///
    /// Callers step until `Wait` first, so any bytes still in the buffer are delivered.
    pub(super) fn finish(&mut self) -> Result<BodyStep, HttpError> {
        match self.state {
            BodyState::Done => Ok(BodyStep::End),
            BodyState::UntilClose => {
                self.state = BodyState::Done;
                Ok(BodyStep::End)
            }
            _ => Err(HttpError::BadRequest(
                "connection closed before end of body",
            )),
        }
    }

    /// Parses a chunk-size line, `1*HEXDIG [chunk-ext] CRLF` (RFC 9112 §7.1).
    fn step_chunk_size(&mut self, buf: &mut BytesMut) -> Result<BodyStep, HttpError> {
        // The line, CRLF included, is at most CHUNK_LINE_BYTES_MAX + 2 bytes.
        let line_bytes_max = CHUNK_LINE_BYTES_MAX + 2;
        let scan = buf.get(..buf.len().min(line_bytes_max)).unwrap_or_default();
        let Some(lf_at) = scan.iter().position(|b| *b == b'\n') else {
            if buf.len() >= line_bytes_max {
                return Err(HttpError::BadRequest("chunk size line too long"));
            }
            return Ok(BodyStep::Wait);
        };
        let line = scan.get(..lf_at).unwrap_or_default();
        let Some((b'\r', line)) = line.split_last() else {
            // RFC 9112 §7.1 requires CRLF here; a bare LF is a smuggling ambiguity.
            return Err(HttpError::BadRequest("chunk size line without crlf"));
        };
        if !line.first().is_some_and(u8::is_ascii_hexdigit) {
            return Err(HttpError::BadRequest("invalid chunk size"));
        }
        // httparse lets any octet through in extensions; refuse controls (DEL included) ourselves.
        if line.iter().any(|b| b.is_ascii_control() && *b != b'\t') {
            return Err(HttpError::BadRequest("invalid chunk extension"));
        }
        let line_len = lf_at + 1;
        let chunk_bytes = match httparse::parse_chunk_size(scan.get(..line_len).unwrap_or_default())
        {
            Ok(httparse::Status::Complete((used, size))) if used == line_len => size,
            _ => return Err(HttpError::BadRequest("invalid chunk size")),
        };
        // Count the chunk before its data arrives, so an oversized body is refused early.
        let body_bytes = self
            .body_bytes
            .checked_add(chunk_bytes)
            .filter(|total| *total <= self.body_bytes_max)
            .ok_or(HttpError::PayloadTooLarge)?;
        // The line, and the CRLF that will follow the chunk's data.
        let framing_bytes = self.framing_bytes.saturating_add(line_len as u64 + 2);
        let framing_max = (CHUNK_FRAMING_BYTES_MAX as u64)
            .saturating_add(body_bytes.saturating_mul(CHUNK_FRAMING_PER_DATA_BYTE));
        if framing_bytes > framing_max {
            return Err(HttpError::PayloadTooLarge);
        }
        self.framing_bytes = framing_bytes;
        self.body_bytes = body_bytes;
        buf.advance(line_len);
        self.state = match chunk_bytes {
            0 => BodyState::Trailers,
            remaining => BodyState::ChunkData { remaining },
        };
        Ok(BodyStep::Again)
    }

    /// Consumes the CRLF after a chunk's data (RFC 9112 §7.1).
    fn step_chunk_end(&mut self, buf: &mut BytesMut) -> Result<BodyStep, HttpError> {
        let bad = HttpError::BadRequest("chunk data not followed by crlf");
        match (buf.first(), buf.get(1)) {
            (None, _) => Ok(BodyStep::Wait),
            (Some(b'\r'), None) => Ok(BodyStep::Wait),
            (Some(b'\r'), Some(b'\n')) => {
                buf.advance(2);
                self.state = BodyState::ChunkSize;
                Ok(BodyStep::Again)
            }
            _ => Err(bad),
        }
    }

    /// Reads and discards the trailer section (RFC 9112 §7.1.2), bounded like a head.
    fn step_trailers(&mut self, buf: &mut BytesMut) -> Result<BodyStep, HttpError> {
        let scan = buf
            .get(..buf.len().min(HEADER_BYTES_MAX))
            .unwrap_or_default();
        let mut slots = [httparse::EMPTY_HEADER; HEADERS_PER_MESSAGE_MAX];
        match httparse::parse_headers(scan, &mut slots) {
            Ok(httparse::Status::Complete((used, _))) => {
                buf.advance(used);
                self.state = BodyState::Done;
                Ok(BodyStep::Again)
            }
            Ok(httparse::Status::Partial) if buf.len() >= HEADER_BYTES_MAX => {
                Err(HttpError::HeaderFieldsTooLarge)
            }
            Ok(httparse::Status::Partial) => Ok(BodyStep::Wait),
            Err(httparse::Error::TooManyHeaders) => Err(HttpError::HeaderFieldsTooLarge),
            Err(_) => Err(HttpError::BadRequest("invalid trailer field")),
        }
    }

    /// Delivers whatever is buffered, up to `body_bytes_max` in total.
    fn step_until_close(&mut self, buf: &mut BytesMut) -> Result<BodyStep, HttpError> {
        if buf.is_empty() {
            return Ok(BodyStep::Wait);
        }
        let room = self.body_bytes_max.saturating_sub(self.body_bytes);
        if room == 0 {
            return Err(HttpError::PayloadTooLarge);
        }
        let (data, _) = split_data(buf, room);
        if let BodyStep::Data(bytes) = &data {
            self.body_bytes = self.body_bytes.saturating_add(bytes.len() as u64);
        }
        Ok(data)
    }
}

/// Splits up to `remaining` body bytes off `buf`; returns the step and what then remains.
fn split_data(buf: &mut BytesMut, remaining: u64) -> (BodyStep, u64) {
    if remaining == 0 {
        return (BodyStep::Again, 0);
    }
    if buf.is_empty() {
        return (BodyStep::Wait, remaining);
    }
    let take = usize::try_from(remaining)
        .unwrap_or(usize::MAX)
        .min(buf.len());
    let data = buf.split_to(take).freeze();
    // `take <= remaining` by construction, so this cannot underflow.
    let left = remaining.saturating_sub(take as u64);
    (BodyStep::Data(data), left)
}
