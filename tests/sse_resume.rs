//! SSE on both kinds of stream: a request's progress stream (priming event, progress,
//! result, end), resuming it on a GET with `Last-Event-ID` after the connection drops,
//! cancellation, and the session's GET stream (list_changed, replay, replacement).

mod support;

use support::{Event, Events, Gateway, each_mode, initialize_body, open_events};

/// A `tools/call` of `progress` with `steps` steps, and a progress token if given.
fn progress_call(id: u32, steps: u32, token: Option<&str>) -> String {
    let meta = token.map_or(String::new(), |t| {
        format!(r#","_meta":{{"progressToken":{t}}}"#)
    });
    format!(
        r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"progress","arguments":{{"steps":{steps}}}{meta}}}}}"#
    )
}

/// Splits an event id `<stream>.<seq>`.
fn event_id(e: &Event) -> (u32, u64) {
    let id =
        e.id.as_deref()
            .unwrap_or_else(|| panic!("event without id: {e:?}"));
    let (stream, seq) = id.split_once('.').expect("id has a dot");
    (stream.parse().expect("stream"), seq.parse().expect("seq"))
}

/// Asserts `e` is the progress notification `step` of `total` for token `token` on stream
/// `stream`.
fn assert_progress(e: &Event, stream: u32, step: u64, total: u64, token: &serde_json::Value) {
    assert_eq!(event_id(e), (stream, step), "{e:?}");
    let v = e.json();
    assert_eq!(v["method"], "notifications/progress", "{e:?}");
    assert_eq!(&v["params"]["progressToken"], token);
    assert_eq!(v["params"]["progress"], step);
    assert_eq!(v["params"]["total"], total);
}

/// Asserts `e` is the result of a progress call with JSON-RPC id `id`.
fn assert_progress_result(e: &Event, stream: u32, seq: u64, id: u32, steps: u64) {
    assert_eq!(event_id(e), (stream, seq), "{e:?}");
    let v = e.json();
    assert_eq!(v["id"], id);
    assert_eq!(
        v["result"]["content"][0]["text"],
        format!("done after {steps} steps")
    );
}

/// Reads the priming event of a 2025-11-25 request stream; returns the stream number.
fn priming(events: &mut Events) -> u32 {
    let first = events.expect();
    let (stream, seq) = event_id(&first);
    assert_eq!(seq, 0);
    assert!(
        stream >= 1,
        "request streams are numbered from 1: {first:?}"
    );
    assert_eq!(first.raw, format!("id: {stream}.0\ndata: \n\n"));
    stream
}

#[test]
fn progress_call_streams_priming_progress_and_result() {
    each_mode(|gw| {
        let session = gw.initialize();
        let (head, mut events) = open_events(
            gw,
            &gw.post_bytes(
                Some(&session),
                &[],
                &progress_call(1, 3, Some(r#""tok-1""#)),
            ),
        );
        assert_eq!(head.header("mcp-session-id"), Some(session.as_str()));
        let stream = priming(&mut events);
        let token = serde_json::json!("tok-1");
        for step in 1..=3 {
            assert_progress(&events.expect(), stream, step, 3, &token);
        }
        assert_progress_result(&events.expect(), stream, 4, 1, 3);
        assert_eq!(events.next(), None, "stream must end after the result");
        // The connection stays usable after the stream's terminating chunk.
        let mut conn = events.conn;
        conn.send(&gw.post_bytes(
            Some(&session),
            &[],
            r#"{"jsonrpc":"2.0","id":"after","method":"ping"}"#,
        ));
        assert_eq!(
            conn.read_response().text(),
            r#"{"jsonrpc":"2.0","id":"after","result":{}}"#
        );
        // An integer token works the same; each request gets its own stream number.
        let (_, mut events) = open_events(
            gw,
            &gw.post_bytes(Some(&session), &[], &progress_call(2, 1, Some("9"))),
        );
        let second = priming(&mut events);
        assert_ne!(second, stream);
        assert_progress(&events.expect(), second, 1, 1, &serde_json::json!(9));
        assert_progress_result(&events.expect(), second, 2, 2, 1);
        assert_eq!(events.next(), None);
    });
}

#[test]
fn progress_call_without_token_is_json() {
    each_mode(|gw| {
        let session = gw.initialize();
        let r = gw.post(Some(&session), &progress_call(4, 2, None));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/json"));
        let v = r.json();
        assert_eq!(v["id"], 4);
        assert_eq!(v["result"]["content"][0]["text"], "done after 2 steps");
    });
}

#[test]
fn older_version_stream_has_no_priming_event() {
    each_mode(|gw| {
        let r = gw.post(None, &initialize_body(1, "2025-06-18"));
        let session = r.header("mcp-session-id").expect("session").to_owned();
        let (_, mut events) = open_events(
            gw,
            &gw.post_bytes(Some(&session), &[], &progress_call(3, 2, Some("1"))),
        );
        let first = events.expect();
        let (stream, _) = event_id(&first);
        assert_progress(&first, stream, 1, 2, &serde_json::json!(1));
        assert_progress(&events.expect(), stream, 2, 2, &serde_json::json!(1));
        assert_progress_result(&events.expect(), stream, 3, 3, 2);
        assert_eq!(events.next(), None);
    });
}

#[test]
fn request_stream_resumes_on_get_with_last_event_id() {
    each_mode(|gw| {
        let session = gw.initialize();
        let (_, mut events) = open_events(
            gw,
            &gw.post_bytes(Some(&session), &[], &progress_call(11, 20, Some(r#""r""#))),
        );
        let stream = priming(&mut events);
        let token = serde_json::json!("r");
        assert_progress(&events.expect(), stream, 1, 20, &token);
        assert_progress(&events.expect(), stream, 2, 20, &token);
        drop(events);
        let last = format!("{stream}.2");
        let (_, mut resumed) = open_events(
            gw,
            &gw.get_bytes(&session, &[("last-event-id", last.as_str())]),
        );
        for step in 3..=20 {
            assert_progress(&resumed.expect(), stream, step, 20, &token);
        }
        assert_progress_result(&resumed.expect(), stream, 21, 11, 20);
        assert_eq!(resumed.next(), None);
    });
}

/// `tools/call` requests counted ok and cancelled, now.
fn call_outcomes(gw: &Gateway) -> (u64, u64) {
    let text = support::scrape(gw);
    (
        support::requests_counted(&text, "tools/call", "ok"),
        support::requests_counted(&text, "tools/call", "cancelled"),
    )
}

#[test]
fn a_request_stream_its_agent_left_counts_cancelled_and_a_resumed_one_ok() {
    for mode in support::MODES {
        eprintln!("--- mode {mode:?}");
        // A detached stream's exit waits for credit until the agent resumes, or until
        // the request's deadline, which is made short here.
        let gw = &Gateway::start_north(
            mode,
            ", request_timeout: 2s",
            "  exit: {kind: demo, progress_interval: 20ms}\n",
        );
        let session = gw.initialize();
        let (ok, cancelled) = call_outcomes(gw);
        // The agent reads one progress event and goes for good: nothing reaches it, not
        // the result and not the timeout's error, so the request is cancelled.
        let (_, mut events) = open_events(
            gw,
            &gw.post_bytes(Some(&session), &[], &progress_call(21, 5, Some("1"))),
        );
        priming(&mut events);
        events.expect();
        drop(events);
        support::scrape_until(gw, "the left request counted cancelled", |text| {
            support::requests_counted(text, "tools/call", "cancelled") == cancelled + 1
        });
        assert_eq!(call_outcomes(gw), (ok, cancelled + 1));
        // The agent goes and comes back with a GET resuming the stream: it gets the
        // result, so the request is `ok`.
        let (_, mut events) = open_events(
            gw,
            &gw.post_bytes(Some(&session), &[], &progress_call(22, 5, Some("2"))),
        );
        let stream = priming(&mut events);
        events.expect();
        drop(events);
        let last = format!("{stream}.1");
        let (_, mut resumed) = open_events(
            gw,
            &gw.get_bytes(&session, &[("last-event-id", last.as_str())]),
        );
        for step in 2..=5 {
            assert_progress(&resumed.expect(), stream, step, 5, &serde_json::json!(2));
        }
        assert_progress_result(&resumed.expect(), stream, 6, 22, 5);
        support::scrape_until(gw, "the resumed request counted ok", |text| {
            support::requests_counted(text, "tools/call", "ok") == ok + 1
        });
        assert_eq!(call_outcomes(gw), (ok + 1, cancelled + 1));
    }
}

/// A request's stream number is known only from its events, so a `Last-Event-ID` naming
/// a request answered as JSON (or not decided yet) names no stream to resume: 400, and the
/// request's own answer is not touched.
#[test]
fn a_resume_naming_a_request_without_an_event_stream_is_refused() {
    each_mode(|gw| {
        let session = gw.initialize();
        // A call without a progress token, slow enough to be in flight meanwhile.
        let mut call = support::Conn::open(gw.addr);
        call.send(&gw.post_bytes(Some(&session), &[], &progress_call(31, 40, None)));
        std::thread::sleep(std::time::Duration::from_millis(100));
        for stream in 1..=4 {
            let last = format!("{stream}.0");
            let r = gw.raw(&gw.get_bytes(&session, &[("last-event-id", last.as_str())]));
            assert_eq!(r.status, 400, "{last}: {}", r.text());
            assert_eq!(
                r.json()["error"]["message"],
                "Bad Request: Last-Event-ID names no live stream"
            );
        }
        let answer = call.read_response();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("content-type"), Some("application/json"));
        let v = answer.json();
        assert_eq!(v["id"], 31);
        assert_eq!(v["result"]["content"][0]["text"], "done after 40 steps");
        gw.assert_serving();
    });
}

/// The result event is not kept for replay: a GET resuming the stream while that event is
/// being written on the connection the stream has gets 400, and the old connection carries
/// the whole result to its end (before, the GET took the rest of the event, without its
/// start, and the old stream ended in the middle of it).
#[test]
fn a_resume_while_the_result_is_being_written_is_refused() {
    // A result far larger than what the socket buffers between the gateway and a reader
    // with a narrow window hold, so its writing waits for that reader.
    let text = "w".repeat(3_900_000);
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{text}"}},"_meta":{{"progressToken":"w"}}}}}}"#
    );
    each_mode(|gw| {
        let session = gw.initialize();
        let mut conn = support::Conn::open_narrow(gw.addr, 4096);
        conn.send(&gw.post_bytes(Some(&session), &[], &call));
        let head = conn.read_head();
        assert_eq!(head.header("content-type"), Some("text/event-stream"));
        let mut events = conn.into_events();
        let stream = priming(&mut events);
        // The result event has started; this side now stops reading.
        events.read_into(br#""result""#);
        let last = format!("{stream}.0");
        let r = gw.raw(&gw.get_bytes(&session, &[("last-event-id", last.as_str())]));
        let start: String = r.text().chars().take(200).collect();
        assert_eq!(r.status, 400, "{start}");
        assert_eq!(
            r.json()["error"]["message"],
            "Bad Request: Last-Event-ID names a stream whose last event is being written on another connection"
        );
        let result = events.expect();
        assert_eq!(event_id(&result), (stream, 1));
        let v = result.json();
        assert_eq!(v["id"], 41);
        assert_eq!(
            v["result"]["content"][0]["text"].as_str(),
            Some(text.as_str())
        );
        assert_eq!(events.next(), None);
        gw.assert_serving();
    });
}

#[test]
fn cancelled_request_stream_ends_without_result() {
    each_mode(|gw| {
        let session = gw.initialize();
        let (_, mut events) = open_events(
            gw,
            &gw.post_bytes(Some(&session), &[], &progress_call(77, 100, Some(r#""c""#))),
        );
        let stream = priming(&mut events);
        assert_progress(&events.expect(), stream, 1, 100, &serde_json::json!("c"));
        let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":77,"reason":"test"}}"#;
        let r = gw.post(Some(&session), cancel);
        assert_eq!(r.status, 202);
        assert!(r.body.is_empty());
        let mut last = 1;
        let mut cancelled = false;
        while let Some(e) = events.next() {
            let v = e.json();
            assert!(!cancelled, "an event after the cancellation error: {e:?}");
            if v.get("error").is_some() {
                // The stream ends with the error MCP SDK servers send for a cancelled request.
                assert_eq!(v["id"], 77, "{e:?}");
                assert_eq!(v["error"]["code"], -32800, "{e:?}");
                cancelled = true;
                continue;
            }
            assert_eq!(
                v["method"], "notifications/progress",
                "a result after cancel: {e:?}"
            );
            last = event_id(&e).1;
        }
        assert!(cancelled, "no cancellation error closed the stream");
        assert!(last < 100, "the call ran to completion");
        // The session is still fine.
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
        );
        assert_eq!(r.status, 200);
    });
}

/// Calls `add_tool` with `name` on `session`; asserts it succeeded.
fn add_tool(gw: &Gateway, session: &str, name: &str) {
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":"add","method":"tools/call","params":{{"name":"add_tool","arguments":{{"name":"{name}"}}}}}}"#
    );
    let r = gw.post(Some(session), &body);
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["result"]["isError"], serde_json::json!(false), "{v}");
}

/// Opens the session's GET stream and reads its priming event `0.<cursor>`.
fn open_get(gw: &Gateway, session: &str, last: Option<&str>) -> Events {
    let extra: Vec<(&str, &str)> = last.map(|l| ("last-event-id", l)).into_iter().collect();
    let (head, mut events) = open_events(gw, &gw.get_bytes(session, &extra));
    assert_eq!(head.header("mcp-session-id"), Some(session));
    let first = events.expect();
    let (stream, seq) = event_id(&first);
    assert_eq!(stream, 0);
    assert_eq!(first.raw, format!("id: 0.{seq}\ndata: \n\n"));
    events
}

#[test]
fn list_changed_arrives_on_get_stream_and_replays() {
    each_mode(|gw| {
        let session = gw.initialize();
        let mut get = open_get(gw, &session, None);
        add_tool(gw, &session, "extra_one");
        let changed = get.expect();
        let (stream, seq) = event_id(&changed);
        assert_eq!(stream, 0);
        assert!(seq >= 1);
        assert_eq!(
            changed.data,
            r#"{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}"#
        );
        // A new GET resuming from just before the event replays it byte for byte, and
        // replaces the first GET, which ends cleanly.
        let before = format!("0.{}", seq - 1);
        let mut again = open_get(gw, &session, Some(&before));
        assert_eq!(again.expect(), changed);
        assert_eq!(get.next(), None);
        // The tool is listed now.
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
        );
        assert!(r.text().contains(r#""name":"extra_one""#), "{}", r.text());
    });
}

#[test]
fn second_get_replaces_first() {
    each_mode(|gw| {
        let session = gw.initialize();
        let mut first = open_get(gw, &session, None);
        let mut second = open_get(gw, &session, None);
        assert_eq!(
            first.next(),
            None,
            "the replaced GET must end with its terminating chunk"
        );
        add_tool(gw, &session, "extra_two");
        let changed = second.expect();
        assert_eq!(event_id(&changed).0, 0);
        assert_eq!(changed.json()["method"], "notifications/tools/list_changed");
    });
}

#[test]
fn log_message_arrives_on_get_stream() {
    each_mode(|gw| {
        let session = gw.initialize();
        let mut get = open_get(gw, &session, None);
        let r = gw.post(
            Some(&session),
            r#"{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"info"}}"#,
        );
        assert_eq!(r.status, 200);
        let body = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"log","arguments":{"level":"debug","message":"quiet"}}}"#;
        assert_eq!(gw.post(Some(&session), body).status, 200);
        let body = r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"log","arguments":{"level":"warning","message":"hi \"there\""}}}"#;
        assert_eq!(gw.post(Some(&session), body).status, 200);
        let e = get.expect();
        assert_eq!(event_id(&e).0, 0);
        assert_eq!(
            e.data,
            r#"{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"warning","logger":"demo","data":"hi \"there\""}}"#
        );
    });
}

/// Events pushed while the GET stream's writer waits on a full socket are written after it,
/// none skipped: the agent reads nothing until every `log` call was answered, so most of
/// the events arrive while an earlier one is still being written.
#[test]
fn get_stream_writes_every_event_pushed_while_a_write_waits() {
    // Enough bytes to fill the gateway's send buffer and the agent's receive window
    // (a few MiB on loopback), in fewer events than the session keeps for replay.
    const EVENTS: usize = 48;
    const MESSAGE_BYTES: usize = 160 * 1024;
    let message = "m".repeat(MESSAGE_BYTES);
    each_mode(|gw| {
        let session = gw.initialize();
        let mut get = open_get(gw, &session, None);
        for i in 0..EVENTS {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"log","arguments":{{"level":"info","message":"{i}:{message}"}}}}}}"#
            );
            let r = gw.post(Some(&session), &body);
            assert_eq!(r.status, 200);
            assert_eq!(r.json()["result"]["isError"], false, "call {i}");
        }
        let mut last_seq = None;
        for i in 0..EVENTS {
            let e = get.expect();
            let (stream, seq) = event_id(&e);
            assert_eq!(stream, 0);
            if let Some(last) = last_seq {
                assert_eq!(seq, last + 1, "event {i} follows the one before it");
            }
            last_seq = Some(seq);
            let v = e.json();
            assert_eq!(v["method"], "notifications/message");
            let data = v["params"]["data"].as_str().unwrap_or_default();
            assert!(
                data.starts_with(&format!("{i}:")),
                "event {i} is log call {i}"
            );
            assert_eq!(data.len(), MESSAGE_BYTES + format!("{i}:").len());
        }
    });
}

#[test]
fn subscribed_resource_update_arrives_on_get_stream() {
    each_mode(|gw| {
        let session = gw.initialize();
        let sub = r#"{"jsonrpc":"2.0","id":1,"method":"resources/subscribe","params":{"uri":"demo://status"}}"#;
        assert_eq!(gw.post(Some(&session), sub).status, 200);
        let mut get = open_get(gw, &session, None);
        let touch = r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"touch_resource","arguments":{"uri":"demo://status"}}}"#;
        assert_eq!(gw.post(Some(&session), touch).status, 200);
        let e = get.expect();
        assert_eq!(event_id(&e).0, 0);
        assert_eq!(
            e.data,
            r#"{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"demo://status"}}"#
        );
    });
}

#[test]
fn resume_of_unknown_stream_gets_400() {
    each_mode(|gw| {
        let session = gw.initialize();
        let r = gw.raw(&gw.get_bytes(&session, &[("last-event-id", "99.3")]));
        assert_eq!(r.status, 400);
        gw.assert_serving();
    });
}
