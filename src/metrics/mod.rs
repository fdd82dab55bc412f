//! Per-worker counters and HDR histograms, merged on scrape into Prometheus text.
//!
//! Each worker records into its own thread-local [`WorkerMetrics`]; nothing on the request
//! path takes a lock or touches a shared cache line. A scrape asks every worker (over its
//! cross-worker queue) for a [`WorkerMetrics`] clone and merges them with [`render`].

pub mod store;

use crate::stream::Kind;
use hdrhistogram::Histogram;
use std::cell::RefCell;
use std::fmt::Write;
use std::time::Duration;

/// How a request ended, as a metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A result reached the agent.
    Ok,
    /// A JSON-RPC error or bearer challenge reached the agent.
    Error,
    /// The agent cancelled it, or its connection went away for good.
    Cancelled,
    /// Refused before reaching the exit (limits, bad input).
    Rejected,
}

impl Outcome {
    const ALL: [Outcome; 4] = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::Cancelled,
        Outcome::Rejected,
    ];

    fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
            Outcome::Rejected => "rejected",
        }
    }
}

/// Upper bound of recorded latencies and stalls, in microseconds (one hour).
const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Upper bound of recorded window grants, in bytes.
const GRANT_BYTES_MAX: u64 = 1 << 32;
/// A window stall longer than this is counted in `mcpyard_window_stalls_slow_total`, so
/// "how many stalls passed 1 ms" is exact rather than bounded by the summary's quantiles.
pub const WINDOW_STALL_SLOW: Duration = Duration::from_millis(1);
/// Significant figures kept by every histogram.
const SIGFIGS: u8 = 3;
/// Method labels: the request kinds plus the methods the server answers itself.
const LOCAL_METHODS: [&str; 3] = ["initialize", "ping", "other"];
const METHODS: usize = Kind::REQUESTS.len() + LOCAL_METHODS.len();

fn histogram(max: u64) -> Histogram<u64> {
    // Bounds are constants known to be valid, so construction cannot fail.
    match Histogram::new_with_bounds(1, max, SIGFIGS) {
        Ok(h) => h,
        Err(e) => unreachable!("histogram bounds are constant: {e}"),
    }
}

/// One worker's counters, gauges and histograms.
#[derive(Clone)]
pub struct WorkerMetrics {
    /// Request latency in µs, per method label and outcome.
    /// Allocated at the first request of that method and outcome: most pairs never occur,
    /// and a histogram is ~190 KiB that every scrape would otherwise copy.
    pub requests: Vec<Option<Histogram<u64>>>,
    /// Bytes returned per WINDOW frame on internal streams.
    pub window_grants: Histogram<u64>,
    /// µs a sender waited for credit.
    pub window_stalls: Histogram<u64>,
    /// Stalls longer than [`WINDOW_STALL_SLOW`].
    pub window_stalls_slow: u64,
    /// Slots borrowed now, and slots owned by this worker.
    pub slots_in_use: u64,
    pub slots_total: u64,
    /// Slots registered with the ring as fixed buffers.
    pub slots_registered: u64,
    /// Reads that found the slot pool empty and used a small heap buffer instead.
    pub slot_exhausted: u64,
    /// Live sessions and connections now.
    pub sessions: u64,
    pub connections: u64,
    /// Sessions created, expired; connections accepted.
    pub sessions_created: u64,
    pub sessions_expired: u64,
    /// Shared sessions (`sessions: { store }`): taken up from another node's record; let
    /// go of while they live on elsewhere; record reads and writes that failed.
    pub sessions_adopted: u64,
    pub sessions_detached: u64,
    pub session_store_failures: u64,
    pub connections_accepted: u64,
    /// Requests refused by a full table (sessions, connections, streams).
    pub overload_rejections: u64,
    /// Requests handed to another worker (the session lives there).
    pub handoffs: u64,
    /// HTTP requests answered with a 4xx/5xx before reaching MCP handling.
    pub http_errors: u64,
    /// GET streams resumed from an event no longer in the session's replay ring.
    pub events_replay_missed: u64,
    /// Heads not written because a value held a control byte (`http::HeadError`): toward
    /// agents (responses) and toward upstreams (requests).
    pub heads_refused_downstream: u64,
    pub heads_refused_upstream: u64,
    /// io_uring_enter calls of the worker's prompt-submission flusher (counted by it).
    pub uring_flushes: u64,
    /// The upstream side (`client` bindings).
    pub upstream: UpstreamMetrics,
    /// The `proxy` bindings.
    pub proxy: ProxyMetrics,
    /// The proxies' list caches.
    pub cache: CacheMetrics,
    /// Per toolkit (proxy route): requests by method and outcome, and their latency.
    /// Invariant: `len() <= TOOLKIT_LABELS_MAX`, names unique.
    pub toolkits: Vec<ToolkitMetrics>,
    /// TLS handshakes on both edges.
    pub tls: TlsMetrics,
}

/// Which edge a TLS handshake was on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsSide {
    /// An agent's connection to a `server` binding.
    Server,
    /// A `client` binding's connection to its upstream.
    Client,
}

impl TlsSide {
    const ALL: [TlsSide; 2] = [TlsSide::Server, TlsSide::Client];

    fn label(self) -> &'static str {
        match self {
            TlsSide::Server => "server",
            TlsSide::Client => "client",
        }
    }
}

/// Why a TLS handshake failed, as a metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsFailure {
    Timeout,
    Closed,
    Io,
    CertificateExpired,
    CertificateName,
    CertificateUnknownIssuer,
    CertificateInvalid,
    AlertReceived,
    Incompatible,
    Protocol,
}

impl TlsFailure {
    const ALL: [TlsFailure; 10] = [
        TlsFailure::Timeout,
        TlsFailure::Closed,
        TlsFailure::Io,
        TlsFailure::CertificateExpired,
        TlsFailure::CertificateName,
        TlsFailure::CertificateUnknownIssuer,
        TlsFailure::CertificateInvalid,
        TlsFailure::AlertReceived,
        TlsFailure::Incompatible,
        TlsFailure::Protocol,
    ];

    /// The label value (`reason="…"`).
    pub fn label(self) -> &'static str {
        match self {
            TlsFailure::Timeout => "timeout",
            TlsFailure::Closed => "closed",
            TlsFailure::Io => "io",
            TlsFailure::CertificateExpired => "certificate_expired",
            TlsFailure::CertificateName => "certificate_name",
            TlsFailure::CertificateUnknownIssuer => "certificate_unknown_issuer",
            TlsFailure::CertificateInvalid => "certificate_invalid",
            TlsFailure::AlertReceived => "alert_received",
            TlsFailure::Incompatible => "incompatible",
            TlsFailure::Protocol => "protocol",
        }
    }

    fn index(self) -> usize {
        TlsFailure::ALL
            .iter()
            .position(|f| *f == self)
            .unwrap_or_default()
    }
}

/// TLS handshakes per edge: completed, resumed, failed by reason, and how long the
/// completed ones took (µs; allocated at the first one, most gateways use one edge).
#[derive(Clone, Default)]
pub struct TlsMetrics {
    pub ok: [u64; 2],
    pub resumed: [u64; 2],
    pub failed: [[u64; TlsFailure::ALL.len()]; 2],
    pub latency: [Option<Histogram<u64>>; 2],
}

impl TlsMetrics {
    fn merge(&mut self, o: &TlsMetrics) {
        for side in 0..2 {
            self.ok[side] += o.ok[side];
            self.resumed[side] += o.resumed[side];
            for (a, b) in self.failed[side].iter_mut().zip(&o.failed[side]) {
                *a += b;
            }
            match (&mut self.latency[side], &o.latency[side]) {
                (Some(a), Some(b)) => {
                    let _ = a.add(b);
                }
                (a @ None, Some(b)) => *a = Some(b.clone()),
                (_, None) => {}
            }
        }
    }

    fn render(&self, out: &mut String) {
        if self
            .ok
            .iter()
            .chain(self.failed.iter().flatten())
            .all(|n| *n == 0)
        {
            return;
        }
        out.push_str("# HELP mcpyard_tls_handshakes_total TLS handshakes by edge and result (ok, resumed is a subset of ok, or the failure reason).\n");
        out.push_str("# TYPE mcpyard_tls_handshakes_total counter\n");
        for (i, side) in TlsSide::ALL.iter().enumerate() {
            let side = side.label();
            let _ = writeln!(
                out,
                "mcpyard_tls_handshakes_total{{side=\"{side}\",result=\"ok\"}} {}",
                self.ok[i]
            );
            let _ = writeln!(
                out,
                "mcpyard_tls_handshakes_total{{side=\"{side}\",result=\"resumed\"}} {}",
                self.resumed[i]
            );
            for (reason, n) in TlsFailure::ALL.iter().zip(&self.failed[i]) {
                if *n > 0 {
                    let _ = writeln!(
                        out,
                        "mcpyard_tls_handshakes_total{{side=\"{side}\",result=\"{}\"}} {n}",
                        reason.label()
                    );
                }
            }
        }
        out.push_str(
            "# HELP mcpyard_tls_handshake_seconds Time of completed TLS handshakes, by edge.\n",
        );
        out.push_str("# TYPE mcpyard_tls_handshake_seconds summary\n");
        for (side, h) in TlsSide::ALL.iter().zip(&self.latency) {
            if let Some(h) = h {
                let labels = format!("side=\"{}\"", side.label());
                write_summary(out, "mcpyard_tls_handshake_seconds", &labels, h, 1e6);
            }
        }
    }
}

/// Counts one TLS handshake (`failure` None: it completed) and times a completed one.
pub fn record_tls_handshake(
    side: TlsSide,
    failure: Option<TlsFailure>,
    resumed: bool,
    took: Duration,
) {
    let i = match side {
        TlsSide::Server => 0,
        TlsSide::Client => 1,
    };
    with(|m| match failure {
        Some(f) => m.tls.failed[i][f.index()] += 1,
        None => {
            m.tls.ok[i] += 1;
            if resumed {
                m.tls.resumed[i] += 1;
            }
            m.tls.latency[i]
                .get_or_insert_with(|| histogram(LATENCY_US_MAX))
                .saturating_record(micros(took));
        }
    });
}

/// Distinct toolkit labels kept per worker; more share the last entry's counts (config
/// bounds routes far below this).
const TOOLKIT_LABELS_MAX: usize = 256;

/// Requests one toolkit (proxy route) served.
#[derive(Clone)]
pub struct ToolkitMetrics {
    /// The toolkit's name.
    pub toolkit: String,
    /// By method label index (as `requests`): outcome counts and latency in µs, the
    /// histogram allocated at a method's first request.
    pub methods: Vec<([u64; 4], Option<Histogram<u64>>)>,
    /// Cache hydration of this toolkit's lists: outcome counts and latency in µs.
    pub hydration: ([u64; 4], Option<Histogram<u64>>),
}

impl ToolkitMetrics {
    fn new(toolkit: &str) -> Self {
        ToolkitMetrics {
            toolkit: toolkit.to_owned(),
            methods: vec![([0; 4], None); METHODS],
            hydration: ([0; 4], None),
        }
    }

    fn merge(&mut self, o: &ToolkitMetrics) {
        for (mine, theirs) in self
            .methods
            .iter_mut()
            .chain(std::iter::once(&mut self.hydration))
            .zip(o.methods.iter().chain(std::iter::once(&o.hydration)))
        {
            for (a, b) in mine.0.iter_mut().zip(theirs.0) {
                *a += b;
            }
            match (&mut mine.1, &theirs.1) {
                (Some(a), Some(b)) => {
                    let _ = a.add(b);
                }
                (None, Some(b)) => mine.1 = Some(b.clone()),
                _ => {}
            }
        }
    }
}

/// Counters of the proxies' list caches.
#[derive(Clone, Default)]
pub struct CacheMetrics {
    /// List requests answered from the cache, and ones it could not answer yet.
    pub hits: u64,
    pub misses: u64,
    /// Hydrations of one list kind that got every route's list, and ones that did not.
    pub refreshes_ok: u64,
    pub refreshes_failed: u64,
    /// Times a worker took a cache's hydration lease.
    pub lease_changes: u64,
    /// `list_changed` notifications sent to agent sessions after a cached list changed.
    pub notifications: u64,
}

impl CacheMetrics {
    fn merge(&mut self, o: &CacheMetrics) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.refreshes_ok += o.refreshes_ok;
        self.refreshes_failed += o.refreshes_failed;
        self.lease_changes += o.lease_changes;
        self.notifications += o.notifications;
    }

    fn series(&self) -> [(&'static str, &'static str, u64); 6] {
        [
            (
                "mcpyard_cache_hits_total",
                "List requests answered from the cache.",
                self.hits,
            ),
            (
                "mcpyard_cache_misses_total",
                "List requests the cache could not answer yet (served live).",
                self.misses,
            ),
            (
                "mcpyard_cache_refreshes_ok_total",
                "Hydrations of a list kind that got every route's list.",
                self.refreshes_ok,
            ),
            (
                "mcpyard_cache_refreshes_failed_total",
                "Hydrations of a list kind where a route failed (its previous list kept).",
                self.refreshes_failed,
            ),
            (
                "mcpyard_cache_lease_changes_total",
                "Times a worker took a cache's hydration lease.",
                self.lease_changes,
            ),
            (
                "mcpyard_cache_notifications_total",
                "list_changed notifications sent after a cached list changed.",
                self.notifications,
            ),
        ]
    }
}

/// Counters of the `proxy` bindings.
#[derive(Clone, Default)]
pub struct ProxyMetrics {
    /// Routes skipped when a session was opened (they failed or challenged).
    pub routes_skipped: u64,
    /// Route sessions that ended on their own mid-session.
    pub routes_ended: u64,
    /// Routes left out of a merged list answer (failed or timed out).
    pub list_omitted: u64,
    /// List items dropped: not admitted by an allow-list, malformed or too large.
    pub items_dropped: u64,
    /// Agent answers to server-to-client requests whose route could not be found.
    pub answers_unroutable: u64,
}

impl ProxyMetrics {
    fn merge(&mut self, o: &ProxyMetrics) {
        self.routes_skipped += o.routes_skipped;
        self.routes_ended += o.routes_ended;
        self.list_omitted += o.list_omitted;
        self.items_dropped += o.items_dropped;
        self.answers_unroutable += o.answers_unroutable;
    }

    /// (name, help, value) of every proxy counter.
    fn series(&self) -> [(&'static str, &'static str, u64); 5] {
        [
            (
                "mcpyard_proxy_routes_skipped_total",
                "Routes skipped when a session opened (failed or challenged).",
                self.routes_skipped,
            ),
            (
                "mcpyard_proxy_routes_ended_total",
                "Route sessions that ended on their own.",
                self.routes_ended,
            ),
            (
                "mcpyard_proxy_list_omitted_total",
                "Routes left out of a merged list (failed or timed out).",
                self.list_omitted,
            ),
            (
                "mcpyard_proxy_items_dropped_total",
                "List items dropped (allow-list, malformed, too large).",
                self.items_dropped,
            ),
            (
                "mcpyard_proxy_answers_unroutable_total",
                "Agent answers whose route could not be found.",
                self.answers_unroutable,
            ),
        ]
    }
}

/// Counters of the upstream-facing `client` bindings.
#[derive(Clone, Default)]
pub struct UpstreamMetrics {
    /// Upstream connections open now.
    pub connections: u64,
    /// Upstream sessions open now.
    pub sessions: u64,
    /// Connections established, and new connections that no address gave (each refused,
    /// timed out or failed its handshake): one failure however many addresses were tried.
    pub connects: u64,
    pub connect_failures: u64,
    /// Requests that reused a pooled connection.
    pub reused: u64,
    /// Pooled connections found closed (or expired) when taken, and dropped.
    pub stale_dropped: u64,
    /// Requests sent again after a reused connection turned out closed.
    pub stale_retries: u64,
    /// Request streams served, failed (error to the agent), cancelled by the agent.
    pub requests: u64,
    pub failed: u64,
    pub cancelled: u64,
    /// Response heads that did not arrive within the response timeout.
    pub timeouts: u64,
    /// Upstream sessions re-initialized after a 404.
    pub reinitialized: u64,
    /// `initialize` exchanges that failed.
    pub initialize_failures: u64,
    /// Upstream sessions another node opened, taken up from a shared session's handoff.
    pub adopted: u64,
    /// 401/403 answers carrying a Bearer challenge.
    pub bearer_challenges: u64,
    /// Request event streams resumed with Last-Event-ID.
    pub resumed: u64,
    /// Upstream event-stream messages that were not JSON-RPC (skipped).
    pub malformed: u64,
}

impl UpstreamMetrics {
    fn merge(&mut self, o: &UpstreamMetrics) {
        self.connections += o.connections;
        self.sessions += o.sessions;
        self.connects += o.connects;
        self.connect_failures += o.connect_failures;
        self.reused += o.reused;
        self.stale_dropped += o.stale_dropped;
        self.stale_retries += o.stale_retries;
        self.requests += o.requests;
        self.failed += o.failed;
        self.cancelled += o.cancelled;
        self.timeouts += o.timeouts;
        self.reinitialized += o.reinitialized;
        self.initialize_failures += o.initialize_failures;
        self.adopted += o.adopted;
        self.bearer_challenges += o.bearer_challenges;
        self.resumed += o.resumed;
        self.malformed += o.malformed;
    }

    /// (name, help, value, is_gauge) of every upstream series.
    fn series(&self) -> [(&'static str, &'static str, u64, bool); 17] {
        [
            (
                "mcpyard_upstream_connections",
                "Upstream connections open.",
                self.connections,
                true,
            ),
            (
                "mcpyard_upstream_sessions",
                "Upstream sessions open.",
                self.sessions,
                true,
            ),
            (
                "mcpyard_upstream_connects_total",
                "Upstream connections established.",
                self.connects,
                false,
            ),
            (
                "mcpyard_upstream_connect_failures_total",
                "Upstream connection attempts that failed.",
                self.connect_failures,
                false,
            ),
            (
                "mcpyard_upstream_reused_total",
                "Upstream requests on a pooled connection.",
                self.reused,
                false,
            ),
            (
                "mcpyard_upstream_stale_dropped_total",
                "Pooled upstream connections found closed or expired.",
                self.stale_dropped,
                false,
            ),
            (
                "mcpyard_upstream_stale_retries_total",
                "Requests resent after a pooled connection was found closed.",
                self.stale_retries,
                false,
            ),
            (
                "mcpyard_upstream_requests_total",
                "Request streams sent upstream.",
                self.requests,
                false,
            ),
            (
                "mcpyard_upstream_failed_total",
                "Upstream requests that ended in an error to the agent.",
                self.failed,
                false,
            ),
            (
                "mcpyard_upstream_cancelled_total",
                "Upstream requests cancelled by the agent.",
                self.cancelled,
                false,
            ),
            (
                "mcpyard_upstream_timeouts_total",
                "Upstream responses that missed the response timeout.",
                self.timeouts,
                false,
            ),
            (
                "mcpyard_upstream_reinitialized_total",
                "Upstream sessions re-initialized after a 404.",
                self.reinitialized,
                false,
            ),
            (
                "mcpyard_upstream_initialize_failures_total",
                "Upstream initialize exchanges that failed.",
                self.initialize_failures,
                false,
            ),
            (
                "mcpyard_upstream_adopted_total",
                "Upstream sessions another node opened, taken up without an initialize.",
                self.adopted,
                false,
            ),
            (
                "mcpyard_upstream_bearer_challenges_total",
                "Upstream 401/403 answers with a Bearer challenge.",
                self.bearer_challenges,
                false,
            ),
            (
                "mcpyard_upstream_resumed_total",
                "Upstream request streams resumed with Last-Event-ID.",
                self.resumed,
                false,
            ),
            (
                "mcpyard_upstream_malformed_total",
                "Upstream event-stream messages that were not JSON-RPC.",
                self.malformed,
                false,
            ),
        ]
    }
}

impl WorkerMetrics {
    fn new() -> Self {
        Self {
            requests: vec![None; METHODS * Outcome::ALL.len()],
            window_grants: histogram(GRANT_BYTES_MAX),
            window_stalls: histogram(LATENCY_US_MAX),
            window_stalls_slow: 0,
            slots_in_use: 0,
            slots_total: 0,
            slots_registered: 0,
            slot_exhausted: 0,
            sessions: 0,
            connections: 0,
            sessions_created: 0,
            sessions_expired: 0,
            sessions_adopted: 0,
            sessions_detached: 0,
            session_store_failures: 0,
            connections_accepted: 0,
            overload_rejections: 0,
            handoffs: 0,
            http_errors: 0,
            events_replay_missed: 0,
            heads_refused_downstream: 0,
            heads_refused_upstream: 0,
            uring_flushes: 0,
            upstream: UpstreamMetrics::default(),
            proxy: ProxyMetrics::default(),
            cache: CacheMetrics::default(),
            toolkits: Vec::new(),
            tls: TlsMetrics::default(),
        }
    }

    fn merge(&mut self, other: &WorkerMetrics) {
        for (a, b) in self.requests.iter_mut().zip(&other.requests) {
            match (a, b) {
                // Same bounds on both sides, so adding cannot fail.
                (Some(a), Some(b)) => {
                    let _ = a.add(b);
                }
                (a @ None, Some(b)) => *a = Some(b.clone()),
                (_, None) => {}
            }
        }
        let _ = self.window_grants.add(&other.window_grants);
        let _ = self.window_stalls.add(&other.window_stalls);
        self.window_stalls_slow += other.window_stalls_slow;
        self.slots_in_use += other.slots_in_use;
        self.slots_total += other.slots_total;
        self.slots_registered += other.slots_registered;
        self.slot_exhausted += other.slot_exhausted;
        self.sessions += other.sessions;
        self.connections += other.connections;
        self.sessions_created += other.sessions_created;
        self.sessions_expired += other.sessions_expired;
        self.sessions_adopted += other.sessions_adopted;
        self.sessions_detached += other.sessions_detached;
        self.session_store_failures += other.session_store_failures;
        self.connections_accepted += other.connections_accepted;
        self.overload_rejections += other.overload_rejections;
        self.handoffs += other.handoffs;
        self.http_errors += other.http_errors;
        self.events_replay_missed += other.events_replay_missed;
        self.heads_refused_downstream += other.heads_refused_downstream;
        self.heads_refused_upstream += other.heads_refused_upstream;
        self.uring_flushes += other.uring_flushes;
        self.upstream.merge(&other.upstream);
        self.proxy.merge(&other.proxy);
        self.cache.merge(&other.cache);
        self.tls.merge(&other.tls);
        for theirs in &other.toolkits {
            match self
                .toolkits
                .iter_mut()
                .find(|t| t.toolkit == theirs.toolkit)
            {
                Some(mine) => mine.merge(theirs),
                None => self.toolkits.push(theirs.clone()),
            }
        }
    }
}

thread_local! {
    static LOCAL: RefCell<WorkerMetrics> = RefCell::new(WorkerMetrics::new());
}

/// Runs `f` on this worker's metrics.
pub fn with<R>(f: impl FnOnce(&mut WorkerMetrics) -> R) -> R {
    LOCAL.with(|m| f(&mut m.borrow_mut()))
}

/// A copy of this worker's metrics, for a scrape.
pub fn snapshot() -> WorkerMetrics {
    LOCAL.with(|m| m.borrow().clone())
}

fn method_index(method: &str) -> usize {
    if let Some(i) = Kind::REQUESTS.iter().position(|k| k.method() == method) {
        return i;
    }
    let local = LOCAL_METHODS
        .iter()
        .position(|m| *m == method)
        .unwrap_or(LOCAL_METHODS.len() - 1);
    Kind::REQUESTS.len() + local
}

fn method_label(index: usize) -> &'static str {
    match Kind::REQUESTS.get(index) {
        Some(k) => k.method(),
        None => LOCAL_METHODS
            .get(index - Kind::REQUESTS.len())
            .copied()
            .unwrap_or("other"),
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Records one finished request.
pub fn record_request(method: &str, outcome: Outcome, latency: Duration) {
    let i = method_index(method) * Outcome::ALL.len() + outcome as usize;
    with(|m| {
        if let Some(h) = m.requests.get_mut(i) {
            h.get_or_insert_with(|| histogram(LATENCY_US_MAX))
                .saturating_record(micros(latency));
        }
    });
}

/// The slot of `toolkit` in this worker's per-toolkit metrics, made on first use (a proxy
/// route asks once, when the worker builds it). Past `TOOLKIT_LABELS_MAX` labels, new ones
/// share the last slot.
pub fn toolkit_slot(toolkit: &str) -> usize {
    with(
        |m| match m.toolkits.iter().position(|t| t.toolkit == toolkit) {
            Some(at) => at,
            None if m.toolkits.len() < TOOLKIT_LABELS_MAX => {
                m.toolkits.push(ToolkitMetrics::new(toolkit));
                m.toolkits.len() - 1
            }
            None => m.toolkits.len().saturating_sub(1),
        },
    )
}

/// Records one request a proxy route served (its slot from [`toolkit_slot`]), seen from
/// the proxy: upstream time included.
pub fn record_toolkit(slot: usize, kind: Kind, outcome: Outcome, latency: Duration) {
    let index = kind_index(kind);
    with(|m| {
        let Some((counts, latencies)) = m
            .toolkits
            .get_mut(slot)
            .and_then(|t| t.methods.get_mut(index))
        else {
            return;
        };
        if let Some(count) = counts.get_mut(outcome as usize) {
            *count += 1;
        }
        latencies
            .get_or_insert_with(|| histogram(LATENCY_US_MAX))
            .saturating_record(micros(latency));
    });
}

/// Records one route's list hydration for a proxy cache (its slot from [`toolkit_slot`]).
pub fn record_hydration(slot: usize, outcome: Outcome, latency: Duration) {
    with(|m| {
        let Some(t) = m.toolkits.get_mut(slot) else {
            return;
        };
        if let Some(count) = t.hydration.0.get_mut(outcome as usize) {
            *count += 1;
        }
        t.hydration
            .1
            .get_or_insert_with(|| histogram(LATENCY_US_MAX))
            .saturating_record(micros(latency));
    });
}

/// The method label index of a stream kind (`other` for the lifecycle and unknown methods).
fn kind_index(kind: Kind) -> usize {
    match Kind::REQUESTS.iter().position(|k| *k == kind) {
        Some(i) => i,
        None => Kind::REQUESTS.len() + LOCAL_METHODS.len() - 1,
    }
}

/// Records one WINDOW grant of `bytes`.
pub fn record_window_grant(bytes: u32) {
    with(|m| m.window_grants.saturating_record(u64::from(bytes).max(1)));
}

/// Records a sender having waited `stall` for credit.
pub fn record_window_stall(stall: Duration) {
    with(|m| {
        m.window_stalls.saturating_record(micros(stall));
        if stall > WINDOW_STALL_SLOW {
            m.window_stalls_slow += 1;
        }
    });
}

/// Quantiles exported for every histogram.
const QUANTILES: [f64; 6] = [0.5, 0.9, 0.99, 0.999, 0.9999, 1.0];

fn write_summary(out: &mut String, name: &str, labels: &str, h: &Histogram<u64>, scale: f64) {
    let sep = if labels.is_empty() { "" } else { "," };
    for q in QUANTILES {
        let v = h.value_at_quantile(q) as f64 / scale;
        let _ = writeln!(out, "{name}{{{labels}{sep}quantile=\"{q}\"}} {v}");
    }
    let sum = h.mean() * h.len() as f64 / scale;
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.len());
}

/// Merges the workers' metrics and renders Prometheus text exposition format.
pub fn render(workers: &[WorkerMetrics]) -> String {
    let mut all = WorkerMetrics::new();
    for w in workers {
        all.merge(w);
    }
    let mut out = String::with_capacity(8 * 1024);
    out.push_str(
        "# HELP mcpyard_request_seconds Downstream request latency by method and outcome.\n",
    );
    out.push_str("# TYPE mcpyard_request_seconds summary\n");
    for (i, h) in all.requests.iter().enumerate() {
        let Some(h) = h.as_ref().filter(|h| !h.is_empty()) else {
            continue;
        };
        let method = method_label(i / Outcome::ALL.len());
        let outcome = Outcome::ALL
            .get(i % Outcome::ALL.len())
            .map_or("ok", |o| o.label());
        let labels = format!("method=\"{method}\",outcome=\"{outcome}\"");
        write_summary(&mut out, "mcpyard_request_seconds", &labels, h, 1e6);
    }
    out.push_str(
        "# HELP mcpyard_window_grant_bytes Credit returned per WINDOW on internal streams.\n",
    );
    out.push_str("# TYPE mcpyard_window_grant_bytes summary\n");
    write_summary(
        &mut out,
        "mcpyard_window_grant_bytes",
        "",
        &all.window_grants,
        1.0,
    );
    out.push_str("# HELP mcpyard_window_stall_seconds Time a stream sender waited for credit.\n");
    out.push_str("# TYPE mcpyard_window_stall_seconds summary\n");
    write_summary(
        &mut out,
        "mcpyard_window_stall_seconds",
        "",
        &all.window_stalls,
        1e6,
    );
    let gauges: [(&str, &str, u64); 7] = [
        (
            "mcpyard_slots_in_use",
            "Buffer slots borrowed now.",
            all.slots_in_use,
        ),
        (
            "mcpyard_slots",
            "Buffer slots owned by all workers.",
            all.slots_total,
        ),
        (
            "mcpyard_slots_registered",
            "Slots registered with io_uring as fixed buffers.",
            all.slots_registered,
        ),
        ("mcpyard_sessions", "Live MCP sessions.", all.sessions),
        (
            "mcpyard_connections",
            "Open downstream connections.",
            all.connections,
        ),
        (
            "mcpyard_workers",
            "Workers (one per core).",
            workers.len() as u64,
        ),
        ("mcpyard_up", "1 while mcpyard serves.", 1),
    ];
    for (name, help, v) in gauges {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    }
    let counters: [(&str, &str, u64); 15] = [
        (
            "mcpyard_uring_flushes_total",
            "io_uring_enter calls that submitted a scheduler round's operations at once.",
            all.uring_flushes,
        ),
        (
            "mcpyard_window_stalls_slow_total",
            "Window stalls longer than 1 ms.",
            all.window_stalls_slow,
        ),
        (
            "mcpyard_slot_exhausted_total",
            "Reads that found the slot pool empty.",
            all.slot_exhausted,
        ),
        (
            "mcpyard_sessions_created_total",
            "Sessions created.",
            all.sessions_created,
        ),
        (
            "mcpyard_sessions_expired_total",
            "Sessions expired for inactivity.",
            all.sessions_expired,
        ),
        (
            "mcpyard_sessions_adopted_total",
            "Shared sessions another node opened, taken up from the session store.",
            all.sessions_adopted,
        ),
        (
            "mcpyard_sessions_detached_total",
            "Shared sessions let go of while they live on at another node.",
            all.sessions_detached,
        ),
        (
            "mcpyard_sessions_store_failures_total",
            "Shared-session record reads and writes that failed.",
            all.session_store_failures,
        ),
        (
            "mcpyard_connections_accepted_total",
            "Downstream connections accepted.",
            all.connections_accepted,
        ),
        (
            "mcpyard_overload_rejections_total",
            "Requests refused because a table or pool was full.",
            all.overload_rejections,
        ),
        (
            "mcpyard_handoffs_total",
            "Requests handed to the worker owning their session.",
            all.handoffs,
        ),
        (
            "mcpyard_http_errors_total",
            "Requests answered with an HTTP error before MCP handling.",
            all.http_errors,
        ),
        (
            "mcpyard_events_replay_missed_total",
            "GET streams resumed after an event the replay ring no longer held.",
            all.events_replay_missed,
        ),
        (
            "mcpyard_downstream_heads_refused_total",
            "Responses to agents not written because a header value held a control byte.",
            all.heads_refused_downstream,
        ),
        (
            "mcpyard_upstream_heads_refused_total",
            "Requests to upstreams not sent because a header value held a control byte.",
            all.heads_refused_upstream,
        ),
    ];
    for (name, help, v) in counters {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    }
    render_toolkits(&mut out, &all.toolkits);
    all.tls.render(&mut out);
    for (name, help, v) in all.proxy.series().into_iter().chain(all.cache.series()) {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
        );
    }
    for (name, help, v, gauge) in all.upstream.series() {
        let kind = if gauge { "gauge" } else { "counter" };
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
        );
    }
    store::render(&mut out);
    out
}

/// The per-toolkit series: request counts by method and outcome, latency by method.
fn render_toolkits(out: &mut String, toolkits: &[ToolkitMetrics]) {
    if toolkits.is_empty() {
        return;
    }
    out.push_str("# HELP mcpyard_toolkit_requests_total Requests a proxy route served, by toolkit, method and outcome.\n");
    out.push_str("# TYPE mcpyard_toolkit_requests_total counter\n");
    for t in toolkits {
        for (i, (counts, _)) in t.methods.iter().enumerate() {
            for (outcome, count) in Outcome::ALL.iter().zip(counts) {
                if *count > 0 {
                    let _ = writeln!(
                        out,
                        "mcpyard_toolkit_requests_total{{toolkit=\"{}\",method=\"{}\",outcome=\"{}\"}} {count}",
                        t.toolkit,
                        method_label(i),
                        outcome.label()
                    );
                }
            }
        }
    }
    out.push_str("# HELP mcpyard_toolkit_hydrations_total Cache hydrations of a toolkit's lists, by outcome.\n");
    out.push_str("# TYPE mcpyard_toolkit_hydrations_total counter\n");
    for t in toolkits {
        for (outcome, count) in Outcome::ALL.iter().zip(t.hydration.0) {
            if count > 0 {
                let _ = writeln!(
                    out,
                    "mcpyard_toolkit_hydrations_total{{toolkit=\"{}\",outcome=\"{}\"}} {count}",
                    t.toolkit,
                    outcome.label()
                );
            }
        }
    }
    out.push_str("# HELP mcpyard_toolkit_hydration_seconds Latency of one cache hydration of a toolkit's list.\n");
    out.push_str("# TYPE mcpyard_toolkit_hydration_seconds summary\n");
    for t in toolkits {
        if let Some(h) = &t.hydration.1 {
            let labels = format!("toolkit=\"{}\"", t.toolkit);
            write_summary(out, "mcpyard_toolkit_hydration_seconds", &labels, h, 1e6);
        }
    }
    out.push_str("# HELP mcpyard_toolkit_seconds Latency of requests through a proxy route, by toolkit and method.\n");
    out.push_str("# TYPE mcpyard_toolkit_seconds summary\n");
    for t in toolkits {
        for (i, (_, latency)) in t.methods.iter().enumerate() {
            if let Some(h) = latency {
                let labels = format!("toolkit=\"{}\",method=\"{}\"", t.toolkit, method_label(i));
                write_summary(out, "mcpyard_toolkit_seconds", &labels, h, 1e6);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_into(m: &mut WorkerMetrics, us: u64) {
        m.requests[0]
            .get_or_insert_with(|| histogram(LATENCY_US_MAX))
            .saturating_record(us);
    }

    #[test]
    fn only_methods_seen_hold_a_histogram() {
        // Runs on its own test thread, so this thread's metrics start empty.
        assert!(snapshot().requests.iter().all(Option::is_none));
        record_request("tools/call", Outcome::Ok, Duration::from_micros(50));
        record_request("tools/call", Outcome::Ok, Duration::from_micros(70));
        let held: Vec<usize> = snapshot()
            .requests
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.as_ref().map(|_| i))
            .collect();
        assert_eq!(held, [method_index("tools/call") * Outcome::ALL.len()]);
    }

    #[test]
    fn render_merges_workers() {
        let mut a = WorkerMetrics::new();
        let mut b = WorkerMetrics::new();
        a.sessions = 2;
        b.sessions = 3;
        record_into(&mut a, 100);
        record_into(&mut b, 300);
        let text = render(&[a, b]);
        assert!(text.contains("mcpyard_sessions 5\n"), "{text}");
        assert!(
            text.contains(
                "mcpyard_request_seconds_count{method=\"tools/list\",outcome=\"ok\"} 2\n"
            )
        );
        assert!(text.contains("mcpyard_workers 2\n"));
    }

    #[test]
    fn slow_stalls_are_counted_exactly() {
        // Runs on its own test thread, so this thread's metrics start empty.
        record_window_stall(Duration::from_micros(999));
        record_window_stall(WINDOW_STALL_SLOW);
        record_window_stall(Duration::from_micros(1001));
        record_window_stall(Duration::from_millis(40));
        let text = render(&[snapshot()]);
        assert!(
            text.contains("mcpyard_window_stalls_slow_total 2\n"),
            "{text}"
        );
        assert!(text.contains("mcpyard_window_stall_seconds_count{} 4\n"));
    }

    #[test]
    fn request_labels_round_trip() {
        for k in Kind::REQUESTS {
            assert_eq!(method_label(method_index(k.method())), k.method());
        }
        assert_eq!(method_label(method_index("initialize")), "initialize");
        assert_eq!(method_label(method_index("something/else")), "other");
    }
}
