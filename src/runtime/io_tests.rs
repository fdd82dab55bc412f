//! Vectored writes over real loopback sockets, on both backends: every byte of every part
//! arrives, in order, when the parts outnumber one `writev` and the socket buffer fills
//! (short writes) while the peer reads; and the bookkeeping of a short write alone.

use super::*;
use crate::runtime::{ReadBuf, block_on};

/// epoll always; io_uring where this machine allows it (a skip is said on stderr).
fn backends() -> Vec<Backend> {
    let mut out = vec![Backend::Epoll];
    match uring_available() {
        Ok(()) => out.push(Backend::Uring),
        Err(e) => eprintln!("io_uring not available here, epoll only: {e}"),
    }
    out
}

/// `count` parts of `size` bytes each, every byte naming its part and position, so a
/// lost, doubled or reordered piece shows.
fn parts(count: usize, size: usize) -> Vec<Bytes> {
    (0..count)
        .map(|p| {
            let bytes: Vec<u8> = (0..size).map(|i| (p * 31 + i % 251) as u8).collect();
            Bytes::from(bytes)
        })
        .collect()
}

/// A client connection and the server's end of it, over loopback on this worker.
async fn connected(backend: Backend) -> (Conn, Conn) {
    let std = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = std.local_addr().expect("addr");
    let listener = Listener::adopt(std, backend).expect("adopt");
    let client = Conn::connect(addr, backend).await.expect("connect");
    let (server, _) = listener.accept().await.expect("accept");
    (client, server)
}

/// Reads until `want` bytes came or the peer closed, then shuts the connection down.
async fn read_all(conn: &Conn, want: usize) -> BytesMut {
    let mut got = BytesMut::new();
    while got.len() < want {
        let (r, buf) = conn
            .read(ReadBuf::Heap(Vec::with_capacity(64 * 1024)))
            .await;
        let n = r.expect("read");
        if n == 0 {
            break;
        }
        conn.received(buf.get(..n).unwrap_or_default(), &mut got)
            .expect("plain");
    }
    conn.shutdown();
    got
}

#[test]
fn many_large_parts_arrive_whole_and_in_order_on_both_backends() {
    // 20 parts (more than one writev takes) of 256 KiB: 5 MiB, far more than a loopback
    // socket buffer, so writes come back short while the reader drains.
    let sent = parts(3 * WRITE_PARTS_MAX - 4, 256 * 1024);
    let mut want = Vec::new();
    for p in &sent {
        want.extend_from_slice(p);
    }
    for backend in backends() {
        let sent = sent.clone();
        let got = block_on(backend, async move {
            let (client, server) = connected(backend).await;
            small_send_buffer(&client);
            let total: usize = sent.iter().map(Bytes::len).sum();
            let write = async {
                client.write_all_parts(sent).await.expect("write");
                client.shutdown();
            };
            tokio::join!(write, read_all(&server, total)).1
        })
        .expect("runtime");
        assert_eq!(got.len(), want.len(), "{backend:?}");
        assert!(got[..] == want[..], "{backend:?}: bytes differ");
    }
}

/// Shrinks the socket's send buffer (the kernel's floor is a few KiB), so that a large
/// write is certain to come back short.
fn small_send_buffer(conn: &Conn) {
    let size: libc::c_int = 4096;
    // SAFETY: a valid socket of `conn` for the duration of the call, and a c_int option
    // value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            conn.socket.fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            (&size as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_SNDBUF");
}

#[test]
fn a_short_write_drops_whole_parts_and_advances_into_the_next() {
    let mut p = vec![
        Bytes::from_static(b"abc"),
        Bytes::from_static(b"defg"),
        Bytes::from_static(b"hi"),
    ];
    consume(&mut p, 5).expect("wrote some");
    assert_eq!(
        p,
        vec![Bytes::from_static(b"fg"), Bytes::from_static(b"hi")]
    );
    consume(&mut p, 2).expect("wrote some");
    assert_eq!(p, vec![Bytes::from_static(b"hi")]);
    consume(&mut p, 2).expect("wrote some");
    assert!(p.is_empty());
}

#[test]
fn a_write_that_reports_more_than_it_was_given_is_an_error() {
    let mut p = vec![Bytes::from_static(b"abc")];
    assert!(consume(&mut p, 4).is_err());
}

#[test]
fn empty_parts_are_skipped_and_all_empty_parts_write_nothing() {
    for backend in backends() {
        let got = block_on(backend, async move {
            let (client, server) = connected(backend).await;
            client
                .write_all_parts(vec![Bytes::new(), Bytes::new()])
                .await
                .expect("nothing to write is no error");
            let parts = vec![Bytes::new(), Bytes::from_static(b"ab"), Bytes::new()];
            client.write_all_parts(parts).await.expect("write");
            client.shutdown();
            read_all(&server, usize::MAX).await
        })
        .expect("runtime");
        assert_eq!(&got[..], b"ab", "{backend:?}");
    }
}

#[test]
fn a_write_that_took_nothing_is_an_error() {
    let mut p = vec![Bytes::from_static(b"abc")];
    let err = consume(&mut p, 0).expect_err("nothing written");
    assert_eq!(err.kind(), io::ErrorKind::WriteZero);
    assert_eq!(p.len(), 1);
}
