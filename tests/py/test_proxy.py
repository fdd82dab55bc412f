"""mcpyard's `proxy` binding in front of three real MCP servers, driven by the official MCP
Python SDK client (and raw HTTP where the bytes matter).

The routes:
- `alpha`: the SDK upstream (tests/py/upstreams/sdk_upstream.py), SSE with an event store;
- `beta`: the same server started as `beta`, needing `Authorization: Bearer <TOKEN>`; its
  client binding forwards the agent's own header, and its tools pass an allow-list;
- `every`: the reference `@modelcontextprotocol/server-everything`, with an allow-list.

What the agent sees through the proxy is compared with what each upstream says directly:
the merged lists are each upstream's items (followed through all their pages) with the
toolkit prefix on their names and nothing else changed, in route order.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import harness
import helpers
from helpers import Collector, Wire, dump, http_client, tool_text, unique
from rawmcp import RawSession, parse_bearer_challenge, stream_sse

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

TOKEN = "s3cret-beta"
AUTH = {"authorization": f"Bearer {TOKEN}"}
TIMEOUT_S = 10
SCENARIO_TIMEOUT_S = 40

# The allow-lists of the proxy under test (beta's and every's tools).
BETA_TOOLS = ["echo", "add", "whoami", "sample", "elicit_name", "add_tool", "remove_tool", "log", "slow_progress", "dyn_*"]
EVERY_TOOLS = ["echo", "get-*", "trigger-sampling-request", "trigger-elicitation-request"]


def glob_match(pattern: str, name: str) -> bool:
    """`*`-only globs, as the proxy's allow-lists."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return pattern == name
    if not name.startswith(parts[0]) or not name.endswith(parts[-1]) or len(name) < len(parts[0]) + len(parts[-1]):
        return False
    at = len(parts[0])
    end = len(name) - len(parts[-1])
    for middle in parts[1:-1]:
        found = name.find(middle, at, end)
        if found < 0:
            return False
        at = found + len(middle)
    return True


def allow(patterns: list[str] | None, name: str) -> bool:
    return patterns is None or any(glob_match(p, name) for p in patterns)


def proxy_config(urls: dict[str, str], workers: int, io: str, *, routes: list[str] | None = None) -> str:
    """The proxy under test, with `routes` (default all three) in that order."""
    routes = routes or ["alpha", "beta", "every"]
    lines = [
        f"runtime: {{ workers: {workers}, io: {io} }}",
        "telemetry: { metrics: 127.0.0.1:0 }",
        "bindings:",
        "  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: tools }",
        "  tools:",
        "    kind: proxy",
        "    routes:",
    ]
    for name in routes:
        allow_list = {"beta": BETA_TOOLS, "every": EVERY_TOOLS}.get(name)
        tools = f", tools: {json.dumps(allow_list)}" if allow_list else ""
        lines.append(f"      - {{ toolkit: {name}, exit: {name}{tools} }}")
    for name in routes:
        auth = ", authorization: forward" if name == "beta" else ""
        lines.append(
            f'  {name}: {{ kind: client, server: "{urls[name]}", response_timeout: 5s, connect_timeout: 2s{auth} }}'
        )
    return "\n".join(lines) + "\n"


@dataclass
class Stack:
    """The upstreams (shared by the module's tests) and the proxy of one test."""

    urls: dict[str, str]
    url: str
    gateway: harness.Child


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    work = tmp_path_factory.mktemp("proxy-upstreams")
    children = {
        "alpha": harness.start_upstream("sse-resumable", work / "alpha", name="alpha"),
        "beta": harness.start_upstream("sse-resumable", work / "beta", name="beta", token=TOKEN),
        "every": harness.start_everything(work / "every"),
    }
    yield children
    for child in children.values():
        harness.stop_upstream(child)


@pytest.fixture(params=harness.SOME_RUNTIMES, ids=harness.runtime_id)
def stack(request, upstreams, tmp_path: Path):
    workers, io = request.param
    urls = {name: child.address for name, child in upstreams.items()}
    gateway = harness.start_mcpyard(proxy_config(urls, workers, io), tmp_path)
    try:
        yield Stack(urls=urls, url=gateway.address, gateway=gateway)
    finally:
        harness.stop_mcpyard(gateway)
    for name, child in upstreams.items():
        assert child.alive(), f"upstream {name} died:\n{child.stderr()[-3000:]}"


def run(fn, *args):
    helpers.run(fn, *args, timeout_s=SCENARIO_TIMEOUT_S)


async def answer_sampling(context, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(text="pong"), model="test-model", stop_reason="endTurn"
    )


async def answer_elicitation(context, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"name": "Ada"})


@asynccontextmanager
async def open_session(
    url: str,
    *,
    headers: dict[str, str] | None = None,
    message_handler=None,
    elicitation_callback=answer_elicitation,
    sampling_callback=answer_sampling,
) -> AsyncIterator[tuple[ClientSession, Wire]]:
    """An SDK session declaring sampling and elicitation (so every server offers the same
    tools whoever connects), initialized."""
    wire = Wire()
    async with http_client(wire, headers) as client:
        async with streamable_http_client(url, http_client=client) as (r, w):
            async with ClientSession(
                r,
                w,
                read_timeout_seconds=TIMEOUT_S,
                message_handler=message_handler,
                elicitation_callback=elicitation_callback,
                sampling_callback=sampling_callback,
            ) as session:
                with anyio.fail_after(TIMEOUT_S):
                    await session.initialize()
                yield session, wire


async def all_pages(fetch, items_of) -> list[Any]:
    """Every item of a paginated list, following nextCursor."""
    items: list[Any] = []
    cursor = None
    for _ in range(1000):
        page = await fetch(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        items.extend(items_of(page))
        cursor = page.next_cursor
        if cursor is None:
            return items
    raise AssertionError("more than 1000 pages")


LISTS = [
    ("tools", "list_tools", lambda p: p.tools, "name", "__"),
    ("prompts", "list_prompts", lambda p: p.prompts, "name", "__"),
    ("resources", "list_resources", lambda p: p.resources, "uri", "+"),
    ("resourceTemplates", "list_resource_templates", lambda p: p.resource_templates, "uriTemplate", "+"),
]


@pytest.mark.parametrize("stack", [harness.SOME_RUNTIMES[0]], indirect=True, ids=harness.runtime_id)
def test_lists_merge_every_route_through_all_its_pages(stack):
    """Each list through the proxy is the routes' lists, every page of each, in route
    order, items renamed `<toolkit>__name` / `<toolkit>+uri`, allow-lists applied, and
    otherwise exactly as the upstream gave them."""

    async def scenario():
        want: dict[str, list[Any]] = {kind: [] for kind, *_ in LISTS}
        for route in ["alpha", "beta", "every"]:
            headers = AUTH if route == "beta" else None
            async with open_session(stack.urls[route], headers=headers) as (direct, _):
                for kind, method, items_of, key, sep in LISTS:
                    items = await all_pages(getattr(direct, method), items_of)
                    for item in items:
                        item = dump(item)
                        if kind == "tools" and not allow({"beta": BETA_TOOLS, "every": EVERY_TOOLS}.get(route), item["name"]):
                            continue
                        item[key] = f"{route}{sep}{item[key]}"
                        want[kind].append(item)
        assert len(want["tools"]) > 20 and len(want["resources"]) > 5, want
        async with open_session(stack.url, headers=AUTH) as (via, _):
            for kind, method, items_of, key, _ in LISTS:
                page = await getattr(via, method)()
                assert page.next_cursor is None, "the merged list is one page"
                got = [dump(i) for i in items_of(page)]
                assert got == want[kind], f"{kind}: through the proxy\n{[g[key] for g in got]}\nwant\n{[w[key] for w in want[kind]]}"

    run(scenario)


@pytest.mark.parametrize("stack", harness.SOME_RUNTIMES, indirect=True, ids=harness.runtime_id)
def test_items_are_served_by_their_own_upstream(stack):
    async def scenario():
        async with open_session(stack.url, headers=AUTH) as (session, _):
            alpha = await session.call_tool("alpha__whoami", {})
            assert alpha.structured_content["name"] == "alpha"
            beta = await session.call_tool("beta__whoami", {})
            # beta's client forwards the agent's own Authorization header.
            assert beta.structured_content == {"name": "beta", "authorization": f"Bearer {TOKEN}"}
            added = await session.call_tool("alpha__add", {"a": 2, "b": 40})
            assert added.structured_content == {"sum": 42}
            echoed = await session.call_tool("every__echo", {"message": "hello"})
            assert "hello" in tool_text(echoed)
        async with open_session(stack.url, headers=AUTH) as (session, _):
            prompt = await session.get_prompt("alpha__greet", {"name": "Ada", "style": "formal"})
            assert prompt.messages[0].content.text == "Please write a formal greeting for Ada."
            read = await session.read_resource("alpha+res://readme")
            assert str(read.contents[0].uri) == "alpha+res://readme", "the uri comes back under its prefix"
            assert "ünïcödé" in read.contents[0].text
            item = await session.read_resource("beta+res://items/40")
            assert item.contents[0].text == "item 40" and str(item.contents[0].uri) == "beta+res://items/40"
            blob = await session.read_resource("alpha+res://data.bin")
            assert blob.contents[0].blob.startswith("AAECAwQF")
            done = await session.complete(types.PromptReference(name="alpha__greet"), {"name": "style", "value": "f"})
            assert done.completion.values == ["formal"]
            done = await session.complete(
                types.ResourceTemplateReference(uri="beta+res://items/{id}"), {"name": "id", "value": "4"}
            )
            assert done.completion.values == ["4", "40", "41", "42"]
            assert dump(await session.set_logging_level("error")) == {}

    run(scenario)


def test_hidden_and_unknown_items_are_refused(stack):
    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            raw = RawSession(client, stack.url, AUTH)
            await raw.initialize()
            for name in ["beta__fail", "nobody__echo", "alpha__"]:
                reply = await raw.request("tools/call", {"name": name, "arguments": {}})
                assert reply.status == 200
                assert reply.error == {"code": -32602, "message": f"Unknown tool: {name}"}
            reply = await raw.request("resources/read", {"uri": "res://readme"})
            assert reply.error == {"code": -32002, "message": "Resource not found"}
            reply = await raw.request("tasks/list", {})
            assert reply.error == {"code": -32601, "message": "Method not found"}

    run(scenario)


def test_progress_and_logging_come_from_the_route(stack):
    async def scenario():
        notes = Collector()
        async with open_session(stack.url, headers=AUTH, message_handler=notes) as (session, wire):
            with anyio.fail_after(TIMEOUT_S):
                await wire.get_open.wait()
            seen: list[float] = []

            async def on_progress(progress, total, message):
                seen.append(progress)

            done = await session.call_tool(
                "alpha__slow_progress", {"steps": 5, "interval_ms": 5}, progress_callback=on_progress
            )
            assert tool_text(done) == "counted to 5"
            assert seen == [1, 2, 3, 4, 5]
            await session.set_logging_level("debug")
            await session.call_tool("beta__log", {"level": "warning", "message": "from beta"})
            await session.call_tool("alpha__log", {"level": "info", "message": "from alpha"})
            with anyio.fail_after(TIMEOUT_S):
                logs = await notes.wait_for(types.LoggingMessageNotification, 2)
            assert sorted(m.params.data for m in logs) == ["from alpha", "from beta"]
            assert all(m.params.logger == "upstream" for m in logs)

    run(scenario)


def test_list_changed_from_each_route(stack):
    async def scenario():
        notes = Collector()
        names = {route: unique("dyn_") for route in ["alpha", "beta"]}
        async with open_session(stack.url, headers=AUTH, message_handler=notes) as (session, wire):
            with anyio.fail_after(TIMEOUT_S):
                await wire.get_open.wait()
            for count, route in enumerate(["alpha", "beta"], start=1):
                await session.call_tool(f"{route}__add_tool", {"name": names[route]})
                with anyio.fail_after(TIMEOUT_S):
                    await notes.wait_for(types.ToolListChangedNotification, count)
            tools = [t.name for t in (await session.list_tools()).tools]
            for route, name in names.items():
                assert f"{route}__{name}" in tools
                echoed = await session.call_tool(f"{route}__{name}", {"text": "new"})
                assert tool_text(echoed) == "new"
                await session.call_tool(f"{route}__remove_tool", {"name": name})

    run(scenario)


def test_elicitation_and_sampling_reach_the_route_that_asked(stack):
    """Two routes ask the agent at the same time (their own request ids may well be equal):
    each answer goes back to the route that asked."""

    async def scenario():
        asked = anyio.Event()
        waiting: list[str] = []

        async def on_elicit(context, params):
            waiting.append(params.message)
            if len(waiting) == 2:
                asked.set()
            with anyio.fail_after(TIMEOUT_S):
                await asked.wait()
            return types.ElicitResult(action="accept", content={"name": f"Ada-{len(waiting)}"})

        async with open_session(stack.url, headers=AUTH, elicitation_callback=on_elicit) as (session, wire):
            with anyio.fail_after(TIMEOUT_S):
                await wire.get_open.wait()
            results: dict[str, types.CallToolResult] = {}

            async def ask(route: str, via: str) -> None:
                results[route] = await session.call_tool(f"{route}__elicit_name", {"via": via})

            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, "alpha", "request")
                tg.start_soon(ask, "beta", "standalone")
            assert tool_text(results["alpha"]).startswith("accept: Ada-2")
            assert tool_text(results["beta"]).startswith("accept: Ada-2")

            sampled = await session.call_tool("beta__sample", {"prompt": "ping"})
            assert tool_text(sampled) == "beta heard: pong"
            sampled = await session.call_tool("alpha__sample", {"prompt": "ping", "via": "standalone"})
            assert tool_text(sampled) == "alpha heard: pong"

    run(scenario)


def test_cancellation_reaches_only_the_owning_route(stack):
    async def scenario():
        tag = unique("sleep")
        async with open_session(stack.url, headers=AUTH) as (session, _):
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def call():
                    with scope:
                        await session.call_tool("alpha__sleep", {"seconds": 60, "tag": tag})
                        raise AssertionError("a 60 s sleep finished")

                tg.start_soon(call)
                started = await session.call_tool(
                    "alpha__sleep_status", {"tag": tag, "until": "started", "wait_s": TIMEOUT_S - 1}
                )
                assert tool_text(started) == "running"
                scope.cancel()
            ended = await session.call_tool("alpha__sleep_status", {"tag": tag, "until": "ended", "wait_s": TIMEOUT_S - 1})
            assert tool_text(ended) == "cancelled"
            # beta never heard of it, and is fine.
            assert (await session.call_tool("beta__whoami", {})).structured_content["name"] == "beta"

    run(scenario)


async def read_events(response: httpx2.Response, into: list[tuple[str | None, Any]], want: int) -> None:
    """Appends (id, message) of every event with data until `want` have arrived."""
    async for event in stream_sse(response):
        if event.data:
            into.append((event.id, json.loads(event.data)))
            if len(into) >= want:
                return


async def log(raw: RawSession, route: str, message: str) -> None:
    reply = await raw.request("tools/call", {"name": f"{route}__log", "arguments": {"level": "info", "message": message}})
    assert "logged" in reply.result["content"][0]["text"], reply.body


def messages(events: list[tuple[str | None, Any]]) -> list[str]:
    return [m["params"]["data"] for _, m in events if m.get("method") == "notifications/message"]


def test_get_stream_resumes_across_two_routes(stack):
    """The agent's GET stream drops; both routes go on emitting; the agent resumes with
    Last-Event-ID and gets exactly what it missed, from both, once. Then the same with only
    the aggregate part of the id (`<prefix>=<id>;...`): each route is resumed upstream from
    its own id, and its own event store replays what the agent missed."""

    async def scenario():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=30)) as client:
            raw = RawSession(client, stack.url, AUTH)
            await raw.initialize()
            await raw.request("logging/setLevel", {"level": "debug"})
            get = {**raw.headers(), "accept": "text/event-stream"}
            first: list[tuple[str | None, Any]] = []
            async with client.stream("GET", stack.url, headers=get) as response:
                assert response.status_code == 200
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read_events, response, first, 2)
                    await log(raw, "alpha", "a1")
                    await log(raw, "beta", "b1")
            assert messages(first) == ["a1", "b1"]
            last_id = first[-1][0]
            assert last_id is not None and last_id.startswith("0.")
            ours, _, aggregate = last_id.partition(":")
            pairs = dict(p.split("=", 1) for p in aggregate.split(";"))
            assert len(pairs) == 2, f"both routes' positions are in the id: {last_id}"

            # Away: both routes emit.
            for route, text in [("alpha", "a2"), ("beta", "b2"), ("alpha", "a3")]:
                await log(raw, route, text)

            resumed: list[tuple[str | None, Any]] = []
            async with client.stream("GET", stack.url, headers={**get, "last-event-id": last_id}) as response:
                assert response.status_code == 200
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read_events, response, resumed, 4)
                    with anyio.fail_after(TIMEOUT_S):
                        while len(resumed) < 3:
                            await anyio.sleep(0.01)
                    await log(raw, "beta", "b3")
            assert messages(resumed) == ["a2", "b2", "a3", "b3"], "what was missed, once, then live"

            # The aggregate part alone: the routes replay from their own event stores.
            replayed: list[tuple[str | None, Any]] = []
            async with client.stream("GET", stack.url, headers={**get, "last-event-id": aggregate}) as response:
                assert response.status_code == 200
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read_events, response, replayed, 4)
            got = messages(replayed)
            assert sorted(got) == ["a2", "a3", "b2", "b3"], got
            assert got.index("a2") < got.index("a3") and got.index("b2") < got.index("b3")

    run(scenario)


@pytest.mark.parametrize("stack", [harness.SOME_RUNTIMES[1]], indirect=True, ids=harness.runtime_id)
def test_bearer_challenges_reach_the_agent_while_the_other_routes_work(stack):
    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            # No credential: the session still opens (beta is skipped, logged).
            raw = RawSession(client, stack.url)
            await raw.initialize()
            tools = [t["name"] for t in (await raw.request("tools/list")).result["tools"]]
            assert "alpha__echo" in tools and not any(t.startswith("beta__") for t in tools)
            reply = await raw.request("tools/call", {"name": "beta__whoami", "arguments": {}})
            assert reply.status == 401, reply.body
            challenge = parse_bearer_challenge(reply.headers["www-authenticate"])
            assert challenge["realm"] == "beta" and challenge["error"] == "invalid_request", challenge
            assert challenge["resource_metadata"].endswith("/oauth-protected-resource/beta")
            assert (await raw.request("tools/call", {"name": "alpha__whoami", "arguments": {}})).status == 200
            # A wrong token: the upstream's own verdict.
            raw.extra["authorization"] = "Bearer wrong"
            reply = await raw.request("tools/call", {"name": "beta__whoami", "arguments": {}})
            assert reply.status == 401
            assert parse_bearer_challenge(reply.headers["www-authenticate"])["error"] == "invalid_token"
            # The right one, on the same session: the route opens now.
            raw.extra.update(AUTH)
            reply = await raw.request("tools/call", {"name": "beta__whoami", "arguments": {}})
            assert reply.status == 200 and reply.result["structuredContent"]["name"] == "beta", reply.body

    run(scenario)


def test_a_lone_route_that_challenges_answers_initialize_with_its_challenge(upstreams, tmp_path):
    urls = {name: child.address for name, child in upstreams.items()}
    gateway = harness.start_mcpyard(proxy_config(urls, 1, "epoll", routes=["beta"]), tmp_path)

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            reply = await RawSession(client, gateway.address).initialize(expect_ok=False)
            assert reply.status == 401, reply.body
            challenge = parse_bearer_challenge(reply.headers["www-authenticate"])
            assert challenge["realm"] == "beta"
            raw = RawSession(client, gateway.address, AUTH)
            await raw.initialize()

    try:
        run(scenario)
    finally:
        harness.stop_mcpyard(gateway)


def test_a_route_killed_mid_session_fails_clearly_while_the_others_work(upstreams, tmp_path):
    gamma = harness.start_upstream("json", tmp_path / "gamma", name="gamma")
    urls = {name: child.address for name, child in upstreams.items()} | {"gamma": gamma.address}
    gateway = harness.start_mcpyard(proxy_config(urls, 2, "uring", routes=["alpha", "gamma"]), tmp_path)

    async def scenario():
        async with open_session(gateway.address) as (session, _):
            assert (await session.call_tool("gamma__whoami", {})).structured_content["name"] == "gamma"
            harness.stop_upstream(gamma)
            with pytest.raises(MCPError) as failure:
                await session.call_tool("gamma__whoami", {})
            assert failure.value.error.code == -32603
            assert failure.value.error.message.startswith("Upstream unreachable"), failure.value.error.message
            assert (await session.call_tool("alpha__whoami", {})).structured_content["name"] == "alpha"
            tools = [t.name for t in (await session.list_tools()).tools]
            assert "alpha__echo" in tools and not any(t.startswith("gamma__") for t in tools)

    try:
        run(scenario)
    finally:
        harness.stop_mcpyard(gateway)
