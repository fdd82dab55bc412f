//! MCP protocol facts every binding shares: the versions mcpyard speaks. The server
//! negotiates one of them with each agent, the client asks upstreams for the newest, and
//! the proxy cache's own session names the newest too; they all read them here, so no
//! binding reaches into another for them.

/// Protocol versions mcpyard speaks with agents, newest first.
pub const PROTOCOL_VERSIONS: [&str; 2] = ["2025-11-25", "2025-06-18"];

/// The newest version: what mcpyard asks upstreams for, and what its own sessions (the
/// cache's hydration) name.
pub const LATEST: &str = PROTOCOL_VERSIONS[0];

/// Versions an agent may name in `MCP-Protocol-Version` (2025-03-26 clients never send
/// the header, but a proxying client might).
pub const HEADER_VERSIONS: [&str; 3] = ["2025-11-25", "2025-06-18", "2025-03-26"];
