//! Every bound in mcpyard, named once.
//!
//! Limits are derived from as few knobs as possible (the slot size, the per-worker table
//! sizes, the tick) and their relationships are checked at compile time. Configuration may
//! lower a limit, never raise it past what is written here. When a bound is hit the code
//! gives a defined answer (a canned HTTP status, a JSON-RPC error or a stream reset) and
//! moves a counter; nothing grows without bound.

use std::time::Duration;

/// One pooled buffer slot: the unit of socket reads, of encode staging and of stream credit.
pub const SLOT_BYTES: usize = 32 * 1024;

/// Slots owned by one worker; a connection borrows one while it has a read in flight.
pub const SLOTS_PER_WORKER: usize = 1024;

/// Request head (request line + headers) larger than this is answered 431.
pub const HEADER_BYTES_MAX: usize = 16 * 1024;

/// Header fields per request or response head; more is answered 431.
pub const HEADERS_PER_MESSAGE_MAX: usize = 64;

/// Interim (1xx) responses an upstream may send before its final response; one more is a
/// malformed response, so a peer cannot keep a decode call busy with endless 1xx heads.
pub const INFORMATIONAL_RESPONSES_MAX: u32 = 8;

/// Request target longer than this is answered 414.
pub const REQUEST_TARGET_BYTES_MAX: usize = 4 * 1024;

/// Largest JSON-RPC message body accepted from an agent or an upstream (413 above it).
pub const MESSAGE_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Longest chunk-size line (hex size plus extensions) in a chunked body.
pub const CHUNK_LINE_BYTES_MAX: usize = 1024;

/// Largest single SSE event (all its lines) accepted from an upstream.
pub const SSE_EVENT_BYTES_MAX: usize = MESSAGE_BYTES_MAX;

/// Pipelined requests decoded ahead of the response being written, per connection.
pub const PIPELINE_DEPTH_MAX: usize = 16;

/// After an HTTP error answer that ends a connection (413, 431, 400, …), how long and how
/// many bytes of what the agent still sends are read and dropped before the close: a close
/// with unread input resets the connection, and the agent may lose the answer with it
/// (RFC 9112 §9.6).
pub const ERROR_LINGER_TIMEOUT: Duration = Duration::from_secs(2);
pub const ERROR_LINGER_BYTES_MAX: usize = 256 * 1024;

/// Bytes of pipelined requests' bodies queued ahead of the response being
/// written, per connection: past it the connection is not read until the queue shrinks, so
/// an agent that pipelines large bodies behind a long response (an event stream) holds at
/// most this plus the one request being read.
pub const PIPELINE_BYTES_MAX: usize = MESSAGE_BYTES_MAX;

/// Bytes a chunked body may take on the wire beyond its data (chunk-size lines with their
/// extensions, and the CRLF after each chunk); more is answered 413. Thousands of chunks
/// of one byte fit, a body padded out with extensions does not.
pub const CHUNK_FRAMING_BYTES_MAX: usize = 256 * 1024;

/// Open connections per worker (agent side); more are answered 503 and closed.
pub const CONNECTIONS_PER_WORKER_MAX: usize = 16 * 1024;

/// Live MCP sessions per worker; `initialize` beyond this gets 503.
pub const SESSIONS_PER_WORKER_MAX: usize = 32 * 1024;

/// Concurrent internal streams (in-flight requests) per worker.
pub const STREAMS_PER_WORKER_MAX: usize = 16 * 1024;

/// In-flight requests per session; more get JSON-RPC -32603 "too many requests".
pub const REQUESTS_PER_SESSION_MAX: usize = 256;

/// Server-to-client requests (elicitation, sampling, roots) per session that await the
/// agent's answer; past it the oldest one waiting gets a JSON-RPC error as its answer
/// ("too many requests awaiting the agent's answer"), and the new one is relayed.
pub const PENDING_ANSWERS_PER_SESSION_MAX: usize = 256;

/// Longest `_meta.progressToken` of an agent's request (its JSON lexeme); a longer one is
/// refused with -32602. An upstream copies the token into every progress notification it
/// sends, so a long one would be multiplied by the request's notifications.
pub const PROGRESS_TOKEN_BYTES_MAX: usize = 1024;

/// Longest id of a server-to-client request that is relayed to the agent (the raw JSON
/// lexeme, a proxy's `<toolkit>~` included); longer ones are refused like a full table.
pub const PENDING_ANSWER_ID_BYTES_MAX: usize = 512;

/// Messages queued toward one worker from the others (session hand-off, scrapes).
pub const CROSS_WORKER_QUEUE_LEN: usize = 1024;

/// Response parts queued from an owning worker back to the connection's worker.
pub const CROSS_WORKER_REPLY_QUEUE_LEN: usize = 64;

/// Pieces of body bytes smaller than this are copied onto a small neighbour where pieces
/// are kept (DATA queues, held items and results), so a peer's one-byte chunks do not cost
/// a handle each (`stream::pieces`).
pub const PIECE_JOIN_BYTES: usize = 512;

/// Frames buffered on one direction of an internal stream beyond its byte credit
/// (FLUSH events, END); DATA is bounded by the window itself (and one answer sent whole),
/// in frames too: small ones are joined ([`PIECE_JOIN_BYTES`]).
pub const STREAM_FRAMES_MAX: usize = 256;

/// Events kept per session for GET-stream `Last-Event-ID` replay, and the bytes they may
/// hold together (the newest is always kept, whatever its size).
pub const SESSION_REPLAY_EVENTS_MAX: usize = 64;
pub const SESSION_REPLAY_BYTES_MAX: usize = 8 * 1024 * 1024;

/// Events the GET ring keeps beyond [`SESSION_REPLAY_EVENTS_MAX`] while an agent's GET
/// stream is being set up (until the exit answered the resume, events cannot be held back
/// in the exit's stream, so the ring keeps them for the stream about to start).
pub const GET_SETUP_EVENTS_MAX: usize = SESSION_REPLAY_EVENTS_MAX;

/// Events kept per request SSE stream for `Last-Event-ID` replay after a dropped connection,
/// and the bytes they may hold together (the newest is always kept, whatever its size).
pub const REQUEST_REPLAY_EVENTS_MAX: usize = 256;
pub const REQUEST_REPLAY_BYTES_MAX: usize = 8 * 1024 * 1024;

/// The default credit window of an internal stream direction: one slot.
pub const STREAM_WINDOW_BYTES: u32 = SLOT_BYTES as u32;

/// Timer granularity for idle and request deadlines.
pub const TICK: Duration = Duration::from_millis(100);

/// A keep-alive connection with no request in flight is closed after this long.
pub const CONNECTION_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// A request head or body that does not arrive in full within this long is answered 408
/// and its connection closed.
pub const REQUEST_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a GET stream waits for the exit to say whether it has an event stream.
pub const EVENTS_PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Default deadline for a request's reply from the exit (config may lower it).
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(300);

/// The least time one write to an agent without a deadline of its own (a GET stream's
/// event, an HTTP error) is given before the connection is cut, however short the
/// binding's `request_timeout`: a slow reader is not one that stopped.
pub const WRITE_LIMIT_MIN: Duration = Duration::from_secs(10);

/// How long the answer to a request whose deadline passed ("Request timed out") may take
/// to write: the deadline bounded the reply, this bounds its last words.
pub const TIMEOUT_ANSWER_WRITE_GRACE: Duration = Duration::from_secs(1);

/// Default and largest session inactivity timeout (config may lower it).
pub const SESSION_IDLE_TIMEOUT_MAX: Duration = Duration::from_secs(30 * 60);

/// Shared sessions (`sessions: { store }`) being taken up from the store at once, per
/// worker; one more is answered 503 (counted as an overload).
pub const SHARED_SESSION_ADOPTIONS_MAX: usize = 256;

/// Shared sessions being taken up at once in the whole process (every worker, every server
/// binding): each is a store read, and ids an agent makes up cost one each, so they may
/// take at most a quarter of a redis store's queue, leaving the rest to the cache's
/// leases and reads and to session writes. One more is answered 503 (an overload).
pub const SHARED_SESSION_ADOPTIONS_NODE_MAX: usize = 256;

/// Shared session ids the store was found not to hold, remembered per worker so that an
/// agent repeating one (an ended session, a made-up id) costs one store read per
/// [`SHARED_SESSION_ABSENT_TTL`], not one per request; the oldest is forgotten first.
pub const SHARED_SESSION_ABSENT_KEPT: usize = 256;

/// How long an id the store did not hold is answered 404 without asking it again. Short:
/// a session whose record could not be written when it opened (the store was down) is
/// written later, and is found at other nodes this long after at the latest.
pub const SHARED_SESSION_ABSENT_TTL: Duration = Duration::from_secs(2);

/// Largest shared-session record read back from the store; a larger one is refused as
/// not ours (what mcpyard writes is the agent's capabilities and a few ids).
pub const SHARED_SESSION_RECORD_BYTES_MAX: usize = 256 * 1024;

/// The largest `capabilities` object an agent's `initialize` may carry (MCP's are a few
/// small members): it is kept for the session's life and written into its shared record,
/// which another node reads only up to [`SHARED_SESSION_RECORD_BYTES_MAX`].
pub const SESSION_CAPABILITIES_BYTES_MAX: usize = 64 * 1024;
const _: () = assert!(2 * SESSION_CAPABILITIES_BYTES_MAX <= SHARED_SESSION_RECORD_BYTES_MAX);

/// A node in use of a shared session writes its activity to the record at most once per
/// this fraction of the session timeout (never per request).
pub const SHARED_SESSION_TOUCHES_PER_TIMEOUT: u32 = 4;

/// A shared session's record outlives the session timeout by this much in the store, so
/// that it is still there when the last node to use it decides the session's end.
pub const SHARED_SESSION_RECORD_GRACE: Duration = Duration::from_secs(60);

/// Longest a proxy waits for a shared session's record to be read again before it opens a
/// route's upstream session at its first use on this node (another node may have opened
/// it moments ago); past it, or with the store down, it opens one of its own.
pub const SHARED_SESSION_RECHECK_WAIT: Duration = Duration::from_millis(500);

/// Scrape connections the metrics endpoint serves at once; one more is closed at once
/// (counted in `mcpyard_metrics_scrapes_refused_total`).
pub const METRICS_CONNECTIONS_MAX: usize = 16;

/// Longest one scrape may take, from its connection to the last byte of its answer: a
/// scraper that sends nothing, or reads nothing, is closed then.
pub const METRICS_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Keepalive comment interval on GET event streams.
pub const SSE_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// How long a graceful drain waits for in-flight requests before exiting anyway.
pub const DRAIN_DEADLINE: Duration = Duration::from_secs(10);

/// Workers at most (one per core; `runtime.workers` may not exceed it).
pub const WORKERS_MAX: usize = 256;

/// Bytes of a log line's quoted outside input (names, paths), to keep logs bounded.
pub const LOG_FIELD_BYTES_MAX: usize = 128;

/// Upstream connections one client binding may hold open per worker (pooled, busy and
/// event streams together); past it a request gets a JSON-RPC error and a counter moves.
/// Every agent GET stream holds one upstream GET stream (HTTP/1.1), so this matches the
/// agent-side connection bound.
pub const UPSTREAM_CONNECTIONS_MAX: usize = CONNECTIONS_PER_WORKER_MAX;

/// Bytes of the heap buffer an idle upstream event stream reads into: such a stream waits
/// most of its life, and a slot (or even a 4 KiB buffer) per waiting stream would cost
/// more than the session itself. A read that fills it moves the stream to slots until the
/// burst is over.
pub const UPSTREAM_EVENT_READ_BYTES: usize = 512;

/// Bytes of the heap buffer an agent connection reads into after a GET (an event stream):
/// such a connection stays quiet for as long as the agent keeps the stream, and a slot (or
/// the pool's fallback buffer) per waiting stream would cost more than the session itself.
/// A read that fills it moves the connection back to slots.
pub const CONNECTION_STREAM_READ_BYTES: usize = 256;

/// Idle keep-alive connections a client binding keeps per worker; more are closed. As many
/// as a busy gateway has requests in flight to one upstream: each connection closed only to
/// be opened again for the next burst costs a connect and leaves a TIME_WAIT socket, and
/// with 64 here, 256 agent connections in closed loop opened a new upstream connection for
/// 5 % of their requests, piled up 8,700 TIME_WAIT sockets on the upstream's port in 20 s
/// and lost a quarter of the throughput run over run, as every connect searched longer for
/// a free port. The idle timeout closes what the load no longer needs.
pub const UPSTREAM_POOL_IDLE_MAX: usize = 1024;

/// An idle pooled upstream connection older than this is closed instead of reused.
pub const UPSTREAM_POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A pooled plain-TCP upstream connection on io_uring idle for less than this is reused
/// without the `MSG_PEEK` check (a system call per request there, which cannot see
/// readiness): an upstream closing an idle connection does so after its own keep-alive
/// timeout (seconds), and a close racing the reuse is what the one resend on a reused
/// connection covers either way.
pub const UPSTREAM_REUSE_CHECK_AFTER: Duration = Duration::from_millis(500);

/// Addresses of a DNS name tried in turn when connecting upstream, each attempt (TCP connect
/// and TLS handshake) within the client's `connect_timeout`.
pub const UPSTREAM_ADDRS_MAX: usize = 4;

/// Params at most this long are copied into the request head's write (one syscall);
/// longer params are written piece by piece, as they arrive, without copying.
pub const UPSTREAM_COALESCE_BYTES_MAX: usize = 16 * 1024;

/// Result bytes of a JSON answer held back until the answer is complete (so a broken
/// upstream still yields a clean JSON-RPC error); larger results stream as they arrive.
pub const UPSTREAM_RESULT_HOLD_BYTES: usize = STREAM_WINDOW_BYTES as usize;

/// Deadline for an agent's TLS handshake, from accept to the handshake's last flight (an
/// upstream's handshake shares its client's `connect_timeout` with the TCP connect instead).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes of the heap buffer a TLS handshake reads into: one TLS record at most. Handshakes
/// never hold a slot, so thousands of slow or hostile ones cost no pooled memory.
pub const TLS_HANDSHAKE_READ_BYTES: usize = 16 * 1024 + 256;

/// The first read of a handshake, and every read after one that did not fill its buffer,
/// uses this much: a ClientHello fits, and a connection that says nothing holds a 2 KiB
/// buffer while it waits out its deadline, not 16 KiB (measured whole: 6.4 KiB of RSS per
/// silent handshaking connection, 10.4 KiB with half a ClientHello in rustls' buffer).
pub const TLS_HANDSHAKE_FIRST_READ_BYTES: usize = 2 * 1024;

/// Plaintext encrypted per socket write: a larger write is encrypted and written in pieces,
/// so the ciphertext staged per connection stays bounded.
pub const TLS_WRITE_BATCH_BYTES: usize = 64 * 1024;

/// Reads a check of an idle pooled TLS connection takes in (session tickets, key updates)
/// before it gives up and calls the connection unusable.
pub const TLS_IDLE_CHECK_READS_MAX: usize = 8;

/// Bytes of one such read.
pub const TLS_IDLE_CHECK_READ_BYTES: usize = 4 * 1024;

/// Times a request's upstream SSE stream is resumed (`Last-Event-ID`) after it broke.
pub const UPSTREAM_RESUME_ATTEMPTS_MAX: u32 = 3;

/// Wait before reconnecting an upstream event stream when the upstream named none
/// (`retry:`), and the shortest and longest waits honoured (`retry:` values outside are
/// raised or capped: `retry: 0` must not make every session reconnect in a busy loop).
pub const UPSTREAM_RETRY_DEFAULT: Duration = Duration::from_secs(1);
pub const UPSTREAM_RETRY_MIN: Duration = Duration::from_millis(100);
pub const UPSTREAM_RETRY_MAX: Duration = Duration::from_secs(30);

/// An upstream event stream that ran at least this long (or carried an event) counts as
/// having worked: the reconnect wait starts again from `retry:`. One that ended sooner
/// with nothing is a failed attempt, and the wait doubles.
pub const UPSTREAM_STREAM_WORKED_MIN: Duration = Duration::from_secs(1);

/// Events an upstream event stream may have waiting for the agent's session before the
/// client stops reading it (back-pressure, nothing is dropped).
pub const UPSTREAM_OUTBOX_EVENTS_MAX: usize = 64;

/// Largest list item (one tool, prompt, resource or template, prefix included) the proxy
/// merges from an upstream `*/list` answer; a larger item is dropped and counted, since the
/// rewriter holds an item whole until it closes.
pub const LIST_ITEM_BYTES_MAX: usize = 1024 * 1024;

/// Longest decoded name or URI of a list item matched against a route's allow-list; an item
/// with a longer one is dropped.
pub const LIST_KEY_BYTES_MAX: usize = 8 * 1024;

/// Longest raw `nextCursor` lexeme kept from an upstream list page; a longer one fails the
/// page, since the cursor must be held to ask for the next page.
pub const LIST_CURSOR_BYTES_MAX: usize = 4 * 1024;

/// Longest event id taken from an exit (an upstream's SSE `id`): longer ones are not
/// handed on or resumed from.
pub const EXIT_EVENT_ID_BYTES_MAX: usize = 512;

/// Longest aggregate event id a proxy hands an agent (its routes' ids joined): the agent
/// sends it back in `Last-Event-ID`, so it must fit a request head with room to spare.
pub const AGGREGATE_EVENT_ID_BYTES_MAX: usize = 8 * 1024;

/// Routes one proxy binding may have.
pub const PROXY_ROUTES_MAX: usize = 64;

/// Pages of one route's list a proxy follows for one list request; an upstream that
/// hands out more cursors than this has the rest of its list left out (logged).
pub const LIST_PAGES_MAX: usize = 10_000;

/// Bytes of one route's list a proxy cache keeps (its fragment); a route whose list is
/// longer keeps its previous fragment, and the refresh counts as failed.
pub const CACHE_LIST_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Bytes of one merged list a proxy cache stores (every route's fragment of a kind, and
/// the header naming them). When the fragments together are longer, the largest are left
/// out (those routes count as failed and are tried again), so the others are still
/// published and the cache gets ready.
pub const CACHE_MERGED_LIST_BYTES_MAX: usize = CACHE_LIST_BYTES_MAX;

/// Keys one memory store holds at most (values, leases and watches each). A proxy cache
/// uses five lists and locks, its capabilities and one fragment per route and list kind.
pub const MEMORY_STORE_KEYS_MAX: usize = 4096;
const _: () = assert!(PROXY_ROUTES_MAX * 4 + 10 <= MEMORY_STORE_KEYS_MAX);

/// Shortest time between the starts of two refreshes of a cache: `list_changed`
/// notifications that come meanwhile are taken together by the next one, so a route that
/// sends them in a storm costs at most a few listings of itself a second.
pub const CACHE_REFRESH_INTERVAL_MIN: Duration = Duration::from_millis(250);

/// First wait before a failed cache refresh is tried again; it doubles up to the lease TTL.
pub const CACHE_RETRY_MIN: Duration = Duration::from_millis(100);

/// Tries of each read of the fragments an earlier hydrator stored, when a worker takes the
/// hydration lease; if one still fails, the lease is given up rather than hydrating
/// without the fragment (which would drop that route's items when its listing fails).
pub const CACHE_FRAGMENT_READ_TRIES: u32 = 3;

/// Longest wait between tries of a cache's store operation that failed (a networked store
/// that is down): a read, or taking the hydration lease; the wait doubles from
/// [`CACHE_RETRY_MIN`] up to this (or a third of the lease TTL, if shorter).
pub const CACHE_STORE_RETRY_MAX: Duration = Duration::from_secs(2);

/// Longest lease a cache's hydrating worker holds between renewals (a third of it); a
/// cache TTL shorter than this is the lease TTL instead.
pub const CACHE_LEASE_TTL_MAX: Duration = Duration::from_secs(30);

/// Highest database index a redis store's URL may name (Redis has 16 unless configured
/// otherwise; the bound only keeps the number sane).
pub const REDIS_DB_MAX: u32 = 65_535;

/// Longest key prefix of a redis store (`prefix:`).
pub const REDIS_PREFIX_BYTES_MAX: usize = 64;

/// Store operations waiting for a redis store's thread; one more is refused at once with a
/// store error (the callers retry on their own schedule: leases every third of their TTL,
/// reads on the next change).
pub const REDIS_QUEUE_LEN: usize = 1024;

/// Store operations a redis store has on its connection at once (pipelined); the queue
/// waits behind them.
pub const REDIS_INFLIGHT_MAX: usize = 256;

/// Leases a redis store releases at once after their `SET NX` went out and its answer was
/// lost (each is tried for up to its TTL); past it, a lease is left to expire and the
/// refusal counts as an unavailable `unlock`.
pub const REDIS_LOST_LEASES_MAX: usize = 64;

/// Deadline of one store operation on Redis, from its queueing to the reply; past it the
/// caller gets a store error and the connection is taken for lost.
pub const REDIS_OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

/// Deadline of one connection attempt to Redis: TCP, TLS, `AUTH`/`SELECT`, `SUBSCRIBE`.
pub const REDIS_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// First wait before connecting to Redis again after a failure; it doubles up to the max.
pub const REDIS_RECONNECT_MIN: Duration = Duration::from_millis(100);
pub const REDIS_RECONNECT_MAX: Duration = Duration::from_secs(5);

/// How often a connected redis store pings, so that a connection that died without a word
/// (a network partition: no FIN, no RST) is found within about this plus the operation
/// timeout.
pub const REDIS_PING_INTERVAL: Duration = Duration::from_secs(1);

/// Keys a redis store watches at most (one tokio watch channel each, about 200 bytes): a
/// cache's keys and one per shared session the node holds (`sessions:`). When it is full,
/// keys nobody watches any more are dropped first.
pub const REDIS_WATCHES_MAX: usize = 64 * 1024;
const _: () = assert!(MEMORY_STORE_KEYS_MAX <= REDIS_WATCHES_MAX);

/// While a store's watch table is full, it is swept for keys nobody watches any more at
/// the first refusal and then once per this many refusals, not at each: a sweep is a pass
/// over the whole table under the store's lock, and a full table refuses one watch per
/// new shared session.
pub const STORE_WATCH_SWEEP_SPACING: usize = 1024;

/// Largest value a redis store writes or reads back: the largest any of its users writes
/// (a cached list). A larger value found in Redis (written by someone else) is an error,
/// refused by Redis itself before a byte of it is sent, so it costs the node no memory.
pub const REDIS_VALUE_BYTES_MAX: usize = CACHE_LIST_BYTES_MAX;

const _: () = assert!(REDIS_INFLIGHT_MAX <= REDIS_QUEUE_LEN);
const _: () = assert!(REDIS_RECONNECT_MIN.as_millis() < REDIS_RECONNECT_MAX.as_millis());
const _: () = assert!(CACHE_LIST_BYTES_MAX <= REDIS_VALUE_BYTES_MAX);
const _: () = assert!(CACHE_MERGED_LIST_BYTES_MAX <= REDIS_VALUE_BYTES_MAX);
const _: () = assert!(TLS_HANDSHAKE_FIRST_READ_BYTES < TLS_HANDSHAKE_READ_BYTES);
const _: () = assert!(HEADER_BYTES_MAX <= SLOT_BYTES);
const _: () = assert!(REQUEST_TARGET_BYTES_MAX < HEADER_BYTES_MAX);
const _: () = assert!(AGGREGATE_EVENT_ID_BYTES_MAX <= HEADER_BYTES_MAX / 2);
const _: () = assert!(CHUNK_LINE_BYTES_MAX < SLOT_BYTES);
const _: () = assert!(SSE_EVENT_BYTES_MAX <= MESSAGE_BYTES_MAX);
const _: () = assert!(REQUESTS_PER_SESSION_MAX <= STREAMS_PER_WORKER_MAX);
const _: () = assert!(STREAM_WINDOW_BYTES as usize <= SLOT_BYTES);
const _: () = assert!(UPSTREAM_POOL_IDLE_MAX <= UPSTREAM_CONNECTIONS_MAX);
const _: () = assert!(UPSTREAM_EVENT_READ_BYTES < SLOT_BYTES);
const _: () = assert!(CONNECTION_STREAM_READ_BYTES > 0);
const _: () = assert!(CONNECTION_STREAM_READ_BYTES < SLOT_BYTES);
const _: () = assert!(UPSTREAM_COALESCE_BYTES_MAX <= SLOT_BYTES);
const _: () = assert!(UPSTREAM_OUTBOX_EVENTS_MAX <= STREAM_FRAMES_MAX);
const _: () = assert!(SHARED_SESSION_ADOPTIONS_NODE_MAX <= REDIS_QUEUE_LEN / 4);
// A frame joined from small pieces stays far below a window.
const _: () = assert!(2 * PIECE_JOIN_BYTES <= STREAM_WINDOW_BYTES as usize);
const _: () = assert!(LIST_KEY_BYTES_MAX < LIST_ITEM_BYTES_MAX);
const _: () = assert!(LIST_ITEM_BYTES_MAX <= MESSAGE_BYTES_MAX);
// The next page's request carries the cursor; with its envelope it stays within one slot.
const _: () = assert!(LIST_CURSOR_BYTES_MAX < SLOT_BYTES);
