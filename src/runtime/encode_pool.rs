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
//! does one that finds the buffers it tries busy (counted in
//! `mcpyard_encode_buffer_misses_total`); a buffer that grew past its size is not kept.
//! Buffers tried and found busy move to the back of the queue, and a full pool lets its
//! oldest go for a new one, so buffers held by slow writes cannot starve the pool. A
//! write that does not end (an agent that stopped reading) holds its buffer, 16 KiB at
//! most, beside the socket's own send buffer in the kernel, which is far larger.

use crate::metrics;
use bytes::{Bytes, BytesMut};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::marker::PhantomData;
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
    static FREE: RefCell<VecDeque<BytesMut>> = const { RefCell::new(VecDeque::new()) };
}

/// A buffer being encoded into; derefs to its `BytesMut`.
pub struct Encoded {
    buf: BytesMut,
    /// From the pool (the rest returns there); otherwise sized for one message.
    pooled: bool,
    /// Room the buffer had when taken (or after its last split): more means it grew
    /// into a new allocation, which the pool does not keep.
    room: usize,
    /// Stays on its worker: the pool is the worker's own.
    _local: PhantomData<*const ()>,
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
    fn new(buf: BytesMut, pooled: bool) -> Encoded {
        Encoded {
            room: buf.capacity(),
            buf,
            pooled,
            _local: PhantomData,
        }
    }

    /// True while the buffer is still the pooled allocation it was taken as.
    fn keeps_pooled(&self) -> bool {
        self.pooled && self.buf.capacity() <= self.room
    }

    /// The bytes written, for a write; the room left returns to the pool.
    pub fn freeze(mut self) -> Bytes {
        if self.keeps_pooled() {
            return self.buf.split().freeze();
        }
        // Sized for one message (or a pooled buffer that grew past its size, which the
        // pool does not keep): frozen whole, no share to track.
        self.pooled = false;
        std::mem::take(&mut self.buf).freeze()
    }

    /// The bytes written so far, for a write, leaving the room after them to write on.
    pub fn split_frozen(&mut self) -> Bytes {
        if !self.keeps_pooled() {
            self.pooled = false;
        }
        let out = self.buf.split().freeze();
        self.room = self.buf.capacity();
        out
    }
}

impl Drop for Encoded {
    fn drop(&mut self) {
        if !self.pooled {
            return;
        }
        // A buffer that grew (a message longer than it) is not kept: the pool's memory
        // stays bounded. One with no room left is: it is reclaimed once its writes end.
        if !self.keeps_pooled() {
            return;
        }
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        // `try_with`: a buffer dropped while the thread ends just goes.
        let _ = FREE.try_with(|free| {
            let mut free = free.borrow_mut();
            if free.len() >= ENCODE_BUFFERS_PER_WORKER {
                // The oldest is the one most likely held by a slow write.
                free.pop_front();
            }
            free.push_back(buf);
        });
    }
}

/// A buffer with room for at least `size` bytes: a pooled one when `size` fits one,
/// otherwise (or when the pool has none free) an allocation of `size` bytes.
pub fn take(size: usize) -> Encoded {
    if size > ENCODE_BUFFER_BYTES {
        return Encoded::new(BytesMut::with_capacity(size), false);
    }
    let reused = FREE.with(|free| {
        let mut free = free.borrow_mut();
        for _ in 0..TAKE_TRIES_MAX.min(free.len()) {
            let mut buf = free.pop_back()?;
            if buf.try_reclaim(size) {
                return Some(buf);
            }
            // Busy: to the back of the queue, so the next tries look at others.
            free.push_front(buf);
        }
        None
    });
    let buf = reused.unwrap_or_else(|| {
        metrics::with(|m| m.encode_buffer_misses += 1);
        BytesMut::with_capacity(ENCODE_BUFFER_BYTES)
    });
    Encoded::new(buf, true)
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
    fn bytes_written_but_not_frozen_do_not_reach_the_next_message() {
        let mut dropped = take(64);
        dropped.extend_from_slice(b"never sent");
        drop(dropped);
        let next = take(64);
        assert!(next.is_empty(), "the next message starts empty");
    }

    #[test]
    fn buffers_held_by_slow_writes_do_not_starve_the_pool() {
        // Every pooled buffer full and in flight.
        let held: Vec<Bytes> = (0..ENCODE_BUFFERS_PER_WORKER)
            .map(|_| {
                let mut b = take(ENCODE_BUFFER_BYTES);
                b.extend_from_slice(&[0; ENCODE_BUFFER_BYTES]);
                b.freeze()
            })
            .collect();
        assert_eq!(free_len(), ENCODE_BUFFERS_PER_WORKER);
        let misses = metrics::with(|m| m.encode_buffer_misses);
        let mut first = take(64);
        first.extend_from_slice(b"one");
        let one = first.freeze();
        assert_eq!(
            metrics::with(|m| m.encode_buffer_misses),
            misses + 1,
            "a miss"
        );
        assert_eq!(
            free_len(),
            ENCODE_BUFFERS_PER_WORKER,
            "the oldest let go for it"
        );
        let mut second = take(64);
        second.extend_from_slice(b"two");
        assert_eq!(
            metrics::with(|m| m.encode_buffer_misses),
            misses + 1,
            "the new buffer serves the next message"
        );
        assert_eq!(&second.freeze()[..], b"two");
        assert_eq!(&one[..], b"one");
        drop(held);
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
