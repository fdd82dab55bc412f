//! Wake-ups within one poll of a task: a wake of the task being polled is held back to the
//! end of that poll, and dropped if the future it was for was polled again meanwhile.
//!
//! Why: a request's parts run in one task (the connection's reader and dispatcher, the
//! server's reply pump and the client's exchange, joined), and hand each other work through
//! [`super::notify::Notify`] and the internal stream's pipes. Each hand-off wakes the
//! waiting part, which here means the task that is running: the scheduler then polls the
//! whole task again, although the part that was woken was polled later in the same pass
//! and already took what it was woken for. callgrind counted five polls of a connection's
//! task per `tools/call`, three of them such self-wakes.
//!
//! How: [`run`] wraps a task's future. While it is polled, a wake through [`Waiter::wake`]
//! (or [`wake_waker`]) whose waker is this task's is not made; the wake site's [`Mark`]
//! records it instead, and the pass counts it as outstanding. The woken future calls
//! [`Mark::polled`] whenever it is polled, which settles the mark. When the wrapped poll returns `Pending` with a wake
//! still outstanding, the task wakes itself once. So a wake is never lost: it is made at
//! the end of the poll unless the future it was for has been polled since.
//!
//! A wake outside a wrapped poll, or of another task, is made at once, as before.
//!
//! The pass also reads the clock once: [`now`] within a pass is the time of its first
//! read there (a `tools/call` read the clock 14 times in two polls). For deadlines and
//! activity stamps, which is what it is for; a measurement of work inside one poll, or a
//! loop waiting for the time to move, reads `Instant::now()`.
//!
//! The rule for a waiting place (a [`Waiter`], or a waker slot and its mark): one future
//! waits there at a time, and it calls [`Mark::polled`] at the start of every poll and then
//! checks what it waits for, returning `Ready` or storing its waker again. Two futures of one task
//! waiting in one slot at once could settle each other's wakes; no slot is used so.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, RawWakerVTable, Waker};
use std::time::Instant;

/// The pass being run on this thread.
struct Pass {
    /// The polled task's waker, by identity (compared, never used to wake).
    data: Cell<*const ()>,
    vtable: Cell<*const RawWakerVTable>,
    /// Numbers the passes of this thread; 0 is "no pass".
    id: Cell<u64>,
    next_id: Cell<u64>,
    /// Wakes held back in this pass and not settled yet.
    outstanding: Cell<u32>,
    /// Wakes held back on this thread, ever (tells [`join_in_order`] that one was).
    held: Cell<u64>,
    /// The time [`now`] read first in this pass.
    now: Cell<Option<Instant>>,
}

thread_local! {
    static PASS: Pass = const {
        Pass {
            data: Cell::new(std::ptr::null()),
            vtable: Cell::new(std::ptr::null()),
            id: Cell::new(0),
            next_id: Cell::new(1),
            outstanding: Cell::new(0),
            held: Cell::new(0),
            now: Cell::new(None),
        }
    };
}

/// The time: inside a pass, the same for the whole pass (read at its first call);
/// outside one, read now.
pub fn now() -> Instant {
    PASS.try_with(|p| {
        if p.id.get() == 0 {
            return Instant::now();
        }
        match p.now.get() {
            Some(t) => t,
            None => {
                let t = Instant::now();
                p.now.set(Some(t));
                t
            }
        }
    })
    .unwrap_or_else(|_| Instant::now())
}

/// Where a wake was held back: one per waiting place (a waker slot).
#[derive(Default)]
pub struct Mark(Cell<u64>);

impl Mark {
    /// The future waiting here is being polled: a wake held back for it in this pass is
    /// no longer needed.
    pub fn polled(&self) {
        let held = self.0.get();
        if held == 0 {
            return;
        }
        self.0.set(0);
        PASS.with(|p| {
            if p.id.get() == held {
                p.outstanding.set(p.outstanding.get().saturating_sub(1));
            }
        });
    }
}

/// A waiting place: the waker of the one future waiting there, and the mark of a wake held
/// back for it (see the module docs for the rule it keeps).
#[derive(Default)]
pub struct Waiter {
    waker: Option<Waker>,
    mark: Mark,
}

impl Waiter {
    /// Called at the start of every poll of the waiting future, before it checks what it
    /// waits for.
    pub fn polled(&self) {
        self.mark.polled();
    }

    /// Stores the waiting task's waker, unless the one kept already wakes it (a future
    /// polled again without having been woken keeps its place as it is).
    pub fn register(&mut self, cx: &Context<'_>) {
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.waker = Some(cx.waker().clone());
        }
    }

    /// Forgets the waiting future: it has what it waited for, or it is gone.
    pub fn clear(&mut self) {
        self.waker = None;
    }

    /// Wakes the waiting future, if one waits, or holds the wake back when it is the
    /// waker of the task whose poll is running.
    pub fn wake(&mut self) {
        if let Some(waker) = self.waker.take() {
            wake_waker(waker, &self.mark);
        }
    }
}

/// Wakes `waker`, or holds the wake back when it is the waker of the task whose poll is
/// running, recording it at `mark` (see the module docs).
pub fn wake_waker(waker: Waker, mark: &Mark) {
    let held = PASS.with(|p| {
        let id = p.id.get();
        if id == 0 || waker.data() != p.data.get() || !std::ptr::eq(waker.vtable(), p.vtable.get())
        {
            return false;
        }
        if mark.0.get() != id {
            mark.0.set(id);
            p.outstanding.set(p.outstanding.get() + 1);
        }
        p.held.set(p.held.get().wrapping_add(1));
        true
    });
    if !held {
        waker.wake();
    }
}

/// Runs `fut` with wakes of its own task held back within each poll.
pub fn run<F: Future>(fut: F) -> Run<F> {
    Run { fut }
}

/// The future of [`run`].
pub struct Run<F> {
    fut: F,
}

impl<F: Future> Future for Run<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: a structural projection; `fut` is never moved out of the pinned `Run`,
        // and `Run` has no `Drop` or `Unpin` impl of its own.
        let fut = unsafe { self.map_unchecked_mut(|r| &mut r.fut) };
        let waker = cx.waker();
        let entered = Entered::new(waker);
        let result = fut.poll(cx);
        let outstanding = entered.leave();
        if result.is_pending() && outstanding > 0 {
            waker.wake_by_ref();
        }
        result
    }
}

/// The pass of one [`Run::poll`]: entered with the task's waker, and left (the outer pass,
/// if any, restored) when it is dropped, also when the wrapped poll panics.
struct Entered {
    saved: (*const (), *const RawWakerVTable, u64, u32),
}

impl Entered {
    fn new(waker: &Waker) -> Entered {
        PASS.with(|p| {
            let saved = (
                p.data.get(),
                p.vtable.get(),
                p.id.get(),
                p.outstanding.get(),
            );
            let id = p.next_id.get();
            p.next_id.set(id + 1);
            p.data.set(waker.data());
            p.vtable.set(waker.vtable());
            p.id.set(id);
            p.outstanding.set(0);
            p.now.set(None);
            Entered { saved }
        })
    }

    /// Leaves the pass; the wakes it held back and nothing settled.
    fn leave(self) -> u32 {
        PASS.with(|p| p.outstanding.get())
        // `self` drops here and restores the outer pass.
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        PASS.with(|p| {
            p.data.set(self.saved.0);
            p.vtable.set(self.saved.1);
            p.id.set(self.saved.2);
            p.outstanding.set(self.saved.3);
            // The outer pass (if any) reads the clock afresh: time moved inside this one.
            p.now.set(None);
        });
    }
}

/// Runs `a` and `b` to completion together, `a` first in every poll, and `a` once more
/// after `b` when `b`'s poll held back a wake (most likely of `a`: `a` hands work to `b`
/// and takes its answers, as a relay does with the exit it joins, and as a connection's
/// reader does with its dispatcher, which frees room for more). What one hands the other
/// within a poll is so taken in that poll. Returns `a`'s output once both are done.
/// The two are pinned by the caller, so their states are not copied into this future.
pub fn join_in_order<'f, A: Future, B: Future<Output = ()>>(
    mut a: Pin<&'f mut A>,
    mut b: Pin<&'f mut B>,
) -> impl Future<Output = A::Output> + 'f {
    let mut a_out = None;
    let mut b_done = false;
    std::future::poll_fn(move |cx| {
        if a_out.is_none()
            && let Poll::Ready(out) = a.as_mut().poll(cx)
        {
            a_out = Some(out);
        }
        if !b_done {
            let before = held();
            b_done = b.as_mut().poll(cx).is_ready();
            if a_out.is_none()
                && held() != before
                && let Poll::Ready(out) = a.as_mut().poll(cx)
            {
                a_out = Some(out);
            }
        }
        match (b_done, a_out.take()) {
            (true, Some(out)) => Poll::Ready(out),
            (_, out) => {
                a_out = out;
                Poll::Pending
            }
        }
    })
}

/// Wakes held back on this thread so far.
fn held() -> u64 {
    PASS.with(|p| p.held.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::notify::tests::counting;
    use std::sync::atomic::Ordering;

    /// A future that, on its first poll, stores its waker in `slot` and calls `then`.
    fn polled_with(waker: &Waker, f: impl FnOnce()) -> Poll<()> {
        let mut once = Some(f);
        let mut fut = std::pin::pin!(run(std::future::poll_fn(move |_cx| {
            if let Some(f) = once.take() {
                f();
            }
            Poll::<()>::Pending
        })));
        fut.as_mut().poll(&mut Context::from_waker(waker))
    }

    /// A waiting place holding `waker`.
    fn waiting(waker: &Waker) -> Waiter {
        let mut waiter = Waiter::default();
        waiter.register(&Context::from_waker(waker));
        waiter
    }

    #[test]
    fn now_is_read_once_per_pass_and_afresh_in_the_next() {
        let outside = now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert!(now() > outside, "outside a pass, the clock itself");
        let mut seen = Vec::new();
        let mut polls = 0;
        let mut task = std::pin::pin!(run(std::future::poll_fn(|cx| {
            let first = now();
            std::thread::sleep(std::time::Duration::from_millis(2));
            seen.push((first, now()));
            polls += 1;
            if polls < 2 {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Poll::Ready(())
        })));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(task.as_mut().poll(&mut cx).is_pending());
        assert!(task.as_mut().poll(&mut cx).is_ready());
        let [(a1, a2), (b1, b2)] = seen[..] else {
            panic!("two polls");
        };
        assert_eq!(a1, a2, "one time within a pass");
        assert_eq!(b1, b2, "one time within a pass");
        assert!(b1 > a1, "the next pass reads the clock again");
        assert!(now() > b1, "and after the pass, the clock itself");
    }

    #[test]
    fn a_self_wake_settled_in_the_same_poll_is_not_made() {
        let (count, waker) = counting();
        let mut waiter = waiting(&waker);
        let _ = polled_with(&waker, || {
            waiter.wake();
            waiter.polled();
        });
        assert_eq!(count.0.load(Ordering::Relaxed), 0);
        assert!(waiter.waker.is_none());
    }

    #[test]
    fn a_self_wake_not_settled_is_made_once_at_the_end_of_the_poll() {
        let (count, waker) = counting();
        let (mut a, mut b) = (waiting(&waker), waiting(&waker));
        let _ = polled_with(&waker, || {
            a.wake();
            b.wake();
            a.polled();
        });
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
        // A mark left from an earlier pass settles nothing in a later one.
        b.polled();
        assert_eq!(PASS.with(|p| p.outstanding.get()), 0);
    }

    #[test]
    fn another_tasks_wake_and_a_wake_outside_a_pass_are_made_at_once() {
        let (ours, our_waker) = counting();
        let (theirs, their_waker) = counting();
        let mut waiter = waiting(&their_waker);
        let _ = polled_with(&our_waker, || waiter.wake());
        assert_eq!(theirs.0.load(Ordering::Relaxed), 1);
        assert_eq!(ours.0.load(Ordering::Relaxed), 0);
        let mut waiter = waiting(&our_waker);
        waiter.wake();
        assert_eq!(ours.0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn join_in_order_polls_the_first_again_when_the_second_woke_it() {
        let (count, waker) = counting();
        let answered = std::cell::Cell::new(false);
        let waiter = std::cell::RefCell::new(Waiter::default());
        let (a_polls, b_polls) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
        let a = std::future::poll_fn(|cx| {
            a_polls.set(a_polls.get() + 1);
            waiter.borrow().polled();
            if answered.get() {
                return Poll::Ready(7);
            }
            waiter.borrow_mut().register(cx);
            Poll::Pending
        });
        let b = std::future::poll_fn(|_| {
            b_polls.set(b_polls.get() + 1);
            answered.set(true);
            waiter.borrow_mut().wake();
            Poll::Ready(())
        });
        let (a, b) = (std::pin::pin!(a), std::pin::pin!(b));
        let mut joined = std::pin::pin!(run(join_in_order(a, b)));
        let out = joined.as_mut().poll(&mut Context::from_waker(&waker));
        assert_eq!(out, Poll::Ready(7));
        assert_eq!((a_polls.get(), b_polls.get()), (2, 1));
        assert_eq!(count.0.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_panic_in_a_wrapped_poll_leaves_no_pass_behind() {
        let (count, waker) = counting();
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut fut = std::pin::pin!(run(std::future::poll_fn(|_| -> Poll<()> {
                panic!("a task's bug")
            })));
            fut.as_mut().poll(&mut Context::from_waker(&waker))
        }));
        assert!(panicked.is_err());
        assert_eq!(PASS.with(|p| p.id.get()), 0);
        // Outside any pass again: the same waker's wake is made at once.
        waiting(&waker).wake();
        assert_eq!(count.0.load(Ordering::Relaxed), 1);
    }
}
