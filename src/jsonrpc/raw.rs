//! [`Raw`]: one JSON value exactly as its sender wrote it, borrowed from the message.
//!
//! The gateway forwards values it does not look into (params, results, errors, ids) byte for
//! byte, so it keeps them as slices of the body they came in. A `Raw` is such a slice that
//! is known to be one complete, valid JSON value without whitespace around it: it is only
//! made by [`super::parse_envelope`] and the param helpers (from bodies they validated), by
//! [`Raw::parse`] (which validates), or from a `serde_json` `RawValue`.

use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// A valid JSON value's text, borrowed (see the module docs). Copying it copies a pointer.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    /// Wraps a slice the caller knows to be one valid JSON value with no surrounding
    /// whitespace (a value slice of a validated body).
    pub(crate) fn trusted(text: &'a str) -> Raw<'a> {
        Raw(text)
    }

    /// Validates `text` as one JSON value (surrounding whitespace dropped).
    pub fn parse(text: &'a str) -> Option<Raw<'a>> {
        let (start, end) = super::syntax::value_span(text).ok()?;
        text.get(start..end).map(Raw)
    }

    /// The value's text.
    pub fn get(self) -> &'a str {
        self.0
    }

    /// The string this value is, decoded (borrowed unless it has escapes); `None` when it is
    /// not a string.
    pub fn as_str(self) -> Option<Cow<'a, str>> {
        str_lexeme(self.0)
    }
}

impl<'a> From<&'a RawValue> for Raw<'a> {
    fn from(raw: &'a RawValue) -> Raw<'a> {
        Raw(raw.get())
    }
}

impl fmt::Debug for Raw<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Raw({})", self.0)
    }
}

/// Decodes a JSON string lexeme, borrowing when it has no escapes; `None` when `text` is not
/// a string. `text` must be valid JSON (a [`Raw`] or a value slice of one).
pub(crate) fn str_lexeme(text: &str) -> Option<Cow<'_, str>> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    if !inner.contains('\\') {
        // A Raw is valid JSON, so an escape-free string body is its own value.
        return Some(Cow::Borrowed(inner));
    }
    serde_json::from_str::<String>(text).ok().map(Cow::Owned)
}

/// True when a JSON number lexeme is an integer: optional minus, then digits only.
pub(crate) fn is_integer_lexeme(text: &str) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}
