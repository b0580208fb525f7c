"""Failover time over many drills: kill -9 of the master -> first acked write on the new master.

    python bench/failover_bench.py [--drills 20] [--session-timeout-ms 1500] [--mode sync] [--no-idempotence]

Starts an embedded ZooKeeper and a master/slave pair (real processes), then runs
``--drills`` kill -9 drills back to back (each drill kills whichever broker is the
master, restarts it, and waits until it has rejoined as a slave and the logs are
identical), and prints every drill and the p50/p99/max of detection, first acked
write and first read. A master whose process died (kill -9, host up) is deposed at
once on the evidence of its death (docs/failover.md, "Fast takeover"); the last line
counts how many failovers took that path (from the brokers' logs). A stopped master
(``--fault stop``) is noticed when its ZooKeeper session expires.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from metaq.cli.drill import render  # noqa: E402
from metaq.tools.drill import Drill, summarize  # noqa: E402
from metaq.tools.launcher import LocalCluster  # noqa: E402
from metaq.process import stop_pid  # noqa: E402


#: What a broker logs when it took over on the evidence that the master's process died.
FAST_TAKEOVER_LINE = "took over from the dead master at"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drills", type=int, default=20)
    parser.add_argument("--session-timeout-ms", type=int, default=1500)
    parser.add_argument("--mode", choices=("sync", "async"), default="sync")
    parser.add_argument("--fault", choices=("kill", "stop"), default="kill")
    parser.add_argument("--no-idempotence", dest="idempotence", action="store_false",
                        help="load with a plain (at-least-once) producer, to count the duplicates it stores")
    parser.add_argument("--dir", help="keep the cluster's files (logs) here instead of a temporary directory")
    args = parser.parse_args()
    system = {"unflushThreshold": 0, "replicationMode": args.mode, "onSyncSlaveLoss": "degrade", "syncSlaveTimeoutMs": 1000}
    restarted: list[int] = []
    with tempfile.TemporaryDirectory(prefix="metaq-failover-bench-") as scratch:
        tmp = args.dir or scratch
        cluster = LocalCluster(
            tmp, masters=1, slaves=1, topics={"bench": 2}, system=system, tick_ms=100,
            zookeeper={"zk.zkSessionTimeoutMs": args.session_timeout_ms, "zk.zkSyncTimeMs": 0},
        )
        with cluster:
            reports = []
            try:
                for i in range(args.drills):
                    report = asyncio.run(Drill(cluster.zk_connect, 0, args.fault, topic="bench", rate=200,
                                                   idempotence=args.idempotence).run())
                    if report.restarted_pid:
                        restarted.append(report.restarted_pid)
                    reports.append(report)
                    print(render([report], first=i + 1), flush=True)
            finally:
                for pid in restarted:  # brokers the drills restarted: ours to stop, by pid
                    stop_pid(pid)
            fast = sum(log.read_text(errors="replace").count(FAST_TAKEOVER_LINE) for log in Path(tmp).glob("*/broker.log"))
    s = summarize(reports)
    print()
    producer = "idempotent" if args.idempotence else "plain"
    print(f"mode {args.mode}, fault {args.fault}, zk.zkSessionTimeoutMs={args.session_timeout_ms}, {producer} producer, "
          f"{s['drills']} drills, {s['failovers']} failovers")
    print(f"first acked write on the new master: p50 {s['first_ack_p50_s']:.2f}s  p99 {s['first_ack_p99_s']:.2f}s  max {s['first_ack_max_s']:.2f}s")
    print(f"detection p50 {s['detection_p50_s']:.2f}s; first read p50 {s['first_read_p50_s']:.2f}s")
    print(f"lost (acked, missing after failover): {s['lost_total']}; duplicates from retried unknown outcomes: {s['duplicates_total']}")
    print(f"fast takeovers (a dead master's session deposed at once): {fast} of {s['failovers']} failovers")
    print(f"all drills ok (new master, no loss in sync mode, logs identical after rejoin): {s['all_ok']}")


if __name__ == "__main__":
    main()
