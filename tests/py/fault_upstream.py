"""A scripted MCP upstream on raw asyncio sockets, for the gateway fault tests.

It speaks just enough HTTP/1.1 and MCP Streamable HTTP to be a plausible upstream
(initialize with a session id, notifications 202, tools/list, tools/call echo, ping,
GET 405, DELETE), and lets a test choose, request by request, to answer something else
instead: a JSON-RPC error, any HTTP status and headers (500, 503, 401/403 with a Bearer
challenge), a 404 for a session it "forgot", a body cut short, no answer at all, or a
malformed JSON or SSE body. Every request it reads is recorded (`seen`) so the test can
check what the gateway sent: headers, session ids, retries.

The server runs its own asyncio loop on a background thread, so a test can start it (and
learn its port) before starting mcpyard; `script`, `seen` and the listening switches are
thread-safe.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

PROTOCOL = "2025-11-25"


# --- What to answer ----------------------------------------------------------------------


@dataclass(frozen=True)
class RpcError:
    """HTTP 200 with a JSON-RPC error for the request's own id."""

    code: int
    message: str
    data: Any = None
    has_data: bool = False


@dataclass(frozen=True)
class Status:
    """Any HTTP status with the headers and body given (no JSON-RPC answer)."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""


@dataclass(frozen=True)
class ForgetSession:
    """The upstream forgets the request's session: 404 now and for every later use of it."""


@dataclass(frozen=True)
class ResetMidBody:
    """A 200 head promising more body (Content-Length) than is sent, then the connection closes."""


@dataclass(frozen=True)
class Hang:
    """Reads the request and never answers (the connection stays open until the peer leaves)."""


@dataclass(frozen=True)
class MalformedJson:
    """200 `application/json` whose body is not JSON."""


@dataclass(frozen=True)
class MalformedSse:
    """200 `text/event-stream` whose event data is not JSON, then the stream ends."""


@dataclass(frozen=True)
class Answer:
    """200 with a JSON-RPC result of the test's choosing for the request's own id (for
    initialize: no session id), e.g. an initialize result with a hostile protocolVersion."""

    result: Any


@dataclass(frozen=True)
class EventStream:
    """For a GET: 200 `text/event-stream` carrying these JSON-RPC messages (one event each,
    ids `e<n>`, or `ids[n]` when given: raw bytes, hostile ones included), then the stream
    stays open until the peer leaves (or, with `close`, ends at once)."""

    messages: tuple[Any, ...]
    ids: tuple[bytes, ...] = ()
    close: bool = False


@dataclass(frozen=True)
class Raw:
    """These bytes exactly, head included (`{id}` in them becomes the request's JSON-RPC id);
    then, with `hold`, the connection stays open until the peer leaves, else it closes."""

    data: bytes
    hold: bool = False


@dataclass(frozen=True)
class Delay:
    """Answers as usual, after this many seconds."""

    seconds: float


Action = RpcError | Status | ForgetSession | ResetMidBody | Hang | MalformedJson | MalformedSse | Answer | EventStream | Raw | Delay


def rpc_error(code: int, message: str, *data: Any) -> RpcError:
    """`rpc_error(c, m)` has no `data` member; `rpc_error(c, m, d)` has `data: d`."""
    return RpcError(code, message, data[0] if data else None, bool(data))


def challenge(status: int, www_authenticate: str) -> Status:
    body = json.dumps({"error": "insufficient_scope" if status == 403 else "invalid_token"}).encode()
    return Status(status, (("WWW-Authenticate", www_authenticate), ("Content-Type", "application/json")), body)


# --- What was received -------------------------------------------------------------------


@dataclass
class Seen:
    """One request as the upstream read it, and what it answered."""

    method: str  # HTTP method
    path: str
    headers: dict[str, str]  # names lower-cased
    body: Any  # parsed JSON, or None
    answer: str = "normal"  # the action's class name, or "normal"
    new_session: str | None = None  # the session id an initialize answer assigned
    raw_head: bytes = b""  # the head exactly as it arrived, CRLFs included
    peer_left: bool = False  # for a `Raw(hold=True)` answer: the peer closed the connection

    @property
    def rpc_method(self) -> str | None:
        return self.body.get("method") if isinstance(self.body, dict) else None

    @property
    def rpc_id(self) -> Any:
        return self.body.get("id") if isinstance(self.body, dict) else None

    @property
    def session(self) -> str | None:
        return self.headers.get("mcp-session-id")


@dataclass
class Rule:
    match: str  # a JSON-RPC method, or "GET"/"DELETE"
    action: Action
    times: int


# --- The server --------------------------------------------------------------------------


@dataclass
class FaultUpstream:
    """The scripted upstream. `sse=True` answers normal requests as SSE instead of JSON."""

    sse: bool = False
    # tools/list pages whose `nextCursor` goes round c1, c2, c1, ... (a hostile pager).
    cycle_cursors: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._rules: list[Rule] = []
        self._sessions: set[str] = set()
        self._forgotten: set[str] = set()
        self._ids = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    # Control, from the test's thread.

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/mcp"

    def start(self) -> FaultUpstream:
        self._thread.start()
        self._call(self._listen())
        return self

    def close(self) -> None:
        self._call(self._shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def stop_listening(self) -> None:
        """Closes the listener and every open connection: new connections are refused."""
        self._call(self._shut())

    def listen_again(self) -> None:
        """Listens again on the same port."""
        self._call(self._listen())

    def script(self, match: str, action: Action, times: int = 1) -> None:
        """The next `times` requests matching `match` (a JSON-RPC method, or GET/DELETE)
        get `action` instead of the normal answer. Rules apply in the order given."""
        with self._lock:
            self._rules.append(Rule(match, action, times))

    def clear_script(self) -> None:
        with self._lock:
            self._rules.clear()

    def wait_until(self, predicate, timeout_s: float) -> bool:
        """Blocks until `predicate(seen)` holds (checked at every request), for at most
        `timeout_s`; returns whether it did. From async code: `anyio.to_thread.run_sync`."""
        with self._arrived:
            return self._arrived.wait_for(lambda: predicate(self.seen), timeout=timeout_s)

    def requests(self, rpc_method: str | None = None, http_method: str | None = None) -> list[Seen]:
        with self._lock:
            return [
                s
                for s in self.seen
                if (rpc_method is None or s.rpc_method == rpc_method) and (http_method is None or s.method == http_method)
            ]

    def _call(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    # The loop side.

    async def _listen(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._server = await asyncio.start_server(self._connection, sock=sock)

    async def _shut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    def _pick(self, seen: Seen) -> Action | None:
        key = seen.rpc_method if seen.method == "POST" else seen.method
        with self._lock:
            for rule in self._rules:
                if rule.match == key and rule.times > 0:
                    rule.times -= 1
                    return rule.action
        return None

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                seen = await _read_request(reader)
                if seen is None:
                    return
                action = self._pick(seen)
                seen.answer = type(action).__name__ if action is not None else "normal"
                with self._lock:
                    self.seen.append(seen)
                    self._arrived.notify_all()
                keep = await self._answer(seen, action, reader, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, seen: Seen, action: Action | None, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Writes the answer; returns whether the connection stays usable."""
        rid = seen.rpc_id
        if isinstance(action, RpcError):
            error: dict[str, Any] = {"code": action.code, "message": action.message}
            if action.has_data:
                error["data"] = action.data
            return await self._rpc(writer, seen, {"jsonrpc": "2.0", "id": rid, "error": error})
        if isinstance(action, Status):
            await _write(writer, action.status, list(action.headers), action.body)
            return True
        if isinstance(action, ForgetSession):
            if seen.session:
                self._forgotten.add(seen.session)
                self._sessions.discard(seen.session)
            return await self._session_gone(writer)
        if isinstance(action, ResetMidBody):
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            writer.write(head + b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode() + b',"result":{"cont')
            await writer.drain()
            return False
        if isinstance(action, Hang):
            await reader.read()  # until the peer (the gateway) gives up on the connection
            return False
        if isinstance(action, MalformedJson):
            body = b'{"jsonrpc":"2.0","id":' + json.dumps(rid).encode() + b',"result":{"content":[{"type":"te'
            await _write(writer, 200, [("Content-Type", "application/json")], body)
            return True
        if isinstance(action, EventStream):
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
            writer.write(head)
            for n, message in enumerate(action.messages, 1):
                event_id = action.ids[n - 1] if n <= len(action.ids) else f"e{n}".encode()
                writer.write(b"id: " + event_id + f"\nevent: message\ndata: {json.dumps(message)}\n\n".encode())
            await writer.drain()
            if not action.close:
                await reader.read()  # until the peer leaves; the stream is close-delimited
            return False
        if isinstance(action, Raw):
            writer.write(action.data.replace(b"{id}", json.dumps(rid).encode()))
            await writer.drain()
            if action.hold:
                await reader.read()  # until the peer leaves
                seen.peer_left = True
            return False
        if isinstance(action, Delay):
            await asyncio.sleep(action.seconds)
            return await self._normal(seen, writer)
        if isinstance(action, Answer):
            return await self._rpc(writer, seen, {"jsonrpc": "2.0", "id": rid, "result": action.result})
        if isinstance(action, MalformedSse):
            body = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":" + json.dumps(rid).encode() + b",\"result\":{oops\n\n"
            await _write(writer, 200, [("Content-Type", "text/event-stream")], body)
            return True
        return await self._normal(seen, writer)

    async def _normal(self, seen: Seen, writer: asyncio.StreamWriter) -> bool:
        if seen.method == "GET":
            if seen.session is not None and seen.session not in self._sessions:
                return await self._session_gone(writer)
            await _write(writer, 405, [("Allow", "POST, DELETE")], b"")  # no GET stream here
            return True
        if seen.method == "DELETE":
            if seen.session in self._sessions:
                self._sessions.discard(seen.session)
                await _write(writer, 200, [], b"")
                return True
            return await self._session_gone(writer)
        if seen.method != "POST" or not isinstance(seen.body, dict):
            await _write(writer, 400, [("Content-Type", "text/plain")], b"bad request")
            return True
        body = seen.body
        if body.get("method") == "initialize":
            sid = f"fault-{next(self._ids)}"
            self._sessions.add(sid)
            seen.new_session = sid
            result = {
                "protocolVersion": PROTOCOL,
                "capabilities": {"tools": {"listChanged": False}},
                "serverInfo": {"name": "fault-upstream", "version": "0"},
            }
            return await self._rpc(writer, seen, {"jsonrpc": "2.0", "id": body.get("id"), "result": result}, sid)
        if seen.session is None:
            await _write(writer, 400, [("Content-Type", "text/plain")], b"missing session id")
            return True
        if seen.session not in self._sessions:
            return await self._session_gone(writer)
        if "id" not in body or "method" not in body:
            await _write(writer, 202, [], b"")  # a notification or a response
            return True
        result = _cycled_page(body) if self.cycle_cursors and body["method"] == "tools/list" else _result(body)
        return await self._rpc(writer, seen, {"jsonrpc": "2.0", "id": body["id"], "result": result})

    async def _rpc(self, writer: asyncio.StreamWriter, seen: Seen, message: dict[str, Any], sid: str | None = None) -> bool:
        headers = [("mcp-session-id", sid)] if sid else []
        text = json.dumps(message).encode()
        if self.sse:
            await _write(writer, 200, [("Content-Type", "text/event-stream"), *headers], b"event: message\ndata: " + text + b"\n\n")
        else:
            await _write(writer, 200, [("Content-Type", "application/json"), *headers], text)
        return True

    async def _session_gone(self, writer: asyncio.StreamWriter) -> bool:
        body = json.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "Session not found"}})
        await _write(writer, 404, [("Content-Type", "application/json")], body.encode())
        return True


def _cycled_page(body: dict[str, Any]) -> dict[str, Any]:
    """A tools/list page of the cycling pager: no cursor gives tool p0 and c1, c1 gives p1
    and c2, c2 gives p2 and c1 again."""
    cursor = (body.get("params") or {}).get("cursor")
    n = {None: 0, "c1": 1, "c2": 2}.get(cursor, 0)
    schema = {"type": "object", "properties": {}}
    return {"tools": [{"name": f"p{n}", "inputSchema": schema}], "nextCursor": "c2" if n == 1 else "c1"}


def _result(body: dict[str, Any]) -> dict[str, Any]:
    method = body["method"]
    params = body.get("params") or {}
    if method == "tools/list":
        schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
        return {"tools": [{"name": "echo", "inputSchema": schema}]}
    if method == "tools/call":
        text = (params.get("arguments") or {}).get("text", params.get("name", ""))
        return {"content": [{"type": "text", "text": f"upstream: {text}"}], "isError": False}
    return {}


async def _write(writer: asyncio.StreamWriter, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
    reason = {200: "OK", 202: "Accepted", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
              405: "Method Not Allowed", 500: "Internal Server Error", 503: "Service Unavailable"}.get(status, "Status")  # fmt: skip
    lines = [f"HTTP/1.1 {status} {reason}", *(f"{k}: {v}" for k, v in headers), f"Content-Length: {len(body)}"]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
    await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> Seen | None:
    """Reads one HTTP/1.1 request (Content-Length or chunked body); None at a clean EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as e:
        if e.partial:
            raise
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        raw = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            raw += await reader.readexactly(size)
            await reader.readexactly(2)
    else:
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
    body = None
    if raw:
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
    return Seen(method=method, path=path, headers=headers, body=body, raw_head=head)


def free_port() -> int:
    """A port nothing listens on (bound and released at once): connections are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
