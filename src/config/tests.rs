//! Table tests for the config loader: each invalid file is pinned to its exact one-line
//! message, and the shipped example files must load.

use std::net::SocketAddr;
use std::time::Duration;

use super::*;

/// The shape of a full config (server, proxy with two routes, clients), the starting point
/// of most cases.
const BASE: &str = "\
runtime:
  workers: 0
  io: auto
stores:
  cache0: { type: memory }
bindings:
  north:
    kind: server
    listen: 127.0.0.1:7114
    exit: tools
  tools:
    kind: proxy
    cache: { store: cache0 }
    routes:
      - toolkit: github
        exit: github
      - toolkit: time
        exit: time
  github:
    kind: client
    server: http://127.0.0.1:3001/mcp
  time:
    kind: client
    server: http://127.0.0.1:3002/mcp
";

/// `BASE` with one piece of text replaced; the piece must occur in `BASE`.
fn edit(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "BASE lacks {from:?}");
    BASE.replacen(from, to, 1)
}

fn load_ok(text: &str) -> Config {
    match load_str(text, "gw.yaml") {
        Ok(config) => config,
        Err(e) => panic!("expected a valid config, got: {e}"),
    }
}

fn load_err(text: &str) -> String {
    match load_str(text, "gw.yaml") {
        Ok(config) => panic!("expected an error, got: {config:?}"),
        Err(e) => e.to_string(),
    }
}

fn client<'a>(config: &'a Config, name: &str) -> &'a ClientBinding {
    match config.bindings.get(name) {
        Some(Binding::Client(client)) => client,
        other => panic!("{name} is not a client: {other:?}"),
    }
}

/// `BASE` with the proxy's route list replaced by `routes` (lines indented by six spaces).
fn with_routes(routes: &str) -> String {
    edit(
        "      - toolkit: github\n        exit: github\n      - toolkit: time\n        exit: time\n",
        routes,
    )
}

/// `BASE` with `keys` (lines indented by eight spaces) added to the `github` route.
fn with_github_route(keys: &str) -> String {
    edit(
        "        exit: github\n",
        &format!("        exit: github\n{keys}"),
    )
}

fn proxy<'a>(config: &'a Config, name: &str) -> &'a ProxyBinding {
    match config.bindings.get(name) {
        Some(Binding::Proxy(proxy)) => proxy,
        other => panic!("{name} is not a proxy: {other:?}"),
    }
}

fn globs(texts: &[&str]) -> AllowList {
    AllowList::new(texts.iter().map(|t| Glob::new(*t)).collect())
}

/// `edit` of the client `time`'s server URL.
fn with_time_url(url: &str) -> String {
    edit("http://127.0.0.1:3002/mcp", url)
}

#[test]
fn invalid_files_get_exact_messages() {
    let table: Vec<(&str, String, &str)> = vec![
        (
            "unknown top-level key",
            format!("{BASE}bindngs: {{}}\n"),
            "gw.yaml: bindngs: unknown key, expected one of: runtime, telemetry, stores, bindings",
        ),
        (
            "unknown nested key",
            edit("  workers: 0", "  wrkers: 0"),
            "gw.yaml: runtime.wrkers: unknown key, expected one of: workers, io",
        ),
        (
            "unknown key of a single-key section",
            format!("{BASE}telemetry: {{ metric: 127.0.0.1:9464 }}\n"),
            "gw.yaml: telemetry.metric: unknown key, expected metrics",
        ),
        (
            "unknown key inside a route list item",
            edit(
                "      - toolkit: time\n        exit: time",
                "      - toolkit: time\n        exits: time",
            ),
            "gw.yaml: bindings.tools.routes[1].exits: unknown key, expected one of: toolkit, exit, tools, prompts, resources",
        ),
        (
            "key of another binding kind",
            edit("    exit: tools", "    exit: tools\n    routes: []"),
            "gw.yaml: bindings.north.routes: unknown key for a server binding, expected one of: \
             kind, listen, path, exit, origins, hosts, session_timeout, request_timeout, sessions, tls, auth",
        ),
        (
            "unknown key of the cache",
            edit("{ store: cache0 }", "{ store: cache0, tll: 5m }"),
            "gw.yaml: bindings.tools.cache.tll: unknown key, expected one of: store, ttl, authorization",
        ),
        (
            "bad listen",
            edit("listen: 127.0.0.1:7114", "listen: 127.0.0.1:x"),
            "gw.yaml: bindings.north.listen: found \"127.0.0.1:x\", expected a socket address such as 127.0.0.1:7114",
        ),
        (
            "listen as a number",
            edit("listen: 127.0.0.1:7114", "listen: 7114"),
            "gw.yaml: bindings.north.listen: found 7114, expected a socket address such as 127.0.0.1:7114",
        ),
        (
            "missing listen",
            edit("    listen: 127.0.0.1:7114\n", ""),
            "gw.yaml: bindings.north.listen: missing, expected a socket address such as 127.0.0.1:7114",
        ),
        (
            "duration in words",
            edit(
                "    exit: tools",
                "    exit: tools\n    session_timeout: 5 minutes",
            ),
            "gw.yaml: bindings.north.session_timeout: found \"5 minutes\", expected a duration such as 100ms, 30s, 5m or 1h",
        ),
        (
            "negative duration",
            edit("{ store: cache0 }", "{ store: cache0, ttl: -1s }"),
            "gw.yaml: bindings.tools.cache.ttl: found \"-1s\", expected a duration such as 100ms, 30s, 5m or 1h",
        ),
        (
            "duration without unit",
            edit(
                "    server: http://127.0.0.1:3001/mcp",
                "    server: http://127.0.0.1:3001/mcp\n    connect_timeout: 10",
            ),
            "gw.yaml: bindings.github.connect_timeout: found 10, expected a duration such as 100ms, 30s, 5m or 1h",
        ),
        (
            "zero duration",
            edit(
                "    server: http://127.0.0.1:3001/mcp",
                "    server: http://127.0.0.1:3001/mcp\n    response_timeout: 0s",
            ),
            "gw.yaml: bindings.github.response_timeout: found 0, expected a duration greater than 0",
        ),
        (
            "session timeout over the limit",
            edit(
                "    exit: tools",
                "    exit: tools\n    session_timeout: 1h",
            ),
            "gw.yaml: bindings.north.session_timeout: found 1h, expected at most 30m",
        ),
        (
            "request timeout over the default",
            edit(
                "    exit: tools",
                "    exit: tools\n    request_timeout: 301s",
            ),
            "gw.yaml: bindings.north.request_timeout: found 301s, expected at most 5m",
        ),
        (
            "cache ttl under a second",
            edit("{ store: cache0 }", "{ store: cache0, ttl: 999ms }"),
            "gw.yaml: bindings.tools.cache.ttl: found 999ms, expected at least 1s",
        ),
        (
            "bad io value",
            edit("  io: auto", "  io: fast"),
            "gw.yaml: runtime.io: found \"fast\", expected one of: auto, uring, epoll",
        ),
        (
            "workers too large",
            edit("  workers: 0", "  workers: 257"),
            "gw.yaml: runtime.workers: found 257, expected a number of workers from 0 (one per core) to 256",
        ),
        (
            "negative workers",
            edit("  workers: 0", "  workers: -1"),
            "gw.yaml: runtime.workers: found -1, expected a number of workers from 0 (one per core) to 256",
        ),
        (
            "missing route exit target",
            edit("        exit: time", "        exit: nope"),
            "gw.yaml: bindings.tools.routes[1].exit: found \"nope\", expected the name of a binding (one of: github, north, time)",
        ),
        (
            "missing server exit target",
            edit("    exit: tools", "    exit: tool"),
            "gw.yaml: bindings.north.exit: found \"tool\", expected the name of a binding (one of: github, time, tools)",
        ),
        (
            "missing exit key",
            edit("    exit: tools\n", ""),
            "gw.yaml: bindings.north.exit: missing, expected the name of a proxy, client or demo binding (one of: github, time, tools)",
        ),
        (
            "route exit to a proxy",
            edit("        exit: time", "        exit: tools"),
            "gw.yaml: bindings.tools.routes[1].exit: found \"tools\", expected the name of a binding (one of: github, north, time)",
        ),
        (
            "route exit to a server",
            edit("        exit: time", "        exit: north"),
            "gw.yaml: bindings.tools.routes[1].exit: found \"north\" (a server binding), expected the name of a client or demo binding (one of: github, time)",
        ),
        (
            "server exit to a server",
            format!(
                "{BASE}  south:\n    kind: server\n    listen: 127.0.0.1:7115\n    exit: north\n"
            ),
            "gw.yaml: bindings.south.exit: found \"north\" (a server binding), expected the name of a proxy, client or demo binding (one of: github, time, tools)",
        ),
        (
            "ftp url",
            with_time_url("ftp://127.0.0.1/mcp"),
            "gw.yaml: bindings.time.server: found \"ftp://127.0.0.1/mcp\", expected an http:// or https:// URL",
        ),
        (
            "url without host",
            with_time_url("http:///mcp"),
            "gw.yaml: bindings.time.server: found \"http:///mcp\", expected an http:// or https:// URL with a host",
        ),
        (
            "url with userinfo",
            with_time_url("http://bob:hunter2@127.0.0.1:3002/mcp"),
            "gw.yaml: bindings.time.server: found \"http://***@127.0.0.1:3002\", expected an http:// or https:// URL \
             without user information (credentials belong in authorization:)",
        ),
        (
            "missing environment variable",
            edit(
                "    server: http://127.0.0.1:3002/mcp\n",
                "    server: http://127.0.0.1:3002/mcp\n    authorization:\n      bearer: ${MCPYARD_TEST_SURELY_UNSET_4711}\n",
            ),
            "gw.yaml: bindings.time.authorization.bearer: found ${MCPYARD_TEST_SURELY_UNSET_4711}, \
             expected the environment variable MCPYARD_TEST_SURELY_UNSET_4711 to be set",
        ),
        (
            "unknown authorization key",
            edit(
                "    server: http://127.0.0.1:3002/mcp\n",
                "    server: http://127.0.0.1:3002/mcp\n    authorization: { token: abc }\n",
            ),
            "gw.yaml: bindings.time.authorization.token: unknown key, expected bearer",
        ),
        (
            "bad authorization word",
            edit(
                "    server: http://127.0.0.1:3002/mcp\n",
                "    server: http://127.0.0.1:3002/mcp\n    authorization: forwrd\n",
            ),
            "gw.yaml: bindings.time.authorization: found \"forwrd\", expected forward or a mapping { bearer: TOKEN }",
        ),
        (
            "yaml syntax error",
            "bindings:\n  north:\n    kind: server\n   listen: 127.0.0.1:7114\n".to_owned(),
            "gw.yaml: line 4 column 4: invalid YAML: did not find expected key, while parsing a block mapping at line 2 column 3",
        ),
        (
            "empty bindings",
            "bindings: {}\n".to_owned(),
            "gw.yaml: bindings: found an empty mapping, expected at least one binding with kind: server",
        ),
        (
            "no bindings",
            "runtime: { workers: 1 }\n".to_owned(),
            "gw.yaml: bindings: missing, expected a mapping of binding names to bindings, with at least one server",
        ),
        (
            "empty file",
            String::new(),
            "gw.yaml: bindings: missing, expected a mapping of binding names to bindings, with at least one server",
        ),
        (
            "file that is not a mapping",
            "- a\n- b\n".to_owned(),
            "gw.yaml: found a list, expected a mapping",
        ),
        (
            "no server binding",
            "bindings:\n  demo: { kind: demo }\n".to_owned(),
            "gw.yaml: bindings: found no server binding, expected at least one binding with kind: server",
        ),
        (
            "duplicate toolkit",
            edit("      - toolkit: time", "      - toolkit: github"),
            "gw.yaml: bindings.tools.routes[1].toolkit: found \"github\", expected a toolkit name not already used by routes[0]",
        ),
        (
            "toolkit with the prefix separator",
            edit("      - toolkit: time", "      - toolkit: my__time"),
            "gw.yaml: bindings.tools.routes[1].toolkit: found \"my__time\", expected a toolkit name without __ (it separates toolkit and tool)",
        ),
        (
            "toolkit ending with _",
            edit("      - toolkit: time", "      - toolkit: time_"),
            "gw.yaml: bindings.tools.routes[1].toolkit: found \"time_\", expected a toolkit name that does not end with _ (it would run into the __ separator)",
        ),
        (
            "toolkit with a dot",
            edit("      - toolkit: time", "      - toolkit: time.v2"),
            "gw.yaml: bindings.tools.routes[1].toolkit: found \"time.v2\", expected a name of 1 to 64 letters, digits, _ or -",
        ),
        (
            "toolkit as a number",
            edit("      - toolkit: time", "      - toolkit: 42"),
            "gw.yaml: bindings.tools.routes[1].toolkit: found 42, expected a name of 1 to 64 letters, digits, _ or -",
        ),
        (
            "toolkit over 64 characters",
            edit(
                "      - toolkit: time",
                &format!("      - toolkit: {}", "t".repeat(65)),
            ),
            "gw.yaml: bindings.tools.routes[1].toolkit: found \"ttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttttt\", \
             expected a name of 1 to 64 letters, digits, _ or -",
        ),
        (
            "route without toolkit among several",
            edit(
                "      - toolkit: time\n        exit: time",
                "      - exit: time",
            ),
            "gw.yaml: bindings.tools.routes[1].toolkit: missing, expected a toolkit name such as github \
             (required when a proxy has more than one route)",
        ),
        (
            "first route without toolkit among several",
            edit("      - toolkit: github\n", "      - toolkit: ~\n"),
            "gw.yaml: bindings.tools.routes[0].toolkit: missing, expected a toolkit name such as github \
             (required when a proxy has more than one route)",
        ),
        (
            "toolkits whose event codes collide",
            with_routes(
                "      - toolkit: github\n        exit: github\n      - toolkit: t1371838\n        exit: time\n\
                 \x20     - toolkit: t2000402\n        exit: time\n",
            ),
            "gw.yaml: bindings.tools.routes[2].toolkit: found \"t2000402\", expected a toolkit name whose event-id code \
             differs from that of \"t1371838\" in routes[1] (both are Ptjpsw, a CRC32C collision)",
        ),
        (
            "empty allow-list value",
            with_github_route("        tools:\n"),
            "gw.yaml: bindings.tools.routes[0].tools: found nothing, expected a list of tool name globs such as \
             [\"search_*\"] (leave the key out to admit every tool, or write [] to admit none)",
        ),
        (
            "null allow-list value",
            with_github_route("        resources: ~\n"),
            "gw.yaml: bindings.tools.routes[0].resources: found nothing, expected a list of resource URI globs such as \
             [\"file:///docs/*\"] (leave the key out to admit every resource, or write [] to admit none)",
        ),
        (
            "allow-list as a mapping",
            with_github_route("        prompts: { greet: yes }\n"),
            "gw.yaml: bindings.tools.routes[0].prompts: found a mapping, expected a list of prompt name globs such as [\"review_*\"]",
        ),
        (
            "allow-list as a number",
            with_github_route("        tools: 5\n"),
            "gw.yaml: bindings.tools.routes[0].tools: found 5, expected a list of tool name globs such as [\"search_*\"]",
        ),
        (
            "allow-list entry that is not a string",
            with_github_route("        prompts: [greet, 5]\n"),
            "gw.yaml: bindings.tools.routes[0].prompts[1]: found 5, expected a prompt name glob such as \"review_*\"",
        ),
        (
            "allow-list entry that is a list",
            with_github_route("        tools: [[search_*]]\n"),
            "gw.yaml: bindings.tools.routes[0].tools[0]: found a list, expected a tool name glob such as \"search_*\"",
        ),
        (
            "allow-list entry left empty",
            with_github_route("        tools:\n          - search_*\n          -\n"),
            "gw.yaml: bindings.tools.routes[0].tools[1]: found nothing, expected a tool name glob such as \"search_*\"",
        ),
        (
            "empty glob",
            with_github_route("        tools: [\"search_*\", \"\"]\n"),
            "gw.yaml: bindings.tools.routes[0].tools[1]: found \"\", expected a non-empty tool name glob such as \"search_*\"",
        ),
        (
            "empty glob as a bare string",
            with_github_route("        tools: \"\"\n"),
            "gw.yaml: bindings.tools.routes[0].tools: found \"\", expected a non-empty tool name glob such as \"search_*\"",
        ),
        (
            "glob with a control character",
            with_github_route("        resources: [\"file:///a\\tb\"]\n"),
            "gw.yaml: bindings.tools.routes[0].resources[0]: found \"file:///a\\tb\", expected a resource URI glob without control characters",
        ),
        (
            "tool glob with ?",
            with_github_route("        tools: [\"get_?\"]\n"),
            "gw.yaml: bindings.tools.routes[0].tools[0]: found \"get_?\", expected a tool name glob in which * is the only wildcard (?, [ and \\ are not allowed)",
        ),
        (
            "prompt glob with a character class",
            with_github_route("        prompts: \"greet_[ab]\"\n"),
            "gw.yaml: bindings.tools.routes[0].prompts: found \"greet_[ab]\", expected a prompt name glob in which * is the only wildcard (?, [ and \\ are not allowed)",
        ),
        (
            "tool glob with an escape",
            with_github_route("        tools: ['get\\*']\n"),
            "gw.yaml: bindings.tools.routes[0].tools[0]: found \"get\\\\*\", expected a tool name glob in which * is the only wildcard (?, [ and \\ are not allowed)",
        ),
        (
            "empty routes",
            edit(
                "    routes:\n      - toolkit: github\n        exit: github\n      - toolkit: time\n        exit: time\n",
                "    routes: []\n",
            ),
            "gw.yaml: bindings.tools.routes: found an empty list, expected at least one route",
        ),
        (
            "cache store missing",
            edit("{ store: cache0 }", "{ store: cache1 }"),
            "gw.yaml: bindings.tools.cache.store: found \"cache1\", expected the name of a store (one of: cache0)",
        ),
        (
            "sessions in a memory store",
            edit(
                "    exit: tools\n",
                "    exit: tools\n    sessions: { store: cache0 }\n",
            ),
            "gw.yaml: bindings.north.sessions.store: found \"cache0\", a memory store, expected a redis store \
             (a memory store is one process's, whose workers share sessions already)",
        ),
        (
            "sessions in no store",
            edit(
                "    exit: tools\n",
                "    exit: tools\n    sessions: { store: elsewhere }\n",
            ),
            "gw.yaml: bindings.north.sessions.store: found \"elsewhere\", expected the name of a store (one of: cache0)",
        ),
        (
            "sessions with an unknown key",
            edit(
                "    exit: tools\n",
                "    exit: tools\n    sessions: { store: cache0, ttl: 5m }\n",
            ),
            "gw.yaml: bindings.north.sessions.ttl: unknown key, expected store",
        ),
        (
            "unknown store type",
            edit("{ type: memory }", "{ type: etcd }"),
            "gw.yaml: stores.cache0.type: found \"etcd\", expected one of: memory, redis",
        ),
        (
            "redis store without a url",
            edit("{ type: memory }", "{ type: redis }"),
            "gw.yaml: stores.cache0.url: missing, expected a redis:// or rediss:// URL such as redis://127.0.0.1:6379/0",
        ),
        (
            "redis url with a bad scheme",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"http://127.0.0.1:6379\" }",
            ),
            "gw.yaml: stores.cache0.url: found \"http://127.0.0.1:6379\", expected a redis:// or rediss:// URL such as redis://127.0.0.1:6379/0",
        ),
        (
            "redis url with CR/LF",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"redis://h\\r\\nFLUSHALL/0\" }",
            ),
            "gw.yaml: stores.cache0.url: found \"redis://h\\r\\nFLUSHALL/0\", expected a redis:// or rediss:// URL such as redis://127.0.0.1:6379/0 of visible ASCII characters (percent-encode the rest)",
        ),
        (
            "redis url with a bad db index",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"redis://:pw@h/70000\" }",
            ),
            "gw.yaml: stores.cache0.url: found \"redis://***@h/70000\", expected a redis:// or rediss:// URL such as redis://127.0.0.1:6379/0 whose path is a database index from 0 to 65535",
        ),
        (
            "redis url not a string",
            edit("{ type: memory }", "{ type: redis, url: 6379 }"),
            "gw.yaml: stores.cache0.url: found 6379, expected a redis:// or rediss:// URL",
        ),
        (
            "redis password in two places",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"redis://:pw@h\", password_env: HOME }",
            ),
            "gw.yaml: stores.cache0.password_env: found a password in the url too, expected the password in one place",
        ),
        (
            "redis password variable unset",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"redis://h\", password_env: MCPYARD_TEST_SURELY_UNSET_1c9 }",
            ),
            "gw.yaml: stores.cache0.password_env: found MCPYARD_TEST_SURELY_UNSET_1c9, expected the environment variable MCPYARD_TEST_SURELY_UNSET_1c9 to be set",
        ),
        (
            "redis password variable badly named",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"redis://h\", password_env: \"A-B\" }",
            ),
            "gw.yaml: stores.cache0.password_env: found \"A-B\", expected the name of an environment variable (letters, digits and _)",
        ),
        (
            "redis prefix with a space",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"redis://h\", prefix: \"a b\" }",
            ),
            "gw.yaml: stores.cache0.prefix: found \"a b\", expected 1 to 64 visible ASCII characters such as mcpyard:",
        ),
        (
            "memory store with a url",
            edit("{ type: memory }", "{ type: memory, url: \"redis://h\" }"),
            "gw.yaml: stores.cache0.url: unknown key for a memory store, expected only type (url, password_env, prefix and tls are for type: redis)",
        ),
        (
            "memory store with tls",
            edit("{ type: memory }", "{ type: memory, tls: { ca: ca.pem } }"),
            "gw.yaml: stores.cache0.tls: unknown key for a memory store, expected only type (url, password_env, prefix and tls are for type: redis)",
        ),
        (
            "redis tls on a plain url",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"redis://h\", tls: { ca: ca.pem } }",
            ),
            "gw.yaml: stores.cache0.tls: found tls on a redis:// URL, expected a rediss:// URL for it to apply",
        ),
        (
            "redis tls ca that cannot be read",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"rediss://h\", tls: { ca: surely-missing-ca.pem } }",
            ),
            "gw.yaml: stores.cache0.tls.ca: surely-missing-ca.pem: cannot read: No such file or directory (os error 2)",
        ),
        (
            "redis tls cert without its key",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"rediss://h\", tls: { cert: client.pem } }",
            ),
            "gw.yaml: stores.cache0.tls.key: missing, expected the client certificate's PEM private key beside tls.cert",
        ),
        (
            "redis tls with an empty ca path",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"rediss://h\", tls: { ca: \"\" } }",
            ),
            "gw.yaml: stores.cache0.tls.ca: found an empty path, expected the path of a PEM file",
        ),
        (
            "redis tls key without its cert",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"rediss://h\", tls: { key: client.key } }",
            ),
            "gw.yaml: stores.cache0.tls.cert: missing, expected the PEM client certificate chain that goes with tls.key",
        ),
        (
            "redis tls with an unknown key",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"rediss://h\", tls: { cafile: ca.pem } }",
            ),
            "gw.yaml: stores.cache0.tls.cafile: unknown key, expected one of: cert, key, ca",
        ),
        (
            "unknown store key",
            edit(
                "{ type: memory }",
                "{ type: redis, url: \"redis://h\", pasword: x }",
            ),
            "gw.yaml: stores.cache0.pasword: unknown key, expected one of: type, url, password_env, prefix, tls",
        ),
        (
            "unknown kind",
            edit(
                "    kind: client\n    server: http://127.0.0.1:3002",
                "    kind: upstream\n    server: http://127.0.0.1:3002",
            ),
            "gw.yaml: bindings.time.kind: found \"upstream\", expected one of: server, proxy, client, demo",
        ),
        (
            "bad binding name",
            format!("{BASE}  \"no spaces\": {{ kind: demo }}\n"),
            "gw.yaml: bindings: found binding name \"no spaces\", expected a name of 1 to 64 letters, digits, _ or -",
        ),
        (
            "bad path",
            edit("    exit: tools", "    exit: tools\n    path: mcp?x"),
            "gw.yaml: bindings.north.path: found \"mcp?x\", expected a path that starts with / and has only visible ASCII characters and no ? or #",
        ),
        (
            "bad origin in a list",
            edit(
                "    exit: tools",
                "    exit: tools\n    origins: [http://localhost:6274, localhost]",
            ),
            "gw.yaml: bindings.north.origins[1]: found \"localhost\", expected an origin such as http://localhost:6274 (scheme, host and optional port)",
        ),
        (
            "routes not a list",
            edit(
                "    routes:\n      - toolkit: github\n        exit: github\n      - toolkit: time\n        exit: time\n",
                "    routes: github\n",
            ),
            "gw.yaml: bindings.tools.routes: found \"github\", expected a list",
        ),
        (
            "two servers on one address",
            format!(
                "{BASE}  south:\n    kind: server\n    listen: 127.0.0.1:7114\n    exit: tools\n"
            ),
            "gw.yaml: bindings.south.listen: found 127.0.0.1:7114, expected an address not already used by bindings.north.listen",
        ),
        (
            "metrics on a server's address",
            format!("{BASE}telemetry:\n  metrics: 127.0.0.1:7114\n"),
            "gw.yaml: telemetry.metrics: found 127.0.0.1:7114, expected an address not already used by bindings.north.listen",
        ),
    ];
    let mut failures = Vec::new();
    for (name, text, want) in &table {
        match load_str(text, "gw.yaml") {
            Ok(_) => failures.push(format!("{name}: loaded, expected {want}")),
            Err(e) if e.to_string() != *want => {
                failures.push(format!("{name}:\n   got: {e}\n  want: {want}"));
            }
            Err(_) => {}
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn base_config_loads_with_defaults() {
    let config = load_ok(BASE);
    assert_eq!(config.source, "gw.yaml");
    assert_eq!(
        config.runtime,
        Runtime {
            workers: 0,
            io: IoMode::Auto
        }
    );
    assert_eq!(config.telemetry.metrics, None);
    let servers: Vec<_> = config.servers().collect();
    assert_eq!(servers.len(), 1);
    let (name, server) = servers[0];
    assert_eq!(name, "north");
    assert_eq!(server.listen, SocketAddr::from(([127, 0, 0, 1], 7114)));
    assert_eq!(server.path, "/mcp");
    assert_eq!(server.exit, "tools");
    assert_eq!(server.origins, None);
    assert_eq!(server.hosts, None);
    assert_eq!(
        server.session_timeout,
        crate::limits::SESSION_IDLE_TIMEOUT_MAX
    );
    assert_eq!(
        server.request_timeout,
        crate::limits::REQUEST_TIMEOUT_DEFAULT
    );
    match config.bindings.get("tools") {
        Some(Binding::Proxy(proxy)) => {
            let cache = Cache {
                store: "cache0".to_owned(),
                ttl: Duration::from_secs(300),
                authorization: None,
            };
            assert_eq!(proxy.cache, Some(cache));
            let toolkits: Vec<_> = proxy
                .routes
                .iter()
                .map(|r| (r.toolkit.as_deref(), r.exit.as_str()))
                .collect();
            assert_eq!(
                toolkits,
                [(Some("github"), "github"), (Some("time"), "time")]
            );
        }
        other => panic!("tools is not a proxy: {other:?}"),
    }
    let github = client(&config, "github");
    assert_eq!(github.authorization, None);
    assert_eq!(github.connect_timeout, Duration::from_secs(5));
    assert_eq!(github.response_timeout, Duration::from_secs(60));
    assert_eq!(config.stores.get("cache0"), Some(&Store::Memory));
}

#[test]
fn ipv6_upstream_is_accepted_with_bracketed_authority() {
    let config = load_ok(&with_time_url("http://[::1]:8080/mcp"));
    let url = &client(&config, "time").server;
    assert_eq!(url.scheme, Scheme::Http);
    assert_eq!(url.host, "::1");
    assert_eq!(url.port, 8080);
    assert_eq!(url.authority, "[::1]:8080");
    assert_eq!(url.path_and_query, "/mcp");
}

#[test]
fn default_ports_are_filled_in_and_left_out_of_the_authority() {
    let table = [
        (
            "http://time.example.com/mcp?v=2",
            Scheme::Http,
            80,
            "time.example.com",
            "/mcp?v=2",
        ),
        (
            "https://time.example.com",
            Scheme::Https,
            443,
            "time.example.com",
            "/",
        ),
        (
            "https://time.example.com:8443/x",
            Scheme::Https,
            8443,
            "time.example.com:8443",
            "/x",
        ),
    ];
    for (text, scheme, port, authority, path_and_query) in table {
        let config = load_ok(&with_time_url(text));
        let url = &client(&config, "time").server;
        assert_eq!(url.scheme, scheme, "{text}");
        assert_eq!(url.port, port, "{text}");
        assert_eq!(url.authority, authority, "{text}");
        assert_eq!(url.path_and_query, path_and_query, "{text}");
    }
}

#[test]
fn bearer_variables_are_replaced_from_the_environment() {
    // SAFETY: the name is unique to this test, so no other thread reads or writes it.
    unsafe { std::env::set_var("MCPYARD_TEST_BEARER_1b7e", "s3cr3t-token") };
    let text = edit(
        "    server: http://127.0.0.1:3002/mcp\n",
        "    server: http://127.0.0.1:3002/mcp\n    authorization: { bearer: \"tok-${MCPYARD_TEST_BEARER_1b7e}\" }\n",
    );
    let config = load_ok(&text);
    match &client(&config, "time").authorization {
        Some(ClientAuth::Bearer(secret)) => assert_eq!(secret.expose(), "tok-s3cr3t-token"),
        other => panic!("expected a bearer credential, got {other:?}"),
    }
    let forward = edit(
        "    server: http://127.0.0.1:3002/mcp\n",
        "    server: http://127.0.0.1:3002/mcp\n    authorization: forward\n",
    );
    assert_eq!(
        client(&load_ok(&forward), "time").authorization,
        Some(ClientAuth::Forward)
    );
}

#[test]
fn secrets_never_print() {
    let secret = Secret::new("hunter2".to_owned());
    let auth = ClientAuth::Bearer(secret.clone());
    assert_eq!(format!("{secret:?}"), "Secret(**redacted**)");
    assert!(!format!("{auth:?}").contains("hunter2"));
    assert!(!format!("{auth:#?}").contains("hunter2"));
    // A literal token that is refused is not echoed either.
    let text = edit(
        "    server: http://127.0.0.1:3002/mcp\n",
        "    server: http://127.0.0.1:3002/mcp\n    authorization: { bearer: \"hunter2 x\" }\n",
    );
    let e = load_err(&text);
    assert!(!e.contains("hunter2"), "{e}");
    assert_eq!(
        e,
        "gw.yaml: bindings.time.authorization.bearer: found a token with spaces or non-ASCII characters, \
         expected a bearer token of visible ASCII characters"
    );
}

#[test]
fn server_options_parse() {
    let text = edit(
        "    exit: tools",
        "    exit: github\n    path: /v1/mcp\n    origins: [HTTP://LocalHost:6274, https://app.example.com:443]\n    \
         hosts: [MCP.example.com, \"[::1]\"]\n    session_timeout: 10m\n    request_timeout: 100ms",
    );
    let config = load_ok(&text);
    let (_, server) = config
        .servers()
        .next()
        .unwrap_or_else(|| panic!("no server"));
    assert_eq!(server.exit, "github");
    assert_eq!(server.path, "/v1/mcp");
    let origins = [
        "http://localhost:6274".to_owned(),
        "https://app.example.com".to_owned(),
    ];
    assert_eq!(server.origins.as_deref(), Some(&origins[..]));
    let hosts = ["mcp.example.com".to_owned(), "[::1]".to_owned()];
    assert_eq!(server.hosts.as_deref(), Some(&hosts[..]));
    assert_eq!(server.session_timeout, Duration::from_secs(600));
    assert_eq!(server.request_timeout, Duration::from_millis(100));
}

#[test]
fn servers_on_port_zero_never_conflict() {
    let text = format!(
        "{}  south:\n    kind: server\n    listen: 127.0.0.1:0\n    exit: tools\n",
        edit("127.0.0.1:7114", "127.0.0.1:0")
    );
    assert_eq!(load_ok(&text).servers().count(), 2);
}

#[test]
fn unreachable_bindings_are_allowed() {
    let text = format!("{BASE}  spare:\n    kind: demo\n    progress_interval: 50ms\n");
    match load_ok(&text).bindings.get("spare") {
        Some(Binding::Demo(demo)) => assert_eq!(demo.progress_interval, Duration::from_millis(50)),
        other => panic!("spare is not a demo: {other:?}"),
    }
}

#[test]
fn shipped_example_files_load() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let quickstart = match load(&root.join("config/quickstart.yaml")) {
        Ok(config) => config,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        quickstart.runtime,
        Runtime {
            workers: 0,
            io: IoMode::Auto
        }
    );
    assert_eq!(
        quickstart.telemetry.metrics,
        Some(SocketAddr::from(([127, 0, 0, 1], 9464)))
    );
    let servers: Vec<_> = quickstart.servers().collect();
    assert_eq!(servers.len(), 1);
    let (_, north) = servers[0];
    assert_eq!(north.listen, SocketAddr::from(([127, 0, 0, 1], 7114)));
    assert_eq!(north.path, "/mcp");
    assert!(matches!(
        quickstart.bindings.get(&north.exit),
        Some(Binding::Demo(_))
    ));

    let cluster = match load(&root.join("config/cluster-example.yaml")) {
        Ok(config) => config,
        Err(e) => panic!("{e}"),
    };
    let Some(Store::Redis(shared)) = cluster.stores.get("shared") else {
        panic!("{:?}", cluster.stores)
    };
    assert_eq!(shared.url.shown, "redis://127.0.0.1:6379/0");
    assert_eq!(
        proxy(&cluster, "tools").cache.as_ref().map(|c| &*c.store),
        Some("shared")
    );
    let Some(Binding::Server(north)) = cluster.bindings.get("north") else {
        panic!("no server north")
    };
    assert_eq!(north.sessions_store.as_deref(), Some("shared"));

    let auth = match load(&root.join("config/auth-example.yaml")) {
        Ok(config) => config,
        Err(e) => panic!("{e}"),
    };
    let Some(Binding::Server(north)) = auth.bindings.get("north") else {
        panic!("no server north")
    };
    let checked = north.auth.as_ref().expect("auth");
    assert_eq!(checked.jwt.audiences, ["https://mcp.example.com/mcp"]);
    assert_eq!(checked.rules.len(), 3);
    assert_eq!(checked.limits.len(), 2);
    assert_eq!(checked.limits[1].per, "tenant");

    let example = match load(&root.join("config/proxy-example.yaml")) {
        Ok(config) => config,
        Err(e) => panic!("{e}"),
    };
    let kinds: Vec<_> = example
        .bindings
        .iter()
        .map(|(n, b)| (n.as_str(), b.kind()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("github", "client"),
            ("north", "server"),
            ("time", "client"),
            ("tools", "proxy")
        ]
    );
    let routes: Vec<_> = proxy(&example, "tools")
        .routes
        .iter()
        .map(|r| {
            let admits_all = r.tools.is_none() && r.prompts.is_none() && r.resources.is_none();
            (r.toolkit.as_deref(), r.event_prefix.as_deref(), admits_all)
        })
        .collect();
    assert_eq!(
        routes,
        [
            (Some("github"), Some("G"), false),
            (Some("time"), Some("C"), true)
        ]
    );
    let github = proxy(&example, "tools")
        .routes
        .first()
        .and_then(|r| r.tools.as_ref());
    assert!(github.is_some_and(|t| t.admits("search_code") && !t.admits("delete_repo")));
}

#[test]
fn unreadable_file_names_the_file() {
    let e = match load(std::path::Path::new("/nonexistent/mcpyard.yaml")) {
        Ok(_) => panic!("loaded a missing file"),
        Err(e) => e,
    };
    assert_eq!(e.file(), "/nonexistent/mcpyard.yaml");
    assert_eq!(e.path(), "");
    assert!(
        e.to_string()
            .starts_with("/nonexistent/mcpyard.yaml: cannot read the file: "),
        "{e}"
    );
}

#[test]
fn routes_parse_allow_lists_and_event_prefixes() {
    let text = with_routes(
        "      - toolkit: github\n        exit: github\n        tools: [\"search_*\", \"get_*\"]\n\
         \x20       prompts: greet\n        resources: [\"file:///docs/*\", \"http://[::1]/x?y=*\"]\n\
         \x20     - toolkit: time\n        exit: time\n        tools: []\n",
    );
    let config = load_ok(&text);
    let routes = &proxy(&config, "tools").routes;
    let github = Route {
        toolkit: Some("github".to_owned()),
        exit: "github".to_owned(),
        tools: Some(globs(&["search_*", "get_*"])),
        // A bare string is a one-element list.
        prompts: Some(globs(&["greet"])),
        // `?` and `[` are literal in resource globs.
        resources: Some(globs(&["file:///docs/*", "http://[::1]/x?y=*"])),
        // github → GSU2lg, time → CQTPeA: one character tells them apart.
        event_prefix: Some("G".to_owned()),
    };
    let time = Route {
        toolkit: Some("time".to_owned()),
        exit: "time".to_owned(),
        tools: Some(globs(&[])),
        prompts: None,
        resources: None,
        event_prefix: Some("C".to_owned()),
    };
    assert_eq!(routes, &[github, time]);
    let [github, time] = &routes[..] else {
        panic!("expected two routes");
    };
    let admits =
        |list: &Option<AllowList>, name: &str| list.as_ref().is_none_or(|l| l.admits(name));
    assert!(admits(&github.tools, "search_code"));
    assert!(!admits(&github.tools, "create_issue"));
    assert!(admits(&github.resources, "file:///docs/readme.md"));
    assert!(!admits(&github.resources, "file:///etc/passwd"));
    assert!(!admits(&time.tools, "now"));
    assert!(admits(&time.prompts, "anything"));
}

#[test]
fn event_prefixes_share_the_shortest_unique_length() {
    // slack → kCs95w and files → kbzQUA share their first character, so every route of
    // this proxy gets two characters.
    let text = with_routes(
        "      - toolkit: slack\n        exit: github\n      - toolkit: files\n        exit: time\n\
         \x20     - toolkit: time\n        exit: time\n",
    );
    let config = load_ok(&text);
    let prefixes: Vec<_> = proxy(&config, "tools")
        .routes
        .iter()
        .map(|r| r.event_prefix.as_deref())
        .collect();
    assert_eq!(prefixes, [Some("kC"), Some("kb"), Some("CQ")]);
}

#[test]
fn a_single_route_needs_no_toolkit_and_gets_no_event_prefix() {
    let config = load_ok(&with_routes("      - exit: github\n"));
    let bare = Route {
        toolkit: None,
        exit: "github".to_owned(),
        tools: None,
        prompts: None,
        resources: None,
        event_prefix: None,
    };
    assert_eq!(proxy(&config, "tools").routes, std::slice::from_ref(&bare));
    let config = load_ok(&with_routes(
        "      - toolkit: github\n        exit: github\n",
    ));
    let named = Route {
        toolkit: Some("github".to_owned()),
        ..bare
    };
    assert_eq!(proxy(&config, "tools").routes, [named]);
}

#[test]
fn allow_lists_are_capped_in_entries_and_bytes() {
    let list = |n: usize| {
        let entries: Vec<String> = (0..n).map(|i| format!("\"t{i}_*\"")).collect();
        with_github_route(&format!("        tools: [{}]\n", entries.join(", ")))
    };
    let config = load_ok(&list(ALLOW_LIST_GLOBS_MAX));
    let tools = proxy(&config, "tools").routes[0].tools.as_ref();
    assert_eq!(tools.map(|t| t.globs().len()), Some(ALLOW_LIST_GLOBS_MAX));
    assert_eq!(
        load_err(&list(ALLOW_LIST_GLOBS_MAX + 1)),
        "gw.yaml: bindings.tools.routes[0].tools: found a list of more than 256 globs, expected at most 256"
    );

    let uri = |len: usize| format!("file:///{}", "d".repeat(len - "file:///".len()));
    let glob = |text: &str| with_github_route(&format!("        resources: [\"{text}\"]\n"));
    let config = load_ok(&glob(&uri(GLOB_BYTES_MAX)));
    let resources = proxy(&config, "tools").routes[0].resources.as_ref();
    assert_eq!(
        resources.map(|r| r.globs()[0].as_str().len()),
        Some(GLOB_BYTES_MAX)
    );
    // The found value is cut at limits::LOG_FIELD_BYTES_MAX (128 bytes) in the message.
    let shown = &uri(GLOB_BYTES_MAX + 1)[..crate::limits::LOG_FIELD_BYTES_MAX];
    assert_eq!(
        load_err(&glob(&uri(GLOB_BYTES_MAX + 1))),
        format!(
            "gw.yaml: bindings.tools.routes[0].resources[0]: found \"{shown}\"…, \
             expected a resource URI glob of at most 1024 bytes"
        )
    );
}

#[test]
fn routes_are_capped() {
    let routes = |n: usize| {
        let lines: Vec<String> = (0..n)
            .map(|i| format!("      - toolkit: t{i}\n        exit: github\n"))
            .collect();
        with_routes(&lines.concat())
    };
    let config = load_ok(&routes(crate::limits::PROXY_ROUTES_MAX));
    assert_eq!(
        proxy(&config, "tools").routes.len(),
        crate::limits::PROXY_ROUTES_MAX
    );
    assert_eq!(
        load_err(&routes(crate::limits::PROXY_ROUTES_MAX + 1)),
        "gw.yaml: bindings.tools.routes: found 65 routes, expected at most 64"
    );
}

#[test]
fn cache_credentials_are_bearer_tokens_only() {
    // SAFETY: tests run on threads of one process; this name is used by this test alone.
    unsafe { std::env::set_var("MCPYARD_TEST_HYDRATE_TOKEN", "t0k3n") };
    let config = load_ok(&edit(
        "    cache: { store: cache0 }",
        "    cache: { store: cache0, authorization: { bearer: \"${MCPYARD_TEST_HYDRATE_TOKEN}\" } }",
    ));
    let cache = proxy(&config, "tools").cache.clone().expect("a cache");
    assert_eq!(
        cache.authorization.as_ref().map(Secret::expose),
        Some("t0k3n")
    );
    assert!(!format!("{cache:?}").contains("t0k3n"), "never printed");
    assert_eq!(
        load_err(&edit(
            "    cache: { store: cache0 }",
            "    cache: { store: cache0, authorization: forward }",
        )),
        "gw.yaml: bindings.tools.cache.authorization: found forward, expected a mapping { bearer: TOKEN } \
         (hydration runs without an agent, so there is no header to forward)"
    );
}

#[test]
fn redis_stores_load_with_the_password_from_the_environment() {
    // SAFETY: tests in this binary that touch this variable are this one only.
    unsafe { std::env::set_var("MCPYARD_TEST_REDIS_PW_51a", "s3cr3t\"pw") };
    let text = edit(
        "{ type: memory }",
        "{ type: redis, url: \"rediss://app@cache.example.com:6380/2\", password_env: MCPYARD_TEST_REDIS_PW_51a }",
    );
    let config = load_ok(&text);
    let Some(Store::Redis(redis)) = config.stores.get("cache0") else {
        panic!("{:?}", config.stores)
    };
    assert_eq!(redis.prefix, "mcpyard:");
    let url = &redis.url;
    assert!(url.tls);
    assert_eq!(
        (&*url.host, url.port, url.db),
        ("cache.example.com", 6380, 2)
    );
    assert_eq!(url.username.as_deref(), Some("app"));
    assert_eq!(
        url.password.as_ref().map(Secret::expose),
        Some("s3cr3t\"pw")
    );
    assert_eq!(url.shown, "rediss://app@cache.example.com:6380/2");
    assert!(
        !format!("{config:?}").contains("s3cr3t"),
        "the password is never printed"
    );
    let text = edit(
        "{ type: memory }",
        "{ type: redis, url: \"redis://127.0.0.1\", prefix: \"team-a:\" }",
    );
    let Some(Store::Redis(redis)) = load_ok(&text).stores.get("cache0").cloned() else {
        panic!()
    };
    assert_eq!(redis.prefix, "team-a:");
    assert_eq!(redis.url.shown, "redis://127.0.0.1:6379/0");
}

/// `BASE` with `auth` (flow YAML) on the server.
fn with_auth(auth: &str) -> String {
    edit(
        "    exit: tools\n",
        &format!("    exit: tools\n    auth: {auth}\n"),
    )
}

#[test]
fn auth_is_checked_where_it_is_written() {
    const JWT: &str =
        "jwt: { issuer: \"https://login.example\", jwks: \"https://login.example/keys\"";
    let table: Vec<(String, &str)> = vec![
        (
            "{ scopes: [mcp] }".to_owned(),
            "gw.yaml: bindings.north.auth.jwt: missing, expected a mapping with issuer, jwks and audiences",
        ),
        (
            format!("{{ {JWT} }} }}"),
            "gw.yaml: bindings.north.auth.jwt.audiences: missing, expected the audiences a token's aud may name (needed when resource is not set)",
        ),
        (
            "{ jwt: { issuer: i, audiences: [a], jwks: \"http://login.example/keys\" } }"
                .to_owned(),
            "gw.yaml: bindings.north.auth.jwt.jwks: found \"http://login.example/keys\", expected an https:// URL (keys fetched in clear could be swapped on the way)",
        ),
        (
            format!("{{ {JWT}, audiences: [a] }}, rules: [{{ toolkit: nope }}] }}"),
            "gw.yaml: bindings.north.auth.rules[0].toolkit: found \"nope\", expected one of the proxy's toolkits (github, time)",
        ),
        (
            format!("{{ {JWT}, audiences: [a] }}, limits: [{{ name: x, rate: ten }}] }}"),
            "gw.yaml: bindings.north.auth.limits[0].rate: found \"ten\", expected a rate such as 10/s, 600/m or 1000/h (1 to 1000000 per unit)",
        ),
        (
            format!(
                "{{ {JWT}, audiences: [a] }}, limits: [{{ name: x, rate: 1/s }}, {{ name: x, rate: 2/s }}] }}"
            ),
            "gw.yaml: bindings.north.auth.limits[1].name: found \"x\" twice, expected unique limit names",
        ),
        (
            format!("{{ {JWT}, audiences: [a] }}, scopes: [\"a b\"] }}"),
            "gw.yaml: bindings.north.auth.scopes[0]: found \"a b\", expected a scope without spaces",
        ),
        (
            "{ jwt: { issuer: \"i\\\"\", audiences: [a], jwks: \"https://k.example/\" } }"
                .to_owned(),
            "gw.yaml: bindings.north.auth.jwt.issuer: found \"i\\\"\", expected 1 to 512 printable ASCII characters without \" or \\",
        ),
        (
            format!("{{ {JWT}, audiences: [a], groups_claim: realm.roles }} }}"),
            "gw.yaml: bindings.north.auth.jwt.groups_claim: found \"realm.roles\", expected a top-level claim name (letters, digits, _, - or :)",
        ),
        (
            format!("{{ {JWT}, audiences: [a], leeway: 10m }} }}"),
            "gw.yaml: bindings.north.auth.jwt.leeway: found 10m, expected at most 5m",
        ),
        // A rule's key present but empty is refused, not read as "no condition".
        (
            format!("{{ {JWT}, audiences: [a] }}, rules: [{{ tools: ~ }}, {{}}] }}"),
            "gw.yaml: bindings.north.auth.rules[0].tools: found nothing, expected a list of tool name globs such as [\"search_*\"] (leave the key out to admit every tool, or write [] to admit none)",
        ),
        (
            format!("{{ {JWT}, audiences: [a] }}, rules: [{{ toolkit: time, groups: [] }}] }}"),
            "gw.yaml: bindings.north.auth.rules[0].groups: found nothing, expected a list of one or more names (leave the key out for no condition)",
        ),
        (
            format!("{{ {JWT}, audiences: [a] }}, rules: [{{ toolkit: ~ }}, {{}}] }}"),
            "gw.yaml: bindings.north.auth.rules[0].toolkit: found nothing, expected a value (leave the key out for the default)",
        ),
        (
            format!("{{ {JWT}, audiences: [a] }}, limits: [{{ name: x, rate: 1/s, per: ~ }}] }}"),
            "gw.yaml: bindings.north.auth.limits[0].per: found nothing, expected a value (leave the key out for the default)",
        ),
        (
            format!("{{ {JWT}, audiences: [a] }}, rules: [{{ toolkit: time, scopes: ~ }}] }}"),
            "gw.yaml: bindings.north.auth.rules[0].scopes: found nothing, expected a list of one or more names (leave the key out for no condition)",
        ),
        (
            format!("{{ {JWT}, audiences: [a] }}, limits: [{{ name: x, rate: 1/s, tools: ~ }}] }}"),
            "gw.yaml: bindings.north.auth.limits[0].tools: found nothing, expected a list of tool name globs such as [\"search_*\"] (leave the key out to admit every tool, or write [] to admit none)",
        ),
    ];
    for (auth, want) in table {
        assert_eq!(load_err(&with_auth(&auth)), want, "auth: {auth}");
    }
    let config = load_ok(&with_auth(
        "{ resource: \"https://mcp.example/mcp\", jwt: { issuer: i, jwks: \"https://k.example/keys\" }, \
           rules: [{ toolkit: time, tools: [\"get_*\"], groups: [ops] }, {}], \
           limits: [{ name: calls, rate: 600/m }] }",
    ));
    let Some(Binding::Server(north)) = config.bindings.get("north") else {
        panic!("north is a server");
    };
    let auth = north.auth.as_ref().expect("auth");
    assert_eq!(auth.jwt.audiences, ["https://mcp.example/mcp"]);
    assert_eq!(auth.authorization_servers, ["i"]);
    assert_eq!(auth.jwt.algorithms, ["RS256", "ES256", "EdDSA"]);
    assert_eq!(auth.jwt.refresh, std::time::Duration::from_secs(300));
    assert_eq!(auth.rules.len(), 2);
    let limit = &auth.limits[0];
    assert_eq!(
        (limit.count, limit.period.as_secs(), limit.burst),
        (600, 60, 600)
    );
    assert_eq!(limit.per, "sub");
}
