//! TODO(#2): sse module.
