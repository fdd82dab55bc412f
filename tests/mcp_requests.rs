//! JSON-RPC over POST: parse and envelope errors, notifications and agent responses (202),
//! ping and exact id echo, and every demo request method answered as `application/json`.

mod support;

use serde_json::{Value, json};
use support::{Gateway, each_mode};

/// POSTs `body` on `session` and returns the JSON-RPC reply (asserting 200 JSON).
fn call(gw: &Gateway, session: &str, body: &str) -> Value {
    let r = gw.post(Some(session), body);
    assert_eq!(r.status, 200, "{body} -> {}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"), "{body}");
    assert_eq!(r.header("mcp-session-id"), Some(session));
    r.json()
}

#[test]
fn invalid_json_gets_exact_parse_error() {
    each_mode(|gw| {
        let session = gw.initialize();
        for bad in ["{", "{\"jsonrpc\":", "not json at all"] {
            let r = gw.post(Some(&session), bad);
            assert_eq!(r.status, 400, "{bad}");
            assert_eq!(
                r.text(),
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#
            );
        }
        let r = gw.post(None, "{");
        assert_eq!(r.status, 400);
        assert_eq!(
            r.text(),
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}"#
        );
    });
}

#[test]
fn batch_gets_400_invalid_request() {
    each_mode(|gw| {
        let session = gw.initialize();
        let r = gw.post(Some(&session), r#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"ping"}]"#);
        assert_eq!(r.status, 400);
        assert_eq!(r.json()["error"]["code"], -32600);
    });
}

#[test]
fn unknown_method_gets_32601_with_id() {
    each_mode(|gw| {
        let session = gw.initialize();
        let v = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":"u-1","method":"no/such/method"}"#,
        );
        assert_eq!(v["id"], "u-1");
        assert_eq!(v["error"]["code"], -32601);
    });
}

#[test]
fn tools_call_without_name_gets_32602() {
    each_mode(|gw| {
        let session = gw.initialize();
        let v = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"arguments":{}}}"#,
        );
        assert_eq!(v["id"], 5);
        assert_eq!(v["error"]["code"], -32602);
        let v = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call"}"#,
        );
        assert_eq!(v["id"], 6);
        assert_eq!(v["error"]["code"], -32602);
    });
}

#[test]
fn a_progress_token_over_1024_bytes_gets_32602_and_one_of_1024_is_served() {
    // An upstream copies the token into every progress notification, so a long one would
    // be multiplied by them: it is refused before the request goes anywhere.
    each_mode(|gw| {
        let session = gw.initialize();
        let body = |id: u32, token_bytes: usize| {
            let token = "t".repeat(token_bytes - 2);
            format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"hi"}},"_meta":{{"progressToken":"{token}"}}}}}}"#
            )
        };
        let v = call(gw, &session, &body(1, 1025));
        assert_eq!(v["id"], 1);
        assert_eq!(v["error"]["code"], -32602);
        assert_eq!(
            v["error"]["message"],
            "Invalid params: _meta.progressToken is longer than 1024 bytes"
        );
        let r = gw.post(Some(&session), &body(2, 1024));
        assert_eq!(r.status, 200);
        assert!(
            r.text().contains(r#""result""#) && !r.text().contains(r#""error""#),
            "{}",
            r.text()
        );
    });
}

#[test]
fn notifications_and_responses_get_202_without_body() {
    each_mode(|gw| {
        let session = gw.initialize();
        for body in [
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/foo","params":{"x":1}}"#,
            r#"{"jsonrpc":"2.0","id":99,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":98,"error":{"code":-1,"message":"no"}}"#,
        ] {
            let r = gw.post(Some(&session), body);
            assert_eq!(r.status, 202, "{body}");
            assert!(r.body.is_empty(), "{body}: {}", r.text());
        }
    });
}

#[test]
fn ping_echoes_ids_byte_exact() {
    each_mode(|gw| {
        let session = gw.initialize();
        for id in [
            "1",
            "0",
            "-5",
            "123456789012",
            r#""abc""#,
            r#""a\"b""#,
            r#""\u00e9 x""#,
        ] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            let r = gw.post(Some(&session), &body);
            assert_eq!(r.status, 200);
            assert_eq!(
                r.text(),
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#)
            );
        }
    });
}

#[test]
fn list_methods_return_results() {
    each_mode(|gw| {
        let session = gw.initialize();
        let tools = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        );
        let names: Vec<&str> = tools["result"]["tools"]
            .as_array()
            .expect("tools")
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        for want in [
            "echo",
            "add",
            "progress",
            "add_tool",
            "remove_tool",
            "touch_resource",
            "log",
        ] {
            assert!(names.contains(&want), "{names:?}");
        }
        let prompts = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":2,"method":"prompts/list"}"#,
        );
        assert_eq!(prompts["result"]["prompts"][0]["name"], "greet");
        let templates = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":3,"method":"resources/templates/list"}"#,
        );
        assert_eq!(
            templates["result"]["resourceTemplates"][0]["uriTemplate"],
            "demo://items/{id}"
        );
    });
}

#[test]
fn resources_list_pages_with_cursor() {
    each_mode(|gw| {
        let session = gw.initialize();
        let first = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/list"}"#,
        );
        let page = first["result"]["resources"].as_array().expect("resources");
        assert_eq!(page.len(), 2);
        assert_eq!(first["result"]["nextCursor"], "page-2");
        let second = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":2,"method":"resources/list","params":{"cursor":"page-2"}}"#,
        );
        let rest = second["result"]["resources"].as_array().expect("resources");
        assert!(second["result"].get("nextCursor").is_none());
        let mut uris: Vec<&str> = page
            .iter()
            .chain(rest)
            .filter_map(|r| r["uri"].as_str())
            .collect();
        uris.sort_unstable();
        assert_eq!(uris, ["demo://config", "demo://readme", "demo://status"]);
        let bad = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":3,"method":"resources/list","params":{"cursor":"bogus"}}"#,
        );
        assert_eq!(bad["id"], 3);
        assert_eq!(bad["error"]["code"], -32602);
    });
}

#[test]
fn read_get_complete_set_level_and_subscribe_answer() {
    each_mode(|gw| {
        let session = gw.initialize();
        let read = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"demo://readme"}}"#,
        );
        assert_eq!(read["result"]["contents"][0]["uri"], "demo://readme");
        let item = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":2,"method":"resources/read","params":{"uri":"demo://items/7"}}"#,
        );
        assert_eq!(item["result"]["contents"][0]["uri"], "demo://items/7");
        let prompt = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":3,"method":"prompts/get","params":{"name":"greet","arguments":{"name":"Ada"}}}"#,
        );
        assert!(
            prompt["result"]["messages"]
                .as_array()
                .is_some_and(|m| !m.is_empty()),
            "{prompt}"
        );
        let complete = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":4,"method":"completion/complete","params":{"ref":{"type":"ref/prompt","name":"greet"},"argument":{"name":"style","value":"f"}}}"#,
        );
        assert_eq!(
            complete["result"]["completion"]["values"],
            json!(["formal"])
        );
        let level = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":5,"method":"logging/setLevel","params":{"level":"debug"}}"#,
        );
        assert_eq!(level, json!({"jsonrpc": "2.0", "id": 5, "result": {}}));
        let sub = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":6,"method":"resources/subscribe","params":{"uri":"demo://status"}}"#,
        );
        assert_eq!(sub, json!({"jsonrpc": "2.0", "id": 6, "result": {}}));
    });
}

#[test]
fn tools_call_without_progress_token_is_json() {
    each_mode(|gw| {
        let session = gw.initialize();
        let echo = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi there"}}}"#,
        );
        assert_eq!(echo["result"]["content"][0]["text"], "hi there");
        let add = call(
            gw,
            &session,
            r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"add","arguments":{"a":2,"b":40}}}"#,
        );
        assert_eq!(add["id"], 2);
        assert!(
            add["result"]["content"][0]["text"]
                .as_str()
                .is_some_and(|t| t.contains("42")),
            "{add}"
        );
    });
}

/// The `mcpyard_connections` gauge in scraped `text`.
fn connections(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("mcpyard_connections "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(u64::MAX)
}

/// A `tools/call` of the demo's `progress` tool without a progress token: answered as
/// JSON once its steps are done.
fn slow_call(id: u32, steps: u32) -> String {
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"progress","arguments":{{"steps":{steps}}}}}}}"#
    )
}

#[test]
fn agents_that_hang_up_before_their_json_answer_free_their_connections_at_once() {
    // 100 steps of 100 ms: the answers come after 10 s, the connections must go long
    // before (they were held until the answer, so a few thousand agents that hang up
    // could fill a worker's connection table).
    for mode in support::MODES {
        eprintln!("--- mode {mode:?}");
        let gw = Gateway::start_with(mode, "{kind: demo, progress_interval: 100ms}");
        let session = gw.initialize();
        let mut agents = Vec::new();
        for id in 0..50 {
            let mut c = gw.conn();
            c.send(&gw.post_bytes(Some(&session), &[], &slow_call(id, 100)));
            agents.push(c);
        }
        support::scrape_until(&gw, "50 agent connections", |t| connections(t) == 50);
        let hung_up = std::time::Instant::now();
        drop(agents);
        support::scrape_until(&gw, "no agent connection left", |t| connections(t) == 0);
        assert!(hung_up.elapsed() < std::time::Duration::from_secs(8));
        // The session serves on.
        let echo = call(
            &gw,
            &session,
            r#"{"jsonrpc":"2.0","id":"after","method":"tools/call","params":{"name":"echo","arguments":{"text":"still here"}}}"#,
        );
        assert_eq!(echo["result"]["content"][0]["text"], "still here");
    }
}

#[test]
fn an_id_in_flight_is_refused_and_free_again_once_answered() {
    each_mode(|gw| {
        let session = gw.initialize();
        let mut first = gw.conn();
        // With a progress token the answer starts (an event stream) at the first step:
        // once its head is read, the request is in flight at the session, whichever worker
        // the connection landed on.
        let tracked = r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"progress","arguments":{"steps":10},"_meta":{"progressToken":"p"}}}"#;
        first.send(&gw.post_bytes(Some(&session), &[], tracked));
        let head = first.read_head();
        assert_eq!(head.status, 200);
        // The same id again while the first is in flight: -32600, nothing served.
        let refused = call(gw, &session, &slow_call(7, 1));
        assert_eq!(refused["id"], 7);
        assert_eq!(refused["error"]["code"], -32600, "{refused}");
        let mut events = first.into_events();
        let mut answered = false;
        while let Some(event) = events.next() {
            // A priming event carries no data.
            if !event.data.is_empty() && event.json().get("result").is_some() {
                answered = true;
                break;
            }
        }
        assert!(answered, "the first request was answered");
        // Once answered, the id may come again.
        let later = call(gw, &session, &slow_call(7, 1));
        assert!(later["result"].is_object(), "{later}");
    });
}
