//! The TLS adapter over real loopback sockets, on both backends: handshakes, bytes both
//! ways across several write batches, close_notify, resumption, the idle check of a pooled
//! connection, refused certificates (wrong name, expired, unknown CA) and hostile input on
//! the server side (garbage, a truncated ClientHello left hanging, a peer that closes); and
//! the sans-IO layer alone, in memory (records split anywhere, mutated ClientHellos).

use super::*;
use crate::certs::{Upstream, client_config, server_config};
use crate::limits::TLS_HANDSHAKE_READ_BYTES;
use crate::metrics::TlsFailure;
use crate::runtime::io::Listener;
use crate::runtime::{Backend, Conn, ReadBuf, block_on};
use crate::testing::Ca;

/// epoll always; io_uring where this machine allows it.
fn backends() -> Vec<Backend> {
    let mut out = vec![Backend::Epoll];
    if crate::runtime::io::uring_available().is_ok() {
        out.push(Backend::Uring);
    }
    out
}

/// A CA (kept for its files), a server config for `localhost` it signed, and an upstream
/// config trusting it.
fn localhost(tag: &str) -> (Ca, Arc<ServerConfig>, Upstream) {
    let ca = Ca::new(tag);
    let (cert, key) = ca.leaf("localhost", &["localhost"], false);
    let server = server_config(&cert, &key).expect("server config");
    let upstream = Upstream::new("localhost", Some(&ca.pem)).expect("upstream");
    (ca, server, upstream)
}

/// A listener on this worker and its address.
fn listen(backend: Backend) -> (Listener, std::net::SocketAddr) {
    let std = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = std.local_addr().expect("addr");
    (Listener::adopt(std, backend).expect("adopt"), addr)
}

/// Reads until `out` holds `want` bytes or the connection ends.
async fn read_plain(conn: &Conn, out: &mut BytesMut, want: usize) {
    while out.len() < want {
        let (r, buf) = conn
            .read(ReadBuf::Heap(Vec::with_capacity(TLS_HANDSHAKE_READ_BYTES)))
            .await;
        let n = r.expect("read");
        if n == 0 {
            return;
        }
        conn.received(buf.get(..n).unwrap_or_default(), out)
            .expect("decrypt");
        if conn.tls_closed() {
            return;
        }
    }
}

/// Connects a client with `upstream` to a server with `server`, handshaking both at once.
async fn pair(
    backend: Backend,
    server: &Arc<ServerConfig>,
    upstream: &Upstream,
    timeout: Duration,
) -> (
    Conn,
    Result<Handshake, HandshakeError>,
    Conn,
    Result<Handshake, HandshakeError>,
) {
    let (listener, addr) = listen(backend);
    let client = Conn::connect(addr, backend).await.expect("connect");
    let (accepted, _) = listener.accept().await.expect("accept");
    let client = client.with_tls(upstream.session().expect("client session"));
    let accepted = accepted.with_tls(server_session(server).expect("server session"));
    let (c, s) = tokio::join!(client.handshake(timeout), accepted.handshake(timeout));
    (client, c, accepted, s)
}

const SECOND: Duration = Duration::from_secs(5);

#[test]
fn bytes_cross_both_ways_and_close_notify_ends_the_stream() {
    let (_ca, server, upstream) = localhost("bytes");
    for backend in backends() {
        block_on(backend, async {
            let (client, c, accepted, s) = pair(backend, &server, &upstream, SECOND).await;
            assert!(c.is_ok() && s.is_ok(), "{backend:?}: {c:?} {s:?}");
            client
                .write_all(Bytes::from_static(b"POST /mcp HTTP/1.1\r\n\r\n"))
                .await
                .expect("client write");
            let mut got = BytesMut::new();
            // Either the early plaintext of the handshake's last flight, or a read.
            accepted.take_early(&mut got);
            read_plain(&accepted, &mut got, 22).await;
            assert_eq!(&got[..], b"POST /mcp HTTP/1.1\r\n\r\n", "{backend:?}");
            // Several write batches and records: 200 KiB of a known pattern.
            let big: Vec<u8> = (0..200 * 1024).map(|i| (i % 251) as u8).collect();
            accepted
                .write_all(Bytes::from(big.clone()))
                .await
                .expect("server write");
            let mut back = BytesMut::new();
            read_plain(&client, &mut back, big.len()).await;
            assert!(back[..] == big[..], "{backend:?}: 200 KiB came back intact");
            // The idle client took the session tickets in with the data: still usable.
            assert!(
                !client.unusable(Duration::ZERO),
                "{backend:?}: idle and sound"
            );
            // The server closes: close_notify, then the socket.
            accepted.shutdown();
            let mut rest = BytesMut::new();
            read_plain(&client, &mut rest, 1).await;
            assert!(rest.is_empty(), "{backend:?}");
            assert!(client.tls_closed(), "{backend:?}: close_notify seen");
            client.shutdown();
        })
        .expect("runtime");
    }
}

/// Parts that fit one sealing batch together are joined; larger ones (here 64 KiB of
/// stored bytes behind a head) are sealed part by part. Either way the peer reads them in
/// order.
#[test]
fn parts_written_over_tls_arrive_joined_in_order() {
    let (_ca, server, upstream) = localhost("parts");
    for stored_len in [1024, 64 * 1024, 300 * 1024] {
        let head = Bytes::from(format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n",
            stored_len + 4
        ));
        let stored: Bytes = (0..stored_len)
            .map(|i| (i % 253) as u8)
            .collect::<Vec<u8>>()
            .into();
        let tail = Bytes::from_static(b"]}}\n");
        let mut want = Vec::new();
        for p in [&head, &stored, &tail] {
            want.extend_from_slice(p);
        }
        for backend in backends() {
            let parts = vec![head.clone(), stored.clone(), Bytes::new(), tail.clone()];
            block_on(backend, async {
                let (client, c, accepted, s) = pair(backend, &server, &upstream, SECOND).await;
                assert!(c.is_ok() && s.is_ok(), "{backend:?}: {c:?} {s:?}");
                let write = async { accepted.write_all_parts(parts).await.expect("write") };
                let mut got = BytesMut::new();
                tokio::join!(write, read_plain(&client, &mut got, want.len()));
                assert!(
                    got[..] == want[..],
                    "{backend:?}, {stored_len} bytes: the parts, in order"
                );
                accepted.shutdown();
                client.shutdown();
            })
            .expect("runtime");
        }
    }
}

/// A write cut halfway (its guard dropped without `done`, as when a reply's deadline
/// drops the write) leaves the connection marked: no close_notify may follow a record cut
/// short, and no later write starts. A write that ended clears the mark.
#[test]
fn a_write_cut_halfway_sends_no_close_notify_after_it() {
    let (_ca, server, upstream) = localhost("cut");
    let backend = backends().remove(0);
    block_on(backend, async {
        let (client, c, accepted, s) = pair(backend, &server, &upstream, SECOND).await;
        assert!(c.is_ok() && s.is_ok(), "{backend:?}");
        let tls = accepted.tls.as_ref().expect("a TLS connection");
        tls.start_write().expect("no write yet").done();
        assert!(tls.start_write().is_ok_and(|w| {
            w.done();
            true
        }));
        {
            // Goes out of scope without `done`: cut halfway.
            let _cut = tls.start_write().expect("the last write ended");
        }
        assert!(tls.start_write().is_err(), "the cut write keeps its mark");
        assert!(tls.close_notify().is_none(), "no alert after a cut record");
        accepted.shutdown();
        client.shutdown();
    })
    .expect("runtime");
}

#[test]
fn an_idle_connection_whose_peer_said_close_notify_is_unusable() {
    let (_ca, server, upstream) = localhost("idle");
    for backend in backends() {
        block_on(backend, async {
            let (client, c, accepted, s) = pair(backend, &server, &upstream, SECOND).await;
            assert!(c.is_ok() && s.is_ok(), "{backend:?}");
            // Tickets arrive on the idle client: taken in, still usable.
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(
                !client.unusable(Duration::ZERO),
                "{backend:?}: tickets alone"
            );
            accepted.shutdown();
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(
                client.unusable(Duration::ZERO),
                "{backend:?}: the peer closed"
            );
            client.shutdown();
        })
        .expect("runtime");
    }
}

#[test]
fn a_second_connection_resumes_the_session() {
    let ca = Ca::new("resume");
    let (cert, key) = ca.leaf("localhost", &["localhost", "127.0.0.1"], false);
    let server = server_config(&cert, &key).expect("server config");
    for backend in backends() {
        // A config of its own per backend: its session cache starts empty.
        let upstream = Upstream::new("127.0.0.1", Some(&ca.pem)).expect("upstream");
        block_on(backend, async {
            let (client, c, accepted, _) = pair(backend, &server, &upstream, SECOND).await;
            assert!(
                !c.expect("first").resumed,
                "{backend:?}: a full handshake first"
            );
            // The client stores the server's tickets when it reads them.
            accepted
                .write_all(Bytes::from_static(b"x"))
                .await
                .expect("write");
            read_plain(&client, &mut BytesMut::new(), 1).await;
            client.shutdown();
            accepted.shutdown();
            let (client, c, accepted, s) = pair(backend, &server, &upstream, SECOND).await;
            assert!(c.expect("second").resumed, "{backend:?}: client resumed");
            assert!(s.expect("second").resumed, "{backend:?}: server resumed");
            client.shutdown();
            accepted.shutdown();
        })
        .expect("runtime");
    }
}

#[test]
fn certificates_that_must_not_be_trusted_are_refused_with_their_reason() {
    let ca = Ca::new("refuse");
    let other = Ca::new("other");
    let (good_cert, good_key) = ca.leaf("good", &["localhost"], false);
    let (wrong_cert, wrong_key) = ca.leaf("wrong", &["elsewhere.example"], false);
    let (old_cert, old_key) = ca.leaf("old", &["localhost"], true);
    let cases = [
        (
            &wrong_cert,
            &wrong_key,
            &ca.pem,
            TlsFailure::CertificateName,
        ),
        (&old_cert, &old_key, &ca.pem, TlsFailure::CertificateExpired),
        (
            &good_cert,
            &good_key,
            &other.pem,
            TlsFailure::CertificateUnknownIssuer,
        ),
    ];
    for backend in backends() {
        for (cert, key, trust, want) in &cases {
            let server = server_config(cert, key).expect("server config");
            let upstream = Upstream::new("localhost", Some(trust)).expect("upstream");
            block_on(backend, async {
                let (client, c, accepted, s) = pair(backend, &server, &upstream, SECOND).await;
                let e = c.expect_err("the client refuses");
                assert_eq!(e.failure(), *want, "{backend:?}: {e}");
                // The server hears why (the client's alert), not a timeout.
                let e = s.expect_err("the server fails too");
                assert_eq!(e.failure(), TlsFailure::AlertReceived, "{backend:?}: {e}");
                client.shutdown();
                accepted.shutdown();
            })
            .expect("runtime");
        }
    }
}

#[test]
fn hostile_input_fails_the_handshake_alone() {
    let ca = Ca::new("hostile");
    let (cert, key) = ca.leaf("localhost", &["localhost"], false);
    let server = server_config(&cert, &key).expect("server config");
    // A ClientHello record header promising 512 bytes, and 5 of them.
    let truncated: &[u8] = &[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03];
    let cases: [(&[u8], bool, TlsFailure); 3] = [
        (
            b"GET /mcp HTTP/1.1\r\nHost: x\r\n\r\n",
            false,
            TlsFailure::Protocol,
        ),
        (truncated, false, TlsFailure::Timeout),
        (truncated, true, TlsFailure::Closed),
    ];
    for backend in backends() {
        for (bytes, close, want) in &cases {
            block_on(backend, async {
                let (listener, addr) = listen(backend);
                let mut peer = std::net::TcpStream::connect(addr).expect("connect");
                let (accepted, _) = listener.accept().await.expect("accept");
                peer.write_all(bytes).expect("send");
                if *close {
                    peer.shutdown(std::net::Shutdown::Both).expect("close");
                }
                let accepted = accepted.with_tls(server_session(&server).expect("session"));
                let e = accepted
                    .handshake(Duration::from_millis(200))
                    .await
                    .expect_err("no handshake");
                assert_eq!(e.failure(), *want, "{backend:?}: {e}");
                accepted.shutdown();
            })
            .expect("runtime");
        }
    }
}

#[test]
fn a_handshake_dropped_mid_way_shuts_its_connection_down() {
    // A caller may drop a handshake before it ends (an agent cancelled the request that
    // waited for the upstream connection). The socket is shut down then, so no read stays
    // pending on it: the peer, which never answered the ClientHello, sees the close.
    let (_ca, _server, upstream) = localhost("dropped");
    for backend in backends() {
        let std = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = std.local_addr().expect("addr");
        block_on(backend, async {
            let client = Conn::connect(addr, backend).await.expect("connect");
            let client = client.with_tls(upstream.session().expect("client session"));
            let cut = tokio::time::timeout(Duration::from_millis(100), client.handshake(SECOND));
            assert!(cut.await.is_err(), "{backend:?}: no server, no handshake");
            let (mut peer, _) = std.accept().expect("accept");
            peer.set_read_timeout(Some(SECOND)).expect("read timeout");
            let mut hello = Vec::new();
            let read = std::io::Read::read_to_end(&mut peer, &mut hello);
            assert!(
                read.is_ok(),
                "{backend:?}: the connection stays open after its handshake was dropped: {read:?}"
            );
            assert_eq!(
                hello.first(),
                Some(&0x16),
                "{backend:?}: a ClientHello came first"
            );
            drop(client);
        })
        .expect("runtime");
    }
}

#[test]
fn config_errors_name_the_file() {
    let ca = Ca::new("files");
    let (cert, key) = ca.leaf("localhost", &["localhost"], false);
    let missing = ca.dir.join("missing.pem");
    let e = server_config(&missing, &key).expect_err("missing cert");
    assert!(e.contains("missing.pem: cannot read"), "{e}");
    let e = server_config(&cert, &cert).expect_err("a cert is not a key");
    assert!(
        e.contains("localhost.pem: expected a PEM private key"),
        "{e}"
    );
    let (_, other_key) = ca.leaf("other", &["localhost"], false);
    let e = server_config(&cert, &other_key).expect_err("key of another cert");
    assert!(e.contains("does not go with the certificate"), "{e}");
    let e = server_config(&key, &key).expect_err("a key is not a cert");
    assert!(e.contains("no certificate in it"), "{e}");
    let e = client_config(Some(&missing)).expect_err("missing ca");
    assert!(e.contains("missing.pem: cannot read"), "{e}");
}

/// A server-side [`Tls`] with nothing read yet.
fn server_tls(config: &Arc<ServerConfig>) -> Tls {
    Tls::new(server_session(config).expect("session"))
}

/// A small seeded generator (xorshift64*): the same cases on every run.
struct Seeded(u64);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Runs a whole handshake in memory between a rustls client and the server side of the
/// adapter; returns the client, ready to send application data.
fn handshake_in_memory(server: &Tls, upstream: &Upstream) -> rustls::ClientConnection {
    let Ok(Connection::Client(mut client)) = upstream.session() else {
        unreachable!("a client session")
    };
    for _ in 0..16 {
        let mut flight = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut flight).expect("client flight");
        }
        if !flight.is_empty() {
            server
                .feed(&flight, &mut server.early.borrow_mut())
                .expect("server reads the client's flight");
        }
        let back = server.sealed_output().expect("server flight");
        let mut back = &back[..];
        while !back.is_empty() {
            client.read_tls(&mut back).expect("client reads");
            client.process_new_packets().expect("client accepts");
        }
        if !client.is_handshaking() && !server.session.borrow().is_handshaking() {
            return client;
        }
    }
    unreachable!("the handshake did not finish in 16 flights")
}

#[test]
fn the_read_path_yields_the_same_plaintext_however_the_records_are_split() {
    let (_ca, config, upstream) = localhost("splits");
    // Three records' worth: splits land inside headers, payloads and tags.
    let message: Vec<u8> = (0..40_000).map(|i| (i % 253) as u8).collect();
    let mut rng = Seeded(0x7e57_5eed);
    for case in 0..200 {
        let server = server_tls(&config);
        let mut client = handshake_in_memory(&server, &upstream);
        client.writer().write_all(&message).expect("seal");
        let mut wire = Vec::new();
        while client.wants_write() {
            client.write_tls(&mut wire).expect("records");
        }
        // Case 0..64: one cut at every byte of the first record's header and start; then
        // random cuts into up to 8 pieces.
        let mut cuts: Vec<usize> = if case < 64 {
            vec![case + 1]
        } else {
            (0..1 + rng.below(8))
                .map(|_| 1 + rng.below(wire.len() - 1))
                .collect()
        };
        cuts.sort_unstable();
        cuts.dedup();
        let mut out = BytesMut::new();
        server.take_early(&mut out);
        let mut from = 0;
        for cut in cuts.into_iter().chain([wire.len()]) {
            server
                .decrypt(wire.get(from..cut).unwrap_or_default(), &mut out)
                .expect("a valid record stream decrypts at any split");
            from = cut;
        }
        assert!(out[..] == message[..], "case {case}: plaintext differs");
        assert!(!server.peer_closed());
    }
}

#[test]
fn mutated_client_hellos_fail_cleanly_and_yield_nothing() {
    let (_ca, config, upstream) = localhost("mutate");
    let Ok(Connection::Client(mut client)) = upstream.session() else {
        unreachable!("a client session")
    };
    let mut hello = Vec::new();
    client.write_tls(&mut hello).expect("hello");
    let mut rng = Seeded(0xc11e_47e1);
    let (mut refused, mut waiting) = (0, 0);
    for _ in 0..3000 {
        let mut input = hello.clone();
        for _ in 0..1 + rng.below(6) {
            match rng.below(4) {
                0 => {
                    let i = rng.below(input.len());
                    if let Some(b) = input.get_mut(i) {
                        *b ^= 1 << rng.below(8);
                    }
                }
                1 => input.truncate(rng.below(input.len() + 1)),
                2 => {
                    let i = rng.below(input.len());
                    if let Some(b) = input.get_mut(i) {
                        *b = rng.next() as u8;
                    }
                }
                _ => input.extend((0..rng.below(64)).map(|_| rng.next() as u8)),
            }
        }
        let server = server_tls(&config);
        let mut early = BytesMut::new();
        let mut result = Ok(());
        let mut from = 0;
        while from < input.len() && result.is_ok() {
            let to = (from + 1 + rng.below(300)).min(input.len());
            result = server.feed(input.get(from..to).unwrap_or_default(), &mut early);
            from = to;
        }
        assert!(early.is_empty(), "no plaintext before a handshake");
        // What the server would send back (a flight or an alert) stays small.
        let reply = server.sealed_output().expect("output");
        assert!(reply.len() < 16 * 1024, "reply of {} bytes", reply.len());
        if result.is_err() {
            refused += 1;
        } else {
            waiting += 1;
        }
    }
    assert!(
        refused > 1000,
        "most mutations are refused ({refused} of 3000)"
    );
    assert!(waiting > 0, "some only cut the hello short ({waiting})");
}
