//! Every bound of the load generator and the upstream fixture, named once.
//!
//! Outside input (CLI values, network bytes) is checked against these and refused with a
//! typed error; nothing grows past them.

use std::time::Duration;

/// Largest HTTP response body the generator accepts (a 150 KB payload sweep fits easily).
pub const RESPONSE_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Largest request body the fixture accepts; larger ones get 413 from the decoder.
pub const REQUEST_BYTES_MAX: usize = mcpyard::limits::MESSAGE_BYTES_MAX;

/// Read buffer reserved per connection read; grows only as far as a message needs.
pub const READ_CHUNK_BYTES: usize = 16 * 1024;

/// A reused keep-alive connection found closed before any byte of its answer, at most
/// this long after the request was written, was closed by the target while idle (the
/// close crossed the request on the wire): the request is sent once more on a new
/// connection, within what is left of its deadline, and counted as a reconnect. A close
/// seen later is the target failing a request it took, and counts as an error.
pub const IDLE_CLOSE_WINDOW: Duration = Duration::from_millis(100);

/// How far a socket wait may overrun its request's deadline, as a fraction of the timeout
/// (1/16), and at least [`ARM_SLACK_MIN`]: within it, the socket's timeout is not set
/// again (one system call per read and write saved while answers come in time).
pub const ARM_SLACK_DIVISOR: u32 = 16;
pub const ARM_SLACK_MIN: Duration = Duration::from_millis(1);

/// Keep-alive connections of one `run`: each is a thread with one request in flight.
pub const CONNECTIONS_MAX: usize = 1024;

/// Sessions an `idle-sessions` or `fanout` run may hold open at once.
pub const SESSIONS_MAX: usize = 50_000;

/// Sessions being set up concurrently in `idle-sessions` and `fanout` (initialize + GET).
pub const SESSION_SETUP_CONCURRENCY: usize = 64;

/// Largest target rate, requests per second, over all connections.
pub const RATE_MAX: u64 = 10_000_000;

/// Largest `--session-calls` (requests per session before it is ended and renewed).
pub const SESSION_CALLS_MAX: u64 = 1_000_000_000;

/// Default length of an `--intervals` line.
pub const INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// `--intervals` lines held back waiting for a connection that has not handed its part in
/// (one stalled in a long exchange): each holds four histograms. Past this, the oldest
/// line is written without that connection's part (`"incomplete": true`), and what it
/// hands in later for a written line is counted in the next line's `late_dropped`.
pub const SERIES_PENDING_MAX: usize = 1024;

/// Shortest `--interval`: each one costs a merge of every connection's histogram.
pub const INTERVAL_MIN: Duration = Duration::from_millis(10);

/// Open loop: a connection busier than this share of the time (mean service time x its
/// share of the rate) has too little idle time to absorb jitter of the target or the
/// machine: when an exchange (or the generator's own thread) runs late, the connection
/// falls behind and catches up only slowly, and latency from the intended send grows
/// for seconds while service times stay flat (measured with `perf/soak.sh`: at 0.46 to
/// 0.59, one-second p99s of up to 1 s; at 0.24, none above 25 ms). The report then warns
/// and suggests a connection count.
pub const CONNECTION_BUSY_WARN: f64 = 0.35;

/// The busy share the suggested `--connections` aims at.
pub const CONNECTION_BUSY_AIM: f64 = 0.25;

/// Largest `--request-id`: ids are matched as JSON-RPC integers, which mcpyard's envelope
/// reads as `i64`.
pub const REQUEST_ID_MAX: u64 = i64::MAX as u64;

/// Largest `--duration` or `--warmup`.
pub const RUN_DURATION_MAX: Duration = Duration::from_secs(24 * 3600);

/// Largest `--params-bytes` (the size of the `text` argument of a generated tools/call).
pub const PARAMS_BYTES_MAX: usize = 1024 * 1024;

/// Fan-out rounds per `fanout` run.
pub const FANOUT_ROUNDS_MAX: u32 = 1000;

/// Pause between fan-out rounds, so one round's stragglers never count in the next.
pub const FANOUT_ROUND_PAUSE: Duration = Duration::from_millis(200);

/// Default per-request timeout (in `run`, the deadline of each exchange from its send to the
/// response's last byte; in `fanout`, the wait limit).
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// A POST answered with an event stream is complete when the JSON-RPC response arrives
/// (its latency ends there); the server may still hold the stream open (MCP allows it).
/// The generator waits this long for the stream's end, to keep the connection; past it,
/// the connection is dropped and the next request opens a new one.
pub const SSE_END_GRACE: Duration = Duration::from_millis(100);

/// After a run, each connection ends its session with a DELETE (best effort); the DELETE
/// gets at most this long (or `--timeout`, if shorter), so a target that does not answer
/// delays the report by at most this.
pub const SESSION_END_TIMEOUT: Duration = Duration::from_secs(2);

/// The open-loop pacer sleeps until this long before a request's intended send time and
/// yield-spins the rest: `nanosleep` with a 1 ns timer slack wakes within a few tens of µs,
/// so a 100 µs window absorbs its error at a CPU cost of at most rate x 100 µs per second.
pub const SPIN_WINDOW: Duration = Duration::from_micros(100);

/// A kernel receive timestamp converted to the monotonic clock may land this far before the
/// earliest possible arrival (its request's send) and still be trusted (clamped to it);
/// further means the wall clock was stepped, and the read time is used instead. The
/// conversion itself errs by well under a µs (see `arrival.rs`).
pub const ARRIVAL_SKEW_MAX: Duration = Duration::from_micros(10);

/// How far past the scheduled end a lagging open-loop connection may keep sending the
/// requests it still owes before they are counted as unsent.
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Runs longer than this print a progress line to stderr.
pub const PROGRESS_AFTER: Duration = Duration::from_secs(3);

/// How often the progress line is rewritten.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// Latency histograms record microseconds from 1 µs to this many (one minute). A longer
/// latency is recorded as this and counted (`clamped` in the report), so a max at this
/// value reads as "at least".
pub const LATENCY_US_MAX: u64 = 60_000_000;

/// Significant figures of the latency histograms.
pub const LATENCY_SIGFIG: u8 = 3;

/// Fixture: sessions alive at once over all workers; a new one beyond this evicts the oldest.
pub const FIXTURE_SESSIONS_MAX: usize = 100_000;

/// Fixture: open connections per worker; more are answered 503 and closed.
pub const FIXTURE_CONNECTIONS_PER_WORKER_MAX: usize = 32 * 1024;

/// Fixture: worker threads.
pub const FIXTURE_WORKERS_MAX: usize = 64;

/// Fixture: largest `--result-bytes`.
pub const FIXTURE_RESULT_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Fixture: largest `--tools`. The whole list is rendered once at start and kept for the
/// life of the process: a generated tool is about 330 B, so the largest list holds about
/// 65 MB (at most `FIXTURE_TOOLS_MAX * FIXTURE_TOOL_BYTES_MAX`, 100 MB), plus about 10 MB
/// for the set of names tools/call checks, which a test fixture can afford in exchange for
/// never serializing or allocating on the request path. Unpaginated, a list of more than
/// about 50,000 tools exceeds what `run` reads (`RESPONSE_BYTES_MAX`); use `--page-size`.
pub const FIXTURE_TOOLS_MAX: usize = 200_000;

/// Fixture: largest rendered tool object in the tools/list result (each generated tool is
/// asserted against it at start).
pub const FIXTURE_TOOL_BYTES_MAX: usize = 512;

/// Fixture: largest `--page-size`; a page at least as long as the list is the whole list.
pub const FIXTURE_PAGE_SIZE_MAX: usize = FIXTURE_TOOLS_MAX;

/// Fixture: longest tool name quoted back in an `Unknown tool: <name>` error; a longer one
/// is cut at a char boundary, so a huge name cannot make an error body the gateway refuses
/// (`mcpyard::jsonrpc::ERROR_BYTES_MAX`).
pub const FIXTURE_ECHOED_NAME_BYTES_MAX: usize = 128;

/// Fixture: largest `--progress` event count per call.
pub const FIXTURE_PROGRESS_MAX: u32 = 100_000;

/// Fixture: largest `--delay-ms` and `--progress-interval-ms`.
pub const FIXTURE_DELAY_MAX: Duration = Duration::from_secs(600);

/// Fixture: delays wake this long before their deadline and yield-spin the rest, so the
/// reactor's wake-up latency does not lengthen them (see `sys::sleep_precise`).
pub const FIXTURE_SPIN_WINDOW: Duration = Duration::from_micros(50);

/// Fixture: an open GET stream gets a comment this often so idle peers keep it.
pub const FIXTURE_KEEPALIVE: Duration = Duration::from_secs(15);

/// Fixture: responses whose payload is at least this large are written as separate
/// segments (head, shared payload, tail) instead of being copied into one buffer.
pub const FIXTURE_COPY_BYTES_MAX: usize = 16 * 1024;

const _: () = assert!(SESSION_SETUP_CONCURRENCY <= SESSIONS_MAX);
const _: () = assert!(SESSIONS_MAX <= FIXTURE_SESSIONS_MAX);
const _: () = assert!(SESSIONS_MAX <= FIXTURE_CONNECTIONS_PER_WORKER_MAX * 2);
const _: () = assert!(FIXTURE_RESULT_BYTES_MAX < RESPONSE_BYTES_MAX);
const _: () = assert!(FIXTURE_PAGE_SIZE_MAX <= FIXTURE_TOOLS_MAX);
const _: () = assert!(FIXTURE_TOOLS_MAX * FIXTURE_TOOL_BYTES_MAX <= 100 * 1024 * 1024);
// Escaping makes a byte at most six (`\u00XX`), and the rest of the error is short.
const _: () = assert!(FIXTURE_ECHOED_NAME_BYTES_MAX * 6 + 256 <= mcpyard::jsonrpc::ERROR_BYTES_MAX);
const _: () = assert!(PARAMS_BYTES_MAX < REQUEST_BYTES_MAX);
const _: () = assert!(READ_CHUNK_BYTES <= mcpyard::limits::HEADER_BYTES_MAX * 2);

/// Plaintext moved out of a TLS session per read call (a stack buffer).
pub const TLS_PLAINTEXT_READ_BYTES: usize = 16 * 1024;
