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


def _generate(argv: list[str]) -> int:
    try:
        from speculate.domains.text.cli import main as generate
    except ImportError as err:
        print(f"speculate generate: missing dependency ({err}); install with: pip install 'speculate[text]'",
              file=sys.stderr)
        return 1
    return int(generate(argv) or 0)


def _serve(argv: list[str]) -> int:
    try:
        from speculate.domains.text.serving.cli import main as serve
    except ImportError as err:
        print(f"speculate serve: missing dependency ({err}); install with: pip install 'speculate[serve]'",
              file=sys.stderr)
        return 1
    return int(serve(argv) or 0)


def _audit(argv: list[str]) -> int:
    try:
        from speculate.domains.text.audit_cli import main as audit
    except ImportError as err:
        print(f"speculate audit: missing dependency ({err}); install with: pip install 'speculate[text]'",
              file=sys.stderr)
        return 1
    return int(audit(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["generate"]:  # its own parser: speculate generate --help
        return _generate(argv[1:])
    if argv[:1] == ["audit"]:  # its own parser: speculate audit --help
        return _audit(argv[1:])
    if argv[:1] == ["serve"]:  # its own parser: speculate serve --help
        return _serve(argv[1:])
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
