//! mcpyard: a thread-per-core MCP gateway.
#![forbid(unused_must_use)]

pub mod binding;
pub mod config;
pub mod gateway;
pub mod http;
pub mod jsonrpc;
pub mod limits;
pub mod log;
pub mod metrics;
pub mod runtime;
pub mod sse;
pub mod store;
pub mod stream;
#[cfg(test)]
pub mod testing;
