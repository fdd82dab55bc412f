//! Thread-per-core runtime: one worker per core, pinned, each with its own event loop
//! (an io_uring ring, or epoll), its own listeners, slots, sessions and timers.
//!
//! The main thread builds the plan, binds the listeners (SO_REUSEPORT, one socket per
//! worker per server binding), starts the workers, then waits for SIGINT/SIGTERM and
//! drives a graceful drain. Workers reach each other in two ways only: the bounded inbox
//! queues ([`Inboxes`]), whose closures run on the target worker's loop (session hand-off,
//! metrics scrapes), and the stores (`crate::store`), whose watches wake a worker's own
//! task when a shared value changes. Each worker's request deadlines are in its own queue
//! ([`deadline`]).

pub mod deadline;
pub mod encode_pool;
mod handshake;
pub mod held;
pub mod io;
pub mod kept;
pub mod notify;
pub mod pass;
pub mod slots;
pub mod submit;
pub mod tls;

use crate::limits::CROSS_WORKER_QUEUE_LEN;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

pub use io::{Backend, Conn, Listener};
pub use slots::{Lent, ReadBuf, Slots};

/// Work sent to another worker: runs on that worker's loop, inside its LocalSet.
pub type Task = Box<dyn FnOnce() + Send>;

/// The senders of every worker's inbox, indexed by worker.
#[derive(Clone)]
pub struct Inboxes {
    senders: Arc<[mpsc::Sender<Task>]>,
}

/// The target worker's queue is full (or it has stopped): the caller answers 503.
#[derive(Debug, Clone, Copy)]
pub struct Busy;

impl Inboxes {
    /// Queues `task` on worker `index` without waiting.
    pub fn send(&self, index: usize, task: Task) -> Result<(), Busy> {
        let tx = self.senders.get(index).ok_or(Busy)?;
        tx.try_send(task).map_err(|_| Busy)
    }

    /// The number of workers.
    pub fn len(&self) -> usize {
        self.senders.len()
    }

    /// True if there are no workers.
    pub fn is_empty(&self) -> bool {
        self.senders.is_empty()
    }
}

/// Creates one bounded inbox per worker.
pub fn inboxes(workers: usize) -> (Inboxes, Vec<mpsc::Receiver<Task>>) {
    let (tx, rx): (Vec<_>, Vec<_>) = (0..workers)
        .map(|_| mpsc::channel(CROSS_WORKER_QUEUE_LEN))
        .unzip();
    (Inboxes { senders: tx.into() }, rx)
}

/// Drains queued cross-worker tasks until the inbox closes.
pub async fn run_inbox(mut rx: mpsc::Receiver<Task>) {
    while let Some(task) = rx.recv().await {
        task();
    }
}

/// The drain signal from the main thread: `true` once SIGINT/SIGTERM arrived.
pub type DrainSignal = watch::Receiver<bool>;

/// Waits until the drain signal turns true (or its sender is gone).
pub async fn drained(mut rx: DrainSignal) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Number of submission queue entries of each worker's ring.
const RING_ENTRIES: u32 = 1024;

/// Runs `main` on a new event loop of `backend` on this thread.
pub fn block_on<F: std::future::Future>(backend: Backend, main: F) -> std::io::Result<F::Output> {
    match backend {
        Backend::Uring => uring_block_on(submit::wanted(), main),
        Backend::Epoll => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            Ok(tokio::task::LocalSet::new().block_on(&rt, async move {
                deadline::start();
                main.await
            }))
        }
    }
}

/// [`block_on`] on io_uring, submitting promptly (`prompt`, see [`submit`]) or only when
/// the worker parks.
fn uring_block_on<F: std::future::Future>(prompt: bool, main: F) -> std::io::Result<F::Output> {
    let mut uring = tokio_uring::uring_builder();
    uring.setup_coop_taskrun().setup_single_issuer();
    let (rt, ring) = submit::create(prompt, || {
        tokio_uring::Runtime::new(
            tokio_uring::builder()
                .entries(RING_ENTRIES)
                .uring_builder(&uring),
        )
    })?;
    Ok(rt.block_on(async move {
        if let Some(fd) = ring {
            tokio::task::spawn_local(submit::flusher(fd));
        }
        deadline::start();
        main.await
    }))
}

/// Picks the backend for `runtime.io`. `auto` is epoll. Side by side on the same machine
/// (`perf/runtime-ab.sh`, Linux 6.18), mcpyard on tokio-uring reached 8-16 % less
/// throughput than on epoll at 8 connections (or tied), with more CPU per request; at 256
/// the two traded places from run to run. A bare relay on tokio-uring trails tokio's epoll
/// one too, and kernels before 6.18 offer io_uring less, not more. So io_uring runs only
/// when asked for (`uring`), and start-up fails when it cannot be set up.
pub fn choose_backend(mode: crate::config::IoMode) -> Result<Backend, String> {
    use crate::config::IoMode;
    match mode {
        IoMode::Epoll | IoMode::Auto => Ok(Backend::Epoll),
        IoMode::Uring => io::uring_available()
            .map(|()| Backend::Uring)
            .map_err(|e| format!("runtime.io is uring but io_uring cannot be set up: {e}")),
    }
}

/// Fixed-buffer slots each worker may register, from `RLIMIT_MEMLOCK` (a quarter kept
/// spare for the rings themselves).
pub fn registrable_slots(workers: usize) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass and reads nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    if rc != 0 || workers == 0 {
        return 0;
    }
    if lim.rlim_cur == libc::RLIM_INFINITY {
        return crate::limits::SLOTS_PER_WORKER;
    }
    let per_worker = (lim.rlim_cur as usize / workers) * 3 / 4;
    per_worker / crate::limits::SLOT_BYTES
}

/// Pins the current thread to the `index`-th core of the process's affinity mask.
pub fn pin(index: usize) {
    if let Some(ids) = core_affinity::get_core_ids()
        && !ids.is_empty()
        && let Some(id) = ids.get(index % ids.len())
        && !core_affinity::set_for_current(*id)
    {
        crate::log::warn(format_args!("runtime: pinning worker {index} failed"));
    }
}

/// The number of workers for `runtime.workers` (0 = one per available core).
pub fn worker_count(configured: usize) -> usize {
    if configured > 0 {
        return configured;
    }
    core_affinity::get_core_ids()
        .map(|ids| ids.len())
        .filter(|n| *n > 0)
        .or_else(|| std::thread::available_parallelism().ok().map(|n| n.get()))
        .unwrap_or(1)
        .min(crate::limits::WORKERS_MAX)
}

/// Sleeps on the current worker's timer (both backends run tokio's timer).
pub async fn sleep(d: Duration) {
    tokio::time::sleep(d).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::io::Read;
    use std::rc::Rc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    #[test]
    fn auto_runs_epoll_and_uring_only_when_asked() {
        use crate::config::IoMode;
        assert_eq!(choose_backend(IoMode::Auto), Ok(Backend::Epoll));
        assert_eq!(choose_backend(IoMode::Epoll), Ok(Backend::Epoll));
        match io::uring_available() {
            Ok(()) => assert_eq!(choose_backend(IoMode::Uring), Ok(Backend::Uring)),
            Err(_) => assert!(choose_backend(IoMode::Uring).is_err()),
        }
    }

    /// Ready again at once: a task that keeps the worker busy, so it never parks.
    async fn busy_turn() {
        let mut turned = false;
        std::future::poll_fn(|cx| {
            if std::mem::replace(&mut turned, true) {
                std::task::Poll::Ready(())
            } else {
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            }
        })
        .await;
    }

    /// Whether bytes written while the worker stays busy reach the peer within 1 s, with
    /// prompt submission on or off.
    fn write_reaches_a_busy_workers_peer(prompt: bool) -> bool {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let arrived = std::sync::Arc::new(AtomicBool::new(false));
        let seen = arrived.clone();
        let peer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut b = [0u8; 4];
            if s.read_exact(&mut b).is_ok() {
                seen.store(true, Ordering::SeqCst);
            }
        });
        let reached = uring_block_on(prompt, async move {
            let conn = Rc::new(
                io::Conn::connect(addr, Backend::Uring)
                    .await
                    .expect("connect"),
            );
            let writer = conn.clone();
            tokio::task::spawn_local(async move {
                let _ = writer.write_all(Bytes::from_static(b"ping")).await;
            });
            let start = Instant::now();
            while !arrived.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(1) {
                busy_turn().await;
            }
            let reached = arrived.load(Ordering::SeqCst);
            conn.shutdown();
            // Idle now: whatever is queued goes to the kernel, the peer finishes.
            tokio::time::sleep(Duration::from_millis(20)).await;
            reached
        })
        .expect("runtime");
        let _ = peer.join();
        reached
    }

    #[test]
    fn a_busy_worker_submits_its_writes_without_parking() {
        if io::uring_available().is_err() {
            return;
        }
        assert!(
            write_reaches_a_busy_workers_peer(true),
            "with prompt submission the write goes out while the worker is busy"
        );
        // The control: tokio-uring alone holds the write until the worker parks.
        assert!(
            !write_reaches_a_busy_workers_peer(false),
            "without it the write waits for the worker to park"
        );
    }
}
