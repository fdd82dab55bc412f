//! The `server` bindings' metrics: agent sessions and connections, hand-offs between
//! workers, HTTP errors and replay misses, kept per worker like the core's
//! ([`crate::metrics`]) and registered for scrapes in `binding/metrics.rs`.
//!
//! Each agent request's latency by method and outcome (`record_request`,
//! `mcpyard_request_seconds`) is here too. The server also records into the core:
//! `overload_rejections` (a full table) and its TLS handshakes.

use crate::binding::methods::{METHODS, method_index, method_label};
use crate::metrics::{self, LATENCY_US_MAX, Outcome, histogram, merge_histogram, micros};
use hdrhistogram::Histogram;
use std::time::Duration;

/// Labels of `mcpyard_auth_rejected_total`: why the `auth` check refused a request.
pub const REJECTION_LABELS: [&str; 6] =
    ["missing", "invalid", "expired", "scope", "subject", "keys"];
/// Index of the `subject` label (a request on another subject's session).
pub const REJECTED_SUBJECT: usize = 4;

/// One worker's counters and gauges of the server bindings.
#[derive(Clone, Default)]
pub struct ServerMetrics {
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
    /// Requests naming a shared session the store was just found not to hold, answered 404
    /// without reading the store again.
    pub sessions_absent_remembered: u64,
    pub connections_accepted: u64,
    /// Requests handed to another worker (the session lives there).
    pub handoffs: u64,
    /// Responses cut because a write to the agent outlasted the reply's deadline, or one
    /// write on a stream without one (a GET stream) outlasted the write limit.
    pub write_deadline_cuts: u64,
    /// HTTP requests answered with a 4xx/5xx before reaching MCP handling.
    pub http_errors: u64,
    /// GET streams resumed from an event no longer in the session's replay ring.
    pub events_replay_missed: u64,
    /// Responses to agents not written because a header value held a control byte
    /// (`http::HeadError`).
    pub heads_refused_downstream: u64,
    /// Request latency in µs, per method label and outcome (index `method_index *
    /// Outcome::ALL.len() + outcome`); empty until the first request, then `METHODS *
    /// Outcome::ALL.len()` long. A histogram is allocated at the first request of its
    /// method and outcome: most pairs never occur, and a histogram is ~190 KiB that every
    /// scrape would otherwise copy.
    pub requests: Vec<Option<Histogram<u64>>>,
    /// `auth`: requests refused, by `auth::REJECTION_LABELS`; tokens verified (by a
    /// signature check, or by the worker's memory of it); key set reads.
    pub auth_rejected: [u64; 6],
    pub auth_verified: u64,
    pub auth_verified_cached: u64,
    /// Signature checks made (a token verified, or refused, for the first time).
    pub auth_signature_checks: u64,
    /// Verified tokens a full memory let go of, and rate buckets a full table dropped
    /// before they had filled up again.
    pub auth_tokens_evicted: u64,
    pub rate_buckets_evicted: u64,
    pub jwks_reads_ok: u64,
    pub jwks_reads_failed: u64,
    /// Requests refused by a rate limit, by the limit's name (bounded by the config: at
    /// most `AUTH_LIMITS_MAX` names per server binding).
    pub rate_limited: Vec<(Box<str>, u64)>,
}

impl ServerMetrics {
    /// All zero (a `const fn`, so the thread-local needs no lazy initialization).
    pub const fn new() -> Self {
        ServerMetrics {
            sessions: 0,
            connections: 0,
            sessions_created: 0,
            sessions_expired: 0,
            sessions_adopted: 0,
            sessions_detached: 0,
            session_store_failures: 0,
            sessions_absent_remembered: 0,
            connections_accepted: 0,
            handoffs: 0,
            write_deadline_cuts: 0,
            http_errors: 0,
            events_replay_missed: 0,
            heads_refused_downstream: 0,
            requests: Vec::new(),
            auth_rejected: [0; 6],
            auth_verified: 0,
            auth_verified_cached: 0,
            auth_signature_checks: 0,
            auth_tokens_evicted: 0,
            rate_buckets_evicted: 0,
            jwks_reads_ok: 0,
            jwks_reads_failed: 0,
            rate_limited: Vec::new(),
        }
    }

    /// Adds another worker's counts into these.
    pub fn merge(&mut self, o: &ServerMetrics) {
        self.sessions += o.sessions;
        self.connections += o.connections;
        self.sessions_created += o.sessions_created;
        self.sessions_expired += o.sessions_expired;
        self.sessions_adopted += o.sessions_adopted;
        self.sessions_detached += o.sessions_detached;
        self.session_store_failures += o.session_store_failures;
        self.sessions_absent_remembered += o.sessions_absent_remembered;
        self.connections_accepted += o.connections_accepted;
        self.handoffs += o.handoffs;
        self.write_deadline_cuts += o.write_deadline_cuts;
        self.http_errors += o.http_errors;
        self.events_replay_missed += o.events_replay_missed;
        self.heads_refused_downstream += o.heads_refused_downstream;
        for (a, b) in self.auth_rejected.iter_mut().zip(&o.auth_rejected) {
            *a += b;
        }
        self.auth_verified += o.auth_verified;
        self.auth_verified_cached += o.auth_verified_cached;
        self.auth_signature_checks += o.auth_signature_checks;
        self.auth_tokens_evicted += o.auth_tokens_evicted;
        self.rate_buckets_evicted += o.rate_buckets_evicted;
        self.jwks_reads_ok += o.jwks_reads_ok;
        self.jwks_reads_failed += o.jwks_reads_failed;
        for (name, n) in &o.rate_limited {
            count_limited(&mut self.rate_limited, name, *n);
        }
        if self.requests.len() < o.requests.len() {
            self.requests.resize(o.requests.len(), None);
        }
        for (a, b) in self.requests.iter_mut().zip(&o.requests) {
            merge_histogram(a, b.as_ref());
        }
    }

    /// Appends every server series to a scrape (one unlabelled series per family).
    pub fn render(&self, out: &mut String) {
        out.push_str(
            "# HELP mcpyard_request_seconds Downstream request latency by method and outcome.\n",
        );
        out.push_str("# TYPE mcpyard_request_seconds summary\n");
        for (i, h) in self.requests.iter().enumerate() {
            let Some(h) = h.as_ref().filter(|h| !h.is_empty()) else {
                continue;
            };
            let method = method_label(i / Outcome::ALL.len());
            let outcome = Outcome::ALL
                .get(i % Outcome::ALL.len())
                .map_or("ok", |o| o.label());
            let labels = format!("method=\"{method}\",outcome=\"{outcome}\"");
            metrics::write_summary(out, "mcpyard_request_seconds", &labels, h, 1e6);
        }
        let gauges: [(&str, &str, u64); 2] = [
            ("mcpyard_sessions", "Live MCP sessions.", self.sessions),
            (
                "mcpyard_connections",
                "Open downstream connections.",
                self.connections,
            ),
        ];
        for (name, help, value) in gauges {
            metrics::write_gauge(out, name, help, value);
        }
        let counters: [(&str, &str, u64); 12] = [
            (
                "mcpyard_sessions_created_total",
                "Sessions created.",
                self.sessions_created,
            ),
            (
                "mcpyard_sessions_expired_total",
                "Sessions expired for inactivity.",
                self.sessions_expired,
            ),
            (
                "mcpyard_sessions_adopted_total",
                "Shared sessions another node opened, taken up from the session store.",
                self.sessions_adopted,
            ),
            (
                "mcpyard_sessions_detached_total",
                "Shared sessions let go of while they live on at another node.",
                self.sessions_detached,
            ),
            (
                "mcpyard_sessions_store_failures_total",
                "Shared-session record reads and writes that failed.",
                self.session_store_failures,
            ),
            (
                "mcpyard_sessions_absent_remembered_total",
                "Requests naming a shared session the store was just found not to hold, answered 404 without a store read.",
                self.sessions_absent_remembered,
            ),
            (
                "mcpyard_connections_accepted_total",
                "Downstream connections accepted.",
                self.connections_accepted,
            ),
            (
                "mcpyard_handoffs_total",
                "Requests handed to the worker owning their session.",
                self.handoffs,
            ),
            (
                "mcpyard_write_deadline_cuts_total",
                "Responses cut because a write to the agent outlasted its deadline.",
                self.write_deadline_cuts,
            ),
            (
                "mcpyard_http_errors_total",
                "Requests answered with an HTTP error before MCP handling.",
                self.http_errors,
            ),
            (
                "mcpyard_events_replay_missed_total",
                "GET streams resumed after an event the replay ring no longer held.",
                self.events_replay_missed,
            ),
            (
                "mcpyard_downstream_heads_refused_total",
                "Responses to agents not written because a header value held a control byte.",
                self.heads_refused_downstream,
            ),
        ];
        for (name, help, value) in counters {
            metrics::write_counter(out, name, help, value);
        }
        self.render_auth(out);
    }

    /// The `auth` families. Fixed label sets are written whole (zeros too), so dashboards
    /// see the family before the first event; limits appear once one has refused.
    fn render_auth(&self, out: &mut String) {
        use std::fmt::Write as _;
        out.push_str(
            "# HELP mcpyard_auth_rejected_total Requests refused by the token check, by reason.\n",
        );
        out.push_str("# TYPE mcpyard_auth_rejected_total counter\n");
        for (label, n) in REJECTION_LABELS.iter().zip(&self.auth_rejected) {
            let _ = writeln!(out, "mcpyard_auth_rejected_total{{reason=\"{label}\"}} {n}");
        }
        out.push_str("# HELP mcpyard_auth_verified_total Tokens accepted; cached: the worker's memory of a verified token answered.\n");
        out.push_str("# TYPE mcpyard_auth_verified_total counter\n");
        let _ = writeln!(
            out,
            "mcpyard_auth_verified_total{{cached=\"false\"}} {}",
            self.auth_verified
        );
        let _ = writeln!(
            out,
            "mcpyard_auth_verified_total{{cached=\"true\"}} {}",
            self.auth_verified_cached
        );
        out.push_str(
            "# HELP mcpyard_jwks_reads_total Reads of token signing key sets, by outcome.\n",
        );
        out.push_str("# TYPE mcpyard_jwks_reads_total counter\n");
        let _ = writeln!(
            out,
            "mcpyard_jwks_reads_total{{outcome=\"ok\"}} {}",
            self.jwks_reads_ok
        );
        let _ = writeln!(
            out,
            "mcpyard_jwks_reads_total{{outcome=\"failed\"}} {}",
            self.jwks_reads_failed
        );
        let counters: [(&str, &str, u64); 3] = [
            (
                "mcpyard_auth_signature_checks_total",
                "Token signature checks (a token met for the first time; replays are answered from memory).",
                self.auth_signature_checks,
            ),
            (
                "mcpyard_auth_tokens_evicted_total",
                "Verified tokens a worker's full memory let go of before they expired.",
                self.auth_tokens_evicted,
            ),
            (
                "mcpyard_rate_buckets_evicted_total",
                "Rate buckets a worker's full table dropped before they had filled up again.",
                self.rate_buckets_evicted,
            ),
        ];
        for (name, help, value) in counters {
            metrics::write_counter(out, name, help, value);
        }
        out.push_str(
            "# HELP mcpyard_rate_limited_total Requests refused by a rate limit, by limit name.\n",
        );
        out.push_str("# TYPE mcpyard_rate_limited_total counter\n");
        for (name, n) in &self.rate_limited {
            let _ = writeln!(out, "mcpyard_rate_limited_total{{limit=\"{name}\"}} {n}");
        }
    }
}

/// Counts a request the `auth` check refused, by its index in [`REJECTION_LABELS`].
pub fn count_rejected(label: usize) {
    with(|m| {
        if let Some(n) = m.auth_rejected.get_mut(label) {
            *n += 1;
        }
    });
}

/// Adds `n` to the count of limit `name` (names come from the config: bounded, and label-safe).
pub fn count_limited(counts: &mut Vec<(Box<str>, u64)>, name: &str, n: u64) {
    match counts.iter_mut().find(|(k, _)| &**k == name) {
        Some((_, count)) => *count += n,
        None => counts.push((Box::from(name), n)),
    }
}

metrics::per_worker!(ServerMetrics, "server");

/// Records one finished agent request.
pub fn record_request(method: &str, outcome: Outcome, latency: Duration) {
    let i = method_index(method) * Outcome::ALL.len() + outcome as usize;
    with(|m| {
        if m.requests.is_empty() {
            m.requests.resize(METHODS * Outcome::ALL.len(), None);
        }
        if let Some(h) = m.requests.get_mut(i) {
            h.get_or_insert_with(|| histogram(LATENCY_US_MAX))
                .saturating_record(micros(latency));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_methods_seen_hold_a_histogram_and_workers_merge() {
        // Runs on its own test thread, so this thread's metrics start empty.
        assert!(snapshot().requests.is_empty());
        record_request("tools/call", Outcome::Ok, Duration::from_micros(50));
        record_request("tools/call", Outcome::Ok, Duration::from_micros(70));
        let held: Vec<usize> = snapshot()
            .requests
            .iter()
            .enumerate()
            .filter_map(|(i, h)| h.as_ref().map(|_| i))
            .collect();
        assert_eq!(held, [method_index("tools/call") * Outcome::ALL.len()]);
        // A worker that served nothing merges in, either way round.
        let mut all = ServerMetrics::new();
        all.merge(&snapshot());
        all.merge(&ServerMetrics::new());
        all.merge(&snapshot());
        let mut out = String::new();
        all.render(&mut out);
        assert!(
            out.contains("mcpyard_request_seconds_count{method=\"tools/call\",outcome=\"ok\"} 4\n"),
            "{out}"
        );
        assert!(out.contains("# TYPE mcpyard_request_seconds summary\n"));
    }
}
