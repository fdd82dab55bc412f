"""compare-proxy: what the proxy hop costs, server → proxy (2 routes) → client against server → client.

Phase 1, tools/call (1 KiB result): the fixture direct, mcpyard as a gateway (server →
client) and mcpyard as a proxy (server → proxy with routes `a` and `b`, both clients of the
same fixture; the call is `a__echo`), each on io_uring and epoll, 1 worker. Closed-loop max
throughput, then open loop at 50 % of the gateway's (uring) max, the same rate for all.
Phase 2, merged tools/list: the gateway in front of one fixture with 2,000 tools against the
proxy in front of two fixtures with 1,000 each (the fixture with 2,000 direct as the
reference); both lists are first fetched once and counted. Closed loop, then open loop at
50 % of the gateway's max.
Phase 3, a 100,000-item merged list: the proxy in front of two fixtures with 50,000 tools
each, paged by 1,000; lists read by a streaming Python client, sequentially then
concurrently, while mcpyard's RSS (every 20 ms) and slot occupancy (metrics) are sampled.
"""

import argparse
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import drop_percentiles as perfkit_drop_percentiles  # noqa: E402
from perfkit import rerender as perfkit_rerender  # noqa: E402
from perfkit import errs  # noqa: E402,F401
from perfkit import (  # noqa: E402
    CLK_TCK, RAW, REPO, RESULTS, Fail, Fixture, Gateway, Sampler, add_quiet_args, binaries, fmt,
    gateway_config, loadgen, loadgen_cmd, log, machine_info, machine_line, main_guard,
    pgroup_ticks, rss_kib, set_quiet, status_field, table, wait_quiet, write_report,
)
from hops import lat, median, summarize  # noqa: E402
from mcpclient import McpError, list_once  # noqa: E402

NAME = "compare-proxy"
RAW_SUB = "raw/" + NAME  # every run's loadgen .json/.hgrm/.svg (not committed)
BASE = "gateway-w1-uring"
PAIRS = [("proxy-w1-uring", "gateway-w1-uring"), ("proxy-w1-epoll", "gateway-w1-epoll")]
HOP_TARGET = 0.10  # the proxy hop may cost at most this share of the gateway's throughput
RSS_SAMPLE_S = 0.02
SLOT_SAMPLE_S = 0.02


def parse():
    ap = argparse.ArgumentParser(prog="compare-proxy.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=8, help="loadgen connections (default 8)")
    ap.add_argument("--max-duration", default="3s", help="closed-loop run length (default 3s)")
    ap.add_argument("--rate-duration", default="3s", help="open-loop run length (default 3s)")
    ap.add_argument("--warmup", default="0.5s", help="warm-up before every run (default 0.5s)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs per target and phase, round-robin; the report shows medians (3)")
    ap.add_argument("--retry-foreign", type=float, default=15.0,
                    help="run again (once) when other work used more than this %% of the machine "
                         "during a run (default 15)")
    ap.add_argument("--result-bytes", type=int, default=1024, help="tools/call result size (1024)")
    ap.add_argument("--list-tools", type=int, default=1000,
                    help="tools per fixture behind the proxy in phase 2; the gateway's fixture "
                         "has twice as many (default 1000)")
    ap.add_argument("--big-tools", type=int, default=50000,
                    help="tools per fixture behind the proxy in phase 3 (default 50000)")
    ap.add_argument("--big-page-size", type=int, default=1000, help="their page size (1000)")
    ap.add_argument("--big-sequential", type=int, default=5, help="lists read one after another (5)")
    ap.add_argument("--big-concurrent", type=int, default=4, help="then lists read at once (4)")
    ap.add_argument("--phases", default="call,list,big",
                    help="comma-separated subset of call,list,big to run (default all)")
    add_quiet_args(ap)
    ap.add_argument("--no-profile", action="store_true",
                    help="skip the perf profiles of the gateway and the proxy (tools/call)")
    return ap.parse_args()


# --------------------------------------------------------------------------- runs


class Target:
    """One thing the generator is pointed at: a url, the pid to account, extra loadgen args."""

    def __init__(self, name, url, pid=None, extra=(), gateway=None):
        self.name, self.url, self.pid, self.extra, self.gateway = name, url, pid, list(extra), gateway


def one(a, lg, tag, t, scenario, rate, duration, fixture_pids):
    """One loadgen run against t; runs it once more when other work disturbed it."""
    watch = {f"fixture{i}": pid for i, pid in enumerate(fixture_pids)}
    if t.pid:
        watch["target"] = t.pid
    for attempt in range(2):
        log(f"{tag}: {t.name} {'rate ' + str(rate) if rate else 'closed loop'}")
        r = loadgen(lg, f"{tag}-{t.name}", t.url, scenario=scenario, rate=rate,
                    connections=a.connections, duration=duration, warmup=a.warmup,
                    watch=watch, extra=t.extra, subdir=RAW_SUB)
        n = r["requests_ok"] + sum(r["errors"].values())
        # The fixtures' CPU together, as one figure.
        fx = sum(v for k, v in r["cpu_us"].items() if k.startswith("fixture"))
        r["cpu_us_per_req"] = {"fixture": fx / n if n else None}
        for k in ("target", "loadgen"):
            if k in r["cpu_us"]:
                r["cpu_us_per_req"][k] = r["cpu_us"][k] / n if n else None
                for part, v in r["cpu_split_us"][k].items():
                    r["cpu_us_per_req"][f"{k}_{part}"] = v / n if n else None
        r["attempt"] = attempt + 1
        if r["foreign_busy_pct"] <= a.retry_foreign:
            break
        log(f"{tag}: {t.name}: {r['foreign_busy_pct']:.0f} % of the machine was busy with "
            "other work during the run; running it again")
    return r


def rounds(a, lg, tag, targets, scenario, rate, duration, fixture_pids):
    """Every target once per round, round-robin, so slow drift hits all alike."""
    runs = {t.name: [] for t in targets}
    for k in range(a.rounds):
        for t in targets:
            runs[t.name].append(one(a, lg, f"{tag}-{k + 1}", t, scenario, rate, duration,
                                    fixture_pids))
    out = {}
    for name, rs in runs.items():
        s = summarize(rs)
        s["machine_busy_pct"] = median([x["machine_busy_pct"] for x in rs])
        out[name] = s
    return out


def rate_at(base, fraction, step):
    return max(step, int(round(base * fraction / step)) * step)


def memory(pid):
    """VmRSS and VmHWM of pid, KiB."""
    return {"rss_kib": rss_kib(pid), "hwm_kib": int(status_field(pid, "VmHWM").split()[0])}


# --------------------------------------------------------------------------- phase 1


def phase_call(procs, a, gw, lg, profile):
    fx = Fixture(procs, lg, "proxy-call-fixture", ["--result-bytes", str(a.result_bytes)])
    targets = [Target("direct", fx.url)]
    gws = {}
    for io in ("uring", "epoll"):
        g = Gateway(procs, gw, f"proxy-call-gateway-{io}", fx.url, io=io)
        p = Gateway(procs, gw, f"proxy-call-proxy-{io}", None, io=io,
                    routes=[("a", fx.url), ("b", fx.url)])
        gws[f"gateway-w1-{io}"], gws[f"proxy-w1-{io}"] = g, p
    for name in (BASE, "proxy-w1-uring", "gateway-w1-epoll", "proxy-w1-epoll"):
        g = gws[name]
        extra = ["--tool", "a__echo"] if name.startswith("proxy") else []
        targets.append(Target(name, g.url, g.pid, extra, g))
    log(f"fixture {fx.addr}; targets: " + ", ".join(f"{t.name} {t.url}" for t in targets))
    mem_start = {n: memory(g.pid) for n, g in gws.items()}

    maxes = rounds(a, lg, "call-max", targets, "tools-call", None, a.max_duration, [fx.pid])
    base = maxes[BASE]["throughput_rps"]
    rate = rate_at(base, 0.5, 10)
    log(f"{BASE} max {base:.0f} req/s (median of {a.rounds}) → 50 % = {rate} req/s")
    at50 = rounds(a, lg, "call-r50", targets, "tools-call", rate, a.rate_duration, [fx.pid])
    mem_end = {n: memory(g.pid) for n, g in gws.items()}

    prof = None
    perf = shutil.which("perf")
    if perf and profile:
        prof = {}
        for t in targets:
            if t.name in (BASE, "proxy-w1-uring"):
                prof[t.name] = perf_profile(perf, lg, t, a)

    exits = {n: procs.stop(g.p) for n, g in gws.items()}
    exits["fixture"] = procs.stop(fx.p)
    return {
        "fixture_args": fx.args, "routes": "a and b, both clients of the one fixture",
        "config_proxy": gateway_config(None, 1, "uring", [("a", "<fixture>"), ("b", "<fixture>")]),
        "max": maxes, "rate_50": rate, "at50": at50, "memory_start": mem_start,
        "memory_end": mem_end, "profile": prof, "exit_codes": exits,
    }


def perf_profile(perf, lg, t, a, seconds=4, freq=2999):
    """perf record of t's process during a closed-loop run; self samples per symbol."""
    out = os.path.join(RAW, f"{NAME}-{t.name}-perf.data")
    log(f"perf record of {t.name} during a closed-loop run")
    rec = subprocess.Popen(
        [perf, "record", "-q", "-F", str(freq), "-p", str(t.pid), "-o", out, "--", "sleep",
         str(seconds)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        r = loadgen(lg, f"profile-{t.name}", t.url, connections=a.connections,
                    duration=f"{seconds}s", warmup="0.3s", files=False, extra=t.extra,
                    subdir=RAW_SUB)
    finally:
        try:
            rec.wait(30)
        except subprocess.TimeoutExpired:
            rec.terminate()
            rec.wait()
    if rec.returncode != 0 or not os.path.exists(out):
        return {"error": f"perf record exited {rec.returncode}"}
    rep = subprocess.run(
        [perf, "report", "-i", out, "--stdio", "--no-children", "-n", "--sort", "dso,symbol",
         "--percent-limit", "0.3"],
        capture_output=True, text=True,
    ).stdout
    rows = []
    total = None
    for line in rep.splitlines():
        m = re.match(r"#\s*Samples:\s*([\d.]+)([KM]?)", line)
        if m:
            total = float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6}[m.group(2)]
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 4)
        if len(parts) == 5 and parts[0].endswith("%") and parts[1].isdigit():
            sym = re.sub(r"(\s+-)+\s*$", "", parts[4]).strip()
            rows.append({"pct": float(parts[0][:-1]), "samples": int(parts[1]),
                         "dso": parts[2], "symbol": sym[:110]})
    # Samples of cpu-clock at `freq` Hz: samples / freq = CPU seconds; per request, with the
    # request count of the run's recorded part (the profile covers about the same stretch).
    reqs = r["throughput_rps"] * seconds
    for row in rows:
        row["us_per_req"] = row["samples"] * 1e6 / freq / reqs if reqs else None
    return {"rows": rows, "samples": total, "throughput_rps": r["throughput_rps"],
            "us_per_req_total": (total or 0) * 1e6 / freq / reqs if reqs else None,
            "cmd": f"perf record -F {freq} -p <mcpyard pid> -- sleep {seconds} (during a "
                   f"closed-loop run, {a.connections} connections)"}


# --------------------------------------------------------------------------- phase 2


def phase_list(procs, a, gw, lg):
    n = a.list_tools
    fa = Fixture(procs, lg, "proxy-list-fixture-a", ["--tools", str(n)])
    fb = Fixture(procs, lg, "proxy-list-fixture-b", ["--tools", str(n)])
    fc = Fixture(procs, lg, "proxy-list-fixture-c", ["--tools", str(2 * n)])
    g = Gateway(procs, gw, "proxy-list-gateway", fc.url)
    p = Gateway(procs, gw, "proxy-list-proxy", None, routes=[("a", fa.url), ("b", fb.url)])
    targets = [Target("direct", fc.url), Target(BASE, g.url, g.pid, gateway=g),
               Target("proxy-w1-uring", p.url, p.pid, gateway=p)]
    pids = [fa.pid, fb.pid, fc.pid]

    # The lists are what they should be, once, before any load.
    check = {}
    for t in targets:
        try:
            c = list_once(t.url, ("a__", "b__"))
        except (McpError, OSError) as e:
            raise Fail(f"tools/list of {t.name} ({t.url}): {e}")
        want = {"a__": n, "b__": n} if t.name.startswith("proxy") else {"a__": 0, "b__": 0}
        if c["items"] != 2 * n or c["prefixes"] != want:
            raise Fail(f"tools/list of {t.name}: {c['items']} items {c['prefixes']}, "
                       f"expected {2 * n} {want}")
        check[t.name] = {k: c[k] for k in ("items", "bytes", "prefixes", "first_names", "chunked")}
        log(f"{t.name}: tools/list has {c['items']} items, {c['bytes']:,} bytes")
    mem_start = {t.name: memory(t.pid) for t in targets if t.pid}

    maxes = rounds(a, lg, "list-max", targets, "tools-list", None, a.max_duration, pids)
    base = maxes[BASE]["throughput_rps"]
    rate = rate_at(base, 0.5, 10 if base >= 200 else 1)
    log(f"list: {BASE} max {base:.0f} req/s → 50 % = {rate} req/s")
    at50 = rounds(a, lg, "list-r50", targets, "tools-list", rate, a.rate_duration, pids)
    # The proxy's own max may be below that rate; its latency under load then needs a rate
    # it can carry: 50 % of its own max, every target again.
    pmax = maxes["proxy-w1-uring"]["throughput_rps"]
    rate_p = rate_at(pmax, 0.5, 10 if pmax >= 200 else 1)
    log(f"list: proxy-w1-uring max {pmax:.0f} req/s → 50 % = {rate_p} req/s")
    at50p = rounds(a, lg, "list-r50p", targets, "tools-list", rate_p, a.rate_duration, pids)
    mem_end = {t.name: memory(t.pid) for t in targets if t.pid}
    exits = {BASE: procs.stop(g.p), "proxy-w1-uring": procs.stop(p.p)}
    for f in (fa, fb, fc):
        exits[f.name] = procs.stop(f.p)
    return {
        "fixture_args": {"a": fa.args, "b": fb.args, "c": fc.args}, "check": check,
        "max": maxes, "rate_50": rate, "at50": at50, "rate_50p": rate_p, "at50p": at50p,
        "memory_start": mem_start, "memory_end": mem_end, "exit_codes": exits,
    }


# --------------------------------------------------------------------------- phase 3


class RssSampler(threading.Thread):
    """Reads VmRSS of pid every `interval` s; keeps the max and every sample's time."""

    def __init__(self, pid, interval):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.samples = []  # (monotonic s, KiB)
        self.stop_ev = threading.Event()

    def run(self):
        while not self.stop_ev.is_set():
            try:
                self.samples.append((time.monotonic(), rss_kib(self.pid)))
            except (OSError, Fail):
                pass
            self.stop_ev.wait(self.interval)

    def finish(self):
        self.stop_ev.set()
        self.join(5)
        return self.samples


def phase_big(procs, a, gw, lg):
    """Two passes over one proxy: memory first, with nothing else asking mcpyard anything
    (a /metrics scrape has a large transient allocation of its own, see the report), then
    the same lists again with the metrics endpoint scraped every 20 ms for slot occupancy."""
    # The reference: the same passes over a list a tenth as long, on a proxy of its own.
    small_tools = max(1, a.big_tools // 10)
    sargs = ["--tools", str(small_tools), "--page-size", str(a.big_page_size)]
    sa = Fixture(procs, lg, "proxy-small-fixture-a", sargs)
    sb = Fixture(procs, lg, "proxy-small-fixture-b", sargs)
    sp = Gateway(procs, gw, "proxy-small-proxy", None, routes=[("a", sa.url), ("b", sb.url)])
    wait_quiet()
    time.sleep(0.5)
    small = big_pass(a, sp, 2 * small_tools, scrape_slots=False)
    small["fixture_args"] = sargs
    small["want"] = 2 * small_tools
    small["exit_codes"] = {"proxy": procs.stop(sp.p), sa.name: procs.stop(sa.p),
                           sb.name: procs.stop(sb.p)}

    args = ["--tools", str(a.big_tools), "--page-size", str(a.big_page_size)]
    fa = Fixture(procs, lg, "proxy-big-fixture-a", args)
    fb = Fixture(procs, lg, "proxy-big-fixture-b", args)
    p = Gateway(procs, gw, "proxy-big-proxy", None, routes=[("a", fa.url), ("b", fb.url)])
    want = 2 * a.big_tools
    wait_quiet()
    time.sleep(0.5)
    out = {"fixture_args": args, "want": want, "small": small}
    out["memory"] = big_pass(a, p, want, scrape_slots=False)
    # One scrape on its own, to show its transient next to the lists' (VmHWM).
    hwm0 = memory(p.pid)
    p.scrape()
    out["one_scrape"] = {"before": hwm0, "after": memory(p.pid)}
    time.sleep(0.3)
    out["slots"] = big_pass(a, p, want, scrape_slots=True)
    out["exit_codes"] = {"proxy": procs.stop(p.p), fa.name: procs.stop(fa.p),
                         fb.name: procs.stop(fb.p)}
    return out


def big_pass(a, p, want, scrape_slots):
    """big_sequential lists one after another, then big_concurrent at once, while VmRSS is
    sampled (and, with scrape_slots, the slot gauges); returns what was seen."""
    tag = "slots" if scrape_slots else "memory"
    before = memory(p.pid)
    m0 = p.scrape() if scrape_slots else None
    rss = RssSampler(p.pid, RSS_SAMPLE_S)
    slots = Sampler(p.metrics_url, ["mcpyard_slots_in_use", "mcpyard_slots",
                                    "mcpyard_connections"], SLOT_SAMPLE_S) if scrape_slots else None
    t0 = pgroup_ticks([p.pid])[p.pid]
    w0 = time.monotonic()
    rss.start()
    if slots:
        slots.start()
    lists, errors = [], []
    lock = threading.Lock()

    def read(kind, k):
        try:
            r = list_once(p.url, ("a__", "b__"))
            r.update(kind=kind, k=k)
            with lock:
                lists.append(r)
        except (McpError, OSError) as e:
            with lock:
                errors.append(f"{kind} {k}: {e}")

    try:
        for k in range(a.big_sequential):
            log(f"{want:,}-item list ({tag} pass): sequential {k + 1}/{a.big_sequential}")
            read("sequential", k + 1)
        mid = memory(p.pid)
        log(f"{want:,}-item list ({tag} pass): {a.big_concurrent} at once")
        c0 = time.monotonic()
        threads = [threading.Thread(target=read, args=("concurrent", k + 1))
                   for k in range(a.big_concurrent)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        concurrent_wall = time.monotonic() - c0
        time.sleep(0.5)  # the last answers' buffers returned
    finally:
        rss_samples = rss.finish()
        slot_samples = slots.finish() if slots else None
    t1 = pgroup_ticks([p.pid])[p.pid]
    after = memory(p.pid)
    if errors:
        raise Fail(f"{want:,}-item list: " + "; ".join(errors))
    half = want // 2
    bad = [x for x in lists if x["items"] != want or x["prefixes"] != {"a__": half, "b__": half}]
    if bad:
        raise Fail(f"{want:,}-item list: {bad[0]['items']} items {bad[0]['prefixes']}, expected {want}")
    out = {
        "lists": lists, "before": before, "mid": mid, "after": after,
        "peak_rss_kib": max([kib for _, kib in rss_samples] + [before["rss_kib"]]),
        "rss_samples": len(rss_samples), "rss_series": downsample(rss_samples, w0),
        "concurrent_wall_s": concurrent_wall, "wall_s": time.monotonic() - w0,
        "cpu_user_s": (t1[0] - t0[0]) / CLK_TCK, "cpu_sys_s": (t1[1] - t0[1]) / CLK_TCK,
    }
    out["cpu_s"] = out["cpu_user_s"] + out["cpu_sys_s"]
    if scrape_slots:
        m1 = p.scrape()
        out["counters"] = {
            k: sum(v for key, v in m1.items() if key.split("{")[0] == k)
            - sum(v for key, v in m0.items() if key.split("{")[0] == k)
            for k in ("mcpyard_slot_exhausted_total", "mcpyard_proxy_list_omitted_total",
                      "mcpyard_proxy_routes_skipped_total", "mcpyard_upstream_failed_total",
                      "mcpyard_upstream_timeouts_total", "mcpyard_http_errors_total",
                      "mcpyard_overload_rejections_total")}
        out["slots_in_use_max"] = max(slot_samples["mcpyard_slots_in_use"] or [None])
        out["slots"] = max(slot_samples["mcpyard_slots"] or [None])
        out["slot_samples"] = len(slot_samples["mcpyard_slots_in_use"])
        out["connections_max"] = max(slot_samples["mcpyard_connections"] or [None])
    return out


def downsample(samples, t0, step=0.1):
    """Every `step` s the highest RSS sample in that stretch: [(s since start, KiB)]."""
    out = {}
    for t, kib in samples:
        k = round((t - t0) // step * step, 2)
        out[k] = max(out.get(k, 0), kib)
    return sorted(out.items())


# --------------------------------------------------------------------------- main


def run(procs):
    a = parse()
    set_quiet(a)
    phases = set(a.phases.split(","))
    if not phases <= {"call", "list", "big"}:
        raise Fail(f"--phases: unknown {', '.join(sorted(phases - {'call', 'list', 'big'}))}")
    gw, lg = binaries()
    info = machine_info()
    os.makedirs(os.path.join(RESULTS, RAW_SUB), exist_ok=True)
    data = {"machine": info, "connections": a.connections, "max_duration": a.max_duration,
            "rate_duration": a.rate_duration, "warmup": a.warmup, "rounds": a.rounds,
            "retry_foreign": a.retry_foreign, "result_bytes": a.result_bytes,
            "argv": sys.argv[1:], "binaries": {"mcpyard": gw, "loadgen": lg},
            "cargo_target_dir": os.environ.get("CARGO_TARGET_DIR")}
    if "call" in phases:
        data["call"] = phase_call(procs, a, gw, lg, profile=not a.no_profile)
    if "list" in phases:
        data["list"] = phase_list(procs, a, gw, lg)
    if "big" in phases:
        data["big"] = phase_big(procs, a, gw, lg)
    md = report(data)
    write_report(NAME, md, strip(data))


def strip(data):
    """The summary JSON without every run's percentile steps (raw/compare-proxy/ has them)."""
    d = copy.deepcopy(data)
    for ph in ("call", "list"):
        if ph not in d:
            continue
        for phase in ("max", "at50", "at50p"):
            for s in d[ph].get(phase, {}).values():
                for r in s["rounds"]:
                    perfkit_drop_percentiles(r)
    d.get("machine", {}).pop("t0", None)
    return d


def rerender():
    """--report-only: rewrites compare-proxy.md from compare-proxy.json (no measuring)."""
    return perfkit_rerender(NAME, report)


# --------------------------------------------------------------------------- report


def mib(kib):
    return f"{kib / 1024:,.1f}"




def report(d):
    L = []
    L.append("# compare-proxy: server → proxy (2 routes) → client against server → client\n")
    runs = []
    for ph in ("call", "list"):
        if ph in d:
            runs += [x for phase in ("max", "at50", "at50p")
                     for s in d[ph].get(phase, {}).values() for x in s["rounds"]]
    waited = sum(x.get("quiet_waited_s", 0) for x in runs)
    L.append(f"Generated by `perf/compare-proxy.sh` — {machine_line(d['machine'], waited)}\n")
    L.append(
        "mcpyard runs with 1 worker in every target. **gateway** = `server → client` in front of "
        "the fixture; **proxy** = `server → proxy → client`, the proxy with two routes "
        "(toolkits `a` and `b`), each route its own `client` binding. Every loadgen run: "
        f"{d['connections']} connections, {d['warmup']} warm-up not recorded; closed loop "
        f"{d['max_duration']}, open loop {d['rate_duration']}; every phase runs every target "
        f"{d['rounds']} times round-robin and each figure is the **median over the rounds** "
        "(each percentile on its own; ranges are min–max). A run during which other work used "
        f"more than {d['retry_foreign']:.0f} % of the machine was run once more and the second "
        "run kept. Latency in µs, from the intended send time in open loop. CPU µs/req is the "
        "CPU time of that process during the run (utime + stime from /proc, 10 ms ticks) over "
        "the requests; 'foreign' is the machine's busy time not spent by anything started "
        "here, in % of both cores (highest of the rounds).\n")
    verdicts = []
    if "call" in d:
        L += report_call(d, d["call"], verdicts)
    if "list" in d:
        L += report_list(d, d["list"], verdicts)
    if "big" in d:
        L += report_big(d["big"], verdicts)
    L.append("## Targets\n")
    L.append(table(["target", "measured", "verdict"], verdicts, ["l", "l", "l"]))
    L.append("")
    L.append("## Exit codes on SIGTERM\n")
    ex = []
    for ph in ("call", "list", "big"):
        if ph in d:
            ex += [f"{ph}: {k} {v}" for k, v in d[ph]["exit_codes"].items()]
    if "big" in d:
        ex += [f"big (reference): {k} {v}" for k, v in d["big"]["small"]["exit_codes"].items()]
    L.append(", ".join(ex) + " (a negative code: killed by that signal; the fixture has no "
             "handler for SIGTERM).\n")
    L.append("## Commands\n")
    target = d.get("cargo_target_dir")
    if target is None and d.get("binaries"):
        # Older JSON: the target dir the binaries came from, if not the default one.
        target = os.path.dirname(os.path.dirname(d["binaries"]["mcpyard"]))
        if target == os.path.join(REPO, "target"):
            target = None
    env = f"CARGO_TARGET_DIR={target} " if target else ""
    L.append(f"```sh\n{env}" + " ".join(["perf/compare-proxy.sh"] + d["argv"]) + "\n```\n")
    ex = []
    for ph, names in (("call", ("proxy-w1-uring",)), ("list", ("proxy-w1-uring",))):
        if ph in d:
            for n in names:
                ex += [d[ph]["max"][n]["argv"], d[ph]["at50"][n]["argv"]]
    if ex:
        L.append("Loadgen command lines of the proxy targets (addresses chosen at run time):\n")
        L.append("```sh\n" + "\n".join(loadgen_cmd(x) for x in ex) + "\n```\n")
    if "call" in d:
        L.append("The proxy's config (phase 1; phases 2 and 3 differ only in the two routes' "
                 "upstream urls; the gateway's has one `client` exit instead):\n")
        L.append("```yaml\n" + d["call"]["config_proxy"] + "```\n")
    L.append(f"Every run's loadgen JSON, .hgrm and .svg: `perf/results/{RAW_SUB}/` (not "
             "committed).\n")
    return "\n".join(L)


CALL_ORDER = ["direct", "gateway-w1-uring", "proxy-w1-uring", "gateway-w1-epoll", "proxy-w1-epoll"]


def report_call(d, c, verdicts):
    L = ["## 1. tools/call: the proxy hop\n"]
    L.append(f"Fixture: `mcpyard-loadgen {' '.join(c['fixture_args'])}` ({d['result_bytes']} B "
             f"result, one worker), shared by every target; the proxy's routes `a` and `b` are "
             "both clients of this one fixture, and the generator calls `a__echo` through the "
             "proxy, `echo` elsewhere. Every session through the proxy opens an upstream "
             "session on both routes (initialize fans out); the calls go to route `a` only.\n")
    L.append("### Max throughput (closed loop)\n")
    rows = []
    for n in CALL_ORDER:
        r = c["max"][n]
        cpu = r["cpu_us_per_req"]
        p50, _p90, p99, p999, _mx = lat(r)
        mem = c["memory_end"].get(n)
        rows.append([n, fmt(r["throughput_rps"]),
                     f"{fmt(r['throughput_min'])}–{fmt(r['throughput_max'])}", p50, p99, p999,
                     fmt(cpu.get("target"), 1), fmt(cpu.get("target_user"), 1),
                     fmt(cpu.get("target_sys"), 1), fmt(cpu.get("fixture"), 1),
                     fmt(r["machine_busy_pct"]), fmt(r["foreign_busy_pct"], 1), errs(r),
                     mib(mem["rss_kib"]) if mem else "–"])
    L.append(table(["target", "req/s", "range", "p50", "p99", "p99.9", "mcpyard CPU µs/req",
                    "of it user", "of it kernel", "fixture CPU µs/req", "machine busy %",
                    "foreign %", "errors/unsent", "mcpyard RSS after, MiB"], rows))
    L.append("")
    L.append("'of it user' / 'of it kernel': mcpyard's own code (utime) and the kernel's work "
             "for it (stime), each a median on its own. RSS after: VmRSS once both phases ran "
             "(start → after: " + ", ".join(
                 f"{n} {mib(c['memory_start'][n]['rss_kib'])} → {mib(c['memory_end'][n]['rss_kib'])}"
                 for n in CALL_ORDER if n in c["memory_start"]) + " MiB). 'machine busy %': "
             "both cores, everything included (median over the rounds).\n")
    L.append("Below, 'mcpyard cores' is its CPU µs/req × req/s: with one worker, near 1.0 "
             "means the worker thread is the limit at the max. The CPU ratio is the "
             "throughput ratio mcpyard's CPU per request alone implies; it is indicative only, "
             "since CPU per request falls as load rises (more requests per wake-up) and each "
             "target is measured at its own max.\n")
    rows = []
    for p, g in PAIRS:
        tp, tg = c["max"][p]["throughput_rps"], c["max"][g]["throughput_rps"]
        cp, cg = c["max"][p]["cpu_us_per_req"], c["max"][g]["cpu_us_per_req"]
        cost = 1 - tp / tg
        rows.append([f"{p} / {g}", f"{tp:,.0f} / {tg:,.0f}", f"{tp / tg:.3f}",
                     f"{100 * cost:.1f} %",
                     f"{cp['target']:.1f} vs {cg['target']:.1f} ({cp['target'] - cg['target']:+.1f})",
                     f"{cp['target'] * tp / 1e6:.2f}, {cg['target'] * tg / 1e6:.2f}",
                     f"{cp['target_user']:.1f} vs {cg['target_user']:.1f}",
                     f"{cp['target_sys']:.1f} vs {cg['target_sys']:.1f}",
                     f"{cg['target'] / cp['target']:.3f}"])
        verdicts.append([f"tools/call: proxy hop costs ≤ {HOP_TARGET:.0%} of the gateway's "
                         f"throughput ({p.split('-')[-1]})",
                         f"{tp:,.0f} vs {tg:,.0f} req/s: ratio {tp / tg:.3f}, cost "
                         f"{100 * cost:.1f} %",
                         "reached" if cost <= HOP_TARGET else
                         f"**missed** by {100 * (cost - HOP_TARGET):.1f} points"])
        verdicts.append([f"same, by mcpyard's CPU per request ({p.split('-')[-1]}; not the "
                         "issue's measure, indicative)",
                         f"{cp['target']:.1f} vs {cg['target']:.1f} µs/req: "
                         f"{cp['target'] / cg['target'] - 1:+.1%} CPU, ratio "
                         f"{cg['target'] / cp['target']:.3f}",
                         "within 10 %" if cg['target'] / cp['target'] >= 1 - HOP_TARGET else
                         "over 10 %"])
    L.append(table(["proxy / gateway", "req/s", "ratio", "throughput cost of the hop",
                    "mcpyard CPU µs/req", "mcpyard cores (proxy, gateway)", "user", "kernel",
                    "CPU ratio gateway/proxy"], rows, ["l"] + ["r"] * 8))
    L.append("")

    rate = c["rate_50"]
    L.append(f"### Latency at {rate} req/s (open loop; 50 % of {BASE}'s max "
             f"{fmt(c['max'][BASE]['throughput_rps'])} req/s)\n")
    rows = []
    for n in CALL_ORDER:
        r = c["at50"][n]
        p50, p90, p99, p999, mx = lat(r)
        dr = c["at50"]["direct"]["response_us"]
        a50 = "–" if n == "direct" else int(round(r["response_us"]["p50"] - dr["p50"]))
        a99 = "–" if n == "direct" else int(round(r["response_us"]["p99"] - dr["p99"]))
        rows.append([n, fmt(r["throughput_rps"]), p50, p90, p99,
                     f"{r['response_us']['p99_min']:.0f}–{r['response_us']['p99_max']:.0f}",
                     p999, a50, a99, fmt(r["cpu_us_per_req"].get("target"), 1),
                     fmt(r["machine_busy_pct"]), fmt(r["foreign_busy_pct"], 1), errs(r)])
    L.append(table(["target", "achieved req/s", "p50", "p90", "p99", "p99 range", "p99.9",
                    "added p50", "added p99", "mcpyard CPU µs/req", "machine busy %",
                    "foreign %", "errors/unsent"], rows))
    L.append("")
    L.append("added = target − direct at the same rate and percentile. The proxy hop itself "
             "(proxy − gateway): " + "; ".join(
                 f"{p.split('-')[-1]} p50 "
                 f"{c['at50'][p]['response_us']['p50'] - c['at50'][g]['response_us']['p50']:+.0f} µs, "
                 f"p99 {c['at50'][p]['response_us']['p99'] - c['at50'][g]['response_us']['p99']:+.0f} µs"
                 for p, g in PAIRS) + ".\n")
    prof = c.get("profile")
    if prof and all(v.get("rows") for v in prof.values()):
        L += report_profile(prof)
    return L


def report_profile(prof):
    L = ["### Where the proxy's extra CPU goes (perf, self time, closed loop)\n"]
    g, p = prof[BASE], prof["proxy-w1-uring"]
    L.append(f"`{p['cmd']}`, once for each; software cpu-clock sampling (the VM has no "
             "hardware counters). µs/req = a symbol's samples / sampling rate / requests in "
             f"the profiled run: in all, {g['us_per_req_total']:.1f} µs/req for the gateway "
             f"({fmt(g['throughput_rps'])} req/s) and {p['us_per_req_total']:.1f} for the proxy "
             f"({fmt(p['throughput_rps'])} req/s). The 25 symbols with the largest difference "
             "(proxy − gateway), either way:\n")
    key = lambda row: (row["dso"], row["symbol"])  # noqa: E731
    gm = {key(r): r for r in g["rows"]}
    pm = {key(r): r for r in p["rows"]}
    diffs = []
    for k in set(gm) | set(pm):
        gu = gm[k]["us_per_req"] if k in gm else 0.0
        pu = pm[k]["us_per_req"] if k in pm else 0.0
        diffs.append((pu - gu, k, gu, pu))
    diffs.sort(key=lambda x: -abs(x[0]))
    rows = [[f"{d:+.2f}", f"{gu:.2f}", f"{pu:.2f}", k[0], "`" + k[1] + "`"]
            for d, k, gu, pu in diffs[:25]]
    L.append(table(["proxy − gateway µs/req", "gateway", "proxy", "object", "symbol"], rows,
                   ["r", "r", "r", "l", "l"]))
    L.append("")
    L.append("Symbols under 0.3 % of a profile count as 0 there. By object, µs/req gateway → "
             "proxy: " + ", ".join(
                 f"{dso} {sum(r['us_per_req'] for r in g['rows'] if r['dso'] == dso):.1f} → "
                 f"{sum(r['us_per_req'] for r in p['rows'] if r['dso'] == dso):.1f}"
                 for dso in sorted({r['dso'] for r in g['rows'] + p['rows']},
                                   key=lambda s: -sum(r['us_per_req'] for r in p['rows']
                                                      if r['dso'] == s))[:4]) +
             " (symbols above 0.3 % only).\n")
    return L


LIST_ORDER = ["direct", "gateway-w1-uring", "proxy-w1-uring"]


def report_list(d, li, verdicts):
    L = ["## 2. Merged tools/list: 2 × 1,000 tools through the proxy vs 2,000 through the gateway\n"]
    fa = li["fixture_args"]
    L.append(f"Fixtures: `a` and `b` `mcpyard-loadgen {' '.join(fa['a'])}` behind the proxy "
             f"(routes `a`, `b`), `c` `mcpyard-loadgen {' '.join(fa['c'])}` behind the gateway "
             "and direct. Scenario `tools-list` (one page, no cursor). Checked once before "
             "any load, with a streaming Python client (initialize, tools/list, items "
             "counted one by one, envelope validated):\n")
    rows = []
    for n in LIST_ORDER:
        ch = li["check"][n]
        rows.append([n, fmt(ch["items"]), fmt(ch["bytes"]), ", ".join(ch["first_names"]),
                     ", ".join(f"{k} {v:,}" for k, v in ch["prefixes"].items()),
                     "chunked" if ch["chunked"] else "content-length"])
    L.append(table(["target", "items", "body bytes", "first names", "by prefix", "framing"],
                   rows, ["l", "r", "r", "l", "l", "l"]))
    L.append("")
    L.append("The proxy's answer differs in bytes from the gateway's: every name carries "
             "its route's prefix (3 bytes), and tools 1,001 to 2,000 of fixture `c` are the "
             "generated tools 3 to 1,000 once more behind route `b` (their descriptions name "
             "their position).\n")
    L.append("### Max throughput (closed loop)\n")
    rows = []
    for n in LIST_ORDER:
        r = li["max"][n]
        p50, _p90, p99, p999, _mx = lat(r)
        mem = li["memory_end"].get(n)
        mbps = r["throughput_rps"] * li["check"][n]["bytes"] / 1e6
        rows.append([n, fmt(r["throughput_rps"]),
                     f"{fmt(r['throughput_min'])}–{fmt(r['throughput_max'])}", f"{mbps:,.0f}",
                     p50, p99, p999, fmt(r["cpu_us_per_req"].get("target"), 0),
                     fmt(r["cpu_us_per_req"].get("target_user"), 0),
                     fmt(r["cpu_us_per_req"].get("target_sys"), 0),
                     fmt(r["cpu_us_per_req"].get("fixture"), 0), fmt(r["machine_busy_pct"]),
                     fmt(r["foreign_busy_pct"], 1), errs(r),
                     mib(mem["rss_kib"]) if mem else "–"])
    L.append(table(["target", "lists/s", "range", "MB/s", "p50", "p99", "p99.9",
                    "mcpyard CPU µs/list", "of it user", "of it kernel", "fixtures CPU µs/list",
                    "machine busy %", "foreign %", "errors/unsent", "mcpyard RSS after, MiB"],
                   rows))
    L.append("")
    tp, tg = li["max"]["proxy-w1-uring"]["throughput_rps"], li["max"][BASE]["throughput_rps"]
    cp = li["max"]["proxy-w1-uring"]["cpu_us_per_req"]["target"]
    cg = li["max"][BASE]["cpu_us_per_req"]["target"]
    L.append(f"Proxy / gateway: {tp / tg:.3f} of the lists per second, {cp / cg:.2f}× the "
             f"mcpyard CPU per list ({cp:,.0f} vs {cg:,.0f} µs). RSS start → after: " + ", ".join(
                 f"{n} {mib(li['memory_start'][n]['rss_kib'])} → {mib(li['memory_end'][n]['rss_kib'])}"
                 f" MiB (VmHWM {mib(li['memory_end'][n]['hwm_kib'])})"
                 for n in LIST_ORDER if n in li["memory_start"]) + ".\n")
    for key, rkey, what in (("at50", "rate_50", f"50 % of {BASE}'s max"),
                            ("at50p", "rate_50p", "50 % of proxy-w1-uring's max")):
        if key not in li:
            continue
        rate = li[rkey]
        L.append(f"### Latency at {rate} lists/s (open loop; {what})\n")
        rows = []
        for n in LIST_ORDER:
            r = li[key][n]
            p50, p90, p99, p999, mx = lat(r)
            dr = li[key]["direct"]["response_us"]
            a50 = "–" if n == "direct" else int(round(r["response_us"]["p50"] - dr["p50"]))
            a99 = "–" if n == "direct" else int(round(r["response_us"]["p99"] - dr["p99"]))
            rows.append([n, fmt(r["throughput_rps"]), p50, p90, p99,
                         f"{r['response_us']['p99_min']:.0f}–{r['response_us']['p99_max']:.0f}",
                         p999, a50, a99, fmt(r["cpu_us_per_req"].get("target"), 0),
                         fmt(r["machine_busy_pct"]), fmt(r["foreign_busy_pct"], 1), errs(r)])
        L.append(table(["target", "achieved lists/s", "p50", "p90", "p99", "p99 range", "p99.9",
                        "added p50", "added p99", "mcpyard CPU µs/list", "machine busy %",
                        "foreign %", "errors/unsent"], rows))
        L.append("")
        if key == "at50" and li["rate_50"] > 0.8 * tp:
            L.append(f"At {rate} lists/s the proxy runs at {rate / tp:.0%} of its own max "
                     f"({tp:,.0f} lists/s): its latency there is a queue, not the hop. The "
                     "next table is at a rate the proxy carries.\n")
    rate = li["rate_50"]
    lat_p = "; ".join(
        f"p50/p99 at {li[rk]}/s {li[k]['proxy-w1-uring']['response_us']['p50']:,.0f}/"
        f"{li[k]['proxy-w1-uring']['response_us']['p99']:,.0f} vs "
        f"{li[k][BASE]['response_us']['p50']:,.0f}/{li[k][BASE]['response_us']['p99']:,.0f} µs"
        for k, rk in (("at50", "rate_50"), ("at50p", "rate_50p")) if k in li)
    verdicts.append(["merged tools/list, 2 × 1,000 through the proxy vs 2,000 through the "
                     "gateway (no numeric target: reported)",
                     f"{tp:,.0f} vs {tg:,.0f} lists/s ({tp / tg:.2f}×), {cp:,.0f} vs "
                     f"{cg:,.0f} µs of mcpyard CPU per list; {lat_p}", "reported"])
    return L


def report_big(b, verdicts):
    want = b["want"]
    mp, sp = b["memory"], b["slots"]
    n_seq = sum(1 for x in mp["lists"] if x["kind"] == "sequential")
    n_conc = sum(1 for x in mp["lists"] if x["kind"] == "concurrent")
    L = [f"## 3. A {want:,}-item merged list: memory stays bounded\n"]
    L.append(f"Two fixtures `mcpyard-loadgen {' '.join(b['fixture_args'])}` behind the proxy "
             "(1 worker, io_uring; routes `a`, `b`): the proxy pages through each route's "
             f"{want // 2:,} tools and merges them into one answer. A streaming Python client "
             "(`perf/lib/mcpclient.py`: its own connection and session per list; it decodes "
             "the answer one item at a time, checks each is an object with a name, counts it "
             f"and drops it) reads the list {n_seq} times one after another, then {n_conc} at "
             f"once, while mcpyard's VmRSS is read every {RSS_SAMPLE_S * 1000:.0f} ms. That "
             "runs twice on the same mcpyard: the **memory pass** with nothing else asking "
             "mcpyard anything, then the **slots pass** with `/metrics` scraped every "
             f"{SLOT_SAMPLE_S * 1000:.0f} ms for `mcpyard_slots_in_use` "
             f"({sp['slot_samples']} scrapes). Two passes because a scrape has a large "
             "transient allocation of its own (below), which would hide the list's.\n")
    rows = []
    for name, ps in (("memory", mp), ("slots", sp)):
        for x in ps["lists"]:
            rows.append([name, f"{x['kind']} {x['k']}", fmt(x["items"]),
                         f"{x['bytes'] / 1e6:,.1f}", f"{x['first_byte_seconds'] * 1000:,.1f}",
                         f"{x['seconds'] * 1000:,.0f}", f"{x['bytes'] / x['seconds'] / 1e6:,.0f}"])
    L.append(table(["pass", "list", "items", "MB", "first byte, ms", "whole list, ms", "MB/s"],
                   rows, ["l", "l", "r", "r", "r", "r", "r"]))
    L.append("")
    seq = [x["seconds"] for x in mp["lists"] if x["kind"] == "sequential"]
    L.append(f"Time per list (memory pass): median {median(seq) * 1000:,.0f} ms one at a time; "
             f"the {n_conc} concurrent lists took {mp['concurrent_wall_s'] * 1000:,.0f} ms "
             "together. The client's decoding is part of that time (Python, one item at a "
             "time; mcpyard writes only as fast as the client reads). mcpyard's CPU for the "
             f"{len(mp['lists'])} lists: {mp['cpu_s']:.2f} s ({mp['cpu_user_s']:.2f} user + "
             f"{mp['cpu_sys_s']:.2f} kernel), {mp['cpu_s'] / len(mp['lists']) * 1000:,.0f} ms "
             "per list.\n")
    one_kib = mp["lists"][0]["bytes"] / 1024

    def growth(ps):
        return ps["peak_rss_kib"] - ps["before"]["rss_kib"]

    def col(ps):
        g = growth(ps)
        return [mib(ps["before"]["rss_kib"]), mib(ps["mid"]["rss_kib"]), mib(ps["peak_rss_kib"]),
                f"{mib(ps['before']['hwm_kib'])} → {mib(ps['after']['hwm_kib'])}",
                mib(ps["after"]["rss_kib"]), f"+{mib(g)} ({g / one_kib:.1%} of one answer)"]
    labels = ["VmRSS before the first list", f"VmRSS after the {n_seq} sequential lists",
              f"VmRSS peak (sampled every {RSS_SAMPLE_S * 1000:.0f} ms)",
              "VmHWM (the kernel's peak) before → after",
              "VmRSS after (0.5 s after the last list)", "peak growth over before"]
    sm = b["small"]
    small_kib = sm["lists"][0]["bytes"] / 1024

    def col_small():
        g = growth(sm)
        return col(sm)[:-1] + [f"+{mib(g)} ({g / small_kib:.1%} of one answer)"]
    rows = [[lab, x, m, s_] for lab, x, m, s_ in zip(labels, col_small(), col(mp), col(sp))]
    rows.append(["`mcpyard_slots_in_use` max / `mcpyard_slots`", "–", "–",
                 f"{fmt(sp['slots_in_use_max'])} / {fmt(sp['slots'])}"])
    rows.append(["open connections max", "–", "–", fmt(sp["connections_max"])])
    rows += [[f"`{k}` during the pass", "–", "–", fmt(v)] for k, v in sp["counters"].items()]
    L.append(table(["memory, MiB", f"{sm['want']:,} items, memory pass",
                    f"{want:,} items, memory pass", f"{want:,} items, slots pass "
                    f"(/metrics every {SLOT_SAMPLE_S * 1000:.0f} ms)"], rows,
                   ["l", "r", "r", "r"]))
    L.append("")
    sseq = [x["seconds"] for x in sm["lists"] if x["kind"] == "sequential"]
    L.append(f"The reference column is a proxy of its own in front of two fixtures "
             f"`{' '.join(sm['fixture_args'])}`: the same passes over a list a tenth as long "
             f"({sm['lists'][0]['bytes'] / 1e6:,.1f} MB, {median(sseq) * 1000:,.0f} ms per "
             "list one at a time). If the proxy held lists, the growth would scale with "
             "them, tenfold.\n")
    sc = b["one_scrape"]
    L.append(f"One answer is {mp['lists'][0]['bytes'] / 1e6:,.1f} MB; {n_conc} at once are "
             f"{n_conc * mp['lists'][0]['bytes'] / 1e6:,.0f} MB in flight. **One `/metrics` "
             f"scrape** on its own, between the passes: VmRSS {mib(sc['before']['rss_kib'])} → "
             f"{mib(sc['after']['rss_kib'])} MiB, VmHWM {mib(sc['before']['hwm_kib'])} → "
             f"{mib(sc['after']['hwm_kib'])} MiB: the scrape allocates and frees about "
             f"{mib(max(0, sc['after']['hwm_kib'] - sc['before']['rss_kib']))} MiB for a moment "
             "(a list is not needed for that), which is what the slots pass's peak shows.\n")
    ser = mp["rss_series"]
    if ser:
        L.append("VmRSS over the memory pass (the highest sample of each second, MiB): " +
                 ", ".join(f"{t:.0f} s {mib(kib)}" for t, kib in per_second(ser)) + ".\n")
    g, gs = growth(mp), growth(sm)
    exhausted = sp["counters"].get("mcpyard_slot_exhausted_total", 0)
    ok = not exhausted and sp["slots_in_use_max"] is not None \
        and sp["slots_in_use_max"] < sp["slots"]
    verdicts.append([f"a {want:,}-item merged list stays within the slot pool (RSS growth "
                     "reported)",
                     f"{len(mp['lists'])} lists of {want:,} items ({mp['lists'][0]['bytes'] / 1e6:,.1f}"
                     f" MB each, {n_conc} at once at the end), all complete; slots in use max "
                     f"{fmt(sp['slots_in_use_max'])} of {fmt(sp['slots'])}, pool exhausted "
                     f"{fmt(exhausted)} times; VmRSS {mib(mp['before']['rss_kib'])} → peak "
                     f"{mib(mp['peak_rss_kib'])} → after {mib(mp['after']['rss_kib'])} MiB "
                     f"(+{mib(g)} MiB at the peak; +{mib(gs)} MiB for lists a tenth as long)",
                     "reached" if ok else "**missed**"])
    return L


def per_second(series):
    out = {}
    for t, kib in series:
        out[int(t)] = max(out.get(int(t), 0), kib)
    return sorted(out.items())


if __name__ == "__main__":
    if sys.argv[1:] == ["--report-only"]:
        rerender()
    else:
        main_guard("compare-proxy.sh", run)
