"""A job no one named takes its scheduler's identity (Slurm, torchrun, Kubernetes), else its launch's name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ccld.cli import main as ccld_main
from ccld.producers.attach.job_identity import LAUNCH_ENV, from_environment, launch_name, resolve

K8S = {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}


@pytest.mark.parametrize(("env", "name", "source"), [
    ({"SLURM_JOB_ID": "812"}, "slurm-812", "slurm"),
    ({"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "3"}, "slurm-812.3", "slurm"),
    ({"SLURM_JOB_ID": "812", "SLURM_STEP_ID": "4294967294"}, "slurm-812", "slurm"),  # the batch step
    ({"SLURM_JOB_ID": "815", "SLURM_ARRAY_JOB_ID": "812", "SLURM_ARRAY_TASK_ID": "3", "SLURM_STEP_ID": "0"},
     "slurm-812_3.0", "slurm"),
    ({"TORCHELASTIC_RUN_ID": "llama-7b-run4"}, "torchelastic-llama-7b-run4", "torchelastic"),
    ({"TORCHELASTIC_RUN_ID": "none", LAUNCH_ENV: "h-1"}, "h-1", "launch"),  # torchrun's default id names nothing
    ({**K8S, "JOBSET_NAME": "pretrain-js"}, "pretrain-js", "kubernetes-jobset"),
    ({**K8S, "MASTER_ADDR": "bert-ft-master-0"}, "bert-ft", "kubernetes-pytorchjob"),
    ({"MASTER_ADDR": "bert-ft-master-0", LAUNCH_ENV: "h-2"}, "h-2", "launch"),  # not on Kubernetes
    ({**K8S, "MASTER_ADDR": "10.1.2.3"}, None, None),
    ({"SLURM_JOB_ID": "9", "TORCHELASTIC_RUN_ID": "x", **K8S, "JOBSET_NAME": "j"}, "slurm-9", "slurm"),
    ({}, None, None),
])  # fmt: skip
def test_each_scheduler_in_order(env: dict[str, str], name: str | None, source: str | None) -> None:
    got = from_environment(env)
    assert (got.name, got.source) == (name, source) if got else (name, source) == (None, None)


def test_a_named_job_keeps_its_name_and_nothing_found_is_default() -> None:
    assert resolve("train-7", {"SLURM_JOB_ID": "1"}).name == "train-7"
    assert resolve("default", {"SLURM_JOB_ID": "1"}).name == "slurm-1"
    assert resolve("default", {}).name == "default"
    assert launch_name(0.0, "node-3", 77) == "node-3-19700101-000000-77"


RANK = ("import json, os; from ccld.producers.attach.job_identity import resolve; "
        "print(json.dumps(resolve(os.environ.get('CCLD_JOB', 'default'), os.environ).name))")


def _ranks(tmp_path: Path, args: list[str], export: str = "") -> tuple[int, list[str]]:
    """``ccld run`` (in this process) starting two processes, each printing the job it resolves; ``export``:
    variables the launched command sets for them (as torchrun sets its own in the ranks)."""
    tmp_path.mkdir(exist_ok=True)
    out = tmp_path / "out.txt"
    rank = f"{sys.executable} -c \"{RANK}\" >> {out}"
    script = f"{'export ' + export + '; ' if export else ''}{rank}; {rank}"
    rc = ccld_main(["run", *args, "--sink", f"jsonl:{tmp_path}", "--", "sh", "-c", script])
    return rc, [json.loads(line) for line in out.read_text().splitlines()]


def test_ccld_run_without_a_job_gives_every_process_of_the_launch_one_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    for var in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "KUBERNETES_SERVICE_HOST", LAUNCH_ENV, "CCLD_JOB"):
        monkeypatch.delenv(var, raising=False)
    rc, names = _ranks(tmp_path / "a", [])
    assert rc == 0 and len(names) == 2 and len(set(names)) == 1 and names[0] != "default", names
    assert f"this launch's name, {names[0]}" in capfd.readouterr().err
    assert LAUNCH_ENV not in __import__("os").environ  # set for the children only
    # torchrun sets its run id in the ranks, not in ccld run: the ranks take it
    rc, ranks = _ranks(tmp_path / "b", [], export="TORCHELASTIC_RUN_ID=rdzv-5")
    assert rc == 0 and ranks == ["torchelastic-rdzv-5"] * 2


def test_ccld_run_under_slurm_names_the_job_and_says_so_and_a_given_job_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_STEP_ID", "1")
    monkeypatch.delenv("CCLD_JOB", raising=False)
    rc, names = _ranks(tmp_path / "s", [])
    assert rc == 0 and names == ["slurm-4242.1"] * 2
    assert "the job is slurm-4242.1 (from slurm)" in capfd.readouterr().err
    rc, given = _ranks(tmp_path / "g", ["--job", "mine"])
    assert given == ["mine"] * 2 and "no --job" not in capfd.readouterr().err
