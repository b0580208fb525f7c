"""Drills started from the console: ``metaq drill``'s ``Drill``, run here, watched as it runs.

One drill at a time per console (a second is refused with 409: two faults at once would
measure neither). The drill is the CLI's (metaq/tools/drill.py), run in this process as
``metaq drill`` runs it, so this console must run on the brokers' machine, as ``metaq
drill`` must (it signals the master's pid and restarts it).

While it runs, a sampler turns the load's acks into a timeline of ``BUCKET_S`` buckets:
acked writes per second and the put latency (median and maximum of the acks that
arrived in the bucket, sent-to-acked, the client's retries included), seconds from the
load's start. The markers come from the drill's own report as it measures them: the
fault, the detection (the master node changed), the first acked write stored by the new
master, the first read of it. When it ends, the report (the figures ``metaq drill
--json`` prints, the timeline and the markers) is written to ``{reports}/{id}.json``;
the page that watched it uploads the chart as ``{reports}/{id}.png``. Both stay for later
viewing (``/api/drills``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import MetaqError

log = logging.getLogger(__name__)

BUCKET_S = 0.25
#: The faults a page may start (``partition`` needs a fault proxy the console does not know of).
FAULTS = ("kill", "stop", "promote")
#: A drill id: when it started (UTC), and its group (``20261207-130501-g0``; ``-2`` for a second one that second).
DRILL_ID = re.compile(r"\d{8}-\d{6}-g\d+(-\d+)?")
#: Largest chart image accepted (a PNG of the page's chart is far smaller).
MAX_CHART_BYTES = 4 * 1024 * 1024
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class DrillBusy(Exception):
    pass


class LiveDrill:
    """One drill, running or done: its timeline as sampled so far, then its report."""

    def __init__(self, drill_id: str, drill: Any, started_by: str | None) -> None:
        self.id = drill_id
        self.drill = drill
        self.started_by = started_by
        self.started_at_ms = int(time.time() * 1000)
        self.state = "running"
        self.error: str | None = None
        self.result: dict[str, Any] | None = None
        self._origin: float | None = None

    def view(self) -> dict[str, Any]:
        """What the page draws: the timeline, the markers, the state, the report once done."""
        drill = self.drill
        load, report = drill.load, drill.report
        timeline = _timeline(load.acks if load is not None else [], self._start(load))
        markers = []
        if drill.fault_at is not None and load is not None:
            fault = drill.fault_at - self._start(load)
            markers.append({"name": "fault", "t": round(fault, 3)})
            if report is not None:
                for name, value in (("detection", report.detection_s), ("first acked write", report.first_ack_s),
                                    ("first read", report.first_read_s)):
                    if value is not None:
                        markers.append({"name": name, "t": round(fault + value, 3)})
        return {
            "id": self.id, "state": self.state, "error": self.error, "broker_id": drill.broker_id, "fault": drill.fault,
            "topic": drill.topic, "rate": drill.rate, "started_by": self.started_by, "started_at_ms": self.started_at_ms,
            "timeline": timeline, "markers": markers, "report": self.result,
        }

    def _start(self, load: Any) -> float:
        if self._origin is None and load is not None:
            self._origin = min((a.sent_at for a in load.acks), default=None) or None
        return self._origin or time.monotonic()


def _timeline(acks: list[Any], origin: float) -> dict[str, list[float | None]]:
    """Buckets of ``BUCKET_S`` from ``origin``: ``t`` (bucket start, s), ``rate`` (acks/s),
    ``latency_p50`` and ``latency_max`` (ms; None where nothing was acked)."""
    buckets: dict[int, list[float]] = {}
    for ack in acks:
        buckets.setdefault(int((ack.at - origin) / BUCKET_S), []).append((ack.at - ack.sent_at) * 1000)
    last = max(buckets, default=-1)
    t, rate, p50, worst = [], [], [], []
    for index in range(last + 1):
        latencies = buckets.get(index, [])
        t.append(round(index * BUCKET_S, 3))
        rate.append(len(latencies) / BUCKET_S)
        p50.append(round(statistics.median(latencies), 2) if latencies else None)
        worst.append(round(max(latencies), 2) if latencies else None)
    return {"t": t, "rate": rate, "latency_p50": p50, "latency_max": worst}


class Drills:
    """The console's drills: the running one, and the reports kept in ``directory``."""

    def __init__(self, directory: Path, zk_connect: str, zk_root: str, creds: Any, group_secrets: dict[int, str] | None = None) -> None:
        self.directory = directory
        self.zk_connect, self.zk_root, self.creds = zk_connect, zk_root, creds
        #: broker group id -> its group secret file: a promote drill writes the group's hand-over node
        self.group_secrets = dict(group_secrets or {})
        self.live: dict[str, LiveDrill] = {}
        self._running: LiveDrill | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, broker_id: int, fault: str, topic: str | None, rate: float, started_by: str | None) -> LiveDrill:
        from ..tools.drill import Drill

        if fault not in FAULTS:
            raise MetaqError(f"unknown fault {fault!r} ({' or '.join(FAULTS)})")
        if self._running is not None:
            raise DrillBusy(f"drill {self._running.id} on broker group {self._running.drill.broker_id} is still running")
        drill = Drill(self.zk_connect, broker_id, fault, zk_root=self.zk_root, topic=topic, rate=rate, creds=self.creds,
                      zk_security=self._zk_security(broker_id))
        stem = time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + f"-g{broker_id}"
        drill_id, n = stem, 1
        while drill_id in self.live or (self.directory / f"{drill_id}.json").exists():
            n += 1
            drill_id = f"{stem}-{n}"
        live = self.live[drill_id] = self._running = LiveDrill(drill_id, drill, started_by)
        task = asyncio.ensure_future(self._run(live))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return live

    def _zk_security(self, broker_id: int) -> Any:
        """Group ``broker_id``'s ZooKeeper login from its ``--group-secret`` (None without one), as the CLI's."""
        from argparse import Namespace

        from ..cli.login import zk_security

        return zk_security(Namespace(group_secret=self.group_secrets.get(broker_id), zk_root=self.zk_root), broker_id)

    async def _run(self, live: LiveDrill) -> None:
        from ..tools.drill import summarize

        try:
            report = await live.drill.run()
            live.result = {**asdict(report), "ok": report.ok, "summary": summarize([report])}
            live.state = "done"
        except MetaqError as exc:
            live.state, live.error = "failed", str(exc)
        except Exception as exc:  # a bug: logged whole; the page gets one line
            log.exception("console: drill %s failed", live.id)
            live.state, live.error = "failed", f"{type(exc).__name__}: {exc}"
        finally:
            self._running = None
        self._save(live)

    def _save(self, live: LiveDrill) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / f"{live.id}.json").write_text(json.dumps(live.view(), indent=2))
        except OSError as exc:
            live.error = (live.error + "; " if live.error else "") + f"report not saved: {exc}"

    def view(self, drill_id: str) -> dict[str, Any] | None:
        if not DRILL_ID.fullmatch(drill_id):
            return None
        live = self.live.get(drill_id)
        if live is not None:
            view = live.view()
        else:
            try:
                view = json.loads((self.directory / f"{drill_id}.json").read_text())
            except (OSError, ValueError):
                return None
        view["chart"] = (self.directory / f"{drill_id}.png").is_file()
        return view

    def reports(self) -> list[dict[str, Any]]:
        """Every drill run or kept, newest first: id, group, fault, state, the headline figures."""
        found: dict[str, dict[str, Any]] = {}
        if self.directory.is_dir():
            for path in self.directory.glob("*.json"):
                if DRILL_ID.fullmatch(path.stem):
                    try:
                        found[path.stem] = json.loads(path.read_text())
                    except (OSError, ValueError):
                        continue
        for drill_id, live in self.live.items():
            found[drill_id] = live.view()
        rows = []
        for drill_id, view in sorted(found.items(), reverse=True):
            report = view.get("report") or {}
            rows.append({"id": drill_id, "broker_id": view.get("broker_id"), "fault": view.get("fault"), "state": view.get("state"),
                         "error": view.get("error"), "started_at_ms": view.get("started_at_ms"), "started_by": view.get("started_by"),
                         "ok": report.get("ok"), "lost": report.get("lost"), "first_ack_s": report.get("first_ack_s"),
                         "chart": (self.directory / f"{drill_id}.png").is_file()})
        return rows

    def save_chart(self, drill_id: str, png: bytes) -> str | None:
        """Keep the chart the page drew; None, or why it was refused."""
        if drill_id not in self.live and not (DRILL_ID.fullmatch(drill_id) and (self.directory / f"{drill_id}.json").is_file()):
            return f"no drill {drill_id!r}"
        if not png.startswith(PNG_MAGIC) or len(png) > MAX_CHART_BYTES:
            return f"the chart must be a PNG image of at most {MAX_CHART_BYTES} bytes"
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / f"{drill_id}.png").write_bytes(png)
        return None

    def chart_path(self, drill_id: str) -> Path | None:
        path = self.directory / f"{drill_id}.png"
        return path if DRILL_ID.fullmatch(drill_id) and path.is_file() else None

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
