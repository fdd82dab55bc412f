//! The one place that knows which I/O backend runs: io_uring (tokio-uring) or epoll
//! (tokio current-thread). Everything else reads and writes through [`Conn`].
//!
//! Rules that keep io_uring correct (see `reference/runtime-notes.md`): a read, write or
//! accept is never cancelled by dropping its future — an agent connection reads in one
//! long-lived read loop, an upstream connection keeps a read whose waiter went away in
//! flight in its wire for the next waiter, and deadlines are enforced by
//! [`Conn::shutdown`], which makes the pending read complete; a socket is always shut down
//! before it is dropped.

use super::slots::{ReadBuf, Slots};
use bytes::Bytes;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

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

/// A connected TCP socket on the current worker.
pub enum Conn {
    Uring(tokio_uring::net::TcpStream),
    /// A non-blocking socket on tokio's reactor. `AsyncFd` rather than tokio's `TcpStream`
    /// so a short read or write can clear the readiness it consumed: the next read then
    /// waits for epoll instead of paying a `recv` that returns `EAGAIN`.
    Epoll(AsyncFd<std::net::TcpStream>),
}

impl Conn {
    /// Reads into `buf` from its start; returns the byte count (0 = the peer closed or the
    /// socket was shut down) and the buffer.
    pub async fn read(&self, buf: ReadBuf) -> (io::Result<usize>, ReadBuf) {
        match (self, buf) {
            (Conn::Uring(s), ReadBuf::Fixed(b)) => {
                let (r, b) = s.read_fixed(b).await;
                (r, ReadBuf::Fixed(b))
            }
            (Conn::Uring(s), ReadBuf::Heap(mut v)) => {
                v.clear();
                let (r, v) = s.read(v).await;
                (r, ReadBuf::Heap(v))
            }
            (Conn::Epoll(s), ReadBuf::Heap(mut v)) => {
                v.clear();
                let r = epoll_read(s, &mut v).await;
                (r, ReadBuf::Heap(v))
            }
            (Conn::Epoll(_), ReadBuf::Fixed(_)) => {
                unreachable!("fixed buffers exist only on io_uring workers")
            }
        }
    }

    /// Writes all of `data`.
    pub async fn write_all(&self, data: Bytes) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        match self {
            Conn::Uring(s) => s.write_all(data).await.0,
            Conn::Epoll(s) => epoll_write_all(s, &data).await,
        }
    }

    /// Shuts both directions down: a pending read completes with 0 and the peer sees EOF.
    /// Errors (already closed) are ignored: the goal state is reached either way.
    pub fn shutdown(&self) {
        let _ = match self {
            Conn::Uring(s) => s.shutdown(std::net::Shutdown::Both),
            Conn::Epoll(s) => shutdown_fd(s.as_raw_fd(), libc::SHUT_RDWR),
        };
    }
}

impl Conn {
    /// Connects to `addr` on this worker's backend, with TCP_NODELAY set.
    ///
    /// The connect itself runs on tokio's readiness reactor (present on both backends), so
    /// a caller may time it out by dropping the future; on io_uring the connected socket is
    /// then handed to the ring for all later reads and writes.
    pub async fn connect(addr: SocketAddr, backend: Backend) -> io::Result<Conn> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        match backend {
            Backend::Epoll => Conn::epoll(stream),
            Backend::Uring => {
                let std = stream.into_std()?;
                // The ring's reads and writes expect a blocking socket (as accept gives).
                std.set_nonblocking(false)?;
                Ok(Conn::Uring(tokio_uring::net::TcpStream::from_std(std)))
            }
        }
    }

    /// Moves a tokio stream (non-blocking, registered) to an `AsyncFd` of its own.
    fn epoll(stream: tokio::net::TcpStream) -> io::Result<Conn> {
        let std = stream.into_std()?;
        // SAFETY: `std` owns its socket's descriptor, and a `std::net::TcpStream` returns
        // that same descriptor from `as_raw_fd` until it is dropped with the `AsyncFd`.
        let fd = unsafe { AsyncFd::register(std) }.map_err(io::Error::from)?;
        Ok(Conn::Epoll(fd))
    }

    /// True if the peer has closed (or reset) this idle connection, or sent bytes nobody
    /// asked for; either way it must not carry another request. Never blocks: a
    /// `MSG_PEEK | MSG_DONTWAIT` receive of one byte. On epoll that system call is skipped
    /// when the reactor has seen nothing arrive since the last read emptied the socket
    /// (its readiness is clear): a close that the reactor has not picked up yet is the
    /// same race as one arriving just after the peek, and the pool's one resend on a
    /// reused connection covers both.
    pub fn unusable(&self) -> bool {
        let fd = match self {
            Conn::Uring(s) => s.as_raw_fd(),
            Conn::Epoll(s) => {
                let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
                if s.poll_read_ready(&mut cx).is_pending() {
                    return false;
                }
                s.as_raw_fd()
            }
        };
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
            let e = io::Error::last_os_error();
            return !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            );
        }
        true // 0: the peer closed; > 0: unsolicited bytes
    }
}

impl Conn {
    /// True if a read may be awaited in place and dropped at any await: on epoll a read
    /// waits for readiness and owns nothing meanwhile. On io_uring a read must run to
    /// completion (its buffer belongs to the kernel until then), so it needs a task of
    /// its own that nobody cancels.
    pub fn reads_cancel_safe(&self) -> bool {
        matches!(self, Conn::Epoll(_))
    }

    /// Epoll only (see [`Conn::reads_cancel_safe`]): waits until the socket is readable,
    /// then receives once into a slot lent by `slots` for just that receive. Returns the
    /// byte count (0 = the peer closed or the socket was shut down) and the slot, which
    /// the caller gives back. Safe to drop while waiting: no slot is lent until the
    /// receive runs, and the receive itself does not wait.
    pub async fn read_ready(&self, slots: &Slots) -> io::Result<(usize, ReadBuf)> {
        let Conn::Epoll(s) = self else {
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
                let (s, peer) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok((Conn::Uring(s), peer))
            }
            Listener::Epoll(l) => {
                let (s, peer) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok((Conn::epoll(s)?, peer))
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
