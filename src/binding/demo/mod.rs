//! TODO(#2): demo toolkit.
