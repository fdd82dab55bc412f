//! Prompt io_uring submission.
//!
//! tokio-uring 0.5 queues each operation's entry in the ring's submission queue and hands
//! the queue to the kernel (`io_uring_enter`) only when its worker is about to park, or when
//! the queue is full. A busy worker therefore holds every read and write it queued until it
//! runs out of ready tasks: under load, exactly when latency matters, each response waits
//! for the whole run queue behind it.
//!
//! Here a per-worker flusher task enters the ring itself, once per scheduler round in which
//! an operation was queued: [`queued`] marks the round and wakes the flusher, which the
//! scheduler runs after the tasks already ready, so one `io_uring_enter` submits the round's
//! whole batch. The entries are already visible to the kernel (tokio-uring publishes the
//! queue's tail as it pushes), so entering is all that is missing; the kernel takes what is
//! between its head and the tail, and tokio-uring's own later submit finds nothing left.
//! Completions are still reaped by tokio-uring.
//!
//! The ring's descriptor is not exposed by tokio-uring, so it is found when the worker's
//! runtime is created: the `io_uring` descriptor that appeared in `/proc/self/fd` (creation
//! is serialised process-wide so the difference is exactly one). Where it cannot be found,
//! or with `MCPYARD_URING_SUBMIT=park` (for comparisons), submission stays tokio-uring's.

use std::cell::Cell;
use std::collections::BTreeSet;
use std::os::fd::RawFd;
use std::sync::Mutex;
use std::task::{Poll, Waker};

thread_local! {
    /// This worker's ring, once its flusher runs.
    static RING: Cell<Option<RawFd>> = const { Cell::new(None) };
    /// An operation was queued since the flusher last entered the ring.
    static PENDING: Cell<bool> = const { Cell::new(false) };
    static FLUSHER: Cell<Option<Waker>> = const { Cell::new(None) };
}

/// Rings are created one at a time, so a new descriptor is the new ring's.
static CREATION: Mutex<()> = Mutex::new(());

/// The environment variable that turns prompt submission off (`park`).
pub const SUBMIT_ENV: &str = "MCPYARD_URING_SUBMIT";

/// The `io_uring` descriptors open in this process.
fn ring_fds() -> BTreeSet<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return BTreeSet::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let fd: RawFd = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            (target.as_os_str() == "anon_inode:[io_uring]").then_some(fd)
        })
        .collect()
}

/// True unless `MCPYARD_URING_SUBMIT=park` turns prompt submission off.
pub fn wanted() -> bool {
    std::env::var(SUBMIT_ENV).map_or(true, |v| v != "park")
}

/// Creates a ring with `create` and returns it with its descriptor, if it can be told
/// apart (and prompt submission is not turned off).
pub(super) fn create<T>(
    wanted: bool,
    create: impl FnOnce() -> std::io::Result<T>,
) -> std::io::Result<(T, Option<RawFd>)> {
    let _one_at_a_time = CREATION.lock().unwrap_or_else(|e| e.into_inner());
    let before = if wanted { ring_fds() } else { BTreeSet::new() };
    let made = create()?;
    if !wanted {
        return Ok((made, None));
    }
    let new: Vec<RawFd> = ring_fds().difference(&before).copied().collect();
    Ok((
        made,
        (new.len() == 1).then(|| new.first().copied()).flatten(),
    ))
}

/// Marks that an operation is (about to be) queued on this worker's ring: the flusher
/// submits it after the tasks already ready have run. Cheap when already marked.
fn queued() {
    if PENDING.with(|p| p.replace(true)) {
        return;
    }
    FLUSHER.with(|w| {
        if let Some(w) = w.take() {
            w.wake();
        }
    });
}

/// `op`, an io_uring operation just created (its entry is queued), marked for the flusher.
pub fn submitted<F>(op: F) -> F {
    queued();
    op
}

/// The flusher of the worker whose ring is `fd`; runs until the runtime ends.
pub(super) async fn flusher(fd: RawFd) {
    RING.with(|r| r.set(Some(fd)));
    loop {
        std::future::poll_fn(|cx| {
            if PENDING.with(|p| p.replace(false)) {
                Poll::Ready(())
            } else {
                FLUSHER.with(|w| w.set(Some(cx.waker().clone())));
                Poll::Pending
            }
        })
        .await;
        enter(fd);
    }
}

/// Submits every queued entry (the kernel caps the count at what is queued).
fn enter(fd: RawFd) {
    const TO_SUBMIT: libc::c_long = u32::MAX as libc::c_long;
    // SAFETY: io_uring_enter(2) on this worker's own ring, from the thread that created it
    // (the ring is single-issuer), with no completions waited for and no signal mask:
    // it reads only the shared submission ring, which tokio-uring keeps consistent.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_io_uring_enter,
            fd,
            TO_SUBMIT,
            0 as libc::c_long,
            0 as libc::c_long,
            std::ptr::null::<libc::c_void>(),
            0 as libc::c_long,
        )
    };
    if rc >= 0 {
        crate::metrics::with(|m| m.uring_flushes += 1);
    }
}

/// True if this worker submits promptly (its flusher runs).
pub fn prompt() -> bool {
    RING.with(Cell::get).is_some()
}
