"""runtime-ab: the I/O layer alone, a bare HTTP/1.1 relay on four runtimes next to nginx and mcpyard.

Targets, all in front of the same fixture (1 KiB tools/call result, one worker), one thread or
worker process each: nginx (1 worker process, plain keep-alive reverse proxy); the bare relay
of perf/runtime-ab (no MCP work) on tokio's epoll reactor, tokio-uring, monoio and a
purpose-built io_uring completion loop (raw-uring: fixed files, multishot accept and receive
into a provided-buffer ring); mcpyard with 1 worker on epoll and on io_uring.

Per connection count (--connections, default 8,256):
  1. closed loop, every target once per round, round-robin: max req/s;
  2. open loop at a fixed rate, by default 50 % of nginx's median max at that connection count
     (measured in step 1 of the same run), every target once per round: p50/p90/p99 µs from
     the intended send time, CPU µs per request of the target's process group (utime+stime
     from /proc; nginx's master and worker) and, where `perf` can read the syscall
     tracepoints, system calls per request (perf stat on every process of the group while the
     generator runs).
Medians over the rounds are printed and written to perf/results/runtime-ab.{md,json}.
"""

import argparse
import os
import shlex
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import drop_percentiles as perfkit_drop_percentiles  # noqa: E402
from perfkit import rerender as perfkit_rerender  # noqa: E402
from perfkit import (  # noqa: E402
    PERF, RAW, Fail, Fixture, Gateway, Nginx, add_quiet_args, apt_install, binaries, fmt, group_pids,
    loadgen,
    loadgen_cmd, log, machine_info, machine_line, main_guard, median, nginx_conf, raise_nofile,
    set_quiet, summarize, table, wait_for_line, write_report,
)

RETRIES = 2  # extra attempts of a run that shared the machine
NAME = "runtime-ab"
RAW_SUB = "raw/" + NAME  # every run's loadgen JSON (not committed)
RELAYS = ["tokio-epoll", "tokio-uring", "monoio", "raw-uring"]
TARGETS = ["nginx"] + RELAYS + ["mcpyard-epoll", "mcpyard-uring"]
BASE = "nginx"
# The system calls counted (perf tracepoints sys_enter_*): every one through which these
# targets do network I/O or wait for it. The first eight are the ones the targets use; the
# others are counted too where the kernel has them, in case a build starts using them.
SYSCALLS = ["io_uring_enter", "epoll_wait", "sendto", "recvfrom", "writev", "readv", "read",
            "write", "epoll_pwait", "epoll_pwait2", "sendmsg", "recvmsg"]
RELAY_DIR = os.path.join(PERF, "runtime-ab")


def parse():
    ap = argparse.ArgumentParser(prog="runtime-ab.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", default="8,256",
                    help="comma-separated connection counts, each a full pass (default 8,256)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="runs per target, phase and connection count, round-robin; the report "
                         "shows medians (default 3)")
    ap.add_argument("--duration", default="3",
                    help="length of every run in seconds, closed and open loop (default 3)")
    ap.add_argument("--warmup", default="0.5s", help="warm-up before every run (default 0.5s)")
    ap.add_argument("--rate-fraction", type=float, default=0.5,
                    help="open-loop rate as a fraction of nginx's median max at the same "
                         "connection count (default 0.5)")
    ap.add_argument("--rate", type=int, default=None,
                    help="a fixed open-loop rate (req/s) for every connection count instead")
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help=f"comma-separated subset of {','.join(TARGETS)} (default: all)")
    ap.add_argument("--result-bytes", type=int, default=1024, help="fixture result size (1024)")
    ap.add_argument("--retry-foreign", type=float, default=5.0,
                    help=f"run again (up to {RETRIES} times) when other work or stolen time took "
                         "more than this %% of both cores (default 5)")
    add_quiet_args(ap)
    a = ap.parse_args()
    try:
        a.counts = [int(x) for x in a.connections.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--connections: expected numbers, got {a.connections}")
    if not a.counts or min(a.counts) < 1:
        ap.error("--connections: at least one count, each >= 1")
    a.targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    unknown = [t for t in a.targets if t not in TARGETS]
    if unknown or not a.targets:
        ap.error(f"--targets: unknown {unknown}; choose from {TARGETS}")
    a.targets = [t for t in TARGETS if t in a.targets]  # the report's order
    if BASE not in a.targets and a.rate is None:
        ap.error("without nginx among the targets, give --rate")
    if a.rounds < 1:
        ap.error("--rounds: at least 1")
    a.duration = a.duration[:-1] if a.duration.endswith("s") else a.duration
    try:
        float(a.duration)
    except ValueError:
        ap.error(f"--duration: seconds expected, got {a.duration}")
    return a


# --------------------------------------------------------------------------- targets


class Relay:
    """perf/runtime-ab on one runtime, in front of `upstream_addr`."""

    def __init__(self, procs, binary, rt, upstream_addr):
        self.name = rt
        out = os.path.join(RAW, f"{NAME}-{rt}.log")
        self.p = procs.start(f"{NAME}-{rt}", [binary, "--rt", rt, "--listen", "127.0.0.1:0",
                                                "--upstream", upstream_addr], out)
        addr = wait_for_line(out, r"^listening (\S+)", self.p).group(1)
        self.url = f"http://{addr}/mcp"
        self.pid = self.p.pid


def build_relay():
    """Builds perf/runtime-ab (its own cargo project: it pulls monoio, which mcpyard does not
    use); returns the binary's path."""
    if not shutil.which("cargo"):
        raise Fail("cargo is needed to build perf/runtime-ab")
    log("building perf/runtime-ab: nice -n 10 cargo build --release")
    r = subprocess.run(["nice", "-n", "10", "cargo", "build", "--release", "--quiet"],
                       cwd=RELAY_DIR)
    if r.returncode != 0:
        raise Fail("cargo build of perf/runtime-ab failed")
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(RELAY_DIR, "target")
    if not os.path.isabs(target):
        target = os.path.join(RELAY_DIR, target)
    return os.path.join(target, "release", "runtime-ab")


# --------------------------------------------------------------------------- perf stat


def perf_events():
    """(perf binary, the syscall tracepoints it can count here) or (None, [])."""
    perf = shutil.which("perf")
    if not perf:
        return None, []
    ok = []
    for name in SYSCALLS:
        ev = f"syscalls:sys_enter_{name}"
        r = subprocess.run([perf, "stat", "-x,", "-e", ev, "--", "true"],
                           capture_output=True, text=True)
        if r.returncode == 0 and "not supported" not in r.stderr and "<not" not in r.stderr:
            ok.append(name)
    return (perf, ok) if ok else (None, [])


def perf_wrapper(perf, events, pids, out, lg):
    """A script that runs the load generator under `perf stat -p PIDS`: the counters run
    exactly while the generator does (warm-up included), on every process of the target.
    Returns its path (the generator's arguments are appended by perfkit.loadgen)."""
    path = os.path.join(RAW, f"{NAME}-perf-loadgen.sh")
    evs = ",".join(f"syscalls:sys_enter_{e}" for e in events)
    argv = [perf, "stat", "-x,", "-o", out, "-e", evs, "-p", ",".join(map(str, pids)), "--", lg]
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexec " + " ".join(shlex.quote(x) for x in argv) + ' "$@"\n')
    os.chmod(path, 0o755)
    return path


def read_perf(out):
    """{syscall: count} from a `perf stat -x,` output file."""
    counts = {}
    try:
        with open(out) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(",")
        if len(parts) < 3 or "sys_enter_" not in parts[2]:
            continue
        name = parts[2].split("sys_enter_", 1)[1]
        try:
            counts[name] = float(parts[0])
        except ValueError:  # <not counted>
            counts[name] = None
    return counts


# --------------------------------------------------------------------------- runs


def run(procs):
    a = parse()
    set_quiet(a)
    gw, lg = binaries()
    relay = build_relay() if set(a.targets) & set(RELAYS) else None
    nginx_bin = nginx_version = None
    if "nginx" in a.targets:
        nginx_bin = apt_install("nginx", ["nginx-light", "nginx"])
        nginx_version = subprocess.run([nginx_bin, "-v"], capture_output=True,
                                       text=True).stderr.strip().replace("nginx version: ", "")
    perf, events = perf_events()
    log(f"perf syscall tracepoints: {', '.join(events) if events else 'not available'}")
    raise_nofile(4 * max(a.counts) + 1024)
    info = machine_info()

    fx = Fixture(procs, lg, f"{NAME}-fixture", ["--result-bytes", str(a.result_bytes)], workers=1)
    targets = {}
    for t in a.targets:
        if t == "nginx":
            targets[t] = Nginx(procs, nginx_bin, f"{NAME}-nginx", fx.addr, workers=1)
        elif t.startswith("mcpyard-"):
            targets[t] = Gateway(procs, gw, f"{NAME}-{t}", fx.url, workers=1,
                                 io=t.split("-", 1)[1])
        else:
            targets[t] = Relay(procs, relay, t, fx.addr)
    log(f"fixture {fx.addr}; targets: " + ", ".join(f"{k} {v.url}" for k, v in targets.items()))

    duration = f"{a.duration}s"
    perf_out = os.path.join(RAW, f"{NAME}-perf.csv")

    def one(tag, name, conns, rate, traced=False):
        # A run that shared the machine (other work or the hypervisor's stolen time above
        # --retry-foreign % of both cores) measured a slower machine: run it again, at most
        # RETRIES times, and keep the quietest.
        best = None
        for attempt in range(1 + RETRIES):
            r = measure(tag, name, conns, rate, traced)
            r["attempt"] = attempt + 1
            if best is None or r["foreign_busy_pct"] < best["foreign_busy_pct"]:
                best = r
            if r["foreign_busy_pct"] <= a.retry_foreign:
                break
            log(f"{tag} {name}: other work {r['foreign_busy_pct']:.0f} % (stolen "
                f"{r.get('steal_pct', 0):.0f} %) over {a.retry_foreign:.0f} %: again")
        return best

    def measure(tag, name, conns, rate, traced):
        t = targets[name]
        gen = lg
        if traced:
            if os.path.exists(perf_out):
                os.unlink(perf_out)
            gen = perf_wrapper(perf, events, group_pids(t.pid), perf_out, lg)
        r = loadgen(gen, f"{tag}-{name}", t.url, rate=rate, connections=conns, duration=duration,
                    warmup=a.warmup, watch={"target": t.pid, "fixture": fx.pid}, files=False,
                    subdir=RAW_SUB)
        r["argv"] = [lg] + r["argv"][1:]
        # CPU and system calls are counted over the whole run, warm-up included.
        n = r["requests_ok"] + sum(r["errors"].values()) + r.get("warmup_requests", 0)
        r["requests_counted"] = n
        r["cpu_us_per_req"] = {k: (v / n if n else None) for k, v in r["cpu_us"].items()}
        for k, split in r["cpu_split_us"].items():
            for part, v in split.items():
                r["cpu_us_per_req"][f"{k}_{part}"] = v / n if n else None
        if traced:
            counts = read_perf(perf_out)
            if counts:
                r["syscalls"] = counts
                r["syscalls_per_req"] = {k: (v / n if n and v is not None else None)
                                         for k, v in counts.items()}
                r["syscalls_per_req"]["total"] = (
                    sum(v for v in counts.values() if v is not None) / n if n else None)
        line = (f"{tag} {name}: {r['throughput_rps']:,.0f} req/s, "
                f"p50/p90/p99 {r['response_us']['p50']:.0f}/{r['response_us']['p90']:.0f}/"
                f"{r['response_us']['p99']:.0f} µs, cpu {fmt(r['cpu_us_per_req']['target'], 1)} "
                f"µs/req")
        if r.get("syscalls_per_req"):
            line += f", {r['syscalls_per_req']['total']:.2f} syscalls/req"
        errors = sum(r["errors"].values())
        if errors or r["unsent"]:
            line += f", errors {errors}, unsent {r['unsent']}"
        log(line)
        return r

    def rounds(tag, conns, rate):
        """Every target once per round, round-robin, so slow drift hits all alike."""
        runs = {name: [] for name in targets}
        for k in range(a.rounds):
            for name in targets:
                runs[name].append(one(f"c{conns}-{tag}-{k + 1}", name, conns, rate))
        return {name: summarize_runs(rs) for name, rs in runs.items()}

    counts = {}
    for conns in a.counts:
        log(f"{conns} connections: closed loop, {a.rounds} round(s)")
        maxes = rounds("max", conns, None)
        base_max = maxes[BASE]["throughput_rps"] if BASE in maxes else None
        rate = a.rate or max(100, int(round(base_max * a.rate_fraction / 10.0)) * 10)
        log(f"{conns} connections: open loop at {rate} req/s"
            + (f" ({a.rate_fraction:.0%} of nginx's median max {base_max:,.0f})"
               if a.rate is None else ""))
        at = rounds("rate", conns, rate)
        if perf:
            # System calls come from one more run per target at the same rate, traced: the
            # tracepoints cost mcpyard's tail latency far more than the relays' (p99 25-45 ms
            # against 4-5 ms untraced, at 256 connections), so latency and CPU come from the
            # untraced runs above.
            log(f"{conns} connections: system calls, one traced run each at {rate} req/s")
            for name in targets:
                traced = one(f"c{conns}-syscalls", name, conns, rate, traced=True)
                if traced.get("syscalls_per_req"):
                    at[name]["syscalls_per_req"] = traced["syscalls_per_req"]
        counts[str(conns)] = {"rate": rate, "base_max_rps": base_max, "max": maxes, "at": at}
        print_medians(conns, rate, counts[str(conns)], list(targets))

    exits = {name: procs.stop(t.p) for name, t in targets.items()}
    exits["fixture"] = procs.stop(fx.p)
    data = {
        "machine": info, "argv": sys.argv[1:], "nginx_version": nginx_version,
        "targets": list(targets), "connections": a.counts, "rounds": a.rounds,
        "duration": duration, "warmup": a.warmup, "rate_fraction": a.rate_fraction,
        "rate_fixed": a.rate, "result_bytes": a.result_bytes, "fixture_args": fx.args,
        "perf_events": events, "counts": counts, "exit_codes": exits,
    }
    write_report(NAME, report(data), strip(data))


def summarize_runs(rs):
    """perfkit.summarize plus the medians of the system-call counts per request."""
    s = summarize(rs)
    names = sorted({k for r in rs for k in (r.get("syscalls_per_req") or {})})
    if names:
        s["syscalls_per_req"] = {k: median([(r.get("syscalls_per_req") or {}).get(k)
                                            for r in rs]) for k in names}
    s["requests_counted"] = median([r["requests_counted"] for r in rs])
    return s


def strip(data):
    """The summary JSON without every run's percentile steps (those are in raw/runtime-ab/)."""
    import copy

    d = copy.deepcopy(data)
    for per in d["counts"].values():
        for phase in ("max", "at"):
            for s in per[phase].values():
                for r in s["rounds"]:
                    perfkit_drop_percentiles(r)
    return d


# --------------------------------------------------------------------------- output


def main_syscalls(sc, limit=4):
    """The main system calls per request, largest first: '2.00 io_uring_enter, …'."""
    if not sc:
        return "–"
    items = [(k, v) for k, v in sc.items() if k != "total" and v and v >= 0.05]
    items.sort(key=lambda kv: -kv[1])
    return ", ".join(f"{v:.2f} {k}" for k, v in items[:limit]) or "none"


def ratio(v, base):
    if v is None or not base:
        return "–"
    return f"{v / base:.2f}"


def print_medians(conns, rate, per, names):
    print(f"\nruntime-ab, {conns} connections: medians over the rounds (max: closed loop; "
          f"the rest at {rate} req/s)", flush=True)
    print(f"{'target':<14} {'max req/s':>10} {'p50':>6} {'p90':>6} {'p99':>6} "
          f"{'cpu µs/req':>10} {'syscalls/req':>12}  main system calls", flush=True)
    for n in names:
        m, r = per["max"][n], per["at"][n]
        sc = r.get("syscalls_per_req") or {}
        total = f"{sc['total']:.2f}" if sc.get("total") is not None else "–"
        print(f"{n:<14} {m['throughput_rps']:>10,.0f} {r['response_us']['p50']:>6.0f} "
              f"{r['response_us']['p90']:>6.0f} {r['response_us']['p99']:>6.0f} "
              f"{fmt(r['cpu_us_per_req'].get('target'), 1):>10} {total:>12}  "
              f"{main_syscalls(sc)}", flush=True)


def report(d):
    L = []
    L.append("# runtime-ab: the I/O layer alone, bare relays vs nginx vs mcpyard\n")
    runs = [x for per in d["counts"].values() for ph in ("max", "at") for s in per[ph].values()
            for x in s["rounds"]]
    waited = sum(x.get("quiet_waited_s", 0) for x in runs)
    L.append(f"Generated by `perf/runtime-ab.sh` — {machine_line(d['machine'], waited)}\n")
    L.append(
        f"Fixture: `mcpyard-loadgen {' '.join(d['fixture_args'])}` ({d['result_bytes']} B "
        "result, one worker), shared by every target. Targets, one thread or worker process "
        f"each: {(d['nginx_version'] or 'nginx').replace('nginx version: ', '')} as a plain keep-alive reverse proxy "
        "(`worker_processes 1`, config below); the bare HTTP/1.1 relay of `perf/runtime-ab` "
        "(each request and response read whole by `content-length`, no MCP work) on tokio's "
        "epoll reactor, tokio-uring, monoio, and `raw-uring`, a completion loop on the "
        "`io-uring` crate (fixed files, multishot accept and receive into a provided-buffer "
        "ring, one `io_uring_enter` per loop turn; see `perf/runtime-ab/src/raw.rs`); mcpyard "
        "with 1 worker on epoll and on io_uring (`client` binding to the fixture, full MCP "
        "handling).\n")
    rate = (f"{d['rate_fraction']:.0%} of nginx's median max at that connection count, "
            "measured just before" if d["rate_fixed"] is None else f"{d['rate_fixed']} req/s")
    if d["perf_events"]:
        calls = ("System calls/req: `perf stat` counting the tracepoints `sys_enter_{"
                 + ",".join(d["perf_events"]) + "}` on every process of the target while the "
                 "generator runs (warm-up included), all of them added up; the main ones are "
                 "listed. They come from one more open-loop run per target at the same rate: "
                 "tracing costs mcpyard's tail latency far more than the relays', so the "
                 "latency and CPU figures come from untraced runs.")
    else:
        calls = "System calls were not counted (`perf` or its syscall tracepoints unavailable)."
    L.append(
        f"Every run: {d['duration']} measured after {d['warmup']} of warm-up. Per connection "
        "count, first every target in closed loop (max req/s), then every target in open loop "
        f"at one fixed rate: {rate}. {d['rounds']} round(s), round-robin (every target once, "
        "then again); every figure is the **median over the rounds**, each column on its own. "
        "Latency: from the intended send time, µs. CPU µs/req: utime+stime of the target's "
        "process group (nginx: master and worker) from /proc (10 ms ticks) over the whole "
        f"run, warm-up included, divided by all its requests. {calls} Ratios: target / nginx "
        "at the same connection count.\n")
    # In connection-count order: a JSON round trip sorts the keys as text ("256" < "8").
    for conns, per in sorted(d["counts"].items(), key=lambda kv: int(kv[0])):
        names = [n for n in d["targets"] if n in per["max"]]
        base_m = per["max"].get(BASE)
        base_r = per["at"].get(BASE)
        L.append(f"## {conns} connections — open loop at {per['rate']:,} req/s\n")
        rows = []
        for n in names:
            m, r = per["max"][n], per["at"][n]
            c = r["cpu_us_per_req"]
            sc = r.get("syscalls_per_req") or {}
            rows.append([
                n, fmt(m["throughput_rps"]),
                f"{fmt(m['throughput_min'])}–{fmt(m['throughput_max'])}",
                ratio(m["throughput_rps"], base_m and base_m["throughput_rps"]),
                int(round(r["response_us"]["p50"])), int(round(r["response_us"]["p90"])),
                int(round(r["response_us"]["p99"])),
                f"{int(r['response_us']['p99_min'])}–{int(r['response_us']['p99_max'])}",
                ratio(r["response_us"]["p50"], base_r and base_r["response_us"]["p50"]),
                fmt(c.get("target"), 1), fmt(c.get("target_user"), 1),
                fmt(c.get("target_sys"), 1),
                ratio(c.get("target"), base_r and base_r["cpu_us_per_req"].get("target")),
                fmt(sc.get("total"), 2),
                ratio(sc.get("total"), base_r and (base_r.get("syscalls_per_req") or {}).get("total")),
                main_syscalls(sc),
                f"{sum(m['errors'].values())}; {sum(r['errors'].values())}/{r['unsent']}",
                fmt(max(m["foreign_busy_pct"], r["foreign_busy_pct"]), 1),
                fmt(max(m.get("steal_pct", 0.0), r.get("steal_pct", 0.0)), 1),
            ])
        L.append(table(
            ["target", "max req/s", "range", "× nginx", "p50", "p90", "p99", "p99 range",
             "p50 × nginx", "CPU µs/req", "of it user", "of it kernel", "CPU × nginx",
             "syscalls/req", "× nginx", "main system calls / req", "errors: max; rate/unsent",
             "foreign %", "stolen %"], rows,
            ["l"] + ["r"] * 14 + ["l", "r", "r", "r"]))
        L.append("")
    L.append("'foreign %' is the machine's busy time not spent by anything started here, in % "
             "of both cores (the highest of the runs): other work on the shared machine; "
             "'stolen %' is the part of it the hypervisor gave to other machines (a run with "
             "much of it measured a slower machine). "
             "'of it user' / 'of it kernel' split the CPU µs/req into the target's own code and "
             "the kernel's work for it (system calls, TCP, wake-ups, io_uring task work).\n")
    if d.get("nginx_version"):
        L.append("## nginx.conf\n")
        L.append("```nginx\n" + nginx_conf("<tmp>", "<port>", "<fixture>", 1) + "```\n")
    L.append("## Commands\n")
    L.append("```sh\nperf/runtime-ab.sh " + " ".join(d["argv"]) + "\n```\n")
    first = next(iter(d["counts"].values()))
    ex = [first["max"][d["targets"][0]]["argv"], first["at"][d["targets"][0]]["argv"]]
    L.append("Loadgen command lines (addresses chosen at run time; the open-loop runs under "
             "`perf stat -x, -e <tracepoints> -p <target pids> --`):\n")
    L.append("```sh\n" + "\n".join(loadgen_cmd(x) for x in ex) + "\n```\n")
    L.append("Exit codes on SIGTERM: " + ", ".join(
        f"{k} {v}" for k, v in d["exit_codes"].items()) + " (negative: killed by that signal; "
        "the relays and the fixture have no handler).\n")
    L.append(f"Every run's loadgen JSON: `perf/results/{RAW_SUB}/` (not committed).\n")
    return "\n".join(L)


if __name__ == "__main__":
    if sys.argv[1:] == ["--report-only"]:
        perfkit_rerender(NAME, report)
    else:
        main_guard("runtime-ab.sh", run)
