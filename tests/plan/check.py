"""The house plan, checked: every `use` between mcpyard's modules points down the layers,
and no two modules import each other, directly or round a circle.

Reads src/ (standard library only). A module is a file (`a/b.rs`) or a directory's
`mod.rs`; a `use` (or a path in code) naming `crate::…`, `super::…` or `self::…` is an arrow
from the file to the deepest module it names. A child's arrows to its own parent are part
of the parent (a module and its children are one room), and test code (`#[cfg(test)] mod
tests`, `*_tests.rs`, `tests.rs`) is left out: tests may reach anywhere.

Layers, top to bottom (a module may import its own layer's modules and lower ones):
  main, lib, gateway, fuzzing, testing
  binding (server, proxy, client, demo, and their shared files)
  store
  stream, jsonrpc, http, sse
  runtime
  config, certs, limits, metrics, log, and the small helpers beside all
and, within the bindings, no binding imports another (server, proxy, client, demo talk
through internal streams; what they share lives in binding/*.rs).

Exit status 1 with one line per broken rule.
"""

import collections
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")

LAYERS = [
    {"main", "lib", "gateway", "fuzzing", "testing"},
    {"binding"},
    {"store"},
    {"stream", "jsonrpc", "http", "sse"},
    {"runtime"},
]

# Arrows the plan does not want yet, each with the reason it is still there. A new arrow
# of the same kind fails; an old one that went away must be taken off this list (it fails
# too), so the list only shrinks.
KNOWN: dict = {}
BINDINGS = {"server", "proxy", "client", "demo"}


def modules():
    found = {}
    for dirpath, _, files in os.walk(ROOT):
        for name in files:
            if not name.endswith(".rs") or name.endswith("_tests.rs") or name == "tests.rs":
                continue
            path = os.path.join(dirpath, name)
            parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            if parts[-1] == "mod":
                parts = parts[:-1]
            found["::".join(parts)] = path
    return found


def resolve(mods, here, path):
    segs = path.split("::")
    base = here.split("::") if here not in ("lib", "main") else []
    if segs[0] == "crate":
        base, segs = [], segs[1:]
    elif segs[0] == "super":
        while segs and segs[0] == "super":
            base, segs = base[:-1], segs[1:]
    elif segs[0] == "self":
        segs = segs[1:]
    else:
        return None
    full = base + segs
    for i in range(len(full), 0, -1):
        name = "::".join(full[:i])
        if name in mods:
            return name
    return None


def arrows(mods):
    edges = collections.defaultdict(set)
    for here, path in mods.items():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        text = re.split(r"#\[cfg\(test\)\]\s*(?:#\[path = \"[^\"]*\"\]\s*)?mod \w+", text)[0]
        text = re.sub(r"//.*", "", text)
        names = re.findall(r"\buse\s+((?:crate|super|self)(?:::\w+)+)", text)
        names += re.findall(r"\b((?:crate|super)(?:::\w+)+)::\w+", text)
        for group in re.findall(r"\buse\s+((?:crate|super|self)(?:::\w+)*)::\{([^;]*)\}", text, re.S):
            for item in re.findall(r"\b\w+(?:::\w+)*", group[1]):
                names.append(f"{group[0]}::{item}")
        for name in names:
            there = resolve(mods, here, name)
            if there and there != here and not here.startswith(there + "::"):
                edges[here].add(there)
    return edges


def layer(module):
    top = module.split("::")[0]
    for i, members in enumerate(LAYERS):
        if top in members:
            return i
    return len(LAYERS)  # beside all


def binding_of(module):
    parts = module.split("::")
    return parts[1] if len(parts) > 1 and parts[0] == "binding" and parts[1] in BINDINGS else None


def circles(edges, mods):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return out


def main():
    mods = modules()
    edges = arrows(mods)
    faults, seen = [], set()
    for here in sorted(edges):
        for there in sorted(edges[here]):
            if layer(there) < layer(here):
                key = (here.split("::")[0], there.split("::")[0])
                if key in KNOWN:
                    seen.add(key)
                    continue
                faults.append(f"{here} imports {there}, a layer above it")
            a, b = binding_of(here), binding_of(there)
            if a and b and a != b:
                faults.append(f"{here} imports {there}: bindings talk through streams only")
    for group in circles(edges, mods):
        key = ("circle", " ↔ ".join(group))
        if key in KNOWN:
            seen.add(key)
            continue
        faults.append("import circle: " + key[1])
    for key in sorted(set(KNOWN) - seen):
        faults.append(f"{' → '.join(key)} is gone: take it off KNOWN in tests/plan/check.py")
    for fault in faults:
        print(f"house plan: {fault}")
    if faults:
        sys.exit(1)
    print(
        f"house plan: {len(mods)} modules, {sum(len(v) for v in edges.values())} arrows, all pointing down "
        + (f"and no circle but the {len(KNOWN)} known ones" if KNOWN else "and no circle")
    )


if __name__ == "__main__":
    main()
