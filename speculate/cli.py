"""The `speculate` command line: `speculate demo [engine|text|rl|physics|image|speech|all] [--quick]`,
`speculate generate [--prompt TEXT] ...` (text generation, see speculate.domains.text.cli), `speculate serve
[--port N] ...` (an OpenAI-compatible server, see speculate.domains.text.serving.cli)."""

from __future__ import annotations

import argparse
import importlib
import sys

DEMOS = {
    "engine": "speculate.demo",
    "text": "speculate.domains.text.examples.demo",
    "rl": "speculate.domains.rl.demo",
    "physics": "speculate.domains.physics.demo",
    "image": "speculate.domains.diffusion.demo",
    "speech": "speculate.domains.text.examples.speech_demo",
}
DEFAULT = ["engine", "text"]


def _run(name: str, rest: list[str]) -> int:
    try:
        mod = importlib.import_module(DEMOS[name])
    except ImportError as err:
        extra = {"engine": "", "text": "text", "rl": "rl", "physics": "physics", "image": "diffusion",
                 "speech": "text"}[name]
        print(f"speculate demo {name}: missing dependency ({err}); install with: pip install 'speculate[{extra}]'")
        return 1
    return int(mod.demo(rest) or 0)


#: the commands with their own parser: (the module whose main(argv) runs it, the extra that installs it)
COMMANDS = {"generate": ("speculate.domains.text.cli", "text"),
            "serve": ("speculate.domains.text.serving.cli", "serve"),
            "audit": ("speculate.domains.text.audit_cli", "text")}


def _command(name: str, argv: list[str]) -> int:
    """``speculate <name> ...``: its own module's ``main``, or a one-line message naming the extra."""
    module, extra = COMMANDS[name]
    try:
        run = importlib.import_module(module).main
    except ImportError as err:
        print(f"speculate {name}: missing dependency ({err}); install with: pip install 'speculate[{extra}]'",
              file=sys.stderr)
        return 1
    return int(run(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] and argv[0] in COMMANDS:  # its own parser: speculate generate|serve|audit --help
        return _command(argv[0], argv[1:])
    if argv[:1] == ["demo"] and len(argv) > 2 and argv[1] in DEMOS and {"-h", "--help"} & set(argv[2:]):
        return _run(argv[1], ["--help"])  # speculate demo text --help: that demo's own flags
    parser = argparse.ArgumentParser(prog="speculate", description="Exact speculative sampling.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("generate", help="generate text with speculative decoding (default: the embedded "
                                    "pair); see speculate generate --help", add_help=False)
    sub.add_parser("audit", help="test whether a speculative decoder keeps its target's distribution "
                                 "(transformers' assisted generation on the embedded pair by default); see "
                                 "speculate audit --help", add_help=False)
    sub.add_parser("serve", help="an OpenAI-compatible server (/v1/completions, /v1/chat/completions) over "
                                 "speculative decoding; see speculate serve --help", add_help=False)
    d = sub.add_parser("demo", help="run a demo: engine, text, rl, physics, image, speech, or all "
                                    "(default: engine and text)")
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
