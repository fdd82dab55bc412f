//! Param helpers: look up one member of a `params` object without parsing the rest into
//! values.
//!
//! Each helper makes one pass over `params`, skipping other members, and returns a slice of
//! the original bytes. When a member occurs more than once the last one wins, which is what
//! the JavaScript and Python MCP SDKs upstream will see, so the gateway routes on the same
//! value the upstream acts on.
//!
//! `params` is a [`Raw`] value, already validated as JSON, so the pass here only has to find
//! where members and values end: strings are skipped a run of plain bytes at a time (the
//! result scanner's [`super::scan::plain_run`]), containers by bracket depth. A found value
//! is a slice of a valid value, so it is a [`Raw`] as it is (no re-parse), and a name with
//! escapes is decoded by `serde_json` before it is compared (an escape-free one is compared
//! as it is).

use std::borrow::Cow;

use super::raw::Raw;
use super::syntax::{Cursor, Syntax};

use super::EnvelopeError;
use super::INVALID_PARAMS;
use super::raw::{is_integer_lexeme, str_lexeme};
use super::scan::plain_run;

/// Reads `params[key]` as a string, e.g. "name", "uri", "protocolVersion".
///
/// Returns `Ok(None)` when the member is absent, `Ok(Some(value))` (borrowed unless it had
/// escapes) when it is a string, and -32602 "Invalid params" when `params` is not an object
/// or the member is not a string (`null` included). The error carries no id; the caller,
/// which has the envelope, fills it in.
pub fn param_str<'a>(params: Raw<'a>, key: &str) -> Result<Option<Cow<'a, str>>, EnvelopeError> {
    Ok(param_str_at(params, key)?.map(|(decoded, _)| decoded))
}

/// [`param_str`], also returning the member's raw lexeme (quotes included): a slice of
/// `params`, so its offset there tells where the string sits in the original bytes.
pub fn param_str_at<'a>(
    params: Raw<'a>,
    key: &str,
) -> Result<Option<(Cow<'a, str>, &'a str)>, EnvelopeError> {
    let invalid = || EnvelopeError {
        code: INVALID_PARAMS,
        message: "Invalid params",
        id: None,
    };
    if !raw_is_object(params) {
        return Err(invalid());
    }
    match find_member(params.get(), key) {
        None => Ok(None),
        Some(value) => str_lexeme(value)
            .map(|decoded| Some((decoded, value)))
            .ok_or_else(invalid),
    }
}

/// Returns `params._meta.progressToken` when it is a string or an integer (MCP
/// `ProgressToken`); `None` when absent, of another type, or `params`/`_meta` is not an
/// object.
pub fn progress_token(params: Raw<'_>) -> Option<Raw<'_>> {
    ParamIndex::of(params).progress_token
}

/// The members of a `params` object that the request path reads, found in one pass: the
/// target of the call (`name`, `uri`, or a completion's `ref`) and `_meta.progressToken`.
/// When a member occurs more than once the last one wins, as in [`param_raw`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParamIndex<'a> {
    /// `params.name`, any JSON type.
    pub name: Option<Raw<'a>>,
    /// `params.uri`, any JSON type.
    pub uri: Option<Raw<'a>>,
    /// `params.ref`, any JSON type.
    pub reference: Option<Raw<'a>>,
    /// `params._meta.progressToken` when it is a string or an integer.
    pub progress_token: Option<Raw<'a>>,
}

impl<'a> ParamIndex<'a> {
    /// The index of `params` (empty when it is not an object). The envelope reader builds
    /// it while it reads the body; this is for params that came another way.
    pub fn of(params: Raw<'a>) -> ParamIndex<'a> {
        let mut cursor = Cursor::new(params.get());
        if cursor.peek() != Some(b'{') {
            return ParamIndex::default();
        }
        // A Raw is valid JSON, so the read cannot fail; should it, the index is empty.
        ParamIndex::read(&mut cursor).unwrap_or_default()
    }

    /// Reads the object at `cursor` (its syntax checked on the way), noting the members.
    pub(super) fn read(cursor: &mut Cursor<'a>) -> Result<ParamIndex<'a>, Syntax> {
        let mut index = ParamIndex::default();
        cursor.object(|name, escaped, cursor| {
            let start = cursor.at();
            let name = member_name(name, escaped);
            if name.as_deref() == Some("_meta") && cursor.peek() == Some(b'{') {
                let mut token = None;
                cursor.object(|name, escaped, cursor| {
                    let start = cursor.at();
                    cursor.value()?;
                    if member_name(name, escaped).as_deref() == Some("progressToken") {
                        token = Some(cursor.since(start)?);
                    }
                    Ok(())
                })?;
                index.progress_token = token
                    .filter(|t| t.starts_with('"') || is_integer_lexeme(t))
                    .map(Raw::trusted);
                return Ok(());
            }
            cursor.value()?;
            let value = Some(Raw::trusted(cursor.since(start)?));
            match name.as_deref() {
                Some("name") => index.name = value,
                Some("uri") => index.uri = value,
                Some("ref") => index.reference = value,
                // A `_meta` that is not an object has no token.
                Some("_meta") => index.progress_token = None,
                _ => {}
            }
            Ok(())
        })?;
        Ok(index)
    }
}

/// A member name's value, from its lexeme (quotes included); `None` for a name with escapes
/// that do not decode strictly (a lone surrogate): here it then matches nothing, as in
/// [`find_member`]; the envelope reader refuses it.
pub(super) fn member_name(lexeme: &str, escaped: bool) -> Option<Cow<'_, str>> {
    if escaped {
        return serde_json::from_str::<Cow<'_, str>>(lexeme).ok();
    }
    lexeme
        .strip_prefix('"')
        .and_then(|l| l.strip_suffix('"'))
        .map(Cow::Borrowed)
}

/// Returns `params[key]` verbatim, e.g. "requestId", "capabilities", "cursor"; `None` when
/// `params` is not an object or has no such member.
pub fn param_raw<'a>(params: Raw<'a>, key: &str) -> Option<Raw<'a>> {
    find_member(params.get(), key).and_then(as_raw)
}

/// True when `raw` is a JSON object.
pub fn raw_is_object(raw: Raw<'_>) -> bool {
    raw.get().trim_start().starts_with('{')
}

/// Wraps a value slice of a validated value (`find_member` gives those) as a [`Raw`].
fn as_raw(value: &str) -> Option<Raw<'_>> {
    Some(Raw::trusted(value))
}

/// The last value of member `key` in `text`, without surrounding whitespace; `None` when
/// `text` is not an object or has no such member.
///
/// `text` must be valid JSON (a `RawValue` or a value slice of one): only the ends of
/// names and values are looked for, nothing is validated. Should it not be valid, the
/// answer is some slice or `None`, never a panic, and the walk still ends: every turn of
/// the loop moves forward.
fn find_member<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let bytes = text.as_bytes();
    let mut at = skip_ws(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    let mut found = None;
    loop {
        at = skip_ws(bytes, at);
        match bytes.get(at)? {
            b'}' => return found,
            b',' => {
                at += 1;
                continue;
            }
            b'"' => {}
            _ => return None,
        }
        let (name_end, escaped) = string_end(bytes, at)?;
        let name = text.get(at..name_end)?;
        let is_key = if escaped {
            serde_json::from_str::<Cow<'_, str>>(name).is_ok_and(|decoded| decoded == key)
        } else {
            // An escape-free name is its own value between the quotes.
            name.get(1..name.len() - 1) == Some(key)
        };
        at = skip_ws(bytes, name_end);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_ws(bytes, at + 1);
        let value_end = value_end(bytes, at)?;
        if is_key {
            found = Some(text.get(at..value_end)?);
        }
        at = value_end;
    }
}

/// The offset after the JSON whitespace starting at `at`.
fn skip_ws(bytes: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = bytes.get(at) {
        at += 1;
    }
    at
}

/// The offset after the closing quote of the string whose opening quote is at `at`, and
/// whether the string has escapes.
fn string_end(bytes: &[u8], at: usize) -> Option<(usize, bool)> {
    let mut at = at + 1;
    let mut escaped = false;
    loop {
        at += plain_run(bytes.get(at..)?);
        match bytes.get(at)? {
            b'"' => return Some((at + 1, escaped)),
            // The escaped byte is skipped; the hex digits of `\uXXXX` are plain.
            b'\\' => {
                escaped = true;
                at += 2;
            }
            // A control byte cannot be in a valid string; step over it all the same.
            _ => at += 1,
        }
    }
}

/// The offset after the value that starts at `at`.
fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    match bytes.get(at)? {
        b'"' => string_end(bytes, at).map(|(end, _)| end),
        b'{' | b'[' => container_end(bytes, at),
        // A number or a literal: it runs to the next delimiter.
        _ => {
            let mut end = at + 1;
            while let Some(&b) = bytes.get(end) {
                if matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                    break;
                }
                end += 1;
            }
            Some(end)
        }
    }
}

/// The offset after the container whose opening bracket is at `at`. The nesting is counted,
/// not recursed into, so a deep value costs no stack.
fn container_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut at = at;
    loop {
        match bytes.get(at)? {
            b'"' => {
                at = string_end(bytes, at)?.0;
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Rng;
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
    use serde_json::value::RawValue;
    use std::fmt;

    /// The reference lookup: `serde_json` walks the object and keeps the last raw value of
    /// the member (the implementation the hand-written walk replaced).
    fn find_member_serde<'a>(obj: &'a str, key: &str) -> Option<&'a str> {
        let mut deserializer = serde_json::Deserializer::from_str(obj);
        FindMember { key }
            .deserialize(&mut deserializer)
            .ok()
            .flatten()
            .map(RawValue::get)
    }

    struct FindMember<'k> {
        key: &'k str,
    }

    impl<'de> DeserializeSeed<'de> for FindMember<'_> {
        type Value = Option<&'de RawValue>;

        fn deserialize<D: Deserializer<'de>>(
            self,
            deserializer: D,
        ) -> Result<Self::Value, D::Error> {
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
            while let Some(name) = map.next_key::<Cow<'de, str>>()? {
                if name == self.key {
                    found = Some(map.next_value::<&'de RawValue>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }

    /// A random JSON value: strings with every kind of escape and with brackets, quotes and
    /// commas inside, numbers, literals, nested containers, random whitespace.
    fn random_value(rng: &mut Rng, depth: u32, out: &mut String) {
        const STRINGS: &[&str] = &[
            r#""""#,
            r#""name""#,
            r#""a \"quoted\" }] , : { [ value""#,
            r#""back\\slash\\""#,
            r#""\\""#,
            r#""\"""#,
            r#""caf\u00e9 \ud83d\ude00 \u0022 \u005c""#,
            r#""tab\tnl\n\/\b\f\r""#,
            r#""é😀 plain text long enough to fill one whole window of lanes""#,
        ];
        const SCALARS: &[&str] = &["0", "-1", "42", "1.5e-3", "true", "false", "null"];
        let ws = |rng: &mut Rng, out: &mut String| {
            if rng.chance(30) {
                out.push_str(rng.pick(&[" ", "\n", "\t ", "\r\n  "]));
            }
        };
        ws(rng, out);
        match rng.below(if depth == 0 { 2 } else { 4 }) {
            0 => out.push_str(rng.pick(STRINGS)),
            1 => out.push_str(rng.pick(SCALARS)),
            2 => {
                out.push('[');
                for i in 0..rng.below(4) {
                    if i > 0 {
                        out.push(',');
                    }
                    random_value(rng, depth - 1, out);
                }
                ws(rng, out);
                out.push(']');
            }
            _ => random_object(rng, depth - 1, out),
        }
        ws(rng, out);
    }

    /// A random object whose names often repeat and are sometimes written with escapes.
    fn random_object(rng: &mut Rng, depth: u32, out: &mut String) {
        const NAMES: &[&str] = &[
            r#""name""#,
            r#""n\u0061me""#,
            r#""_meta""#,
            r#""progressToken""#,
            r#""nam""#,
            r#""name ""#,
            r#""na\"me""#,
            r#""\u005fmeta""#,
        ];
        out.push('{');
        for i in 0..rng.below(5) {
            if i > 0 {
                out.push(',');
            }
            if rng.chance(30) {
                out.push(' ');
            }
            let name = rng.pick(NAMES);
            out.push_str(name);
            if rng.chance(30) {
                out.push_str(" \n");
            }
            out.push(':');
            if name.ends_with("meta\"") && rng.chance(50) {
                // A `_meta` shaped like MCP's, with tokens of every kind the rules tell apart.
                out.push_str(r#"{"x":[1,"}\"",{"progressToken":0}],"progressToken":"#);
                out.push_str(rng.pick(&[r#""t\"k""#, "7", "-3", "1.5", "null", "{}"]));
                out.push('}');
            } else {
                random_value(rng, depth, out);
            }
        }
        out.push('}');
    }

    #[test]
    fn lookup_agrees_with_serde_json_on_random_objects() {
        const ROUNDS: usize = 3000;
        const KEYS: &[&str] = &["name", "_meta", "progressToken", "na\"me", "nam", ""];
        let (mut rng, seed) = Rng::seeded(0x5eed_9a7a);
        let mut found = 0;
        let mut tokens = 0;
        for round in 0..ROUNDS {
            let mut text = String::new();
            random_object(&mut rng, 3, &mut text);
            assert!(
                serde_json::from_str::<&RawValue>(&text).is_ok(),
                "seed {seed} round {round}: generator made invalid JSON {text}"
            );
            found += usize::from(find_member(&text, "name").is_some());
            for key in KEYS {
                assert_eq!(
                    find_member(&text, key),
                    find_member_serde(&text, key),
                    "seed {seed} round {round} key {key:?} in {text}"
                );
            }
            let Some(raw) = Raw::parse(&text) else {
                panic!("seed {seed}: invalid {text}");
            };
            let want = find_member_serde(&text, "_meta")
                .and_then(|meta| find_member_serde(meta, "progressToken"))
                .filter(|t| t.starts_with('"') || is_integer_lexeme(t));
            assert_eq!(
                progress_token(raw).map(Raw::get),
                want,
                "seed {seed} round {round} in {text}"
            );
            let index = ParamIndex::of(raw);
            for (key, got) in [
                ("name", index.name),
                ("uri", index.uri),
                ("ref", index.reference),
            ] {
                assert_eq!(
                    got.map(Raw::get),
                    find_member_serde(&text, key),
                    "seed {seed} round {round} key {key} in {text}"
                );
            }
            tokens += usize::from(want.is_some());
        }
        // The generator must reach the interesting cases, not only absent members.
        assert!(
            found > ROUNDS / 4,
            "seed {seed}: only {found} objects had a name"
        );
        assert!(
            tokens > ROUNDS / 50,
            "seed {seed}: only {tokens} progress tokens"
        );
    }

    #[test]
    fn lookup_of_non_objects_and_edges() {
        for text in [
            "[]",
            "\"{\\\"name\\\":1}\"",
            "1",
            "null",
            " [ {\"name\":1} ]",
        ] {
            assert_eq!(find_member(text, "name"), None, "{text}");
        }
        assert_eq!(find_member("{}", "name"), None);
        assert_eq!(find_member(" { } ", "name"), None);
        assert_eq!(find_member(r#"{"name" : 7 }"#, "name"), Some("7"));
        assert_eq!(find_member(r#"{"name":-1.5e+3}"#, "name"), Some("-1.5e+3"));
        assert_eq!(
            find_member(r#"{"a":"x\\","name":"y"}"#, "name"),
            Some(r#""y""#)
        );
        assert_eq!(
            find_member(
                r#"{"a":{"name":"in"},"b":["}",{"name":2}],"name":true}"#,
                "name"
            ),
            Some("true")
        );
        let deep = format!(
            "{{\"a\":{}{},\"name\":1}}",
            "[".repeat(200),
            "]".repeat(200)
        );
        assert_eq!(find_member(&deep, "name"), Some("1"));
    }

    fn raw(text: &str) -> Raw<'_> {
        match Raw::parse(text) {
            Some(raw) => raw,
            None => panic!("bad test json {text}"),
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
        assert_eq!(param_raw(p, "requestId").map(Raw::get), Some("\"abc\""));
        assert_eq!(
            param_raw(p, "capabilities").map(Raw::get),
            Some(r#"{"tools":{}}"#)
        );
        assert_eq!(param_raw(p, "cursor").map(Raw::get), Some("null"));
        assert_eq!(param_raw(p, "nope").map(Raw::get), None);
        assert_eq!(param_raw(raw("[1]"), "requestId").map(Raw::get), None);
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
                progress_token(raw(params)).map(Raw::get),
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
