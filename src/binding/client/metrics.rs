//! The `client` bindings' metrics: upstream connections, sessions and requests, kept per
//! worker like the core's ([`crate::metrics`]) and registered for scrapes in
//! `binding/metrics.rs`.
//!
//! The client also records into the core: `overload_rejections` (a full pool) and its TLS
//! handshakes. Upstream `initialize` exchanges are counted here, not among the agents'
//! requests (`mcpyard_request_seconds`), which they would otherwise inflate by one per
//! route.

use crate::metrics;

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
    /// `initialize` exchanges that succeeded, and ones that failed.
    pub initializes: u64,
    pub initialize_failures: u64,
    /// Upstream sessions another node opened, taken up from a shared session's handoff.
    pub adopted: u64,
    /// 401/403 answers carrying a Bearer challenge.
    pub bearer_challenges: u64,
    /// Request event streams resumed with Last-Event-ID.
    pub resumed: u64,
    /// Upstream event-stream messages that were not JSON-RPC (skipped).
    pub malformed: u64,
    /// Requests not sent because a header value held a control byte (`http::HeadError`).
    pub heads_refused: u64,
}

impl UpstreamMetrics {
    /// All zero (a `const fn`, so the thread-local needs no lazy initialization).
    pub const fn new() -> Self {
        UpstreamMetrics {
            connections: 0,
            sessions: 0,
            connects: 0,
            connect_failures: 0,
            reused: 0,
            stale_dropped: 0,
            stale_retries: 0,
            requests: 0,
            failed: 0,
            cancelled: 0,
            timeouts: 0,
            reinitialized: 0,
            initializes: 0,
            initialize_failures: 0,
            adopted: 0,
            bearer_challenges: 0,
            resumed: 0,
            malformed: 0,
            heads_refused: 0,
        }
    }

    /// Adds another worker's counts into these.
    pub fn merge(&mut self, o: &UpstreamMetrics) {
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
        self.initializes += o.initializes;
        self.initialize_failures += o.initialize_failures;
        self.adopted += o.adopted;
        self.bearer_challenges += o.bearer_challenges;
        self.resumed += o.resumed;
        self.malformed += o.malformed;
        self.heads_refused += o.heads_refused;
    }

    /// Appends every upstream series to a scrape (one unlabelled series per family).
    pub fn render(&self, out: &mut String) {
        for (name, help, value, gauge) in self.series() {
            if gauge {
                metrics::write_gauge(out, name, help, value);
            } else {
                metrics::write_counter(out, name, help, value);
            }
        }
    }

    /// (name, help, value, is_gauge) of every upstream series.
    fn series(&self) -> [(&'static str, &'static str, u64, bool); 19] {
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
                "mcpyard_upstream_initializes_total",
                "Upstream initialize exchanges that succeeded.",
                self.initializes,
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
            (
                "mcpyard_upstream_heads_refused_total",
                "Requests to upstreams not sent because a header value held a control byte.",
                self.heads_refused,
                false,
            ),
        ]
    }
}

metrics::per_worker!(UpstreamMetrics, "upstream");

/// Counts an upstream event-stream message that was not JSON-RPC (skipped), on a session's
/// GET stream or a call's answer stream. Out of line: a rare branch inside the loops that
/// read those streams, one of them on the request path.
#[cold]
#[inline(never)]
pub fn count_malformed() {
    with(|m| m.malformed += 1);
}
