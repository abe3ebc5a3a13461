"""`ccld import-fr` on real gloo dumps with known faults and on hand-built NCCL dumps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fr_factory import dump, entry, healthy, write

from ccld.cli import main as ccld_main
from ccld.producers.attach.fr_convert import convert
from ccld.producers.attach.fr_load import load_dir
from ccld.producers.attach.identity import comm_hash
from ccld.producers.flight_recorder import analyse
from ccld.records import AnomalyKind, OpType, Status, Verdict, comm_hex
from ccld.settings import Settings

DATA = Path(__file__).parent / "data"
SETTINGS = Settings.load({}, job="fr")


def only(verdicts: list[Verdict]) -> Verdict:
    assert len(verdicts) == 1, [v.describe() for v in verdicts]
    return verdicts[0]


# ---- real gloo dumps (tests/unit/attach/data, written by demo_job runs) ----
def test_gloo_h1_sleeping_rank() -> None:
    v = only(analyse(DATA / "gloo_h1_sleep_rank2", SETTINGS).verdicts)
    assert v.kind is AnomalyKind.H1 and v.root_cause_ranks == (2,) and v.affected_ranks == (0, 1, 3)
    assert v.communicator == comm_hex(comm_hash([0, 1, 2, 3], "0"))  # the attachment's hash of the world


def test_gloo_h2_different_collective() -> None:
    v = only(analyse(DATA / "gloo_h2_op_rank2", SETTINGS).verdicts)
    assert v.kind is AnomalyKind.H2 and v.root_cause_ranks == (2,) and v.mismatch_field == "op_type"


def test_gloo_json_dumps_with_host_names() -> None:
    v = only(analyse(DATA / "gloo_h1_sleep_rank1_json", SETTINGS).verdicts)
    assert (v.kind, v.root_cause_ranks, v.root_cause_hosts) == (AnomalyKind.H1, (1,), ("hostA",))


def test_gloo_missing_dump_is_evidence(tmp_path: Path) -> None:
    for f in (DATA / "gloo_h1_sleep_rank2").iterdir():
        if f.name != "rank2.pkl":
            (tmp_path / f.name).write_bytes(f.read_bytes())
    result = analyse(tmp_path, SETTINGS)
    assert result.conversion is not None and result.conversion.ranks_missing == (2,)
    v = only(result.verdicts)
    assert v.kind is AnomalyKind.H1 and v.root_cause_ranks == (2,)


def test_gloo_conversion_matches_the_live_encoding() -> None:
    dumps, _ = load_dir(DATA / "gloo_h1_sleep_rank2")
    conv = convert(dumps)
    r0 = [r for r in conv.records if r.rank == 0]
    assert [r.op_seq for r in r0] == list(range(len(r0)))
    assert all(r.op_type is OpType.ALL_REDUCE and r.count == 4096 and r.comm_size == 4 for r in r0)
    assert [r.status for r in r0][-1] is Status.ENTERED  # inside the all_reduce the culprit never joined
    assert all(r.status is Status.DONE for r in conv.records if r.rank == 2)


# ---- hand-built NCCL dumps (fields gloo never fills) ----
def test_nccl_h1_started_but_one_rank_never_enqueued(tmp_path: Path) -> None:
    stuck = healthy(9) + [entry(10, state="started")]
    write(tmp_path, {0: dump(stuck), 1: dump(stuck), 2: dump(healthy(9)), 3: dump(stuck)})
    v = only(analyse(tmp_path, SETTINGS).verdicts)
    assert (v.kind, v.root_cause_ranks, v.op_seq) == (AnomalyKind.H1, (2,), 9)


def test_nccl_h2_dtype_mismatch_json(tmp_path: Path) -> None:
    def d(dtype: str) -> dict[str, object]:
        return dump(healthy(9) + [entry(10, state="started", dtype=dtype)])

    write(tmp_path, {0: d("Float"), 1: d("Half"), 2: d("Float"), 3: d("Float")}, fmt="json")
    v = only(analyse(tmp_path, SETTINGS).verdicts)
    assert (v.kind, v.root_cause_ranks, v.mismatch_field) == (AnomalyKind.H2, (1,), "dtype")


def test_nccl_p2p_send_without_a_matching_recv(tmp_path: Path) -> None:
    base = healthy(4)
    send = entry(5, name="nccl:send 0->1", state="started", is_p2p=True, p2p_seq=1, t_ms=300)
    write(tmp_path, {0: dump(base + [send], ranks=(0, 1)), 1: dump(base, ranks=(0, 1))})
    result = analyse(tmp_path, SETTINGS)
    assert result.conversion is not None
    p2p = [r for r in result.conversion.records if r.op_type is OpType.SEND]
    assert [(r.comm_rank, r.peer, r.comm_size, r.status) for r in p2p] == [(0, 1, 2, Status.ENTERED)]
    v = only(result.verdicts)
    assert v.kind.is_hang and v.root_cause_ranks == (1,)


def test_nccl_healthy_dump_has_no_verdict_and_uses_gpu_times(tmp_path: Path) -> None:
    write(tmp_path, {r: dump(healthy(20)) for r in range(4)})
    result = analyse(tmp_path, SETTINGS)
    assert result.verdicts == []
    assert result.conversion is not None
    durations = {r.t_exit_ns - r.t_enter_ns for r in result.conversion.records}
    assert durations == {3_000_000}  # created -> discovered completed (1 ms queue + 2 ms on the GPU)


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
