"""conn-profile: where mcpyard's CPU per request goes as the number of agent connections grows.

For each backend and connection count: the fixture (1 KiB tools/call results), mcpyard (1
worker) in front of it, a closed-loop run of the load generator, and `perf record` (the
software cpu-clock event, so it works where hardware counters do not) on mcpyard's process
for the length of the run. Each symbol's self time is turned into µs of CPU per request
(samples / frequency / requests), and the symbols are listed side by side for every
connection count, largest growth first: what grows with connections is what a wider table
shows more of per request. Also per run: requests/s, CPU µs per request (user and system,
from /proc) and system calls per request (perf tracepoints, where readable).

Writes perf/results/conn-profile.{md,json}; perf data stays under perf/results/raw/.
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import (  # noqa: E402
    RAW, Fail, Fixture, Gateway, add_quiet_args, binaries, fmt, loadgen, loadgen_cmd, log,
    machine_info, machine_line, main_guard, set_quiet, table, write_report,
)

NAME = "conn-profile"
FREQ = 4999  # samples per second of CPU: one every ~200 µs
SYMBOLS_KEPT = 100  # symbols per run in the committed JSON
SYMBOL_CHARS = 160  # of each symbol's name there
SYSCALLS = ("io_uring_enter", "epoll_wait", "sendto", "recvfrom", "writev", "readv", "read",
            "write", "futex")


def perf_ok():
    try:
        r = subprocess.run(["perf", "stat", "-e", "syscalls:sys_enter_epoll_wait", "--", "true"],
                           capture_output=True, timeout=20)
        return r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def self_times(data_path):
    """{symbol: samples} of a perf.data file, self time, user and kernel."""
    r = subprocess.run(["perf", "report", "-i", data_path, "--no-children", "--sort", "dso,symbol",
                        "--stdio", "-q", "-F", "sample,dso,symbol"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise Fail(f"perf report failed: {r.stderr[-500:]}")
    out = collections.Counter()
    for line in r.stdout.splitlines():
        m = re.match(r"\s*(\d+)\s+(\S+)\s+\[(.)\]\s+(.*\S)", line)
        if m:
            samples, dso, kind, sym = int(m.group(1)), m.group(2), m.group(3), m.group(4)
            # Generic parameters and hashes make one function many symbols: fold them.
            sym = re.sub(r"::h[0-9a-f]{16}$", "", sym)
            where = "kernel" if kind == "k" else dso
            out[f"{sym} [{where}]"] += samples
    return out


def one(procs, gw, lg, io, conns, duration, can_trace):
    fx = Fixture(procs, lg, f"cp-fixture-{io}-{conns}", ["--result-bytes", "1024"])
    g = Gateway(procs, gw, f"cp-mcpyard-{io}-{conns}", fx.url, workers=1, io=io)
    data = os.path.join(RAW, f"{NAME}-{io}-{conns}.data")
    warm = 1.0
    # perf starts after the warm-up and stops before the run ends.
    rec = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", str(FREQ), "-o", data,
                            "-p", str(g.pid), "--", "sleep", str(duration - 0.5)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           preexec_fn=lambda: time.sleep(warm))
    trace = None
    if can_trace:
        events = ",".join(f"syscalls:sys_enter_{s}" for s in SYSCALLS)
        trace = subprocess.Popen(["perf", "stat", "-x,", "-e", events, "-p", str(g.pid), "--",
                                  "sleep", str(duration - 0.5)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 preexec_fn=lambda: time.sleep(warm))
    r = loadgen(lg, f"{io}-{conns}", g.url, connections=conns, duration=f"{duration + warm}s",
                warmup=f"{warm}s", watch={"mcpyard": g.pid}, files=False, subdir=f"raw/{NAME}")
    rec.wait(timeout=120)
    syscalls = {}
    if trace:
        _, err = trace.communicate(timeout=120)
        for line in err.splitlines():
            f = line.split(",")
            if len(f) > 3 and f[0].strip().isdigit():
                syscalls[f[2].split("sys_enter_")[-1]] = int(f[0])
    rps = r["throughput_rps"]
    profiled_requests = rps * (duration - 0.5)
    samples = self_times(data)
    us_per_req = {s: n / FREQ * 1e6 / profiled_requests for s, n in samples.items()}
    split = r["cpu_split_us"]["mcpyard"]
    # /proc counts the warm-up too: all requests of the run, at the measured rate.
    n = rps * (duration + warm)
    procs.stop(g.p)
    procs.stop(fx.p)
    return {
        "io": io, "connections": conns, "throughput_rps": rps,
        "cpu_user_us_per_req": split["user"] / n, "cpu_sys_us_per_req": split["sys"] / n,
        "syscalls_per_req": {k: v / profiled_requests for k, v in syscalls.items()},
        "steal_pct": r.get("steal_pct"), "foreign_busy_pct": r.get("foreign_busy_pct"),
        "profile_us_per_req": us_per_req, "profile_total_us_per_req": sum(us_per_req.values()),
        "argv": r["argv"],
    }


def report(d):
    md = ["# Where mcpyard's CPU per request goes as connections grow\n",
          machine_line(d["machine"]) + "\n",
          f"`{d['command']}`: 1 worker, 1 KiB `tools/call` results, closed loop, perf record "
          f"(cpu-clock, {FREQ} Hz) on mcpyard for {d['duration']} s per run. 'other work' "
          "includes perf's own sampling (it is not among the watched processes); 'stolen' is "
          "the hypervisor's. Without hardware counters, cpu-clock samples in the kernel land "
          "where interrupts are enabled again (`_raw_spin_unlock_irqrestore` and the like), so "
          "read the kernel rows as where the kernel was, not as exact costs.\n",
          "## Per run\n"]
    rows = []
    for r in d["runs"]:
        sc = r["syscalls_per_req"]
        main = ", ".join(f"{k} {v:.2f}" for k, v in sorted(sc.items(), key=lambda kv: -kv[1]) if v >= 0.01)
        rows.append([r["io"], r["connections"], fmt(r["throughput_rps"]), f"{r['cpu_user_us_per_req']:.1f}",
                     f"{r['cpu_sys_us_per_req']:.1f}", f"{r['profile_total_us_per_req']:.1f}",
                     f"{sum(sc.values()):.2f}" if sc else "n/a", main or "n/a",
                     fmt(r.get("foreign_busy_pct"), 1), fmt(r.get("steal_pct"), 1)])
    md.append(table(["io", "connections", "req/s", "user µs/req", "sys µs/req", "profiled µs/req",
                     "syscalls/req", "main system calls per request", "other work %",
                     "stolen %"], rows))
    for io in sorted({r["io"] for r in d["runs"]}):
        runs = sorted((r for r in d["runs"] if r["io"] == io), key=lambda r: r["connections"])
        if len(runs) < 2:
            continue
        lo, hi = runs[0], runs[-1]
        syms = set(lo["profile_us_per_req"]) | set(hi["profile_us_per_req"])
        growth = sorted(syms, key=lambda s: -(hi["profile_us_per_req"].get(s, 0) - lo["profile_us_per_req"].get(s, 0)))
        md.append(f"\n## {io}: the {d['top']} symbols that grow most from {lo['connections']} to "
                  f"{hi['connections']} connections (self time, µs of CPU per request)\n")
        rows = []
        for s in growth[:d["top"]]:
            a, b = lo["profile_us_per_req"].get(s, 0), hi["profile_us_per_req"].get(s, 0)
            rows.append([f"`{s[:90]}`", f"{a:.2f}", f"{b:.2f}", f"{b - a:+.2f}"])
        rows.append(["all", f"{lo['profile_total_us_per_req']:.2f}", f"{hi['profile_total_us_per_req']:.2f}",
                     f"{hi['profile_total_us_per_req'] - lo['profile_total_us_per_req']:+.2f}"])
        md.append(table(["symbol [where]", str(lo["connections"]), str(hi["connections"]), "growth"], rows))
    return "\n".join(md) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--io", default="uring,epoll", help="backends (uring,epoll)")
    ap.add_argument("--connections", default="8,256", help="connection counts (8,256)")
    ap.add_argument("--duration", type=float, default=5.0, help="profiled seconds per run (5)")
    ap.add_argument("--top", type=int, default=25, help="symbols listed per backend (25)")
    add_quiet_args(ap)
    a = ap.parse_args()
    set_quiet(a)

    def run(procs):
        gw, lg = binaries()
        can_trace = perf_ok()
        runs = []
        for io in a.io.split(","):
            for c in (int(x) for x in a.connections.split(",")):
                log(f"{io}, {c} connections")
                r = one(procs, gw, lg, io, c, a.duration, can_trace)
                log(f"  {fmt(r['throughput_rps'])} req/s, user {r['cpu_user_us_per_req']:.1f} "
                    f"sys {r['cpu_sys_us_per_req']:.1f} µs/req")
                runs.append(r)
        d = {"machine": machine_info(), "command": "perf/conn-profile.sh " + " ".join(sys.argv[1:]),
             "duration": a.duration, "top": a.top, "runs": runs,
             "loadgen": loadgen_cmd(runs[-1]["argv"])}
        md = report(d)
        # The JSON keeps each run's SYMBOLS_KEPT largest symbols (the full profiles stay in
        # perf/results/raw/ as perf data): every symbol of every run would be megabytes.
        for r in runs:
            top = sorted(r["profile_us_per_req"].items(), key=lambda kv: -kv[1])[:SYMBOLS_KEPT]
            kept = {}
            for sym, us in top:  # generic Rust names run to hundreds of characters
                short = sym if len(sym) <= SYMBOL_CHARS else sym[:SYMBOL_CHARS] + "…"
                kept[short] = kept.get(short, 0.0) + us
            r["profile_us_per_req"] = kept
        write_report(NAME, md, d)

    main_guard("conn-profile.sh", run)


if __name__ == "__main__":
    main()
