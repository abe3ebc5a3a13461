"""The Parquet sink killed with SIGKILL mid-stream, three times: every source offset archived exactly once.

A real broker, a real ``ccld sink`` process and a real producer. The sink writes a file, then commits
the offsets it holds; a kill between the two must lead to a rewrite under the same name, never a
second copy, and a kill before the write to a re-read, never a gap. Two kills land mid-stream; one
with the broker frozen after the sink fetched a file's worth, so it writes the file and is killed
while its commit waits. (The frozen broker still holds that commit request in its socket and applies
it after SIGCONT, so this is not a write without a commit: the restarted sink does not re-read.)
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from ccld.records import AnomalyKind, Verdict, VerdictState
from ccld.schemas.codec import decode_metrics, decode_verdict, encode_verdict
from ccld.settings import Settings
from ccld.sinks.catalog import read_verdicts
from chaoslib import ChaosBroker, archived, produce, record_result, scenario_batches, wait_for
from harness import WorkerProcess, raw_records

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def make_verdicts(s: Settings, first: int, n: int) -> int:
    """``n`` distinct verdicts straight onto the verdicts topic (the sink's other input); returns how many."""
    p = Producer({"bootstrap.servers": s.bootstrap, "linger.ms": 5})
    for i in range(first, first + n):
        v = Verdict(incident_id=f"sink-{i}", state=VerdictState.OPEN, kind=AnomalyKind.H1, job="sink-kill",
                    communicator="00000000000000aa", op_seq=i, op_type="ALL_REDUCE", root_cause_ranks=(i % 8,),
                    affected_ranks=tuple(range(8)), confidence=0.9, evidence="chaos", onset_time=float(i),
                    detected_time=float(i) + 20.0)
        p.produce(s.verdicts_topic, encode_verdict(v), key=v.incident_id.encode())
        p.poll(0)
    assert p.flush(30) == 0
    return n


def archived_lines(sink: WorkerProcess) -> int:
    return len(re.findall(r"archived \d+ rows", sink.log_path.read_text(errors="replace")))


def test_sink_killed_with_sigkill_archives_every_offset_exactly_once(
    chaos_broker: ChaosBroker, chaos_settings: Settings, tmp_path: Path
) -> None:
    # Small files, flushed soon: many write-then-commit windows for the kills to land in.
    # A short session: the restarted sink's group waits for the killed member to time out.
    s = chaos_settings.replace(sink_max_rows=600, sink_max_age_s=1.0, session_timeout_ms=3000, heartbeat_ms=1000)
    root = Path(s.archive_dir)
    sink = WorkerProcess(s, tmp_path / "sink.log", command="sink", ready="archiving")
    batches = scenario_batches("sink-kill", {"kind": "H1", "rank": 2, "onset_s": 100.0}, 160.0)
    chunks = [batches[i::4] for i in range(4)]  # four interleaved slices of the job, one per round
    produced = verdicts = 0
    kills = 0
    in_window = False
    try:
        sink.start()
        for i, chunk in enumerate(chunks[:3]):
            before = archived_lines(sink)
            produced += produce(s, chunk, offset_s=1000.0 * i)
            if i == 1:
                # Once this round's metrics are archived, 40 verdicts (one file, flushed by age) are fetched and
                # the broker is frozen before that flush: the sink writes the file, then waits on the commit.
                assert wait_for(lambda n=produced: sum(archived(root, s.metrics_topic).values()) >= n, 20), sink.log()
                verdicts += make_verdicts(s, 100 * i, 40)
                time.sleep(0.5)  # fetched (the sink polls every 0.2 s), not yet flushed (1 s age)
                chaos_broker.freeze()
                try:
                    frozen = archived_lines(sink)
                    in_window = wait_for(lambda f=frozen: archived_lines(sink) > f, 5, every_s=0.05)
                    time.sleep(0.2)
                    assert sink.stop(signal.SIGKILL) == -signal.SIGKILL
                finally:
                    chaos_broker.thaw()
            else:
                verdicts += make_verdicts(s, 100 * i, 40)
                # Mid-stream: after the first file of this round, while the rest is still being written.
                assert wait_for(lambda b=before: archived_lines(sink) > b, 20, every_s=0.05), sink.log()
                assert sink.stop(signal.SIGKILL) == -signal.SIGKILL
            kills += 1
            sink.start()  # same group: resumes from the offsets it committed
        produced += produce(s, chunks[3], offset_s=3000.0)
        verdicts += make_verdicts(s, 300, 40)

        metrics = {(p, o): decode_metrics(v).n for p, o, v in raw_records(s, s.metrics_topic, idle_s=1.0)}
        on_topic = {(p, o): decode_verdict(v).incident_id for p, o, v in raw_records(s, s.verdicts_topic, 1.0)}
        assert sum(metrics.values()) == produced and len(on_topic) == verdicts
        assert wait_for(lambda: set(archived(root, s.metrics_topic)) >= set(metrics)
                        and set(archived(root, s.verdicts_topic)) >= set(on_topic), 40), sink.log()
        assert sink.stop(signal.SIGTERM) == 0, sink.log()
    finally:
        sink.stop(signal.SIGKILL)

    rows = archived(root, s.metrics_topic)
    got = archived(root, s.verdicts_topic)
    missing = {k: n - rows.get(k, 0) for k, n in metrics.items() if rows.get(k, 0) < n}
    extra = {k: n - metrics.get(k, 0) for k, n in rows.items() if n > metrics.get(k, 0)}
    assert not missing and not extra, f"metrics offsets lost {missing}, duplicated or foreign {extra}"
    assert got == Counter(dict.fromkeys(on_topic, 1)), f"verdict offsets lost or duplicated: {got - Counter(on_topic)}"
    ids = Counter(r["incident_id"] for r in read_verdicts(root, s.verdicts_topic))
    assert ids == Counter(on_topic.values()), "the archive holds other verdicts than the topic"
    assert kills == 3
    record_result("sink killed (SIGKILL) mid-stream, 3 times", f"SIGKILL of `ccld sink` 3 times, once with the broker "
                  f"frozen after a write (commit pending: {'hit' if in_window else 'missed'}), restart with the same "
                  f"group; {len(metrics)} metrics and {len(on_topic)} verdict messages",
                  produced=produced, delivered=sum(min(rows[k], n) for k, n in metrics.items()),
                  verdicts_expected=verdicts, verdicts_received=len(set(got) & set(on_topic)),
                  verdicts_raw=sum(got.values()), archived_rows=sum(rows.values()), window_hit=in_window)
