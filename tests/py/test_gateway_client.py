"""mcpyard as a transparent gateway, driven by the official MCP Python SDK client.

Every scenario runs against a real SDK upstream (tests/py/upstreams/sdk_upstream.py) in
each of its modes (`json`, `sse`, `sse-resumable`), once `direct` (the client talks to the
upstream itself: this pins what the upstream does) and once per `mcpyard-w<N>-<io>` (the
client talks to mcpyard, `server -> client`, in front of the same upstream). Through mcpyard
the agent must see what it sees direct: the tests fetch the same things both ways in one
run and compare them, raw `result` bytes where the wire fixes them, and SDK models dumped
to JSON otherwise.

Run only the direct half (while the client binding is being built): `-k direct`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ClientMessageMetadata

import harness
import helpers
from helpers import PROTOCOL, Collector, Wire, dump, http_client, tool_text, unique
from rawmcp import RawSession, stream_sse

# logging/setLevel and resources/subscribe are current in 2025-11-25, which the upstream
# speaks; the SDK flags them only because the 2026 protocol drops them.
pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

MODES = harness.UPSTREAM_MODES


def runtimes_for(mode: str) -> list[tuple[int, str]]:
    # The agent-facing runtime (workers, io) is what the full matrix exercises; one upstream
    # mode gets it all, the others a trimmed pair.
    return harness.ALL_RUNTIMES if mode == "sse" else harness.SOME_RUNTIMES


# Over TLS on both edges too (mcpyard `server` with tls, `client` to an https upstream):
# one streaming mode and the resumable one, the results compared with the upstream's own.
ALL = harness.route_params(MODES, runtimes_for) + harness.tls_route_params(["sse"])
RESUMABLE = harness.route_params(["sse-resumable"], runtimes_for) + harness.tls_route_params(["sse-resumable"])

# What the upstream serves, in list order (2 items a page).
STATIC_TOOLS = [
    "echo", "add", "slow_progress", "release", "elicit_name", "sleep", "sleep_status", "add_tool",
    "remove_tool", "touch", "log", "fail", "upstream_stats", "whoami", "poke_list_changed", "sample",
]  # fmt: skip
PROMPTS = ["greet", "summarize", "translate", "haiku", "review"]
RESOURCES = ["res://readme", "res://config", "res://logo.png", "res://status", "res://data.bin"]
TEMPLATES = ["res://items/{id}", "res://users/{name}", "res://logs/{date}", "res://blobs/{id}", "res://echo/{text}"]
DYNAMIC_PREFIX = "dyn_"

# Every request, and every wait for a notification, fails after this long; a scenario after
# SCENARIO_TIMEOUT_S. Direct, each scenario takes well under a second or two.
TIMEOUT_S = 5
SCENARIO_TIMEOUT_S = 20


def run(fn, *args):
    helpers.run(fn, *args, timeout_s=SCENARIO_TIMEOUT_S)


@asynccontextmanager
async def open_session(
    url: str,
    *,
    message_handler=None,
    elicitation_callback=None,
    terminate_on_close: bool = True,
    headers: dict[str, str] | None = None,
    initialize: bool = True,
) -> AsyncIterator[tuple[ClientSession, Wire, types.InitializeResult | None]]:
    """An SDK ClientSession on `url` (helpers.connect plus an elicitation callback)."""
    wire = Wire()
    async with http_client(wire, headers) as client:
        async with streamable_http_client(url, http_client=client, terminate_on_close=terminate_on_close) as (r, w):
            async with ClientSession(
                r,
                w,
                read_timeout_seconds=TIMEOUT_S,
                message_handler=message_handler,
                elicitation_callback=elicitation_callback,
            ) as session:
                init = None
                if initialize:
                    with anyio.fail_after(TIMEOUT_S):
                        init = await session.initialize()
                yield session, wire, init


@asynccontextmanager
async def twin(route) -> AsyncIterator[ClientSession | None]:
    """Through mcpyard: a second session straight to the upstream, to compare with. Direct:
    None (there is nothing to compare with)."""
    if not route.through_gateway:
        yield None
        return
    async with open_session(route.upstream_url) as (session, _, _):
        yield session


async def same_both_ways(route, scenario) -> Any:
    """Runs `scenario(session)` through the route and, through mcpyard, also direct; the
    two must return equal values. Returns the route's value."""
    async with open_session(route.url) as (session, _, _):
        got = await scenario(session)
    async with twin(route) as direct:
        if direct is not None:
            want = await scenario(direct)
            assert got == want, f"through {route.via} the agent saw\n{got}\ndirect it sees\n{want}"
    return got


async def all_pages(fetch) -> list[Any]:
    """Follows `nextCursor` to the end; returns every page."""
    pages = [await fetch(None)]
    while pages[-1].next_cursor is not None:
        assert len(pages) < 50, "pagination does not end"
        pages.append(await fetch(types.PaginatedRequestParams(cursor=pages[-1].next_cursor)))
    return pages


# 1. initialize


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_initialize(route):
    async def scenario():
        async with open_session(route.url) as (session, wire, init):
            assert init is not None
            assert init.protocol_version == PROTOCOL
            assert wire.session_id, "initialize must answer with an Mcp-Session-Id"
            caps = init.capabilities
            assert caps.tools is not None and caps.tools.list_changed is True
            assert caps.prompts is not None and caps.prompts.list_changed is True
            assert caps.resources is not None and caps.resources.subscribe is True
            assert caps.resources.list_changed is True
            assert caps.logging is not None
            assert caps.completions is not None
            assert init.instructions == "Test upstream for the mcpyard gateway tests."
            if not route.through_gateway:
                assert init.server_info.name == "sdk-upstream"
            assert isinstance(await session.send_ping(), types.EmptyResult)
        async with twin(route) as direct:
            if direct is not None:
                # The gateway speaks for itself (serverInfo) but must carry the upstream's
                # capabilities and instructions unchanged.
                upstream = direct.initialize_result
                assert dump(init.capabilities) == dump(upstream.capabilities)
                assert init.instructions == upstream.instructions

    run(scenario)


# 2. every list, every page


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_lists_follow_every_page(route):
    async def listing(session: ClientSession):
        tools = await all_pages(lambda p: session.list_tools(params=p))
        prompts = await all_pages(lambda p: session.list_prompts(params=p))
        resources = await all_pages(lambda p: session.list_resources(params=p))
        templates = await all_pages(lambda p: session.list_resource_templates(params=p))
        return {
            "tools": [dump(p) for p in tools],
            "prompts": [dump(p) for p in prompts],
            "resources": [dump(p) for p in resources],
            "templates": [dump(p) for p in templates],
        }

    async def scenario():
        got = await same_both_ways(route, listing)
        for kind, key, field, expected in [
            ("tools", "tools", "name", STATIC_TOOLS),
            ("prompts", "prompts", "name", PROMPTS),
            ("resources", "resources", "uri", RESOURCES),
            ("templates", "resourceTemplates", "uriTemplate", TEMPLATES),
        ]:
            pages = got[kind]
            assert len(pages) >= 3, f"{kind}: {len(pages)} page(s); the upstream pages by 2"
            assert all("nextCursor" in p for p in pages[:-1]) and "nextCursor" not in pages[-1]
            assert all(1 <= len(p[key]) <= 2 for p in pages), f"{kind}: page sizes {[len(p[key]) for p in pages]}"
            names = [item[field] for p in pages for item in p[key]]
            assert [n for n in names if not n.startswith(DYNAMIC_PREFIX)] == expected
        add = next(t for p in got["tools"] for t in p["tools"] if t["name"] == "add")
        assert add["outputSchema"]["required"] == ["sum"]
        assert got["resources"][1]["resources"][0]["mimeType"] == "image/png"

        # A cursor the upstream never issued is its error, carried unchanged.
        async def bad_cursor(session: ClientSession):
            with pytest.raises(MCPError) as err:
                await session.list_tools(params=types.PaginatedRequestParams(cursor="not-a-cursor"))
            return dump(err.value.error)

        error = await same_both_ways(route, bad_cursor)
        assert error == {"code": -32602, "message": "Invalid cursor", "data": "not-a-cursor"}

    run(scenario)


# 3. raw result bytes: what the upstream wrote is what the agent reads


RAW_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("tools/list", {}),
    ("tools/call", {"name": "echo", "arguments": {"text": 'héllo "gateway" \\ \u2603 \n tab\t'}}),
    ("tools/call", {"name": "add", "arguments": {"a": 40, "b": 2.5}}),
    ("tools/call", {"name": "echo", "arguments": {"text": 7}}),
    ("prompts/list", {}),
    ("prompts/get", {"name": "greet", "arguments": {"name": "Ada", "style": "formal"}}),
    ("prompts/get", {"name": "translate", "arguments": {"text": "hi", "lang": "fr"}}),
    ("resources/list", {}),
    ("resources/read", {"uri": "res://readme"}),
    ("resources/read", {"uri": "res://data.bin"}),
    ("resources/read", {"uri": "res://users/zoë"}),
    ("resources/templates/list", {}),
    ("completion/complete", {"ref": {"type": "ref/prompt", "name": "greet"}, "argument": {"name": "style", "value": "f"}}),
    ("completion/complete", {"ref": {"type": "ref/resource", "uri": "res://items/{id}"}, "argument": {"name": "id", "value": "4"}}),
]


async def raw_results(url: str) -> list[bytes]:
    async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
        raw = RawSession(client, url)
        await raw.initialize()
        out = []
        for method, params in RAW_CALLS:
            reply = await raw.request(method, params)
            assert reply.status == 200, f"{method}: HTTP {reply.status} {reply.body[:200]!r}"
            out.append(reply.result_bytes)
        # The second page of tools/list, by the cursor the first page gave.
        first = json.loads(out[0])
        reply = await raw.request("tools/list", {"cursor": first["nextCursor"]})
        out.append(reply.result_bytes)
        gone = await raw.delete()
        assert gone.status_code in (200, 204)
        return out


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_raw_results_are_byte_identical(route):
    async def scenario():
        got = await raw_results(route.url)
        # What the upstream answers, parsed: the raw capture must hold real results.
        parsed = [json.loads(b) for b in got]
        assert [t["name"] for t in parsed[0]["tools"]] == STATIC_TOOLS[:2]
        assert parsed[1]["content"][0]["text"] == 'héllo "gateway" \\ \u2603 \n tab\t'
        assert parsed[2]["structuredContent"] == {"sum": 42.5}
        assert parsed[3]["isError"] is True
        assert parsed[5]["messages"][0]["content"]["text"] == "Please write a formal greeting for Ada."
        assert base64.b64decode(parsed[9]["contents"][0]["blob"]) == bytes(range(256))
        assert parsed[10]["contents"][0]["text"] == '{"name": "zo\\u00eb", "id": 3}'
        assert parsed[12]["completion"]["values"] == ["formal"]
        assert parsed[13]["completion"]["values"] == ["4", "40", "41", "42"]
        assert [t["name"] for t in parsed[-1]["tools"]] == STATIC_TOOLS[2:4]
        if route.through_gateway:
            want = await raw_results(route.upstream_url)
            for (method, params), g, w in zip(RAW_CALLS + [("tools/list", {"cursor": "..."})], got, want):
                assert g == w, f"{method} {params}: the result bytes differ through {route.via}\n{g!r}\n{w!r}"

    run(scenario)


# 4. tools/call, with progress


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_call_tools_with_progress(route):
    async def calls(session: ClientSession):
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress, total, message):
            seen.append((progress, total, message))

        await session.list_tools()  # lets the SDK validate add's structuredContent
        out = [
            dump(await session.call_tool("echo", {"text": "through"})),
            dump(await session.call_tool("add", {"a": 1.5, "b": 2.25})),
            dump(await session.call_tool("echo", {"text": 7})),
            dump(await session.call_tool("slow_progress", {"steps": 5, "interval_ms": 10}, progress_callback=on_progress)),
        ]
        # Progress rides the call's own SSE stream; in JSON mode it has no wire at all.
        return out, sorted(seen)

    async def scenario():
        results, progress = await same_both_ways(route, calls)
        assert results[0]["content"] == [{"type": "text", "text": "through"}]
        assert results[1]["structuredContent"] == {"sum": 3.75}
        assert results[2]["isError"] is True
        assert results[3]["content"] == [{"type": "text", "text": "counted to 5"}]
        if route.mode == "json":
            assert progress == []
        else:
            assert progress == [(float(n), 5.0, f"step {n} of 5") for n in range(1, 6)]

    run(scenario)


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_upstream_jsonrpc_error_reaches_the_agent(route):
    async def failing(session: ClientSession):
        errors = []
        for args in (
            {"code": -32099, "message": "upstream says no", "data": {"why": ["because", 1, None]}},
            {"code": 4242, "message": "custom"},
        ):
            with pytest.raises(MCPError) as err:
                await session.call_tool("fail", args)
            errors.append(dump(err.value.error))
        # The session survives its errors.
        errors.append(tool_text(await session.call_tool("echo", {"text": "still here"})))
        return errors

    async def scenario():
        errors = await same_both_ways(route, failing)
        assert errors == [
            {"code": -32099, "message": "upstream says no", "data": {"why": ["because", 1, None]}},
            {"code": 4242, "message": "custom"},
            "still here",
        ]

    run(scenario)


# 5. prompts/get, resources/read, templates, completion


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_prompts_resources_completion(route):
    async def reads(session: ClientSession):
        out: list[Any] = [
            dump(await session.get_prompt("greet", {"name": "Ada", "style": "formal"})),
            dump(await session.get_prompt("greet", {"name": "Bob"})),
            dump(await session.get_prompt("review", {"code": "fn main() {}"})),
        ]
        for uri in ("res://readme", "res://config", "res://logo.png", "res://data.bin", "res://items/42", "res://blobs/x"):
            out.append(dump(await session.read_resource(uri)))
        for failing in (
            lambda: session.get_prompt("nope"),
            lambda: session.read_resource("res://missing"),
        ):
            with pytest.raises(MCPError) as err:
                await failing()
            out.append(dump(err.value.error))
        out.append(dump(await session.complete(types.PromptReference(name="greet"), {"name": "style", "value": ""})))
        out.append(
            dump(await session.complete(types.ResourceTemplateReference(uri="res://items/{id}"), {"name": "id", "value": "1"}))
        )
        return out

    async def scenario():
        got = await same_both_ways(route, reads)
        assert got[0]["messages"][0]["content"]["text"] == "Please write a formal greeting for Ada."
        assert got[1]["description"] == "A greeting for Bob"
        assert [m["role"] for m in got[2]["messages"]] == ["user", "assistant"]
        readme, config, logo, data, item, blob = got[3:9]
        assert readme["contents"][0]["text"].startswith("# Upstream")
        assert json.loads(config["contents"][0]["text"])["mode"] == route.mode
        assert base64.b64decode(logo["contents"][0]["blob"]).startswith(b"\x89PNG")
        assert base64.b64decode(data["contents"][0]["blob"]) == bytes(range(256))
        assert item["contents"][0] == {"uri": "res://items/42", "mimeType": "text/plain", "text": "item 42"}
        assert base64.b64decode(blob["contents"][0]["blob"]) == b"xxx"
        assert got[9] == {"code": -32602, "message": "Unknown prompt: nope"}
        assert got[10] == {"code": -32002, "message": "Resource not found", "data": {"uri": "res://missing"}}
        assert got[11]["completion"]["values"] == ["formal", "casual"]
        assert got[12]["completion"]["values"] == ["1", "12"]

    run(scenario)


# 6. subscriptions and logging: notifications on the GET stream


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_subscribe_then_resources_updated(route):
    async def scenario():
        notes = Collector()
        uri = f"res://items/{unique('sub')}"
        async with open_session(route.url, message_handler=notes) as (session, wire, _):
            with anyio.fail_after(TIMEOUT_S):
                await wire.get_open.wait()
            assert isinstance(await session.subscribe_resource(uri), types.EmptyResult)
            touched = await session.call_tool("touch", {"uri": uri})
            assert tool_text(touched) == f"touched {uri}: notified 1 session(s)"
            with anyio.fail_after(TIMEOUT_S):
                updates = await notes.wait_for(types.ResourceUpdatedNotification)
            assert [u.params.uri for u in updates] == [uri]

            assert isinstance(await session.unsubscribe_resource(uri), types.EmptyResult)
            again = await session.call_tool("touch", {"uri": uri})
            assert tool_text(again) == f"touched {uri}: notified 0 session(s)"
            await session.send_ping()
            assert len(notes.of(types.ResourceUpdatedNotification)) == 1

    run(scenario)


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_logging_level_and_messages(route):
    async def scenario():
        logs = Collector()
        async with open_session(route.url, message_handler=logs) as (session, wire, _):
            with anyio.fail_after(TIMEOUT_S):
                await wire.get_open.wait()
            assert isinstance(await session.set_logging_level("warning"), types.EmptyResult)
            quiet = await session.call_tool("log", {"level": "info", "message": "quiet"})
            assert tool_text(quiet) == "not sent: below the session level warning"
            loud = await session.call_tool("log", {"level": "error", "message": "loud"})
            assert tool_text(loud) == "logged at error"
            with anyio.fail_after(TIMEOUT_S):
                msgs = await logs.wait_for(types.LoggingMessageNotification)
            assert [(m.params.level, m.params.data, m.params.logger) for m in msgs] == [("error", "loud", "upstream")]

    run(scenario)


# 7. tools/list_changed from the upstream reaches the agent


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_upstream_tools_list_changed(route):
    async def scenario():
        notes = Collector()
        name = unique(DYNAMIC_PREFIX)
        async with open_session(route.url, message_handler=notes) as (session, wire, _):
            with anyio.fail_after(TIMEOUT_S):
                await wire.get_open.wait()
            assert tool_text(await session.call_tool("add_tool", {"name": name})) == f"added tool {name}"
            with anyio.fail_after(TIMEOUT_S):
                await notes.wait_for(types.ToolListChangedNotification, 1)
            pages = await all_pages(lambda p: session.list_tools(params=p))
            names = [t.name for p in pages for t in p.tools]
            assert names.count(name) == 1
            assert tool_text(await session.call_tool(name, {"text": "run-time tool"})) == "run-time tool"

            assert tool_text(await session.call_tool("remove_tool", {"name": name})) == f"removed tool {name}"
            with anyio.fail_after(TIMEOUT_S):
                await notes.wait_for(types.ToolListChangedNotification, 2)
            pages = await all_pages(lambda p: session.list_tools(params=p))
            assert name not in [t.name for p in pages for t in p.tools]
            assert len(notes.of(types.ToolListChangedNotification)) == 2

    run(scenario)


# 8. resumption


@pytest.mark.parametrize("route", RESUMABLE, indirect=True)
def test_resume_after_the_agent_drops(route):
    """The agent drops its connection mid-call (no DELETE, no cancel), then resumes the call
    on the same session with the SDK (GET + Last-Event-ID): it gets exactly the rest.

    The first leg is raw HTTP so the drop sends nothing (the SDK would send a courtesy
    cancel) and the test knows exactly which events arrived. The upstream pauses the call
    after step 4 until `release`, so the drop lands at a known point."""
    steps, pause_at = 12, 4
    tag = unique("resume")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            raw = RawSession(client, route.url)
            init = types.InitializeResult.model_validate((await raw.initialize()).result)
            call = {
                "jsonrpc": "2.0",
                "id": "call-1",
                "method": "tools/call",
                "params": {
                    "name": "slow_progress",
                    "arguments": {"steps": steps, "interval_ms": 10, "pause_at": pause_at, "tag": tag},
                    "_meta": {"progressToken": "tok-1"},
                },
            }
            before: list[float] = []
            last_id = None
            async with client.stream("POST", route.url, content=json.dumps(call), headers=raw.headers()) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                async for event in stream_sse(response):
                    assert event.id, f"a resumable stream puts an id on every event: {event}"
                    last_id = event.id
                    if event.data:
                        message = json.loads(event.data)
                        assert message.get("method") == "notifications/progress", message
                        assert message["params"]["progressToken"] == "tok-1"
                        before.append(message["params"]["progress"])
                        if before[-1] == pause_at:
                            break
            # Leaving the block closed the connection mid-stream.
        assert before == list(range(1, pause_at + 1))

        notes = Collector()
        headers = {"mcp-session-id": raw.session_id, "mcp-protocol-version": PROTOCOL}
        async with open_session(
            route.url, message_handler=notes, initialize=False, headers=headers, terminate_on_close=False
        ) as (s2, _, _):
            s2.adopt(init)
            if not route.through_gateway:
                # Direct, the SDK must have let the dropped stream go before the resume
                # arrives, or the resumed stream is never fed (see `release`).
                dropped = await s2.call_tool("release", {"tag": tag, "until_dropped": True})
                assert tool_text(dropped) == "dropped"
            request = types.CallToolRequest(
                params=types.CallToolRequestParams(name="slow_progress", arguments=call["params"]["arguments"])
            )
            async with anyio.create_task_group() as tg:
                results: list[types.CallToolResult] = []

                async def resume():
                    results.append(
                        await s2.send_request(
                            request, types.CallToolResult, metadata=ClientMessageMetadata(resumption_token=last_id)
                        )
                    )

                tg.start_soon(resume)
                # Direct, the upstream itself sees the drop and the resume; through mcpyard
                # its stream never broke, mcpyard kept what it sent.
                released = await s2.call_tool("release", {"tag": tag, "after_resume": not route.through_gateway})
                assert tool_text(released) == "released"
            assert tool_text(results[0]) == f"counted to {steps}"
        resumed = [m.params.progress for m in notes.of(types.ProgressNotification)]
        assert resumed == list(range(pause_at + 1, steps + 1)), "exactly the events after Last-Event-ID"
        assert all(m.params.progress_token == "tok-1" for m in notes.of(types.ProgressNotification))

        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            gone = await client.delete(route.url, headers=headers)
            assert gone.status_code in (200, 204)

    run(scenario)


@pytest.mark.parametrize("route", RESUMABLE, indirect=True)
def test_resume_after_the_upstream_drops(route):
    """The upstream closes the call's SSE response after step 3 (it may: it sent event ids
    and `retry`); the call must still complete with every progress step exactly once."""

    async def scenario():
        seen: list[float] = []

        async def on_progress(progress, total, message):
            seen.append(progress)

        async with open_session(route.url) as (session, _, _):
            with anyio.fail_after(TIMEOUT_S):
                result = await session.call_tool(
                    "slow_progress", {"steps": 8, "interval_ms": 20, "drop_at": 3}, progress_callback=on_progress
                )
            assert tool_text(result) == "counted to 8"
            assert sorted(seen) == [float(n) for n in range(1, 9)]
            assert tool_text(await session.call_tool("echo", {"text": "after"})) == "after"

    run(scenario)


# 9. elicitation: a server->client request in the middle of a call


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_elicitation(route):
    async def scenario():
        asked: list[types.ElicitRequestParams] = []

        async def on_elicit(context, params):
            asked.append(params)
            if len(asked) == 1:
                return types.ElicitResult(action="accept", content={"name": "Ada Lovelace"})
            return types.ElicitResult(action="decline")

        # On the call's own stream (SSE modes), or on the GET stream (any mode).
        via = "standalone" if route.mode == "json" else "request"
        async with open_session(route.url, elicitation_callback=on_elicit) as (session, wire, _):
            with anyio.fail_after(TIMEOUT_S):
                await wire.get_open.wait()
            accepted = await session.call_tool("elicit_name", {"via": via})
            assert tool_text(accepted) == "accept: Ada Lovelace"
            assert accepted.structured_content == {"action": "accept", "name": "Ada Lovelace"}
            declined = await session.call_tool("elicit_name", {"via": "standalone"})
            assert tool_text(declined) == "decline: None"
            assert [a.message for a in asked] == ["What is your name?"] * 2
            assert asked[0].requested_schema["required"] == ["name"]
            if route.mode == "json":
                # A JSON response cannot carry a request: the upstream's SDK says so.
                failed = await session.call_tool("elicit_name", {"via": "request"})
                assert failed.is_error and tool_text(failed).startswith("elicitation failed")
                assert len(asked) == 2

    run(scenario)


# 10. cancellation


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_cancel_reaches_the_upstream(route):
    async def scenario():
        tag = unique("sleep")
        async with open_session(route.url) as (session, _, _):
            cancelled_at = None
            async with anyio.create_task_group() as tg:
                scope = anyio.CancelScope()

                async def call():
                    with scope:
                        await session.call_tool("sleep", {"seconds": 60, "tag": tag})
                        raise AssertionError("a 60 s sleep finished")

                tg.start_soon(call)
                started = await session.call_tool("sleep_status", {"tag": tag, "until": "started", "wait_s": TIMEOUT_S - 1})
                assert tool_text(started) == "running"
                scope.cancel()  # the SDK sends notifications/cancelled for the call
                cancelled_at = anyio.current_time()
            ended = await session.call_tool("sleep_status", {"tag": tag, "until": "ended", "wait_s": TIMEOUT_S - 1})
            assert tool_text(ended) == "cancelled", "the upstream must see the cancellation and stop the call"
            assert anyio.current_time() - cancelled_at < TIMEOUT_S
            assert tool_text(await session.call_tool("echo", {"text": "alive"})) == "alive"

    run(scenario)


# 11. DELETE ends the session, here and upstream


async def upstream_stats(raw: RawSession, await_deleted: list[str] = ()) -> dict[str, list[str]]:
    """The upstream's own record of its sessions, asked on a raw session straight to it."""
    arguments = {"await_deleted": list(await_deleted), "wait_s": TIMEOUT_S - 1}
    reply = await raw.request("tools/call", {"name": "upstream_stats", "arguments": arguments})
    return reply.result["structuredContent"]


@pytest.mark.parametrize("route", ALL, indirect=True)
def test_delete_terminates_the_session(route):
    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            probe = RawSession(client, route.upstream_url)
            await probe.initialize()
            before = set((await upstream_stats(probe))["opened"])

            async with open_session(route.url) as (session, wire, _):
                assert tool_text(await session.call_tool("echo", {"text": "bye"})) == "bye"
                session_id = wire.session_id
            assert session_id
            assert ("DELETE", 200) in wire.statuses or ("DELETE", 204) in wire.statuses

            raw = RawSession(client, route.url)
            raw.session_id = session_id
            reply = await raw.request("tools/list", {})
            assert reply.status == 404, f"a deleted session must be gone: HTTP {reply.status}"
            gone = await client.get(route.url, headers={**raw.headers(), "accept": "text/event-stream"})
            assert gone.status_code == 404

            # The upstream session(s) behind the agent's session ended too: through mcpyard,
            # mcpyard DELETEs upstream what it opened for the agent.
            behind = sorted(set((await upstream_stats(probe))["opened"]) - before)
            assert behind, "the agent's session opened no upstream session"
            stats = await upstream_stats(probe, behind)
            assert set(behind) <= set(stats["deleted"]), f"upstream sessions {behind} not deleted: {stats['deleted']}"

    run(scenario)
