"""Starts the release gateway with the demo exit, once per test, for every
combination of worker count and I/O backend."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("MCPYARD_BIN", ROOT / "target" / "release" / "mcpyard"))
STARTUP_TIMEOUT_S = 15.0
SHUTDOWN_TIMEOUT_S = 15.0

CONFIG = """\
runtime: {{ workers: {workers}, io: {io} }}
telemetry: {{ metrics: 127.0.0.1:0 }}
bindings:
  north: {{ kind: server, listen: 127.0.0.1:0, path: /mcp, exit: demo }}
  demo: {{ kind: demo, progress_interval: 20ms }}
"""


@dataclass
class Gateway:
    url: str
    workers: int
    io: str
    proc: subprocess.Popen[str]


def _read_lines(stream, lines: queue.Queue[str | None]) -> None:
    """Forwards the gateway's stdout lines (keeps draining it so the pipe never fills)."""
    for line in stream:
        lines.put(line.rstrip("\n"))
    lines.put(None)


@pytest.fixture(
    params=[(w, io) for w in (1, 2) for io in ("uring", "epoll")],
    ids=lambda p: f"w{p[0]}-{p[1]}",
)
def gateway(request, tmp_path: Path):
    workers, io = request.param
    if not BINARY.exists():
        pytest.fail(f"{BINARY} is missing: run `cargo build --release` (tests/py/run.sh does)")
    config = tmp_path / "mcpyard.yaml"
    config.write_text(CONFIG.format(workers=workers, io=io))
    stderr = open(tmp_path / "stderr.log", "w+")
    proc = subprocess.Popen(
        [str(BINARY), "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        cwd=tmp_path,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    reader = threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True)
    reader.start()

    url = None
    seen: list[str] = []
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    try:
        while url is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no `listening north` line within {STARTUP_TIMEOUT_S}s: {seen}")
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                stderr.seek(0)
                raise AssertionError(
                    f"gateway exited ({proc.wait()}) before listening: stdout={seen} stderr={stderr.read()}"
                )
            seen.append(line)
            if line.startswith("listening north "):
                addr = line.split()[-1]
                url = f"http://{addr}/mcp"
    except BaseException:
        proc.kill()
        proc.wait()
        stderr.close()
        raise

    yield Gateway(url=url, workers=workers, io=io, proc=proc)

    still_running = proc.poll() is None
    if still_running:
        proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        code = "hung after SIGTERM"
    stderr.seek(0)
    log = stderr.read()
    stderr.close()
    assert still_running, f"gateway died during the test: exit {proc.returncode}\n{log}"
    assert code == 0, f"gateway exit after SIGTERM: {code}\n{log[-4000:]}"


# --- Gateway tests: real upstreams, mcpyard as `server -> client` in front of them ---------
#
# Test ids say where the client under test talks: `direct` (to the upstream itself) or
# `mcpyard-w<workers>-<io>` (through mcpyard in front of that same upstream). Until the
# client binding lands, run only the first kind with `-k direct` (or `-m "not mcpyard"`).

import harness  # noqa: E402


def pytest_configure(config):
    config.addinivalue_line("markers", "mcpyard: the test runs through mcpyard's client binding")


class UpstreamPool:
    """One SDK upstream per mode, started on first use and shared by the whole run (each
    start costs most of a second); tests keep their state apart with unique names."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.children: dict[str, harness.Child] = {}

    def get(self, mode: str) -> harness.Child:
        child = self.children.get(mode)
        if child is not None and not child.alive():
            raise AssertionError(f"upstream {mode} died (exit {child.proc.returncode}):\n{child.stderr()[-4000:]}")
        if child is None:
            child = self.children[mode] = harness.start_upstream(mode, self.workdir / mode)
        return child

    def close(self) -> None:
        for child in self.children.values():
            harness.stop_upstream(child)


@pytest.fixture(scope="session")
def upstream_pool(tmp_path_factory):
    pool = UpstreamPool(tmp_path_factory.mktemp("upstreams"))
    yield pool
    pool.close()


@dataclass
class Route:
    """Where the client under test connects (`url`), and the upstream behind it."""

    url: str
    upstream_url: str
    mode: str
    via: str

    @property
    def through_gateway(self) -> bool:
        return self.via != "direct"


@pytest.fixture
def route(request, upstream_pool, tmp_path):
    mode, runtime = request.param
    upstream = upstream_pool.get(mode)
    if runtime is None:
        yield Route(url=upstream.address, upstream_url=upstream.address, mode=mode, via="direct")
    else:
        workers, io = runtime
        gateway = harness.start_mcpyard(harness.gateway_config(upstream.address, workers, io), tmp_path)
        try:
            yield Route(url=gateway.address, upstream_url=upstream.address, mode=mode, via=harness.runtime_id(runtime))
        finally:
            harness.stop_mcpyard(gateway)
    assert upstream.alive(), f"the upstream died during the test:\n{upstream.stderr()[-4000:]}"
