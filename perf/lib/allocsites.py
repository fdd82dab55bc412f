"""alloc-sites: where a tools/call's heap allocations are made, by call site.

mcpyard (1 worker, epoll, as for callgrind: valgrind cannot follow io_uring's rings) runs
under `valgrind --tool=dhat` in front of the fixture, twice: once for N tools/call and once
for 3N, each after the same warm-up. DHAT counts every allocation by its call stack, and
the per-call figure of a site is its count in the second run minus the first, over the 2N
extra calls, so that start-up, warm-up and session setup cancel out. A site is named by its
first frames outside the standard library (`--depth`). The callgrind report gives the
total per call too; this one says where they are.
"""

import argparse
import collections
import json
import os
import re
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import (  # noqa: E402
    RAW, Fail, Fixture, Gateway, apt_install, binaries, loadgen, log, machine_info, machine_line,
    main_guard, table, write_report,
)

CALLS = 'mcpyard_request_seconds_count{method="tools/call",outcome="ok"}'
RATE = 400


def parse():
    ap = argparse.ArgumentParser(prog="alloc-sites.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=1000, help="N: the first run's tools/call (1000)")
    ap.add_argument("--depth", type=int, default=4, help="frames outside std naming a site (4)")
    ap.add_argument("--result-bytes", type=int, default=1024, help="fixture result (1024)")
    return ap.parse_args()


def frame_label(frame):
    """`name@file:line` for a frame of ours or a crate's, None for std, alloc and valgrind."""
    m = re.match(r"0x[0-9A-Fa-f]+: (.*) \((.*)\)$", frame)
    if not m:
        return None
    name, loc = m.group(1), m.group(2)
    if loc.startswith("library/") or "vgpreload" in loc or "/rustc/" in loc:
        return None
    if name.startswith("UnknownInlinedFun") or name.startswith("{"):
        return loc
    return f"{re.sub(r'<.*>', '', name)[:60]}@{loc}"


def sites(path, depth):
    with open(path) as f:
        d = json.load(f)
    ftbl = d["ftbl"]
    out = collections.Counter()
    for pp in d["pps"]:
        keep = []
        for i in pp["fs"]:
            label = frame_label(ftbl[i])
            if label and (not keep or keep[-1] != label):
                keep.append(label)
            if len(keep) >= depth:
                break
        out[" ← ".join(keep)] += pp["tbk"]
    return out


def one_run(procs, gw, lg, fx, n, a):
    path = os.path.join(RAW, f"dhat.out.{n}")
    wrapper = ["valgrind", "--tool=dhat", f"--dhat-out-file={path}"]
    g = Gateway(procs, gw, f"dhat-mcpyard-{n}", fx.url, workers=1, io="epoll", wrapper=wrapper)
    common = dict(rate=RATE, connections=1, warmup="0s", files=False, subdir="raw", extra=["--timeout", "30s"])
    loadgen(lg, f"dhat-warm-{n}", g.url, duration="0.5s", **common)
    m0 = g.scrape()
    loadgen(lg, f"dhat-run-{n}", g.url, duration=f"{n / RATE:.3f}s", **common)
    calls = int(g.scrape().get(CALLS, 0) - m0.get(CALLS, 0))
    os.kill(g.pid, signal.SIGTERM)
    g.p.wait(timeout=120)
    if not os.path.exists(path):
        raise Fail(f"valgrind wrote no {path}")
    return path, calls


def run(procs):
    a = parse()
    apt_install("valgrind", ["valgrind"])
    gw, lg = binaries()
    info = machine_info()
    fx = Fixture(procs, lg, "dhat-fixture", ["--result-bytes", str(a.result_bytes)], workers=1)
    n1, n2 = a.requests, 3 * a.requests
    log(f"dhat: {n1} then {n2} tools/call")
    p1, c1 = one_run(procs, gw, lg, fx, n1, a)
    p2, c2 = one_run(procs, gw, lg, fx, n2, a)
    if c2 <= c1:
        raise Fail(f"the second run served {c2} calls, the first {c1}: cannot difference")
    s1, s2 = sites(p1, a.depth), sites(p2, a.depth)
    per = {k: (s2[k] - s1.get(k, 0)) / (c2 - c1) for k in s2}
    rows = sorted(((v, k) for k, v in per.items() if v >= 0.05), reverse=True)
    total = sum(per.values())
    data = {"machine": info, "calls": [c1, c2], "per_call": total, "depth": a.depth,
            "sites": [{"per_call": v, "site": k} for v, k in rows]}
    L = ["# alloc-sites: heap allocations per tools/call, by call site\n",
         machine_line(info) + "\n",
         f"valgrind `--tool=dhat`, mcpyard 1 worker, epoll, in front of the fixture ({a.result_bytes} B "
         f"result); {c1} and then {c2} tools/call at {RATE}/s on one connection, each run after a warm-up; "
         f"per call = (second run − first run) / {c2 - c1}. A site is its first {a.depth} frames outside the "
         "standard library, innermost first.\n",
         f"**{total:.1f} allocations per tools/call.**\n",
         table(["per call", "site"], [[f"{v:.2f}", "`" + k + "`"] for v, k in rows], ["r", "l"]),
         "\n## Command\n", "```sh\nbash perf/alloc-sites.sh " + " ".join(sys.argv[1:]) + "\n```\n"]
    write_report("alloc-sites", "\n".join(L), data)
    print(f"{total:.1f} allocations per tools/call")


if __name__ == "__main__":
    main_guard("alloc-sites.sh", run)
