//! Test support for the decoders: feed input whole, split in two at every byte boundary and
//! one byte at a time, and check that every way of feeding yields the same events.
//!
//! A codec that depends on how reads happen to be split is a codec with a latent bug, so each
//! table case in `request/tests.rs` and `response/tests.rs` goes through `assert_all_splits`.

use std::fmt::Debug;

use bytes::BytesMut;

use super::error::HttpError;
use super::request::{RequestDecoder, RequestEvent, RequestHead};
use super::response::{ResponseDecoder, ResponseEvent, ResponseHead};

/// Decode calls allowed per feed before a test declares the decoder stuck.
const TEST_CALLS_PER_FEED_MAX: usize = 100_000;

/// A decoder event, or the error that ended decoding, with Data already concatenated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Out<H> {
    Head(H),
    Data(Vec<u8>),
    End,
    Err(HttpError),
}

/// Everything one way of feeding produced.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Outcome<H> {
    pub(super) events: Vec<Out<H>>,
    /// Bytes left in the buffer at the end; `None` after an error (they no longer matter).
    pub(super) rest: Option<Vec<u8>>,
}

/// The decoders, seen uniformly by the split helper.
pub(super) trait Feed {
    type Head: Clone + Debug + PartialEq;
    fn feed(&mut self, buf: &mut BytesMut) -> Result<Option<Out<Self::Head>>, HttpError>;
    fn feed_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Out<Self::Head>>, HttpError>;
}

impl Feed for RequestDecoder {
    type Head = RequestHead;

    fn feed(&mut self, buf: &mut BytesMut) -> Result<Option<Out<RequestHead>>, HttpError> {
        Ok(self.decode(buf)?.map(|event| match event {
            RequestEvent::Head(head) => Out::Head(head),
            RequestEvent::Data(data) => Out::Data(data.to_vec()),
            RequestEvent::End => Out::End,
        }))
    }

    fn feed_eof(&mut self, _buf: &mut BytesMut) -> Result<Option<Out<RequestHead>>, HttpError> {
        Ok(None)
    }
}

/// A response decoder answering requests whose HEAD-ness is fixed for the whole test.
pub(super) struct Responses {
    pub(super) decoder: ResponseDecoder,
    pub(super) head_request: bool,
}

impl Feed for Responses {
    type Head = ResponseHead;

    fn feed(&mut self, buf: &mut BytesMut) -> Result<Option<Out<ResponseHead>>, HttpError> {
        let event = self.decoder.decode(buf, self.head_request)?;
        Ok(event.map(response_out))
    }

    fn feed_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Out<ResponseHead>>, HttpError> {
        Ok(self.decoder.decode_eof(buf)?.map(response_out))
    }
}

fn response_out(event: ResponseEvent) -> Out<ResponseHead> {
    match event {
        ResponseEvent::Head(head) => Out::Head(head),
        ResponseEvent::Data(data) => Out::Data(data.to_vec()),
        ResponseEvent::End => Out::End,
    }
}

/// Feeds `parts` in order, draining events after each; then signals EOF if `eof`.
pub(super) fn run<F: Feed>(decoder: &mut F, parts: &[&[u8]], eof: bool) -> Outcome<F::Head> {
    let mut buf = BytesMut::new();
    let mut events = Vec::new();
    let mut failed = false;
    for part in parts {
        buf.extend_from_slice(part);
        failed = drain(&mut events, || decoder.feed(&mut buf));
        if failed {
            break;
        }
    }
    if eof && !failed {
        failed = drain(&mut events, || decoder.feed_eof(&mut buf));
    }
    Outcome {
        events: merge_data(events),
        rest: (!failed).then(|| buf.to_vec()),
    }
}

/// Calls `next` until it needs more bytes or fails; returns true if it failed.
fn drain<H>(
    events: &mut Vec<Out<H>>,
    mut next: impl FnMut() -> Result<Option<Out<H>>, HttpError>,
) -> bool {
    for _ in 0..TEST_CALLS_PER_FEED_MAX {
        match next() {
            Ok(Some(out)) => {
                if let Out::Data(data) = &out {
                    assert!(!data.is_empty(), "decoders never emit empty Data");
                }
                events.push(out);
            }
            Ok(None) => return false,
            Err(err) => {
                events.push(Out::Err(err));
                return true;
            }
        }
    }
    panic!("decoder did not stop emitting events");
}

/// Joins consecutive Data events, which differ only by how the input was split.
fn merge_data<H>(events: Vec<Out<H>>) -> Vec<Out<H>> {
    let mut merged: Vec<Out<H>> = Vec::with_capacity(events.len());
    for out in events {
        match (merged.last_mut(), out) {
            (Some(Out::Data(seen)), Out::Data(data)) => seen.extend_from_slice(&data),
            (_, out) => merged.push(out),
        }
    }
    merged
}

/// Decodes `input` whole, split in two at every byte boundary, and one byte at a time, with a
/// fresh decoder from `make` each time; asserts all agree and returns the whole-input result.
pub(super) fn assert_all_splits<F: Feed>(
    make: impl Fn() -> F,
    input: &[u8],
    eof: bool,
) -> Outcome<F::Head> {
    let whole = run(&mut make(), &[input], eof);
    for at in 0..=input.len() {
        let (first, rest) = input.split_at(at);
        let split = run(&mut make(), &[first, rest], eof);
        assert_eq!(split, whole, "split at byte {at} of {:?}", preview(input));
    }
    let bytes: Vec<&[u8]> = input.chunks(1).collect();
    let one_by_one = run(&mut make(), &bytes, eof);
    assert_eq!(
        one_by_one,
        whole,
        "one byte at a time: {:?}",
        preview(input)
    );
    whole
}

/// The start of `input`, for assertion messages.
fn preview(input: &[u8]) -> String {
    String::from_utf8_lossy(input.get(..input.len().min(80)).unwrap_or_default()).into_owned()
}

/// A tiny xorshift64* generator for seeded random tests (no extra crates).
pub(super) struct XorShift(u64);

impl XorShift {
    /// Seeds from `MCPYARD_SEED` if set (decimal), else from `default`; returns the seed too.
    pub(super) fn from_env(default: u64) -> (XorShift, u64) {
        let seed = std::env::var("MCPYARD_SEED")
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .unwrap_or(default);
        // Zero is a fixed point of xorshift; nudge it.
        (XorShift(seed | 1), seed)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A value in `0..bound` (`bound > 0`); the slight modulo bias does not matter here.
    pub(super) fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }
}
