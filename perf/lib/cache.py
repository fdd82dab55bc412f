"""compare-cache: the proxy's list cache against nginx serving the same bytes, and list_changed
fan-out to thousands of sessions after a real change of an upstream's list.

Phase `list`, for each list size (2 routes x 50 tools, then 2 x 5,000): two fixtures behind
a caching proxy (server -> proxy with `cache:` -> two clients), mcpyard 1 worker on io_uring
and on epoll. The exact body mcpyard answers to one tools/list (id included) is captured and
nginx (1 worker) serves exactly those bytes from a file for every POST. The generator loads
all three: closed loop for the max throughput, then open loop at 50 % of mcpyard's (uring)
max, the same rate for all, round-robin over rounds; nginx is loaded with `--no-initialize
--request-id <the captured id>` (no session, every request the id the bytes answer).

Phase `fanout`, for 1,000 and 10,000 sessions: the loadgen `fanout` scenario opens the
sessions (each: initialize, initialized, GET stream) through the caching proxy, then POSTs
fixture `a`'s /control/tools_changed, which moves its tool list to the next revision and
tells its open GET streams (the cache's hydration session: one) that the list changed; the
proxy re-lists both routes, stores the merged list, and every worker's watcher sees a new
CRC and tells each of its sessions once. The loadgen times each session's receipt from the
trigger. Beside it: mcpyard's CPU per round, the cache metrics, a `perf` profile of one
worker during the rounds (what share is the kernel's TCP send), and the floor: one thread
writing the same event to as many loopback TCP connections with plain send() calls.

Phase `breakdown` (only with --timing-bin): the same fan-out with binaries built from
perf/fanout-timing.patch, which print CLOCK_MONOTONIC stamps at each stage (trigger, fixture,
hydration, refresh, store, watcher, announce, each relay, each event pushed, each SSE write,
each receipt), so the time to the last session is split into where it went.
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
import subprocess
import sys
import signal
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import drop_percentiles as perfkit_drop_percentiles  # noqa: E402
from perfkit import rerender as perfkit_rerender  # noqa: E402
from perfkit import errs  # noqa: E402,F401
from perfkit import (  # noqa: E402
    CLK_TCK, RAW, RESULTS, Fail, Fixture, Gateway, add_quiet_args, binaries, fd_count, fmt, group_pids,
    free_port, gateway_config, loadgen, loadgen_cmd, log, machine_info, machine_line,
    main_guard, nginx_head, pgroup_ticks, raise_nofile, rss_kib, set_quiet, system_ticks, table,
    wait_for_line, wait_port, wait_quiet, write_report,
)
from hops import lat, median, summarize  # noqa: E402

NAME = "compare-cache"
RAW_SUB = "raw/" + NAME  # every run's loadgen .json/.hgrm/.svg and logs (not committed)
# The id of the captured tools/list: six digits, as long as the ids the generator's
# sessions send during most of a run, so both sides' bodies are within a byte or two.
REQUEST_ID = 100000
BASE = "mcpyard-uring"
TARGETS = ["mcpyard-uring", "mcpyard-epoll", "nginx"]
THROUGHPUT_TARGET = 0.9  # cached tools/list max throughput at least this share of nginx's
P99_TARGET_US = 1000  # p99 at 50 % of mcpyard's max below this
FANOUT_TARGET_MS = 50  # time to the last of 10,000 sessions at most this
FANOUT_TOOLS = 50  # tools per fixture in the fan-out phase
TTL = "5m"  # the cache TTL: longer than any run, so only the trigger refreshes
# The SSE event mcpyard writes for a cached list_changed, chunked (what the floor sends).
FLOOR_CHUNK = (b'5a\r\nid: 0.3\ndata: {"jsonrpc":"2.0","method":"notifications/tools/'
               b'list_changed"}\n\n\r\n')


def parse():
    ap = argparse.ArgumentParser(prog="compare-cache.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=8, help="loadgen connections (default 8)")
    ap.add_argument("--max-duration", default="3s", help="closed-loop run length (default 3s)")
    ap.add_argument("--rate-duration", default="4s", help="open-loop run length (default 4s)")
    ap.add_argument("--warmup", default="0.5s", help="warm-up before every run (default 0.5s)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="list phase: runs per target, round-robin; medians shown (3)")
    ap.add_argument("--retry-foreign", type=float, default=15.0,
                    help="run again (once) when other work used more than this %% of the machine "
                         "during a run (default 15)")
    ap.add_argument("--sizes", default="50,5000",
                    help="tools per fixture in the list phase, comma-separated (50,5000)")
    ap.add_argument("--page-size", type=int, default=1000,
                    help="the fixtures' tools/list page size, for lists longer than it (1000)")
    ap.add_argument("--sessions", default="1000,10000",
                    help="fan-out session counts, comma-separated (1000,10000)")
    ap.add_argument("--fan-rounds", type=int, default=5, help="fan-out rounds per run (5)")
    ap.add_argument("--fan-io", default="uring,epoll", help="fan-out mcpyard io modes (uring,epoll)")
    ap.add_argument("--fan-workers2", action=argparse.BooleanOptionalAction, default=True,
                    help="also fan out to the most sessions with 2 workers (uring) (default on)")
    ap.add_argument("--phases", default="list,fanout",
                    help="comma-separated subset of list,fanout,breakdown (default list,fanout; "
                         "breakdown needs --timing-bin)")
    ap.add_argument("--timing-bin", default=None,
                    help="a directory with mcpyard and mcpyard-loadgen built from "
                         "perf/fanout-timing.patch; adds the breakdown phase")
    ap.add_argument("--no-profile", action="store_true", help="skip the perf profile of the fan-out")
    add_quiet_args(ap)
    return ap.parse_args()


# --------------------------------------------------------------------------- helpers


def fixture_args(tools, page_size):
    args = ["--tools", str(tools)]
    return args + (["--page-size", str(page_size)] if tools > page_size else [])


def routes_of(fa, fb):
    return [("a", fa.url), ("b", fb.url)]


class McpHttp:
    """A minimal MCP client on one keep-alive connection (http.client, standard library)."""

    def __init__(self, url, timeout=30):
        m = re.match(r"http://([^/]+)(/.*)", url)
        if not m:
            raise Fail(f"not an http URL: {url}")
        host, port = m.group(1).rsplit(":", 1)
        self.path = m.group(2)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
        self.session = None

    def post(self, body, headers=None):
        h = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
        if self.session:
            h["mcp-session-id"] = self.session
            h["mcp-protocol-version"] = "2025-11-25"
        h.update(headers or {})
        self.conn.request("POST", self.path, body=json.dumps(body).encode(), headers=h)
        r = self.conn.getresponse()
        data = r.read()
        return r.status, dict((k.lower(), v) for k, v in r.getheaders()), data

    def open(self):
        status, headers, body = self.post({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "compare-cache", "version": "1"}}})
        if status != 200 or "mcp-session-id" not in headers:
            raise Fail(f"initialize: http {status} {body[:200]!r}")
        self.session = headers["mcp-session-id"]
        status, _, _ = self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        if status != 202:
            raise Fail(f"notifications/initialized: http {status}")

    def close(self):
        if self.session:
            self.conn.request("DELETE", self.path, headers={"mcp-session-id": self.session})
            self.conn.getresponse().read()
        self.conn.close()


def capture_list(url, tools):
    """The exact tools/list body (id REQUEST_ID) a caching proxy answers, checked: 2 x tools
    items, `a__` then `b__`. Returns (body bytes, response headers)."""
    c = McpHttp(url)
    try:
        c.open()
        status, headers, body = c.post({"jsonrpc": "2.0", "id": REQUEST_ID, "method": "tools/list"})
    finally:
        c.close()
    if status != 200 or not headers.get("content-type", "").startswith("application/json"):
        raise Fail(f"tools/list of {url}: http {status}, {headers.get('content-type')}")
    v = json.loads(body)
    names = [t["name"] for t in v["result"]["tools"]]
    want = [f"a__{n}" for n in ("echo", "big")][:tools]
    if len(names) != 2 * tools or names[:len(want)] != want or \
            sum(n.startswith("a__") for n in names) != tools or \
            sum(n.startswith("b__") for n in names) != tools or v.get("id") != REQUEST_ID:
        raise Fail(f"tools/list of {url}: {len(names)} items, first {names[:3]}, id {v.get('id')}")
    return body, headers


# --------------------------------------------------------------------------- nginx


class StaticNginx:
    """nginx answering every POST to /mcp with the bytes of one file (1 worker, foreground)."""

    def __init__(self, procs, nginx_bin, name, body, workers=1):
        prefix = tempfile.mkdtemp(prefix=f"mcpyard-perf-{name}-")
        procs.cleanups.append(lambda: shutil.rmtree(prefix, ignore_errors=True))
        self.body_path = os.path.join(prefix, "tools-list.json")
        with open(self.body_path, "wb") as f:
            f.write(body)
        # nginx's worker drops root for an unprivileged user, which must read the file.
        os.chmod(prefix, 0o755)
        os.chmod(self.body_path, 0o644)
        for _attempt in range(5):
            port = free_port()
            conf = os.path.join(prefix, "nginx.conf")
            with open(conf, "w") as f:
                f.write(static_conf(prefix, port, self.body_path, workers))
            out = os.path.join(RAW, f"{name}.log")
            self.p = procs.start(name, [nginx_bin, "-p", prefix, "-c", conf, "-e",
                                        os.path.join(prefix, "error.log")], out)
            if wait_port(port, self.p):
                break
            procs.stop(self.p)
        else:
            raise Fail(f"nginx did not start; see {prefix}/error.log")
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.pid = self.p.pid


def static_conf(prefix, port, body_path, workers):
    # The static module answers a POST with 405; `error_page 405 =200 $uri` turns that into
    # an internal GET of the same file answered 200 (the usual way to serve a file to POST).
    # keepalive_requests: nginx closes a connection after 1,000 requests by default, and the
    # generator would then reconnect; mcpyard has no such limit.
    return nginx_head(prefix, workers) + f"""    types {{ }}
    default_type application/json;
    etag off;
    sendfile on;
    keepalive_requests 10000000;
    open_file_cache max=16 inactive=600s;
    open_file_cache_valid 600s;
    server {{
        listen 127.0.0.1:{port};
        location = /mcp {{
            alias {body_path};
            error_page 405 =200 $uri;
        }}
    }}
}}
"""


# --------------------------------------------------------------------------- phase: list


class Target:
    def __init__(self, name, url, pid, extra=()):
        self.name, self.url, self.pid, self.extra = name, url, pid, list(extra)


def one(a, lg, tag, t, rate, duration, fixture_pids):
    """One tools-list run against t; once more if other work disturbed it."""
    watch = {f"fixture{i}": pid for i, pid in enumerate(fixture_pids)}
    watch["target"] = t.pid
    for attempt in range(2):
        log(f"{tag}: {t.name} {'rate ' + str(rate) if rate else 'closed loop'}")
        r = loadgen(lg, f"{tag}-{t.name}", t.url, scenario="tools-list", rate=rate,
                    connections=a.connections, duration=duration, warmup=a.warmup, watch=watch,
                    extra=t.extra, subdir=RAW_SUB)
        n = r["requests_ok"] + sum(r["errors"].values())
        fx = sum(v for k, v in r["cpu_us"].items() if k.startswith("fixture"))
        r["cpu_us_per_req"] = {"fixture": fx / n if n else None}
        for k in ("target", "loadgen"):
            r["cpu_us_per_req"][k] = r["cpu_us"][k] / n if n else None
            for part, v in r["cpu_split_us"][k].items():
                r["cpu_us_per_req"][f"{k}_{part}"] = v / n if n else None
        r["attempt"] = attempt + 1
        if r["foreign_busy_pct"] <= a.retry_foreign:
            break
        log(f"{tag}: {t.name}: {r['foreign_busy_pct']:.0f} % of the machine was busy with "
            "other work during the run; running it again")
    return r


def rounds(a, lg, tag, targets, rate, duration, fixture_pids):
    runs = {t.name: [] for t in targets}
    for k in range(a.rounds):
        for t in targets:
            runs[t.name].append(one(a, lg, f"{tag}-{k + 1}", t, rate, duration, fixture_pids))
    out = {}
    for name, rs in runs.items():
        s = summarize(rs)
        s["machine_busy_pct"] = median([x["machine_busy_pct"] for x in rs])
        out[name] = s
    return out


def rate_at(base, fraction):
    step = 10 if base >= 200 else 1
    return max(step, int(round(base * fraction / step)) * step)


def phase_list(procs, a, gw, lg, nginx_bin, tools):
    fa = Fixture(procs, lg, f"cache-list{tools}-fixture-a", fixture_args(tools, a.page_size))
    fb = Fixture(procs, lg, f"cache-list{tools}-fixture-b", fixture_args(tools, a.page_size))
    gws = {io: Gateway(procs, gw, f"cache-list{tools}-mcpyard-{io}", None, io=io,
                       routes=routes_of(fa, fb), cache=TTL) for io in ("uring", "epoll")}
    bodies = {io: capture_list(g.url, tools) for io, g in gws.items()}
    body, headers = bodies["uring"]
    if bodies["epoll"][0] != body:
        raise Fail(f"{tools}: the uring and epoll proxies answered different bytes")
    ngx = StaticNginx(procs, nginx_bin, f"cache-list{tools}-nginx", body)
    # nginx's answer must be the same bytes.
    c = McpHttp(ngx.url)
    status, nheaders, nbody = c.post({"jsonrpc": "2.0", "id": REQUEST_ID, "method": "tools/list"})
    c.conn.close()
    if status != 200 or nbody != body:
        raise Fail(f"nginx answered http {status}, {len(nbody)} bytes (want {len(body)})")
    log(f"{tools} tools per route: the merged list is {len(body):,} bytes; nginx serves the same")
    targets = [Target(f"mcpyard-{io}", g.url, g.pid) for io, g in gws.items()]
    targets.append(Target("nginx", ngx.url, ngx.pid,
                          ["--no-initialize", "--request-id", str(REQUEST_ID)]))
    pids = [fa.pid, fb.pid]
    m0 = {io: g.scrape() for io, g in gws.items()}
    maxes = rounds(a, lg, f"list{tools}-max", targets, None, a.max_duration, pids)
    base = maxes[BASE]["throughput_rps"]
    rate = rate_at(base, 0.5)
    log(f"list {tools}: {BASE} max {base:.0f} lists/s → 50 % = {rate}/s")
    at50 = rounds(a, lg, f"list{tools}-r50", targets, rate, a.rate_duration, pids)
    m1 = {io: g.scrape() for io, g in gws.items()}
    cache = {io: {k: m1[io].get(k, 0) - m0[io].get(k, 0) for k in
                  ("mcpyard_cache_hits_total", "mcpyard_cache_misses_total",
                   "mcpyard_cache_refreshes_ok_total")} for io in gws}
    upstream = {io: {k: m1[io].get(k) for k in ("mcpyard_upstream_sessions",
                                                "mcpyard_upstream_connections")} for io in gws}
    rss = {f"mcpyard-{io}": rss_kib(g.pid) for io, g in gws.items()}
    rss["nginx"] = sum(rss_kib(p) for p in group_pids(ngx.pid))
    exits = {f"mcpyard-{io}": procs.stop(g.p) for io, g in gws.items()}
    exits["nginx"] = procs.stop(ngx.p)
    for f in (fa, fb):
        exits[f.name] = procs.stop(f.p)
    return {
        "tools_per_route": tools, "fixture_args": fa.args, "body_bytes": len(body),
        "body_head": body[:160].decode(errors="replace"),
        "mcpyard_headers": {k: v for k, v in headers.items() if k != "mcp-session-id"},
        "nginx_headers": nheaders, "max": maxes, "rate_50": rate, "at50": at50,
        "cache_counters": cache, "upstream_gauges": upstream, "rss_kib": rss, "exit_codes": exits,
    }


# --------------------------------------------------------------------------- phase: fanout


def fanout_stack(procs, gw, lg, tag, io, workers, bins=None):
    """Two 50-tool fixtures and a caching proxy in front of them."""
    gwb, lgb = bins or (gw, lg)
    fa = Fixture(procs, lgb, f"{tag}-fixture-a", ["--tools", str(FANOUT_TOOLS)])
    fb = Fixture(procs, lgb, f"{tag}-fixture-b", ["--tools", str(FANOUT_TOOLS)])
    g = Gateway(procs, gwb, f"{tag}-mcpyard", None, workers=workers, io=io,
                routes=routes_of(fa, fb), cache=TTL)
    return fa, fb, g


def hydration(m):
    """Per toolkit: hydrations counted and their latency quantiles, µs."""
    out = {}
    for key, v in m.items():
        mt = re.match(r'mcpyard_toolkit_hydration_seconds\{toolkit="(\w+)",quantile="([\d.]+)"\}', key)
        if mt:
            out.setdefault(mt.group(1), {})[f"q{mt.group(2)}"] = v * 1e6
        mc = re.match(r'mcpyard_toolkit_hydration_seconds_count\{toolkit="(\w+)"\}', key)
        if mc:
            out.setdefault(mc.group(1), {})["count"] = v
    return out


def fan_run(procs, a, gw, lg, n, io, workers, rounds_n, profile=False, bins=None, tag=None):
    """One fan-out run on a fresh stack; returns the loadgen's JSON plus what mcpyard did."""
    tag = tag or f"fan-{n}-{io}-w{workers}"
    gwb, lgb = bins or (gw, lg)
    fa, fb, g = fanout_stack(procs, gw, lg, tag, io, workers, bins)
    jpath = os.path.join(RESULTS, RAW_SUB, f"{tag}.json")
    logpath = os.path.join(RAW, f"{tag}.loadgen.log")
    argv = [lgb, "run", "--url", g.url, "--scenario", "fanout", "--sessions", str(n),
            "--rounds", str(rounds_n), "--trigger", f"http://{fa.addr}/control/tools_changed",
            "--json", jpath]
    wait_quiet()
    m0 = g.scrape()
    rss0 = rss_kib(g.pid)
    log(f"{tag}: {n} sessions, {rounds_n} rounds")
    lp = procs.start(f"{tag}-loadgen", argv, logpath)
    # The loadgen pauses 200 ms after each of these two lines: the first before its first
    # round, the second before it closes the sessions; what is read between them is the
    # rounds' alone (reading /proc costs mcpyard nothing).
    mo = wait_for_line(logpath, r"^(\d+) of \d+ sessions open with GET streams after ([\d.]+) s",
                       lp, timeout=300)
    ours = [g.pid, lp.pid, fa.pid, fb.pid]
    c0 = pgroup_ticks([g.pid])[g.pid]
    l0 = pgroup_ticks([lp.pid]).get(lp.pid)
    o0, y0 = pgroup_ticks(ours), system_ticks()
    s0 = time.time()
    rec = None
    perf = shutil.which("perf")
    if profile and perf:
        rec = start_profile(perf, g.pid, tag, rounds_n * 0.45)
    wait_for_line(logpath, r"^\d+ fan-out rounds done", lp, timeout=600)
    c1 = pgroup_ticks([g.pid])[g.pid]
    l1 = pgroup_ticks([lp.pid]).get(lp.pid)
    o1, y1 = pgroup_ticks(ours), system_ticks()
    wall = time.time() - s0
    # The machine's busy time during the rounds not spent by this stack (other builds).
    total = y1[0] - y0[0]
    busy = total - (y1[1] - y0[1])
    mine = sum(sum(o1[p]) - sum(o0[p]) for p in ours)
    foreign = max(0.0, 100.0 * (busy - mine) / total) if total else 0.0
    rss1 = rss_kib(g.pid)
    fds1 = fd_count(g.pid)
    m1 = g.scrape()
    lp.wait(timeout=600)
    procs.stop(lp)
    prof = finish_profile(perf, rec) if rec else None
    if lp.returncode != 0 or not os.path.exists(jpath):
        with open(logpath, errors="replace") as f:
            raise Fail(f"loadgen fanout {tag} exited {lp.returncode}:\n{f.read()[-2000:]}")
    with open(jpath) as f:
        r = json.load(f)
    r["delivery_us"].pop("percentiles", None)
    r["argv"] = argv
    gauges = ("mcpyard_sessions", "mcpyard_connections", "mcpyard_upstream_sessions",
              "mcpyard_upstream_connections")
    r["mcpyard"] = {
        "rss_kib_before": rss0, "rss_kib_open": rss1, "fds_open": fds1,
        "gauges_open": {k.replace("mcpyard_", ""): m1.get(k) for k in gauges},
        "cpu_ms_per_round": {"user": (c1[0] - c0[0]) * 1e3 / CLK_TCK / rounds_n,
                             "sys": (c1[1] - c0[1]) * 1e3 / CLK_TCK / rounds_n},
        "notifications": m1.get("mcpyard_cache_notifications_total", 0)
        - m0.get("mcpyard_cache_notifications_total", 0),
        "refreshes_ok": m1.get("mcpyard_cache_refreshes_ok_total", 0)
        - m0.get("mcpyard_cache_refreshes_ok_total", 0),
        "hydration_before": hydration(m0), "hydration_after": hydration(m1),
        "rounds_wall_s": wall, "open_line": mo.group(0), "foreign_busy_pct": foreign,
        "machine_busy_pct": 100.0 * busy / total if total else 0.0,
    }
    if l0 and l1:
        r["loadgen_cpu_ms_per_round"] = {"user": (l1[0] - l0[0]) * 1e3 / CLK_TCK / rounds_n,
                                         "sys": (l1[1] - l0[1]) * 1e3 / CLK_TCK / rounds_n}
    r["profile"] = prof
    r["io"], r["workers"], r["sessions_asked"] = io, workers, n
    r["exit_code"] = procs.stop(g.p)
    r["logs"] = {"fixture_a": os.path.join(RAW, f"{tag}-fixture-a.log"),
                 "mcpyard": os.path.join(RAW, f"{tag}-mcpyard.log"), "loadgen": logpath}
    procs.stop(fa.p)
    procs.stop(fb.p)
    lasts = [x["time_to_last_us"] for x in r["rounds"]]
    log(f"{tag}: time to last per round (ms) " + ", ".join(f"{x / 1000:.1f}" for x in lasts))
    return r


def start_profile(perf, pid, tag, seconds):
    out = os.path.join(RAW, f"{NAME}-{tag}-perf.data")
    p = subprocess.Popen([perf, "record", "-q", "-g", "-F", "2999", "-p", str(pid), "-o", out,
                          "--", "sleep", f"{seconds:.1f}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    return (p, out, seconds)


# Kernel functions whose inclusive share says where the kernel's time went.
PROFILE_KERNEL = [
    ("tcp_sendmsg", "TCP send: `tcp_sendmsg` and all below it (on loopback that includes "
     "delivering the segment to the agent's socket)"),
    ("tcp_v4_rcv", "TCP receive: `tcp_v4_rcv` and below, run in this thread's softirq: "
     "mostly the agents' side of these sends, and their ACKs"),
    ("sock_def_readable", "waking the agent's reader (`sock_def_readable`)"),
    ("io_submit_sqes", "io_uring: submitting queued operations (the sends run inside it)"),
    ("__x64_sys_write", "write(2) (epoll backend: the sends run inside it)"),
    ("__x64_sys_epoll_wait", "epoll_wait(2)"),
]


def finish_profile(perf, rec):
    p, out, seconds = rec
    try:
        p.wait(seconds + 30)
    except subprocess.TimeoutExpired:
        p.terminate()
        p.wait()
    if p.returncode != 0 or not os.path.exists(out):
        return {"error": f"perf record exited {p.returncode}"}

    def report(*args):
        return subprocess.run([perf, "report", "-i", out, "--stdio"] + list(args),
                              capture_output=True, text=True).stdout

    total = None
    for line in report("--no-children", "--sort", "dso", "-g", "none").splitlines():
        m = re.match(r"#\s*Samples:\s*([\d.]+)([KM]?)", line)
        if m:
            total = float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6}[m.group(2)]
    dsos = []
    for line in report("--no-children", "--sort", "dso", "-g", "none").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].endswith("%"):
            dsos.append((parts[1], float(parts[0][:-1])))
    children = {}
    for line in report("--children", "--sort", "symbol", "-g", "none").splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].endswith("%") and parts[1].endswith("%"):
            children[parts[3]] = float(parts[0][:-1])
    kernel = [(sym, what, children.get(sym)) for sym, what in PROFILE_KERNEL
              if children.get(sym)]
    top = []
    for line in report("--no-children", "--sort", "dso,symbol", "-g", "none",
                       "--percent-limit", "1").splitlines():
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].endswith("%"):
            top.append((parts[0], parts[1], re.sub(r"\s+-\s+-\s*$", "", parts[3]).strip()[:100]))
    return {"samples": total, "dso_pct": dsos, "kernel_inclusive_pct": kernel, "top": top[:20],
            "cmd": f"perf record -g -F 2999 -p <mcpyard pid> -- sleep {seconds:.1f} "
                   "(from the moment every session was open)"}


def send_floor(n, reps):
    """Writes FLOOR_CHUNK once to each of n loopback TCP connections with send(), reps times;
    a forked reader holds the other ends in epoll. Returns per rep (wall, kernel, user) ms."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4096)
    port = srv.getsockname()[1]
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the reader: n connections in epoll, reads until the writer closes them
        try:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)  # the harness's handlers are the parent's
            srv.close()
            os.close(ready_r)
            sel = selectors.EpollSelector()
            conns = []
            for _ in range(n):
                c = socket.create_connection(("127.0.0.1", port))
                c.setblocking(False)
                sel.register(c, selectors.EVENT_READ)
                conns.append(c)
            os.write(ready_w, b"1")
            left = n
            while left:
                for key, _ in sel.select():
                    if not key.fileobj.recv(65536):
                        sel.unregister(key.fileobj)
                        left -= 1
        finally:
            os._exit(0)
    os.close(ready_w)
    conns = []
    try:
        for _ in range(n):
            c, _ = srv.accept()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conns.append(c)
        os.read(ready_r, 1)
        time.sleep(0.3)
        out = []
        for _ in range(reps):
            wait_quiet()
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            t0 = time.perf_counter()
            for c in conns:
                c.send(FLOOR_CHUNK)
            t1 = time.perf_counter()
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            out.append({"wall_ms": (t1 - t0) * 1e3,
                        "kernel_ms": (r1.ru_stime - r0.ru_stime) * 1e3,
                        "user_ms": (r1.ru_utime - r0.ru_utime) * 1e3})
            time.sleep(0.2)
    finally:
        for c in conns:
            c.close()
        srv.close()
        os.close(ready_r)
        os.waitpid(pid, 0)
    return out


def phase_fanout(procs, a, gw, lg, ns):
    runs = []
    ios = [x for x in a.fan_io.split(",") if x]
    for io in ios:
        for n in ns:
            runs.append(fan_run(procs, a, gw, lg, n, io, 1, a.fan_rounds))
    if a.fan_workers2:
        runs.append(fan_run(procs, a, gw, lg, max(ns), "uring", 2, a.fan_rounds))
    prof = None
    if not a.no_profile and shutil.which("perf"):
        # A run of its own: the profiler's cost stays out of the figures above.
        r = fan_run(procs, a, gw, lg, max(ns), "uring", 1, a.fan_rounds, profile=True,
                    tag=f"fan-{max(ns)}-uring-w1-profile")
        prof = {"profile": r["profile"], "time_to_last_us": [x["time_to_last_us"] for x in r["rounds"]],
                "cpu_ms_per_round": r["mcpyard"]["cpu_ms_per_round"]}
    floor = {}
    for n in ns:
        log(f"floor: {n} send() calls from one thread to {n} loopback connections")
        floor[n] = send_floor(n, a.fan_rounds)
    return {"runs": runs, "profile": prof, "floor": floor, "tools_per_route": FANOUT_TOOLS}


# --------------------------------------------------------------------------- phase: breakdown


# The stages the timing patch marks, in the order they happen (label, what it is).
STAGES = [
    ("lg_trigger", "loadgen sends the trigger POST (t = 0)"),
    ("fx_trigger_in", "fixture a: the trigger request read"),
    ("fx_signalled", "fixture a: next revision rendered, its GET streams signalled"),
    ("fx_stream_write", "fixture a: list_changed written on the hydration session's GET stream"),
    ("hy_list_changed", "mcpyard: the hydrator reads that list_changed"),
    ("hy_refresh_start", "mcpyard: the refresh of tools/list starts"),
    ("hy_fetched", "mcpyard: both routes' lists read (all pages)"),
    ("hy_put", "mcpyard: fragments and the merged list in the store"),
    ("watch_apply", "mcpyard: the worker's watcher sees a new CRC"),
    ("announced", "mcpyard: every session of the worker poked (announce loop)"),
    ("relay_flush", "mcpyard proxy: a session's relay task hands list_changed to the server"),
    ("push_event", "mcpyard server: a session's lifecycle task encodes it into the GET ring"),
    ("lg_recv", "loadgen: a session's event received"),
    ("sse_write", "mcpyard server: a GET stream's write completed (uring: its completion reaped)"),
]


# Spans of the fan-out: (what, end stage, start stage, per session?); a stage name with
# ":last" is its last session's mark, otherwise the first mark.
SPANS = [
    ("trigger → fixture a wrote list_changed to the hydration session", "fx_stream_write",
     "lg_trigger", False),
    ("→ the hydrator read it", "hy_list_changed", "fx_stream_write", False),
    ("the refresh: both routes' tools lists read", "hy_fetched", "hy_refresh_start", False),
    ("→ stored (fragments, merged list)", "hy_put", "hy_fetched", False),
    ("→ the watcher woke (CRC differs)", "watch_apply", "hy_put", False),
    ("announce loop over the worker's sessions", "announced", "watch_apply", True),
    ("proxy relay tasks: list_changed handed to the server", "relay_flush:last", "announced", True),
    ("server lifecycle tasks: event encoded into each GET ring", "push_event:last",
     "relay_flush:last", True),
    ("GET streams written until the last agent's receipt", "lg_recv:last", "push_event:last", True),
    ("trigger → last receipt (the time to last)", "lg_recv:last", "lg_trigger", False),
]


def span_at(r, stage):
    """µs after the trigger of `stage` in round r (None if not marked)."""
    if stage == "lg_trigger":
        return 0.0
    name, _, which = stage.partition(":")
    return r["last" if which == "last" else "first"].get(name)


def parse_timing(paths):
    """TIMING lines of every log, as (ns, label, count or None), sorted by time."""
    ev = []
    for path in paths:
        try:
            with open(path, errors="replace") as f:
                for line in f:
                    m = re.match(r"TIMING (\w+)(?:#(\d+))? (\d+)$", line.strip())
                    if m:
                        ev.append((int(m.group(3)), m.group(1),
                                   int(m.group(2)) if m.group(2) else None))
        except OSError:
            pass
    ev.sort()
    return ev


def timing_rounds(ev):
    """Per round (from one lg_trigger to the next): for each stage, µs after the trigger of
    its first mark and (counted stages) its last."""
    out = []
    cur = None
    for ns, label, count in ev:
        if label == "lg_trigger":
            cur = {"t0": ns, "first": {}, "last": {}}
            out.append(cur)
            continue
        if cur is None:
            continue
        us = (ns - cur["t0"]) / 1e3
        cur["first"].setdefault(label, us)
        cur["last"][label] = us
    return out


def phase_breakdown(procs, a, gw, lg, ns, timing_bin):
    bins = (os.path.join(timing_bin, "mcpyard"), os.path.join(timing_bin, "mcpyard-loadgen"))
    for b in bins:
        if not os.access(b, os.X_OK):
            raise Fail(f"--timing-bin: {b} is missing (build with perf/fanout-timing.patch)")
    out = {}
    for n in ns:
        r = fan_run(procs, a, gw, lg, n, "uring", 1, a.fan_rounds, bins=bins,
                    tag=f"breakdown-{n}-uring")
        rs = timing_rounds(parse_timing(r["logs"].values()))
        out[n] = {"rounds": rs, "time_to_last_us": [x["time_to_last_us"] for x in r["rounds"]],
                  "received": [x["received"] for x in r["rounds"]],
                  "notifications": r["mcpyard"]["notifications"]}
    return out


# --------------------------------------------------------------------------- main


def run(procs):
    a = parse()
    set_quiet(a)
    phases = set(x for x in a.phases.split(",") if x)
    if a.timing_bin:
        phases.add("breakdown")
    if not phases <= {"list", "fanout", "breakdown"}:
        raise Fail(f"--phases: unknown {', '.join(sorted(phases - {'list', 'fanout', 'breakdown'}))}")
    if "breakdown" in phases and not a.timing_bin:
        raise Fail("the breakdown phase needs --timing-bin (see perf/README.md)")
    gw, lg = binaries()
    ns = [int(x) for x in a.sessions.split(",") if x.strip()]
    # Every process holds one descriptor per session at most (the loadgen, mcpyard) plus a
    # few; the floor's reader and writer are separate processes too.
    nofile, nofile_note = raise_nofile(max(ns) + 4096)
    info = machine_info()
    os.makedirs(os.path.join(RESULTS, RAW_SUB), exist_ok=True)
    data = {"machine": info, "connections": a.connections, "max_duration": a.max_duration,
            "rate_duration": a.rate_duration, "warmup": a.warmup, "rounds": a.rounds,
            "retry_foreign": a.retry_foreign, "fan_rounds": a.fan_rounds, "nofile": nofile,
            "nofile_note": nofile_note, "argv": sys.argv[1:], "request_id": REQUEST_ID,
            "ttl": TTL, "page_size": a.page_size}
    if "list" in phases:
        from perfkit import apt_install
        nginx_bin = apt_install("nginx", ["nginx-light", "nginx"])
        data["nginx_version"] = subprocess.run([nginx_bin, "-v"], capture_output=True,
                                               text=True).stderr.strip()
        data["list"] = {}
        for tools in [int(x) for x in a.sizes.split(",") if x.strip()]:
            data["list"][tools] = phase_list(procs, a, gw, lg, nginx_bin, tools)
    if "fanout" in phases:
        data["fanout"] = phase_fanout(procs, a, gw, lg, ns)
    if "breakdown" in phases:
        data["breakdown"] = phase_breakdown(procs, a, gw, lg, ns, a.timing_bin)
    data["config_example"] = gateway_config(None, 1, "uring", [("a", "<fixture a>"),
                                                                ("b", "<fixture b>")], TTL)
    md = report(data)
    write_report(NAME, md, strip(data))


def strip(data):
    """The summary JSON without every run's percentile steps (raw/compare-cache/ has them)."""
    d = copy.deepcopy(data)
    for li in d.get("list", {}).values():
        for phase in ("max", "at50"):
            for s in li[phase].values():
                for r in s["rounds"]:
                    perfkit_drop_percentiles(r)
    for r in d.get("fanout", {}).get("runs", []):
        r.pop("logs", None)
    d.get("machine", {}).pop("t0", None)
    return d


def rerender():
    """--report-only: rewrites compare-cache.md from compare-cache.json (no measuring)."""

    def adapt(d):
        d["list"] = {int(k): v for k, v in d.get("list", {}).items()}
        d["breakdown"] = {int(k): v for k, v in d.get("breakdown", {}).items()}
        if "fanout" in d:
            d["fanout"]["floor"] = {int(k): v for k, v in d["fanout"]["floor"].items()}
        if not d["breakdown"]:
            d.pop("breakdown")

    return perfkit_rerender(NAME, report, adapt)


# --------------------------------------------------------------------------- report




def ms(us):
    return f"{us / 1000:,.1f}"


def report(d):
    L = ["# compare-cache: cached tools/list against nginx, and list_changed fan-out\n"]
    runs = []
    for li in d.get("list", {}).values():
        runs += [x for phase in ("max", "at50") for s in li[phase].values() for x in s["rounds"]]
    waited = sum(x.get("quiet_waited_s", 0) for x in runs)
    L.append(f"Generated by `perf/compare-cache.sh` — {machine_line(d['machine'], waited)}\n")
    L.append("The proxy under test (1 worker unless stated; fixtures `mcpyard-loadgen upstream`, "
             "1 worker each):\n")
    L.append("```yaml\n" + d["config_example"] + "```\n")
    verdicts = []
    if "list" in d:
        L += report_list(d, verdicts)
    if "fanout" in d:
        L += report_fanout(d, verdicts)
    if "breakdown" in d:
        L += report_breakdown(d)
    L.append("## Targets\n")
    L.append(table(["target", "measured", "verdict"], verdicts, ["l", "l", "l"]))
    L.append("")
    L.append("## Commands\n")
    L.append("```sh\nperf/compare-cache.sh " + " ".join(d.get("argv", [])) + "\n```\n")
    ex = []
    if "list" in d:
        li = next(iter(d["list"].values()))
        ex += [li["max"][BASE]["argv"], li["max"]["nginx"]["argv"], li["at50"]["nginx"]["argv"]]
    if "fanout" in d and d["fanout"]["runs"]:
        ex.append(d["fanout"]["runs"][-1]["argv"])
    if ex:
        L.append("Loadgen command lines (addresses chosen at run time):\n")
        L.append("```sh\n" + "\n".join(loadgen_cmd(x) for x in ex) + "\n```\n")
    L.append(f"Every run's loadgen JSON, .hgrm and .svg: `perf/results/{RAW_SUB}/`; logs, configs "
             "and perf data: `perf/results/raw/` (neither is committed).\n")
    return "\n".join(L)


def report_list(d, verdicts):
    L = ["## 1. Cached tools/list against nginx serving the same bytes\n"]
    L.append(
        f"Two fixtures behind the caching proxy; mcpyard answers tools/list from its store. "
        f"The body mcpyard answered to one tools/list with id {d['request_id']} was captured "
        f"and {d.get('nginx_version', 'nginx')} (1 worker) answers every POST with exactly "
        "those bytes from a file (config below); nginx is loaded with `--no-initialize "
        f"--request-id {d['request_id']}`, mcpyard with a session per connection and ids "
        "counting up (so its bodies differ from the file only in the id's digits). Every run: "
        f"{d['connections']} connections, {d['warmup']} warm-up; closed loop {d['max_duration']}, "
        f"open loop {d['rate_duration']}; {d['rounds']} rounds round-robin, medians (each "
        "percentile on its own), ranges min–max. CPU µs/list is the process's CPU time during "
        "the run (utime + stime, 10 ms ticks) over the lists; for nginx its master and worker.\n")
    for tools, li in d["list"].items():
        L.append(f"### 2 × {tools:,} tools: a {li['body_bytes']:,}-byte answer\n")
        L.append(f"Fixtures `mcpyard-loadgen {' '.join(li['fixture_args'])}`. mcpyard's answer "
                 f"starts `{li['body_head'][:90]}…`, headers "
                 + ", ".join(f"`{k}: {v}`" for k, v in sorted(li["mcpyard_headers"].items())) + ".\n")
        rows = []
        for n in TARGETS:
            r = li["max"][n]
            c = r["cpu_us_per_req"]
            p50, _p90, p99, p999, _mx = lat(r)
            rows.append([n, fmt(r["throughput_rps"]),
                         f"{fmt(r['throughput_min'])}–{fmt(r['throughput_max'])}",
                         f"{r['throughput_rps'] * li['body_bytes'] / 1e6:,.0f}", p50, p99, p999,
                         fmt(c.get("target"), 1), fmt(c.get("target_user"), 1),
                         fmt(c.get("target_sys"), 1), fmt(c.get("loadgen"), 1),
                         fmt(r["machine_busy_pct"]), fmt(r["foreign_busy_pct"], 1), errs(r)])
        L.append("Max throughput, closed loop:\n")
        L.append(table(["target", "lists/s", "range", "MB/s", "p50 µs", "p99", "p99.9",
                        "CPU µs/list", "of it user", "of it kernel", "loadgen CPU µs/list",
                        "machine busy %", "foreign %", "errors/unsent"], rows))
        L.append("")
        rate = li["rate_50"]
        rows = []
        for n in TARGETS:
            r = li["at50"][n]
            p50, p90, p99, p999, mx = lat(r)
            rows.append([n, fmt(r["throughput_rps"]), p50, p90, p99,
                         f"{r['response_us']['p99_min']:,.0f}–{r['response_us']['p99_max']:,.0f}",
                         p999, mx, fmt(r["cpu_us_per_req"].get("target"), 1),
                         fmt(r["machine_busy_pct"]), fmt(r["foreign_busy_pct"], 1), errs(r)])
        L.append(f"Open loop at {rate:,} lists/s (50 % of {BASE}'s max), latency from the "
                 "intended send time, µs:\n")
        L.append(table(["target", "achieved lists/s", "p50", "p90", "p99", "p99 range",
                        "p99.9", "max", "CPU µs/list", "machine busy %", "foreign %",
                        "errors/unsent"], rows))
        L.append("")
        hits = li["cache_counters"]
        L.append("Cache during the runs: " + "; ".join(
            f"{io}: {fmt(c['mcpyard_cache_hits_total'])} hits, "
            f"{fmt(c['mcpyard_cache_misses_total'])} misses, "
            f"{fmt(c['mcpyard_cache_refreshes_ok_total'])} refreshes; upstream sessions "
            f"{fmt(li['upstream_gauges'][io]['mcpyard_upstream_sessions'])}"
            for io, c in sorted(hits.items(), key=lambda x: x[0] != "uring")) +
            ". RSS after, KiB: " +
            ", ".join(f"{k} {fmt(li['rss_kib'][k])}" for k in TARGETS if k in li["rss_kib"]) +
            ".\n")
        tn = li["max"]["nginx"]["throughput_rps"]
        for io in ("uring", "epoll"):
            name = f"mcpyard-{io}"
            tm = li["max"][name]["throughput_rps"]
            ratio = tm / tn if tn else 0
            verdicts.append([f"2 × {tools:,} tools, {io}: cached tools/list max throughput ≥ "
                             f"{THROUGHPUT_TARGET}× nginx's",
                             f"{tm:,.0f} vs {tn:,.0f} lists/s: **{ratio:.2f}×**",
                             "reached" if ratio >= THROUGHPUT_TARGET else "**missed**"])
            p99 = li["at50"][name]["response_us"]["p99"]
            pn = li["at50"]["nginx"]["response_us"]["p99"]
            verdicts.append([f"2 × {tools:,} tools, {io}: p99 at 50 % load < {P99_TARGET_US:,} µs",
                             f"{p99:,.0f} µs at {rate:,}/s (nginx {pn:,.0f} µs)",
                             "reached" if p99 < P99_TARGET_US else "**missed**"])
    L.append("nginx.conf (the `location` answers every POST with the file):\n")
    L.append("```nginx\n" + static_conf("<tmp>", "<port>", "<tmp>/tools-list.json", 1) + "```\n")
    return L


def report_fanout(d, verdicts):
    f = d["fanout"]
    L = ["## 2. list_changed fan-out after a real change\n"]
    L.append(
        f"A fresh stack per row: fixtures `a` and `b` with {f['tools_per_route']} tools each, "
        "the caching proxy in front of them. The loadgen `fanout` scenario opens the sessions "
        "(each on its own connection: initialize, initialized, GET stream), then per round "
        "POSTs fixture `a`'s `/control/tools_changed`: the fixture renders its list's next "
        "revision and tells its open GET streams — the cache's hydration session, so the "
        "trigger answers `{\"streams\":1}`, not one per agent — and mcpyard re-lists both "
        "routes, stores the merged list, and every worker's watcher, seeing a new CRC32C, "
        "tells each of its sessions once. Time to last = from sending the trigger to the "
        f"last session's receipt; {d['fan_rounds']} rounds, 200 ms apart. RLIMIT_NOFILE "
        f"{d['nofile']:,}" + (f" ({d['nofile_note']})" if d.get("nofile_note") else "") + ".\n")
    rows = []
    for r in f["runs"]:
        lasts = [x["time_to_last_us"] for x in r["rounds"]]
        recv = sum(x["received"] for x in r["rounds"])
        exp = sum(x["expected"] for x in r["rounds"])
        told = sorted({x.get("trigger_told") for x in r["rounds"]})
        m = r["mcpyard"]
        g = m["gauges_open"]
        cpu = m["cpu_ms_per_round"]
        lcpu = r.get("loadgen_cpu_ms_per_round") or {}
        dl = r["delivery_us"]
        rows.append([f"{r['sessions_asked']:,}", r["io"], r["workers"], f"{r['opened']:,}",
                     f"{recv:,} / {exp:,}", ", ".join(fmt(t) for t in told),
                     ", ".join(ms(x) for x in lasts), f"**{ms(median(lasts))}**",
                     ms(dl["p50"]), ms(dl["p99"]),
                     f"{cpu['user'] + cpu['sys']:,.0f} ({cpu['user']:,.0f} + {cpu['sys']:,.0f})",
                     f"{(cpu['user'] + cpu['sys']) * 1e3 / max(1, r['opened']):.1f}",
                     f"{lcpu.get('user', 0) + lcpu.get('sys', 0):,.0f}" if lcpu else "–",
                     f"{fmt(m['notifications'])}",
                     f"{fmt(g['upstream_sessions'])} / {fmt(g['upstream_connections'])}",
                     f"{(m['rss_kib_open'] - m['rss_kib_before']) / max(1, r['opened']):.1f}",
                     fmt(m.get("machine_busy_pct")), fmt(m.get("foreign_busy_pct"), 1)])
    L.append(table(["sessions", "io", "workers", "opened", "received / expected",
                    "trigger told", "time to last per round, ms", "median, ms",
                    "delivery p50 ms", "p99 ms", "mcpyard CPU ms / round (user + kernel)",
                    "µs / session", "loadgen CPU ms / round", "list_changed sent (metric)",
                    "upstream sessions / conns", "RSS KiB / session", "machine busy %",
                    "foreign %"], rows))
    L.append("")
    L.append("CPU from /proc (10 ms ticks), read between the loadgen's 'sessions open' and "
             "'rounds done' lines, so it is the rounds' alone (the 1,000-session rows are "
             "near the tick's resolution); 'foreign %' is the machine's busy time during the "
             "rounds not spent by this stack (generator, fixtures, mcpyard), in % of both "
             "cores. "
             "'list_changed sent' counts every session the watchers told over all rounds "
             "(`mcpyard_cache_notifications_total`): the loadgen's probe session has no GET "
             "stream but is a live session too, so it is one more per round. 'upstream "
             "sessions / conns' is read while every agent's GET stream is open: the hydration "
             "session's, one per route; the agents hold none.\n")
    hy = []
    for r in f["runs"]:
        h0, h1 = r["mcpyard"]["hydration_before"], r["mcpyard"]["hydration_after"]
        for tk in sorted(h1):
            c = h1[tk].get("count", 0) - h0.get(tk, {}).get("count", 0)
            hy.append(f"{r['sessions_asked']:,}/{r['io']}/w{r['workers']} {tk}: {fmt(c)} "
                      f"(p50 {h1[tk].get('q0.5', 0):,.0f} µs, max {h1[tk].get('q1', 0):,.0f} µs)")
        break
    if hy:
        L.append("Hydrations of each toolkit's tools list during the first row's rounds, from "
                 "`mcpyard_toolkit_hydration_seconds` (cumulative since start: the first "
                 "hydration included): " + "; ".join(hy) + ". A refresh lists both routes, so "
                 "route `b`, which did not change, is listed again too.\n")
    fl = f.get("floor") or {}
    if fl:
        rows = []
        for n, reps in fl.items():
            rows.append([f"{int(n):,}", ", ".join(f"{x['wall_ms']:,.1f}" for x in reps),
                         f"**{median([x['wall_ms'] for x in reps]):,.1f}**",
                         f"{median([x['kernel_ms'] for x in reps]):,.1f}",
                         f"{median([x['kernel_ms'] for x in reps]) * 1e3 / int(n):.1f}"])
        L.append("**The floor on this machine**: one thread (Python) sends the same chunked SSE "
                 f"event ({len(FLOOR_CHUNK)} bytes) once to each of N loopback TCP connections "
                 "with `send()`, nothing else; a forked reader holds the other ends in epoll. "
                 "On loopback the sender's system call also runs the receiver's TCP receive "
                 "path and its wake-up, as it does for mcpyard:\n")
        L.append(table(["connections", "wall ms per pass", "median wall ms",
                        "median kernel ms", "kernel µs / send"], rows))
        L.append("")
    prof = f.get("profile")
    if prof and prof.get("profile") and not prof["profile"].get("error"):
        p = prof["profile"]
        dso = ", ".join(f"{name} {pct:.1f} %" for name, pct in p["dso_pct"])
        L.append(f"**Where one worker's CPU goes during the fan-out** (a run of its own, "
                 f"{max(int(x) for x in fl) if fl else ''} sessions, uring; `{p['cmd']}`, "
                 f"{fmt(p['samples'])} samples; time to last in that run "
                 + ", ".join(ms(x) for x in prof["time_to_last_us"]) + " ms, slowed by the "
                 f"profiler). By object: {dso}. Kernel functions, inclusive:\n")
        L.append(table(["share of all samples (inclusive; rows overlap)", "what"],
                       [[f"{pct:.1f} %", what] for _sym, what, pct in
                        p["kernel_inclusive_pct"]], ["r", "l"]))
        L.append("")
        L.append("Self time above 1 %:\n")
        L.append(table(["self", "object", "symbol"],
                       [[x[0], x[1], f"`{x[2]}`"] for x in p["top"]], ["r", "l", "l"]))
        L.append("")
    big = max((r for r in f["runs"] if r["workers"] == 1 and r["io"] == "uring"),
              key=lambda r: r["sessions_asked"], default=None)
    if big:
        lasts = [x["time_to_last_us"] for x in big["rounds"]]
        ok = all(x["received"] == x["expected"] for x in big["rounds"]) and \
            big["opened"] == big["sessions_asked"]
        t = median(lasts) / 1000
        verdicts.append([f"list_changed to the last of {big['sessions_asked']:,} sessions after "
                         f"a real change ≤ {FANOUT_TARGET_MS} ms (1 worker, uring)",
                         f"median over {len(lasts)} rounds **{t:,.1f} ms** "
                         f"({', '.join(ms(x) for x in lasts)}); "
                         f"{'every session told in every round' if ok else 'NOT every session told'}",
                         "reached" if t <= FANOUT_TARGET_MS and ok else "**missed**"])
    return L


def report_breakdown(d):
    L = ["## 3. Where the fan-out time goes (timing build)\n"]
    L.append("Binaries built from `perf/fanout-timing.patch` print a CLOCK_MONOTONIC stamp at "
             "each stage (the counted stages at their 1st and every 1,000th occurrence of a "
             "round; counters restart at each trigger and watcher wake). Each cell is the "
             "median over the rounds, ms after the trigger was sent; 'first' and 'last' are "
             "the first and the last session through that stage. mcpyard 1 worker, uring.\n")
    cols = list(d["breakdown"].keys())
    rows = []
    for label, what in STAGES:
        row = [f"`{label}`", what]
        any_ = False
        for n in cols:
            rs = d["breakdown"][n]["rounds"]
            first = [r["first"][label] for r in rs if label in r["first"]]
            last = [r["last"][label] for r in rs if label in r["last"]]
            if label == "lg_trigger":
                row += ["0", ""]
                any_ = True
                continue
            counted = label in ("relay_flush", "push_event", "lg_recv", "sse_write")
            row.append(f"{median(first) / 1000:,.2f}" if first else "–")
            row.append(f"{median(last) / 1000:,.2f}" if counted and last else "")
            any_ = any_ or bool(first)
        if any_:
            rows.append(row)
    hdr = ["stage", "what"]
    for n in cols:
        hdr += [f"{n:,}: first", "last"]
    L.append(table(hdr, rows, ["l", "l"] + ["r"] * (2 * len(cols))))
    L.append("")
    L.append("The same as durations, ms (medians of each round's difference), and per session "
             "where a stage is per session:\n")
    rows = []
    for what, end, start, per_session in SPANS:
        row = [what]
        for n in cols:
            rs = d["breakdown"][n]["rounds"]
            diffs = [span_at(r, end) - span_at(r, start) for r in rs
                     if span_at(r, end) is not None and span_at(r, start) is not None]
            if not diffs:
                row += ["–", ""]
                continue
            m = median(diffs)
            row += [f"{m / 1000:,.2f}", f"{m / n:.2f} µs" if per_session else ""]
        rows.append(row)
    hdr = ["span"]
    for n in cols:
        hdr += [f"{n:,}: ms", "per session"]
    L.append(table(hdr, rows, ["l"] + ["r"] * (2 * len(cols))))
    L.append("")
    for n in cols:
        b = d["breakdown"][n]
        L.append(f"{n:,} sessions: time to last per round (loadgen) "
                 + ", ".join(ms(x) for x in b["time_to_last_us"]) + " ms; received "
                 + ", ".join(fmt(x) for x in b["received"]) + ".\n")
    return L


if __name__ == "__main__":
    if sys.argv[1:] == ["--report-only"]:
        rerender()
    else:
        main_guard("compare-cache.sh", run)
