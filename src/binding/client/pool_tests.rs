//! Connecting to an `https://` upstream whose addresses do not all work, on both backends:
//! a failed or silent handshake on one address moves on to the next, one
//! `connect_timeout` bounds the connect and the handshake of an attempt together, the
//! address bound holds, and when every address fails the agent hears the most telling
//! reason.
//!
//! The pool is handed its address list directly ([`Pool::connect_any`], which
//! [`Pool::connect`] calls with what the name resolved to): a test machine's resolver may
//! give `localhost` one address or two, in either order, while these tests need two or
//! more distinct upstreams in a known order. The upstreams are loopback listeners served
//! by threads of their own (blocking rustls), so their side does not depend on the
//! backend under test.

use super::*;
use crate::certs::server_config;
use crate::config::Scheme;
use crate::runtime::block_on;
use crate::testing::Ca;
use rustls::ServerConfig;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

/// epoll always; io_uring where this machine allows it.
fn backends() -> Vec<Backend> {
    let mut out = vec![Backend::Epoll];
    if crate::runtime::io::uring_available().is_ok() {
        out.push(Backend::Uring);
    }
    out
}

/// What a test upstream does with each connection it accepts.
#[derive(Clone)]
enum Behaviour {
    /// A TLS server with this config (its certificate decides whether the client agrees).
    Tls(Arc<ServerConfig>),
    /// Answers the ClientHello with plain HTTP, as a server on the wrong port would.
    Garbage,
    /// Accepts and says nothing.
    Silent,
    /// A TLS server that sends these bytes after the handshake, then closes the TCP
    /// connection, with close_notify before it or not.
    TlsThenClose(Arc<ServerConfig>, &'static [u8], bool),
}

/// A loopback upstream on a thread of its own, serving one connection at a time until it
/// is dropped. It counts the connections it accepted and the handshakes it completed.
struct Peer {
    addr: SocketAddr,
    accepted: Arc<AtomicUsize>,
    handshaken: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How long a test upstream waits on one connection before giving it up: only a broken
/// test gets there, since the client closes every connection it is done with.
const PEER_READ_TIMEOUT: Duration = Duration::from_secs(10);

impl Peer {
    fn start(behaviour: Behaviour) -> Peer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Non-blocking accepts, so the thread notices `stop` and can be joined.
        listener.set_nonblocking(true).expect("non-blocking");
        let accepted = Arc::new(AtomicUsize::new(0));
        let handshaken = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (accepted, handshaken, stop) = (accepted.clone(), handshaken.clone(), stop.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((tcp, _)) => {
                            accepted.fetch_add(1, Ordering::Relaxed);
                            serve(tcp, &behaviour, &handshaken);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            }
        });
        Peer {
            addr,
            accepted,
            handshaken,
            stop,
            thread: Some(thread),
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Waits (a little) for the server side of a handshake the client finished: the
    /// server completes it when the client's last flight arrives, just after.
    async fn handshakes(&self) -> usize {
        for _ in 0..200 {
            if self.handshaken.load(Ordering::Relaxed) > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.handshaken.load(Ordering::Relaxed)
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serves one accepted connection as `behaviour` says, until the client closes it.
fn serve(mut tcp: TcpStream, behaviour: &Behaviour, handshaken: &AtomicUsize) {
    tcp.set_nonblocking(false).expect("blocking");
    tcp.set_read_timeout(Some(PEER_READ_TIMEOUT))
        .expect("read timeout");
    match behaviour {
        Behaviour::Tls(config) => {
            let mut tls = rustls::ServerConnection::new(config.clone()).expect("session");
            while tls.is_handshaking() {
                if tls.complete_io(&mut tcp).is_err() {
                    return;
                }
            }
            handshaken.fetch_add(1, Ordering::Relaxed);
        }
        Behaviour::Garbage => {
            let _ = tcp.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n");
        }
        Behaviour::Silent => {}
        Behaviour::TlsThenClose(config, bytes, close_notify) => {
            let mut tls = rustls::ServerConnection::new(config.clone()).expect("session");
            while tls.is_handshaking() {
                if tls.complete_io(&mut tcp).is_err() {
                    return;
                }
            }
            handshaken.fetch_add(1, Ordering::Relaxed);
            let _ = tls.writer().write_all(bytes);
            if *close_notify {
                tls.send_close_notify();
            }
            while tls.wants_write() {
                if tls.write_tls(&mut tcp).is_err() {
                    return;
                }
            }
            let _ = tcp.shutdown(std::net::Shutdown::Write);
        }
    }
    // Held until the client closes (or shuts it down at its deadline).
    let mut sink = [0u8; 4096];
    while matches!(tcp.read(&mut sink), Ok(n) if n > 0) {}
}

/// An address where nothing listens (bound, then closed again): connects are refused.
fn refusing() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// A CA (kept for its files), a good TLS upstream config for `localhost`, one whose
/// certificate is for another name, and the client's view: `https://localhost/mcp`
/// trusting the CA.
struct Certs {
    _ca: Ca,
    good: Arc<ServerConfig>,
    wrong_name: Arc<ServerConfig>,
    upstream: Upstream,
}

fn certs(tag: &str) -> Certs {
    let ca = Ca::new(tag);
    let (cert, key) = ca.leaf("localhost", &["localhost"], false);
    let good = server_config(&cert, &key).expect("server config");
    let (cert, key) = ca.leaf("elsewhere", &["elsewhere.example"], false);
    let wrong_name = server_config(&cert, &key).expect("server config");
    let upstream = Upstream::new("localhost", Some(&ca.pem)).expect("upstream");
    Certs {
        _ca: ca,
        good,
        wrong_name,
        upstream,
    }
}

/// A pool for `https://localhost/mcp` on `backend`.
fn pool(backend: Backend, certs: &Certs, connect_timeout: Duration) -> Pool {
    let url = UpstreamUrl {
        scheme: Scheme::Https,
        host: "localhost".to_owned(),
        port: 443,
        path_and_query: "/mcp".to_owned(),
        authority: "localhost".to_owned(),
    };
    let slots = Rc::new(Slots::new(backend == Backend::Uring, 0));
    Pool::new(
        Rc::new(url),
        backend,
        slots,
        connect_timeout,
        Some(certs.upstream.clone()),
    )
}

const TIMEOUT: Duration = Duration::from_secs(5);

#[test]
fn a_failed_handshake_on_the_first_address_moves_on_to_the_next() {
    let certs = certs("pool-next");
    for backend in backends() {
        for (case, first) in [
            ("garbage", Behaviour::Garbage),
            ("wrong name", Behaviour::Tls(certs.wrong_name.clone())),
        ] {
            let first = Peer::start(first);
            let good = Peer::start(Behaviour::Tls(certs.good.clone()));
            block_on(backend, async {
                let pool = pool(backend, &certs, TIMEOUT);
                let connects = client_metrics::with(|m| m.connects);
                let link = pool
                    .connect_any(&[first.addr, good.addr])
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}, {case}: {}", e.describe()));
                assert_eq!(first.accepted(), 1, "{backend:?}, {case}: tried first");
                assert_eq!(
                    good.handshakes().await,
                    1,
                    "{backend:?}, {case}: then the next"
                );
                assert_eq!(
                    client_metrics::with(|m| m.connects),
                    connects + 1,
                    "{backend:?}, {case}"
                );
                drop(link);
            })
            .expect("runtime");
        }
    }
}

#[test]
fn an_address_that_accepts_and_says_nothing_costs_one_connect_timeout() {
    let certs = certs("pool-silent");
    let timeout = Duration::from_secs(1);
    for backend in backends() {
        let silent = Peer::start(Behaviour::Silent);
        let good = Peer::start(Behaviour::Tls(certs.good.clone()));
        block_on(backend, async {
            let pool = pool(backend, &certs, timeout);
            let started = Instant::now();
            let link = pool
                .connect_any(&[silent.addr, good.addr])
                .await
                .unwrap_or_else(|e| panic!("{backend:?}: {}", e.describe()));
            let took = started.elapsed();
            assert_eq!(
                silent.accepted(),
                1,
                "{backend:?}: the silent one was tried"
            );
            assert_eq!(good.handshakes().await, 1, "{backend:?}: then the next");
            // It waited the silent address out (about 1 s), and only once: connect and
            // handshake share one `connect_timeout`, so the next address is reached
            // well before 2 s.
            assert!(took >= Duration::from_millis(900), "{backend:?}: {took:?}");
            assert!(took < Duration::from_millis(1800), "{backend:?}: {took:?}");
            drop(link);
        })
        .expect("runtime");
    }
}

#[test]
fn a_handshake_gets_only_what_the_connect_left_of_the_timeout() {
    let certs = certs("pool-left");
    let timeout = Duration::from_secs(1);
    for backend in backends() {
        let silent = Peer::start(Behaviour::Silent);
        block_on(backend, async {
            let pool = pool(backend, &certs, timeout);
            // An attempt begun 700 ms ago, as if its connect had taken that long: the
            // handshake has the 300 ms left, not a full timeout of its own.
            let since = Instant::now()
                .checked_sub(Duration::from_millis(700))
                .expect("the clock has run 700 ms");
            let started = Instant::now();
            let Err((telling, error)) = pool.attempt(silent.addr, since).await else {
                panic!("{backend:?}: a silent upstream completed a handshake")
            };
            let took = started.elapsed();
            assert_eq!(telling, Telling::Handshake, "{backend:?}");
            assert_eq!(
                error.describe(),
                "Upstream TLS handshake failed: timed out after 1000 ms",
                "{backend:?}"
            );
            assert!(took < Duration::from_millis(800), "{backend:?}: {took:?}");
        })
        .expect("runtime");
    }
}

#[test]
fn when_every_address_fails_the_agent_hears_the_handshake_failure() {
    let certs = certs("pool-fail");
    for backend in backends() {
        let wrong_name = Peer::start(Behaviour::Tls(certs.wrong_name.clone()));
        let garbage = Peer::start(Behaviour::Garbage);
        let refused = refusing();
        block_on(backend, async {
            let pool = pool(backend, &certs, TIMEOUT);
            let failures = client_metrics::with(|m| m.connect_failures);
            // The refused certificate, on the first address, outweighs the protocol error
            // and the refused connect that came after it; every address was tried.
            let error = pool
                .connect_any(&[wrong_name.addr, garbage.addr, refused])
                .await
                .err()
                .unwrap_or_else(|| panic!("{backend:?}: no address can work"));
            let told = error.describe();
            assert!(
                told.starts_with("Upstream TLS handshake failed: ")
                    && told.contains("not valid for name"),
                "{backend:?}: {told}"
            );
            assert_eq!(garbage.accepted(), 1, "{backend:?}: the second was tried");
            assert_eq!(
                client_metrics::with(|m| m.connect_failures),
                failures + 1,
                "{backend:?}: one failed connect, however many addresses"
            );
            // A handshake that failed outweighs a refused connect that came after it.
            let error = pool
                .connect_any(&[garbage.addr, refused])
                .await
                .err()
                .unwrap_or_else(|| panic!("{backend:?}: no address can work"));
            let told = error.describe();
            assert!(
                told.starts_with("Upstream TLS handshake failed: "),
                "{backend:?}: {told}"
            );
        })
        .expect("runtime");
    }
}

#[test]
fn no_more_addresses_are_tried_than_the_bound() {
    let certs = certs("pool-bound");
    for backend in backends() {
        let garbage = Peer::start(Behaviour::Garbage);
        let good = Peer::start(Behaviour::Tls(certs.good.clone()));
        block_on(backend, async {
            let pool = pool(backend, &certs, TIMEOUT);
            let mut addrs = vec![garbage.addr; UPSTREAM_ADDRS_MAX];
            addrs.push(good.addr);
            let error = pool.connect_any(&addrs).await.err();
            assert!(
                error.is_some(),
                "{backend:?}: the good one is past the bound"
            );
            assert_eq!(garbage.accepted(), UPSTREAM_ADDRS_MAX, "{backend:?}");
            assert_eq!(good.accepted(), 0, "{backend:?}");
        })
        .expect("runtime");
    }
}

#[test]
fn the_sweep_closes_only_connections_idle_past_the_timeout() {
    let certs = certs("pool-idle");
    for backend in backends() {
        // Two upstreams: each serves one connection at a time.
        let peers = [
            Peer::start(Behaviour::Tls(certs.good.clone())),
            Peer::start(Behaviour::Tls(certs.good.clone())),
        ];
        block_on(backend, async {
            let pool = pool(backend, &certs, Duration::from_secs(2));
            for peer in &peers {
                let link = pool
                    .connect_any(&[peer.addr])
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: {}", e.describe()));
                let lease = pool.lease(link);
                pool.give_back(lease);
            }
            assert_eq!(pool.idle_count(), 2, "{backend:?}");
            pool.close_expired();
            assert_eq!(pool.idle_count(), 2, "{backend:?}: none expired yet");
            // The older one has been idle for the whole timeout: the sweep closes it.
            pool.age_oldest_idle(UPSTREAM_POOL_IDLE_TIMEOUT);
            pool.close_expired();
            assert_eq!(pool.idle_count(), 1, "{backend:?}");
        })
        .expect("runtime");
    }
}

#[test]
fn a_body_until_the_close_is_whole_only_with_close_notify() {
    // A response without a length or chunks runs until the connection closes. Over TLS
    // only close_notify says it ended; a bare TCP close is a cut (anyone on the path can
    // send one), and the response is broken, not complete.
    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"a\":1}";
    let certs = certs("pool-cut");
    for backend in backends() {
        for close_notify in [true, false] {
            let peer = Peer::start(Behaviour::TlsThenClose(
                certs.good.clone(),
                ANSWER,
                close_notify,
            ));
            block_on(backend, async {
                let pool = pool(backend, &certs, TIMEOUT);
                let link = pool
                    .connect_any(&[peer.addr])
                    .await
                    .unwrap_or_else(|e| panic!("{backend:?}: {}", e.describe()));
                let mut response =
                    crate::binding::client::exchange::Response::new(pool.lease(link));
                let mut body = Vec::new();
                let ended = loop {
                    match response.next().await {
                        Ok(crate::http::ResponseEvent::Data(d)) => body.extend_from_slice(&d),
                        Ok(crate::http::ResponseEvent::End) => break Ok(()),
                        Ok(_) => {}
                        Err(e) => break Err(e),
                    }
                };
                assert_eq!(
                    body, b"{\"a\":1}",
                    "{backend:?}, close_notify {close_notify}"
                );
                match close_notify {
                    true => assert_eq!(ended, Ok(()), "{backend:?}"),
                    false => assert_eq!(
                        ended,
                        Err(crate::binding::client::exchange::Broken::Closed),
                        "{backend:?}"
                    ),
                }
            })
            .expect("runtime");
        }
    }
}
