"""`ccld import-fr` rules on small hand-made dumps: one test per rule of the Flight Recorder format."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from frdumps import done, dump, op, write

from ccld.cli import main as ccld_main
from ccld.fr_dump.model import normalise_op
from ccld.records import AnomalyKind, Verdict
from ccld.streams.flight_recorder.import_fr_command import ImportResult, analyse

W4 = {"0": [0, 1, 2, 3]}


def run(tmp_path: Path, dumps: dict[int, dict[str, Any]], fmt: str = "json", **kw: Any) -> ImportResult:
    return analyse(write(tmp_path / "dumps", dumps, fmt=fmt), **kw)


def verdicts(result: ImportResult) -> list[Verdict]:
    assert result.diagnosis is not None
    return result.diagnosis.verdicts


def only(result: ImportResult) -> Verdict:
    vs = verdicts(result)
    assert len(vs) == 1, [v.describe() for v in vs]
    return vs[0]


# ---- a missing entry: completed when seq <= last completed, never entered only when seq > last enqueued
def test_active_only_dump_missing_entry_is_completed_not_never_entered(tmp_path: Path) -> None:
    # ranks 1-3 completed #5 (their entries are gone from an active-only dump) and wait in #6;
    # rank 0 still has #5 open: it stalled inside #5 (rank-local H3), no one "never entered"
    blocked6 = [op("0", 6)]
    dumps = {0: dump(0, W4, [op("0", 5), op("0", 6)], {"0": (6, 4)})}
    dumps |= {r: dump(r, W4, blocked6, {"0": (6, 5)}) for r in (1, 2, 3)}
    v = only(run(tmp_path, dumps))
    assert (v.kind, v.root_cause_ranks, v.details["fr_seq_id"], v.op_seq) == (AnomalyKind.H3, (0,), "5", 5)
    assert v.affected_ranks == (1, 2, 3) and "completed it" in v.evidence and v.link is None


def test_empty_dump_of_a_live_rank_that_never_enqueued(tmp_path: Path) -> None:
    # rank 2's active-only dump is empty: it completed #4 and never enqueued #5, which the others wait in
    dumps = {r: dump(r, W4, [op("0", 5)], {"0": (5, 4)}) for r in (0, 1, 3)}
    dumps[2] = dump(2, W4, [], {"0": (4, 4)})
    v = only(run(tmp_path, dumps))
    assert (v.kind, v.root_cause_ranks, v.details["fr_seq_id"], v.affected_ranks) == (
        AnomalyKind.H1,
        (2,),
        "5",
        (0, 1, 3),
    )
    assert "never enqueued" in v.evidence and "#4" in v.evidence


def test_a_dump_that_knows_nothing_is_not_read_as_never_entered(tmp_path: Path) -> None:
    dumps = {r: dump(r, W4, [op("0", 5)], {"0": (5, 4)}) for r in (0, 1, 3)}
    dumps[2] = {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": []}
    v = only(run(tmp_path, dumps))
    assert v.root_cause_ranks == (2,) and "no entries and no pg_status" in v.evidence
    assert "never enqueued" not in v.evidence and v.confidence < 0.9


def test_pg_status_is_keyed_by_local_pg_id_not_by_group_name(tmp_path: Path) -> None:
    # groups "0" (world) and "7" ({0,1}); rank 1's dump is empty: its local pg 1 is group "7"
    groups = {"0": [0, 1, 2, 3], "7": [0, 1]}
    dumps = {0: dump(0, groups, [op("7", 3)], {"0": (9, 9), "7": (3, 2)})}
    dumps[1] = dump(1, groups, [], {"0": (9, 9), "7": (2, 2)})
    dumps |= {r: dump(r, groups, [], {"0": (9, 9)}) for r in (2, 3)}
    assert dumps[1]["pg_status"].keys() == {"0", "1"}  # keyed by local id
    v = only(run(tmp_path, dumps))
    assert (v.kind, v.root_cause_ranks, v.details["fr_seq_id"]) == (AnomalyKind.H1, (1,), "3")


def test_pg_status_keys_map_past_unused_groups_by_other_members_ids(tmp_path: Path) -> None:
    # group "1" is created by every rank and never used: it takes local id 1 but is in no
    # pg_config, so local id i is not the i-th configured group. Rank 3 holds the GIL: it never
    # enqueued all_to_all #5 of group "4" and has no entry left (active-only). Its key "2" is tp
    # group "3" (9 completed), its key "3" the expert group "4" (#4 completed). Read as the i-th
    # configured group, key "2" would be group "4" with #9 completed: the others would seem to
    # wait in an op rank 3 finished.
    groups = {"0": [0, 1, 2, 3], "1": [0, 1, 2, 3], "2": [0, 1], "3": [2, 3], "4": [0, 1, 2, 3]}
    a2a = [op("4", 5, "all_to_all")]
    dumps = {r: dump(r, groups, a2a, {"0": (5, 5), "2": (9, 9), "4": (5, 4)}, unused=("1",)) for r in (0, 1)}
    dumps[2] = dump(2, groups, a2a, {"0": (5, 5), "3": (9, 9), "4": (5, 4)}, unused=("1",))
    dumps[3] = dump(3, groups, [], {"0": (5, 5), "3": (9, 9), "4": (4, 4)}, unused=("1",))
    assert dumps[3]["pg_status"].keys() == {"0", "2", "3"} and "1" not in dumps[3]["pg_config"]
    result = run(tmp_path, dumps)
    assert result.dumps is not None
    assert result.dumps.ranks[3].enqueued == {"0": 5, "3": 9, "4": 4}
    v = only(result)
    assert (v.kind, v.root_cause_ranks, v.affected_ranks, v.op_seq) == (AnomalyKind.H1, (3,), (0, 1, 2), 5)
    assert "never enqueued" in v.evidence and "#4" in v.evidence
    assert not [n for n in result.dumps.notes if "matches no process group" in n]


def test_pg_status_key_with_two_candidates_is_reported_not_guessed(tmp_path: Path) -> None:
    # rank 3 has no entries; its keys "3" and "4" are groups "3" and "4" (unused "1" shifts them),
    # and nothing tells which is which: both are noted with their candidates, neither is guessed,
    # and whether rank 3 entered the op the others wait in is unknown, not "never"
    groups = {"0": [0, 1, 2, 3], "1": [0, 1, 2, 3], "2": [0, 1], "3": [2, 3], "4": [0, 1, 2, 3]}
    dumps = {r: dump(r, groups, [op("0", 6)], {"0": (6, 5)}, unused=("1",)) for r in (0, 1, 2)}
    dumps[3] = dump(3, groups, [], {"0": (5, 5), "3": (2, 2), "4": (2, 2)}, unused=("1",))
    result = run(tmp_path, dumps)
    assert result.dumps is not None
    notes = [n for n in result.dumps.notes if "matches no process group" in n]
    assert len(notes) == 2 and all("one of groups 3, 4" in n for n in notes), notes
    assert result.dumps.ranks[3].entered("4", 3) is None and result.dumps.ranks[3].entered("0", 6) is False
    v = only(result)
    assert v.root_cause_ranks == (3,) and "never enqueued" in v.evidence  # the world group's status is mapped


def test_pg_status_keys_map_by_progress(tmp_path: Path) -> None:
    # hashed group names (no creation order), an unused group, rank 3 without entries: key "3" can
    # be group "g-tp" or "g-ep" by membership, but rank 2 completed g-ep #7, so rank 3's key with
    # last enqueued #2 cannot be g-ep; the other key is
    groups = {"0": [0, 1, 2, 3], "g-unused": [0, 1, 2, 3], "g-tp": [2, 3], "g-ep": [0, 1, 2, 3]}
    order = ["0", "g-unused", "g-tp", "g-ep"]
    dumps = {}
    for r in range(4):
        d = dump(r, {"0": groups["0"]}, [], {})
        mine = [g for g in order if r in groups[g]]
        local = {g: i for i, g in enumerate(mine)}
        d["pg_config"] = {g: {"name": g, "desc": "default_pg" if g == "0" else "undefined",
                              "ranks": json.dumps(groups[g])} for g in order if g != "g-unused"}  # fmt: skip
        st = {"0": (5, 5), "g-ep": (8, 7)} if r < 3 else {"0": (5, 5), "g-tp": (2, 2), "g-ep": (7, 7)}
        st |= {"g-tp": (2, 2)} if r == 2 else {}
        d["pg_status"] = {str(local[g]): {"last_enqueued_collective": e, "last_started_collective": -1,
                                          "last_completed_collective": c} for g, (e, c) in st.items()}  # fmt: skip
        if r < 3:
            e = op("g-ep", 8, "all_to_all")
            d["entries"] = [dict(e, record_id=0, pg_id=local["g-ep"])]
            d["entries"].insert(0, dict(op("g-ep", 7, "all_to_all", state="completed"), record_id=0,
                                        pg_id=local["g-ep"]))  # fmt: skip
            d["entries"][1]["record_id"] = 1
        dumps[r] = d
    result = run(tmp_path, dumps)
    assert result.dumps is not None
    assert result.dumps.ranks[3].enqueued == {"0": 5, "g-tp": 2, "g-ep": 7}
    v = only(result)
    assert (v.kind, v.root_cause_ranks, v.op_seq) == (AnomalyKind.H1, (3,), 8)


# ---- a rank is blocked at its oldest unfinished entry
def test_oldest_unfinished_entry_blocks_later_ones_are_queued(tmp_path: Path) -> None:
    groups = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [0, 2]}
    # rank 0: dp op #3 of group 2 (older) then tp op #8 of group 1, both open: it is blocked in group 2
    dumps = {0: dump(0, groups, [op("2", 3), op("1", 8)], {"2": (3, 2), "1": (8, 7), "0": (4, 4)})}
    dumps[1] = dump(1, groups, [op("1", 8)], {"1": (8, 7), "0": (4, 4)})
    dumps[2] = dump(2, groups, [], {"2": (2, 2), "0": (4, 4)})  # never enqueued dp #3
    dumps[3] = dump(3, groups, [], {"0": (4, 4)})
    result = run(tmp_path, dumps)
    assert result.dumps is not None and result.diagnosis is not None
    assert [o.group for o in result.dumps.ranks[0].blocking] == ["2"]
    v = only(result)
    assert (v.kind, v.root_cause_ranks, v.affected_ranks) == (AnomalyKind.H1, (2,), (0, 1))
    # rank 0 waits only in its blocking op: no edge from rank 0 in group 1
    assert {(e.src, e.group) for e in result.diagnosis.edges if e.src == 0} == {(0, "2")}


# ---- p2p: per-rank counters, group-local peers, never paired, never "never entered"
def test_p2p_gives_an_edge_to_the_peer_in_global_ranks_and_is_never_paired(tmp_path: Path) -> None:
    groups = {"0": [0, 1, 2, 3], "5": [1, 3]}
    # rank 1 waits in "send 0->1" of group 5 (peer: global rank 3); its p2p_seq_id 4 and rank 3's
    # recv p2p_seq_id 9 mean nothing to each other. Rank 3 has no open op.
    dumps = {1: dump(1, groups, [op("5", 0, "send 0->1", p2p_seq=4)], {"0": (2, 2)})}
    dumps[3] = dump(3, groups, [op("5", 0, "recv 1<-0", p2p_seq=9, state="completed", retired=True)], {"0": (2, 2)})
    dumps |= {r: dump(r, groups, [], {"0": (2, 2)}) for r in (0, 2)}
    result = run(tmp_path, dumps)
    assert result.diagnosis is not None
    assert [(e.src, e.dst, e.why) for e in result.diagnosis.edges] == [(1, 3, "p2p")]
    v = only(result)
    assert v.root_cause_ranks == (3,) and v.affected_ranks == (1,)
    text = v.evidence.lower()
    assert "never" not in text and "matched" not in text and "pair" not in text


def test_p2p_deadlock_between_two_senders_is_one_incident(tmp_path: Path) -> None:
    groups = {"0": [0, 1], "1": [0, 1]}
    dumps = {
        0: dump(0, groups, [op("1", 0, "send 0->1", p2p_seq=1)]),
        1: dump(1, groups, [op("1", 0, "send 1->0", p2p_seq=1)]),
    }
    v = only(run(tmp_path, dumps))
    assert v.kind is AnomalyKind.H2 and v.root_cause_ranks == () and v.affected_ranks == (0, 1)


# ---- variable-size ops differ between ranks on purpose
def test_all_to_all_sizes_differ_without_an_h2(tmp_path: Path) -> None:
    dumps = {
        r: dump(r, W4, done("0", 4) + [op("0", 5, "all_to_all", numel=100 + 37 * r, out_numel=90 + r)])
        for r in range(4)
    }
    v = only(run(tmp_path, dumps))
    assert v.kind is AnomalyKind.H3 and v.root_cause_ranks == () and v.mismatch_field is None


def test_all_reduce_count_mismatch_is_an_h2_on_the_minority(tmp_path: Path) -> None:
    dumps = {r: dump(r, W4, done("0", 4) + [op("0", 5, numel=512 if r == 1 else 1024)]) for r in range(4)}
    v = only(run(tmp_path, dumps))
    assert (v.kind, v.root_cause_ranks, v.mismatch_field) == (AnomalyKind.H2, (1,), "count")


# ---- op names
def test_all_gather_base_and_friends_are_known() -> None:
    for name, canon in [("nccl:_all_gather_base", "all_gather"), ("gloo:all_gather", "all_gather"),
                        ("nccl:_reduce_scatter_base", "reduce_scatter"), ("nccl:coalesced", "coalesced"),
                        ("nccl:all_gather_into_tensor_coalesced", "all_gather"), ("nccl:send 0->1", "send"),
                        ("nccl:ALLGATHER_coalesced", "all_gather"), ("gloo:all_to_all", "all_to_all")]:  # fmt: skip
        assert normalise_op(name)[0::2] == (canon, True), name
    assert normalise_op("nccl:frobnicate")[2] is False


def test_unknown_op_names_are_counted_listed_and_still_analysed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dumps = {r: dump(r, W4, [op("0", 5, "frobnicate")], {"0": (5, 4)}) for r in (0, 1, 3)}
    dumps[2] = dump(2, W4, [op("0", 4, "frobnicate", state="completed", retired=True)], {"0": (4, 4)})
    result = run(tmp_path, dumps)
    assert result.dumps is not None and result.dumps.unknown_ops == {"nccl:frobnicate": 4}
    assert only(result).root_cause_ranks == (2,)  # the unknown op still orders the ranks
    assert ccld_main(["import-fr", str(tmp_path / "dumps")]) == 0
    assert "4 entries with unknown operation names" in capsys.readouterr().err


# ---- no invented facts
_DURATION = re.compile(r"\b\d+(\.\d+)?\s*(s|ms|seconds?)\b")


@pytest.mark.parametrize("timing", [False, True])
def test_no_duration_or_counter_is_claimed(tmp_path: Path, timing: bool) -> None:
    extra = {"time_discovered_started_ns": 5, "state": "started"} if timing else {}
    dumps = {r: dump(r, W4, [dict(op("0", 5), **extra)], {"0": (5, 4)}) for r in (0, 1, 3)}
    dumps[2] = dump(2, W4, [], {"0": (4, 4)})
    v = only(run(tmp_path, dumps))
    assert not _DURATION.search(v.evidence) and "frozen" not in v.evidence
    assert "no dump time" in v.evidence and v.onset_time == 0.0 and v.details["clock"] == "none"
    assert v.link is None and v.channel is None


# ---- missing dumps, gloo
def test_a_rank_without_a_dump_that_others_wait_on_is_the_root(tmp_path: Path) -> None:
    dumps = {r: dump(r, W4, [op("0", 5)], {"0": (5, 4)}) for r in (0, 1, 3)}
    result = run(tmp_path, dumps, fmt="pickle")
    v = only(result)
    assert v.root_cause_ranks == (2,) and "wrote no dump" in v.evidence and "whether it entered" in v.evidence


def test_gloo_peers_finished_an_op_without_the_rank_that_left(tmp_path: Path) -> None:
    # gloo retires a failed op: ranks 0,1,3 "finished" #5, which rank 2 never enqueued
    dumps = {r: dump(r, W4, done("0", 5, backend="gloo"), {"0": (5, 5)}, gloo=True) for r in (0, 1, 3)}
    dumps[2] = dump(2, W4, done("0", 4, backend="gloo"), {"0": (4, 4)}, gloo=True)
    v = only(run(tmp_path, dumps, fmt="json.gz"))
    assert (v.kind, v.root_cause_ranks, v.op_seq) == (AnomalyKind.H1, (2,), 5) and "failed without rank 2" in v.evidence


def test_gloo_snapshot_of_a_running_job_is_no_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dumps = {r: dump(r, W4, done("0", 4, backend="gloo") + [op("0", 5, backend="gloo")], {"0": (5, 4)}, gloo=True)
             for r in range(4)}  # fmt: skip
    result = run(tmp_path, dumps)
    assert verdicts(result) == [] and result.diagnosis is not None and result.diagnosis.live
    assert ccld_main(["import-fr", str(tmp_path / "dumps"), "--json"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "running job" in err


def test_json_output_one_verdict_per_line_and_bad_files_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dumps = {r: dump(r, W4, [op("0", 5)], {"0": (5, 4)}) for r in (0, 1, 3)}
    d = write(tmp_path / "dumps", dumps)
    (d / "nccl_trace_rank_2.json").write_text("not a dump")
    (d / "README.md").write_text("notes")
    assert ccld_main(["import-fr", str(d), "--json"]) == 1
    out, err = capsys.readouterr()
    [line] = out.splitlines()
    assert json.loads(line)["root_cause_ranks"] == [2]
    assert "nccl_trace_rank_2.json" in err and "missing: 2" in err and "skipped" in err and "README.md" in err


def test_gloo_ranks_waiting_in_unrecorded_recv_on_a_stuck_stage_are_victims(tmp_path: Path) -> None:
    # A dense pipeline on gloo, which records no send/recv. Rank 3 (stage 1) stops after tp
    # all_reduce #4 of group 2: its partner rank 2 waits in #5. Ranks 0,1 (stage 0) finished
    # their forward and wait in an unrecorded recv of the gradients stage 1 never sends; their
    # tp partner (each other) stands with them, and ranks 4,5 of the other data-parallel replica
    # wait on them in the dp all_reduce. Rank 3 is the root; 0 and 1 are its victims.
    groups = {"0": list(range(6)), "1": [0, 1], "2": [2, 3], "3": [4, 5], "4": [0, 4], "5": [1, 5]}

    def g(group: str, upto: int) -> list[dict[str, Any]]:
        return [op(group, s, backend="gloo", retired=True) for s in range(1, upto + 1)]

    dumps = {
        0: dump(0, groups, g("4", 2) + g("1", 4), {"4": (2, 2), "1": (4, 4)}, gloo=True),
        1: dump(1, groups, g("5", 2) + g("1", 4), {"5": (2, 2), "1": (4, 4)}, gloo=True),
        2: dump(2, groups, g("2", 4) + [op("2", 5, backend="gloo")], {"2": (5, 4)}, gloo=True),
        3: dump(3, groups, g("2", 4), {"2": (4, 4)}, gloo=True),
        4: dump(4, groups, g("3", 4) + g("4", 2) + [op("4", 3, backend="gloo")], {"3": (4, 4), "4": (3, 2)}, gloo=True),
        5: dump(5, groups, g("3", 4) + g("5", 2) + [op("5", 3, backend="gloo")], {"3": (4, 4), "5": (3, 2)}, gloo=True),
    }  # fmt: skip
    result = run(tmp_path, dumps)
    v = only(result)
    assert (v.kind, v.root_cause_ranks) == (AnomalyKind.H1, (3,))
    assert {0, 1, 2, 4, 5} <= set(v.affected_ranks)
    assert result.diagnosis is not None and any("no recorded op" in n for n in result.diagnosis.notes)


def test_gloo_idle_ranks_stay_roots_when_none_stopped_before_its_partners(tmp_path: Path) -> None:
    # two idle gloo ranks that others wait on, neither leaving the partners of its last op behind:
    # nothing says which waits on which, so both stay named (no rank is demoted on a guess)
    groups = {"0": [0, 1, 2, 3], "1": [0, 1], "2": [2, 3], "3": [0, 2], "4": [1, 3]}

    def g(group: str, upto: int) -> list[dict[str, Any]]:
        return [op(group, s, backend="gloo", retired=True) for s in range(1, upto + 1)]

    dumps = {
        0: dump(0, groups, g("3", 1) + g("1", 2), {"3": (1, 1), "1": (2, 2)}, gloo=True),
        1: dump(1, groups, g("4", 1) + g("1", 2), {"4": (1, 1), "1": (2, 2)}, gloo=True),
        2: dump(2, groups, g("2", 2) + g("3", 1) + [op("3", 2, backend="gloo")], {"2": (2, 2), "3": (2, 1)}, gloo=True),
        3: dump(3, groups, g("2", 2) + g("4", 1) + [op("4", 2, backend="gloo")], {"2": (2, 2), "4": (2, 1)}, gloo=True),
    }  # fmt: skip
    vs = verdicts(run(tmp_path, dumps))
    assert sorted(r for v in vs for r in v.root_cause_ranks) == [0, 1]
