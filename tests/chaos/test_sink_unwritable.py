"""A Parquet sink whose archive folder cannot be written: it says so once, commits nothing, loses nothing.

A real broker and a real ``ccld sink``. The metrics topic's folder in the archive is a plain file
(what a full or read-only disk also ends in: an ``OSError`` from the write; tests run as root, for
whom a read-only mode bit does not bite). The sink must keep running, say "archive not writable:
<path>: <reason>" once rather than crash-loop with a traceback, leave the offsets uncommitted and,
once the folder can be written again, archive every message it held back.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from ccld.settings import Settings
from ccld.sinks.layout import topic_dir
from chaoslib import ChaosBroker, archived, produce, publish_verdicts, scenario_batches, wait_for
from harness import WorkerProcess

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def committed_offsets(s: Settings, topic: str) -> list[int]:
    """The sink group's committed offset for each partition of ``topic`` (negative: none)."""
    c = Consumer({"bootstrap.servers": s.bootstrap, "group.id": s.sink_group, "enable.auto.commit": False})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return [tp.offset for tp in c.committed([TopicPartition(topic, p) for p in parts], timeout=10)]
    finally:
        c.close()


def test_unwritable_archive_is_said_once_and_nothing_is_lost(
    chaos_broker: ChaosBroker, chaos_settings: Settings, tmp_path: Path
) -> None:
    s = chaos_settings.replace(sink_max_age_s=1.0)
    root = Path(s.archive_dir)
    blocker = topic_dir(root, s.metrics_topic)  # a file where the metrics topic's folder goes
    root.mkdir(parents=True)
    blocker.write_text("not a folder\n")
    sink = WorkerProcess(s, tmp_path / "sink.log", command="sink", ready="archiving").start()
    said = re.compile(r"archive not writable: (\S+): (.+?) \(")
    try:
        produced = produce(s, scenario_batches("unwritable", None, 10.0))
        ids = publish_verdicts(s, "unwritable", 10)
        assert wait_for(lambda: said.search(sink.log_path.read_text()) is not None, 20), sink.log()
        # The verdicts folder is fine: they are archived meanwhile.
        assert wait_for(lambda: sum(archived(root, s.verdicts_topic).values()) == len(ids), 20), sink.log()
        time.sleep(12)  # two retries and more
        log = sink.log_path.read_text()
        assert sink.proc is not None and sink.proc.poll() is None, f"the sink exited:\n{sink.log()}"
        hits = said.findall(log)
        assert len(hits) == 1, f"said {len(hits)} times:\n{sink.log()}"
        path, reason = hits[0]
        assert path.startswith(str(blocker)) and reason == "Not a directory", hits
        assert "Traceback" not in log
        assert all(o < 0 for o in committed_offsets(s, s.metrics_topic)), "offsets of unwritten files committed"

        blocker.unlink()  # writable again
        assert wait_for(lambda: sum(archived(root, s.metrics_topic).values()) == produced, 20), sink.log()
        assert "archive writable again" in sink.log_path.read_text()
        assert wait_for(lambda: sum(o for o in committed_offsets(s, s.metrics_topic) if o > 0) > 0, 15)
        assert sink.stop(signal.SIGTERM) == 0, sink.log()
    finally:
        sink.stop(signal.SIGKILL)
    rows = archived(root, s.metrics_topic)
    assert all(n > 0 for n in rows.values()) and sum(rows.values()) == produced
    print(f"CHAOS archive folder not writable for 15 s: said once ({reason}); {produced} rows held back, "
          f"{sum(rows.values())} archived once writable, 0 committed meanwhile", flush=True)
