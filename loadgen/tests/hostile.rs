//! `run` against targets that misbehave in ways a real server may: a raw TcpListener in
//! the test speaks just enough MCP (initialize, notifications, tools/call, DELETE) and
//! then trickles, closes or leaves headers out. Ports are chosen at run time; every run
//! of the binary has a bounded wait, so a hang fails the test instead of hanging it.
//! Assertions are on counts and headers, never on how long anything took.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_mcpyard-loadgen");

/// How long a run of the binary may take before the test calls it hung.
const RUN_BOUND: Duration = Duration::from_secs(60);

/// How the target misbehaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Behaviour {
    /// Answers the first tools/call (the probe) in full; every later one gets a head that
    /// announces 1 MB and then one body byte every 50 ms, for ever.
    Trickle,
    /// Answers every request in full, keep-alive, then closes the connection.
    CloseAfterEachAnswer,
    /// Like `Trickle`'s first call, then every later tools/call gets half its answer and
    /// a close.
    CutMidAnswer,
    /// Answers every request in full but gives no `mcp-session-id`.
    NoSession,
    /// Answers every request in full, keep-alive, session `s1`.
    Plain,
    /// Answers tools/call with an event stream (chunked) carrying the result, then holds
    /// the stream open until the client goes away.
    SseHeldOpen,
}

/// One request as the target saw it: the head's lines (lower-cased names) and the body.
#[derive(Clone, Debug)]
struct Seen {
    head: String,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn method(&self) -> String {
        let v: serde_json::Value = serde_json::from_str(&self.body).unwrap_or_default();
        match v["method"].as_str() {
            Some(m) => m.to_owned(),
            None => self.head.split(' ').next().unwrap_or_default().to_owned(),
        }
    }
}

/// A target listening on 127.0.0.1:0, a thread per connection; `seen` collects every
/// request it read.
struct Target {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Target {
    fn start(behaviour: Behaviour) -> Target {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("addr: {e}"));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let calls = Arc::new(AtomicU64::new(0));
        let shared = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let seen = Arc::clone(&shared);
                let calls = Arc::clone(&calls);
                std::thread::spawn(move || serve(stream, behaviour, &seen, &calls));
            }
        });
        Target {
            url: format!("http://{addr}/mcp"),
            seen,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Reads one request (Content-Length bodies only); `None` when the client closed.
fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(buf.get(..end).unwrap_or_default()).into_owned();
            let length = head
                .lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                let body = buf.get(end + 4..end + 4 + length).unwrap_or_default();
                let body = String::from_utf8_lossy(body).into_owned();
                buf.drain(..end + 4 + length);
                return Some(Seen { head, body });
            }
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(chunk.get(..n).unwrap_or_default()),
        }
    }
}

fn serve(mut stream: TcpStream, behaviour: Behaviour, seen: &Mutex<Vec<Seen>>, calls: &AtomicU64) {
    let mut buf = Vec::new();
    while let Some(request) = read_request(&mut stream, &mut buf) {
        if let Ok(mut seen) = seen.lock() {
            seen.push(request.clone());
        }
        let method = request.method();
        if behaviour == Behaviour::Trickle
            && method == "tools/call"
            && calls.fetch_add(1, Ordering::Relaxed) > 0
        {
            trickle(&mut stream);
            return;
        }
        if behaviour == Behaviour::CutMidAnswer
            && method == "tools/call"
            && calls.fetch_add(1, Ordering::Relaxed) > 0
        {
            let full = answer(&request, behaviour);
            let _ = stream.write_all(full.get(..full.len() / 2).unwrap_or_default().as_bytes());
            return;
        }
        if behaviour == Behaviour::SseHeldOpen && method == "tools/call" {
            sse_held_open(&mut stream, &request);
            return;
        }
        if stream
            .write_all(answer(&request, behaviour).as_bytes())
            .is_err()
        {
            return;
        }
        if behaviour == Behaviour::CloseAfterEachAnswer {
            return; // closes the connection, keep-alive though it was
        }
    }
}

/// The full answer to `request`: 202 for a notification, 200 and a result otherwise.
fn answer(request: &Seen, behaviour: Behaviour) -> String {
    let v: serde_json::Value = serde_json::from_str(&request.body).unwrap_or_default();
    let (status, body) = if request.head.starts_with("DELETE") {
        (200, String::new())
    } else if v["id"].is_null() {
        (202, String::new())
    } else {
        let result = if v["method"] == "initialize" {
            r#"{"protocolVersion":"2025-11-25","capabilities":{}}"#
        } else {
            r#"{"content":[{"type":"text","text":"ok"}]}"#
        };
        (
            200,
            format!(r#"{{"jsonrpc":"2.0","id":{},"result":{result}}}"#, v["id"]),
        )
    };
    let session = if v["method"] == "initialize" && behaviour != Behaviour::NoSession {
        "mcp-session-id: s1\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{session}\
         content-length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// The result of `request` as one event of a chunked event stream that never ends; waits
/// (bounded) for the client to close.
fn sse_held_open(stream: &mut TcpStream, request: &Seen) {
    let v: serde_json::Value = serde_json::from_str(&request.body).unwrap_or_default();
    let event = format!(
        "event: message\ndata: {{\"jsonrpc\":\"2.0\",\"id\":{},\"result\":{{\"content\":[]}}}}\n\n",
        v["id"]
    );
    let reply = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n\
         {:x}\r\n{event}\r\n",
        event.len()
    );
    if stream.write_all(reply.as_bytes()).is_err() {
        return;
    }
    let _ = stream.set_read_timeout(Some(RUN_BOUND));
    let mut sink = [0u8; 1024];
    while matches!(stream.read(&mut sink), Ok(n) if n > 0) {}
}

/// A head announcing 1 MB, then a byte every 50 ms until the client goes away.
fn trickle(stream: &mut TcpStream) {
    let head =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1000000\r\n\r\n";
    if stream.write_all(head.as_bytes()).is_err() {
        return;
    }
    while stream.write_all(b" ").is_ok() {
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!(
        "mcpyard-loadgen-hostile-{}-{name}",
        std::process::id()
    ))
}

/// Runs the binary with `args`, killing it and failing the test if it outlives
/// `RUN_BOUND`.
fn loadgen_bounded(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {BIN}: {e}"));
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > RUN_BOUND => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("mcpyard-loadgen {args:?} still running after {RUN_BOUND:?}: hung");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => panic!("wait: {e}"),
        }
    }
    child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("output: {e}"))
}

fn json_file(path: &PathBuf) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path:?}: {e}"));
    let _ = std::fs::remove_file(path);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {path:?}: {e}"))
}

/// What one bounded `mcpyard-loadgen run` against a target gave.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
    /// Its `--json` report.
    report: serde_json::Value,
}

/// Runs `mcpyard-loadgen run --url <target> <extra> --json <temp file>`, bounded in time.
fn run_against(target: &Target, name: &str, extra: &[&str]) -> Ran {
    let json = temp_path(name);
    let path = json.to_str().unwrap_or_default().to_owned();
    let mut args = vec!["run", "--url", &target.url];
    args.extend_from_slice(extra);
    args.extend(["--json", &path]);
    let out = loadgen_bounded(&args);
    Ran {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report: json_file(&json),
    }
}

#[test]
fn a_target_that_trickles_its_answer_times_out_at_the_deadline_and_is_recorded() {
    let target = Target::start(Behaviour::Trickle);
    let extra = [
        "--connections",
        "1",
        "--duration",
        "1s",
        "--timeout",
        "300ms",
    ];
    let Ran {
        stdout, report: v, ..
    } = run_against(&target, "trickle.json", &extra);
    let timeouts = v["errors"]["timeout"].as_u64().unwrap_or(0);
    assert!(timeouts >= 1, "{stdout}");
    assert_eq!(v["requests_ok"], 0, "{stdout}");
    // Every timed-out request is in the histogram with errors, at the timeout or more.
    assert_eq!(v["response_with_errors_us"]["count"], timeouts, "{stdout}");
    let least = v["response_with_errors_us"]["percentiles"][0]["value_us"]
        .as_u64()
        .unwrap_or(0);
    assert!(least >= 299_000, "{least} µs: {stdout}");
    assert!(stdout.contains("with errors"), "{stdout}");
}

#[test]
fn an_idle_keep_alive_connection_the_target_closed_is_a_reconnect_not_an_error() {
    let target = Target::start(Behaviour::CloseAfterEachAnswer);
    let extra = ["--connections", "1", "--duration", "300ms"];
    let ran = run_against(&target, "close.json", &extra);
    let (stdout, v) = (&ran.stdout, &ran.report);
    assert!(ran.ok, "{stdout}{}", ran.stderr);
    let ok = v["requests_ok"].as_u64().unwrap_or(0);
    assert!(ok >= 1, "{stdout}");
    assert_eq!(v["errors"]["io"], 0, "{stdout}");
    // Every request after the first on a connection found it closed and reconnected.
    assert!(v["reconnects"].as_u64().unwrap_or(0) >= ok, "{stdout}");
}

#[test]
fn every_request_after_initialize_names_the_protocol_version_even_without_a_session() {
    let target = Target::start(Behaviour::NoSession);
    let extra = ["--connections", "1", "--duration", "200ms"];
    let ran = run_against(&target, "version.json", &extra);
    assert!(ran.ok, "{}", ran.stderr);
    let seen = target.seen();
    // The probe's session and the connection's each begin with initialize.
    let after: Vec<&Seen> = seen.iter().filter(|r| r.method() != "initialize").collect();
    assert!(
        after.len() >= 4,
        "{} requests after initialize",
        after.len()
    );
    for request in after {
        assert_eq!(
            request.header("mcp-protocol-version"),
            Some("2025-11-25"),
            "{} without mcp-protocol-version",
            request.method()
        );
        assert_eq!(request.header("mcp-session-id"), None);
    }
}

#[test]
fn a_run_ends_every_session_it_opened() {
    let target = Target::start(Behaviour::Plain);
    let extra = ["--connections", "2", "--duration", "200ms"];
    let ran = run_against(&target, "sessions.json", &extra);
    assert!(ran.ok, "{}", ran.stderr);
    let seen = target.seen();
    let opened = seen.iter().filter(|r| r.method() == "initialize").count();
    let deleted: Vec<&Seen> = seen.iter().filter(|r| r.method() == "DELETE").collect();
    // The probe's session and one per connection.
    assert_eq!(opened, 3, "initialize requests among {}", seen.len());
    assert_eq!(
        deleted.len(),
        opened,
        "DELETEs among {} requests",
        seen.len()
    );
    assert!(
        deleted
            .iter()
            .all(|r| r.header("mcp-session-id") == Some("s1"))
    );
}

#[test]
fn an_event_stream_answer_completes_at_its_result_though_the_stream_stays_open() {
    let target = Target::start(Behaviour::SseHeldOpen);
    let extra = [
        "--connections",
        "1",
        "--duration",
        "500ms",
        "--timeout",
        "5s",
    ];
    let ran = run_against(&target, "sse.json", &extra);
    let (stdout, v) = (&ran.stdout, &ran.report);
    assert!(ran.ok, "{stdout}{}", ran.stderr);
    assert!(v["requests_ok"].as_u64().unwrap_or(0) >= 1, "{stdout}");
    assert_eq!(v["errors"]["timeout"], 0, "{stdout}");
    // Latency ends at the result, not at the 5 s timeout: the max is below it.
    let max = v["response_us"]["max"].as_u64().unwrap_or(u64::MAX);
    assert!(max < 5_000_000, "{max} µs: {stdout}");
}

#[test]
fn a_close_in_the_middle_of_an_answer_is_still_an_io_error() {
    let target = Target::start(Behaviour::CutMidAnswer);
    let extra = ["--connections", "1", "--duration", "300ms"];
    let v = run_against(&target, "cut.json", &extra).report;
    assert!(v["errors"]["io"].as_u64().unwrap_or(0) >= 1, "{v}");
    assert_eq!(v["requests_ok"], 0, "{v}");
}
