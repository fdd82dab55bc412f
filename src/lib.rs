//! mcpyard: a thread-per-core MCP gateway.
#![forbid(unused_must_use)]

pub mod binding;
pub mod certs;
pub mod config;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod http;
pub mod jsonrpc;
pub mod jwks;
pub mod limits;
pub mod log;
pub mod metrics;
pub mod runtime;
pub mod sse;
pub mod store;
pub mod stream;
#[cfg(test)]
pub mod testing;

/// The hash map of the per-request tables (sessions, requests in flight, streams):
/// foldhash, seeded per process, in place of std's SipHash, which cost ~1.5 k
/// instructions per `tools/call` (callgrind). Keys from outside input only ever go into
/// tables with a bound (`REQUESTS_PER_SESSION_MAX`), and session tables are keyed by ids
/// mcpyard minted, so flooding one with colliding keys is not possible.
pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
