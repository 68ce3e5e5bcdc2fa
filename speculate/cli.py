"""The `speculate` command line: `speculate demo [engine|text|rl|physics|all] [--quick]`."""

from __future__ import annotations

import argparse
import importlib
import sys

DEMOS = {
    "engine": "speculate.demo",
    "text": "speculate.domains.text.demo",
    "rl": "speculate.domains.rl.demo",
    "physics": "speculate.domains.physics.demo",
}
DEFAULT = ["engine", "text"]


def _run(name: str, rest: list[str]) -> int:
    try:
        mod = importlib.import_module(DEMOS[name])
    except ImportError as err:
        extra = {"engine": "", "text": "text", "rl": "rl", "physics": "physics"}[name]
        print(f"speculate demo {name}: missing dependency ({err}); install with: pip install 'speculate[{extra}]'")
        return 1
    return int(mod.demo(rest) or 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="speculate", description="Exact speculative sampling.")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="run a demo: engine, text, rl, physics, or all (default: engine and text)")
    d.add_argument("which", nargs="?", choices=[*DEMOS, "all"], default=None)
    d.add_argument("--quick", action="store_true", help="a shorter run")
    args, rest = parser.parse_known_args(argv)
    rest = [*rest, "--quick"] if args.quick else rest
    names = DEFAULT if args.which is None else list(DEMOS) if args.which == "all" else [args.which]
    status = 0
    for i, name in enumerate(names):
        if i:
            print("\n" + "=" * 78 + "\n")
        status |= _run(name, rest)
    return status


if __name__ == "__main__":
    sys.exit(main())
