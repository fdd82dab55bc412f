"""compare-hops, phase `tls` (`perf/compare-hops.sh --phases tls`): the same tools/call
(1 KiB result) with TLS on every hop.

Targets: `direct` (generator -> TLS fixture), mcpyard (1 worker, io_uring and epoll)
`server(tls) -> client(https)` to the fixture, nginx (1 worker) `listen ssl` +
`proxy_pass https://` with upstream keepalive and `proxy_ssl_session_reuse on`. One set of
certificates (made here with the openssl CLI) on every hop; keep-alive everywhere.

1. Max throughput, closed loop, keep-alive connections.
2. Latency at 50 % of mcpyard-uring's max, open loop; added = target - direct.
3. Handshake cost: a new generator connection per request (`--new-connection`), closed
   loop, TLS resumption off (a full handshake each) and on (tickets); the hop behind the
   target keeps its pooled TLS connections. CPU per handshake = CPU µs/req there minus
   CPU µs/req of phase 1.

Writes perf/results/compare-tls.{md,json}; every run's loadgen files stay in
perf/results/raw/compare-tls/.
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perfkit import drop_percentiles as perfkit_drop_percentiles  # noqa: E402
from perfkit import rerender as perfkit_rerender  # noqa: E402
from perfkit import errs  # noqa: E402,F401
from perfkit import (  # noqa: E402
    RAW, RESULTS, Certs, Fixture, Gateway, Nginx, apt_install, binaries, fmt, loadgen,
    loadgen_cmd, log, machine_info, machine_line, median, nginx_conf, summarize, table, write_report,
)

NAME = "compare-tls"
RAW_SUB = "raw/" + NAME
BASE = "mcpyard-w1-uring"
NGINX = "nginx-w1"
ORDER = ["direct", "mcpyard-w1-uring", "mcpyard-w1-epoll", "nginx-w1"]
FRACTION = 0.50
RESUMPTION = ("off", "on")


def run_tls(procs, a):
    gw, lg = binaries()
    nginx_bin = apt_install("nginx", ["nginx-light", "nginx"])
    nginx_version = subprocess.run([nginx_bin, "-v"], capture_output=True, text=True).stderr.strip()
    openssl_version = subprocess.run(["openssl", "version"], capture_output=True, text=True).stdout.strip()
    info = machine_info()
    os.makedirs(os.path.join(RESULTS, RAW_SUB), exist_ok=True)
    certs = Certs(os.path.join(RAW, "compare-tls-certs"))

    fx = Fixture(procs, lg, "tls-fixture", ["--result-bytes", str(a.result_bytes)], workers=1,
                 certs=certs)
    targets = {"direct": (fx.url, None)}
    gws = {}
    for io in ("uring", "epoll"):
        name = f"mcpyard-w1-{io}"
        g = Gateway(procs, gw, f"tls-{name}", fx.url, workers=1, io=io, certs=certs)
        gws[name] = g
        targets[name] = (g.url, g.pid)
    n = Nginx(procs, nginx_bin, f"tls-{NGINX}", fx.addr, workers=1, certs=certs)
    targets[NGINX] = (n.url, n.pid)
    log(f"TLS fixture {fx.addr}; targets: " + ", ".join(f"{k} {v[0]}" for k, v in targets.items()))
    tls_args = ["--tls-ca", certs.ca]

    def one(tag, name, rate, duration, extra=()):
        url, pid = targets[name]
        watch = {"fixture": fx.pid}
        if pid:
            watch["target"] = pid
        for attempt in range(2):
            log(f"{tag}: {name} {'rate ' + str(rate) if rate else 'closed loop'} {' '.join(extra)}")
            r = loadgen(lg, f"{tag}-{name}", url, rate=rate, connections=a.connections,
                        duration=duration, warmup=a.warmup, watch=watch, subdir=RAW_SUB,
                        extra=tls_args + list(extra))
            total = r["requests_ok"] + sum(r["errors"].values())
            r["cpu_us_per_req"] = {k: (v / total if total else None) for k, v in r["cpu_us"].items()}
            for k, split in r["cpu_split_us"].items():
                for part, v in split.items():
                    r["cpu_us_per_req"][f"{k}_{part}"] = v / total if total else None
            r["attempt"] = attempt + 1
            if r["foreign_busy_pct"] <= a.retry_foreign:
                break
            log(f"{tag}: {name}: {r['foreign_busy_pct']:.0f} % foreign load; running it again")
        return r

    def rounds(tag, rate, duration, extra=(), n_rounds=None):
        runs = {name: [] for name in targets}
        for k in range(n_rounds or a.rounds):
            for name in targets:
                runs[name].append(one(f"{tag}-{k + 1}", name, rate, duration, extra))
        return {name: summarize(rs) for name, rs in runs.items()}

    maxes = rounds("tls-max", None, a.max_duration)
    base = maxes[BASE]["throughput_rps"]
    rate = max(100, int(round(base * FRACTION / 10.0)) * 10)
    log(f"{BASE} TLS max {base:.0f} req/s (median of {a.rounds}) → rate {rate}")
    at50 = rounds("tls-r50", rate, a.rate_duration)
    handshake = {}
    for res in RESUMPTION:
        handshake[res] = rounds(f"tls-newconn-resume-{res}", None, a.max_duration,
                                ["--new-connection", "--tls-resumption", res],
                                a.handshake_rounds)

    metrics = {}
    for name, g in gws.items():
        try:
            m = g.scrape()
            metrics[name] = {k: v for k, v in m.items() if k.startswith("mcpyard_tls_")}
        except OSError as e:
            metrics[name] = {"error": str(e)}
    exits = {name: procs.stop(g.p) for name, g in gws.items()}
    exits[NGINX] = procs.stop(n.p)
    exits["fixture"] = procs.stop(fx.p)

    data = {
        "machine": info, "nginx_version": nginx_version, "openssl_version": openssl_version,
        "certs": certs.describe, "connections": a.connections, "max_duration": a.max_duration,
        "rate_duration": a.rate_duration, "warmup": a.warmup, "rounds": a.rounds,
        "handshake_rounds": a.handshake_rounds or a.rounds, "retry_foreign": a.retry_foreign,
        "result_bytes": a.result_bytes, "fixture_args": fx.args, "base": BASE,
        "base_max_rps": base, "rate": rate, "max": maxes, "at50": at50,
        "handshake": handshake, "tls_metrics": metrics, "exit_codes": exits,
        "gateway_config": gws[BASE].config_text.replace(certs.ca, "<tmp>/ca.pem")
        .replace(certs.cert, "<tmp>/cert.pem").replace(certs.key, "<tmp>/key.pem"),
        "argv": sys.argv[1:],
    }
    write_report(NAME, report(data), strip(data))


def strip(data):
    import copy

    d = copy.deepcopy(data)
    groups = [d["max"], d["at50"]] + list(d["handshake"].values())
    for g in groups:
        for s in g.values():
            for r in s["rounds"]:
                perfkit_drop_percentiles(r)
    return d


def rerender():
    """--report-only: rewrites compare-tls.md from compare-tls.json (no measuring)."""
    return perfkit_rerender(NAME, report)


def ratio(m, n):
    if m is None or n is None or n <= 0:
        return "n/a"
    return f"{m / n:.2f}"


def report(d):
    names = [n for n in ORDER if n in d["max"]]
    hops = [n for n in names if n != "direct"]
    L = ["# compare-tls: tools/call with TLS on every hop, direct vs mcpyard vs nginx\n"]
    runs = [x for g in [d["max"], d["at50"]] + list(d["handshake"].values())
            for s in g.values() for x in s["rounds"]]
    waited = sum(x.get("quiet_waited_s", 0) for x in runs)
    L.append(f"Generated by `perf/compare-hops.sh --phases tls` — {machine_line(d['machine'], waited)}\n")
    L.append(
        f"Fixture: `mcpyard-loadgen {loadgen_cmd(d['fixture_args'])}` (TLS, {d['result_bytes']} B "
        f"result, one worker). Certificates: {d['certs']}; the same files on every hop. "
        "mcpyard: 1 worker, io_uring or epoll, `server` with `tls: {cert, key}` → `client` to "
        f"`https://` the fixture with `tls: {{ca}}` (config below). {d['nginx_version']} "
        f"({d['openssl_version']} CLI on the machine), 1 worker: `listen ssl`, `proxy_pass "
        "https://` with `keepalive 64`, `proxy_ssl_session_reuse on`, upstream verified "
        "against the same CA. The generator (rustls, ring) trusts the CA with `--tls-ca` and "
        "connects to https://127.0.0.1:PORT (an IP: verified, no SNI). TLS versions and "
        "cipher suites are not pinned: every hop negotiates TLS 1.3 with its defaults. "
        f"Every run: {d['connections']} connections, {d['warmup']} warm-up not recorded; closed "
        f"loop {d['max_duration']}, open loop {d['rate_duration']}. {d['rounds']} rounds per "
        f"target round-robin (handshake rows: {d['handshake_rounds']}), medians; a run with "
        f"more than {d['retry_foreign']:.0f} % foreign load was run once more. CPU µs/req: "
        "utime+stime of the process group from /proc over the run, divided by the requests.\n")

    L.append("## 1. Max throughput, keep-alive (closed loop)\n")
    rows = []
    for n in names:
        r = d["max"][n]
        c = r["cpu_us_per_req"]
        rows.append([n, fmt(r["throughput_rps"]),
                     f"{fmt(r['throughput_min'])}–{fmt(r['throughput_max'])}",
                     int(round(r["response_us"]["p50"])), int(round(r["response_us"]["p99"])),
                     fmt(c.get("target"), 1), fmt(c.get("target_user"), 1),
                     fmt(c.get("target_sys"), 1), fmt(c.get("fixture"), 1),
                     fmt(c.get("loadgen"), 1), fmt(r["foreign_busy_pct"], 1),
                     sum(r["errors"].values())])
    L.append(table(["target", "req/s", "range", "p50", "p99", "target CPU µs/req", "of it user",
                    "of it kernel", "fixture CPU µs/req", "loadgen CPU µs/req", "foreign %",
                    "errors"], rows))
    L.append("")

    L.append(f"## 2. Latency at 50 % of {BASE}'s max — {d['rate']} req/s (open loop, µs)\n")
    rows = []
    dr = d["at50"]["direct"]["response_us"]
    for n in names:
        r = d["at50"][n]
        h = r["response_us"]
        add = ("–", "–") if n == "direct" else (int(round(h["p50"] - dr["p50"])),
                                                 int(round(h["p99"] - dr["p99"])))
        rows.append([n, fmt(r["throughput_rps"]), int(round(h["p50"])), int(round(h["p90"])),
                     int(round(h["p99"])), f"{int(h['p99_min'])}–{int(h['p99_max'])}",
                     add[0], add[1], fmt(r["cpu_us_per_req"].get("target"), 1),
                     fmt(r["machine_busy_pct"]), fmt(r["foreign_busy_pct"], 1),
                     f"{sum(r['errors'].values())}/{r['unsent']}"])
    L.append(table(["target", "achieved req/s", "p50", "p90", "p99", "p99 range",
                    "added p50", "added p99", "target CPU µs/req", "machine busy %",
                    "foreign %", "errors/unsent"], rows))
    L.append("")

    L.append("## 3. Handshake cost: a new connection per request (closed loop)\n")
    L.append("Every request opens a TCP connection and a TLS session to the target, sends one "
             "tools/call and closes (close_notify, then FIN); the hop behind the target keeps "
             "its pooled keep-alive TLS connections to the fixture. 'resumption off': a full "
             "handshake each time (ECDHE + certificate + signature); 'on': the generator "
             "offers the ticket of an earlier connection (TLS 1.3 PSK-DHE resumption). "
             "'CPU per handshake' = target CPU µs/req here − target CPU µs/req of §1 "
             "(keep-alive), and likewise for the generator.\n")
    for res in RESUMPTION:
        hs = d["handshake"][res]
        L.append(f"### resumption {res}\n")
        rows = []
        for n in names:
            r = hs[n]
            c = r["cpu_us_per_req"]
            k = d["max"][n]["cpu_us_per_req"]
            extra = (None if c.get("target") is None or k.get("target") is None
                     else c["target"] - k["target"])
            extra_lg = (None if c.get("loadgen") is None or k.get("loadgen") is None
                        else c["loadgen"] - k["loadgen"])
            rows.append([n, fmt(r["throughput_rps"]),
                         f"{fmt(r['throughput_min'])}–{fmt(r['throughput_max'])}",
                         int(round(r["response_us"]["p50"])), int(round(r["response_us"]["p99"])),
                         fmt(c.get("target"), 1), fmt(c.get("target_user"), 1),
                         fmt(c.get("target_sys"), 1), fmt(extra, 1),
                         fmt(c.get("fixture"), 1), fmt(c.get("loadgen"), 1), fmt(extra_lg, 1),
                         fmt(r["foreign_busy_pct"], 1), sum(r["errors"].values())])
        L.append(table(["target", "conn/s", "range", "p50", "p99", "target CPU µs/req",
                        "of it user", "of it kernel", "CPU per handshake (target)",
                        "fixture CPU µs/req", "loadgen CPU µs/req",
                        "CPU per handshake (loadgen)", "foreign %", "errors"], rows))
        L.append("")

    L.append("## 4. Targets (issue 14)\n")
    tm, tn = d["max"][BASE]["throughput_rps"], d["max"][NGINX]["throughput_rps"]
    te = d["max"]["mcpyard-w1-epoll"]["throughput_rps"]
    ad = {n: d["at50"][n]["response_us"]["p50"] - dr["p50"] for n in hops}
    rows = [
        ["max throughput ≥ 1.0× nginx (uring)", f"{tm:,.0f} vs {tn:,.0f} req/s", f"{tm / tn:.2f}",
         "reached" if tm >= tn else "**missed**"],
        ["same, epoll", f"{te:,.0f} vs {tn:,.0f} req/s", f"{te / tn:.2f}",
         "reached" if te >= tn else "**missed**"],
        ["added p50 at 50 % ≤ 1.0× nginx's (uring)", f"{ad[BASE]:.0f} vs {ad[NGINX]:.0f} µs",
         ratio(ad[BASE], ad[NGINX]), "reached" if ad[BASE] <= ad[NGINX] else "**missed**"],
        ["same, epoll", f"{ad['mcpyard-w1-epoll']:.0f} vs {ad[NGINX]:.0f} µs",
         ratio(ad["mcpyard-w1-epoll"], ad[NGINX]),
         "reached" if ad["mcpyard-w1-epoll"] <= ad[NGINX] else "**missed**"],
    ]
    L.append(table(["target", "measured", "ratio mcpyard/nginx", "verdict"], rows,
                   ["l", "l", "r", "l"]))
    L.append("")

    L.append("## mcpyard's TLS metrics at the end of the run\n")
    for name, m in d.get("tls_metrics", {}).items():
        shown = ({k: v for k, v in m.items() if k.startswith("mcpyard_tls_handshakes_total")
                  or 'side="server",quantile="0.5"' in k or 'side="server",quantile="0.99"' in k}
                 if isinstance(m, dict) else m)
        L.append(f"- {name}: " + ", ".join(f"`{k}` {v:g}" if isinstance(v, float) else f"{k} {v}"
                                           for k, v in sorted(shown.items())))
    L.append("")
    L.append("## Exit codes on SIGTERM\n")
    L.append(", ".join(f"{k} {v}" for k, v in d["exit_codes"].items()) + "\n")
    L.append("## mcpyard config (1 worker, uring; epoll differs only in `io`)\n")
    L.append("```yaml\n" + d["gateway_config"] + "```\n")
    L.append("## nginx.conf\n")
    L.append("```nginx\n" + nginx_conf("<tmp>", "<port>", "<fixture>", 1, Certs.shown()) + "```\n")
    L.append("## Commands\n")
    L.append("```sh\nperf/compare-hops.sh " + " ".join(d["argv"]) + "\n```\n")
    ex = [d["max"][BASE]["argv"], d["at50"][BASE]["argv"], d["handshake"]["off"][BASE]["argv"]]
    L.append("Loadgen command lines (addresses and temp paths chosen at run time):\n")
    L.append("```sh\n" + "\n".join(loadgen_cmd(x) for x in ex) + "\n```\n")
    L.append(f"Every run's loadgen JSON, .hgrm and .svg: `perf/results/{RAW_SUB}/` (not committed).\n")
    return "\n".join(L)
