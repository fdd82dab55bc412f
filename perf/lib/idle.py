"""idle-sessions: memory per idle MCP session with a GET stream open, and list_changed fan-out.

For each N (1 000 and 10 000): a fresh fixture and mcpyard (1 worker, io_uring); mcpyard's
VmRSS before; the loadgen opens N sessions (initialize, initialized, GET event stream), each
on its own connection, and holds them; VmRSS while all are open; per session =
(open − before) / N. Then, with another fresh pair, the loadgen `fanout` scenario opens N
sessions and POSTs the fixture's /control/list_changed; the fixture pushes list_changed on
every upstream GET stream, mcpyard relays it to every agent's GET stream, and the loadgen
times each arrival from the trigger — the last arrival is the fan-out latency.
"""

import argparse
import json
import os
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import (  # noqa: E402
    RAW, RESULTS, Fail, Fixture, Gateway, add_quiet_args, binaries, fd_count, fmt, loadgen,
    loadgen_cmd, log, machine_info, machine_line, main_guard, raise_nofile, rss_kib, set_quiet,
    status_field, table, wait_for_line, wait_quiet, write_report,
)

NAME = "idle-sessions"
SUB = NAME
TARGET_KIB = 16


def parse():
    ap = argparse.ArgumentParser(prog="idle-sessions.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", default="1000,10000", help="comma-separated N (1000,10000)")
    ap.add_argument("--hold", default="4s", help="how long the loadgen holds the sessions (4s)")
    ap.add_argument("--rounds", type=int, default=5, help="fan-out rounds (default 5)")
    ap.add_argument("--io", default="uring", choices=["uring", "epoll"], help="mcpyard io (uring)")
    add_quiet_args(ap)
    return ap.parse_args()


def post(url):
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def gauges(g):
    m = g.scrape()
    keys = ["mcpyard_sessions", "mcpyard_connections", "mcpyard_upstream_sessions",
            "mcpyard_upstream_connections", "mcpyard_overload_rejections_total",
            "mcpyard_upstream_failed_total", "mcpyard_upstream_connect_failures_total"]
    return {k.replace("mcpyard_", ""): m.get(k) for k in keys}


def run(procs):
    a = parse()
    set_quiet(a)
    ns = [int(x) for x in a.sessions.split(",") if x.strip()]
    gw, lg = binaries()
    nofile, nofile_note = raise_nofile(max(65536, 4 * max(ns) + 4096))
    info = machine_info()
    os.makedirs(os.path.join(RESULTS, SUB), exist_ok=True)
    out = {}
    for n in ns:
        # --- memory
        fx = Fixture(procs, lg, f"idle-{n}-fixture", [], workers=1)
        g = Gateway(procs, gw, f"idle-{n}-mcpyard", fx.url, workers=1, io=a.io)
        time.sleep(0.5)
        wait_quiet()
        rss0 = rss_kib(g.pid)
        fds0 = fd_count(g.pid)
        jpath = os.path.join(RESULTS, SUB, f"idle-{n}.json")
        logpath = os.path.join(RAW, f"idle-{n}.loadgen.log")
        argv = [lg, "run", "--url", g.url, "--scenario", "idle-sessions", "--sessions", str(n),
                "--duration", a.hold, "--json", jpath]
        log(f"{n} idle sessions: opening")
        t0 = time.time()
        lp = procs.start(f"idle-{n}-loadgen", argv, logpath)
        m = wait_for_line(logpath, r"^opened (\d+) in ([\d.]+) s", lp, timeout=300)
        time.sleep(1.0)  # let the last GETs settle upstream too
        rss1 = rss_kib(g.pid)
        hwm1 = int(status_field(g.pid, "VmHWM").split()[0])
        fds1 = fd_count(g.pid)
        fx_rss1 = rss_kib(fx.pid)
        g1 = gauges(g)
        lp.wait(timeout=120 + (time.time() - t0))
        procs.stop(lp)
        if lp.returncode != 0:
            with open(logpath, errors="replace") as f:
                raise Fail(f"loadgen idle-sessions {n} exited {lp.returncode}:\n{f.read()[-2000:]}")
        with open(jpath) as f:
            idle = json.load(f)
        time.sleep(1.0)
        rss2 = rss_kib(g.pid)
        g2 = gauges(g)
        leftover = post(f"http://{fx.addr}/control/list_changed").get("streams")
        exit_code = procs.stop(g.p)
        procs.stop(fx.p)
        per = (rss1 - rss0) / n
        log(f"{n}: RSS {rss0} → {rss1} KiB, {per:.1f} KiB/session")

        # --- fan-out, on a fresh pair
        fx = Fixture(procs, lg, f"fanout-{n}-fixture", [], workers=1)
        g = Gateway(procs, gw, f"fanout-{n}-mcpyard", fx.url, workers=1, io=a.io)
        log(f"{n} sessions: fan-out, {a.rounds} rounds")
        fan = loadgen(lg, f"fanout-{n}", g.url, scenario="fanout", duration=None, files=True,
                      extra=["--sessions", str(n), "--rounds", str(a.rounds),
                             "--trigger", f"http://{fx.addr}/control/list_changed"],
                      watch={"mcpyard": g.pid, "fixture": fx.pid}, subdir=SUB)
        fan_exit = procs.stop(g.p)
        procs.stop(fx.p)
        fan["delivery_us"].pop("percentiles", None)
        out[n] = {
            "rss_kib_before": rss0, "rss_kib_open": rss1, "hwm_kib_open": hwm1,
            "rss_kib_after_close": rss2, "kib_per_session": per,
            "fds_before": fds0, "fds_open": fds1, "fixture_rss_kib_open": fx_rss1,
            "gauges_open": g1, "gauges_after_close": g2,
            "upstream_get_streams_left_after_close": leftover,
            "opened": int(m.group(1)), "open_time_s": float(m.group(2)), "loadgen": idle,
            "loadgen_argv": argv, "exit_code": exit_code, "fanout": fan, "fanout_exit": fan_exit,
        }
    data = {"machine": info, "io": a.io, "hold": a.hold, "rounds": a.rounds, "nofile": nofile, "nofile_note": nofile_note,
            "runs": out}
    write_report(NAME, report(data, a), data)


def report(d, a):
    rs = d["runs"]
    L = ["# idle-sessions: memory per idle session and list_changed fan-out through mcpyard\n"]
    L.append(f"Generated by `perf/idle-sessions.sh` — {machine_line(d['machine'])}\n")
    L.append(
        f"mcpyard: 1 worker, {d['io']}, `client` binding in front of the fixture "
        "(`mcpyard-loadgen upstream`, 1 worker). Each session: its own connection, initialize, "
        "notifications/initialized, then a GET event stream held open (so mcpyard holds an "
        "upstream session and an upstream GET stream for it too). VmRSS from "
        f"/proc/<pid>/status; RLIMIT_NOFILE raised to {d['nofile']} for every process.\n"
    )
    L.append("## Memory\n")
    rows = []
    for n, r in rs.items():
        g = r["gauges_open"]
        rows.append([f"{int(n):,}", f"{r['opened']:,}", f"{r['open_time_s']:.2f}",
                     f"{r['rss_kib_before']:,}", f"{r['rss_kib_open']:,}",
                     f"**{r['kib_per_session']:.1f}**", f"{r['hwm_kib_open']:,}",
                     f"{r['fds_before']} → {r['fds_open']}",
                     f"{fmt(g['sessions'])} / {fmt(g['connections'])}",
                     f"{fmt(g['upstream_sessions'])} / {fmt(g['upstream_connections'])}",
                     f"{r['loadgen']['still_open']:,}"])
    L.append(table(["sessions", "opened", "open time s", "RSS before KiB", "RSS open KiB",
                    "KiB / session", "VmHWM KiB", "fds", "sessions / conns (metrics)",
                    "upstream sessions / conns", "still open at end"], rows))
    L.append("")
    L.append("After the loadgen closed its connections (1 s later):\n")
    rows = []
    for n, r in rs.items():
        g = r["gauges_after_close"]
        rows.append([f"{int(n):,}", f"{r['rss_kib_after_close']:,}", fmt(g["sessions"]),
                     fmt(g["connections"]), fmt(g["upstream_sessions"]),
                     fmt(g["upstream_connections"]),
                     fmt(r["upstream_get_streams_left_after_close"])])
    L.append(table(["sessions", "RSS KiB", "sessions", "connections", "upstream sessions",
                    "upstream connections", "fixture GET streams still open"], rows))
    L.append("")
    L.append("(MCP sessions outlive their GET stream until `session_timeout`, default 30 min; "
             "the last column is what the fixture's /control/list_changed reported as open "
             "streams.)\n")
    L.append("## list_changed fan-out (µs from the trigger POST)\n")
    rows = []
    for n, r in rs.items():
        f = r["fanout"]
        dl = f["delivery_us"]
        lasts = [x["time_to_last_us"] for x in f["rounds"]]
        recv = sum(x["received"] for x in f["rounds"])
        exp = sum(x["expected"] for x in f["rounds"])
        rows.append([f"{int(n):,}", len(lasts), f"{recv:,} / {exp:,}", fmt(dl["p50"]),
                     fmt(dl["p99"]), fmt(dl["max"]),
                     ", ".join(f"{x:,}" for x in lasts),
                     fmt(sorted(lasts)[len(lasts) // 2] if lasts else None),
                     fmt(f["cpu_us"].get("mcpyard") / max(1, recv), 1)])
    L.append(table(["sessions", "rounds", "received / expected", "p50", "p99", "max",
                    "time to last, per round", "median time to last", "mcpyard CPU µs / delivery"],
                   rows))
    L.append("")
    L.append("## Target (issue #4)\n")
    r = rs.get(10000) or rs[max(rs)]
    n = 10000 if 10000 in rs else max(rs)
    ok = r["kib_per_session"] <= TARGET_KIB and r["opened"] == n
    L.append(table(["target", "measured", "ratio to target", "verdict"], [[
        f"{n:,} idle sessions with GET streams ≤ {TARGET_KIB} KiB of mcpyard RSS each",
        f"{r['kib_per_session']:.1f} KiB/session ({r['opened']:,} opened)",
        f"{r['kib_per_session'] / TARGET_KIB:.2f}", "reached" if ok else "**missed**"]],
        ["l", "l", "r", "l"]))
    L.append("")
    L.append("## Commands\n")
    L.append("```sh\nperf/idle-sessions.sh " + " ".join(sys.argv[1:]) + "\n```\n")
    for n, r in rs.items():
        L.append("```sh\n" + loadgen_cmd(r["loadgen_argv"]) + "\n" +
                 loadgen_cmd(r["fanout"]["argv"]) + "\n```\n")
        break
    L.append(f"Loadgen JSON per run: `perf/results/{SUB}/`.\n")
    return "\n".join(L)


if __name__ == "__main__":
    main_guard("idle-sessions.sh", run)
