//! One upstream connection: the socket, reads on demand, and the bytes they brought.
//!
//! An upstream exchange must be able to give up (timeout, cancellation) while a read is
//! pending, so [`Wire::fill`] is safe to drop at any await, and giving up for good is
//! [`Wire::close`], which shuts the socket down. The exchange reads in place, with no task
//! or hand-off between it and the socket:
//! - on epoll a read is a readiness wait that holds nothing; a slot is lent only for the
//!   `recv` itself, once the socket is readable;
//! - on io_uring a read cannot be cancelled by dropping it (the kernel owns its buffer
//!   until it completes), so the read in flight lives in the [`Wire`], not in `fill`: a
//!   dropped `fill` leaves it there and the next `fill` goes on waiting for it. A read
//!   still in flight when the connection is dropped is abandoned to the io_uring driver,
//!   which frees its buffer when the read (completed by the shutdown) comes back.
//!
//! Reads happen only on demand: an idle pooled connection has no read pending and holds
//! no slot (a slot is lent only while bytes are in flight). Whether such a connection is still usable is checked when it is
//! taken from the pool ([`crate::runtime::Conn::unusable`]).

use crate::binding::client::metrics as client_metrics;
use crate::limits::UPSTREAM_EVENT_READ_BYTES;
use crate::runtime::{Conn, Lent, ReadBuf, Slots};
use bytes::{Bytes, BytesMut};
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

/// An io_uring read in flight: it owns its buffer until the kernel is done with it.
type InFlight = Pin<Box<dyn Future<Output = (io::Result<usize>, ReadBuf)>>>;

/// The shared state of one connection.
pub struct Wire {
    /// Shared with an io_uring read in flight, which must outlive any one `fill`.
    conn: Rc<Conn>,
    slots: Rc<Slots>,
    /// Bytes read and not yet taken by the exchange's decoder.
    inbox: RefCell<BytesMut>,
    /// io_uring: the read in flight and what its buffer is to the pool.
    in_flight: RefCell<Option<(InFlight, Lent)>>,
    /// The peer closed or a read failed: no more bytes.
    over: Cell<bool>,
    /// The connection was closed by us.
    closed: Cell<bool>,
    /// This connection carries a long-lived event stream: while it is quiet, its io_uring
    /// reads use a small heap buffer instead of a slot.
    event_stream: Cell<bool>,
    /// The last read filled its buffer: more is likely waiting, read into a slot.
    burst: Cell<bool>,
}

/// The owner's handle of a connection: dropping it closes the connection.
pub struct Link {
    wire: Rc<Wire>,
    /// The connection carried an exchange before (reuse makes a failure retryable).
    pub reused: bool,
}

impl Link {
    /// Wraps a freshly connected socket.
    pub fn start(conn: Conn, slots: Rc<Slots>) -> Link {
        let wire = Rc::new(Wire {
            conn: Rc::new(conn),
            slots,
            inbox: RefCell::new(BytesMut::new()),
            in_flight: RefCell::new(None),
            over: Cell::new(false),
            closed: Cell::new(false),
            event_stream: Cell::new(false),
            burst: Cell::new(false),
        });
        client_metrics::with(|m| m.connections += 1);
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

    /// Reads once more and waits until bytes arrived (true) or the read side is over
    /// (false). Safe to drop at any await: on epoll nothing is read yet; on io_uring the
    /// read stays in flight in the wire and the next `fill` takes it up.
    pub async fn fill(&self) -> bool {
        if self.in_flight.borrow().is_none() && self.is_over() {
            return false;
        }
        let read = if self.conn.reads_cancel_safe() {
            self.conn.read_ready(&self.slots).await
        } else {
            self.read_in_flight().await
        };
        // A failed read ends the read side like a close: the exchange sees the response
        // cut short either way.
        if let Ok((n, buf)) = read {
            let received = self.conn.received(
                buf.get(..n).unwrap_or_default(),
                &mut self.inbox.borrow_mut(),
            );
            self.burst.set(n >= buf_capacity(&buf));
            self.slots.give_back(buf);
            // TLS: a broken record stream ends the connection; close_notify after bytes
            // ends it once those are taken (the next fill finds it over).
            if n > 0 && received.is_ok() {
                if self.conn.tls_closed() {
                    self.read_over();
                }
                return true;
            }
        }
        self.read_over();
        false
    }

    /// io_uring: starts a read unless one is in flight, and waits for it to complete.
    async fn read_in_flight(&self) -> io::Result<(usize, ReadBuf)> {
        loop {
            if self.in_flight.borrow().is_none() {
                let buf = if self.event_stream.get() && !self.burst.get() {
                    ReadBuf::Heap(Vec::with_capacity(UPSTREAM_EVENT_READ_BYTES))
                } else {
                    self.slots.lend()
                };
                let lent = buf.lent();
                let conn = self.conn.clone();
                let read: InFlight = Box::pin(async move { conn.read(buf).await });
                *self.in_flight.borrow_mut() = Some((read, lent));
            }
            // `None` if another `fill` took the completed read meanwhile (an exchange
            // fills one at a time, so this is defensive): then read again.
            let done = std::future::poll_fn(|cx| match self.in_flight.borrow_mut().as_mut() {
                Some((read, _)) => read.as_mut().poll(cx).map(Some),
                None => std::task::Poll::Ready(None),
            })
            .await;
            if let Some((result, buf)) = done {
                *self.in_flight.borrow_mut() = None;
                return match result {
                    Ok(n) => Ok((n, buf)),
                    Err(e) => {
                        self.slots.give_back(buf);
                        Err(e)
                    }
                };
            }
        }
    }

    /// The read side ended (peer closed, read failed): no more bytes, and the socket is
    /// shut down before its descriptor is dropped.
    fn read_over(&self) {
        self.over.set(true);
        self.closed.set(true);
        self.conn.shutdown();
    }

    /// True for a TLS connection whose read side ended without the peer's close_notify.
    pub fn cut_short(&self) -> bool {
        self.conn.is_tls() && !self.conn.tls_closed()
    }

    /// True once the read side is over (peer closed, error, or closed by us).
    pub fn is_over(&self) -> bool {
        self.over.get() || self.closed.get()
    }

    /// True while a read of this connection is still with the kernel (its waiter went
    /// away); such a connection holds a read slot and is not [`Wire::reusable`].
    pub fn read_pending(&self) -> bool {
        self.in_flight.borrow().is_some()
    }

    /// True if this connection, idle for `idle_for`, may carry another request: not
    /// closed, nothing unread, and the peer has not closed it meanwhile.
    pub fn reusable(&self, idle_for: Duration) -> bool {
        !self.is_over()
            && self.inbox.borrow().is_empty()
            && self.in_flight.borrow().is_none()
            && !self.conn.unusable(idle_for)
    }

    /// Closes the connection: a pending read or write completes. Idempotent.
    pub fn close(&self) {
        if self.closed.replace(true) {
            return;
        }
        self.conn.shutdown();
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        if let Some((_read, lent)) = self.in_flight.get_mut().take() {
            // Dropping the read hands its buffer to the io_uring driver until the read
            // (completed by the close's shutdown) comes back.
            self.slots.abandoned(lent);
        }
        client_metrics::with(|m| m.connections -= 1);
    }
}

/// How many bytes one read into `buf` can take.
fn buf_capacity(buf: &ReadBuf) -> usize {
    match buf {
        ReadBuf::Fixed(_) => crate::limits::SLOT_BYTES,
        ReadBuf::Heap(v) => v.capacity(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::SLOTS_PER_WORKER;
    use crate::metrics;
    use crate::runtime::{Backend, block_on};
    use std::io::Write;
    use std::time::Duration;

    /// epoll always; io_uring (with no registered slots and with some) where it exists.
    fn setups() -> Vec<(Backend, usize)> {
        let mut out = vec![(Backend::Epoll, 0)];
        if crate::runtime::io::uring_available().is_ok() {
            out.extend([(Backend::Uring, 0), (Backend::Uring, 4)]);
        }
        out
    }

    /// A link to a loopback socket the test holds the other end of.
    async fn pair(backend: Backend, slots: Rc<Slots>) -> (Link, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let conn = Conn::connect(addr, backend).await.expect("connect");
        let (peer, _) = listener.accept().expect("accept");
        (Link::start(conn, slots), peer)
    }

    /// A fill that must finish: bytes the peer sent and a lost read would leave it waiting.
    async fn fill_now(wire: &Wire) -> bool {
        tokio::time::timeout(Duration::from_secs(5), wire.fill())
            .await
            .expect("a fill waited 5 s for bytes the peer had sent (lost read?)")
    }

    /// Gives the io_uring driver a moment to take completions in.
    async fn settle() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    #[test]
    fn a_fill_dropped_while_waiting_loses_no_bytes() {
        for (backend, registered) in setups() {
            block_on(backend, async move {
                let slots = Rc::new(Slots::new(backend == Backend::Uring, registered));
                let (link, mut peer) = pair(backend, slots).await;
                let wire = link.wire();
                // Nothing to read: the wait is given up (on io_uring the read stays in flight).
                let gave_up = tokio::time::timeout(Duration::from_millis(20), wire.fill()).await;
                assert!(gave_up.is_err(), "{backend:?}: nothing was sent yet");
                peer.write_all(b"hello").expect("write");
                assert!(fill_now(wire).await, "{backend:?}");
                assert_eq!(&wire.inbox()[..], b"hello", "{backend:?}");
                peer.write_all(b" world").expect("write");
                assert!(fill_now(wire).await, "{backend:?}");
                assert_eq!(&wire.inbox()[..], b"hello world", "{backend:?}");
                drop(peer);
                assert!(!fill_now(wire).await, "{backend:?}: the peer closed");
                assert!(wire.is_over(), "{backend:?}");
                assert!(!fill_now(wire).await, "{backend:?}: over stays over");
                drop(link);
                settle().await;
                assert_eq!(metrics::with(|m| m.slots_in_use), 0, "{backend:?}");
                assert_eq!(client_metrics::with(|m| m.connections), 0, "{backend:?}");
            })
            .expect("runtime");
        }
    }

    #[test]
    fn a_connection_dropped_with_a_read_in_flight_gives_its_slot_back() {
        for (backend, registered) in setups() {
            block_on(backend, async move {
                let slots = Rc::new(Slots::new(backend == Backend::Uring, registered));
                let (link, _peer) = pair(backend, slots.clone()).await;
                let gave_up =
                    tokio::time::timeout(Duration::from_millis(20), link.wire().fill()).await;
                assert!(gave_up.is_err(), "{backend:?}: nothing was sent");
                drop(link);
                settle().await;
                assert_eq!(metrics::with(|m| m.slots_in_use), 0, "{backend:?}");
                assert_eq!(client_metrics::with(|m| m.connections), 0, "{backend:?}");
                // The pool kept its size: every slot can still be lent at once.
                let exhausted = metrics::with(|m| m.slot_exhausted);
                let lent: Vec<ReadBuf> = (0..SLOTS_PER_WORKER).map(|_| slots.lend()).collect();
                assert_eq!(
                    metrics::with(|m| m.slot_exhausted),
                    exhausted,
                    "{backend:?} with {registered} registered"
                );
                lent.into_iter().for_each(|b| slots.give_back(b));
            })
            .expect("runtime");
        }
    }
}
