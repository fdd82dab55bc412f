//! `idle-sessions` and `fanout`: thousands of sessions, each holding a GET event stream,
//! on one event-driven thread (a tokio current_thread runtime), never a thread each.
//!
//! Every session is one task on its own connection: initialize, notifications/
//! initialized, then GET with `accept: text/event-stream`; the connection then carries
//! the stream. At most `SESSION_SETUP_CONCURRENCY` sessions are being set up at once.
//!
//! `idle-sessions` reports when all are open, holds them for `--duration`, and counts how
//! many are still open. `fanout` then POSTs `--trigger` (the fixture's
//! `/control/list_changed` or `/control/tools_changed`) and times, per session, how long
//! after the trigger was sent its `notifications/tools/list_changed` event arrived; each
//! round waits for every open stream (or `--timeout`). Rounds are `FANOUT_ROUND_PAUSE`
//! apart, the first after the line saying the sessions are open, and a line after the last
//! says the rounds are done, one pause before the connections close. Receipt times are taken as each task runs, so with 10k
//! streams on one thread they include the generator's own dispatch order.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use hdrhistogram::Histogram;
use mcpyard::http::{ResponseDecoder, ResponseEvent};
use mcpyard::sse::Decoder;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, Semaphore};

use crate::args::{RunArgs, Scenario, Target};
use crate::client::{
    BodyKind, Collector, Response, body_kind, encode_request, io_failure, resolve,
};
use crate::limits::{
    FANOUT_ROUND_PAUSE, READ_CHUNK_BYTES, RESPONSE_BYTES_MAX, SESSION_SETUP_CONCURRENCY,
};
use crate::mcp;
use crate::record::{ErrorCounts, ErrorKind, Failure, latency_histogram, nanos_to_us};
use crate::report::{self, histogram_json, latency_rows};
use crate::run::RunError;
use crate::schedule::nanos;

/// The method of the event fan-out waits for.
const LIST_CHANGED: &[u8] = b"notifications/tools/list_changed";

/// One fan-out round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Round {
    /// Streams open when the trigger was sent.
    pub expected: usize,
    /// Streams that received the event within the timeout.
    pub received: usize,
    /// Time from sending the trigger to the last receipt, in µs.
    pub time_to_last_us: u64,
    /// What the trigger endpoint said it told (the fixture's `{"streams":N}`), if it said.
    pub told: Option<u64>,
}

/// What a streams run measured.
#[derive(Debug)]
pub struct Outcome {
    /// Sessions asked for.
    pub sessions: usize,
    /// Sessions whose GET stream opened.
    pub opened: usize,
    /// Setup failures by kind.
    pub setup_errors: ErrorCounts,
    /// Time until every session was open or had failed.
    pub open_time: Duration,
    /// Streams still open at the end of the hold (idle) or of the last round (fanout).
    pub still_open: usize,
    /// Fan-out delivery latency over all rounds, µs.
    pub delivery: Histogram<u64>,
    /// The fan-out rounds.
    pub rounds: Vec<Round>,
}

/// The state the session tasks and the driver share (one thread, so `Cell`s).
struct Ctx {
    target: Target,
    /// The target's address and the trigger's, each resolved once for the whole run.
    addr: SocketAddr,
    trigger_addr: Option<SocketAddr>,
    timeout: Duration,
    setup: Semaphore,
    /// Tasks that finished setup, either way.
    settled: Cell<usize>,
    opened: Cell<usize>,
    open_now: Cell<usize>,
    setup_errors: RefCell<ErrorCounts>,
    /// Wakes the driver when a task settles or an event arrives.
    wake: Notify,
    fan: RefCell<Fan>,
}

/// The current fan-out round, as the tasks see it.
struct Fan {
    round: u64,
    trigger_at: Option<Instant>,
    /// The last round each session saw; a session counts once per round.
    seen: Vec<u64>,
    received: usize,
    last_at: Option<Instant>,
    delivery: Histogram<u64>,
}

impl Ctx {
    fn on_settled(&self, result: Result<(), Failure>) {
        self.settled.set(self.settled.get() + 1);
        match result {
            Ok(()) => {
                self.opened.set(self.opened.get() + 1);
                self.open_now.set(self.open_now.get() + 1);
            }
            Err(failure) => self.setup_errors.borrow_mut().count(&failure),
        }
        self.wake.notify_one();
    }

    fn on_list_changed(&self, index: usize) {
        let mut fan = self.fan.borrow_mut();
        let round = fan.round;
        let Some(trigger_at) = fan.trigger_at else {
            return;
        };
        let now = Instant::now();
        match fan.seen.get_mut(index) {
            Some(seen) if *seen < round => *seen = round,
            _ => return,
        }
        fan.received += 1;
        fan.last_at = Some(now);
        let us = nanos_to_us(nanos(now.duration_since(trigger_at)));
        fan.delivery.saturating_record(us);
        drop(fan);
        self.wake.notify_one();
    }
}

/// Runs `idle-sessions` or `fanout`.
pub fn run(args: &RunArgs) -> Result<Outcome, RunError> {
    let plan = std::sync::Arc::new(crate::run::Plan::new(args)?);
    crate::run::probe(&plan)?;
    let trigger_addr = match &args.trigger {
        Some(trigger) => Some(resolve(trigger).map_err(|failure| RunError::Probe {
            doing: "resolving the trigger's host",
            failure,
            hint: "is the host name in --trigger right?",
        })?),
        None => None,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| RunError::Thread(format!("runtime: {e}")))?;
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, drive(args, plan.addr, trigger_addr))
}

async fn drive(
    args: &RunArgs,
    addr: SocketAddr,
    trigger_addr: Option<SocketAddr>,
) -> Result<Outcome, RunError> {
    let ctx = Rc::new(Ctx {
        target: args.target.clone(),
        addr,
        trigger_addr,
        timeout: args.timeout,
        setup: Semaphore::new(SESSION_SETUP_CONCURRENCY),
        settled: Cell::new(0),
        opened: Cell::new(0),
        open_now: Cell::new(0),
        setup_errors: RefCell::new(ErrorCounts::default()),
        wake: Notify::new(),
        fan: RefCell::new(Fan {
            round: 0,
            trigger_at: None,
            seen: vec![0; args.sessions],
            received: 0,
            last_at: None,
            delivery: latency_histogram(),
        }),
    });
    let started = Instant::now();
    for index in 0..args.sessions {
        tokio::task::spawn_local(session_task(index, Rc::clone(&ctx)));
    }
    // Setup has its own deadline per exchange, so every task settles.
    while ctx.settled.get() < args.sessions {
        ctx.wake.notified().await;
    }
    let open_time = started.elapsed();
    eprintln!(
        "{} of {} sessions open with GET streams after {:.3} s",
        ctx.opened.get(),
        args.sessions,
        open_time.as_secs_f64()
    );
    let mut rounds = Vec::new();
    if args.scenario == Scenario::Fanout {
        if let Some(trigger) = &args.trigger {
            // A pause before every round, the first too: the last setups' stragglers settle
            // first, and whoever watches the target sees the line above before it works.
            for _ in 0..args.rounds {
                tokio::time::sleep(FANOUT_ROUND_PAUSE).await;
                rounds.push(fan_round(&ctx, trigger, args.timeout).await?);
            }
            // The sessions stay open one more pause after this line, so the target can be
            // read with every stream open and before the connections close.
            eprintln!("{} fan-out rounds done", rounds.len());
            tokio::time::sleep(FANOUT_ROUND_PAUSE).await;
        }
    } else {
        tokio::time::sleep(args.duration).await;
    }
    let fan = ctx.fan.replace(Fan {
        round: 0,
        trigger_at: None,
        seen: Vec::new(),
        received: 0,
        last_at: None,
        delivery: latency_histogram(),
    });
    Ok(Outcome {
        sessions: args.sessions,
        opened: ctx.opened.get(),
        setup_errors: ctx.setup_errors.borrow().clone(),
        open_time,
        still_open: ctx.open_now.get(),
        delivery: fan.delivery,
        rounds,
    })
}

/// Sends one trigger and waits until every open stream got the event or `timeout` passed.
async fn fan_round(ctx: &Ctx, trigger: &Target, timeout: Duration) -> Result<Round, RunError> {
    let expected = ctx.open_now.get();
    let trigger_at = Instant::now();
    {
        let mut fan = ctx.fan.borrow_mut();
        fan.round += 1;
        fan.received = 0;
        fan.last_at = None;
        fan.trigger_at = Some(trigger_at);
    }
    let response = post_trigger(trigger, ctx.trigger_addr, timeout)
        .await
        .map_err(|failure| RunError::Probe {
            doing: "the fan-out trigger",
            failure,
            hint: "--trigger must accept a POST, like the fixture's /control/list_changed",
        })?;
    let told = serde_json::from_slice::<Value>(&response.body)
        .ok()
        .and_then(|v| v.get("streams")?.as_u64());
    let deadline = trigger_at + timeout;
    while ctx.fan.borrow().received < expected {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero()
            || tokio::time::timeout(left, ctx.wake.notified())
                .await
                .is_err()
        {
            break;
        }
    }
    let fan = ctx.fan.borrow();
    let last = fan
        .last_at
        .map_or(Duration::ZERO, |at| at.duration_since(trigger_at));
    Ok(Round {
        expected,
        received: fan.received,
        time_to_last_us: nanos_to_us(nanos(last)),
        told,
    })
}

async fn post_trigger(
    trigger: &Target,
    addr: Option<SocketAddr>,
    timeout: Duration,
) -> Result<Response, Failure> {
    let addr = addr.ok_or_else(|| Failure::new(ErrorKind::Connect, "no --trigger address"))?;
    let mut stream = connect(trigger, addr, timeout).await?;
    let mut read = BytesMut::new();
    let response = exchange(
        &mut stream,
        &mut read,
        trigger,
        "POST",
        None,
        b"{}",
        timeout,
    )
    .await?;
    mcp::expect_status(&response, 0, "trigger")?;
    Ok(response)
}

/// One session: set up, then read its event stream until it ends.
async fn session_task(index: usize, ctx: Rc<Ctx>) {
    let setup = {
        // The semaphore is never closed, so acquire only fails if it were; then go anyway.
        let _permit = ctx.setup.acquire().await;
        open_stream(&ctx).await
    };
    let (mut stream, mut read, mut decoder) = match setup {
        Ok(parts) => {
            ctx.on_settled(Ok(()));
            parts
        }
        Err(failure) => {
            ctx.on_settled(Err(failure));
            return;
        }
    };
    let mut events = Decoder::new();
    let mut pending = BytesMut::new();
    'stream: loop {
        loop {
            match decoder.decode(&mut read, false) {
                Ok(Some(ResponseEvent::Data(data))) => pending.extend_from_slice(&data),
                Ok(None) => break,
                Ok(Some(_)) | Err(_) => break 'stream, // the stream ended or broke
            }
        }
        // Each message consumes at least one line of `pending`, so this ends.
        while let Ok(Some(message)) = events.decode(&mut pending) {
            let data = message.data.unwrap_or_default();
            if data.windows(LIST_CHANGED.len()).any(|w| w == LIST_CHANGED) {
                ctx.on_list_changed(index);
            }
        }
        if pending.len() > RESPONSE_BYTES_MAX {
            break;
        }
        read.reserve(READ_CHUNK_BYTES);
        match stream.read_buf(&mut read).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    ctx.open_now.set(ctx.open_now.get().saturating_sub(1));
}

/// Connects, initializes a session and opens its GET stream; returns the connection, the
/// bytes read past the stream's head, and the decoder positioned in its body.
async fn open_stream(ctx: &Ctx) -> Result<(TcpStream, BytesMut, ResponseDecoder), Failure> {
    let (target, timeout) = (&ctx.target, ctx.timeout);
    let mut stream = connect(target, ctx.addr, timeout).await?;
    let mut read = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut body = BytesMut::new();
    mcp::initialize(0, &mut body);
    let response = exchange(&mut stream, &mut read, target, "POST", None, &body, timeout).await?;
    mcp::expect_result(&response, 0, "initialize")?;
    let session = response
        .session
        .ok_or_else(|| Failure::new(ErrorKind::Decode, "initialize gave no mcp-session-id"))?;
    body.clear();
    mcp::initialized(&mut body);
    let sid = Some(session.as_str());
    let response = exchange(&mut stream, &mut read, target, "POST", sid, &body, timeout).await?;
    mcp::expect_status(&response, 202, "notifications/initialized")?;
    let mut request = BytesMut::new();
    encode_request("GET", target, sid, true, b"", &mut request)?;
    stream
        .write_all(&request)
        .await
        .map_err(|e| io_failure(&e, "write"))?;
    let mut decoder = ResponseDecoder::new(usize::MAX);
    let head = tokio::time::timeout(timeout, read_head(&mut stream, &mut read, &mut decoder))
        .await
        .map_err(|_| Failure::new(ErrorKind::Timeout, "GET stream head"))??;
    if head.0 != 200 {
        return Err(Failure::new(
            ErrorKind::HttpStatus,
            format!("GET: http {}", head.0),
        ));
    }
    if head.1 != BodyKind::EventStream {
        return Err(Failure::new(
            ErrorKind::Decode,
            "GET: not text/event-stream",
        ));
    }
    Ok((stream, read, decoder))
}

/// Reads until the response head; returns its status and body kind.
async fn read_head(
    stream: &mut TcpStream,
    read: &mut BytesMut,
    decoder: &mut ResponseDecoder,
) -> Result<(u16, BodyKind), Failure> {
    loop {
        match decoder.decode(read, false) {
            Ok(Some(ResponseEvent::Head(head))) => {
                return Ok((head.status, body_kind(head.headers.get("content-type"))));
            }
            Ok(Some(_)) => return Err(Failure::new(ErrorKind::Decode, "body before head")),
            Ok(None) => {}
            Err(e) => return Err(Failure::new(ErrorKind::Decode, format!("GET: {e}"))),
        }
        read.reserve(READ_CHUNK_BYTES);
        match stream.read_buf(read).await {
            Ok(0) => return Err(Failure::new(ErrorKind::Io, "closed before the GET head")),
            Ok(_) => {}
            Err(e) => return Err(io_failure(&e, "read")),
        }
    }
}

/// Connects to `target` at `addr` (resolved once per run) within `timeout`.
async fn connect(
    target: &Target,
    addr: SocketAddr,
    timeout: Duration,
) -> Result<TcpStream, Failure> {
    let connecting = TcpStream::connect(addr);
    let stream = tokio::time::timeout(timeout, connecting)
        .await
        .map_err(|_| {
            Failure::new(
                ErrorKind::Connect,
                format!("{}: timed out", target.authority),
            )
        })?
        .map_err(|e| Failure::new(ErrorKind::Connect, format!("{}: {e}", target.authority)))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Sends one request and reads its whole response within `timeout`.
async fn exchange(
    stream: &mut TcpStream,
    read: &mut BytesMut,
    target: &Target,
    method: &str,
    session: Option<&str>,
    body: &[u8],
    timeout: Duration,
) -> Result<Response, Failure> {
    let mut request = BytesMut::new();
    // Only initialize goes without a session here: every later request is after it.
    encode_request(
        method,
        target,
        session,
        session.is_some(),
        body,
        &mut request,
    )?;
    let work = async {
        stream
            .write_all(&request)
            .await
            .map_err(|e| io_failure(&e, "write"))?;
        let mut collector = Collector::new();
        loop {
            if let Some(response) = collector.feed(read)? {
                return Ok(response);
            }
            read.reserve(READ_CHUNK_BYTES);
            match stream.read_buf(read).await {
                Ok(0) => {
                    return collector
                        .feed_eof(read)?
                        .ok_or_else(|| Failure::new(ErrorKind::Io, "closed mid-response"));
                }
                Ok(_) => {}
                Err(e) => return Err(io_failure(&e, "read")),
            }
        }
    };
    tokio::time::timeout(timeout, work).await.map_err(|_| {
        Failure::new(
            ErrorKind::Timeout,
            format!("{method}: no answer in {timeout:?}"),
        )
    })?
}

/// Renders the table printed after a streams run.
pub fn table(args: &RunArgs, outcome: &Outcome) -> String {
    let mut out = format!(
        "mcpyard-loadgen {}: {} sessions, http://{}{}\n\
         opened {} in {:.3} s, setup errors {}\n",
        args.scenario.name(),
        outcome.sessions,
        args.target.authority,
        args.target.path,
        outcome.opened,
        outcome.open_time.as_secs_f64(),
        outcome.setup_errors.total(),
    );
    for kind in ErrorKind::ALL {
        if let Some(detail) = outcome.setup_errors.first(kind) {
            out.push_str(&format!("  first {}: {detail}\n", kind.name()));
        }
    }
    if args.scenario == Scenario::IdleSessions {
        out.push_str(&format!(
            "held {:.1} s: {} of {} still open\n",
            args.duration.as_secs_f64(),
            outcome.still_open,
            outcome.opened
        ));
        return out;
    }
    for (i, round) in outcome.rounds.iter().enumerate() {
        let told = round
            .told
            .map_or(String::new(), |n| format!(" (trigger told {n})"));
        out.push_str(&format!(
            "round {}: {} of {} received{told}, time to last {} us\n",
            i + 1,
            round.received,
            round.expected,
            round.time_to_last_us
        ));
    }
    out.push_str(&latency_rows(&[("delivery", &outcome.delivery)]));
    out.push_str(&format!(
        "still open {} of {}\n",
        outcome.still_open, outcome.opened
    ));
    out
}

/// The JSON report of a streams run.
pub fn to_json(args: &RunArgs, outcome: &Outcome) -> Value {
    let errors: serde_json::Map<String, Value> = ErrorKind::ALL
        .iter()
        .map(|k| (k.name().to_owned(), json!(outcome.setup_errors.get(*k))))
        .collect();
    let rounds: Vec<Value> = outcome
        .rounds
        .iter()
        .map(|r| {
            json!({
                "expected": r.expected,
                "received": r.received,
                "time_to_last_us": r.time_to_last_us,
                "trigger_told": r.told,
            })
        })
        .collect();
    json!({
        "scenario": args.scenario.name(),
        "url": format!("http://{}{}", args.target.authority, args.target.path),
        "sessions": outcome.sessions,
        "opened": outcome.opened,
        "open_time_s": outcome.open_time.as_secs_f64(),
        "setup_errors": errors,
        "held_s": if args.scenario == Scenario::IdleSessions { Some(args.duration.as_secs_f64()) } else { None },
        "still_open": outcome.still_open,
        "rounds": rounds,
        "delivery_us": histogram_json(&outcome.delivery),
    })
}

/// Runs a streams scenario, prints its table and writes the requested files.
pub fn run_and_report(args: &RunArgs) -> Result<(), RunError> {
    let outcome = run(args)?;
    print!("{}", table(args, &outcome));
    let title = format!(
        "{} delivery, {} sessions",
        args.scenario.name(),
        outcome.sessions
    );
    report::write_files(args, &to_json(args, &outcome), &outcome.delivery, &title)?;
    if outcome.opened == 0 {
        return Err(RunError::NoSamples);
    }
    Ok(())
}
