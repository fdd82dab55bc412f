//! One upstream connection: the socket, a demand-driven read loop, and the bytes it read.
//!
//! io_uring forbids cancelling a read by dropping its future, yet an upstream exchange
//! must be able to give up (timeout, cancellation) while a read is pending. So on io_uring
//! each connection has one read-loop task that owns the reads; an exchange asks it for
//! bytes ([`Wire::fill`], a wait on a `Notify` that is safe to drop) and gives up by
//! shutting the socket down ([`Wire::close`]), which completes the pending read. On epoll a
//! read is a readiness wait that owns nothing until the socket is readable, so the exchange
//! reads in place: no read-loop task and no hand-off through it.
//!
//! Reads happen only on demand: an idle pooled connection has no read pending and holds
//! no slot (DESIGN §5). Whether such a connection is still usable is checked when it is
//! taken from the pool ([`crate::runtime::Conn::unusable`]).

use crate::limits::UPSTREAM_EVENT_READ_BYTES;
use crate::metrics;
use crate::runtime::{Conn, ReadBuf, Slots};
use bytes::{Bytes, BytesMut};
use std::cell::{Cell, RefCell};
use std::io;
use std::rc::Rc;
use tokio::sync::Notify;

/// Where the read side of a connection is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadState {
    /// No read pending, none wanted.
    Idle,
    /// The exchange wants bytes; the read loop reads once.
    Wanted,
    /// The peer closed, the read failed, or the connection was closed: no more bytes.
    Over,
}

/// The shared state of one connection (its read loop holds an `Rc` too).
pub struct Wire {
    conn: Conn,
    slots: Rc<Slots>,
    /// Bytes read and not yet taken by the exchange's decoder.
    inbox: RefCell<BytesMut>,
    read: Cell<ReadState>,
    /// The connection was closed by us: the read loop must stop.
    closed: Cell<bool>,
    /// Wakes the read loop (demand, or close).
    demand: Notify,
    /// Wakes the exchange (bytes arrived, or the read side is over).
    arrived: Notify,
    /// This connection carries a long-lived event stream: while it is quiet, its reads use
    /// a small heap buffer instead of a slot.
    event_stream: Cell<bool>,
    /// The last read filled its buffer: more is likely waiting, read into a slot.
    burst: Cell<bool>,
}

/// The owner's handle of a connection: closing it on drop is what ends the read loop.
pub struct Link {
    wire: Rc<Wire>,
    /// The connection carried an exchange before (reuse makes a failure retryable).
    pub reused: bool,
}

impl Link {
    /// Wraps a freshly connected socket and starts its read loop on this worker.
    pub fn start(conn: Conn, slots: Rc<Slots>) -> Link {
        let inline = conn.reads_cancel_safe();
        let wire = Rc::new(Wire {
            conn,
            slots,
            inbox: RefCell::new(BytesMut::new()),
            read: Cell::new(ReadState::Idle),
            closed: Cell::new(false),
            demand: Notify::new(),
            arrived: Notify::new(),
            event_stream: Cell::new(false),
            burst: Cell::new(false),
        });
        metrics::with(|m| m.upstream.connections += 1);
        if !inline {
            tokio::task::spawn_local(read_loop(wire.clone()));
        }
        Link {
            wire,
            reused: false,
        }
    }

    /// The connection's shared state.
    pub fn wire(&self) -> &Wire {
        &self.wire
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.wire.close();
    }
}

impl Wire {
    /// Writes all of `data`. Not cancel-safe (io_uring): await it to completion; to give up
    /// early, [`Wire::close`] the connection, which makes the write fail.
    pub async fn write(&self, data: Bytes) -> io::Result<()> {
        if self.closed.get() {
            return Err(io::ErrorKind::NotConnected.into());
        }
        self.conn.write_all(data).await
    }

    /// The bytes read so far and not yet consumed.
    pub fn inbox(&self) -> std::cell::RefMut<'_, BytesMut> {
        self.inbox.borrow_mut()
    }

    /// Marks the connection as a long-lived event stream (see `event_stream`).
    pub fn set_event_stream(&self) {
        self.event_stream.set(true);
    }

    /// Asks the read loop for more bytes and waits until some arrived (true) or the read
    /// side is over (false). Safe to drop at any point: the read goes on in the loop and
    /// its bytes wait in the inbox.
    pub async fn fill(&self) -> bool {
        if self.conn.reads_cancel_safe() {
            return self.fill_in_place().await;
        }
        let before = self.inbox.borrow().len();
        loop {
            let arrived = self.arrived.notified();
            if self.inbox.borrow().len() > before {
                return true;
            }
            match self.read.get() {
                ReadState::Over => return false,
                ReadState::Idle => {
                    self.read.set(ReadState::Wanted);
                    self.demand.notify_one();
                }
                ReadState::Wanted => {}
            }
            arrived.await;
        }
    }

    /// [`Wire::fill`] on epoll: one read, awaited right here.
    async fn fill_in_place(&self) -> bool {
        if self.is_over() {
            return false;
        }
        // A failed read ends the read side like a close.
        if let Ok((n, buf)) = self.conn.read_ready(&self.slots).await {
            if let Some(bytes) = buf.get(..n) {
                self.inbox.borrow_mut().extend_from_slice(bytes);
            }
            self.slots.give_back(buf);
            if n > 0 {
                return true;
            }
        }
        self.read_over();
        false
    }

    /// The read side ended (peer closed, read failed): no more bytes, and the socket is
    /// shut down before its descriptor is dropped.
    fn read_over(&self) {
        self.read.set(ReadState::Over);
        self.closed.set(true);
        self.conn.shutdown();
    }

    /// True once the read side is over (peer closed, error, or closed by us).
    pub fn is_over(&self) -> bool {
        self.read.get() == ReadState::Over || self.closed.get()
    }

    /// True if this idle connection may carry another request: not closed, nothing
    /// unread, and the peer has not closed it meanwhile.
    pub fn reusable(&self) -> bool {
        !self.is_over() && self.inbox.borrow().is_empty() && !self.conn.unusable()
    }

    /// Closes the connection: a pending read or write completes, the read loop ends.
    /// Idempotent.
    pub fn close(&self) {
        if self.closed.replace(true) {
            return;
        }
        self.conn.shutdown();
        self.demand.notify_one();
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        metrics::with(|m| m.upstream.connections -= 1);
    }
}

/// io_uring: reads once per demand until the connection is over.
async fn read_loop(wire: Rc<Wire>) {
    let slots = &wire.slots;
    loop {
        while wire.read.get() != ReadState::Wanted {
            if wire.closed.get() {
                wire.read.set(ReadState::Over);
                wire.arrived.notify_one();
                return;
            }
            wire.demand.notified().await;
        }
        let buf = if wire.event_stream.get() && !wire.burst.get() {
            ReadBuf::Heap(Vec::with_capacity(UPSTREAM_EVENT_READ_BYTES))
        } else {
            slots.lend()
        };
        let room = buf_capacity(&buf);
        let (result, buf) = wire.conn.read(buf).await;
        // A failed read ends the read side like a close: the exchange sees the
        // response cut short either way.
        let n = result.unwrap_or(0);
        wire.burst.set(n >= room);
        if let Some(bytes) = buf.get(..n) {
            wire.inbox.borrow_mut().extend_from_slice(bytes);
        }
        slots.give_back(buf);
        if n == 0 {
            wire.read_over();
            wire.arrived.notify_one();
            return;
        }
        wire.read.set(ReadState::Idle);
        wire.arrived.notify_one();
    }
}

/// How many bytes one read into `buf` can take.
fn buf_capacity(buf: &ReadBuf) -> usize {
    match buf {
        ReadBuf::Fixed(_) => crate::limits::SLOT_BYTES,
        ReadBuf::Heap(v) => v.capacity(),
    }
}
