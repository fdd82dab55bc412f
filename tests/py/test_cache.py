"""The proxy's list cache, in front of real Python-SDK upstreams, checked from both ends:
what agents get (raw HTTP: exact answers, GET streams) and what the upstreams were asked
(each upstream counts the list requests it served, `upstream_stats`).

- lists come from the cache: after hydration, agents' list requests cost the upstreams
  nothing, and `initialize` opens no upstream session;
- `initialize` waits for the first hydration, so the first list is complete;
- lists are refreshed on the TTL;
- an upstream change reaches every live session as exactly one `list_changed`; a
  `list_changed` that changes nothing reaches nobody;
- an agent's GET stream opens no upstream session (list changes come from the cache);
- an upstream that is down keeps its previous list served, and comes back;
- hydration carries the cache's credential; a route refusing it is left out;
- identity: a route that forwards the agent's credential is shown to a session only once
  it accepted that session's own credential (no token, a wrong one: not listed; the only
  route: the agent gets its 401 challenge), while agents with the right credential are
  served the cached lists with no upstream list call;
- a route that is down at the first hydration (or restarts during one) joins as soon as
  it answers, and live sessions hear `list_changed` once; lists slower than the cache's
  lease still hydrate (the lease is renewed while they run);
- with 2 workers and 100 sessions, one worker hydrates (one lease) and each refresh lists
  each route once.
"""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

import harness
from helpers import run, unique
from rawmcp import RawSession, stream_sse

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

TIMEOUT_S = 10
# The SDK upstream pages its lists by 2: its 16 tools are 8 pages.
TOOL_PAGES = 8
LIST_KINDS = ["tools/list", "prompts/list", "resources/list", "resources/templates/list"]


def cache_config(
    urls: dict[str, str],
    *,
    workers: int,
    io: str,
    ttl: str,
    metrics_port: int,
    authorization: str | None = None,
    forward: tuple[str, ...] = (),
) -> str:
    lines = [
        f"runtime: {{ workers: {workers}, io: {io} }}",
        f"telemetry: {{ metrics: 127.0.0.1:{metrics_port} }}",
        "stores: { cache0: { type: memory } }",
        "bindings:",
        "  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: tools }",
        "  tools:",
        "    kind: proxy",
        f"    cache: {{ store: cache0, ttl: {ttl}{', authorization: ' + authorization if authorization else ''} }}",
        "    routes:",
    ]
    lines += [f"      - {{ toolkit: {name}, exit: {name} }}" for name in urls]
    lines += [
        f'  {name}: {{ kind: client, server: "{url}", response_timeout: 5s, connect_timeout: 1s'
        + (", authorization: forward }" if name in forward else " }")
        for name, url in urls.items()
    ]
    return "\n".join(lines) + "\n"


class Stack:
    """A caching proxy in front of `upstreams`, and its metrics."""

    def __init__(
        self,
        upstreams: dict[str, harness.Child],
        tmp_path: Path,
        *,
        workers=1,
        io="uring",
        ttl="5m",
        authorization: str | None = None,
        forward: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        urls = {name: child.address for name, child in upstreams.items()}
        config = cache_config(
            urls,
            workers=workers,
            io=io,
            ttl=ttl,
            metrics_port=0,
            authorization=authorization,
            forward=forward,
        )
        self.gateway = harness.start_mcpyard(config, tmp_path, env)
        self.metrics_port = self.gateway.metrics_port()
        self.url = self.gateway.address

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=TIMEOUT_S) as r:
            text = r.read().decode()
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def stop(self) -> None:
        harness.stop_mcpyard(self.gateway)

    def run(self, scenario, **options) -> None:
        """Runs the async `scenario` (`options` as for helpers.run), then stops the stack
        (mcpyard must exit 0) either way."""
        try:
            run(scenario, **options)
        finally:
            self.stop()


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    work = tmp_path_factory.mktemp("cache-upstreams")
    children = {name: harness.start_upstream("sse-resumable", work / name, name=name) for name in ("alpha", "beta")}
    yield children
    for child in children.values():
        harness.stop_upstream(child)


async def stats(client: httpx2.AsyncClient, url: str) -> dict[str, Any]:
    """What the upstream at `url` says it served (a session straight to it)."""
    raw = RawSession(client, url)
    await raw.initialize()
    reply = await raw.request("tools/call", {"name": "upstream_stats", "arguments": {}})
    await raw.delete()
    return reply.result["structuredContent"]


async def listing(raw: RawSession) -> dict[str, list[str]]:
    """The agent's four lists, by the names (or uris) of their items."""
    out = {}
    for method, array, key in [
        ("tools/list", "tools", "name"),
        ("prompts/list", "prompts", "name"),
        ("resources/list", "resources", "uri"),
        ("resources/templates/list", "resourceTemplates", "uriTemplate"),
    ]:
        reply = await raw.request(method)
        assert reply.status == 200, reply.body
        out[array] = [item[key] for item in reply.result[array]]
    return out


async def until(check, what: str, timeout_s: float = TIMEOUT_S):
    """Polls `check()` (async) until it returns something true; fails after `timeout_s`."""
    with anyio.fail_after(timeout_s):
        while True:
            got = await check()
            if got:
                return got
            await anyio.sleep(0.05)
    raise AssertionError(what)


def test_lists_come_from_the_cache_without_upstream_round_trips(upstreams, tmp_path):
    stack = Stack(upstreams, tmp_path, workers=2)

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            # The first agent waits for the first hydration; after it, nobody pays upstream.
            first = RawSession(client, stack.url)
            await first.initialize()
            await listing(first)
            before = {name: await stats(client, child.address) for name, child in upstreams.items()}
            seen = []
            for _ in range(5):
                raw = RawSession(client, stack.url)
                init = await raw.initialize()
                assert init.result["capabilities"]["tools"] == {"listChanged": True}
                got = await listing(raw)
                seen.append(got)
                await raw.delete()
            after = {name: await stats(client, child.address) for name, child in upstreams.items()}
            for name in upstreams:
                assert after[name]["lists"] == before[name]["lists"], f"{name} was asked for lists"
                # initialize opened no upstream session (only our stats sessions did).
                new = set(after[name]["opened"]) - set(before[name]["opened"])
                assert len(new) == 1, f"{name}: sessions opened meanwhile: {new}"
            tools = seen[0]["tools"]
            assert tools[:2] == ["alpha__echo", "alpha__add"] and "beta__echo" in tools
            assert seen[0]["resourceTemplates"][0] == "alpha+res://items/{id}"
            assert all(s == seen[0] for s in seen), "every agent gets the same lists"
            assert stack.metric("mcpyard_cache_hits_total") >= 20
            assert stack.metric("mcpyard_cache_misses_total") == 0
            # The cached list is one page, like the live one: no cursor was handed out.
            reply = await first.request("tools/list", {"cursor": "page-2"})
            assert reply.error == {"code": -32602, "message": "Invalid cursor"}, reply.body
            # Calls still reach the upstreams (their sessions open on demand).
            reply = await first.request("tools/call", {"name": "beta__whoami", "arguments": {}})
            assert reply.result["structuredContent"]["name"] == "beta"

    stack.run(scenario)


def test_initialize_waits_for_the_first_hydration(upstreams, tmp_path):
    slow = harness.start_upstream("sse", tmp_path / "slow", name="slow", list_delay_s=0.3)
    stack = Stack({"alpha": upstreams["alpha"], "slow": slow}, tmp_path)

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            # Straight after start: the slow route takes 8 pages × 0.3 s to list its tools.
            raw = RawSession(client, stack.url)
            await raw.initialize()
            tools = (await raw.request("tools/list")).result["tools"]
            names = [t["name"] for t in tools]
            assert sum(n.startswith("slow__") for n in names) == 16, names
            assert sum(n.startswith("alpha__") for n in names) == 16
            assert stack.metric("mcpyard_cache_misses_total") == 0, "the first list came from the cache"

    try:
        stack.run(scenario)
    finally:
        harness.stop_upstream(slow)


def test_lists_are_refreshed_on_the_ttl(upstreams, tmp_path):
    stack = Stack(upstreams, tmp_path, ttl="1s")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            raw = RawSession(client, stack.url)
            await raw.initialize()
            start = (await stats(client, upstreams["alpha"].address))["lists"]["tools"]

            async def refreshed():
                now = (await stats(client, upstreams["alpha"].address))["lists"]["tools"]
                return now >= start + 2 * TOOL_PAGES

            await until(refreshed, "no refresh on the TTL")

    stack.run(scenario)


async def open_stream(client: httpx2.AsyncClient, raw: RawSession):
    request = client.build_request("GET", raw.url, headers={**raw.headers(), "accept": "text/event-stream"})
    response = await client.send(request, stream=True)
    assert response.status_code == 200
    return response


async def collect(response: httpx2.Response, into: list[str]) -> None:
    async for event in stream_sse(response):
        if event.data:
            into.append(json.loads(event.data).get("method", ""))


async def listening(client: httpx2.AsyncClient, url: str, count: int, tg) -> tuple[list[RawSession], list[list[str]], list]:
    """`count` agents, each with its GET stream open and read (in `tg`) into its list of the
    methods it was sent."""
    agents = []
    for _ in range(count):
        raw = RawSession(client, url)
        await raw.initialize()
        agents.append(raw)
    seen: list[list[str]] = [[] for _ in agents]
    streams = [await open_stream(client, raw) for raw in agents]
    for response, into in zip(streams, seen):
        tg.start_soon(collect, response, into)
    return agents, seen, streams


@pytest.mark.parametrize("io", ["uring", "epoll"])
def test_list_changed_once_per_session_and_only_when_lists_change(upstreams, tmp_path, io):
    stack = Stack(upstreams, tmp_path, workers=2, ttl="1s", io=io)

    async def scenario():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=60)) as client:
            async with anyio.create_task_group() as tg:
                agents, seen, streams = await listening(client, stack.url, 6, tg)
                name = unique("dyn_")
                await agents[0].request("tools/call", {"name": "alpha__add_tool", "arguments": {"name": name}})
                await until(lambda: _all_once(seen), "not every session heard of the change")
                tools = [t["name"] for t in (await agents[3].request("tools/list")).result["tools"]]
                assert f"alpha__{name}" in tools
                # Refreshes go on (TTL 1 s) and an upstream says its list changed when it did
                # not: nobody is told again.
                told = stack.metric("mcpyard_cache_notifications_total")
                refreshes = stack.metric("mcpyard_cache_refreshes_ok_total")
                await agents[1].request("tools/call", {"name": "alpha__poke_list_changed", "arguments": {}})

                async def refreshed_twice():
                    return stack.metric("mcpyard_cache_refreshes_ok_total") >= refreshes + 8

                await until(refreshed_twice, "no refresh after the poke")
                assert stack.metric("mcpyard_cache_notifications_total") == told
                for s in seen:
                    assert s.count("notifications/tools/list_changed") == 1, s
                await agents[0].request("tools/call", {"name": "alpha__remove_tool", "arguments": {"name": name}})
                await until(lambda: _all_twice(seen), "the removal was not announced")
                tg.cancel_scope.cancel()
            for response in streams:
                await response.aclose()

    stack.run(scenario)


def test_a_get_stream_holds_no_upstream_session_until_a_request_needs_one(upstreams, tmp_path):
    stack = Stack(upstreams, tmp_path)

    async def scenario():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=60)) as client:
            first = RawSession(client, stack.url)
            await first.initialize()
            before = {name: set((await stats(client, c.address))["opened"]) for name, c in upstreams.items()}
            async with anyio.create_task_group() as tg:
                agents, seen, streams = await listening(client, stack.url, 3, tg)
                await anyio.sleep(0.3)
                # Listening costs the upstreams nothing: only our own stats session is new.
                for name, child in upstreams.items():
                    opened = set((await stats(client, child.address))["opened"]) - before[name]
                    assert len(opened) == 1, f"{name}: sessions opened for GET streams: {opened}"
                # A request opens the route it needs (and that route joins the stream);
                # list changes reach every stream, with or without routes behind it.
                name = unique("dyn_")
                await agents[0].request("tools/call", {"name": "alpha__add_tool", "arguments": {"name": name}})
                await until(lambda: _all_once(seen), "not every session heard of the change")
                opened = set((await stats(client, upstreams["alpha"].address))["opened"]) - before["alpha"]
                assert len(opened) == 3, opened  # two stats sessions and agents[0]'s
                reply = await agents[0].request("tools/call", {"name": "alpha__remove_tool", "arguments": {"name": name}})
                assert reply.status == 200
                await until(lambda: _all_twice(seen), "the removal was not announced")
                tg.cancel_scope.cancel()
            for response in streams:
                await response.aclose()

    stack.run(scenario)


async def _all_once(seen: list[list[str]]) -> bool:
    return all(s.count("notifications/tools/list_changed") == 1 for s in seen)


async def _all_twice(seen: list[list[str]]) -> bool:
    return all(s.count("notifications/tools/list_changed") == 2 for s in seen)


def test_a_route_that_is_down_keeps_its_list_and_comes_back(upstreams, tmp_path):
    port = harness.free_port()
    gamma = harness.start_upstream("json", tmp_path / "gamma", name="gamma", port=port)
    stack = Stack({"alpha": upstreams["alpha"], "gamma": gamma}, tmp_path, ttl="1s")

    async def scenario():
        nonlocal gamma
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            raw = RawSession(client, stack.url)
            await raw.initialize()
            extra = unique("dyn_")
            await raw.request("tools/call", {"name": "gamma__add_tool", "arguments": {"name": extra}})

            async def listed_extra():
                tools = [t["name"] for t in (await raw.request("tools/list")).result["tools"]]
                return f"gamma__{extra}" in tools

            await until(listed_extra, "the added tool never showed")
            harness.stop_upstream(gamma)
            failed = stack.metric("mcpyard_cache_refreshes_failed_total")

            async def failed_more():
                return stack.metric("mcpyard_cache_refreshes_failed_total") > failed

            await until(failed_more, "no refresh failed with the upstream down")
            # Still served, the upstream's last list included.
            assert await listed_extra()
            reply = await raw.request("tools/call", {"name": "gamma__whoami", "arguments": {}})
            assert reply.error["code"] == -32603, reply.body
            # It comes back (a fresh process: its run-time tool is gone).
            gamma = harness.start_upstream("json", tmp_path / "gamma2", name="gamma", port=port)

            async def recovered():
                return not await listed_extra()

            await until(recovered, "the upstream's new list never replaced the kept one")
            reply = await raw.request("tools/call", {"name": "gamma__whoami", "arguments": {}})
            assert reply.result["structuredContent"]["name"] == "gamma"

    try:
        stack.run(scenario)
    finally:
        harness.stop_upstream(gamma)


def test_hydration_carries_the_cache_credential_and_skips_a_route_refusing_it(upstreams, tmp_path):
    token = "hydrate-" + unique("")
    gate = harness.start_upstream("json", tmp_path / "gate", name="gate", token=token)
    locked = harness.start_upstream("json", tmp_path / "locked", name="locked", token="not-ours")
    stack = Stack(
        {"alpha": upstreams["alpha"], "gate": gate, "locked": locked},
        tmp_path,
        authorization='{ bearer: "${HYDRATE_TOKEN}" }',
        # Hydration plays the agent: its credential goes where an agent's would.
        forward=("gate", "locked"),
        env={"HYDRATE_TOKEN": token},
    )

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            # An agent with gate's own credential (gate forwards it, so it is shown gate's
            # items only once gate accepted it).
            raw = RawSession(client, stack.url, headers={"authorization": f"Bearer {token}"})
            await raw.initialize()
            tools = [t["name"] for t in (await raw.request("tools/list")).result["tools"]]
            # The credential opened gate; locked refused it and is left out, not fatal.
            assert sum(n.startswith("gate__") for n in tools) == 16, tools
            assert sum(n.startswith("alpha__") for n in tools) == 16
            assert not any(n.startswith("locked__") for n in tools)
            assert stack.metric('mcpyard_toolkit_hydrations_total{toolkit="gate",outcome="ok"}') >= 1
            assert stack.metric("mcpyard_proxy_routes_skipped_total") >= 1

    try:
        stack.run(scenario)
    finally:
        harness.stop_upstream(gate)
        harness.stop_upstream(locked)
    log = stack.gateway.stderr()
    assert "locked" in log, log
    assert token not in log, "the hydration credential was logged"


def test_one_worker_hydrates_for_a_hundred_sessions(upstreams, tmp_path):
    stack = Stack(upstreams, tmp_path, workers=2, ttl="1s")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S, limits=httpx2.Limits(max_connections=20)) as client:
            before = (await stats(client, upstreams["beta"].address))["lists"].get("tools", 0)
            hydrations = stack.metric('mcpyard_toolkit_hydrations_total{toolkit="beta",outcome="ok"}')

            async def agent():
                raw = RawSession(client, stack.url)
                await raw.initialize()
                for method in LIST_KINDS:
                    assert (await raw.request(method)).status == 200

            async with anyio.create_task_group() as tg:
                for _ in range(100):
                    tg.start_soon(agent)
            after = (await stats(client, upstreams["beta"].address))["lists"].get("tools", 0)
            hydrated = stack.metric('mcpyard_toolkit_hydrations_total{toolkit="beta",outcome="ok"}') - hydrations
            # 400 list requests of agents; the upstream saw only the hydrations' pages: one
            # worker holds the lease, and each refresh lists each kind once.
            assert stack.metric("mcpyard_cache_lease_changes_total") == 1
            tool_lists = (after - before) / TOOL_PAGES
            assert tool_lists <= hydrated / 4 + 1, (after - before, hydrated)
            assert stack.metric("mcpyard_cache_hits_total") >= 400

    stack.run(scenario, timeout_s=60)


def test_a_route_down_at_the_first_hydration_joins_when_it_comes_up(upstreams, tmp_path):
    port = harness.free_port()
    stack = Stack({"alpha": upstreams["alpha"], "late": _Url(f"http://127.0.0.1:{port}/mcp")}, tmp_path, ttl="2s")
    late = None

    async def scenario():
        nonlocal late
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=60)) as client:
            async with anyio.create_task_group() as tg:
                agents, seen, streams = await listening(client, stack.url, 2, tg)
                tools = [t["name"] for t in (await agents[0].request("tools/list")).result["tools"]]
                assert tools and all(n.startswith("alpha__") for n in tools), tools
                late = harness.start_upstream("json", tmp_path / "late", name="late", port=port)

                async def joined():
                    tools = [t["name"] for t in (await agents[1].request("tools/list")).result["tools"]]
                    return sum(n.startswith("late__") for n in tools) == 16

                # Retried with backoff bounded by the TTL (2 s): well within the timeout.
                await until(joined, "the route that came up never joined the cached lists")
                await until(lambda: _all_once(seen), "live sessions were not told, once")
                await anyio.sleep(2.5)  # another TTL refresh: nothing new, nobody told again
                assert all(s.count("notifications/tools/list_changed") == 1 for s in seen), seen
                tg.cancel_scope.cancel()
            for response in streams:
                await response.aclose()
            assert stack.metric('mcpyard_toolkit_hydrations_total{toolkit="late",outcome="ok"}') >= 1
            # A new session is told late's capabilities and calls its tools.
            raw = RawSession(client, stack.url)
            await raw.initialize()
            reply = await raw.request("tools/call", {"name": "late__whoami", "arguments": {}})
            assert reply.result["structuredContent"]["name"] == "late"

    try:
        stack.run(scenario, timeout_s=60)
    finally:
        if late is not None:
            harness.stop_upstream(late)


def test_a_route_restarted_during_hydration_joins_when_it_is_back(upstreams, tmp_path):
    port = harness.free_port()
    # 8 pages of tools, 0.4 s each: the first hydration is in the middle of them when the
    # route is killed.
    slow = harness.start_upstream("json", tmp_path / "slow1", name="slow", port=port, list_delay_s=0.4)
    stack = Stack({"alpha": upstreams["alpha"], "slow": slow}, tmp_path, ttl="2s")

    async def scenario():
        nonlocal slow
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            await anyio.sleep(1.0)
            harness.stop_upstream(slow)
            await anyio.sleep(1.0)
            slow = harness.start_upstream("json", tmp_path / "slow2", name="slow", port=port, list_delay_s=0.4)
            raw = RawSession(client, stack.url)
            await raw.initialize()

            async def whole():
                tools = [t["name"] for t in (await raw.request("tools/list")).result["tools"]]
                return sum(n.startswith("slow__") for n in tools) == 16 and sum(n.startswith("alpha__") for n in tools) == 16

            await until(whole, "the restarted route never joined", timeout_s=30)
            reply = await raw.request("tools/call", {"name": "slow__whoami", "arguments": {}})
            assert reply.result["structuredContent"]["name"] == "slow"

    try:
        stack.run(scenario, timeout_s=60)
    finally:
        harness.stop_upstream(slow)


def test_lists_slower_than_the_lease_still_hydrate(upstreams, tmp_path):
    # TTL 1 s, so the leases are 1 s; one page of tools every 0.25 s: 8 pages, 2 s a list.
    slow = harness.start_upstream("json", tmp_path / "slow", name="slow", list_delay_s=0.25)
    stack = Stack({"alpha": upstreams["alpha"], "slow": slow}, tmp_path, ttl="1s")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            raw = RawSession(client, stack.url)
            await raw.initialize()
            tools = [t["name"] for t in (await raw.request("tools/list")).result["tools"]]
            assert sum(n.startswith("slow__") for n in tools) == 16, tools
            # initialize was answered from a ready cache, not after the gate ran out.
            assert stack.metric("mcpyard_cache_misses_total") == 0
            log = stack.gateway.stderr()
            assert "nothing written" not in log, log[-3000:]

    try:
        stack.run(scenario, timeout_s=60)
    finally:
        harness.stop_upstream(slow)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """An upstream that needs `Bearer <token>` (its client forwards the agent's)."""
    token = "agent-" + unique("")
    child = harness.start_upstream("json", tmp_path_factory.mktemp("guarded"), name="guard", token=token)
    yield child, token
    harness.stop_upstream(child)


async def guarded_stats(client: httpx2.AsyncClient, url: str, token: str) -> dict[str, Any]:
    raw = RawSession(client, url, headers={"authorization": f"Bearer {token}"})
    await raw.initialize()
    reply = await raw.request("tools/call", {"name": "upstream_stats", "arguments": {}})
    await raw.delete()
    return reply.result["structuredContent"]


def test_a_forwarding_route_is_shown_only_to_sessions_it_accepted(upstreams, guarded, tmp_path):
    child, token = guarded
    stack = Stack(
        {"alpha": upstreams["alpha"], "guard": child},
        tmp_path,
        authorization='{ bearer: "${HYDRATE_TOKEN}" }',
        forward=("guard",),
        env={"HYDRATE_TOKEN": token},
    )

    async def tools_of(raw: RawSession) -> list[str]:
        reply = await raw.request("tools/list")
        assert reply.status == 200, reply.body
        return [t["name"] for t in reply.result["tools"]]

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            good = RawSession(client, stack.url, headers={"authorization": f"Bearer {token}"})
            await good.initialize()
            assert sum(n.startswith("guard__") for n in await tools_of(good)) == 16
            before = await guarded_stats(client, child.address, token)
            good_init = await RawSession(client, stack.url, headers={"authorization": f"Bearer {token}"}).initialize()
            assert "guard: " in good_init.result["instructions"], good_init.result
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic Zm9vOmJhcg=="}):
                raw = RawSession(client, stack.url, headers=headers)
                init = await raw.initialize()
                # Not even the hidden route's instructions (they are alpha's alone).
                assert init.result.get("instructions") == "Test upstream alpha for the mcpyard gateway tests.", init.result
                tools = await tools_of(raw)
                assert tools and not any(n.startswith("guard__") for n in tools), (headers, tools)
                assert sum(n.startswith("alpha__") for n in tools) == 16
                # Calling one of its tools gets the route's own challenge, as without a cache.
                reply = await raw.request("tools/call", {"name": "guard__whoami", "arguments": {}})
                assert reply.status == 401, (headers, reply.status, reply.body)
                assert reply.headers["www-authenticate"].lower().startswith("bearer"), reply.headers
                assert init.result["capabilities"]["tools"] == {"listChanged": True}
            # More sessions with the right credential: the cached lists, and the route is
            # asked for no list (only its sessions open).
            for _ in range(3):
                raw = RawSession(client, stack.url, headers={"authorization": f"Bearer {token}"})
                await raw.initialize()
                assert sum(n.startswith("guard__") for n in await tools_of(raw)) == 16
                reply = await raw.request("prompts/list")
                assert reply.status == 200
            after = await guarded_stats(client, child.address, token)
            assert after["lists"] == before["lists"], (before["lists"], after["lists"])
            assert len(after["opened"]) - len(before["opened"]) == 2 + 3, "one session per agent with the credential"

    stack.run(scenario, timeout_s=60)
    assert token not in stack.gateway.stderr()


def test_the_only_route_refusing_an_agent_gets_it_the_challenge(guarded, tmp_path):
    child, token = guarded
    stack = Stack(
        {"guard": child},
        tmp_path,
        authorization='{ bearer: "${HYDRATE_TOKEN}" }',
        forward=("guard",),
        env={"HYDRATE_TOKEN": token},
    )

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            for headers in ({}, {"authorization": "Bearer wrong"}):
                raw = RawSession(client, stack.url, headers=headers)
                reply = await raw.initialize(expect_ok=False)
                assert reply.status == 401, (headers, reply.status, reply.body)
                assert "mcp-session-id" not in reply.headers
                assert reply.headers["www-authenticate"].lower().startswith("bearer"), reply.headers
            raw = RawSession(client, stack.url, headers={"authorization": f"Bearer {token}"})
            await raw.initialize()
            tools = (await raw.request("tools/list")).result["tools"]
            assert sum(t["name"].startswith("guard__") for t in tools) == 16

    stack.run(scenario, timeout_s=60)


class _Url:
    """Stands for an upstream not started yet: only its address is known."""

    def __init__(self, address: str) -> None:
        self.address = address


def test_a_hidden_route_is_shown_once_it_accepts_the_session(tmp_path, upstreams):
    token = "agent-" + unique("")
    port = harness.free_port()
    guard = harness.start_upstream("json", tmp_path / "guard1", name="guard", token=token, port=port)
    stack = Stack(
        {"alpha": upstreams["alpha"], "guard": guard},
        tmp_path,
        ttl="2s",
        authorization='{ bearer: "${HYDRATE_TOKEN}" }',
        forward=("guard",),
        env={"HYDRATE_TOKEN": token},
    )

    async def guard_tools(raw: RawSession) -> int:
        reply = await raw.request("tools/list")
        return sum(t["name"].startswith("guard__") for t in reply.result["tools"])

    async def scenario():
        nonlocal guard
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=60)) as client:
            first = RawSession(client, stack.url, headers={"authorization": f"Bearer {token}"})
            await first.initialize()
            assert await guard_tools(first) == 16
            # A wrong credential hides the route; the agent then comes back with the right
            # one on a later request: the route is asked again and shown.
            changed = RawSession(client, stack.url, headers={"authorization": "Bearer wrong"})
            await changed.initialize()
            assert await guard_tools(changed) == 0
            changed.extra["authorization"] = f"Bearer {token}"
            await changed.request("tools/call", {"name": "alpha__whoami", "arguments": {}})
            await until(lambda: _shows_guard(changed), "the new credential never showed the route")
            # The route is down when an agent with the right credential initializes: hidden
            # (its answer is not known), asked again until it is back, then shown.
            harness.stop_upstream(guard)
            late = RawSession(client, stack.url, headers={"authorization": f"Bearer {token}"})
            await late.initialize()
            assert await guard_tools(late) == 0
            guard = harness.start_upstream("json", tmp_path / "guard2", name="guard", token=token, port=port)
            await until(lambda: _shows_guard(late), "the route was never asked again", timeout_s=30)

    async def _shows_guard(raw: RawSession) -> bool:
        return await guard_tools(raw) == 16

    try:
        stack.run(scenario, timeout_s=90)
    finally:
        harness.stop_upstream(guard)
