//! `run` for the request scenarios: one thread per keep-alive connection, open or closed
//! loop, merged into one summary.
//!
//! Flow: probe the target once (a clear error if it is down or not MCP) → start the
//! connection threads, which each connect and open a session → start the clock together
//! → `schedule::drive_open` / `drive_closed` → merge every thread's `Recorder`.
//!
//! Threads (not an event loop) because each connection paces itself with the sleep-then-
//! spin pacer in `schedule.rs`, which needs its own thread to be precise; `--connections`
//! is bounded by `CONNECTIONS_MAX` accordingly.

use std::fmt;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Barrier, OnceLock};
use std::time::{Duration, Instant};

use bytes::BytesMut;

use crate::args::{Mode, ReceiveTime, RunArgs, Scenario, Target};
use crate::arrival::lead;
use crate::client::{Conn, Response, SendFailure};
use crate::limits::{DRAIN_GRACE, PROGRESS_AFTER, PROGRESS_INTERVAL, SESSION_END_TIMEOUT};
use crate::mcp::{self, ToolsCall};
use crate::record::{ErrorKind, Failure, Recorder, Served};
use crate::schedule::{
    Exchange, MonotonicClock, Progress, Schedule, Window, drive_closed, drive_open, nanos,
};
use crate::series::Series;
use crate::tls::ClientTls;

/// Why a run could not produce a result.
#[derive(Debug)]
pub enum RunError {
    /// The target failed the first exchange; `hint` says what that probably means.
    Probe {
        /// What the probe was doing.
        doing: &'static str,
        /// What went wrong.
        failure: Failure,
        /// A likely cause, for people.
        hint: &'static str,
    },
    /// A connection thread could not be started or ended abnormally.
    Thread(String),
    /// A report file could not be written.
    Write {
        /// The file.
        path: String,
        /// Why.
        err: std::io::Error,
    },
    /// The run finished without one successful request.
    NoSamples,
    /// The TLS settings could not be used (an unreadable CA file, a host TLS cannot verify).
    Tls(String),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Probe {
                doing,
                failure,
                hint,
            } => write!(f, "{doing} failed: {failure}; {hint}"),
            RunError::Thread(why) => write!(f, "connection thread: {why}"),
            RunError::Write { path, err } => write!(f, "cannot write {path}: {err}"),
            RunError::NoSamples => f.write_str("no successful request was recorded"),
            RunError::Tls(why) => write!(f, "TLS: {why}"),
        }
    }
}

impl std::error::Error for RunError {}

/// What every connection needs to know, shared read-only.
#[derive(Debug)]
pub struct Plan {
    /// The MCP endpoint.
    pub target: Target,
    /// Its address, resolved once for the whole run.
    pub addr: SocketAddr,
    /// The workload.
    pub scenario: Scenario,
    /// Connect timeout and the deadline of each exchange (send to response complete).
    pub timeout: Duration,
    /// Where a response's latency ends.
    pub receive_time: ReceiveTime,
    /// The pre-rendered tools/call.
    pub call: ToolsCall,
    /// Requests go without a session (`--no-initialize`).
    pub no_initialize: bool,
    /// The id of every request (`--request-id`); `None` counts up from 1.
    pub request_id: Option<u64>,
    /// A new connection per request (`--new-connection`).
    pub new_connection: bool,
    /// TLS to an https target, shared by every connection (and its resumption cache).
    pub tls: Option<ClientTls>,
    /// End each session after this many requests (`--session-calls`; 0: never).
    pub session_calls: u64,
}

impl Plan {
    /// Builds the plan of `args`; fails if an https target's TLS settings are unusable.
    pub fn new(args: &RunArgs) -> Result<Plan, RunError> {
        let tls = if args.target.tls {
            let host = crate::tls::host_of(&args.target.authority);
            Some(
                ClientTls::new(host, args.tls_ca.as_deref(), args.tls_resumption)
                    .map_err(RunError::Tls)?,
            )
        } else {
            None
        };
        let addr = crate::client::resolve(&args.target).map_err(|failure| RunError::Probe {
            doing: "resolving the target's host",
            failure,
            hint: "is the host name in --url right?",
        })?;
        Ok(Plan {
            target: args.target.clone(),
            addr,
            scenario: args.scenario,
            timeout: args.timeout,
            receive_time: args.receive_time,
            call: ToolsCall::new(&args.tool, args.args_json.as_deref(), args.params_bytes),
            no_initialize: args.no_initialize,
            request_id: args.request_id,
            new_connection: args.new_connection,
            tls,
            session_calls: args.session_calls,
        })
    }
}

/// One connection's MCP client: a keep-alive connection (reopened after a failure) and a
/// session (reopened after a 404).
#[derive(Debug)]
pub struct Session {
    plan: Arc<Plan>,
    conn: Option<Conn>,
    /// `Some` once initialized; the inner `None` is a server that issued no session id.
    session: Option<Option<String>>,
    next_id: u64,
    body: BytesMut,
    /// Requests sent on the current session (for `--session-calls`).
    calls: u64,
    /// Keep-alive connections found closed by the target while idle, and reopened.
    pub reconnects: u64,
    /// Connect timeout and exchange deadline: `--timeout`, shorter for the final DELETE.
    timeout: Duration,
}

impl Session {
    /// Creates a client that connects lazily.
    pub fn new(plan: Arc<Plan>) -> Session {
        Session {
            conn: None,
            session: None,
            next_id: 1,
            body: BytesMut::new(),
            calls: 0,
            reconnects: 0,
            timeout: plan.timeout,
            plan,
        }
    }

    /// Sends `self.body` and returns the response; a broken or closing connection is
    /// dropped so the next call reconnects. `initialized` is false only for initialize
    /// itself (every later request carries `mcp-protocol-version`).
    ///
    /// A keep-alive connection the target closed while it sat idle is no failure: it is
    /// counted in `reconnects` and the request is sent once more on a new connection,
    /// within what is left of its deadline.
    fn send(
        &mut self,
        method: &str,
        session: Option<&str>,
        initialized: bool,
    ) -> Result<Response, Failure> {
        let started = Instant::now();
        match self.send_once(method, session, initialized) {
            Err(SendFailure::IdleClosed(failure)) => {
                self.reconnects += 1;
                let full = self.timeout;
                let left = full.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(failure);
                }
                // The new connection and the request on it get what is left; the
                // exchanges after it the whole timeout again.
                self.timeout = left;
                let again = self.send_once(method, session, initialized);
                self.timeout = full;
                if let Some(conn) = &mut self.conn {
                    conn.set_timeout(full);
                }
                again.map_err(SendFailure::into_failure)
            }
            other => other.map_err(SendFailure::into_failure),
        }
    }

    /// One attempt of [`Session::send`], connecting first if there is no connection.
    fn send_once(
        &mut self,
        method: &str,
        session: Option<&str>,
        initialized: bool,
    ) -> Result<Response, SendFailure> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            slot @ None => slot.insert(Conn::open(
                &self.plan.target,
                self.plan.addr,
                self.timeout,
                self.plan.receive_time,
                self.plan.tls.as_ref(),
            )?),
        };
        match conn.send(method, &self.plan.target, session, initialized, &self.body) {
            Ok(response) => {
                if self.plan.new_connection {
                    if let Some(conn) = self.conn.take() {
                        conn.close();
                    }
                } else if !response.keep_alive {
                    self.conn = None;
                }
                Ok(response)
            }
            Err(failure) => {
                self.conn = None;
                Err(failure)
            }
        }
    }

    fn take_id(&mut self) -> u64 {
        if let Some(id) = self.plan.request_id {
            return id;
        }
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// initialize + notifications/initialized; returns the session id (if the server gave
    /// one).
    pub fn open_session(&mut self) -> Result<Option<String>, Failure> {
        let id = self.take_id();
        self.body.clear();
        mcp::initialize(id, &mut self.body);
        let response = self.send("POST", None, false)?;
        mcp::expect_result(&response, id, "initialize")?;
        let session = response.session;
        self.body.clear();
        mcp::initialized(&mut self.body);
        let response = self.send("POST", session.as_deref(), true)?;
        mcp::expect_status(&response, 202, "notifications/initialized")?;
        Ok(session)
    }

    fn close_session(&mut self, session: &str) -> Result<(), Failure> {
        self.body.clear();
        let response = self.send("DELETE", Some(session), true)?;
        // MCP 2025-11-25: a server that does not let clients end sessions answers 405.
        if response.status == 405 {
            return Ok(());
        }
        mcp::expect_status(&response, 0, "DELETE")
    }

    /// Ends the session this client holds, if any (best effort: the run's figures are
    /// taken, and a target that does not answer in `SESSION_END_TIMEOUT` is left to
    /// expire it), so a run leaves no sessions behind on the target.
    pub fn end(&mut self) {
        let Some(Some(session)) = self.session.take() else {
            return;
        };
        self.timeout = self.timeout.min(SESSION_END_TIMEOUT);
        if let Some(conn) = &mut self.conn {
            conn.set_timeout(self.timeout);
        }
        let _ = self.close_session(&session);
        if let Some(conn) = self.conn.take() {
            conn.close();
        }
    }

    /// Opens the session if there is none yet (setup before the clock starts); with
    /// `--no-initialize` there is never one to open.
    pub fn ensure_session(&mut self) -> Result<(), Failure> {
        if self.session.is_none() && self.plan.no_initialize {
            self.session = Some(None);
        }
        if self.session.is_none() && self.plan.scenario != Scenario::Initialize {
            self.session = Some(self.open_session()?);
        }
        Ok(())
    }

    fn request(&mut self, method: &'static str) -> Result<Served, Failure> {
        if self.plan.session_calls > 0 && self.calls >= self.plan.session_calls {
            // Session churn: this session has had its share; the new one is opened below,
            // and both exchanges count in this request's latency.
            self.calls = 0;
            if let Some(Some(session)) = self.session.take() {
                self.close_session(&session)?;
            }
        }
        self.ensure_session()?;
        self.calls += 1;
        let id = self.take_id();
        self.body.clear();
        match self.plan.scenario {
            Scenario::ToolsList => mcp::bare_request(id, method, &mut self.body),
            Scenario::ToolsCallProgress => self.plan.call.encode(id, true, &mut self.body),
            _ => self.plan.call.encode(id, false, &mut self.body),
        }
        let session = self.session.clone().flatten();
        let response = self.send("POST", session.as_deref(), !self.plan.no_initialize)?;
        if response.status == 404 && !self.plan.no_initialize {
            // MCP: 404 means the session is gone; start a new one next time.
            self.session = None;
            self.calls = 0;
        }
        let mut served = mcp::expect_result(&response, id, method)?;
        served.lead = lead(response.arrived, Instant::now());
        Ok(served)
    }
}

impl Exchange for Session {
    fn exchange(&mut self) -> Result<Served, Failure> {
        match self.plan.scenario {
            Scenario::Initialize => {
                if let Some(session) = self.open_session()? {
                    self.close_session(&session)?;
                }
                Ok(Served::default())
            }
            Scenario::ToolsList => self.request("tools/list"),
            _ => self.request("tools/call"),
        }
    }
}

/// Checks the target before any load: a session (initialize + initialized) and, for the
/// request scenarios, one full iteration. Returns a clear error if the target is down, not
/// MCP, or refuses the scenario.
pub fn probe(plan: &Arc<Plan>) -> Result<(), RunError> {
    let mut session = Session::new(Arc::clone(plan));
    let probe_error = |doing, failure: Failure| {
        let hint = match failure.kind {
            ErrorKind::Connect if failure.detail.contains("TLS handshake") => {
                "the target's TLS was refused (is --tls-ca the CA that signed its certificate?)"
            }
            ErrorKind::Connect => "is the target running and listening there?",
            ErrorKind::HttpStatus | ErrorKind::Decode => {
                "is the URL an MCP Streamable HTTP endpoint (POST /mcp with JSON-RPC)?"
            }
            ErrorKind::JsonRpc => "the target is MCP but refused this request",
            ErrorKind::Timeout => "the target accepted the connection but did not answer",
            ErrorKind::Io => "the target closed the connection",
        };
        RunError::Probe {
            doing,
            failure,
            hint,
        }
    };
    session
        .ensure_session()
        .map_err(|f| probe_error("initialize", f))?;
    if matches!(plan.scenario, Scenario::IdleSessions | Scenario::Fanout) {
        session.end();
        return Ok(());
    }
    let first = session.exchange();
    session.end();
    first.map_err(|f| probe_error("the first request", f))?;
    Ok(())
}

/// Runs a request scenario and returns every connection's measurements merged.
pub fn run(args: &RunArgs) -> Result<Recorder, RunError> {
    let plan = Arc::new(Plan::new(args)?);
    probe(&plan)?;
    let window = Window {
        warmup_end: nanos(args.warmup),
        end: nanos(args.warmup + args.duration),
        drain_end: nanos(args.warmup + args.duration + DRAIN_GRACE),
    };
    let connections = u32::try_from(args.connections)
        .map_err(|_| RunError::Thread("too many connections".into()))?;
    let series = match &args.intervals {
        Some(path) => Some(
            Series::create(
                path,
                nanos(args.interval),
                window.warmup_end,
                args.connections,
            )
            .map_err(|err| RunError::Write {
                path: path.display().to_string(),
                err,
            })?,
        ),
        None => None,
    };
    let progress = Arc::new(Progress::default());
    let start = Arc::new(Barrier::new(args.connections + 1));
    let origin: Arc<OnceLock<Instant>> = Arc::new(OnceLock::new());
    let mut threads = Vec::with_capacity(args.connections);
    for index in 0..connections {
        let job = Job {
            plan: Arc::clone(&plan),
            mode: args.mode,
            window,
            connections,
            index,
            progress: Arc::clone(&progress),
            start: Arc::clone(&start),
            origin: Arc::clone(&origin),
            series: series.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("conn-{index}"))
            .spawn(move || job.run())
            .map_err(|e| RunError::Thread(e.to_string()))?;
        threads.push(thread);
    }
    start.wait(); // every connection has connected and opened its session
    let _ = origin.set(Instant::now());
    if let Some(series) = &series {
        series.start_now();
    }
    start.wait(); // go
    show_progress(args, &progress, &threads);
    let mut total = Recorder::new(window.warmup_end);
    for thread in threads {
        let rec = thread
            .join()
            .map_err(|_| RunError::Thread("a connection thread panicked".into()))?;
        total
            .merge(&rec)
            .map_err(|e| RunError::Thread(format!("histogram merge: {e}")))?;
    }
    if let (Some(series), Some(path)) = (&series, &args.intervals)
        && let Some(err) = series.take_error()
    {
        return Err(RunError::Write {
            path: path.display().to_string(),
            err,
        });
    }
    Ok(total)
}

/// What one connection thread runs.
struct Job {
    plan: Arc<Plan>,
    mode: Mode,
    window: Window,
    connections: u32,
    index: u32,
    progress: Arc<Progress>,
    start: Arc<Barrier>,
    origin: Arc<OnceLock<Instant>>,
    series: Option<Arc<Series>>,
}

impl Job {
    fn run(self) -> Recorder {
        // Precise sleeps matter only to the pacer; if the kernel refuses, pacing is merely
        // less precise (the spin window absorbs most of it).
        let _ = crate::sys::set_precise_timer_slack();
        let mut session = Session::new(Arc::clone(&self.plan));
        let mut rec = Recorder::new(self.window.warmup_end);
        rec.series = self
            .series
            .as_ref()
            .map(|s| s.recorder(self.index as usize));
        // A failed setup is retried by the first request, whose latency then shows it.
        let _ = session.ensure_session();
        self.start.wait();
        self.start.wait();
        let clock = MonotonicClock::new(self.origin.get().copied().unwrap_or_else(Instant::now));
        match self.mode {
            Mode::Open { rate } => {
                let schedule = Schedule::new(0, rate, self.connections, self.index);
                drive_open(
                    &clock,
                    &mut session,
                    &schedule,
                    &self.window,
                    &mut rec,
                    &self.progress,
                );
            }
            Mode::Closed => {
                drive_closed(&clock, &mut session, &self.window, &mut rec, &self.progress);
            }
        }
        rec.reconnects = session.reconnects;
        session.end();
        rec.finish_series();
        rec
    }
}

/// Rewrites a progress line on stderr every second while the threads run, for runs longer
/// than `PROGRESS_AFTER`; otherwise just returns.
fn show_progress<T>(args: &RunArgs, progress: &Progress, threads: &[std::thread::JoinHandle<T>]) {
    if args.warmup + args.duration <= PROGRESS_AFTER {
        return;
    }
    let started = Instant::now();
    let mut last = (started, 0u64);
    let mut printed = false;
    while !threads.iter().all(|t| t.is_finished()) {
        std::thread::sleep(PROGRESS_INTERVAL);
        let now = Instant::now();
        let done = progress.completed.load(Ordering::Relaxed);
        let failed = progress.failed.load(Ordering::Relaxed);
        let rate = (done - last.1) as f64 / now.duration_since(last.0).as_secs_f64().max(1e-9);
        last = (now, done);
        let phase = if now.duration_since(started) < args.warmup {
            "warm-up"
        } else {
            "measure"
        };
        eprint!(
            "\r{phase} {:>6.1} s  {done:>10} done  {rate:>9.0}/s  {failed} errors   ",
            now.duration_since(started).as_secs_f64()
        );
        let _ = std::io::stderr().flush();
        printed = true;
    }
    if printed {
        eprintln!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Command, parse};
    use mcpyard::http::{RequestDecoder, RequestEvent};
    use std::io::Read;
    use std::net::TcpListener;

    /// The fixed answer of the stateless reference below, whatever it is asked.
    const FIXED: &str = r#"{"jsonrpc":"2.0","id":77,"result":{"tools":[]}}"#;

    /// What the reference saw of one request: method, whether it named a session, body.
    type Seen = (String, bool, String);

    /// A stateless reference on one connection: answers every request with `FIXED` and
    /// returns what it was asked once the client closes.
    fn reference() -> (String, std::thread::JoinHandle<Vec<Seen>>) {
        scripted(|_, _, _| (200, None, FIXED.to_owned()))
    }

    /// A server on one connection whose answer to each request is `answer(method, session
    /// header, body)` = (status, `mcp-session-id` to send, body); returns what it was asked
    /// once the client closes.
    fn scripted(
        answer: impl Fn(&str, Option<&str>, &str) -> (u16, Option<String>, String) + Send + 'static,
    ) -> (String, std::thread::JoinHandle<Vec<Seen>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("addr: {e}"));
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap_or_else(|e| panic!("accept: {e}"));
            let mut decoder = RequestDecoder::new(1 << 20);
            let mut buf = BytesMut::new();
            let mut seen = Vec::new();
            let mut head = None;
            let mut body = Vec::new();
            let mut scratch = [0u8; 4096];
            loop {
                while let Ok(Some(event)) = decoder.decode(&mut buf) {
                    match event {
                        RequestEvent::Head(h) => head = Some(h),
                        RequestEvent::Data(d) => body.extend_from_slice(&d),
                        RequestEvent::End => {
                            let h = head.take().unwrap_or_else(|| panic!("no head"));
                            let text = String::from_utf8_lossy(&body).into_owned();
                            let session = h
                                .headers
                                .get("mcp-session-id")
                                .map(|v| String::from_utf8_lossy(v).into_owned());
                            let method = format!("{:?}", h.method);
                            let (status, new_session, reply_body) =
                                answer(&method, session.as_deref(), &text);
                            seen.push((method, session.is_some(), text));
                            body.clear();
                            let header = new_session
                                .map_or(String::new(), |s| format!("mcp-session-id: {s}\r\n"));
                            let reply = format!(
                                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                                 {header}content-length: {}\r\n\r\n{reply_body}",
                                reply_body.len()
                            );
                            let _ = stream.write_all(reply.as_bytes());
                        }
                    }
                }
                match stream.read(&mut scratch) {
                    Ok(0) | Err(_) => return seen,
                    Ok(n) => buf.extend_from_slice(scratch.get(..n).unwrap_or_default()),
                }
            }
        });
        (format!("http://{addr}/mcp"), server)
    }

    fn plan(line: &str) -> Arc<Plan> {
        let words: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        let Ok(Command::Run(args)) = parse(&words) else {
            panic!("{line}");
        };
        Arc::new(Plan::new(&args).unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn a_stateless_reference_is_asked_only_the_requests_with_the_fixed_id() {
        let (url, server) = reference();
        let plan = plan(&format!(
            "run --url {url} --scenario tools-list --no-initialize --request-id 77"
        ));
        let mut session = Session::new(Arc::clone(&plan));
        for _ in 0..3 {
            let served = session.exchange();
            assert!(served.is_ok(), "{served:?}");
        }
        drop(session);
        let seen = server.join().unwrap_or_else(|_| panic!("server"));
        // No initialize, no notifications/initialized: the three tools/list alone.
        assert_eq!(seen.len(), 3, "{seen:?}");
        for (method, session, body) in &seen {
            assert_eq!(method, "Post");
            assert!(!session, "no mcp-session-id without a session");
            let v: serde_json::Value =
                serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
            assert_eq!(v["method"], "tools/list");
            assert_eq!(v["id"], 77);
        }
    }

    #[test]
    fn without_the_fixed_id_a_fixed_answer_is_a_decode_failure() {
        let (url, server) = reference();
        let plan = plan(&format!(
            "run --url {url} --scenario tools-list --no-initialize"
        ));
        let mut session = Session::new(plan);
        let failure = session.exchange().err().map(|f| f.kind);
        assert_eq!(failure, Some(ErrorKind::Decode), "id 1 asked, 77 answered");
        drop(session);
        let seen = server.join().unwrap_or_else(|_| panic!("server"));
        assert_eq!(seen.len(), 1);
        assert!(
            seen.iter()
                .all(|(_, session, body)| !session && body.contains("\"id\":1"))
        );
    }

    #[test]
    fn session_calls_end_each_session_after_n_requests_and_open_a_new_one() {
        // An MCP server in miniature: sessions s1, s2, ... from initialize; 202 for
        // notifications; every request answered with its own id.
        let opened = std::sync::atomic::AtomicU64::new(0);
        let (url, server) = scripted(move |method, _, body| {
            if method == "Delete" {
                return (200, None, String::new());
            }
            let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            let id = v["id"].clone();
            if id.is_null() {
                return (202, None, String::new());
            }
            let result = if v["method"] == "initialize" {
                r#"{"protocolVersion":"2025-11-25","capabilities":{}}"#
            } else {
                r#"{"content":[]}"#
            };
            let session = (v["method"] == "initialize").then(|| {
                let n = opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                format!("s{n}")
            });
            (
                200,
                session,
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{result}}}"#),
            )
        });
        let plan = plan(&format!("run --url {url} --session-calls 2"));
        let mut session = Session::new(Arc::clone(&plan));
        // Set-up opens the first session before the clock starts; then five calls.
        assert!(session.ensure_session().is_ok());
        for _ in 0..5 {
            let served = session.exchange();
            assert!(served.is_ok(), "{served:?}");
        }
        drop(session);
        let seen = server.join().unwrap_or_else(|_| panic!("server"));
        let steps: Vec<String> = seen
            .iter()
            .map(|(method, _, body)| {
                let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
                match v["method"].as_str() {
                    Some(m) => m.to_owned(),
                    None => method.to_uppercase(),
                }
            })
            .collect();
        let session = [
            "initialize",
            "notifications/initialized",
            "tools/call",
            "tools/call",
            "DELETE",
        ];
        let mut expected: Vec<&str> = [session, session].concat();
        expected.extend(&session[..3]);
        assert_eq!(steps, expected);
    }
}
