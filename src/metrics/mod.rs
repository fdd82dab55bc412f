//! The worker-wide metrics core: what the runtime, stream and store layers record, and the
//! machinery every binding's metrics share.
//!
//! Each worker records into its own thread-local [`WorkerMetrics`]; nothing on the request
//! path takes a lock or touches a shared cache line. A scrape asks every worker (over its
//! cross-worker queue) for a [`WorkerMetrics`] clone and merges them with [`render`].
//!
//! This core holds the counters more than one layer writes (`overload_rejections`), the
//! runtime's
//! (slots, io_uring flushes, TLS handshakes), the streams' (window grants and stalls), and
//! the networked stores' ([`store`]). Each binding keeps its own metrics beside it, in the
//! same per-worker way, registered in `binding/metrics.rs`; they build on the helpers
//! here: [`histogram`], [`merge_histogram`], [`micros`], [`Outcome`],
//! [`write_summary`], [`write_counter`] and [`write_gauge`].

pub mod store;

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
    /// Every outcome, in label order (`outcome as usize` is the index).
    pub const ALL: [Outcome; 4] = [
        Outcome::Ok,
        Outcome::Error,
        Outcome::Cancelled,
        Outcome::Rejected,
    ];

    /// The label value (`outcome="…"`).
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Cancelled => "cancelled",
            Outcome::Rejected => "rejected",
        }
    }
}

/// Upper bound of recorded latencies and stalls, in microseconds (one hour).
pub const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Upper bound of recorded window grants, in bytes.
const GRANT_BYTES_MAX: u64 = 1 << 32;
/// A window stall longer than this is counted in `mcpyard_window_stalls_slow_total`, so
/// "how many stalls passed 1 ms" is exact rather than bounded by the summary's quantiles.
pub const WINDOW_STALL_SLOW: Duration = Duration::from_millis(1);
/// Significant figures kept by every histogram.
const SIGFIGS: u8 = 3;
/// A histogram of values from 1 to `max`, with the precision every metric uses.
pub fn histogram(max: u64) -> Histogram<u64> {
    // Bounds are constants known to be valid, so construction cannot fail.
    match Histogram::new_with_bounds(1, max, SIGFIGS) {
        Ok(h) => h,
        Err(e) => unreachable!("histogram bounds are constant: {e}"),
    }
}

/// Adds `theirs` into `mine`, copying it when `mine` has none yet.
pub fn merge_histogram(mine: &mut Option<Histogram<u64>>, theirs: Option<&Histogram<u64>>) {
    match (mine, theirs) {
        // Same bounds on both sides, so adding cannot fail.
        (Some(a), Some(b)) => {
            let _ = a.add(b);
        }
        (a @ None, Some(b)) => *a = Some(b.clone()),
        (_, None) => {}
    }
}

/// A duration in whole microseconds, at least 1 (a histogram's lowest value).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// One worker's core counters, gauges and histograms (the bindings keep theirs beside
/// them).
#[derive(Clone)]
pub struct WorkerMetrics {
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
    /// Encodes that found no pooled encode buffer free and allocated one.
    pub encode_buffer_misses: u64,
    /// Requests refused by a full table (sessions, connections, streams, pools), in any
    /// binding.
    pub overload_rejections: u64,
    /// io_uring_enter calls of the worker's prompt-submission flusher (counted by it).
    pub uring_flushes: u64,
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
        for (a, b) in self.ok.iter_mut().zip(o.ok) {
            *a += b;
        }
        for (a, b) in self.resumed.iter_mut().zip(o.resumed) {
            *a += b;
        }
        for (a, b) in self
            .failed
            .iter_mut()
            .flatten()
            .zip(o.failed.iter().flatten())
        {
            *a += b;
        }
        for (a, b) in self.latency.iter_mut().zip(&o.latency) {
            merge_histogram(a, b.as_ref());
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
        for (((side, ok), resumed), failed) in TlsSide::ALL
            .iter()
            .zip(self.ok)
            .zip(self.resumed)
            .zip(&self.failed)
        {
            let side = side.label();
            let _ = writeln!(
                out,
                "mcpyard_tls_handshakes_total{{side=\"{side}\",result=\"ok\"}} {ok}"
            );
            let _ = writeln!(
                out,
                "mcpyard_tls_handshakes_total{{side=\"{side}\",result=\"resumed\"}} {resumed}"
            );
            for (reason, n) in TlsFailure::ALL.iter().zip(failed) {
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
        Some(f) => {
            if let Some(n) = m
                .tls
                .failed
                .get_mut(i)
                .and_then(|row| row.get_mut(f.index()))
            {
                *n += 1;
            }
        }
        None => {
            if let Some(n) = m.tls.ok.get_mut(i) {
                *n += 1;
            }
            if resumed && let Some(n) = m.tls.resumed.get_mut(i) {
                *n += 1;
            }
            if let Some(h) = m.tls.latency.get_mut(i) {
                h.get_or_insert_with(|| histogram(LATENCY_US_MAX))
                    .saturating_record(micros(took));
            }
        }
    });
}

impl WorkerMetrics {
    fn new() -> Self {
        Self {
            window_grants: histogram(GRANT_BYTES_MAX),
            window_stalls: histogram(LATENCY_US_MAX),
            window_stalls_slow: 0,
            slots_in_use: 0,
            slots_total: 0,
            slots_registered: 0,
            slot_exhausted: 0,
            encode_buffer_misses: 0,
            overload_rejections: 0,
            uring_flushes: 0,
            tls: TlsMetrics::default(),
        }
    }

    fn merge(&mut self, other: &WorkerMetrics) {
        let _ = self.window_grants.add(&other.window_grants);
        let _ = self.window_stalls.add(&other.window_stalls);
        self.window_stalls_slow += other.window_stalls_slow;
        self.slots_in_use += other.slots_in_use;
        self.slots_total += other.slots_total;
        self.slots_registered += other.slots_registered;
        self.slot_exhausted += other.slot_exhausted;
        self.encode_buffer_misses += other.encode_buffer_misses;
        self.overload_rejections += other.overload_rejections;
        self.uring_flushes += other.uring_flushes;
        self.tls.merge(&other.tls);
    }
}

/// Defines a module's per-worker metrics of type `$t` (which has a `const fn new`): a
/// thread-local, `with(|m| ...)` to record into it and `snapshot()` for a scrape. Every
/// binding's metrics module uses it, so each records without a lock or a shared line.
macro_rules! per_worker {
    ($t:ty, $what:literal) => {
        thread_local! {
            static LOCAL: std::cell::RefCell<$t> = const { std::cell::RefCell::new(<$t>::new()) };
        }

        #[doc = concat!("Runs `f` on this worker's ", $what, " metrics.")]
        pub fn with<R>(f: impl FnOnce(&mut $t) -> R) -> R {
            LOCAL.with(|m| f(&mut m.borrow_mut()))
        }

        #[doc = concat!("A copy of this worker's ", $what, " metrics, for a scrape.")]
        pub fn snapshot() -> $t {
            LOCAL.with(|m| m.borrow().clone())
        }
    };
}
pub(crate) use per_worker;

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

/// Writes the sample lines of one summary series (`labels` without braces, may be empty;
/// values divided by `scale`). The family's HELP and TYPE lines are the caller's.
pub fn write_summary(out: &mut String, name: &str, labels: &str, h: &Histogram<u64>, scale: f64) {
    let sep = if labels.is_empty() { "" } else { "," };
    for q in QUANTILES {
        let v = h.value_at_quantile(q) as f64 / scale;
        let _ = writeln!(out, "{name}{{{labels}{sep}quantile=\"{q}\"}} {v}");
    }
    let sum = h.mean() * h.len() as f64 / scale;
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.len());
}

/// Writes a whole counter family of one unlabelled series: HELP, TYPE and its value.
pub fn write_counter(out: &mut String, name: &str, help: &str, value: u64) {
    write_single(out, name, help, "counter", value);
}

/// Writes a whole gauge family of one unlabelled series: HELP, TYPE and its value.
pub fn write_gauge(out: &mut String, name: &str, help: &str, value: u64) {
    write_single(out, name, help, "gauge", value);
}

fn write_single(out: &mut String, name: &str, help: &str, kind: &str, value: u64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
    );
}

/// Merges the workers' core metrics and appends them to `out` in Prometheus text
/// exposition format, the networked stores' series included. The bindings' series are
/// `binding::metrics::render`'s.
pub fn render(workers: &[WorkerMetrics], out: &mut String) {
    let mut all = WorkerMetrics::new();
    for w in workers {
        all.merge(w);
    }
    out.push_str(
        "# HELP mcpyard_window_grant_bytes Credit returned per WINDOW on internal streams.\n",
    );
    out.push_str("# TYPE mcpyard_window_grant_bytes summary\n");
    write_summary(
        out,
        "mcpyard_window_grant_bytes",
        "",
        &all.window_grants,
        1.0,
    );
    out.push_str("# HELP mcpyard_window_stall_seconds Time a stream sender waited for credit.\n");
    out.push_str("# TYPE mcpyard_window_stall_seconds summary\n");
    write_summary(
        out,
        "mcpyard_window_stall_seconds",
        "",
        &all.window_stalls,
        1e6,
    );
    let gauges: [(&str, &str, u64); 5] = [
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
        (
            "mcpyard_workers",
            "Workers (one per core).",
            workers.len() as u64,
        ),
        ("mcpyard_up", "1 while mcpyard serves.", 1),
    ];
    for (name, help, v) in gauges {
        write_gauge(out, name, help, v);
    }
    let counters: [(&str, &str, u64); 5] = [
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
            "mcpyard_encode_buffer_misses_total",
            "Encodes that found no pooled encode buffer free and allocated one.",
            all.encode_buffer_misses,
        ),
        (
            "mcpyard_overload_rejections_total",
            "Requests refused because a table or pool was full.",
            all.overload_rejections,
        ),
    ];
    for (name, help, v) in counters {
        write_counter(out, name, help, v);
    }
    all.tls.render(out);
    store::render(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(workers: &[WorkerMetrics]) -> String {
        let mut out = String::new();
        render(workers, &mut out);
        out
    }

    #[test]
    fn render_merges_workers() {
        let mut a = WorkerMetrics::new();
        let mut b = WorkerMetrics::new();
        a.overload_rejections = 2;
        b.overload_rejections = 3;
        let text = rendered(&[a, b]);
        assert!(
            text.contains("mcpyard_overload_rejections_total 5\n"),
            "{text}"
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
        let text = rendered(&[snapshot()]);
        assert!(
            text.contains("mcpyard_window_stalls_slow_total 2\n"),
            "{text}"
        );
        assert!(text.contains("mcpyard_window_stall_seconds_count{} 4\n"));
    }

    #[test]
    fn tls_handshakes_merge_by_edge() {
        // Runs on its own test thread, so this thread's metrics start empty.
        let took = Duration::from_millis(2);
        record_tls_handshake(TlsSide::Server, None, true, took);
        record_tls_handshake(TlsSide::Client, Some(TlsFailure::Timeout), false, took);
        let text = rendered(&[snapshot(), snapshot()]);
        for line in [
            "mcpyard_tls_handshakes_total{side=\"server\",result=\"ok\"} 2\n",
            "mcpyard_tls_handshakes_total{side=\"server\",result=\"resumed\"} 2\n",
            "mcpyard_tls_handshakes_total{side=\"client\",result=\"ok\"} 0\n",
            "mcpyard_tls_handshakes_total{side=\"client\",result=\"timeout\"} 2\n",
            "mcpyard_tls_handshake_seconds_count{side=\"server\"} 2\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert!(!text.contains("mcpyard_tls_handshake_seconds_count{side=\"client\"}"));
    }
}
