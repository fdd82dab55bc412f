"""compare-cluster (issue 24): mcpyard nodes sharing one Redis, against one node, in one run.

Every node runs the same config: 1 worker (io_uring), a server binding with shared sessions
(`sessions: { store: shared }`) in front of a proxy whose list cache lives in Redis
(`cache: { store: shared }`), one route `a` to the fast Rust fixture (`mcpyard-loadgen
upstream`, 1 worker, 1 KiB results). Everything runs on this machine's cores: Redis, the
fixture, the nodes and the generators share them, so two nodes measure the cluster's
overhead, never scale-out.

Phase `idle` (Redis sizing at rest): with only nodes A and B running, `INFO commandstats`
before and after --idle-seconds of nothing, and a MONITOR connection that tells the commands
mcpyard sends (round trips) from those Redis runs inside its scripts.

Phase `load`: cached `tools/list` and `tools/call` (`a__echo`, 1 KiB arguments and result)
through `one-node` (A alone, 8 connections), `two-nodes` (A and B, one generator of 4
connections each, figures summed, latencies merged from both generators' histograms) and
`no-sessions` (node N: the same config without `sessions:`, its own Redis), round-robin
over --rounds: closed loop for the max, then open loop at --rate-fraction of the lower of
one-node's and two-nodes' max (a rate all of them sustain). Per run: CPU µs per request of
every process group, and the Redis commands (commandstats deltas) under that load.

Phase `churn` (a load balancer without affinity): nodes R1 and R2 listen on the same port
(SO_REUSEPORT: the kernel spreads connections between the two processes) and the generator
opens a new connection per request and ends each session after --session-calls calls, so a
session is opened on one node and used on both; against node A alone with the same flags.
Adoptions, upstream sessions opened and Redis commands per agent session.

Phase `adopt`: --adopt-sessions sessions opened on A, then timed single requests (Python,
one keep-alive connection per node): the owner's first call (opens route `a`), its next,
B's first (takes the session up from Redis with A's upstream session), B's next; then
sessions whose first call goes to B and the next to A (does A reuse B's upstream
session?); then DELETE on A and whether B lets go of its copies.

Phase `callgrind`: instructions per cached tools/list and per tools/call on a node with and
without `sessions:` (epoll, under valgrind), as perf/callgrind.sh counts them: the same
question as no-sessions above, without the machine's noise.

Phase `fanout` (run right after `idle`, so the nodes hold no other sessions): --sessions
sessions with a GET stream on each of A and B (this script's own
client: one socket per session, kernel receive timestamps via SO_TIMESTAMPNS, so reading
late costs no accuracy and the reader takes no CPU while the nodes fan out), then per round
a real change of the fixture's tool list (POST /control/tools_changed, as compare-cache
does); per node the time from the trigger to each session's receipt, and a count of every
list_changed each session got (exactly one per round is right); then DELETE on each.

Order: idle, fanout, load, churn, adopt, callgrind. `--report-only` rewrites the report
from the JSON without measuring.
"""

import argparse
import copy
import http.client
import json
import os
import re
import resource
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import loadgen as perfkit_loadgen  # noqa: E402
from perfkit import (  # noqa: E402
    CLK_TCK, QUIET, RAW, REPO, RESULTS, Fail, Fixture, Procs, add_quiet_args, apt_install, binaries,
    fmt, free_port, log, loadgen_cmd, machine_info, machine_line, main_guard, median, summarize,
    pgroup_ticks, raise_nofile, rss_kib, scrape, set_quiet, system_ticks, table, wait_for_line,
    wait_quiet, write_report,
)

NAME = "compare-cluster"
RAW_SUB = "raw/" + NAME
PROTOCOL = "2025-11-25"
TOOL = "a__echo"
TTL = "5m"  # cache TTL: longer than the run, so only the fan-out's trigger refreshes
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux; SCM_TIMESTAMPNS is the same
LIST_CHANGED = "notifications/tools/list_changed"
CONFIGS = ["one-node", "two-nodes", "no-sessions"]
CHURN = ["churn-one-node", "churn-two-nodes"]


def parse():
    ap = argparse.ArgumentParser(prog="compare-cluster.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phases", default="idle,fanout,load,churn,adopt,callgrind",
                    help="comma-separated subset of idle,fanout,load,churn,adopt,callgrind (all)")
    ap.add_argument("--connections", type=int, default=8,
                    help="connections per configuration; two nodes get half each (8)")
    ap.add_argument("--max-duration", default="3s", help="closed-loop run length (3s)")
    ap.add_argument("--rate-duration", default="4s", help="open-loop run length (4s)")
    ap.add_argument("--warmup", default="0.5s", help="warm-up before every run (0.5s)")
    ap.add_argument("--rounds", type=int, default=5, help="runs per configuration, alternating (5)")
    ap.add_argument("--rate-fraction", type=float, default=0.5,
                    help="open-loop rate as a share of the lower max of one-node and two-nodes (0.5)")
    ap.add_argument("--params-bytes", type=int, default=1024, help="tools/call arguments (1024)")
    ap.add_argument("--result-bytes", type=int, default=1024, help="fixture result (1024)")
    ap.add_argument("--idle-seconds", type=float, default=30.0, help="idle window (30)")
    ap.add_argument("--session-calls", type=int, default=20,
                    help="churn: calls per session before it is ended (20)")
    ap.add_argument("--adopt-sessions", type=int, default=200, help="adopt: sessions (200)")
    ap.add_argument("--sessions", type=int, default=1000, help="fanout: sessions per node (1000)")
    ap.add_argument("--fan-rounds", type=int, default=5, help="fanout: rounds (5)")
    ap.add_argument("--cg-requests", type=int, default=2000,
                    help="callgrind: phase B's requests per scenario, A has half (2000)")
    ap.add_argument("--cg-rate", type=int, default=400, help="callgrind: open-loop rate (400/s)")
    ap.add_argument("--retry-foreign", type=float, default=15.0,
                    help="run again (once) when other work used more than this %% of the "
                         "machine during a run (15)")
    add_quiet_args(ap)
    a = ap.parse_args()
    a.phase_set = set(x for x in a.phases.split(",") if x)
    bad = a.phase_set - {"idle", "load", "churn", "adopt", "fanout", "callgrind"}
    if bad:
        ap.error(f"--phases: unknown {', '.join(sorted(bad))}")
    return a


# --------------------------------------------------------------------------- redis


def resp_encode(*parts):
    out = [f"*{len(parts)}\r\n".encode()]
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class RespConn:
    """One connection to Redis speaking RESP2, blocking."""

    def __init__(self, port, timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.f = self.sock.makefile("rb")

    def send(self, *args):
        self.sock.sendall(resp_encode(*args))

    def read(self):
        line = self.f.readline()
        if not line:
            raise OSError("redis closed the connection")
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise Fail(f"redis: {rest.decode()}")
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self.f.read(n + 2)[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise Fail(f"redis: unexpected reply {line[:80]!r}")

    def cmd(self, *args):
        self.send(*args)
        return self.read()

    def close(self):
        try:
            self.f.close()
            self.sock.close()
        except OSError:
            pass


class Redis:
    """Debian's redis-server on a loopback port chosen now, no persistence, in its own
    process group (like tests/py/harness.py's helper)."""

    def __init__(self, procs, name):
        self.name = name
        server = apt_install("redis-server", ["redis-server"])
        workdir = os.path.join(RAW, f"{NAME}-{name}")
        os.makedirs(workdir, exist_ok=True)
        for _attempt in range(5):
            self.port = free_port()
            argv = [server, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                    "--appendonly", "no", "--dir", workdir]
            self.p = procs.start(f"redis-{name}", argv, os.path.join(RAW, f"{NAME}-{name}.log"))
            if self._wait():
                break
            procs.stop(self.p)
        else:
            raise Fail(f"redis-server did not start; see {RAW}/{NAME}-{name}.log")
        self.pid = self.p.pid
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.conn = RespConn(self.port)
        self.version = self.info("server").get("redis_version")

    def _wait(self):
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.p.poll() is not None:
                return False
            try:
                c = RespConn(self.port, timeout=1)
                try:
                    if c.cmd("PING") == "PONG":
                        return True
                finally:
                    c.close()
            except (OSError, Fail):
                pass
            time.sleep(0.02)
        return False

    def info(self, section):
        text = self.conn.cmd("INFO", section).decode()
        out = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, _, v = line.partition(":")
                out[k] = v
        return out

    def commandstats(self):
        """{command: {calls, usec, failed_calls}} (our own INFO calls left out)."""
        out = {}
        for k, v in self.info("commandstats").items():
            cmd = k[len("cmdstat_"):]
            if cmd in ("info", "monitor"):
                continue
            f = dict(x.split("=", 1) for x in v.split(","))
            out[cmd] = {"calls": int(f["calls"]), "usec": int(f["usec"]),
                        "failed_calls": int(f.get("failed_calls", 0))}
        return out


def stats_delta(a, b):
    out = {}
    for cmd, v in b.items():
        p = a.get(cmd, {"calls": 0, "usec": 0, "failed_calls": 0})
        d = {k: v[k] - p[k] for k in v}
        if d["calls"]:
            out[cmd] = d
    return out


class Monitor(threading.Thread):
    """Counts every command Redis runs by where it came from: `client` (a round trip from
    mcpyard) or `lua` (inside a script), from a MONITOR connection."""

    LINE = re.compile(rb'^\+[\d.]+ \[\d+ (\S+)\] "([^"]*)"')

    def __init__(self, port):
        super().__init__(daemon=True)
        self.conn = RespConn(port, timeout=None)
        self.conn.send("MONITOR")
        if self.conn.read() != "OK":
            raise Fail("redis MONITOR refused")
        self.lock = threading.Lock()
        self.counts = {}
        self.stopped = False
        self.start()

    def run(self):
        try:
            while not self.stopped:
                line = self.conn.f.readline()
                if not line:
                    return
                m = self.LINE.match(line)
                if not m:
                    continue
                cmd = m.group(2).decode(errors="replace").lower()
                if cmd in ("info", "monitor"):
                    continue
                src = "lua" if m.group(1) == b"lua" else "client"
                with self.lock:
                    self.counts[(src, cmd)] = self.counts.get((src, cmd), 0) + 1
        except (OSError, ValueError):
            return

    def snapshot(self):
        time.sleep(0.05)  # let the last lines arrive
        with self.lock:
            return dict(self.counts)

    def stop(self):
        self.stopped = True
        self.conn.close()


def monitor_delta(a, b):
    out = {}
    for k, v in b.items():
        d = v - a.get(k, 0)
        if d:
            out[f"{k[0]} {k[1]}"] = d
    return out


# --------------------------------------------------------------------------- nodes


def node_config(redis_url, fixture_url, sessions=True, listen="127.0.0.1:0", io="uring"):
    s = ", sessions: { store: shared }" if sessions else ""
    return (
        f"runtime: {{ workers: 1, io: {io} }}\n"
        "telemetry: { metrics: 127.0.0.1:0 }\n"
        f'stores: {{ shared: {{ type: redis, url: "{redis_url}" }} }}\n'
        "bindings:\n"
        f"  north: {{ kind: server, listen: {listen}, path: /mcp, exit: tools{s} }}\n"
        "  tools:\n"
        "    kind: proxy\n"
        f"    cache: {{ store: shared, ttl: {TTL} }}\n"
        "    routes:\n"
        "      - { toolkit: a, exit: a }\n"
        f'  a: {{ kind: client, server: "{fixture_url}" }}\n'
    )


class Node:
    def __init__(self, procs, gw, name, redis, fixture, sessions=True, listen="127.0.0.1:0",
                 io="uring", wrapper=None):
        self.name = name
        self.config_text = node_config(redis.url, fixture.url, sessions, listen, io)
        cfg = os.path.join(RAW, f"{NAME}-{name}.yaml")
        with open(cfg, "w") as f:
            f.write(self.config_text)
        out = os.path.join(RAW, f"{NAME}-{name}.log")
        self.log = out
        self.p = procs.start(f"node-{name}", (wrapper or []) + [gw, "--config", cfg], out)
        t = 120.0 if wrapper else 15.0
        north = wait_for_line(out, r"listening north (\S+)", self.p, t).group(1)
        metrics = wait_for_line(out, r"listening metrics (\S+)", self.p, t).group(1)
        self.addr = north
        self.url = f"http://{north}/mcp"
        self.metrics_url = f"http://{metrics}/metrics"
        self.pid = self.p.pid

    def scrape(self):
        return scrape(self.metrics_url)


def check_lists(node, timeout=15):
    """A session on `node` sees the cached list (a__echo, a__big); waits for hydration."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            c = Http(node.addr)
            sid = c.open_session()
            st, _, body = c.post(sid, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
            c.delete(sid)
            c.close()
            names = [t["name"] for t in json.loads(body)["result"]["tools"]]
            if st == 200 and TOOL in names:
                return names
            last = f"http {st}: {names}"
        except (OSError, ValueError, KeyError, Fail) as e:
            last = repr(e)
        time.sleep(0.2)
    raise Fail(f"{node.name}: no cached tools list with {TOOL}: {last}")


# --------------------------------------------------------------------------- http client


class Http:
    """A keep-alive HTTP/1.1 connection for single timed MCP requests."""

    def __init__(self, addr, timeout=10):
        host, port = addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        self.conn.connect()
        self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def request(self, method, sid, body=None):
        h = {"accept": "application/json, text/event-stream"}
        if body is not None:
            h["content-type"] = "application/json"
        if sid:
            h["mcp-session-id"] = sid
            h["mcp-protocol-version"] = PROTOCOL
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, "/mcp", body=data, headers=h)
        r = self.conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()

    def post(self, sid, body):
        return self.request("POST", sid, body)

    def open_session(self):
        st, h, body = self.post(None, {
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                       "clientInfo": {"name": NAME, "version": "1"}}})
        if st != 200 or "mcp-session-id" not in h:
            raise Fail(f"initialize: http {st} {body[:200]!r}")
        sid = h["mcp-session-id"]
        st, _, body = self.post(sid, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        if st != 202:
            raise Fail(f"notifications/initialized: http {st} {body[:200]!r}")
        return sid

    def delete(self, sid):
        return self.request("DELETE", sid)[0]

    def close(self):
        self.conn.close()


# --------------------------------------------------------------------------- load runs


def merged_quantiles(results, key="response_us"):
    """p50/p90/p99/p99.9/max of several generators' runs together, from each run's
    percentile steps (value, count); one run: its own figures."""
    if len(results) == 1:
        h = results[0][key]
        return {q: h[q] for q in ("p50", "p90", "p99", "p99_9", "max")}
    pts = []
    for r in results:
        pts += [(p["value_us"], p["count"]) for p in r[key].get("percentiles", [])]
    pts.sort()
    total = sum(c for _, c in pts)
    out = {"max": max(r[key]["max"] for r in results)}
    for q, frac in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99_9", 0.999)):
        want, cum = frac * total, 0
        for v, c in pts:
            cum += c
            if cum >= want:
                out[q] = v
                break
        else:
            out[q] = out["max"]
    return out


CHURN_KEYS = ("mcpyard_sessions_created_total", "mcpyard_sessions_adopted_total",
              "mcpyard_upstream_adopted_total", "mcpyard_upstream_connects_total",
              "mcpyard_session_store_failures_total", "mcpyard_sessions")


def load_run(a, lg, tag, jobs, scenario, rate, duration, watch, redis_by_name, mons, extra,
             scrape_nodes=()):
    """Runs one generator per job at once; jobs: [(node label, url, connections)]. The rate
    (open loop) is split evenly. Returns the summed/merged result with CPU µs per request
    of every watched process group and the Redis commands during the run."""
    for attempt in range(2):
        wait_quiet()
        argvs = []
        for label, url, conns in jobs:
            jpath = os.path.join(RESULTS, RAW_SUB, f"{tag}-{label}.json")
            argv = [lg, "run", "--url", url, "--scenario", scenario, "--json", jpath,
                    "--connections", str(conns), "--warmup", a.warmup, "--duration", duration]
            argv += ["--rate", str(int(round(rate / len(jobs))))] if rate else ["--mode", "closed"]
            argv += extra
            argvs.append((label, jpath, argv))
        before = {n.name: n.scrape() for n in scrape_nodes}
        rs0 = {n: r.commandstats() for n, r in redis_by_name.items()}
        m0 = {n: m.snapshot() for n, m in mons.items()}
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0, s0, w0 = pgroup_ticks(list(watch.values())), system_ticks(), time.time()
        ps = [(label, jpath, argv, Procs.current.start(
            f"loadgen {tag}-{label}", argv, os.path.join(RAW, f"{NAME}-{tag}-{label}.loadgen.log")))
            for label, jpath, argv in argvs]
        for label, jpath, argv, p in ps:
            try:
                p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                raise Fail(f"loadgen {tag}-{label} still running after 300 s")
            Procs.current.stop(p)
        wall = time.time() - w0
        t1, s1 = pgroup_ticks(list(watch.values())), system_ticks()
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        rs1 = {n: r.commandstats() for n, r in redis_by_name.items()}
        after = {n.name: n.scrape() for n in scrape_nodes}
        m1 = {n: m.snapshot() for n, m in mons.items()}
        results = []
        for label, jpath, argv, p in ps:
            if p.returncode != 0 or not os.path.exists(jpath):
                with open(os.path.join(RAW, f"{NAME}-{tag}-{label}.loadgen.log"),
                          errors="replace") as f:
                    tail = f.read()[-2000:]
                raise Fail(f"loadgen {tag}-{label} exited {p.returncode}: "
                           f"{' '.join(argv)}\n{tail}")
            with open(jpath) as f:
                r = json.load(f)
            r["argv"] = argv
            r["node"] = label
            results.append(r)
        ok = sum(r["requests_ok"] for r in results)
        errors = {k: sum(r["errors"][k] for r in results) for k in results[0]["errors"]}
        n = ok + sum(errors.values())
        cpu = {k: (sum(t1[g]) - sum(t0[g])) * 1e6 / CLK_TCK for k, g in watch.items()}
        cpu["loadgen"] = ((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)) * 1e6
        total = s1[0] - s0[0]
        busy = total - (s1[1] - s0[1])
        ours = sum(cpu.values()) * CLK_TCK / 1e6
        res = {
            "tag": tag, "scenario": scenario, "target_rate": rate,
            "throughput_rps": sum(r["throughput_rps"] for r in results),
            "per_node_rps": {r["node"]: r["throughput_rps"] for r in results},
            "requests_ok": ok, "errors": errors, "unsent": sum(r["unsent"] for r in results),
            "response_us": merged_quantiles(results, "response_us"),
            "service_us": merged_quantiles(results, "service_us"),
            "per_node_response_us": {r["node"]: {q: r["response_us"][q] for q in
                                                 ("p50", "p99", "max")} for r in results},
            "duration_s": results[0]["duration_s"],
            "cpu_us_per_req": {k: (v / n if n else None) for k, v in cpu.items()},
            "machine_busy_pct": 100.0 * busy / total if total else 0.0,
            "foreign_busy_pct": max(0.0, 100.0 * (busy - ours) / total) if total else 0.0,
            "steal_pct": 100.0 * (s1[2] - s0[2]) / total if total else 0.0,
            "wall_s": wall,
            "redis": {nm: stats_delta(rs0[nm], rs1[nm]) for nm in redis_by_name},
            "monitor": {n: monitor_delta(m0[n], m1[n]) for n in mons},
            "warmup_requests": sum(r.get("warmup_requests") or 0 for r in results),
            "argv": [x[2] for x in argvs],
            "attempt": attempt + 1,
        }
        if scrape_nodes:
            res["metrics"] = {n: {k.replace("mcpyard_", ""): after[n].get(k, 0) - before[n].get(k, 0)
                                  for k in CHURN_KEYS} for n in before}
            res["upstream_sessions_gauge"] = {n: after[n].get("mcpyard_upstream_sessions")
                                              for n in after}
        if res["foreign_busy_pct"] <= a.retry_foreign:
            return res
        log(f"{tag}: {res['foreign_busy_pct']:.0f} % of the machine was busy with other work "
            "during the run; running it again")
    return res


def rate_for(x):
    step = 100 if x >= 2000 else 10
    return max(step, int(x // step) * step)


# --------------------------------------------------------------------------- phases


def phase_idle(a, redis, mon, nodes):
    log(f"idle: {a.idle_seconds:.0f} s with nodes {', '.join(n.name for n in nodes)} and no load")
    time.sleep(2)  # hydration and first lease attempts done
    s0, m0 = redis.commandstats(), mon.snapshot()
    pg = [n.pid for n in nodes] + [redis.pid]
    t0 = pgroup_ticks(pg)
    w0 = time.time()
    time.sleep(a.idle_seconds)
    s1, m1 = redis.commandstats(), mon.snapshot()
    t1 = pgroup_ticks(pg)
    wall = time.time() - w0
    return {"seconds": wall, "nodes": [n.name for n in nodes],
            "commandstats": stats_delta(s0, s1), "monitor": monitor_delta(m0, m1),
            "cpu_ms": {name: (sum(t1[p]) - sum(t0[p])) * 1e3 / CLK_TCK for name, p in
                       [(n.name, n.pid) for n in nodes] + [("redis", redis.pid)]}}


def phase_load(a, lg, nodes, fx, redis1, redis2, mons):
    A, B, N = nodes["A"], nodes["B"], nodes["N"]
    half = max(1, a.connections // 2)
    confs = {
        "one-node": [("A", A.url, a.connections)],
        "two-nodes": [("A", A.url, half), ("B", B.url, half)],
        "no-sessions": [("N", N.url, a.connections)],
    }
    watch = {"nodeA": A.pid, "nodeB": B.pid, "nodeN": N.pid, "redis": redis1.pid,
             "redisN": redis2.pid, "fixture": fx.pid}
    reds = {"cluster": redis1, "no-sessions": redis2}
    scen = {"tools-list": [], "tools-call": ["--tool", TOOL, "--params-bytes", str(a.params_bytes)]}
    out = {}
    for sc, extra in scen.items():
        maxes = {c: [] for c in CONFIGS}
        for k in range(a.rounds):
            for c in CONFIGS:
                log(f"load {sc} max round {k + 1}: {c}")
                maxes[c].append(load_run(a, lg, f"{sc}-max-{k + 1}-{c}", confs[c], sc, None,
                                         a.max_duration, watch, reds, mons, extra))
        smax = {c: summarize(v) for c, v in maxes.items()}
        lower = min(smax["one-node"]["throughput_rps"], smax["two-nodes"]["throughput_rps"])
        rate = rate_for(lower * a.rate_fraction)
        log(f"load {sc}: one-node {smax['one-node']['throughput_rps']:.0f}/s, two-nodes "
            f"{smax['two-nodes']['throughput_rps']:.0f}/s → open loop at {rate}/s")
        at = {c: [] for c in CONFIGS}
        for k in range(a.rounds):
            for c in CONFIGS:
                log(f"load {sc} rate {rate} round {k + 1}: {c}")
                at[c].append(load_run(a, lg, f"{sc}-rate-{k + 1}-{c}", confs[c], sc, rate,
                                      a.rate_duration, watch, reds, mons, extra))
        out[sc] = {"max": smax, "rate": rate, "at_rate": {c: summarize(v) for c, v in at.items()}}
    return out


def phase_churn(a, lg, A, pair, fx, redis1, redis3, mons):
    """New connection per request, sessions of --session-calls calls: A alone against the
    no-affinity pair sharing one port."""
    confs = {"churn-one-node": [("A", A.url, a.connections)],
             "churn-two-nodes": [("R", pair[0].url, a.connections)]}
    watch = {"nodeA": A.pid, "nodeR1": pair[0].pid, "nodeR2": pair[1].pid,
             "redis": redis1.pid, "redisR": redis3.pid, "fixture": fx.pid}
    reds = {"cluster": redis1, "pair": redis3}
    extra = ["--tool", TOOL, "--params-bytes", str(a.params_bytes), "--new-connection",
             "--session-calls", str(a.session_calls)]
    runs = {c: [] for c in CHURN}
    for k in range(a.rounds):
        for c in CHURN:
            ns = [A] if c == "churn-one-node" else list(pair)
            log(f"churn round {k + 1}: {c}")
            runs[c].append(load_run(a, lg, f"churn-{k + 1}-{c}", confs[c], "tools-call", None,
                                    a.max_duration, watch, reds, mons, extra, scrape_nodes=ns))
    out = {}
    for c, rs in runs.items():
        s = summarize(rs)
        s["metrics"] = [r["metrics"] for r in rs]
        s["upstream_sessions_gauge"] = [r["upstream_sessions_gauge"] for r in rs]
        red = "cluster" if c == "churn-one-node" else "pair"
        s["redis_calls"] = [sum(v["calls"] for v in r["redis"][red].values()) for r in rs]
        s["redis_by_cmd"] = [r["redis"][red] for r in rs]
        s["wall_s"] = [r["wall_s"] for r in rs]
        out[c] = s
    return {"session_calls": a.session_calls, "runs": out}


def timed(c, sid, body):
    t0 = time.perf_counter()
    st, _, data = c.post(sid, body)
    return (time.perf_counter() - t0) * 1e6, st, data


def qs(xs):
    xs = sorted(xs)
    if not xs:
        return None
    pick = lambda f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    return {"n": len(xs), "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": xs[-1]}


def gauges(node):
    m = node.scrape()
    return {k.replace("mcpyard_", ""): m.get(k, 0) for k in (
        "mcpyard_sessions", "mcpyard_sessions_created_total", "mcpyard_sessions_adopted_total", "mcpyard_upstream_adopted_total",
        "mcpyard_upstream_sessions", "mcpyard_upstream_connects_total",
        "mcpyard_sessions_detached_total", "mcpyard_session_store_failures_total")}


ADOPT_COLUMNS = {
    "owner_first": ["A first call (opens route a)", "A next call",
                    "B first call (takes the session up)", "B next call"],
    "other_first": ["B first call (takes up, opens route a)", "A first call after B's",
                    "A next call"],
}


def phase_adopt(a, A, B):
    k = a.adopt_sessions
    call = lambda i: {"jsonrpc": "2.0", "id": 10 + i, "method": "tools/call",  # noqa: E731
                      "params": {"name": TOOL, "arguments": {"payload": "x" * a.params_bytes}}}
    ca, cb = Http(A.addr), Http(B.addr)
    bad = []

    def check(what, sid, st, data):
        if st != 200 or b'"result"' not in data:
            bad.append(f"{what} {sid}: http {st} {data[:160]!r}")

    out = {"sessions": k}
    wait_quiet()
    # Order 1: the owner opens route a first, then B takes the session up with its handoff.
    g0 = {"A": gauges(A), "B": gauges(B)}
    sids = [ca.open_session() for _ in range(k)]
    cols = {c: [] for c in ADOPT_COLUMNS["owner_first"]}
    for i, sid in enumerate(sids):
        for (col, c) in zip(cols, (ca, ca, cb, cb)):
            us, st, data = timed(c, sid, call(i))
            check(col, sid, st, data)
            cols[col].append(us)
    g1 = {"A": gauges(A), "B": gauges(B)}
    out["owner_first"] = {"latency_us": {c: qs(v) for c, v in cols.items()},
                          "gauges_delta": {n: {kk: g1[n][kk] - g0[n][kk] for kk in g0[n]}
                                           for n in g0}}
    # Order 2: the first call goes to B, the next to A (the owner, which holds the session
    # in memory without route a).
    sids2 = [ca.open_session() for _ in range(k)]
    cols2 = {c: [] for c in ADOPT_COLUMNS["other_first"]}
    for i, sid in enumerate(sids2):
        for (col, c) in zip(cols2, (cb, ca, ca)):
            us, st, data = timed(c, sid, call(i))
            check(col, sid, st, data)
            cols2[col].append(us)
    g2 = {"A": gauges(A), "B": gauges(B)}
    out["other_first"] = {"latency_us": {c: qs(v) for c, v in cols2.items()},
                          "gauges_delta": {n: {kk: g2[n][kk] - g1[n][kk] for kk in g1[n]}
                                           for n in g1}}
    # DELETE on A: B's copies should go (through its watch of the record).
    t0 = time.time()
    dels = [ca.delete(sid) for sid in sids + sids2]
    del_wall = time.time() - t0
    waited = None
    for _ in range(50):
        time.sleep(0.1)
        gb = gauges(B)
        if gb["sessions"] <= g0["B"]["sessions"]:
            waited = time.time() - t0
            break
    g3 = {"A": gauges(A), "B": gauges(B)}
    # A request on B for a session deleted on A must now be 404.
    st_after, _, _ = cb.post(sids[0], call(0))
    out["delete"] = {"statuses": {str(s): dels.count(s) for s in sorted(set(dels))},
                     "wall_s": del_wall, "b_released_after_s": waited,
                     "sessions_before_test": {n: g0[n]["sessions"] for n in g0},
                     "sessions_after_delete": {n: g3[n]["sessions"] for n in g3},
                     "upstream_sessions_after_delete": {n: g3[n]["upstream_sessions"] for n in g3},
                     "upstream_sessions_before_test": {n: g0[n]["upstream_sessions"] for n in g0},
                     "b_status_after_delete": st_after}
    out["failures"] = bad[:20]
    out["failure_count"] = len(bad)
    ca.close()
    cb.close()
    return out


# --------------------------------------------------------------------------- callgrind


def phase_callgrind(procs, a, gw, lg, fx, redis):
    """Instructions per request on a node with and without `sessions:` (epoll: valgrind
    cannot follow io_uring), as perf/callgrind.sh counts them: per scenario, phase A (N/2
    requests) and B (N) between `callgrind_control -z` and `-d`, (B − A) over the extra
    requests, less the idle instructions of B's extra wall time."""
    import glob
    from callgrind import control, dump  # the same zero/dump helpers

    valgrind = apt_install("valgrind", ["valgrind"])
    cg_control = apt_install("callgrind_control", ["valgrind"])
    version = subprocess.run([valgrind, "--version"], capture_output=True, text=True).stdout.strip()
    scen = {"tools-list": ("tools/list", []),
            "tools-call": ("tools/call", ["--tool", TOOL, "--params-bytes", str(a.params_bytes)])}
    out = {"valgrind": version, "rate": a.cg_rate, "requests": a.cg_requests, "configs": {}}
    for label, sessions in (("sessions", True), ("no-sessions", False)):
        prefix = os.path.join(RAW, f"{NAME}-callgrind-{label}.out")
        for old in glob.glob(prefix + ".*"):
            os.unlink(old)
        node = Node(procs, gw, f"CG-{label}", redis, fx, sessions=sessions, io="epoll",
                    wrapper=[valgrind, "--tool=callgrind", f"--callgrind-out-file={prefix}.%p"])
        check_lists(node, timeout=120)
        pfx = f"{prefix}.{node.pid}"
        seen = set(glob.glob(pfx + ".*")) | {pfx}

        def send(tag, n, extra):
            return perfkit_loadgen(lg, f"{NAME}-cg-{label}-{tag}", node.url, scenario=sc,
                                   rate=a.cg_rate, connections=1,
                                   duration=f"{n / a.cg_rate:.3f}s", warmup="0s", files=False,
                                   subdir=RAW_SUB, extra=["--timeout", "30s", *extra],
                                   watch={"node": node.pid})

        res = {}
        for sc, (method, extra) in scen.items():
            log(f"callgrind {label}: {sc} warm-up")
            send(f"{sc}-warmup", 200, extra)
        time.sleep(0.5)
        control(cg_control, node.pid, "-z")
        t0 = time.time()
        time.sleep(2.0)
        _, idle_ir = dump(cg_control, node.pid, pfx, seen)
        idle_rate = idle_ir / (time.time() - t0)
        key = 'mcpyard_request_seconds_count{{method="{}",outcome="ok"}}'
        for sc, (method, extra) in scen.items():
            ph = {}
            for tag, n in (("A", a.cg_requests // 2), ("B", a.cg_requests)):
                m0 = node.scrape()
                log(f"callgrind {label}: {sc} phase {tag}, {n} requests")
                control(cg_control, node.pid, "-z")
                r = send(f"{sc}-{tag}", n, extra)
                _, ir = dump(cg_control, node.pid, pfx, seen)
                m1 = node.scrape()
                ph[tag] = {"ir": ir, "wall_s": r["wall_s"],
                           "requests": int(m1.get(key.format(method), 0) - m0.get(key.format(method), 0)),
                           "errors": sum(r["errors"].values())}
            A, B = ph["A"], ph["B"]
            extra_req = B["requests"] - A["requests"]
            per = ((B["ir"] - A["ir"] - idle_rate * (B["wall_s"] - A["wall_s"])) / extra_req
                   if extra_req > 0 else None)
            res[sc] = {"phases": ph, "ir_per_request": per}
        res["idle_ir_per_s"] = idle_rate
        res["exit_code"] = procs.stop(node.p, grace=30)
        out["configs"][label] = res
    return out


# --------------------------------------------------------------------------- fan-out client


class Stream:
    """One session's GET stream: chunked decoding, SSE events, list_changed counted per round
    with the kernel's receive time of the read that completed it."""

    def __init__(self, sock, node, sid, chunked, rest):
        self.sock, self.node, self.sid, self.chunked = sock, node, sid, chunked
        self.raw = bytearray()
        self.sse = bytearray()
        self.need = None  # bytes left in the current chunk (+2 for its CRLF)
        self.closed = False
        self.got = {}  # round -> [receive ns, ...]
        self.other = 0
        if rest:
            self.feed(rest, None, 0)

    def feed(self, data, ts, rnd):
        if not self.chunked:
            self.sse += data
        else:
            self.raw += data
            while True:
                if self.need is None:
                    at = self.raw.find(b"\r\n")
                    if at < 0:
                        break
                    size = int(bytes(self.raw[:at]).split(b";")[0], 16)
                    del self.raw[:at + 2]
                    if size == 0:
                        self.closed = True
                        break
                    self.need = size
                if len(self.raw) < self.need + 2:
                    break
                self.sse += self.raw[:self.need]
                del self.raw[:self.need + 2]
                self.need = None
        while True:
            at = self.sse.find(b"\n\n")
            if at < 0:
                break
            ev = bytes(self.sse[:at])
            del self.sse[:at + 2]
            data = b"\n".join(line[5:].lstrip(b" ") for line in ev.split(b"\n")
                              if line.startswith(b"data:"))
            if not data:
                continue
            try:
                method = json.loads(data).get("method")
            except ValueError:
                method = None
            if method == LIST_CHANGED:
                self.got.setdefault(rnd, []).append(ts)
            else:
                self.other += 1


def read_head(sock, buf):
    while b"\r\n\r\n" not in buf:
        d = sock.recv(65536)
        if not d:
            raise Fail("connection closed before a response head")
        buf += d
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(b":")
        headers[k.strip().lower().decode()] = v.strip().decode()
    return status, headers, bytearray(rest)


def read_response(sock):
    status, headers, buf = read_head(sock, bytearray())
    if "content-length" in headers:
        n = int(headers["content-length"])
        while len(buf) < n:
            d = sock.recv(65536)
            if not d:
                raise Fail("connection closed in a body")
            buf += d
        return status, headers, bytes(buf[:n])
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            while b"\r\n" not in buf:
                buf += sock.recv(65536)
            line, _, rest = bytes(buf).partition(b"\r\n")
            size = int(line.split(b";")[0], 16)
            buf = bytearray(rest)
            while len(buf) < size + 2:
                buf += sock.recv(65536)
            body += buf[:size]
            buf = buf[size + 2:]
            if size == 0:
                return status, headers, bytes(body)
    return status, headers, bytes(buf)


def http_req(method, host, sid, body=None):
    h = [f"{method} /mcp HTTP/1.1", f"Host: {host}",
         "Accept: " + ("text/event-stream" if method == "GET" else
                       "application/json, text/event-stream")]
    if sid:
        h += [f"Mcp-Session-Id: {sid}", f"Mcp-Protocol-Version: {PROTOCOL}"]
    data = b""
    if body is not None:
        data = json.dumps(body).encode()
        h += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    return ("\r\n".join(h) + "\r\n\r\n").encode() + data


def open_stream(node):
    host, port = node.addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    s.sendall(http_req("POST", node.addr, None, {
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": PROTOCOL, "capabilities": {},
                   "clientInfo": {"name": NAME, "version": "1"}}}))
    st, h, body = read_response(s)
    sid = h.get("mcp-session-id")
    if st != 200 or not sid:
        raise Fail(f"{node.name}: initialize http {st} {body[:200]!r}")
    s.sendall(http_req("POST", node.addr, sid, {"jsonrpc": "2.0",
                                               "method": "notifications/initialized"}))
    st, _, body = read_response(s)
    if st != 202:
        raise Fail(f"{node.name}: notifications/initialized http {st}")
    s.sendall(http_req("GET", node.addr, sid))
    st, h, rest = read_head(s, bytearray())
    if st != 200 or not h.get("content-type", "").startswith("text/event-stream"):
        raise Fail(f"{node.name}: GET stream http {st} {h}")
    s.setblocking(False)
    return Stream(s, node.name, sid, h.get("transfer-encoding", "").lower() == "chunked", rest)


def drain(sel, rnd, timeout=0):
    """Reads whatever arrived on every ready stream; returns the number of reads."""
    reads = 0
    for key, _ in sel.select(timeout):
        st = key.data
        while True:
            try:
                data, anc, _flags, _addr = st.sock.recvmsg(65536, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                data, anc = b"", []
            if not data:
                st.closed = True
                sel.unregister(st.sock)
                break
            ts = None
            for lvl, typ, cdata in anc:
                if lvl == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(cdata) >= 16:
                    sec, nsec = struct.unpack("qq", cdata[:16])
                    ts = sec * 1_000_000_000 + nsec
            st.feed(data, ts if ts is not None else time.time_ns(), rnd)
            reads += 1
    return reads


def trigger(fx):
    c = http.client.HTTPConnection(*fx.addr.rsplit(":", 1), timeout=10)
    c.connect()
    t0 = time.time_ns()
    c.request("POST", "/control/tools_changed", body=b"", headers={"content-length": "0"})
    r = c.getresponse()
    body = r.read()
    c.close()
    try:
        told = json.loads(body).get("streams")
    except ValueError:
        told = None
    return t0, r.status, told


def phase_fanout(a, A, B, fx, redis, mon):
    n = a.sessions
    streams = []
    wait_quiet()
    t0 = time.time()
    for node in (A, B):
        log(f"fanout: opening {n} sessions with GET streams on node {node.name}")
        for _ in range(n):
            streams.append(open_stream(node))
    open_s = time.time() - t0
    sel = selectors.EpollSelector()
    for st in streams:
        sel.register(st.sock, selectors.EVENT_READ, st)
    time.sleep(0.5)
    drain(sel, 0)
    pre = sum(len(v) for st in streams for v in st.got.values())
    m0 = {nd.name: nd.scrape() for nd in (A, B)}
    c0 = pgroup_ticks([A.pid, B.pid, redis.pid])
    s0, mo0 = redis.commandstats(), mon.snapshot()
    rounds = []
    for rnd in range(1, a.fan_rounds + 1):
        wait_quiet()
        drain(sel, -rnd)  # anything before the trigger counts as a stray
        trig, status, told = trigger(fx)
        # Read nothing while the nodes fan out (the kernel stamps each arrival), then
        # collect; a session still missing keeps the round open up to 15 s.
        time.sleep(0.4)
        deadline = time.time() + 15
        while True:
            drain(sel, rnd)
            missing = sum(1 for st in streams if rnd not in st.got and not st.closed)
            if not missing or time.time() > deadline:
                break
            time.sleep(0.1)
        time.sleep(1.0)  # a second notification of this round would arrive by now
        drain(sel, rnd)
        per = {}
        for node in ("A", "B"):
            ss = [st for st in streams if st.node == node]
            lat = sorted((min(st.got[rnd]) - trig) / 1e3 for st in ss if rnd in st.got)
            counts = [len(st.got.get(rnd, [])) for st in ss]
            per[node] = {
                "sessions": len(ss), "received": sum(1 for c in counts if c >= 1),
                "exactly_once": sum(1 for c in counts if c == 1),
                "twice_or_more": sum(1 for c in counts if c > 1),
                "none": sum(1 for c in counts if c == 0),
                "p50_us": lat[len(lat) // 2] if lat else None,
                "max_us": lat[-1] if lat else None, "first_us": lat[0] if lat else None,
            }
        stray = sum(len(st.got.get(-rnd, [])) for st in streams)
        rounds.append({"round": rnd, "trigger_status": status, "trigger_told": told,
                       "per_node": per, "stray_before_trigger": stray})
        log(f"fanout round {rnd}: " + "; ".join(
            f"{nd}: {p['received']}/{p['sessions']} (twice {p['twice_or_more']}), p50 "
            f"{(p['p50_us'] or 0) / 1e3:.1f} ms, last {(p['max_us'] or 0) / 1e3:.1f} ms"
            for nd, p in per.items()))
    c1 = pgroup_ticks([A.pid, B.pid, redis.pid])
    s1, mo1 = redis.commandstats(), mon.snapshot()
    m1 = {nd.name: nd.scrape() for nd in (A, B)}
    # What the list changes cost, without the nodes' once-a-second liveness traffic (a
    # PING or a PUBLISH of a heartbeat from mcpyard's own connection, never from a script).
    change = {k: v / a.fan_rounds for k, v in monitor_delta(mo0, mo1).items()
              if k not in ("client ping", "client publish")}
    closed = sum(1 for st in streams if st.closed)
    others = sum(st.other for st in streams)
    for st in streams:
        try:
            sel.unregister(st.sock)
        except (KeyError, ValueError):
            pass
        st.sock.close()
    # End them (DELETE on the node that opened each), so later phases start with none.
    dels = {}
    for node in (A, B):
        c = Http(node.addr)
        for st in streams:
            if st.node == node.name:
                code = c.delete(st.sid)
                dels[code] = dels.get(code, 0) + 1
        c.close()
    cpu = {nm: (sum(c1[p]) - sum(c0[p])) * 1e3 / CLK_TCK / a.fan_rounds
           for nm, p in (("A", A.pid), ("B", B.pid), ("redis", redis.pid))}
    return {
        "sessions_per_node": n, "open_s": open_s, "rounds": rounds, "pre_trigger_events": pre,
        "delete_statuses": {str(k): v for k, v in dels.items()},
        "closed_streams": closed, "other_events": others,
        "notifications_metric": {nd: m1[nd].get("mcpyard_cache_notifications_total", 0)
                                 - m0[nd].get("mcpyard_cache_notifications_total", 0)
                                 for nd in m0},
        "sessions_gauge": {nd: m1[nd].get("mcpyard_sessions") for nd in m1},
        "refreshes": {nd: m1[nd].get("mcpyard_cache_refreshes_ok_total", 0)
                      - m0[nd].get("mcpyard_cache_refreshes_ok_total", 0) for nd in m0},
        "cpu_ms_per_round": cpu,
        "redis_per_round": {k: v["calls"] / a.fan_rounds for k, v in stats_delta(s0, s1).items()},
        "change_per_round": change,
    }


# --------------------------------------------------------------------------- main


def private_binaries():
    """Copies of mcpyard and the loadgen for this run, so a build elsewhere cannot swap
    them while nodes start at different times."""
    gw, lg = binaries()
    d = os.path.join(RAW, f"{NAME}-bin")
    os.makedirs(d, exist_ok=True)
    out = []
    for b in (gw, lg):
        dst = os.path.join(d, os.path.basename(b))
        shutil.copy2(b, dst)
        out.append(dst)
    return out[0], out[1], {os.path.basename(b): time.strftime(
        "%Y-%m-%d %H:%M UTC", time.gmtime(os.path.getmtime(b))) for b in (gw, lg)}


def run(procs):
    a = parse()
    set_quiet(a)
    gw, lg, built = private_binaries()
    nofile, nofile_note = raise_nofile(2 * a.sessions + 4096)
    info = machine_info()
    os.makedirs(os.path.join(RESULTS, RAW_SUB), exist_ok=True)
    data = {"machine": info, "argv": sys.argv[1:], "binaries_built": built,
            "params": {k: v for k, v in vars(a).items() if k != "phase_set"},
            "nofile": nofile, "nofile_note": nofile_note}
    data["params"]["phase_set"] = sorted(a.phase_set)
    data["src_changes"] = subprocess.run(
        ["git", "-C", REPO, "diff", "--stat", "HEAD", "--", "src", "loadgen"],
        capture_output=True, text=True).stdout.strip()
    redis1 = Redis(procs, "cluster")
    data["redis_version"] = redis1.version
    fx = Fixture(procs, lg, f"{NAME}-fixture", ["--result-bytes", str(a.result_bytes)])
    A = Node(procs, gw, "A", redis1, fx)
    B = Node(procs, gw, "B", redis1, fx)
    data["config_example"] = node_config("redis://127.0.0.1:PORT/0", "http://127.0.0.1:PORT/mcp")
    for nd in (A, B):
        check_lists(nd)
    mon = Monitor(redis1.port)
    if "idle" in a.phase_set:
        data["idle"] = phase_idle(a, redis1, mon, [A, B])
    if "fanout" in a.phase_set:
        data["fanout"] = phase_fanout(a, A, B, fx, redis1, mon)
    extra_nodes = []
    if a.phase_set & {"load", "churn"}:
        redis2 = Redis(procs, "no-sessions")
        N = Node(procs, gw, "N", redis2, fx, sessions=False)
        redis3 = Redis(procs, "pair")
        port = free_port()
        pair = [Node(procs, gw, f"R{i}", redis3, fx, listen=f"127.0.0.1:{port}") for i in (1, 2)]
        extra_nodes = [N] + pair
        for nd in [N] + pair:
            check_lists(nd)
        mon3 = Monitor(redis3.port)
        if "load" in a.phase_set:
            data["load"] = phase_load(a, lg, {"A": A, "B": B, "N": N}, fx, redis1, redis2,
                                      {"cluster": mon})
        if "churn" in a.phase_set:
            data["churn"] = phase_churn(a, lg, A, pair, fx, redis1, redis3,
                                        {"cluster": mon, "pair": mon3})
        mon3.stop()
        for x in extra_nodes:  # the nodes before their Redis
            data.setdefault("exit_codes", {})[x.name] = procs.stop(x.p)
        for x in (redis2, redis3):
            x.conn.close()
            procs.stop(x.p)
    if "adopt" in a.phase_set:
        log(f"adopt: {a.adopt_sessions} sessions opened on A, used on B")
        data["adopt"] = phase_adopt(a, A, B)
    if "callgrind" in a.phase_set:
        data["callgrind"] = phase_callgrind(procs, a, gw, lg, fx, redis1)
    mon.stop()
    data["rss_kib_end"] = {nd.name: rss_kib(nd.pid) for nd in (A, B)}
    data["node_log_warnings"] = {}
    for nd in (A, B):
        data["node_log_warnings"][nd.name] = log_warnings(nd.log)
    for nd in (A, B):
        data.setdefault("exit_codes", {})[nd.name] = procs.stop(nd.p)
    for x in extra_nodes:
        data["node_log_warnings"][x.name] = log_warnings(x.log)
    data["machine"]["waited_s"] = QUIET["waited_total_s"]
    md = report(data)
    write_report(NAME, md, strip(data))
    print(summary_text(data))


def log_warnings(path):
    out = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if " WARN " in line or " ERROR " in line:
                    out.append(line.strip()[:300])
    except OSError:
        pass
    return out[:20]


def strip(data):
    """The summary JSON: every run's figures, without its command line (the summaries keep
    one) and without any percentile steps (raw/compare-cluster/ has the generators' files)."""
    d = copy.deepcopy(data)
    d.get("machine", {}).pop("t0", None)
    groups = [x[ph] for x in d.get("load", {}).values() for ph in ("max", "at_rate")]
    groups.append(d.get("churn", {}).get("runs", {}))
    for g in groups:
        for summ in g.values():
            for r in summ.get("rounds", []):
                for k in ("argv", "tag", "service_us", "scenario", "duration_s"):
                    r.pop(k, None)
    return d


def rerender():
    """--report-only: rewrites compare-cluster.md from compare-cluster.json (no measuring)."""
    from perfkit import rerender as perfkit_rerender
    d = perfkit_rerender(NAME, report)
    print(summary_text(d))


# --------------------------------------------------------------------------- report


def load_items(d):
    """Section 1's scenarios in their order (the JSON sorts its keys)."""
    return [(sc, d["load"][sc]) for sc in ("tools-list", "tools-call") if sc in d["load"]]


def us(v):
    return "–" if v is None else f"{v:,.0f}"


def ms(v):
    return "–" if v is None else f"{v / 1e3:,.1f}"


def per_sec(calls, secs):
    return calls / secs if secs else 0.0


def lat_cells(s):
    r = s["response_us"]
    return [us(r["p50"]), us(r["p90"]), us(r["p99"]), f"{us(r['p99_min'])}–{us(r['p99_max'])}",
            us(r["max"])]


def node_cpu(s):
    c = s["cpu_us_per_req"]
    return sum(v or 0 for k, v in c.items() if k.startswith("node"))


def redis_cpu(s):
    c = s["cpu_us_per_req"]
    return sum(v or 0 for k, v in c.items() if k.startswith("redis"))


def load_tables(d):
    L = []
    rows = []
    for sc, x in load_items(d):
        for c in CONFIGS:
            s = x["max"][c]
            cpu = s["cpu_us_per_req"]
            rows.append([f"`{sc}`", c, fmt(s["throughput_rps"]),
                         f"{fmt(s['throughput_min'])}–{fmt(s['throughput_max'])}",
                         us(s["response_us"]["p50"]), us(s["response_us"]["p99"]),
                         f"{node_cpu(s):.1f}", f"{redis_cpu(s):.2f}",
                         f"{cpu.get('fixture') or 0:.1f}", f"{cpu.get('loadgen') or 0:.1f}",
                         fmt(s["machine_busy_pct"]), fmt(s["foreign_busy_pct"], 1),
                         f"{sum(s['errors'].values())}/{s['unsent']}"])
    L.append(table(["request", "configuration", "req/s (median)", "range", "p50 µs", "p99 µs",
                    "mcpyard CPU µs/req (all nodes)", "Redis CPU µs/req", "fixture",
                    "generators", "machine busy %", "foreign %", "errors/unsent"], rows))
    L.append("")
    rows = []
    for sc, x in load_items(d):
        for c in CONFIGS:
            s = x["at_rate"][c]
            rows.append([f"`{sc}`", c, fmt(x["rate"]), fmt(s["throughput_rps"])] + lat_cells(s)
                        + [f"{node_cpu(s):.1f}", fmt(s["foreign_busy_pct"], 1),
                           fmt(s["steal_pct"], 1), f"{sum(s['errors'].values())}/{s['unsent']}"])
    L.append(f"Open loop at a fixed rate, {int(d['params']['rate_fraction'] * 100)} % of the "
             "lower of one-node's and two-nodes' max (two nodes: half the rate on each), "
             "latency from the intended send time, µs, medians over the rounds:\n")
    L.append("(foreign % and stolen % are the worst round's: other work on this VM, and time "
             "the hypervisor gave to other VMs. 1 % of a run is the requests of 1 % of its "
             "time, 40 ms of a 4-second run, so one stall of that order anywhere on the two "
             "cores (the generator, the fixture, Redis or a node descheduled, or the VM) "
             "makes the p99 tens of milliseconds; such rounds occur in every configuration, "
             "and the p99 range shows how far they move it. The p50 is the steady figure.)\n")
    L.append(table(["request", "configuration", "rate/s", "achieved/s", "p50", "p90", "p99",
                    "p99 range", "max", "mcpyard CPU µs/req", "foreign %", "stolen %",
                    "errors/unsent"], rows))
    L.append("")
    return L


def paired(x, y):
    """Median and range of round-by-round ratios y/x of max throughput (the configurations
    take turns, so round k of each ran minutes apart at most)."""
    rs = [b["throughput_rps"] / a["throughput_rps"] for a, b in zip(x["rounds"], y["rounds"])
          if a["throughput_rps"]]
    return f"{median(rs):.2f} ({min(rs):.2f}–{max(rs):.2f})" if rs else "–"


def cost_rows(d):
    """Per-request cost of shared sessions on the owning node: one-node vs no-sessions."""
    rows = []
    for sc, x in load_items(d):
        w, wo = x["max"]["one-node"], x["max"]["no-sessions"]
        rw, rwo = x["at_rate"]["one-node"], x["at_rate"]["no-sessions"]
        rows.append([f"`{sc}`",
                     f"{fmt(w['throughput_rps'])} vs {fmt(wo['throughput_rps'])} "
                     f"({100 * (w['throughput_rps'] / wo['throughput_rps'] - 1):+.1f} %)",
                     paired(wo, w),
                     f"{node_cpu(w):.1f} vs {node_cpu(wo):.1f}",
                     f"{node_cpu(rw):.1f} vs {node_cpu(rwo):.1f}",
                     f"{us(rw['response_us']['p50'])} vs {us(rwo['response_us']['p50'])}",
                     f"{us(rw['response_us']['p99'])} vs {us(rwo['response_us']['p99'])}"])
    return rows


def two_vs_one_rows(d):
    rows = []
    for sc, x in load_items(d):
        o, t = x["max"]["one-node"], x["max"]["two-nodes"]
        ro, rt = x["at_rate"]["one-node"], x["at_rate"]["two-nodes"]
        rows.append([f"`{sc}`",
                     f"{fmt(o['throughput_rps'])} → {fmt(t['throughput_rps'])} "
                     f"({100 * (t['throughput_rps'] / o['throughput_rps'] - 1):+.1f} %)",
                     paired(o, t),
                     f"{node_cpu(o):.1f} → {node_cpu(t):.1f}",
                     f"{us(ro['response_us']['p50'])} → {us(rt['response_us']['p50'])}",
                     f"{us(ro['response_us']['p99'])} → {us(rt['response_us']['p99'])}",
                     fmt(x["rate"])])
    return rows


def redis_windows(d):
    """The windows Redis was measured in: (name, commandstats {cmd: calls}, MONITOR
    {"client cmd"/"lua cmd": n}, seconds, requests, note)."""
    out = []
    if "idle" in d:
        i = d["idle"]
        out.append(("idle, A+B", {k: v["calls"] for k, v in i["commandstats"].items()},
                    i["monitor"], i["seconds"], 0))
    if "load" in d:
        for sc, x in load_items(d):
            for c in ("one-node", "two-nodes"):
                st, mo, secs, reqs = {}, {}, 0.0, 0
                for phase in ("max", "at_rate"):
                    for r in x[phase][c]["rounds"]:
                        secs += r["wall_s"]
                        reqs += r["requests_ok"] + r.get("warmup_requests", 0)
                        for cmd, v in r["redis"]["cluster"].items():
                            st[cmd] = st.get(cmd, 0) + v["calls"]
                        for k, v in r["monitor"].get("cluster", {}).items():
                            mo[k] = mo.get(k, 0) + v
                out.append((f"{sc}, {c}", st, mo, secs, reqs))
    if "churn" in d:
        for c in CHURN:
            red = "cluster" if c == "churn-one-node" else "pair"
            st, mo, secs, reqs = {}, {}, 0.0, 0
            for r in d["churn"]["runs"][c]["rounds"]:
                secs += r["wall_s"]
                reqs += r["requests_ok"] + r.get("warmup_requests", 0)
                for cmd, v in r["redis"][red].items():
                    st[cmd] = st.get(cmd, 0) + v["calls"]
                for k, v in r["monitor"].get(red, {}).items():
                    mo[k] = mo.get(k, 0) + v
            out.append((c.replace("churn-", "no affinity, ") if "two" in c else
                        "churn, one-node", st, mo, secs, reqs))
    return out


def redis_tables(d):
    wins = redis_windows(d)
    client_cmds = {k.split(" ", 1)[1] for w in wins for k in w[2] if k.startswith("client ")}
    lua_cmds = {k.split(" ", 1)[1] for w in wins for k in w[2] if k.startswith("lua ")}
    cmds = sorted({c for w in wins for c in w[1]})
    rows = []
    for cmd in cmds:
        mark = " (in scripts)" if cmd in lua_cmds and cmd not in client_cmds else ""
        rows.append([f"`{cmd.upper()}`{mark}"] +
                    [f"{per_sec(w[1].get(cmd, 0), w[3]):,.2f}" for w in wins])
    rows.append(["**all commands**"] + [f"**{per_sec(sum(w[1].values()), w[3]):,.1f}**"
                                        for w in wins])
    rows.append(["of them round trips from mcpyard (MONITOR)"] + [
        f"{per_sec(sum(v for k, v in w[2].items() if k.startswith('client ')), w[3]):,.1f}"
        for w in wins])
    rows.append(["mcpyard requests/s in the window"] + [
        f"{per_sec(w[4], w[3]):,.0f}" if w[4] else "–" for w in wins])
    t1 = table(["command"] + [f"{w[0]} /s" for w in wins], rows)
    rows = []
    for cmd in sorted(client_cmds):
        rows.append([f"`{cmd.upper()}`"] + [f"{per_sec(w[2].get('client ' + cmd, 0), w[3]):,.2f}"
                                            for w in wins])
    t2 = table(["round trips from mcpyard"] + [f"{w[0]} /s" for w in wins], rows)
    return t1, t2, wins, sorted(lua_cmds)


def report(d):
    p = d["params"]
    L = ["# compare-cluster: mcpyard nodes on one Redis against one node (issue 24)\n"]
    L.append(f"Generated by `perf/compare-cluster.sh` — "
             f"{machine_line(d['machine'], d['machine'].get('waited_s'))} "
             f"Redis {d.get('redis_version')} (Debian `redis-server`, no persistence, its own "
             "port chosen at run time).\n")
    L.append("**Two cores for everything.** Redis, the fixture, every mcpyard node and the "
             "generators share the machine's two cores; each node has **1 worker**. A second "
             "node here adds no CPU, only a second process competing for the same two cores, "
             "so the two-node figures measure what running as a cluster costs, not what it "
             "gains; on real machines each node brings its own cores.\n")
    L.append("Every node's config (ports filled in at run time; node N leaves out `sessions:`, "
             "nodes R1 and R2 listen on one shared port):\n")
    L.append("```yaml\n" + d["config_example"] + "```\n")
    if "load" in d:
        L.append("## 1. Through one node against a two-node cluster\n")
        L.append(f"Cached `tools/list` (answered from the node's copy of the Redis-held list) "
                 f"and `tools/call` of `{TOOL}` ({p['params_bytes']:,}-byte arguments, "
                 f"{p['result_bytes']:,}-byte result) through: **one-node** (node A, "
                 f"{p['connections']} connections), **two-nodes** (A and B, one generator of "
                 f"{max(1, p['connections'] // 2)} connections on each at once, throughput "
                 "summed, latency merged from both generators' histograms), and "
                 "**no-sessions** (node N, the same config without `sessions:`, its own Redis). "
                 f"{p['rounds']} rounds, the configurations taking turns; closed loop "
                 f"{p['max_duration']}, open loop {p['rate_duration']}, {p['warmup']} warm-up "
                 "each; medians (each percentile on its own). CPU µs/req is each process "
                 "group's utime+stime during the run (10 ms ticks) over the requests; Redis's "
                 "includes feeding this script's MONITOR connection (section 3), which copies "
                 "every command it runs.\n")
        L.append("Max throughput, closed loop:\n")
        L += load_tables(d)
        L.append("**Two nodes against one** (same run; max throughput, mcpyard CPU per "
                 "request summed over the nodes, p50 and p99 at the fixed rate):\n")
        L.append(table(["request", "req/s one → two nodes", "two/one, round by round",
                        "mcpyard CPU µs/req",
                        "p50 µs at the rate", "p99 µs", "rate/s"], two_vs_one_rows(d)))
        L.append("")
        L.append("**What shared sessions cost the node that owns the session** (node A with "
                 "`sessions: { store: shared }` vs node N without, same run, same load):\n")
        L.append(table(["request", "max req/s with vs without",
                        "with/without, round by round: median (range)", "CPU µs/req at max",
                        "CPU µs/req at the rate", "p50 µs at the rate", "p99 µs"], cost_rows(d)))
        L.append("")
    if "callgrind" in d:
        L += report_callgrind(d)
    if "churn" in d:
        L += report_churn(d)
    if "adopt" in d:
        L += report_adopt(d)
    if "fanout" in d:
        L += report_fanout(d)
    if "idle" in d or "load" in d:
        L += report_redis(d)
    L += report_checks(d)
    L.append("## Commands\n")
    L.append("```sh\nperf/compare-cluster.sh " + " ".join(d.get("argv", [])) + "\n```\n")
    ex = []
    if "load" in d:
        x = d["load"]["tools-call"]
        ex += x["max"]["two-nodes"]["argv"] + x["at_rate"]["one-node"]["argv"]
    if "churn" in d:
        ex += d["churn"]["runs"]["churn-two-nodes"]["argv"]
    if ex:
        L.append("Generator command lines (addresses chosen at run time):\n")
        L.append("```sh\n" + "\n".join(loadgen_cmd(x) for x in ex) + "\n```\n")
    L.append(f"Each generator's JSON: `perf/results/{RAW_SUB}/`; node logs, configs and Redis "
             "logs: `perf/results/raw/` (neither is committed).\n")
    return "\n".join(L)


def report_callgrind(d):
    c = d["callgrind"]
    L = ["### Instructions per request with and without shared sessions (callgrind)\n"]
    L.append(f"The same comparison without the machine's noise: a node (1 worker, **epoll**, "
             "since valgrind cannot follow io_uring's shared rings) under `valgrind "
             "--tool=callgrind`, once with `sessions: { store: shared }` and once without, "
             f"both in the Redis cluster above; one connection, open loop at {c['rate']}/s; per "
             f"request type, {c['requests'] // 2:,} then {c['requests']:,} requests between "
             "`callgrind_control -z` and `-d`, and (B − A) over the extra requests less the "
             "idle instructions of B's extra wall time, as `perf/callgrind.sh` does (the "
             "session each generator run opens cancels out). All threads of the node, user "
             "space only. " + c["valgrind"] + ".\n")
    rows = []
    for sc in ("tools-list", "tools-call"):
        w = c["configs"].get("sessions", {}).get(sc, {}).get("ir_per_request")
        wo = c["configs"].get("no-sessions", {}).get(sc, {}).get("ir_per_request")
        if w is None or wo is None:
            continue
        rows.append([f"`{sc}`", f"{w:,.0f}", f"{wo:,.0f}", f"{w - wo:+,.0f} ({100 * (w / wo - 1):+.1f} %)"])
    L.append(table(["request", "instructions / request with `sessions:`", "without",
                    "difference"], rows))
    L.append("")
    L.append("Idle instructions per second (timers, the store's liveness): " + ", ".join(
        f"{k} {v['idle_ir_per_s']:,.0f}" for k, v in c["configs"].items()) + ".\n")
    return L


def report_churn(d):
    c = d["churn"]
    L = ["### A load balancer without affinity: sessions used on both nodes\n"]
    L.append(f"Nodes R1 and R2 (its own Redis) listen on one port with SO_REUSEPORT, so the "
             "kernel hands each new connection to either; the generator opens a **new "
             "connection per request** and ends each session (DELETE) after "
             f"{c['session_calls']} calls, so nearly every session is opened on one node and "
             "used, adopted, on both. Against node A alone with the same flags (a new "
             "connection per request costs both the same). Closed loop, "
             f"{d['params']['connections']} connections; medians of "
             f"{d['params']['rounds']} rounds.\n")
    rows = []
    for name in CHURN:
        s = c["runs"][name]
        mets = s["metrics"]
        created = sum(sum(m[n]["sessions_created_total"] for n in m) for m in mets)
        adopted = sum(sum(m[n]["sessions_adopted_total"] for n in m) for m in mets)
        up_adopt = sum(sum(m[n]["upstream_adopted_total"] for n in m) for m in mets)
        fails = sum(sum(m[n]["session_store_failures_total"] for n in m) for m in mets)
        opened = created - adopted
        calls = sum(r["requests_ok"] for r in s["rounds"])
        gen = sum(r["requests_ok"] + r.get("warmup_requests", 0) for r in s["rounds"]) / c["session_calls"]
        rcalls = sum(s["redis_calls"])
        rows.append([name.replace("churn-", ""), fmt(s["throughput_rps"]),
                     us(s["response_us"]["p50"]), us(s["response_us"]["p99"]),
                     f"{node_cpu(s):.1f}", f"{redis_cpu(s):.2f}", f"{fmt(opened)} ({gen:,.0f})", fmt(adopted),
                     fmt(up_adopt),
                     f"{rcalls / opened:.1f}" if opened else "–",
                     f"{rcalls / calls:.2f}" if calls else "–", fmt(fails),
                     f"{sum(s['errors'].values())}/{s['unsent']}"])
    L.append(table(["configuration", "calls/s", "p50 µs", "p99 µs", "mcpyard CPU µs/call",
                    "Redis CPU µs/call", "sessions opened (generator's)", "adopted by the other node",
                    "upstream sessions adopted", "Redis commands / session",
                    "Redis commands / call", "store failures", "errors/unsent"], rows))
    L.append("")
    two = c["runs"]["churn-two-nodes"]["metrics"]
    ad_ = sum(sum(m[n]["sessions_adopted_total"] for n in m) for m in two)
    up_ = sum(sum(m[n]["upstream_adopted_total"] for n in m) for m in two)
    if ad_:
        L.append(f"Upstream sessions taken up from a record instead of opened: {int(up_):,} for "
                 f"{int(ad_):,} adoptions ({100 * up_ / ad_:.0f} %). A cached proxy opens a route "
                 "at its first call, so a session taken up before any call has no upstream "
                 "session to take; whether the other node then reuses the first one opened is "
                 "what the single-request test below shows.\n")
    L.append("Sessions opened = `mcpyard_sessions_created_total` − `…_adopted_total`, summed "
             "over the rounds and nodes; the latency includes each session's initialize, "
             "initialized and DELETE round trips (the generator counts calls only), and every "
             "request's TCP connect. Redis commands include those run inside scripts "
             "(see section 3).\n")
    return L


def report_adopt(d):
    ad = d["adopt"]
    L = ["### Taking a session up on another node (single requests)\n"]
    L.append(f"{ad['sessions']} sessions opened on node A (initialize + initialized), then one "
             "request at a time from Python (`http.client`, a keep-alive connection per node; "
             "the client's own time is in every figure alike, so compare the columns). "
             "µs:\n")
    rows = []
    for part, title in (("owner_first", "A opens route `a` first"),
                        ("other_first", "the first call goes to B")):
        lat = ad[part]["latency_us"]
        for col in [c for c in ADOPT_COLUMNS[part] if c in lat] + \
                [c for c in lat if c not in ADOPT_COLUMNS[part]]:
            q = lat[col]
            rows.append([title, col, us(q["p50"]), us(q["p90"]), us(q["p99"]), us(q["max"])])
    L.append(table(["order", "request", "p50", "p90", "p99", "max"], rows))
    L.append("")
    for part, title in (("owner_first", "A opens route `a` first"),
                        ("other_first", "the first call goes to B")):
        g = ad[part]["gauges_delta"]
        L.append(f"- {title}: node A " + ", ".join(f"{k} {v:+,.0f}" for k, v in g["A"].items() if v)
                 + "; node B " + ", ".join(f"{k} {v:+,.0f}" for k, v in g["B"].items() if v) + ".")
    de = ad["delete"]
    L.append(f"- DELETE of all {2 * ad['sessions']} on A: statuses {de['statuses']}; B's sessions "
             f"back to {fmt(de['sessions_after_delete']['B'])} (before the test "
             f"{fmt(de['sessions_before_test']['B'])}) after "
             f"{'%.1f s' % de['b_released_after_s'] if de['b_released_after_s'] is not None else 'more than 5 s'}; "
             f"upstream sessions A {fmt(de['upstream_sessions_before_test']['A'])} → "
             f"{fmt(de['upstream_sessions_after_delete']['A'])}, B "
             f"{fmt(de['upstream_sessions_before_test']['B'])} → "
             f"{fmt(de['upstream_sessions_after_delete']['B'])}; a call on B for a deleted "
             f"session: http {de['b_status_after_delete']}.")
    for part, first, then in (("owner_first", "A", "B"), ("other_first", "B", "A")):
        g = ad[part]["gauges_delta"]
        opened = {n: g[n]["upstream_sessions"] - g[n]["upstream_adopted_total"] for n in g}
        took = g[then]["upstream_adopted_total"]
        verdict = ("one upstream session per agent session" if opened[then] <= 0 else
                   f"**{fmt(opened[then])} agent sessions with a second upstream session** "
                   "(one per node; the record names the last writer's)")
        L.append(f"- **Upstream sessions, {first} calls first:** {first} opened "
                 f"{fmt(opened[first])} upstream sessions for route `a`; {then} then took up "
                 f"{fmt(took)} of them and opened {fmt(max(0, opened[then]))} of its own: "
                 f"{verdict}.")
    L.append(f"- Requests that failed: {ad['failure_count']}" +
             (": " + "; ".join(f"`{x}`" for x in ad["failures"][:5]) if ad["failures"] else "") + ".\n")
    return L


def report_fanout(d):
    f = d["fanout"]
    L = [f"## 2. list_changed fan-out to 2 × {f['sessions_per_node']:,} sessions\n"]
    L.append(f"{f['sessions_per_node']:,} sessions with a GET stream on each of nodes A and B "
             f"(opened in {f['open_s']:.1f} s), one socket per session in this script's own "
             "client. Each round POSTs the fixture's `/control/tools_changed`: its tool list "
             "moves to the next revision and it tells its open GET streams — the cluster's one "
             "hydration session, held by whichever node has the lease — so that node lists "
             "again, writes the list to Redis, and both nodes, woken by the store's change "
             "channel, read it and tell each of their sessions. Times are from sending the "
             "trigger (CLOCK_REALTIME) to the kernel's receive timestamp of each session's "
             "event (SO_TIMESTAMPNS); the client reads nothing for 0.4 s after the trigger "
             "and then collects, so it takes no CPU from the nodes while they fan out. Every "
             "round waits 1 s after the last receipt and counts each session's list_changed.\n")
    rows = []
    for r in f["rounds"]:
        for nd, p in r["per_node"].items():
            rows.append([r["round"], nd, f"{p['received']:,} / {p['sessions']:,}",
                         fmt(p["exactly_once"]), fmt(p["twice_or_more"]), fmt(p["none"]),
                         ms(p["first_us"]), ms(p["p50_us"]), f"**{ms(p['max_us'])}**",
                         fmt(r["trigger_told"])])
    L.append(table(["round", "node", "received / sessions", "exactly once", "twice or more",
                    "none", "first ms", "p50 ms", "last ms", "trigger told"], rows))
    L.append("")
    med = {}
    for nd in ("A", "B"):
        med[nd] = (median([r["per_node"][nd]["p50_us"] for r in f["rounds"]]),
                   median([r["per_node"][nd]["max_us"] for r in f["rounds"]]))
    L.append("Medians over the rounds: " + "; ".join(
        f"node {nd} p50 **{ms(a)} ms**, last **{ms(b)} ms**" for nd, (a, b) in med.items()) + ". "
        f"mcpyard CPU per round: A {f['cpu_ms_per_round']['A']:.0f} ms, B "
        f"{f['cpu_ms_per_round']['B']:.0f} ms, Redis {f['cpu_ms_per_round']['redis']:.0f} ms; "
        "`mcpyard_cache_notifications_total` over all rounds: " + ", ".join(
            f"{nd} {fmt(v)}" for nd, v in f["notifications_metric"].items()) +
        f" (expected {f['sessions_per_node'] * len(f['rounds']):,} each: this phase runs "
        "right after the idle one, so each node's only sessions are these; sessions gauge "
        + ", ".join(f"{nd} {fmt(v)}" for nd, v in f["sessions_gauge"].items()) + "); refreshes " +
        ", ".join(f"{nd} {fmt(v)}" for nd, v in f["refreshes"].items()) +
        "; Redis commands per list change (MONITOR, without the nodes' once-a-second "
        "liveness commands): " + ", ".join(
            f"{k.split(' ', 1)[1].upper()}{' (script)' if k.startswith('lua') else ''} {v:.1f}"
            for k, v in sorted(f.get("change_per_round", {}).items())) +
        f". Streams closed: {f['closed_streams']}; list_changed before a trigger: "
        f"{f['pre_trigger_events']}; other events: {f['other_events']}; the sessions "
        f"ended afterwards with DELETE: http {f.get('delete_statuses')}.\n")
    return L


def report_redis(d):
    L = ["## 3. Redis operations per second\n"]
    t1, t2, wins, lua = redis_tables(d)
    L.append("Every command Redis ran, per second of each window, from `INFO commandstats` "
             "deltas: the cluster's Redis (nodes A and B) for idle and the load of section 1, "
             "the pair's own Redis for the no-affinity column. Redis counts the commands run "
             "inside mcpyard's scripts (`EVALSHA`: here " + ", ".join(f"`{c.upper()}`" for c in lua)
             + ") as well, so the rows add up to more than mcpyard's round trips, which a "
             "MONITOR connection counted by source (mcpyard's connection or `lua`). The "
             "load columns are section 1's closed-loop and fixed-rate runs together (between "
             "runs nothing runs); idle is "
             f"{d['idle']['seconds']:.0f} s with nodes A and B only, no sessions, cache TTL {TTL}.\n"
             if "idle" in d else "")
    L.append(t1)
    L.append("")
    L.append("Round trips from mcpyard by command (MONITOR):\n")
    L.append(t2)
    L.append("")
    L.append(sizing_text(d, wins))
    return L


def sizing_text(d, wins):
    """What the windows say per event: per session opened, per list change, at rest."""
    parts = []
    if "idle" in d:
        i = d["idle"]
        tot = sum(v["calls"] for v in i["commandstats"].values())
        parts.append(f"At rest two nodes of 1 worker cost Redis {tot / i['seconds']:.2f} "
                     "commands/s (" + ", ".join(f"{k} {v['calls'] / i['seconds']:.2f}/s" for k, v in
                                                sorted(i["commandstats"].items())) + ")")
    if "churn" in d:
        for c in CHURN:
            s = d["churn"]["runs"][c]
            red = "cluster" if c == "churn-one-node" else "pair"
            sess = sum(sum(m[n]["sessions_created_total"] - m[n]["sessions_adopted_total"]
                           for n in m) for m in s["metrics"])
            cmds = sum(sum(v["calls"] for v in r["redis"][red].values()) for r in s["rounds"])
            rts = sum(sum(v for k, v in r["monitor"].get(red, {}).items()
                          if k.startswith("client ")) for r in s["rounds"])
            if sess:
                parts.append(f"{'one node' if 'one' in c else 'two nodes without affinity'}: "
                             f"{cmds / sess:.1f} commands ({rts / sess:.1f} round trips) per "
                             f"session of {d['churn']['session_calls']} calls")
    if "fanout" in d:
        f = d["fanout"]
        ch = f.get("change_per_round", {})
        parts.append(f"a list change: {sum(ch.values()):.0f} commands "
                     f"({sum(v for k, v in ch.items() if k.startswith('client ')):.0f} round trips)")
    if "load" in d:
        rts = reqs = 0
        cmds = set()
        for name, st, mo, secs, rq in wins:
            if name.startswith("tools-"):
                rts += sum(v for k, v in mo.items() if k.startswith("client "))
                reqs += rq
                cmds |= {k[7:].upper() for k, v in mo.items() if k.startswith("client ")}
        if reqs:
            parts.append(f"under section 1's load: {rts:,} round trips for {reqs:,} requests "
                         f"({1000 * rts / reqs:.2f} per 1,000; {', '.join(sorted(cmds))}), which "
                         "is the generators' session openings (8 per run: the record written, "
                         "and again when a call adds its route) and the nodes' liveness, not "
                         "the requests")
    return ("**Sizing.** " + "; ".join(parts) + ". So Redis load ≈ the rest figure × nodes/2 "
            "+ sessions opened per second × the per-session figure + list changes × the "
            "per-change figure.\n")


def report_checks(d):
    L = ["## Checks\n"]
    items = []
    if "fanout" in d:
        f = d["fanout"]
        twice = sum(p["twice_or_more"] for r in f["rounds"] for p in r["per_node"].values())
        none = sum(p["none"] for r in f["rounds"] for p in r["per_node"].values())
        items.append(f"fan-out: {twice} session-rounds got list_changed more than once, {none} "
                     f"got none, {f['pre_trigger_events']} before a trigger "
                     f"({f['sessions_per_node'] * 2:,} sessions × {len(f['rounds'])} rounds)")
    if "adopt" in d:
        items.append(f"adopt: {d['adopt']['failure_count']} requests on the second node failed "
                     "(404 or other)")
    for sec in ("load", "churn"):
        if sec in d:
            groups = d[sec].values() if sec == "load" else [d["churn"]["runs"]]
            errs = 0
            for g in groups:
                for key in ("max", "at_rate") if sec == "load" else [None]:
                    for s in (g[key].values() if key else g.values()):
                        errs += sum(s["errors"].values())
            items.append(f"{sec}: {errs} generator errors")
    warn = {k: v for k, v in d.get("node_log_warnings", {}).items() if v}
    items.append("node logs: " + ("no WARN or ERROR line" if not warn else "; ".join(
        f"{k}: `{v[0]}`" + (f" (+{len(v) - 1} more)" if len(v) > 1 else "") for k, v in warn.items())))
    items.append(f"exit codes on SIGTERM: {d.get('exit_codes')}")
    L += [f"- {x}" for x in items]
    L.append("")
    return L


def summary_text(d):
    """The main figures side by side, for the terminal."""
    L = ["", "reproduce: perf/compare-cluster.sh " + " ".join(d.get("argv", [])), ""]
    if "load" in d:
        L.append(f"{'request':<11} {'config':<12} {'max req/s':>10} {'CPU µs/req':>11} "
                 f"{'rate/s':>7} {'p50 µs':>7} {'p99 µs':>7}")
        for sc, x in load_items(d):
            for c in CONFIGS:
                s, r = x["max"][c], x["at_rate"][c]
                L.append(f"{sc:<11} {c:<12} {s['throughput_rps']:>10,.0f} {node_cpu(s):>11.1f} "
                         f"{x['rate']:>7,} {r['response_us']['p50']:>7,.0f} "
                         f"{r['response_us']['p99']:>7,.0f}")
    if "churn" in d:
        for c in CHURN:
            s = d["churn"]["runs"][c]
            L.append(f"{c:<24} {s['throughput_rps']:>10,.0f} calls/s, CPU {node_cpu(s):.1f} µs/call")
    if "fanout" in d:
        f = d["fanout"]
        for nd in ("A", "B"):
            L.append(f"fan-out node {nd}: p50 {ms(median([r['per_node'][nd]['p50_us'] for r in f['rounds']]))} ms, "
                     f"last {ms(median([r['per_node'][nd]['max_us'] for r in f['rounds']]))} ms, "
                     f"twice {sum(r['per_node'][nd]['twice_or_more'] for r in f['rounds'])}, "
                     f"none {sum(r['per_node'][nd]['none'] for r in f['rounds'])}")
    if "callgrind" in d:
        for sc in ("tools-list", "tools-call"):
            v = {k: c.get(sc, {}).get("ir_per_request") for k, c in d["callgrind"]["configs"].items()}
            L.append(f"callgrind {sc}: instructions/request with sessions "
                     f"{(v.get('sessions') or 0):,.0f}, without {(v.get('no-sessions') or 0):,.0f}")
    if "adopt" in d:
        for part in ("owner_first", "other_first"):
            lat = d["adopt"][part]["latency_us"]
            for col, q in [(c, lat[c]) for c in ADOPT_COLUMNS[part] if c in lat]:
                L.append(f"adopt {col:<40} p50 {q['p50']:>7,.0f} µs  p99 {q['p99']:>7,.0f} µs")
        L.append(f"adopt: {d['adopt']['failure_count']} failed requests")
    if "idle" in d or "load" in d or "churn" in d:
        for name, st, mo, secs, reqs in redis_windows(d):
            L.append(f"Redis {name}: {per_sec(sum(st.values()), secs):,.1f} commands/s, "
                     f"{per_sec(sum(v for k, v in mo.items() if k.startswith('client ')), secs):,.1f} "
                     f"round trips/s" + (f" at {per_sec(reqs, secs):,.0f} requests/s" if reqs else ""))
    return "\n".join(L)


if __name__ == "__main__":
    if sys.argv[1:] == ["--report-only"]:
        rerender()
    else:
        main_guard("compare-cluster.sh", run)
