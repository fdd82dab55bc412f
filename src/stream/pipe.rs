//! One internal stream on one worker: two directions, each a bounded frame queue with a
//! credit window, plus the throttle frames (RESET, CHALLENGE) flowing against it.

use super::frame::{Begin, Challenge, Flush, Frame, Reset};
use super::pieces;
use super::window::Window;
use crate::limits::{STREAM_FRAMES_MAX, STREAM_WINDOW_BYTES};
use crate::metrics;
use crate::runtime::kept::{self, Kept};
use crate::runtime::pass::Waiter;
use bytes::Bytes;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::poll_fn;
use std::rc::{Rc, Weak};
use std::task::{Context, Poll};
use std::time::Instant;

/// The other end of a direction is gone (reset, or dropped without a frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

/// A frame flowing against a direction, from its receiver back to its sender.
#[derive(Debug)]
pub enum Throttle {
    /// The receiver rejected the direction.
    Reset(Reset),
    /// The receiver asks something of the sender.
    Challenge(Challenge),
}

/// Where a direction is in its life; moves forward only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Half {
    Open,
    /// END or ABORT queued; nothing more may be sent.
    Closed,
}

struct Direction {
    frames: VecDeque<Frame>,
    throttles: VecDeque<Throttle>,
    window: Window,
    half: Half,
    /// The receiver reset the direction or was dropped: sends fail from now on.
    refused: bool,
    /// The sender was dropped (frames still queued are delivered first).
    sender_dropped: bool,
    /// The receiver waiting for a frame.
    recv: Waiter,
    /// The sender waiting for credit or queue room.
    send: Waiter,
    /// The sender waiting for a RESET or CHALLENGE (may be another task than the one
    /// waiting for credit, so it has its own place).
    throttle: Waiter,
    /// The receiver's taker of FLUSH frames in the sender's own call (see [`Inline`]).
    inline: Option<Weak<dyn Inline>>,
}

/// A receiver that takes some FLUSH frames in the call that sends them, the way bindings
/// on one worker hand each other a frame by a direct call: its task is not woken for them.
/// A frame is offered only when nothing is queued ahead of it, so the order of the
/// direction holds. `take` runs inside the sender's code: it must not send on this
/// stream, and must not wait.
pub trait Inline {
    /// Takes `flush` now, or gives it back to be queued for the receiver's task.
    fn take(&self, flush: Flush) -> Option<Flush>;
}

/// Both directions of one stream, in one allocation.
struct Pair {
    initial: RefCell<Direction>,
    reply: RefCell<Direction>,
}

/// Emptied frame queues a worker keeps for its next streams, so that a request's two
/// queues reuse an allocation instead of making one each.
const FRAME_QUEUES_KEPT: usize = 256;

/// A queue that grew past this many frames is not kept: the kept queues hold at most
/// `FRAME_QUEUES_KEPT` x this many frames' room.
const FRAME_QUEUE_KEPT_FRAMES: usize = 8;

thread_local! {
    static FRAME_QUEUES: Kept<VecDeque<Frame>> = const { RefCell::new(Vec::new()) };
}

impl Drop for Pair {
    /// Keeps both frame queues, emptied, for the next streams (within the bounds above).
    fn drop(&mut self) {
        for dir in [&mut self.initial, &mut self.reply] {
            let frames = std::mem::take(&mut dir.get_mut().frames);
            kept::give_back(
                &FRAME_QUEUES,
                frames,
                FRAME_QUEUE_KEPT_FRAMES,
                FRAME_QUEUES_KEPT,
            );
        }
    }
}

/// One direction of a stream, as an end holds it.
struct Shared {
    pair: Rc<Pair>,
    reply: bool,
}

impl Shared {
    fn borrow_mut(&self) -> std::cell::RefMut<'_, Direction> {
        match self.reply {
            true => self.pair.reply.borrow_mut(),
            false => self.pair.initial.borrow_mut(),
        }
    }

    fn borrow(&self) -> std::cell::Ref<'_, Direction> {
        match self.reply {
            true => self.pair.reply.borrow(),
            false => self.pair.initial.borrow(),
        }
    }

    /// Offers `flush` to the receiver's [`Inline`] taker, when it has one, the direction
    /// is open and nothing is queued ahead; gives it back otherwise (or when not taken).
    fn offer(&self, flush: Flush) -> Option<Flush> {
        let taker = {
            let d = self.borrow();
            if !d.open() || !d.frames.is_empty() {
                return Some(flush);
            }
            d.inline.as_ref().and_then(Weak::upgrade)
        };
        // Called with the direction not borrowed: the taker may look at the stream.
        match taker {
            Some(taker) => taker.take(flush),
            None => Some(flush),
        }
    }

    /// Hands `flush` to the receiver's taker, or queues it if the direction is open and
    /// its queue has room; false otherwise.
    fn try_flush(&self, flush: Flush) -> bool {
        match self.offer(flush) {
            None => true,
            Some(flush) => self.borrow_mut().try_flush(flush),
        }
    }
}

impl Direction {
    /// Sends are still taken: the receiver has not refused and the sender not closed.
    fn open(&self) -> bool {
        !self.refused && self.half == Half::Open
    }

    /// Queues DATA (within the window, or lent outside it), copied onto the DATA frame
    /// queued last when both are small ([`pieces::keep`]): a sender of many tiny pieces
    /// queues few frames.
    fn push_data(&mut self, piece: Bytes) {
        let queued = self.frames.len();
        // The common case, a frame or two queued, is decided without a look at them.
        let kept = if queued < pieces::PIECES_KEPT_AS_GIVEN {
            Some(piece)
        } else if let Some(Frame::Data(last)) = self.frames.back_mut() {
            pieces::keep(queued, Some(last), piece)
        } else {
            Some(piece)
        };
        if let Some(piece) = kept {
            self.frames.push_back(Frame::Data(piece));
        }
        self.recv.wake();
    }

    /// Queues a FLUSH if the direction is open and its queue has room.
    fn try_flush(&mut self, flush: Flush) -> bool {
        if !self.open() || self.frames.len() >= STREAM_FRAMES_MAX {
            return false;
        }
        self.frames.push_back(Frame::Flush(flush));
        self.recv.wake();
        true
    }
}

fn direction() -> RefCell<Direction> {
    RefCell::new(Direction {
        frames: kept::take(&FRAME_QUEUES),
        throttles: VecDeque::new(),
        window: Window::new(STREAM_WINDOW_BYTES),
        half: Half::Open,
        refused: false,
        sender_dropped: false,
        recv: Waiter::default(),
        send: Waiter::default(),
        throttle: Waiter::default(),
        inline: None,
    })
}

/// The sending end of one direction.
pub struct Sender {
    dir: Shared,
}

impl Sender {
    /// Sends raw JSON bytes, waiting for credit as needed; splits `data` at the window.
    /// Returns `Err(Gone)` if the receiver reset the direction or went away.
    pub async fn data(&self, mut data: Bytes) -> Result<(), Gone> {
        while !data.is_empty() {
            let credit = self.credit().await?;
            let piece = data.split_to(data.len().min(credit as usize));
            let mut d = self.dir.borrow_mut();
            assert!(d.half == Half::Open);
            d.window.on_sent(piece.len() as u32);
            d.push_data(piece);
        }
        Ok(())
    }

    /// Sends bytes the sender already holds whole (a stored list, an answer built in
    /// memory) as one DATA frame, outside the credit window. Splitting them at the window
    /// would save no memory, since the sender holds them until they are sent anyway, and
    /// would cost a round trip between the two ends per window; in one frame the receiver
    /// writes them in one go. The window's bound on other data still holds: the
    /// receiver's acks pay these bytes back first ([`Window::lend`]). Waits while the
    /// frame queue is full or an earlier whole send is not paid back yet, so one stream
    /// never holds more than one such frame. Bytes too many for an ack to count
    /// (`u32`) go a window at a time, as [`Sender::data`] sends them.
    ///
    /// Not for relaying another stream's DATA: a relay must wait for credit before it
    /// acks what it read, or its source could run ahead and fill the queue.
    pub async fn data_whole(&self, data: Bytes) -> Result<(), Gone> {
        if data.is_empty() {
            return Ok(());
        }
        if u32::try_from(data.len()).is_err() {
            return self.data(data).await;
        }
        self.room(true).await?;
        let mut d = self.dir.borrow_mut();
        assert!(d.half == Half::Open);
        d.window.lend(data.len() as u64);
        d.push_data(data);
        Ok(())
    }

    /// Queues as much of `data` as the credit window takes now, without waiting, and
    /// leaves the rest in `data` (for [`Sender::data`]).
    pub fn try_data(&self, data: &mut Bytes) -> Result<(), Gone> {
        let mut d = self.dir.borrow_mut();
        if d.refused {
            return Err(Gone);
        }
        let credit = d.window.credit() as usize;
        if data.is_empty() || credit == 0 {
            return Ok(());
        }
        assert!(d.half == Half::Open);
        let piece = data.split_to(data.len().min(credit));
        d.window.on_sent(piece.len() as u32);
        d.push_data(piece);
        Ok(())
    }

    /// Waits until some credit is available and returns it, recording a stall if it had to wait.
    async fn credit(&self) -> Result<u32, Gone> {
        let mut stalled: Option<Instant> = None;
        let credit = poll_fn(|cx| {
            let mut d = self.dir.borrow_mut();
            d.send.polled();
            if d.refused {
                return Poll::Ready(Err(Gone));
            }
            let credit = d.window.credit();
            if credit > 0 {
                return Poll::Ready(Ok(credit));
            }
            stalled.get_or_insert_with(Instant::now);
            d.send.register(cx);
            Poll::Pending
        })
        .await;
        if let Some(since) = stalled {
            metrics::record_window_stall(since.elapsed());
        }
        credit
    }

    /// Waits until the frame queue has room and, for a whole send (`whole`), no earlier
    /// one is still to be paid back.
    async fn room(&self, whole: bool) -> Result<(), Gone> {
        poll_fn(|cx| {
            let mut d = self.dir.borrow_mut();
            d.send.polled();
            if d.refused {
                return Poll::Ready(Err(Gone));
            }
            if d.frames.len() < STREAM_FRAMES_MAX && (!whole || d.window.lent() == 0) {
                return Poll::Ready(Ok(()));
            }
            d.send.register(cx);
            Poll::Pending
        })
        .await
    }

    /// Queues a typed frame (BEGIN or FLUSH), waiting while the queue is full.
    async fn push(&self, frame: Frame) -> Result<(), Gone> {
        self.room(false).await?;
        let mut d = self.dir.borrow_mut();
        assert!(d.half == Half::Open);
        d.frames.push_back(frame);
        d.recv.wake();
        Ok(())
    }

    /// Opens the reply direction.
    pub async fn begin(&self, begin: super::ReplyBegin) -> Result<(), Gone> {
        self.push(Frame::Begin(begin)).await
    }

    /// Sends a typed in-band event.
    pub async fn flush(&self, flush: Flush) -> Result<(), Gone> {
        match self.dir.offer(flush) {
            None => Ok(()),
            Some(flush) => self.push(Frame::Flush(flush)).await,
        }
    }

    /// Queues a typed event without waiting, for senders that must not wait (several
    /// tasks may share this sender); false if the queue is full or the direction is over.
    pub fn try_flush(&self, flush: Flush) -> bool {
        self.dir.try_flush(flush)
    }

    /// A handle through which other tasks queue events on this direction without keeping
    /// it open: once this sender is dropped or closed, the handle's sends fail.
    pub fn handle(&self) -> SenderHandle {
        SenderHandle {
            pair: Rc::downgrade(&self.dir.pair),
            reply: self.dir.reply,
        }
    }

    /// Ends the direction gracefully; idempotent (a second close is ignored).
    pub fn end(&self) {
        self.close(Frame::End);
    }

    /// Ends the direction abortively; idempotent.
    pub fn abort(&self) {
        self.close(Frame::Abort);
    }

    fn close(&self, frame: Frame) {
        let mut d = self.dir.borrow_mut();
        if d.half == Half::Closed {
            return;
        }
        d.half = Half::Closed;
        // END/ABORT may exceed STREAM_FRAMES_MAX by one: a close must never wait.
        d.frames.push_back(frame);
        d.recv.wake();
    }

    /// True once END or ABORT was sent.
    pub fn is_closed(&self) -> bool {
        self.dir.borrow().half == Half::Closed
    }

    /// The next RESET or CHALLENGE from the receiver; `None` once the receiver is gone
    /// and nothing is pending.
    pub async fn throttle(&self) -> Option<Throttle> {
        poll_fn(|cx| self.poll_throttle(cx)).await
    }

    /// [`Sender::throttle`] as a poll, for a task that waits on several directions at
    /// once (one task relaying many streams registers its one waker with each).
    pub fn poll_throttle(&self, cx: &mut Context<'_>) -> Poll<Option<Throttle>> {
        let mut d = self.dir.borrow_mut();
        d.throttle.polled();
        if let Some(t) = d.throttles.pop_front() {
            return Poll::Ready(Some(t));
        }
        if d.refused {
            return Poll::Ready(None);
        }
        d.throttle.register(cx);
        Poll::Pending
    }

    /// A pending RESET or CHALLENGE, without waiting.
    pub fn try_throttle(&self) -> Option<Throttle> {
        self.dir.borrow_mut().throttles.pop_front()
    }

    /// True if the receiver reset the direction or went away.
    pub fn is_refused(&self) -> bool {
        self.dir.borrow().refused
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let mut d = self.dir.borrow_mut();
        d.sender_dropped = true;
        // No one is left to send: an ack or a reset must not wake a future that waited here.
        d.send.clear();
        d.throttle.clear();
        if d.half == Half::Open {
            // A sender that vanished without closing aborted: say so to the receiver.
            d.half = Half::Closed;
            d.frames.push_back(Frame::Abort);
        }
        d.recv.wake();
    }
}

/// A way to queue typed events on a direction its [`Sender`]'s owner is not sending on
/// at the moment (see [`Sender::handle`]), so another task can tell the receiver
/// something without a wake-up of the owner in between.
pub struct SenderHandle {
    pair: Weak<Pair>,
    reply: bool,
}

impl SenderHandle {
    /// Queues `flush` unless a queued, unread frame already carries the same news (`same`
    /// is true of it); true if the receiver will read it, false if the queue is full or
    /// the direction is over (the caller then goes through the sender's owner).
    pub fn try_flush_once(&self, flush: Flush, same: impl Fn(&Flush) -> bool) -> bool {
        let Some(pair) = self.pair.upgrade() else {
            return false;
        };
        let dir = Shared {
            pair,
            reply: self.reply,
        };
        // A dropped sender closed the direction, so this fails then too.
        let told = {
            let d = dir.borrow();
            d.open()
                && d.frames
                    .iter()
                    .any(|f| matches!(f, Frame::Flush(f) if same(f)))
        };
        told || dir.try_flush(flush)
    }
}

/// The receiving end of one direction.
pub struct Receiver {
    dir: Shared,
}

impl Receiver {
    /// From now on, FLUSH frames sent while nothing is queued ahead of them are offered to
    /// `taker` first (until this receiver is dropped).
    pub fn take_inline(&self, taker: Weak<dyn Inline>) {
        self.dir.borrow_mut().inline = Some(taker);
    }

    /// The next frame; `None` after END or ABORT was taken (the direction is over).
    /// DATA must be acknowledged with [`Receiver::ack`] once consumed.
    pub async fn next(&self) -> Option<Frame> {
        poll_fn(|cx| self.poll_next(cx)).await
    }

    /// [`Receiver::next`] as a poll, for a task that waits on several directions at once.
    pub fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<Frame>> {
        let mut d = self.dir.borrow_mut();
        d.recv.polled();
        if let Some(f) = d.frames.pop_front() {
            // The sender may be waiting for queue room.
            d.send.wake();
            return Poll::Ready(Some(f));
        }
        if d.half == Half::Closed || d.sender_dropped {
            return Poll::Ready(None);
        }
        d.recv.register(cx);
        Poll::Pending
    }

    /// A queued frame, without waiting.
    pub fn try_next(&self) -> Option<Frame> {
        let mut d = self.dir.borrow_mut();
        let f = d.frames.pop_front();
        if f.is_some() {
            d.send.wake();
        }
        f
    }

    /// Puts back a frame taken with [`Receiver::try_next`] (a peek).
    pub fn unread(&self, frame: Frame) {
        self.dir.borrow_mut().frames.push_front(frame);
    }

    /// Returns `bytes` of credit to the sender (a WINDOW frame).
    pub fn ack(&self, bytes: u32) {
        if bytes == 0 {
            return;
        }
        let mut d = self.dir.borrow_mut();
        d.window.on_ack(bytes);
        metrics::record_window_grant(bytes);
        d.send.wake();
    }

    /// Rejects the direction: the sender's later sends fail and it sees the reset.
    pub fn reset(&self, reset: Reset) {
        let mut d = self.dir.borrow_mut();
        if d.refused {
            return;
        }
        d.refused = true;
        d.throttles.push_back(Throttle::Reset(reset));
        d.send.wake();
        d.throttle.wake();
    }

    /// Sends a CHALLENGE to the sender (bounded: ignored past the frame limit, which only
    /// a misbehaving peer could reach).
    pub fn challenge(&self, challenge: Challenge) -> Result<(), Gone> {
        let mut d = self.dir.borrow_mut();
        if d.refused || d.sender_dropped || d.throttles.len() >= STREAM_FRAMES_MAX {
            return Err(Gone);
        }
        d.throttles.push_back(Throttle::Challenge(challenge));
        d.throttle.wake();
        Ok(())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let mut d = self.dir.borrow_mut();
        d.refused = true;
        d.inline = None;
        d.frames.clear();
        // No one is left to read: a later send must not wake a future that waited here.
        d.recv.clear();
        d.send.wake();
        d.throttle.wake();
    }
}

/// The caller's ends of a stream: it sends the initial direction and reads the reply.
pub struct Caller {
    pub initial: Sender,
    pub reply: Receiver,
}

/// The callee's ends of a stream: the caller's [`Begin`], the initial to read, the reply
/// to send.
pub struct Callee {
    pub begin: Begin,
    pub initial: Receiver,
    pub reply: Sender,
}

/// Opens a stream: the caller keeps [`Caller`], the exit serves [`Callee`].
pub fn open(begin: Begin) -> (Caller, Callee) {
    let pair = Rc::new(Pair {
        initial: direction(),
        reply: direction(),
    });
    let side = |reply: bool| Shared {
        pair: pair.clone(),
        reply,
    };
    let caller = Caller {
        initial: Sender { dir: side(false) },
        reply: Receiver { dir: side(true) },
    };
    let callee = Callee {
        begin,
        initial: Receiver { dir: side(false) },
        reply: Sender { dir: side(true) },
    };
    (caller, callee)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::{Event, Kind};
    use std::time::Duration;

    fn begin() -> Begin {
        Begin {
            kind: Kind::ToolsCall,
            session: Rc::from(""),
            target: None,
            target_at: None,
            method: None,
            params_len: 0,
            deadline: Instant::now() + Duration::from_secs(1),
            progress_token: None,
            client: None,
            authorization: None,
        }
    }

    use crate::testing::run_local as run;

    fn progress() -> Flush {
        Flush {
            id: None,
            event: Event::Progress {
                params: Bytes::from_static(b"{}"),
            },
        }
    }

    fn kept_queues() -> usize {
        FRAME_QUEUES.with(|q| q.borrow().len())
    }

    #[test]
    fn a_stream_reuses_the_emptied_queues_of_an_ended_one_and_sees_none_of_its_frames() {
        let (caller, callee) = open(begin());
        // Frames queued while the stream ends (a receiver that goes clears its queue; the
        // ABORT of a sender dropped open after its receiver is left): none may reach the
        // next stream.
        assert!(
            caller
                .initial
                .try_data(&mut Bytes::from_static(b"left"))
                .is_ok()
        );
        assert!(callee.reply.try_flush(progress()));
        let before = kept_queues();
        drop((caller, callee));
        assert_eq!(kept_queues(), before + 2, "both queues kept");
        let (caller, callee) = open(begin());
        assert_eq!(kept_queues(), before, "and taken by the next stream");
        assert!(
            callee.initial.try_next().is_none(),
            "no frame of the old stream"
        );
        assert!(
            caller.reply.try_next().is_none(),
            "no frame of the old stream"
        );
        assert!(
            callee.initial.dir.borrow().frames.capacity() > 0,
            "an allocation reused"
        );
        drop((caller, callee));
    }

    #[test]
    fn a_queue_that_grew_is_not_kept() {
        let (caller, callee) = open(begin());
        for _ in 0..FRAME_QUEUE_KEPT_FRAMES + 1 {
            assert!(callee.reply.try_flush(progress()));
        }
        let before = kept_queues();
        drop((caller, callee));
        // The initial queue holds the ABORT of the sender dropped open: kept. The reply
        // queue grew to 16 frames' room: not kept.
        assert_eq!(kept_queues(), before + 1, "only the initial queue");
        let kept_room = FRAME_QUEUES.with(|q| q.borrow().iter().map(VecDeque::capacity).max());
        assert!(kept_room.is_some_and(|room| room <= FRAME_QUEUE_KEPT_FRAMES));
    }

    #[test]
    fn data_is_split_at_the_window_and_flows_as_acked() {
        run(async {
            let (caller, callee) = open(begin());
            let big = Bytes::from(vec![7u8; STREAM_WINDOW_BYTES as usize * 3 + 5]);
            let total = big.len();
            let sender = tokio::task::spawn_local(async move {
                callee.reply.data(big).await.expect("receiver alive");
                callee.reply.end();
            });
            let mut got = 0usize;
            while let Some(f) = caller.reply.next().await {
                match f {
                    Frame::Data(b) => {
                        assert!(b.len() <= STREAM_WINDOW_BYTES as usize);
                        got += b.len();
                        caller.reply.ack(b.len() as u32);
                    }
                    Frame::End => break,
                    other => panic!("unexpected {other:?}"),
                }
            }
            assert_eq!(got, total);
            sender.await.expect("sender task");
        });
    }

    #[test]
    fn whole_data_passes_a_closed_window_in_one_frame_and_is_paid_back_first() {
        /// Polls `f` once: `Some` if it completed without waiting.
        fn at_once<F: std::future::Future>(f: F) -> Option<F::Output> {
            let mut cx = Context::from_waker(std::task::Waker::noop());
            match std::pin::pin!(f).poll(&mut cx) {
                Poll::Ready(out) => Some(out),
                Poll::Pending => None,
            }
        }
        run(async {
            let (caller, callee) = open(begin());
            let window = STREAM_WINDOW_BYTES as usize;
            callee
                .reply
                .data(Bytes::from(vec![1u8; window]))
                .await
                .expect("receiver alive");
            // The window is closed, and the whole bytes go anyway, at once, in one frame.
            let whole = Bytes::from(vec![2u8; window * 3 + 5]);
            let whole_ptr = whole.as_ptr();
            let sent = at_once(callee.reply.data_whole(whole));
            assert_eq!(sent, Some(Ok(())), "no wait for credit");
            let sent = at_once(callee.reply.data_whole(Bytes::new()));
            assert_eq!(sent, Some(Ok(())), "an empty send");
            // A second whole send waits until the first is paid back.
            let second_whole = Bytes::from(vec![3u8; 10]);
            assert!(at_once(callee.reply.data_whole(second_whole.clone())).is_none());
            let mut more = Bytes::from_static(b"x");
            callee.reply.try_data(&mut more).expect("receiver alive");
            assert_eq!(more.len(), 1, "no credit for other bytes");
            let Some(Frame::Data(first)) = caller.reply.next().await else {
                panic!("the window's bytes first");
            };
            assert_eq!(first.len(), window);
            caller.reply.ack(first.len() as u32);
            callee.reply.try_data(&mut more).expect("receiver alive");
            assert_eq!(more.len(), 1, "the first acks pay back the whole bytes");
            let Some(Frame::Data(second)) = caller.reply.next().await else {
                panic!("the whole bytes next");
            };
            assert_eq!((second.len(), second.as_ptr()), (window * 3 + 5, whole_ptr));
            caller.reply.ack(second.len() as u32);
            callee.reply.try_data(&mut more).expect("receiver alive");
            assert!(more.is_empty(), "the window is open again");
            assert!(matches!(caller.reply.try_next(), Some(Frame::Data(x)) if x.len() == 1));
            assert!(
                caller.reply.try_next().is_none(),
                "an empty send sends nothing"
            );
            let sent = at_once(callee.reply.data_whole(second_whole));
            assert_eq!(sent, Some(Ok(())), "paid back: the next whole send goes");
        });
    }

    #[test]
    fn reset_reaches_the_sender_and_fails_later_sends() {
        run(async {
            let (caller, callee) = open(begin());
            caller.reply.reset(Reset::Plain);
            assert!(matches!(
                callee.reply.throttle().await,
                Some(Throttle::Reset(Reset::Plain))
            ));
            assert_eq!(callee.reply.data(Bytes::from_static(b"x")).await, Err(Gone));
        });
    }

    #[test]
    fn dropped_sender_reads_as_abort_and_close_is_idempotent() {
        run(async {
            let (caller, callee) = open(begin());
            callee.reply.end();
            callee.reply.end();
            callee.reply.abort();
            assert!(matches!(caller.reply.next().await, Some(Frame::End)));
            assert!(caller.reply.next().await.is_none());
            let (caller, callee) = open(begin());
            drop(callee);
            assert!(matches!(caller.reply.next().await, Some(Frame::Abort)));
        });
    }

    #[test]
    fn flush_waits_when_the_queue_is_full() {
        run(async {
            let (caller, callee) = open(begin());
            let producer = tokio::task::spawn_local(async move {
                for _ in 0..STREAM_FRAMES_MAX * 2 {
                    let flush = Flush {
                        id: None,
                        event: Event::Resumable,
                    };
                    callee.reply.flush(flush).await.expect("alive");
                }
                callee.reply.end();
            });
            tokio::task::yield_now().await;
            let mut n = 0;
            while let Some(f) = caller.reply.next().await {
                if matches!(f, Frame::Flush(_)) {
                    n += 1;
                }
            }
            assert_eq!(n, STREAM_FRAMES_MAX * 2);
            producer.await.expect("producer");
        });
    }

    fn tools_changed() -> Flush {
        Flush {
            id: None,
            event: Event::ListChanged(crate::stream::ListKind::Tools),
        }
    }

    fn is_tools_changed(f: &Flush) -> bool {
        matches!(f.event, Event::ListChanged(crate::stream::ListKind::Tools))
    }

    #[test]
    fn a_handle_queues_news_once_until_it_is_read() {
        let (caller, callee) = open(begin());
        let handle = callee.reply.handle();
        assert!(handle.try_flush_once(tools_changed(), is_tools_changed));
        // Still unread: the same news is not queued twice, other news is.
        assert!(handle.try_flush_once(tools_changed(), is_tools_changed));
        assert!(handle.try_flush_once(progress(), |_| false));
        let mut told = 0;
        while let Some(Frame::Flush(f)) = caller.reply.try_next() {
            told += usize::from(is_tools_changed(&f));
        }
        assert_eq!(told, 1);
        // Read: news again is queued again.
        assert!(handle.try_flush_once(tools_changed(), is_tools_changed));
        assert!(matches!(caller.reply.try_next(), Some(Frame::Flush(f)) if is_tools_changed(&f)));
    }

    #[test]
    fn a_handle_fails_once_the_direction_is_over_or_full() {
        let (caller, callee) = open(begin());
        let handle = callee.reply.handle();
        for _ in 0..STREAM_FRAMES_MAX {
            assert!(handle.try_flush_once(progress(), |_| false));
        }
        // Full: refused.
        assert!(!handle.try_flush_once(progress(), |_| false));
        while caller.reply.try_next().is_some() {}
        callee.reply.end();
        assert!(!handle.try_flush_once(tools_changed(), is_tools_changed));
        assert!(matches!(caller.reply.try_next(), Some(Frame::End)));
        let (caller, callee) = open(begin());
        let handle = callee.reply.handle();
        drop(callee);
        assert!(!handle.try_flush_once(tools_changed(), is_tools_changed));
        drop(caller);
        assert!(!handle.try_flush_once(tools_changed(), is_tools_changed));
    }

    /// Takes list changes (and records them), gives everything else back.
    #[derive(Default)]
    struct Taker {
        taken: std::cell::Cell<usize>,
    }

    impl Inline for Taker {
        fn take(&self, flush: Flush) -> Option<Flush> {
            if !is_tools_changed(&flush) {
                return Some(flush);
            }
            self.taken.set(self.taken.get() + 1);
            None
        }
    }

    #[test]
    fn a_receivers_taker_gets_flushes_with_nothing_queued_ahead_and_in_order() {
        run(async {
            let (caller, callee) = open(begin());
            let taker = Rc::new(Taker::default());
            let weak: Weak<dyn Inline> = Rc::downgrade(&taker) as Weak<Taker>;
            caller.reply.take_inline(weak);
            // Nothing queued: taken in the sender's call, by every way of sending.
            assert!(callee.reply.try_flush(tools_changed()));
            callee.reply.flush(tools_changed()).await.expect("alive");
            assert!(
                callee
                    .reply
                    .handle()
                    .try_flush_once(tools_changed(), |_| false)
            );
            assert_eq!(taker.taken.get(), 3);
            assert!(caller.reply.try_next().is_none());
            // Given back: queued; then a change is behind it, so it is queued too.
            assert!(callee.reply.try_flush(progress()));
            assert!(callee.reply.try_flush(tools_changed()));
            assert_eq!(taker.taken.get(), 3);
            assert!(
                matches!(caller.reply.try_next(), Some(Frame::Flush(f)) if !is_tools_changed(&f))
            );
            assert!(
                matches!(caller.reply.try_next(), Some(Frame::Flush(f)) if is_tools_changed(&f))
            );
            // Nothing queued again: taken again.
            assert!(callee.reply.try_flush(tools_changed()));
            assert_eq!(taker.taken.get(), 4);
            // A taker gone, or a receiver gone, takes nothing.
            drop(taker);
            assert!(callee.reply.try_flush(tools_changed()));
            assert!(
                matches!(caller.reply.try_next(), Some(Frame::Flush(f)) if is_tools_changed(&f))
            );
            let taker = Rc::new(Taker::default());
            let weak: Weak<dyn Inline> = Rc::downgrade(&taker) as Weak<Taker>;
            caller.reply.take_inline(weak);
            drop(caller);
            assert!(!callee.reply.try_flush(tools_changed()));
            assert_eq!(taker.taken.get(), 0);
        });
    }
}
