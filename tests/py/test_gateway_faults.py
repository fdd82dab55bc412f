"""What an agent sees through mcpyard when its upstream misbehaves.

mcpyard (`server -> client`) runs in front of tests/py/fault_upstream.py, whose answers each
test scripts; the agent is raw HTTP (httpx2), so statuses, headers and bodies are checked
exactly. The contract these tests pin for the client binding:

- upstream JSON-RPC error: the agent gets the same error (code, message, data) under its own
  request id, HTTP 200;
- upstream 500/503, connection refused, body cut short, malformed JSON or SSE: HTTP 200 with
  a JSON-RPC error -32603 for that request (or, if mcpyard had already started an SSE
  response, that stream ends), within response_timeout + 2 s: never a hang;
- upstream 401/403 with a Bearer challenge: the same status and a `WWW-Authenticate: Bearer`
  with the same realm, scope, error and resource_metadata (on initialize and on a call);
- upstream 404 for the session: mcpyard initializes a new upstream session once, retries,
  and the agent gets the normal result; on the GET stream, a re-initialize that fails is
  tried again after the backoff, and the stream comes back;
- slow upstream: a JSON-RPC error within response_timeout + 2 s;
- `authorization: forward` sends the agent's Authorization upstream, `{bearer: ${X}}` sends
  `Bearer <X>`, and no `authorization` sends none;
- an agent that stops reading its GET stream while the upstream keeps sending loses its
  connection after `request_timeout` or 10 s, whichever is longer (the one bound on any
  write to an agent without a deadline of its own), counted in
  `mcpyard_write_deadline_cuts_total`, and its session keeps serving;
- afterwards mcpyard still serves a new session, and exits 0 on SIGTERM.

All of these run only through mcpyard (ids `mcpyard-...`); `-k direct` / `-m "not mcpyard"`
selects only the self-test of the fault upstream.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import anyio
import httpx2
import pytest

import harness
from fault_upstream import (
    Delay,
    EventStream,
    FaultUpstream,
    ForgetSession,
    Hang,
    MalformedJson,
    MalformedSse,
    Raw,
    ResetMidBody,
    Status,
    challenge,
    free_port,
    rpc_error,
)
from helpers import run
from rawmcp import PROTOCOL, Reply, RawSession, parse_bearer_challenge, stream_sse

# All but the fault upstream's own self-test go through mcpyard.
MCPYARD = pytest.mark.mcpyard

RESPONSE_TIMEOUT_S = 3
# The agent's answer must come within the upstream response timeout plus this much.
SLACK_S = 2
DEADLINE_S = RESPONSE_TIMEOUT_S + SLACK_S
INTERNAL_ERROR = -32603
AGENT_ID = "agent-7"  # the agent's request id: never the one mcpyard uses upstream


BOTH_STYLES = pytest.mark.parametrize("fault", [False, True], ids=["json-upstream", "sse-upstream"], indirect=True)


@pytest.fixture(params=[pytest.param(r, marks=MCPYARD) for r in harness.SOME_RUNTIMES], ids=harness.runtime_id)
def runtime(request):
    return request.param


@pytest.fixture
def start_gateway(runtime, tmp_path: Path):
    """Starts mcpyard in front of an upstream URL (teardown: SIGTERM, exit 0)."""
    started: list[harness.Child] = []

    def start(upstream_url: str, *, authorization: str | None = None, env: dict[str, str] | None = None) -> str:
        workers, io = runtime
        config = harness.gateway_config(
            upstream_url,
            workers,
            io,
            authorization=authorization,
            response_timeout=f"{RESPONSE_TIMEOUT_S}s",
            connect_timeout="2s",
        )
        child = harness.start_mcpyard(config, tmp_path / f"gw{len(started)}", env)
        started.append(child)
        return child.address

    yield start
    for child in started:
        harness.stop_mcpyard(child)


@pytest.fixture
def fault(request):
    """The scripted upstream. It answers as JSON, or as SSE where a test parametrizes
    `fault` indirectly with True (`BOTH_STYLES`)."""
    upstream = FaultUpstream(sse=getattr(request, "param", False)).start()
    yield upstream
    upstream.close()


async def timed(coro) -> tuple[Reply, float]:
    """Awaits a request under the deadline; returns the reply and how long it took. A reply
    that breaks off (connection closed mid-body) fails the test: the agent must get a
    complete answer, or an SSE stream that ends properly."""
    started = time.monotonic()
    try:
        with anyio.fail_after(DEADLINE_S + 5):
            reply = await coro
    except httpx2.HTTPError as e:
        elapsed = time.monotonic() - started
        pytest.fail(
            f"the agent's response broke off after {elapsed:.1f}s ({type(e).__name__}: {e}); expected a complete "
            "HTTP answer (200 with a JSON-RPC error, or the relayed status) or an SSE stream that ends"
        )
    return reply, time.monotonic() - started


def client() -> httpx2.AsyncClient:
    return httpx2.AsyncClient(timeout=httpx2.Timeout(DEADLINE_S + 3))


async def call_echo(raw: RawSession, text: str = "hi") -> Reply:
    return await raw.request("tools/call", {"name": "echo", "arguments": {"text": text}}, request_id=AGENT_ID)


async def assert_healthy(url: str) -> None:
    """A new session through mcpyard works end to end."""
    async with client() as c:
        raw = RawSession(c, url)
        await raw.initialize()
        reply = await call_echo(raw, "healthy")
        assert reply.status == 200, f"HTTP {reply.status} {reply.body[:300]!r}"
        assert reply.message["id"] == AGENT_ID
        assert reply.result["content"] == [{"type": "text", "text": "upstream: healthy"}]


def assert_internal_error(reply: Reply, elapsed: float, what: str) -> None:
    """HTTP 200 and a JSON-RPC -32603 for the agent's request, or an SSE stream that
    ended without an answer; within the deadline either way."""
    assert elapsed < DEADLINE_S, f"{what}: answered after {elapsed:.1f}s (deadline {DEADLINE_S}s)"
    assert reply.status == 200, f"{what}: HTTP {reply.status} {reply.body[:300]!r}"
    if reply.content_type == "text/event-stream":
        for event in reply.events:
            if event.data:
                try:
                    json.loads(event.data)
                except ValueError:
                    raise AssertionError(f"{what}: malformed data passed on to the agent: {event.data[:200]!r}") from None
        if reply.message_text is None:
            return  # the stream had started, and ended: allowed, it did not hang
    assert reply.content_type in ("application/json", "text/event-stream"), reply.headers
    message = reply.message
    assert message is not None, f"{what}: no JSON-RPC answer in {reply.body[:300]!r}"
    assert message["id"] == AGENT_ID, message
    assert "result" not in message, f"{what}: a result instead of an error: {message}"
    assert message["error"]["code"] == INTERNAL_ERROR, message
    assert isinstance(message["error"]["message"], str) and message["error"]["message"]


# 1. JSON-RPC errors pass through


ERRORS = [
    rpc_error(-32001, "upstream refused", {"retryAfter": 3, "why": ["a", "b"]}),
    rpc_error(-32602, "Invalid params: text must be a string", "text"),
    rpc_error(1234, "custom code, no data"),
    rpc_error(-32000, 'quotes " and \\ and ünïcödé', None),
]


@BOTH_STYLES
@pytest.mark.parametrize("error", ERRORS, ids=["object-data", "string-data", "no-data", "null-data"])
def test_jsonrpc_error_on_call_is_relayed(start_gateway, fault, error):
    url = start_gateway(fault.url)

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            await raw.initialize()
            fault.script("tools/call", error)
            reply, _ = await timed(call_echo(raw))
            assert reply.status == 200
            message = reply.message
            assert message is not None, reply.body
            assert message["id"] == AGENT_ID, "the agent's own request id, not the upstream's"
            want = {"code": error.code, "message": error.message}
            if error.has_data:
                want["data"] = error.data
            assert message["error"] == want
            assert "result" not in message
            # The session goes on.
            again = await call_echo(raw, "again")
            assert again.result["content"][0]["text"] == "upstream: again"
        await assert_healthy(url)

    run(scenario)


def test_jsonrpc_error_on_initialize_is_relayed(start_gateway, fault):
    url = start_gateway(fault.url)

    async def scenario():
        fault.script("initialize", rpc_error(-32602, "Unsupported protocol version", {"supported": ["2099-01-01"]}))
        async with client() as c:
            raw = RawSession(c, url)
            reply, elapsed = await timed(raw.initialize(expect_ok=False))
            assert elapsed < DEADLINE_S
            assert reply.status == 200, reply.body
            assert reply.message["id"] == 1
            assert reply.error == {
                "code": -32602,
                "message": "Unsupported protocol version",
                "data": {"supported": ["2099-01-01"]},
            }
        await assert_healthy(url)

    run(scenario)


# 2. upstream failures become -32603, promptly


FAILURES = {
    "http-500": Status(500, (("Content-Type", "text/plain"),), b"Internal Server Error"),
    "http-503": Status(503, (("Content-Type", "text/plain"), ("Retry-After", "1")), b"Service Unavailable"),
    "http-502-json": Status(
        502, (("Content-Type", "application/json"),), b'{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"bad gateway"}}'
    ),
    "reset-mid-body": ResetMidBody(),
    "malformed-json": MalformedJson(),
    "malformed-sse": MalformedSse(),
    "slow": Hang(),
}


@pytest.mark.parametrize("failure", list(FAILURES), ids=list(FAILURES))
@pytest.mark.parametrize("method", ["initialize", "tools/call"])
def test_upstream_failure_becomes_internal_error(start_gateway, fault, method, failure):
    url = start_gateway(fault.url)

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            if method == "initialize":
                fault.script("initialize", FAILURES[failure])
                reply, elapsed = await timed(
                    raw.request(
                        "initialize",
                        {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
                        request_id=AGENT_ID,
                    )
                )
            else:
                await raw.initialize()
                fault.script("tools/call", FAILURES[failure])
                reply, elapsed = await timed(call_echo(raw))
            assert_internal_error(reply, elapsed, f"{failure} on {method}")
            if failure == "slow":
                assert elapsed >= RESPONSE_TIMEOUT_S - 0.5, f"gave up after {elapsed:.1f}s, before response_timeout"
            assert [s.answer for s in fault.requests(method)][-1] == type(FAILURES[failure]).__name__
            if method == "tools/call":
                # Only that request failed: the agent's session still works.
                again = await call_echo(raw, "again")
                assert again.status == 200 and again.result["content"][0]["text"] == "upstream: again"
        await assert_healthy(url)

    run(scenario)


# 3. connection refused


def test_refused_upstream_at_initialize(start_gateway):
    url = start_gateway(f"http://127.0.0.1:{free_port()}/mcp")

    async def scenario():
        for attempt in range(2):  # and again: the gateway keeps answering
            async with client() as c:
                raw = RawSession(c, url)
                reply, elapsed = await timed(
                    raw.request(
                        "initialize",
                        {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
                        request_id=AGENT_ID,
                    )
                )
                assert_internal_error(reply, elapsed, f"refused upstream, attempt {attempt}")
                assert "mcp-session-id" not in reply.headers, "no session without an upstream"

    run(scenario)


def test_refused_upstream_mid_session(start_gateway, fault):
    url = start_gateway(fault.url)

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            await raw.initialize()
            assert (await call_echo(raw)).status == 200
            fault.stop_listening()  # and drops the gateway's pooled connections
            try:
                reply, elapsed = await timed(call_echo(raw, "refused"))
                assert_internal_error(reply, elapsed, "refused mid-session")
            finally:
                fault.listen_again()
        await assert_healthy(url)

    run(scenario)


# 4. bearer challenges reach the agent


REALM, SCOPE, ERROR, PRM = "r", "a b", "insufficient_scope", "https://as.example/.well-known/oauth-protected-resource"
CHALLENGES = {
    "canonical": f'Bearer realm="{REALM}", scope="{SCOPE}", error="{ERROR}", resource_metadata="{PRM}"',
    "reordered-tokens": f'Bearer error={ERROR},resource_metadata="{PRM}",   scope="{SCOPE}", realm={REALM}',
}


@pytest.mark.parametrize("header", list(CHALLENGES), ids=list(CHALLENGES))
@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("method", ["initialize", "tools/call"])
def test_bearer_challenge_is_relayed(start_gateway, fault, method, status, header):
    url = start_gateway(fault.url)

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            if method == "initialize":
                fault.script("initialize", challenge(status, CHALLENGES[header]))
                reply, elapsed = await timed(raw.initialize(expect_ok=False))
            else:
                await raw.initialize()
                fault.script("tools/call", challenge(status, CHALLENGES[header]))
                reply, elapsed = await timed(call_echo(raw))
            assert elapsed < DEADLINE_S
            assert reply.status == status, f"HTTP {reply.status} {reply.body[:300]!r}"
            www = reply.headers.get_list("www-authenticate")
            assert len(www) == 1, www
            params = parse_bearer_challenge(www[0])
            assert {k: params.get(k) for k in ("realm", "scope", "error", "resource_metadata")} == {
                "realm": REALM,
                "scope": SCOPE,
                "error": ERROR,
                "resource_metadata": PRM,
            }, www[0]
        await assert_healthy(url)

    run(scenario)


@pytest.mark.parametrize("method", ["initialize", "tools/call"])
def test_a_challenge_to_the_gateways_own_credential_is_not_relayed(start_gateway, fault, method):
    """The client sends a fixed service token (`{ bearer: ... }`) and the upstream answers
    401 with a challenge: the agent cannot answer it with a token of its own (its token is
    never sent), so it gets -32603 naming the refusal, not a 401 that would send it to fetch
    one."""
    url = start_gateway(fault.url, authorization='{ bearer: "${MCPYARD_TEST_UPSTREAM_TOKEN}" }', env={"MCPYARD_TEST_UPSTREAM_TOKEN": "service"})

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            if method == "initialize":
                fault.script("initialize", challenge(401, CHALLENGES["canonical"]))
                reply, _ = await timed(raw.initialize(expect_ok=False))
            else:
                await raw.initialize()
                fault.script("tools/call", challenge(401, CHALLENGES["canonical"]))
                reply, _ = await timed(call_echo(raw))
            assert reply.status == 200, f"HTTP {reply.status} {reply.body[:300]!r}"
            assert "www-authenticate" not in reply.headers, reply.headers
            assert reply.message["error"]["code"] == INTERNAL_ERROR, reply.body
            assert reply.message["error"]["message"] == "Upstream refused the gateway's credential (HTTP 401)", reply.body
        await assert_healthy(url)

    run(scenario)


# 5. the upstream forgot the session


@BOTH_STYLES
def test_session_404_reinitializes_once_and_retries(start_gateway, fault):
    url = start_gateway(fault.url)

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            await raw.initialize()
            first = fault.requests("initialize")
            assert len(first) == 1 and first[0].new_session
            old = first[0].new_session
            fault.script("tools/call", ForgetSession())
            reply, elapsed = await timed(call_echo(raw, "after 404"))
            assert elapsed < DEADLINE_S
            assert reply.status == 200, reply.body
            assert reply.message["id"] == AGENT_ID
            assert reply.result["content"][0]["text"] == "upstream: after 404"

            inits = fault.requests("initialize")
            assert len(inits) == 2, f"one re-initialize, saw {len(inits)}"
            assert "mcp-session-id" not in inits[1].headers, "a new session starts without a session id"
            new = inits[1].new_session
            assert new and new != old
            initialized = [s for s in fault.requests("notifications/initialized") if s.session == new]
            assert initialized, "the new upstream session must get notifications/initialized"
            calls = fault.requests("tools/call")
            assert [(s.session, s.answer) for s in calls] == [(old, "ForgetSession"), (new, "normal")]
            # The agent keeps its own session; later calls use the new upstream session.
            again = await call_echo(raw, "later")
            assert again.result["content"][0]["text"] == "upstream: later"
            assert fault.requests("tools/call")[-1].session == new
        await assert_healthy(url)

    run(scenario)


def test_session_404_is_retried_only_once(start_gateway, fault):
    url = start_gateway(fault.url)

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            await raw.initialize()
            fault.script("tools/call", ForgetSession(), times=5)
            reply, elapsed = await timed(call_echo(raw))
            assert elapsed < DEADLINE_S
            # Either the agent learns its session is gone (404), or it gets an error for
            # the call; never a result, never a loop.
            if reply.status != 404:
                assert reply.status == 200 and reply.message is not None and "error" in reply.message, reply.body
            assert len(fault.requests("initialize")) <= 2
            assert len(fault.requests("tools/call")) <= 2
        fault.clear_script()
        await assert_healthy(url)

    run(scenario)


@BOTH_STYLES
def test_a_call_after_a_failed_reinitialize_renews_the_session(start_gateway, fault):
    """The upstream forgets the session and its first re-initialize fails (503, still
    booting): that call gets an error, and a call a second later names the old session
    again, gets its 404 and re-initializes (it used to go without a session id and get the upstream's
    400 for good)."""
    url = start_gateway(fault.url)

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            await raw.initialize()
            old = fault.requests("initialize")[0].new_session
            fault.script("tools/call", ForgetSession())
            fault.script("initialize", Status(503, (), b"booting"))
            failed, _ = await timed(call_echo(raw, "while booting"))
            assert failed.status == 200 and failed.message is not None, failed.body
            assert failed.message["error"]["code"] == INTERNAL_ERROR, failed.body
            # Calls in the next second fail with it (they do not each try a re-initialize
            # of their own); after that, one tries again.
            await anyio.sleep(1.2)
            reply, _ = await timed(call_echo(raw, "booted"))
            assert reply.status == 200, reply.body
            assert reply.result["content"][0]["text"] == "upstream: booted"
            calls = fault.requests("tools/call")
            new = fault.requests("initialize")[-1].new_session
            assert new and new != old
            assert [s.session for s in calls] == [old, old, new], [(s.session, s.answer) for s in calls]

    run(scenario)


def test_a_renewal_outlives_the_request_that_started_it(start_gateway, fault):
    """The upstream forgot the session (404) and is slow to open a new one; the agent
    cancels its call meanwhile. The renewal goes on without it: the new upstream session
    is told `notifications/initialized` (a renewal cut short used to leave a session that
    was never initialized), and the next call uses it."""
    url = start_gateway(fault.url)

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            await raw.initialize()
            fault.script("tools/call", ForgetSession())
            fault.script("initialize", Delay(1.0))

            async def cancel_soon():
                await anyio.sleep(0.4)
                await raw.notify("notifications/cancelled", {"requestId": AGENT_ID, "reason": "bored"})

            async with anyio.create_task_group() as tg:
                tg.start_soon(cancel_soon)
                with anyio.move_on_after(DEADLINE_S):
                    await call_echo(raw, "cancelled")
            old = fault.requests("initialize")[0].new_session

            def renewed(seen) -> bool:
                told = [s.session for s in seen if s.rpc_method == "notifications/initialized"]
                return len(told) == 2 and told[-1] != old

            assert fault.wait_until(renewed, 5), [(s.rpc_method, s.session) for s in fault.requests()]
            new = fault.requests("initialize")[-1].new_session
            assert new and new != old
            assert fault.requests("notifications/initialized")[-1].session == new
            reply = await call_echo(raw, "after")
            assert reply.result["content"][0]["text"] == "upstream: after"
            assert fault.requests("tools/call")[-1].session == new

    run(scenario, timeout_s=30)


def test_an_upstream_that_answers_every_get_with_404_is_not_renewed_in_a_loop(start_gateway, fault):
    """Every GET gets 404 (the upstream forgets whatever session it names): mcpyard renews
    the session once, and when the next GET gets 404 too it waits out its backoff instead
    of renewing again at once (it used to open upstream sessions in a tight loop)."""
    url = start_gateway(fault.url)

    async def scenario():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(DEADLINE_S, read=None)) as c:
            raw = RawSession(c, url)
            await raw.initialize()
            fault.script("GET", ForgetSession(), times=10_000)
            headers = {**raw.headers(), "accept": "text/event-stream"}
            async with c.stream("GET", raw.url, headers=headers) as response:
                assert response.status_code == 200
                await anyio.sleep(3)
            inits = len(fault.requests("initialize"))
            gets = len(fault.requests(http_method="GET"))
            # The agent's own, one renewal per backoff (1 s, then 2 s, ...): a handful.
            assert inits <= 4, f"{inits} initialize requests and {gets} GETs in 3 s"
            assert gets <= 6, f"{gets} GETs in 3 s"
        fault.clear_script()

    run(scenario, timeout_s=30)


def test_an_event_stream_that_asks_for_no_wait_is_not_reopened_in_a_loop(start_gateway, fault):
    """Every GET gets an event stream that says `retry: 0` and ends at once: mcpyard waits
    at least 100 ms, doubling while the streams carry nothing, instead of reconnecting as
    fast as it can (it used to, and logged each time)."""
    url = start_gateway(fault.url)
    empty = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\nretry: 0\n\n"

    async def scenario():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(DEADLINE_S, read=None)) as c:
            raw = RawSession(c, url)
            await raw.initialize()
            fault.script("GET", Raw(empty), times=100_000)
            headers = {**raw.headers(), "accept": "text/event-stream"}
            async with c.stream("GET", raw.url, headers=headers) as response:
                assert response.status_code == 200
                await anyio.sleep(3)
            gets = len(fault.requests(http_method="GET"))
            # 0.1, 0.2, 0.4, 0.8, 1.6 s between them: a handful.
            assert gets <= 8, f"{gets} GETs in 3 s"
        fault.clear_script()

    run(scenario, timeout_s=30)


def test_an_answer_without_framing_that_never_ends_is_cut_at_the_response_timeout(start_gateway, fault):
    """The upstream accepts `notifications/initialized` with a 202 that has neither a
    length nor chunks (so its body runs to the close) and never closes: mcpyard closes the
    connection at its response timeout instead of holding it, and the task behind it, for
    good."""
    url = start_gateway(fault.url)
    endless = b"HTTP/1.1 202 Accepted\r\n\r\n"

    async def scenario():
        fault.script("notifications/initialized", Raw(endless, hold=True))
        async with client() as c:
            raw = RawSession(c, url)
            await raw.initialize()
            with anyio.fail_after(DEADLINE_S + 5):
                while True:
                    held = fault.requests("notifications/initialized")
                    if held and held[0].peer_left:
                        break
                    await anyio.sleep(0.1)
            reply = await call_echo(raw, "still")
            assert reply.result["content"][0]["text"] == "upstream: still"

    run(scenario, timeout_s=30)


def test_events_of_another_type_in_an_sse_answer_are_skipped(start_gateway, fault):
    """An SSE answer with an `event: ping` whose data is not JSON-RPC, then the result: the
    agent gets the result (the ping used to fail the whole request with -32603)."""
    url = start_gateway(fault.url)
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
        b"event: ping\ndata: keepalive\n\n"
        b'event: message\ndata: {"jsonrpc":"2.0","id":{id},"result":{"content":[{"type":"text","text":"pinged"}]}}\n\n'
    )

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            await raw.initialize()
            fault.script("tools/call", Raw(answer))
            reply, _ = await timed(call_echo(raw, "x"))
            assert reply.status == 200, reply.body
            assert reply.result["content"][0]["text"] == "pinged", reply.body

    run(scenario)


def test_an_event_stream_whose_upstream_restarts_slowly_comes_back(start_gateway, fault):
    """The upstream restarts under a live GET stream: the stream ends, the next GET is 404
    (the session is forgotten), and the first re-initialize fails (503, still booting).
    mcpyard tries again after its backoff, opens a new upstream session and a new stream,
    and the agent's stream gets the upstream's next notification. (It used to give up
    after the failed re-initialize, and the session had no events again.)"""
    url = start_gateway(fault.url)

    def note(text: str) -> dict:
        return {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": text}}

    async def scenario():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(DEADLINE_S, read=None)) as c:
            raw = RawSession(c, url)
            await raw.initialize()
            old = fault.requests("initialize")[0].new_session
            fault.script("GET", EventStream((note("before"),), close=True))
            fault.script("GET", ForgetSession(), times=2)
            fault.script("initialize", Status(503, (("Retry-After", "1"),), b"booting"))
            fault.script("GET", EventStream((note("after"),)))
            headers = {**raw.headers(), "accept": "text/event-stream"}
            seen: list[str] = []
            async with c.stream("GET", raw.url, headers=headers) as response:
                assert response.status_code == 200
                events = stream_sse(response)
                # 1 s after the first stream ends, 2 s after the failed re-initialize.
                with anyio.fail_after(15):
                    while "after" not in seen:
                        event = await events.__anext__()
                        message = json.loads(event.data) if event.data else {}
                        if message.get("method") == "notifications/message":
                            seen.append(message["params"]["data"])
            assert seen == ["before", "after"], seen
            inits = fault.requests("initialize")
            assert [s.answer for s in inits] == ["normal", "Status", "normal"], [s.answer for s in inits]
            new = inits[-1].new_session
            assert new and new != old
            gets = fault.requests(http_method="GET")
            assert [g.session for g in gets] == [old, old, old, new], [(g.session, g.answer) for g in gets]
            # The agent's session works on, on the new upstream session.
            reply = await call_echo(raw, "later")
            assert reply.result["content"][0]["text"] == "upstream: later"
            assert fault.requests("tools/call")[-1].session == new

    run(scenario, timeout_s=60)


# 6. what credential goes upstream


AGENT_AUTH = "Bearer agent-token-A"


def sessions_of(fault: FaultUpstream) -> dict[str, list[str | None]]:
    """Authorization headers seen upstream, grouped by upstream session."""
    out: dict[str, list[str | None]] = {}
    for s in fault.requests():
        sid = s.new_session or s.session or "-"
        out.setdefault(sid, []).append(s.headers.get("authorization"))
    return out


async def agent_session(url: str, auth: str | None) -> None:
    async with client() as c:
        raw = RawSession(c, url, headers={"authorization": auth} if auth else None)
        await raw.initialize()
        reply = await call_echo(raw, "auth")
        assert reply.status == 200, reply.body
        assert reply.result["content"][0]["text"] == "upstream: auth"


@BOTH_STYLES
def test_authorization_forward(start_gateway, fault):
    url = start_gateway(fault.url, authorization="forward")

    async def scenario():
        await agent_session(url, AGENT_AUTH)
        await agent_session(url, "Bearer agent-token-B")
        seen = sessions_of(fault)
        assert len(seen) >= 2, seen
        tokens = [set(v) for v in seen.values()]
        # Each upstream session carries exactly its own agent's credential, on every request.
        assert sorted(tuple(t) for t in tokens) == sorted([(AGENT_AUTH,), ("Bearer agent-token-B",)]), seen
        calls = fault.requests("tools/call")
        assert [c.headers.get("authorization") for c in calls] == [AGENT_AUTH, "Bearer agent-token-B"]

    run(scenario)


def test_authorization_bearer_from_environment(start_gateway, fault):
    secret = "s3cr3t-" + str(time.monotonic_ns())
    url = start_gateway(fault.url, authorization='{ bearer: "${MCPYARD_TEST_UPSTREAM_TOKEN}" }', env={"MCPYARD_TEST_UPSTREAM_TOKEN": secret})

    async def scenario():
        await agent_session(url, AGENT_AUTH)
        await agent_session(url, None)
        seen = fault.requests()
        assert seen
        assert {s.headers.get("authorization") for s in seen} == {f"Bearer {secret}"}, [
            (s.method, s.rpc_method, s.headers.get("authorization")) for s in seen
        ]

    run(scenario)


def test_no_authorization_sends_none(start_gateway, fault):
    url = start_gateway(fault.url)

    async def scenario():
        await agent_session(url, AGENT_AUTH)
        seen = fault.requests()
        assert any(s.rpc_method == "tools/call" for s in seen)
        leaked = [(s.method, s.rpc_method, s.headers["authorization"]) for s in seen if "authorization" in s.headers]
        assert not leaked, f"no authorization is configured, yet the upstream got {leaked}"

    run(scenario)


# 7. the upstream request mcpyard makes


@BOTH_STYLES
def test_upstream_requests_follow_the_transport_rules(start_gateway, fault):
    """What the fault upstream can check about every request the gateway sent it."""
    url = start_gateway(fault.url)

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            await raw.initialize()
            assert (await call_echo(raw)).status == 200
            assert (await raw.request("tools/list", {}, request_id=AGENT_ID)).result["tools"][0]["name"] == "echo"
            gone = await raw.delete()
            assert gone.status_code in (200, 204)
        posts = fault.requests(http_method="POST")
        assert [p.rpc_method for p in posts][:2] == ["initialize", "notifications/initialized"]
        for p in posts:
            accept = p.headers.get("accept", "")
            assert "application/json" in accept and "text/event-stream" in accept, p.headers  # T3
            assert p.headers.get("content-type", "").startswith("application/json")
            assert isinstance(p.body, dict) and p.body.get("jsonrpc") == "2.0"  # T4: one message, no batch
            assert p.path == "/mcp"
            if p.rpc_method != "initialize":
                assert p.session, f"{p.rpc_method} without the session id"  # H3
                assert p.headers.get("mcp-protocol-version") == PROTOCOL  # H8
        assert posts[0].body["params"]["protocolVersion"] == PROTOCOL
        for get in fault.requests(http_method="GET"):
            assert "text/event-stream" in get.headers.get("accept", "")  # G1
            assert get.session
        # The agent ended its session: the gateway ends the upstream one (H7).
        sid = posts[0].new_session
        deleted = await anyio.to_thread.run_sync(
            lambda: fault.wait_until(lambda seen: any(s.method == "DELETE" for s in seen), DEADLINE_S)
        )
        assert deleted, "no DELETE reached the upstream after the agent's DELETE"
        assert [d.session for d in fault.requests(http_method="DELETE")] == [sid]

    run(scenario)


def test_agent_notifications_reach_the_upstream(start_gateway, fault):
    """roots/list_changed (and any other agent notification but cancelled) goes upstream."""
    url = start_gateway(fault.url)

    async def scenario():
        async with client() as c:
            raw = RawSession(c, url)
            await raw.initialize()
            sent = await raw.notify("notifications/roots/list_changed")
            assert sent.status == 202
        relayed = await anyio.to_thread.run_sync(
            lambda: fault.wait_until(
                lambda seen: any(s.rpc_method == "notifications/roots/list_changed" for s in seen),
                DEADLINE_S,
            )
        )
        assert relayed, [s.rpc_method for s in fault.requests()]
        note = [s for s in fault.requests() if s.rpc_method == "notifications/roots/list_changed"]
        assert len(note) == 1 and note[0].session, note

    run(scenario)


# 8. shutdown while the upstream hangs


def test_sigterm_while_an_upstream_request_hangs(runtime, fault, tmp_path):
    """SIGTERM with a call stuck upstream: mcpyard still drains and exits 0, and the agent's
    request ends (an answer or a closed connection), it is not left hanging."""
    workers, io = runtime
    config = harness.gateway_config(fault.url, workers, io, response_timeout="30s")
    gateway = harness.start_mcpyard(config, tmp_path)
    stopped = False

    async def scenario():
        nonlocal stopped
        async with client() as c:
            raw = RawSession(c, gateway.address)
            await raw.initialize()
            fault.script("tools/call", Hang())
            async with anyio.create_task_group() as tg:
                outcome: list[str] = []

                async def call():
                    try:
                        reply = await call_echo(raw)
                        outcome.append(f"HTTP {reply.status}")
                    except httpx2.HTTPError as e:
                        outcome.append(type(e).__name__)

                tg.start_soon(call)
                arrived = await anyio.to_thread.run_sync(
                    lambda: fault.wait_until(lambda seen: any(s.answer == "Hang" for s in seen), DEADLINE_S)
                )
                assert arrived, "the call never reached the upstream"
                with anyio.fail_after(harness.SHUTDOWN_TIMEOUT_S + 1):
                    await anyio.to_thread.run_sync(lambda: harness.stop_mcpyard(gateway))
                stopped = True
            assert outcome, "the agent's request neither got an answer nor lost its connection"

    try:
        run(scenario)
    finally:
        if not stopped and gateway.alive():
            gateway.proc.kill()
            gateway.proc.wait()


# 9. an agent that stops reading its event stream


def write_deadline_cuts(metrics_port: int) -> int:
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=DEADLINE_S) as r:
        text = r.read().decode()
    for line in text.splitlines():
        if line.startswith("mcpyard_write_deadline_cuts_total "):
            return int(line.split()[1])
    raise AssertionError("no mcpyard_write_deadline_cuts_total in the scrape")


def open_stalled_get(url: str, session_id: str) -> socket.socket:
    """Opens the session's GET event stream on a raw connection with a 4 KiB receive
    buffer, as an agent that will read nothing of it (reads time out after 10 s)."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    agent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    agent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    agent.settimeout(10)
    agent.connect((host, int(port)))
    head = (
        f"GET /mcp HTTP/1.1\r\nhost: {host}:{port}\r\naccept: text/event-stream\r\n"
        f"mcp-session-id: {session_id}\r\nmcp-protocol-version: {PROTOCOL}\r\n\r\n"
    )
    agent.sendall(head.encode())
    return agent


def test_an_agent_that_stops_reading_its_event_stream_is_cut_off(runtime, fault, tmp_path):
    """A GET stream has no deadline, but no write to an agent may last longer than
    `request_timeout`, or 10 s when that is shorter (a slow reader is not one that
    stopped): an agent that stops reading while the upstream keeps sending loses its
    connection then (counted), and its session keeps serving."""
    note = {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x" * 60_000}}
    total = 200  # 12 MB: far more than the sockets' buffers hold
    fault.script("GET", EventStream((note,) * total))
    workers, io = runtime
    config = harness.gateway_config(fault.url, workers, io).replace("exit: up }", "exit: up, request_timeout: 1s }")
    assert "request_timeout: 1s" in config
    gateway = harness.start_mcpyard(config, tmp_path)
    metrics_port = gateway.metrics_port()
    try:

        async def scenario():
            async with client() as c:
                raw = RawSession(c, gateway.address)
                await raw.initialize()
                before = write_deadline_cuts(metrics_port)
                agent = open_stalled_get(gateway.address, raw.session_id)
                # The agent reads nothing; the gateway's write to it stalls and is cut,
                # not before the 10 s every write to an agent is given.
                opened = time.monotonic()
                cut_by = opened + 30
                while write_deadline_cuts(metrics_port) == before:
                    assert time.monotonic() < cut_by, "the stalled stream was never cut"
                    await anyio.sleep(0.2)
                assert write_deadline_cuts(metrics_port) == before + 1
                assert time.monotonic() - opened >= 9.5, "cut before the write limit"
                got = b""
                try:
                    while chunk := agent.recv(1 << 20):
                        got += chunk
                except ConnectionResetError:
                    pass  # an end too; TimeoutError (the stream still open) fails the test
                finally:
                    agent.close()
                assert got.startswith(b"HTTP/1.1 200 "), got[:200]
                assert got.count(b"notifications/message") < total, "cut off before the end"
                # The session lives on.
                reply = await call_echo(raw)
                assert reply.result["content"] == [{"type": "text", "text": "upstream: hi"}]

        run(scenario, timeout_s=90)
    finally:
        harness.stop_mcpyard(gateway)


def test_a_new_event_stream_replaces_one_whose_agent_stopped_reading(runtime, fault, tmp_path):
    """An agent whose GET stream stalled (it stopped reading mid-flood) opens a new one on
    the same session before the old one is cut: the new stream is served at once and
    gets the rest of the upstream's events, in order, while the old write still hangs."""
    total = 200
    notes = tuple(
        {"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": f"{n:04}" + "x" * 60_000}}
        for n in range(total)
    )
    fault.script("GET", EventStream(notes))
    workers, io = runtime
    gateway = harness.start_mcpyard(harness.gateway_config(fault.url, workers, io), tmp_path)
    try:

        async def scenario():
            async with httpx2.AsyncClient(timeout=httpx2.Timeout(DEADLINE_S, read=None)) as c:
                raw = RawSession(c, gateway.address)
                await raw.initialize()
                stalled = open_stalled_get(gateway.address, raw.session_id)
                try:
                    # Let the first stream take events until its write stalls.
                    await anyio.sleep(1.0)
                    opened = time.monotonic()
                    headers = {**raw.headers(), "accept": "text/event-stream"}
                    seen: list[int] = []
                    async with c.stream("GET", raw.url, headers=headers) as response:
                        assert response.status_code == 200
                        events = stream_sse(response)
                        with anyio.fail_after(8):  # the old write is cut only after 10 s
                            while not seen or seen[-1] < total - 1:
                                event = await events.__anext__()
                                message = json.loads(event.data) if event.data else {}
                                if message.get("method") == "notifications/message":
                                    seen.append(int(message["params"]["data"][:4]))
                    assert time.monotonic() - opened < 8
                    # In order, none twice and none missing from where it began; the
                    # first ones went to the stalled stream.
                    assert seen == list(range(seen[0], total)), seen[:20]
                finally:
                    stalled.close()

        run(scenario, timeout_s=60)
    finally:
        harness.stop_mcpyard(gateway)


# 10. the fault upstream itself (direct: no mcpyard involved)


@pytest.mark.parametrize("style", [False, True], ids=["direct-json", "direct-sse"])
def test_fault_upstream_answers_as_scripted(style):
    """Checks the test tool: each scripted answer is on the wire as the tests above assume."""
    fault = FaultUpstream(sse=style).start()

    async def scenario():
        async with client() as c:
            raw = RawSession(c, fault.url)
            await raw.initialize()
            assert (await call_echo(raw)).result["content"][0]["text"] == "upstream: hi"
            assert (await raw.request("ping", {})).result == {}

            fault.script("tools/call", rpc_error(-32001, "no", {"k": 1}))
            assert (await call_echo(raw)).error == {"code": -32001, "message": "no", "data": {"k": 1}}
            fault.script("tools/call", challenge(403, CHALLENGES["reordered-tokens"]))
            denied = await call_echo(raw)
            assert denied.status == 403
            assert parse_bearer_challenge(denied.headers["www-authenticate"]) == {
                "realm": REALM, "scope": SCOPE, "error": ERROR, "resource_metadata": PRM,
            }  # fmt: skip
            fault.script("tools/call", FAILURES["http-503"])
            assert (await call_echo(raw)).status == 503
            fault.script("tools/call", MalformedJson())
            bad = await call_echo(raw)
            assert bad.status == 200 and bad.message is None
            fault.script("tools/call", MalformedSse())
            bad = await call_echo(raw)
            assert bad.content_type == "text/event-stream" and bad.message is None and bad.events
            fault.script("tools/call", ResetMidBody())
            with pytest.raises(httpx2.RemoteProtocolError):
                await call_echo(raw)
            fault.script("tools/call", Hang())
            with pytest.raises(TimeoutError):
                with anyio.fail_after(0.5):
                    await call_echo(raw)
        async with client() as c:
            raw = RawSession(c, fault.url)
            await raw.initialize()
            fault.script("tools/call", ForgetSession())
            assert (await call_echo(raw)).status == 404
            assert (await call_echo(raw)).status == 404, "a forgotten session stays forgotten"
            assert (await c.get(fault.url, headers={**raw.headers(), "accept": "text/event-stream"})).status_code == 404
        answers = [s.answer for s in fault.requests("tools/call")]
        assert answers == ["normal", "RpcError", "Status", "Status", "MalformedJson", "MalformedSse", "ResetMidBody",
                           "Hang", "ForgetSession", "normal"]  # fmt: skip
        fault.stop_listening()
        with pytest.raises(httpx2.ConnectError):
            async with client() as c:
                await c.post(fault.url, content=b"{}")
        fault.listen_again()
        async with client() as c:
            await RawSession(c, fault.url).initialize()

    try:
        run(scenario)
    finally:
        fault.close()
