//! The one place where the bindings' metrics are registered for scrapes.
//!
//! Each binding keeps its own per-worker metrics beside it (`server/metrics.rs`,
//! `proxy/metrics.rs`, `client/metrics.rs`; the demo has none) with a thread-local and a
//! `with` accessor, as the core does for what the layers below record
//! ([`crate::metrics`]). A scrape takes a [`snapshot`] of every worker's (beside the
//! core's), merges them and appends their series with [`render`]. Only this file imports
//! more than one binding's metrics; no binding imports another's.

use crate::binding::client::metrics::{self as client, UpstreamMetrics};
use crate::binding::proxy::metrics::{self as proxy, ProxyMetrics};
use crate::binding::server::metrics::{self as server, ServerMetrics};

/// One worker's metrics of every binding.
#[derive(Clone, Default)]
pub struct BindingMetrics {
    /// The agent-facing `server` bindings.
    pub server: ServerMetrics,
    /// The `proxy` bindings, their list caches and their toolkits.
    pub proxy: ProxyMetrics,
    /// The upstream-facing `client` bindings.
    pub client: UpstreamMetrics,
}

impl BindingMetrics {
    /// Adds another worker's metrics into these.
    pub fn merge(&mut self, o: &BindingMetrics) {
        self.server.merge(&o.server);
        self.proxy.merge(&o.proxy);
        self.client.merge(&o.client);
    }
}

/// A copy of this worker's binding metrics, for a scrape.
pub fn snapshot() -> BindingMetrics {
    BindingMetrics {
        server: server::snapshot(),
        proxy: proxy::snapshot(),
        client: client::snapshot(),
    }
}

/// Merges the workers' binding metrics and appends their series to `out`, in Prometheus
/// text exposition format (each family's lines together).
pub fn render(workers: &[BindingMetrics], out: &mut String) {
    let mut all = BindingMetrics::default();
    for w in workers {
        all.merge(w);
    }
    all.server.render(out);
    all.proxy.render(out);
    all.client.render(out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Outcome;
    use crate::stream::Kind;
    use std::time::Duration;

    fn rendered(workers: &[BindingMetrics]) -> String {
        let mut out = String::new();
        render(workers, &mut out);
        out
    }

    #[test]
    fn render_merges_every_binding_of_every_worker() {
        let mut a = BindingMetrics::default();
        let mut b = BindingMetrics::default();
        a.server.sessions = 2;
        b.server.sessions = 3;
        a.proxy.cache.hits = 4;
        b.client.heads_refused = 1;
        b.client.connections = 6;
        let text = rendered(&[a, b]);
        for line in [
            "# TYPE mcpyard_sessions gauge\nmcpyard_sessions 5\n",
            "# TYPE mcpyard_cache_hits_total counter\nmcpyard_cache_hits_total 4\n",
            "# TYPE mcpyard_upstream_heads_refused_total counter\nmcpyard_upstream_heads_refused_total 1\n",
            "# TYPE mcpyard_upstream_connections gauge\nmcpyard_upstream_connections 6\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        // No toolkit recorded anything: none of their families is written.
        assert!(!text.contains("mcpyard_toolkit"), "{text}");
    }

    #[test]
    fn toolkits_merge_by_name_across_workers() {
        // Runs on its own test thread, so this thread's metrics start empty.
        let slot = proxy::toolkit_slot("alpha");
        assert_eq!(proxy::toolkit_slot("alpha"), slot);
        proxy::record_toolkit(
            slot,
            Kind::ToolsCall,
            Outcome::Ok,
            Duration::from_micros(80),
        );
        proxy::record_hydration(slot, Outcome::Error, Duration::from_micros(90));
        let mine = snapshot();
        let mut other = BindingMetrics::default();
        other.proxy.toolkits.push(mine.proxy.toolkits[0].clone());
        let text = rendered(&[mine, other]);
        for line in [
            "mcpyard_toolkit_requests_total{toolkit=\"alpha\",method=\"tools/call\",outcome=\"ok\"} 2\n",
            "mcpyard_toolkit_hydrations_total{toolkit=\"alpha\",outcome=\"error\"} 2\n",
            "mcpyard_toolkit_seconds_count{toolkit=\"alpha\",method=\"tools/call\"} 2\n",
            "mcpyard_toolkit_hydration_seconds_count{toolkit=\"alpha\"} 2\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
    }
}
