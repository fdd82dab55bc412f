"""Processes the gateway tests run: the SDK upstream (tests/py/upstreams/sdk_upstream.py)
and mcpyard configured as a gateway in front of an upstream. Both bind port 0 and announce
their address on stdout; both are stopped with SIGTERM, and mcpyard must then exit 0."""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("MCPYARD_BIN", ROOT / "target" / "release" / "mcpyard")).resolve()
UPSTREAM_SCRIPT = Path(__file__).resolve().parent / "upstreams" / "sdk_upstream.py"
PR_SET_PDEATHSIG = 1
STARTUP_TIMEOUT_S = 15.0
SHUTDOWN_TIMEOUT_S = 15.0

# The gateway matrix: every worker count and I/O backend, as the demo-exit tests use.
ALL_RUNTIMES = [(w, io) for w in (1, 2) for io in ("uring", "epoll")]
# A trimmed matrix where the runtime matters less than the behaviour under test.
SOME_RUNTIMES = [(2, "uring"), (1, "epoll")]

UPSTREAM_MODES = ["json", "sse", "sse-resumable"]


def runtime_id(runtime: tuple[int, str]) -> str:
    return f"mcpyard-w{runtime[0]}-{runtime[1]}"


def route_params(modes: list[str], runtimes_for) -> list:
    """pytest params for the `route` fixture: (mode, runtime or None), ids `direct-<mode>`
    and `mcpyard-w<N>-<io>-<mode>`; the mcpyard ones carry the `mcpyard` mark."""
    params = []
    for mode in modes:
        params.append(pytest.param((mode, None), id=f"direct-{mode}"))
        for runtime in runtimes_for(mode):
            params.append(
                pytest.param((mode, runtime), id=f"{runtime_id(runtime)}-{mode}", marks=pytest.mark.mcpyard)
            )
    return params


def tls_route_params(modes: list[str]) -> list:
    """pytest params for the `route` fixture over TLS on both edges (conftest.tls_route): per
    mode, mcpyard trusting the upstream through `tls.ca` (1 worker, io_uring) and through the
    platform roots (2 workers, epoll); ids `tls-ca-…` and `tls-env-…`."""
    params = []
    for mode in modes:
        for runtime, trust in (((1, "uring"), "ca"), ((2, "epoll"), "env")):
            params.append(
                pytest.param(
                    (mode, runtime, trust), id=f"tls-{trust}-{runtime_id(runtime)}-{mode}", marks=pytest.mark.mcpyard
                )
            )
    return params


def gateway_config(
    upstream_url: str,
    workers: int,
    io: str,
    *,
    authorization: str | None = None,
    response_timeout: str = "3s",
    connect_timeout: str = "2s",
    north_tls: tuple[Path, Path] | None = None,
    upstream_ca: Path | None = None,
) -> str:
    """mcpyard as a single-upstream gateway: `north` (server) exits straight to `up` (client).
    `authorization` is the YAML value of the client's `authorization` key, or None;
    `north_tls` = (cert, key) serves agents over TLS; `upstream_ca` is the client's
    `tls.ca` (an https upstream without it trusts the platform's roots)."""
    auth = f", authorization: {authorization}" if authorization is not None else ""
    north = f", tls: {{ cert: {north_tls[0]}, key: {north_tls[1]} }}" if north_tls else ""
    ca = f", tls: {{ ca: {upstream_ca} }}" if upstream_ca else ""
    return (
        f"runtime: {{ workers: {workers}, io: {io} }}\n"
        "telemetry: { metrics: 127.0.0.1:0 }\n"
        "bindings:\n"
        f"  north: {{ kind: server, listen: 127.0.0.1:0, path: /mcp, exit: up{north} }}\n"
        f'  up: {{ kind: client, server: "{upstream_url}", response_timeout: {response_timeout}, '
        f"connect_timeout: {connect_timeout}{auth}{ca} }}\n"
    )


try:
    # Looked up here, in the parent: between fork and exec only this plain C call runs.
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def _die_with_parent() -> None:
    """In the child: get SIGKILL if the test run dies without its teardown (Linux)."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))


def _forward_lines(stream: IO[str], lines: queue.Queue[str | None]) -> None:
    """Keeps draining a child's stdout (so the pipe never fills), one line at a time."""
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


def _await_line(proc: subprocess.Popen[str], lines: queue.Queue[str | None], prefix: str, what: str, log: Path) -> str:
    seen: list[str] = []
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"{what}: no `{prefix}` line within {STARTUP_TIMEOUT_S}s: {seen}")
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            continue
        if line is None:
            code = proc.wait()
            raise AssertionError(f"{what} exited ({code}) before listening: stdout={seen} stderr={log.read_text()[-4000:]}")
        seen.append(line)
        if line.startswith(prefix):
            return line[len(prefix) :].strip()


@dataclass
class Child:
    """A started child process, its announced address, and where its stderr goes."""

    proc: subprocess.Popen[str]
    address: str
    log: Path
    # The child's stdout lines not read yet (a reader thread keeps filling it).
    lines: queue.Queue[str | None] | None = None

    def await_line(self, prefix: str) -> str:
        """The rest of the next stdout line that starts with `prefix` (lines before it are
        skipped), within the startup timeout."""
        assert self.lines is not None, "a child started by _spawn"
        return _await_line(self.proc, self.lines, prefix, "child", self.log)

    def metrics_port(self) -> int:
        """mcpyard's metrics port, as it announced it (`metrics: 127.0.0.1:0` in the config:
        the port is the kernel's choice, so no other process can take it first)."""
        return int(self.await_line("listening metrics ").rsplit(":", 1)[1])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


def _spawn(argv: list[str], prefix: str, what: str, workdir: Path, env: dict[str, str] | None) -> Child:
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{what}.stderr.log"
    stderr = open(log, "w")
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=workdir,
        env={**os.environ, **(env or {})},
        preexec_fn=_die_with_parent,
    )
    stderr.close()
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_forward_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        address = _await_line(proc, lines, prefix, what, log)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return Child(proc=proc, address=address, log=log, lines=lines)


def start_upstream(
    mode: str,
    workdir: Path,
    *,
    name: str | None = None,
    token: str | None = None,
    port: int = 0,
    list_delay_s: float = 0.0,
    tls: tuple[Path, Path] | None = None,
) -> Child:
    """Starts the SDK upstream in `mode` (named `name`, needing `Bearer <token>` when a token
    is given, on `port` (0: any), answering lists after `list_delay_s`, over https with
    `tls` = (cert, key) files); `address` is its MCP endpoint URL."""
    argv = [sys.executable, str(UPSTREAM_SCRIPT), "--mode", mode, "--port", str(port)]
    if tls is not None:
        argv += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
    if name is not None:
        argv += ["--name", name]
    if token is not None:
        argv += ["--token", token]
    if list_delay_s:
        argv += ["--list-delay", str(list_delay_s)]
    return _spawn(argv, "listening ", f"upstream-{name or mode}", workdir, None)


EVERYTHING = ROOT / "tests" / "js" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_everything(workdir: Path) -> Child:
    """Starts the reference `@modelcontextprotocol/server-everything` (Streamable HTTP) from
    tests/js/node_modules (tests/py/run.sh installs it); `address` is its MCP endpoint URL.
    It takes its port from PORT only, so a free one is picked first (once more if that one
    was taken meanwhile)."""
    if not EVERYTHING.exists():
        raise AssertionError(f"{EVERYTHING} is missing: run `npm ci` in tests/js (tests/py/run.sh does)")
    for attempt in range(2):
        port = free_port()
        try:
            # It announces itself on stderr: merged into stdout, where _spawn waits.
            child = _spawn(
                ["sh", "-c", 'exec node "$0" streamableHttp 2>&1', str(EVERYTHING)],
                "MCP Streamable HTTP Server listening on port ",
                f"everything-{attempt}",
                workdir,
                {"PORT": str(port)},
            )
        except AssertionError:
            if attempt == 1:
                raise
            continue
        child.address = f"http://127.0.0.1:{port}/mcp"
        # Express calls its listen callback on a bind error too (the line is printed, then
        # it exits): only a GET without a session answered 400 proves it serves there.
        if _answers_400(child.address) and child.alive():
            return child
        stop_upstream(child)
        if attempt == 1:
            raise AssertionError(f"server-everything did not serve on port {port}:\n{child.stderr()[-3000:]}")
    raise AssertionError("unreachable")


def _answers_400(url: str) -> bool:
    import urllib.error
    import urllib.request

    try:
        urllib.request.urlopen(url, timeout=STARTUP_TIMEOUT_S)
    except urllib.error.HTTPError as e:
        return e.code == 400
    except OSError:
        return False
    return False


def stop_upstream(child: Child) -> None:
    if child.alive():
        child.proc.terminate()
        try:
            child.proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()


def start_mcpyard(config_text: str, workdir: Path, env: dict[str, str] | None = None, *, scheme: str = "http") -> Child:
    """Starts mcpyard with `config_text`; `address` is the north endpoint URL (`scheme`:
    https when north serves TLS)."""
    if not BINARY.exists():
        raise AssertionError(f"{BINARY} is missing: run `cargo build --release` (tests/py/run.sh does) or set MCPYARD_BIN")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "mcpyard.yaml"
    config.write_text(config_text)
    child = _spawn([str(BINARY), "--config", str(config)], "listening north ", "mcpyard", workdir, env)
    child.address = f"{scheme}://{child.address}/mcp"
    return child


def stop_mcpyard(child: Child) -> None:
    """SIGTERM; asserts mcpyard was still running and exits 0 within the shutdown timeout."""
    still_running = child.alive()
    if still_running:
        child.proc.send_signal(signal.SIGTERM)
    try:
        code: int | str = child.proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        child.proc.kill()
        child.proc.wait()
        code = "hung after SIGTERM"
    log = child.stderr()
    assert still_running, f"mcpyard died during the test: exit {child.proc.returncode}\n{log[-4000:]}"
    assert code == 0, f"mcpyard exit after SIGTERM: {code}\n{log[-4000:]}"


class Redis:
    """Debian's `redis-server` on a loopback port chosen at run time, with no persistence
    (`--save "" --appendonly no`) and its files in `workdir`; `stop` and `start` again
    (same port, empty) stand for a crash and a restart. With `tls` = (cert, key, ca) it
    serves TLS only, and with `client` = (cert, key) as well it asks every client for a
    certificate `ca` signed (and uses that one itself); with `password` it requires AUTH.
    tests/py/run.sh installs it."""

    def __init__(
        self,
        workdir: Path,
        *,
        tls: tuple[Path, Path, Path] | None = None,
        client: tuple[Path, Path] | None = None,
        password: str | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.tls = tls
        self.client = client
        self.password = password
        self.proc: subprocess.Popen[bytes] | None = None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import shutil

        if shutil.which("redis-server") is None:
            raise AssertionError("redis-server is missing: tests/py/run.sh installs it (apt-get install redis-server)")
        argv = ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.workdir)]
        if self.tls:
            cert, key, ca = self.tls
            argv += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert), "--tls-key-file", str(key)]
            argv += ["--tls-ca-cert-file", str(ca), "--tls-auth-clients", "yes" if self.client else "no"]
        else:
            argv += ["--port", str(self.port)]
        if self.password:
            argv += ["--requirepass", self.password]
        log = open(self.workdir / "redis.log", "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=log, preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited ({self.proc.returncode}): {(self.workdir / 'redis.log').read_text()[-2000:]}")
            try:
                reply = self.command("PING")
                if reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH"):
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise AssertionError(f"redis-server did not answer on port {self.port}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def command(self, *args: str, auth: bool = False, db: int | None = None) -> bytes:
        """One command (after AUTH and SELECT `db` when asked) on a connection of the test's
        own; the raw reply to the command."""
        import socket
        import ssl

        def encode(*parts: str) -> bytes:
            return f"*{len(parts)}\r\n".encode() + b"".join(f"${len(a.encode())}\r\n{a}\r\n".encode() for a in parts)

        before = []
        if auth and self.password:
            before.append(encode("AUTH", self.password))
        if db is not None:
            before.append(encode("SELECT", str(db)))
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        with raw:
            conn = raw
            if self.tls:
                context = ssl.create_default_context(cafile=str(self.tls[2]))
                if self.client:
                    context.load_cert_chain(str(self.client[0]), str(self.client[1]))
                conn = context.wrap_socket(raw, server_hostname="127.0.0.1")
            with conn:
                for message in before:
                    conn.sendall(message)
                    conn.recv(1024)
                conn.sendall(encode(*args))
                return conn.recv(65536)
