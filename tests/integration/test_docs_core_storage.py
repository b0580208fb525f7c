"""docs/storage.md, "Retention", against a real broker process: a deleteWhen the cron parser
refuses stops the broker with one line naming the file, the section and the key (it used to
end in a Python traceback from the retention scheduler)."""

from __future__ import annotations

from .failover_support import SESSION_MS, Group


def test_a_delete_when_out_of_range_stops_the_broker_with_one_line(broker_factory, zk_client, zk_root):
    group = Group(zk_client, zk_root)
    # Six fields, as the file's check once only counted; hour 25 is refused by the cron parser,
    # which that check now runs too.
    broker = broker_factory(0, {"t": 1}, {"deleteWhen": "0 0 25 * * ?"}, name="badcron",
                            zookeeper={"zk.zkSessionTimeoutMs": SESSION_MS}, start=False)
    broker.start(wait=False)
    assert broker._process.wait(30) == 1
    log = broker.log_text()
    assert "Traceback" not in log, log
    errors = [line for line in log.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, log
    assert "server.ini: [system] deleteWhen: cron '0 0 25 * * ?': bad hour value '25' (allowed 0-23)" in errors[0], errors
    assert group.master() is None
