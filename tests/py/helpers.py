"""Client plumbing shared by the scenario tests: an SDK session over Streamable HTTP
that also records what the transport saw on the wire (session id, GET stream)."""

from __future__ import annotations

import socket
import uuid

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client

PROTOCOL = "2025-11-25"
TIMEOUT_S = 10

@dataclass
class Wire:
    """What the HTTP client saw: the session id and whether the GET stream is open."""

    session_id: str | None = None
    get_open: anyio.Event = field(default_factory=anyio.Event)
    statuses: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class Collector:
    """A message_handler that keeps every server notification, with a wakeup per arrival."""

    items: list[Any] = field(default_factory=list)
    _changed: anyio.Event = field(default_factory=anyio.Event)

    async def __call__(self, message: Any) -> None:
        self.items.append(message)
        self._changed.set()
        self._changed = anyio.Event()

    def of(self, kind: type) -> list[Any]:
        return [m for m in self.items if isinstance(m, kind)]

    async def wait_for(self, kind: type, count: int = 1) -> list[Any]:
        while len(self.of(kind)) < count:
            await self._changed.wait()
        return self.of(kind)


def http_client(wire: Wire, headers: dict[str, str] | None = None) -> httpx2.AsyncClient:
    async def on_response(response: httpx2.Response) -> None:
        method = response.request.method
        wire.statuses.append((method, response.status_code))
        sid = response.headers.get("mcp-session-id")
        if sid:
            wire.session_id = sid
        ctype = response.headers.get("content-type", "")
        if (
            method == "GET"
            and response.status_code == 200
            and ctype.startswith("text/event-stream")
            and "last-event-id" not in response.request.headers
        ):
            wire.get_open.set()

    return httpx2.AsyncClient(
        headers=headers,
        timeout=httpx2.Timeout(TIMEOUT_S, read=60),
        event_hooks={"response": [on_response]},
    )


@asynccontextmanager
async def connect(
    url: str,
    message_handler: Callable[[Any], Awaitable[None]] | None = None,
    *,
    initialize: bool = True,
    terminate_on_close: bool = True,
    headers: dict[str, str] | None = None,
    wire: Wire | None = None,
) -> AsyncIterator[tuple[ClientSession, Wire, types.InitializeResult | None]]:
    """An SDK ClientSession on `url`, initialized unless told otherwise."""
    wire = wire or Wire()
    async with http_client(wire, headers) as client:
        async with streamable_http_client(url, http_client=client, terminate_on_close=terminate_on_close) as (
            read,
            write,
        ):
            async with ClientSession(read, write, message_handler=message_handler) as session:
                result = None
                if initialize:
                    with anyio.fail_after(TIMEOUT_S):
                        result = await session.initialize()
                yield session, wire, result


def run(fn, *args, timeout_s: float = 20) -> None:
    """Runs an async scenario under a deadline (`timeout_s`) so a hang fails fast."""

    async def main():
        with anyio.fail_after(timeout_s):
            await fn(*args)

    anyio.run(main)


def unique(prefix: str) -> str:
    """`prefix` and 8 random hex digits: a name no other test uses."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def dump(model: Any) -> Any:
    """An SDK model as the JSON the wire carries (aliases, no absent members)."""
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def tool_text(result: types.CallToolResult) -> str:
    """The text of a tool result made of one text block."""
    assert len(result.content) == 1, result
    block = result.content[0]
    assert isinstance(block, types.TextContent), block
    return block.text


def raw_exchange(url: str, request: bytes) -> bytes:
    """Sends `request` (raw bytes) to `url`'s host and port on a fresh connection and reads
    until the response head is in, the peer closes, or 5 s pass."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(request)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
                if b"\r\n\r\n" in out:
                    break
        except TimeoutError:
            pass
        return out
