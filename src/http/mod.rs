//! TODO(#2): http module.
