//! Shared scaffolding of the raw-HTTP scenario tests: spawns the real `mcpyard` binary on
//! `127.0.0.1:0` against the embedded demo toolkit, and speaks HTTP/1.1 and SSE to it over
//! plain `TcpStream`s (no HTTP client crate, so every byte on the wire is the test's).
//!
//! Each scenario runs once per runtime mode ({1, 2 workers} × {io_uring, epoll}) through
//! [`each_mode`]. Readiness comes from the gateway's `listening` lines, never from sleeping.

#![allow(dead_code)] // each test file uses a different part of this module

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long any single read may block before the test fails.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// One runtime configuration of the gateway.
#[derive(Clone, Copy, Debug)]
pub struct Mode {
    pub workers: usize,
    pub io: &'static str,
}

/// Every mode each scenario must pass in.
pub const MODES: [Mode; 4] = [
    Mode {
        workers: 1,
        io: "uring",
    },
    Mode {
        workers: 1,
        io: "epoll",
    },
    Mode {
        workers: 2,
        io: "uring",
    },
    Mode {
        workers: 2,
        io: "epoll",
    },
];

/// Runs `body` against a fresh gateway in every mode, one after the other.
pub fn each_mode(body: impl Fn(&Gateway)) {
    for mode in MODES {
        eprintln!("--- mode {mode:?}");
        let gw = Gateway::start(mode);
        body(&gw);
    }
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A running gateway process; killed (if still running) when dropped.
pub struct Gateway {
    child: Child,
    pub mode: Mode,
    /// The `north` MCP endpoint's address.
    pub addr: SocketAddr,
    /// The Prometheus endpoint's address.
    pub metrics: SocketAddr,
    config: PathBuf,
    /// The gateway's stderr; kept only when the test fails.
    log: PathBuf,
}

impl Gateway {
    /// Writes a config for `mode` with the demo exit, spawns the binary and waits for its
    /// `listening` lines.
    pub fn start(mode: Mode) -> Gateway {
        Gateway::start_with(mode, "{kind: demo, progress_interval: 20ms}")
    }

    /// Like [`Gateway::start`], with `exit` (a YAML flow mapping) as the binding named
    /// `exit` that the server forwards to.
    pub fn start_with(mode: Mode, exit: &str) -> Gateway {
        Gateway::start_bindings(mode, &format!("  exit: {exit}\n"))
    }

    /// Like [`Gateway::start`], with `bindings` (YAML lines indented by two spaces, under
    /// `bindings:`) defining the binding named `exit` that the server forwards to and any
    /// binding that one needs.
    pub fn start_bindings(mode: Mode, bindings: &str) -> Gateway {
        Gateway::start_north(mode, "", bindings)
    }

    /// Like [`Gateway::start_bindings`], with `north` (`, key: value` pairs) added to the
    /// server binding's own settings.
    pub fn start_north(mode: Mode, north: &str, bindings: &str) -> Gateway {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let stem = format!("mcpyard-rawtest-{}-{n}", std::process::id());
        let config = std::env::temp_dir().join(format!("{stem}.yaml"));
        let yaml = format!(
            "runtime: {{workers: {}, io: {}}}\n\
             telemetry: {{metrics: 127.0.0.1:0}}\n\
             bindings:\n  \
               north: {{kind: server, listen: 127.0.0.1:0, path: /mcp, exit: exit{north}}}\n\
             {bindings}",
            mode.workers, mode.io
        );
        std::fs::write(&config, yaml).expect("write config");
        let log = std::env::temp_dir().join(format!("{stem}.log"));
        let log_file = std::fs::File::create(&log).expect("create log file");
        let mut child = Command::new(env!("CARGO_BIN_EXE_mcpyard"))
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .spawn()
            .expect("spawn mcpyard");
        let rx = stdout_lines(&mut child);
        let ready_by = Instant::now() + Duration::from_secs(10);
        let (mut addr, mut metrics) = (None, None);
        while addr.is_none() || metrics.is_none() {
            let wait = ready_by.saturating_duration_since(Instant::now());
            let Ok(line) = rx.recv_timeout(wait) else {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "mcpyard not listening within 10 s ({mode:?}); see {}",
                    log.display()
                );
            };
            let mut words = line.split_whitespace();
            if words.next() != Some("listening") {
                continue;
            }
            let name = words.next();
            let bound: Option<SocketAddr> = words.next().and_then(|a| a.parse().ok());
            match name {
                Some("north") => addr = bound,
                Some("metrics") => metrics = bound,
                _ => {}
            }
        }
        Gateway {
            child,
            mode,
            addr: addr.expect("north address"),
            metrics: metrics.expect("metrics address"),
            config,
            log,
        }
    }

    /// A fresh connection to the MCP endpoint.
    pub fn conn(&self) -> Conn {
        Conn::open(self.addr)
    }

    /// `Host` header value for this gateway.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// Sends raw bytes on a fresh connection and reads one response.
    pub fn raw(&self, bytes: &[u8]) -> Response {
        let mut c = self.conn();
        c.send(bytes);
        c.read_response()
    }

    /// A POST of `body` to /mcp with the usual MCP headers plus `extra`.
    pub fn post_bytes(&self, session: Option<&str>, extra: &[(&str, &str)], body: &str) -> Vec<u8> {
        let mut headers = vec![
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ];
        if let Some(s) = session {
            headers.push(("mcp-session-id", s));
        }
        headers.extend_from_slice(extra);
        request(&self.host(), "POST", "/mcp", &headers, body.as_bytes())
    }

    /// POSTs `body` on a fresh connection and reads the (non-streamed) response.
    pub fn post(&self, session: Option<&str>, body: &str) -> Response {
        self.raw(&self.post_bytes(session, &[], body))
    }

    /// Runs `initialize` and returns the session id.
    pub fn initialize(&self) -> String {
        let r = self.post(None, &initialize_body(1, "2025-11-25"));
        assert_eq!(r.status, 200, "initialize: {}", r.text());
        r.header("mcp-session-id")
            .expect("mcp-session-id")
            .to_owned()
    }

    /// Asserts the gateway still serves a fresh `initialize` (after malformed input).
    pub fn assert_serving(&self) {
        let session = self.initialize();
        assert_eq!(session.len(), 26);
    }

    /// A GET of the event stream for `session` with extra headers.
    pub fn get_bytes(&self, session: &str, extra: &[(&str, &str)]) -> Vec<u8> {
        let mut headers = vec![("accept", "text/event-stream"), ("mcp-session-id", session)];
        headers.extend_from_slice(extra);
        request(&self.host(), "GET", "/mcp", &headers, b"")
    }

    /// The gateway's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM (unless the process already exited) and waits (bounded) for the
    /// process to exit.
    pub fn terminate(&mut self, within: Duration) -> ExitStatus {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            return status;
        }
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
        assert_eq!(rc, 0, "kill(SIGTERM)");
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "gateway did not exit within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.config);
        if std::thread::panicking() {
            eprintln!("gateway {:?} log kept at {}", self.mode, self.log.display());
        } else {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// The body of an `initialize` request.
pub fn initialize_body(id: u32, version: &str) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{"protocolVersion":"{version}","capabilities":{{}},"clientInfo":{{"name":"rawtest","version":"0"}}}}}}"#
    )
}

/// Encodes one HTTP/1.1 request; a body (or a POST) gets a `content-length`.
pub fn request(
    host: &str,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut out = format!("{method} {target} HTTP/1.1\r\nhost: {host}\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        out.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// A response's status line and headers.
#[derive(Debug, Clone)]
pub struct Head {
    pub status: u16,
    /// Header fields in order, names lower-cased.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    fn chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    }
}

/// A whole response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON; panics with the body if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

/// One client connection with its unread input.
pub struct Conn {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    /// Connects with [`READ_TIMEOUT`] on reads.
    pub fn open(addr: SocketAddr) -> Conn {
        Conn::of(TcpStream::connect(addr).expect("connect"))
    }

    fn of(stream: TcpStream) -> Conn {
        stream
            .set_read_timeout(Some(READ_TIMEOUT))
            .expect("read timeout");
        stream.set_nodelay(true).expect("nodelay");
        Conn {
            stream,
            buf: Vec::new(),
        }
    }

    /// Like [`Conn::open`], with the receive buffer set to `bytes` before connecting, so
    /// the window it offers stays that small: a peer writing more than the buffers on the
    /// way hold waits for this side's reads.
    pub fn open_narrow(addr: SocketAddr, bytes: usize) -> Conn {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            None,
        )
        .expect("socket");
        socket.set_recv_buffer_size(bytes).expect("SO_RCVBUF");
        socket.connect(&addr.into()).expect("connect");
        Conn::of(socket.into())
    }

    /// Writes all of `bytes`.
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// Reads more input into the buffer; returns how much (0 = EOF or reset).
    fn fill(&mut self) -> usize {
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk) {
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                n
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                panic!(
                    "read timed out; unread so far: {:?}",
                    String::from_utf8_lossy(&self.buf)
                )
            }
            Err(_) => 0,
        }
    }

    /// Takes bytes up to and including `delim`, reading as needed.
    fn take_until(&mut self, delim: &[u8]) -> Vec<u8> {
        loop {
            if let Some(at) = self.buf.windows(delim.len()).position(|w| w == delim) {
                return self.buf.drain(..at + delim.len()).collect();
            }
            assert!(
                self.fill() > 0,
                "EOF before {delim:?}; have {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        }
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(self.fill() > 0, "EOF inside a body");
        }
        self.buf.drain(..n).collect()
    }

    /// Reads a response head, skipping any 1xx interim responses.
    pub fn read_head(&mut self) -> Head {
        loop {
            let raw = self.take_until(b"\r\n\r\n");
            let text = String::from_utf8(raw).expect("head is UTF-8");
            let mut lines = text.split("\r\n");
            let status_line = lines.next().unwrap_or_default();
            let mut parts = status_line.splitn(3, ' ');
            assert_eq!(
                parts.next(),
                Some("HTTP/1.1"),
                "status line {status_line:?}"
            );
            let status: u16 = parts
                .next()
                .and_then(|s| s.parse().ok())
                .expect("status code");
            let headers = lines
                .filter(|l| !l.is_empty())
                .map(|l| {
                    let (n, v) = l.split_once(':').expect("header has a colon");
                    (n.trim().to_ascii_lowercase(), v.trim().to_owned())
                })
                .collect();
            if (100..200).contains(&status) {
                continue;
            }
            return Head { status, headers };
        }
    }

    /// Reads one chunk of a chunked body; `None` at the terminating chunk (trailers read).
    pub fn next_chunk(&mut self) -> Option<Vec<u8>> {
        let line = self.take_until(b"\r\n");
        let size_text = String::from_utf8_lossy(&line[..line.len() - 2]).into_owned();
        let size_hex = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_hex, 16)
            .unwrap_or_else(|_| panic!("chunk size {size_text:?}"));
        if size == 0 {
            // Trailers (none expected) end with an empty line.
            while self.take_until(b"\r\n").len() > 2 {}
            return None;
        }
        let data = self.take(size);
        assert_eq!(self.take(2), b"\r\n", "chunk not followed by CRLF");
        Some(data)
    }

    /// Reads the body that `head` announces.
    pub fn read_body(&mut self, head: &Head) -> Vec<u8> {
        if head.chunked() {
            let mut body = Vec::new();
            while let Some(c) = self.next_chunk() {
                body.extend_from_slice(&c);
            }
            return body;
        }
        if let Some(len) = head.header("content-length") {
            return self.take(len.parse().expect("content-length"));
        }
        if head.status == 204 || head.status == 304 {
            return Vec::new();
        }
        while self.fill() > 0 {}
        std::mem::take(&mut self.buf)
    }

    /// Reads one whole response.
    pub fn read_response(&mut self) -> Response {
        let head = self.read_head();
        let body = self.read_body(&head);
        Response {
            status: head.status,
            headers: head.headers,
            body,
        }
    }

    /// True if the peer closed the connection (after any buffered input).
    pub fn closed(&mut self) -> bool {
        self.buf.is_empty() && self.fill() == 0
    }

    /// Turns this connection, whose response head announced SSE, into an event reader.
    pub fn into_events(self) -> Events {
        Events {
            conn: self,
            pending: Vec::new(),
            ended: false,
            largest_chunk: 0,
        }
    }
}

/// One SSE event as it appeared on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event's exact bytes, including the blank line that ends it.
    pub raw: String,
    pub id: Option<String>,
    /// The `data:` lines joined with '\n'.
    pub data: String,
}

impl Event {
    /// The data parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data not JSON ({e}): {}", self.raw))
    }
}

/// Reads SSE events incrementally from a chunked response body.
pub struct Events {
    pub conn: Conn,
    pending: Vec<u8>,
    ended: bool,
    /// The longest chunk of the body read so far.
    pub largest_chunk: usize,
}

impl Events {
    /// The next event (comments-only blocks skipped); `None` once the body has ended.
    pub fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(at) = self.pending.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.pending.drain(..at + 2).collect();
                let raw = String::from_utf8(raw).expect("event is UTF-8");
                let (mut id, mut data, mut fields) = (None, Vec::new(), 0);
                for line in raw.trim_end_matches('\n').split('\n') {
                    if line.starts_with(':') {
                        continue;
                    }
                    fields += 1;
                    let (name, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value);
                    match name {
                        "id" => id = Some(value.to_owned()),
                        "data" => data.push(value.to_owned()),
                        _ => {}
                    }
                }
                if fields == 0 {
                    continue;
                }
                return Some(Event {
                    raw,
                    id,
                    data: data.join("\n"),
                });
            }
            if self.ended {
                assert!(
                    self.pending.is_empty(),
                    "stream ended mid-event: {:?}",
                    String::from_utf8_lossy(&self.pending)
                );
                return None;
            }
            match self.conn.next_chunk() {
                Some(c) => {
                    self.largest_chunk = self.largest_chunk.max(c.len());
                    self.pending.extend_from_slice(&c);
                }
                None => self.ended = true,
            }
        }
    }

    /// Reads the body until what is read of the next event contains `needle` (without
    /// taking the event).
    pub fn read_into(&mut self, needle: &[u8]) {
        while !self.pending.windows(needle.len()).any(|w| w == needle) {
            let chunk = self.conn.next_chunk().expect("the body goes on");
            self.pending.extend_from_slice(&chunk);
        }
    }

    /// The next event, which must exist.
    pub fn expect(&mut self) -> Event {
        self.next().expect("another event before the stream ended")
    }
}

/// Opens an SSE response: sends `bytes`, asserts a 200 `text/event-stream` head.
pub fn open_events(gw: &Gateway, bytes: &[u8]) -> (Head, Events) {
    let mut c = gw.conn();
    c.send(bytes);
    let head = c.read_head();
    assert_eq!(head.status, 200, "{head:?}");
    assert_eq!(
        head.header("content-type"),
        Some("text/event-stream"),
        "{head:?}"
    );
    assert_eq!(
        head.header("transfer-encoding"),
        Some("chunked"),
        "{head:?}"
    );
    (head, c.into_events())
}

/// Scrapes the metrics endpoint.
pub fn scrape(gw: &Gateway) -> String {
    let mut c = Conn::open(gw.metrics);
    c.send(&request(
        &gw.metrics.to_string(),
        "GET",
        "/metrics",
        &[("connection", "close")],
        b"",
    ));
    let r = c.read_response();
    assert_eq!(r.status, 200);
    r.text()
}

/// How many `method` requests ended with `outcome` (`mcpyard_request_seconds`), in the
/// scraped `text`.
pub fn requests_counted(text: &str, method: &str, outcome: &str) -> u64 {
    let series =
        format!("mcpyard_request_seconds_count{{method=\"{method}\",outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(series.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// How long a scrape may take to show what a finished exchange recorded: a request's
/// metrics are recorded just after its response is written, so a scrape sent as soon as
/// the response arrives can come first.
const METRICS_SETTLE: Duration = Duration::from_secs(5);

/// Scrapes until `ready` holds for the text, for at most [`METRICS_SETTLE`]; panics with
/// the last text and `what` if it never does.
pub fn scrape_until(gw: &Gateway, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let until = Instant::now() + METRICS_SETTLE;
    loop {
        let text = scrape(gw);
        if ready(&text) {
            return text;
        }
        assert!(
            Instant::now() < until,
            "metrics never showed {what} within {METRICS_SETTLE:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The fast Rust upstream MCP server (`mcpyard-loadgen upstream`), killed when dropped.
pub struct Upstream {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// After [`Upstream::kill`]: the port, bound and not listening, so connections to it
    /// are refused and no listener of a test running beside this one can take it over
    /// (which a gateway still pointed here would then reach instead).
    held: Option<socket2::Socket>,
}

impl Upstream {
    /// Starts the fixture with extra arguments (`--sse`, `--progress 3`, `--delay-ms 50`,
    /// ...). It is built by `cargo build --workspace` next to the mcpyard binary.
    pub fn start(args: &[&str]) -> Upstream {
        let bin =
            std::path::Path::new(env!("CARGO_BIN_EXE_mcpyard")).with_file_name("mcpyard-loadgen");
        assert!(
            bin.exists(),
            "{} is missing: run `cargo build --release --workspace` first",
            bin.display()
        );
        let mut child = Command::new(&bin)
            .args(["upstream", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the upstream fixture");
        let rx = stdout_lines(&mut child);
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the fixture prints `listening <addr>` within 10 s");
        let addr = line
            .strip_prefix("listening ")
            .and_then(|a| a.trim().parse().ok())
            .unwrap_or_else(|| panic!("unexpected fixture line {line:?}"));
        Upstream {
            child,
            addr,
            held: None,
        }
    }

    /// The client-binding YAML for this upstream, with extra `key: value` pairs.
    pub fn client_exit(&self, extra: &str) -> String {
        format!(
            "{{kind: client, server: \"http://{}/mcp\"{extra}}}",
            self.addr
        )
    }

    /// Kills the fixture now (an upstream that dies); its port stays refused.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.held.is_none() {
            self.held = hold_port(self.addr);
        }
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Binds `addr` without listening (best effort: `None` if it cannot be had).
fn hold_port(addr: SocketAddr) -> Option<socket2::Socket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        None,
    )
    .ok()?;
    // The dead fixture's connections may linger in TIME_WAIT on this port.
    socket.set_reuse_address(true).ok()?;
    socket.bind(&addr.into()).ok()?;
    Some(socket)
}

/// The child's stdout lines, read on a thread so a process that never gets ready fails
/// the test after a bound instead of hanging it; the thread keeps draining stdout after.
fn stdout_lines(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    rx
}
