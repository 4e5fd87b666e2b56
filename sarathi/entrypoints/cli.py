"""Command line: ``sarathi <command>`` (also ``python -m sarathi``).

Each command lives in its own module that exposes ``add_parser(subparsers)``; the parser's ``run``
default is called with the parsed arguments and returns the exit status.
"""

from __future__ import annotations

import argparse
import importlib

# command name -> module defining add_parser(subparsers)
COMMANDS = {
    "generate": "sarathi.entrypoints.generate",
    "serve": "sarathi.entrypoints.openai.serve",
    "bench": "sarathi.entrypoints.bench_cli",
    "capacity": "sarathi.entrypoints.capacity_cli",
    "profile": "sarathi.entrypoints.profile_cli",
    "simulate": "sarathi.entrypoints.simulate_cli",
    "tune": "sarathi.entrypoints.tune_cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sarathi", description="sarathi LLM serving engine")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)
