//! The few Linux calls the standard library does not wrap: the open-file limit, the thread
//! timer slack and timerfd. This is the only file with `unsafe`; every block is a plain FFI
//! call on values owned here.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

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

/// Sleeps for `delay` with microsecond accuracy on a tokio runtime.
///
/// Tokio's own timer rounds every deadline up to the next millisecond tick, so a 1 ms sleep
/// lasts 1–2 ms. Instead a one-shot timerfd registered with the runtime's reactor (an
/// hrtimer) wakes the task `FIXTURE_SPIN_WINDOW` early, and the task then yields until the
/// deadline: waking a halted vCPU and the reactor costs tens of µs, which the window
/// absorbs, and yielding lets the worker serve its other connections meanwhile. Falls back
/// to the tokio timer if the timerfd cannot be made.
pub async fn sleep_precise(delay: Duration) {
    if delay.is_zero() {
        return;
    }
    let deadline = Instant::now() + delay;
    let coarse = delay.saturating_sub(FIXTURE_SPIN_WINDOW);
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
