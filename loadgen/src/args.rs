//! Command-line parsing: `upstream` (the MCP fixture) and `run` (the load generator).
//!
//! Every value is checked against a bound in `limits.rs` and refused with an [`ArgError`]
//! that names the flag; nothing here panics on what the user typed.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::limits::{
    CONNECTIONS_MAX, DRAIN_GRACE, FANOUT_ROUNDS_MAX, FIXTURE_DELAY_MAX, FIXTURE_PAGE_SIZE_MAX,
    FIXTURE_PROGRESS_MAX, FIXTURE_RESULT_BYTES_MAX, FIXTURE_TOOLS_MAX, FIXTURE_WORKERS_MAX,
    INTERVAL_DEFAULT, INTERVAL_MIN, PARAMS_BYTES_MAX, RATE_MAX, REQUEST_ID_MAX,
    REQUEST_TIMEOUT_DEFAULT, RUN_DURATION_MAX, SERIES_PENDING_MAX, SESSION_CALLS_MAX, SESSIONS_MAX,
};
use crate::tls::Resumption;

/// The usage text printed for `--help` and after an argument error.
pub const USAGE: &str = "\
usage:
  mcpyard-loadgen upstream --listen ADDR [--result-bytes N] [--delay-ms F] [--progress N]
                           [--progress-interval-ms F] [--delay-from arrival|read] [--sse]
                           [--workers N] [--tools N] [--page-size P]
                           [--tls-cert PEM --tls-key PEM]
  mcpyard-loadgen run --url http[s]://HOST:PORT/PATH [--scenario S] [--rate R | --mode closed]
                      [--connections N] [--duration D] [--warmup D] [--timeout D]
                      [--params-bytes N] [--tool NAME] [--args JSON]
                      [--receive-time kernel|read] [--sessions N] [--trigger URL] [--rounds N]
                      [--no-initialize] [--request-id N] [--new-connection]
                      [--session-calls N] [--tls-ca PEM] [--tls-resumption on|off]
                      [--json FILE] [--hgrm FILE] [--svg FILE]
                      [--intervals FILE [--interval D]] [--header 'NAME: VALUE' ...]
scenarios: initialize, tools-call (default), tools-call-progress, tools-list,
           idle-sessions, fanout
durations: 10s, 500ms, 250us, 2m, or plain seconds (1.5)
--no-initialize: no session (a stateless reference that answers every POST alike);
--request-id N: every request carries id N (a reference answering fixed bytes matches it)
--timeout D: deadline of each request, from its send to its answer's last byte (10s);
       a request past it counts as a timeout and its connection is reopened
--new-connection: a new connection (and TLS handshake) per request, closed after it
--session-calls N: end each session (DELETE) after N requests; the next request opens a
       new one (initialize + initialized), inside its own latency (session churn)
--intervals FILE: one JSON line per --interval (default 1s) while the run goes on: ok,
       errors by kind, response-time percentiles of the requests intended in it, and the
       exchanges that finished in it (request scenarios)
https: trusts --tls-ca (else the platform roots), SNI from the URL host; request scenarios
       only; --tls-resumption off makes every new connection a full handshake (default on)
--header 'NAME: VALUE': sent with every request, e.g. 'authorization: Bearer ...' (at
       most 8; not one of the headers the generator writes itself)
tools: echo, big, then tool_00003 ... up to --tools in all (default 2); --page-size 0
       (default) answers tools/list in one page
`mcpyard-loadgen --url ... [--connections N] [--seconds S]` (no subcommand) is `run`.";

/// A command-line mistake; `Display` names the flag and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgError {
    /// `--help` was asked for: print the usage and exit 0... or 2 with nothing else to say.
    Help,
    /// No subcommand and no flags.
    NoCommand,
    /// A word that is not a flag this command knows.
    Unknown(String),
    /// A flag given last, without its value.
    MissingValue(&'static str),
    /// A required flag is absent.
    Required(&'static str),
    /// A value that does not parse or is out of range.
    Invalid {
        /// The flag.
        flag: &'static str,
        /// What the user wrote.
        value: String,
        /// What was expected.
        expected: String,
    },
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgError::Help => f.write_str("help requested"),
            ArgError::NoCommand => f.write_str("a subcommand (upstream or run) is required"),
            ArgError::Unknown(word) => write!(f, "unknown argument {word:?}"),
            ArgError::MissingValue(flag) => write!(f, "{flag} needs a value"),
            ArgError::Required(flag) => write!(f, "{flag} is required"),
            ArgError::Invalid {
                flag,
                value,
                expected,
            } => write!(f, "{flag} {value:?}: expected {expected}"),
        }
    }
}

impl std::error::Error for ArgError {}

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Serve as the MCP upstream fixture.
    Upstream(UpstreamArgs),
    /// Generate load (boxed: it is much larger than the fixture's settings).
    Run(Box<RunArgs>),
}

/// Settings of the upstream fixture.
#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamArgs {
    /// Where to listen; port 0 picks one (printed on stdout).
    pub listen: SocketAddr,
    /// Size of the text payload of every tools/call result.
    pub result_bytes: usize,
    /// How long each tools/call takes before its result.
    pub delay: Duration,
    /// Progress notifications per tools/call that carries a progress token.
    pub progress: u32,
    /// Spacing of those notifications.
    pub progress_interval: Duration,
    /// Where the delay (and the progress schedule) of a reply starts.
    pub delay_from: DelayFrom,
    /// Answer every request as an SSE stream instead of JSON.
    pub sse: bool,
    /// Worker threads, each with its own SO_REUSEPORT listener.
    pub workers: usize,
    /// Tools in the list: `echo`, `big`, then generated ones (at least 1).
    pub tools: usize,
    /// Tools per tools/list page; 0 answers with the whole list in one page.
    pub page_size: usize,
    /// Serve TLS with this certificate chain (PEM) and `tls_key`.
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `tls_cert`.
    pub tls_key: Option<PathBuf>,
}

/// Where the fixture's delay of a reply starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DelayFrom {
    /// When the request's last bytes arrived, by the kernel's receive timestamp, so the
    /// fixture's own wake-up latency is inside the delay instead of added to it (a
    /// pipelined request starts when the reply before it was written).
    Arrival,
    /// When the fixture read the request.
    Read,
}

impl DelayFrom {
    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            DelayFrom::Arrival => "arrival",
            DelayFrom::Read => "read",
        }
    }
}

/// Which workload `run` generates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// initialize + notifications/initialized + DELETE per iteration (session churn).
    Initialize,
    /// tools/call on a session per connection.
    ToolsCall,
    /// tools/call with a progress token, reading the SSE answer to its end.
    ToolsCallProgress,
    /// tools/list on a session per connection.
    ToolsList,
    /// Open N sessions with GET streams and hold them.
    IdleSessions,
    /// Open N sessions with GET streams, trigger list_changed, time each delivery.
    Fanout,
}

impl Scenario {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::Initialize => "initialize",
            Scenario::ToolsCall => "tools-call",
            Scenario::ToolsCallProgress => "tools-call-progress",
            Scenario::ToolsList => "tools-list",
            Scenario::IdleSessions => "idle-sessions",
            Scenario::Fanout => "fanout",
        }
    }

    fn parse(value: &str) -> Option<Scenario> {
        [
            Scenario::Initialize,
            Scenario::ToolsCall,
            Scenario::ToolsCallProgress,
            Scenario::ToolsList,
            Scenario::IdleSessions,
            Scenario::Fanout,
        ]
        .into_iter()
        .find(|s| s.name() == value)
    }
}

/// How requests are paced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Constant rate over all connections, latency from the intended send time.
    Open {
        /// Requests per second, over all connections.
        rate: u64,
    },
    /// Back to back on each connection, latency from the actual send.
    Closed,
}

/// When a response counts as received (the end of its latency).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReceiveTime {
    /// When its last bytes arrived, by the kernel's receive timestamp (`SO_TIMESTAMPNS`),
    /// so the reading thread's wake-up latency is not counted; the read time where the
    /// kernel gives no stamp.
    Kernel,
    /// When the reading thread got the last bytes from `read`.
    Read,
}

impl ReceiveTime {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            ReceiveTime::Kernel => "kernel",
            ReceiveTime::Read => "read",
        }
    }
}

/// An `http://` or `https://` URL split the way the client needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// `host:port` as written: the `Host` header and what is connected to.
    pub authority: String,
    /// The request target, starting with `/`.
    pub path: String,
    /// `https://`: TLS to the target, the URL's host verified (and sent as SNI).
    pub tls: bool,
    /// `--header NAME: VALUE`, sent with every request (an `Authorization` for a gateway
    /// that checks tokens, say). At most `HEADERS_MAX`, each checked by [`parse_header`].
    pub headers: Vec<(&'static str, String)>,
}

impl Target {
    /// Parses `http[s]://host[:port][/path]`; the port defaults to 80 (443 for https) and
    /// the path to `/`.
    pub fn parse(flag: &'static str, url: &str) -> Result<Target, ArgError> {
        let invalid = |expected: &str| ArgError::Invalid {
            flag,
            value: url.to_owned(),
            expected: expected.to_owned(),
        };
        let (rest, tls) = match url.strip_prefix("https://") {
            Some(rest) => (rest, true),
            None => (
                url.strip_prefix("http://")
                    .ok_or_else(|| invalid("an http:// or https:// URL"))?,
                false,
            ),
        };
        let (authority, path) = match rest.find('/') {
            Some(at) => rest.split_at(at),
            None => (rest, "/"),
        };
        if authority.is_empty() || !authority.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid("a host after the scheme"));
        }
        if !path.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid("a path of visible ASCII"));
        }
        let authority = if authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| !p.contains(']'))
        {
            authority.to_owned()
        } else {
            format!("{authority}:{}", if tls { 443 } else { 80 })
        };
        Ok(Target {
            authority,
            path: path.to_owned(),
            tls,
            headers: Vec::new(),
        })
    }
}

/// Settings of a load run.
#[derive(Clone, Debug, PartialEq)]
pub struct RunArgs {
    /// The MCP endpoint.
    pub target: Target,
    /// The workload.
    pub scenario: Scenario,
    /// Open or closed loop.
    pub mode: Mode,
    /// Keep-alive connections (one thread each).
    pub connections: usize,
    /// Measured time, after the warm-up.
    pub duration: Duration,
    /// Unrecorded time at the start.
    pub warmup: Duration,
    /// Per-request deadline: from a request's send to its response's last byte (and the
    /// connect timeout).
    pub timeout: Duration,
    /// Where a response's latency ends (request scenarios).
    pub receive_time: ReceiveTime,
    /// Bytes of the `text` argument of each generated tools/call.
    pub params_bytes: usize,
    /// The tool to call.
    pub tool: String,
    /// tools/call arguments as a JSON object, replacing the generated `text` argument.
    pub args_json: Option<String>,
    /// Sessions for idle-sessions and fanout.
    pub sessions: usize,
    /// The URL POSTed to trigger list_changed in fanout.
    pub trigger: Option<Target>,
    /// Fan-out rounds.
    pub rounds: u32,
    /// Send requests without a session: no initialize, no `mcp-session-id`. For a
    /// stateless reference (a web server answering every POST with the same bytes) that
    /// the request scenarios are compared against.
    pub no_initialize: bool,
    /// Every request carries this id instead of 1, 2, 3, ...: a reference answering fixed
    /// bytes then answers the id asked, and the id check stays as strict as ever.
    pub request_id: Option<u64>,
    /// Where to write the JSON report.
    pub json: Option<PathBuf>,
    /// Where to write the HdrHistogram percentile distribution.
    pub hgrm: Option<PathBuf>,
    /// Where to write the SVG percentile plot.
    pub svg: Option<PathBuf>,
    /// A new connection per request, closed after its response (`--new-connection`): with
    /// https every request pays a TLS handshake.
    pub new_connection: bool,
    /// CA certificates (PEM) an https target is verified with; the platform roots without.
    pub tls_ca: Option<PathBuf>,
    /// Whether new TLS connections may resume earlier sessions.
    pub tls_resumption: Resumption,
    /// End each session after this many requests and open a new one (0: never).
    pub session_calls: u64,
    /// Where to write one JSON line per interval while the run goes on.
    pub intervals: Option<PathBuf>,
    /// The length of those intervals.
    pub interval: Duration,
}

/// Parses the whole command line (without the program name).
pub fn parse(words: &[String]) -> Result<Command, ArgError> {
    match words.first().map(String::as_str) {
        None => Err(ArgError::NoCommand),
        Some("--help" | "-h" | "help") => Err(ArgError::Help),
        Some("upstream") => {
            parse_upstream(words.get(1..).unwrap_or_default()).map(Command::Upstream)
        }
        Some("run") => {
            parse_run(words.get(1..).unwrap_or_default()).map(|a| Command::Run(Box::new(a)))
        }
        // The first version took `--url ...` with no subcommand; keep that working.
        Some(flag) if flag.starts_with("--") => parse_run(words).map(|a| Command::Run(Box::new(a))),
        Some(other) => Err(ArgError::Unknown(other.to_owned())),
    }
}

/// Walks `--flag value` pairs; `take` consumes a value, `flag` says which flag is current.
struct Flags<'a> {
    words: std::slice::Iter<'a, String>,
}

impl<'a> Flags<'a> {
    fn next_flag(&mut self) -> Option<&'a str> {
        self.words.next().map(String::as_str)
    }

    fn value(&mut self, flag: &'static str) -> Result<&'a str, ArgError> {
        self.words
            .next()
            .map(String::as_str)
            .ok_or(ArgError::MissingValue(flag))
    }

    fn number<T: TryFrom<u64>>(&mut self, flag: &'static str, max: u64) -> Result<T, ArgError> {
        let value = self.value(flag)?;
        parse_number(flag, value, max)
    }

    fn duration(&mut self, flag: &'static str, max: Duration) -> Result<Duration, ArgError> {
        let value = self.value(flag)?;
        parse_duration(flag, value, "s", max)
    }

    fn millis(&mut self, flag: &'static str, max: Duration) -> Result<Duration, ArgError> {
        let value = self.value(flag)?;
        parse_duration(flag, value, "ms", max)
    }
}

fn parse_number<T: TryFrom<u64>>(flag: &'static str, value: &str, max: u64) -> Result<T, ArgError> {
    let invalid = || ArgError::Invalid {
        flag,
        value: value.to_owned(),
        expected: format!("a whole number from 0 to {max}"),
    };
    let n: u64 = value.parse().map_err(|_| invalid())?;
    if n > max {
        return Err(invalid());
    }
    T::try_from(n).map_err(|_| invalid())
}

/// Parses `10s`, `500ms`, `250us`, `2m`, or a plain number in `default_unit`.
fn parse_duration(
    flag: &'static str,
    value: &str,
    default_unit: &str,
    max: Duration,
) -> Result<Duration, ArgError> {
    let invalid = || ArgError::Invalid {
        flag,
        value: value.to_owned(),
        expected: format!(
            "a duration up to {} s, like 10s, 500ms or 250us",
            max.as_secs()
        ),
    };
    let split = value
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let unit = if unit.is_empty() { default_unit } else { unit };
    let scale = match unit {
        "us" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        _ => return Err(invalid()),
    };
    let n: f64 = number.parse().map_err(|_| invalid())?;
    let secs = n * scale;
    if !secs.is_finite() || secs < 0.0 || secs > max.as_secs_f64() {
        return Err(invalid());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_upstream(words: &[String]) -> Result<UpstreamArgs, ArgError> {
    let mut listen = None;
    let mut a = UpstreamArgs {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        result_bytes: 1024,
        delay: Duration::ZERO,
        progress: 0,
        progress_interval: Duration::ZERO,
        delay_from: DelayFrom::Arrival,
        sse: false,
        workers: 1,
        tools: 2,
        page_size: 0,
        tls_cert: None,
        tls_key: None,
    };
    let mut flags = Flags {
        words: words.iter(),
    };
    while let Some(flag) = flags.next_flag() {
        match flag {
            "--listen" => {
                let value = flags.value("--listen")?;
                listen = Some(value.parse().map_err(|_| ArgError::Invalid {
                    flag: "--listen",
                    value: value.to_owned(),
                    expected: "IP:PORT, like 127.0.0.1:0".into(),
                })?);
            }
            "--result-bytes" => {
                a.result_bytes = flags.number("--result-bytes", FIXTURE_RESULT_BYTES_MAX as u64)?
            }
            "--delay-ms" => a.delay = flags.millis("--delay-ms", FIXTURE_DELAY_MAX)?,
            "--progress" => {
                a.progress = flags.number("--progress", u64::from(FIXTURE_PROGRESS_MAX))?
            }
            "--progress-interval-ms" => {
                a.progress_interval = flags.millis("--progress-interval-ms", FIXTURE_DELAY_MAX)?
            }
            "--delay-from" => {
                let value = flags.value("--delay-from")?;
                a.delay_from = [DelayFrom::Arrival, DelayFrom::Read]
                    .into_iter()
                    .find(|d| d.name() == value)
                    .ok_or_else(|| ArgError::Invalid {
                        flag: "--delay-from",
                        value: value.to_owned(),
                        expected: "arrival or read".into(),
                    })?;
            }
            "--sse" => a.sse = true,
            "--workers" => a.workers = flags.number("--workers", FIXTURE_WORKERS_MAX as u64)?,
            "--tools" => a.tools = flags.number("--tools", FIXTURE_TOOLS_MAX as u64)?,
            "--page-size" => {
                a.page_size = flags.number("--page-size", FIXTURE_PAGE_SIZE_MAX as u64)?
            }
            "--tls-cert" => a.tls_cert = Some(PathBuf::from(flags.value("--tls-cert")?)),
            "--tls-key" => a.tls_key = Some(PathBuf::from(flags.value("--tls-key")?)),
            "--help" | "-h" => return Err(ArgError::Help),
            other => return Err(ArgError::Unknown(other.to_owned())),
        }
    }
    a.listen = listen.ok_or(ArgError::Required("--listen"))?;
    match (&a.tls_cert, &a.tls_key) {
        (Some(_), None) => return Err(ArgError::Required("--tls-key")),
        (None, Some(_)) => return Err(ArgError::Required("--tls-cert")),
        _ => {}
    }
    for (flag, value) in [("--workers", a.workers), ("--tools", a.tools)] {
        if value == 0 {
            return Err(ArgError::Invalid {
                flag,
                value: "0".into(),
                expected: "at least 1".into(),
            });
        }
    }
    Ok(a)
}

fn default_run(target: Target) -> RunArgs {
    RunArgs {
        target,
        scenario: Scenario::ToolsCall,
        mode: Mode::Closed,
        connections: 4,
        duration: Duration::from_secs(5),
        warmup: Duration::from_secs(1),
        timeout: REQUEST_TIMEOUT_DEFAULT,
        receive_time: ReceiveTime::Kernel,
        params_bytes: 16,
        tool: "echo".into(),
        args_json: None,
        sessions: 1000,
        trigger: None,
        rounds: 1,
        no_initialize: false,
        request_id: None,
        json: None,
        hgrm: None,
        svg: None,
        new_connection: false,
        tls_ca: None,
        tls_resumption: Resumption::On,
        session_calls: 0,
        intervals: None,
        interval: INTERVAL_DEFAULT,
    }
}

fn parse_run(words: &[String]) -> Result<RunArgs, ArgError> {
    let mut a = default_run(Target {
        authority: String::new(),
        path: String::new(),
        tls: false,
        headers: Vec::new(),
    });
    let mut headers = Vec::new();
    let (mut url, mut rate, mut closed) = (None, None, None);
    // Flags whose value another flag would silently override or ignore.
    let (mut params_bytes_given, mut interval_given) = (false, false);
    let mut flags = Flags {
        words: words.iter(),
    };
    while let Some(flag) = flags.next_flag() {
        match flag {
            "--url" => url = Some(Target::parse("--url", flags.value("--url")?)?),
            "--scenario" => {
                let value = flags.value("--scenario")?;
                a.scenario = Scenario::parse(value).ok_or_else(|| ArgError::Invalid {
                    flag: "--scenario",
                    value: value.to_owned(),
                    expected: "initialize, tools-call, tools-call-progress, tools-list, \
                               idle-sessions or fanout"
                        .into(),
                })?;
            }
            "--rate" => rate = Some(flags.number::<u64>("--rate", RATE_MAX)?),
            "--mode" => closed = Some(parse_mode(flags.value("--mode")?)?),
            "--connections" => {
                a.connections = flags.number("--connections", CONNECTIONS_MAX as u64)?
            }
            "--duration" | "--seconds" => {
                a.duration = flags.duration("--duration", RUN_DURATION_MAX)?
            }
            "--warmup" => a.warmup = flags.duration("--warmup", RUN_DURATION_MAX)?,
            "--timeout" => a.timeout = flags.duration("--timeout", RUN_DURATION_MAX)?,
            "--params-bytes" => {
                a.params_bytes = flags.number("--params-bytes", PARAMS_BYTES_MAX as u64)?;
                params_bytes_given = true;
            }
            "--receive-time" => {
                a.receive_time = parse_receive_time(flags.value("--receive-time")?)?
            }
            "--tool" => a.tool = flags.value("--tool")?.to_owned(),
            "--args" => a.args_json = Some(parse_args_json(flags.value("--args")?)?),
            "--sessions" => a.sessions = flags.number("--sessions", SESSIONS_MAX as u64)?,
            "--trigger" => a.trigger = Some(Target::parse("--trigger", flags.value("--trigger")?)?),
            "--rounds" => a.rounds = flags.number("--rounds", u64::from(FANOUT_ROUNDS_MAX))?,
            "--no-initialize" => a.no_initialize = true,
            "--request-id" => a.request_id = Some(flags.number("--request-id", REQUEST_ID_MAX)?),
            "--json" => a.json = Some(PathBuf::from(flags.value("--json")?)),
            "--hgrm" => a.hgrm = Some(PathBuf::from(flags.value("--hgrm")?)),
            "--svg" => a.svg = Some(PathBuf::from(flags.value("--svg")?)),
            "--new-connection" => a.new_connection = true,
            "--session-calls" => {
                a.session_calls = flags.number("--session-calls", SESSION_CALLS_MAX)?
            }
            "--intervals" => a.intervals = Some(PathBuf::from(flags.value("--intervals")?)),
            "--interval" => {
                a.interval = flags.duration("--interval", RUN_DURATION_MAX)?;
                interval_given = true;
            }
            "--tls-ca" => a.tls_ca = Some(PathBuf::from(flags.value("--tls-ca")?)),
            "--tls-resumption" => {
                let value = flags.value("--tls-resumption")?;
                a.tls_resumption = [Resumption::On, Resumption::Off]
                    .into_iter()
                    .find(|r| r.name() == value)
                    .ok_or_else(|| ArgError::Invalid {
                        flag: "--tls-resumption",
                        value: value.to_owned(),
                        expected: "on or off".into(),
                    })?;
            }
            "--header" => {
                if headers.len() == HEADERS_MAX {
                    return Err(ArgError::Invalid {
                        flag: "--header",
                        value: flags.value("--header")?.to_owned(),
                        expected: format!("at most {HEADERS_MAX} --header flags"),
                    });
                }
                headers.push(parse_header(flags.value("--header")?)?);
            }
            "--help" | "-h" => return Err(ArgError::Help),
            other => return Err(ArgError::Unknown(other.to_owned())),
        }
    }
    a.target = url.ok_or(ArgError::Required("--url"))?;
    a.target.headers = headers;
    a.mode = run_mode(rate, closed)?;
    if params_bytes_given && a.args_json.is_some() {
        return Err(ArgError::Invalid {
            flag: "--params-bytes",
            value: a.params_bytes.to_string(),
            expected: "no --params-bytes with --args (--args gives the arguments whole)".into(),
        });
    }
    if interval_given && a.intervals.is_none() {
        return Err(ArgError::Invalid {
            flag: "--interval",
            value: format!("{:?}", a.interval),
            expected: "--intervals FILE too (--interval is the length of its lines)".into(),
        });
    }
    check_run(&a)?;
    Ok(a)
}

/// Most `--header` flags.
pub const HEADERS_MAX: usize = 8;
/// Longest `--header` value.
pub const HEADER_VALUE_BYTES_MAX: usize = 8 * 1024;
/// Headers the generator writes itself, which `--header` may not replace.
const OWN_HEADERS: &[&str] = &[
    "host",
    "accept",
    "content-type",
    "content-length",
    "transfer-encoding",
    "connection",
    "mcp-session-id",
    "mcp-protocol-version",
];

/// `NAME: VALUE`: a token name that is not one of the generator's own, and a value of
/// visible ASCII, spaces and tabs (no CR, LF or NUL can reach the request head).
fn parse_header(value: &str) -> Result<(&'static str, String), ArgError> {
    let invalid = |expected: &str| ArgError::Invalid {
        flag: "--header",
        value: value.to_owned(),
        expected: expected.to_owned(),
    };
    let (name, field) = value
        .split_once(':')
        .ok_or_else(|| invalid("NAME: VALUE"))?;
    let name = name.trim().to_ascii_lowercase();
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || !name.bytes().all(token) {
        return Err(invalid(
            "a header name of letters, digits and - (NAME: VALUE)",
        ));
    }
    if OWN_HEADERS.contains(&name.as_str()) {
        return Err(invalid("a header the generator does not write itself"));
    }
    let field = field.trim();
    if field.len() > HEADER_VALUE_BYTES_MAX
        || !field
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
    {
        return Err(invalid(
            "a value of at most 8 KiB of visible ASCII, spaces and tabs",
        ));
    }
    // The head encoder takes `'static` names; a run parses at most HEADERS_MAX of them,
    // once, and they live as long as the run.
    Ok((Box::leak(name.into_boxed_str()), field.to_owned()))
}

/// The loop of `--rate` and `--mode` (`Some(true)`: closed). No rate or rate 0 is closed
/// loop; `--mode open` then has no rate to keep, and a rate with `--mode closed` would be
/// ignored: both are refused rather than silently run as something else.
fn run_mode(rate: Option<u64>, closed: Option<bool>) -> Result<Mode, ArgError> {
    match (rate, closed) {
        (Some(0) | None, Some(false)) => Err(ArgError::Invalid {
            flag: "--mode",
            value: "open".into(),
            expected: "a --rate above 0 with --mode open".into(),
        }),
        (Some(0) | None, _) => Ok(Mode::Closed),
        (Some(rate), Some(true)) => Err(ArgError::Invalid {
            flag: "--rate",
            value: rate.to_string(),
            expected: "0 or no --rate with --mode closed".into(),
        }),
        (Some(rate), _) => Ok(Mode::Open { rate }),
    }
}

fn parse_mode(value: &str) -> Result<bool, ArgError> {
    match value {
        "closed" => Ok(true),
        "open" => Ok(false),
        _ => Err(ArgError::Invalid {
            flag: "--mode",
            value: value.to_owned(),
            expected: "open or closed".into(),
        }),
    }
}

fn parse_receive_time(value: &str) -> Result<ReceiveTime, ArgError> {
    [ReceiveTime::Kernel, ReceiveTime::Read]
        .into_iter()
        .find(|r| r.name() == value)
        .ok_or_else(|| ArgError::Invalid {
            flag: "--receive-time",
            value: value.to_owned(),
            expected: "kernel or read".into(),
        })
}

fn parse_args_json(value: &str) -> Result<String, ArgError> {
    match serde_json::from_str::<serde_json::Value>(value) {
        Ok(v) if v.is_object() => Ok(value.to_owned()),
        _ => Err(ArgError::Invalid {
            flag: "--args",
            value: value.to_owned(),
            expected: "a JSON object".into(),
        }),
    }
}

fn check_run(a: &RunArgs) -> Result<(), ArgError> {
    let positive = |flag: &'static str, ok: bool, value: String| {
        if ok {
            Ok(())
        } else {
            Err(ArgError::Invalid {
                flag,
                value,
                expected: "a value above zero".into(),
            })
        }
    };
    positive(
        "--connections",
        a.connections > 0,
        a.connections.to_string(),
    )?;
    positive(
        "--duration",
        !a.duration.is_zero(),
        format!("{:?}", a.duration),
    )?;
    positive(
        "--timeout",
        !a.timeout.is_zero(),
        format!("{:?}", a.timeout),
    )?;
    positive("--sessions", a.sessions > 0, a.sessions.to_string())?;
    positive("--rounds", a.rounds > 0, a.rounds.to_string())?;
    if a.scenario == Scenario::Fanout && a.trigger.is_none() {
        return Err(ArgError::Required("--trigger"));
    }
    // A session is what those scenarios measure or need (their GET streams name it).
    let needs_session = matches!(
        a.scenario,
        Scenario::Initialize | Scenario::IdleSessions | Scenario::Fanout
    );
    if a.no_initialize && needs_session {
        return Err(ArgError::Invalid {
            flag: "--no-initialize",
            value: a.scenario.name().to_owned(),
            expected: "a request scenario: tools-call, tools-call-progress or tools-list".into(),
        });
    }
    // The GET-stream scenarios run on their own async client, which speaks plain HTTP.
    let streams = matches!(a.scenario, Scenario::IdleSessions | Scenario::Fanout);
    let tls = a.target.tls || a.trigger.as_ref().is_some_and(|t| t.tls);
    if streams && (tls || a.new_connection) {
        return Err(ArgError::Invalid {
            flag: if tls { "--url" } else { "--new-connection" },
            value: a.scenario.name().to_owned(),
            expected: "a request scenario (idle-sessions and fanout speak plain http:// on \
                       long-lived connections)"
                .into(),
        });
    }
    if a.scenario == Scenario::Fanout && a.mode != Mode::Closed {
        return Err(ArgError::Invalid {
            flag: "--rate",
            value: format!("{:?}", a.mode),
            expected: "no --rate: fanout is timed per trigger".into(),
        });
    }
    let requests = matches!(
        a.scenario,
        Scenario::ToolsCall | Scenario::ToolsCallProgress | Scenario::ToolsList
    );
    if a.session_calls > 0 && (!requests || a.no_initialize) {
        return Err(ArgError::Invalid {
            flag: "--session-calls",
            value: a.session_calls.to_string(),
            expected: "a request scenario (tools-call, tools-call-progress, tools-list) \
                       with sessions"
                .into(),
        });
    }
    if a.intervals.is_some() && streams {
        return Err(ArgError::Invalid {
            flag: "--intervals",
            value: a.scenario.name().to_owned(),
            expected: "a scenario that sends requests (not idle-sessions or fanout)".into(),
        });
    }
    if a.interval < INTERVAL_MIN {
        return Err(ArgError::Invalid {
            flag: "--interval",
            value: format!("{:?}", a.interval),
            expected: format!("at least {} ms", INTERVAL_MIN.as_millis()),
        });
    }
    // The lines held for a connection in a slow exchange must cover the longest one (a
    // request and its one resend, each up to --timeout, and the drain at the end), or an
    // ordinary timeout would write lines without that connection's part.
    let longest = a.timeout * 2 + DRAIN_GRACE;
    let held = u32::try_from(SERIES_PENDING_MAX).unwrap_or(u32::MAX);
    if a.intervals.is_some() && a.interval.saturating_mul(held) < longest {
        return Err(ArgError::Invalid {
            flag: "--interval",
            value: format!("{:?}", a.interval),
            expected: format!(
                "at least {} ms with --timeout {:?} ({SERIES_PENDING_MAX} lines cover twice \
                 the timeout and the drain)",
                (longest / held).as_millis() + 1,
                a.timeout
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn run_with_rate_is_open_loop() {
        let cmd = parse(&words(
            "run --url http://127.0.0.1:9/mcp --scenario tools-call --rate 5000 --connections 16 \
             --duration 10s --warmup 2s",
        ));
        let Ok(Command::Run(a)) = cmd else {
            panic!("parsed {cmd:?}");
        };
        assert_eq!(a.mode, Mode::Open { rate: 5000 });
        assert_eq!(a.connections, 16);
        assert_eq!(a.duration, Duration::from_secs(10));
        assert_eq!(a.warmup, Duration::from_secs(2));
        assert_eq!(a.target.authority, "127.0.0.1:9");
        assert_eq!(a.target.path, "/mcp");
    }

    #[test]
    fn rate_zero_and_mode_closed_are_closed_loop() {
        for line in [
            "run --url http://h:1/ --rate 0",
            "run --url http://h:1/ --mode closed",
            "--url http://h:1/mcp --connections 8 --seconds 3",
        ] {
            let Ok(Command::Run(a)) = parse(&words(line)) else {
                panic!("{line}");
            };
            assert_eq!(a.mode, Mode::Closed, "{line}");
        }
    }

    #[test]
    fn contradictory_flags_are_refused_not_silently_reinterpreted() {
        for (line, flag) in [
            ("run --url http://h:1/ --mode open", "--mode"),
            ("run --url http://h:1/ --mode open --rate 0", "--mode"),
            ("run --url http://h:1/ --mode closed --rate 5", "--rate"),
            (
                r#"run --url http://h:1/ --args {"a":1} --params-bytes 100"#,
                "--params-bytes",
            ),
            ("run --url http://h:1/ --interval 5s", "--interval"),
        ] {
            match parse(&words(line)) {
                Err(ArgError::Invalid { flag: got, .. }) => assert_eq!(got, flag, "{line}"),
                other => panic!("{line}: {other:?}"),
            }
        }
        let Ok(Command::Run(a)) = parse(&words("run --url http://h:1/ --mode open --rate 5"))
        else {
            panic!("open with a rate");
        };
        assert_eq!(a.mode, Mode::Open { rate: 5 });
    }

    #[test]
    fn receive_time_defaults_to_kernel_and_takes_read() {
        let Ok(Command::Run(a)) = parse(&words("run --url http://h:1/")) else {
            panic!("default");
        };
        assert_eq!(a.receive_time, ReceiveTime::Kernel);
        let Ok(Command::Run(a)) = parse(&words("run --url http://h:1/ --receive-time read")) else {
            panic!("read");
        };
        assert_eq!(a.receive_time, ReceiveTime::Read);
        assert!(matches!(
            parse(&words("run --url http://h:1/ --receive-time late")),
            Err(ArgError::Invalid {
                flag: "--receive-time",
                ..
            })
        ));
    }

    #[test]
    fn durations_take_units_and_refuse_nonsense() {
        let max = Duration::from_secs(100);
        assert_eq!(
            parse_duration("-d", "1.5", "s", max),
            Ok(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_duration("-d", "250us", "s", max),
            Ok(Duration::from_micros(250))
        );
        assert_eq!(
            parse_duration("-d", "1", "ms", max),
            Ok(Duration::from_millis(1))
        );
        assert_eq!(
            parse_duration("-d", "1m", "s", max),
            Ok(Duration::from_secs(60))
        );
        for bad in ["", "x", "1h", "-1s", "NaN", "inf", "101s"] {
            assert!(parse_duration("-d", bad, "s", max).is_err(), "{bad}");
        }
    }

    #[test]
    fn urls_need_http_and_get_a_default_port_and_path() {
        let t = Target::parse("--url", "http://example.test");
        assert_eq!(
            t,
            Ok(Target {
                authority: "example.test:80".into(),
                path: "/".into(),
                tls: false,
                headers: Vec::new(),
            })
        );
        assert!(Target::parse("--url", "ftp://h/mcp").is_err());
        assert!(Target::parse("--url", "http:///mcp").is_err());
    }

    #[test]
    fn headers_are_checked_and_bounded() {
        let mut line = words("run --url http://h:1/mcp --header");
        line.push("authorization: Bearer t".to_owned());
        let Ok(Command::Run(a)) = parse(&line) else {
            panic!("a header parses");
        };
        assert_eq!(
            a.target.headers,
            vec![("authorization", "Bearer t".to_owned())]
        );
        for bad in [
            "no-colon",
            "host: x",
            "bad name: x",
            "x-a: a\r\nx: y",
            ": v",
        ] {
            assert!(parse_header(bad).is_err(), "{bad:?}");
        }
        let many = format!(
            "run --url http://h:1/mcp{}",
            " --header x-a:1".repeat(HEADERS_MAX + 1)
        );
        assert!(parse(&words(&many)).is_err());
    }

    #[test]
    fn https_urls_default_to_443_and_take_the_tls_flags() {
        let t = Target::parse("--url", "https://localhost/mcp");
        assert_eq!(
            t,
            Ok(Target {
                authority: "localhost:443".into(),
                path: "/mcp".into(),
                tls: true,
                headers: Vec::new(),
            })
        );
        let line = "run --url https://127.0.0.1:8443/mcp --tls-ca ca.pem --new-connection \
                    --tls-resumption off";
        let Ok(Command::Run(a)) = parse(&words(line)) else {
            panic!("{line}");
        };
        assert!(a.target.tls && a.new_connection);
        assert_eq!(a.tls_ca, Some(PathBuf::from("ca.pem")));
        assert_eq!(a.tls_resumption, Resumption::Off);
        let Ok(Command::Run(a)) = parse(&words("run --url http://h:1/")) else {
            panic!("defaults");
        };
        assert!(!a.target.tls && !a.new_connection && a.tls_ca.is_none());
        assert_eq!(a.tls_resumption, Resumption::On);
        assert!(matches!(
            parse(&words("run --url https://h/ --tls-resumption maybe")),
            Err(ArgError::Invalid {
                flag: "--tls-resumption",
                ..
            })
        ));
        assert!(matches!(
            parse(&words("run --url https://h/ --scenario idle-sessions")),
            Err(ArgError::Invalid { flag: "--url", .. })
        ));
        assert!(matches!(
            parse(&words("upstream --listen 127.0.0.1:0 --tls-cert c.pem")),
            Err(ArgError::Required("--tls-key"))
        ));
    }

    #[test]
    fn errors_name_the_flag() {
        let err = parse(&words("run --url http://h:1/ --connections 0"));
        assert!(matches!(
            err,
            Err(ArgError::Invalid {
                flag: "--connections",
                ..
            })
        ));
        let err = parse(&words("run --url http://h:1/ --connections 99999"));
        assert!(matches!(
            err,
            Err(ArgError::Invalid {
                flag: "--connections",
                ..
            })
        ));
        assert_eq!(
            parse(&words("run --rate")),
            Err(ArgError::MissingValue("--rate"))
        );
        assert_eq!(
            parse(&words("run --rate 5")),
            Err(ArgError::Required("--url"))
        );
        assert_eq!(
            parse(&words("run --url http://h:1/ --scenario fanout")),
            Err(ArgError::Required("--trigger"))
        );
        assert_eq!(
            parse(&words("upstream")),
            Err(ArgError::Required("--listen"))
        );
    }

    #[test]
    fn session_churn_and_intervals_are_for_request_scenarios() {
        let Ok(Command::Run(a)) = parse(&words(
            "run --url http://h:1/ --session-calls 20 --intervals s.jsonl --interval 250ms",
        )) else {
            panic!("parse");
        };
        assert_eq!(a.session_calls, 20);
        assert_eq!(a.intervals, Some(PathBuf::from("s.jsonl")));
        assert_eq!(a.interval, Duration::from_millis(250));
        let Ok(Command::Run(a)) = parse(&words("run --url http://h:1/")) else {
            panic!("parse");
        };
        assert_eq!((a.session_calls, a.interval), (0, Duration::from_secs(1)));
        for (line, flag) in [
            (
                "run --url http://h:1/ --scenario initialize --session-calls 2",
                "--session-calls",
            ),
            (
                "run --url http://h:1/ --no-initialize --session-calls 2",
                "--session-calls",
            ),
            (
                "run --url http://h:1/ --scenario idle-sessions --intervals x",
                "--intervals",
            ),
            ("run --url http://h:1/ --interval 5ms", "--interval"),
        ] {
            match parse(&words(line)) {
                Err(ArgError::Invalid { flag: f, .. }) => assert_eq!(f, flag, "{line}"),
                other => panic!("{line}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_stateless_reference_takes_no_initialize_and_a_fixed_id() {
        let Ok(Command::Run(a)) = parse(&words("run --url http://h:1/ --scenario tools-list"))
        else {
            panic!("default");
        };
        assert_eq!((a.no_initialize, a.request_id), (false, None));
        let Ok(Command::Run(a)) = parse(&words(
            "run --url http://h:1/ --scenario tools-list --no-initialize --request-id 12345",
        )) else {
            panic!("reference");
        };
        assert_eq!((a.no_initialize, a.request_id), (true, Some(12345)));
        for scenario in [
            "initialize",
            "idle-sessions",
            "fanout --trigger http://h:2/",
        ] {
            let line = format!("run --url http://h:1/ --no-initialize --scenario {scenario}");
            assert!(
                matches!(
                    parse(&words(&line)),
                    Err(ArgError::Invalid {
                        flag: "--no-initialize",
                        ..
                    })
                ),
                "{line}"
            );
        }
        for bad in ["-1", "x", "9223372036854775808"] {
            let line = format!("run --url http://h:1/ --request-id {bad}");
            assert!(
                matches!(
                    parse(&words(&line)),
                    Err(ArgError::Invalid {
                        flag: "--request-id",
                        ..
                    })
                ),
                "{line}"
            );
        }
    }

    #[test]
    fn upstream_flags() {
        let cmd = parse(&words(
            "upstream --listen 127.0.0.1:0 --result-bytes 200 --delay-ms 1 --progress 3 \
             --progress-interval-ms 0.5 --sse --workers 2 --delay-from read",
        ));
        let Ok(Command::Upstream(a)) = cmd else {
            panic!("parsed {cmd:?}");
        };
        assert_eq!(a.result_bytes, 200);
        assert_eq!(a.delay, Duration::from_millis(1));
        assert_eq!(a.progress, 3);
        assert_eq!(a.progress_interval, Duration::from_micros(500));
        assert!(a.sse);
        assert_eq!(a.workers, 2);
        assert_eq!(a.delay_from, DelayFrom::Read);
        let Ok(Command::Upstream(a)) = parse(&words("upstream --listen 127.0.0.1:0")) else {
            panic!("default upstream");
        };
        assert_eq!(a.delay_from, DelayFrom::Arrival);
        assert_eq!((a.tools, a.page_size), (2, 0));
        assert!(parse(&words("upstream --listen 127.0.0.1:0 --delay-from now")).is_err());
    }

    #[test]
    fn upstream_tools_and_page_size() {
        let cmd = parse(&words(
            "upstream --listen 127.0.0.1:0 --tools 200000 --page-size 50",
        ));
        let Ok(Command::Upstream(a)) = cmd else {
            panic!("parsed {cmd:?}");
        };
        assert_eq!((a.tools, a.page_size), (200_000, 50));
        let Ok(Command::Upstream(a)) = parse(&words("upstream --listen 127.0.0.1:0 --tools 1"))
        else {
            panic!("one tool");
        };
        assert_eq!(a.tools, 1);
        for (line, flag) in [
            ("--tools 0", "--tools"),
            ("--tools 200001", "--tools"),
            ("--tools -1", "--tools"),
            ("--tools many", "--tools"),
            ("--page-size 200001", "--page-size"),
            ("--page-size 1.5", "--page-size"),
        ] {
            let err = parse(&words(&format!("upstream --listen 127.0.0.1:0 {line}")));
            assert!(
                matches!(&err, Err(ArgError::Invalid { flag: f, .. }) if *f == flag),
                "{line}: {err:?}"
            );
        }
        for flag in ["--tools", "--page-size"] {
            assert_eq!(
                parse(&words(&format!("upstream --listen 127.0.0.1:0 {flag}"))),
                Err(ArgError::MissingValue(flag))
            );
        }
    }
}
