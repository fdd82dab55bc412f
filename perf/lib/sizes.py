"""compare-sizes: large tools/call results and a progress stream through mcpyard at 25 % of its max.

For each case (10 KiB, 100 KiB, 1 MiB results; 10 progress notifications then a 1 KiB result):
a fresh fixture and mcpyard (1 worker, io_uring) find the max (closed loop); then a second,
fresh mcpyard runs the case open loop at 25 % of that max while its metrics are scraped
before and after (window grant and stall histograms, slot counters) and its slot occupancy
is sampled every 50 ms. A fresh gateway for the measured run means its cumulative histograms
hold that run only (its probe and warm-up included).
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import drop_percentiles as perfkit_drop_percentiles  # noqa: E402
from perfkit import (  # noqa: E402
    Fixture, Gateway, Sampler, add_quiet_args, binaries, fmt, loadgen, loadgen_cmd, log,
    machine_info, machine_line, main_guard, rss_kib, set_quiet, table, write_report,
)

NAME = "compare-sizes"
SUB = NAME
CASES = [  # (name, fixture args, scenario)
    ("10KiB", ["--result-bytes", str(10 * 1024)], "tools-call"),
    ("100KiB", ["--result-bytes", str(100 * 1024)], "tools-call"),
    ("1MiB", ["--result-bytes", str(1024 * 1024)], "tools-call"),
    ("progress10", ["--result-bytes", "1024", "--progress", "10"], "tools-call-progress"),
]
Q = ["0.5", "0.9", "0.99", "0.999", "0.9999", "1"]
STALL = "mcpyard_window_stall_seconds"
GRANT = "mcpyard_window_grant_bytes"
SLOW = "mcpyard_window_stalls_slow_total"  # exact count of stalls > 1 ms
COUNTERS = ["mcpyard_slot_exhausted_total", "mcpyard_overload_rejections_total",
            "mcpyard_upstream_failed_total", "mcpyard_http_errors_total"]


def parse():
    ap = argparse.ArgumentParser(prog="compare-sizes.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=8, help="loadgen connections (default 8)")
    ap.add_argument("--max-duration", default="3s", help="closed-loop run (default 3s)")
    ap.add_argument("--rate-duration", default="5s", help="open-loop run at 25 %% (default 5s)")
    ap.add_argument("--warmup", default="1s", help="warm-up before every run (default 1s)")
    ap.add_argument("--io", default="uring", choices=["uring", "epoll"], help="mcpyard io (uring)")
    add_quiet_args(ap)
    return ap.parse_args()


def summary(m, name, scale):
    """{quantile: value, count, sum} of a Prometheus summary, values × scale."""
    out = {q: m.get(f'{name}{{quantile="{q}"}}', 0.0) * scale for q in Q}
    out["count"] = int(m.get(f"{name}_count", 0))
    out["sum"] = m.get(f"{name}_sum", 0.0) * scale
    return out


def count_above(s, thr):
    """Bounds (lo, hi) on how many of a summary's values exceed thr, from its quantiles.

    The values are HDR histogram quantiles (3 significant figures, exact below 2048 µs):
    v(q) ≤ thr means at least ceil(qN) values are ≤ thr; v(q) > thr means fewer than that."""
    n = s["count"]
    if n == 0 or s["1"] <= thr:
        return 0, 0
    lo, hi = 1, n
    for q in Q:
        k = math.ceil(float(q) * n)
        if s[q] <= thr:
            hi = min(hi, n - k)
        else:
            lo = max(lo, n - k + 1)
    return lo, max(lo, hi)


def stalls_over_1ms(m, stall):
    """(lo, hi) stalls over 1 ms: exact (lo == hi) from mcpyard's counter, or bounded by
    the summary's quantiles when the gateway predates that counter."""
    if SLOW in m:
        n = int(m[SLOW])
        return n, n
    return count_above(stall, 1000.0)


def run(procs):
    a = parse()
    set_quiet(a)
    gw, lg = binaries()
    info = machine_info()
    cases = {}
    for name, fargs, scenario in CASES:
        fx = Fixture(procs, lg, f"sizes-{name}-fixture", fargs, workers=1)
        g = Gateway(procs, gw, f"sizes-{name}-max", fx.url, workers=1, io=a.io)
        log(f"{name}: max (closed loop)")
        mx = loadgen(lg, f"max-{name}", g.url, scenario=scenario, connections=a.connections,
                     duration=a.max_duration, warmup=a.warmup,
                     watch={"mcpyard": g.pid, "fixture": fx.pid}, subdir=SUB)
        procs.stop(g.p)
        rate = max(10, int(round(mx["throughput_rps"] * 0.25)))

        g = Gateway(procs, gw, f"sizes-{name}-r25", fx.url, workers=1, io=a.io)
        m0 = g.scrape()
        rss0 = rss_kib(g.pid)
        sampler = Sampler(g.metrics_url, ["mcpyard_slots_in_use", "mcpyard_connections"])
        sampler.start()
        log(f"{name}: {rate} req/s (25 % of {mx['throughput_rps']:.0f})")
        try:
            r = loadgen(lg, f"r25-{name}", g.url, scenario=scenario, rate=rate,
                        connections=a.connections, duration=a.rate_duration, warmup=a.warmup,
                        watch={"mcpyard": g.pid, "fixture": fx.pid}, subdir=SUB)
        finally:
            samples = sampler.finish()
        m1 = g.scrape()
        rss1 = rss_kib(g.pid)
        exit_code = procs.stop(g.p)
        procs.stop(fx.p)
        n = r["requests_ok"] + sum(r["errors"].values())
        stall = summary(m1, STALL, 1e6)
        stall0 = summary(m0, STALL, 1e6)
        grant = summary(m1, GRANT, 1.0)
        grant0 = summary(m0, GRANT, 1.0)
        slots = samples["mcpyard_slots_in_use"]
        cases[name] = {
            "fixture_args": fargs, "scenario": scenario, "max": mx, "rate": rate, "run": r,
            "stall_us": stall, "stall_before": stall0, "grant_bytes": grant, "grant_before": grant0,
            "stalls_over_1ms": stalls_over_1ms(m1, stall),
            "slots_total": m1.get("mcpyard_slots"),
            "slots_in_use_before": m0.get("mcpyard_slots_in_use"),
            "slots_in_use_after": m1.get("mcpyard_slots_in_use"),
            "slots_in_use_sampled": {
                "n": len(slots), "max": max(slots) if slots else None,
                "mean": sum(slots) / len(slots) if slots else None,
            },
            "counters_delta": {c: m1.get(c, 0) - m0.get(c, 0) for c in COUNTERS},
            "rss_kib_before": rss0, "rss_kib_after": rss1,
            "cpu_us_per_req": {k: v / n for k, v in r["cpu_us"].items()} if n else {},
            "exit_code": exit_code,
        }
    data = {"machine": info, "io": a.io, "connections": a.connections, "cases": cases}
    for c in cases.values():
        for run_ in (c["max"], c["run"]):
            perfkit_drop_percentiles(run_)
    write_report(NAME, report(data, a), data)


def report(d, a):
    cs = d["cases"]
    L = ["# compare-sizes: large results and progress streams through mcpyard\n"]
    L.append(f"Generated by `perf/compare-sizes.sh` — {machine_line(d['machine'])}\n")
    L.append(
        f"mcpyard: 1 worker, {d['io']}, `client` binding in front of the fixture (1 worker). "
        f"For each case: max from a {a.max_duration} closed-loop run ({a.connections} connections), "
        f"then a **fresh** mcpyard at 25 % of that max, open loop, {a.rate_duration} "
        f"(+{a.warmup} warm-up); the window histograms below are that gateway's, so they hold "
        "exactly the 25 % run (its probe and warm-up included). Latency in µs from the intended "
        "send time. Slots in use sampled from `/metrics` every 50 ms during the run.\n"
    )
    L.append("## Throughput and latency\n")
    rows = []
    for name, c in cs.items():
        mx, r = c["max"], c["run"]
        h = r["response_us"]
        rows.append([name, fmt(mx["throughput_rps"]), c["rate"], fmt(r["throughput_rps"]),
                     h["p50"], h["p90"], h["p99"], h["p99_9"], h["max"],
                     fmt(c["cpu_us_per_req"].get("mcpyard"), 1),
                     f"{sum(r['errors'].values())}/{r['unsent']}", fmt(r["foreign_busy_pct"], 1)])
    L.append(table(["case", "max req/s", "25 % rate", "achieved", "p50", "p90", "p99", "p99.9",
                    "max", "mcpyard CPU µs/req", "errors/unsent", "foreign %"], rows))
    L.append("")
    pn = cs.get("progress10", {}).get("run", {}).get("notifications")
    if pn is not None:
        L.append(f"progress10: the loadgen counted {pn:,} progress notifications "
                 f"in the 25 % run (10 per call expected).\n")
    L.append("## Window stalls (µs; mcpyard_window_stall_seconds)\n")
    rows = []
    for name, c in cs.items():
        s = c["stall_us"]
        lo, hi = c["stalls_over_1ms"]
        over = f"{lo}" if lo == hi else f"{lo}–{hi}"
        rows.append([name, f"{c['stall_before']['count']} → {s['count']}", fmt(s["0.5"]),
                     fmt(s["0.99"]), fmt(s["1"]),
                     fmt(s["sum"] / s["count"], 1) if s["count"] else "–", over])
    L.append(table(["case", "stalls (before → after)", "p50", "p99", "max", "mean",
                    "stalls > 1 ms"], rows))
    L.append("")
    L.append("'stalls > 1 ms' is the exact count from `mcpyard_window_stalls_slow_total` "
             "(a range means the gateway had no such counter and the exported quantiles "
             "only bound it).\n")
    L.append("## Window grants (bytes; mcpyard_window_grant_bytes) and slots\n")
    rows = []
    for name, c in cs.items():
        g = c["grant_bytes"]
        sl = c["slots_in_use_sampled"]
        cd = c["counters_delta"]
        rows.append([name, f"{c['grant_before']['count']} → {g['count']}", fmt(g["0.5"]),
                     fmt(g["0.99"]), fmt(g["1"]), fmt(g["sum"] / 2**20, 1),
                     f"{fmt(c['slots_in_use_before'])} / {fmt(c['slots_in_use_after'])}",
                     f"{fmt(sl['mean'], 1)} / {fmt(sl['max'])} (n={sl['n']})",
                     fmt(c["slots_total"]), fmt(cd["mcpyard_slot_exhausted_total"]),
                     f"{c['rss_kib_before']:,} → {c['rss_kib_after']:,}"])
    L.append(table(["case", "grants (before → after)", "p50", "p99", "max", "total MiB",
                    "slots in use before / after", "in use during: mean / max", "slots",
                    "slot pool empty (Δ)", "RSS KiB"], rows))
    L.append("")
    L.append("## Target (issue #4)\n")
    c = cs["1MiB"]
    lo, hi = c["stalls_over_1ms"]
    s = c["stall_us"]
    ok = hi == 0
    verdict = "reached" if ok else "**missed**"
    L.append(table(["target", "measured", "verdict"], [[
        "1 MiB results: no window stall > 1 ms at 25 % load",
        f"{s['count']} stalls, max {s['1']:,.0f} µs, {lo if lo == hi else f'{lo}–{hi}'} over 1 ms",
        verdict]], ["l", "l", "l"]))
    L.append("")
    L.append("## Commands\n")
    L.append("```sh\nperf/compare-sizes.sh " + " ".join(sys.argv[1:]) + "\n```\n")
    L.append("Fixture per case: `mcpyard-loadgen upstream --listen 127.0.0.1:0 --workers 1 ARGS` "
             "with ARGS: " + "; ".join(f"{n} `{' '.join(c['fixture_args'])}`" for n, c in cs.items())
             + ".\n")
    L.append("```sh\n" + loadgen_cmd(c["run"]["argv"]) + "\n```\n")
    L.append(f"Per-run loadgen JSON, HdrHistogram text and SVG: `perf/results/{SUB}/`.\n")
    return "\n".join(L)


if __name__ == "__main__":
    main_guard("compare-sizes.sh", run)
