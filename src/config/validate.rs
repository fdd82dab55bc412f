//! From the file as written (`raw.rs`) to the validated `Config` (`model.rs`): required keys,
//! defaults, bounds from `limits.rs`, and every cross-reference between entries.
//!
//! Each check reports the first problem it finds as a key path plus a `found …, expected …`
//! message; `mod.rs` adds the file name. Bindings are checked in name order, and the checks
//! that need the whole picture (at least one server, no two listeners on one address) run
//! last.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_yaml_ng::Value;

use super::duration::format_duration;
use super::event_prefix::{event_code, event_prefixes};
use super::model::{
    Binding, Cache, ClientAuth, ClientBinding, Config, DemoBinding, IoMode, ProxyBinding,
    RedisStore, RedisTls, Route, Runtime, Scheme, Secret, ServerBinding, ServerTls, Store,
    Telemetry, UpstreamUrl,
};
use super::raw::{Kind, RawBinding, RawConfig, RawStore, RawTls, StoreType, quote, render};
use crate::limits::{
    PROXY_ROUTES_MAX, REDIS_PREFIX_BYTES_MAX, REQUEST_TIMEOUT_DEFAULT, SESSION_IDLE_TIMEOUT_MAX,
};

/// Where a check failed and what it found, before the file name is added.
#[derive(Debug)]
pub(super) struct Fault {
    /// Key path such as `bindings.tools.routes[1].exit`; empty for the whole file.
    pub path: String,
    /// `found …, expected …` or a similar one-line explanation.
    pub message: String,
}

fn fault(path: impl Into<String>, message: impl Into<String>) -> Fault {
    Fault {
        path: path.into(),
        message: message.into(),
    }
}

/// Longest binding, store or toolkit name.
const NAME_BYTES_MAX: usize = 64;

const CACHE_TTL_DEFAULT: Duration = Duration::from_secs(5 * 60);
const CACHE_TTL_MIN: Duration = Duration::from_secs(1);
const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
const RESPONSE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
const PROGRESS_INTERVAL_DEFAULT: Duration = Duration::from_millis(200);
const SERVER_PATH_DEFAULT: &str = "/mcp";
/// What a redis store's keys and channel start with when `prefix:` is not given.
const REDIS_PREFIX_DEFAULT: &str = "mcpyard:";

/// What a `server` may exit to, and what a proxy route may exit to.
const SERVER_EXITS: &[Kind] = &[Kind::Proxy, Kind::Client, Kind::Demo];
const ROUTE_EXITS: &[Kind] = &[Kind::Client, Kind::Demo];

/// Turns the parsed file into a `Config`, or reports the first problem.
pub(super) fn validate(raw: RawConfig, source: &str) -> Result<Config, Fault> {
    let runtime = raw
        .runtime
        .map(|r| Runtime {
            workers: r.workers.unwrap_or(0),
            io: r.io.unwrap_or(IoMode::Auto),
        })
        .unwrap_or_default();
    let telemetry = Telemetry {
        metrics: raw.telemetry.and_then(|t| t.metrics),
    };
    let dir = Path::new(source).parent().unwrap_or(Path::new(""));
    let stores = validate_stores(raw.stores.unwrap_or_default(), dir)?;
    let raw_bindings = raw.bindings.ok_or_else(|| {
        fault(
            "bindings",
            "missing, expected a mapping of binding names to bindings, with at least one server",
        )
    })?;
    let kinds = binding_kinds(&raw_bindings)?;
    let mut bindings = BTreeMap::new();
    for (name, raw_binding) in raw_bindings {
        let cx = Cx {
            name: &name,
            dir: Path::new(source).parent().unwrap_or(Path::new("")),
            path: format!("bindings.{name}"),
            kinds: &kinds,
            stores: &stores,
        };
        let binding = validate_binding(&cx, raw_binding)?;
        bindings.insert(name, binding);
    }
    let config = Config {
        runtime,
        telemetry,
        stores,
        bindings,
        source: source.to_owned(),
    };
    if config.servers().next().is_none() {
        return Err(fault(
            "bindings",
            "found no server binding, expected at least one binding with kind: server",
        ));
    }
    check_addresses(&config)?;
    check_rule_toolkits(&config)?;
    Ok(config)
}

/// What a binding's checks need to know about the rest of the file.
struct Cx<'a> {
    /// The binding's own name.
    name: &'a str,
    /// The config file's directory: relative file paths in the config start here.
    dir: &'a Path,
    /// `bindings.<name>`.
    path: String,
    kinds: &'a BTreeMap<String, Kind>,
    stores: &'a BTreeMap<String, Store>,
}

impl Cx<'_> {
    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.path)
    }
}

fn validate_stores(
    raw: BTreeMap<String, RawStore>,
    dir: &Path,
) -> Result<BTreeMap<String, Store>, Fault> {
    let mut stores = BTreeMap::new();
    for (name, store) in raw {
        check_name(&name).map_err(|expected| {
            fault(
                "stores",
                format!("found store name {}, expected {expected}", quote(&name)),
            )
        })?;
        let path = format!("stores.{name}");
        let store = match store.store_type {
            None => {
                return Err(fault(
                    format!("{path}.type"),
                    "missing, expected one of: memory, redis",
                ));
            }
            Some(StoreType::Memory) => {
                let redis_only = [
                    ("url", store.url.is_some()),
                    ("password_env", store.password_env.is_some()),
                    ("prefix", store.prefix.is_some()),
                    ("tls", store.tls.is_some()),
                ];
                if let Some((key, _)) = redis_only.iter().find(|(_, set)| *set) {
                    return Err(fault(
                        format!("{path}.{key}"),
                        "unknown key for a memory store, expected only type (url, password_env, \
                         prefix and tls are for type: redis)",
                    ));
                }
                Store::Memory
            }
            Some(StoreType::Redis) => Store::Redis(validate_redis(&path, dir, store)?),
        };
        stores.insert(name, store);
    }
    Ok(stores)
}

/// A redis store: its URL, the password from the environment if `password_env` names a
/// variable, the key prefix, and its TLS files.
fn validate_redis(path: &str, dir: &Path, raw: RawStore) -> Result<RedisStore, Fault> {
    let mut url = raw.url.ok_or_else(|| {
        fault(
            format!("{path}.url"),
            "missing, expected a redis:// or rediss:// URL such as redis://127.0.0.1:6379/0",
        )
    })?;
    if let Some(value) = raw.password_env.filter(|v| !v.is_null()) {
        let key = format!("{path}.password_env");
        let expected = "expected the name of an environment variable (letters, digits and _)";
        let name = value
            .as_str()
            .filter(|n| {
                !n.is_empty()
                    && n.len() <= NAME_BYTES_MAX
                    && !n.starts_with(|c: char| c.is_ascii_digit())
                    && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
            })
            .ok_or_else(|| fault(&key, format!("found {}, {expected}", render(&value))))?;
        if url.password.is_some() {
            return Err(fault(
                &key,
                "found a password in the url too, expected the password in one place",
            ));
        }
        // The value is a secret: no message below repeats it.
        let password = match std::env::var(name) {
            Ok(p) if !p.is_empty() => p,
            Ok(_) | Err(std::env::VarError::NotPresent) => {
                return Err(fault(
                    &key,
                    format!("found {name}, expected the environment variable {name} to be set"),
                ));
            }
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(fault(
                    &key,
                    format!(
                        "found {name}, expected the environment variable {name} to hold UTF-8 text"
                    ),
                ));
            }
        };
        if password.chars().any(char::is_control) {
            return Err(fault(
                &key,
                format!(
                    "found {name} holding control characters, expected a password without them"
                ),
            ));
        }
        url.password = Some(Secret::new(password));
    }
    let prefix = match raw.prefix.filter(|v| !v.is_null()) {
        None => REDIS_PREFIX_DEFAULT.to_owned(),
        Some(value) => value
            .as_str()
            .filter(|p| {
                !p.is_empty()
                    && p.len() <= REDIS_PREFIX_BYTES_MAX
                    && p.bytes().all(|b| b.is_ascii_graphic())
            })
            .map(str::to_owned)
            .ok_or_else(|| {
                fault(
                    format!("{path}.prefix"),
                    format!(
                        "found {}, expected 1 to {REDIS_PREFIX_BYTES_MAX} visible ASCII characters \
                         such as mcpyard:",
                        render(&value)
                    ),
                )
            })?,
    };
    let tls = match raw.tls {
        None => RedisTls::default(),
        Some(_) if !url.tls => {
            return Err(fault(
                format!("{path}.tls"),
                "found tls on a redis:// URL, expected a rediss:// URL for it to apply",
            ));
        }
        Some(tls) => redis_tls(path, dir, tls)?,
    };
    Ok(RedisStore { url, prefix, tls })
}

/// A redis store's `tls:`: `ca` alone, `cert` and `key` together, or all three; each file
/// readable and usable (the key goes with the certificate).
fn redis_tls(path: &str, dir: &Path, raw: RawTls) -> Result<RedisTls, Fault> {
    let file = |key: &str, v: Option<String>| match v {
        Some(v) if v.is_empty() => Err(fault(
            format!("{path}.tls.{key}"),
            "found an empty path, expected the path of a PEM file",
        )),
        v => Ok(v.map(|v| dir.join(v))),
    };
    let ca = file("ca", raw.ca)?;
    if let Some(ca) = &ca {
        crate::certs::client_config(Some(ca)).map_err(|e| fault(format!("{path}.tls.ca"), e))?;
    }
    let identity = match (file("cert", raw.cert)?, file("key", raw.key)?) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            crate::certs::server_config(&cert, &key)
                .map_err(|e| fault(format!("{path}.tls"), e))?;
            Some((cert, key))
        }
        (Some(_), None) => {
            return Err(fault(
                format!("{path}.tls.key"),
                "missing, expected the client certificate's PEM private key beside tls.cert",
            ));
        }
        (None, Some(_)) => {
            return Err(fault(
                format!("{path}.tls.cert"),
                "missing, expected the PEM client certificate chain that goes with tls.key",
            ));
        }
    };
    Ok(RedisTls { ca, identity })
}

/// Checks the binding names and collects each binding's kind, so that exits can be checked
/// whatever order the bindings are written in.
fn binding_kinds(raw: &BTreeMap<String, RawBinding>) -> Result<BTreeMap<String, Kind>, Fault> {
    if raw.is_empty() {
        return Err(fault(
            "bindings",
            "found an empty mapping, expected at least one binding with kind: server",
        ));
    }
    let mut kinds = BTreeMap::new();
    for (name, binding) in raw {
        check_name(name).map_err(|expected| {
            fault(
                "bindings",
                format!("found binding name {}, expected {expected}", quote(name)),
            )
        })?;
        let kind = binding.kind.ok_or_else(|| {
            fault(
                format!("bindings.{name}.kind"),
                "missing, expected one of: server, proxy, client, demo",
            )
        })?;
        kinds.insert(name.clone(), kind);
    }
    Ok(kinds)
}

fn validate_binding(cx: &Cx<'_>, raw: RawBinding) -> Result<Binding, Fault> {
    // `binding_kinds` has refused every binding without a kind.
    let kind = raw.kind.ok_or_else(|| fault(cx.key("kind"), "missing"))?;
    match kind {
        Kind::Server => validate_server(cx, raw).map(Binding::Server),
        Kind::Proxy => validate_proxy(cx, raw).map(Binding::Proxy),
        Kind::Client => validate_client(cx, raw).map(Binding::Client),
        Kind::Demo => Ok(Binding::Demo(DemoBinding {
            progress_interval: bounded(
                &cx.key("progress_interval"),
                raw.progress_interval,
                PROGRESS_INTERVAL_DEFAULT,
                None,
            )?,
        })),
    }
}

fn validate_server(cx: &Cx<'_>, raw: RawBinding) -> Result<ServerBinding, Fault> {
    let listen = raw.listen.ok_or_else(|| {
        fault(
            cx.key("listen"),
            "missing, expected a socket address such as 127.0.0.1:7114",
        )
    })?;
    Ok(ServerBinding {
        listen,
        path: raw.path.unwrap_or_else(|| SERVER_PATH_DEFAULT.to_owned()),
        exit: exit_target(cx, &cx.key("exit"), raw.exit.as_ref(), SERVER_EXITS)?,
        origins: raw.origins,
        hosts: raw.hosts,
        session_timeout: bounded(
            &cx.key("session_timeout"),
            raw.session_timeout,
            SESSION_IDLE_TIMEOUT_MAX,
            Some(SESSION_IDLE_TIMEOUT_MAX),
        )?,
        request_timeout: bounded(
            &cx.key("request_timeout"),
            raw.request_timeout,
            REQUEST_TIMEOUT_DEFAULT,
            Some(REQUEST_TIMEOUT_DEFAULT),
        )?,
        tls: raw.tls.map(|tls| server_tls(cx, tls)).transpose()?,
        sessions_store: raw
            .sessions
            .map(|sessions| {
                let path = cx.key("sessions.store");
                let name = store_name(cx.stores, &path, sessions.store.as_ref())?;
                match cx.stores.get(&name) {
                    Some(Store::Redis(_)) => Ok(name),
                    _ => Err(fault(
                        path,
                        format!(
                            "found {}, a memory store, expected a redis store (a memory store \
                             is one process's, whose workers share sessions already)",
                            quote(&name)
                        ),
                    )),
                }
            })
            .transpose()?,
        auth: raw
            .auth
            .map(|auth| {
                let cx_auth = super::auth::AuthContext { dir: cx.dir };
                super::auth::validate(auth, &cx_auth)
                    .map(Box::new)
                    .map_err(|(path, message)| fault(cx.key(&format!("auth.{path}")), message))
            })
            .transpose()?,
    })
}

/// A server's `tls:`: both files given, readable, and making a working TLS config.
fn server_tls(cx: &Cx<'_>, raw: RawTls) -> Result<ServerTls, Fault> {
    if raw.ca.is_some() {
        return Err(fault(
            cx.key("tls.ca"),
            "found ca on a server binding, expected cert and key (agents' client certificates are not checked)",
        ));
    }
    let file = |key: &str, value: Option<String>, what: &str| {
        value
            .filter(|v| !v.is_empty())
            .map(|v| cx.dir.join(v))
            .ok_or_else(|| fault(cx.key(key), format!("missing, expected the path of {what}")))
    };
    let cert = file("tls.cert", raw.cert, "a PEM certificate chain (leaf first)")?;
    let key = file("tls.key", raw.key, "the certificate's PEM private key")?;
    crate::certs::server_config(&cert, &key).map_err(|e| fault(cx.key("tls"), e))?;
    Ok(ServerTls { cert, key })
}

/// A client's `tls:`: only `ca`, only for an https:// upstream, and a readable PEM file.
fn client_tls(cx: &Cx<'_>, server: &UpstreamUrl, raw: RawTls) -> Result<Option<PathBuf>, Fault> {
    if raw.cert.is_some() || raw.key.is_some() {
        return Err(fault(
            cx.key("tls"),
            "found cert/key on a client binding, expected only ca (client certificates are not supported)",
        ));
    }
    if server.scheme != Scheme::Https {
        return Err(fault(
            cx.key("tls"),
            "found tls on an http:// upstream, expected an https:// server URL for it to apply",
        ));
    }
    let Some(ca) = raw.ca.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let ca = cx.dir.join(ca);
    crate::certs::client_config(Some(&ca)).map_err(|e| fault(cx.key("tls.ca"), e))?;
    Ok(Some(ca))
}

fn validate_proxy(cx: &Cx<'_>, raw: RawBinding) -> Result<ProxyBinding, Fault> {
    let cache = match raw.cache {
        None => None,
        Some(cache) => {
            let path = cx.key("cache.store");
            let store = store_name(cx.stores, &path, cache.store.as_ref())?;
            let path = cx.key("cache.ttl");
            let ttl = cache.ttl.unwrap_or(CACHE_TTL_DEFAULT);
            if ttl < CACHE_TTL_MIN {
                return Err(fault(
                    path,
                    format!(
                        "found {}, expected at least {}",
                        format_duration(ttl),
                        format_duration(CACHE_TTL_MIN)
                    ),
                ));
            }
            let authorization = match cache.authorization.map(|a| a.0) {
                None => None,
                Some(ClientAuth::Bearer(secret)) => Some(secret),
                Some(ClientAuth::Forward) => {
                    return Err(fault(
                        cx.key("cache.authorization"),
                        "found forward, expected a mapping { bearer: TOKEN } (hydration runs \
                         without an agent, so there is no header to forward)",
                    ));
                }
            };
            Some(Cache {
                store,
                ttl,
                authorization,
            })
        }
    };
    let raw_routes = raw.routes.ok_or_else(|| {
        fault(
            cx.key("routes"),
            "missing, expected a list of routes, each with a toolkit and an exit",
        )
    })?;
    if raw_routes.is_empty() {
        return Err(fault(
            cx.key("routes"),
            "found an empty list, expected at least one route",
        ));
    }
    if raw_routes.len() > PROXY_ROUTES_MAX {
        return Err(fault(
            cx.key("routes"),
            format!(
                "found {} routes, expected at most {PROXY_ROUTES_MAX}",
                raw_routes.len()
            ),
        ));
    }
    let single = raw_routes.len() == 1;
    let mut routes: Vec<Route> = Vec::with_capacity(raw_routes.len());
    for (index, route) in raw_routes.into_iter().enumerate() {
        let path = format!("{}.routes[{index}]", cx.path);
        let toolkit = toolkit_name(&format!("{path}.toolkit"), route.toolkit.as_ref(), single)?;
        if let Some(name) = &toolkit
            && let Some(first) = routes.iter().position(|r| r.toolkit.as_ref() == Some(name))
        {
            return Err(fault(
                format!("{path}.toolkit"),
                format!(
                    "found {}, expected a toolkit name not already used by routes[{first}]",
                    quote(name)
                ),
            ));
        }
        let exit = exit_target(
            cx,
            &format!("{path}.exit"),
            route.exit.as_ref(),
            ROUTE_EXITS,
        )?;
        routes.push(Route {
            toolkit,
            exit,
            tools: route.tools,
            prompts: route.prompts,
            resources: route.resources,
            event_prefix: None,
        });
    }
    if !single {
        assign_event_prefixes(&cx.path, &mut routes)?;
    }
    Ok(ProxyBinding { cache, routes })
}

/// Gives each route of a multi-route proxy its aggregate event-id prefix, or names the two
/// toolkits whose prefixes cannot differ (their CRC32C codes are equal).
fn assign_event_prefixes(path: &str, routes: &mut [Route]) -> Result<(), Fault> {
    // `validate_proxy` has refused a route without a toolkit when there are several.
    let toolkits: Vec<&str> = routes
        .iter()
        .map(|r| r.toolkit.as_deref().unwrap_or_default())
        .collect();
    let prefixes = event_prefixes(&toolkits).map_err(|(first, second)| {
        let name = |i: usize| toolkits.get(i).copied().unwrap_or_default();
        fault(
            format!("{path}.routes[{second}].toolkit"),
            format!(
                "found {}, expected a toolkit name whose event-id code differs from that of {} \
                 in routes[{first}] (both are {}, a CRC32C collision)",
                quote(name(second)),
                quote(name(first)),
                event_code(name(first))
            ),
        )
    })?;
    for (route, prefix) in routes.iter_mut().zip(prefixes) {
        route.event_prefix = Some(prefix);
    }
    Ok(())
}

fn validate_client(cx: &Cx<'_>, raw: RawBinding) -> Result<ClientBinding, Fault> {
    let server = raw.server.ok_or_else(|| {
        fault(
            cx.key("server"),
            "missing, expected an http:// or https:// URL",
        )
    })?;
    let tls_ca = match raw.tls {
        Some(tls) => client_tls(cx, &server, tls)?,
        None => None,
    };
    Ok(ClientBinding {
        server,
        tls_ca,
        authorization: raw.authorization.map(|auth| auth.0),
        connect_timeout: bounded(
            &cx.key("connect_timeout"),
            raw.connect_timeout,
            CONNECT_TIMEOUT_DEFAULT,
            None,
        )?,
        response_timeout: bounded(
            &cx.key("response_timeout"),
            raw.response_timeout,
            RESPONSE_TIMEOUT_DEFAULT,
            None,
        )?,
    })
}

/// A duration that must be greater than zero and at most `max`, `default` when absent.
fn bounded(
    path: &str,
    value: Option<Duration>,
    default: Duration,
    max: Option<Duration>,
) -> Result<Duration, Fault> {
    let value = value.unwrap_or(default);
    if value.is_zero() {
        return Err(fault(path, "found 0, expected a duration greater than 0"));
    }
    if let Some(max) = max.filter(|&max| value > max) {
        return Err(fault(
            path,
            format!(
                "found {}, expected at most {}",
                format_duration(value),
                format_duration(max)
            ),
        ));
    }
    Ok(value)
}

/// Resolves an `exit:` to the name of an existing binding whose kind is in `allowed`.
/// Messages list the other bindings' names; a binding never exits to itself.
fn exit_target(
    cx: &Cx<'_>,
    path: &str,
    value: Option<&Value>,
    allowed: &[Kind],
) -> Result<String, Fault> {
    let kinds = cx.kinds;
    let allowed_phrase = kinds_phrase(allowed);
    let candidates: Vec<&str> = kinds
        .iter()
        .filter(|(name, kind)| allowed.contains(kind) && *name != cx.name)
        .map(|(name, _)| name.as_str())
        .collect();
    let candidates = one_of(&candidates);
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Err(fault(
            path,
            format!("missing, expected the name of a {allowed_phrase} binding {candidates}"),
        ));
    };
    let target = value
        .as_str()
        .filter(|n| *n != cx.name)
        .and_then(|n| kinds.get_key_value(n));
    let Some((name, kind)) = target else {
        let names: Vec<&str> = kinds
            .keys()
            .map(String::as_str)
            .filter(|n| *n != cx.name)
            .collect();
        return Err(fault(
            path,
            format!(
                "found {}, expected the name of a binding {}",
                render(value),
                one_of(&names)
            ),
        ));
    };
    if !allowed.contains(kind) {
        return Err(fault(
            path,
            format!(
                "found {} (a {} binding), expected the name of a {allowed_phrase} binding {candidates}",
                quote(name),
                kind.name()
            ),
        ));
    }
    Ok(name.clone())
}

/// Resolves a `cache.store` or `sessions.store` to the name of a configured store.
fn store_name(
    stores: &BTreeMap<String, Store>,
    path: &str,
    value: Option<&Value>,
) -> Result<String, Fault> {
    let names: Vec<&str> = stores.keys().map(String::as_str).collect();
    let names = one_of(&names);
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Err(fault(
            path,
            format!("missing, expected the name of a store {names}"),
        ));
    };
    match value.as_str().filter(|n| stores.contains_key(*n)) {
        Some(name) => Ok(name.to_owned()),
        None => Err(fault(
            path,
            format!(
                "found {}, expected the name of a store {names}",
                render(value)
            ),
        )),
    }
}

/// A route's toolkit name: a valid name without `__`, which separates the toolkit prefix
/// from the tool name (`github__search`) and so cannot appear inside the prefix, and not
/// ending with `_`, so that no prefixed name reads two ways. Returns `None` when the key is
/// absent and the route is its proxy's only one (`single`): one upstream needs no prefix.
fn toolkit_name(path: &str, value: Option<&Value>, single: bool) -> Result<Option<String>, Fault> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        if single {
            return Ok(None);
        }
        return Err(fault(
            path,
            "missing, expected a toolkit name such as github (required when a proxy has more than one route)",
        ));
    };
    let expected = match value.as_str() {
        None => NAME_EXPECTED,
        Some(name) => match check_name(name) {
            Err(expected) => expected,
            Ok(()) if name.contains("__") => {
                "a toolkit name without __ (it separates toolkit and tool)"
            }
            // `gh_` would make `gh___x`, which also reads as toolkit `gh` and tool `_x`.
            Ok(()) if name.ends_with('_') => {
                "a toolkit name that does not end with _ (it would run into the __ separator)"
            }
            Ok(()) => return Ok(Some(name.to_owned())),
        },
    };
    Err(fault(
        path,
        format!("found {}, expected {expected}", render(value)),
    ))
}

const NAME_EXPECTED: &str = "a name of 1 to 64 letters, digits, _ or -";

/// Checks a binding, store or toolkit name against `[A-Za-z0-9_-]{1,64}`.
fn check_name(name: &str) -> Result<(), &'static str> {
    let ok = !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok { Ok(()) } else { Err(NAME_EXPECTED) }
}

/// No two listeners (servers, metrics) on one address; port 0 never conflicts.
fn check_addresses(config: &Config) -> Result<(), Fault> {
    let mut taken: BTreeMap<SocketAddr, String> = BTreeMap::new();
    let servers = config
        .servers()
        .map(|(name, server)| (format!("bindings.{name}.listen"), server.listen));
    let metrics = config
        .telemetry
        .metrics
        .map(|addr| ("telemetry.metrics".to_owned(), addr));
    for (path, addr) in servers.chain(metrics) {
        if addr.port() == 0 {
            continue;
        }
        if let Some(first) = taken.get(&addr) {
            return Err(fault(
                &path,
                format!("found {addr}, expected an address not already used by {first}"),
            ));
        }
        taken.insert(addr, path);
    }
    Ok(())
}

/// `proxy, client or demo`.
/// A server's `auth.rules[].toolkit` names a toolkit of the proxy the server exits to.
fn check_rule_toolkits(config: &Config) -> Result<(), Fault> {
    for (name, server) in config.servers() {
        let Some(auth) = server.auth.as_ref() else {
            continue;
        };
        let toolkits: Vec<&str> = match config.bindings.get(&server.exit) {
            Some(Binding::Proxy(proxy)) => proxy
                .routes
                .iter()
                .filter_map(|r| r.toolkit.as_deref())
                .collect(),
            _ => Vec::new(),
        };
        for (i, rule) in auth.rules.iter().enumerate() {
            let Some(toolkit) = rule.toolkit.as_deref() else {
                continue;
            };
            if !toolkits.contains(&toolkit) {
                let expected = if toolkits.is_empty() {
                    "no toolkit: the server does not exit to a proxy with toolkits".to_owned()
                } else {
                    format!("one of the proxy's toolkits ({})", toolkits.join(", "))
                };
                return Err(fault(
                    format!("bindings.{name}.auth.rules[{i}].toolkit"),
                    format!("found {}, expected {expected}", quote(toolkit)),
                ));
            }
        }
    }
    Ok(())
}

fn kinds_phrase(kinds: &[Kind]) -> String {
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

/// `(one of: a, b)`, or `(none is configured)`.
fn one_of(names: &[&str]) -> String {
    if names.is_empty() {
        "(none is configured)".to_owned()
    } else {
        format!("(one of: {})", names.join(", "))
    }
}
