//! mcpyard: a thread-per-core MCP gateway.
#![forbid(unused_must_use)]

pub mod binding;
pub mod config;
pub mod http;
pub mod jsonrpc;
pub mod limits;
pub mod metrics;
pub mod sse;
pub mod stream;
