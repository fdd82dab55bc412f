//! TODO(#2): config module.
