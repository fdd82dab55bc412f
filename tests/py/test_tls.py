"""TLS at mcpyard's edges beyond the happy path (which test_gateway_client.py runs over TLS
on both edges): upstream certificates that must be refused, hostile TLS input on the
agent-facing port, and configurations that must not start.

Certificates are made at test time (tlscerts.py): a CA that mcpyard is told to trust, leaves
it signed (for the wrong name, expired), and a leaf signed by a CA nobody trusts."""

from __future__ import annotations

import re
import signal
import socket
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import anyio
import httpx2
import pytest

import harness
from helpers import connect, run, tool_text
from rawmcp import RawSession

RUNTIMES = [(1, "uring"), (1, "epoll")]
INTERNAL_ERROR = -32603
TIMEOUT_S = 10


def runtime_ids(runtime: tuple[int, str]) -> str:
    return harness.runtime_id(runtime)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=TIMEOUT_S) as r:
        return r.read().decode()


def handshakes(text: str, side: str, result: str) -> int:
    m = re.search(rf'^mcpyard_tls_handshakes_total{{side="{side}",result="{result}"}} (\d+)$', text, re.M)
    return int(m.group(1)) if m else 0


# --- upstream certificates that must be refused ---------------------------------------------

# (which leaf the upstream serves, what the agent's error and mcpyard's log line must say,
# the metrics reason)
REFUSALS = {
    "wrong-name": ("wrong_name", "not valid for name", "certificate_name"),
    "expired": ("expired", "expired", "certificate_expired"),
    "unknown-ca": ("untrusted", "UnknownIssuer", "certificate_unknown_issuer"),
}


@pytest.fixture(scope="module")
def refused_upstreams(tls_material, tmp_path_factory):
    work = tmp_path_factory.mktemp("tls-refused")
    children = {}
    for case, (leaf, _, _) in REFUSALS.items():
        cert = getattr(tls_material, leaf)
        children[case] = harness.start_upstream("json", work / case, tls=(cert.cert, cert.key))
    yield children
    for child in children.values():
        harness.stop_upstream(child)


@pytest.mark.mcpyard
@pytest.mark.parametrize("runtime", RUNTIMES, ids=runtime_ids)
@pytest.mark.parametrize("case", list(REFUSALS))
def test_an_upstream_certificate_that_must_not_be_trusted_is_refused(
    case, runtime, refused_upstreams, tls_material, tmp_path
):
    _, reason, label = REFUSALS[case]
    upstream = refused_upstreams[case]
    config = harness.gateway_config(upstream.address, *runtime, upstream_ca=tls_material.ca.pem)
    gateway = harness.start_mcpyard(config, tmp_path)
    metrics_port = gateway.metrics_port()
    try:

        async def scenario():
            async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
                reply = await RawSession(client, gateway.address).initialize(expect_ok=False)
                assert reply.status == 200, reply.body
                error = reply.message["error"]
                assert error["code"] == INTERNAL_ERROR, error
                assert error["message"].startswith("Upstream TLS handshake failed: "), error
                assert reason in error["message"], error

        run(scenario)
        text = scrape(metrics_port)
        assert handshakes(text, "client", label) >= 1, text
        assert handshakes(text, "client", "ok") == 0, text
    finally:
        harness.stop_mcpyard(gateway)
    port = upstream.address.split(":")[2].split("/")[0]
    lines = [l for l in gateway.stderr().splitlines() if f"TLS handshake with 127.0.0.1:{port}" in l]
    assert lines and reason in lines[0], gateway.stderr()


# --- hostile input on the agent-facing TLS port ----------------------------------------------


def demo_over_tls(material, runtime, metrics_port: int) -> str:
    workers, io = runtime
    return (
        f"runtime: {{ workers: {workers}, io: {io} }}\n"
        f"telemetry: {{ metrics: 127.0.0.1:{metrics_port} }}\n"
        "bindings:\n"
        "  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: demo, "
        f"tls: {{ cert: {material.server.cert}, key: {material.server.key} }} }}\n"
        "  demo: { kind: demo, progress_interval: 20ms }\n"
    )


def client_hello(host: str) -> bytes:
    """The first flight of a real TLS client (Python's), as bytes."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=host)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


@pytest.mark.mcpyard
@pytest.mark.parametrize("runtime", RUNTIMES, ids=runtime_ids)
def test_hostile_tls_input_leaves_other_agents_served(runtime, tls_material, tmp_path, monkeypatch):
    metrics_port = harness.free_port()
    gateway = harness.start_mcpyard(demo_over_tls(tls_material, runtime, metrics_port), tmp_path, scheme="https")
    host, port = gateway.address.split("//")[1].split("/")[0].split(":")
    hello = client_hello("localhost")
    assert hello[0] == 0x16 and len(hello) > 100
    hostile: list[socket.socket] = []
    try:
        # Garbage, and plain HTTP on the TLS port: refused at once.
        for junk in (b"\x00\xff" * 64, b"POST /mcp HTTP/1.1\r\nHost: localhost\r\n\r\n"):
            s = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
            s.sendall(junk)
            s.settimeout(TIMEOUT_S)
            reply = b""
            while chunk := s.recv(4096):
                reply += chunk
            assert b"HTTP/1.1" not in reply, reply
            s.close()
        # A ClientHello cut short, and a connection that says nothing: held until their
        # handshake deadline, while the agent below is served.
        cut = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        cut.sendall(hello[: len(hello) // 2])
        silent = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        hostile += [cut, silent]
        # A client that does not trust mcpyard's certificate (its CA is not the test CA).
        with pytest.raises(ssl.SSLCertVerificationError):
            with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as raw:
                with ssl.create_default_context(cafile=str(tls_material.stranger.pem)).wrap_socket(
                    raw, server_hostname="localhost"
                ):
                    pass

        monkeypatch.setenv("SSL_CERT_FILE", str(tls_material.ca.pem))

        async def agent():
            async with connect(gateway.address) as (session, wire, init):
                assert init is not None and wire.session_id
                tools = await session.list_tools()
                assert "echo" in [t.name for t in tools.tools]
                result = await session.call_tool("echo", {"text": "through TLS"})
                assert tool_text(result) == "through TLS"

        run(agent)
        text = scrape(metrics_port)
        assert handshakes(text, "server", "ok") >= 1, text
        assert handshakes(text, "server", "protocol") >= 2, text
        assert handshakes(text, "server", "alert_received") >= 1, text
        log = gateway.stderr()
        assert log.count("agent TLS handshake failed (protocol)") >= 2, log
    finally:
        for s in hostile:
            s.close()
        harness.stop_mcpyard(gateway)


# --- configurations that must not start --------------------------------------------------------


def check(config: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "check.yaml"
    path.write_text(config)
    return subprocess.run(
        [str(harness.BINARY), "check", "--config", str(path)], capture_output=True, text=True, timeout=TIMEOUT_S
    )


def test_tls_config_errors_name_the_file_or_key(tls_material, tmp_path):
    m = tls_material
    base = "bindings:\n  north: {{ kind: server, listen: 127.0.0.1:0, exit: {exit}{north} }}\n{rest}"
    demo = "  demo: { kind: demo }\n"
    cases = [
        (
            base.format(exit="demo", north=", tls: { cert: nope.pem, key: nope.key }", rest=demo),
            "bindings.north.tls: ",
            "nope.pem: cannot read",
        ),
        (
            base.format(exit="demo", north=f", tls: {{ cert: {m.server.cert}, key: {m.wrong_name.key} }}", rest=demo),
            "bindings.north.tls: ",
            "does not go with the certificate",
        ),
        (
            base.format(exit="demo", north=f", tls: {{ cert: {m.server.cert} }}", rest=demo),
            "bindings.north.tls.key: ",
            "missing",
        ),
        (
            base.format(exit="up", north="", rest='  up: { kind: client, server: "http://127.0.0.1:9/mcp", tls: { ca: x.pem } }\n'),
            "bindings.up.tls: ",
            "expected an https:// server URL",
        ),
        (
            base.format(
                exit="up",
                north="",
                rest='  up: { kind: client, server: "https://127.0.0.1:9/mcp", tls: { insecure_skip_verify: true } }\n',
            ),
            "insecure_skip_verify",
            "unknown",
        ),
    ]
    for config, where, what in cases:
        done = check(config, tmp_path)
        assert done.returncode != 0, config
        assert where in done.stderr and what in done.stderr, (config, done.stderr)
    good = base.format(
        exit="up",
        north=f", tls: {{ cert: {m.server.cert}, key: {m.server.key} }}",
        rest=f'  up: {{ kind: client, server: "https://127.0.0.1:9/mcp", tls: {{ ca: {m.ca.pem} }} }}\n',
    )
    done = check(good, tmp_path)
    assert done.returncode == 0, done.stderr


# --- certificate reload on SIGHUP ------------------------------------------------------------


def served_certificate(host: str, port: int, ca: Path) -> bytes:
    """The DER certificate a new TLS connection to mcpyard is given."""
    context = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection((host, port), timeout=TIMEOUT_S) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return der


def wait_for_log(child: harness.Child, text: str, count: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while child.stderr().count(text) < count:
        assert time.monotonic() < deadline, f"no {count}× {text!r} in:\n{child.stderr()}"
        time.sleep(0.05)


@pytest.mark.mcpyard
@pytest.mark.parametrize("runtime", RUNTIMES, ids=runtime_ids)
def test_sighup_reloads_the_certificate_for_new_connections(runtime, tls_material, tmp_path, monkeypatch):
    # mcpyard's own copy of the files, so the test can replace them.
    cert, key = tmp_path / "north.pem", tmp_path / "north.key"
    cert.write_bytes(tls_material.server.cert.read_bytes())
    key.write_bytes(tls_material.server.key.read_bytes())
    metrics_port = harness.free_port()
    config = demo_over_tls(tls_material, runtime, metrics_port)
    config = config.replace(str(tls_material.server.cert), str(cert)).replace(str(tls_material.server.key), str(key))
    gateway = harness.start_mcpyard(config, tmp_path / "run", scheme="https")
    host, port = gateway.address.split("//")[1].split("/")[0].split(":")
    monkeypatch.setenv("SSL_CERT_FILE", str(tls_material.ca.pem))
    try:
        before = served_certificate(host, int(port), tls_material.ca.pem)
        assert before == ssl.PEM_cert_to_DER_cert(tls_material.server.cert.read_text())
        renewed = tls_material.ca.leaf("renewed", ["localhost", "127.0.0.1"])

        async def scenario():
            async with connect(gateway.address) as (session, _, _):
                # The agent's connection is open; the certificate changes under it.
                cert.write_bytes(renewed.cert.read_bytes())
                key.write_bytes(renewed.key.read_bytes())
                gateway.proc.send_signal(signal.SIGHUP)
                await anyio.to_thread.run_sync(wait_for_log, gateway, "TLS certificate reloaded", 1)
                after = served_certificate(host, int(port), tls_material.ca.pem)
                assert after == ssl.PEM_cert_to_DER_cert(renewed.cert.read_text())
                assert after != before
                # A key that does not load: the renewed certificate stays.
                key.write_text("not a key\n")
                gateway.proc.send_signal(signal.SIGHUP)
                await anyio.to_thread.run_sync(wait_for_log, gateway, "TLS certificate not reloaded", 1)
                assert served_certificate(host, int(port), tls_material.ca.pem) == after
                # The session opened before both reloads still works.
                result = await session.call_tool("echo", {"text": "still here"})
                assert tool_text(result) == "still here"

        run(scenario)
    finally:
        harness.stop_mcpyard(gateway)
