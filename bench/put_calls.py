"""Python calls per put in each broker of a pair under blocking sends (cProfile, counted by difference).

    python bench/put_calls.py                    # the sync pair: 500, then 3,000 sends
    python bench/put_calls.py --pair async --top 40

Starts the pairs of ``vs_redis.py`` twice with every broker under cProfile (``python -m
cProfile -o FILE`` in place of ``python``, through the launcher's ``command_prefix``), sends
``--low`` and then ``--high`` blocking ``send_message`` to the chosen pair, stops the brokers
(each writes its profile as it exits) and prints, for its master and its slave, the calls per
put: (calls with --high sends - calls with --low sends) / (high - low), so start-up, stop and
the heartbeats' share of a run of that length cancel out. A count is the code's, not the
machine's: the same tree gives the same count at any load (the profiler's times are not used).
Run it from the tree to count (the brokers run the package this script imports).
"""

from __future__ import annotations

import argparse
import pstats
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vs_redis import TOPIC, MetaqPairs, with_selector  # noqa: E402

from metaq.client import Message, MessageSessionFactory  # noqa: E402

Key = tuple[str, int, str]


def profiled_run(work: Path, group: int, sends: int) -> dict[str, Counter[Key]]:
    """Calls per function of the master and the slave of ``group`` over a run with ``sends`` puts."""
    profiles = work / "profiles"
    profiles.mkdir(parents=True)
    # The launcher runs [*prefix, python, -m, metaq, broker, ...]: sh execs python under cProfile
    # ($0 is python, "$@" the rest; $$ stays the broker's pid across the exec).
    prefix = ["sh", "-c", f'exec "$0" -m cProfile -o "{profiles}/$$.prof" "$@"']
    pairs = MetaqPairs(work, command_prefix=prefix).start()
    try:
        master, slave = pairs.processes[2 * group], pairs.processes[2 * group + 1]
        pids = {"master": master.pid, "slave": slave.pid}
        with MessageSessionFactory(pairs.config()) as factory:
            with factory.create_producer(with_selector(group)) as producer:
                producer.publish(TOPIC)
                for _ in range(sends):
                    result = producer.send_message(Message(TOPIC, b"x" * 100))
                    assert result.success, result
    finally:
        pairs.stop()
    return {name: Counter({key: row[1] for key, row in pstats.Stats(str(profiles / f"{pid}.prof")).stats.items()})
            for name, pid in pids.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", choices=("async", "sync"), default="sync")
    parser.add_argument("--low", type=int, default=500, help="sends in the first run")
    parser.add_argument("--high", type=int, default=3000, help="sends in the second run")
    parser.add_argument("--top", type=int, default=25, help="functions listed per broker")
    args = parser.parse_args(argv)
    group = 0 if args.pair == "async" else 1
    low = profiled_run(Path(tempfile.mkdtemp(prefix="put-calls-")), group, args.low)
    high = profiled_run(Path(tempfile.mkdtemp(prefix="put-calls-")), group, args.high)
    for name in ("master", "slave"):
        per_put = {key: (high[name][key] - low[name][key]) / (args.high - args.low) for key in high[name] | low[name]}
        in_python = sum(n for (file, _line, _func), n in per_put.items() if file != "~")
        print(f"{args.pair} {name}: {sum(per_put.values()):.1f} calls per put ({in_python:.1f} of Python functions)")
        for (file, line, func), n in sorted(per_put.items(), key=lambda item: -item[1])[:args.top]:
            where = func if file == "~" else f"{file.split('/metaq/')[-1]}:{line}({func})"
            print(f"  {n:7.2f}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
