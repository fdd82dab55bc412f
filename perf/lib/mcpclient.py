"""A small MCP Streamable HTTP client for the perf scripts (Python 3 standard library only).

The load generator reads at most 16 MiB per response, and it does not look inside a list.
This client opens a session (initialize, notifications/initialized) over one keep-alive
HTTP/1.1 connection and reads a `tools/list` answer of any size as it streams in: the body
(Content-Length or chunked) goes through `ItemCounter`, which decodes the `tools` array one
item at a time and drops each item once counted, so the client holds one read and one item
at a time, never the whole answer. At the end the answer minus its items is decoded as JSON,
so the envelope is checked as well (a JSON-RPC result, no `error`, no `nextCursor`).
"""

import codecs
import json
import socket
import time
import urllib.parse

READ_BYTES = 256 * 1024
HEAD_BYTES_MAX = 64 * 1024  # a response head larger than this is refused
SKELETON_BYTES_MAX = 1024 * 1024  # what may come before the array and after it
ITEM_BYTES_MAX = 4 * 1024 * 1024  # one item larger than this is refused
PROTOCOL_VERSION = "2025-11-25"


class McpError(Exception):
    """The peer answered something this client does not accept."""


class ItemCounter:
    """Counts the items of a JSON-RPC list result's array as the body streams in.

    Feed the body with `feed(bytes)`, then call `finish()`; items are decoded one at a time
    (each must be a JSON object) and only counted: `count`, `bytes`, and `names` (the first
    few names, and how many start with each prefix in `prefixes`)."""

    def __init__(self, array="tools", prefixes=()):
        self.marker = f'"{array}":['
        self.array = array
        self.decoder = json.JSONDecoder()
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.state = "head"  # head -> items -> tail
        self.head = ""  # the answer up to and including the array's '['
        self.buf = ""  # undecoded text inside the array
        self.tail = ""  # from the array's ']' to the end
        self.need_comma = False
        self.count = 0
        self.bytes = 0
        self.first_names = []
        self.prefixes = {p: 0 for p in prefixes}

    def feed(self, data):
        self.bytes += len(data)
        text = self.utf8.decode(data)
        if self.state == "head":
            self.head += text
            at = self.head.find(self.marker)
            if at < 0:
                if len(self.head) > SKELETON_BYTES_MAX:
                    raise McpError(f"no {self.marker} in the first {SKELETON_BYTES_MAX} bytes")
                return
            self.buf = self.head[at + len(self.marker):]
            self.head = self.head[: at + len(self.marker)]
            self.state = "items"
        elif self.state == "items":
            self.buf += text
        else:
            self.tail += text
            if len(self.tail) > SKELETON_BYTES_MAX:
                raise McpError(f"more than {SKELETON_BYTES_MAX} bytes after the {self.array} array")
            return
        self._items()

    def _items(self):
        buf, pos, n = self.buf, 0, len(self.buf)
        while True:
            while pos < n and buf[pos] in " \t\r\n":
                pos += 1
            if pos >= n:
                break
            c = buf[pos]
            if c == "]":
                self.state = "tail"
                self.tail = buf[pos:]
                self.buf = ""
                return
            if self.need_comma:
                if c != ",":
                    raise McpError(f"expected ',' or ']' after item {self.count}, found {c!r}")
                pos += 1
                self.need_comma = False
                continue
            try:
                item, end = self.decoder.raw_decode(buf, pos)
            except json.JSONDecodeError:
                # Most likely cut by the read; an item never ends before its closing brace.
                if n - pos > ITEM_BYTES_MAX:
                    raise McpError(f"item {self.count} is not JSON within {ITEM_BYTES_MAX} bytes")
                break
            if not isinstance(item, dict):
                raise McpError(f"item {self.count} is not an object")
            self._count(item)
            pos = end
            self.need_comma = True
        self.buf = buf[pos:]

    def _count(self, item):
        name = item.get("name")
        if not isinstance(name, str):
            raise McpError(f"item {self.count} has no string name")
        if len(self.first_names) < 3:
            self.first_names.append(name)
        for p in self.prefixes:
            if name.startswith(p):
                self.prefixes[p] += 1
        self.count += 1

    def finish(self):
        """Checks the answer's envelope; returns the JSON-RPC result without its items."""
        rest = self.utf8.decode(b"", final=True)
        if rest:
            self.feed(rest.encode())
        if self.state == "head":
            try:
                answer = json.loads(self.head)
            except json.JSONDecodeError:
                raise McpError(f"answer without a {self.marker} array: {self.head[:300]!r}")
            raise McpError(f"answer without a {self.array} array: {json.dumps(answer)[:300]}")
        if self.state != "tail":
            raise McpError(f"answer ended inside the array after {self.count} items")
        answer = json.loads(self.head + self.tail)  # the items taken out: `[]`
        if "error" in answer or "result" not in answer:
            raise McpError(f"not a result: {json.dumps(answer)[:300]}")
        result = answer["result"]
        if result.get(self.array) != []:
            raise McpError(f"the {self.array} array is not the result's")
        if result.get("nextCursor") is not None:
            raise McpError(f"the answer has a nextCursor ({result['nextCursor']!r}): one page only")
        return result


class McpClient:
    """One keep-alive HTTP/1.1 connection and one MCP session on it."""

    def __init__(self, url, timeout=120.0):
        u = urllib.parse.urlsplit(url)
        if u.scheme != "http" or not u.hostname:
            raise McpError(f"need an http:// url, got {url}")
        self.host = u.netloc
        self.path = u.path or "/"
        self.sock = socket.create_connection((u.hostname, u.port or 80), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rbuf = b""
        self.session = None
        self.next_id = 1

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    # ------------------------------------------------------------------ MCP

    def initialize(self):
        """initialize + notifications/initialized; returns the initialize result."""
        status, headers, body = self.request("initialize", {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "mcpyard-perf", "version": "0"},
        })
        answer = self._json_answer(status, headers, body, "initialize")
        self.session = headers.get("mcp-session-id")
        if not self.session:
            raise McpError("initialize answered without mcp-session-id")
        status, headers = self._send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        body = b"".join(self._body(headers))
        if status != 202:
            raise McpError(f"notifications/initialized: HTTP {status} {body[:200]!r}")
        return answer["result"]

    def list_tools(self, prefixes=()):
        """One tools/list, read as it streams; returns a dict with the count and timings."""
        t0 = time.monotonic()
        status, headers = self._send(self._call("tools/list", {}))
        t_head = time.monotonic()
        if status != 200:
            body = b"".join(self._body(headers))
            raise McpError(f"tools/list: HTTP {status} {body[:300]!r}")
        ctype = headers.get("content-type", "")
        if not ctype.startswith("application/json"):
            raise McpError(f"tools/list answered {ctype!r}; this client reads application/json")
        counter = ItemCounter("tools", prefixes)
        t_first = None
        for chunk in self._body(headers):
            if t_first is None:
                t_first = time.monotonic()
            counter.feed(chunk)
        t_end = time.monotonic()
        counter.finish()
        return {
            "items": counter.count, "bytes": counter.bytes, "first_names": counter.first_names,
            "prefixes": counter.prefixes, "seconds": t_end - t0,
            "head_seconds": t_head - t0, "first_byte_seconds": (t_first or t_end) - t0,
            "chunked": headers.get("transfer-encoding", "").lower() == "chunked",
        }

    def request(self, method, params):
        status, headers = self._send(self._call(method, params))
        return status, headers, b"".join(self._body(headers))

    def _call(self, method, params):
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.next_id += 1
        return msg

    def _json_answer(self, status, headers, body, what):
        if status != 200:
            raise McpError(f"{what}: HTTP {status} {body[:300]!r}")
        ctype = headers.get("content-type", "")
        if ctype.startswith("text/event-stream"):
            # One event carries the answer; its data lines are joined with newlines.
            data = [ln[5:].lstrip(" ") for ln in body.decode().splitlines() if ln.startswith("data:")]
            body = "\n".join(data).encode()
        answer = json.loads(body)
        if "result" not in answer:
            raise McpError(f"{what}: {body[:300]!r}")
        return answer

    # ------------------------------------------------------------------ HTTP/1.1

    def _send(self, msg):
        body = json.dumps(msg).encode()
        head = [
            f"POST {self.path} HTTP/1.1", f"Host: {self.host}",
            "Content-Type: application/json", "Accept: application/json, text/event-stream",
            f"Content-Length: {len(body)}",
        ]
        if self.session:
            head += [f"Mcp-Session-Id: {self.session}", f"Mcp-Protocol-Version: {PROTOCOL_VERSION}"]
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return self._head()

    def _fill(self):
        data = self.sock.recv(READ_BYTES)
        if not data:
            raise McpError("connection closed by the peer")
        self.rbuf += data

    def _head(self):
        while b"\r\n\r\n" not in self.rbuf:
            if len(self.rbuf) > HEAD_BYTES_MAX:
                raise McpError("response head too large")
            self._fill()
        head, self.rbuf = self.rbuf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise McpError(f"not an HTTP/1.x status line: {lines[0]!r}")
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        return int(parts[1]), headers

    def _body(self, headers):
        """Yields the body's bytes as they arrive (Content-Length or chunked)."""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            yield from self._chunked()
            return
        left = int(headers.get("content-length", "0"))
        while left > 0:
            if not self.rbuf:
                self._fill()
            part, self.rbuf = self.rbuf[:left], self.rbuf[left:]
            left -= len(part)
            yield part

    def _chunked(self):
        while True:
            while b"\r\n" not in self.rbuf:
                if len(self.rbuf) > 1024:
                    raise McpError("chunk size line too long")
                self._fill()
            line, self.rbuf = self.rbuf.split(b"\r\n", 1)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while b"\r\n" not in self.rbuf:  # no trailers expected: the final CRLF
                    self._fill()
                trailer, self.rbuf = self.rbuf.split(b"\r\n", 1)
                if trailer:
                    raise McpError(f"unexpected trailer {trailer[:100]!r}")
                return
            while size > 0:
                if not self.rbuf:
                    self._fill()
                part, self.rbuf = self.rbuf[:size], self.rbuf[size:]
                size -= len(part)
                yield part
            while len(self.rbuf) < 2:
                self._fill()
            if self.rbuf[:2] != b"\r\n":
                raise McpError("chunk not followed by CRLF")
            self.rbuf = self.rbuf[2:]


def list_once(url, prefixes=()):
    """A fresh connection and session, one tools/list; returns list_tools' dict."""
    c = McpClient(url)
    try:
        c.initialize()
        return c.list_tools(prefixes)
    finally:
        c.close()
