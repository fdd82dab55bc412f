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
use tokio::time::Instant;

/// Pause between reads while no key set has been loaded yet.
pub const JWKS_RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// How long the last good key set stays in use while reads fail: at least this, and at
/// least two refresh periods. Past it the set is dropped and tokens are answered 503
/// until a read works again: an issuer's withdrawn key must not stay trusted for good
/// because its key set endpoint went unreachable (or was made so).
pub const JWKS_STALE_AFTER_MIN: Duration = Duration::from_secs(3600);

/// Reads the key set with `read`, forever (the caller drops it at drain).
pub async fn run<F, Fut>(name: &str, guard: Arc<Guard>, mut read: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Bytes, String>>,
{
    let mut failing = false;
    let stale_after = JWKS_STALE_AFTER_MIN.max(guard.cfg.jwt.refresh.saturating_mul(2));
    let mut last_good = Instant::now();
    loop {
        match read().await.and_then(|bytes| crate::jwks::parse(&bytes)) {
            Ok(set) => {
                server_metrics::with(|m| m.jwks_reads_ok += 1);
                if failing {
                    log::info(format_args!("auth: {name}: the key set is read again"));
                }
                failing = false;
                last_good = Instant::now();
                let (keys, left_out) = (set.keys.len(), set.left_out);
                if guard.install(set) {
                    if keys == 0 {
                        log::warn(format_args!(
                            "auth: {name}: the key set holds no usable signing key: every token is refused"
                        ));
                    } else {
                        log::info(format_args!("auth: {name}: key set loaded, {keys} keys"));
                    }
                    if left_out {
                        log::warn(format_args!(
                            "auth: {name}: the key set has more than {} usable keys; those after them are left out",
                            crate::jwks::JWKS_KEYS_MAX
                        ));
                    }
                }
            }
            Err(e) => {
                server_metrics::with(|m| m.jwks_reads_failed += 1);
                if !failing {
                    // Escaped: the reason can carry what the endpoint sent (a certificate's
                    // names, in a TLS failure).
                    log::warn(format_args!(
                        "auth: {name}: cannot read the key set: {} (the last good one stays in use for {}s)",
                        log::field(e.as_bytes()),
                        stale_after.as_secs()
                    ));
                }
                failing = true;
                if guard.has_keys() && last_good.elapsed() >= stale_after {
                    guard.withdraw();
                    log::error(format_args!(
                        "auth: {name}: no key set read for {}s: the last good one is dropped, tokens are answered 503 until a read works",
                        stale_after.as_secs()
                    ));
                }
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
