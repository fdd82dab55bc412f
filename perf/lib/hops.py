"""compare-hops: tools/call (1 KiB result) direct to the fixture vs through mcpyard vs through nginx.

Phase 1: max throughput of every target, closed loop, the same connections for all.
Phase 2: open loop at 25 %, 50 % and 75 % of mcpyard's (1 worker, uring) max, every target at
the same rates; added latency of a hop = hop − direct at the same rate and percentile.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import drop_percentiles as perfkit_drop_percentiles  # noqa: E402
from perfkit import rerender as perfkit_rerender  # noqa: E402
from perfkit import errs  # noqa: E402,F401
from perfkit import (  # noqa: E402
    RAW, RESULTS, Fail, Fixture, add_quiet_args, set_quiet, Gateway, Nginx, apt_install, binaries, fmt, loadgen,
    loadgen_cmd, log, machine_info, machine_line, main_guard, median, nginx_conf, summarize, table, write_report,
)

NAME = "compare-hops"
SUB = NAME  # committed: round 1's .hgrm/.svg of every phase and target
RAW_SUB = "raw/" + NAME  # every run's loadgen .json/.hgrm/.svg (not committed)
BASE = "mcpyard-w1-uring"
FRACTIONS = (0.25, 0.50, 0.75)
PAIRS = [  # (mcpyard target, nginx target it is compared with)
    ("mcpyard-w1-uring", "nginx-w1"),
    ("mcpyard-w1-epoll", "nginx-w1"),
    ("mcpyard-w2-uring", "nginx-w2"),
    ("mcpyard-w2-epoll", "nginx-w2"),
]


def parse():
    ap = argparse.ArgumentParser(prog="compare-hops.sh", description=__doc__,
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
    ap.add_argument("--result-bytes", type=int, default=1024, help="fixture result size (1024)")
    add_quiet_args(ap)
    ap.add_argument("--no-profile", action="store_true", help="skip the perf profile of mcpyard")
    ap.add_argument("--phases", default="plain",
                    help="comma-separated: 'plain' (the phases above, compare-hops.md) and/or "
                         "'tls' (TLS on every hop, 1 worker: max, latency at 50 %%, handshake "
                         "cost per new connection; compare-tls.md). Default: plain")
    ap.add_argument("--handshake-rounds", type=int, default=None,
                    help="rounds of the tls phase's new-connection runs (default: --rounds)")
    a = ap.parse_args()
    a.phases = [x.strip() for x in a.phases.split(",") if x.strip()]
    unknown = [x for x in a.phases if x not in ("plain", "tls")]
    if unknown or not a.phases:
        ap.error(f"--phases: expected plain and/or tls, got {a.phases}")
    return a


def lat(r, key="response_us"):
    h = r[key]
    return tuple(int(round(h[q])) for q in ("p50", "p90", "p99", "p99_9", "max"))


def run(procs):
    a = parse()
    set_quiet(a)
    if "plain" in a.phases:
        run_plain(procs, a)
    if "tls" in a.phases:
        import hops_tls

        hops_tls.run_tls(procs, a)


def run_plain(procs, a):
    gw, lg = binaries()
    nginx_bin = apt_install("nginx", ["nginx-light", "nginx"])
    nginx_version = subprocess.run([nginx_bin, "-v"], capture_output=True, text=True).stderr.strip()
    info = machine_info()
    os.makedirs(os.path.join(RESULTS, SUB), exist_ok=True)
    os.makedirs(os.path.join(RESULTS, RAW_SUB), exist_ok=True)

    fx = Fixture(procs, lg, "hops-fixture", ["--result-bytes", str(a.result_bytes)], workers=1)
    targets = {"direct": (fx.url, None)}
    gws = {}
    for w in (1, 2):
        for io in ("uring", "epoll"):
            name = f"mcpyard-w{w}-{io}"
            g = Gateway(procs, gw, f"hops-{name}", fx.url, workers=w, io=io)
            gws[name] = g
            targets[name] = (g.url, g.pid)
    ngx = {}
    for w in (1, 2):
        name = f"nginx-w{w}"
        n = Nginx(procs, nginx_bin, f"hops-{name}", fx.addr, workers=w)
        ngx[name] = n
        targets[name] = (n.url, n.pid)
    log(f"fixture {fx.addr}; targets: " + ", ".join(f"{k} {v[0]}" for k, v in targets.items()))

    def one(tag, name, rate, duration):
        url, pid = targets[name]
        watch = {"fixture": fx.pid}
        if pid:
            watch["target"] = pid
        for attempt in range(2):
            log(f"{tag}: {name} {'rate ' + str(rate) if rate else 'closed loop'}")
            r = loadgen(lg, f"{tag}-{name}", url, rate=rate, connections=a.connections,
                        duration=duration, warmup=a.warmup, watch=watch, subdir=RAW_SUB)
            n = r["requests_ok"] + sum(r["errors"].values())
            r["cpu_us_per_req"] = {k: (v / n if n else None) for k, v in r["cpu_us"].items()}
            for k, split in r["cpu_split_us"].items():
                for part, v in split.items():
                    r["cpu_us_per_req"][f"{k}_{part}"] = v / n if n else None
            r["attempt"] = attempt + 1
            if r["foreign_busy_pct"] <= a.retry_foreign:
                break
            log(f"{tag}: {name}: {r['foreign_busy_pct']:.0f} % of the machine was busy with "
                "other work during the run; running it again")
        return r

    def rounds(tag, rate, duration):
        """Every target once per round, round-robin, so slow drift hits all alike."""
        runs = {name: [] for name in targets}
        for k in range(a.rounds):
            for name in targets:
                runs[name].append(one(f"{tag}-{k + 1}", name, rate, duration))
        return {name: summarize(rs) for name, rs in runs.items()}

    # Phase 1: max throughput.
    maxes = rounds("max", None, a.max_duration)
    base = maxes[BASE]["throughput_rps"]
    rates = [max(100, int(round(base * f / 10.0)) * 10) for f in FRACTIONS]
    log(f"{BASE} max {base:.0f} req/s (median of {a.rounds}) → rates {rates}")

    # Phase 2: fixed rates, every target at the same rates.
    at = {}
    for f, rate in zip(FRACTIONS, rates):
        pct = int(f * 100)
        at[pct] = rounds(f"r{pct}", rate, a.rate_duration)

    keep_round_one()

    # A CPU profile of mcpyard (1 worker, uring) at its max, where the time goes.
    profile = None
    perf = shutil.which("perf")
    if perf and not a.no_profile:
        profile = perf_profile(perf, lg, gws[BASE], a, fx.pid)

    # Stop everything before writing: mcpyard must exit 0 on SIGTERM.
    exits = {}
    for name, g in gws.items():
        exits[name] = procs.stop(g.p)
    for name, n in ngx.items():
        exits[name] = procs.stop(n.p)
    exits["fixture"] = procs.stop(fx.p)

    data = {
        "machine": info, "nginx_version": nginx_version, "connections": a.connections,
        "max_duration": a.max_duration, "rate_duration": a.rate_duration, "warmup": a.warmup,
        "rounds": a.rounds, "retry_foreign": a.retry_foreign,
        "result_bytes": a.result_bytes, "fixture_args": fx.args, "base": BASE, "base_max_rps": base,
        "rates": dict(zip([int(f * 100) for f in FRACTIONS], rates)),
        "max": maxes, "at": at, "exit_codes": exits, "profile": profile,
    }
    data["argv"] = sys.argv[1:]
    md = report(data)
    write_report(NAME, md, strip(data))


def rerender():
    """--report-only: rewrites compare-hops.md from compare-hops.json (no measuring)."""

    def adapt(d):
        d["at"] = {int(k): v for k, v in d["at"].items()}
        d["rates"] = {int(k): v for k, v in d["rates"].items()}
        d.setdefault("argv", [])

    return perfkit_rerender(NAME, report, adapt)


def keep_round_one():
    """Copies round 1's HdrHistogram text and SVG of every phase and target to results."""
    import glob

    for old in glob.glob(os.path.join(RESULTS, SUB, "*")):
        os.unlink(old)
    for f in glob.glob(os.path.join(RESULTS, RAW_SUB, "*-1-*")):
        if f.endswith((".hgrm", ".svg")):
            shutil.copy(f, os.path.join(RESULTS, SUB, os.path.basename(f).replace("-1-", "-", 1)))


def strip(data):
    """The summary JSON without every run's percentile steps (those are in compare-hops/*.json)."""
    import copy

    d = copy.deepcopy(data)
    runs = [x for s in d["max"].values() for x in s["rounds"]]
    runs += [x for per in d["at"].values() for s in per.values() for x in s["rounds"]]
    for r in runs:
        perfkit_drop_percentiles(r)
    return d


def perf_profile(perf, lg, g, a, fixture_pid):
    out = os.path.join(RAW, "compare-hops-perf.data")
    log(f"perf record of {g.name} during a closed-loop run")
    rec = subprocess.Popen(
        [perf, "record", "-q", "-F", "2999", "-p", str(g.pid), "-o", out, "--", "sleep", "4"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        loadgen(lg, "profile-" + g.name.replace("hops-", ""), g.url, connections=a.connections,
                duration="4s", warmup="0.5s", files=False, subdir="raw")
    finally:
        try:
            rec.wait(20)
        except subprocess.TimeoutExpired:
            rec.terminate()
            rec.wait()
    if rec.returncode != 0 or not os.path.exists(out):
        return {"error": f"perf record exited {rec.returncode}"}
    rep = subprocess.run(
        [perf, "report", "-i", out, "--stdio", "--no-children", "--sort", "dso,symbol",
         "--percent-limit", "0.7"],
        capture_output=True, text=True,
    ).stdout
    rows = []
    for line in rep.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 3)
        if len(parts) == 4 and parts[0].endswith("%"):
            rows.append((parts[0], parts[1], parts[3].strip()[:110]))
    kernel = subprocess.run(
        [perf, "report", "-i", out, "--stdio", "--no-children", "--sort", "dso"],
        capture_output=True, text=True,
    ).stdout
    dsos = []
    for line in kernel.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            parts = line.split(None, 1)
            if len(parts) == 2 and parts[0].endswith("%"):
                dsos.append((parts[0], parts[1]))
    return {"top": rows[:25], "dso": dsos[:6], "cmd": f"perf record -F 2999 -p <mcpyard pid> -- sleep 4 "
            f"(during a closed-loop run, {a.connections} connections)"}


ORDER = ["direct", "mcpyard-w1-uring", "mcpyard-w1-epoll", "mcpyard-w2-uring",
         "mcpyard-w2-epoll", "nginx-w1", "nginx-w2"]


def report(d):
    names = [n for n in ORDER if n in d["max"]]
    hops = [n for n in names if n != "direct"]
    pcts = list(d["at"])
    L = []
    L.append("# compare-hops: tools/call direct vs through mcpyard vs through nginx\n")
    runs = [x for s in d["max"].values() for x in s["rounds"]]
    runs += [x for per in d["at"].values() for s in per.values() for x in s["rounds"]]
    waited = sum(x.get("quiet_waited_s", 0) for x in runs)
    L.append(f"Generated by `perf/compare-hops.sh` — {machine_line(d['machine'], waited)}\n")
    L.append(
        f"Fixture: `mcpyard-loadgen {' '.join(d['fixture_args'])}` ({d['result_bytes']} B result, one "
        f"worker), shared by every target. mcpyard: 1 or 2 workers × io_uring or epoll, "
        f"`client` binding to the fixture. {d['nginx_version']}: plain keep-alive reverse proxy, "
        "1 or 2 worker processes (config below). Every run: "
        f"{d['connections']} connections, {d['warmup']} warm-up not recorded; closed loop "
        f"{d['max_duration']}, open loop {d['rate_duration']}. Latency is from the intended send time "
        "(open loop) in µs. CPU µs/req is the CPU time of that process group during the run "
        "(utime+stime from /proc, 10 ms ticks) divided by the requests; 'foreign' is the "
        "machine's busy time not spent by anything started here, in % of both cores (the "
        "highest of the rounds).\n"
    )
    L.append(
        f"**Rounds:** every phase runs every target {d['rounds']} times, round-robin (target A, "
        "B, …, then again), and every figure below is the **median over the rounds**, each "
        "percentile taken on its own; the p99 range column shows min–max over the rounds. "
        f"A run during which other work used more than {d['retry_foreign']:.0f} % of the machine "
        "was run once more and the second run kept.\n"
    )

    L.append("## 1. Max throughput (closed loop)\n")
    rows = []
    for n in names:
        r = d["max"][n]
        c = r["cpu_us_per_req"]
        p50, p90, p99, p999, mx = lat(r)
        rows.append([n, fmt(r["throughput_rps"]),
                     f"{fmt(r['throughput_min'])}–{fmt(r['throughput_max'])}", p50, p99, p999,
                     fmt(c.get("target"), 1), fmt(c.get("target_user"), 1),
                     fmt(c.get("target_sys"), 1),
                     fmt(c.get("fixture"), 1), fmt(c.get("loadgen"), 1),
                     fmt(r["foreign_busy_pct"], 1), sum(r["errors"].values())])
    L.append(table(["target", "req/s", "range", "p50", "p99", "p99.9", "target CPU µs/req",
                    "of it user", "of it kernel",
                    "fixture CPU µs/req", "loadgen CPU µs/req", "foreign %", "errors"], rows))
    L.append("")
    L.append("'of it user' and 'of it kernel' split the target's CPU µs/req into its own code "
             "(utime) and the kernel's work for it (stime: system calls, TCP, wake-ups); each "
             "is a median over the rounds on its own, so the two need not add up exactly.\n")
    L.append(f"Rates for phase 2 = 25 / 50 / 75 % of **{BASE}**'s max "
             f"({fmt(d['base_max_rps'])} req/s): " +
             ", ".join(f"{p} % = {r} req/s" for p, r in d["rates"].items()) + ".\n")

    L.append("## 2. Latency at fixed rates (open loop, µs)\n")
    L.append("'machine busy %' is how busy both cores were during the run (median over the "
             "rounds), everything included: generator, fixture, proxy, kernel. Where it nears "
             "100 % the machine, not the proxy alone, is saturated, and the generator falls "
             "behind its schedule: response time then runs far ahead of service time. The "
             "open-loop generator needs more CPU per request than the closed loop (it paces "
             "each request with nanosleep + sched_yield), so a rate that is 75 % of a "
             "closed-loop max can exceed what the 2 cores give in open loop.\n")
    for p in pcts:
        rate = d["rates"][p]
        L.append(f"### {p} % — {rate} req/s\n")
        rows = []
        for n in names:
            r = d["at"][p][n]
            p50, p90, p99, p999, mx = lat(r)
            s = r["service_us"]
            c = r["cpu_us_per_req"]
            rows.append([n, fmt(r["throughput_rps"]), p50, p90, p99,
                         f"{r['response_us']['p99_min']}–{r['response_us']['p99_max']}",
                         p999, mx, int(round(s["p50"])), int(round(s["p99"])),
                         fmt(c.get("target"), 1),
                         fmt(median([x["machine_busy_pct"] for x in r["rounds"]])),
                         fmt(r["foreign_busy_pct"], 1),
                         f"{sum(r['errors'].values())}/{r['unsent']}"])
        L.append(table(["target", "achieved req/s", "p50", "p90", "p99", "p99 range", "p99.9", "max",
                        "service p50", "service p99", "target CPU µs/req", "machine busy %",
                        "foreign %", "errors/unsent"], rows))
        L.append("")

    L.append("## 3. Added latency of each hop (hop − direct at the same rate, µs)\n")
    rows = []
    added = {}
    for n in hops:
        row = [n]
        for p in pcts:
            dr, hr = d["at"][p]["direct"]["response_us"], d["at"][p][n]["response_us"]
            a50 = int(round(hr["p50"] - dr["p50"]))
            a99 = int(round(hr["p99"] - dr["p99"]))
            added[(n, p)] = (a50, a99)
            row += [a50, a99]
        rows.append(row)
    hdr = ["hop"]
    for p in pcts:
        hdr += [f"{p} % p50", f"{p} % p99"]
    L.append(table(hdr, rows))
    L.append("")
    L.append("Ratio mcpyard-added / nginx-added (same worker count; below 1 is better than "
             "nginx; n/a where nginx added ≤ 0):\n")
    rows = []
    for m, n in PAIRS:
        row = [f"{m} / {n}"]
        for p in pcts:
            for i in (0, 1):
                row.append(ratio(added[(m, p)][i], added[(n, p)][i]))
        rows.append(row)
    hdr = ["pair"]
    for p in pcts:
        hdr += [f"{p} % p50", f"{p} % p99"]
    L.append(table(hdr, rows))
    L.append("")

    L.append("## 4. Targets (issue #4)\n")
    m_add, n_add = added[(BASE, 50)], added[("nginx-w1", 50)]
    r50, r99 = ratio(m_add[0], n_add[0]), ratio(m_add[1], n_add[1])
    ok50 = m_add[0] <= n_add[0]
    ok99 = m_add[1] <= 1.5 * n_add[1]
    tm, tn = d["max"][BASE]["throughput_rps"], d["max"]["nginx-w1"]["throughput_rps"]
    tme = d["max"]["mcpyard-w1-epoll"]["throughput_rps"]
    rows = [
        ["mcpyard added p50 at 50 % ≤ nginx added p50 (1 worker each)",
         f"{m_add[0]} µs vs {n_add[0]} µs", r50, "reached" if ok50 else "**missed**"],
        ["mcpyard added p99 at 50 % ≤ 1.5 × nginx added p99",
         f"{m_add[1]} µs vs {n_add[1]} µs (1.5× = {1.5 * n_add[1]:.0f})", r99,
         "reached" if ok99 else "**missed**"],
        ["max tools/call throughput, 1 worker ≥ nginx 1 worker (uring)",
         f"{tm:,.0f} vs {tn:,.0f} req/s", f"{tm / tn:.2f}", "reached" if tm >= tn else "**missed**"],
        ["same, epoll", f"{tme:,.0f} vs {tn:,.0f} req/s", f"{tme / tn:.2f}",
         "reached" if tme >= tn else "**missed**"],
    ]
    L.append(table(["target", "measured", "ratio mcpyard/nginx", "verdict"], rows,
                   ["l", "l", "r", "l"]))
    L.append("")
    L.append("On a shared 2-core VM the p99 of a short open-loop run moves a lot from run to "
             "run (see the p99 range columns): one descheduling of a proxy or of the generator "
             "puts a millisecond into the tail. The medians over rounds damp that; the p50 and "
             "the CPU µs/req columns are the steadier comparison.\n")
    cm, cn = d["max"][BASE]["cpu_us_per_req"], d["max"]["nginx-w1"]["cpu_us_per_req"]
    if all(c.get(k) for c in (cm, cn) for k in ("target_user", "target_sys")):
        L.append(
            f"**Where the throughput gap is** (closed loop, §1): {BASE} spends "
            f"{cm['target_user']:.1f} µs of user-space CPU and {cm['target_sys']:.1f} µs of "
            f"kernel CPU per request, nginx-w1 {cn['target_user']:.1f} and "
            f"{cn['target_sys']:.1f} µs: the kernel's part is "
            f"{cm['target_sys'] / cn['target_sys']:.2f}× nginx's, the user-space part "
            f"{cm['target_user'] / cn['target_user']:.2f}×. nginx relays bytes; mcpyard also "
            "parses every JSON-RPC message and its session headers.\n")

    prof = d.get("profile")
    if prof and prof.get("top"):
        L.append(f"## 5. Where mcpyard's time goes ({BASE}, perf, self time)\n")
        L.append(f"`{prof['cmd']}`; software cpu-clock sampling (the VM has no hardware counters). "
                 "By object: " + ", ".join(f"{p} {o}" for p, o in prof["dso"]) + ".\n")
        L.append(table(["self", "object", "symbol"],
                       [[r[0], r[1], "`" + re.sub(r"(\s+-)+\s*$", "", r[2]).strip() + "`"]
                        for r in prof["top"]], ["r", "l", "l"]))
        L.append("")
        L.append("Kernel symbols that re-enable interrupts (`_raw_spin_unlock_irqrestore`) collect "
                 "the samples of the code that ran with interrupts off before them (wake-ups, "
                 "softirq network processing), since a VM's software clock cannot interrupt "
                 "there; read them as 'kernel network and scheduling work'. The user-space "
                 "split is in perf/results/callgrind.md.\n")
    elif prof:
        L.append(f"## 5. Profile\n\n{prof.get('error')}\n")

    L.append("## Exit codes on SIGTERM\n")
    L.append(", ".join(f"{k} {v}" + (f" (killed by signal {-v}: the fixture has no handler)"
                                      if isinstance(v, int) and v < 0 else "")
                       for k, v in d["exit_codes"].items()) + "\n")
    L.append("## nginx.conf (worker_processes 1; the 2-worker variant differs only there)\n")
    L.append("```nginx\n" + nginx_conf("<tmp>", "<port>", "<fixture>", 1) + "```\n")
    L.append("## Commands\n")
    L.append("```sh\nperf/compare-hops.sh " + " ".join(d["argv"]) + "\n```\n")
    L.append("Loadgen command lines (addresses chosen at run time):\n")
    ex = d["max"][BASE]["argv"], d["at"][50][BASE]["argv"]
    L.append("```sh\n" + "\n".join(loadgen_cmd(x) for x in ex) + "\n```\n")
    L.append(f"HdrHistogram text and SVG of round 1 of every phase and target: "
             f"`perf/results/{SUB}/<phase>-<target>.{{hgrm,svg}}`; every round's loadgen JSON, "
             f".hgrm and .svg: `perf/results/{RAW_SUB}/` (not committed).\n")
    return "\n".join(L)


def ratio(m, n):
    if n is None or n <= 0:
        return "n/a"
    return f"{m / n:.2f}"


if __name__ == "__main__":
    if sys.argv[1:] == ["--report-only"]:
        rerender()
    elif sys.argv[1:] == ["--report-only", "--phases", "tls"]:
        import hops_tls

        hops_tls.rerender()
    else:
        main_guard("compare-hops.sh", run)
