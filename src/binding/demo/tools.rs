//! The demo's tools: the built-in catalog, the echo tools added at run time, and
//! `tools/call`.
//!
//! A call names a tool that does not exist: JSON-RPC `-32602`. A call whose arguments a
//! tool refuses: a normal result with `isError: true`, so the agent's model can read why
//! and retry (MCP 2025-11-25, tools: "Error Handling").

use super::json::{self, Args, Failure, clip, push_str, structured_result, text_result};
use super::resources;
use super::session::{Level, Session};
use super::{Cx, DemoShared, Halt, Worker};
use crate::stream::{Event, Flush, Gone};
use bytes::Bytes;
use simd_json::BorrowedValue;
use simd_json::prelude::*;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use tokio::time::{Instant, sleep, sleep_until};

/// Tools that `add_tool` may add; more are refused with an error result.
pub(super) const ADDED_TOOLS_MAX: usize = 32;

/// Longest name of a run-time tool (names are `[a-z0-9_]{1,32}`).
const TOOL_NAME_BYTES_MAX: usize = 32;

/// Most steps of the `progress` tool, and its default.
const PROGRESS_STEPS_MAX: u64 = 100;

/// Longest `message` the `log` tool sends: the session keeps its notifications for replay,
/// so an agent's megabytes would be kept (and sent again) many times over.
const LOG_MESSAGE_BYTES_MAX: usize = 256 * 1024;
const PROGRESS_STEPS_DEFAULT: u64 = 5;

const _: () = assert!(PROGRESS_STEPS_DEFAULT <= PROGRESS_STEPS_MAX);
const _: () = assert!(
    LOG_MESSAGE_BYTES_MAX == 256 * 1024,
    "the refusal's text names it"
);
// A whole run of progress events (plus the reply's BEGIN) fits in the reply's frame
// queue, so a caller that drains only at the end never makes the tool wait for room.
const _: () = assert!((PROGRESS_STEPS_MAX as usize) < crate::limits::STREAM_FRAMES_MAX);

/// Names of the built-in tools, in catalog order.
pub(super) const BUILTIN: [&str; 7] = [
    "echo",
    "add",
    "progress",
    "add_tool",
    "remove_tool",
    "touch_resource",
    "log",
];

/// The built-in tool definitions, comma-separated, in [`BUILTIN`] order.
const BUILTIN_JSON: &str = concat!(
    r#"{"name":"echo","title":"Echo","description":"Returns its text argument unchanged.","#,
    r#""inputSchema":{"type":"object","properties":{"text":{"type":"string","#,
    r#""description":"The text to return."}},"required":["text"]}},"#,
    r#"{"name":"add","title":"Add","description":"Adds two numbers.","#,
    r#""inputSchema":{"type":"object","properties":{"a":{"type":"number"},"#,
    r#""b":{"type":"number"}},"required":["a","b"]},"#,
    r#""outputSchema":{"type":"object","properties":{"sum":{"type":"number"}},"#,
    r#""required":["sum"]}},"#,
    r#"{"name":"progress","title":"Progress","#,
    r#""description":"Works through paced steps, reporting progress after each one when "#,
    r#"the request carries a progressToken.","#,
    r#""inputSchema":{"type":"object","properties":{"steps":{"type":"integer","#,
    r#""minimum":1,"maximum":100,"default":5,"description":"How many steps to take."}}}},"#,
    r#"{"name":"add_tool","title":"Add a tool","#,
    r#""description":"Adds a tool that echoes its text argument, and tells every session "#,
    r#"that the tool list changed.","#,
    r#""inputSchema":{"type":"object","properties":{"name":{"type":"string","#,
    r#""pattern":"^[a-z0-9_]{1,32}$","description":"The new tool's name."}},"#,
    r#""required":["name"]}},"#,
    r#"{"name":"remove_tool","title":"Remove a tool","#,
    r#""description":"Removes a tool added by add_tool, and tells every session that the "#,
    r#"tool list changed.","#,
    r#""inputSchema":{"type":"object","properties":{"name":{"type":"string","#,
    r#""description":"The tool to remove."}},"required":["name"]}},"#,
    r#"{"name":"touch_resource","title":"Touch a resource","#,
    r#""description":"Marks a resource as updated: sessions subscribed to it are notified "#,
    r#"and the counter in demo://status goes up.","#,
    r#""inputSchema":{"type":"object","properties":{"uri":{"type":"string","#,
    r#""description":"The resource's uri, e.g. demo://status."}},"required":["uri"]}},"#,
    r#"{"name":"log","title":"Log","#,
    r#""description":"Sends a log message to this session if its level passes the level "#,
    r#"set with logging/setLevel.","#,
    r#""inputSchema":{"type":"object","properties":{"level":{"type":"string","#,
    r#""enum":["debug","info","notice","warning","error","critical","alert","emergency"]},"#,
    r#""message":{"type":"string"}},"required":["level","message"]}}"#,
);

/// `tools/list`: the built-in tools, then the run-time ones (the list is not paginated).
pub(super) fn list(shared: &DemoShared) -> Bytes {
    let added = shared.added_tools();
    let mut out = Vec::with_capacity(BUILTIN_JSON.len() + 16 + added.len() * 256);
    out.extend_from_slice(br#"{"tools":["#);
    out.extend_from_slice(BUILTIN_JSON.as_bytes());
    for name in added.iter() {
        out.extend_from_slice(br#",{"name":"#);
        push_str(&mut out, name);
        out.extend_from_slice(
            concat!(
                r#","description":"Added at run time by add_tool: returns its text argument.","#,
                r#""inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"#,
                r#""required":["text"]}}"#,
            )
            .as_bytes(),
        );
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

/// `tools/call`: runs the named tool; `Ok` is its result (possibly `isError`).
pub(super) async fn call(cx: &Cx<'_>, params: &BorrowedValue<'_>) -> Result<Bytes, Halt> {
    let target = cx.callee.begin.target.as_deref();
    let Some(name) = json::name_or_target(params, "name", target) else {
        return Err(Failure::invalid_params("Missing tool name").into());
    };
    let args = Args::of(params, "arguments")?;
    let result = match name {
        "echo" => echo("echo", args),
        "add" => add(args),
        "progress" => return progress(cx, args).await,
        "add_tool" => add_tool(&cx.worker.shared, args),
        "remove_tool" => remove_tool(&cx.worker.shared, args),
        "touch_resource" => touch_resource(cx.worker, args),
        "log" => log(cx.session, args),
        _ if cx.worker.shared.added_tools().iter().any(|t| **t == *name) => echo(name, args),
        _ => {
            let message = format!("Unknown tool: {}", clip(name));
            return Err(Failure::invalid_params(message).into());
        }
    };
    Ok(result)
}

/// `echo` and every run-time tool: returns `text`.
fn echo(tool: &str, args: Args<'_, '_>) -> Bytes {
    match args.str("text") {
        Some(text) => text_result(text, false),
        None => text_result(&format!("{tool}: argument `text` must be a string"), true),
    }
}

/// `add`: `a + b`, exact for integers that do not overflow, else in floating point.
fn add(args: Args<'_, '_>) -> Bytes {
    let (Some(a), Some(b)) = (args.get("a"), args.get("b")) else {
        return text_result("add: arguments `a` and `b` are required numbers", true);
    };
    let exact = match (a.as_i64(), b.as_i64()) {
        (Some(a), Some(b)) => a.checked_add(b).map(|sum| sum.to_string()),
        _ => None,
    };
    let sum = exact.or_else(|| {
        let sum = a.cast_f64()? + b.cast_f64()?;
        serde_json::Number::from_f64(sum).map(|n| n.to_string())
    });
    let Some(sum) = sum else {
        return text_result("add: `a` and `b` must be numbers with a finite sum", true);
    };
    let structured = format!(r#"{{"sum":{sum}}}"#);
    structured_result(&sum, false, Some(structured.as_bytes()))
}

/// `progress`: `steps` paced steps, a FLUSH after each when the agent gave a token.
async fn progress(cx: &Cx<'_>, args: Args<'_, '_>) -> Result<Bytes, Halt> {
    let steps = match args.get("steps") {
        None => Some(PROGRESS_STEPS_DEFAULT),
        Some(v) => v.as_u64().filter(|s| (1..=PROGRESS_STEPS_MAX).contains(s)),
    };
    let Some(steps) = steps else {
        let text = format!("progress: `steps` must be an integer from 1 to {PROGRESS_STEPS_MAX}");
        return Ok(text_result(&text, true));
    };
    let token = cx
        .callee
        .begin
        .progress_token
        .as_ref()
        .filter(|t| is_token(t));
    cx.reply.open().await?;
    for step in 1..=steps {
        if step > 1 {
            pause(cx).await?;
        }
        if let Some(token) = token {
            let flush = Flush {
                id: Some(Rc::from(step.to_string())),
                event: Event::Progress {
                    params: progress_params(token, step, steps),
                },
            };
            cx.reply.flush(flush).await?;
        }
    }
    Ok(text_result(&format!("done after {steps} steps"), false))
}

/// True if `token` is a JSON string or number lexeme, as MCP requires of a
/// `progressToken`; anything else is not spliced into our JSON.
fn is_token(token: &Bytes) -> bool {
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(token) else {
        return false;
    };
    value.is_string() || value.is_number()
}

/// `notifications/progress` params for one step.
fn progress_params(token: &[u8], step: u64, steps: u64) -> Bytes {
    let mut out = Vec::with_capacity(token.len() + 96);
    out.extend_from_slice(br#"{"progressToken":"#);
    out.extend_from_slice(token);
    let rest =
        format!(r#","progress":{step},"total":{steps},"message":"step {step} of {steps}"}}"#);
    out.extend_from_slice(rest.as_bytes());
    Bytes::from(out)
}

/// Waits one progress interval. `Err(Gone)` if meanwhile the caller went away (reset or
/// dropped the reply, or ended the initial direction early) or the deadline passed.
async fn pause(cx: &Cx<'_>) -> Result<(), Gone> {
    let deadline = Instant::from_std(cx.callee.begin.deadline);
    tokio::select! {
        () = sleep(cx.worker.shared.progress_interval) => {}
        () = sleep_until(deadline) => return Err(Gone),
        // Only END or ABORT can follow the params, and the caller sends either only once
        // it stopped waiting for this reply.
        _ = cx.callee.initial.next() => return Err(Gone),
    }
    if cx.callee.reply.is_refused() {
        return Err(Gone);
    }
    Ok(())
}

/// True if `name` is a valid run-time tool name: `[a-z0-9_]{1,32}`.
fn is_tool_name(name: &str) -> bool {
    (1..=TOOL_NAME_BYTES_MAX).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// `add_tool`: adds an echo tool called `name` for every session on every worker.
fn add_tool(shared: &DemoShared, args: Args<'_, '_>) -> Bytes {
    let Some(name) = args.str("name").filter(|n| is_tool_name(n)) else {
        return text_result("add_tool: `name` must match [a-z0-9_]{1,32}", true);
    };
    let added = shared.change_tools(|tools| {
        if BUILTIN.contains(&name) || tools.iter().any(|t| **t == *name) {
            return Err(format!("add_tool: a tool named {name} already exists"));
        }
        if tools.len() >= ADDED_TOOLS_MAX {
            return Err(format!(
                "add_tool: at most {ADDED_TOOLS_MAX} tools can be added"
            ));
        }
        let mut next = tools.clone();
        next.push(Box::from(name));
        Ok(next)
    });
    match added {
        Ok(()) => text_result(&format!("added tool {name}"), false),
        Err(text) => text_result(&text, true),
    }
}

/// `remove_tool`: removes a tool added by `add_tool`.
fn remove_tool(shared: &DemoShared, args: Args<'_, '_>) -> Bytes {
    let Some(name) = args.str("name") else {
        return text_result("remove_tool: argument `name` must be a string", true);
    };
    let removed = shared.change_tools(|tools| {
        if BUILTIN.contains(&name) {
            return Err(format!("remove_tool: {name} is built in"));
        }
        if !tools.iter().any(|t| **t == *name) {
            return Err(format!("remove_tool: no tool named {}", clip(name)));
        }
        Ok(tools.iter().filter(|t| ***t != *name).cloned().collect())
    });
    match removed {
        Ok(()) => text_result(&format!("removed tool {name}"), false),
        Err(text) => text_result(&text, true),
    }
}

/// `touch_resource`: bumps the status counter and notifies this worker's sessions that
/// subscribed to `uri` (a session and its subscriptions live on one worker).
fn touch_resource(worker: &Worker, args: Args<'_, '_>) -> Bytes {
    let Some(uri) = args.str("uri") else {
        return text_result("touch_resource: argument `uri` must be a string", true);
    };
    if resources::resolve(uri).is_none() {
        let text = format!("touch_resource: no resource {}", clip(uri));
        return text_result(&text, true);
    }
    worker.shared.touches.fetch_add(1, Ordering::Relaxed);
    let mut params = Vec::with_capacity(uri.len() + 10);
    params.extend_from_slice(br#"{"uri":"#);
    push_str(&mut params, uri);
    params.push(b'}');
    let params = Bytes::from(params);
    let mut notified = 0usize;
    for session in worker.sessions.borrow().values() {
        if session.is_subscribed(uri) {
            let event = Event::ResourcesUpdated {
                params: params.clone(),
            };
            notified += usize::from(session.post(event));
        }
    }
    text_result(
        &format!("touched {uri}: notified {notified} session(s)"),
        false,
    )
}

/// `log`: a `notifications/message` on the calling session, if its level passes.
fn log(session: &Session, args: Args<'_, '_>) -> Bytes {
    let (Some(level), Some(message)) = (args.str("level"), args.str("message")) else {
        return text_result("log: arguments `level` and `message` must be strings", true);
    };
    let Some(level) = Level::parse(level) else {
        return text_result("log: `level` must be an RFC 5424 level name", true);
    };
    if message.len() > LOG_MESSAGE_BYTES_MAX {
        return text_result("log: `message` is longer than 256 KiB", true);
    }
    if level < session.level() {
        let text = format!(
            "not sent: below the session level {}",
            session.level().name()
        );
        return text_result(&text, false);
    }
    let mut params = Vec::with_capacity(message.len() + 48);
    params.extend_from_slice(br#"{"level":""#);
    params.extend_from_slice(level.name().as_bytes());
    params.extend_from_slice(br#"","logger":"demo","data":"#);
    push_str(&mut params, message);
    params.push(b'}');
    let event = Event::Notification {
        method: Rc::from("notifications/message"),
        params: Some(Bytes::from(params)),
    };
    if session.post(event) {
        text_result(&format!("logged at {}", level.name()), false)
    } else {
        text_result("log: the session's event queue is full", true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalog_is_valid_json_in_builtin_order() {
        let catalog: serde_json::Value =
            serde_json::from_str(&format!("[{BUILTIN_JSON}]")).expect("catalog JSON");
        let names: Vec<&str> = catalog
            .as_array()
            .expect("array")
            .iter()
            .map(|t| t["name"].as_str().expect("name"))
            .collect();
        assert_eq!(names, BUILTIN);
        for tool in catalog.as_array().expect("array") {
            assert_eq!(tool["inputSchema"]["type"], "object");
            assert!(tool["description"].is_string());
        }
    }

    #[test]
    fn tool_names_follow_the_pattern() {
        assert!(is_tool_name("a"));
        assert!(is_tool_name("shout_2"));
        assert!(is_tool_name(&"x".repeat(TOOL_NAME_BYTES_MAX)));
        for bad in ["", "Upper", "dash-ed", "sp ace", "é", &"x".repeat(33)] {
            assert!(!is_tool_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn progress_tokens_must_be_strings_or_numbers() {
        assert!(is_token(&Bytes::from_static(b"\"t\"")));
        assert!(is_token(&Bytes::from_static(b"-7")));
        for bad in [&b"{}"[..], b"null", b"\"open", b"1,\"x\":2"] {
            assert!(!is_token(&Bytes::copy_from_slice(bad)));
        }
    }
}
