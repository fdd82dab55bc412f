//! `server → client`: mcpyard as a gateway in front of the fast Rust upstream fixture
//! (`mcpyard-loadgen upstream`), checked with raw HTTP in every runtime mode: results
//! byte-identical to the upstream's, progress streamed as SSE, upstream `list_changed` on
//! the agent's GET stream, keep-alive reuse, and the errors an agent sees when the upstream
//! is down or dies mid-call.

mod support;

use mcpyard::limits::UPSTREAM_REUSE_CHECK_AFTER;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::{Conn, Gateway, MODES, Upstream, initialize_body, open_events, request, scrape};

/// A session straight at the fixture: its id.
fn direct_session(up: &Upstream) -> String {
    let r = direct(up.addr, None, &initialize_body(1, "2025-11-25"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("mcp-session-id")
        .expect("fixture session id")
        .to_owned()
}

/// POSTs `body` straight at the fixture.
fn direct(addr: SocketAddr, session: Option<&str>, body: &str) -> support::Response {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    if let Some(s) = session {
        headers.push(("mcp-session-id", s));
    }
    let mut c = Conn::open(addr);
    c.send(&request(
        &addr.to_string(),
        "POST",
        "/mcp",
        &headers,
        body.as_bytes(),
    ));
    c.read_response()
}

/// The raw bytes of the top-level `result` member of a JSON-RPC response.
fn raw_result(text: &str) -> String {
    let members: HashMap<String, Box<RawValue>> =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not a JSON object ({e}): {text}"));
    members
        .get("result")
        .unwrap_or_else(|| panic!("no result: {text}"))
        .get()
        .to_owned()
}

#[test]
fn results_are_byte_identical_to_the_upstreams() {
    let up = Upstream::start(&["--result-bytes", "40000"]);
    let upstream_session = direct_session(&up);
    for mode in MODES {
        let gw = Gateway::start_with(mode, &up.client_exit(""));
        let session = gw.initialize();
        for body in [
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#,
            r#"{"jsonrpc":"2.0","id":"s-6","method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}"#,
        ] {
            let via = gw.post(Some(&session), body);
            assert_eq!(via.status, 200, "{mode:?} {body}: {}", via.text());
            let straight = direct(up.addr, Some(&upstream_session), body);
            assert_eq!(straight.status, 200);
            assert_eq!(
                raw_result(&via.text()),
                raw_result(&straight.text()),
                "{mode:?} {body}"
            );
            // The agent's own id comes back exactly as written.
            let id = &serde_json::from_str::<serde_json::Value>(body).expect("json")["id"];
            assert_eq!(&via.json()["id"], id);
        }
    }
}

#[test]
fn results_larger_than_a_message_buffer_stream_through_unchanged() {
    // 6 MiB: past MESSAGE_BYTES_MAX, so this only passes if the result is streamed.
    let up = Upstream::start(&["--result-bytes", "6291456"]);
    let upstream_session = direct_session(&up);
    let body =
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#;
    let straight = raw_result(&direct(up.addr, Some(&upstream_session), body).text());
    assert!(straight.len() > 6_000_000);
    for mode in [MODES[0], MODES[3]] {
        let gw = Gateway::start_with(mode, &up.client_exit(""));
        let session = gw.initialize();
        let via = gw.post(Some(&session), body);
        assert_eq!(via.status, 200, "{mode:?}");
        assert!(
            raw_result(&via.text()) == straight,
            "{mode:?}: the result differs"
        );
    }
}

#[test]
fn large_results_after_progress_arrive_whole_in_one_sse_event() {
    // 3 MiB after two progress notifications: the reply is SSE, and the result spans
    // dozens of internal DATA frames, gathered into writes; its `data:` lines must join
    // back to exactly the upstream's result.
    let up = Upstream::start(&[
        "--result-bytes",
        "3145728",
        "--progress",
        "2",
        "--progress-interval-ms",
        "1",
    ]);
    let upstream_session = direct_session(&up);
    let plain =
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#;
    let straight = raw_result(&direct(up.addr, Some(&upstream_session), plain).text());
    assert!(straight.len() > 3_000_000);
    let call = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{},"_meta":{"progressToken":7}}}"#;
    for mode in [MODES[0], MODES[3]] {
        let gw = Gateway::start_with(mode, &up.client_exit(""));
        let session = gw.initialize();
        let (_, mut events) = open_events(&gw, &gw.post_bytes(Some(&session), &[], call));
        assert_eq!(events.expect().data, "", "{mode:?}: priming event first");
        for step in 1..=2 {
            let e = events.expect().json();
            assert_eq!(e["params"]["progress"], step, "{mode:?}: {e}");
        }
        let last = events.expect();
        assert!(
            raw_result(&last.data) == straight,
            "{mode:?}: the result differs ({} bytes vs {})",
            last.data.len(),
            straight.len()
        );
        assert!(
            events.next().is_none(),
            "{mode:?}: the stream ends after it"
        );
    }
}

#[test]
fn upstream_progress_streams_to_the_agent_as_sse() {
    let up = Upstream::start(&["--progress", "3", "--progress-interval-ms", "5"]);
    each_mode_with(&up, "", |gw| {
        let session = gw.initialize();
        let call = r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"echo","arguments":{},"_meta":{"progressToken":"p-1"}}}"#;
        let (_, mut events) = open_events(gw, &gw.post_bytes(Some(&session), &[], call));
        let first = events.expect();
        assert_eq!(first.data, "", "priming event first: {first:?}");
        for step in 1..=3 {
            let e = events.expect().json();
            assert_eq!(e["method"], "notifications/progress", "{e}");
            assert_eq!(e["params"]["progressToken"], "p-1");
            assert_eq!(e["params"]["progress"], step);
        }
        let last = events.expect().json();
        assert_eq!(last["id"], 8);
        assert!(last["result"]["content"].is_array(), "{last}");
        assert!(events.next().is_none(), "the stream ends after the result");
    });
}

#[test]
fn upstream_list_changed_reaches_the_agents_get_stream() {
    let up = Upstream::start(&[]);
    each_mode_with(&up, "", |gw| {
        let session = gw.initialize();
        let (_, mut events) = open_events(gw, &gw.get_bytes(&session, &[]));
        let priming = events.expect();
        assert_eq!(priming.data, "");
        // The agent's GET is answered once the upstream's is open, so one trigger reaches
        // it; the fixture says how many streams it told.
        let mut c = Conn::open(up.addr);
        c.send(&request(
            &up.addr.to_string(),
            "POST",
            "/control/list_changed",
            &[],
            b"",
        ));
        let told = c.read_response().json();
        assert!(told["streams"].as_u64().is_some_and(|n| n >= 1), "{told}");
        let e = events.expect().json();
        assert_eq!(e["method"], "notifications/tools/list_changed", "{e}");
    });
}

#[test]
fn pooled_upstream_connections_are_reused() {
    let up = Upstream::start(&[]);
    each_mode_with(&up, "", |gw| {
        let session = gw.initialize();
        for i in 0..30 {
            let r = gw.post(
                Some(&session),
                &format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"echo","arguments":{{}}}}}}"#),
            );
            assert_eq!(r.status, 200);
            assert!(r.json()["result"].is_object(), "{}", r.text());
        }
        let metrics = scrape(gw);
        let value = |name: &str| metric(&metrics, name);
        // initialize, initialized and 30 calls, one at a time: one connection carries them.
        assert!(value("mcpyard_upstream_connects_total") <= 2, "{metrics}");
        assert!(value("mcpyard_upstream_reused_total") >= 30, "{metrics}");
        assert_eq!(value("mcpyard_upstream_failed_total"), 0);
    });
}

#[test]
fn an_upstream_that_dies_mid_call_gives_a_prompt_error() {
    for mode in [MODES[0], MODES[3]] {
        let mut up = Upstream::start(&["--delay-ms", "5000"]);
        let gw = Gateway::start_with(mode, &up.client_exit(", response_timeout: 20s"));
        let session = gw.initialize();
        let mut c = gw.conn();
        c.send(&gw.post_bytes(
            Some(&session),
            &[],
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#,
        ));
        std::thread::sleep(Duration::from_millis(200));
        let killed = Instant::now();
        up.kill();
        let r = c.read_response();
        assert!(
            killed.elapsed() < Duration::from_secs(3),
            "{mode:?}: took {:?}",
            killed.elapsed()
        );
        assert_eq!(r.status, 200, "{mode:?}");
        let v = r.json();
        assert_eq!(v["id"], 3);
        assert_eq!(v["error"]["code"], -32603, "{v}");
    }
}

#[test]
fn a_stalled_upstream_times_out_with_an_error() {
    let up = Upstream::start(&["--delay-ms", "3000"]);
    each_mode_with(&up, ", response_timeout: 300ms", |gw| {
        let session = gw.initialize();
        let started = Instant::now();
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#,
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "took {:?}",
            started.elapsed()
        );
        let v = r.json();
        assert_eq!(v["error"]["code"], -32603, "{v}");
        assert_eq!(
            v["error"]["message"],
            "Upstream did not answer within 300 ms"
        );
        // The session still works for quick requests.
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#,
        );
        assert!(r.json()["result"]["tools"].is_array(), "{}", r.text());
    });
}

/// The server's own deadline (`request_timeout`) passing before the exit answers gives
/// the agent a JSON-RPC error for its request, written after the deadline (in every mode,
/// with two workers across workers too), and is not counted as a cut write.
#[test]
fn a_request_past_the_servers_deadline_gets_a_timeout_error() {
    let up = Upstream::start(&["--delay-ms", "3000"]);
    let bindings = format!("  exit: {}\n", up.client_exit(", response_timeout: 20s"));
    for mode in MODES {
        let gw = Gateway::start_north(mode, ", request_timeout: 300ms", &bindings);
        let session = gw.initialize();
        for id in 0..4 {
            let started = Instant::now();
            let r = gw.post(
                Some(&session),
                &format!(
                    r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{}}}}}}"#
                ),
            );
            assert!(
                started.elapsed() < Duration::from_secs(2),
                "{mode:?}: took {:?}",
                started.elapsed()
            );
            assert_eq!(r.status, 200, "{mode:?}");
            let v = r.json();
            assert_eq!(v["id"], id, "{mode:?}: {v}");
            assert_eq!(v["error"]["code"], -32603, "{mode:?}: {v}");
            assert_eq!(v["error"]["message"], "Request timed out", "{mode:?}: {v}");
        }
        let metrics = scrape(&gw);
        assert_eq!(
            metric(&metrics, "mcpyard_write_deadline_cuts_total"),
            0,
            "{mode:?}: no write was cut"
        );
    }
}

#[test]
fn a_refused_upstream_fails_initialize_with_a_jsonrpc_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = closed.local_addr().expect("addr");
    drop(closed);
    let exit = format!("{{kind: client, server: \"http://{addr}/mcp\", connect_timeout: 1s}}");
    each_mode_exit(&exit, |gw| {
        let r = gw.post(None, &initialize_body(1, "2025-11-25"));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        assert_eq!(v["id"], 1);
        assert_eq!(v["error"]["code"], -32603, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Upstream unreachable")),
            "{v}"
        );
        assert!(r.header("mcp-session-id").is_none());
    });
}

/// The value of the unlabelled series `name` in a metrics scrape.
fn metric(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
}

/// Runs `body` against a gateway in front of `up` in every mode.
fn each_mode_with(up: &Upstream, extra: &str, body: impl Fn(&Gateway)) {
    each_mode_exit(&up.client_exit(extra), body);
}

/// Runs `body` against a gateway whose exit is `exit`, in every mode.
fn each_mode_exit(exit: &str, body: impl Fn(&Gateway)) {
    for mode in MODES {
        eprintln!("--- mode {mode:?}");
        let gw = Gateway::start_with(mode, exit);
        body(&gw);
    }
}

/// A minimal upstream that answers each request and then closes the connection without
/// saying so (no `Connection: close`), like a server whose keep-alive timer fired.
fn closing_upstream() -> SocketAddr {
    raw_upstream(Framing::Length)
}

/// How [`raw_upstream`] sends a call's answer.
#[derive(Clone, Copy)]
enum Framing {
    /// JSON with `Content-Length`.
    Length,
    /// JSON in chunks of this many bytes.
    Chunks(usize),
    /// An event stream: an event whose data is not JSON-RPC, then the answer's event.
    SseAfterJunk,
}

/// A minimal upstream that answers each request (a call's result echoes its `text`
/// argument) as `framing` says, and then closes the connection without saying so.
fn raw_upstream(framing: Framing) -> SocketAddr {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().map_while(Result::ok) {
            let mut reader = BufReader::new(stream);
            let mut length = 0usize;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                if line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let mut body = vec![0u8; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let text = String::from_utf8_lossy(&body);
            let (head, json) = if text.contains("\"initialize\"") {
                (
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nmcp-session-id: s1\r\n",
                    r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"closing","version":"1"}}}"#.to_owned(),
                )
            } else if !text.contains("\"id\"") {
                ("HTTP/1.1 202 Accepted\r\n", String::new())
            } else {
                let request = serde_json::from_str::<serde_json::Value>(&text).expect("json");
                let content = match request["params"]["arguments"]["text"].as_str() {
                    Some(t) => serde_json::json!([{"type": "text", "text": t}]),
                    None => serde_json::json!([]),
                };
                let answer = serde_json::json!({
                    "jsonrpc": "2.0", "id": request["id"], "result": {"content": content}
                });
                match framing {
                    Framing::SseAfterJunk => (
                        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n",
                        format!(
                            "event: message\ndata: not json\n\nevent: message\ndata: {answer}\n\n"
                        ),
                    ),
                    _ => (
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n",
                        answer.to_string(),
                    ),
                }
            };
            let mut reply = head.as_bytes().to_vec();
            match framing {
                Framing::Chunks(n) if !json.is_empty() => {
                    reply.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                    for piece in json.as_bytes().chunks(n) {
                        reply.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                        reply.extend_from_slice(piece);
                        reply.extend_from_slice(b"\r\n");
                    }
                    reply.extend_from_slice(b"0\r\n\r\n");
                }
                _ => {
                    reply.extend_from_slice(
                        format!("content-length: {}\r\n\r\n", json.len()).as_bytes(),
                    );
                    reply.extend_from_slice(json.as_bytes());
                }
            }
            let mut stream = reader.into_inner();
            let _ = stream.write_all(&reply);
            // Dropping the stream closes it: the connection the gateway pooled is dead.
        }
    });
    addr
}

/// A body cut into one-byte chunks, both ways: an agent's params and the upstream's
/// result come through whole. Each chunk is a piece of its own as it is read; small pieces
/// are joined where they are kept (DATA queues, the held result), so such a body does not
/// cost a handle per byte.
#[test]
fn bodies_in_one_byte_chunks_come_through_whole() {
    let addr = raw_upstream(Framing::Chunks(1));
    let exit = format!("{{kind: client, server: \"http://{addr}/mcp\"}}");
    each_mode_exit(&exit, |gw| {
        let session = gw.initialize();
        let text = "z".repeat(60_000);
        let call = format!(
            r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"x","arguments":{{"text":"{text}"}}}}}}"#
        );
        let mut request = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\naccept: application/json, text/event-stream\r\nmcp-session-id: {session}\r\ntransfer-encoding: chunked\r\n\r\n",
            gw.host()
        )
        .into_bytes();
        for byte in call.as_bytes() {
            request.extend_from_slice(b"1\r\n");
            request.push(*byte);
            request.extend_from_slice(b"\r\n");
        }
        request.extend_from_slice(b"0\r\n\r\n");
        let r = gw.raw(&request);
        assert_eq!(r.status, 200);
        let v = r.json();
        assert_eq!(v["id"], 7);
        assert_eq!(
            v["result"]["content"][0]["text"].as_str(),
            Some(text.as_str())
        );
        gw.assert_serving();
    });
}

/// An event on a call's answer stream that is not JSON-RPC is skipped and counted, as on
/// the session's GET stream, and the answer after it still reaches the agent.
#[test]
fn an_answer_event_that_is_not_jsonrpc_is_skipped_and_counted() {
    let addr = raw_upstream(Framing::SseAfterJunk);
    let exit = format!("{{kind: client, server: \"http://{addr}/mcp\"}}");
    each_mode_exit(&exit, |gw| {
        let session = gw.initialize();
        let call = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{"text":"after"}}}"#;
        let r = gw.raw(&gw.post_bytes(Some(&session), &[], call));
        assert_eq!(r.status, 200);
        let text = r.text();
        assert!(text.contains(r#""text":"after""#), "{text}");
        assert!(!text.contains("not json"), "{text}");
        let metrics = scrape(gw);
        assert_eq!(metric(&metrics, "mcpyard_upstream_malformed_total"), 1);
        gw.assert_serving();
    });
}

/// A session and `calls` tools/calls, each after `pause`, each answered with a result;
/// returns the metrics after them.
fn calls_after_pauses(gw: &Gateway, calls: usize, pause: Duration) -> String {
    let session = gw.initialize();
    for i in 0..calls {
        std::thread::sleep(pause);
        let r = gw.post(
            Some(&session),
            &format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"x","arguments":{{}}}}}}"#),
        );
        assert!(r.json()["result"].is_object(), "call {i}: {}", r.text());
    }
    scrape(gw)
}

#[test]
fn a_pooled_connection_the_upstream_closed_is_never_used() {
    let addr = closing_upstream();
    let exit = format!("{{kind: client, server: \"http://{addr}/mcp\"}}");
    each_mode_exit(&exit, |gw| {
        // Let the upstream's close reach us before the next request takes the pool, and
        // wait past the time within which io_uring reuses without a check.
        let metrics = calls_after_pauses(
            gw,
            3,
            UPSTREAM_REUSE_CHECK_AFTER + Duration::from_millis(50),
        );
        let value = |name: &str| metric(&metrics, name);
        assert!(
            value("mcpyard_upstream_stale_dropped_total") >= 3,
            "{metrics}"
        );
        // The gateway sends `notifications/initialized` upstream the moment initialize is
        // answered, which can beat this upstream's close of that connection (its thread
        // may not have run yet): the pool's check cannot see a close that has not
        // arrived, so that one request may be resent once. The calls, each after a pause,
        // must never be.
        assert!(
            value("mcpyard_upstream_stale_retries_total") <= 1,
            "{metrics}"
        );
        assert_eq!(value("mcpyard_upstream_failed_total"), 0, "{metrics}");
    });
}

/// Params larger than a stream window go upstream piece by piece; a pooled connection the
/// upstream closed fails partway through them, and the call is resent whole on a fresh
/// connection (the gateway aborted here before: a resend expected no params or all).
#[test]
fn a_large_call_on_a_connection_the_upstream_closed_is_resent_whole() {
    let addr = closing_upstream();
    let exit = format!("{{kind: client, server: \"http://{addr}/mcp\"}}");
    each_mode_exit(&exit, |gw| {
        let session = gw.initialize();
        let text = "x".repeat(100 * 1024);
        for i in 0..5 {
            std::thread::sleep(Duration::from_millis(20));
            let r = gw.post(
                Some(&session),
                &format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"x","arguments":{{"text":"{text}"}}}}}}"#),
            );
            assert!(r.json()["result"].is_object(), "call {i}: {}", r.text());
        }
        let metrics = scrape(gw);
        assert_eq!(
            metric(&metrics, "mcpyard_upstream_failed_total"),
            0,
            "{metrics}"
        );
        gw.assert_serving();
    });
}

#[test]
fn a_pooled_connection_closed_just_after_its_last_use_is_resent_once_and_answered() {
    let addr = closing_upstream();
    let exit = format!("{{kind: client, server: \"http://{addr}/mcp\"}}");
    each_mode_exit(&exit, |gw| {
        // Well inside the window in which io_uring reuses a connection unchecked (epoll
        // still sees the close when it has arrived): the dead connection is found by the
        // request itself, which goes once more on a fresh one.
        let metrics = calls_after_pauses(gw, 5, Duration::from_millis(20));
        let value = |name: &str| metric(&metrics, name);
        // Every call found its connection dead one way or the other, and none failed.
        assert!(
            value("mcpyard_upstream_stale_dropped_total")
                + value("mcpyard_upstream_stale_retries_total")
                >= 5,
            "{metrics}"
        );
        assert_eq!(value("mcpyard_upstream_failed_total"), 0, "{metrics}");
    });
}
