//! Envelope peek: one pass over a message that checks its JSON syntax and keeps every
//! top-level member as a borrowed slice of the body, then the JSON-RPC 2.0 / MCP validation
//! rules.
//!
//! The pass is [`super::syntax`]'s checker, which accepts exactly the documents serde_json
//! accepts (the tests hold it to the serde_json reader this module had before, on tables and
//! on random mutations). It replaced that reader because a `tools/call` went through the body
//! there once for serde's visitor and its raw-value captures, at 3.3 k instructions for a
//! 100-byte body. Member order does not matter, duplicate members are detected (a body whose
//! `method` or `id` means different things to different parsers is refused), and the `id` is
//! still known when a later rule fails, so the error reply can echo it.

use std::borrow::Cow;

use super::params::{ParamIndex, member_name};
use super::raw::Raw;
use super::syntax::{Cursor, Syntax, value_span};

use super::id::{RequestId, raw_str};
use super::{EnvelopeError, INVALID_REQUEST, PARSE_ERROR};

const PARSE_ERROR_MESSAGE: &str = "Parse error";
const BATCH: &str = "Batch requests are not supported";
const NOT_OBJECT: &str = "Invalid Request: not an object";
const DUPLICATE: &str = "Invalid Request: duplicate member";
const BAD_VERSION: &str = "Invalid Request: jsonrpc must be \"2.0\"";
const BAD_METHOD: &str = "Invalid Request: method must be a string";
const BAD_PARAMS: &str = "Invalid Request: params must be an object or array";
const METHOD_AND_REPLY: &str = "Invalid Request: method with result or error";
const RESULT_AND_ERROR: &str = "Invalid Request: both result and error";
const NO_METHOD_OR_REPLY: &str = "Invalid Request: no method, result or error";
const BAD_ID: &str = "Invalid Request: id must be a string or number";
const RESULT_WITHOUT_ID: &str = "Invalid Request: response without id";

/// What a message is, from the members it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `method` and `id`: expects a response.
    Request,
    /// `method` without `id`: expects nothing back.
    Notification,
    /// `result` and `id`.
    Response,
    /// `error`, with an `id` when the sender could determine one.
    ErrorResponse,
}

/// A validated message; every field borrows from the body it was parsed from.
#[derive(Debug)]
pub struct Envelope<'a> {
    /// Request, notification, response or error response.
    pub kind: Kind,
    /// The id, present for requests and responses; for error responses `None` when the
    /// sender wrote `null` or omitted it (JSON-RPC 2.0 §5: the id could not be determined).
    pub id: Option<RequestId<'a>>,
    /// The method name (decoded; borrowed unless it contained escapes), for requests and
    /// notifications.
    pub method: Option<Cow<'a, str>>,
    /// `params` verbatim: an object or array when present.
    pub params: Option<Raw<'a>>,
    /// `result` verbatim, for responses.
    pub result: Option<Raw<'a>>,
    /// `error` verbatim, for error responses (its shape is not checked here).
    pub error: Option<Raw<'a>>,
    /// The members of `params` the request path needs, found in the same pass (empty when
    /// `params` is absent or not an object).
    pub index: ParamIndex<'a>,
}

/// Parses and validates one JSON-RPC message body.
///
/// Returns the envelope, or the error to answer with: -32700 when the body is not UTF-8 or not
/// JSON, -32600 for a batch, a non-object, or any rule of JSON-RPC 2.0 / MCP 2025-11-25 the
/// members break (see the module docs). Unknown members are ignored.
pub fn parse_envelope(body: &[u8]) -> Result<Envelope<'_>, EnvelopeError> {
    let parse_error = || EnvelopeError {
        code: PARSE_ERROR,
        message: PARSE_ERROR_MESSAGE,
        id: None,
    };
    let text = std::str::from_utf8(body).map_err(|_| parse_error())?;
    let mut cursor = Cursor::new(text);
    cursor.ws();
    match cursor.peek() {
        Some(b'{') => {
            let members = object_members(cursor).map_err(|Syntax| parse_error())?;
            validate(&members)
        }
        Some(b'[') => match value_span(text) {
            Ok(_) => Err(invalid(BATCH, None)),
            Err(Syntax) => Err(parse_error()),
        },
        // A lone string, number or literal: refused either way, and whether it is JSON at
        // all is judged as serde_json judges a whole document (strings decoded strictly,
        // numbers in range), as before this reader.
        _ => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(_) => Err(invalid(NOT_OBJECT, None)),
            Err(_) => Err(parse_error()),
        },
    }
}

/// Reads the top-level object at `cursor` (and only whitespace after it), keeping the
/// members the envelope rules look at as slices of `text`; an object `params` is read member
/// by member on the way, into [`Members::index`].
fn object_members(mut cursor: Cursor<'_>) -> Result<Members<'_>, Syntax> {
    let mut members = Members::default();
    cursor.object(|name, escaped, cursor| {
        let key = Key::of(name, escaped)?;
        let start = cursor.at();
        let slot = match key {
            Key::Jsonrpc => &mut members.jsonrpc,
            Key::Id => &mut members.id,
            Key::Method => &mut members.method,
            Key::Params => &mut members.params,
            Key::Result => &mut members.result,
            Key::Error => &mut members.error,
            Key::Other => &mut None,
        };
        if matches!(key, Key::Params) && slot.is_none() && cursor.peek() == Some(b'{') {
            members.index = ParamIndex::read(cursor)?;
        } else {
            cursor.value()?;
        }
        let value = Raw::trusted(cursor.since(start)?);
        if slot.is_some() {
            members.duplicate = true;
        } else {
            *slot = Some(value);
        }
        Ok(())
    })?;
    cursor.ws();
    if !cursor.at_end() {
        return Err(Syntax);
    }
    Ok(members)
}

/// A -32600 error.
fn invalid(message: &'static str, id: Option<&RequestId<'_>>) -> EnvelopeError {
    EnvelopeError {
        code: INVALID_REQUEST,
        message,
        id: id.map(|id| id.raw.to_owned()),
    }
}

/// How the `id` member was written.
enum IdState<'a> {
    Absent,
    Null,
    /// Boolean, object or array.
    Invalid,
    Valid(RequestId<'a>),
}

/// Applies the envelope rules in a fixed order; the first broken rule names the error.
fn validate<'a>(members: &Members<'a>) -> Result<Envelope<'a>, EnvelopeError> {
    let id_state = match members.id {
        None => IdState::Absent,
        Some(raw) if raw.get() == "null" => IdState::Null,
        Some(raw) => RequestId::from_raw(raw).map_or(IdState::Invalid, IdState::Valid),
    };
    let echo = match &id_state {
        IdState::Valid(id) => Some(id),
        _ => None,
    };
    let fail = |message| Err(invalid(message, echo));

    if members.duplicate {
        return fail(DUPLICATE);
    }
    if members.jsonrpc.and_then(raw_str).as_deref() != Some("2.0") {
        return fail(BAD_VERSION);
    }
    let method = match members.method {
        None => None,
        Some(raw) => match raw_str(raw) {
            Some(method) => Some(method),
            None => return fail(BAD_METHOD),
        },
    };
    let params_ok = members
        .params
        .is_none_or(|params| matches!(params.get().as_bytes().first(), Some(b'{' | b'[')));
    if !params_ok {
        return fail(BAD_PARAMS);
    }
    let kind = match (&method, members.result, members.error) {
        (Some(_), None, None) => match id_state {
            IdState::Absent => Kind::Notification,
            _ => Kind::Request,
        },
        (Some(_), _, _) => return fail(METHOD_AND_REPLY),
        (None, Some(_), Some(_)) => return fail(RESULT_AND_ERROR),
        (None, None, None) => return fail(NO_METHOD_OR_REPLY),
        (None, Some(_), None) => Kind::Response,
        (None, None, Some(_)) => Kind::ErrorResponse,
    };
    let id = match id_state {
        IdState::Valid(id) => Some(id),
        IdState::Invalid => return fail(BAD_ID),
        // JSON-RPC 2.0 §5: an error response carries a null id when the request's id could
        // not be determined; MCP requests and results never do.
        IdState::Null | IdState::Absent if kind == Kind::ErrorResponse => None,
        IdState::Null => return fail(BAD_ID),
        IdState::Absent if kind == Kind::Response => return fail(RESULT_WITHOUT_ID),
        IdState::Absent => None,
    };
    Ok(Envelope {
        kind,
        id,
        method,
        params: members.params,
        result: members.result,
        error: members.error,
        index: members.index,
    })
}

/// The members the envelope rules look at, each the first occurrence's raw value.
#[derive(Default)]
struct Members<'a> {
    jsonrpc: Option<Raw<'a>>,
    id: Option<Raw<'a>>,
    method: Option<Raw<'a>>,
    params: Option<Raw<'a>>,
    result: Option<Raw<'a>>,
    error: Option<Raw<'a>>,
    /// One of the members above occurred more than once.
    duplicate: bool,
    /// What the request path needs from `params`, when it is an object.
    index: ParamIndex<'a>,
}

/// A top-level member name, compared after unescaping (`"\u0069d"` is `id`).
enum Key {
    Jsonrpc,
    Id,
    Method,
    Params,
    Result,
    Error,
    Other,
}

impl Key {
    /// The key a member name lexeme (quotes included) stands for. A name with escapes is
    /// decoded strictly first (a lone surrogate is not JSON here, as for serde_json's
    /// readers of names).
    fn of(lexeme: &str, escaped: bool) -> Result<Key, Syntax> {
        member_name(lexeme, escaped)
            .map(|name| Key::named(&name))
            .ok_or(Syntax)
    }

    /// The key a decoded member name stands for.
    fn named(name: &str) -> Key {
        match name {
            "jsonrpc" => Key::Jsonrpc,
            "id" => Key::Id,
            "method" => Key::Method,
            "params" => Key::Params,
            "result" => Key::Result,
            "error" => Key::Error,
            _ => Key::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde_json::value::RawValue;
    use std::fmt;

    /// The reader this module had before its own: serde_json over the whole body, kept as
    /// the reference the tests hold the new one to.
    fn parse_envelope_serde(body: &[u8]) -> Result<Envelope<'_>, EnvelopeError> {
        let parse_error = || EnvelopeError {
            code: PARSE_ERROR,
            message: PARSE_ERROR_MESSAGE,
            id: None,
        };
        let text = std::str::from_utf8(body).map_err(|_| parse_error())?;
        let top: Top<'_> = serde_json::from_str(text).map_err(|_| parse_error())?;
        let members = match top {
            Top::Object(members) => members,
            Top::Array => return Err(invalid(BATCH, None)),
            Top::Other => return Err(invalid(NOT_OBJECT, None)),
        };
        validate(&members)
    }

    /// The top level of a body, by JSON type.
    enum Top<'a> {
        Object(Members<'a>),
        /// A batch; its elements are parsed (so invalid JSON inside is still a parse error) and
        /// dropped.
        Array,
        /// A string, number, boolean or null.
        Other,
    }

    impl<'de> Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_identifier(KeyVisitor)
        }
    }

    struct KeyVisitor;

    impl Visitor<'_> for KeyVisitor {
        type Value = Key;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a member name")
        }

        fn visit_str<E: de::Error>(self, name: &str) -> Result<Key, E> {
            Ok(Key::named(name))
        }
    }

    impl<'de> Deserialize<'de> for Top<'de> {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            deserializer.deserialize_any(TopVisitor)
        }
    }

    struct TopVisitor;

    impl<'de> Visitor<'de> for TopVisitor {
        type Value = Top<'de>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'de>, A::Error> {
            let mut members = Members::default();
            // serde_json yields each member once and stops at `}`: bounded by the body length.
            while let Some(key) = map.next_key::<Key>()? {
                let slot = match key {
                    Key::Jsonrpc => &mut members.jsonrpc,
                    Key::Id => &mut members.id,
                    Key::Method => &mut members.method,
                    Key::Params => &mut members.params,
                    Key::Result => &mut members.result,
                    Key::Error => &mut members.error,
                    Key::Other => {
                        map.next_value::<IgnoredAny>()?;
                        continue;
                    }
                };
                let value: &'de RawValue = map.next_value()?;
                if slot.is_some() {
                    members.duplicate = true;
                } else {
                    *slot = Some(Raw::from(value));
                }
            }
            Ok(Top::Object(members))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Top<'de>, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(Top::Array)
        }

        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Top<'de>, E> {
            Ok(Top::Other)
        }

        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Top<'de>, E> {
            Ok(Top::Other)
        }

        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Top<'de>, E> {
            Ok(Top::Other)
        }

        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Top<'de>, E> {
            Ok(Top::Other)
        }

        fn visit_str<E: de::Error>(self, _: &str) -> Result<Top<'de>, E> {
            Ok(Top::Other)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Top<'de>, E> {
            Ok(Top::Other)
        }
    }

    /// What a table row expects: an envelope summary or an error.
    #[derive(Debug, PartialEq)]
    enum Want<'a> {
        Ok {
            kind: Kind,
            id: Option<&'a str>,
            method: Option<&'a str>,
            params: Option<&'a str>,
            result: Option<&'a str>,
            error: Option<&'a str>,
        },
        Err(i32, &'a str, Option<&'a str>),
    }

    fn summarize(body: &str) -> Want<'_> {
        match parse_envelope(body.as_bytes()) {
            Ok(env) => Want::Ok {
                kind: env.kind,
                id: env.id.map(|id| id.raw),
                method: env.method.map(|m| match m {
                    Cow::Borrowed(m) => m,
                    // Owned (unescaped) names are leaked only in tests, to compare as &str.
                    Cow::Owned(m) => Box::leak(m.into_boxed_str()),
                }),
                params: env.params.map(Raw::get),
                result: env.result.map(Raw::get),
                error: env.error.map(Raw::get),
            },
            Err(e) => Want::Err(
                e.code,
                e.message,
                e.id.map(|id| &*Box::leak(id.into_boxed_str())),
            ),
        }
    }

    fn request<'a>(id: &'a str, method: &'a str, params: Option<&'a str>) -> Want<'a> {
        Want::Ok {
            kind: Kind::Request,
            id: Some(id),
            method: Some(method),
            params,
            result: None,
            error: None,
        }
    }

    fn bad<'a>(message: &'a str, id: Option<&'a str>) -> Want<'a> {
        Want::Err(INVALID_REQUEST, message, id)
    }

    #[test]
    fn table_of_bodies() {
        let parse = Want::Err(PARSE_ERROR, PARSE_ERROR_MESSAGE, None);
        let cases: Vec<(&str, Want<'_>)> = vec![
            // Requests and ids.
            (
                r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#,
                request("7", "ping", None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":-3,"method":"ping"}"#,
                request("-3", "ping", None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
                request("1.5", "ping", None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"abc","method":"ping"}"#,
                request("\"abc\"", "ping", None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"a\"b","method":"ping"}"#,
                request(r#""a\"b""#, "ping", None),
            ),
            (
                r#"{"method":"tools/call","params":{"name":"x"},"jsonrpc":"2.0","id" : "last" }"#,
                request("\"last\"", "tools/call", Some(r#"{"name":"x"}"#)),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"m","params":[1,2]}"#,
                request("1", "m", Some("[1,2]")),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"tools\/call"}"#,
                request("1", "tools/call", None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"\u0070ing"}"#,
                request("1", "ping", None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"m","extra":{"deep":[1]}}"#,
                request("1", "m", None),
            ),
            (
                r#"{"jsonrpc":"2.\u0030","\u0069d":1,"method":"m"}"#,
                request("1", "m", None),
            ),
            // Notifications, responses, errors.
            (
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                Want::Ok {
                    kind: Kind::Notification,
                    id: None,
                    method: Some("notifications/initialized"),
                    params: None,
                    result: None,
                    error: None,
                },
            ),
            (
                r#"{"jsonrpc":"2.0","id":"r1","result":{"tools":[]}}"#,
                Want::Ok {
                    kind: Kind::Response,
                    id: Some("\"r1\""),
                    method: None,
                    params: None,
                    result: Some(r#"{"tools":[]}"#),
                    error: None,
                },
            ),
            (
                r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32601,"message":"nope"}}"#,
                Want::Ok {
                    kind: Kind::ErrorResponse,
                    id: Some("2"),
                    method: None,
                    params: None,
                    result: None,
                    error: Some(r#"{"code":-32601,"message":"nope"}"#),
                },
            ),
            (
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#,
                Want::Ok {
                    kind: Kind::ErrorResponse,
                    id: None,
                    method: None,
                    params: None,
                    result: None,
                    error: Some(r#"{"code":-32700,"message":"x"}"#),
                },
            ),
            // Parse errors.
            ("", parse),
            ("{", Want::Err(PARSE_ERROR, PARSE_ERROR_MESSAGE, None)),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"m"} x"#,
                Want::Err(PARSE_ERROR, PARSE_ERROR_MESSAGE, None),
            ),
            (
                r#"[{"jsonrpc":"2.0","id":1,"method":"m"},"#,
                Want::Err(PARSE_ERROR, PARSE_ERROR_MESSAGE, None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"m",}"#,
                Want::Err(PARSE_ERROR, PARSE_ERROR_MESSAGE, None),
            ),
            // Shape errors.
            (
                r#"[{"jsonrpc":"2.0","id":1,"method":"m"}]"#,
                bad(BATCH, None),
            ),
            ("[]", bad(BATCH, None)),
            ("\"2.0\"", bad(NOT_OBJECT, None)),
            ("42", bad(NOT_OBJECT, None)),
            ("null", bad(NOT_OBJECT, None)),
            (r#"{"id":1,"method":"m"}"#, bad(BAD_VERSION, Some("1"))),
            (
                r#"{"jsonrpc":"1.0","id":1,"method":"m"}"#,
                bad(BAD_VERSION, Some("1")),
            ),
            (
                r#"{"jsonrpc":2.0,"id":"x","method":"m"}"#,
                bad(BAD_VERSION, Some("\"x\"")),
            ),
            (
                r#"{"jsonrpc":"2.0 ","id":1,"method":"m"}"#,
                bad(BAD_VERSION, Some("1")),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":5}"#,
                bad(BAD_METHOD, Some("1")),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":null}"#,
                bad(BAD_METHOD, Some("1")),
            ),
            (
                r#"{"jsonrpc":"2.0","id":null,"method":"m"}"#,
                bad(BAD_ID, None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":true,"method":"m"}"#,
                bad(BAD_ID, None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":{"a":1},"method":"m"}"#,
                bad(BAD_ID, None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":[1],"method":"m"}"#,
                bad(BAD_ID, None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":null,"result":{}}"#,
                bad(BAD_ID, None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":false,"error":{}}"#,
                bad(BAD_ID, None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"m","params":"x"}"#,
                bad(BAD_PARAMS, Some("1")),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"m","params":null}"#,
                bad(BAD_PARAMS, Some("1")),
            ),
            (
                r#"{"jsonrpc":"2.0","method":"m","params":3}"#,
                bad(BAD_PARAMS, None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"m","result":{}}"#,
                bad(METHOD_AND_REPLY, Some("1")),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"m","error":{}}"#,
                bad(METHOD_AND_REPLY, Some("1")),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1}"#,
                bad(NO_METHOD_OR_REPLY, Some("1")),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"z","result":{},"error":{}}"#,
                bad(RESULT_AND_ERROR, Some("\"z\"")),
            ),
            (
                r#"{"jsonrpc":"2.0","result":{}}"#,
                bad(RESULT_WITHOUT_ID, None),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"m"}"#,
                bad(DUPLICATE, Some("1")),
            ),
            (
                r#"{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}"#,
                bad(DUPLICATE, Some("1")),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"q","me\u0074hod":"a","method":"b"}"#,
                bad(DUPLICATE, Some("\"q\"")),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(summarize(body), want, "body {body}");
        }
    }

    #[test]
    fn non_utf8_body_is_a_parse_error() {
        let body = b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}";
        let err = parse_envelope(body).err();
        assert_eq!(
            err.map(|e| (e.code, e.message)),
            Some((PARSE_ERROR, PARSE_ERROR_MESSAGE))
        );
    }

    #[test]
    fn method_borrows_unless_escaped() {
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        let env = parse_envelope(body);
        assert!(matches!(
            env.map(|e| e.method),
            Ok(Some(Cow::Borrowed("tools/list")))
        ));
        let body = br#"{"jsonrpc":"2.0","id":1,"method":"tools\/list"}"#;
        let env = parse_envelope(body);
        assert!(matches!(env.map(|e| e.method), Ok(Some(Cow::Owned(m))) if m == "tools/list"));
    }

    #[test]
    fn deep_nesting_is_skipped_without_recursion() {
        // serde_json skips RawValue and ignored members iteratively, so nesting depth costs
        // memory proportional to the body (already bounded by MESSAGE_BYTES_MAX), not stack.
        let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let body =
            format!(r#"{{"jsonrpc":"2.0","id":1,"method":"m","x":{nested},"params":{nested}}}"#);
        let env = parse_envelope(body.as_bytes());
        assert_eq!(
            env.map(|e| e.params.map(|p| p.get().len())),
            Ok(Some(nested.len()))
        );
        let batch = format!("[{nested}]");
        let err = parse_envelope(batch.as_bytes()).err();
        assert_eq!(err.map(|e| e.message), Some(BATCH));
    }

    /// An envelope or its error, comparable across the two readers.
    fn outline(r: Result<Envelope<'_>, EnvelopeError>) -> String {
        match r {
            Ok(e) => format!(
                "{:?} {:?} {:?} {:?} {:?} {:?}",
                e.kind,
                e.id.map(|i| i.raw),
                e.method,
                e.params.map(Raw::get),
                e.result.map(Raw::get),
                e.error.map(Raw::get)
            ),
            Err(e) => format!("{} {} {:?}", e.code, e.message, e.id),
        }
    }

    #[test]
    fn the_reader_agrees_with_serde_json_on_edge_bodies() {
        let bodies = [
            "",
            "{}",
            "[]",
            "[1,]",
            "[{]",
            "1",
            "1e400",
            "-",
            "\"\\ud800\"",
            "\"ok\"",
            "null",
            "true",
            " {} ",
            "{} x",
            "{,}",
            "{\"id\":1,}",
            "{\"id\" 1}",
            "{1:1}",
            r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"m","params":{"a":[1,{"b":null}]}}"#,
            r#"{"jsonrpc":"2.0","\u0069d":1,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","\ud800d":1,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"\ud800"}"#,
            r#"{"jsonrpc":"2.0","id":1e400,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","id":1,"result":{},"error":{}}"#,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":1}}"#,
            r#"{"jsonrpc":"2.0","x":"\u12","id":1,"method":"m"}"#,
            r#"{"jsonrpc":"2.0","x":"\u12zz","id":1,"method":"m"}"#,
            "{\"jsonrpc\":\"2.0\",\"x\":\"a\u{1}b\",\"id\":1,\"method\":\"m\"}",
            " \t\r\n{\"jsonrpc\" : \"2.0\" , \"method\" : \"m\" } \n",
        ];
        for body in bodies {
            assert_eq!(
                outline(parse_envelope(body.as_bytes())),
                outline(parse_envelope_serde(body.as_bytes())),
                "{body:?}"
            );
        }
    }

    #[test]
    fn the_reader_agrees_with_serde_json_on_mutated_messages() {
        const ROUNDS: usize = 30_000;
        const SEEDS: &[&str] = &[
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"a \"b\" \\ \u00e9","n":[1,-2.5e3,true,false,null]},"_meta":{"progressToken":"t"}}}"#,
            r#"{"jsonrpc":"2.0","id":"x","result":{"content":[{"type":"text","text":"ok"}]}}"#,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"bad"}}"#,
            r#" {"method":"notifications/initialized","jsonrpc":"2.0"} "#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"m"}]"#,
        ];
        const BYTES: &[u8] = b"{}[]\",:\\ \t\n0123456789-+.eEtrufalsn\x01u";
        let (mut rng, seed) = crate::testing::Rng::seeded(0x5eed_e7e1);
        for round in 0..ROUNDS {
            let bytes = crate::testing::mutated(&mut rng, SEEDS, BYTES);
            assert_eq!(
                outline(parse_envelope(&bytes)),
                outline(parse_envelope_serde(&bytes)),
                "seed {seed} round {round}: {:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
    }
}
