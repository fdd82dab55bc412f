"""Shared plumbing for the perf/ comparison scripts (Python 3 standard library only).

Every process a script starts goes through `Procs`: it is started in its own process group,
and on any exit (normal end, exception, SIGINT, SIGTERM, SIGHUP) the group is sent SIGTERM,
then SIGKILL after a grace period. Nothing is killed by name; only the groups started here.
"""

import atexit
import datetime
import json
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PERF = os.path.join(REPO, "perf")
RESULTS = os.environ.get("PERF_RESULTS") or os.path.join(PERF, "results")  # override: tests
RAW = os.path.join(RESULTS, "raw")  # gitignored: logs, callgrind/perf data, temp configs
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Fail(Exception):
    """A clear, expected failure: printed without a traceback, exit status 1."""


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- processes


class Procs:
    """Owns every child process of a script; `stop_all` runs on any kind of exit."""

    current = None  # the script's instance, for helpers that start processes

    def __init__(self):
        Procs.current = self
        self.cleanups = []  # callables run after every process is stopped
        self.procs = []  # (name, Popen)
        self.exit_codes = {}
        self._stopping = False
        atexit.register(self.stop_all)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame):
        self.stop_all()
        raise SystemExit(128 + signum)

    def start(self, name, argv, stdout_path, env=None, stdin=subprocess.DEVNULL):
        out = open(stdout_path, "wb")
        p = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=stdin,
            env=env,
            start_new_session=True,  # own process group: nginx workers, valgrind go with it
        )
        out.close()
        self.procs.append((name, p))
        return p

    def stop(self, p, grace=8.0):
        """SIGTERM the process group of p, wait, SIGKILL if needed; returns p's exit code."""
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        # the group may still hold children (nginx workers) after the leader exited
        try:
            os.killpg(p.pid, 0)
            deadline = time.time() + grace
            while time.time() < deadline:
                time.sleep(0.05)
                os.killpg(p.pid, 0)
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for i, (name, q) in enumerate(self.procs):
            if q is p:
                self.exit_codes[name] = p.returncode
                del self.procs[i]
                break
        return p.returncode

    def stop_all(self):
        if self._stopping:
            return
        self._stopping = True
        for _name, p in reversed(list(self.procs)):
            self.stop(p)
        for fn in self.cleanups:
            try:
                fn()
            except OSError:
                pass
        self.cleanups = []
        self._stopping = False


def wait_for_line(path, pattern, p, timeout=15.0):
    """Waits until the file at `path` has a line matching `pattern`; returns the match."""
    rx = re.compile(pattern)
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path, "r", errors="replace") as f:
                for line in f:
                    m = rx.search(line)
                    if m:
                        return m
        except FileNotFoundError:
            pass
        if p.poll() is not None:
            break
        time.sleep(0.02)
    tail = ""
    try:
        with open(path, "r", errors="replace") as f:
            tail = f.read()[-2000:]
    except FileNotFoundError:
        pass
    raise Fail(f"no line matching /{pattern}/ in {path} (exit {p.poll()}):\n{tail}")


def free_port():
    """A loopback port free right now (for nginx, which cannot report a port-0 bind)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- tools


def binaries():
    """Paths of mcpyard and mcpyard-loadgen; builds them once if missing."""
    target = os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target")
    if not os.path.isabs(target):
        target = os.path.join(REPO, target)
    gw = os.path.join(target, "release", "mcpyard")
    lg = os.path.join(target, "release", "mcpyard-loadgen")
    if not (os.access(gw, os.X_OK) and os.access(lg, os.X_OK)):
        if not shutil.which("cargo"):
            raise Fail(f"{gw} or {lg} is missing and cargo is not installed to build them")
        log("building: nice -n 10 cargo build --release --workspace")
        subprocess.run(
            ["nice", "-n", "10", "cargo", "build", "--release", "--workspace"], cwd=REPO, check=True
        )
    return gw, lg


def apt_install(tool, packages):
    """Installs the first Debian package in `packages` that provides `tool`; fails clearly."""
    if shutil.which(tool):
        return shutil.which(tool)
    if not shutil.which("apt-get"):
        raise Fail(f"{tool} is missing and apt-get is not available: install {packages[0]}")
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    if sudo and not shutil.which("sudo"):
        raise Fail(f"{tool} is missing; not root and no sudo: install {packages[0]}")
    # Debian packages of servers start their service on install unless policy-rc.d says no;
    # we never want a system nginx left running, so forbid it for the install if not already.
    policy = "/usr/sbin/policy-rc.d"
    made_policy = False
    if not os.path.exists(policy) and os.geteuid() == 0:
        with open(policy, "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(policy, 0o755)
        made_policy = True
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        subprocess.run(sudo + ["apt-get", "update", "-qq"], env=env, check=False)
        for pkg in packages:
            log(f"installing {pkg} with apt-get for {tool}")
            r = subprocess.run(sudo + ["apt-get", "install", "-y", "-qq", pkg], env=env)
            if r.returncode == 0 and shutil.which(tool):
                return shutil.which(tool)
    finally:
        if made_policy:
            os.unlink(policy)
    raise Fail(f"{tool} is missing and could not be installed with apt-get ({', '.join(packages)})")


def raise_nofile(needed):
    """Raises RLIMIT_NOFILE as far as allowed (hard limit too, with CAP_SYS_RESOURCE) so
    children inherit it; returns (soft limit now, note or None)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return soft, None
    note = None
    if hard < needed:
        try:
            with open("/proc/sys/fs/nr_open") as f:
                nr_open = int(f.read())
        except OSError:
            nr_open = needed
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, nr_open), min(needed, nr_open)))
            return min(needed, nr_open), None
        except (ValueError, OSError):
            note = (f"RLIMIT_NOFILE hard limit is {hard} and this process may not raise it "
                    f"(no CAP_SYS_RESOURCE); wanted {needed}")
            log(note)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))
    return min(needed, hard), note


# --------------------------------------------------------------------------- targets


class Fixture:
    """The loadgen's upstream fixture; with `certs` (a `Certs`) it serves TLS."""

    def __init__(self, procs, lg, name, args, workers=1, certs=None):
        self.name = name
        self.args = ["upstream", "--listen", "127.0.0.1:0", "--workers", str(workers)] + args
        if certs:
            self.args += ["--tls-cert", certs.cert, "--tls-key", certs.key]
        out = os.path.join(RAW, f"{name}.log")
        self.p = procs.start(name, [lg] + self.args, out)
        self.addr = wait_for_line(out, r"^listening (\S+)", self.p).group(1)
        self.url = f"{'https' if certs else 'http'}://{self.addr}/mcp"
        self.pid = self.p.pid


class Gateway:
    """mcpyard with a generated config in front of `upstream_url` (None: the embedded demo).

    With `routes`, a list of (toolkit, upstream url), the server's exit is instead a `proxy`
    binding with one route per pair, in that order, each to a `client` of its url; with
    `cache` (a TTL such as "5m") too, that proxy serves its lists from a memory store."""

    def __init__(self, procs, gw, name, upstream_url, workers=1, io="uring", wrapper=None,
                 routes=None, cache=None, certs=None, auth=None):
        self.name = name
        self.workers = workers
        self.io = io
        cfg = os.path.join(RAW, f"{name}.yaml")
        self.config_text = gateway_config(upstream_url, workers, io, routes, cache, certs, auth)
        with open(cfg, "w") as f:
            f.write(self.config_text)
        self.config = cfg
        out = os.path.join(RAW, f"{name}.log")
        argv = (wrapper or []) + [gw, "--config", cfg]
        self.p = procs.start(name, argv, out)
        t = 120.0 if wrapper else 15.0
        north = wait_for_line(out, r"listening north (\S+)", self.p, t).group(1)
        metrics = wait_for_line(out, r"listening metrics (\S+)", self.p, t).group(1)
        self.url = f"{'https' if certs else 'http'}://{north}/mcp"
        self.metrics_url = f"http://{metrics}/metrics"
        self.pid = self.p.pid  # under valgrind too: valgrind runs the tool in its own process

    def scrape(self):
        return scrape(self.metrics_url)


def gateway_config(upstream_url, workers, io, routes=None, cache=None, certs=None, auth=None):
    """The YAML config `Gateway` runs mcpyard with (see there). With `certs` the server
    binding terminates TLS and an https:// upstream is trusted through `certs.ca`; `auth`
    is the server's `auth:` mapping as YAML text (`authkit.make`)."""
    text = (f"runtime: {{ workers: {workers}, io: {io} }}\n"
            "telemetry: { metrics: 127.0.0.1:0 }\n")
    if routes and cache:
        text += "stores: { cache0: { type: memory } }\n"
    north_tls = f", tls: {{ cert: {certs.cert}, key: {certs.key} }}" if certs else ""
    if auth:
        north_tls += f", {auth}"
    up_tls = (f", tls: {{ ca: {certs.ca} }}"
              if certs and upstream_url and upstream_url.startswith("https://") else "")
    text += ("bindings:\n"
             f"  north: {{ kind: server, listen: 127.0.0.1:0, path: /mcp, exit: up{north_tls} }}\n")
    if routes:
        text += "  up:\n    kind: proxy\n"
        if cache:
            text += f"    cache: {{ store: cache0, ttl: {cache} }}\n"
        text += "    routes:\n"
        text += "".join(f"      - {{ toolkit: {t}, exit: up_{t} }}\n" for t, _ in routes)
        text += "".join(f'  up_{t}: {{ kind: client, server: "{u}" }}\n' for t, u in routes)
    elif upstream_url:
        text += f'  up: {{ kind: client, server: "{upstream_url}"{up_tls} }}\n'
    else:
        text += "  up: { kind: demo }\n"
    return text


class Nginx:
    """nginx as a plain keep-alive reverse proxy, foreground, temp prefix."""

    def __init__(self, procs, nginx_bin, name, upstream_addr, workers=1, certs=None):
        self.name = name
        self.workers = workers
        prefix = tempfile.mkdtemp(prefix=f"mcpyard-perf-{name}-")
        self.prefix = prefix
        procs.cleanups.append(lambda: shutil.rmtree(prefix, ignore_errors=True))
        for attempt in range(5):
            port = free_port()
            conf = os.path.join(prefix, "nginx.conf")
            with open(conf, "w") as f:
                f.write(nginx_conf(prefix, port, upstream_addr, workers, certs))
            out = os.path.join(RAW, f"{name}.log")
            self.p = procs.start(
                name, [nginx_bin, "-p", prefix, "-c", conf, "-e", os.path.join(prefix, "error.log")],
                out,
            )
            if wait_port(port, self.p):
                break
            procs.stop(self.p)
        else:
            raise Fail(f"nginx did not start; see {prefix}/error.log")
        self.url = f"{'https' if certs else 'http'}://127.0.0.1:{port}/mcp"
        self.pid = self.p.pid
        self.conf_text = nginx_conf("<tmp>", "<port>", "<fixture>", workers, certs and Certs.shown())


def nginx_head(prefix, workers):
    """The start of every generated nginx.conf, up to inside `http {`: foreground, files in
    `prefix`, no access log."""
    return f"""worker_processes {workers};
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
"""


def nginx_conf(prefix, port, upstream_addr, workers, certs=None):
    """A keep-alive reverse proxy; with `certs`, `listen ssl` and TLS to the upstream too
    (verified against certs.ca as `localhost`, sessions reused, connections kept alive)."""
    if certs:
        listen = f"listen 127.0.0.1:{port} ssl;"
        server_tls = f"""
        ssl_certificate {certs.cert};
        ssl_certificate_key {certs.key};
        ssl_session_cache shared:SSL:10m;
        ssl_session_tickets on;"""
        scheme = "https"
        proxy_tls = f"""
            proxy_ssl_trusted_certificate {certs.ca};
            proxy_ssl_verify on;
            proxy_ssl_name localhost;
            proxy_ssl_session_reuse on;"""
    else:
        listen, server_tls, scheme, proxy_tls = f"listen 127.0.0.1:{port};", "", "http", ""
    return nginx_head(prefix, workers) + f"""    upstream fixture {{ server {upstream_addr}; keepalive 64; }}
    server {{
        {listen}{server_tls}
        location / {{
            proxy_pass {scheme}://fixture;{proxy_tls}
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


class Certs:
    """A CA and a server certificate (ECDSA P-256, SAN localhost and 127.0.0.1) made with the
    openssl CLI in `directory`; the same files serve every TLS hop."""

    CURVE = "prime256v1"
    DAYS = "2"

    def __init__(self, directory):
        openssl = shutil.which("openssl")
        if not openssl:
            raise Fail("openssl (the CLI) is needed to make the test certificates")
        os.makedirs(directory, exist_ok=True)
        self.ca = os.path.join(directory, "ca.pem")
        self.cert = os.path.join(directory, "cert.pem")
        self.key = os.path.join(directory, "key.pem")
        ca_key = os.path.join(directory, "ca-key.pem")
        csr = os.path.join(directory, "cert.csr")
        ext = os.path.join(directory, "cert.ext")
        with open(ext, "w") as f:
            f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n"
                    "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\n"
                    "extendedKeyUsage=serverAuth\n")
        ec = ["-newkey", "ec", "-pkeyopt", f"ec_paramgen_curve:{self.CURVE}", "-nodes"]
        steps = [
            [openssl, "req", "-x509", *ec, "-keyout", ca_key, "-out", self.ca, "-days", self.DAYS,
             "-subj", "/CN=mcpyard perf CA"],
            [openssl, "req", *ec, "-keyout", self.key, "-out", csr, "-subj", "/CN=localhost"],
            [openssl, "x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", ca_key,
             "-CAcreateserial", "-out", self.cert, "-days", self.DAYS, "-extfile", ext],
        ]
        for argv in steps:
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode != 0:
                raise Fail(f"openssl failed: {' '.join(argv)}\n{r.stderr[-1500:]}")
        self.describe = (f"ECDSA {self.CURVE} CA and server certificate (SAN localhost, "
                         "127.0.0.1), made with the openssl CLI at run time")

    @staticmethod
    def shown():
        """Placeholders for printing a config."""
        c = Certs.__new__(Certs)
        c.ca, c.cert, c.key = "<tmp>/ca.pem", "<tmp>/cert.pem", "<tmp>/key.pem"
        return c


def wait_port(port, p, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if p.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    return False


# --------------------------------------------------------------------------- metrics


def scrape(url, timeout=30.0):
    """Prometheus text → {name{labels}: float}."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, val = line.rpartition(" ")
        key = key.replace("{}", "")
        try:
            out[key] = float(val)
        except ValueError:
            pass
    return out


class Sampler(threading.Thread):
    """Scrapes a metrics endpoint every `interval` s and keeps chosen gauges."""

    def __init__(self, url, keys, interval=0.05):
        super().__init__(daemon=True)
        self.url, self.keys, self.interval = url, keys, interval
        self.samples = {k: [] for k in keys}
        self.stop_ev = threading.Event()

    def run(self):
        while not self.stop_ev.is_set():
            try:
                m = scrape(self.url, timeout=2.0)
                for k in self.keys:
                    if k in m:
                        self.samples[k].append(m[k])
            except OSError:
                pass
            self.stop_ev.wait(self.interval)

    def finish(self):
        self.stop_ev.set()
        self.join(5)
        return self.samples


# --------------------------------------------------------------------------- cpu accounting


def proc_stats():
    """(pid, the fields of /proc/<pid>/stat after the command name) of every live process;
    in those fields, [2] is the process group, [11] and [12] utime and stime."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        yield int(d), s[s.rfind(")") + 2 :].split()


def group_pids(pgid):
    """Every live process of process group `pgid` (nginx: the master and its worker)."""
    return sorted(pid for pid, rest in proc_stats() if int(rest[2]) == pgid)


def pgroup_ticks(pgids):
    """(utime, stime) ticks of every live process whose process group is in `pgids`."""
    total = {g: (0, 0) for g in pgids}
    for _pid, rest in proc_stats():
        pgrp = int(rest[2])
        if pgrp in total:
            u, k = total[pgrp]
            total[pgrp] = (u + int(rest[11]), k + int(rest[12]))
    return total


def system_ticks():
    """(all, idle, stolen) ticks of every core so far. Stolen: time the hypervisor ran
    something else while this machine had work (it counts as busy here, not as idle)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]
    return sum(v[:8]), idle, v[7]


QUIET = {"max_wait_s": 30.0, "busy_pct": 20.0, "waited_total_s": 0.0}


def machine_busy_pct(interval=0.5):
    a = system_ticks()
    time.sleep(interval)
    b = system_ticks()
    total = b[0] - a[0]
    return 100.0 * ((b[0] - a[0]) - (b[1] - a[1])) / total if total else 0.0


def wait_quiet():
    """Waits (up to QUIET['max_wait_s']) until the machine is quieter than QUIET['busy_pct'] %.

    Between runs nothing started here does work, so busy time then is other people's
    (builds, tests). Returns (busy % seen last, seconds waited)."""
    t0 = time.time()
    busy = machine_busy_pct()
    announced = False
    while busy > QUIET["busy_pct"] and time.time() - t0 < QUIET["max_wait_s"]:
        if not announced:
            log(f"machine {busy:.0f} % busy with other work; waiting up to {QUIET['max_wait_s']:.0f} s")
            announced = True
        time.sleep(0.5)
        busy = machine_busy_pct()
    QUIET["waited_total_s"] += time.time() - t0
    return busy, time.time() - t0


def add_quiet_args(ap):
    ap.add_argument("--quiet-wait", type=float, default=QUIET["max_wait_s"],
                    help="before each run, wait up to this many seconds for the machine to be "
                         f"below --quiet-busy %% busy (default {QUIET['max_wait_s']:.0f})")
    ap.add_argument("--quiet-busy", type=float, default=QUIET["busy_pct"],
                    help=f"busy %% of both cores counted as quiet (default {QUIET['busy_pct']:.0f})")


def set_quiet(a):
    QUIET["max_wait_s"] = a.quiet_wait
    QUIET["busy_pct"] = a.quiet_busy


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise Fail(f"no VmRSS for pid {pid}")


def status_field(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    return None


def fd_count(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


# --------------------------------------------------------------------------- loadgen


def loadgen(lg, tag, url, scenario="tools-call", rate=None, connections=8, duration="5s",
            warmup="1s", extra=(), watch=None, files=True, subdir=""):
    """Runs one loadgen `run`; returns its parsed JSON plus CPU accounting of `watch`.

    `watch` is {label: pgid}: the CPU time those process groups spent during the run is
    returned as cpu_us[label]; `cpu_us["loadgen"]` is the generator's own (its rusage), and
    `foreign_busy_pct` is the machine's busy time not spent by anything watched, in % of
    all cores (other builders on the shared machine show up there).
    """
    outdir = os.path.join(RESULTS, subdir) if subdir else RESULTS
    os.makedirs(outdir, exist_ok=True)
    jpath = os.path.join(outdir, f"{tag}.json")
    argv = [lg, "run", "--url", url, "--scenario", scenario, "--json", jpath]
    if scenario not in ("idle-sessions", "fanout"):
        argv += ["--connections", str(connections), "--warmup", str(warmup)]
        argv += ["--rate", str(rate)] if rate else ["--mode", "closed"]
    if duration is not None:
        argv += ["--duration", str(duration)]
    if files:
        argv += ["--hgrm", os.path.join(outdir, f"{tag}.hgrm"), "--svg", os.path.join(outdir, f"{tag}.svg")]
    argv += list(extra)
    watch = watch or {}
    busy_before, waited = wait_quiet()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = pgroup_ticks(list(watch.values()))
    s0 = system_ticks()
    w0 = time.time()
    base = os.path.basename(subdir) if subdir else ""
    logpath = os.path.join(RAW, f"{base + '-' if base else ''}{tag}.loadgen.log")
    p = Procs.current.start(f"loadgen {tag}", argv, logpath)
    try:
        p.wait(timeout=900)
    except subprocess.TimeoutExpired:
        raise Fail(f"loadgen {tag} still running after 900 s: {' '.join(argv)}")
    Procs.current.stop(p)
    r = p
    wall = time.time() - w0
    s1 = system_ticks()
    t1 = pgroup_ticks(list(watch.values()))
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0 or not os.path.exists(jpath):
        with open(logpath, errors="replace") as f:
            tail = f.read()[-3000:]
        raise Fail(f"loadgen {tag} exited {r.returncode}: {' '.join(argv)}\n{tail}")
    with open(jpath) as f:
        res = json.load(f)
    res["argv"] = argv
    cpu = {k: (sum(t1[g]) - sum(t0[g])) * 1e6 / CLK_TCK for k, g in watch.items()}
    # The same split into user space and kernel (system calls, TCP, wake-ups).
    res["cpu_split_us"] = {
        k: {"user": (t1[g][0] - t0[g][0]) * 1e6 / CLK_TCK,
            "sys": (t1[g][1] - t0[g][1]) * 1e6 / CLK_TCK}
        for k, g in watch.items()
    }
    res["cpu_split_us"]["loadgen"] = {"user": (ru1.ru_utime - ru0.ru_utime) * 1e6,
                                      "sys": (ru1.ru_stime - ru0.ru_stime) * 1e6}
    cpu["loadgen"] = sum(res["cpu_split_us"]["loadgen"].values())
    res["cpu_us"] = cpu
    busy = (s1[0] - s0[0]) - (s1[1] - s0[1])
    total = s1[0] - s0[0]
    ours = sum(cpu.values()) * CLK_TCK / 1e6
    res["machine_busy_pct"] = 100.0 * busy / total if total else 0.0
    res["foreign_busy_pct"] = max(0.0, 100.0 * (busy - ours) / total) if total else 0.0
    # Of it, time the hypervisor gave to other machines: a run with much of it measured a
    # slower machine, whatever the target did.
    res["steal_pct"] = 100.0 * (s1[2] - s0[2]) / total if total else 0.0
    res["wall_s"] = wall
    res["busy_before_pct"] = busy_before
    res["quiet_waited_s"] = waited
    return res


def loadgen_cmd(argv):
    """The loadgen command line with the run-time addresses and paths shortened."""
    out = []
    for a in argv:
        a = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", a)
        if a.startswith(REPO + "/"):
            a = os.path.relpath(a, REPO)
        out.append(a)
    return " ".join(out)


# --------------------------------------------------------------------------- report helpers


def machine_info():
    def cmd(argv):
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        # the last commit that changed what is measured (perf/ commits change nothing there)
        "commit": cmd(["git", "-C", REPO, "log", "-1", "--format=%h", "--", "src", "loadgen",
                       "Cargo.toml", "Cargo.lock"]),
        "dirty": bool(cmd(["git", "-C", REPO, "status", "--porcelain", "--", "src", "loadgen"])),
        "kernel": platform.release(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_start": load,
        "t0": time.time(),
        "quiet": QUIET,
    }


def machine_line(info, waited_s=None):
    """One line on where and how a report was made; `info` from machine_info()."""
    dirty = " (src/loadgen modified)" if info.get("dirty") else ""
    if waited_s is None:
        waited_s = QUIET["waited_total_s"]
    elapsed = info.get("elapsed_s")
    if elapsed is None and "t0" in info and not info.get("rerendered"):
        elapsed = time.time() - info["t0"]
        info["elapsed_s"] = elapsed
    quiet = info.get("quiet", QUIET)
    return (
        f"{info['date_utc']}, mcpyard at commit {info['commit']}{dirty}, Linux {info['kernel']}, "
        f"{info['cores']} cores ({info['cpu']}), load average at start {info['loadavg_start']}; "
        "every process (generator, fixture, proxies) shares the same cores, nothing pinned. "
        f"Before each run the harness waited (up to {quiet['max_wait_s']:.0f} s) for the machine "
        f"to be under {quiet['busy_pct']:.0f} % busy, since other builds share it. "
        + (f"The script took {elapsed:.0f} s, {waited_s:.0f} s of it waiting for the machine "
           "to be quiet." if elapsed is not None else "")
    )


def table(headers, rows, align=None):
    align = align or ["l"] + ["r"] * (len(headers) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(sep) + " |"]
    for r in rows:
        lines.append("| " + " | ".join(str(c) for c in r) + " |")
    return "\n".join(lines)


def fmt(v, nd=0):
    if v is None:
        return "–"
    if isinstance(v, float) and nd == 0:
        return f"{v:,.0f}"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def write_report(name, md, data):
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as f:
        f.write(md)
    with open(os.path.join(RESULTS, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
    where = os.path.relpath(RESULTS, REPO) if RESULTS.startswith(REPO) else RESULTS
    log(f"wrote {where}/{name}.md and {where}/{name}.json")


def main_guard(script, fn):
    """Runs fn(procs) with cleanup; turns Fail into a one-line message and exit 1."""
    os.makedirs(RAW, exist_ok=True)
    procs = Procs()
    try:
        fn(procs)
    except Fail as e:
        procs.stop_all()
        print(f"{script}: {e}", file=sys.stderr)
        sys.exit(1)
    finally:
        procs.stop_all()


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else (xs[m - 1] + xs[m]) / 2


# The latency histograms of a loadgen `--json` report; their full percentile steps stay in
# raw/, the committed summaries keep the quantiles only.
HISTOGRAM_KEYS = ("response_us", "service_us", "response_with_errors_us")


def drop_percentiles(run):
    """Removes the percentile steps of every latency histogram of one loadgen report."""
    for k in HISTOGRAM_KEYS:
        (run.get(k) or {}).pop("percentiles", None)


def summarize(rs):
    """Median over rounds of every figure (each percentile on its own), plus the spread."""
    out = {"rounds": rs}
    for key in ("response_us", "service_us"):
        out[key] = {q: median([r[key][q] for r in rs]) for q in ("p50", "p90", "p99", "p99_9", "max")}
        out[key]["p99_min"] = min(r[key]["p99"] for r in rs)
        out[key]["p99_max"] = max(r[key]["p99"] for r in rs)
    out["throughput_rps"] = median([r["throughput_rps"] for r in rs])
    out["throughput_min"] = min(r["throughput_rps"] for r in rs)
    out["throughput_max"] = max(r["throughput_rps"] for r in rs)
    out["cpu_us_per_req"] = {k: median([r["cpu_us_per_req"].get(k) for r in rs])
                             for k in rs[0]["cpu_us_per_req"]}
    out["foreign_busy_pct"] = max(r["foreign_busy_pct"] for r in rs)
    out["steal_pct"] = max(r.get("steal_pct", 0.0) for r in rs)
    out["machine_busy_pct"] = median([r.get("machine_busy_pct") for r in rs])
    out["errors"] = {k: sum(r["errors"][k] for r in rs) for k in rs[0]["errors"]}
    out["unsent"] = sum(r["unsent"] for r in rs)
    out["argv"] = rs[-1]["argv"]
    return out


def rerender(name, report, adapt=None):
    """--report-only: rewrites perf/results/<name>.md from <name>.json with `report` (no
    measuring); `adapt` first turns what JSON changed back (e.g. integer keys). Returns the
    data."""
    with open(os.path.join(RESULTS, f"{name}.json")) as f:
        d = json.load(f)
    d["machine"]["rerendered"] = True
    if adapt:
        adapt(d)
    with open(os.path.join(RESULTS, f"{name}.md"), "w") as f:
        f.write(report(d))
    log(f"rewrote perf/results/{name}.md from perf/results/{name}.json")
    return d


def errs(r):
    """`errors/unsent` of a loadgen result, for the report tables."""
    return f"{sum(r['errors'].values())}/{r['unsent']}"
