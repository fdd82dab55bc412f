//! Each worker's pool of fixed-size buffer slots: the staging areas for socket reads.
//!
//! On io_uring workers as many slots as `RLIMIT_MEMLOCK` allows are registered with the
//! ring as fixed buffers (reads then skip the kernel's per-op page pinning); the rest, and
//! every slot on epoll workers, are plain heap buffers. When every slot is lent out a read
//! uses a small heap buffer instead and a counter moves, so a full pool slows nobody down
//! into a deadlock and is visible in the metrics.

use crate::limits::{SLOT_BYTES, SLOTS_PER_WORKER};
use crate::metrics;
use std::cell::RefCell;
use std::ops::Deref;
use tokio_uring::buf::fixed::{FixedBuf, FixedBufPool};

/// Bytes of the heap buffer a read uses when the pool is empty.
const FALLBACK_READ_BYTES: usize = 4 * 1024;

/// A buffer lent for one read.
pub enum ReadBuf {
    /// A slot registered with the worker's ring.
    Fixed(FixedBuf),
    /// A plain heap slot (or a small fallback buffer when the pool was empty).
    Heap(Vec<u8>),
}

impl Deref for ReadBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            ReadBuf::Fixed(b) => b,
            ReadBuf::Heap(v) => v,
        }
    }
}

/// What a lent buffer is, remembered for a read that may be abandoned in flight (see
/// [`Slots::abandoned`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lent {
    /// A slot registered with the ring.
    Fixed,
    /// A plain heap slot.
    Heap,
    /// A buffer that is not a slot (the empty-pool fallback, or a caller's own).
    Other,
}

impl ReadBuf {
    /// What this buffer is to the pool.
    pub fn lent(&self) -> Lent {
        match self {
            ReadBuf::Fixed(_) => Lent::Fixed,
            ReadBuf::Heap(v) if v.capacity() == SLOT_BYTES => Lent::Heap,
            ReadBuf::Heap(_) => Lent::Other,
        }
    }
}

/// One worker's slots.
pub struct Slots {
    fixed: Option<FixedBufPool<Vec<u8>>>,
    heap: RefCell<Vec<Vec<u8>>>,
}

impl Slots {
    /// Builds the pool; on io_uring registers up to `registered_max` slots with the ring
    /// (must run inside the worker's runtime). Returns the pool and how many are registered.
    pub fn new(uring: bool, registered_max: usize) -> Slots {
        let registered = if uring {
            registered_max.min(SLOTS_PER_WORKER)
        } else {
            0
        };
        let fixed = if registered > 0 {
            let pool = FixedBufPool::new((0..registered).map(|_| Vec::with_capacity(SLOT_BYTES)));
            match pool.register() {
                Ok(()) => Some(pool),
                Err(e) => {
                    crate::log::warn(format_args!(
                        "slots: registering {registered} fixed buffers failed ({e}); using heap slots"
                    ));
                    None
                }
            }
        } else {
            None
        };
        let registered = if fixed.is_some() { registered } else { 0 };
        let heap = (registered..SLOTS_PER_WORKER)
            .map(|_| Vec::with_capacity(SLOT_BYTES))
            .collect();
        metrics::with(|m| {
            m.slots_total = SLOTS_PER_WORKER as u64;
            m.slots_registered = registered as u64;
        });
        Slots {
            fixed,
            heap: RefCell::new(heap),
        }
    }

    /// Lends a buffer for one read; never fails (falls back to a small heap buffer).
    pub fn lend(&self) -> ReadBuf {
        if let Some(b) = self.fixed.as_ref().and_then(|p| p.try_next(SLOT_BYTES)) {
            metrics::with(|m| m.slots_in_use += 1);
            return ReadBuf::Fixed(b);
        }
        if let Some(v) = self.heap.borrow_mut().pop() {
            metrics::with(|m| m.slots_in_use += 1);
            return ReadBuf::Heap(v);
        }
        metrics::with(|m| m.slot_exhausted += 1);
        ReadBuf::Heap(Vec::with_capacity(FALLBACK_READ_BYTES))
    }

    /// A read into a lent buffer was dropped in flight (its connection is being closed,
    /// so the read completes promptly): the buffer stays the kernel's until then, and the
    /// io_uring driver frees it, or returns a fixed one to the ring's pool, on completion.
    /// The slot is counted back now, and a heap slot is replaced so the pool keeps its size.
    pub fn abandoned(&self, lent: Lent) {
        self.counted_back(lent, || Vec::with_capacity(SLOT_BYTES));
    }

    /// Takes a lent buffer back.
    pub fn give_back(&self, buf: ReadBuf) {
        let lent = buf.lent();
        match buf {
            // `buf` is dropped on return: a fixed buffer goes back to the ring's pool.
            ReadBuf::Fixed(_) => self.counted_back(lent, Vec::new),
            // A slot goes back to the pool; a fallback buffer is freed.
            ReadBuf::Heap(v) => self.counted_back(lent, || v),
        }
    }

    /// Counts a lent buffer back: the gauge for a slot, and `heap_slot` back into the pool
    /// for a heap slot (taken only then).
    fn counted_back(&self, lent: Lent, heap_slot: impl FnOnce() -> Vec<u8>) {
        match lent {
            Lent::Fixed => metrics::with(|m| m.slots_in_use -= 1),
            Lent::Heap => {
                metrics::with(|m| m.slots_in_use -= 1);
                let mut heap = self.heap.borrow_mut();
                assert!(heap.len() < SLOTS_PER_WORKER);
                heap.push(heap_slot());
            }
            Lent::Other => {}
        }
    }
}
