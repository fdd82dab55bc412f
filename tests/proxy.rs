//! `server → proxy → client/demo`: many toolkits behind one endpoint, checked with raw
//! HTTP against the real binary in every runtime mode, in front of the fast Rust upstream
//! fixture (which refuses tool names it does not list, so a prefix left on a name fails)
//! and the embedded demo: merged lists in route order with exact item bytes, allow-lists,
//! every item kind routed with its prefix taken off, a route that is down left out of the
//! answer while the others work, a lone unnamed route as a plain gateway, and what is not
//! forwarded.

mod support;

use std::collections::HashMap;
use support::{
    Conn, Gateway, MODES, Mode, Upstream, initialize_body, open_events, request, scrape_until,
};

/// The fixture's first two tools, exactly as it writes them.
const ECHO: &str = r#"{"name":"echo","description":"Returns the fixture's payload","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}}"#;
const BIG: &str = r#"{"name":"big","description":"Returns the fixture's payload","inputSchema":{"type":"object","properties":{}}}"#;

/// A proxy `exit` with routes `a` (fixture `up_a`), `b` (fixture `up_b`, tools admitted:
/// `echo` only) and `demo`, plus any `extra` binding lines.
fn three_routes(a: &Upstream, b: &Upstream) -> String {
    format!(
        "  exit:\n    kind: proxy\n    routes:\n      \
         - {{toolkit: a, exit: up_a}}\n      \
         - {{toolkit: b, exit: up_b, tools: [echo]}}\n      \
         - {{toolkit: demo, exit: demo}}\n  \
         up_a: {}\n  up_b: {}\n  demo: {{kind: demo, progress_interval: 10ms}}\n",
        a.client_exit(", response_timeout: 3s"),
        b.client_exit(", response_timeout: 3s"),
    )
}

/// `name` with `prefix` spliced in front of its `"name"` value.
fn prefixed(item: &str, prefix: &str) -> String {
    item.replacen("{\"name\":\"", &format!("{{\"name\":\"{prefix}"), 1)
}

/// The `result` of a successful JSON-RPC answer (panics with the body otherwise).
fn result(r: &support::Response) -> serde_json::Value {
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert!(v.get("error").is_none(), "an error: {}", r.text());
    v["result"].clone()
}

fn names(list: &serde_json::Value, array: &str, key: &str) -> Vec<String> {
    list[array]
        .as_array()
        .unwrap_or_else(|| panic!("no {array}: {list}"))
        .iter()
        .map(|i| i[key].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[test]
fn lists_merge_every_route_in_order_with_prefixed_items() {
    let a = Upstream::start(&["--tools", "5", "--page-size", "2"]);
    let b = Upstream::start(&[]);
    for mode in MODES {
        let gw = Gateway::start_bindings(mode, &three_routes(&a, &b));
        let session = gw.initialize();
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":"l","method":"tools/list"}"#,
        );
        let text = r.text();
        // Route a's five tools came over three pages, b's list was cut to `echo` by its
        // allow-list, then the demo's tools: in route order, items byte for byte.
        let head = format!(
            r#"{{"jsonrpc":"2.0","id":"l","result":{{"tools":[{},{},"#,
            prefixed(ECHO, "a__"),
            prefixed(BIG, "a__")
        );
        assert!(text.starts_with(&head), "{mode:?}: {text}");
        assert!(
            text.contains(&format!(",{},", prefixed(ECHO, "b__"))),
            "{text}"
        );
        let tools = names(&result(&r), "tools", "name");
        let want_head = ["a__echo", "a__big", "a__tool_00003", "a__tool_00004"];
        assert_eq!(&tools[..4], want_head);
        assert_eq!(&tools[4..7], ["a__tool_00005", "b__echo", "demo__echo"]);
        assert!(tools.iter().all(|t| !t.starts_with("b__big")));
        assert!(tools.iter().filter(|t| t.starts_with("demo__")).count() >= 7);

        let prompts = result(&gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":2,"method":"prompts/list"}"#,
        ));
        assert_eq!(names(&prompts, "prompts", "name"), ["demo__greet"]);
        let resources = result(&gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":3,"method":"resources/list"}"#,
        ));
        assert_eq!(
            names(&resources, "resources", "uri"),
            [
                "demo+demo://readme",
                "demo+demo://config",
                "demo+demo://status"
            ]
        );
        let templates = result(&gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":4,"method":"resources/templates/list"}"#,
        ));
        assert_eq!(
            names(&templates, "resourceTemplates", "uriTemplate"),
            ["demo+demo://items/{id}"]
        );
        // No cursor was handed out, so none is accepted.
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"cursor":"x"}}"#,
        );
        assert_eq!(
            r.text(),
            r#"{"jsonrpc":"2.0","id":5,"error":{"code":-32602,"message":"Invalid cursor"}}"#
        );
    }
}

#[test]
fn item_requests_reach_their_route_without_the_prefix() {
    let a = Upstream::start(&["--tools", "5"]);
    let b = Upstream::start(&[]);
    for mode in MODES {
        let gw = Gateway::start_bindings(mode, &three_routes(&a, &b));
        let session = gw.initialize();
        let post = |body: &str| gw.post(Some(&session), body);
        // The fixture answers only names it lists: these reach it as `tool_00004`, `echo`.
        for body in [
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a__tool_00004","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"arguments":{"text":"a__echo"},"name":"b__echo"}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a\u005f_echo"}}"#,
        ] {
            let got = result(&post(body));
            assert!(got["content"][0]["text"].is_string(), "{body}: {got}");
        }
        let add = result(&post(
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"demo__add","arguments":{"a":2,"b":3}}}"#,
        ));
        assert_eq!(add["structuredContent"]["sum"], 5);
        let prompt = result(&post(
            r#"{"jsonrpc":"2.0","id":5,"method":"prompts/get","params":{"name":"demo__greet","arguments":{"name":"Ada"}}}"#,
        ));
        assert_eq!(prompt["description"], "A greeting for Ada");
        // resources/read: the uri goes up without the prefix and comes back with it.
        let read = post(
            r#"{"jsonrpc":"2.0","id":6,"method":"resources/read","params":{"uri":"demo+demo://items/7"}}"#,
        );
        assert_eq!(
            read.text(),
            r#"{"jsonrpc":"2.0","id":6,"result":{"contents":[{"uri":"demo+demo://items/7","mimeType":"text/plain","text":"item 7"}]}}"#
        );
        let done = result(&post(
            r#"{"jsonrpc":"2.0","id":7,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"demo__greet"},"argument":{"name":"style","value":"f"}}}"#,
        ));
        assert_eq!(done["completion"]["values"][0], "formal");
        let sub = result(&post(
            r#"{"jsonrpc":"2.0","id":8,"method":"resources/subscribe","params":{"uri":"demo+demo://status"}}"#,
        ));
        assert_eq!(sub, serde_json::json!({}));
        let level = result(&post(
            r#"{"jsonrpc":"2.0","id":9,"method":"logging/setLevel","params":{"level":"error"}}"#,
        ));
        assert_eq!(level, serde_json::json!({}));
    }
}

#[test]
fn what_no_route_admits_is_unknown() {
    let a = Upstream::start(&[]);
    let b = Upstream::start(&[]);
    let gw = Gateway::start_bindings(MODES[0], &three_routes(&a, &b));
    let session = gw.initialize();
    let cases = [
        // Hidden by b's allow-list: exactly as unknown as a made-up name.
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"b__big"}}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Unknown tool: b__big"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"zz__echo"}}"#,
            r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32602,"message":"Unknown tool: zz__echo"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a__"}}"#,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"Unknown tool: a__"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"prompts/get","params":{"name":"greet"}}"#,
            r#"{"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"Unknown prompt: greet"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"resources/read","params":{"uri":"demo://readme"}}"#,
            r#"{"jsonrpc":"2.0","id":5,"error":{"code":-32002,"message":"Resource not found"}}"#,
        ),
        // With several routes a method mcpyard does not know has nowhere to go.
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"tasks/list"}"#,
            r#"{"jsonrpc":"2.0","id":6,"error":{"code":-32601,"message":"Method not found"}}"#,
        ),
    ];
    for (body, want) in cases {
        let r = gw.post(Some(&session), body);
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), want, "{body}");
    }
}

#[test]
fn a_route_that_is_down_is_left_out_and_fails_clearly() {
    let a = Upstream::start(&[]);
    let mut b = Upstream::start(&[]);
    for mode in MODES {
        let gw = Gateway::start_bindings(mode, &three_routes(&a, &b));
        let session = gw.initialize();
        b.kill();
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        );
        let tools = names(&result(&r), "tools", "name");
        assert_eq!(&tools[..2], ["a__echo", "a__big"], "{mode:?}");
        assert!(tools.iter().all(|t| !t.starts_with("b__")), "{tools:?}");
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"b__echo"}}"#,
        );
        let v = r.json();
        assert_eq!(v["error"]["code"], -32603, "{}", r.text());
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("Upstream unreachable"), "{message}");
        // The other routes go on working.
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"a__echo"}}"#,
        );
        result(&r);
        // A new session starts without it (logged and counted).
        let session = gw.initialize();
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/list"}"#,
        );
        assert!(
            names(&result(&r), "tools", "name")
                .iter()
                .all(|t| !t.starts_with("b__"))
        );
        let text = scrape_until(&gw, "skipped routes", |t| {
            t.contains("mcpyard_proxy_routes_skipped_total 1\n")
        });
        assert!(
            text.contains("mcpyard_proxy_list_omitted_total 2\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "mcpyard_toolkit_requests_total{toolkit=\"b\",method=\"tools/call\",outcome=\"error\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("mcpyard_toolkit_seconds_count{toolkit=\"a\",method=\"tools/call\"} 1\n")
        );
        b = Upstream::start(&[]);
    }
}

#[test]
fn initialize_fails_only_when_no_route_answers() {
    let mut a = Upstream::start(&[]);
    let mut b = Upstream::start(&[]);
    let gw = Gateway::start_bindings(
        MODES[0],
        &format!(
            "  exit: {{kind: proxy, routes: [{{toolkit: a, exit: up_a}}, {{toolkit: b, exit: up_b}}]}}\n  \
             up_a: {}\n  up_b: {}\n",
            a.client_exit(""),
            b.client_exit("")
        ),
    );
    a.kill();
    b.kill();
    let r = gw.post(None, &initialize_body(1, "2025-11-25"));
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["error"]["code"], -32603, "{}", r.text());
    assert!(r.header("mcp-session-id").is_none());
}

#[test]
fn a_lone_route_without_a_toolkit_is_a_plain_gateway() {
    let up = Upstream::start(&["--tools", "3"]);
    for mode in [
        MODES[0],
        Mode {
            workers: 2,
            io: "epoll",
        },
    ] {
        let gw = Gateway::start_bindings(
            mode,
            &format!(
                "  exit: {{kind: proxy, routes: [{{exit: up}}]}}\n  up: {}\n",
                up.client_exit("")
            ),
        );
        let session = gw.initialize();
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        );
        let tools = names(&result(&r), "tools", "name");
        assert_eq!(tools, ["echo", "big", "tool_00003"]);
        assert!(r.text().contains(ECHO), "items unchanged: {}", r.text());
        result(&gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo"}}"#,
        ));
        // A method mcpyard does not know goes to the one route (and its answer comes back).
        let before = upstream_requests(&gw);
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":3,"method":"vendor/thing","params":{"x":1}}"#,
        );
        assert_eq!(
            r.text(),
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"Method not found"}}"#
        );
        assert_eq!(upstream_requests(&gw), before + 1, "it went upstream");
    }
}

/// A cached list far larger than the internal stream's credit window reaches the agent
/// in one answer with a length (the stored bytes sent whole, not a window at a time), and
/// its items are the live list's; with 2 workers most of the 8 requests (fresh
/// connections) land on the worker that does not own the session, so the answer crosses
/// workers. With a progress token the answer is an SSE stream, which takes the list a
/// window at a time into its one result event: the same items.
#[test]
fn a_cached_list_larger_than_the_window_is_answered_whole() {
    let up = Upstream::start(&["--tools", "3000"]);
    let route = |cache: &str| {
        format!(
            "  exit: {{kind: proxy{cache}, routes: [{{toolkit: a, exit: up}}]}}\n  up: {}\n\
             stores: {{c: {{type: memory}}}}\n",
            up.client_exit(", response_timeout: 5s")
        )
    };
    let list = r#"{"jsonrpc":"2.0","id":7,"method":"tools/list"}"#;
    for mode in MODES {
        let live = Gateway::start_bindings(mode, &route(""));
        let want = live.post(Some(&live.initialize()), list);
        let want_tools = result(&want)["tools"].clone();
        assert_eq!(want_tools.as_array().map(Vec::len), Some(3000), "{mode:?}");
        let gw = Gateway::start_bindings(mode, &route(", cache: {store: c, ttl: 5m}"));
        let session = gw.initialize();
        for _ in 0..8 {
            let r = gw.post(Some(&session), list);
            assert!(
                r.body.len() > 8 * 32 * 1024,
                "{mode:?}: {} bytes",
                r.body.len()
            );
            assert_eq!(
                r.header("content-length"),
                Some(r.body.len().to_string().as_str()),
                "{mode:?}: sent whole, with its length"
            );
            assert!(r.header("transfer-encoding").is_none(), "{mode:?}");
            assert_eq!(result(&r)["tools"], want_tools, "{mode:?}");
            assert_eq!(r.json()["id"], 7);
        }
        let progress = r#"{"jsonrpc":"2.0","id":8,"method":"tools/list","params":{"_meta":{"progressToken":"p"}}}"#;
        let (_, mut events) = open_events(&gw, &gw.post_bytes(Some(&session), &[], progress));
        let answer = loop {
            let event = events.expect();
            if !event.data.is_empty() {
                break event.json();
            }
        };
        assert_eq!(answer["id"], 8, "{mode:?}");
        assert_eq!(answer["result"]["tools"], want_tools, "{mode:?}: over SSE");
        assert!(events.next().is_none(), "{mode:?}: the stream ends");
        assert!(
            events.largest_chunk <= 2 * 32 * 1024,
            "{mode:?}: written a window at a time, not copied whole ({} bytes)",
            events.largest_chunk
        );
        let text = support::scrape(&gw);
        let hits = text
            .lines()
            .find_map(|l| l.strip_prefix("mcpyard_cache_hits_total "))
            .and_then(|v| v.parse::<u64>().ok());
        assert_eq!(hits, Some(9), "{mode:?}: served from the cache");
    }
}

/// An agent that asks for a large cached list and stops reading loses its connection at
/// the request deadline (the whole answer is one write, and a write that never ends must
/// not hold the connection and the stored bytes for ever): it reads part of the answer,
/// then the end of the connection, and the gateway serves others meanwhile.
#[test]
fn an_agent_that_stops_reading_a_large_answer_is_cut_off_at_the_deadline() {
    use std::io::{Read, Write};
    // About 13 MB: more than the kernel's send buffer and the agent's receive buffer hold.
    let up = Upstream::start(&["--tools", "40000", "--page-size", "2000"]);
    let bindings = format!(
        "  exit: {{kind: proxy, cache: {{store: c, ttl: 5m}}, routes: [{{toolkit: a, exit: up}}]}}\n  \
         up: {}\nstores: {{c: {{type: memory}}}}\n",
        up.client_exit(", response_timeout: 10s")
    );
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    for mode in MODES {
        let gw = Gateway::start_north(mode, ", request_timeout: 1s", &bindings);
        let session = gw.initialize();
        // `initialize` waits for the cache at most the request deadline: wait until the
        // list is served from it (whole, with a length) before the agents stall.
        let ready_by = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while gw
            .post(Some(&session), list)
            .header("content-length")
            .is_none()
        {
            assert!(
                std::time::Instant::now() < ready_by,
                "{mode:?}: the cache is hydrated"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let cuts_before = write_deadline_cuts(&gw);
        let cancelled_before = cancelled_lists(&gw);
        // Four agents, each on its own connection (with 2 workers some land on the worker
        // that does not own the session, and their answer crosses workers).
        let stalled: Vec<std::net::TcpStream> = (0..4)
            .map(|n| {
                // Each its own id: an id in flight on the session is refused.
                let list =
                    format!(r#"{{"jsonrpc":"2.0","id":"stalled-{n}","method":"tools/list"}}"#);
                let socket =
                    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                        .expect("socket");
                socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
                socket.connect(&gw.addr.into()).expect("connect");
                let mut stream: std::net::TcpStream = socket.into();
                stream
                    .write_all(&gw.post_bytes(Some(&session), &[], &list))
                    .expect("send");
                stream
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(2500));
        // Meanwhile the gateway serves others.
        gw.assert_serving();
        for mut stream in stalled {
            stream
                .set_read_timeout(Some(std::time::Duration::from_secs(10)))
                .expect("timeout");
            let mut got = Vec::new();
            let read = stream.read_to_end(&mut got);
            // The end of the connection: EOF, or a reset; not a read that timed out.
            assert!(
                !read.as_ref().is_err_and(|e| matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )),
                "{mode:?}: the connection ended: {read:?}"
            );
            let text = String::from_utf8_lossy(&got[..got.len().min(4096)]).to_lowercase();
            let length: usize = text
                .split("content-length: ")
                .nth(1)
                .and_then(|rest| rest.split("\r\n").next())
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("{mode:?}: a head with a length: {text:.200}"));
            assert!(length > 10_000_000, "{mode:?}: {length}");
            let body = got
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map_or(0, |at| got.len() - at - 4);
            assert!(
                body < length,
                "{mode:?}: cut off: {body} bytes of a {length}-byte body"
            );
        }
        assert_eq!(
            write_deadline_cuts(&gw) - cuts_before,
            4,
            "{mode:?}: each cut counted"
        );
        // No answer reached those agents: their requests count as cancelled. With two
        // workers, an answer handed to the connection's worker counts once the relay
        // there wrote it, or was cut.
        let cancelled = support::scrape_until(&gw, "four cancelled lists", |text| {
            support::requests_counted(text, "tools/list", "cancelled") >= cancelled_before + 4
        });
        let cancelled =
            support::requests_counted(&cancelled, "tools/list", "cancelled") - cancelled_before;
        assert_eq!(cancelled, 4, "{mode:?}: each cut request is cancelled");
    }
}

/// How many `tools/list` requests ended cancelled (`mcpyard_request_seconds`), now.
fn cancelled_lists(gw: &Gateway) -> u64 {
    support::requests_counted(&support::scrape(gw), "tools/list", "cancelled")
}

/// `mcpyard_write_deadline_cuts_total` now.
fn write_deadline_cuts(gw: &Gateway) -> u64 {
    support::scrape(gw)
        .lines()
        .find_map(|l| l.strip_prefix("mcpyard_write_deadline_cuts_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no write_deadline_cuts counter"))
}

/// `mcpyard_upstream_requests_total` now.
fn upstream_requests(gw: &Gateway) -> u64 {
    let text = support::scrape(gw);
    text.lines()
        .find_map(|l| l.strip_prefix("mcpyard_upstream_requests_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no upstream request counter: {text}"))
}

#[test]
fn list_changed_from_any_route_reaches_the_agent() {
    let a = Upstream::start(&[]);
    let b = Upstream::start(&[]);
    let gw = Gateway::start_bindings(MODES[0], &three_routes(&a, &b));
    let session = gw.initialize();
    let (head, mut events) = open_events(&gw, &gw.get_bytes(&session, &[]));
    assert_eq!(head.status, 200);
    let priming = events.expect();
    assert!(priming.id.as_deref().is_some_and(|id| id.starts_with("0.")));
    // The agent's GET is answered once every route answered the resume, so the fixture's
    // own GET stream is open by now: one trigger reaches it.
    let mut c = Conn::open(b.addr);
    c.send(&request(
        &b.addr.to_string(),
        "POST",
        "/control/list_changed",
        &[],
        b"",
    ));
    let told = c.read_response().json();
    assert_eq!(told["streams"], 1, "{told}");
    let mut seen: HashMap<String, usize> = HashMap::new();
    let r = gw.post(
        Some(&session),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"demo__add_tool","arguments":{"name":"extra"}}}"#,
    );
    result(&r);
    while seen.values().sum::<usize>() < 2 {
        let e = events.expect();
        let method = e.json()["method"].as_str().unwrap_or_default().to_owned();
        *seen.entry(method).or_default() += 1;
    }
    assert_eq!(
        seen.get("notifications/tools/list_changed"),
        Some(&2),
        "{seen:?}"
    );
    let r = gw.post(
        Some(&session),
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#,
    );
    assert!(names(&result(&r), "tools", "name").contains(&"demo__extra".to_owned()));
}

/// Events that come right behind the answer to the agent's GET are written on it. The
/// round waits for a route that cannot answer (a listener that never accepts), the demo
/// route's log event waits behind the round, and both reach the server in one go when
/// the round gives up on that route.
#[test]
fn an_event_right_behind_the_resume_answer_reaches_the_new_get_stream() {
    let a = Upstream::start(&[]);
    let hole = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let bindings = format!(
        "  exit:\n    kind: proxy\n    routes:\n      \
         - {{toolkit: a, exit: up_a}}\n      \
         - {{toolkit: b, exit: up_b}}\n      \
         - {{toolkit: demo, exit: demo}}\n  \
         up_a: {}\n  up_b: {{kind: client, server: \"http://{}/mcp\", response_timeout: 1s}}\n  \
         demo: {{kind: demo}}\n",
        a.client_exit(""),
        hole.local_addr().expect("addr"),
    );
    let gw = Gateway::start_bindings(MODES[0], &bindings);
    let session = gw.initialize();
    // Past the retry backoff of the route that failed, so the GET's resume tries it again.
    std::thread::sleep(std::time::Duration::from_millis(1300));
    let mut c = gw.conn();
    c.send(&gw.get_bytes(&session, &[]));
    let r = gw.post(
        Some(&session),
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"demo__log","arguments":{"level":"info","message":"behind"}}}"#,
    );
    result(&r);
    let head = c.read_head();
    assert_eq!(head.status, 200, "{head:?}");
    let mut events = c.into_events();
    let priming = events.expect();
    assert_eq!(priming.data, "", "{priming:?}");
    let e = events.expect();
    assert_eq!(e.json()["method"], "notifications/message", "{}", e.data);
    assert_eq!(e.json()["params"]["data"], "behind");
}
