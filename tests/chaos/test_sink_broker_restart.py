"""The broker killed with SIGKILL under a running Parquet sink: no archived row is lost, none overwritten.

The embedded broker keeps everything in memory: restarted, its topics are empty and number their
messages from offset 0 again, so offset 0 of the new topic is another message than offset 0 of the
old one. The archive must keep both: every row archived before the outage is still there after it,
and every message published after it is archived too, each once (counted per offset and per topic
incarnation, told apart by the job, or incident, each side published).

Two ways in: under `ccld up`, which restarts its broker and then the sink, and a sink of the test's
own that keeps running while its broker is killed and started again on the same port.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from ccld.schemas.codec import decode_metrics, decode_verdict
from ccld.settings import Settings
from ccld.stack.broker import free_port
from ccld.topics import ensure_topics
from chaoslib import (
    ChaosBroker,
    Lines,
    archived_by,
    children_of,
    produce,
    publish_verdicts,
    record_result,
    scenario_batches,
    wait_for,
)
from harness import WorkerProcess, raw_records, start_up

pytestmark = [pytest.mark.slow, pytest.mark.integration]

Rows = Counter[tuple[object, int, int]]


def on_topics(s: Settings, prefixes: tuple[str, ...]) -> tuple[Rows, Rows]:
    """What the broker holds now: metric rows per (job, partition, offset), verdicts per (incident, partition,
    offset); only those this test published (ids starting with one of ``prefixes``)."""
    metrics: Rows = Counter()
    for p, o, v in raw_records(s, s.metrics_topic, idle_s=1.0):
        b = decode_metrics(v)
        metrics[(b.job, p, o)] += b.n
    verdicts: Rows = Counter()
    for p, o, v in raw_records(s, s.verdicts_topic, idle_s=1.0):
        incident = decode_verdict(v).incident_id
        if incident.startswith(prefixes):
            verdicts[(incident, p, o)] += 1
    return metrics, verdicts


def in_archive(root: Path, s: Settings, prefixes: tuple[str, ...]) -> tuple[Rows, Rows]:
    """The same counts from the Parquet archive (every file, whichever folder holds it)."""
    metrics = archived_by(root, s.metrics_topic, "job")
    verdicts = Counter({k: n for k, n in archived_by(root, s.verdicts_topic, "incident_id").items()
                        if str(k[0]).startswith(prefixes)})
    return metrics, verdicts


def holds(archive: tuple[Rows, Rows], want: tuple[Rows, Rows]) -> bool:
    return all(archive[i][k] >= n for i in (0, 1) for k, n in want[i].items())


def summary_rows(root: Path) -> int:
    """The row total `ccld archive summary` prints (the real command)."""
    out = subprocess.run([sys.executable, "-P", "-m", "ccld.cli", "archive", "summary", str(root)],
                         capture_output=True, text=True, check=True, timeout=60).stdout
    m = re.search(r"files, ([\d,]+) rows", out)
    assert m, out
    return int(m.group(1).replace(",", ""))


def check(root: Path, s: Settings, before: tuple[Rows, Rows], after: tuple[Rows, Rows],
          snapshot: tuple[Rows, Rows]) -> tuple[Rows, Rows]:
    """Assert: every row archived before the outage is still there, every message published after it archived
    once, nothing else; `ccld archive summary` counts them all. Returns the archive's counts."""
    got = in_archive(root, s, ("before", "after"))
    for i, what in enumerate(("metric rows", "verdicts")):
        lost = {k: n - got[i][k] for k, n in snapshot[i].items() if got[i][k] < n}
        assert not lost, f"{what} archived before the broker restart are gone: {sum(lost.values())} of " \
                         f"{sum(snapshot[i].values())} (at {len(lost)} offsets), e.g. {sorted(lost.items())[:3]}"
        missing = {k: n - got[i][k] for k, n in after[i].items() if got[i][k] < n}
        assert not missing, f"{what} published after the restart not archived: {sorted(missing.items())[:5]}"
        # Rows of the old incarnation the sink had fetched but not yet written may come after the snapshot.
        allowed = before[i] + after[i]
        extra = {k: n - allowed[k] for k, n in got[i].items() if n > allowed[k]}
        assert not extra, f"{what} duplicated or foreign: {sorted(extra.items())[:5]}"
    everything = sum(archived_by(root, s.metrics_topic, None).values()) + \
        sum(archived_by(root, s.verdicts_topic, None).values())
    assert summary_rows(root) == everything, "`ccld archive summary` does not count every file"
    return got


def test_up_broker_killed_keeps_the_archive(tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:8]
    root = tmp_path / "archive"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CCLD_")}
    # Small files flushed soon: several per incarnation, so a new incarnation's files "cover" old ones.
    env.update({"CCLD_TOPIC_PREFIX": f"b{tag}.", "CCLD_WORKER_APP_ID": f"up-{tag}", "CCLD_SINK_GROUP": f"sink-{tag}",
                "CCLD_ARCHIVE_DIR": str(root), "CCLD_SINK_MAX_ROWS": "600", "CCLD_SINK_MAX_AGE_S": "1"})
    port = free_port()
    s = Settings.load(env, bootstrap=f"127.0.0.1:{port}")
    sink_log = tmp_path / "logs" / "sink.log"
    up = start_up(env, port, tmp_path / "logs")
    out, err = Lines(up.stdout), Lines(up.stderr)
    try:
        out.wait_for("Ctrl-C stops everything", 30)
        produce(s, scenario_batches("before", None, 60.0))
        publish_verdicts(s, "before", 40)
        before = on_topics(s, ("before",))
        assert wait_for(lambda: holds(in_archive(root, s, ("before",)), before), 30), sink_log.read_text()
        snapshot = in_archive(root, s, ("before", "after"))

        broker = next(pid for pid, cmd in children_of(up.pid).items() if "tansu" in cmd)
        os.kill(broker, signal.SIGKILL)
        err.wait_for("the embedded broker is back", 30)
        assert wait_for(lambda: sink_log.read_text().count("archiving ") >= 2, 20), sink_log.read_text()

        produce(s, scenario_batches("after", None, 30.0))
        publish_verdicts(s, "after", 40)
        after = on_topics(s, ("after",))
        assert wait_for(lambda: holds(in_archive(root, s, ("after",)), after), 40), sink_log.read_text()[-3000:]
        time.sleep(2)  # time for a late overwrite or a duplicate to show up
        got = check(root, s, before, after, snapshot)
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(40)
        except subprocess.TimeoutExpired:
            up.kill()
            raise
    record_result("broker killed (SIGKILL) under ccld up, sink archiving", "SIGKILL of the embedded broker; "
                  f"`ccld up` restarts it empty and the sink; {sum(before[0].values())} metric rows before, "
                  f"{sum(after[0].values())} after", produced=sum(before[0].values()) + sum(after[0].values()),
                  delivered=sum(got[0].values()), verdicts_expected=len(before[1]) + len(after[1]),
                  verdicts_received=len(+got[1]), verdicts_raw=sum(got[1].values()))


def test_running_sink_keeps_the_archive_when_its_broker_restarts(
    chaos_broker: ChaosBroker, chaos_settings: Settings, tmp_path: Path
) -> None:
    # A short session: the sink's group is rebuilt on the restarted broker.
    s = chaos_settings.replace(sink_max_rows=600, sink_max_age_s=3.0, session_timeout_ms=3000, heartbeat_ms=1000)
    root = Path(s.archive_dir)
    sink = WorkerProcess(s, tmp_path / "sink.log", command="sink", ready="archiving")
    try:
        sink.start()
        produce(s, scenario_batches("before", None, 60.0))
        publish_verdicts(s, "before", 40)
        early = on_topics(s, ("before",))
        assert wait_for(lambda: holds(in_archive(root, s, ("before",)), early), 30), sink.log()
        snapshot = in_archive(root, s, ("before", "after"))
        # More of the old incarnation, fetched but not yet written (files are flushed after 3 s) when the
        # broker dies: the sink writes them while, or after, the new broker comes up.
        produce(s, scenario_batches("before", None, 8.0), offset_s=100.0)
        before = on_topics(s, ("before",))
        time.sleep(0.6)
        chaos_broker.kill()
        time.sleep(1.0)
        chaos_broker.restart()
        ensure_topics(s)

        produce(s, scenario_batches("after", None, 30.0))
        publish_verdicts(s, "after", 40)
        after = on_topics(s, ("after",))
        assert wait_for(lambda: holds(in_archive(root, s, ("after",)), after), 40), sink.log()
        time.sleep(2)
        got = check(root, s, before, after, snapshot)
        assert sink.stop(signal.SIGTERM) == 0, sink.log()
    finally:
        sink.stop(signal.SIGKILL)
    tail = sum(before[0].values()) - sum(snapshot[0].values())
    kept = sum(n for (job, _, _), n in got[0].items() if job == "before") - sum(snapshot[0].values())
    record_result("broker killed (SIGKILL) and restarted under a running sink", "SIGKILL of the broker, a new "
                  f"empty one on its port; {sum(snapshot[0].values())} metric rows archived before, {kept} of "
                  f"{tail} fetched but unwritten rows kept, {sum(after[0].values())} after",
                  produced=sum(before[0].values()) + sum(after[0].values()), delivered=sum(got[0].values()),
                  verdicts_expected=len(+before[1]) + len(after[1]), verdicts_received=len(+got[1]),
                  verdicts_raw=sum(got[1].values()))
