"""Hostile bytes never reach a head: what an agent or an upstream sends that ends up in an
HTTP head on the other edge is checked where the head is written.

mcpyard runs in front of tests/py/fault_upstream.py, which records every request head
exactly as it arrived (`Seen.raw_head`), so a CR, LF or NUL that slipped into a header
would show as an extra header line or a control byte in a value. The paths covered:

- an agent's `Last-Event-ID` through a two-route proxy: the aggregate id is split per route
  and each part, percent-unescaped, becomes that route's upstream `Last-Event-ID`; a part
  that decodes to a control byte (`%0D%0A`, `%00`, ...) is dropped like any malformed part
  (the route resumes from where it is), a well-formed escaped part still arrives unescaped,
  and a flood of random hostile ids leaves every head clean and the gateway serving;
- an upstream's `protocolVersion` (sent back to it in `MCP-Protocol-Version` on every
  request): one that is not a version is refused at initialize with a JSON-RPC error;
- an agent's `Authorization` with a control byte (for a route that forwards it): refused
  with 400 at the agent's edge, so it is never forwarded;
- an upstream whose event ids hold a control byte (SSE carries all but CR, LF and NUL):
  its event stream is resumed from now, not with a `Last-Event-ID` that cannot be sent;
- an upstream whose list pages hand out cursors that go round: the list ends at the first
  cursor given again (3 pages), not at the page limit;
- an upstream that streams server-to-client requests the agent never answers: every one
  reaches the agent, in order (its GET stream is never overrun), at most 256 per session
  await an answer, and each older one is answered upstream for the agent with a JSON-RPC
  error as the table fills (memory stays bounded); the newest's answer still goes up.
"""

from __future__ import annotations

import base64
import json
import random
from pathlib import Path

import anyio
import httpx2
import pytest

import harness
from fault_upstream import Answer, EventStream, FaultUpstream
from helpers import raw_exchange, run
from rawmcp import PROTOCOL, RawSession, stream_sse

TIMEOUT_S = 10
INTERNAL_ERROR = -32603
TOOLKITS = ("kitA", "kitB")


def crc32c(data: bytes) -> int:
    """CRC32C (Castagnoli), bit by bit: the code mcpyard derives event prefixes from."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def event_prefixes(toolkits: tuple[str, ...]) -> dict[str, str]:
    """Each toolkit's aggregate event-id prefix: its code (CRC32C, big-endian, URL-safe
    base64 without padding) cut to the shortest length at which all codes differ."""
    codes = {t: base64.urlsafe_b64encode(crc32c(t.encode()).to_bytes(4, "big")).rstrip(b"=").decode() for t in toolkits}
    for length in range(1, 7):
        heads = {code[:length] for code in codes.values()}
        if len(heads) == len(codes):
            return {t: code[:length] for t, code in codes.items()}
    raise AssertionError(f"event codes collide: {codes}")


def test_event_prefixes_match_the_gateway():
    # mcpyard's own unit test pins `bluesky` to SFRt9w; the same here proves the helper.
    assert event_prefixes(("bluesky", "x"))["bluesky"] == "S"
    assert base64.urlsafe_b64encode(crc32c(b"bluesky").to_bytes(4, "big")).rstrip(b"=") == b"SFRt9w"


def proxy_config(urls: dict[str, str], workers: int, io: str, forward: bool = False) -> str:
    auth = ", authorization: forward" if forward else ""
    lines = [
        f"runtime: {{ workers: {workers}, io: {io} }}",
        "bindings:",
        "  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: tools }",
        "  tools:",
        "    kind: proxy",
        "    routes:",
        *(f"      - {{ toolkit: {name}, exit: {name} }}" for name in urls),
        *(f'  {name}: {{ kind: client, server: "{url}", response_timeout: 3s, connect_timeout: 1s{auth} }}' for name, url in urls.items()),
    ]
    return "\n".join(lines) + "\n"


@pytest.fixture(params=[pytest.param(r, marks=pytest.mark.mcpyard) for r in harness.SOME_RUNTIMES], ids=harness.runtime_id)
def runtime(request):
    return request.param


@pytest.fixture
def kits():
    ups = {name: FaultUpstream().start() for name in TOOLKITS}
    yield ups
    for up in ups.values():
        up.close()


@pytest.fixture
def proxy(kits, runtime, tmp_path: Path):
    workers, io = runtime
    urls = {name: up.url for name, up in kits.items()}
    child = harness.start_mcpyard(proxy_config(urls, workers, io), tmp_path)
    yield child.address
    harness.stop_mcpyard(child)


def assert_clean_heads(kits: dict[str, FaultUpstream]) -> None:
    """No upstream head holds a control byte inside a line or a header nobody sent."""
    for name, up in kits.items():
        for seen in up.requests():
            lines = seen.raw_head.split(b"\r\n")
            for line in lines:
                bad = [b for b in line if (b < 0x20 and b != 0x09) or b == 0x7F]
                assert not bad, f"{name}: control byte in head line {line!r}"
            assert "x-injected" not in seen.headers, f"{name}: injected header in {seen.raw_head!r}"
            for header, value in seen.headers.items():
                assert "\r" not in value and "\n" not in value and "\0" not in value, (name, header, value)


async def resume_with(raw: RawSession, client: httpx2.AsyncClient, last_event_id: str) -> int:
    """Opens the agent's GET stream with `last_event_id`; returns the HTTP status (the fault
    upstreams have no event stream, so the proxy answers 405 once both routes said so)."""
    headers = {**raw.headers(), "accept": "text/event-stream", "last-event-id": last_event_id.encode()}
    async with client.stream("GET", raw.url, headers=headers) as response:
        return response.status_code


def gets_in(seen: list, since: int = 0) -> list:
    """The GETs among `seen` (a FaultUpstream's record), from the `since`-th on. Predicates
    of `wait_until` get the record itself: they run under its lock."""
    return [s for s in seen if s.method == "GET"][since:]


def gets_with(up: FaultUpstream, since: int) -> list:
    return gets_in(up.requests(), since)


@pytest.mark.mcpyard
@pytest.mark.parametrize("form", ["", "0.3:"], ids=["aggregate", "seq-and-aggregate"])
@pytest.mark.parametrize(
    "hostile",
    ["x%0D%0AX-Injected%3A%201", "x%00y", "%0A", "a%7Fb", "%1B%5B31m"],
    ids=["crlf-header", "nul", "lf", "del", "escape"],
)
def test_hostile_last_event_id_parts_are_dropped_and_never_reach_a_head(proxy, kits, hostile, form):
    prefix = event_prefixes(TOOLKITS)
    a, b = kits["kitA"], kits["kitB"]

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as c:
            raw = RawSession(c, proxy)
            await raw.initialize()
            # The repro: route kitA's part is hostile, kitB's is fine; bare, or
            # behind the gateway's own `0.<seq>:`.
            status = await resume_with(raw, c, f"{form}{prefix['kitA']}={hostile};{prefix['kitB']}=y")
            assert status in (200, 405), status
            assert a.wait_until(lambda seen: len(gets_in(seen)) >= 1, TIMEOUT_S), "kitA was never resumed"
            assert b.wait_until(lambda seen: len(gets_in(seen)) >= 1, TIMEOUT_S), "kitB was never resumed"
            # kitA resumes from where it is (its part was dropped); kitB from its own id.
            assert all("last-event-id" not in s.headers for s in gets_with(a, 0)), gets_with(a, 0)
            assert [s.headers.get("last-event-id") for s in gets_with(b, 0)] == ["y"]
            # The session still works.
            reply = await raw.request("tools/call", {"name": "kitA__echo", "arguments": {"text": "after"}})
            assert reply.result["content"] == [{"type": "text", "text": "upstream: after"}]
        assert_clean_heads(kits)

    run(scenario, timeout_s=30)


@pytest.mark.mcpyard
def test_escaped_route_ids_still_arrive_unescaped(proxy, kits):
    prefix = event_prefixes(TOOLKITS)
    a = kits["kitA"]

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as c:
            raw = RawSession(c, proxy)
            await raw.initialize()
            await resume_with(raw, c, f"{prefix['kitA']}=ok%3Bv%3D1%25%09tab")
            assert a.wait_until(lambda seen: any(s.headers.get("last-event-id") for s in gets_in(seen)), TIMEOUT_S)
            ids = [s.headers.get("last-event-id") for s in a.requests(http_method="GET") if "last-event-id" in s.headers]
            assert ids[-1] == "ok;v=1%\ttab"
        assert_clean_heads(kits)

    run(scenario, timeout_s=30)


@pytest.mark.mcpyard
def test_a_flood_of_hostile_last_event_ids_leaves_every_head_clean(proxy, kits):
    prefix = event_prefixes(TOOLKITS)
    rng = random.Random(22)
    pieces = ["%0D", "%0A", "%00", "%7F", "%3B", "%3D", "%25", "%", "%zz", ";", "=", "x", "0.", ":", "é", "%C3", "%FF"]

    def hostile_id() -> str:
        parts = []
        for _ in range(rng.randint(1, 4)):
            key = rng.choice([prefix["kitA"], prefix["kitB"], "Q", ""])
            value = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
            parts.append(f"{key}={value}" if rng.random() < 0.9 else value)
        head = rng.choice(["", "0.1:", "0.99999999999999999999:", "7.2:", ":"])
        return head + ";".join(parts)

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as c:
            sessions = []
            for _ in range(4):
                raw = RawSession(c, proxy)
                await raw.initialize()
                sessions.append(raw)
            for i in range(200):
                status = await resume_with(sessions[i % len(sessions)], c, hostile_id())
                assert status in (200, 400, 405), status
            for raw in sessions:
                reply = await raw.request("tools/call", {"name": "kitB__echo", "arguments": {"text": "still"}})
                assert reply.result["content"] == [{"type": "text", "text": "upstream: still"}]
        assert_clean_heads(kits)
        assert sum(len(up.requests(http_method="GET")) for up in kits.values()) > 0

    run(scenario, timeout_s=120)


@pytest.mark.mcpyard
@pytest.mark.parametrize("version", ["2025-11-25 X-Injected: 1", "2025\u00e9", "", "v" * 40])
def test_an_upstream_protocol_version_that_is_not_one_is_refused(runtime, tmp_path: Path, version):
    up = FaultUpstream().start()
    workers, io = runtime
    child = harness.start_mcpyard(harness.gateway_config(up.url, workers, io), tmp_path)
    try:
        up.script(
            "initialize",
            Answer({"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": {"name": "x", "version": "0"}}),
        )

        async def scenario():
            async with httpx2.AsyncClient(timeout=TIMEOUT_S) as c:
                raw = RawSession(c, child.address)
                reply = await raw.initialize(expect_ok=False)
                assert reply.status == 200, reply.body
                assert reply.error == {"code": INTERNAL_ERROR, "message": "Upstream sent an invalid protocolVersion"}
                # The next session gets the normal answer and works.
                raw = RawSession(c, child.address)
                await raw.initialize()
                reply = await raw.request("tools/call", {"name": "echo", "arguments": {"text": "ok"}})
                assert reply.result["content"] == [{"type": "text", "text": "upstream: ok"}]
            for seen in up.requests():
                assert seen.headers.get("mcp-protocol-version") in (None, PROTOCOL), seen.headers

        run(scenario, timeout_s=30)
    finally:
        harness.stop_mcpyard(child)
        up.close()



@pytest.mark.mcpyard
@pytest.mark.parametrize("credential", [b"Bearer a\rb", b"Bearer a\x00b", b"Bearer a\x01b"])
def test_an_agent_authorization_with_control_bytes_is_refused_at_the_edge(kits, runtime, tmp_path: Path, credential):
    workers, io = runtime
    urls = {name: up.url for name, up in kits.items()}
    child = harness.start_mcpyard(proxy_config(urls, workers, io, forward=True), tmp_path)
    try:
        host = child.address.split("//")[1].split("/")[0]
        body = (
            b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"'
            + PROTOCOL.encode()
            + b'","capabilities":{},"clientInfo":{"name":"x","version":"0"}}}'
        )
        request = (
            b"POST /mcp HTTP/1.1\r\nhost: " + host.encode() + b"\r\ncontent-type: application/json\r\n"
            b"accept: application/json, text/event-stream\r\nauthorization: " + credential + b"\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        answer = raw_exchange(child.address, request)
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        # Nothing reached an upstream with that credential (nothing reached them at all).
        assert all(not up.requests() for up in kits.values())
        assert_clean_heads(kits)
    finally:
        harness.stop_mcpyard(child)


PENDING_ANSWERS_MAX = 256


@pytest.mark.mcpyard
def test_unanswered_server_requests_are_bounded_per_session(runtime, tmp_path: Path):
    total = 600
    asks = tuple(
        {"jsonrpc": "2.0", "id": f"ask-{n}", "method": "elicitation/create", "params": {"message": f"q{n}", "requestedSchema": {"type": "object", "properties": {}}}}
        for n in range(total)
    )
    up = FaultUpstream().start()
    up.script("GET", EventStream(asks))
    workers, io = runtime
    child = harness.start_mcpyard(harness.gateway_config(up.url, workers, io), tmp_path)

    def answers(seen: list, kind: str) -> list:
        return [s for s in seen if s.method == "POST" and isinstance(s.body, dict) and kind in s.body and "method" not in s.body]

    try:

        async def scenario():
            async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=None)) as c:
                raw = RawSession(c, child.address)
                await raw.initialize()
                relayed: list[str] = []
                headers = {**raw.headers(), "accept": "text/event-stream"}
                async with c.stream("GET", raw.url, headers=headers) as response:
                    assert response.status_code == 200
                    events = stream_sse(response)
                    # Every request reaches the agent, in order: the GET stream is never
                    # overrun however fast the upstream sends them.
                    with anyio.fail_after(TIMEOUT_S):
                        while len(relayed) < total:
                            event = await events.__anext__()
                            message = json.loads(event.data) if event.data else {}
                            if message.get("method") == "elicitation/create":
                                relayed.append(message["id"])
                    assert relayed == [f"ask-{n}" for n in range(total)]
                    # Only 256 wait for the agent at a time: each older one was answered
                    # upstream for the agent, with an error, as the table filled.
                    late = total - PENDING_ANSWERS_MAX
                    assert up.wait_until(lambda seen: len(answers(seen, "error")) >= late, TIMEOUT_S)
                    refused = answers(up.requests(), "error")
                    # (The answers go up concurrently, so in any order.)
                    assert sorted(s.body["id"] for s in refused) == sorted(f"ask-{n}" for n in range(late))
                    for s in refused:
                        assert s.body["error"] == {
                            "code": INTERNAL_ERROR,
                            "message": "Not answered: too many requests awaiting the agent's answer",
                        }
                # The newest is still awaited: the agent's answer goes upstream as written.
                reply = await raw.post({"jsonrpc": "2.0", "id": relayed[-1], "result": {"action": "decline"}})
                assert reply.status == 202, reply.status
                assert up.wait_until(lambda seen: len(answers(seen, "result")) == 1, TIMEOUT_S)
                assert answers(up.requests(), "result")[0].body["id"] == relayed[-1]
                # An answer to one answered for the agent long ago goes nowhere.
                reply = await raw.post({"jsonrpc": "2.0", "id": relayed[0], "result": {"action": "decline"}})
                assert reply.status == 202, reply.status
                # The session is alive and serving.
                reply = await raw.request("tools/call", {"name": "echo", "arguments": {"text": "ok"}})
                assert reply.result["content"] == [{"type": "text", "text": "upstream: ok"}]
                assert len(answers(up.requests(), "result")) == 1

        run(scenario, timeout_s=60)
    finally:
        harness.stop_mcpyard(child)
        up.close()


@pytest.mark.mcpyard
def test_an_upstream_cycling_its_cursors_is_listed_once_round(runtime, tmp_path: Path):
    up = FaultUpstream(cycle_cursors=True).start()
    workers, io = runtime
    child = harness.start_mcpyard(proxy_config({"kitA": up.url}, workers, io), tmp_path)
    try:

        async def scenario():
            async with httpx2.AsyncClient(timeout=TIMEOUT_S) as c:
                raw = RawSession(c, child.address)
                await raw.initialize()
                reply = await raw.request("tools/list")
                assert [t["name"] for t in reply.result["tools"]] == ["kitA__p0", "kitA__p1", "kitA__p2"]
                assert "nextCursor" not in reply.result
            assert len(up.requests("tools/list")) == 3, [s.body for s in up.requests("tools/list")]

        run(scenario, timeout_s=30)
    finally:
        harness.stop_mcpyard(child)
        up.close()


@pytest.mark.mcpyard
@pytest.mark.parametrize(
    "event_id, resumed_with",
    [(b"e-1", "e-1"), (b"a\x01b", None), (b"a\x7fb", None), (b"ends ", None)],
    ids=["plain", "ctl", "del", "trailing-space"],
)
def test_an_upstream_event_id_that_cannot_be_sent_back_is_no_resume_point(runtime, tmp_path: Path, event_id, resumed_with):
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x"}}
    up = FaultUpstream().start()
    # The first GET stream carries one event and ends; the reconnect gets the normal 405.
    up.script("GET", EventStream((note,), ids=(event_id,), close=True))
    workers, io = runtime
    child = harness.start_mcpyard(harness.gateway_config(up.url, workers, io), tmp_path)
    try:

        async def scenario():
            async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=None)) as c:
                raw = RawSession(c, child.address)
                await raw.initialize()
                headers = {**raw.headers(), "accept": "text/event-stream"}
                async with c.stream("GET", raw.url, headers=headers) as response:
                    assert response.status_code == 200
                    # The upstream's stream broke: mcpyard reconnects it (after its 1 s).
                    assert up.wait_until(lambda seen: len(gets_in(seen)) >= 2, TIMEOUT_S), "no reconnect"
            again = gets_in(up.requests())[1]
            assert again.headers.get("last-event-id") == resumed_with, again.raw_head
            assert_clean_heads({"up": up})

        run(scenario, timeout_s=30)
    finally:
        harness.stop_mcpyard(child)
        up.close()
