"""Raw HTTP plumbing for the gateway tests: JSON-RPC over Streamable HTTP with httpx2 and
nothing of the SDK, so a test sees the exact bytes, statuses and headers.

- `RawSession` POSTs one JSON-RPC message at a time and reads the answer whether it came
  as `application/json` or as an SSE stream; `Reply.result_bytes` is the `result` member's
  value exactly as it was on the wire (for byte-for-byte comparisons through the gateway).
- `json_member_span` finds a member's value in JSON text without re-serialising it.
- `parse_sse` and `parse_bearer_challenge` are small parsers the fault tests share.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx2

PROTOCOL = "2025-11-25"
ACCEPT = "application/json, text/event-stream"


# --- JSON member spans -------------------------------------------------------------------


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _skip_string(text: str, i: int) -> int:
    """`i` is at the opening quote; returns the index just past the closing quote."""
    assert text[i] == '"', f"expected a string at {i}: {text[i:i + 20]!r}"
    i += 1
    while text[i] != '"':
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _skip_value(text: str, i: int) -> int:
    """Returns the index just past the JSON value starting at `i`."""
    c = text[i]
    if c == '"':
        return _skip_string(text, i)
    if c in "{[":
        depth = 0
        while True:
            c = text[i]
            if c == '"':
                i = _skip_string(text, i)
                continue
            if c in "{[":
                depth += 1
            elif c in "}]":
                depth -= 1
                if depth == 0:
                    return i + 1
            i += 1
    while i < len(text) and text[i] not in ",}] \t\r\n":
        i += 1
    return i


def json_member_span(text: str, member: str) -> str | None:
    """The raw text of top-level `member`'s value in the JSON object `text`, or None."""
    i = _skip_ws(text, 0)
    assert text[i] == "{", f"not a JSON object: {text[:40]!r}"
    i = _skip_ws(text, i + 1)
    while i < len(text) and text[i] != "}":
        end = _skip_string(text, i)
        key = json.loads(text[i:end])
        i = _skip_ws(text, end)
        assert text[i] == ":", f"expected ':' at {i}"
        start = _skip_ws(text, i + 1)
        stop = _skip_value(text, start)
        if key == member:
            return text[start:stop]
        i = _skip_ws(text, stop)
        if text[i] == ",":
            i = _skip_ws(text, i + 1)
    return None


# --- SSE ---------------------------------------------------------------------------------


@dataclass
class SseEvent:
    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SseDecoder:
    """Line-at-a-time SSE decoding (WHATWG rules: `data` lines joined with newlines,
    comments ignored; an event with neither `data` nor `id` dispatches nothing)."""

    def __init__(self) -> None:
        self.data: list[str] = []
        self.fields: dict[str, Any] = {}

    def line(self, line: str) -> SseEvent | None:
        """Feeds one line (without its end); returns the event a blank line completes."""
        if line == "":
            event = None
            if self.data or "id" in self.fields:
                event = SseEvent(data="\n".join(self.data), **self.fields)
            self.data, self.fields = [], {}
            return event
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self.data.append(value)
        elif name == "event":
            self.fields["event"] = value
        elif name == "id":
            self.fields["id"] = value
        elif name == "retry" and value.isdigit():
            self.fields["retry"] = int(value)
        return None


def parse_sse(body: str) -> list[SseEvent]:
    """Splits a complete SSE body into events."""
    decoder = SseDecoder()
    events = []
    for line in body.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        event = decoder.line(line)
        if event is not None:
            events.append(event)
    return events


async def stream_sse(response: httpx2.Response) -> AsyncIterator[SseEvent]:
    """The events of a streamed SSE response, as they arrive."""
    decoder = SseDecoder()
    async for line in response.aiter_lines():
        event = decoder.line(line.rstrip("\r\n"))
        if event is not None:
            yield event


# --- WWW-Authenticate --------------------------------------------------------------------


def parse_bearer_challenge(header: str) -> dict[str, str]:
    """The auth-params of a `Bearer` challenge (RFC 6750 / RFC 9110 §11.6.1): names
    lower-cased, quoted values unescaped, token values as written. Raises if not Bearer."""
    scheme, _, rest = header.strip().partition(" ")
    assert scheme.lower() == "bearer", f"not a Bearer challenge: {header!r}"
    params: dict[str, str] = {}
    i = 0
    while i < len(rest):
        while i < len(rest) and rest[i] in " ,\t":
            i += 1
        if i >= len(rest):
            break
        eq = rest.index("=", i)
        name = rest[i:eq].strip().lower()
        i = eq + 1
        while rest[i] == " ":
            i += 1
        if rest[i] == '"':
            i += 1
            value = []
            while rest[i] != '"':
                if rest[i] == "\\":
                    i += 1
                value.append(rest[i])
                i += 1
            i += 1
            params[name] = "".join(value)
        else:
            end = i
            while end < len(rest) and rest[end] not in ", \t":
                end += 1
            params[name] = rest[i:end]
            i = end
    return params


# --- Raw JSON-RPC session ----------------------------------------------------------------


@dataclass
class Reply:
    """One HTTP exchange: status, headers, the body, and the JSON-RPC answer found in it."""

    status: int
    headers: httpx2.Headers
    body: str
    message_text: str | None = None  # the raw JSON text of the answer for our id
    events: list[SseEvent] = field(default_factory=list)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    @property
    def message(self) -> dict[str, Any] | None:
        return json.loads(self.message_text) if self.message_text is not None else None

    @property
    def result_bytes(self) -> bytes:
        """The `result` member's value exactly as it was on the wire."""
        assert self.message_text is not None, f"no JSON-RPC answer: HTTP {self.status} {self.body[:300]!r}"
        span = json_member_span(self.message_text, "result")
        assert span is not None, f"not a result: {self.message_text[:300]}"
        return span.encode()

    @property
    def result(self) -> Any:
        message = self.message
        assert message is not None and "result" in message, f"not a result: HTTP {self.status} {self.body[:300]!r}"
        return message["result"]

    @property
    def error(self) -> dict[str, Any]:
        message = self.message
        assert message is not None and "error" in message, f"not an error: HTTP {self.status} {self.body[:300]!r}"
        return message["error"]

    def notifications(self) -> list[dict[str, Any]]:
        out = []
        for e in self.events:
            m = _json_or_none(e.data) if e.data else None
            if isinstance(m, dict) and "method" in m and "id" not in m:
                out.append(m)
        return out


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def find_answer(body: str, content_type: str, request_id: Any) -> tuple[str | None, list[SseEvent]]:
    """The raw JSON text of the answer to `request_id` in a JSON or SSE body, or None when
    there is none (no body, not JSON, or an SSE stream without it)."""
    if content_type == "application/json":
        text = body.strip()
        return (text if isinstance(_json_or_none(text), dict) else None), []
    if content_type == "text/event-stream":
        events = parse_sse(body)
        for e in events:
            m = _json_or_none(e.data) if e.data else None
            if isinstance(m, dict) and m.get("id") == request_id and ("result" in m or "error" in m):
                return e.data, events
        return None, events
    return None, []


class RawSession:
    """A JSON-RPC client over raw HTTP: one POST per message, answers read in full.

    `headers` go on every request (e.g. Authorization). After `initialize` the session id
    and protocol version are sent as the specification requires.
    """

    def __init__(self, client: httpx2.AsyncClient, url: str, headers: dict[str, str] | None = None) -> None:
        self.client = client
        self.url = url
        self.extra = dict(headers or {})
        self.session_id: str | None = None
        self.next_id = 1

    def headers(self) -> dict[str, str]:
        h = {"accept": ACCEPT, "content-type": "application/json", **self.extra}
        if self.session_id:
            h["mcp-session-id"] = self.session_id
            h["mcp-protocol-version"] = PROTOCOL
        return h

    async def post(self, message: dict[str, Any]) -> Reply:
        response = await self.client.post(self.url, content=json.dumps(message), headers=self.headers())
        body = response.text
        reply = Reply(status=response.status_code, headers=response.headers, body=body)
        if "id" in message:
            reply.message_text, reply.events = find_answer(body, reply.content_type, message["id"])
        return reply

    async def request(self, method: str, params: dict[str, Any] | None = None, *, request_id: Any = None) -> Reply:
        if request_id is None:
            request_id = self.next_id
            self.next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": method}
        if params is not None:
            message["params"] = params
        return await self.post(message)

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> Reply:
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        return await self.post(message)

    async def initialize(self, *, expect_ok: bool = True) -> Reply:
        reply = await self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL,
                "capabilities": {"elicitation": {}},
                "clientInfo": {"name": "raw-test", "version": "0"},
            },
        )
        if expect_ok:
            assert reply.status == 200, f"initialize: HTTP {reply.status} {reply.body[:300]!r}"
            self.session_id = reply.headers.get("mcp-session-id")
            assert self.session_id, "initialize must answer with an Mcp-Session-Id"
            assert reply.result["protocolVersion"] == PROTOCOL
            done = await self.notify("notifications/initialized")
            assert done.status == 202, f"notifications/initialized: HTTP {done.status}"
        return reply

    async def delete(self) -> httpx2.Response:
        return await self.client.delete(self.url, headers=self.headers())
