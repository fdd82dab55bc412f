"""Fixtures for the Python tests against the release binary.

- `gateway`: mcpyard with the embedded demo exit, once per test, for every combination of
  worker count and I/O backend.
- `route`: where a gateway test's client connects: `direct` to a real SDK upstream, or
  through mcpyard (`server -> client`) in front of that same upstream.

Process handling (port 0, the `listening` line, SIGTERM and exit 0) is in harness.py."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

import harness
import tlscerts

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


@pytest.fixture(params=harness.ALL_RUNTIMES, ids=lambda p: f"w{p[0]}-{p[1]}")
def gateway(tmp_path: Path, request):
    workers, io = request.param
    child = harness.start_mcpyard(CONFIG.format(workers=workers, io=io), tmp_path)
    yield Gateway(url=child.address, workers=workers, io=io, proc=child.proc)
    harness.stop_mcpyard(child)


# --- Gateway tests: real upstreams, mcpyard as `server -> client` in front of them ---------
#
# Test ids say where the client under test talks: `direct` (to the upstream itself) or
# `mcpyard-w<workers>-<io>` (through mcpyard in front of that same upstream). Until the
# client binding lands, run only the first kind with `-k direct` (or `-m "not mcpyard"`).


def pytest_configure(config):
    config.addinivalue_line("markers", "mcpyard: the test runs through mcpyard's client binding")


class UpstreamPool:
    """One SDK upstream per mode, started on first use and shared by the whole run (each
    start costs most of a second); tests keep their state apart with unique names."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.children: dict[str, harness.Child] = {}

    def get(self, mode: str, tls: tlscerts.Leaf | None = None) -> harness.Child:
        key = f"{mode}+tls" if tls else mode
        child = self.children.get(key)
        if child is not None and not child.alive():
            raise AssertionError(f"upstream {key} died (exit {child.proc.returncode}):\n{child.stderr()[-4000:]}")
        if child is None:
            pair = (tls.cert, tls.key) if tls else None
            child = self.children[key] = harness.start_upstream(mode, self.workdir / key, tls=pair)
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
def redis(tmp_path):
    """Debian's redis-server on a port chosen at run time, for one test (harness.Redis)."""
    server = harness.Redis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def tls_material(tmp_path_factory) -> tlscerts.Material:
    """A test CA and the certificates it signs (tlscerts.py), made once per run."""
    return tlscerts.make(tmp_path_factory.mktemp("tls"))


@pytest.fixture
def route(request, upstream_pool, tmp_path, monkeypatch):
    mode, runtime, *tls = request.param
    if tls:
        yield from tls_route(request, upstream_pool, tmp_path, monkeypatch, mode, runtime, tls[0])
        return
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


def tls_route(request, upstream_pool, tmp_path, monkeypatch, mode, runtime, trust):
    """The same scenario over TLS on both edges: the test's client talks https to mcpyard
    (`server` with tls), mcpyard talks https to the SDK upstream served over TLS. The test
    process trusts the test CA (SSL_CERT_FILE, which httpx reads); mcpyard trusts it through
    the client's `tls.ca` (`trust` = "ca") or, with no `ca`, through the platform roots, which
    SSL_CERT_FILE replaces for it too (`trust` = "env")."""
    material = request.getfixturevalue("tls_material")
    monkeypatch.setenv("SSL_CERT_FILE", str(material.ca.pem))
    upstream = upstream_pool.get(mode, material.server)
    workers, io = runtime
    config = harness.gateway_config(
        upstream.address,
        workers,
        io,
        north_tls=(material.server.cert, material.server.key),
        upstream_ca=material.ca.pem if trust == "ca" else None,
    )
    env = {"SSL_CERT_FILE": str(material.ca.pem)} if trust == "env" else None
    gateway = harness.start_mcpyard(config, tmp_path, env, scheme="https")
    try:
        yield Route(url=gateway.address, upstream_url=upstream.address, mode=mode, via=f"tls-{trust}")
    finally:
        harness.stop_mcpyard(gateway)
    assert upstream.alive(), f"the upstream died during the test:\n{upstream.stderr()[-4000:]}"
