//! Metrics of the networked stores: operations by outcome, their latency, and whether the
//! store is connected.
//!
//! Unlike the workers' metrics, these are process-wide atomics: a redis store's operations
//! run on its own thread (and a refused one is counted on the worker that asked), so no
//! worker owns them. Each store registers one [`StoreStats`] when it starts; [`render`]
//! reads every registered one at scrape time.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Stores whose metrics are kept; a config with more (it would be odd) has the rest
/// unmetered rather than an unbounded registry.
const STORES_MAX: usize = 64;

/// A store operation, as a metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOp {
    Get,
    Put,
    Delete,
    Lock,
    Renew,
    Unlock,
}

impl StoreOp {
    const ALL: [StoreOp; 6] = [
        StoreOp::Get,
        StoreOp::Put,
        StoreOp::Delete,
        StoreOp::Lock,
        StoreOp::Renew,
        StoreOp::Unlock,
    ];

    /// The label value (`op="…"`).
    pub fn label(self) -> &'static str {
        match self {
            StoreOp::Get => "get",
            StoreOp::Put => "put",
            StoreOp::Delete => "delete",
            StoreOp::Lock => "lock",
            StoreOp::Renew => "renew",
            StoreOp::Unlock => "unlock",
        }
    }
}

/// How a store operation ended, as a metrics label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOutcome {
    /// The store answered (whatever the answer: a lease held by another is `ok`).
    Ok,
    /// The store answered with an error, or with a reply that made no sense.
    Error,
    /// No answer within the operation's deadline.
    Timeout,
    /// Refused without asking the store: not connected, or the queue was full.
    Unavailable,
}

impl StoreOutcome {
    const ALL: [StoreOutcome; 4] = [
        StoreOutcome::Ok,
        StoreOutcome::Error,
        StoreOutcome::Timeout,
        StoreOutcome::Unavailable,
    ];

    fn label(self) -> &'static str {
        match self {
            StoreOutcome::Ok => "ok",
            StoreOutcome::Error => "error",
            StoreOutcome::Timeout => "timeout",
            StoreOutcome::Unavailable => "unavailable",
        }
    }
}

/// Upper bounds of the latency histogram's buckets, in microseconds (Prometheus `le`).
const BUCKETS_US: [u64; 12] = [
    250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
];

/// One store's metrics.
pub struct StoreStats {
    /// The store's name in `stores:`.
    name: Box<str>,
    /// `[op][outcome]` counts.
    operations: [[AtomicU64; StoreOutcome::ALL.len()]; StoreOp::ALL.len()],
    /// Operations that got an answer, by the first bucket their latency fits (the last
    /// slot: above every bound).
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    /// Sum of those operations' latencies, µs.
    sum_us: AtomicU64,
    /// True while the store has a working connection.
    connected: AtomicBool,
}

impl StoreStats {
    /// Counts one operation and, unless it was refused, its latency.
    pub fn record(&self, op: StoreOp, outcome: StoreOutcome, took: Duration) {
        let (o, x) = (op as usize, outcome as usize);
        if let Some(n) = self.operations.get(o).and_then(|row| row.get(x)) {
            n.fetch_add(1, Ordering::Relaxed);
        }
        if outcome == StoreOutcome::Unavailable {
            return;
        }
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        let at = BUCKETS_US
            .iter()
            .position(|le| us <= *le)
            .unwrap_or(BUCKETS_US.len());
        if let Some(b) = self.buckets.get(at) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// Sets the `connected` gauge.
    pub fn set_connected(&self, connected: bool) {
        self.connected.store(connected, Ordering::Relaxed);
    }

    /// The count of `op` that ended in `outcome` (for tests).
    pub fn count(&self, op: StoreOp, outcome: StoreOutcome) -> u64 {
        self.operations
            .get(op as usize)
            .and_then(|row| row.get(outcome as usize))
            .map_or(0, |n| n.load(Ordering::Relaxed))
    }
}

static STORES: Mutex<Vec<Arc<StoreStats>>> = Mutex::new(Vec::new());

/// The metrics of a new store named `name`, registered for scrapes (the first 64 stores).
pub fn register(name: &str) -> Arc<StoreStats> {
    let stats = Arc::new(StoreStats {
        name: Box::from(name),
        operations: Default::default(),
        buckets: Default::default(),
        sum_us: AtomicU64::new(0),
        connected: AtomicBool::new(false),
    });
    let mut stores = STORES.lock().unwrap_or_else(|e| e.into_inner());
    if stores.len() < STORES_MAX {
        stores.push(stats.clone());
    }
    stats
}

/// Appends the stores' series to a scrape; nothing when no networked store runs.
pub fn render(out: &mut String) {
    let stores = STORES.lock().unwrap_or_else(|e| e.into_inner()).clone();
    if stores.is_empty() {
        return;
    }
    out.push_str(
        "# HELP mcpyard_store_connected 1 while a networked store has a working connection.\n",
    );
    out.push_str("# TYPE mcpyard_store_connected gauge\n");
    for s in &stores {
        let up = u8::from(s.connected.load(Ordering::Relaxed));
        let _ = writeln!(out, "mcpyard_store_connected{{store=\"{}\"}} {up}", s.name);
    }
    out.push_str(
        "# HELP mcpyard_store_operations_total Store operations by operation and outcome.\n",
    );
    out.push_str("# TYPE mcpyard_store_operations_total counter\n");
    for s in &stores {
        for op in StoreOp::ALL {
            for outcome in StoreOutcome::ALL {
                let _ = writeln!(
                    out,
                    "mcpyard_store_operations_total{{store=\"{}\",op=\"{}\",outcome=\"{}\"}} {}",
                    s.name,
                    op.label(),
                    outcome.label(),
                    s.count(op, outcome)
                );
            }
        }
    }
    out.push_str(
        "# HELP mcpyard_store_operation_seconds Time from asking a store to its answer.\n",
    );
    out.push_str("# TYPE mcpyard_store_operation_seconds histogram\n");
    for s in &stores {
        let mut cumulative = 0u64;
        for (le, n) in BUCKETS_US.iter().zip(&s.buckets) {
            cumulative += n.load(Ordering::Relaxed);
            let le = *le as f64 / 1e6;
            let _ = writeln!(
                out,
                "mcpyard_store_operation_seconds_bucket{{store=\"{}\",le=\"{le}\"}} {cumulative}",
                s.name
            );
        }
        cumulative += s.buckets.last().map_or(0, |n| n.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "mcpyard_store_operation_seconds_bucket{{store=\"{}\",le=\"+Inf\"}} {cumulative}",
            s.name
        );
        let sum = s.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "mcpyard_store_operation_seconds_sum{{store=\"{}\"}} {sum}\nmcpyard_store_operation_seconds_count{{store=\"{}\"}} {cumulative}",
            s.name, s.name
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_are_counted_and_bucketed_cumulatively() {
        let s = register("metrics-test-store");
        s.record(StoreOp::Get, StoreOutcome::Ok, Duration::from_micros(100));
        s.record(StoreOp::Get, StoreOutcome::Ok, Duration::from_millis(3));
        s.record(StoreOp::Put, StoreOutcome::Timeout, Duration::from_secs(3));
        s.record(StoreOp::Lock, StoreOutcome::Unavailable, Duration::ZERO);
        s.set_connected(true);
        let mut out = String::new();
        render(&mut out);
        let has = |line: &str| out.lines().any(|l| l == line);
        assert!(
            has("mcpyard_store_connected{store=\"metrics-test-store\"} 1"),
            "{out}"
        );
        assert!(has(
            "mcpyard_store_operations_total{store=\"metrics-test-store\",op=\"get\",outcome=\"ok\"} 2"
        ));
        assert!(has(
            "mcpyard_store_operations_total{store=\"metrics-test-store\",op=\"lock\",outcome=\"unavailable\"} 1"
        ));
        assert!(has(
            "mcpyard_store_operation_seconds_bucket{store=\"metrics-test-store\",le=\"0.00025\"} 1"
        ));
        assert!(has(
            "mcpyard_store_operation_seconds_bucket{store=\"metrics-test-store\",le=\"0.005\"} 2"
        ));
        assert!(has(
            "mcpyard_store_operation_seconds_bucket{store=\"metrics-test-store\",le=\"+Inf\"} 3"
        ));
        assert!(has(
            "mcpyard_store_operation_seconds_count{store=\"metrics-test-store\"} 3"
        ));
    }
}
