//! The relay as a purpose-built io_uring completion loop on the `io-uring` crate, the way a
//! thread-per-core gateway would run one worker: no runtime, no futures, no epoll.
//!
//! - One ring on one thread, `SINGLE_ISSUER` + `DEFER_TASKRUN` (completions are only posted
//!   when this thread enters the kernel), its fd registered. The loop makes one system call
//!   per turn, `io_uring_enter`, and it is both the loop's only submission and its only wait:
//!   every operation a turn prepares (receives to re-arm, the sends of every message that
//!   completed) sits in the SQ until the next turn's enter, which submits them all and waits
//!   for the next completions. (The one exception: a full SQ is flushed with an extra
//!   `submit`, which a turn with fewer than `SQ_ENTRIES` operations never needs.)
//! - Sends to a socket with room complete during that very submission, so a turn that queued
//!   k sends waits for k + 1 completions (`submit_with_args` with `min_wait_usec`, kernel
//!   6.12+), not for 1, which the sends' own completions would satisfy at once: a request
//!   then costs one enter per hop, not two. After `BATCH_WAIT_US` the wait ends with whatever
//!   is there, so a send that could not complete at once (a full socket buffer) holds back
//!   other ready work no longer than that. Without the feature: `submit_and_wait(1)`.
//! - Sockets live only in the registered (fixed) file table: multishot accept allocates the
//!   agent's slot, `IORING_OP_SOCKET` the upstream's, `IORING_OP_CONNECT` connects it, and
//!   `TCP_NODELAY` is set with `IORING_OP_URING_CMD` (`SetSockOpt`, kernel 6.7+), since a
//!   direct descriptor has no ordinary fd for `setsockopt(2)`. All I/O names the socket by `types::Fixed`.
//! - Reads are multishot receives into one provided-buffer ring (`BUFFERS` × `BUFFER_BYTES`),
//!   the worker's fixed pool of read slots. A message that arrived whole in one buffer is sent
//!   straight from that buffer (no copy in user space) and the buffer goes back to the ring
//!   when the send completes; a message split over buffers (or arriving while the previous one
//!   is still being sent) is copied into the connection's own buffer and its buffers go back
//!   at once. Below `BUFFERS_LOW` free buffers, whole messages are copied too, so peers that
//!   read slowly can never pin the whole pool.
//! - Connection state is a slab indexed by the low 32 bits of each operation's `user_data`
//!   (the high bits name the operation). A connection's entry is freed only once every
//!   operation it started has posted its last completion, so no stale completion can reach a
//!   reused entry. Closing cancels everything pending on both sockets, then closes both fixed
//!   slots (cancel hard-linked to close).
//!
//! The HTTP framing is `message_len` of main.rs, as for the other runtimes. One thread; no TLS.

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::squeue::Flags;
use io_uring::types::{BufRingEntry, CancelBuilder, DestinationSlot, Fixed, SubmitArgs};
use io_uring::{IoUring, SubmissionQueue, Submitter, cqueue, opcode, squeue};
use slab::Slab;

use super::{MESSAGE_BYTES_MAX, message_len};

/// Most agent connections served at once (each with its upstream connection); a connection
/// accepted beyond this is closed at once.
const CONNECTIONS_MAX: usize = 1024;

/// Slots of the registered file table: the listener, two per connection, and room for the
/// sockets of connections that are still closing or were refused.
const FILES: u32 = 1 + 2 * CONNECTIONS_MAX as u32 + 256;

/// Fixed slot of the listening socket.
const LISTENER: u32 = 0;

/// Provided buffers in the ring: the worker's read slots (a power of two, at most 32768).
const BUFFERS: u16 = 1024;

/// Bytes of each provided buffer; one receive completion fills at most one.
const BUFFER_BYTES: usize = 16 * 1024;

/// Below this many buffers left in the ring, a whole message is copied rather than sent
/// from its buffer, so sends waiting on slow readers cannot hold the pool.
const BUFFERS_LOW: u32 = BUFFERS as u32 / 4;

/// Buffer group id of the ring.
const BUFFER_GROUP: u16 = 0;

/// Submission queue entries (a turn's operations: about two per active connection).
const SQ_ENTRIES: u32 = 4096;

/// Completion queue entries: multishot operations post many completions per submission.
const CQ_ENTRIES: u32 = 4 * SQ_ENTRIES;

/// How long a wait for a turn's own send completions plus one more event may hold on to
/// events that are already there (µs): sends that complete during the submission are
/// counted in the wait, so a request costs one enter per hop; one that could not (a full
/// socket buffer) delays other ready work by at most this.
const BATCH_WAIT_US: u32 = 200;

/// Listen backlog, as tokio-uring's and monoio's listeners use.
const BACKLOG: i32 = 1024;

/// The agent's side of a connection (index into `Conn::fds`, `armed`, `flows`).
const AGENT: usize = 0;

/// The upstream's side of a connection.
const UP: usize = 1;

// The operation in the high 32 bits of `user_data`; the low 32 are the connection's index.
// Receives and sends add the side: `OP_RECV + side` receives on that side, `OP_SEND + side`
// sends the flow read on that side (to the other side).
const OP_ACCEPT: u64 = 1;
const OP_SOCKET: u64 = 2;
const OP_CONNECT: u64 = 3;
const OP_NODELAY: u64 = 4;
const OP_RECV: u64 = 5;
const OP_RECV_LAST: u64 = OP_RECV + UP as u64;
const OP_SEND: u64 = 7;
const OP_SEND_LAST: u64 = OP_SEND + UP as u64;
const OP_CANCEL: u64 = 9;
const OP_CLOSE: u64 = 10;
/// Closing a socket that has no connection entry (refused: the table was full).
const OP_CLOSE_REFUSED: u64 = 11;

fn user_data(op: u64, conn: usize) -> u64 {
    (op << 32) | conn as u64
}

/// `TCP_NODELAY`'s value; static, so its address outlives every `SetSockOpt`.
static ONE: libc::c_int = 1;

/// An I/O error from a negative completion result.
fn errno(res: i32) -> io::Error {
    io::Error::from_raw_os_error(-res)
}

/// The upstream address as `connect(2)` takes it (boxed: its address must stay put while a
/// `Connect` is pending).
struct SockAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
    domain: libc::c_int,
}

impl SockAddr {
    fn new(addr: SocketAddr) -> Box<Self> {
        // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let (len, domain) = match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { std::ptr::write((&raw mut storage).cast(), sin) };
                (size_of::<libc::sockaddr_in>(), libc::AF_INET)
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
                unsafe { std::ptr::write((&raw mut storage).cast(), sin6) };
                (size_of::<libc::sockaddr_in6>(), libc::AF_INET6)
            }
        };
        Box::new(SockAddr {
            storage,
            len: len as libc::socklen_t,
            domain,
        })
    }
}

/// An anonymous private mapping (page-aligned, as a buffer ring must be).
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: a fresh anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The provided-buffer ring and the buffers it hands to the kernel.
///
/// A buffer is either in the ring (the kernel may fill it at any time; never read here) or
/// out of it (named by a receive completion: ours until `give` hands it back).
struct BufRing {
    ring: Mapping,
    buffers: Mapping,
    /// Our tail: entries before it are published to the kernel once `publish` runs.
    tail: u16,
    /// Buffers out of the ring (received, not yet given back).
    out: u32,
    /// Whether buffers were given back since the last `publish`.
    given: bool,
}

impl BufRing {
    /// Maps the ring and the buffers and fills the ring with every buffer (not yet published).
    fn new() -> io::Result<Self> {
        let ring = Mapping::new(usize::from(BUFFERS) * size_of::<BufRingEntry>())?;
        let buffers = Mapping::new(usize::from(BUFFERS) * BUFFER_BYTES)?;
        let mut r = BufRing {
            ring,
            buffers,
            tail: 0,
            out: u32::from(BUFFERS),
            given: false,
        };
        for bid in 0..BUFFERS {
            r.give(bid);
        }
        Ok(r)
    }

    /// Registers the ring as buffer group `BUFFER_GROUP` and publishes its buffers.
    fn register(&mut self, submitter: &Submitter<'_>) -> io::Result<()> {
        // SAFETY: the ring mapping outlives the io_uring (see `run`: declared before it).
        unsafe {
            submitter.register_buf_ring_with_flags(
                self.ring.ptr as u64,
                BUFFERS,
                BUFFER_GROUP,
                0,
            )?
        };
        self.publish();
        Ok(())
    }

    fn buffer(&self, bid: u16) -> *mut u8 {
        // SAFETY: bid < BUFFERS, so the offset is inside the buffers mapping.
        unsafe { self.buffers.ptr.add(usize::from(bid) * BUFFER_BYTES) }
    }

    /// The first `len` bytes of buffer `bid`, which a receive completion just handed to us.
    fn bytes(&self, bid: u16, len: usize) -> &[u8] {
        // SAFETY: bid is out of the ring (the kernel does not write it until `give`), and the
        // kernel filled its first len <= BUFFER_BYTES bytes.
        unsafe { std::slice::from_raw_parts(self.buffer(bid), len.min(BUFFER_BYTES)) }
    }

    /// Hands buffer `bid` back to the ring (seen by the kernel after `publish`).
    fn give(&mut self, bid: u16) {
        let bid = bid % BUFFERS;
        let i = usize::from(self.tail % BUFFERS);
        // SAFETY: i < BUFFERS entries of the ring mapping; the kernel reads only entries
        // before the published tail, and this one is at or after it.
        let entry = unsafe { &mut *self.ring.ptr.cast::<BufRingEntry>().add(i) };
        entry.set_addr(self.buffer(bid) as u64);
        entry.set_len(BUFFER_BYTES as u32);
        entry.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
        self.out -= 1;
        self.given = true;
    }

    /// Makes every buffer given back so far visible to the kernel.
    fn publish(&mut self) {
        self.given = false;
        // SAFETY: the tail field overlays entry 0's reserved field; the kernel reads it
        // atomically, so it is written atomically (release: the entries first).
        unsafe {
            let tail = BufRingEntry::tail(self.ring.ptr.cast::<BufRingEntry>()) as *mut u16;
            AtomicU16::from_ptr(tail).store(self.tail, Ordering::Release);
        }
    }

    /// Buffers the kernel can still fill.
    fn free(&self) -> u32 {
        u32::from(BUFFERS) - self.out
    }
}

/// What a flow is sending.
enum Out {
    Idle,
    /// A whole message straight from provided buffer `bid`.
    Buffer {
        bid: u16,
        len: usize,
    },
    /// A message from the flow's own buffer `own`.
    Own {
        len: usize,
    },
}

/// One direction of a connection: what is read on one side and sent to the other.
struct Flow {
    /// Bytes read and not yet sent: a message being assembled, or (rarely) whole messages
    /// that arrived while the previous one was still being sent.
    acc: Vec<u8>,
    /// The length of the message at the start of `acc`, once its head is complete.
    need: Option<usize>,
    /// The message being sent when it is not in a provided buffer.
    own: Vec<u8>,
    out: Out,
    /// Bytes of `out` sent so far.
    sent: usize,
}

impl Flow {
    fn new() -> Self {
        Flow {
            acc: Vec::new(),
            need: None,
            own: Vec::new(),
            out: Out::Idle,
            sent: 0,
        }
    }
}

/// An agent connection and its upstream connection.
struct Conn {
    /// Fixed slots of the agent's and the upstream's socket (the upstream's once created).
    fds: [Option<u32>; 2],
    /// Whether both sockets are ready (upstream connected).
    connected: bool,
    /// Whether a multishot receive is pending on each side.
    armed: [bool; 2],
    /// Requests (read on the agent's side) and responses (read on the upstream's side).
    flows: [Flow; 2],
    /// Operations started for this connection whose last completion has not come yet.
    inflight: u32,
    closing: bool,
}

/// The submission queue, flushed with an extra `submit` only when full.
struct Queue<'a> {
    sq: SubmissionQueue<'a>,
    submitter: Submitter<'a>,
}

impl Queue<'_> {
    /// Queues `entry` for the next submission.
    ///
    /// # Safety
    ///
    /// Every buffer and address `entry` points to must stay valid until its completion.
    unsafe fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: the caller's promise.
            if unsafe { self.sq.push(entry) }.is_ok() {
                return Ok(());
            }
            self.sq.sync();
            self.submitter.submit()?;
            self.sq.sync();
        }
    }
}

/// The worker's state: the queue, the buffer ring and the connections.
struct Worker<'a> {
    q: Queue<'a>,
    bufs: BufRing,
    conns: Slab<Conn>,
    upstream: Box<SockAddr>,
    /// Receives that ended for want of buffers: re-armed once buffers come back.
    starved: Vec<(usize, usize)>,
    /// Sends queued this turn (each usually completes during the submission).
    sends: usize,
}

/// Runs the relay on this thread until the ring fails.
pub fn run(listen: SocketAddr, upstream: SocketAddr) -> io::Result<()> {
    raise_nofile(u64::from(FILES) + 64)?;
    let listener = TcpListener::bind(listen)?;
    // SAFETY: listen(2) on a socket this function owns; again, to raise std's backlog.
    if unsafe { libc::listen(listener.as_raw_fd(), BACKLOG) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Declared before the ring, so dropped after it: the kernel may use the buffers until then.
    let mut bufs = BufRing::new()?;
    let mut ring: IoUring = IoUring::builder()
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_cqsize(CQ_ENTRIES)
        .build(SQ_ENTRIES)?;
    let params = ring.params().clone();
    let (mut submitter, sq, mut cq) = ring.split();
    submitter.register_files_sparse(FILES)?;
    submitter.register_files_update(LISTENER, &[listener.as_raw_fd()])?;
    bufs.register(&submitter)?;
    // Saves the ring's fd lookup on every enter; an optimisation only, so a failure is fine.
    let _ = submitter.register_ring_fd();
    println!("listening {}", listener.local_addr()?);

    let mut w = Worker {
        q: Queue { sq, submitter },
        bufs,
        conns: Slab::with_capacity(CONNECTIONS_MAX),
        upstream: SockAddr::new(upstream),
        starved: Vec::new(),
        sends: 0,
    };
    let mut batch_wait = params.is_feature_min_timeout();
    let batch_args = SubmitArgs::new().min_wait_usec(BATCH_WAIT_US);
    w.arm_accept()?;
    loop {
        w.rearm_starved()?;
        w.bufs.publish();
        w.q.sq.sync();
        cq.sync(); // hands the completions read so far back to the kernel
        let want = 1 + w.sends.min(CQ_ENTRIES as usize / 2);
        w.sends = 0;
        let r = if batch_wait && want > 1 {
            w.q.submitter.submit_with_args(want, &batch_args)
        } else {
            w.q.submitter.submit_and_wait(1)
        };
        if let Err(e) = r {
            match e.raw_os_error() {
                Some(libc::EINTR | libc::EAGAIN | libc::EBUSY | libc::ETIME) => {}
                // A kernel that takes no wait arguments: the plain wait from now on. The
                // submission may not have happened; the SQ still holds it then.
                Some(libc::EINVAL) if batch_wait => batch_wait = false,
                _ => return Err(e),
            }
        }
        cq.sync();
        for cqe in &mut cq {
            w.complete(cqe.user_data(), cqe.result(), cqe.flags())?;
        }
    }
}

/// Raises RLIMIT_NOFILE's soft limit to `want` if below: the kernel refuses a registered
/// file table larger than it.
fn raise_nofile(want: u64) -> io::Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid rlimit struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(io::Error::last_os_error());
        }
        if lim.rlim_cur >= want {
            return Ok(());
        }
        if lim.rlim_max < want {
            return Err(io::Error::other(format!(
                "RLIMIT_NOFILE hard limit {} is below the {want} the file table needs",
                lim.rlim_max
            )));
        }
        lim.rlim_cur = want;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Worker<'_> {
    fn arm_accept(&mut self) -> io::Result<()> {
        let e = opcode::AcceptMulti::new(Fixed(LISTENER))
            .allocate_file_index(true)
            .build()
            .user_data(user_data(OP_ACCEPT, 0));
        // SAFETY: points to nothing.
        unsafe { self.q.push(&e) }
    }

    /// Queues `entry` for connection `c`, counting it until its last completion.
    ///
    /// # Safety
    ///
    /// As for `Queue::push`.
    unsafe fn start(&mut self, c: usize, entry: squeue::Entry, op: u64) -> io::Result<()> {
        // SAFETY: the caller's promise.
        unsafe { self.q.push(&entry.user_data(user_data(op, c)))? };
        self.conns[c].inflight += 1;
        Ok(())
    }

    fn set_nodelay(&mut self, c: usize, slot: u32) -> io::Result<()> {
        let e = opcode::SetSockOpt::new(
            Fixed(slot),
            libc::IPPROTO_TCP as u32,
            libc::TCP_NODELAY as u32,
            (&raw const ONE).cast(),
            size_of::<libc::c_int>() as u32,
        )
        .build();
        // SAFETY: ONE is static.
        unsafe { self.start(c, e, OP_NODELAY) }
    }

    /// Arms the multishot receive on side `s` of `c`, unless pending or not ready.
    fn arm_recv(&mut self, c: usize, s: usize) -> io::Result<()> {
        let conn = &mut self.conns[c];
        let Some(slot) = conn.fds[s] else {
            return Ok(());
        };
        if conn.closing || !conn.connected || conn.armed[s] {
            return Ok(());
        }
        conn.armed[s] = true;
        let e = opcode::RecvMulti::new(Fixed(slot), BUFFER_GROUP).build();
        // SAFETY: the kernel picks a provided buffer; nothing of ours is pointed to.
        unsafe { self.start(c, e, OP_RECV + s as u64) }
    }

    /// Re-arms the receives that ran out of buffers, once some have come back.
    fn rearm_starved(&mut self) -> io::Result<()> {
        if self.starved.is_empty() || !self.bufs.given {
            return Ok(());
        }
        let starved = std::mem::take(&mut self.starved);
        for &(c, s) in &starved {
            // The entry may have been freed (and reused) since: `arm_recv` checks its state.
            if self.conns.contains(c) {
                self.arm_recv(c, s)?;
            }
        }
        self.starved = starved;
        self.starved.clear();
        Ok(())
    }

    /// Starts closing `c`: cancels what is pending on its sockets, then closes their slots.
    fn close(&mut self, c: usize) -> io::Result<()> {
        let conn = &mut self.conns[c];
        if conn.closing {
            return Ok(());
        }
        conn.closing = true;
        let fds = conn.fds;
        for slot in fds.into_iter().flatten() {
            let cancel = opcode::AsyncCancel2::new(CancelBuilder::fd(Fixed(slot)).all())
                .build()
                .flags(Flags::IO_HARDLINK);
            // SAFETY: point to nothing of ours.
            unsafe {
                self.start(c, cancel, OP_CANCEL)?;
                self.start(c, opcode::Close::new(Fixed(slot)).build(), OP_CLOSE)?;
            }
        }
        Ok(())
    }

    /// Handles one completion.
    fn complete(&mut self, ud: u64, res: i32, flags: u32) -> io::Result<()> {
        let (op, c) = (ud >> 32, (ud & u64::from(u32::MAX)) as usize);
        match op {
            OP_ACCEPT => return self.accepted(res, flags),
            OP_CLOSE_REFUSED => return Ok(()),
            _ => {}
        }
        let Some(conn) = self.conns.get_mut(c) else {
            return Ok(()); // cannot happen: an entry outlives its operations
        };
        if !cqueue::more(flags) {
            conn.inflight -= 1;
        }
        match op {
            OP_SOCKET => self.socket_created(c, res)?,
            OP_CONNECT => {
                if res < 0 {
                    self.close(c)?;
                } else if !self.conns[c].closing {
                    self.conns[c].connected = true;
                    self.arm_recv(c, AGENT)?;
                    self.arm_recv(c, UP)?;
                }
            }
            // A kernel without socket commands: measuring without TCP_NODELAY would measure
            // Nagle's algorithm, so stop. Any other failure ends this connection only.
            OP_NODELAY if -res == libc::EOPNOTSUPP || -res == libc::EINVAL => {
                return Err(io::Error::new(
                    errno(res).kind(),
                    format!("TCP_NODELAY (IORING_OP_URING_CMD): {}", errno(res)),
                ));
            }
            OP_NODELAY if res < 0 => self.close(c)?,
            OP_RECV..=OP_RECV_LAST => self.received(c, (op - OP_RECV) as usize, res, flags)?,
            OP_SEND..=OP_SEND_LAST => self.sent(c, (op - OP_SEND) as usize, res)?,
            _ => {} // OP_NODELAY done, OP_CANCEL, OP_CLOSE: nothing to do but count them
        }
        let conn = &self.conns[c];
        if conn.closing && conn.inflight == 0 {
            self.conns.remove(c);
        }
        Ok(())
    }

    fn accepted(&mut self, res: i32, flags: u32) -> io::Result<()> {
        if !cqueue::more(flags) {
            if res < 0 {
                match -res {
                    libc::EINVAL | libc::EBADF | libc::ENOTSOCK | libc::EOPNOTSUPP => {
                        return Err(errno(res));
                    }
                    _ => {}
                }
            }
            self.arm_accept()?;
        }
        if res < 0 {
            return Ok(()); // that connection is gone (e.g. ENFILE: the table is full)
        }
        let slot = res as u32;
        if self.conns.len() >= CONNECTIONS_MAX {
            let e = opcode::Close::new(Fixed(slot))
                .build()
                .user_data(user_data(OP_CLOSE_REFUSED, 0));
            // SAFETY: points to nothing.
            return unsafe { self.q.push(&e) };
        }
        let c = self.conns.insert(Conn {
            fds: [Some(slot), None],
            connected: false,
            armed: [false; 2],
            flows: [Flow::new(), Flow::new()],
            inflight: 0,
            closing: false,
        });
        self.set_nodelay(c, slot)?;
        let e = opcode::Socket::new(self.upstream.domain, libc::SOCK_STREAM, 0)
            .file_index(Some(DestinationSlot::auto_target()))
            .build();
        // SAFETY: points to nothing.
        unsafe { self.start(c, e, OP_SOCKET) }
    }

    fn socket_created(&mut self, c: usize, res: i32) -> io::Result<()> {
        if res < 0 {
            return self.close(c);
        }
        let slot = res as u32;
        if self.conns[c].closing {
            // SAFETY: points to nothing.
            return unsafe { self.start(c, opcode::Close::new(Fixed(slot)).build(), OP_CLOSE) };
        }
        self.conns[c].fds[UP] = Some(slot);
        self.set_nodelay(c, slot)?;
        let e = opcode::Connect::new(
            Fixed(slot),
            (&raw const self.upstream.storage).cast(),
            self.upstream.len,
        )
        .build();
        // SAFETY: the boxed address lives as long as the worker.
        unsafe { self.start(c, e, OP_CONNECT) }
    }

    /// A receive completion on side `s` of `c`.
    fn received(&mut self, c: usize, s: usize, res: i32, flags: u32) -> io::Result<()> {
        let more = cqueue::more(flags);
        if !more {
            self.conns[c].armed[s] = false;
        }
        let bid = cqueue::buffer_select(flags);
        if res > 0 {
            match bid {
                Some(bid) => {
                    self.bufs.out += 1;
                    if self.conns[c].closing {
                        self.bufs.give(bid);
                    } else {
                        self.data(c, s, bid, res as usize)?;
                    }
                }
                None => return self.close(c), // cannot happen: reads pick a buffer
            }
        } else if let Some(bid) = bid {
            self.bufs.out += 1;
            self.bufs.give(bid);
        }
        if res == 0 {
            self.close(c) // the peer closed
        } else if res == -libc::ENOBUFS {
            self.starved.push((c, s));
            Ok(())
        } else if res < 0 {
            self.close(c)
        } else if !more {
            self.arm_recv(c, s) // the kernel ended the multishot receive: re-arm it
        } else {
            Ok(())
        }
    }

    /// `n` bytes read into buffer `bid` on side `s` of `c`.
    fn data(&mut self, c: usize, s: usize, bid: u16, n: usize) -> io::Result<()> {
        let request = s == AGENT;
        let low = self.bufs.free() < BUFFERS_LOW;
        let flow = &mut self.conns[c].flows[s];
        let bytes = self.bufs.bytes(bid, n);
        if matches!(flow.out, Out::Idle) && flow.acc.is_empty() {
            match message_len(bytes, request) {
                Ok(Some(len)) if len == n && !low => {
                    flow.out = Out::Buffer { bid, len };
                    flow.sent = 0;
                    return self.send(c, s);
                }
                Ok(_) => {}
                Err(_) => {
                    self.bufs.give(bid);
                    return self.close(c);
                }
            }
        }
        flow.acc.extend_from_slice(bytes);
        self.bufs.give(bid);
        self.send_own(c, s)
    }

    /// Sends the next whole message of flow `f` of `c` from `acc`, if idle and one is there.
    fn send_own(&mut self, c: usize, f: usize) -> io::Result<()> {
        let flow = &mut self.conns[c].flows[f];
        if !matches!(flow.out, Out::Idle) || flow.acc.is_empty() {
            return Ok(());
        }
        let need = match flow.need {
            Some(n) => n,
            None => match message_len(&flow.acc, f == AGENT) {
                Ok(Some(n)) => {
                    flow.need = Some(n);
                    n
                }
                Ok(None) if flow.acc.len() <= MESSAGE_BYTES_MAX => return Ok(()),
                _ => return self.close(c), // malformed, or a head that never ends
            },
        };
        if flow.acc.len() < need {
            return Ok(());
        }
        flow.need = None;
        if flow.acc.len() == need {
            std::mem::swap(&mut flow.acc, &mut flow.own);
            flow.acc.clear();
        } else {
            flow.own.clear();
            flow.own.extend_from_slice(&flow.acc[..need]);
            flow.acc.drain(..need);
        }
        flow.out = Out::Own { len: need };
        flow.sent = 0;
        self.send(c, f)
    }

    /// Queues a send of the rest of flow `f`'s message to the other side of `c`.
    fn send(&mut self, c: usize, f: usize) -> io::Result<()> {
        let conn = &self.conns[c];
        let Some(slot) = conn.fds[1 - f] else {
            return Ok(()); // cannot happen: receives start once both sockets exist
        };
        let flow = &conn.flows[f];
        let (ptr, len) = match flow.out {
            Out::Idle => return Ok(()),
            Out::Buffer { bid, len } => (self.bufs.buffer(bid).cast_const(), len),
            Out::Own { len } => (flow.own.as_ptr(), len),
        };
        // SAFETY: sent < len <= the buffer's length.
        let ptr = unsafe { ptr.add(flow.sent) };
        let e = opcode::Send::new(Fixed(slot), ptr, (len - flow.sent) as u32)
            .flags(libc::MSG_NOSIGNAL)
            .build();
        // SAFETY: the provided buffer stays out of the ring, and `own` is left alone, until
        // this send's completion (`sent`); the entry of `c` lives until then too.
        unsafe { self.start(c, e, OP_SEND + f as u64)? };
        self.sends += 1;
        Ok(())
    }

    /// A send completion of flow `f` of `c`.
    fn sent(&mut self, c: usize, f: usize, res: i32) -> io::Result<()> {
        let closing = self.conns[c].closing;
        let flow = &mut self.conns[c].flows[f];
        let len = match flow.out {
            Out::Idle => return Ok(()),
            Out::Buffer { len, .. } | Out::Own { len } => len,
        };
        if res > 0 && !closing {
            flow.sent += res as usize;
            if flow.sent < len {
                return self.send(c, f); // a short send: the rest
            }
        }
        if let Out::Buffer { bid, .. } = std::mem::replace(&mut flow.out, Out::Idle) {
            self.bufs.give(bid);
        }
        if closing {
            Ok(())
        } else if res <= 0 {
            self.close(c)
        } else {
            self.send_own(c, f)
        }
    }
}
