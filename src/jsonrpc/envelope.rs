//! Envelope peek: one `serde_json` pass over a message that keeps every top-level member as a
//! borrowed slice of the body, then the JSON-RPC 2.0 / MCP validation rules.
//!
//! The object is read with a hand-written visitor rather than a derived struct so that member
//! order does not matter, duplicate members are detected (a body whose `method` or `id` means
//! different things to different parsers is refused), and the `id` is still known when a later
//! rule fails, so the error reply can echo it.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::id::{RequestId, raw_str};
use super::{INVALID_REQUEST, PARSE_ERROR};

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
    pub params: Option<&'a RawValue>,
    /// `result` verbatim, for responses.
    pub result: Option<&'a RawValue>,
    /// `error` verbatim, for error responses (its shape is not checked here).
    pub error: Option<&'a RawValue>,
}

/// An envelope that cannot be accepted: the JSON-RPC code and message to answer with, and the
/// id if one could be read (so the error echoes it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnvelopeError {
    /// [`PARSE_ERROR`], [`INVALID_REQUEST`] or, from the param helpers,
    /// [`super::INVALID_PARAMS`].
    pub code: i32,
    /// A short fixed description, safe to send back.
    pub message: &'static str,
    /// The raw id lexeme when the message had a string or number id; `None` answers with
    /// `"id": null`.
    pub id: Option<String>,
}

impl fmt::Display for EnvelopeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "json-rpc error {}: {}", self.code, self.message)
    }
}

impl std::error::Error for EnvelopeError {}

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
    let top: Top<'_> = serde_json::from_str(text).map_err(|_| parse_error())?;
    let members = match top {
        Top::Object(members) => members,
        Top::Array => return Err(invalid(BATCH, None)),
        Top::Other => return Err(invalid(NOT_OBJECT, None)),
    };
    validate(&members)
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
    })
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

/// The members the envelope rules look at, each the first occurrence's raw value.
#[derive(Default)]
struct Members<'a> {
    jsonrpc: Option<&'a RawValue>,
    id: Option<&'a RawValue>,
    method: Option<&'a RawValue>,
    params: Option<&'a RawValue>,
    result: Option<&'a RawValue>,
    error: Option<&'a RawValue>,
    /// One of the members above occurred more than once.
    duplicate: bool,
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
        Ok(match name {
            "jsonrpc" => Key::Jsonrpc,
            "id" => Key::Id,
            "method" => Key::Method,
            "params" => Key::Params,
            "result" => Key::Result,
            "error" => Key::Error,
            _ => Key::Other,
        })
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
                *slot = Some(value);
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

#[cfg(test)]
mod tests {
    use super::*;

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
                params: env.params.map(RawValue::get),
                result: env.result.map(RawValue::get),
                error: env.error.map(RawValue::get),
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
}
