"""The shape of the code at two revisions: files, lines, import edges, import layers and import
cycles of the text domain and of the whole tree (``speculate/`` and ``domains/``), from the source
text alone (``import_graph.py``: every import counts, lazy ones too; ``--no-init`` leaves out the
edges to the package ``__init__`` files an import runs).

Run: ``python benchmarks/shape.py --before REV`` (a few seconds). Writes ``benchmarks/results/shape.{json,md}``.
"""

from __future__ import annotations

import argparse
import sys

from import_graph import measure
from report import ROOT, command, short_rev, worktree, write

AREAS = {"text domain (domains/text)": ["domains/text"], "whole tree (speculate/, domains/)": ["speculate", "domains"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="the earlier revision (any git revision)")
    args = ap.parse_args(argv)
    rev = short_rev(args.before)
    res: dict = {}
    with worktree(rev) as before:
        for area, roots in AREAS.items():
            for init in (True, False):
                key = f"{area}{'' if init else ', --no-init'}"
                res[key] = {v: measure(str(root), [r for r in roots if (root / r).exists()], with_init=init)
                            for v, root in (("before", before), ("after", ROOT))}
    lines = ["# The shape of the code, before and after", "",
             f"Command: `{command(argv, 'benchmarks/shape.py')}`. Before: `{rev}`; after: the working tree.", "",
             "| area | version | files | lines | largest file | import edges | layers | cycles |",
             "|---|---|---|---|---|---|---|---|"]
    for key, vs in res.items():
        for v, m in vs.items():
            big = f"{m['largest_file'][0].split('.', 2)[-1]} ({m['largest_file'][1]})"
            cyc = "; ".join("{" + ", ".join(c) + "}" for c in m["cycles"]) or "0"
            lines.append(f"| {key} | {v} | {m['files']} | {m['lines']} | {big} | {m['edges']} | {m['layers']} | "
                         f"{len(m['cycles'])}{'' if not m['cycles'] else ': ' + cyc} |")
    lines += ["", "Layers: the longest import path, in modules (cycles collapsed). Lines: every line of the",
              "files, docstrings included."]
    write("shape", {"command": command(argv, "benchmarks/shape.py"), "before": rev, "areas": res}, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
