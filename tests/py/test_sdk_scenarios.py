"""Scenarios through the official MCP Python SDK against mcpyard's demo exit."""

from __future__ import annotations

import json

import anyio
import httpx2
import pytest
from mcp import types
from mcp.shared.message import ClientMessageMetadata

import helpers
import rawmcp
from helpers import PROTOCOL, TIMEOUT_S, Collector, connect, tool_text

# logging/setLevel and resources/subscribe are current in 2025-11-25, which the gateway
# speaks; the SDK flags them only because the 2026 protocol drops them.
pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")


def run(fn, *args):
    helpers.run(fn, *args, timeout_s=TIMEOUT_S * 2)


def unique(prefix: str) -> str:
    return helpers.unique(f"{prefix}_")


# 1. initialize


def test_initialize(gateway):
    async def scenario():
        async with connect(gateway.url) as (session, wire, init):
            assert init is not None
            assert init.protocol_version == PROTOCOL
            assert init.server_info.name == "mcpyard"
            assert init.server_info.version
            caps = init.capabilities
            assert caps.tools is not None
            assert caps.prompts is not None
            assert caps.resources is not None and caps.resources.subscribe is True
            assert caps.logging is not None
            assert caps.completions is not None
            assert wire.session_id, "initialize must answer with an Mcp-Session-Id"
            assert session.protocol_version == PROTOCOL
            # The session works after the handshake.
            assert isinstance(await session.send_ping(), types.EmptyResult)

    run(scenario)


# 2. listings


def test_listings(gateway):
    async def scenario():
        async with connect(gateway.url) as (session, _, _init):
            tools = await session.list_tools()
            names = [t.name for t in tools.tools]
            assert names[:7] == ["echo", "add", "progress", "add_tool", "remove_tool", "touch_resource", "log"]
            add = next(t for t in tools.tools if t.name == "add")
            assert add.output_schema is not None and add.output_schema["required"] == ["sum"]
            assert add.input_schema["required"] == ["a", "b"]

            prompts = await session.list_prompts()
            assert [p.name for p in prompts.prompts] == ["greet"]
            args = prompts.prompts[0].arguments or []
            assert [(a.name, bool(a.required)) for a in args] == [("name", True), ("style", False)]

            first = await session.list_resources()
            assert [r.uri for r in first.resources] == ["demo://readme", "demo://config"]
            assert first.next_cursor == "page-2"
            second = await session.list_resources(params=types.PaginatedRequestParams(cursor=first.next_cursor))
            assert [r.uri for r in second.resources] == ["demo://status"]
            assert second.next_cursor is None
            every = first.resources + second.resources
            assert len(every) == 3
            assert {r.uri: r.mime_type for r in every} == {
                "demo://readme": "text/markdown",
                "demo://config": "application/json",
                "demo://status": "text/plain",
            }

            templates = await session.list_resource_templates()
            assert [t.uri_template for t in templates.resource_templates] == ["demo://items/{id}"]
            assert templates.resource_templates[0].name == "item"

    run(scenario)


# 3. tools


def test_call_tools(gateway):
    async def scenario():
        async with connect(gateway.url) as (session, _, _init):
            await session.list_tools()  # lets the SDK validate add's structuredContent
            echo = await session.call_tool("echo", {"text": "héllo, mcpyard"})
            assert echo.is_error is False or echo.is_error is None
            assert tool_text(echo) == "héllo, mcpyard"

            add = await session.call_tool("add", {"a": 40, "b": 2})
            assert not add.is_error
            assert add.structured_content == {"sum": 42}
            assert tool_text(add) == "42"

            fsum = await session.call_tool("add", {"a": 1.5, "b": 2.25})
            assert fsum.structured_content == {"sum": 3.75}

            bad = await session.call_tool("echo", {"text": 7})
            assert bad.is_error is True
            assert "text" in tool_text(bad)

    run(scenario)


def test_progress(gateway):
    async def scenario():
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(progress, total, message):
            seen.append((progress, total, message))

        async with connect(gateway.url) as (session, _, _init):
            result = await session.call_tool("progress", {"steps": 6}, progress_callback=on_progress)
            assert not result.is_error
            assert tool_text(result) == "done after 6 steps"
            assert [p for p, _, _ in seen] == [1, 2, 3, 4, 5, 6]
            assert all(total == 6 for _, total, _ in seen)
            assert seen[2][2] == "step 3 of 6"

            # Without a progress callback the SDK sends no token: no progress events.
            quiet = await session.call_tool("progress", {"steps": 3})
            assert tool_text(quiet) == "done after 3 steps"
            assert len(seen) == 6

    run(scenario)


# 4. prompts, resources, completion, logging


def test_prompts_resources_completion_logging(gateway):
    async def scenario():
        logs = Collector()
        async with connect(gateway.url, logs) as (session, wire, _init):
            formal = await session.get_prompt("greet", {"name": "Ada", "style": "formal"})
            assert formal.description == "A greeting for Ada"
            assert len(formal.messages) == 1
            assert formal.messages[0].role == "user"
            assert formal.messages[0].content.text == "Please write a formal greeting addressed to Ada."
            plain = await session.get_prompt("greet", {"name": "Bob"})
            assert plain.messages[0].content.text == "Please greet Bob."

            readme = await session.read_resource("demo://readme")
            assert len(readme.contents) == 1
            assert readme.contents[0].uri == "demo://readme"
            assert readme.contents[0].mime_type == "text/markdown"
            assert readme.contents[0].text.startswith("# mcpyard demo toolkit")
            item = await session.read_resource("demo://items/42")
            assert item.contents[0].text == "item 42"
            assert item.contents[0].mime_type == "text/plain"

            style = await session.complete(types.PromptReference(type="ref/prompt", name="greet"), {"name": "style", "value": "f"})
            assert style.completion.values == ["formal"]
            both = await session.complete(types.PromptReference(type="ref/prompt", name="greet"), {"name": "style", "value": ""})
            assert both.completion.values == ["formal", "casual"]
            ids = await session.complete(
                types.ResourceTemplateReference(type="ref/resource", uri="demo://items/{id}"), {"name": "id", "value": "4"}
            )
            assert ids.completion.values == ["42"]

            # logging/setLevel filters the log tool's notifications/message.
            assert isinstance(await session.set_logging_level("warning"), types.EmptyResult)
            below = await session.call_tool("log", {"level": "info", "message": "quiet"})
            assert tool_text(below) == "not sent: below the session level warning"
            with anyio.fail_after(TIMEOUT_S):
                await wire.get_open.wait()
            sent = await session.call_tool("log", {"level": "error", "message": "loud"})
            assert tool_text(sent) == "logged at error"
            with anyio.fail_after(TIMEOUT_S):
                msgs = await logs.wait_for(types.LoggingMessageNotification)
            assert [(m.params.level, m.params.data) for m in msgs] == [("error", "loud")]
            assert msgs[0].params.logger == "demo"

    run(scenario)


# 5. resource subscription


def test_subscribe_and_update(gateway):
    async def scenario():
        notes = Collector()
        async with connect(gateway.url, notes) as (session, wire, _init):
            with anyio.fail_after(TIMEOUT_S):
                await wire.get_open.wait()
            before = (await session.read_resource("demo://status")).contents[0].text
            assert isinstance(await session.subscribe_resource("demo://status"), types.EmptyResult)
            touched = await session.call_tool("touch_resource", {"uri": "demo://status"})
            assert tool_text(touched) == "touched demo://status: notified 1 session(s)"
            with anyio.fail_after(TIMEOUT_S):
                updates = await notes.wait_for(types.ResourceUpdatedNotification)
            assert [u.params.uri for u in updates] == ["demo://status"]
            after = (await session.read_resource("demo://status")).contents[0].text
            assert after != before, "the status counter must move with a touch"

            # A resource nobody subscribed to notifies nobody.
            other = await session.call_tool("touch_resource", {"uri": "demo://readme"})
            assert tool_text(other) == "touched demo://readme: notified 0 session(s)"
            await session.unsubscribe_resource("demo://status")
            again = await session.call_tool("touch_resource", {"uri": "demo://status"})
            assert tool_text(again) == "touched demo://status: notified 0 session(s)"
            await session.send_ping()
            assert len(notes.of(types.ResourceUpdatedNotification)) == 1

    run(scenario)


# 6. tools/list_changed


def test_tool_list_changed(gateway):
    async def scenario():
        notes = Collector()
        name = unique("dyn")
        async with connect(gateway.url, notes) as (session, wire, _init):
            with anyio.fail_after(TIMEOUT_S):
                await wire.get_open.wait()
            added = await session.call_tool("add_tool", {"name": name})
            assert tool_text(added) == f"added tool {name}"
            with anyio.fail_after(TIMEOUT_S):
                await notes.wait_for(types.ToolListChangedNotification, 1)
            names = [t.name for t in (await session.list_tools()).tools]
            assert names.count(name) == 1 and names[-1] == name
            echoed = await session.call_tool(name, {"text": "from a run-time tool"})
            assert tool_text(echoed) == "from a run-time tool"

            dup = await session.call_tool("add_tool", {"name": name})
            assert dup.is_error is True

            removed = await session.call_tool("remove_tool", {"name": name})
            assert tool_text(removed) == f"removed tool {name}"
            with anyio.fail_after(TIMEOUT_S):
                await notes.wait_for(types.ToolListChangedNotification, 2)
            assert name not in [t.name for t in (await session.list_tools()).tools]
            assert len(notes.of(types.ToolListChangedNotification)) == 2

    run(scenario)


# 7. list_changed reaches other sessions


def test_list_changed_reaches_other_sessions(gateway):
    async def scenario():
        a_notes, b_notes, c_notes = Collector(), Collector(), Collector()
        name = unique("shared")
        async with (
            connect(gateway.url, a_notes) as (a, a_wire, _ia),
            connect(gateway.url, b_notes) as (b, b_wire, _ib),
            connect(gateway.url, c_notes) as (c, c_wire, _ic),
        ):
            assert len({a_wire.session_id, b_wire.session_id, c_wire.session_id}) == 3
            with anyio.fail_after(TIMEOUT_S):
                for wire in (a_wire, b_wire, c_wire):
                    await wire.get_open.wait()
            await a.call_tool("add_tool", {"name": name})
            with anyio.fail_after(TIMEOUT_S):
                for notes in (a_notes, b_notes, c_notes):
                    await notes.wait_for(types.ToolListChangedNotification, 1)
            assert name in [t.name for t in (await b.list_tools()).tools]
            assert tool_text(await c.call_tool(name, {"text": "c"})) == "c"
            await b.call_tool("remove_tool", {"name": name})
            with anyio.fail_after(TIMEOUT_S):
                for notes in (a_notes, b_notes, c_notes):
                    await notes.wait_for(types.ToolListChangedNotification, 2)
            assert name not in [t.name for t in (await a.list_tools()).tools]

    run(scenario)


# 8. resume a dropped POST SSE stream with the SDK's resumption token


def test_resume_dropped_progress_stream(gateway):
    steps = 30

    async def scenario():
        tokens: list[str] = []
        first_progress: list[float] = []
        enough = anyio.Event()

        async def on_token(token: str) -> None:
            tokens.append(token)

        async def on_progress(progress, total, message):
            first_progress.append(progress)
            if len(first_progress) >= 4:
                enough.set()

        request = types.CallToolRequest(
            params=types.CallToolRequestParams(name="progress", arguments={"steps": steps})
        )

        # Session 1: start the call, keep the resumption tokens, then drop the
        # connection without telling the server (no DELETE, no cancel).
        async with connect(gateway.url, terminate_on_close=False) as (s1, wire1, init):
            session_id = wire1.session_id
            assert session_id
            async with anyio.create_task_group() as tg:

                async def call():
                    await s1.send_request(
                        request,
                        types.CallToolResult,
                        metadata=ClientMessageMetadata(on_resumption_token_update=on_token),
                        progress_callback=on_progress,
                    )
                    raise AssertionError("the call finished before the stream was dropped")

                tg.start_soon(call)
                with anyio.fail_after(TIMEOUT_S):
                    await enough.wait()
                token = tokens[-1]
                tg.cancel_scope.cancel()
        assert init is not None
        seen_before = sorted(set(first_progress))
        assert seen_before == list(range(1, len(seen_before) + 1))
        assert len(seen_before) < steps, "the stream must be dropped mid-call"
        stream, _, _ = token.partition(".")
        assert stream.isdigit() and stream != "0", f"a POST stream event id, not {token!r}"

        # Session 2: a fresh client on the same session id resumes from the token.
        notes = Collector()
        resumed_tokens: list[str] = []

        async def on_token2(t: str) -> None:
            resumed_tokens.append(t)

        headers = {"mcp-session-id": session_id, "mcp-protocol-version": PROTOCOL}
        async with connect(gateway.url, notes, initialize=False, headers=headers, terminate_on_close=False) as (
            s2,
            wire2,
            _,
        ):
            s2.adopt(init)
            with anyio.fail_after(TIMEOUT_S):
                result = await s2.send_request(
                    request,
                    types.CallToolResult,
                    metadata=ClientMessageMetadata(resumption_token=token, on_resumption_token_update=on_token2),
                )
            assert ("GET", 200) in wire2.statuses
            assert not any(m == "POST" for m, _ in wire2.statuses), "a resume must not re-send the call"
        assert not result.is_error
        assert tool_text(result) == f"done after {steps} steps"
        resumed = [m.params.progress for m in notes.of(types.ProgressNotification)]
        assert resumed, "the resumed stream must carry the remaining progress"
        # Exactly the events after the token, in order, ending at the last step.
        assert resumed == list(range(int(resumed[0]), steps + 1))
        assert 2 <= resumed[0] <= len(first_progress) + 2
        # Event ids keep counting on the same stream, right after the token: the
        # remaining progress events and then the result, nothing lost or repeated.
        seq = int(token.partition(".")[2])
        assert resumed_tokens == [f"{stream}.{n}" for n in range(seq + 1, seq + 1 + len(resumed_tokens))]
        assert len(resumed_tokens) == len(resumed) + 1
        assert seq + len(resumed) == steps

        # The session is still usable; end it.
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as raw:
            gone = await raw.delete(gateway.url, headers=headers)
            assert gone.status_code in (200, 204)

    run(scenario)


# 9. DELETE on close


def test_terminate_on_close(gateway):
    async def scenario():
        async with connect(gateway.url) as (session, wire, _init):
            assert tool_text(await session.call_tool("echo", {"text": "bye"})) == "bye"
            session_id = wire.session_id
        assert session_id
        assert ("DELETE", 200) in wire.statuses or ("DELETE", 204) in wire.statuses
        body = {"jsonrpc": "2.0", "id": 9, "method": "tools/list", "params": {}}
        headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-session-id": session_id,
            "mcp-protocol-version": PROTOCOL,
        }
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as raw:
            reply = await raw.post(gateway.url, content=json.dumps(body), headers=headers)
            assert reply.status_code == 404
            # An unknown session id is refused the same way, so the 404 above is the DELETE's doing.
            headers["mcp-session-id"] = "not-a-session"
            assert (await raw.post(gateway.url, content=json.dumps(body), headers=headers)).status_code in (400, 404)

    run(scenario)


# 10. an idle GET stream is kept alive

KEEPALIVE_S = 15  # SSE_KEEPALIVE_INTERVAL in src/limits.rs


@pytest.mark.parametrize("gateway", [(1, "epoll")], indirect=True, ids=["w1-epoll"])
def test_an_idle_get_stream_gets_a_comment_after_the_keepalive_interval(gateway):
    """A GET stream with nothing to say gets an SSE comment (`:`) once the keep-alive
    interval passed since its last write, so proxies in between do not drop it as idle;
    not sooner, and the stream stays open after it."""

    async def main():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(KEEPALIVE_S * 3)) as c:
            raw = rawmcp.RawSession(c, gateway.url)
            await raw.initialize()
            headers = {**raw.headers(), "accept": "text/event-stream"}
            async with c.stream("GET", gateway.url, headers=headers) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                opened = anyio.current_time()
                seen = b""
                comment_at = None
                with anyio.fail_after(KEEPALIVE_S + 8):
                    async for chunk in response.aiter_raw():
                        seen += chunk
                        if b"\n:\n\n" in seen or seen.startswith(b":\n\n"):
                            comment_at = anyio.current_time() - opened
                            break
                assert comment_at is not None
                assert KEEPALIVE_S - 1 <= comment_at <= KEEPALIVE_S + 5, comment_at
                # Only the priming event came before it: nothing else was written.
                before = seen[: seen.index(b":\n\n")]
                assert before.count(b"id:") <= 1, before
            # The session still works after the stream.
            reply = await raw.request("ping")
            assert reply.status == 200

    run(main)
