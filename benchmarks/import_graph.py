"""Intra-repo import graph of Python packages, from the source text (ast), nothing imported.

usage: python benchmarks/import_graph.py [--repo DIR] [--map PKG=FOLDER ...] [-v] ROOT [ROOT ...]

ROOT: folders (relative to --repo, default .) whose .py files are the graph's nodes, e.g.
  speculate domains/rl domains/physics domains/diffusion
Module names come from the folder path (speculate/verify/device.py -> speculate.verify.device);
--map rewrites a folder prefix to an installed package name. The default map is the repository's
pyproject: domains -> speculate.domains (setuptools package-dir), so domains/rl/api.py is the module
speculate.domains.rl.api and an import of speculate.domains.rl.x finds domains/rl/x.py.

Every import counts, module-level and lazy (inside functions, under TYPE_CHECKING, in try blocks):
  import a.b.c            -> the deepest node among a.b.c, a.b, a
  from a.b import c       -> a.b.c when that is a node (a submodule), else a.b
  from . import x / ..y   -> resolved against the importing module's package
Importing a package also imports its __init__ (a.b.c imports a/__init__, a/b/__init__): those
implicit edges are added too (--no-init leaves them out), because they make cycles real.
Edges only between nodes (files under the ROOTs); an import of a repository module outside the
ROOTs (say a domain left out) gives no edge, except to the package __init__s it runs; self-edges dropped.

Prints: files, edges (and how many are lazy: only inside a function), layers (the longest path
in the condensation, counted in nodes), and each cycle (strongly connected component > 1) with its
members and the edges inside it.
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
from collections import defaultdict


def module_name(path: str, maps: list[tuple[str, str]]) -> tuple[str, bool]:
    rel = path[:-3].replace(os.sep, "/")
    is_pkg = rel.endswith("/__init__")
    if is_pkg:
        rel = rel[: -len("/__init__")]
    for folder, pkg in maps:
        if rel == folder or rel.startswith(folder + "/"):
            rel = pkg.replace(".", "/") + rel[len(folder) :]
            break
    return rel.replace("/", "."), is_pkg


def collect(repo: str, roots: list[str], maps) -> dict[str, tuple[str, bool]]:
    files: dict[str, tuple[str, bool]] = {}
    for root in roots:
        base = os.path.join(repo, root)
        if os.path.isfile(base) and base.endswith(".py"):
            name, is_pkg = module_name(os.path.relpath(base, repo), maps)
            files[name] = (base, is_pkg)
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
            for f in sorted(filenames):
                if f.endswith(".py"):
                    p = os.path.join(dirpath, f)
                    name, is_pkg = module_name(os.path.relpath(p, repo), maps)
                    files[name] = (p, is_pkg)
    return files


class Visitor(ast.NodeVisitor):
    def __init__(self):
        self.found: list[tuple[int, str, tuple[str, ...], bool]] = []  # (level, module, names, lazy)
        self.depth = 0

    def visit_FunctionDef(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Import(self, node):
        for a in node.names:
            self.found.append((0, a.name, (), self.depth > 0))

    def visit_ImportFrom(self, node):
        self.found.append((node.level, node.module or "", tuple(a.name for a in node.names), self.depth > 0))


def resolve(mod: str, is_pkg: bool, level: int, target: str) -> str:
    if level == 0:
        return target
    parts = mod.split(".")
    if not is_pkg:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([target] if target else []))


def deepest(name: str, nodes) -> str | None:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        cand = ".".join(parts[:i])
        if cand in nodes:
            return cand
    return None


def parents(name: str, nodes) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in nodes]


def build(files, with_init=True, universe=None):
    """``universe``: every module of the repository's packages (nodes or not): an import that
    resolves to a module outside the nodes (a domain not among the ROOTs) gives no edge, rather
    than an edge to the nearest node above it (only the package __init__ edges it implies)."""
    universe = files if universe is None else {**universe, **files}
    edges: dict[tuple[str, str], bool] = {}  # (a, b) -> lazy only

    def add(a, b, lazy):
        if a == b or b is None:
            return
        edges[(a, b)] = edges.get((a, b), True) and lazy

    for mod, (path, is_pkg) in files.items():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        v = Visitor()
        v.visit(tree)
        for level, target, names, lazy in v.found:
            base = resolve(mod, is_pkg, level, target)
            targets = []
            if names:
                for n in names:
                    sub = f"{base}.{n}" if base else n
                    targets.append(sub if sub in universe else deepest(base, universe))
            else:
                targets.append(deepest(base, universe))
            for t in targets:
                if t is None:
                    continue
                if t in files:
                    add(mod, t, lazy)
                if with_init:
                    for p in parents(t, files):
                        # importing a.b.c runs a/__init__ and a/b/__init__ first; a module inside
                        # package p has p's __init__ running already: no edge for that
                        if not (mod == p or mod.startswith(p + ".")):
                            add(mod, p, lazy)
    return edges


def sccs(nodes, adj):
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return out


def layers(nodes, adj, comps):
    comp_of = {v: i for i, c in enumerate(comps) for v in c}
    cadj = defaultdict(set)
    for v in nodes:
        for w in adj[v]:
            if comp_of[v] != comp_of[w]:
                cadj[comp_of[v]].add(comp_of[w])
    memo, nxt = {}, {}

    def longest(c):
        if c not in memo:
            best = max(cadj[c], key=longest, default=None)
            memo[c], nxt[c] = 1 + (longest(best) if best is not None else 0), best
        return memo[c]

    if not comps:
        return 0, []
    c = max(range(len(comps)), key=longest)
    depth, path = memo[c], []
    while c is not None:
        path.append("{" + ", ".join(comps[c]) + "}" if len(comps[c]) > 1 else comps[c][0])
        c = nxt[c]
    return depth, path


def measure(repo: str, roots: list[str], with_init: bool = True,
            maps: list[tuple[str, str]] | None = None) -> dict:
    """Files, lines, import edges, layers and cycles of ``roots`` in ``repo`` (see the module docstring)."""
    maps = maps or [("domains", "speculate.domains")]
    files = collect(repo, roots, maps)
    tops = sorted({r.strip("/").split("/")[0] for r in roots} | {folder for folder, _ in maps})
    universe = collect(repo, [t for t in tops if os.path.exists(os.path.join(repo, t))], maps)
    edges = build(files, with_init=with_init, universe=universe)
    adj = defaultdict(set)
    for a, b in edges:
        adj[a].add(b)
    comps = sccs(files, adj)
    depth, path = layers(files, adj, comps)
    sizes = {m: sum(1 for _ in open(p, encoding="utf-8")) for m, (p, _) in files.items()}
    return {"files": len(files), "lines": sum(sizes.values()), "largest_file": max(sizes.items(), key=lambda kv: kv[1]),
            "edges": len(edges), "layers": depth, "longest_path": path,
            "cycles": [c for c in comps if len(c) > 1]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("roots", nargs="+")
    ap.add_argument("--repo", default=".")
    ap.add_argument("--map", action="append", default=None, help="FOLDER=PKG (default domains=speculate.domains)")
    ap.add_argument("--no-init", action="store_true", help="leave out the implicit package __init__ edges")
    ap.add_argument("-v", "--verbose", action="store_true", help="list every edge")
    args = ap.parse_args(argv)
    maps = [tuple(m.split("=", 1)) for m in (args.map or ["domains=speculate.domains"])]
    files = collect(args.repo, args.roots, maps)
    tops = sorted({r.strip("/").split("/")[0] for r in args.roots} | {folder for folder, _ in maps})
    universe = collect(args.repo, [t for t in tops if os.path.exists(os.path.join(args.repo, t))], maps)
    edges = build(files, with_init=not args.no_init, universe=universe)
    adj = defaultdict(set)
    for a, b in edges:
        adj[a].add(b)
    comps = sccs(files, adj)
    cycles = [c for c in comps if len(c) > 1]
    lazy = sum(1 for v in edges.values() if v)
    print(f"roots: {' '.join(args.roots)}")
    print(f"files: {len(files)}")
    print(f"edges: {len(edges)} ({lazy} only lazy, inside functions)")
    depth, path = layers(files, adj, comps)
    print(f"layers (longest import path, in modules, cycles collapsed): {depth}")
    print(f"  one longest path: {' -> '.join(path)}")
    print(f"cycles (strongly connected components > 1): {len(cycles)}")
    for c in cycles:
        inside = sorted((a, b) for (a, b) in edges if a in c and b in c)
        print(f"  {len(c)} modules: {', '.join(c)}")
        for a, b in inside:
            print(f"    {a} -> {b}{'  (lazy)' if edges[(a, b)] else ''}")
    if args.verbose:
        for (a, b), lz in sorted(edges.items()):
            print(f"  {a} -> {b}{'  (lazy)' if lz else ''}")


if __name__ == "__main__":
    main()
