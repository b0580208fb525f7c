"""The ``metaq`` command line: one module per subcommand, each with ``add_parser`` and ``run``.

Every command prints one clear line on bad input (no traceback) and exits
0 on success, 1 on a runtime failure, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from .. import __version__
from ..errors import MetaqError, UsageError
from ..logsetup import configure as configure_logging
from .files import check_parent_directory

#: subcommand -> module under metaq.cli
COMMANDS = {
    "zk": "zk",
    "broker": "broker",
    "produce": "produce",
    "consume": "consume",
    "stats": "stats",
    "demo": "demo",
    "cluster": "cluster",
    "verify": "verify",
    "drill": "drill",
    "promote": "promote",
    "security": "security",
    "http": "http",
    "topics": "topics",
    "groups": "groups",
    "console": "console",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metaq", description="metaq-py: a replicated message broker in the line of MetaQ")
    parser.add_argument("--version", action="version", version=f"metaq-py {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--log-file", metavar="FILE", help="log to FILE (rotated at 100 MiB, 5 kept) instead of stderr")
    parser.add_argument("--log-format", choices=("text", "json"), default="text", help="text lines (default) or one JSON object per line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"{__name__}.{module_name}")
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.log_file is not None:
            check_parent_directory(args.log_file, "--log-file")
        configure_logging("DEBUG" if args.verbose else "INFO", args.log_file, args.log_format)
    except MetaqError as exc:
        print(f"metaq: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"metaq: error: --log-file {args.log_file}: {exc.strerror}", file=sys.stderr)
        return 2
    try:
        return int(args.run(args) or 0)
    except MetaqError as exc:
        print(f"metaq {args.command}: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Standard output's reader went away (`metaq topics get ... | head -c 100`): nothing
        # left to say and no traceback.
        detach_stdout()
        return 1


def detach_stdout() -> None:
    """Point stdout at /dev/null once its reader is gone, so Python's flush at exit cannot fail."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
