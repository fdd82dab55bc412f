"""Sessions any node of a cluster can serve: the server binding's `sessions: { store: S }`
naming a redis store. Two mcpyard nodes (node 0 on io_uring, node 1 on epoll, two workers
each, the same config) share a real Redis (Debian's redis-server, started per test on a
port chosen at run time) in front of real SDK upstreams that say which upstream session
served each call (upstreams/session_upstream.py: sdk_upstream.py plus the tool
`upstream_session`, which answers the `Mcp-Session-Id` the call arrived with) and which
sessions they opened (= `initialize`s) and saw deleted (`upstream_stats`). Statuses are
checked on raw HTTP; one scenario drives the official SDK client.

- config: `sessions.store` naming a memory store or no store at all is refused by
  `mcpyard check`, naming `bindings.north.sessions.store`;
- `initialize` on A writes `<prefix>value:session:north:<id>` = `<version>:<record>` before
  answering: `{"v":1,"version":"2025-11-25","capabilities":<the agent's>,"handoff":…,
  "touched":<unix ms>,"by":<the writing node's tag>}` with a TTL of about the session timeout; no credential in it (the
  agent's forwarded `Authorization` reaches the upstream from each request instead);
- B, which never saw the session, serves tools/list and tools/call for it; requests
  alternating A, B, A, B all reach the same upstream session on every route, and each
  upstream was asked for one `initialize` only;
- `kill -9` of A after use: B goes on with the same upstream session;
- the GET stream resumes on B after A was killed: `Last-Event-ID` from A's stream
  (`0.<seq>:<aggregate of both routes' ids>`) gets on B what both upstreams sent after it
  (replayed from their event stores), then live events;
- DELETE on B of a session opened on A: 200; then 404 on B at once and on A within 3 s,
  for POST, GET and DELETE; the record is replaced by a tombstone (`<version>!`, which
  no later write makes a record again); the upstream session was ended;
- idle expiry is cluster-wide: `session_timeout: 2s`, the session used only on B every
  0.5 s for 5 s stays alive (same upstream session, A's expired local copy ended nothing
  upstream, A serves it again); idle for 6.5 s, it is 404 on both and ended upstream;
- SIGTERM of A (graceful drain, exit 0) leaves the shared session alive for B;
- without `sessions:` (the redis store present but unused): B answers 404, and nothing
  named `session:` is written to Redis (today's behaviour);
- hostile input: a well-formed unknown id is 404 at once (one store lookup, then
  remembered for 2 s, so repeating it reads the store no more); ids outside
  the format (too long, too short, `%0d`, a space, a non-hex owner) are 404 with no Redis
  command naming them (MONITOR); forged records (garbage, no version prefix, `v: 2`, an
  unknown protocol version, non-object capabilities, a 1 MB value, a huge `touched`, a
  key of the wrong Redis type, a handoff whose upstream session id holds CR/LF, is 10 KB
  long or is missing) are each 404 or a working session (503 for a value the store
  cannot read), answered within 5 s; a handoff the
  exit cannot use gives a fresh upstream session; the real session, fresh sessions and both
  nodes stay fine, and no node panics;
- Redis down: `initialize` on A still answers 200 at once and the session works on A only
  (B: 503, the store cannot be read); once Redis is back, new sessions are shared again;
- an unmodified SDK client (ClientSession over streamable_http_client) whose every HTTP
  request goes to the other node (a round-robin httpx transport) initializes, lists,
  calls, gets a log notification and ends the session, all on one upstream session.

Every test stops its nodes (SIGTERM, exit 0) and checks that no node's stderr shows a panic.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

import authkit
import harness
from helpers import Collector, run, tool_text, unique
from test_proxy import read_events
from rawmcp import PROTOCOL, RawSession

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

TIMEOUT_S = 10
UPSTREAM_SCRIPT = Path(__file__).resolve().parent / "upstreams" / "session_upstream.py"
# mcpyard's session ids: 2 hex digits of node, 2 of worker, 22 of URL-safe base64.
SESSION_ID = re.compile(r"[0-9a-f]{4}[A-Za-z0-9_-]{22}")
RECORD_MEMBERS = {"v", "version", "capabilities", "handoff", "touched", "by"}
# What rawmcp.RawSession.initialize declares.
AGENT_CAPABILITIES = {"elicitation": {}}
# A forged record may be taken up (200, a working session) or refused as unknown (404); a
# value the store itself cannot read (no version prefix, a key of the wrong type) is a
# store failure, 503 (try again), as when Redis is down: mcpyard cannot tell that the
# session is gone, and a 404 would make the agent drop a session that may still be live.
# Anything else (a 500, no answer) fails the hostile test.
FORGED_RECORD_STATUSES = (200, 404, 503)
# What a node answers for a session it cannot look up because the store is down.
STORE_DOWN_STATUS = 503


# --- Configs and processes ---------------------------------------------------------------


def node_config(
    urls: dict[str, str],
    redis_url: str,
    prefix: str,
    *,
    io: str,
    metrics_port: int,
    shape: str = "client",
    sessions: str | None = "shared",
    timeout: str = "30s",
    forward: bool = False,
    extra_stores: str = "",
    auth: str = "",
) -> str:
    """One node's config. `shape` "client": north exits straight to the client `alpha`;
    "proxy": north exits to a proxy routing toolkits `alpha` and `beta` (both in `urls`);
    "cached": the same proxy with a list cache in the store (its routes open at a
    session's first call, not at initialize).
    `sessions` is the store north's sessions live in (None: no `sessions:`); `auth` is
    north's `auth:` mapping as flow YAML (empty: none)."""
    proxied = shape in ("proxy", "cached")
    exit_name = "tools" if proxied else "alpha"
    shared = f"sessions: {{ store: {sessions} }}, " if sessions else ""
    lines = [
        f"runtime: {{ workers: 2, io: {io} }}",
        f"telemetry: {{ metrics: 127.0.0.1:{metrics_port} }}",
        f'stores: {{ shared: {{ type: redis, url: "{redis_url}", prefix: "{prefix}" }}{extra_stores} }}',
        "bindings:",
        f"  north: {{ kind: server, listen: 127.0.0.1:0, path: /mcp, exit: {exit_name}, {shared}session_timeout: {timeout}"
        + (f", auth: {auth}" if auth else "")
        + " }",
    ]
    clients = dict(urls) if proxied else {"alpha": urls["alpha"]}
    if proxied:
        lines += ["  tools:", "    kind: proxy"]
        if shape == "cached":
            lines += ["    cache: { store: shared, ttl: 5m }"]
        lines += ["    routes:"]
        lines += [f"      - {{ toolkit: {name}, exit: {name} }}" for name in clients]
    auth = ", authorization: forward" if forward else ""
    lines += [
        f'  {name}: {{ kind: client, server: "{url}", response_timeout: 5s, connect_timeout: 1s{auth} }}'
        for name, url in clients.items()
    ]
    return "\n".join(lines) + "\n"


def start_upstream(name: str, workdir: Path) -> harness.Child:
    """session_upstream.py in resumable SSE mode (an event store), named `name`."""
    argv = [sys.executable, str(UPSTREAM_SCRIPT), "--mode", "sse-resumable", "--port", "0", "--name", name]
    return harness._spawn(argv, "listening ", f"upstream-{name}", workdir, None)


class Node:
    """One mcpyard node and its metrics; `gone` once killed or stopped by the test."""

    def __init__(self, index: int, config: str, metrics_port: int, workdir: Path) -> None:
        self.index = index
        self.metrics_port = metrics_port
        self.child = harness.start_mcpyard(config, workdir)
        self.url = self.child.address
        self.gone = False

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=TIMEOUT_S) as r:
            text = r.read().decode()
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def kill(self) -> None:
        self.child.proc.kill()
        self.child.proc.wait()
        self.gone = True

    def stop(self) -> None:
        """SIGTERM; mcpyard must exit 0 (harness.stop_mcpyard)."""
        self.gone = True
        harness.stop_mcpyard(self.child)


class Cluster:
    """Two nodes with the same config (their own metrics ports) sharing `redis` under a
    prefix of their own, in front of `upstreams`."""

    def __init__(self, upstreams: dict[str, harness.Child], redis: harness.Redis, tmp_path: Path, *, nodes: int = 2, **options: Any) -> None:
        self.shape = options.get("shape", "client")
        self.prefix = unique("s") + ":"
        self.upstreams = upstreams
        urls = {name: child.address for name, child in upstreams.items()}
        self.nodes: list[Node] = []
        try:
            for i in range(nodes):
                port = harness.free_port()
                io = "uring" if i == 0 else "epoll"
                config = node_config(urls, redis.url, self.prefix, io=io, metrics_port=port, **options)
                self.nodes.append(Node(i, config, port, tmp_path / f"node{i}"))
        except BaseException:
            self.stop()
            raise

    def tool(self, name: str, route: str = "alpha") -> str:
        """The agent's name for an upstream tool (toolkit-prefixed through the proxy)."""
        return f"{route}__{name}" if self.shape in ("proxy", "cached") else name

    def key(self, session_id: str) -> str:
        return f"{self.prefix}value:session:north:{session_id}"

    def stop(self) -> None:
        for node in self.nodes:
            if not node.gone:
                node.stop()

    def run(self, scenario, timeout_s: float = 60) -> None:
        try:
            run(scenario, timeout_s=timeout_s)
        finally:
            self.stop()
        for node in self.nodes:
            log = node.child.stderr()
            assert "panicked" not in log, f"node {node.index} panicked:\n{log[-4000:]}"
        for name, child in self.upstreams.items():
            assert child.alive(), f"upstream {name} died:\n{child.stderr()[-3000:]}"


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    work = tmp_path_factory.mktemp("session-upstreams")
    children: dict[str, harness.Child] = {}
    try:
        for name in ("alpha", "beta"):
            children[name] = start_upstream(name, work / name)
        yield children
    finally:
        for child in children.values():
            harness.stop_upstream(child)


# --- Redis from the test's side ----------------------------------------------------------


class RedisError(Exception):
    pass


class RedisConn:
    """RESP2 on a connection of the test's own, whole replies of any size (the harness's
    `Redis.command` reads one segment, too little for a 1 MB value)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
        self.buf = b""

    def __enter__(self) -> RedisConn:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def send(self, *args: str | bytes | int) -> None:
        parts = [a if isinstance(a, bytes) else str(a).encode() for a in args]
        self.sock.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self.buf += chunk

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2 :]
        return data

    def reply(self) -> Any:
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise AssertionError(f"not RESP: {line!r}")

    def __call__(self, *args: str | bytes | int) -> Any:
        self.send(*args)
        return self.reply()


class Monitor:
    """Every command Redis runs from now on (MONITOR), collected by a thread."""

    def __init__(self, port: int) -> None:
        self.conn = RedisConn(port)
        assert self.conn("MONITOR") == "OK"
        self.conn.sock.settimeout(None)
        self.lines: list[bytes] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while True:
                self.lines.append(self.conn.line())
        except (OSError, ConnectionError):
            pass

    async def sync(self, conn: RedisConn) -> None:
        """Waits until the monitor has seen everything Redis ran before now."""
        marker = unique("monitor-sync-")
        assert conn("ECHO", marker) == marker.encode()
        with anyio.fail_after(5):
            while not any(marker.encode() in line for line in list(self.lines)):
                await anyio.sleep(0.01)

    def text(self) -> bytes:
        return b"\n".join(list(self.lines))

    def close(self) -> None:
        self.conn.close()
        self.thread.join(timeout=5)


def parse_record(value: bytes) -> tuple[int, dict[str, Any]]:
    """A stored session: `<version digits>:<record JSON>`."""
    m = re.fullmatch(rb"(\d+):(.*)", value, re.S)
    assert m, f"not <version>:<JSON>: {value[:300]!r}"
    record = json.loads(m.group(2))
    assert isinstance(record, dict), record
    return int(m.group(1)), record


def read_record(conn: RedisConn, cluster: Cluster, session_id: str) -> tuple[int, dict[str, Any]]:
    key = cluster.key(session_id)
    value = conn("GET", key)
    assert value is not None, f"no {key} in redis; keys there: {conn('KEYS', cluster.prefix + '*')}"
    return parse_record(value)


def well_formed_id(worker: int = 0) -> str:
    """An id of mcpyard's format (node 0) that nobody minted."""
    return f"00{worker:02x}" + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


def replace_string(value: Any, old: str, new: Any) -> tuple[Any, int]:
    """`value` (JSON) with every string equal to `old` replaced by `new`; and how many."""
    if value == old:
        return new, 1
    if isinstance(value, dict):
        out, n = {}, 0
        for k, v in value.items():
            out[k], m = replace_string(v, old, new)
            n += m
        return out, n
    if isinstance(value, list):
        items = [replace_string(v, old, new) for v in value]
        return [v for v, _ in items], sum(m for _, m in items)
    return value, 0


# --- Agents ------------------------------------------------------------------------------


async def open_session(client: httpx2.AsyncClient, node: Node, headers: dict[str, str] | None = None) -> RawSession:
    raw = RawSession(client, node.url, headers)
    await raw.initialize()
    assert SESSION_ID.fullmatch(raw.session_id or ""), f"not mcpyard's id format: {raw.session_id!r}"
    return raw


def at(raw: RawSession, node: Node) -> RawSession:
    """The agent's session, its next requests sent to `node`."""
    raw.url = node.url
    return raw


async def upstream_session(raw: RawSession, node: Node, tool: str = "upstream_session") -> str:
    """The upstream session a tools/call through `node` reached."""
    reply = await at(raw, node).request("tools/call", {"name": tool, "arguments": {}})
    assert reply.status == 200, f"tools/call at node {node.index}: HTTP {reply.status} {reply.body[:300]!r}"
    sid = reply.result["structuredContent"]["session"]
    assert sid, reply.body
    return sid


async def status_of(raw: RawSession, node: Node, method: str) -> int:
    """The HTTP status `node` answers the agent's session with: `ping` (answered by the
    server binding itself, so it never reaches an upstream), `tools/call`, `GET` or `DELETE`."""
    at(raw, node)
    if method == "GET":
        headers = {**raw.headers(), "accept": "text/event-stream"}
        async with raw.client.stream("GET", node.url, headers=headers) as response:
            return response.status_code
    if method == "DELETE":
        return (await raw.delete()).status_code
    params = {"name": "upstream_session", "arguments": {}} if method == "tools/call" else None
    return (await raw.request(method, params)).status


async def is_404(raw: RawSession, node: Node) -> bool:
    return await status_of(raw, node, "ping") == 404


async def upstream_stats(client: httpx2.AsyncClient, url: str, *, await_deleted: list[str] | None = None, wait_s: float = 0) -> dict[str, Any]:
    """What the upstream at `url` says (a session straight to it, which it lists too):
    sessions opened, in order, and deleted, waiting up to `wait_s` for `await_deleted`."""
    raw = RawSession(client, url)
    await raw.initialize()
    args: dict[str, Any] = {"await_deleted": await_deleted or [], "wait_s": wait_s}
    reply = await raw.request("tools/call", {"name": "upstream_stats", "arguments": args})
    await raw.delete()
    return reply.result["structuredContent"]


def opened_since(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Upstream sessions opened between two `upstream_stats`, without the second one's own."""
    new = [s for s in after["opened"] if s not in before["opened"]]
    assert new, "the second upstream_stats session is missing"
    return new[:-1]


async def ended_upstream(client: httpx2.AsyncClient, url: str, session: str, wait_s: float = 5) -> bool:
    """True if the upstream saw `session` deleted (within `wait_s`) or no longer knows it."""
    stats = await upstream_stats(client, url, await_deleted=[session], wait_s=wait_s)
    if session in stats["deleted"]:
        return True
    probe = RawSession(client, url)
    probe.session_id = session
    return (await probe.request("tools/call", {"name": "upstream_session", "arguments": {}})).status == 404


async def poll(check, what: str, timeout_s: float = TIMEOUT_S, interval_s: float = 0.05):
    """Awaits `check()` until it gives something true; fails naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} (within {timeout_s}s)")
        await anyio.sleep(interval_s)


def log_messages(events: list[tuple[str | None, Any]]) -> list[str]:
    return [m["params"]["data"] for _, m in events if m.get("method") == "notifications/message"]


async def log(raw: RawSession, node: Node, route: str, message: str) -> None:
    """The route's upstream sends `message` as notifications/message on the session's GET
    stream (and keeps it in its event store)."""
    reply = await at(raw, node).request("tools/call", {"name": f"{route}__log", "arguments": {"level": "info", "message": message}})
    assert reply.status == 200, f"log at node {node.index}: HTTP {reply.status} {reply.body[:300]!r}"
    assert "logged" in reply.result["content"][0]["text"], reply.body


# --- Config ------------------------------------------------------------------------------


def check(config: str, tmp_path: Path, name: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(config)
    return subprocess.run([str(harness.BINARY), "check", "--config", str(path)], capture_output=True, text=True, timeout=TIMEOUT_S)


def test_sessions_store_must_be_a_redis_store(tmp_path):
    urls = {"alpha": "http://127.0.0.1:9/mcp"}

    def config(store: str) -> str:
        return node_config(urls, "redis://127.0.0.1:9/0", "c:", io="epoll", metrics_port=0, sessions=store, extra_stores=", local: { type: memory }")

    ok = check(config("shared"), tmp_path, "ok")
    assert ok.returncode == 0, f"a redis store is refused: {ok.stdout}{ok.stderr}"
    for store in ("local", "nowhere"):
        bad = check(config(store), tmp_path, store)
        said = bad.stdout + bad.stderr
        assert bad.returncode != 0, f"sessions.store: {store} was accepted: {said}"
        assert "bindings.north.sessions.store" in said, said
        assert "panicked" not in said, said


# --- The record --------------------------------------------------------------------------


def test_initialize_writes_a_record_without_credentials_before_answering(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path, forward=True)
    a, b = cluster.nodes
    token = unique("agent-secret-")
    auth = {"authorization": f"Bearer {token}"}

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            with RedisConn(redis.port) as conn:
                started_ms = time.time() * 1000
                # The record is read straight after initialize: it was written before the answer.
                raw = RawSession(client, a.url, auth)
                reply = await raw.request(
                    "initialize",
                    {"protocolVersion": PROTOCOL, "capabilities": AGENT_CAPABILITIES, "clientInfo": {"name": "raw-test", "version": "0"}},
                )
                assert reply.status == 200, reply.body
                sid = reply.headers.get("mcp-session-id") or ""
                assert SESSION_ID.fullmatch(sid), sid
                value = conn("GET", cluster.key(sid))
                assert value is not None, f"no record after initialize: {conn('KEYS', cluster.prefix + '*')}"
                pttl = conn("PTTL", cluster.key(sid))
                _, record = parse_record(value)
                assert set(record) == RECORD_MEMBERS, record
                assert record["v"] == 1 and record["version"] == PROTOCOL, record
                assert record["capabilities"] == AGENT_CAPABILITIES, record
                assert started_ms - 1000 <= record["touched"] <= time.time() * 1000 + 1000, record
                # About the session timeout (30 s) plus a margin; never without expiry.
                assert 25_000 <= pttl <= 330_000, f"PTTL {pttl}"
                assert token.encode() not in value and b"Bearer" not in value, value
                raw.session_id = sid
                assert (await raw.notify("notifications/initialized")).status == 202
                # B serves it: the same upstream session, and the upstream gets the agent's
                # own credential from B's request (it was never in the store).
                u = await upstream_session(raw, a)
                assert await upstream_session(raw, b) == u
                who = await at(raw, b).request("tools/call", {"name": "whoami", "arguments": {}})
                assert who.result["structuredContent"]["authorization"] == f"Bearer {token}", who.body
                value = conn("GET", cluster.key(sid))
                assert value is not None and token.encode() not in value, value

    cluster.run(scenario)


# --- Serving on any node -----------------------------------------------------------------


def test_any_node_serves_the_session_on_the_same_upstream_sessions(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path, shape="proxy")
    a, b = cluster.nodes

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            before = {name: await upstream_stats(client, u.address) for name, u in upstreams.items()}
            raw = await open_session(client, a)
            # B never saw the session: its first request there is a list (every route).
            reply = await at(raw, b).request("tools/list")
            assert reply.status == 200, f"tools/list at B: HTTP {reply.status} {reply.body[:300]!r}"
            names = [t["name"] for t in reply.result["tools"]]
            assert "alpha__upstream_session" in names and "beta__upstream_session" in names, names
            seen: dict[str, list[str]] = {"alpha": [], "beta": []}
            for node in (a, b, a, b, b, a):
                for route in seen:
                    seen[route].append(await upstream_session(raw, node, f"{route}__upstream_session"))
            for route, sessions in seen.items():
                assert len(set(sessions)) == 1, f"{route}: {sessions}"
            echoed = await at(raw, b).request("tools/call", {"name": "beta__echo", "arguments": {"text": "via B"}})
            assert echoed.result["content"][0]["text"] == "via B"
            assert (await at(raw, a).request("tools/list")).status == 200
            # One initialize per upstream for the agent's session, on A; none on B.
            for name, u in upstreams.items():
                after = await upstream_stats(client, u.address)
                assert opened_since(before[name], after) == [seen[name][0]], (name, before[name], after)

    cluster.run(scenario)


def test_kill_9_of_the_first_node_leaves_the_session_to_the_other(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path)
    a, b = cluster.nodes
    alpha = upstreams["alpha"].address

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            before = await upstream_stats(client, alpha)
            raw = await open_session(client, a)
            u = await upstream_session(raw, a)
            assert await upstream_session(raw, a) == u
            a.kill()
            assert await upstream_session(raw, b) == u
            assert await upstream_session(raw, b) == u
            assert await status_of(raw, b, "ping") == 200
            assert opened_since(before, await upstream_stats(client, alpha)) == [u]

    cluster.run(scenario)


@pytest.mark.parametrize("shape", ["client", "proxy"])
def test_a_session_the_upstream_forgot_is_renewed_in_the_record(upstreams, redis, tmp_path, shape):
    """The upstream forgets the session (as after its restart: a DELETE straight to it);
    A's next request gets the upstream's 404, opens a new upstream session and the
    record names it, so B takes up the new one: no upstream initialize of its own."""
    cluster = Cluster(upstreams, redis, tmp_path, shape=shape)
    a, b = cluster.nodes
    alpha = upstreams["alpha"].address
    tool = cluster.tool("upstream_session")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            with RedisConn(redis.port) as conn:
                raw = await open_session(client, a)
                u = await upstream_session(raw, a, tool)
                gone = await client.delete(alpha, headers={"mcp-session-id": u, "mcp-protocol-version": PROTOCOL})
                assert gone.status_code in (200, 204), gone.status_code
                renewed = await upstream_session(raw, a, tool)
                assert renewed != u

                async def record_names_it():
                    return renewed in json.dumps(read_record(conn, cluster, raw.session_id)[1]["handoff"])

                await poll(record_names_it, "the record did not come to name the new upstream session")
                before = await upstream_stats(client, alpha)
                assert await upstream_session(raw, b, tool) == renewed
                assert opened_since(before, await upstream_stats(client, alpha)) == []

    cluster.run(scenario)


def test_a_route_opened_at_one_node_is_taken_up_at_the_other(upstreams, redis, tmp_path):
    """With a cache, a proxy opens a route at the session's first call that needs it. Each
    session opens on A, its first call goes to B (which takes it up and opens route
    alpha), and the next one goes to A at once, without waiting for A's watch: A, which
    holds the session with alpha still closed, reads the record again before it opens
    alpha, and takes alpha up from what B wrote instead of opening an upstream session of
    its own. Ten sessions in a row, so a race would show."""
    cluster = Cluster(upstreams, redis, tmp_path, shape="cached")
    a, b = cluster.nodes
    alpha = upstreams["alpha"].address
    tool = cluster.tool("upstream_session")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            with RedisConn(redis.port) as conn:
                before = await upstream_stats(client, alpha)
                seen = []
                for _ in range(10):
                    raw = await open_session(client, a)
                    u = await upstream_session(raw, b, tool)
                    assert await upstream_session(raw, a, tool) == u
                    assert await upstream_session(raw, b, tool) == u
                    assert u in json.dumps(read_record(conn, cluster, raw.session_id)[1]["handoff"])
                    seen.append(u)
                assert opened_since(before, await upstream_stats(client, alpha)) == seen

    cluster.run(scenario)


def test_the_get_stream_resumes_on_another_node_after_a_kill(upstreams, redis, tmp_path):
    """A's GET stream hears a1, b1 (ids `0.<seq>:<aggregate>`); the agent leaves it; both
    routes emit a2, b2; A is killed. A GET on B with the last id A gave gets a2 and b2 (B
    has no ring for them: the routes' event stores replay from the aggregate's ids), then
    a3 live."""
    cluster = Cluster(upstreams, redis, tmp_path, shape="proxy")
    a, b = cluster.nodes

    async def scenario():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=30)) as client:
            raw = await open_session(client, a)
            get = {**raw.headers(), "accept": "text/event-stream"}
            first: list[tuple[str | None, Any]] = []
            async with client.stream("GET", a.url, headers=get) as response:
                assert response.status_code == 200
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read_events, response, first, 2)
                    await log(raw, a, "alpha", "a1")
                    await log(raw, a, "beta", "b1")
            # Two routes' GET streams: their events interleave in either order.
            assert sorted(log_messages(first)) == ["a1", "b1"]
            last_id = first[-1][0]
            assert last_id is not None and re.fullmatch(r"0\.\d+:.+=.+;.+=.+", last_id), last_id
            # Away from the stream: both routes emit (their event stores keep it).
            await log(raw, a, "alpha", "a2")
            await log(raw, a, "beta", "b2")
            a.kill()
            resumed: list[tuple[str | None, Any]] = []
            async with client.stream("GET", b.url, headers={**get, "last-event-id": last_id}) as response:
                assert response.status_code == 200, f"GET at B: HTTP {response.status_code} {(await response.aread())[:300]!r}"
                assert response.headers["content-type"].startswith("text/event-stream")
                async with anyio.create_task_group() as tg:
                    tg.start_soon(read_events, response, resumed, 3)
                    async def replayed():
                        return len(resumed) >= 2

                    await poll(replayed, "B did not replay what the routes sent after the id")
                    await log(raw, b, "alpha", "a3")
            got = log_messages(resumed)
            assert sorted(got[:2]) == ["a2", "b2"] and got[2:] == ["a3"], got
            assert all(eid and eid.startswith("0.") for eid, _ in resumed), resumed

    cluster.run(scenario)


# --- Ending ------------------------------------------------------------------------------


def test_delete_on_another_node_ends_it_everywhere(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path)
    a, b = cluster.nodes
    alpha = upstreams["alpha"].address

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            with RedisConn(redis.port) as conn:
                raw = await open_session(client, a)
                u = await upstream_session(raw, a)
                assert conn("EXISTS", cluster.key(raw.session_id)) == 1
                assert await status_of(raw, b, "DELETE") == 200
                assert await status_of(raw, b, "ping") == 404
                # A learns it through the store (ping never reaches an upstream, so the
                # polling cannot make A open a new upstream session).
                started = time.monotonic()
                await poll(lambda: is_404(raw, a), "A still serves the deleted session", timeout_s=3)
                assert time.monotonic() - started <= 3
                for node in (a, b):
                    for method in ("tools/call", "GET", "DELETE"):
                        assert await status_of(raw, node, method) == 404, (node.index, method)
                tombstone = conn("GET", cluster.key(raw.session_id))
                assert tombstone is not None and re.fullmatch(rb"\d+!", tombstone), tombstone
                assert await ended_upstream(client, alpha, u), f"the upstream session {u} was not ended"

    cluster.run(scenario)


def test_idle_expiry_is_cluster_wide_and_activity_anywhere_keeps_it(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path, timeout="2s")
    a, b = cluster.nodes
    alpha = upstreams["alpha"].address

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            raw = await open_session(client, a)
            u = await upstream_session(raw, a)
            # Only B is used, every 0.5 s for 5 s: A's copy idles past 2 s meanwhile.
            started = time.monotonic()
            while time.monotonic() - started < 5:
                got = await upstream_session(raw, b)
                assert got == u, (
                    f"{time.monotonic() - started:.1f}s in, B served the session on another upstream session "
                    f"({got} instead of {u}): was it ended when A's idle copy expired?"
                )
                await anyio.sleep(0.5)
            assert u not in (await upstream_stats(client, alpha))["deleted"], "A's idle copy ended the upstream session"
            assert await upstream_session(raw, a) == u, "the session is alive in the cluster: A serves it again"
            assert await upstream_session(raw, b) == u
            # Nobody uses it for over three timeouts: gone on both nodes, and upstream.
            await anyio.sleep(6.5)
            assert await status_of(raw, b, "ping") == 404
            assert await status_of(raw, a, "ping") == 404
            assert await ended_upstream(client, alpha, u), f"the expired session's upstream session {u} was not ended"

    cluster.run(scenario)


def test_a_graceful_stop_leaves_shared_sessions_alive(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path)
    a, b = cluster.nodes
    alpha = upstreams["alpha"].address

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            with RedisConn(redis.port) as conn:
                raw = await open_session(client, a)
                u = await upstream_session(raw, a)
                a.stop()  # SIGTERM; it must exit 0
                assert conn("EXISTS", cluster.key(raw.session_id)) == 1, "the drain removed the record"
                assert await upstream_session(raw, b) == u
                assert u not in (await upstream_stats(client, alpha))["deleted"], "the drain ended the upstream session"
                assert await upstream_session(raw, b) == u

    cluster.run(scenario)


# --- Without `sessions:` (today's behaviour) ---------------------------------------------


def test_without_sessions_a_session_stays_on_its_node(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path, sessions=None)
    a, b = cluster.nodes

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            with RedisConn(redis.port) as conn:
                raw = await open_session(client, a)
                u = await upstream_session(raw, a)
                for method in ("ping", "tools/call", "GET", "DELETE"):
                    assert await status_of(raw, b, method) == 404, method
                assert await upstream_session(raw, a) == u
                keys = conn("KEYS", "*")
                assert not [k for k in keys if b"session:" in k], keys

    cluster.run(scenario)


# --- Hostile input -----------------------------------------------------------------------


def test_unknown_malformed_and_forged_ids_are_404_or_working_sessions(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path)
    a, b = cluster.nodes

    async def answer(session_id: str, node: Node, client: httpx2.AsyncClient) -> tuple[int, dict[str, Any] | None, float]:
        probe = RawSession(client, node.url)
        probe.session_id = session_id
        started = time.monotonic()
        reply = await probe.request("tools/call", {"name": "upstream_session", "arguments": {}})
        return reply.status, reply.message, time.monotonic() - started

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            with RedisConn(redis.port) as conn:
                monitor = Monitor(redis.port)
                try:
                    # A well-formed id no store holds: 404 at once, after one lookup.
                    unknown = well_formed_id()
                    for node in (b, a):
                        status, _, took = await answer(unknown, node, client)
                        assert status == 404 and took < 1.0, (node.index, status, took)
                        probe = RawSession(client, node.url)
                        probe.session_id = unknown
                        for method in ("GET", "DELETE"):
                            assert await status_of(probe, node, method) == 404, method
                    # Repeated, it is answered from the node's memory of absent ids (kept
                    # 2 s), not by a store read each time: ten in a row take a few ms, so
                    # most are remembered even on a slow machine.
                    remembered = b.metric("mcpyard_sessions_absent_remembered_total")
                    for _ in range(10):
                        status, _, _ = await answer(unknown, b, client)
                        assert status == 404
                    assert b.metric("mcpyard_sessions_absent_remembered_total") - remembered >= 5
                    # Ids outside the format: 404, and no Redis command names them.
                    # Each carries a mark of its own (9 characters of the id alphabet).
                    marks = {name: unique("Q") for name in ("too long", "too short", "%0d", "space", "non-hex owner")}
                    malformed = {
                        "too long": "0000" + marks["too long"] + "A" * 14,
                        "too short": "0000" + marks["too short"] + "A" * 12,
                        "%0d": "0000" + marks["%0d"] + "%0d" + "A" * 10,
                        "space": "0000" + marks["space"] + " " + "A" * 12,
                        "non-hex owner": "zz00" + marks["non-hex owner"] + "A" * 13,
                    }
                    assert len(malformed["too long"]) == 27 and len(malformed["too short"]) == 25
                    assert all(len(malformed[k]) == 26 for k in ("%0d", "space", "non-hex owner"))
                    for name, bad in malformed.items():
                        status, _, took = await answer(bad, b, client)
                        assert status == 404 and took < 1.0, (name, status, took)
                        probe = RawSession(client, b.url)
                        probe.session_id = bad
                        for method in ("GET", "DELETE"):
                            assert await status_of(probe, b, method) == 404, (name, method)
                    await monitor.sync(conn)
                    seen = monitor.text()
                    assert unknown.encode() in seen, "the well-formed unknown id was never looked up in redis"
                    for name, mark in marks.items():
                        assert mark.encode() not in seen, f"redis was asked about the {name} id"
                finally:
                    monitor.close()

                # Forged records under well-formed ids, made from a donor session's (so a
                # node ending a forged one's upstream session ends the donor's, not the
                # real session's), next to a real session.
                raw = await open_session(client, a)
                u = await upstream_session(raw, a)
                assert await upstream_session(raw, b) == u
                donor = await open_session(client, a)
                d = await upstream_session(donor, a)
                version, record = read_record(conn, cluster, donor.session_id)

                def stored(changed: dict[str, Any]) -> bytes:
                    return f"{version}:".encode() + json.dumps({**record, **changed}).encode()

                def handoff_with(session: Any) -> bytes:
                    handoff, n = replace_string(record["handoff"], d, session)
                    assert n >= 1, f"the handoff does not carry the upstream session id {d} as a JSON string: {record['handoff']!r}"
                    return stored({"handoff": handoff})

                crlf = "evil\r\nx-injected: 1"
                long_id = "u" * 10_240
                forged: dict[str, bytes | None] = {
                    "garbage after the version": f"{version}:".encode() + b"\x00\xff{{not json",
                    "no version prefix": json.dumps(record).encode(),
                    "non-digit version": b"x1:" + json.dumps(record).encode(),
                    "v 2": stored({"v": 2}),
                    "unknown protocol version": stored({"version": "1999-01-01"}),
                    "string capabilities": stored({"capabilities": "all of them"}),
                    "array capabilities": stored({"capabilities": [1, 2]}),
                    "touched u64::MAX": stored({"touched": 18446744073709551615}),
                    "touched negative": stored({"touched": -1}),
                    "1 MB capabilities": stored({"capabilities": {"pad": "x" * (1 << 20)}}),
                    "1 MB garbage": f"{version}:".encode() + b"[" * (1 << 20),
                    "handoff CR/LF": handoff_with(crlf),
                    "handoff 10 KB": handoff_with(long_id),
                    "handoff null": stored({"handoff": None}),
                    "a hash, not a string": None,
                }
                fresh_handoff = {"handoff CR/LF", "handoff 10 KB", "handoff null"}
                outcomes = {}
                for i, (name, value) in enumerate(forged.items()):
                    sid = well_formed_id(worker=i % 2)
                    if value is None:
                        assert conn("HSET", cluster.key(sid), "v", "1") == 1
                        assert conn("PEXPIRE", cluster.key(sid), 60_000) == 1
                    else:
                        assert conn("SET", cluster.key(sid), value, "PX", 60_000) == "OK"
                    status, message, took = await answer(sid, b, client)
                    outcomes[name] = status
                    assert took < 5.0, f"{name}: answered after {took:.1f}s"
                    assert status in FORGED_RECORD_STATUSES, f"{name}: HTTP {status}"
                    if status == 200:
                        assert message is not None and "result" in message, f"{name}: not a working session: {message}"
                        got = message["result"]["structuredContent"]["session"]
                        if name in fresh_handoff:
                            assert got not in (d, u, crlf, long_id), f"{name}: served on {got[:40]!r}, not a fresh upstream session"
                        else:
                            assert got != u, f"{name}: served on the real session's upstream session"
                    assert b.child.alive() and a.child.alive(), f"{name}: a node died"
                # The real session, new sessions, both nodes: unharmed.
                assert await upstream_session(raw, b) == u
                assert await upstream_session(raw, a) == u
                for node in (b, a):
                    fresh = await open_session(client, node)
                    assert await upstream_session(fresh, node) not in (u, crlf, long_id)
                    assert (await at(fresh, node).request("tools/list")).status == 200
                print("forged records:", outcomes)

    cluster.run(scenario)


# --- Redis down --------------------------------------------------------------------------


def test_with_redis_down_sessions_open_and_work_on_their_node_only(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path, timeout="8s")
    a, b = cluster.nodes

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            raw = await open_session(client, a)
            assert await upstream_session(raw, b) == await upstream_session(raw, a)
            redis.stop()

            async def disconnected():
                return all(n.metric('mcpyard_store_connected{store="shared"}') == 0 for n in cluster.nodes)

            await poll(disconnected, "a node did not notice redis went away")
            started = time.monotonic()
            alone = await open_session(client, a)
            assert time.monotonic() - started < 3.0, "initialize waited for redis"
            u = await upstream_session(alone, a)
            assert await upstream_session(alone, a) == u
            assert await status_of(alone, b, "ping") == STORE_DOWN_STATUS
            # Back (empty): sessions opened from now on are shared again.
            redis.start()

            async def shared_again():
                fresh = await open_session(client, a)
                return await status_of(fresh, b, "ping") == 200

            await poll(shared_again, "sessions were not shared again once redis was back", timeout_s=20, interval_s=0.3)
            assert await upstream_session(alone, a) == u, "the node-local session went on working"

            # The session opened while redis was down gets its record at A's next write
            # (a quarter of the session timeout after the failed one): then B serves it too,
            # on the same upstream session.
            async def alone_shared():
                return await status_of(alone, b, "ping") == 200

            await poll(alone_shared, "the session opened while redis was down was never shared", timeout_s=20, interval_s=0.5)
            assert await upstream_session(alone, b) == u
            # Redis came back empty: the records of the sessions shared before are gone, and
            # the nodes let go of them (without ending them upstream): the agent starts anew.
            async def raw_gone():
                return await status_of(raw, a, "ping") == 404 and await status_of(raw, b, "ping") == 404

            await poll(raw_gone, "a session whose record redis lost was still served", timeout_s=10, interval_s=0.3)

    cluster.run(scenario, timeout_s=60)


def test_a_session_opened_while_redis_was_down_survives_its_first_route_after(upstreams, redis, tmp_path):
    """With a cache, routes open at first use, and a shared session's first opening reads
    its record again. A session opened on A while Redis was down has no record until A's
    next write; its first call once Redis is back (before that write) must open the route
    and go on, not read the missing record as "deleted at another node"."""
    cluster = Cluster(upstreams, redis, tmp_path, shape="cached", timeout="40s")
    a, _ = cluster.nodes
    tool = cluster.tool("upstream_session")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            redis.stop()

            async def disconnected():
                return a.metric('mcpyard_store_connected{store="shared"}') == 0

            await poll(disconnected, "node A did not notice redis went away")
            alone = await open_session(client, a)
            redis.start()

            async def connected():
                return a.metric('mcpyard_store_connected{store="shared"}') == 1

            await poll(connected, "node A did not reconnect", timeout_s=20, interval_s=0.05)
            # A's next write of the record comes a quarter of the timeout (10 s) after the
            # failed one: the record is still missing now.
            with RedisConn(redis.port) as conn:
                assert conn("GET", cluster.key(alone.session_id)) is None
            u = await upstream_session(alone, a, tool)
            assert await upstream_session(alone, a, tool) == u
            assert await status_of(alone, a, "ping") == 200

    cluster.run(scenario, timeout_s=60)


# --- The official SDK client against the cluster -----------------------------------------


def test_with_auth_a_shared_session_is_taken_up_only_by_its_subject(upstreams, redis, tmp_path):
    """`auth:` on both nodes: the record names the subject whose token opened the session.
    Bob's valid token with Alice's session id at B, which never saw it, is 404 like an
    unknown id, and nothing is taken up: the record is untouched (no new `touched`, no `by`
    of B), B holds no session. Alice's own token at B then takes it up on the same upstream
    session. A record without an owner (as a node without `auth` writes it) is no one's."""
    keys = authkit.make_keys()
    jwks_path = tmp_path / "jwks.json"
    jwks_path.write_text(json.dumps(authkit.jwks(*keys.values())))
    auth = f'{{ jwt: {{ issuer: "{authkit.ISSUER}", audiences: ["{authkit.AUDIENCE}"], jwks: "{jwks_path}" }} }}'
    cluster = Cluster(upstreams, redis, tmp_path, auth=auth, forward=True)
    a, b = cluster.nodes

    def bearer(sub: str) -> dict[str, str]:
        return {"authorization": "Bearer " + keys["ES256"].sign(authkit.claims(sub))}

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            alice = await open_session(client, a, bearer("alice"))
            first = await upstream_session(alice, a)
            with RedisConn(redis.port) as conn:
                _, before = read_record(conn, cluster, alice.session_id)
                assert before.get("owner") == "alice", before
                adopted = b.metric("mcpyard_sessions_adopted_total")
                bob = RawSession(client, b.url, bearer("bob"))
                bob.session_id = alice.session_id
                for method in ("ping", "tools/call", "DELETE"):
                    assert await status_of(bob, b, method) == 404, method
                _, after = read_record(conn, cluster, alice.session_id)
                assert after == before, (before, after)
                assert b.metric("mcpyard_sessions_adopted_total") == adopted
                assert b.metric('mcpyard_auth_rejected_total{reason="subject"}') >= 3
                # The owner at B: taken up, the same upstream session.
                assert await upstream_session(alice, b) == first
                # A record without an owner: 404 for Alice too, and it is not taken up.
                orphan = well_formed_id()
                value = conn("GET", cluster.key(alice.session_id))
                version, record = parse_record(value)
                record.pop("owner")
                stored = f"{version}:{json.dumps(record)}".encode()
                assert conn("SET", cluster.key(orphan), stored, "PX", 60_000) == "OK"
                alice_orphan = RawSession(client, b.url, bearer("alice"))
                alice_orphan.session_id = orphan
                assert await status_of(alice_orphan, b, "ping") == 404
                assert conn("GET", cluster.key(orphan)) == stored

    cluster.run(scenario)


class RoundRobin(httpx2.AsyncBaseTransport):
    """Sends each HTTP request to the next node in turn (the URL's port and Host header
    rewritten), as a load balancer without affinity would; `sent` is (method, port)."""

    def __init__(self, urls: list[str]) -> None:
        self.ports = [httpx2.URL(u).port for u in urls]
        self.inner = httpx2.AsyncHTTPTransport()
        self.turn = 0
        self.sent: list[tuple[str, int]] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = self.ports[self.turn % len(self.ports)]
        self.turn += 1
        request.url = request.url.copy_with(port=port)
        request.headers["host"] = f"127.0.0.1:{port}"
        self.sent.append((request.method, port))
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_an_unmodified_sdk_client_works_with_requests_spread_over_the_nodes(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path, shape="proxy")
    a, b = cluster.nodes
    alpha = upstreams["alpha"].address

    async def scenario():
        transport = RoundRobin([a.url, b.url])
        statuses: list[tuple[str, int | None, int]] = []

        async def on_response(response: httpx2.Response) -> None:
            statuses.append((response.request.method, response.request.url.port, response.status_code))

        notes = Collector()
        http = httpx2.AsyncClient(transport=transport, timeout=httpx2.Timeout(TIMEOUT_S, read=60), event_hooks={"response": [on_response]})
        async with http:
            async with streamable_http_client(a.url, http_client=http) as (read, write):
                async with ClientSession(read, write, message_handler=notes) as session:
                    with anyio.fail_after(TIMEOUT_S):
                        await session.initialize()
                    names = [t.name for t in (await session.list_tools()).tools]
                    assert "alpha__upstream_session" in names and "beta__echo" in names, names
                    sessions = []
                    for _ in range(6):
                        result = await session.call_tool("alpha__upstream_session", {})
                        sessions.append(result.structured_content["session"])
                    assert len(set(sessions)) == 1, sessions
                    assert tool_text(await session.call_tool("beta__echo", {"text": "spread"})) == "spread"
                    await session.call_tool("alpha__log", {"level": "info", "message": "from the cluster"})
                    with anyio.fail_after(TIMEOUT_S):
                        logs = await notes.wait_for(types.LoggingMessageNotification)
                    assert [m.params.data for m in logs] == ["from the cluster"]
        posts = {port for method, port in transport.sent if method == "POST"}
        assert posts == {httpx2.URL(a.url).port, httpx2.URL(b.url).port}, transport.sent
        assert all(status < 400 for _, _, status in statuses), statuses
        assert ("DELETE", 200) in [(m, s) for m, _, s in statuses], statuses
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            assert await ended_upstream(client, alpha, sessions[0]), "the SDK client's DELETE did not end the upstream session"

    cluster.run(scenario)
