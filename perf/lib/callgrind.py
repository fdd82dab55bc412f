"""callgrind: instructions per tools/call through mcpyard, and where they go.

mcpyard (1 worker, epoll: io_uring's shared rings are opaque to valgrind, so epoll is the
path valgrind can follow) runs under `valgrind --tool=callgrind` in front of the fixture
(which runs natively). The loadgen sends, on one connection, open loop at a rate the
instrumented gateway keeps up with (so the count is fixed: rate × duration):

  warm-up  200 requests (not measured)
  idle     `callgrind_control -z`, 2 s of nothing, `-d`: instructions/s of the idle timers
  A        `-z`, N requests, `-d`
  B        `-z`, 2N requests, `-d`

Every run of the loadgen also opens its probe session and its connection's session
(initialize + initialized) and closes them: a fixed cost per run. B / 2N includes it once;
(B − A) / N cancels it, and the idle instructions over the extra wall time of B are then
subtracted. Request counts come from mcpyard's own metrics (tools/call ok), scraped
between phases, outside the measured windows.
"""

import argparse
import glob
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import authkit  # noqa: E402
from perfkit import (  # noqa: E402
    REPO, RAW, Fail, Fixture, Gateway, add_quiet_args, set_quiet, apt_install, binaries, fmt, loadgen, loadgen_cmd, log,
    machine_info, machine_line, main_guard, table, write_report,
)

NAME = "callgrind"
CALLS = 'mcpyard_request_seconds_count{method="tools/call",outcome="ok"}'
INITS = 'mcpyard_request_seconds_count{method="initialize",outcome="ok"}'


def parse():
    ap = argparse.ArgumentParser(prog="callgrind.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="phase B sends N requests, phase A N/2 (default 2000)")
    ap.add_argument("--warmup-requests", type=int, default=200, help="warm-up requests (200)")
    ap.add_argument("--rate", type=int, default=400, help="open-loop rate under valgrind (400/s)")
    ap.add_argument("--result-bytes", type=int, default=1024, help="fixture result (1024)")
    ap.add_argument("--top", type=int, default=30, help="functions listed (30)")
    ap.add_argument("--auth", action="store_true",
                    help="the server binding checks a bearer token (auth: with an RS256 JWKS file)")
    ap.add_argument("--proxy", action="store_true",
                    help="mcpyard as server -> proxy (routes a, b; both clients of the fixture) -> "
                         "client, calling a__echo; writes callgrind-proxy.{md,json}")
    add_quiet_args(ap)
    return ap.parse_args()


def control(cg_control, pid, *args):
    r = subprocess.run([cg_control, *args, str(pid)], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise Fail(f"callgrind_control {' '.join(args)} {pid} failed: {r.stdout}{r.stderr}")


def dump(cg_control, pid, prefix, seen):
    control(cg_control, pid, "-d")
    deadline = time.time() + 30
    while time.time() < deadline:
        new = sorted(set(glob.glob(prefix + ".*")) - seen)
        if new:
            path = new[-1]
            time.sleep(0.2)
            seen.add(path)
            return path, totals(path)
        time.sleep(0.1)
    raise Fail("callgrind dump file did not appear")


def totals(path):
    with open(path, errors="replace") as f:
        for line in f:
            m = re.match(r"^(?:summary|totals):\s+(\d+)", line)
            if m:
                return int(m.group(1))
    raise Fail(f"no totals in {path}")


def annotate(path, inclusive, top):
    """Top rows of callgrind_annotate: (Ir, %, function, source file of the costs)."""
    r = subprocess.run(["callgrind_annotate", f"--inclusive={'yes' if inclusive else 'no'}",
                        "--threshold=100", "--auto=no", path], capture_output=True, text=True)
    rows = []
    for line in r.stdout.splitlines():
        m = re.match(r"^\s*([\d,]+)\s+\(\s*([\d.]+)%\)\s+(.*)$", line)
        if not m or "PROGRAM TOTALS" in line:
            continue
        ir, pct, rest = int(m.group(1).replace(",", "")), float(m.group(2)), m.group(3).strip()
        rest = re.sub(r"\s*\[[^\]]*\]$", "", rest)  # the object file
        file, sep, fn = rest.partition(":")
        if not sep or "::" in file or "<" in file:
            file, fn = "", rest
        # callgrind_annotate 3.19 prints the thread entry chain (block_on, start_thread, …)
        # with the whole total even as self cost; those rows are not self cost, so drop them
        if not inclusive and pct > 50.0:
            continue
        # inclusive: the thread/runtime/task-poll frames that contain everything say nothing
        if inclusive and pct >= 90.0:
            continue
        rows.append((ir, pct, fn, short_file(file)))
        if len(rows) >= top:
            break
    return rows


def by_function(path, top):
    """Self cost summed per function name (inlining splits one function over many files)."""
    rows = annotate(path, False, 10**6)
    agg = {}
    for ir, pct, fn, _f in rows:
        fn = re.sub(r"'\d+$", "", fn)
        a = agg.setdefault(fn, [0, 0.0])
        a[0] += ir
        a[1] += pct
    return sorted(((v[0], v[1], k) for k, v in agg.items()), reverse=True)[:top]


CATEGORIES = [  # first match wins, on the function name
    ("UTF-8 validation (core::str::from_utf8)", r"core::str::converts::from_utf8|core::str::validations"),
    ("malloc / free", r"^(_int_malloc|_int_free|malloc|free|cfree|realloc|calloc|malloc_consolidate|"
                      r"unlink_chunk|_int_realloc|__libc_\w+|tcache\w*)$"),
    ("memcpy / memmove / memset / memchr", r"^__mem|^__strlen|^memchr|^__memchr"),
    ("JSON (serde_json)", r"serde_json::"),
    ("HTTP parsing and framing (httparse, mcpyard::http)", r"httparse::|mcpyard::http::"),
    ("tokio runtime, timers, sync", r"tokio::"),
    ("hashing (SipHash)", r"hash"),
    ("other mcpyard code", r"mcpyard::"),
    ("everything else (std, bytes, libc, kernel entry stubs)", r"."),
]


def categories(path):
    rows = annotate(path, False, 10**6)
    out = {name: [0, 0.0] for name, _ in CATEGORIES}
    for ir, pct, fn, _f in rows:
        for name, rx in CATEGORIES:
            if re.search(rx, fn):
                out[name][0] += ir
                out[name][1] += pct
                break
    return [(v[0], v[1], k) for k, v in out.items()]


# The stages of a tools/call through server → client, each a set of functions whose
# inclusive costs do not nest in one another (a function's cost is its outermost entry's:
# inlined code gives one function several entries, the outer one holding the inner ones).
# What no stage holds (the task's poll tree of joins and selects, wake-ups, the scheduler,
# the I/O driver, timers, the clock) is the remainder: the per-request machinery.
STAGES = [
    ("agent read and HTTP parse", r"^mcpyard::http::request::RequestDecoder::decode$|"
                                  r"^mcpyard::runtime::io::Conn::received$|"
                                  r"^mcpyard::runtime::slots::Slots::(lend|give_back)$"),
    ("admission, JSON-RPC parse, session", r"^mcpyard::binding::server::Server::handle$|"
                                           r"^mcpyard::jsonrpc::envelope::parse_envelope$|"
                                           r"^mcpyard::binding::server::app::target_of$|"
                                           r"^mcpyard::binding::server::edge::(accepts|authorization)$|"
                                           r"^mcpyard::jsonrpc::params::progress_token$|"
                                           r"^mcpyard::jsonrpc::id::RequestId::key$|"
                                           r"^mcpyard::binding::server::session::(session_for|find|lookup)$|"
                                           r"^mcpyard::binding::server::session::Session::(register|unregister)$"),
    ("exit hand-off (internal stream)", r"^mcpyard::stream::pipe::|"
                                        r"^<mcpyard::binding::client::Client as mcpyard::binding::Exit>::serve$|"
                                        r"^mcpyard::binding::client::request::Exchange::relay_held"),
    ("upstream write (head, pool, socket)", r"^mcpyard::binding::client::Client::head$|"
                                            r"^mcpyard::binding::client::write_(bounded|known)|"
                                            r"^mcpyard::binding::client::pool::Pool::(take|give_back|put)"),
    ("upstream read and parse (head, body, result scan)",
     r"^mcpyard::binding::client::exchange::Response::next|"
     r"^mcpyard::jsonrpc::scan::ResultScanner::(feed|finish)$"),
    ("agent write (head, body, socket)", r"^mcpyard::binding::server::sink::Sink::"),
    ("metrics", r"^mcpyard::metrics::"),
]


def stages(path, total):
    """Ir per stage (see STAGES) and the remainder, phase totals (not per call)."""
    rows = annotate(path, True, 10**6)
    outer = {}
    for ir, _pct, fn, _f in rows:
        fn = re.sub(r"'\d+$", "", fn)
        outer[fn] = max(outer.get(fn, 0), ir)
    out, held = [], 0
    for name, rx in STAGES:
        ir = sum(v for fn, v in outer.items() if re.search(rx, fn))
        out.append((name, ir))
        held += ir
    out.append(("runtime and glue: poll tree, wake-ups, scheduler, I/O driver, timers, clock",
                total - held))
    return out


def call_count(path, fn_rx):
    """How often functions matching fn_rx were called (all callers)."""
    return sum(n for _ir, n, _fn in callers(path, fn_rx, 10**6))


def callers(path, fn_rx, top=8):
    """Who calls the functions matching fn_rx (inclusive cost of the calls, call counts)."""
    r = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--tree=caller", "--auto=no",
                        "--threshold=100", path], capture_output=True, text=True)
    agg = {}
    block = []
    for line in r.stdout.splitlines() + [""]:
        if not line.strip():
            block = []
            continue
        m = re.match(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+\*\s+(.*)$", line)
        if m:
            if re.search(fn_rx, m.group(2)):
                for ir, fn, n in block:
                    a = agg.setdefault(fn, [0, 0])
                    a[0] += ir
                    a[1] += n
            block = []
            continue
        m = re.match(r"^\s*([\d,]+)\s+\(\s*[\d.]+%\)\s+<\s+(.*?)(?:\s+\(([\d,]+)x\))?(?:\s+\[[^\]]*\])?$",
                     line)
        if m:
            rest = m.group(2)
            fn = rest.split(":", 1)[1] if ":" in rest.split(" ")[0] else rest
            block.append((int(m.group(1).replace(",", "")), fn.strip(),
                          int((m.group(3) or "0").replace(",", ""))))
    return sorted(((v[0], v[1], k) for k, v in agg.items()), reverse=True)[:top]


def short_file(f):
    f = f.replace(REPO + "/", "")
    f = re.sub(r"^.*/registry/src/[^/]+/", "", f)  # crate-x.y.z/src/...
    f = re.sub(r"^/rustc/[0-9a-f]+/library/", "std/", f)
    f = re.sub(r"^\./", "", f)
    return f


def short(name, width=110):
    return name if len(name) <= width else name[: width - 1] + "…"


def run(procs):
    a = parse()
    set_quiet(a)
    gw, lg = binaries()
    valgrind = apt_install("valgrind", ["valgrind"])
    cg_control = apt_install("callgrind_control", ["valgrind"])
    vg_version = subprocess.run([valgrind, "--version"], capture_output=True, text=True).stdout.strip()
    info = machine_info()
    for old in glob.glob(os.path.join(RAW, "callgrind.out.*")):
        os.unlink(old)
    prefix = os.path.join(RAW, "callgrind.out")
    fx = Fixture(procs, lg, "callgrind-fixture", ["--result-bytes", str(a.result_bytes)], workers=1)
    wrapper = [valgrind, "--tool=callgrind", f"--callgrind-out-file={prefix}.%p"]
    routes = [("a", fx.url), ("b", fx.url)] if a.proxy else None
    auth_yaml, tool = None, ["--tool", "a__echo"] if a.proxy else []
    if a.auth:
        _, token, auth_yaml = authkit.make(RAW)
        tool += ["--header", f"authorization: Bearer {token}"]
    g = Gateway(procs, gw, "callgrind-mcpyard", None if a.proxy else fx.url, workers=1, io="epoll",
                wrapper=wrapper, routes=routes, auth=auth_yaml)
    pid = g.pid
    prefix = f"{prefix}.{pid}"
    seen = set(glob.glob(prefix + ".*")) | {prefix}

    def send(tag, n):
        secs = n / a.rate
        return loadgen(lg, tag, g.url, rate=a.rate, connections=1, duration=f"{secs:.3f}s",
                       warmup="0s", files=False, subdir="raw",
                       extra=["--timeout", "30s", *tool], watch={"mcpyard": pid})

    log(f"warm-up: {a.warmup_requests} requests")
    send("callgrind-warmup", a.warmup_requests)
    time.sleep(0.5)

    log("idle: 2 s")
    control(cg_control, pid, "-z")
    t0 = time.time()
    time.sleep(2.0)
    idle_path, idle_ir = dump(cg_control, pid, prefix, seen)
    idle_s = time.time() - t0
    idle_rate = idle_ir / idle_s

    phases = {}
    for tag, n in (("A", a.requests // 2), ("B", a.requests)):
        m0 = g.scrape()
        log(f"phase {tag}: {n} requests")
        control(cg_control, pid, "-z")
        r = send(f"callgrind-{tag}", n)
        path, ir = dump(cg_control, pid, prefix, seen)
        m1 = g.scrape()
        calls = int(m1.get(CALLS, 0) - m0.get(CALLS, 0))
        inits = int(m1.get(INITS, 0) - m0.get(INITS, 0))
        phases[tag] = {"requested": n, "calls": calls, "initialize": inits, "ir": ir,
                       "wall_s": r["wall_s"], "path": os.path.basename(path),
                       "loadgen": {k: r[k] for k in ("throughput_rps", "unsent", "errors",
                                                     "argv", "requests_ok")},
                       "p50_us": r["response_us"]["p50"]}
    A, B = phases["A"], phases["B"]
    if B["calls"] <= A["calls"]:
        raise Fail(f"phase B served {B['calls']} calls, A {A['calls']}: cannot difference")
    per_b = B["ir"] / B["calls"]
    per_diff = (B["ir"] - A["ir"]) / (B["calls"] - A["calls"])
    idle_extra = idle_rate * (B["wall_s"] - A["wall_s"])
    per_diff_idle = (B["ir"] - A["ir"] - idle_extra) / (B["calls"] - A["calls"])
    inclusive = annotate(os.path.join(RAW, B["path"]), True, a.top)
    exclusive = annotate(os.path.join(RAW, B["path"]), False, a.top)
    grouped = by_function(os.path.join(RAW, B["path"]), a.top)
    cats = categories(os.path.join(RAW, B["path"]))
    utf8_callers = callers(os.path.join(RAW, B["path"]), r"core::str::converts::from_utf8")
    malloc_callers = callers(os.path.join(RAW, B["path"]), r"__rustc::__rust_alloc( |$)", 10)
    stage_rows = stages(os.path.join(RAW, B["path"]), B["ir"])
    allocs = call_count(os.path.join(RAW, B["path"]), r"__rustc::__rust_(alloc|alloc_zeroed|realloc)( |$)")
    exit_code = procs.stop(g.p, grace=30)
    procs.stop(fx.p)
    data = {
        "machine": info, "valgrind": vg_version, "io": "epoll", "workers": 1, "rate": a.rate,
        "proxy": a.proxy, "auth": a.auth,
        "result_bytes": a.result_bytes, "warmup_requests": a.warmup_requests,
        "idle": {"ir": idle_ir, "seconds": idle_s, "ir_per_s": idle_rate},
        "phases": phases, "ir_per_call": {
            "B_over_calls": per_b, "B_minus_A": per_diff, "B_minus_A_minus_idle": per_diff_idle},
        "inclusive_top": inclusive, "exclusive_top": exclusive, "self_by_function": grouped, "categories": cats,
        "utf8_callers": utf8_callers, "malloc_callers": malloc_callers, "exit_code": exit_code,
        "stages": stage_rows, "allocations": allocs,
    }
    write_report(NAME + ("-proxy" if a.proxy else "") + ("-auth" if a.auth else ""), report(data, a), data)


def report(d, a):
    p, ipc = d["phases"], d["ir_per_call"]
    A, B = p["A"], p["B"]
    via = ("server → proxy (routes `a`, `b`, both clients of the fixture) → client, calling "
           "`a__echo`") if d.get("proxy") else "server → client"
    L = [f"# callgrind: instructions per tools/call through mcpyard ({via})\n"]
    L.append(f"Generated by `perf/callgrind.sh` — {machine_line(d['machine'])}\n")
    L.append(
        f"{d['valgrind']}, `--tool=callgrind`, all threads together. mcpyard: **1 worker, epoll** "
        "(valgrind does not follow io_uring's shared rings, so the epoll path is the one it can "
        "measure; the uring path's user-space work is the same gateway code above a different "
        f"I/O layer). Fixture native, {d['result_bytes']} B result. Loadgen: one connection, "
        f"open loop at {d['rate']} req/s — one request in flight, a fixed count "
        "(rate × duration) — after a warm-up of "
        f"{d['warmup_requests']} requests. Counts of tools/call from mcpyard's own metrics, "
        "scraped between the phases.\n"
    )
    L.append("## Instructions per request\n")
    rows = [
        ["idle (timers only)", "–", "–", f"{d['idle']['seconds']:.2f}", fmt(d["idle"]["ir"]),
         f"{d['idle']['ir_per_s']:,.0f} Ir/s"],
    ]
    for tag in ("A", "B"):
        x = p[tag]
        rows.append([f"phase {tag}", f"{x['calls']:,}", x["initialize"], f"{x['wall_s']:.2f}",
                     fmt(x["ir"]), f"{x['ir'] / x['calls']:,.0f} Ir/call"])
    L.append(table(["phase", "tools/call", "initialize", "wall s", "instructions (Ir)", "per"], rows))
    L.append("")
    L.append(table(["method", "Ir per tools/call"], [
        ["B / calls(B) (includes one run's session setup and teardown)", f"{ipc['B_over_calls']:,.0f}"],
        ["(B − A) / (calls(B) − calls(A)) (fixed per-run costs cancel)", f"{ipc['B_minus_A']:,.0f}"],
        ["same, minus idle timer instructions over the extra wall time",
         f"**{ipc['B_minus_A_minus_idle']:,.0f}**"],
    ], ["l", "r"]))
    L.append("")
    L.append(f"At the closed-loop max of compare-hops a native tools/call costs the CPU time in "
             f"its 'target CPU µs/req' column; that includes the kernel's TCP work, which "
             f"callgrind does not count (it counts user-space instructions only).\n")
    if d.get("stages"):
        L.append("## Stages of a tools/call (inclusive, phase B)\n")
        L.append("Each stage is the outermost inclusive cost of the functions that do it "
                 "(perf/lib/callgrind.py, STAGES); their sum is subtracted from the phase's "
                 "total, and the rest is the per-request machinery between them. Session setup "
                 "and teardown of the run are in it too (a few hundred Ir per call, see the "
                 "methods above).\n")
        total = B["ir"]
        L.append(table(["stage", "Ir / call", "%"],
                       [[k, fmt(ir / B["calls"]), f"{100 * ir / total:.1f}"] for k, ir in d["stages"]],
                       ["l", "r", "r"]))
        L.append("")
        L.append(f"Heap allocations (`__rust_alloc`, `__rust_realloc`): "
                 f"**{d['allocations'] / B['calls']:.1f} per tools/call**.\n")
    L.append("## Where the instructions go (self cost by kind, phase B)\n")
    L.append(table(["kind", "Ir / call", "%"],
                   [[k, fmt(ir / B["calls"]), f"{pct:.1f}"] for ir, pct, k in d["categories"]],
                   ["l", "r", "r"]))
    L.append("")
    for title, key in (("`core::str::from_utf8` (UTF-8 validation)", "utf8_callers"),
                       ("`__rust_alloc` (every Rust heap allocation)", "malloc_callers")):
        rows = d.get(key) or []
        if rows:
            L.append(f"Callers of {title}, phase B (inclusive Ir of the calls; calls per "
                     "tools/call):\n")
            L.append(table(["Ir / call", "calls / tools/call", "caller"],
                           [[fmt(ir / B["calls"]), f"{n / B['calls']:.1f}", "`" + short(fn) + "`"]
                            for ir, n, fn in rows], ["r", "r", "l"]))
            L.append("")
    L.append(f"## Top {a.top} functions by inclusive cost (phase B)\n")
    L.append("Frames holding ≥ 90 % (thread start, `block_on`, the LocalSet tick, tokio's task "
             "poll) are left out. A name can appear twice: callgrind keys costs by "
             "(source file, function), and inlined code keeps its own source file.\n")
    L.append(table(["Ir", "Ir / call", "%", "function", "source of the costs"],
                   [[fmt(r[0]), fmt(r[0] / B["calls"]), f"{r[1]:.1f}", "`" + short(r[2]) + "`",
                     r[3]] for r in d["inclusive_top"]], ["r", "r", "r", "l", "l"]))
    L.append("")
    L.append(f"## Top {a.top} functions by self cost (phase B)\n")
    L.append(table(["Ir", "Ir / call", "%", "function", "source of the costs (inlined code shows "
                    "where it came from)"],
                   [[fmt(r[0]), fmt(r[0] / B["calls"]), f"{r[1]:.1f}", "`" + short(r[2]) + "`",
                     r[3]] for r in d["exclusive_top"]], ["r", "r", "r", "l", "l"]))
    L.append("")
    L.append(f"## Top {a.top} functions by self cost summed over their inlined pieces (phase B)\n")
    L.append(table(["Ir", "Ir / call", "%", "function"],
                   [[fmt(r[0]), fmt(r[0] / B["calls"]), f"{r[1]:.1f}", "`" + short(r[2]) + "`"]
                    for r in d["self_by_function"]], ["r", "r", "r", "l"]))
    L.append("")
    L.append(f"mcpyard exit code on SIGTERM under valgrind: {d['exit_code']}.\n")
    L.append("## Commands\n")
    L.append("```sh\nperf/callgrind.sh " + " ".join(sys.argv[1:]) + "\n```\n")
    L.append("```sh\nvalgrind --tool=callgrind --callgrind-out-file=perf/results/raw/callgrind.out.%p "
             "target/release/mcpyard --config <1 worker, epoll>\n"
             + loadgen_cmd(B["loadgen"]["argv"]) + "\ncallgrind_control -z PID / -d PID\n"
             "callgrind_annotate --inclusive=yes perf/results/raw/callgrind.out.PID.N\n```\n")
    return "\n".join(L)


if __name__ == "__main__":
    main_guard("callgrind.sh", run)
