"""`ccld import-fr` on real 4-rank gloo dumps with known faults and on hand-built NCCL dumps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fr_factory import dump, entry, healthy, write

from ccld.cli import main as ccld_main
from ccld.identity import comm_hash
from ccld.records import AnomalyKind, Verdict, comm_hex
from ccld.streams.flight_recorder.import_fr_command import ImportResult, analyse

DATA = Path(__file__).parent / "data"


def only(result: ImportResult) -> Verdict:
    assert result.diagnosis is not None
    vs = result.diagnosis.verdicts
    assert len(vs) == 1, [v.describe() for v in vs]
    return vs[0]


# ---- real gloo dumps (tests/unit/attach/data, written by demo_job runs)
def test_gloo_h1_sleeping_rank() -> None:
    v = only(analyse(DATA / "gloo_h1_sleep_rank2"))
    assert v.kind is AnomalyKind.H1 and v.root_cause_ranks == (2,) and v.affected_ranks == (0, 1, 3)
    assert v.communicator == comm_hex(comm_hash([0, 1, 2, 3], "0"))  # the attachment's hash of the world
    assert v.details["fr_seq_id"] == "6" and v.op_seq == 6  # Flight Recorder numbering (the live one counts from 0)


def test_gloo_h2_different_collective() -> None:
    v = only(analyse(DATA / "gloo_h2_op_rank2"))
    assert v.kind is AnomalyKind.H2 and v.root_cause_ranks == (2,) and v.mismatch_field == "op_type"


def test_gloo_json_dumps_with_host_names() -> None:
    v = only(analyse(DATA / "gloo_h1_sleep_rank1_json"))
    assert (v.kind, v.root_cause_ranks, v.root_cause_hosts) == (AnomalyKind.H1, (1,), ("hostA",))


def test_gloo_missing_dump_is_evidence(tmp_path: Path) -> None:
    for f in (DATA / "gloo_h1_sleep_rank2").iterdir():
        if f.name != "rank2.pkl":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    result = analyse(tmp_path, world_size=4)
    assert result.dumps is not None and result.dumps.missing == (2,)
    v = only(result)
    assert v.kind is AnomalyKind.H1 and v.root_cause_ranks == (2,) and "wrote no dump" in v.evidence


# ---- hand-built NCCL dumps (fields gloo never fills)
def test_nccl_h1_started_but_one_rank_never_enqueued(tmp_path: Path) -> None:
    stuck = healthy(9) + [entry(10, state="started")]
    write(tmp_path, {0: dump(stuck), 1: dump(stuck), 2: dump(healthy(9)), 3: dump(stuck)})
    v = only(analyse(tmp_path))
    assert (v.kind, v.root_cause_ranks, v.details["fr_seq_id"]) == (AnomalyKind.H1, (2,), "10")


def test_nccl_h2_dtype_mismatch_json(tmp_path: Path) -> None:
    def d(dtype: str) -> dict[str, object]:
        return dump(healthy(9) + [entry(10, state="started", dtype=dtype)])

    write(tmp_path, {0: d("Float"), 1: d("Half"), 2: d("Float"), 3: d("Float")}, fmt="json")
    v = only(analyse(tmp_path))
    assert (v.kind, v.root_cause_ranks, v.mismatch_field) == (AnomalyKind.H2, (1,), "dtype")


def test_nccl_healthy_dump_has_no_verdict(tmp_path: Path) -> None:
    write(tmp_path, {r: dump(healthy(20)) for r in range(4)})
    result = analyse(tmp_path)
    assert result.diagnosis is not None and result.diagnosis.verdicts == [] and result.dumps is not None
    assert result.dumps.timing and all(not s.blocking for s in result.dumps.ranks.values())


def test_cli_json_output_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stuck = healthy(9) + [entry(10, state="started")]
    write(tmp_path, {0: dump(stuck), 1: dump(stuck), 3: dump(stuck)})
    (tmp_path / "nccl_trace_rank_2").write_bytes(b"not a dump")
    rc = ccld_main(["import-fr", str(tmp_path), "--json"])
    out, err = capsys.readouterr()
    assert rc == 1  # analysed, but one file was unusable
    assert "nccl_trace_rank_2" in err and "missing: 2" in err
    [line] = out.strip().splitlines()
    v = json.loads(line)
    assert v["kind"] == "H1" and v["root_cause_ranks"] == [2]


def test_cli_empty_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert ccld_main(["import-fr", str(tmp_path)]) == 2
    assert "no usable" in capsys.readouterr().err
