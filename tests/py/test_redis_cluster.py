"""Three mcpyard nodes sharing one proxy cache through a real Redis (Debian's redis-server,
started per test on a port chosen at run time), in front of real SDK upstreams that count
the list requests they serve. Each node runs the same config (only its metrics port is
its own) with two workers, one node on io_uring and two on epoll.

- one hydration per refresh in the whole cluster: one lease holder lists the upstreams, the
  others serve what it wrote, with no upstream round trip and no miss;
- a change reaches each live session on every node as exactly one `list_changed`, and a
  refresh that changes nothing reaches nobody;
- when the lease holder is killed (-9), another node takes the lease within the lease TTL
  and refreshes go on;
- Redis stopped: every node keeps serving the lists it had and answers `initialize` at
  once; Redis started again (empty): the nodes reconnect, hydration resumes, and a change
  made meanwhile reaches every session once;
- Redis stalled (CLIENT PAUSE) past the holder's renewal: lists stay served, and once it
  answers again a change reaches every session once (the lease the holder could not
  release does not hold the cluster up);
- a node started while Redis is down serves live lists at once, then joins the cache;
- `rediss://` (a test CA, trusted through SSL_CERT_FILE) with the password from the
  environment and a database index; a wrong password is one log line, never the password.
"""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import anyio
import httpx2
import pytest

import harness
from helpers import run, unique
from rawmcp import RawSession
from test_cache import _all_once, _all_twice, listening, stats, until

pytestmark = pytest.mark.filterwarnings("ignore::mcp.MCPDeprecationWarning")

TIMEOUT_S = 10
NODES = 3
# The SDK upstream pages its lists by 2: its 16 tools are 8 pages.
TOOL_PAGES = 8


def node_config(urls: dict[str, str], redis_url: str, prefix: str, *, io: str, ttl: str, metrics_port: int) -> str:
    lines = [
        f"runtime: {{ workers: 2, io: {io} }}",
        f"telemetry: {{ metrics: 127.0.0.1:{metrics_port} }}",
        f'stores: {{ shared: {{ type: redis, url: "{redis_url}", prefix: "{prefix}" }} }}',
        "bindings:",
        "  north: { kind: server, listen: 127.0.0.1:0, path: /mcp, exit: tools }",
        "  tools:",
        "    kind: proxy",
        f"    cache: {{ store: shared, ttl: {ttl} }}",
        "    routes:",
    ]
    lines += [f"      - {{ toolkit: {name}, exit: {name} }}" for name in urls]
    lines += [f'  {name}: {{ kind: client, server: "{url}", response_timeout: 5s, connect_timeout: 1s }}' for name, url in urls.items()]
    return "\n".join(lines) + "\n"


class Node:
    """One mcpyard node of the cluster, and its metrics."""

    def __init__(self, index: int, config: str, metrics_port: int, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.index = index
        self.metrics_port = metrics_port
        self.child = harness.start_mcpyard(config, workdir, env)
        self.url = self.child.address
        self.killed = False

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=TIMEOUT_S) as r:
            return r.read().decode()

    def metric(self, name: str) -> float:
        m = re.search(rf"^{re.escape(name)} (\S+)$", self.metrics(), re.M)
        return float(m.group(1)) if m else 0.0

    def kill(self) -> None:
        self.child.proc.kill()
        self.child.proc.wait()
        self.killed = True


class Cluster:
    """`NODES` nodes sharing `redis` under a prefix of their own, in front of `upstreams`."""

    def __init__(self, upstreams: dict[str, harness.Child], redis: harness.Redis, tmp_path: Path, *, ttl: str) -> None:
        urls = {name: child.address for name, child in upstreams.items()}
        prefix = unique("t") + ":"
        self.nodes: list[Node] = []
        try:
            for i in range(NODES):
                port = harness.free_port()
                io = "uring" if i == 0 else "epoll"
                config = node_config(urls, redis.url, prefix, io=io, ttl=ttl, metrics_port=port)
                self.nodes.append(Node(i, config, port, tmp_path / f"node{i}"))
        except BaseException:
            self.stop()
            raise

    async def listening(self, client, per_node: int, tg):
        """`per_node` sessions with a GET stream on every node: all agents, what each heard, the streams."""
        agents, seen, streams = [], [], []
        for node in self.nodes:
            a, s, st = await listening(client, node.url, per_node, tg)
            agents += a
            seen += s
            streams += st
        return agents, seen, streams

    def live(self) -> list[Node]:
        return [n for n in self.nodes if not n.killed]

    def total(self, name: str) -> float:
        return sum(n.metric(name) for n in self.live())

    def holders(self) -> list[Node]:
        """The live nodes whose log says a worker holds the hydration lease now."""
        out = []
        for n in self.live():
            log = n.child.stderr()
            took = log.count("holds the hydration lease")
            gave = log.count("gave up the hydration lease")
            if took > gave:
                out.append(n)
        return out

    def stop(self) -> None:
        for n in self.nodes:
            if not n.killed:
                harness.stop_mcpyard(n.child)

    def run(self, scenario, timeout_s: float = 60) -> None:
        try:
            run(scenario, timeout_s=timeout_s)
        finally:
            self.stop()


@pytest.fixture(scope="module")
def upstreams(tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster-upstreams")
    children = {name: harness.start_upstream("sse-resumable", work / name, name=name) for name in ("alpha", "beta")}
    yield children
    for child in children.values():
        harness.stop_upstream(child)


async def tool_names(raw: RawSession) -> list[str]:
    reply = await raw.request("tools/list")
    assert reply.status == 200, reply.body
    return [t["name"] for t in reply.result["tools"]]


async def session_on(client: httpx2.AsyncClient, node: Node) -> RawSession:
    raw = RawSession(client, node.url)
    await raw.initialize()
    return raw


async def assert_serves_from_the_store(client: httpx2.AsyncClient, node: Node) -> None:
    """`node` is connected to its store and serves alpha's 16 tools from the cache there
    (no list was served live)."""
    raw = await session_on(client, node)
    names = await tool_names(raw)
    assert sum(n.startswith("alpha__") for n in names) == 16
    assert node.metric('mcpyard_store_connected{store="shared"}') == 1
    assert node.metric("mcpyard_cache_misses_total") == 0


def test_one_node_hydrates_for_the_cluster_and_every_node_serves_its_lists(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path, ttl="2s")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            # Every node answers from the shared cache, the same lists.
            lists = []
            for node in cluster.nodes:
                raw = await session_on(client, node)
                lists.append(await tool_names(raw))
            assert lists[0] and all(names == lists[0] for names in lists), lists
            assert sum(n.startswith("alpha__") for n in lists[0]) == 16
            assert sum(n.startswith("beta__") for n in lists[0]) == 16
            start = time.monotonic()
            before = (await stats(client, upstreams["beta"].address))["lists"].get("tools", 0)
            # Agents on every node ask for lists meanwhile: none reaches an upstream.
            for _ in range(3):
                for node in cluster.nodes:
                    raw = await session_on(client, node)
                    for method in ("tools/list", "prompts/list", "resources/list", "resources/templates/list"):
                        assert (await raw.request(method)).status == 200
                    await raw.delete()
            await anyio.sleep(6.5)
            after = (await stats(client, upstreams["beta"].address))["lists"].get("tools", 0)
            elapsed = time.monotonic() - start
            # A refresh per TTL (2 s) in the whole cluster, not one per node (3x as many).
            refreshes = (after - before) / TOOL_PAGES
            assert 1 <= refreshes <= elapsed / 2 + 1.5, (refreshes, elapsed)
            assert cluster.total("mcpyard_cache_lease_changes_total") == 1, "one lease holder"
            assert len(cluster.holders()) == 1
            hydrating = [n for n in cluster.nodes if n.metric('mcpyard_toolkit_hydrations_total{toolkit="beta",outcome="ok"}') > 0]
            assert len(hydrating) == 1, "only the holder lists the upstreams"
            assert cluster.total("mcpyard_cache_misses_total") == 0
            assert cluster.total("mcpyard_cache_hits_total") >= 3 * NODES * 4
            for node in cluster.nodes:
                assert node.metric('mcpyard_store_connected{store="shared"}') == 1
                assert node.metric('mcpyard_store_operations_total{store="shared",op="get",outcome="ok"}') > 0

    cluster.run(scenario)


def test_list_changed_reaches_every_session_on_every_node_once_and_only_on_change(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path, ttl="1s")

    async def scenario():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=60)) as client:
            async with anyio.create_task_group() as tg:
                agents, seen, streams = await cluster.listening(client, 2, tg)
                name = unique("dyn_")
                await agents[0].request("tools/call", {"name": "alpha__add_tool", "arguments": {"name": name}})
                await until(lambda: _all_once(seen), "not every session on every node heard of the change")
                for raw in agents:
                    assert f"alpha__{name}" in await tool_names(raw)
                # Refreshes go on (TTL 1 s) and the upstream says its list changed when it did
                # not: nobody on any node is told again.
                told = cluster.total("mcpyard_cache_notifications_total")
                refreshes = cluster.total("mcpyard_cache_refreshes_ok_total")
                await agents[3].request("tools/call", {"name": "alpha__poke_list_changed", "arguments": {}})

                async def refreshed_twice():
                    return cluster.total("mcpyard_cache_refreshes_ok_total") >= refreshes + 8

                await until(refreshed_twice, "no refresh after the poke")
                assert cluster.total("mcpyard_cache_notifications_total") == told
                for s in seen:
                    assert s.count("notifications/tools/list_changed") == 1, s
                await agents[5].request("tools/call", {"name": "alpha__remove_tool", "arguments": {"name": name}})
                await until(lambda: _all_twice(seen), "the removal was not announced on every node")
                await anyio.sleep(1.5)
                for s in seen:
                    assert s.count("notifications/tools/list_changed") == 2, s
                tg.cancel_scope.cancel()
            for response in streams:
                await response.aclose()

    cluster.run(scenario)


def test_another_node_takes_the_lease_when_the_holder_is_killed(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path, ttl="2s")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            for node in cluster.nodes:
                await tool_names(await session_on(client, node))

            async def one_holder():
                return len(cluster.holders()) == 1

            await until(one_holder, "no lease holder")
            (holder,) = cluster.holders()
            holder.kill()
            killed_at = time.monotonic()

            async def taken_over():
                return len(cluster.holders()) == 1

            # The lease is 2 s (the TTL), the others try every third of it.
            await until(taken_over, "nobody took the lease over", timeout_s=10)
            took = time.monotonic() - killed_at
            assert took <= 2 + 2 / 3 + 1.5, f"took over after {took:.1f}s"
            # Refreshes go on under the new holder: a change reaches the surviving nodes.
            survivors = cluster.live()
            raw = await session_on(client, survivors[0])
            name = unique("dyn_")
            await raw.request("tools/call", {"name": "beta__add_tool", "arguments": {"name": name}})
            for node in survivors:
                other = await session_on(client, node)

                async def listed():
                    return f"beta__{name}" in await tool_names(other)

                await until(listed, f"node {node.index} never listed the new tool")
            await raw.request("tools/call", {"name": "beta__remove_tool", "arguments": {"name": name}})

    cluster.run(scenario)


def test_redis_down_keeps_the_lists_served_and_recovery_resumes_hydration(upstreams, redis, tmp_path):
    cluster = Cluster(upstreams, redis, tmp_path, ttl="1s")

    async def scenario():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=60)) as client:
            async with anyio.create_task_group() as tg:
                agents, seen, streams = await cluster.listening(client, 1, tg)
                served = [await tool_names(raw) for raw in agents]
                redis.stop()

                async def all_disconnected():
                    return all(n.metric('mcpyard_store_connected{store="shared"}') == 0 for n in cluster.nodes)

                await until(all_disconnected, "a node did not notice redis went away")
                await anyio.sleep(1.5)  # past a TTL: refreshes fail, nothing is dropped
                # Still served, on every node; a new agent is answered at once (the lists
                # it would wait for are there), and its lists are the last ones.
                for node, raw, names in zip(cluster.nodes, agents, served):
                    assert await tool_names(raw) == names
                    started = time.monotonic()
                    fresh = await session_on(client, node)
                    assert time.monotonic() - started < 2.0
                    assert await tool_names(fresh) == names
                # A change made upstream while the store is down (the call itself needs no
                # store) cannot be shared yet.
                name = unique("dyn_")
                await agents[1].request("tools/call", {"name": "alpha__add_tool", "arguments": {"name": name}})
                await anyio.sleep(1.0)
                assert all(s.count("notifications/tools/list_changed") == 0 for s in seen), seen
                # Redis comes back, empty: the nodes reconnect, one hydrates again, and
                # every session hears of the change once.
                redis.start()
                await until(lambda: _all_once(seen), "the change made while redis was down never arrived", timeout_s=20)
                for raw in agents:
                    assert f"alpha__{name}" in await tool_names(raw)
                await anyio.sleep(2.5)  # more refreshes: nothing new, nobody told again
                for s in seen:
                    assert s.count("notifications/tools/list_changed") == 1, s
                await agents[0].request("tools/call", {"name": "alpha__remove_tool", "arguments": {"name": name}})
                await until(lambda: _all_twice(seen), "the removal after recovery was not announced")
                tg.cancel_scope.cancel()
            for response in streams:
                await response.aclose()
            for node in cluster.nodes:
                assert node.metric('mcpyard_store_connected{store="shared"}') == 1

    cluster.run(scenario, timeout_s=90)
    for node in cluster.nodes:
        log = node.child.stderr()
        # One line per change of the connection's state, not one per failed attempt.
        assert log.count("store shared: connected to redis") == 1, log[-3000:]
        assert log.count("store shared: lost redis") == 1, log[-3000:]
        assert log.count("store shared: redis at") == 1 and "is back" in log, log[-3000:]
        assert "cannot connect" not in log, log[-3000:]


def test_rediss_with_a_password_from_the_environment_and_a_database_index(upstreams, tmp_path, tls_material):
    password = "pw-" + unique("")
    server = harness.Redis(
        tmp_path / "redis-tls",
        tls=(tls_material.server.cert, tls_material.server.key, tls_material.ca.pem),
        password=password,
    )
    server.start()
    urls = {name: child.address for name, child in upstreams.items()}
    url = f"rediss://127.0.0.1:{server.port}/3"
    env = {"SSL_CERT_FILE": str(tls_material.ca.pem), "REDIS_TEST_PASSWORD": password}
    port = harness.free_port()
    config = node_config(urls, url, "tls:", io="epoll", ttl="5m", metrics_port=port)
    config = config.replace('prefix: "tls:" }', 'prefix: "tls:", password_env: REDIS_TEST_PASSWORD }')
    assert "password_env" in config
    node = Node(0, config, port, tmp_path / "node", env)
    # A wrong password: refused, said once, and never written to the log.
    bad_port = harness.free_port()
    bad_config = config.replace(f"127.0.0.1:{port}", f"127.0.0.1:{bad_port}")
    bad = harness.start_mcpyard(bad_config, tmp_path / "node-bad", {**env, "REDIS_TEST_PASSWORD": "wrong-" + password})

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            await assert_serves_from_the_store(client, node)
            # The lists are in database 3, under the prefix.
            keys = server.command("KEYS", "tls:*", auth=True, db=3)
            assert b"tls:value:tools/tools" in keys, keys
            assert b"tls:value:tools/tools" not in server.command("KEYS", "tls:*", auth=True, db=0)

            async def refused_once():
                return "cannot connect" in bad.stderr()

            await until(refused_once, "the wrong password was not reported")

    try:
        run(scenario, timeout_s=60)
    finally:
        harness.stop_mcpyard(node.child)
        harness.stop_mcpyard(bad)
        server.stop()
    for log in (node.child.stderr(), bad.stderr()):
        assert password not in log, "the password was logged"
    assert bad.stderr().count("cannot connect") == 1, bad.stderr()[-2000:]


def test_rediss_with_a_private_ca_and_a_client_certificate_from_the_config(upstreams, tmp_path, tls_material):
    """A Redis that serves TLS with a certificate of a private CA and asks every client for a
    certificate: a node given `tls: { ca, cert, key }` connects and shares its lists there
    (no SSL_CERT_FILE: the platform's roots do not know the CA); a node given only the CA is
    refused by Redis, and one given no `tls:` does not trust Redis. Both say so once."""
    ca = tls_material.ca
    node_cert = ca.leaf("redis-node", ["mcpyard-node"], client=True)
    test_cert = ca.leaf("redis-test", ["redis-test"], client=True)
    server = harness.Redis(
        tmp_path / "redis-mtls",
        tls=(tls_material.server.cert, tls_material.server.key, ca.pem),
        client=(test_cert.cert, test_cert.key),
    )
    server.start()
    urls = {name: child.address for name, child in upstreams.items()}
    url = f"rediss://localhost:{server.port}/0"
    prefix = unique("m") + ":"

    def config(tls: str, metrics_port: int) -> str:
        text = node_config(urls, url, prefix, io="epoll", ttl="5m", metrics_port=metrics_port)
        with_tls = text.replace(f'prefix: "{prefix}" }}', f'prefix: "{prefix}", tls: {tls} }}')
        assert with_tls != text or not tls
        return with_tls if tls else text

    port = harness.free_port()
    full = f"{{ ca: {ca.pem}, cert: {node_cert.cert}, key: {node_cert.key} }}"
    node = Node(0, config(full, port), port, tmp_path / "node")
    ca_only_port, bare_port = harness.free_port(), harness.free_port()
    ca_only = Node(1, config(f"{{ ca: {ca.pem} }}", ca_only_port), ca_only_port, tmp_path / "node-ca-only")
    bare = Node(2, config("", bare_port), bare_port, tmp_path / "node-bare")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            await assert_serves_from_the_store(client, node)
            keys = server.command("KEYS", f"{prefix}*")
            assert f"{prefix}value:tools/tools".encode() in keys, keys

            async def refused_once():
                return "cannot connect" in ca_only.child.stderr() and "cannot connect" in bare.child.stderr()

            await until(refused_once, "the refused TLS connections were not reported")
            for refused in (ca_only, bare):
                assert refused.metric('mcpyard_store_connected{store="shared"}') == 0
            # Each refusal is said once, with its reason, however often the node retries.
            assert ca_only.child.stderr().count("cannot connect") == 1, ca_only.child.stderr()[-2000:]
            assert bare.child.stderr().count("cannot connect") == 1, bare.child.stderr()[-2000:]
            assert "CertificateRequired" in ca_only.child.stderr(), ca_only.child.stderr()[-2000:]
            assert "UnknownIssuer" in bare.child.stderr(), bare.child.stderr()[-2000:]

    try:
        run(scenario, timeout_s=60)
    finally:
        for n in (node, ca_only, bare):
            harness.stop_mcpyard(n.child)
        server.stop()


def test_a_node_started_while_redis_is_down_serves_live_lists_then_joins_the_cache(upstreams, tmp_path):
    server = harness.Redis(tmp_path / "redis-late")
    urls = {name: child.address for name, child in upstreams.items()}
    port = harness.free_port()
    node = Node(0, node_config(urls, server.url, unique("t") + ":", io="uring", ttl="2s", metrics_port=port), port, tmp_path / "node")

    async def scenario():
        async with httpx2.AsyncClient(timeout=TIMEOUT_S) as client:
            # No store: initialize is not held for lists that cannot come (the gate would
            # be the routes' 1 s + 5 s); the agent gets the routes' live lists.
            started = time.monotonic()
            raw = await session_on(client, node)
            assert time.monotonic() - started < 2.0
            names = await tool_names(raw)
            assert sum(n.startswith("alpha__") for n in names) == 16
            assert node.metric("mcpyard_cache_misses_total") >= 1
            assert node.metric('mcpyard_store_connected{store="shared"}') == 0
            server.start()

            async def cached():
                fresh = await session_on(client, node)
                hits = node.metric("mcpyard_cache_hits_total")
                return await tool_names(fresh) == names and node.metric("mcpyard_cache_hits_total") > hits

            await until(cached, "the node never served from the cache once redis was up", timeout_s=20)
            assert node.metric('mcpyard_store_connected{store="shared"}') == 1

    try:
        run(scenario, timeout_s=60)
    finally:
        harness.stop_mcpyard(node.child)
        server.stop()
    log = node.child.stderr()
    assert log.count("cannot connect to redis") == 1, log[-3000:]
    assert log.count("is back") == 1, log[-3000:]


def test_a_stalled_redis_holds_nothing_up_once_it_answers_again(upstreams, redis, tmp_path):
    # Leases of 3 s renewed every second: the pause below (CLIENT PAUSE, every command of
    # every client waits) makes the holder's renewal time out, and its release cannot
    # reach Redis either.
    cluster = Cluster(upstreams, redis, tmp_path, ttl="3s")

    async def scenario():
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(TIMEOUT_S, read=60)) as client:
            async with anyio.create_task_group() as tg:
                agents, seen, streams = await cluster.listening(client, 1, tg)
                served = [await tool_names(raw) for raw in agents]
                redis.command("CLIENT", "PAUSE", "3500", "ALL")
                await anyio.sleep(2.5)
                for raw, names in zip(agents, served):
                    assert await tool_names(raw) == names, "lists went away while redis stalled"
                await anyio.sleep(1.5)  # the pause is over
                name = unique("dyn_")
                await agents[2].request("tools/call", {"name": "beta__add_tool", "arguments": {"name": name}})
                await until(lambda: _all_once(seen), "the change after the stall never reached every session", timeout_s=15)
                await anyio.sleep(3.5)  # refreshes go on: nobody is told twice
                for s in seen:
                    assert s.count("notifications/tools/list_changed") == 1, s
                await agents[0].request("tools/call", {"name": "beta__remove_tool", "arguments": {"name": name}})
                await until(lambda: _all_twice(seen), "the removal was not announced")
                tg.cancel_scope.cancel()
            for response in streams:
                await response.aclose()

    cluster.run(scenario, timeout_s=90)
