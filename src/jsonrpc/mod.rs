//! TODO(#2): jsonrpc module.
