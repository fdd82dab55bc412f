//! The file as written: serde types that mirror the YAML, before cross-checks and defaults.
//!
//! Structure is checked here (unknown keys are refused with `deny_unknown_fields`), and so
//! is every single value that can be checked alone: a leaf field is read as a YAML value and
//! parsed by a function that returns the whole `found …, expected …` message, so serde's
//! generic wording never reaches the user. `serde_path_to_error` (in `mod.rs`) supplies the
//! key path. Every field is optional here; `validate.rs` reports missing required keys with
//! their full path and fills in defaults.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, de::Error as _};
use serde_yaml_ng::Value;

use super::duration::parse_duration;
use super::glob::{ALLOW_LIST_GLOBS_MAX, AllowList, GLOB_BYTES_MAX, Glob};
use super::model::{ClientAuth, IoMode, RedisUrl, Secret, UpstreamUrl};
pub(super) use super::text::{quote, truncate};
use super::url::{parse_host_name, parse_origin, parse_redis_url, parse_upstream_url};
use crate::limits::{REQUEST_TARGET_BYTES_MAX, WORKERS_MAX};

/// The top level of the file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawConfig {
    #[serde(default)]
    pub runtime: Option<RawRuntime>,
    #[serde(default)]
    pub telemetry: Option<RawTelemetry>,
    #[serde(default)]
    pub stores: Option<BTreeMap<String, RawStore>>,
    #[serde(default)]
    pub bindings: Option<BTreeMap<String, RawBinding>>,
}

/// `runtime:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawRuntime {
    #[serde(default, deserialize_with = "de_workers")]
    pub workers: Option<usize>,
    #[serde(default, deserialize_with = "de_io")]
    pub io: Option<IoMode>,
}

/// `telemetry:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawTelemetry {
    #[serde(default, deserialize_with = "de_socket_addr")]
    pub metrics: Option<SocketAddr>,
}

/// `stores.<name>`. Which keys a type takes is checked in `validate.rs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawStore {
    #[serde(default, rename = "type", deserialize_with = "de_store_type")]
    pub store_type: Option<StoreType>,
    // redis
    #[serde(default, deserialize_with = "de_redis_url")]
    pub url: Option<RedisUrl>,
    #[serde(default)]
    pub password_env: Option<Value>,
    #[serde(default)]
    pub prefix: Option<Value>,
    #[serde(default)]
    pub tls: Option<RawTls>,
}

/// A store's `type:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StoreType {
    Memory,
    Redis,
}

/// `bindings.<name>`: the union of every kind's keys. Which keys a given kind allows is
/// checked before serde runs (`check_binding_keys`), on the plain YAML value, so that an
/// unknown key is reported with the list of keys *that kind* accepts.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawBinding {
    #[serde(default, deserialize_with = "de_kind")]
    pub kind: Option<Kind>,
    // server
    #[serde(default, deserialize_with = "de_socket_addr")]
    pub listen: Option<SocketAddr>,
    #[serde(default, deserialize_with = "de_path")]
    pub path: Option<String>,
    #[serde(default)]
    pub exit: Option<Value>,
    #[serde(default, deserialize_with = "de_origins")]
    pub origins: Option<Vec<String>>,
    #[serde(default, deserialize_with = "de_hosts")]
    pub hosts: Option<Vec<String>>,
    #[serde(default, deserialize_with = "de_duration")]
    pub session_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_duration")]
    pub request_timeout: Option<Duration>,
    #[serde(default)]
    pub sessions: Option<RawSessions>,
    // server and client
    #[serde(default)]
    pub tls: Option<RawTls>,
    // proxy
    #[serde(default)]
    pub cache: Option<RawCache>,
    #[serde(default)]
    pub routes: Option<Vec<RawRoute>>,
    // client
    #[serde(default, deserialize_with = "de_upstream_url")]
    pub server: Option<UpstreamUrl>,
    #[serde(default)]
    pub authorization: Option<RawAuth>,
    #[serde(default, deserialize_with = "de_duration")]
    pub connect_timeout: Option<Duration>,
    #[serde(default, deserialize_with = "de_duration")]
    pub response_timeout: Option<Duration>,
    // demo
    #[serde(default, deserialize_with = "de_duration")]
    pub progress_interval: Option<Duration>,
    // server
    #[serde(default)]
    pub auth: Option<RawServerAuth>,
}

/// `bindings.<server>.tls` (`cert`, `key`) or `bindings.<client>.tls` (`ca`): file paths,
/// relative to the config file's directory. Which keys a kind takes is checked when the
/// binding is validated. There is deliberately no way to turn certificate checks off.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawTls {
    #[serde(default)]
    pub cert: Option<String>,
    #[serde(default)]
    pub key: Option<String>,
    #[serde(default)]
    pub ca: Option<String>,
}

/// `bindings.<server>.sessions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawSessions {
    #[serde(default)]
    pub store: Option<Value>,
}

/// `bindings.<proxy>.cache`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawCache {
    #[serde(default)]
    pub store: Option<Value>,
    #[serde(default, deserialize_with = "de_duration")]
    pub ttl: Option<Duration>,
    #[serde(default)]
    pub authorization: Option<RawAuth>,
}

/// `bindings.<proxy>.routes[i]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawRoute {
    #[serde(default)]
    pub toolkit: Option<Value>,
    #[serde(default)]
    pub exit: Option<Value>,
    #[serde(default, deserialize_with = "de_tool_globs")]
    pub tools: Option<AllowList>,
    #[serde(default, deserialize_with = "de_prompt_globs")]
    pub prompts: Option<AllowList>,
    #[serde(default, deserialize_with = "de_resource_globs")]
    pub resources: Option<AllowList>,
}

/// `bindings.<client>.authorization`: `forward` or `{ bearer: TOKEN }`.
#[derive(Debug)]
pub(super) struct RawAuth(pub ClientAuth);

/// A binding's `kind:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Server,
    Proxy,
    Client,
    Demo,
}

impl Kind {
    /// Every kind, in the order messages list them.
    pub const ALL: [Kind; 4] = [Kind::Server, Kind::Proxy, Kind::Client, Kind::Demo];

    /// The name as written after `kind:`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Server => "server",
            Kind::Proxy => "proxy",
            Kind::Client => "client",
            Kind::Demo => "demo",
        }
    }

    /// The keys a binding of this kind may have, `kind` first.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            Kind::Server => &[
                "kind",
                "listen",
                "path",
                "exit",
                "origins",
                "hosts",
                "session_timeout",
                "request_timeout",
                "sessions",
                "tls",
                "auth",
            ],
            Kind::Proxy => &["kind", "cache", "routes"],
            Kind::Client => &[
                "kind",
                "server",
                "authorization",
                "connect_timeout",
                "response_timeout",
                "tls",
            ],
            Kind::Demo => &["kind", "progress_interval"],
        }
    }
}

/// Parses a `kind:` value.
pub(super) fn parse_kind(value: &Value) -> Result<Kind, String> {
    let name = value.as_str().unwrap_or_default();
    Kind::ALL
        .into_iter()
        .find(|kind| kind.name() == name)
        .ok_or_else(|| {
            format!(
                "found {}, expected one of: server, proxy, client, demo",
                render(value)
            )
        })
}

/// Checks, on the plain YAML tree, that each binding with a valid `kind` has only the keys
/// that kind allows. Returns the key path and message of the first offender, in file order.
/// Bindings that are not mappings or have no valid `kind` are left to serde and `validate`.
pub(super) fn check_binding_keys(root: &Value) -> Result<(), (String, String)> {
    let Some(bindings) = root.get("bindings").and_then(Value::as_mapping) else {
        return Ok(());
    };
    for (name, binding) in bindings {
        let (Some(name), Some(binding)) = (name.as_str(), binding.as_mapping()) else {
            continue;
        };
        let Some(Ok(kind)) = binding.get("kind").map(parse_kind) else {
            continue;
        };
        for key in binding.keys() {
            let allowed = key.as_str().is_some_and(|key| kind.keys().contains(&key));
            if !allowed {
                let (path, found) = match key.as_str() {
                    Some(key) => (format!("bindings.{name}.{key}"), String::new()),
                    None => (format!("bindings.{name}"), format!(" {}", render(key))),
                };
                let message = format!(
                    "unknown key{found} for a {} binding, expected one of: {}",
                    kind.name(),
                    kind.keys().join(", ")
                );
                return Err((path, message));
            }
        }
    }
    Ok(())
}

/// Reads one leaf as a plain YAML value and parses it with `parse`. An empty value (`key:`
/// or `key: ~`) counts as absent.
fn leaf<'de, D, T>(
    d: D,
    parse: impl FnOnce(&Value) -> Result<T, String>,
) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
{
    let value = Value::deserialize(d)?;
    if value.is_null() {
        return Ok(None);
    }
    parse(&value).map(Some).map_err(D::Error::custom)
}

/// Reads a leaf that must be a string, then parses the string with `parse`.
fn leaf_str<'de, D, T>(
    d: D,
    expected: &str,
    parse: impl FnOnce(&str) -> Result<T, String>,
) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
{
    leaf(d, |value| match value.as_str() {
        Some(text) => parse(text),
        None => Err(format!("found {}, expected {expected}", render(value))),
    })
}

fn de_workers<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    leaf(d, |value| {
        value
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n <= WORKERS_MAX)
            .ok_or_else(|| {
                format!(
                    "found {}, expected a number of workers from 0 (one per core) to {WORKERS_MAX}",
                    render(value)
                )
            })
    })
}

fn de_io<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IoMode>, D::Error> {
    leaf(d, |value| match value.as_str() {
        Some("auto") => Ok(IoMode::Auto),
        Some("uring") => Ok(IoMode::Uring),
        Some("epoll") => Ok(IoMode::Epoll),
        _ => Err(format!(
            "found {}, expected one of: auto, uring, epoll",
            render(value)
        )),
    })
}

const SOCKET_ADDR_EXPECTED: &str = "a socket address such as 127.0.0.1:7114";

fn de_socket_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    leaf_str(d, SOCKET_ADDR_EXPECTED, |text| {
        text.parse()
            .map_err(|_| format!("found {}, expected {SOCKET_ADDR_EXPECTED}", quote(text)))
    })
}

fn de_store_type<'de, D: Deserializer<'de>>(d: D) -> Result<Option<StoreType>, D::Error> {
    leaf(d, |value| match value.as_str() {
        Some("memory") => Ok(StoreType::Memory),
        Some("redis") => Ok(StoreType::Redis),
        _ => Err(format!(
            "found {}, expected one of: memory, redis",
            render(value)
        )),
    })
}

fn de_redis_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<RedisUrl>, D::Error> {
    leaf_str(d, "a redis:// or rediss:// URL", parse_redis_url)
}

fn de_kind<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Kind>, D::Error> {
    leaf(d, parse_kind)
}

const PATH_EXPECTED: &str =
    "a path that starts with / and has only visible ASCII characters and no ? or #";

fn de_path<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    leaf_str(d, PATH_EXPECTED, |text| {
        let ok = text.starts_with('/')
            && text.len() <= REQUEST_TARGET_BYTES_MAX
            && text
                .bytes()
                .all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#');
        if ok {
            Ok(text.to_owned())
        } else {
            Err(format!("found {}, expected {PATH_EXPECTED}", quote(text)))
        }
    })
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    leaf_str(d, super::duration::DURATION_EXPECTED, parse_duration)
}

fn de_upstream_url<'de, D: Deserializer<'de>>(d: D) -> Result<Option<UpstreamUrl>, D::Error> {
    leaf_str(d, "an http:// or https:// URL", parse_upstream_url)
}

fn de_origins<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Ok(Option::<Vec<Origin>>::deserialize(d)?.map(|list| list.into_iter().map(|o| o.0).collect()))
}

fn de_hosts<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    Ok(
        Option::<Vec<HostName>>::deserialize(d)?
            .map(|list| list.into_iter().map(|h| h.0).collect()),
    )
}

/// One `origins:` entry; a type of its own so that serde tracks the list index.
struct Origin(String);

impl<'de> Deserialize<'de> for Origin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let expected = "an origin such as http://localhost:6274";
        let origin = leaf_str(d, expected, parse_origin)?;
        origin
            .map(Origin)
            .ok_or_else(|| D::Error::custom(format!("found nothing, expected {expected}")))
    }
}

/// One `hosts:` entry; a type of its own so that serde tracks the list index.
struct HostName(String);

impl<'de> Deserialize<'de> for HostName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let expected = "a host name such as mcp.example.com";
        let host = leaf_str(d, expected, parse_host_name)?;
        host.map(HostName)
            .ok_or_else(|| D::Error::custom(format!("found nothing, expected {expected}")))
    }
}

/// Which allow-list of a route is being read; it decides the wording of messages and
/// which characters a glob may hold.
#[derive(Debug, Clone, Copy)]
enum Globs {
    Tools,
    Prompts,
    Resources,
}

impl Globs {
    /// What one entry is a glob of, for messages.
    fn noun(self) -> &'static str {
        match self {
            Globs::Tools => "tool name",
            Globs::Prompts => "prompt name",
            Globs::Resources => "resource URI",
        }
    }

    /// What the list admits, for messages: `tool`, `prompt` or `resource`.
    fn item(self) -> &'static str {
        match self {
            Globs::Tools => "tool",
            Globs::Prompts => "prompt",
            Globs::Resources => "resource",
        }
    }

    /// An example entry, for messages.
    fn example(self) -> &'static str {
        match self {
            Globs::Tools => "\"search_*\"",
            Globs::Prompts => "\"review_*\"",
            Globs::Resources => "\"file:///docs/*\"",
        }
    }

    /// `a list of tool name globs such as ["search_*"]`.
    fn list_expected(self) -> String {
        format!(
            "a list of {} globs such as [{}]",
            self.noun(),
            self.example()
        )
    }

    /// Characters a user may take for wildcards or escapes. They are refused in tool and
    /// prompt globs, where they have no business, so that `get_?` is not silently read as
    /// a literal that admits nothing; in resource globs they are literal URI characters
    /// (`?` starts a query, `[` an IPv6 host).
    fn refused(self) -> &'static [char] {
        match self {
            Globs::Tools | Globs::Prompts => &['?', '[', '\\'],
            Globs::Resources => &[],
        }
    }

    /// Checks one entry, returning the glob or the whole `found …, expected …` message.
    fn parse(self, value: &Value) -> Result<Glob, String> {
        let noun = self.noun();
        let Some(text) = value.as_str() else {
            return Err(format!(
                "found {}, expected a {noun} glob such as {}",
                render(value),
                self.example()
            ));
        };
        let expected = if text.is_empty() {
            format!("a non-empty {noun} glob such as {}", self.example())
        } else if text.len() > GLOB_BYTES_MAX {
            format!("a {noun} glob of at most {GLOB_BYTES_MAX} bytes")
        } else if text.chars().any(char::is_control) {
            format!("a {noun} glob without control characters")
        } else if text.contains(self.refused()) {
            format!("a {noun} glob in which * is the only wildcard (?, [ and \\ are not allowed)")
        } else {
            return Ok(Glob::new(text));
        };
        Err(format!("found {}, expected {expected}", quote(text)))
    }
}

fn de_tool_globs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<AllowList>, D::Error> {
    d.deserialize_any(GlobsVisitor(Globs::Tools)).map(Some)
}

fn de_prompt_globs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<AllowList>, D::Error> {
    d.deserialize_any(GlobsVisitor(Globs::Prompts)).map(Some)
}

fn de_resource_globs<'de, D: Deserializer<'de>>(d: D) -> Result<Option<AllowList>, D::Error> {
    d.deserialize_any(GlobsVisitor(Globs::Resources)).map(Some)
}

/// Reads an allow-list: a list of globs, or one glob as shorthand for a one-element list
/// (as in Zilla). An empty value (`tools:` or `tools: ~`) is refused rather than read as
/// absent: absent admits everything, so a key left empty by mistake would open the route
/// wide; the message says to write `[]` or leave the key out.
struct GlobsVisitor(Globs);

impl<'de> Visitor<'de> for GlobsVisitor {
    type Value = AllowList;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.list_expected())
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<AllowList, E> {
        let glob = self.0.parse(&Value::String(text.to_owned()));
        glob.map(|glob| AllowList::new(vec![glob]))
            .map_err(E::custom)
    }

    fn visit_unit<E: de::Error>(self) -> Result<AllowList, E> {
        Err(E::custom(format!(
            "found nothing, expected {} (leave the key out to admit every {}, or write [] to admit none)",
            self.0.list_expected(),
            self.0.item()
        )))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AllowList, A::Error> {
        let mut globs = Vec::new();
        // Read one entry past the cap, so a long list is refused without reading it all.
        while let Some(glob) = seq.next_element_seed(GlobSeed(self.0))? {
            if globs.len() == ALLOW_LIST_GLOBS_MAX {
                return Err(A::Error::custom(format!(
                    "found a list of more than {ALLOW_LIST_GLOBS_MAX} globs, expected at most {ALLOW_LIST_GLOBS_MAX}"
                )));
            }
            globs.push(glob);
        }
        Ok(AllowList::new(globs))
    }
}

/// One allow-list entry; a seed so that `serde_path_to_error` tracks the list index.
struct GlobSeed(Globs);

impl<'de> DeserializeSeed<'de> for GlobSeed {
    type Value = Glob;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Glob, D::Error> {
        let value = Value::deserialize(d)?;
        self.0.parse(&value).map_err(D::Error::custom)
    }
}

const AUTH_EXPECTED: &str = "forward or a mapping { bearer: TOKEN }";

impl<'de> Deserialize<'de> for RawAuth {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(AuthVisitor)
    }
}

/// The one key an `authorization:` mapping may have. Reading keys through a derived
/// identifier makes an unknown key fail inside `next_key`, where the key path is tracked.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum AuthKey {
    Bearer,
}

struct AuthVisitor;

impl<'de> Visitor<'de> for AuthVisitor {
    type Value = RawAuth;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(AUTH_EXPECTED)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<RawAuth, E> {
        if text == "forward" {
            Ok(RawAuth(ClientAuth::Forward))
        } else {
            Err(E::custom(format!(
                "found {}, expected {AUTH_EXPECTED}",
                quote(text)
            )))
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawAuth, A::Error> {
        let mut bearer: Option<Secret> = None;
        while let Some(AuthKey::Bearer) = map.next_key()? {
            if bearer.is_some() {
                return Err(A::Error::custom("duplicate key bearer"));
            }
            bearer = Some(map.next_value::<BearerToken>()?.0);
        }
        bearer
            .map(|secret| RawAuth(ClientAuth::Bearer(secret)))
            .ok_or_else(|| {
                A::Error::custom(format!("found an empty mapping, expected {AUTH_EXPECTED}"))
            })
    }
}

/// A bearer token with `${NAME}` already replaced from the environment.
struct BearerToken(Secret);

impl<'de> Deserialize<'de> for BearerToken {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(d)?;
        // A literal token is a secret too: no message below repeats it.
        let Some(text) = value.as_str() else {
            let found = match value {
                Value::Null => "nothing",
                Value::Sequence(_) => "a list",
                Value::Mapping(_) => "a mapping",
                _ => "a value that is not a string",
            };
            return Err(D::Error::custom(format!(
                "found {found}, expected a bearer token or ${{NAME}} of an environment variable"
            )));
        };
        let token = substitute_env(text).map_err(D::Error::custom)?;
        if token.is_empty() {
            return Err(D::Error::custom(
                "found an empty token, expected a bearer token",
            ));
        }
        // RFC 6750 §2.1: b64token is visible ASCII; anything else would break the header.
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(D::Error::custom(
                "found a token with spaces or non-ASCII characters, expected a bearer token of visible ASCII characters",
            ));
        }
        Ok(BearerToken(Secret::new(token)))
    }
}

/// Replaces each `${NAME}` with the environment variable `NAME`. A `$` not followed by `{`
/// is kept as written.
///
/// Returns the result, or a message naming the variable that is missing or malformed; the
/// message never contains the text around it, which may be part of a secret.
pub(super) fn substitute_env(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        let (before, after) = rest.split_at(start);
        out.push_str(before);
        let after = after.get(2..).unwrap_or_default();
        let Some((name, tail)) = after.split_once('}') else {
            return Err("found an unterminated ${, expected ${NAME}".to_owned());
        };
        let valid = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(format!(
                "found ${{{}}}, expected ${{NAME}} with NAME made of letters, digits and _",
                truncate(name)
            ));
        }
        match std::env::var(name) {
            Ok(value) => out.push_str(&value),
            Err(std::env::VarError::NotPresent) => {
                return Err(format!(
                    "found ${{{name}}}, expected the environment variable {name} to be set"
                ));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(format!(
                    "found ${{{name}}}, expected the environment variable {name} to hold UTF-8 text"
                ));
            }
        }
        rest = tail;
    }
    out.push_str(rest);
    Ok(out)
}

/// Renders a YAML value for a `found …` message: strings quoted and escaped, numbers and
/// booleans as written, collections by their shape.
pub(super) fn render(value: &Value) -> String {
    match value {
        Value::Null => "nothing".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => quote(s),
        Value::Sequence(_) => "a list".to_owned(),
        Value::Mapping(_) => "a mapping".to_owned(),
        Value::Tagged(tagged) => format!("a value tagged {}", tagged.tag),
    }
}

/// `auth:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawServerAuth {
    #[serde(default)]
    pub resource: Option<Value>,
    #[serde(default)]
    pub authorization_servers: Option<Vec<Value>>,
    #[serde(default)]
    pub scopes: Option<Vec<Value>>,
    #[serde(default)]
    pub jwt: Option<RawJwt>,
    #[serde(default)]
    pub rules: Option<Vec<RawRule>>,
    #[serde(default)]
    pub limits: Option<Vec<RawLimit>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawJwt {
    #[serde(default)]
    pub issuer: Option<Value>,
    #[serde(default)]
    pub audiences: Option<Vec<Value>>,
    #[serde(default)]
    pub jwks: Option<Value>,
    #[serde(default)]
    pub jwks_ca: Option<Value>,
    #[serde(default)]
    pub refresh: Option<Value>,
    #[serde(default)]
    pub leeway: Option<Value>,
    #[serde(default)]
    pub algorithms: Option<Vec<Value>>,
    #[serde(default)]
    pub groups_claim: Option<Value>,
}

/// A rule's conditions. Every key left out is no condition, so a key present but empty
/// (`tools:`, `groups: ~`, `groups: []`) is refused rather than read as left out: a rule
/// half written would otherwise cover every item or admit every caller.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawRule {
    #[serde(default, deserialize_with = "de_present")]
    pub toolkit: Option<Value>,
    #[serde(default, deserialize_with = "de_tool_globs")]
    pub tools: Option<AllowList>,
    #[serde(default, deserialize_with = "de_prompt_globs")]
    pub prompts: Option<AllowList>,
    #[serde(default, deserialize_with = "de_resource_globs")]
    pub resources: Option<AllowList>,
    #[serde(default, deserialize_with = "de_condition_list")]
    pub scopes: Option<Vec<Value>>,
    #[serde(default, deserialize_with = "de_condition_list")]
    pub groups: Option<Vec<Value>>,
    #[serde(default, deserialize_with = "de_condition_list")]
    pub subjects: Option<Vec<Value>>,
}

/// A key whose absence means "any" or "the default": present, so not empty (see
/// [`RawRule`]).
fn de_present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Err(D::Error::custom(
            "found nothing, expected a value (leave the key out for the default)",
        )),
        value => Ok(Some(value)),
    }
}

/// A rule's list of scopes, groups or subjects: present, so not empty (see [`RawRule`]).
fn de_condition_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Value>>, D::Error> {
    let list = Option::<Vec<Value>>::deserialize(d)?;
    match list {
        Some(list) if !list.is_empty() => Ok(Some(list)),
        _ => Err(D::Error::custom(
            "found nothing, expected a list of one or more names (leave the key out for no condition)",
        )),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping")]
pub(super) struct RawLimit {
    #[serde(default)]
    pub name: Option<Value>,
    #[serde(default, deserialize_with = "de_present")]
    pub per: Option<Value>,
    #[serde(default, deserialize_with = "de_tool_globs")]
    pub tools: Option<AllowList>,
    #[serde(default)]
    pub rate: Option<Value>,
    #[serde(default)]
    pub burst: Option<Value>,
}
