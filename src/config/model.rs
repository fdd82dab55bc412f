//! The validated configuration: the types the rest of mcpyard reads.
//!
//! A `Config` only exists once every check in `validate.rs` has passed, so its users never
//! re-check: every `exit` names a binding of an allowed kind, every timeout is within the
//! bounds of `limits.rs`, every default is filled in, and secrets are already taken from the
//! environment. The types are plain data; they are built once at start-up and then shared
//! read-only by all workers.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::glob::AllowList;

/// A whole, validated configuration file.
#[derive(Debug, Clone)]
pub struct Config {
    /// Process-wide settings (`runtime:`).
    pub runtime: Runtime,
    /// Metrics endpoint (`telemetry:`).
    pub telemetry: Telemetry,
    /// Named stores (`stores:`), referenced by proxy caches.
    pub stores: BTreeMap<String, Store>,
    /// Named bindings (`bindings:`); at least one is a `server`.
    pub bindings: BTreeMap<String, Binding>,
    /// The file name the config was loaded from, for messages.
    pub source: String,
}

impl Config {
    /// Iterates over the `server` bindings, the agent-facing listeners, in name order.
    pub fn servers(&self) -> impl Iterator<Item = (&str, &ServerBinding)> {
        self.bindings
            .iter()
            .filter_map(|(name, binding)| match binding {
                Binding::Server(server) => Some((name.as_str(), server)),
                _ => None,
            })
    }
}

/// Process-wide settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runtime {
    /// Worker threads; 0 means one per available core. At most `limits::WORKERS_MAX`.
    pub workers: usize,
    /// Which I/O backend the workers run on.
    pub io: IoMode,
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            workers: 0,
            io: IoMode::Auto,
        }
    }
}

/// The I/O backend (`runtime.io`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    /// epoll (`runtime::choose_backend` gives the measurements behind it).
    Auto,
    /// io_uring only; start-up fails when it is unavailable.
    Uring,
    /// epoll only.
    Epoll,
}

/// Observability settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Telemetry {
    /// Where to serve Prometheus text at `GET /metrics`; `None` serves no metrics.
    pub metrics: Option<SocketAddr>,
}

/// A store (`stores.<name>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// The embedded, process-wide in-memory store.
    Memory,
    /// A Redis server that several mcpyard nodes share (`type: redis`).
    Redis(RedisStore),
}

/// `type: redis`: where the server is and how this deployment's keys are named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisStore {
    /// The server, the database and the credentials (`url:`, `password_env:`).
    pub url: RedisUrl,
    /// Put before every key and channel name, so deployments can share one Redis:
    /// 1 to `limits::REDIS_PREFIX_BYTES_MAX` visible ASCII characters. Default `mcpyard:`.
    pub prefix: String,
    /// `tls:` for a `rediss://` URL: the CA to trust instead of the platform's roots, and
    /// a client certificate for a Redis that asks for one.
    pub tls: RedisTls,
}

/// A Redis store's TLS files (paths relative to the config file's directory).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    /// `tls.ca`: PEM certificates to trust, in place of the platform's trust roots.
    pub ca: Option<std::path::PathBuf>,
    /// `tls.cert` and `tls.key`: a PEM client certificate chain and its key.
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// A parsed `redis://` or `rediss://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// `rediss://`: TLS (rustls, the platform's trust roots), the host name verified.
    pub tls: bool,
    /// Lower-case DNS name or IP address, IPv6 without brackets.
    pub host: String,
    /// The port; 6379 when the URL has none.
    pub port: u16,
    /// The database index (the URL's path); 0 when the URL has none.
    pub db: u32,
    /// The ACL user (`AUTH user password`); `None`: the default user.
    pub username: Option<String>,
    /// The password, from the URL or from the environment variable `password_env:` names.
    pub password: Option<Secret>,
    /// The URL as logs show it: the password replaced by `***`.
    pub shown: String,
}

/// One binding (`bindings.<name>`), by `kind`.
#[derive(Debug, Clone)]
pub enum Binding {
    /// `kind: server`, an agent-facing MCP Streamable HTTP endpoint.
    Server(ServerBinding),
    /// `kind: proxy`, routing by toolkit, merging lists, optional cache.
    Proxy(ProxyBinding),
    /// `kind: client`, one upstream MCP server.
    Client(ClientBinding),
    /// `kind: demo`, the embedded demo toolkit.
    Demo(DemoBinding),
}

impl Binding {
    /// The `kind:` value this binding was written with: `server`, `proxy`, `client` or `demo`.
    pub fn kind(&self) -> &'static str {
        match self {
            Binding::Server(_) => "server",
            Binding::Proxy(_) => "proxy",
            Binding::Client(_) => "client",
            Binding::Demo(_) => "demo",
        }
    }
}

/// An agent-facing endpoint (`kind: server`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerBinding {
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// The MCP endpoint path: starts with `/`, visible ASCII, no `?` or `#`. Default `/mcp`.
    pub path: String,
    /// Name of the `proxy`, `client` or `demo` binding requests go to.
    pub exit: String,
    /// Allowed `Origin` values, normalised to lower case without a default port
    /// (`http://localhost:6274`). `None`: only loopback origins are allowed when `listen`
    /// is a loopback address; otherwise requests with an `Origin` header are refused.
    pub origins: Option<Vec<String>>,
    /// Allowed `Host` header host names, lower case, IPv6 in brackets, port not included.
    /// `None`: loopback listeners allow only `localhost`, `127.0.0.1` and `[::1]`; other
    /// listeners allow any host.
    pub hosts: Option<Vec<String>>,
    /// Idle session expiry; at most `limits::SESSION_IDLE_TIMEOUT_MAX` (the default).
    pub session_timeout: Duration,
    /// Deadline for a request's reply; at most `limits::REQUEST_TIMEOUT_DEFAULT` (the default).
    pub request_timeout: Duration,
    /// Serve agents over TLS with this certificate; `None`: plain HTTP.
    pub tls: Option<ServerTls>,
    /// `sessions.store`: the redis store through which every node of a cluster can serve
    /// this binding's sessions; `None`: sessions live on the node that opened them.
    pub sessions_store: Option<String>,
    /// `auth`: tokens verified here, rules and rate limits; `None`: nobody is checked.
    /// Boxed: most servers have none, and it is most of the binding's size.
    pub auth: Option<Box<ServerAuth>>,
}

/// `tls:` of a server binding: PEM files, resolved against the config file's directory and
/// checked (readable, parsed, the key going with the certificate) when the config loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTls {
    /// The certificate chain, leaf first.
    pub cert: std::path::PathBuf,
    /// The leaf's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: std::path::PathBuf,
}

/// Routing and aggregation (`kind: proxy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyBinding {
    /// List cache; `None` forwards every list request upstream.
    pub cache: Option<Cache>,
    /// Routes in file order; never empty, toolkit names unique, and every route has a
    /// toolkit and an event prefix when there is more than one.
    pub routes: Vec<Route>,
}

/// A proxy's list cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cache {
    /// Name of the `stores:` entry holding the cached lists.
    pub store: String,
    /// How long a hydrated list is served before it is refreshed; at least 1s, default 5m.
    pub ttl: Duration,
    /// The credential hydration sends upstream (`Authorization: Bearer <token>`), if any;
    /// read from the environment at start-up, never logged.
    pub authorization: Option<Secret>,
}

/// One proxy route: a toolkit, where its requests go, and what of it agents may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The toolkit name, which prefixes what this route serves: tools and prompts appear to
    /// agents as `<toolkit>__<name>`, resources as `<toolkit>+<uri>`. Matches
    /// `[A-Za-z0-9_-]{1,64}` without `__` (the separator), unique within the proxy.
    /// `None` only when the proxy has exactly this one route and it names no toolkit: then
    /// names pass through unprefixed (a single-upstream proxy).
    pub toolkit: Option<String>,
    /// Name of the `client` or `demo` binding serving this toolkit.
    pub exit: String,
    /// Which of the upstream's tools agents may list and call, matched against the tool
    /// name as the upstream spells it (without the `<toolkit>__` prefix). `None` admits
    /// every tool; an empty list admits none.
    pub tools: Option<AllowList>,
    /// Which of the upstream's prompts agents may list and get, matched against the
    /// upstream's prompt name. `None` admits every prompt; an empty list admits none.
    pub prompts: Option<AllowList>,
    /// Which of the upstream's resources agents may list, read and subscribe to, matched
    /// against the upstream's URI (or URI template). `None` admits every resource; an empty
    /// list admits none.
    pub resources: Option<AllowList>,
    /// This route's tag in aggregate SSE event ids (`<prefix>=<id>;…`), 1 to 6 characters
    /// of `A-Za-z0-9-_` derived from the toolkit name ([`super::event_prefixes`]), all of
    /// one length within a proxy. `Some` exactly when the proxy has more than one route;
    /// with one route, event ids pass through unchanged.
    pub event_prefix: Option<String>,
}

/// One upstream MCP server (`kind: client`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientBinding {
    /// The upstream's MCP endpoint.
    pub server: UpstreamUrl,
    /// What credential goes upstream; `None` sends none.
    pub authorization: Option<ClientAuth>,
    /// Deadline of one connection attempt to one address: the TCP connect and, for https,
    /// the TLS handshake together; a failed attempt moves on to the next address. Default 5s.
    pub connect_timeout: Duration,
    /// Deadline from sending a request to the upstream's response head. Default 60s.
    pub response_timeout: Duration,
    /// `https://` only: the CA certificates (PEM) the upstream's certificate must chain to;
    /// `None`: the platform's trust roots.
    pub tls_ca: Option<std::path::PathBuf>,
}

/// A parsed upstream URL, split into what an HTTP/1.1 request needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// `http` or `https`.
    pub scheme: Scheme,
    /// Lower-case DNS name or IP address, IPv6 without brackets.
    pub host: String,
    /// The port, the scheme's default (80 or 443) when the URL has none.
    pub port: u16,
    /// The request target: path (at least `/`) and query, as written.
    pub path_and_query: String,
    /// `host[:port]` as sent in `Host`: IPv6 in brackets, port left out when it is the default.
    pub authority: String,
}

/// An upstream URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Plain HTTP.
    Http,
    /// HTTP over TLS.
    Https,
}

/// The credential a client binding sends upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientAuth {
    /// Pass the agent's own `Authorization` header through.
    Forward,
    /// Send `Authorization: Bearer <token>`; `${NAME}` was replaced from the environment.
    Bearer(Secret),
}

/// The embedded demo toolkit (`kind: demo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoBinding {
    /// Pause between the progress steps of the demo's slow tool. Default 200ms.
    pub progress_interval: Duration,
}

/// A credential. `Debug` prints `Secret(**redacted**)`, and there is no `Display`, so a
/// secret only leaves through `expose`, at the one place that writes it to the wire.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: String) -> Self {
        Secret(value)
    }

    /// The credential itself, for writing into a request header.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The `Authorization` header value that sends this credential: `Bearer <token>`.
    pub fn bearer_header(&self) -> bytes::Bytes {
        let mut value = bytes::BytesMut::with_capacity(7 + self.0.len());
        value.extend_from_slice(b"Bearer ");
        value.extend_from_slice(self.0.as_bytes());
        value.freeze()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(**redacted**)")
    }
}

/// A server binding's `auth:` section, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAuth {
    /// `resource`: the protected resource's URL as the metadata names it; `None`: built
    /// from each request's scheme, `Host` and the MCP path.
    pub resource: Option<String>,
    /// `authorization_servers`: where clients get tokens; default `[jwt.issuer]`.
    pub authorization_servers: Vec<String>,
    /// `scopes`: what every request needs, all of them.
    pub scopes: Vec<String>,
    /// How tokens are verified.
    pub jwt: Jwt,
    /// First match decides which items a caller sees and may use; empty: everything.
    pub rules: Vec<Rule>,
    /// Token buckets every request is counted against.
    pub limits: Vec<Limit>,
}

impl ServerAuth {
    /// `scopes_supported` of the metadata: `scopes`, then the rules' scopes, no repeats.
    pub fn scopes_supported(&self) -> Vec<&str> {
        let mut all: Vec<&str> = Vec::new();
        let rules = self.rules.iter().flat_map(|r| r.scopes.iter());
        for scope in self.scopes.iter().chain(rules) {
            if !all.contains(&scope.as_str()) {
                all.push(scope);
            }
        }
        all
    }
}

/// `auth.jwt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwt {
    /// `iss` must equal this.
    pub issuer: String,
    /// `aud` must hold one of these.
    pub audiences: Vec<String>,
    /// Where the signing keys come from.
    pub jwks: JwksSource,
    /// `https` key sets only: the CA the server's certificate must chain to.
    pub jwks_ca: Option<std::path::PathBuf>,
    /// How often the key set is read again.
    pub refresh: Duration,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    /// Accepted `alg` values (RS, PS, ES and EdDSA; never `none` or HMAC).
    pub algorithms: Vec<String>,
    /// The claim holding a caller's groups (a string or an array of strings).
    pub groups_claim: String,
}

/// Where a JWK Set is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwksSource {
    /// A file, resolved against the config file's directory.
    File(std::path::PathBuf),
    /// An `https://` URL.
    Url(UpstreamUrl),
}

/// One rule: what it covers, and what a caller needs for what it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Only the items of this proxy toolkit (`<toolkit>__name`, `<toolkit>+uri`).
    pub toolkit: Option<String>,
    /// Name globs per family; all three `None`: every item (of the toolkit).
    pub tools: Option<AllowList>,
    pub prompts: Option<AllowList>,
    pub resources: Option<AllowList>,
    /// The caller needs all of these scopes, ...
    pub scopes: Vec<String>,
    /// ... one of these groups (when any are given) ...
    pub groups: Vec<String>,
    /// ... and to be one of these subjects (when any are given).
    pub subjects: Vec<String>,
}

/// One rate limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// The metrics label and the name in the 429 body.
    pub name: String,
    /// The claim that tells callers apart.
    pub per: String,
    /// Only `tools/call` of these agent-visible names counts; `None`: every request.
    pub tools: Option<AllowList>,
    /// `count` requests per `period` refill the bucket.
    pub count: u32,
    pub period: Duration,
    /// The bucket's size.
    pub burst: u32,
}
