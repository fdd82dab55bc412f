//! The one place that knows which I/O backend runs: io_uring (tokio-uring) or epoll
//! (tokio current-thread). Everything else reads and writes through [`Conn`].
//!
//! Rules that keep io_uring correct (a dropped read future does not cancel the kernel's
//! read, which then writes into a buffer nobody owns, or loses the bytes it read): a read
//! or accept is never cancelled by dropping its future — an agent connection reads in one
//! long-lived read loop, an upstream connection keeps a read whose waiter went away in
//! flight in its wire for the next waiter, and deadlines are enforced by
//! [`Conn::shutdown`], which makes the pending read complete; a socket is always shut down
//! before it is dropped. A write is dropped halfway only when its connection is shut down
//! at once and never written again (a write to an agent past its deadline or its write
//! limit): tokio-uring keeps a dropped write's buffer until the kernel completes it, which
//! the shutdown hastens, and under TLS the cut write keeps its mark, so no close_notify
//! follows a cut record.

use super::slots::{ReadBuf, Slots};
use super::tls::Tls;
use crate::limits::{
    TLS_IDLE_CHECK_READ_BYTES, TLS_IDLE_CHECK_READS_MAX, TLS_WRITE_BATCH_BYTES,
    UPSTREAM_REUSE_CHECK_AFTER,
};
use bytes::{Bytes, BytesMut};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

/// Parts one `writev` takes on epoll (an array on the stack); more parts take more calls.
/// Responses written in parts have a handful (head, stored bytes, tail).
const WRITE_PARTS_MAX: usize = 8;

/// Which event loop a worker runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// tokio-uring: one io_uring ring per worker.
    Uring,
    /// tokio current-thread runtime over epoll.
    Epoll,
}

impl Backend {
    /// The name used in logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Uring => "uring",
            Backend::Epoll => "epoll",
        }
    }
}

/// A connected TCP socket on the current worker, with TLS on top when it carries TLS.
///
/// Reads are raw socket reads on both kinds: what a read brought goes through
/// [`Conn::received`], which appends it (plain) or decrypts it (TLS) into the caller's
/// buffer, so the io_uring rules above hold for TLS unchanged. [`Conn::write_all`]
/// encrypts when the connection carries TLS.
pub struct Conn {
    pub(super) socket: Socket,
    /// The TLS session, boxed: a plain connection pays one pointer for it.
    pub(super) tls: Option<Box<Tls>>,
}

/// The socket under a [`Conn`].
pub(super) enum Socket {
    Uring(tokio_uring::net::TcpStream),
    /// A non-blocking socket on tokio's reactor. `AsyncFd` rather than tokio's `TcpStream`
    /// so a short read or write can clear the readiness it consumed: the next read then
    /// waits for epoll instead of paying a `recv` that returns `EAGAIN`.
    Epoll(AsyncFd<std::net::TcpStream>),
}

impl Socket {
    /// Reads into `buf` from its start; returns the byte count (0 = the peer closed or the
    /// socket was shut down) and the buffer.
    pub(super) async fn read(&self, buf: ReadBuf) -> (io::Result<usize>, ReadBuf) {
        match (self, buf) {
            (Socket::Uring(s), ReadBuf::Fixed(b)) => {
                let (r, b) = super::submit::submitted(s.read_fixed(b)).await;
                (r, ReadBuf::Fixed(b))
            }
            (Socket::Uring(s), ReadBuf::Heap(mut v)) => {
                v.clear();
                let (r, v) = super::submit::submitted(s.read(v)).await;
                (r, ReadBuf::Heap(v))
            }
            (Socket::Epoll(s), ReadBuf::Heap(mut v)) => {
                v.clear();
                let r = epoll_read(s, &mut v).await;
                (r, ReadBuf::Heap(v))
            }
            (Socket::Epoll(_), ReadBuf::Fixed(_)) => {
                unreachable!("fixed buffers exist only on io_uring workers")
            }
        }
    }

    /// Writes all of `data`.
    pub(super) async fn write_all(&self, data: Bytes) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        match self {
            Socket::Uring(s) => super::submit::submitted(s.write_all(data)).await.0,
            Socket::Epoll(s) => epoll_write_all(s, &data).await,
        }
    }

    /// Writes `parts` back to back, all of them, with vectored writes (no copy into one
    /// buffer).
    pub(super) async fn write_all_parts(&self, mut parts: Vec<Bytes>) -> io::Result<()> {
        parts.retain(|p| !p.is_empty());
        match self {
            Socket::Uring(s) => {
                while !parts.is_empty() {
                    let (written, back) = super::submit::submitted(s.writev(parts)).await;
                    parts = back;
                    consume(&mut parts, written?)?;
                }
                Ok(())
            }
            Socket::Epoll(s) => epoll_write_all_parts(s, &mut parts).await,
        }
    }

    /// Shuts both directions down: a pending read completes with 0 and the peer sees EOF.
    /// Errors (already closed) are ignored: the goal state is reached either way.
    pub(super) fn shutdown(&self) {
        let _ = match self {
            Socket::Uring(s) => s.shutdown(std::net::Shutdown::Both),
            Socket::Epoll(s) => shutdown_fd(s.as_raw_fd(), libc::SHUT_RDWR),
        };
    }

    pub(super) fn fd(&self) -> RawFd {
        match self {
            Socket::Uring(s) => s.as_raw_fd(),
            Socket::Epoll(s) => s.as_raw_fd(),
        }
    }

    /// Epoll only: true unless the reactor has seen nothing arrive since the last read
    /// emptied the socket (its readiness is clear). io_uring: always true.
    fn maybe_readable(&self) -> bool {
        match self {
            Socket::Uring(_) => true,
            Socket::Epoll(s) => {
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                s.poll_read_ready(&mut cx).is_ready()
            }
        }
    }

    /// Moves a tokio stream (non-blocking, registered) to an `AsyncFd` of its own.
    fn epoll(stream: tokio::net::TcpStream) -> io::Result<Socket> {
        let std = stream.into_std()?;
        // SAFETY: `std` owns its socket's descriptor, and a `std::net::TcpStream` returns
        // that same descriptor from `as_raw_fd` until it is dropped with the `AsyncFd`.
        let fd = unsafe { AsyncFd::register(std) }.map_err(io::Error::from)?;
        Ok(Socket::Epoll(fd))
    }
}

impl Conn {
    fn plain(socket: Socket) -> Conn {
        Conn { socket, tls: None }
    }

    /// Reads raw socket bytes into `buf` from its start; returns the byte count (0 = the
    /// peer closed or the socket was shut down) and the buffer. The bytes go through
    /// [`Conn::received`] before anything decodes them.
    pub async fn read(&self, buf: ReadBuf) -> (io::Result<usize>, ReadBuf) {
        self.socket.read(buf).await
    }

    /// Appends what a read brought to `out`: as is, or decrypted when the connection
    /// carries TLS (which may add nothing, e.g. for a session ticket). An error is a
    /// broken TLS stream: the connection is over. See also [`Conn::tls_closed`].
    pub fn received(&self, data: &[u8], out: &mut BytesMut) -> io::Result<()> {
        match &self.tls {
            None => {
                out.extend_from_slice(data);
                Ok(())
            }
            Some(tls) => tls.decrypt(data, out),
        }
    }

    /// True once the TLS peer sent close_notify: no more bytes will come (never for plain).
    pub fn tls_closed(&self) -> bool {
        self.tls.as_ref().is_some_and(|t| t.peer_closed())
    }

    /// Moves plaintext that arrived with the TLS handshake's last flight into `out`;
    /// returns its length (0 for plain connections).
    pub fn take_early(&self, out: &mut BytesMut) -> usize {
        self.tls.as_ref().map_or(0, |t| t.take_early(out))
    }

    /// Writes all of `data`, encrypted when the connection carries TLS. One writer at a
    /// time per connection (records must reach the socket in the order they were sealed).
    pub async fn write_all(&self, data: Bytes) -> io::Result<()> {
        match &self.tls {
            None => self.socket.write_all(data).await,
            Some(tls) => {
                let writing = tls.start_write()?;
                let mut rest = &data[..];
                let written = loop {
                    let (sealed, left) = match tls.seal(rest) {
                        Ok(sealed) => sealed,
                        Err(e) => break Err(e),
                    };
                    if let Err(e) = self.socket.write_all(sealed).await {
                        break Err(e);
                    }
                    if left.is_empty() {
                        break Ok(());
                    }
                    rest = left;
                };
                writing.done();
                written
            }
        }
    }

    /// Writes `parts` back to back, like [`Conn::write_all`] of them joined, but without
    /// joining them: large shared bytes (a stored list) reach the socket as they are.
    ///
    /// Under TLS, parts that fit one sealing batch together are joined (sealing copies
    /// them anyway, and one batch is one write); larger ones are sealed part by part, a
    /// batch at a time, so a multi-megabyte answer is never copied whole.
    pub async fn write_all_parts(&self, parts: Vec<Bytes>) -> io::Result<()> {
        if self.tls.is_none() {
            return self.socket.write_all_parts(parts).await;
        }
        let total: usize = parts.iter().map(Bytes::len).sum();
        if total > TLS_WRITE_BATCH_BYTES {
            for part in parts {
                self.write_all(part).await?;
            }
            return Ok(());
        }
        let mut joined = BytesMut::with_capacity(total);
        for part in &parts {
            joined.extend_from_slice(part);
        }
        self.write_all(joined.freeze()).await
    }

    /// Shuts the sending direction down (after close_notify on a TLS connection): the
    /// peer sees the end of what was written, and this side can still read. Idempotent.
    pub fn shutdown_write(&self) {
        if let Some(alert) = self.tls.as_ref().and_then(|t| t.close_notify()) {
            send_now(self.socket.fd(), &alert);
        }
        let _ = shutdown_fd(self.socket.fd(), libc::SHUT_WR);
    }

    /// Shuts both directions down: a pending read completes with 0 and the peer sees EOF.
    /// A TLS connection first sends close_notify when no write is in progress (a
    /// non-blocking send of one alert record; if the socket cannot take it now the close
    /// is abrupt). Idempotent.
    pub fn shutdown(&self) {
        if let Some(alert) = self.tls.as_ref().and_then(|t| t.close_notify()) {
            send_now(self.socket.fd(), &alert);
        }
        self.socket.shutdown();
    }

    /// Connects to `addr` on this worker's backend, with TCP_NODELAY set.
    ///
    /// The connect itself runs on tokio's readiness reactor (present on both backends), so
    /// a caller may time it out by dropping the future; on io_uring the connected socket is
    /// then handed to the ring for all later reads and writes.
    pub async fn connect(addr: SocketAddr, backend: Backend) -> io::Result<Conn> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        match backend {
            Backend::Epoll => Socket::epoll(stream).map(Conn::plain),
            Backend::Uring => {
                let std = stream.into_std()?;
                // The ring's reads and writes expect a blocking socket (as accept gives).
                std.set_nonblocking(false)?;
                Ok(Conn::plain(Socket::Uring(
                    tokio_uring::net::TcpStream::from_std(std),
                )))
            }
        }
    }

    /// True if the peer has closed (or reset) this idle connection, or sent bytes nobody
    /// asked for; either way it must not carry another request. Never blocks: a
    /// `MSG_PEEK | MSG_DONTWAIT` receive of one byte. On epoll that system call is skipped
    /// when the reactor has seen nothing arrive since the last read emptied the socket
    /// (its readiness is clear): a close that the reactor has not picked up yet is the
    /// same race as one arriving just after the peek, and the pool's one resend on a
    /// reused connection covers both.
    ///
    /// A TLS connection may legitimately receive bytes while idle (session tickets, key
    /// updates): those are taken in (at most [`crate::limits::TLS_IDLE_CHECK_READS_MAX`] non-blocking
    /// reads) and the connection stays usable unless they held data, close_notify or an
    /// error. Only called with no read in flight.
    ///
    /// On io_uring, which has no readiness to look at, a plain connection idle for less
    /// than [`UPSTREAM_REUSE_CHECK_AFTER`] is not checked: the same race, covered the
    /// same way, for one system call less per request.
    pub fn unusable(&self, idle_for: Duration) -> bool {
        if !self.socket.maybe_readable() {
            return false;
        }
        if self.tls.is_none()
            && matches!(self.socket, Socket::Uring(_))
            && idle_for < UPSTREAM_REUSE_CHECK_AFTER
        {
            return false;
        }
        let fd = self.socket.fd();
        if let Some(tls) = &self.tls {
            let mut buf = [0u8; TLS_IDLE_CHECK_READ_BYTES];
            for _ in 0..TLS_IDLE_CHECK_READS_MAX {
                // SAFETY: `fd` is a socket owned by `self` for the duration of the call;
                // the pointer and length describe `buf`, writable and owned here.
                let n = unsafe {
                    libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
                };
                let Ok(n) = usize::try_from(n) else {
                    return !would_block(&io::Error::last_os_error());
                };
                if n == 0 || tls.idle_input_unusable(buf.get(..n).unwrap_or_default()) {
                    return true;
                }
            }
            return true;
        }
        let mut byte = 0u8;
        // SAFETY: `fd` is a socket owned by `self` for the duration of the call, and the
        // buffer is one valid, writable byte.
        let n = unsafe {
            libc::recv(
                fd,
                (&raw mut byte).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return !would_block(&io::Error::last_os_error());
        }
        true // 0: the peer closed; > 0: unsolicited bytes
    }

    /// True if a read may be awaited in place and dropped at any await: on epoll a read
    /// waits for readiness and owns nothing meanwhile. On io_uring a read must run to
    /// completion (its buffer belongs to the kernel until then), so it needs a task of
    /// its own that nobody cancels.
    pub fn reads_cancel_safe(&self) -> bool {
        matches!(self.socket, Socket::Epoll(_))
    }

    /// Epoll only (see [`Conn::reads_cancel_safe`]): waits until the socket is readable,
    /// then receives once into a slot lent by `slots` for just that receive. Returns the
    /// byte count (0 = the peer closed or the socket was shut down) and the slot, which
    /// the caller gives back. Safe to drop while waiting: no slot is lent until the
    /// receive runs, and the receive itself does not wait.
    pub async fn read_ready(&self, slots: &Slots) -> io::Result<(usize, ReadBuf)> {
        let Socket::Epoll(s) = &self.socket else {
            unreachable!("read_ready is for epoll connections; io_uring reads use read")
        };
        loop {
            let mut guard = s.readable().await?;
            let mut buf = slots.lend();
            let ReadBuf::Heap(v) = &mut buf else {
                unreachable!("fixed buffers exist only on io_uring workers")
            };
            v.clear();
            match recv_ready(&mut guard, v) {
                Some(Ok(n)) => return Ok((n, buf)),
                Some(Err(e)) => {
                    slots.give_back(buf);
                    return Err(e);
                }
                None => slots.give_back(buf),
            }
        }
    }
}

/// One non-blocking send of `bytes` (best effort: a close_notify before a shutdown).
fn send_now(fd: RawFd, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    // SAFETY: `fd` is a socket owned by the caller for the duration of the call; the
    // pointer and length describe `bytes`, readable and borrowed for the call.
    let _ = unsafe {
        libc::send(
            fd,
            bytes.as_ptr().cast(),
            bytes.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
}

/// EAGAIN or EINTR: nothing is wrong, there is just nothing now.
pub(super) fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Reads once into the spare capacity of `v` (see [`recv_ready`]).
async fn epoll_read(s: &AsyncFd<std::net::TcpStream>, v: &mut Vec<u8>) -> io::Result<usize> {
    loop {
        let mut guard = s.readable().await?;
        if let Some(result) = recv_ready(&mut guard, v) {
            return result;
        }
    }
}

/// One `recv` into the spare capacity of `v` on a socket epoll reported readable; `None`
/// if it would block after all (the readiness is then cleared by tokio). A read shorter
/// than the room it had emptied the socket's receive queue, so the readiness it used is
/// cleared: the next read waits for epoll's next edge instead of trying `recv` for an
/// `EAGAIN` first. (Clearing is tick-checked by tokio: an edge that arrived meanwhile is
/// not lost.)
fn recv_ready(
    guard: &mut AsyncFdReadyGuard<'_, std::net::TcpStream>,
    v: &mut Vec<u8>,
) -> Option<io::Result<usize>> {
    let room = v.capacity() - v.len();
    assert!(room > 0, "a read buffer has room");
    match guard.try_io(|fd| recv_spare(fd.as_raw_fd(), v)) {
        Ok(Ok(n)) => {
            if n > 0 && n < room {
                guard.clear_ready();
            }
            Some(Ok(n))
        }
        Ok(Err(e)) => Some(Err(e)),
        Err(_would_block) => None,
    }
}

/// `recv(2)` into the spare capacity of `v`, extending its length by what arrived.
fn recv_spare(fd: RawFd, v: &mut Vec<u8>) -> io::Result<usize> {
    let spare = v.spare_capacity_mut();
    // SAFETY: `fd` is a socket owned by the caller for the duration of the call; the
    // pointer and length describe `spare`, writable memory owned by `v`, and recv writes
    // at most that many bytes.
    let n = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), spare.len(), 0) };
    let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
    assert!(n <= spare.len());
    // SAFETY: recv initialized the first `n` bytes of the spare capacity.
    unsafe { v.set_len(v.len() + n) };
    Ok(n)
}

/// Writes all of `data`; a short write (the send buffer filled) clears the write
/// readiness so the next attempt waits for epoll rather than failing with `EAGAIN`.
async fn epoll_write_all(s: &AsyncFd<std::net::TcpStream>, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        let mut guard = s.writable().await?;
        match guard.try_io(|fd| io::Write::write(&mut fd.get_ref(), data)) {
            Ok(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => {
                if n < data.len() {
                    guard.clear_ready();
                }
                data = data.get(n..).unwrap_or_default();
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

/// Like [`epoll_write_all`], for `parts` back to back: one `writev` of up to
/// [`WRITE_PARTS_MAX`] parts per attempt. Empties `parts`.
async fn epoll_write_all_parts(
    s: &AsyncFd<std::net::TcpStream>,
    parts: &mut Vec<Bytes>,
) -> io::Result<()> {
    while !parts.is_empty() {
        let mut guard = s.writable().await?;
        let mut slices = [io::IoSlice::new(&[]); WRITE_PARTS_MAX];
        let count = parts.len().min(WRITE_PARTS_MAX);
        for (slice, part) in slices.iter_mut().zip(parts.iter()) {
            *slice = io::IoSlice::new(part);
        }
        let offered: usize = parts.iter().take(count).map(Bytes::len).sum();
        let batch = slices.get(..count).unwrap_or_default();
        // A plain writev (no MSG_NOSIGNAL): a peer gone raises SIGPIPE, which the Rust
        // runtime ignores in every binary, so the write fails with EPIPE as on io_uring.
        match guard.try_io(|fd| io::Write::write_vectored(&mut fd.get_ref(), batch)) {
            Ok(Ok(n)) => {
                if n < offered {
                    guard.clear_ready();
                }
                consume(parts, n)?;
            }
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => continue,
        }
    }
    Ok(())
}

/// Drops the first `written` bytes of `parts` (a write took them); a write that took
/// nothing of a non-empty list is an error, as for a plain write.
fn consume(parts: &mut Vec<Bytes>, mut written: usize) -> io::Result<()> {
    if written == 0 {
        return Err(io::ErrorKind::WriteZero.into());
    }
    let mut whole = 0;
    for part in parts.iter_mut() {
        if written < part.len() {
            bytes::Buf::advance(part, written);
            written = 0;
            break;
        }
        written -= part.len();
        whole += 1;
    }
    parts.drain(..whole);
    if written > 0 {
        return Err(io::Error::other(
            "a write reported more bytes than it was given",
        ));
    }
    Ok(())
}

fn shutdown_fd(fd: RawFd, how: libc::c_int) -> io::Result<()> {
    // SAFETY: `fd` is a socket owned by the caller for the duration of the call;
    // shutdown(2) does not take ownership or invalidate it.
    let rc = unsafe { libc::shutdown(fd, how) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A listening socket on the current worker (one per worker per server binding, all
/// bound to the same address with SO_REUSEPORT so the kernel spreads connections).
pub enum Listener {
    Uring(tokio_uring::net::TcpListener),
    Epoll(tokio::net::TcpListener),
}

impl Listener {
    /// Adopts a bound, listening std socket on this worker's backend.
    pub fn adopt(std: std::net::TcpListener, backend: Backend) -> io::Result<Listener> {
        Ok(match backend {
            Backend::Uring => Listener::Uring(tokio_uring::net::TcpListener::from_std(std)),
            Backend::Epoll => {
                std.set_nonblocking(true)?;
                Listener::Epoll(tokio::net::TcpListener::from_std(std)?)
            }
        })
    }

    /// Accepts one connection, with TCP_NODELAY set.
    pub async fn accept(&self) -> io::Result<(Conn, SocketAddr)> {
        match self {
            Listener::Uring(l) => {
                let (s, peer) = super::submit::submitted(l.accept()).await?;
                s.set_nodelay(true)?;
                Ok((Conn::plain(Socket::Uring(s)), peer))
            }
            Listener::Epoll(l) => {
                let (s, peer) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok((Conn::plain(Socket::epoll(s)?), peer))
            }
        }
    }

    /// Stops accepting: a pending accept completes with an error (never dropped).
    pub fn shutdown(&self) {
        let fd = match self {
            Listener::Uring(l) => l.as_raw_fd(),
            Listener::Epoll(l) => l.as_raw_fd(),
        };
        let _ = shutdown_fd(fd, libc::SHUT_RD);
    }
}

/// Binds `count` listening sockets to `addr` with SO_REUSEPORT; with port 0 the first
/// socket picks the port and the others join it. Returns them and the bound address.
pub fn bind_reuseport(
    addr: SocketAddr,
    count: usize,
) -> io::Result<(Vec<std::net::TcpListener>, SocketAddr)> {
    use socket2::{Domain, Protocol, Socket, Type};
    let mut bound = addr;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let socket = Socket::new(
            Domain::for_address(bound),
            Type::STREAM,
            Some(Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        socket.set_reuse_port(true)?;
        socket.bind(&bound.into())?;
        socket.listen(LISTEN_BACKLOG)?;
        let std: std::net::TcpListener = socket.into();
        bound = std.local_addr()?;
        out.push(std);
    }
    Ok((out, bound))
}

/// Kernel accept queue length per listener.
const LISTEN_BACKLOG: i32 = 1024;

/// True if this process may set up an io_uring ring (seccomp and kernel permitting).
pub fn uring_available() -> Result<(), io::Error> {
    tokio_uring::Runtime::new(&tokio_uring::builder()).map(drop)
}

#[cfg(test)]
#[path = "io_tests.rs"]
mod tests;
