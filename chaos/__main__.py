"""``python -m chaos proxy|run|check|campaign|campaign-table ...``"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m chaos", description="metaq-py fault injection")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("proxy", help="run the Toxiproxy-API fault proxy in the foreground")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8474)
    p.add_argument("--seed", type=int, default=None, help="seed for toxicity draws, jitter, slice sizes")
    c = sub.add_parser("check", help="check a recorded history file (JSON) and print the report")
    c.add_argument("history")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    from chaos import campaign, runner

    runner.add_parser(sub)
    campaign.add_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "proxy":
        from chaos.proxy import serve_forever

        try:
            asyncio.run(serve_forever(args.host, args.port, args.seed))
        except KeyboardInterrupt:
            pass
        except (OSError, OverflowError) as exc:  # OverflowError: a port past 65535
            print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "check":
        from chaos.checker import check
        from chaos.history import History

        try:
            history = History.load(args.history)
        except (OSError, ValueError) as exc:
            print(f"error: cannot read history {args.history}: {exc}", file=sys.stderr)
            return 2
        try:
            result = check(history)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            # A field deeper than History's shape check is missing or of the wrong type: the
            # file is unreadable as a history (exit 2), not a run with violations (exit 1).
            print(f"error: cannot check history {args.history}: malformed entry "
                  f"({type(exc).__name__}: {exc})", file=sys.stderr)
            return 2
        try:
            print(json.dumps(result.to_json(), indent=2) if args.json else result.report())
            sys.stdout.flush()
        except BrokenPipeError:  # a reader that stopped early (| head): the verdict is the exit status
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0 if result.ok else 1
    if args.command == "run":
        return runner.main(args)
    if args.command == "campaign":
        return campaign.main(args)
    if args.command == "campaign-table":
        return campaign.main_table(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
