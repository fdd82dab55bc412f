"""soak: open-loop load for MINUTES through server -> proxy (cache) -> two clients while one
upstream dies and comes back every minute, with mcpyard's memory, fds, slots and errors
sampled every second.

Set-up (all on loopback, ports chosen at run time): two fixtures (`mcpyard-loadgen
upstream`, 1 worker each), toolkits `a` and `b`; mcpyard (1 worker, io_uring by default)
with `server -> proxy (2 routes, list cache in a memory store) -> client a, client b`.

1. The max: a fresh mcpyard, closed loop on `a__echo` (8 connections, --max-duration).
2. The soak: a fresh mcpyard, open loop at --load % of that max, split over three
   generators (each its own `mcpyard-loadgen run --intervals`, one JSON line per second):
   `a` (a__echo, long-lived sessions, --gen-connections connections: an open loop needs
   idle connections, or the generator itself falls behind and its latency from the
   intended send climbs while mcpyard is idle), `b` (b__echo, --b-share % of the load) and
   `churn` (a__echo on sessions ended and renewed every --session-calls calls,
   --churn-rate calls/s). Meanwhile:
   - every --list-every s a fixture's tool list changes (POST /control/tools_changed,
     alternating a and b; the cache re-lists, every session is told);
   - every --kill-every s (first at half of it) fixture b is killed (SIGKILL) and started
     again on the same port --down s later;
   - every --sample s: mcpyard's RSS and open fds (/proc), its metrics endpoint
     (slots in use, sessions, upstream connections and sessions, per-toolkit requests
     and errors, cache refreshes), the CPU of every process group and of the machine.
3. The report (perf/results/<name>.md, .json, .svg): per --row seconds calls/s, p50/p99
   (from the intended send time) and errors per route, RSS, fds, slots; the events; the
   verdict: errors only on route b while it is down, route a's latency unaffected by b's
   deaths, RSS and fds flat after --warmup; and the seconds in which route a fell behind
   its rate, with mcpyard's CPU, the rest of the machine's, service time and the
   generator's own delay in them (to tell a gateway stall from a busy machine or a
   generator that cannot keep up). Per-second raw data stays in perf/results/raw/<name>/
   (not committed); --perf adds a profile of mcpyard after each restart against before
   each kill.
"""

import argparse
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import (  # noqa: E402
    CLK_TCK, QUIET, RAW, REPO, RESULTS, Fail, Fixture, Gateway, add_quiet_args, binaries, fd_count, fmt,
    loadgen, loadgen_cmd, log, machine_info, machine_line, main_guard, raise_nofile, rss_kib,
    scrape, set_quiet, system_ticks, table, wait_for_line, wait_quiet, write_report,
)

ROUTES = ("a", "b", "churn")  # the three generators; `churn` calls route a too
ROUTE_OF = {"a": "a", "b": "b", "churn": "a"}


def parse():
    ap = argparse.ArgumentParser(prog="soak.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("minutes", type=float, help="length of the soak in minutes (e.g. 3 or 10)")
    ap.add_argument("--io", default="uring", choices=("uring", "epoll"), help="mcpyard's I/O (uring)")
    ap.add_argument("--workers", type=int, default=1, help="mcpyard workers (1)")
    ap.add_argument("--connections", type=int, default=8,
                    help="connections of the closed-loop max run (8)")
    ap.add_argument("--gen-connections", type=int, default=32,
                    help="connections of generator a (32: each one request in flight, so an "
                         "open loop needs idle connections to absorb jitter; see the "
                         "loadgen's connection_busy warning)")
    ap.add_argument("--max-duration", default="5s", help="closed-loop max run length (5s)")
    ap.add_argument("--max-rate", type=float, default=None,
                    help="skip the max run and take this as the max (calls/s)")
    ap.add_argument("--load", type=float, default=60.0,
                    help="total open-loop load in %% of the max (60)")
    ap.add_argument("--b-share", type=float, default=10.0,
                    help="%% of the load that goes to route b (10)")
    ap.add_argument("--churn-rate", type=int, default=50,
                    help="calls/s of the churn generator, part of the load (50)")
    ap.add_argument("--session-calls", type=int, default=25,
                    help="calls per churn session before it is ended and a new one opened (25)")
    ap.add_argument("--list-every", type=float, default=5.0,
                    help="seconds between tool-list changes, alternating a and b (5)")
    ap.add_argument("--kill-every", type=float, default=60.0,
                    help="seconds between kills of fixture b; the first at half of it (60)")
    ap.add_argument("--down", type=float, default=5.0,
                    help="seconds fixture b stays dead before it is started again (5)")
    ap.add_argument("--no-kill", action="store_true",
                    help="never kill b (the A/B reference for the kills' cost)")
    ap.add_argument("--warmup", type=float, default=30.0,
                    help="seconds at the start not judged for flatness, latency or errors (30)")
    ap.add_argument("--row", type=int, default=10, help="seconds per report row (10)")
    ap.add_argument("--sample", type=float, default=1.0, help="seconds between samples (1)")
    ap.add_argument("--result-bytes", type=int, default=1024, help="tools/call result size (1024)")
    ap.add_argument("--cache-ttl", default="5m", help="the proxy cache's TTL (5m)")
    ap.add_argument("--name", default="soak",
                    help="report name: perf/results/<name>.{md,json,svg} (soak); raw data in "
                         "perf/results/raw/<name>/")
    ap.add_argument("--perf", action="store_true",
                    help="record mcpyard with `perf record -F 499` for the whole soak and "
                         "compare where its CPU went in the seconds after each restart of b "
                         "with the seconds before each kill")
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite the report and plot from perf/results/<name>.json and the raw "
                         "per-second data, without measuring")
    add_quiet_args(ap)
    a = ap.parse_args()
    if a.minutes <= 0 or a.minutes * 60 <= a.warmup + 2 * a.row:
        ap.error(f"MINUTES must leave more than --warmup + two rows ({a.warmup + 2 * a.row:.0f} s)")
    if not 0 < a.load <= 100 or not 0 <= a.b_share < 100:
        ap.error("--load must be in (0, 100] and --b-share in [0, 100)")
    if a.sample <= 0 or a.row < 1 or a.list_every <= 0 or a.kill_every <= 0 or a.down < 0:
        ap.error("--sample, --row, --list-every and --kill-every must be positive, --down >= 0")
    return a


# --------------------------------------------------------------------------- processes


class Upstream:
    """A fixture that can be killed and started again on the same port."""

    def __init__(self, procs, lg, name, args):
        self.procs, self.lg, self.name, self.args = procs, lg, name, args
        self.starts = 0
        fx = Fixture(procs, lg, f"{name}-{self.starts}", args)
        self.p, self.addr, self.url = fx.p, fx.addr, fx.url
        self.control = f"http://{self.addr}/control/tools_changed"

    @property
    def up(self):
        return self.p is not None and self.p.poll() is None

    def kill(self):
        """SIGKILL, as a crash: no goodbye to anyone."""
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()
        self.procs.stop(self.p)  # forgets it (already dead)
        self.p = None

    def start(self):
        """Starts it again on the same address; retries while the port is not free yet."""
        self.starts += 1
        argv = [self.lg, "upstream", "--listen", self.addr, "--workers", "1"] + self.args
        out = os.path.join(RAW, f"{self.name}-{self.starts}.log")
        for attempt in range(50):
            p = self.procs.start(f"{self.name}-{self.starts}", argv, out)
            try:
                wait_for_line(out, r"^listening ", p, timeout=5.0)
                self.p = p
                return attempt
            except Fail:
                self.procs.stop(p)
                time.sleep(0.1)
        raise Fail(f"fixture {self.name} could not listen on {self.addr} again; see {out}")


def post(url, timeout=2.0):
    """POSTs an empty JSON body; returns the answer or None if the target is down."""
    req = urllib.request.Request(url, data=b"{}", method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read().decode(errors="replace")
    except OSError:
        return None


def start_generator(procs, lg, tag, url, tool, rate, connections, a, outdir, extra=()):
    """One open-loop `run` for the whole soak, writing a line per second."""
    os.makedirs(outdir, exist_ok=True)
    total = a.minutes * 60
    argv = [lg, "run", "--url", url, "--scenario", "tools-call", "--tool", tool,
            "--rate", str(int(rate)), "--connections", str(connections),
            "--warmup", f"{a.warmup}s", "--duration", f"{total - a.warmup}s",
            "--intervals", os.path.join(outdir, f"{tag}.jsonl"), "--interval", "1s",
            "--json", os.path.join(outdir, f"{tag}.json")] + list(extra)
    p = procs.start(f"loadgen {tag}", argv, os.path.join(outdir, f"{tag}.log"))
    return p, argv


def proc_ticks(pid):
    """utime + stime ticks of every thread of pid, by thread name: {name: ticks}."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1:s.rindex(")")]
        rest = s[s.rfind(")") + 2:].split()
        out[name] = out.get(name, 0) + int(rest[11]) + int(rest[12])
    return out


def group_ticks(pids):
    """utime + stime ticks (all threads) of each pid: {pid: ticks}."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                s = f.read()
            rest = s[s.rfind(")") + 2:].split()
            out[pid] = int(rest[11]) + int(rest[12])
        except OSError:
            out[pid] = None
    return out


METRIC_KEYS = {
    "slots_in_use": "mcpyard_slots_in_use",
    "sessions": "mcpyard_sessions",
    "connections": "mcpyard_connections",
    "upstream_connections": "mcpyard_upstream_connections",
    "upstream_sessions": "mcpyard_upstream_sessions",
    "upstream_connects": "mcpyard_upstream_connects_total",
    "upstream_connect_failures": "mcpyard_upstream_connect_failures_total",
    "upstream_reinitialized": "mcpyard_upstream_reinitialized_total",
    "upstream_initialize_failures": "mcpyard_upstream_initialize_failures_total",
    "upstream_failed": "mcpyard_upstream_failed_total",
    "upstream_stale_dropped": "mcpyard_upstream_stale_dropped_total",
    "upstream_stale_retries": "mcpyard_upstream_stale_retries_total",
    "cache_refreshes_ok": "mcpyard_cache_refreshes_ok_total",
    "cache_refreshes_failed": "mcpyard_cache_refreshes_failed_total",
    "cache_notifications": "mcpyard_cache_notifications_total",
    "routes_ended": "mcpyard_proxy_routes_ended_total",
    "sessions_created": "mcpyard_sessions_created_total",
    "overload_rejections": "mcpyard_overload_rejections_total",
    "http_errors": "mcpyard_http_errors_total",
    "uring_flushes": "mcpyard_uring_flushes_total",
}


def metrics_sample(url):
    """The figures the soak follows from mcpyard's metrics endpoint (None if unreachable)."""
    try:
        m = scrape(url, timeout=2.0)
    except OSError:
        return None
    out = {k: m.get(v) for k, v in METRIC_KEYS.items()}
    for toolkit in ("a", "b"):
        for outcome in ("ok", "error"):
            key = (f'mcpyard_toolkit_requests_total{{toolkit="{toolkit}",method="tools/call",'
                   f'outcome="{outcome}"}}')
            out[f"toolkit_{toolkit}_{outcome}"] = m.get(key, 0.0)
    return out


# --------------------------------------------------------------------------- the run


def measure_max(procs, gw_bin, lg, a, fa, fb):
    gw = Gateway(procs, gw_bin, f"{a.name}-max-mcpyard", None, workers=a.workers, io=a.io,
                 routes=[("a", fa.url), ("b", fb.url)], cache=a.cache_ttl)
    log(f"max: closed loop on a__echo, {a.connections} connections, {a.max_duration}")
    r = loadgen(lg, "max", gw.url, rate=None, connections=a.connections,
                duration=a.max_duration, warmup="1s", extra=["--tool", "a__echo"],
                watch={"mcpyard": gw.pid}, files=False, subdir=f"raw/{a.name}")
    procs.stop(gw.p)
    n = r["requests_ok"] + sum(r["errors"].values())
    return {
        "throughput_rps": r["throughput_rps"],
        "p50_us": r["response_us"]["p50"],
        "p99_us": r["response_us"]["p99"],
        "errors": sum(r["errors"].values()),
        "mcpyard_cpu_us_per_req": r["cpu_us"]["mcpyard"] / n if n else None,
        "foreign_busy_pct": r["foreign_busy_pct"],
        "argv": loadgen_cmd(r["argv"]),
    }


def soak(procs, a):
    raise_nofile(4096)
    gw_bin, lg = binaries()
    info = machine_info()
    rawdir = os.path.join(RAW, a.name)
    os.makedirs(rawdir, exist_ok=True)
    fx_args = ["--result-bytes", str(a.result_bytes)]
    fa = Upstream(procs, lg, f"{a.name}-fixture-a", fx_args)
    fb = Upstream(procs, lg, f"{a.name}-fixture-b", fx_args)
    if a.max_rate:
        mx = {"throughput_rps": a.max_rate, "given": True}
    else:
        mx = measure_max(procs, gw_bin, lg, a, fa, fb)
    total = mx["throughput_rps"] * a.load / 100.0
    rate_b = round(total * a.b_share / 100.0)
    rate_churn = max(0, a.churn_rate)
    rate_a = max(1, round(total - rate_b - rate_churn))
    rates = {"a": rate_a, "b": rate_b, "churn": rate_churn}
    log(f"max {mx['throughput_rps']:,.0f} calls/s; soak at {a.load:.0f} %: a {rate_a}/s, "
        f"b {rate_b}/s, churn {rate_churn}/s (a new session every {a.session_calls} calls), "
        f"{a.minutes:g} min")

    gw = Gateway(procs, gw_bin, f"{a.name}-mcpyard", None, workers=a.workers, io=a.io,
                 routes=[("a", fa.url), ("b", fb.url)], cache=a.cache_ttl)
    busy, waited = wait_quiet()
    total_s = a.minutes * 60
    # b: enough connections to be busy at most a fifth of the time at ~400 µs per call
    conns = {"a": a.gen_connections, "b": max(2, math.ceil(rate_b * 400e-6 / 0.2)),
             "churn": 2}
    gens, argvs = {}, {}
    t0 = time.time()
    for tag, tool, extra in (("a", "a__echo", ()), ("b", "b__echo", ()),
                             ("churn", "a__echo", ("--session-calls", str(a.session_calls)))):
        if rates[tag] <= 0:
            continue
        gens[tag], argvs[tag] = start_generator(procs, lg, tag, gw.url, tool, rates[tag],
                                                conns[tag], a, rawdir, extra)
    perf = None
    if a.perf:
        perf_bin = shutil.which("perf")
        if not perf_bin:
            raise Fail("--perf needs perf (/usr/bin/perf)")
        perf = {"bin": perf_bin, "data": os.path.join(rawdir, "perf.data"),
                "mono0": time.monotonic() - (time.time() - t0)}
        perf["p"] = procs.start("perf", [perf_bin, "record", "-q", "-k", "CLOCK_MONOTONIC",
                                         "-F", "499", "-p", str(gw.pid), "-o", perf["data"],
                                         "--", "sleep", f"{total_s + 5:.0f}"],
                                os.path.join(rawdir, "perf.log"))
    pids = {"mcpyard": gw.pid, "fixture-a": fa.p.pid, "fixture-b": fb.p.pid,
            "harness": os.getpid()}
    if perf:
        pids["perf"] = perf["p"].pid
    pids.update({f"loadgen-{k}": p.pid for k, p in gens.items()})
    samples, events = [], []
    # Kills 1 s after a list-change tick, so the change before is seen by a live b and
    # the next ones fall while it is down.
    first = a.kill_every / 2 + 1
    kills = [] if a.no_kill else [
        first + k * a.kill_every
        for k in range(int(total_s // a.kill_every) + 1)
        if first + k * a.kill_every < total_s - 1
    ]
    restart_at = None
    next_list, list_turn = a.list_every, 0
    next_sample = 0.0
    prev = None
    log(f"soak running for {total_s:.0f} s (mcpyard {gw.url}); b killed at "
        f"{', '.join(f'{k:.0f}' for k in kills) or 'never'} s")
    while True:
        now = time.time() - t0
        if all(p.poll() is not None for p in gens.values()):
            break
        if now > total_s + 60:
            raise Fail("the generators are still running a minute after the soak's end")
        if kills and now >= kills[0]:
            kills.pop(0)
            fb.kill()
            events.append({"t": time.time() - t0, "event": "b killed"})
            log(f"t={now:.1f} s: fixture b killed")
            restart_at = now + a.down
        if restart_at is not None and now >= restart_at:
            restart_at = None
            tries = fb.start()
            pids["fixture-b"] = fb.p.pid
            events.append({"t": time.time() - t0, "event": "b started",
                           "bind_retries": tries})
            log(f"t={now:.1f} s: fixture b started again")
        if now >= next_list:
            next_list += a.list_every
            target = (fa, fb)[list_turn % 2]
            list_turn += 1
            answer = post(target.control) if target.up else None
            events.append({"t": time.time() - t0, "event": f"{target.name[-1]} list changed"
                           if answer is not None else f"{target.name[-1]} list change skipped"})
        if now >= next_sample:
            next_sample += a.sample
            s = take_sample(gw, pids, t0)
            if prev is not None:
                s["machine_busy_pct"] = busy_pct(prev["system"], s["system"])
            samples.append(s)
            prev = s
        time.sleep(0.02)
    wall = time.time() - t0
    for tag, p in gens.items():
        if p.returncode != 0:
            with open(os.path.join(rawdir, f"{tag}.log"), errors="replace") as f:
                tail = f.read()[-2000:]
            raise Fail(f"generator {tag} exited {p.returncode}:\n{tail}")
    if perf:
        procs.stop(perf["p"], grace=30.0)
    final = take_sample(gw, pids, t0)
    final["machine_busy_pct"] = busy_pct(prev["system"], final["system"]) if prev else None
    samples.append(final)
    procs.stop(gw.p)
    code = procs.exit_codes.get(gw.name)
    with open(os.path.join(RAW, f"{gw.name}.log"), errors="replace") as f:
        gw_log = f.read().splitlines()
    series = {}
    for tag in gens:
        with open(os.path.join(rawdir, f"{tag}.jsonl")) as f:
            series[tag] = [json.loads(line) for line in f if line.strip()]
    summaries = {}
    for tag in gens:
        with open(os.path.join(rawdir, f"{tag}.json")) as f:
            summaries[tag] = json.load(f)
    with open(os.path.join(rawdir, "samples.jsonl"), "w") as f:
        for s in samples:
            f.write(json.dumps(s, sort_keys=True) + "\n")
    with open(os.path.join(rawdir, "events.json"), "w") as f:
        json.dump({"t0": t0, "events": events}, f, indent=1)
    seconds = per_second(t0, series, samples, gw_log, total_s)
    with open(os.path.join(rawdir, "seconds.jsonl"), "w") as f:
        for s in seconds:
            f.write(json.dumps(s, sort_keys=True) + "\n")
    d = {
        "machine": info,
        "config": {k: v for k, v in vars(a).items() if k != "report_only"},
        "max": mx,
        "rates": rates,
        "connections": conns,
        "generators": {k: loadgen_cmd(v) for k, v in argvs.items()},
        "wall_s": wall,
        "quiet_before": {"busy_pct": busy, "waited_s": waited},
        "events": events,
        "mcpyard_exit": code,
        "totals": totals(summaries),
        "log_lines": log_counts(gw_log),
    }
    info["waited_s"] = QUIET["waited_total_s"]
    analyse(d, seconds, a)
    if perf:
        d["perf"] = perf_windows(perf, d["down_windows"], a)
    return d, seconds


PERF_WINDOW_S = 10  # seconds of each profile window


def perf_windows(perf, windows, a):
    """mcpyard's CPU by symbol (perf samples at 499 Hz) in the PERF_WINDOW_S seconds after
    each restart of b and in as many seconds ending 5 s before each kill, and in the 3 s
    from 1 s before each kill against the 3 s ending 5 s before it."""
    out = []
    for i, (killed, started) in enumerate(windows):
        for label, lo, span in (("before kill", killed - 5 - PERF_WINDOW_S, PERF_WINDOW_S),
                                ("after restart", started, PERF_WINDOW_S),
                                ("3 s, 5 s before kill", killed - 8, 3),
                                ("3 s around kill", killed - 1, 3)):
            if lo < a.warmup / 2:
                continue
            t_lo = perf["mono0"] + lo
            rep = subprocess.run(
                [perf["bin"], "report", "-i", perf["data"], "--stdio", "--no-children", "-n",
                 "--sort", "symbol", "--percent-limit", "0.5",
                 "--time", f"{t_lo:.6f},{t_lo + span:.6f}"],
                capture_output=True, text=True, timeout=300)
            rows, total = [], None
            for line in rep.stdout.splitlines():
                # cpu-clock: the event count is the CPU time sampled, in ns
                m = re.match(r"#\s*Event count \(approx\.\):\s*(\d+)", line)
                if m:
                    total = int(m.group(1)) / 1e9
                m = re.match(r"\s*([\d.]+)%\s+(\d+)\s+\[[.k]\]\s+(.*)$", line)
                if m:
                    rows.append({"pct": float(m.group(1)), "samples": int(m.group(2)),
                                 "symbol": re.split(r"\s{2,}", m.group(3).strip())[0][:90]})
            out.append({"kill": i + 1, "window": label, "from_s": round(lo, 1),
                        "seconds": span, "cpu_s": total,
                        "cpu_pct": 100.0 * total / span if total else None,
                        "top": rows[:20]})
    return out


def take_sample(gw, pids, t0):
    s = {"t": time.time() - t0, "unix": time.time()}
    try:
        s["rss_kib"] = rss_kib(gw.pid)
    except (Fail, OSError):
        s["rss_kib"] = None
    s["fds"] = fd_count(gw.pid)
    s["threads"] = proc_ticks(gw.pid)
    ticks = group_ticks(list(pids.values()))
    s["cpu_ticks"] = {k: ticks.get(pid) for k, pid in pids.items()}
    s["system"] = system_ticks()
    s["stat"] = cpu_fields()
    s["metrics"] = metrics_sample(gw.metrics_url)
    return s


def cpu_fields():
    """The machine's CPU ticks from /proc/stat: user, nice, system, idle, iowait, irq,
    softirq, steal."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:9]]


def busy_pct(before, after):
    total = after[0] - before[0]
    idle = after[1] - before[1]
    return 100.0 * (total - idle) / total if total else None


def log_counts(lines):
    """mcpyard's log lines by level and message (numbers and quoted parts folded)."""
    out = {}
    for line in lines:
        parts = line.split(" ", 2)
        if len(parts) < 3 or parts[1] not in ("INFO", "WARN", "ERROR"):
            continue
        msg = re.sub(r'"[^"]*"', '"…"', parts[2])
        msg = re.sub(r"\d+", "N", msg)
        key = f"{parts[1]} {msg}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def totals(summaries):
    out = {}
    for tag, r in summaries.items():
        out[tag] = {
            "requests_ok": r.get("requests_ok"),
            "errors": r.get("errors"),
            "unsent": r.get("unsent"),
            "warmup_requests": r.get("warmup_requests"),
            "p50_us": r["response_us"]["p50"],
            "p99_us": r["response_us"]["p99"],
            "p99_9_us": r["response_us"]["p99_9"],
            "max_us": r["response_us"]["max"],
            "throughput_rps": r.get("throughput_rps"),
            "connection_busy": r.get("connection_busy"),
            "connections": r.get("connections"),
        }
    return out


# --------------------------------------------------------------------------- analysis


def per_second(t0, series, samples, gw_log, total_s):
    """One record per whole second of the soak (harness time): every generator's line for
    that second, and the sample taken in it, with counter deltas and CPU % since the last."""
    out = {}
    for tag, lines in series.items():
        for line in lines:
            if "unix" not in line:
                continue
            start = line["unix"] - t0
            sec = int(math.floor(start + 0.5))
            rec = out.setdefault(sec, {"t": sec})
            rec[tag] = {
                "start": round(start, 3),
                "ok": line["ok"],
                "errors": sum(line["errors"].values()),
                "error_kinds": {k: v for k, v in line["errors"].items() if v},
                "completed_per_s": line["completed_per_s"],
                "completed_ok_per_s": line["completed_ok_per_s"],
                # failures by the second they *finished* in (a late generator sends a
                # request intended before a kill after it)
                "failed_done": line["completed"] - line["completed_ok"],
                "p50_us": line["p50_us"],
                "p99_us": line["p99_us"],
                "max_us": line["max_us"],
                "service_p50_us": line.get("service_p50_us"),
                "service_p99_us": line.get("service_p99_us"),
                "gen_delay_p99_us": line.get("generator_delay_p99_us"),
                "gen_delay_max_us": line.get("generator_delay_max_us"),
                "warmup": line["warmup"],
            }
    prev = None
    for s in samples:
        sec = int(math.floor(s["t"]))
        rec = out.setdefault(sec, {"t": sec})
        rec["rss_kib"] = s["rss_kib"]
        rec["fds"] = s["fds"]
        m = s.get("metrics") or {}
        rec["slots_in_use"] = m.get("slots_in_use")
        for k in ("sessions", "upstream_connections", "upstream_sessions", "connections"):
            rec[k] = m.get(k)
        rec["machine_busy_pct"] = s.get("machine_busy_pct")
        if prev is not None:
            dt = s["t"] - prev["t"]
            pm = prev.get("metrics") or {}
            rec["delta"] = {k: (m.get(k) - pm.get(k)) if m.get(k) is not None
                            and pm.get(k) is not None else None
                            for k in m if k.startswith(("toolkit_", "upstream_", "cache_",
                                                        "routes_", "sessions_created",
                                                        "overload", "http_errors"))
                            and k not in ("upstream_connections", "upstream_sessions")}
            cpu = {}
            for k, v in s["cpu_ticks"].items():
                pv = prev["cpu_ticks"].get(k)
                if v is not None and pv is not None and v >= pv:
                    cpu[k] = 100.0 * (v - pv) / CLK_TCK / dt
            rec["cpu_pct"] = cpu
            if s.get("stat") and prev.get("stat"):
                # Of all cores: time in processes (user + system) not spent by anything
                # started here is other people's work; interrupts and softirqs (mostly the
                # loopback traffic of this very soak) and steal are counted apart.
                dv = [x - y for x, y in zip(s["stat"], prev["stat"])]
                total = sum(dv) or 1
                ours = sum(cpu.values()) / (os.cpu_count() or 1)
                rec["foreign_pct"] = max(0.0, 100.0 * (dv[0] + dv[1] + dv[2]) / total - ours)
                rec["irq_pct"] = 100.0 * (dv[5] + dv[6]) / total
                rec["steal_pct"] = 100.0 * dv[7] / total
            elif s.get("machine_busy_pct") is not None:
                ours = sum(cpu.values()) / (os.cpu_count() or 1)
                rec["foreign_pct"] = max(0.0, s["machine_busy_pct"] - ours)
            threads = {}
            for k, v in s["threads"].items():
                pv = prev["threads"].get(k)
                if pv is not None and v >= pv:
                    threads[k] = 100.0 * (v - pv) / CLK_TCK / dt
            rec["mcpyard_threads_cpu_pct"] = threads
        prev = s
    for line in gw_log:
        parts = line.split(" ", 2)
        try:
            unix = float(parts[0])
        except (ValueError, IndexError):
            continue
        if len(parts) > 1 and parts[1] in ("WARN", "ERROR"):
            sec = int(math.floor(unix - t0))
            rec = out.setdefault(sec, {"t": sec})
            rec["log_warnings"] = rec.get("log_warnings", 0) + 1
    return [out[k] for k in sorted(out) if -5 <= k <= total_s + 30]


def down_windows(events, total_s):
    """[(killed at, started at)] of fixture b, harness seconds."""
    out, killed = [], None
    for e in events:
        if e["event"] == "b killed":
            killed = e["t"]
        elif e["event"] == "b started" and killed is not None:
            out.append((killed, e["t"]))
            killed = None
    if killed is not None:
        out.append((killed, total_s))
    return out


RSS_FLOOR_S = 60  # RSS at a steady point: the lowest of the seconds up to it (a kill period)
RSS_GROWTH_MAX_KIB = 1024  # from the first steady point to the last
FDS_GROWTH_MAX = 16  # the upstream pools follow the load's concurrency, within this
FOREIGN_MAX_PCT = 25  # other work on the machine beyond which a run says nothing of latency
AFTER_RESTART_S = 15  # seconds after b is back that still count as "around the restart"
DOWN_GRACE_S = 2  # errors this long after b is back still count as "while it was down"
# A call's errors are counted in the second it was meant to be sent; one meant for the last
# moment before the kill is still in flight when b dies and fails with it. Such calls (meant
# up to this long before the kill) count as "while it was down" too.
IN_FLIGHT_S = 1


def analyse(d, seconds, a):
    """Rows of `a.row` seconds and the verdict, into d."""
    total_s = a.minutes * 60
    windows = down_windows(d["events"], total_s)
    d["down_windows"] = windows

    def near(rec, tag, grace, before=0.0):
        # the generator's second [start, start + 1) overlaps [kill - before, restart + grace)
        st = rec[tag]["start"] if tag in rec else rec["t"]
        return any(st < s + grace and st + 1 > k - before for k, s in windows)

    steady = [s for s in seconds if a.warmup <= s["t"] < total_s]
    rows = []
    for start in range(0, int(total_s), a.row):
        chunk = [s for s in seconds if start <= s["t"] < start + a.row]
        if not chunk:
            continue
        row = {"t": start, "warmup": start < a.warmup,
               "b_down_s": round(sum(max(0.0, min(s, start + a.row) - max(k, start))
                                     for k, s in windows), 1)}
        for tag in ROUTES:
            per = [s[tag] for s in chunk if tag in s]
            if not per:
                continue
            p50s = [p["p50_us"] for p in per if p["p50_us"] is not None]
            p99s = [p["p99_us"] for p in per if p["p99_us"] is not None]
            row[tag] = {
                "calls_per_s": sum(p["completed_ok_per_s"] for p in per) / len(per),
                "min_calls_per_s": min(p["completed_ok_per_s"] for p in per),
                "p50_us": statistics.median(p50s) if p50s else None,
                "p99_us": max(p99s) if p99s else None,
                "errors": sum(p["errors"] for p in per),
            }
        for k in ("rss_kib", "fds", "slots_in_use", "upstream_connections", "sessions"):
            vals = [s[k] for s in chunk if s.get(k) is not None]
            row[k] = vals[-1] if vals else None
            if k in ("fds", "slots_in_use") and vals:
                row[k + "_max"] = max(vals)
        cpu = [s["cpu_pct"].get("mcpyard") for s in chunk
               if s.get("cpu_pct", {}).get("mcpyard") is not None]
        row["mcpyard_cpu_pct"] = statistics.mean(cpu) if cpu else None
        busy = [s["machine_busy_pct"] for s in chunk if s.get("machine_busy_pct") is not None]
        row["machine_busy_pct"] = statistics.mean(busy) if busy else None
        foreign = [s["foreign_pct"] for s in chunk if s.get("foreign_pct") is not None]
        row["foreign_pct"] = statistics.mean(foreign) if foreign else None
        row["log_warnings"] = sum(s.get("log_warnings", 0) for s in chunk)
        gw_err = {}
        for tk in ("a", "b"):
            gw_err[tk] = sum((s.get("delta") or {}).get(f"toolkit_{tk}_error") or 0 for s in chunk)
        row["mcpyard_errors"] = gw_err
        rows.append(row)
    d["rows"] = rows

    # Verdict 1: errors only on the killed route while it is down.
    errs = {"a_anywhere": 0, "b_outside_down": 0, "b_while_down": 0}
    b_outside = []
    for s in steady + [s for s in seconds if s["t"] < a.warmup]:
        for tag in ("a", "churn"):
            if tag in s:
                errs["a_anywhere"] += s[tag]["errors"]
        failed = s["b"].get("failed_done", s["b"]["errors"]) if "b" in s else 0
        if failed:
            if near(s, "b", DOWN_GRACE_S, IN_FLIGHT_S):
                errs["b_while_down"] += failed
            else:
                errs["b_outside_down"] += failed
                b_outside.append(s["t"])
    gw_a = sum((s.get("delta") or {}).get("toolkit_a_error") or 0 for s in seconds)
    errs["mcpyard_toolkit_a_errors"] = gw_a
    errs["b_outside_down_at_s"] = b_outside[:20]
    v1 = errs["a_anywhere"] == 0 and errs["b_outside_down"] == 0 and gw_a == 0

    # Verdict 2: route a's latency and rate around b's deaths against the rest (steady).
    around = [s for s in steady if "a" in s and near(s, "a", AFTER_RESTART_S)]
    rest = [s for s in steady if "a" in s and not near(s, "a", AFTER_RESTART_S)]

    def stats(ss):
        p99 = [s["a"]["p99_us"] for s in ss if s["a"]["p99_us"] is not None]
        rate = [s["a"]["completed_ok_per_s"] for s in ss]
        return {
            "seconds": len(ss),
            "p99_median_us": statistics.median(p99) if p99 else None,
            "p99_worst_us": max(p99) if p99 else None,
            "p99_over_10ms_s": sum(1 for v in p99 if v > 10_000),
            "calls_per_s_min": min(rate) if rate else None,
            "p50_median_us": statistics.median([s["a"]["p50_us"] for s in ss
                                                if s["a"]["p50_us"] is not None] or [0]),
        }

    lat = {"around_b_down": stats(around), "rest": stats(rest),
           "window_s": f"from b's kill to {AFTER_RESTART_S} s after its restart"}
    ar, re_ = lat["around_b_down"], lat["rest"]
    if ar["seconds"] and re_["seconds"]:
        # per-second p99s around the deaths against the rest, with room for the noise of
        # a shared machine: the typical second within 1.5x + 0.5 ms, the worst within
        # 2x + 1 ms, and never under 90 % of a's rate
        med_bound = 1.5 * re_["p99_median_us"] + 500
        worst_bound = 2 * re_["p99_worst_us"] + 1000
        v2 = (ar["p99_median_us"] <= med_bound and ar["p99_worst_us"] <= worst_bound
              and ar["calls_per_s_min"] >= 0.9 * d["rates"]["a"])
        lat["median_bound_us"] = med_bound
        lat["worst_bound_us"] = worst_bound
    else:
        v2 = None
    # Verdict 3: RSS and fds flat after warm-up. Judged at steady points: 3 s before each
    # kill (b up, nothing restarting) and the last second, from the one before the second
    # kill on, so that the first death and restart of b (first use of the error, retry and
    # reconnect paths) counts as warm-up too; without kills, every minute after warm-up.
    kill_marks = [k - 3 for k, _ in windows if k - 3 >= a.warmup]
    marks = (kill_marks[1:] if len(kill_marks) >= 2 else kill_marks) or \
        [t for t in range(int(a.warmup), int(total_s), 60)]
    marks = marks + [total_s - 1]
    rss = [(s["t"], s["rss_kib"]) for s in steady if s.get("rss_kib")]
    at = []
    for m in marks:
        s = min(steady or seconds, key=lambda s: abs(s["t"] - m))
        # RSS moves by a block of a MiB or two that the allocator takes and gives back
        # again (for seconds to a minute): the floor of the minute up to the point is what a
        # leak would raise
        floor = [v for t, v in rss if m - RSS_FLOOR_S < t <= m + 0.5]
        at.append({"t": s["t"], "rss_kib": min(floor) if floor else s.get("rss_kib"),
                   "rss_now_kib": s.get("rss_kib"), "fds": s.get("fds"),
                   "slots_in_use": s.get("slots_in_use")})
    fds = [s["fds"] for s in steady if s.get("fds") is not None]
    rss_marks = [m["rss_kib"] for m in at if m["rss_kib"] is not None]
    fd_marks = [m["fds"] for m in at if m["fds"] is not None]
    flat = {
        "marks": at,
        "rss_first_kib": rss[0][1] if rss else None,
        "rss_last_kib": rss[-1][1] if rss else None,
        "rss_max_kib": max(v for _, v in rss) if rss else None,
        "rss_slope_kib_per_min": slope_per_min(rss),
        "rss_growth_kib": rss_marks[-1] - rss_marks[0] if len(rss_marks) >= 2 else None,
        "fds_min": min(fds) if fds else None,
        "fds_max": max(fds) if fds else None,
        "fd_marks": fd_marks,
        "fds_growth": fd_marks[-1] - fd_marks[0] if len(fd_marks) >= 2 else None,
        "first_death_rss_kib": None,
    }
    if windows:
        # what the first death and restart of b cost (the warm-up of those paths)
        k, started = windows[0]
        before = [v for t, v in rss if k - 5 <= t < k]
        after = [v for t, v in rss if started + 5 <= t < started + 10]
        if before and after:
            flat["first_death_rss_kib"] = statistics.mean(after) - statistics.mean(before)
    v3 = (flat["rss_growth_kib"] is not None and flat["rss_growth_kib"] <= RSS_GROWTH_MAX_KIB
          and flat["fds_growth"] is not None and flat["fds_growth"] <= FDS_GROWTH_MAX)
    # Did the machine leave room for the soak? Other work (builds, tests of other people)
    # takes cores from the generators and mcpyard alike; then no latency verdict holds.
    foreign = [s["foreign_pct"] for s in steady if s.get("foreign_pct") is not None]
    unsent = (d.get("totals", {}).get("a") or {}).get("unsent") or 0
    def smean(key):
        vals = [s[key] for s in steady if s.get(key) is not None]
        return statistics.mean(vals) if vals else None
    room = {"foreign_mean_pct": statistics.mean(foreign) if foreign else None,
            "unsent_a": unsent, "machine_busy_mean_pct": smean("machine_busy_pct"),
            "irq_mean_pct": smean("irq_pct"), "steal_mean_pct": smean("steal_pct")}
    v0 = (room["foreign_mean_pct"] is not None and room["foreign_mean_pct"] <= FOREIGN_MAX_PCT
          and unsent == 0)
    d["verdict"] = {"room": room, "room_ok": v0, "errors": errs, "errors_ok": v1,
                    "latency": lat, "latency_ok": v2, "flat": flat, "flat_ok": v3}
    d["dips"] = dips(seconds, steady, d["rates"]["a"], lambda s: near(s, "a", AFTER_RESTART_S))


DIP_SHARE = 0.95  # a second in which route a finished fewer than this share of its rate


def dips(seconds, steady, rate_a, near_restart):
    """The steady seconds in which route a finished fewer calls than its rate asks, near
    b's restarts and elsewhere, with what mcpyard, the generator and the rest of the
    machine were doing in them (to tell a gateway stall from a busy machine)."""
    def describe(ss):
        def mean(key):
            vals = [key(s) for s in ss]
            vals = [v for v in vals if v is not None]
            return statistics.mean(vals) if vals else None
        return {
            "seconds": len(ss),
            "mcpyard_cpu_pct": mean(lambda s: s.get("cpu_pct", {}).get("mcpyard")),
            "loadgen_a_cpu_pct": mean(lambda s: s.get("cpu_pct", {}).get("loadgen-a")),
            "foreign_pct": mean(lambda s: s.get("foreign_pct")),
            "machine_busy_pct": mean(lambda s: s.get("machine_busy_pct")),
            "service_p50_us": mean(lambda s: s["a"].get("service_p50_us")),
            "service_p99_us": mean(lambda s: s["a"].get("service_p99_us")),
            "gen_delay_p99_us": mean(lambda s: s["a"].get("gen_delay_p99_us")),
            "p99_us": mean(lambda s: s["a"].get("p99_us")),
            "calls_per_s": mean(lambda s: s["a"]["completed_ok_per_s"]),
            "at_s": [s["t"] for s in ss][:30],
        }
    ss = [s for s in steady if "a" in s]
    low = [s for s in ss if s["a"]["completed_ok_per_s"] < DIP_SHARE * rate_a]
    out = {
        "threshold_calls_per_s": DIP_SHARE * rate_a,
        "near_restart": describe([s for s in low if near_restart(s)]),
        "elsewhere": describe([s for s in low if not near_restart(s)]),
        "near_restart_seconds": sum(1 for s in ss if near_restart(s)),
        "elsewhere_seconds": sum(1 for s in ss if not near_restart(s)),
        "all_steady": describe(ss),
    }
    return out


def slope_per_min(points):
    """Least-squares slope of (t s, v) in v per minute."""
    if len(points) < 2:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if not den:
        return None
    return 60.0 * sum((t - mt) * (v - mv) for t, v in points) / den


# --------------------------------------------------------------------------- report


def mib(kib):
    return f"{kib / 1024:.1f}" if kib is not None else "–"


def ms(us):
    if us is None:
        return "–"
    return f"{us / 1000:.2f}" if us < 10_000 else f"{us / 1000:,.0f}"


def yes(v):
    return {True: "**yes**", False: "**no**", None: "n/a"}[v]


def report(d):
    c = d["config"]
    rates = d["rates"]
    mx = d["max"]
    v = d["verdict"]
    lines = [f"# soak: {c['minutes']:g} minutes through server → proxy (cache) → 2 clients, "
             "route b's upstream killed every minute", ""]
    lines.append(f"Generated by `perf/soak.sh {c['minutes']:g}` — "
                 + machine_line(d["machine"], d["machine"].get("waited_s")))
    lines.append("")
    kills = "never (A/B reference run)" if c["no_kill"] else (
        f"every {c['kill_every']:g} s from {c['kill_every'] / 2 + 1:g} s on (SIGKILL), started "
        f"again on the same port {c['down']:g} s later")
    lines.append(
        f"mcpyard: {c['workers']} worker, {c['io']}, `server → proxy (cache: memory store, ttl "
        f"{c['cache_ttl']}) → client a, client b`; two fixtures (`mcpyard-loadgen upstream "
        f"--workers 1 --result-bytes {c['result_bytes']}`). Max: "
        + (f"{mx['throughput_rps']:,.0f} calls/s given with --max-rate" if mx.get("given") else
           f"**{mx['throughput_rps']:,.0f} calls/s** (closed loop on `a__echo`, "
           f"{c['connections']} connections, {c['max_duration']}; p50 {ms(mx['p50_us'])} ms, "
           f"mcpyard {fmt(mx['mcpyard_cpu_us_per_req'], 1)} CPU µs/call)")
        + f". Soak at {c['load']:g} % of it, open loop, three generators: **a** "
        f"{rates['a']:,}/s on `a__echo` ({d['connections']['a']} connections, sessions kept), "
        f"**b** {rates['b']:,}/s on `b__echo` ({d['connections']['b']} connections), **churn** "
        f"{rates['churn']:,}/s on `a__echo` ({d['connections']['churn']} connections, each "
        f"session ended with DELETE after {c['session_calls']} calls and a new one opened, "
        f"inside that call's latency). A tool list changes every {c['list_every']:g} s "
        f"(fixture a and b in turn, `POST /control/tools_changed`); fixture b is killed "
        f"{kills}. First {c['warmup']:g} s: warm-up (shown, not judged). The soak took "
        f"{d['wall_s']:.0f} s; mcpyard exited {d['mcpyard_exit']} on SIGTERM.")
    lines.append("")
    lines.append("Latency is from each call's *intended* send time (open loop), in ms; "
                 "calls/s is what finished per second (the mean over the row, and the "
                 "lowest second); p50 is the median of the row's per-second p50s and p99 the "
                 "**highest** per-second p99 in the row. Errors are the generators' (any "
                 "failed call). RSS, fds (mcpyard's open file descriptors) and slots (read "
                 "slots in use, of 1,024 per worker) at the row's last second, with the "
                 "row's max beside fds and slots. mcpyard CPU: % of one core (its one worker "
                 "can use 100); other work: the time the machine's cores spent in processes "
                 "not started here, % of both cores (other builds share this machine; "
                 "interrupts and softirqs, mostly this soak's own loopback traffic, are not "
                 "counted in it).")
    lines.append("")
    lines.append("## Verdict")
    lines.append("")
    e = v["errors"]
    lat = v["latency"]
    ar, rs = lat["around_b_down"], lat["rest"]
    f = v["flat"]
    lines.append(table(
        ["check", "result", "figures"],
        [
            ["the machine left room for the soak (a valid run)", yes(v.get("room_ok")),
             f"other work (not started here) took {fmt(v.get('room', {}).get('foreign_mean_pct'))} "
             f"% of both cores on average after warm-up, generator a left "
             f"{v.get('room', {}).get('unsent_a', 0):,} calls unsent (pass: ≤ {FOREIGN_MAX_PCT} "
             "% and none; otherwise the latencies below measure the machine). The machine was "
             f"{fmt(v.get('room', {}).get('machine_busy_mean_pct'))} % busy in all, "
             f"{fmt(v.get('room', {}).get('irq_mean_pct'))} % of it in interrupts and "
             f"softirqs (the loopback traffic), {fmt(v.get('room', {}).get('steal_mean_pct'))} "
             "% stolen by the hypervisor"],
            ["errors only on route b, only while its upstream is down", yes(v["errors_ok"]),
             f"route a (generators a and churn): {e['a_anywhere']:,} errors, mcpyard's "
             f"toolkit a errors {e['mcpyard_toolkit_a_errors']:,.0f}; route b: "
             f"{e['b_while_down']:,.0f} failed while it was down (calls in flight at the kill, "
             f"to {DOWN_GRACE_S} s after the restart), {e['b_outside_down']:,.0f} outside"
             + (f" (at s {', '.join(str(t) for t in e['b_outside_down_at_s'])})"
                if e["b_outside_down_at_s"] else "")],
            ["route a's latency unaffected by b's deaths", yes(v["latency_ok"]),
             f"{lat['window_s']}: {ar['seconds']} s, per-second p99 median "
             f"{ms(ar['p99_median_us'])} ms, worst {ms(ar['p99_worst_us'])} ms, lowest "
             f"{fmt(ar['calls_per_s_min'])} calls/s; the other {rs['seconds']} s: median "
             f"{ms(rs['p99_median_us'])} ms, worst {ms(rs['p99_worst_us'])} ms, lowest "
             f"{fmt(rs['calls_per_s_min'])} calls/s"
             + (f" (pass: median ≤ {ms(lat['median_bound_us'])} ms = 1.5 × the rest's + "
                f"0.5, worst ≤ {ms(lat['worst_bound_us'])} ms = 2 × the rest's + 1, and "
                "never under 90 % of a's rate)" if lat.get("worst_bound_us") else "")],
            ["RSS and fds flat after warm-up", yes(v["flat_ok"]),
             f"at the steady points (3 s before each kill from the second on, and the end: "
             f"s {', '.join(str(m['t']) for m in f['marks'])}): RSS "
             f"{' → '.join(mib(m['rss_kib']) for m in f['marks'])} MiB "
             f"({fmt(f['rss_growth_kib'])} KiB; the lowest of the {RSS_FLOOR_S} s up to each "
             f"point, since RSS also moves by a block of 1–2 MiB that the allocator takes "
             f"and gives back, see the plot), fds "
             f"{' → '.join(str(m['fds']) for m in f['marks'])}; over all steady seconds RSS "
             f"{mib(f['rss_first_kib'])} → {mib(f['rss_last_kib'])} MiB (max "
             f"{mib(f['rss_max_kib'])}), fds {f['fds_min']}–{f['fds_max']}"
             + (f"; b's first death and restart moved RSS by "
                f"{fmt(f['first_death_rss_kib'])} KiB" if f.get("first_death_rss_kib")
                is not None else "")
             + f" (pass: RSS grows ≤ {RSS_GROWTH_MAX_KIB} KiB and fds ≤ {FDS_GROWTH_MAX} "
             "between the first steady point and the last; fds follow the upstream pools, "
             "which track the load's concurrency)"],
        ], ["l", "l", "l"]))
    lines.append("")
    dp = d.get("dips")
    if dp:
        def dip_line(label, x, of):
            if not x["seconds"]:
                return f"{label}: none of {of} s"
            return (f"{label}: {x['seconds']} of {of} s (at {', '.join(str(t) for t in x['at_s'][:12])}"
                    f"{' …' if len(x['at_s']) > 12 else ''}); in them route a finished "
                    f"{fmt(x['calls_per_s'])} calls/s, mcpyard used {fmt(x['mcpyard_cpu_pct'])} % "
                    f"of a core, generator a {fmt(x['loadgen_a_cpu_pct'])} %, other work on the "
                    f"machine {fmt(x['foreign_pct'])} % of both cores; p99 from the intended "
                    f"send {ms(x['p99_us'])} ms, service time (from the actual send) p50 "
                    f"{ms(x['service_p50_us'])} / p99 {ms(x['service_p99_us'])} ms, the "
                    f"generator's own delay before a send p99 {ms(x['gen_delay_p99_us'])} ms")
        al = dp["all_steady"]
        lines.append(f"**Dips** (seconds after warm-up in which route a finished fewer than "
                     f"{fmt(dp['threshold_calls_per_s'])} calls, {DIP_SHARE:.0%} of its rate). "
                     + dip_line("Near b's restarts", dp["near_restart"], dp["near_restart_seconds"])
                     + "; " + dip_line("elsewhere", dp["elsewhere"], dp["elsewhere_seconds"])
                     + f". Over all {al['seconds']} steady seconds: mcpyard "
                     f"{fmt(al['mcpyard_cpu_pct'])} % of a core, other work "
                     f"{fmt(al['foreign_pct'])} % of both cores, p99 {ms(al['p99_us'])} ms, "
                     f"service p50 {ms(al['service_p50_us'])} / p99 {ms(al['service_p99_us'])} "
                     f"ms, generator delay p99 {ms(al['gen_delay_p99_us'])} ms (all means of the "
                     "per-second figures). A target too slow for the schedule shows as high "
                     "service times; a generator that cannot keep up (its threads waiting for "
                     "a CPU) as a high generator delay while service times stay low.")
        lines.append("")
    t = d["totals"]
    lines.append("Totals after warm-up (the generators' own summaries): " + "; ".join(
        f"{k}: {t[k]['requests_ok']:,} ok, {sum(t[k]['errors'].values()):,} errors, "
        f"{t[k]['unsent']:,} unsent, p50 {ms(t[k]['p50_us'])} / p99 {ms(t[k]['p99_us'])} / "
        f"p99.9 {ms(t[k]['p99_9_us'])} / max {ms(t[k]['max_us'])} ms, each of its "
        f"{t[k].get('connections')} connections busy "
        f"{fmt((t[k].get('connection_busy') or 0) * 100)} % of the time" for k in t) + ".")
    lines.append("")
    lines.append("## Per interval")
    lines.append("")
    heads = ["t s", "b down s", "a calls/s (min)", "a p50", "a p99", "a err",
             "churn p50", "churn p99", "churn err", "b calls/s", "b p99", "b err",
             "RSS MiB", "fds (max)", "slots (max)", "mcpyard CPU %", "other work %"]
    rows = []
    for r in d["rows"]:
        def g(tag, k, f=ms):
            return f(r[tag][k]) if tag in r else "–"
        rows.append([
            f"{r['t']}{' w' if r['warmup'] else ''}",
            f"{r['b_down_s']:g}" if r["b_down_s"] else "",
            (f"{r['a']['calls_per_s']:,.0f} ({r['a']['min_calls_per_s']:,.0f})"
             if "a" in r else "–"),
            g("a", "p50_us"), g("a", "p99_us"), g("a", "errors", fmt),
            g("churn", "p50_us"), g("churn", "p99_us"), g("churn", "errors", fmt),
            g("b", "calls_per_s", fmt), g("b", "p99_us"), g("b", "errors", fmt),
            mib(r["rss_kib"]), f"{r['fds']} ({r.get('fds_max')})",
            f"{r['slots_in_use']:.0f} ({r.get('slots_in_use_max', 0):.0f})"
            if r["slots_in_use"] is not None else "–",
            fmt(r["mcpyard_cpu_pct"]), fmt(r.get("foreign_pct")),
        ])
    lines.append(table(heads, rows))
    lines.append("")
    lines.append("`w`: warm-up. ![soak plot](" + c["name"] + ".svg)")
    lines.append("")
    lines.append("## Events and log")
    lines.append("")
    ev = [e for e in d["events"] if "list" not in e["event"]]
    lines.append("Kills and restarts (s from the start): " + (", ".join(
        f"{e['event']} {e['t']:.1f}" for e in ev) or "none") + f"; {sum(1 for e in d['events'] if e['event'].endswith('changed'))} "
        "list changes.")
    lines.append("")
    if d["log_lines"]:
        lines.append("mcpyard's log lines, by message (numbers folded to N):")
        lines.append("")
        lines.append(table(["count", "line"], [[f"{n:,}", f"`{k}`"] for k, n in
                                                list(d["log_lines"].items())[:12]], ["r", "l"]))
        lines.append("")
    if d.get("perf"):
        lines.append(f"mcpyard's CPU by symbol (`perf record -F 499` over the soak: "
                     f"{PERF_WINDOW_S} s ending 5 s before each kill and from each restart, "
                     "3 s ending 5 s before each kill and from 1 s before it; CPU % of one "
                     "core, then the top symbols' share):")
        lines.append("")
        lines.append(table(["kill", "window", "from s", "CPU %", "top symbols (% of samples)"],
                           [[w["kill"], w["window"], w["from_s"], fmt(w["cpu_pct"]),
                             "; ".join(f"{r['symbol']} {r['pct']:.1f}" for r in w["top"][:6])]
                            for w in d["perf"]], ["r", "l", "r", "r", "l"]))
        lines.append("")
    lines.append("Generators (ports replaced):")
    lines.append("")
    for k, cmd in d["generators"].items():
        lines.append(f"- {k}: `{cmd}`")
    lines.append("")
    lines.append(f"Raw per-second data: `perf/results/raw/{c['name']}/` (not committed): "
                 "`seconds.jsonl` (every generator's line, the sample, counter deltas, CPU % "
                 "of each process and of mcpyard's threads), `samples.jsonl`, the generators' "
                 "`*.jsonl` and `*.json`, `events.json`.")
    lines.append("")
    return "\n".join(lines)


# --------------------------------------------------------------------------- svg


def svg(d, seconds):
    """A hand-written SVG: calls/s, p99, errors per route, RSS, fds and slots over time, b's
    down windows shaded."""
    c = d["config"]
    total = c["minutes"] * 60
    W, left, right = 960, 70, 20
    panel_h, gap, top = 120, 34, 40
    panels = [
        ("calls/s (successful, finished per second)", [("a", "#1f77b4"), ("churn", "#2ca02c"),
                                           ("b", "#d62728")], "calls", False),
        ("p99 from intended send, ms (log); a's service p99 and generator delay p99",
         [("a", "#1f77b4"), ("churn", "#2ca02c"), ("b", "#d62728"), ("a-service", "#17becf"),
          ("a-gen", "#7f7f7f")], "p99", True),
        ("errors per second", [("a", "#1f77b4"), ("churn", "#2ca02c"), ("b", "#d62728")],
         "errors", False),
        ("mcpyard RSS, MiB", [("rss", "#9467bd")], "rss", False),
        ("mcpyard fds and slots in use", [("fds", "#8c564b"), ("slots", "#e377c2")], "fds",
         False),
    ]
    H = top + len(panels) * (panel_h + gap) + 20
    x_of = lambda t: left + (W - left - right) * max(0.0, min(t, total)) / total  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{left}" y="20" font-size="14">soak: {c["minutes"]:g} min, mcpyard '
           f'{c["workers"]} worker {c["io"]}, {c["load"]:g} % of max; grey: route b\'s upstream '
           'down</text>']

    def value(s, key, tag):
        if key == "calls":
            return s[tag]["completed_ok_per_s"] if tag in s else None
        if key == "p99":
            field = {"a-service": "service_p99_us", "a-gen": "gen_delay_p99_us"}.get(tag, "p99_us")
            src = "a" if tag.startswith("a-") else tag
            v = s[src].get(field) if src in s else None
            return v / 1000 if v else None
        if key == "errors":
            return s[tag]["errors"] if tag in s else None
        if key == "rss":
            return s["rss_kib"] / 1024 if s.get("rss_kib") else None
        if key == "fds":
            return s.get("fds") if tag == "fds" else s.get("slots_in_use")
        return None

    for i, (title, series_, key, logy) in enumerate(panels):
        y0 = top + i * (panel_h + gap)
        pts = {tag: [(s["t"], value(s, key, tag)) for s in seconds
                     if 0 <= s["t"] < total and value(s, key, tag) is not None]
               for tag, _ in series_}
        vals = [v for p in pts.values() for _, v in p]
        if logy:
            lo = 10 ** math.floor(math.log10(max(min(vals), 1e-3))) if vals else 0.1
            hi = 10 ** math.ceil(math.log10(max(max(vals), lo * 10))) if vals else 1000
        else:
            lo = 0.0
            if key == "rss" and vals:
                lo = math.floor(min(vals) * 0.9)
            hi = max(vals) * 1.1 if vals else 1.0
            if hi <= lo:
                hi = lo + 1.0

        def y_of(v):
            if logy:
                v = max(v, lo)
                f = (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
            else:
                f = (v - lo) / (hi - lo)
            return y0 + panel_h - panel_h * max(0.0, min(1.0, f))

        out.append(f'<text x="{left}" y="{y0 - 6}" font-size="12">{title}</text>')
        for k, s in d["down_windows"]:
            out.append(f'<rect x="{x_of(k):.1f}" y="{y0}" width="{max(1.0, x_of(s) - x_of(k)):.1f}" '
                       f'height="{panel_h}" fill="#ddd"/>')
        if c["warmup"]:
            out.append(f'<rect x="{left}" y="{y0}" width="{x_of(c["warmup"]) - left:.1f}" '
                       f'height="{panel_h}" fill="#f4f4f4"/>')
        out.append(f'<rect x="{left}" y="{y0}" width="{W - left - right}" height="{panel_h}" '
                   'fill="none" stroke="#888"/>')
        ticks = ([lo * 10 ** k for k in range(int(round(math.log10(hi / lo))) + 1)] if logy
                 else [lo + (hi - lo) * k / 4 for k in range(5)])
        for tv in ticks:
            y = y_of(tv)
            label = f"{tv:g}" if logy else (f"{tv:,.0f}" if hi - lo >= 8 else f"{tv:.1f}")
            out.append(f'<line x1="{left}" x2="{W - right}" y1="{y:.1f}" y2="{y:.1f}" '
                       'stroke="#eee"/>')
            out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        for tag, colour in series_:
            p = pts[tag]
            if not p:
                continue
            path = " ".join(f"{x_of(t):.1f},{y_of(v):.1f}" for t, v in p)
            dash = ' stroke-dasharray="3,2"' if tag.startswith("a-") else ""
            out.append(f'<polyline points="{path}" fill="none" stroke="{colour}" '
                       f'stroke-width="1.2"{dash}/>')
        lx = W - right - 10
        for tag, colour in reversed(series_):
            name = {"a": "route a", "b": "route b", "churn": "churn (route a)",
                    "a-service": "a service", "a-gen": "a gen. delay",
                    "rss": "RSS", "fds": "fds", "slots": "slots in use"}[tag]
            out.append(f'<text x="{lx}" y="{y0 + 14}" text-anchor="end" fill="{colour}">'
                       f'{name}</text>')
            lx -= 14 + 6.6 * len(name)
    yb = top + len(panels) * (panel_h + gap) - gap + 14
    step = 30 if total <= 600 else 60
    for t in range(0, int(total) + 1, step):
        out.append(f'<text x="{x_of(t):.1f}" y="{yb}" text-anchor="middle">{t}</text>')
    out.append(f'<text x="{W - right}" y="{yb + 14}" text-anchor="end">seconds</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- main


def write_all(d, seconds):
    name = d["config"]["name"]
    write_report(name, report(d), d)
    with open(os.path.join(RESULTS, f"{name}.svg"), "w") as f:
        f.write(svg(d, seconds))
    log(f"wrote {os.path.relpath(os.path.join(RESULTS, name + '.svg'), REPO)}")


def main():
    a = parse()
    set_quiet(a)
    if a.report_only:
        with open(os.path.join(RESULTS, f"{a.name}.json")) as f:
            d = json.load(f)
        d["machine"]["rerendered"] = True
        with open(os.path.join(RAW, d["config"]["name"], "seconds.jsonl")) as f:
            seconds = [json.loads(line) for line in f if line.strip()]
        analyse(d, seconds, argparse.Namespace(**d["config"]))
        write_all(d, seconds)
        return

    def run(procs):
        d, seconds = soak(procs, a)
        write_all(d, seconds)
        v = d["verdict"]
        log(f"verdict: valid run {yes(v['room_ok'])}, errors {yes(v['errors_ok'])}, latency "
            f"{yes(v['latency_ok'])}, flat {yes(v['flat_ok'])}")

    main_guard("soak.sh", run)


if __name__ == "__main__":
    main()
