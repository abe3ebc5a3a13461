"""`ccld import-fr` on Flight Recorder dumps written by real gloo ranks with injected faults.

Four ranks of ``ccld.producers.attach.demo_job`` dump their Flight Recorder (pickle or JSON)
a moment after the fault; a stopped rank writes nothing (a partial set). The dumps go through
the real CLI, and the verdict must name the injected culprit and nobody else. The 8-rank
corpus with more faults is ``benchmarks/fr`` (scored by tests/unit/fr/test_corpus.py).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (pip install 'ccl-d[torch]')")

from ccld.cli import main as ccld_main  # noqa: E402
from ccld.producers.attach.localrun import launch  # noqa: E402
from ccld.producers.attach.outlets import read_jsonl  # noqa: E402
from ccld.producers.attach.run_command import prepare_env  # noqa: E402
from ccld.records import comm_hex  # noqa: E402
from ccld.settings import Settings  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.torch]

WORLD = 4
DEMO = "ccld.producers.attach.demo_job"


def run_and_dump(tmp_path: Path, args: list[str], expect_files: int, *, attach_to: Path | None = None) -> Path:
    """Run the ranks until ``expect_files`` dumps exist (then a little longer), kill them, return the dir."""
    fr = tmp_path / "fr"
    env = None
    if attach_to is not None:
        site = tmp_path / "site"
        site.mkdir()
        env = prepare_env(Settings.load({}, job="fr-live"), str(site), sink=f"jsonl:{attach_to}")
    with launch(WORLD, [DEMO, "--compute-ms", "10", "--fr-dir", str(fr), "--fr-after-s", "1.5", *args],
                tmp_path / "ranks", env=env) as job:  # fmt: skip
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and len([p for p in fr.glob("rank*") if p.suffix != ".tmp"]) < expect_files:
            if all(p.poll() is not None for p in job.procs):
                break
            time.sleep(0.2)
        time.sleep(1.0)  # a missing rank must really be missing, not late
    return fr


def import_json(fr: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[dict[str, object]], str]:
    capsys.readouterr()
    rc = ccld_main(["import-fr", str(fr), "--json"])
    out, err = capsys.readouterr()
    return rc, [json.loads(line) for line in out.splitlines() if line.strip()], err


def test_h1_sleeping_rank_pickle_dumps_and_live_hashes_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    live = tmp_path / "live"
    fr = run_and_dump(tmp_path, ["--fault", "sleep", "--culprit", "1", "--at-step", "6"], WORLD, attach_to=live)
    assert sorted(p.name for p in fr.iterdir()) == [f"rank{r}.pkl" for r in range(WORLD)]
    rc, verdicts, err = import_json(fr, capsys)
    assert rc == 0, err
    [v] = verdicts
    assert (v["kind"], v["root_cause_ranks"], v["op_seq"]) == ("H1", [1], 7), err  # step 6: the 7th all_reduce
    # the importer names the communicator exactly as the live attachment hashed it; its op_seq is
    # Flight Recorder's collective_seq_id, which counts the same ops from 1 (the live one from 0)
    records = list(read_jsonl(sorted(live.glob("*.jsonl"))))
    assert {comm_hex(r.comm_hash) for r in records} == {v["communicator"]}
    assert max(r.op_seq for r in records if r.rank == 0) + 1 == v["op_seq"]


def test_h2_different_collective_json_dumps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fr = run_and_dump(tmp_path, ["--fault", "op", "--culprit", "3", "--at-step", "6", "--fr-json"], WORLD)
    assert len(list(fr.glob("*.json"))) == WORLD
    rc, verdicts, err = import_json(fr, capsys)
    assert rc == 0, err
    [v] = verdicts
    assert (v["kind"], v["root_cause_ranks"], v["mismatch_field"]) == ("H2", [3], "op_type"), err


def test_sigstopped_rank_leaves_a_partial_dump_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fr = run_and_dump(tmp_path, ["--fault", "stop", "--culprit", "2", "--at-step", "6"], WORLD - 1)
    assert sorted(p.name for p in fr.iterdir()) == ["rank0.pkl", "rank1.pkl", "rank3.pkl"]
    rc, verdicts, err = import_json(fr, capsys)
    assert rc == 0 and "missing: 2" in err, err
    [v] = verdicts
    assert (v["kind"], v["root_cause_ranks"]) == ("H1", [2]), err


def test_a_healthy_run_has_no_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fr = run_and_dump(tmp_path, ["--steps", "40"], WORLD)
    rc, verdicts, err = import_json(fr, capsys)
    assert rc == 0 and verdicts == [], err
