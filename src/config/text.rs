//! How config values are shown in messages: quoted, escaped and cut to a bounded length,
//! so a message about a bad value stays one bounded line whatever the value holds.

use crate::limits::LOG_FIELD_BYTES_MAX;

/// Quotes a string for a message, escaping control characters and cutting it at
/// `limits::LOG_FIELD_BYTES_MAX` bytes so a message stays one bounded line.
pub(super) fn quote(text: &str) -> String {
    let cut = truncate(text);
    if cut.len() < text.len() {
        format!("{cut:?}…")
    } else {
        format!("{text:?}")
    }
}

/// The longest prefix of `text` within `LOG_FIELD_BYTES_MAX` bytes, on a char boundary.
pub(super) fn truncate(text: &str) -> &str {
    let mut end = text.len().min(LOG_FIELD_BYTES_MAX);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.get(..end).unwrap_or_default()
}
