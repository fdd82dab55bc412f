//! The real binary end to end: the `upstream` fixture spoken to with raw HTTP, and `run`
//! against it in each scenario. Every fixture listens on 127.0.0.1:0 and is killed when
//! its test ends. Assertions are on counts and bytes, never on how long anything took.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

mod common;

use common::{BIN, Fixture};

/// Generous socket timeout so a hung fixture fails the test instead of hanging it.
const IO_TIMEOUT: Duration = Duration::from_secs(20);

/// Sends raw bytes on a new connection and returns everything until the peer's response
/// is complete (Content-Length bodies only) as (head, body).
fn exchange(addr: &str, request: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect: {e}"));
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .unwrap_or_else(|e| panic!("timeout: {e}"));
    stream
        .write_all(request.as_bytes())
        .unwrap_or_else(|e| panic!("write: {e}"));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|v| v.trim().parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                return (head.to_owned(), body.to_owned());
            }
        }
        let n = stream
            .read(&mut chunk)
            .unwrap_or_else(|e| panic!("read: {e}"));
        assert!(n > 0, "closed early after {text:?}");
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    }
}

fn post(addr: &str, session: Option<&str>, body: &str) -> (String, String) {
    let session = session.map_or(String::new(), |s| format!("mcp-session-id: {s}\r\n"));
    exchange(
        addr,
        &format!(
            "POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             accept: application/json, text/event-stream\r\n{session}content-length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn initialize(addr: &str) -> String {
    let (head, body) = post(
        addr,
        None,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#,
    );
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(body.contains(r#""protocolVersion":"2025-11-25""#), "{body}");
    header(&head, "mcp-session-id")
        .unwrap_or_else(|| panic!("no session in {head}"))
        .to_owned()
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("mcpyard-loadgen-{}-{name}", std::process::id()))
}

fn loadgen(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {BIN}: {e}"))
}

fn json_file(path: &PathBuf) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path:?}: {e}"))
}

#[test]
fn fixture_speaks_mcp_sessions() {
    let fx = Fixture::start(&["--result-bytes", "100"]);
    let sid = initialize(&fx.addr);
    let call = r#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}"#;
    let (head, body) = post(&fx.addr, Some(&sid), call);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let v: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["id"], "c");
    assert_eq!(
        v["result"]["content"][0]["text"].as_str().map(str::len),
        Some(100)
    );

    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    assert!(
        post(&fx.addr, Some(&sid), note)
            .0
            .starts_with("HTTP/1.1 202")
    );
    let ping = r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#;
    assert!(post(&fx.addr, None, ping).0.starts_with("HTTP/1.1 400"));
    assert!(
        post(&fx.addr, Some("0123456789abcdef"), ping)
            .0
            .starts_with("HTTP/1.1 404")
    );
    let unknown = r#"{"jsonrpc":"2.0","id":3,"method":"nope"}"#;
    assert!(post(&fx.addr, Some(&sid), unknown).1.contains("-32601"));

    let delete = format!("DELETE /mcp HTTP/1.1\r\nhost: x\r\nmcp-session-id: {sid}\r\n\r\n");
    assert!(exchange(&fx.addr, &delete).0.starts_with("HTTP/1.1 200"));
    assert!(
        post(&fx.addr, Some(&sid), ping)
            .0
            .starts_with("HTTP/1.1 404")
    );
}

#[test]
fn fixture_lists_generated_tools_in_pages_and_calls_only_listed_ones() {
    let fx = Fixture::start(&["--tools", "5", "--page-size", "2", "--result-bytes", "30"]);
    let sid = initialize(&fx.addr);
    let request = |id: u32, method: &str, params: &str| {
        let body =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#);
        let (head, body) = post(&fx.addr, Some(&sid), &body);
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    };

    let (_, first) = post(
        &fx.addr,
        Some(&sid),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
    );
    assert!(first.ends_with(r#"],"nextCursor":"offset-2"}}"#), "{first}");
    let mut names = Vec::new();
    let mut params = "{}".to_owned();
    for page in 1..=3 {
        let v = request(page, "tools/list", &params);
        let tools = v["result"]["tools"].as_array().cloned().unwrap_or_default();
        names.extend(
            tools
                .iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned)),
        );
        match v["result"]["nextCursor"].as_str() {
            Some(cursor) => {
                assert!(page < 3, "the last page has no nextCursor: {v}");
                params = format!(r#"{{"cursor":"{cursor}"}}"#);
            }
            None => assert_eq!(page, 3, "only the last page has no nextCursor"),
        }
    }
    assert_eq!(
        names,
        ["echo", "big", "tool_00003", "tool_00004", "tool_00005"]
    );
    let v = request(4, "tools/list", r#"{"cursor":"offset-3"}"#);
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert_eq!(v["error"]["message"], "Invalid cursor", "{v}");

    let v = request(5, "tools/call", r#"{"name":"tool_00005","arguments":{}}"#);
    assert_eq!(
        v["result"]["content"][0]["text"].as_str().map(str::len),
        Some(30),
        "{v}"
    );
    let v = request(6, "tools/call", r#"{"name":"tool_\"6","arguments":{}}"#);
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert_eq!(v["error"]["message"], "Unknown tool: tool_\"6", "{v}");

    let out = loadgen(&[
        "run",
        "--url",
        &fx.url(),
        "--tool",
        "tool_00004",
        "--mode",
        "closed",
        "--duration",
        "200ms",
        "--warmup",
        "0s",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(" 0 errors"));
}

#[test]
fn fixture_accepts_chunked_request_bodies() {
    let fx = Fixture::start(&[]);
    let sid = initialize(&fx.addr);
    let body = r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#;
    let (first, rest) = body.split_at(10);
    let request = format!(
        "POST /mcp HTTP/1.1\r\nhost: x\r\nmcp-session-id: {sid}\r\ntransfer-encoding: chunked\r\n\r\n\
         {:x}\r\n{first}\r\n{:x}\r\n{rest}\r\n0\r\n\r\n",
        first.len(),
        rest.len()
    );
    let (head, body) = exchange(&fx.addr, &request);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, r#"{"jsonrpc":"2.0","id":9,"result":{}}"#);
}

#[test]
fn closed_loop_run_writes_all_three_reports() {
    let fx = Fixture::start(&["--workers", "2"]);
    let (json, hgrm, svg) = (temp_path("c.json"), temp_path("c.hgrm"), temp_path("c.svg"));
    let out = loadgen(&[
        "run",
        "--url",
        &fx.url(),
        "--mode",
        "closed",
        "--connections",
        "2",
        "--duration",
        "300ms",
        "--warmup",
        "100ms",
        "--json",
        &json.to_string_lossy(),
        "--hgrm",
        &hgrm.to_string_lossy(),
        "--svg",
        &svg.to_string_lossy(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("closed-loop, 2 connections"), "{stdout}");
    let v = json_file(&json);
    assert!(v["requests_ok"].as_u64().is_some_and(|n| n > 0), "{v}");
    for kind in [
        "connect",
        "http_status",
        "jsonrpc",
        "timeout",
        "decode",
        "io",
    ] {
        assert_eq!(v["errors"][kind], 0, "{kind}");
    }
    let hgrm_text = std::fs::read_to_string(&hgrm).unwrap_or_default();
    assert!(hgrm_text.starts_with("       Value     Percentile TotalCount 1/(1-Percentile)\n\n"));
    assert!(hgrm_text.contains("#[Buckets = "));
    let svg_text = std::fs::read_to_string(&svg).unwrap_or_default();
    assert!(svg_text.starts_with("<svg ") && svg_text.contains("<polyline"));
    for path in [json, hgrm, svg] {
        let _ = std::fs::remove_file(path);
    }
}

#[test]
fn open_loop_sends_exactly_the_schedule() {
    // 400 req/s for 0.5 s after the warm-up: 200 requests are owed, whatever happens to
    // each of them (answered, failed or never sent).
    let fx = Fixture::start(&[]);
    let json = temp_path("o.json");
    let out = loadgen(&[
        "run",
        "--url",
        &fx.url(),
        "--rate",
        "400",
        "--connections",
        "3",
        "--duration",
        "500ms",
        "--warmup",
        "250ms",
        "--json",
        &json.to_string_lossy(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_file(&json);
    let errors: u64 = v["errors"].as_object().map_or(0, |m| {
        m.values().filter_map(serde_json::Value::as_u64).sum()
    });
    let owed = v["requests_ok"].as_u64().unwrap_or(0) + errors + v["unsent"].as_u64().unwrap_or(0);
    assert_eq!(owed, 200, "{v}");
    assert_eq!(v["warmup_requests"], 100);
    assert_eq!(v["target_rate"], 400);
    let _ = std::fs::remove_file(json);
}

#[test]
fn intervals_add_up_to_the_run_and_session_churn_runs_clean() {
    // 400 req/s for 1 s after a 250 ms warm-up, in 250 ms lines, each session ended after
    // 7 calls: every line is written, the measured lines add up to the summary, and the
    // churn (DELETE, initialize, initialized every 7th call) fails nothing.
    let fx = Fixture::start(&[]);
    let (json, lines) = (temp_path("i.json"), temp_path("i.jsonl"));
    let out = loadgen(&[
        "run",
        "--url",
        &fx.url(),
        "--rate",
        "400",
        "--connections",
        "3",
        "--duration",
        "1s",
        "--warmup",
        "250ms",
        "--session-calls",
        "7",
        "--json",
        &json.to_string_lossy(),
        "--intervals",
        &lines.to_string_lossy(),
        "--interval",
        "250ms",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_file(&json);
    let text = std::fs::read_to_string(&lines).unwrap_or_default();
    let got: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(got.len() >= 5, "{text}");
    let sum = |key: &str, warmup: Option<bool>| -> u64 {
        got.iter()
            .filter(|l| warmup.is_none_or(|w| l["warmup"] == w))
            .filter_map(|l| l[key].as_u64())
            .sum()
    };
    assert_eq!(
        sum("ok", Some(false)),
        v["requests_ok"].as_u64().unwrap_or(0),
        "{text}"
    );
    assert_eq!(sum("ok", Some(true)), 100, "{text}");
    assert_eq!(sum("completed", None), 500, "{text}");
    assert_eq!(sum("completed_ok", None), 500, "{text}");
    for (i, l) in got.iter().enumerate() {
        assert_eq!(l["t_s"].as_f64(), Some(i as f64 * 0.25), "{l}");
        let errors: u64 = l["errors"].as_object().map_or(0, |m| {
            m.values().filter_map(serde_json::Value::as_u64).sum()
        });
        assert_eq!(errors, 0, "{l}");
    }
    for path in [json, lines] {
        let _ = std::fs::remove_file(path);
    }
}

#[test]
fn every_request_scenario_runs_against_the_fixture() {
    let fx = Fixture::start(&["--progress", "3"]);
    for scenario in [
        "initialize",
        "tools-call",
        "tools-call-progress",
        "tools-list",
    ] {
        let json = temp_path(&format!("{scenario}.json"));
        let out = loadgen(&[
            "run",
            "--url",
            &fx.url(),
            "--scenario",
            scenario,
            "--rate",
            "200",
            "--connections",
            "2",
            "--duration",
            "200ms",
            "--warmup",
            "0s",
            "--json",
            &json.to_string_lossy(),
        ]);
        assert!(
            out.status.success(),
            "{scenario}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = json_file(&json);
        let ok = v["requests_ok"].as_u64().unwrap_or(0);
        assert!(ok > 0, "{scenario}: {v}");
        let expected_notes = if scenario == "tools-call-progress" {
            3 * ok
        } else {
            0
        };
        assert_eq!(v["notifications"], expected_notes, "{scenario}");
        let _ = std::fs::remove_file(json);
    }
}

#[test]
fn sse_answers_are_read_like_json_ones() {
    let fx = Fixture::start(&["--sse"]);
    let out = loadgen(&[
        "run",
        "--url",
        &fx.url(),
        "--mode",
        "closed",
        "--duration",
        "200ms",
        "--warmup",
        "0s",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(" 0 errors"));
}

#[test]
fn idle_sessions_stay_open_and_fanout_reaches_every_stream() {
    let fx = Fixture::start(&[]);
    let out = loadgen(&[
        "run",
        "--url",
        &fx.url(),
        "--scenario",
        "idle-sessions",
        "--sessions",
        "50",
        "--duration",
        "200ms",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("opened 50 in"), "{stdout}");
    assert!(stdout.contains("50 of 50 still open"), "{stdout}");

    let json = temp_path("fan.json");
    let trigger = format!("http://{}/control/list_changed", fx.addr);
    let out = loadgen(&[
        "run",
        "--url",
        &fx.url(),
        "--scenario",
        "fanout",
        "--sessions",
        "40",
        "--trigger",
        &trigger,
        "--rounds",
        "2",
        "--json",
        &json.to_string_lossy(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json_file(&json);
    let rounds = v["rounds"].as_array().cloned().unwrap_or_default();
    assert_eq!(rounds.len(), 2, "{v}");
    for round in rounds {
        assert_eq!(round["expected"], 40, "{round}");
        assert_eq!(round["received"], 40, "{round}");
        assert_eq!(round["trigger_told"], 40, "{round}");
    }
    assert_eq!(v["delivery_us"]["count"], 80);
    let _ = std::fs::remove_file(json);
}

#[test]
fn a_target_that_is_down_or_not_mcp_fails_with_a_clear_message() {
    // A port that was just free: bind, read it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("bind: {e}"));
    let out = loadgen(&[
        "run",
        "--url",
        &format!("http://127.0.0.1:{port}/mcp"),
        "--duration",
        "1s",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is the target running"), "{stderr}");

    let fx = Fixture::start(&[]);
    let out = loadgen(&[
        "run",
        "--url",
        &fx.url(),
        "--tool",
        "missing",
        "--duration",
        "1s",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refused this request"), "{stderr}");

    let out = loadgen(&["run", "--url", &fx.url(), "--connections", "nine"]);
    assert_eq!(out.status.code(), Some(2));
}
