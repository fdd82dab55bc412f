//! MCP over POST: initialize, requests opened as internal streams, notifications and the
//! agent's answers to server-to-client requests.
//!
//! A request's reply is rendered as `application/json` unless the agent asked for progress
//! or the exit sends an event before the result, in which case it becomes an SSE stream
//! whose events are kept (bounded) for `Last-Event-ID` resume. Result bytes are the
//! exit's, verbatim, wrapped in an envelope echoing the agent's request id lexeme.

use super::auth::rules::ListFilter;
use super::auth::{self, Identity};
use super::edge::{accepts, authorization, http_error, http_error_code, media_type, rpc_error};
use super::lookup;
use super::net::Request;
use super::reply;
use super::session::Session;
use super::shared::{Link, Write, Written};
use super::sink::Sink;
use super::{PROTOCOL_VERSIONS, Server, session_id};
use crate::binding::server::metrics as server_metrics;
use crate::jsonrpc::{self, Envelope, Kind as MsgKind};
use crate::limits::{
    PROGRESS_TOKEN_BYTES_MAX, REQUESTS_PER_SESSION_MAX, SESSION_CAPABILITIES_BYTES_MAX,
    SESSIONS_PER_WORKER_MAX,
};
use crate::log;
use crate::metrics::{self, Outcome};
use crate::runtime::held::Held;

use crate::jsonrpc::{ParamIndex, Raw};
use crate::stream::{self, Begin, Caps, ClientHello, Frame, Kind, Reset, TargetAt, Throttle};
use bytes::{Bytes, BytesMut};
use std::rc::Rc;
use std::time::Instant;

/// The message of a refused `_meta.progressToken` (the limit written out, checked below).
const PROGRESS_TOKEN_TOO_LONG: &str =
    "Invalid params: _meta.progressToken is longer than 1024 bytes";
const _: () = assert!(PROGRESS_TOKEN_BYTES_MAX == 1024);

/// Handles one POST.
pub async fn post(server: Rc<Server>, req: Request, sink: Sink, who: Option<Rc<Identity>>) {
    let json_body = req
        .head
        .headers
        .get("content-type")
        .is_some_and(|v| media_type(v).eq_ignore_ascii_case(b"application/json"));
    if !json_body {
        return http_error(
            sink,
            415,
            "Unsupported Media Type: Content-Type must be application/json",
            None,
        )
        .await;
    }
    if !accepts(&req, true, true) {
        return http_error(
            sink,
            406,
            "Not Acceptable: Accept must list application/json and text/event-stream",
            None,
        )
        .await;
    }
    let env = match jsonrpc::parse_envelope(&req.body) {
        Ok(env) => env,
        Err(e) => return http_error_code(sink, 400, e.code, e.message, e.id.as_deref()).await,
    };
    if env.kind == MsgKind::Request && env.method.as_deref() == Some("initialize") {
        if let (Some(gate), Some(who), Some(id)) = (server.gate.as_ref(), who.as_deref(), env.id)
            && let Err((limit, secs)) = gate.limit(who, "initialize", None)
        {
            return auth::too_many(sink, id.raw, limit, secs).await;
        }
        // Boxed: once per session, and larger than a request's state.
        return Box::pin(initialize(&server, &req, &env, sink, who)).await;
    }
    let session = match lookup::session_for(&server, &req, who.as_deref()).await {
        Ok(s) => s,
        Err((status, message)) => return http_error(sink, status, message, None).await,
    };
    match env.kind {
        MsgKind::Notification => {
            if env.method.as_deref() == Some("notifications/cancelled")
                && let Some(key) = env
                    .params
                    .and_then(|p| jsonrpc::param_raw(p, "requestId"))
                    .and_then(|raw| jsonrpc::id_key_of_raw(raw.get()))
            {
                session.cancel(&key);
            } else if let Some(method) = env.method.as_deref()
                && method != "notifications/cancelled"
                && method != "notifications/initialized"
            {
                let ruled = server
                    .gate
                    .as_ref()
                    .is_some_and(|g| !g.guard.cfg.rules.is_empty());
                if ruled && !KNOWN_CLIENT_NOTIFICATIONS.contains(&method) {
                    // As for requests: under rules what names nothing they can judge is
                    // not forwarded (MCP: a notification not accepted is an HTTP error).
                    return http_error_code(
                        sink,
                        400,
                        jsonrpc::METHOD_NOT_FOUND,
                        "Method not found",
                        None,
                    )
                    .await;
                }
                // Anything else the agent tells the server (roots/list_changed, ...) goes
                // to the exit on the session's lifecycle stream.
                // Copied: they may wait in the lifecycle's queue well past this request,
                // and a slice would keep the connection's whole read buffer with them.
                let params = env
                    .params
                    .map(|p| Bytes::copy_from_slice(p.get().as_bytes()));
                session.notify_exit(method, params);
            }
            let _ = sink.respond(202, &[], b"").await;
        }
        MsgKind::Response | MsgKind::ErrorResponse => {
            if let Some(id) = env.id {
                let result = env
                    .result
                    .map(|r| Bytes::copy_from_slice(r.get().as_bytes()));
                let error = env
                    .error
                    .map(|r| Bytes::copy_from_slice(r.get().as_bytes()));
                session.answer(Bytes::copy_from_slice(id.raw.as_bytes()), result, error);
            }
            let _ = sink.respond(202, &[], b"").await;
        }
        MsgKind::Request => request(server, session, &req, &env, sink, who.as_deref()).await,
    }
}

/// Negotiates the version, opens the session's lifecycle stream and answers once the exit
/// has answered it.
async fn initialize(
    server: &Rc<Server>,
    req: &Request,
    env: &Envelope<'_>,
    sink: Sink,
    who: Option<Rc<Identity>>,
) {
    let started = Instant::now();
    let id = env.id.map_or("null", |i| i.raw);
    let Some(params) = env.params.filter(|p| jsonrpc::raw_is_object(*p)) else {
        return rpc_error(
            sink,
            id,
            jsonrpc::INVALID_PARAMS,
            "Invalid params: initialize needs params",
            None,
        )
        .await;
    };
    let requested = match jsonrpc::param_str(params, "protocolVersion") {
        Ok(Some(v)) => v,
        _ => {
            return rpc_error(
                sink,
                id,
                jsonrpc::INVALID_PARAMS,
                "Invalid params: protocolVersion must be a string",
                None,
            )
            .await;
        }
    };
    let Some(capabilities) =
        jsonrpc::param_raw(params, "capabilities").filter(|c| jsonrpc::raw_is_object(*c))
    else {
        return rpc_error(
            sink,
            id,
            jsonrpc::INVALID_PARAMS,
            "Invalid params: capabilities must be an object",
            None,
        )
        .await;
    };
    if capabilities.get().len() > SESSION_CAPABILITIES_BYTES_MAX {
        return rpc_error(
            sink,
            id,
            jsonrpc::INVALID_PARAMS,
            &format!(
                "Invalid params: capabilities larger than {SESSION_CAPABILITIES_BYTES_MAX} bytes"
            ),
            None,
        )
        .await;
    }
    let version = PROTOCOL_VERSIONS
        .iter()
        .find(|v| **v == requested)
        .copied()
        .unwrap_or(PROTOCOL_VERSIONS[0]);
    let open = server.sessions.borrow().len();
    let Some(opening) = Held::take(&server.opening, open, SESSIONS_PER_WORKER_MAX) else {
        metrics::with(|m| m.overload_rejections += 1);
        return http_error(
            sink,
            503,
            "Service Unavailable: session table full",
            Some(id),
        )
        .await;
    };
    let session_id = match session_id::mint(0, server.worker) {
        Ok(s) => s,
        Err(_) => {
            return http_error(
                sink,
                503,
                "Service Unavailable: no entropy for a session id",
                Some(id),
            )
            .await;
        }
    };
    let hello_capabilities = Bytes::copy_from_slice(capabilities.get().as_bytes());
    let hello = ClientHello {
        capabilities: hello_capabilities.clone(),
        protocol_version: version,
        authorization: authorization(req),
        adopt: None,
        shared: server.shared.is_some(),
    };
    let begin = Begin::lifecycle(hello, Instant::now() + server.cfg.request_timeout);
    let (caller, callee) = stream::open(begin);
    server.exit.open(callee);
    let deadline = tokio::time::sleep(server.cfg.request_timeout);
    let first = tokio::select! {
        biased;
        f = caller.reply.next() => f,
        () = deadline => None,
    };
    let reply = match first {
        Some(Frame::Begin(reply)) => reply,
        _ => {
            server_metrics::record_request("initialize", Outcome::Error, started.elapsed());
            caller.initial.abort();
            let throttle = caller.initial.try_throttle();
            return render_reset(sink, id, throttle, None, who.is_some()).await;
        }
    };
    let owner = who.map(|w| w.subject.clone());
    let link = server
        .shared
        .as_ref()
        .map(|_| Link::new(hello_capabilities, reply.handoff.clone(), owner.clone()));
    let session = Session::create(
        server,
        Rc::from(session_id.as_str()),
        version,
        reply.clone(),
        caller,
        link,
        owner,
    );
    drop(opening);
    // A shared session is in the store before the agent has its id, so its next request
    // finds it at any node. A store that fails leaves it served by this node only.
    if session.write_record(server, Write::Create, true).await != Written::Done {
        log::warn(format_args!(
            "server {}: a session is served by this node only (its record was not written)",
            server.name
        ));
    }
    let mut body = BytesMut::with_capacity(512);
    jsonrpc::write_result_prefix(id, &mut body);
    body.extend_from_slice(b"{\"protocolVersion\":\"");
    body.extend_from_slice(version.as_bytes());
    body.extend_from_slice(b"\",\"capabilities\":");
    write_caps(reply.caps, &mut body);
    body.extend_from_slice(b",\"serverInfo\":{\"name\":\"mcpyard\",\"version\":\"");
    body.extend_from_slice(env!("CARGO_PKG_VERSION").as_bytes());
    body.extend_from_slice(b"\"}");
    if let Some(instructions) = &reply.instructions {
        body.extend_from_slice(b",\"instructions\":");
        body.extend_from_slice(instructions);
    }
    body.extend_from_slice(b"}");
    jsonrpc::write_result_suffix(&mut body);
    let headers: [(&str, &[u8]); 2] = [
        ("content-type", b"application/json"),
        ("mcp-session-id", session.id.as_bytes()),
    ];
    server_metrics::record_request("initialize", Outcome::Ok, started.elapsed());
    let _ = sink.respond(200, &headers, &body).await;
}

/// Renders the exit's capability bits as the MCP `capabilities` object.
fn write_caps(caps: Caps, out: &mut BytesMut) {
    let mut members: Vec<String> = Vec::with_capacity(5);
    let flag = |c: Caps| caps.contains(c);
    if flag(Caps::TOOLS) {
        members.push(format!(
            "\"tools\":{{\"listChanged\":{}}}",
            flag(Caps::TOOLS_LIST_CHANGED)
        ));
    }
    if flag(Caps::PROMPTS) {
        members.push(format!(
            "\"prompts\":{{\"listChanged\":{}}}",
            flag(Caps::PROMPTS_LIST_CHANGED)
        ));
    }
    if flag(Caps::RESOURCES) {
        members.push(format!(
            "\"resources\":{{\"subscribe\":{},\"listChanged\":{}}}",
            flag(Caps::RESOURCES_SUBSCRIBE),
            flag(Caps::RESOURCES_LIST_CHANGED)
        ));
    }
    if flag(Caps::LOGGING) {
        members.push("\"logging\":{}".to_owned());
    }
    if flag(Caps::COMPLETIONS) {
        members.push("\"completions\":{}".to_owned());
    }
    out.extend_from_slice(b"{");
    out.extend_from_slice(members.join(",").as_bytes());
    out.extend_from_slice(b"}");
}

/// The notifications an agent may send besides `initialized` and `cancelled` (which the
/// gateway handles): under `auth` rules, only these are forwarded.
const KNOWN_CLIENT_NOTIFICATIONS: [&str; 2] =
    ["notifications/roots/list_changed", "notifications/progress"];

/// Renders a RESET (or a missing answer) from the exit on a response not yet started.
async fn render_reset(
    sink: Sink,
    id: &str,
    throttle: Option<Throttle>,
    session: Option<&str>,
    authenticated: bool,
) {
    match throttle {
        Some(Throttle::Reset(Reset::Error {
            code,
            message,
            data,
        })) => {
            let mut body = BytesMut::with_capacity(128 + message.len());
            jsonrpc::write_error(Some(id), code, &message, data.as_deref(), &mut body);
            let mut headers: Vec<(&str, &[u8])> = vec![("content-type", b"application/json")];
            if let Some(s) = session {
                headers.push(("mcp-session-id", s.as_bytes()));
            }
            let _ = sink.respond(200, &headers, &body).await;
        }
        Some(Throttle::Reset(Reset::Bearer(challenge))) => {
            let _ = reply::respond_challenge(sink, id, &challenge, authenticated, session).await;
        }
        _ => rpc_error(sink, id, jsonrpc::INTERNAL_ERROR, "Internal error", session).await,
    }
}

/// Opens an internal stream for one request and renders its reply.
async fn request(
    server: Rc<Server>,
    session: Rc<Session>,
    req: &Request,
    env: &Envelope<'_>,
    sink: Sink,
    who: Option<&Identity>,
) {
    // The clock itself: pipelined requests may be served in one poll, and each one's
    // latency starts at its own start.
    let started = Instant::now();
    let Some(id) = env.id else { return };
    let method = env.method.as_deref().unwrap_or_default();
    if method == "ping" {
        let mut body = BytesMut::with_capacity(64);
        jsonrpc::write_result(id.raw, b"{}", &mut body);
        server_metrics::record_request("ping", Outcome::Ok, started.elapsed());
        let headers: [(&str, &[u8]); 2] = [
            ("content-type", b"application/json"),
            ("mcp-session-id", session.id.as_bytes()),
        ];
        let _ = sink.respond(200, &headers, &body).await;
        return;
    }
    let kind = match Kind::from_method(method) {
        Some(k) if session.caps.contains(k.capability()) => k,
        // A method mcpyard does not know goes to an exit that forwards such methods.
        None if session.caps.contains(Caps::OTHER) && !method.starts_with("notifications/") => {
            Kind::Other
        }
        _ => {
            server_metrics::record_request("other", Outcome::Rejected, started.elapsed());
            return rpc_error(
                sink,
                id.raw,
                jsonrpc::METHOD_NOT_FOUND,
                "Method not found",
                Some(&session.id),
            )
            .await;
        }
    };
    let target = match target_of(kind, env.params, &env.index) {
        Ok(target) => target,
        Err(message) => {
            server_metrics::record_request(method, Outcome::Rejected, started.elapsed());
            return rpc_error(
                sink,
                id.raw,
                jsonrpc::INVALID_PARAMS,
                message,
                Some(&session.id),
            )
            .await;
        }
    };
    if env
        .index
        .progress_token
        .is_some_and(|t| t.get().len() > PROGRESS_TOKEN_BYTES_MAX)
    {
        server_metrics::record_request(method, Outcome::Rejected, started.elapsed());
        return rpc_error(
            sink,
            id.raw,
            jsonrpc::INVALID_PARAMS,
            PROGRESS_TOKEN_TOO_LONG,
            Some(&session.id),
        )
        .await;
    }
    let gate = server.gate.as_ref().zip(who);
    if let Some((gate, who)) = gate {
        // Counted first, so that probing for hidden names costs a caller its rate too.
        let called = target.as_ref().map(|(name, _)| &**name);
        if let Err((limit, secs)) = gate.limit(who, method, called) {
            server_metrics::record_request(method, Outcome::Rejected, started.elapsed());
            return auth::too_many(sink, id.raw, limit, secs).await;
        }
        if let Some((code, message)) =
            auth::rules::refusal(&gate.guard.cfg.rules, who.admits, kind, &target)
        {
            server_metrics::record_request(method, Outcome::Rejected, started.elapsed());
            return rpc_error(sink, id.raw, code, &message, Some(&session.id)).await;
        }
    }
    let filter =
        gate.and_then(|(gate, who)| ListFilter::new(&gate.guard.cfg.rules, who.admits, kind));
    // MCP: an id is not reused within a session; one in flight is refused before the
    // session's bound is counted.
    let key = id.key();
    let refusal = if session.in_flight(&key) {
        Some((
            jsonrpc::INVALID_REQUEST,
            "Invalid Request: a request with this id is in flight on this session",
        ))
    } else if session.request_count() >= REQUESTS_PER_SESSION_MAX {
        metrics::with(|m| m.overload_rejections += 1);
        Some((
            jsonrpc::INTERNAL_ERROR,
            "Too many requests in flight on this session",
        ))
    } else {
        None
    };
    if let Some((code, message)) = refusal {
        server_metrics::record_request(method, Outcome::Rejected, started.elapsed());
        return rpc_error(sink, id.raw, code, message, Some(&session.id)).await;
    }
    let mut params = env
        .params
        .map(|p| req.body.slice_ref(p.get().as_bytes()))
        .unwrap_or_default();
    let progress_token = env
        .index
        .progress_token
        .map(|t| req.body.slice_ref(t.get().as_bytes()));
    let (target, target_at) = target.unzip();
    let begin = Begin {
        kind,
        session: session.exit_session.clone(),
        target,
        target_at,
        method: (kind == Kind::Other).then(|| Rc::from(method)),
        params_len: params.len() as u32,
        deadline: started + server.cfg.request_timeout,
        progress_token: progress_token.clone(),
        client: None,
        authorization: authorization(req),
    };
    let deadline = begin.deadline;
    let (caller, callee) = stream::open(begin);
    // The exit's work runs in this task, beside the caller's end: no task per request.
    let serving = server.exit.serve(callee);
    let inflight = session.register(key, req.body.slice_ref(id.raw.as_bytes()), caller);
    // The params are queued before the exit looks for them (as far as the window takes
    // them, which is all of them but for a large request), so the exit writes the upstream
    // request in one piece instead of head, params and tail.
    let _ = inflight.caller.initial.try_data(&mut params);
    let calling = async {
        // If the exit refuses the params (Gone) its RESET is rendered from the reply below.
        if !params.is_empty() {
            let _ = inflight.caller.initial.data(params).await;
        }
        let outcome = reply::pump(
            &session,
            &inflight,
            sink,
            progress_token.is_some(),
            deadline,
            filter,
        )
        .await;
        // Done with the caller's end here, not after the exit's work: an exit still
        // waiting on its upstream after the agent left must not hold the session's slot.
        session.unregister(&inflight);
        drop(inflight);
        server_metrics::record_request(kind.method(), outcome, started.elapsed());
    };
    // The exit first, the reply pump after it: what the exit sends in a poll is rendered
    // to the agent in the same poll (its wake of the pump is then dropped, see
    // `runtime::pass`).
    tokio::join!(biased; async {
        if let Some(serving) = serving {
            serving.await;
        }
    }, calling);
}

/// The name or uri a request acts on, decoded, and where its raw lexeme sits in `params`:
/// `params.name` (tools/call, prompts/get), `params.uri` (resources/read, subscribe,
/// unsubscribe), `params.ref.name` or `params.ref.uri` (completion/complete, by the
/// reference's type). `Err` names what is wrong when a required target is missing or
/// not a string; completion references are left to the exit to judge.
pub(crate) fn target_of(
    kind: Kind,
    params: Option<Raw<'_>>,
    index: &ParamIndex<'_>,
) -> Result<Option<(Rc<str>, TargetAt)>, &'static str> {
    let (found, uri) = match (kind, params) {
        (Kind::ToolsCall | Kind::PromptsGet, Some(_)) => (index.name, false),
        (Kind::ToolsCall | Kind::PromptsGet, None) => {
            return Err("Invalid params: name must be a string");
        }
        (Kind::ResourcesRead | Kind::ResourcesSubscribe | Kind::ResourcesUnsubscribe, Some(_)) => {
            (index.uri, true)
        }
        (Kind::ResourcesRead | Kind::ResourcesSubscribe | Kind::ResourcesUnsubscribe, None) => {
            return Err("Invalid params: uri must be a string");
        }
        (Kind::CompletionComplete, Some(_)) => {
            let Some(reference) = index.reference else {
                return Ok(None);
            };
            match jsonrpc::param_str(reference, "type") {
                Ok(Some(t)) if t == "ref/prompt" => (jsonrpc::param_raw(reference, "name"), false),
                Ok(Some(t)) if t == "ref/resource" => (jsonrpc::param_raw(reference, "uri"), true),
                _ => return Ok(None),
            }
        }
        _ => return Ok(None),
    };
    let required = kind != Kind::CompletionComplete;
    let missing = if uri {
        "Invalid params: uri must be a string"
    } else {
        "Invalid params: name must be a string"
    };
    let decoded = found.and_then(|raw| Some((raw.as_str()?, raw.get())));
    let (value, raw) = match decoded {
        Some((v, raw)) => (Rc::<str>::from(v.as_ref()), raw),
        None if required => return Err(missing),
        None => return Ok(None),
    };
    // Both are slices of the same request body: the lexeme's offset in `params` is the
    // distance between their starts.
    let Some(whole) = params else {
        return Ok(None);
    };
    let Some(start) = (raw.as_ptr() as usize).checked_sub(whole.get().as_ptr() as usize) else {
        return Ok(None);
    };
    let end = start + raw.len();
    assert!(end <= whole.get().len());
    let at = TargetAt {
        start: start as u32,
        end: end as u32,
        uri,
    };
    Ok(Some((value, at)))
}
