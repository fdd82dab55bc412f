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

/// JSON-RPC code of an unknown resource (MCP's `-32002`).
pub const RESOURCE_NOT_FOUND: i32 = -32002;

/// The JSON-RPC error an upstream gives for an item it does not have, by the kind of
/// request that named it: the proxy answers so for a name no route serves, and the server
/// for one its `auth` rules hide. `name` is the agent's: it is cut to
/// `LOG_FIELD_BYTES_MAX` bytes (on a character boundary) before it goes into the message.
pub fn unknown_item(kind: crate::stream::Kind, name: &str) -> (i32, String) {
    use crate::stream::Kind;
    let mut end = name.len().min(crate::limits::LOG_FIELD_BYTES_MAX);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    let shown = name.get(..end).unwrap_or_default();
    let invalid = crate::jsonrpc::INVALID_PARAMS;
    match kind {
        Kind::ToolsCall => (invalid, format!("Unknown tool: {shown}")),
        Kind::PromptsGet => (invalid, format!("Unknown prompt: {shown}")),
        Kind::CompletionComplete => (invalid, format!("Unknown reference: {shown}")),
        _ => (RESOURCE_NOT_FOUND, "Resource not found".to_owned()),
    }
}
