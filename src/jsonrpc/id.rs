//! Request ids: the raw lexeme the sender wrote (echoed back verbatim) and a canonical key
//! for matching ids written differently (`"a"` and `"\u0061"` are the same id).
//!
//! MCP 2025-11-25 `RequestId` is `string | number` and never null. A reply must echo the id
//! byte for byte, so the raw text is what travels; the key is only for lookups such as
//! matching a `notifications/cancelled` `requestId` against the requests in flight.

use std::borrow::Cow;

use super::raw::{Raw, is_integer_lexeme, str_lexeme};

/// A request id exactly as the sender wrote it (the raw JSON lexeme: `7`, `"abc"`, `"a\"b"`),
/// validated to be a JSON string or number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestId<'a> {
    /// The lexeme, without surrounding whitespace. Invariant: a valid JSON string or number.
    pub raw: &'a str,
}

/// Canonical form for matching ids (e.g. `notifications/cancelled` requestId against
/// in-flight ids): integers by value, strings by decoded value, other numbers by their raw
/// text.
///
/// `1` and `"1"` are different keys; `1` and `-0`/`0` follow i64 equality; `1.0` and `1e0`
/// are different `Num` keys because no canonical float text is attempted.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum IdKey {
    /// An integer that fits in an i64.
    Int(i64),
    /// A string, by its decoded value.
    Str(Box<str>),
    /// Any other number (fraction, exponent, or an integer outside i64), by its raw text.
    Num(Box<str>),
}

impl<'a> RequestId<'a> {
    /// Returns the canonical key of this id for matching.
    pub fn key(&self) -> IdKey {
        // `raw` is validated at construction; should it ever not be, it still gets a
        // stable key (its text) rather than a panic.
        id_key_of_raw(self.raw).unwrap_or_else(|| IdKey::Num(self.raw.into()))
    }

    /// Wraps a member value when it is a JSON string or number; `None` for any other type.
    pub(crate) fn from_raw(raw: Raw<'a>) -> Option<Self> {
        let text = raw.get();
        match text.as_bytes().first() {
            Some(b'"' | b'-' | b'0'..=b'9') => Some(RequestId { raw: text }),
            _ => None,
        }
    }
}

/// Parses a raw lexeme into its key; `None` if `raw` is not a JSON string or number.
///
/// Surrounding JSON whitespace is allowed and ignored.
pub fn id_key_of_raw(raw: &str) -> Option<IdKey> {
    let value = Raw::parse(raw)?;
    let text = value.get();
    match text.as_bytes().first()? {
        b'"' => Some(IdKey::Str(raw_str(value)?.into())),
        b'-' | b'0'..=b'9' => {
            let int = if is_integer_lexeme(text) {
                text.parse::<i64>().ok()
            } else {
                None
            };
            Some(match int {
                Some(n) => IdKey::Int(n),
                None => IdKey::Num(text.into()),
            })
        }
        _ => None,
    }
}

/// Decodes a raw JSON string, borrowing when it has no escapes; `None` when `raw` is not a
/// string.
pub(crate) fn raw_str(raw: Raw<'_>) -> Option<Cow<'_, str>> {
    str_lexeme(raw.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(raw: &str) -> IdKey {
        match id_key_of_raw(raw) {
            Some(key) => key,
            None => panic!("not an id: {raw}"),
        }
    }

    #[test]
    fn keys_by_kind() {
        assert_eq!(key("7"), IdKey::Int(7));
        assert_eq!(key("-12"), IdKey::Int(-12));
        assert_eq!(key(" 7 "), IdKey::Int(7));
        assert_eq!(key("\"abc\""), IdKey::Str("abc".into()));
        assert_eq!(key(r#""a\"b""#), IdKey::Str("a\"b".into()));
        assert_eq!(key("1.5"), IdKey::Num("1.5".into()));
        assert_eq!(key("1e3"), IdKey::Num("1e3".into()));
        assert_eq!(
            key("99999999999999999999"),
            IdKey::Num("99999999999999999999".into())
        );
    }

    #[test]
    fn key_equality() {
        assert_ne!(key("1"), key("\"1\""));
        assert_eq!(key("\"a\""), key(r#""\u0061""#));
        assert_eq!(key("\"é\""), key(r#""\u00e9""#));
        assert_eq!(key("0"), key("-0"));
        assert_ne!(key("1"), key("1.0"));
        assert_eq!(RequestId { raw: "\"x\"" }.key(), key(r#""\u0078""#));
    }

    #[test]
    fn non_ids_rejected() {
        for raw in [
            "null",
            "true",
            "false",
            "{}",
            "[]",
            "",
            "\"unterminated",
            "01",
            "7 8",
            "+1",
        ] {
            assert_eq!(id_key_of_raw(raw), None, "raw {raw:?}");
        }
    }
}
