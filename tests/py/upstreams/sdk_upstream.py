"""A real upstream MCP server built on the official Python SDK's low-level `Server`.

The gateway tests put it behind mcpyard's `client` binding and also talk to it directly, so
every behaviour a transparent gateway must carry is here: paginated lists (two items a page,
so every list really has several pages and `nextCursor`s), progress, elicitation, logging,
subscriptions, list_changed on the GET stream, cancellation that the test can observe from
the upstream's side, and an SSE stream the upstream drops on purpose (resumable mode).

Run: `python sdk_upstream.py --mode json|sse|sse-resumable [--name NAME] [--token TOKEN]
[--port PORT] [--list-delay SECONDS] [--tls-cert PEM --tls-key PEM]` (with a certificate it
serves https and says so in its `listening` line).
It binds 127.0.0.1 port 0 and prints one line, `listening http://127.0.0.1:<port>/mcp`,
once connections are accepted. `--name` is what the `whoami` tool answers (proxy tests run
several of these side by side); `--token` makes every request need
`Authorization: Bearer TOKEN`, and answers any other request 401 with a Bearer challenge.

Modes:
- `json`: every POST is answered with one `application/json` body; request-scoped
  notifications (progress) have no wire and are dropped by the SDK.
- `sse`: every POST is answered with an SSE stream; no event ids, no resumption.
- `sse-resumable`: SSE with an in-memory event store: event ids, a priming event, `retry`,
  replay after `Last-Event-ID`, and `slow_progress(drop_at=k)` closing the stream mid-call.

Only the SDK's public API is used, except `stream_entry` (see `wait_stream`).
"""

from __future__ import annotations

import argparse
import base64
import itertools
import json
import logging
import socket
import sys
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import uvicorn
from mcp import types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.session import ServerSession
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

# logging/setLevel and resources/subscribe are current in 2025-11-25, which this upstream
# speaks; the SDK warns only because the 2026 protocol drops them.
warnings.filterwarnings("ignore", category=MCPDeprecationWarning)

PATH = "/mcp"
PAGE_SIZE = 2
# How long a notifying tool waits for the target session's GET stream to be open before it
# sends anyway (a notification sent with no GET stream open is lost, by the specification).
GET_STREAM_WAIT_S = 3.0
# Suggested reconnect delay (SSE `retry:`) in resumable mode, in milliseconds.
RETRY_MS = 100
# Longest a paused `slow_progress` waits for its `release`.
PAUSE_MAX_S = 15.0
LOG_LEVELS = ["debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"]


# --- Event store (resumable mode) --------------------------------------------------------


class MemoryEventStore(EventStore):
    """Keeps every event of every stream in memory, in order; ids are `<stream>/<seq>`.

    The sequence is global, so ids are unique across all streams of all sessions; the
    stream part lets a `Last-Event-ID` name its stream (MCP: replay only that stream).
    """

    def __init__(self) -> None:
        self._events: list[tuple[str, str, types.JSONRPCMessage | None]] = []
        self._seq = itertools.count(1)

    async def store_event(self, stream_id: str, message: types.JSONRPCMessage | None) -> str:
        event_id = f"{stream_id}/{next(self._seq)}"
        self._events.append((event_id, stream_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        index = next((i for i, (eid, _, _) in enumerate(self._events) if eid == last_event_id), None)
        if index is None:
            return None
        stream_id = self._events[index][1]
        # By index over the live list, not a slice: events stored while the replay is being
        # sent are replayed too.
        i = index + 1
        while i < len(self._events):
            event_id, sid, message = self._events[i]
            if sid == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
            i += 1
        return stream_id


# --- Shared state ------------------------------------------------------------------------


@dataclass
class GetStreams:
    """Which sessions have their standalone GET stream open right now (seen by the ASGI
    wrapper below), with an event to await the opening."""

    opened: dict[str, anyio.Event] = field(default_factory=dict)
    depth: dict[str, int] = field(default_factory=dict)

    def event(self, sid: str) -> anyio.Event:
        return self.opened.setdefault(sid, anyio.Event())

    def on_open(self, sid: str) -> None:
        self.depth[sid] = self.depth.get(sid, 0) + 1
        self.event(sid).set()

    def on_close(self, sid: str) -> None:
        self.depth[sid] = self.depth.get(sid, 1) - 1
        if self.depth[sid] <= 0:
            self.opened[sid] = anyio.Event()

    async def wait_open(self, sid: str | None, timeout_s: float = GET_STREAM_WAIT_S) -> bool:
        if sid is None:
            return False
        with anyio.move_on_after(timeout_s):
            await self.event(sid).wait()
            return True
        return False


@dataclass
class SessionStats:
    """Sessions the upstream opened (initialize answered with a session id) and the ones a
    client ended with DELETE; `changed` wakes whoever waits for a count."""

    opened: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def bump(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()


@dataclass
class Sleep:
    """One `sleep` call, by the caller's tag: `running`, then `finished` or `cancelled`."""

    status: str = "running"
    done: anyio.Event = field(default_factory=anyio.Event)


@dataclass
class Paused:
    """A `slow_progress` call waiting for `release(tag)`: its session, its request id, and
    the SDK's entry for its SSE stream when it paused (a resume replaces the entry)."""

    sid: str | None
    request_id: Any
    stream: Any = None
    released: anyio.Event = field(default_factory=anyio.Event)


@dataclass
class State:
    mode: str
    name: str = "sdk-upstream"
    sessions: dict[str, ServerSession] = field(default_factory=dict)
    log_levels: dict[str, str] = field(default_factory=dict)
    subscriptions: dict[str, set[str]] = field(default_factory=dict)
    dynamic_tools: list[str] = field(default_factory=list)
    sleeps: dict[str, Sleep] = field(default_factory=dict)
    sleep_started: dict[str, anyio.Event] = field(default_factory=dict)
    touches: dict[str, int] = field(default_factory=dict)
    paused: dict[str, Paused] = field(default_factory=dict)
    get_streams: GetStreams = field(default_factory=GetStreams)
    stats: SessionStats = field(default_factory=SessionStats)
    # List requests served, by kind (the cache tests count upstream round trips with it).
    lists: dict[str, int] = field(default_factory=dict)
    # Each list request waits this long first (a slow upstream).
    list_delay_s: float = 0.0
    server: Server | None = None


STATE: State  # set in main()


def session_id_of(ctx: Any) -> str | None:
    request = ctx.request
    return request.headers.get("mcp-session-id") if request is not None else None


def remember(ctx: Any) -> str | None:
    """Keeps the caller's session so notifications can reach it later on its GET stream."""
    sid = session_id_of(ctx)
    if sid is not None:
        STATE.sessions[sid] = ctx.session
    return sid


# --- Catalogue ---------------------------------------------------------------------------


def obj_schema(props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required}


STR = {"type": "string"}
NUM = {"type": "number"}
INT = {"type": "integer"}

STATIC_TOOLS: list[types.Tool] = [
    types.Tool(name="echo", description="Returns its text.", input_schema=obj_schema({"text": STR}, ["text"])),
    types.Tool(
        name="add",
        description="Adds two numbers.",
        input_schema=obj_schema({"a": NUM, "b": NUM}, ["a", "b"]),
        output_schema=obj_schema({"sum": NUM}, ["sum"]),
    ),
    types.Tool(
        name="slow_progress",
        description="Counts to `steps`, one progress notification a step. `drop_at`: close the SSE response after that step (resumable mode). `pause_at`: after that step wait for `release(tag)`.",
        input_schema=obj_schema({"steps": INT, "interval_ms": INT, "drop_at": INT, "pause_at": INT, "tag": STR}, ["steps"]),
    ),
    types.Tool(
        name="release",
        description="Lets the `slow_progress` call paused under `tag` go on; with `after_resume`, first waits until its SSE stream was dropped by the client and resumed. With `until_dropped`, only waits until the dropped stream is gone and lets nothing go on.",
        input_schema=obj_schema(
            {"tag": STR, "after_resume": {"type": "boolean"}, "until_dropped": {"type": "boolean"}}, ["tag"]
        ),
    ),
    types.Tool(
        name="elicit_name",
        description="Asks the client for a name (elicitation/create) and returns the answer; `via` is `request` (the call's own stream) or `standalone` (the GET stream).",
        input_schema=obj_schema({"via": {"type": "string", "enum": ["request", "standalone"]}}, []),
    ),
    types.Tool(
        name="sleep",
        description="Sleeps; the upstream records under `tag` whether it finished or was cancelled.",
        input_schema=obj_schema({"seconds": NUM, "tag": STR}, ["seconds", "tag"]),
    ),
    types.Tool(
        name="sleep_status",
        description="The state of the `sleep` call with this tag (unknown, running, finished, cancelled), waiting up to `wait_s` until it has `started` or `ended` (`until`).",
        input_schema=obj_schema({"tag": STR, "until": {"type": "string", "enum": ["started", "ended"]}, "wait_s": NUM}, ["tag"]),
    ),
    types.Tool(
        name="add_tool",
        description="Registers an echo tool and sends notifications/tools/list_changed.",
        input_schema=obj_schema({"name": STR}, ["name"]),
    ),
    types.Tool(
        name="remove_tool",
        description="Removes a registered tool and sends notifications/tools/list_changed.",
        input_schema=obj_schema({"name": STR}, ["name"]),
    ),
    types.Tool(
        name="touch",
        description="Changes a resource and sends notifications/resources/updated to its subscribers.",
        input_schema=obj_schema({"uri": STR}, ["uri"]),
    ),
    types.Tool(
        name="log",
        description="Sends notifications/message on the GET stream if the session's level allows it.",
        input_schema=obj_schema({"level": {"type": "string", "enum": LOG_LEVELS}, "message": STR}, ["level", "message"]),
    ),
    types.Tool(
        name="fail",
        description="Answers with the JSON-RPC error given.",
        input_schema=obj_schema({"code": INT, "message": STR, "data": {}}, ["code", "message"]),
    ),
    types.Tool(
        name="upstream_stats",
        description="The session ids opened and deleted so far, in order; waits up to `wait_s` until every id in `await_deleted` was deleted.",
        input_schema=obj_schema({"await_deleted": {"type": "array", "items": STR}, "wait_s": NUM}, []),
    ),
    types.Tool(
        name="whoami",
        description="The name this upstream was started with, and the Authorization it was sent.",
        input_schema=obj_schema({}, []),
    ),
    types.Tool(
        name="poke_list_changed",
        description="Sends notifications/tools/list_changed without changing any tool.",
        input_schema=obj_schema({}, []),
    ),
    types.Tool(
        name="sample",
        description="Asks the client's model (sampling/createMessage) and returns its text; `via` is `request` or `standalone`.",
        input_schema=obj_schema({"prompt": STR, "via": {"type": "string", "enum": ["request", "standalone"]}}, ["prompt"]),
    ),
]


def dynamic_tool(name: str) -> types.Tool:
    return types.Tool(name=name, description="A run-time echo tool.", input_schema=obj_schema({"text": STR}, ["text"]))


PROMPTS: list[types.Prompt] = [
    types.Prompt(
        name="greet",
        description="A greeting.",
        arguments=[
            types.PromptArgument(name="name", description="Who to greet", required=True),
            types.PromptArgument(name="style", description="formal or casual", required=False),
        ],
    ),
    types.Prompt(
        name="summarize",
        description="Summarize a text.",
        arguments=[types.PromptArgument(name="text", required=True)],
    ),
    types.Prompt(
        name="translate",
        description="Translate a text.",
        arguments=[types.PromptArgument(name="text", required=True), types.PromptArgument(name="lang", required=True)],
    ),
    types.Prompt(name="haiku", description="A haiku about a topic.", arguments=[types.PromptArgument(name="topic")]),
    types.Prompt(name="review", description="Review some code.", arguments=[types.PromptArgument(name="code", required=True)]),
]

# Binary payloads (resources/read blob): every byte value, and a tiny PNG header.
BLOB_BYTES = bytes(range(256))
PNG_BYTES = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06\x00\x00\x00\x1f\x15\xc4\x89"

RESOURCES: list[types.Resource] = [
    types.Resource(uri="res://readme", name="readme", mime_type="text/markdown", description="Read me."),
    types.Resource(uri="res://config", name="config", mime_type="application/json"),
    types.Resource(uri="res://logo.png", name="logo", mime_type="image/png"),
    types.Resource(uri="res://status", name="status", mime_type="text/plain", description="Changes with touch."),
    types.Resource(uri="res://data.bin", name="data", mime_type="application/octet-stream"),
]

TEMPLATES: list[types.ResourceTemplate] = [
    types.ResourceTemplate(uri_template="res://items/{id}", name="item", mime_type="text/plain"),
    types.ResourceTemplate(uri_template="res://users/{name}", name="user", mime_type="application/json"),
    types.ResourceTemplate(uri_template="res://logs/{date}", name="log", mime_type="text/plain"),
    types.ResourceTemplate(uri_template="res://blobs/{id}", name="blob", mime_type="application/octet-stream"),
    types.ResourceTemplate(uri_template="res://echo/{text}", name="echo", mime_type="text/plain"),
]

ITEM_IDS = [str(n) for n in (1, 2, 3, 4, 12, 40, 41, 42)]


# --- Pagination --------------------------------------------------------------------------


def encode_cursor(kind: str, offset: int) -> str:
    return base64.urlsafe_b64encode(f"{kind}:{offset}".encode()).decode().rstrip("=")


def decode_cursor(kind: str, cursor: str | None) -> int:
    """The offset a cursor stands for; an unknown cursor is -32602 (MCP pagination)."""
    if cursor is None:
        return 0
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        got_kind, _, offset = base64.urlsafe_b64decode(padded.encode()).decode().partition(":")
        if got_kind == kind and offset.isdigit():
            return int(offset)
    except (ValueError, UnicodeDecodeError):
        pass
    raise MCPError(code=types.INVALID_PARAMS, message="Invalid cursor", data=cursor)


def page(kind: str, items: list[Any], params: types.PaginatedRequestParams | None) -> tuple[list[Any], str | None]:
    offset = decode_cursor(kind, params.cursor if params else None)
    if offset > len(items):
        raise MCPError(code=types.INVALID_PARAMS, message="Invalid cursor", data=params.cursor if params else None)
    end = offset + PAGE_SIZE
    return items[offset:end], encode_cursor(kind, end) if end < len(items) else None


# --- List handlers -----------------------------------------------------------------------


async def listed(ctx: Any, kind: str) -> None:
    """Bookkeeping of every list request: the session, the count, the configured delay."""
    remember(ctx)
    STATE.lists[kind] = STATE.lists.get(kind, 0) + 1
    if STATE.list_delay_s:
        await anyio.sleep(STATE.list_delay_s)


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    await listed(ctx, "tools")
    items, cursor = page("tools", STATIC_TOOLS + [dynamic_tool(n) for n in STATE.dynamic_tools], params)
    return types.ListToolsResult(tools=items, next_cursor=cursor)


async def list_prompts(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
    await listed(ctx, "prompts")
    items, cursor = page("prompts", PROMPTS, params)
    return types.ListPromptsResult(prompts=items, next_cursor=cursor)


async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    await listed(ctx, "resources")
    items, cursor = page("resources", RESOURCES, params)
    return types.ListResourcesResult(resources=items, next_cursor=cursor)


async def list_templates(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourceTemplatesResult:
    await listed(ctx, "templates")
    items, cursor = page("templates", TEMPLATES, params)
    return types.ListResourceTemplatesResult(resource_templates=items, next_cursor=cursor)


# --- Prompts, resources, completion, logging ---------------------------------------------


async def get_prompt(ctx: Any, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    remember(ctx)
    args = params.arguments or {}
    if params.name == "greet":
        if "name" not in args:
            raise MCPError(code=types.INVALID_PARAMS, message="Missing required argument: name")
        style = args.get("style")
        text = f"Please write a {style} greeting for {args['name']}." if style else f"Please greet {args['name']}."
        return types.GetPromptResult(
            description=f"A greeting for {args['name']}",
            messages=[types.PromptMessage(role="user", content=types.TextContent(text=text))],
        )
    prompt = next((p for p in PROMPTS if p.name == params.name), None)
    if prompt is None:
        raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown prompt: {params.name}")
    rendered = ", ".join(f"{k}={v}" for k, v in sorted(args.items()))
    return types.GetPromptResult(
        description=prompt.description,
        messages=[
            types.PromptMessage(role="user", content=types.TextContent(text=f"{params.name}({rendered})")),
            types.PromptMessage(role="assistant", content=types.TextContent(text="Understood.")),
        ],
    )


def text_contents(uri: str, mime: str, text: str) -> types.ReadResourceResult:
    return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type=mime, text=text)])


def blob_contents(uri: str, mime: str, data: bytes) -> types.ReadResourceResult:
    blob = base64.b64encode(data).decode()
    return types.ReadResourceResult(contents=[types.BlobResourceContents(uri=uri, mime_type=mime, blob=blob)])


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    remember(ctx)
    uri = str(params.uri)
    fixed: dict[str, Callable[[], types.ReadResourceResult]] = {
        "res://readme": lambda: text_contents(uri, "text/markdown", "# Upstream\n\nA real MCP server: \"quotes\", \\ and ünïcödé.\n"),
        "res://config": lambda: text_contents(uri, "application/json", json.dumps({"pages": PAGE_SIZE, "mode": STATE.mode})),
        "res://logo.png": lambda: blob_contents(uri, "image/png", PNG_BYTES),
        "res://status": lambda: text_contents(uri, "text/plain", f"touched {STATE.touches.get(uri, 0)} time(s)"),
        "res://data.bin": lambda: blob_contents(uri, "application/octet-stream", BLOB_BYTES),
    }
    if uri in fixed:
        return fixed[uri]()
    scheme, _, rest = uri.partition("://")
    kind, _, value = rest.partition("/")
    if scheme == "res" and value:
        if kind == "items":
            return text_contents(uri, "text/plain", f"item {value}")
        if kind == "users":
            return text_contents(uri, "application/json", json.dumps({"name": value, "id": len(value)}))
        if kind == "logs":
            return text_contents(uri, "text/plain", f"log of {value}\nline 2\n")
        if kind == "blobs":
            return blob_contents(uri, "application/octet-stream", value.encode() * 3)
        if kind == "echo":
            return text_contents(uri, "text/plain", value)
    raise MCPError(code=-32002, message="Resource not found", data={"uri": uri})


async def subscribe(ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
    sid = remember(ctx)
    if sid is not None:
        STATE.subscriptions.setdefault(str(params.uri), set()).add(sid)
    return types.EmptyResult()


async def unsubscribe(ctx: Any, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    sid = remember(ctx)
    STATE.subscriptions.get(str(params.uri), set()).discard(sid or "")
    return types.EmptyResult()


async def complete(ctx: Any, params: types.CompleteRequestParams) -> types.CompleteResult:
    remember(ctx)
    ref, arg = params.ref, params.argument
    values: list[str] = []
    if isinstance(ref, types.PromptReference) and ref.name == "greet" and arg.name == "style":
        values = [v for v in ("formal", "casual") if v.startswith(arg.value)]
    elif isinstance(ref, types.ResourceTemplateReference) and ref.uri == "res://items/{id}" and arg.name == "id":
        values = [v for v in ITEM_IDS if v.startswith(arg.value)]
    return types.CompleteResult(completion=types.Completion(values=values, total=len(values), has_more=False))


async def set_level(ctx: Any, params: types.SetLevelRequestParams) -> types.EmptyResult:
    sid = remember(ctx)
    if sid is not None:
        STATE.log_levels[sid] = params.level
    return types.EmptyResult()


# --- Tools -------------------------------------------------------------------------------


def text_result(text: str, *, error: bool = False, structured: Any = None) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=text)], is_error=error, structured_content=structured
    )


class BadArguments(Exception):
    pass


def arg(args: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
    if name not in args:
        if default is ...:
            raise BadArguments(f"missing argument: {name}")
        return default
    value = args[name]
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, kind):
        raise BadArguments(f"argument {name} has the wrong type")
    return value


async def tool_slow_progress(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    steps = arg(args, "steps", int)
    interval_s = arg(args, "interval_ms", int, 20) / 1000
    drop_at = arg(args, "drop_at", int, 0)
    pause_at = arg(args, "pause_at", int, 0)
    tag = arg(args, "tag", str, "")
    sid = session_id_of(ctx)
    for step in range(1, steps + 1):
        await ctx.session.report_progress(step, steps, f"step {step} of {steps}")
        if step == drop_at and ctx.close_sse_stream is not None:
            # Resumable mode only: end this POST's HTTP response mid-call. The client must
            # come back with GET + Last-Event-ID; the rest waits until it has.
            await ctx.close_sse_stream()
            await wait_stream(sid, ctx.request_id, present=True)
        if step == pause_at:
            paused = STATE.paused[tag] = Paused(
                sid=sid, request_id=ctx.request_id, stream=stream_entry(sid, ctx.request_id)
            )
            with anyio.move_on_after(PAUSE_MAX_S):
                await paused.released.wait()
        await anyio.sleep(interval_s)
    return text_result(f"counted to {steps}")


async def tool_release(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    tag = arg(args, "tag", str)
    after_resume = arg(args, "after_resume", bool, False)
    paused = STATE.paused.get(tag)
    if paused is None:
        return text_result(f"nothing paused under {tag}", error=True)
    if arg(args, "until_dropped", bool, False):
        # A resume that reaches the SDK while the dropped stream is still registered is
        # never fed the live events (the SDK adds a stream only when none is there), so a
        # client resuming direct waits for this first.
        gone = await wait_stream(paused.sid, paused.request_id, present=False)
        return text_result("dropped" if gone else "still live", error=not gone)
    resumed = True
    if after_resume:
        # The client dropped the call's response and resumes it with GET + Last-Event-ID:
        # go on only once the SDK has the stream live again, so nothing falls into the
        # SDK's replay-to-live gap. Live again = an entry other than the one the call paused
        # with: the old one's removal and the resume's new entry can both happen before
        # this looks, so waiting to see it gone first could wait for nothing.
        def live_again() -> bool:
            entry = stream_entry(paused.sid, paused.request_id)
            return entry is not None and entry is not paused.stream

        resumed = await wait_until(live_again)
    paused.released.set()
    return text_result("released" if resumed else "released without a resume", error=not resumed)


def stream_entry(sid: str | None, request_id: Any) -> Any:
    """The SDK transport's entry for the request's live SSE stream, `None` without one."""
    manager = STATE.server.session_manager if STATE.server is not None else None
    transport = getattr(manager, "_server_instances", {}).get(sid)
    return getattr(transport, "_request_streams", {}).get(str(request_id)) if transport is not None else None


async def wait_until(condition: Any, timeout_s: float = 10.0) -> bool:
    """Waits until `condition()` holds, looking every few milliseconds (the SDK offers no
    hook for a stream going away or being resumed), for at most `timeout_s`. Returns
    whether it held."""
    with anyio.move_on_after(timeout_s):
        while not condition():
            await anyio.sleep(0.005)
        return True
    return False


async def wait_stream(sid: str | None, request_id: Any, *, present: bool, timeout_s: float = 10.0) -> bool:
    """Waits until the request's SSE stream is (or is no longer) live in the SDK transport."""
    return await wait_until(lambda: (stream_entry(sid, request_id) is not None) == present, timeout_s)


async def tool_elicit_name(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    via = arg(args, "via", str, "request")
    schema = {"type": "object", "properties": {"name": {"type": "string", "description": "Your name"}}, "required": ["name"]}
    related = ctx.request_id if via == "request" else None
    if via == "standalone":
        await STATE.get_streams.wait_open(session_id_of(ctx))
    try:
        answer = await ctx.session.elicit_form("What is your name?", schema, related_request_id=related)
    except MCPError as e:
        return text_result(f"elicitation failed: {e.code} {e.message}", error=True)
    name = (answer.content or {}).get("name")
    return text_result(f"{answer.action}: {name}", structured={"action": answer.action, "name": name})


async def tool_sleep(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    seconds = arg(args, "seconds", (int, float))
    tag = arg(args, "tag", str)
    record = STATE.sleeps[tag] = Sleep()
    STATE.sleep_started.setdefault(tag, anyio.Event()).set()
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        record.status = "cancelled"
        record.done.set()
        raise
    record.status = "finished"
    record.done.set()
    return text_result(f"slept {seconds}s")


async def tool_sleep_status(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    tag = arg(args, "tag", str)
    until = arg(args, "until", str, "ended")
    wait_s = arg(args, "wait_s", (int, float), 0)
    with anyio.move_on_after(wait_s):
        await STATE.sleep_started.setdefault(tag, anyio.Event()).wait()
        if until == "ended":
            await STATE.sleeps[tag].done.wait()
    record = STATE.sleeps.get(tag)
    return text_result(record.status if record is not None else "unknown")


async def notify_tools_changed(ctx: Any) -> int:
    """Sends tools/list_changed to every known session (on its GET stream)."""
    await STATE.get_streams.wait_open(session_id_of(ctx))
    for session in list(STATE.sessions.values()):
        await session.send_tool_list_changed()
    return len(STATE.sessions)


async def tool_add_tool(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    name = arg(args, "name", str)
    if name in STATE.dynamic_tools or any(t.name == name for t in STATIC_TOOLS):
        return text_result(f"tool {name} exists", error=True)
    STATE.dynamic_tools.append(name)
    await notify_tools_changed(ctx)
    return text_result(f"added tool {name}")


async def tool_poke_list_changed(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    told = await notify_tools_changed(ctx)
    return text_result(f"told {told} session(s); nothing changed")


async def tool_remove_tool(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    name = arg(args, "name", str)
    if name not in STATE.dynamic_tools:
        return text_result(f"no tool {name}", error=True)
    STATE.dynamic_tools.remove(name)
    await notify_tools_changed(ctx)
    return text_result(f"removed tool {name}")


async def tool_touch(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    uri = arg(args, "uri", str)
    STATE.touches[uri] = STATE.touches.get(uri, 0) + 1
    subscribers = sorted(STATE.subscriptions.get(uri, set()))
    for sid in subscribers:
        session = STATE.sessions.get(sid)
        if session is not None:
            await STATE.get_streams.wait_open(sid)
            await session.send_resource_updated(uri)
    return text_result(f"touched {uri}: notified {len(subscribers)} session(s)")


async def tool_log(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    level = arg(args, "level", str)
    message = arg(args, "message", str)
    if level not in LOG_LEVELS:
        raise BadArguments(f"unknown level {level}")
    sid = session_id_of(ctx)
    floor = STATE.log_levels.get(sid or "", "debug")
    if LOG_LEVELS.index(level) < LOG_LEVELS.index(floor):
        return text_result(f"not sent: below the session level {floor}")
    await STATE.get_streams.wait_open(sid)
    await ctx.session.send_log_message(level, message, logger="upstream")
    return text_result(f"logged at {level}")


async def tool_fail(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    raise MCPError(code=arg(args, "code", int), message=arg(args, "message", str), data=args.get("data"))


async def tool_whoami(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    request = ctx.request
    auth = request.headers.get("authorization") if request is not None else None
    body = {"name": STATE.name, "authorization": auth}
    return text_result(STATE.name, structured=body)


async def tool_sample(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    prompt = arg(args, "prompt", str)
    via = arg(args, "via", str, "request")
    if via == "standalone":
        await STATE.get_streams.wait_open(session_id_of(ctx))
    related = ctx.request_id if via == "request" else None
    try:
        answer = await ctx.session.create_message(
            messages=[types.SamplingMessage(role="user", content=types.TextContent(text=prompt))],
            max_tokens=32,
            related_request_id=related,
        )
    except MCPError as e:
        return text_result(f"sampling failed: {e.code} {e.message}", error=True)
    content = answer.content
    text = content.text if isinstance(content, types.TextContent) else str(content)
    return text_result(f"{STATE.name} heard: {text}", structured={"text": text, "model": answer.model})


async def tool_upstream_stats(ctx: Any, args: dict[str, Any]) -> types.CallToolResult:
    awaited = set(arg(args, "await_deleted", list, []))
    wait_s = arg(args, "wait_s", (int, float), 0)
    stats = STATE.stats
    with anyio.move_on_after(wait_s):
        while not awaited <= set(stats.deleted):
            await stats.changed.wait()
    body = {"opened": list(stats.opened), "deleted": list(stats.deleted), "lists": dict(STATE.lists)}
    return text_result(json.dumps(body), structured=body)


TOOLS: dict[str, Callable[[Any, dict[str, Any]], Awaitable[types.CallToolResult]]] = {
    "slow_progress": tool_slow_progress,
    "release": tool_release,
    "elicit_name": tool_elicit_name,
    "sleep": tool_sleep,
    "sleep_status": tool_sleep_status,
    "add_tool": tool_add_tool,
    "poke_list_changed": tool_poke_list_changed,
    "remove_tool": tool_remove_tool,
    "touch": tool_touch,
    "log": tool_log,
    "fail": tool_fail,
    "upstream_stats": tool_upstream_stats,
    "whoami": tool_whoami,
    "sample": tool_sample,
}


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    remember(ctx)
    args = params.arguments or {}
    try:
        if params.name == "echo" or params.name in STATE.dynamic_tools:
            return text_result(arg(args, "text", str))
        if params.name == "add":
            total = arg(args, "a", (int, float)) + arg(args, "b", (int, float))
            return text_result(str(total), structured={"sum": total})
        handler = TOOLS.get(params.name)
        if handler is None:
            raise MCPError(code=types.INVALID_PARAMS, message=f"Unknown tool: {params.name}")
        return await handler(ctx, args)
    except BadArguments as e:
        return text_result(str(e), error=True)


# --- Server and HTTP ---------------------------------------------------------------------


class UpstreamServer(Server):
    """Declares listChanged for every list (the base class leaves them off by default)."""

    def create_initialization_options(self, notification_options=None, experimental_capabilities=None, extensions=None) -> InitializationOptions:
        return super().create_initialization_options(
            NotificationOptions(prompts_changed=True, resources_changed=True, tools_changed=True),
            experimental_capabilities,
            extensions,
        )


def build_server() -> Server:
    return UpstreamServer(
        STATE.name,
        version="1.0.0",
        instructions="Test upstream for the mcpyard gateway tests."
        if STATE.name == "sdk-upstream"
        else f"Test upstream {STATE.name} for the mcpyard gateway tests.",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_completion=complete,
        on_set_logging_level=set_level,
    )


def require_token(app: Any, token: str) -> Any:
    """ASGI wrapper that answers every request without `Authorization: Bearer <token>`
    with 401 and a Bearer challenge (RFC 6750), as a protected MCP server does."""
    expected = f"Bearer {token}"

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            if headers.get("authorization") != expected:
                error = "invalid_token" if "authorization" in headers else "invalid_request"
                challenge = (
                    f'Bearer realm="{STATE.name}", error="{error}", '
                    f'resource_metadata="http://127.0.0.1/.well-known/oauth-protected-resource/{STATE.name}"'
                )
                body = json.dumps({"error": error}).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"www-authenticate", challenge.encode()),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return wrapped


def observe(app: Any) -> Any:
    """ASGI wrapper that notes what only the HTTP layer sees: a session's GET stream
    opening and closing, sessions opened (initialize answered with a session id) and
    sessions ended by DELETE."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope["method"]
        sid = headers.get("mcp-session-id")
        opened_get = False

        async def watch(message: dict[str, Any]) -> None:
            nonlocal opened_get
            if message["type"] == "http.response.start":
                status = message["status"]
                reply = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in message.get("headers", [])}
                if method == "GET" and sid and status == 200:
                    opened_get = True
                    STATE.get_streams.on_open(sid)
                elif method == "POST" and sid is None and status == 200 and "mcp-session-id" in reply:
                    STATE.stats.opened.append(reply["mcp-session-id"])
                    STATE.stats.bump()
                elif method == "DELETE" and sid and status in (200, 204):
                    STATE.stats.deleted.append(sid)
                    STATE.sessions.pop(sid, None)
                    STATE.stats.bump()
            await send(message)

        try:
            await app(scope, receive, watch)
        finally:
            if opened_get and sid:
                STATE.get_streams.on_close(sid)

    return wrapped


def main() -> None:
    global STATE
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["json", "sse", "sse-resumable"], required=True)
    parser.add_argument("--name", default="sdk-upstream")
    parser.add_argument("--token", default=None)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--list-delay", type=float, default=0.0)
    parser.add_argument("--tls-cert", default=None, help="serve https with this PEM certificate")
    parser.add_argument("--tls-key", default=None, help="and this PEM key")
    args = parser.parse_args()
    mode = args.mode
    STATE = State(mode=mode, name=args.name, list_delay_s=args.list_delay)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    server = build_server()
    STATE.server = server
    resumable = mode == "sse-resumable"
    app = server.streamable_http_app(
        streamable_http_path=PATH,
        json_response=mode == "json",
        event_store=MemoryEventStore() if resumable else None,
        retry_interval=RETRY_MS if resumable else None,
    )

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(128)  # connections queue from now on, so the URL is usable once printed
    port = sock.getsockname()[1]
    served = observe(app) if args.token is None else require_token(observe(app), args.token)
    tls = {"ssl_certfile": args.tls_cert, "ssl_keyfile": args.tls_key} if args.tls_cert else {}
    config = uvicorn.Config(served, log_level="warning", lifespan="on", timeout_graceful_shutdown=1, **tls)
    scheme = "https" if tls else "http"
    print(f"listening {scheme}://127.0.0.1:{port}{PATH}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
