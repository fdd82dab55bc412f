//! JSON-RPC 2.0 for MCP: a borrowed envelope peek, request-id matching, and writers that
//! splice raw JSON verbatim.
//!
//! The gateway never rebuilds JSON. [`parse_envelope`] reads the top-level members of a
//! message (one pass with `serde_json`, every member value kept as a borrowed `RawValue`),
//! validates them against JSON-RPC 2.0 as profiled by MCP 2025-11-25 (no batches, ids are
//! strings or numbers), and hands back slices of the original body. The param helpers look up
//! one member of `params` at a time. The writers build envelopes around `params` / `result`
//! bytes and ids exactly as they arrived, so a forwarded payload is byte-identical.
//!
//! Flow: downstream body → [`parse_envelope`] → route on `method` / match on [`IdKey`] →
//! upstream bytes via [`write_request`] / [`write_notification`]; replies come back through
//! [`parse_envelope`] again and go downstream via [`write_result`] or [`write_error`].
//!
//! Large upstream answers are streamed instead: [`ResultScanner`] hands the `result` value
//! on as slices of the body pieces, and [`ItemRewriter`] rewrites a list result's items (route
//! prefix, allow-list) or a `resources/read` result's URIs from those slices, holding at most
//! one item.

mod envelope;
mod id;
mod items;
mod params;
mod raw;
mod scan;
mod syntax;
mod write;

use std::fmt;

pub use envelope::{Envelope, Kind, parse_envelope};
pub use id::{IdKey, RequestId, id_key_of_raw};
pub use items::{ItemError, ItemMode, ItemRewriter, ItemRules, ItemSink};
pub use params::{ParamIndex, param_raw, param_str, param_str_at, progress_token, raw_is_object};
pub use raw::Raw;
pub use scan::{
    ERROR_BYTES_MAX, ID_BYTES_MAX, ResultScanner, SCAN_DEPTH_MAX, ScanError, ScanEvent, ScanEvents,
};
pub use write::{
    RESULT_SUFFIX, escape_str, result_prefix_parts, write_error, write_notification, write_request,
    write_result, write_result_prefix, write_result_suffix,
};

/// Invalid JSON was received (JSON-RPC 2.0 §5.1).
pub const PARSE_ERROR: i32 = -32700;
/// The JSON sent is not a valid Request object.
pub const INVALID_REQUEST: i32 = -32600;
/// The method does not exist or is not available.
pub const METHOD_NOT_FOUND: i32 = -32601;
/// Invalid method parameter(s).
pub const INVALID_PARAMS: i32 = -32602;
/// Internal JSON-RPC error.
pub const INTERNAL_ERROR: i32 = -32603;

/// An envelope that cannot be accepted: the JSON-RPC code and message to answer with, and the
/// id if one could be read (so the error echoes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvelopeError {
    /// [`PARSE_ERROR`], [`INVALID_REQUEST`] or, from the param helpers,
    /// [`INVALID_PARAMS`].
    pub code: i32,
    /// A short fixed description, safe to send back.
    pub message: &'static str,
    /// The raw id lexeme when the message had a string or number id; `None` answers with
    /// `"id": null`.
    pub id: Option<String>,
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "json-rpc error {}: {}", self.code, self.message)
    }
}

impl std::error::Error for EnvelopeError {}

/// The standard message for a JSON-RPC error code (JSON-RPC 2.0 §5.1).
///
/// Returns "Parse error", "Invalid Request", "Method not found", "Invalid params" or
/// "Internal error" for the five predefined codes, "Server error" for the reserved
/// implementation-defined range -32099..=-32000, and "Unknown error" for anything else.
pub fn standard_message(code: i32) -> &'static str {
    match code {
        PARSE_ERROR => "Parse error",
        INVALID_REQUEST => "Invalid Request",
        METHOD_NOT_FOUND => "Method not found",
        INVALID_PARAMS => "Invalid params",
        INTERNAL_ERROR => "Internal error",
        -32099..=-32000 => "Server error",
        _ => "Unknown error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_messages() {
        assert_eq!(standard_message(PARSE_ERROR), "Parse error");
        assert_eq!(standard_message(INVALID_REQUEST), "Invalid Request");
        assert_eq!(standard_message(METHOD_NOT_FOUND), "Method not found");
        assert_eq!(standard_message(INVALID_PARAMS), "Invalid params");
        assert_eq!(standard_message(INTERNAL_ERROR), "Internal error");
        assert_eq!(standard_message(-32042), "Server error");
        assert_eq!(standard_message(1), "Unknown error");
    }
}
