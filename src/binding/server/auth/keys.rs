//! The key reader: one task per server binding with `auth`, on worker 0, that reads the
//! key set at start, every `jwt.refresh`, and when a worker meets a token naming a key the
//! set lacks (at most once per [`super::JWKS_REFETCH_INTERVAL_MIN`]).
//!
//! How the bytes are read is given by the caller (`gateway.rs`): a file, or an HTTPS `GET`
//! through the client binding's connections. A failed read keeps the set in use and is
//! logged once until a read works again; until the first set is loaded reads are retried
//! every [`JWKS_RETRY_INTERVAL`] and requests are answered 503.

use super::Guard;
use crate::binding::server::metrics as server_metrics;
use crate::log;
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Pause between reads while no key set has been loaded yet.
pub const JWKS_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Reads the key set with `read`, forever (the caller drops it at drain).
pub async fn run<F, Fut>(name: &str, guard: Arc<Guard>, mut read: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Bytes, String>>,
{
    let mut failing = false;
    loop {
        match read().await.and_then(|bytes| crate::jwks::parse(&bytes)) {
            Ok(set) => {
                server_metrics::with(|m| m.jwks_reads_ok += 1);
                if failing {
                    log::info(format_args!("auth: {name}: the key set is read again"));
                }
                failing = false;
                let keys = set.keys.len();
                if guard.install(set) {
                    log::info(format_args!("auth: {name}: key set loaded, {keys} keys"));
                }
            }
            Err(e) => {
                server_metrics::with(|m| m.jwks_reads_failed += 1);
                if !failing {
                    // Escaped: the reason can carry what the endpoint sent (a certificate's
                    // names, in a TLS failure).
                    log::warn(format_args!(
                        "auth: {name}: cannot read the key set: {} (the last good one stays in use)",
                        log::field(e.as_bytes())
                    ));
                }
                failing = true;
            }
        }
        guard.read_finished();
        let wait = if guard.has_keys() {
            guard.cfg.jwt.refresh
        } else {
            JWKS_RETRY_INTERVAL.min(guard.cfg.jwt.refresh)
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = guard.asked() => {
                tokio::time::sleep_until(guard.next_asked_read().into()).await;
            }
        }
    }
}
