//! The few Linux calls the standard library does not wrap: the open-file limit, the thread
//! timer slack, timerfd and kernel receive timestamps (`SO_TIMESTAMPNS` read with
//! `recvmsg`). This is the only file with `unsafe`; every block is a plain FFI call on
//! values owned here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};

use crate::limits::FIXTURE_SPIN_WINDOW;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, so thousands of sessions fit.
///
/// Returns the soft limit now in force.
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: `limit` is a valid rlimit read above; the kernel only reads it.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

/// Sets the calling thread's timer slack to 1 ns, so `nanosleep` wakes when asked instead
/// of up to 50 µs later (the default slack of a normal thread).
pub fn set_precise_timer_slack() -> io::Result<()> {
    let slack_ns: libc::c_ulong = 1;
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and touches no memory of ours.
    if unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, slack_ns, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sleeps until `deadline` with microsecond accuracy on a tokio runtime (returns at once if
/// it has passed).
///
/// Tokio's own timer rounds every deadline up to the next millisecond tick, so a 1 ms sleep
/// lasts 1–2 ms. Instead a one-shot timerfd registered with the runtime's reactor (an
/// hrtimer) wakes the task `FIXTURE_SPIN_WINDOW` early, and the task then yields until the
/// deadline: waking a halted vCPU and the reactor costs tens of µs, which the window
/// absorbs, and yielding lets the worker serve its other connections meanwhile. Falls back
/// to the tokio timer if the timerfd cannot be made.
pub async fn sleep_until_precise(deadline: Instant) {
    let coarse = deadline
        .saturating_duration_since(Instant::now())
        .saturating_sub(FIXTURE_SPIN_WINDOW);
    if !coarse.is_zero() && timerfd_sleep(coarse).await.is_err() {
        tokio::time::sleep(coarse).await;
    }
    // Each pass yields to the runtime, which may run other tasks and poll for I/O.
    while Instant::now() < deadline {
        tokio::task::yield_now().await;
    }
}

async fn timerfd_sleep(delay: Duration) -> io::Result<()> {
    let fd = one_shot_timerfd(delay)?;
    // SAFETY: the AsyncFd owns `fd` (an OwnedFd), so it stays open and is the same
    // descriptor until the AsyncFd is dropped, which closes it.
    let timer = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
    loop {
        let mut ready = timer.readable().await?;
        let mut expirations = [0u8; 8];
        // SAFETY: the fd is a timerfd owned by `timer`; the buffer is 8 writable bytes, the
        // size a timerfd read requires.
        let read = unsafe {
            libc::read(
                timer.get_ref().as_raw_fd(),
                expirations.as_mut_ptr().cast(),
                expirations.len(),
            )
        };
        if read == 8 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::WouldBlock {
            return Err(err);
        }
        ready.clear_ready();
    }
}

/// Creates a non-blocking timerfd on CLOCK_MONOTONIC that expires once after `delay`.
fn one_shot_timerfd(delay: Duration) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with constant flags; a negative return is handled below.
    let fd = unsafe {
        libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by timerfd_create and is owned by nobody else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let spec = libc::itimerspec {
        it_interval: libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        },
        it_value: libc::timespec {
            tv_sec: libc::time_t::try_from(delay.as_secs()).unwrap_or(libc::time_t::MAX),
            // Below 10^9, so it fits a c_long on every Linux target.
            tv_nsec: delay.subsec_nanos() as libc::c_long,
        },
    };
    // SAFETY: `owned` is a valid timerfd; `spec` is read by the kernel, the old value is not
    // requested.
    if unsafe { libc::timerfd_settime(owned.as_raw_fd(), 0, &spec, std::ptr::null_mut()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned)
}

/// Asks the kernel to stamp every segment received on socket `fd` with the time it arrived
/// (`SO_TIMESTAMPNS`, `CLOCK_REALTIME`), for [`recv_stamped`] to return.
///
/// The first socket of the system to ask switches stamping on for the whole stack from a
/// kernel worker, a moment later: segments received before that carry no stamp, and the
/// callers time them when read.
pub fn enable_receive_timestamps(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a valid c_int for the duration of the call; the kernel only reads it.
    let set = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&raw const on).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Room for one `SCM_TIMESTAMPNS` control message (`CMSG_SPACE(sizeof(timespec))` is 32 on
/// 64-bit Linux; twice that leaves room for anything else the kernel adds).
const CONTROL_BYTES: usize = 64;

/// Reads from socket `fd` into `buf` like `read`, and returns with the byte count the
/// kernel's receive timestamp of the last segment read (`CLOCK_REALTIME`, as a duration
/// since the Unix epoch), if the socket has [`enable_receive_timestamps`] on. Retries when
/// interrupted by a signal; honours the socket's `SO_RCVTIMEO` and non-blocking mode.
pub fn recv_stamped(fd: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<Duration>)> {
    // SAFETY: `buf` is writable for `buf.len()` bytes, which is all the kernel may write.
    unsafe { recv_stamped_raw(fd, buf.as_mut_ptr(), buf.len()) }
}

/// [`recv_stamped`] into the spare capacity of `buf` (at least `reserve` bytes of it),
/// growing `buf` by what was read.
pub fn recv_stamped_buf(
    fd: RawFd,
    buf: &mut BytesMut,
    reserve: usize,
) -> io::Result<(usize, Option<Duration>)> {
    buf.reserve(reserve);
    let spare = buf.chunk_mut();
    let (ptr, len) = (spare.as_mut_ptr(), spare.len());
    // SAFETY: `ptr` is the start of `buf`'s spare capacity, writable for `len` bytes.
    let (read, stamp) = unsafe { recv_stamped_raw(fd, ptr, len) }?;
    assert!(read <= len);
    // SAFETY: the kernel initialized the first `read` bytes of the spare capacity.
    unsafe { buf.advance_mut(read) };
    Ok((read, stamp))
}

/// # Safety
/// `ptr` must be writable for `len` bytes.
unsafe fn recv_stamped_raw(
    fd: RawFd,
    ptr: *mut u8,
    len: usize,
) -> io::Result<(usize, Option<Duration>)> {
    loop {
        // u64 elements keep the control buffer aligned for `cmsghdr`.
        let mut control = [0u64; CONTROL_BYTES / 8];
        let mut iov = libc::iovec {
            iov_base: ptr.cast(),
            iov_len: len,
        };
        // SAFETY: msghdr is plain data; all-zero is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &raw mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = CONTROL_BYTES as _;
        // SAFETY: `msg` points at `iov` (writable for `len` bytes, by the caller's promise)
        // and at `control` (CONTROL_BYTES writable bytes); both outlive the call.
        let read = unsafe { libc::recvmsg(fd, &raw mut msg, 0) };
        if read < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        let mut stamp = None;
        // SAFETY: the CMSG_* macros walk the control buffer the kernel filled, within
        // `msg.msg_controllen`; a timestamp's data is one timespec, read unaligned.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&raw const msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET
                    && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
                    && (*cmsg).cmsg_len as usize
                        >= libc::CMSG_LEN(size_of::<libc::timespec>() as u32) as usize
                {
                    let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                    stamp = timespec_duration(ts);
                }
                cmsg = libc::CMSG_NXTHDR(&raw const msg, cmsg);
            }
        }
        return Ok((read as usize, stamp));
    }
}

/// A kernel timespec as a duration since the epoch; `None` if it is negative or malformed.
fn timespec_duration(ts: libc::timespec) -> Option<Duration> {
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u32::try_from(ts.tv_nsec)
        .ok()
        .filter(|n| *n < 1_000_000_000)?;
    Some(Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::SystemTime;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("addr: {e}"));
        let client = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect: {e}"));
        let (server, _) = listener.accept().unwrap_or_else(|e| panic!("accept: {e}"));
        (client, server)
    }

    /// Messages sent before giving up on seeing a stamp: the kernel switches stamping on
    /// from a worker shortly after the first socket asks (see `enable_receive_timestamps`).
    const STAMP_TRIES: usize = 1000;

    #[test]
    fn a_stamped_socket_returns_the_bytes_and_their_arrival_stamp() {
        let (mut client, server) = pair();
        enable_receive_timestamps(server.as_raw_fd()).unwrap_or_else(|e| panic!("enable: {e}"));
        let mut stamped = None;
        for _ in 0..STAMP_TRIES {
            client
                .write_all(b"hello")
                .unwrap_or_else(|e| panic!("write: {e}"));
            let mut buf = [0u8; 16];
            let (n, stamp) =
                recv_stamped(server.as_raw_fd(), &mut buf).unwrap_or_else(|e| panic!("recv: {e}"));
            assert_eq!(buf.get(..n), Some(&b"hello"[..]));
            if stamp.is_some() {
                stamped = stamp;
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let stamp = stamped.unwrap_or_else(|| panic!("no receive stamp"));
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        assert!(stamp <= now, "stamp {stamp:?} after now {now:?}");
        assert!(!stamp.is_zero());
    }

    #[test]
    fn an_unstamped_socket_reads_without_a_stamp_into_a_growing_buffer() {
        let (mut client, server) = pair();
        client
            .write_all(b"abc")
            .unwrap_or_else(|e| panic!("write: {e}"));
        let mut buf = BytesMut::from(&b"xy"[..]);
        let (n, stamp) = recv_stamped_buf(server.as_raw_fd(), &mut buf, 8)
            .unwrap_or_else(|e| panic!("recv: {e}"));
        assert_eq!(n, 3);
        assert_eq!(&buf[..], b"xyabc");
        assert_eq!(stamp, None);
        drop(client);
        let (n, _) = recv_stamped_buf(server.as_raw_fd(), &mut buf, 8)
            .unwrap_or_else(|e| panic!("recv at eof: {e}"));
        assert_eq!(n, 0);
    }
}
