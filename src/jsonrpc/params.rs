//! Param helpers: look up one member of a `params` object without parsing the rest into
//! values.
//!
//! Each helper makes one pass over `params` with `serde_json`, skipping other members, and
//! returns a slice of the original bytes. When a member occurs more than once the last one
//! wins, which is what the JavaScript and Python MCP SDKs upstream will see, so the gateway
//! routes on the same value the upstream acts on.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::INVALID_PARAMS;
use super::envelope::EnvelopeError;
use super::id::{is_integer_lexeme, raw_str};

/// Reads `params[key]` as a string, e.g. "name", "uri", "protocolVersion".
///
/// Returns `Ok(None)` when the member is absent, `Ok(Some(value))` (borrowed unless it had
/// escapes) when it is a string, and -32602 "Invalid params" when `params` is not an object
/// or the member is not a string (`null` included). The error carries no id; the caller,
/// which has the envelope, fills it in.
pub fn param_str<'a>(
    params: &'a RawValue,
    key: &str,
) -> Result<Option<Cow<'a, str>>, EnvelopeError> {
    let invalid = || EnvelopeError {
        code: INVALID_PARAMS,
        message: "Invalid params",
        id: None,
    };
    if !raw_is_object(params) {
        return Err(invalid());
    }
    match find_member(params, key) {
        None => Ok(None),
        Some(value) => raw_str(value).map(Some).ok_or_else(invalid),
    }
}

/// Returns `params._meta.progressToken` when it is a string or an integer (MCP
/// `ProgressToken`); `None` when absent, of another type, or `params`/`_meta` is not an
/// object.
pub fn progress_token(params: &RawValue) -> Option<&RawValue> {
    let meta = param_raw(params, "_meta")?;
    let token = param_raw(meta, "progressToken")?;
    let text = token.get();
    (text.starts_with('"') || is_integer_lexeme(text)).then_some(token)
}

/// Returns `params[key]` verbatim, e.g. "requestId", "capabilities", "cursor"; `None` when
/// `params` is not an object or has no such member.
pub fn param_raw<'a>(params: &'a RawValue, key: &str) -> Option<&'a RawValue> {
    if !raw_is_object(params) {
        return None;
    }
    find_member(params, key)
}

/// True when `raw` is a JSON object.
pub fn raw_is_object(raw: &RawValue) -> bool {
    raw.get().trim_start().starts_with('{')
}

/// The last value of member `key` in the object `obj`.
fn find_member<'a>(obj: &'a RawValue, key: &str) -> Option<&'a RawValue> {
    let mut deserializer = serde_json::Deserializer::from_str(obj.get());
    FindMember { key }
        .deserialize(&mut deserializer)
        .ok()
        .flatten()
}

/// Seed that walks an object and keeps the raw value of one member.
struct FindMember<'k> {
    key: &'k str,
}

impl<'de> DeserializeSeed<'de> for FindMember<'_> {
    type Value = Option<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FindMember<'_> {
    type Value = Option<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found = None;
        // serde_json yields each member once and stops at `}`: bounded by the input length.
        while let Some(is_key) = map.next_key_seed(KeyIs(self.key))? {
            if is_key {
                found = Some(map.next_value::<&'de RawValue>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

/// Seed that reads a member name and says whether it equals the wanted one (after
/// unescaping).
struct KeyIs<'k>(&'k str);

impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_identifier(self)
    }
}

impl Visitor<'_> for KeyIs<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a member name")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<bool, E> {
        Ok(name == self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> &RawValue {
        match serde_json::from_str(text) {
            Ok(raw) => raw,
            Err(e) => panic!("bad test json {text}: {e}"),
        }
    }

    #[test]
    fn param_str_cases() {
        let p = raw(r#"{"name":"echo","uri":"file:\/\/x","n":1,"nul":null,"name2":"a"}"#);
        assert_eq!(param_str(p, "name"), Ok(Some(Cow::Borrowed("echo"))));
        assert!(matches!(param_str(p, "uri"), Ok(Some(Cow::Owned(u))) if u == "file://x"));
        assert_eq!(param_str(p, "missing"), Ok(None));
        let invalid = EnvelopeError {
            code: INVALID_PARAMS,
            message: "Invalid params",
            id: None,
        };
        assert_eq!(param_str(p, "n"), Err(invalid.clone()));
        assert_eq!(param_str(p, "nul"), Err(invalid.clone()));
        assert_eq!(param_str(raw("[\"name\"]"), "name"), Err(invalid));
    }

    #[test]
    fn param_lookup_matches_escaped_keys_and_last_duplicate_wins() {
        let p = raw(r#"{"n\u0061me":"first","other":{"name":"nested"},"name":"last"}"#);
        assert_eq!(param_str(p, "name"), Ok(Some(Cow::Borrowed("last"))));
        let p = raw(r#"{"n\u0061me":"only"}"#);
        assert_eq!(param_str(p, "name"), Ok(Some(Cow::Borrowed("only"))));
    }

    #[test]
    fn param_raw_cases() {
        let p = raw(r#"{ "requestId" : "abc" , "capabilities": {"tools":{}}, "cursor": null }"#);
        assert_eq!(
            param_raw(p, "requestId").map(RawValue::get),
            Some("\"abc\"")
        );
        assert_eq!(
            param_raw(p, "capabilities").map(RawValue::get),
            Some(r#"{"tools":{}}"#)
        );
        assert_eq!(param_raw(p, "cursor").map(RawValue::get), Some("null"));
        assert_eq!(param_raw(p, "nope").map(RawValue::get), None);
        assert_eq!(param_raw(raw("[1]"), "requestId").map(RawValue::get), None);
    }

    #[test]
    fn progress_token_cases() {
        let cases = [
            (r#"{"_meta":{"progressToken":"tok"}}"#, Some("\"tok\"")),
            (
                r#"{"a":1,"_meta":{"x":[],"progressToken":-42}}"#,
                Some("-42"),
            ),
            (r#"{"_meta":{"progressToken":1.5}}"#, None),
            (r#"{"_meta":{"progressToken":null}}"#, None),
            (r#"{"_meta":{"progressToken":{}}}"#, None),
            (r#"{"_meta":{}}"#, None),
            (r#"{"_meta":"progressToken"}"#, None),
            (r#"{"progressToken":"top"}"#, None),
            ("[]", None),
        ];
        for (params, want) in cases {
            assert_eq!(
                progress_token(raw(params)).map(RawValue::get),
                want,
                "params {params}"
            );
        }
    }

    #[test]
    fn raw_is_object_cases() {
        assert!(raw_is_object(raw(" {} ")));
        assert!(!raw_is_object(raw("[]")));
        assert!(!raw_is_object(raw("\"{\"")));
        assert!(!raw_is_object(raw("null")));
    }
}
