//! Wake-ups between the tasks of one worker: [`Notify`], with the two calls of
//! `tokio::sync::Notify` the gateway uses (`notify_one`, `notify_waiters`), for state that
//! never leaves its worker.
//!
//! Why not tokio's: its `Notify` is built for tasks on many threads, so every `notified()`
//! future takes a mutex and an atomic state on each poll and again when dropped. The
//! request path creates and polls a dozen of them per request (the reply pump waits on
//! its request's wake-up and on its session's end at every frame), which callgrind put at
//! about 1.4 k instructions per `tools/call`. Here a wait is a `Cell` check and, only when
//! the task really waits, a waker in a slab.
//!
//! Semantics, as tokio's: `notify_waiters` completes every [`Notified`] created before it
//! (polled or not) and leaves nothing for later ones; `notify_one` completes one waiting
//! future, or, with none waiting, leaves one permit that the next poll of any `Notified`
//! takes (several `notify_one` calls leave one permit). The usual pattern, create the
//! future, check the condition, then await, therefore loses no wake-up. One difference:
//! a `notify_one` made while the waiter an earlier one woke has not run yet is absorbed by
//! it, where tokio would keep it as a permit; every user here re-checks its condition
//! after each wake-up, so no wake-up it needs is lost.
//!
//! Bound: the first waiter's waker has a slot of its own (most `Notify`s have one waiter
//! at a time: a request's wake-up allocates nothing); the slab holds one entry per other
//! `Notified` that returned `Pending` and has not completed or been dropped since, so it
//! never holds more entries than there are futures waiting on this `Notify`.

use super::pass::{self, Mark};
use slab::Slab;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// A single-threaded `Notify` (see the module docs).
#[derive(Default)]
pub struct Notify {
    /// Bumped by every `notify_waiters`.
    epoch: Cell<u64>,
    /// A `notify_one` found no one waiting.
    permit: Cell<bool>,
    /// The first future waiting now, if it holds this slot ([`Key::First`]): its waker,
    /// `None` once woken and not polled since.
    first: RefCell<Option<Option<Waker>>>,
    /// The other futures waiting now, the same way.
    waiters: RefCell<Slab<Option<Waker>>>,
    /// A wake of the first waiter held back within its task's poll ([`pass`]).
    mark: Mark,
}

/// Where a waiting [`Notified`] keeps its waker.
#[derive(Clone, Copy)]
enum Key {
    First,
    Slab(usize),
}

impl Notify {
    pub fn new() -> Notify {
        Notify::default()
    }

    /// Completes one waiting [`Notified`]; with none waiting, the next poll of any.
    pub fn notify_one(&self) {
        self.permit.set(true);
        let first = self.first.borrow_mut().as_mut().and_then(Option::take);
        if let Some(waker) = first {
            pass::wake_waker(waker, &self.mark);
            return;
        }
        let waker = self
            .waiters
            .borrow_mut()
            .iter_mut()
            .find_map(|(_, w)| w.take());
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Completes every [`Notified`] created before this call.
    pub fn notify_waiters(&self) {
        self.epoch.set(self.epoch.get().wrapping_add(1));
        // Taken out before any is woken: a waker may run code that touches this Notify.
        let first = self.first.borrow_mut().as_mut().and_then(Option::take);
        let wakers: Vec<Waker> = self
            .waiters
            .borrow_mut()
            .iter_mut()
            .filter_map(|(_, w)| w.take())
            .collect();
        if let Some(waker) = first {
            pass::wake_waker(waker, &self.mark);
        }
        for waker in wakers {
            waker.wake();
        }
    }

    /// A future that completes at the next `notify_one` or at a `notify_waiters` made
    /// after this call.
    pub fn notified(&self) -> Notified<'_> {
        Notified {
            notify: self,
            epoch: self.epoch.get(),
            key: None,
        }
    }
}

/// The future of [`Notify::notified`].
pub struct Notified<'a> {
    notify: &'a Notify,
    epoch: u64,
    /// Our waker's place, once we waited.
    key: Option<Key>,
}

impl Notified<'_> {
    fn leave(&mut self) {
        match self.key.take() {
            Some(Key::First) => *self.notify.first.borrow_mut() = None,
            Some(Key::Slab(key)) => {
                self.notify.waiters.borrow_mut().try_remove(key);
            }
            None => {}
        }
    }
}

impl Future for Notified<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let notify = this.notify;
        if matches!(this.key, Some(Key::First)) {
            notify.mark.polled();
        }
        if notify.epoch.get() != this.epoch || notify.permit.replace(false) {
            this.leave();
            return Poll::Ready(());
        }
        let waker = cx.waker();
        let keep = |slot: &mut Option<Waker>| match slot {
            Some(w) if w.will_wake(waker) => {}
            _ => *slot = Some(waker.clone()),
        };
        match this.key {
            Some(Key::First) => {
                if let Some(slot) = notify.first.borrow_mut().as_mut() {
                    keep(slot);
                }
            }
            Some(Key::Slab(key)) => {
                if let Some(slot) = notify.waiters.borrow_mut().get_mut(key) {
                    keep(slot);
                }
            }
            None => {
                let mut first = notify.first.borrow_mut();
                if first.is_none() {
                    *first = Some(Some(waker.clone()));
                    this.key = Some(Key::First);
                } else {
                    let key = notify.waiters.borrow_mut().insert(Some(waker.clone()));
                    this.key = Some(Key::Slab(key));
                }
            }
        }
        Poll::Pending
    }
}

impl Drop for Notified<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::rc::Rc;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// A waker that counts its wakes (also used by `pass`'s tests).
    pub(in crate::runtime) struct Count(pub(in crate::runtime) AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(in crate::runtime) fn counting() -> (Arc<Count>, Waker) {
        let count = Arc::new(Count(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    fn poll(f: &mut Pin<Box<Notified<'_>>>, waker: &Waker) -> Poll<()> {
        f.as_mut().poll(&mut Context::from_waker(waker))
    }

    #[test]
    fn notify_one_wakes_the_waiter_once_and_its_poll_completes() {
        let n = Notify::new();
        let (count, waker) = counting();
        let mut f = Box::pin(n.notified());
        assert!(poll(&mut f, &waker).is_pending());
        n.notify_one();
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        assert!(poll(&mut f, &waker).is_ready());
        // The permit was taken: a new future waits.
        let mut g = Box::pin(n.notified());
        assert!(poll(&mut g, &waker).is_pending());
        drop(g);
        assert!(n.waiters.borrow().is_empty());
    }

    #[test]
    fn notify_one_without_a_waiter_leaves_one_permit() {
        let n = Notify::new();
        let (_, waker) = counting();
        n.notify_one();
        n.notify_one();
        let mut f = Box::pin(n.notified());
        assert!(poll(&mut f, &waker).is_ready());
        let mut g = Box::pin(n.notified());
        assert!(poll(&mut g, &waker).is_pending());
    }

    #[test]
    fn notify_waiters_completes_futures_made_before_it_polled_or_not() {
        let n = Notify::new();
        let (count, waker) = counting();
        let mut polled = Box::pin(n.notified());
        let mut fresh = Box::pin(n.notified());
        assert!(poll(&mut polled, &waker).is_pending());
        n.notify_waiters();
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        let mut later = Box::pin(n.notified());
        assert!(poll(&mut polled, &waker).is_ready());
        assert!(poll(&mut fresh, &waker).is_ready());
        // No permit is left for a future made after the call.
        assert!(poll(&mut later, &waker).is_pending());
        drop(later);
        assert!(n.waiters.borrow().is_empty());
    }

    #[test]
    fn notify_one_wakes_one_of_several_waiters() {
        let n = Notify::new();
        let (a_count, a) = counting();
        let (b_count, b) = counting();
        let mut fa = Box::pin(n.notified());
        let mut fb = Box::pin(n.notified());
        assert!(poll(&mut fa, &a).is_pending());
        assert!(poll(&mut fb, &b).is_pending());
        n.notify_one();
        let woken = a_count.0.load(Ordering::Relaxed) + b_count.0.load(Ordering::Relaxed);
        assert_eq!(woken, 1);
        // Exactly one of them completes.
        let done = [poll(&mut fa, &a), poll(&mut fb, &b)];
        assert_eq!(done.iter().filter(|p| p.is_ready()).count(), 1);
    }

    #[test]
    fn a_dropped_waiter_leaves_no_entry_and_a_woken_task_can_wait_again() {
        let n = Rc::new(Notify::new());
        let (_, waker) = counting();
        for _ in 0..3 {
            let mut f = Box::pin(n.notified());
            assert!(poll(&mut f, &waker).is_pending());
            assert!(poll(&mut f, &waker).is_pending());
            assert_eq!(waiting(&n), 1);
        }
        assert_eq!(waiting(&n), 0);
    }

    /// Wakers held: the first waiter's slot and the slab's entries.
    fn waiting(n: &Notify) -> usize {
        usize::from(n.first.borrow().is_some()) + n.waiters.borrow().len()
    }

    #[test]
    fn waiters_past_the_first_use_the_slab_and_every_one_is_woken() {
        let n = Notify::new();
        let (count, waker) = counting();
        let mut futures: Vec<_> = (0..3).map(|_| Box::pin(n.notified())).collect();
        for f in &mut futures {
            assert!(poll(f, &waker).is_pending());
        }
        assert!(n.first.borrow().is_some());
        assert_eq!(n.waiters.borrow().len(), 2);
        // The first slot freed, a new waiter takes it while the others stay in the slab.
        futures.remove(0);
        assert!(n.first.borrow().is_none());
        let mut late = Box::pin(n.notified());
        assert!(poll(&mut late, &waker).is_pending());
        assert!(n.first.borrow().is_some());
        // notify_one wakes exactly one, notify_waiters the rest.
        n.notify_one();
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        n.notify_waiters();
        assert_eq!(count.0.load(Ordering::Relaxed), 3);
        futures.push(late);
        for f in &mut futures {
            assert!(poll(f, &waker).is_ready());
        }
        drop(futures);
        assert_eq!(waiting(&n), 0);
    }
}
