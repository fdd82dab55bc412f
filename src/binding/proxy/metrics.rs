//! The `proxy` bindings' metrics: route and list counters, the list caches' counters, and
//! per toolkit (proxy route) the requests it served and its cache hydrations, kept per
//! worker like the core's ([`crate::metrics`]) and registered for scrapes in
//! `binding/metrics.rs`.
//!
//! The proxy also records `overload_rejections` into the core (a full table).

use crate::binding::methods::{METHODS, kind_index, method_label};
use crate::metrics::{self, Outcome};
use crate::stream::Kind;
use hdrhistogram::Histogram;
use std::fmt::Write;
use std::time::Duration;

/// Distinct toolkit labels kept per worker; more share the last entry's counts (config
/// bounds routes far below this).
const TOOLKIT_LABELS_MAX: usize = 256;

/// Requests one toolkit (proxy route) served.
#[derive(Clone)]
pub struct ToolkitMetrics {
    /// The toolkit's name.
    pub toolkit: String,
    /// By method label index (as the core's `requests`): outcome counts and latency in
    /// µs, the histogram allocated at a method's first request.
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
            metrics::merge_histogram(&mut mine.1, theirs.1.as_ref());
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
    /// All zero.
    pub const fn new() -> Self {
        CacheMetrics {
            hits: 0,
            misses: 0,
            refreshes_ok: 0,
            refreshes_failed: 0,
            lease_changes: 0,
            notifications: 0,
        }
    }

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

/// One worker's metrics of the `proxy` bindings: their counters, their list caches' and
/// their toolkits'.
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
    /// The proxies' list caches.
    pub cache: CacheMetrics,
    /// Per toolkit (proxy route): requests by method and outcome, and their latency.
    /// Invariant: `len() <= TOOLKIT_LABELS_MAX`, names unique.
    pub toolkits: Vec<ToolkitMetrics>,
}

impl ProxyMetrics {
    /// All zero, no toolkit yet (a `const fn`, so the thread-local needs no lazy
    /// initialization).
    pub const fn new() -> Self {
        ProxyMetrics {
            routes_skipped: 0,
            routes_ended: 0,
            list_omitted: 0,
            items_dropped: 0,
            answers_unroutable: 0,
            cache: CacheMetrics::new(),
            toolkits: Vec::new(),
        }
    }

    /// Adds another worker's counts into these, toolkits matched by name.
    pub fn merge(&mut self, o: &ProxyMetrics) {
        self.routes_skipped += o.routes_skipped;
        self.routes_ended += o.routes_ended;
        self.list_omitted += o.list_omitted;
        self.items_dropped += o.items_dropped;
        self.answers_unroutable += o.answers_unroutable;
        self.cache.merge(&o.cache);
        for theirs in &o.toolkits {
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

    /// Appends every proxy series to a scrape: the per-toolkit families, then the proxy
    /// and cache counters.
    pub fn render(&self, out: &mut String) {
        render_toolkits(out, &self.toolkits);
        for (name, help, value) in self.series().into_iter().chain(self.cache.series()) {
            metrics::write_counter(out, name, help, value);
        }
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

metrics::per_worker!(ProxyMetrics, "proxy");

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
            .get_or_insert_with(|| metrics::histogram(metrics::LATENCY_US_MAX))
            .saturating_record(metrics::micros(latency));
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
            .get_or_insert_with(|| metrics::histogram(metrics::LATENCY_US_MAX))
            .saturating_record(metrics::micros(latency));
    });
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
            metrics::write_summary(out, "mcpyard_toolkit_hydration_seconds", &labels, h, 1e6);
        }
    }
    out.push_str("# HELP mcpyard_toolkit_seconds Latency of requests through a proxy route, by toolkit and method.\n");
    out.push_str("# TYPE mcpyard_toolkit_seconds summary\n");
    for t in toolkits {
        for (i, (_, latency)) in t.methods.iter().enumerate() {
            if let Some(h) = latency {
                let labels = format!("toolkit=\"{}\",method=\"{}\"", t.toolkit, method_label(i));
                metrics::write_summary(out, "mcpyard_toolkit_seconds", &labels, h, 1e6);
            }
        }
    }
}
