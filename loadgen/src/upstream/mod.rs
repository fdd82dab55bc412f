//! `upstream`: a fast MCP Streamable HTTP server used as the upstream in perf runs and by
//! tests.
//!
//! Thread-per-core: `--workers` threads, each with its own SO_REUSEPORT listener on the
//! same address and its own tokio current_thread runtime, so the kernel spreads
//! connections and no runtime state is shared. Only the session table, the list_changed
//! signal and the pre-rendered bodies are shared (`state.rs`). Once every listener is
//! bound, one line `listening <ip:port>` goes to stdout; the process then serves until it
//! is killed.
//!
//! Reading order: `state.rs` (shared state), `tools.rs` (the tool list and its pages),
//! `route.rs` (MCP behaviour, sans-IO), `conn.rs` (bytes and timers).

mod conn;
mod route;
mod state;
mod tools;

use std::cell::Cell;
use std::fmt;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use rustls::ServerConfig;
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::TcpListener;

use crate::args::UpstreamArgs;
use crate::limits::FIXTURE_CONNECTIONS_PER_WORKER_MAX;
use conn::Connection;
use state::Shared;

/// Pending connections the kernel queues per listener.
const LISTEN_BACKLOG: i32 = 4096;

/// Pause before accepting again after accept failed (out of descriptors, most likely), so
/// a persistent failure does not spin the worker.
const ACCEPT_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// The canned answer to a connection over `FIXTURE_CONNECTIONS_PER_WORKER_MAX`.
const OVERLOADED: &[u8] =
    b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";

/// Why the fixture could not start.
#[derive(Debug)]
pub enum UpstreamError {
    /// A listener could not be created or bound.
    Bind(SocketAddr, io::Error),
    /// A worker thread or its runtime could not be started.
    Worker(io::Error),
    /// The TLS certificate or key could not be used.
    Tls(String),
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamError::Bind(addr, err) => write!(f, "cannot listen on {addr}: {err}"),
            UpstreamError::Worker(err) => write!(f, "cannot start a worker: {err}"),
            UpstreamError::Tls(why) => write!(f, "TLS: {why}"),
        }
    }
}

impl std::error::Error for UpstreamError {}

/// Binds, prints `listening <addr>`, and serves until killed.
pub fn serve(args: UpstreamArgs) -> Result<(), UpstreamError> {
    // Thousands of idle sessions need as many descriptors; best effort.
    let _ = crate::sys::raise_nofile_limit();
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(crate::tls::server_config(cert, key).map_err(UpstreamError::Tls)?)
        }
        _ => None,
    };
    let first = reuseport_listener(args.listen).map_err(|e| UpstreamError::Bind(args.listen, e))?;
    // With port 0 the first bind picked the port; the others join it.
    let addr = first
        .local_addr()
        .map_err(|e| UpstreamError::Bind(args.listen, e))?;
    let mut listeners = vec![first];
    for _ in 1..args.workers {
        listeners.push(reuseport_listener(addr).map_err(|e| UpstreamError::Bind(addr, e))?);
    }
    let shared = Arc::new(Shared::new(args));
    let mut workers = Vec::with_capacity(listeners.len());
    for (index, listener) in listeners.into_iter().enumerate() {
        let shared = Arc::clone(&shared);
        let tls = tls.clone();
        let worker = std::thread::Builder::new()
            .name(format!("fixture-{index}"))
            .spawn(move || run_worker(listener, shared, tls))
            .map_err(UpstreamError::Worker)?;
        workers.push(worker);
    }
    let mut stdout = io::stdout().lock();
    let _ = writeln!(stdout, "listening {addr}");
    let _ = stdout.flush();
    drop(stdout);
    for worker in workers {
        match worker.join() {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(UpstreamError::Worker(err)),
            Err(_) => return Err(UpstreamError::Worker(io::Error::other("worker panicked"))),
        }
    }
    Ok(())
}

/// Creates a non-blocking listener with SO_REUSEADDR and SO_REUSEPORT on `addr`.
fn reuseport_listener(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    Ok(socket.into())
}

/// One worker: a current_thread runtime accepting on its own listener.
fn run_worker(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    tls: Option<Arc<ServerConfig>>,
) -> io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, accept_loop(listener, shared, tls))
}

async fn accept_loop(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    tls: Option<Arc<ServerConfig>>,
) -> io::Result<()> {
    let listener = TcpListener::from_std(listener)?;
    let open = Rc::new(Cell::new(0usize));
    loop {
        let (mut stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Out of descriptors or a connection reset before accept: keep serving.
            Err(_) => {
                tokio::time::sleep(ACCEPT_RETRY_PAUSE).await;
                continue;
            }
        };
        if open.get() >= FIXTURE_CONNECTIONS_PER_WORKER_MAX {
            tokio::task::spawn_local(async move {
                let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, OVERLOADED).await;
            });
            continue;
        }
        let session = match &tls {
            None => None,
            Some(config) => match crate::tls::server_session(config) {
                Ok(session) => Some(session),
                // rustls refuses a session only when the config is unusable: drop this one.
                Err(_) => continue,
            },
        };
        open.set(open.get() + 1);
        let open = Rc::clone(&open);
        let connection = Connection::new(stream, Arc::clone(&shared), session);
        tokio::task::spawn_local(async move {
            connection.serve().await;
            open.set(open.get() - 1);
        });
    }
}
