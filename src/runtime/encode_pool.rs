//! Each worker's encode buffers: where response and request bytes are written before they
//! go to a socket, reused instead of allocated for every message.
//!
//! A buffer from [`take`] is filled and [`Encoded::freeze`]d: the frozen bytes go to the
//! write, and the rest of the buffer, still sharing its allocation, goes back to the pool.
//! The next [`take`] of that buffer writes into the room left after the bytes in flight;
//! once the buffer is full and every write of it is over (its frozen parts dropped), the
//! whole allocation is reclaimed in place. No bytes are ever shared between two owners:
//! each frozen part and the room after it are disjoint.
//!
//! Bounds: the pool keeps at most [`ENCODE_BUFFERS_PER_WORKER`] buffers of
//! [`ENCODE_BUFFER_BYTES`]; a message larger than that gets an allocation of its own, as
//! does one that finds every pooled buffer busy (counted in
//! `mcpyard_encode_buffer_misses_total`); a buffer that grew past its size is not kept.

use crate::metrics;
use bytes::{Bytes, BytesMut};
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Bytes of one pooled encode buffer: a head and a typical JSON-RPC message several times
/// over, so that one buffer serves several messages before it must be reclaimed.
pub const ENCODE_BUFFER_BYTES: usize = 16 * 1024;

/// Encode buffers one worker keeps (at most 1 MiB).
pub const ENCODE_BUFFERS_PER_WORKER: usize = 64;

/// Pooled buffers [`take`] tries before it allocates: the most recently returned first,
/// since a buffer whose writes are over is most likely among them. Keeps a miss cheap.
const TAKE_TRIES_MAX: usize = 4;

thread_local! {
    static FREE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// A buffer being encoded into; derefs to its `BytesMut`.
pub struct Encoded {
    buf: BytesMut,
    /// From the pool (the rest returns there); otherwise sized for one message.
    pooled: bool,
}

impl Deref for Encoded {
    type Target = BytesMut;
    fn deref(&self) -> &BytesMut {
        &self.buf
    }
}

impl DerefMut for Encoded {
    fn deref_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }
}

impl Encoded {
    /// The bytes written, for a write; the room left returns to the pool.
    pub fn freeze(mut self) -> Bytes {
        if self.pooled && self.buf.capacity() <= ENCODE_BUFFER_BYTES {
            return self.buf.split().freeze();
        }
        // Sized for one message (or a pooled buffer that grew past its size, which the
        // pool does not keep): frozen whole, no share to track.
        self.pooled = false;
        std::mem::take(&mut self.buf).freeze()
    }
}

impl Drop for Encoded {
    fn drop(&mut self) {
        if !self.pooled {
            return;
        }
        let mut buf = std::mem::take(&mut self.buf);
        // A buffer that grew (a message longer than it) is not kept: the pool's memory
        // stays bounded. One with no room left is: it is reclaimed once its writes end.
        if buf.capacity() > ENCODE_BUFFER_BYTES {
            return;
        }
        buf.clear();
        FREE.with(|free| {
            let mut free = free.borrow_mut();
            if free.len() < ENCODE_BUFFERS_PER_WORKER {
                free.push(buf);
            }
        });
    }
}

/// A buffer with room for at least `size` bytes: a pooled one when `size` fits one,
/// otherwise (or when the pool has none free) an allocation of `size` bytes.
pub fn take(size: usize) -> Encoded {
    if size > ENCODE_BUFFER_BYTES {
        return Encoded {
            buf: BytesMut::with_capacity(size),
            pooled: false,
        };
    }
    let reused = FREE.with(|free| {
        let mut free = free.borrow_mut();
        let len = free.len();
        let found = (len.saturating_sub(TAKE_TRIES_MAX)..len)
            .rev()
            .find(|&i| free.get_mut(i).is_some_and(|b| b.try_reclaim(size)))?;
        Some(free.swap_remove(found))
    });
    let buf = reused.unwrap_or_else(|| {
        metrics::with(|m| m.encode_buffer_misses += 1);
        BytesMut::with_capacity(ENCODE_BUFFER_BYTES)
    });
    Encoded { buf, pooled: true }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_len() -> usize {
        FREE.with(|f| f.borrow().len())
    }

    #[test]
    fn a_buffer_serves_messages_back_to_back_then_is_reclaimed_in_place() {
        let mut first = take(100);
        first.extend_from_slice(b"first");
        let start = first.as_ptr();
        let a = first.freeze();
        assert_eq!(&a[..], b"first");
        assert_eq!(free_len(), 1, "the rest went back");
        // While `a` is being written, the next message goes after it, in the same buffer.
        let mut second = take(100);
        second.extend_from_slice(b"second");
        let b = second.freeze();
        assert_eq!(
            b.as_ptr(),
            start.wrapping_add(5),
            "room after the first message"
        );
        assert_eq!(&a[..], b"first", "the first message is untouched");
        drop((a, b));
        // Both writes are over: the whole buffer is free again, from its start.
        let mut third = take(ENCODE_BUFFER_BYTES);
        third.extend_from_slice(b"third");
        assert_eq!(third.as_ptr(), start, "reclaimed in place");
        drop(third);
    }

    #[test]
    fn a_full_buffer_in_flight_is_not_reused_and_a_large_message_is_not_pooled() {
        let mut full = take(ENCODE_BUFFER_BYTES);
        full.extend_from_slice(&[b'x'; ENCODE_BUFFER_BYTES]);
        let in_flight = full.freeze();
        let misses = metrics::with(|m| m.encode_buffer_misses);
        let other = take(64);
        assert_eq!(metrics::with(|m| m.encode_buffer_misses), misses + 1);
        assert!(!in_flight.as_ptr_range().contains(&other.as_ptr()));
        drop(other);
        let mut large = take(ENCODE_BUFFER_BYTES + 1);
        large.extend_from_slice(b"large");
        let before = free_len();
        let bytes = large.freeze();
        assert_eq!(&bytes[..], b"large");
        assert_eq!(
            free_len(),
            before,
            "a message-sized buffer does not join the pool"
        );
    }

    #[test]
    fn a_buffer_that_grew_is_not_kept_and_the_pool_is_bounded() {
        let mut grew = take(16);
        grew.extend_from_slice(&vec![b'y'; 2 * ENCODE_BUFFER_BYTES]);
        let before = free_len();
        drop(grew.freeze());
        assert_eq!(free_len(), before, "grown past its size: dropped");
        let held: Vec<Bytes> = (0..ENCODE_BUFFERS_PER_WORKER + 8)
            .map(|_| {
                let mut b = take(ENCODE_BUFFER_BYTES);
                b.extend_from_slice(&[0; ENCODE_BUFFER_BYTES]);
                b.freeze()
            })
            .collect();
        assert!(free_len() <= ENCODE_BUFFERS_PER_WORKER);
        drop(held);
    }
}
