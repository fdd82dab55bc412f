"""callgrind-fanout: instructions per session of a list_changed fan-out, and where they go.

The stack of compare-cache's fan-out phase (two 50-tool fixtures, the caching proxy in
front of them), with mcpyard (1 worker, epoll: valgrind cannot follow io_uring's shared
rings) under `valgrind --tool=callgrind`. The loadgen's `fanout` scenario opens N sessions,
each with its GET stream, then per round triggers a real change of fixture `a`'s list;
mcpyard re-lists, stores the merged list, and tells every session once. Counted between
the loadgen's 'sessions open' line (`callgrind_control -z`) and its 'rounds done' line
(`-d`): the rounds alone, with their 200 ms pauses (idle timers, a few hundred thousand
instructions) and each round's refresh (the two routes re-listed), spread over the
sessions, so the per-session figure is a little high at 1,000 sessions and nearer the
marginal cost at more. Task polls are tokio's `Harness::poll` calls.
"""

import argparse
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from callgrind import annotate, call_count, control, dump, short  # noqa: E402
from perfkit import (  # noqa: E402
    RAW, Fail, Fixture, Gateway, add_quiet_args, apt_install, binaries, fmt, log, machine_info,
    machine_line, main_guard, raise_nofile, set_quiet, table, wait_for_line, write_report,
)

NAME = "callgrind-fanout"
TOOLS = 50
TTL = "5m"


def parse():
    ap = argparse.ArgumentParser(prog="perf/callgrind-fanout.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=1000, help="agent sessions (1000)")
    ap.add_argument("--rounds", type=int, default=5, help="list changes (5)")
    ap.add_argument("--top", type=int, default=25, help="functions listed (25)")
    add_quiet_args(ap)
    return ap.parse_args()


def run(procs):
    a = parse()
    set_quiet(a)
    gw, lg = binaries()
    valgrind = apt_install("valgrind", ["valgrind"])
    cg_control = apt_install("callgrind_control", ["valgrind"])
    raise_nofile(2 * a.sessions + 1000)
    info = machine_info()
    prefix = os.path.join(RAW, "callgrind-fanout.out")
    for old in glob.glob(prefix + ".*"):
        os.unlink(old)
    fa = Fixture(procs, lg, "cgfan-fixture-a", ["--tools", str(TOOLS)])
    fb = Fixture(procs, lg, "cgfan-fixture-b", ["--tools", str(TOOLS)])
    wrapper = [valgrind, "--tool=callgrind", f"--callgrind-out-file={prefix}.%p"]
    g = Gateway(procs, gw, "cgfan-mcpyard", None, workers=1, io="epoll", wrapper=wrapper,
                routes=[("a", fa.url), ("b", fb.url)], cache=TTL)
    pid = g.pid
    prefix = f"{prefix}.{pid}"
    seen = set(glob.glob(prefix + ".*")) | {prefix}
    jpath = os.path.join(RAW, "callgrind-fanout-loadgen.json")
    logpath = os.path.join(RAW, "callgrind-fanout.loadgen.log")
    argv = [lg, "run", "--url", g.url, "--scenario", "fanout", "--sessions", str(a.sessions),
            "--rounds", str(a.rounds), "--trigger", f"http://{fa.addr}/control/tools_changed",
            "--json", jpath]
    log(f"fan-out: {a.sessions} sessions, {a.rounds} rounds, mcpyard under callgrind")
    # Scraped before: opening sessions tells nobody, and a scrape inside the window would
    # be counted (and, slowed by valgrind, could run into the first round).
    m0 = g.scrape()
    lp = procs.start("cgfan-loadgen", argv, logpath)
    wait_for_line(logpath, r"^(\d+) of \d+ sessions open with GET streams", lp, timeout=600)
    control(cg_control, pid, "-z")
    wait_for_line(logpath, r"^\d+ fan-out rounds done", lp, timeout=600)
    path, ir = dump(cg_control, pid, prefix, seen)
    m1 = g.scrape()
    lp.wait(timeout=600)
    procs.stop(lp)
    with open(jpath) as f:
        lgr = json.load(f)
    rounds = lgr.get("rounds", [])
    received = sum(r.get("received", 0) for r in rounds)
    expected = sum(r.get("expected", 0) for r in rounds)
    if not rounds or received != expected:
        raise Fail(f"the fan-out did not reach every session: {received} of {expected}")
    key = "mcpyard_cache_notifications_total"
    told = int(m1.get(key, 0) - m0.get(key, 0))
    n = a.sessions * a.rounds
    polls = call_count(path, r"tokio::runtime::task::harness::Harness<T,S>::poll( |$)")
    allocs = call_count(path, r"__rustc::__rust_(alloc|alloc_zeroed|realloc)( |$)")
    inclusive = annotate(path, True, a.top)
    exit_code = procs.stop(g.p, grace=30)
    data = {
        "machine": info, "sessions": a.sessions, "rounds": a.rounds, "io": "epoll", "workers": 1,
        "ir": ir, "received": received, "told_metric": told, "ir_per_session_round": ir / n,
        "task_polls_per_session_round": polls / n, "allocations_per_session_round": allocs / n,
        "inclusive_top": inclusive, "exit_code": exit_code, "loadgen_argv": argv,
    }
    write_report(NAME, report(data), data)


def report(d):
    n = d["sessions"] * d["rounds"]
    rows = [[fmt(ir), fmt(ir / n), f"{pct:.1f}", f"`{short(fn)}`"]
            for ir, pct, fn, _file in d["inclusive_top"]]
    lines = [
        "# callgrind-fanout: instructions per session of a list_changed fan-out", "",
        f"Generated by `perf/callgrind-fanout.sh` — {machine_line(d['machine'])}", "",
        f"mcpyard **1 worker, epoll**, under valgrind's callgrind; the caching proxy in front "
        f"of two {TOOLS}-tool fixtures. {d['sessions']:,} sessions with GET streams, "
        f"{d['rounds']} real changes of fixture `a`'s list; counted from every session open to "
        f"the last round received ({d['received']:,} notifications received, "
        f"{d['told_metric']:,} counted by `mcpyard_cache_notifications_total`, which counts the "
        f"loadgen's probe session too, one more per round).", "",
        table(["", "per session and round"], [
            ["instructions (Ir)", f"**{fmt(d['ir_per_session_round'])}**"],
            ["task polls", f"{d['task_polls_per_session_round']:.2f}"],
            ["heap allocations", f"{d['allocations_per_session_round']:.2f}"],
        ]), "",
        "Each round's refresh (both routes re-listed and merged) and the pauses between rounds "
        "are in the total too, spread over the sessions.", "",
        "## Top functions by inclusive cost", "",
        table(["Ir", "Ir / session-round", "%", "function"], rows), "",
        f"mcpyard exit code on SIGTERM under valgrind: {d['exit_code']}.", "",
        "## Command", "", "```sh", "perf/callgrind-fanout.sh", "```", "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main_guard("callgrind-fanout.sh", run)
