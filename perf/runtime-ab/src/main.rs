//! A bare HTTP/1.1 relay: each agent connection gets one upstream connection, and each
//! request (head + `content-length` body) is read whole, written upstream, and the answer
//! (head + `content-length` body) read whole and written back. The same logic runs on
//! tokio's epoll reactor, on tokio-uring (as mcpyard uses it, without its prompt-submission
//! flusher) and on monoio's io_uring driver, so a comparison shows the I/O layer's own cost
//! per request: system calls, CPU, latency. `raw-uring` (raw.rs) is the same relay as a
//! purpose-built completion loop on the `io-uring` crate: fixed files, multishot accept and
//! receive into a provided-buffer ring, one submission per loop turn.
//!
//! Usage: runtime-ab --rt tokio-epoll|tokio-uring|monoio|raw-uring --listen ADDR --upstream ADDR
//! Prints `listening ADDR` once bound. One thread; no TLS, no pipelining, no limits beyond
//! MESSAGE_BYTES_MAX: a measuring tool for loopback, not a proxy.

use std::io;
use std::net::SocketAddr;

mod raw;

/// Largest request or response accepted (a longer one ends the connection).
const MESSAGE_BYTES_MAX: usize = 1 << 20;

/// Bytes each read asks for.
const READ_BYTES: usize = 16 * 1024;

/// The length of the whole HTTP message at the start of `buf`, once its head is complete.
fn message_len(buf: &[u8], request: bool) -> io::Result<Option<usize>> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let head = if request {
        httparse::Request::new(&mut headers).parse(buf)
    } else {
        httparse::Response::new(&mut headers).parse(buf)
    };
    let head_len = match head.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))? {
        httparse::Status::Complete(n) => n,
        httparse::Status::Partial => return Ok(None),
    };
    let body = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        })
        .unwrap_or(0);
    let total = head_len + body;
    if total > MESSAGE_BYTES_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message too large",
        ));
    }
    Ok(Some(total))
}

/// True once `buf` holds a whole message (it never holds more: no pipelining here).
fn complete(buf: &[u8], request: bool) -> io::Result<bool> {
    Ok(message_len(buf, request)?.is_some_and(|n| buf.len() >= n))
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "peer closed")
}

/// Before a read of the owned-buffer runtimes: `Some` ends the message (whole, or bad).
fn read_done(buf: &[u8], request: bool) -> Option<io::Result<()>> {
    match complete(buf, request) {
        Ok(true) => Some(Ok(())),
        Ok(false) => None,
        Err(e) => Some(Err(e)),
    }
}

/// After a read of the owned-buffer runtimes: the error that ends the message, if any
/// (0 bytes: the peer closed).
fn read_failed(r: io::Result<usize>) -> Option<io::Error> {
    match r {
        Ok(0) => Some(closed()),
        Ok(_) => None,
        Err(e) => Some(e),
    }
}

/// The relay on a runtime with owned-buffer reads and writes (tokio-uring, monoio): the
/// same steps on each runtime's own stream type, `$slice` naming how its buffers are sliced.
macro_rules! owned_buffer_relay {
    ($stream:ty, $slice:ident) => {
        async fn read_message(
            s: &mut $stream,
            mut buf: Vec<u8>,
            request: bool,
        ) -> (io::Result<()>, Vec<u8>) {
            buf.clear();
            loop {
                if let Some(done) = read_done(&buf, request) {
                    return (done, buf);
                }
                buf.reserve(READ_BYTES);
                let at = buf.len();
                let (r, b) = s.read(buf.$slice(at..)).await;
                buf = b.into_inner();
                if let Some(e) = read_failed(r) {
                    return (Err(e), buf);
                }
            }
        }

        async fn relay(mut agent: $stream, upstream: SocketAddr) -> io::Result<()> {
            let mut up = <$stream>::connect(upstream).await?;
            up.set_nodelay(true)?;
            agent.set_nodelay(true)?;
            let mut buf = Vec::with_capacity(READ_BYTES);
            loop {
                let (r, b) = read_message(&mut agent, buf, true).await;
                r?;
                let (r, b) = up.write_all(b).await;
                r?;
                let (r, b) = read_message(&mut up, b, false).await;
                r?;
                let (r, b) = agent.write_all(b).await;
                r?;
                buf = b;
            }
        }
    };
}

mod epoll {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    async fn read_message(s: &mut TcpStream, buf: &mut Vec<u8>, request: bool) -> io::Result<()> {
        buf.clear();
        while !complete(buf, request)? {
            buf.reserve(READ_BYTES);
            if s.read_buf(buf).await? == 0 {
                return Err(closed());
            }
        }
        Ok(())
    }

    async fn relay(mut agent: TcpStream, upstream: SocketAddr) -> io::Result<()> {
        let mut up = TcpStream::connect(upstream).await?;
        up.set_nodelay(true)?;
        agent.set_nodelay(true)?;
        let mut buf = Vec::with_capacity(READ_BYTES);
        loop {
            read_message(&mut agent, &mut buf, true).await?;
            up.write_all(&buf).await?;
            read_message(&mut up, &mut buf, false).await?;
            agent.write_all(&buf).await?;
        }
    }

    pub fn run(listen: SocketAddr, upstream: SocketAddr) -> io::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()?;
        let local = tokio::task::LocalSet::new();
        local.block_on(&rt, async move {
            let listener = TcpListener::bind(listen).await?;
            println!("listening {}", listener.local_addr()?);
            loop {
                let (agent, _) = listener.accept().await?;
                tokio::task::spawn_local(relay(agent, upstream));
            }
        })
    }
}

mod uring {
    use super::*;
    use tokio_uring::buf::BoundedBuf;
    use tokio_uring::net::{TcpListener, TcpStream};

    owned_buffer_relay!(TcpStream, slice);

    pub fn run(listen: SocketAddr, upstream: SocketAddr) -> io::Result<()> {
        tokio_uring::start(async move {
            let listener = TcpListener::bind(listen)?;
            println!("listening {}", listener.local_addr()?);
            loop {
                let (agent, _) = listener.accept().await?;
                tokio_uring::spawn(relay(agent, upstream));
            }
        })
    }
}

mod mono {
    use super::*;
    use monoio::buf::IoBufMut;
    use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
    use monoio::net::{TcpListener, TcpStream};

    owned_buffer_relay!(TcpStream, slice_mut);

    pub fn run(listen: SocketAddr, upstream: SocketAddr) -> io::Result<()> {
        let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().build()?;
        rt.block_on(async move {
            let listener = TcpListener::bind(listen)?;
            println!("listening {}", listener.local_addr()?);
            loop {
                let (agent, _) = listener.accept().await?;
                monoio::spawn(relay(agent, upstream));
            }
        })
    }
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |name: &str| -> io::Result<String> {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{name} is required"))
            })
    };
    let addr = |name: &str| -> io::Result<SocketAddr> {
        arg(name)?
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{name}: {e}")))
    };
    let (listen, upstream) = (addr("--listen")?, addr("--upstream")?);
    match arg("--rt")?.as_str() {
        "tokio-epoll" => epoll::run(listen, upstream),
        "tokio-uring" => uring::run(listen, upstream),
        "monoio" => mono::run(listen, upstream),
        "raw-uring" => raw::run(listen, upstream),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("unknown runtime {other}"),
        )),
    }
}
