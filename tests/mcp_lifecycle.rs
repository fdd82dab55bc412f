//! Session lifecycle over Streamable HTTP: initialize and version negotiation, the
//! session header rules (400/404), DELETE, header checks (415/406/400), sessions used from
//! many connections (cross-worker hand-off), metrics and graceful SIGTERM.

mod support;

use serde_json::json;
use support::{Gateway, MODES, each_mode, initialize_body, request, scrape, scrape_until};

#[test]
fn initialize_returns_session_id_and_server_info() {
    each_mode(|gw| {
        let r = gw.post(None, &initialize_body(1, "2025-11-25"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/json"));
        let session = r.header("mcp-session-id").expect("session id");
        assert_eq!(session.len(), 26);
        assert!(
            session.bytes().all(|b| (0x21..=0x7e).contains(&b)),
            "{session}"
        );
        let prefix = &session[..4];
        assert!(prefix.bytes().all(|b| b.is_ascii_hexdigit()), "{session}");
        let worker = u8::from_str_radix(&prefix[2..], 16).expect("hex");
        assert_eq!(&prefix[..2], "00", "node 0");
        assert!(usize::from(worker) < gw.mode.workers, "{session}");
        let body = r.text();
        assert!(body.starts_with(r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{"#), "{body}");
        let v = r.json();
        assert_eq!(
            v["result"]["serverInfo"],
            json!({"name": "mcpyard", "version": "0.1.0"})
        );
        assert!(v["result"]["capabilities"].is_object());
        assert!(v["result"]["capabilities"]["tools"].is_object());
        assert!(v["result"]["instructions"].is_string(), "{body}");
    });
}

#[test]
fn initialize_echoes_supported_version_and_upgrades_old_one() {
    each_mode(|gw| {
        let r = gw.post(None, &initialize_body(7, "2025-06-18"));
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["result"]["protocolVersion"], "2025-06-18");
        let r = gw.post(None, &initialize_body(8, "2024-11-05"));
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["result"]["protocolVersion"], "2025-11-25");
    });
}

#[test]
fn initialize_with_non_object_capabilities_gets_32602() {
    each_mode(|gw| {
        let body = r#"{"jsonrpc":"2.0","id":42,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":7,"clientInfo":{"name":"x","version":"0"}}}"#;
        let r = gw.post(None, body);
        assert_eq!(r.status, 200);
        assert!(r.header("mcp-session-id").is_none());
        let v = r.json();
        assert_eq!(v["id"], 42);
        assert_eq!(v["error"]["code"], -32602);
    });
}

/// Capabilities are kept for the session's life (and written to its shared record):
/// past 64 KiB an `initialize` is refused, and no session is made.
#[test]
fn initialize_with_oversized_capabilities_gets_32602() {
    each_mode(|gw| {
        for (extra, refused) in [(65_536 - 8, false), (65_536 - 7, true)] {
            let caps = format!(r#"{{"x":"{}"}}"#, "c".repeat(extra));
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":43,"method":"initialize","params":{{"protocolVersion":"2025-11-25","capabilities":{caps},"clientInfo":{{"name":"x","version":"0"}}}}}}"#
            );
            let r = gw.post(None, &body);
            assert_eq!(r.status, 200);
            let v = r.json();
            assert_eq!(v["id"], 43);
            if refused {
                assert!(r.header("mcp-session-id").is_none());
                assert_eq!(v["error"]["code"], -32602);
                assert_eq!(
                    v["error"]["message"],
                    "Invalid params: capabilities larger than 65536 bytes"
                );
            } else {
                assert!(r.header("mcp-session-id").is_some(), "{v}");
                assert!(v["result"].is_object());
            }
        }
    });
}

#[test]
fn post_without_json_content_type_gets_415() {
    each_mode(|gw| {
        let headers = [
            ("content-type", "text/plain"),
            ("accept", "application/json, text/event-stream"),
        ];
        let r = gw.raw(&request(
            &gw.host(),
            "POST",
            "/mcp",
            &headers,
            initialize_body(1, "2025-11-25").as_bytes(),
        ));
        assert_eq!(r.status, 415);
        let headers = [("accept", "application/json, text/event-stream")];
        let r = gw.raw(&request(
            &gw.host(),
            "POST",
            "/mcp",
            &headers,
            initialize_body(1, "2025-11-25").as_bytes(),
        ));
        assert_eq!(r.status, 415);
        gw.assert_serving();
    });
}

#[test]
fn post_accept_must_admit_json_and_event_stream() {
    each_mode(|gw| {
        let body = initialize_body(1, "2025-11-25");
        for accept in ["application/json", "text/event-stream", "text/html"] {
            let headers = [("content-type", "application/json"), ("accept", accept)];
            let r = gw.raw(&request(
                &gw.host(),
                "POST",
                "/mcp",
                &headers,
                body.as_bytes(),
            ));
            assert_eq!(r.status, 406, "accept {accept}");
        }
        let headers = [("content-type", "application/json")];
        let r = gw.raw(&request(
            &gw.host(),
            "POST",
            "/mcp",
            &headers,
            body.as_bytes(),
        ));
        assert_eq!(r.status, 406, "no accept");
        for accept in ["*/*", "text/event-stream, application/json;q=0.9"] {
            let headers = [("content-type", "application/json"), ("accept", accept)];
            let r = gw.raw(&request(
                &gw.host(),
                "POST",
                "/mcp",
                &headers,
                body.as_bytes(),
            ));
            assert_eq!(r.status, 200, "accept {accept}");
        }
    });
}

#[test]
fn get_without_event_stream_accept_gets_406() {
    each_mode(|gw| {
        let session = gw.initialize();
        let headers = [
            ("accept", "application/json"),
            ("mcp-session-id", session.as_str()),
        ];
        let r = gw.raw(&request(&gw.host(), "GET", "/mcp", &headers, b""));
        assert_eq!(r.status, 406);
    });
}

#[test]
fn missing_session_gets_400() {
    each_mode(|gw| {
        let r = gw.post(None, r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#);
        assert_eq!(r.status, 400);
        let v = r.json();
        assert_eq!(v["jsonrpc"], "2.0");
        assert_eq!(v["id"], serde_json::Value::Null);
        assert!(v["error"]["code"].is_i64());
    });
}

#[test]
fn unknown_session_gets_404() {
    each_mode(|gw| {
        let r = gw.post(
            Some("0000AAAAAAAAAAAAAAAAAAAAAA"),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
        );
        assert_eq!(r.status, 404);
        let r = gw.post(
            Some("not-a-session"),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#,
        );
        assert_eq!(r.status, 404);
    });
}

/// DELETE of `session`.
fn delete(gw: &Gateway, session: &str) -> support::Response {
    gw.raw(&request(
        &gw.host(),
        "DELETE",
        "/mcp",
        &[("mcp-session-id", session)],
        b"",
    ))
}

#[test]
fn deleted_session_gets_404() {
    each_mode(|gw| {
        let session = gw.initialize();
        let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
        assert_eq!(gw.post(Some(&session), list).status, 200);
        let r = delete(gw, &session);
        assert_eq!(r.status, 200);
        assert_eq!(gw.post(Some(&session), list).status, 404);
        let r = delete(gw, &session);
        assert_eq!(r.status, 404);
    });
}

/// An agent deleting its session while one of its requests waits for its result: that
/// request gets an error naming why, and the gateway serves on (it aborted before).
#[test]
fn deleting_a_session_answers_its_request_in_flight() {
    each_mode(|gw| {
        let session = gw.initialize();
        let slow = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"progress","arguments":{"steps":50}}}"#;
        let mut call = support::Conn::open(gw.addr);
        call.send(&gw.post_bytes(Some(&session), &[], slow));
        std::thread::sleep(std::time::Duration::from_millis(150));
        let r = delete(gw, &session);
        assert_eq!(r.status, 200);
        let answer = call.read_response();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("content-type"), Some("application/json"));
        let v = answer.json();
        assert_eq!(v["id"], 7, "{v}");
        // The session's end, or the exit's abort of its call, whichever the reply sees
        // first.
        assert_eq!(v["error"]["code"], -32603, "{v}");
        assert!(v["error"]["message"].is_string(), "{v}");
        gw.assert_serving();
    });
}

#[test]
fn bad_protocol_version_header_gets_400() {
    each_mode(|gw| {
        let session = gw.initialize();
        let list = r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#;
        let r = gw.raw(&gw.post_bytes(
            Some(&session),
            &[("mcp-protocol-version", "1999-01-01")],
            list,
        ));
        assert_eq!(r.status, 400);
        // Another version mcpyard speaks than the one negotiated passes (MCP refuses only
        // unsupported ones, and the conformance suite's clients send such).
        let r = gw.raw(&gw.post_bytes(
            Some(&session),
            &[("mcp-protocol-version", "2025-06-18")],
            list,
        ));
        assert_eq!(r.status, 200);
        let r = gw.raw(&gw.post_bytes(
            Some(&session),
            &[("mcp-protocol-version", "2025-11-25")],
            list,
        ));
        assert_eq!(r.status, 200);
        // DELETE is checked too: a wrong version does not end the session.
        let r = gw.raw(&request(
            &gw.host(),
            "DELETE",
            "/mcp",
            &[
                ("mcp-session-id", session.as_str()),
                ("mcp-protocol-version", "1999-01-01"),
            ],
            b"",
        ));
        assert_eq!(r.status, 400);
        assert_eq!(delete(gw, &session).status, 200);
    });
}

#[test]
fn session_is_usable_from_many_fresh_connections() {
    each_mode(|gw| {
        let session = gw.initialize();
        for i in 0..20 {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/list"}}"#);
            let r = gw.post(Some(&session), &body);
            assert_eq!(r.status, 200, "connection {i}: {}", r.text());
            let v = r.json();
            assert_eq!(v["id"], i);
            assert!(v["result"]["tools"].is_array());
        }
        if gw.mode.workers > 1 {
            // 20 connections spread by SO_REUSEPORT all landing on the owner is a 2^-19
            // chance: some of them must have been handed off.
            let text = scrape(gw);
            let handoffs: u64 = text
                .lines()
                .find_map(|l| l.strip_prefix("mcpyard_handoffs_total "))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("no mcpyard_handoffs_total in {text}"));
            assert!(handoffs > 0, "{text}");
        }
    });
}

#[test]
fn metrics_report_sessions_and_request_counts() {
    each_mode(|gw| {
        let session = gw.initialize();
        assert_eq!(
            gw.post(
                Some(&session),
                r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#
            )
            .status,
            200
        );
        let count = r#"mcpyard_request_seconds_count{method="tools/list",outcome="ok"} 1"#;
        let text = scrape_until(gw, count, |t| t.contains(count));
        assert!(text.contains("mcpyard_sessions 1\n"), "{text}");
    });
}

#[test]
fn sigterm_exits_zero() {
    for mode in MODES {
        let mut gw = Gateway::start(mode);
        let session = gw.initialize();
        assert_eq!(
            gw.post(
                Some(&session),
                r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#
            )
            .status,
            200
        );
        let status = gw.terminate(std::time::Duration::from_secs(5));
        assert!(status.success(), "{mode:?}: {status:?}");
    }
}

#[test]
fn get_checks_session_and_protocol_version() {
    each_mode(|gw| {
        let r = gw.raw(&request(
            &gw.host(),
            "GET",
            "/mcp",
            &[("accept", "text/event-stream")],
            b"",
        ));
        assert_eq!(r.status, 400);
        let r = gw.raw(&gw.get_bytes("0000AAAAAAAAAAAAAAAAAAAAAA", &[]));
        assert_eq!(r.status, 404);
        let session = gw.initialize();
        let r = gw.raw(&gw.get_bytes(&session, &[("mcp-protocol-version", "2099-01-01")]));
        assert_eq!(r.status, 400);
    });
}

#[test]
fn sigterm_ends_open_get_stream_cleanly_and_exits_zero() {
    for mode in MODES {
        let mut gw = Gateway::start(mode);
        let session = gw.initialize();
        let (_, mut events) = support::open_events(&gw, &gw.get_bytes(&session, &[]));
        let priming = events.expect();
        assert_eq!(priming.raw, "id: 0.0\ndata: \n\n");
        let status = gw.terminate(std::time::Duration::from_secs(5));
        assert!(status.success(), "{mode:?}: {status:?}");
        assert_eq!(
            events.next(),
            None,
            "{mode:?}: the GET stream must end with its terminating chunk"
        );
    }
}

#[test]
fn sigterm_lets_in_flight_request_finish() {
    for mode in MODES {
        let mut gw = Gateway::start(mode);
        let session = gw.initialize();
        let call = r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"progress","arguments":{"steps":10},"_meta":{"progressToken":1}}}"#;
        let (_, mut events) = support::open_events(&gw, &gw.post_bytes(Some(&session), &[], call));
        assert_eq!(
            events.expect().id.as_deref().map(|i| i.ends_with(".0")),
            Some(true)
        );
        let pid = libc::pid_t::try_from(gw.pid()).expect("pid");
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let mut result = None;
        while let Some(e) = events.next() {
            if e.json().get("result").is_some() {
                result = Some(e.json());
                break;
            }
        }
        let result =
            result.unwrap_or_else(|| panic!("{mode:?}: no result before the stream ended"));
        assert_eq!(result["id"], 5);
        assert_eq!(
            result["result"]["content"][0]["text"],
            "done after 10 steps"
        );
        let status = gw.terminate(std::time::Duration::from_secs(5));
        assert!(status.success(), "{mode:?}: {status:?}");
    }
}

#[test]
fn the_metrics_endpoint_bounds_its_scrapers() {
    use std::io::Read;
    use std::time::{Duration, Instant};
    let gw = Gateway::start(MODES[0]);
    // Sixteen scrapers that send nothing take every place: a seventeenth is closed at once.
    let idle: Vec<std::net::TcpStream> = (0..16)
        .map(|_| std::net::TcpStream::connect(gw.metrics).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut extra = std::net::TcpStream::connect(gw.metrics).expect("connect");
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut got = Vec::new();
    let read = extra.read_to_end(&mut got);
    assert!(
        read.as_ref().is_ok_and(|n| *n == 0)
            || read.is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
        "the 17th scraper was served or left waiting"
    );
    // Those that leave give their place back (once the gateway has read their end: until
    // then a scrape may still be closed at once, and is tried again).
    drop(idle);
    let until = Instant::now() + Duration::from_secs(5);
    let text = loop {
        use std::io::Write;
        let mut c = std::net::TcpStream::connect(gw.metrics).expect("connect");
        c.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .expect("send");
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        if got.starts_with(b"HTTP/1.1 200 ") {
            break String::from_utf8_lossy(&got).into_owned();
        }
        assert!(Instant::now() < until, "no place was given back");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(text.contains("mcpyard_sessions "), "{text}");
    assert!(
        !text.contains("mcpyard_metrics_scrapes_refused_total 0\n"),
        "the refusal was not counted"
    );
    // One that stays and sends nothing is closed after the exchange's 10 s.
    let mut silent = std::net::TcpStream::connect(gw.metrics).expect("connect");
    silent
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let opened = Instant::now();
    let mut got = Vec::new();
    let read = silent.read_to_end(&mut got);
    assert!(read.is_ok(), "a silent scraper was never closed: {read:?}");
    assert!(got.is_empty());
    let held = opened.elapsed();
    assert!(
        held >= Duration::from_secs(9) && held < Duration::from_secs(15),
        "{held:?}"
    );
}
