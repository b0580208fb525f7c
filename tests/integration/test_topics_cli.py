"""Topics in a broker group's ZooKeeper configuration: added on a running pair, served by
master and slave without a restart, and kept across role swaps (real ZooKeeper, real processes).

Group 0: A (master) and B (``--slave``, slaveId 1), sync mode, ZK session 1500 ms.
"""

from __future__ import annotations

import logging
import signal

from metaq.cli import main
from metaq.client.codec import encode_messages
from metaq.client.message import Message
from metaq.protocol.messages import PutRequest
from metaq.zk.paths import ZkPaths

from .failover_support import Group, make_pair, stat, sync_system, topics_reply, wait_follows, wait_leads
from .replication_support import assert_identical, put, request, wait_caught_up, wait_for


def metaq(capsys, zk, zk_root, *argv: str) -> tuple[int, str]:
    """``metaq COMMAND ACTION --zk … --zk-root … ARGS`` in this process: (exit code, stdout + stderr)."""
    return run_cli(capsys, *argv[:2], "--zk", zk.connect_string, "--zk-root", zk_root, *argv[2:])


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    """``metaq ARGV`` in this process: (exit code, stdout + stderr); a usage error's exit code too."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        code = main(list(argv))
    except SystemExit as exit_:  # argparse's usage errors
        code = int(exit_.code or 0)
    finally:  # main() sets up logging for a process; the test session's stays as it was
        ours = getattr(root, "_metaq_handler", None)
        if ours is not None:
            ours.close()
            delattr(root, "_metaq_handler")
        root.handlers[:] = handlers
        root.setLevel(level)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def serves(broker, topic: str) -> int | None:
    return topics_reply(broker)["topics"].get(topic)


def idempotent_put(broker, topic: str, producer_id: int, partition: int):
    """One batch of an idempotent producer: epoch 0, sequence 0 (the same batch each time)."""
    payloads = [b"idem-0", b"idem-1", b"idem-2"]
    body, _ = encode_messages([Message(topic, p) for p in payloads])
    header = PutRequest(topic=topic, partition=partition, count=len(payloads), producer_id=producer_id,
                        producer_epoch=0, sequence=0).to_header()
    return request(broker, header, body)


def test_topic_created_on_a_running_pair_survives_role_swaps(broker_factory, zk, zk_root, zk_client, capsys):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)

    code, out = metaq(capsys, zk, zk_root, "topics", "create", "--broker-id", "0", "--topic", "audit",
                      "--partitions", "3", "--set", "unflushThreshold=0")
    assert code == 0, out
    assert "applied by every live member" in out
    assert serves(a, "audit") == 3 and serves(b, "audit") == 3
    for partition in range(3):
        put(a, "audit", partition, 20)
    # A partition opened at run time has its producer state: an idempotent batch is stored
    # once and its retry answered as a duplicate.
    first, retry = idempotent_put(a, "audit", 4242, 2), idempotent_put(a, "audit", 4242, 2)
    assert first.code == 200 and not first.get("duplicate"), first.header
    assert retry.code == 200 and retry.get("duplicate") and retry["offset"] == first["offset"], retry.header
    wait_caught_up(a, b, [("audit", p) for p in range(3)])

    # describe: both members, the sync set, exact lag (0 once caught up)
    code, out = metaq(capsys, zk, zk_root, "topics", "describe", "--topic", "audit")
    assert code == 0, out
    assert "topic audit, broker group 0: 3 partitions" in out and "sync set slave1" in out
    rows = [line.split() for line in out.splitlines() if line[:1].isdigit()]
    assert {(r[0], r[1]) for r in rows} == {(str(p), m) for p in range(3) for m in ("master", "slave1")}
    assert all(r[6] == "0" and r[7] == "yes" for r in rows if r[1] == "slave1"), out

    # Role swap: A stops, B leads and still serves audit; A comes back as B's slave with audit.
    epoch = group.epoch()
    a.stop()
    wait_leads(b, group, epoch)
    assert serves(b, "audit") == 3
    a.start(wait_zk=False)
    wait_follows(a, b, group)
    put(b, "audit", 1, 10)
    wait_caught_up(b, a, [("audit", p) for p in range(3)])
    assert serves(a, "audit") == 3

    # Alter on the swapped pair: both apply it; describe and stats config say so.
    code, out = metaq(capsys, zk, zk_root, "topics", "alter", "--broker-id", "0", "--topic", "audit", "--partitions", "4")
    assert code == 0, out
    assert serves(a, "audit") == 4 and serves(b, "audit") == 4
    put(b, "audit", 3, 5)
    added = idempotent_put(b, "audit", 4343, 3)  # a partition added at run time, on the swapped pair
    assert added.code == 200 and not added.get("duplicate"), added.header
    assert idempotent_put(b, "audit", 4343, 3).get("duplicate")
    wait_caught_up(b, a, [("audit", 3)])
    slave_config = bytes(request(a, {"op": "stats", "item": "config"}).body).decode()
    assert "; [topic=audit] numPartitions=4 unflushThreshold=0" in slave_config
    assert_identical(b, slaves=1)

    # Shrinking is refused; delete stops both serving it.
    code, out = metaq(capsys, zk, zk_root, "topics", "alter", "--broker-id", "0", "--topic", "audit", "--partitions", "2")
    assert code == 1
    code, out = metaq(capsys, zk, zk_root, "topics", "delete", "--broker-id", "0", "--topic", "audit")
    assert code == 0, out
    assert serves(a, "audit") is None and serves(b, "audit") is None
    code, out = metaq(capsys, zk, zk_root, "topics", "list", "--broker-id", "0")
    assert "fo" in out and "audit" not in out


def test_a_former_member_started_without_slave_joins_without_changing_the_groups_topics(broker_factory, zk_root, zk_client):
    """One rule: a broker started without ``--slave`` while another broker leads
    never changes the group's topics. The old master, a section added to its server.ini and
    restarted after the slave took over, joins as the new master's slave and serves the
    group's topics; the new section is not added (it used to be, from the old master's
    server.ini) and its WARNING names it. Adding a topic is ``metaq topics create`` or a
    SIGHUP to the master (docs/operations.md, "Topics").
    """
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    with a.config_path.open("a") as ini:
        ini.write("[topic=added]\nnumPartitions=2 ; MetaQ-style trailing comment\n\n")
    epoch = group.epoch()
    a.stop()
    wait_leads(b, group, epoch)
    a.start(wait_zk=False)
    wait_follows(a, b, group)
    line = next(line for line in a.log_text().splitlines() if "a former member started without --slave" in line)
    assert "topics not in the group's topic configuration: added" in line and "metaq topics create" in line, line
    assert serves(a, "added") is None and serves(b, "added") is None
    assert "added" not in zk_client.get(ZkPaths(zk_root).topic_config(0))[0].decode()
    put(b, "fo", 0, 10)
    wait_caught_up(b, a, [("fo", 0)])


def test_sighup_reloads_without_dying_and_says_what_needs_a_restart(broker_factory, zk_root, zk_client):
    group = Group(zk_client, zk_root)
    a, b = make_pair(broker_factory, sync_system(), group)
    text = a.config_path.read_text()
    a.config_path.write_text(
        text.replace("unflushThreshold=0", "unflushThreshold=5").replace("[system]\n", "[system]\nlogLevel=DEBUG\n", 1)
        + "[topic=hup]\nnumPartitions=2\n\n"
    )
    a._signal(signal.SIGHUP)
    wait_for(lambda: "reload: applied" in a.log_text(), 10, "the reload line")
    line = next(line for line in a.log_text().splitlines() if "reload: applied" in line)
    assert "unflushThreshold" in line and "logLevel" in line and "hup" in line, line
    assert a.alive and stat(a, "ha_state") == "leading"
    wait_for(lambda: serves(b, "hup") == 2, 15, "the slave to apply the published topic")

    # A key that needs a restart is named, and the broker keeps running.
    a.config_path.write_text(a.config_path.read_text().replace(f"serverPort={a.port}", f"serverPort={a.port + 1}"))
    a._signal(signal.SIGHUP)
    wait_for(lambda: "needs a restart: serverPort" in a.log_text(), 10, "the restart note")
    assert a.alive and serves(a, "hup") == 2
    assert a.stop() == 0  # a clean stop after reloads (SIGHUP used to kill it with exit 129)
