"""A hang found from a restored state alone: the job went silent, nothing is re-read after the restart.

The worker commits its input once a snapshot covers it, so the snapshot must keep what the hang is
found from (stalled communicators' newest rows): the restored analyzer finds the same incident (id,
onset, op, culprit) as an analyzer that was never stopped, and a healthy job adds nothing to it.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from ccld.producers.simulator.scenario import Scenario
from ccld.producers.simulator.sim import simulate
from ccld.records import KernelBatch, Verdict
from ccld.streams.analysis import analyzer as analyzer_module
from ccld.streams.analysis.analyzer import Analyzer
from ccld.streams.analysis.sharded import ShardedAnalyzer

SILENT_AT = 23.0  # the job's records stop here (the op of 20 s is stuck: rank 5 never enters it)


@cache
def _batches(fault: bool, ranks: int = 8, duration_s: float = 60.0) -> list[tuple[float, KernelBatch]]:
    """The chaos tests' job (tests/chaos/chaoslib.py ``scenario_batches``): 1-s steps, rank 5 hangs at 20 s."""
    f = {"kind": "H1", "rank": 5, "onset_s": 20.0}
    sc = Scenario.from_dict({
        "id": "silent-h1", "seed": 5, "ranks": ranks, "layout": {"tp": 4, "pp": 1, "dp": ranks // 4},
        "channels": 2, "step_time_s": 1.0, "duration_s": duration_s, "clock_skew_s": 2.0, "jitter": 0.02,
        "faults": [f] if fault else [], "expect": [{"kind": "H1", "rank": 5}] if fault else [],
    })
    return list(simulate(sc))


def _feed(a: Analyzer | ShardedAnalyzer, batches: list[tuple[float, KernelBatch]], until: float,
          start: float = 0.0) -> tuple[list[Verdict], float]:
    """Ingest the batches before ``until`` with an evaluation every second; then the clock runs on alone."""
    out: list[Verdict] = []
    tick = start + 1.0
    for t, b in batches:
        if t >= until:
            break
        while t >= tick:
            out.extend(a.evaluate(tick))
            tick += 1.0
        a.ingest(b, t)
    return out, tick


def _run_on(a: Analyzer | ShardedAnalyzer, start: float, end: float = 70.0) -> list[Verdict]:
    out: list[Verdict] = []
    t = start
    while t <= end:
        out.extend(a.evaluate(t))
        t += 1.0
    return out


def _h1(vs: list[Verdict]) -> Verdict:
    found = [v for v in vs if v.kind.value == "H1" and v.state.value == "open"]
    assert len(found) == 1, vs
    return found[0]


def _same(a: Verdict, b: Verdict) -> None:
    assert (a.incident_id, a.onset_time, a.op_seq, a.root_cause_ranks, a.communicator) == \
        (b.incident_id, b.onset_time, b.op_seq, b.root_cause_ranks, b.communicator)


def _roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state, separators=(",", ":")))
    return out


def test_a_silent_hung_job_is_found_from_the_restored_state_alone() -> None:
    batches = _batches(True)
    uninterrupted = Analyzer()
    before, tick = _feed(uninterrupted, batches, SILENT_AT)
    assert not before
    before += uninterrupted.evaluate(tick)  # the worker's timer: the last records are applied
    state = _roundtrip(uninterrupted.state_dict())
    assert state.get("stalled"), "the stalled communicators were not saved"
    ref = _h1(before + _run_on(uninterrupted, tick + 1.0))
    assert ref.root_cause_ranks == (5,)
    restored = Analyzer.from_state_dict(state)
    _same(_h1(_run_on(restored, tick + 1.0)), ref)


def test_a_restored_hang_is_the_uninterrupted_verdict_at_the_same_time_to_the_letter() -> None:
    batches = _batches(True)
    a = Analyzer()
    _, tick = _feed(a, batches, SILENT_AT)
    a.evaluate(tick)
    restored = Analyzer.from_state_dict(_roundtrip(a.state_dict()))
    times = [v.to_dict() for v in _run_on(a, tick + 1.0)]
    assert times and times == [v.to_dict() for v in _run_on(restored, tick + 1.0)]


def test_an_old_snapshot_without_stalled_rows_still_restores() -> None:
    a = Analyzer()
    _, tick = _feed(a, _batches(True), SILENT_AT)
    a.evaluate(tick)
    state = _roundtrip(a.state_dict())
    del state["stalled"]  # written before stalled rows were kept: the hang is lost, nothing crashes
    assert not _run_on(Analyzer.from_state_dict(state), tick + 1.0)


def test_a_healthy_job_adds_nothing_to_the_state() -> None:
    a = Analyzer()
    _, tick = _feed(a, _batches(False, ranks=64), 40.0)
    a.evaluate(tick)
    state = a.state_dict()
    assert "stalled" not in state and a.stats["stalls_unsaved"] == 0


def test_stalled_rows_are_capped_newest_stalls_first(monkeypatch: pytest.MonkeyPatch) -> None:
    a = Analyzer()
    _, tick = _feed(a, _batches(True, ranks=16), SILENT_AT)
    a.evaluate(tick)
    full = a.state_dict()["stalled"]
    n_comms = sum(len(j["comms"]) for j in full.values())
    assert n_comms > 1
    assert getattr(analyzer_module, "STALL_ROWS_STATE_MAX", 0) >= 8192  # an 8,192-rank world group fits
    monkeypatch.setattr(analyzer_module, "STALL_ROWS_STATE_MAX", 4)
    cut = a.state_dict()
    kept = sum(len(j["comms"]) for j in cut.get("stalled", {}).values())
    assert kept < n_comms and a.stats["stalls_unsaved"] == n_comms - kept


def test_a_restarted_shard_finds_the_silent_hang_again() -> None:
    batches = _batches(True, ranks=16)
    uninterrupted = ShardedAnalyzer(3)
    before, tick = _feed(uninterrupted, batches, SILENT_AT)
    before += uninterrupted.evaluate(tick)
    restarted = ShardedAnalyzer(3)
    restarted.shards = [Analyzer.from_state_dict(_roundtrip(sh.state_dict()), restarted.settings)
                        for sh in uninterrupted.shards]
    restarted.stage.book.load(_roundtrip(uninterrupted.stage.book.state_dict()))
    ref = _h1(before + _run_on(uninterrupted, tick + 1.0))
    assert ref.root_cause_ranks == (5,)
    _same(_h1(_run_on(restarted, tick + 1.0)), ref)



def test_unreadable_stalled_rows_lose_only_themselves() -> None:
    a = Analyzer()
    _, tick = _feed(a, _batches(True), SILENT_AT)
    a.evaluate(tick)
    state = _roundtrip(a.state_dict())
    (job,) = state["stalled"]
    state["stalled"][job]["comms"][0]["m_seq"] = [1, 2]  # not one value per member
    restored = Analyzer.from_state_dict(state)
    assert not restored.jobs and restored.stats["records"] == a.stats["records"]


@pytest.mark.parametrize("groups", [1, 3], ids=["whole", "sharded"])
def test_an_incident_open_when_its_job_ended_closes_after_a_restart_that_reads_nothing_more(groups: int) -> None:
    """A slow rank until the job's end, the worker restarted after its last record (the snapshot covers them
    all, so nothing is re-read): the incident closes on the job's silence as it does without the restart, at the
    same time; it is not left open for ever (an alert that never resolves)."""
    sc = Scenario.from_dict({
        "id": "slow-to-the-end", "seed": 5, "ranks": 8, "layout": {"tp": 4, "pp": 1, "dp": 2}, "channels": 2,
        "step_time_s": 1.0, "duration_s": 60.0, "jitter": 0.02,
        "faults": [{"kind": "S1", "rank": 5, "onset_s": 10.0, "factor": 3.0}], "expect": [{"kind": "S1", "rank": 5}],
    })
    batches = list(simulate(sc))

    def run(restart: bool) -> list[tuple[str, str, float]]:
        a: Analyzer | ShardedAnalyzer = Analyzer() if groups == 1 else ShardedAnalyzer(groups)
        out, tick = _feed(a, batches, until=float("inf"))
        out += a.evaluate(tick)
        if restart and isinstance(a, Analyzer):
            a = Analyzer.from_state_dict(_roundtrip(a.state_dict()))
        elif restart and isinstance(a, ShardedAnalyzer):  # shards restored as the workers restore them
            b = ShardedAnalyzer(groups)
            b.shards = [Analyzer.from_state_dict(_roundtrip(sh.state_dict()), b.settings, whole_jobs=False)
                        for sh in a.shards]
            b.stage.book.load(_roundtrip(a.stage.book.state_dict()))
            a = b
        out += _run_on(a, tick + 1.0, end=tick + 150.0)
        return [(v.state.value, v.kind.name, round(v.detected_time, 1)) for v in out]

    whole = run(restart=False)
    assert [s for s, _, _ in whole] == ["open", "closed"], whole
    assert run(restart=True) == whole
