#!/usr/bin/env python3
"""Which file of the module imports which: prints the cycles between files of src/ (strongly
connected components of more than one file) and checks that src/sys/ imports nothing from the
rest of the crate. A file's edges are its `crate::x` paths (in `use` lines and in code), mapped
to the file that defines module `x` (or `x::y`). Exit status 1 on a sys violation or on a cycle
other than the documented one (keys <-> timers: a commit arms a timer, a timer commits).

Usage: scripts/import-graph.py [--edges]     (make lint runs it)
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3]
    parts = rel.split(os.sep)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return "::".join(parts)


files = {}
for d, _, names in os.walk(ROOT):
    for n in names:
        if n.endswith(".rs"):
            p = os.path.join(d, n)
            files[module_of(p)] = p

def strip_comments(text):
    return "\n".join(l.split("//")[0] for l in text.splitlines())

def targets(text, here):
    found = set()
    paths = re.findall(r"\bcrate::([a-z_][a-z_0-9]*(?:::[a-z_][a-z_0-9]*)*)", text)
    # `use crate::{a, b::c}` groups
    for group in re.findall(r"\bcrate::\{([^}]*)\}", text, re.S):
        paths += [g.strip() for g in group.split(",") if g.strip()]
    # `super::x` inside a directory module
    parent = here.rsplit("::", 1)[0] if "::" in here else ""
    for s in re.findall(r"\bsuper::([a-z_][a-z_0-9]*)", text):
        paths.append((parent + "::" + s) if parent else s)
    for p in paths:
        parts = p.split("::")
        # the longest prefix that names a file
        for k in range(len(parts), 0, -1):
            m = "::".join(parts[:k])
            if m in files:
                if m != here:
                    found.add(m)
                break
    return found

edges = {m: targets(strip_comments(open(p).read()), m) for m, p in files.items()}

# Tarjan's strongly connected components.
index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        sccs.append(sorted(comp))
sys.setrecursionlimit(10000)
for v in sorted(files):
    if v not in index:
        visit(v)

if "--edges" in sys.argv:
    for m in sorted(edges):
        print(f"{m or 'lib'} -> {', '.join(sorted(edges[m])) or '-'}")
cycles = [c for c in sccs if len(c) > 1]
print(f"{len(files)} files; {len(cycles)} cycle(s)")
for c in cycles:
    print("  cycle: " + ", ".join(x or "lib" for x in c))
bad = [(m, t) for m, ts in edges.items() if m.startswith("sys") for t in ts if not t.startswith("sys")]
for m, t in bad:
    print(f"  sys violation: {m} imports {t}")
ALLOWED = [["keys", "timers"]]
unexpected = [c for c in cycles if c not in ALLOWED]
for c in unexpected:
    print("  unexpected cycle (import arrows must point down): " + ", ".join(c))
sys.exit(1 if bad or unexpected else 0)
