//! mcpyard: a thread-per-core MCP gateway.
#![forbid(unused_must_use)]

pub mod limits;
