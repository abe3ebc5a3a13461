"""A job over several partitions without Faust: shard-mode partition processors report, a stage decides.

The same scenario as ``test_processor`` (a 16-rank job, rank 6 hangs): its batches are split by
communicator group as producers split them, each group's messages go to its own partition
processor in shard mode, and their encoded reports to one ``StageProcessor``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from ccld.producers.simulator.scenario import Scenario, load_scenarios
from ccld.producers.simulator.sim import simulate
from ccld.records import COMM_COLUMN, KernelBatch, comm_group, job_partition, metrics_partition
from ccld.schemas.codec import decode_dead_letter, encode_batch
from ccld.settings import AnalyzerSettings
from ccld.streams.processor import PartitionProcessor, ProcessorOptions
from ccld.streams.stage_processor import SHARD_WAIT_S, StageProcessor

SCENARIO = Scenario.from_dict({
    "id": "stage-h1", "seed": 3, "ranks": 16, "layout": {"tp": 8, "pp": 1, "dp": 2}, "channels": 2,
    "step_time_s": 1.0, "duration_s": 100.0, "clock_skew_s": 2.0,
    "faults": [{"kind": "H1", "rank": 6, "onset_s": 40.0}], "expect": [{"kind": "H1", "rank": 6}],
})
GROUPS = 2
SUITE = Path(__file__).resolve().parents[3] / "benchmarks" / "scenarios" / "standard.jsonl"
BATCHES = list(simulate(SCENARIO))


def parts() -> list[tuple[float, int, bytes]]:
    """(time, group, message) in time order: each batch split as a producer splits it."""
    return [(t, g, encode_batch(p)) for t, b in BATCHES for g, p in sorted(b.by_group(GROUPS).items())]


def shards() -> list[PartitionProcessor]:
    return [PartitionProcessor(g, AnalyzerSettings(), options=ProcessorOptions(shard=True)) for g in range(GROUPS)]


def run(stage: StageProcessor, messages: Iterable[tuple[float, int, bytes]], *, hold: int | None = None,
        since: float = 0.0, until: float = float("inf")) -> list[str]:
    """Feed the shards and the stage; ``hold``: that shard's reports from ``since`` reach the stage
    only at ``until`` (its worker died and its partition was taken over), or never."""
    out: list[str] = []
    sh = shards()
    held: list[tuple[float, bytes]] = []
    offset = 0
    for i, (t, g, raw) in enumerate(messages):
        res = sh[g].handle(raw, topic="m", offset=i, timestamp_s=t, evaluate=True)
        assert not res.verdicts, "a shard decided a verdict itself"
        reports = [r for _, r in sh[g].take_reports()]
        if g == hold and since <= t < until:
            held.extend((t, r) for r in reports)
            continue
        deliver = [(t, r) for r in reports]
        if held and t >= until:
            deliver, held = [(t, r) for _, r in held] + deliver, []
        for tr, r in deliver:
            for v, _ in stage.handle(r, topic="r", offset=offset, recv_s=tr).verdicts:
                stage.mark_sent(v)
                out.append(f"{v.state.value}/{v.kind.value}/{v.root_cause_ranks}")
            offset += 1
    return out


def test_the_job_is_really_split_over_the_groups() -> None:
    groups = {int(g) for _, b in BATCHES for g in np.unique(comm_group(b.columns[COMM_COLUMN], GROUPS))}
    assert groups == set(range(GROUPS))


def test_shards_and_a_stage_find_the_hang_of_the_single_processor_once() -> None:
    single = PartitionProcessor(0, AnalyzerSettings())
    want = []
    for i, (t, b) in enumerate(BATCHES):
        for v, _ in single.handle(encode_batch(b), topic="m", offset=i, timestamp_s=t, evaluate=True).verdicts:
            single.mark_sent(v)
            want.append(f"{v.state.value}/{v.kind.value}/{v.root_cause_ranks}")
    got = run(StageProcessor(0, AnalyzerSettings(), groups=GROUPS), parts())
    assert "open/H1/(6,)" in want
    assert got == want


@pytest.mark.slow  # 5-10 s a case
@pytest.mark.parametrize("hold", range(GROUPS))
def test_a_late_shard_holds_the_jobs_hangs_back_instead_of_letting_victims_look_like_roots(hold: int) -> None:
    # one shard's reports stop just before the hang and come back 25 s later (its worker died, its
    # partition was taken over): meanwhile the other shard alone sees ranks missing from its stalled
    # ops that are victims waiting in the late shard's communicators. A Megatron layout (tensor,
    # pipeline and data parallel) of the standard suite, where that happens.
    sc = next(s for s in load_scenarios(SUITE) if s.id == "H1-16-002")
    batches = list(simulate(sc))
    messages = [(t, g, encode_batch(p)) for t, b in batches for g, p in sorted(b.by_group(GROUPS).items())]
    onset = sc.faults[0].onset_s
    want = [v for v in run(StageProcessor(0, AnalyzerSettings(), groups=GROUPS), messages) if v.startswith("open/")]
    assert want == ["open/H1/(2,)"]
    late = run(StageProcessor(0, AnalyzerSettings(), groups=GROUPS), messages, hold=hold, since=onset - 2.0,
               until=onset + 25.0)
    assert [v for v in late if v.startswith("open/")] == want, late


def test_a_silent_shard_no_longer_holds_back_the_jobs_hangs() -> None:
    # a job with no communicator in one group never hears from that shard: after SHARD_WAIT_S the
    # stage decides with the shards it has (here: one shard never reports at all)
    stage = StageProcessor(0, AnalyzerSettings(), groups=GROUPS + 1)
    got = run(stage, parts())
    first_h = next(i for i, v in enumerate(got) if v.startswith("open/H"))
    assert got[first_h] == "open/H1/(6,)", got
    assert BATCHES[-1][0] - BATCHES[0][0] > SHARD_WAIT_S


def test_a_bad_report_is_a_dead_letter_and_the_next_one_is_decided() -> None:
    stage = StageProcessor(3, AnalyzerSettings(), groups=GROUPS)
    out = stage.handle(b"\xc3\x01not a report", topic="r", offset=7, recv_s=1.0)
    (dl, raw), = out.dead_letters
    assert decode_dead_letter(raw).source_offset == 7 and dl.reason and stage.counters["dead_letters"] == 1
    assert run(stage, parts()).count("open/H1/(6,)") == 1


def test_a_restored_stage_sends_no_verdict_twice() -> None:
    stage = StageProcessor(0, AnalyzerSettings(), groups=GROUPS)
    messages = parts()
    before = run(stage, messages)
    assert "open/H1/(6,)" in before
    restored = StageProcessor.restore(0, AnalyzerSettings(), stage.snapshot(), groups=GROUPS)
    assert run(restored, messages) == []  # the shards report it all again; the stage knows it was sent


def test_one_flush_goes_out_as_one_message_per_group() -> None:
    b = KernelBatch.concat([b for _, b in BATCHES[:60]], producer="host-0", batch_seq=3)
    split = b.by_group(GROUPS)
    assert len(split) == GROUPS and sum(p.n for p in split.values()) == b.n


def test_rows_on_a_partition_their_group_does_not_map_to_are_counted() -> None:
    # a producer whose CCLD_ANALYSIS_GROUPS differs from the workers' sends rows where no shard expects them
    b = KernelBatch.concat([b for _, b in BATCHES[:60]], producer="host-0", batch_seq=3)
    home = job_partition(b.job, 4)
    for groups in (1, GROUPS):
        right = {metrics_partition(b.job, int(c), 4, groups) for c in np.unique(b.columns[COMM_COLUMN])}
        wrong = next(p for p in range(4) if p not in right)
        for p, expect_bad in ((wrong, b.n), (home, 0 if groups == 1 else None)):
            proc = PartitionProcessor(p, AnalyzerSettings(),
                                      options=ProcessorOptions(shard=groups > 1, partitions=4, groups=groups))
            proc.handle(encode_batch(b), topic="m", offset=0, timestamp_s=1.0)
            bad = proc.counters.get("misrouted_rows", 0)
            if expect_bad is None:  # the home partition holds group 0's rows only: the others are misrouted
                g0 = int((comm_group(b.columns[COMM_COLUMN], groups) == 0).sum())
                assert bad == b.n - g0 > 0
            else:
                assert bad == expect_bad, (groups, p)
    # split as the producer splits it, every part lands where it belongs
    for part in b.by_group(GROUPS).values():
        p = metrics_partition(part.job, part.comm_hash, 4, GROUPS)
        proc = PartitionProcessor(p, AnalyzerSettings(), options=ProcessorOptions(shard=True, partitions=4,
                                                                                   groups=GROUPS))
        proc.handle(encode_batch(part), topic="m", offset=0, timestamp_s=1.0)
        assert proc.counters.get("misrouted_rows", 0) == 0
