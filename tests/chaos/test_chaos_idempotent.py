"""Exactly once under chaos: kill -9 of a sync master while idempotent producers resend
every unknown outcome (``python -m chaos run --idempotent``).

The raw producers number their puts (producer id, sequence per partition) and resend a put
whose reply was lost, with the same numbers, to whichever master the group has, until it is
acked; the client producer runs with ``idempotence=True`` and ``retry_unknown_outcome=True``.
The checker must find every acked message at its acked offset and no value stored twice (with
``--idempotent`` a duplicate is a violation), and the history must hold puts resent after an
unknown outcome that then got acked: without them the run would prove nothing about resends.
"""

from __future__ import annotations

import pytest

from tests.chaos.run_support import Outcome, chaos_run, checked

pytestmark = pytest.mark.chaos


@chaos_run("kill-master", 1, 12, "sync", 1, "--idempotent")
def test_kill_master_sync_idempotent_resends_lose_nothing_and_store_nothing_twice(chaos_outcome: Outcome) -> None:
    result = checked(chaos_outcome)
    stats, history = result["stats"], result["history"]
    assert history["meta"]["producers"] == {"idempotent": True, "retry_unknown": True}
    assert stats["lost_acked"] == 0 and stats["duplicates"] == 0, stats
    assert result["checks"]["duplicates"]["ok"] and result["checks"]["acked_lost"]["ok"]
    # The kills cut replies off: puts were resent after an unknown outcome, and acked.
    assert stats["puts_resent_after_unknown_acked"] >= 1, stats
    resent = [op for op in history["ops"] if op["type"] == "ok" and op.get("resent_after_unknown")]
    assert all(op["attempts"] > op["resent_after_unknown"] >= 1 for op in resent)
