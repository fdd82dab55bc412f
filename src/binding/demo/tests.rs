//! Binding tests for the demo: the test plays the caller (the server binding) on internal
//! streams, without sockets, and asserts the frames the demo sends back on both
//! directions: `ReplyBegin`s, FLUSH events, result bytes, and RESETs carrying errors.

use super::*;
use crate::limits::STREAM_WINDOW_BYTES;
use crate::stream::{Begin, Caller, Challenge, Reset, Throttle, open};
use serde_json::{Value, json};
use std::time::Instant;
use tokio::time::timeout;

/// Longest a test waits for a frame the demo should send.
const WAIT: Duration = Duration::from_secs(5);

use crate::testing::run_local as run;

fn begin(kind: Kind, session: &str, params_len: usize, token: Option<&'static str>) -> Begin {
    Begin {
        kind,
        session: Rc::from(session),
        target: None,
        target_at: None,
        method: None,
        params_len: u32::try_from(params_len).expect("small params"),
        deadline: Instant::now() + Duration::from_secs(30),
        progress_token: token.map(|t| Bytes::from_static(t.as_bytes())),
        client: None,
        authorization: None,
    }
}

/// A demo worker with a fast progress pace.
fn demo() -> Rc<Demo> {
    Demo::new(DemoShared::new(Duration::from_millis(1)))
}

/// Opens a lifecycle stream and returns it with the minted session id.
async fn connect(demo: &Demo) -> (Caller, Rc<str>) {
    let (caller, callee) = open(begin(Kind::Lifecycle, "", 0, None));
    demo.open(callee);
    let frame = timeout(WAIT, caller.reply.next())
        .await
        .expect("reply begin");
    let Some(Frame::Begin(reply)) = frame else {
        panic!("expected a ReplyBegin, got {frame:?}");
    };
    assert_eq!(reply.caps, CAPS);
    let instructions = reply.instructions.expect("instructions");
    let text: String = serde_json::from_slice(&instructions).expect("a JSON string lexeme");
    assert!(text.contains("progress"));
    (caller, reply.session.expect("a session id"))
}

/// Opens a request stream and sends its params.
async fn request_with(
    demo: &Demo,
    session: &str,
    kind: Kind,
    params: &[u8],
    token: Option<&'static str>,
) -> Caller {
    let (caller, callee) = open(begin(kind, session, params.len(), token));
    demo.open(callee);
    if !params.is_empty() {
        let data = Bytes::copy_from_slice(params);
        timeout(WAIT, caller.initial.data(data))
            .await
            .expect("credit")
            .expect("demo alive");
    }
    caller
}

async fn request(demo: &Demo, session: &str, kind: Kind, params: &Value) -> Caller {
    let params = serde_json::to_vec(params).expect("params");
    request_with(demo, session, kind, &params, None).await
}

/// A successful reply: its FLUSH events in order, then its result.
struct Answer {
    flushes: Vec<Flush>,
    result: Value,
}

/// Reads a successful reply to its END and closes the initial direction after it.
async fn answer(caller: Caller) -> Answer {
    let first = timeout(WAIT, caller.reply.next()).await.expect("reply");
    assert!(
        matches!(first, Some(Frame::Begin(_))),
        "expected Begin, got {first:?}"
    );
    let mut flushes = Vec::new();
    let mut result = Vec::new();
    loop {
        match timeout(WAIT, caller.reply.next())
            .await
            .expect("reply frame")
        {
            Some(Frame::Flush(flush)) => {
                assert!(result.is_empty(), "FLUSH after result bytes");
                flushes.push(flush);
            }
            Some(Frame::Data(piece)) => {
                caller.reply.ack(u32::try_from(piece.len()).expect("piece"));
                result.extend_from_slice(&piece);
            }
            Some(Frame::End) => break,
            other => panic!(
                "expected a result, got {other:?} / {:?}",
                caller.initial.try_throttle()
            ),
        }
    }
    caller.initial.end();
    let result = serde_json::from_slice(&result).expect("result is JSON");
    Answer { flushes, result }
}

/// Reads a failed reply: ABORT, with the error as a RESET of the initial direction.
async fn failure(caller: Caller) -> (i32, String, Option<Value>) {
    loop {
        match timeout(WAIT, caller.reply.next())
            .await
            .expect("reply frame")
        {
            Some(Frame::Abort) => break,
            Some(Frame::Begin(_) | Frame::Flush(_)) => {}
            other => panic!("expected ABORT, got {other:?}"),
        }
    }
    match caller.initial.try_throttle() {
        Some(Throttle::Reset(Reset::Error {
            code,
            message,
            data,
        })) => {
            let data = data.map(|d| serde_json::from_slice(&d).expect("data is JSON"));
            (code, message.to_string(), data)
        }
        other => panic!("expected Reset::Error, got {other:?}"),
    }
}

async fn call(demo: &Demo, session: &str, name: &str, arguments: Value) -> Answer {
    let params = json!({ "name": name, "arguments": arguments });
    answer(request(demo, session, Kind::ToolsCall, &params).await).await
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().expect("a text block")
}

/// The next event on a lifecycle stream.
async fn event(lifecycle: &Caller) -> Event {
    match timeout(WAIT, lifecycle.reply.next())
        .await
        .expect("an event")
    {
        Some(Frame::Flush(flush)) => flush.event,
        other => panic!("expected FLUSH, got {other:?}"),
    }
}

/// Lets every ready task run, then asserts the lifecycle carries no event.
async fn no_event(lifecycle: &Caller) {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
    let frame = lifecycle.reply.try_next();
    assert!(frame.is_none(), "unexpected {frame:?}");
}

fn json_of(bytes: &Bytes) -> Value {
    serde_json::from_slice(bytes).expect("JSON")
}

#[test]
fn lifecycle_mints_distinct_sessions_and_ends_with_the_caller() {
    run(async {
        let demo = demo();
        let (a, id_a) = connect(&demo).await;
        let (_b, id_b) = connect(&demo).await;
        assert!(id_a.starts_with("demo-"));
        assert_ne!(id_a, id_b);
        assert_eq!(demo.sessions(), 2);
        a.initial.end();
        let frame = timeout(WAIT, a.reply.next()).await.expect("end");
        assert!(matches!(frame, Some(Frame::End)), "{frame:?}");
        assert_eq!(demo.sessions(), 1);
        let request = request(&demo, &id_a, Kind::ToolsList, &json!({})).await;
        let (code, message, _) = failure(request).await;
        assert_eq!((code, message.as_str()), (-32600, "Unknown session"));
    });
}

#[test]
fn resume_challenge_marks_the_event_stream_live() {
    run(async {
        let demo = demo();
        let (lifecycle, _) = connect(&demo).await;
        lifecycle
            .reply
            .challenge(Challenge::Suspended)
            .expect("alive");
        no_event(&lifecycle).await;
        let resume = Challenge::Resume {
            last_event_id: None,
        };
        lifecycle.reply.challenge(resume).expect("alive");
        assert!(matches!(event(&lifecycle).await, Event::Resumable));
        drop(lifecycle);
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
        assert_eq!(demo.sessions(), 0);
    });
}

#[test]
fn tools_list_has_every_builtin_with_a_schema() {
    run(async {
        let demo = demo();
        let (_lifecycle, session) = connect(&demo).await;
        let caller = request_with(&demo, &session, Kind::ToolsList, b"", None).await;
        let result = answer(caller).await.result;
        let tools = result["tools"].as_array().expect("tools");
        let names: Vec<&str> = tools
            .iter()
            .map(|t| t["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, tools::BUILTIN);
        assert!(tools.iter().all(|t| t["inputSchema"]["type"] == "object"));
    });
}

#[test]
fn echo_and_add_answer_with_text_and_structured_content() {
    run(async {
        let demo = demo();
        let (_lifecycle, s) = connect(&demo).await;
        let tricky = "quote \" backslash \\ newline \n ctrl \u{2} snow ☃";
        let echo = call(&demo, &s, "echo", json!({ "text": tricky })).await;
        let expected = json!({ "content": [{ "type": "text", "text": tricky }], "isError": false });
        assert_eq!(echo.result, expected);
        assert!(echo.flushes.is_empty());
        let add = call(&demo, &s, "add", json!({ "a": 2, "b": 40 }))
            .await
            .result;
        let expected = json!({
            "content": [{ "type": "text", "text": "42" }],
            "structuredContent": { "sum": 42 },
            "isError": false
        });
        assert_eq!(add, expected);
        let add = call(&demo, &s, "add", json!({ "a": 0.5, "b": 1 }))
            .await
            .result;
        assert_eq!(add["structuredContent"]["sum"], 1.5);
        assert_eq!(text(&add), "1.5");
    });
}

#[test]
fn large_params_arrive_across_several_data_frames() {
    run(async {
        let demo = demo();
        let (_lifecycle, s) = connect(&demo).await;
        let big = "x".repeat(STREAM_WINDOW_BYTES as usize * 3);
        let echo = call(&demo, &s, "echo", json!({ "text": big })).await.result;
        assert_eq!(text(&echo), big);
    });
}

#[test]
fn bad_arguments_give_an_error_result() {
    run(async {
        let demo = demo();
        let (_lifecycle, s) = connect(&demo).await;
        let cases = [
            ("echo", json!({})),
            ("echo", json!({ "text": 3 })),
            ("add", json!({ "a": "1", "b": 2 })),
            ("add", json!({ "a": 1 })),
            ("progress", json!({ "steps": 0 })),
            ("progress", json!({ "steps": 101 })),
            ("progress", json!({ "steps": 2.5 })),
            ("add_tool", json!({ "name": "Bad-Name" })),
            ("add_tool", json!({ "name": "echo" })),
            ("remove_tool", json!({ "name": "nope" })),
            ("remove_tool", json!({ "name": "echo" })),
            ("touch_resource", json!({ "uri": "demo://nope" })),
            ("log", json!({ "level": "loud", "message": "m" })),
            (
                "log",
                json!({ "level": "error", "message": "m".repeat(256 * 1024 + 1) }),
            ),
        ];
        for (tool, arguments) in cases {
            let result = call(&demo, &s, tool, arguments.clone()).await.result;
            assert_eq!(result["isError"], true, "{tool} {arguments}");
            assert!(!text(&result).is_empty());
        }
    });
}

#[test]
fn unknown_tool_and_malformed_params_are_invalid_params() {
    run(async {
        let demo = demo();
        let (_lifecycle, s) = connect(&demo).await;
        let caller = request(&demo, &s, Kind::ToolsCall, &json!({ "name": "nope" })).await;
        let (code, message, _) = failure(caller).await;
        assert_eq!((code, message.as_str()), (-32602, "Unknown tool: nope"));
        let params = json!({ "name": "echo", "arguments": [1] });
        let (code, _, _) = failure(request(&demo, &s, Kind::ToolsCall, &params).await).await;
        assert_eq!(code, -32602);
        let caller = request_with(&demo, &s, Kind::ToolsCall, b"{\"name\":", None).await;
        assert_eq!(failure(caller).await.0, -32602);
        let caller = request(&demo, &s, Kind::ToolsCall, &json!({})).await;
        assert_eq!(failure(caller).await.0, -32602);
    });
}

#[test]
fn progress_flushes_every_step_before_the_result() {
    run(async {
        let demo = demo();
        let (_lifecycle, s) = connect(&demo).await;
        for token in ["\"tok-1\"", "7"] {
            let params = br#"{"name":"progress","arguments":{"steps":3}}"#;
            let caller = request_with(&demo, &s, Kind::ToolsCall, params, Some(token)).await;
            let answer = answer(caller).await;
            assert_eq!(text(&answer.result), "done after 3 steps");
            assert_eq!(answer.flushes.len(), 3);
            let token: Value = serde_json::from_str(token).expect("token");
            for (i, flush) in answer.flushes.iter().enumerate() {
                let step = i + 1;
                assert_eq!(flush.id.as_deref(), Some(step.to_string().as_str()));
                let Event::Progress { params } = &flush.event else {
                    panic!("expected Progress, got {:?}", flush.event);
                };
                let expected = json!({
                    "progressToken": token,
                    "progress": step,
                    "total": 3,
                    "message": format!("step {step} of 3")
                });
                assert_eq!(json_of(params), expected);
            }
        }
        // Without a token the tool still works through its steps, silently.
        let answer = call(&demo, &s, "progress", json!({})).await;
        assert!(answer.flushes.is_empty());
        assert_eq!(text(&answer.result), "done after 5 steps");
    });
}

#[test]
fn progress_stops_quietly_when_the_caller_drops_its_reply() {
    run(async {
        let demo = Demo::new(DemoShared::new(Duration::from_millis(20)));
        let (_lifecycle, s) = connect(&demo).await;
        let params = br#"{"name":"progress","arguments":{"steps":100}}"#;
        let caller = request_with(&demo, &s, Kind::ToolsCall, params, Some("1")).await;
        let begin = timeout(WAIT, caller.reply.next()).await.expect("begin");
        assert!(matches!(begin, Some(Frame::Begin(_))));
        let first = timeout(WAIT, caller.reply.next()).await.expect("a step");
        assert!(matches!(first, Some(Frame::Flush(_))));
        assert_eq!(demo.requests_in_flight(), 1);
        // The agent cancels: the reply receiver goes, the initial sender stays.
        let Caller { initial, reply } = caller;
        drop(reply);
        timeout(WAIT, async {
            while demo.requests_in_flight() > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the progress task stops");
        drop(initial);
        // The worker still serves.
        let echo = call(&demo, &s, "echo", json!({ "text": "still here" })).await;
        assert_eq!(text(&echo.result), "still here");
    });
}

#[test]
fn add_tool_notifies_every_session_on_every_worker() {
    run(async {
        let shared = DemoShared::new(Duration::from_millis(1));
        let worker_a = Demo::new(shared.clone());
        let worker_b = Demo::new(shared);
        let (lifecycle_a, s_a) = connect(&worker_a).await;
        let (lifecycle_b, s_b) = connect(&worker_b).await;
        let added = call(&worker_a, &s_a, "add_tool", json!({ "name": "shout" })).await;
        assert_eq!(added.result["isError"], false);
        for lifecycle in [&lifecycle_a, &lifecycle_b] {
            let event = event(lifecycle).await;
            assert!(
                matches!(event, Event::ListChanged(ListKind::Tools)),
                "{event:?}"
            );
        }
        let caller = request(&worker_b, &s_b, Kind::ToolsList, &json!({})).await;
        let tools = answer(caller).await.result;
        let last = tools["tools"]
            .as_array()
            .and_then(|t| t.last())
            .expect("tools");
        assert_eq!(last["name"], "shout");
        assert_eq!(last["inputSchema"]["required"], json!(["text"]));
        let shout = call(&worker_b, &s_b, "shout", json!({ "text": "hey" })).await;
        assert_eq!(text(&shout.result), "hey");
        let again = call(&worker_b, &s_b, "add_tool", json!({ "name": "shout" })).await;
        assert_eq!(again.result["isError"], true);
        no_event(&lifecycle_a).await;

        let removed = call(&worker_b, &s_b, "remove_tool", json!({ "name": "shout" })).await;
        assert_eq!(removed.result["isError"], false);
        for lifecycle in [&lifecycle_a, &lifecycle_b] {
            let event = event(lifecycle).await;
            assert!(
                matches!(event, Event::ListChanged(ListKind::Tools)),
                "{event:?}"
            );
        }
        let caller = request(
            &worker_a,
            &s_a,
            Kind::ToolsCall,
            &json!({ "name": "shout" }),
        )
        .await;
        assert_eq!(failure(caller).await.0, -32602);
    });
}

#[test]
fn touch_resource_updates_only_subscribed_sessions() {
    run(async {
        let demo = demo();
        let (lifecycle_a, a) = connect(&demo).await;
        let (lifecycle_b, b) = connect(&demo).await;
        let status = json!({ "uri": "demo://status" });
        let subscribed = answer(request(&demo, &a, Kind::ResourcesSubscribe, &status).await).await;
        assert_eq!(subscribed.result, json!({}));
        let touched = call(&demo, &b, "touch_resource", status.clone())
            .await
            .result;
        assert_eq!(
            text(&touched),
            "touched demo://status: notified 1 session(s)"
        );
        match event(&lifecycle_a).await {
            Event::ResourcesUpdated { params } => assert_eq!(json_of(&params), status),
            other => panic!("expected ResourcesUpdated, got {other:?}"),
        }
        no_event(&lifecycle_b).await;
        let read = answer(request(&demo, &a, Kind::ResourcesRead, &status).await).await;
        assert!(text_of_contents(&read.result).contains("touches: 1"));

        let gone = answer(request(&demo, &a, Kind::ResourcesUnsubscribe, &status).await).await;
        assert_eq!(gone.result, json!({}));
        let touched = call(&demo, &b, "touch_resource", status.clone())
            .await
            .result;
        assert_eq!(
            text(&touched),
            "touched demo://status: notified 0 session(s)"
        );
        no_event(&lifecycle_a).await;
        let nope = json!({ "uri": "demo://nope" });
        let (code, _, _) = failure(request(&demo, &a, Kind::ResourcesSubscribe, &nope).await).await;
        assert_eq!(code, -32002);
    });
}

fn text_of_contents(result: &Value) -> &str {
    result["contents"][0]["text"]
        .as_str()
        .expect("contents text")
}

#[test]
fn resources_list_is_paginated_by_two() {
    run(async {
        let demo = demo();
        let (_lifecycle, s) = connect(&demo).await;
        let first = answer(request_with(&demo, &s, Kind::ResourcesList, b"", None).await).await;
        let expected = json!({
            "resources": [
                { "uri": "demo://readme", "name": "readme", "title": "About the demo",
                  "mimeType": "text/markdown" },
                { "uri": "demo://config", "name": "config", "title": "Demo configuration",
                  "mimeType": "application/json" }
            ],
            "nextCursor": "page-2"
        });
        assert_eq!(first.result, expected);
        let params = json!({ "cursor": "page-2" });
        let last = answer(request(&demo, &s, Kind::ResourcesList, &params).await).await;
        let expected = json!({
            "resources": [{ "uri": "demo://status", "name": "status", "title": "Demo status",
                            "mimeType": "text/plain" }]
        });
        assert_eq!(last.result, expected);
        for cursor in [json!("page-3"), json!(2)] {
            let params = json!({ "cursor": cursor });
            let (code, message, _) =
                failure(request(&demo, &s, Kind::ResourcesList, &params).await).await;
            assert_eq!((code, message.as_str()), (-32602, "Invalid cursor"));
        }
    });
}

#[test]
fn resources_read_serves_static_documents_items_and_not_found() {
    run(async {
        let demo = demo();
        let (_lifecycle, s) = connect(&demo).await;
        let item = json!({ "uri": "demo://items/42" });
        let read = answer(request(&demo, &s, Kind::ResourcesRead, &item).await).await;
        let expected = json!({
            "contents": [{ "uri": "demo://items/42", "mimeType": "text/plain", "text": "item 42" }]
        });
        assert_eq!(read.result, expected);
        let config = json!({ "uri": "demo://config" });
        let read = answer(request(&demo, &s, Kind::ResourcesRead, &config).await).await;
        assert_eq!(read.result["contents"][0]["mimeType"], "application/json");
        let config: Value = serde_json::from_str(text_of_contents(&read.result)).expect("config");
        assert_eq!(config["progress_interval_ms"], 1);
        let readme = json!({ "uri": "demo://readme" });
        let read = answer(request(&demo, &s, Kind::ResourcesRead, &readme).await).await;
        assert!(text_of_contents(&read.result).starts_with("# mcpyard demo"));

        let nope = json!({ "uri": "demo://nope\"" });
        let (code, message, data) =
            failure(request(&demo, &s, Kind::ResourcesRead, &nope).await).await;
        assert_eq!((code, message.as_str()), (-32002, "Resource not found"));
        assert_eq!(data, Some(nope));

        let templates = request_with(&demo, &s, Kind::ResourcesTemplatesList, b"", None).await;
        let templates = answer(templates).await.result;
        assert_eq!(
            templates["resourceTemplates"][0]["uriTemplate"],
            "demo://items/{id}"
        );
    });
}

#[test]
fn greet_prompt_renders_and_checks_its_arguments() {
    run(async {
        let demo = demo();
        let (_lifecycle, s) = connect(&demo).await;
        let list = answer(request_with(&demo, &s, Kind::PromptsList, b"", None).await).await;
        let arguments = &list.result["prompts"][0]["arguments"];
        assert_eq!(
            arguments[0],
            json!({ "name": "name", "description": "Who to greet.", "required": true })
        );
        assert_eq!(arguments[1]["required"], false);

        let params =
            json!({ "name": "greet", "arguments": { "name": "Ada \"L\"", "style": "formal" } });
        let got = answer(request(&demo, &s, Kind::PromptsGet, &params).await)
            .await
            .result;
        let expected = json!({
            "description": "A greeting for Ada \"L\"",
            "messages": [{ "role": "user", "content": {
                "type": "text",
                "text": "Please write a formal greeting addressed to Ada \"L\"."
            } }]
        });
        assert_eq!(got, expected);

        let failures = [
            (
                json!({ "name": "greet", "arguments": {} }),
                "Missing required argument: name",
            ),
            (
                json!({ "name": "greet" }),
                "Missing required argument: name",
            ),
            (
                json!({ "name": "greet", "arguments": { "name": "A", "style": "loud" } }),
                "Invalid argument style: expected formal or casual",
            ),
            (
                json!({ "name": "farewell", "arguments": { "name": "A" } }),
                "Unknown prompt: farewell",
            ),
        ];
        for (params, expected) in failures {
            let (code, message, _) =
                failure(request(&demo, &s, Kind::PromptsGet, &params).await).await;
            assert_eq!((code, message.as_str()), (-32602, expected));
        }
    });
}

#[test]
fn completion_filters_by_prefix() {
    run(async {
        let demo = demo();
        let (_lifecycle, s) = connect(&demo).await;
        let cases = [
            (
                json!({ "type": "ref/prompt", "name": "greet" }),
                "style",
                "f",
                json!(["formal"]),
            ),
            (
                json!({ "type": "ref/prompt", "name": "greet" }),
                "style",
                "",
                json!(["formal", "casual"]),
            ),
            (
                json!({ "type": "ref/prompt", "name": "greet" }),
                "name",
                "",
                json!([]),
            ),
            (
                json!({ "type": "ref/resource", "uri": "demo://items/{id}" }),
                "id",
                "4",
                json!(["42"]),
            ),
            (
                json!({ "type": "ref/resource", "uri": "demo://items/{id}" }),
                "id",
                "",
                json!(["1", "2", "42"]),
            ),
        ];
        for (reference, argument, prefix, values) in cases {
            let params =
                json!({ "ref": reference, "argument": { "name": argument, "value": prefix } });
            let got = answer(request(&demo, &s, Kind::CompletionComplete, &params).await).await;
            let total = values.as_array().map_or(0, Vec::len);
            let expected =
                json!({ "completion": { "values": values, "total": total, "hasMore": false } });
            assert_eq!(got.result, expected);
        }
        let params = json!({ "ref": { "type": "ref/prompt", "name": "nope" }, "argument": { "name": "x", "value": "" } });
        let (code, _, _) =
            failure(request(&demo, &s, Kind::CompletionComplete, &params).await).await;
        assert_eq!(code, -32602);
    });
}

#[test]
fn set_level_filters_log_messages_of_the_calling_session() {
    run(async {
        let demo = demo();
        let (lifecycle, s) = connect(&demo).await;
        let (other, _) = connect(&demo).await;
        let logged = call(
            &demo,
            &s,
            "log",
            json!({ "level": "debug", "message": "hi \"you\"" }),
        )
        .await;
        assert_eq!(text(&logged.result), "logged at debug");
        match event(&lifecycle).await {
            Event::Notification { method, params } => {
                assert_eq!(&*method, "notifications/message");
                let params = json_of(&params.expect("params"));
                assert_eq!(
                    params,
                    json!({ "level": "debug", "logger": "demo", "data": "hi \"you\"" })
                );
            }
            other => panic!("expected a notification, got {other:?}"),
        }
        let level = json!({ "level": "warning" });
        let set = answer(request(&demo, &s, Kind::LoggingSetLevel, &level).await).await;
        assert_eq!(set.result, json!({}));
        let quiet = call(&demo, &s, "log", json!({ "level": "info", "message": "m" })).await;
        assert_eq!(quiet.result["isError"], false);
        no_event(&lifecycle).await;
        call(
            &demo,
            &s,
            "log",
            json!({ "level": "error", "message": "m" }),
        )
        .await;
        assert!(matches!(
            event(&lifecycle).await,
            Event::Notification { .. }
        ));
        no_event(&other).await;
        let bad = json!({ "level": "loud" });
        let (code, _, _) = failure(request(&demo, &s, Kind::LoggingSetLevel, &bad).await).await;
        assert_eq!(code, -32602);
    });
}

#[test]
fn params_longer_than_announced_are_an_invalid_request() {
    run(async {
        let demo = demo();
        let (_lifecycle, s) = connect(&demo).await;
        let (caller, callee) = open(begin(Kind::ToolsList, &s, 2, None));
        demo.open(callee);
        let sent = timeout(WAIT, caller.initial.data(Bytes::from_static(b"{}  "))).await;
        assert!(sent.is_ok());
        assert_eq!(failure(caller).await.0, -32600);
    });
}
