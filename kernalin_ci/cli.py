"""The `kernalin-ci` command: parse arguments, call one function, map the result to an exit code.

Each subcommand is a module in kernalin_ci/commands/ with NAME, HELP,
add_arguments(parser) and run(args) -> int. Exit codes (docs/cli.md):
0 passed or nothing to check, 1 a finding or a failed gate, 2 usage/config/load error,
3 internal error (kernalin_ci.errors).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import traceback

import kernalin_ci.commands as pkg
from kernalin_ci import __version__
from kernalin_ci.errors import EXIT_INTERNAL, EXIT_USAGE, UsageError, describe, log_text, write_log


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse prints usage too by default)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _commands():

    mods = [
        importlib.import_module(f"kernalin_ci.commands.{m.name}")
        for m in pkgutil.iter_modules(pkg.__path__)
        if not m.name.startswith("_")
    ]
    return sorted(mods, key=lambda m: getattr(m, "ORDER", 50))


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kernalin-ci", description="A CI gate for LLM decode-path kernels.")
    parser.add_argument("--version", action="version", version=f"kernalin-ci {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for mod in _commands():
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
        mod.add_arguments(p)
        p.set_defaults(func=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.func(args) or 0)
    except UsageError as e:
        if args.debug:
            traceback.print_exc()
        print(f"kernalin-ci {args.command}: error: {as_flag(e, args)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"kernalin-ci {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # InternalError, or any exception nobody expected: a bug of ours
        text = log_text(e, ["kernalin-ci", *(sys.argv[1:] if argv is None else argv)])
        if args.debug:
            print(text, file=sys.stderr, end="")
            where = "traceback above"
        else:
            where = f"traceback in {write_log(text)}; --debug prints it"
        print(f"kernalin-ci {args.command}: internal error: {describe(e)} ({where})", file=sys.stderr)
        return EXIT_INTERNAL


def as_flag(e: UsageError, args: argparse.Namespace) -> str:
    """The message, its leading setting name written as the flag the user passed (`dtype x: ...`
    -> `--dtype x: ...`). Library code names settings, not flags: the value may have come from a
    configuration file, where no flag was given."""
    text = str(e)
    if e.setting and text.startswith(e.setting) and getattr(args, e.setting, None) not in (None, False):
        return "--" + e.setting.replace("_", "-") + text[len(e.setting) :]
    return text
