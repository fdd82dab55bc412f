//! One deadline queue per worker for the request path, instead of one runtime timer per
//! request.
//!
//! A `tools/call` used to arm two tokio timers (the reply's deadline in the server binding,
//! the upstream head's in the client), each a registration in tokio's timer wheel behind its
//! driver's lock and a removal when the request ended early, as nearly every request does:
//! about 1.5 k instructions per call in callgrind, timers and clock reads together. Here a
//! [`Deadline`] is an entry in this worker's queue: a slab slot and a heap entry, no lock.
//! One task per worker (the driver) holds the worker's only timer for these, armed at the
//! earliest deadline; it is moved only when a deadline earlier than the armed one arrives,
//! so a steady stream of requests with the same timeout never moves it. When it fires, the
//! driver wakes the futures whose deadline passed and arms the timer for the next one.
//!
//! Bounds: the slab holds one entry per live [`Deadline`] that has been polled. A deadline
//! dropped before it fires leaves a stale heap entry; the heap is rebuilt from the live
//! entries whenever stale ones outnumber live ones (and [`STALE_MIN`] of them gathered),
//! so it never holds more than twice the live entries plus that constant.
//!
//! The queue exists on threads that started its driver ([`start`]: every worker, and the
//! test runtime). Elsewhere a [`Deadline`] is a plain tokio timer, so it works anywhere.

use super::notify::Notify;
use slab::Slab;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Instant;

/// Stale heap entries tolerated before a rebuild is considered at all.
pub const STALE_MIN: usize = 64;

/// One registered deadline.
struct Entry {
    at: Instant,
    /// Bumped each time the slot is reused, so a stale heap entry is told from a live one.
    generation: u64,
    waker: Option<Waker>,
    fired: bool,
}

/// This worker's deadlines.
struct Queue {
    entries: Slab<Entry>,
    /// (deadline, slot, generation), earliest first; may hold stale entries (see the
    /// module docs for the bound).
    heap: BinaryHeap<Reverse<(Instant, usize, u64)>>,
    next_generation: u64,
    /// Where the driver's timer is armed, if it is.
    armed: Option<Instant>,
    /// Wakes the driver to re-arm earlier.
    rearm: std::rc::Rc<Notify>,
}

impl Queue {
    fn insert(&mut self, at: Instant, waker: Waker) -> (usize, u64) {
        self.next_generation += 1;
        let generation = self.next_generation;
        let key = self.entries.insert(Entry {
            at,
            generation,
            waker: Some(waker),
            fired: false,
        });
        self.heap.push(Reverse((at, key, generation)));
        if self.armed.is_none_or(|armed| at < armed) {
            self.rearm.notify_one();
        }
        (key, generation)
    }

    fn remove(&mut self, key: usize, generation: u64) {
        if self
            .entries
            .get(key)
            .is_some_and(|e| e.generation == generation)
        {
            self.entries.remove(key);
        }
        let stale = self.heap.len().saturating_sub(self.entries.len());
        if stale >= STALE_MIN && stale > self.entries.len() {
            let live = self
                .entries
                .iter()
                .filter(|(_, e)| !e.fired)
                .map(|(k, e)| Reverse((e.at, k, e.generation)));
            self.heap = live.collect();
        }
    }

    /// Fires every deadline at or before `now`; gives the wakers to wake and the next
    /// deadline still pending.
    fn expire(&mut self, now: Instant, woken: &mut Vec<Waker>) -> Option<Instant> {
        while let Some(Reverse((at, key, generation))) = self.heap.peek().copied() {
            let live = self
                .entries
                .get(key)
                .is_some_and(|e| e.generation == generation && !e.fired);
            if !live {
                self.heap.pop();
                continue;
            }
            if at > now {
                return Some(at);
            }
            self.heap.pop();
            if let Some(entry) = self.entries.get_mut(key) {
                entry.fired = true;
                woken.extend(entry.waker.take());
            }
        }
        None
    }
}

thread_local! {
    static QUEUE: RefCell<Option<Queue>> = const { RefCell::new(None) };
}

/// Starts this thread's queue and its driver task (call inside the worker's `LocalSet`).
/// Idempotent.
pub fn start() {
    let rearm = QUEUE.with(|q| {
        let mut q = q.borrow_mut();
        if q.is_some() {
            return None;
        }
        let rearm = std::rc::Rc::new(Notify::new());
        *q = Some(Queue {
            entries: Slab::new(),
            heap: BinaryHeap::new(),
            next_generation: 0,
            armed: None,
            rearm: rearm.clone(),
        });
        Some(rearm)
    });
    if let Some(rearm) = rearm {
        // Made here and moved into the task, so it runs even if the driver is dropped
        // before its first poll (a runtime whose main future ended at once).
        let stop = Stop;
        tokio::task::spawn_local(async move {
            let _stop = stop;
            drive(rearm).await;
        });
    }
}

/// The queue goes with its driver (the worker's or the test's runtime shutting down), so a
/// later runtime on this thread starts afresh instead of finding a queue nobody drives.
struct Stop;

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = QUEUE.try_with(|q| {
            if let Ok(mut q) = q.try_borrow_mut() {
                *q = None;
            }
        });
    }
}

/// The driver: fires what is due, sleeps until the next deadline or an earlier one comes.
async fn drive(rearm: std::rc::Rc<Notify>) {
    let timer = tokio::time::sleep_until(tokio::time::Instant::now());
    tokio::pin!(timer);
    let mut woken = Vec::new();
    loop {
        let notified = rearm.notified();
        let next = QUEUE.with(|q| {
            let mut q = q.borrow_mut();
            let q = q.as_mut()?;
            // tokio's clock, the one the timer below runs on.
            let next = q.expire(tokio::time::Instant::now().into_std(), &mut woken);
            q.armed = next;
            next
        });
        for waker in woken.drain(..) {
            waker.wake();
        }
        match next {
            Some(at) => {
                timer.as_mut().reset(at.into());
                tokio::select! {
                    () = &mut timer => {}
                    () = notified => {}
                }
            }
            None => notified.await,
        }
    }
}

/// A future that completes at its instant (see the module docs).
pub struct Deadline {
    at: Instant,
    state: State,
    /// Not `Send`: its slot belongs to this thread's queue.
    _local: std::marker::PhantomData<std::rc::Rc<()>>,
}

enum State {
    /// Not polled yet.
    New,
    /// In this worker's queue.
    Queued {
        key: usize,
        generation: u64,
    },
    /// No queue on this thread: a tokio timer.
    Tokio(Pin<Box<tokio::time::Sleep>>),
    Done,
}

/// A [`Deadline`] at `at`.
pub fn until(at: Instant) -> Deadline {
    Deadline {
        at,
        state: State::New,
        _local: std::marker::PhantomData,
    }
}

/// `work`'s output, or `None` when `at` passed first (the work is dropped then). Work done
/// at its first poll costs no timer: the deadline is only queued once the work waits.
pub async fn within<F: Future>(at: Instant, work: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        out = work => Some(out),
        () = until(at) => None,
    }
}

impl Future for Deadline {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let at = self.at;
        match &mut self.state {
            State::Done => Poll::Ready(()),
            State::Tokio(sleep) => {
                let ready = sleep.as_mut().poll(cx);
                if ready.is_ready() {
                    self.state = State::Done;
                }
                ready
            }
            State::New => {
                let queued = QUEUE.with(|q| {
                    q.borrow_mut()
                        .as_mut()
                        .map(|q| q.insert(at, cx.waker().clone()))
                });
                self.state = match queued {
                    Some((key, generation)) => State::Queued { key, generation },
                    None => {
                        let mut sleep = Box::pin(tokio::time::sleep_until(at.into()));
                        if sleep.as_mut().poll(cx).is_ready() {
                            State::Done
                        } else {
                            State::Tokio(sleep)
                        }
                    }
                };
                match self.state {
                    State::Done => Poll::Ready(()),
                    _ => Poll::Pending,
                }
            }
            State::Queued { key, generation } => {
                let (key, generation) = (*key, *generation);
                let fired = QUEUE.with(|q| {
                    let mut q = q.borrow_mut();
                    let entry = q
                        .as_mut()
                        .and_then(|q| q.entries.get_mut(key))
                        .filter(|e| e.generation == generation);
                    match entry {
                        // Gone from the queue (its thread's queue was replaced): done.
                        None => true,
                        Some(entry) if entry.fired => true,
                        Some(entry) => {
                            if !entry
                                .waker
                                .as_ref()
                                .is_some_and(|w| w.will_wake(cx.waker()))
                            {
                                entry.waker = Some(cx.waker().clone());
                            }
                            false
                        }
                    }
                });
                if !fired {
                    return Poll::Pending;
                }
                QUEUE.with(|q| {
                    if let Some(q) = q.borrow_mut().as_mut() {
                        q.remove(key, generation);
                    }
                });
                self.state = State::Done;
                Poll::Ready(())
            }
        }
    }
}

impl Drop for Deadline {
    fn drop(&mut self) {
        if let State::Queued { key, generation } = self.state {
            // `try_with`: a deadline dropped while its thread shuts down finds no queue.
            let _ = QUEUE.try_with(|q| {
                if let Ok(mut q) = q.try_borrow_mut()
                    && let Some(q) = q.as_mut()
                {
                    q.remove(key, generation);
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn deadlines_fire_in_order_and_early_drops_leave_nothing_behind() {
        crate::testing::run_local(async {
            let start = Instant::now();
            let order = std::rc::Rc::new(RefCell::new(Vec::new()));
            let mut handles = Vec::new();
            for (i, ms) in [(0, 30u64), (1, 10), (2, 20)] {
                let order = order.clone();
                handles.push(tokio::task::spawn_local(async move {
                    until(start + Duration::from_millis(ms)).await;
                    order.borrow_mut().push(i);
                }));
            }
            // Many that end early, as requests do.
            for _ in 0..1000 {
                let d = until(Instant::now() + Duration::from_secs(30));
                tokio::pin!(d);
                let polled = futures_poll_once(d.as_mut()).await;
                assert!(!polled);
            }
            for h in handles {
                h.await.expect("joined");
            }
            assert_eq!(*order.borrow(), vec![1, 2, 0]);
            assert!(start.elapsed() >= Duration::from_millis(30));
            QUEUE.with(|q| {
                let q = q.borrow();
                let q = q.as_ref().expect("started by run_local");
                assert_eq!(q.entries.len(), 0, "every entry released");
                assert!(q.heap.len() <= STALE_MIN, "stale entries rebuilt away");
            });
        });
    }

    #[test]
    fn a_deadline_in_the_past_fires_at_once_and_an_earlier_one_rearms_the_driver() {
        crate::testing::run_local(async {
            let late = until(Instant::now() + Duration::from_secs(60));
            tokio::pin!(late);
            assert!(!futures_poll_once(late.as_mut()).await);
            let t = Instant::now();
            until(Instant::now() - Duration::from_millis(1)).await;
            until(Instant::now() + Duration::from_millis(5)).await;
            assert!(t.elapsed() < Duration::from_secs(5));
        });
    }

    #[test]
    fn a_runtime_after_one_that_ended_at_once_still_gets_a_driver() {
        // The first runtime's main future ends before its driver was ever polled.
        crate::testing::run_local(async {});
        crate::testing::run_local(async {
            let t = Instant::now();
            until(Instant::now() + Duration::from_millis(5)).await;
            assert!(t.elapsed() >= Duration::from_millis(5));
        });
    }

    #[test]
    fn without_a_queue_a_deadline_is_a_tokio_timer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let t = Instant::now();
            until(Instant::now() + Duration::from_millis(5)).await;
            assert!(t.elapsed() >= Duration::from_millis(5));
        });
    }

    /// Polls `f` once; true if it completed.
    async fn futures_poll_once<F: Future + Unpin>(mut f: F) -> bool {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut f).poll(cx).is_ready())).await
    }
}
