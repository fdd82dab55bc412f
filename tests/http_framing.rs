//! HTTP/1.1 on the agent-facing endpoint: routing (404/405), Host and Origin admission,
//! pipelining, keep-alive, `Connection: close`, chunked request bodies, and the limits on
//! malformed or oversized input. After every refusal the gateway must still serve.

mod support;

use std::time::{Duration, Instant};
use support::{Gateway, MODES, each_mode, initialize_body, request};

const PING: &str = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;

#[test]
fn other_methods_get_405_with_allow() {
    each_mode(|gw| {
        for method in ["PUT", "PATCH", "OPTIONS"] {
            let r = gw.raw(&request(&gw.host(), method, "/mcp", &[], b""));
            assert_eq!(r.status, 405, "{method}");
            assert_eq!(r.header("allow"), Some("GET, POST, DELETE"), "{method}");
        }
        gw.assert_serving();
    });
}

#[test]
fn other_paths_get_404() {
    each_mode(|gw| {
        let body = initialize_body(1, "2025-11-25");
        let headers = [
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ];
        for path in ["/", "/mcp/", "/mcpx", "/other"] {
            let r = gw.raw(&request(
                &gw.host(),
                "POST",
                path,
                &headers,
                body.as_bytes(),
            ));
            assert_eq!(r.status, 404, "{path}");
        }
    });
}

#[test]
fn foreign_origin_gets_403_and_localhost_origin_is_allowed() {
    each_mode(|gw| {
        let body = initialize_body(1, "2025-11-25");
        let r = gw.raw(&gw.post_bytes(None, &[("origin", "http://evil.example")], &body));
        assert_eq!(r.status, 403);
        let r = gw.raw(&gw.post_bytes(None, &[("origin", "http://localhost:1234")], &body));
        assert_eq!(r.status, 200);
        assert!(r.header("mcp-session-id").is_some());
    });
}

#[test]
fn foreign_host_gets_421() {
    each_mode(|gw| {
        let headers = [
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ];
        let r = gw.raw(&request(
            "evil.example",
            "POST",
            "/mcp",
            &headers,
            initialize_body(1, "2025-11-25").as_bytes(),
        ));
        assert_eq!(r.status, 421);
        let r = gw.raw(&request(
            "localhost:9",
            "POST",
            "/mcp",
            &headers,
            initialize_body(1, "2025-11-25").as_bytes(),
        ));
        assert_eq!(r.status, 200);
    });
}

#[test]
fn an_absolute_form_target_is_served_and_its_authority_is_the_host_checked() {
    each_mode(|gw| {
        let headers = [
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ];
        let body = initialize_body(1, "2025-11-25");
        // RFC 9112 §3.2.2: the path is the target's, and its authority comes before Host.
        let target = format!("http://{}/mcp", gw.host());
        let r = gw.raw(&request(
            "evil.example",
            "POST",
            &target,
            &headers,
            body.as_bytes(),
        ));
        assert_eq!(r.status, 200);
        assert!(r.header("mcp-session-id").is_some());
        let r = gw.raw(&request(
            &gw.host(),
            "POST",
            "HTTP://evil.example/mcp",
            &headers,
            body.as_bytes(),
        ));
        assert_eq!(r.status, 421);
        let other = format!("https://{}/other?mcp", gw.host());
        let r = gw.raw(&request(
            &gw.host(),
            "POST",
            &other,
            &headers,
            body.as_bytes(),
        ));
        assert_eq!(r.status, 404);
        gw.assert_serving();
    });
}

#[test]
fn pipelined_posts_are_answered_in_order() {
    each_mode(|gw| {
        let session = gw.initialize();
        let mut bytes = gw.post_bytes(
            Some(&session),
            &[],
            r#"{"jsonrpc":"2.0","id":"first","method":"ping"}"#,
        );
        bytes.extend(gw.post_bytes(
            Some(&session),
            &[],
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
        ));
        bytes.extend(gw.post_bytes(
            Some(&session),
            &[],
            r#"{"jsonrpc":"2.0","id":"third","method":"ping"}"#,
        ));
        let mut c = gw.conn();
        c.send(&bytes);
        let first = c.read_response();
        assert_eq!(
            first.text(),
            r#"{"jsonrpc":"2.0","id":"first","result":{}}"#
        );
        let second = c.read_response();
        assert_eq!(second.json()["id"], 2);
        assert!(second.json()["result"]["tools"].is_array());
        let third = c.read_response();
        assert_eq!(
            third.text(),
            r#"{"jsonrpc":"2.0","id":"third","result":{}}"#
        );
    });
}

/// The `mcpyard_connections` gauge in scraped `text`.
fn connections(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("mcpyard_connections "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(u64::MAX)
}

#[test]
fn a_deep_pipeline_behind_a_close_ends_with_its_connection() {
    // Many small requests in one write, the first asking to close: the answer to the
    // first ends the connection, and nothing of it is left on the gateway (the reader,
    // waiting for room in a full queue the dispatcher would never empty again, used to
    // keep the connection's place for good).
    each_mode(|gw| {
        let session = gw.initialize();
        let mut bytes = gw.post_bytes(Some(&session), &[("connection", "close")], PING);
        let get = format!("GET /other HTTP/1.1\r\nhost: {}\r\n\r\n", gw.host());
        for _ in 0..200 {
            bytes.extend_from_slice(get.as_bytes());
        }
        let mut c = gw.conn();
        c.send(&bytes);
        let r = c.read_response();
        assert_eq!(r.status, 200);
        assert!(c.closed(), "connection stays open after Connection: close");
        drop(c);
        support::scrape_until(gw, "no agent connection left", |t| connections(t) == 0);
        gw.assert_serving();
    });
}

#[test]
fn a_deep_pipeline_is_read_no_faster_than_it_is_answered() {
    // 2,000 pipelined requests in one write are all answered, in order, though the
    // gateway queues at most a few at a time.
    each_mode(|gw| {
        let get = format!("GET /other HTTP/1.1\r\nhost: {}\r\n\r\n", gw.host());
        let mut c = gw.conn();
        c.send(get.repeat(2000).as_bytes());
        for n in 0..2000 {
            let r = c.read_response();
            assert_eq!(r.status, 404, "answer {n}");
        }
        gw.assert_serving();
    });
}

#[test]
fn head_gets_a_head_without_a_body_and_the_connection_serves_on() {
    // A response to HEAD has no body (RFC 9110 §9.3.2), its length field notwithstanding:
    // a body after it would be read as the next response's head by a correct client.
    each_mode(|gw| {
        let mut bytes = request(&gw.host(), "HEAD", "/mcp", &[], b"");
        bytes.extend(gw.post_bytes(None, &[], &initialize_body(7, "2025-11-25")));
        let mut c = gw.conn();
        c.send(&bytes);
        let head = c.read_head();
        assert_eq!(head.status, 405);
        assert_eq!(head.header("allow"), Some("GET, POST, DELETE"));
        assert!(
            head.header("content-length")
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|n| n > 0),
            "the length the body would have had: {head:?}"
        );
        let next = c.read_response();
        assert_eq!(next.status, 200, "{}", next.text());
        assert_eq!(next.json()["id"], 7);
        gw.assert_serving();
    });
}

/// A request in HTTP/1.0, with `headers` and `body` (a length when there is a body).
fn http10(gw: &Gateway, method: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} /mcp HTTP/1.0\r\nhost: {}\r\n", gw.host());
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        out.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

#[test]
fn an_http10_agent_gets_no_chunked_coding_and_its_connection_closes() {
    // HTTP/1.0 knows no chunked coding (RFC 9112 §6.1): a streamed body runs until the
    // connection closes, and a whole one has its length; either way the connection goes
    // after the response, `connection: keep-alive` or not.
    each_mode(|gw| {
        let init = initialize_body(1, "2025-11-25");
        let mut c = gw.conn();
        c.send(&http10(
            gw,
            "POST",
            &[
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
                ("connection", "keep-alive"),
            ],
            init.as_bytes(),
        ));
        let r = c.read_response();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("connection"), Some("close"));
        assert_eq!(r.header("transfer-encoding"), None);
        assert_eq!(r.json()["id"], 1);
        assert!(
            c.closed(),
            "the connection stays open after an HTTP/1.0 answer"
        );
        let session = r.header("mcp-session-id").expect("session id").to_owned();
        let mut c = gw.conn();
        c.send(&http10(
            gw,
            "GET",
            &[
                ("accept", "text/event-stream"),
                ("mcp-session-id", &session),
                ("mcp-protocol-version", "2025-11-25"),
            ],
            b"",
        ));
        let head = c.read_head();
        assert_eq!(head.status, 200);
        assert_eq!(head.header("transfer-encoding"), None, "{head:?}");
        assert_eq!(head.header("content-length"), None, "{head:?}");
        assert_eq!(head.header("connection"), Some("close"));
        let ended = gw.raw(&request(
            &gw.host(),
            "DELETE",
            "/mcp",
            &[("mcp-session-id", &session)],
            b"",
        ));
        assert_eq!(ended.status, 200);
        // The stream ends with the session, and its body with the connection.
        let body = String::from_utf8(c.read_body(&head)).expect("UTF-8");
        assert!(
            !body.contains("\r\n") && body.ends_with("\n\n"),
            "SSE without chunk framing: {body:?}"
        );
        gw.assert_serving();
    });
}

#[test]
fn pipelined_bodies_behind_a_long_response_are_read_only_up_to_a_bound() {
    // Behind an event stream (a response that lasts), pipelined requests wait; the
    // gateway reads them only up to a byte bound (one message's worth), not 16 large
    // bodies, so what it holds for such a connection stays small. The rest waits in the
    // kernel's buffers, and the agent's writes stall.
    each_mode(|gw| {
        let session = gw.initialize();
        let mut c = gw.conn();
        c.send(&gw.get_bytes(&session, &[("mcp-protocol-version", "2025-11-25")]));
        let head = c.read_head();
        assert_eq!(head.status, 200);
        const BODY: usize = 3 * 1024 * 1024;
        let body = format!(
            r#"{{"jsonrpc":"2.0","method":"ping","id":1,"pad":"{}"}}"#,
            "x".repeat(BODY)
        );
        let one = gw.post_bytes(Some(&session), &[], &body);
        c.stream
            .set_write_timeout(Some(Duration::from_secs(1)))
            .expect("write timeout");
        let mut written = 0usize;
        'send: for _ in 0..16 {
            let mut rest = &one[..];
            while !rest.is_empty() {
                match std::io::Write::write(&mut c.stream, rest) {
                    Ok(0) | Err(_) => break 'send,
                    Ok(n) => {
                        written += n;
                        rest = &rest[n..];
                    }
                }
            }
        }
        // 48 MiB sent if every body were read; the bound and the kernel's buffers on
        // loopback (a few MiB each way) take far less.
        assert!(
            written < 28 * 1024 * 1024,
            "{} MiB of pipelined bodies taken behind an event stream",
            written / (1024 * 1024)
        );
        drop(c);
        gw.assert_serving();
    });
}

#[test]
fn keep_alive_connection_is_reused() {
    each_mode(|gw| {
        let mut c = gw.conn();
        c.send(&gw.post_bytes(None, &[], &initialize_body(1, "2025-11-25")));
        let init = c.read_response();
        assert_eq!(init.status, 200);
        let session = init.header("mcp-session-id").expect("session").to_owned();
        for i in 0..10 {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"ping"}}"#);
            c.send(&gw.post_bytes(Some(&session), &[], &body));
            let r = c.read_response();
            assert_eq!(
                r.text(),
                format!(r#"{{"jsonrpc":"2.0","id":{i},"result":{{}}}}"#)
            );
        }
    });
}

#[test]
fn connection_close_is_honoured() {
    each_mode(|gw| {
        let session = gw.initialize();
        let mut c = gw.conn();
        c.send(&gw.post_bytes(Some(&session), &[("connection", "close")], PING));
        let r = c.read_response();
        assert_eq!(r.status, 200);
        assert_eq!(r.header("connection"), Some("close"));
        assert!(c.closed(), "connection stays open after Connection: close");
    });
}

#[test]
fn chunked_request_body_is_accepted() {
    each_mode(|gw| {
        let body = initialize_body(1, "2025-11-25");
        let (a, b) = body.split_at(17);
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
            gw.host()
        );
        let chunked = format!(
            "{head}{:x}\r\n{a}\r\n{:x};ext=1\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        );
        let r = gw.raw(chunked.as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["result"]["protocolVersion"], "2025-11-25");
    });
}

#[test]
fn expect_continue_gets_100_then_the_answer() {
    each_mode(|gw| {
        let body = initialize_body(1, "2025-11-25");
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\nexpect: 100-continue\r\n\
             content-length: {}\r\n\r\n",
            gw.host(),
            body.len()
        );
        let mut c = gw.conn();
        c.send(head.as_bytes());
        let mut interim = [0u8; 25];
        std::io::Read::read_exact(&mut c.stream, &mut interim).expect("100 Continue");
        assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
        c.send(body.as_bytes());
        let r = c.read_response();
        assert_eq!(r.status, 200);
        assert!(r.header("mcp-session-id").is_some());
    });
}

/// `REQUEST_READ_TIMEOUT` in `src/limits.rs`.
const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn a_request_left_unfinished_gets_408_after_the_read_timeout() {
    // The modes run side by side: each waits out the 10 s timeout.
    std::thread::scope(|scope| {
        for mode in MODES {
            scope.spawn(move || {
                let gw = Gateway::start(mode);
                let mut c = gw.conn();
                // A whole request first: the connection's deadline timer is then armed for
                // the idle timeout (60 s), and the partial request must bring it forward.
                c.send(&gw.post_bytes(None, &[], &initialize_body(1, "2025-11-25")));
                assert_eq!(c.read_response().status, 200, "{mode:?}");
                let started = Instant::now();
                c.send(
                    format!("POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-le", gw.host()).as_bytes(),
                );
                c.stream
                    .set_read_timeout(Some(REQUEST_READ_TIMEOUT * 3))
                    .expect("read timeout");
                let r = c.read_response();
                let waited = started.elapsed();
                assert_eq!(r.status, 408, "{mode:?}");
                assert_eq!(r.header("connection"), Some("close"), "{mode:?}");
                assert!(
                    waited >= REQUEST_READ_TIMEOUT - Duration::from_millis(500),
                    "{mode:?}: 408 after {waited:?}, before the timeout"
                );
                assert!(c.closed(), "{mode:?}: connection open after the 408");
                gw.assert_serving();
            });
        }
    });
}

/// Sends `bytes`, expects `status`, then checks a fresh initialize still works.
fn refused(gw: &Gateway, bytes: &[u8], status: u16) {
    let r = gw.raw(bytes);
    assert_eq!(
        r.status,
        status,
        "{}",
        String::from_utf8_lossy(&bytes[..bytes.len().min(80)])
    );
    gw.assert_serving();
}

#[test]
fn an_error_answer_is_followed_by_a_lingering_close_not_a_reset() {
    // A 413 is decided from the head, while the body is still coming. Closing with that
    // input unread would reset the connection, and the agent could lose the 413 with it:
    // the gateway shuts its sending side, then reads and drops what still comes until the
    // agent closes (or a bound passes).
    each_mode(|gw| {
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: 5000000\r\n\r\n",
            gw.host()
        );
        let mut c = gw.conn();
        c.send(head.as_bytes());
        c.send(&[b' '; 64 * 1024]);
        let r = c.read_response();
        assert_eq!(r.status, 413);
        assert_eq!(r.header("connection"), Some("close"));
        // The gateway still reads: more of the body goes out without a reset.
        std::thread::sleep(Duration::from_millis(100));
        for _ in 0..2 {
            std::io::Write::write_all(&mut c.stream, &[b' '; 64 * 1024])
                .expect("the gateway drops the rest of the body rather than reset");
            std::thread::sleep(Duration::from_millis(50));
        }
        c.stream
            .shutdown(std::net::Shutdown::Write)
            .expect("half close");
        assert!(c.closed(), "the gateway closes once the agent has");
        gw.assert_serving();
    });
}

#[test]
fn long_request_target_gets_414() {
    each_mode(|gw| {
        let target = format!("/mcp?{}", "a".repeat(5000));
        refused(gw, &request(&gw.host(), "GET", &target, &[], b""), 414);
    });
}

#[test]
fn too_many_header_fields_get_431() {
    each_mode(|gw| {
        let names: Vec<String> = (0..100).map(|i| format!("x-h{i}")).collect();
        let headers: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "v")).collect();
        refused(gw, &gw_post(gw, &headers), 431);
    });
}

#[test]
fn oversized_header_block_gets_431() {
    each_mode(|gw| {
        let big = "b".repeat(17 * 1024);
        refused(gw, &gw_post(gw, &[("x-big", big.as_str())]), 431);
    });
}

#[test]
fn huge_content_length_gets_413() {
    each_mode(|gw| {
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\ncontent-length: 5000000\r\n\r\n",
            gw.host()
        );
        refused(gw, head.as_bytes(), 413);
    });
}

#[test]
fn unsupported_transfer_encoding_gets_501() {
    each_mode(|gw| {
        let head = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\ntransfer-encoding: gzip\r\n\r\n",
            gw.host()
        );
        refused(gw, head.as_bytes(), 501);
    });
}

#[test]
fn garbage_request_line_gets_400() {
    each_mode(|gw| {
        refused(gw, b"THIS IS NOT HTTP\r\n\r\n", 400);
        refused(gw, b"GET /mcp HTTP/1.1\r\nno colon here\r\n\r\n", 400);
    });
}

/// An initialize POST with extra headers.
fn gw_post(gw: &Gateway, extra: &[(&str, &str)]) -> Vec<u8> {
    gw.post_bytes(None, extra, &initialize_body(1, "2025-11-25"))
}
