"""Which job a rank belongs to when no one named it: the identity its scheduler gave the job, shared by every rank.

The analyzer, ``ccld status`` and the archive key everything by job, so two jobs launched without ``--job``
must not share a name, and the ranks of one job on several nodes (each node starting its own ``ccld run``)
must share one. A job named explicitly (``--job``, ``CCLD_JOB``, ``--set job=...``: any name but the default
``default``) keeps its name. Otherwise, the first of:

1. **Slurm**: ``slurm-<SLURM_JOB_ID>`` (an array task: ``slurm-<SLURM_ARRAY_JOB_ID>_<SLURM_ARRAY_TASK_ID>``),
   plus ``.<SLURM_STEP_ID>`` inside an ``srun`` step: each step is its own run of the ranks.
2. **torchrun / TorchElastic**: ``torchelastic-<TORCHELASTIC_RUN_ID>`` (the rendezvous id every node of the
   job shares; ``--standalone`` makes one per launch). Its "none" default names nothing.
3. **Kubernetes** (``KUBERNETES_SERVICE_HOST`` set): ``JOBSET_NAME`` when the pod template sets it (JobSet:
   from the label ``jobset.sigs.k8s.io/jobset-name`` through the downward API), else the PyTorchJob's name,
   which the training operator puts in every pod's ``MASTER_ADDR`` (``<name>-master-0``).
4. **The launch**: ``ccld run`` names each launch ``<host>-<UTC start, YYYYmmdd-HHMMSS>-<pid>`` and hands it
   to every process it starts (``CCLD_JOB_LAUNCH``), so the ranks of one launch share it.

Torchrun sets its variables in the ranks, not in ``ccld run`` that starts it, so each rank resolves its job
itself when it attaches; ``ccld run`` resolves what it can see to print it.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass

#: the job name a rank gets when no one named it and no scheduler did (Settings.job's default)
DEFAULT_JOB = "default"
#: the launch's own name, set by ``ccld run`` for every process it starts
LAUNCH_ENV = "CCLD_JOB_LAUNCH"

_STEP_MAX = 4_294_967_290  # Slurm's special step ids (batch, extern, ...) are the largest values of a uint32
_PYTORCHJOB_ADDR = re.compile(r"(.+)-(?:master|worker)-\d+")


@dataclass(frozen=True)
class JobIdentity:
    name: str
    source: str  # "slurm", "torchelastic", "kubernetes-jobset", "kubernetes-pytorchjob", "launch"


def from_environment(env: Mapping[str, str]) -> JobIdentity | None:
    """The job's identity from its scheduler's variables in ``env`` (see the module's doc); None: none found."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if job_id:
        array, task = env.get("SLURM_ARRAY_JOB_ID", "").strip(), env.get("SLURM_ARRAY_TASK_ID", "").strip()
        name = f"slurm-{array}_{task}" if array and task else f"slurm-{job_id}"
        step = env.get("SLURM_STEP_ID", "").strip()
        if step.isdigit() and int(step) < _STEP_MAX:
            name += f".{step}"
        return JobIdentity(name, "slurm")
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    if run_id and run_id.lower() != "none":
        return JobIdentity(f"torchelastic-{run_id}", "torchelastic")
    if env.get("KUBERNETES_SERVICE_HOST"):
        jobset = env.get("JOBSET_NAME", "").strip()
        if jobset:
            return JobIdentity(jobset, "kubernetes-jobset")
        m = _PYTORCHJOB_ADDR.fullmatch(env.get("MASTER_ADDR", "").strip())
        if m:
            return JobIdentity(m.group(1), "kubernetes-pytorchjob")
    launch = env.get(LAUNCH_ENV, "").strip()
    if launch:
        return JobIdentity(launch, "launch")
    return None


def resolve(job: str, env: Mapping[str, str]) -> JobIdentity:
    """``job`` as configured when someone named it; else the scheduler's identity; else ``default``."""
    if job != DEFAULT_JOB:
        return JobIdentity(job, "given")
    return from_environment(env) or JobIdentity(DEFAULT_JOB, "default")


def launch_name(now: float | None = None, host: str | None = None, pid: int | None = None) -> str:
    """A name for one launch of ``ccld run``: ``<host>-<UTC start>-<pid>``."""
    import os

    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    return f"{host or socket.gethostname()}-{stamp}-{os.getpid() if pid is None else pid}"
